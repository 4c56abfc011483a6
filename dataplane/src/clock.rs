//! The dataplane's clock, read by the workers, the conntrack table and its state file.

/// The dataplane clock: CLOCK_MONOTONIC in milliseconds, plus 1000 (so that "expires at 0" is
/// never fresh). Absolute rather than counted from process start, so that conntrack times kept in
/// a state file mean the same to the next process of the same boot. Workers pass it as `now_ms`;
/// listings compute timeouts with it.
pub fn clock_ms() -> u64 {
    1_000 + kxdp_kernel::shm::monotonic_ms()
}
