//! NetworkPolicy compilation: NetworkPolicies + Pods + Namespaces → the dataplane's
//! [`PolicyTables`] (per local pod and direction, one [`DirRules`]). Pure, unit-tested without a
//! cluster. Semantics and choices: `docs/policy.md`.
//!
//! The steps:
//!
//! 1. Every policy is parsed and validated (`spec`); what kxdp cannot enforce is a [`Problem`].
//! 2. Peer pods are grouped by (namespace, label set): a selector is evaluated once per group,
//!    not once per pod, and each (namespace scope, selector) pair once per compilation.
//! 3. Each policy direction becomes contributions: address ranges (pods as single addresses,
//!    ipBlocks minus their excepts, "every peer" as the whole line) with port entries, plus, for
//!    ingress, named ports still to resolve against the selected pod. Egress named ports are
//!    resolved here, against the peer pods' container ports. Each direction gets a fingerprint.
//! 4. Each local pod's directions are keyed by the fingerprints of the policies that select it
//!    (and, for ingress with named ports, its own container ports). A key already compiled, by
//!    this compilation or the previous one ([`PolicyCompiler`] keeps them), is reused; only new
//!    keys are built. Pods with the same key share one `Arc<DirRules>`.
//! 5. Each ClusterNetworkPolicy direction is one table ([`ClusterTable`]), built once per
//!    distinct content (and, for ingress named ports, the selected pod's ports) and shared by the
//!    pods it selects; a pod's tier lists the selecting policies' tables in evaluation order. A
//!    change rebuilds only the tables whose content changed.

pub mod cluster;
pub mod counters;
pub mod selector;
pub mod spec;
pub mod trace;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use kxdp_dataplane::policy::{
    Action, ClusterPod, ClusterRule, ClusterTable, DirRules, DirRulesBuilder, Direction, LocalPod,
    PolicyTables, PortEntry, RuleInfo, Tier, ISOLATION,
};
use kxdp_packet::{Addr, IpProto};

use crate::model::{ClusterState, ObjectKey, PodKey, PodRecord, PodStore};
use crate::problem::Problem;
use cluster::ClusterPolicy;
use selector::Selector;
use spec::{NsScope, Peer, Policy, PortSpec};

/// The label the API server puts on every namespace: its name.
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// What one compilation did (for tests, logs and `kxdp policy trace`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    pub policies: usize,
    pub local_pods: usize,
    /// Local pods isolated in at least one direction.
    pub isolated_pods: usize,
    /// Directions compiled anew (a key seen neither in this compilation nor in the last).
    pub built: usize,
    /// Directions whose compiled rules were reused.
    pub reused: usize,
    /// ClusterNetworkPolicy tables compiled anew (a policy direction whose content, or the
    /// selected pod's named ports it resolves, was seen neither in this compilation nor in the
    /// last).
    pub cluster_built: usize,
}

/// The inputs that decide one pod direction's compiled rules.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DirKey {
    dir: Direction,
    /// Fingerprints of the selecting policies' directions, in policy order.
    parts: Vec<u64>,
    /// The pod's named container ports, when a selecting ingress rule uses a named port.
    named: Vec<(String, IpProto, u16)>,
}

/// Compiles policy tables, keeping what it compiled for the next call: when pods, namespaces or
/// policies change, only the pod directions whose inputs changed are rebuilt.
#[derive(Debug, Default)]
pub struct PolicyCompiler {
    rule_ids: HashMap<RuleInfo, u32>,
    rules: Vec<RuleInfo>,
    cache: HashMap<DirKey, Arc<DirRules>>,
    pub stats: CompileStats,
    /// The peer index of the last compilation (updated from the changed pods).
    index: Option<PeerIndex>,
    /// The policies as last parsed, with their problems (parsed again when policies change).
    parsed: Option<(Vec<Policy>, Vec<Problem>)>,
    /// Each compiled policy direction with the inputs it was compiled from.
    dirs: HashMap<(ObjectKey, Direction), CachedDir>,
    /// Rules' peer lists merged into one range list, by their inputs: policies of every
    /// namespace with the same peers (`namespaceSelector: {}` above all) share one union, merged
    /// and hashed once. Dropped once a selector result it was made from is gone.
    unions: HashMap<Vec<UnionPart>, UnionEntry>,
    /// The last compilation's policy directions and local pods' output.
    last: LastOutput,
    /// Which policy directions each selector result and named list is used by.
    deps: Deps,
    /// The ClusterNetworkPolicies as last parsed, in evaluation order (tier, priority, name),
    /// with their problems.
    cluster_parsed: Option<(Vec<ClusterPolicy>, Vec<Problem>)>,
    /// Compiled ClusterNetworkPolicy directions by content (`PolicyDir::content`) and the
    /// selected pod's named ports they resolve: kept while some pod's tables hold them.
    cluster_tables: HashMap<(u64, NamedPorts), Arc<DirRules>>,
}

/// A pod's named container ports (name, protocol, number); those a policy direction resolves.
type NamedPorts = Vec<(String, IpProto, u16)>;

/// One input of a peer union: a selector result (by identity) or an ipBlock's ranges.
#[derive(Clone, Debug)]
enum UnionPart {
    Pods(Ranges),
    Block(Vec<(u128, u128)>),
}

impl PartialEq for UnionPart {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (UnionPart::Pods(a), UnionPart::Pods(b)) => Arc::ptr_eq(a, b),
            (UnionPart::Block(a), UnionPart::Block(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for UnionPart {}

impl Hash for UnionPart {
    fn hash<H: Hasher>(&self, h: &mut H) {
        match self {
            UnionPart::Pods(a) => (0u8, Arc::as_ptr(a) as usize).hash(h),
            UnionPart::Block(b) => (1u8, b).hash(h),
        }
    }
}

/// Merged ranges and a hash of them (what fingerprints use instead of hashing the ranges).
#[derive(Clone, Debug)]
struct PeerSet {
    ranges: Ranges,
    hash: u64,
}

impl PeerSet {
    fn of(ranges: Vec<(u128, u128)>) -> PeerSet {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ranges.hash(&mut h);
        PeerSet {
            hash: h.finish(),
            ranges: Arc::new(ranges),
        }
    }
}

/// Per port number, the peers with a named port of that number.
type ByPort = Arc<Vec<(u16, PeerSet)>>;

/// A peer union and the egress named ports resolved against it: (name, protocol) → the named
/// list's generation and, per port number, the peers with that port.
#[derive(Debug)]
struct UnionEntry {
    set: PeerSet,
    named: HashMap<(String, IpProto), (u64, ByPort)>,
}

/// A compiled policy direction and its inputs: the policy's fingerprint, the selector results
/// it used (by identity) and, when it resolves egress named ports, the named-port index's
/// generation. Equal inputs, equal output.
#[derive(Debug)]
struct CachedDir {
    hash: u64,
    inputs: Vec<Ranges>,
    named_gens: Vec<u64>,
    dir: Arc<PolicyDir>,
}

/// A pod as policy sees it.
#[derive(Clone, Debug)]
pub struct PodView<'a> {
    pub key: ObjectKey,
    pub labels: &'a BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
    pub node: &'a str,
    /// Named container ports: (name, protocol number, port).
    pub ports: Vec<(String, IpProto, u16)>,
}

/// The pod's addresses, labels, node and named ports; `None` for pods that have finished
/// (phase Succeeded or Failed: their addresses may already be someone else's).
pub fn pod_view(key: ObjectKey, pod: &PodRecord) -> Option<PodView<'_>> {
    if pod.finished() {
        return None;
    }
    Some(PodView {
        key,
        labels: &pod.labels,
        ips: pod.ips.to_vec(),
        host_network: pod.host_network,
        node: &pod.node,
        ports: pod.ports.to_vec(),
    })
}

/// Every namespace's labels (with `kubernetes.io/metadata.name`, which the API server always
/// sets), including namespaces that only pods name.
pub fn namespace_labels(state: &ClusterState) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (name, ns) in &state.namespaces {
        let mut l = ns.metadata.labels.clone().unwrap_or_default();
        l.insert(LABEL_NAMESPACE_NAME.into(), name.clone());
        out.insert(name.clone(), l);
    }
    for ns in state.pods.namespaces() {
        if !out.contains_key(ns) {
            out.insert(
                ns.to_string(),
                [(LABEL_NAMESPACE_NAME.to_string(), ns.to_string())].into(),
            );
        }
    }
    out
}

/// Inclusive ranges on the dataplane's `u128` address line.
type Ranges = Arc<Vec<(u128, u128)>>;

/// A pod as the peer index keeps it: the store's record (its shared parts are not copied).
type PeerPod = PodRecord;

/// Selectors can pick it (hostNetwork pods are the node: docs/policy.md).
fn is_peer(pod: &PeerPod) -> bool {
    !pod.host_network && !pod.ips.is_empty()
}

fn lines(pod: &PeerPod) -> impl Iterator<Item = u128> + '_ {
    pod.ips.iter().map(|&ip| spec::line(ip))
}

/// The peer pod addresses with one named port (name and protocol), with the port's number;
/// sorted. `generation` changes whenever the list does (a policy direction that resolved the
/// name against it is compiled again), and only then: relabelling a pod leaves it alone.
#[derive(Debug, Default)]
struct NamedList {
    entries: Vec<(u128, u16)>,
    generation: u64,
}

/// What changed since the last compilation (`PolicyCompiler::compile_changes`).
#[derive(Clone, Copy, Debug)]
pub struct PolicyChanges<'a> {
    /// The Pods added, changed or deleted.
    pub pods: &'a std::collections::BTreeSet<ObjectKey>,
    /// Some Namespace changed (labels select peers).
    pub namespaces: bool,
    /// Some NetworkPolicy changed.
    pub policies: bool,
    /// Some ClusterNetworkPolicy changed.
    pub cluster_policies: bool,
}

/// The peer index, kept across compilations and updated from the changed pods: every pod,
/// peers grouped by (namespace, label set), the named-port index and each (namespace scope,
/// selector) result. A pod change re-evaluates only the selector results it can affect (the
/// pod is in the scope and the selector matches its old or new labels), and only those whose
/// membership or addresses actually change are recomputed; the others keep their `Arc`, which
/// is how a policy direction knows it need not be compiled again.
#[derive(Debug, Default)]
struct PeerIndex {
    node_name: String,
    /// Every pod as policy reads it (finished ones left out): the store's records, kept to know
    /// a pod's previous version when it changes.
    pods: PodStore,
    ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// namespace → label set → addresses of the peer pods with those labels.
    groups: BTreeMap<String, HashMap<crate::model::Labels, Vec<u128>>>,
    /// name → protocol → every peer pod address with that named port, and its number (by name
    /// first: looked up by `&str`, without building a key per pod and port).
    named: HashMap<String, HashMap<IpProto, NamedList>>,
    /// The last generation given to a named list.
    named_gen: u64,
    memo: HashMap<(NsScope, Selector), Ranges>,
    /// This node's pods that policies isolate (not hostNetwork, with addresses), in key order.
    local: std::collections::BTreeSet<ObjectKey>,
    /// This node's hostNetwork pods (their addresses are the node's).
    host_local: std::collections::BTreeSet<ObjectKey>,
    /// Since the last compilation: the selector results dropped and the named lists changed
    /// (the policy directions that used them are compiled again, no others).
    dropped: Vec<(NsScope, Selector)>,
    named_changed: Vec<(String, IpProto)>,
}

impl PeerIndex {
    fn build(state: &ClusterState, node_name: &str) -> PeerIndex {
        let mut ix = PeerIndex {
            node_name: node_name.to_string(),
            ns_labels: namespace_labels(state),
            ..Default::default()
        };
        // The store's pods, cloned whole (a B-tree clone: one name copied per pod, the
        // records' parts shared), less the finished ones.
        let mut pods = state.pods.clone();
        let finished: Vec<ObjectKey> = pods
            .iter()
            .filter(|(_, p)| p.finished())
            .map(|(k, _)| k.to_key())
            .collect();
        for k in &finished {
            pods.remove(k);
        }
        for (k, p) in pods.iter() {
            ix.index(k, p, false, true);
        }
        ix.pods = pods;
        for v in ix.named.values_mut().flat_map(|m| m.values_mut()) {
            v.entries.sort_unstable();
        }
        ix
    }

    /// Adds a pod; `named`: to the named lists too (not when only its labels changed).
    fn insert(&mut self, key: &ObjectKey, pod: PeerPod, named: bool) {
        let k = PodKey {
            namespace: &key.namespace,
            name: &key.name,
        };
        self.index(k, &pod, true, named);
        self.pods.insert(key, pod);
    }

    /// Indexes a pod (not its record: `pods` holds it); `sorted`: keep the named lists sorted
    /// (else `build` sorts them once); `named`: add it to the named lists too.
    fn index(&mut self, key: PodKey<'_>, pod: &PeerPod, sorted: bool, named: bool) {
        let local_node = !self.node_name.is_empty() && *pod.node == *self.node_name;
        if local_node && pod.host_network {
            self.host_local.insert(key.to_key());
        }
        if is_peer(pod) {
            if local_node {
                self.local.insert(key.to_key());
            }
            let groups = match self.groups.get_mut(key.namespace) {
                Some(g) => g,
                None => self.groups.entry(key.namespace.to_string()).or_default(),
            };
            let group = match groups.get_mut(&pod.labels) {
                Some(g) => g,
                None => groups.entry(pod.labels.clone()).or_default(),
            };
            group.extend(lines(pod));
            for (name, proto, num) in pod.ports.iter().filter(|_| named) {
                let lists = match self.named.get_mut(name.as_str()) {
                    Some(l) => l,
                    None => self.named.entry(name.clone()).or_default(),
                };
                let list = lists.entry(*proto).or_default();
                for a in lines(pod) {
                    if sorted {
                        let at = list.entries.partition_point(|e| *e < (a, *num));
                        list.entries.insert(at, (a, *num));
                        self.named_changed.push((name.clone(), *proto));
                    } else {
                        list.entries.push((a, *num));
                    }
                }
                self.named_gen += 1;
                list.generation = self.named_gen;
            }
        }
        if !self.ns_labels.contains_key(key.namespace) {
            self.ns_labels.insert(
                key.namespace.to_string(),
                [(LABEL_NAMESPACE_NAME.to_string(), key.namespace.to_string())].into(),
            );
        }
    }

    /// Removes a pod; `named`: from the named lists too.
    fn remove(&mut self, key: &ObjectKey, named: bool) -> Option<PeerPod> {
        let pod = self.pods.remove(key)?;
        self.local.remove(key);
        self.host_local.remove(key);
        if is_peer(&pod) {
            if let Some(groups) = self.groups.get_mut(&key.namespace) {
                if let Some(g) = groups.get_mut(&pod.labels) {
                    for a in lines(&pod) {
                        if let Some(i) = g.iter().position(|x| *x == a) {
                            g.swap_remove(i);
                        }
                    }
                    if g.is_empty() {
                        groups.remove(&pod.labels);
                    }
                }
            }
            for (name, proto, num) in pod.ports.iter().filter(|_| named) {
                if let Some(list) = self
                    .named
                    .get_mut(name.as_str())
                    .and_then(|l| l.get_mut(proto))
                {
                    for a in lines(&pod) {
                        if let Ok(i) = list.entries.binary_search(&(a, *num)) {
                            list.entries.remove(i);
                        }
                    }
                    self.named_changed.push((name.clone(), *proto));
                    self.named_gen += 1;
                    list.generation = self.named_gen;
                }
            }
        }
        Some(pod)
    }

    fn named_list(&self, name: &str, proto: IpProto) -> Option<&NamedList> {
        self.named.get(name).and_then(|l| l.get(&proto))
    }

    /// Whether a selector result may hold `pod` (of namespace `ns`).
    fn may_hold(&self, scope: &NsScope, sel: &Selector, ns: &str, pod: &PeerPod) -> bool {
        is_peer(pod)
            && match scope {
                NsScope::Own(n) => n == ns,
                NsScope::Select(s) => self.ns_labels.get(ns).is_some_and(|l| s.matches(l)),
            }
            && sel.matches(&pod.labels)
    }

    /// Pod `key` is now `pod` (None: gone): the index and the selector results it affects.
    fn update(&mut self, key: &ObjectKey, pod: Option<PeerPod>) {
        if self.pods.get(key) == pod.as_ref() {
            return;
        }
        // The named lists hold addresses and numbers: untouched when only labels changed.
        let named_part =
            |p: Option<&PeerPod>| p.map(|p| (is_peer(p), p.ips.clone(), p.ports.clone()));
        let named = named_part(self.pods.get(key)) != named_part(pod.as_ref());
        let old = self.remove(key, named);
        if let Some(p) = pod.clone() {
            self.insert(key, p, named);
        }
        let ns = key.namespace.as_str();
        let stale: Vec<(NsScope, Selector)> = self
            .memo
            .keys()
            .filter(|(scope, sel)| {
                let was = old.as_ref().filter(|p| self.may_hold(scope, sel, ns, p));
                let is = pod.as_ref().filter(|p| self.may_hold(scope, sel, ns, p));
                match (was, is) {
                    (None, None) => false,
                    (Some(a), Some(b)) => a.ips != b.ips,
                    _ => true,
                }
            })
            .cloned()
            .collect();
        for k in stale {
            self.memo.remove(&k);
            self.dropped.push(k);
        }
    }

    /// Namespaces changed: their labels again, and the results that select namespaces dropped.
    fn refresh_namespaces(&mut self, state: &ClusterState) {
        let mut labels = namespace_labels(state);
        for ns in self.pods.namespaces() {
            labels
                .entry(ns.to_string())
                .or_insert_with(|| [(LABEL_NAMESPACE_NAME.to_string(), ns.to_string())].into());
        }
        if labels != self.ns_labels {
            self.ns_labels = labels;
            self.memo
                .retain(|(scope, _), _| matches!(scope, NsScope::Own(_)));
        }
    }

    /// The addresses of the pods a pod peer selects, sorted, as single-address ranges.
    fn resolve(&mut self, ns: &NsScope, pods: &Selector) -> Ranges {
        let k = (ns.clone(), pods.clone());
        if let Some(r) = self.memo.get(&k) {
            return r.clone();
        }
        let names: Vec<&str> = match ns {
            NsScope::Own(n) => vec![n.as_str()],
            NsScope::Select(s) => self
                .ns_labels
                .iter()
                .filter(|(_, l)| s.matches(l))
                .map(|(n, _)| n.as_str())
                .collect(),
        };
        let mut addrs: Vec<u128> = Vec::new();
        for n in names {
            for (labels, a) in self.groups.get(n).into_iter().flatten() {
                if pods.matches(labels) {
                    addrs.extend_from_slice(a);
                }
            }
        }
        addrs.sort_unstable();
        addrs.dedup();
        let r = Arc::new(addrs.into_iter().map(|a| (a, a)).collect::<Vec<_>>());
        self.memo.insert(k, r.clone());
        r
    }
}

/// Sorts ranges and merges overlapping or touching ones. The input is mostly sorted lists put
/// end to end (selector results, ipBlocks): a stable sort merges those runs in linear time,
/// where an unstable one sorted them again (the bulk of a full compile at 150k pods).
fn merge_ranges(mut v: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    v.sort();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

fn in_ranges(sorted: &[(u128, u128)], a: u128) -> bool {
    let i = sorted.partition_point(|r| r.0 <= a);
    i > 0 && sorted[i - 1].1 >= a
}

/// One policy direction, compiled as far as it goes without knowing the selected pod.
#[derive(Debug, Default)]
struct PolicyDir {
    fingerprint: u64,
    contributions: Vec<(Ranges, Vec<PortEntry>)>,
    /// Ingress named ports: (peers, name, protocol, rule id), resolved per selected pod.
    named_ingress: Vec<(Ranges, String, IpProto, u32)>,
    /// The rule ids of the direction's rules, in rule order (cluster tables number them).
    rule_ids: Vec<u32>,
    /// A hash of what the direction matches, its rules numbered in order rather than by id: equal
    /// for ClusterNetworkPolicy directions that differ only in name or priority (one table).
    content: u64,
    /// A NetworkPolicy direction's isolation rule (`ISOLATION`): what a pod it isolates counts
    /// its denials against when no rule allows.
    isolation: u32,
}

const EVERYTHING: (u128, u128) = (0, u128::MAX);

impl PolicyCompiler {
    pub fn new() -> Self {
        Self::default()
    }

    fn rule_id(
        &mut self,
        policy: &Arc<str>,
        direction: Direction,
        index: u32,
        cluster: Option<ClusterRule>,
    ) -> u32 {
        let info = RuleInfo {
            policy: policy.clone(),
            direction,
            index,
            cluster,
        };
        if let Some(&id) = self.rule_ids.get(&info) {
            return id;
        }
        let id = self.rules.len() as u32;
        self.rules.push(info.clone());
        self.rule_ids.insert(info, id);
        id
    }

    /// A policy direction: the one compiled before when its inputs are the same, else compiled.
    fn policy_dir(&mut self, p: &Policy, dir: Direction, u: &mut PeerIndex) -> Arc<PolicyDir> {
        let mut inputs = Vec::new();
        let mut named_gens = Vec::new();
        for rule in p.rules(dir).into_iter().flatten() {
            for peer in rule.peers.iter().flatten() {
                if let Peer::Pods { ns, pods } = peer {
                    inputs.push(u.resolve(ns, pods));
                }
            }
            if dir == Direction::Egress {
                for port in rule.ports.iter().flatten() {
                    if let PortSpec::Named(name) = &port.spec {
                        named_gens.push(u.named_list(name, port.proto).map_or(0, |l| l.generation));
                    }
                }
            }
        }
        let key = (p.key.clone(), dir);
        if let Some(c) = self.dirs.get(&key) {
            if c.hash == p.hash
                && c.named_gens == named_gens
                && c.inputs.len() == inputs.len()
                && c.inputs.iter().zip(&inputs).all(|(a, b)| Arc::ptr_eq(a, b))
            {
                return c.dir.clone();
            }
        }
        let d = Arc::new(self.compile_dir(p, dir, u));
        self.dirs.insert(
            key,
            CachedDir {
                hash: p.hash,
                inputs,
                named_gens,
                dir: d.clone(),
            },
        );
        d
    }

    /// The inputs of a rule's peers (`None`, every peer, is the whole line).
    fn union_key(peers: Option<&[Peer]>, u: &mut PeerIndex) -> Vec<UnionPart> {
        match peers {
            None => vec![UnionPart::Block(vec![EVERYTHING])],
            Some(list) => list
                .iter()
                .map(|peer| match peer {
                    Peer::Pods { ns, pods } => UnionPart::Pods(u.resolve(ns, pods)),
                    Peer::Block { ranges, .. } => UnionPart::Block(ranges.clone()),
                })
                .collect(),
        }
    }

    /// The union of a rule's peers (merged once per distinct list of inputs).
    fn union(&mut self, key: &[UnionPart]) -> PeerSet {
        if let Some(e) = self.unions.get(key) {
            return e.set.clone();
        }
        let mut all = Vec::new();
        for part in key {
            match part {
                UnionPart::Pods(r) => all.extend_from_slice(r),
                UnionPart::Block(r) => all.extend_from_slice(r),
            }
        }
        let set = PeerSet::of(merge_ranges(all));
        self.unions.insert(
            key.to_vec(),
            UnionEntry {
                set: set.clone(),
                named: HashMap::new(),
            },
        );
        set
    }

    /// Egress named port `name`/`proto` against the peers of `union` (a key of `unions`): per
    /// port number, the peer addresses with a port of that name and protocol.
    fn named_egress(
        &mut self,
        key: &[UnionPart],
        set: &PeerSet,
        name: &str,
        proto: IpProto,
        u: &PeerIndex,
    ) -> ByPort {
        let list = u.named_list(name, proto);
        let generation = list.map_or(0, |l| l.generation);
        let entry = self.unions.get_mut(key);
        if let Some((g, r)) = entry
            .as_ref()
            .and_then(|e| e.named.get(&(name.to_string(), proto)))
        {
            if *g == generation {
                return r.clone();
            }
        }
        let mut by_port: BTreeMap<u16, Vec<(u128, u128)>> = BTreeMap::new();
        for &(a, n) in list.into_iter().flat_map(|l| &l.entries) {
            if in_ranges(&set.ranges, a) {
                by_port.entry(n).or_default().push((a, a));
            }
        }
        let r: ByPort = Arc::new(
            by_port
                .into_iter()
                .map(|(n, addrs)| (n, PeerSet::of(merge_ranges(addrs))))
                .collect(),
        );
        if let Some(e) = entry {
            e.named
                .insert((name.to_string(), proto), (generation, r.clone()));
        }
        r
    }

    fn compile_dir(&mut self, p: &Policy, dir: Direction, u: &mut PeerIndex) -> PolicyDir {
        let mut out = PolicyDir::default();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (p.hash, dir).hash(&mut h);
        let mut hc = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut hc);
        for rule in p.rules(dir).into_iter().flatten() {
            let cluster = p.cluster.map(|(tier, priority)| ClusterRule {
                tier,
                priority,
                action: rule.action.unwrap_or(Action::Accept),
            });
            let id = self.rule_id(&p.name, dir, rule.index, cluster);
            let local = out.rule_ids.len() as u32;
            out.rule_ids.push(id);
            if rule.void {
                continue;
            }
            let union_key = Self::union_key(rule.peers.as_deref(), u);
            let peers = self.union(&union_key);
            let mut entries = Vec::new();
            match &rule.ports {
                None => entries.push(PortEntry::any(id)),
                Some(ports) => {
                    for port in ports {
                        match &port.spec {
                            PortSpec::All => {
                                entries.push(PortEntry::range(port.proto, 0, u16::MAX, id))
                            }
                            PortSpec::Range(lo, hi) => {
                                entries.push(PortEntry::range(port.proto, *lo, *hi, id))
                            }
                            PortSpec::Named(name) if dir == Direction::Ingress => {
                                (peers.hash, name, port.proto, id).hash(&mut h);
                                (peers.hash, name, port.proto, local).hash(&mut hc);
                                out.named_ingress.push((
                                    peers.ranges.clone(),
                                    name.clone(),
                                    port.proto,
                                    id,
                                ));
                            }
                            PortSpec::Named(name) => {
                                // Egress: the destination is the peer; each peer pod with a
                                // port of that name and protocol allows its own number.
                                let by_port =
                                    self.named_egress(&union_key, &peers, name, port.proto, u);
                                for (n, addrs) in by_port.iter() {
                                    let e = vec![PortEntry::range(port.proto, *n, *n, id)];
                                    (addrs.hash, &e).hash(&mut h);
                                    (addrs.hash, port.proto, *n, local).hash(&mut hc);
                                    out.contributions.push((addrs.ranges.clone(), e));
                                }
                            }
                        }
                    }
                }
            }
            (id, peers.hash, &entries).hash(&mut h);
            (local, peers.hash).hash(&mut hc);
            for e in &entries {
                (e.proto, e.lo, e.hi).hash(&mut hc);
            }
            if !entries.is_empty() && !peers.ranges.is_empty() {
                out.contributions.push((peers.ranges.clone(), entries));
            }
        }
        out.fingerprint = h.finish();
        out.content = hc.finish();
        if p.cluster.is_none() {
            out.isolation = self.rule_id(&p.name, dir, ISOLATION, None);
        }
        out
    }

    /// Compiles the tables of node `node_name` (whose addresses are `node_addrs`) from `state`,
    /// everything from scratch (the peer index is built anew).
    pub fn compile(
        &mut self,
        node_name: &str,
        node_addrs: &[Addr],
        state: &ClusterState,
    ) -> (PolicyTables, Vec<Problem>) {
        self.compile_changes(node_name, node_addrs, state, None)
    }

    /// As `compile`, when only `changes` happened since the last call (None: anything may have):
    /// the peer index is updated from the changed pods, selector results recomputed only where
    /// those pods can change them, and policy directions compiled again only when their inputs
    /// changed. The tables are those `compile` would build.
    pub fn compile_changes(
        &mut self,
        node_name: &str,
        node_addrs: &[Addr],
        state: &ClusterState,
        changes: Option<PolicyChanges<'_>>,
    ) -> (PolicyTables, Vec<Problem>) {
        let mut stats = CompileStats::default();

        // 1. The peer index.
        let mut index = match (self.index.take(), changes) {
            (Some(mut ix), Some(c)) if ix.node_name == node_name => {
                for key in c.pods {
                    let now = state.pods.get(key).filter(|p| !p.finished()).cloned();
                    ix.update(key, now);
                }
                if c.namespaces {
                    ix.refresh_namespaces(state);
                }
                ix
            }
            _ => {
                self.parsed = None;
                self.dirs.clear();
                self.unions.clear();
                PeerIndex::build(state, node_name)
            }
        };

        // 2. Policies, by namespace.
        if changes.is_none_or(|c| c.policies) {
            self.parsed = None;
        }
        let (policies, problems) = match self.parsed.take() {
            Some(p) => p,
            None => {
                let mut problems = Vec::new();
                let mut policies: Vec<Policy> = Vec::with_capacity(state.network_policies.len());
                for (key, np) in &state.network_policies {
                    let (p, probs) = spec::parse(key, np);
                    for m in probs {
                        tracing::warn!(policy = %key, "{m}");
                        problems.push(Problem {
                            object: format!("NetworkPolicy {key}"),
                            message: m,
                        });
                    }
                    policies.push(p);
                }
                // Directions of policies gone are not kept (ClusterNetworkPolicies' are
                // pruned with theirs).
                let keys: std::collections::HashSet<&ObjectKey> =
                    policies.iter().map(|p| &p.key).collect();
                self.dirs
                    .retain(|(k, _), _| k.namespace.is_empty() || keys.contains(k));
                // The last output is by policy index: none of it is reused.
                self.last = LastOutput::default();
                self.deps = Deps::of(&policies);
                (policies, problems)
            }
        };
        // ClusterNetworkPolicies, in evaluation order.
        if changes.is_none_or(|c| c.cluster_policies) {
            self.cluster_parsed = None;
        }
        let (cluster, cluster_problems) = match self.cluster_parsed.take() {
            Some(p) => p,
            None => {
                let (cluster, problems) = parse_cluster(state);
                let names: std::collections::HashSet<&str> =
                    cluster.iter().map(|c| &*c.policy.name).collect();
                self.dirs
                    .retain(|(k, _), _| !k.namespace.is_empty() || names.contains(k.name.as_str()));
                (cluster, problems)
            }
        };
        // Namespaces relabelled (or everything built anew): every result that selects
        // namespaces may differ; nothing of the last output is reused.
        if changes.is_none_or(|c| c.namespaces) {
            self.last = LastOutput::default();
        }
        stats.policies = policies.len();
        let mut by_ns: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, p) in policies.iter().enumerate() {
            by_ns.entry(p.key.namespace.as_str()).or_default().push(i);
        }

        // This node's addresses, its hostNetwork pods' included.
        let mut node = node_addrs.to_vec();
        for k in &index.host_local {
            for &ip in index.pods.get(k).expect("indexed pod").ips.iter() {
                let a = Addr::from_ip(ip);
                if !node.contains(&a) {
                    node.push(a);
                }
            }
        }

        // 3. Policy directions (only those of namespaces with local pods are needed); of the
        // last call's, only those whose selector results or named lists were dropped since are
        // looked at again.
        let mut dirty: std::collections::HashSet<(usize, Direction)> = Default::default();
        for k in index.dropped.drain(..) {
            dirty.extend(self.deps.selectors.get(&k).into_iter().flatten());
        }
        for k in index.named_changed.drain(..) {
            dirty.extend(self.deps.named.get(&k).into_iter().flatten());
        }
        let wanted: Vec<usize> = {
            let mut last_ns = "";
            let mut v = Vec::new();
            // `local` is in key order: a namespace's pods are together.
            for k in &index.local {
                if k.namespace != last_ns {
                    last_ns = k.namespace.as_str();
                    v.extend(by_ns.get(last_ns).into_iter().flatten());
                }
            }
            v
        };
        let mut compiled: HashMap<(usize, Direction), Arc<PolicyDir>> =
            HashMap::with_capacity(2 * wanted.len());
        let mut changed_dirs: std::collections::HashSet<(usize, Direction)> = Default::default();
        for i in wanted {
            for dir in [Direction::Ingress, Direction::Egress] {
                if policies[i].rules(dir).is_none() {
                    continue;
                }
                let old = self.last.dirs.get(&(i, dir)).cloned();
                let d = match old {
                    Some(d) if !dirty.contains(&(i, dir)) => d,
                    _ => {
                        let d = self.policy_dir(&policies[i], dir, &mut index);
                        if !old.is_some_and(|o| Arc::ptr_eq(&o, &d)) {
                            changed_dirs.insert((i, dir));
                        }
                        d
                    }
                };
                compiled.insert((i, dir), d);
            }
        }

        // 4. Local pods: the last output of a pod is kept unless the pod changed or a policy
        // direction that selects it did.
        if let Some(c) = changes {
            for k in c.pods {
                if !index.local.contains(k) {
                    self.last.pods.remove(k);
                }
            }
        }
        stats.local_pods = index.local.len();
        let mut out_pods = Vec::with_capacity(index.local.len());
        for k in &index.local {
            let keep = self.last.pods.get(k).filter(|e| {
                !changes.is_some_and(|c| c.pods.contains(k))
                    && !e.selecting.iter().any(|&i| {
                        changed_dirs.contains(&(i, Direction::Ingress))
                            || changed_dirs.contains(&(i, Direction::Egress))
                    })
            });
            let e = match keep {
                Some(e) => {
                    stats.reused += e.ingress.is_some() as usize + e.egress.is_some() as usize;
                    e
                }
                None => {
                    let e = local_out(
                        k,
                        index.pods.get(k).expect("indexed pod"),
                        &policies,
                        by_ns.get(k.namespace.as_str()).map_or(&[][..], |v| v),
                        &compiled,
                        &mut self.cache,
                        &mut stats,
                    );
                    self.last.pods.insert(k.clone(), e);
                    &self.last.pods[k]
                }
            };
            if e.ingress.is_some() || e.egress.is_some() {
                stats.isolated_pods += 1;
            }
            out_pods.push((e.local_pod(), e.addrs.clone()));
        }
        // 5. ClusterNetworkPolicies: their directions (compiled again only when their inputs
        // changed, as NetworkPolicies'), each one table shared by every pod it selects (and by
        // the directions of equal content), built only when its content is new; then each
        // local pod's tiers, the selecting policies' tables in evaluation order, by (namespace,
        // labels, named ports): pods alike share them.
        let mut cluster_dirs: HashMap<(usize, Direction), ClusterDir> = HashMap::new();
        if !index.local.is_empty() {
            for (i, c) in cluster.iter().enumerate() {
                for dir in [Direction::Ingress, Direction::Egress] {
                    if c.policy.rules(dir).is_some() {
                        let d = self.policy_dir(&c.policy, dir, &mut index);
                        let order = d
                            .rule_ids
                            .iter()
                            .map(|&id| {
                                let info = &self.rules[id as usize];
                                (id, info.cluster.map_or(Action::Accept, |c| c.action))
                            })
                            .collect();
                        cluster_dirs.insert((i, dir), ClusterDir { dir: d, order });
                    }
                }
            }
        }
        if !cluster.is_empty() {
            let mut memo: HashMap<(&str, *const BTreeMap<String, String>, *const Vec<_>), _> =
                HashMap::new();
            let mut tables = ClusterTables {
                this: HashMap::new(),
                cache: &mut self.cluster_tables,
                built: 0,
            };
            let empty = BTreeMap::new();
            for ((lp, _), k) in out_pods.iter_mut().zip(&index.local) {
                let pod = index.pods.get(k).expect("indexed pod");
                let m = (
                    k.namespace.as_str(),
                    Arc::as_ptr(&pod.labels),
                    Arc::as_ptr(&pod.ports),
                );
                let cp = match memo.get(&m) {
                    Some(cp) => Option::clone(cp),
                    None => {
                        let ns_labels = index.ns_labels.get(&k.namespace).unwrap_or(&empty);
                        let cp = cluster_pod(&cluster, ns_labels, pod, &cluster_dirs, &mut tables);
                        memo.insert(m, cp.clone());
                        cp
                    }
                };
                lp.cluster = cp;
            }
            stats.cluster_built = tables.built;
        }
        self.cluster_tables.retain(|_, r| Arc::strong_count(r) > 1);
        let mut problems = problems;
        problems.extend(cluster_problems.iter().cloned());
        self.cluster_parsed = Some((cluster, cluster_problems));

        self.last.dirs = compiled;
        // Compiled rules no pod holds any more are not kept.
        self.cache.retain(|_, r| Arc::strong_count(r) > 1);
        self.stats = stats;
        // Unions made from selector results no longer held anywhere else can never be asked
        // for again.
        self.unions.retain(|k, _| {
            k.iter().all(|p| match p {
                UnionPart::Pods(r) => Arc::strong_count(r) > 1,
                UnionPart::Block(_) => true,
            })
        });
        let tables = PolicyTables::new(out_pods, node, self.rules.clone());
        self.index = Some(index);
        let np_problems = problems.len() - self.cluster_parsed.as_ref().map_or(0, |c| c.1.len());
        self.parsed = Some((policies, problems[..np_problems].to_vec()));
        (tables, problems)
    }
}

/// A local pod's direction when isolated: its rules, the selecting policies' names and their
/// isolation rules.
#[derive(Debug)]
struct IsolatedDir {
    rules: Arc<DirRules>,
    names: Arc<[Arc<str>]>,
    isolation: Arc<[u32]>,
}

/// One local pod's output, kept for the next compilation.
#[derive(Debug)]
struct LocalOut {
    name: Arc<str>,
    /// The policies of its namespace that select it (indices).
    selecting: Vec<usize>,
    /// Per direction when isolated: the rules and the selecting policies' names.
    ingress: Option<IsolatedDir>,
    egress: Option<IsolatedDir>,
    addrs: Vec<Addr>,
}

impl LocalOut {
    fn local_pod(&self) -> LocalPod {
        let mut lp = LocalPod {
            name: self.name.clone(),
            ..Default::default()
        };
        if let Some(d) = &self.ingress {
            lp.ingress = Some(d.rules.clone());
            lp.ingress_policies = d.names.clone();
            lp.ingress_isolation = d.isolation.clone();
        }
        if let Some(d) = &self.egress {
            lp.egress = Some(d.rules.clone());
            lp.egress_policies = d.names.clone();
            lp.egress_isolation = d.isolation.clone();
        }
        lp
    }
}

/// What the last compilation produced, kept while the parsed policies are (it is by index).
#[derive(Debug, Default)]
struct LastOutput {
    /// (policy index, direction) → the compiled direction.
    dirs: HashMap<(usize, Direction), Arc<PolicyDir>>,
    /// Each local pod's output.
    pods: HashMap<ObjectKey, LocalOut>,
}

/// Which policy directions use each selector result and each named list (from the parsed
/// policies): a dropped result or a changed list marks exactly those to compile again.
#[derive(Debug, Default)]
struct Deps {
    selectors: HashMap<(NsScope, Selector), Vec<(usize, Direction)>>,
    named: HashMap<(String, IpProto), Vec<(usize, Direction)>>,
}

impl Deps {
    fn of(policies: &[Policy]) -> Deps {
        let mut d = Deps::default();
        for (i, p) in policies.iter().enumerate() {
            for dir in [Direction::Ingress, Direction::Egress] {
                for rule in p.rules(dir).into_iter().flatten() {
                    for peer in rule.peers.iter().flatten() {
                        if let Peer::Pods { ns, pods } = peer {
                            let v = d.selectors.entry((ns.clone(), pods.clone())).or_default();
                            if v.last() != Some(&(i, dir)) {
                                v.push((i, dir));
                            }
                        }
                    }
                    if dir == Direction::Egress {
                        for port in rule.ports.iter().flatten() {
                            if let PortSpec::Named(name) = &port.spec {
                                let v = d.named.entry((name.clone(), port.proto)).or_default();
                                if v.last() != Some(&(i, dir)) {
                                    v.push((i, dir));
                                }
                            }
                        }
                    }
                }
            }
        }
        d
    }
}

/// A local pod's output: the policies of its namespace (`ns_policies`) that select it and, per
/// direction, its rules (built from the selecting directions' parts unless `cache` holds them).
fn local_out(
    key: &ObjectKey,
    p: &PeerPod,
    policies: &[Policy],
    ns_policies: &[usize],
    compiled: &HashMap<(usize, Direction), Arc<PolicyDir>>,
    cache: &mut HashMap<DirKey, Arc<DirRules>>,
    stats: &mut CompileStats,
) -> LocalOut {
    let selecting: Vec<usize> = ns_policies
        .iter()
        .copied()
        .filter(|&i| policies[i].subject.matches(&p.labels))
        .collect();
    let mut out = LocalOut {
        name: key.to_string().into(),
        selecting,
        ingress: None,
        egress: None,
        addrs: p.ips.iter().map(|&ip| Addr::from_ip(ip)).collect(),
    };
    for dir in [Direction::Ingress, Direction::Egress] {
        let sel: Vec<usize> = out
            .selecting
            .iter()
            .copied()
            .filter(|&i| policies[i].rules(dir).is_some())
            .collect();
        if sel.is_empty() {
            continue;
        }
        let names: Arc<[Arc<str>]> = sel.iter().map(|&i| policies[i].name.clone()).collect();
        let parts: Vec<&PolicyDir> = sel.iter().map(|i| &*compiled[&(*i, dir)]).collect();
        let uses_named = parts.iter().any(|d| !d.named_ingress.is_empty());
        let key = DirKey {
            dir,
            parts: parts.iter().map(|d| d.fingerprint).collect(),
            named: if uses_named { p.ports.to_vec() } else { vec![] },
        };
        let rules = if let Some(r) = cache.get(&key) {
            stats.reused += 1;
            r.clone()
        } else {
            stats.built += 1;
            let r = Arc::new(build_dir(&parts, &p.ports));
            cache.insert(key, r.clone());
            r
        };
        let d = Some(IsolatedDir {
            rules,
            names,
            isolation: parts.iter().map(|d| d.isolation).collect(),
        });
        match dir {
            Direction::Ingress => out.ingress = d,
            Direction::Egress => out.egress = d,
        }
    }
    out
}

/// Builds one pod direction from its selecting policies' parts; `ports` are the pod's named
/// container ports (ingress named ports resolve against them).
fn build_dir(parts: &[&PolicyDir], ports: &[(String, IpProto, u16)]) -> DirRules {
    let mut b = DirRulesBuilder::new();
    for d in parts {
        for (ranges, entries) in &d.contributions {
            b.add(ranges, entries);
        }
        for (ranges, name, proto, id) in &d.named_ingress {
            let entries: Vec<PortEntry> = ports
                .iter()
                .filter(|(n, p, _)| n == name && p == proto)
                .map(|&(_, p, num)| PortEntry::range(p, num, num, *id))
                .collect();
            b.add(ranges, &entries);
        }
    }
    if b.is_empty() {
        return DirRules::deny_all();
    }
    b.build()
}

/// Parses the ClusterNetworkPolicies, in evaluation order: tier, priority, then name (the API
/// leaves equal priorities to the implementation; by name is deterministic).
fn parse_cluster(state: &ClusterState) -> (Vec<ClusterPolicy>, Vec<Problem>) {
    let mut out = Vec::with_capacity(state.cluster_network_policies.len());
    let mut problems = Vec::new();
    for (name, cnp) in &state.cluster_network_policies {
        let (c, probs) = cluster::parse(name, cnp);
        for m in probs {
            tracing::warn!(policy = %name, "ClusterNetworkPolicy: {m}");
            problems.push(Problem {
                object: format!("ClusterNetworkPolicy {name}"),
                message: m,
            });
        }
        out.push(c);
    }
    out.sort_by(|a, b| {
        (a.tier, a.priority, &a.policy.name).cmp(&(b.tier, b.priority, &b.policy.name))
    });
    (out, problems)
}

/// A ClusterNetworkPolicy direction as compiled, and its rules' ids and actions in order.
struct ClusterDir {
    dir: Arc<PolicyDir>,
    order: Arc<[(u32, Action)]>,
}

/// The ClusterNetworkPolicy tables of one compilation: by (policy index, direction, the pod's
/// named ports it resolves), and underneath the compiler's tables by content.
struct ClusterTables<'a> {
    this: HashMap<(usize, Direction, NamedPorts), Arc<ClusterTable>>,
    cache: &'a mut HashMap<(u64, NamedPorts), Arc<DirRules>>,
    built: usize,
}

impl ClusterTables<'_> {
    /// Policy `i`'s table for `dir` as pod `ports` sees it.
    fn get(
        &mut self,
        i: usize,
        dir: Direction,
        d: &ClusterDir,
        ports: &[(String, IpProto, u16)],
    ) -> Arc<ClusterTable> {
        // Only the named ports the direction resolves: pods that differ in others share.
        let named: NamedPorts = if d.dir.named_ingress.is_empty() {
            Vec::new()
        } else {
            ports
                .iter()
                .filter(|(n, p, _)| {
                    d.dir
                        .named_ingress
                        .iter()
                        .any(|(_, name, proto, _)| name == n && proto == p)
                })
                .cloned()
                .collect()
        };
        let key = (i, dir, named);
        if let Some(t) = self.this.get(&key) {
            return t.clone();
        }
        let ck = (d.dir.content, key.2.clone());
        let rules = match self.cache.get(&ck) {
            Some(r) => r.clone(),
            None => {
                self.built += 1;
                let r = Arc::new(build_cluster_rules(&d.dir, &ck.1));
                self.cache.insert(ck, r.clone());
                r
            }
        };
        let t = Arc::new(ClusterTable {
            rules,
            order: d.order.clone(),
        });
        self.this.insert(key, t.clone());
        t
    }
}

/// A local pod's ClusterNetworkPolicy tiers (`None` when no policy with rules selects it).
fn cluster_pod(
    cluster: &[ClusterPolicy],
    ns_labels: &BTreeMap<String, String>,
    pod: &PeerPod,
    dirs: &HashMap<(usize, Direction), ClusterDir>,
    tables: &mut ClusterTables<'_>,
) -> Option<Arc<ClusterPod>> {
    let selecting: Vec<usize> = (0..cluster.len())
        .filter(|&i| cluster[i].subject.matches(ns_labels, &pod.labels))
        .collect();
    if selecting.is_empty() {
        return None;
    }
    let mut out = ClusterPod {
        policies: selecting
            .iter()
            .map(|&i| cluster[i].policy.name.clone())
            .collect(),
        ..Default::default()
    };
    for tier in [Tier::Admin, Tier::Baseline] {
        for dir in [Direction::Ingress, Direction::Egress] {
            let mut list: Vec<Arc<ClusterTable>> = Vec::new();
            for &i in selecting.iter().filter(|&&i| cluster[i].tier == tier) {
                let Some(d) = dirs.get(&(i, dir)) else {
                    continue;
                };
                let t = tables.get(i, dir, d, &pod.ports);
                // A table matching what an earlier one matches never decides: the earlier one
                // decided (or passed) first. Policies alike cost one lookup, not one each.
                if !list.iter().any(|e| Arc::ptr_eq(&e.rules, &t.rules)) {
                    list.push(t);
                }
            }
            let slot = match (tier, dir) {
                (Tier::Admin, Direction::Ingress) => &mut out.admin_ingress,
                (Tier::Admin, Direction::Egress) => &mut out.admin_egress,
                (Tier::Baseline, Direction::Ingress) => &mut out.baseline_ingress,
                (Tier::Baseline, Direction::Egress) => &mut out.baseline_egress,
            };
            *slot = list.into_boxed_slice();
        }
    }
    (!out.is_empty()).then(|| Arc::new(out))
}

/// One ClusterNetworkPolicy direction's table: the entries name the rule's place in the
/// direction (`PolicyDir::rule_ids`), so the lowest matching one is the rule that decides;
/// `named` are the selected pod's ports its ingress named ports resolve against.
fn build_cluster_rules(d: &PolicyDir, named: &[(String, IpProto, u16)]) -> DirRules {
    let local = |id: u32| {
        d.rule_ids
            .iter()
            .position(|&r| r == id)
            .expect("an entry names a rule of its direction") as u32
    };
    let mut b = DirRulesBuilder::ordered();
    for (ranges, entries) in &d.contributions {
        let e: Vec<PortEntry> = entries
            .iter()
            .map(|e| PortEntry {
                rule: local(e.rule),
                ..*e
            })
            .collect();
        b.add(ranges, &e);
    }
    for (ranges, name, proto, id) in &d.named_ingress {
        let entries: Vec<PortEntry> = named
            .iter()
            .filter(|(n, p, _)| n == name && p == proto)
            .map(|&(_, p, num)| PortEntry::range(p, num, num, local(*id)))
            .collect();
        b.add(ranges, &entries);
    }
    if b.is_empty() {
        return DirRules::deny_all();
    }
    b.build()
}

/// Compiles without keeping anything (what `translate` does).
pub fn compile(
    node_name: &str,
    node_addrs: &[Addr],
    state: &ClusterState,
) -> (PolicyTables, Vec<Problem>) {
    PolicyCompiler::new().compile(node_name, node_addrs, state)
}

#[cfg(test)]
mod tests;
