//! The file's schema: `DataplaneConfiguration` and its sections, with their defaults and
//! the (de)serializers of their fields.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use kxdp_dataplane::conntrack::CtConfig;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use super::duration::GoDuration;

pub const API_VERSION: &str = "kxdp.dev/v1alpha1";
pub const KIND: &str = "DataplaneConfiguration";

/// Feature gates kxdp knows, with their defaults (those of the Kubernetes release kxdp follows).
/// Unknown gates are an error, as in kube-proxy.
pub const FEATURE_GATES: &[(&str, bool)] = &[
    // Beta and on by default since Kubernetes 1.34: node hints (trafficDistribution
    // PreferSameNode) are honoured.
    ("PreferSameTrafficDistribution", true),
];

/// The name used by `translate`.
pub type Config = DataplaneConfiguration;

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataplaneConfiguration {
    /// Must be `kxdp.dev/v1alpha1`.
    pub api_version: String,
    /// Must be `DataplaneConfiguration`.
    pub kind: String,
    /// Which Node object is "this node"; endpoints with this `nodeName` are local. Empty: the
    /// `NODE_NAME` environment variable, else the hostname (`load` fills it in).
    #[serde(default)]
    pub node_name: String,
    /// This node's addresses; empty: the Node object's InternalIP/ExternalIP addresses.
    #[serde(default, rename = "nodeIPs", deserialize_with = "de_ips")]
    pub node_ips: Vec<IpAddr>,
    /// Pod address ranges (kube-proxy's `clusterCIDR`, here a list for dual-stack).
    #[serde(default, rename = "clusterCIDRs", deserialize_with = "de_cidrs")]
    pub cluster_cidrs: Vec<IpNet>,
    /// Service address ranges (merged with ServiceCIDR objects' `spec.cidrs`).
    #[serde(default, rename = "serviceCIDRs", deserialize_with = "de_cidrs")]
    pub service_cidrs: Vec<IpNet>,
    /// CIDRs, or the single word `primary`; empty: every node address accepts NodePorts.
    #[serde(default)]
    pub node_port_addresses: Vec<NodePortAddress>,
    #[serde(default)]
    pub masquerade_all: bool,
    /// kube-proxy's iptables-mode option; only `false` is accepted (AF_XDP never sees loopback).
    #[serde(default)]
    pub localhost_node_ports: bool,
    #[serde(default)]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(default)]
    pub conntrack: ConntrackConfig,
    #[serde(default)]
    pub sync: SyncConfig,
    /// `/healthz` and `/livez`; an empty string disables the server.
    #[serde(
        default = "default_healthz",
        deserialize_with = "de_bind_address",
        serialize_with = "ser_bind_address"
    )]
    pub healthz_bind_address: Option<SocketAddr>,
    /// `/metrics`; an empty string disables the server.
    #[serde(
        default = "default_metrics",
        deserialize_with = "de_bind_address",
        serialize_with = "ser_bind_address"
    )]
    pub metrics_bind_address: Option<SocketAddr>,
    /// Run mode: the interfaces the workers own.
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// How the XDP program attaches: `auto` (native, generic when the driver has no native XDP),
    /// `native` or `generic`.
    #[serde(default)]
    pub xdp_mode: XdpMode,
    /// Strict reverse-path validation of the sources of packets from pods (docs/hardening.md):
    /// `strict` (on every pod-facing interface) or `off`.
    #[serde(default)]
    pub source_validation: SourceValidation,
    /// How the workers get the traffic of pod interfaces: a tc redirect into kxdp's tap that
    /// keeps the pods' GSO super-frames whole (the default), or XDP (docs/afxdp.md § Pod traffic
    /// as super-frames).
    #[serde(default)]
    pub pod_interception: PodInterceptionConfig,
    #[serde(default)]
    pub workers: WorkersConfig,
    /// The AF_XDP sockets' ring sizes and each worker's UMEM (docs/afxdp.md).
    #[serde(default)]
    pub afxdp: AfXdpConfig,
    /// The host path (docs/afxdp.md): the node's own traffic to Services, `pass` verdicts and
    /// pod traffic leaving the cluster reach the kernel through the `kxdp0`/`kxdp1` pair.
    #[serde(default)]
    pub host_path: HostPathConfig,
    /// How a new connection's endpoint is chosen, for Services without the
    /// `service.kxdp.dev/lb-algorithm` annotation, and the Maglev tables' size and seed.
    #[serde(default)]
    pub load_balancing: LoadBalancingConfig,
    /// Per-node settings chosen by the Node object's labels (see `for_node`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_overrides: Vec<NodeOverride>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    #[default]
    Auto,
    Native,
    Generic,
}

/// `sourceValidation`: whether a packet from a pod's interface must carry a source address the
/// node routes back through that interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceValidation {
    #[default]
    Strict,
    Off,
}

/// `podInterception.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InterceptionMode {
    /// kxdp's XDP program and AF_XDP sockets on every matched interface.
    Xdp,
    /// Matched interfaces that also match `podInterception.interfaces`, and matched veths
    /// (`everyVeth`), get a tc redirect into kxdp's tap instead (the rest keep XDP).
    #[default]
    Tap,
}

/// `podInterception`: which of the matched interfaces are pods' interfaces intercepted through
/// kxdp's tap instead of XDP (docs/afxdp.md § Pod traffic as super-frames).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PodInterceptionConfig {
    pub mode: InterceptionMode,
    /// Names or shell-style patterns; only interfaces that `interfaces` matches too.
    pub interfaces: Vec<String>,
    /// Every veth that `interfaces` matches goes through the tap too, whatever its name (tap
    /// mode only): an XDP program on a veth takes GSO from its peer, and a node that is a
    /// container (kind, the lab) has a veth for its uplink.
    pub every_veth: bool,
    /// The tap's name (created by kxdp, one queue per worker).
    pub tap_device: String,
    /// Established flows take the in-kernel fast path the workers install (tap mode only).
    pub offload: bool,
    /// Traffic between pods leaves straight through its egress interface, past the node's IP
    /// stack and netfilter (tap mode only).
    pub direct_routing: bool,
    /// Frames each of the tap's queues holds for its worker (tap mode only).
    pub queue_length: u32,
}

impl Default for PodInterceptionConfig {
    fn default() -> Self {
        PodInterceptionConfig {
            mode: InterceptionMode::Tap,
            interfaces: vec!["veth*".into()],
            every_veth: true,
            tap_device: kxdp_dataplane::io::runner::TAP_DEVICE.into(),
            offload: true,
            direct_routing: true,
            queue_length: kxdp_dataplane::io::runner::TAP_QUEUE_LENGTH,
        }
    }
}

impl PodInterceptionConfig {
    /// The runner's tap options (None in mode xdp).
    pub fn run_options(&self) -> Option<kxdp_dataplane::io::runner::TapOptions> {
        (self.mode == InterceptionMode::Tap).then(|| kxdp_dataplane::io::runner::TapOptions {
            device: self.tap_device.clone(),
            interfaces: self.interfaces.clone(),
            every_veth: self.every_veth,
            offload: self.offload,
            direct_routing: self.direct_routing,
            queue_length: self.queue_length,
        })
    }
}

/// One `nodePortAddresses` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePortAddress {
    /// kube-proxy's `primary`: the node's primary address of each family.
    Primary,
    Cidr(IpNet),
}

impl<'de> Deserialize<'de> for NodePortAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "primary" {
            return Ok(NodePortAddress::Primary);
        }
        parse_cidr(&s)
            .map(NodePortAddress::Cidr)
            .map_err(|e| de::Error::custom(format!("{e} (or the word `primary`)")))
    }
}

impl Serialize for NodePortAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NodePortAddress::Primary => s.serialize_str("primary"),
            NodePortAddress::Cidr(n) => s.serialize_str(&n.to_string()),
        }
    }
}

/// An IP address, with a plain-words error (`std`'s is "invalid IP address syntax").
pub fn parse_ip(s: &str) -> Result<IpAddr, String> {
    let t = s.trim();
    if let Ok(ip) = IpAddr::from_str(t) {
        return Ok(ip);
    }
    if t.contains('/') {
        return Err(format!(
            "`{s}` is an address range (CIDR); a single address is expected here, e.g. 10.0.0.1"
        ));
    }
    Err(format!(
        "`{s}` is not an IP address (expected e.g. 192.168.0.10 or fd00::10)"
    ))
}

/// A CIDR, with an error saying what is wrong with it (a /33, a missing prefix length...).
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let t = s.trim();
    if let Ok(n) = IpNet::from_str(t) {
        return Ok(n);
    }
    let Some((addr, len)) = t.split_once('/') else {
        return Err(if IpAddr::from_str(t).is_ok() {
            format!("`{s}` has no prefix length (expected a CIDR such as 10.0.0.0/8)")
        } else {
            format!("`{s}` is not a CIDR (expected e.g. 10.0.0.0/8 or fd00::/48)")
        });
    };
    let Ok(ip) = IpAddr::from_str(addr) else {
        return Err(format!(
            "`{s}`: `{addr}` is not an IP address (expected a CIDR such as 10.0.0.0/8)"
        ));
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
    Err(match len.parse::<u32>() {
        Ok(n) if n > max => {
            format!(
                "`{s}`: the prefix length {n} is too long (an {family} prefix is at most /{max})"
            )
        }
        _ => format!("`{s}`: `{len}` is not a prefix length (a number from 0 to {max})"),
    })
}

pub(super) fn de_ips<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpAddr>, D::Error> {
    struct Ip(IpAddr);
    impl<'de> Deserialize<'de> for Ip {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            parse_ip(&s).map(Ip).map_err(de::Error::custom)
        }
    }
    Ok(Vec::<Ip>::deserialize(d)?
        .into_iter()
        .map(|i| i.0)
        .collect())
}

pub(super) fn de_cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    struct Cidr(IpNet);
    impl<'de> Deserialize<'de> for Cidr {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            parse_cidr(&s).map(Cidr).map_err(de::Error::custom)
        }
    }
    Ok(Vec::<Cidr>::deserialize(d)?
        .into_iter()
        .map(|c| c.0)
        .collect())
}

/// kube-proxy's `conntrack` section, with one absolute limit instead of maxPerCore/min. Omitted
/// fields keep their defaults.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackConfig {
    /// 0 = the default (kube-proxy: 0 leaves the kernel's limit alone).
    pub max_entries: u32,
    pub tcp_established_timeout: GoDuration,
    pub tcp_close_wait_timeout: GoDuration,
    pub udp_timeout: GoDuration,
    pub udp_stream_timeout: GoDuration,
    /// Where the table lives so that it survives a restart of kxdp (docs/nat.md § Connection
    /// state across restarts); `""`: process memory only; unset: `DEFAULT_STATE_FILE` when it
    /// can be used (`state_file_path`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
    /// Keep the state file in huge pages: its directory is made a tmpfs mounted with
    /// `huge=within_size` (mounted by kxdp when it is an empty directory that is not a mount
    /// point yet). A plain tmpfs (the host's `/run`) gives a file 4 KiB pages only, and a table
    /// of a million connections then costs a page walk on most lookups.
    pub state_file_huge_pages: bool,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        let ct = CtConfig::default();
        ConntrackConfig {
            max_entries: ct.max_entries,
            tcp_established_timeout: GoDuration(ct.tcp_established),
            tcp_close_wait_timeout: GoDuration(ct.tcp_close_wait),
            udp_timeout: GoDuration(ct.udp),
            udp_stream_timeout: GoDuration(ct.udp_stream),
            state_file: None,
            state_file_huge_pages: false,
        }
    }
}

/// `conntrack.stateFile` when the config leaves it unset: on the host's `/run` (a tmpfs, so a
/// reboot starts clean), where deploy/base puts it, in a directory of its own so that
/// `conntrack.stateFileHugePages` can mount a huge-page tmpfs there.
pub const DEFAULT_STATE_FILE: &str = "/run/kxdp/ct/conntrack";

/// Where the conntrack table lives, as `conntrack.stateFile` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFile<'a> {
    /// `""`: process memory.
    Off,
    /// A path the config names: used as it is.
    Set(&'a str),
    /// Unset: `DEFAULT_STATE_FILE`, when it is on a tmpfs and writable; otherwise process memory
    /// (with one log line saying why).
    Default,
}

impl ConntrackConfig {
    pub fn state_file(&self) -> StateFile<'_> {
        match self.state_file.as_deref() {
            Some("") => StateFile::Off,
            Some(p) => StateFile::Set(p),
            None => StateFile::Default,
        }
    }

    /// The state file's path, set or default; None: `""`.
    pub fn state_file_path(&self) -> Option<&str> {
        match self.state_file() {
            StateFile::Off => None,
            StateFile::Set(p) => Some(p),
            StateFile::Default => Some(DEFAULT_STATE_FILE),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SyncConfig {
    /// Changes closer together than this are batched into one translation.
    pub min_sync_period: GoDuration,
    /// A full resync at least this often.
    pub sync_period: GoDuration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            min_sync_period: GoDuration(Duration::from_secs(1)),
            sync_period: GoDuration(Duration::from_secs(30)),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkersConfig {
    /// Worker threads (default 1).
    pub count: usize,
    /// CPUs to pin worker i to (`cpus[i % len]`); empty: no pinning.
    pub cpus: Vec<usize>,
    /// What an idle worker does: the CPU/latency trade-off (docs/afxdp.md).
    pub idle: IdleConfig,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        WorkersConfig {
            count: 1,
            cpus: Vec::new(),
            idle: IdleConfig::default(),
        }
    }
}

/// `afxdp`: how deep each AF_XDP socket's rings are and how many packet buffers each worker
/// has (docs/afxdp.md, "Ring sizes"). Deeper RX and fill rings absorb longer absences of a
/// worker from its CPU before the kernel drops frames (`kxdp_xsk_rx_ring_full_total`,
/// `kxdp_xsk_rx_dropped_total`); each socket's rings cost kernel memory and the UMEM costs
/// `frames` × 4 KiB per worker.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", from = "AfXdpDocument")]
pub struct AfXdpConfig {
    /// 4 KiB packet buffers in each worker's UMEM, shared by all its sockets.
    pub frames: u32,
    /// Entries of each socket's RX ring (a power of two).
    pub rx_ring_size: u32,
    /// Entries of each socket's fill ring (a power of two).
    pub fill_ring_size: u32,
    /// Entries of each socket's TX ring (a power of two).
    pub tx_ring_size: u32,
    /// Entries of each socket's completion ring (a power of two).
    pub completion_ring_size: u32,
}

impl Default for AfXdpConfig {
    fn default() -> Self {
        let x = kxdp_kernel::afxdp::XskConfig::default();
        AfXdpConfig {
            frames: x.frames,
            rx_ring_size: x.rx_ring_size,
            fill_ring_size: x.fill_ring_size,
            tx_ring_size: x.tx_ring_size,
            completion_ring_size: x.completion_ring_size,
        }
    }
}

/// `afxdp` as written: the fields a document leaves out take their defaults, except that the
/// RX and fill rings left out are never deeper than the frames a document asks for (a UMEM
/// of 4096 frames gets 4096-entry rings, not the default 8192 it could not fill). Rings
/// written out are taken as written, and `check` rejects one deeper than the UMEM.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct AfXdpDocument {
    frames: Option<u32>,
    rx_ring_size: Option<u32>,
    fill_ring_size: Option<u32>,
    tx_ring_size: Option<u32>,
    completion_ring_size: Option<u32>,
}

impl From<AfXdpDocument> for AfXdpConfig {
    fn from(d: AfXdpDocument) -> AfXdpConfig {
        let default = AfXdpConfig::default();
        let frames = d.frames.unwrap_or(default.frames);
        // The deepest power-of-two ring the frames fill (a `frames` below the range is
        // reported by the range check; 1 keeps this total).
        let fillable = 1u32 << (31 - frames.max(1).leading_zeros());
        AfXdpConfig {
            frames,
            rx_ring_size: d.rx_ring_size.unwrap_or(default.rx_ring_size.min(fillable)),
            fill_ring_size: d
                .fill_ring_size
                .unwrap_or(default.fill_ring_size.min(fillable)),
            tx_ring_size: d.tx_ring_size.unwrap_or(default.tx_ring_size),
            completion_ring_size: d
                .completion_ring_size
                .unwrap_or(default.completion_ring_size),
        }
    }
}

impl AfXdpConfig {
    /// The socket and UMEM sizes the workers use (frame size and zero-copy as by default).
    pub fn xsk(&self) -> kxdp_kernel::afxdp::XskConfig {
        kxdp_kernel::afxdp::XskConfig {
            frames: self.frames,
            rx_ring_size: self.rx_ring_size,
            fill_ring_size: self.fill_ring_size,
            tx_ring_size: self.tx_ring_size,
            completion_ring_size: self.completion_ring_size,
            ..Default::default()
        }
    }

    /// Bytes of one worker's UMEM.
    pub fn umem_bytes(&self) -> u64 {
        u64::from(self.frames) * u64::from(self.xsk().frame_size)
    }

    /// What ranges cannot say: ring sizes are powers of two, and the fill and RX rings can be
    /// filled from the UMEM (a ring deeper than the frames there are never fills up).
    pub(super) fn check(&self) -> Result<(), (String, String)> {
        for (field, n) in [
            ("afxdp.rxRingSize", self.rx_ring_size),
            ("afxdp.fillRingSize", self.fill_ring_size),
            ("afxdp.txRingSize", self.tx_ring_size),
            ("afxdp.completionRingSize", self.completion_ring_size),
        ] {
            if !n.is_power_of_two() {
                let below = 1u32 << (31 - n.leading_zeros());
                return Err((
                    field.into(),
                    format!(
                        "{n} is not a power of two (the kernel sizes rings in powers of two: {below} or {})",
                        below.saturating_mul(2)
                    ),
                ));
            }
        }
        for (field, n) in [
            ("afxdp.fillRingSize", self.fill_ring_size),
            ("afxdp.rxRingSize", self.rx_ring_size),
        ] {
            if n > self.frames {
                return Err((
                    field.into(),
                    format!(
                        "{n} entries cannot be filled from a UMEM of {} frames (afxdp.frames): at most {}, or raise afxdp.frames",
                        self.frames,
                        1u32 << (31 - self.frames.leading_zeros())
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `hostPath`: what kxdp sets up on the node so that its own processes reach Services and kxdp
/// can hand packets to the kernel (docs/afxdp.md, "The host path"; docs/operations.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HostPathConfig {
    /// Set up the `kxdp0`/`kxdp1` pair, service routes and NodePort rules (when `interfaces`
    /// is not empty).
    pub enabled: bool,
    /// The NodePorts the node's own processes reach on its own addresses (the API server's
    /// `--service-node-port-range`).
    pub node_port_range: PortRange,
    /// Devices that carry pod traffic between nodes without kxdp owning them (an overlay's
    /// VXLAN, IPIP, WireGuard or tun device), by exact name: what kxdp routes through them
    /// leaves through the kernel, and what the kernel receives on them is steered back to kxdp.
    /// The default names the devices flannel and Calico create; a name that does not exist on
    /// the node costs nothing.
    pub overlay_interfaces: Vec<String>,
}

/// The overlay devices of the common CNIs: flannel's VXLAN (`flannel.1`, `flannel-v6.1`) and
/// WireGuard (`flannel-wg`, `flannel-wg-v6`) backends, Calico's VXLAN (`vxlan.calico`,
/// `vxlan-v6.calico`), IPIP (`tunl0`) and WireGuard (`wireguard.cali`, `wg-v6.cali`) modes.
pub const DEFAULT_OVERLAY_INTERFACES: [&str; 9] = [
    "flannel.1",
    "flannel-v6.1",
    "flannel-wg",
    "flannel-wg-v6",
    "vxlan.calico",
    "vxlan-v6.calico",
    "tunl0",
    "wireguard.cali",
    "wg-v6.cali",
];

impl Default for HostPathConfig {
    fn default() -> Self {
        HostPathConfig {
            enabled: true,
            node_port_range: PortRange(30000, 32767),
            overlay_interfaces: DEFAULT_OVERLAY_INTERFACES.map(String::from).to_vec(),
        }
    }
}

/// How a Service's new connections choose an endpoint (docs/services.md, "Choice").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LbAlgorithm {
    /// Uniformly at random from the route's list.
    #[default]
    Random,
    /// By the route's Maglev table, indexed by a hash of the 5-tuple: the same endpoint on every
    /// node with the same endpoints and seed.
    Maglev,
}

impl LbAlgorithm {
    /// The annotation's and the configuration's spelling.
    pub fn parse(s: &str) -> Option<LbAlgorithm> {
        match s {
            "random" => Some(LbAlgorithm::Random),
            "maglev" => Some(LbAlgorithm::Maglev),
            _ => None,
        }
    }
}

/// `loadBalancing`: the default endpoint choice and the Maglev tables' shape.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadBalancingConfig {
    /// The algorithm of Services without the annotation.
    pub algorithm: LbAlgorithm,
    /// The largest Maglev table (slots, a prime); smaller routes get smaller tables
    /// (`kxdp_dataplane::maglev::table_size`).
    pub maglev_table_size: u32,
    /// The cluster-wide seed of the Maglev hashes: every node must have the same one for a flow
    /// to reach the same endpoint whichever node receives it. A string or an integer.
    #[serde(deserialize_with = "de_seed")]
    pub maglev_seed: String,
}

impl Default for LoadBalancingConfig {
    fn default() -> Self {
        LoadBalancingConfig {
            algorithm: LbAlgorithm::Random,
            maglev_table_size: kxdp_dataplane::maglev::DEFAULT_TABLE_SIZE,
            maglev_seed: String::new(),
        }
    }
}

impl LoadBalancingConfig {
    /// The seed as the hashes take it.
    pub fn seed(&self) -> u64 {
        kxdp_dataplane::maglev::seed_of(&self.maglev_seed)
    }
}

/// A seed written as a string or as an integer (kept as its decimal text).
pub(super) fn de_seed<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Seed {
        S(String),
        I(u64),
        N(i64),
    }
    Ok(
        match Seed::deserialize(d)
            .map_err(|_| serde::de::Error::custom("must be a string or an integer"))?
        {
            Seed::S(s) => s,
            Seed::I(i) => i.to_string(),
            Seed::N(i) => i.to_string(),
        },
    )
}

/// An interface's exact name as the kernel takes it (an `ip rule iif` name: no patterns).
pub(super) fn check_interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("`{name}`: an interface name has 1 to 15 bytes"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || matches!(c, '/' | ':' | '*' | '?' | '['))
    {
        return Err(format!(
            "`{name}`: `{c}` cannot stand in an interface name (exact names only, no patterns)"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("`{name}` is not an interface name"));
    }
    Ok(())
}

/// `FIRST-LAST`, ports 1 to 65535, FIRST ≤ LAST (the API server's `--service-node-port-range`
/// format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange(pub u16, pub u16);

impl std::str::FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("`{s}` is not a port range: expected FIRST-LAST, ports 1 to 65535, FIRST not above LAST (e.g. 30000-32767)")
        };
        let (a, b) = s.trim().split_once('-').ok_or_else(bad)?;
        let a: u16 = a.trim().parse().map_err(|_| bad())?;
        let b: u16 = b.trim().parse().map_err(|_| bad())?;
        if a == 0 || a > b {
            return Err(bad());
        }
        Ok(PortRange(a, b))
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

impl Serialize for PortRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}-{}", self.0, self.1))
    }
}

/// An idle worker polls its rings `spinPolls` times (yielding its CPU after each empty poll),
/// then waits on its sockets (without a poll set: sleeps from 10 µs doubling up to `maxSleep`
/// between polls): more spinning costs CPU and saves latency.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IdleConfig {
    pub spin_polls: u32,
    pub max_sleep: GoDuration,
}

impl Default for IdleConfig {
    fn default() -> Self {
        IdleConfig {
            spin_polls: 2000,
            max_sleep: GoDuration(std::time::Duration::from_millis(1)),
        }
    }
}

/// One `nodeOverrides` entry: on the nodes whose labels match `nodeSelector`, these fields
/// replace the top-level ones. Absent fields leave the top-level value alone.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeOverride {
    pub node_selector: NodeSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp_mode: Option<XdpMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersOverride>,
    /// Replaces `afxdp` as a whole (fields it leaves out take their defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub afxdp: Option<AfXdpConfig>,
}

/// Which nodes an override applies to: every label in `matchLabels` equal on the Node object
/// (an empty `matchLabels` matches every node), as a Kubernetes label selector's `matchLabels`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

impl NodeSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// `workers` fields an override may set; each replaces the top-level one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkersOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdleConfig>,
}

pub(super) fn default_healthz() -> Option<SocketAddr> {
    Some(SocketAddr::from(([0, 0, 0, 0], 10256)))
}

pub(super) fn default_metrics() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 10249)))
}

pub(super) fn de_bind_address<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(None);
    }
    SocketAddr::from_str(&s).map(Some).map_err(|_| {
        de::Error::custom(format!(
            "`{s}` is not an address and port (expected IP:PORT, e.g. 0.0.0.0:10256, or \"\" to turn the server off)"
        ))
    })
}

pub(super) fn ser_bind_address<S: Serializer>(
    a: &Option<SocketAddr>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match a {
        Some(a) => s.serialize_str(&a.to_string()),
        None => s.serialize_str(""),
    }
}

impl DataplaneConfiguration {
    /// Whether a feature gate is on (the config's value, else its default).
    pub fn feature_enabled(&self, gate: &str) -> bool {
        if let Some(&v) = self.feature_gates.get(gate) {
            return v;
        }
        FEATURE_GATES
            .iter()
            .find(|(g, _)| *g == gate)
            .is_some_and(|(_, d)| *d)
    }

    /// The dataplane's conntrack settings: the configured limits and timeouts, the kernel's
    /// defaults for the rest. A zero value keeps the default, as 0 does in kube-proxy.
    pub fn ct_config(&self) -> CtConfig {
        let mut ct = CtConfig::default();
        let c = &self.conntrack;
        if c.max_entries != 0 {
            ct.max_entries = c.max_entries;
        }
        let set = |dst: &mut Duration, v: GoDuration| {
            if !v.0.is_zero() {
                *dst = v.0;
            }
        };
        set(&mut ct.tcp_established, c.tcp_established_timeout);
        set(&mut ct.tcp_close_wait, c.tcp_close_wait_timeout);
        set(&mut ct.udp, c.udp_timeout);
        set(&mut ct.udp_stream, c.udp_stream_timeout);
        ct
    }

    /// The configuration as YAML (`kxdp config convert`, `/configz`).
    pub fn to_yaml(&self) -> String {
        yaml_serde::to_string(self).expect("a configuration always serializes")
    }
}
