//! The engine in process: real store, supervisor and drivers over an in-memory log and fake
//! ports, with tokio's clock paused, so timeouts (failover after, worker wait) run in virtual
//! time and each test waits on conditions, not on the wall clock.

use shared::locks::Lock;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ports::Delivery;
use super::ports::*;
use super::*;
use crate::engine::log::MemLog;
use crate::model::delivery::{Mode, Origin};
use crate::model::env::{EnvRequest, Grant, Quote};
use crate::model::event::ToolResult;
use crate::model::ids::CallIds;
use crate::model::ops::{Command, CommandEnd, FileAnswer, FileOp, SyncOp, SyncReport};

/// Workers that are connected or not as the test says, run every command at most once per
/// call id (as a worker's journal does) and answer barriers with a fresh root.
#[derive(Default)]
struct FakeWorkers {
    connected: Mutex<HashSet<String>>,
    /// Woken when a worker connects or disconnects.
    changed: tokio::sync::Notify,
    /// Call ids run, with the worker they ran on, in order.
    ran: Mutex<Vec<(u64, String)>>,
    /// While set, commands do not finish (they wait for it to clear, or for their worker
    /// to go).
    hold: std::sync::atomic::AtomicBool,
    barriers: AtomicU64,
    /// While set, file operations on a connected worker time out; each try is counted.
    files_fail: std::sync::atomic::AtomicBool,
    file_tries: AtomicU64,
}

impl FakeWorkers {
    fn hold(&self, on: bool) {
        self.hold.store(on, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    fn set(&self, worker: &str, up: bool) {
        let mut c = self.connected.locked();
        if up {
            c.insert(worker.to_string());
        } else {
            c.remove(worker);
        }
        drop(c);
        self.changed.notify_waiters();
    }

    fn up(&self, worker: &str) -> bool {
        self.connected.locked().contains(worker)
    }

    async fn until_up(&self, worker: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.changed.notified();
            if self.up(worker) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }
}

#[async_trait::async_trait]
impl Workers for FakeWorkers {
    fn is_connected(&self, worker: &str) -> bool {
        self.up(worker)
    }

    async fn wait_connected(&self, worker: &str, wait: Duration) -> bool {
        self.until_up(worker, wait).await
    }

    async fn run_durable(
        &self,
        worker: &str,
        cmd: Command,
        wait: Duration,
        _output: OutputSink,
    ) -> CommandEnd {
        loop {
            if !self.until_up(worker, wait).await {
                return CommandEnd::WorkerGone;
            }
            let changed = self.changed.notified();
            if !self.hold.load(Ordering::SeqCst) {
                break;
            }
            if !self.up(worker) {
                continue;
            }
            changed.await;
        }
        let mut ran = self.ran.locked();
        if !ran.iter().any(|(id, _)| *id == cmd.call_id) {
            ran.push((cmd.call_id, worker.to_string()));
        }
        CommandEnd::Finished {
            result: ToolResult {
                exit_code: Some(0),
                ..Default::default()
            },
            stdout: format!("ran on {worker}").into_bytes(),
            stderr: vec![],
        }
    }

    fn cancel(&self, _worker: &str, _call_id: u64) {}

    fn ack(&self, _worker: &str, _call_id: u64) {}

    async fn file(
        &self,
        worker: &str,
        _workspace: &str,
        _op: FileOp,
        _timeout: Duration,
    ) -> Result<FileAnswer, CallError> {
        self.file_tries.fetch_add(1, Ordering::SeqCst);
        if self.up(worker) && self.files_fail.load(Ordering::SeqCst) {
            Err(CallError::Timeout {
                worker: worker.into(),
                timeout: _timeout,
            })
        } else if self.up(worker) {
            Ok(FileAnswer::Done)
        } else {
            Err(CallError::NotConnected(worker.into()))
        }
    }

    async fn sync(
        &self,
        worker: &str,
        _workspace: &str,
        op: SyncOp,
        _rules: &SyncRules,
        _full_scan: bool,
        _timeout: Duration,
    ) -> Result<SyncReport, CallError> {
        if !self.up(worker) {
            return Err(CallError::NotConnected(worker.into()));
        }
        let root_hash = match op {
            SyncOp::Materialise { root } => root,
            _ => format!("root-{}", self.barriers.fetch_add(1, Ordering::Relaxed)),
        };
        Ok(SyncReport {
            root_hash,
            ..Default::default()
        })
    }
}

/// Placement over the fake workers: the one named, or any connected one.
struct FakePlacement(Arc<FakeWorkers>);

impl Placement for FakePlacement {
    fn named(&self, named: &str, _labels: &Labels) -> Result<Picked, PortError> {
        Ok(Picked {
            id: named.into(),
            name: named.into(),
        })
    }

    fn check(&self, _labels: &Labels) -> Result<(), PortError> {
        Ok(())
    }

    fn place(&self, _task: u64, _labels: &Labels) -> Result<String, PortError> {
        let mut up: Vec<String> = self.0.connected.locked().iter().cloned().collect();
        up.sort();
        up.into_iter()
            .next()
            .ok_or_else(|| PortError::Unplaceable("no worker".into()))
    }

    fn enqueue(&self, _task: u64, _labels: &Labels) -> tokio::sync::oneshot::Receiver<String> {
        tokio::sync::oneshot::channel().1
    }

    fn move_target(
        &self,
        _task: u64,
        current: &str,
        _labels: &Labels,
    ) -> Result<String, PortError> {
        self.failover(0, current, _labels)
            .ok_or_else(|| PortError::Unplaceable("no worker".into()))
    }

    fn failover(&self, _task: u64, lost: &str, _labels: &Labels) -> Option<String> {
        let mut up: Vec<String> = self.0.connected.locked().iter().cloned().collect();
        up.sort();
        up.into_iter().find(|w| w != lost)
    }

    fn occupy(&self, _task: u64, _now: Option<crate::engine::ports::Occupancy>) {}
}

struct NoMachines;

#[async_trait::async_trait]
impl Environments for NoMachines {
    fn quote(&self, _: &str, _: &str, _: &EnvRequest) -> Quote {
        Quote::default()
    }
    async fn obtain(
        &self,
        _: &str,
        _: &str,
        _: &EnvRequest,
        _: Option<f64>,
    ) -> Result<Grant, PortError> {
        Err(PortError::NoMachine("no machines here".into()))
    }
    async fn release_if_ours(&self, _: &str, _: &str) -> Option<String> {
        None
    }
    async fn release_for_task(&self, _: &str) -> Vec<String> {
        vec![]
    }
    fn task_cost(&self, _: &str) -> f64 {
        0.0
    }
    fn available(&self, _: &str) -> bool {
        false
    }
}

#[async_trait::async_trait]
impl Workspaces for NoMachines {
    async fn import_git(&self, _: &str, _: &str, _: &SyncRules) -> Result<Imported, PortError> {
        Err(PortError::Git("no git here".into()))
    }
    async fn read_file(&self, _: &str, _: &str, _: u64) -> Option<Vec<u8>> {
        None
    }
    async fn list_files(&self, _: &str) -> Vec<(String, bool)> {
        vec![]
    }
    async fn diff_size(&self, _: &str, _: &str) -> Result<(u64, u64), PortError> {
        Ok((0, 0))
    }
    async fn changed_files(&self, _: &str, _: &str) -> Vec<(String, Option<bool>)> {
        vec![]
    }
}

#[async_trait::async_trait]
impl Delivery for NoMachines {
    fn default_mode(&self) -> Mode {
        Mode::None
    }
    fn branch_prefix(&self) -> String {
        "tether/".into()
    }
    async fn commit(&self, _: &CommitRequest) -> Result<String, PortError> {
        Err(PortError::Git("no git here".into()))
    }
    async fn push(&self, _: &Origin, _: &str, _: &str) -> Result<(), PortError> {
        Err(PortError::Git("no git here".into()))
    }
    async fn open_pull_request(&self, _: &PullRequestSpec) -> Result<(String, u64), PortError> {
        Err(PortError::Git("no git here".into()))
    }
}

fn engine(workers: Arc<FakeWorkers>, opts: Options) -> Engine {
    engine_on(Arc::new(MemLog::default()), workers, opts, 0)
}

fn engine_on(
    log: Arc<dyn crate::engine::log::EventLog>,
    workers: Arc<FakeWorkers>,
    opts: Options,
    call_floor: u64,
) -> Engine {
    let store = Store::new(log, 100, CallIds::starting_above(call_floor, 1));
    Engine::new(
        store,
        Ports {
            workers: workers.clone(),
            placement: Arc::new(FakePlacement(workers)),
            environments: Arc::new(NoMachines),
            workspaces: Arc::new(NoMachines),
            delivery: Arc::new(NoMachines),
        },
        opts,
        TaskTracker::new(),
        CancellationToken::new(),
    )
}

fn plan_task(worker: &str, steps: usize) -> NewTask {
    let steps: Vec<String> = (0..steps)
        .map(|i| format!(r#"{{"run":["step-{i}"]}}"#))
        .collect();
    NewTask {
        goal: "test".into(),
        kind: Kind::Plan {
            plan: Plan::parse(&format!(r#"{{"steps":[{}]}}"#, steps.join(","))).unwrap(),
            egress: None,
        },
        worker: worker.into(),
        labels: Labels::new(),
        rules: SyncRules::default(),
        source: Source::Empty,
        deliver: None,
        attempts: None,
    }
}

/// Waits (in virtual time) until `f` holds for the task's state, at most `limit`.
async fn until(
    e: &Engine,
    id: TaskId,
    limit: Duration,
    f: impl Fn(&TaskState) -> bool,
) -> TaskState {
    let deadline = Instant::now() + limit;
    loop {
        let st = e.store().task(id).unwrap().state();
        if f(&st) {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}: {st:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn events(e: &Engine, id: TaskId) -> Vec<Event> {
    e.store()
        .log()
        .read(id, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap().event)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_task_fails_over_once_its_worker_is_gone_for_failover_after() {
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w2", true);
    let e = engine(
        workers.clone(),
        Options {
            failover_after: Duration::from_secs(30),
            ..Options::default()
        },
    );
    let start = Instant::now();
    let id = e.create(plan_task("w1", 2)).await.unwrap();
    // It waits for w1 first, visibly.
    let st = until(&e, id, Duration::from_secs(5), |st| {
        st.status == Status::Waiting
    })
    .await;
    assert_eq!(st.reason, "waiting for worker w1");
    let st = until(&e, id, Duration::from_secs(300), |st| {
        st.status.is_terminal()
    })
    .await;
    assert_eq!(st.status, Status::Finished, "{st:#?}");
    assert!(
        start.elapsed() >= Duration::from_secs(30),
        "moved after {:?}, before the failover delay",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(35),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(st.worker.as_deref(), Some("w2"));
    let log = events(&e, id).await;
    assert!(
        log.iter()
            .any(|ev| matches!(ev, Event::MoveCompleted { to, .. } if to == "w2")),
        "{log:#?}"
    );
    let ran = workers.ran.locked().clone();
    assert_eq!(ran.len(), 2);
    assert!(ran.iter().all(|(_, w)| w == "w2"), "{ran:?}");
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_worker_is_away_waits_worker_wait_then_shows_waiting_and_runs_once_back() {
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w1", true);
    let e = engine(
        workers.clone(),
        Options {
            worker_wait: Duration::from_secs(600),
            // No other worker: no failover, whatever the delay.
            failover_after: Duration::from_secs(1),
            ..Options::default()
        },
    );
    // The worker goes away while the call runs: the call is in the log, pending.
    workers.hold(true);
    let id = e.create(plan_task("w1", 1)).await.unwrap();
    until(&e, id, Duration::from_secs(5), |st| st.pending.is_some()).await;
    workers.set("w1", false);
    let gone = Instant::now();
    let st = until(&e, id, Duration::from_secs(3600), |st| {
        st.reason
            .starts_with("waiting for worker w1 to report call")
    })
    .await;
    assert!(st.pending.is_some());
    assert!(
        gone.elapsed() >= Duration::from_secs(600),
        "gave up on the worker after {:?}",
        gone.elapsed()
    );
    workers.hold(false);
    workers.set("w1", true);
    let st = until(&e, id, Duration::from_secs(60), |st| {
        st.status.is_terminal()
    })
    .await;
    assert_eq!(st.status, Status::Finished, "{st:#?}");
    assert_eq!(workers.ran.locked().len(), 1, "run once");
}

#[tokio::test(start_paused = true)]
async fn cancel_ends_a_waiting_task_and_a_move_request_is_taken_at_the_boundary() {
    let workers = Arc::new(FakeWorkers::default());
    let e = engine(workers.clone(), Options::default());
    let id = e.create(plan_task("w1", 1)).await.unwrap();
    until(&e, id, Duration::from_secs(5), |st| {
        st.status == Status::Waiting
    })
    .await;
    e.cancel(&id.to_string()).await.unwrap();
    let st = until(&e, id, Duration::from_secs(5), |st| st.status.is_terminal()).await;
    assert_eq!(st.status, Status::Cancelled);
    assert!(matches!(
        e.cancel(&id.to_string()).await,
        Err(Error::Ended(_))
    ));
    // A person's move: at the next boundary, to the worker asked for.
    workers.set("w3", true);
    let id = e.create(plan_task("w1", 1)).await.unwrap();
    until(&e, id, Duration::from_secs(5), |st| {
        st.status == Status::Waiting
    })
    .await;
    let (_, to) = e.request_move(&id.to_string(), "w3").await.unwrap();
    assert_eq!(to, "w3");
    let st = until(&e, id, Duration::from_secs(3600), |st| {
        st.status.is_terminal()
    })
    .await;
    assert_eq!(
        (st.status, st.worker.as_deref()),
        (Status::Finished, Some("w3"))
    );
}

#[tokio::test(start_paused = true)]
async fn follow_resumes_exactly_after_a_sequence_number() {
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w1", true);
    let e = engine(workers, Options::default());
    let id = e.create(plan_task("w1", 3)).await.unwrap();
    until(&e, id, Duration::from_secs(60), |st| {
        st.status.is_terminal()
    })
    .await;
    let all = events(&e, id).await.len() as u64;
    for after in [0, 3, all - 1, all] {
        let mut rx = e.follow(&id.to_string(), after, true).unwrap();
        let mut seqs = vec![];
        while let Some(item) = rx.next().await {
            if let Followed::Record(r) = item {
                seqs.push(r.seq);
            }
        }
        let want: Vec<u64> = (after + 1..=all).collect();
        assert_eq!(seqs, want, "after {after}");
    }
}

#[tokio::test(start_paused = true)]
async fn many_followers_linger_and_each_still_gets_every_record_once_in_order() {
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w1", true);
    let e = engine(workers, Options::default());
    let id = e.create(plan_task("w1", 50)).await.unwrap();
    // Enough followers that each lingers after a wake and then drains what piled up.
    let followers: Vec<_> = (0..80)
        .map(|_| e.follow(&id.to_string(), 0, true).unwrap())
        .collect();
    let mut handles = Vec::new();
    for mut f in followers {
        handles.push(tokio::spawn(async move {
            let (mut seqs, mut ended) = (vec![], false);
            while let Some(item) = f.next().await {
                match item {
                    Followed::Record(r) => seqs.push(r.seq),
                    Followed::End => ended = true,
                    _ => {}
                }
            }
            (seqs, ended)
        }));
    }
    let mut got = vec![];
    for h in handles {
        got.push(h.await.unwrap());
    }
    let all = events(&e, id).await.len() as u64;
    assert!(all > 100, "only {all} records");
    for (seqs, ended) in got {
        assert!(ended, "every follower is told the task ended");
        assert_eq!(seqs, (1..=all).collect::<Vec<_>>());
    }
}

#[tokio::test(start_paused = true)]
async fn a_follower_that_falls_behind_gets_every_record_once_from_the_log() {
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w1", true);
    let e = engine(workers, Options::default());
    // Far more records than the live queue (1,024) holds.
    let id = e.create(plan_task("w1", 700)).await.unwrap();
    let mut rx = e.follow(&id.to_string(), 0, true).unwrap();
    // Read nothing until the task is over.
    until(&e, id, Duration::from_secs(3600), |st| {
        st.status.is_terminal()
    })
    .await;
    let all = events(&e, id).await.len() as u64;
    assert!(all > 1024 + 256, "only {all} records");
    let mut seqs = vec![];
    let mut ended = false;
    while let Some(item) = rx.next().await {
        match item {
            Followed::Record(r) => seqs.push(r.seq),
            Followed::End => ended = true,
            _ => {}
        }
    }
    assert!(ended, "the follower says the task ended");
    assert_eq!(seqs, (1..=all).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_file_operation_that_keeps_failing_on_a_connected_worker_ends_with_the_error() {
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w1", true);
    workers.hold(true);
    workers.files_fail.store(true, Ordering::SeqCst);
    let e = engine(workers.clone(), Options::default());
    let id = e.create(plan_task("w1", 1)).await.unwrap();
    let task = e.store().task(id).unwrap();
    let cx = super::core::Cx {
        core: &e.inner.core,
        task: &task,
    };
    let op = FileOp::Read {
        path: "a".into(),
        offset: 0,
        length: 10,
    };
    // Before, it asked again every 100 ms for as long as the worker stayed connected.
    let got = tokio::time::timeout(
        Duration::from_secs(3600),
        super::effects::file_call(&cx, "w1", op),
    )
    .await
    .expect("a failing file operation ends");
    let err = got.unwrap_err().to_string();
    assert!(
        err.contains("did not answer") && err.contains("3 tries"),
        "{err}"
    );
    assert_eq!(workers.file_tries.load(Ordering::SeqCst), 3);
    workers.hold(false);
}

/// Two brains on one PostgreSQL log: a task is driven by the brain that holds its lease and
/// left alone by the other; when the holder's lease lapses (it froze), the other takes the
/// task over from the log and finishes it, every step once; the first, waking, writes
/// nothing more and lets the task go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_log_a_task_moves_to_another_brain_when_its_lease_lapses() {
    use crate::engine::log::postgres::{PgLog, Timing};
    let Some(pg) = testkit::postgres::start_or_skip() else {
        return;
    };
    let timing = Timing {
        lease_ttl: Duration::from_secs(3),
        patience: Duration::from_secs(30),
    };
    let log = |name: &'static str| {
        let url = pg.url();
        async move {
            let db = crate::storage::postgres::Db::open(&url, name)
                .await
                .unwrap();
            Arc::new(PgLog::open(db, timing)) as Arc<dyn crate::engine::log::EventLog>
        }
    };
    let workers = Arc::new(FakeWorkers::default());
    workers.set("w1", true);
    workers.hold(true);
    // Call ids from ranges 2^32 apart, as brains sharing a store take them.
    let a = engine_on(log("brain-a").await, workers.clone(), Options::default(), 0);
    let id = a.create(plan_task("w1", 3)).await.unwrap();
    until(&a, id, Duration::from_secs(20), |st| st.pending.is_some()).await;
    let b = engine_on(
        log("brain-b").await,
        workers.clone(),
        Options::default(),
        1 << 32,
    );
    assert_eq!(
        b.resume_all().await.unwrap(),
        (0, 0),
        "B loaded a task A holds"
    );
    assert_eq!(b.adopt().await.unwrap(), 0, "B took a task A holds");
    assert!(b.store().task(id).is_none());
    // A freezes past its lease (its clock stops; the database's does not).
    pg.psql(&format!(
        "UPDATE leases SET expires_at = now() - interval '1 second' WHERE task = {}",
        id.0
    ));
    assert_eq!(b.adopt().await.unwrap(), 1);
    // A wakes: its step's end is refused, and it lets the task go.
    workers.hold(false);
    let st = until(&b, id, Duration::from_secs(60), |st| {
        st.status.is_terminal()
    })
    .await;
    assert_eq!(st.status, Status::Finished, "{st:#?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while a.store().task(id).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "A still holds the task after its lease moved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One log, no gap, no duplicate; every step ran once.
    let seqs = pg.psql(&format!(
        "SELECT count(*) = max(seq) AND min(seq) = 1 FROM events WHERE task = {}",
        id.0
    ));
    assert_eq!(seqs, "t");
    let mut completed: Vec<u64> = events(&b, id)
        .await
        .iter()
        .filter_map(|e| match e {
            Event::ToolCallCompleted { call_id, .. } => Some(*call_id),
            _ => None,
        })
        .collect();
    let n = completed.len();
    completed.sort_unstable();
    completed.dedup();
    assert_eq!(
        completed.len(),
        n,
        "a call completed twice in the log: {}",
        pg.psql(&format!(
            "SELECT string_agg(seq || ' ' || convert_from(event, 'UTF8'), E'\\n' ORDER BY seq) FROM events WHERE task = {}",
            id.0
        ))
    );
    assert_eq!(n, 3, "three steps, each once");
}
