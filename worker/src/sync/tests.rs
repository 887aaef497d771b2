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

/// Files under a temp dir, as upload jobs (hash, path), with their content.
/// What the upload is asked for: each file's hash and path.
fn jobs_of(files: &[(String, String, Vec<u8>)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(h, p, _)| (h.clone(), p.clone()))
        .collect()
}

fn blob_jobs(d: &Path, sizes: &[usize]) -> Vec<(String, String, Vec<u8>)> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
            let name = format!("f{i}");
            std::fs::write(d.join(&name), &data).unwrap();
            (manifest::hash(&data), name, data)
        })
        .collect()
}

/// The blobs a stream of chunks carries, whole, in order: (hash, content).
fn reassemble(chunks: &[BlobChunk]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, Vec<u8>)> = None;
    for c in chunks {
        if !c.hash.is_empty() {
            assert!(cur.is_none(), "a blob began before the last one ended");
            cur = Some((hex::encode(&c.hash), Vec::new()));
        }
        let (_, data) = cur.as_mut().expect("a chunk before its hash");
        data.extend_from_slice(&c.data);
        if c.last {
            let (h, z) = cur.take().unwrap();
            out.push((h, manifest::decompress(&z, u64::MAX).unwrap()));
        }
    }
    assert!(cur.is_none(), "the stream ended inside a blob");
    out
}

#[test]
fn an_upload_streams_every_blob_whole_and_counts_the_wire() {
    let d = tempfile::tempdir().unwrap();
    // One blob spans several chunks (incompressible bytes over CHUNK).
    let big: Vec<u8> = (0..CHUNK * 2 + 10)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[7])
        .collect();
    std::fs::write(d.path().join("big"), &big).unwrap();
    let mut files = blob_jobs(d.path(), &[0, 1, 5000]);
    files.push((manifest::hash(&big), "big".into(), big));
    let jobs = jobs_of(&files);
    let (tx, mut rx) = tokio::sync::mpsc::channel(UPLOAD_AHEAD);
    let root = d.path().to_path_buf();
    let t = std::thread::spawn(move || produce(&root, jobs, &tx));
    let mut chunks = Vec::new();
    while let Some(c) = rx.blocking_recv() {
        chunks.push(c);
    }
    let Produced::All { wire } = t.join().unwrap() else {
        panic!("every blob should have been sent");
    };
    assert_eq!(
        wire,
        chunks.iter().map(|c| c.data.len() as u64).sum::<u64>()
    );
    assert!(chunks.iter().all(|c| c.data.len() <= CHUNK));
    let got = reassemble(&chunks);
    let want: Vec<(String, Vec<u8>)> = files.into_iter().map(|(h, _, d)| (h, d)).collect();
    assert_eq!(got, want);
}

#[test]
fn an_upload_holds_a_bounded_queue_and_waits_for_the_stream() {
    let d = tempfile::tempdir().unwrap();
    // More blobs than the queue holds.
    let files = blob_jobs(d.path(), &vec![64; UPLOAD_AHEAD * 3]);
    let jobs = jobs_of(&files);
    let (tx, mut rx) = tokio::sync::mpsc::channel(UPLOAD_AHEAD);
    let probe = tx.clone();
    let root = d.path().to_path_buf();
    let t = std::thread::spawn(move || produce(&root, jobs, &tx));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while probe.capacity() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never filled"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!t.is_finished(), "the reader went past a full queue");
    drop(probe);
    let mut n = 0;
    while rx.blocking_recv().is_some() {
        n += 1;
    }
    assert_eq!(n, UPLOAD_AHEAD * 3);
    assert!(matches!(t.join().unwrap(), Produced::All { .. }));
}

#[test]
fn a_file_changed_since_the_scan_ends_the_upload_between_whole_blobs() {
    let d = tempfile::tempdir().unwrap();
    let files = blob_jobs(d.path(), &[100, 200, 300]);
    // The second file changed after the scan hashed it.
    std::fs::write(d.path().join(&files[1].1), b"rewritten").unwrap();
    let jobs = jobs_of(&files);
    let (tx, mut rx) = tokio::sync::mpsc::channel(UPLOAD_AHEAD);
    let root = d.path().to_path_buf();
    let r = std::thread::spawn(move || produce(&root, jobs, &tx))
        .join()
        .unwrap();
    let Produced::Stopped(why) = r else {
        panic!("a changed file should stop the upload");
    };
    assert!(
        why.changed_under_us(),
        "{why}: the barrier should scan again"
    );
    assert_eq!(why.to_string(), "f1 changed since the scan");
    let mut chunks = Vec::new();
    while let Ok(c) = rx.try_recv() {
        chunks.push(c);
    }
    let got = reassemble(&chunks);
    assert_eq!(got, vec![(files[0].0.clone(), files[0].2.clone())]);

    // Gone, or a symlink now: the same.
    let files = blob_jobs(d.path(), &[10]);
    std::fs::remove_file(d.path().join("f0")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", d.path().join("f0")).unwrap();
    let (tx, _rx) = tokio::sync::mpsc::channel(UPLOAD_AHEAD);
    let jobs = vec![(files[0].0.clone(), "f0".to_string())];
    let r = produce(d.path(), jobs, &tx);
    assert!(
        matches!(&r, Produced::Stopped(w) if w.changed_under_us() && w.to_string() == "f0 is gone since the scan")
    );
}

#[test]
fn an_upload_stops_reading_when_the_stream_goes_away() {
    let d = tempfile::tempdir().unwrap();
    let files = blob_jobs(d.path(), &[10, 10]);
    let jobs = jobs_of(&files);
    let (tx, rx) = tokio::sync::mpsc::channel(UPLOAD_AHEAD);
    drop(rx);
    assert!(matches!(produce(d.path(), jobs, &tx), Produced::Closed));
}
