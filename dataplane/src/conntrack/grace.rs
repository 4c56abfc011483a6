//! Grace periods for the conntrack table (a minimal epoch scheme).
//!
//! A worker may hold on to an entry it found for the rest of its batch. Removed entries and index
//! tombstones are therefore recycled only after every worker has left the batch it was in when
//! they were removed. Each worker announces the global epoch while it is inside a batch and
//! `QUIESCENT` between batches; the epoch advances once every busy worker has seen the current
//! one, so anything retired at epoch `e` is unreachable once the global epoch reaches `e + 2`.
//!
//! Written by hand rather than with crossbeam-epoch because the things retired here are slot
//! indexes in preallocated arrays, not heap objects: no closure, allocation or unsafe is needed.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam::utils::CachePadded;

pub const QUIESCENT: u64 = u64::MAX;

pub struct Grace {
    global: CachePadded<AtomicU64>,
    announced: Box<[CachePadded<AtomicU64>]>,
}

impl Grace {
    /// `participants`: how many workers may hold entries (each gets an index below it).
    pub fn new(participants: usize) -> Grace {
        Grace {
            global: CachePadded::new(AtomicU64::new(2)),
            announced: (0..participants.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(QUIESCENT)))
                .collect(),
        }
    }

    pub fn participants(&self) -> usize {
        self.announced.len()
    }

    #[inline]
    pub fn epoch(&self) -> u64 {
        self.global.load(Ordering::Acquire)
    }

    /// A worker enters a batch: nothing retired from now on is recycled before it leaves.
    #[inline]
    pub fn enter(&self, worker: usize) {
        let slot = &self.announced[worker % self.announced.len()];
        slot.store(self.global.load(Ordering::Relaxed), Ordering::SeqCst);
    }

    /// A worker leaves its batch and holds no entry any more.
    #[inline]
    pub fn leave(&self, worker: usize) {
        self.announced[worker % self.announced.len()].store(QUIESCENT, Ordering::Release);
    }

    /// Advances the global epoch when every busy worker has seen it; returns the current epoch.
    pub fn try_advance(&self) -> u64 {
        let g = self.global.load(Ordering::SeqCst);
        let all_seen = self.announced.iter().all(|a| {
            let v = a.load(Ordering::SeqCst);
            v == QUIESCENT || v == g
        });
        if all_seen {
            let _ = self
                .global
                .compare_exchange(g, g + 1, Ordering::SeqCst, Ordering::SeqCst);
        }
        self.global.load(Ordering::Acquire)
    }

    /// Whether something retired at `retired_at` can no longer be reached.
    #[inline]
    pub fn is_safe(&self, retired_at: u64) -> bool {
        self.epoch() >= retired_at + 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_worker_holds_the_epoch() {
        let g = Grace::new(2);
        let start = g.epoch();
        g.enter(0);
        g.try_advance(); // worker 0 saw `start`: advances once
        assert_eq!(g.epoch(), start + 1);
        g.try_advance(); // worker 0 still announces `start`: stuck
        assert_eq!(g.epoch(), start + 1);
        assert!(!g.is_safe(start));
        g.leave(0);
        g.try_advance();
        assert!(g.is_safe(start));
    }
}
