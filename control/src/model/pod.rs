//! The Pod as the store keeps it: only what kxdp reads, converted where Pods enter the store.
//!
//! Pods are the bulk of a large cluster's objects (150k at 5,000 nodes) and kxdp reads little
//! of them: NetworkPolicy needs every running pod's labels and addresses (peers), its node and
//! hostNetwork (which pods are local, which are the node), whether it has finished (a finished
//! pod's addresses may already be another's) and its named container ports. A k8s-openapi `Pod`
//! holding just that still costs about 7 KB (every optional field of spec and status), so the
//! store converts each Pod to a [`PodRecord`] and label sets, node names and port lists, which
//! the pods of one workload share, are held once ([`PodInterner`]).

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::object_key::ObjectKey;
use kxdp_packet::IpProto;

/// A label set (shared by the pods that have it).
pub type Labels = Arc<BTreeMap<String, String>>;

/// A named container port: (name, IP protocol number, port).
pub type NamedPort = (String, IpProto, u16);

/// A node name (shared by the node's pods; a thin pointer: the record is kept small).
pub type NodeName = Arc<String>;

/// A pod's named container ports (shared by the pods of a workload; a thin pointer).
pub type NamedPorts = Arc<Vec<NamedPort>>;

/// `status.phase`. Pods without one (or with an unknown one) are `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    #[default]
    Unknown,
}

impl PodPhase {
    fn parse(s: Option<&str>) -> PodPhase {
        match s {
            Some("Pending") => PodPhase::Pending,
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            _ => PodPhase::Unknown,
        }
    }

    fn as_str(self) -> Option<&'static str> {
        match self {
            PodPhase::Pending => Some("Pending"),
            PodPhase::Running => Some("Running"),
            PodPhase::Succeeded => Some("Succeeded"),
            PodPhase::Failed => Some("Failed"),
            PodPhase::Unknown => None,
        }
    }
}

/// A pod's addresses: one (the common case) held inline, more (dual-stack) on the heap.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum PodIps {
    #[default]
    None,
    One(IpAddr),
    Many(Box<[IpAddr]>),
}

impl std::ops::Deref for PodIps {
    type Target = [IpAddr];
    fn deref(&self) -> &[IpAddr] {
        match self {
            PodIps::None => &[],
            PodIps::One(a) => std::slice::from_ref(a),
            PodIps::Many(v) => v,
        }
    }
}

impl From<Vec<IpAddr>> for PodIps {
    fn from(v: Vec<IpAddr>) -> PodIps {
        match v.len() {
            0 => PodIps::None,
            1 => PodIps::One(v[0]),
            _ => PodIps::Many(v.into_boxed_slice()),
        }
    }
}

/// What kxdp reads of a Pod (its namespace and name are the store's key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub labels: Labels,
    /// `spec.nodeName` ("" when not scheduled).
    pub node: NodeName,
    /// `status.podIPs` then `status.podIP`, parsed, without repeats; unparsable ones left out.
    pub ips: PodIps,
    /// Named container ports of `containers` and `initContainers` with a protocol kxdp knows
    /// (TCP, UDP, SCTP), sorted, without repeats.
    pub ports: NamedPorts,
    pub host_network: bool,
    pub phase: PodPhase,
}

impl PodRecord {
    /// The record of `pod`, sharing nothing (`PodInterner::record` shares what pods repeat).
    pub fn of(pod: &Pod) -> PodRecord {
        PodInterner::default().record(pod)
    }

    /// Finished pods (phase Succeeded or Failed) are nobody: docs/policy.md.
    pub fn finished(&self) -> bool {
        matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }

    /// A Pod with what the record holds (what the store hands back when an object leaves it);
    /// converted again it gives an equal record.
    pub fn to_pod(&self, key: &ObjectKey) -> Pod {
        let ports: Vec<ContainerPort> = self
            .ports
            .iter()
            .map(|(name, proto, num)| ContainerPort {
                name: Some(name.clone()),
                protocol: Some(proto.name().unwrap_or("other").to_string()),
                container_port: i32::from(*num),
                ..Default::default()
            })
            .collect();
        let ips: Vec<PodIP> = self
            .ips
            .iter()
            .map(|ip| PodIP { ip: ip.to_string() })
            .collect();
        Pod {
            metadata: ObjectMeta {
                namespace: Some(key.namespace.clone()),
                name: Some(key.name.clone()),
                labels: (!self.labels.is_empty()).then(|| (*self.labels).clone()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: (!self.node.is_empty()).then(|| self.node.to_string()),
                host_network: self.host_network.then_some(true),
                containers: vec![Container {
                    name: "c".into(),
                    ports: (!ports.is_empty()).then_some(ports),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: self.phase.as_str().map(str::to_string),
                pod_ip: ips.first().map(|p| p.ip.clone()),
                pod_ips: (!ips.is_empty()).then_some(ips),
                ..Default::default()
            }),
        }
    }
}

/// One shared copy of each value pods repeat (label sets, node names, port lists). Values no
/// pod holds any more are dropped from time to time (when the set has doubled since).
#[derive(Clone, Debug, Default)]
pub struct PodInterner {
    labels: Shared<BTreeMap<String, String>>,
    nodes: Shared<String>,
    ports: Shared<Vec<NamedPort>>,
}

#[derive(Debug)]
struct Shared<T: ?Sized> {
    set: HashSet<Arc<T>>,
    /// The set's size after the last purge.
    kept: usize,
}

impl<T: ?Sized> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared {
            set: self.set.clone(),
            kept: self.kept,
        }
    }
}

impl<T: ?Sized> Default for Shared<T> {
    fn default() -> Self {
        Shared {
            set: HashSet::new(),
            kept: 0,
        }
    }
}

impl<T: ?Sized + Hash + Eq> Shared<T> {
    fn get(&mut self, v: &T, make: impl FnOnce(&T) -> Arc<T>) -> Arc<T> {
        if let Some(a) = self.set.get(v) {
            return a.clone();
        }
        if self.set.len() >= 2 * self.kept + 64 {
            self.set.retain(|a| Arc::strong_count(a) > 1);
            self.kept = self.set.len();
        }
        let a = make(v);
        self.set.insert(a.clone());
        a
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl PodInterner {
    /// The record of `pod`.
    pub fn record(&mut self, pod: &Pod) -> PodRecord {
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> = Vec::new();
        if let Some(s) = status {
            let listed = s.pod_ips.iter().flatten().map(|p| p.ip.as_str());
            for t in listed.chain(s.pod_ip.as_deref()) {
                if let Ok(ip) = t.trim().parse::<IpAddr>() {
                    if !ips.contains(&ip) {
                        ips.push(ip);
                    }
                }
            }
        }
        let spec = pod.spec.as_ref();
        let mut ports: Vec<NamedPort> = Vec::new();
        if let Some(spec) = spec {
            for c in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                for p in c.ports.iter().flatten() {
                    let (Some(name), Some(proto), Ok(num)) = (
                        p.name.as_deref().filter(|n| !n.is_empty()),
                        IpProto::from_port_protocol(p.protocol.as_deref().unwrap_or("TCP")),
                        u16::try_from(p.container_port),
                    ) else {
                        continue;
                    };
                    ports.push((name.to_string(), proto, num));
                }
            }
        }
        ports.sort();
        ports.dedup();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        let node = spec.and_then(|s| s.node_name.as_deref()).unwrap_or("");
        PodRecord {
            labels: self.labels.get(labels, |l| Arc::new(l.clone())),
            // (A `String` to look up: `Arc<String>` borrows as `String`, not `str`.)
            node: self.nodes.get(&node.to_string(), |n| Arc::new(n.clone())),
            ips: ips.into(),
            ports: self.ports.get(&ports, |p| Arc::new(p.clone())),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            phase: PodPhase::parse(status.and_then(|s| s.phase.as_deref())),
        }
    }
}

/// A pod's namespace and name, as the store holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

impl PodKey<'_> {
    pub fn to_key(self) -> ObjectKey {
        ObjectKey::new(self.namespace, self.name)
    }
}

impl std::fmt::Display for PodKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Pods, by namespace then name, in key order (as a `BTreeMap<ObjectKey, PodRecord>`
/// would iterate). Each namespace is held once rather than once per pod and names are
/// `Box<str>`: at 150k pods the map entries are most of the store, and an `ObjectKey` (two
/// `String`s, 48 bytes and two heap strings) per pod made the store three times the size of
/// what it keeps (docs/benchmarks.md, "Control plane at cluster scale").
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodStore {
    by_ns: BTreeMap<Box<str>, BTreeMap<Box<str>, PodRecord>>,
    len: usize,
}

impl PodStore {
    pub fn get(&self, key: &ObjectKey) -> Option<&PodRecord> {
        self.by_ns
            .get(key.namespace.as_str())?
            .get(key.name.as_str())
    }

    pub fn contains_key(&self, key: &ObjectKey) -> bool {
        self.get(key).is_some()
    }

    /// Inserts or replaces the pod; returns the record it replaced.
    pub fn insert(&mut self, key: &ObjectKey, pod: PodRecord) -> Option<PodRecord> {
        let pods = match self.by_ns.get_mut(key.namespace.as_str()) {
            Some(p) => p,
            None => self.by_ns.entry(key.namespace.as_str().into()).or_default(),
        };
        let old = match pods.get_mut(key.name.as_str()) {
            Some(p) => Some(std::mem::replace(p, pod)),
            None => pods.insert(key.name.as_str().into(), pod),
        };
        self.len += old.is_none() as usize;
        old
    }

    pub fn remove(&mut self, key: &ObjectKey) -> Option<PodRecord> {
        let pods = self.by_ns.get_mut(key.namespace.as_str())?;
        let old = pods.remove(key.name.as_str())?;
        if pods.is_empty() {
            self.by_ns.remove(key.namespace.as_str());
        }
        self.len -= 1;
        Some(old)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every pod, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (PodKey<'_>, &PodRecord)> + '_ {
        self.by_ns.iter().flat_map(|(ns, pods)| {
            pods.iter().map(move |(name, p)| {
                (
                    PodKey {
                        namespace: ns,
                        name,
                    },
                    p,
                )
            })
        })
    }

    pub fn keys(&self) -> impl Iterator<Item = PodKey<'_>> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The namespaces with pods, in order.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_ns.keys().map(|n| &**n)
    }

    /// Takes every pod out.
    pub fn drain(&mut self) -> Vec<(ObjectKey, PodRecord)> {
        self.len = 0;
        std::mem::take(&mut self.by_ns)
            .into_iter()
            .flat_map(|(ns, pods)| {
                pods.into_iter()
                    .map(move |(name, p)| (ObjectKey::new(&*ns, &*name), p))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn record_keeps_what_policy_reads_and_round_trips() {
        let p = pod(serde_json::json!({
            "metadata": {"namespace": "a", "name": "p", "labels": {"app": "web"},
                         "annotations": {"big": "x"}},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "c", "image": "i", "ports": [
                    {"name": "http", "containerPort": 8080},
                    {"containerPort": 9000},
                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                    {"name": "x", "containerPort": 1, "protocol": "ICMP"}]}],
                     "initContainers": [{"name": "i", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}, {"ip": "bad"}]}
        }));
        let r = PodRecord::of(&p);
        assert_eq!(r.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(&*r.node, "n1");
        assert_eq!(
            &*r.ips,
            &[
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert_eq!(
            &*r.ports,
            &[
                ("dns".to_string(), IpProto::UDP, 53),
                ("http".to_string(), IpProto::TCP, 8080)
            ]
        );
        assert!(!r.host_network && !r.finished());
        let back = r.to_pod(&ObjectKey::new("a", "p"));
        assert_eq!(PodRecord::of(&back), r);
        let done =
            pod(serde_json::json!({"metadata": {"name": "q"}, "status": {"phase": "Failed"}}));
        assert!(PodRecord::of(&done).finished());
        assert_eq!(
            PodRecord::of(&PodRecord::of(&done).to_pod(&ObjectKey::new("a", "q"))),
            PodRecord::of(&done)
        );
    }

    /// The store's pods in key order, whatever the order of inserts; replace, remove, drain.
    #[test]
    fn store_keeps_key_order_and_counts() {
        let mut st = PodStore::default();
        let r = |app: &str| {
            PodRecord::of(&pod(
                serde_json::json!({"metadata": {"name": "p", "labels": {"app": app}}}),
            ))
        };
        for (ns, name) in [("b", "x"), ("a-b", "y"), ("a", "z"), ("a", "a"), ("b", "a")] {
            assert!(st.insert(&ObjectKey::new(ns, name), r("one")).is_none());
        }
        assert_eq!(st.len(), 5);
        let keys: Vec<String> = st.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["a/a", "a/z", "a-b/y", "b/a", "b/x"]);
        let old = st.insert(&ObjectKey::new("a", "z"), r("two")).unwrap();
        assert_eq!(old, r("one"));
        assert_eq!(st.len(), 5);
        assert_eq!(st.get(&ObjectKey::new("a", "z")), Some(&r("two")));
        assert_eq!(st.remove(&ObjectKey::new("a-b", "y")), Some(r("one")));
        assert!(st.remove(&ObjectKey::new("a-b", "y")).is_none());
        assert_eq!(st.namespaces().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(st.drain().len(), 4);
        assert!(st.is_empty() && st.iter().next().is_none());
        // The record is what the store holds per pod, beside its name: keep it small.
        assert!(std::mem::size_of::<PodRecord>() <= 56);
    }

    #[test]
    fn interner_shares_repeated_values_and_forgets_unused_ones() {
        let mut ix = PodInterner::default();
        let p = |app: &str| {
            pod(
                serde_json::json!({"metadata": {"name": "p", "labels": {"app": app}},
                                   "spec": {"nodeName": "n1", "containers": []}}),
            )
        };
        let a = ix.record(&p("web"));
        let b = ix.record(&p("web"));
        assert!(Arc::ptr_eq(&a.labels, &b.labels) && Arc::ptr_eq(&a.node, &b.node));
        drop((a, b));
        for i in 0..1000 {
            let _ = ix.record(&p(&format!("app-{i}")));
        }
        // Only values still held (none) survive a purge; the set never holds more than about
        // twice the live values plus the slack.
        assert!(ix.labels.set.len() <= 64 + 1, "{}", ix.labels.set.len());
    }
}
