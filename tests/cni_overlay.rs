//! The two-node CNI lab (tests/cni/mod.rs) with the nodes' pod ranges joined by an overlay
//! instead of plain routes: VXLAN as flannel builds it (`flannel.1`, VNI 1, port 8472, and
//! `flannel-v6.1`), VXLAN as Calico builds it (`vxlan.calico`, VNI 4096, port 4789), and a tun
//! device with a userspace relay (a device of no particular kind, standing in for an
//! encrypting tunnel). kxdp runs with the flannel preset's interfaces (`[eth0, "veth*"]`): it
//! owns none of the overlay devices. What it routes through them leaves through the kernel
//! (the host path's kernel port) and what the kernel receives on them is steered back to kxdp
//! (`hostPath.overlayInterfaces`), so every behaviour of the routed lab holds.
//!
//! One test per overlay runs every behaviour on one lab (a lab and two kxdp take seconds to
//! build): ClusterIP with endpoints on the other node (TCP, UDP, client address kept), NodePort
//! on node-a served by node-b (masqueraded), externalTrafficPolicy Local, pod to pod both ways,
//! the node's own processes to a ClusterIP, NetworkPolicy on the destination node, a pod
//! created after start, and IPv6 where the overlay carries it.

mod cni;
mod lab;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cni::{sa, tcp, udp, Lab, Underlay, EXT4, TCP_PORT, UDP_PORT};

const T: Duration = Duration::from_secs(3);

/// A NetworkPolicy on `app=guarded` pods: only `role=frontend` pods are admitted.
const POLICY: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: guarded-from-frontend, namespace: lab}
spec:
  podSelector: {matchLabels: {app: guarded}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: frontend}}
---
";

fn overlay_behaviours(test: &str, underlay: Underlay, ipv6: bool) {
    overlay_behaviours_with(test, underlay, ipv6, "");
}

/// [`overlay_behaviours`] with `extra` appended to both nodes' configuration.
fn overlay_behaviours_with(test: &str, underlay: Underlay, ipv6: bool, extra: &str) {
    let mut lab = Lab::build_over(test, underlay);
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod(
        "node-a",
        "front-a",
        &[("app", "client"), ("role", "frontend")],
    );
    lab.add_pod("node-b", "web-b1", &[("app", "web")]);
    lab.add_pod("node-b", "web-b2", &[("app", "web")]);
    lab.add_pod("node-b", "client-b", &[("app", "client")]);
    lab.add_pod("node-b", "guarded-b", &[("app", "guarded")]);
    lab.warm_neighbours();
    let objects = lab.service("web", 10, "web", Some(30080), false)
        + &lab.service("web-local", 11, "web", Some(30081), true)
        + POLICY;
    let config = |node: &str| lab.kxdp_config(node, false) + extra;
    let a = lab.start_kxdp("node-a", &config("node-a"), &objects);
    let b = lab.start_kxdp("node-b", &config("node-b"), &objects);
    lab.warm_neighbours();
    let logs = || format!("node-a:\n{}\nnode-b:\n{}", a.log(), b.log());

    // A pod on node-a → a ClusterIP whose endpoints are on node-b, over the overlay.
    let c = lab.pod("client-a");
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let ans = tcp(&c.ns, sa([172, 30, 0, 10], 80), T, 100_000)
            .unwrap_or_else(|e| panic!("{underlay:?}: pod -> ClusterIP: {e}\n{}", logs()));
        assert_eq!(ans.peer, IpAddr::from(c.ip4), "client address kept");
        served.insert(ans.server);
        let ans = udp(&c.ns, sa([172, 30, 0, 10], 53), Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{underlay:?}: pod -> ClusterIP UDP: {e}\n{}", logs()));
        assert_eq!(ans.peer, IpAddr::from(c.ip4));
        served.insert(ans.server);
    }
    assert!(
        served.iter().all(|s| s == "web-b1" || s == "web-b2"),
        "{served:?}"
    );

    // Pod to pod across nodes, both ways, TCP and UDP.
    for (client, server) in [("client-a", "web-b1"), ("client-b", "client-a")] {
        let (c, s) = (lab.pod(client), lab.pod(server));
        let ans = tcp(&c.ns, sa(s.ip4, TCP_PORT), T, 100_000)
            .unwrap_or_else(|e| panic!("{underlay:?}: {client} -> {server}: {e}\n{}", logs()));
        assert_eq!(
            (ans.server.as_str(), ans.peer),
            (server, IpAddr::from(c.ip4))
        );
        let ans = udp(&c.ns, sa(s.ip4, UDP_PORT), Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{underlay:?}: {client} -> {server} UDP: {e}"));
        assert_eq!(ans.peer, IpAddr::from(c.ip4));
    }

    // The external host → a NodePort on node-a, served by node-b's pods (masqueraded).
    let node_a = lab.node("node-a").ip4;
    for _ in 0..3 {
        let ans = tcp(&lab.ext, sa(node_a, 30080), T, 50_000)
            .unwrap_or_else(|e| panic!("{underlay:?}: NodePort across nodes: {e}\n{}", logs()));
        assert!(ans.server.starts_with("web-b"), "{ans:?}");
        assert_eq!(ans.peer, IpAddr::from(node_a), "masqueraded to node-a");
    }
    // externalTrafficPolicy Local: served on node-b with the client's address.
    let node_b = lab.node("node-b").ip4;
    let ans = tcp(&lab.ext, sa(node_b, 30081), T, 20_000).expect("eTP Local on node-b");
    assert_eq!(ans.peer, IpAddr::from(EXT4), "client address kept");

    // The node's own process → the ClusterIP (the host path, then the overlay).
    let ans = tcp(&lab.node("node-a").ns, sa([172, 30, 0, 10], 80), T, 10_000)
        .unwrap_or_else(|e| panic!("{underlay:?}: node -> ClusterIP: {e}\n{}", logs()));
    assert!(ans.server.starts_with("web-b"));

    // NetworkPolicy on node-b judges what the overlay brings: front-a admitted, client-a
    // dropped (it times out, no RST).
    let guarded = lab.pod("guarded-b").ip4;
    let front = lab.pod("front-a");
    let ans = tcp(&front.ns, sa(guarded, TCP_PORT), T, 1_000)
        .unwrap_or_else(|e| panic!("{underlay:?}: frontend admitted: {e}\n{}", logs()));
    assert_eq!(ans.peer, IpAddr::from(front.ip4));
    let t0 = Instant::now();
    let e = tcp(&c.ns, sa(guarded, TCP_PORT), Duration::from_secs(2), 0).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "{underlay:?}: denied across the overlay: {e}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(2));

    if ipv6 {
        let vip: SocketAddr = "[fd00:30::a]:80".parse().unwrap();
        let ans = tcp(&c.ns, vip, T, 50_000)
            .unwrap_or_else(|e| panic!("{underlay:?}: IPv6 ClusterIP: {e}\n{}", logs()));
        assert!(ans.server.starts_with("web-b"), "{ans:?}");
        assert_eq!(ans.peer, IpAddr::from(c.ip6));
        let w = lab.pod("web-b1");
        let ans = tcp(&c.ns, sa(w.ip6, TCP_PORT), T, 20_000).expect("IPv6 pod to pod");
        assert_eq!(ans.peer, IpAddr::from(c.ip6));
    }

    // A pod created after start on node-a reaches the remote endpoints and is reached from
    // node-b.
    lab.add_pod("node-a", "late-a", &[("app", "client")]);
    let late = lab.pod("late-a");
    let (late_ns, late_ip) = (late.ns.clone(), late.ip4);
    let mut last = None;
    let ok = lab::wait_until(Duration::from_secs(5), || {
        last = Some(tcp(
            &late_ns,
            sa([172, 30, 0, 10], 80),
            Duration::from_millis(500),
            100,
        ));
        last.as_ref().is_some_and(|r| r.is_ok())
    });
    assert!(
        ok,
        "{underlay:?}: a new pod -> ClusterIP: {last:?}\n{}",
        logs()
    );
    let ans = tcp(&lab.pod("client-b").ns, sa(late_ip, TCP_PORT), T, 1_000)
        .unwrap_or_else(|e| panic!("{underlay:?}: node-b -> the new pod: {e}\n{}", logs()));
    assert_eq!(ans.server, "late-a");

    // The return path is kxdp's: the overlay rule is in place and nothing was dropped for want
    // of an egress.
    let rules = lab::sh(&lab.node("node-a").ns, "ip rule show");
    let dev = match underlay {
        Underlay::FlannelVxlan => "flannel.1",
        Underlay::CalicoVxlan => "vxlan.calico",
        Underlay::Tun => cni::TUN_DEVICE,
        Underlay::Routes => unreachable!(),
    };
    assert!(
        rules.contains(&format!("iif {dev} lookup 27513 proto 107")),
        "{rules}"
    );
    drop((a, b));
    let rules = lab::sh(&lab.node("node-a").ns, "ip rule show");
    assert!(!rules.contains(dev), "removed on exit: {rules}");
}

#[test]
fn kxdp_over_flannel_vxlan() {
    overlay_behaviours("kxdp_over_flannel_vxlan", Underlay::FlannelVxlan, true);
}

/// The pods through kxdp's tap, traffic between pods routed directly onto the VXLAN device.
#[test]
fn kxdp_over_flannel_vxlan_in_tap_mode() {
    overlay_behaviours_with(
        "kxdp_over_flannel_vxlan_in_tap_mode",
        Underlay::FlannelVxlan,
        true,
        "podInterception: {mode: tap}\n",
    );
}

#[test]
fn kxdp_over_calico_vxlan() {
    overlay_behaviours("kxdp_over_calico_vxlan", Underlay::CalicoVxlan, false);
}

#[test]
fn kxdp_over_a_tun_device() {
    overlay_behaviours("kxdp_over_a_tun_device", Underlay::Tun, true);
}
