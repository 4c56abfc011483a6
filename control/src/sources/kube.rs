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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde::de::DeserializeOwned;
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

/// One object as `run` receives it: its key, and the typed object or why it cannot be decoded.
#[derive(Debug)]
struct Item {
    key: ObjectKey,
    decoded: Result<Object, Problem>,
}

type EventStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<Event<Item>, watcher::Error>> + Send>>;

fn map_event<A, B>(ev: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// A k8s-openapi type decoded straight from the API server's JSON (`Received`).
pub trait Decodable:
    DeserializeOwned
    + k8s_openapi::Resource
    + k8s_openapi::Metadata<Ty = ObjectMeta>
    + Send
    + Sync
    + 'static
{
    fn into_object(self: Box<Self>) -> Object;
}

macro_rules! decodable {
    ($($t:ty => $v:ident),*) => {$(
        impl Decodable for $t {
            fn into_object(self: Box<Self>) -> Object {
                Object::$v(self)
            }
        }
    )*};
}
decodable!(Node => Node, Service => Service, EndpointSlice => EndpointSlice,
    NetworkPolicy => NetworkPolicy, ServiceCIDR => ServiceCidr);

/// An object of kind `K` as received: decoded in one pass from the response's JSON into `K`
/// (each object's text is taken as it is, then decoded), or, when it does not decode, its
/// name and the reason. Never a deserialization error: one bad object must not fail the page
/// it came in (the list would stall), so it is skipped and reported instead.
///
/// Issue 14: objects went JSON → `DynamicObject` (through serde's buffering of flattened
/// fields) → JSON values again → typed, three conversions; a 30k-Service list took 16.5 s.
pub struct Received<K> {
    /// Name, namespace and resourceVersion (what the watcher and the key read).
    meta: ObjectMeta,
    decoded: Result<Object, String>,
    kind: std::marker::PhantomData<fn() -> K>,
}

// By hand: derived impls would ask `K: Clone + Debug`, which `K` (a marker here) need not be.
impl<K> Clone for Received<K> {
    fn clone(&self) -> Self {
        Received {
            meta: self.meta.clone(),
            decoded: self.decoded.clone(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Received<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("meta", &self.meta)
            .field("decoded", &self.decoded)
            .finish()
    }
}

impl<K: Decodable> k8s_openapi::Resource for Received<K> {
    const API_VERSION: &'static str = K::API_VERSION;
    const GROUP: &'static str = K::GROUP;
    const KIND: &'static str = K::KIND;
    const VERSION: &'static str = K::VERSION;
    const URL_PATH_SEGMENT: &'static str = K::URL_PATH_SEGMENT;
    type Scope = K::Scope;
}

impl<K: Decodable> k8s_openapi::ListableResource for Received<K> {
    const LIST_KIND: &'static str = "List";
}

impl<K: Decodable> k8s_openapi::Metadata for Received<K> {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.meta
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

/// serde_json's name for its raw-value protocol (`serde_json::value::RawValue`): asked for a
/// newtype struct of this name, serde_json's deserializer hands over the value's text as a map
/// of one entry, this name → the text. Any other deserializer (serde's buffered content, when a
/// watch event names its `object` before its `type`) calls `visit_newtype_struct` instead, and
/// the object goes through a JSON value: slower, same result. Should serde_json ever rename it,
/// everything takes that slower way and stays correct.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de, K: Decodable> serde::Deserialize<'de> for Received<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Raw<K>(std::marker::PhantomData<fn() -> K>);
        impl<'de, K: Decodable> serde::de::Visitor<'de> for Raw<K> {
            type Value = Received<K>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a Kubernetes object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                match map.next_key::<std::borrow::Cow<'de, str>>()? {
                    Some(k) if k == RAW_VALUE_TOKEN => {
                        let text: std::borrow::Cow<'de, str> = map.next_value()?;
                        Ok(Received::from_json(&text))
                    }
                    _ => Err(serde::de::Error::custom("unexpected map")),
                }
            }
            fn visit_newtype_struct<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                let v = <Value as serde::Deserialize>::deserialize(d)?;
                Ok(Received::from_json(&v.to_string()))
            }
        }
        d.deserialize_newtype_struct(RAW_VALUE_TOKEN, Raw(std::marker::PhantomData))
    }
}

impl<K: Decodable> Received<K> {
    /// Decodes one object's JSON text; never fails (see the type's docs).
    fn from_json(text: &str) -> Self {
        match serde_json::from_str::<K>(text) {
            Ok(mut obj) => {
                let m = obj.metadata_mut();
                m.managed_fields = None;
                let meta = ObjectMeta {
                    name: m.name.clone(),
                    namespace: m.namespace.clone(),
                    resource_version: m.resource_version.clone(),
                    ..Default::default()
                };
                Received {
                    meta,
                    decoded: Ok(Box::new(obj).into_object()),
                    kind: std::marker::PhantomData,
                }
            }
            Err(_) => {
                // Again, for the field path (errors are rare: the fast way first).
                let mut de = serde_json::Deserializer::from_str(text);
                let message = match serde_path_to_error::deserialize::<_, K>(&mut de) {
                    Ok(_) => "undecodable".to_string(),
                    Err(e) => {
                        let path = e.path().to_string();
                        format!("{path}: {}", e.into_inner())
                    }
                };
                /// Whatever of the metadata is readable.
                #[derive(serde::Deserialize, Default)]
                struct Lenient {
                    #[serde(default)]
                    metadata: LenientMeta,
                }
                #[derive(serde::Deserialize, Default)]
                #[serde(rename_all = "camelCase")]
                struct LenientMeta {
                    name: Option<String>,
                    namespace: Option<String>,
                    resource_version: Option<String>,
                }
                let m = serde_json::from_str::<Lenient>(text)
                    .unwrap_or_default()
                    .metadata;
                Received {
                    meta: ObjectMeta {
                        name: m.name,
                        namespace: m.namespace,
                        resource_version: m.resource_version,
                        ..Default::default()
                    },
                    decoded: Err(message),
                    kind: std::marker::PhantomData,
                }
            }
        }
    }
}

fn problem(spec: &WatchSpec, key: &ObjectKey, message: String) -> Problem {
    let label = if key.namespace.is_empty() {
        format!("{} {}", spec.kind, key.name)
    } else {
        format!("{} {}", spec.kind, key)
    };
    Problem {
        object: label,
        message: format!("cannot decode: {message}; object skipped"),
    }
}

fn typed_stream<K: Decodable>(
    client: Client,
    spec: &WatchSpec,
    wc: watcher::Config,
    backoff: Expo,
) -> EventStream
where
    Received<K>: kube::Resource<DynamicType = ()>,
{
    let api: Api<Received<K>> = Api::all(client);
    let spec = spec.clone();
    watcher::watcher(api, wc)
        .map(move |r| {
            r.map(|ev| {
                map_event(ev, |o: Received<K>| {
                    let key = ObjectKey::new(
                        o.meta.namespace.clone().unwrap_or_default(),
                        o.meta.name.clone().unwrap_or_default(),
                    );
                    let decoded = o.decoded.map_err(|m| problem(&spec, &key, m));
                    Item { key, decoded }
                })
            })
        })
        .backoff(backoff)
        .boxed()
}

fn stream(client: Client, spec: &WatchSpec, options: &KubeOptions) -> EventStream {
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
    match spec.kind {
        Kind::Node => return typed_stream::<Node>(client, spec, wc, backoff),
        Kind::Service => return typed_stream::<Service>(client, spec, wc, backoff),
        Kind::EndpointSlice => return typed_stream::<EndpointSlice>(client, spec, wc, backoff),
        Kind::NetworkPolicy => return typed_stream::<NetworkPolicy>(client, spec, wc, backoff),
        Kind::ServiceCidr => return typed_stream::<ServiceCIDR>(client, spec, wc, backoff),
        // Pods are stripped to what policy reads before decoding (a field kxdp does not read
        // cannot make one undecodable); Namespaces are watched as metadata.
        Kind::Pod | Kind::Namespace => {}
    }
    let spec2 = spec.clone();
    let item = move |o: DynamicObject| {
        let key = key_of(&o);
        let decoded = decode(&spec2, o).map_err(|(_, p)| p);
        Item { key, decoded }
    };
    let api: Api<DynamicObject> = Api::all_with(client, &spec.resource);
    if spec.metadata_only {
        let meta_api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(api.into_client(), &spec.resource);
        let dynamic = |m: PartialObjectMeta<DynamicObject>| DynamicObject {
            types: m.types,
            metadata: m.metadata,
            data: Value::Object(Map::new()),
        };
        watcher::watcher(meta_api, wc)
            .map(move |r| r.map(|ev| map_event(ev, |m| item(dynamic(m)))))
            .backoff(backoff)
            .boxed()
    } else {
        watcher::watcher(api, wc)
            .map(move |r| r.map(|ev| map_event(ev, &item)))
            .backoff(backoff)
            .boxed()
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
                    Event::InitApply(Item { key, decoded }) => {
                        let (objs, keep) = listing.get_or_insert_with(Default::default);
                        match decoded {
                            Ok(obj) => objs.push(obj),
                            Err(problem) => {
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
                    Event::Apply(Item { key, decoded }) => match decoded {
                        Ok(obj) => Update::Apply(obj),
                        Err(problem) => Update::Problem {
                            kind: spec.kind,
                            key,
                            problem,
                        },
                    },
                    Event::Delete(o) => Update::Delete {
                        kind: spec.kind,
                        key: o.key,
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

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: &str = r#"{"metadata":{"name":"web","namespace":"shop","resourceVersion":"7","managedFields":[{"manager":"x"}]},"spec":{"clusterIP":"172.30.0.10","ports":[{"port":80}]}}"#;

    fn service(r: &Received<Service>) -> &Service {
        match &r.decoded {
            Ok(Object::Service(s)) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn received_objects_decode_in_one_pass_from_a_list() {
        let list: Vec<Received<Service>> = serde_json::from_str(&format!("[{SVC}]")).unwrap();
        let s = service(&list[0]);
        assert_eq!(
            s.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("172.30.0.10")
        );
        assert_eq!(s.metadata.managed_fields, None);
        assert_eq!(list[0].meta.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn received_objects_decode_from_buffered_content_too() {
        // `object` before `type`: serde buffers the event, the raw text is not available.
        let ev: kube::core::WatchEvent<Received<Service>> =
            serde_json::from_str(&format!(r#"{{"object":{SVC},"type":"ADDED"}}"#)).unwrap();
        let kube::core::WatchEvent::Added(r) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(service(&r).metadata.name.as_deref(), Some("web"));
    }

    #[test]
    fn an_undecodable_object_is_named_and_does_not_fail_its_page() {
        let bad = r#"{"metadata":{"name":"bad","namespace":"shop"},"spec":{"ports":[{"port":"eighty"}]}}"#;
        let list: Vec<Received<Service>> = serde_json::from_str(&format!("[{SVC},{bad}]")).unwrap();
        assert!(list[0].decoded.is_ok());
        assert_eq!(list[1].meta.name.as_deref(), Some("bad"));
        let err = list[1].decoded.as_ref().unwrap_err();
        assert!(err.starts_with("spec.ports[0].port: invalid type"), "{err}");
    }
}
