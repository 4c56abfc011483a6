//! The `Table` itself: its arrays, the counters, heads and cursors its workers share, and its
//! construction. The operations are in the files named after them (`lookup`, `insert`, ...).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam::queue::ArrayQueue;
use crossbeam::utils::CachePadded;
use kxdp_kernel::shm::SharedSlice;

use super::super::fifo::DropQueue;
use super::super::grace::Grace;
use super::super::tuple::{hash_packed, Packed};
use super::entry::Entries;
use super::slot::SlotCode;
use super::storage::{Geometry, Storage, TableMemory};
use super::sweep_pacing::SWEEP_PERIOD_MIN_MS;
use super::worker_cache::worker_chunk;

/// The atomics every worker writes (the live count, the allocation heads, the scan cursors, the
/// clock) each sit on cache lines of their own (`CachePadded`): on a line shared with the
/// read-only fields every lookup reads (the arrays, the seed, the geometry), each of those writes
/// cost every other worker a cache miss on its next lookup.
pub struct Table {
    pub(super) entries: Entries,
    pub(super) slots: SharedSlice<AtomicU32>,
    pub(super) code: SlotCode,
    pub(super) seed: u64,
    /// Entries that may be live at once (the configured maximum).
    pub(super) max_live: u32,
    /// Below this shared count a worker counts new connections in its own cache; at or above
    /// it, in the shared count (`max_live` less one chunk per participant, since each may hold
    /// up to a chunk's change it has not added yet): near the maximum the count is exact, so
    /// a table never stays over `max_live` once its workers have added their changes.
    pub(super) cached_below: i64,
    /// The most a worker's cache takes of never-used entries at once, and keeps of its
    /// live-count change (`worker_chunk`).
    pub(super) worker_chunk: u32,
    pub(super) live: CachePadded<AtomicU32>,
    /// Never-used entries are handed out from here before the free list is consulted.
    pub(super) next_unused: CachePadded<AtomicU32>,
    /// Treiber stack of free entries: (ABA tag << 32) | (idx + 1); low half 0 = empty.
    pub(super) free_head: CachePadded<AtomicU64>,
    /// Treiber stack of chunks of `CHUNK` free entries that workers' caches gave back (linked
    /// within a chunk by `expires_or_next`, between chunks by the head's `packets(0)`).
    pub(super) chunk_head: CachePadded<AtomicU64>,
    pub(crate) grace: Grace,
    pub(super) scan_cursor: CachePadded<AtomicU64>,
    pub(super) slot_cursor: CachePadded<AtomicU64>,
    /// Unassured entries dropped to make room (rare: an atomic is fine).
    pub(super) early_drops: AtomicU64,
    /// Early-drop victims already removed from the index, waiting out their grace period: the
    /// next insert takes them from here as soon as that has passed, instead of waiting for the
    /// paced expiry scan (a SYN flood at a full table would otherwise exhaust the slack in
    /// milliseconds and refuse everything after). Bounded, allocated once.
    pub(super) limbo: ArrayQueue<(u32, u64)>,
    /// Entries in the order they became droppable early: the victims, oldest first.
    pub(super) drop_queue: DropQueue,
    /// The latest clock a worker has passed in (to within a second): what 32-bit expiry times
    /// are read against when no caller gives a clock (listings). Written about once a second.
    pub(super) recent_ms: CachePadded<AtomicU64>,
    /// The expiry scan's period (see `SWEEP_PERIOD_MIN_MS`), set from the workers' samples.
    pub(super) sweep_ms: CachePadded<AtomicU64>,
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

    /// The index slot a probe for `hash` starts at (multiply-shift: the index need not be a
    /// power of two).
    #[inline(always)]
    pub(super) fn home(&self, hash: u64) -> usize {
        ((hash as u32 as u64 * self.slots.len() as u64) >> 32) as usize
    }

    #[inline(always)]
    pub(super) fn next_slot(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// Notes a clock a worker passed in (see `recent_ms`): a shared write about once a second.
    #[inline]
    pub(super) fn note_clock(&self, now_ms: u64) {
        if now_ms >= self.recent_ms.load(Ordering::Relaxed) + 1_000 {
            self.recent_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }
}
