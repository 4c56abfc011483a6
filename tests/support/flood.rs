//! SYN floods against a full conntrack table, replayed: the capture, and what became of each kind
//! of traffic in it. Shared by `tests/replay_flood.rs` (the assertions) and `benches/flood.rs`
//! (the matrix of rates and table sizes).
//!
//! A case holds
//! - established flows (200, or a fifth of the table if smaller), set up in the first 100 ms,
//!   each sending a data packet and getting an answer every 10 ms during the flood;
//! - legitimate new connections spread over the flood: SYN, the SYN-ACK `handshake_ns` later,
//!   then the ACK; with `close`, a request and a close (FIN from the client, FIN-ACK from the
//!   backend, the last ACK) follow, as a short HTTP exchange does;
//! - the flood: SYNs from distinct spoofed sources, `rate` per second for one second, never
//!   answered.

#![allow(dead_code)]

use std::sync::Arc;

use etherparse::PacketBuilder;
use kxdp_dataplane::conntrack::CtConfig;
use kxdp_dataplane::replay::{replay, ReplayOptions, ReplayResult};
use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, NodeInfo, Route,
    ServicePortInfo, Snapshot,
};
use kxdp_dataplane::verdict::Action;
use kxdp_packet::pcap::{Capture, CapturedPacket};
use kxdp_packet::IpProto;
use kxdp_packet::{Addr, LinkType};

pub const VIP: [u8; 4] = [172, 30, 0, 1];
pub const BACKEND: [u8; 4] = [10, 2, 0, 1];
const T0_NS: u64 = 1_000_000_000;
pub const FLOOD_NS: u64 = 1_000_000_000;

/// One ClusterIP with one backend.
pub fn snapshot() -> Snapshot {
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
            proto: IpProto::TCP,
        },
        Frontend {
            service_port: Arc::new(ServicePortInfo {
                name: Arc::from("flood/web:http"),
                id: 0x0f10_0d00,
                proto: IpProto::TCP,
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Syn,
    SynAck,
    Ack,
    Fin,
}

/// Client → Service (`to_service`) or backend → client.
fn tcp(client: ([u8; 4], u16), to_service: bool, kind: Kind) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let b = if to_service {
        eth.ipv4(client.0, VIP, 64).tcp(client.1, 80, 1000, 64240)
    } else {
        eth.ipv4(BACKEND, client.0, 64)
            .tcp(8080, client.1, 5000, 64240)
    };
    let ack = if to_service { 5001 } else { 1001 };
    let b = match kind {
        Kind::Syn => b.syn(),
        Kind::SynAck => b.syn().ack(1001),
        Kind::Ack => b.ack(ack),
        Kind::Fin => b.fin().ack(ack),
    };
    b.write(&mut v, &[]).unwrap();
    v
}

/// What each packet of the capture is, for scoring.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Established,
    Legit(u32),
    Flood,
    Setup,
}

#[derive(Clone, Copy)]
pub struct Case {
    /// Flood SYNs per second (for one second).
    pub rate: u64,
    /// `conntrack.maxEntries`.
    pub table: u32,
    /// Legitimate new connections spread over the flood.
    pub legit: u32,
    /// From a legitimate SYN to its SYN-ACK (the ACK follows 1 µs later).
    pub handshake_ns: u64,
    /// Legitimate connections send a request and close (a short HTTP exchange) rather than
    /// stay open.
    pub close: bool,
}

impl Case {
    /// The replay of issue-sized numbers: 1,000 entries, 200 established flows, 100,000 SYNs
    /// 10 µs apart, 1,000 legitimate connections each answered three flood SYNs later, each
    /// a short exchange that closes.
    pub fn reference() -> Case {
        Case {
            rate: 100_000,
            table: 1_000,
            legit: 1_000,
            handshake_ns: 30_000,
            close: true,
        }
    }

    pub fn established(&self) -> u32 {
        (self.table / 5).min(200)
    }
}

pub fn capture(case: &Case) -> (Capture, Vec<Role>) {
    let established = case.established();
    let mut pkts: Vec<(u64, Vec<u8>, Role)> = Vec::new();
    let est = |i: u32| ([10, 1, (i >> 8) as u8, i as u8], 30_000u16);
    // Established flows: handshakes in the first 100 ms, before the flood.
    for i in 0..established {
        let t = T0_NS + i as u64 * 100_000;
        pkts.push((t, tcp(est(i), true, Kind::Syn), Role::Setup));
        pkts.push((
            t + 20_000_000,
            tcp(est(i), false, Kind::SynAck),
            Role::Setup,
        ));
        pkts.push((t + 40_000_000, tcp(est(i), true, Kind::Ack), Role::Setup));
    }
    let flood_start = T0_NS + 200_000_000;
    // Data both ways every 10 ms during the flood.
    let mut t = flood_start;
    while t < flood_start + FLOOD_NS {
        for i in 0..established {
            let at = t + i as u64 * (10_000_000 / established as u64);
            pkts.push((at, tcp(est(i), true, Kind::Ack), Role::Established));
            pkts.push((
                at + 500_000,
                tcp(est(i), false, Kind::Ack),
                Role::Established,
            ));
        }
        t += 10_000_000;
    }
    // Legitimate new connections, placed between two flood SYNs (+3 µs).
    for l in 0..case.legit {
        let at = flood_start + l as u64 * (FLOOD_NS / case.legit as u64) + 3_000;
        let c = ([10, 3, (l >> 8) as u8, l as u8], 40_000u16);
        let hs = case.handshake_ns;
        pkts.push((at, tcp(c, true, Kind::Syn), Role::Legit(l)));
        pkts.push((at + hs, tcp(c, false, Kind::SynAck), Role::Legit(l)));
        pkts.push((at + hs + 1_000, tcp(c, true, Kind::Ack), Role::Legit(l)));
        if case.close {
            // Request, response with the backend's FIN, the client's FIN, the last ACK.
            let t = at + hs + 200_000;
            pkts.push((t, tcp(c, true, Kind::Ack), Role::Legit(l)));
            pkts.push((t + 100_000, tcp(c, false, Kind::Fin), Role::Legit(l)));
            pkts.push((t + 200_000, tcp(c, true, Kind::Fin), Role::Legit(l)));
            pkts.push((t + 300_000, tcp(c, false, Kind::Ack), Role::Legit(l)));
        } else {
            pkts.push((at + 20_000_000, tcp(c, true, Kind::Ack), Role::Legit(l)));
        }
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
        pkts.push((at, tcp(c, true, Kind::Syn), Role::Flood));
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

/// What became of a case's traffic.
#[derive(Clone, Copy, Debug)]
pub struct Score {
    pub established_pct: f64,
    pub legit_pct: f64,
    pub flood_pct: f64,
    /// Setup packets dropped (none expected).
    pub setup_dropped: u64,
}

pub fn score(case: &Case, roles: &[Role], r: &ReplayResult) -> Score {
    let ok = |i: usize| r.verdicts[i].action == Action::Forward;
    let (mut est_ok, mut est_n, mut flood_ok, mut flood_n) = (0u64, 0u64, 0u64, 0u64);
    let mut setup_dropped = 0;
    let mut legit = vec![true; case.legit as usize];
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
            Role::Setup => setup_dropped += !ok(i) as u64,
        }
    }
    let legit_ok = legit.iter().filter(|&&b| b).count() as u64;
    let pct = |a: u64, b: u64| {
        if b == 0 {
            100.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    Score {
        established_pct: pct(est_ok, est_n),
        legit_pct: pct(legit_ok, case.legit as u64),
        flood_pct: pct(flood_ok, flood_n),
        setup_dropped,
    }
}

/// Replays a case through `snap` with a table of `case.table` entries: the score and the replay's
/// own counts.
pub fn run(snap: &Arc<Snapshot>, case: &Case) -> (Score, ReplayResult) {
    let (cap, roles) = capture(case);
    let r = replay(
        snap.clone(),
        CtConfig {
            max_entries: case.table,
            ..CtConfig::default()
        },
        &cap,
        &ReplayOptions::default(),
    )
    .expect("a replay in process memory does not fail");
    (score(case, &roles, &r), r)
}
