//! Following a task's log: its records after a sequence number, then what is appended and the
//! live output, as one stream with no gap and no repeat at the seam between history and live.
//!
//! The follower is a stream, not a task: whoever reads it (the web API's connection, the
//! admin gRPC stream) polls it, so an appended record wakes one task per watcher, and a reader
//! that wakes late finds every record that piled up meanwhile ready at once (both write what
//! is ready as one chunk). When many follow one task, each lingers a moment after a wake (as
//! long as its reader's [`Linger`] says), so records reach it in batches. A follower that
//! falls behind the task's live queue re-reads from the log instead of buffering without end.

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
    linger: Linger,
}

/// How long a follower lingers after a wake before it takes what came meanwhile: `per_watcher`
/// for each follower of its task, at most `max`, and not at all below [`MIN_LINGER`]. If a
/// wake and a write to one watcher cost its reader w of CPU, N watchers lingering N × p take
/// w / p of one core between them, however many they are (the reader knows its w).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    pub per_watcher: Duration,
    pub max: Duration,
}

impl Linger {
    /// The default (the admin stream's): 50 µs per watcher (a message to a watcher cost
    /// 10–20 µs when the `events` bench measured it: about a third of a core between them),
    /// at most 100 ms; 100 watchers linger 5 ms, 1,000 watchers 50 ms.
    pub const DEFAULT: Self = Self {
        per_watcher: Duration::from_micros(50),
        max: Duration::from_millis(100),
    };

    /// The linger after a wake with `watchers` following the task.
    fn after_wake(self, watchers: usize) -> Duration {
        let n = u32::try_from(watchers).unwrap_or(u32::MAX);
        self.per_watcher.saturating_mul(n).min(self.max)
    }
}

/// Below this, nothing lingers (a few watchers: nothing to save, no latency to add).
const MIN_LINGER: Duration = Duration::from_millis(1);

/// Follows `task` from after `after`; with `follow` false, only the history up to now.
pub(super) fn follow(
    task: Arc<Task>,
    log: Arc<dyn EventLog>,
    after: u64,
    follow: bool,
    linger: Linger,
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
        linger,
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
        let linger = self.linger.after_wake(self.task.events.receiver_count());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linger_grows_with_the_watchers_up_to_its_bound() {
        let l = Linger::DEFAULT;
        assert_eq!(l.after_wake(1), Duration::from_micros(50));
        assert_eq!(l.after_wake(100), Duration::from_millis(5));
        assert_eq!(l.after_wake(1_000), Duration::from_millis(50));
        assert_eq!(l.after_wake(100_000), Duration::from_millis(100));
        assert_eq!(l.after_wake(usize::MAX), Duration::from_millis(100));
        assert!(
            l.after_wake(19) < MIN_LINGER,
            "a few watchers do not linger"
        );
    }
}
