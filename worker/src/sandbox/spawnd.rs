//! The pre-confined spawner's own side: a small process (the worker binary run as
//! `worker __spawner`) that was confined once, exactly as a command would be, and then starts
//! each command of its workspace with a vfork-style `posix_spawn`, with no pre-exec work
//! left to do. It reads requests from the socket at fd 3, one at a time, and answers each
//! with the command's pid (or why it could not start) and then its wait status.
//!
//! The wire, both ways over a Unix stream socket:
//! - request: `u32` payload length (little-endian) sent with the command's stdout and stderr
//!   as `SCM_RIGHTS`, then the payload: `u32` argc, `u32` envc, then argc + envc + 1 strings,
//!   each a `u32` length and its bytes: argv, the environment as `KEY=VALUE`, and the working
//!   directory. The spawner looks argv\[0\] up in the request's PATH as `execvp` would, as
//!   the command's user.
//! - replies: 8 bytes, a `u32` kind ([`STARTED`] with the pid, [`FAILED`] with an errno, then
//!   [`EXITED`] with the raw wait status) and an `i32`.

use std::ffi::{OsStr, OsString};
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Stdio;

/// The argument that makes the worker a spawner.
pub const ARG: &str = "__spawner";

/// The arguments before the worker's own on its command line (`worker` when it runs as
/// `tether worker ...`): a spawner is started as the same executable with these, then [`ARG`].
static PREFIX: std::sync::OnceLock<Vec<OsString>> = std::sync::OnceLock::new();

/// Records [`PREFIX`] (once, at start).
pub fn set_prefix(prefix: Vec<OsString>) {
    let _ = PREFIX.set(prefix);
}

/// The arguments a spawner is started with.
pub fn args() -> Vec<OsString> {
    let mut v = PREFIX.get().cloned().unwrap_or_default();
    v.push(ARG.into());
    v
}
/// The descriptor the spawner reads requests from.
pub const FD: RawFd = 3;
/// Largest request payload; bigger commands are started the ordinary way.
pub const MAX_REQUEST: usize = 64 * 1024;

pub const STARTED: u32 = 1;
pub const FAILED: u32 = 2;
pub const EXITED: u32 = 3;

/// One command to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub argv: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
}

impl Request {
    /// The request as sent: its payload's length, then the payload; `None` when the payload
    /// is larger than [`MAX_REQUEST`] or there is no argv.
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.argv.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(self.argv.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.env.len() as u32).to_le_bytes());
        let mut put = |b: &[u8]| {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        };
        for a in &self.argv {
            put(a.as_bytes());
        }
        for (k, v) in &self.env {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            put(&kv);
        }
        put(self.cwd.as_os_str().as_bytes());
        let len = out.len() - 4;
        out[..4].copy_from_slice(&(len as u32).to_le_bytes());
        (len <= MAX_REQUEST).then_some(out)
    }

    /// The request from its payload (the frame without its length), or `None` for a
    /// malformed one.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let mut at = 0usize;
        let mut u32_at = || -> Option<usize> {
            let v = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
            at += 4;
            Some(v as usize)
        };
        let (argc, envc) = (u32_at()?, u32_at()?);
        if argc == 0 || argc + envc > MAX_REQUEST {
            return None;
        }
        let mut strings = Vec::with_capacity(argc + envc + 1);
        for _ in 0..argc + envc + 1 {
            let n = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
            at += 4;
            let s = b.get(at..at.checked_add(n)?)?;
            at += n;
            if s.contains(&0) {
                return None;
            }
            strings.push(OsString::from_vec(s.to_vec()));
        }
        if at != b.len() {
            return None;
        }
        let cwd = PathBuf::from(strings.pop()?);
        let env = strings
            .split_off(argc)
            .into_iter()
            .map(|kv| {
                let kv = kv.into_vec();
                let eq = kv.iter().position(|&c| c == b'=')?;
                Some((
                    OsString::from_vec(kv[..eq].to_vec()),
                    OsString::from_vec(kv[eq + 1..].to_vec()),
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Request {
            argv: strings,
            env,
            cwd,
        })
    }

    /// The program to run: argv\[0\] looked up in the request's PATH.
    pub fn program(&self) -> PathBuf {
        let path = self
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_os_str())
            .unwrap_or(OsStr::new(""));
        resolve_program(&self.argv[0], path)
    }
}

/// Looks a bare program name up in `path` the way `execvp` would. Spawning an absolute path
/// lets the standard library use `posix_spawn` (a vfork-style spawn) instead of fork + exec,
/// which it must fall back to when the child's PATH differs from ours. Names with a slash,
/// and names not found, are returned as they are (the spawn then reports them).
pub fn resolve_program(name: &OsStr, path: &OsStr) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    if name.as_bytes().contains(&b'/') || name.is_empty() {
        return name.into();
    }
    for dir in std::env::split_paths(path) {
        if !dir.is_absolute() {
            continue;
        }
        let candidate = dir.join(name);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return candidate;
        }
    }
    name.into()
}

/// Sends `bytes` with `fds` attached (as `SCM_RIGHTS`) on a stream socket; returns how many
/// bytes went (the rest is sent as plain data).
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(rustix::io::Errno::INVAL.into());
    }
    Ok(sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?)
}

/// Receives up to `buf.len()` bytes and the descriptors sent with them (close-on-exec).
/// `Ok((0, _))` is the end of the stream.
fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    let mut space = [MaybeUninit::uninit(); 128];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(sent) = m {
            fds.extend(sent);
        }
    }
    Ok((got.bytes, fds))
}

fn reply(sock: &mut UnixStream, kind: u32, value: i32) -> std::io::Result<()> {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&kind.to_le_bytes());
    b[4..].copy_from_slice(&value.to_le_bytes());
    sock.write_all(&b)
}

/// Reads one request: its payload and the descriptors that came with it; `None` at the end.
fn read_request(sock: &mut UnixStream) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut len = [0u8; 4];
    let (n, fds) = recv_with_fds(sock.as_fd(), &mut len)?;
    if n == 0 {
        return Ok(None);
    }
    sock.read_exact(&mut len[n..])?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_REQUEST {
        return Err(std::io::Error::other("request too large"));
    }
    let mut payload = vec![0u8; len];
    sock.read_exact(&mut payload)?;
    Ok(Some((payload, fds)))
}

/// The spawner's main loop (`worker __spawner`): serves requests until the worker closes
/// the socket. Runs already confined; its commands inherit all of it.
pub fn serve() -> i32 {
    // Commands run as the same user: keep them from tracing this process or reading its
    // memory and descriptors (the socket to the worker is what a command must never reach).
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    // SAFETY: descriptor 3 is the socket the worker placed there for this process alone.
    let sock = unsafe { OwnedFd::from_raw_fd(FD) };
    if rustix::io::fcntl_setfd(&sock, rustix::io::FdFlags::CLOEXEC).is_err() {
        return 1;
    }
    let mut sock = UnixStream::from(sock);
    loop {
        let (payload, fds) = match read_request(&mut sock) {
            Ok(Some(r)) => r,
            Ok(None) => return 0,
            Err(_) => return 1,
        };
        let (req, [out, err]) = match (Request::decode(&payload), <[OwnedFd; 2]>::try_from(fds)) {
            (Some(req), Ok(fds)) => (req, fds),
            _ => {
                if reply(&mut sock, FAILED, libc::EINVAL).is_err() {
                    return 1;
                }
                continue;
            }
        };
        let mut cmd = std::process::Command::new(req.program());
        cmd.arg0(&req.argv[0])
            .args(&req.argv[1..])
            .env_clear()
            .envs(req.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&req.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0);
        let spawned = cmd.spawn();
        // Our copies of the pipes go now, so the worker sees the end of output when the
        // command (and whatever it started) is done with them.
        drop(cmd);
        let sent = match spawned {
            Err(e) => reply(&mut sock, FAILED, e.raw_os_error().unwrap_or(libc::EIO)),
            Ok(mut child) => reply(&mut sock, STARTED, child.id() as i32).and_then(|()| {
                let status = child.wait()?;
                reply(&mut sock, EXITED, status.into_raw())
            }),
        };
        if sent.is_err() {
            return 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let req = Request {
            argv: vec!["sh".into(), "-c".into(), "echo ok".into()],
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("A".into(), "b=c".into()),
            ],
            cwd: "/workspace/sub".into(),
        };
        let frame = req.encode().unwrap();
        assert_eq!(
            u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
        let b = &frame[4..];
        let back = Request::decode(b).unwrap();
        assert_eq!(back, req);
        let program = back.program();
        assert!(
            program.is_absolute() && program.ends_with("sh"),
            "{program:?}"
        );
        for cut in [0, 3, 8, b.len() - 1] {
            assert_eq!(Request::decode(&b[..cut]), None, "cut at {cut}");
        }
        let mut longer = b.to_vec();
        longer.push(0);
        assert_eq!(Request::decode(&longer), None);
        let huge = Request {
            argv: vec!["x".repeat(MAX_REQUEST).into()],
            ..req
        };
        assert_eq!(huge.encode(), None);
    }

    #[test]
    fn programs_are_resolved_like_execvp() {
        let p = resolve_program(
            OsStr::new("sh"),
            OsStr::new("relative:/nonexistent:/bin:/usr/bin"),
        );
        assert!(p.is_absolute() && p.ends_with("sh"), "{p:?}");
        assert_eq!(
            resolve_program(OsStr::new("./x"), OsStr::new("/bin")),
            PathBuf::from("./x")
        );
        assert_eq!(
            resolve_program(OsStr::new("no-such-xyz"), OsStr::new("/bin")),
            PathBuf::from("no-such-xyz")
        );
    }
}
