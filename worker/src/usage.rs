//! How much a directory holds on disk: the bytes of its files and its entries, for a task's
//! disk quota (the workspace's own figures come from its manifest; this is for its temp
//! dir, which is not mirrored).

use std::path::Path;

/// Most entries counted: beyond, the walk stops (the count is then a lower bound, already
/// far over any sensible quota).
const MAX_ENTRIES: u64 = 2_000_000;

/// The bytes of the regular files under `dir` and the number of entries below it (files,
/// directories, links, anything), without following symlinks. A missing directory holds
/// nothing; entries that vanish or cannot be read meanwhile are skipped.
pub fn of(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            entries += 1;
            if entries >= MAX_ENTRIES {
                return (bytes, entries);
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file()
                && let Ok(m) = e.metadata()
            {
                bytes += m.len();
            }
        }
    }
    (bytes, entries)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_files_and_entries_without_following_links() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![0u8; 10_000]).unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), "12345").unwrap();
        std::fs::write(d.path().join("g"), "xy").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("out")).unwrap();
        // a, a/b, a/b/f, g, out
        assert_eq!(super::of(d.path()), (7, 5));
        assert_eq!(super::of(&d.path().join("missing")), (0, 0));
    }
}
