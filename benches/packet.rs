//! kxdp-packet fast-path benchmarks: parse, NAT rewrite and checksum update over a batch of
//! 256 frames, throughput reported in frames (elements).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use etherparse::{IpNumber, PacketBuilder};
use kxdp_packet::{checksum, parse, rewrite, sctp, Addr, Family, LinkType, PacketMeta, Parsed};

const BATCH: usize = 256;

fn v4_tcp(i: usize) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 1, (i >> 8) as u8, i as u8], [10, 96, 0, 10], 64)
        .tcp(30000 + i as u16, 80, i as u32, 64000)
        .ack(1)
        .write(&mut v, &[0u8; 64])
        .unwrap();
    v
}

fn v6_udp(i: usize) -> Vec<u8> {
    let mut src = [0xfdu8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    src[14] = (i >> 8) as u8;
    src[15] = i as u8;
    let mut dst = [0xfdu8; 16];
    dst[15] = 0x0a;
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(src, dst, 64)
        .udp(30000 + i as u16, 53)
        .write(&mut v, &[0u8; 64])
        .unwrap();
    v
}

fn v4_sctp(i: usize) -> Vec<u8> {
    let mut s = vec![0u8; 12 + 16 + 64];
    s[12] = sctp::chunk::DATA;
    s[14..16].copy_from_slice(&80u16.to_be_bytes());
    sctp::Repr {
        src_port: 30000 + i as u16,
        dst_port: 38412,
        verification_tag: 7,
    }
    .emit(&mut s)
    .unwrap();
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 1, (i >> 8) as u8, i as u8], [10, 96, 0, 10], 64)
        .write(&mut v, IpNumber(132), &s)
        .unwrap();
    v
}

fn batch(f: fn(usize) -> Vec<u8>) -> Vec<Vec<u8>> {
    (0..BATCH).map(f).collect()
}

fn metas(frames: &[Vec<u8>]) -> Vec<PacketMeta> {
    frames
        .iter()
        .map(|f| match parse(f, LinkType::Ethernet) {
            Ok(Parsed::Ip(m)) => m,
            _ => panic!("bench frame does not parse"),
        })
        .collect()
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(BATCH as u64));
    for (name, frames) in [("ipv4_tcp", batch(v4_tcp)), ("ipv6_udp", batch(v6_udp))] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut acc = 0u32;
                for f in &frames {
                    if let Ok(Parsed::Ip(m)) = parse(black_box(f), LinkType::Ethernet) {
                        acc = acc.wrapping_add(m.sport as u32);
                    }
                }
                acc
            })
        });
    }
    g.finish();
}

fn bench_rewrite(c: &mut Criterion) {
    let mut g = c.benchmark_group("rewrite");
    g.throughput(Throughput::Elements(BATCH as u64));
    let cases: [(&str, Vec<Vec<u8>>, Addr); 3] = [
        (
            "ipv4_tcp_dnat",
            batch(v4_tcp),
            Addr::from_v4([10, 244, 1, 7]),
        ),
        (
            "ipv6_udp_dnat",
            batch(v6_udp),
            Addr::from_v6([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xbe, 0xef]),
        ),
        (
            "ipv4_sctp_dnat",
            batch(v4_sctp),
            Addr::from_v4([10, 244, 1, 7]),
        ),
    ];
    for (name, frames, backend) in cases {
        let ms = metas(&frames);
        g.bench_function(name, |b| {
            b.iter_batched_ref(
                || (frames.clone(), ms.clone()),
                |(frames, ms)| {
                    for (f, m) in frames.iter_mut().zip(ms.iter_mut()) {
                        let (src, sport) = (m.src, m.sport);
                        rewrite(black_box(f), m, src, sport, backend, 8080);
                    }
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn bench_checksum(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    g.throughput(Throughput::Elements(BATCH as u64));
    let olds: Vec<Addr> = (0..BATCH)
        .map(|i| Addr::from_v4([10, 1, (i >> 8) as u8, i as u8]))
        .collect();
    let new4 = Addr::from_v4([10, 244, 1, 7]);
    g.bench_function("update_addr_port_v4", |b| {
        b.iter(|| {
            let mut c = 0x1234u16;
            for (i, o) in olds.iter().enumerate() {
                c = checksum::update_addr(black_box(c), o, &new4, Family::V4);
                c = checksum::update16(c, i as u16, 8080);
            }
            c
        })
    });
    let olds6: Vec<Addr> = (0..BATCH).map(|i| Addr::from_v6([i as u8; 16])).collect();
    let new6 = Addr::from_v6([0xfd; 16]);
    g.bench_function("update_addr_v6", |b| {
        b.iter(|| {
            let mut c = 0x1234u16;
            for o in &olds6 {
                c = checksum::update_addr(black_box(c), o, &new6, Family::V6);
            }
            c
        })
    });
    let frames = batch(v4_tcp);
    g.bench_function("full_sum_ipv4_tcp_84b", |b| {
        b.iter(|| {
            let mut c = 0u16;
            for f in &frames {
                c ^= checksum::fold(checksum::sum(black_box(&f[34..]), 0));
            }
            c
        })
    });
    g.finish();
}

criterion_group!(benches, bench_parse, bench_rewrite, bench_checksum);
criterion_main!(benches);
