//! The 32-bit expiry clock an entry keeps its expiry in.

/// Absolute CLOCK_MONOTONIC milliseconds kept in 32 bits: 2-millisecond units, wrapping every
/// 99 days, read back as the time nearest to a recent one (timeouts are at most 30 days).
pub(crate) struct Clock32;

impl Clock32 {
    /// Rounds up: an entry never expires before its time.
    #[inline]
    pub fn encode(ms: u64) -> u32 {
        (ms.div_ceil(2)) as u32
    }

    /// The time `v` stands for nearest to `near_ms` (within ±49 days). The distance is taken
    /// in 32 bits and added to `near_ms`'s whole count of units: adding it to the truncated
    /// count (as before) lost the high bits, so from 2^33 ms (99.4 days) of uptime on every
    /// expiry read back 99.4 days early and every lookup found its connection expired.
    #[inline]
    pub fn decode(v: u32, near_ms: u64) -> u64 {
        let near = near_ms.div_ceil(2);
        let delta = v.wrapping_sub(near as u32) as i32 as i64;
        ((near as i64 + delta) * 2).max(0) as u64
    }

    /// `decode(v, now_ms) < now_ms` without the decode: the expiry is past exactly when its
    /// distance from now in units is negative (and never at time 0, where `decode` clamps).
    #[inline(always)]
    pub fn expired(v: u32, now_ms: u64) -> bool {
        let near = now_ms.div_ceil(2);
        now_ms != 0 && (v.wrapping_sub(near as u32) as i32) < 0
    }
}

#[cfg(test)]
mod tests {
    use super::Clock32;

    #[test]
    fn expiries_read_back_after_the_32_bit_wrap() {
        const DAY_MS: u64 = 24 * 3600 * 1000;
        // Around the first wrap (2^33 ms, 99.4 days), the second, and a year of uptime.
        for now in [
            1_000,
            1 << 33,
            (1 << 33) + 7,
            2 << 33,
            365 * DAY_MS,
            3 * (1 << 33) - 3,
        ] {
            for ahead in [0, 1, 2, 86_400_000, 30 * DAY_MS] {
                let expiry = now + ahead;
                let back = Clock32::decode(Clock32::encode(expiry), now);
                // Rounded up to the 2 ms unit: never before its time, at most 1 ms after.
                assert!(
                    back >= expiry && back <= expiry + 1,
                    "{now} + {ahead}: {back}"
                );
            }
            // Expiries in the recent past read back in the past.
            if now > 10_000 {
                let back = Clock32::decode(Clock32::encode(now - 10_000), now);
                assert!(back < now && back + 10_001 >= now, "{now} - 10 s: {back}");
            }
        }
    }

    /// `expired` is `decode(v, now) < now` for every distance around now, at time 0, near the
    /// wraps and at the half-range boundary.
    #[test]
    fn expired_is_decode_before_now() {
        for now in [
            0u64,
            1,
            2,
            3,
            1_000,
            1_001,
            (1 << 33) - 1,
            1 << 33,
            (1 << 33) + 7,
            3 << 33,
        ] {
            let near = now.div_ceil(2) as u32;
            let mut vs: Vec<u32> = (0..64u32)
                .map(|d| near.wrapping_add(d).wrapping_sub(32))
                .collect();
            for edge in [0u32, 1, u32::MAX, 1 << 31, (1 << 31) - 1, (1 << 31) + 1] {
                vs.push(edge);
                vs.push(near.wrapping_add(edge));
            }
            for v in vs {
                assert_eq!(
                    Clock32::expired(v, now),
                    Clock32::decode(v, now) < now,
                    "v {v} now {now}"
                );
            }
        }
    }
}
