//! Neighbours on the bridge node of the CNI lab (tests/cni/mod.rs): kxdp sends to a pod on the
//! pod's bridge port itself, so the kernel neither sees that traffic nor the pod's replies. The
//! bridge's forwarding database then forgets the pod's MAC after its ageing time and the
//! neighbour entry goes stale (and is collected on a busy node); a bridge whose MAC changes
//! flushes its neighbours. None of that may cost a request.

mod cni;
mod lab;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use cni::{sa, Lab, Load};
use lab::ip;

/// The kernel's view of a pod's neighbour entry and FDB entries on node-b (for the failure
/// message).
fn kernel_view(ns: &str, pod: IpAddr, host_if: &str) -> String {
    let fdb = lab::run(
        "ip",
        &["netns", "exec", ns, "bridge", "fdb", "show", "dev", host_if],
    );
    let learned: Vec<&str> = fdb.lines().filter(|l| !l.contains("permanent")).collect();
    format!(
        "neigh {}; learned FDB on {host_if}: {learned:?}",
        ip(ns, &format!("neigh show to {pod} dev cni0")).trim()
    )
}

/// Requests from a client pod to a Service whose endpoint is another pod, both on node-b's
/// `cni0` (kxdp translates and forwards both ways on node-b, so the bridge sees neither pod's
/// traffic), kxdp started with both pods' FDB entries gone, while the bridge ages its FDB
/// entries out 4 s after their last frame (300 s by default), then once more while node-b's
/// neighbours are flushed (what a change of the bridge's
/// MAC does): every request answered, and the pods' IPv4 neighbour entries usable at the end.
#[test]
fn kxdp_bridge_pods_reachable_across_fdb_ageing_and_a_neighbour_flush() {
    let mut lab = Lab::build("kxdp_bridge_pods_reachable_across_fdb_ageing_and_a_neighbour_flush");
    let b = lab.node("node-b").ns.clone();
    lab.add_pod("node-b", "client", &[("app", "client")]);
    lab.add_pod("node-b", "web", &[("app", "web")]);
    lab.warm_neighbours();
    ip(&b, "link set cni0 type bridge ageing_time 400");
    // kxdp starts with the pods on no bridge port, as after a restart once the bridge forgot
    // them: they are addressable only once the bridge has learned them again.
    for p in ["client", "web"] {
        let host_if = lab.pod(p).host_if.clone();
        let fdb = lab::run(
            "ip",
            &[
                "netns", "exec", &b, "bridge", "fdb", "show", "dev", &host_if,
            ],
        );
        for mac in fdb
            .lines()
            .filter(|l| !l.contains("permanent"))
            .filter_map(|l| l.split_whitespace().next())
        {
            lab::run(
                "ip",
                &[
                    "netns", "exec", &b, "bridge", "fdb", "del", mac, "dev", &host_if, "master",
                ],
            );
        }
    }
    let conf = lab.kxdp_config("node-b", false);
    let kxdp = lab.start_kxdp("node-b", &conf, &lab.service("web", 20, "web", None, false));
    let pods: Vec<(IpAddr, String)> = ["client", "web"]
        .iter()
        .flat_map(|p| {
            let p = lab.pod(p);
            [
                (p.ip4.into(), p.host_if.clone()),
                (p.ip6.into(), p.host_if.clone()),
            ]
        })
        .collect();
    let view = || {
        pods.iter()
            .map(|(a, host_if)| kernel_view(&b, *a, host_if))
            .collect::<Vec<_>>()
    };
    // IPv4 only: the pods' IPv6 router and neighbour solicitations cross the bridge often
    // enough in a test's first minute to keep their FDB entries fresh by themselves.
    let load = Load::start(&lab.pod("client").ns, vec![sa([172, 30, 0, 20], 80)]);
    let t0 = Instant::now();
    // The web pod's IPv4 entries once a second: the FDB entry comes and goes with the pods' own
    // ARP and router solicitations.
    let mut seen = Vec::new();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_secs(1));
        seen.push(format!("{:.1?}: {}", t0.elapsed(), view()[2]));
    }
    ip(&b, "neigh flush dev cni0");
    ip(&b, "-6 neigh flush dev cni0");
    let flushed = t0.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let log = load.finish();
    let end = view();
    let failed: Vec<_> = log.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(
        log.len() >= 50,
        "{} requests in 25 s\n{}",
        log.len(),
        kxdp.log()
    );
    assert!(
        failed.is_empty(),
        "{} of {} requests failed (flush at {flushed:.1?}): {failed:?}\nthe web pod's IPv4 entries:\n{}\nat the end:\n{}",
        failed.len(),
        log.len(),
        seen.join("\n"),
        end.join("\n"),
    );
    // The IPv4 entries (IPv6 has no traffic here, so nothing resolves it after the flush).
    for v in [&end[0], &end[2]] {
        assert!(
            v.contains("lladdr") && !v.contains("FAILED") && !v.contains("INCOMPLETE"),
            "a pod's neighbour entry is not usable at the end: {v}"
        );
    }
}
