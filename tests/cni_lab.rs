//! The two-node CNI lab (tests/cni/mod.rs): pods made by the real CNI reference plugins (`ptp` on
//! node-a, `bridge` on node-b, `host-local` IPAM, dual-stack, `ipMasq: true`), an external host.
//!
//! `baseline_*`: no kxdp; the lab itself is right (the kernel forwards, the CNI masquerades).
//! `kxdp_*`: `kxdp run` on both nodes: Services, NodePorts, policy, the node's own traffic,
//! and the DaemonSet's shape (interfaces by pattern: pods created and deleted while kxdp runs).

mod cni;
mod lab;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni::{in_ns, sa, tcp, udp, Lab, Load, EXT4, EXT6, TCP_PORT, UDP_PORT};

const T: Duration = Duration::from_secs(3);

fn fam(v6: bool) -> &'static str {
    if v6 {
        "IPv6"
    } else {
        "IPv4"
    }
}

// ---------------------------------------------------------------------------------------------
// Baseline: no kxdp.
// ---------------------------------------------------------------------------------------------

/// What the plugins built is what a real node has: ptp gives each pod a host-side veth with a
/// /32 (and /128) route; bridge enslaves the pod's veth to cni0 and routes the pod range to it;
/// both installed their masquerade rules in the node's namespace.
#[test]
fn baseline_cni_layout() {
    let lab = Lab::two_node_pods("baseline_cni_layout");
    let a = lab.node("node-a");
    let b = lab.node("node-b");
    let web_a = lab.pod("web-a1");
    let routes = lab::ip(&a.ns, "route show");
    assert!(
        routes.contains(&format!("{} dev {}", web_a.ip4, web_a.host_if)),
        "ptp: a /32 route per pod: {routes}"
    );
    let routes6 = lab::ip(&a.ns, "-6 route show");
    assert!(
        routes6.contains(&format!("{} dev {}", web_a.ip6, web_a.host_if)),
        "ptp: a /128 route per pod: {routes6}"
    );
    let web_b = lab.pod("web-b1");
    let link = lab::ip(&b.ns, &format!("-d link show dev {}", web_b.host_if));
    assert!(link.contains("master cni0"), "bridge: veth on cni0: {link}");
    let routes = lab::ip(&b.ns, "route show");
    assert!(
        routes.contains("10.77.2.0/24 dev cni0"),
        "bridge: pod range on cni0: {routes}"
    );
    for n in [a, b] {
        let nat = lab::run(
            "ip",
            &["netns", "exec", &n.ns, "iptables-save", "-t", "nat"],
        );
        assert!(nat.contains("-j MASQUERADE"), "ipMasq rules: {nat}");
        let nat6 = lab::run(
            "ip",
            &["netns", "exec", &n.ns, "ip6tables-save", "-t", "nat"],
        );
        assert!(
            nat6.contains("-j MASQUERADE"),
            "ipMasq rules (IPv6): {nat6}"
        );
    }
}

/// Pod to pod on each node and across nodes, IPv4 and IPv6, TCP and UDP: every pair answers and
/// the server sees the client pod's own address.
#[test]
fn baseline_pod_to_pod_same_node_and_across_nodes() {
    let lab = Lab::two_node_pods("baseline_pod_to_pod_same_node_and_across_nodes");
    for client in ["client-a", "client-b"] {
        for server in ["web-a1", "web-b1", "web-b2"] {
            for v6 in [false, true] {
                let (c, s) = (lab.pod(client), lab.pod(server));
                let a = tcp(&c.ns, sa(s.ip(v6), TCP_PORT), T, 20_000)
                    .unwrap_or_else(|e| panic!("{client} -> {server} TCP {}: {e}", fam(v6)));
                assert_eq!(a.server, server);
                assert_eq!(a.peer, c.ip(v6), "{client} -> {server}: not masqueraded");
                let a = udp(&c.ns, sa(s.ip(v6), UDP_PORT), Duration::from_secs(1))
                    .unwrap_or_else(|e| panic!("{client} -> {server} UDP {}: {e}", fam(v6)));
                assert_eq!((a.server.as_str(), a.peer), (server, c.ip(v6)));
            }
        }
    }
}

/// A pod reaches the external host, which sees the node's address (the CNI's masquerade).
#[test]
fn baseline_pod_to_external_masqueraded_by_the_cni() {
    let mut lab = Lab::two_node_pods("baseline_pod_to_external_masqueraded_by_the_cni");
    lab.ext_servers();
    for (client, node) in [("client-a", "node-a"), ("client-b", "node-b")] {
        for (v6, ext) in [(false, IpAddr::from(EXT4)), (true, IpAddr::from(EXT6))] {
            let c = lab.pod(client);
            let a = tcp(&c.ns, sa(ext, TCP_PORT), T, 10_000)
                .unwrap_or_else(|e| panic!("{client} -> ext {}: {e}", fam(v6)));
            assert_eq!(a.server, "ext");
            assert_eq!(
                a.peer,
                lab.node(node).ip(v6),
                "{client}: the node's address"
            );
            let a = udp(&c.ns, sa(ext, UDP_PORT), Duration::from_secs(1)).unwrap();
            assert_eq!(a.peer, lab.node(node).ip(v6));
        }
    }
}

/// Pods created and deleted (CNI ADD / DEL) while a client on node-a keeps sending requests to
/// whichever server pods exist: 10 replacements alternating between the nodes, every request
/// answered, DEL cleaning up each pod's interface, rules and address.
#[test]
fn baseline_pods_replaced_under_continuous_requests() {
    let mut lab = Lab::build("baseline_pods_replaced_under_continuous_requests");
    lab.add_pod("node-a", "client", &[("app", "client")]);
    lab.add_pod("node-a", "srv-0", &[("app", "srv")]);
    lab.add_pod("node-b", "srv-1", &[("app", "srv")]);
    lab.warm_neighbours();
    let target = |lab: &Lab, p: &str| sa(lab.pod(p).ip4, TCP_PORT);
    let load = Load::start(
        &lab.pod("client").ns,
        vec![target(&lab, "srv-0"), target(&lab, "srv-1")],
    );
    let t0 = Instant::now();
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for i in 0..10 {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        let new = format!("srv-{}", i + 2);
        let t = Instant::now();
        lab.add_pod(node, &new, &[("app", "srv")]);
        adds.push(t.elapsed());
        load.add(target(&lab, &new));
        std::thread::sleep(Duration::from_millis(150));
        let old = format!("srv-{i}");
        load.retire(target(&lab, &old));
        let t = Instant::now();
        lab.delete_pod(&old);
        dels.push(t.elapsed());
    }
    adds.sort();
    dels.sort();
    eprintln!(
        "pod creation (netns + CNI ADD + servers) min/median/max {:?}/{:?}/{:?}; \
         deletion (CNI DEL + checks + netns) {:?}/{:?}/{:?}",
        adds[0], adds[5], adds[9], dels[0], dels[5], dels[9]
    );
    std::thread::sleep(Duration::from_millis(200));
    let log = load.finish();
    let failed: Vec<_> = log.iter().filter(|(_, r)| r.is_err()).collect();
    eprintln!(
        "{} requests in {:?} over 10 replacements, {} failed",
        log.len(),
        t0.elapsed(),
        failed.len()
    );
    assert!(log.len() >= 50, "requests kept flowing: {}", log.len());
    assert!(failed.is_empty(), "every request answered: {failed:?}");
    // Each answer came from the pod that owned the address, seeing the client's own address.
    let client = lab.pod("client").ip4;
    assert!(log
        .iter()
        .all(|(_, r)| r.as_ref().map(|a| a.peer == IpAddr::from(client)).unwrap()));
}

// ---------------------------------------------------------------------------------------------
// With kxdp on both nodes, every interface listed at startup.
// ---------------------------------------------------------------------------------------------

struct Running {
    lab: Lab,
    a: cni::KxdpNode,
    b: cni::KxdpNode,
}

/// The Services of the kxdp tests:
/// - `web` 172.30.0.10 / fd00:30::a, NodePort 30080 (TCP) / 31080 (UDP): web-b1, web-b2 on node-b;
/// - `web-local` 172.30.0.11, NodePort 30081 / 31081, externalTrafficPolicy Local: same pods.
fn services(lab: &Lab) -> String {
    lab.service("web", 10, "web", Some(30080), false)
        + &lab.service("web-local", 11, "web", Some(30081), true)
}

fn start_both(lab: Lab, extra: &str) -> Running {
    start_both_configured(lab, extra, "")
}

/// [`start_both`] with `config` appended to both nodes' configuration.
fn start_both_configured(lab: Lab, extra: &str, config: &str) -> Running {
    let objects = services(&lab) + extra;
    // Without cni0: the kernel refuses XDP on a bridge port once the bridge has a program, so
    // listing the bridge would keep pods created later off kxdp (docs/afxdp.md).
    let a = lab.start_kxdp(
        "node-a",
        &(lab.kxdp_config("node-a", false) + config),
        &objects,
    );
    let b = lab.start_kxdp(
        "node-b",
        &(lab.kxdp_config("node-b", false) + config),
        &objects,
    );
    lab.warm_neighbours();
    Running { lab, a, b }
}

fn kxdp_lab(test: &str) -> Running {
    start_both(Lab::two_node_pods(test), "")
}

/// A pod on node-a reaches a ClusterIP whose endpoints live on node-b: the endpoint sees the
/// client pod's address (no masquerade for pod traffic) and the replies are un-NATed on node-a
/// (TCP connects to the ClusterIP; the UDP socket is connected to it).
#[test]
fn kxdp_clusterip_endpoints_on_the_other_node() {
    let r = kxdp_lab("kxdp_clusterip_endpoints_on_the_other_node");
    let c = r.lab.pod("client-a");
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let a = tcp(&c.ns, sa([172, 30, 0, 10], 80), T, 100_000).expect("TCP via ClusterIP");
        assert_eq!(a.peer, IpAddr::from(c.ip4), "client address kept");
        served.insert(a.server);
        let a = udp(&c.ns, sa([172, 30, 0, 10], 53), Duration::from_secs(1)).expect("UDP");
        assert_eq!(a.peer, IpAddr::from(c.ip4));
        served.insert(a.server);
    }
    assert!(
        served.iter().all(|s| s == "web-b1" || s == "web-b2"),
        "{served:?}"
    );
    drop(r);
}

/// The external host connects to a NodePort on node-a; the only endpoints are on node-b: node-a
/// masquerades (the pod sees node-a's address) and the replies come back through node-a.
#[test]
fn kxdp_nodeport_on_a_served_by_a_pod_on_b() {
    let r = kxdp_lab("kxdp_nodeport_on_a_served_by_a_pod_on_b");
    let node_a = r.lab.node("node-a").ip4;
    for _ in 0..4 {
        let a = tcp(&r.lab.ext, sa(node_a, 30080), T, 50_000).expect("NodePort TCP");
        assert!(a.server.starts_with("web-b"), "{a:?}");
        assert_eq!(a.peer, IpAddr::from(node_a), "masqueraded to node-a");
    }
    let a = udp(&r.lab.ext, sa(node_a, 31080), Duration::from_secs(1)).expect("NodePort UDP");
    assert_eq!(a.peer, IpAddr::from(node_a));
}

/// externalTrafficPolicy Local: node-a has no local endpoint and drops (the client times out);
/// node-b has them and keeps the client's address.
#[test]
fn kxdp_external_traffic_policy_local() {
    let r = kxdp_lab("kxdp_external_traffic_policy_local");
    let (a, b) = (r.lab.node("node-a").ip4, r.lab.node("node-b").ip4);
    let e = tcp(&r.lab.ext, sa(a, 30081), Duration::from_secs(2), 0).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "dropped on the node without a local endpoint (no RST): {e}"
    );
    for _ in 0..3 {
        let ans = tcp(&r.lab.ext, sa(b, 30081), T, 20_000).expect("served on node-b");
        assert!(ans.server.starts_with("web-b"));
        assert_eq!(ans.peer, IpAddr::from(EXT4), "client address kept");
    }
}

/// Pod to pod across nodes passes through both kxdp untouched: each side sees the other's pod
/// address, both directions, TCP and UDP.
#[test]
fn kxdp_pod_to_pod_across_nodes_untouched() {
    let r = kxdp_lab("kxdp_pod_to_pod_across_nodes_untouched");
    for (client, server) in [
        ("client-a", "web-b1"),
        ("client-b", "web-a1"),
        ("client-a", "web-a1"),
        ("client-b", "web-b2"),
    ] {
        let (c, s) = (r.lab.pod(client), r.lab.pod(server));
        let a = tcp(&c.ns, sa(s.ip4, TCP_PORT), T, 100_000)
            .unwrap_or_else(|e| panic!("{client} -> {server}: {e}"));
        assert_eq!((a.server.as_str(), a.peer), (server, IpAddr::from(c.ip4)));
        let a = udp(&c.ns, sa(s.ip4, UDP_PORT), Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{client} -> {server} UDP: {e}"));
        assert_eq!(a.peer, IpAddr::from(c.ip4));
    }
}

/// A NetworkPolicy on node-b's web pods admits only pods labelled role=frontend: node-b judges
/// traffic from pods of node-a by their labels (front-a admitted, client-a dropped: it times
/// out), directly and through the ClusterIP.
#[test]
fn kxdp_network_policy_on_the_destination_node() {
    let policy = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-frontend, namespace: lab}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: frontend}}
---
";
    let r = start_both(
        Lab::two_node_pods("kxdp_network_policy_on_the_destination_node"),
        policy,
    );
    let web = r.lab.pod("web-b1");
    let front = r.lab.pod("front-a");
    let client = r.lab.pod("client-a");
    let a = tcp(&front.ns, sa(web.ip4, TCP_PORT), T, 10_000).expect("frontend admitted");
    assert_eq!(a.peer, IpAddr::from(front.ip4));
    let a = tcp(&front.ns, sa([172, 30, 0, 10], 80), T, 10_000).expect("via the ClusterIP");
    assert_eq!(a.peer, IpAddr::from(front.ip4));
    for to in [sa(web.ip4, TCP_PORT), sa([172, 30, 0, 10], 80)] {
        let t0 = Instant::now();
        let e = tcp(&client.ns, to, Duration::from_secs(2), 0).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            "denied: times out (no RST): {e}"
        );
        assert!(t0.elapsed() >= Duration::from_secs(2));
    }
    // Pods the policy does not select are unaffected.
    let a =
        tcp(&client.ns, sa(r.lab.pod("client-b").ip4, TCP_PORT), T, 1000).expect("unselected pod");
    assert_eq!(a.peer, IpAddr::from(client.ip4));
    drop((r.a, r.b));
}

// ---------------------------------------------------------------------------------------------
// The DaemonSet's shape: interfaces by pattern, pods that come and go.
// ---------------------------------------------------------------------------------------------

/// kxdp configured as a DaemonSet must be (`interfaces: [eth0, "veth*"]`, plus cni0 on the bridge
/// node): a pod created after kxdp started reaches the ClusterIP and is reached through it;
/// measured: the time from the pod's CNI ADD to its first answered request.
#[test]
fn kxdp_pod_created_after_start() {
    let lab = Lab::two_node_pods("kxdp_pod_created_after_start");
    let mut lab = lab;
    let pattern =
        |lab: &Lab, node: &str| lab.kxdp_config_with(node, &["eth0".into(), "veth*".into()]);
    let objects = services(&lab);
    let a = lab.start_kxdp("node-a", &pattern(&lab, "node-a"), &objects);
    let b = lab.start_kxdp("node-b", &pattern(&lab, "node-b"), &objects);
    // A new client on node-a and a new endpoint on node-b, after start. Measured: from the
    // pod's host veth appearing on node-a (seen by a thread dumping node-a's links every
    // millisecond) to the first request answered through kxdp. The probes are one UDP datagram
    // to the ClusterIP every 2 ms, each from its own socket, from the moment CNI ADD returns
    // (the pod's namespace exists): no client back-off in the figure. Before kxdp has its
    // socket on the veth no probe is answered: the kernel does take the request (the host path
    // routes the ClusterIP to kxdp0), but kxdp cannot send the reply on an interface it has
    // no socket on (`no-egress`).
    let node_a_ns = lab.node("node-a").ns.clone();
    let known: Vec<String> = in_ns(&node_a_ns, || {
        kxdp_kernel::netlink::dump_all()
            .unwrap()
            .links
            .into_iter()
            .map(|l| l.name)
            .collect()
    });
    let watching = Arc::new(AtomicBool::new(true));
    let w = watching.clone();
    let link_seen = std::thread::spawn({
        let ns = node_a_ns.clone();
        move || {
            in_ns(&ns, move || {
                while w.load(Ordering::Relaxed) {
                    let links = kxdp_kernel::netlink::dump_all().unwrap().links;
                    if let Some(l) = links
                        .iter()
                        .find(|l| l.name.starts_with("veth") && !known.contains(&l.name))
                    {
                        let seen = Instant::now();
                        // Then until kxdp intercepts it: its tc redirect into the tap (the
                        // default for pods' veths), or its XDP program (attached after its
                        // sockets are in the program's map). From then on kxdp forwards its
                        // packets.
                        let show = format!("-d link show dev {}", l.name);
                        let filters = format!("filter show dev {} ingress", l.name);
                        let end = seen + Duration::from_secs(2);
                        while Instant::now() < end {
                            let run = |cmd: &str, args: &str| {
                                let out = std::process::Command::new(cmd)
                                    .args(args.split_whitespace())
                                    .output()
                                    .unwrap();
                                String::from_utf8_lossy(&out.stdout).into_owned()
                            };
                            if run("ip", &show).contains("prog/xdp")
                                || run("tc", &filters).contains("kxdp-tap")
                            {
                                return Some((seen, l.name.clone(), Some(Instant::now())));
                            }
                        }
                        return Some((seen, l.name.clone(), None));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                None
            })
        }
    });
    let t0 = Instant::now();
    lab.add_pod("node-a", "late-client", &[("app", "client")]);
    let t_added = Instant::now();
    let probes = {
        let ns = lab.pod("late-client").ns.clone();
        in_ns(&ns, move || {
            let mut sent = Vec::new();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(2) {
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                s.connect(sa([172, 30, 0, 10], 53)).unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = s.send(b"hello");
                sent.push((Instant::now(), s));
                let mut buf = [0u8; 256];
                if sent.iter().any(|(_, s)| s.recv(&mut buf).is_ok()) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            // The earliest probe answered (answers may arrive out of order).
            std::thread::sleep(Duration::from_millis(100));
            let mut buf = [0u8; 256];
            sent.iter()
                .find(|(_, s)| s.recv(&mut buf).is_ok())
                .map(|(t, _)| *t)
        })
    };
    watching.store(false, Ordering::Relaxed);
    let (t_link, name, t_xdp) = link_seen
        .join()
        .unwrap()
        .expect("the pod's veth seen on node-a");
    let t_xdp = t_xdp.expect("the new veth intercepted by kxdp within 2 s");
    assert_eq!(name, lab.pod("late-client").host_if);
    let first = probes.expect("a probe answered through the ClusterIP within 2 s");
    let fwd = first.duration_since(t_link);
    eprintln!(
        "new pod: veth appeared {:?} after CNI ADD started; intercepted by kxdp {:?} after it appeared; ADD returned {:?} after it appeared; first request answered through kxdp {:?} after it appeared",
        t_link.duration_since(t0),
        t_xdp.duration_since(t_link),
        t_added.duration_since(t_link),
        fwd
    );
    assert!(
        fwd < Duration::from_secs(1),
        "a new pod forwards within 1 s: {fwd:?}"
    );
    let attached = format!("kxdp: attached {}", lab.pod("late-client").host_if);
    assert!(a.log().contains(&attached), "{}", a.log());
    lab.add_pod("node-b", "late-web", &[("app", "late")]);
    let objects = services(&lab) + &lab.service("late", 12, "late", None, false);
    lab.update_state(&a, &objects);
    lab.update_state(&b, &objects);
    let c = lab.pod("late-client").ns.clone();
    let ok = lab::wait_until(Duration::from_secs(5), || {
        tcp(
            &c,
            sa([172, 30, 0, 12], 80),
            Duration::from_millis(300),
            100,
        )
        .is_ok()
    });
    if !ok {
        eprintln!("node-a:\n{}\nnode-b:\n{}", a.log(), b.log());
    }
    assert!(ok, "the new pods forward");
    eprintln!("new pods answered {:?} after CNI ADD", t0.elapsed());
    let ans = tcp(&c, sa([172, 30, 0, 12], 80), T, 10_000).unwrap();
    assert_eq!(ans.server, "late-web");
    assert_eq!(ans.peer, IpAddr::from(lab.pod("late-client").ip4));
}

/// Pods replaced under continuous requests through a ClusterIP: a client on node-a keeps
/// calling the Service while its endpoints are replaced 10 times as a rolling update replaces
/// them (new pod, endpoint added; the old pod deleted: its endpoint terminating while it drains,
/// then gone): every request answered.
#[test]
fn kxdp_pods_replaced_under_continuous_requests_through_clusterip() {
    let mut lab = Lab::build("kxdp_pods_replaced_under_continuous_requests_through_clusterip");
    lab.add_pod("node-a", "client", &[("app", "client")]);
    lab.add_pod("node-a", "srv-0", &[("app", "srv")]);
    lab.add_pod("node-b", "srv-1", &[("app", "srv")]);
    lab.warm_neighbours();
    let conf = |lab: &Lab, node: &str| lab.kxdp_config_with(node, &["eth0".into(), "veth*".into()]);
    let objects = |lab: &Lab| lab.service("srv", 13, "srv", None, false);
    let a = lab.start_kxdp("node-a", &conf(&lab, "node-a"), &objects(&lab));
    let b = lab.start_kxdp("node-b", &conf(&lab, "node-b"), &objects(&lab));
    let load = Load::start(&lab.pod("client").ns, vec![sa([172, 30, 0, 13], 80)]);
    for i in 0..10 {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        let new = format!("srv-{}", i + 2);
        lab.add_pod(node, &new, &[("app", "srv")]);
        lab.update_state_published(&a, &objects(&lab));
        lab.update_state_published(&b, &objects(&lab));
        std::thread::sleep(Duration::from_millis(1000));
        let old = format!("srv-{i}");
        // The endpoint turns terminating first (as the EndpointSlice controller lists a pod
        // being deleted): no new connection goes to it, those open drain. Once both nodes'
        // tables say so, and a moment for requests already sent to it, the pod ends; its
        // endpoint leaves with the next update.
        let i = lab.pods.iter().position(|p| p.name == old).unwrap();
        lab.pods[i].terminating = true;
        lab.update_state_published(&a, &objects(&lab));
        lab.update_state_published(&b, &objects(&lab));
        std::thread::sleep(Duration::from_millis(1000));
        lab.delete_pod(&old);
    }
    let log = load.finish();
    let failed: Vec<_> = log.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(log.len() >= 50, "{}", log.len());
    assert!(failed.is_empty(), "every request answered: {failed:?}");
}

/// The bridge node works without listing cni0: packets for its pods leave through the pod's own
/// port (bridge FDB), not `no-egress`.
#[test]
fn kxdp_bridge_node_without_listing_cni0() {
    let lab = Lab::two_node_pods("kxdp_bridge_node_without_listing_cni0");
    let objects = services(&lab);
    let _a = lab.start_kxdp("node-a", &lab.kxdp_config("node-a", false), &objects);
    let _b = lab.start_kxdp("node-b", &lab.kxdp_config("node-b", false), &objects);
    lab.warm_neighbours();
    let c = lab.pod("client-a");
    let a = tcp(&c.ns, sa([172, 30, 0, 10], 80), T, 10_000).expect("ClusterIP to bridge pods");
    assert_eq!(a.peer, IpAddr::from(c.ip4));
    let cb = lab.pod("client-b");
    let a = tcp(&cb.ns, sa(lab.pod("web-b1").ip4, TCP_PORT), T, 10_000).expect("same bridge");
    assert_eq!(a.peer, IpAddr::from(cb.ip4));
}

/// A node's own process reaches a NodePort on the *other* node (its packets leave through
/// eth0, where the other node's kxdp serves them; masqueraded to that node's address), IPv4 and
/// IPv6; a pod reaches NodePorts on both nodes' addresses.
#[test]
fn kxdp_nodeports_from_the_other_node_and_from_pods() {
    let r = kxdp_lab("kxdp_nodeports_from_the_other_node_and_from_pods");
    let a = r.lab.node("node-a");
    let b = r.lab.node("node-b");
    for v6 in [false, true] {
        let ans = tcp(&a.ns, sa(b.ip(v6), 30080), T, 10_000)
            .unwrap_or_else(|e| panic!("node-a -> NodePort on node-b ({}): {e}", fam(v6)));
        assert!(ans.server.starts_with("web-b"), "{ans:?}");
        assert_eq!(ans.peer, b.ip(v6), "masqueraded to node-b");
    }
    let c = r.lab.pod("client-a");
    for node in [a, b] {
        let ans = tcp(&c.ns, sa(node.ip4, 30080), T, 10_000)
            .unwrap_or_else(|e| panic!("client-a -> NodePort on {}: {e}", node.name));
        assert!(ans.server.starts_with("web-b"), "{ans:?}");
    }
}

/// The node's own processes (and so hostNetwork pods, kubelet) reach a ClusterIP (TCP and UDP)
/// and a NodePort on the node's own address, as with kube-proxy.
#[test]
fn kxdp_node_processes_reach_clusterip_and_nodeports() {
    let r = kxdp_lab("kxdp_node_processes_reach_clusterip_and_nodeports");
    let a = r.lab.node("node-a");
    let b = r.lab.node("node-b");
    let ans = tcp(&a.ns, sa([172, 30, 0, 10], 80), T, 10_000).unwrap_or_else(|e| {
        let routes = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &a.ns,
                "sh",
                "-c",
                "ip route; ip rule; ip link",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!(
            "node -> ClusterIP: {e}\n{routes}\nnode-a:\n{}\nnode-b:\n{}",
            r.a.log(),
            r.b.log()
        )
    });
    assert!(ans.server.starts_with("web-b"));
    let ans = udp(&a.ns, sa([172, 30, 0, 10], 53), Duration::from_secs(1)).expect("UDP");
    assert!(ans.server.starts_with("web-b"));
    let ans = tcp(&a.ns, "[fd00:30::a]:80".parse().unwrap(), T, 10_000).expect("IPv6");
    assert!(ans.server.starts_with("web-b"));
    tcp(&a.ns, sa(a.ip4, 30080), T, 10_000).expect("node-a -> its own NodePort");
    tcp(&a.ns, sa(a.ip6, 30080), T, 10_000).expect("node-a -> its own NodePort (IPv6)");
    tcp(&b.ns, sa(b.ip4, 30080), T, 10_000).expect("node-b -> its own NodePort");
    // A LoadBalancer Service with an externalIP published later: the service routes follow the
    // publication, and node-a's processes reach both addresses.
    let lb = r
        .lab
        .service("web-lb", 12, "web", Some(30090), false)
        .replacen("type: NodePort", "type: LoadBalancer", 1)
        .replacen(
            "  selector:",
            "  externalIPs: [203.0.113.50]\n  selector:",
            1,
        )
        .replacen(
            "---\n",
            "status: {loadBalancer: {ingress: [{ip: 203.0.113.60}]}}\n---\n",
            1,
        );
    r.lab.update_state(&r.a, &(services(&r.lab) + &lb));
    for vip in [[203, 0, 113, 50], [203, 0, 113, 60]] {
        let mut last = None;
        let reached = lab::wait_until(Duration::from_secs(10), || {
            last = Some(tcp(&a.ns, sa(vip, 80), Duration::from_millis(500), 100));
            last.as_ref().is_some_and(|r| r.is_ok())
        });
        assert!(reached, "node -> {vip:?}: {last:?}\n{}", r.a.log());
    }
    let routes = lab::sh(&a.ns, "ip route show proto 107");
    assert!(
        routes.contains("203.0.113.50 via 169.254.107.1 dev kxdp0"),
        "{routes}"
    );
    assert!(
        routes.contains("203.0.113.60 via 169.254.107.1 dev kxdp0"),
        "{routes}"
    );
}

/// What the host path installs is removed on exit (SIGTERM) and replaced, never stacked, on a
/// start after a SIGKILL: `ip rule` and the routes are exactly what they were before kxdp, and a
/// node process reaches the ClusterIP after the restart.
#[test]
fn kxdp_host_path_replaced_on_start_and_removed_on_exit() {
    let lab = Lab::two_node_pods("kxdp_host_path_replaced_on_start_and_removed_on_exit");
    let ns = lab.node("node-a").ns.clone();
    // kxdp's tap goes with the process that made it (SIGKILL included): not the host path.
    let host = || {
        lab::sh(
            &ns,
            "ip rule; ip -6 rule; ip route show table all | grep -v '^local\\|^multicast\\|fe80::/64'; ip -o link show | cut -d: -f2 | grep -v kxdptap0",
        )
    };
    let before = host();
    let objects = services(&lab);
    let config = lab.kxdp_config("node-a", true);
    let mut k = lab.start_kxdp("node-a", &config, &objects);
    let running = host();
    assert!(
        running.contains("kxdp0") && running.contains("kxdp1"),
        "{running}"
    );
    // The node's own NodePort connections: a tc redirect on lo, no policy-routing rule.
    assert!(!running.contains("lookup 27512"), "{running}");
    let lo = lab::sh(&ns, "tc filter show dev lo egress");
    assert!(lo.contains("kxdp-node-ports"), "{lo}");
    assert!(
        running.contains("172.30.0.0/16 via 169.254.107.1 dev kxdp0"),
        "{running}"
    );
    // SIGKILL: nothing is removed...
    k.kxdp.child.kill().unwrap();
    k.kxdp.child.wait().unwrap();
    assert_eq!(host(), running, "a killed kxdp leaves its host path");
    // ...and the next start replaces it: the same rules and routes, once.
    let mut k = lab.start_kxdp("node-a", &config, &objects);
    assert_eq!(host(), running, "replaced, not stacked");
    let ans = tcp(&ns, sa([172, 30, 0, 10], 80), T, 1000).expect("node -> ClusterIP after restart");
    assert!(ans.server.starts_with("web-b"), "{}", ans.server);
    assert!(k.kxdp.stop().is_some_and(|s| s.success()));
    assert!(k.log().contains("host path removed"), "{}", k.log());
    assert_eq!(
        host(),
        before,
        "SIGTERM removes everything the host path installed"
    );
}

/// A pod reaches the external host through kxdp and the host sees the node's address, IPv4
/// and IPv6: the packet takes the kernel's path (the kernel port), where the CNI's masquerade
/// applies.
#[test]
fn kxdp_pod_egress_masqueraded_by_the_node() {
    let mut r = kxdp_lab("kxdp_pod_egress_masqueraded_by_the_node");
    r.lab.ext_servers();
    for (client, node) in [("client-a", "node-a"), ("client-b", "node-b")] {
        let c = r.lab.pod(client);
        let a = tcp(&c.ns, sa(EXT4, TCP_PORT), T, 10_000)
            .unwrap_or_else(|e| panic!("{client} -> ext: {e}"));
        assert_eq!(a.peer, IpAddr::from(r.lab.node(node).ip4));
        let a = udp(&c.ns, sa(EXT4, UDP_PORT), Duration::from_secs(1)).unwrap();
        assert_eq!(a.peer, IpAddr::from(r.lab.node(node).ip4));
        let a = tcp(&c.ns, sa(EXT6, TCP_PORT), T, 10_000)
            .unwrap_or_else(|e| panic!("{client} -> ext (IPv6): {e}"));
        assert_eq!(a.peer, IpAddr::from(r.lab.node(node).ip6));
    }
}

/// Dual-stack on the wire: IPv6 ClusterIP with endpoints on the other node (TCP and UDP,
/// client address kept), IPv6 NodePort from the external host (masqueraded to node-a's IPv6
/// address), IPv6 pod to pod across nodes.
#[test]
fn kxdp_ipv6_clusterip_nodeport_and_pod_to_pod() {
    let r = kxdp_lab("kxdp_ipv6_clusterip_nodeport_and_pod_to_pod");
    let c = r.lab.pod("client-a");
    let vip: SocketAddr = "[fd00:30::a]:80".parse().unwrap();
    for _ in 0..3 {
        let a = tcp(&c.ns, vip, T, 50_000).expect("IPv6 ClusterIP");
        assert!(a.server.starts_with("web-b"), "{a:?}");
        assert_eq!(a.peer, IpAddr::from(c.ip6));
    }
    let a = udp(
        &c.ns,
        "[fd00:30::a]:53".parse().unwrap(),
        Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(a.peer, IpAddr::from(c.ip6));
    let a6 = r.lab.node("node-a").ip6;
    let a = tcp(&r.lab.ext, sa(a6, 30080), T, 20_000).expect("IPv6 NodePort");
    assert!(a.server.starts_with("web-b"), "{a:?}");
    assert_eq!(a.peer, IpAddr::from(a6));
    let w = r.lab.pod("web-b1");
    let a = tcp(&c.ns, sa(w.ip6, TCP_PORT), T, 20_000).expect("IPv6 pod to pod");
    assert_eq!(a.peer, IpAddr::from(c.ip6));
}

/// Every pod interface of a node forwards, however many there are: six pods on node-b (eight
/// interfaces for its one worker), each answering a client on node-a directly.
#[test]
fn kxdp_every_pod_interface_forwards() {
    let mut lab = Lab::build("kxdp_every_pod_interface_forwards");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    for i in 0..6 {
        lab.add_pod("node-b", &format!("many-{i}"), &[("app", "many")]);
    }
    lab.warm_neighbours();
    let r = start_both(lab, "");
    let c = r.lab.pod("client-a");
    let mut failed = Vec::new();
    for p in r.lab.pods_on("node-b") {
        if let Err(e) = tcp(&c.ns, sa(p.ip4, TCP_PORT), T, 1000) {
            failed.push(format!("{} ({}): {e}", p.name, p.host_if));
        }
    }
    if !failed.is_empty() {
        eprintln!("node-a:\n{}\nnode-b:\n{}", r.a.log(), r.b.log());
    }
    assert!(failed.is_empty(), "pods not reachable: {failed:?}");
}

/// A pod's interface vanishes while kxdp runs (CNI DEL) with XDP on the pods' veths
/// (`podInterception: {mode: xdp}`): its program and socket are released and every frame the
/// socket held goes back to the worker's free list (the frame accounting still balances); the
/// other pods keep forwarding.
#[test]
fn kxdp_vanished_link_released_nothing_leaked() {
    let mut lab = Lab::build("kxdp_vanished_link_released_nothing_leaked");
    lab.add_pod("node-a", "client", &[("app", "client")]);
    lab.add_pod("node-a", "going", &[("app", "going")]);
    lab.add_pod("node-b", "srv", &[("app", "srv")]);
    lab.warm_neighbours();
    let mut r = start_both_configured(lab, "", "podInterception: {mode: xdp}\n");
    let srv = sa(r.lab.pod("srv").ip4, TCP_PORT);
    let going = r.lab.pod("going");
    let going_if = going.host_if.clone();
    // Traffic through the socket first, so that it holds frames on its rings.
    tcp(&going.ns, srv, T, 100_000).expect("the pod forwards before it goes");
    r.lab.delete_pod("going");
    let needle = format!("kxdp: {going_if} (ifindex");
    let released = lab::wait_until(Duration::from_secs(5), || r.a.log().contains(&needle));
    let log = r.a.log();
    assert!(released, "{going_if} released: {log}");
    let line = log.lines().find(|l| l.contains(&needle)).unwrap();
    eprintln!("{line}");
    assert!(line.contains(" 1 socket(s) closed"), "{line}");
    let counts: Vec<u64> = line
        .split(", ")
        .nth(1)
        .unwrap()
        .split(' ')
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(counts.len(), 2, "{line}");
    assert_eq!(
        counts[0], counts[1],
        "every frame the socket held came back: {line}"
    );
    assert!(counts[0] > 0, "the socket held frames: {line}");
    assert!(!line.contains("ACCOUNTING OFF"), "{line}");
    let c = r.lab.pod("client");
    let a = tcp(&c.ns, srv, T, 10_000).expect("the other pods keep forwarding");
    assert_eq!(a.peer, IpAddr::from(c.ip4));
}

/// A link that matches a pattern but cannot take kxdp (a tun device named like a pod veth: no
/// Ethernet address, so neither the tap's redirect nor XDP) is reported by name; the other
/// interfaces keep working.
#[test]
fn kxdp_link_that_cannot_take_xdp_reported_others_work() {
    let mut lab = Lab::build("kxdp_link_that_cannot_take_xdp_reported_others_work");
    lab.add_pod("node-a", "client", &[("app", "client")]);
    lab.add_pod("node-b", "srv", &[("app", "srv")]);
    lab.warm_neighbours();
    let r = start_both(lab, "");
    let ns = r.lab.node("node-a").ns.clone();
    let st = std::process::Command::new("ip")
        .args([
            "netns", "exec", &ns, "ip", "tuntap", "add", "dev", "vethtun0", "mode", "tun",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let reported = lab::wait_until(Duration::from_secs(5), || {
        r.a.log().contains(
            "kxdp: vethtun0: cannot take the tc redirect into kxdp's tap: no Ethernet address",
        )
    });
    assert!(reported, "reported by name: {}", r.a.log());
    let c = r.lab.pod("client");
    let a = tcp(&c.ns, sa(r.lab.pod("srv").ip4, TCP_PORT), T, 10_000).expect("others work");
    assert_eq!(a.peer, IpAddr::from(c.ip4));
}

/// How long `ns` takes to open a TCP connection to `to` (3 s at most).
fn connect_time(ns: &str, to: SocketAddr) -> std::io::Result<Duration> {
    in_ns(ns, move || {
        let t = Instant::now();
        let s = std::net::TcpStream::connect_timeout(&to, T)?;
        let took = t.elapsed();
        drop(s);
        Ok(took)
    })
}

/// The first connection toward neighbours node-b has just lost (its neighbour tables flushed:
/// the endpoints behind its bridge, the external host on the uplink's subnet) opens without a
/// SYN retransmission: kxdp re-resolves the next hops it forwards to, and holds the
/// frames until the kernel has resolved the next hop, then sends them (docs/afxdp.md,
/// "Forwarding"). Linux retransmits an unanswered SYN after 1 s, so a connection that opens in
/// well under a second needed none. A pod client through a ClusterIP (IPv4 and IPv6), and the
/// external host through a NodePort (masqueraded: the endpoint's reply toward it meets a cold
/// neighbour too).
#[test]
fn kxdp_first_connection_to_a_cold_neighbour_is_not_retransmitted() {
    let r = kxdp_lab("kxdp_first_connection_to_a_cold_neighbour_is_not_retransmitted");
    let b = r.lab.node("node-b");
    let client = r.lab.pod("client-b");
    let cases = [
        (
            "pod -> ClusterIP",
            client.ns.clone(),
            sa([172, 30, 0, 10], 80),
        ),
        (
            "pod -> ClusterIP (IPv6)",
            client.ns.clone(),
            "[fd00:30::a]:80".parse().unwrap(),
        ),
        ("external -> NodePort", r.lab.ext.clone(), sa(b.ip4, 30080)),
        (
            "external -> NodePort (IPv6)",
            r.lab.ext.clone(),
            sa(b.ip6, 30080),
        ),
    ];
    let endpoints: Vec<IpAddr> = ["web-b1", "web-b2"]
        .iter()
        .flat_map(|p| {
            [
                IpAddr::from(r.lab.pod(p).ip4),
                IpAddr::from(r.lab.pod(p).ip6),
            ]
        })
        .collect();
    let mut took_all = Vec::new();
    for (what, ns, to) in cases {
        // Open (and close) one connection first: the path works, and conntrack and the pods'
        // own caches are as after any connection.
        tcp(&ns, to, T, 100).unwrap_or_else(|e| panic!("{what}: {e}\n{}", r.b.log()));
        // Twice: the closed connection's last segments may have resolved an entry again.
        let flush = "ip -4 neigh flush all; ip -6 neigh flush all";
        lab::sh(&b.ns, flush);
        std::thread::sleep(Duration::from_millis(200));
        lab::sh(&b.ns, flush);
        // kxdp asks the kernel to resolve again the next hops it forwards to once they are
        // flushed (`neigh::Keeper`), so an endpoint may be resolved again by now; the external
        // host's entry (a masqueraded reply's next hop) and a flushed endpoint that is not yet
        // both meet the hold queue. Either way the first connection must not wait for a
        // retransmission.
        let left = lab::sh(&b.ns, "ip neigh show; ip -6 neigh show");
        let resolved: Vec<&IpAddr> = endpoints
            .iter()
            .filter(|e| {
                left.lines()
                    .any(|l| l.starts_with(&format!("{e} ")) && l.contains("lladdr"))
            })
            .collect();
        eprintln!("{what}: endpoints resolved again after the flush: {resolved:?}");
        let took = connect_time(&ns, to).unwrap_or_else(|e| panic!("{what}: {e}\n{}", r.b.log()));
        took_all.push((what, took));
    }
    eprintln!("first connections: {took_all:?}");
    for (what, took) in took_all {
        assert!(
            took < Duration::from_millis(800),
            "{what}: the first connection took {took:?} (a SYN was retransmitted)"
        );
    }
}
