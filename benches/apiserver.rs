//! The API-server source at cluster scale, against the project's fake API server
//! (`tests/fake_apiserver`, real HTTP on 127.0.0.1): N ClusterIP Services × one EndpointSlice of
//! 10 endpoints, all in one namespace.
//!
//! - **initial list**: `ControlLoop` with `Source::Kube` started; every kind listed in pages of
//!   500 (`limit`/`continue`), decoded, stored, built and published; timed until a reader spinning
//!   on `Published::load()` (as a worker) sees all N frontends;
//! - **relist after 410**: every watch cut and the log compacted, so each kind resumes into a
//!   410 and relists (paginated again); one Service changed meanwhile. Timed until the change is
//!   seen; the reader checks at every load that all N frontends stay (forwarding never stalls
//!   or blanks);
//! - the same run's `Builder::full` of the state, as the baseline the two are compared with.
//!
//! `cargo bench --bench apiserver` (30,000 Services); `-- 10000` for another size.

#[path = "../tests/fake_apiserver/mod.rs"]
mod fake_apiserver;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use kxdp_control::metrics::Metrics;
use kxdp_control::sources::kube::KubeOptions;
use kxdp_control::sync::{ControlLoop, Source};
use kxdp_control::Config;
use kxdp_dataplane::snapshot::FrontendKey;
use kxdp_packet::Addr;
use kxdp_packet::IpProto;
use serde_json::{json, Value};

fn config() -> Config {
    Config::from_yaml_str(
        "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-0\nclusterCIDRs: [10.0.0.0/8]\nserviceCIDRs: [172.16.0.0/12]\nsync: {minSyncPeriod: 0s, syncPeriod: 1h}\n",
        std::path::Path::new("bench.yaml"),
    )
    .unwrap()
}

fn cluster_ip(i: usize) -> String {
    let n = i + 1;
    format!("172.{}.{}.{}", 16 + (n >> 16), (n >> 8) & 255, n & 255)
}

fn service(i: usize, port: u16) -> Value {
    let ip = cluster_ip(i);
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
           "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                    "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}]}})
}

fn slice(i: usize) -> Value {
    let eps: Vec<Value> = (0..10)
        .map(|j| {
            let n = i * 10 + j;
            json!({"addresses": [format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": format!("node-{}", j % 5)})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("svc-{i}-0"), "namespace": "default",
                        "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": eps})
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(30_000);
    let server = FakeApiServer::start();
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-0"},
                        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}}));
    for i in 0..n {
        server.apply(service(i, 80));
        server.apply(slice(i));
    }
    server.compact();

    // Baseline: the full build of the same state, in this run.
    let mut state = kxdp_control::model::ClusterState::new();
    let text: String = (0..n)
        .flat_map(|i| [service(i, 80), slice(i)])
        .map(|v| format!("{v}\n"))
        .collect();
    kxdp_control::sources::files::load_str(&text, true, std::path::Path::new("b.json"), &mut state)
        .unwrap();
    let t = Instant::now();
    let snap = kxdp_control::translate::Builder::new(config()).full(&state);
    let full_build = t.elapsed();
    assert_eq!(snap.frontends.len(), n);
    drop((snap, state, text));

    let t0 = Instant::now();
    let (published, handle) = ControlLoop::spawn(
        config(),
        Source::Kube {
            config: Box::new(server.kube_config()),
            options: KubeOptions {
                backoff_min: Duration::from_millis(50),
                backoff_max: Duration::from_millis(400),
                watch_timeout_s: 290,
                read_timeout: Duration::from_secs(90),
            },
        },
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while published.load().frontends.len() < n {
        assert!(Instant::now() < deadline, "initial list never published");
        std::thread::sleep(Duration::from_micros(200));
    }
    let initial = t0.elapsed();
    let pages = server
        .requests()
        .iter()
        .filter(|r| r.plural == "services" && !r.watch && r.method == "GET")
        .count();
    server.wait_watches(7);

    // Relist: a reader checks every snapshot it loads while the relist runs.
    let stop = Arc::new(AtomicBool::new(false));
    let fewest = Arc::new(AtomicUsize::new(usize::MAX));
    let loads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (p, s, f, l) = (
            published.clone(),
            stop.clone(),
            fewest.clone(),
            loads.clone(),
        );
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let len = p.load().frontends.len();
                f.fetch_min(len, Ordering::Relaxed);
                l.fetch_add(1, Ordering::Relaxed);
                std::hint::spin_loop();
            }
        })
    };
    let changed = FrontendKey {
        addr: Addr::from_ip(cluster_ip(n / 2).parse().unwrap()),
        port: 81,
        proto: IpProto::TCP,
    };
    let t0 = Instant::now();
    server.drop_watches();
    server.apply(service(n / 2, 81));
    server.compact();
    let deadline = Instant::now() + Duration::from_secs(120);
    while published.load().frontend(&changed).is_none() {
        assert!(Instant::now() < deadline, "relisted state never published");
        std::thread::sleep(Duration::from_micros(200));
    }
    let relist = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let relists = server
        .requests()
        .iter()
        .filter(|r| r.plural == "services" && !r.watch && r.method == "GET")
        .count()
        - pages;
    handle.shutdown();

    println!("| Services | full build (baseline) | initial list → all published | pages (services) | relist after 410 → change seen | pages (services) | fewest frontends seen by a worker during the relist |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {n} | {} | {} ({:.1}×) | {pages} | {} ({:.1}×) | {relists} | {} of {n} ({} loads) |",
        ms(full_build),
        ms(initial),
        initial.as_secs_f64() / full_build.as_secs_f64(),
        ms(relist),
        relist.as_secs_f64() / full_build.as_secs_f64(),
        fewest.load(Ordering::Relaxed),
        loads.load(Ordering::Relaxed),
    );
}
