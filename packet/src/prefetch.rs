//! Software prefetch: tell the CPU to start loading a cache line that a later stage of the batch
//! will read, so that the misses of a whole batch overlap instead of serialising (a conntrack
//! lookup at 1M connections is two dependent DRAM accesses: the index slot, then the entry).
//!
//! The only `unsafe` of this crate, in one place: the intrinsic is `unsafe` because it is a
//! `#[target_feature]` function, not because of what it does. A prefetch is a hint: it never
//! faults, whatever the address, and changes no program-visible state. On other architectures
//! the functions do nothing.

/// Starts loading the cache line holding `*p` into every cache level, for reading.
#[inline(always)]
pub fn prefetch<T>(p: &T) {
    prefetch_addr(p as *const T as *const u8);
}

/// Starts loading every cache line `*p` spans (a value of at most a few lines, such as a
/// 112-byte conntrack entry).
#[inline(always)]
pub fn prefetch_lines<T>(p: &T) {
    let start = p as *const T as *const u8;
    let size = std::mem::size_of::<T>();
    // One every 64 bytes from the start, then the last byte: no two are more than a line apart,
    // so every line the value spans gets one, wherever it starts. The size is a constant, so
    // this unrolls into a few prefetches (no loop, no alignment arithmetic); the last may repeat
    // a line, which costs a hint.
    let mut off = 0;
    while off < size {
        prefetch_addr(start.wrapping_add(off));
        off += 64;
    }
    prefetch_addr(start.wrapping_add(size.saturating_sub(1)));
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch_addr(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: `_mm_prefetch` is `unsafe` only for its `#[target_feature(enable = "sse")]`; SSE is
    // part of the x86_64 baseline, so the feature is always present. PREFETCHT0 does not fault on
    // any address and has no effect the program can observe besides timing.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn prefetch_addr(_p: *const u8) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_any_value_is_harmless() {
        let v = [7u64; 64];
        prefetch(&v[0]);
        prefetch_lines(&v);
        prefetch_lines(&());
        assert_eq!(v[63], 7);
    }
}
