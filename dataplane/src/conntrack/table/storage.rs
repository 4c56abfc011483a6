//! How big a table's arrays are (`Geometry`) and where they live (`Storage`: process memory or
//! a state file's mapping).

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use kxdp_kernel::shm::{Mapping, SharedSlice};

use super::entry::{Cold, Entries, Hot};

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
