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

pub mod selector;
pub mod spec;
pub mod trace;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kxdp_dataplane::policy::{
    DirRules, DirRulesBuilder, Direction, LocalPod, PolicyTables, PortEntry, RuleInfo,
};
use kxdp_packet::Addr;

use crate::model::{ClusterState, ObjectKey};
use crate::translate::Problem;
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
}

/// The inputs that decide one pod direction's compiled rules.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct DirKey {
    dir: Direction,
    /// Fingerprints of the selecting policies' directions, in policy order.
    parts: Vec<u64>,
    /// The pod's named container ports, when a selecting ingress rule uses a named port.
    named: Vec<(String, u8, u16)>,
}

/// Compiles policy tables, keeping what it compiled for the next call: when pods, namespaces or
/// policies change, only the pod directions whose inputs changed are rebuilt.
#[derive(Debug, Default)]
pub struct PolicyCompiler {
    rule_ids: HashMap<RuleInfo, u32>,
    rules: Vec<RuleInfo>,
    cache: HashMap<DirKey, Arc<DirRules>>,
    pub stats: CompileStats,
}

/// A pod as policy sees it.
#[derive(Clone, Debug)]
pub struct PodView<'a> {
    pub key: &'a ObjectKey,
    pub labels: &'a BTreeMap<String, String>,
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
    pub node: &'a str,
    /// Named container ports: (name, protocol number, port).
    pub ports: Vec<(String, u8, u16)>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The pod's addresses, labels, node and named ports; `None` for pods that have finished
/// (phase Succeeded or Failed: their addresses may already be someone else's).
pub fn pod_view<'a>(key: &'a ObjectKey, pod: &'a Pod) -> Option<PodView<'a>> {
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    ) {
        return None;
    }
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
    let mut ports = Vec::new();
    if let Some(spec) = spec {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            for p in c.ports.iter().flatten() {
                let (Some(name), Some(proto), Ok(num)) = (
                    p.name.as_deref().filter(|n| !n.is_empty()),
                    spec::proto_number(p.protocol.as_deref().unwrap_or("TCP")),
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
    Some(PodView {
        key,
        labels: pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
        ips,
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        node: spec.and_then(|s| s.node_name.as_deref()).unwrap_or(""),
        ports,
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
    for key in state.pods.keys() {
        out.entry(key.namespace.clone())
            .or_insert_with(|| [(LABEL_NAMESPACE_NAME.to_string(), key.namespace.clone())].into());
    }
    out
}

/// Inclusive ranges on the dataplane's `u128` address line.
type Ranges = Arc<Vec<(u128, u128)>>;
/// Pods of one namespace grouped by label set: (labels, addresses).
type Groups<'a> = Vec<(&'a BTreeMap<String, String>, Vec<u128>)>;

/// Peer pods grouped by (namespace, label set), with the selector memo.
struct Universe<'a> {
    ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// namespace → groups (label set, addresses).
    groups: BTreeMap<&'a str, Groups<'a>>,
    /// (name, protocol) → every peer pod address with that named port, and its number.
    named: HashMap<(String, u8), Vec<(u128, u16)>>,
    memo: HashMap<(NsScope, Selector), Ranges>,
}

impl<'a> Universe<'a> {
    fn new(state: &'a ClusterState, pods: &[PodView<'a>]) -> Universe<'a> {
        let mut groups: BTreeMap<&'a str, Groups<'a>> = BTreeMap::new();
        let mut index: HashMap<(&str, &BTreeMap<String, String>), usize> = HashMap::new();
        let mut named: HashMap<(String, u8), Vec<(u128, u16)>> = HashMap::new();
        for p in pods {
            // hostNetwork pods are the node: selectors never pick them (docs/policy.md).
            if p.host_network || p.ips.is_empty() {
                continue;
            }
            let ns = p.key.namespace.as_str();
            let list = groups.entry(ns).or_default();
            let i = *index.entry((ns, p.labels)).or_insert_with(|| {
                list.push((p.labels, Vec::new()));
                list.len() - 1
            });
            list[i].1.extend(p.ips.iter().map(|&ip| spec::line(ip)));
            for (name, proto, num) in &p.ports {
                let e = named.entry((name.clone(), *proto)).or_default();
                e.extend(p.ips.iter().map(|&ip| (spec::line(ip), *num)));
            }
        }
        for v in named.values_mut() {
            v.sort_unstable();
        }
        Universe {
            ns_labels: namespace_labels(state),
            groups,
            named,
            memo: HashMap::new(),
        }
    }

    /// The addresses of the pods a pod peer selects, sorted, as single-address ranges.
    fn resolve(&mut self, ns: &NsScope, pods: &Selector) -> Arc<Vec<(u128, u128)>> {
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

/// Sorts ranges and merges overlapping or touching ones.
fn merge_ranges(mut v: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    v.sort_unstable();
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
    named_ingress: Vec<(Ranges, String, u8, u32)>,
}

const EVERYTHING: (u128, u128) = (0, u128::MAX);

impl PolicyCompiler {
    pub fn new() -> Self {
        Self::default()
    }

    fn rule_id(&mut self, policy: &Arc<str>, direction: Direction, index: u32) -> u32 {
        let info = RuleInfo {
            policy: policy.clone(),
            direction,
            index,
        };
        if let Some(&id) = self.rule_ids.get(&info) {
            return id;
        }
        let id = self.rules.len() as u32;
        self.rules.push(info.clone());
        self.rule_ids.insert(info, id);
        id
    }

    fn compile_dir(&mut self, p: &Policy, dir: Direction, u: &mut Universe<'_>) -> PolicyDir {
        let mut out = PolicyDir::default();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (p.hash, dir).hash(&mut h);
        for rule in p.rules(dir).into_iter().flatten() {
            let id = self.rule_id(&p.name, dir, rule.index);
            if rule.void {
                continue;
            }
            let peers: Arc<Vec<(u128, u128)>> = match &rule.peers {
                None => Arc::new(vec![EVERYTHING]),
                Some(list) => {
                    let mut all = Vec::new();
                    for peer in list {
                        match peer {
                            Peer::Pods { ns, pods } => {
                                all.extend_from_slice(&u.resolve(ns, pods));
                            }
                            Peer::Block { ranges, .. } => all.extend_from_slice(ranges),
                        }
                    }
                    Arc::new(merge_ranges(all))
                }
            };
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
                                out.named_ingress.push((
                                    peers.clone(),
                                    name.clone(),
                                    port.proto,
                                    id,
                                ));
                            }
                            PortSpec::Named(name) => {
                                // Egress: the destination is the peer; each peer pod with a
                                // port of that name and protocol allows its own number.
                                let mut by_port: BTreeMap<u16, Vec<(u128, u128)>> = BTreeMap::new();
                                for &(a, n) in u
                                    .named
                                    .get(&(name.clone(), port.proto))
                                    .into_iter()
                                    .flatten()
                                {
                                    if in_ranges(&peers, a) {
                                        by_port.entry(n).or_default().push((a, a));
                                    }
                                }
                                for (n, addrs) in by_port {
                                    let e = vec![PortEntry::range(port.proto, n, n, id)];
                                    (&addrs, &e).hash(&mut h);
                                    out.contributions.push((Arc::new(addrs), e));
                                }
                            }
                        }
                    }
                }
            }
            (id, &*peers, &entries).hash(&mut h);
            if !entries.is_empty() && !peers.is_empty() {
                out.contributions.push((peers.clone(), entries));
            }
        }
        for (peers, name, proto, id) in &out.named_ingress {
            (&**peers, name, proto, id).hash(&mut h);
        }
        out.fingerprint = h.finish();
        out
    }

    /// Compiles the tables of node `node_name` (whose addresses are `node_addrs`) from `state`.
    pub fn compile(
        &mut self,
        node_name: &str,
        node_addrs: &[Addr],
        state: &ClusterState,
    ) -> (PolicyTables, Vec<Problem>) {
        let mut problems = Vec::new();
        let mut stats = CompileStats::default();

        // 1. Policies, by namespace.
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
        stats.policies = policies.len();
        let mut by_ns: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, p) in policies.iter().enumerate() {
            by_ns.entry(p.key.namespace.as_str()).or_default().push(i);
        }

        // 2. Pods.
        let pods: Vec<PodView<'_>> = state
            .pods
            .iter()
            .filter_map(|(k, p)| pod_view(k, p))
            .collect();
        let mut node = node_addrs.to_vec();
        for p in pods
            .iter()
            .filter(|p| p.host_network && p.node == node_name)
        {
            for &ip in &p.ips {
                let a = Addr::from_ip(ip);
                if !node.contains(&a) {
                    node.push(a);
                }
            }
        }
        let mut universe = Universe::new(state, &pods);

        // 3. Policy directions (only those of namespaces with local pods are needed).
        let local: Vec<&PodView<'_>> = pods
            .iter()
            .filter(|p| p.node == node_name && !node_name.is_empty() && !p.host_network)
            .filter(|p| !p.ips.is_empty())
            .collect();
        stats.local_pods = local.len();
        let mut compiled: HashMap<(usize, Direction), PolicyDir> = HashMap::new();
        for ns in local
            .iter()
            .map(|p| p.key.namespace.as_str())
            .collect::<std::collections::BTreeSet<_>>()
        {
            for &i in by_ns.get(ns).into_iter().flatten() {
                for dir in [Direction::Ingress, Direction::Egress] {
                    if policies[i].rules(dir).is_some() {
                        let d = self.compile_dir(&policies[i], dir, &mut universe);
                        compiled.insert((i, dir), d);
                    }
                }
            }
        }

        // 4. Local pods.
        let mut cache: HashMap<DirKey, Arc<DirRules>> = HashMap::new();
        let mut out_pods = Vec::with_capacity(local.len());
        for p in &local {
            let mut lp = LocalPod {
                name: p.key.to_string().into(),
                ..Default::default()
            };
            let selecting: Vec<usize> = by_ns
                .get(p.key.namespace.as_str())
                .into_iter()
                .flatten()
                .copied()
                .filter(|&i| policies[i].subject.matches(p.labels))
                .collect();
            for dir in [Direction::Ingress, Direction::Egress] {
                let sel: Vec<usize> = selecting
                    .iter()
                    .copied()
                    .filter(|&i| policies[i].rules(dir).is_some())
                    .collect();
                if sel.is_empty() {
                    continue;
                }
                let names: Arc<[Arc<str>]> =
                    sel.iter().map(|&i| policies[i].name.clone()).collect();
                let parts: Vec<&PolicyDir> = sel.iter().map(|i| &compiled[&(*i, dir)]).collect();
                let uses_named = parts.iter().any(|d| !d.named_ingress.is_empty());
                let key = DirKey {
                    dir,
                    parts: parts.iter().map(|d| d.fingerprint).collect(),
                    named: if uses_named { p.ports.clone() } else { vec![] },
                };
                let rules = if let Some(r) = cache.get(&key) {
                    stats.reused += 1;
                    r.clone()
                } else if let Some(r) = self.cache.get(&key) {
                    stats.reused += 1;
                    cache.insert(key, r.clone());
                    r.clone()
                } else {
                    stats.built += 1;
                    let r = Arc::new(build_dir(&parts, &p.ports));
                    cache.insert(key, r.clone());
                    r
                };
                match dir {
                    Direction::Ingress => {
                        lp.ingress = Some(rules);
                        lp.ingress_policies = names;
                    }
                    Direction::Egress => {
                        lp.egress = Some(rules);
                        lp.egress_policies = names;
                    }
                }
            }
            if lp.ingress.is_some() || lp.egress.is_some() {
                stats.isolated_pods += 1;
            }
            out_pods.push((lp, p.ips.iter().map(|&ip| Addr::from_ip(ip)).collect()));
        }
        self.cache = cache;
        self.stats = stats;
        (
            PolicyTables::new(out_pods, node, self.rules.clone()),
            problems,
        )
    }
}

/// Builds one pod direction from its selecting policies' parts; `ports` are the pod's named
/// container ports (ingress named ports resolve against them).
fn build_dir(parts: &[&PolicyDir], ports: &[(String, u8, u16)]) -> DirRules {
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
