//! The pipeline against a hand-built snapshot: packets in, packets out (no Kubernetes types).

use std::sync::Arc;

use etherparse::PacketBuilder;
use kxdp_dataplane::conntrack::{Conntrack, CtConfig};
use kxdp_dataplane::pipeline::{Frames, Pipeline, SlotFrames};
use kxdp_dataplane::snapshot::*;
use kxdp_dataplane::verdict::{Action, Reason, Verdict};
use kxdp_packet::{parse, verify, Addr, IpProto, LinkType, Parsed};

const NODE: [u8; 4] = [192, 168, 0, 2];
const VIP: [u8; 4] = [172, 30, 0, 41];
const POD: [u8; 4] = [10, 0, 1, 1];
const EP1: [u8; 4] = [10, 0, 2, 1];
const EP2: [u8; 4] = [10, 0, 3, 1];

fn a(o: [u8; 4]) -> Addr {
    Addr::from_v4(o)
}

fn snapshot(masq_external: bool, affinity: u32) -> Snapshot {
    let mut s = Snapshot::empty();
    s.node.addrs = vec![a(NODE)];
    s.node.snat_v4 = Some(a(NODE));
    s.cluster_cidrs.insert("10.0.0.0".parse().unwrap(), 8);
    s.service_cidrs.insert("172.30.0.0".parse().unwrap(), 16);
    let endpoints: std::sync::Arc<[Endpoint]> = vec![
        Endpoint {
            addr: a(EP1),
            port: 8080,
            local: true,
        },
        Endpoint {
            addr: a(EP2),
            port: 8080,
            local: false,
        },
        Endpoint {
            addr: a(POD),
            port: 8080,
            local: true,
        },
    ]
    .into();
    let sp = |name: &str, id, proto, affinity_timeout_s| {
        std::sync::Arc::new(ServicePortInfo {
            name: name.into(),
            id,
            proto,
            affinity_timeout_s,
        })
    };
    let svc1 = sp("ns1/svc1:http", 11, IpProto::TCP, affinity);
    let empty = sp("ns1/empty", 12, IpProto::UDP, 0);
    let selfp = sp("ns1/self", 13, IpProto::TCP, 0);
    let both = EndpointRange { start: 0, len: 2 };
    let route = |masquerade| Route {
        endpoints: both,
        masquerade,
        when_empty: EmptyAction::Reject,
    };
    let key = |addr, port, proto| FrontendKey { addr, port, proto };
    s.insert_frontend(
        key(a(VIP), 80, IpProto::TCP),
        Frontend {
            service_port: svc1.clone(),
            kind: FrontendKind::ClusterIp,
            routes: [route(false), route(true), route(true)],
            endpoints: endpoints.clone(),
            source_ranges: None,
            maglev: None,
        },
    );
    s.insert_frontend(
        key(a(VIP), 53, IpProto::UDP),
        Frontend {
            service_port: empty,
            kind: FrontendKind::ClusterIp,
            routes: [Route::default(); 3],
            endpoints: endpoints.clone(),
            source_ranges: None,
            maglev: None,
        },
    );
    s.insert_frontend(
        key(a([172, 30, 0, 42]), 80, IpProto::TCP),
        Frontend {
            service_port: selfp,
            kind: FrontendKind::ClusterIp,
            routes: [Route {
                endpoints: EndpointRange { start: 2, len: 1 },
                masquerade: false,
                when_empty: EmptyAction::Reject,
            }; 3],
            endpoints: endpoints.clone(),
            source_ranges: None,
            maglev: None,
        },
    );
    s.insert_frontend(
        key(a(NODE), 30080, IpProto::TCP),
        Frontend {
            service_port: svc1,
            kind: FrontendKind::NodePort,
            routes: [route(masq_external); 3],
            endpoints,
            source_ranges: None,
            maglev: None,
        },
    );
    s.cluster_ips.insert(a(VIP));
    s.cluster_ips.insert(a([172, 30, 0, 42]));
    s.validate().unwrap();
    s
}

fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, syn: bool, ack: bool) -> Vec<u8> {
    let mut b = PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4(src, dst, 64)
        .tcp(sport, dport, 1000, 65535);
    if syn {
        b = b.syn();
    }
    if ack {
        b = b.ack(5000);
    }
    let payload = [7u8; 10];
    let mut v = Vec::new();
    b.write(&mut v, &payload).unwrap();
    v
}

fn udp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut v, &[1, 2, 3, 4])
        .unwrap();
    v
}

struct Harness {
    snap: Arc<Snapshot>,
    ct: Conntrack,
    pipe: Pipeline,
    now: u64,
}

impl Harness {
    fn new(snap: Snapshot) -> Harness {
        let ct = Conntrack::new(CtConfig::default(), 1);
        let pipe = Pipeline::new(0, LinkType::Ethernet, 42, &ct);
        Harness {
            snap: Arc::new(snap),
            ct,
            pipe,
            now: 1000,
        }
    }

    fn run(&mut self, pkts: &[Vec<u8>]) -> Vec<(Verdict, Vec<u8>)> {
        let mut frames = SlotFrames::new(pkts.len(), 2048);
        for p in pkts {
            assert!(frames.push(p));
        }
        let mut verdicts = vec![Verdict::default(); pkts.len()];
        self.pipe
            .process(&mut frames, &mut verdicts, &self.snap, &self.ct, self.now);
        verdicts
            .into_iter()
            .enumerate()
            .map(|(i, v)| (v, frames.frame(i).to_vec()))
            .collect()
    }

    fn one(&mut self, p: Vec<u8>) -> (Verdict, Vec<u8>) {
        self.run(&[p]).pop().unwrap()
    }
}

fn meta(frame: &[u8]) -> kxdp_packet::PacketMeta {
    match parse(frame, LinkType::Ethernet).unwrap() {
        Parsed::Ip(m) => m,
        Parsed::NotIp => panic!("not ip"),
    }
}

fn valid(frame: &[u8]) {
    let m = meta(frame);
    verify::checksums(frame, &m).expect("checksums valid");
}

#[test]
fn pod_to_clusterip_dnat_keeps_client_and_reply_is_unnatted() {
    let mut h = Harness::new(snapshot(true, 0));
    let (v, out) = h.one(tcp(POD, 40000, VIP, 80, true, false));
    assert_eq!(v.reason, Reason::ServiceDnat);
    assert_eq!(v.action, Action::Forward);
    assert!(!v.masq);
    assert_eq!(v.service_id, 11);
    let m = meta(&out);
    valid(&out);
    assert_eq!(m.src, a(POD));
    assert_eq!(m.sport, 40000);
    assert!(m.dst == a(EP1) || m.dst == a(EP2));
    assert_eq!(m.dport, 8080);
    let backend = m.dst;

    // The backend answers; the client sees the VIP.
    let be = backend.v4_octets();
    let (v, out) = h.one(tcp(be, 8080, POD, 40000, true, true));
    assert_eq!(v.reason, Reason::ReplyUnnat);
    let m = meta(&out);
    valid(&out);
    assert_eq!(
        (m.src, m.sport, m.dst, m.dport),
        (a(VIP), 80, a(POD), 40000)
    );

    // The rest of the flow sticks to the backend.
    for _ in 0..20 {
        let (v, out) = h.one(tcp(POD, 40000, VIP, 80, false, true));
        assert_eq!(v.reason, Reason::Established);
        assert_eq!(meta(&out).dst, backend);
        valid(&out);
    }
}

#[test]
fn node_source_is_masqueraded_with_unique_ports() {
    let mut h = Harness::new(snapshot(true, 0));
    let mut seen = std::collections::HashSet::new();
    // Two clients, same source port, many connections: SNAT tuples never collide.
    for i in 0..200u16 {
        for client in [[203, 0, 113, 1], [203, 0, 113, 2]] {
            let (v, out) = h.one(tcp(client, 1000 + i, VIP, 80, true, false));
            assert_eq!(v.reason, Reason::ServiceDnat);
            assert!(v.masq);
            let m = meta(&out);
            valid(&out);
            assert_eq!(m.src, a(NODE));
            assert!(seen.insert((m.dst, m.sport)), "SNAT tuple reused");
        }
    }
    // A reply to a masqueraded connection returns to the original client.
    let (v, out) = h.one(tcp([203, 0, 113, 1], 5555, VIP, 80, true, false));
    let m = meta(&out);
    assert!(v.masq);
    let (v, back) = h.one(tcp(m.dst.v4_octets(), 8080, NODE, m.sport, true, true));
    assert_eq!(v.reason, Reason::ReplyUnnat);
    let b = meta(&back);
    assert_eq!(
        (b.src, b.sport, b.dst, b.dport),
        (a(VIP), 80, a([203, 0, 113, 1]), 5555)
    );
    valid(&back);
}

#[test]
fn hairpin_is_masqueraded() {
    let mut h = Harness::new(snapshot(false, 0));
    let (v, out) = h.one(tcp(POD, 40000, [172, 30, 0, 42], 80, true, false));
    assert_eq!(v.reason, Reason::ServiceDnat);
    assert!(v.masq);
    let m = meta(&out);
    assert_eq!((m.src, m.dst), (a(NODE), a(POD)));
}

#[test]
fn masquerade_without_a_node_address_of_the_family_drops() {
    let mut snap = snapshot(true, 0);
    snap.node.snat_v4 = None;
    let mut h = Harness::new(snap);
    // An external client's connection is masqueraded: no IPv4 node address, no connection.
    let (v, _) = h.one(tcp([203, 0, 113, 1], 5555, VIP, 80, true, false));
    assert_eq!((v.reason, v.action), (Reason::NoNodeAddress, Action::Drop));
    assert_eq!(h.ct.len(), 0);
    // A pod's is not masqueraded and goes ahead.
    let (v, _) = h.one(tcp(POD, 5555, VIP, 80, true, false));
    assert_eq!(v.reason, Reason::ServiceDnat);
}

#[test]
fn affinity_record_is_written_before_masquerade_refuses() {
    // With ClientIP affinity the endpoint is recorded when it is chosen, before masquerade: a
    // connection then refused for want of a node address still leaves its client's record.
    let mut snap = snapshot(true, 600);
    snap.node.snat_v4 = None;
    let mut h = Harness::new(snap);
    let (v, _) = h.one(tcp([203, 0, 113, 1], 5555, VIP, 80, true, false));
    assert_eq!(v.reason, Reason::NoNodeAddress);
    assert_eq!(h.ct.len(), 1, "the affinity record, and no connection");
}

#[test]
fn masquerade_without_a_free_source_port_drops() {
    // A Service with one endpoint whose connections are all masqueraded to the node's address:
    // 64,512 reply tuples (source ports 1024-65535) plus the clients' own low ports. Two
    // clients sending from 40,000 ports each fill them; past that a connection whose 32 random
    // ports are all taken is refused, and no two connections ever share a reply tuple.
    const ONE: [u8; 4] = [172, 30, 0, 50];
    let mut snap = snapshot(true, 0);
    let masq = Route {
        endpoints: EndpointRange { start: 0, len: 1 },
        masquerade: true,
        when_empty: EmptyAction::Reject,
    };
    snap.insert_frontend(
        FrontendKey {
            addr: a(ONE),
            port: 80,
            proto: IpProto::TCP,
        },
        Frontend {
            service_port: Arc::new(ServicePortInfo {
                name: "ns1/one:http".into(),
                id: 14,
                proto: IpProto::TCP,
                affinity_timeout_s: 0,
            }),
            kind: FrontendKind::ClusterIp,
            routes: [masq; 3],
            endpoints: vec![Endpoint {
                addr: a(EP1),
                port: 8080,
                local: true,
            }]
            .into(),
            source_ranges: None,
            maglev: None,
        },
    );
    snap.cluster_ips.insert(a(ONE));
    snap.validate().unwrap();
    let mut h = Harness::new(snap);
    let (mut exhausted, mut replies) = (0, std::collections::HashSet::new());
    for client in [[203, 0, 113, 1], [203, 0, 113, 2]] {
        let ports: Vec<u16> = (1..=40_000).collect();
        for chunk in ports.chunks(64) {
            let pkts: Vec<_> = chunk
                .iter()
                .map(|&p| tcp(client, p, ONE, 80, true, false))
                .collect();
            for (v, out) in h.run(&pkts) {
                match v.reason {
                    Reason::ServiceDnat => {
                        let m = meta(&out);
                        assert_eq!((m.src, m.dst), (a(NODE), a(EP1)));
                        assert!(replies.insert(m.sport), "reply tuple reused");
                    }
                    Reason::SnatExhausted => {
                        assert_eq!(v.action, Action::Drop);
                        exhausted += 1;
                    }
                    r => panic!("unexpected {r:?}"),
                }
            }
        }
    }
    assert!(exhausted >= 80_000 - 65_535, "{exhausted} refused");
    assert_eq!(replies.len() + exhausted, 80_000);
}

#[test]
fn rejects_drops_and_passes() {
    let mut h = Harness::new(snapshot(false, 0));
    // No endpoints: UDP gets ICMP port unreachable.
    let (v, out) = h.one(udp(POD, 5000, VIP, 53));
    assert_eq!(v.reason, Reason::NoEndpoints);
    assert_eq!(v.action, Action::Reject);
    let m = meta(&out);
    assert_eq!(
        (m.src, m.dst, m.proto, m.icmp_type, m.icmp_code),
        (a(VIP), a(POD), IpProto::ICMP, 3, 3)
    );
    valid(&out);
    // Undefined port on a ClusterIP: TCP RST.
    let (v, out) = h.one(tcp(POD, 40000, VIP, 81, true, false));
    assert_eq!(v.reason, Reason::ServicePortUnknown);
    let m = meta(&out);
    assert_eq!(
        (m.src, m.sport, m.dst, m.dport),
        (a(VIP), 81, a(POD), 40000)
    );
    assert!(m.tcp_flags & 0x04 != 0);
    valid(&out);
    // Unallocated service address: drop.
    let (v, _) = h.one(tcp(POD, 40000, [172, 30, 9, 9], 80, true, false));
    assert_eq!(v.reason, Reason::ServiceIpUnallocated);
    // Node address without NodePort: pass; elsewhere: forward unchanged.
    let (v, _) = h.one(tcp(POD, 40000, NODE, 22, true, false));
    assert_eq!(v.reason, Reason::ToNode);
    let p = tcp(POD, 40000, EP2, 22, true, false);
    let (v, out) = h.one(p.clone());
    assert_eq!(v.reason, Reason::Direct);
    assert_eq!(out, p);
    // Garbage.
    let (v, _) = h.one(vec![1, 2, 3]);
    assert_eq!(v.reason, Reason::Malformed);
    assert!(!v.has_addrs);
}

#[test]
fn session_affinity_pins_a_client() {
    let mut h = Harness::new(snapshot(false, 10));
    let mut backends = std::collections::HashSet::new();
    for i in 0..50 {
        let (v, out) = h.one(tcp(POD, 30000 + i, VIP, 80, true, false));
        assert_eq!(v.reason, Reason::ServiceDnat);
        backends.insert(meta(&out).dst);
    }
    assert_eq!(backends.len(), 1);
    // Without affinity, both endpoints get traffic.
    let mut h = Harness::new(snapshot(false, 0));
    let mut backends = std::collections::HashSet::new();
    for i in 0..50 {
        let (_, out) = h.one(tcp(POD, 30000 + i, VIP, 80, true, false));
        backends.insert(meta(&out).dst);
    }
    assert_eq!(backends.len(), 2);
}

#[test]
fn affinity_record_outside_the_route_is_replaced() {
    // Affinity never overrides eligibility: a client pinned to an endpoint the route no longer
    // lists gets another one, and is pinned to that one from then on.
    let vip80 = FrontendKey {
        addr: a(VIP),
        port: 80,
        proto: IpProto::TCP,
    };
    let mut h = Harness::new(snapshot(false, 600));
    let full = h.snap.clone();
    let (_, out) = h.one(tcp(POD, 41000, VIP, 80, true, false));
    let pinned = meta(&out).dst;
    // The endpoint list is [EP1, EP2, POD]; the route keeps the other of EP1 and EP2.
    let (other, at) = if pinned == a(EP1) {
        (a(EP2), 1)
    } else {
        (a(EP1), 0)
    };
    let mut only_other = snapshot(false, 600);
    let mut fe = only_other.frontend(&vip80).unwrap().clone();
    fe.routes[0].endpoints = EndpointRange { start: at, len: 1 };
    only_other.insert_frontend(vip80, fe);
    only_other.validate().unwrap();
    h.snap = Arc::new(only_other);
    let (v, out) = h.one(tcp(POD, 41001, VIP, 80, true, false));
    assert_eq!(v.reason, Reason::ServiceDnat);
    assert_eq!(meta(&out).dst, other);
    // Both endpoints listed again: the record now names the other one.
    h.snap = full;
    for port in 41002..41022 {
        let (_, out) = h.one(tcp(POD, port, VIP, 80, true, false));
        assert_eq!(meta(&out).dst, other, "re-pinned");
    }
}

#[test]
fn full_table_refuses_when_every_entry_is_assured() {
    let snap = snapshot(false, 0);
    let ct = Conntrack::new(
        CtConfig {
            max_entries: 16,
            ..CtConfig::default()
        },
        1,
    );
    let mut h = Harness {
        pipe: Pipeline::new(0, LinkType::Ethernet, 1, &ct),
        ct,
        snap: Arc::new(snap),
        now: 1000,
    };
    let mut full = 0;
    for i in 0..40u16 {
        // Handshakes complete so that entries are assured and cannot be dropped early.
        let (v, out) = h.one(tcp(POD, 1000 + i, VIP, 80, true, false));
        if v.reason == Reason::ConntrackFull {
            full += 1;
            continue;
        }
        let m = meta(&out);
        h.one(tcp(m.dst.v4_octets(), 8080, POD, 1000 + i, true, true));
        h.one(tcp(POD, 1000 + i, VIP, 80, false, true));
    }
    assert_eq!(full, 40 - 16);
    assert_eq!(h.ct.len(), 16);
}

#[test]
fn packets_of_a_connection_created_earlier_in_the_same_batch() {
    let mut h = Harness::new(snapshot(false, 0));
    // A burst of one new flow in one batch: every packet goes where the first went.
    let mut pkts = vec![tcp(POD, 40000, VIP, 80, true, false)];
    for _ in 0..10 {
        pkts.push(tcp(POD, 40000, VIP, 80, false, true));
    }
    let out = h.run(&pkts);
    assert_eq!(out[0].0.reason, Reason::ServiceDnat);
    let backend = meta(&out[0].1).dst;
    for (v, f) in &out[1..] {
        assert_eq!(v.reason, Reason::Established);
        assert_eq!(meta(f).dst, backend);
    }
    // SYN, SYN-ACK and ACK back to back in one batch (one endpoint, so the reply is known).
    let mut s = snapshot(false, 0);
    let vip = FrontendKey {
        addr: a(VIP),
        port: 80,
        proto: IpProto::TCP,
    };
    let mut fe = s.frontends.get(&vip).unwrap().clone();
    fe.routes = [Route {
        endpoints: EndpointRange { start: 0, len: 1 },
        masquerade: false,
        when_empty: EmptyAction::Reject,
    }; 3];
    s.frontends.insert(vip, fe);
    let mut h = Harness::new(s);
    let out = h.run(&[
        tcp(POD, 40002, VIP, 80, true, false),
        tcp(EP1, 8080, POD, 40002, true, true),
        tcp(POD, 40002, VIP, 80, false, true),
    ]);
    let reasons: Vec<_> = out.iter().map(|(v, _)| v.reason).collect();
    assert_eq!(
        reasons,
        [Reason::ServiceDnat, Reason::ReplyUnnat, Reason::Established]
    );
    let m = meta(&out[1].1);
    assert_eq!((m.src, m.sport), (a(VIP), 80));
}

#[test]
fn syn_after_time_wait_starts_a_new_connection() {
    let mut h = Harness::new(snapshot(false, 0));
    let c = |syn, ack| tcp(POD, 40000, VIP, 80, syn, ack);
    let (_, f) = h.one(c(true, false));
    let be = meta(&f).dst.v4_octets();
    let r = |flags_fin: bool| {
        let mut v = Vec::new();
        let b = PacketBuilder::ethernet2([1; 6], [2; 6])
            .ipv4(be, POD, 64)
            .tcp(8080, 40000, 1, 100)
            .ack(1001);
        let b = if flags_fin { b.fin() } else { b.syn() };
        b.write(&mut v, &[]).unwrap();
        v
    };
    h.one(r(false)); // SYN-ACK
    h.one(c(false, true)); // ACK: established
    let mut fin = Vec::new();
    PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4(POD, VIP, 64)
        .tcp(40000, 80, 1001, 100)
        .fin()
        .ack(1)
        .write(&mut fin, &[])
        .unwrap();
    h.one(fin);
    h.one(r(true)); // FIN from the server
    h.one(c(false, true)); // last ACK: TIME_WAIT
    let v = h.ct.connections().next().unwrap();
    assert_eq!(Conntrack::state_name(&v), Some("TIME_WAIT"));
    let (v, _) = h.one(c(true, false));
    assert_eq!(
        v.reason,
        Reason::ServiceDnat,
        "a SYN in TIME_WAIT opens a new connection"
    );
    assert_eq!(h.ct.connections().count(), 1);
}

#[test]
fn established_flow_keeps_its_backend_when_the_service_changes() {
    let mut h = Harness::new(snapshot(false, 0));
    let (_, out) = h.one(tcp(POD, 40000, VIP, 80, true, false));
    let backend = meta(&out).dst;
    // The Service now lists only the other endpoint; a new snapshot is published.
    let mut s = snapshot(false, 0);
    let other = if backend == a(EP1) { 1 } else { 0 };
    let vip = FrontendKey {
        addr: a(VIP),
        port: 80,
        proto: IpProto::TCP,
    };
    let mut fe = s.frontends.get(&vip).unwrap().clone();
    fe.routes = [Route {
        endpoints: EndpointRange {
            start: other,
            len: 1,
        },
        masquerade: false,
        when_empty: EmptyAction::Reject,
    }; 3];
    s.frontends.insert(vip, fe);
    h.snap = Arc::new(s);
    for _ in 0..5 {
        let (v, out) = h.one(tcp(POD, 40000, VIP, 80, false, true));
        assert_eq!(v.reason, Reason::Established);
        assert_eq!(
            meta(&out).dst,
            backend,
            "the tracked connection keeps its backend"
        );
    }
    // A new connection goes to the remaining endpoint.
    let (v, out) = h.one(tcp(POD, 40001, VIP, 80, true, false));
    assert_eq!(v.reason, Reason::ServiceDnat);
    assert_ne!(meta(&out).dst, backend);
}

// ---- the established fast lane --------------------------------------------------------------

const VIP6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0x96, 0, 0, 0, 0, 0, 0, 0, 0x41];
const POD6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0x01, 0x01];
const EP6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0x02, 0x01];

/// `snapshot` plus a UDP Service (VIP:5353 → both endpoints) and an IPv6 TCP Service
/// (VIP6:80 → EP6:8080).
fn lane_snapshot(masq_external: bool) -> Snapshot {
    let mut s = snapshot(masq_external, 0);
    let key = |addr, port, proto| FrontendKey { addr, port, proto };
    let sp = |name: &str, id, proto| {
        Arc::new(ServicePortInfo {
            name: name.into(),
            id,
            proto,
            affinity_timeout_s: 0,
        })
    };
    let route = |len| Route {
        endpoints: EndpointRange { start: 0, len },
        masquerade: false,
        when_empty: EmptyAction::Reject,
    };
    let v4_eps: Arc<[Endpoint]> = vec![
        Endpoint {
            addr: a(EP1),
            port: 5353,
            local: true,
        },
        Endpoint {
            addr: a(EP2),
            port: 5353,
            local: false,
        },
    ]
    .into();
    s.insert_frontend(
        key(a(VIP), 5353, IpProto::UDP),
        Frontend {
            service_port: sp("ns1/dns", 21, IpProto::UDP),
            kind: FrontendKind::ClusterIp,
            routes: [route(2); 3],
            endpoints: v4_eps,
            source_ranges: None,
            maglev: None,
        },
    );
    let v6_eps: Arc<[Endpoint]> = vec![Endpoint {
        addr: Addr::from_v6(EP6),
        port: 8080,
        local: true,
    }]
    .into();
    s.insert_frontend(
        key(Addr::from_v6(VIP6), 80, IpProto::TCP),
        Frontend {
            service_port: sp("ns1/web6:http", 22, IpProto::TCP),
            kind: FrontendKind::ClusterIp,
            routes: [route(1); 3],
            endpoints: v6_eps,
            source_ranges: None,
            maglev: None,
        },
    );
    s.cluster_ips.insert(Addr::from_v6(VIP6));
    s.validate().unwrap();
    s
}

/// Two pipelines over the same packets, one with the established fast lane and one without:
/// every batch must give the same verdicts, the same frames and the same conntrack entries
/// (state, expiry, counters) on both.
struct Twin {
    lane: Harness,
    full: Harness,
}

impl Twin {
    fn new(snap: Snapshot) -> Twin {
        let mut full = Harness::new(snap.clone());
        full.pipe.set_fast_lane(false);
        Twin {
            lane: Harness::new(snap),
            full,
        }
    }

    fn run(&mut self, pkts: &[Vec<u8>]) -> Vec<(Verdict, Vec<u8>)> {
        let a = self.lane.run(pkts);
        let b = self.full.run(pkts);
        assert_eq!(a, b, "verdicts and frames, lane against full path");
        let entries = |h: &Harness| format!("{:?}", h.ct.connections().collect::<Vec<_>>());
        assert_eq!(
            entries(&self.lane),
            entries(&self.full),
            "conntrack entries"
        );
        assert_eq!(self.full.pipe.counters.fast_lane, 0);
        let (l, f) = (&self.lane.pipe.counters, &self.full.pipe.counters);
        assert_eq!((l.reasons, l.actions), (f.reasons, f.actions), "counters");
        a
    }

    fn one(&mut self, p: Vec<u8>) -> (Verdict, Vec<u8>) {
        self.run(&[p]).pop().unwrap()
    }

    fn advance(&mut self, ms: u64) {
        self.lane.now += ms;
        self.full.now += ms;
    }

    fn lane_packets(&self) -> u64 {
        self.lane.pipe.counters.fast_lane
    }
}

/// A TCP packet with `flags` (S, A, F, R, P) between IPv4 (4-byte) or IPv6 (16-byte) addresses.
fn tcp_any(src: &[u8], sport: u16, dst: &[u8], dport: u16, flags: &str) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2([1; 6], [2; 6]);
    let ip = match (<[u8; 4]>::try_from(src), <[u8; 4]>::try_from(dst)) {
        (Ok(s4), Ok(d4)) => eth.ipv4(s4, d4, 64),
        _ => eth.ipv6(src.try_into().unwrap(), dst.try_into().unwrap(), 64),
    };
    let mut b = ip.tcp(sport, dport, 1000, 65535);
    for f in flags.chars() {
        b = match f {
            'S' => b.syn(),
            'A' => b.ack(5000),
            'F' => b.fin(),
            'R' => b.rst(),
            'P' => b.psh(),
            _ => panic!("flag {f}"),
        };
    }
    let mut v = Vec::new();
    b.write(&mut v, &[7u8; 10]).unwrap();
    v
}

fn tcp_flags(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: &str) -> Vec<u8> {
    tcp_any(&src, sport, &dst, dport, flags)
}

/// Opens POD:40000 -> VIP:80 on both pipelines (SYN, SYN-ACK, then the ACK that moves SYN_RECV
/// to ESTABLISHED: all three the full path's) and returns the backend it got.
fn open_to_vip(t: &mut Twin) -> [u8; 4] {
    let (_, out) = t.one(tcp_flags(POD, 40000, VIP, 80, "S"));
    let be = meta(&out).dst.v4_octets();
    t.one(tcp_flags(be, 8080, POD, 40000, "SA"));
    t.one(tcp_flags(POD, 40000, VIP, 80, "A"));
    be
}

#[test]
fn fast_lane_takes_plain_tcp_and_leaves_syn_fin_rst_to_the_full_path() {
    let mut t = Twin::new(lane_snapshot(false));
    let be = open_to_vip(&mut t);
    let c = |flags| tcp_flags(POD, 40000, VIP, 80, flags);
    let r = |flags| tcp_flags(be, 8080, POD, 40000, flags);
    assert_eq!(t.lane_packets(), 0);
    for (p, reason) in [
        (c("A"), Reason::Established),
        (c("PA"), Reason::Established),
        (r("A"), Reason::ReplyUnnat),
        (r("PA"), Reason::ReplyUnnat),
    ] {
        let (v, out) = t.one(p);
        assert_eq!(v.reason, reason);
        valid(&out);
    }
    assert_eq!(t.lane_packets(), 4, "plain ACK/PSH both ways take the lane");
    // A SYN on the established connection and a FIN take the full path; plain ACKs in
    // FIN_WAIT leave the state as it is (the lane's); a RST, and anything after it, do not.
    t.one(c("S"));
    t.one(c("FA"));
    assert_eq!(t.lane_packets(), 4, "SYN, FIN: full path");
    t.one(r("A"));
    t.one(c("A"));
    assert_eq!(t.lane_packets(), 6, "plain ACKs in FIN_WAIT: lane");
    t.one(r("R"));
    let (v, _) = t.one(c("A"));
    assert_eq!(v.reason, Reason::CtInvalid);
    assert_eq!(t.lane_packets(), 6, "RST and what follows it: full path");
}

#[test]
fn fast_lane_sees_a_state_change_earlier_in_the_same_batch() {
    let mut t = Twin::new(lane_snapshot(false));
    let be = open_to_vip(&mut t);
    let c = |flags| tcp_flags(POD, 40000, VIP, 80, flags);
    let r = |flags| tcp_flags(be, 8080, POD, 40000, flags);
    // One batch: a plain ACK (lane), a FIN, ACKs whose lookup found the entry established
    // before the FIN moved it (they must see FIN_WAIT and its timeout, not the lookup's copy),
    // a RST, and an ACK that must see CLOSE.
    let out = t.run(&[c("A"), c("FA"), r("A"), c("A"), r("R"), c("PA")]);
    assert_eq!(t.lane_packets(), 3);
    assert_eq!(out[0].0.reason, Reason::Established);
    // (The full path judges "after a RST" by the lookup's copy of the state, so within the
    // RST's batch the last ACK still passes; the lane, reading the state anew, leaves it to
    // the full path, which Twin checks gives the same.)
    assert_eq!(out[5].0.reason, Reason::Established);
}

#[test]
fn fast_lane_translates_masqueraded_replies() {
    // From outside the cluster to the NodePort: masqueraded to the node's address.
    let mut t = Twin::new(lane_snapshot(true));
    let client = [203, 0, 113, 9];
    let c = |flags| tcp_flags(client, 50000, NODE, 30080, flags);
    let (v, out) = t.one(c("S"));
    assert!(v.masq);
    let m = meta(&out);
    let (be, snat_port) = (m.dst.v4_octets(), m.sport);
    assert_eq!(m.src, a(NODE));
    let r = |flags| tcp_flags(be, 8080, NODE, snat_port, flags);
    t.one(r("SA"));
    t.one(c("A"));
    let (v, out) = t.one(r("PA"));
    assert_eq!(v.reason, Reason::ReplyUnnat);
    assert!(v.masq);
    assert_eq!(v.client, a(client));
    let m = meta(&out);
    valid(&out);
    assert_eq!(
        (m.src, m.sport, m.dst, m.dport),
        (a(NODE), 30080, a(client), 50000)
    );
    let (v, _) = t.one(c("A"));
    assert_eq!(v.reason, Reason::Established);
    assert_eq!(t.lane_packets(), 2);
}

#[test]
fn fast_lane_takes_assured_udp_streams_only() {
    let mut t = Twin::new(lane_snapshot(false));
    let q = || udp(POD, 41000, VIP, 5353);
    let (v, out) = t.one(q());
    assert_eq!(v.reason, Reason::ServiceDnat);
    let be = meta(&out).dst.v4_octets();
    let r = || udp(be, 5353, POD, 41000);
    t.one(r());
    t.one(q());
    assert_eq!(t.lane_packets(), 0, "answered, not yet a stream");
    t.advance(2_500);
    t.one(q()); // becomes a stream (assured) on this packet: full path
    assert_eq!(t.lane_packets(), 0);
    let (v, out) = t.one(r());
    assert_eq!(v.reason, Reason::ReplyUnnat);
    valid(&out);
    let (v, out) = t.one(q());
    assert_eq!(v.reason, Reason::Established);
    valid(&out);
    assert_eq!(t.lane_packets(), 2);
    // A zero IPv4 UDP checksum stays zero on the lane, as on the full path.
    let mut z = q();
    let l4 = meta(&z).l4_off as usize;
    z[l4 + 6..l4 + 8].copy_from_slice(&[0, 0]);
    let (_, out) = t.one(z);
    assert_eq!(&out[l4 + 6..l4 + 8], &[0, 0]);
    assert_eq!(t.lane_packets(), 3);
}

#[test]
fn fast_lane_ipv6() {
    let mut t = Twin::new(lane_snapshot(false));
    let p6 = |src: [u8; 16], sport, dst: [u8; 16], dport, flags: &str| {
        tcp_any(&src, sport, &dst, dport, flags)
    };
    let (v, out) = t.one(p6(POD6, 40000, VIP6, 80, "S"));
    assert_eq!(v.reason, Reason::ServiceDnat);
    assert_eq!(meta(&out).dst, Addr::from_v6(EP6));
    t.one(p6(EP6, 8080, POD6, 40000, "SA"));
    t.one(p6(POD6, 40000, VIP6, 80, "A"));
    let (v, out) = t.one(p6(POD6, 40000, VIP6, 80, "PA"));
    assert_eq!(v.reason, Reason::Established);
    valid(&out);
    assert_eq!(meta(&out).dst, Addr::from_v6(EP6));
    let (v, out) = t.one(p6(EP6, 8080, POD6, 40000, "A"));
    assert_eq!(v.reason, Reason::ReplyUnnat);
    valid(&out);
    let m = meta(&out);
    assert_eq!((m.src, m.sport), (Addr::from_v6(VIP6), 80));
    assert_eq!(t.lane_packets(), 2);
}

/// A new connection's NAT is written by the fast lane's word rewrite for whole IPv4 TCP and UDP
/// packets (`rewrite_into`): the frame must be the general `kxdp_packet::rewrite`'s to the
/// verdict's addresses, byte for byte, and the verdict's addresses the rewritten packet's.
/// Covers a pod client (destination only), an external one (masqueraded: both addresses), UDP
/// with and without a checksum, and IPv6 (the general rewrite itself).
#[test]
fn new_connections_are_rewritten_as_the_general_rewrite_does() {
    const EXTERNAL: [u8; 4] = [203, 0, 113, 7];
    let mut h = Harness::new(lane_snapshot(true));
    let mut udp_no_checksum = udp(EXTERNAL, 41001, VIP, 5353);
    let l4 = meta(&udp_no_checksum).l4_off as usize;
    udp_no_checksum[l4 + 6..l4 + 8].copy_from_slice(&[0, 0]);
    let pkts = vec![
        tcp_flags(POD, 40000, VIP, 80, "S"),
        tcp_flags(EXTERNAL, 40001, VIP, 80, "S"),
        tcp_flags(EXTERNAL, 40002, VIP, 80, "S"),
        udp(POD, 41000, VIP, 5353),
        udp(EXTERNAL, 41000, VIP, 5353),
        udp_no_checksum,
        tcp_any(&POD6, 40003, &VIP6, 80, "S"),
    ];
    let out = h.run(&pkts);
    for (p, (v, frame)) in pkts.iter().zip(&out) {
        assert_eq!(v.reason, Reason::ServiceDnat, "{v:?}");
        let mut expected = p.clone();
        let mut m = meta(p);
        kxdp_packet::rewrite(&mut expected, &mut m, v.src, v.sport, v.dst, v.dport);
        assert_eq!(frame, &expected, "{v:?}");
        let got = meta(frame);
        assert_eq!(
            (got.src, got.sport, got.dst, got.dport),
            (v.src, v.sport, v.dst, v.dport)
        );
        valid(frame);
    }
    // The external TCP clients were masqueraded (the UDP Service's routes do not), the pod
    // was not.
    assert_eq!(out[0].0.src, a(POD));
    assert_eq!(out[1].0.src, a(NODE));
    assert_eq!(out[4].0.src, a(EXTERNAL));
    // The zero UDP checksum stayed zero.
    let l4 = meta(&out[5].1).l4_off as usize;
    assert_eq!(out[5].1[l4 + 6..l4 + 8], [0, 0]);
}
