//! Acceptance: when a connection is masqueraded (source NAT to this node's address), and that
//! replies find their way back to the original client.

mod support;

use serde_json::{json, Value};
use support::*;

/// One Service with every frontend: ClusterIP 172.30.3.10:80, NodePort 30310, LoadBalancer
/// 198.51.100.80, externalIP 198.51.100.81; dual-stack ClusterIP; one endpoint per family on node-b.
fn all_frontends(name: &str, etp: &str, ips: (&str, &str, &str, &str)) -> Vec<Value> {
    let (cip, cip6, lb, ext) = ips;
    vec![
        lb_service(
            name,
            json!({
                "type": "LoadBalancer",
                "clusterIP": cip,
                "clusterIPs": [cip, cip6],
                "ipFamilies": ["IPv4", "IPv6"],
                "ipFamilyPolicy": "PreferDualStack",
                "externalIPs": [ext],
                "externalTrafficPolicy": etp,
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080,
                           "nodePort": if etp == "Local" { 30311 } else { 30310 }}]
            }),
            json!([{"ip": lb}]),
        ),
        endpoint_slice(
            name,
            &format!("{name}-v4"),
            "IPv4",
            json!([sport("http", 8080, "TCP")]),
            vec![endpoint(
                if etp == "Local" {
                    "10.1.0.11"
                } else {
                    "10.2.0.10"
                },
                if etp == "Local" { NODE_A } else { NODE_B },
            )],
        ),
        endpoint_slice(
            name,
            &format!("{name}-v6"),
            "IPv6",
            json!([sport("http", 8080, "TCP")]),
            vec![endpoint(
                if etp == "Local" {
                    "fd00:10:1::11"
                } else {
                    "fd00:10:2::10"
                },
                if etp == "Local" { NODE_A } else { NODE_B },
            )],
        ),
    ]
}

fn cluster_env() -> Env {
    let mut env = Env::new();
    env.add_all(all_frontends(
        "front",
        "Cluster",
        (
            "172.30.3.10",
            "fd00:172:30::310",
            "198.51.100.80",
            "198.51.100.81",
        ),
    ));
    env
}

#[test]
fn pod_to_clusterip_keeps_client_address() {
    let env = cluster_env();
    let r = env.replay(&[
        syn("10.1.0.50:40000", "172.30.3.10:80"),
        syn("[fd00:10:1::50]:40000", "[fd00:172:30::310]:80"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert!(!masq(v));
    assert_eq!(v["src"], "10.1.0.50:40000");
    assert_eq!(r.out(0).src_sock(), sa("10.1.0.50:40000"));
    assert_eq!(r.out(0).dst_sock(), sa("10.2.0.10:8080"));
    let v = r.expect(1, "forward", "service-dnat");
    assert!(!masq(v));
    assert_eq!(r.out(1).src_sock(), sa("[fd00:10:1::50]:40000"));
    assert_eq!(r.out(1).dst_sock(), sa("[fd00:10:2::10]:8080"));
}

#[test]
fn external_and_node_sources_to_clusterip_are_masqueraded() {
    let env = cluster_env();
    let r = env.replay(&[
        syn("203.0.113.7:40000", "172.30.3.10:80"),
        syn("192.168.0.2:40001", "172.30.3.10:80"),
        syn("[2001:db8::7]:40002", "[fd00:172:30::310]:80"),
    ]);
    for (i, node_ip) in [(0, NODE_A_IP), (1, NODE_A_IP), (2, NODE_A_IP6)] {
        let v = r.expect(i, "forward", "service-dnat");
        assert!(masq(v), "{v}");
        assert_eq!(vip(v, "src"), ip(node_ip));
        let o = r.out(i);
        assert_eq!(o.src, ip(node_ip));
        assert_eq!(vsock(v, "src"), o.src_sock());
    }
    assert_eq!(r.out(0).dst_sock(), sa("10.2.0.10:8080"));
    assert_eq!(r.out(2).dst_sock(), sa("[fd00:10:2::10]:8080"));
}

#[test]
fn external_frontends_with_cluster_policy_are_masqueraded() {
    let env = cluster_env();
    let r = env.replay(&[
        syn("203.0.113.7:40000", "192.168.0.2:30310"),
        syn("203.0.113.7:40001", "198.51.100.80:80"),
        syn("203.0.113.7:40002", "198.51.100.81:80"),
        // From a pod too: external destinations with eTP Cluster are always masqueraded.
        syn("10.1.0.50:40003", "192.168.0.2:30310"),
        syn("10.1.0.50:40004", "198.51.100.80:80"),
        syn("[2001:db8::7]:40005", "[fd00:192::2]:30310"),
    ]);
    for i in 0..6 {
        let v = r.expect(i, "forward", "service-dnat");
        assert!(masq(v), "{v}");
        let o = r.out(i);
        let node = if i == 5 { NODE_A_IP6 } else { NODE_A_IP };
        assert_eq!(o.src, ip(node), "packet {i}");
        let want = if i == 5 {
            "[fd00:10:2::10]:8080"
        } else {
            "10.2.0.10:8080"
        };
        assert_eq!(o.dst_sock(), sa(want), "packet {i}");
    }
}

#[test]
fn external_traffic_policy_local_preserves_client_address() {
    let mut env = Env::new();
    env.add_all(all_frontends(
        "local",
        "Local",
        (
            "172.30.3.20",
            "fd00:172:30::320",
            "198.51.100.90",
            "198.51.100.91",
        ),
    ));
    let r = env.replay(&[
        syn("203.0.113.7:40000", "192.168.0.2:30311"),
        syn("203.0.113.7:40001", "198.51.100.90:80"),
        syn("203.0.113.7:40002", "198.51.100.91:80"),
        syn("[2001:db8::7]:40003", "[fd00:192::2]:30311"),
    ]);
    for i in 0..4 {
        let v = r.expect(i, "forward", "service-dnat");
        assert!(!masq(v), "{v}");
        let o = r.out(i);
        assert_eq!(
            o.src_sock(),
            vsock(v, "orig_src"),
            "packet {i}: client address kept"
        );
    }
    assert_eq!(r.out(0).dst_sock(), sa("10.1.0.11:8080"));
    assert_eq!(r.out(3).dst_sock(), sa("[fd00:10:1::11]:8080"));
}

#[test]
fn hairpin_to_own_service_is_masqueraded_and_reply_unnated() {
    let mut env = Env::new();
    env.add_all(simple_service(
        "self",
        "172.30.3.30",
        80,
        8080,
        &[(POD_CLIENT, NODE_A)],
    ));
    let syn_pkt = syn("10.1.0.50:40000", "172.30.3.30:80");
    // First replay: learn where the SYN goes.
    let r = env.replay(std::slice::from_ref(&syn_pkt));
    let v = r.expect(0, "forward", "service-dnat");
    assert!(masq(v), "hairpin traffic must be masqueraded: {v}");
    let o = r.out(0);
    assert_eq!(o.dst_sock(), sa("10.1.0.50:8080"));
    assert_eq!(o.src, ip(NODE_A_IP));
    // Second replay: the SYN and the pod's answer to the rewritten SYN.
    let reply = tcp_reply_to(&o, flags::SYN | flags::ACK, 9000, 1001);
    let r = env.replay(&[syn_pkt, reply]);
    let v = r.expect(1, "forward", "reply-unnat");
    assert!(masq(v));
    let back = r.out(1);
    assert_eq!(back.src_sock(), sa("172.30.3.30:80"));
    assert_eq!(back.dst_sock(), sa("10.1.0.50:40000"));
    let t = back.tcp.unwrap();
    assert!(t.syn && t.ack);
    assert_eq!((t.sequence_number, t.acknowledgment_number), (9000, 1001));
}

#[test]
fn masquerade_all() {
    let mut env = cluster_env();
    env.config_extra("masqueradeAll: true");
    let r = env.replay(&[
        syn("10.1.0.50:40000", "172.30.3.10:80"),
        syn("[fd00:10:1::50]:40001", "[fd00:172:30::310]:80"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert!(masq(v));
    assert_eq!(r.out(0).src, ip(NODE_A_IP));
    let v = r.expect(1, "forward", "service-dnat");
    assert!(masq(v));
    assert_eq!(r.out(1).src, ip(NODE_A_IP6));
}

#[test]
fn same_source_port_from_two_clients_gets_distinct_snat_ports_and_replies_return() {
    let env = cluster_env();
    let a = syn("203.0.113.7:40000", "192.168.0.2:30310");
    let b = syn("203.0.113.8:40000", "192.168.0.2:30310");
    let r = env.replay(&[a.clone(), b.clone()]);
    let oa = r.out(0);
    let ob = r.out(1);
    assert_eq!(oa.src, ip(NODE_A_IP));
    assert_eq!(ob.src, ip(NODE_A_IP));
    assert_eq!(oa.dst_sock(), ob.dst_sock(), "one backend");
    assert_ne!(oa.sport, ob.sport, "the reply tuples must differ");
    // Replies of the backend to both, interleaved: each goes back to its own client.
    let ra = tcp_reply_to(&oa, flags::SYN | flags::ACK, 7000, 1001);
    let rb = tcp_reply_to(&ob, flags::SYN | flags::ACK, 8000, 1001);
    let r = env.replay(&[a, b, rb, ra]);
    let v = r.expect(2, "forward", "reply-unnat");
    assert!(masq(v));
    let back_b = r.out(2);
    assert_eq!(back_b.src_sock(), sa("192.168.0.2:30310"));
    assert_eq!(back_b.dst_sock(), sa("203.0.113.8:40000"));
    assert_eq!(back_b.tcp.as_ref().unwrap().sequence_number, 8000);
    r.expect(3, "forward", "reply-unnat");
    let back_a = r.out(3);
    assert_eq!(back_a.src_sock(), sa("192.168.0.2:30310"));
    assert_eq!(back_a.dst_sock(), sa("203.0.113.7:40000"));
    assert_eq!(back_a.tcp.as_ref().unwrap().sequence_number, 7000);
}

#[test]
fn replies_reverse_natted_to_original_client_v4_and_v6_udp() {
    let mut env = Env::new();
    env.add(service(
        "dns",
        json!({
            "type": "NodePort",
            "clusterIP": "172.30.3.40",
            "clusterIPs": ["172.30.3.40", "fd00:172:30::340"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "RequireDualStack",
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30353}]
        }),
    ))
    .add(endpoint_slice("dns", "dns-v4", "IPv4", json!([sport("dns", 5353, "UDP")]), vec![endpoint("10.2.0.40", NODE_B)]))
    .add(endpoint_slice("dns", "dns-v6", "IPv6", json!([sport("dns", 5353, "UDP")]), vec![endpoint("fd00:10:2::40", NODE_B)]));
    let q4 = udp("203.0.113.7:5000", "192.168.0.2:30353", b"query-4");
    let q6 = udp("[2001:db8::7]:5000", "[fd00:192::2]:30353", b"query-6");
    let r = env.replay(&[q4.clone(), q6.clone()]);
    let (o4, o6) = (r.out(0), r.out(1));
    assert_eq!(o4.src, ip(NODE_A_IP));
    assert_eq!(o4.dst_sock(), sa("10.2.0.40:5353"));
    assert_eq!(o6.src, ip(NODE_A_IP6));
    assert_eq!(o6.dst_sock(), sa("[fd00:10:2::40]:5353"));
    let r = env.replay(&[
        q4,
        q6,
        udp_reply_to(&o4, b"answer-4"),
        udp_reply_to(&o6, b"answer-6"),
    ]);
    r.expect(2, "forward", "reply-unnat");
    let b4 = r.out(2);
    assert_eq!(b4.src_sock(), sa("192.168.0.2:30353"));
    assert_eq!(b4.dst_sock(), sa("203.0.113.7:5000"));
    assert_eq!(b4.payload, b"answer-4");
    r.expect(3, "forward", "reply-unnat");
    let b6 = r.out(3);
    assert_eq!(b6.src_sock(), sa("[fd00:192::2]:30353"));
    assert_eq!(b6.dst_sock(), sa("[2001:db8::7]:5000"));
    assert_eq!(b6.payload, b"answer-6");
}
