//! How fast the expiry scan goes: the bounds of its period, and the sample of scanned entries
//! that sets it (`Table::sample`).

/// Every used entry and index slot is looked at once per sweep period (all workers together).
/// The period adapts as the kernel's conntrack garbage collector's does (Linux 5.18, "netfilter:
/// conntrack: revisit gc autotuning", and its fix "fix the gc rescheduling delay"): it is the mean
/// time the scanned entries have left, each counted at most `SWEEP_LEFT_CLAMP_MS`, within these
/// bounds. A scan that meets an entry to reclaim (killed, or expired) goes back to the shortest
/// period, and so does a table near its maximum (`sweep_period_ms`). Lookups treat an expired
/// entry as gone, so the period only decides how soon its room is reclaimed.
pub(super) const SWEEP_PERIOD_MIN_MS: u64 = 1_000;
pub(super) const SWEEP_PERIOD_MAX_MS: u64 = 60_000;
/// The kernel's `GC_SCAN_INTERVAL_CLAMP`: one long-lived entry does not outweigh many short ones.
pub(super) const SWEEP_LEFT_CLAMP_MS: u64 = 300_000;
/// Entries a worker's scan looks at before it sets the period (`Table::sample`).
pub(super) const SWEEP_SAMPLE: u32 = 1_024;

/// A sample of the expiry scan (`Table::sample`): how many entries, the sum of the time they
/// had left (each clamped), and whether one of them was to be reclaimed.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SweepSample {
    pub n: u32,
    pub left_ms: u64,
    pub reclaimed: bool,
}
