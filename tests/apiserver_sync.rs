//! The control loop against a stateful fake API server over HTTP (kube-rs watchers, the real
//! sync code): initial sync, updates, deletes, selectors, a forced 410 and relist, a dropped
//! connection, the server down for a while and back, the server answering 429 or 500 or nothing
//! at all, a malformed object, metrics.
//!
//! Every wait is bounded; servers listen on ephemeral ports of 127.0.0.1 and stop with the test.

mod fake_apiserver;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_apiserver::{FakeApiServer, Fault};
use kxdp_control::metrics::Metrics;
use kxdp_control::sources::kube::KubeOptions;
use kxdp_control::sync::{ControlHandle, ControlLoop, Published, Source};
use kxdp_control::Config;
use kxdp_dataplane::snapshot::{FrontendKey, Snapshot};
use kxdp_packet::Addr;
use kxdp_packet::IpProto;
use serde_json::{json, Value};

pub fn config(min_sync: &str) -> Config {
    Config::from_yaml_str(
        &format!(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nclusterCIDRs: [10.0.0.0/8]\nserviceCIDRs: [172.30.0.0/16]\nsync: {{minSyncPeriod: {min_sync}, syncPeriod: 1h}}\n"
        ),
        std::path::Path::new("config.yaml"),
    )
    .unwrap()
}

fn fast() -> KubeOptions {
    KubeOptions {
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
        watch_timeout_s: 290,
        read_timeout: Duration::from_secs(90),
    }
}

pub fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}},
           "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}})
}

pub fn service(name: &str, ip: &str, port: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "ns"},
           "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}]}})
}

pub fn slice(name: &str, svc: &str, ips: &[&str]) -> Value {
    let eps: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-b"}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": svc},
                        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2025-01-01T00:00:00Z"}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps})
}

fn key(ip: &str, port: u16) -> FrontendKey {
    FrontendKey {
        addr: Addr::from_ip(ip.parse().unwrap()),
        port,
        proto: IpProto::TCP,
    }
}

/// The endpoints a pod client would be sent to for `ip:port`, read as a worker reads: `load()`
/// between batches. None: no frontend.
pub fn endpoints(snap: &Snapshot, ip: &str, port: u16) -> Option<Vec<String>> {
    let fe = snap.frontend(&key(ip, port))?;
    let r = &fe.routes[0];
    let mut v: Vec<String> = fe
        .endpoints_of(r.endpoints)
        .iter()
        .map(|e| format!("{}:{}", e.addr.to_ip(kxdp_packet::Family::V4), e.port))
        .collect();
    v.sort();
    Some(v)
}

/// Polls what a worker sees until `pred` holds (10 s at most).
pub fn wait_for(published: &Published, what: &str, pred: impl Fn(&Snapshot) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        {
            let snap = published.load();
            if pred(&snap) {
                return;
            }
        }
        if Instant::now() > deadline {
            let snap = published.load();
            panic!(
                "timed out waiting for: {what} (generation {}, {} frontends)",
                snap.generation,
                snap.frontends.len()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_status(
    h: &ControlHandle,
    what: &str,
    pred: impl Fn(&kxdp_control::status::Status) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = h.status();
        if pred(&st) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for status: {what}: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn start(server: &FakeApiServer) -> (Arc<Published>, ControlHandle) {
    start_with(server, fast())
}

fn start_with(server: &FakeApiServer, options: KubeOptions) -> (Arc<Published>, ControlHandle) {
    ControlLoop::spawn(
        config("0s"),
        Source::Kube {
            config: Box::new(server.kube_config()),
            options,
        },
        Arc::new(Metrics::new()),
    )
    .unwrap()
}

fn seeded() -> FakeApiServer {
    let s = FakeApiServer::start();
    s.set_bookmark_interval(Duration::from_millis(100));
    s.apply(node());
    s.apply(service("web", "172.30.0.10", 80));
    s.apply(slice("web-1", "web", &["10.1.0.1", "10.1.0.2"]));
    s.apply(service("db", "172.30.0.11", 5432));
    s
}

fn lists_of(server: &FakeApiServer, plural: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.plural == plural && r.method == "GET" && !r.watch)
        .count()
}

#[test]
fn initial_sync_updates_deletes_and_selectors() {
    let server = seeded();
    let (published, h) = start(&server);
    assert_eq!(published.load().generation, 0);
    wait_for(&published, "initial sync", |s| {
        endpoints(s, "172.30.0.10", 80)
            == Some(vec!["10.1.0.1:8080".into(), "10.1.0.2:8080".into()])
    });
    let snap = published.load_full();
    assert!(snap.generation >= 1);
    // The node's address came from the Node object (field-selected watch).
    assert_eq!(snap.node.addrs.len(), 1);
    assert_eq!(endpoints(&snap, "172.30.0.11", 5432), Some(vec![]));
    // kube-proxy's selectors were sent (once every watch is open: the first publication can
    // come before the last watch request).
    server.wait_watches(8);
    let reqs = server.requests();
    assert!(reqs.iter().any(|r| r.plural == "services"
        && r.label_selector.as_deref()
            == Some("!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless")));
    assert!(reqs.iter().any(
        |r| r.plural == "nodes" && r.field_selector.as_deref() == Some("metadata.name=node-a")
    ));
    // Watches resume from the list's resourceVersion, with bookmarks.
    assert!(reqs
        .iter()
        .any(|r| r.plural == "services" && r.watch && r.resource_version.is_some()));

    // Update: a new endpoint.
    server.apply(slice("web-1", "web", &["10.1.0.1", "10.1.0.2", "10.1.0.3"]));
    wait_for(&published, "endpoint added", |s| {
        endpoints(s, "172.30.0.10", 80).is_some_and(|e| e.len() == 3)
    });
    // A second slice for db.
    server.apply(slice("db-1", "db", &["10.2.0.1"]));
    wait_for(&published, "db endpoints", |s| {
        endpoints(s, "172.30.0.11", 5432) == Some(vec!["10.2.0.1:8080".into()])
    });
    // Service update: port change.
    server.apply(service("web", "172.30.0.10", 81));
    wait_for(&published, "port moved", |s| {
        endpoints(s, "172.30.0.10", 80).is_none() && endpoints(s, "172.30.0.10", 81).is_some()
    });
    // Delete.
    server.delete("Service", "ns", "db");
    wait_for(&published, "db gone", |s| {
        endpoints(s, "172.30.0.11", 5432).is_none()
    });
    // A Service that gains kube-proxy's service-proxy-name label leaves (the watch sees DELETED),
    // and comes back without it.
    server.patch(
        "Service",
        "ns",
        "web",
        json!({"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": "other"}}}),
    );
    wait_for(&published, "proxied elsewhere", |s| {
        endpoints(s, "172.30.0.10", 81).is_none()
    });
    server.patch(
        "Service",
        "ns",
        "web",
        json!({"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": null}}}),
    );
    wait_for(&published, "back", |s| {
        endpoints(s, "172.30.0.10", 81).is_some()
    });
    // Headless-labelled Services are never listed.
    let mut headless = service("hl", "172.30.0.12", 80);
    headless["metadata"]["labels"] = json!({"service.kubernetes.io/headless": ""});
    server.apply(headless);
    server.apply(service("after", "172.30.0.13", 80));
    wait_for(&published, "after", |s| {
        endpoints(s, "172.30.0.13", 80).is_some()
    });
    assert!(endpoints(&published.load(), "172.30.0.12", 80).is_none());

    // Metrics moved with kube-proxy's names.
    let text = h.metrics().encode();
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_service_changes_total"),
        "{text}"
    );
    let changes = text
        .lines()
        .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_endpoint_changes_total"))
        .unwrap();
    assert_ne!(
        changes,
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 0"
    );
    assert!(text.contains("kubeproxy_network_programming_duration_seconds_count"));
    h.shutdown();
}

#[test]
fn dropped_connection_resumes_from_resource_version() {
    let server = seeded();
    let (published, h) = start(&server);
    wait_for(&published, "initial sync", |s| {
        endpoints(s, "172.30.0.10", 80).is_some()
    });
    server.wait_watches(8);
    let lists = lists_of(&server, "services");
    let rv_before = server.resource_version();
    server.drop_watches();
    server.apply(service("new", "172.30.0.20", 80));
    wait_for(&published, "change after the drop", |s| {
        endpoints(s, "172.30.0.20", 80).is_some()
    });
    // Resumed, not relisted: a watch from a resourceVersion at or after the one before the drop.
    assert_eq!(
        lists_of(&server, "services"),
        lists,
        "a dropped watch must resume, not relist"
    );
    assert!(server.requests().iter().any(|r| r.plural == "services"
        && r.watch
        && r.resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|v| v >= rv_before - 5)));
    h.shutdown();
}

#[test]
fn paginated_list_and_relist_keep_forwarding() {
    // 1,200 Services and slices: three pages of 500 per kind.
    let server = FakeApiServer::start();
    server.set_bookmark_interval(Duration::from_millis(100));
    server.apply(node());
    let n = 1200;
    let ip = |i: usize| format!("172.30.{}.{}", 1 + i / 250, 1 + i % 250);
    for i in 0..n {
        server.apply(service(&format!("s{i}"), &ip(i), 80));
        let ep = format!("10.1.{}.{}", i / 250, 1 + i % 250);
        server.apply(slice(&format!("s{i}-1"), &format!("s{i}"), &[ep.as_str()]));
    }
    server.compact();
    let (published, h) = start(&server);
    wait_for(&published, "every Service", |s| s.frontends.len() == n);
    let pages: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.plural == "services" && !r.watch && r.method == "GET")
        .collect();
    assert!(
        pages.iter().all(|r| r.limit.as_deref() == Some("500")),
        "{pages:?}"
    );
    assert_eq!(
        pages.iter().filter(|r| r.continue_token.is_some()).count(),
        2,
        "pages 2 and 3 continue the first: {pages:?}"
    );
    server.wait_watches(8);

    // A relist after 410 (on resume from a compacted resourceVersion): a worker sees every
    // Service at every moment meanwhile, then the change made while the watches were down.
    let lists = lists_of(&server, "services");
    server.drop_watches();
    server.apply(service("s0", &ip(0), 81));
    server.compact();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = published.load();
        assert!(
            snap.frontends.len() >= n - 1 && endpoints(&snap, &ip(1), 80).is_some(),
            "generation {}: {} frontends during the relist",
            snap.generation,
            snap.frontends.len()
        );
        if endpoints(&snap, &ip(0), 81).is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "relisted state never published");
        drop(snap);
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        lists_of(&server, "services") >= lists + 3,
        "a paginated relist"
    );
    h.shutdown();
}

#[test]
fn gone_forces_a_relist() {
    let server = seeded();
    let (published, h) = start(&server);
    wait_for(&published, "initial sync", |s| {
        endpoints(s, "172.30.0.10", 80).is_some()
    });
    server.wait_watches(8);
    let lists = lists_of(&server, "services");
    // 410 on every open watch, mid-stream.
    server.send_gone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lists_of(&server, "services") == lists {
        assert!(Instant::now() < deadline, "no relist after 410");
        std::thread::sleep(Duration::from_millis(10));
    }
    // And a resume from a compacted resourceVersion: 410 as the watch's first event.
    server.drop_watches();
    server.delete("Service", "ns", "db");
    server.apply(service("new", "172.30.0.21", 80));
    server.compact();
    wait_for(&published, "state after compaction", |s| {
        endpoints(s, "172.30.0.21", 80).is_some() && endpoints(s, "172.30.0.11", 5432).is_none()
    });
    assert!(endpoints(&published.load(), "172.30.0.10", 80).is_some());
    h.shutdown();
}

#[test]
fn server_down_keeps_last_good_tables() {
    let mut server = seeded();
    let (published, h) = start(&server);
    wait_for(&published, "initial sync", |s| {
        endpoints(s, "172.30.0.10", 80).is_some()
    });
    // The initial sync may publish more than once (kinds arrive one by one): take the generation
    // once it has settled, so that only what happens while the server is down is compared.
    let mut gen = published.generation();
    let settle = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = published.generation();
        if now == gen || settle.elapsed() > Duration::from_secs(10) {
            break;
        }
        gen = now;
    }
    server.stop();
    // Changes made while kxdp cannot see them; the log is compacted so the resume gets a 410.
    server.delete("Service", "ns", "db");
    server.apply(slice("web-1", "web", &["10.1.0.9"]));
    server.compact();
    wait_status(&h, "source errors reported", |st| {
        !st.source_errors.is_empty()
    });
    std::thread::sleep(Duration::from_millis(500));
    {
        let s = published.load();
        assert_eq!(
            s.generation, gen,
            "nothing published while the server is down"
        );
        assert_eq!(
            endpoints(&s, "172.30.0.10", 80),
            Some(vec!["10.1.0.1:8080".into(), "10.1.0.2:8080".into()]),
            "forwarding continues on the last good tables"
        );
    }
    let text = h.metrics().encode();
    assert!(
        text.contains("kxdp_sync_source_errors_total{source="),
        "{text}"
    );
    server.restart();
    wait_for(&published, "state after the outage", |s| {
        endpoints(s, "172.30.0.10", 80) == Some(vec!["10.1.0.9:8080".into()])
            && endpoints(s, "172.30.0.11", 5432).is_none()
    });
    wait_status(&h, "recovered", |st| st.source_errors.is_empty());
    h.shutdown();
}

/// The API server answering 429 (with Retry-After), 500, or accepting requests and answering
/// nothing: the last good tables stay, the failure shows in the status and the metrics, and
/// the changes made meanwhile arrive once it answers again.
#[test]
fn server_faults_keep_last_good_tables() {
    for fault in [Fault::Status(429), Fault::Status(500), Fault::Hang] {
        let server = seeded();
        // A hung server is noticed after the read timeout: short here, 90 s by default.
        let options = KubeOptions {
            read_timeout: Duration::from_secs(1),
            ..fast()
        };
        let (published, h) = start_with(&server, options);
        wait_for(&published, "initial sync", |s| {
            endpoints(s, "172.30.0.10", 80).is_some() && endpoints(s, "172.30.0.11", 5432).is_some()
        });
        wait_status(&h, "synced", |st| st.source_errors.is_empty());
        server.set_fault(Some(fault));
        // Both kinds changed below have failed since (a watch that was reconnecting when the
        // fault began may have got through once; its next request meets the fault).
        wait_status(&h, &format!("{fault:?} reported"), |st| {
            ["services", "endpointslices"]
                .iter()
                .all(|k| st.source_errors.contains_key(*k))
        });
        let text = h.metrics().encode();
        assert!(
            text.contains("kxdp_sync_source_errors_total{source=")
                && text
                    .lines()
                    .any(|l| l.starts_with("kxdp_sync_source_up{") && l.ends_with(" 0")),
            "{fault:?}: the metrics say the source is down: {text}"
        );
        // Changes the failing server does not deliver: the tables stay as they were.
        server.delete("Service", "ns", "db");
        server.apply(slice("web-1", "web", &["10.1.0.9"]));
        std::thread::sleep(Duration::from_millis(300));
        {
            let s = published.load();
            assert_eq!(
                endpoints(&s, "172.30.0.10", 80),
                Some(vec!["10.1.0.1:8080".into(), "10.1.0.2:8080".into()]),
                "{fault:?}: forwarding continues on the last good tables"
            );
            assert!(endpoints(&s, "172.30.0.11", 5432).is_some(), "{fault:?}");
        }
        server.set_fault(None);
        wait_for(&published, "the changes after the fault", |s| {
            endpoints(s, "172.30.0.10", 80) == Some(vec!["10.1.0.9:8080".into()])
                && endpoints(s, "172.30.0.11", 5432).is_none()
        });
        wait_status(&h, "recovered", |st| st.source_errors.is_empty());
        h.shutdown();
    }
}

#[test]
fn malformed_object_is_skipped_and_reported() {
    let server = seeded();
    // Bad from the start: the list carries it; the rest must still sync.
    let mut bad = service("bad", "172.30.0.30", 80);
    bad["spec"]["ports"] = json!([{"port": "eighty"}]);
    server.apply(bad);
    let (published, h) = start(&server);
    wait_for(&published, "initial sync despite the bad object", |s| {
        endpoints(s, "172.30.0.10", 80).is_some()
    });
    wait_status(&h, "problem reported", |st| {
        st.problems
            .iter()
            .any(|p| p.object == "Service ns/bad" && p.message.contains("spec.ports"))
    });
    assert!(endpoints(&published.load(), "172.30.0.30", 80).is_none());

    // A good object turned bad keeps its last good version.
    let mut db_bad = service("db", "172.30.0.11", 5432);
    db_bad["spec"]["clusterIPs"] = json!("not-a-list");
    server.apply(db_bad);
    wait_status(&h, "db problem", |st| {
        st.problems.iter().any(|p| p.object == "Service ns/db")
    });
    server.apply(service("marker", "172.30.0.31", 80));
    wait_for(&published, "marker", |s| {
        endpoints(s, "172.30.0.31", 80).is_some()
    });
    assert!(endpoints(&published.load(), "172.30.0.11", 5432).is_some());

    // Translation problems (a valid object that cannot be translated) are reported too.
    let mut odd = service("odd", "172.30.0.32", 80);
    odd["spec"]["ports"][0]["protocol"] = json!("ICMP");
    server.apply(odd);
    wait_status(&h, "translation problem", |st| {
        st.problems
            .iter()
            .any(|p| p.object == "Service ns/odd" && p.message.contains("protocol"))
    });

    // Fixed: the problems go away.
    server.apply(service("bad", "172.30.0.30", 80));
    server.apply(service("db", "172.30.0.11", 5433));
    wait_for(&published, "fixed", |s| {
        endpoints(s, "172.30.0.30", 80).is_some() && endpoints(s, "172.30.0.11", 5433).is_some()
    });
    wait_status(&h, "problems cleared", |st| {
        !st.problems
            .iter()
            .any(|p| p.object == "Service ns/bad" || p.object == "Service ns/db")
    });
    let text = h.metrics().encode();
    assert!(!text.contains("kxdp_sync_problems_total 0"), "{text}");
    h.shutdown();
}

#[test]
fn writes_over_http_while_watching() {
    // POST, PUT, PATCH and DELETE through a second client (kube-rs Api) while kxdp watches.
    let server = seeded();
    let (published, h) = start(&server);
    wait_for(&published, "initial sync", |s| {
        endpoints(s, "172.30.0.10", 80).is_some()
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use k8s_openapi::api::core::v1::Service;
        use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
        let client = kube::Client::try_from(server.kube_config()).unwrap();
        let api: Api<Service> = Api::namespaced(client, "ns");
        let svc: Service = serde_json::from_value(service("posted", "172.30.0.40", 80)).unwrap();
        api.create(&PostParams::default(), &svc).await.unwrap();
        let mut got = api.get("posted").await.unwrap();
        got.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 90;
        api.replace("posted", &PostParams::default(), &got)
            .await
            .unwrap();
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"ports": [{"name": "http", "port": 8000, "protocol": "TCP"}]}}),
            ),
        )
        .await
        .unwrap();
        api.delete("db", &DeleteParams::default()).await.unwrap();
    });
    wait_for(&published, "HTTP writes visible", |s| {
        endpoints(s, "172.30.0.40", 90).is_some()
            && endpoints(s, "172.30.0.40", 80).is_none()
            && endpoints(s, "172.30.0.10", 8000).is_some()
            && endpoints(s, "172.30.0.11", 5432).is_none()
    });
    h.shutdown();
}

fn cnp_objects() -> (Value, Value, Value) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns", "labels": {"team": "a"}}});
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ns", "labels": {"app": "web"}},
                     "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
                     "status": {"phase": "Running", "podIP": "10.1.0.1", "podIPs": [{"ip": "10.1.0.1"}]}});
    let cnp = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
                     "metadata": {"name": "guardrail"},
                     "spec": {"tier": "Admin", "priority": 10, "subject": {"namespaces": {"matchLabels": {"team": "a"}}},
                              "ingress": [{"action": "Deny", "from": [{"networks": ["0.0.0.0/0"]}]}]}});
    (ns, pod, cnp)
}

/// The local pod's ClusterNetworkPolicy tiers as published (None: no pod 10.1.0.1, or no
/// policy selects it).
fn cluster_selected(snap: &Snapshot) -> Option<bool> {
    let t = &snap.policy;
    let i = t.local_pod(&Addr::from_ip("10.1.0.1".parse().unwrap()))?;
    Some(t.pods()[i as usize].cluster.is_some())
}

/// ClusterNetworkPolicies from the API server: added, changed and deleted through the watch.
/// (An `ingress` peer with `networks` is refused by name: ingress peers have none.)
#[test]
fn cluster_network_policies_are_watched() {
    let server = seeded();
    let (ns, pod, cnp) = (cnp_objects().0, cnp_objects().1, cnp_objects().2);
    server.apply(ns);
    server.apply(pod);
    server.apply(cnp.clone());
    let (published, h) = start(&server);
    wait_for(&published, "the policy selects the pod", |s| {
        cluster_selected(s) == Some(true)
    });
    wait_status(&h, "the ingress networks peer is refused", |st| {
        st.problems.iter().any(|p| {
            p.object == "ClusterNetworkPolicy guardrail"
                && p.message
                    .contains("spec.ingress[0].from[0].networks: only egress peers have networks")
        })
    });
    let mut other = cnp;
    other["spec"]["subject"] = json!({"namespaces": {"matchLabels": {"team": "b"}}});
    server.apply(other);
    wait_for(&published, "the changed policy no longer selects it", |s| {
        cluster_selected(s) == Some(false)
    });
    server.apply(cnp_objects().2);
    wait_for(&published, "selected again", |s| {
        cluster_selected(s) == Some(true)
    });
    assert!(server.delete("ClusterNetworkPolicy", "", "guardrail"));
    wait_for(&published, "deleted", |s| {
        cluster_selected(s) == Some(false)
    });
    assert!(h.status().source_errors.is_empty());
    h.shutdown();
}

/// A cluster without the ClusterNetworkPolicy CRD (404 on its list) syncs as before: no source
/// error, no problem; the kind counts as empty. The CRD installed later is picked up.
#[test]
fn cluster_without_the_crd_syncs() {
    let server = seeded();
    server.set_served("clusternetworkpolicies", false);
    let (ns, pod, _) = cnp_objects();
    server.apply(ns);
    server.apply(pod);
    let (published, h) = start(&server);
    wait_for(&published, "initial sync", |s| {
        endpoints(s, "172.30.0.10", 80).is_some() && cluster_selected(s) == Some(false)
    });
    let st = h.status();
    assert!(st.ready);
    assert!(st.source_errors.is_empty(), "{:?}", st.source_errors);
    assert!(
        !st.events
            .iter()
            .any(|e| e.contains("clusternetworkpolicies")),
        "{:?}",
        st.events
    );
    // The CRD installed later: picked up by the retried list.
    server.set_served("clusternetworkpolicies", true);
    server.apply(cnp_objects().2);
    wait_for(&published, "the policy after the CRD came", |s| {
        cluster_selected(s) == Some(true)
    });
    h.shutdown();
}
