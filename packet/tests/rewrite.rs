//! NAT rewrite over every packet shape: checksums re-verified by etherparse and by
//! `verify::checksums`, and the incremental result equal to a full recomputation.

mod common;

use common::*;
use etherparse::{NetHeaders, PacketHeaders, TransportHeader};
use kxdp_packet::{ipv4, ipv6, parse, rewrite, verify, Addr, Family, IpProto, LinkType, Parsed};

const NEW_V4_SRC: [u8; 4] = [192, 168, 77, 1];
const NEW_V4_DST: [u8; 4] = [10, 244, 3, 17];
const NEW_V6_SRC: [u8; 16] = [
    0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd,
];
const NEW_V6_DST: [u8; 16] = [
    0xfd, 0, 0, 0, 0, 0, 0, 0x0a, 0xf4, 0, 0, 0, 0, 0, 0x03, 0x11,
];

fn ports(h: &PacketHeaders) -> Option<(u16, u16)> {
    match &h.transport {
        Some(TransportHeader::Tcp(t)) => Some((t.source_port, t.destination_port)),
        Some(TransportHeader::Udp(u)) => Some((u.source_port, u.destination_port)),
        _ => None,
    }
}

fn ip_addrs(h: &PacketHeaders) -> (Vec<u8>, Vec<u8>) {
    match &h.net {
        Some(NetHeaders::Ipv4(ip, _)) => (ip.source.to_vec(), ip.destination.to_vec()),
        Some(NetHeaders::Ipv6(ip, _)) => (ip.source.to_vec(), ip.destination.to_vec()),
        _ => panic!("no ip"),
    }
}

fn check_rewrite(s: &Spec, raw: bool) {
    let link = if raw {
        LinkType::RawIp
    } else {
        LinkType::Ethernet
    };
    let mut f = build_with(s, raw);
    let orig = f.clone();
    let mut m = meta(&f, link);
    verify_all(&f, link);

    // Meta fields against what was built.
    let l3 = if raw { 0 } else { 14 + 4 * s.vlans as usize };
    assert_eq!(m.l3_off as usize, l3, "{s:?}");
    assert_eq!(m.family, if s.v6 { Family::V6 } else { Family::V4 });
    assert_eq!(m.src, addr_of(s.v6, V4_SRC, V6_SRC));
    assert_eq!(m.dst, addr_of(s.v6, V4_DST, V6_DST));
    assert_eq!(m.ttl, 63);
    assert_eq!(m.ip_len as usize, f.len() - l3);
    let l3_len = match (s.v6, s.opts) {
        (false, false) => 20,
        (false, true) => 28,
        (true, false) => 40,
        (true, true) => 40 + 8 + 16 + 8,
    };
    assert_eq!(m.l4_off as usize, l3 + l3_len, "{s:?}");
    assert_eq!(m.l4_len as usize, f.len() - l3 - l3_len);
    let (sport, dport) = match s.l4 {
        L4::Tcp => (40000, 80),
        L4::Udp | L4::UdpNoCsum => (40001, 53),
        L4::Sctp => (40002, 38412),
        L4::IcmpEcho => (0x777, 0x777),
    };
    assert_eq!((m.sport, m.dport), (sport, dport), "{s:?}");
    match s.l4 {
        L4::Tcp => assert_eq!((m.proto, m.tcp_flags), (IpProto::TCP, 0x02)),
        L4::Sctp => assert_eq!(
            (m.proto, m.sctp_vtag, m.sctp_chunk),
            (IpProto::SCTP, 0xcafe_f00d, 0)
        ),
        L4::IcmpEcho => {
            assert!(m.is_icmp_echo_request() && !m.is_icmp_echo_reply() && !m.is_icmp_error())
        }
        _ => assert_eq!(m.proto, IpProto::UDP),
    }

    // DNAT + SNAT of everything.
    let (nsrc, ndst) = (
        addr_of(s.v6, NEW_V4_SRC, NEW_V6_SRC),
        addr_of(s.v6, NEW_V4_DST, NEW_V6_DST),
    );
    let (nsport, ndport) = (50123, 8080);
    rewrite(&mut f, &mut m, nsrc, nsport, ndst, ndport);
    assert_eq!(f.len(), orig.len());
    let h = verify_all(&f, link);
    assert_eq!(m, meta(&f, link), "meta updated to match the frame ({s:?})");
    let (a, b) = ip_addrs(&h);
    let alen = if s.v6 { 16 } else { 4 };
    assert_eq!(
        (&a[..], &b[..]),
        (&nsrc.0[16 - alen..], &ndst.0[16 - alen..])
    );
    match s.l4 {
        L4::Tcp | L4::Udp | L4::UdpNoCsum => assert_eq!(ports(&h), Some((nsport, ndport))),
        L4::Sctp => assert_eq!((m.sport, m.dport), (nsport, ndport)),
        L4::IcmpEcho => assert_eq!((m.sport, m.dport), (nsport, nsport)),
    }
    assert_eq!(
        f,
        full_recompute(&f, &m),
        "incremental == full recomputation ({s:?})"
    );
    if s.l4 == L4::UdpNoCsum && !s.v6 {
        let o = m.l4_off as usize + 6;
        assert_eq!(&f[o..o + 2], &[0, 0], "IPv4 UDP zero checksum stays zero");
    }
    // Payload untouched.
    let end = m.ip_end();
    let pl = s.payload_len.min(16);
    assert_eq!(&f[end - pl..end], &orig[end - pl..end]);

    // And back (the reply path): the original frame is restored exactly.
    let (osrc, odst) = (addr_of(s.v6, V4_SRC, V6_SRC), addr_of(s.v6, V4_DST, V6_DST));
    let (osport, odport) = if s.l4 == L4::IcmpEcho {
        (0x777, 0x777)
    } else {
        (sport, dport)
    };
    rewrite(&mut f, &mut m, osrc, osport, odst, odport);
    verify_all(&f, link);
    assert_eq!(f, orig, "round trip restores the frame ({s:?})");
}

#[test]
fn rewrite_every_shape_ethernet() {
    for s in all_specs() {
        check_rewrite(&s, false);
    }
}

#[test]
fn rewrite_raw_ip() {
    for s in all_specs().into_iter().filter(|s| s.vlans == 0) {
        check_rewrite(&s, true);
    }
}

#[test]
fn rewrite_only_ports_or_only_addresses() {
    for v6 in [false, true] {
        for l4 in [L4::Tcp, L4::Udp] {
            let s = Spec::new(v6, l4);
            let mut f = build(&s);
            let mut m = meta(&f, LinkType::Ethernet);
            let (src, dst) = (m.src, m.dst);
            rewrite(&mut f, &mut m, src, 1, dst, 2);
            verify_all(&f, LinkType::Ethernet);
            assert_eq!(f, full_recompute(&f, &m));
            let nd = addr_of(v6, NEW_V4_DST, NEW_V6_DST);
            rewrite(&mut f, &mut m, src, 1, nd, 2);
            verify_all(&f, LinkType::Ethernet);
            assert_eq!(f, full_recompute(&f, &m));
        }
    }
}

/// Makes the built packet a fragment at `offset` (bytes) with MF = `more`; fixes the IPv4 header
/// checksum. IPv6: inserts a fragment header.
fn fragment(s: &Spec, offset: u16, more: bool) -> Vec<u8> {
    let f = build(s);
    let m = meta(&f, LinkType::Ethernet);
    let l3 = m.l3_off as usize;
    if !s.v6 {
        let mut f = f;
        let mut p = ipv4::Packet::new_checked(&mut f[l3..]).unwrap();
        p.set_frag(false, more, offset);
        p.fill_checksum();
        f
    } else {
        // Insert a fragment header right after the fixed header (no other ext headers in s).
        let mut out = f[..l3 + 40].to_vec();
        let nh = out[l3 + 6];
        out[l3 + 6] = ipv6::ext::FRAGMENT;
        let pl = u16::from_be_bytes([out[l3 + 4], out[l3 + 5]]) + 8;
        out[l3 + 4..l3 + 6].copy_from_slice(&pl.to_be_bytes());
        out.extend_from_slice(&[nh, 0]);
        out.extend_from_slice(&(offset | more as u16).to_be_bytes());
        out.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        out.extend_from_slice(&f[l3 + 40..]);
        out
    }
}

#[test]
fn non_first_fragments_rewrite_addresses_only() {
    for v6 in [false, true] {
        for l4 in [L4::Tcp, L4::Udp, L4::Sctp] {
            let s = Spec::new(v6, l4);
            let mut f = fragment(&s, 1480, true);
            let orig = f.clone();
            let mut m = meta(&f, LinkType::Ethernet);
            assert!(m.frag.is_fragment && m.frag.more && m.frag.offset == 1480);
            assert!(!m.is_first_fragment_or_whole());
            assert_eq!((m.l4_off, m.sport, m.dport), (0, 0, 0));
            if v6 {
                assert_eq!(m.frag.id, 0x1234_5678);
            } else {
                assert_eq!(m.frag.id, 0x4242);
            }
            let nd = addr_of(v6, NEW_V4_DST, NEW_V6_DST);
            let src = m.src;
            rewrite(&mut f, &mut m, src, 1111, nd, 2222);
            verify::checksums(&f, &m).unwrap();
            assert_eq!((m.sport, m.dport), (0, 0));
            assert_eq!(m.dst, nd);
            let l3 = m.l3_off as usize;
            let ip_hl = if v6 { 48 } else { 20 };
            // Everything after the IP header (the would-be L4 bytes) is untouched.
            assert_eq!(&f[l3 + ip_hl..], &orig[l3 + ip_hl..]);
            let again = meta(&f, LinkType::Ethernet);
            assert_eq!(again.dst, nd);
        }
    }
}

#[test]
fn first_fragment_rewrites_ports_incrementally() {
    for v6 in [false, true] {
        let s = Spec {
            payload_len: 64,
            ..Spec::new(v6, L4::Udp)
        };
        let whole = build(&s);
        let mut f = fragment(&s, 0, true);
        let mut m = meta(&f, LinkType::Ethernet);
        assert!(m.frag.is_fragment && m.is_first_fragment_or_whole());
        assert_eq!((m.sport, m.dport), (40001, 53));
        let nd = addr_of(v6, NEW_V4_DST, NEW_V6_DST);
        let src = m.src;
        rewrite(&mut f, &mut m, src, 3000, nd, 4000);
        // The UDP checksum (over the whole datagram) must equal that of the rewritten whole packet.
        let mut w = whole.clone();
        let mut mw = meta(&w, LinkType::Ethernet);
        let srcw = mw.src;
        rewrite(&mut w, &mut mw, srcw, 3000, nd, 4000);
        verify_all(&w, LinkType::Ethernet);
        let (a, b) = (m.l4_off as usize, mw.l4_off as usize);
        assert_eq!(&f[a..a + 8], &w[b..b + 8]);
    }
}

#[test]
fn icmp_echo_identifier() {
    for v6 in [false, true] {
        let s = Spec::new(v6, L4::IcmpEcho);
        let mut f = build(&s);
        let mut m = meta(&f, LinkType::Ethernet);
        let src = m.src;
        let dst = m.dst;
        rewrite(&mut f, &mut m, src, 0x4321, dst, 0);
        verify_all(&f, LinkType::Ethernet);
        let l4 = m.l4_off as usize;
        assert_eq!(&f[l4 + 4..l4 + 6], &[0x43, 0x21]);
        assert_eq!((m.sport, m.dport), (0x4321, 0x4321));
        assert_eq!(f, full_recompute(&f, &m));
    }
}

#[test]
fn stale_meta_does_not_corrupt() {
    let s = Spec::new(false, L4::Tcp);
    let mut f = build(&s);
    let mut m = meta(&f, LinkType::Ethernet);
    m.ip_len = 5000; // does not fit
    let before = f.clone();
    assert!(kxdp_packet::rewrite::try_rewrite(
        &mut f,
        &mut m,
        Addr::UNSPECIFIED,
        1,
        Addr::UNSPECIFIED,
        2
    )
    .is_err());
    assert_eq!(f, before);
    assert!(matches!(parse(&f, LinkType::Ethernet), Ok(Parsed::Ip(_))));
}

/// The fast lane's IPv4 rewrite writes exactly the bytes of the general one, for every IPv4
/// TCP/UDP shape (options, VLAN tags, a zero UDP checksum) and every subset of changed fields;
/// it refuses (changing nothing) everything else.
#[test]
fn rewrite_v4_ports_matches_rewrite() {
    use kxdp_packet::rewrite_v4_ports;
    let word = |a: [u8; 4]| u32::from_be_bytes(a);
    for s in all_specs() {
        let f = build_with(&s, false);
        let m = meta(&f, LinkType::Ethernet);
        if s.v6 || !matches!(s.l4, L4::Tcp | L4::Udp | L4::UdpNoCsum) {
            let mut g = f.clone();
            assert!(rewrite_v4_ports(&mut g, &m, 1, 2, 3, 4).is_err(), "{s:?}");
            assert_eq!(g, f, "refused, unchanged ({s:?})");
            continue;
        }
        assert_rewrites_as_general(&s, &f, &m, |fast, src, sp, dst, dp| {
            rewrite_v4_ports(fast, &m, word(src), sp, word(dst), dp).unwrap()
        });
        // A meta longer than the frame: refused, unchanged.
        let mut short = f.clone();
        short.truncate(m.ip_end() - 1);
        let copy = short.clone();
        assert!(rewrite_v4_ports(&mut short, &m, 1, 2, 3, 4).is_err());
        assert_eq!(short, copy);
    }
    // Fragments are not the fast lane's.
    let s = Spec::new(false, L4::Udp);
    let f = fragment(&s, 0, true);
    let m = meta(&f, LinkType::Ethernet);
    let mut g = f.clone();
    assert!(rewrite_v4_ports(&mut g, &m, 1, 2, 3, 4).is_err());
}

/// The plain-frame parse (`parse_plain_v4`, which `parse` takes first) against the general
/// parse of the same IP packet (raw IP, which never takes it): every shape and, for every byte
/// of the headers it reads, several values of that byte and several frame lengths. Whenever it
/// accepts a frame, the general parse accepts it with the same meta; it accepts every untagged
/// IPv4 TCP/UDP shape without options.
#[test]
fn parse_plain_v4_matches_the_general_parse() {
    use kxdp_packet::{parse_plain_v4, PacketMeta, PLAIN_V4_L3};
    let general = |f: &[u8]| match parse(&f[PLAIN_V4_L3.min(f.len())..], LinkType::RawIp) {
        Ok(Parsed::Ip(mut g)) => {
            g.l3_off += PLAIN_V4_L3 as u16;
            if g.l4_off != 0 {
                g.l4_off += PLAIN_V4_L3 as u16;
            }
            Some(g)
        }
        _ => None,
    };
    let check = |f: &[u8]| {
        let mut m = PacketMeta::default();
        let Some(p) = parse_plain_v4(f, &mut m) else {
            return false;
        };
        assert_eq!(u16::from_be_bytes([f[12], f[13]]), 0x0800, "{f:?}");
        assert_eq!(Some(m), general(f), "{f:?}");
        assert_eq!(parse(f, LinkType::Ethernet), Ok(Parsed::Ip(m)));
        assert_eq!(Addr::from_v4(p.src.to_be_bytes()), m.src);
        assert_eq!(Addr::from_v4(p.dst.to_be_bytes()), m.dst);
        assert_eq!((p.sport, p.dport, p.proto), (m.sport, m.dport, m.proto));
        true
    };
    let mut accepted = 0;
    for s in with_longer_payloads() {
        let f = build_with(&s, false);
        // (A UDP frame shorter than a TCP header's end takes the general parse.)
        let plain = !s.v6
            && s.vlans == 0
            && !s.opts
            && matches!(s.l4, L4::Tcp | L4::Udp | L4::UdpNoCsum)
            && f.len() >= 54;
        assert_eq!(check(&f), plain, "{s:?}");
        for at in 0..f.len().min(60) {
            for v in [
                0u8,
                1,
                0x05,
                0x06,
                0x11,
                0x20,
                0x45,
                0x46,
                0x50,
                0xff,
                f[at] ^ 0x80,
            ] {
                let mut g = f.clone();
                g[at] = v;
                accepted += check(&g) as u32;
            }
        }
        for len in 0..f.len() {
            check(&f[..len]);
        }
    }
    assert!(accepted > 0);
}

/// The lane's rewrite of a plain frame writes exactly the bytes of the general rewrite, for
/// every plain shape and every subset of changed fields; a frame too short for the headers, or
/// another protocol, is refused unchanged.
#[test]
fn rewrite_plain_v4_matches_rewrite() {
    use kxdp_packet::rewrite_plain_v4;
    let word = |a: [u8; 4]| u32::from_be_bytes(a);
    for (s, f, m, p) in plain_frames() {
        assert_rewrites_as_general(&s, &f, &m, |fast, src, sp, dst, dp| {
            rewrite_plain_v4(fast, p.proto, word(src), sp, word(dst), dp).unwrap()
        });
        let mut g = f.clone();
        assert!(rewrite_plain_v4(&mut g, IpProto::SCTP, 1, 2, 3, 4).is_err());
        assert_eq!(g, f);
        let mut short = f[..14 + 20 + 7].to_vec();
        let copy = short.clone();
        assert!(rewrite_plain_v4(&mut short, p.proto, 1, 2, 3, 4).is_err());
        assert_eq!(short, copy);
    }
}

/// `rewrite_plain_v4_from` (old values as the parse read them, not read from the frame) leaves
/// the same bytes as the general `rewrite` on every plain shape and every subset of changed
/// fields, and the same bytes as `rewrite_plain_v4` with old and new addresses, ports and both
/// checksum fields set to the one's complement edge values (0, 0xffff, all ones, equal old and
/// new, a port from 0xffff to 0); a frame too short, or another protocol, is refused unchanged.
#[test]
fn rewrite_plain_v4_from_matches_rewrite() {
    use kxdp_packet::{rewrite_plain_v4, rewrite_plain_v4_from, PlainV4};
    let word = |a: [u8; 4]| u32::from_be_bytes(a);
    let addrs = [
        0u32,
        1,
        0xffff_ffff,
        0xffff_0000,
        0x0000_ffff,
        0x0a00_0001,
        0xac1e_0029,
    ];
    let ports = [0u16, 1, 0xffff, 0xfffe, 80, 8080];
    let checks = [0u16, 1, 0xfffe, 0xffff, 0x1234];
    for (s, f, m, p) in plain_frames() {
        assert_rewrites_as_general(&s, &f, &m, |fast, src, sp, dst, dp| {
            let to = PlainV4 {
                src: word(src),
                dst: word(dst),
                sport: sp,
                dport: dp,
                ..p
            };
            rewrite_plain_v4_from(fast, &p, &to).unwrap()
        });
        let l4_check = 14 + 20 + if p.proto == IpProto::TCP { 16 } else { 6 };
        let mut n = 0u32;
        for &os in &addrs {
            for &od in &addrs[..3] {
                for &osp in &ports {
                    for &odp in &ports[..3] {
                        let was = PlainV4 {
                            src: os,
                            dst: od,
                            sport: osp,
                            dport: odp,
                            ..p
                        };
                        n = n.wrapping_mul(1_103_515_245).wrapping_add(12345);
                        let pick = |k: u32, len: usize| (n >> k) as usize % len;
                        let to = PlainV4 {
                            src: addrs[pick(3, addrs.len())],
                            dst: [od, addrs[pick(7, addrs.len())]][pick(11, 2)],
                            sport: ports[pick(13, ports.len())],
                            dport: [odp, ports[pick(17, ports.len())]][pick(21, 2)],
                            ..p
                        };
                        let mut g = f.clone();
                        g[26..30].copy_from_slice(&os.to_be_bytes());
                        g[30..34].copy_from_slice(&od.to_be_bytes());
                        g[34..36].copy_from_slice(&osp.to_be_bytes());
                        g[36..38].copy_from_slice(&odp.to_be_bytes());
                        g[24..26].copy_from_slice(&checks[pick(23, checks.len())].to_be_bytes());
                        g[l4_check..l4_check + 2]
                            .copy_from_slice(&checks[pick(26, checks.len())].to_be_bytes());
                        let mut want = g.clone();
                        rewrite_plain_v4(&mut want, p.proto, to.src, to.sport, to.dst, to.dport)
                            .unwrap();
                        let mut got = g.clone();
                        rewrite_plain_v4_from(&mut got, &was, &to).unwrap();
                        assert_eq!(got, want, "{s:?} {was:?} -> {to:?}");
                    }
                }
            }
        }
        let mut g = f.clone();
        let sctp = PlainV4 {
            proto: IpProto::SCTP,
            ..p
        };
        assert!(rewrite_plain_v4_from(&mut g, &sctp, &sctp).is_err());
        assert_eq!(g, f);
        let mut short = f[..53].to_vec();
        let copy = short.clone();
        assert!(rewrite_plain_v4_from(&mut short, &p, &p).is_err());
        assert_eq!(short, copy);
    }
}

/// `fast` (a word rewrite of IPv4 frame `f`, parsed as `m`) leaves the same bytes as the general
/// `rewrite`, for each of a few address and port choices: unchanged, only the destination,
/// only the source, both, and ports alone.
fn assert_rewrites_as_general(
    s: &Spec,
    f: &[u8],
    m: &kxdp_packet::PacketMeta,
    fast: impl Fn(&mut Vec<u8>, [u8; 4], u16, [u8; 4], u16),
) {
    let (sport, dport) = (m.sport, m.dport);
    let choices = [
        (V4_SRC, sport, V4_DST, dport),
        (V4_SRC, sport, NEW_V4_DST, 8080),
        (NEW_V4_SRC, 50123, V4_DST, dport),
        (NEW_V4_SRC, 50123, NEW_V4_DST, 8080),
        (V4_SRC, 1, V4_DST, 2),
    ];
    for (src, sp, dst, dp) in choices {
        let mut general = f.to_vec();
        let mut gm = *m;
        rewrite(
            &mut general,
            &mut gm,
            Addr::from_v4(src),
            sp,
            Addr::from_v4(dst),
            dp,
        );
        let mut out = f.to_vec();
        fast(&mut out, src, sp, dst, dp);
        assert_eq!(out, general, "{s:?} -> {src:?}:{sp} {dst:?}:{dp}");
    }
}

/// Every shape, and each again with 40 more bytes of payload (a plain UDP frame needs 54 bytes:
/// the shapes' 11-byte payloads leave it one short).
fn with_longer_payloads() -> Vec<Spec> {
    all_specs()
        .into_iter()
        .flat_map(|s| {
            [
                s,
                Spec {
                    payload_len: s.payload_len + 40,
                    ..s
                },
            ]
        })
        .collect()
}

/// The shapes of [`with_longer_payloads`] that `parse_plain_v4` takes: each with its frame, the
/// meta the parse wrote and what it read.
fn plain_frames() -> Vec<(Spec, Vec<u8>, kxdp_packet::PacketMeta, kxdp_packet::PlainV4)> {
    with_longer_payloads()
        .into_iter()
        .filter_map(|s| {
            let f = build_with(&s, false);
            let mut m = kxdp_packet::PacketMeta::default();
            let p = kxdp_packet::parse_plain_v4(&f, &mut m)?;
            Some((s, f, m, p))
        })
        .collect()
}
