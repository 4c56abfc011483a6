//! The cluster as kxdp knows it: the Kubernetes objects it reads, keyed by namespace/name in
//! ordered maps so that every walk over them (and so every translation) is deterministic.
//!
//! Sources (files now, the API server later) feed a `ClusterState`; `translate` reads it.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{NetworkPolicy, ServiceCIDR};

/// `namespace/name`; cluster-scoped objects have an empty namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn cluster(name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: String::new(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// One object of a kind kxdp uses.
#[derive(Clone, Debug)]
pub enum Object {
    Node(Box<Node>),
    Namespace(Box<Namespace>),
    Pod(Box<Pod>),
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    NetworkPolicy(Box<NetworkPolicy>),
    ServiceCidr(Box<ServiceCIDR>),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Node(_) => "Node",
            Object::Namespace(_) => "Namespace",
            Object::Pod(_) => "Pod",
            Object::Service(_) => "Service",
            Object::EndpointSlice(_) => "EndpointSlice",
            Object::NetworkPolicy(_) => "NetworkPolicy",
            Object::ServiceCidr(_) => "ServiceCIDR",
        }
    }

    /// The object's key (namespace empty for cluster-scoped kinds).
    pub fn key(&self) -> ObjectKey {
        let meta = match self {
            Object::Node(o) => &o.metadata,
            Object::Namespace(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::NetworkPolicy(o) => &o.metadata,
            Object::ServiceCidr(o) => &o.metadata,
        };
        ObjectKey::new(
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

/// Every object kxdp reads. An object with the key of one already held replaces it (as a watch
/// update would).
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub nodes: BTreeMap<String, Node>,
    pub namespaces: BTreeMap<String, Namespace>,
    pub pods: BTreeMap<ObjectKey, Pod>,
    pub services: BTreeMap<ObjectKey, Service>,
    pub endpoint_slices: BTreeMap<ObjectKey, EndpointSlice>,
    pub network_policies: BTreeMap<ObjectKey, NetworkPolicy>,
    pub service_cidrs: BTreeMap<String, ServiceCIDR>,
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces an object; returns true when one with the same key was replaced.
    pub fn apply(&mut self, obj: Object) -> bool {
        let key = obj.key();
        match obj {
            Object::Node(o) => self.nodes.insert(key.name, *o).is_some(),
            Object::Namespace(o) => self.namespaces.insert(key.name, *o).is_some(),
            Object::Pod(o) => self.pods.insert(key, *o).is_some(),
            Object::Service(o) => self.services.insert(key, *o).is_some(),
            Object::EndpointSlice(o) => self.endpoint_slices.insert(key, *o).is_some(),
            Object::NetworkPolicy(o) => self.network_policies.insert(key, *o).is_some(),
            Object::ServiceCidr(o) => self.service_cidrs.insert(key.name, *o).is_some(),
        }
    }

    /// Removes the object of that kind and key; returns whether it was there.
    pub fn delete(&mut self, kind: &str, key: &ObjectKey) -> bool {
        match kind {
            "Node" => self.nodes.remove(&key.name).is_some(),
            "Namespace" => self.namespaces.remove(&key.name).is_some(),
            "Pod" => self.pods.remove(key).is_some(),
            "Service" => self.services.remove(key).is_some(),
            "EndpointSlice" => self.endpoint_slices.remove(key).is_some(),
            "NetworkPolicy" => self.network_policies.remove(key).is_some(),
            "ServiceCIDR" => self.service_cidrs.remove(&key.name).is_some(),
            _ => false,
        }
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
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The EndpointSlices of a Service: same namespace, label `kubernetes.io/service-name` equal
    /// to its name; in slice-name order.
    pub fn slices_of<'a>(
        &'a self,
        service: &'a ObjectKey,
    ) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.endpoint_slices
            .range(ObjectKey::new(service.namespace.clone(), String::new())..)
            .take_while(move |(k, _)| k.namespace == service.namespace)
            .filter(move |(_, s)| service_name_of(s) == Some(service.name.as_str()))
            .map(|(_, s)| s)
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
        assert!(st.apply(slice("a", "s1", "web")));
        assert_eq!(st.len(), 1);
        assert!(st.delete("EndpointSlice", &ObjectKey::new("a", "s1")));
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
    fn key_display() {
        assert_eq!(ObjectKey::new("ns", "n").to_string(), "ns/n");
        assert_eq!(ObjectKey::cluster("node-a").to_string(), "node-a");
    }
}
