//! An entry's state word (`Hot`'s `w32[0]`): its life cycle, flags, protocol state and the
//! sequence number of its seqlock, each in bits of their own.

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
