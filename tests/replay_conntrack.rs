//! Acceptance: connection tracking through `kxdp replay` (TCP handshake and teardown, flows keep
//! their backend, UDP request/response, ICMP to a ClusterIP, timeouts by capture time, table
//! limits) and session affinity.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use serde_json::json;
use support::*;

const VIP: &str = "172.30.4.10:80";

fn web_env(eps: &[(&str, &str)]) -> Env {
    let mut env = Env::new();
    env.add_all(simple_service("web", "172.30.4.10", 80, 8080, eps));
    env
}

/// Replays a full TCP connection pod → ClusterIP, each packet built from how the previous one
/// left (the backend answers the rewritten packets). `gap_ns` apart.
fn tcp_conversation(env: &Env, gap_ns: u64) {
    let client = "10.1.0.50:41000";
    let mut pkts = vec![tcp(client, VIP, flags::SYN, 1000, 0, b"")];
    // Learn the backend chosen (deterministic with --seed).
    let r = env.replay_at(&spaced(&pkts, gap_ns));
    r.expect(0, "forward", "service-dnat");
    let to_backend = r.out(0);
    let backend = to_backend.dst_sock();
    assert!(["10.2.0.10:8080", "10.3.0.10:8080"].contains(&backend.to_string().as_str()));
    let b = backend.to_string();
    pkts.push(tcp(&b, client, flags::SYN | flags::ACK, 5000, 1001, b""));
    pkts.push(tcp(client, VIP, flags::ACK, 1001, 5001, b""));
    pkts.push(tcp(
        client,
        VIP,
        flags::ACK | flags::PSH,
        1001,
        5001,
        b"GET / HTTP/1.1\r\n\r\n",
    ));
    pkts.push(tcp(
        &b,
        client,
        flags::ACK | flags::PSH,
        5001,
        1019,
        b"HTTP/1.1 200 OK\r\n\r\n",
    ));
    pkts.push(tcp(client, VIP, flags::FIN | flags::ACK, 1019, 5020, b""));
    pkts.push(tcp(&b, client, flags::FIN | flags::ACK, 5020, 1020, b""));
    pkts.push(tcp(client, VIP, flags::ACK, 1020, 5021, b""));
    let r = env.replay_at(&spaced(&pkts, gap_ns));
    let want = [
        "service-dnat",
        "reply-unnat",
        "ct-established",
        "ct-established",
        "reply-unnat",
        "ct-established",
        "reply-unnat",
        "ct-established",
    ];
    assert_eq!(r.reasons(), want, "verdicts: {:#?}", r.verdicts);
    for (i, p) in pkts.iter().enumerate() {
        let o = r.out(i);
        let input = decode(p, env.link);
        let t_in = input.tcp.as_ref().unwrap();
        let t_out = o.tcp.as_ref().unwrap();
        assert_eq!(
            (
                t_out.sequence_number,
                t_out.acknowledgment_number,
                t_out.syn,
                t_out.fin,
                t_out.ack
            ),
            (
                t_in.sequence_number,
                t_in.acknowledgment_number,
                t_in.syn,
                t_in.fin,
                t_in.ack
            ),
            "packet {i}: TCP header other than ports unchanged"
        );
        assert_eq!(o.payload, input.payload, "packet {i}: payload unchanged");
        if want[i] == "reply-unnat" {
            assert_eq!(o.src_sock(), sa(VIP), "packet {i}: reply from the VIP");
            assert_eq!(o.dst_sock(), sa(client));
        } else {
            assert_eq!(o.src_sock(), sa(client), "packet {i}");
            assert_eq!(
                o.dst_sock(),
                backend,
                "packet {i}: same backend for the whole flow"
            );
        }
    }
}

#[test]
fn tcp_handshake_data_and_teardown() {
    let env = web_env(&[("10.2.0.10", NODE_B), ("10.3.0.10", NODE_C)]);
    tcp_conversation(&env, DEFAULT_GAP_NS);
}

/// The same conversation with a realistic LAN round trip (40 µs between packets): the whole
/// connection falls into one replay batch. Verdicts must not depend on how packets are batched.
#[test]
fn tcp_handshake_back_to_back_in_one_batch() {
    let env = web_env(&[("10.2.0.10", NODE_B), ("10.3.0.10", NODE_C)]);
    tcp_conversation(&env, 40_000);
}

#[test]
fn established_flows_keep_their_backend() {
    let env = web_env(&[
        ("10.2.0.10", NODE_B),
        ("10.2.0.11", NODE_B),
        ("10.3.0.10", NODE_C),
        ("10.3.0.11", NODE_C),
        ("10.1.0.10", NODE_A),
    ]);
    // 20 flows: SYN each, then 5 rounds of one data segment per flow, interleaved.
    let mut pkts = Vec::new();
    for f in 0..20u16 {
        pkts.push(syn(&format!("10.1.0.50:{}", 42000 + f), VIP));
    }
    for round in 0..5u32 {
        for f in 0..20u16 {
            pkts.push(tcp(
                &format!("10.1.0.50:{}", 42000 + f),
                VIP,
                flags::ACK | flags::PSH,
                1001 + round * 10,
                1,
                b"0123456789",
            ));
        }
    }
    let r = env.replay(&pkts);
    let mut backend_of: BTreeMap<u16, SocketAddr> = BTreeMap::new();
    for f in 0..20usize {
        r.expect(f, "forward", "service-dnat");
        backend_of.insert(f as u16, vsock(r.v(f), "dst"));
    }
    let used: BTreeSet<_> = backend_of.values().collect();
    assert!(
        used.len() > 1,
        "20 flows over 5 endpoints all on one? {backend_of:?}"
    );
    for i in 20..pkts.len() {
        let f = ((i - 20) % 20) as u16;
        r.expect(i, "forward", "ct-established");
        assert_eq!(
            vsock(r.v(i), "dst"),
            backend_of[&f],
            "packet {i} of flow {f}"
        );
        assert_eq!(r.out(i).dst_sock(), backend_of[&f]);
    }
}

fn dns_env() -> Env {
    let mut env = Env::new();
    env.add(service(
        "dns",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.4.53",
            "clusterIPs": ["172.30.4.53"],
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
        }),
    ))
    .add(endpoint_slice(
        "dns",
        "dns-1",
        "IPv4",
        json!([sport("dns", 5353, "UDP")]),
        vec![
            endpoint("10.2.0.53", NODE_B),
            endpoint("10.3.0.53", NODE_C),
            endpoint("10.3.0.54", NODE_C),
        ],
    ));
    env
}

#[test]
fn udp_request_response() {
    let env = dns_env();
    let q = udp("10.1.0.50:33000", "172.30.4.53:53", b"query-1");
    let r = env.replay(std::slice::from_ref(&q));
    let o = r.out(0);
    let backend = o.dst_sock();
    let r = env.replay(&[
        q,
        udp_reply_to(&o, b"answer-1"),
        udp("10.1.0.50:33000", "172.30.4.53:53", b"query-2"),
    ]);
    r.expect(0, "forward", "service-dnat");
    let v = r.expect(1, "forward", "reply-unnat");
    assert_eq!(v["src"], "172.30.4.53:53");
    assert_eq!(v["dst"], "10.1.0.50:33000");
    let back = r.out(1);
    assert_eq!(back.src_sock(), sa("172.30.4.53:53"));
    assert_eq!(back.dst_sock(), sa("10.1.0.50:33000"));
    assert_eq!(back.payload, b"answer-1");
    r.expect(2, "forward", "ct-established");
    assert_eq!(r.out(2).dst_sock(), backend);
}

/// Five datagrams of one new UDP flow 10 µs apart (one replay batch, as one RX burst would be):
/// the first creates the connection, the others follow it to the same backend.
#[test]
fn udp_burst_of_one_new_flow_in_one_batch() {
    let env = dns_env();
    let frames: Vec<_> = (0..5)
        .map(|i| {
            udp(
                "10.1.0.50:33001",
                "172.30.4.53:53",
                format!("datagram-{i}").as_bytes(),
            )
        })
        .collect();
    let r = env.replay_at(&spaced(&frames, 10_000));
    let got: Vec<(String, String)> = r
        .verdicts
        .iter()
        .map(|v| {
            (
                v["reason"].as_str().unwrap().to_string(),
                v["dst"].to_string(),
            )
        })
        .collect();
    let first_dst = r.v(0)["dst"].to_string();
    let mut want = vec![("service-dnat".to_string(), first_dst.clone())];
    want.extend((1..5).map(|_| ("ct-established".to_string(), first_dst.clone())));
    assert_eq!(got, want, "one flow, one backend: {:#?}", r.verdicts);
    for i in 0..5 {
        assert_eq!(r.out(i).dst_sock().to_string(), first_dst.trim_matches('"'));
    }
}

#[test]
fn icmp_echo_to_clusterip_is_rejected() {
    let env = web_env(&[("10.2.0.10", NODE_B)]);
    let ping = icmp_echo("10.1.0.50", "172.30.4.10", 0x4242, 1);
    let r = env.replay(std::slice::from_ref(&ping));
    let v = r.expect(0, "reject", "service-port-unknown");
    assert_eq!(v["proto"], "ICMP");
    let o = r.out(0);
    assert_eq!(o.icmp, Some((3, 3)));
    assert_eq!(o.src, ip("172.30.4.10"));
    assert_eq!(o.dst, ip(POD_CLIENT));
    assert_eq!(&o.payload[..], ip_part(&ping));
}

#[test]
fn udp_timeouts_follow_capture_time() {
    let env = dns_env();
    // Learn where each flow goes.
    let qa = udp("10.1.0.50:34000", "172.30.4.53:53", b"a");
    let qb = udp("10.1.0.50:34001", "172.30.4.53:53", b"b");
    let qc = udp("10.1.0.50:34002", "172.30.4.53:53", b"c");
    let r = env.replay_at(&[
        (T0_NS, qa.clone()),
        (T0_NS + 200_000_000, qb.clone()),
        (T0_NS + 400_000_000, qc.clone()),
    ]);
    let (oa, ob) = (r.out(0), r.out(1));
    let s = 1_000_000_000u64;
    let r = env.replay_at(&[
        (T0_NS, qa),
        (T0_NS + 200_000_000, qb),
        (T0_NS + 400_000_000, qc.clone()),
        // Flow a: answered after 29 s of silence, within udpTimeout (30 s).
        (T0_NS + 29 * s, udp_reply_to(&oa, b"late but in time")),
        // Flow b: answered after 31 s: the unreplied entry expired; the reply is just routed.
        (T0_NS + 200_000_000 + 31 * s, udp_reply_to(&ob, b"too late")),
        // Flow c: a new request after 31 s is a new connection.
        (T0_NS + 400_000_000 + 31 * s, qc),
    ]);
    r.expect(3, "forward", "reply-unnat");
    assert_eq!(r.out(3).src_sock(), sa("172.30.4.53:53"));
    let v = r.expect(4, "forward", "direct");
    assert_eq!(vsock(v, "src"), ob.dst_sock(), "not reverse-NATed: {v}");
    assert_eq!(r.out(4).src_sock(), ob.dst_sock());
    r.expect(5, "forward", "service-dnat");
}

/// `conntrack.maxEntries: 16`, 40 SYNs of distinct connections: the table fills with unassured
/// (SYN_SENT) entries, and early drop evicts unassured entries to make room, so every SYN is
/// translated (no `conntrack-full`).
#[test]
fn conntrack_limit_with_unassured_entries_early_drops() {
    let mut env = web_env(&[("10.2.0.10", NODE_B), ("10.3.0.10", NODE_C)]);
    env.config_extra("conntrack: {maxEntries: 16}");
    let pkts: Vec<_> = (0..40u16)
        .map(|i| syn(&format!("10.1.0.50:{}", 43000 + i), VIP))
        .collect();
    let r = env.replay(&pkts);
    for i in 0..40 {
        r.expect(i, "forward", "service-dnat");
    }
}

/// `conntrack.maxEntries: 16` filled with 16 assured (established) connections: nothing can be
/// dropped early, so further new connections are dropped with `conntrack-full`, while packets of
/// the tracked connections still pass.
#[test]
fn conntrack_full_when_all_entries_assured() {
    let mut env = web_env(&[("10.2.0.10", NODE_B)]);
    env.config_extra("conntrack: {maxEntries: 16}");
    let backend = "10.2.0.10:8080";
    let mut pkts = Vec::new();
    for i in 0..16u16 {
        let c = format!("10.1.0.50:{}", 44000 + i);
        pkts.push(syn(&c, VIP));
        pkts.push(tcp(backend, &c, flags::SYN | flags::ACK, 5000, 1001, b""));
        pkts.push(tcp(&c, VIP, flags::ACK, 1001, 5001, b""));
    }
    for i in 0..10u16 {
        pkts.push(syn(&format!("10.1.0.51:{}", 45000 + i), VIP));
    }
    pkts.push(tcp(
        "10.1.0.50:44000",
        VIP,
        flags::ACK | flags::PSH,
        1001,
        5001,
        b"still here",
    ));
    let r = env.replay(&pkts);
    for i in 0..16 {
        r.expect(3 * i, "forward", "service-dnat");
        r.expect(3 * i + 1, "forward", "reply-unnat");
        r.expect(3 * i + 2, "forward", "ct-established");
    }
    for i in 48..58 {
        r.expect(i, "drop", "conntrack-full");
        assert!(r.by_index[i].is_none());
    }
    r.expect(58, "forward", "ct-established");
}

// ---- session affinity ---------------------------------------------------------------------------

fn affinity_env(timeout: u32) -> Env {
    let mut env = Env::new();
    env.add(service(
        "sticky",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.4.20",
            "clusterIPs": ["172.30.4.20"],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(endpoint_slice(
        "sticky",
        "sticky-1",
        "IPv4",
        json!([sport("http", 8080, "TCP")]),
        vec![
            endpoint("10.2.0.20", NODE_B),
            endpoint("10.2.0.21", NODE_B),
            endpoint("10.3.0.20", NODE_C),
            endpoint("10.3.0.21", NODE_C),
        ],
    ));
    env
}

const STICKY_EPS: [&str; 4] = [
    "10.2.0.20:8080",
    "10.2.0.21:8080",
    "10.3.0.20:8080",
    "10.3.0.21:8080",
];

#[test]
fn session_affinity_client_ip_pins_a_client() {
    let env = affinity_env(10800);
    let mut pkts = Vec::new();
    for i in 0..50u16 {
        pkts.push(syn(&format!("10.1.0.50:{}", 46000 + i), "172.30.4.20:80"));
    }
    // Eight other clients, five connections each, interleaved.
    for i in 0..5u16 {
        for c in 0..8u16 {
            pkts.push(syn(
                &format!("10.1.0.{}:{}", 60 + c, 47000 + i),
                "172.30.4.20:80",
            ));
        }
    }
    let r = env.replay(&pkts);
    let h = dst_histogram(&r.verdicts[..50]);
    assert_eq!(
        h.len(),
        1,
        "50 connections of one client on one endpoint: {h:?}"
    );
    assert!(STICKY_EPS.contains(&h.keys().next().unwrap().to_string().as_str()));
    let mut per_client: BTreeMap<u16, BTreeSet<SocketAddr>> = BTreeMap::new();
    for (k, v) in r.verdicts[50..].iter().enumerate() {
        assert_eq!(v["reason"], "service-dnat", "{v}");
        per_client
            .entry(k as u16 % 8)
            .or_default()
            .insert(vsock(v, "dst"));
    }
    let mut all = BTreeSet::new();
    for (c, eps) in &per_client {
        assert_eq!(eps.len(), 1, "client {c} moved between endpoints: {eps:?}");
        all.extend(eps.iter().copied());
    }
    for e in &all {
        assert!(STICKY_EPS.contains(&e.to_string().as_str()), "{e}");
    }
    // Clients are spread (with --seed 1, 8 clients over 4 endpoints use more than one).
    assert!(
        all.len() > 1,
        "every client on one endpoint: {per_client:?}"
    );
}

#[test]
fn session_affinity_timeout_by_capture_time() {
    let env = affinity_env(10);
    let s = 1_000_000_000u64;
    let pkts = vec![
        (T0_NS, syn("10.1.0.50:48000", "172.30.4.20:80")),
        (T0_NS + 5 * s, syn("10.1.0.50:48001", "172.30.4.20:80")),
        // 11 s after the last use (16 s after the first): the 10 s record expired.
        (T0_NS + 16 * s, syn("10.1.0.50:48002", "172.30.4.20:80")),
        (
            T0_NS + 16 * s + 1_000_000,
            syn("10.1.0.50:48003", "172.30.4.20:80"),
        ),
    ];
    let r = env.replay_at(&pkts);
    for i in 0..4 {
        r.expect(i, "forward", "service-dnat");
        let d = vsock(r.v(i), "dst").to_string();
        assert!(STICKY_EPS.contains(&d.as_str()), "packet {i} to {d}");
    }
    assert_eq!(
        vsock(r.v(1), "dst"),
        vsock(r.v(0), "dst"),
        "within the timeout: same endpoint"
    );
    // After expiry the client may be re-picked anywhere eligible, and is then pinned again.
    assert_eq!(vsock(r.v(3), "dst"), vsock(r.v(2), "dst"));
}
