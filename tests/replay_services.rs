//! Acceptance: Service frontends through `kxdp replay` (ClusterIP dual-stack, NodePort,
//! LoadBalancer, externalIPs, multi-port, protocols, slice merging, FQDN/headless/ExternalName).

mod support;

use kxdp_packet::IpProto;
use serde_json::json;
use support::*;

fn web_slice(name: &str, eps: &[(&str, &str)]) -> serde_json::Value {
    endpoint_slice(
        name.split('-').next().unwrap(),
        name,
        "IPv4",
        json!([sport("http", 8080, "TCP")]),
        eps.iter().map(|(i, n)| endpoint(i, n)).collect(),
    )
}

#[test]
fn clusterip_dual_stack_both_families() {
    let mut env = Env::new();
    env.add(service(
        "dual",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.20",
            "clusterIPs": ["172.30.0.20", "fd00:172:30::20"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "RequireDualStack",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(endpoint_slice(
        "dual",
        "dual-v4",
        "IPv4",
        json!([sport("http", 8080, "TCP")]),
        vec![endpoint("10.1.0.21", NODE_A)],
    ))
    .add(endpoint_slice(
        "dual",
        "dual-v6",
        "IPv6",
        json!([sport("http", 8080, "TCP")]),
        vec![endpoint("fd00:10:2::21", NODE_B)],
    ));
    let r = env.replay(&[
        syn("10.1.0.50:40000", "172.30.0.20:80"),
        syn("[fd00:10:1::50]:40000", "[fd00:172:30::20]:80"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert_eq!(v["proto"], "TCP");
    assert_eq!(v["orig_dst"], "172.30.0.20:80");
    assert_eq!(v["dst"], "10.1.0.21:8080");
    assert_eq!(v["src"], "10.1.0.50:40000", "pod source is kept");
    assert!(!masq(v));
    let o = r.out(0);
    assert_eq!(o.dst_sock(), sa("10.1.0.21:8080"));
    assert_eq!(o.src_sock(), sa("10.1.0.50:40000"));
    assert_eq!(o.tcp.as_ref().unwrap().sequence_number, 1000);

    let v = r.expect(1, "forward", "service-dnat");
    assert_eq!(vsock(v, "orig_dst"), sa("[fd00:172:30::20]:80"));
    assert_eq!(vsock(v, "dst"), sa("[fd00:10:2::21]:8080"));
    assert_eq!(vsock(v, "src"), sa("[fd00:10:1::50]:40000"));
    let o = r.out(1);
    assert_eq!(o.dst_sock(), sa("[fd00:10:2::21]:8080"));
    assert_eq!(o.src_sock(), sa("[fd00:10:1::50]:40000"));
}

fn nodeport_service() -> Vec<serde_json::Value> {
    vec![
        service(
            "np",
            json!({
                "type": "NodePort",
                "clusterIP": "172.30.0.30",
                "clusterIPs": ["172.30.0.30"],
                "ipFamilies": ["IPv4"],
                "externalTrafficPolicy": "Cluster",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]
            }),
        ),
        endpoint_slice(
            "np",
            "np-1",
            "IPv4",
            json!([sport("http", 8080, "TCP")]),
            vec![endpoint("10.2.0.30", NODE_B)],
        ),
    ]
}

#[test]
fn nodeport_on_node_ip() {
    let mut env = Env::new();
    env.add_all(nodeport_service());
    let r = env.replay(&[
        syn("203.0.113.7:40000", "192.168.0.2:30080"),
        syn("203.0.113.7:40001", "192.168.0.2:30081"),
        syn("203.0.113.7:40002", "172.30.0.30:80"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.30:8080");
    assert_eq!(
        vip(v, "src"),
        ip(NODE_A_IP),
        "eTP Cluster NodePort traffic is masqueraded"
    );
    assert!(masq(v));
    let o = r.out(0);
    assert_eq!(o.dst_sock(), sa("10.2.0.30:8080"));
    assert_eq!(o.src, ip(NODE_A_IP));
    // A port of the node that is no NodePort: the node's own traffic.
    r.expect(1, "pass", "to-node");
    // The same service's ClusterIP also works.
    let v = r.expect(2, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.30:8080");
}

#[test]
fn nodeport_not_on_address_excluded_by_node_port_addresses() {
    let mut env = Env::bare();
    env.infra = vec![
        namespace(NS),
        node(NODE_A, "zone-a", &[NODE_A_IP, "ExternalIP=198.51.100.2"]),
        node(NODE_B, "zone-b", &[NODE_B_IP]),
    ];
    env.config_extra("nodePortAddresses: [192.168.0.0/24]");
    env.add_all(nodeport_service());
    let r = env.replay(&[
        syn("203.0.113.7:40000", "198.51.100.2:30080"),
        syn("203.0.113.7:40001", "192.168.0.2:30080"),
    ]);
    r.expect(0, "pass", "to-node");
    assert!(r.by_index[0].is_none() || r.out(0).dst_sock() == sa("198.51.100.2:30080"));
    let v = r.expect(1, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.30:8080");
}

#[test]
fn loadbalancer_ingress_ip_and_ip_mode_proxy() {
    let mut env = Env::new();
    env.add(lb_service(
        "lb",
        json!({
            "type": "LoadBalancer",
            "clusterIP": "172.30.0.40",
            "clusterIPs": ["172.30.0.40"],
            "externalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30040}]
        }),
        json!([{"ip": "198.51.100.50", "ipMode": "VIP"}]),
    ))
    .add(web_slice("lb-1", &[("10.2.0.40", NODE_B)]));
    env.add(lb_service(
        "lbproxy",
        json!({
            "type": "LoadBalancer",
            "clusterIP": "172.30.0.41",
            "clusterIPs": ["172.30.0.41"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30041}]
        }),
        json!([{"ip": "198.51.100.51", "ipMode": "Proxy"}]),
    ))
    .add(web_slice("lbproxy-1", &[("10.2.0.41", NODE_B)]));
    let r = env.replay(&[
        syn("203.0.113.7:40000", "198.51.100.50:80"),
        syn("203.0.113.7:40001", "198.51.100.51:80"),
        syn("203.0.113.7:40002", "192.168.0.2:30041"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.40:8080");
    assert!(masq(v), "eTP Cluster: masqueraded");
    assert_eq!(r.out(0).dst_sock(), sa("10.2.0.40:8080"));
    // ipMode Proxy: the load balancer delivers to the node itself; no rule for the ingress IP.
    let v = r.expect(1, "forward", "direct");
    assert_eq!(v["dst"], "198.51.100.51:80");
    let o = r.out(1);
    assert_eq!(o.dst_sock(), sa("198.51.100.51:80"));
    assert_eq!(o.src_sock(), sa("203.0.113.7:40001"));
    // Its NodePort still works.
    let v = r.expect(2, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.41:8080");
}

#[test]
fn external_ips() {
    let mut env = Env::new();
    env.add(service(
        "ext",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.50",
            "clusterIPs": ["172.30.0.50"],
            "externalIPs": ["198.51.100.60"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(web_slice("ext-1", &[("10.2.0.50", NODE_B)]));
    let r = env.replay(&[
        syn("203.0.113.7:40000", "198.51.100.60:80"),
        syn("203.0.113.7:40001", "198.51.100.60:81"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.50:8080");
    assert!(masq(v));
    assert_eq!(r.out(0).dst_sock(), sa("10.2.0.50:8080"));
    // Another port of an external IP is not the Service's: forwarded as is.
    r.expect(1, "forward", "direct");
}

#[test]
fn multi_port_named_target_ports_resolved_per_slice() {
    let mut env = Env::new();
    env.add(service(
        "multi",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.60",
            "clusterIPs": ["172.30.0.60"],
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": "web"},
                {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": "metrics"}
            ]
        }),
    ))
    // Two pod templates during a rollout: the named ports resolve to different numbers.
    .add(endpoint_slice(
        "multi",
        "multi-old",
        "IPv4",
        json!([sport("http", 8080, "TCP"), sport("metrics", 9100, "TCP")]),
        vec![endpoint("10.1.0.60", NODE_A)],
    ))
    .add(endpoint_slice(
        "multi",
        "multi-new",
        "IPv4",
        json!([sport("metrics", 9101, "TCP"), sport("http", 8081, "TCP")]),
        vec![endpoint("10.2.0.60", NODE_B)],
    ));
    let mut pkts = Vec::new();
    for i in 0..40u16 {
        pkts.push(syn(&format!("10.1.0.50:{}", 20000 + i), "172.30.0.60:80"));
    }
    for i in 0..40u16 {
        pkts.push(syn(&format!("10.1.0.50:{}", 30000 + i), "172.30.0.60:9090"));
    }
    let r = env.replay(&pkts);
    let http = dst_histogram(&r.verdicts[..40]);
    assert_spread(&http, &["10.1.0.60:8080", "10.2.0.60:8081"]);
    let metrics = dst_histogram(&r.verdicts[40..]);
    assert_spread(&metrics, &["10.1.0.60:9100", "10.2.0.60:9101"]);
    for i in 0..80 {
        let o = r.out(i);
        assert_eq!(o.dst_sock(), vsock(r.v(i), "dst"));
    }
}

#[test]
fn tcp_udp_sctp_on_the_same_port_number() {
    let mut env = Env::new();
    env.add(service(
        "dns",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.70",
            "clusterIPs": ["172.30.0.70"],
            "ports": [
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353},
                {"name": "dns-udp", "port": 53, "protocol": "UDP", "targetPort": 5354},
                {"name": "dns-sctp", "port": 53, "protocol": "SCTP", "targetPort": 5355}
            ]
        }),
    ))
    .add(endpoint_slice(
        "dns",
        "dns-1",
        "IPv4",
        json!([
            sport("dns-tcp", 5353, "TCP"),
            sport("dns-udp", 5354, "UDP"),
            sport("dns-sctp", 5355, "SCTP")
        ]),
        vec![endpoint("10.2.0.70", NODE_B)],
    ));
    let r = env.replay(&[
        syn("10.1.0.50:40000", "172.30.0.70:53"),
        udp("10.1.0.50:40001", "172.30.0.70:53", b"query"),
        sctp_init("10.1.0.50:40002", "172.30.0.70:53"),
    ]);
    for (i, (proto, dst)) in [
        ("TCP", "10.2.0.70:5353"),
        ("UDP", "10.2.0.70:5354"),
        ("SCTP", "10.2.0.70:5355"),
    ]
    .into_iter()
    .enumerate()
    {
        let v = r.expect(i, "forward", "service-dnat");
        assert_eq!(v["proto"], proto);
        assert_eq!(v["dst"], dst);
        let o = r.out(i);
        assert_eq!(o.dst_sock(), sa(dst), "{proto}");
        assert_eq!(o.src, ip(POD_CLIENT));
    }
    assert_eq!(r.out(2).proto, IpProto::SCTP);
}

#[test]
fn endpoint_slices_merged_with_duplicate_endpoint() {
    let mut env = Env::new();
    env.add(service(
        "merged",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.80",
            "clusterIPs": ["172.30.0.80"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(endpoint_slice(
        "merged",
        "merged-aaaaa",
        "IPv4",
        json!([sport("http", 8080, "TCP")]),
        vec![endpoint("10.1.0.80", NODE_A), endpoint("10.2.0.80", NODE_B)],
    ))
    .add(endpoint_slice(
        "merged",
        "merged-bbbbb",
        "IPv4",
        json!([sport("http", 8080, "TCP")]),
        vec![endpoint("10.2.0.80", NODE_B), endpoint("10.3.0.80", NODE_C)],
    ));
    let pkts: Vec<_> = (0..300u16)
        .map(|i| syn(&format!("10.1.0.50:{}", 20000 + i), "172.30.0.80:80"))
        .collect();
    let r = env.replay(&pkts);
    let h = dst_histogram(&r.verdicts);
    assert_spread(&h, &["10.1.0.80:8080", "10.2.0.80:8080", "10.3.0.80:8080"]);
    // The duplicate counts once: 10.2.0.80 gets about a third (100 ± 8), not half (150).
    let dup = h[&sa("10.2.0.80:8080")];
    assert!(dup < 135, "duplicate endpoint weighted twice? {h:?}");
}

#[test]
fn fqdn_slice_ignored() {
    let mut env = Env::new();
    env.add(service(
        "mixed",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.90",
            "clusterIPs": ["172.30.0.90"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(endpoint_slice(
        "mixed",
        "mixed-fqdn",
        "FQDN",
        json!([sport("http", 8080, "TCP")]),
        vec![json!({"addresses": ["db.example.com"], "conditions": {"ready": true}})],
    ))
    .add(web_slice("mixed-v4", &[("10.2.0.90", NODE_B)]));
    env.add(service(
        "onlyfqdn",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.0.91",
            "clusterIPs": ["172.30.0.91"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(endpoint_slice(
        "onlyfqdn",
        "onlyfqdn-1",
        "FQDN",
        json!([sport("http", 8080, "TCP")]),
        vec![json!({"addresses": ["db.example.com"], "conditions": {"ready": true}})],
    ));
    let mut pkts: Vec<_> = (0..20u16)
        .map(|i| syn(&format!("10.1.0.50:{}", 20000 + i), "172.30.0.90:80"))
        .collect();
    pkts.push(syn("10.1.0.50:41000", "172.30.0.91:80"));
    let r = env.replay(&pkts);
    assert_spread(&dst_histogram(&r.verdicts[..20]), &["10.2.0.90:8080"]);
    r.expect(20, "reject", "no-endpoints");
}

#[test]
fn headless_and_external_name_have_no_rules() {
    let mut env = Env::new();
    env.add(service(
        "headless",
        json!({
            "type": "ClusterIP",
            "clusterIP": "None",
            "clusterIPs": ["None"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ))
    .add(web_slice("headless-1", &[("10.2.0.100", NODE_B)]));
    env.add(service(
        "extname",
        json!({
            "type": "ExternalName",
            "externalName": "db.example.com",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]
        }),
    ));
    // A normal service next to them, to show the state loaded.
    env.add_all(simple_service(
        "web",
        "172.30.0.101",
        80,
        8080,
        &[("10.2.0.101", NODE_B)],
    ));
    let r = env.replay(&[
        syn("10.1.0.50:40000", "10.2.0.100:8080"),
        syn("10.1.0.50:40001", "10.2.0.100:80"),
        syn("10.1.0.50:40002", "172.30.0.101:80"),
    ]);
    let v = r.expect(0, "forward", "direct");
    assert_eq!(v["dst"], "10.2.0.100:8080");
    assert_eq!(r.out(0).dst_sock(), sa("10.2.0.100:8080"));
    r.expect(1, "forward", "direct");
    r.expect(2, "forward", "service-dnat");
}
