//! Tests of `manifest`.

use super::write::materialise;
use super::*;
use crate::scan::Scanner;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn write(root: &Path, p: &str, s: &str) {
    let p = root.join(p);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), ".gitignore", "*.log\n");
    write(d.path(), "src/main.rs", "fn main() {}\n");
    write(d.path(), "src/dup.rs", "fn main() {}\n");
    write(d.path(), "run.sh", "echo hi\n");
    std::fs::set_permissions(
        d.path().join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    write(d.path(), "debug.log", "noise\n");
    write(d.path(), "target/debug/app", "binary\n");
    write(d.path(), ".git/HEAD", "ref: refs/heads/main\n");
    std::os::unix::fs::symlink("src/main.rs", d.path().join("link")).unwrap();
    unsafe_fifo(&d.path().join("pipe"));
    d
}

fn unsafe_fifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

#[test]
fn a_scan_sees_the_tree_a_developer_sees_and_hashes_only_what_changed() {
    let d = project();
    let mut s = Scanner::new(d.path(), Rules::default());
    let m = s.scan().unwrap();
    let paths: Vec<&str> = m.entries().keys().map(|s| s.as_str()).collect();
    assert_eq!(
        paths,
        [
            ".gitignore",
            "link",
            "run.sh",
            "src",
            "src/dup.rs",
            "src/main.rs"
        ]
    );
    assert!(m.entries()["run.sh"].exec);
    assert_eq!(m.entries()["link"].target, "src/main.rs");
    assert_eq!(
        m.entries()["src/dup.rs"].hash,
        m.entries()["src/main.rs"].hash
    );
    assert_eq!(m.blobs().count(), 3);
    m.validate(&Rules::default()).unwrap();
    // Old enough files are not hashed again; a changed one is.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    for p in [".gitignore", "run.sh", "src/main.rs", "src/dup.rs"] {
        std::fs::File::options()
            .write(true)
            .open(d.path().join(p))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    // Old enough by ctime too: setting the mtime moved it.
    std::thread::sleep(crate::scan::RACY + std::time::Duration::from_millis(20));
    s.reset();
    let before = s.scan().unwrap();
    assert_eq!(before.root_hash(), m.root_hash());
    let again = s.scan().unwrap();
    assert_eq!((s.hashed, again.root_hash()), (0, m.root_hash()));
    write(d.path(), "src/main.rs", "fn main() { println!(); }\n");
    let changed = s.scan().unwrap();
    assert_eq!(s.hashed, 1);
    assert_ne!(changed.root_hash(), m.root_hash());
    let delta = m.diff(&changed);
    assert_eq!(delta.upserts.keys().collect::<Vec<_>>(), ["src/main.rs"]);
    assert_eq!(m.apply(&delta, &Rules::default()).unwrap(), changed);
}

#[test]
fn a_same_size_rewrite_right_after_a_scan_is_still_seen() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a.txt", "aaaa");
    let mut s = Scanner::new(d.path(), Rules::default());
    let first = s.scan().unwrap();
    write(d.path(), "a.txt", "bbbb");
    let second = s.scan().unwrap();
    assert_ne!(
        first.entries()["a.txt"].hash,
        second.entries()["a.txt"].hash
    );
}

#[test]
fn materialise_reproduces_a_tree_and_fetches_only_what_is_new() {
    let src = project();
    let m = Scanner::new(src.path(), Rules::default()).scan().unwrap();
    let dst = tempfile::tempdir().unwrap();
    write(dst.path(), "stale.txt", "old\n");
    let mut fetched = Vec::new();
    let current = Scanner::new(dst.path(), Rules::default()).scan().unwrap();
    let mut blob = |h: &str| {
        fetched.push(h.to_string());
        let (p, _) = m.entries().iter().find(|(_, e)| e.hash == h).unwrap();
        std::fs::read(src.path().join(p))
    };
    let stats = materialise(dst.path(), &current, &m, &Rules::default(), &mut blob).unwrap();
    assert_eq!(fetched.len(), 3, "duplicates are fetched once");
    assert_eq!(stats.deleted, 1);
    let got = Scanner::new(dst.path(), Rules::default()).scan().unwrap();
    assert_eq!(got.root_hash(), m.root_hash());
    // A second run has nothing to fetch.
    let mut none = |_: &str| -> std::io::Result<Vec<u8>> {
        Err(std::io::Error::other("nothing should be fetched"))
    };
    materialise(dst.path(), &got, &m, &Rules::default(), &mut none).unwrap();
}

fn hostile(m: &Manifest) -> String {
    let dst = tempfile::tempdir().unwrap();
    let outside = dst.path().join("sentinel");
    std::fs::write(&outside, "untouched").unwrap();
    let root = dst.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let mut blob = |_: &str| Ok(b"evil".to_vec());
    let err = materialise(&root, &Manifest::default(), m, &Rules::default(), &mut blob)
        .unwrap_err()
        .to_string();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "nothing written: {err}"
    );
    err
}

fn one(path: &str, e: Entry) -> Manifest {
    let mut m = Manifest::default();
    m.insert(path.into(), e);
    m
}

#[test]
fn hostile_manifests_are_refused_naming_the_path_and_write_nothing() {
    let f = Entry::file(b"evil", false);
    for (path, want) in [
        ("/etc/passwd", "absolute"),
        ("../sentinel", "'..'"),
        ("a/../../sentinel", "'..'"),
        ("a\0b", "NUL"),
        ("a\nb", "control"),
        ("./x", "canonical"),
        ("x/", "canonical"),
        (".git/hooks/pre-commit", ".git/"),
    ] {
        let err = hostile(&one(path, f.clone()));
        assert!(err.contains(want), "{path:?}: {err}");
    }
    // A path through a symlink.
    let mut m = one("link", Entry::symlink("dir"));
    m.insert("dir".into(), Entry::dir());
    m.insert("link/x".into(), f.clone());
    assert!(hostile(&m).contains("\"link/x\""));
    // A write through a symlink pointing out of the root, in one manifest.
    let mut m = one("out", Entry::symlink(".."));
    m.insert("out/sentinel".into(), f.clone());
    assert!(hostile(&m).contains("\"out/sentinel\""));
    let mut m = one("etc", Entry::symlink("/etc"));
    m.insert("etc/passwd".into(), f.clone());
    assert!(hostile(&m).contains("\"etc/passwd\""));
    // Symlinks that lie about their form.
    let mut lying = Entry::symlink("x");
    lying.size = 99;
    assert!(hostile(&one("l", lying)).contains("its target's length"));
    assert!(hostile(&one("l", Entry::symlink(""))).contains("invalid symlink target"));
    // A parent that is not in the manifest, sizes and counts over the limits.
    assert!(hostile(&one("a/b", f.clone())).contains("not in the manifest"));
    let mut big = f.clone();
    big.size = DEFAULT_MAX_FILE_BYTES + 1;
    assert!(hostile(&one("big", big)).contains("file limit"));
    let many: Manifest = (0..DEFAULT_MAX_ENTRIES + 1)
        .map(|i| (format!("f{i}"), f.clone()))
        .collect();
    assert!(hostile(&many).contains("more than"));
    // Content that does not match its hash.
    let mut wrong = f.clone();
    wrong.hash = hash(b"something else");
    assert!(hostile(&one("x", wrong)).contains("does not match its hash"));
}

#[test]
fn symlinks_pointing_anywhere_are_carried_as_links_and_never_followed() {
    let dst = tempfile::tempdir().unwrap();
    let outside = dst.path().join("sentinel");
    std::fs::write(&outside, "untouched").unwrap();
    let root = dst.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let mut m = one("pw", Entry::symlink("/etc/passwd"));
    m.insert("up".into(), Entry::symlink("../sentinel"));
    m.insert("venv".into(), Entry::dir());
    m.insert("venv/bin".into(), Entry::dir());
    m.insert("venv/bin/python".into(), Entry::symlink("/usr/bin/python3"));
    m.validate(&Rules::default()).unwrap();
    let mut none = |_: &str| -> std::io::Result<Vec<u8>> { Err(std::io::Error::other("no blobs")) };
    materialise(
        &root,
        &Manifest::default(),
        &m,
        &Rules::default(),
        &mut none,
    )
    .unwrap();
    assert_eq!(
        std::fs::read_link(root.join("pw")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        std::fs::read_link(root.join("venv/bin/python")).unwrap(),
        Path::new("/usr/bin/python3")
    );
    let got = Scanner::new(&root, Rules::default()).scan().unwrap();
    assert_eq!(got.root_hash(), m.root_hash());
    // A manifest that turns the outward link into a file replaces the link: the file
    // outside is not written through it.
    let mut to = got.clone();
    to.insert("up".into(), Entry::file(b"evil", false));
    let mut blob = |_: &str| Ok(b"evil".to_vec());
    materialise(&root, &got, &to, &Rules::default(), &mut blob).unwrap();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
    assert_eq!(std::fs::read_to_string(root.join("up")).unwrap(), "evil");
    // Nor does an exec-bit change: a link in place of the file is refused, not followed.
    std::fs::remove_file(root.join("up")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("up")).unwrap();
    let mut exec = to.clone();
    exec.insert("up".into(), Entry::file(b"evil", true));
    let err = materialise(&root, &to, &exec, &Rules::default(), &mut none);
    assert!(err.is_err());
    let mode = std::fs::metadata(&outside).unwrap().permissions().mode();
    assert_eq!(mode & 0o111, 0, "the file outside was made executable");
}

#[test]
fn left_out_lists_from_the_wire_are_bounded_and_printable() {
    let list: Vec<proto::LeftOut> = (0..40)
        .map(|i| proto::LeftOut {
            path: format!("p{i}\n\x1b[31m{}", "x".repeat(1000)),
            reason: "a FIFO".into(),
        })
        .collect();
    let (kept, more) = LeftOut::from_wire(&list, 5);
    assert_eq!((kept.len(), more), (MAX_LEFT_OUT, 5 + 8));
    assert!(
        kept[0].path.starts_with("p0\\n\\u{1b}[31m"),
        "{}",
        kept[0].path
    );
    assert!(kept[0].path.chars().count() < 540 && kept[0].path.ends_with('…'));
    assert!(!kept.iter().any(|k| k.path.chars().any(char::is_control)));
}

#[test]
fn a_bad_delta_leaves_the_manifest_as_it_was() {
    let m = one("a", Entry::file(b"a", false));
    let mut d = Delta::default();
    d.upserts.insert("../x".into(), Entry::file(b"x", false));
    assert!(m.apply(&d, &Rules::default()).is_err());
    let mut d = Delta::default();
    d.deletes.push("/a".into());
    assert!(m.apply(&d, &Rules::default()).is_err());
    assert_eq!(m.entries().len(), 1);
}

#[test]
fn a_delta_is_checked_as_a_whole_manifest_would_be() {
    let mut m = one("d", Entry::dir());
    m.insert("d/f".into(), Entry::file(b"f", false));
    let r = Rules::default();
    let refused = |d: &Delta, why: &str| {
        let e = m.apply(d, &r).expect_err(why).to_string();
        assert!(e.contains("d/f") || e.contains("x/y"), "{why}: {e}");
    };
    // A directory turned into a file or a symlink while its children stay.
    let mut d = Delta::default();
    d.upserts
        .insert("d".into(), Entry::file(b"now a file", false));
    refused(&d, "file over a directory with children");
    d.upserts.insert("d".into(), Entry::symlink("elsewhere"));
    refused(&d, "symlink over a directory with children");
    // A new path whose parent is missing, or a file.
    let mut d = Delta::default();
    d.upserts.insert("x/y".into(), Entry::file(b"y", false));
    refused(&d, "missing parent");
    let mut d = Delta::default();
    d.upserts.insert("d/f/g".into(), Entry::file(b"g", false));
    assert!(m.apply(&d, &r).is_err(), "a path through a file");
    // Deleting a directory takes its subtree; replacing it by a file then is fine.
    let mut d = Delta::default();
    d.deletes.push("d".into());
    d.upserts
        .insert("d".into(), Entry::file(b"now a file", false));
    let n = m.apply(&d, &r).unwrap();
    n.validate(&r).unwrap();
    assert_eq!(n.entries().keys().collect::<Vec<_>>(), ["d"]);
}

/// A process swaps a directory of the tree for a symlink to outside and back while a move's
/// target materialises files into it: every write lands inside or fails, none outside.
#[test]
fn a_racing_symlink_swap_never_makes_materialise_write_outside() {
    let dst = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = dst.path().join("ws");
    let mut base = Manifest::default();
    base.insert("d".into(), Entry::dir());
    let mut target = base.clone();
    for i in 0..100 {
        target.insert(format!("d/f{i:03}"), Entry::file(b"new", false));
    }
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..100 {
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("swap")).unwrap();
        // Until the end of this run, or until materialise replaces the link it finds at `d`.
        let swapper = crate::beneath::Swapper::start(&root.join("d"), &root.join("swap"));
        let mut blob = |_: &str| Ok(b"new".to_vec());
        match materialise(&root, &base, &target, &Rules::default(), &mut blob) {
            Ok(_) => ok += 1,
            Err(_) => refused += 1,
        }
        swapper.stop();
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "materialise wrote outside the root"
        );
    }
    assert_eq!(ok + refused, 100);
}

/// The delta as a walk over every entry finds it: the reference the hash tree's must equal.
fn flat_diff(a: &Manifest, b: &Manifest) -> Delta {
    let mut d = Delta::default();
    for (p, e) in b.entries() {
        if a.get(p) != Some(e) {
            d.upserts.insert(p.clone(), e.clone());
        }
    }
    d.deletes = a
        .entries()
        .keys()
        .filter(|p| b.get(p).is_none())
        .cloned()
        .collect();
    d
}

#[test]
fn the_hash_tree_follows_every_change_and_diffs_as_a_full_comparison_would() {
    // Names that sort around '/' ('-' and '.' before it, '0' after), so that a directory's
    // children are not contiguous in path order.
    let names = ["a", "a-b", "a.txt", "a0", "b", "c"];
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut m = Manifest::default();
    let mut earlier: Vec<Manifest> = Vec::new();
    for step in 0..600 {
        // A random path of depth 1 to 4 whose parents are made directories.
        let depth = rng.random_range(1..=4usize);
        let parts: Vec<&str> = (0..depth)
            .map(|_| names[rng.random_range(0..names.len())])
            .collect();
        let path = parts.join("/");
        match rng.random_range(0..5) {
            0 => m.remove_tree(&path),
            op => {
                for i in 1..parts.len() {
                    let dir = parts[..i].join("/");
                    if m.get(&dir).map(|e| e.kind) != Some(Kind::Dir) {
                        m.remove_tree(&dir);
                        m.insert(dir, Entry::dir());
                    }
                }
                let e = match op {
                    1 => Entry::dir(),
                    2 => Entry::symlink(&format!("../t{step}")),
                    _ => Entry::file(
                        format!("v{}", rng.random_range(0..7)).as_bytes(),
                        step % 3 == 0,
                    ),
                };
                if e.kind != Kind::Dir {
                    m.remove_tree(&path);
                }
                m.insert(path, e);
            }
        }
        m.validate(&Rules::default()).unwrap();
        // Kept up to date incrementally, it is what hashing from scratch gives.
        let fresh = Manifest::from(m.entries().clone());
        assert_eq!(m.root_hash(), fresh.root_hash(), "step {step}");
        assert_eq!((m.files(), m.bytes()), (fresh.files(), fresh.bytes()));
        if step % 10 == 0 {
            earlier.push(m.clone());
        }
        // Against an earlier version, both ways: the tree's delta is the full comparison's,
        // and applying it gives the other version.
        let old = &earlier[rng.random_range(0..earlier.len())];
        for (from, to) in [(old, &m), (&m, old)] {
            let d = from.diff(to);
            assert_eq!(d, flat_diff(from, to), "step {step}");
            let applied = from.apply(&d, &Rules::default()).unwrap();
            assert_eq!(&applied, to);
            assert_eq!(applied.root_hash(), to.root_hash());
        }
        assert_eq!(m.root_hash() == old.root_hash(), &m == old);
    }
    // The same entries in other directories, or a file where a directory was, hash apart.
    let one = |path: &str| -> String {
        let mut m = Manifest::default();
        for (i, _) in path.match_indices('/') {
            m.insert(path[..i].to_string(), Entry::dir());
        }
        m.insert(path.to_string(), Entry::file(b"x", false));
        m.root_hash()
    };
    let roots = [one("a/b"), one("a/c"), one("b/b"), one("ab"), one("a/b/c")];
    let distinct: std::collections::HashSet<&String> = roots.iter().collect();
    assert_eq!(distinct.len(), roots.len());
}

#[test]
fn a_change_rehashes_only_the_directories_above_it() {
    let mut m = Manifest::default();
    for d in 0..100 {
        m.insert(format!("d{d:02}"), Entry::dir());
        for s in 0..10 {
            m.insert(format!("d{d:02}/s{s}"), Entry::dir());
            for f in 0..10 {
                let c = format!("{d} {s} {f}");
                m.insert(
                    format!("d{d:02}/s{s}/f{f}"),
                    Entry::file(c.as_bytes(), false),
                );
            }
        }
    }
    assert_eq!(m.len(), 100 + 1000 + 10_000);
    let before = m.clone();
    let root = m.root_hash();
    let all = m.work();
    assert_eq!(
        all,
        1 + 100 + 1000,
        "the first hash covers every directory once"
    );
    m.insert("d42/s3/f7".into(), Entry::file(b"changed", false));
    assert_ne!(m.root_hash(), root);
    assert_eq!(
        m.work() - all,
        3,
        "the file's directory, its parent and the root"
    );
    // Unchanged, nothing is hashed again.
    m.root_hash();
    assert_eq!(m.work() - all, 3);
    // A new directory tree counts its own directories and those above it.
    m.insert("d42/s3/new".into(), Entry::dir());
    m.insert("d42/s3/new/f".into(), Entry::file(b"n", false));
    m.root_hash();
    assert_eq!(m.work() - all, 3 + 4);
    let d = before.diff(&m);
    assert_eq!(d.upserts.len(), 3);
    assert!(d.deletes.is_empty());
    // Removing it rehashes only the directories above it.
    let w = m.work();
    m.remove_tree("d42/s3/new");
    m.root_hash();
    assert_eq!(m.work() - w, 3);
    assert_eq!(
        before.diff(&m).upserts.keys().collect::<Vec<_>>(),
        ["d42/s3/f7"]
    );
}

#[test]
fn decompress_gives_back_what_was_compressed_and_refuses_more_than_max() {
    let mut z = Compressor::new();
    let text = b"fn main() { println!(\"hi\"); }\n".repeat(1000);
    for data in [Vec::new(), b"x".to_vec(), text.clone()] {
        // The one-call path (the frame states its size) and the stream (it does not).
        assert_eq!(decompress(&z.compress(&data), u64::MAX).unwrap(), data);
        let mut streamed = Vec::new();
        let mut e = zstd::stream::write::Encoder::new(&mut streamed, ZSTD_LEVEL).unwrap();
        std::io::Write::write_all(&mut e, &data).unwrap();
        e.finish().unwrap();
        assert_eq!(decompress(&streamed, u64::MAX).unwrap(), data);
    }
    let max = text.len() as u64 - 1;
    assert!(decompress(&compress(&text), max).is_err());
    // Over the one-call size: streamed, and still held to max.
    let big = vec![7u8; ONE_CALL_MAX + 1];
    assert_eq!(decompress(&compress(&big), u64::MAX).unwrap(), big);
    assert!(decompress(&compress(&big), ONE_CALL_MAX as u64).is_err());
}

#[test]
fn decompress_refuses_a_frame_whose_stated_size_is_a_lie() {
    let data = vec![b'a'; 4096];
    let good = compress(&data);
    assert_eq!(zstd::bulk::Decompressor::upper_bound(&good), Some(4096));
    // The frame header: magic (4 bytes), descriptor, window byte unless single-segment, no
    // dictionary; a 2-byte content size holds the size less 256.
    let fhd = good[4];
    assert_eq!((fhd >> 6, fhd & 3), (1, 0), "a 2-byte size, no dictionary");
    let at = 5 + usize::from(fhd & 0x20 == 0);
    for stated in [1000u16, 4000, 4095, 4097, 8000] {
        let mut bad = good.clone();
        bad[at..at + 2].copy_from_slice(&(stated - 256).to_le_bytes());
        assert_eq!(
            zstd::bulk::Decompressor::upper_bound(&bad),
            Some(stated as usize)
        );
        assert!(
            decompress(&bad, u64::MAX).is_err(),
            "a frame stating {stated} bytes for 4096 was taken"
        );
    }
}
