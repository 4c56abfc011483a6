//! The cluster as kxdp knows it: the Kubernetes objects it reads, keyed by namespace/name in
//! ordered maps so that every walk over them (and so every translation) is deterministic.
//!
//! Sources (`--state` files, the API server) feed a `ClusterState`; `translate` reads it. The
//! kinds are a typed `Kind`; adding, replacing and deleting go through one path for every kind
//! (`apply`, `delete`), which also keeps the EndpointSlice index by Service up to date, so that a
//! Service's slices are found without scanning its namespace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

mod object_key;
mod pod;

pub use object_key::ObjectKey;

pub use pod::{
    Labels, NamedPort, NamedPorts, NodeName, PodInterner, PodIps, PodKey, PodPhase, PodRecord,
    PodStore,
};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{NetworkPolicy, ServiceCIDR};

pub mod cluster_network_policy;
pub use cluster_network_policy::ClusterNetworkPolicy;

/// A kind of object kxdp reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    Namespace,
    Pod,
    Service,
    EndpointSlice,
    NetworkPolicy,
    ServiceCidr,
    ClusterNetworkPolicy,
}

impl Kind {
    /// Every kind, in the order a whole state is handed over (nodes and ranges first).
    pub const ALL: [Kind; 8] = [
        Kind::Node,
        Kind::Namespace,
        Kind::Pod,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::NetworkPolicy,
        Kind::ServiceCidr,
        Kind::ClusterNetworkPolicy,
    ];

    /// The Kubernetes `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::ServiceCidr => "ServiceCIDR",
            Kind::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        }
    }

    /// Cluster-scoped kinds are held by name alone.
    pub fn cluster_scoped(self) -> bool {
        matches!(
            self,
            Kind::Node | Kind::Namespace | Kind::ServiceCidr | Kind::ClusterNetworkPolicy
        )
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One object of a kind kxdp uses.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Node(Box<Node>),
    Namespace(Box<Namespace>),
    Pod(Box<Pod>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    NetworkPolicy(Box<NetworkPolicy>),
    ServiceCidr(Box<ServiceCIDR>),
    ClusterNetworkPolicy(Box<ClusterNetworkPolicy>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Node(_) => Kind::Node,
            Object::Namespace(_) => Kind::Namespace,
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::NetworkPolicy(_) => Kind::NetworkPolicy,
            Object::ServiceCidr(_) => Kind::ServiceCidr,
            Object::ClusterNetworkPolicy(_) => Kind::ClusterNetworkPolicy,
        }
    }

    pub fn metadata(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Object::Node(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::NetworkPolicy(o) => &o.metadata,
            Object::ServiceCidr(o) => &o.metadata,
            Object::ClusterNetworkPolicy(o) => &o.metadata,
        }
    }

    /// The object's key (namespace empty for cluster-scoped kinds).
    pub fn key(&self) -> ObjectKey {
        let meta = self.metadata();
        ObjectKey::new(
            if self.kind().cluster_scoped() {
                String::new()
            } else {
                meta.namespace.clone().unwrap_or_default()
            },
            meta.name.clone().unwrap_or_default(),
        )
    }
}

/// Every object kxdp reads. An object with the key of one already held replaces it (as a watch
/// update would).
///
/// The maps are public for reading; every change goes through `apply` / `delete` (or
/// `take_kind`), which keep the EndpointSlice index by Service in step.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub nodes: BTreeMap<String, Node>,
    pub namespaces: BTreeMap<String, Namespace>,
    /// Pods as [`PodRecord`]s: only what kxdp reads (converted by `apply`/`put`), by namespace
    /// then name.
    pub pods: PodStore,
    pub services: BTreeMap<ObjectKey, Service>,
    pub endpoint_slices: BTreeMap<ObjectKey, EndpointSlice>,
    pub network_policies: BTreeMap<ObjectKey, NetworkPolicy>,
    pub service_cidrs: BTreeMap<String, ServiceCIDR>,
    /// ClusterNetworkPolicies by name.
    pub cluster_network_policies: BTreeMap<String, ClusterNetworkPolicy>,
    /// Service (namespace/name) → the names of its EndpointSlices (label
    /// `kubernetes.io/service-name`). Without it finding a Service's slices meant scanning its
    /// namespace: quadratic at thousands of Services in one namespace.
    slices_by_service: HashMap<ObjectKey, BTreeSet<String>>,
    /// The values pods share (label sets, node names, port lists), held once (boxed: the
    /// state travels by value in `sources::event::Update`).
    pod_values: Box<PodInterner>,
}

/// A map of one kind, keyed by name (cluster-scoped) or namespace/name.
trait Table {
    type Obj: PartialEq;
    fn put(&mut self, key: &ObjectKey, o: Self::Obj) -> Option<Self::Obj>;
    fn take(&mut self, key: &ObjectKey) -> Option<Self::Obj>;
    fn find(&self, key: &ObjectKey) -> Option<&Self::Obj>;
    fn keys_vec(&self) -> Vec<ObjectKey>;
    fn drain(&mut self) -> Vec<Self::Obj>;
}

impl<T: PartialEq> Table for BTreeMap<String, T> {
    type Obj = T;
    fn put(&mut self, key: &ObjectKey, o: T) -> Option<T> {
        self.insert(key.name.clone(), o)
    }
    fn take(&mut self, key: &ObjectKey) -> Option<T> {
        self.remove(&key.name)
    }
    fn find(&self, key: &ObjectKey) -> Option<&T> {
        self.get(&key.name)
    }
    fn keys_vec(&self) -> Vec<ObjectKey> {
        self.keys().map(ObjectKey::cluster).collect()
    }
    fn drain(&mut self) -> Vec<T> {
        std::mem::take(self).into_values().collect()
    }
}

impl<T: PartialEq> Table for BTreeMap<ObjectKey, T> {
    type Obj = T;
    fn put(&mut self, key: &ObjectKey, o: T) -> Option<T> {
        self.insert(key.clone(), o)
    }
    fn take(&mut self, key: &ObjectKey) -> Option<T> {
        self.remove(key)
    }
    fn find(&self, key: &ObjectKey) -> Option<&T> {
        self.get(key)
    }
    fn keys_vec(&self) -> Vec<ObjectKey> {
        self.keys().cloned().collect()
    }
    fn drain(&mut self) -> Vec<T> {
        std::mem::take(self).into_values().collect()
    }
}

/// Runs `$body` with `$t` bound to the map of `$kind` and `$wrap` to the `Object` variant.
macro_rules! with_table {
    ($state:expr, $kind:expr, |$t:ident, $wrap:ident| $body:expr) => {
        match $kind {
            Kind::Node => {
                let ($t, $wrap) = (&mut $state.nodes, Object::Node);
                $body
            }
            Kind::Namespace => {
                let ($t, $wrap) = (&mut $state.namespaces, Object::Namespace);
                $body
            }
            Kind::Pod => unreachable!("Pods are handled before (records)"),
            Kind::Service => {
                let ($t, $wrap) = (&mut $state.services, Object::Service);
                $body
            }
            Kind::EndpointSlice => {
                let ($t, $wrap) = (&mut $state.endpoint_slices, Object::EndpointSlice);
                $body
            }
            Kind::NetworkPolicy => {
                let ($t, $wrap) = (&mut $state.network_policies, Object::NetworkPolicy);
                $body
            }
            Kind::ServiceCidr => {
                let ($t, $wrap) = (&mut $state.service_cidrs, Object::ServiceCidr);
                $body
            }
            Kind::ClusterNetworkPolicy => {
                let ($t, $wrap) = (
                    &mut $state.cluster_network_policies,
                    Object::ClusterNetworkPolicy,
                );
                $body
            }
        }
    };
}

/// Runs `$body` with `$o` bound to the boxed object inside `$obj` and `$t` to its map.
macro_rules! with_object {
    ($state:expr, $obj:expr, |$o:ident, $t:ident, $wrap:ident| $body:expr) => {
        match $obj {
            Object::Node($o) => {
                let ($t, $wrap) = (&mut $state.nodes, Object::Node);
                $body
            }
            Object::Namespace($o) => {
                let ($t, $wrap) = (&mut $state.namespaces, Object::Namespace);
                $body
            }
            Object::Pod(_) => unreachable!("Pods are handled before (records)"),
            Object::Service($o) => {
                let ($t, $wrap) = (&mut $state.services, Object::Service);
                $body
            }
            Object::EndpointSlice($o) => {
                let ($t, $wrap) = (&mut $state.endpoint_slices, Object::EndpointSlice);
                $body
            }
            Object::NetworkPolicy($o) => {
                let ($t, $wrap) = (&mut $state.network_policies, Object::NetworkPolicy);
                $body
            }
            Object::ServiceCidr($o) => {
                let ($t, $wrap) = (&mut $state.service_cidrs, Object::ServiceCidr);
                $body
            }
            Object::ClusterNetworkPolicy($o) => {
                let ($t, $wrap) = (
                    &mut $state.cluster_network_policies,
                    Object::ClusterNetworkPolicy,
                );
                $body
            }
        }
    };
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces an object; returns true when one with the same key was replaced.
    pub fn apply(&mut self, obj: Object) -> bool {
        self.put(obj).is_some()
    }

    /// Inserts or replaces an object; returns the one it replaced.
    pub fn put(&mut self, obj: Object) -> Option<Object> {
        let key = obj.key();
        if let Object::Pod(p) = &obj {
            let record = self.pod_values.record(p);
            return self
                .pods
                .insert(&key, record)
                .map(|old| Object::Pod(Box::new(old.to_pod(&key))));
        }
        if let Object::EndpointSlice(s) = &obj {
            self.index_slice(&key, s);
        }
        let old = with_object!(self, obj, |o, t, wrap| t
            .put(&key, *o)
            .map(|x| wrap(Box::new(x))));
        if let Some(Object::EndpointSlice(s)) = &old {
            if service_name_of(s) != self.endpoint_slices.get(&key).and_then(service_name_of) {
                self.unindex_slice(&key, s);
            }
        }
        old
    }

    /// Whether an object equal to `obj` is held (a relist or resync repeating it).
    pub fn holds(&self, obj: &Object) -> bool {
        let key = obj.key();
        match obj {
            Object::Node(o) => self.nodes.find(&key) == Some(&**o),
            Object::Namespace(o) => self.namespaces.find(&key) == Some(&**o),
            Object::Pod(o) => self.pods.get(&key) == Some(&PodRecord::of(o)),
            Object::Service(o) => self.services.find(&key) == Some(&**o),
            Object::EndpointSlice(o) => self.endpoint_slices.find(&key) == Some(&**o),
            Object::NetworkPolicy(o) => self.network_policies.find(&key) == Some(&**o),
            Object::ServiceCidr(o) => self.service_cidrs.find(&key) == Some(&**o),
            Object::ClusterNetworkPolicy(o) => {
                self.cluster_network_policies.find(&key) == Some(&**o)
            }
        }
    }

    /// Removes the object of that kind and key; returns it.
    pub fn delete(&mut self, kind: Kind, key: &ObjectKey) -> Option<Object> {
        if kind == Kind::Pod {
            return self
                .pods
                .remove(key)
                .map(|old| Object::Pod(Box::new(old.to_pod(key))));
        }
        let old = with_table!(self, kind, |t, wrap| t.take(key).map(|x| wrap(Box::new(x))));
        if let Some(Object::EndpointSlice(s)) = &old {
            self.unindex_slice(key, s);
        }
        old
    }

    /// Whether an object of that kind and key is held.
    pub fn contains(&self, kind: Kind, key: &ObjectKey) -> bool {
        match kind {
            Kind::Node => self.nodes.find(key).is_some(),
            Kind::Namespace => self.namespaces.find(key).is_some(),
            Kind::Pod => self.pods.contains_key(key),
            Kind::Service => self.services.find(key).is_some(),
            Kind::EndpointSlice => self.endpoint_slices.find(key).is_some(),
            Kind::NetworkPolicy => self.network_policies.find(key).is_some(),
            Kind::ServiceCidr => self.service_cidrs.find(key).is_some(),
            Kind::ClusterNetworkPolicy => self.cluster_network_policies.find(key).is_some(),
        }
    }

    /// How many objects of a kind are held.
    pub fn keys_len(&self, kind: Kind) -> usize {
        match kind {
            Kind::Node => self.nodes.len(),
            Kind::Namespace => self.namespaces.len(),
            Kind::Pod => self.pods.len(),
            Kind::Service => self.services.len(),
            Kind::EndpointSlice => self.endpoint_slices.len(),
            Kind::NetworkPolicy => self.network_policies.len(),
            Kind::ServiceCidr => self.service_cidrs.len(),
            Kind::ClusterNetworkPolicy => self.cluster_network_policies.len(),
        }
    }

    /// The keys of every object of a kind, in order.
    pub fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        match kind {
            Kind::Node => self.nodes.keys_vec(),
            Kind::Namespace => self.namespaces.keys_vec(),
            Kind::Pod => self.pods.keys().map(PodKey::to_key).collect(),
            Kind::Service => self.services.keys_vec(),
            Kind::EndpointSlice => self.endpoint_slices.keys_vec(),
            Kind::NetworkPolicy => self.network_policies.keys_vec(),
            Kind::ServiceCidr => self.service_cidrs.keys_vec(),
            Kind::ClusterNetworkPolicy => self.cluster_network_policies.keys_vec(),
        }
    }

    /// Takes every object of a kind out of the state.
    pub fn take_kind(&mut self, kind: Kind) -> Vec<Object> {
        if kind == Kind::EndpointSlice {
            self.slices_by_service.clear();
        }
        if kind == Kind::Pod {
            return self
                .pods
                .drain()
                .into_iter()
                .map(|(k, p)| Object::Pod(Box::new(p.to_pod(&k))))
                .collect();
        }
        with_table!(self, kind, |t, wrap| t
            .drain()
            .into_iter()
            .map(|x| wrap(Box::new(x)))
            .collect())
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.nodes.len()
            + self.namespaces.len()
            + self.pods.len()
            + self.services.len()
            + self.endpoint_slices.len()
            + self.network_policies.len()
            + self.service_cidrs.len()
            + self.cluster_network_policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The EndpointSlices of a Service: same namespace, label `kubernetes.io/service-name` equal
    /// to its name; in slice-name order. Costs the Service's slices, not its namespace's.
    pub fn slices_of<'a>(
        &'a self,
        service: &'a ObjectKey,
    ) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.slices_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                // One lookup per slice; the key is rebuilt because the map is keyed by owned
                // namespace/name pairs.
                self.endpoint_slices
                    .get(&ObjectKey::new(service.namespace.clone(), name.clone()))
            })
    }

    fn index_slice(&mut self, key: &ObjectKey, s: &EndpointSlice) {
        if let Some(svc) = service_name_of(s) {
            let names = self
                .slices_by_service
                .entry(ObjectKey::new(key.namespace.clone(), svc))
                .or_default();
            if !names.contains(&key.name) {
                names.insert(key.name.clone());
            }
        }
    }

    fn unindex_slice(&mut self, key: &ObjectKey, s: &EndpointSlice) {
        let Some(svc) = service_name_of(s) else {
            return;
        };
        let svc = ObjectKey::new(key.namespace.clone(), svc);
        if let Some(names) = self.slices_by_service.get_mut(&svc) {
            names.remove(&key.name);
            if names.is_empty() {
                self.slices_by_service.remove(&svc);
            }
        }
    }
}

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label).
pub fn service_name_of(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(ns: &str, name: &str, svc: &str) -> Object {
        Object::EndpointSlice(Box::new(EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some([(LABEL_SERVICE_NAME.to_string(), svc.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }

    #[test]
    fn apply_replace_delete() {
        let mut st = ClusterState::new();
        assert!(!st.apply(slice("a", "s1", "web")));
        assert!(st.put(slice("a", "s1", "web")).is_some());
        assert_eq!(st.len(), 1);
        assert!(st
            .delete(Kind::EndpointSlice, &ObjectKey::new("a", "s1"))
            .is_some());
        assert_eq!(st.slices_of(&ObjectKey::new("a", "web")).count(), 0);
        assert!(st.is_empty());
    }

    #[test]
    fn slices_of_service() {
        let mut st = ClusterState::new();
        for o in [
            slice("a", "web-2", "web"),
            slice("a", "web-1", "web"),
            slice("a", "db-1", "db"),
            slice("b", "web-1", "web"),
            slice("aa", "web-1", "web"),
        ] {
            st.apply(o);
        }
        let names: Vec<_> = st
            .slices_of(&ObjectKey::new("a", "web"))
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, vec!["web-1", "web-2"]);
    }

    #[test]
    fn slice_index_follows_label_changes_and_deletes() {
        let mut st = ClusterState::new();
        st.apply(slice("a", "s1", "web"));
        st.apply(slice("a", "s2", "web"));
        // Relabelled: it moves from web to db.
        st.apply(slice("a", "s1", "db"));
        let names = |st: &ClusterState, svc: &str| -> Vec<String> {
            st.slices_of(&ObjectKey::new("a", svc))
                .map(|s| s.metadata.name.clone().unwrap())
                .collect()
        };
        assert_eq!(names(&st, "web"), vec!["s2"]);
        assert_eq!(names(&st, "db"), vec!["s1"]);
        st.delete(Kind::EndpointSlice, &ObjectKey::new("a", "s2"));
        assert!(names(&st, "web").is_empty());
        let taken = st.take_kind(Kind::EndpointSlice);
        assert_eq!(taken.len(), 1);
        assert!(names(&st, "db").is_empty());
        assert!(st.slices_by_service.is_empty());
    }

    #[test]
    fn cluster_scoped_keys_ignore_namespace() {
        let node = Object::Node(Box::new(Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                namespace: Some("stray".into()),
                ..Default::default()
            },
            ..Default::default()
        }));
        assert_eq!(node.key(), ObjectKey::cluster("n1"));
        let mut st = ClusterState::new();
        st.apply(node.clone());
        assert!(st.holds(&node));
        assert!(st.contains(Kind::Node, &ObjectKey::cluster("n1")));
        assert_eq!(st.keys(Kind::Node), vec![ObjectKey::cluster("n1")]);
    }

    #[test]
    fn key_display() {
        assert_eq!(ObjectKey::new("ns", "n").to_string(), "ns/n");
        assert_eq!(ObjectKey::cluster("node-a").to_string(), "node-a");
    }
}
