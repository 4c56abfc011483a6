//! Where a new connection's entry comes from and where a reclaimed one goes back: the worker's
//! cache, chunks of free entries, the shared free list, never-used entries, and the early-drop
//! victims in limbo; and the worker's pending live-count change and early-drop records.

use std::sync::atomic::Ordering;

use super::shared::Table;
use super::state::{LIFE_DYING, LIFE_FREE, LIFE_MASK, SEQ_MASK, SEQ_SHIFT};
use super::worker_cache::{Retired, CHUNK};

impl Table {
    /// Adds a worker's live-count change to the shared count once it reaches `worker_chunk` (or
    /// always, with `now`): one shared write per `worker_chunk` new connections.
    pub(super) fn flush_live(&self, c: &mut Retired, now: bool) {
        if c.pending_live != 0 && (now || c.pending_live.unsigned_abs() >= self.worker_chunk as u64)
        {
            if c.pending_live > 0 {
                self.live.fetch_add(c.pending_live as u32, Ordering::AcqRel);
            } else {
                self.live
                    .fetch_sub(c.pending_live.unsigned_abs() as u32, Ordering::AcqRel);
            }
            c.pending_live = 0;
        }
    }

    /// Adds what a worker's cache has not yet added to the live count (a worker that stops: the
    /// count is then exact at rest), and pushes its held early-drop records.
    pub fn flush_pending(&self, c: &mut Retired) {
        self.flush_live(c, true);
        self.flush_admitted(c);
    }

    /// Pushes the early-drop records a worker's cache holds (`fifo`).
    #[inline]
    pub(super) fn flush_admitted(&self, c: &mut Retired) {
        self.drop_queue.push_records(&c.admitted);
        c.admitted.clear();
    }

    /// A free entry for a worker: from its own cache, else a chunk from the table (one shared
    /// atomic per `CHUNK` entries), else the shared paths.
    pub(super) fn alloc_cached(&self, c: &mut Retired) -> Option<u32> {
        if let Some(idx) = c.free.pop() {
            return Some(idx);
        }
        if c.unused.0 < c.unused.1 {
            c.unused.0 += 1;
            return Some(c.unused.0 - 1);
        }
        if let Some(head) = self.pop_chunk() {
            // The chunk is ours: walk its links into the cache.
            let mut next = head + 1;
            while next != 0 && c.free.len() < c.free.capacity() {
                let idx = next - 1;
                next = self
                    .entries
                    .at(idx as usize)
                    .expires_or_next()
                    .load(Ordering::Relaxed);
                c.free.push(idx);
            }
            return c.free.pop();
        }
        let n = self.entries.len() as u32;
        if self.next_unused.load(Ordering::Relaxed) < n {
            let start = self
                .next_unused
                .fetch_add(self.worker_chunk, Ordering::AcqRel);
            if start < n {
                c.unused = (start + 1, start.saturating_add(self.worker_chunk).min(n));
                return Some(start);
            }
        }
        self.alloc()
    }

    /// Gives a recycled entry to a worker's cache; a full cache hands `CHUNK` of its entries
    /// back to the table as one chunk.
    pub(super) fn free_cached(&self, c: &mut Retired, idx: u32) {
        let e = self.entries.at(idx as usize);
        let seq = e.state().load(Ordering::Relaxed) & SEQ_MASK;
        e.state().store(seq | LIFE_FREE, Ordering::Release);
        if c.free.len() == c.free.capacity() {
            let mut link = 0u32;
            for _ in 0..CHUNK {
                let i = c.free.pop().expect("a full cache holds a chunk");
                self.entries
                    .at(i as usize)
                    .expires_or_next()
                    .store(link, Ordering::Relaxed);
                link = i + 1;
            }
            self.push_chunk(link - 1);
        }
        c.free.push(idx);
    }

    fn push_chunk(&self, head: u32) {
        let link = self.entries.at(head as usize).packets(0);
        let mut top = self.chunk_head.load(Ordering::Acquire);
        loop {
            link.store((top & 0xffff_ffff) as u32, Ordering::Release);
            let new = (top >> 32).wrapping_add(1) << 32 | (head as u64 + 1);
            match self.chunk_head.compare_exchange_weak(
                top,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(t) => top = t,
            }
        }
    }

    fn pop_chunk(&self) -> Option<u32> {
        let mut top = self.chunk_head.load(Ordering::Acquire);
        loop {
            let first = top & 0xffff_ffff;
            if first == 0 {
                return None;
            }
            let head = (first - 1) as u32;
            let next = self
                .entries
                .at(head as usize)
                .packets(0)
                .load(Ordering::Acquire) as u64;
            let new = (top >> 32).wrapping_add(1) << 32 | next;
            match self.chunk_head.compare_exchange_weak(
                top,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(head),
                Err(t) => top = t,
            }
        }
    }

    /// A whole chunk for a caller without a cache: its first entry, the rest back as a chunk.
    fn alloc_from_chunks(&self) -> Option<u32> {
        let head = self.pop_chunk()?;
        let rest = self
            .entries
            .at(head as usize)
            .expires_or_next()
            .load(Ordering::Relaxed);
        if rest != 0 {
            self.push_chunk(rest - 1);
        }
        Some(head)
    }

    pub(super) fn alloc(&self) -> Option<u32> {
        // Free list first, so that entries are reused while warm.
        let mut head = self.free_head.load(Ordering::Acquire);
        loop {
            let top = head & 0xffff_ffff;
            if top == 0 {
                break;
            }
            let idx = (top - 1) as u32;
            let next = self
                .entries
                .at(idx as usize)
                .expires_or_next()
                .load(Ordering::Acquire) as u64;
            let new = (head >> 32).wrapping_add(1) << 32 | next;
            match self.free_head.compare_exchange_weak(
                head,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(idx),
                Err(h) => head = h,
            }
        }
        if let Some(idx) = self.alloc_from_chunks() {
            return Some(idx);
        }
        if (self.next_unused.load(Ordering::Relaxed) as usize) < self.entries.len() {
            let idx = self.next_unused.fetch_add(1, Ordering::AcqRel);
            if (idx as usize) < self.entries.len() {
                return Some(idx);
            }
        }
        self.alloc_from_limbo()
    }

    /// The oldest early-drop victim, once no worker can still hold it.
    fn alloc_from_limbo(&self) -> Option<u32> {
        let (idx, at) = self.limbo.pop()?;
        if !self.grace.is_safe(at)
            && !{
                self.grace.try_advance();
                self.grace.is_safe(at)
            }
        {
            // Still reachable by some worker's batch: back in the queue (the oldest is not
            // safe, so no other is either).
            if self.limbo.push((idx, at)).is_err() {
                self.fall_back_to_scan(idx);
            }
            return None;
        }
        Some(self.recycle(idx))
    }

    /// Bumps the sequence so a reader holding the old index sees a change; returns `idx`.
    pub(super) fn recycle(&self, idx: u32) -> u32 {
        let e = self.entries.at(idx as usize);
        let st = e.state().load(Ordering::Relaxed);
        let seq = ((st >> SEQ_SHIFT).wrapping_add(2) & 0xfe) << SEQ_SHIFT;
        e.state().store(seq | (st & !SEQ_MASK), Ordering::Release);
        idx
    }

    /// A retired entry that found no room in the limbo queue: marked dying again, so that the
    /// expiry scan retires it (unindexing twice is harmless: its slots are already tombstones).
    pub(super) fn fall_back_to_scan(&self, idx: u32) {
        let e = self.entries.at(idx as usize);
        let cur = e.state().load(Ordering::Acquire);
        e.state()
            .store((cur & !LIFE_MASK) | LIFE_DYING, Ordering::Release);
    }
}
