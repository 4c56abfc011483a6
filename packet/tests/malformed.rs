//! Malformed input: every rule of `parse` gives its specific `ParseError`.

mod common;

use common::*;
use kxdp_packet::{parse, IpProto, LinkType, ParseError, Parsed};

fn err(f: &[u8]) -> ParseError {
    parse(f, LinkType::Ethernet).expect_err("expected an error")
}

#[test]
fn truncated_at_every_byte_boundary() {
    for s in all_specs() {
        for raw in [false, true] {
            if raw && s.vlans != 0 {
                continue;
            }
            let link = if raw {
                LinkType::RawIp
            } else {
                LinkType::Ethernet
            };
            let f = build_with(&s, raw);
            let l3 = if raw { 0 } else { 14 + 4 * s.vlans as usize };
            let min_ip = if s.v6 { 40 } else { 20 };
            for n in 0..f.len() {
                let e = parse(&f[..n], link).expect_err("truncated frame must not parse");
                let want = if n < l3 + min_ip {
                    if !s.v6 && n >= l3 + 20 {
                        ParseError::BadHeaderLength
                    } else {
                        ParseError::Truncated
                    }
                } else if !s.v6 && s.opts && n < l3 + 28 {
                    ParseError::BadHeaderLength
                } else {
                    ParseError::BadTotalLength
                };
                assert_eq!(e, want, "{s:?} raw={raw} cut at {n}");
            }
            assert!(parse(&f, link).is_ok());
        }
    }
}

#[test]
fn trailing_padding_is_allowed() {
    for s in all_specs() {
        let mut f = build(&s);
        let m = meta(&f, LinkType::Ethernet);
        f.extend_from_slice(&[0u8; 18]);
        let m2 = meta(&f, LinkType::Ethernet);
        assert_eq!(m, m2);
        verify_all(&f, LinkType::Ethernet);
    }
}

#[test]
fn bad_version() {
    let mut f = build(&Spec::new(false, L4::Udp));
    f[14] = 0x65;
    assert_eq!(err(&f), ParseError::BadVersion);
    let mut f = build(&Spec::new(true, L4::Udp));
    f[14] = 0x45;
    assert_eq!(err(&f), ParseError::BadVersion);
    assert_eq!(
        parse(&[0x10; 40], LinkType::RawIp),
        Err(ParseError::BadVersion)
    );
    assert_eq!(parse(&[], LinkType::RawIp), Err(ParseError::Truncated));
}

#[test]
fn bad_ihl() {
    let mut f = build(&Spec::new(false, L4::Tcp));
    for ihl in 0..5u8 {
        f[14] = 0x40 | ihl;
        assert_eq!(err(&f), ParseError::BadHeaderLength, "ihl {ihl}");
    }
    // IHL 15 (60 bytes) on a 20+20+11 byte packet: past the end of the frame.
    f[14] = 0x4f;
    assert_eq!(err(&f), ParseError::BadHeaderLength);
    // With Ethernet padding the header fits the frame, but not the total length (51).
    f.extend_from_slice(&[0u8; 20]);
    assert_eq!(err(&f), ParseError::BadTotalLength);
}

#[test]
fn bad_total_length() {
    let f0 = build(&Spec::new(false, L4::Udp));
    let tl = u16::from_be_bytes([f0[16], f0[17]]);
    let mut f = f0.clone();
    f[16..18].copy_from_slice(&(tl + 1).to_be_bytes());
    assert_eq!(err(&f), ParseError::BadTotalLength);
    f[16..18].copy_from_slice(&19u16.to_be_bytes());
    assert_eq!(err(&f), ParseError::BadTotalLength);
    let mut f = build(&Spec::new(true, L4::Udp));
    let pl = u16::from_be_bytes([f[18], f[19]]);
    f[18..20].copy_from_slice(&(pl + 1).to_be_bytes());
    assert_eq!(err(&f), ParseError::BadTotalLength);
}

#[test]
fn ipv6_length_must_fit_ip_len() {
    // 40 + 65535 does not fit PacketMeta::ip_len.
    let mut f = vec![0u8; 14 + 40 + 65535];
    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    f[14] = 0x60;
    f[18..20].copy_from_slice(&65535u16.to_be_bytes());
    f[20] = 59;
    assert_eq!(err(&f), ParseError::BadTotalLength);
    f[18..20].copy_from_slice(&65495u16.to_be_bytes());
    assert_eq!(meta(&f, LinkType::Ethernet).ip_len, 65535);
}

#[test]
fn tcp_data_offset() {
    for v6 in [false, true] {
        let f0 = build(&Spec::new(v6, L4::Tcp));
        let l4 = meta(&f0, LinkType::Ethernet).l4_off as usize;
        for doff in [0u8, 1, 4] {
            let mut f = f0.clone();
            f[l4 + 12] = doff << 4;
            assert_eq!(err(&f), ParseError::BadDataOffset, "doff {doff}");
        }
        // 20 + 11 bytes of segment: data offset 8 (32 bytes) is past the end.
        let mut f = f0.clone();
        f[l4 + 12] = 8 << 4;
        assert_eq!(err(&f), ParseError::BadDataOffset);
        f[l4 + 12] = 7 << 4; // 28 <= 31: fine
        assert!(parse(&f, LinkType::Ethernet).is_ok());
    }
}

#[test]
fn tcp_header_cut_by_ip_length() {
    // The IP total length leaves only 10 bytes of TCP header.
    let mut f = build(&Spec::new(false, L4::Tcp));
    f[16..18].copy_from_slice(&30u16.to_be_bytes());
    assert_eq!(err(&f), ParseError::Truncated);
}

#[test]
fn udp_length_inconsistent() {
    for v6 in [false, true] {
        let f0 = build(&Spec::new(v6, L4::Udp));
        let l4 = meta(&f0, LinkType::Ethernet).l4_off as usize;
        for ul in [0u16, 7, 20] {
            let mut f = f0.clone();
            f[l4 + 4..l4 + 6].copy_from_slice(&ul.to_be_bytes());
            assert_eq!(err(&f), ParseError::BadLength, "udp len {ul}");
        }
        // Shorter than the IP payload is tolerated (trailing bytes ignored, as Linux does).
        let mut f = f0.clone();
        f[l4 + 4..l4 + 6].copy_from_slice(&8u16.to_be_bytes());
        assert!(parse(&f, LinkType::Ethernet).is_ok());
    }
}

#[test]
fn sctp_chunk_length() {
    let f0 = build(&Spec::new(false, L4::Sctp));
    let l4 = meta(&f0, LinkType::Ethernet).l4_off as usize;
    for cl in [0u16, 3, 2000] {
        let mut f = f0.clone();
        f[l4 + 14..l4 + 16].copy_from_slice(&cl.to_be_bytes());
        assert_eq!(err(&f), ParseError::BadLength, "chunk len {cl}");
    }
}

#[test]
fn bad_ipv6_extension_chain() {
    let f0 = build(&Spec {
        opts: true,
        ..Spec::new(true, L4::Udp)
    });
    let l3 = 14;
    // Chain (etherparse order): fixed -> hop-by-hop (8) @l3+40 -> dest opts (8) @l3+48
    // -> routing (16) @l3+56 -> UDP @l3+72.
    assert_eq!(f0[l3 + 6], 0);
    // Hop-by-hop length past the payload.
    let mut f = f0.clone();
    f[l3 + 40 + 1] = 200;
    assert_eq!(err(&f), ParseError::BadExtensionHeader);
    // Hop-by-hop again after the first header.
    let mut f = f0.clone();
    f[l3 + 40] = 0;
    assert_eq!(err(&f), ParseError::BadExtensionHeader);
    // Routing header length past the payload.
    let mut f = f0.clone();
    f[l3 + 56 + 1] = 50;
    assert_eq!(err(&f), ParseError::BadExtensionHeader);
    // ESP terminates the chain: no L4.
    let mut f = f0.clone();
    f[l3 + 56] = 50;
    let m = meta(&f, LinkType::Ethernet);
    assert_eq!((m.proto, m.l4_off, m.sport), (IpProto(50), 0, 0));
    // No next header.
    let mut f = f0.clone();
    f[l3 + 6] = 59;
    let m = meta(&f, LinkType::Ethernet);
    assert_eq!((m.proto, m.l4_off), (IpProto(59), 0));
}

#[test]
fn not_ip() {
    let mut arp = vec![0u8; 42];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(parse(&arp, LinkType::Ethernet), Ok(Parsed::NotIp));
    // Three VLAN tags: the third TPID is what the parser sees as EtherType.
    let mut f = vec![0u8; 60];
    for i in 0..3 {
        f[12 + 4 * i..14 + 4 * i].copy_from_slice(&0x8100u16.to_be_bytes());
    }
    assert_eq!(parse(&f, LinkType::Ethernet), Ok(Parsed::NotIp));
    assert_eq!(
        parse(&f[..13], LinkType::Ethernet),
        Err(ParseError::Truncated)
    );
}
