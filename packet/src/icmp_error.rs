//! ICMP and ICMPv6 errors about NATed connections: the packet an error quotes, and the rewrite
//! that translates outer and quoted headers together.
//!
//! An error (destination unreachable, fragmentation needed / packet too big, time exceeded,
//! parameter problem) carries the start of the packet that caused it. Behind a NAT both the outer
//! addresses and the quoted packet must be translated, or the client's stack cannot match the
//! error to its socket (PMTU discovery then black-holes the connection).

use crate::addr::{Addr, Family};
use crate::checksum::{update16, update_addr};
use crate::field::{arr, get16, set16};
use crate::meta::PacketMeta;
use crate::IpProto;
use crate::{icmp, ipv4, ipv6, tcp, udp};

/// The quoted ("inner") packet of an ICMP error, located in the frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quoted {
    /// Offset of the quoted IP header in the frame.
    pub l3_off: u16,
    /// Offset of the quoted transport header in the frame (ports available when `has_ports`).
    pub l4_off: u16,
    /// Quoted transport bytes present (from `l4_off` to the end of the ICMP message).
    pub l4_avail: u16,
    /// Family of the quoted packet (always the error's own).
    pub family: Family,
    /// Transport protocol of the quoted packet.
    pub proto: IpProto,
    /// Source address of the quoted packet.
    pub src: Addr,
    /// Destination address of the quoted packet.
    pub dst: Addr,
    /// TCP/UDP/SCTP ports, or the ICMP echo identifier in both; 0 when not quoted.
    pub sport: u16,
    /// See `sport`.
    pub dport: u16,
    /// The first 4 bytes of the transport header are quoted (ports, or echo type/code/checksum).
    pub has_ports: bool,
}

/// Locates the quoted packet of the ICMP/ICMPv6 error `meta` describes. `None` when the message
/// is no error, or quotes too little to name a connection (less than the IP header plus the
/// ports).
pub fn parse_quoted(frame: &[u8], meta: &PacketMeta) -> Option<Quoted> {
    if !meta.is_icmp_error() || meta.l4_off == 0 {
        return None;
    }
    let start = meta.l4_off as usize + icmp::HEADER_LEN;
    let end = meta.ip_end().min(frame.len());
    let inner = frame.get(start..end)?;
    let mut q = Quoted {
        l3_off: start as u16,
        family: meta.family,
        ..Quoted::default()
    };
    let l4_rel = match meta.family {
        Family::V4 => {
            // The quoted header's own lengths describe the original packet, not the quote.
            if inner.len() < ipv4::MIN_HEADER_LEN || inner[0] >> 4 != 4 {
                return None;
            }
            let hl = (inner[0] & 0x0f) as usize * 4;
            if hl < ipv4::MIN_HEADER_LEN || hl > inner.len() {
                return None;
            }
            let fo = get16(inner, ipv4::field::FLAGS_FRAG);
            q.proto = IpProto(inner[ipv4::field::PROTOCOL]);
            q.src = Addr::from_v4(arr(inner, ipv4::field::SRC));
            q.dst = Addr::from_v4(arr(inner, ipv4::field::DST));
            if fo & 0x1fff != 0 {
                return Some(q); // a non-first fragment quotes no transport header
            }
            hl
        }
        Family::V6 => {
            if inner.len() < ipv6::HEADER_LEN || inner[0] >> 4 != 6 {
                return None;
            }
            q.src = Addr(arr(inner, ipv6::field::SRC));
            q.dst = Addr(arr(inner, ipv6::field::DST));
            let chain =
                ipv6::walk_chain(&inner[ipv6::HEADER_LEN..], inner[ipv6::field::NEXT_HEADER])
                    .ok()?;
            q.proto = chain.proto;
            if !chain.has_l4 {
                return Some(q);
            }
            ipv6::HEADER_LEN + chain.offset
        }
    };
    let l4 = inner.get(l4_rel..)?;
    q.l4_off = (start + l4_rel) as u16;
    q.l4_avail = l4.len() as u16;
    if l4.len() >= 4 {
        match q.proto {
            IpProto::TCP | IpProto::UDP | IpProto::SCTP => {
                q.sport = get16(l4, 0);
                q.dport = get16(l4, 2);
                q.has_ports = true;
            }
            IpProto::ICMP | IpProto::ICMPV6 if l4.len() >= icmp::field::ECHO_IDENT + 2 => {
                q.sport = get16(l4, icmp::field::ECHO_IDENT);
                q.dport = q.sport;
                q.has_ports = true;
            }
            _ => {}
        }
    }
    Some(q)
}

/// The new addresses of an error and of the packet it quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorRewrite {
    /// The error's new source (the router or host that reports).
    pub outer_src: Addr,
    /// The error's new destination (the sender of the quoted packet).
    pub outer_dst: Addr,
    /// The quoted packet's new source address.
    pub inner_src: Addr,
    /// The quoted packet's new source port (echo identifier).
    pub inner_sport: u16,
    /// The quoted packet's new destination address.
    pub inner_dst: Addr,
    /// The quoted packet's new destination port.
    pub inner_dport: u16,
}

/// Rewrites an ICMP/ICMPv6 error in place: outer addresses (IPv4 header checksum updated), the
/// quoted IP addresses (quoted IPv4 header checksum updated), the quoted ports or echo identifier
/// with the quoted transport checksum where it is quoted (incrementally: it covers the whole
/// original packet, which is not there), and finally the ICMP checksum, recomputed over the
/// message (it covers the quote). Updates `meta`'s outer addresses.
pub fn rewrite_icmp_error(frame: &mut [u8], meta: &mut PacketMeta, q: &Quoted, rw: &ErrorRewrite) {
    let end = meta.ip_end();
    if end > frame.len() || q.l3_off as usize >= end {
        return;
    }
    let fam = meta.family;
    let l3 = meta.l3_off as usize;
    // Outer header.
    let (osrc_at, odst_at) = addr_offsets(l3, fam);
    let old_outer_src = read_addr(frame, osrc_at, fam);
    let old_outer_dst = read_addr(frame, odst_at, fam);
    write_addr(frame, osrc_at, &rw.outer_src, fam);
    write_addr(frame, odst_at, &rw.outer_dst, fam);
    if fam == Family::V4 {
        let mut c = get16(frame, l3 + ipv4::field::CHECKSUM);
        c = update_addr(c, &old_outer_src, &rw.outer_src, fam);
        c = update_addr(c, &old_outer_dst, &rw.outer_dst, fam);
        set16(frame, l3 + ipv4::field::CHECKSUM, c);
    }
    meta.src = rw.outer_src;
    meta.dst = rw.outer_dst;

    // Quoted IP header.
    let il3 = q.l3_off as usize;
    let (isrc_at, idst_at) = addr_offsets(il3, fam);
    let old_in_src = read_addr(frame, isrc_at, fam);
    let old_in_dst = read_addr(frame, idst_at, fam);
    write_addr(frame, isrc_at, &rw.inner_src, fam);
    write_addr(frame, idst_at, &rw.inner_dst, fam);
    if fam == Family::V4 {
        let mut c = get16(frame, il3 + ipv4::field::CHECKSUM);
        c = update_addr(c, &old_in_src, &rw.inner_src, fam);
        c = update_addr(c, &old_in_dst, &rw.inner_dst, fam);
        set16(frame, il3 + ipv4::field::CHECKSUM, c);
    }

    // Quoted transport header: ports, and its checksum when the quote reaches it.
    if q.has_ports {
        let il4 = q.l4_off as usize;
        let avail = q.l4_avail as usize;
        let addr_delta = |mut c: u16| {
            c = update_addr(c, &old_in_src, &rw.inner_src, fam);
            update_addr(c, &old_in_dst, &rw.inner_dst, fam)
        };
        match q.proto {
            IpProto::TCP | IpProto::UDP | IpProto::SCTP => {
                let (os, od) = (get16(frame, il4), get16(frame, il4 + 2));
                set16(frame, il4, rw.inner_sport);
                set16(frame, il4 + 2, rw.inner_dport);
                let at = match q.proto {
                    IpProto::TCP => Some(tcp::field::CHECKSUM),
                    IpProto::UDP => Some(udp::field::CHECKSUM),
                    _ => None, // SCTP's CRC32c covers the whole packet: not quoted, left as is
                };
                if let Some(at) = at {
                    if avail >= at + 2 {
                        let c = get16(frame, il4 + at);
                        if !(q.proto == IpProto::UDP && fam == Family::V4 && c == 0) {
                            let c = update16(
                                update16(addr_delta(c), os, rw.inner_sport),
                                od,
                                rw.inner_dport,
                            );
                            set16(frame, il4 + at, c);
                        }
                    }
                }
            }
            IpProto::ICMP | IpProto::ICMPV6 => {
                let (ident_at, sum_at) =
                    (il4 + icmp::field::ECHO_IDENT, il4 + icmp::field::CHECKSUM);
                let old_id = get16(frame, ident_at);
                set16(frame, ident_at, rw.inner_sport);
                if avail >= icmp::field::CHECKSUM + 2 {
                    let mut c = update16(get16(frame, sum_at), old_id, rw.inner_sport);
                    if q.proto == IpProto::ICMPV6 {
                        c = addr_delta(c);
                    }
                    set16(frame, sum_at, c);
                }
            }
            _ => {}
        }
    }

    // The ICMP checksum covers the whole message (and, for ICMPv6, the outer pseudo-header).
    let l4 = meta.l4_off as usize;
    icmp::Message::new_unchecked(&mut frame[l4..end]).fill_checksum(
        &rw.outer_src,
        &rw.outer_dst,
        fam,
    );
}

#[inline]
fn addr_offsets(l3: usize, fam: Family) -> (usize, usize) {
    match fam {
        Family::V4 => (l3 + ipv4::field::SRC, l3 + ipv4::field::DST),
        Family::V6 => (l3 + ipv6::field::SRC, l3 + ipv6::field::DST),
    }
}

#[inline]
fn read_addr(frame: &[u8], at: usize, fam: Family) -> Addr {
    match fam {
        Family::V4 => Addr::from_v4([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]]),
        Family::V6 => Addr(crate::field::arr(frame, at)),
    }
}

#[inline]
fn write_addr(frame: &mut [u8], at: usize, a: &Addr, fam: Family) {
    match fam {
        Family::V4 => frame[at..at + 4].copy_from_slice(&a.v4_octets()),
        Family::V6 => frame[at..at + 16].copy_from_slice(&a.0),
    }
}
