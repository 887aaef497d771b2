//! Tests of `scan`.

use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn write(root: &Path, p: &str, s: &str) {
    let p = root.join(p);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

/// What an ideal watcher would report for one operation: every path it touched.
fn op(root: &Path, r: &mut StdRng, step: usize) -> Vec<String> {
    let dirs = ["", "a", "a/b", "c", "target", "ign", "a/b/deep"];
    let d = dirs[r.random_range(0..dirs.len() as u64) as usize];
    let f = join(d, &format!("f{}", r.random_range(0..6)));
    let abs = root.join(&f);
    // A watcher also reports the directories an operation creates.
    let mut out: Vec<String> =
        std::iter::successors(Some(d), |p| (!p.is_empty()).then(|| parent(p)))
            .map(String::from)
            .collect();
    out.extend(match r.random_range(0..10) {
        0..=3 => {
            std::fs::create_dir_all(abs.parent().unwrap()).unwrap();
            if abs.is_dir() {
                std::fs::remove_dir_all(&abs).unwrap();
            }
            std::fs::write(&abs, format!("{step}")).unwrap();
            vec![f]
        }
        4 => {
            let _ = std::fs::remove_file(&abs);
            vec![f]
        }
        5 => {
            // Replace a directory by another with different content, under the same name.
            let tmp = root.join("tmp-new");
            write(&tmp, "x/y", &format!("{step}"));
            let dst = root.join(d).join("sub");
            let _ = std::fs::remove_dir_all(&dst);
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            std::fs::rename(&tmp, &dst).unwrap();
            vec![join(d, "sub"), "tmp-new".into()]
        }
        6 => {
            let src = root.join(d).join("sub");
            let dst = root.join(format!("moved{}", r.random_range(0..3)));
            if src.is_dir() && !dst.exists() {
                std::fs::rename(&src, &dst).unwrap();
            }
            vec![
                join(d, "sub"),
                dst.file_name().unwrap().to_str().unwrap().into(),
            ]
        }
        7 => {
            let _ = std::fs::remove_dir_all(root.join(d).join("sub"));
            vec![join(d, "sub")]
        }
        8 => {
            let rules = ["*.log\n", "f1\n", "!f1\n", "sub/\n"];
            let p = join(d, ".gitignore");
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(&p), rules[r.random_range(0..4) as usize]).unwrap();
            vec![p]
        }
        _ => {
            let p = join(d, "s.log");
            std::fs::create_dir_all(root.join(d)).unwrap();
            let _ = std::fs::remove_file(root.join(&p));
            std::os::unix::fs::symlink("f1", root.join(&p)).unwrap();
            vec![p]
        }
    });
    out
}

#[test]
fn scans_of_only_the_changed_paths_agree_with_full_walks() {
    for seed in 1..=40u64 {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        write(root, ".gitignore", "ign/\n*.tmp\n");
        write(root, "a/b/keep.rs", "x");
        write(root, "target/out", "built");
        let mut r = StdRng::seed_from_u64(seed);
        let mut inc = Scanner::new(root, Rules::default());
        let mut marked = inc.scan().unwrap();
        inc.mark(inc.generation(), &marked.root_hash());
        for step in 0..30 {
            let mut changed = BTreeSet::new();
            for _ in 0..=r.random_range(0..3) {
                changed.extend(op(root, &mut r, step));
            }
            let got = inc.scan_changes(&changed, &mut |_| {}).unwrap().clone();
            let want = Scanner::new(root, Rules::default()).scan().unwrap();
            assert!(
                got == want,
                "seed {seed} step {step}: a scan of {changed:?} disagrees with a full walk: {:?}",
                got.diff(&want)
            );
            // The changes since the mark turn the marked manifest into this one; the
            // mark moves only every other step, so changes pile up in between.
            let d = inc.changes_since_mark().expect("known since the mark");
            assert_eq!(
                marked.apply(&d, &Rules::default()).unwrap(),
                want,
                "seed {seed} step {step}"
            );
            if step % 2 == 0 {
                inc.mark(inc.generation(), &want.root_hash());
                marked = want;
            }
        }
    }
}

#[test]
fn a_partial_scan_lists_only_the_changed_directories() {
    let d = tempfile::tempdir().unwrap();
    let old = SystemTime::now() - Duration::from_secs(60);
    for i in 0..50 {
        write(d.path(), &format!("d{i}/f"), "x");
        let f = std::fs::File::options()
            .write(true)
            .open(d.path().join(format!("d{i}/f")));
        f.unwrap().set_modified(old).unwrap();
    }
    // Old enough by ctime too (setting the mtime moved it), so nothing is racy.
    std::thread::sleep(RACY + Duration::from_millis(20));
    let mut s = Scanner::new(d.path(), Rules::default());
    s.scan().unwrap();
    assert_eq!(s.listed, 51);
    write(d.path(), "d7/f", "changed");
    write(d.path(), "d9/new/g", "new");
    let changed: BTreeSet<String> = ["d7/f", "d9/new"].map(String::from).into();
    let m = s.scan_changes(&changed, &mut |_| {}).unwrap().clone();
    assert!(!s.was_full);
    assert_eq!(s.listed, 3, "d7, d9 and the new d9/new");
    assert_eq!(s.hashed, 2);
    assert_eq!(m.entries()["d9/new/g"].hash, crate::manifest::hash(b"new"));
    assert_eq!(m, Scanner::new(d.path(), Rules::default()).scan().unwrap());
}

/// `cp -p`, `tar x` and `rsync -t` put a rewritten file's old mtime back: size, mtime and
/// inode all look unchanged, and only the ctime (which no call can set) tells: in the stamp
/// when the rewrite is older than the racy window, as racy when it is inside it.
#[test]
fn a_same_size_rewrite_with_its_old_mtime_put_back_is_hashed_again() {
    let d = tempfile::tempdir().unwrap();
    let old = SystemTime::now() - Duration::from_secs(60);
    let set_old = |p: &str| {
        let f = std::fs::File::options().write(true).open(d.path().join(p));
        f.unwrap().set_modified(old).unwrap();
    };
    // Rewritten in place (same inode, same size), its mtime put back.
    let rewrite = |p: &str, text: &str| {
        let ino = std::fs::metadata(d.path().join(p)).unwrap().ino();
        std::fs::write(d.path().join(p), text).unwrap();
        set_old(p);
        let meta = std::fs::metadata(d.path().join(p)).unwrap();
        assert_eq!((meta.ino(), meta.len()), (ino, text.len() as u64));
        assert_eq!(meta.modified().unwrap(), old);
    };
    // The ctime of each change must fall before the racy window of the scan after it, so
    // that only the stamp can tell: wait that long before the scan.
    let past_racy = || std::thread::sleep(RACY + Duration::from_millis(20));
    for p in ["a.txt", "b.txt", "c.txt"] {
        write(d.path(), p, "version 1");
        set_old(p);
    }
    past_racy();
    let mut s = Scanner::new(d.path(), Rules::default());
    let first = s.scan().unwrap().clone();
    past_racy();
    s.scan().unwrap();
    assert_eq!(s.hashed, 0, "nothing changed, nothing is hashed");

    rewrite("a.txt", "version 2");
    past_racy();
    let m = s.scan().unwrap().clone();
    assert!(s.was_full);
    assert_eq!(
        s.hashed, 1,
        "only the rewritten file is hashed again (its ctime moved)"
    );
    assert_eq!(
        m.entries()["a.txt"].hash,
        crate::manifest::hash(b"version 2")
    );
    assert_eq!(m.entries()["b.txt"], first.entries()["b.txt"]);

    // Rewritten right after a scan: inside that scan's racy window by its ctime.
    past_racy();
    s.scan().unwrap();
    rewrite("b.txt", "version 3");
    let m = s.scan().unwrap().clone();
    assert_eq!(
        m.entries()["b.txt"].hash,
        crate::manifest::hash(b"version 3")
    );
    assert_eq!(m.entries()["c.txt"], first.entries()["c.txt"]);
    assert_eq!(m, Scanner::new(d.path(), Rules::default()).scan().unwrap());
}

fn fifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

#[test]
fn what_cannot_cross_the_wire_is_left_out_with_a_reason_and_the_rest_syncs() {
    use std::os::unix::ffi::OsStrExt;
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    write(root, "src/main.rs", "fn main() {}\n");
    fifo(&root.join("pipe"));
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
    std::fs::write(root.join(odd), "latin-1").unwrap();
    std::fs::create_dir(root.join(std::ffi::OsStr::from_bytes(b"dir\xff"))).unwrap();
    write(root, "line\nbreak", "x");
    write(root, "\\back", "x");
    write(root, "big.bin", &"x".repeat(2000));
    std::os::unix::fs::symlink("/etc/passwd", root.join("pw")).unwrap();
    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(b"t\xfe"), root.join("badlink"))
        .unwrap();
    let rules = Rules {
        max_file_bytes: 1000,
        ..Rules::default()
    };
    let mut s = Scanner::new(root, rules.clone());
    let m = s.scan().unwrap();
    m.validate(&rules).unwrap();
    let paths: Vec<&str> = m.entries().keys().map(|s| s.as_str()).collect();
    assert_eq!(paths, ["pw", "src", "src/main.rs"]);
    assert_eq!(m.entries()["pw"].target, "/etc/passwd");
    let left: Vec<(&str, &str)> = s
        .left_out()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let want = [
        ("\\back", "backslash"),
        ("badlink", "not UTF-8"),
        ("big.bin", "over the 1000 bytes file size limit"),
        ("caf\\xe9.txt", "not UTF-8"),
        ("dir\\xff", "not UTF-8"),
        ("line\\nbreak", "control character"),
        ("pipe", "FIFO"),
        ("sock", "socket"),
    ];
    assert_eq!(left.len(), want.len(), "{left:?}");
    for ((path, why), (want_path, want_why)) in left.iter().zip(want) {
        assert_eq!(*path, want_path);
        assert!(why.contains(want_why), "{path}: {why}");
    }
    // A partial scan keeps the list up to date: a new FIFO in a subdirectory appears,
    // a removed one goes.
    std::fs::remove_file(root.join("pipe")).unwrap();
    fifo(&root.join("src/p2"));
    let changed: BTreeSet<String> = ["pipe", "src/p2"].map(String::from).into();
    s.scan_changes(&changed, &mut |_| {}).unwrap();
    assert!(!s.left_out().contains_key("pipe"));
    assert!(s.left_out()["src/p2"].contains("FIFO"));
    assert_eq!(s.left_out().len(), want.len());
    // Removing the directory takes what was left out in it along.
    std::fs::remove_dir_all(root.join("src")).unwrap();
    let changed: BTreeSet<String> = ["src"].map(String::from).into();
    s.scan_changes(&changed, &mut |_| {}).unwrap();
    assert!(!s.left_out().contains_key("src/p2"));
}

#[test]
fn the_name_check_agrees_with_the_receivers_path_rules() {
    use std::os::unix::ffi::OsStrExt;
    let rules = Rules::default();
    let long = "n".repeat(255);
    let deep = ["d"; 2100].join("/");
    for (dir, name) in [
        ("", "plain.txt"),
        ("", "\\lead"),
        ("a", "\\lead"),
        ("", "tab\there"),
        ("", "del\u{7f}"),
        ("", "ünïcödé"),
        ("", long.as_str()),
        ("a/b", "x"),
        (deep.as_str(), "x"),
        ("", "a b"),
    ] {
        let path = join(dir, name);
        let ours = name_problem(dir, std::ffi::OsStr::from_bytes(name.as_bytes()));
        let theirs = crate::manifest::check_path(&path, &rules);
        assert_eq!(
            ours.is_none(),
            theirs.is_ok(),
            "{path:?}: ours {ours:?}, receiver {theirs:?}"
        );
    }
}

#[test]
fn gitignore_precedence_follows_git() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    write(root, ".gitignore", "*.log\nbuild/\n");
    write(root, "a/.gitignore", "!keep.log\n");
    write(root, "a/keep.log", "k");
    write(root, "a/drop.log", "d");
    write(root, "build/x", "x");
    write(root, "a/build/y", "y");
    write(root, ".git/info/exclude", "secret\n");
    write(root, "secret", "s");
    write(root, "a/.ignore", "drop2\n");
    write(root, "a/drop2", "d");
    let m = Scanner::new(root, Rules::default()).scan().unwrap();
    let paths: Vec<&str> = m.entries().keys().map(|s| s.as_str()).collect();
    assert_eq!(
        paths,
        [".gitignore", "a", "a/.gitignore", "a/.ignore", "a/keep.log"]
    );
}

/// A command swaps a workspace directory for a symlink to outside and back while scans run:
/// no scan may read what is outside (its hash would be in the manifest, and the file would
/// reach the brain's mirror).
#[test]
fn a_racing_symlink_swap_never_makes_a_scan_read_outside() {
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = d.path().to_path_buf();
    write(&root, "d/f", "inside!");
    std::fs::write(outside.path().join("f"), "SECRET!").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("swap")).unwrap();
    let secret = crate::manifest::hash(b"SECRET!");
    let swapper = crate::beneath::Swapper::start(&root.join("d"), &root.join("swap"));
    let mut s = Scanner::new(&root, Rules::default());
    let (mut saw_file, mut saw_link) = (0, 0);
    for _ in 0..1500 {
        s.reset();
        let m = s.scan().unwrap().clone();
        assert!(
            m.entries().values().all(|e| e.hash != secret),
            "a scan read outside the root: {m:?}"
        );
        match m.entries().get("d").map(|e| e.kind) {
            Some(Kind::Dir) if m.entries().contains_key("d/f") => saw_file += 1,
            Some(Kind::Symlink) => saw_link += 1,
            _ => {}
        }
    }
    let swaps = swapper.stop();
    assert!(
        swaps > 100 && saw_file > 0 && saw_link > 0,
        "{swaps} {saw_file} {saw_link}"
    );
}
