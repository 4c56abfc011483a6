//! One entry's record: the `Hot` and `Cold` layouts, how a tuple is kept in their words, and
//! the fields stashed in the tuples' spare bits (`Stash`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use kxdp_kernel::shm::{AtomicRecord, SharedSlice};
use kxdp_packet::IpProto;

use super::super::tuple::{addr_word, Packed};

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
pub(super) const FAMILY_V6_BIT: u64 = 1 << 40;
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
pub(super) fn is_v4(p: &Packed) -> bool {
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
pub(super) fn join_tuple(addrs: u64, last: u64, rest: [u64; 3]) -> Packed {
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
    pub(super) fn proto(&self) -> IpProto {
        IpProto((self.last_word(0).load(Ordering::Relaxed) >> 32) as u8)
    }
    #[inline(always)]
    pub(super) fn last_word(&self, dir: usize) -> &'a AtomicU64 {
        &self.hot.w64[2 * (dir & 1) + 1]
    }
    #[inline(always)]
    pub(super) fn addr_word(&self, dir: usize) -> &'a AtomicU64 {
        &self.hot.w64[2 * (dir & 1)]
    }

    /// Tuple `dir`'s words in `Cold` (IPv6 only).
    #[inline(always)]
    fn cold_words(&self, dir: usize) -> &'a [AtomicU64] {
        &self.cold().w64[3 * (dir & 1)..3 * (dir & 1) + 3]
    }

    /// Tuple `dir`'s `Cold` words, loaded (IPv6 only).
    #[inline(always)]
    pub(super) fn load_cold(&self, dir: usize) -> [u64; 3] {
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
    pub(super) fn holds(&self, dir: usize, key: &Packed) -> bool {
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
    pub(super) fn prefetch(&self, v6: bool) {
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
