//! The shared connection table: fixed capacity, preallocated, lock-free.
//!
//! Why not a crate: the table must hold a bounded number of entries allocated once at start (no
//! allocation per new connection), index each entry under two keys (original and reply tuple),
//! let several workers look up and update entries concurrently without locks, and be scanned
//! incrementally for expiry. Concurrent maps on crates.io (dashmap: locks; papaya, scc: allocate
//! per insert) give none of the first three together.
//!
//! Layout:
//! - `entries`: the slab of connections, two arrays by the same index (`Hot`: one cache line with
//!   all an IPv4 connection's fields; `Cold`: the rest of an IPv6 connection's addresses). An
//!   entry's tuples are written once, while its sequence number is odd, and read under that
//!   sequence number (a seqlock), so a reader never acts on a half-written or recycled entry.
//!   State, expiry and counters are atomics updated in place.
//! - `slots`: an open-addressing index (linear probing) from tuple hash to (entry, direction).
//!   Removal leaves a tombstone stamped with the epoch; tombstones and entries are recycled only
//!   after a grace period (see `grace`), which is what makes probing without locks sound.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam::queue::ArrayQueue;
use crossbeam::utils::CachePadded;
use kxdp_kernel::shm::{AtomicRecord, Mapping, SharedSlice};

use super::fifo::DropQueue;
use super::grace::Grace;
use super::tuple::{addr_word, hash_packed, Packed, Tuple};

/// Entry life cycle (low bits of `Entry::state`).
pub(crate) const LIFE_MASK: u32 = 0b11;
pub(crate) const LIFE_FREE: u32 = 0;
pub(crate) const LIFE_LIVE: u32 = 1;
/// Invisible to lookups; its index slots are about to be, or have been, removed.
pub(crate) const LIFE_DYING: u32 = 2;
/// Index slots removed; waiting for the grace period before reuse.
pub(crate) const LIFE_RETIRED: u32 = 3;

/// Flags above the life bits.
pub const FLAG_ASSURED: u32 = 1 << 2;
pub const FLAG_SEEN_REPLY: u32 = 1 << 3;
pub const FLAG_MASQ: u32 = 1 << 4;
/// Only the original tuple is indexed (affinity records).
pub const FLAG_SINGLE_KEY: u32 = 1 << 5;
/// The connection's endpoint has left its Service for good (`stale::reconcile`): the client's
/// next packet is answered with a RST and the entry removed (`backend-gone`). Set off the packet
/// path; read from the state word a lookup loads anyway. (A build that does not know the bit
/// finds such an entry in a state file malformed and drops it: the client then gets `ct-lost`.)
pub const FLAG_BACKEND_GONE: u32 = 1 << 6;
/// Protocol state (e.g. TCP state) lives in bits 8..16.
pub const PROTO_STATE_SHIFT: u32 = 8;
pub const PROTO_STATE_MASK: u32 = 0xff << PROTO_STATE_SHIFT;
/// Per-direction protocol flags (TCP FIN seen from orig/reply) in bits 16..24.
pub const DIR_FLAGS_SHIFT: u32 = 16;

pub const DIR_ORIG: u8 = 0;
pub const DIR_REPLY: u8 = 1;

/// The sequence number of the entry's seqlock, in the top bits of its state word (odd while
/// the tuples are written). Eight bits suffice: an entry is recycled only after a grace period,
/// so a reader never sees it change more than once while it reads.
pub(crate) const SEQ_SHIFT: u32 = 24;
pub(crate) const SEQ_MASK: u32 = 0xff << SEQ_SHIFT;

/// One connection in 112 bytes (the goal: at most 128 bytes per connection with the index),
/// kept in two arrays of records of atomics (`AtomicRecord`, from the kernel crate) so that it
/// can live in a shared file mapping (`persist`):
///
/// - `Hot`, 64 bytes, one cache line (the array starts on a line): everything a lookup of an
///   IPv4 connection and a packet of the established fast lane read and write. An IPv4 tuple's
///   addresses are 32 bits each, so both tuples fit here with the state and the counters, and a
///   packet of an IPv4 connection touches one line of its entry rather than the two or three
///   of a 112-byte record (est-1m 1.15-1.24× and new connections 1.10-1.17× as
///   fast; docs/benchmarks.md "est-10k waits for the index, not the entries").
/// - `Cold`, 48 bytes: the rest of an IPv6 tuple's addresses, read only for IPv6 connections
///   (an IPv4 connection's are the IPv4-mapped prefix, implied by its family bit, and never
///   written).
///
/// `Hot`'s fields, by index:
/// - `w64[0]`, `w64[2]`: the original and reply tuples' addresses' low 32 bits (`addr_word`:
///   source above, destination below), written once while the sequence number is odd, read
///   under it (a seqlock);
/// - `w64[1]`, `w64[3]`: the tuples' last packed words (ports, protocol, family: `KEY_BITS`),
///   with the fields written with the tuples in the 23 bits above (`Stash`): the Service id (16
///   bits in each tuple) and the creation time (7 bits in each: 14 bits of 16-millisecond
///   ticks, so ages wrap after 262 s — only ages of seconds are asked, of entries not yet
///   assured);
/// - `w64[4..6]`: bytes per direction; for SCTP, `w64[4]` holds both directions' bytes (32 bits
///   each, wrapping) and `w64[5]` the verification tags (`sctp::pack_tags`);
/// - `w32[0]`: life cycle, flags, protocol state, and the sequence number (`SEQ_SHIFT`);
/// - `w32[1]`: while live, the expiry (CLOCK_MONOTONIC in 2-millisecond units, wrapping: see
///   `Clock32`); while free, the next free entry + 1 (0 ends the list);
/// - `w32[2..4]`: packets per direction (wrapping at 2^32).
///
/// `Cold`'s, for an IPv6 connection: per tuple (`w64[3 * dir..]`) the source address's high
/// word, the destination's high word, and the two addresses' low words' high halves (`high_halves`).
///
/// Changing this changes the file layout: bump `persist::LAYOUT_VERSION` and describe it in
/// `persist::LAYOUT`.
pub(crate) type Hot = AtomicRecord<6, 4>;
pub(crate) type Cold = AtomicRecord<6, 0>;

/// Bits of a packed tuple's last word that belong to the key (ports, protocol, family).
pub(crate) const KEY_BITS: u32 = 41;
pub(crate) const KEY_MASK: u64 = (1 << KEY_BITS) - 1;
/// The family bit of a packed tuple's last word (set: IPv6).
const FAMILY_V6_BIT: u64 = 1 << 40;
/// The high half of an IPv4-mapped address's low word (`::ffff:a.b.c.d`).
const V4_MAPPED: u64 = 0xffff << 32;

const _: () = assert!(std::mem::size_of::<Hot>() == 64);
const _: () = assert!(std::mem::size_of::<Cold>() == 48);

/// A packed tuple's addresses' low words' high halves in one word (`Cold`'s third).
#[inline(always)]
fn high_halves(p: &Packed) -> u64 {
    (p[1] >> 32) << 32 | p[3] >> 32
}

/// Whether a packed tuple is IPv4 (its family bit clear).
#[inline(always)]
fn is_v4(p: &Packed) -> bool {
    p[4] & FAMILY_V6_BIT == 0
}

/// Whether an IPv4 packed tuple is as the table keeps one: its addresses IPv4-mapped.
fn is_mapped_v4(p: &Packed) -> bool {
    p[0] == 0 && p[2] == 0 && p[1] >> 32 == 0xffff && p[3] >> 32 == 0xffff
}

/// A tuple packed from the words an entry keeps it in: its addresses' low 32 bits (`addr_word`),
/// its last word `last`, and for IPv6 the rest (`Cold`'s three words; not read for IPv4, whose
/// other words are the mapped prefix).
#[inline(always)]
fn join_tuple(addrs: u64, last: u64, rest: [u64; 3]) -> Packed {
    if last & FAMILY_V6_BIT == 0 {
        [
            0,
            V4_MAPPED | addrs >> 32,
            0,
            V4_MAPPED | addrs & 0xffff_ffff,
            last,
        ]
    } else {
        let [src_high, dst_high, halves] = rest;
        [
            src_high,
            (halves >> 32) << 32 | addrs >> 32,
            dst_high,
            halves << 32 | addrs & 0xffff_ffff,
            last,
        ]
    }
}

/// The entries: `Hot` and `Cold` records by the same index.
pub(crate) struct Entries {
    pub hot: SharedSlice<Hot>,
    pub cold: SharedSlice<Cold>,
}

impl Entries {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.hot.len()
    }

    /// Entry `idx` (panics past the end, as indexing does).
    #[inline(always)]
    pub fn at(&self, idx: usize) -> EntryRef<'_> {
        EntryRef {
            hot: &self.hot[idx],
            cold: &self.cold,
            idx,
        }
    }

    /// Entry `idx`, if there is one. (The `Cold` array is as long as the `Hot` one, and checked
    /// only where an IPv6 entry's words are read: a bounds check and an address per entry
    /// found were 6 instructions on every packet of the fast lane.)
    #[inline(always)]
    pub fn get(&self, idx: usize) -> Option<EntryRef<'_>> {
        Some(EntryRef {
            hot: self.hot.get(idx)?,
            cold: &self.cold,
            idx,
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = EntryRef<'_>> + '_ {
        (0..self.len()).map(|i| self.at(i))
    }
}

/// One entry: its `Hot` record, and where its `Cold` one is.
#[derive(Clone, Copy)]
pub(crate) struct EntryRef<'a> {
    hot: &'a Hot,
    cold: &'a SharedSlice<Cold>,
    idx: usize,
}

impl<'a> EntryRef<'a> {
    #[inline(always)]
    fn cold(&self) -> &'a Cold {
        &self.cold[self.idx]
    }
    #[inline(always)]
    pub fn state(&self) -> &'a AtomicU32 {
        &self.hot.w32[0]
    }
    #[inline(always)]
    pub fn expires_or_next(&self) -> &'a AtomicU32 {
        &self.hot.w32[1]
    }
    #[inline(always)]
    pub fn bytes(&self, dir: usize) -> &'a AtomicU64 {
        &self.hot.w64[4 + (dir & 1)]
    }
    #[inline(always)]
    pub fn packets(&self, dir: usize) -> &'a AtomicU32 {
        &self.hot.w32[2 + (dir & 1)]
    }
    /// Tuple `dir`'s last word: the key's ports, protocol and family, and the stash above.
    /// The connection's IP protocol (in the original tuple's last word).
    #[inline(always)]
    fn proto(&self) -> u8 {
        (self.last_word(0).load(Ordering::Relaxed) >> 32) as u8
    }
    #[inline(always)]
    fn last_word(&self, dir: usize) -> &'a AtomicU64 {
        &self.hot.w64[2 * (dir & 1) + 1]
    }
    #[inline(always)]
    fn addr_word(&self, dir: usize) -> &'a AtomicU64 {
        &self.hot.w64[2 * (dir & 1)]
    }

    /// Tuple `dir`'s words in `Cold` (IPv6 only).
    #[inline(always)]
    fn cold_words(&self, dir: usize) -> &'a [AtomicU64] {
        &self.cold().w64[3 * (dir & 1)..3 * (dir & 1) + 3]
    }

    /// Tuple `dir`'s `Cold` words, loaded (IPv6 only).
    #[inline(always)]
    fn load_cold(&self, dir: usize) -> [u64; 3] {
        let c = self.cold_words(dir);
        [0, 1, 2].map(|j| c[j].load(Ordering::Relaxed))
    }

    /// The tuple of direction `dir` as a key (the stash bits cleared).
    pub fn key(&self, dir: usize) -> Packed {
        let last = self.last_word(dir).load(Ordering::Relaxed) & KEY_MASK;
        let rest = if last & FAMILY_V6_BIT == 0 {
            [0; 3]
        } else {
            self.load_cold(dir)
        };
        join_tuple(self.addr_word(dir).load(Ordering::Relaxed), last, rest)
    }

    /// Whether tuple `dir` is `key` (its stash bits aside). An IPv4 key is compared with `Hot`
    /// only: a packed IPv4 tuple's other words are the mapped prefix (`Tuple::pack_v4`), and a
    /// tuple with the same last word is IPv4 too.
    #[inline(always)]
    fn holds(&self, dir: usize, key: &Packed) -> bool {
        if self.last_word(dir).load(Ordering::Relaxed) & KEY_MASK != key[4]
            || self.addr_word(dir).load(Ordering::Relaxed) != addr_word(key)
        {
            return false;
        }
        if is_v4(key) {
            debug_assert!(is_mapped_v4(key));
            return true;
        }
        self.load_cold(dir) == [key[0], key[2], high_halves(key)]
    }

    /// Writes tuple `dir` (packed) with `stash` in its last word's high bits.
    #[inline(always)]
    pub(crate) fn store_tuple(&self, dir: usize, p: &Packed, stash: u64) {
        self.addr_word(dir).store(addr_word(p), Ordering::Relaxed);
        self.last_word(dir).store(p[4] | stash, Ordering::Relaxed);
        if is_v4(p) {
            debug_assert!(is_mapped_v4(p));
        } else {
            let c = self.cold_words(dir);
            for (w, v) in c.iter().zip([p[0], p[2], high_halves(p)]) {
                w.store(v, Ordering::Relaxed);
            }
        }
    }

    /// Service id and creation tick (`Stash`).
    pub fn stash(&self) -> Stash {
        Stash::join(
            self.last_word(0).load(Ordering::Relaxed),
            self.last_word(1).load(Ordering::Relaxed),
        )
    }

    /// Starts loading the entry's line (and an IPv6 entry's other words, with `v6`).
    #[inline(always)]
    fn prefetch(&self, v6: bool) {
        kxdp_packet::prefetch::prefetch(self.hot);
        if v6 {
            kxdp_packet::prefetch::prefetch_lines(self.cold());
        }
    }

    /// Copies every word of `from` (another table's entry) into this one.
    pub fn copy_from(&self, from: EntryRef<'_>) {
        for (a, b) in self.hot.w64.iter().zip(&from.hot.w64) {
            a.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (a, b) in self.hot.w32.iter().zip(&from.hot.w32) {
            a.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (a, b) in self.cold().w64.iter().zip(&from.cold().w64) {
            a.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// The fields kept in the spare bits of the tuples' last words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stash {
    pub service_id: u32,
    /// Creation time in 16-millisecond ticks, 14 bits.
    pub created_tick: u32,
}

const TICK_SHIFT: u32 = 4;
const TICK_BITS: u32 = 14;

impl Stash {
    pub fn new(service_id: u32, now_ms: u64) -> Stash {
        Stash {
            service_id,
            created_tick: (now_ms >> TICK_SHIFT) as u32 & ((1 << TICK_BITS) - 1),
        }
    }

    /// The high bits of the original and reply tuples' last words.
    pub fn split(&self) -> [u64; 2] {
        let half = |sid: u32, tick: u32| {
            ((sid & 0xffff) as u64) << 48 | ((tick & 0x7f) as u64) << KEY_BITS
        };
        [
            half(self.service_id, self.created_tick),
            half(self.service_id >> 16, self.created_tick >> 7),
        ]
    }

    pub fn join(orig_w4: u64, reply_w4: u64) -> Stash {
        let sid = |w: u64| (w >> 48) as u32 & 0xffff;
        let tick = |w: u64| (w >> KEY_BITS) as u32 & 0x7f;
        Stash {
            service_id: sid(orig_w4) | sid(reply_w4) << 16,
            created_tick: tick(orig_w4) | tick(reply_w4) << 7,
        }
    }

    /// Milliseconds since creation, modulo 2^14 ticks (262 s).
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        let now_tick = (now_ms >> TICK_SHIFT) as u32;
        ((now_tick.wrapping_sub(self.created_tick) & ((1 << TICK_BITS) - 1)) as u64) << TICK_SHIFT
    }
}

/// Absolute CLOCK_MONOTONIC milliseconds kept in 32 bits: 2-millisecond units, wrapping every
/// 99 days, read back as the time nearest to a recent one (timeouts are at most 30 days).
pub(crate) struct Clock32;

impl Clock32 {
    /// Rounds up: an entry never expires before its time.
    #[inline]
    pub fn encode(ms: u64) -> u32 {
        (ms.div_ceil(2)) as u32
    }

    /// The time `v` stands for nearest to `near_ms` (within ±49 days). The distance is taken
    /// in 32 bits and added to `near_ms`'s whole count of units: adding it to the truncated
    /// count (as before) lost the high bits, so from 2^33 ms (99.4 days) of uptime on every
    /// expiry read back 99.4 days early and every lookup found its connection expired.
    #[inline]
    pub fn decode(v: u32, near_ms: u64) -> u64 {
        let near = near_ms.div_ceil(2);
        let delta = v.wrapping_sub(near as u32) as i32 as i64;
        ((near as i64 + delta) * 2).max(0) as u64
    }

    /// `decode(v, now_ms) < now_ms` without the decode: the expiry is past exactly when its
    /// distance from now in units is negative (and never at time 0, where `decode` clamps).
    #[inline(always)]
    pub fn expired(v: u32, now_ms: u64) -> bool {
        let near = now_ms.div_ceil(2);
        now_ms != 0 && (v.wrapping_sub(near as u32) as i32) < 0
    }
}

#[cfg(test)]
mod clock32_tests {
    use super::Clock32;

    #[test]
    fn expiries_read_back_after_the_32_bit_wrap() {
        const DAY_MS: u64 = 24 * 3600 * 1000;
        // Around the first wrap (2^33 ms, 99.4 days), the second, and a year of uptime.
        for now in [
            1_000,
            1 << 33,
            (1 << 33) + 7,
            2 << 33,
            365 * DAY_MS,
            3 * (1 << 33) - 3,
        ] {
            for ahead in [0, 1, 2, 86_400_000, 30 * DAY_MS] {
                let expiry = now + ahead;
                let back = Clock32::decode(Clock32::encode(expiry), now);
                // Rounded up to the 2 ms unit: never before its time, at most 1 ms after.
                assert!(
                    back >= expiry && back <= expiry + 1,
                    "{now} + {ahead}: {back}"
                );
            }
            // Expiries in the recent past read back in the past.
            if now > 10_000 {
                let back = Clock32::decode(Clock32::encode(now - 10_000), now);
                assert!(back < now && back + 10_001 >= now, "{now} - 10 s: {back}");
            }
        }
    }

    /// `expired` is `decode(v, now) < now` for every distance around now, at time 0, near the
    /// wraps and at the half-range boundary.
    #[test]
    fn expired_is_decode_before_now() {
        for now in [
            0u64,
            1,
            2,
            3,
            1_000,
            1_001,
            (1 << 33) - 1,
            1 << 33,
            (1 << 33) + 7,
            3 << 33,
        ] {
            let near = now.div_ceil(2) as u32;
            let mut vs: Vec<u32> = (0..64u32)
                .map(|d| near.wrapping_add(d).wrapping_sub(32))
                .collect();
            for edge in [0u32, 1, u32::MAX, 1 << 31, (1 << 31) - 1, (1 << 31) + 1] {
                vs.push(edge);
                vs.push(near.wrapping_add(edge));
            }
            for v in vs {
                assert_eq!(
                    Clock32::expired(v, now),
                    Clock32::decode(v, now) < now,
                    "v {v} now {now}"
                );
            }
        }
    }
}

/// Which byte-counter word of an SCTP entry holds both directions' bytes, and which the tags.
const SCTP_BYTES: usize = 0;
const SCTP_TAGS: usize = 1;

const SLOT_EMPTY: u32 = 0;
const TOMB_BIT: u32 = 1;
/// A tombstone's epoch stamp keeps the epoch's low 31 bits (see `Index::is_safe_tomb`).
const EPOCH_MASK: u64 = (1 << 31) - 1;

/// Geometry of the 4-byte index slots: a live slot is `(tag << key_bits | (idx << 1 | dir) + 1)
/// << 1`, with as many bits of the hash as a tag as the table's size leaves room for; a tombstone
/// is `epoch << 1 | 1` (the epoch's low 31 bits).
#[derive(Clone, Copy, Debug)]
struct SlotCode {
    key_bits: u32,
    /// `(1 << key_bits) - 1`, and `63 - tag_bits` (`tag_bits`: `31 - key_bits`): what `tag`
    /// and `decode` take per probe, computed once (with the two `tag_bits == 0` branches they were about 35 instructions per
    /// packet of the established lane, over its two probes).
    key_mask: u32,
    tag_shift: u32,
}

impl SlotCode {
    fn for_capacity(capacity: usize) -> SlotCode {
        // Values 1..=2 * capacity.
        let key_bits = usize::BITS - (2 * capacity).leading_zeros();
        let key_bits = key_bits.min(31);
        let tag_bits = 31 - key_bits;
        SlotCode {
            key_bits,
            key_mask: ((1u64 << key_bits) - 1) as u32,
            tag_shift: 63 - tag_bits,
        }
    }

    /// The top `tag_bits` bits of `hash` (none: 0). Shifted in two steps so that no tag bits
    /// is a shift by 63 (every bit out), not an overflowing shift by 64.
    #[inline(always)]
    fn tag(&self, hash: u64) -> u32 {
        ((hash >> 1) >> self.tag_shift) as u32
    }

    #[inline(always)]
    fn live(&self, tag: u32, idx: u32, dir: u8) -> u32 {
        (tag << self.key_bits | ((idx << 1 | dir as u32) + 1)) << 1
    }

    /// (tag, idx, dir) of a live slot. With no tag bits `key_bits` is 31, and the 31-bit value
    /// shifted by it is 0: no branch for that case.
    #[inline(always)]
    fn decode(&self, s: u32) -> (u32, u32, u8) {
        let v = s >> 1;
        let key = (v & self.key_mask) - 1;
        (v >> self.key_bits, key >> 1, (key & 1) as u8)
    }
}

#[cfg(test)]
mod slot_code_tests {
    use super::SlotCode;

    /// The precomputed mask and shift give what the branching formulas gave (`tag_bits` 0 at
    /// 2^30 entries and above, up to 20 bits at the smallest table), and decode inverts live.
    #[test]
    fn tag_and_decode_agree_with_the_definitions() {
        for capacity in [1usize, 1024, 1_250_000, 1 << 29, 1 << 30, 1 << 31] {
            let c = SlotCode::for_capacity(capacity);
            let tag_bits = 31 - c.key_bits;
            for hash in [
                0u64,
                1,
                u64::MAX,
                0x8000_0000_0000_0000,
                0x0123_4567_89ab_cdef,
            ] {
                let tag = if tag_bits == 0 {
                    0
                } else {
                    (hash >> (64 - tag_bits)) as u32
                };
                assert_eq!(c.tag(hash), tag, "capacity {capacity} hash {hash:#x}");
                let idx = (capacity.min(1 << 29) - 1) as u32;
                for dir in [0u8, 1] {
                    assert_eq!(c.decode(c.live(tag, idx, dir)), (tag, idx, dir));
                }
            }
        }
    }
}

#[inline]
fn slot_tomb(epoch: u64) -> u32 {
    ((epoch & EPOCH_MASK) as u32) << 1 | TOMB_BIT
}

/// What `Table::prefetch_entry` saw in a probe's first index slots, for the batch's lookup: the
/// (entry, direction) the first slot with the hash's tag named, where the lookup looks first
/// (encoded as the slot's key, `(idx << 1 | dir) + 1`, below 2^31); `MISS`: the probe reached
/// an empty slot first, so no connection had the key then; `NONE`: nothing known (tombstones
/// or other tags up to the end of the home slot's line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Candidate(u32);

impl Candidate {
    pub const NONE: Candidate = Candidate(0);
    pub const MISS: Candidate = Candidate(u32::MAX);

    #[inline(always)]
    fn of(idx: u32, dir: u8) -> Candidate {
        Candidate((idx << 1 | dir as u32) + 1)
    }

    #[inline(always)]
    fn get(self) -> Option<(u32, u8)> {
        let key = self.0.checked_sub(1)?;
        Some((key >> 1, (key & 1) as u8))
    }
}

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
    pub fn proto(&self) -> u8 {
        (self.other_last >> 32) as u8
    }
}

/// A consistent copy of an entry, for listings.
#[derive(Clone, Copy, Debug)]
pub struct EntryView {
    pub idx: u32,
    pub orig: Tuple,
    pub reply: Tuple,
    pub state: u32,
    pub service_id: u32,
    pub expires_ms: u64,
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertError {
    /// No free entry even after early drop.
    Full,
    /// A live entry already holds one of the tuples (a colliding SNAT choice).
    Exists,
}

/// The fewest index slots a table gets (`Geometry::for_max_live`; a multiple of 16).
const MIN_INDEX_SLOTS: usize = 1 << 17;

/// How big a table's arrays are for a configured maximum of live entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub max_live: u32,
    /// Entries in the slab: `max_live` plus slack for entries waiting out their grace period.
    pub capacity: usize,
    /// Index slots (a multiple of 16).
    pub nslots: usize,
}

impl Geometry {
    pub fn for_max_live(max_live: u32) -> Geometry {
        let g = Geometry::before_v4(max_live);
        // A small table's index is made sparser: at least `MIN_INDEX_SLOTS` (512 KiB, a
        // quarter of this machine's L2), up to 16 slots per entry. In an index as full as the
        // rule above makes it, a third of the keys are past their home slot, and the probe's
        // branch on where the key is was a coin toss: 0.66 mispredicted branches per packet of
        // est-10k (10k flows, `maxEntries` 12,500), 0.22 with this index, which ran about 1.07x
        // as fast (docs/benchmarks.md, "est-10k waits for the index, not the entries"). Tables from about
        // 40k entries up (the default's 1M) already have that many slots: their memory per
        // connection (the budget: at most 128 bytes) is unchanged.
        let nslots = g.nslots.max(MIN_INDEX_SLOTS.min(g.capacity * 16));
        Geometry { nslots, ..g }
    }

    /// The geometry of state file layouts 2 and 3 (`persist`), whose index was always 3.2 slots
    /// per entry: a file of those versions is checked against it, then migrated.
    pub fn before_v4(max_live: u32) -> Geometry {
        let max_live = max_live.clamp(16, 1 << 29);
        // The slack only holds entries waiting out a grace period (a batch or two).
        let capacity = max_live as usize + (max_live as usize / 128).max(1024);
        // Two keys per entry; a full table fills 5/8 of the slots (linear probing then looks at
        // under two slots to find a key, four to miss: 16 slots share a cache line).
        let nslots = (capacity * 2 * 8 / 5).next_multiple_of(16);
        Geometry {
            max_live,
            capacity,
            nslots,
        }
    }

    /// Bytes of the three arrays (`Hot` entries, `Cold` entries, index slots), in that order.
    pub fn array_bytes(&self) -> [usize; 3] {
        [
            self.capacity * std::mem::size_of::<Hot>(),
            self.capacity * std::mem::size_of::<Cold>(),
            self.nslots * 4,
        ]
    }
}

/// Where a table's arrays live ([`Table::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableMemory {
    /// The mapping's length (a state file's header included).
    pub bytes: u64,
    /// Of those, in huge pages (anonymous THP, or a tmpfs mounted with `huge=`); None where
    /// `/proc/self/smaps` cannot tell.
    pub huge_page_bytes: Option<u64>,
    /// In the state file (`conntrack.stateFile`) rather than process memory.
    pub in_file: bool,
}

/// The arrays of a table, in process memory or in a state file (`persist`).
pub(crate) struct Storage {
    pub entries: Entries,
    pub slots: SharedSlice<AtomicU32>,
}

impl Storage {
    /// The arrays of `g` laid out from byte `offset` of `map` (a multiple of 64: the `Hot`
    /// records each on a cache line of their own; None otherwise).
    pub fn view(map: &Arc<Mapping>, offset: usize, g: &Geometry) -> Option<Storage> {
        if offset % 64 != 0 {
            return None;
        }
        let [hb, cb, _] = g.array_bytes();
        Some(Storage {
            entries: Entries {
                hot: map.view(offset, g.capacity)?,
                cold: map.view(offset + hb, g.capacity)?,
            },
            slots: map.view(offset + hb + cb, g.nslots)?,
        })
    }

    pub fn anonymous(g: &Geometry) -> std::io::Result<Storage> {
        let map = Mapping::anonymous(g.array_bytes().iter().sum())?;
        Ok(Storage::view(&map, 0, g).expect("the mapping is sized for the arrays"))
    }
}

/// The atomics every worker writes (the live count, the allocation heads, the scan cursors, the
/// clock) each sit on cache lines of their own (`CachePadded`): on a line shared with the
/// read-only fields every lookup reads (the arrays, the seed, the geometry), each of those writes
/// cost every other worker a cache miss on its next lookup.
pub struct Table {
    entries: Entries,
    slots: SharedSlice<AtomicU32>,
    code: SlotCode,
    seed: u64,
    /// Entries that may be live at once (the configured maximum).
    max_live: u32,
    /// Below this shared count a worker counts new connections in its own cache; at or above
    /// it, in the shared count (`max_live` less one chunk per participant, since each may hold
    /// up to a chunk's change it has not added yet): near the maximum the count is exact, so
    /// a table never stays over `max_live` once its workers have added their changes.
    cached_below: i64,
    /// The most a worker's cache takes of never-used entries at once, and keeps of its
    /// live-count change (`worker_chunk`).
    worker_chunk: u32,
    live: CachePadded<AtomicU32>,
    /// Never-used entries are handed out from here before the free list is consulted.
    next_unused: CachePadded<AtomicU32>,
    /// Treiber stack of free entries: (ABA tag << 32) | (idx + 1); low half 0 = empty.
    free_head: CachePadded<AtomicU64>,
    /// Treiber stack of chunks of `CHUNK` free entries that workers' caches gave back (linked
    /// within a chunk by `expires_or_next`, between chunks by the head's `packets(0)`).
    chunk_head: CachePadded<AtomicU64>,
    pub(crate) grace: Grace,
    scan_cursor: CachePadded<AtomicU64>,
    slot_cursor: CachePadded<AtomicU64>,
    /// Unassured entries dropped to make room (rare: an atomic is fine).
    early_drops: AtomicU64,
    /// Early-drop victims already removed from the index, waiting out their grace period: the
    /// next insert takes them from here as soon as that has passed, instead of waiting for the
    /// paced expiry scan (a SYN flood at a full table would otherwise exhaust the slack in
    /// milliseconds and refuse everything after). Bounded, allocated once.
    limbo: ArrayQueue<(u32, u64)>,
    /// Entries in the order they became droppable early: the victims, oldest first.
    drop_queue: DropQueue,
    /// The latest clock a worker has passed in (to within a second): what 32-bit expiry times
    /// are read against when no caller gives a clock (listings). Written about once a second.
    recent_ms: CachePadded<AtomicU64>,
    /// The expiry scan's period (see `SWEEP_PERIOD_MIN_MS`), set from the workers' samples.
    sweep_ms: CachePadded<AtomicU64>,
}

/// Entries a worker's cache (`Retired`) takes from or gives back to the table at once, and the
/// live-count change it keeps to itself before adding it to the shared count.
const CHUNK: u32 = 32;

/// What a worker's cache reserves of never-used entries at once, and keeps of its live-count
/// change, with several workers on a large table: `CHUNK` per 4,096 entries of capacity, at
/// least `CHUNK`, at most 8 chunks. Two workers inserting a batch of new connections each took
/// `next_unused`'s and the live count's cache lines from each other about four times per batch.
/// A small table keeps `CHUNK` exactly: a reservation counts as used, and early
/// drop looks for victims among the used entries (a reservation of 256 on every table left a
/// full 16-entry table none to find); one worker keeps it too (nobody to contend with).
fn worker_chunk(capacity: usize, participants: usize) -> u32 {
    if participants > 1 {
        (capacity / 4096).clamp(CHUNK as usize, 8 * CHUNK as usize) as u32
    } else {
        CHUNK
    }
}

/// How many entries ahead of itself the expiry scan prefetches.
const SCAN_PREFETCH: usize = 8;

/// Index slots in a cache line.
const SLOTS_PER_LINE: usize = 16;

/// Slots of a probe `prefetch_entry` looks at for the entry to prefetch (at half full, a linear
/// probe finds its key within four slots nearly always).
const PREFETCH_PROBE: usize = 4;

/// Every used entry and index slot is looked at once per sweep period (all workers together).
/// The period adapts as the kernel's conntrack garbage collector's does (Linux 5.18, "netfilter:
/// conntrack: revisit gc autotuning", and its fix "fix the gc rescheduling delay"): it is the mean
/// time the scanned entries have left, each counted at most `SWEEP_LEFT_CLAMP_MS`, within these
/// bounds. A scan that meets an entry to reclaim (killed, or expired) goes back to the shortest
/// period, and so does a table near its maximum (`sweep_period_ms`). Lookups treat an expired
/// entry as gone, so the period only decides how soon its room is reclaimed.
const SWEEP_PERIOD_MIN_MS: u64 = 1_000;
const SWEEP_PERIOD_MAX_MS: u64 = 60_000;
/// The kernel's `GC_SCAN_INTERVAL_CLAMP`: one long-lived entry does not outweigh many short ones.
const SWEEP_LEFT_CLAMP_MS: u64 = 300_000;
/// Entries a worker's scan looks at before it sets the period (`Table::sample`).
const SWEEP_SAMPLE: u32 = 1_024;

/// Index slots looked at per early drop (the kernel looks at 8 hash buckets). At most a quarter
/// of the slots are live, so this sees a few dozen entries.
const EARLY_DROP_SCAN: usize = 128;

/// Records of `drop_queue` one early drop looks at, at most, for a victim still droppable. Each
/// record is looked at once: under a flood an early drop pops about one. When a flood begins, the
/// records of the connections admitted before it (assured since, or gone) come first: this
/// bounds what one packet spends on them (256 loads of state words, tens of microseconds at
/// worst), and the sampled scan stands in until they are through (at 2^20 entries, about 4,000
/// early drops).
const DROP_QUEUE_LOOK: usize = 256;

/// Whether an entry (its state word `st`, its protocol `proto`) may be dropped early to make
/// room: live, and unassured or a TCP connection that is closing (FIN_WAIT, CLOSE_WAIT,
/// LAST_ACK, TIME_WAIT, CLOSE: the kernel's `tcp_can_early_drop`, which its garbage collector
/// applies near a full table). Closed connections otherwise hold the room for their 120 s of
/// TIME_WAIT: a full table of them refuses every new connection.
#[inline]
fn droppable(st: u32, proto: u8) -> bool {
    st & LIFE_MASK == LIFE_LIVE
        && (st & FLAG_ASSURED == 0
            || (proto == 6
                && (st & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT
                    >= super::tcp::TcpState::FinWait as u32))
}

/// Longest probe sequence before a lookup gives up: a table kept at most half full by live keys
/// stays far below it; it bounds the work of a pathological chain.
const MAX_PROBE: usize = 4096;

/// What `check_entry` makes of an entry found in a state file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// A live, well-formed connection: kept.
    Keep,
    /// Free, or ending when the file was written: nothing to keep.
    NotLive,
    /// Live and well-formed but past its expiry.
    Expired,
    /// Live but malformed (torn write, garbage): dropped and counted.
    Bad,
}

/// State bits an entry may carry: life, flags, protocol state, per-direction protocol flags.
const KNOWN_STATE_BITS: u32 = LIFE_MASK
    | FLAG_ASSURED
    | FLAG_SEEN_REPLY
    | FLAG_MASQ
    | FLAG_SINGLE_KEY
    | FLAG_BACKEND_GONE
    | PROTO_STATE_MASK
    | 0xff << DIR_FLAGS_SHIFT
    | SEQ_MASK;

/// Whether entry `e` (read from a file some other process wrote, possibly torn by a crash or
/// damaged) is a connection to keep. `max_expiry_ms`: no timeout reaches past it.
pub(crate) fn check_entry(e: EntryRef<'_>, now_ms: u64, max_expiry_ms: u64) -> Check {
    check_fields(
        e.state().load(Ordering::Relaxed),
        [0, 1].map(|d| e.key(d)),
        e.expires_or_next().load(Ordering::Relaxed),
        now_ms,
        max_expiry_ms,
    )
}

/// `check_entry` of an entry's state word, tuples (packed, stash bits cleared) and expiry word
/// (`persist` checks the entries of an older layout with it too).
pub(crate) fn check_fields(
    st: u32,
    packed: [Packed; 2],
    expires: u32,
    now_ms: u64,
    max_expiry_ms: u64,
) -> Check {
    if st & LIFE_MASK != LIFE_LIVE {
        return Check::NotLive;
    }
    if (st >> SEQ_SHIFT) & 1 == 1 || st & !KNOWN_STATE_BITS != 0 {
        return Check::Bad;
    }
    let [o, r] = packed.map(|p| Tuple::unpack(&p));
    // A packed tuple is canonical: garbage in unused bits or an unknown family does not survive
    // the round trip.
    if o.pack() != packed[0] || r.pack() != packed[1] || o.proto != r.proto || o.family != r.family
    {
        return Check::Bad;
    }
    let single = st & FLAG_SINGLE_KEY != 0;
    let proto_state = (st & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT;
    let dir_flags = (st >> DIR_FLAGS_SHIFT) & 0xff;
    let well_formed = match o.proto {
        6 => !single && (proto_state as usize) < super::tcp::STATE_COUNT,
        132 => !single && (proto_state as usize) < super::sctp::STATE_COUNT && dir_flags == 0,
        1 | 17 | 58 => !single && proto_state == 0 && dir_flags == 0,
        super::AFFINITY_PROTO => single && proto_state == 0 && dir_flags == 0,
        _ => false,
    };
    if !well_formed {
        return Check::Bad;
    }
    let expires = Clock32::decode(expires, now_ms);
    if expires > max_expiry_ms {
        return Check::Bad;
    }
    if expires < now_ms {
        return Check::Expired;
    }
    Check::Keep
}

/// What `Table::rebuild` found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RebuildCounts {
    pub kept: u64,
    pub expired: u64,
    /// Malformed entries, and duplicates of a key another entry already holds.
    pub dropped: u64,
}

impl Table {
    /// `max_live` live entries; a little slack on top holds entries waiting out their grace period.
    /// In process memory.
    pub fn new(max_live: u32, participants: usize, seed: u64) -> Table {
        let g = Geometry::for_max_live(max_live);
        let storage = Storage::anonymous(&g).expect("allocating the conntrack table");
        Table::with_storage(g, storage, participants, seed)
    }

    /// A table over `storage` (zeroed, or holding entries `rebuild` must then check).
    pub(crate) fn with_storage(
        g: Geometry,
        storage: Storage,
        participants: usize,
        seed: u64,
    ) -> Table {
        let worker_chunk = worker_chunk(g.capacity, participants);
        Table {
            entries: storage.entries,
            code: SlotCode::for_capacity(g.capacity),
            slots: storage.slots,
            seed: seed | 1,
            max_live: g.max_live,
            cached_below: g.max_live as i64 - (worker_chunk as usize * participants.max(1)) as i64,
            worker_chunk,
            live: CachePadded::new(AtomicU32::new(0)),
            next_unused: CachePadded::new(AtomicU32::new(0)),
            free_head: CachePadded::new(AtomicU64::new(0)),
            chunk_head: CachePadded::new(AtomicU64::new(0)),
            grace: Grace::new(participants),
            scan_cursor: CachePadded::new(AtomicU64::new(0)),
            slot_cursor: CachePadded::new(AtomicU64::new(0)),
            early_drops: AtomicU64::new(0),
            limbo: ArrayQueue::new(g.capacity - g.max_live as usize),
            drop_queue: DropQueue::new(g.capacity, g.max_live),
            recent_ms: CachePadded::new(AtomicU64::new(0)),
            sweep_ms: CachePadded::new(AtomicU64::new(SWEEP_PERIOD_MIN_MS)),
        }
    }

    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Rebuilds everything derived from the entries, before any worker runs: checks every
    /// entry (`check_entry`), frees the rest, indexes the kept ones afresh, and rebuilds the
    /// free list, the never-used mark and the live count. Whatever the index held is ignored (a
    /// process killed mid-insert may have left it half-written).
    pub(crate) fn rebuild(&mut self, now_ms: u64, max_expiry_ms: u64) -> RebuildCounts {
        *self.recent_ms.get_mut() = now_ms;
        for s in self.slots.iter() {
            s.store(SLOT_EMPTY, Ordering::Relaxed);
        }
        let mut counts = RebuildCounts::default();
        let mut high = 0usize;
        for idx in 0..self.entries.len() {
            let e = self.entries.at(idx);
            let verdict = check_entry(e, now_ms, max_expiry_ms);
            let keep = verdict == Check::Keep && {
                let single = e.state().load(Ordering::Relaxed) & FLAG_SINGLE_KEY != 0;
                let (po, pr) = (e.key(0), e.key(1));
                let (ho, hr) = (self.hash(&po), self.hash(&pr));
                let taken = self.lookup(&po, ho, now_ms).is_some()
                    || (!single && (po == pr || self.lookup(&pr, hr, now_ms).is_some()));
                if !taken {
                    if !single {
                        self.index_from(hr, self.home(hr), idx as u32, DIR_REPLY);
                    }
                    self.index_from(ho, self.home(ho), idx as u32, DIR_ORIG);
                }
                !taken
            };
            match verdict {
                _ if keep => {
                    counts.kept += 1;
                    high = idx + 1;
                }
                Check::Keep | Check::Bad => counts.dropped += 1,
                Check::Expired => counts.expired += 1,
                Check::NotLive => {}
            }
            if !keep {
                // Free, with an even sequence number (a torn insert left it odd).
                let st = e.state().load(Ordering::Relaxed);
                let seq = (st >> SEQ_SHIFT).wrapping_add((st >> SEQ_SHIFT) & 1);
                e.state()
                    .store(seq << SEQ_SHIFT | LIFE_FREE, Ordering::Relaxed);
            }
        }
        // Free entries below the mark, lowest first out; the rest is handed out as never used.
        let mut head = 0u64;
        for idx in (0..high).rev() {
            let e = self.entries.at(idx);
            if e.state().load(Ordering::Relaxed) & LIFE_MASK == LIFE_FREE {
                e.expires_or_next().store(head as u32, Ordering::Relaxed);
                head = idx as u64 + 1;
            }
        }
        *self.free_head.get_mut() = head;
        *self.next_unused.get_mut() = high as u32;
        // The order the connections became droppable in is not in the file: slab order.
        for idx in 0..high {
            let e = self.entries.at(idx);
            let st = e.state().load(Ordering::Relaxed);
            if droppable(st, e.proto()) {
                self.drop_queue
                    .push(idx as u32, (st & SEQ_MASK) >> SEQ_SHIFT, false);
            }
        }
        *self.live.get_mut() = counts.kept as u32;
        counts
    }

    pub fn early_drops(&self) -> u64 {
        self.early_drops.load(Ordering::Relaxed)
    }

    pub fn live(&self) -> u32 {
        self.live.load(Ordering::Relaxed)
    }

    /// The memory the table's arrays live in (one mapping: anonymous, or the state file's), and
    /// how much of it the kernel backs with huge pages now.
    pub fn memory(&self) -> TableMemory {
        let map = self.slots.mapping();
        TableMemory {
            bytes: map.len() as u64,
            huge_page_bytes: map.huge_page_bytes(),
            in_file: map.is_file(),
        }
    }

    #[inline]
    pub fn hash(&self, p: &Packed) -> u64 {
        hash_packed(p, self.seed)
    }

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

    /// The index slot a probe for `hash` starts at (multiply-shift: the index need not be a
    /// power of two).
    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        ((hash as u32 as u64 * self.slots.len() as u64) >> 32) as usize
    }

    #[inline(always)]
    fn next_slot(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
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
    fn read_if_match(&self, idx: u32, dir: u8, key: &Packed, out: &mut Found) -> bool {
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

    /// Whether a live entry holds `key` (used to keep SNAT choices unique).
    #[inline]
    pub fn contains(&self, key: &Packed) -> bool {
        self.lookup(key, self.hash(key), 0).is_some()
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

    /// An assured TCP connection `idx` started closing (its state word now `state`): it joins
    /// the early-drop victims, behind those already waiting (the kernel's `tcp_can_early_drop`:
    /// a closing connection may go to make room).
    pub fn note_closing(&self, idx: u32, state: u32) {
        self.drop_queue
            .push(idx, (state & SEQ_MASK) >> SEQ_SHIFT, false);
    }

    /// Puts (`idx`, `dir`) in the first free slot of `hash`'s probe from slot `from` (its home,
    /// or a vacancy found on it).
    fn index_from(&self, hash: u64, from: usize, idx: u32, dir: u8) {
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

    /// Adds a worker's live-count change to the shared count once it reaches `worker_chunk` (or
    /// always, with `now`): one shared write per `worker_chunk` new connections.
    fn flush_live(&self, c: &mut Retired, now: bool) {
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
    fn flush_admitted(&self, c: &mut Retired) {
        self.drop_queue.push_records(&c.admitted);
        c.admitted.clear();
    }

    /// A free entry for a worker: from its own cache, else a chunk from the table (one shared
    /// atomic per `CHUNK` entries), else the shared paths.
    fn alloc_cached(&self, c: &mut Retired) -> Option<u32> {
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
    fn free_cached(&self, c: &mut Retired, idx: u32) {
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

    fn alloc(&self) -> Option<u32> {
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
    fn recycle(&self, idx: u32) -> u32 {
        let e = self.entries.at(idx as usize);
        let st = e.state().load(Ordering::Relaxed);
        let seq = ((st >> SEQ_SHIFT).wrapping_add(2) & 0xfe) << SEQ_SHIFT;
        e.state().store(seq | (st & !SEQ_MASK), Ordering::Release);
        idx
    }

    /// A retired entry that found no room in the limbo queue: marked dying again, so that the
    /// expiry scan retires it (unindexing twice is harmless: its slots are already tombstones).
    fn fall_back_to_scan(&self, idx: u32) {
        let e = self.entries.at(idx as usize);
        let cur = e.state().load(Ordering::Acquire);
        e.state()
            .store((cur & !LIFE_MASK) | LIFE_DYING, Ordering::Release);
    }

    /// Makes a live entry invisible (one caller wins); the expiry scan then retires it.
    pub fn kill(&self, idx: u32) -> bool {
        let killed = self.kill_uncounted(idx);
        if killed {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        killed
    }

    /// `kill`, leaving the live count to the caller.
    fn kill_uncounted(&self, idx: u32) -> bool {
        let e = self.entries.at(idx as usize);
        let mut cur = e.state().load(Ordering::Acquire);
        loop {
            if cur & LIFE_MASK != LIFE_LIVE {
                return false;
            }
            let new = (cur & !LIFE_MASK) | LIFE_DYING;
            match e
                .state()
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// Early drop (as the kernel's): removes one droppable entry (`droppable`: unassured, or a
    /// closing TCP connection) and frees it for the caller's insert at once (see `limbo`).
    ///
    /// The victim is the entry that became droppable first (`drop_queue`), beyond the kernel,
    /// which takes the first it meets in a few hash buckets: under a flood every handshake then
    /// has the time the flood needs to turn over all the droppable room, rather than the odds
    /// of a draw at every new connection. A handshake its server answered (SEEN_REPLY, not yet
    /// assured) is put back once at the tail: it is about to be assured, a bare SYN may never
    /// be. When the queue has nothing (its records all stale, or lapped), a sample of the
    /// index near `hint`, then of the slab, gives its oldest droppable entry.
    fn early_drop(&self, hint: u64, now_ms: u64) -> bool {
        for _attempt in 0..4 {
            let Some(idx) = self
                .oldest_droppable()
                .or_else(|| self.sampled_droppable(hint, now_ms))
            else {
                return false;
            };
            // The victim's place in the live count goes to the caller's connection.
            if self.kill_uncounted(idx) {
                self.early_drops.fetch_add(1, Ordering::Relaxed);
                self.retire_now(idx);
                return true;
            }
            // Another worker took this one: look again.
        }
        false
    }

    /// The entry that became droppable first and still is, from `drop_queue` (stale records
    /// skipped, at most `DROP_QUEUE_LOOK` of them per call).
    fn oldest_droppable(&self) -> Option<u32> {
        for _ in 0..DROP_QUEUE_LOOK {
            let rec = self.drop_queue.pop()?;
            let Some(e) = self.entries.get(rec.idx as usize) else {
                continue;
            };
            let st = e.state().load(Ordering::Acquire);
            let seq = (st & SEQ_MASK) >> SEQ_SHIFT;
            if !self.drop_queue.seq_matches(&rec, seq) || !droppable(st, e.proto()) {
                continue;
            }
            if st & (FLAG_ASSURED | FLAG_SEEN_REPLY) == FLAG_SEEN_REPLY && !rec.second_chance {
                self.drop_queue.push(rec.idx, seq, true);
                continue;
            }
            return Some(rec.idx);
        }
        None
    }

    /// The oldest droppable entry of `EARLY_DROP_SCAN` index slots from `hint`'s (by creation
    /// time, to 16 ms), else the first of the slab from `hint` on.
    fn sampled_droppable(&self, hint: u64, now_ms: u64) -> Option<u32> {
        // Walk the index from the hint's slot, as the kernel walks hash buckets from the new
        // tuple's: the index holds live entries only, whatever their place in the slab.
        let mut victim = None;
        let mut oldest_age = 0u64;
        let mut i = self.home(hint);
        for _ in 0..EARLY_DROP_SCAN {
            let s = self.slots[i].load(Ordering::Acquire);
            i = self.next_slot(i);
            if s == SLOT_EMPTY || s & TOMB_BIT != 0 {
                continue;
            }
            let (_, idx, _) = self.code.decode(s);
            let e = self.entries.at(idx as usize);
            if !droppable(e.state().load(Ordering::Acquire), e.proto()) {
                continue;
            }
            let age = e.stash().age_ms(now_ms);
            if victim.is_none() || age > oldest_age {
                victim = Some(idx);
                oldest_age = age;
            }
        }
        // A small table spreads its few entries thinly over the index: then the slab.
        victim.or_else(|| self.droppable_in_slab(hint))
    }

    /// The first droppable entry of the slab from `hint` on (a bounded look).
    fn droppable_in_slab(&self, hint: u64) -> Option<u32> {
        let n = (self.next_unused.load(Ordering::Relaxed) as usize).clamp(1, self.entries.len());
        let start = hint as usize % n;
        (0..EARLY_DROP_SCAN.min(n))
            .map(|k| ((start + k) % n) as u32)
            .find(|&idx| {
                let s = self
                    .entries
                    .at(idx as usize)
                    .state()
                    .load(Ordering::Acquire);
                droppable(s, self.entries.at(idx as usize).proto())
            })
    }

    /// Unindexes a just-killed entry and queues it for reuse after the grace period.
    fn retire_now(&self, idx: u32) {
        if !self.claim_retire(idx) {
            return; // the expiry scan got there first; it recycles the entry
        }
        // Advancing here keeps victims flowing back under a flood even when the expiry scan has
        // nothing to do (it is what moves the epoch otherwise).
        let epoch = self.grace.try_advance();
        self.unindex(idx, epoch);
        if self.limbo.push((idx, epoch)).is_err() {
            self.fall_back_to_scan(idx);
        }
    }

    /// Updates state bits of a live entry with `f` (compare-and-swap loop); returns the new state,
    /// or None when the entry is no longer live.
    #[inline]
    pub fn update_state(&self, idx: u32, f: impl Fn(u32) -> u32) -> Option<u32> {
        let e = self.entries.at(idx as usize);
        let mut cur = e.state().load(Ordering::Acquire);
        loop {
            if cur & LIFE_MASK != LIFE_LIVE {
                return None;
            }
            let new = (f(cur & !SEQ_MASK) & !LIFE_MASK & !SEQ_MASK) | LIFE_LIVE | (cur & SEQ_MASK);
            if new == cur {
                return Some(cur & !SEQ_MASK);
            }
            match e
                .state()
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(new & !SEQ_MASK),
                Err(c) => cur = c,
            }
        }
    }

    /// SCTP verification tags (`sctp::pack_tags`), kept in an SCTP entry's second byte counter.
    #[inline]
    pub fn tags(&self, idx: u32) -> u64 {
        self.entries
            .at(idx as usize)
            .bytes(SCTP_TAGS)
            .load(Ordering::Acquire)
    }

    pub fn set_tags(&self, idx: u32, tags: u64) {
        self.entries
            .at(idx as usize)
            .bytes(SCTP_TAGS)
            .store(tags, Ordering::Release);
    }

    /// Replaces the tags if they are still `old`.
    pub fn swap_tags(&self, idx: u32, old: u64, new: u64) -> bool {
        self.entries
            .at(idx as usize)
            .bytes(SCTP_TAGS)
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Milliseconds since the entry was created, modulo 262 s (16-ms ticks: see `Stash`).
    pub fn age_ms(&self, idx: u32, now_ms: u64) -> u64 {
        self.entries.at(idx as usize).stash().age_ms(now_ms)
    }

    #[inline]
    pub fn set_expires(&self, idx: u32, expires_ms: u64) {
        store_expiry(self.entries.at(idx as usize), Clock32::encode(expires_ms));
    }

    /// The fast lane's state read, expiry refresh and count (`Conntrack::on_plain_packet`), on
    /// one entry found once (one bounds check; the read and the refresh were two functions
    /// finding it twice). If entry `idx` is live, `expiry_for` gets its state word (sequence
    /// number cleared) and gives the expiry (`Clock32`) to store, or None to leave the entry as
    /// it is (then None is returned). The expiry is stored only when it changed (within one
    /// clock tick it has not, and an unchanged line is not dirtied); the packet is counted in
    /// direction `dir`. Returns the state word.
    #[inline(always)]
    pub fn touch_if_live(
        &self,
        idx: u32,
        dir: u8,
        bytes: u64,
        expiry_for: impl FnOnce(u32) -> Option<u32>,
    ) -> Option<u32> {
        let e = self.entries.get(idx as usize)?;
        let st = e.state().load(Ordering::Acquire);
        if st & LIFE_MASK != LIFE_LIVE {
            return None;
        }
        let state = st & !SEQ_MASK;
        let expires = expiry_for(state)?;
        store_expiry(e, expires);
        count_packet_bytes(e, dir as usize & 1, bytes);
        Some(state)
    }

    /// Counts a packet of `bytes` in direction `dir` (not SCTP: see `count_sctp`).
    #[inline]
    pub fn count(&self, idx: u32, dir: u8, bytes: u64) {
        count_packet_bytes(self.entries.at(idx as usize), dir as usize & 1, bytes);
    }

    /// Counts an SCTP packet: both directions' bytes share one word (32 bits each, wrapping),
    /// the other holds the verification tags.
    #[inline]
    pub fn count_sctp(&self, idx: u32, dir: u8, bytes: u64) {
        let e = self.entries.at(idx as usize);
        let d = dir as usize & 1;
        count_packet(e, d);
        let w = e.bytes(SCTP_BYTES);
        let cur = w.load(Ordering::Relaxed);
        let shift = 32 * d as u32;
        let half = ((cur >> shift) as u32).wrapping_add(bytes as u32) as u64;
        w.store(
            (cur & !(0xffff_ffff << shift)) | half << shift,
            Ordering::Relaxed,
        );
    }

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

    fn claim_retire(&self, idx: u32) -> bool {
        let e = self.entries.at(idx as usize);
        let cur = e.state().load(Ordering::Acquire);
        cur & LIFE_MASK == LIFE_DYING
            && e.state()
                .compare_exchange(
                    cur,
                    (cur & !LIFE_MASK) | LIFE_RETIRED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Replaces the entry's index slots by tombstones stamped with `epoch`.
    fn unindex(&self, idx: u32, epoch: u64) {
        let e = self.entries.at(idx as usize);
        let single = e.state().load(Ordering::Acquire) & FLAG_SINGLE_KEY != 0;
        for dir in [DIR_ORIG, DIR_REPLY] {
            if single && dir == DIR_REPLY {
                continue;
            }
            let key = e.key(dir as usize);
            let hash = self.hash(&key);
            let want = self.code.live(self.code.tag(hash), idx, dir);
            let mut i = self.home(hash);
            for _ in 0..self.slots.len() {
                let s = self.slots[i].load(Ordering::Acquire);
                if s == SLOT_EMPTY {
                    break;
                }
                if s == want {
                    let _ = self.slots[i].compare_exchange(
                        s,
                        slot_tomb(epoch),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    break;
                }
                i = self.next_slot(i);
            }
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

    /// Notes a clock a worker passed in (see `recent_ms`): a shared write about once a second.
    #[inline]
    fn note_clock(&self, now_ms: u64) {
        if now_ms >= self.recent_ms.load(Ordering::Relaxed) + 1_000 {
            self.recent_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    /// Whether a tombstone's (31-bit) epoch stamp is past its grace period: stamps are never
    /// from the future, and a tombstone is cleared within seconds, long before 2^31 epochs.
    fn tomb_is_safe(&self, s: u32) -> bool {
        let stamp = (s >> 1) as u64;
        (self.grace.epoch().wrapping_sub(stamp) & EPOCH_MASK) >= 2
    }

    /// A consistent copy of entry `idx` if it is live.
    pub fn view(&self, idx: u32) -> Option<EntryView> {
        let e = self.entries.get(idx as usize)?;
        loop {
            let st1 = e.state().load(Ordering::Acquire);
            if (st1 >> SEQ_SHIFT) & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            if st1 & LIFE_MASK != LIFE_LIVE {
                return None;
            }
            let orig = e.key(0);
            let reply = e.key(1);
            let stash = e.stash();
            std::sync::atomic::fence(Ordering::Acquire);
            let state = e.state().load(Ordering::Acquire);
            if (state ^ st1) & SEQ_MASK != 0 {
                continue;
            }
            if state & LIFE_MASK != LIFE_LIVE {
                return None;
            }
            let orig = Tuple::unpack(&orig);
            let packets = [0, 1].map(|d| e.packets(d).load(Ordering::Relaxed) as u64);
            let bytes = if orig.proto == 132 {
                let w = e.bytes(SCTP_BYTES).load(Ordering::Relaxed);
                [w & 0xffff_ffff, w >> 32]
            } else {
                [0, 1].map(|d| e.bytes(d).load(Ordering::Relaxed))
            };
            return Some(EntryView {
                idx,
                orig,
                reply: Tuple::unpack(&reply),
                state: state & !SEQ_MASK,
                service_id: stash.service_id,
                expires_ms: Clock32::decode(
                    e.expires_or_next().load(Ordering::Relaxed),
                    self.recent_ms.load(Ordering::Relaxed),
                ),
                packets,
                bytes,
            });
        }
    }

    /// Every live entry, one at a time, without stopping anyone (streams; holds nothing).
    pub fn iter(&self) -> impl Iterator<Item = EntryView> + '_ {
        let used = (self.next_unused.load(Ordering::Relaxed) as usize).min(self.entries.len());
        (0..used as u32).filter_map(move |i| self.view(i))
    }
}

/// A worker's entries waiting out their grace period. Preallocated: maintenance never grows it.
///
/// Also the worker's allocation cache: free entries and never-used ones it took from the table in
/// chunks, and the change to the live count it has not yet added to the shared one (added at
/// every maintenance step), so that a new connection takes no shared atomic. Entries
/// in the cache of a worker that stops stay unused until the next start (at most `2 * CHUNK`).
pub struct Retired {
    items: Vec<(u32, u64)>,
    free: Vec<u32>,
    /// Never-used entries `.0..1` reserved for this worker.
    unused: (u32, u32),
    pending_live: i64,
    /// Early-drop records of this worker's new connections not yet pushed (`fifo`).
    admitted: Vec<u32>,
    /// The clock at the previous maintenance step, and the scan work it has earned since.
    last_ms: u64,
    entry_credit: u64,
    slot_credit: u64,
    /// What this worker's scan met since it last set the sweep period.
    sample: SweepSample,
}

/// A sample of the expiry scan (`Table::sample`): how many entries, the sum of the time they
/// had left (each clamped), and whether one of them was to be reclaimed.
#[derive(Clone, Copy, Debug, Default)]
struct SweepSample {
    n: u32,
    left_ms: u64,
    reclaimed: bool,
}

impl Retired {
    pub fn with_capacity(n: usize) -> Retired {
        Retired {
            items: Vec::with_capacity(n),
            free: Vec::with_capacity(2 * CHUNK as usize),
            unused: (0, 0),
            pending_live: 0,
            admitted: Vec::with_capacity(CHUNK as usize),
            last_ms: 0,
            entry_credit: 0,
            slot_credit: 0,
            sample: SweepSample::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// Stores entry `e`'s expiry word `v` unless it is already there: an unchanged line is not
/// dirtied.
#[inline(always)]
fn store_expiry(e: EntryRef<'_>, v: u32) {
    if e.expires_or_next().load(Ordering::Relaxed) != v {
        e.expires_or_next().store(v, Ordering::Relaxed);
    }
}

/// One more packet of `bytes` in direction `d` of entry `e` (not SCTP: see `count_sctp`).
#[inline(always)]
fn count_packet_bytes(e: EntryRef<'_>, d: usize, bytes: u64) {
    count_packet(e, d);
    e.bytes(d).store(
        e.bytes(d).load(Ordering::Relaxed) + bytes,
        Ordering::Relaxed,
    );
}

/// One more packet in direction `d` of entry `e` (a plain load and store, as the other
/// counters: statistics, not worth a locked add per packet).
#[inline(always)]
fn count_packet(e: EntryRef<'_>, d: usize) {
    e.packets(d).store(
        e.packets(d).load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

#[cfg(test)]
mod sweep_tests {
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
