//! In-place NAT rewrite with RFC 1624 incremental checksum updates.
//!
//! Incremental updates touch only the changed words, so the cost does not depend on the payload
//! size (SCTP excepted: CRC32c has to be recomputed over the SCTP packet). The old values are read
//! from the frame itself, not from `meta`, so a stale meta cannot corrupt a checksum.

use crate::addr::{Addr, Family};
use crate::checksum::{addr_delta, delta32, fold, update16};
use crate::field::{arr, get16, get32, set16, set32};
use crate::meta::{PacketMeta, PlainV4, PLAIN_V4_L3, PLAIN_V4_L4, PLAIN_V4_LEN};
use crate::IpProto;
use crate::{icmp, ipv4, ipv6, sctp, tcp, udp, ParseError};

/// Rewrites source/destination address and port (ICMP/ICMPv6 echo: the identifier, taken from
/// `sport`) of the packet described by `meta`, updating the IPv4 header checksum and the L4
/// checksum incrementally (pseudo-header included for TCP/UDP/ICMPv6). UDP over IPv4 with a zero
/// checksum stays zero. SCTP: CRC32c recomputed. Non-first fragments: addresses only. The family
/// must not change (no NAT46): for V4 only the last 4 bytes of the addresses are used. Updates
/// `meta` to the new values. A `meta` that does not fit the frame leaves both untouched
/// (see [`try_rewrite`] to learn about it).
#[inline]
pub fn rewrite(
    frame: &mut [u8],
    meta: &mut PacketMeta,
    src: Addr,
    sport: u16,
    dst: Addr,
    dport: u16,
) {
    let _ = try_rewrite(frame, meta, src, sport, dst, dport);
}

/// [`rewrite`], reporting `Err(Truncated)` (and changing nothing) when `meta` does not fit `frame`.
#[inline]
pub fn try_rewrite(
    frame: &mut [u8],
    meta: &mut PacketMeta,
    src: Addr,
    sport: u16,
    dst: Addr,
    dport: u16,
) -> Result<(), ParseError> {
    let l3 = meta.l3_off as usize;
    let ip_end = meta.ip_end();
    let fam = meta.family;
    let min_l3 = match fam {
        Family::V4 => ipv4::MIN_HEADER_LEN,
        Family::V6 => ipv6::HEADER_LEN,
    };
    if ip_end > frame.len() || (meta.ip_len as usize) < min_l3 {
        return Err(ParseError::Truncated);
    }
    let l4 = meta.l4_off as usize;
    let do_l4 = l4 != 0 && meta.frag.offset == 0;
    if do_l4 {
        let min_l4 = match meta.proto {
            IpProto::TCP => tcp::MIN_HEADER_LEN,
            IpProto::UDP => udp::HEADER_LEN,
            IpProto::SCTP => sctp::HEADER_LEN,
            IpProto::ICMP | IpProto::ICMPV6 => icmp::HEADER_LEN,
            _ => 0,
        };
        if l4 < l3 + min_l3 || l4 + min_l4 > ip_end {
            return Err(ParseError::Truncated);
        }
    }

    // The addresses' change as one unfolded partial sum, added to every checksum that covers
    // them (the IPv4 header's, the pseudo-header's) before a single fold: one fold per checksum
    // instead of one per changed field. Unchanged fields add nothing. Fixed-size reads and
    // writes per family: a variable length would become a `memmove` call.
    let addr_sum = match fam {
        Family::V4 => set_v4_addrs(
            frame,
            l3,
            u32::from_be_bytes(src.v4_octets()),
            u32::from_be_bytes(dst.v4_octets()),
        ),
        Family::V6 => {
            let (s_at, d_at) = (l3 + ipv6::field::SRC, l3 + ipv6::field::DST);
            let os = Addr(arr(frame, s_at));
            let od = Addr(arr(frame, d_at));
            frame[s_at..s_at + 16].copy_from_slice(&src.0);
            frame[d_at..d_at + 16].copy_from_slice(&dst.0);
            let mut sum = 0;
            if os != src {
                sum += addr_delta(&os, &src, fam);
            }
            if od != dst {
                sum += addr_delta(&od, &dst, fam);
            }
            sum
        }
    };

    meta.src = src;
    meta.dst = dst;
    if !do_l4 {
        return Ok(());
    }

    match meta.proto {
        IpProto::TCP | IpProto::UDP => {
            set_tcp_udp_ports(frame, l4, meta.proto, fam, addr_sum, sport, dport);
            meta.sport = sport;
            meta.dport = dport;
        }
        IpProto::SCTP => {
            set_ports(frame, l4, sport, dport, meta);
            // A first fragment's CRC covers bytes we do not have: leave it to the receiver.
            if !meta.frag.more {
                let mut p = sctp::Packet::new_unchecked(&mut frame[l4..ip_end]);
                p.fill_checksum();
            }
        }
        IpProto::ICMP | IpProto::ICMPV6 if meta.is_icmp() => {
            let (sum_at, ident_at) = (l4 + icmp::field::CHECKSUM, l4 + icmp::field::ECHO_IDENT);
            // ICMPv6's checksum covers the pseudo-header, so the addresses' change; ICMPv4's
            // does not.
            let mut c = get16(frame, sum_at);
            if fam == Family::V6 {
                c = fold(!c as u32 + addr_sum);
            }
            if icmp::is_echo(fam, frame[l4 + icmp::field::TYPE]) {
                c = update16(c, get16(frame, ident_at), sport);
                set16(frame, ident_at, sport);
                meta.sport = sport;
                meta.dport = sport;
            }
            set16(frame, sum_at, c);
        }
        _ => {}
    }
    Ok(())
}

/// The established fast lane's NAT: [`try_rewrite`] of a whole (unfragmented) IPv4 TCP or UDP
/// packet, with the new addresses as numbers (`u32::from_be_bytes` of the octets, as a packed
/// conntrack tuple holds them) rather than [`Addr`] byte arrays, and `meta` left as it was (the
/// caller has the new values). Every byte written is the one `try_rewrite` writes: the same
/// partial sums, the same single fold per checksum, a zero IPv4 UDP checksum kept zero. Returns
/// `Err(Truncated)`, changing nothing, for any other packet or a `meta` that does not fit the
/// frame: the caller then takes `try_rewrite`.
#[inline(always)]
pub fn rewrite_v4_ports(
    frame: &mut [u8],
    meta: &PacketMeta,
    src: u32,
    sport: u16,
    dst: u32,
    dport: u16,
) -> Result<(), ParseError> {
    let (l3, l4, ip_end) = (meta.l3_off as usize, meta.l4_off as usize, meta.ip_end());
    let min_l4 = match meta.proto {
        IpProto::TCP => tcp::MIN_HEADER_LEN,
        IpProto::UDP => udp::HEADER_LEN,
        _ => return Err(ParseError::Truncated),
    };
    if meta.family != Family::V4
        || meta.frag.is_fragment
        || ip_end > frame.len()
        || l4 < l3 + ipv4::MIN_HEADER_LEN
        || l4 + min_l4 > ip_end
    {
        return Err(ParseError::Truncated);
    }
    // The common frame (untagged Ethernet, no IPv4 options): at constant offsets.
    if (l3, l4) == (PLAIN_V4_L3, PLAIN_V4_L4) {
        return rewrite_plain_v4(frame, meta.proto, src, sport, dst, dport);
    }
    let addr_sum = set_v4_addrs(frame, l3, src, dst);
    set_tcp_udp_ports(frame, l4, meta.proto, Family::V4, addr_sum, sport, dport);
    Ok(())
}

/// [`rewrite_v4_ports`] of a frame [`crate::parse_plain_v4`] accepted, unchanged since (the
/// established fast lane's packets): the IP header at [`PLAIN_V4_L3`] and the TCP or UDP
/// header (`l4_proto`) at [`PLAIN_V4_L4`], written at those constant offsets within an array
/// one length check proves present, with no other check (the parse made them). The same bytes as
/// [`rewrite_v4_ports`]. `Err(Truncated)`, changing nothing, for another protocol or a frame
/// shorter than the headers; on a frame that is not plain it writes those offsets all the same.
#[inline(always)]
pub fn rewrite_plain_v4(
    frame: &mut [u8],
    l4_proto: IpProto,
    src: u32,
    sport: u16,
    dst: u32,
    dport: u16,
) -> Result<(), ParseError> {
    match l4_proto {
        IpProto::TCP => set_plain_v4::<{ PLAIN_V4_L4 + tcp::MIN_HEADER_LEN }>(
            frame, l4_proto, src, sport, dst, dport,
        ),
        IpProto::UDP => set_plain_v4::<{ PLAIN_V4_L4 + udp::HEADER_LEN }>(
            frame, l4_proto, src, sport, dst, dport,
        ),
        _ => Err(ParseError::Truncated),
    }
}

/// [`rewrite_plain_v4`] on the first `LEN` bytes, the plain headers of a TCP or UDP frame
/// (`Err(Truncated)`, changing nothing, on a shorter one).
#[inline(always)]
fn set_plain_v4<const LEN: usize>(
    frame: &mut [u8],
    l4_proto: IpProto,
    src: u32,
    sport: u16,
    dst: u32,
    dport: u16,
) -> Result<(), ParseError> {
    let h = frame
        .first_chunk_mut::<LEN>()
        .ok_or(ParseError::Truncated)?;
    let addr_sum = set_v4_addrs(h, PLAIN_V4_L3, src, dst);
    set_tcp_udp_ports(h, PLAIN_V4_L4, l4_proto, Family::V4, addr_sum, sport, dport);
    Ok(())
}

/// [`rewrite_plain_v4`] from flow fields the caller already holds: `old` is what
/// [`crate::parse_plain_v4`] read from this frame (unchanged since), `new` what it leaves as
/// (`new.proto` is not read). The checksum deltas come from those numbers, not from the old
/// values loaded back out of the frame and byte-swapped; the new addresses are one 8-byte store
/// and the ports one 4-byte store, at the plain offsets. The same bytes as [`rewrite_plain_v4`]
/// (the established fast lane's rewrite). `Err(Truncated)`, changing nothing, for another
/// protocol or a frame shorter than a plain one.
#[inline(always)]
pub fn rewrite_plain_v4_from(
    frame: &mut [u8],
    old: &PlainV4,
    new: &PlainV4,
) -> Result<(), ParseError> {
    const L3: usize = PLAIN_V4_L3;
    const L4: usize = PLAIN_V4_L4;
    // Every plain frame is at least this long (a UDP one included: the parse's one check).
    let h = frame
        .first_chunk_mut::<PLAIN_V4_LEN>()
        .ok_or(ParseError::Truncated)?;
    let l4_check = match old.proto {
        IpProto::TCP => L4 + tcp::field::CHECKSUM,
        IpProto::UDP => L4 + udp::field::CHECKSUM,
        _ => return Err(ParseError::Truncated),
    };
    // As `set_v4_addrs` and `ports_sum`: an unchanged address or port adds nothing (which keeps
    // a sum of nothing zero, so that the result is the same, bit for bit, in every case).
    let changed16 = |o: u16, n: u16| if o == n { 0 } else { (!o) as u32 + n as u32 };
    let addr_sum = add_carry(changed_sum(old.src, new.src), changed_sum(old.dst, new.dst));
    let ports_sum = changed16(old.sport, new.sport) + changed16(old.dport, new.dport);
    let c = get16(h, L3 + ipv4::field::CHECKSUM);
    set16(
        h,
        L3 + ipv4::field::CHECKSUM,
        fold_carry(add_carry((!c) as u32, addr_sum)),
    );
    let c = get16(h, l4_check);
    let l4_sum = add_carry(add_carry((!c) as u32, addr_sum), ports_sum);
    if old.proto == IpProto::TCP {
        set16(h, l4_check, fold_carry(l4_sum));
    } else if c != 0 {
        // A zero IPv4 UDP checksum ("none") stays zero; a computed zero is sent as all ones.
        let c = fold_carry(l4_sum);
        set16(h, l4_check, if c == 0 { 0xffff } else { c });
    }
    // Source and destination are adjacent: one store. So are the ports.
    let addrs = (new.src as u64) << 32 | new.dst as u64;
    h[L3 + ipv4::field::SRC..][..8].copy_from_slice(&addrs.to_be_bytes());
    let ports = (new.sport as u32) << 16 | new.dport as u32;
    h[L4 + tcp::field::SRC_PORT..][..4].copy_from_slice(&ports.to_be_bytes());
    Ok(())
}

/// One's complement addition of two 32-bit partial sums (the carry out added back in): the
/// result is congruent to `a + b` modulo 0xffff, as the checksum's 16-bit sum is, and zero only
/// when both are.
#[inline(always)]
fn add_carry(a: u32, b: u32) -> u32 {
    let (s, carry) = a.overflowing_add(b);
    s + carry as u32
}

/// `checksum::fold` in one end-around carry of the two halves: the same value (zero only for a
/// zero sum, else the 16-bit sum in 1..=0xffff), complemented.
#[inline(always)]
fn fold_carry(sum: u32) -> u16 {
    let (s, carry) = (sum as u16).overflowing_add((sum >> 16) as u16);
    !(s + carry as u16)
}

/// A 32-bit field's change from `old` to `new` as a 32-bit partial sum (`changed32`'s value
/// modulo 0xffff, and zero exactly when it is).
#[inline(always)]
fn changed_sum(old: u32, new: u32) -> u32 {
    if old == new {
        0
    } else {
        add_carry(!old, new)
    }
}

/// Writes an IPv4 header's new addresses and updates its checksum; returns the addresses'
/// change as an unfolded partial sum, for the transport checksum's pseudo-header.
#[inline(always)]
fn set_v4_addrs(frame: &mut [u8], l3: usize, src: u32, dst: u32) -> u32 {
    let (s_at, d_at) = (l3 + ipv4::field::SRC, l3 + ipv4::field::DST);
    let addr_sum = changed32(get32(frame, s_at), src) + changed32(get32(frame, d_at), dst);
    set32(frame, s_at, src);
    set32(frame, d_at, dst);
    let c = fold(!get16(frame, l3 + ipv4::field::CHECKSUM) as u32 + addr_sum);
    set16(frame, l3 + ipv4::field::CHECKSUM, c);
    addr_sum
}

/// A TCP or UDP header's checksum updated by the addresses' change `addr_sum` and the ports'
/// change (one fold), then the new ports written. A zero IPv4 UDP checksum ("none") stays zero;
/// a computed zero is sent as all ones (RFC 768).
#[inline(always)]
fn set_tcp_udp_ports(
    frame: &mut [u8],
    l4: usize,
    l4_proto: IpProto,
    fam: Family,
    addr_sum: u32,
    sport: u16,
    dport: u16,
) {
    let at = l4
        + if l4_proto == IpProto::TCP {
            tcp::field::CHECKSUM
        } else {
            udp::field::CHECKSUM
        };
    let c = get16(frame, at);
    if l4_proto == IpProto::TCP {
        let c = fold(!c as u32 + addr_sum + ports_sum(frame, l4, sport, dport));
        set16(frame, at, c);
    } else if !(fam == Family::V4 && c == 0) {
        let c = fold(!c as u32 + addr_sum + ports_sum(frame, l4, sport, dport));
        set16(frame, at, if c == 0 { 0xffff } else { c });
    }
    set16(frame, l4 + tcp::field::SRC_PORT, sport);
    set16(frame, l4 + tcp::field::DST_PORT, dport);
}

/// The ports' change (source and destination port, read from the frame) as an unfolded partial
/// sum, as `checksum::delta32`; unchanged ports add nothing.
#[inline(always)]
fn ports_sum(frame: &[u8], l4: usize, sport: u16, dport: u16) -> u32 {
    // The ports sit at the same offsets in TCP, UDP and SCTP.
    let changed16 = |old: u16, new: u16| {
        if old == new {
            0
        } else {
            (!old) as u32 + new as u32
        }
    };
    changed16(get16(frame, l4 + tcp::field::SRC_PORT), sport)
        + changed16(get16(frame, l4 + tcp::field::DST_PORT), dport)
}

/// `checksum::delta32` of a field that may be unchanged (then nothing is added).
#[inline(always)]
fn changed32(old: u32, new: u32) -> u32 {
    if old == new {
        0
    } else {
        delta32(old, new)
    }
}

#[inline(always)]
fn set_ports(frame: &mut [u8], l4: usize, sport: u16, dport: u16, meta: &mut PacketMeta) {
    set16(frame, l4 + tcp::field::SRC_PORT, sport);
    set16(frame, l4 + tcp::field::DST_PORT, dport);
    meta.sport = sport;
    meta.dport = dport;
}

/// Decrements the IPv4 TTL (updating the header checksum incrementally) or the IPv6 hop limit of
/// a frame being forwarded, as a router does. Returns false, changing nothing, when the packet
/// must not be forwarded (TTL or hop limit 0 or 1) or the frame is not IP.
pub fn decrement_ttl(frame: &mut [u8], link: crate::LinkType) -> bool {
    let l3 = match link {
        crate::LinkType::Ethernet => match crate::ethernet::l3_offset(frame) {
            Ok((_, off)) => off,
            Err(_) => return false,
        },
        crate::LinkType::RawIp => 0,
    };
    decrement_ttl_at(frame, l3)
}

/// [`decrement_ttl`] for a frame whose IP header offset is known (from the fast-path parse).
pub fn decrement_ttl_at(frame: &mut [u8], l3: usize) -> bool {
    match frame.get(l3).map(|b| b >> 4) {
        Some(4) if frame.len() >= l3 + ipv4::MIN_HEADER_LEN => {
            let at = l3 + ipv4::field::TTL;
            let ttl = frame[at];
            if ttl <= 1 {
                return false;
            }
            // The checksum covers the TTL as the high byte of a 16-bit word.
            let old = get16(frame, at);
            frame[at] = ttl - 1;
            let c = update16(
                get16(frame, l3 + ipv4::field::CHECKSUM),
                old,
                get16(frame, at),
            );
            set16(frame, l3 + ipv4::field::CHECKSUM, c);
            true
        }
        Some(6) if frame.len() >= l3 + ipv6::HEADER_LEN => {
            let at = l3 + ipv6::field::HOP_LIMIT;
            if frame[at] <= 1 {
                return false;
            }
            frame[at] -= 1;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod ttl_tests {
    use super::*;
    use crate::{parse, verify, LinkType, Parsed};

    #[test]
    fn ttl_decrements_with_a_valid_checksum_and_stops_at_one() {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 2)
            .udp(1, 2)
            .write(&mut v, &[1, 2, 3])
            .unwrap();
        assert!(decrement_ttl(&mut v, LinkType::Ethernet));
        let Ok(Parsed::Ip(m)) = parse(&v, LinkType::Ethernet) else {
            panic!()
        };
        assert_eq!(m.ttl, 1);
        verify::checksums(&v, &m).unwrap();
        let before = v.clone();
        assert!(!decrement_ttl(&mut v, LinkType::Ethernet));
        assert_eq!(v, before);
        let mut v6 = Vec::new();
        etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv6([1; 16], [2; 16], 64)
            .udp(1, 2)
            .write(&mut v6, &[])
            .unwrap();
        assert!(decrement_ttl(&mut v6, LinkType::Ethernet));
        assert_eq!(v6[14 + 7], 63);
    }
}
