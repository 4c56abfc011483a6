//! A stateful fake Kubernetes API server (axum) for the control-plane tests: no kube-apiserver can
//! be installed here, and the sync code must be exercised over real HTTP.
//!
//! What it does, as the real server does:
//! - discovery (`/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`, `/version`) for kubectl;
//! - list (cluster-wide or in a namespace) returning the current `resourceVersion`, with
//!   `labelSelector` (`k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (..)`, `k notin (..)`) and
//!   `fieldSelector` (`path=v`, `path!=v` on any dotted field); paginated with `limit` and
//!   `continue` as the real server does: every page comes from the list as it was at the first
//!   page's resourceVersion (`metadata.continue`, `metadata.remainingItemCount`), and a continue
//!   token older than the compacted log gets `410 Gone` (reason `Expired`);
//! - watch (`?watch=true`) resumed from a `resourceVersion`: the events after it from the log,
//!   then live ones, as JSON lines; ADDED/MODIFIED/DELETED, with selector transitions turned into
//!   ADDED/DELETED; BOOKMARK every `bookmark_interval` when asked; `timeoutSeconds`; a
//!   resourceVersion older than the compacted log gets `410 Gone` as an ERROR event;
//! - metadata-only responses (`Accept: ...;as=PartialObjectMetadata...`);
//! - GET, POST (create), PUT (replace), PATCH (merge patch; strategic merge treated as merge
//!   patch; server-side apply replaces the object with the applied one), DELETE.
//!
//! And what the tests need: in-process writes (`apply`, `delete`), `drop_watches` (connections
//! cut mid-stream), `send_gone` (410 on every open watch), `compact` (forget the event log),
//! `stop`/`start` (the server down for a while), `set_fault` (every request answered with an
//! error status, or never answered), and a request log.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, watch};

/// A resource the server serves.
#[derive(Clone, Copy, Debug)]
pub struct Res {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short: &'static [&'static str],
}

impl Res {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub const RESOURCES: [Res; 8] = [
    Res {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short: &["no"],
    },
    Res {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short: &["ns"],
    },
    Res {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short: &["po"],
    },
    Res {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short: &["svc"],
    },
    Res {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        short: &[],
    },
    Res {
        group: "networking.k8s.io",
        version: "v1",
        plural: "networkpolicies",
        singular: "networkpolicy",
        kind: "NetworkPolicy",
        namespaced: true,
        short: &["netpol"],
    },
    Res {
        group: "networking.k8s.io",
        version: "v1",
        plural: "servicecidrs",
        singular: "servicecidr",
        kind: "ServiceCIDR",
        namespaced: false,
        short: &[],
    },
    // A CRD: `FakeApiServer::set_served` takes it away, as a cluster without it.
    Res {
        group: "policy.networking.k8s.io",
        version: "v1alpha2",
        plural: "clusternetworkpolicies",
        singular: "clusternetworkpolicy",
        kind: "ClusterNetworkPolicy",
        namespaced: false,
        short: &["cnp"],
    },
];

fn res_by_kind(kind: &str) -> Res {
    *RESOURCES
        .iter()
        .find(|r| r.kind == kind)
        .unwrap_or_else(|| panic!("fake API server does not serve kind {kind}"))
}

#[derive(Clone, Debug)]
struct Ev {
    rv: u64,
    plural: &'static str,
    typ: &'static str,
    /// The object before (MODIFIED only).
    old: Option<Value>,
    obj: Value,
}

/// A live-stream message.
#[derive(Clone, Debug)]
enum Live {
    Event(Ev),
    /// Every open watch gets a 410 ERROR event and ends.
    Gone,
}

/// A request the server handled (for assertions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub plural: String,
    pub watch: bool,
    pub resource_version: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// `limit` and `continue` of a paginated list.
    pub limit: Option<String>,
    pub continue_token: Option<String>,
}

/// The items of a list as it was at its first page, as list-item texts.
type ListItems = Arc<Vec<Arc<str>>>;

#[derive(Default)]
struct Inner {
    rv: u64,
    /// (plural, namespace, name) -> object.
    objects: BTreeMap<(&'static str, String, String), Value>,
    /// (plural, namespace, name) -> the object as a list item (JSON text without `apiVersion`
    /// and `kind`), serialized once when written: a list page is these texts joined, so that
    /// serving a 30,000-object list costs copies, not serialization (the benches time the
    /// client, not this server).
    list_items: BTreeMap<(&'static str, String, String), Arc<str>>,
    log: VecDeque<Ev>,
    /// Events at or below this resourceVersion are forgotten.
    compacted: u64,
    requests: Vec<Request>,
    /// Paginated lists in progress: token id → (resourceVersion, the items of the list as it was
    /// then, as list-item texts). The real server reads older revisions from etcd; this keeps
    /// the list itself.
    pages: BTreeMap<u64, (u64, ListItems)>,
    next_page_id: u64,
}

struct Shared {
    inner: Mutex<Inner>,
    live: broadcast::Sender<Live>,
    /// Bumped to cut every open watch connection.
    kill: watch::Sender<u64>,
    /// Set between `stop` and `restart`: a request that slipped in on a kept-alive connection
    /// gets 503, and a watch ends before it can deliver anything.
    stopped: std::sync::atomic::AtomicBool,
    bookmark_interval: Mutex<Duration>,
    fault: Mutex<Option<Fault>>,
    /// Resources (plurals) not served: their requests get 404, as for a CRD not installed.
    unserved: Mutex<Vec<&'static str>>,
}

/// How the server misbehaves while a fault is set (`FakeApiServer::set_fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every request answered with this status (429 with `Retry-After: 1`, as the API server's
    /// priority and fairness does; 500, 503...).
    Status(u16),
    /// Connections accepted, requests read, nothing ever answered.
    Hang,
}

/// The server; it runs on its own runtime thread, so tests can be plain `#[test]`s.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    rt: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub fn start() -> FakeApiServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fake-apiserver")
            .enable_all()
            .build()
            .unwrap();
        let (live, _) = broadcast::channel(65536);
        let (kill, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                rv: 100,
                ..Default::default()
            }),
            live,
            kill,
            stopped: Default::default(),
            bookmark_interval: Mutex::new(Duration::from_millis(500)),
            fault: Mutex::new(None),
            unserved: Mutex::new(Vec::new()),
        });
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut s = FakeApiServer {
            shared,
            rt: Some(rt),
            addr,
            shutdown: None,
            task: None,
        };
        s.serve(listener);
        s
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = Router::new()
            .fallback(handle)
            .with_state(self.shared.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rt = self.rt.as_ref().unwrap();
        self.task = Some(rt.spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        }));
        self.shutdown = Some(tx);
    }

    /// Serves `plural` or not (404 on every request for it, as a CRD not installed).
    pub fn set_served(&self, plural: &'static str, served: bool) {
        let mut u = self.shared.unserved.lock().unwrap();
        u.retain(|p| *p != plural);
        if !served {
            u.push(plural);
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube-rs client configuration for this server.
    pub fn kube_config(&self) -> kube::Config {
        let mut c = kube::Config::new(self.url().parse().unwrap());
        c.connect_timeout = Some(Duration::from_secs(2));
        c.read_timeout = Some(Duration::from_secs(30));
        c
    }

    /// A kubeconfig file for kubectl.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: u}}\ncurrent-context: fake\n",
            self.url()
        );
        std::fs::write(path, text).unwrap();
    }

    pub fn set_bookmark_interval(&self, d: Duration) {
        *self.shared.bookmark_interval.lock().unwrap() = d;
    }

    /// Creates or replaces an object (by its `kind`), as a client's PUT/POST would.
    pub fn apply(&self, obj: Value) -> Value {
        let kind = obj["kind"]
            .as_str()
            .expect("object without kind")
            .to_string();
        let res = res_by_kind(&kind);
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or(if res.namespaced { "default" } else { "" })
            .to_string();
        write(&self.shared, res, &ns, obj, WriteMode::Upsert).expect("apply")
    }

    /// Merge-patches an object.
    pub fn patch(&self, kind: &str, namespace: &str, name: &str, patch: Value) -> Value {
        let res = res_by_kind(kind);
        let mut obj = self
            .get(kind, namespace, name)
            .expect("patch: no such object");
        merge_patch(&mut obj, &patch);
        write(&self.shared, res, namespace, obj, WriteMode::Replace).expect("patch")
    }

    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let res = res_by_kind(kind);
        let inner = self.shared.inner.lock().unwrap();
        inner
            .objects
            .get(&(res.plural, namespace.to_string(), name.to_string()))
            .cloned()
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        delete(&self.shared, res_by_kind(kind), namespace, name).is_some()
    }

    /// Cuts every open watch connection mid-stream (no 410: clients resume).
    pub fn drop_watches(&self) {
        self.shared.kill.send_modify(|v| *v += 1);
    }

    /// From now on every request meets `fault` (None: served again). Open watches are cut, so
    /// that the clients' next requests meet it.
    pub fn set_fault(&self, fault: Option<Fault>) {
        *self.shared.fault.lock().unwrap() = fault;
        if fault.is_some() {
            self.drop_watches();
        }
    }

    /// Sends `410 Gone` as an ERROR event on every open watch and ends them.
    pub fn send_gone(&self) {
        let _ = self.shared.live.send(Live::Gone);
    }

    /// Forgets the event log: watches from an older resourceVersion get 410.
    pub fn compact(&self) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.compacted = inner.rv;
        inner.log.clear();
        // Continue tokens name revisions that are gone now.
        inner.pages.clear();
    }

    /// Stops serving: the listener closes and every connection is cut.
    /// When it returns, no watch is open: a change made afterwards reaches no client until
    /// `restart`.
    pub fn stop(&mut self) {
        // Before the cut: a watch that subscribes after the cut sees the flag (see
        // `watch_response`).
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.drop_watches();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let rt = self.rt.as_ref().unwrap();
            let _ = rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), t).await });
        }
        // Graceful shutdown does not wait for the spawned watch streams: wait until each has
        // dropped its subscription.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.open_watches() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "watches still open 5 s after stop"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Serves again on the same address, with the same objects.
    pub fn restart(&mut self) {
        self.shared.stopped.store(false, Ordering::SeqCst);
        let rt = self.rt.as_ref().unwrap();
        let addr = self.addr;
        let mut tries = 0;
        let listener = loop {
            match rt.block_on(tokio::net::TcpListener::bind(addr)) {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("cannot rebind {addr}: {e}"),
            }
        };
        self.serve(listener);
    }

    /// Watch streams open now.
    pub fn open_watches(&self) -> usize {
        self.shared.live.receiver_count()
    }

    /// Waits (10 s at most) until `n` watches are open.
    pub fn wait_watches(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.open_watches() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} watches open",
                self.open_watches()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.shared.inner.lock().unwrap().requests.clone()
    }

    pub fn resource_version(&self) -> u64 {
        self.shared.inner.lock().unwrap().rv
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

// ---- storage ----

#[derive(Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    Create,
    Replace,
    Upsert,
}

fn status(code: u16, reason: &str, message: String) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn write(
    shared: &Shared,
    res: Res,
    ns: &str,
    mut obj: Value,
    mode: WriteMode,
) -> Result<Value, (u16, Value)> {
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
    if name.is_empty() {
        return Err((
            422,
            status(422, "Invalid", "metadata.name: Required value".into()),
        ));
    }
    let mut inner = shared.inner.lock().unwrap();
    let key = (res.plural, ns.to_string(), name.clone());
    let old = inner.objects.get(&key).cloned();
    match (mode, &old) {
        (WriteMode::Create, Some(_)) => {
            return Err((
                409,
                status(
                    409,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", res.plural),
                ),
            ))
        }
        (WriteMode::Replace, None) => {
            return Err((
                404,
                status(
                    404,
                    "NotFound",
                    format!("{} \"{name}\" not found", res.plural),
                ),
            ))
        }
        _ => {}
    }
    inner.rv += 1;
    let rv = inner.rv;
    let m = obj
        .as_object_mut()
        .expect("object")
        .entry("metadata")
        .or_insert_with(|| json!({}));
    let meta = m.as_object_mut().expect("metadata is an object");
    if res.namespaced {
        meta.insert("namespace".into(), json!(ns));
    } else {
        meta.remove("namespace");
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    let (uid, created) = match &old {
        Some(o) => (
            o["metadata"]["uid"].clone(),
            o["metadata"]["creationTimestamp"].clone(),
        ),
        None => (json!(format!("uid-{rv}")), json!("2025-01-01T00:00:00Z")),
    };
    meta.insert("uid".into(), uid);
    meta.insert("creationTimestamp".into(), created);
    obj["apiVersion"] = json!(res.api_version());
    obj["kind"] = json!(res.kind);
    inner.list_items.insert(key.clone(), list_item(&obj));
    inner.objects.insert(key, obj.clone());
    let ev = Ev {
        rv,
        plural: res.plural,
        typ: if old.is_some() { "MODIFIED" } else { "ADDED" },
        old,
        obj: obj.clone(),
    };
    inner.log.push_back(ev.clone());
    let _ = shared.live.send(Live::Event(ev));
    Ok(obj)
}

fn delete(shared: &Shared, res: Res, ns: &str, name: &str) -> Option<Value> {
    let mut inner = shared.inner.lock().unwrap();
    let key = (res.plural, ns.to_string(), name.to_string());
    let mut obj = inner.objects.remove(&key)?;
    inner.list_items.remove(&key);
    inner.rv += 1;
    let rv = inner.rv;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let ev = Ev {
        rv,
        plural: res.plural,
        typ: "DELETED",
        old: None,
        obj: obj.clone(),
    };
    inner.log.push_back(ev.clone());
    let _ = shared.live.send(Live::Event(ev));
    Some(obj)
}

/// An object's text as an item of a list: without `apiVersion` and `kind` (a list names them
/// once), `metadata` first as the real server writes it (Go's field order: the type's meta,
/// the object's meta, spec, status).
fn list_item(obj: &Value) -> Arc<str> {
    let Some(m) = obj.as_object() else {
        return obj.to_string().into();
    };
    let mut text = String::from("{");
    let fields = m.get_key_value("metadata").into_iter().chain(
        m.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "apiVersion" | "kind")),
    );
    for (n, (k, v)) in fields.enumerate() {
        if n > 0 {
            text.push(',');
        }
        text.push_str(&Value::String(k.clone()).to_string());
        text.push(':');
        text.push_str(&v.to_string());
    }
    text.push('}');
    text.into()
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

// ---- selectors ----

#[derive(Debug)]
enum Req {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse_selector(s: &str) -> Vec<Req> {
    let set = |v: &str| -> Vec<String> {
        v.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|x| x.trim().to_string())
            .collect()
    };
    split_top(s)
        .into_iter()
        .map(|r| {
            if let Some((k, v)) = r.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v))
            } else if let Some((k, v)) = r.split_once(" in ") {
                Req::In(k.trim().into(), set(v))
            } else if let Some((k, v)) = r.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = r.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = r.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(k) = r.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else {
                Req::Exists(r)
            }
        })
        .collect()
}

fn labels_match(obj: &Value, sel: &[Req]) -> bool {
    let labels = &obj["metadata"]["labels"];
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    sel.iter().all(|r| match r {
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
        Req::Eq(k, v) => get(k) == Some(v.as_str()),
        Req::Ne(k, v) => get(k) != Some(v.as_str()),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
    })
}

fn fields_match(obj: &Value, sel: &[Req]) -> bool {
    let get = |path: &str| -> String {
        let mut v = obj;
        for p in path.split('.') {
            v = &v[p];
        }
        match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    };
    sel.iter().all(|r| match r {
        Req::Eq(k, v) => &get(k) == v,
        Req::Ne(k, v) => &get(k) != v,
        _ => true,
    })
}

struct Filter {
    plural: &'static str,
    namespace: Option<String>,
    labels: Vec<Req>,
    fields: Vec<Req>,
}

impl Filter {
    fn matches(&self, plural: &str, obj: &Value) -> bool {
        plural == self.plural
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
            && labels_match(obj, &self.labels)
            && fields_match(obj, &self.fields)
    }

    /// The event a watcher with this filter sees, if any.
    fn view(&self, ev: &Ev) -> Option<(&'static str, Value)> {
        let now = self.matches(ev.plural, &ev.obj);
        match ev.typ {
            "MODIFIED" => {
                let before = ev.old.as_ref().is_some_and(|o| self.matches(ev.plural, o));
                match (before, now) {
                    (true, true) => Some(("MODIFIED", ev.obj.clone())),
                    (false, true) => Some(("ADDED", ev.obj.clone())),
                    (true, false) => Some(("DELETED", ev.obj.clone())),
                    (false, false) => None,
                }
            }
            t => now.then(|| (t, ev.obj.clone())),
        }
    }
}

// ---- HTTP ----

fn reply(code: u16, body: Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for pair in uri.query().unwrap_or("").split('&') {
        if pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode_pct(k), decode_pct(v));
    }
    out
}

fn decode_pct(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(h, 16) {
                    Ok(x) => {
                        out.push(x);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn discovery_resources(group: &str, version: &str) -> Option<Value> {
    let rs: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                   "kind": r.kind, "shortNames": r.short,
                   "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        })
        .collect();
    if rs.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs}),
    )
}

async fn handle(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if shared.stopped.load(Ordering::SeqCst) {
        return reply(
            503,
            status(503, "ServiceUnavailable", "server stopped".into()),
        );
    }
    let fault = *shared.fault.lock().unwrap();
    match fault {
        Some(Fault::Hang) => {
            // Unanswered while the fault lasts; afterwards (or once stopped) a 503 ends the
            // request, so that a shutdown never waits on it.
            while *shared.fault.lock().unwrap() == Some(Fault::Hang)
                && !shared.stopped.load(Ordering::SeqCst)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            return reply(503, status(503, "ServiceUnavailable", "hang over".into()));
        }
        Some(Fault::Status(code)) => {
            let reason = match code {
                429 => "TooManyRequests",
                500 => "InternalError",
                503 => "ServiceUnavailable",
                _ => "Unknown",
            };
            let mut r = reply(
                code,
                status(code, reason, format!("fault injected: {code}")),
            );
            if code == 429 {
                r.headers_mut()
                    .insert("retry-after", axum::http::HeaderValue::from_static("1"));
            }
            return r;
        }
        None => {}
    }
    let path = uri.path().trim_end_matches('/').to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // Discovery.
    match segs.as_slice() {
        ["version"] => {
            return reply(
                200,
                json!({"major": "1", "minor": "35", "gitVersion": "v1.35.0-fake", "platform": "linux/amd64"}),
            )
        }
        ["api"] => {
            return reply(
                200,
                json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
            )
        }
        ["apis"] => {
            let groups: Vec<Value> = ["discovery.k8s.io", "networking.k8s.io"]
                .iter()
                .map(|g| {
                    json!({"name": g, "versions": [{"groupVersion": format!("{g}/v1"), "version": "v1"}],
                       "preferredVersion": {"groupVersion": format!("{g}/v1"), "version": "v1"}})
                })
                .collect();
            return reply(
                200,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            );
        }
        ["api", v] => {
            return match discovery_resources("", v) {
                Some(d) => reply(200, d),
                None => reply(404, status(404, "NotFound", "no such version".into())),
            }
        }
        ["apis", g, v] => {
            return match discovery_resources(g, v) {
                Some(d) => reply(200, d),
                None => reply(404, status(404, "NotFound", "no such group".into())),
            }
        }
        _ => {}
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return reply(404, status(404, "NotFound", format!("no route {path}"))),
    };
    let unserved = shared.unserved.lock().unwrap().clone();
    let find = |plural: &str| {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .filter(|r| !unserved.contains(&r.plural))
            .copied()
    };
    // (resource, namespace, name)
    let target: Option<(Res, Option<String>, Option<String>)> = match rest {
        ["namespaces", ns, plural] => find(plural).map(|r| (r, Some(ns.to_string()), None)),
        ["namespaces", ns, plural, name] => {
            find(plural).map(|r| (r, Some(ns.to_string()), Some(name.to_string())))
        }
        [plural] => find(plural).map(|r| (r, None, None)),
        [plural, name] => find(plural).map(|r| (r, None, Some(name.to_string()))),
        _ => None,
    };
    let Some((res, ns, name)) = target else {
        return reply(
            404,
            status(404, "NotFound", format!("the server could not find {path}")),
        );
    };
    let q = query(&uri);
    let meta_only = headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    shared.inner.lock().unwrap().requests.push(Request {
        method: method.to_string(),
        plural: res.plural.to_string(),
        watch: watching,
        resource_version: q.get("resourceVersion").cloned(),
        label_selector: q.get("labelSelector").cloned(),
        field_selector: q.get("fieldSelector").cloned(),
        limit: q.get("limit").cloned(),
        continue_token: q.get("continue").cloned(),
    });
    let ns_or_default = || ns.clone().unwrap_or_default();

    match (method.clone(), name) {
        (Method::GET, None) => {
            let filter = Filter {
                plural: res.plural,
                namespace: ns.clone(),
                labels: parse_selector(q.get("labelSelector").map_or("", String::as_str)),
                fields: parse_selector(q.get("fieldSelector").map_or("", String::as_str)),
            };
            if watching {
                watch_response(shared, res, filter, &q, meta_only)
            } else {
                let mut inner = shared.inner.lock().unwrap();
                let limit: usize = q
                    .get("limit")
                    .and_then(|l| l.parse().ok())
                    .filter(|&l| l > 0)
                    .unwrap_or(usize::MAX);
                // A continue token: `{page id}:{offset}`.
                let (rv, all, offset, id) = match q.get("continue").filter(|c| !c.is_empty()) {
                    Some(token) => {
                        let parsed = token.split_once(':').and_then(|(i, o)| {
                            Some((i.parse::<u64>().ok()?, o.parse::<usize>().ok()?))
                        });
                        let Some(((rv, all), offset, id)) = parsed.and_then(|(id, offset)| {
                            Some((inner.pages.get(&id)?.clone(), offset, id))
                        }) else {
                            return reply(
                                410,
                                status(
                                    410,
                                    "Expired",
                                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
                                ),
                            );
                        };
                        (rv, all, offset, Some(id))
                    }
                    None => {
                        let range = (res.plural, String::new(), String::new())
                            ..(res.plural, "\u{10ffff}".to_string(), String::new());
                        let items: Vec<Arc<str>> = inner
                            .objects
                            .range(range)
                            .filter(|((p, _, _), o)| filter.matches(p, o))
                            .map(|(k, o)| {
                                if meta_only {
                                    list_item(&meta_view(o))
                                } else {
                                    inner.list_items[k].clone()
                                }
                            })
                            .collect();
                        (inner.rv, Arc::new(items), 0, None)
                    }
                };
                let end = offset.saturating_add(limit).min(all.len());
                let items = &all[offset.min(end)..end];
                let mut metadata = json!({"resourceVersion": rv.to_string()});
                if end < all.len() {
                    let id = id.unwrap_or_else(|| {
                        inner.next_page_id += 1;
                        let id = inner.next_page_id;
                        inner.pages.insert(id, (rv, all.clone()));
                        id
                    });
                    metadata["continue"] = json!(format!("{id}:{end}"));
                    metadata["remainingItemCount"] = json!(all.len() - end);
                } else if let Some(id) = id {
                    inner.pages.remove(&id);
                }
                let (kind, api_version) = if meta_only {
                    (
                        "PartialObjectMetadataList".to_string(),
                        "meta.k8s.io/v1".to_string(),
                    )
                } else {
                    (format!("{}List", res.kind), res.api_version())
                };
                // The page's text from the items' texts (no serialization here).
                let head = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata})
                    .to_string();
                let mut text = String::with_capacity(
                    head.len() + 16 + items.iter().map(|i| i.len() + 1).sum::<usize>(),
                );
                text.push_str(&head[..head.len() - 1]);
                text.push_str(",\"items\":[");
                for (n, item) in items.iter().enumerate() {
                    if n > 0 {
                        text.push(',');
                    }
                    text.push_str(item);
                }
                text.push_str("]}");
                drop(inner);
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(text))
                    .unwrap()
            }
        }
        (Method::GET, Some(name)) => {
            let inner = shared.inner.lock().unwrap();
            match inner
                .objects
                .get(&(res.plural, ns_or_default(), name.clone()))
            {
                Some(o) => reply(200, if meta_only { meta_view(o) } else { o.clone() }),
                None => reply(
                    404,
                    status(
                        404,
                        "NotFound",
                        format!("{} \"{name}\" not found", res.plural),
                    ),
                ),
            }
        }
        (Method::POST, None) => match serde_json::from_slice::<Value>(&body) {
            Ok(obj) => {
                let ns = ns.or_else(|| obj["metadata"]["namespace"].as_str().map(str::to_string));
                let ns = ns.unwrap_or_else(|| {
                    if res.namespaced {
                        "default".into()
                    } else {
                        String::new()
                    }
                });
                match write(&shared, res, &ns, obj, WriteMode::Create) {
                    Ok(o) => reply(201, o),
                    Err((c, s)) => reply(c, s),
                }
            }
            Err(e) => reply(400, status(400, "BadRequest", e.to_string())),
        },
        (Method::PUT, Some(name)) => match serde_json::from_slice::<Value>(&body) {
            Ok(mut obj) => {
                obj["metadata"]["name"] = json!(name);
                match write(&shared, res, &ns_or_default(), obj, WriteMode::Replace) {
                    Ok(o) => reply(200, o),
                    Err((c, s)) => reply(c, s),
                }
            }
            Err(e) => reply(400, status(400, "BadRequest", e.to_string())),
        },
        (Method::PATCH, Some(name)) => {
            let ctype = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return reply(
                    415,
                    status(415, "UnsupportedMediaType", "only JSON bodies".into()),
                );
            };
            let key = (res.plural, ns_or_default(), name.clone());
            let existing = shared.inner.lock().unwrap().objects.get(&key).cloned();
            let (obj, mode) = if ctype.starts_with("application/apply-patch") {
                // Server-side apply with one manager: the applied object, keeping server fields.
                let mut obj = patch;
                obj["metadata"]["name"] = json!(name);
                (obj, WriteMode::Upsert)
            } else if ctype.starts_with("application/merge-patch+json")
                || ctype.starts_with("application/strategic-merge-patch+json")
            {
                let Some(mut obj) = existing else {
                    return reply(
                        404,
                        status(
                            404,
                            "NotFound",
                            format!("{} \"{name}\" not found", res.plural),
                        ),
                    );
                };
                merge_patch(&mut obj, &patch);
                (obj, WriteMode::Replace)
            } else {
                return reply(
                    415,
                    status(
                        415,
                        "UnsupportedMediaType",
                        format!("patch type {ctype} not supported"),
                    ),
                );
            };
            match write(&shared, res, &ns_or_default(), obj, mode) {
                Ok(o) => reply(200, o),
                Err((c, s)) => reply(c, s),
            }
        }
        (Method::DELETE, Some(name)) => match delete(&shared, res, &ns_or_default(), &name) {
            Some(o) => reply(200, o),
            None => reply(
                404,
                status(
                    404,
                    "NotFound",
                    format!("{} \"{name}\" not found", res.plural),
                ),
            ),
        },
        _ => reply(
            405,
            status(405, "MethodNotAllowed", format!("{method} {path}")),
        ),
    }
}

fn meta_view(o: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"].clone()})
}

fn watch_response(
    shared: Arc<Shared>,
    res: Res,
    filter: Filter,
    q: &BTreeMap<String, String>,
    meta_only: bool,
) -> Response {
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1024);
    // Backlog and subscription under one lock: no event falls in between.
    let (backlog, gone, mut live, start_rv) = {
        let inner = shared.inner.lock().unwrap();
        let live = shared.live.subscribe();
        match rv_param.parse::<u64>() {
            Ok(rv) if rv > 0 => {
                if rv < inner.compacted {
                    (Vec::new(), true, live, inner.rv)
                } else {
                    let evs: Vec<(&'static str, Value)> = inner
                        .log
                        .iter()
                        .filter(|e| e.rv > rv)
                        .filter_map(|e| filter.view(e))
                        .collect();
                    (evs, false, live, inner.rv)
                }
            }
            // No resourceVersion (or 0): the current objects as ADDED, then changes.
            _ => {
                let evs = inner
                    .objects
                    .iter()
                    .filter(|((p, _, _), o)| filter.matches(p, o))
                    .map(|(_, o)| ("ADDED", o.clone()))
                    .collect();
                (evs, false, live, inner.rv)
            }
        }
    };
    let mut kill = shared.kill.subscribe();
    kill.mark_unchanged();
    // After subscribing: `stop` sets the flag before it cuts, so a watch either sees the flag
    // here or sees the cut.
    let stopped = shared.stopped.load(Ordering::SeqCst);
    // The same for a fault: `set_fault` sets it before it cuts the open watches.
    let faulted = shared.fault.lock().unwrap().is_some();
    let interval = *shared.bookmark_interval.lock().unwrap();
    let view = move |o: Value| if meta_only { meta_view(&o) } else { o };
    let line =
        |typ: &str, obj: Value| Bytes::from(format!("{}\n", json!({"type": typ, "object": obj})));
    tokio::spawn(async move {
        if stopped || faulted {
            let _ = tx.send(Err(std::io::Error::other("server stopped"))).await;
            return;
        }
        if gone {
            let _ = tx
                .send(Ok(line(
                    "ERROR",
                    status(
                        410,
                        "Expired",
                        format!("too old resource version: {rv_param}"),
                    ),
                )))
                .await;
            return;
        }
        let mut last_rv = start_rv;
        for (t, o) in backlog {
            if let Some(rv) = o["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse::<u64>().ok())
            {
                last_rv = last_rv.max(rv);
            }
            if tx.send(Ok(line(t, view(o)))).await.is_err() {
                return;
            }
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            let sleep_until =
                deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                // A cut wins over an event that is ready at the same time.
                biased;
                _ = kill.changed() => {
                    let _ = tx.send(Err(std::io::Error::other("connection cut"))).await;
                    return;
                }
                _ = tokio::time::sleep_until(sleep_until) => return,
                _ = tick.tick(), if bookmarks => {
                    let bm = json!({"kind": res.kind, "apiVersion": res.api_version(),
                                    "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(Ok(line("BOOKMARK", bm))).await.is_err() {
                        return;
                    }
                }
                msg = live.recv() => match msg {
                    Ok(Live::Event(ev)) => {
                        if ev.rv <= start_rv {
                            continue;
                        }
                        last_rv = last_rv.max(ev.rv);
                        if let Some((t, o)) = filter.view(&ev) {
                            if tx.send(Ok(line(t, view(o)))).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(Live::Gone) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(Ok(line("ERROR", status(410, "Expired", "too old resource version".into())))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}
