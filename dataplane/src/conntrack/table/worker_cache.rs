//! A worker's own part of the table (`Retired`): its entries waiting out their grace period,
//! and its allocation cache, which lets a new connection take no shared atomic.

use super::sweep_pacing::SweepSample;

/// Entries a worker's cache (`Retired`) takes from or gives back to the table at once, and the
/// live-count change it keeps to itself before adding it to the shared count.
pub(super) const CHUNK: u32 = 32;

/// What a worker's cache reserves of never-used entries at once, and keeps of its live-count
/// change, with several workers on a large table: `CHUNK` per 4,096 entries of capacity, at
/// least `CHUNK`, at most 8 chunks. Two workers inserting a batch of new connections each took
/// `next_unused`'s and the live count's cache lines from each other about four times per batch.
/// A small table keeps `CHUNK` exactly: a reservation counts as used, and early
/// drop looks for victims among the used entries (a reservation of 256 on every table left a
/// full 16-entry table none to find); one worker keeps it too (nobody to contend with).
pub(super) fn worker_chunk(capacity: usize, participants: usize) -> u32 {
    if participants > 1 {
        (capacity / 4096).clamp(CHUNK as usize, 8 * CHUNK as usize) as u32
    } else {
        CHUNK
    }
}

/// A worker's entries waiting out their grace period. Preallocated: maintenance never grows it.
///
/// Also the worker's allocation cache: free entries and never-used ones it took from the table in
/// chunks, and the change to the live count it has not yet added to the shared one (added at
/// every maintenance step), so that a new connection takes no shared atomic. Entries
/// in the cache of a worker that stops stay unused until the next start (at most `2 * CHUNK`).
pub struct Retired {
    pub(super) items: Vec<(u32, u64)>,
    pub(super) free: Vec<u32>,
    /// Never-used entries `.0..1` reserved for this worker.
    pub(super) unused: (u32, u32),
    pub(super) pending_live: i64,
    /// Early-drop records of this worker's new connections not yet pushed (`fifo`).
    pub(super) admitted: Vec<u32>,
    /// The clock at the previous maintenance step, and the scan work it has earned since.
    pub(super) last_ms: u64,
    pub(super) entry_credit: u64,
    pub(super) slot_credit: u64,
    /// What this worker's scan met since it last set the sweep period.
    pub(super) sample: SweepSample,
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
