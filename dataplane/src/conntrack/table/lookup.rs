//! Finding a connection: the probe of the index from a key's hash, the prefetches a batch
//! issues ahead of it, and the copy of the entry read under its sequence number (`Found`).

use std::sync::atomic::{AtomicU32, Ordering};

use kxdp_packet::IpProto;

use super::super::tuple::{Packed, Tuple};
use super::clock32::Clock32;
use super::entry::{is_v4, join_tuple, Stash, FAMILY_V6_BIT, KEY_MASK};
use super::shared::Table;
use super::slot::{Candidate, SLOT_EMPTY, TOMB_BIT};
use super::state::{DIR_ORIG, LIFE_LIVE, LIFE_MASK, SEQ_MASK, SEQ_SHIFT};

/// Slots of a probe `prefetch_entry` looks at for the entry to prefetch (at half full, a linear
/// probe finds its key within four slots nearly always).
const PREFETCH_PROBE: usize = 4;

/// Longest probe sequence before a lookup gives up: a table kept at most half full by live keys
/// stays far below it; it bounds the work of a pathological chain.
pub(super) const MAX_PROBE: usize = 4096;

/// What a lookup found: a copy of the entry taken under its sequence number.
#[derive(Clone, Copy, Debug, Default)]
pub struct Found {
    pub idx: u32,
    /// Which of the entry's tuples matched (`DIR_ORIG` or `DIR_REPLY`).
    pub dir: u8,
    /// The entry's other tuple (where a packet in this direction is translated to, reversed)
    /// as the entry keeps it: its addresses' low 32 bits (source above, destination below), its
    /// last packed word (ports, protocol, family; stash bits cleared) and, for IPv6, the rest of
    /// its words (`Cold`'s). Kept in words: the established fast lane compares and rewrites an
    /// IPv4 packet from the first two (`Found::other` packs the whole tuple for the rest).
    pub other_addrs: u64,
    pub other_last: u64,
    pub other_rest: [u64; 3],
    pub state: u32,
    pub service_id: u32,
    /// The expiry as the entry keeps it (`Clock32`): `Found::expired` compares it with now
    /// without decoding it (the only question a lookup asks of it).
    pub expires: u32,
}

impl Found {
    /// Whether the connection's expiry is before `now_ms` (`Conntrack::lookup`: then it is gone,
    /// whether or not the expiry scan has reached it).
    #[inline(always)]
    pub fn expired(&self, now_ms: u64) -> bool {
        Clock32::expired(self.expires, now_ms)
    }

    /// Whether the connection is IPv4.
    #[inline(always)]
    pub fn is_v4(&self) -> bool {
        self.other_last & FAMILY_V6_BIT == 0
    }

    /// The other tuple, packed.
    #[inline(always)]
    pub fn other(&self) -> Packed {
        join_tuple(self.other_addrs, self.other_last, self.other_rest)
    }

    /// The other tuple, unpacked (the full path).
    #[inline]
    pub fn other_tuple(&self) -> Tuple {
        Tuple::unpack(&self.other())
    }

    /// The connection's IP protocol.
    #[inline(always)]
    pub fn proto(&self) -> IpProto {
        IpProto((self.other_last >> 32) as u8)
    }
}

impl Table {
    /// Starts loading the index slot a probe for `hash` begins at (a hint for the batch's later
    /// lookup: reads nothing, changes nothing).
    #[inline]
    pub fn prefetch_slot(&self, hash: u64) {
        kxdp_packet::prefetch::prefetch(&self.slots[self.home(hash)]);
    }

    /// Starts loading the entry that `hash`'s probe names, and returns it as the lookup's
    /// [`Candidate`] (the slot decoded once per packet, not again by the lookup): the first live
    /// slot with `hash`'s tag among the probe's first `PREFETCH_PROBE` slots, not past the home
    /// slot's cache line (the line `prefetch_slot` loaded: the probe's slots beyond it would be
    /// a cache miss of their own). An empty slot first ends the probe: `Candidate::MISS`.
    /// Otherwise a hint only (`Candidate::NONE`). Not only the home slot is looked at: in a
    /// half-full index a linear probe's key is often past its home slot (1.5 slots on average),
    /// and with the home slot alone those packets' lookups waited for their entries (est-1m's
    /// lookups took 43 ns a packet, 20 with this; docs/benchmarks.md "Where the time goes").
    #[inline]
    pub fn prefetch_entry(&self, key: &Packed, hash: u64) -> Candidate {
        let tag = self.code.tag(hash);
        let mut i = self.home(hash);
        for _ in 0..PREFETCH_PROBE {
            let slot = &self.slots[i];
            let s = slot.load(Ordering::Relaxed);
            if s == SLOT_EMPTY {
                return Candidate::MISS;
            }
            if s & TOMB_BIT == 0 {
                let (stag, idx, dir) = self.code.decode(s);
                if stag == tag {
                    if let Some(e) = self.entries.get(idx as usize) {
                        e.prefetch(!is_v4(key));
                        return Candidate::of(idx, dir);
                    }
                    return Candidate::NONE;
                }
            }
            // The last slot of its cache line.
            if (slot as *const AtomicU32 as usize) & 63 == 60 {
                return Candidate::NONE;
            }
            i = self.next_slot(i);
        }
        Candidate::NONE
    }

    /// Finds the live entry holding `key` in either direction (whether it has expired is the
    /// caller's question: `Found::expired`; `_now_ms` is no longer needed for it). Always
    /// inlined: the hot path's lookup (inline until the pass loop grew, then an out-of-line call
    /// per packet in the profile).
    #[inline(always)]
    pub fn lookup(&self, key: &Packed, hash: u64, _now_ms: u64) -> Option<Found> {
        let mut found = Found::default();
        self.lookup_into(key, hash, &mut found).then_some(found)
    }

    /// [`Table::lookup`] writing what it finds into `out` (the pipeline's per-packet scratch)
    /// instead of returning it: the entry's words go from the entry to the scratch, not through
    /// registers spilled to the stack and a copy of the whole `Found` (~25 instructions per
    /// packet of est-10k). Returns whether it found one; when not, `out` holds nothing usable
    /// (possibly a torn copy of an entry that did not match or changed meanwhile).
    #[inline(always)]
    pub fn lookup_into(&self, key: &Packed, hash: u64, out: &mut Found) -> bool {
        let tag = self.code.tag(hash);
        let mut i = self.home(hash);
        for _ in 0..MAX_PROBE {
            let s = self.slots[i].load(Ordering::Acquire);
            if s == SLOT_EMPTY {
                return false;
            }
            if s & TOMB_BIT == 0 {
                let (stag, idx, dir) = self.code.decode(s);
                if stag == tag && self.read_if_match(idx, dir, key, out) {
                    return true;
                }
            }
            i = self.next_slot(i);
        }
        false
    }

    /// [`Table::lookup_into`], trying first the entry `candidate` names (`prefetch_entry`'s
    /// decode of the probe's first slots, taken earlier in the same batch): when that entry is
    /// live and holds `key` (checked as the probe checks it, under its sequence number) it is
    /// the connection, wherever the index points now; otherwise the probe runs as ever. Saves
    /// the hit's slot load and decode (most packets of a known connection). `Candidate::MISS`
    /// (the probe met an empty slot before the key's tag when the prefetch pass read it) is a miss
    /// without a probe: the answer as of that moment, as a probe a few hundred nanoseconds
    /// earlier would have given (a connection another worker inserts meanwhile is as racy
    /// either way; this worker's own inserts come later, in the decide pass).
    #[inline(always)]
    pub fn lookup_into_from(
        &self,
        key: &Packed,
        hash: u64,
        candidate: Candidate,
        out: &mut Found,
    ) -> bool {
        if candidate == Candidate::MISS {
            return false;
        }
        if let Some((idx, dir)) = candidate.get() {
            if self.read_if_match(idx, dir, key, out) {
                return true;
            }
        }
        self.lookup_into(key, hash, out)
    }

    /// Whether entry `idx`'s tuple `dir` is `key` in a live entry; if so its copy, taken under the
    /// entry's sequence number, is in `out` (written as read: a failed read leaves a torn copy).
    #[inline(always)]
    pub(super) fn read_if_match(&self, idx: u32, dir: u8, key: &Packed, out: &mut Found) -> bool {
        let Some(e) = self.entries.get(idx as usize) else {
            return false;
        };
        let st1 = e.state().load(Ordering::Acquire);
        if (st1 >> SEQ_SHIFT) & 1 == 1 || st1 & LIFE_MASK != LIFE_LIVE {
            return false;
        }
        let d = dir as usize;
        if !e.holds(d, key) {
            return false;
        }
        // The other tuple, from its two `Hot` words (and an IPv6 one's `Cold` words).
        let (mine4, theirs4) = (
            e.last_word(d).load(Ordering::Relaxed),
            e.last_word(1 - d).load(Ordering::Relaxed),
        );
        out.other_addrs = e.addr_word(1 - d).load(Ordering::Relaxed);
        out.other_last = theirs4 & KEY_MASK;
        if !is_v4(key) {
            out.other_rest = e.load_cold(1 - d);
        }
        let stash = if dir == DIR_ORIG {
            Stash::join(mine4, theirs4)
        } else {
            Stash::join(theirs4, mine4)
        };
        let expires = e.expires_or_next().load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        let state = e.state().load(Ordering::Acquire);
        if (state ^ st1) & SEQ_MASK != 0 || state & LIFE_MASK != LIFE_LIVE {
            return false;
        }
        out.idx = idx;
        out.dir = dir;
        out.state = state & !SEQ_MASK;
        out.service_id = stash.service_id;
        out.expires = expires;
        true
    }

    /// Whether a live entry holds `key` (used to keep SNAT choices unique).
    #[inline]
    pub fn contains(&self, key: &Packed) -> bool {
        self.lookup(key, self.hash(key), 0).is_some()
    }
}
