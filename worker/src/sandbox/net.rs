//! What the sandbox gives a call behind the egress proxy: whether it can be given at all
//! (the call joins a network namespace the worker made, see `crate::egress::Net`), and
//! files for the command in its workspace's temp dir (the CA bundle it trusts).

use std::path::{Path, PathBuf};

use super::{ConfineError, Sandbox};

impl Sandbox {
    /// Whether commands can be confined to an egress proxy (their own network namespace).
    pub fn egress(&self) -> bool {
        self.netns
    }

    /// Writes `contents` to `name` in the workspace's temp dir (readable by the command) and
    /// says where the command sees it.
    pub fn call_file(
        &self,
        workspace: &Path,
        cwd: &Path,
        name: &str,
        contents: &[u8],
    ) -> Result<PathBuf, ConfineError> {
        let tmp = self.workspace_tmp(workspace, self.run_as_in(workspace)?)?;
        let path = tmp.join(name);
        let part = tmp.join(format!(".{name}.part"));
        std::fs::write(&part, contents)
            .and_then(|()| {
                std::fs::set_permissions(&part, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            })
            .and_then(|()| std::fs::rename(&part, &path))
            .map_err(|e| ConfineError::CallFile(path.clone(), e))?;
        let (_, seen_tmp) = self.seen(workspace, cwd, &tmp);
        Ok(seen_tmp.join(name))
    }
}
