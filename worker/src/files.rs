//! File operations inside a workspace. Every path is resolved beneath the workspace by
//! `shared::beneath` (the kernel's `openat2(RESOLVE_BENEATH)` where it has it, so a command
//! racing symlinks into the tree cannot make an operation land outside; `shared::paths`'
//! check-then-open elsewhere); writes are atomic (temp file in the same directory, fsync,
//! rename); sizes are bounded.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use proto::{
    DirListing, Done, FileCall, FileData, FileError, FileErrorKind, FileKind, FileResponse,
    FileStat, PathList, SearchMatch, SearchMatches, file_call, file_response,
};
use shared::beneath::Beneath;
use shared::limits::{MAX_FILE_CHUNK_BYTES, MAX_LIST_ENTRIES};
use shared::{paths, workspace};

/// Largest directory listing answered, in bytes of paths plus per-entry overhead.
const LIST_BYTES: usize = 4 * 1024 * 1024;

/// What `worker doctor` says about how wire paths are resolved.
pub fn doctor_line() -> String {
    match shared::beneath::support() {
        shared::beneath::Support::Openat2 => "file paths: resolved beneath the workspace by the kernel (openat2, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)".into(),
        shared::beneath::Support::Fallback(why) => format!(
            "file paths: checked, then opened ({why}): a command that swaps symlinks in its workspace during a file call could make it land outside"
        ),
    }
}

fn error(kind: FileErrorKind, path: &str, message: String) -> file_response::Result {
    file_response::Result::Error(FileError {
        kind: kind as i32,
        path: path.to_string(),
        message,
    })
}

fn from_paths(path: &str, e: paths::Error) -> file_response::Result {
    let kind = match &e {
        paths::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            FileErrorKind::NotFound
        }
        paths::Error::Io { .. } | paths::Error::Root { .. } => FileErrorKind::Io,
        _ => FileErrorKind::PathRejected,
    };
    error(kind, path, e.to_string())
}

fn from_io(path: &str, what: &str, e: std::io::Error) -> file_response::Result {
    let kind = if e.kind() == std::io::ErrorKind::NotFound {
        FileErrorKind::NotFound
    } else {
        FileErrorKind::Io
    };
    error(kind, path, format!("{what} {path:?}: {e}"))
}

/// Runs one file call (blocking I/O: call from `spawn_blocking`). `owner` is the user the
/// worker's commands run as: what a write creates is given to it, so commands can change it.
pub fn handle(call: FileCall, workspaces_root: &Path, owner: Option<(u32, u32)>) -> FileResponse {
    let call_id = call.call_id;
    let opened = crate::state::workspace(workspaces_root, &call.workspace)
        .and_then(|ws| Beneath::new(&ws).map(|b| (ws, b)));
    let result = match opened {
        Err(e) => from_paths(&call.workspace, e),
        Ok((ws, b)) => match call.op {
            None => error(FileErrorKind::Invalid, "", "no operation given".into()),
            Some(file_call::Op::Read(r)) => read(&b, &r.path, r.offset, r.length),
            Some(file_call::Op::Write(w)) => {
                let r = write(&b, &w.path, &w.data, w.mode, w.create_dirs);
                if let (Some(o), file_response::Result::Done(_)) = (owner, &r) {
                    give(&b, &w.path, o);
                }
                r
            }
            Some(file_call::Op::List(l)) => list(&b, &l.path),
            Some(file_call::Op::Stat(s)) => stat(&b, &s.path),
            Some(file_call::Op::Remove(r)) => remove(&b, &r.path, r.recursive),
            Some(file_call::Op::Find(f)) => find(&ws, &f.glob, f.max_results),
            Some(file_call::Op::Search(f)) => search(&ws, &f.pattern, &f.glob, f.max_matches),
        },
    };
    FileResponse {
        call_id,
        result: Some(result),
    }
}

fn read(b: &Beneath, path: &str, offset: u64, length: u64) -> file_response::Result {
    // Looked at before it is opened: opening a FIFO would block, a device could do anything.
    let mut f = match b.open_read(path) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return error(
                FileErrorKind::Invalid,
                path,
                format!("{path:?} is not a regular file"),
            );
        }
        Err(e) => return from_paths(path, e),
    };
    let size = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return from_io(path, "cannot stat", e),
    };
    let want = if length == 0 {
        MAX_FILE_CHUNK_BYTES
    } else {
        length.min(MAX_FILE_CHUNK_BYTES)
    };
    let mut data = Vec::new();
    if let Err(e) = f
        .seek(SeekFrom::Start(offset))
        .and_then(|_| f.take(want).read_to_end(&mut data))
    {
        return from_io(path, "cannot read", e);
    }
    file_response::Result::Data(FileData {
        data,
        file_size: size,
    })
}

fn write(
    b: &Beneath,
    path: &str,
    data: &[u8],
    mode: u32,
    create_dirs: bool,
) -> file_response::Result {
    if data.len() as u64 > MAX_FILE_CHUNK_BYTES {
        return error(
            FileErrorKind::TooLarge,
            path,
            format!(
                "{} bytes is over the {MAX_FILE_CHUNK_BYTES}-byte limit of one write",
                data.len()
            ),
        );
    }
    let (parent, name) = match b.parent(path, create_dirs) {
        Ok(x) => x,
        Err(e) => return from_paths(path, e),
    };
    // Only permission bits: no setuid, setgid or sticky bits from the wire.
    let mode = if mode == 0 { 0o644 } else { mode & 0o777 };
    let target = parent.join(&name);
    if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
        return error(
            FileErrorKind::Invalid,
            path,
            format!("{path:?} is a directory"),
        );
    }
    match shared::fsio::write_atomic(&target, data, mode, shared::fsio::Durability::Full) {
        Ok(()) => file_response::Result::Done(Done {}),
        Err(e) => from_io(path, "cannot write", e),
    }
}

/// Gives a workspace path, and the directories on the way to it, to the command user.
pub fn give_path(ws: &Path, path: &str, owner: (u32, u32)) {
    if let Ok(b) = Beneath::new(ws) {
        give(&b, path, owner)
    }
}

/// Gives a written file, and the directories above it inside the workspace, to `owner`
/// (each entry itself: a symlink is not followed).
fn give(b: &Beneath, path: &str, (uid, gid): (u32, u32)) {
    let Ok(parts) = paths::check_relative(path) else {
        return;
    };
    for i in 1..=parts.len() {
        if let Ok((dir, name)) = b.parent(&parts[..i].join("/"), false) {
            let _ = std::os::unix::fs::lchown(dir.join(&name), Some(uid), Some(gid));
        }
    }
}

fn stat_of(rel: String, meta: &std::fs::Metadata) -> FileStat {
    use std::os::unix::fs::MetadataExt;
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        FileKind::File
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    };
    FileStat {
        path: rel,
        kind: kind as i32,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime_unix_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
    }
}

fn list(b: &Beneath, path: &str) -> file_response::Result {
    let dir = match b.dir(path, false) {
        Ok(d) => d,
        Err(e) => return from_paths(path, e),
    };
    let rd = match std::fs::read_dir(dir.path()) {
        Ok(rd) => rd,
        Err(e) => return from_io(path, "cannot list", e),
    };
    let prefix = path.trim_matches('/');
    let mut entries = Vec::new();
    // The answer must fit in one message with room to spare.
    let mut bytes = 0usize;
    for ent in rd {
        let ent = match ent {
            Ok(e) => e,
            Err(e) => return from_io(path, "cannot list", e),
        };
        if entries.len() >= MAX_LIST_ENTRIES {
            return error(
                FileErrorKind::TooLarge,
                path,
                format!("{path:?} has more than {MAX_LIST_ENTRIES} entries"),
            );
        }
        let name = ent.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() || prefix == "." {
            name
        } else {
            format!("{prefix}/{name}")
        };
        bytes += rel.len() + 32;
        if bytes > LIST_BYTES {
            return error(
                FileErrorKind::TooLarge,
                path,
                format!("the listing of {path:?} is over {LIST_BYTES} bytes; list a subdirectory"),
            );
        }
        if let Ok(meta) = ent.metadata() {
            entries.push(stat_of(rel, &meta));
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    file_response::Result::Listing(DirListing { entries })
}

/// Most paths a `find` answers, and its default.
const MAX_FIND: u32 = 10_000;
const DEFAULT_FIND: u32 = 1_000;
/// Most matches a `search` answers, and its default.
const MAX_SEARCH: u32 = 2_000;
const DEFAULT_SEARCH: u32 = 200;

fn find(ws: &Path, glob: &str, max: u32) -> file_response::Result {
    let glob = match workspace::PathGlob::new(glob) {
        Ok(g) => g,
        Err(e) => return error(FileErrorKind::Invalid, "", e.to_string()),
    };
    let max = if max == 0 {
        DEFAULT_FIND
    } else {
        max.min(MAX_FIND)
    };
    let (paths, truncated) = workspace::find(ws, &glob, max as usize);
    file_response::Result::Paths(PathList { paths, truncated })
}

fn search(ws: &Path, pattern: &str, glob: &str, max: u32) -> file_response::Result {
    let (re, glob) = match (workspace::pattern(pattern), workspace::PathGlob::new(glob)) {
        (Ok(re), Ok(g)) => (re, g),
        (Err(e), _) | (_, Err(e)) => return error(FileErrorKind::Invalid, "", e.to_string()),
    };
    let max = if max == 0 {
        DEFAULT_SEARCH
    } else {
        max.min(MAX_SEARCH)
    };
    let (found, truncated, files_searched) = workspace::search(ws, &re, &glob, max as usize);
    file_response::Result::Matches(SearchMatches {
        matches: found
            .into_iter()
            .map(|m| SearchMatch {
                path: m.path,
                line: m.line,
                text: m.text,
            })
            .collect(),
        truncated,
        files_searched,
    })
}

fn stat(b: &Beneath, path: &str) -> file_response::Result {
    // The entry itself is described: a symlink is reported as a symlink, not followed.
    let meta = match paths::check_relative(path) {
        Ok(parts) if parts.is_empty() => b
            .dir(path, false)
            .map(|d| std::fs::metadata(d.path()).map_err(|e| (path, e))),
        Ok(_) => b
            .parent(path, false)
            .map(|(d, name)| std::fs::symlink_metadata(d.join(&name)).map_err(|e| (path, e))),
        Err(e) => Err(e),
    };
    match meta {
        Ok(Ok(meta)) => file_response::Result::Stat(stat_of(path.to_string(), &meta)),
        Ok(Err((path, e))) => from_io(path, "cannot stat", e),
        Err(e) => from_paths(path, e),
    }
}

fn remove(b: &Beneath, path: &str, recursive: bool) -> file_response::Result {
    let (parent, name) = match b.parent(path, false) {
        Ok(x) => x,
        Err(e) => return from_paths(path, e),
    };
    let target = parent.join(&name);
    let res = match std::fs::symlink_metadata(&target) {
        Err(e) => Err(e),
        Ok(m) if m.is_dir() && recursive => std::fs::remove_dir_all(&target),
        Ok(m) if m.is_dir() => std::fs::remove_dir(&target),
        Ok(_) => std::fs::remove_file(&target),
    };
    match res {
        Ok(()) => file_response::Result::Done(Done {}),
        Err(e) => from_io(path, "cannot remove", e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{ReadFile, RemovePath, WriteFile};

    fn call(op: file_call::Op) -> FileCall {
        FileCall {
            call_id: 1,
            workspace: "ws".into(),
            op: Some(op),
        }
    }

    #[test]
    fn write_then_read_a_range() {
        let root = tempfile::tempdir().unwrap();
        let w = handle(
            call(file_call::Op::Write(WriteFile {
                path: "a/b.txt".into(),
                data: b"hello world".to_vec(),
                mode: 0o4755,
                create_dirs: true,
            })),
            root.path(),
            None,
        );
        assert!(
            matches!(w.result, Some(file_response::Result::Done(_))),
            "{w:?}"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(root.path().join("ws/a/b.txt"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o7777, 0o755, "setuid bit must be stripped");
        let r = handle(
            call(file_call::Op::Read(ReadFile {
                path: "a/b.txt".into(),
                offset: 6,
                length: 5,
            })),
            root.path(),
            None,
        );
        match r.result {
            Some(file_response::Result::Data(d)) => {
                assert_eq!(d.data, b"world");
                assert_eq!(d.file_size, 11);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn special_files_are_refused_without_blocking() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("ws")).unwrap();
        let fifo = std::ffi::CString::new(root.path().join("ws/pipe").to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let r = handle(
            call(file_call::Op::Read(ReadFile {
                path: "pipe".into(),
                offset: 0,
                length: 0,
            })),
            root.path(),
            None,
        );
        match r.result {
            Some(file_response::Result::Error(e)) => {
                assert!(e.message.contains("not a regular file"))
            }
            other => panic!("{other:?}"),
        }
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("ws/link")).unwrap();
        let s = handle(
            call(file_call::Op::Stat(proto::StatPath {
                path: "link".into(),
            })),
            root.path(),
            None,
        );
        match s.result {
            Some(file_response::Result::Stat(st)) => assert_eq!(st.kind, FileKind::Symlink as i32),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn writes_through_an_escaping_symlink_are_refused_and_nothing_outside_changes() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), b"safe").unwrap();
        std::fs::create_dir_all(root.path().join("ws")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("ws/out")).unwrap();
        let w = handle(
            call(file_call::Op::Write(WriteFile {
                path: "out/victim".into(),
                data: b"pwned".to_vec(),
                mode: 0,
                create_dirs: false,
            })),
            root.path(),
            None,
        );
        match w.result {
            Some(file_response::Result::Error(e)) => {
                assert_eq!(e.kind, FileErrorKind::PathRejected as i32);
                assert!(e.message.contains("out/victim"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            std::fs::read(outside.path().join("victim")).unwrap(),
            b"safe"
        );
        let rm = handle(
            call(file_call::Op::Remove(RemovePath {
                path: "".into(),
                recursive: true,
            })),
            root.path(),
            None,
        );
        assert!(matches!(rm.result, Some(file_response::Result::Error(_))));
    }

    /// A command swaps a directory of the workspace for a symlink to outside and back, as
    /// fast as it can, while file calls go through it: none may read or write outside.
    #[test]
    fn a_racing_symlink_swap_never_reads_or_writes_outside() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let ws = root.path().join("ws");
        std::fs::create_dir_all(ws.join("d")).unwrap();
        std::fs::write(ws.join("d/f"), "inside").unwrap();
        std::fs::write(outside.path().join("f"), "outside").unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.join("swap")).unwrap();
        let swapper = shared::beneath::Swapper::start(&ws.join("d"), &ws.join("swap"));
        let (mut inside, mut refused) = (0, 0);
        for i in 0..3000 {
            let r = handle(
                call(file_call::Op::Read(ReadFile {
                    path: "d/f".into(),
                    offset: 0,
                    length: 0,
                })),
                root.path(),
                None,
            );
            match r.result {
                Some(file_response::Result::Data(d)) => {
                    assert_eq!(d.data, b"inside", "read outside the workspace");
                    inside += 1;
                }
                Some(file_response::Result::Error(_)) => refused += 1,
                other => panic!("{other:?}"),
            }
            let path = format!("d/new-{i}");
            handle(
                call(file_call::Op::Write(WriteFile {
                    path: path.clone(),
                    data: b"x".to_vec(),
                    mode: 0,
                    create_dirs: true,
                })),
                root.path(),
                None,
            );
            handle(
                call(file_call::Op::Remove(RemovePath {
                    path: "d/f-gone".into(),
                    recursive: true,
                })),
                root.path(),
                None,
            );
            let l = handle(
                call(file_call::Op::List(proto::ListDir { path: "d".into() })),
                root.path(),
                None,
            );
            if let Some(file_response::Result::Listing(l)) = l.result {
                assert!(
                    l.entries.iter().all(|e| e.path != "d/f" || e.size == 6),
                    "listed outside the workspace"
                );
            }
        }
        let swaps = swapper.stop();
        let mut out: Vec<String> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        assert_eq!(out, ["f"], "something was written outside");
        assert_eq!(std::fs::read(outside.path().join("f")).unwrap(), b"outside");
        // The race really ran: the swap was seen both ways.
        assert!(
            swaps > 100 && inside > 0 && refused > 0,
            "{swaps} {inside} {refused}"
        );
    }
}
