//! The index's 4-byte slots: a live slot names (entry, direction) with some bits of the key's
//! hash; a tombstone carries the epoch it was removed in. `Candidate` is a slot decoded ahead
//! of its lookup.

pub(super) const SLOT_EMPTY: u32 = 0;
pub(super) const TOMB_BIT: u32 = 1;
/// A tombstone's epoch stamp keeps the epoch's low 31 bits (see `Table::tomb_is_safe`).
pub(super) const EPOCH_MASK: u64 = (1 << 31) - 1;

/// Geometry of the 4-byte index slots: a live slot is `(tag << key_bits | (idx << 1 | dir) + 1)
/// << 1`, with as many bits of the hash as a tag as the table's size leaves room for; a tombstone
/// is `epoch << 1 | 1` (the epoch's low 31 bits).
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotCode {
    key_bits: u32,
    /// `(1 << key_bits) - 1`, and `63 - tag_bits` (`tag_bits`: `31 - key_bits`): what `tag`
    /// and `decode` take per probe, computed once (with the two `tag_bits == 0` branches they were about 35 instructions per
    /// packet of the established lane, over its two probes).
    key_mask: u32,
    tag_shift: u32,
}

impl SlotCode {
    pub fn for_capacity(capacity: usize) -> SlotCode {
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
    pub fn tag(&self, hash: u64) -> u32 {
        ((hash >> 1) >> self.tag_shift) as u32
    }

    #[inline(always)]
    pub fn live(&self, tag: u32, idx: u32, dir: u8) -> u32 {
        (tag << self.key_bits | ((idx << 1 | dir as u32) + 1)) << 1
    }

    /// (tag, idx, dir) of a live slot. With no tag bits `key_bits` is 31, and the 31-bit value
    /// shifted by it is 0: no branch for that case.
    #[inline(always)]
    pub fn decode(&self, s: u32) -> (u32, u32, u8) {
        let v = s >> 1;
        let key = (v & self.key_mask) - 1;
        (v >> self.key_bits, key >> 1, (key & 1) as u8)
    }
}

#[cfg(test)]
mod tests {
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
pub(super) fn slot_tomb(epoch: u64) -> u32 {
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
    pub(super) fn of(idx: u32, dir: u8) -> Candidate {
        Candidate((idx << 1 | dir as u32) + 1)
    }

    #[inline(always)]
    pub(super) fn get(self) -> Option<(u32, u8)> {
        let key = self.0.checked_sub(1)?;
        Some((key >> 1, (key & 1) as u8))
    }
}
