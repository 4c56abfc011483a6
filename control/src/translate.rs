//! The pure translation from cluster state to dataplane tables: `translate(config, state)`.
//!
//! It follows kube-proxy's nftables proxier (`pkg/proxy/nftables/proxier.go`, `syncProxyRules`)
//! rule for rule; where kube-proxy builds chains, this builds one `Route` per frontend and source
//! class. Choices the Kubernetes docs leave open are stated on the functions below.
//!
//! Nothing here fails as a whole: an object that cannot be translated is skipped and reported as
//! a `Problem`; everything else is built.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use kxdp_dataplane::snapshot::{
    proto, EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, NodeInfo,
    PrefixSet, Route, ServicePortInfo, Snapshot, SourceClass,
};
use kxdp_packet::Addr;

use crate::config::{Config, NodePortAddress};
use crate::endpoints::{
    categorize, merge_slices, Categorized, EndpointInfo, PolicyInfo, PortKey, Topology,
    LABEL_TOPOLOGY_ZONE,
};
use crate::model::{ClusterState, ObjectKey};

/// The annotation cloud providers read when `spec.loadBalancerSourceRanges` is empty.
pub const ANNOTATION_LB_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

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

/// Builds the dataplane tables for this node from the config and the cluster state.
pub fn translate(config: &Config, state: &ClusterState) -> Translation {
    let mut t = Translator {
        config,
        snap: Snapshot::empty(),
        problems: Vec::new(),
        ranges: HashMap::new(),
        ids: HashMap::new(),
        node_ips: Vec::new(),
    };
    let zone = t.node_info(state);
    t.prefix_sets(state);
    let prefer_same_node = config.feature_enabled("PreferSameTrafficDistribution");
    let topo = Topology {
        node_name: &config.node_name,
        zone: &zone,
        prefer_same_node,
    };
    for (key, svc) in &state.services {
        t.service(key, svc, state, &topo);
    }
    Translation {
        snapshot: t.snap,
        problems: t.problems,
    }
}

struct Translator<'a> {
    config: &'a Config,
    snap: Snapshot,
    problems: Vec<Problem>,
    /// Identical endpoint lists share one range of `Snapshot::endpoints`.
    ranges: HashMap<Vec<Endpoint>, EndpointRange>,
    /// Service port ids seen, to report hash collisions.
    ids: HashMap<u32, Arc<str>>,
    /// This node's addresses (as `NodeInfo::addrs`, in order).
    node_ips: Vec<IpAddr>,
}

/// Per-family facts of one Service.
struct FamilyPart {
    v6: bool,
    cluster_ip: IpAddr,
    external_ips: Vec<IpAddr>,
    lb_vips: Vec<IpAddr>,
}

impl Translator<'_> {
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
    fn node_info(&mut self, state: &ClusterState) -> String {
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
        self.snap.node = NodeInfo {
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
        self.node_ips = dedup;
        node.and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
            .cloned()
            .unwrap_or_default()
    }

    /// `cluster_cidrs` = config `clusterCIDRs`; `service_cidrs` = config `serviceCIDRs` and every
    /// ServiceCIDR object's `spec.cidrs`.
    fn prefix_sets(&mut self, state: &ClusterState) {
        for n in &self.config.cluster_cidrs {
            self.snap.cluster_cidrs.insert(n.addr(), n.prefix_len());
        }
        for n in &self.config.service_cidrs {
            self.snap.service_cidrs.insert(n.addr(), n.prefix_len());
        }
        for (name, sc) in &state.service_cidrs {
            for (i, c) in sc
                .spec
                .iter()
                .flat_map(|s| s.cidrs.iter().flatten())
                .enumerate()
            {
                match c.trim().parse::<IpNet>() {
                    Ok(n) => self.snap.service_cidrs.insert(n.addr(), n.prefix_len()),
                    Err(_) => self.problem(
                        format!("ServiceCIDR {name}"),
                        format!("spec.cidrs[{i}]: invalid CIDR `{c}`"),
                    ),
                }
            }
        }
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
    ) {
        let obj = format!("Service {key}");
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
            match s.trim().parse::<IpAddr>() {
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
                Err(_) => self.problem(
                    obj.clone(),
                    format!("spec.clusterIPs[{i}]: invalid IP address `{s}`"),
                ),
            }
        }
        if families.is_empty() {
            return;
        }
        for (i, s) in spec.external_ips.iter().flatten().enumerate() {
            match s.trim().parse::<IpAddr>() {
                Ok(ip) => match families.iter_mut().find(|f| f.v6 == ip.is_ipv6()) {
                    Some(f) => f.external_ips.push(ip),
                    None => {
                        tracing::debug!(service = %key, %ip, "externalIP of a family the Service has no ClusterIP of")
                    }
                },
                Err(_) => self.problem(
                    obj.clone(),
                    format!("spec.externalIPs[{i}]: invalid IP address `{s}`"),
                ),
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
            match s.trim().parse::<IpAddr>() {
                Ok(ip) => {
                    if let Some(f) = families.iter_mut().find(|f| f.v6 == ip.is_ipv6()) {
                        f.lb_vips.push(ip);
                    }
                }
                Err(_) => self.problem(
                    obj.clone(),
                    format!("status.loadBalancer.ingress[{i}].ip: invalid IP address `{s}`"),
                ),
            }
        }
        let source_ranges = self.source_ranges(&obj, svc);

        for f in &families {
            self.snap.cluster_ips.insert(Addr::from_ip(f.cluster_ip));
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
            match t {
                None => DEFAULT_AFFINITY_TIMEOUT_S,
                Some(t) if t > 0 => t as u32,
                Some(t) => {
                    self.problem(obj.clone(), format!("spec.sessionAffinityConfig.clientIP.timeoutSeconds: {t} is not positive; using {DEFAULT_AFFINITY_TIMEOUT_S}"));
                    DEFAULT_AFFINITY_TIMEOUT_S
                }
            }
        } else {
            0
        };

        let mut slice_problems = Vec::new();
        let merged = merge_slices(
            state.slices_of(key),
            &self.config.node_name,
            topo.prefer_same_node,
            &mut slice_problems,
        );
        for m in slice_problems {
            self.problem(obj.clone(), m);
        }

        for (pi, port) in spec.ports.iter().flatten().enumerate() {
            let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".into());
            let proto_num = match protocol.as_str() {
                "TCP" => proto::TCP,
                "UDP" => proto::UDP,
                "SCTP" => proto::SCTP,
                other => {
                    self.problem(obj.clone(), format!("spec.ports[{pi}].protocol: `{other}` is not TCP, UDP or SCTP; port skipped"));
                    continue;
                }
            };
            let Ok(number) = u16::try_from(port.port).map_err(|_| ()).and_then(|p| {
                if p == 0 {
                    Err(())
                } else {
                    Ok(p)
                }
            }) else {
                self.problem(
                    obj.clone(),
                    format!(
                        "spec.ports[{pi}].port: {} is not a port number; port skipped",
                        port.port
                    ),
                );
                continue;
            };
            let node_port = match port.node_port.unwrap_or(0) {
                0 => None,
                p @ 1..=65535 => Some(p as u16),
                p => {
                    self.problem(
                        obj.clone(),
                        format!("spec.ports[{pi}].nodePort: {p} is not a port number; ignored"),
                    );
                    None
                }
            };
            let port_name = port.name.clone().unwrap_or_default();
            let sp_index = self.service_port(key, &port_name, &protocol, proto_num, affinity);

            for f in &families {
                let empty = Vec::new();
                let eps: &Vec<EndpointInfo> = merged
                    .get(&PortKey {
                        v6: f.v6,
                        name: port_name.clone(),
                        protocol: protocol.clone(),
                    })
                    .unwrap_or(&empty);
                let policy = PolicyInfo {
                    internal_local,
                    external_local,
                    externally_accessible: node_port.is_some()
                        || !f.external_ips.is_empty()
                        || !f.lb_vips.is_empty(),
                };
                let cat = categorize(eps, policy, topo);
                let lists = self.lists(eps, &cat);
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
                    sp_index,
                    FrontendKind::ClusterIp,
                    internal,
                    None,
                );
                if let Some(np) = node_port {
                    for a in self.node_port_addrs(f.v6) {
                        self.frontend(
                            &obj,
                            FrontendKey {
                                addr: Addr::from_ip(a),
                                port: np,
                                proto: proto_num,
                            },
                            sp_index,
                            FrontendKind::NodePort,
                            external,
                            None,
                        );
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
                        sp_index,
                        FrontendKind::ExternalIp,
                        external,
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
                        sp_index,
                        FrontendKind::LoadBalancer,
                        external,
                        firewall.clone(),
                    );
                }
            }
        }
    }

    /// Appends the `ServicePortInfo` and returns its index.
    fn service_port(
        &mut self,
        key: &ObjectKey,
        port_name: &str,
        protocol: &str,
        proto_num: u8,
        affinity: u32,
    ) -> u32 {
        let name: Arc<str> = if port_name.is_empty() {
            format!("{}/{}", key.namespace, key.name).into()
        } else {
            format!("{}/{}:{port_name}", key.namespace, key.name).into()
        };
        let id = service_port_id(&key.namespace, &key.name, port_name, protocol);
        if let Some(other) = self.ids.insert(id, name.clone()) {
            self.problem(
                format!("Service {key}"),
                format!("port `{name}` ({protocol}) has the same id {id:#010x} as `{other}`: conntrack listings may name the wrong one"),
            );
        }
        self.snap.service_ports.push(ServicePortInfo {
            name,
            id,
            proto: proto_num,
            affinity_timeout_s: affinity,
        });
        (self.snap.service_ports.len() - 1) as u32
    }

    /// The cluster and local endpoint lists as ranges of `Snapshot::endpoints`.
    fn lists(&mut self, eps: &[EndpointInfo], cat: &Categorized) -> Lists {
        Lists {
            cluster: self.range(eps, &cat.cluster),
            local: self.range(eps, &cat.local),
        }
    }

    fn range(&mut self, eps: &[EndpointInfo], idx: &[usize]) -> EndpointRange {
        if idx.is_empty() {
            return EndpointRange::EMPTY;
        }
        let list: Vec<Endpoint> = idx
            .iter()
            .map(|&i| Endpoint {
                addr: Addr::from_ip(eps[i].ip),
                port: eps[i].port,
                local: eps[i].local,
            })
            .collect();
        if let Some(r) = self.ranges.get(&list) {
            return *r;
        }
        let r = EndpointRange {
            start: self.snap.endpoints.len() as u32,
            len: list.len() as u32,
        };
        self.snap.endpoints.extend_from_slice(&list);
        self.ranges.insert(list, r);
        r
    }

    /// Adds a frontend. Two Services claiming the same address, port and protocol (an externalIP
    /// that is another's, a NodePort on an address that is also an externalIP): the first in
    /// namespace/name order keeps it and the later one is reported.
    fn frontend(
        &mut self,
        obj: &str,
        key: FrontendKey,
        service_port: u32,
        kind: FrontendKind,
        routes: [Route; 3],
        source_ranges: Option<Arc<PrefixSet>>,
    ) {
        if let Some(&i) = self.snap.frontends.get(&key) {
            let other = &self.snap.service_ports
                [self.snap.frontend_table[i as usize].service_port as usize]
                .name;
            let msg = format!(
                "{} {}:{} (proto {}) is already {other}'s; ignored",
                kind.as_str(),
                key.addr,
                key.port,
                key.proto
            );
            self.problem(obj.to_string(), msg);
            return;
        }
        let idx = self.snap.frontend_table.len() as u32;
        self.snap.frontend_table.push(Frontend {
            service_port,
            kind,
            routes,
            source_ranges,
        });
        self.snap.frontends.insert(key, idx);
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
            match r.trim().parse::<IpNet>() {
                Ok(n) => out.push(n),
                Err(_) => self.problem(
                    obj.to_string(),
                    format!("{field}[{i}]: invalid CIDR `{r}`; skipped"),
                ),
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
