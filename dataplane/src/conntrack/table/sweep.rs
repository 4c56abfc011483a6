//! The expiry scan (`Table::maintain`), run by each worker between batches: paced by time, it
//! retires expired and killed entries, recycles what has waited out its grace period, and
//! clears old tombstones from the index.

use std::sync::atomic::Ordering;

use super::clock32::Clock32;
use super::shared::Table;
use super::slot::{EPOCH_MASK, SLOT_EMPTY, TOMB_BIT};
use super::state::{LIFE_DYING, LIFE_LIVE, LIFE_MASK};
use super::sweep_pacing::{
    SweepSample, SWEEP_LEFT_CLAMP_MS, SWEEP_PERIOD_MAX_MS, SWEEP_PERIOD_MIN_MS, SWEEP_SAMPLE,
};
use super::worker_cache::{Retired, CHUNK};

/// How many entries ahead of itself the expiry scan prefetches.
const SCAN_PREFETCH: usize = 8;

/// Index slots in a cache line.
const SLOTS_PER_LINE: usize = 16;

impl Table {
    /// One step of incremental maintenance, run by a worker between batches: scans `budget`
    /// entries for expired or killed ones and retires them, recycles what has waited out its grace
    /// period, and clears old tombstones. Returns how many entries expired.
    pub fn maintain(&self, now_ms: u64, budget: usize, retired: &mut Retired) -> usize {
        self.note_clock(now_ms);
        // Pace the scans by time: each worker covers its share of the used entries (and of the
        // index) once per sweep period (`sweep_period_ms`: 1-60 s, as the kernel's), so an idle
        // clock costs nothing and a busy one no more than needed. Lookups check expiry
        // themselves; the scan only reclaims room.
        let elapsed = now_ms.saturating_sub(retired.last_ms);
        retired.last_ms = now_ms;
        self.flush_admitted(retired);
        // The live count: at every step with one worker; with several, when the clock moved
        // (so the count trails by at most a clock tick's new connections, or `worker_chunk`).
        // With chunks of `CHUNK` (one participant, or a small table) at
        // every step; with larger ones only when the clock moved or the change reached a chunk.
        let flush_now = self.worker_chunk == CHUNK || elapsed > 0;
        let n = self.entries.len() as u64;
        let used = (self.next_unused.load(Ordering::Relaxed) as u64)
            .min(n)
            .max(1);
        let share = self.grace.participants() as u64 * self.sweep_period_ms();
        retired.entry_credit =
            (retired.entry_credit + elapsed.saturating_mul(used) / share).min(used);
        retired.slot_credit = (retired.slot_credit
            + elapsed.saturating_mul(self.slots.len() as u64) / share)
            .min(self.slots.len() as u64);
        let budget = (retired.entry_credit as usize).min(budget);
        retired.entry_credit -= budget as u64;
        let slot_budget = (retired.slot_credit as usize).min(budget * 8 + 64);
        retired.slot_credit -= slot_budget as u64;

        let epoch = if retired.items.is_empty() && budget == 0 {
            self.grace.epoch()
        } else {
            self.grace.try_advance()
        };
        // Recycle what is safe.
        let mut k = 0;
        while k < retired.items.len() {
            let (idx, at) = retired.items[k];
            if self.grace.is_safe(at) {
                retired.items.swap_remove(k);
                let idx = self.recycle(idx);
                self.free_cached(retired, idx);
            } else {
                k += 1;
            }
        }
        // Scan entries. (Most batches have no budget: the clock moves in milliseconds. Then the
        // shared cursors are not touched at all: an add of zero still takes their cache line
        // from the other workers, once per batch.)
        if budget == 0 && slot_budget == 0 {
            self.flush_live(retired, flush_now);
            return 0;
        }
        let start = self.scan_cursor.fetch_add(budget as u64, Ordering::Relaxed);
        let mut expired = 0;
        let mut idx = (start % used) as u32;
        // The scan walks the slab in order, a few entries per batch (at 1M connections created
        // in a second, half an entry per packet): too few at a time for the hardware prefetcher
        // to follow, so each entry was a cache miss. The state words a few entries ahead are
        // prefetched instead.
        let mut ahead = idx;
        for _ in 0..SCAN_PREFETCH.min(budget) {
            ahead = if ahead as u64 + 1 >= used {
                0
            } else {
                ahead + 1
            };
            self.prefetch_state(ahead);
        }
        for _ in 0..budget {
            if retired.items.len() == retired.items.capacity() {
                break; // never grow: the rest waits for the next round
            }
            idx = if idx as u64 + 1 >= used { 0 } else { idx + 1 };
            ahead = if ahead as u64 + 1 >= used {
                0
            } else {
                ahead + 1
            };
            self.prefetch_state(ahead);
            let e = self.entries.at(idx as usize);
            let s = e.state().load(Ordering::Acquire);
            let dying = match s & LIFE_MASK {
                LIFE_DYING => true,
                LIFE_LIVE => {
                    let expires =
                        Clock32::decode(e.expires_or_next().load(Ordering::Relaxed), now_ms);
                    if expires >= now_ms {
                        self.sample(retired, Some(expires - now_ms));
                        continue;
                    }
                    let killed = self.kill_uncounted(idx);
                    expired += killed as usize;
                    killed
                }
                _ => continue,
            };
            self.sample(retired, None);
            if dying && self.claim_retire(idx) {
                self.unindex(idx, epoch);
                retired.items.push((idx, epoch));
            }
        }
        // Clear tombstones that are past their grace period and end a probe chain.
        let start = self
            .slot_cursor
            .fetch_add(slot_budget as u64, Ordering::Relaxed);
        self.sweep_tombs((start % self.slots.len() as u64) as usize, slot_budget);
        retired.pending_live -= expired as i64;
        self.flush_live(retired, flush_now);
        expired
    }

    /// The sweep period now: the shortest near the table's maximum (the early drops of a full
    /// table would otherwise take over the scan's work), else what the samples set.
    #[inline]
    pub(crate) fn sweep_period_ms(&self) -> u64 {
        if self.live.load(Ordering::Relaxed) >= self.max_live - self.max_live / 8 {
            SWEEP_PERIOD_MIN_MS
        } else {
            self.sweep_ms.load(Ordering::Relaxed)
        }
    }

    #[cfg(test)]
    pub(crate) fn sweep_ms_for_tests(&self, ms: u64) {
        self.sweep_ms.store(ms, Ordering::Relaxed);
    }

    /// Adds a scanned entry to the worker's sample: the time it has left, or None when it was
    /// to be reclaimed (killed or expired). A full sample sets the period.
    #[inline]
    fn sample(&self, retired: &mut Retired, left_ms: Option<u64>) {
        let r = &mut retired.sample;
        match left_ms {
            Some(ms) => r.left_ms += ms.min(SWEEP_LEFT_CLAMP_MS),
            None => r.reclaimed = true,
        }
        r.n += 1;
        if r.n < SWEEP_SAMPLE {
            return;
        }
        let period = if r.reclaimed {
            SWEEP_PERIOD_MIN_MS
        } else {
            (r.left_ms / r.n as u64).clamp(SWEEP_PERIOD_MIN_MS, SWEEP_PERIOD_MAX_MS)
        };
        *r = SweepSample::default();
        if self.sweep_ms.load(Ordering::Relaxed) != period {
            self.sweep_ms.store(period, Ordering::Relaxed);
        }
    }

    /// A hint for the expiry scan: starts loading entry `idx`'s state word.
    #[inline(always)]
    fn prefetch_state(&self, idx: u32) {
        if let Some(e) = self.entries.get(idx as usize) {
            kxdp_packet::prefetch::prefetch(e.state());
        }
    }

    /// The expiry scan's pass over `n` index slots from slot `start` (wrapping): every run of
    /// old tombstones that ends at an empty slot is cleared (`clear_tombs_before`). In order,
    /// the slot a line ahead prefetched, over at most two subslices (no wrap or bounds check per
    /// slot, no division), and the run's clearing entered only when the slot before an empty
    /// one was a tombstone as this pass read it: most empty slots follow no tombstone, and
    /// testing every one of them again in `clear_tombs_before` was half the pass (at 1.25M
    /// entries, about 130 instructions per new connection of the 1-Mpps replay captures).
    fn sweep_tombs(&self, start: usize, n: usize) {
        let len = self.slots.len();
        let before = if start == 0 { len - 1 } else { start - 1 };
        let mut prev_tomb = self.slots[before].load(Ordering::Relaxed) & TOMB_BIT != 0;
        let (mut from, mut left) = (start, n.min(len));
        while left > 0 {
            let to = (from + left).min(len);
            for (j, slot) in self.slots[from..to].iter().enumerate() {
                let i = from + j;
                if i % SLOTS_PER_LINE == 0 {
                    if let Some(s) = self.slots.get(i + SLOTS_PER_LINE) {
                        kxdp_packet::prefetch::prefetch(s);
                    }
                }
                let s = slot.load(Ordering::Acquire);
                if s == SLOT_EMPTY && prev_tomb {
                    self.clear_tombs_before(i);
                }
                prev_tomb = s & TOMB_BIT != 0;
            }
            left -= to - from;
            from = 0;
        }
    }

    /// If slot `i` is empty, turns the run of old tombstones right before it into empty slots.
    fn clear_tombs_before(&self, i: usize) {
        if self.slots[i].load(Ordering::Acquire) != SLOT_EMPTY {
            return;
        }
        let mut j = i;
        for _ in 0..64 {
            j = if j == 0 { self.slots.len() - 1 } else { j - 1 };
            let s = self.slots[j].load(Ordering::Acquire);
            if s & TOMB_BIT == 0 || !self.tomb_is_safe(s) {
                return;
            }
            if self.slots[j]
                .compare_exchange(s, SLOT_EMPTY, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return;
            }
        }
    }

    /// Whether a tombstone's (31-bit) epoch stamp is past its grace period: stamps are never
    /// from the future, and a tombstone is cleared within seconds, long before 2^31 epochs.
    fn tomb_is_safe(&self, s: u32) -> bool {
        let stamp = (s >> 1) as u64;
        (self.grace.epoch().wrapping_sub(stamp) & EPOCH_MASK) >= 2
    }
}

#[cfg(test)]
mod tests {
    use super::super::slot::slot_tomb;
    use super::*;

    /// `sweep_tombs` leaves the index as the slot-by-slot pass it replaced (`clear_tombs_before`
    /// at every slot, in order) did: on random runs of empty, live, old and recent tombstone
    /// slots, from starts that wrap around the end, for lengths up to the whole index.
    #[test]
    fn sweep_tombs_clears_what_the_slot_by_slot_pass_cleared() {
        let (swept, by_slot) = (Table::new(1024, 1, 7), Table::new(1024, 1, 7));
        let len = swept.slots.len();
        let epoch = swept.grace.epoch();
        let old = slot_tomb(epoch.wrapping_sub(2));
        let recent = slot_tomb(epoch);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            for (a, b) in swept.slots.iter().zip(by_slot.slots.iter()) {
                rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let s = match rng >> 61 {
                    0..=2 => SLOT_EMPTY,
                    3 | 4 => old,
                    5 => recent,
                    _ => 2 + ((rng >> 20) as u32 & 0xffff) * 2, // live: low bit clear, not 0
                };
                a.store(s, Ordering::Relaxed);
                b.store(s, Ordering::Relaxed);
            }
            let start = if round % 2 == 0 {
                len - 1 - (round % 37)
            } else {
                (rng >> 7) as usize % len
            };
            let n = match round % 4 {
                0 => len,
                1 => 1,
                _ => (rng >> 17) as usize % len,
            };
            assert!(swept.slots.iter().any(|s| s.load(Ordering::Relaxed) == old));
            swept.sweep_tombs(start, n);
            let mut i = start;
            for _ in 0..n {
                by_slot.clear_tombs_before(i);
                i = by_slot.next_slot(i);
            }
            for (k, (a, b)) in swept.slots.iter().zip(by_slot.slots.iter()).enumerate() {
                assert_eq!(
                    a.load(Ordering::Relaxed),
                    b.load(Ordering::Relaxed),
                    "round {round}, slot {k}, start {start}, n {n}"
                );
            }
        }
    }
}
