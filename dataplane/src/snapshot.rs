//! The immutable tables a worker reads: everything the control plane decided, precomputed so that a
//! new connection costs one frontend lookup, one source classification and one random index.
//!
//! Nothing here knows Kubernetes types: `control` translates cluster state into a `Snapshot` (a pure
//! function, unit-tested without a cluster) and publishes it; workers pick the new one up between
//! batches. Snapshots are never mutated after publication.

use std::sync::Arc;

use ahash::RandomState;
use hashbrown::{HashMap, HashSet};
use kxdp_packet::{Addr, Family};

/// IP protocol numbers of the transports a Service port can name.
pub mod proto {
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const SCTP: u8 = 132;
}

/// What a frontend is reached as. Decides nothing by itself (the routes do); it names the rule in
/// listings and verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrontendKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl FrontendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "ClusterIP",
            FrontendKind::NodePort => "NodePort",
            FrontendKind::ExternalIp => "ExternalIP",
            FrontendKind::LoadBalancer => "LoadBalancer",
        }
    }

    /// External destinations (NodePort, LoadBalancer, externalIPs) follow externalTrafficPolicy.
    pub fn is_external(self) -> bool {
        !matches!(self, FrontendKind::ClusterIp)
    }
}

/// The key of the frontend table: a destination a client may address. NodePorts are expanded to one
/// key per node address that accepts them (few addresses, so one exact lookup covers every kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrontendKey {
    pub addr: Addr,
    pub port: u16,
    pub proto: u8,
}

/// Where a new connection's source sits, in the order kube-proxy tests it: a source inside
/// `clusterCIDRs` is a pod; otherwise one of this node's addresses is the node; anything else is
/// external.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SourceClass {
    Pod = 0,
    Node = 1,
    External = 2,
}

impl SourceClass {
    pub const ALL: [SourceClass; 3] = [SourceClass::Pod, SourceClass::Node, SourceClass::External];
}

/// What happens to a new connection when its route has no endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EmptyAction {
    /// The Service has no usable endpoint anywhere: answer with TCP RST / ICMP port unreachable
    /// (reason `no-endpoints`).
    #[default]
    Reject,
    /// Endpoints exist, but none this traffic may use (Local policy, none on this node): drop
    /// (reason `no-local-endpoints`).
    Drop,
}

/// A contiguous run of `Snapshot::endpoints`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EndpointRange {
    pub start: u32,
    pub len: u32,
}

impl EndpointRange {
    pub const EMPTY: EndpointRange = EndpointRange { start: 0, len: 0 };

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_range(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// The decision for new connections of one source class to one frontend, precomputed at
/// translation time from the traffic policies, topology and endpoint conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Route {
    /// The endpoints to choose from, uniformly at random (or by session affinity).
    pub endpoints: EndpointRange,
    /// Source-NAT the connection to this node's address of the packet's family.
    pub masquerade: bool,
    /// What to do when `endpoints` is empty.
    pub when_empty: EmptyAction,
}

/// One frontend: a (destination address, port, protocol) a Service answers on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// Index into `Snapshot::service_ports`.
    pub service_port: u32,
    pub kind: FrontendKind,
    /// Indexed by `SourceClass as usize`.
    pub routes: [Route; 3],
    /// loadBalancerSourceRanges (LoadBalancer frontends only): when present, sources outside are
    /// dropped (reason `source-range`).
    pub source_ranges: Option<Arc<PrefixSet>>,
}

/// One backend a connection may be sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub addr: Addr,
    /// The target port, already resolved for this Service port.
    pub port: u16,
    /// The endpoint is on this node.
    pub local: bool,
}

/// A Service port: what listings, affinity and conntrack name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortInfo {
    /// `namespace/name:port-name` (`namespace/name` when the port is unnamed), as kube-proxy logs it.
    pub name: Arc<str>,
    /// A stable identifier (hash of namespace, name, port name and protocol): conntrack entries and
    /// affinity records keep it across snapshots.
    pub id: u32,
    pub proto: u8,
    /// sessionAffinity ClientIP: seconds a client stays with its endpoint; 0 = no affinity.
    pub affinity_timeout_s: u32,
}

/// A set of IP prefixes of both families, matched linearly: the sets a packet is tested against
/// (cluster CIDRs, service CIDRs, source ranges) hold a handful of prefixes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl PrefixSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `addr/len`; host bits are cleared. Lengths beyond the family's width are clamped.
    pub fn insert(&mut self, addr: std::net::IpAddr, len: u8) {
        match addr {
            std::net::IpAddr::V4(a) => {
                let len = len.min(32) as u32;
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                let net = u32::from(a) & mask;
                if !self.v4.contains(&(net, mask)) {
                    self.v4.push((net, mask));
                }
            }
            std::net::IpAddr::V6(a) => {
                let len = len.min(128) as u32;
                let mask = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                let net = u128::from(a) & mask;
                if !self.v6.contains(&(net, mask)) {
                    self.v6.push((net, mask));
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    #[inline]
    pub fn contains(&self, addr: &Addr, family: Family) -> bool {
        match family {
            Family::V4 => {
                let a = u32::from_be_bytes(addr.v4_octets());
                self.v4.iter().any(|&(net, mask)| a & mask == net)
            }
            Family::V6 => {
                let a = addr.as_u128();
                self.v6.iter().any(|&(net, mask)| a & mask == net)
            }
        }
    }

    /// The prefixes, for listings: (address, prefix length).
    pub fn iter(&self) -> impl Iterator<Item = (std::net::IpAddr, u8)> + '_ {
        let v4 = self
            .v4
            .iter()
            .map(|&(n, m)| (std::net::IpAddr::V4(n.into()), m.count_ones() as u8));
        let v6 = self
            .v6
            .iter()
            .map(|&(n, m)| (std::net::IpAddr::V6(n.into()), m.count_ones() as u8));
        v4.chain(v6)
    }
}

/// Facts about this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The address masqueraded IPv4 traffic leaves with.
    pub snat_v4: Option<Addr>,
    /// The address masqueraded IPv6 traffic leaves with.
    pub snat_v6: Option<Addr>,
    /// Every address of this node: traffic to one of them that is no NodePort is the node's own
    /// (`pass`), and a source among them is the node itself.
    pub addrs: Vec<Addr>,
}

impl NodeInfo {
    #[inline]
    pub fn is_node_addr(&self, addr: &Addr) -> bool {
        self.addrs.iter().any(|a| a == addr)
    }

    #[inline]
    pub fn snat_addr(&self, family: Family) -> Option<Addr> {
        match family {
            Family::V4 => self.snat_v4,
            Family::V6 => self.snat_v6,
        }
    }
}

/// Everything a worker needs to decide a new connection. Built by `control`, published whole.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Increases with every publication; 0 is the empty startup snapshot.
    pub generation: u64,
    pub node: NodeInfo,
    /// Pod address ranges: a source inside is cluster-internal traffic.
    pub cluster_cidrs: PrefixSet,
    /// Service address ranges: a destination inside that no Service owns is dropped.
    pub service_cidrs: PrefixSet,
    /// Every ClusterIP: a packet to one on a port/protocol the Service does not define is rejected.
    pub cluster_ips: HashSet<Addr, RandomState>,
    pub frontends: HashMap<FrontendKey, u32, RandomState>,
    pub frontend_table: Vec<Frontend>,
    pub endpoints: Vec<Endpoint>,
    pub service_ports: Vec<ServicePortInfo>,
    /// NetworkPolicy: the compiled rules of this node's pods (empty: nothing is isolated).
    pub policy: Arc<crate::policy::PolicyTables>,
}

impl Snapshot {
    /// The startup snapshot: no Services; every packet is either the node's or forwarded as is.
    pub fn empty() -> Self {
        Self::default()
    }

    #[inline]
    pub fn frontend(&self, key: &FrontendKey) -> Option<&Frontend> {
        self.frontends
            .get(key)
            .map(|&i| &self.frontend_table[i as usize])
    }

    #[inline]
    pub fn endpoints_of(&self, range: EndpointRange) -> &[Endpoint] {
        &self.endpoints[range.as_range()]
    }

    #[inline]
    pub fn classify_source(&self, src: &Addr, family: Family) -> SourceClass {
        if self.cluster_cidrs.contains(src, family) {
            SourceClass::Pod
        } else if self.node.is_node_addr(src) {
            SourceClass::Node
        } else {
            SourceClass::External
        }
    }

    /// The Service port a conntrack entry or affinity record names, by its stable id.
    pub fn service_port_by_id(&self, id: u32) -> Option<&ServicePortInfo> {
        self.service_ports.iter().find(|s| s.id == id)
    }

    /// Checks internal consistency (ranges in bounds, indexes valid). `control` calls it before
    /// publishing, so a translation bug is an error, not a worker panic.
    pub fn validate(&self) -> Result<(), String> {
        for (key, &i) in &self.frontends {
            let Some(fe) = self.frontend_table.get(i as usize) else {
                return Err(format!("frontend {key:?} points at missing entry {i}"));
            };
            if fe.service_port as usize >= self.service_ports.len() {
                return Err(format!(
                    "frontend {key:?} names missing service port {}",
                    fe.service_port
                ));
            }
            for r in &fe.routes {
                if r.endpoints.as_range().end > self.endpoints.len() {
                    return Err(format!(
                        "frontend {key:?} has an endpoint range out of bounds"
                    ));
                }
            }
        }
        Ok(())
    }
}
