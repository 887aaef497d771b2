//! Call ids: one counter for every call this brain makes to workers (durable task calls and
//! ad-hoc ones share it, so ids never collide on a worker). Workers remember durable call ids
//! across restarts, so ids must not repeat across brain restarts either: they start from the
//! clock (milliseconds since the epoch shifted left 16 bits), or well above the last run's
//! start if the clock went back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counter. Cheap to clone; clones share it.
#[derive(Debug, Clone)]
pub struct CallIds {
    next: Arc<AtomicU64>,
    start: u64,
}

impl CallIds {
    /// Ids from `max(now_ms << 16, floor + 2^32)`; `floor` is the last run's start (stored).
    pub fn starting_above(floor: u64, now_ms: i64) -> Self {
        let clock = (now_ms.max(1) as u64) << 16;
        let start = clock.max(floor.saturating_add(1 << 32));
        Self {
            next: Arc::new(AtomicU64::new(start)),
            start,
        }
    }

    /// Where this run's ids start: store it, it is the next run's floor.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// An id never handed out before.
    pub fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_count_up_and_start_above_the_last_run_even_if_the_clock_went_back() {
        let now = 1_764_000_000_000;
        let a = CallIds::starting_above(0, now);
        assert_eq!(a.start(), (now as u64) << 16);
        assert_eq!((a.next(), a.next()), (a.start(), a.start() + 1));
        let b = CallIds::starting_above(a.start(), 10);
        assert!(b.start() > a.start() + (1 << 31));
    }
}
