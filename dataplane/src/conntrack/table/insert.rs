//! Adding a connection: room in the live count (early drop when full), an entry from the
//! allocator, its words written under an odd sequence number, then its index slots.

use std::sync::atomic::Ordering;

use super::super::tuple::Packed;
use super::clock32::Clock32;
use super::entry::Stash;
use super::lookup::{Found, MAX_PROBE};
use super::shared::Table;
use super::slot::{SLOT_EMPTY, TOMB_BIT};
use super::state::{
    DIR_ORIG, DIR_REPLY, FLAG_ASSURED, FLAG_SINGLE_KEY, LIFE_FREE, LIFE_LIVE, LIFE_MASK, SEQ_MASK,
    SEQ_SHIFT,
};
use super::worker_cache::{Retired, CHUNK};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertError {
    /// No free entry even after early drop.
    Full,
    /// A live entry already holds one of the tuples (a colliding SNAT choice).
    Exists,
}

impl Table {
    /// `lookup` for an insert: `Err(())` when a live entry holds `key`, else where `key`'s index
    /// slot may go — the first empty or tombstone slot of its probe (None past `MAX_PROBE`), so
    /// that `index_from` does not walk the same probe again. The slot may be taken meanwhile:
    /// `index_from` then goes on along the probe, as from its start.
    #[inline(always)]
    fn vacancy(&self, key: &Packed, hash: u64, now_ms: u64) -> Result<Option<usize>, ()> {
        let tag = self.code.tag(hash);
        let mut i = self.home(hash);
        let mut free = None;
        for _ in 0..MAX_PROBE {
            let s = self.slots[i].load(Ordering::Acquire);
            if s == SLOT_EMPTY {
                return Ok(Some(free.unwrap_or(i)));
            }
            if s & TOMB_BIT != 0 {
                free = free.or(Some(i));
            } else {
                let (stag, idx, dir) = self.code.decode(s);
                let mut found = Found::default();
                if stag == tag && self.read_if_match(idx, dir, key, &mut found) {
                    if !found.expired(now_ms) {
                        return Err(());
                    }
                    // An expired connection holds its tuple no longer (the kernel's
                    // `nf_conntrack_tuple_taken` reaps it too); the scan, which may not reach
                    // it for a minute, retires it.
                    self.kill(idx);
                }
            }
            i = self.next_slot(i);
        }
        Ok(free)
    }

    /// Prefetches the entries the next `n` allocations from `c` return (`alloc_cached`: its
    /// free entries, last first, then its never-used ones); beyond those, a hint cannot know.
    #[inline]
    pub fn prefetch_allocations(&self, c: &Retired, n: usize) {
        let from_free = n.min(c.free.len());
        for &idx in c.free[c.free.len() - from_free..].iter() {
            if let Some(e) = self.entries.get(idx as usize) {
                e.prefetch(false);
            }
        }
        let from_unused = (n - from_free).min(c.unused.1.saturating_sub(c.unused.0) as usize);
        for idx in c.unused.0..c.unused.0 + from_unused as u32 {
            if let Some(e) = self.entries.get(idx as usize) {
                e.prefetch(false);
            }
        }
    }

    /// Inserts a connection (its tuples packed); returns its entry index. `reply` is not indexed
    /// when `flags` carries `FLAG_SINGLE_KEY`. `orig_counts`: the original direction's packet
    /// count and bytes word to start from (the first packet's, written with the tuples rather
    /// than counted after: one store each instead of a load and a store after the publication).
    /// `early_drop` picks where to look for an unassured victim when full. `hashes`: the packed
    /// tuples' hashes (`hash`) when the caller has them. Always inlined (into `create_in`'s
    /// callers and `affinity_set`): as a call, its ten arguments and saved registers were about
    /// 30 instructions per new connection.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn insert(
        &self,
        po: &Packed,
        pr: &Packed,
        flags_and_state: u32,
        service_id: u32,
        now_ms: u64,
        expires_ms: u64,
        orig_counts: (u32, u64),
        early_drop_hint: u64,
        mut cache: Option<&mut Retired>,
        hashes: Option<(u64, u64)>,
    ) -> Result<u32, InsertError> {
        let single = flags_and_state & FLAG_SINGLE_KEY != 0;
        let (ho, hr) = match hashes {
            Some(h) => h,
            None => (self.hash(po), if single { 0 } else { self.hash(pr) }),
        };
        debug_assert_eq!(ho, self.hash(po));
        debug_assert!(single || hr == self.hash(pr));
        self.note_clock(now_ms);
        let reply_slot = if single {
            None
        } else {
            self.vacancy(pr, hr, now_ms)
                .map_err(|()| InsertError::Exists)?
        };
        // Room: a worker with a cache reads the shared live count (plus what it has not added
        // yet) and counts locally while the table is far from full; near the maximum, and for
        // callers without a cache, a place is taken in the shared count. A full table
        // early-drops a victim whose place the new connection takes over (the count stays).
        let mut far_from_full = false;
        let counted = match cache.as_deref_mut() {
            Some(c)
                if (self.live.load(Ordering::Relaxed) as i64 + c.pending_live)
                    < self.cached_below =>
            {
                c.pending_live += 1;
                far_from_full = true;
                true
            }
            Some(c) => {
                // Near the maximum: what this worker has not added yet goes in first, then the
                // place is taken in the shared count (its `pending_live` undoes it, as for a
                // cached one, should no entry be found below).
                self.flush_live(c, true);
                if self.live.fetch_add(1, Ordering::AcqRel) < self.max_live {
                    true
                } else {
                    self.live.fetch_sub(1, Ordering::AcqRel);
                    false
                }
            }
            None => {
                if self.live.fetch_add(1, Ordering::AcqRel) < self.max_live {
                    true
                } else {
                    self.live.fetch_sub(1, Ordering::AcqRel);
                    false
                }
            }
        };
        if !counted && !self.early_drop(early_drop_hint, now_ms) {
            return Err(InsertError::Full);
        }
        let idx = match cache.as_deref_mut() {
            Some(c) => {
                let idx = self.alloc_cached(c);
                if idx.is_none() {
                    c.pending_live -= 1;
                }
                self.flush_live(c, false);
                idx
            }
            None => {
                let idx = self.alloc();
                if idx.is_none() {
                    self.live.fetch_sub(1, Ordering::AcqRel);
                }
                idx
            }
        };
        let Some(idx) = idx else {
            return Err(InsertError::Full);
        };
        let e = self.entries.at(idx as usize);
        // The entry is free and ours: its state word holds only the sequence number.
        let seq = e.state().load(Ordering::Relaxed) >> SEQ_SHIFT;
        e.state()
            .store((seq | 1) << SEQ_SHIFT | LIFE_FREE, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let stash = Stash::new(service_id, now_ms).split();
        for (d, p) in [po, pr].into_iter().enumerate() {
            e.store_tuple(d, p, stash[d]);
        }
        e.expires_or_next()
            .store(Clock32::encode(expires_ms), Ordering::Relaxed);
        e.packets(0).store(orig_counts.0, Ordering::Relaxed);
        e.bytes(0).store(orig_counts.1, Ordering::Relaxed);
        e.packets(1).store(0, Ordering::Relaxed);
        e.bytes(1).store(0, Ordering::Relaxed);
        let seq = ((seq | 1) + 1) & 0xff;
        e.state().store(
            seq << SEQ_SHIFT | (flags_and_state & !LIFE_MASK & !SEQ_MASK) | LIFE_LIVE,
            Ordering::Release,
        );

        if !single {
            let from = reply_slot.unwrap_or_else(|| self.home(hr));
            self.index_from(hr, from, idx, DIR_REPLY);
        }
        self.index_from(ho, self.home(ho), idx, DIR_ORIG);
        // An early-drop candidate from now on (indexed first: a victim is unindexed when
        // dropped). Far from the maximum a worker holds the record back (see `fifo`).
        if flags_and_state & FLAG_ASSURED == 0 {
            let rec = self.drop_queue.record(idx, seq, false);
            match cache {
                Some(c) if far_from_full => {
                    c.admitted.push(rec);
                    if c.admitted.len() == CHUNK as usize {
                        self.flush_admitted(c);
                    }
                }
                Some(c) => {
                    c.admitted.push(rec);
                    self.flush_admitted(c);
                }
                None => self.drop_queue.push_records(&[rec]),
            }
        }
        Ok(idx)
    }

    /// Puts (`idx`, `dir`) in the first free slot of `hash`'s probe from slot `from` (its home,
    /// or a vacancy found on it).
    pub(super) fn index_from(&self, hash: u64, from: usize, idx: u32, dir: u8) {
        let want = self.code.live(self.code.tag(hash), idx, dir);
        let mut i = from;
        loop {
            let s = self.slots[i].load(Ordering::Acquire);
            if (s == SLOT_EMPTY || s & TOMB_BIT != 0)
                && self.slots[i]
                    .compare_exchange(s, want, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return;
            }
            if s == SLOT_EMPTY || s & TOMB_BIT != 0 {
                continue; // lost the race for this slot; look at it again
            }
            i = self.next_slot(i);
        }
    }
}
