//! The order in which entries became droppable early (`Table::early_drop`): a ring of entry
//! indices in admission order, shared by the workers, lock-free.
//!
//! Why: under a SYN flood at a full table every new connection evicts one that has not been
//! answered. Evicting a sampled one (the kernel looks at a few hash buckets) gives a
//! handshake begun a moment ago the same odds as the flood's oldest half-open entry; at a
//! 1,000-entry table and 100k SYN/s that costs a legitimate client its SYN_SENT entry before its
//! SYN-ACK arrives. Evicting the oldest first gives every handshake the time the flood needs to
//! turn over all the droppable room.
//!
//! A record is pushed when an entry becomes droppable: at insert when unassured, and when an
//! assured TCP connection starts closing (`Table::note_closing`). It is never removed when the
//! entry stops being droppable (assured, killed, expired, recycled): the reader skips such
//! records lazily, so a push is one `fetch_add` and one store, and a pop amortizes to O(1).
//! A worker inserting far from the table's maximum keeps its records in its own cache
//! (`Retired`) and pushes them `CHUNK` at a time and at every maintenance step, as it counts
//! its new connections (`Table::insert`): no shared atomic per new connection. Across workers
//! the order is then exact to within a batch; near the maximum, where early drop happens, every
//! record goes in at once, behind that worker's held ones.
//!
//! A record holds the entry's index, a second-chance bit, and as many low bits of the entry's
//! sequence number (`SEQ_SHIFT`; it changes with every reuse of the entry) as fit beside them:
//! a record of an entry since reused for another connection is recognised as stale.
//!
//! The ring keeps the last `len` pushes (a power of two at least the table's `max_live`, a
//! quarter of it from 2^17 entries up: `DropQueue::kept`). Under
//! steady traffic nobody pops and older records are overwritten; a reader that finds its
//! cursor more than `len` behind jumps to the oldest record kept. An entry droppable since
//! before those `len` pushes is then reached only by the sampled scan, the fallback.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam::utils::CachePadded;

pub(crate) struct DropQueue {
    ring: Box<[AtomicU32]>,
    mask: u64,
    idx_bits: u32,
    seq_mask: u32,
    /// Next position to push at.
    admit: CachePadded<AtomicU64>,
    /// Next position to pop from.
    evict: CachePadded<AtomicU64>,
}

/// A popped record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub idx: u32,
    /// Already put back once (`Table::early_drop`: a handshake answered by its server).
    pub second_chance: bool,
    /// The low bits of the entry's sequence number when pushed (`seq_matches`).
    seq: u32,
}

impl DropQueue {
    /// How many of the latest records a table of `max_live` keeps: all of them up to 2^17
    /// entries, a quarter beyond. Four bytes a record would otherwise add four to the 126 bytes
    /// per connection of a large table (the target is 128); a quarter of a million-entry table
    /// is 2.6 s of a 100k SYN/s flood, far more than a handshake needs to be answered.
    fn kept(max_live: u32) -> u32 {
        if max_live >= 1 << 17 {
            max_live / 4
        } else {
            max_live
        }
    }

    /// A queue for entry indices below `capacity`, keeping the latest `kept(max_live)` records.
    pub fn new(capacity: usize, max_live: u32) -> DropQueue {
        let len = (Self::kept(max_live) as usize).next_power_of_two().max(16);
        let idx_bits = usize::BITS - (capacity.max(2) - 1).leading_zeros();
        assert!(idx_bits < 31, "a table's indices fit in 30 bits");
        // Above the index: the second-chance bit, then the sequence number's bits (its low
        // bit is always 0 in a live entry: dropped).
        let seq_bits = (32 - idx_bits - 1).min(7);
        DropQueue {
            ring: (0..len).map(|_| AtomicU32::new(u32::MAX)).collect(),
            mask: len as u64 - 1,
            idx_bits,
            seq_mask: (1 << seq_bits) - 1,
            admit: CachePadded::new(AtomicU64::new(0)),
            evict: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// The record of entry `idx` with sequence number `seq` (`SEQ_SHIFT`'s bits, shifted down).
    #[inline(always)]
    pub fn record(&self, idx: u32, seq: u32, second_chance: bool) -> u32 {
        idx | (second_chance as u32) << self.idx_bits
            | ((seq >> 1) & self.seq_mask) << (self.idx_bits + 1)
    }

    /// Records that entry `idx`, with sequence number `seq`, became droppable now.
    #[inline]
    pub fn push(&self, idx: u32, seq: u32, second_chance: bool) {
        self.push_records(&[self.record(idx, seq, second_chance)]);
    }

    /// Pushes records (`record`) in their order: one shared atomic for all of them.
    #[inline]
    pub fn push_records(&self, recs: &[u32]) {
        if recs.is_empty() {
            return;
        }
        let pos = self.admit.fetch_add(recs.len() as u64, Ordering::Relaxed);
        for (k, &rec) in recs.iter().enumerate() {
            self.ring[((pos + k as u64) & self.mask) as usize].store(rec, Ordering::Release);
        }
    }

    /// Whether `rec` was pushed for the entry as it is now (sequence number `seq`).
    #[inline]
    pub fn seq_matches(&self, rec: &Record, seq: u32) -> bool {
        rec.seq == (seq >> 1) & self.seq_mask
    }

    /// The oldest record not yet popped, or None when every push has been popped. (Between a
    /// pusher's position and its store, a reader may find the record a lap older there: it is
    /// then stale, or the entry it names is older still, and the pushed one is passed over.)
    pub fn pop(&self) -> Option<Record> {
        let mut e = self.evict.load(Ordering::Acquire);
        loop {
            let a = self.admit.load(Ordering::Acquire);
            if e >= a {
                return None;
            }
            let len = self.mask + 1;
            if a - e > len {
                // Overwritten: on to the oldest record the ring still has.
                match self
                    .evict
                    .compare_exchange(e, a - len, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => e = a - len,
                    Err(now) => e = now,
                }
                continue;
            }
            let rec = self.ring[(e & self.mask) as usize].load(Ordering::Acquire);
            match self
                .evict
                .compare_exchange_weak(e, e + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if rec == u32::MAX {
                        e += 1;
                        continue; // never written (a pusher between its position and store)
                    }
                    let idx_mask = (1u32 << self.idx_bits) - 1;
                    return Some(Record {
                        idx: rec & idx_mask,
                        second_chance: rec >> self.idx_bits & 1 == 1,
                        seq: rec >> (self.idx_bits + 1) & self.seq_mask,
                    });
                }
                Err(now) => e = now,
            }
        }
    }

    /// Records pushed and not yet popped (or overwritten).
    #[cfg(test)]
    pub fn backlog(&self) -> u64 {
        let a = self.admit.load(Ordering::Relaxed);
        let e = self.evict.load(Ordering::Relaxed);
        a.saturating_sub(e).min(self.mask + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_push_order_with_their_bits() {
        let q = DropQueue::new(1000, 1000);
        for i in 0..10u32 {
            q.push(i, 2 * i, i % 2 == 1);
        }
        for i in 0..10u32 {
            let r = q.pop().unwrap();
            assert_eq!(r.idx, i);
            assert_eq!(r.second_chance, i % 2 == 1);
            assert!(q.seq_matches(&r, 2 * i));
            assert!(!q.seq_matches(&r, 2 * i + 2));
        }
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn a_lapped_reader_resumes_at_the_oldest_record_kept() {
        let q = DropQueue::new(100, 16);
        for i in 0..40u32 {
            q.push(i, 0, false);
        }
        assert_eq!(q.backlog(), 16);
        assert_eq!(q.pop().unwrap().idx, 24);
    }

    #[test]
    fn the_largest_table_keeps_a_sequence_bit() {
        let q = DropQueue::new((1 << 29) + (1 << 22), 16);
        q.push((1 << 29) + 5, 2, true);
        let r = q.pop().unwrap();
        assert_eq!((r.idx, r.second_chance), ((1 << 29) + 5, true));
        assert!(q.seq_matches(&r, 2));
        assert!(!q.seq_matches(&r, 4));
    }
}
