//! The whole pipeline on arbitrary frames: several workers (threads) sharing a small conntrack
//! table (16 entries: early drop and `conntrack-full` all the time) while the tables switch
//! between two snapshots under them (with the stale-UDP flush a publication does), and the clock
//! jumps. No panic, one verdict per frame, and the table never holds more than its maximum (at
//! rest; while workers insert, one reservation per worker may be in flight).
//!
//! Input: a first byte (workers = 1 + b % 3), then records `[control, len_hi, len_lo, frame...]`:
//! control bit 0-1 picks the worker, bit 2 switches the tables before the frame, bits 3-7 advance
//! the clock (0-31 s). Frames are Ethernet; at most 2,048 bytes.
#![no_main]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use kxdp_dataplane::conntrack::{Conntrack, CtConfig};
use kxdp_dataplane::pipeline::{Pipeline, SlotFrames};
use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, NodeInfo, Route,
    ServicePortInfo, Snapshot,
};
use kxdp_dataplane::verdict::Verdict;
use kxdp_packet::IpProto;
use kxdp_packet::{Addr, LinkType};
use libfuzzer_sys::fuzz_target;

const BATCH: usize = 8;
const MAX_ENTRIES: u32 = 16;

fn ip(s: &str) -> Addr {
    Addr::from_ip(s.parse().unwrap())
}

/// Service ports of the fuzz cluster; `b` is the second table (endpoints changed or gone).
fn snapshot(b: bool) -> Snapshot {
    let mut s = Snapshot {
        generation: 1 + b as u64,
        node: NodeInfo {
            name: "fuzz-node".into(),
            snat_v4: Some(ip("192.168.0.2")),
            snat_v6: Some(ip("fd00:192::2")),
            addrs: vec![ip("192.168.0.2"), ip("fd00:192::2")],
        },
        ..Snapshot::default()
    };
    s.cluster_cidrs.insert("10.0.0.0".parse().unwrap(), 8);
    s.cluster_cidrs.insert("fd00:10::".parse().unwrap(), 32);
    s.service_cidrs.insert("172.30.0.0".parse().unwrap(), 16);
    s.service_cidrs.insert("fd00:30::".parse().unwrap(), 112);
    // (frontend, kind, proto, endpoints in a, endpoints in b, affinity, masquerade externals)
    let services: [(&str, u16, FrontendKind, IpProto, &[&str], &[&str], u32); 7] = [
        (
            "172.30.0.1",
            80,
            FrontendKind::ClusterIp,
            IpProto::TCP,
            &["10.2.0.1:8080", "10.2.0.2:8080"],
            &["10.2.0.3:8080"],
            0,
        ),
        (
            "172.30.0.2",
            53,
            FrontendKind::ClusterIp,
            IpProto::UDP,
            &["10.2.0.5:5353"],
            &[],
            0,
        ),
        (
            "172.30.0.3",
            80,
            FrontendKind::ClusterIp,
            IpProto::TCP,
            &["10.2.0.6:80", "10.1.0.6:80"],
            &["10.1.0.6:80"],
            30,
        ),
        (
            "172.30.0.4",
            9,
            FrontendKind::ClusterIp,
            IpProto::SCTP,
            &["10.2.0.7:9"],
            &["10.2.0.8:9"],
            0,
        ),
        (
            "192.168.0.2",
            30080,
            FrontendKind::NodePort,
            IpProto::TCP,
            &["10.2.0.1:8080"],
            &["10.1.0.9:8080"],
            0,
        ),
        (
            "203.0.113.10",
            443,
            FrontendKind::LoadBalancer,
            IpProto::TCP,
            &["10.2.0.1:8443"],
            &[],
            0,
        ),
        (
            "fd00:30::1",
            80,
            FrontendKind::ClusterIp,
            IpProto::TCP,
            &["[fd00:10::1]:8080"],
            &["[fd00:10::2]:8080"],
            0,
        ),
    ];
    for (i, (addr, port, kind, p, a, bb, affinity)) in services.into_iter().enumerate() {
        let eps = if b { bb } else { a };
        let pool: Arc<[Endpoint]> = eps
            .iter()
            .map(|e| {
                let sa: std::net::SocketAddr = e.parse().unwrap();
                Endpoint {
                    addr: Addr::from_ip(sa.ip()),
                    port: sa.port(),
                    local: sa.ip().to_string().starts_with("10.1."),
                }
            })
            .collect();
        let range = EndpointRange {
            start: 0,
            len: pool.len() as u32,
        };
        let route = |masquerade, when_empty| Route {
            endpoints: range,
            masquerade: masquerade && !pool.is_empty(),
            when_empty,
        };
        s.insert_frontend(
            FrontendKey {
                addr: ip(addr),
                port,
                proto: p,
            },
            Frontend {
                service_port: Arc::new(ServicePortInfo {
                    name: Arc::from(format!("fuzz/svc-{i}")),
                    id: 0x7000_0000 + i as u32,
                    proto: p,
                    affinity_timeout_s: affinity,
                }),
                kind,
                routes: [
                    route(false, EmptyAction::Reject),
                    route(true, EmptyAction::Reject),
                    route(true, EmptyAction::Drop),
                ],
                endpoints: pool.clone(),
                source_ranges: None,
                maglev: None,
            },
        );
        if kind == FrontendKind::ClusterIp {
            s.cluster_ips.insert(ip(addr));
        }
    }
    s.validate().expect("fuzz snapshot is consistent");
    s
}

fn tables() -> &'static [Snapshot; 2] {
    static T: OnceLock<[Snapshot; 2]> = OnceLock::new();
    T.get_or_init(|| [snapshot(false), snapshot(true)])
}

struct Record<'a> {
    control: u8,
    frame: &'a [u8],
}

fn records(mut data: &[u8]) -> Vec<Record<'_>> {
    let mut out = Vec::new();
    while data.len() >= 3 {
        let control = data[0];
        let len = (u16::from_be_bytes([data[1], data[2]]) as usize).min(2048);
        data = &data[3..];
        let len = len.min(data.len());
        out.push(Record {
            control,
            frame: &data[..len],
        });
        data = &data[len..];
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let workers = 1 + first as usize % 3;
    let records = records(rest);
    let ct = Conntrack::new(
        CtConfig {
            max_entries: MAX_ENTRIES,
            ..CtConfig::default()
        },
        workers,
    );
    let current = AtomicUsize::new(0);
    let tables = tables();
    std::thread::scope(|scope| {
        for w in 0..workers {
            let (ct, current, records) = (&ct, &current, &records);
            scope.spawn(move || {
                let mut pipeline = Pipeline::new(w, LinkType::Ethernet, 7, ct);
                let mut frames = SlotFrames::new(BATCH, 4096);
                let mut verdicts = [Verdict::default(); BATCH];
                let mut now = 1_000u64;
                let mine: Vec<&Record> = records
                    .iter()
                    .filter(|r| (r.control & 3) as usize % workers == w)
                    .collect();
                for chunk in mine.chunks(BATCH) {
                    frames.clear();
                    for r in chunk {
                        if r.control & 4 != 0 {
                            let next = current.fetch_add(1, Ordering::AcqRel) + 1;
                            kxdp_dataplane::stale::flush_stale_udp(ct, &tables[next % 2]);
                        }
                        now += (r.control >> 3) as u64 * 1_000;
                        assert!(frames.push(r.frame), "a frame of at most 2,048 bytes fits");
                    }
                    let snap = &tables[current.load(Ordering::Acquire) % 2];
                    pipeline.process(&mut frames, &mut verdicts[..chunk.len()], snap, ct, now);
                    // Workers reserve room before they know they may use it: while others
                    // insert, the count may be over by one per worker, never more.
                    assert!(
                        ct.len() <= MAX_ENTRIES + workers as u32,
                        "conntrack over its maximum"
                    );
                }
                assert_eq!(pipeline.counters.packets, mine.len() as u64);
            });
        }
    });
    assert!(
        ct.len() <= MAX_ENTRIES,
        "conntrack over its maximum at rest"
    );
});
