//! Tests of `sync`.

use super::*;

#[test]
fn trackers_are_bounded_and_one_given_up_means_a_full_walk() {
    let d = tempfile::tempdir().unwrap();
    let state = SyncState {
        max_trackers: 2,
        ..SyncState::default()
    };
    let fences = d.path().join("fences");
    let ws = |name: &str| {
        let root = d.path().join(name);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("f"), name).unwrap();
        state.ws(name, &root, &Rules::default(), &fences)
    };
    let tracked = |w: &Arc<Mutex<Ws>>| w.locked().tracker.is_some();
    let (a, b) = (ws("a"), ws("b"));
    for w in [&a, &b] {
        scan_now(&mut w.locked(), false).unwrap();
        assert!(w.locked().scanner.was_full, "a first scan walks");
    }
    scan_now(&mut a.locked(), false).unwrap();
    assert!(
        !a.locked().scanner.was_full,
        "a tracked workspace does not walk"
    );
    std::thread::sleep(Duration::from_millis(5));
    let c = ws("c");
    assert!(
        tracked(&c) && tracked(&b),
        "the two most recently used keep theirs"
    );
    assert!(!tracked(&a), "the least recently used gives its tracker up");
    // Changed while untracked: the next scan must walk to see it.
    std::fs::write(d.path().join("a/new"), "made while untracked").unwrap();
    let a = ws("a");
    assert!(tracked(&a));
    scan_now(&mut a.locked(), false).unwrap();
    let w = a.locked();
    assert!(w.scanner.was_full);
    assert!(w.scanner.last().unwrap().entries().contains_key("new"));
}
