//! SYN flood against a full conntrack table: for floods of 10k, 100k and 1M SYN/s
//! against tables of 1k, 100k and 1M entries, what happens to
//! - established flows (200, or a fifth of the table if smaller), each sending a data packet and
//!   getting an answer every 10 ms: their delivery (goal: 100%);
//! - 1,000 legitimate new connections spread over the flood (SYN, SYN-ACK 1 ms later, ACK, data
//!   20 ms later; 400 against the 1k table, whose room they and the established flows would
//!   otherwise fill with assured entries by themselves): the share that completes (every one of
//!   its packets forwarded);
//! - the flood itself: drop reasons.
//!
//! Everything goes through `replay` (the workers' pipeline, shared conntrack, capture clock) with
//! one worker, so the numbers are the same on every run: this is a measurement of behaviour, not of
//! speed. One second of flood per case; `cargo bench --bench flood` (a few minutes in release on
//! a 2-core machine; `-- 1k` runs only the cases whose name contains `1k`). `--json` prints one
//! JSON object per case.

use std::sync::Arc;

use etherparse::PacketBuilder;
use kxdp_dataplane::conntrack::CtConfig;
use kxdp_dataplane::replay::{replay, ReplayOptions};
use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, NodeInfo, Route,
    ServicePortInfo, Snapshot,
};
use kxdp_dataplane::verdict::{Action, Reason};
use kxdp_packet::pcap::{Capture, CapturedPacket};
use kxdp_packet::proto;
use kxdp_packet::{Addr, LinkType};

const VIP: [u8; 4] = [172, 30, 0, 1];
const BACKEND: [u8; 4] = [10, 2, 0, 1];
const T0_NS: u64 = 1_000_000_000;
const FLOOD_NS: u64 = 1_000_000_000;
const LEGIT_MAX: u32 = 1_000;

fn snapshot() -> Snapshot {
    let node = Addr::from_v4([192, 168, 0, 2]);
    let mut s = Snapshot {
        generation: 1,
        node: NodeInfo {
            name: "flood".into(),
            snat_v4: Some(node),
            snat_v6: None,
            addrs: vec![node],
        },
        ..Snapshot::default()
    };
    s.cluster_cidrs.insert("10.0.0.0".parse().unwrap(), 8);
    s.service_cidrs.insert("172.30.0.0".parse().unwrap(), 16);
    let endpoints: Arc<[Endpoint]> = Arc::new([Endpoint {
        addr: Addr::from_v4(BACKEND),
        port: 8080,
        local: false,
    }]);
    let route = |masquerade| Route {
        endpoints: EndpointRange { start: 0, len: 1 },
        masquerade,
        when_empty: EmptyAction::Reject,
    };
    s.insert_frontend(
        FrontendKey {
            addr: Addr::from_v4(VIP),
            port: 80,
            proto: proto::TCP,
        },
        Frontend {
            service_port: Arc::new(ServicePortInfo {
                name: Arc::from("flood/web:http"),
                id: 0x0f10_0d00,
                proto: proto::TCP,
                affinity_timeout_s: 0,
            }),
            kind: FrontendKind::ClusterIp,
            routes: [route(false), route(true), route(true)],
            endpoints,
            source_ranges: None,
            maglev: None,
        },
    );
    s.cluster_ips.insert(Addr::from_v4(VIP));
    s.validate().unwrap();
    s
}

const SYN: u8 = 1;
const SYNACK: u8 = 2;
const ACK: u8 = 3;

/// Client → Service (`to_service`) or backend → client.
fn tcp(client: ([u8; 4], u16), to_service: bool, kind: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let b = if to_service {
        eth.ipv4(client.0, VIP, 64).tcp(client.1, 80, 1000, 64240)
    } else {
        eth.ipv4(BACKEND, client.0, 64)
            .tcp(8080, client.1, 5000, 64240)
    };
    let b = match kind {
        SYN => b.syn(),
        SYNACK => b.syn().ack(1001),
        _ => b.ack(if to_service { 5001 } else { 1001 }),
    };
    b.write(&mut v, &[]).unwrap();
    v
}

/// What each packet of the capture is, for scoring.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Established,
    Legit(u32),
    Flood,
    Setup,
}

struct Case {
    rate: u64,
    table: u32,
}

impl Case {
    fn legit(&self) -> u32 {
        LEGIT_MAX.min(self.table * 2 / 5)
    }
}

fn capture(case: &Case) -> (Capture, Vec<Role>) {
    let established = (case.table / 5).min(200);
    let mut pkts: Vec<(u64, Vec<u8>, Role)> = Vec::new();
    let est = |i: u32| ([10, 1, (i >> 8) as u8, i as u8], 30_000u16);
    // Established flows: handshakes in the first 100 ms, before the flood.
    for i in 0..established {
        let t = T0_NS + i as u64 * 100_000;
        pkts.push((t, tcp(est(i), true, SYN), Role::Setup));
        pkts.push((t + 20_000_000, tcp(est(i), false, SYNACK), Role::Setup));
        pkts.push((t + 40_000_000, tcp(est(i), true, ACK), Role::Setup));
    }
    let flood_start = T0_NS + 200_000_000;
    // Data both ways every 10 ms during the flood.
    let mut t = flood_start;
    while t < flood_start + FLOOD_NS {
        for i in 0..established {
            let at = t + i as u64 * (10_000_000 / established as u64);
            pkts.push((at, tcp(est(i), true, ACK), Role::Established));
            pkts.push((at + 500_000, tcp(est(i), false, ACK), Role::Established));
        }
        t += 10_000_000;
    }
    // Legitimate new connections: SYN, SYN-ACK after 1 ms, ACK, data after 20 ms.
    for l in 0..case.legit() {
        let at = flood_start + l as u64 * (FLOOD_NS / case.legit() as u64);
        let c = ([10, 3, (l >> 8) as u8, l as u8], 40_000u16);
        pkts.push((at, tcp(c, true, SYN), Role::Legit(l)));
        pkts.push((at + 1_000_000, tcp(c, false, SYNACK), Role::Legit(l)));
        pkts.push((at + 1_100_000, tcp(c, true, ACK), Role::Legit(l)));
        pkts.push((at + 20_000_000, tcp(c, true, ACK), Role::Legit(l)));
    }
    // The flood: distinct spoofed pod sources, never answered.
    let n = case.rate * FLOOD_NS / 1_000_000_000;
    for k in 0..n {
        let at = flood_start + k * FLOOD_NS / n;
        let h = (k as u32).wrapping_mul(2_654_435_761);
        let c = (
            [
                10,
                128 | (h >> 24) as u8 & 0x7f,
                (h >> 16) as u8,
                (h >> 8) as u8,
            ],
            1024 + (k % 60_000) as u16,
        );
        pkts.push((at, tcp(c, true, SYN), Role::Flood));
    }
    pkts.sort_by_key(|p| p.0);
    let roles = pkts.iter().map(|p| p.2).collect();
    let capture = Capture {
        link: LinkType::Ethernet,
        packets: pkts
            .into_iter()
            .map(|(ts_ns, data, _)| CapturedPacket { ts_ns, data })
            .collect(),
    };
    (capture, roles)
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let json = args.iter().any(|a| a == "--json");
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();
    let snap = Arc::new(snapshot());
    if !json {
        println!(
            "{:<22} {:>12} {:>12} {:>10} {:>12} {:>12}  other drops",
            "case", "established", "legit new", "flood ok", "conntrack-full", "ct-invalid"
        );
    }
    for rate in [10_000u64, 100_000, 1_000_000] {
        for table in [1_000u32, 100_000, 1_000_000] {
            let case = Case { rate, table };
            let name = format!("{}SYN/s-table{}", human(rate), human(table as u64));
            if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
                continue;
            }
            let (cap, roles) = capture(&case);
            let r = replay(
                snap.clone(),
                CtConfig {
                    max_entries: table,
                    ..CtConfig::default()
                },
                &cap,
                &ReplayOptions::default(),
            )
            .expect("a replay in process memory does not fail");
            let ok = |i: usize| r.verdicts[i].action == Action::Forward;
            let (mut est_ok, mut est_n, mut flood_ok, mut flood_n) = (0u64, 0u64, 0u64, 0u64);
            let mut legit = vec![true; case.legit() as usize];
            for (i, role) in roles.iter().enumerate() {
                match role {
                    Role::Established => {
                        est_n += 1;
                        est_ok += ok(i) as u64;
                    }
                    Role::Legit(l) => legit[*l as usize] &= ok(i),
                    Role::Flood => {
                        flood_n += 1;
                        flood_ok += ok(i) as u64;
                    }
                    Role::Setup => assert!(ok(i), "setup packet {i} dropped"),
                }
            }
            let legit_ok = legit.iter().filter(|&&b| b).count();
            let count = |reason: Reason| r.reasons[reason as usize];
            let others: Vec<String> = Reason::ALL
                .iter()
                .filter(|&&x| x != Reason::ConntrackFull && x != Reason::CtInvalid)
                .filter(|&&x| x.action() == Action::Drop && r.reasons[x as usize] > 0)
                .map(|&x| format!("{}={}", x.as_str(), r.reasons[x as usize]))
                .collect();
            let pct = |a: u64, b: u64| {
                if b == 0 {
                    100.0
                } else {
                    100.0 * a as f64 / b as f64
                }
            };
            if json {
                println!(
                    "{{\"case\":\"{name}\",\"established_delivered_pct\":{:.2},\"legit_completed_pct\":{:.1},\"flood_forwarded_pct\":{:.1},\"conntrack_full\":{},\"ct_invalid\":{},\"conntrack_entries\":{}}}",
                    pct(est_ok, est_n),
                    pct(legit_ok as u64, case.legit() as u64),
                    pct(flood_ok, flood_n),
                    count(Reason::ConntrackFull),
                    count(Reason::CtInvalid),
                    r.conntrack_entries
                );
            } else {
                println!(
                    "{:<22} {:>11.2}% {:>11.1}% {:>9.1}% {:>12} {:>12}  {}",
                    name,
                    pct(est_ok, est_n),
                    pct(legit_ok as u64, case.legit() as u64),
                    pct(flood_ok, flood_n),
                    count(Reason::ConntrackFull),
                    count(Reason::CtInvalid),
                    if others.is_empty() {
                        "-".into()
                    } else {
                        others.join(" ")
                    }
                );
            }
        }
    }
}
