//! Replies built in place in the frame buffer, so the dataplane can answer a packet for a
//! service without endpoints (or a closed port) by transmitting the same buffer back.
//!
//! Both builders return the new frame length, or 0 when no reply must or can be sent (the
//! packet is not of the right kind, is itself a RST / an ICMP error, is a non-first fragment,
//! is addressed to multicast/broadcast, or `meta` does not fit the buffer).

use crate::addr::{Addr, Family};
use crate::field::{get16, get32};
use crate::meta::PacketMeta;
use crate::tcp::flags;
use crate::IpProto;
use crate::{ethernet, icmp, icmpv4, icmpv6, ipv4, ipv6, tcp, LinkType};

/// TTL / hop limit of the replies.
pub const REPLY_TTL: u8 = 64;
/// Largest IPv4 ICMP error (RFC 1812 4.3.2.3).
pub const ICMPV4_ERROR_MAX: usize = 576;
/// Largest IPv6 ICMP error (RFC 4443 2.4(c): the minimum MTU).
pub const ICMPV6_ERROR_MAX: usize = 1280;

/// Common checks; returns (l3 offset, end of the IP packet).
fn check_frame(
    buf: &[u8],
    len: usize,
    link: LinkType,
    meta: &PacketMeta,
) -> Option<(usize, usize)> {
    let l3 = meta.l3_off as usize;
    let ip_end = meta.ip_end();
    if len > buf.len() || ip_end > len || !meta.is_first_fragment_or_whole() {
        return None;
    }
    match link {
        LinkType::Ethernet if l3 < ethernet::HEADER_LEN => return None,
        LinkType::RawIp if l3 != 0 => return None,
        _ => {}
    }
    let min = match meta.family {
        Family::V4 => ipv4::MIN_HEADER_LEN,
        Family::V6 => ipv6::HEADER_LEN,
    };
    if (meta.ip_len as usize) < min {
        return None;
    }
    Some((l3, ip_end))
}

/// Reads the addresses from the frame (not from `meta`).
fn addrs(buf: &[u8], l3: usize, fam: Family) -> (Addr, Addr) {
    match fam {
        Family::V4 => (
            Addr::from_v4(crate::field::arr(buf, l3 + 12)),
            Addr::from_v4(crate::field::arr(buf, l3 + 16)),
        ),
        Family::V6 => (
            Addr(crate::field::arr(buf, l3 + 8)),
            Addr(crate::field::arr(buf, l3 + 24)),
        ),
    }
}

fn is_multicast_or_broadcast(a: &Addr, fam: Family) -> bool {
    match fam {
        Family::V4 => {
            let o = a.v4_octets();
            (o[0] & 0xf0) == 0xe0 || o == [255, 255, 255, 255]
        }
        Family::V6 => a.0[0] == 0xff,
    }
}

fn swap_macs(buf: &mut [u8], link: LinkType) {
    if link == LinkType::Ethernet {
        ethernet::Frame::new_unchecked(&mut buf[..ethernet::HEADER_LEN]).swap_addrs();
    }
}

/// Writes the IP header of a reply at `l3` (from `src` to `dst`) carrying `payload_len` bytes.
fn emit_ip(
    buf: &mut [u8],
    l3: usize,
    fam: Family,
    src: &Addr,
    dst: &Addr,
    protocol: IpProto,
    payload_len: usize,
) -> usize {
    match fam {
        Family::V4 => {
            let r = ipv4::Repr {
                src_addr: src.v4_octets(),
                dst_addr: dst.v4_octets(),
                protocol: protocol.0,
                ttl: REPLY_TTL,
                ident: 0,
                dont_frag: protocol == IpProto::TCP,
                dscp_ecn: 0,
                payload_len,
            };
            let _ = r.emit(&mut buf[l3..]);
            ipv4::MIN_HEADER_LEN
        }
        Family::V6 => {
            let r = ipv6::Repr {
                src_addr: src.0,
                dst_addr: dst.0,
                next_header: protocol.0,
                hop_limit: REPLY_TTL,
                traffic_class: 0,
                flow_label: 0,
                payload_len,
            };
            let _ = r.emit(&mut buf[l3..]);
            ipv6::HEADER_LEN
        }
    }
}

/// Turns a TCP segment into the RST that answers it (RFC 9293 3.10.7.1, "CLOSED" state): if the
/// segment had ACK, `seq = SEG.ACK` and only RST is set; otherwise `seq = 0`,
/// `ack = SEG.SEQ + SEG.LEN` (SYN and FIN count one each) with RST|ACK. MACs, addresses and ports
/// are swapped, IPv4 options / IPv6 extension headers and the payload are dropped, TTL is 64.
/// A RST is never answered. Returns the new frame length (0: no reply).
pub fn build_tcp_rst(buf: &mut [u8], len: usize, link: LinkType, meta: &PacketMeta) -> usize {
    let Some((l3, ip_end)) = check_frame(buf, len, link, meta) else {
        return 0;
    };
    let l4 = meta.l4_off as usize;
    let min_l3 = match meta.family {
        Family::V4 => ipv4::MIN_HEADER_LEN,
        Family::V6 => ipv6::HEADER_LEN,
    };
    if meta.proto != IpProto::TCP || l4 < l3 + min_l3 || meta.frag.is_fragment {
        return 0;
    }
    let Ok(hl) = tcp::check(&buf[l4.min(ip_end)..ip_end]) else {
        return 0;
    };
    let seg = &buf[l4..ip_end];
    let (sport, dport) = (get16(seg, 0), get16(seg, 2));
    let (seq, ack, fl) = (get32(seg, 4), get32(seg, 8), seg[13]);
    if fl & flags::RST != 0 {
        return 0;
    }
    let seg_len =
        (seg.len() - hl) as u32 + (fl & flags::SYN != 0) as u32 + (fl & flags::FIN != 0) as u32;
    let (rseq, rack, rflags) = if fl & flags::ACK != 0 {
        (ack, 0, flags::RST)
    } else {
        (0, seq.wrapping_add(seg_len), flags::RST | flags::ACK)
    };
    let (src, dst) = addrs(buf, l3, meta.family);
    let t = l3 + min_l3;
    let new_len = t + tcp::MIN_HEADER_LEN;
    if new_len > buf.len() {
        return 0;
    }
    emit_ip(
        buf,
        l3,
        meta.family,
        &dst,
        &src,
        IpProto::TCP,
        tcp::MIN_HEADER_LEN,
    );
    let r = tcp::Repr {
        src_port: dport,
        dst_port: sport,
        seq_number: rseq,
        ack_number: rack,
        flags: rflags,
        window: 0,
    };
    let _ = r.emit(&mut buf[t..new_len], &dst, &src, meta.family);
    swap_macs(buf, link);
    new_len
}

/// Turns an IP packet into the ICMP destination unreachable / port unreachable that answers it
/// (IPv4 type 3 code 3, IPv6 type 1 code 4), quoting as much of the offending IP packet as fits
/// in 576 (IPv4) / 1280 (IPv6) bytes of reply and in `buf`. MACs and addresses are swapped, TTL
/// is 64. ICMP errors and multicast/broadcast destinations are never answered (RFC 1122 3.2.2,
/// RFC 4443 2.4(e)). Returns the new frame length (0: no reply).
pub fn build_port_unreachable(
    buf: &mut [u8],
    len: usize,
    link: LinkType,
    meta: &PacketMeta,
) -> usize {
    let Some((l3, ip_end)) = check_frame(buf, len, link, meta) else {
        return 0;
    };
    if meta.is_icmp_error() {
        return 0;
    }
    let fam = meta.family;
    let (src, dst) = addrs(buf, l3, fam);
    if is_multicast_or_broadcast(&dst, fam) {
        return 0;
    }
    let (iphl, max_ip) = match fam {
        Family::V4 => (ipv4::MIN_HEADER_LEN, ICMPV4_ERROR_MAX),
        Family::V6 => (ipv6::HEADER_LEN, ICMPV6_ERROR_MAX),
    };
    let hdr = iphl + icmp::HEADER_LEN;
    if buf.len() < l3 + hdr {
        return 0;
    }
    let quote = (ip_end - l3).min(max_ip - hdr).min(buf.len() - l3 - hdr);
    buf.copy_within(l3..l3 + quote, l3 + hdr);
    let icmp_len = icmp::HEADER_LEN + quote;
    emit_ip(
        buf,
        l3,
        fam,
        &dst,
        &src,
        if fam == Family::V4 {
            IpProto::ICMP
        } else {
            IpProto::ICMPV6
        },
        icmp_len,
    );
    let m = l3 + iphl;
    let msg = &mut buf[m..m + icmp_len];
    let (msg_type, code) = match fam {
        Family::V4 => (icmpv4::types::DEST_UNREACH, icmpv4::CODE_PORT_UNREACH),
        Family::V6 => (icmpv6::types::DEST_UNREACH, icmpv6::CODE_PORT_UNREACH),
    };
    let header = icmp::Repr {
        msg_type,
        code,
        rest_of_header: 0,
    };
    // The reply goes from the packet's destination back to its source.
    let _ = header.emit(msg, &dst, &src, fam);
    swap_macs(buf, link);
    m + icmp_len
}
