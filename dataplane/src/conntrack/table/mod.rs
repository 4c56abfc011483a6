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
//!
//! The files, in the order a connection's data meets them:
//! - what is stored: `state` (an entry's state word), `entry` (the `Hot` and `Cold` records and
//!   how a tuple is kept in them), `clock32` (the expiry's 32-bit clock), `slot` (the index's
//!   slots), `storage` (the arrays' sizes and memory), `shared` (the `Table` and its shared
//!   counters), `worker_cache` (a worker's own part: `Retired`), `sweep_pacing`;
//! - a packet's path: `lookup` (probe, prefetch, `Found`), `insert` (a new connection),
//!   `alloc` (its entry, and where freed entries go back), `update` (state, expiry, counters of
//!   a known connection);
//! - a connection's end: `removal` (kill, unindex), `early_drop` (room in a full table),
//!   `sweep` (the expiry scan, which recycles entries after the grace period);
//! - off the packet path: `rebuild` (a table over a state file, checked), `listing`.
//!
//! No file imports this one: each takes what it needs from the files below it in that order.

mod alloc;
mod clock32;
mod early_drop;
mod entry;
mod insert;
mod listing;
mod lookup;
mod rebuild;
mod removal;
mod shared;
mod slot;
mod state;
mod storage;
mod sweep;
mod sweep_pacing;
mod update;
mod worker_cache;

pub(crate) use clock32::Clock32;
pub(crate) use entry::{Cold, EntryRef, Hot, KEY_MASK};
pub use insert::InsertError;
pub use listing::EntryView;
pub use lookup::Found;
pub(crate) use rebuild::{check_entry, check_fields, Check};
pub use shared::Table;
pub use slot::Candidate;
pub(crate) use state::{
    DIR_FLAGS_SHIFT, FLAG_SINGLE_KEY, LIFE_LIVE, LIFE_MASK, PROTO_STATE_MASK, PROTO_STATE_SHIFT,
    SEQ_MASK,
};
pub use state::{DIR_ORIG, DIR_REPLY, FLAG_ASSURED, FLAG_BACKEND_GONE, FLAG_MASQ, FLAG_SEEN_REPLY};
pub use storage::TableMemory;
pub(crate) use storage::{Geometry, Storage};
pub use worker_cache::Retired;
