//! Translation and publication at 1k, 10k and 30k Services × 10 endpoints:
//!
//! - **full build**: `incremental::Builder::full` over the whole state (translation of every
//!   Service into a complete `Snapshot`), and the same through the running control loop (a whole
//!   new state handed over, diffed, built and published; timed until a worker-style reader sees
//!   the new generation);
//! - **one-Service change**: an EndpointSlice update sent to the running control loop
//!   (`minSyncPeriod: 0`), timed from the send until a reader thread spinning on
//!   `Published::load()` (as a worker does between batches) sees the snapshot carrying it.
//!
//! `cargo bench --bench sync` (release); `cargo bench --bench sync -- 1000` for one size.
//! Prints a table; the figures are recorded in docs/benchmarks.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kxdp_control::incremental::Builder;
use kxdp_control::metrics::Metrics;
use kxdp_control::model::{ClusterState, Object};
use kxdp_control::sync::{ControlLoop, Published, Source, Store, Update};
use kxdp_control::Config;

const ENDPOINTS: usize = 10;

fn config() -> Config {
    Config::from_yaml_str(
        "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-0\nnodeIPs: [192.168.0.2]\nclusterCIDRs: [10.0.0.0/8]\nserviceCIDRs: [172.30.0.0/16]\nsync: {minSyncPeriod: 0s, syncPeriod: 1h}\n",
        Path::new("bench.yaml"),
    )
    .unwrap()
}

fn service(i: usize) -> Service {
    let ip = format!("172.30.{}.{}", (i + 1) >> 8, (i + 1) & 255);
    Service {
        metadata: ObjectMeta {
            name: Some(format!("svc-{i}")),
            namespace: Some(format!("ns-{}", i % 100)),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip.clone()),
            cluster_ips: Some(vec![ip]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(8080)),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

fn slice(i: usize, salt: usize) -> EndpointSlice {
    let endpoints = (0..ENDPOINTS)
        .map(|j| {
            let n = i * ENDPOINTS + j + salt;
            Endpoint {
                addresses: vec![format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: Some(format!("node-{}", j % 5)),
                ..Default::default()
            }
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("svc-{i}-abcde")),
            namespace: Some(format!("ns-{}", i % 100)),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_string(),
                format!("svc-{i}"),
            )])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

fn cluster(n: usize) -> ClusterState {
    let mut st = ClusterState::new();
    for i in 0..n {
        st.apply(Object::Service(Box::new(service(i))));
        st.apply(Object::EndpointSlice(Box::new(slice(i, 0))));
    }
    st
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn bench(n: usize) {
    let state = cluster(n);

    // Full build, direct.
    let mut full = Vec::new();
    let mut frontends = 0;
    for _ in 0..5 {
        let mut b = Builder::new(config());
        let t = Instant::now();
        let snap = b.full(&state);
        full.push(t.elapsed());
        frontends = snap.frontends.len();
        assert!(b.problems().is_empty(), "{:?}", &b.problems()[..1]);
        drop(snap);
    }

    // The running loop: initial sync, then one-Service changes seen by a spinning reader.
    let (published, handle) = ControlLoop::spawn(
        config(),
        Source::Manual {
            required: vec!["bench"],
        },
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let tx = handle.sender();
    let seen_gen = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start_ns = Instant::now();
    let seen_at = Arc::new(AtomicU64::new(0));
    let reader = {
        let (p, g, s, at) = (
            published.clone(),
            seen_gen.clone(),
            stop.clone(),
            seen_at.clone(),
        );
        std::thread::spawn(move || {
            let mut cache = p.cache();
            let mut last = 0;
            while !s.load(Ordering::Relaxed) {
                // As a worker between batches.
                let gen = cache.load().generation;
                if gen != last {
                    last = gen;
                    at.store(start_ns.elapsed().as_nanos() as u64, Ordering::Release);
                    g.store(gen, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        })
    };
    let wait_gen = |gen: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen_gen.load(Ordering::Acquire) < gen {
            assert!(Instant::now() < deadline, "generation {gen} never seen");
            std::hint::spin_loop();
        }
        Duration::from_nanos(seen_at.load(Ordering::Acquire))
    };
    let whole = state.clone();
    let t0 = start_ns.elapsed();
    tx.send(Update::ReplaceAll {
        source: "bench".into(),
        state: whole,
    })
    .unwrap();
    let initial = wait_gen(1) - t0;

    let mut change = Vec::new();
    let mut gen = 1;
    for k in 0..200usize {
        let i = (k * 7919) % n;
        let s = slice(i, 1 + k % 2);
        let t0 = start_ns.elapsed();
        tx.send(Update::Apply(Object::EndpointSlice(Box::new(s))))
            .unwrap();
        gen += 1;
        change.push(wait_gen(gen) - t0);
    }
    // A Service change too (a new port), to check the path is the same.
    let mut svc = service(n / 2);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    let t0 = start_ns.elapsed();
    tx.send(Update::Apply(Object::Service(Box::new(svc))))
        .unwrap();
    let svc_change = wait_gen(gen + 1) - t0;
    assert_eq!(published.load().frontends.len(), frontends);
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let st = handle.status();
    handle.shutdown();

    // The same change on this thread: store + retranslate + publish, without the thread hop.
    let mut store = Store::new("node-0");
    store.replace_all(state, SystemTime::now());
    store.changes = Default::default();
    let mut b = Builder::new(config());
    let published = Published::new(b.full(&store.state));
    let mut direct = Vec::new();
    let mut copied = 0;
    for k in 0..200usize {
        let i = (k * 7919) % n;
        let s = slice(i, 1 + k % 2);
        let t = Instant::now();
        store.apply(Object::EndpointSlice(Box::new(s)), SystemTime::now());
        let changes = std::mem::take(&mut store.changes);
        let mut snap = b.update(&store.state, &changes.services);
        snap.generation = k as u64 + 2;
        let old = published.store(Arc::new(snap));
        direct.push(t.elapsed());
        copied += kxdp_dataplane::snapshot::SHARDS
            - published.load().frontends.shared_shards(&old.frontends);
    }

    println!(
        "| {n} | {frontends} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
        ms(median(&mut full)),
        ms(initial),
        ms(median(&mut change)),
        ms(pct(&mut change, 0.99)),
        ms(*change.iter().max().unwrap()),
        ms(svc_change),
        st.syncs,
        ms(median(&mut direct)),
        copied as f64 / 200.0,
    );
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000, 30_000]
    } else {
        sizes
    };
    println!("| Services | frontends | full build (Builder::full, median of 5) | initial sync via loop (send → seen by reader) | one-Service change → seen by reader (median of 200) | p99 | max | Service port change | syncs | one change, same thread (store + update + publish, median) | frontend shards copied per change |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for n in sizes {
        bench(n);
    }
}
