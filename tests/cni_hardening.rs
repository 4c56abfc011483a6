//! Safe defaults on the two-node CNI lab (tests/cni/mod.rs).
//!
//! Source validation: a pod that sends with another
//! pod's address cannot pass a NetworkPolicy that admits that pod (`spoofed-source`,
//! `dataplane/src/antispoof.rs`), on the `ptp` node (a host veth per pod) and on the `bridge`
//! node (ports of `cni0`, told apart by the FDB); normal pod, node and NodePort traffic is not
//! touched. Packets are crafted with raw sockets (`tests/cni/spoof.py`, python3, no scapy) and
//! observed with a packet socket in the protected pod.
//!
//! `interfaces` that match a bridge and its ports: refused at start; a bridge that appears
//! later is left alone and its ports keep working.

#![allow(dead_code)]

mod cni;
mod lab;
mod spoof;

use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use cni::{sa, tcp, udp, KxdpNode, Lab, TCP_PORT, UDP_PORT};
use spoof::{observe, spoofed_drops, Probe};

const T: Duration = Duration::from_secs(3);
fn config(lab: &Lab, node: &str, extra: &str) -> String {
    lab.kxdp_config(node, false).replace(
        "metricsBindAddress: \"\"",
        "metricsBindAddress: 127.0.0.1:10249",
    ) + extra
}

#[test]
fn kxdp_spoofed_sources_dropped_at_the_pod_interface() {
    let mut lab = Lab::build("kxdp_spoofed_sources_dropped_at_the_pod_interface");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-a", "rogue-a", &[("app", "rogue")]);
    lab.add_pod("node-b", "guard-b", &[("app", "guard")]);
    lab.add_pod("node-b", "client-b", &[("app", "client")]);
    lab.add_pod("node-b", "rogue-b", &[("app", "rogue")]);
    lab.add_pod("node-b", "web-b1", &[("app", "web")]);
    lab.warm_neighbours();
    let objects = lab.service("web", 10, "web", Some(30080), false)
        + "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: guard-from-clients, namespace: lab}
spec:
  podSelector: {matchLabels: {app: guard}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
---
";
    let (ns_a, ns_b) = (lab.node("node-a").ns.clone(), lab.node("node-b").ns.clone());
    let guard = lab.pod("guard-b");
    let (client_a, rogue_a) = (lab.pod("client-a"), lab.pod("rogue-a"));
    let (client_b, rogue_b) = (lab.pod("client-b"), lab.pod("rogue-b"));
    let probe = |from: &cni::Pod, src: IpAddr, v6: bool, sport: u16, tcp: bool| Probe {
        ns: from.ns.clone(),
        src,
        dst: guard.ip(v6),
        sport,
        tcp,
    };

    // Validation off on node-a: the hole, as measured before source validation existed. The
    // rogue pod's own SYN is dropped by node-b's policy; with client-a's address it arrives.
    let a_off = lab.start_kxdp(
        "node-a",
        &config(&lab, "node-a", "sourceValidation: off\n"),
        &objects,
    );
    let b: KxdpNode = lab.start_kxdp("node-b", &config(&lab, "node-b", ""), &objects);
    lab.warm_neighbours();
    let hole = [
        probe(rogue_a, rogue_a.ip(false), false, 40001, true),
        probe(rogue_a, client_a.ip(false), false, 40002, true),
        probe(rogue_a, client_a.ip(false), false, 40003, false),
    ];
    assert_eq!(
        observe(&guard.ns, &hole),
        [false, true, true],
        "validation off: the policy drops the rogue's own SYN, not the spoofed ones"
    );
    drop(a_off);

    // Strict (the default) on both nodes.
    let a = lab.start_kxdp("node-a", &config(&lab, "node-a", ""), &objects);
    lab.warm_neighbours();
    let mut probes = Vec::new();
    let mut want = Vec::new();
    let mut sport = 41000;
    for v6 in [false, true] {
        for tcp in [true, false] {
            // The admitted clients, from their own addresses: the crafted packets are fine.
            for c in [client_a, client_b] {
                sport += 1;
                probes.push(probe(c, c.ip(v6), v6, sport, tcp));
                want.push(true);
            }
            // A ptp pod with a pod's address on its node; a bridge pod with one of a pod on
            // the same bridge and with one of a pod on the other node.
            for (from, as_) in [
                (rogue_a, client_a),
                (rogue_b, client_b),
                (rogue_b, client_a),
            ] {
                sport += 1;
                probes.push(probe(from, as_.ip(v6), v6, sport, tcp));
                want.push(false);
            }
        }
    }
    let seen = observe(&guard.ns, &probes);
    for ((p, s), w) in probes.iter().zip(&seen).zip(&want) {
        assert_eq!(
            s,
            w,
            "{} from {} as {} (TCP {}): arrived {s}\nnode-a:\n{}\nnode-b:\n{}",
            p.dst,
            p.ns,
            p.src,
            p.tcp,
            a.log(),
            b.log()
        );
    }
    // Counted once per packet sent (each probe twice): 4 from rogue-a on node-a, 8 from rogue-b
    // on node-b, as `kxdp_drops_total{reason="spoofed-source"}`.
    assert_eq!(spoofed_drops(&ns_a), 2 * 4, "node-a's spoofed-source drops");
    assert_eq!(spoofed_drops(&ns_b), 2 * 8, "node-b's spoofed-source drops");
    // The node's own frames out of its tap (its multicast listener reports as the tap came
    // up) are counted apart: no pod sent them.
    for ns in [&ns_a, &ns_b] {
        let own = cni::metric(ns, "kxdp_drops_total{reason=\"tap-untagged\"}");
        eprintln!("{ns}: {own} frame(s) of the node's own out of its tap");
        assert!(own <= 4, "{ns}: {own} tap-untagged");
    }

    // Nothing else changes: pods (same node, other node, both families), a ClusterIP, the
    // node's own processes through the host path, a NodePort from outside (masqueraded).
    for v6 in [false, true] {
        for c in [client_a, client_b] {
            let to = sa(guard.ip(v6), TCP_PORT);
            let got = tcp(&c.ns, to, T, 1000).expect("admitted client");
            assert_eq!(got.peer, c.ip(v6));
            let got = udp(&c.ns, sa(guard.ip(v6), UDP_PORT), T).expect("admitted client, UDP");
            assert_eq!(got.peer, c.ip(v6));
        }
    }
    let got = tcp(&rogue_a.ns, sa([172, 30, 0, 10], 80), T, 1000).expect("ClusterIP");
    assert_eq!(got.peer, rogue_a.ip(false));
    let got = tcp(&rogue_b.ns, sa([172, 30, 0, 10], 80), T, 1000).expect("ClusterIP on b");
    assert_eq!(got.peer, rogue_b.ip(false));
    tcp(&ns_a, sa([172, 30, 0, 10], 80), T, 1000).expect("node-a's process: host path");
    let node_a = lab.node("node-a").ip4;
    let got = tcp(&lab.ext, sa(node_a, 30080), T, 1000).expect("NodePort from outside");
    assert_eq!(got.peer, IpAddr::from(node_a), "masqueraded");
    assert_eq!(spoofed_drops(&ns_a), 2 * 4, "no legitimate packet counted");
    assert_eq!(spoofed_drops(&ns_b), 2 * 8, "no legitimate packet counted");
    drop((a, b));
}

/// `interfaces` that match a bridge and its ports: refused at start (exit 2, the field and the
/// fix named); the documented `[eth0, "veth*"]` serves a pod created after start on the bridge
/// node; a bridge that appears later matching while ports are attached is left alone, said
/// once, and the ports keep working.
#[test]
fn kxdp_interfaces_matching_a_bridge_and_its_ports() {
    let mut lab = Lab::build("kxdp_interfaces_matching_a_bridge_and_its_ports");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-b", "web-b1", &[("app", "web")]);
    lab.warm_neighbours();
    let objects = lab.service("web", 10, "web", Some(30080), false);
    let ns_b = lab.node("node-b").ns.clone();

    // Refused at start, before anything is attached.
    let bad = lab.kxdp_config_with("node-b", &["eth0".into(), "veth*".into(), "cni0".into()]);
    let dir = lab.dir.path().join("refused");
    std::fs::create_dir_all(dir.join("state")).unwrap();
    std::fs::write(dir.join("config.yaml"), &bad).unwrap();
    std::fs::write(
        dir.join("state/cluster.yaml"),
        lab.cluster_objects() + &objects,
    )
    .unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns_b, env!("CARGO_BIN_EXE_kxdp"), "run"])
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("--state")
        .arg(dir.join("state"))
        .args(["--no-admin", "--no-takeover"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let refused = lab::wait_until(Duration::from_secs(20), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !refused {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(refused, "kxdp started with cni0 and veth* listed:\n{err}");
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("interfaces[2]") && err.contains("cni0") && err.contains("[eth0, \"veth*\"]"),
        "the field and the fix named: {err}"
    );
    assert!(lab::xdp_on(&ns_b, "cni0").is_none(), "nothing attached");

    // The documented configuration, plus a pattern for a bridge that does not exist yet.
    let mut ifs: Vec<String> = vec!["eth0".into(), "veth*".into(), "br-late".into()];
    let a = lab.start_kxdp("node-a", &lab.kxdp_config("node-a", false), &objects);
    let b = lab.start_kxdp("node-b", &lab.kxdp_config_with("node-b", &ifs), &objects);
    ifs.clear();
    // A pod created after start on the bridge node: attached, reached, and it reaches.
    let late = lab
        .add_pod("node-b", "late-b", &[("app", "web")])
        .name
        .clone();
    let late = lab.pod(&late);
    assert!(
        lab::wait_until(Duration::from_secs(5), || cni::intercepted(
            &ns_b,
            &late.host_if
        )),
        "the new pod's port intercepted:\n{}",
        b.log()
    );
    let client = lab.pod("client-a");
    let got = tcp(&client.ns, sa(late.ip4, TCP_PORT), T, 1000).expect("new pod reached");
    assert_eq!(got.peer, client.ip(false));
    let got = udp(&late.ns, sa([172, 30, 0, 10], 53), T).expect("new pod reaches the ClusterIP");
    assert_eq!(got.peer, late.ip(false));

    // A bridge matching `br-late` appears with a port `veth*` matches: one error, no program
    // on the bridge, the port and the pods keep theirs.
    lab::ip(&ns_b, "link add br-late type bridge");
    lab::ip(&ns_b, "link add vethlate0 type veth peer name vethlate1");
    lab::ip(&ns_b, "link set vethlate0 master br-late");
    for l in ["br-late", "vethlate0", "vethlate1"] {
        lab::ip(&ns_b, &format!("link set {l} up"));
    }
    assert!(
        lab::wait_until(Duration::from_secs(10), || b
            .log()
            .contains("br-late: cannot")),
        "the bridge reported:\n{}",
        b.log()
    );
    std::thread::sleep(Duration::from_secs(4)); // past one retry (every 3 s)
    let log = b.log();
    let reports: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("br-late: cannot"))
        .collect();
    assert_eq!(reports.len(), 1, "said once: {reports:?}");
    assert!(
        reports[0].contains("bridge") && reports[0].contains("`veth*` matches or could match"),
        "{}",
        reports[0]
    );
    assert!(
        lab::xdp_on(&ns_b, "br-late").is_none(),
        "the bridge left alone"
    );
    assert!(
        cni::intercepted(&ns_b, "vethlate0"),
        "its port stays intercepted"
    );
    let got = tcp(&client.ns, sa(late.ip4, TCP_PORT), T, 1000).expect("pods still reached");
    assert_eq!(got.peer, client.ip(false));
    lab::ip(&ns_b, "link del vethlate0");
    lab::ip(&ns_b, "link del br-late");
    drop((a, b));
}
