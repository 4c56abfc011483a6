//! The dataplane clock: the one time base of conntrack, the hold queue, the worker loop and the
//! listings.

/// CLOCK_MONOTONIC in milliseconds, plus 1000 (so that "expires at 0" is never fresh). Absolute
/// rather than counted from process start, so that conntrack times kept in a state file mean the
/// same to the next process of the same boot. Workers pass it as `now_ms`; listings compute
/// timeouts with it.
pub fn clock_ms() -> u64 {
    1_000 + kxdp_kernel::sys::monotonic_ms()
}
