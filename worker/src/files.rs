//! File operations inside a workspace. Every path goes through `shared::paths`; writes are
//! atomic (temp file in the same directory, fsync, rename); sizes are bounded.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use proto::{
    DirListing, Done, FileCall, FileData, FileError, FileErrorKind, FileKind, FileResponse,
    FileStat, PathList, SearchMatch, SearchMatches, file_call, file_response,
};
use shared::limits::{MAX_FILE_CHUNK_BYTES, MAX_LIST_ENTRIES};
use shared::{paths, workspace};

/// Largest directory listing answered, in bytes of paths plus per-entry overhead.
const LIST_BYTES: usize = 4 * 1024 * 1024;

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
    let result = match crate::state::workspace(workspaces_root, &call.workspace) {
        Err(e) => from_paths(&call.workspace, e),
        Ok(ws) => match call.op {
            None => error(FileErrorKind::Invalid, "", "no operation given".into()),
            Some(file_call::Op::Read(r)) => read(&ws, &r.path, r.offset, r.length),
            Some(file_call::Op::Write(w)) => {
                let r = write(&ws, &w.path, &w.data, w.mode, w.create_dirs);
                if let (Some(o), file_response::Result::Done(_)) = (owner, &r) {
                    give(&ws, &w.path, o);
                }
                r
            }
            Some(file_call::Op::List(l)) => list(&ws, &l.path),
            Some(file_call::Op::Stat(s)) => stat(&ws, &s.path),
            Some(file_call::Op::Remove(r)) => remove(&ws, &r.path, r.recursive),
            Some(file_call::Op::Find(f)) => find(&ws, &f.glob, f.max_results),
            Some(file_call::Op::Search(f)) => search(&ws, &f.pattern, &f.glob, f.max_matches),
        },
    };
    FileResponse {
        call_id,
        result: Some(result),
    }
}

fn read(ws: &Path, path: &str, offset: u64, length: u64) -> file_response::Result {
    use std::os::unix::fs::OpenOptionsExt;
    let full = match paths::confine(ws, path) {
        Ok(p) => p,
        Err(e) => return from_paths(path, e),
    };
    // Look before opening: opening a FIFO would block, a device could do anything.
    match std::fs::symlink_metadata(&full) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return error(
                FileErrorKind::Invalid,
                path,
                format!("{path:?} is not a regular file"),
            );
        }
        Err(e) => return from_io(path, "cannot stat", e),
    }
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&full)
    {
        Ok(f) => f,
        Err(e) => return from_io(path, "cannot open", e),
    };
    // Checked again on the open file, in case it was swapped since the look.
    let size = match f.metadata() {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => {
            return error(
                FileErrorKind::Invalid,
                path,
                format!("{path:?} is not a regular file"),
            );
        }
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
    ws: &Path,
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
    let (parent, name) = match paths::confine_parent(ws, path) {
        Ok(x) => x,
        Err(e) => return from_paths(path, e),
    };
    if create_dirs && let Err(e) = std::fs::create_dir_all(&parent) {
        return from_io(path, "cannot create the parent of", e);
    }
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

/// Gives a written file, and the directories above it inside the workspace, to `owner`.
/// Gives a workspace path (and the directories on the way) to the command user.
pub fn give_path(ws: &Path, path: &str, owner: (u32, u32)) {
    give(ws, path, owner)
}

fn give(ws: &Path, path: &str, (uid, gid): (u32, u32)) {
    let Ok(parts) = paths::check_relative(path) else {
        return;
    };
    let mut cur = ws.to_path_buf();
    for p in parts {
        cur.push(p);
        if let Ok(c) = std::ffi::CString::new(cur.as_os_str().as_encoded_bytes()) {
            // SAFETY: valid NUL-terminated path; lchown does not follow symlinks.
            unsafe {
                libc::lchown(c.as_ptr(), uid, gid);
            }
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

fn list(ws: &Path, path: &str) -> file_response::Result {
    let full = match paths::confine(ws, path) {
        Ok(p) => p,
        Err(e) => return from_paths(path, e),
    };
    let rd = match std::fs::read_dir(&full) {
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

fn stat(ws: &Path, path: &str) -> file_response::Result {
    // The entry itself is described: a symlink is reported as a symlink, not followed.
    let full = match paths::check_relative(path) {
        Ok(parts) if parts.is_empty() => paths::confine(ws, path),
        Ok(_) => paths::confine_parent(ws, path).map(|(parent, name)| parent.join(name)),
        Err(e) => Err(e),
    };
    let full = match full {
        Ok(p) => p,
        Err(e) => return from_paths(path, e),
    };
    match std::fs::symlink_metadata(&full) {
        Ok(meta) => file_response::Result::Stat(stat_of(path.to_string(), &meta)),
        Err(e) => from_io(path, "cannot stat", e),
    }
}

fn remove(ws: &Path, path: &str, recursive: bool) -> file_response::Result {
    let (parent, name) = match paths::confine_parent(ws, path) {
        Ok(x) => x,
        Err(e) => return from_paths(path, e),
    };
    let target = parent.join(name);
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
}
