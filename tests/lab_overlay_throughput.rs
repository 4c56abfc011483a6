//! A benchmark, not a test (ignored by default; needs Debian's iperf3): one TCP stream through
//! the two-node CNI lab (tests/cni/mod.rs), the endpoint on the other node, with the pod ranges
//! joined by plain routes and by VXLAN as flannel builds it, rounds alternated. Per round: the
//! kernel alone pod to pod, then kxdp on both nodes pod to pod and pod to a ClusterIP.
//!
//! ```sh
//! cargo build --release --bin kxdp
//! KXDP_BIN=$PWD/target/release/kxdp cargo test --test lab_overlay_throughput -- --ignored --nocapture
//! ```
//!
//! Figures and what they show: docs/benchmarks.md, "Overlay networks".

mod cni;
mod lab;

use std::time::Duration;

use cni::{Lab, Underlay};

const SECONDS: u32 = 4;

/// Gbit/s received by an iperf3 client in `client`'s pod to `to`.
fn iperf(lab: &Lab, client: &str, to: &str) -> String {
    let c = lab.pod(client);
    let json = "import json,sys; d=json.load(sys.stdin); print(round(d['end']['sum_received']['bits_per_second']/1e9,3))";
    lab::sh(
        &c.ns,
        &format!("iperf3 -c {to} -t {SECONDS} -J | python3 -c \"{json}\""),
    )
    .trim()
    .to_string()
}

fn round(underlay: Underlay) {
    let mut lab = Lab::build_over("lab_overlay_throughput", underlay);
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-b", "web-b1", &[("app", "web")]);
    lab.warm_neighbours();
    let w = lab.pod("web-b1");
    lab::sh(&w.ns, "iperf3 -s -D");
    std::thread::sleep(Duration::from_millis(300));
    let to = w.ip4.to_string();
    eprintln!(
        "{underlay:?} kernel pod->pod: {} Gbit/s",
        iperf(&lab, "client-a", &to)
    );
    let objects = lab
        .service("web", 10, "web", None, false)
        .replace("port: 80, targetPort: 8080", "port: 5201, targetPort: 5201")
        .replace("{name: tcp, port: 8080,", "{name: tcp, port: 5201,");
    let a = lab.start_kxdp("node-a", &lab.kxdp_config("node-a", false), &objects);
    let b = lab.start_kxdp("node-b", &lab.kxdp_config("node-b", false), &objects);
    lab.warm_neighbours();
    eprintln!(
        "{underlay:?} kxdp pod->pod: {} Gbit/s",
        iperf(&lab, "client-a", &to)
    );
    eprintln!(
        "{underlay:?} kxdp pod->ClusterIP: {} Gbit/s",
        iperf(&lab, "client-a", "172.30.0.10")
    );
    drop((a, b));
    lab::sh(&lab.pod("web-b1").ns, "pkill iperf3 || true");
}

#[test]
#[ignore = "benchmark: needs iperf3; run with --ignored (module docs)"]
fn overlay_throughput() {
    for _ in 0..2 {
        round(Underlay::Routes);
        round(Underlay::FlannelVxlan);
    }
}
