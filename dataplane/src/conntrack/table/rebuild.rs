//! A table over a state file another process wrote: each entry checked (`check_entry`), the
//! kept ones indexed afresh, and everything else derived from the entries rebuilt.

use std::sync::atomic::Ordering;

use kxdp_packet::IpProto;

use super::super::tuple::{Packed, Tuple};
use super::clock32::Clock32;
use super::early_drop::droppable;
use super::entry::EntryRef;
use super::shared::Table;
use super::slot::SLOT_EMPTY;
use super::state::{
    DIR_FLAGS_SHIFT, DIR_ORIG, DIR_REPLY, FLAG_ASSURED, FLAG_BACKEND_GONE, FLAG_MASQ,
    FLAG_SEEN_REPLY, FLAG_SINGLE_KEY, LIFE_FREE, LIFE_LIVE, LIFE_MASK, PROTO_STATE_MASK,
    PROTO_STATE_SHIFT, SEQ_MASK, SEQ_SHIFT,
};

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
        IpProto::TCP => !single && (proto_state as usize) < super::super::tcp::STATE_COUNT,
        IpProto::SCTP => {
            !single && (proto_state as usize) < super::super::sctp::STATE_COUNT && dir_flags == 0
        }
        IpProto::ICMP | IpProto::UDP | IpProto::ICMPV6 => {
            !single && proto_state == 0 && dir_flags == 0
        }
        super::super::AFFINITY_PROTO => single && proto_state == 0 && dir_flags == 0,
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
}
