//! kxdp-dataplane fast-path benchmarks: conntrack lookups, frontend lookups and the whole pipeline
//! over batches of 64 frames (one AF_XDP RX burst), throughput reported in packets (elements).
//!
//! The snapshot is built by hand (1k ClusterIP Services × 10 endpoints), so these numbers do not
//! depend on `control`. Pipeline benchmarks time `Pipeline::process` only: refilling the frame
//! slots (the copy replay and the kernel do before the pipeline sees a frame) happens outside the
//! timed region, and is measured on its own as `copy_only`.
//!
//! Kept short (3 s per benchmark, 20 samples) so that the whole run takes a few minutes on a
//! shared 2-core machine: `cargo bench --bench dataplane`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use etherparse::PacketBuilder;
use kxdp_dataplane::conntrack::{Conntrack, CtConfig, Packed, Tuple};
use kxdp_dataplane::pipeline::{Pipeline, SlotFrames};
use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, NodeInfo, PrefixSet,
    Route, ServicePortInfo, Snapshot,
};
use kxdp_dataplane::verdict::{Reason, Verdict};
use kxdp_packet::IpProto;
use kxdp_packet::{Addr, Family, LinkType};

/// One AF_XDP RX burst (and `replay`'s batch).
const BATCH: usize = 64;
const SERVICES: u32 = 1000;
const ENDPOINTS_PER_SERVICE: u32 = 10;
/// Replay's clock starts here; nothing in these benchmarks lives long enough to expire.
const NOW_MS: u64 = 1_000;

// ---- inputs ------------------------------------------------------------------------------------

/// splitmix64, for reproducible shuffles and picks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        ((self.next() as u128 * n as u128) >> 64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

fn v4(n: u32) -> Addr {
    Addr::from_v4(n.to_be_bytes())
}

/// ClusterIP of Service `i`: 172.16.0.0/12.
fn cluster_ip(i: u32) -> Addr {
    v4(0xac10_0001 + i)
}

/// Client `k`: a pod address in 10.1.0.0/16 (and 10.2.0.0/16 .. for more), a source port; every
/// `k` gives a distinct (address, port).
fn client(k: u32) -> (Addr, u16) {
    (v4(0x0a01_0000 + 1 + k % 65_534), (1024 + k / 65_534) as u16)
}

/// The Service client `k` talks to.
fn service_of(k: u32) -> u32 {
    (k.wrapping_mul(2_654_435_761) >> 8) % SERVICES
}

/// 1k ClusterIP Services (TCP 80 → 8080) × 10 endpoints in 10.128.0.0/9, as `control` would
/// translate them: pods go to any endpoint unmasqueraded, external clients are masqueraded.
fn snapshot() -> Snapshot {
    let mut s = Snapshot {
        generation: 1,
        node: NodeInfo {
            name: "bench-node".into(),
            snat_v4: Some(v4(0xc0a8_0002)),
            snat_v6: None,
            addrs: vec![v4(0xc0a8_0002)],
        },
        cluster_cidrs: PrefixSet::new(),
        service_cidrs: PrefixSet::new(),
        ..Snapshot::default()
    };
    s.cluster_cidrs.insert("10.0.0.0".parse().unwrap(), 8);
    s.service_cidrs.insert("172.16.0.0".parse().unwrap(), 12);
    for i in 0..SERVICES {
        let pool: Arc<[Endpoint]> = (0..ENDPOINTS_PER_SERVICE)
            .map(|j| Endpoint {
                addr: v4(0x0a80_0001 + i * ENDPOINTS_PER_SERVICE + j),
                port: 8080,
                local: j % 4 == 0,
            })
            .collect();
        let endpoints = EndpointRange {
            start: 0,
            len: ENDPOINTS_PER_SERVICE,
        };
        let route = |masquerade| Route {
            endpoints,
            masquerade,
            when_empty: EmptyAction::Reject,
        };
        s.insert_frontend(
            FrontendKey {
                addr: cluster_ip(i),
                port: 80,
                proto: IpProto::TCP,
            },
            Frontend {
                service_port: Arc::new(ServicePortInfo {
                    name: Arc::from(format!("bench/svc-{i}:http")),
                    id: 0x5000_0000 + i,
                    proto: IpProto::TCP,
                    affinity_timeout_s: 0,
                }),
                kind: FrontendKind::ClusterIp,
                routes: [route(false), route(true), route(true)],
                endpoints: pool,
                source_ranges: None,
                maglev: None,
            },
        );
        s.cluster_ips.insert(cluster_ip(i));
    }
    s.validate().expect("hand-built snapshot is consistent");
    s
}

/// A 64-byte TCP frame (no payload, Ethernet padding) from client `k` to its Service.
fn frame(k: u32, syn: bool) -> Vec<u8> {
    let (src, sport) = client(k);
    let mut v = Vec::with_capacity(64);
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src.v4_octets(), cluster_ip(service_of(k)).v4_octets(), 64)
        .tcp(sport, 80, k.wrapping_mul(7919), 64240);
    let b = if syn { b.syn() } else { b.ack(1) };
    b.write(&mut v, &[]).unwrap();
    v.resize(64, 0);
    v
}

fn ct_config(max_entries: u32) -> CtConfig {
    CtConfig {
        max_entries,
        ..CtConfig::default()
    }
}

/// Pushes `frames` through `pipe` in batches; every verdict must be `expect`.
fn run_all(
    pipe: &mut Pipeline,
    snap: &Snapshot,
    ct: &Conntrack,
    frames: &[Vec<u8>],
    expect: Reason,
) {
    let mut slots = SlotFrames::new(BATCH, 2048);
    let mut verdicts = [Verdict::default(); BATCH];
    for chunk in frames.chunks(BATCH) {
        slots.clear();
        for f in chunk {
            slots.push(f);
        }
        pipe.process(&mut slots, &mut verdicts[..chunk.len()], snap, ct, NOW_MS);
        for v in &verdicts[..chunk.len()] {
            assert_eq!(v.reason, expect, "setup: unexpected verdict {v:?}");
        }
    }
}

/// Conntrack with `n` connections client k → its Service, DNATed to an endpoint, and the packed
/// original tuples of all of them in a shuffled order.
fn filled_conntrack(n: u32) -> (Conntrack, Vec<Packed>) {
    let ct = Conntrack::new(ct_config(n + n / 4), 1);
    let mut keys = Vec::with_capacity(n as usize);
    for k in 0..n {
        let (src, sport) = client(k);
        let svc = service_of(k);
        let orig = Tuple {
            src,
            dst: cluster_ip(svc),
            sport,
            dport: 80,
            proto: IpProto::TCP,
            family: Family::V4,
        };
        let reply = Tuple {
            src: v4(0x0a80_0001 + svc * ENDPOINTS_PER_SERVICE + k % ENDPOINTS_PER_SERVICE),
            dst: src,
            sport: 8080,
            dport: sport,
            proto: IpProto::TCP,
            family: Family::V4,
        };
        let packed = orig.pack();
        ct.create(&orig, &reply, 0x02, false, svc, NOW_MS, ct.hash(&packed))
            .expect("conntrack sized for the fill");
        keys.push(packed);
    }
    Rng(7).shuffle(&mut keys);
    (ct, keys)
}

fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(BATCH as u64));
    g
}

// ---- benchmarks --------------------------------------------------------------------------------

/// A batch of lookups that all hit, done the way the pipeline does them: hash every key, then
/// look them up. Keys cycle through the whole table in a shuffled order, so at 1M
/// entries most lookups miss the CPU caches, as with real traffic.
fn conntrack_lookup(c: &mut Criterion) {
    let mut g = group(c, "conntrack_lookup_hit");
    for n in [10_000u32, 1_000_000] {
        let (ct, keys) = filled_conntrack(n);
        let mut at = 0usize;
        let mut hashes = [0u64; BATCH];
        g.bench_function(format!("{}k_entries", n / 1000), |b| {
            b.iter(|| {
                if at + BATCH > keys.len() {
                    at = 0;
                }
                let batch = &keys[at..at + BATCH];
                at += BATCH;
                ct.enter(0);
                for (h, k) in hashes.iter_mut().zip(batch) {
                    *h = ct.hash(k);
                }
                let mut hits = 0u32;
                for (h, k) in hashes.iter().zip(batch) {
                    hits += ct.lookup(k, *h, NOW_MS).is_some() as u32;
                }
                ct.leave(0);
                black_box(hits)
            })
        });
        // Every key must have hit: a benchmark of misses would flatter the table.
        let hits = keys
            .iter()
            .filter(|k| ct.lookup(k, ct.hash(k), NOW_MS).is_some())
            .count();
        assert_eq!(hits, keys.len());
    }
    g.finish();
}

/// The frontend table: one hash lookup per new connection.
fn frontend_lookup(c: &mut Criterion) {
    let snap = snapshot();
    let mut rng = Rng(3);
    let keys: Vec<FrontendKey> = (0..4096)
        .map(|_| FrontendKey {
            addr: cluster_ip(rng.below(SERVICES as usize) as u32),
            port: 80,
            proto: IpProto::TCP,
        })
        .collect();
    let mut g = group(c, "frontend_lookup");
    let mut at = 0usize;
    g.bench_function("1k_services", |b| {
        b.iter(|| {
            at = (at + BATCH) % keys.len();
            let mut found = 0u32;
            for k in &keys[at..at + BATCH] {
                found += snap.frontend(black_box(k)).is_some() as u32;
            }
            black_box(found)
        })
    });
    g.finish();
}

/// Established flows: conntrack warmed with the flows' SYNs, then data segments cycling over
/// the flows in a shuffled order. Also the cost of refilling the frame slots alone.
fn pipeline_established(c: &mut Criterion) {
    let snap = snapshot();
    let mut g = group(c, "pipeline_established");
    for flows in [10_000u32, 1_000_000] {
        let ct = Conntrack::new(ct_config(flows + flows / 4), 1);
        let mut pipe = Pipeline::new(0, LinkType::Ethernet, 1, &ct);
        let syns: Vec<Vec<u8>> = (0..flows).map(|k| frame(k, true)).collect();
        run_all(&mut pipe, &snap, &ct, &syns, Reason::ServiceDnat);
        drop(syns);
        let mut order: Vec<u32> = (0..flows).collect();
        Rng(11).shuffle(&mut order);
        let data: Vec<Vec<u8>> = order.iter().map(|&k| frame(k, false)).collect();
        run_all(
            &mut pipe,
            &snap,
            &ct,
            &data[..BATCH * 4],
            Reason::Established,
        );

        let mut slots = SlotFrames::new(BATCH, 2048);
        let mut verdicts = [Verdict::default(); BATCH];
        let mut at = 0usize;
        let mut refill = |slots: &mut SlotFrames| {
            if at + BATCH > data.len() {
                at = 0;
            }
            slots.clear();
            for f in &data[at..at + BATCH] {
                slots.push(f);
            }
            at += BATCH;
        };
        if flows == 10_000 {
            g.bench_function("copy_only_10k_flows", |b| {
                b.iter(|| {
                    refill(&mut slots);
                    black_box(slots.get(0)[0])
                })
            });
        }
        g.bench_function(format!("{}k_flows", flows / 1000), |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    refill(&mut slots);
                    let start = Instant::now();
                    pipe.process(&mut slots, &mut verdicts, &snap, &ct, NOW_MS);
                    t += start.elapsed();
                }
                t
            })
        });
        assert_eq!(
            pipe.counters.reasons[Reason::Established as usize]
                + pipe.counters.reasons[Reason::ServiceDnat as usize],
            pipe.counters.packets,
            "every packet must be a tracked connection"
        );
    }
    g.finish();
}

/// New connections: every packet the SYN of a flow conntrack has not seen, into a table that
/// already holds 10k connections. The table never fills: after each million new flows it is
/// replaced by a fresh one (outside the timed region).
fn pipeline_new_connections(c: &mut Criterion) {
    const BASE: u32 = 10_000;
    const POOL: u32 = 1 << 20;
    let snap = snapshot();
    // Clients BASE.. are the new flows; 0..BASE the connections already there.
    let pool: Vec<Vec<u8>> = (BASE..BASE + POOL).map(|k| frame(k, true)).collect();
    let base: Vec<Vec<u8>> = (0..BASE).map(|k| frame(k, true)).collect();
    let fresh = || {
        let ct = Conntrack::new(ct_config(BASE + POOL + POOL / 8), 1);
        let mut pipe = Pipeline::new(0, LinkType::Ethernet, 1, &ct);
        run_all(&mut pipe, &snap, &ct, &base, Reason::ServiceDnat);
        (ct, pipe)
    };
    let (mut ct, mut pipe) = fresh();
    let mut slots = SlotFrames::new(BATCH, 2048);
    let mut verdicts = [Verdict::default(); BATCH];
    let mut at = 0usize;
    let mut created = 0u64;
    let mut g = group(c, "pipeline_new_connections");
    g.bench_function("into_10k_flows", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                if at + BATCH > pool.len() {
                    created += pipe.counters.ct_created - BASE as u64;
                    (ct, pipe) = fresh();
                    at = 0;
                }
                slots.clear();
                for f in &pool[at..at + BATCH] {
                    slots.push(f);
                }
                at += BATCH;
                let start = Instant::now();
                pipe.process(&mut slots, &mut verdicts, &snap, &ct, NOW_MS);
                t += start.elapsed();
                debug_assert!(verdicts.iter().all(|v| v.reason == Reason::ServiceDnat));
            }
            t
        })
    });
    g.finish();
    created += pipe.counters.ct_created - BASE as u64;
    assert_eq!(
        pipe.counters.reasons[Reason::ServiceDnat as usize],
        pipe.counters.packets,
        "every SYN must have created a connection"
    );
    black_box(created);
}

criterion_group!(
    benches,
    conntrack_lookup,
    frontend_lookup,
    pipeline_established,
    pipeline_new_connections
);
criterion_main!(benches);
