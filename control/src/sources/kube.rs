//! The API-server source: one kube-rs `watcher` per kind, feeding the control loop's store.
//!
//! | kind | watch | why |
//! | --- | --- | --- |
//! | Node | `fieldSelector=metadata.name=<nodeName>` | only this node: addresses, zone label, deletion |
//! | Namespace | metadata only (`PartialObjectMetadata`) | policy reads only labels |
//! | Pod | `fieldSelector=status.phase!=Succeeded,status.phase!=Failed`, stored stripped | policy and locality read labels, node, hostNetwork, phase and IPs; finished pods hold no IP |
//! | Service | `labelSelector=!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless` | kube-proxy's selector: Services meant for another proxy, and headless ones, are not ours |
//! | EndpointSlice | the same label selector | as kube-proxy (the EndpointSlice controller copies both labels) |
//! | NetworkPolicy, ServiceCIDR | everything | |
//!
//! Each watcher lists in pages of `LIST_PAGE_SIZE` (`limit`/`continue`, as client-go's
//! reflector; the pages are gathered and handed over as one relist), then watches from the
//! list's resourceVersion with bookmarks, resumes from the last resourceVersion seen after a
//! dropped connection or a timeout, and relists on `410 Gone` (kube-rs `watcher`). A relist is
//! handed over whole (`Update::Relisted`): objects missing from it are deleted, as a reflector
//! store replaces its contents on `InitDone`. Errors back off exponentially (`KubeOptions`) and
//! are reported (`Update::SourceError`); the last good tables stay meanwhile.
//!
//! Objects are received untyped (`DynamicObject`) and decoded one by one, so that one object the
//! typed model rejects is skipped and reported (its last good version stays), instead of failing
//! the whole list and stalling the kind. A kind the server does not serve (404, e.g. ServiceCIDR on
//! an older cluster) counts as empty, so that it never holds up the first sync.

use std::sync::mpsc::Sender;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{NetworkPolicy, ServiceCIDR};
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::{Map, Value};

use crate::model::{Kind, Object, ObjectKey};
use crate::sync::Update;
use crate::translate::Problem;

/// Set on Services (and their EndpointSlices) that another proxy implements; kube-proxy ignores
/// them.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Set by the EndpointSlice controller on the slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// kube-proxy's label selector for Services and EndpointSlices.
pub const SERVICE_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// Pods that may still hold an IP.
pub const POD_FIELD_SELECTOR: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Objects per page of a (re)list (`limit`, then `continue`), as client-go's reflector lists:
/// the server never has to build one response of the whole cluster, and the list is read as it
/// was at the first page's resourceVersion.
pub const LIST_PAGE_SIZE: u32 = 500;

/// One watched kind.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// The source name in metrics and status: the resource's plural (`services`).
    pub source: &'static str,
    pub kind: Kind,
    pub resource: ApiResource,
    pub labels: Option<String>,
    pub fields: Option<String>,
    /// A metadata-only watch (`PartialObjectMetadata`).
    pub metadata_only: bool,
}

/// Watch tuning.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// First retry delay after an error (doubles up to `backoff_max`).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Server-side watch timeout (the watch is renewed from the last resourceVersion).
    pub watch_timeout_s: u32,
}

impl Default for KubeOptions {
    /// client-go's reflector backoff: 800 ms doubling to 30 s.
    fn default() -> Self {
        KubeOptions {
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            watch_timeout_s: 290,
        }
    }
}

/// The watches kxdp runs for this node.
pub fn specs(node_name: &str) -> Vec<WatchSpec> {
    let spec =
        |source, kind, resource, labels: Option<&str>, fields: Option<String>, meta| WatchSpec {
            source,
            kind,
            resource,
            labels: labels.map(str::to_string),
            fields,
            metadata_only: meta,
        };
    vec![
        spec(
            "nodes",
            Kind::Node,
            ApiResource::erase::<Node>(&()),
            None,
            Some(format!("metadata.name={node_name}")),
            false,
        ),
        spec(
            "namespaces",
            Kind::Namespace,
            ApiResource::erase::<Namespace>(&()),
            None,
            None,
            true,
        ),
        spec(
            "pods",
            Kind::Pod,
            ApiResource::erase::<Pod>(&()),
            None,
            Some(POD_FIELD_SELECTOR.into()),
            false,
        ),
        spec(
            "services",
            Kind::Service,
            ApiResource::erase::<Service>(&()),
            Some(SERVICE_SELECTOR),
            None,
            false,
        ),
        spec(
            "endpointslices",
            Kind::EndpointSlice,
            ApiResource::erase::<EndpointSlice>(&()),
            Some(SERVICE_SELECTOR),
            None,
            false,
        ),
        spec(
            "networkpolicies",
            Kind::NetworkPolicy,
            ApiResource::erase::<NetworkPolicy>(&()),
            None,
            None,
            false,
        ),
        spec(
            "servicecidrs",
            Kind::ServiceCidr,
            ApiResource::erase::<ServiceCIDR>(&()),
            None,
            None,
            false,
        ),
    ]
}

/// The client configuration: `--kubeconfig FILE` when given, else kube-rs's inference
/// (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account).
pub async fn client_config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config, String> {
    match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", p.display()))
        }
        None => kube::Config::infer().await.map_err(|e| e.to_string()),
    }
}

/// Starts every watch on `rt`; updates go to `tx`.
pub fn spawn(
    rt: &tokio::runtime::Handle,
    config: kube::Config,
    options: KubeOptions,
    specs: Vec<WatchSpec>,
    tx: Sender<Update>,
) {
    rt.spawn(async move {
        let client = match Client::try_from(config) {
            Ok(c) => c,
            Err(e) => {
                for s in &specs {
                    let _ = tx.send(Update::SourceError {
                        source: s.source.into(),
                        message: format!("cannot build an API client: {e}"),
                    });
                }
                return;
            }
        };
        for spec in specs {
            tokio::spawn(run(client.clone(), spec, options.clone(), tx.clone()));
        }
    });
}

/// Exponential backoff with a floor and a ceiling.
struct Expo {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Iterator for Expo {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(d)
    }
}

impl Backoff for Expo {
    fn reset(&mut self) {
        self.next = self.min;
    }
}

type EventStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<Event<DynamicObject>, watcher::Error>> + Send>>;

fn stream(client: Client, spec: &WatchSpec, options: &KubeOptions) -> EventStream {
    let api: Api<DynamicObject> = Api::all_with(client, &spec.resource);
    let mut wc = watcher::Config::default()
        .timeout(options.watch_timeout_s)
        .page_size(LIST_PAGE_SIZE);
    if let Some(l) = &spec.labels {
        wc = wc.labels(l);
    }
    if let Some(f) = &spec.fields {
        wc = wc.fields(f);
    }
    let backoff = Expo {
        min: options.backoff_min,
        max: options.backoff_max,
        next: options.backoff_min,
    };
    if spec.metadata_only {
        let meta_api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(api.into_client(), &spec.resource);
        let dynamic = |m: PartialObjectMeta<DynamicObject>| DynamicObject {
            types: m.types,
            metadata: m.metadata,
            data: Value::Object(Map::new()),
        };
        watcher::watcher(meta_api, wc)
            .map(move |r| {
                r.map(|ev| match ev {
                    Event::Apply(m) => Event::Apply(dynamic(m)),
                    Event::Delete(m) => Event::Delete(dynamic(m)),
                    Event::Init => Event::Init,
                    Event::InitApply(m) => Event::InitApply(dynamic(m)),
                    Event::InitDone => Event::InitDone,
                })
            })
            .backoff(backoff)
            .boxed()
    } else {
        watcher::watcher(api, wc).backoff(backoff).boxed()
    }
}

async fn run(client: Client, spec: WatchSpec, options: KubeOptions, tx: Sender<Update>) {
    let mut events = stream(client, &spec, &options);
    // Objects of a (re)list in progress, and the keys of those that could not be decoded.
    let mut listing: Option<(Vec<Object>, Vec<ObjectKey>)> = None;
    let mut failing = false;
    let mut absent = false;
    while let Some(ev) = events.next().await {
        let update = match ev {
            Ok(ev) => {
                if failing && !matches!(ev, Event::Init | Event::InitApply(_)) {
                    failing = false;
                    if tx
                        .send(Update::SourceUp {
                            source: spec.source.into(),
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                match ev {
                    Event::Init => {
                        listing = Some((Vec::new(), Vec::new()));
                        continue;
                    }
                    Event::InitApply(o) => {
                        let (objs, keep) = listing.get_or_insert_with(Default::default);
                        match decode(&spec, o) {
                            Ok(obj) => objs.push(obj),
                            Err((key, problem)) => {
                                keep.push(key.clone());
                                let _ = tx.send(Update::Problem {
                                    kind: spec.kind,
                                    key,
                                    problem,
                                });
                            }
                        }
                        continue;
                    }
                    Event::InitDone => {
                        let (objects, keep) = listing.take().unwrap_or_default();
                        absent = false;
                        failing = false;
                        Update::Relisted {
                            source: spec.source.into(),
                            kind: spec.kind,
                            objects,
                            keep,
                        }
                    }
                    Event::Apply(o) => match decode(&spec, o) {
                        Ok(obj) => Update::Apply(obj),
                        Err((key, problem)) => Update::Problem {
                            kind: spec.kind,
                            key,
                            problem,
                        },
                    },
                    Event::Delete(o) => Update::Delete {
                        kind: spec.kind,
                        key: key_of(&o),
                    },
                }
            }
            Err(e) => {
                failing = true;
                if is_not_found(&e) && !absent {
                    // The server does not serve this kind: it has none of them.
                    absent = true;
                    tracing::info!(
                        source = spec.source,
                        "resource not served by the API server; treated as empty"
                    );
                    Update::Relisted {
                        source: spec.source.into(),
                        kind: spec.kind,
                        objects: Vec::new(),
                        keep: Vec::new(),
                    }
                } else if absent {
                    continue;
                } else {
                    Update::SourceError {
                        source: spec.source.into(),
                        message: error_text(&e),
                    }
                }
            }
        };
        if tx.send(update).is_err() {
            return;
        }
    }
}

fn is_not_found(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(s)) if s.code == 404)
}

fn error_text(e: &watcher::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

fn key_of(o: &DynamicObject) -> ObjectKey {
    ObjectKey::new(
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

/// The typed object, with what kxdp does not read left out (managed fields, most of a Pod).
pub fn decode(spec: &WatchSpec, o: DynamicObject) -> Result<Object, (ObjectKey, Problem)> {
    let key = key_of(&o);
    let label = if key.namespace.is_empty() {
        format!("{} {}", spec.kind, key.name)
    } else {
        format!("{} {}", spec.kind, key)
    };
    let mut meta = o.metadata;
    meta.managed_fields = None;
    let mut map = match o.data {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    map.insert(
        "apiVersion".into(),
        Value::String(spec.resource.api_version.clone()),
    );
    map.insert("kind".into(), Value::String(spec.resource.kind.clone()));
    if spec.kind == Kind::Pod {
        strip_pod(&mut map);
        meta.annotations = None;
        meta.owner_references = None;
    }
    let meta = serde_json::to_value(&meta).map_err(|e| {
        (
            key.clone(),
            Problem {
                object: label.clone(),
                message: format!("metadata: {e}"),
            },
        )
    })?;
    map.insert("metadata".into(), meta);
    let v = Value::Object(map);
    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<Box<T>, String> {
        serde_path_to_error::deserialize::<_, T>(v)
            .map(Box::new)
            .map_err(|e| {
                let path = e.path().to_string();
                format!("{path}: {}", e.into_inner())
            })
    }
    let r = match spec.kind {
        Kind::Node => typed(v).map(Object::Node),
        Kind::Namespace => typed(v).map(Object::Namespace),
        Kind::Pod => typed(v).map(Object::Pod),
        Kind::Service => typed(v).map(Object::Service),
        Kind::EndpointSlice => typed(v).map(Object::EndpointSlice),
        Kind::NetworkPolicy => typed(v).map(Object::NetworkPolicy),
        Kind::ServiceCidr => typed(v).map(Object::ServiceCidr),
    };
    r.map_err(|message| {
        (
            key,
            Problem {
                object: label,
                message: format!("cannot decode: {message}; object skipped"),
            },
        )
    })
}

/// A Pod as policy and locality read it: spec.nodeName, spec.hostNetwork, the containers' names
/// and ports (named ports), status.phase, status.podIP(s).
fn strip_pod(map: &mut Map<String, Value>) {
    let spec = map.remove("spec");
    let status = map.remove("status");
    let pick = |v: Option<Value>, keys: &[&str]| -> Map<String, Value> {
        let mut out = Map::new();
        if let Some(Value::Object(m)) = v {
            for k in keys {
                if let Some(x) = m.get(*k) {
                    out.insert((*k).to_string(), x.clone());
                }
            }
        }
        out
    };
    // Containers keep their name and ports: policy resolves named ports against them.
    let containers = |key: &str| -> Value {
        let list = spec
            .as_ref()
            .and_then(|s| s.get(key))
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let mut out = Map::new();
                        for k in ["name", "ports"] {
                            if let Some(x) = c.get(k) {
                                out.insert(k.into(), x.clone());
                            }
                        }
                        Value::Object(out)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Value::Array(list)
    };
    let (main, init) = (containers("containers"), containers("initContainers"));
    let mut spec = pick(spec, &["nodeName", "hostNetwork"]);
    spec.insert("containers".into(), main);
    if init.as_array().is_some_and(|a| !a.is_empty()) {
        spec.insert("initContainers".into(), init);
    }
    map.insert("spec".into(), Value::Object(spec));
    map.insert(
        "status".into(),
        Value::Object(pick(
            status,
            &["phase", "podIP", "podIPs", "hostIP", "hostIPs"],
        )),
    );
}
