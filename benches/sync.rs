//! The control plane at cluster scale: N ClusterIP Services × 10 endpoints (one TCP port, one
//! EndpointSlice each, endpoints on 5 nodes) in three layouts:
//!
//! - `spread`: the Services over 100 namespaces;
//! - `one-ns`: every Service in one namespace (large clusters do this; a namespace scan per
//!   Service made this quadratic);
//! - `big`: as `one-ns`, and Service 0 has 5,000 endpoints in 50 slices.
//!
//! For each layout:
//!
//! - **slice lookup**: every Service's EndpointSlices found through the index, against the old
//!   namespace scan as the same-run baseline (for `one-ns`/`big` the scan is timed on a sample of
//!   Services and scaled: the whole would take minutes);
//! - **full build**: `translate::Builder::full` (median of 3);
//! - **initial sync via loop**: a `ControlLoop` (`minSyncPeriod: 0`) handed the whole state;
//!   timed from the send until a reader spinning on `Published::cache().load()` (as a worker
//!   between batches) sees generation 1;
//! - **one change → seen**: 200 EndpointSlice updates (and, in `big`, updates of the big
//!   Service's slices), each timed from the send until the reader sees it; the same changes on
//!   one thread (store + update + publish) as the work alone;
//! - **burst**: 1,000 changes per second for 3 s to a loop with `minSyncPeriod: 1s` (kube-proxy's
//!   default): how many rebuilds, and how long after the last change it is seen;
//! - **startup from --state**: the state written as YAML (one file, as `kxdp pcap gen` writes
//!   it), then `sources::files::load_state` (YAML parsing, typed decoding; its phases: reading
//!   the file, decoding on all cores, storing) and a full build; the YAML parser alone
//!   (`yaml_serde` to JSON values) is timed separately to say where the time goes, and so is
//!   decoding every document into its type on one thread (`yaml_serde` alone, against the
//!   fast path's strict reading: the block-subset reader, `yaml_serde` for what it leaves);
//! - **memory**: live heap (a counting allocator) of the typed objects alone, and of what the
//!   control loop keeps: the store (the objects), the builder (each Service's translation and
//!   frontend claims) and the published snapshot.
//!
//! `cargo bench --bench sync` (release): 30,000 Services in every layout;
//! `cargo bench --bench sync -- 10000 one-ns` for one size and layout; `-- startup` for the
//! startup column alone; `-- 150000 pods` for memory and policy compile times at
//! 150k pods.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kxdp_control::metrics::Metrics;
use kxdp_control::model::{service_name_of, ClusterState, Object, ObjectKey};
use kxdp_control::sources::event::Update;
use kxdp_control::sources::files::decode_one_document;
use kxdp_control::store::Store;
use kxdp_control::sync::{ControlLoop, Published, Source};
use kxdp_control::translate::Builder;
use kxdp_control::Config;

/// Counts live heap bytes (for the memory columns).
#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

fn live() -> usize {
    ALLOC.allocated()
}

const ENDPOINTS: usize = 10;
const BIG_ENDPOINTS: usize = 5000;
const PER_SLICE: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Spread,
    OneNs,
    Big,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Spread => "spread",
            Layout::OneNs => "one-ns",
            Layout::Big => "big",
        }
    }

    fn namespace(self, i: usize) -> String {
        match self {
            Layout::Spread => format!("ns-{}", i % 100),
            _ => "default".into(),
        }
    }

    /// Endpoints of Service `i`.
    fn endpoints(self, i: usize) -> usize {
        if self == Layout::Big && i == 0 {
            BIG_ENDPOINTS
        } else {
            ENDPOINTS
        }
    }
}

fn config(min_sync: &str) -> Config {
    Config::from_yaml_str(
        &format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-0\nnodeIPs: [192.168.0.2]\nclusterCIDRs: [10.0.0.0/8]\nserviceCIDRs: [172.16.0.0/12]\nsync: {{minSyncPeriod: {min_sync}, syncPeriod: 1h}}\n"),
        Path::new("bench.yaml"),
    )
    .unwrap()
}

fn cluster_ip(i: usize) -> String {
    let n = i + 1;
    format!("172.{}.{}.{}", 16 + (n >> 16), (n >> 8) & 255, n & 255)
}

fn endpoint_ip(n: usize) -> String {
    format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)
}

fn service(layout: Layout, i: usize) -> Service {
    let ip = cluster_ip(i);
    Service {
        metadata: ObjectMeta {
            name: Some(format!("svc-{i}")),
            namespace: Some(layout.namespace(i)),
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

/// Slice `k` of Service `i`; `salt` moves the endpoint addresses (a change).
fn slice(layout: Layout, i: usize, k: usize, salt: usize) -> EndpointSlice {
    let total = layout.endpoints(i);
    let base = if i == 0 {
        0
    } else {
        BIG_ENDPOINTS + i * ENDPOINTS
    };
    // The big Service's changes move a slice's addresses by whole blocks of its size: each
    // change's addresses are new and in no other slice (the EndpointSlice controller never puts
    // one endpoint in two slices of a Service; a shift by `salt` alone would leave every changed
    // slice sharing addresses with its neighbour for good).
    let shift = if i == 0 { salt * BIG_ENDPOINTS } else { salt };
    let endpoints = (k * PER_SLICE..((k + 1) * PER_SLICE).min(total))
        .map(|j| Endpoint {
            addresses: vec![endpoint_ip(base + j + shift)],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some(format!("node-{}", j % 5)),
            ..Default::default()
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("svc-{i}-{k}")),
            namespace: Some(layout.namespace(i)),
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

fn slices_of(layout: Layout, i: usize) -> usize {
    layout.endpoints(i).div_ceil(PER_SLICE)
}

fn cluster(layout: Layout, n: usize) -> ClusterState {
    let mut st = ClusterState::new();
    for i in 0..n {
        st.apply(Object::Service(Box::new(service(layout, i))));
        for k in 0..slices_of(layout, i) {
            st.apply(Object::EndpointSlice(Box::new(slice(layout, i, k, 0))));
        }
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

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// The lookup the store did before the index: every slice of the namespace, filtered by label.
fn scan_slices<'a>(st: &'a ClusterState, svc: &'a ObjectKey) -> usize {
    st.endpoint_slices
        .range(ObjectKey::new(svc.namespace.clone(), String::new())..)
        .take_while(|(k, _)| k.namespace == svc.namespace)
        .filter(|(_, s)| service_name_of(s) == Some(svc.name.as_str()))
        .count()
}

/// A reader thread that spins on the published tables as a worker does between batches and
/// records when it first sees each generation.
struct Reader {
    seen_gen: Arc<AtomicU64>,
    seen_at: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    start: Instant,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    fn start(published: Arc<Published>) -> Reader {
        let seen_gen = Arc::new(AtomicU64::new(0));
        let seen_at = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let (g, at, s) = (seen_gen.clone(), seen_at.clone(), stop.clone());
        // The bench's thread waits parked, woken by the reader once it has noted the time: a
        // second spinning thread would take the core the control loop needs (the machine has
        // two), which a worker on its own core never does.
        let waiter = std::thread::current();
        let thread = std::thread::spawn(move || {
            let mut cache = published.cache();
            let mut last = 0;
            while !s.load(Ordering::Relaxed) {
                let gen = cache.load().generation;
                if gen != last {
                    last = gen;
                    at.store(start.elapsed().as_nanos() as u64, Ordering::Release);
                    g.store(gen, Ordering::Release);
                    waiter.unpark();
                }
                std::hint::spin_loop();
            }
        });
        Reader {
            seen_gen,
            seen_at,
            stop,
            start,
            thread: Some(thread),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// When generation `gen` (or a later one) was first seen.
    fn wait(&self, gen: u64) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.seen_gen.load(Ordering::Acquire) < gen {
            assert!(Instant::now() < deadline, "generation {gen} never seen");
            std::thread::park_timeout(Duration::from_millis(10));
        }
        Duration::from_nanos(self.seen_at.load(Ordering::Acquire))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The changes the change columns send: (Service, slice) pairs spread over the cluster, and
/// for `big` every other one to the big Service.
fn change_targets(layout: Layout, n: usize) -> Vec<(usize, usize)> {
    (0..200usize)
        .map(|k| {
            if layout == Layout::Big && k % 2 == 0 {
                (0, k / 2 % slices_of(layout, 0))
            } else {
                ((k * 7919) % n, 0)
            }
        })
        .collect()
}

fn write_yaml(layout: Layout, n: usize, path: &Path) {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    writeln!(w, "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-0\nstatus:\n  addresses:\n    - {{type: InternalIP, address: 192.168.0.2}}").unwrap();
    for i in 0..n {
        let ns = layout.namespace(i);
        let ip = cluster_ip(i);
        write!(w, "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: {ns}\nspec:\n  type: ClusterIP\n  clusterIP: \"{ip}\"\n  clusterIPs: [\"{ip}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}\n").unwrap();
        for k in 0..slices_of(layout, i) {
            let s = slice(layout, i, k, 0);
            write!(w, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-{k}\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n").unwrap();
            for e in &s.endpoints {
                write!(w, "- addresses: [\"{}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  nodeName: {}\n", e.addresses[0], e.node_name.as_deref().unwrap()).unwrap();
            }
        }
    }
}

fn bench(layout: Layout, n: usize) {
    let heap0 = live();
    let state = cluster(layout, n);
    let state_bytes = live() - heap0;
    let slices = state.endpoint_slices.len();

    // Slice lookup: index vs the old namespace scan (sampled when quadratic).
    let keys: Vec<ObjectKey> = state.services.keys().cloned().collect();
    let t = Instant::now();
    let mut found = 0;
    for k in &keys {
        found += state.slices_of(k).count();
    }
    let index_time = t.elapsed();
    assert_eq!(found, slices);
    let sample = if layout == Layout::Spread {
        keys.len()
    } else {
        keys.len().min(300)
    };
    let t = Instant::now();
    let mut scanned = 0;
    for k in keys.iter().step_by(keys.len() / sample) {
        scanned += scan_slices(&state, k);
    }
    let scan_time = t.elapsed().mul_f64(keys.len() as f64 / sample as f64);
    assert!(scanned > 0);

    // Full build.
    let mut full = Vec::new();
    let mut frontends = 0;
    for _ in 0..3 {
        let mut b = Builder::new(config("0s"));
        let t = Instant::now();
        let snap = b.full(&state);
        full.push(t.elapsed());
        frontends = snap.frontends.len();
        assert!(b.problems().is_empty(), "{:?}", &b.problems()[..1]);
    }
    assert_eq!(frontends, n);

    // Memory of what the loop keeps: store + builder + published snapshot.
    let heap1 = live();
    let mut store = Store::new("node-0");
    store.replace_all(state.clone(), SystemTime::now());
    store.changes = Default::default();
    let store_bytes = live() - heap1;
    let mut b = Builder::new(config("0s"));
    let published = Published::new(b.full(&store.state));
    let kept_bytes = live() - heap1;

    // The same changes on this thread (the work alone).
    let targets = change_targets(layout, n);
    let mut direct = Vec::new();
    let mut direct_big = Vec::new();
    for (k, &(i, s)) in targets.iter().enumerate() {
        // A salt never used before for this slice: every change is a change.
        let sl = slice(layout, i, s, 1 + k);
        let t = Instant::now();
        store.apply(Object::EndpointSlice(Box::new(sl)), SystemTime::now());
        let changes = std::mem::take(&mut store.changes);
        let mut snap = b
            .apply(&store.state, &changes, &|| false)
            .expect("not stopped");
        snap.generation = k as u64 + 2;
        published.store(Arc::new(snap));
        if layout == Layout::Big && i == 0 {
            direct_big.push(t.elapsed());
        } else {
            direct.push(t.elapsed());
        }
    }
    drop((store, b, published));

    // The running loop: initial sync, then changes seen by a spinning reader.
    let (published, handle) = ControlLoop::spawn(
        config("0s"),
        Source::Manual {
            required: vec!["bench"],
        },
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let tx = handle.sender();
    let reader = Reader::start(published.clone());
    let whole = state.clone();
    let t0 = reader.now();
    tx.send(Update::ReplaceAll {
        source: "bench".into(),
        state: whole,
    })
    .unwrap();
    let initial = reader.wait(1) - t0;
    let mut change = Vec::new();
    let mut change_big = Vec::new();
    let mut gen = 1;
    for (k, &(i, s)) in targets.iter().enumerate() {
        // A salt never used before for this slice: every change is a change.
        let sl = slice(layout, i, s, 1 + k);
        let t0 = reader.now();
        tx.send(Update::Apply(Object::EndpointSlice(Box::new(sl))))
            .unwrap();
        gen += 1;
        let d = reader.wait(gen) - t0;
        if layout == Layout::Big && i == 0 {
            change_big.push(d);
        } else {
            change.push(d);
        }
    }
    assert_eq!(published.load().frontends.len(), n);
    drop(reader);
    handle.shutdown();

    // A burst of 1,000 changes per second for 3 s, minSyncPeriod 1 s.
    let (published, handle) = ControlLoop::spawn(
        config("1s"),
        Source::Manual {
            required: vec!["bench"],
        },
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let tx = handle.sender();
    let reader = Reader::start(published.clone());
    tx.send(Update::ReplaceAll {
        source: "bench".into(),
        state: state.clone(),
    })
    .unwrap();
    reader.wait(1);
    let burst_start = Instant::now();
    let mut sent = 0usize;
    let mut last_target = (0, 0, 0);
    while burst_start.elapsed() < Duration::from_secs(3) {
        // Paced at one change per millisecond.
        while sent < burst_start.elapsed().as_millis() as usize {
            let i = 1 + (sent * 7919) % (n - 1);
            let salt = 1 + sent % 7;
            tx.send(Update::Apply(Object::EndpointSlice(Box::new(slice(
                layout, i, 0, salt,
            )))))
            .unwrap();
            last_target = (i, salt, sent);
            sent += 1;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let last_sent = reader.now();
    // Seen when the last change's endpoint is in the tables.
    let (i, salt, _) = last_target;
    let want = kxdp_packet::Addr::from_ip(
        endpoint_ip(BIG_ENDPOINTS + i * ENDPOINTS + salt)
            .parse()
            .unwrap(),
    );
    let key = kxdp_dataplane::snapshot::FrontendKey {
        addr: kxdp_packet::Addr::from_ip(cluster_ip(i).parse().unwrap()),
        port: 80,
        proto: kxdp_packet::IpProto::TCP,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snap = published.load();
        let fe = snap.frontend(&key).expect("frontend");
        if fe.endpoints.iter().any(|e| e.addr == want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "last change of the burst never seen"
        );
        drop(snap);
        std::thread::sleep(Duration::from_micros(100));
    }
    let burst_lag = reader.now() - last_sent;
    let st = handle.status();
    drop(reader);
    handle.shutdown();

    let startup = startup(layout, n);
    println!(
        "| {} | {n} | {slices} | {} → {} | {} | {} | {} / {} | {} / {} | {} | {} | {} ({} syncs for {sent} changes) | {startup} | {} | {} ({:.2}×) |",
        layout.name(),
        ms(scan_time),
        ms(index_time),
        ms(median(&mut full)),
        ms(initial),
        ms(median(&mut change)),
        ms(pct(&mut change, 0.99)),
        if change_big.is_empty() { "-".into() } else { ms(median(&mut change_big)) },
        if change_big.is_empty() { "-".into() } else { ms(pct(&mut change_big, 0.99)) },
        ms(median(&mut direct)),
        if direct_big.is_empty() { "-".into() } else { ms(median(&mut direct_big)) },
        ms(burst_lag),
        st.syncs - 1,
        mib(state_bytes),
        mib(kept_bytes),
        kept_bytes as f64 / state_bytes as f64,
    );
    eprintln!(
        "{}: store {} (the objects, once), builder + snapshot {}",
        layout.name(),
        mib(store_bytes),
        mib(kept_bytes - store_bytes)
    );
}

/// Startup from --state files: the state as one YAML file; the old reader's first pass (the
/// YAML parser into JSON values, one document after the other) as the same-run baseline, then
/// `load_state` (split, decode on all cores, store) and the full build.
fn startup(layout: Layout, n: usize) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.yaml");
    write_yaml(layout, n, &file);
    let yaml_size = std::fs::metadata(&file).unwrap().len();
    let text = std::fs::read_to_string(&file).unwrap();
    let t = Instant::now();
    let mut docs = 0;
    for de in yaml_serde::Deserializer::from_str(&text) {
        let v = <serde_json::Value as serde::Deserialize>::deserialize(de).unwrap();
        docs += v.is_object() as usize;
    }
    let parse = t.elapsed();
    // The same documents, one thread, each straight into its type: `yaml_serde` alone (which
    // takes a plain `80` for a string: not strict enough for the fast path), and read strictly,
    // as `sources/files/documents.rs` decodes them on every core (the block-subset reader,
    // `sources/files/block_yaml.rs`, with `yaml_serde` for what it leaves).
    let documents: Vec<&str> = text.split("---\n").filter(|d| !d.is_empty()).collect();
    let serde_typed = typed_all(
        &documents,
        |d| yaml_serde::from_str::<Service>(d).is_ok(),
        |d| yaml_serde::from_str::<EndpointSlice>(d).is_ok(),
    );
    let strict_typed = typed_all(
        &documents,
        |d| decode_one_document::<Service>(d).is_some(),
        |d| decode_one_document::<EndpointSlice>(d).is_some(),
    );
    drop(documents);
    drop(text);
    let t = Instant::now();
    let (loaded, phases) = kxdp_control::sources::files::load_state_timed(&file).unwrap();
    let load = t.elapsed();
    assert_eq!(loaded.services.len(), n);
    let t = Instant::now();
    let snap = Builder::new(config("0s")).full(&loaded);
    let startup_build = t.elapsed();
    assert_eq!(snap.frontends.len(), n);

    format!(
        "{:.0} MB, {docs} docs: baseline (old reader, YAML parser alone) {}; typed, one thread: yaml_serde {} / read strictly {} ({:.2}×); load {} (read {}, decode {}, store {}) + build {} = {}",
        yaml_size as f64 / 1e6,
        ms(parse),
        ms(serde_typed),
        ms(strict_typed),
        serde_typed.as_secs_f64() / strict_typed.as_secs_f64(),
        ms(load),
        ms(phases.read),
        ms(phases.decode),
        ms(phases.store),
        ms(startup_build),
        ms(load + startup_build),
    )
}

/// Decodes every Service and EndpointSlice document with `service` / `slice` (the Node is
/// skipped); the time taken.
fn typed_all(
    documents: &[&str],
    service: impl Fn(&str) -> bool,
    slice: impl Fn(&str) -> bool,
) -> Duration {
    let t = Instant::now();
    let mut ok = 0;
    for d in documents {
        if d.starts_with("apiVersion: v1\nkind: Service\n") {
            ok += service(d) as usize;
        } else if d.starts_with("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n") {
            ok += slice(d) as usize;
        }
    }
    let took = t.elapsed();
    assert_eq!(ok, documents.len() - 1, "every document decodes");
    took
}

/// Memory at 150k pods (5,000 nodes' worth): the Pods as the store keeps them (a `PodRecord`
/// each: labels, node, hostNetwork, named container ports, phase, addresses; label sets, node
/// names and port lists shared), against the size of those fields written out plainly (what
/// must be kept), then what the policy compiler keeps besides (its peer index), with 1,000
/// NetworkPolicies of 10 per namespace, and the times of a full compile and of one pod's label
/// change.
fn pods(n: usize) {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodIP, PodSpec, PodStatus};
    use k8s_openapi::api::networking::v1::{
        NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let namespaces = 100;
    let pod = |i: usize, app: String| {
        let k = i + 1;
        let ip = format!("10.{}.{}.{}", 1 + (k >> 16), (k >> 8) & 255, k & 255);
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("p-{i}")),
                namespace: Some(format!("ns-{}", i % namespaces)),
                labels: Some(BTreeMap::from([
                    ("app".to_string(), app),
                    (
                        "tier".to_string(),
                        if i % 2 == 0 { "front" } else { "back" }.to_string(),
                    ),
                    ("version".to_string(), format!("v{}", i % 3)),
                ])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(format!("node-{}", i % 5000)),
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![ContainerPort {
                        name: Some("http".into()),
                        container_port: 8080,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some(ip.clone()),
                pod_ips: Some(vec![PodIP { ip }]),
                ..Default::default()
            }),
        }
    };
    let heap0 = live();
    let mut state = ClusterState::new();
    for i in 0..n {
        state.apply(Object::Pod(Box::new(pod(i, format!("app-{}", i % 25)))));
    }
    let pods_bytes = live() - heap0;
    // What must be kept, written out plainly: namespace and name, each label's key and value,
    // the node's name, 16 bytes per address, each named port's name, protocol and number
    // (3 bytes), hostNetwork and phase (1 byte each).
    let kept: usize = state
        .pods
        .iter()
        .map(|(k, p)| {
            k.namespace.len()
                + k.name.len()
                + p.labels
                    .iter()
                    .map(|(a, b)| a.len() + b.len())
                    .sum::<usize>()
                + p.node.len()
                + 16 * p.ips.len()
                + p.ports
                    .iter()
                    .map(|(name, _, _)| name.len() + 3)
                    .sum::<usize>()
                + 2
        })
        .sum();
    // Same-run baseline: the same records in the earlier layout, one map keyed by
    // `ObjectKey` (two `String`s per pod).
    let heap_b = live();
    let mut by_object_key: BTreeMap<ObjectKey, kxdp_control::model::PodRecord> = BTreeMap::new();
    for i in 0..n {
        // In the order the pods arrived (the B-tree's fill depends on it); the records' shared
        // parts are the store's (not counted again).
        let k = ObjectKey::new(format!("ns-{}", i % namespaces), format!("p-{i}"));
        let p = state.pods.get(&k).expect("pod").clone();
        by_object_key.insert(k, p);
    }
    let by_object_key_bytes = live() - heap_b;
    drop(by_object_key);
    for ns in 0..namespaces {
        for k in 0..10 {
            let sel = |app: String| LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_string(), app)])),
                ..Default::default()
            };
            state.apply(Object::NetworkPolicy(Box::new(NetworkPolicy {
                metadata: ObjectMeta {
                    name: Some(format!("np-{k}")),
                    namespace: Some(format!("ns-{ns}")),
                    ..Default::default()
                },
                spec: Some(NetworkPolicySpec {
                    pod_selector: Some(sel(format!("app-{}", k % 25))),
                    ingress: Some(vec![NetworkPolicyIngressRule {
                        from: Some(vec![NetworkPolicyPeer {
                            pod_selector: Some(sel(format!("app-{}", (k * 7 + 3) % 25))),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            })));
        }
    }
    let node = [kxdp_packet::Addr::from_ip("192.168.0.2".parse().unwrap())];
    let heap1 = live();
    let mut compiler = kxdp_control::policy::PolicyCompiler::new();
    let t = Instant::now();
    let (tables, _) = compiler.compile("node-0", &node, &state);
    let full = t.elapsed();
    drop(tables);
    let compiler_bytes = live() - heap1;
    // One local pod's label changed, back and forth.
    let key = ObjectKey::new("ns-0", "p-0");
    let changed: std::collections::BTreeSet<ObjectKey> = [key].into();
    let mut times = Vec::new();
    for round in 0..20 {
        let app = if round % 2 == 0 {
            "relabelled".to_string()
        } else {
            "app-0".to_string()
        };
        state.apply(Object::Pod(Box::new(pod(0, app))));
        let t = Instant::now();
        let changes = kxdp_control::policy::PolicyChanges {
            pods: &changed,
            namespaces: false,
            policies: false,
            cluster_policies: false,
        };
        let r = compiler.compile_changes("node-0", &node, &state, Some(changes));
        times.push(t.elapsed());
        drop(r);
    }
    println!("| pods | Pods as stored (heap) | fields kept, written plainly | stored / kept | baseline: the same records keyed by ObjectKey (heap; / kept) | policy compiler's index and caches (heap) | full compile, 1,000 policies | one pod's label changed (median of 20) |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {n} | {} ({} bytes per pod) | {} ({} bytes per pod) | {:.2} | {} ({:.2}) | {} ({:.2}× the Pods) | {} | {} |",
        mib(pods_bytes),
        pods_bytes / n,
        mib(kept),
        kept / n,
        pods_bytes as f64 / kept as f64,
        mib(by_object_key_bytes),
        by_object_key_bytes as f64 / kept as f64,
        mib(compiler_bytes),
        compiler_bytes as f64 / pods_bytes as f64,
        ms(full),
        ms(median(&mut times)),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![30_000]
    } else {
        sizes
    };
    let layouts: Vec<Layout> = [Layout::Spread, Layout::OneNs, Layout::Big]
        .into_iter()
        .filter(|l| {
            !args
                .iter()
                .any(|a| ["spread", "one-ns", "big"].contains(&a.as_str()))
                || args.iter().any(|a| a == l.name())
        })
        .collect();
    println!("| layout | Services | slices | slice lookup, all Services: scan (before) → index | full build (median of 3) | initial sync via loop | one change → seen (median / p99) | big Service change → seen (median / p99) | one change, same thread (median) | big Service change, same thread | burst 1,000/s × 3 s, minSyncPeriod 1 s: last change seen after | startup from --state: baseline (old YAML parser alone); load + build | typed objects (heap) | store + builder + snapshot (heap) |");
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    if args.iter().any(|a| a == "pods") {
        pods(sizes.first().copied().unwrap_or(150_000));
        return;
    }
    let only_startup = args.iter().any(|a| a == "startup");
    for n in sizes {
        for &l in &layouts {
            if only_startup {
                println!("| {} | {n} | {} |", l.name(), startup(l, n));
            } else {
                bench(l, n);
            }
        }
    }
}
