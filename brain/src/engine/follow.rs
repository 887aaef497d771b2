//! Following a task's log: its records after a sequence number, then what is appended and the
//! live output, as one stream with no gap and no repeat at the seam between history and live.
//!
//! The follower is a stream, not a task: whoever reads it (the web API's connection, the
//! admin gRPC stream) polls it, so an appended record wakes one task per watcher, and a reader
//! that wakes late finds every record that piled up meanwhile ready at once (both write what
//! is ready as one chunk). When many follow one task, each lingers a moment after a wake, so
//! records reach it in batches. A follower that falls behind the task's live queue re-reads
//! from the log instead of buffering without end.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio_util::sync::CancellationToken;

use super::log::EventLog;
use super::store::{LiveOutput, Shown, Task};
use crate::model::event::Event;

/// One item of a task's followed log.
#[derive(Debug, Clone)]
pub enum Followed {
    Record(Arc<Shown>),
    /// Not logged; a slow follower may miss some.
    Live(LiveOutput),
    /// A record that cannot be decoded (its key and why).
    Broken(String),
    /// The task has ended and every record has been sent: the last item.
    End,
}

/// A task's followed log. Ends after [`Followed::End`], after the history when not following,
/// when the log cannot be read, or when the engine shuts down; after its end it answers
/// `None` again.
pub type Follower = Pin<Box<dyn Stream<Item = Followed> + Send>>;

/// Where a follower is.
enum Phase {
    /// Read the log after `last` (first, and again after falling behind).
    History,
    /// Take what is appended.
    Live,
    /// Nothing more.
    Done,
}

struct State {
    task: Arc<Task>,
    log: Arc<dyn EventLog>,
    /// Subscribed before the history is read, so nothing falls between the two.
    records: broadcast::Receiver<Arc<Shown>>,
    output: broadcast::Receiver<LiveOutput>,
    shutdown: CancellationToken,
    /// The last sequence number handed out.
    last: u64,
    ended: bool,
    follow: bool,
    phase: Phase,
    /// Read from the log, not yet handed out.
    ready: VecDeque<Followed>,
    /// After a linger: take what is queued without waiting, until nothing is.
    draining: bool,
}

/// A watcher lingers this long per watcher of its task after a wake before it takes what
/// came meanwhile: a wake and a write to a watcher cost 10–20 µs of CPU (measured by the
/// `events` bench), so N watchers lingering N × 50 µs take at most about a third of one core
/// between them, however many they are; 100 watchers linger 5 ms, 1,000 watchers 50 ms.
const LINGER_PER_WATCHER: Duration = Duration::from_micros(50);
/// Below this, nothing lingers (a few watchers: nothing to save, no latency to add).
const MIN_LINGER: Duration = Duration::from_millis(1);
/// Nothing lingers longer than this.
const MAX_LINGER: Duration = Duration::from_millis(100);

/// Follows `task` from after `after`; with `follow` false, only the history up to now.
pub(super) fn follow(
    task: Arc<Task>,
    log: Arc<dyn EventLog>,
    after: u64,
    follow: bool,
    shutdown: CancellationToken,
) -> Follower {
    let state = State {
        records: task.events.subscribe(),
        output: task.live.subscribe(),
        ended: task.state().status.is_terminal(),
        task,
        log,
        shutdown,
        last: after,
        follow,
        phase: Phase::History,
        ready: VecDeque::new(),
        draining: false,
    };
    // Fused: polling it again after its end answers the end again.
    let items = futures_util::stream::unfold(state, |mut s| async move {
        let item = s.next().await?;
        Some((item, s))
    })
    .fuse();
    Box::pin(items)
}

impl State {
    async fn next(&mut self) -> Option<Followed> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            match self.phase {
                Phase::Done => return None,
                Phase::History => self.read_history().await,
                Phase::Live => {
                    if let Some(item) = self.live().await {
                        return Some(item);
                    }
                }
            }
        }
    }

    /// Queues the log's records after `last`, then says where to go next.
    async fn read_history(&mut self) {
        let records = match self.log.read(self.task.id, self.last).await {
            Ok(r) => r,
            Err(e) => {
                self.ready.push_back(Followed::Broken(e.to_string()));
                self.phase = Phase::Done;
                return;
            }
        };
        for r in records {
            self.ready.push_back(match r {
                Ok(r) => {
                    self.last = r.seq;
                    self.ended |= matches!(r.event, Event::Finished { .. });
                    Followed::Record(Shown::new(r))
                }
                Err(e) => Followed::Broken(e.to_string()),
            });
        }
        self.phase = if self.ended {
            self.ready.push_back(Followed::End);
            Phase::Done
        } else if self.follow {
            Phase::Live
        } else {
            Phase::Done
        };
    }

    /// The next appended record or live output; `None` when the phase changed instead.
    async fn live(&mut self) -> Option<Followed> {
        if self.draining {
            match self.take_ready() {
                Some(item) => return item,
                None => self.draining = false,
            }
        }
        let item = tokio::select! {
            // Records first: live output of a call is never worth delaying its result for.
            biased;
            _ = self.shutdown.cancelled() => {
                self.phase = Phase::Done;
                return None;
            }
            r = self.records.recv() => self.record(r),
            o = self.output.recv() => self.output(o),
        };
        // With many watchers, each lingers a moment after a wake, and then takes what came
        // meanwhile without waiting: one wake (and one write) per watcher per batch, not per
        // record, keeps what watching costs bounded however many watch.
        let linger =
            (LINGER_PER_WATCHER * self.task.events.receiver_count() as u32).min(MAX_LINGER);
        if linger >= MIN_LINGER && item.is_some() && matches!(self.phase, Phase::Live) {
            tokio::select! {
                _ = self.shutdown.cancelled() => {}
                _ = tokio::time::sleep(linger) => {}
            }
            self.draining = true;
        }
        item
    }

    /// What is queued already, without waiting: `None` when nothing is.
    fn take_ready(&mut self) -> Option<Option<Followed>> {
        match self.records.try_recv() {
            Ok(r) => return Some(self.record(Ok(r))),
            Err(TryRecvError::Lagged(n)) => return Some(self.record(Err(RecvError::Lagged(n)))),
            Err(TryRecvError::Closed) => return Some(self.record(Err(RecvError::Closed))),
            Err(TryRecvError::Empty) => {}
        }
        match self.output.try_recv() {
            Ok(o) => Some(self.output(Ok(o))),
            Err(TryRecvError::Lagged(n)) => Some(self.output(Err(RecvError::Lagged(n)))),
            Err(TryRecvError::Closed) => Some(self.output(Err(RecvError::Closed))),
            Err(TryRecvError::Empty) => None,
        }
    }

    fn record(&mut self, r: Result<Arc<Shown>, RecvError>) -> Option<Followed> {
        match r {
            Ok(r) if r.seq <= self.last => None,
            Ok(r) => {
                self.last = r.seq;
                if matches!(r.event, Event::Finished { .. }) {
                    self.ready.push_back(Followed::End);
                    self.phase = Phase::Done;
                }
                Some(Followed::Record(r))
            }
            // Fell behind: re-read from the log.
            Err(RecvError::Lagged(_)) => {
                self.phase = Phase::History;
                self.draining = false;
                None
            }
            Err(RecvError::Closed) => {
                self.phase = Phase::Done;
                None
            }
        }
    }

    fn output(&mut self, o: Result<LiveOutput, RecvError>) -> Option<Followed> {
        match o {
            Ok(o) => Some(Followed::Live(o)),
            // Live output a slow follower missed is not recovered: it is not durable.
            Err(RecvError::Lagged(_)) => None,
            Err(RecvError::Closed) => {
                self.phase = Phase::Done;
                None
            }
        }
    }
}
