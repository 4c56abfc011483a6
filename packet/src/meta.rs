//! The one-pass parse used on the fast path: link header, IP header (options / extension chain),
//! and the first transport header, into the `Copy` [`PacketMeta`] the dataplane keys its tables
//! with. Straight-line code, no allocation, every read preceded by a length check.

use crate::addr::{Addr, Family};
use crate::ethernet::{self, ethertype};
use crate::field::{arr, get16, get32};
use crate::protocol::IpProto;
use crate::{icmp, icmpv4, icmpv6, ipv4, ipv6, sctp, tcp, udp, LinkType, ParseError};

/// Fragmentation state of an IP packet (IPv4 flags/offset or the IPv6 fragment header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Frag {
    /// IPv4 identification (widened) or IPv6 fragment identification.
    pub id: u32,
    /// Fragment offset in bytes.
    pub offset: u16,
    /// More-fragments flag.
    pub more: bool,
    /// True when this packet is a fragment (MF set or offset non-zero); an IPv6 "atomic fragment"
    /// (fragment header with offset 0 and no MF) is a whole packet and reports false.
    pub is_fragment: bool,
}

/// Everything the fast path needs to know about an IP packet, found in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PacketMeta {
    /// Offset of the IP header in the frame (after Ethernet + VLAN tags).
    pub l3_off: u16,
    /// Offset of the transport header (after IPv4 options / IPv6 extension chain); 0 when absent.
    pub l4_off: u16,
    /// Bytes from `l4_off` to the end of the IP payload (IP length, not frame length).
    pub l4_len: u16,
    /// Total IP packet length (IPv4 total length / IPv6 40 + payload length).
    pub ip_len: u16,
    /// Address family.
    pub family: Family,
    /// Transport protocol after the extension-header chain.
    pub proto: IpProto,
    /// Source address.
    pub src: Addr,
    /// Destination address.
    pub dst: Addr,
    /// TCP/UDP/SCTP source port; ICMP/ICMPv6 echo identifier; else 0.
    pub sport: u16,
    /// TCP/UDP/SCTP destination port; ICMP/ICMPv6 echo identifier; else 0.
    pub dport: u16,
    /// TCP flags byte (FIN=0x01 SYN=0x02 RST=0x04 PSH=0x08 ACK=0x10).
    pub tcp_flags: u8,
    /// ICMP/ICMPv6 type.
    pub icmp_type: u8,
    /// ICMP/ICMPv6 code.
    pub icmp_code: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: u8,
    /// Fragmentation.
    pub frag: Frag,
    /// SCTP verification tag.
    pub sctp_vtag: u32,
    /// SCTP first chunk type.
    pub sctp_chunk: u8,
}

impl PacketMeta {
    /// True when the packet carries the L4 header (not a non-first fragment).
    #[inline]
    pub fn is_first_fragment_or_whole(&self) -> bool {
        self.frag.offset == 0
    }

    /// True when there is a parsed transport header.
    #[inline]
    pub fn has_l4(&self) -> bool {
        self.l4_off != 0
    }

    /// An ICMP header of the packet's own family (ICMP over IPv4, ICMPv6 over IPv6).
    #[inline]
    pub(crate) fn is_icmp(&self) -> bool {
        self.has_l4()
            && ((self.family == Family::V4 && self.proto == IpProto::ICMP)
                || (self.family == Family::V6 && self.proto == IpProto::ICMPV6))
    }

    /// ICMP echo request / ICMPv6 echo request.
    #[inline]
    pub fn is_icmp_echo_request(&self) -> bool {
        self.is_icmp()
            && match self.family {
                Family::V4 => self.icmp_type == icmpv4::types::ECHO_REQUEST,
                Family::V6 => self.icmp_type == icmpv6::types::ECHO_REQUEST,
            }
    }

    /// ICMP echo reply / ICMPv6 echo reply.
    #[inline]
    pub fn is_icmp_echo_reply(&self) -> bool {
        self.is_icmp()
            && match self.family {
                Family::V4 => self.icmp_type == icmpv4::types::ECHO_REPLY,
                Family::V6 => self.icmp_type == icmpv6::types::ECHO_REPLY,
            }
    }

    /// ICMP error quoting a packet: destination unreachable, time exceeded, parameter problem,
    /// and (IPv6) packet too big.
    #[inline]
    pub fn is_icmp_error(&self) -> bool {
        self.is_icmp() && icmp::is_error(self.family, self.icmp_type)
    }

    /// Offset one past the end of the IP packet in the frame.
    #[inline]
    pub fn ip_end(&self) -> usize {
        self.l3_off as usize + self.ip_len as usize
    }
}

/// Result of [`parse`]: an IP packet, or a frame the dataplane does not handle (ARP, LLDP,
/// a third VLAN tag ...) and passes to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// An IPv4 / IPv6 packet.
    Ip(PacketMeta),
    /// Not IP.
    NotIp,
}

impl Parsed {
    /// The meta of an IP packet.
    #[inline]
    pub fn ip(self) -> Option<PacketMeta> {
        match self {
            Parsed::Ip(m) => Some(m),
            Parsed::NotIp => None,
        }
    }
}

/// Parses a frame in one pass. See the crate docs (`docs/dev/packet-api.md`) for the rules.
#[inline]
pub fn parse(frame: &[u8], link: LinkType) -> Result<Parsed, ParseError> {
    let mut m = PacketMeta::default();
    if parse_into(frame, link, &mut m)? {
        Ok(Parsed::Ip(m))
    } else {
        Ok(Parsed::NotIp)
    }
}

/// [`parse`] into a caller's `PacketMeta` (the fast path's scratch slot): `Ok(true)` for IP,
/// `Ok(false)` for other frames. The general parse: the pipeline tries [`parse_plain_v4`]
/// itself first (it packs the flow key from that parse's numbers), so this does not try it
/// again. Filling the destination in place, rather than returning the
/// struct, spares the copy that showed up in the replay profile (the fields are written as bytes
/// and words; copying them as a block right after stalls on store forwarding).
// Always inlined: called out of line (as the pipeline's grown parse loop let the compiler
// choose), the fields it stores one by one were read back at once by `Tuple::from_meta`, a
// store-forwarding stall per packet in the replay profile.
#[inline(always)]
pub fn parse_into(frame: &[u8], link: LinkType, m: &mut PacketMeta) -> Result<bool, ParseError> {
    let (l3, v6) = match link {
        LinkType::Ethernet => {
            let (et, off) = ethernet::l3_offset(frame)?;
            match et {
                ethertype::IPV4 => (off, false),
                ethertype::IPV6 => (off, true),
                _ => return Ok(false),
            }
        }
        LinkType::RawIp => match frame.first() {
            None => return Err(ParseError::Truncated),
            Some(b) if b >> 4 == 4 => (0, false),
            Some(b) if b >> 4 == 6 => (0, true),
            Some(_) => return Err(ParseError::BadVersion),
        },
    };
    let ip = &frame[l3..];
    if v6 {
        parse_v6(ip, l3, m)?;
    } else {
        parse_v4(ip, l3, m)?;
    }
    Ok(true)
}

/// Bytes of an untagged Ethernet frame up to the end of a 20-byte IPv4 header and a 20-byte
/// TCP header (a UDP header's 8 fit in it too): what [`parse_plain_v4`] reads at fixed offsets.
pub(crate) const PLAIN_V4_LEN: usize =
    ethernet::HEADER_LEN + ipv4::MIN_HEADER_LEN + tcp::MIN_HEADER_LEN;
/// Where a plain IPv4 frame's IP header starts ([`parse_plain_v4`]).
pub const PLAIN_V4_L3: usize = ethernet::HEADER_LEN;
/// Where a plain IPv4 frame's transport header starts ([`parse_plain_v4`]).
pub const PLAIN_V4_L4: usize = PLAIN_V4_L3 + ipv4::MIN_HEADER_LEN;

/// A plain IPv4 frame's flow fields as numbers (host order), as [`parse_plain_v4`] read them:
/// what a flow key is packed from without reading the addresses back out of the meta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainV4 {
    /// IPv4 source address (`u32::from_be_bytes` of the octets).
    pub src: u32,
    /// IPv4 destination address (`u32::from_be_bytes` of the octets).
    pub dst: u32,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// [`IpProto::TCP`] or [`IpProto::UDP`].
    pub proto: IpProto,
}

/// The common frame in one length check: untagged Ethernet, IPv4 without options and not a
/// fragment, TCP or UDP, whose lengths are consistent ("plain": IP header at
/// [`PLAIN_V4_L3`], transport header at [`PLAIN_V4_L4`], both whole in the frame). Reads its
/// fields from a fixed-size array (no bounds check per field) and writes `m` whole, exactly as
/// [`parse_into`] would, returning the flow fields; returns None, having written nothing, for
/// any other frame (including every malformed one: [`parse_into`] then reports its error).
#[inline(always)]
pub fn parse_plain_v4(frame: &[u8], m: &mut PacketMeta) -> Option<PlainV4> {
    const L3: usize = PLAIN_V4_L3;
    const L4: usize = PLAIN_V4_L4;
    let h = frame.first_chunk::<PLAIN_V4_LEN>()?;
    let be16 = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
    let be32 = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    // EtherType IPv4, then version 4 with a 20-byte header, no fragment flag or offset (DF
    // allowed): one compare each.
    if be16(12) != ethertype::IPV4
        || h[L3 + ipv4::field::VER_IHL] != 0x45
        || be16(L3 + ipv4::field::FLAGS_FRAG) & 0x3fff != 0
    {
        return None;
    }
    let tl = be16(L3 + ipv4::field::TOTAL_LEN) as usize;
    if tl > frame.len() - L3 {
        return None;
    }
    let l4_len = tl.wrapping_sub(ipv4::MIN_HEADER_LEN);
    let (proto, tcp_flags) = match IpProto(h[L3 + ipv4::field::PROTOCOL]) {
        IpProto::TCP => {
            let doff = (h[L4 + tcp::field::DATA_OFF] >> 4) as usize * 4;
            if tl < ipv4::MIN_HEADER_LEN + tcp::MIN_HEADER_LEN
                || doff < tcp::MIN_HEADER_LEN
                || doff > l4_len
            {
                return None;
            }
            (IpProto::TCP, h[L4 + tcp::field::FLAGS])
        }
        IpProto::UDP => {
            let ulen = be16(L4 + udp::field::LEN) as usize;
            if tl < ipv4::MIN_HEADER_LEN + udp::HEADER_LEN
                || ulen < udp::HEADER_LEN
                || ulen > l4_len
            {
                return None;
            }
            (IpProto::UDP, 0)
        }
        _ => return None,
    };
    let plain = PlainV4 {
        src: be32(L3 + ipv4::field::SRC),
        dst: be32(L3 + ipv4::field::DST),
        // TCP and UDP keep their ports at the same offsets.
        sport: be16(L4 + tcp::field::SRC_PORT),
        dport: be16(L4 + tcp::field::DST_PORT),
        proto,
    };
    *m = PacketMeta {
        l3_off: L3 as u16,
        l4_off: L4 as u16,
        l4_len: l4_len as u16,
        ip_len: tl as u16,
        family: Family::V4,
        proto,
        src: Addr::from_v4(plain.src.to_be_bytes()),
        dst: Addr::from_v4(plain.dst.to_be_bytes()),
        sport: plain.sport,
        dport: plain.dport,
        tcp_flags,
        ttl: h[L3 + ipv4::field::TTL],
        frag: Frag {
            id: be16(L3 + ipv4::field::IDENT) as u32,
            ..Frag::default()
        },
        ..PacketMeta::default()
    };
    Some(plain)
}

// Always inlined, as `parse_into`: the IPv4 case is the fast path's.
#[inline(always)]
fn parse_v4(ip: &[u8], l3: usize, m: &mut PacketMeta) -> Result<(), ParseError> {
    let (hl, tl) = ipv4::check(ip)?;
    let fo = get16(ip, ipv4::field::FLAGS_FRAG);
    let offset = (fo & 0x1fff) << 3;
    let more = fo & 0x2000 != 0;
    *m = PacketMeta {
        l3_off: l3 as u16,
        ip_len: tl as u16,
        family: Family::V4,
        proto: IpProto(ip[ipv4::field::PROTOCOL]),
        src: Addr::from_v4(arr(ip, ipv4::field::SRC)),
        dst: Addr::from_v4(arr(ip, ipv4::field::DST)),
        ttl: ip[ipv4::field::TTL],
        frag: Frag {
            id: get16(ip, ipv4::field::IDENT) as u32,
            offset,
            more,
            is_fragment: more || offset != 0,
        },
        ..PacketMeta::default()
    };
    if offset != 0 {
        return Ok(());
    }
    parse_l4(m, &ip[hl..tl], l3 + hl)
}

#[inline]
fn parse_v6(ip: &[u8], l3: usize, m: &mut PacketMeta) -> Result<(), ParseError> {
    let len = ipv6::check(ip)?;
    // `ip_len` is a u16: 40 + payload length must fit (no jumbo payloads on our MTUs).
    if len > u16::MAX as usize {
        return Err(ParseError::BadTotalLength);
    }
    let payload = &ip[ipv6::HEADER_LEN..len];
    let end = ipv6::walk_chain(payload, ip[ipv6::field::NEXT_HEADER])?;
    *m = PacketMeta {
        l3_off: l3 as u16,
        ip_len: len as u16,
        family: Family::V6,
        proto: end.proto,
        src: Addr(arr(ip, ipv6::field::SRC)),
        dst: Addr(arr(ip, ipv6::field::DST)),
        ttl: ip[ipv6::field::HOP_LIMIT],
        ..PacketMeta::default()
    };
    if let Some(f) = end.frag {
        m.frag = Frag {
            id: f.id,
            offset: f.offset,
            more: f.more,
            is_fragment: f.more || f.offset != 0,
        };
    }
    if !end.has_l4 {
        return Ok(());
    }
    parse_l4(
        m,
        &payload[end.offset..],
        l3 + ipv6::HEADER_LEN + end.offset,
    )
}

#[inline(always)]
fn parse_l4(m: &mut PacketMeta, l4: &[u8], off: usize) -> Result<(), ParseError> {
    m.l4_off = off as u16;
    m.l4_len = l4.len() as u16;
    match m.proto {
        IpProto::TCP => {
            tcp::check(l4)?;
            m.sport = get16(l4, tcp::field::SRC_PORT);
            m.dport = get16(l4, tcp::field::DST_PORT);
            m.tcp_flags = l4[tcp::field::FLAGS];
        }
        IpProto::UDP => {
            if l4.len() < udp::HEADER_LEN {
                return Err(ParseError::Truncated);
            }
            let ulen = get16(l4, udp::field::LEN) as usize;
            // A first fragment's UDP length covers the reassembled datagram.
            if ulen < udp::HEADER_LEN || (ulen > l4.len() && !m.frag.more) {
                return Err(ParseError::BadLength);
            }
            m.sport = get16(l4, udp::field::SRC_PORT);
            m.dport = get16(l4, udp::field::DST_PORT);
        }
        IpProto::SCTP => {
            if m.frag.more {
                if l4.len() < sctp::HEADER_LEN + sctp::CHUNK_HEADER_LEN {
                    return Err(ParseError::Truncated);
                }
            } else {
                sctp::check_with_chunk(l4)?;
            }
            m.sport = get16(l4, 0);
            m.dport = get16(l4, 2);
            m.sctp_vtag = get32(l4, 4);
            m.sctp_chunk = l4[12];
        }
        IpProto::ICMP | IpProto::ICMPV6 => {
            let matches_family = (m.proto == IpProto::ICMP) == (m.family == Family::V4);
            if matches_family {
                if l4.len() < icmp::HEADER_LEN {
                    return Err(ParseError::Truncated);
                }
                m.icmp_type = l4[icmp::field::TYPE];
                m.icmp_code = l4[icmp::field::CODE];
                if icmp::is_echo(m.family, m.icmp_type) {
                    m.sport = get16(l4, icmp::field::ECHO_IDENT);
                    m.dport = m.sport;
                }
            }
        }
        _ => {}
    }
    Ok(())
}
