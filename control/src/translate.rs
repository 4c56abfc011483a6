//! The pure translation from cluster state to dataplane tables: `translate(config, state)`.
//!
//! It follows kube-proxy's nftables proxier (`pkg/proxy/nftables/proxier.go`, `syncProxyRules`)
//! rule for rule; where kube-proxy builds chains, this builds one `Route` per frontend and source
//! class. Choices the Kubernetes docs leave open are stated on the functions below.
//!
//! Nothing here fails as a whole: an object that cannot be translated is skipped and reported as
//! a `Problem`; everything else is built.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kxdp_dataplane::maglev::Maglev;
use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, ListedEndpoints,
    NodeInfo, PrefixSet, Route, ServicePortInfo, Snapshot, SourceClass,
};
use kxdp_packet::Addr;

use crate::config::{Config, LbAlgorithm, NodePortAddress};
use crate::endpoints::{
    categorize, merge_slices, read_slice, Categorized, EndpointInfo, MergedEndpoints, PolicyInfo,
    PortKey, SliceEndpoints, Topology, LABEL_TOPOLOGY_ZONE,
};
use crate::model::{ClusterState, ObjectKey};

/// The annotation cloud providers read when `spec.loadBalancerSourceRanges` is empty.
pub const ANNOTATION_LB_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// A Service's endpoint choice, `maglev` or `random` (default: `loadBalancing.algorithm`).
pub const ANNOTATION_LB_ALGORITHM: &str = "service.kxdp.dev/lb-algorithm";

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when omitted (the API server's default).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10800;

/// Something in the state that could not be translated (the object is skipped, or partly).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `Kind namespace/name` (or `config`).
    pub object: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// The tables built from one state, and what was wrong on the way.
#[derive(Debug)]
pub struct Translation {
    /// `generation` is 0: the publisher sets it.
    pub snapshot: Snapshot,
    pub problems: Vec<Problem>,
}

/// Builds the dataplane tables for this node from the config and the cluster state: every
/// Service through `translate_service`, assembled by `incremental::Builder` (the control loop's
/// partial updates run the same per-Service code).
pub fn translate(config: &Config, state: &ClusterState) -> Translation {
    let mut b = crate::incremental::Builder::new(config.clone());
    let snapshot = b.full(state);
    Translation {
        snapshot,
        problems: b.problems(),
    }
}

/// What every Service's translation shares: this node and the address ranges.
#[derive(Clone, Debug, Default)]
pub struct Globals {
    pub node: NodeInfo,
    pub cluster_cidrs: PrefixSet,
    pub service_cidrs: PrefixSet,
    /// This node's addresses (as `NodeInfo::addrs`, in order).
    pub node_ips: Vec<IpAddr>,
    /// This node's `topology.kubernetes.io/zone`.
    pub zone: String,
    pub problems: Vec<Problem>,
}

/// This node and the address ranges, from the config and the state.
pub fn globals(config: &Config, state: &ClusterState) -> Globals {
    let mut t = Translator::new(config, &[]);
    let (zone, node, node_ips) = t.node_info(state);
    let (cluster_cidrs, service_cidrs) = t.prefix_sets(state);
    let g = Globals {
        node,
        cluster_cidrs,
        service_cidrs,
        node_ips,
        zone,
        problems: t.problems,
    };
    crate::addr_guard::guard_ranges(config, state, g)
}

/// One Service translated: its frontends (not yet checked against other Services' claims), its
/// ClusterIPs, its ports and its problems.
#[derive(Clone, Debug, Default)]
pub struct ServiceOutput {
    /// (key, frontend, is a NodePort): NodePorts yield to every IP frontend (kube-proxy looks an
    /// address and port up among ClusterIPs, externalIPs and LoadBalancer IPs first and tries its
    /// NodePort map only when that misses); otherwise the first Service in namespace/name order
    /// keeps a contested key.
    pub frontends: Vec<(FrontendKey, Frontend, bool)>,
    pub cluster_ips: Vec<Addr>,
    pub ports: Vec<Arc<ServicePortInfo>>,
    /// Per Service port (by id): every endpoint its slices list, whatever its conditions
    /// (`Snapshot::listed_endpoints`).
    pub listed: Vec<(u32, ListedEndpoints)>,
    pub problems: Vec<Problem>,
    /// Service ports with a Local policy, endpoints, none local: (internal, external).
    pub no_local: (i64, i64),
}

/// Translates one Service (pure: the same inputs give the same output).
pub fn translate_service(
    config: &Config,
    g: &Globals,
    key: &ObjectKey,
    svc: &Service,
    state: &ClusterState,
) -> ServiceOutput {
    translate_service_with(config, g, key, svc, state, None)
}

/// `translate_service`, reading the Service's EndpointSlices through `slices` (what was read
/// from them last time; only changed slices are read again). The output is the same with or
/// without it: the cache only saves work.
pub fn translate_service_with(
    config: &Config,
    g: &Globals,
    key: &ObjectKey,
    svc: &Service,
    state: &ClusterState,
    slices: Option<&mut SliceCache>,
) -> ServiceOutput {
    let mut t = Translator::new(config, &g.node_ips);
    let topo = Topology {
        node_name: &config.node_name,
        zone: &g.zone,
        prefer_same_node: config.feature_enabled("PreferSameTrafficDistribution"),
    };
    t.service(key, svc, state, &topo, slices);
    crate::addr_guard::guard_service(g, key, t.finish())
}

/// Services with at least this many EndpointSlices keep each slice read (`SliceCache`): below,
/// comparing a kept slice costs about what reading it again does, and keeping it costs memory.
pub const SLICE_CACHE_MIN_SLICES: usize = 4;

/// The EndpointSlices of the Services that have many (`SLICE_CACHE_MIN_SLICES`), each as last
/// read (`endpoints::read_slice`), with a copy of the slice it was read from, and the Service's
/// endpoints merged from those reads (`endpoints::MergedEndpoints`). A change to one of a
/// 5,000-endpoint Service's 50 slices reads that slice's 100 endpoints again and patches them
/// into the merged lists (a linear pass, no sort), instead of merging 5,000.
///
/// A kept read is used only when its slice is equal to the one in the state (compared whole),
/// so the cache never depends on being told what changed, nor on the order of calls: the
/// translation stays a function of the state, and the same as without the cache.
#[derive(Default)]
pub struct SliceCache {
    by_service: HashMap<ObjectKey, KeptSlices>,
}

/// One Service's slices as last read, in name order, and their merge.
struct KeptSlices {
    slices: Vec<(EndpointSlice, SliceEndpoints)>,
    merged: MergedEndpoints,
}

impl SliceCache {
    /// Forgets the slices of Services for which `keep` is false.
    pub fn retain(&mut self, mut keep: impl FnMut(&ObjectKey) -> bool) {
        self.by_service.retain(|k, _| keep(k));
    }

    /// Forgets one Service's slices.
    pub fn forget(&mut self, service: &ObjectKey) {
        self.by_service.remove(service);
    }

    /// Services whose slices are kept.
    pub fn len(&self) -> usize {
        self.by_service.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_service.is_empty()
    }

    /// `merge_slices` of the Service's slices (`slices`, in name order), reading only those not
    /// kept as they are.
    fn merged(
        &mut self,
        service: &ObjectKey,
        slices: Vec<&EndpointSlice>,
        node_name: &str,
        prefer_same_node_gate: bool,
        problems: &mut Vec<String>,
    ) -> Cow<'_, BTreeMap<PortKey, Vec<EndpointInfo>>> {
        let old = self.by_service.remove(service);
        if slices.len() < SLICE_CACHE_MIN_SLICES {
            return Cow::Owned(merge_slices(
                slices,
                node_name,
                prefer_same_node_gate,
                problems,
            ));
        }
        let read = |s: &EndpointSlice| read_slice(s, node_name, prefer_same_node_gate);
        let same_names = |kept: &KeptSlices| {
            kept.slices.len() == slices.len()
                && kept
                    .slices
                    .iter()
                    .zip(&slices)
                    .all(|((k, _), s)| k.metadata.name == s.metadata.name)
        };
        let kept = match old {
            // The same slices: those that changed are read again and patched in.
            Some(mut kept) if same_names(&kept) => {
                let mut patched = true;
                for (i, s) in slices.iter().enumerate() {
                    if kept.slices[i].0 == **s {
                        continue;
                    }
                    let new = ((*s).clone(), read(s));
                    let (_, was) = std::mem::replace(&mut kept.slices[i], new);
                    patched = patched && kept.merged.replace(&was, &kept.slices[i].1);
                }
                if !patched {
                    kept.merged = MergedEndpoints::new(kept.slices.iter().map(|(_, r)| r));
                }
                kept
            }
            // Slices added, removed or renamed: each read kept as it is used, then merged anew.
            old => {
                let mut old: HashMap<String, (EndpointSlice, SliceEndpoints)> = old
                    .into_iter()
                    .flat_map(|k| k.slices)
                    .map(|(s, r)| (s.metadata.name.clone().unwrap_or_default(), (s, r)))
                    .collect();
                let slices: Vec<(EndpointSlice, SliceEndpoints)> = slices
                    .into_iter()
                    .map(
                        |s| match old.remove(s.metadata.name.as_deref().unwrap_or("")) {
                            Some((copy, r)) if copy == *s => (copy, r),
                            _ => (s.clone(), read(s)),
                        },
                    )
                    .collect();
                let merged = MergedEndpoints::new(slices.iter().map(|(_, r)| r));
                KeptSlices { slices, merged }
            }
        };
        // The problems as `merge_read` gives them: each slice's, in order.
        for (_, r) in &kept.slices {
            problems.extend(r.problems().iter().cloned());
        }
        let kept = self.by_service.entry(service.clone()).insert_entry(kept);
        Cow::Borrowed(&kept.into_mut().merged.lists)
    }
}

/// `service.kubernetes.io/service-proxy-name`: a Service carrying it belongs to another proxy and
/// kube-proxy ignores it (the API source's label selector leaves it out; files are filtered here
/// so that both sources agree).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";

struct Translator<'a> {
    config: &'a Config,
    problems: Vec<Problem>,
    /// This node's addresses (as `NodeInfo::addrs`, in order).
    node_ips: &'a [IpAddr],
    out: ServiceOutput,
    /// `Service namespace/name` of the Service being translated.
    label: String,
}

/// Per-family facts of one Service.
struct FamilyPart {
    v6: bool,
    cluster_ip: IpAddr,
    external_ips: Vec<IpAddr>,
    lb_vips: Vec<IpAddr>,
}

impl<'a> Translator<'a> {
    fn new(config: &'a Config, node_ips: &'a [IpAddr]) -> Translator<'a> {
        Translator {
            config,
            problems: Vec::new(),
            node_ips,
            out: ServiceOutput::default(),
            label: String::new(),
        }
    }

    /// The Service's output: frontends deduplicated (IP frontends first, then the first of
    /// each key), no-local counts, problems.
    fn finish(mut self) -> ServiceOutput {
        let mut fes = std::mem::take(&mut self.out.frontends);
        fes.sort_by_key(|(_, _, np)| *np);
        let mut kept: Vec<(FrontendKey, Frontend, bool)> = Vec::with_capacity(fes.len());
        for (k, fe, np) in fes {
            if let Some((_, other, _)) = kept.iter().find(|(x, _, _)| *x == k) {
                let msg = format!(
                    "{} {}:{} (proto {}) is already {}'s; ignored",
                    fe.kind.as_str(),
                    k.addr,
                    k.port,
                    k.proto,
                    other.service_port.name
                );
                let obj = self.label.clone();
                self.problem(obj, msg);
                continue;
            }
            kept.push((k, fe, np));
        }
        let mut internal: Vec<u32> = Vec::new();
        let mut external: Vec<u32> = Vec::new();
        for (_, fe, _) in &kept {
            let dropped = |c: SourceClass| {
                let r = &fe.routes[c as usize];
                r.endpoints.is_empty() && r.when_empty == EmptyAction::Drop
            };
            let id = fe.service_port.id;
            if fe.kind == FrontendKind::ClusterIp {
                if dropped(SourceClass::Pod) && !internal.contains(&id) {
                    internal.push(id);
                }
            } else if dropped(SourceClass::External) && !external.contains(&id) {
                external.push(id);
            }
        }
        self.out.frontends = kept;
        self.out.no_local = (internal.len() as i64, external.len() as i64);
        self.out.problems = self.problems;
        self.out
    }

    fn problem(&mut self, object: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            object: object.into(),
            message: message.into(),
        });
    }

    /// This node: its name, its addresses and its zone (returned).
    ///
    /// Addresses are the config's `nodeIPs` when given, else the Node object's
    /// `status.addresses` of type InternalIP and ExternalIP, in their order. The SNAT address of a
    /// family is the first address of that family (kube-proxy's primary node IP).
    fn node_info(&mut self, state: &ClusterState) -> (String, NodeInfo, Vec<IpAddr>) {
        let name = self.config.node_name.clone();
        let node: Option<&Node> = state.nodes.get(&name);
        if name.is_empty() {
            self.problem("config", "nodeName is empty: no endpoint is local and Local traffic policies find no endpoints");
        } else if node.is_none() && self.config.node_ips.is_empty() {
            self.problem(
                format!("Node {name}"),
                "not found in the state and no nodeIPs configured: this node has no addresses",
            );
        }
        let mut addrs: Vec<IpAddr> = Vec::new();
        if !self.config.node_ips.is_empty() {
            addrs = self.config.node_ips.clone();
        } else if let Some(node) = node {
            for (i, a) in node
                .status
                .iter()
                .flat_map(|s| s.addresses.iter().flatten())
                .enumerate()
            {
                if a.type_ != "InternalIP" && a.type_ != "ExternalIP" {
                    continue;
                }
                match a.address.trim().parse::<IpAddr>() {
                    Ok(ip) => addrs.push(ip),
                    Err(_) => self.problem(
                        format!("Node {name}"),
                        format!(
                            "status.addresses[{i}].address: invalid IP address `{}`",
                            a.address
                        ),
                    ),
                }
            }
        }
        let mut dedup = Vec::new();
        for a in addrs {
            if !dedup.contains(&a) {
                dedup.push(a);
            }
        }
        let info = NodeInfo {
            name,
            snat_v4: dedup
                .iter()
                .find(|a| a.is_ipv4())
                .map(|&a| Addr::from_ip(a)),
            snat_v6: dedup
                .iter()
                .find(|a| a.is_ipv6())
                .map(|&a| Addr::from_ip(a)),
            addrs: dedup.iter().map(|&a| Addr::from_ip(a)).collect(),
        };
        let zone = node
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
            .cloned()
            .unwrap_or_default();
        (zone, info, dedup)
    }

    /// `cluster_cidrs` = config `clusterCIDRs`; `service_cidrs` = config `serviceCIDRs` and every
    /// ServiceCIDR object's `spec.cidrs`.
    fn prefix_sets(&mut self, state: &ClusterState) -> (PrefixSet, PrefixSet) {
        let mut cluster = PrefixSet::new();
        let mut services = PrefixSet::new();
        for n in &self.config.cluster_cidrs {
            cluster.insert(n.addr(), n.prefix_len());
        }
        for n in &self.config.service_cidrs {
            services.insert(n.addr(), n.prefix_len());
        }
        for (name, sc) in &state.service_cidrs {
            for (i, c) in sc
                .spec
                .iter()
                .flat_map(|s| s.cidrs.iter().flatten())
                .enumerate()
            {
                match c.trim().parse::<IpNet>() {
                    Ok(n) => services.insert(n.addr(), n.prefix_len()),
                    Err(_) => self.problem(
                        format!("ServiceCIDR {name}"),
                        format!("spec.cidrs[{i}]: invalid CIDR `{c}`"),
                    ),
                }
            }
        }
        (cluster, services)
    }

    /// Whether kube-proxy's local-traffic detector exists for a family: a cluster CIDR of it.
    fn has_cluster_cidr(&self, v6: bool) -> bool {
        self.config
            .cluster_cidrs
            .iter()
            .any(|n| matches!(n, IpNet::V6(_)) == v6)
    }

    /// The node addresses of a family that accept NodePorts (kube-proxy's NodePortAddresses):
    /// no CIDR of the family in `nodePortAddresses` means every address of the family (even when
    /// CIDRs of the other family are listed); otherwise the addresses inside one of them;
    /// `primary` means the first address of each family. kube-proxy matches every local address
    /// of the host (`fib daddr type local`); kxdp knows only the node addresses.
    fn node_port_addrs(&self, v6: bool) -> Vec<IpAddr> {
        let of_family = self
            .node_ips
            .iter()
            .copied()
            .filter(|a| a.is_ipv6() == v6 && !a.is_loopback());
        let npa = &self.config.node_port_addresses;
        if npa.contains(&NodePortAddress::Primary) {
            return of_family.take(1).collect();
        }
        let cidrs: Vec<IpNet> = npa
            .iter()
            .filter_map(|a| match a {
                NodePortAddress::Cidr(n) if matches!(n, IpNet::V6(_)) == v6 => Some(*n),
                _ => None,
            })
            .collect();
        if cidrs.is_empty() || cidrs.iter().any(|n| n.prefix_len() == 0) {
            return of_family.collect();
        }
        of_family
            .filter(|a| cidrs.iter().any(|n| n.contains(a)))
            .collect()
    }

    /// One Service. Skipped: ExternalName Services and headless ones (clusterIP `None` or empty),
    /// as kube-proxy's ShouldSkipService. A family is served only when the Service has a
    /// ClusterIP of that family (`clusterIPs`, falling back to `clusterIP`); its externalIPs and
    /// LoadBalancer IPs of other families are ignored, as in kube-proxy's per-family proxiers.
    fn service(
        &mut self,
        key: &ObjectKey,
        svc: &Service,
        state: &ClusterState,
        topo: &Topology<'_>,
        slices: Option<&mut SliceCache>,
    ) {
        let obj = format!("Service {key}");
        self.label = obj.clone();
        if svc
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME))
        {
            return;
        }
        let Some(spec) = svc.spec.as_ref() else {
            self.problem(obj, "no spec");
            return;
        };
        let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
        if type_ == "ExternalName" {
            return;
        }
        let primary = spec.cluster_ip.as_deref().unwrap_or("");
        if primary == "None"
            || (primary.is_empty() && spec.cluster_ips.as_ref().is_none_or(|v| v.is_empty()))
        {
            return;
        }

        // Per-family addresses.
        let ips: Vec<String> = match &spec.cluster_ips {
            Some(v) if !v.is_empty() => v.clone(),
            _ => vec![primary.to_string()],
        };
        let mut families: Vec<FamilyPart> = Vec::new();
        for (i, s) in ips.iter().enumerate() {
            if s == "None" {
                return;
            }
            match crate::validate::ip(s) {
                Ok(ip) if families.iter().any(|f| f.v6 == ip.is_ipv6()) => self.problem(
                    obj.clone(),
                    format!("spec.clusterIPs[{i}]: second ClusterIP of the same family ignored"),
                ),
                Ok(ip) => families.push(FamilyPart {
                    v6: ip.is_ipv6(),
                    cluster_ip: ip,
                    external_ips: vec![],
                    lb_vips: vec![],
                }),
                Err(m) => self.problem(obj.clone(), format!("spec.clusterIPs[{i}]: {m}")),
            }
        }
        if families.is_empty() {
            return;
        }
        for (i, s) in spec.external_ips.iter().flatten().enumerate() {
            match crate::validate::ip(s) {
                Ok(ip) => match families.iter_mut().find(|f| f.v6 == ip.is_ipv6()) {
                    Some(f) => f.external_ips.push(ip),
                    None => {
                        tracing::debug!(service = %key, %ip, "externalIP of a family the Service has no ClusterIP of")
                    }
                },
                Err(m) => self.problem(obj.clone(), format!("spec.externalIPs[{i}]: {m}")),
            }
        }
        // LoadBalancer VIPs: status ingress IPs whose ipMode is VIP (or unset); `Proxy` means the
        // load balancer proxies to the node, so the IP never reaches it as a destination.
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref());
        for (i, ing) in ingress.into_iter().flatten().enumerate() {
            let Some(s) = ing.ip.as_deref().filter(|s| !s.is_empty()) else {
                continue;
            };
            if !matches!(ing.ip_mode.as_deref(), None | Some("VIP")) {
                continue;
            }
            match crate::validate::ip(s) {
                Ok(ip) => {
                    if let Some(f) = families.iter_mut().find(|f| f.v6 == ip.is_ipv6()) {
                        f.lb_vips.push(ip);
                    }
                }
                Err(m) => self.problem(
                    obj.clone(),
                    format!("status.loadBalancer.ingress[{i}].ip: {m}"),
                ),
            }
        }
        let source_ranges = self.source_ranges(&obj, svc);

        for f in &families {
            self.out.cluster_ips.push(Addr::from_ip(f.cluster_ip));
        }

        let node_local_types = matches!(type_, "NodePort" | "LoadBalancer");
        let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
        let external_local =
            node_local_types && spec.external_traffic_policy.as_deref() == Some("Local");
        let affinity = if spec.session_affinity.as_deref() == Some("ClientIP") {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t.map(crate::validate::affinity_timeout) {
                None => DEFAULT_AFFINITY_TIMEOUT_S,
                Some(Ok(t)) => t,
                Some(Err(m)) => {
                    self.problem(obj.clone(), format!("spec.sessionAffinityConfig.clientIP.timeoutSeconds: {m}; using {DEFAULT_AFFINITY_TIMEOUT_S}"));
                    DEFAULT_AFFINITY_TIMEOUT_S
                }
            }
        } else {
            0
        };

        let algorithm = self.lb_algorithm(&obj, svc);

        let mut slice_problems = Vec::new();
        let merged = match slices {
            Some(cache) => cache.merged(
                key,
                state.slices_of(key).collect(),
                &self.config.node_name,
                topo.prefer_same_node,
                &mut slice_problems,
            ),
            None => Cow::Owned(merge_slices(
                state.slices_of(key),
                &self.config.node_name,
                topo.prefer_same_node,
                &mut slice_problems,
            )),
        };
        for m in slice_problems {
            self.problem(obj.clone(), m);
        }

        for (pi, port) in spec.ports.iter().flatten().enumerate() {
            let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
            let proto_num = match crate::validate::protocol(Some(&protocol)) {
                Ok(p) => p,
                Err(m) => {
                    self.problem(
                        obj.clone(),
                        format!("spec.ports[{pi}].protocol: {m}; port skipped"),
                    );
                    continue;
                }
            };
            let number = match crate::validate::port(port.port) {
                Ok(p) => p,
                Err(m) => {
                    self.problem(
                        obj.clone(),
                        format!("spec.ports[{pi}].port: {m}; port skipped"),
                    );
                    continue;
                }
            };
            let node_port = match crate::validate::node_port(port.node_port) {
                Ok(p) => p,
                Err(m) => {
                    self.problem(
                        obj.clone(),
                        format!("spec.ports[{pi}].nodePort: {m}; ignored"),
                    );
                    None
                }
            };
            let port_name = port.name.clone().unwrap_or_default();
            let sp = self.service_port(key, &port_name, &protocol, proto_num, affinity);
            let mut listed: Vec<(Addr, u16)> = Vec::new();

            for f in &families {
                let empty = Vec::new();
                let eps: &Vec<EndpointInfo> = merged
                    .get(&PortKey {
                        v6: f.v6,
                        name: port_name.clone(),
                        protocol: protocol.clone(),
                    })
                    .unwrap_or(&empty);
                listed.extend(eps.iter().map(|e| (Addr::from_ip(e.ip), e.port)));
                let policy = PolicyInfo {
                    internal_local,
                    external_local,
                    externally_accessible: node_port.is_some()
                        || !f.external_ips.is_empty()
                        || !f.lb_vips.is_empty(),
                };
                let cat = categorize(eps, policy, topo);
                let (pool, lists) = self.lists(eps, &cat);
                let maglev = (algorithm == LbAlgorithm::Maglev)
                    .then(|| {
                        let lb = &self.config.load_balancing;
                        Maglev::build(
                            lb.seed(),
                            lb.maglev_table_size,
                            &pool,
                            &[lists.cluster, lists.local],
                        )
                    })
                    .flatten()
                    .map(Arc::new);
                let has_cidr = self.has_cluster_cidr(f.v6);
                let internal =
                    internal_routes(&cat, policy, lists, self.config.masquerade_all, has_cidr);
                let external = external_routes(&cat, policy, lists, has_cidr);

                self.frontend(
                    &obj,
                    FrontendKey {
                        addr: Addr::from_ip(f.cluster_ip),
                        port: number,
                        proto: proto_num,
                    },
                    &sp,
                    FrontendKind::ClusterIp,
                    internal,
                    (&pool, &maglev),
                    None,
                );
                if let Some(np) = node_port {
                    for a in self.node_port_addrs(f.v6) {
                        let key = FrontendKey {
                            addr: Addr::from_ip(a),
                            port: np,
                            proto: proto_num,
                        };
                        self.node_port(key, &sp, external, (&pool, &maglev));
                    }
                }
                for &ip in &f.external_ips {
                    self.frontend(
                        &obj,
                        FrontendKey {
                            addr: Addr::from_ip(ip),
                            port: number,
                            proto: proto_num,
                        },
                        &sp,
                        FrontendKind::ExternalIp,
                        external,
                        (&pool, &maglev),
                        None,
                    );
                }
                let firewall = self.firewall(&source_ranges, f);
                for &ip in &f.lb_vips {
                    self.frontend(
                        &obj,
                        FrontendKey {
                            addr: Addr::from_ip(ip),
                            port: number,
                            proto: proto_num,
                        },
                        &sp,
                        FrontendKind::LoadBalancer,
                        external,
                        (&pool, &maglev),
                        firewall.clone(),
                    );
                }
            }
            listed.sort_unstable();
            listed.dedup();
            self.out.listed.push((sp.id, listed.into()));
        }
    }

    /// The Service port's record (shared by its frontends).
    fn service_port(
        &mut self,
        key: &ObjectKey,
        port_name: &str,
        protocol: &str,
        proto_num: u8,
        affinity: u32,
    ) -> Arc<ServicePortInfo> {
        let name: Arc<str> = if port_name.is_empty() {
            format!("{}/{}", key.namespace, key.name).into()
        } else {
            format!("{}/{}:{port_name}", key.namespace, key.name).into()
        };
        let id = service_port_id(&key.namespace, &key.name, port_name, protocol);
        let sp = Arc::new(ServicePortInfo {
            name,
            id,
            proto: proto_num,
            affinity_timeout_s: affinity,
        });
        self.out.ports.push(sp.clone());
        sp
    }

    /// The endpoints of one Service port and family, and the cluster and local lists as ranges
    /// of them (one list when both are the same).
    fn lists(&mut self, eps: &[EndpointInfo], cat: &Categorized) -> (Arc<[Endpoint]>, Lists) {
        let list = |idx: &[usize]| -> Vec<Endpoint> {
            idx.iter()
                .map(|&i| Endpoint {
                    addr: Addr::from_ip(eps[i].ip),
                    port: eps[i].port,
                    local: eps[i].local,
                })
                .collect()
        };
        let cluster = list(&cat.cluster);
        let local = list(&cat.local);
        let range = |start: usize, len: usize| {
            if len == 0 {
                EndpointRange::EMPTY
            } else {
                EndpointRange {
                    start: start as u32,
                    len: len as u32,
                }
            }
        };
        if cluster == local {
            let l = range(0, cluster.len());
            return (
                cluster.into(),
                Lists {
                    cluster: l,
                    local: l,
                },
            );
        }
        let lists = Lists {
            cluster: range(0, cluster.len()),
            local: range(cluster.len(), local.len()),
        };
        let mut pool = cluster;
        pool.extend_from_slice(&local);
        (pool.into(), lists)
    }

    /// Adds an IP frontend (ClusterIP, externalIP, LoadBalancer VIP). Clashes with other
    /// frontends are settled when the Services are assembled.
    #[allow(clippy::too_many_arguments)]
    fn frontend(
        &mut self,
        _obj: &str,
        key: FrontendKey,
        service_port: &Arc<ServicePortInfo>,
        kind: FrontendKind,
        routes: [Route; 3],
        (endpoints, maglev): (&Arc<[Endpoint]>, &Option<Arc<Maglev>>),
        source_ranges: Option<Arc<PrefixSet>>,
    ) {
        self.out.frontends.push((
            key,
            Frontend {
                service_port: service_port.clone(),
                kind,
                routes,
                endpoints: endpoints.clone(),
                source_ranges,
                maglev: maglev.clone(),
            },
            false,
        ));
    }

    /// Adds a NodePort frontend.
    fn node_port(
        &mut self,
        key: FrontendKey,
        service_port: &Arc<ServicePortInfo>,
        routes: [Route; 3],
        (endpoints, maglev): (&Arc<[Endpoint]>, &Option<Arc<Maglev>>),
    ) {
        self.out.frontends.push((
            key,
            Frontend {
                service_port: service_port.clone(),
                kind: FrontendKind::NodePort,
                routes,
                endpoints: endpoints.clone(),
                source_ranges: None,
                maglev: maglev.clone(),
            },
            true,
        ));
    }

    /// The Service's endpoint choice: the `service.kxdp.dev/lb-algorithm` annotation
    /// (`maglev` or `random`), else `loadBalancing.algorithm`. Another value is reported and
    /// the configured default used.
    fn lb_algorithm(&mut self, obj: &str, svc: &Service) -> LbAlgorithm {
        let default = self.config.load_balancing.algorithm;
        let Some(v) = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_LB_ALGORITHM))
        else {
            return default;
        };
        match LbAlgorithm::parse(v.trim()) {
            Some(a) => a,
            None => {
                let name = match default {
                    LbAlgorithm::Random => "random",
                    LbAlgorithm::Maglev => "maglev",
                };
                self.problem(
                    obj.to_string(),
                    format!(
                        "metadata.annotations[{ANNOTATION_LB_ALGORITHM}]: `{v}` is not `maglev` or `random`; using the configured default, {name}"
                    ),
                );
                default
            }
        }
    }

    /// `spec.loadBalancerSourceRanges` (entries trimmed: validation lets whitespace through), or,
    /// when that is empty, the `service.beta.kubernetes.io/load-balancer-source-ranges` annotation
    /// (comma-separated), the precedence Kubernetes' `GetLoadBalancerSourceRanges` gives them.
    /// (kube-proxy itself reads only the field; the annotation is honoured so that a Service
    /// written for a cloud provider is filtered the same way here.) Invalid entries are skipped
    /// and reported, as kube-proxy skips them.
    fn source_ranges(&mut self, obj: &str, svc: &Service) -> Vec<IpNet> {
        let spec_ranges: Vec<String> = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_source_ranges.clone())
            .unwrap_or_default();
        let (field, raw): (&str, Vec<String>) = if !spec_ranges.is_empty() {
            ("spec.loadBalancerSourceRanges", spec_ranges)
        } else {
            let ann = svc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_LB_SOURCE_RANGES));
            let list = ann
                .map(|v| {
                    v.split(',')
                        .map(|s| s.to_string())
                        .filter(|s| !s.trim().is_empty())
                        .collect()
                })
                .unwrap_or_default();
            (
                "metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]",
                list,
            )
        };
        let mut out = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            match crate::validate::cidr(r) {
                Ok(n) => out.push(n),
                Err(m) => self.problem(obj.to_string(), format!("{field}[{i}]: {m}; skipped")),
            }
        }
        out
    }

    /// The source filter of a family's LoadBalancer frontends (kube-proxy's firewall chain): only
    /// when the Service has VIPs and source ranges of this family (ranges of the other family
    /// alone leave this family open). When a range contains this node's primary address, the VIPs
    /// themselves are allowed too (a node-local VIP loops back with itself as source).
    fn firewall(&self, ranges: &[IpNet], f: &FamilyPart) -> Option<Arc<PrefixSet>> {
        let mine: Vec<&IpNet> = ranges
            .iter()
            .filter(|n| matches!(n, IpNet::V6(_)) == f.v6)
            .collect();
        if mine.is_empty() || f.lb_vips.is_empty() {
            return None;
        }
        let mut set = PrefixSet::new();
        for n in &mine {
            set.insert(n.addr(), n.prefix_len());
        }
        let primary = self.node_ips.iter().find(|a| a.is_ipv6() == f.v6);
        if primary.is_some_and(|p| mine.iter().any(|n| n.contains(p))) {
            for &v in &f.lb_vips {
                set.insert(v, if f.v6 { 128 } else { 32 });
            }
        }
        Some(Arc::new(set))
    }
}

#[derive(Clone, Copy, Debug)]
struct Lists {
    cluster: EndpointRange,
    local: EndpointRange,
}

/// What an empty route does: reject when the Service has no usable endpoint anywhere
/// (kube-proxy's `goto reject-chain`), drop when it has some but none for this traffic
/// (kube-proxy's `drop` verdict for Local policies without local endpoints).
fn when_empty(cat: &Categorized) -> EmptyAction {
    if cat.has_any {
        EmptyAction::Drop
    } else {
        EmptyAction::Reject
    }
}

/// ClusterIP routes. The endpoints are internalTrafficPolicy's list (Cluster: cluster endpoints;
/// Local: local endpoints, none meaning drop). kube-proxy marks for masquerade in the policy
/// chain, for this ClusterIP only: every source with `masqueradeAll`, else sources outside the
/// cluster CIDRs of the family (Node and External classes) when the family has a cluster CIDR
/// (without one kube-proxy has no local-traffic detector and masquerades nothing).
fn internal_routes(
    cat: &Categorized,
    policy: PolicyInfo,
    lists: Lists,
    masquerade_all: bool,
    has_cidr: bool,
) -> [Route; 3] {
    let empty = when_empty(cat);
    let list = if policy.internal_local {
        lists.local
    } else {
        lists.cluster
    };
    if !cat.has_any || list.is_empty() {
        return [Route {
            endpoints: EndpointRange::EMPTY,
            masquerade: false,
            when_empty: empty,
        }; 3];
    }
    SourceClass::ALL.map(|class| Route {
        endpoints: list,
        masquerade: masquerade_all || (has_cidr && class != SourceClass::Pod),
        when_empty: empty,
    })
}

/// Routes of external frontends (NodePort, externalIP, LoadBalancer VIP), kube-proxy's
/// `external-…` chain:
///
/// - externalTrafficPolicy Cluster: every source is masqueraded (the endpoint may be on another
///   node) and goes to the cluster endpoints.
/// - Local: pod sources (inside the family's cluster CIDRs) short-circuit to the cluster
///   endpoints unmasqueraded, as if they had gone out to the load balancer and back; the node's
///   own addresses (`fib saddr type local`) are masqueraded to the cluster endpoints; other
///   sources keep their address and go to the local endpoints, or are dropped when there are
///   none. `masqueradeAll` does not apply: kube-proxy's rule for it names the ClusterIP.
/// - No usable endpoint anywhere: reject, whatever the source.
fn external_routes(
    cat: &Categorized,
    policy: PolicyInfo,
    lists: Lists,
    has_cidr: bool,
) -> [Route; 3] {
    let empty = when_empty(cat);
    let none = Route {
        endpoints: EndpointRange::EMPTY,
        masquerade: false,
        when_empty: empty,
    };
    if !cat.has_any {
        return [none; 3];
    }
    let route = |endpoints: EndpointRange, masquerade: bool| {
        if endpoints.is_empty() {
            none
        } else {
            Route {
                endpoints,
                masquerade,
                when_empty: empty,
            }
        }
    };
    if !policy.external_local {
        return [route(lists.cluster, true); 3];
    }
    let external = route(lists.local, false);
    let mut r = [none; 3];
    r[SourceClass::Pod as usize] = if has_cidr {
        route(lists.cluster, false)
    } else {
        external
    };
    r[SourceClass::Node as usize] = route(lists.cluster, true);
    r[SourceClass::External as usize] = external;
    r
}

/// A stable id for a Service port: FNV-1a (32 bit) over namespace, name, port name and protocol,
/// NUL-separated; never 0 (0 means "no service" in verdicts). The same in every run and build.
pub fn service_port_id(namespace: &str, name: &str, port_name: &str, protocol: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for (i, part) in [namespace, name, port_name, protocol].iter().enumerate() {
        if i > 0 {
            // A NUL separator byte: xor with 0 is the identity, only the multiply remains.
            h = h.wrapping_mul(0x0100_0193);
        }
        for b in part.bytes() {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    if h == 0 {
        1
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::files::load_str_unvalidated;
    use kxdp_packet::proto::{SCTP, TCP, UDP};
    use std::path::Path;

    const BASE: &str = "apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: node-a
nodeIPs: [192.168.0.2, \"fd00:1::2\"]
clusterCIDRs: [10.0.0.0/8, \"fd00::/48\"]
serviceCIDRs: [172.30.0.0/16]
";

    fn cfg(extra: &str) -> Config {
        Config::from_yaml_str(&format!("{BASE}{extra}"), Path::new("config.yaml")).unwrap()
    }

    fn tr(config: &Config, yaml: &str) -> Translation {
        let mut state = ClusterState::new();
        load_str_unvalidated(yaml, Path::new("state.yaml"), &mut state).unwrap();
        let t = translate(config, &state);
        t.snapshot.validate().unwrap();
        t
    }

    fn fe<'a>(s: &'a Snapshot, ip: &str, port: u16, proto: u8) -> &'a Frontend {
        let key = FrontendKey {
            addr: Addr::from_ip(ip.parse().unwrap()),
            port,
            proto,
        };
        s.frontend(&key)
            .unwrap_or_else(|| panic!("no frontend {ip}:{port}/{proto}"))
    }

    fn has_fe(s: &Snapshot, ip: &str, port: u16, proto: u8) -> bool {
        s.frontend(&FrontendKey {
            addr: Addr::from_ip(ip.parse().unwrap()),
            port,
            proto,
        })
        .is_some()
    }

    /// A route as text: `M ip:port,...` (masqueraded) / `- ip:port,...`, or `reject` / `drop`.
    fn route(s: &Snapshot, r: &Route) -> String {
        if r.endpoints.is_empty() {
            assert!(!r.masquerade);
            return match r.when_empty {
                EmptyAction::Reject => "reject".into(),
                EmptyAction::Drop => "drop".into(),
            };
        }
        // The frontend this route belongs to (`r` points into one of `s`'s frontends).
        let f = s
            .frontends
            .iter()
            .map(|(_, f)| f)
            .find(|f| f.routes.iter().any(|x| std::ptr::eq(x, r)))
            .expect("route of a frontend of this snapshot");
        let eps: Vec<String> = f
            .endpoints_of(r.endpoints)
            .iter()
            .map(|e| {
                let ip = if e.addr.is_v4_mapped() {
                    e.addr.to_ip(kxdp_packet::Family::V4)
                } else {
                    e.addr.to_ip(kxdp_packet::Family::V6)
                };
                format!(
                    "{}{}",
                    std::net::SocketAddr::new(ip, e.port),
                    if e.local { "(L)" } else { "" }
                )
            })
            .collect();
        format!("{} {}", if r.masquerade { "M" } else { "-" }, eps.join(","))
    }

    /// Routes for [Pod, Node, External].
    fn routes(s: &Snapshot, f: &Frontend) -> [String; 3] {
        [
            route(s, &f.routes[0]),
            route(s, &f.routes[1]),
            route(s, &f.routes[2]),
        ]
    }

    fn svc_port<'a>(_s: &Snapshot, f: &'a Frontend) -> &'a ServicePortInfo {
        &f.service_port
    }

    fn service(name: &str, spec: &str) -> String {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n{spec}\n")
    }

    fn slice(name: &str, svc: &str, family: &str, ports: &str, endpoints: &str) -> String {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, namespace: ns, labels: {{kubernetes.io/service-name: {svc}}}}}\naddressType: {family}\nports: {ports}\nendpoints:\n{endpoints}\n"
        )
    }

    /// Two endpoints, one on this node.
    fn web_slice(svc: &str) -> String {
        slice(
            &format!("{svc}-1"),
            svc,
            "IPv4",
            "[{name: http, port: 8080}]",
            "- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a}",
        )
    }

    const WEB: &str =
        "  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, targetPort: 8080}]";

    #[test]
    fn cluster_ip_basic() {
        let t = tr(
            &cfg(""),
            &format!("{}{}", service("web", WEB), web_slice("web")),
        );
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        let s = &t.snapshot;
        let f = fe(s, "172.30.0.10", 80, TCP);
        assert_eq!(f.kind, FrontendKind::ClusterIp);
        assert!(f.source_ranges.is_none());
        // Pods keep their address; other sources are masqueraded (kube-proxy's IfNotLocal rule).
        assert_eq!(
            routes(s, f),
            [
                "- 10.1.0.1:8080,10.1.0.2:8080(L)",
                "M 10.1.0.1:8080,10.1.0.2:8080(L)",
                "M 10.1.0.1:8080,10.1.0.2:8080(L)"
            ]
        );
        let sp = svc_port(s, f);
        assert_eq!(&*sp.name, "ns/web:http");
        assert_eq!(sp.id, service_port_id("ns", "web", "http", "TCP"));
        assert_eq!(sp.proto, TCP);
        assert_eq!(sp.affinity_timeout_s, 0);
        assert!(s
            .cluster_ips
            .contains(&Addr::from_ip("172.30.0.10".parse().unwrap())));
        assert_eq!(s.frontends.len(), 1);
        assert_eq!(s.node.name, "node-a");
        assert_eq!(
            s.node.snat_v4,
            Some(Addr::from_ip("192.168.0.2".parse().unwrap()))
        );
        assert_eq!(
            s.node.snat_v6,
            Some(Addr::from_ip("fd00:1::2".parse().unwrap()))
        );
        assert_eq!(s.node.addrs.len(), 2);
        assert!(s.cluster_cidrs.contains(
            &Addr::from_ip("10.9.9.9".parse().unwrap()),
            kxdp_packet::Family::V4
        ));
        assert!(s.service_cidrs.contains(
            &Addr::from_ip("172.30.9.9".parse().unwrap()),
            kxdp_packet::Family::V4
        ));
        assert_eq!(s.generation, 0);
    }

    #[test]
    fn masquerade_settings() {
        let yaml = format!("{}{}", service("web", WEB), web_slice("web"));
        let t = tr(&cfg("masqueradeAll: true\n"), &yaml);
        let f = fe(&t.snapshot, "172.30.0.10", 80, TCP);
        assert!(f.routes.iter().all(|r| r.masquerade));
        // Without cluster CIDRs kube-proxy cannot tell pod traffic and masquerades nothing.
        let c = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2]\n",
            Path::new("c.yaml"),
        )
        .unwrap();
        let t = tr(&c, &yaml);
        let f = fe(&t.snapshot, "172.30.0.10", 80, TCP);
        assert!(f
            .routes
            .iter()
            .all(|r| !r.masquerade && r.endpoints.len == 2));
        // A v4-only cluster CIDR leaves IPv6 ClusterIPs unmasqueraded.
        let c = cfg("").clone();
        let mut c4 = c;
        c4.cluster_cidrs.retain(|n| matches!(n, IpNet::V4(_)));
        let yaml6 = format!(
            "{}{}",
            service(
                "v6",
                "  clusterIP: fd00:30::10\n  ports: [{name: http, port: 80}]"
            ),
            slice(
                "v6-1",
                "v6",
                "IPv6",
                "[{name: http, port: 8080}]",
                "- {addresses: [\"fd00::5\"]}"
            )
        );
        let t = tr(&c4, &yaml6);
        let f = fe(&t.snapshot, "fd00:30::10", 80, TCP);
        assert_eq!(
            routes(&t.snapshot, f),
            ["- [fd00::5]:8080", "- [fd00::5]:8080", "- [fd00::5]:8080"]
        );
    }

    #[test]
    fn skipped_services() {
        let yaml = [
            service("headless", "  clusterIP: None\n  ports: [{port: 80}]"),
            service("headless2", "  clusterIP: None\n  clusterIPs: [None]\n  ports: [{port: 80}]"),
            service("ext", "  type: ExternalName\n  externalName: example.com\n  clusterIP: 172.30.0.99\n  ports: [{port: 80}]"),
            service("unallocated", "  ports: [{port: 80}]"),
            web_slice("headless"),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        assert!(t.snapshot.frontends.is_empty());
        assert!(t.snapshot.cluster_ips.is_empty());
        assert!(t.snapshot.service_ports.is_empty());
        assert!(t.problems.is_empty(), "{:?}", t.problems);
    }

    #[test]
    fn multi_slice_merge_duplicates_and_named_ports() {
        let yaml = [
            service("web", "  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}, {name: sctp, port: 9, protocol: SCTP}]"),
            slice("web-a", "web", "IPv4", "[{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]", "- {addresses: [10.1.0.1]}\n- {addresses: [10.1.0.2]}"),
            // Same port name with another number in this slice; one duplicate endpoint.
            slice("web-b", "web", "IPv4", "[{name: http, port: 8081}, {name: sctp, port: 99, protocol: SCTP}]", "- {addresses: [10.1.0.3]}"),
            slice("web-c", "web", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.1.0.1]}"),
            // Another Service's slice and an unlabelled one do not leak in.
            slice("other-1", "other", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.9.0.1]}"),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        let http = fe(s, "172.30.0.10", 80, TCP);
        assert_eq!(
            route(s, &http.routes[0]),
            "- 10.1.0.1:8080,10.1.0.2:8080,10.1.0.3:8081"
        );
        let dns = fe(s, "172.30.0.10", 53, UDP);
        assert_eq!(route(s, &dns.routes[0]), "- 10.1.0.1:5353,10.1.0.2:5353");
        assert_eq!(&*svc_port(s, dns).name, "ns/web:dns");
        assert_eq!(svc_port(s, dns).proto, UDP);
        let sctp = fe(s, "172.30.0.10", 9, SCTP);
        assert_eq!(route(s, &sctp.routes[0]), "- 10.1.0.3:99");
        // TCP 53 is not a frontend.
        assert!(!has_fe(s, "172.30.0.10", 53, TCP));
        assert_eq!(s.service_ports.len(), 3);
        let ids: std::collections::HashSet<u32> =
            s.service_ports.iter().map(|(_, p)| p.id).collect();
        assert_eq!(ids.len(), 3);
    }

    #[test]
    fn unnamed_port_and_protocol_defaults() {
        let yaml = [
            service("one", "  clusterIP: 172.30.0.11\n  ports: [{port: 80}]"),
            slice(
                "one-1",
                "one",
                "IPv4",
                "[{port: 8080}]",
                "- {addresses: [10.1.0.1]}",
            ),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        let f = fe(&t.snapshot, "172.30.0.11", 80, TCP);
        assert_eq!(&*svc_port(&t.snapshot, f).name, "ns/one");
        assert_eq!(route(&t.snapshot, &f.routes[0]), "- 10.1.0.1:8080");
    }

    #[test]
    fn bad_ports_and_ips_are_problems() {
        let yaml = [
            service("bad", "  clusterIP: 172.30.0.12\n  ports: [{name: a, port: 80, protocol: ICMP}, {name: b, port: 70000}, {name: c, port: 81}]"),
            service("badip", "  clusterIP: 172.30.0.300\n  ports: [{port: 80}]"),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        assert!(has_fe(&t.snapshot, "172.30.0.12", 81, TCP));
        assert_eq!(t.snapshot.frontends.len(), 1);
        let msgs: Vec<String> = t.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs[0].starts_with("Service ns/bad: spec.ports[0].protocol"),
            "{msgs:?}"
        );
        assert!(
            msgs[1].starts_with("Service ns/bad: spec.ports[1].port"),
            "{msgs:?}"
        );
        assert!(
            msgs[2].starts_with(
                "Service ns/badip: spec.clusterIPs[0]: `172.30.0.300` is not a valid IP"
            ),
            "{msgs:?}"
        );
    }

    #[test]
    fn no_endpoints_rejects() {
        let t = tr(&cfg(""), &service("empty", "  type: NodePort\n  clusterIP: 172.30.0.13\n  ports: [{port: 80, nodePort: 30080}]"));
        let s = &t.snapshot;
        for f in [
            fe(s, "172.30.0.13", 80, TCP),
            fe(s, "192.168.0.2", 30080, TCP),
        ] {
            assert_eq!(routes(s, f), ["reject", "reject", "reject"]);
        }
        // Only unusable endpoints (not ready, not terminating): still no endpoints.
        let yaml = format!(
            "{}{}",
            service("empty", WEB),
            slice(
                "e-1",
                "empty",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], conditions: {ready: false, serving: true}}"
            )
        );
        let t = tr(&cfg(""), &yaml);
        assert_eq!(
            routes(&t.snapshot, fe(&t.snapshot, "172.30.0.10", 80, TCP)),
            ["reject", "reject", "reject"]
        );
    }

    #[test]
    fn terminating_fallback() {
        let yaml = format!(
            "{}{}",
            service("web", WEB),
            slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], conditions: {ready: false, serving: true, terminating: true}}\n- {addresses: [10.1.0.2], conditions: {ready: false, serving: false, terminating: true}}"
            )
        );
        let t = tr(&cfg(""), &yaml);
        assert_eq!(
            route(
                &t.snapshot,
                &fe(&t.snapshot, "172.30.0.10", 80, TCP).routes[0]
            ),
            "- 10.1.0.1:8080"
        );
    }

    #[test]
    fn node_port_cluster_policy() {
        let yaml = format!("{}{}", service("web", "  type: NodePort\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]"), web_slice("web"));
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        let f = fe(s, "192.168.0.2", 30080, TCP);
        assert_eq!(f.kind, FrontendKind::NodePort);
        let all = "M 10.1.0.1:8080,10.1.0.2:8080(L)";
        assert_eq!(routes(s, f), [all, all, all]);
        // IPv4-only Service: no NodePort on the IPv6 node address.
        assert!(!has_fe(s, "fd00:1::2", 30080, TCP));
        // The ClusterIP and the NodePort share the endpoint list.
        assert_eq!(
            fe(s, "172.30.0.10", 80, TCP).routes[0].endpoints,
            f.routes[0].endpoints
        );
        assert!(Arc::ptr_eq(
            &fe(s, "172.30.0.10", 80, TCP).endpoints,
            &f.endpoints
        ));
        assert_eq!(f.endpoints.len(), 2);
    }

    #[test]
    fn node_port_addresses() {
        let yaml = [
            service("web", "  type: NodePort\n  ipFamilyPolicy: PreferDualStack\n  clusterIPs: [172.30.0.10, \"fd00:30::10\"]\n  ports: [{name: http, port: 80, nodePort: 30080}]"),
            web_slice("web"),
        ]
        .concat();
        let ips = "nodeIPs: [192.168.0.2, 10.200.0.2, \"fd00:1::2\", \"fd00:2::2\"]\n";
        let base = format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nclusterCIDRs: [10.0.0.0/16]\n{ips}");
        let mk = |extra: &str| {
            Config::from_yaml_str(&format!("{base}{extra}"), Path::new("c.yaml")).unwrap()
        };
        let cases: &[(&str, &[&str])] = &[
            ("", &["192.168.0.2", "10.200.0.2", "fd00:1::2", "fd00:2::2"]),
            (
                "nodePortAddresses: []\n",
                &["192.168.0.2", "10.200.0.2", "fd00:1::2", "fd00:2::2"],
            ),
            // A v4 CIDR filters v4; no v6 CIDR means every v6 address (kube-proxy).
            (
                "nodePortAddresses: [192.168.0.0/24]\n",
                &["192.168.0.2", "fd00:1::2", "fd00:2::2"],
            ),
            (
                "nodePortAddresses: [192.168.0.0/24, \"fd00:2::/64\"]\n",
                &["192.168.0.2", "fd00:2::2"],
            ),
            // CIDRs of a family that match no address: no NodePort on that family.
            (
                "nodePortAddresses: [172.16.0.0/12, \"fd00:2::/64\"]\n",
                &["fd00:2::2"],
            ),
            (
                "nodePortAddresses: [0.0.0.0/0, 10.200.0.0/16]\n",
                &["192.168.0.2", "10.200.0.2", "fd00:1::2", "fd00:2::2"],
            ),
            (
                "nodePortAddresses: [primary]\n",
                &["192.168.0.2", "fd00:1::2"],
            ),
        ];
        for (extra, want) in cases {
            let t = tr(&mk(extra), &yaml);
            let mut got: Vec<String> = t
                .snapshot
                .frontends
                .keys()
                .filter(|k| k.port == 30080)
                .map(|k| k.addr.to_string())
                .collect();
            got.sort();
            let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            want.sort();
            assert_eq!(got, want, "{extra}");
        }
    }

    fn etp_local(eps: &str) -> String {
        [
            service("web", "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  externalIPs: [203.0.113.7]\n  ports: [{name: http, port: 80, nodePort: 30080}]"),
            slice("web-1", "web", "IPv4", "[{name: http, port: 8080}]", eps),
        ]
        .concat()
    }

    #[test]
    fn external_traffic_policy_local() {
        let t = tr(&cfg(""), &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a}"));
        let s = &t.snapshot;
        let all = "10.1.0.1:8080,10.1.0.2:8080(L)";
        for f in [
            fe(s, "192.168.0.2", 30080, TCP),
            fe(s, "203.0.113.7", 80, TCP),
        ] {
            // Pods short-circuit unmasqueraded, the node is masqueraded, outsiders keep their
            // address and reach only local endpoints.
            assert_eq!(
                routes(s, f),
                [
                    format!("- {all}"),
                    format!("M {all}"),
                    "- 10.1.0.2:8080(L)".to_string()
                ]
            );
        }
        assert_eq!(fe(s, "203.0.113.7", 80, TCP).kind, FrontendKind::ExternalIp);
        // The ClusterIP is not affected by eTP.
        assert_eq!(
            routes(s, fe(s, "172.30.0.10", 80, TCP))[2],
            format!("M {all}")
        );

        // No local endpoint: outsiders are dropped, pods and the node still get through.
        let t = tr(
            &cfg(""),
            &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}"),
        );
        let s = &t.snapshot;
        let f = fe(s, "192.168.0.2", 30080, TCP);
        assert_eq!(routes(s, f), ["- 10.1.0.1:8080", "M 10.1.0.1:8080", "drop"]);

        // Local endpoint terminating but serving: used for outsiders (graceful drain).
        let t = tr(
            &cfg(""),
            &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}"),
        );
        let s = &t.snapshot;
        assert_eq!(
            routes(s, fe(s, "192.168.0.2", 30080, TCP)),
            ["- 10.1.0.1:8080", "M 10.1.0.1:8080", "- 10.1.0.2:8080(L)"]
        );
    }

    #[test]
    fn external_traffic_policy_local_without_cluster_cidrs() {
        let c = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2]\n",
            Path::new("c.yaml"),
        )
        .unwrap();
        let t = tr(&c, &etp_local("- {addresses: [10.1.0.1], nodeName: node-b}\n- {addresses: [10.1.0.2], nodeName: node-a}"));
        let s = &t.snapshot;
        // No pod short-circuit: the Pod class (never produced) follows the external route.
        assert_eq!(
            routes(s, fe(s, "192.168.0.2", 30080, TCP)),
            [
                "- 10.1.0.2:8080(L)",
                "M 10.1.0.1:8080,10.1.0.2:8080(L)",
                "- 10.1.0.2:8080(L)"
            ]
        );
    }

    #[test]
    fn etp_local_only_means_something_for_nodeport_and_lb() {
        let yaml = [
            service("web", "  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  externalIPs: [203.0.113.7]\n  ports: [{name: http, port: 80}]"),
            web_slice("web"),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        let all = "M 10.1.0.1:8080,10.1.0.2:8080(L)";
        assert_eq!(routes(s, fe(s, "203.0.113.7", 80, TCP)), [all, all, all]);
    }

    #[test]
    fn internal_traffic_policy_local() {
        let svc = "  internalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80}]";
        let t = tr(
            &cfg(""),
            &format!("{}{}", service("web", svc), web_slice("web")),
        );
        let s = &t.snapshot;
        assert_eq!(
            routes(s, fe(s, "172.30.0.10", 80, TCP)),
            [
                "- 10.1.0.2:8080(L)",
                "M 10.1.0.2:8080(L)",
                "M 10.1.0.2:8080(L)"
            ]
        );
        // Endpoints only elsewhere: drop (not reject).
        let yaml = format!(
            "{}{}",
            service("web", svc),
            slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], nodeName: node-b}"
            )
        );
        let t = tr(&cfg(""), &yaml);
        assert_eq!(
            routes(&t.snapshot, fe(&t.snapshot, "172.30.0.10", 80, TCP)),
            ["drop", "drop", "drop"]
        );
        // iTP Local + NodePort eTP Cluster: NodePort uses the cluster list.
        let svc2 = "  type: NodePort\n  internalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]";
        let yaml = format!(
            "{}{}",
            service("web", svc2),
            slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], nodeName: node-b}"
            )
        );
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        assert_eq!(
            routes(s, fe(s, "172.30.0.10", 80, TCP)),
            ["drop", "drop", "drop"]
        );
        assert_eq!(
            routes(s, fe(s, "192.168.0.2", 30080, TCP)),
            ["M 10.1.0.1:8080", "M 10.1.0.1:8080", "M 10.1.0.1:8080"]
        );
        // iTP Local and eTP Local, no local endpoints: pods and node short-circuit to the
        // cluster endpoints (kube-proxy keeps cluster endpoints for externally reachable ports).
        let svc3 = "  type: NodePort\n  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]";
        let yaml = format!(
            "{}{}",
            service("web", svc3),
            slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], nodeName: node-b}"
            )
        );
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        assert_eq!(
            routes(s, fe(s, "192.168.0.2", 30080, TCP)),
            ["- 10.1.0.1:8080", "M 10.1.0.1:8080", "drop"]
        );
    }

    #[test]
    fn dual_stack() {
        let yaml = [
            service("ds", "  type: NodePort\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: \"fd00:30::20\"\n  clusterIPs: [\"fd00:30::20\", 172.30.0.20]\n  externalIPs: [203.0.113.8, \"2001:db8::8\"]\n  ports: [{name: http, port: 80, nodePort: 30081}]"),
            slice("ds-v4", "ds", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.1.0.5]}"),
            slice("ds-v6", "ds", "IPv6", "[{name: http, port: 8080}]", "- {addresses: [\"fd00::5\"], nodeName: node-a}"),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        let s = &t.snapshot;
        assert_eq!(
            route(s, &fe(s, "172.30.0.20", 80, TCP).routes[0]),
            "- 10.1.0.5:8080"
        );
        assert_eq!(
            route(s, &fe(s, "fd00:30::20", 80, TCP).routes[0]),
            "- [fd00::5]:8080(L)"
        );
        assert_eq!(
            route(s, &fe(s, "192.168.0.2", 30081, TCP).routes[2]),
            "M 10.1.0.5:8080"
        );
        assert_eq!(
            route(s, &fe(s, "fd00:1::2", 30081, TCP).routes[2]),
            "M [fd00::5]:8080(L)"
        );
        assert_eq!(
            route(s, &fe(s, "203.0.113.8", 80, TCP).routes[2]),
            "M 10.1.0.5:8080"
        );
        assert_eq!(
            route(s, &fe(s, "2001:db8::8", 80, TCP).routes[2]),
            "M [fd00::5]:8080(L)"
        );
        assert_eq!(s.cluster_ips.len(), 2);
        // One service port for both families.
        assert_eq!(s.service_ports.len(), 1);
        assert_eq!(s.frontends.len(), 6);

        // Single-stack v4 with a v6 externalIP: ignored, as in kube-proxy's per-family proxiers.
        let yaml = [
            service(
                "v4",
                "  clusterIP: 172.30.0.21\n  externalIPs: [\"2001:db8::9\"]\n  ports: [{port: 80}]",
            ),
            slice(
                "v4-6",
                "v4",
                "IPv6",
                "[{port: 8080}]",
                "- {addresses: [\"fd00::5\"]}",
            ),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        assert!(!has_fe(&t.snapshot, "2001:db8::9", 80, TCP));
        // IPv6 endpoints never serve the IPv4 ClusterIP.
        assert_eq!(
            routes(&t.snapshot, fe(&t.snapshot, "172.30.0.21", 80, TCP))[0],
            "reject"
        );
    }

    fn lb(extra_spec: &str, ingress: &str, annotations: &str) -> String {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: lb, namespace: ns{annotations}}}\nspec:\n  type: LoadBalancer\n  clusterIP: 172.30.0.30\n  ports: [{{name: http, port: 80, nodePort: 30090}}]\n{extra_spec}\nstatus:\n  loadBalancer:\n    ingress: {ingress}\n{}",
            web_slice("lb")
        )
    }

    #[test]
    fn load_balancer_vips_and_ip_mode() {
        let t = tr(&cfg(""), &lb("", "[{ip: 198.51.100.1}, {ip: 198.51.100.2, ipMode: VIP}, {ip: 198.51.100.3, ipMode: Proxy}, {hostname: lb.example.com}]", ""));
        let s = &t.snapshot;
        let f = fe(s, "198.51.100.1", 80, TCP);
        assert_eq!(f.kind, FrontendKind::LoadBalancer);
        assert!(f.source_ranges.is_none());
        assert_eq!(routes(s, f)[2], "M 10.1.0.1:8080,10.1.0.2:8080(L)");
        assert!(has_fe(s, "198.51.100.2", 80, TCP));
        assert!(!has_fe(s, "198.51.100.3", 80, TCP));
        assert!(has_fe(s, "192.168.0.2", 30090, TCP));
        assert_eq!(s.frontends.len(), 4);
    }

    fn ranges(f: &Frontend) -> Vec<String> {
        let mut v: Vec<String> = f
            .source_ranges
            .as_ref()
            .unwrap()
            .iter()
            .map(|(a, l)| format!("{a}/{l}"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn load_balancer_source_ranges() {
        let t = tr(
            &cfg(""),
            &lb(
                "  loadBalancerSourceRanges: [\" 203.0.113.0/24 \", \"2001:db8::/32\"]",
                "[{ip: 198.51.100.1}]",
                "",
            ),
        );
        let s = &t.snapshot;
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        assert_eq!(ranges(fe(s, "198.51.100.1", 80, TCP)), ["203.0.113.0/24"]);
        // NodePorts and ClusterIPs are never filtered.
        assert!(fe(s, "192.168.0.2", 30090, TCP).source_ranges.is_none());
        assert!(fe(s, "172.30.0.30", 80, TCP).source_ranges.is_none());

        // A range containing the node's primary address also lets the VIPs in (hairpin).
        let t = tr(
            &cfg(""),
            &lb(
                "  loadBalancerSourceRanges: [192.168.0.0/16]",
                "[{ip: 198.51.100.1}, {ip: 198.51.100.2}]",
                "",
            ),
        );
        assert_eq!(
            ranges(fe(&t.snapshot, "198.51.100.1", 80, TCP)),
            ["192.168.0.0/16", "198.51.100.1/32", "198.51.100.2/32"]
        );

        // Ranges of the other family only: this family is open.
        let t = tr(
            &cfg(""),
            &lb(
                "  loadBalancerSourceRanges: [\"2001:db8::/32\"]",
                "[{ip: 198.51.100.1}]",
                "",
            ),
        );
        assert!(fe(&t.snapshot, "198.51.100.1", 80, TCP)
            .source_ranges
            .is_none());

        // The annotation when the field is empty; the field wins when both are set.
        let ann = ", annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: \"10.0.0.0/8, 172.16.0.0/12\"}";
        let t = tr(&cfg(""), &lb("", "[{ip: 198.51.100.1}]", ann));
        assert_eq!(
            ranges(fe(&t.snapshot, "198.51.100.1", 80, TCP)),
            ["10.0.0.0/8", "172.16.0.0/12"]
        );
        let t = tr(
            &cfg(""),
            &lb(
                "  loadBalancerSourceRanges: [203.0.113.0/24]",
                "[{ip: 198.51.100.1}]",
                ann,
            ),
        );
        assert_eq!(
            ranges(fe(&t.snapshot, "198.51.100.1", 80, TCP)),
            ["203.0.113.0/24"]
        );

        // Invalid entries are skipped and reported.
        let t = tr(
            &cfg(""),
            &lb(
                "  loadBalancerSourceRanges: [bogus, 203.0.113.0/24]",
                "[{ip: 198.51.100.1}]",
                "",
            ),
        );
        assert_eq!(
            ranges(fe(&t.snapshot, "198.51.100.1", 80, TCP)),
            ["203.0.113.0/24"]
        );
        assert_eq!(t.problems.len(), 1);
        assert!(t.problems[0]
            .message
            .contains("loadBalancerSourceRanges[0]"));
    }

    fn annotated(algorithm: &str, spec: &str) -> String {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: ns, annotations: {{service.kxdp.dev/lb-algorithm: {algorithm}}}}}\nspec:\n{spec}\n")
    }

    #[test]
    fn lb_algorithm_annotation_and_default() {
        let np = "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]";
        let yaml = [annotated("maglev", np), web_slice("web")].concat();
        let t = tr(&cfg(""), &yaml);
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        let s = &t.snapshot;
        let cip = fe(s, "172.30.0.10", 80, TCP);
        let node = fe(s, "192.168.0.2", 30080, TCP);
        let m = cip.maglev.as_ref().expect("maglev tables");
        // One table per route list: the cluster list (2) and the local one (1), shared by the
        // Service port's frontends.
        assert!(Arc::ptr_eq(m, node.maglev.as_ref().unwrap()));
        let lists: Vec<(EndpointRange, usize)> = m.tables().map(|(r, t)| (r, t.len())).collect();
        assert_eq!(
            lists,
            [
                (EndpointRange { start: 0, len: 2 }, 251),
                (EndpointRange { start: 2, len: 1 }, 251)
            ]
        );
        for r in &node.routes {
            assert!(r.endpoints.is_empty() || m.table(r.endpoints).is_some());
        }
        // The lookup sees the tables through the frontend table's hot line.
        let key = FrontendKey {
            addr: Addr::from_ip("192.168.0.2".parse().unwrap()),
            port: 30080,
            proto: TCP,
        };
        let r = s.frontend_ref(&key).unwrap();
        assert!(r.maglev().is_some());
        assert_eq!(r.route(SourceClass::External), node.routes[2]);

        // `random`, and no annotation: no tables.
        let yaml = [annotated("random", np), web_slice("web")].concat();
        let t = tr(&cfg(""), &yaml);
        assert!(fe(&t.snapshot, "172.30.0.10", 80, TCP).maglev.is_none());
        assert!(t.problems.is_empty());
        let plain = [service("web", np), web_slice("web")].concat();
        let t = tr(&cfg(""), &plain);
        assert!(fe(&t.snapshot, "172.30.0.10", 80, TCP).maglev.is_none());

        // The configured default applies without the annotation; the annotation overrides it.
        let mag = cfg("loadBalancing: {algorithm: maglev, maglevTableSize: 1021, maglevSeed: 42}");
        let t = tr(&mag, &plain);
        let m = fe(&t.snapshot, "172.30.0.10", 80, TCP)
            .maglev
            .clone()
            .unwrap();
        assert_eq!(m.seed(), kxdp_dataplane::maglev::seed_of("42"));
        let t = tr(&mag, &yaml);
        assert!(fe(&t.snapshot, "172.30.0.10", 80, TCP).maglev.is_none());

        // A value that is neither: reported, and the configured default used.
        let bad = [annotated("ring-hash", np), web_slice("web")].concat();
        let t = tr(&cfg(""), &bad);
        assert!(fe(&t.snapshot, "172.30.0.10", 80, TCP).maglev.is_none());
        assert_eq!(t.problems.len(), 1, "{:?}", t.problems);
        assert_eq!(t.problems[0].object, "Service ns/web");
        assert_eq!(
            t.problems[0].message,
            "metadata.annotations[service.kxdp.dev/lb-algorithm]: `ring-hash` is not `maglev` or `random`; using the configured default, random"
        );
        let t = tr(&mag, &bad);
        assert!(fe(&t.snapshot, "172.30.0.10", 80, TCP).maglev.is_some());
        assert!(t.problems[0].message.ends_with("default, maglev"));
    }

    #[test]
    fn session_affinity() {
        let cases = [
            ("", 0),
            ("  sessionAffinity: None\n", 0),
            ("  sessionAffinity: ClientIP\n", 10800),
            ("  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n", 60),
        ];
        for (extra, want) in cases {
            let t = tr(
                &cfg(""),
                &format!(
                    "{}{}",
                    service("web", &format!("{extra}{WEB}")),
                    web_slice("web")
                ),
            );
            let f = fe(&t.snapshot, "172.30.0.10", 80, TCP);
            assert_eq!(svc_port(&t.snapshot, f).affinity_timeout_s, want, "{extra}");
        }
    }

    #[test]
    fn service_cidrs_from_objects() {
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: extra}\nspec: {cidrs: [172.31.0.0/16, \"fd00:31::/108\", nope]}\n";
        let t = tr(&cfg(""), yaml);
        let s = &t.snapshot;
        let v4 = kxdp_packet::Family::V4;
        assert!(s
            .service_cidrs
            .contains(&Addr::from_ip("172.30.1.1".parse().unwrap()), v4));
        assert!(s
            .service_cidrs
            .contains(&Addr::from_ip("172.31.1.1".parse().unwrap()), v4));
        assert!(s.service_cidrs.contains(
            &Addr::from_ip("fd00:31::1".parse().unwrap()),
            kxdp_packet::Family::V6
        ));
        assert_eq!(t.problems.len(), 1);
        assert_eq!(t.problems[0].object, "ServiceCIDR extra");
    }

    const NODE: &str = "apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-1}}
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: InternalIP, address: 192.168.0.5}
  - {type: InternalIP, address: \"fd00:1::5\"}
  - {type: ExternalIP, address: 198.51.100.50}
";

    #[test]
    fn node_addresses_from_node_object() {
        let c = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\n",
            Path::new("c.yaml"),
        )
        .unwrap();
        let t = tr(&c, NODE);
        let n = &t.snapshot.node;
        assert_eq!(
            n.snat_v4,
            Some(Addr::from_ip("192.168.0.5".parse().unwrap()))
        );
        assert_eq!(n.snat_v6, Some(Addr::from_ip("fd00:1::5".parse().unwrap())));
        assert_eq!(n.addrs.len(), 3);
        assert!(t.problems.is_empty());
        // Config nodeIPs win over the Node object.
        let t = tr(&cfg(""), NODE);
        assert_eq!(
            t.snapshot.node.snat_v4,
            Some(Addr::from_ip("192.168.0.2".parse().unwrap()))
        );
        // No Node, no nodeIPs: reported.
        let t = tr(&c, "");
        assert!(t.snapshot.node.addrs.is_empty());
        assert_eq!(t.problems.len(), 1);
        assert_eq!(t.problems[0].object, "Node node-a");
    }

    #[test]
    fn topology_hints_use_node_zone() {
        let yaml = [
            NODE,
            &service("web", WEB),
            &slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], hints: {forZones: [{name: zone-1}]}}\n- {addresses: [10.1.0.2], hints: {forZones: [{name: zone-2}]}}",
            ),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        assert_eq!(
            route(
                &t.snapshot,
                &fe(&t.snapshot, "172.30.0.10", 80, TCP).routes[0]
            ),
            "- 10.1.0.1:8080"
        );
        // Node hints (PreferSameNode) with the gate on, ignored with it off.
        let yaml = [
            NODE,
            &service("web", WEB),
            &slice(
                "web-1",
                "web",
                "IPv4",
                "[{name: http, port: 8080}]",
                "- {addresses: [10.1.0.1], nodeName: node-b, hints: {forNodes: [{name: node-b}], forZones: [{name: zone-1}]}}\n- {addresses: [10.1.0.2], nodeName: node-a, hints: {forNodes: [{name: node-a}], forZones: [{name: zone-1}]}}",
            ),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        assert_eq!(
            route(
                &t.snapshot,
                &fe(&t.snapshot, "172.30.0.10", 80, TCP).routes[0]
            ),
            "- 10.1.0.2:8080(L)"
        );
        let t = tr(
            &cfg("featureGates: {PreferSameTrafficDistribution: false}\n"),
            &yaml,
        );
        assert_eq!(
            route(
                &t.snapshot,
                &fe(&t.snapshot, "172.30.0.10", 80, TCP).routes[0]
            ),
            "- 10.1.0.1:8080,10.1.0.2:8080(L)"
        );
    }

    #[test]
    fn frontend_collisions_first_wins() {
        let yaml = [
            service(
                "a",
                "  clusterIP: 172.30.0.40\n  externalIPs: [203.0.113.9]\n  ports: [{port: 80}]",
            ),
            service(
                "b",
                "  clusterIP: 172.30.0.41\n  externalIPs: [203.0.113.9]\n  ports: [{port: 80}]",
            ),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        assert_eq!(&*svc_port(s, fe(s, "203.0.113.9", 80, TCP)).name, "ns/a");
        assert_eq!(t.problems.len(), 1);
        assert_eq!(t.problems[0].object, "Service ns/b");
    }

    #[test]
    fn identical_endpoint_lists_share_a_range() {
        // All endpoints local: the cluster and local lists are the same list.
        let yaml = format!(
            "{}{}",
            service("web", "  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, nodePort: 30080}]"),
            slice("web-1", "web", "IPv4", "[{name: http, port: 8080}]", "- {addresses: [10.1.0.2], nodeName: node-a}")
        );
        let t = tr(&cfg(""), &yaml);
        let f = fe(&t.snapshot, "172.30.0.10", 80, TCP);
        assert_eq!(f.endpoints.len(), 1);
        assert_eq!(f.routes[0].endpoints, f.routes[2].endpoints);
    }

    #[test]
    fn service_port_ids_are_stable() {
        // Fixed values: a change here breaks conntrack continuity across upgrades.
        // FNV-1a of "ns1\0svc1\0http\0TCP".
        assert_eq!(service_port_id("ns1", "svc1", "http", "TCP"), 0x8475_dff9);
        assert_eq!(
            service_port_id("kube-system", "kube-dns", "dns", "UDP"),
            0x87df_58a9
        );
        assert_ne!(
            service_port_id("ns1", "svc1", "http", "TCP"),
            service_port_id("ns1", "svc1", "http", "UDP")
        );
        assert_ne!(
            service_port_id("ns1", "svc1", "", "TCP"),
            service_port_id("ns1", "svc", "1", "TCP")
        );
        assert_ne!(service_port_id("a", "b", "c", "TCP"), 0);
    }

    #[test]
    fn examples_translate_cleanly() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let config = Config::load(&root.join("config.yaml")).unwrap();
        let state = crate::sources::files::load_state(&root.join("cluster")).unwrap();
        let t = translate(&config, &state);
        assert!(t.problems.is_empty(), "{:?}", t.problems);
        let s = &t.snapshot;
        s.validate().unwrap();
        // web: 2 ready endpoints (the terminating one is not used while ready ones exist).
        assert_eq!(
            routes(s, fe(s, "172.30.0.10", 80, TCP))[0],
            "- 10.0.1.10:8080(L),10.0.2.10:8080"
        );
        assert_eq!(
            routes(s, fe(s, "192.168.0.2", 30080, TCP))[2],
            "- 10.0.1.20:8080(L)"
        );
        assert!(has_fe(s, "fd00:30::30", 9000, TCP) && has_fe(s, "172.30.0.30", 53, UDP));
        assert!(fe(s, "192.0.2.10", 443, TCP).source_ranges.is_some());
        assert_eq!(
            svc_port(s, fe(s, "172.30.0.50", 80, TCP)).affinity_timeout_s,
            1800
        );
        assert_eq!(routes(s, fe(s, "172.30.0.60", 3000, TCP))[0], "reject");
        assert_eq!(s.cluster_ips.len(), 7);
    }

    #[test]
    fn ip_frontends_win_over_node_ports() {
        let yaml = [
            service("a", "  type: NodePort\n  clusterIP: 172.30.0.40\n  ports: [{port: 80, nodePort: 30000}]"),
            service("b", "  clusterIP: 172.30.0.41\n  externalIPs: [192.168.0.2]\n  ports: [{port: 30000}]"),
        ]
        .concat();
        let t = tr(&cfg(""), &yaml);
        let s = &t.snapshot;
        let f = fe(s, "192.168.0.2", 30000, TCP);
        assert_eq!(f.kind, FrontendKind::ExternalIp);
        assert_eq!(&*svc_port(s, f).name, "ns/b");
        // Besides addr_guard's report of the externalIP on the node's address.
        assert_eq!(t.problems.len(), 2);
        assert!(t.problems.iter().any(|p| p.object == "Service ns/a"));
    }
}
