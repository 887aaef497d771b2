//! What a provisioned worker does when it gives up on its brain (`--exit-after-unreachable`):
//! the machine releases itself, so nothing the brain made outlives the brain. It removes
//! what was installed for it (`--remove-on-give-up DIR`: the ssh and local providers' machine
//! directories) and powers the machine off (`--poweroff-on-give-up`: an EC2 instance launched
//! with shutdown-means-terminate is then terminated). A container or a pod needs neither: the
//! worker is its only process, so its exit ends it.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the power-off command may take to return.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the give-up steps cannot be taken as given.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "--remove-on-give-up {0}: give an absolute path at least two levels deep (the machine's own directory)"
    )]
    Shallow(PathBuf),
}

/// The steps, from the command line.
#[derive(Debug, Clone, Default)]
pub struct GiveUp {
    pub remove: Vec<PathBuf>,
    pub poweroff: bool,
}

impl GiveUp {
    /// Checks the paths before the worker starts: absolute, not `/` nor a top-level directory.
    pub fn check(&self) -> Result<(), Error> {
        for p in &self.remove {
            if !p.is_absolute() || p.components().count() < 3 {
                return Err(Error::Shallow(p.clone()));
            }
        }
        Ok(())
    }

    /// Runs the steps; each failure is logged and the next step still runs.
    pub async fn run(&self) {
        for p in &self.remove {
            match remove(p) {
                Ok(()) => {
                    tracing::warn!(path = %p.display(), "gave up on the brain: removed what was installed for this machine")
                }
                Err(e) => {
                    tracing::error!(path = %p.display(), error = %e, "gave up on the brain: cannot remove this machine's directory")
                }
            }
        }
        if self.poweroff {
            tracing::warn!("gave up on the brain: powering this machine off");
            let run = tokio::process::Command::new("poweroff")
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .status();
            match tokio::time::timeout(POWEROFF_TIMEOUT, run).await {
                Ok(Ok(s)) if s.success() => {}
                Ok(Ok(s)) => {
                    tracing::error!(status = %s, "poweroff failed (the worker's unit powers the machine off when the worker exits, where systemd runs it)")
                }
                Ok(Err(e)) => tracing::error!(error = %e, "cannot run poweroff"),
                Err(_) => tracing::error!("poweroff did not return within {POWEROFF_TIMEOUT:?}"),
            }
        }
    }
}

fn remove(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_be_more_than_a_machine_are_refused() {
        for bad in ["/", "/home", "relative/dir"] {
            let g = GiveUp {
                remove: vec![PathBuf::from(bad)],
                poweroff: false,
            };
            assert!(g.check().is_err(), "{bad}");
        }
        let ok = GiveUp {
            remove: vec![PathBuf::from("/home/u/.tether/b/m-1")],
            poweroff: false,
        };
        ok.check().unwrap();
    }

    #[tokio::test]
    async fn the_directory_is_removed_and_a_missing_one_is_fine() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("machine");
        std::fs::create_dir_all(d.join("state/workspaces")).unwrap();
        std::fs::write(d.join("worker"), b"bin").unwrap();
        let g = GiveUp {
            remove: vec![d.clone(), t.path().join("gone")],
            poweroff: false,
        };
        g.run().await;
        assert!(!d.exists());
    }
}
