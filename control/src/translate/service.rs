//! One Service's translation (`translate_service`), rule for rule as kube-proxy's nftables
//! proxier, and this node's shared facts (`globals`).

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use kxdp_dataplane::maglev::Maglev;
use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, NodeInfo, PrefixSet,
    Route, ServicePortInfo, SourceClass,
};
use kxdp_packet::{Addr, IpProto};

use crate::config::{Config, LbAlgorithm, NodePortAddress};
use crate::endpoints::{
    categorize, merge_slices, Categorized, EndpointInfo, PolicyInfo, PortKey, Topology,
    LABEL_TOPOLOGY_ZONE,
};
use crate::model::{ClusterState, ObjectKey};
use crate::problem::Problem;

use crate::translate::addr_guard;
use crate::translate::output::{Globals, ServiceOutput};
use crate::translate::slices::SliceCache;

/// The annotation cloud providers read when `spec.loadBalancerSourceRanges` is empty.
pub const ANNOTATION_LB_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// A Service's endpoint choice, `maglev` or `random` (default: `loadBalancing.algorithm`).
pub const ANNOTATION_LB_ALGORITHM: &str = "service.kxdp.dev/lb-algorithm";

/// `sessionAffinityConfig.clientIP.timeoutSeconds` when omitted (the API server's default).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10800;

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
    addr_guard::guard_ranges(config, state, g)
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
    addr_guard::guard_service(g, key, t.finish())
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
        proto_num: IpProto,
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
