//! Maglev across nodes, in the two-node CNI lab (tests/cni/mod.rs): kxdp on both nodes with the
//! same (default) `loadBalancing.maglevSeed`, a Service with `service.kxdp.dev/lb-algorithm:
//! maglev` whose endpoints are on both nodes. The external host sends the same flows (the same
//! 5-tuple: fixed source ports) first through node-a, then through node-b, as a router's ECMP
//! moving them would: each flow reaches the same backend pod both times.
//!
//! The destinations are the Service's ClusterIP and an external IP (the address ECMP spreads
//! over the nodes, as a LoadBalancer VIP): both are the same address on every node. A NodePort
//! is addressed by the node's own address, so a flow to node-a's NodePort and one to node-b's
//! are different 5-tuples (Maglev hashes the frontend the client addressed, docs/services.md
//! "Maglev"); the external IP shares the NodePort's route lists and tables. Every wait is bounded.

mod cni;
mod lab;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use cni::{in_ns, sa, Lab, EXT4};

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 10);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// The flows' client source ports (one flow each per destination and protocol).
const PORTS: std::ops::Range<u16> = 41000..41016;

/// A dual-stack NodePort Service `web` (tests/cni/mod.rs `Lab::service`) made Maglev, with the
/// external IP added.
fn maglev_service(lab: &Lab) -> String {
    let s = lab.service("web", 10, "web", Some(30080), false);
    let s = s.replacen(
        "metadata: {name: web, namespace: lab}",
        "metadata: {name: web, namespace: lab, annotations: {service.kxdp.dev/lb-algorithm: maglev}}",
        1,
    );
    let out = s.replacen(
        "  type: NodePort\n",
        &format!("  type: NodePort\n  externalIPs: [{EXTERNAL_IP}]\n"),
        1,
    );
    assert!(out.contains("lb-algorithm") && out.contains("externalIPs"));
    out
}

/// One TCP connection from `ns`, source port `port`, to `to`: the server's first line names the
/// pod. Closed with a reset (linger 0), so neither end keeps the 4-tuple in TIME_WAIT and the
/// same source port connects again through the other node.
fn tcp_from(ns: &str, port: u16, to: SocketAddr) -> std::io::Result<String> {
    in_ns(ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let stream = rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.set_reuseaddr(true)?;
            s.set_zero_linger()?;
            s.bind(sa(EXT4, port))?;
            tokio::time::timeout(Duration::from_secs(3), s.connect(to))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
        })?;
        let std = stream.into_std()?;
        std.set_nonblocking(false)?;
        std.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut line = String::new();
        BufReader::new(std.try_clone()?).read_line(&mut line)?;
        drop(std);
        Ok(line
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string())
    })
}

/// One UDP exchange from `ns`, source port `port`, to `to` (3 tries): the pod that answered.
fn udp_from(ns: &str, port: u16, to: SocketAddr) -> std::io::Result<String> {
    in_ns(ns, move || {
        let s = UdpSocket::bind(sa(EXT4, port))?;
        s.connect(to)?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let mut buf = [0u8; 512];
        for _ in 0..3 {
            s.send(b"hello")?;
            if let Ok(n) = s.recv(&mut buf) {
                let a = String::from_utf8_lossy(&buf[..n]).into_owned();
                return Ok(a.split_whitespace().next().unwrap_or_default().to_string());
            }
        }
        Err(std::io::ErrorKind::TimedOut.into())
    })
}

/// Routes the ClusterIP and the external IP from the external host through `via`.
fn route_via(lab: &Lab, via: IpAddr) {
    for dst in [CLUSTER_IP, EXTERNAL_IP] {
        lab::ip(&lab.ext, &format!("route replace {dst}/32 via {via}"));
    }
}

type Key = (&'static str, &'static str, u16);

/// Every flow once: (destination, protocol, source port) → the pod that answered. `reversed`
/// sends them in the opposite order: a worker's random generator starts from the same seed in
/// every kxdp, so random choice would give the n-th new connection the same endpoint on both
/// nodes, and the same order would pass without Maglev.
fn backends(lab: &Lab, reversed: bool) -> BTreeMap<Key, String> {
    let mut m = BTreeMap::new();
    let mut flows: Vec<_> = [("ClusterIP", CLUSTER_IP), ("externalIP", EXTERNAL_IP)]
        .into_iter()
        .flat_map(|(what, dst)| PORTS.map(move |port| (what, dst, port)))
        .collect();
    if reversed {
        flows.reverse();
    }
    for (what, dst, port) in flows {
        let t = tcp_from(&lab.ext, port, sa(dst, 80))
            .unwrap_or_else(|e| panic!("TCP {what} from port {port}: {e}"));
        m.insert((what, "TCP", port), t);
        let u = udp_from(&lab.ext, port, sa(dst, 53))
            .unwrap_or_else(|e| panic!("UDP {what} from port {port}: {e}"));
        m.insert((what, "UDP", port), u);
    }
    m
}

#[test]
fn maglev_flow_reaches_the_same_backend_via_either_node() {
    let mut lab = Lab::build("maglev_flow_reaches_the_same_backend_via_either_node");
    for (node, pod) in [
        ("node-a", "web-a1"),
        ("node-a", "web-a2"),
        ("node-b", "web-b1"),
        ("node-b", "web-b2"),
    ] {
        lab.add_pod(node, pod, &[("app", "web")]);
    }
    lab.warm_neighbours();
    let objects = maglev_service(&lab);
    let a = lab.start_kxdp("node-a", &lab.kxdp_config("node-a", false), &objects);
    let b = lab.start_kxdp("node-b", &lab.kxdp_config("node-b", false), &objects);
    lab.warm_neighbours();
    let (ip_a, ip_b) = (lab.node("node-a").ip4, lab.node("node-b").ip4);

    route_via(&lab, IpAddr::from(ip_a));
    let via_a = backends(&lab, false);
    route_via(&lab, IpAddr::from(ip_b));
    let via_b = backends(&lab, true);

    let moved: Vec<_> = via_a
        .iter()
        .filter(|(k, v)| via_b.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k:?}: {v} via node-a, {:?} via node-b", via_b.get(k)))
        .collect();
    assert!(
        moved.is_empty(),
        "flows that reached another backend:\n{}\nnode-a:\n{}\nnode-b:\n{}",
        moved.join("\n"),
        a.log(),
        b.log()
    );
    // The flows spread over the endpoints (a table that names one pod would pass trivially).
    let used: BTreeSet<&String> = via_a.values().collect();
    assert!(
        used.len() >= 3 && used.iter().all(|p| p.starts_with("web-")),
        "{used:?}"
    );
    for log in [a.log(), b.log()] {
        assert!(!log.contains("lb-algorithm"), "annotation accepted:\n{log}");
    }
    drop((a, b));
}
