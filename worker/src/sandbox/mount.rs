//! The workspace every tool can use: each command's mount namespace with its workspace at
//! [`WORKSPACE_PATH`], its temp dir at [`TMP_PATH`] and the worker's state hidden; the probe
//! that says whether this host can give one; and the first directory that keeps the command
//! user out of a workspace, named.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::report::{Mechanism, Report};
use super::sys::{describe_errno, errno, errno_of, in_child, unshare_mount_namespace};

/// Where commands see their workspace when each gets a mount namespace: the same path on
/// every worker, so absolute paths that tools record (virtualenvs, build caches) stay valid
/// after a move.
pub const WORKSPACE_PATH: &str = shared::paths::WORKSPACE_IN_SANDBOX;
/// Where they see the workspace's temp dir then (a private `/tmp`).
pub const TMP_PATH: &str = "/tmp";

/// What keeps commands out of their workspace, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} has a NUL byte")]
    Nul(PathBuf),
    #[error(
        "cannot set up a command's mount namespace for a workspace under {under} ({}); see `worker doctor`",
        describe_errno(*.errno)
    )]
    Namespace { under: PathBuf, errno: i32 },
    #[error("cannot switch to {who} to run commands ({})", describe_errno(*.errno))]
    SwitchUser { who: String, errno: i32 },
    #[error(
        "commands run as {who} cannot reach {} under {under}: {}, and {}. Start the worker with a state dir whose every parent others may traverse (for example --state /var/lib/tether-worker, or TETHER_WORKER_STATE), move {state} there, or make the parents traversable (chmod o+x)",
        if *.temp_dir { "their temp dir" } else { "their workspace" },
        blocked_by(.blocker),
        namespace_note(*.mountns)
    )]
    Unreachable {
        who: String,
        /// Their temp dir, not their workspace.
        temp_dir: bool,
        under: PathBuf,
        /// The first directory the command user cannot traverse, with its mode.
        blocker: Option<(PathBuf, u32)>,
        state: PathBuf,
        mountns: bool,
    },
}

/// Why the command user is kept out: the directory that does it, if one was found.
fn blocked_by(blocker: &Option<(PathBuf, u32)>) -> String {
    match blocker {
        Some((dir, mode)) => format!(
            "{} (mode {mode:04o}) is not traversable by them",
            dir.display()
        ),
        None => "access is denied".to_string(),
    }
}

/// What a mount namespace did, or could not do, about it.
fn namespace_note(mountns: bool) -> String {
    if mountns {
        "the mount namespace did not help".to_string()
    } else {
        format!("no mount namespace can show it at {WORKSPACE_PATH} here (see `worker doctor`)")
    }
}

/// Whether each command can get a mount namespace with its workspace at [`WORKSPACE_PATH`]:
/// the worker is root, the mount point is (or can be made) an empty directory, and a mount
/// namespace can be made here (tried in a child).
pub(super) fn probe_mountns(root: bool, report: &mut Report) -> bool {
    let missing = |report: &mut Report, detail: String| {
        report.mechanisms.push(Mechanism {
            name: "mountns",
            active: false,
            detail,
        });
        false
    };
    if std::env::var("TETHER_WORKER_MOUNTNS").is_ok_and(|v| v == "off" || v == "0") {
        return missing(
            report,
            format!(
                "turned off (TETHER_WORKER_MOUNTNS=off): commands see their workspace at its real path, not {WORKSPACE_PATH}"
            ),
        );
    }
    if !root {
        return missing(
            report,
            format!(
                "the worker is not root, so it cannot give commands a mount namespace: they see their workspace at its real path, not {WORKSPACE_PATH}, and absolute paths tools record there do not survive a move"
            ),
        );
    }
    match std::fs::symlink_metadata(WORKSPACE_PATH) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return missing(
                report,
                format!(
                    "{WORKSPACE_PATH} exists and is not a directory: remove it so the worker can use it as the commands' workspace mount point"
                ),
            );
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let ro = rustix::fs::statvfs(c"/")
                .is_ok_and(|st| st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY));
            if ro {
                return missing(
                    report,
                    format!(
                        "{WORKSPACE_PATH} does not exist and / is read-only: create that empty directory in the image"
                    ),
                );
            }
        }
        Err(e) => return missing(report, format!("cannot look at {WORKSPACE_PATH}: {e}")),
    }
    // Try one: a private namespace with a tmpfs mounted in it (harmless: it dies with the
    // child).
    let tried = in_child(&|| {
        use rustix::mount::{MountFlags, MountPropagationFlags, mount, mount_change};
        unshare_mount_namespace().map_err(errno_of)?;
        mount_change(
            c"/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )
        .map_err(errno_of)?;
        mount(
            c"tmpfs",
            c"/tmp",
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            c"size=4k",
        )
        .map_err(errno_of)
    });
    match tried {
        Ok(()) => {
            report.mechanisms.push(Mechanism {
                name: "mountns",
                active: true,
                detail: format!("each command has a mount namespace of its own: its workspace at {WORKSPACE_PATH} (the same path on every worker), the workspace's temp dir at {TMP_PATH}, the worker's state hidden"),
            });
            true
        }
        Err(e) => missing(
            report,
            format!(
                "cannot make a mount namespace here ({}; a container without CAP_SYS_ADMIN?): commands see their workspace at its real path",
                describe_errno(e)
            ),
        ),
    }
}

/// Proves, step by step in forked children, that the command user (`run_as`, or the worker's
/// own) can reach the workspace `ws` and its temp dir `tmp` as commands will see them (in a
/// mount namespace when `mountns`); `Ok` says where, `Err` what keeps them out and how to fix
/// it.
pub(super) fn check_reach(
    ws: &Path,
    tmp: &Path,
    state_dir: &Path,
    mountns: bool,
    run_as: Option<(u32, u32)>,
    who: &str,
) -> Result<String, Error> {
    let plan = if mountns {
        Some(MountPlan::new(ws, tmp, state_dir, Path::new(""))?)
    } else {
        None
    };
    let c = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default();
    let (seen_ws, seen_tmp) = match &plan {
        Some(_) => (c(Path::new(WORKSPACE_PATH)), c(Path::new(TMP_PATH))),
        None => (c(ws), c(tmp)),
    };
    // Step by step, each in a child of its own, so a failure says which step and why:
    // 1 the mount namespace, 2 the user, 3 the workspace, 4 its temp dir.
    let upto = |steps: u8| {
        in_child(&|| {
            use rustix::fs::{Access, access};
            if let Some(p) = &plan {
                unshare_mount_namespace().map_err(errno_of)?;
                p.enter().map_err(|e| e.raw_os_error().unwrap_or(-1))?;
            }
            if steps < 2 {
                return Ok(());
            }
            if let Some((uid, gid)) = run_as {
                // libc, not rustix: libc's setuid and setgid change every thread of the
                // process, rustix's set_thread_* only the calling one (as the commands' own
                // switch does; here, in a forked child, the two are the same).
                // SAFETY: plain syscalls with integer arguments and an empty group list.
                let failed = unsafe {
                    libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                };
                if failed {
                    return Err(errno());
                }
            }
            // The paths are `&CStr`: rustix allocates nothing in the child.
            let all = Access::READ_OK | Access::WRITE_OK | Access::EXEC_OK;
            if steps >= 3 {
                access(seen_ws.as_c_str(), all).map_err(errno_of)?;
            }
            if steps >= 4 {
                access(seen_tmp.as_c_str(), all).map_err(errno_of)?;
            }
            Ok(())
        })
    };
    let r = (1..=4u8).try_for_each(|n| upto(n).map_err(|e| (n, e)));
    let seen = if plan.is_some() {
        PathBuf::from(WORKSPACE_PATH)
    } else {
        ws.parent().unwrap_or(ws).join("<name>")
    };
    match r {
        Ok(()) => Ok(format!(
            "commands run as {who} and reach their workspace at {}",
            seen.display()
        )),
        Err((1, errno)) => Err(Error::Namespace {
            under: ws.parent().unwrap_or(ws).to_path_buf(),
            errno,
        }),
        Err((2, errno)) => Err(Error::SwitchUser {
            who: who.to_string(),
            errno,
        }),
        Err((step, _)) => {
            let blocked = match (plan.is_some(), step) {
                (true, 3) => PathBuf::from(WORKSPACE_PATH),
                (true, _) => PathBuf::from(TMP_PATH),
                (false, 3) => ws.to_path_buf(),
                (false, _) => tmp.to_path_buf(),
            };
            Err(Error::Unreachable {
                who: who.to_string(),
                temp_dir: step != 3,
                under: blocked.parent().unwrap_or(&blocked).to_path_buf(),
                blocker: run_as.and_then(|u| untraversable_ancestor(&blocked, u)),
                state: state_dir.to_path_buf(),
                mountns,
            })
        }
    }
}

/// What a command's mount namespace is made of, prepared before the fork.
pub(super) struct MountPlan {
    /// The workspace and its temp dir on the host, and the state dir to hide.
    pub(super) workspace: CString,
    pub(super) tmp: CString,
    pub(super) state: CString,
    /// Where the command starts, as it sees it (under [`WORKSPACE_PATH`]).
    pub(super) cwd: CString,
}

impl MountPlan {
    pub(super) fn new(
        workspace: &Path,
        tmp: &Path,
        state: &Path,
        cwd_rel: &Path,
    ) -> Result<Self, Error> {
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| Error::Nul(p.to_path_buf()))
        };
        Ok(Self {
            workspace: c(workspace)?,
            tmp: c(tmp)?,
            state: c(state)?,
            cwd: c(&Path::new(WORKSPACE_PATH).join(cwd_rel))?,
        })
    }

    /// Child side, in a fresh mount namespace (between fork and exec: plain syscalls on
    /// prepared values, no allocation): stops mounts from propagating to the host, hides
    /// the worker's state under an empty read-only tmpfs, shows the workspace at
    /// [`WORKSPACE_PATH`] and its temp dir at [`TMP_PATH`], and moves into the workspace.
    /// Every path goes to rustix as a `&CStr`, so nothing allocates.
    pub(super) fn enter(&self) -> std::io::Result<()> {
        use rustix::fs::{Mode, OFlags, open};
        use rustix::mount::{MountFlags, MountPropagationFlags, mount, mount_change};
        mount_change(
            c"/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )?;
        // Held open so they can be bound once the state dir above them is hidden.
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let ws = open(self.workspace.as_c_str(), flags, Mode::empty())?;
        let tmp = open(self.tmp.as_c_str(), flags, Mode::empty())?;
        mount(
            c"tmpfs",
            self.state.as_c_str(),
            c"tmpfs",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            c"size=4k,mode=000",
        )?;
        bind_fd(&ws, c"/workspace")?;
        bind_fd(&tmp, c"/tmp")?;
        drop((ws, tmp));
        rustix::process::chdir(self.cwd.as_c_str())?;
        Ok(())
    }
}

/// Bind-mounts the directory open as `fd` onto `target` (child side: no allocation).
pub(super) fn bind_fd(fd: &OwnedFd, target: &CStr) -> std::io::Result<()> {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut buf = [0u8; 40];
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 12];
    let (mut n, mut i) = (fd.as_raw_fd() as u32, digits.len());
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - i;
    buf[PREFIX.len()..PREFIX.len() + len].copy_from_slice(&digits[i..]);
    // buf stays NUL-terminated: it was zeroed and is longer than what was copied.
    let source = CStr::from_bytes_until_nul(&buf).map_err(|_| rustix::io::Errno::INVAL)?;
    rustix::mount::mount_bind(source, target)?;
    Ok(())
}

/// The first directory on the way to `path` (from `/`) that a user who is neither its owner
/// nor in its group cannot traverse, with its mode: what keeps `nobody` out.
pub(super) fn untraversable_ancestor(
    path: &Path,
    (uid, gid): (u32, u32),
) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut cur = PathBuf::from("/");
    let mut parts = path.components().skip(1).peekable();
    loop {
        let m = std::fs::metadata(&cur).ok()?;
        let mode = m.mode() & 0o7777;
        let bit = if m.uid() == uid {
            0o100
        } else if m.gid() == gid {
            0o010
        } else {
            0o001
        };
        if mode & bit == 0 {
            return Some((cur, mode));
        }
        match parts.next() {
            Some(c) => cur.push(c),
            None => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_that_keeps_nobody_out_is_named_with_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        let open = root.join("open/ws");
        let shut = root.join("shut/deeper/ws");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::create_dir_all(&shut).unwrap();
        for p in [&root, &root.join("open"), &open] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        std::fs::set_permissions(root.join("shut"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let nobody = (65534, 65534);
        if let Some((dir, mode)) = untraversable_ancestor(&root, nobody) {
            eprintln!(
                "skipped the_parent_that_keeps_nobody_out_is_named_with_its_mode: the temp dir's own parent {} (mode {mode:o}) keeps others out on this host",
                dir.display()
            );
            return;
        }
        assert_eq!(untraversable_ancestor(&open, nobody), None);
        assert_eq!(
            untraversable_ancestor(&shut, nobody),
            Some((root.join("shut"), 0o700))
        );
    }
}
