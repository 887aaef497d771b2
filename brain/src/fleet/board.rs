//! The fleet as placement sees it, in memory: the connected workers with what they last
//! reported, the tasks placed on each, the moves under way into each, the queue of tasks
//! waiting for room, and which workers dropped lately. The hub keeps the members (a session
//! registered, a pulse, a session ended); the engine says where each task is
//! ([`Board::occupy`]). Choosing a worker reads only this, never the store.
//!
//! The choice itself is [`choose`] (in `choice`), a pure function over [`Slot`]s.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared::locks::Lock;
use tokio::sync::oneshot;

use super::choice::Labels;
pub use super::choice::{NoRoom, Slot, Want, choose};

/// Placement's settings (`[placement]`).
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// A cap on every worker's capacity (0: each worker's own).
    pub max_tasks_per_worker: u32,
    /// Moves into one worker under way at once (failover or a person's move).
    pub moves_per_worker: u32,
    /// A worker whose session ended this many times within `flap_window` is held: no new
    /// tasks until it has been connected for `steady_after`.
    pub flap_drops: usize,
    pub flap_window: Duration,
    pub steady_after: Duration,
    /// After a task fails over, its next failover waits at least this long (doubling with
    /// each failover, to `backoff_max`).
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// A member whose pulses are this late is shown `slow` (never lost for it).
    pub slow_after: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_tasks_per_worker: 0,
            moves_per_worker: 4,
            flap_drops: 3,
            flap_window: Duration::from_secs(300),
            steady_after: Duration::from_secs(60),
            backoff: Duration::from_secs(60),
            backoff_max: Duration::from_secs(600),
            slow_after: Duration::from_secs(10),
        }
    }
}

/// The capacity of a worker that does not say (one from before capacities): two tasks per CPU.
pub fn default_capacity(cpus: u32) -> u32 {
    cpus.max(1) * 2
}

/// A connected worker, as its hello and pulses describe it.
#[derive(Debug, Clone)]
pub struct Member {
    pub id: Arc<str>,
    pub name: String,
    pub labels: Arc<Labels>,
    pub sandbox: Arc<Vec<String>>,
    /// Tasks it takes at once, by its own account.
    pub max_tasks: u32,
    /// Its last pulse's load, if it sent one.
    pub load: Option<proto::Load>,
    pub session_no: u64,
    pub since: Instant,
    pub last_pulse: Option<Instant>,
    /// The pulse interval the brain asked for, to tell a slow member.
    pub pulse_every: Duration,
}

pub use crate::model::ops::Occupancy;

/// A task waiting in the queue for room.
struct Waiter {
    task: u64,
    want: Want,
    tx: oneshot::Sender<String>,
}

#[derive(Default)]
struct State {
    members: HashMap<String, Member>,
    /// Where each placed task is (tasks that have not ended or stopped).
    tasks: HashMap<u64, Occupancy>,
    running: HashMap<String, u32>,
    moving_in: HashMap<String, u32>,
    /// When each worker's sessions ended lately.
    drops: HashMap<String, VecDeque<Instant>>,
    /// When each task last failed over, and how many times it has.
    failovers: HashMap<u64, (Instant, u32)>,
    queue: VecDeque<Waiter>,
    /// The most tasks placed on each worker at once.
    peak: HashMap<String, u32>,
}

/// Most recent drops remembered per worker.
const DROPS_KEPT: usize = 16;

/// The in-memory board. Cheap to clone.
#[derive(Clone)]
pub struct Board {
    state: Arc<Mutex<State>>,
    opts: Options,
}

impl Board {
    pub fn new(opts: Options) -> Self {
        Self {
            state: Arc::default(),
            opts,
        }
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// A worker's session registered (replacing any older one of it).
    pub fn join(&self, m: Member) {
        let mut st = self.state.locked();
        st.members.insert(m.id.to_string(), m);
        self.drain(&mut st);
    }

    /// A worker's session `session_no` ended (an older session's end is ignored).
    pub fn leave(&self, worker: &str, session_no: u64) {
        let mut st = self.state.locked();
        if st
            .members
            .get(worker)
            .is_some_and(|m| m.session_no == session_no)
        {
            st.members.remove(worker);
            let drops = st.drops.entry(worker.to_string()).or_default();
            drops.push_back(Instant::now());
            while drops.len() > DROPS_KEPT {
                drops.pop_front();
            }
        }
    }

    /// A pulse from a member: its load now.
    pub fn pulse(&self, worker: &str, load: proto::Load) {
        let mut st = self.state.locked();
        let Some(m) = st.members.get_mut(worker) else {
            return;
        };
        if load.max_tasks > 0 {
            m.max_tasks = load.max_tasks;
        }
        m.load = Some(load);
        m.last_pulse = Some(Instant::now());
        if !st.queue.is_empty() {
            self.drain(&mut st);
        }
    }

    /// Records where `task` is now (`None`: it ended or stopped and holds no room).
    /// Idempotent; room freed goes to the queue at once.
    pub fn occupy(&self, task: u64, now: Option<Occupancy>) {
        let mut st = self.state.locked();
        let before = st.tasks.get(&task).cloned();
        if before == now {
            return;
        }
        let mut freed = false;
        if let Some(b) = &before {
            dec(&mut st.running, &b.worker);
            if b.moving {
                dec(&mut st.moving_in, &b.worker);
            }
            freed = true;
        }
        match now {
            Some(n) => {
                let r = st.running.entry(n.worker.clone()).or_default();
                *r += 1;
                let r = *r;
                let peak = st.peak.entry(n.worker.clone()).or_default();
                *peak = (*peak).max(r);
                if n.moving {
                    *st.moving_in.entry(n.worker.clone()).or_default() += 1;
                }
                st.tasks.insert(task, n);
            }
            None => {
                st.tasks.remove(&task);
                st.failovers.remove(&task);
            }
        }
        if freed && !st.queue.is_empty() {
            self.drain(&mut st);
        }
    }

    /// The slots of every member now.
    fn slots(&self, st: &State) -> Vec<Slot> {
        let now = Instant::now();
        st.members
            .values()
            .map(|m| Slot {
                id: m.id.clone(),
                labels: m.labels.clone(),
                sandbox: m.sandbox.clone(),
                capacity: self.capacity(m),
                running: st.running.get(&*m.id).copied().unwrap_or(0),
                moving_in: st.moving_in.get(&*m.id).copied().unwrap_or(0),
                memory_free: m
                    .load
                    .as_ref()
                    .map(|l| l.memory_free_bytes)
                    .filter(|b| *b > 0),
                cpu_busy_permille: m.load.as_ref().map_or(0, |l| l.cpu_busy_permille),
                held: self.held(st, m, now),
            })
            .collect()
    }

    fn capacity(&self, m: &Member) -> u32 {
        let own = m.max_tasks.max(1);
        match self.opts.max_tasks_per_worker {
            0 => own,
            cap => own.min(cap),
        }
    }

    /// Whether a member dropped `flap_drops` times within the window and has not been
    /// connected for `steady_after` since.
    fn held(&self, st: &State, m: &Member, now: Instant) -> bool {
        if now.duration_since(m.since) >= self.opts.steady_after {
            return false;
        }
        let recent = st.drops.get(&*m.id).map_or(0, |d| {
            d.iter()
                .filter(|t| now.duration_since(**t) <= self.opts.flap_window)
                .count()
        });
        recent >= self.opts.flap_drops.max(1)
    }

    /// Chooses a worker for `task` and reserves its room, or says why none has room.
    pub fn place(&self, task: u64, want: &Want) -> Result<String, NoRoom> {
        let mut st = self.state.locked();
        self.place_locked(&mut st, task, want)
    }

    fn place_locked(&self, st: &mut State, task: u64, want: &Want) -> Result<String, NoRoom> {
        let started = Instant::now();
        let slots = self.slots(st);
        let picked = choose(&slots, want, &mut rand::rng()).map(|i| slots[i].id.to_string());
        tracing::debug!(
            target: "tether::placement",
            micros = started.elapsed().as_micros() as u64,
            workers = slots.len(),
            ok = picked.is_ok(),
            "placement decision"
        );
        drop(slots);
        let worker = picked?;
        // Reserve: the task counts on its worker from now on.
        let occ = Occupancy {
            worker: worker.clone(),
            moving: want.moving,
        };
        let before = st.tasks.get(&task).cloned();
        if let Some(b) = before {
            dec(&mut st.running, &b.worker);
            if b.moving {
                dec(&mut st.moving_in, &b.worker);
            }
        }
        let r = st.running.entry(worker.clone()).or_default();
        *r += 1;
        let r = *r;
        let peak = st.peak.entry(worker.clone()).or_default();
        *peak = (*peak).max(r);
        if want.moving {
            *st.moving_in.entry(worker.clone()).or_default() += 1;
        }
        st.tasks.insert(task, occ);
        Ok(worker)
    }

    /// Waits in the queue, in order, for room for `task`; resolves with the worker whose
    /// room was reserved for it. Dropping the receiver leaves the queue.
    pub fn enqueue(&self, task: u64, want: Want) -> oneshot::Receiver<String> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.locked();
        st.queue.push_back(Waiter { task, want, tx });
        self.drain(&mut st);
        rx
    }

    /// Places waiters in order while there is room. A waiter that fits nowhere stays, and
    /// so do later ones that want the same (nothing changed for them either).
    fn drain(&self, st: &mut State) {
        let mut stuck: Vec<Want> = vec![];
        let mut i = 0;
        while i < st.queue.len() {
            if st.queue[i].tx.is_closed() {
                st.queue.remove(i);
                continue;
            }
            let want = &st.queue[i].want;
            if stuck.iter().any(|w| same_want(w, want)) {
                i += 1;
                continue;
            }
            let (task, want) = (st.queue[i].task, st.queue[i].want.clone());
            match self.place_locked(st, task, &want) {
                Ok(worker) => {
                    let w = st.queue.remove(i).expect("index in range");
                    if let Err(worker) = w.tx.send(worker) {
                        // Gone meanwhile: give the room back.
                        let _ = worker;
                        self.release_locked(st, task);
                    }
                }
                Err(_) => {
                    stuck.push(want);
                    i += 1;
                }
            }
        }
    }

    fn release_locked(&self, st: &mut State, task: u64) {
        if let Some(b) = st.tasks.remove(&task) {
            dec(&mut st.running, &b.worker);
            if b.moving {
                dec(&mut st.moving_in, &b.worker);
            }
        }
    }

    /// Tasks waiting in the queue.
    pub fn queued(&self) -> usize {
        self.state.locked().queue.len()
    }

    /// Why `want` cannot be placed now (for the queued task's reason), or `None` if it can.
    pub fn why_not(&self, want: &Want) -> Option<NoRoom> {
        let st = self.state.locked();
        let slots = self.slots(&st);
        choose(&slots, want, &mut rand::rng()).err()
    }

    /// A worker other than `lost` for a task whose worker is gone, through the same choice
    /// with the per-target bound on moves, unless the task failed over too recently.
    pub fn failover(&self, task: u64, lost: &str, want: &Want) -> Option<String> {
        let mut st = self.state.locked();
        let now = Instant::now();
        if let Some((at, n)) = st.failovers.get(&task) {
            let wait = self
                .opts
                .backoff
                .saturating_mul(1 << (*n - 1).min(16))
                .min(self.opts.backoff_max);
            if now.duration_since(*at) < wait {
                return None;
            }
        }
        let mut want = want.clone();
        want.exclude = Some(lost.to_string());
        want.moving = true;
        want.moves_per_worker = self.opts.moves_per_worker;
        let to = self.place_locked(&mut st, task, &want).ok()?;
        let n = st.failovers.get(&task).map_or(0, |(_, n)| *n);
        st.failovers.insert(task, (now, n + 1));
        Some(to)
    }

    /// A member's view for `brain workers`: tasks running, capacity, link.
    pub fn view(&self, worker: &str) -> Option<MemberView> {
        let st = self.state.locked();
        let m = st.members.get(worker)?;
        let now = Instant::now();
        let link = if self.held(&st, m, now) {
            "held"
        } else if m
            .last_pulse
            .is_some_and(|t| now.duration_since(t) > self.opts.slow_after.max(m.pulse_every * 2))
        {
            "slow"
        } else {
            "steady"
        };
        Some(MemberView {
            running: st.running.get(worker).copied().unwrap_or(0),
            capacity: self.capacity(m),
            link,
            load: m.load,
        })
    }

    /// Tasks placed on `worker` that have not ended (connected or not).
    pub fn running_on(&self, worker: &str) -> u32 {
        self.state
            .locked()
            .running
            .get(worker)
            .copied()
            .unwrap_or(0)
    }

    /// The most tasks placed on `worker` at once since the brain started.
    pub fn peak(&self, worker: &str) -> u32 {
        self.state.locked().peak.get(worker).copied().unwrap_or(0)
    }

    /// Whether any member satisfies `f`.
    pub fn any_member(&self, f: impl Fn(&Member) -> bool) -> bool {
        self.state.locked().members.values().any(f)
    }

    /// Whether `worker` is a member (its session is up).
    pub fn is_member(&self, worker: &str) -> bool {
        self.state.locked().members.contains_key(worker)
    }
}

/// What `brain workers` shows of a member.
#[derive(Debug, Clone)]
pub struct MemberView {
    pub running: u32,
    pub capacity: u32,
    pub link: &'static str,
    pub load: Option<proto::Load>,
}

fn dec(map: &mut HashMap<String, u32>, key: &str) {
    if let Some(v) = map.get_mut(key) {
        *v = v.saturating_sub(1);
        if *v == 0 {
            map.remove(key);
        }
    }
}

fn same_want(a: &Want, b: &Want) -> bool {
    a.labels == b.labels
        && a.memory_bytes == b.memory_bytes
        && a.exclude == b.exclude
        && a.moving == b.moving
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn member(id: &str, max_tasks: u32) -> Member {
        Member {
            id: Arc::from(id),
            name: id.into(),
            labels: Arc::default(),
            sandbox: Arc::default(),
            max_tasks,
            load: None,
            session_no: 1,
            since: Instant::now(),
            last_pulse: None,
            pulse_every: Duration::from_secs(5),
        }
    }

    #[test]
    fn placement_spreads_and_never_exceeds_capacity() {
        let b = Board::new(Options::default());
        for i in 0..10 {
            b.join(member(&format!("w{i}"), 3));
        }
        for t in 0..30 {
            b.place(t, &Want::default()).unwrap();
        }
        for i in 0..10 {
            assert_eq!(b.running_on(&format!("w{i}")), 3);
        }
        let no = b.place(30, &Want::default()).unwrap_err();
        assert_eq!(
            no.to_string(),
            "no worker with room: 10 workers, all at capacity"
        );
        assert!(no.transient());
    }

    #[test]
    fn the_queue_is_served_in_order_as_room_appears() {
        let b = Board::new(Options {
            max_tasks_per_worker: 1,
            ..Default::default()
        });
        b.join(member("w", 8));
        b.place(1, &Want::default()).unwrap();
        let mut second = b.enqueue(2, Want::default());
        let mut third = b.enqueue(3, Want::default());
        assert!(second.try_recv().is_err() && third.try_recv().is_err());
        assert_eq!(b.queued(), 2);
        // Task 1 ends: task 2, not 3, gets its room.
        b.occupy(1, None);
        assert_eq!(second.try_recv().unwrap(), "w");
        assert!(third.try_recv().is_err());
        b.occupy(2, None);
        assert_eq!(third.try_recv().unwrap(), "w");
        assert_eq!(b.queued(), 0);
    }

    #[test]
    fn a_waiter_that_left_gives_its_turn_and_room_to_the_next() {
        let b = Board::new(Options {
            max_tasks_per_worker: 1,
            ..Default::default()
        });
        b.join(member("w", 1));
        b.place(1, &Want::default()).unwrap();
        let gone = b.enqueue(2, Want::default());
        let mut next = b.enqueue(3, Want::default());
        drop(gone);
        b.occupy(1, None);
        assert_eq!(next.try_recv().unwrap(), "w");
        assert_eq!(b.running_on("w"), 1);
    }

    #[test]
    fn a_task_with_other_labels_is_not_held_up_by_the_head_of_the_queue() {
        let b = Board::new(Options::default());
        let mut gpu = member("g", 1);
        gpu.labels = Arc::new(labels(&[("gpu", "yes")]));
        b.join(gpu);
        let mut head = b.enqueue(
            1,
            Want {
                labels: labels(&[("arch", "arm")]),
                ..Default::default()
            },
        );
        let mut next = b.enqueue(
            2,
            Want {
                labels: labels(&[("gpu", "yes")]),
                ..Default::default()
            },
        );
        assert!(head.try_recv().is_err());
        assert_eq!(next.try_recv().unwrap(), "g");
    }

    #[test]
    fn a_member_joining_serves_the_queue() {
        let b = Board::new(Options::default());
        let mut rx = b.enqueue(1, Want::default());
        assert!(rx.try_recv().is_err());
        b.join(member("w", 2));
        assert_eq!(rx.try_recv().unwrap(), "w");
    }

    #[test]
    fn failover_spreads_bounds_moves_and_backs_off() {
        let b = Board::new(Options {
            moves_per_worker: 2,
            backoff: Duration::from_secs(3600),
            ..Default::default()
        });
        for id in ["a", "b", "c"] {
            b.join(member(id, 10));
        }
        // Ten tasks on the lost worker: two moves into each of a, b and c, then none.
        let mut to: HashMap<String, u32> = HashMap::new();
        let mut refused = 0;
        for t in 0..10 {
            b.occupy(
                t,
                Some(Occupancy {
                    worker: "lost".into(),
                    moving: false,
                }),
            );
            match b.failover(t, "lost", &Want::default()) {
                Some(w) => *to.entry(w).or_default() += 1,
                None => refused += 1,
            }
        }
        assert_eq!(to.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);
        assert_eq!(refused, 4);
        // A move done frees its slot; the task that moved does not move again at once.
        b.occupy(
            0,
            Some(Occupancy {
                worker: "a".into(),
                moving: false,
            }),
        );
        assert_eq!(b.failover(0, "a", &Want::default()), None, "backed off");
        assert!(b.failover(7, "lost", &Want::default()).is_some());
    }

    #[test]
    fn a_flapping_worker_is_held_until_steady() {
        let b = Board::new(Options {
            flap_drops: 3,
            steady_after: Duration::from_millis(200),
            ..Default::default()
        });
        for n in 0..3 {
            let mut m = member("f", 4);
            m.session_no = n;
            b.join(m);
            b.leave("f", n);
        }
        let mut m = member("f", 4);
        m.session_no = 9;
        b.join(m);
        let no = b.place(1, &Want::default()).unwrap_err();
        assert_eq!(no.held, 1);
        assert_eq!(b.view("f").unwrap().link, "held");
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(b.place(1, &Want::default()).unwrap(), "f");
    }

    #[test]
    fn an_old_sessions_end_does_not_remove_the_new_one() {
        let b = Board::new(Options::default());
        let mut m = member("w", 1);
        m.session_no = 2;
        b.join(m);
        b.leave("w", 1);
        assert!(b.is_member("w"));
        b.leave("w", 2);
        assert!(!b.is_member("w"));
    }
}
