//! What a packet of a known connection changes in its entry: the state word, the expiry, the
//! counters, and an SCTP entry's verification tags.

use std::sync::atomic::Ordering;

use super::clock32::Clock32;
use super::entry::EntryRef;
use super::shared::Table;
use super::state::{LIFE_LIVE, LIFE_MASK, SEQ_MASK};

/// Which byte-counter word of an SCTP entry holds both directions' bytes, and which the tags.
pub(super) const SCTP_BYTES: usize = 0;
const SCTP_TAGS: usize = 1;

impl Table {
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

    /// The packets entry `idx` has counted in direction `dir`.
    pub fn packets(&self, idx: u32, dir: u8) -> u32 {
        self.entries
            .at(idx as usize)
            .packets(dir as usize)
            .load(Ordering::Relaxed)
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

    /// Counts `packets` packets of `bytes` in all in direction `dir` (not SCTP).
    pub fn count_many(&self, idx: u32, dir: u8, packets: u32, bytes: u64) {
        count_packets_bytes(
            self.entries.at(idx as usize),
            dir as usize & 1,
            packets,
            bytes,
        );
    }

    /// Counts an SCTP packet: both directions' bytes share one word (32 bits each, wrapping),
    /// the other holds the verification tags.
    #[inline]
    pub fn count_sctp(&self, idx: u32, dir: u8, bytes: u64) {
        let e = self.entries.at(idx as usize);
        let d = dir as usize & 1;
        count_packets(e, d, 1);
        let w = e.bytes(SCTP_BYTES);
        let cur = w.load(Ordering::Relaxed);
        let shift = 32 * d as u32;
        let half = ((cur >> shift) as u32).wrapping_add(bytes as u32) as u64;
        w.store(
            (cur & !(0xffff_ffff << shift)) | half << shift,
            Ordering::Relaxed,
        );
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
    count_packets_bytes(e, d, 1, bytes);
}

/// `packets` more packets of `bytes` in all in direction `d` of entry `e` (not SCTP).
#[inline(always)]
fn count_packets_bytes(e: EntryRef<'_>, d: usize, packets: u32, bytes: u64) {
    count_packets(e, d, packets);
    e.bytes(d).store(
        e.bytes(d).load(Ordering::Relaxed) + bytes,
        Ordering::Relaxed,
    );
}

/// `n` more packets in direction `d` of entry `e` (a plain load and store, as the other
/// counters: statistics, not worth a locked add per packet).
#[inline(always)]
fn count_packets(e: EntryRef<'_>, d: usize, n: u32) {
    e.packets(d).store(
        e.packets(d).load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}
