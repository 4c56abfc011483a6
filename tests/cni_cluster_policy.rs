//! ClusterNetworkPolicy on the two-node CNI lab (tests/cni/mod.rs), real sockets in real pods:
//! the cluster administrator's tiers around the namespace owner's NetworkPolicy, judged by
//! kxdp on both nodes (ingress on the destination's node, egress on the source's).
//!
//! | pod | node | labels |
//! | --- | --- | --- |
//! | web-a1 | node-a | app=web-a |
//! | client-a | node-a | app=client |
//! | front-a | node-a | app=client, role=frontend |
//! | web-b1, web-b2 | node-b | app=web |
//! | client-b | node-b | app=client |
//!
//! The namespace owner opens the web pods to everyone (a NetworkPolicy admitting all ingress);
//! an Admin-tier policy still denies `app=client` pods other than frontends, which that
//! NetworkPolicy cannot override. A Baseline-tier policy denies `app=client` pods egress to
//! web-a1's address (an inline CIDR); a NetworkPolicy selecting the frontends for egress
//! overrides it for them. Every wait is bounded.

mod cni;
mod lab;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cni::{sa, tcp, udp, KxdpNode, Lab, TCP_PORT, UDP_PORT};

const T: Duration = Duration::from_secs(3);
const CLUSTER_IP: [u8; 4] = [172, 30, 0, 10];

/// The namespace owner's NetworkPolicies: the web pods open to all; the frontends may send
/// anywhere.
const NAMESPACE_OWNER: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-open-to-all, namespace: lab}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress: [{}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: frontends-send-anywhere, namespace: lab}
spec:
  podSelector: {matchLabels: {role: frontend}}
  policyTypes: [Egress]
  egress: [{}]
---
";

/// The Admin tier's guard on the web pods: frontends accepted (the first rule), other clients
/// denied, on both protocols.
const ADMIN_GUARD: &str = "apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: web-guard}
spec:
  tier: Admin
  priority: 10
  subject:
    pods:
      namespaceSelector: {}
      podSelector: {matchLabels: {app: web}}
  ingress:
  - action: Accept
    from:
    - pods:
        namespaceSelector: {}
        podSelector: {matchLabels: {role: frontend}}
  - action: Deny
    from:
    - pods:
        namespaceSelector: {}
        podSelector: {matchLabels: {app: client}}
---
";

/// The Baseline tier: clients may not send to web-a1's address (an inline CIDR).
fn baseline_egress(web_a1: IpAddr) -> String {
    format!(
        "apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {{name: clients-not-to-web-a1}}
spec:
  tier: Baseline
  priority: 10
  subject:
    pods:
      namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: lab}}}}
      podSelector: {{matchLabels: {{app: client}}}}
  egress:
  - action: Deny
    to:
    - networks: [\"{web_a1}/32\"]
---
"
    )
}

fn objects(lab: &Lab, admin: bool) -> String {
    let mut s = lab.service("web", 10, "web", Some(30080), false) + NAMESPACE_OWNER;
    if admin {
        s += ADMIN_GUARD;
    }
    s + &baseline_egress(IpAddr::from(lab.pod("web-a1").ip4))
}

/// A TCP connection from `from` to `to` is dropped (no answer, no reset: it times out).
#[track_caller]
fn denied(lab: &Lab, from: &str, to: SocketAddr) {
    let t0 = Instant::now();
    let e = tcp(&lab.pod(from).ns, to, Duration::from_secs(2), 0)
        .err()
        .unwrap_or_else(|| panic!("{from} -> {to}: answered, should be denied"));
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "{from} -> {to}: denied means dropped, it times out: {e}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(2));
}

/// A TCP connection from `from` to `to` is answered by a pod in `servers`, which sees `from`'s
/// own address.
#[track_caller]
fn allowed(lab: &Lab, from: &str, to: SocketAddr, servers: &[&str]) {
    let p = lab.pod(from);
    let a = tcp(&p.ns, to, T, 10_000).unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
    assert!(
        servers.contains(&a.server.as_str()),
        "{from} -> {to}: served by {}",
        a.server
    );
    assert_eq!(a.peer, IpAddr::from(p.ip4), "{from} -> {to}: address kept");
}

fn published(k: &KxdpNode) -> usize {
    k.log().matches("kxdp_control::sync: published").count()
}

/// The Admin tier overrides the namespace owner's NetworkPolicy on the destination node; the
/// Baseline tier applies on the source node where no NetworkPolicy selects the client, and
/// yields to one that does; removing the Admin policy opens the web pods to new connections.
#[test]
fn cluster_network_policy_tiers_across_nodes() {
    let lab = Lab::two_node_pods("cluster_network_policy_tiers_across_nodes");
    let cfg = |node: &str| {
        lab.kxdp_config(node, false).replace(
            "metricsBindAddress: \"\"",
            "metricsBindAddress: 127.0.0.1:10249",
        )
    };
    let a = lab.start_kxdp("node-a", &cfg("node-a"), &objects(&lab, true));
    let b = lab.start_kxdp("node-b", &cfg("node-b"), &objects(&lab, true));
    lab.warm_neighbours();
    for k in [&a, &b] {
        assert!(
            !k.log()
                .lines()
                .any(|l| l.contains("WARN") && l.contains("ClusterNetworkPolicy")),
            "the policies are read without a warning:\n{}",
            k.log()
        );
    }
    let webs = ["web-b1", "web-b2"];
    let (web_b1, web_a1) = (lab.pod("web-b1").ip4, lab.pod("web-a1").ip4);

    // Admin Deny on node-b, whatever the NetworkPolicy admits: directly and through the
    // ClusterIP, from node-a and from node-b itself; the frontend is accepted by the earlier rule.
    denied(&lab, "client-a", sa(web_b1, TCP_PORT));
    denied(&lab, "client-a", sa(CLUSTER_IP, 80));
    denied(&lab, "client-b", sa(web_b1, TCP_PORT));
    allowed(&lab, "front-a", sa(web_b1, TCP_PORT), &["web-b1"]);
    allowed(&lab, "front-a", sa(CLUSTER_IP, 80), &webs);
    // The Admin Deny covers UDP too (no protocols: every port).
    assert!(
        udp(
            &lab.pod("client-a").ns,
            sa(web_b1, UDP_PORT),
            Duration::from_millis(800)
        )
        .is_err(),
        "client-a -> web-b1 UDP denied"
    );
    // Counted per rule on node-b: the Deny rule at least the three TCP connections and the UDP
    // one (a denied SYN's retransmission is judged, and counted, again), the Accept rule the
    // frontend's two.
    let guard = |rule: &str, verdict: &str| {
        cni::metric(
            &lab.node("node-b").ns,
            &format!(
                "kxdp_policy_connections_total{{kind=\"ClusterNetworkPolicy\",policy=\"web-guard\",direction=\"ingress\",rule=\"{rule}\",verdict=\"{verdict}\"}}"
            ),
        )
    };
    assert!(guard("1", "deny") >= 4, "{}", guard("1", "deny"));
    assert!(guard("0", "allow") >= 2, "{}", guard("0", "allow"));

    // Baseline Deny to web-a1 on the source's node: client-b (node-b) and client-a (node-a)
    // cannot reach it; front-a can, a NetworkPolicy selects it for egress.
    denied(&lab, "client-b", sa(web_a1, TCP_PORT));
    denied(&lab, "client-a", sa(web_a1, TCP_PORT));
    allowed(&lab, "front-a", sa(web_a1, TCP_PORT), &["web-a1"]);
    // Pods no cluster policy selects are untouched.
    allowed(&lab, "web-a1", sa(web_b1, TCP_PORT), &["web-b1"]);

    // The Admin policy removed, live: the namespace owner's NetworkPolicy admits client-a.
    for k in [&a, &b] {
        let before = published(k);
        lab.update_state(k, &objects(&lab, false));
        assert!(
            lab::wait_until(Duration::from_secs(30), || published(k) > before),
            "kxdp did not publish the new state within 30 s:\n{}",
            k.log()
        );
    }
    allowed(&lab, "client-a", sa(web_b1, TCP_PORT), &["web-b1"]);
    allowed(&lab, "client-a", sa(CLUSTER_IP, 80), &webs);
    // The Baseline policy stays.
    denied(&lab, "client-b", sa(web_a1, TCP_PORT));
    drop((a, b));
}
