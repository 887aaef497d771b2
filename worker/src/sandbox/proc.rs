//! What commands see in `/proc`: only their own user's processes.
//!
//! A worker running as root moves itself, before it starts any thread that runs commands,
//! into a mount namespace of its own (a slave of the host's: the host's new mounts still
//! reach it, its own never reach the host, and they vanish with it, even after SIGKILL) and
//! mounts a fresh procfs on `/proc` there with `hidepid=invisible` (`hidepid=2` before Linux
//! 5.8). Root, the worker itself, still sees every process; commands, which run as another
//! user, see only that user's: the worker's, the brain's and other users' command lines and
//! environments are not there to read (the commands of this worker share one user, so they
//! still see each other's). Every command's namespace is a copy of the worker's,
//! so it shares that very procfs, and the Landlock ruleset's read rule for `/proc`, taken from
//! the worker's view, is for the same directory.

use std::ffi::CStr;
use std::sync::OnceLock;

use super::report::{Mechanism, Report};
use super::sys::{describe_errno, unshare_mount_namespace};

/// The options tried, newest first.
const HIDEPID: [&CStr; 2] = [c"hidepid=invisible", c"hidepid=2"];

/// Why commands see the host's `/proc`: what [`isolate`] could not do.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(
        "the worker is not root, so it cannot mount a /proc for its commands: they see every process of this host's user in /proc"
    )]
    NotRoot,
    #[error(
        "{what} failed ({}): commands see every process of the host in /proc, command lines included",
        describe_errno(*.errno)
    )]
    Failed { what: &'static str, errno: i32 },
}

/// What [`isolate`] did: the options `/proc` was mounted with, or why it was not.
static DONE: OnceLock<Result<&'static str, Error>> = OnceLock::new();

/// Gives this process the `/proc` described above; call it once, early, before threads that
/// spawn commands exist (a namespace is per thread, and threads inherit their creator's).
/// Only root can; for anyone else it records why not. Never fails the worker: commands then
/// see the host's `/proc`, and the report says so.
pub fn isolate() {
    DONE.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return Err(Error::NotRoot);
        }
        use rustix::mount::{MountFlags, MountPropagationFlags, mount, mount_change};
        let err = |what: &'static str| {
            move |e: rustix::io::Errno| Error::Failed {
                what,
                errno: e.raw_os_error(),
            }
        };
        unshare_mount_namespace().map_err(err("a mount namespace for the worker"))?;
        mount_change(
            c"/",
            MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM,
        )
        .map_err(err("keeping the worker's mounts from the host"))?;
        let mut last = rustix::io::Errno::INVAL;
        for opts in HIDEPID {
            match mount(
                c"proc",
                c"/proc",
                c"proc",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                opts,
            ) {
                Ok(()) => return Ok(opts.to_str().unwrap_or("hidepid")),
                Err(e) => last = e,
            }
        }
        Err(err("mounting a /proc with hidepid")(last))
    });
}

/// Says what commands see in `/proc`; true when they see only their own user's processes.
/// `run_as`: whether commands run as a user of their own.
pub(super) fn probe_proc(run_as: bool, report: &mut Report) -> bool {
    let (active, detail) = match DONE.get() {
        None => (
            false,
            "the worker did not set up a /proc for its commands (not `worker run` or `join`): they see every process of the host".to_string(),
        ),
        Some(Err(why)) => (false, why.to_string()),
        Some(Ok(_)) if !run_as => (
            false,
            "commands run as the worker's own user, whose processes they see in /proc".into(),
        ),
        Some(Ok(opts)) => (
            true,
            format!(
                "commands see only their own user's processes in /proc ({opts}, in the worker's own mount namespace): not the worker's, the brain's or any other user's"
            ),
        ),
    };
    report.mechanisms.push(Mechanism {
        name: "proc",
        active,
        detail,
    });
    active
}
