//! Internet checksum (RFC 1071) accumulation, RFC 1624 incremental updates and verification.
//!
//! Sums are carried as `u32` partial ones-complement sums so callers can chain `sum` calls over
//! pieces (pseudo-header, header, payload) that each start at an even offset; `fold` turns the
//! result into the value stored in a checksum field.

use crate::addr::{Addr, Family};
use crate::IpProto;

/// Reduces a 64-bit accumulator to a 32-bit partial sum, congruent modulo 0xffff.
#[inline(always)]
fn reduce64(mut acc: u64) -> u32 {
    while acc >> 32 != 0 {
        acc = (acc & 0xffff_ffff) + (acc >> 32);
    }
    acc as u32
}

/// Ones-complement accumulate of `data` as big-endian 16-bit words (odd tail padded with zero),
/// starting from `initial`. The result can be passed as `initial` to a further call.
#[inline]
pub fn sum(data: &[u8], initial: u32) -> u32 {
    let mut acc: u64 = initial as u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        acc += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 2 {
        acc += u16::from_be_bytes([rest[0], rest[1]]) as u64;
        rest = &rest[2..];
    }
    if let Some(&b) = rest.first() {
        acc += (b as u64) << 8;
    }
    reduce64(acc)
}

/// Folds a partial sum to 16 bits and complements it: the value to store in a checksum field.
#[inline]
pub fn fold(sum: u32) -> u16 {
    // Two end-around carries bring any u32 to 16 bits (0x1_fffe at most after the first); a
    // fixed count rather than a loop keeps the fast path's rewrite branch-free.
    let s = (sum & 0xffff) + (sum >> 16);
    let s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}

/// RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')` for one 16-bit word changing from `old` to `new`.
#[inline]
pub fn update16(check: u16, old: u16, new: u16) -> u16 {
    fold((!check) as u32 + (!old) as u32 + new as u32)
}

/// Incremental update for a 32-bit field (two words) changing from `old` to `new`.
#[inline]
pub fn update32(check: u16, old: u32, new: u32) -> u16 {
    let s = (!check) as u32
        + (!(old >> 16) as u16) as u32
        + (!(old as u16)) as u32
        + (new >> 16)
        + (new & 0xffff);
    fold(s)
}

/// Incremental update for an address changing from `old` to `new`: 4 bytes for V4 (the
/// IPv4-mapped tail), 16 for V6. Covers both the IPv4 header checksum and pseudo-headers.
#[inline]
pub fn update_addr(check: u16, old: &Addr, new: &Addr, fam: Family) -> u16 {
    fold((!check) as u32 + addr_delta(old, new, fam))
}

/// The change of a 32-bit field from `old` to `new` as an unfolded partial sum (RFC 1624 eqn. 3's
/// `~m + m'` for both of its words): add several to `!check` and fold once.
#[inline(always)]
pub fn delta32(old: u32, new: u32) -> u32 {
    (!old >> 16) + (!old & 0xffff) + (new >> 16) + (new & 0xffff)
}

/// The change of an address (4 bytes for V4, 16 for V6) as an unfolded partial sum, as
/// [`delta32`]; at most 0x10_0000, so a few add to `!check` without overflow.
#[inline(always)]
pub fn addr_delta(old: &Addr, new: &Addr, fam: Family) -> u32 {
    let word =
        |a: &Addr, i: usize| u32::from_be_bytes([a.0[i], a.0[i + 1], a.0[i + 2], a.0[i + 3]]);
    match fam {
        Family::V4 => delta32(word(old, 12), word(new, 12)),
        Family::V6 => (0..16)
            .step_by(4)
            .map(|i| delta32(word(old, i), word(new, i)))
            .sum(),
    }
}

/// Partial sum of the TCP/UDP/ICMPv6 pseudo-header (RFC 793 / RFC 8200 8.1). `len` is the
/// upper-layer length.
#[inline]
pub fn pseudo_header(src: &Addr, dst: &Addr, fam: Family, proto: IpProto, len: u32) -> u32 {
    let addrs = match fam {
        Family::V4 => sum(&dst.0[12..], sum(&src.0[12..], 0)),
        Family::V6 => sum(&dst.0, sum(&src.0, 0)),
    };
    let s = addrs as u64 + proto.0 as u64 + (len >> 16) as u64 + (len & 0xffff) as u64;
    reduce64(s)
}

/// Checksum field value for an upper-layer message `data` (checksum field included as it is,
/// normally zero) under the pseudo-header of `src`/`dst`.
#[inline]
pub fn l4_checksum(src: &Addr, dst: &Addr, fam: Family, proto: IpProto, data: &[u8]) -> u16 {
    fold(sum(
        data,
        pseudo_header(src, dst, fam, proto, data.len() as u32),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slow reference: word by word with end-around carry.
    fn ref_sum(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                (c[0] as u16) << 8
            };
            s += w as u32;
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: words 0001 f203 f4f5 f6f7 sum to ddf2 (checksum 220d).
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&d, 0)), 0x220d);
    }

    #[test]
    fn sum_matches_reference_all_lengths_and_chains() {
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for n in 0..data.len() {
            assert_eq!(fold(sum(&data[..n], 0)), ref_sum(&data[..n]), "len {n}");
        }
        // Chaining at even offsets equals one pass.
        assert_eq!(
            fold(sum(&data[100..], sum(&data[..100], 0))),
            ref_sum(&data)
        );
        // Huge initial values do not overflow.
        assert_eq!(
            fold(sum(&[0xff; 64], u32::MAX)),
            fold(sum(&[0xff; 64], 0xffff))
        );
    }

    #[test]
    fn incremental_equals_full() {
        let mut d = [
            0x45u8, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = fold(sum(&d, 0));
        d[10..12].copy_from_slice(&c.to_be_bytes());
        let old = Addr::from_v4([10, 0, 0, 2]);
        let new = Addr::from_v4([192, 168, 7, 9]);
        let c2 = update_addr(c, &old, &new, Family::V4);
        d[16..20].copy_from_slice(&new.v4_octets());
        d[10] = 0;
        d[11] = 0;
        assert_eq!(c2, fold(sum(&d, 0)));
        let c3 = update16(c2, 64 << 8 | 6, 63 << 8 | 6);
        d[8] = 63;
        assert_eq!(c3, fold(sum(&d, 0)));
        let c4 = update32(c3, 0x0a000001, 0x01020304);
        d[12..16].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(c4, fold(sum(&d, 0)));
    }

    #[test]
    fn pseudo_header_v6_len_high_bits() {
        let a = Addr::from_v6([1; 16]);
        let b = Addr::from_v6([2; 16]);
        let p = pseudo_header(&a, &b, Family::V6, IpProto::UDP, 0x1_0008);
        let mut manual = Vec::new();
        manual.extend_from_slice(&a.0);
        manual.extend_from_slice(&b.0);
        manual.extend_from_slice(&0x1_0008u32.to_be_bytes());
        manual.extend_from_slice(&[0, 0, 0, 17]);
        assert_eq!(fold(p), fold(sum(&manual, 0)));
    }
}
