//! pcap / pcapng reading and writing.

mod common;

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use kxdp_packet::pcap::{self, CapturedPacket, PcapErrorKind, Writer};
use kxdp_packet::LinkType;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kxdp-packet-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn frames(raw: bool) -> Vec<Vec<u8>> {
    [
        Spec::new(false, L4::Tcp),
        Spec::new(true, L4::Udp),
        Spec::new(false, L4::Sctp),
    ]
    .iter()
    .map(|s| build_with(s, raw))
    .collect()
}

#[test]
fn write_then_read_both_link_types() {
    for link in [LinkType::Ethernet, LinkType::RawIp] {
        let fs = frames(link == LinkType::RawIp);
        let mut w = Writer::new(Vec::new(), link).unwrap();
        let ts = [1_700_000_000_123_456_789u64, 1_700_000_001_000_000_001, 5];
        for (t, f) in ts.iter().zip(&fs) {
            w.write(*t, f).unwrap();
        }
        let bytes = w.finish().unwrap();
        assert_eq!(
            &bytes[..4],
            &[0x4d, 0x3c, 0xb2, 0xa1],
            "nanosecond magic, little endian"
        );
        let path = tmp(&format!("rt-{link:?}.pcap"));
        std::fs::write(&path, &bytes).unwrap();
        let c = pcap::read_file(&path).unwrap();
        assert_eq!(c.link, link);
        let want: Vec<CapturedPacket> = ts
            .iter()
            .zip(&fs)
            .map(|(t, f)| CapturedPacket {
                ts_ns: *t,
                data: f.clone(),
            })
            .collect();
        assert_eq!(c.packets, want);
        for p in &c.packets {
            verify_all(&p.data, link);
        }
    }
}

/// A classic pcap by hand: `big` endian or little, nanosecond or microsecond magic.
fn hand_pcap(big: bool, nanos: bool, linktype: u32, pkts: &[(u32, u32, &[u8])]) -> Vec<u8> {
    let w32 = |v: u32| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let w16 = |v: u16| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mut b = Vec::new();
    b.extend_from_slice(&w32(if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 }));
    b.extend_from_slice(&w16(2));
    b.extend_from_slice(&w16(4));
    b.extend_from_slice(&w32(0));
    b.extend_from_slice(&w32(0));
    b.extend_from_slice(&w32(65535));
    b.extend_from_slice(&w32(linktype));
    for (sec, frac, data) in pkts {
        b.extend_from_slice(&w32(*sec));
        b.extend_from_slice(&w32(*frac));
        b.extend_from_slice(&w32(data.len() as u32));
        b.extend_from_slice(&w32(data.len() as u32 + 100)); // orig > snaplen-captured is fine
        b.extend_from_slice(data);
    }
    b
}

#[test]
fn both_byte_orders_and_resolutions() {
    let f = build(&Spec::new(false, L4::Udp));
    for big in [false, true] {
        for nanos in [false, true] {
            let b = hand_pcap(big, nanos, 1, &[(10, 20, &f), (11, 999, &f)]);
            let c = pcap::read(&b).unwrap();
            assert_eq!(c.link, LinkType::Ethernet);
            let unit = if nanos { 1 } else { 1000 };
            assert_eq!(
                c.packets[0].ts_ns,
                10_000_000_000 + 20 * unit,
                "big={big} nanos={nanos}"
            );
            assert_eq!(c.packets[1].ts_ns, 11_000_000_000 + 999 * unit);
            assert_eq!(c.packets[1].data, f);
        }
    }
    for code in [101, 228, 229] {
        assert_eq!(
            pcap::read(&hand_pcap(false, false, code, &[]))
                .unwrap()
                .link,
            LinkType::RawIp
        );
    }
}

#[test]
fn unknown_link_type_names_the_file() {
    let path = tmp("sll.pcap");
    std::fs::write(&path, hand_pcap(false, false, 113, &[])).unwrap();
    let e = pcap::read_file(&path).unwrap_err();
    assert_eq!(e.kind, PcapErrorKind::UnknownLinkType(113));
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("link type 113"),
        "{msg}"
    );
}

#[test]
fn truncated_file_names_file_and_packet() {
    let f = build(&Spec::new(true, L4::Tcp));
    let b = hand_pcap(false, true, 1, &[(1, 1, &f), (2, 2, &f), (3, 3, &f)]);
    let path = tmp("trunc.pcap");
    // Cut inside the last packet's data, then inside its record header.
    for cut in [5, f.len() + 4] {
        std::fs::write(&path, &b[..b.len() - cut]).unwrap();
        let e = pcap::read_file(&path).unwrap_err();
        assert_eq!(
            (e.kind.clone(), e.packet),
            (PcapErrorKind::Truncated, Some(2)),
            "cut {cut}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&path.display().to_string())
                && msg.ends_with("truncated file at packet 2"),
            "{msg}"
        );
    }
    // Inside the file header.
    let e = pcap::read(&b[..10]).unwrap_err();
    assert_eq!((e.kind.clone(), e.packet), (PcapErrorKind::Truncated, None));
    assert!(e.to_string().starts_with("<memory>: "));
    // Not a capture at all.
    assert_eq!(
        pcap::read(b"hello world, not a pcap").unwrap_err().kind,
        PcapErrorKind::NotPcap
    );
    assert!(pcap::read_file(&tmp("does-not-exist.pcap"))
        .unwrap_err()
        .to_string()
        .contains("does-not-exist"));
}

/// A pcapng by hand: SHB, one IDB (default microsecond resolution), EPBs, little endian.
fn hand_pcapng(linktype: u16, pkts: &[(u64, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    let block = |b: &mut Vec<u8>, ty: u32, body: &[u8]| {
        let len = 12 + body.len() as u32;
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&len.to_le_bytes());
    };
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut b, 0x0a0d_0d0a, &shb);
    let mut idb = Vec::new();
    idb.extend_from_slice(&linktype.to_le_bytes());
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&0u32.to_le_bytes());
    block(&mut b, 1, &idb);
    for (ts, data) in pkts {
        let mut epb = Vec::new();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&((ts >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(*ts as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(data);
        epb.resize(epb.len().div_ceil(4) * 4, 0);
        block(&mut b, 6, &epb);
    }
    b
}

#[test]
fn pcapng_by_hand() {
    let fs = frames(false);
    let b = hand_pcapng(
        1,
        &[
            (1_700_000_000_000_001, &fs[0]),
            (1_700_000_000_000_002, &fs[1]),
        ],
    );
    let c = pcap::read(&b).unwrap();
    assert_eq!(c.link, LinkType::Ethernet);
    assert_eq!(c.packets.len(), 2);
    assert_eq!(
        c.packets[0].ts_ns, 1_700_000_000_000_001_000,
        "default if_tsresol is microseconds"
    );
    assert_eq!(c.packets[1].data, fs[1]);
    // Truncated inside the second EPB.
    let e = pcap::read(&b[..b.len() - 7]).unwrap_err();
    assert_eq!((e.kind, e.packet), (PcapErrorKind::Truncated, Some(1)));
    // Unknown link type.
    let e = pcap::read(&hand_pcapng(113, &[])).unwrap_err();
    assert_eq!(e.kind, PcapErrorKind::UnknownLinkType(113));
}

#[test]
fn pcapng_written_by_pcap_file() {
    let fs = frames(true);
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    let idb = InterfaceDescriptionBlock {
        linktype: DataLink::RAW,
        snaplen: 0,
        options: vec![InterfaceDescriptionOption::IfTsResol(9)],
    };
    w.write_pcapng_block(idb).unwrap();
    for (i, f) in fs.iter().enumerate() {
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(1_000 + i as u64),
            original_len: f.len() as u32,
            data: Cow::Borrowed(&f[..]),
            options: vec![],
        };
        w.write_pcapng_block(epb).unwrap();
    }
    let bytes = w.into_inner();
    let path = tmp("w.pcapng");
    std::fs::write(&path, &bytes).unwrap();
    let c = pcap::read_file(&path).unwrap();
    assert_eq!(c.link, LinkType::RawIp);
    assert_eq!(c.packets.len(), 3);
    for (i, p) in c.packets.iter().enumerate() {
        assert_eq!(p.ts_ns, 1_000 + i as u64);
        assert_eq!(p.data, fs[i]);
        verify_all(&p.data, LinkType::RawIp);
    }
}

#[test]
fn link_type_codes() {
    assert_eq!(LinkType::from_pcap(1), Some(LinkType::Ethernet));
    assert_eq!(LinkType::from_pcap(229), Some(LinkType::RawIp));
    assert_eq!(LinkType::from_pcap(113), None);
    assert_eq!(LinkType::Ethernet.pcap_code(), 1);
    assert_eq!(LinkType::RawIp.pcap_code(), 101);
}
