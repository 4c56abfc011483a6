//! Shared test helpers: packets built with etherparse's PacketBuilder, and checksum verification
//! by etherparse (an independent implementation) plus a bitwise reference CRC32c for SCTP.
#![allow(dead_code)]

use etherparse::{
    IpHeaders, IpNumber, Ipv4Extensions, Ipv4Header, Ipv6Extensions, Ipv6FlowLabel, Ipv6Header,
    Ipv6RawExtHeader, Ipv6RoutingExtensions, NetHeaders, PacketBuilder, PacketBuilderStep,
    PacketHeaders, TransportHeader, VlanId,
};
use kxdp_packet::{
    ipv4, parse, sctp, tcp, udp, verify, Addr, Family, IpProto, LinkType, PacketMeta, Parsed,
};

pub const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const V4_SRC: [u8; 4] = [10, 1, 2, 3];
pub const V4_DST: [u8; 4] = [10, 96, 0, 10];
pub const V6_SRC: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
pub const V6_DST: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0x0a];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    Tcp,
    Udp,
    /// UDP over IPv4 with checksum 0 (IPv6: same as Udp).
    UdpNoCsum,
    Sctp,
    IcmpEcho,
}

pub const ALL_L4: [L4; 5] = [L4::Tcp, L4::Udp, L4::UdpNoCsum, L4::Sctp, L4::IcmpEcho];

#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub v6: bool,
    /// 0, 1 (802.1Q) or 2 (802.1ad + 802.1Q) tags.
    pub vlans: u8,
    /// IPv4 options / IPv6 hop-by-hop + routing + destination options.
    pub opts: bool,
    pub l4: L4,
    pub payload_len: usize,
}

impl Spec {
    pub fn new(v6: bool, l4: L4) -> Spec {
        Spec {
            v6,
            vlans: 0,
            opts: false,
            l4,
            payload_len: 11,
        }
    }
}

/// Every combination of family, tagging, options and transport.
pub fn all_specs() -> Vec<Spec> {
    let mut v = Vec::new();
    for v6 in [false, true] {
        for vlans in 0..3 {
            for opts in [false, true] {
                for l4 in ALL_L4 {
                    v.push(Spec {
                        v6,
                        vlans,
                        opts,
                        l4,
                        payload_len: 11 + vlans as usize * 100,
                    });
                }
            }
        }
    }
    v
}

pub fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

fn ip_headers(s: &Spec) -> IpHeaders {
    if s.v6 {
        let h = Ipv6Header {
            traffic_class: 0,
            flow_label: Ipv6FlowLabel::ZERO,
            payload_length: 0,
            next_header: IpNumber::UDP,
            hop_limit: 63,
            source: V6_SRC,
            destination: V6_DST,
        };
        let mut e = Ipv6Extensions::default();
        if s.opts {
            e.hop_by_hop_options =
                Some(Ipv6RawExtHeader::new_raw(IpNumber(0), &[1, 4, 0, 0, 0, 0]).unwrap());
            e.routing = Some(Ipv6RoutingExtensions {
                routing: Ipv6RawExtHeader::new_raw(
                    IpNumber(0),
                    &[4, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
                )
                .unwrap(),
                final_destination_options: None,
            });
            e.destination_options =
                Some(Ipv6RawExtHeader::new_raw(IpNumber(0), &[1, 4, 0, 0, 0, 0]).unwrap());
        }
        IpHeaders::Ipv6(h, e)
    } else {
        let mut h = Ipv4Header::new(0, 63, IpNumber::UDP, V4_SRC, V4_DST).unwrap();
        h.identification = 0x4242;
        if s.opts {
            // Record route (7 bytes) + end of options.
            h.options = [7u8, 7, 4, 0, 0, 0, 0, 0][..].try_into().unwrap();
        }
        IpHeaders::Ipv4(h, Ipv4Extensions::default())
    }
}

fn ip_step(s: &Spec, raw: bool) -> PacketBuilderStep<IpHeaders> {
    let ip = ip_headers(s);
    if raw {
        return PacketBuilder::ip(ip);
    }
    let eth = PacketBuilder::ethernet2(SRC_MAC, DST_MAC);
    match s.vlans {
        0 => eth.ip(ip),
        1 => eth.single_vlan(VlanId::try_new(100).unwrap()).ip(ip),
        _ => eth
            .double_vlan(VlanId::try_new(200).unwrap(), VlanId::try_new(300).unwrap())
            .ip(ip),
    }
}

/// SCTP packet (common header + one DATA chunk) with a valid CRC32c.
pub fn sctp_bytes(sport: u16, dport: u16, data_len: usize) -> Vec<u8> {
    let chunk_len = 16 + data_len;
    let mut b = vec![0u8; 12 + chunk_len.div_ceil(4) * 4];
    b[12] = sctp::chunk::DATA;
    b[13] = 0x03;
    b[14..16].copy_from_slice(&(chunk_len as u16).to_be_bytes());
    b[16..20].copy_from_slice(&1u32.to_be_bytes());
    for (i, x) in b[28..28 + data_len].iter_mut().enumerate() {
        *x = i as u8;
    }
    sctp::Repr {
        src_port: sport,
        dst_port: dport,
        verification_tag: 0xcafe_f00d,
    }
    .emit(&mut b)
    .unwrap();
    b
}

pub fn build_with(s: &Spec, raw: bool) -> Vec<u8> {
    let step = ip_step(s, raw);
    let pl = payload(s.payload_len);
    let mut v = Vec::new();
    match s.l4 {
        L4::Tcp => step
            .tcp(40000, 80, 0x1000_0000, 64000)
            .syn()
            .write(&mut v, &pl)
            .unwrap(),
        L4::Udp | L4::UdpNoCsum => step.udp(40001, 53).write(&mut v, &pl).unwrap(),
        L4::Sctp => step
            .write(
                &mut v,
                IpNumber(132),
                &sctp_bytes(40002, 38412, s.payload_len),
            )
            .unwrap(),
        L4::IcmpEcho => {
            if s.v6 {
                step.icmpv6_echo_request(0x777, 1)
                    .write(&mut v, &pl)
                    .unwrap()
            } else {
                step.icmpv4_echo_request(0x777, 1)
                    .write(&mut v, &pl)
                    .unwrap()
            }
        }
    }
    if s.l4 == L4::UdpNoCsum && !s.v6 {
        let m = meta(
            &v,
            if raw {
                LinkType::RawIp
            } else {
                LinkType::Ethernet
            },
        );
        let o = m.l4_off as usize + 6;
        v[o] = 0;
        v[o + 1] = 0;
    }
    v
}

pub fn build(s: &Spec) -> Vec<u8> {
    build_with(s, false)
}

pub fn meta(frame: &[u8], link: LinkType) -> PacketMeta {
    match parse(frame, link) {
        Ok(Parsed::Ip(m)) => m,
        other => panic!("expected IP, got {other:?}"),
    }
}

/// Bitwise reference CRC32c (reflected polynomial 0x82F63B78), independent of the crate.
pub fn ref_crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Verifies every checksum with etherparse (and the reference CRC32c for SCTP) and with
/// `verify::checksums`. Returns the etherparse headers for further field checks.
pub fn verify_all(frame: &[u8], link: LinkType) -> PacketHeaders<'_> {
    let m = meta(frame, link);
    verify::checksums(frame, &m).unwrap_or_else(|e| panic!("verify::checksums: {e:?}"));
    let h = match link {
        LinkType::Ethernet => PacketHeaders::from_ethernet_slice(frame).expect("etherparse"),
        LinkType::RawIp => PacketHeaders::from_ip_slice(frame).expect("etherparse"),
    };
    let pl = h.payload.slice();
    match (&h.net, &h.transport) {
        (Some(NetHeaders::Ipv4(ip, _)), t) => {
            assert_eq!(
                ip.header_checksum,
                ip.calc_header_checksum(),
                "ipv4 header checksum"
            );
            match t {
                Some(TransportHeader::Tcp(t)) => {
                    assert_eq!(t.checksum, t.calc_checksum_ipv4(ip, pl).unwrap(), "tcp")
                }
                Some(TransportHeader::Udp(u)) if u.checksum != 0 => {
                    assert_eq!(u.checksum, u.calc_checksum_ipv4(ip, pl).unwrap(), "udp");
                }
                Some(TransportHeader::Icmpv4(i)) => {
                    let want =
                        etherparse::Icmpv4Header::with_checksum(i.icmp_type.clone(), pl).checksum;
                    assert_eq!(i.checksum, want, "icmpv4");
                }
                None if ip.protocol == IpNumber(132) && !m.frag.is_fragment => check_sctp(pl),
                _ => {}
            }
        }
        (Some(NetHeaders::Ipv6(ip, _)), t) => match t {
            Some(TransportHeader::Tcp(t)) => {
                assert_eq!(t.checksum, t.calc_checksum_ipv6(ip, pl).unwrap(), "tcp")
            }
            Some(TransportHeader::Udp(u)) => {
                assert_eq!(u.checksum, u.calc_checksum_ipv6(ip, pl).unwrap(), "udp")
            }
            Some(TransportHeader::Icmpv6(i)) => {
                let want = etherparse::Icmpv6Header::with_checksum(
                    i.icmp_type,
                    ip.source,
                    ip.destination,
                    pl,
                )
                .unwrap()
                .checksum;
                assert_eq!(i.checksum, want, "icmpv6");
            }
            None if m.proto == IpProto::SCTP && !m.frag.is_fragment => check_sctp(pl),
            _ => {}
        },
        other => panic!("no IP in etherparse result: {other:?}"),
    }
    h
}

fn check_sctp(pkt: &[u8]) {
    let mut z = pkt.to_vec();
    let stored = u32::from_le_bytes([z[8], z[9], z[10], z[11]]);
    z[8..12].fill(0);
    assert_eq!(stored, ref_crc32c(&z), "sctp crc32c");
}

/// The frame with every checksum recomputed from scratch by the views' `fill_checksum`.
pub fn full_recompute(frame: &[u8], m: &PacketMeta) -> Vec<u8> {
    let mut f = frame.to_vec();
    let l3 = m.l3_off as usize;
    let end = m.ip_end();
    if m.family == Family::V4 {
        ipv4::Packet::new_checked(&mut f[l3..end])
            .unwrap()
            .fill_checksum();
    }
    if m.l4_off == 0 || m.frag.is_fragment {
        return f;
    }
    let l4 = &mut f[m.l4_off as usize..end];
    match m.proto {
        IpProto::TCP => tcp::Segment::new_checked(l4)
            .unwrap()
            .fill_checksum(&m.src, &m.dst, m.family),
        IpProto::UDP => {
            let mut d = udp::Datagram::new_checked(l4).unwrap();
            if !(m.family == Family::V4 && d.checksum() == 0) {
                d.fill_checksum(&m.src, &m.dst, m.family);
            }
        }
        IpProto::SCTP => sctp::Packet::new_checked(l4).unwrap().fill_checksum(),
        IpProto::ICMP | IpProto::ICMPV6 => kxdp_packet::icmp::Message::new_checked(l4)
            .unwrap()
            .fill_checksum(&m.src, &m.dst, m.family),
        _ => {}
    }
    f
}

pub fn addr_of(v6: bool, v4: [u8; 4], v6a: [u8; 16]) -> Addr {
    if v6 {
        Addr::from_v6(v6a)
    } else {
        Addr::from_v4(v4)
    }
}
