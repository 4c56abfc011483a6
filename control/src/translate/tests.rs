//! The translation's tests: Services, endpoints and policies in, tables out.

use std::path::Path;
use std::sync::Arc;

use ipnet::IpNet;
use kxdp_dataplane::snapshot::{
    EmptyAction, EndpointRange, Frontend, FrontendKey, FrontendKind, Route, ServicePortInfo,
    Snapshot, SourceClass,
};
use kxdp_packet::Addr;
use kxdp_packet::IpProto;

use super::*;
use crate::config::Config;
use crate::model::ClusterState;
use crate::sources::files::load_str_unvalidated;

const BASE: &str = "apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: node-a
nodeIPs: [192.168.0.2, \"fd00:1::2\"]
clusterCIDRs: [10.0.0.0/8, \"fd00::/48\"]
serviceCIDRs: [172.30.0.0/16]
";

fn cfg(extra: &str) -> Config {
    Config::from_yaml_str(&format!("{BASE}{extra}"), Path::new("config.yaml")).unwrap()
}

fn tr(config: &Config, yaml: &str) -> Translation {
    let mut state = ClusterState::new();
    load_str_unvalidated(yaml, Path::new("state.yaml"), &mut state).unwrap();
    let t = translate(config, &state);
    t.snapshot.validate().unwrap();
    t
}

fn fe<'a>(s: &'a Snapshot, ip: &str, port: u16, proto: IpProto) -> &'a Frontend {
    let key = FrontendKey {
        addr: Addr::from_ip(ip.parse().unwrap()),
        port,
        proto,
    };
    s.frontend(&key)
        .unwrap_or_else(|| panic!("no frontend {ip}:{port}/{proto}"))
}

fn has_fe(s: &Snapshot, ip: &str, port: u16, proto: IpProto) -> bool {
    s.frontend(&FrontendKey {
        addr: Addr::from_ip(ip.parse().unwrap()),
        port,
        proto,
    })
    .is_some()
}

/// A route as text: `M ip:port,...` (masqueraded) / `- ip:port,...`, or `reject` / `drop`.
fn route(s: &Snapshot, r: &Route) -> String {
    if r.endpoints.is_empty() {
        assert!(!r.masquerade);
        return match r.when_empty {
            EmptyAction::Reject => "reject".into(),
            EmptyAction::Drop => "drop".into(),
        };
    }
    // The frontend this route belongs to (`r` points into one of `s`'s frontends).
    let f = s
        .frontends
        .iter()
        .map(|(_, f)| f)
        .find(|f| f.routes.iter().any(|x| std::ptr::eq(x, r)))
        .expect("route of a frontend of this snapshot");
    let eps: Vec<String> = f
        .endpoints_of(r.endpoints)
        .iter()
        .map(|e| {
            let ip = if e.addr.is_v4_mapped() {
                e.addr.to_ip(kxdp_packet::Family::V4)
            } else {
                e.addr.to_ip(kxdp_packet::Family::V6)
            };
            format!(
                "{}{}",
                std::net::SocketAddr::new(ip, e.port),
                if e.local { "(L)" } else { "" }
            )
        })
        .collect();
    format!("{} {}", if r.masquerade { "M" } else { "-" }, eps.join(","))
}

/// Routes for [Pod, Node, External].
fn routes(s: &Snapshot, f: &Frontend) -> [String; 3] {
    [
        route(s, &f.routes[0]),
        route(s, &f.routes[1]),
        route(s, &f.routes[2]),
    ]
}

fn svc_port<'a>(_s: &Snapshot, f: &'a Frontend) -> &'a ServicePortInfo {
    &f.service_port
}

fn service(name: &str, spec: &str) -> String {
    format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n{spec}\n")
}

fn slice(name: &str, svc: &str, family: &str, ports: &str, endpoints: &str) -> String {
    format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: {family}\nports: {ports}\nendpoints:\n{endpoints}\n"
        )
}

/// Two endpoints, one on this node.
fn web_slice(svc: &str) -> String {
    slice(
        &format!("{svc}-1"),
        svc,
        "IPv4",
        "[{name: http, port: 8080}]",
        "- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a}",
    )
}

const WEB: &str = "  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, targetPort: 8080}]";

#[test]
fn cluster_ip_basic() {
    let t = tr(
        &cfg(""),
        &format!("{}{}", service("web", WEB), web_slice("web")),
    );
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let s = &t.snapshot;
    let f = fe(s, "172.30.0.10", 80, IpProto::TCP);
    assert_eq!(f.kind, FrontendKind::ClusterIp);
    assert!(f.source_ranges.is_none());
    // Pods keep their address; other sources are masqueraded (kube-proxy's IfNotLocal rule).
    assert_eq!(
        routes(s, f),
        [
            "- 10.1.0.1:8080,10.1.0.2:8080(L)",
            "M 10.1.0.1:8080,10.1.0.2:8080(L)",
            "M 10.1.0.1:8080,10.1.0.2:8080(L)"
        ]
    );
    let sp = svc_port(s, f);
    assert_eq!(&*sp.name, "ns/web:http");
    assert_eq!(sp.id, service_port_id("ns", "web", "http", "TCP"));
    assert_eq!(sp.proto, IpProto::TCP);
    assert_eq!(sp.affinity_timeout_s, 0);
    assert!(s
        .cluster_ips
        .contains(&Addr::from_ip("172.30.0.10".parse().unwrap())));
    assert_eq!(s.frontends.len(), 1);
    assert_eq!(s.node.name, "node-a");
    assert_eq!(
        s.node.snat_v4,
        Some(Addr::from_ip("192.168.0.2".parse().unwrap()))
    );
    assert_eq!(
        s.node.snat_v6,
        Some(Addr::from_ip("fd00:1::2".parse().unwrap()))
    );
    assert_eq!(s.node.addrs.len(), 2);
    assert!(s.cluster_cidrs.contains(
        &Addr::from_ip("10.9.9.9".parse().unwrap()),
        kxdp_packet::Family::V4
    ));
    assert!(s.service_cidrs.contains(
        &Addr::from_ip("172.30.9.9".parse().unwrap()),
        kxdp_packet::Family::V4
    ));
    assert_eq!(s.generation, 0);
}

#[test]
fn masquerade_settings() {
    let yaml = format!("{}{}", service("web", WEB), web_slice("web"));
    let t = tr(&cfg("masqueradeAll: true\n"), &yaml);
    let f = fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP);
    assert!(f.routes.iter().all(|r| r.masquerade));
    // Without cluster CIDRs kube-proxy cannot tell pod traffic and masquerades nothing.
    let c = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2]\n",
            Path::new("c.yaml"),
        )
        .unwrap();
    let t = tr(&c, &yaml);
    let f = fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP);
    assert!(f
        .routes
        .iter()
        .all(|r| !r.masquerade && r.endpoints.len == 2));
    // A v4-only cluster CIDR leaves IPv6 ClusterIPs unmasqueraded.
    let c = cfg("").clone();
    let mut c4 = c;
    c4.cluster_cidrs.retain(|n| matches!(n, IpNet::V4(_)));
    let yaml6 = format!(
        "{}{}",
        service(
            "v6",
            "  clusterIP: fd00:30::10\n  ports: [{name: http, port: 80}]"
        ),
        slice(
            "v6-1",
            "v6",
            "IPv6",
            "[{name: http, port: 8080}]",
            "- {addresses: [\"fd00::5\"]}"
        )
    );
    let t = tr(&c4, &yaml6);
    let f = fe(&t.snapshot, "fd00:30::10", 80, IpProto::TCP);
    assert_eq!(
        routes(&t.snapshot, f),
        ["- [fd00::5]:8080", "- [fd00::5]:8080", "- [fd00::5]:8080"]
    );
}

#[test]
fn skipped_services() {
    let yaml = [
            service("headless", "  clusterIP: None\n  ports: [{port: 80}]"),
            service("headless2", "  clusterIP: None\n  clusterIPs: [None]\n  ports: [{port: 80}]"),
            service("ext", "  type: ExternalName\n  externalName: example.com\n  clusterIP: 172.30.0.99\n  ports: [{port: 80}]"),
            service("unallocated", "  ports: [{port: 80}]"),
            web_slice("headless"),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    assert!(t.snapshot.frontends.is_empty());
    assert!(t.snapshot.cluster_ips.is_empty());
    assert!(t.snapshot.service_ports.is_empty());
    assert!(t.problems.is_empty(), "{:?}", t.problems);
}

#[test]
fn multi_slice_merge_duplicates_and_named_ports() {
    let yaml = [
            service("web", "  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}, {name: sctp, port: 9, protocol: SCTP}]"),
            slice("web-a", "web", "IPv4", "[{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]", "- {addresses: [10.1.0.1]}\n- {addresses: [10.1.0.2]}"),
            // Same port name with another number in this slice; one duplicate endpoint.
            slice("web-b", "web", "IPv4", "[{name: http, port: 8081}, {name: sctp, port: 99, protocol: SCTP}]", "- {addresses: [10.1.0.3]}"),
            slice("web-c", "web", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.1.0.1]}"),
            // Another Service's slice and an unlabelled one do not leak in.
            slice("other-1", "other", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.9.0.1]}"),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    let http = fe(s, "172.30.0.10", 80, IpProto::TCP);
    assert_eq!(
        route(s, &http.routes[0]),
        "- 10.1.0.1:8080,10.1.0.2:8080,10.1.0.3:8081"
    );
    let dns = fe(s, "172.30.0.10", 53, IpProto::UDP);
    assert_eq!(route(s, &dns.routes[0]), "- 10.1.0.1:5353,10.1.0.2:5353");
    assert_eq!(&*svc_port(s, dns).name, "ns/web:dns");
    assert_eq!(svc_port(s, dns).proto, IpProto::UDP);
    let sctp = fe(s, "172.30.0.10", 9, IpProto::SCTP);
    assert_eq!(route(s, &sctp.routes[0]), "- 10.1.0.3:99");
    // TCP 53 is not a frontend.
    assert!(!has_fe(s, "172.30.0.10", 53, IpProto::TCP));
    assert_eq!(s.service_ports.len(), 3);
    let ids: std::collections::HashSet<u32> = s.service_ports.iter().map(|(_, p)| p.id).collect();
    assert_eq!(ids.len(), 3);
}

#[test]
fn unnamed_port_and_protocol_defaults() {
    let yaml = [
        service("one", "  clusterIP: 172.30.0.11\n  ports: [{port: 80}]"),
        slice(
            "one-1",
            "one",
            "IPv4",
            "[{port: 8080}]",
            "- {addresses: [10.1.0.1]}",
        ),
    ]
    .concat();
    let t = tr(&cfg(""), &yaml);
    let f = fe(&t.snapshot, "172.30.0.11", 80, IpProto::TCP);
    assert_eq!(&*svc_port(&t.snapshot, f).name, "ns/one");
    assert_eq!(route(&t.snapshot, &f.routes[0]), "- 10.1.0.1:8080");
}

#[test]
fn bad_ports_and_ips_are_problems() {
    let yaml = [
            service("bad", "  clusterIP: 172.30.0.12\n  ports: [{name: a, port: 80, protocol: ICMP}, {name: b, port: 70000}, {name: c, port: 81}]"),
            service("badip", "  clusterIP: 172.30.0.300\n  ports: [{port: 80}]"),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    assert!(has_fe(&t.snapshot, "172.30.0.12", 81, IpProto::TCP));
    assert_eq!(t.snapshot.frontends.len(), 1);
    let msgs: Vec<String> = t.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert!(
        msgs[0].starts_with("Service ns/bad: spec.ports[0].protocol"),
        "{msgs:?}"
    );
    assert!(
        msgs[1].starts_with("Service ns/bad: spec.ports[1].port"),
        "{msgs:?}"
    );
    assert!(
        msgs[2]
            .starts_with("Service ns/badip: spec.clusterIPs[0]: `172.30.0.300` is not a valid IP"),
        "{msgs:?}"
    );
}

#[test]
fn no_endpoints_rejects() {
    let t = tr(
        &cfg(""),
        &service(
            "empty",
            "  type: NodePort\n  clusterIP: 172.30.0.13\n  ports: [{port: 80, nodePort: 30080}]",
        ),
    );
    let s = &t.snapshot;
    for f in [
        fe(s, "172.30.0.13", 80, IpProto::TCP),
        fe(s, "192.168.0.2", 30080, IpProto::TCP),
    ] {
        assert_eq!(routes(s, f), ["reject", "reject", "reject"]);
    }
    // Only unusable endpoints (not ready, not terminating): still no endpoints.
    let yaml = format!(
        "{}{}",
        service("empty", WEB),
        slice(
            "e-1",
            "empty",
            "IPv4",
            "[{name: http, port: 8080}]",
            "- {addresses: [10.1.0.1], conditions: {ready: false, serving: true}}"
        )
    );
    let t = tr(&cfg(""), &yaml);
    assert_eq!(
        routes(
            &t.snapshot,
            fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        ),
        ["reject", "reject", "reject"]
    );
}

#[test]
fn terminating_fallback() {
    let yaml = format!(
            "{}{}",
            service("web", WEB),
            slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], conditions: {ready: false, serving: true, terminating: true}}\n- {addresses: [10.1.0.2], conditions: {ready: false, serving: false, terminating: true}}"
            )
        );
    let t = tr(&cfg(""), &yaml);
    assert_eq!(
        route(
            &t.snapshot,
            &fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP).routes[0]
        ),
        "- 10.1.0.1:8080"
    );
}

#[test]
fn node_port_cluster_policy() {
    let yaml = format!("{}{}", service("web", "  type: NodePort\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]"), web_slice("web"));
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    let f = fe(s, "192.168.0.2", 30080, IpProto::TCP);
    assert_eq!(f.kind, FrontendKind::NodePort);
    let all = "M 10.1.0.1:8080,10.1.0.2:8080(L)";
    assert_eq!(routes(s, f), [all, all, all]);
    // IPv4-only Service: no NodePort on the IPv6 node address.
    assert!(!has_fe(s, "fd00:1::2", 30080, IpProto::TCP));
    // The ClusterIP and the NodePort share the endpoint list.
    assert_eq!(
        fe(s, "172.30.0.10", 80, IpProto::TCP).routes[0].endpoints,
        f.routes[0].endpoints
    );
    assert!(Arc::ptr_eq(
        &fe(s, "172.30.0.10", 80, IpProto::TCP).endpoints,
        &f.endpoints
    ));
    assert_eq!(f.endpoints.len(), 2);
}

#[test]
fn node_port_addresses() {
    let yaml = [
            service("web", "  type: NodePort\n  ipFamilyPolicy: PreferDualStack\n  clusterIPs: [172.30.0.10, \"fd00:30::10\"]\n  ports: [{name: http, port: 80, nodePort: 30080}]"),
            web_slice("web"),
        ]
        .concat();
    let ips = "nodeIPs: [192.168.0.2, 10.200.0.2, \"fd00:1::2\", \"fd00:2::2\"]\n";
    let base = format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nclusterCIDRs: [10.0.0.0/16]\n{ips}");
    let mk = |extra: &str| {
        Config::from_yaml_str(&format!("{base}{extra}"), Path::new("c.yaml")).unwrap()
    };
    let cases: &[(&str, &[&str])] = &[
        ("", &["192.168.0.2", "10.200.0.2", "fd00:1::2", "fd00:2::2"]),
        (
            "nodePortAddresses: []\n",
            &["192.168.0.2", "10.200.0.2", "fd00:1::2", "fd00:2::2"],
        ),
        // A v4 CIDR filters v4; no v6 CIDR means every v6 address (kube-proxy).
        (
            "nodePortAddresses: [192.168.0.0/24]\n",
            &["192.168.0.2", "fd00:1::2", "fd00:2::2"],
        ),
        (
            "nodePortAddresses: [192.168.0.0/24, \"fd00:2::/64\"]\n",
            &["192.168.0.2", "fd00:2::2"],
        ),
        // CIDRs of a family that match no address: no NodePort on that family.
        (
            "nodePortAddresses: [172.16.0.0/12, \"fd00:2::/64\"]\n",
            &["fd00:2::2"],
        ),
        (
            "nodePortAddresses: [0.0.0.0/0, 10.200.0.0/16]\n",
            &["192.168.0.2", "10.200.0.2", "fd00:1::2", "fd00:2::2"],
        ),
        (
            "nodePortAddresses: [primary]\n",
            &["192.168.0.2", "fd00:1::2"],
        ),
    ];
    for (extra, want) in cases {
        let t = tr(&mk(extra), &yaml);
        let mut got: Vec<String> = t
            .snapshot
            .frontends
            .keys()
            .filter(|k| k.port == 30080)
            .map(|k| k.addr.to_string())
            .collect();
        got.sort();
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(got, want, "{extra}");
    }
}

fn etp_local(eps: &str) -> String {
    [
            service("web", "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  externalIPs: [203.0.113.7]\n  ports: [{name: http, port: 80, nodePort: 30080}]"),
            slice("web-1", "web", "IPv4", "[{name: http, port: 8080}]", eps),
        ]
        .concat()
}

#[test]
fn external_traffic_policy_local() {
    let t = tr(&cfg(""), &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a}"));
    let s = &t.snapshot;
    let all = "10.1.0.1:8080,10.1.0.2:8080(L)";
    for f in [
        fe(s, "192.168.0.2", 30080, IpProto::TCP),
        fe(s, "203.0.113.7", 80, IpProto::TCP),
    ] {
        // Pods short-circuit unmasqueraded, the node is masqueraded, outsiders keep their
        // address and reach only local endpoints.
        assert_eq!(
            routes(s, f),
            [
                format!("- {all}"),
                format!("M {all}"),
                "- 10.1.0.2:8080(L)".to_string()
            ]
        );
    }
    assert_eq!(
        fe(s, "203.0.113.7", 80, IpProto::TCP).kind,
        FrontendKind::ExternalIp
    );
    // The ClusterIP is not affected by eTP.
    assert_eq!(
        routes(s, fe(s, "172.30.0.10", 80, IpProto::TCP))[2],
        format!("M {all}")
    );

    // No local endpoint: outsiders are dropped, pods and the node still get through.
    let t = tr(
        &cfg(""),
        &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}"),
    );
    let s = &t.snapshot;
    let f = fe(s, "192.168.0.2", 30080, IpProto::TCP);
    assert_eq!(routes(s, f), ["- 10.1.0.1:8080", "M 10.1.0.1:8080", "drop"]);

    // Local endpoint terminating but serving: used for outsiders (graceful drain).
    let t = tr(
            &cfg(""),
            &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}"),
        );
    let s = &t.snapshot;
    assert_eq!(
        routes(s, fe(s, "192.168.0.2", 30080, IpProto::TCP)),
        ["- 10.1.0.1:8080", "M 10.1.0.1:8080", "- 10.1.0.2:8080(L)"]
    );
}

#[test]
fn external_traffic_policy_local_without_cluster_cidrs() {
    let c = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2]\n",
            Path::new("c.yaml"),
        )
        .unwrap();
    let t = tr(&c, &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a}"));
    let s = &t.snapshot;
    // No pod short-circuit: the Pod class (never produced) follows the external route.
    assert_eq!(
        routes(s, fe(s, "192.168.0.2", 30080, IpProto::TCP)),
        [
            "- 10.1.0.2:8080(L)",
            "M 10.1.0.1:8080,10.1.0.2:8080(L)",
            "- 10.1.0.2:8080(L)"
        ]
    );
}

#[test]
fn etp_local_only_means_something_for_nodeport_and_lb() {
    let yaml = [
            service("web", "  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  externalIPs: [203.0.113.7]\n  ports: [{name: http, port: 80}]"),
            web_slice("web"),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    let all = "M 10.1.0.1:8080,10.1.0.2:8080(L)";
    assert_eq!(
        routes(s, fe(s, "203.0.113.7", 80, IpProto::TCP)),
        [all, all, all]
    );
}

#[test]
fn internal_traffic_policy_local() {
    let svc = "  internalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80}]";
    let t = tr(
        &cfg(""),
        &format!("{}{}", service("web", svc), web_slice("web")),
    );
    let s = &t.snapshot;
    assert_eq!(
        routes(s, fe(s, "172.30.0.10", 80, IpProto::TCP)),
        [
            "- 10.1.0.2:8080(L)",
            "M 10.1.0.2:8080(L)",
            "M 10.1.0.2:8080(L)"
        ]
    );
    // Endpoints only elsewhere: drop (not reject).
    let yaml = format!(
        "{}{}",
        service("web", svc),
        slice(
            "web-1",
            "web",
            "IPv4",
            "[{name: http, port: 8080}]",
            "- {addresses: [10.1.0.1], nodeName: node-b}"
        )
    );
    let t = tr(&cfg(""), &yaml);
    assert_eq!(
        routes(
            &t.snapshot,
            fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        ),
        ["drop", "drop", "drop"]
    );
    // iTP Local + NodePort eTP Cluster: NodePort uses the cluster list.
    let svc2 = "  type: NodePort\n  internalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]";
    let yaml = format!(
        "{}{}",
        service("web", svc2),
        slice(
            "web-1",
            "web",
            "IPv4",
            "[{name: http, port: 8080}]",
            "- {addresses: [10.1.0.1], nodeName: node-b}"
        )
    );
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    assert_eq!(
        routes(s, fe(s, "172.30.0.10", 80, IpProto::TCP)),
        ["drop", "drop", "drop"]
    );
    assert_eq!(
        routes(s, fe(s, "192.168.0.2", 30080, IpProto::TCP)),
        ["M 10.1.0.1:8080", "M 10.1.0.1:8080", "M 10.1.0.1:8080"]
    );
    // iTP Local and eTP Local, no local endpoints: pods and node short-circuit to the
    // cluster endpoints (kube-proxy keeps cluster endpoints for externally reachable ports).
    let svc3 = "  type: NodePort\n  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]";
    let yaml = format!(
        "{}{}",
        service("web", svc3),
        slice(
            "web-1",
            "web",
            "IPv4",
            "[{name: http, port: 8080}]",
            "- {addresses: [10.1.0.1], nodeName: node-b}"
        )
    );
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    assert_eq!(
        routes(s, fe(s, "192.168.0.2", 30080, IpProto::TCP)),
        ["- 10.1.0.1:8080", "M 10.1.0.1:8080", "drop"]
    );
}

#[test]
fn dual_stack() {
    let yaml = [
            service("ds", "  type: NodePort\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: \"fd00:30::20\"\n  clusterIPs: [\"fd00:30::20\", 172.30.0.20]\n  externalIPs: [203.0.113.8, \"2001:db8::8\"]\n  ports: [{name: http, port: 80, nodePort: 30081}]"),
            slice("ds-v4", "ds", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.1.0.5]}"),
            slice("ds-v6", "ds", "IPv6", "[{name: http, port: 8080}]", "- {addresses: [\"fd00::5\"], nodeName: node-a}"),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let s = &t.snapshot;
    assert_eq!(
        route(s, &fe(s, "172.30.0.20", 80, IpProto::TCP).routes[0]),
        "- 10.1.0.5:8080"
    );
    assert_eq!(
        route(s, &fe(s, "fd00:30::20", 80, IpProto::TCP).routes[0]),
        "- [fd00::5]:8080(L)"
    );
    assert_eq!(
        route(s, &fe(s, "192.168.0.2", 30081, IpProto::TCP).routes[2]),
        "M 10.1.0.5:8080"
    );
    assert_eq!(
        route(s, &fe(s, "fd00:1::2", 30081, IpProto::TCP).routes[2]),
        "M [fd00::5]:8080(L)"
    );
    assert_eq!(
        route(s, &fe(s, "203.0.113.8", 80, IpProto::TCP).routes[2]),
        "M 10.1.0.5:8080"
    );
    assert_eq!(
        route(s, &fe(s, "2001:db8::8", 80, IpProto::TCP).routes[2]),
        "M [fd00::5]:8080(L)"
    );
    assert_eq!(s.cluster_ips.len(), 2);
    // One service port for both families.
    assert_eq!(s.service_ports.len(), 1);
    assert_eq!(s.frontends.len(), 6);

    // Single-stack v4 with a v6 externalIP: ignored, as in kube-proxy's per-family proxiers.
    let yaml = [
        service(
            "v4",
            "  clusterIP: 172.30.0.21\n  externalIPs: [\"2001:db8::9\"]\n  ports: [{port: 80}]",
        ),
        slice(
            "v4-6",
            "v4",
            "IPv6",
            "[{port: 8080}]",
            "- {addresses: [\"fd00::5\"]}",
        ),
    ]
    .concat();
    let t = tr(&cfg(""), &yaml);
    assert!(!has_fe(&t.snapshot, "2001:db8::9", 80, IpProto::TCP));
    // IPv6 endpoints never serve the IPv4 ClusterIP.
    assert_eq!(
        routes(
            &t.snapshot,
            fe(&t.snapshot, "172.30.0.21", 80, IpProto::TCP)
        )[0],
        "reject"
    );
}

fn lb(extra_spec: &str, ingress: &str, annotations: &str) -> String {
    format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: lb, namespace: ns{annotations}}}\nspec:\n  type: LoadBalancer\n  clusterIP: 172.30.0.30\n  ports: [{{name: http, port: 80, nodePort: 30090}}]\n{extra_spec}\nstatus:\n  loadBalancer:\n    ingress: {ingress}\n{}",
            web_slice("lb")
        )
}

#[test]
fn load_balancer_vips_and_ip_mode() {
    let t = tr(&cfg(""), &lb("", "[{ip: 198.51.100.1}, {ip: 198.51.100.2, ipMode: VIP}, {ip: 198.51.100.3, ipMode: Proxy}, {hostname: lb.example.com}]", ""));
    let s = &t.snapshot;
    let f = fe(s, "198.51.100.1", 80, IpProto::TCP);
    assert_eq!(f.kind, FrontendKind::LoadBalancer);
    assert!(f.source_ranges.is_none());
    assert_eq!(routes(s, f)[2], "M 10.1.0.1:8080,10.1.0.2:8080(L)");
    assert!(has_fe(s, "198.51.100.2", 80, IpProto::TCP));
    assert!(!has_fe(s, "198.51.100.3", 80, IpProto::TCP));
    assert!(has_fe(s, "192.168.0.2", 30090, IpProto::TCP));
    assert_eq!(s.frontends.len(), 4);
}

fn ranges(f: &Frontend) -> Vec<String> {
    let mut v: Vec<String> = f
        .source_ranges
        .as_ref()
        .unwrap()
        .iter()
        .map(|(a, l)| format!("{a}/{l}"))
        .collect();
    v.sort();
    v
}

#[test]
fn load_balancer_source_ranges() {
    let t = tr(
        &cfg(""),
        &lb(
            "  loadBalancerSourceRanges: [\" 203.0.113.0/24 \", \"2001:db8::/32\"]",
            "[{ip: 198.51.100.1}]",
            "",
        ),
    );
    let s = &t.snapshot;
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    assert_eq!(
        ranges(fe(s, "198.51.100.1", 80, IpProto::TCP)),
        ["203.0.113.0/24"]
    );
    // NodePorts and ClusterIPs are never filtered.
    assert!(fe(s, "192.168.0.2", 30090, IpProto::TCP)
        .source_ranges
        .is_none());
    assert!(fe(s, "172.30.0.30", 80, IpProto::TCP)
        .source_ranges
        .is_none());

    // A range containing the node's primary address also lets the VIPs in (hairpin).
    let t = tr(
        &cfg(""),
        &lb(
            "  loadBalancerSourceRanges: [192.168.0.0/16]",
            "[{ip: 198.51.100.1}, {ip: 198.51.100.2}]",
            "",
        ),
    );
    assert_eq!(
        ranges(fe(&t.snapshot, "198.51.100.1", 80, IpProto::TCP)),
        ["192.168.0.0/16", "198.51.100.1/32", "198.51.100.2/32"]
    );

    // Ranges of the other family only: this family is open.
    let t = tr(
        &cfg(""),
        &lb(
            "  loadBalancerSourceRanges: [\"2001:db8::/32\"]",
            "[{ip: 198.51.100.1}]",
            "",
        ),
    );
    assert!(fe(&t.snapshot, "198.51.100.1", 80, IpProto::TCP)
        .source_ranges
        .is_none());

    // The annotation when the field is empty; the field wins when both are set.
    let ann = ", annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: \"10.0.0.0/8, 172.16.0.0/12\"}";
    let t = tr(&cfg(""), &lb("", "[{ip: 198.51.100.1}]", ann));
    assert_eq!(
        ranges(fe(&t.snapshot, "198.51.100.1", 80, IpProto::TCP)),
        ["10.0.0.0/8", "172.16.0.0/12"]
    );
    let t = tr(
        &cfg(""),
        &lb(
            "  loadBalancerSourceRanges: [203.0.113.0/24]",
            "[{ip: 198.51.100.1}]",
            ann,
        ),
    );
    assert_eq!(
        ranges(fe(&t.snapshot, "198.51.100.1", 80, IpProto::TCP)),
        ["203.0.113.0/24"]
    );

    // Invalid entries are skipped and reported.
    let t = tr(
        &cfg(""),
        &lb(
            "  loadBalancerSourceRanges: [bogus, 203.0.113.0/24]",
            "[{ip: 198.51.100.1}]",
            "",
        ),
    );
    assert_eq!(
        ranges(fe(&t.snapshot, "198.51.100.1", 80, IpProto::TCP)),
        ["203.0.113.0/24"]
    );
    assert_eq!(t.problems.len(), 1);
    assert!(t.problems[0]
        .message
        .contains("loadBalancerSourceRanges[0]"));
}

fn annotated(algorithm: &str, spec: &str) -> String {
    format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: ns, annotations: {{service.kxdp.dev/lb-algorithm: {algorithm}}}}}\nspec:\n{spec}\n")
}

#[test]
fn lb_algorithm_annotation_and_default() {
    let np = "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]";
    let yaml = [annotated("maglev", np), web_slice("web")].concat();
    let t = tr(&cfg(""), &yaml);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let s = &t.snapshot;
    let cip = fe(s, "172.30.0.10", 80, IpProto::TCP);
    let node = fe(s, "192.168.0.2", 30080, IpProto::TCP);
    let m = cip.maglev.as_ref().expect("maglev tables");
    // One table per route list: the cluster list (2) and the local one (1), shared by the
    // Service port's frontends.
    assert!(Arc::ptr_eq(m, node.maglev.as_ref().unwrap()));
    let lists: Vec<(EndpointRange, usize)> = m.tables().map(|(r, t)| (r, t.len())).collect();
    assert_eq!(
        lists,
        [
            (EndpointRange { start: 0, len: 2 }, 251),
            (EndpointRange { start: 2, len: 1 }, 251)
        ]
    );
    for r in &node.routes {
        assert!(r.endpoints.is_empty() || m.table(r.endpoints).is_some());
    }
    // The lookup sees the tables through the frontend table's hot line.
    let key = FrontendKey {
        addr: Addr::from_ip("192.168.0.2".parse().unwrap()),
        port: 30080,
        proto: IpProto::TCP,
    };
    let r = s.frontend_ref(&key).unwrap();
    assert!(r.maglev().is_some());
    assert_eq!(r.route(SourceClass::External), node.routes[2]);

    // `random`, and no annotation: no tables.
    let yaml = [annotated("random", np), web_slice("web")].concat();
    let t = tr(&cfg(""), &yaml);
    assert!(fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        .maglev
        .is_none());
    assert!(t.problems.is_empty());
    let plain = [service("web", np), web_slice("web")].concat();
    let t = tr(&cfg(""), &plain);
    assert!(fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        .maglev
        .is_none());

    // The configured default applies without the annotation; the annotation overrides it.
    let mag = cfg("loadBalancing: {algorithm: maglev, maglevTableSize: 1021, maglevSeed: 42}");
    let t = tr(&mag, &plain);
    let m = fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        .maglev
        .clone()
        .unwrap();
    assert_eq!(m.seed(), kxdp_dataplane::maglev::seed_of("42"));
    let t = tr(&mag, &yaml);
    assert!(fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        .maglev
        .is_none());

    // A value that is neither: reported, and the configured default used.
    let bad = [annotated("ring-hash", np), web_slice("web")].concat();
    let t = tr(&cfg(""), &bad);
    assert!(fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        .maglev
        .is_none());
    assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
    assert_eq!(t.problems[0].object, "Service ns/web");
    assert_eq!(
            t.problems[0].message,
            "metadata.annotations[service.kxdp.dev/lb-algorithm]: `ring-hash` is not `maglev` or `random`; using the configured default, random"
        );
    let t = tr(&mag, &bad);
    assert!(fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP)
        .maglev
        .is_some());
    assert!(t.problems[0].message.ends_with("default, maglev"));
}

#[test]
fn session_affinity() {
    let cases = [
            ("", 0),
            ("  sessionAffinity: None\n", 0),
            ("  sessionAffinity: ClientIP\n", 10800),
            ("  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n", 60),
        ];
    for (extra, want) in cases {
        let t = tr(
            &cfg(""),
            &format!(
                "{}{}",
                service("web", &format!("{extra}{WEB}")),
                web_slice("web")
            ),
        );
        let f = fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP);
        assert_eq!(svc_port(&t.snapshot, f).affinity_timeout_s, want, "{extra}");
    }
}

#[test]
fn service_cidrs_from_objects() {
    let yaml = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: extra}\nspec: {cidrs: [172.31.0.0/16, \"fd00:31::/108\", nope]}\n";
    let t = tr(&cfg(""), yaml);
    let s = &t.snapshot;
    let v4 = kxdp_packet::Family::V4;
    assert!(s
        .service_cidrs
        .contains(&Addr::from_ip("172.30.1.1".parse().unwrap()), v4));
    assert!(s
        .service_cidrs
        .contains(&Addr::from_ip("172.31.1.1".parse().unwrap()), v4));
    assert!(s.service_cidrs.contains(
        &Addr::from_ip("fd00:31::1".parse().unwrap()),
        kxdp_packet::Family::V6
    ));
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].object, "ServiceCIDR extra");
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-1}}
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: InternalIP, address: 192.168.0.5}
  - {type: InternalIP, address: \"fd00:1::5\"}
  - {type: ExternalIP, address: 198.51.100.50}
";

#[test]
fn node_addresses_from_node_object() {
    let c = Config::from_yaml_str(
        "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\n",
        Path::new("c.yaml"),
    )
    .unwrap();
    let t = tr(&c, NODE);
    let n = &t.snapshot.node;
    assert_eq!(
        n.snat_v4,
        Some(Addr::from_ip("192.168.0.5".parse().unwrap()))
    );
    assert_eq!(n.snat_v6, Some(Addr::from_ip("fd00:1::5".parse().unwrap())));
    assert_eq!(n.addrs.len(), 3);
    assert!(t.problems.is_empty());
    // Config nodeIPs win over the Node object.
    let t = tr(&cfg(""), NODE);
    assert_eq!(
        t.snapshot.node.snat_v4,
        Some(Addr::from_ip("192.168.0.2".parse().unwrap()))
    );
    // No Node, no nodeIPs: reported.
    let t = tr(&c, "");
    assert!(t.snapshot.node.addrs.is_empty());
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].object, "Node node-a");
}

#[test]
fn topology_hints_use_node_zone() {
    let yaml = [
            NODE,
            &service("web", WEB),
            &slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], hints: {forZones: [{name: zone-1}]}}\n- {addresses: [10.1.0.2], hints: {forZones: [{name: zone-2}]}}",
            ),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    assert_eq!(
        route(
            &t.snapshot,
            &fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP).routes[0]
        ),
        "- 10.1.0.1:8080"
    );
    // Node hints (PreferSameNode) with the gate on, ignored with it off.
    let yaml = [
            NODE,
            &service("web", WEB),
            &slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], nodeName: node-b, hints: {forNodes: [{name: node-b}], forZones: [{name: zone-1}]}}\n- {addresses: [10.1.0.2], nodeName: node-a, hints: {forNodes: [{name: node-a}], forZones: [{name: zone-1}]}}",
            ),
        ]
        .concat();
    let t = tr(&cfg(""), &yaml);
    assert_eq!(
        route(
            &t.snapshot,
            &fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP).routes[0]
        ),
        "- 10.1.0.2:8080(L)"
    );
    let t = tr(
        &cfg("featureGates: {PreferSameTrafficDistribution: false}\n"),
        &yaml,
    );
    assert_eq!(
        route(
            &t.snapshot,
            &fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP).routes[0]
        ),
        "- 10.1.0.1:8080,10.1.0.2:8080(L)"
    );
}

#[test]
fn frontend_collisions_first_wins() {
    let yaml = [
        service(
            "a",
            "  clusterIP: 172.30.0.40\n  externalIPs: [203.0.113.9]\n  ports: [{port: 80}]",
        ),
        service(
            "b",
            "  clusterIP: 172.30.0.41\n  externalIPs: [203.0.113.9]\n  ports: [{port: 80}]",
        ),
    ]
    .concat();
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    assert_eq!(
        &*svc_port(s, fe(s, "203.0.113.9", 80, IpProto::TCP)).name,
        "ns/a"
    );
    assert_eq!(t.problems.len(), 1);
    assert_eq!(t.problems[0].object, "Service ns/b");
}

#[test]
fn identical_endpoint_lists_share_a_range() {
    // All endpoints local: the cluster and local lists are the same list.
    let yaml = format!(
            "{}{}",
            service("web", "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]"),
            slice("web-1", "web", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.1.0.2], nodeName: node-a}")
        );
    let t = tr(&cfg(""), &yaml);
    let f = fe(&t.snapshot, "172.30.0.10", 80, IpProto::TCP);
    assert_eq!(f.endpoints.len(), 1);
    assert_eq!(f.routes[0].endpoints, f.routes[2].endpoints);
}

#[test]
fn service_port_ids_are_stable() {
    // Fixed values: a change here breaks conntrack continuity across upgrades.
    // FNV-1a of "ns1\0svc1\0http\0TCP".
    assert_eq!(service_port_id("ns1", "svc1", "http", "TCP"), 0x8475_dff9);
    assert_eq!(
        service_port_id("kube-system", "kube-dns", "dns", "UDP"),
        0x87df_58a9
    );
    assert_ne!(
        service_port_id("ns1", "svc1", "http", "TCP"),
        service_port_id("ns1", "svc1", "http", "UDP")
    );
    assert_ne!(
        service_port_id("ns1", "svc1", "", "TCP"),
        service_port_id("ns1", "svc", "1", "TCP")
    );
    assert_ne!(service_port_id("a", "b", "c", "TCP"), 0);
}

#[test]
fn examples_translate_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let config = Config::load(&root.join("config.yaml")).unwrap();
    let state = crate::sources::files::load_state(&root.join("cluster")).unwrap();
    let t = translate(&config, &state);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    let s = &t.snapshot;
    s.validate().unwrap();
    // web: 2 ready endpoints (the terminating one is not used while ready ones exist).
    assert_eq!(
        routes(s, fe(s, "172.30.0.10", 80, IpProto::TCP))[0],
        "- 10.0.1.10:8080(L),10.0.2.10:8080"
    );
    assert_eq!(
        routes(s, fe(s, "192.168.0.2", 30080, IpProto::TCP))[2],
        "- 10.0.1.20:8080(L)"
    );
    assert!(
        has_fe(s, "fd00:30::30", 9000, IpProto::TCP) && has_fe(s, "172.30.0.30", 53, IpProto::UDP)
    );
    assert!(fe(s, "192.0.2.10", 443, IpProto::TCP)
        .source_ranges
        .is_some());
    assert_eq!(
        svc_port(s, fe(s, "172.30.0.50", 80, IpProto::TCP)).affinity_timeout_s,
        1800
    );
    assert_eq!(
        routes(s, fe(s, "172.30.0.60", 3000, IpProto::TCP))[0],
        "reject"
    );
    assert_eq!(s.cluster_ips.len(), 7);
}

#[test]
fn ip_frontends_win_over_node_ports() {
    let yaml = [
        service(
            "a",
            "  type: NodePort\n  clusterIP: 172.30.0.40\n  ports: [{port: 80, nodePort: 30000}]",
        ),
        service(
            "b",
            "  clusterIP: 172.30.0.41\n  externalIPs: [192.168.0.2]\n  ports: [{port: 30000}]",
        ),
    ]
    .concat();
    let t = tr(&cfg(""), &yaml);
    let s = &t.snapshot;
    let f = fe(s, "192.168.0.2", 30000, IpProto::TCP);
    assert_eq!(f.kind, FrontendKind::ExternalIp);
    assert_eq!(&*svc_port(s, f).name, "ns/b");
    // Besides addr_guard's report of the externalIP on the node's address.
    assert_eq!(t.problems.len(), 2);
    assert!(t.problems.iter().any(|p| p.object == "Service ns/a"));
}
