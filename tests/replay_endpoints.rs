//! Acceptance: which endpoints a new connection may use (conditions, traffic policies, topology)
//! and what happens when none is eligible (reject, drop, source ranges).

mod support;

use kxdp_packet::IpProto;
use serde_json::{json, Value};
use support::*;

fn svc(name: &str, cluster_ip: &str, extra: Value) -> Value {
    let mut spec = json!({
        "type": "ClusterIP",
        "clusterIP": cluster_ip,
        "clusterIPs": [cluster_ip],
        "ipFamilies": ["IPv4"],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    service(name, spec)
}

fn slice(name: &str, eps: Vec<Value>) -> Value {
    endpoint_slice(
        name,
        &format!("{name}-x1"),
        "IPv4",
        json!([sport("http", 8080, "TCP")]),
        eps,
    )
}

/// `n` SYNs from `src_ip` (distinct source ports) to `dst`.
fn syns(src_ip: &str, dst: &str, n: u16) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| syn(&sock(src_ip, 20000 + i).to_string(), dst))
        .collect()
}

#[test]
fn only_ready_endpoints_are_used() {
    let mut env = Env::new();
    env.add(svc("ready", "172.30.1.1", json!({}))).add(slice(
        "ready",
        vec![
            endpoint("10.2.0.1", NODE_B),
            ep_cond("10.2.0.2", NODE_B, Some(false), Some(false), Some(false)),
            ep_cond("10.3.0.3", NODE_C, Some(false), Some(true), Some(true)),
            // Conditions omitted: ready (nil means ready).
            json!({"addresses": ["10.3.0.4"], "conditions": {}, "nodeName": NODE_C}),
        ],
    ));
    let r = env.replay(&syns(POD_CLIENT, "172.30.1.1:80", 300));
    assert_spread(
        &dst_histogram(&r.verdicts),
        &["10.2.0.1:8080", "10.3.0.4:8080"],
    );
}

#[test]
fn none_ready_falls_back_to_serving_terminating_never_non_serving() {
    let mut env = Env::new();
    env.add(svc("term", "172.30.1.2", json!({}))).add(slice(
        "term",
        vec![
            ep_cond("10.2.0.11", NODE_B, Some(false), Some(true), Some(true)),
            ep_cond("10.3.0.11", NODE_C, Some(false), Some(true), Some(true)),
            ep_cond("10.2.0.12", NODE_B, Some(false), Some(false), Some(true)),
            ep_cond("10.2.0.13", NODE_B, Some(false), Some(false), Some(false)),
        ],
    ));
    env.add(svc("dead", "172.30.1.3", json!({}))).add(slice(
        "dead",
        vec![
            ep_cond("10.2.0.14", NODE_B, Some(false), Some(false), Some(true)),
            ep_cond("10.2.0.15", NODE_B, Some(false), Some(false), Some(false)),
        ],
    ));
    let mut pkts = syns(POD_CLIENT, "172.30.1.2:80", 300);
    pkts.push(syn("10.1.0.50:45000", "172.30.1.3:80"));
    let r = env.replay(&pkts);
    assert_spread(
        &dst_histogram(&r.verdicts[..300]),
        &["10.2.0.11:8080", "10.3.0.11:8080"],
    );
    r.expect(300, "reject", "no-endpoints");
}

#[test]
fn internal_traffic_policy_local() {
    let mut env = Env::new();
    env.add(svc(
        "itp",
        "172.30.1.10",
        json!({"internalTrafficPolicy": "Local"}),
    ))
    .add(slice(
        "itp",
        vec![
            endpoint("10.1.0.21", NODE_A),
            endpoint("10.1.0.22", NODE_A),
            endpoint("10.2.0.21", NODE_B),
        ],
    ));
    env.add(svc(
        "itpremote",
        "172.30.1.11",
        json!({"internalTrafficPolicy": "Local"}),
    ))
    .add(slice("itpremote", vec![endpoint("10.2.0.23", NODE_B)]));
    let mut pkts = syns(POD_CLIENT, "172.30.1.10:80", 300);
    pkts.push(syn("10.1.0.50:45000", "172.30.1.11:80"));
    pkts.push(udp("10.1.0.50:45001", "172.30.1.11:80", b"x"));
    let r = env.replay(&pkts);
    assert_spread(
        &dst_histogram(&r.verdicts[..300]),
        &["10.1.0.21:8080", "10.1.0.22:8080"],
    );
    // Endpoints exist elsewhere, none here: dropped, not rejected (kube-proxy: no local endpoints).
    r.expect(300, "drop", "no-local-endpoints");
    assert!(r.by_index[300].is_none(), "a drop sends nothing");
    // (The UDP packet is to a port the service does not define for UDP.)
    r.expect(301, "reject", "service-port-unknown");
}

fn etp_local_nodeport() -> Vec<Value> {
    vec![
        service(
            "etp",
            json!({
                "type": "NodePort",
                "clusterIP": "172.30.1.20",
                "clusterIPs": ["172.30.1.20"],
                "externalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30120}]
            }),
        ),
        slice(
            "etp",
            vec![endpoint("10.1.0.31", NODE_A), endpoint("10.2.0.31", NODE_B)],
        ),
    ]
}

#[test]
fn external_traffic_policy_local_from_external_client() {
    let mut env = Env::new();
    env.add_all(etp_local_nodeport());
    let r = env.replay(&syns(EXTERNAL, "192.168.0.2:30120", 100));
    assert_spread(&dst_histogram(&r.verdicts), &["10.1.0.31:8080"]);
    for (i, v) in r.verdicts.iter().enumerate() {
        assert!(!masq(v), "eTP Local keeps the client address: {v}");
        assert_eq!(vip(v, "src"), ip(EXTERNAL));
        let o = r.out(i);
        assert_eq!(o.src_sock(), sock(EXTERNAL, 20000 + i as u16));
        assert_eq!(o.dst_sock(), sa("10.1.0.31:8080"));
    }
}

#[test]
fn external_traffic_policy_local_from_pod_uses_all_endpoints_unmasqueraded() {
    let mut env = Env::new();
    env.add_all(etp_local_nodeport());
    let r = env.replay(&syns(POD_CLIENT, "192.168.0.2:30120", 100));
    assert_spread(
        &dst_histogram(&r.verdicts),
        &["10.1.0.31:8080", "10.2.0.31:8080"],
    );
    for v in &r.verdicts {
        assert!(!masq(v), "{v}");
        assert_eq!(vip(v, "src"), ip(POD_CLIENT));
    }
}

#[test]
fn external_traffic_policy_local_from_node_uses_all_endpoints_masqueraded() {
    let mut env = Env::new();
    env.add_all(etp_local_nodeport());
    let r = env.replay(&syns(NODE_A_IP, "192.168.0.2:30120", 100));
    assert_spread(
        &dst_histogram(&r.verdicts),
        &["10.1.0.31:8080", "10.2.0.31:8080"],
    );
    for (i, v) in r.verdicts.iter().enumerate() {
        assert!(masq(v), "node-originated traffic is masqueraded: {v}");
        assert_eq!(vip(v, "src"), ip(NODE_A_IP));
        assert_eq!(r.out(i).src, ip(NODE_A_IP));
    }
}

#[test]
fn external_traffic_policy_local_without_local_endpoint_drops_external() {
    let mut env = Env::new();
    env.add(service(
        "etpremote",
        json!({
            "type": "NodePort",
            "clusterIP": "172.30.1.21",
            "clusterIPs": ["172.30.1.21"],
            "externalTrafficPolicy": "Local",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30121}]
        }),
    ))
    .add(slice("etpremote", vec![endpoint("10.2.0.32", NODE_B)]));
    let r = env.replay(&[
        syn("203.0.113.7:40000", "192.168.0.2:30121"),
        syn("10.1.0.50:40000", "172.30.1.21:80"),
    ]);
    r.expect(0, "drop", "no-local-endpoints");
    // The ClusterIP is not subject to externalTrafficPolicy.
    let v = r.expect(1, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.32:8080");
}

#[test]
fn prefer_close_uses_same_zone_endpoints() {
    let mut env = Env::new();
    env.add(svc(
        "close",
        "172.30.1.30",
        json!({"trafficDistribution": "PreferClose"}),
    ))
    .add(slice(
        "close",
        vec![
            ep_zone_hints("10.1.0.41", NODE_A, &["zone-a"]),
            ep_zone_hints("10.3.0.41", NODE_C, &["zone-a"]),
            ep_zone_hints("10.2.0.41", NODE_B, &["zone-b"]),
        ],
    ));
    let r = env.replay(&syns(POD_CLIENT, "172.30.1.30:80", 300));
    assert_spread(
        &dst_histogram(&r.verdicts),
        &["10.1.0.41:8080", "10.3.0.41:8080"],
    );
}

#[test]
fn zone_hints_ignored_when_one_endpoint_lacks_them() {
    let mut env = Env::new();
    env.add(svc(
        "partial",
        "172.30.1.31",
        json!({"trafficDistribution": "PreferClose"}),
    ))
    .add(slice(
        "partial",
        vec![
            ep_zone_hints("10.1.0.42", NODE_A, &["zone-a"]),
            ep_zone_hints("10.2.0.42", NODE_B, &["zone-b"]),
            endpoint("10.2.0.43", NODE_B),
        ],
    ));
    let r = env.replay(&syns(POD_CLIENT, "172.30.1.31:80", 300));
    assert_spread(
        &dst_histogram(&r.verdicts),
        &["10.1.0.42:8080", "10.2.0.42:8080", "10.2.0.43:8080"],
    );
}

#[test]
fn prefer_same_node_uses_node_hints() {
    let mut env = Env::new();
    env.add(svc(
        "samenode",
        "172.30.1.32",
        json!({"trafficDistribution": "PreferSameNode"}),
    ))
    .add(slice(
        "samenode",
        vec![
            ep_node_hints("10.1.0.51", NODE_A, &[NODE_A]),
            ep_node_hints("10.3.0.51", NODE_C, &[NODE_C]),
            ep_node_hints("10.2.0.51", NODE_B, &[NODE_B]),
        ],
    ));
    let r = env.replay(&syns(POD_CLIENT, "172.30.1.32:80", 100));
    assert_spread(&dst_histogram(&r.verdicts), &["10.1.0.51:8080"]);
}

#[test]
fn topology_mode_auto_annotation() {
    let mut env = Env::new();
    env.add(service_with(
        "auto",
        json!({"service.kubernetes.io/topology-mode": "Auto"}),
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.1.33",
            "clusterIPs": ["172.30.1.33"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(slice(
        "auto",
        vec![
            ep_zone_hints("10.1.0.61", NODE_A, &["zone-a"]),
            ep_zone_hints("10.2.0.61", NODE_B, &["zone-b"]),
            ep_zone_hints("10.2.0.62", NODE_B, &["zone-b"]),
        ],
    ));
    let r = env.replay(&syns(POD_CLIENT, "172.30.1.33:80", 100));
    assert_spread(&dst_histogram(&r.verdicts), &["10.1.0.61:8080"]);
}

// ---- nothing eligible ----------------------------------------------------------------------

fn empty_services(env: &mut Env) {
    env.add(svc("empty", "172.30.2.1", json!({})))
        .add(slice("empty", vec![]));
    env.add(service(
        "empty6",
        json!({
            "type": "ClusterIP",
            "clusterIP": "fd00:172:30::201",
            "clusterIPs": ["fd00:172:30::201"],
            "ipFamilies": ["IPv6"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
        }),
    ));
    env.add(service(
        "emptyudp",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.2.2",
            "clusterIPs": ["172.30.2.2"],
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
        }),
    ));
}

#[test]
fn no_endpoints_tcp_syn_rejected_with_rst() {
    let mut env = Env::new();
    empty_services(&mut env);
    let input = tcp("10.1.0.50:40000", "172.30.2.1:80", flags::SYN, 1000, 0, b"");
    let r = env.replay(&[input]);
    let v = r.expect(0, "reject", "no-endpoints");
    assert_eq!(
        v["reply"]["src"], "172.30.2.1:80",
        "a reject line carries the reply: {v}"
    );
    assert_eq!(v["reply"]["dst"], "10.1.0.50:40000", "{v}");
    let o = r.out(0);
    assert_eq!(o.src_sock(), sa("172.30.2.1:80"));
    assert_eq!(o.dst_sock(), sa("10.1.0.50:40000"));
    assert_eq!(o.src_mac, NODE_MAC);
    assert_eq!(o.dst_mac, CLIENT_MAC);
    let t = o.tcp.clone().expect("TCP");
    assert!(
        t.rst && t.ack,
        "RST+ACK answers a segment without ACK: {t:?}"
    );
    assert_eq!(t.sequence_number, 0);
    assert_eq!(t.acknowledgment_number, 1001, "ack = seq + 1 (SYN)");
    assert!(!t.syn && !t.fin);
    assert!(o.payload.is_empty());
}

#[test]
fn no_endpoints_tcp_data_segment_rejected_with_rst_seq_from_ack() {
    let mut env = Env::new();
    empty_services(&mut env);
    let input = tcp(
        "10.1.0.50:40001",
        "172.30.2.1:80",
        flags::ACK | flags::PSH,
        5000,
        7000,
        b"GET / HTTP/1.1\r\n",
    );
    let r = env.replay(&[input]);
    r.expect(0, "reject", "no-endpoints");
    let o = r.out(0);
    let t = o.tcp.clone().expect("TCP");
    assert!(
        t.rst && !t.ack,
        "RST without ACK answers a segment with ACK: {t:?}"
    );
    assert_eq!(t.sequence_number, 7000, "seq = the segment's ack");
    assert_eq!(o.src_sock(), sa("172.30.2.1:80"));
    assert_eq!(o.dst_sock(), sa("10.1.0.50:40001"));
}

#[test]
fn no_endpoints_udp_rejected_with_icmp_port_unreachable() {
    let mut env = Env::new();
    empty_services(&mut env);
    let input = udp("10.1.0.50:40002", "172.30.2.2:53", b"dns query bytes");
    let r = env.replay(std::slice::from_ref(&input));
    let v = r.expect(0, "reject", "no-endpoints");
    assert_eq!(v["reply"]["src"], "172.30.2.2", "{v}");
    assert_eq!(v["reply"]["dst"], "10.1.0.50", "{v}");
    let o = r.out(0);
    assert_eq!(o.proto, IpProto::ICMP);
    assert_eq!(
        o.icmp,
        Some((3, 3)),
        "destination unreachable / port unreachable"
    );
    assert_eq!(o.src, ip("172.30.2.2"));
    assert_eq!(o.dst, ip(POD_CLIENT));
    assert_eq!(o.dst_mac, CLIENT_MAC);
    // The quote: the offending IP packet as it arrived.
    let orig = ip_part(&input);
    assert!(
        o.payload.len() >= 28,
        "quotes at least the IP header + 8 bytes"
    );
    let n = o.payload.len().min(orig.len());
    assert_eq!(&o.payload[..n], &orig[..n]);
    assert_eq!(n, orig.len(), "a short packet is quoted whole");
}

#[test]
fn no_endpoints_udp_over_ipv6_rejected_with_icmpv6_port_unreachable() {
    let mut env = Env::new();
    empty_services(&mut env);
    let input = udp(
        "[fd00:10:1::50]:40003",
        "[fd00:172:30::201]:53",
        b"dns query bytes",
    );
    let r = env.replay(std::slice::from_ref(&input));
    r.expect(0, "reject", "no-endpoints");
    let o = r.out(0);
    assert_eq!(o.proto, IpProto::ICMPV6);
    assert_eq!(
        o.icmp,
        Some((1, 4)),
        "ICMPv6 destination unreachable / port unreachable"
    );
    assert_eq!(o.src, ip("fd00:172:30::201"));
    assert_eq!(o.dst, ip(POD_CLIENT6));
    let orig = ip_part(&input);
    // ICMPv6 error body: 4 unused bytes are part of etherparse's header; payload = the quote.
    assert_eq!(&o.payload[..], orig);
}

#[test]
fn clusterip_on_undefined_port_rejected() {
    let mut env = Env::new();
    env.add_all(simple_service(
        "web",
        "172.30.2.10",
        80,
        8080,
        &[("10.2.0.70", NODE_B)],
    ));
    let r = env.replay(&[
        syn("10.1.0.50:40000", "172.30.2.10:443"),
        udp("10.1.0.50:40001", "172.30.2.10:80", b"x"),
    ]);
    r.expect(0, "reject", "service-port-unknown");
    let t = r.out(0).tcp.expect("TCP RST");
    assert!(t.rst);
    assert_eq!(t.acknowledgment_number, 1001);
    r.expect(1, "reject", "service-port-unknown");
    assert_eq!(r.out(1).icmp, Some((3, 3)));
}

#[test]
fn unallocated_service_ip_dropped() {
    let mut env = Env::new();
    env.add_all(simple_service(
        "web",
        "172.30.2.20",
        80,
        8080,
        &[("10.2.0.80", NODE_B)],
    ));
    let r = env.replay(&[
        syn("10.1.0.50:40000", "172.30.99.99:80"),
        udp("[fd00:10:1::50]:40001", "[fd00:172:30::9999]:53", b"x"),
        syn("10.1.0.50:40002", "172.31.0.1:80"),
    ]);
    r.expect(0, "drop", "service-ip-unallocated");
    r.expect(1, "drop", "service-ip-unallocated");
    // Outside every service CIDR: just routed.
    r.expect(2, "forward", "direct");
}

#[test]
fn load_balancer_source_ranges() {
    let mut env = Env::new();
    env.add(lb_service(
        "ranged",
        json!({
            "type": "LoadBalancer",
            "clusterIP": "172.30.2.30",
            "clusterIPs": ["172.30.2.30"],
            "loadBalancerSourceRanges": [" 203.0.113.0/24 ", "198.51.100.128/25  "],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30230}]
        }),
        json!([{"ip": "198.51.100.70"}]),
    ))
    .add(slice("ranged", vec![endpoint("10.2.0.90", NODE_B)]));
    let r = env.replay(&[
        syn("203.0.113.7:40000", "198.51.100.70:80"),
        syn("198.51.100.200:40001", "198.51.100.70:80"),
        syn("192.0.2.9:40002", "198.51.100.70:80"),
        syn("10.1.0.50:40003", "172.30.2.30:80"),
        syn("192.0.2.9:40004", "192.168.0.2:30230"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.90:8080");
    r.expect(1, "forward", "service-dnat");
    r.expect(2, "drop", "source-range");
    assert!(r.by_index[2].is_none());
    // Not applied to the same Service's ClusterIP and NodePort.
    r.expect(3, "forward", "service-dnat");
    r.expect(4, "forward", "service-dnat");
}

#[test]
fn port_unreachable_quotes_are_size_limited() {
    let mut env = Env::new();
    empty_services(&mut env);
    let big = vec![0x5a; 1400];
    let in4 = udp("10.1.0.50:40004", "172.30.2.2:53", &big);
    let in6 = udp("[fd00:10:1::50]:40005", "[fd00:172:30::201]:53", &big);
    let r = env.replay(&[in4.clone(), in6.clone()]);
    r.expect(0, "reject", "no-endpoints");
    r.expect(1, "reject", "no-endpoints");
    // IPv4: the whole ICMP error fits in 576 bytes of IP (RFC 1812 4.3.2.3).
    let o4 = r.out(0);
    assert_eq!(o4.icmp, Some((3, 3)));
    let ip4_len = 20 + 8 + o4.payload.len();
    assert!(ip4_len <= 576, "ICMP error of {ip4_len} bytes");
    assert!(o4.payload.len() >= 28);
    assert_eq!(&o4.payload[..], &ip_part(&in4)[..o4.payload.len()]);
    // IPv6: at most the minimum MTU, 1280 bytes (RFC 4443 2.4 (c)).
    let o6 = r.out(1);
    assert_eq!(o6.icmp, Some((1, 4)));
    let ip6_len = 40 + 8 + o6.payload.len();
    assert!(ip6_len <= 1280, "ICMPv6 error of {ip6_len} bytes");
    assert!(
        o6.payload.len() >= 1000,
        "quotes as much as fits: {}",
        o6.payload.len()
    );
    assert_eq!(&o6.payload[..], &ip_part(&in6)[..o6.payload.len()]);
}
