//! What translating one Service gives (`ServiceOutput`), and what every Service's translation
//! shares (`Globals`).

use std::net::IpAddr;
use std::sync::Arc;

use kxdp_dataplane::snapshot::{
    Frontend, FrontendKey, ListedEndpoints, NodeInfo, PrefixSet, ServicePortInfo,
};
use kxdp_packet::Addr;

use crate::problem::Problem;

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
