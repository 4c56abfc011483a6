//! Never panic: random frames, mutated valid frames and random metas through parse, verify,
//! rewrite and the reply builders (xorshift RNG, no extra crates). Properties checked on the way:
//! a frame whose checksums verify still verifies after a rewrite, and every reply verifies.

mod common;

use common::*;
use kxdp_packet::{
    build_port_unreachable, build_tcp_rst, parse, rewrite, verify, Addr, Family, Frag, IpProto,
    LinkType, PacketMeta, Parsed,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn addr(&mut self, fam: Family) -> Addr {
        let mut a = [0u8; 16];
        for b in a.iter_mut() {
            *b = self.next() as u8;
        }
        match fam {
            Family::V4 => Addr::from_v4([a[0], a[1], a[2], a[3]]),
            Family::V6 => Addr(a),
        }
    }
}

/// Runs everything on one frame; returns true when it parsed as IP.
fn exercise(frame: &[u8], link: LinkType, rng: &mut Rng) -> bool {
    let Ok(Parsed::Ip(m)) = parse(frame, link) else {
        return false;
    };
    let valid_before = verify::checksums(frame, &m).is_ok();

    let mut f = frame.to_vec();
    let mut m2 = m;
    let (src, dst) = (rng.addr(m.family), rng.addr(m.family));
    rewrite(
        &mut f,
        &mut m2,
        src,
        rng.next() as u16,
        dst,
        rng.next() as u16,
    );
    if valid_before {
        verify::checksums(&f, &m2).expect("checksums stay valid across a rewrite");
        let again = parse(&f, link)
            .expect("rewritten frame parses")
            .ip()
            .unwrap();
        assert_eq!(again, m2);
    }

    let extra = rng.below(1600);
    for which in 0..2 {
        let mut buf = frame.to_vec();
        buf.resize(frame.len() + extra, 0);
        let n = if which == 0 {
            build_tcp_rst(&mut buf, frame.len(), link, &m)
        } else {
            build_port_unreachable(&mut buf, frame.len(), link, &m)
        };
        assert!(n <= buf.len());
        if n != 0 {
            let rm = parse(&buf[..n], link)
                .expect("reply parses")
                .ip()
                .expect("reply is IP");
            verify::checksums(&buf[..n], &rm).expect("reply checksums valid");
            assert_eq!((rm.src, rm.dst), (m.dst, m.src));
        }
    }
    true
}

fn random_meta(rng: &mut Rng, len: usize) -> PacketMeta {
    let fam = if rng.next() & 1 == 0 {
        Family::V4
    } else {
        Family::V6
    };
    let protos = [1u8, 6, 17, 58, 132, 0, 255];
    PacketMeta {
        l3_off: rng.below(len + 8) as u16,
        l4_off: rng.below(len + 8) as u16,
        l4_len: rng.next() as u16,
        ip_len: rng.below(len + 64) as u16,
        family: fam,
        proto: IpProto(protos[rng.below(protos.len())]),
        src: rng.addr(fam),
        dst: rng.addr(fam),
        sport: rng.next() as u16,
        dport: rng.next() as u16,
        tcp_flags: rng.next() as u8,
        icmp_type: rng.next() as u8,
        icmp_code: 0,
        ttl: 1,
        frag: Frag {
            id: 0,
            offset: if rng.next() & 3 == 0 { 8 } else { 0 },
            more: rng.next() & 1 == 0,
            is_fragment: false,
        },
        sctp_vtag: 0,
        sctp_chunk: 0,
    }
}

#[test]
fn random_frames_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ip = 0;
    for i in 0..150_000 {
        let len = rng.below(160);
        let mut f: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Steer a share of them into the IP paths.
        if len > 14 && i % 2 == 0 {
            let et: u16 = [0x0800, 0x86dd, 0x8100, 0x88a8][rng.below(4)];
            f[12..14].copy_from_slice(&et.to_be_bytes());
            let protos = [1u8, 6, 17, 58, 132, 0, 44, 60];
            let p = protos[rng.below(protos.len())];
            if et == 0x0800 && len >= 34 {
                f[14] = 0x45;
                f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
                f[20] &= 0x1f; // mostly not a non-first fragment
                f[23] = p;
            } else if et == 0x86dd && len >= 54 {
                f[14] = 0x60;
                f[18..20].copy_from_slice(&((len - 54) as u16).to_be_bytes());
                f[20] = p;
            }
        }
        if exercise(&f, LinkType::Ethernet, &mut rng) {
            ip += 1;
        }
        exercise(&f, LinkType::RawIp, &mut rng);
        // Random metas on random frames: rewrite and replies must not panic either.
        let mut m = random_meta(&mut rng, len);
        let _ = verify::checksums(&f, &m);
        rewrite(&mut f, &mut m, Addr::UNSPECIFIED, 1, Addr::UNSPECIFIED, 2);
        let mut buf = f.clone();
        buf.resize(len + rng.below(100), 0);
        let l = rng.below(buf.len() + 1);
        let _ = build_tcp_rst(&mut buf, l, LinkType::Ethernet, &m);
        let _ = build_port_unreachable(&mut buf, l, LinkType::RawIp, &m);
    }
    assert!(
        ip > 1000,
        "too few random frames reached the IP paths: {ip}"
    );
}

#[test]
fn mutated_valid_frames_never_panic() {
    let mut corpus: Vec<(Vec<u8>, LinkType)> = Vec::new();
    for s in all_specs() {
        corpus.push((build(&s), LinkType::Ethernet));
        if s.vlans == 0 {
            corpus.push((build_with(&s, true), LinkType::RawIp));
        }
    }
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut parsed = 0;
    for _ in 0..250_000 {
        let (base, link) = &corpus[rng.below(corpus.len())];
        let mut f = base.clone();
        // Mostly small header mutations, sometimes truncation / extension.
        let flips = 1 + rng.below(4);
        for _ in 0..flips {
            let pos = if rng.next() & 3 != 0 {
                rng.below(f.len().min(100))
            } else {
                rng.below(f.len())
            };
            f[pos] = match rng.below(4) {
                0 => rng.next() as u8,
                1 => f[pos] ^ (1 << rng.below(8)),
                2 => 0,
                _ => 0xff,
            };
        }
        match rng.below(8) {
            0 => f.truncate(rng.below(f.len() + 1)),
            1 => f.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
            _ => {}
        }
        if exercise(&f, *link, &mut rng) {
            parsed += 1;
        }
    }
    assert!(
        parsed > 50_000,
        "mutations should often keep a parseable frame: {parsed}"
    );
}

#[test]
fn valid_frames_stay_valid_under_random_rewrites() {
    let mut rng = Rng(42);
    for s in all_specs() {
        let f0 = build(&s);
        for _ in 0..200 {
            let mut f = f0.clone();
            let mut m = meta(&f, LinkType::Ethernet);
            let (src, dst) = (rng.addr(m.family), rng.addr(m.family));
            rewrite(
                &mut f,
                &mut m,
                src,
                rng.next() as u16,
                dst,
                rng.next() as u16,
            );
            verify_all(&f, LinkType::Ethernet);
            assert_eq!(f, full_recompute(&f, &m), "{s:?}");
        }
    }
}
