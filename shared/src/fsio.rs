//! Files that must be whole or absent: the one atomic write (a temporary file beside the
//! target, written, renamed over it), with the durability the caller asks for, and the
//! `fsync`/`syncfs` helpers around it.
//!
//! A reader never sees a half-written file: it sees the old one or the new one. With
//! [`Durability::Full`] the new one also survives power loss once the call returns (the
//! file's data and the directory entry are synced). [`Durability::Deferred`] leaves syncing
//! to the caller, who batches many writes into one [`syncfs`] (the mirror's blobs, a
//! materialised workspace).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// How much of a write must be on disk when [`write_atomic`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// File data and directory entry synced: survives a crash or power loss.
    Full,
    /// Renamed into place, not synced: the caller syncs the filesystem later.
    Deferred,
}

/// Whether `name` (one path component) is a temp file [`write_atomic`] makes beside its
/// target (`.NAME.tether-PID-HEX16`): not a change anyone made, for watchers to skip.
pub fn is_temp_name(name: &str) -> bool {
    let Some((head, hex)) = name.rsplit_once('-') else {
        return false;
    };
    let Some((head, pid)) = head.rsplit_once('-') else {
        return false;
    };
    name.starts_with('.')
        && head.len() > ".tether".len() + 1
        && head.ends_with(".tether")
        && hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
}

/// Writes `data` to `path` atomically with permission bits `mode` (the umask does not apply).
/// The temporary file is created exclusively and never through a symlink; if the write
/// fails it is removed and `path` is untouched.
pub fn write_atomic(
    path: &Path,
    data: &[u8],
    mode: u32,
    durability: Durability,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let short: String = name.chars().take(64).collect();
    let tmp = dir.join(format!(
        ".{short}.tether-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let r = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(data)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if durability == Durability::Full {
            f.sync_all()?;
        }
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if durability == Durability::Full {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Syncs a directory, so the entries created or renamed in it survive power loss.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Syncs the whole filesystem `dir` is on (`syncfs(2)`): one call for many deferred writes.
pub fn syncfs(dir: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(dir)?;
    Ok(rustix::fs::syncfs(&f)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_own_temp_names_are_told_apart() {
        let d = tempfile::tempdir().unwrap();
        let tmp = format!(".a.txt.tether-{}-{:016x}", std::process::id(), 0xfeedu64);
        assert!(is_temp_name(&tmp));
        for other in [
            "a.txt",
            ".a.txt.tether-1-xyz",
            ".tether-1-0123456789abcdef",
            "a.tether-1-0123456789abcdef",
        ] {
            assert!(!is_temp_name(other), "{other}");
        }
        // The shape write_atomic really uses: nothing else is left beside the target.
        write_atomic(&d.path().join("a.txt"), b"x", 0o644, Durability::Deferred).unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn replaces_whole_with_the_mode_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "old").unwrap();
        write_atomic(&p, b"new", 0o600, Durability::Full).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        write_atomic(&p, b"x", 0o755, Durability::Deferred).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_failed_write_leaves_the_target_alone() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("inside"), "x").unwrap();
        // Renaming a file over a non-empty directory fails.
        assert!(write_atomic(&p, b"new", 0o644, Durability::Full).is_err());
        assert!(p.join("inside").exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
