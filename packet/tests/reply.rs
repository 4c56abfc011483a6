//! TCP RST and port-unreachable replies, checked field by field with etherparse.

mod common;

use common::*;
use etherparse::{Icmpv4Type, Icmpv6Type, NetHeaders, PacketHeaders, TransportHeader};
use kxdp_packet::{build_port_unreachable, build_tcp_rst, LinkType, PacketMeta};

fn tcp_frame(v6: bool, opts: bool, vlans: u8, flags: &str, payload_len: usize) -> Vec<u8> {
    use etherparse::{Ipv4Header, PacketBuilder};
    let _ = (PacketBuilder::ethernet2, Ipv4Header::default);
    // Build through the common builder, then set flags / ack in place and refill the checksum.
    let s = Spec {
        v6,
        vlans,
        opts,
        l4: L4::Tcp,
        payload_len,
    };
    let mut f = build(&s);
    let m = meta(&f, LinkType::Ethernet);
    let l4 = m.l4_off as usize;
    let mut fl = 0u8;
    for c in flags.chars() {
        fl |= match c {
            'S' => 0x02,
            'A' => 0x10,
            'F' => 0x01,
            'R' => 0x04,
            'P' => 0x08,
            _ => 0,
        };
    }
    f[l4 + 13] = fl;
    f[l4 + 8..l4 + 12].copy_from_slice(&0xaabb_ccddu32.to_be_bytes());
    let f = full_recompute(&f, &m);
    verify_all(&f, LinkType::Ethernet);
    f
}

fn headers(f: &[u8]) -> PacketHeaders<'_> {
    PacketHeaders::from_ethernet_slice(f).unwrap()
}

fn swapped_ips(orig: &PacketHeaders, reply: &PacketHeaders) {
    match (&orig.net, &reply.net) {
        (Some(NetHeaders::Ipv4(o, _)), Some(NetHeaders::Ipv4(r, _))) => {
            assert_eq!((r.source, r.destination), (o.destination, o.source));
            assert_eq!(r.time_to_live, 64);
            assert!(r.options.is_empty());
        }
        (Some(NetHeaders::Ipv6(o, _)), Some(NetHeaders::Ipv6(r, e))) => {
            assert_eq!((r.source, r.destination), (o.destination, o.source));
            assert_eq!(r.hop_limit, 64);
            assert!(e.hop_by_hop_options.is_none() && e.routing.is_none());
        }
        other => panic!("family changed: {other:?}"),
    }
}

fn swapped_macs(orig: &[u8], reply: &[u8], vlans: u8) {
    assert_eq!(&reply[0..6], &orig[6..12]);
    assert_eq!(&reply[6..12], &orig[0..6]);
    let tags = 12 + 4 * vlans as usize + 2;
    assert_eq!(
        &reply[12..tags],
        &orig[12..tags],
        "VLAN tags and EtherType kept"
    );
}

fn rst(orig: &[u8]) -> (Vec<u8>, usize) {
    let m: PacketMeta = meta(orig, LinkType::Ethernet);
    let mut buf = orig.to_vec();
    let n = build_tcp_rst(&mut buf, orig.len(), LinkType::Ethernet, &m);
    (buf, n)
}

#[test]
fn rst_for_syn_without_ack() {
    for v6 in [false, true] {
        for opts in [false, true] {
            for vlans in 0..3 {
                let orig = tcp_frame(v6, opts, vlans, "S", 0);
                let (buf, n) = rst(&orig);
                let l3 = 14 + 4 * vlans as usize;
                assert_eq!(n, l3 + if v6 { 40 } else { 20 } + 20);
                let r = &buf[..n];
                verify_all(r, LinkType::Ethernet);
                let (ho, hr) = (headers(&orig), headers(r));
                swapped_ips(&ho, &hr);
                swapped_macs(&orig, r, vlans);
                let (Some(TransportHeader::Tcp(o)), Some(TransportHeader::Tcp(t))) =
                    (&ho.transport, &hr.transport)
                else {
                    panic!("tcp")
                };
                assert_eq!(
                    (t.source_port, t.destination_port),
                    (o.destination_port, o.source_port)
                );
                assert!(t.rst && t.ack && !t.syn && !t.fin);
                assert_eq!(t.sequence_number, 0);
                assert_eq!(t.acknowledgment_number, o.sequence_number.wrapping_add(1));
                assert_eq!(t.data_offset(), 5);
                assert!(hr.payload.slice().is_empty());
            }
        }
    }
}

#[test]
fn rst_for_fin_with_payload_without_ack() {
    let orig = tcp_frame(false, false, 0, "FP", 100);
    let (buf, n) = rst(&orig);
    let hr = headers(&buf[..n]);
    let ho = headers(&orig);
    let (Some(TransportHeader::Tcp(o)), Some(TransportHeader::Tcp(t))) =
        (&ho.transport, &hr.transport)
    else {
        panic!("tcp")
    };
    assert_eq!(t.acknowledgment_number, o.sequence_number.wrapping_add(101));
    assert!(t.rst && t.ack);
    verify_all(&buf[..n], LinkType::Ethernet);
}

#[test]
fn rst_for_segment_with_ack() {
    for v6 in [false, true] {
        let orig = tcp_frame(v6, true, 1, "PA", 50);
        let (buf, n) = rst(&orig);
        let r = &buf[..n];
        verify_all(r, LinkType::Ethernet);
        let hr = headers(r);
        let Some(TransportHeader::Tcp(t)) = &hr.transport else {
            panic!("tcp")
        };
        assert_eq!(t.sequence_number, 0xaabb_ccdd, "seq = the segment's ack");
        assert!(t.rst && !t.ack);
        assert_eq!(t.acknowledgment_number, 0);
        swapped_ips(&headers(&orig), &hr);
    }
}

#[test]
fn no_rst_for_rst_or_non_tcp() {
    let orig = tcp_frame(false, false, 0, "RA", 0);
    assert_eq!(rst(&orig).1, 0);
    let udp = build(&Spec::new(false, L4::Udp));
    assert_eq!(rst(&udp).1, 0);
}

fn unreach(orig: &[u8], cap: usize) -> (Vec<u8>, usize) {
    let m = meta(orig, LinkType::Ethernet);
    let mut buf = orig.to_vec();
    buf.resize(cap.max(orig.len()), 0);
    buf.truncate(cap);
    let n = build_port_unreachable(&mut buf, orig.len().min(cap), LinkType::Ethernet, &m);
    (buf, n)
}

#[test]
fn port_unreachable_quotes_the_packet() {
    for v6 in [false, true] {
        for opts in [false, true] {
            for vlans in 0..3 {
                let s = Spec {
                    v6,
                    vlans,
                    opts,
                    l4: L4::Udp,
                    payload_len: 30,
                };
                let orig = build(&s);
                let l3 = 14 + 4 * vlans as usize;
                let (buf, n) = unreach(&orig, 2048);
                let hdr = if v6 { 48 } else { 28 };
                assert_eq!(n, orig.len() + hdr, "whole packet quoted");
                let r = &buf[..n];
                verify_all(r, LinkType::Ethernet);
                let (ho, hr) = (headers(&orig), headers(r));
                swapped_ips(&ho, &hr);
                swapped_macs(&orig, r, vlans);
                assert_eq!(&r[l3 + hdr..], &orig[l3..], "quoted IP packet");
                match &hr.transport {
                    Some(TransportHeader::Icmpv4(i)) => {
                        assert!(!v6);
                        assert!(matches!(
                            i.icmp_type,
                            Icmpv4Type::DestinationUnreachable(
                                etherparse::icmpv4::DestUnreachableHeader::Port
                            )
                        ));
                    }
                    Some(TransportHeader::Icmpv6(i)) => {
                        assert!(v6);
                        assert!(matches!(
                            i.icmp_type,
                            Icmpv6Type::DestinationUnreachable(
                                etherparse::icmpv6::DestUnreachableCode::Port
                            )
                        ));
                    }
                    other => panic!("not icmp: {other:?}"),
                }
                let rm = meta(r, LinkType::Ethernet);
                assert!(rm.is_icmp_error());
                // Never answer an ICMP error.
                let mut again = r.to_vec();
                assert_eq!(
                    build_port_unreachable(&mut again, n, LinkType::Ethernet, &rm),
                    0
                );
            }
        }
    }
}

#[test]
fn port_unreachable_size_limits() {
    // Large packets: 576 bytes of IPv4 reply, 1280 of IPv6.
    for (v6, limit) in [(false, 576), (true, 1280)] {
        let s = Spec {
            payload_len: 1400,
            ..Spec::new(v6, L4::Udp)
        };
        let orig = build(&s);
        let (buf, n) = unreach(&orig, 2048);
        assert_eq!(n, 14 + limit);
        let r = &buf[..n];
        verify_all(r, LinkType::Ethernet);
        let hdr = if v6 { 48 } else { 28 };
        assert_eq!(&r[14 + hdr..], &orig[14..14 + limit - hdr]);
    }
    // Limited by the buffer capacity.
    let s = Spec {
        payload_len: 200,
        ..Spec::new(false, L4::Tcp)
    };
    let orig = build(&s);
    let cap = orig.len() + 6;
    let (buf, n) = unreach(&orig, cap);
    assert_eq!(n, cap);
    verify_all(&buf[..n], LinkType::Ethernet);
}

#[test]
fn replies_on_raw_ip() {
    let s = Spec::new(true, L4::Tcp);
    let orig = build_with(&s, true);
    let m = meta(&orig, LinkType::RawIp);
    let mut buf = orig.clone();
    let n = build_tcp_rst(&mut buf, orig.len(), LinkType::RawIp, &m);
    assert_eq!(n, 60);
    verify_all(&buf[..n], LinkType::RawIp);
    let mut buf = orig.clone();
    buf.resize(4096, 0);
    let n = build_port_unreachable(&mut buf, orig.len(), LinkType::RawIp, &m);
    assert_eq!(n, 48 + orig.len());
    verify_all(&buf[..n], LinkType::RawIp);
}
