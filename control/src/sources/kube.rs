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
//! are reported (`Update::SourceError`); the last good tables stay meanwhile. While a watch
//! fails, a list of one object (`Probe`, on the same backoff) notices the server answering again:
//! a resumed watch yields nothing until its kind changes.
//!
//! Objects are read one by one (`Received<K>`), so that one object the typed model rejects is
//! skipped and reported (its last good version stays), instead of failing the whole list and
//! stalling the kind. A kind the server does not serve (404, e.g. ServiceCIDR on an older
//! cluster) counts as empty, so that it never holds up the first sync.
//!
//! Lists at cluster scale (30,000 Services × 10 endpoints): while kube-rs fetches a
//! list's pages one after the other on the sources' thread, only each object's metadata is read
//! there; its text is decoded into the k8s-openapi type on tokio's blocking pool, in chunks of
//! `DECODE_CHUNK`, at most one chunk per core at a time per watch, overlapping the next pages'
//! requests. Each watch remembers the resourceVersion of every object it handed over
//! (`HeldVersions`): a relist (after `410 Gone`) decodes and sends only the objects whose
//! resourceVersion changed; the others are named in `Update::Relisted::keep` and the store keeps
//! them as they are (one resourceVersion names one version of an object).

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;
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

use crate::model::{ClusterNetworkPolicy, Kind, Object, ObjectKey};
use crate::problem::Problem;
use crate::sources::event::Update;

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
/// was at the first page's resourceVersion. 500 is client-go's (and kube-proxy's informers')
/// value; larger pages were not needed: with decoding off the sources' thread a page's round
/// trip is a small part of the list (docs/benchmarks.md, "API server").
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
    /// The longest the client waits for the next bytes of a response (kube-rs's
    /// `read_timeout`): an API server that accepts connections and then answers nothing is a
    /// source error after this long, instead of after kube-rs's 295 s. Above the API server's
    /// bookmark interval (about a minute), so that a quiet watch is not cut.
    pub read_timeout: Duration,
}

impl Default for KubeOptions {
    /// client-go's reflector backoff: 800 ms doubling to 30 s.
    fn default() -> Self {
        KubeOptions {
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            watch_timeout_s: 290,
            read_timeout: Duration::from_secs(90),
        }
    }
}

/// The requests kxdp makes besides its watches (each of which lists, then watches, its
/// resource): (API group, resource, verb). `nodeOverrides` reads this node's Node with one GET
/// at start (`run::node_labels`).
pub const REQUESTS_BESIDE_WATCHES: &[(&str, &str, &str)] = &[("", "nodes", "get")];

/// Every request kxdp makes to the API server, as RBAC names them: (API group, resource, verb).
/// deploy/base/rbac.yaml grants exactly these; tests/ops_deploy.rs checks both that and that the
/// source makes no other call.
pub fn api_requests() -> std::collections::BTreeSet<(String, String, String)> {
    let mut all = std::collections::BTreeSet::new();
    for s in specs("") {
        for verb in ["list", "watch"] {
            all.insert((
                s.resource.group.clone(),
                s.resource.plural.clone(),
                verb.to_string(),
            ));
        }
    }
    for (group, resource, verb) in REQUESTS_BESIDE_WATCHES {
        all.insert((group.to_string(), resource.to_string(), verb.to_string()));
    }
    all
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
        // A cluster without the CRD answers 404: treated as none, as above.
        spec(
            "clusternetworkpolicies",
            Kind::ClusterNetworkPolicy,
            ApiResource::erase::<ClusterNetworkPolicy>(&()),
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

/// The warning for an API server address that is a Service ClusterIP (inside `service_cidrs`):
/// on a node without kube-proxy nothing translates it until kxdp has synced, and kxdp syncs
/// through it. In a pod that is the `kubernetes` Service's address, which Kubernetes puts in
/// KUBERNETES_SERVICE_HOST unless the manifest sets the real one. None: an address outside them
/// (or a name).
pub fn service_address_warning(
    kc: &kube::Config,
    service_cidrs: &[ipnet::IpNet],
) -> Option<String> {
    let cluster_url = &kc.cluster_url;
    let host = cluster_url.host()?;
    let ip: std::net::IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    let cidr = service_cidrs.iter().find(|c| c.contains(&ip))?;
    let port = cluster_url.port_u16().unwrap_or(443);
    Some(format!(
        "kxdp run: the API server address {host}:{port} is in serviceCIDRs ({cidr}): a Service ClusterIP (in a pod, the `kubernetes` Service's, from KUBERNETES_SERVICE_HOST), which on a node without kube-proxy nothing translates until kxdp has synced through it; set KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT to the API server's own address (the DaemonSet takes them from the ConfigMap kxdp-apiserver, docs/install.md)"
    ))
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
        let mut config = config;
        config.read_timeout = Some(options.read_timeout);
        // Counted from each request, not from when its pooled connection went idle.
        config.reset_reader_on_write = true;
        // kube-rs would retry a 429 or 503 itself up to 15 times with a delay doubling from 5 ms
        // (minutes in all) before the watcher saw an error: kxdp's own backoff retries every
        // error instead, so that each one is reported while the server refuses.
        config.default_retry = false;
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

/// One object as `run` receives it: its key, its resourceVersion, and what became of it.
#[derive(Debug)]
struct Item {
    key: ObjectKey,
    resource_version: Option<String>,
    decoded: Got,
}

/// What decoding an object gave.
enum Got {
    Object(Object),
    /// The version this watch handed over last (same key and resourceVersion): not decoded
    /// again. A relist after `410 Gone` repeats every object; the API server guarantees that
    /// one resourceVersion names one version of an object, so only the changed ones are
    /// decoded and sent.
    Held,
    /// To be decoded (by `run`, on the blocking pool during a list).
    Deferred(Arc<str>, DecodeFn),
    Invalid(Problem),
}

impl std::fmt::Debug for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Object(o) => f.debug_tuple("Object").field(o).finish(),
            Got::Held => f.write_str("Held"),
            Got::Deferred(t, _) => f.debug_tuple("Deferred").field(&t.len()).finish(),
            Got::Invalid(p) => f.debug_tuple("Invalid").field(p).finish(),
        }
    }
}

/// The resourceVersion of every object one watch has handed over (and not seen deleted
/// since): what `Received` compares with, to skip decoding objects the store already holds.
type HeldVersions = HashMap<ObjectKey, String>;

thread_local! {
    /// Set by `run` for the duration of one synchronous poll of its stream, to the
    /// `HeldVersions` of its watch: a `Received` read inside kube-rs's list or watch then
    /// compares with them and defers its decoding (`Received::from_json`). A thread-local
    /// because the reading is `serde::Deserialize`, called by kube-rs with no context of ours.
    static CONTEXT: std::cell::RefCell<Option<Arc<HeldVersions>>> = const { std::cell::RefCell::new(None) };
}

/// Polls `events` with `held` visible to `Received`'s reading.
fn poll_with_held(
    events: &mut EventStream,
    held: &Arc<HeldVersions>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Option<Result<Event<Item>, watcher::Error>>> {
    CONTEXT.with(|h| *h.borrow_mut() = Some(held.clone()));
    let r = events.poll_next_unpin(cx);
    CONTEXT.with(|h| *h.borrow_mut() = None);
    r
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
    NetworkPolicy => NetworkPolicy, ServiceCIDR => ServiceCidr,
    ClusterNetworkPolicy => ClusterNetworkPolicy);

/// An object of kind `K` as received: decoded in one pass from the response's JSON into `K`
/// (each object's text is taken as it is, then decoded), or, when it does not decode, its
/// name and the reason. Never a deserialization error: one bad object must not fail the page
/// it came in (the list would stall), so it is skipped and reported instead.
///
/// Decoded the plain way, objects went JSON → `DynamicObject` (through serde's buffering of flattened
/// fields) → JSON values again → typed, three conversions; a 30k-Service list took 16.5 s.
pub struct Received<K> {
    /// Name, namespace and resourceVersion (what the watcher and the key read).
    meta: ObjectMeta,
    decoded: Decoded,
    kind: std::marker::PhantomData<fn() -> K>,
}

#[derive(Clone)]
enum Decoded {
    Object(Object),
    /// Held already at this resourceVersion (see `Got::Held`).
    Held,
    /// Not decoded yet: the object's text and its decoder (see `Received::from_json`).
    Deferred(Arc<str>, DecodeFn),
    /// Why it cannot be decoded (the field path and serde's message).
    Invalid(String),
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

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decoded::Object(o) => f.debug_tuple("Object").field(o).finish(),
            Decoded::Held => f.write_str("Held"),
            Decoded::Deferred(t, _) => f.debug_tuple("Deferred").field(&t.len()).finish(),
            Decoded::Invalid(m) => f.debug_tuple("Invalid").field(m).finish(),
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

/// Whatever of the metadata is readable.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LenientMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
}

impl LenientMeta {
    /// The object's `metadata`, read up to its end only: the API server writes it before
    /// `spec` and `status`, so the rest of the object is not even scanned. Unreadable
    /// metadata gives empty fields (the object's decoding then says why).
    fn read(text: &str) -> LenientMeta {
        use serde::de::{DeserializeSeed, Error, IgnoredAny, MapAccess, Visitor};
        struct Seed<'a>(&'a mut Option<LenientMeta>);
        impl<'de> DeserializeSeed<'de> for Seed<'_> {
            type Value = ();
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_map(self)
            }
        }
        impl<'de> Visitor<'de> for Seed<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
                while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if k == "metadata" {
                        *self.0 = Some(map.next_value()?);
                        // Stop: what follows is not needed (the error is the way out).
                        return Err(A::Error::custom("metadata read"));
                    }
                    map.next_value::<IgnoredAny>()?;
                }
                Ok(())
            }
        }
        let mut out = None;
        let mut de = serde_json::Deserializer::from_str(text);
        let _ = Seed(&mut out).deserialize(&mut de);
        out.unwrap_or_default()
    }

    fn into_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            resource_version: self.resource_version,
            ..Default::default()
        }
    }
}

/// Decodes an object's text into its kind, or says why not (field path and message).
type DecodeFn = fn(&str) -> Result<Object, String>;

impl<K: Decodable> Received<K> {
    /// Reads one object's JSON text; never fails (see the type's docs).
    ///
    /// Polled by `run` (`CONTEXT` set): only the metadata is read here, on the sources'
    /// thread; an object held at this resourceVersion already is `Held`, any other is
    /// `Deferred` (its text kept) and decoded by `run` on the blocking pool, in parallel with
    /// the list's next pages. Elsewhere (tests), decoded at once.
    fn from_json(text: &str) -> Self {
        let context = CONTEXT.with(|h| h.borrow().clone());
        if let Some(held) = context {
            let m = LenientMeta::read(text);
            let is_held = !held.is_empty()
                && m.resource_version.as_ref().is_some_and(|rv| {
                    let key = ObjectKey::new(
                        m.namespace.clone().unwrap_or_default(),
                        m.name.clone().unwrap_or_default(),
                    );
                    held.get(&key) == Some(rv)
                });
            return Received {
                meta: m.into_meta(),
                decoded: if is_held {
                    Decoded::Held
                } else {
                    Decoded::Deferred(text.into(), Self::decode)
                },
                kind: std::marker::PhantomData,
            };
        }
        match Self::decode(text) {
            Ok(obj) => {
                let m = obj.metadata();
                let meta = ObjectMeta {
                    name: m.name.clone(),
                    namespace: m.namespace.clone(),
                    resource_version: m.resource_version.clone(),
                    ..Default::default()
                };
                Received {
                    meta,
                    decoded: Decoded::Object(obj),
                    kind: std::marker::PhantomData,
                }
            }
            Err(message) => Received {
                meta: LenientMeta::read(text).into_meta(),
                decoded: Decoded::Invalid(message),
                kind: std::marker::PhantomData,
            },
        }
    }

    /// The typed object (without managed fields), or the field path and message.
    fn decode(text: &str) -> Result<Object, String> {
        match serde_json::from_str::<K>(text) {
            Ok(mut obj) => {
                obj.metadata_mut().managed_fields = None;
                Ok(Box::new(obj).into_object())
            }
            Err(_) => {
                // Again, for the field path (errors are rare: the fast way first).
                let mut de = serde_json::Deserializer::from_str(text);
                Err(match serde_path_to_error::deserialize::<_, K>(&mut de) {
                    Ok(_) => "undecodable".to_string(),
                    Err(e) => {
                        let path = e.path().to_string();
                        format!("{path}: {}", e.into_inner())
                    }
                })
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
                    let decoded = match o.decoded {
                        Decoded::Object(obj) => Got::Object(obj),
                        Decoded::Held => Got::Held,
                        Decoded::Deferred(text, decode) => Got::Deferred(text, decode),
                        Decoded::Invalid(m) => Got::Invalid(problem(&spec, &key, m)),
                    };
                    Item {
                        key,
                        resource_version: o.meta.resource_version,
                        decoded,
                    }
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
        Kind::ClusterNetworkPolicy => {
            return typed_stream::<ClusterNetworkPolicy>(client, spec, wc, backoff)
        }
        // Pods are stripped to what policy reads before decoding (a field kxdp does not read
        // cannot make one undecodable); Namespaces are watched as metadata.
        Kind::Pod | Kind::Namespace => {}
    }
    let spec2 = spec.clone();
    let item = move |o: DynamicObject| {
        let key = key_of(&o);
        let resource_version = o.metadata.resource_version.clone();
        let decoded = match decode(&spec2, o) {
            Ok(obj) => Got::Object(obj),
            Err((_, p)) => Got::Invalid(p),
        };
        Item {
            key,
            resource_version,
            decoded,
        }
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

/// Objects decoded per task of the blocking pool during a list.
const DECODE_CHUNK: usize = 250;

/// An object of a list waiting to be decoded.
struct Pending {
    key: ObjectKey,
    resource_version: Option<String>,
    text: Arc<str>,
    decode: DecodeFn,
}

/// A decoded object of a list: its key, resourceVersion, and the object or why not.
type Decoded1 = (ObjectKey, Option<String>, Result<Object, String>);

/// A (re)list in progress.
#[derive(Default)]
struct Listing {
    /// Objects to hand over (new or changed).
    objects: Vec<Object>,
    /// Listed but not handed over: held already, or undecodable (the store keeps its version).
    keep: Vec<ObjectKey>,
    /// The versions held once the list is handed over.
    held: HeldVersions,
    /// Objects waiting for a decoding task.
    chunk: Vec<Pending>,
    /// Decoding tasks, in list order.
    decoding: std::collections::VecDeque<tokio::task::JoinHandle<Vec<Decoded1>>>,
}

impl Listing {
    /// At most this many chunks are decoded at once per watch.
    fn parallelism() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    }

    /// Sends the chunk to the blocking pool (waiting for the oldest task first when enough
    /// run already).
    async fn dispatch(&mut self, spec: &WatchSpec, tx: &Sender<Update>) {
        if self.chunk.is_empty() {
            return;
        }
        while self.decoding.len() >= Self::parallelism() {
            self.collect_one(spec, tx).await;
        }
        let chunk = std::mem::take(&mut self.chunk);
        self.decoding
            .push_back(tokio::task::spawn_blocking(move || {
                chunk
                    .into_iter()
                    .map(|p| (p.key, p.resource_version, (p.decode)(&p.text)))
                    .collect()
            }));
    }

    /// Takes the oldest decoding task's objects in.
    async fn collect_one(&mut self, spec: &WatchSpec, tx: &Sender<Update>) {
        let Some(task) = self.decoding.pop_front() else {
            return;
        };
        // A decoding task does not panic (serde returns errors); if one did, its objects are
        // kept as they are held (listed, not handed over).
        let done = match task.await {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(source = spec.source, error = %e, "decoding task failed");
                return;
            }
        };
        for (key, rv, decoded) in done {
            self.take(spec, tx, key, rv, decoded);
        }
    }

    fn take(
        &mut self,
        spec: &WatchSpec,
        tx: &Sender<Update>,
        key: ObjectKey,
        rv: Option<String>,
        decoded: Result<Object, String>,
    ) {
        match decoded {
            Ok(obj) => {
                if let Some(rv) = rv {
                    self.held.insert(key, rv);
                }
                self.objects.push(obj);
            }
            Err(message) => {
                let problem = problem(spec, &key, message);
                self.keep.push(key.clone());
                let _ = tx.send(Update::Problem {
                    kind: spec.kind,
                    key,
                    problem,
                });
            }
        }
    }

    /// Every object of the list, decoded.
    async fn finish(mut self, spec: &WatchSpec, tx: &Sender<Update>) -> Listing {
        self.dispatch(spec, tx).await;
        while !self.decoding.is_empty() {
            self.collect_one(spec, tx).await;
        }
        self
    }
}

/// While a watch fails: a list of one object of its kind (with the watch's selectors), after
/// a delay that doubles as the watch's backoff does, to see the API server answer again.
struct Probe {
    probe_api: Api<DynamicObject>,
    params: kube::api::ListParams,
    delay: Expo,
}

impl Probe {
    fn new(client: &Client, spec: &WatchSpec, options: &KubeOptions) -> Probe {
        let mut params = kube::api::ListParams::default().limit(1);
        if let Some(l) = &spec.labels {
            params = params.labels(l);
        }
        if let Some(f) = &spec.fields {
            params = params.fields(f);
        }
        let probe_api = Api::all_with(client.clone(), &spec.resource);
        Probe {
            probe_api,
            params,
            delay: Expo {
                min: options.backoff_min,
                max: options.backoff_max,
                next: options.backoff_min,
            },
        }
    }

    /// Waits the next delay, then asks: true when the server answered the list.
    async fn answered(&mut self) -> bool {
        let wait = self.delay.next().unwrap_or(self.delay.max);
        tokio::time::sleep(wait).await;
        self.probe_api.list_metadata(&self.params).await.is_ok()
    }

    fn reset(&mut self) {
        self.delay.reset();
    }
}

async fn run(client: Client, spec: WatchSpec, options: KubeOptions, tx: Sender<Update>) {
    let mut probe = Probe::new(&client, &spec, &options);
    let mut events = stream(client, &spec, &options);
    let mut listing: Option<Listing> = None;
    // What the store holds from this watch (`Got::Held`). Only mutated between polls, when
    // no clone is alive, so `Arc::make_mut` does not copy.
    let mut held: Arc<HeldVersions> = Arc::default();
    let mut failing = false;
    let mut absent = false;
    loop {
        let next = std::future::poll_fn(|cx| poll_with_held(&mut events, &held, cx));
        let next = if failing && !absent {
            // A watch that resumes after an error yields nothing until the kind changes:
            // a quiet kind would stay reported down for good. A small list says it is back.
            tokio::select! {
                next = next => next,
                up = probe.answered() => {
                    if up {
                        failing = false;
                        probe.reset();
                        if tx.send(Update::SourceUp { source: spec.source.into() }).is_err() {
                            return;
                        }
                    }
                    continue;
                }
            }
        } else {
            next.await
        };
        let Some(ev) = next else { break };
        let update = match ev {
            Ok(ev) => {
                if failing && !matches!(ev, Event::Init | Event::InitApply(_)) {
                    failing = false;
                    probe.reset();
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
                        listing = Some(Listing::default());
                        continue;
                    }
                    Event::InitApply(Item {
                        key,
                        resource_version,
                        decoded,
                    }) => {
                        let l = listing.get_or_insert_with(Listing::default);
                        match decoded {
                            Got::Object(obj) => l.take(&spec, &tx, key, resource_version, Ok(obj)),
                            Got::Deferred(text, decode) => {
                                l.chunk.push(Pending {
                                    key,
                                    resource_version,
                                    text,
                                    decode,
                                });
                                if l.chunk.len() >= DECODE_CHUNK {
                                    l.dispatch(&spec, &tx).await;
                                }
                            }
                            Got::Held => {
                                if let Some(rv) = resource_version {
                                    l.held.insert(key.clone(), rv);
                                }
                                l.keep.push(key);
                            }
                            Got::Invalid(problem) => {
                                l.keep.push(key.clone());
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
                        let l = listing.take().unwrap_or_default().finish(&spec, &tx).await;
                        held = Arc::new(l.held);
                        absent = false;
                        failing = false;
                        probe.reset();
                        Update::Relisted {
                            source: spec.source.into(),
                            kind: spec.kind,
                            objects: l.objects,
                            keep: l.keep,
                        }
                    }
                    Event::Apply(Item {
                        key,
                        resource_version,
                        decoded,
                    }) => {
                        let decoded = match decoded {
                            Got::Object(obj) => Ok(obj),
                            Got::Deferred(text, decode) => {
                                decode(&text).map_err(|m| problem(&spec, &key, m))
                            }
                            // A repeat of what the store holds.
                            Got::Held => continue,
                            Got::Invalid(problem) => Err(problem),
                        };
                        match decoded {
                            Ok(obj) => {
                                let held = Arc::make_mut(&mut held);
                                match resource_version {
                                    Some(rv) => held.insert(key, rv),
                                    None => held.remove(&key),
                                };
                                Update::Apply(obj)
                            }
                            Err(problem) => {
                                // Decoded (and reported) again if listed again.
                                Arc::make_mut(&mut held).remove(&key);
                                Update::Problem {
                                    kind: spec.kind,
                                    key,
                                    problem,
                                }
                            }
                        }
                    }
                    Event::Delete(o) => {
                        Arc::make_mut(&mut held).remove(&o.key);
                        Update::Delete {
                            kind: spec.kind,
                            key: o.key,
                        }
                    }
                }
            }
            Err(e) => {
                failing = true;
                if is_not_found(&e) && !absent {
                    // The server does not serve this kind: it has none of them.
                    absent = true;
                    held = Arc::default();
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
        Kind::ClusterNetworkPolicy => typed(v).map(Object::ClusterNetworkPolicy),
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

    #[test]
    fn a_cluster_ip_api_server_address_is_named() {
        let cidrs: Vec<ipnet::IpNet> = vec![
            "10.96.0.0/12".parse().unwrap(),
            "fd00:10:96::/112".parse().unwrap(),
        ];
        let kc = |url: &str| kube::Config::new(url.parse().unwrap());
        let warn = |url: &str| service_address_warning(&kc(url), &cidrs);
        let w = warn("https://10.96.0.1").unwrap();
        assert!(
            w.contains("10.96.0.1:443 is in serviceCIDRs (10.96.0.0/12)")
                && w.contains("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT")
                && w.contains("kxdp-apiserver"),
            "{w}"
        );
        assert!(warn("https://[fd00:10:96::1]:6443")
            .unwrap()
            .contains("[fd00:10:96::1]:6443 is in serviceCIDRs"));
        assert_eq!(warn("https://192.168.1.10:6443"), None);
        assert_eq!(warn("https://api.example.com:6443"), None);
        assert_eq!(service_address_warning(&kc("https://10.96.0.1"), &[]), None);
    }

    const SVC: &str = r#"{"metadata":{"name":"web","namespace":"shop","resourceVersion":"7","managedFields":[{"manager":"x"}]},"spec":{"clusterIP":"172.30.0.10","ports":[{"port":80}]}}"#;

    fn service(r: &Received<Service>) -> &Service {
        match &r.decoded {
            Decoded::Object(Object::Service(s)) => s,
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
    fn an_object_held_at_its_resource_version_is_not_decoded_again() {
        let mut held = HeldVersions::new();
        held.insert(ObjectKey::new("shop", "web"), "7".to_string());
        CONTEXT.with(|h| *h.borrow_mut() = Some(Arc::new(held)));
        let same: Vec<Received<Service>> = serde_json::from_str(&format!("[{SVC}]")).unwrap();
        let newer: Vec<Received<Service>> =
            serde_json::from_str(&format!("[{}]", SVC.replace("\"7\"", "\"8\""))).unwrap();
        CONTEXT.with(|h| *h.borrow_mut() = None);
        assert!(matches!(same[0].decoded, Decoded::Held), "{:?}", same[0]);
        assert_eq!(same[0].meta.name.as_deref(), Some("web"));
        assert_eq!(same[0].meta.resource_version.as_deref(), Some("7"));
        // Not held at this version: read for its metadata, decoded later from its text.
        assert_eq!(newer[0].meta.resource_version.as_deref(), Some("8"));
        let Decoded::Deferred(text, decode) = &newer[0].decoded else {
            panic!("{:?}", newer[0])
        };
        let Ok(Object::Service(s)) = decode(text) else {
            panic!("undecodable")
        };
        assert_eq!(s.metadata.resource_version.as_deref(), Some("8"));
        assert_eq!(s.metadata.managed_fields, None);
    }

    #[test]
    fn metadata_is_read_up_to_its_end_only() {
        let m = LenientMeta::read(
            r#"{"kind":"Service","metadata":{"name":"a","namespace":"b","resourceVersion":"3","labels":{"x":"y"}},"spec":{"ports":[{"port":"not a number"}]},"#,
        );
        assert_eq!(
            (
                m.name.as_deref(),
                m.namespace.as_deref(),
                m.resource_version.as_deref()
            ),
            (Some("a"), Some("b"), Some("3"))
        );
        // Metadata after the rest (the fake server's sorted keys for some kinds) is found too.
        let m = LenientMeta::read(
            r#"{"endpoints":[{"addresses":["10.0.0.1"]}],"metadata":{"name":"c"}}"#,
        );
        assert_eq!(m.name.as_deref(), Some("c"));
        assert_eq!(LenientMeta::read("[1]").name, None);
    }

    #[test]
    fn an_undecodable_object_is_named_and_does_not_fail_its_page() {
        let bad = r#"{"metadata":{"name":"bad","namespace":"shop"},"spec":{"ports":[{"port":"eighty"}]}}"#;
        let list: Vec<Received<Service>> = serde_json::from_str(&format!("[{SVC},{bad}]")).unwrap();
        assert!(matches!(list[0].decoded, Decoded::Object(_)));
        assert_eq!(list[1].meta.name.as_deref(), Some("bad"));
        let Decoded::Invalid(err) = &list[1].decoded else {
            panic!("{:?}", list[1].decoded)
        };
        assert!(err.starts_with("spec.ports[0].port: invalid type"), "{err}");
    }
}
