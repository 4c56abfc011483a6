//! `DataplaneConfiguration`: kxdp's config file, modelled on kube-proxy's `KubeProxyConfiguration`
//! (same field names where the meaning is the same). The reference is docs/config.md; a test
//! checks that every field, default and range below appears there.
//!
//! Every struct denies unknown fields: a typo is an error (exit 2), never silently ignored.
//! Errors name the file, the line and the field path in plain words
//! (`config.yaml:7: conntrack.maxEntries: 4294967295 is too large: at most 67108864`).
//!
//! Loading has three steps: `from_yaml_str` (syntax, types, ranges: the same on every machine),
//! `for_node` (the `nodeOverrides` matching this node's labels), `check_machine` (CPUs exist,
//! the memory asked for is there) just before anything is allocated.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use kxdp_dataplane::conntrack::CtConfig;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

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

fn de_ips<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpAddr>, D::Error> {
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

fn de_cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
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
struct AfXdpDocument {
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
    fn check(&self) -> Result<(), (String, String)> {
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
fn de_seed<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
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
fn check_interface_name(name: &str) -> Result<(), String> {
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

/// An idle worker polls its rings `spinPolls` times, then sleeps from 10 µs doubling up to
/// `maxSleep` between polls: more spinning and shorter sleeps cost CPU and save latency.
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

fn default_healthz() -> Option<SocketAddr> {
    Some(SocketAddr::from(([0, 0, 0, 0], 10256)))
}

fn default_metrics() -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], 10249)))
}

fn de_bind_address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
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

fn ser_bind_address<S: Serializer>(a: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
    match a {
        Some(a) => s.serialize_str(&a.to_string()),
        None => s.serialize_str(""),
    }
}

/// A duration written as Kubernetes writes them (Go's `time.Duration` format: `24h`, `1h0m0s`,
/// `1.5h`, `300ms`, `0s`); humantime's forms (`2min`, `1day`) are accepted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct GoDuration(pub Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(GoDuration)
            .map_err(de::Error::custom)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

/// Go's `time.Duration.String()`: `1h0m0s`, `2m30s`, `1.5s`, `300ms`, `50µs`, `0s`.
pub fn format_go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let frac = |v: u128, unit: u128| {
        let (whole, rest) = (v / unit, v % unit);
        if rest == 0 {
            whole.to_string()
        } else {
            let digits = unit.ilog10() as usize;
            let s = format!("{whole}.{rest:0digits$}");
            s.trim_end_matches('0').to_string()
        }
    };
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", frac(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", frac(ns, 1_000_000));
    }
    let secs_ns = ns % 60_000_000_000;
    let mins = (ns / 60_000_000_000) % 60;
    let hours = ns / 3_600_000_000_000;
    let secs = format!("{}s", frac(secs_ns, 1_000_000_000));
    if hours > 0 {
        format!("{hours}h{mins}m{secs}")
    } else if mins > 0 {
        format!("{mins}m{secs}")
    } else {
        secs
    }
}

/// Longest duration any field takes: beyond it a value is a typo (and a deadline computed from it
/// could overflow), whatever the field's own range.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses Go's duration syntax (`[0-9.]+(ns|us|µs|ms|s|m|h)` repeated, or a bare `0`), then
/// falls back to humantime. Negative durations, and durations over a year, are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = match parse_go_duration(t) {
        Some(d) => d,
        None => humantime::parse_duration(t).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => too_long(s),
            _ => format!("`{s}` is not a duration (expected e.g. `30s`, `1h0m0s`, `24h`)"),
        })?,
    };
    if d > MAX_DURATION {
        return Err(too_long(s));
    }
    Ok(d)
}

fn too_long(s: &str) -> String {
    format!("`{s}` is too long: no duration may exceed a year (8760h)")
}

fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut rest = s;
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale_ns = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * scale_ns;
    }
    if !total.is_finite() {
        return None;
    }
    // Saturates: anything this long is refused as over MAX_DURATION by the caller.
    Some(Duration::from_nanos(
        total.min(u64::MAX as f64).round() as u64
    ))
}

/// The allowed values of one numeric field (docs/config.md lists the same table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Int { min: u64, max: u64 },
    Time { min: Duration, max: Duration },
}

/// Every numeric field, its range, and what 0 means where 0 is special. `validate` checks each;
/// a test checks that docs/config.md states each.
pub const RANGES: &[(&str, Limit, &str)] = &[
    (
        "conntrack.maxEntries",
        Limit::Int {
            min: 0,
            max: MAX_CONNTRACK_ENTRIES as u64,
        },
        "0: the default, 1048576",
    ),
    (
        "conntrack.tcpEstablishedTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 24h",
    ),
    (
        "conntrack.tcpCloseWaitTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 1h",
    ),
    (
        "conntrack.udpTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 30s",
    ),
    (
        "conntrack.udpStreamTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 2m",
    ),
    (
        "sync.minSyncPeriod",
        Limit::Time {
            min: Duration::ZERO,
            max: Duration::from_secs(3600),
        },
        "",
    ),
    (
        "sync.syncPeriod",
        Limit::Time {
            min: Duration::from_millis(10),
            max: Duration::from_secs(24 * 3600),
        },
        "",
    ),
    (
        "workers.count",
        Limit::Int {
            min: 1,
            max: MAX_WORKERS as u64,
        },
        "",
    ),
    (
        "workers.cpus",
        Limit::Int {
            min: 0,
            max: MAX_CPU_ID as u64,
        },
        "each entry; and it must be a CPU this machine has",
    ),
    (
        "workers.idle.spinPolls",
        Limit::Int {
            min: 0,
            max: 100_000_000,
        },
        "",
    ),
    (
        "workers.idle.maxSleep",
        Limit::Time {
            min: Duration::from_micros(10),
            max: Duration::from_secs(1),
        },
        "",
    ),
    (
        "afxdp.frames",
        Limit::Int {
            min: MIN_UMEM_FRAMES as u64,
            max: MAX_UMEM_FRAMES as u64,
        },
        "",
    ),
    (
        "afxdp.rxRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two, at most afxdp.frames",
    ),
    (
        "afxdp.fillRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two, at most afxdp.frames",
    ),
    (
        "afxdp.txRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two",
    ),
    (
        "afxdp.completionRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two",
    ),
    (
        "loadBalancing.maglevTableSize",
        Limit::Int {
            min: kxdp_dataplane::maglev::MIN_TABLE_SIZE as u64,
            max: kxdp_dataplane::maglev::MAX_TABLE_SIZE as u64,
        },
        "a prime",
    ),
];

/// Fewer UMEM frames than this cannot give a worker's sockets their smallest fill shares and a
/// batch in hand.
pub const MIN_UMEM_FRAMES: u32 = 1024;
/// 1 Mi frames: 4 GiB of packet buffers per worker; more is a typo, not a node.
pub const MAX_UMEM_FRAMES: u32 = 1 << 20;
/// The smallest ring: one batch (`worker::BATCH`).
pub const MIN_RING: u32 = 64;
/// The deepest ring: 64 Ki entries (1 MiB of descriptors for an RX or TX ring, per socket).
pub const MAX_RING: u32 = 1 << 16;

/// 64 Mi entries: about 14 GiB of table; more is a typo, not a node.
pub const MAX_CONNTRACK_ENTRIES: u32 = 1 << 26;
/// The kernel's `nf_conntrack_tcp_timeout_established` default is 5 days; 30 days is plenty.
pub const MAX_CT_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
pub const MAX_WORKERS: usize = 256;
/// Linux's largest CPU number on x86-64 (`CONFIG_NR_CPUS` at most 8192).
pub const MAX_CPU_ID: usize = 8191;

/// Bytes the conntrack table allocates up front for `max_entries`
/// (`kxdp_dataplane::conntrack::table_bytes`: 112-byte entries for `max + max/128` entries, and
/// 4-byte index slots, 3.2 per entry, at least 2^17 below about 40k entries).
pub fn conntrack_bytes(max_entries: u32) -> u64 {
    kxdp_dataplane::conntrack::table_bytes(max_entries)
}

/// What the machine offers, for `check_machine`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// CPU numbers online (`/sys/devices/system/cpu/online`).
    pub cpus: BTreeSet<usize>,
    /// Bytes this process may still allocate: MemAvailable, or the cgroup's limit minus its
    /// usage when lower. None: unknown (not checked).
    pub memory_available: Option<u64>,
}

impl Machine {
    /// Reads the machine's CPUs and memory from /sys and /proc.
    pub fn probe() -> Machine {
        let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| parse_cpu_list(&s))
            .unwrap_or_else(|| {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..n).collect()
            });
        let meminfo = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| meminfo_field(&s, "MemAvailable:"));
        let cgroup = cgroup_memory_left();
        let memory_available = match (meminfo, cgroup) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Machine {
            cpus,
            memory_available,
        }
    }
}

/// Parses the kernel's CPU list format: `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<BTreeSet<usize>> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b > MAX_CPU_ID {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    Some(out)
}

/// `0-3,8` back from a set.
fn format_cpu_list(cpus: &BTreeSet<usize>) -> String {
    let mut parts = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end = it.next().unwrap_or(end);
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

fn meminfo_field(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line[name.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// cgroup v2: `memory.max` minus `memory.current` of this process's cgroup (a pod's limit).
fn cgroup_memory_left() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max": no limit
    let cur: u64 = std::fs::read_to_string(dir.join("memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(max.saturating_sub(cur))
}

fn mib(b: u64) -> u64 {
    b.div_ceil(1 << 20)
}

/// yaml_serde prefixes messages with its own (coarser) idea of the path and appends the
/// position; the path from serde_path_to_error is the one shown and the line goes in its own
/// place, so drop both.
fn strip_yaml_path(msg: &str, path: &str) -> String {
    let msg = match msg.rfind(" at line ") {
        Some(i) if msg[i..].contains(" column ") => &msg[..i],
        _ => msg,
    };
    if let Some((head, rest)) = msg.split_once(": ") {
        if !head.contains(' ') && (path.starts_with(head) || head == ".") {
            return rest.to_string();
        }
    }
    msg.to_string()
}

/// serde's messages in plain words: no Rust type names (`expected u32`), `map` is a mapping.
fn plain_words(msg: &str, field: &str) -> String {
    let range = range_of(field).map(|(l, _)| match l {
        Limit::Int { min, max } => format!("a whole number from {min} to {max}"),
        Limit::Time { .. } => "a duration".to_string(),
    });
    let number = range.unwrap_or_else(|| "a whole number".to_string());
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((name, known)) = rest.split_once("`, expected one of ") {
            let known: Vec<&str> = known.split(", ").map(|k| k.trim_matches('`')).collect();
            let hint = known
                .iter()
                .find(|k| k.eq_ignore_ascii_case(name))
                .map(|k| format!("did you mean `{k}`? "))
                .unwrap_or_default();
            return format!(
                "unknown field `{name}` ({hint}known fields here: {})",
                known.join(", ")
            );
        }
    }
    let mut m = msg.to_string();
    for ty in [
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "isize",
    ] {
        let pat = format!("expected {ty}");
        if m.ends_with(&pat) {
            m = format!("{}expected {number}", &m[..m.len() - pat.len()]);
        }
    }
    m = m
        .replace("expected a sequence", "expected a list")
        .replace("invalid type: map,", "got a mapping,")
        .replace("invalid type: sequence,", "got a list,")
        .replace("invalid type: ", "got ")
        .replace("invalid value: integer", "got")
        .replace("invalid value: ", "got ")
        .replace("expected a boolean", "expected true or false")
        .replace("got string ", "got the text ")
        .replace("got integer ", "got ")
        .replace("got floating point ", "got ")
        .replace("struct DataplaneConfiguration", "a mapping")
        .replace("struct ", "a mapping ");
    // "got `-1`, ..." -> "got -1, ...": numbers need no quoting.
    if let Some(rest) = m.strip_prefix("got `") {
        if let Some((n, tail)) = rest.split_once('`') {
            if n.parse::<f64>().is_ok() {
                m = format!("got {n}{tail}");
            }
        }
    }
    m
}

fn range_of(field: &str) -> Option<(Limit, &'static str)> {
    // `nodeOverrides[0].workers.count` has the range of `workers.count`, `workers.cpus[1]` that
    // of `workers.cpus`.
    let f = match field.strip_prefix("nodeOverrides[") {
        Some(r) => r.split_once("].").map_or(field, |(_, r)| r),
        None => field,
    };
    let base = f.split('[').next().unwrap_or(f);
    RANGES
        .iter()
        .find(|(f, _, _)| *f == base)
        .map(|(_, l, n)| (*l, *n))
}

/// The line (1-based) where a dotted field path is written, found by looking for each key in
/// turn after the previous one. None when it is not written (a default, or a missing field).
pub fn line_of(text: &str, field: &str) -> Option<usize> {
    let mut pos = 0;
    let mut found = false;
    for seg in field.split('.') {
        let key = seg.split('[').next().unwrap_or(seg);
        if key.is_empty() {
            continue;
        }
        let hit = [
            format!("{key}:"),
            format!("\"{key}\":"),
            format!("'{key}':"),
        ]
        .iter()
        .filter_map(|pat| {
            text[pos..].match_indices(pat.as_str()).find_map(|(i, _)| {
                let at = pos + i;
                // A whole key: not the tail of a longer one.
                let before = text[..at].chars().next_back();
                let whole = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                whole.then_some(at)
            })
        })
        .min();
        match hit {
            Some(at) => {
                pos = at;
                found = true;
            }
            None => return found.then(|| text[..pos].lines().count().max(1)),
        }
    }
    found.then(|| text[..pos].matches('\n').count() + 1)
}

/// A config that could not be loaded: the file, line and field path, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line of the offending field, when known.
    pub line: Option<usize>,
    /// Dotted field path (`conntrack.maxEntries`); empty for file-level errors.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.field.is_empty() || self.field == "." {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: None,
        field: String::new(),
        message: format!("cannot read: {e}"),
    })
}

/// A config directory's files in the order they apply (see `DataplaneConfiguration::load_dir`).
pub fn config_dir_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("cannot list the directory: {e}"))? {
        let entry = entry.map_err(|e| format!("cannot list the directory: {e}"))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // Followed: a ConfigMap volume's files are links into its `..data` directory.
        if name.starts_with('.') || !name.ends_with(".yaml") || !entry.path().is_file() {
            continue;
        }
        files.push(entry.path());
    }
    files.sort_by_key(|p| (!p.ends_with("config.yaml"), p.clone()));
    if files.is_empty() {
        return Err("no configuration in the directory (no *.yaml file)".into());
    }
    Ok(files)
}

/// `over` written over `base`: mappings merge key by key, anything else replaces.
fn merge_yaml(base: &mut yaml_serde::Value, over: yaml_serde::Value) {
    match (base, over) {
        (yaml_serde::Value::Mapping(b), yaml_serde::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge_yaml(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Whether `text` writes the dotted `field` (each of its keys, in turn).
fn writes_field(text: &str, field: &str) -> bool {
    let Ok(v) = yaml_serde::from_str::<yaml_serde::Value>(text) else {
        return false;
    };
    let mut at = &v;
    for seg in field.split('.') {
        let key = seg.split('[').next().unwrap_or(seg);
        if key.is_empty() {
            continue;
        }
        match at.get(key) {
            Some(next) => at = next,
            None => return false,
        }
    }
    !field.is_empty()
}

/// The `apiVersion` and `kind` of a kube-proxy configuration file.
pub const KUBE_PROXY_KIND: &str = "KubeProxyConfiguration";

/// Whether `text` is a KubeProxyConfiguration (any apiVersion).
pub fn is_kube_proxy_configuration(text: &str) -> bool {
    yaml_serde::from_str::<yaml_serde::Value>(text)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
        .is_some_and(|k| k == KUBE_PROXY_KIND)
}

impl DataplaneConfiguration {
    /// Reads and validates a config file, or a directory of them (`load_dir`); an empty
    /// `nodeName` becomes `$NODE_NAME`, else the hostname (as kube-proxy's `hostnameOverride`
    /// falls back to the hostname).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut cfg = if path.is_dir() {
            Self::load_dir(path)?
        } else {
            Self::from_yaml_str(&read_config(path)?, path)?
        };
        cfg.node_name = default_node_name(
            &cfg.node_name,
            std::env::var("NODE_NAME").ok().as_deref(),
            hostname().as_deref(),
        );
        Ok(cfg)
    }

    /// A config directory (a ConfigMap mounted whole): `config.yaml` first, then every other
    /// `*.yaml` file in name order, each setting the fields it writes over those before it (a
    /// mapping merges key by key, anything else, lists included, is replaced). So a deployment
    /// preset adds a file with its `interfaces` and keeps the rest of the base's `config.yaml`.
    /// Names starting with `.` (the ConfigMap volume's own `..data`) are skipped. An error names
    /// the file and line that wrote the field at fault (the last one that writes it).
    pub fn load_dir(dir: &Path) -> Result<Self, ConfigError> {
        let err = |file: &Path, line: Option<usize>, message: String| ConfigError {
            file: file.to_path_buf(),
            line,
            field: String::new(),
            message,
        };
        let files = config_dir_files(dir).map_err(|e| err(dir, None, e))?;
        let mut texts = Vec::with_capacity(files.len());
        for f in files {
            let text = read_config(&f)?;
            crate::yaml::check(&text).map_err(|e| err(&f, None, e.to_string()))?;
            texts.push((f, text));
        }
        if let [(file, text)] = &texts[..] {
            return Self::from_yaml_str(text, file);
        }
        let mut merged = yaml_serde::Value::Mapping(Default::default());
        for (file, text) in &texts {
            if is_kube_proxy_configuration(text) {
                // (Refused, with the way to convert it.)
                return Self::from_yaml_str(text, file);
            }
            let v: yaml_serde::Value = yaml_serde::from_str(text)
                .map_err(|e| err(file, e.location().map(|l| l.line()), e.to_string()))?;
            match v {
                yaml_serde::Value::Null => {}
                v @ yaml_serde::Value::Mapping(_) => merge_yaml(&mut merged, v),
                _ => {
                    return Err(err(
                        file,
                        None,
                        "must be a mapping of DataplaneConfiguration fields".into(),
                    ))
                }
            }
        }
        let text = yaml_serde::to_string(&merged).expect("a YAML value always serializes");
        Self::from_yaml_str(&text, dir).map_err(|mut e| {
            // The file that wrote the field, at its line; else the directory.
            match texts
                .iter()
                .rev()
                .find_map(|(f, t)| writes_field(t, &e.field).then(|| (f, line_of(t, &e.field))))
            {
                Some((f, line)) => {
                    e.file = f.clone();
                    e.line = line;
                }
                None => e.line = None,
            }
            e
        })
    }

    /// Parses and validates config text; `file` only names the source in errors.
    pub fn from_yaml_str(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let err = |field: String, line: Option<usize>, message: String| ConfigError {
            file: file.to_path_buf(),
            line,
            field,
            message,
        };
        crate::yaml::check(text).map_err(|e| err(String::new(), None, e.to_string()))?;
        if is_kube_proxy_configuration(text) {
            return Err(err(
                "kind".into(),
                line_of(text, "kind"),
                format!(
                    "this is kube-proxy's configuration (KubeProxyConfiguration), not kxdp's: \
                     run `kxdp config convert {}` to print the equivalent DataplaneConfiguration \
                     (and the fields it cannot carry over)",
                    file.display()
                ),
            ));
        }
        let de = yaml_serde::Deserializer::from_str(text);
        let cfg: DataplaneConfiguration = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            // The field's own line; yaml_serde's position is that of the enclosing value for
            // errors raised by a field's own parser, so it is only the fallback (syntax errors).
            let line = line_of(text, &field).or_else(|| inner.location().map(|l| l.line()));
            let msg = strip_yaml_path(&inner.to_string(), &field);
            err(field.clone(), line, plain_words(&msg, &field))
        })?;
        cfg.validate()
            .map_err(|(f, m)| err(f.clone(), line_of(text, &f), m))?;
        Ok(cfg)
    }

    /// Checks what serde cannot: the header, refused options, feature gate names, ranges.
    fn validate(&self) -> Result<(), (String, String)> {
        if self.api_version != API_VERSION {
            return Err((
                "apiVersion".into(),
                format!("must be `{API_VERSION}`, not `{}`", self.api_version),
            ));
        }
        if self.kind != KIND {
            return Err((
                "kind".into(),
                format!("must be `{KIND}`, not `{}`", self.kind),
            ));
        }
        if self.localhost_node_ports {
            return Err((
                "localhostNodePorts".into(),
                "true is not supported: kxdp sees traffic on the wire (AF_XDP), never on loopback; set it to false".into(),
            ));
        }
        for name in self.feature_gates.keys() {
            if !FEATURE_GATES.iter().any(|(g, _)| g == name) {
                let known: Vec<&str> = FEATURE_GATES.iter().map(|(g, _)| *g).collect();
                return Err((
                    format!("featureGates.{name}"),
                    format!("unknown feature gate (known: {})", known.join(", ")),
                ));
            }
        }
        if self.nodeport_has_primary_mixed() {
            return Err((
                "nodePortAddresses".into(),
                "`primary` must be the only entry".into(),
            ));
        }
        if self.conntrack.state_file_huge_pages && self.conntrack.state_file() == StateFile::Off {
            return Err((
                "conntrack.stateFileHugePages".into(),
                "true needs a conntrack.stateFile (the huge pages are the state file's), and stateFile is \"\" (process memory); set a path there (or leave it unset for the default) or set this to false".into(),
            ));
        }
        for (i, name) in self.host_path.overlay_interfaces.iter().enumerate() {
            check_interface_name(name)
                .map_err(|m| (format!("hostPath.overlayInterfaces[{i}]"), m))?;
        }
        self.check_ranges()?;
        let size = self.load_balancing.maglev_table_size;
        if !kxdp_dataplane::maglev::is_prime(size.into()) {
            let near = kxdp_dataplane::maglev::LADDER
                .iter()
                .min_by_key(|&&p| p.abs_diff(size))
                .copied()
                .unwrap_or(kxdp_dataplane::maglev::DEFAULT_TABLE_SIZE);
            return Err((
                "loadBalancing.maglevTableSize".into(),
                format!("{size} is not a prime (Maglev needs a prime table size), e.g. {near}"),
            ));
        }
        for (i, o) in self.node_overrides.iter().enumerate() {
            let mut applied = self.clone();
            applied.apply(o);
            applied
                .check_ranges()
                .map_err(|(f, m)| (format!("nodeOverrides[{i}].{f}"), m))?;
        }
        Ok(())
    }

    /// The numeric fields with their values, in `RANGES` order.
    fn numeric_values(&self) -> Vec<(String, Numeric)> {
        let c = &self.conntrack;
        let w = &self.workers;
        let mut v = vec![
            (
                "conntrack.maxEntries".to_string(),
                Numeric::Int(c.max_entries.into()),
            ),
            (
                "conntrack.tcpEstablishedTimeout".into(),
                Numeric::Time(c.tcp_established_timeout.0),
            ),
            (
                "conntrack.tcpCloseWaitTimeout".into(),
                Numeric::Time(c.tcp_close_wait_timeout.0),
            ),
            (
                "conntrack.udpTimeout".into(),
                Numeric::Time(c.udp_timeout.0),
            ),
            (
                "conntrack.udpStreamTimeout".into(),
                Numeric::Time(c.udp_stream_timeout.0),
            ),
            (
                "sync.minSyncPeriod".into(),
                Numeric::Time(self.sync.min_sync_period.0),
            ),
            (
                "sync.syncPeriod".into(),
                Numeric::Time(self.sync.sync_period.0),
            ),
            ("workers.count".into(), Numeric::Int(w.count as u64)),
        ];
        for (i, cpu) in w.cpus.iter().enumerate() {
            v.push((format!("workers.cpus[{i}]"), Numeric::Int(*cpu as u64)));
        }
        v.push((
            "workers.idle.spinPolls".into(),
            Numeric::Int(w.idle.spin_polls.into()),
        ));
        v.push((
            "workers.idle.maxSleep".into(),
            Numeric::Time(w.idle.max_sleep.0),
        ));
        let x = &self.afxdp;
        for (f, n) in [
            ("afxdp.frames", x.frames),
            ("afxdp.rxRingSize", x.rx_ring_size),
            ("afxdp.fillRingSize", x.fill_ring_size),
            ("afxdp.txRingSize", x.tx_ring_size),
            ("afxdp.completionRingSize", x.completion_ring_size),
        ] {
            v.push((f.into(), Numeric::Int(n.into())));
        }
        v.push((
            "loadBalancing.maglevTableSize".into(),
            Numeric::Int(self.load_balancing.maglev_table_size.into()),
        ));
        v
    }

    fn check_ranges(&self) -> Result<(), (String, String)> {
        for (field, value) in self.numeric_values() {
            let Some((limit, note)) = range_of(&field) else {
                continue;
            };
            let note = if note.is_empty() || note.starts_with("each") {
                String::new()
            } else {
                format!(" ({note})")
            };
            match (limit, value) {
                (Limit::Int { min, max }, Numeric::Int(v)) => {
                    if v > max {
                        return Err((field, format!("{v} is too large: at most {max}{note}")));
                    }
                    if v < min {
                        return Err((field, format!("{v} is too small: at least {min}{note}")));
                    }
                }
                (Limit::Time { min, max }, Numeric::Time(v)) => {
                    let show = format_go_duration;
                    if v > max {
                        return Err((
                            field,
                            format!("{} is too long: at most {}{note}", show(v), show(max)),
                        ));
                    }
                    if v < min {
                        return Err((
                            field,
                            format!("{} is too short: at least {}{note}", show(v), show(min)),
                        ));
                    }
                }
                _ => {}
            }
        }
        self.afxdp.check()
    }

    fn nodeport_has_primary_mixed(&self) -> bool {
        self.node_port_addresses.len() > 1
            && self.node_port_addresses.contains(&NodePortAddress::Primary)
    }

    /// Applies one override's fields.
    fn apply(&mut self, o: &NodeOverride) {
        if let Some(i) = &o.interfaces {
            self.interfaces = i.clone();
        }
        if let Some(m) = o.xdp_mode {
            self.xdp_mode = m;
        }
        if let Some(w) = &o.workers {
            if let Some(c) = w.count {
                self.workers.count = c;
            }
            if let Some(c) = &w.cpus {
                self.workers.cpus = c.clone();
            }
            if let Some(i) = &w.idle {
                self.workers.idle = i.clone();
            }
        }
        if let Some(x) = &o.afxdp {
            self.afxdp = x.clone();
        }
    }

    /// This node's configuration: the top-level fields, then every `nodeOverrides` entry whose
    /// selector matches `labels`, in file order (a later match wins for the fields it sets).
    /// Returns the configuration and the indexes of the overrides applied.
    pub fn for_node(&self, labels: &BTreeMap<String, String>) -> (Self, Vec<usize>) {
        let mut out = self.clone();
        let mut applied = Vec::new();
        for (i, o) in self.node_overrides.iter().enumerate() {
            if o.node_selector.matches(labels) {
                out.apply(o);
                applied.push(i);
            }
        }
        (out, applied)
    }

    /// Checks the configuration against the machine it is about to run on: every CPU in
    /// `workers.cpus` exists, and the memory it asks for (the conntrack table; with
    /// `with_umem`, one UMEM per worker) is available. `file` names the source in errors.
    pub fn check_machine(
        &self,
        machine: &Machine,
        with_umem: bool,
        file: &Path,
    ) -> Result<(), ConfigError> {
        self.check_cpus(machine, file)?;
        self.check_memory(machine, with_umem, file)
    }

    /// `interfaces` against the node's links: an entry that matches a bridge while an entry
    /// matches, or could match, the bridge's ports is refused (the kernel takes XDP on a bridge
    /// or on its ports, not both; every pod created later would be refused its program).
    pub fn check_interfaces(
        &self,
        links: &[kxdp_dataplane::fib::Link],
        file: &Path,
    ) -> Result<(), ConfigError> {
        for bridge in links {
            let Some((on_bridge, on_port, port)) =
                kxdp_dataplane::io::runner::bridge_conflict(&self.interfaces, bridge, links)
            else {
                continue;
            };
            let i = self
                .interfaces
                .iter()
                .position(|p| p == on_bridge)
                .unwrap_or(0);
            return Err(ConfigError {
                file: file.to_path_buf(),
                line: None,
                field: format!("interfaces[{i}]"),
                message: format!(
                    "`{on_bridge}` matches the bridge {} and `{on_port}` matches its port {port}: \
                     the kernel takes XDP on a bridge or on its ports, not both, so pods created \
                     later could not be attached; list the ports only (remove `{on_bridge}`, \
                     e.g. interfaces: [eth0, \"veth*\"]; docs/afxdp.md § Bridges)",
                    bridge.name
                ),
            });
        }
        Ok(())
    }

    /// The CPU half of `check_machine`: every CPU in `workers.cpus` is online.
    pub fn check_cpus(&self, machine: &Machine, file: &Path) -> Result<(), ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            file: file.to_path_buf(),
            line: None,
            field: field.to_string(),
            message,
        };
        for (i, cpu) in self.workers.cpus.iter().enumerate() {
            if !machine.cpus.contains(cpu) {
                return Err(err(
                    &format!("workers.cpus[{i}]"),
                    format!(
                        "CPU {cpu} does not exist on this machine (its CPUs: {})",
                        format_cpu_list(&machine.cpus)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The memory half of `check_machine` (what `replay` checks: it pins no worker to the
    /// configured CPUs, but allocates the conntrack table).
    pub fn check_memory(
        &self,
        machine: &Machine,
        with_umem: bool,
        file: &Path,
    ) -> Result<(), ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            file: file.to_path_buf(),
            line: None,
            field: field.to_string(),
            message,
        };
        let Some(available) = machine.memory_available else {
            return Ok(());
        };
        let ct = conntrack_bytes(self.ct_config().max_entries);
        let umem = if with_umem {
            self.afxdp.umem_bytes() * self.workers.count as u64
        } else {
            0
        };
        if ct + umem > available {
            let (field, what) = if umem > ct {
                (
                    "workers.count",
                    format!(
                        "{} workers need {} MiB of packet buffers (UMEM, {} MiB each) plus {} MiB of conntrack table",
                        self.workers.count,
                        mib(umem),
                        mib(self.afxdp.umem_bytes()),
                        mib(ct)
                    ),
                )
            } else {
                (
                    "conntrack.maxEntries",
                    format!(
                        "a conntrack table of {} entries needs {} MiB{}",
                        self.ct_config().max_entries,
                        mib(ct),
                        if umem > 0 {
                            format!(" plus {} MiB of packet buffers (UMEM)", mib(umem))
                        } else {
                            String::new()
                        }
                    ),
                )
            };
            return Err(err(
                field,
                format!(
                    "{what}, but only {} MiB is available on this machine",
                    mib(available)
                ),
            ));
        }
        Ok(())
    }

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

#[derive(Clone, Copy, Debug)]
enum Numeric {
    Int(u64),
    Time(Duration),
}

/// `nodeName` when the file leaves it empty: `NODE_NAME` (the downward API), else the
/// hostname, lowercased as kube-proxy does.
pub fn default_node_name(configured: &str, env: Option<&str>, hostname: Option<&str>) -> String {
    if !configured.is_empty() {
        return configured.to_string();
    }
    if let Some(n) = env.map(str::trim).filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    hostname
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_default()
}

/// The kernel's hostname (no libc call needed).
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\n";

    fn load(body: &str) -> Result<Config, ConfigError> {
        Config::from_yaml_str(&format!("{HEADER}{body}"), Path::new("config.yaml"))
    }

    fn load_err(body: &str) -> String {
        load(body).unwrap_err().to_string()
    }

    #[test]
    fn load_balancing_section() {
        let c = load("").unwrap();
        assert_eq!(c.load_balancing.algorithm, LbAlgorithm::Random);
        assert_eq!(c.load_balancing.maglev_table_size, 16381);
        let c = load("loadBalancing: {algorithm: maglev, maglevTableSize: 65521, maglevSeed: 7}\n")
            .unwrap();
        assert_eq!(c.load_balancing.algorithm, LbAlgorithm::Maglev);
        assert_eq!(c.load_balancing.maglev_seed, "7");
        let c = load("loadBalancing: {maglevSeed: prod-eu}\n").unwrap();
        assert_eq!(c.load_balancing.maglev_seed, "prod-eu");
        assert_eq!(
            load_err("loadBalancing:\n  maglevTableSize: 16384\n"),
            "config.yaml:4: loadBalancing.maglevTableSize: 16384 is not a prime (Maglev needs a prime table size), e.g. 16381"
        );
        assert_eq!(
            load_err("loadBalancing: {maglevTableSize: 13}\n"),
            "config.yaml:3: loadBalancing.maglevTableSize: 13 is too small: at least 251 (a prime)"
        );
        assert!(load_err("loadBalancing: {algorithm: ring}\n").contains("loadBalancing.algorithm"));
        assert!(load_err("loadBalancing: {maglevSeed: [1]}\n")
            .contains("must be a string or an integer"));
    }

    #[test]
    fn host_path_section() {
        let c = load("").unwrap();
        assert!(c.host_path.enabled);
        assert_eq!(c.host_path.node_port_range, PortRange(30000, 32767));
        let c = load("hostPath: {enabled: false, nodePortRange: 20000-20100}\n").unwrap();
        assert!(!c.host_path.enabled);
        assert_eq!(c.host_path.node_port_range, PortRange(20000, 20100));
        for bad in ["32767-30000", "0-10", "30000", "30000-70000", "a-b"] {
            let e = load_err(&format!("hostPath: {{nodePortRange: \"{bad}\"}}\n"));
            assert!(
                e.contains("hostPath.nodePortRange") && e.contains(bad),
                "{e}"
            );
        }
        assert!(load_err("hostPath: {on: true}\n").contains("hostPath"));
        assert_eq!(c.host_path.overlay_interfaces, DEFAULT_OVERLAY_INTERFACES);
        let c = load("hostPath: {overlayInterfaces: [wg0, tun-lab]}\n").unwrap();
        assert_eq!(c.host_path.overlay_interfaces, ["wg0", "tun-lab"]);
        for bad in ["\"flannel*\"", "\"\"", "a-name-longer-than-15"] {
            let e = load_err(&format!("hostPath: {{overlayInterfaces: [ok0, {bad}]}}\n"));
            assert!(e.contains("hostPath.overlayInterfaces[1]"), "{e}");
        }
    }

    #[test]
    fn interfaces_matching_a_bridge_and_its_ports_are_refused() {
        let link = |ifindex, name: &str, master, bridge| kxdp_dataplane::fib::Link {
            ifindex,
            name: name.into(),
            mac: Some([2; 6]),
            master,
            bridge,
            peer: None,
            rx_queues: 1,
        };
        let links = vec![
            link(2, "eth0", None, false),
            link(3, "cni0", None, true),
            link(4, "veth1234abcd", Some(3), false),
        ];
        let cfg = |ifs: &str| load(&format!("interfaces: {ifs}\n")).unwrap();
        let f = Path::new("config.yaml");
        let e = cfg("[eth0, \"veth*\", cni0]")
            .check_interfaces(&links, f)
            .unwrap_err();
        assert_eq!(e.field, "interfaces[2]");
        assert!(e.message.contains("veth1234abcd"), "{}", e.message);
        assert!(e.message.contains("[eth0, \"veth*\"]"), "{}", e.message);
        // No port yet: a pattern that could match one is refused too; `*` matches both.
        let e = cfg("[eth0, \"veth*\", cni0]")
            .check_interfaces(&links[..2], f)
            .unwrap_err();
        assert!(e.message.contains("created later"), "{}", e.message);
        assert_eq!(
            cfg("[\"*\"]")
                .check_interfaces(&links, f)
                .unwrap_err()
                .field,
            "interfaces[0]"
        );
        // The ports only, or the bridge only: fine.
        cfg("[eth0, \"veth*\"]")
            .check_interfaces(&links, f)
            .unwrap();
        cfg("[eth0, cni0]").check_interfaces(&links, f).unwrap();
        cfg("[]").check_interfaces(&links, f).unwrap();
    }

    #[test]
    fn xdp_mode_and_idle_back_off() {
        let c = load("").unwrap();
        assert_eq!(c.xdp_mode, XdpMode::Auto);
        assert_eq!(c.workers.idle, IdleConfig::default());
        let c =
            load("xdpMode: generic\nworkers: {count: 2, idle: {spinPolls: 10, maxSleep: 50us}}\n")
                .unwrap();
        assert_eq!(c.xdp_mode, XdpMode::Generic);
        assert_eq!(c.workers.idle.spin_polls, 10);
        assert_eq!(c.workers.idle.max_sleep.0, Duration::from_micros(50));
        assert!(load_err("xdpMode: turbo\n").contains("xdpMode"));
        assert_eq!(c.source_validation, SourceValidation::Strict);
        let off = load("sourceValidation: off\n").unwrap();
        assert_eq!(off.source_validation, SourceValidation::Off);
        assert!(load_err("sourceValidation: loose\n").contains("sourceValidation"));
        assert!(load_err("workers: {idle: {spin: 1}}\n").contains("workers.idle"));
    }

    #[test]
    fn defaults() {
        let c = load("").unwrap();
        assert_eq!(c.node_name, "");
        assert!(c.node_ips.is_empty() && c.cluster_cidrs.is_empty() && c.service_cidrs.is_empty());
        assert!(c.node_port_addresses.is_empty());
        assert!(!c.masquerade_all && !c.localhost_node_ports);
        assert!(c.feature_enabled("PreferSameTrafficDistribution"));
        assert_eq!(c.conntrack, ConntrackConfig::default());
        assert_eq!(c.ct_config(), CtConfig::default());
        assert_eq!(c.conntrack.max_entries, 1_048_576);
        assert_eq!(
            c.conntrack.tcp_established_timeout.0,
            Duration::from_secs(86400)
        );
        assert_eq!(
            c.conntrack.tcp_close_wait_timeout.0,
            Duration::from_secs(3600)
        );
        assert_eq!(c.conntrack.udp_timeout.0, Duration::from_secs(30));
        assert_eq!(c.conntrack.udp_stream_timeout.0, Duration::from_secs(120));
        assert_eq!(c.sync.min_sync_period.0, Duration::from_secs(1));
        assert_eq!(c.sync.sync_period.0, Duration::from_secs(30));
        assert_eq!(
            c.healthz_bind_address,
            Some("0.0.0.0:10256".parse().unwrap())
        );
        assert_eq!(
            c.metrics_bind_address,
            Some("127.0.0.1:10249".parse().unwrap())
        );
        assert!(c.interfaces.is_empty());
        assert_eq!(
            c.workers,
            WorkersConfig {
                count: 1,
                cpus: vec![],
                idle: IdleConfig::default(),
            }
        );
    }

    #[test]
    fn every_field() {
        let c = load(
            r#"
nodeName: node-a
nodeIPs: [192.168.0.2, "fd00:1::2"]
clusterCIDRs: [10.0.0.0/8, "fd00::/48"]
serviceCIDRs: [172.30.0.0/16, "fd00:30::/108"]
nodePortAddresses: [192.168.0.0/24]
masqueradeAll: true
localhostNodePorts: false
featureGates: {PreferSameTrafficDistribution: false}
conntrack: {maxEntries: 1000, tcpEstablishedTimeout: 1h0m0s, tcpCloseWaitTimeout: 30m, udpTimeout: 10s, udpStreamTimeout: 2m30s}
sync: {minSyncPeriod: 500ms, syncPeriod: 1m}
healthzBindAddress: 127.0.0.1:1
metricsBindAddress: ""
interfaces: [eth0, eth1]
workers: {count: 2, cpus: [0, 1]}
"#,
        )
        .unwrap();
        assert_eq!(c.node_name, "node-a");
        assert_eq!(
            c.node_ips,
            vec![
                "192.168.0.2".parse::<IpAddr>().unwrap(),
                "fd00:1::2".parse().unwrap()
            ]
        );
        assert_eq!(c.cluster_cidrs.len(), 2);
        assert_eq!(
            c.service_cidrs[1],
            "fd00:30::/108".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            c.node_port_addresses,
            vec![NodePortAddress::Cidr("192.168.0.0/24".parse().unwrap())]
        );
        assert!(c.masquerade_all);
        assert!(!c.feature_enabled("PreferSameTrafficDistribution"));
        let ct = c.ct_config();
        assert_eq!(ct.max_entries, 1000);
        assert_eq!(ct.tcp_established, Duration::from_secs(3600));
        assert_eq!(ct.tcp_close_wait, Duration::from_secs(1800));
        assert_eq!(ct.udp, Duration::from_secs(10));
        assert_eq!(ct.udp_stream, Duration::from_secs(150));
        assert_eq!(ct.tcp_syn_sent, CtConfig::default().tcp_syn_sent);
        assert_eq!(c.sync.min_sync_period.0, Duration::from_millis(500));
        assert_eq!(c.sync.sync_period.0, Duration::from_secs(60));
        assert_eq!(c.healthz_bind_address, Some("127.0.0.1:1".parse().unwrap()));
        assert_eq!(c.metrics_bind_address, None);
        assert_eq!(c.interfaces, vec!["eth0", "eth1"]);
        assert_eq!(
            c.workers,
            WorkersConfig {
                count: 2,
                cpus: vec![0, 1],
                idle: IdleConfig::default(),
            }
        );
    }

    #[test]
    fn zero_timeouts_keep_defaults() {
        let c = load("conntrack: {maxEntries: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}").unwrap();
        assert_eq!(c.ct_config(), CtConfig::default());
    }

    #[test]
    fn partial_conntrack_section_keeps_other_defaults() {
        let c = load("conntrack: {udpTimeout: 5s}");
        assert!(c.is_ok(), "{c:?}");
        assert_eq!(c.unwrap().ct_config().udp, Duration::from_secs(5));
    }

    #[test]
    fn durations() {
        let cases: &[(&str, Option<u64>)] = &[
            ("24h", Some(86_400_000)),
            ("1h0m0s", Some(3_600_000)),
            ("1h30m", Some(5_400_000)),
            ("1.5h", Some(5_400_000)),
            ("30s", Some(30_000)),
            ("1s", Some(1000)),
            ("0s", Some(0)),
            ("0", Some(0)),
            ("300ms", Some(300)),
            ("2min", Some(120_000)),
            ("1day", Some(86_400_000)),
            ("", None),
            ("abc", None),
            ("-1s", None),
            ("10", None),
            ("1x", None),
            ("h", None),
        ];
        for &(s, want) in cases {
            let got = parse_duration(s).ok().map(|d| d.as_millis() as u64);
            assert_eq!(got, want, "{s:?}");
        }
    }

    #[test]
    fn bad_duration_names_field() {
        let e = load_err("conntrack: {udpTimeout: forever}");
        assert!(
            e.starts_with("config.yaml:3: conntrack.udpTimeout: `forever` is not a duration"),
            "{e}"
        );
        let e = load_err("sync: {syncPeriod: 10}");
        assert!(e.contains("sync.syncPeriod"), "{e}");
    }

    #[test]
    fn wrong_type_names_field() {
        let e = load_err("conntrack: {maxEntries: lots}");
        assert_eq!(
            e,
            "config.yaml:3: conntrack.maxEntries: got the text \"lots\", expected a whole number from 0 to 67108864"
        );
        let e = load_err("nodeIPs: [192.168.0.300]");
        assert_eq!(
            e,
            "config.yaml:3: nodeIPs[0]: `192.168.0.300` is not an IP address (expected e.g. 192.168.0.10 or fd00::10)"
        );
        let e = load_err("clusterCIDRs: [10.0.0.0/40]");
        assert_eq!(
            e,
            "config.yaml:3: clusterCIDRs[0]: `10.0.0.0/40`: the prefix length 40 is too long (an IPv4 prefix is at most /32)"
        );
        let e = load_err("serviceCIDRs: [10.0.0.0/8, 10.96.0.0/33]");
        assert!(
            e.starts_with("config.yaml:3: serviceCIDRs[1]: `10.96.0.0/33`: the prefix length 33"),
            "{e}"
        );
        let e = load_err("workers: {count: -1}");
        assert_eq!(
            e,
            "config.yaml:3: workers.count: got -1, expected a whole number from 1 to 256"
        );
        let e = load_err("healthzBindAddress: localhost");
        assert!(
            e.starts_with(
                "config.yaml:3: healthzBindAddress: `localhost` is not an address and port"
            ),
            "{e}"
        );
        let e = load_err("nodePortAddresses: [nope]");
        assert!(
            e.starts_with("config.yaml:3: nodePortAddresses[0]: `nope` is not a CIDR"),
            "{e}"
        );
        let e = load_err("interfaces: {eth0: 1}");
        assert!(
            e.starts_with("config.yaml:3: interfaces: got a mapping, expected a list"),
            "{e}"
        );
        for rust in ["u32", "usize", "u64", "invalid type", "IP address syntax"] {
            for body in [
                "conntrack: {maxEntries: lots}",
                "workers: {count: x}",
                "nodeIPs: [1.2.3.4/33]",
            ] {
                assert!(!load_err(body).contains(rust), "{body}: {}", load_err(body));
            }
        }
    }

    #[test]
    fn unknown_fields_rejected_with_path() {
        let e = load_err("nodename: x");
        assert!(
            e.starts_with("config.yaml:3: nodename: unknown field `nodename` (did you mean `nodeName`? known fields here: apiVersion, kind, nodeName,"),
            "{e}"
        );
        let e = load_err("conntrack: {maxPerCore: 1}");
        assert!(
            e.starts_with("config.yaml: conntrack: unknown field `maxPerCore`")
                || e.contains("conntrack"),
            "{e}"
        );
        assert!(e.contains("maxPerCore"), "{e}");
        let e = load_err("sync: {period: 1s}");
        assert!(e.contains("sync") && e.contains("period"), "{e}");
        let e = load_err("workers: {threads: 1}");
        assert!(e.contains("workers") && e.contains("threads"), "{e}");
    }

    #[test]
    fn header_checked() {
        let e = Config::from_yaml_str("kind: DataplaneConfiguration\n", Path::new("c.yaml"))
            .unwrap_err();
        assert!(e.to_string().contains("apiVersion"), "{e}");
        let e = Config::from_yaml_str(
            "apiVersion: v1\nkind: DataplaneConfiguration\n",
            Path::new("c.yaml"),
        )
        .unwrap_err();
        assert_eq!(e.field, "apiVersion");
        let e = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: KubeProxyConfiguration\n",
            Path::new("c.yaml"),
        )
        .unwrap_err();
        assert_eq!(e.field, "kind");
    }

    #[test]
    fn localhost_node_ports_refused() {
        let e = load_err("localhostNodePorts: true");
        assert!(
            e.starts_with("config.yaml:3: localhostNodePorts: true is not supported"),
            "{e}"
        );
        assert!(load("localhostNodePorts: false").is_ok());
    }

    #[test]
    fn state_file_huge_pages_needs_a_state_file() {
        let e = load_err("conntrack: {stateFile: \"\", stateFileHugePages: true}");
        assert!(
            e.starts_with(
                "config.yaml:3: conntrack.stateFileHugePages: true needs a conntrack.stateFile"
            ),
            "{e}"
        );
        let c = load("conntrack: {stateFile: /run/kxdp/ct/conntrack, stateFileHugePages: true}")
            .unwrap();
        assert!(c.conntrack.state_file_huge_pages);
        // Unset: the default path, in huge pages.
        let c = load("conntrack: {stateFileHugePages: true}").unwrap();
        assert_eq!(c.conntrack.state_file(), StateFile::Default);
        assert_eq!(c.conntrack.state_file_path(), Some(DEFAULT_STATE_FILE));
    }

    #[test]
    fn a_directory_applies_config_yaml_then_the_others_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        w(
            "config.yaml",
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: n\nconntrack:\n  maxEntries: 4096\n  stateFile: /run/x/ct\ninterfaces: [eth0]\nworkers: {count: 2}\n",
        );
        // Before config.yaml by name, after it in effect.
        w(
            "aaa.yaml",
            "interfaces: [eth0, \"cali*\"]\nconntrack: {udpTimeout: 5s}\n",
        );
        w("zzz.yaml", "workers: {count: 1}\n");
        // Not configuration: another extension, and the ConfigMap volume's own entries.
        w("notes.txt", "interfaces: [nope]");
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        w(".hidden.yaml", "interfaces: [nope]");
        let c = Config::load(dir.path()).unwrap();
        assert_eq!(c.interfaces, ["eth0", "cali*"]);
        assert_eq!(c.conntrack.max_entries, 4096);
        assert_eq!(c.conntrack.state_file.as_deref(), Some("/run/x/ct"));
        assert_eq!(c.conntrack.udp_timeout.0, Duration::from_secs(5));
        assert_eq!(c.workers.count, 1);
        let files = config_dir_files(dir.path()).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap()).collect();
        assert_eq!(names, ["config.yaml", "aaa.yaml", "zzz.yaml"]);

        // An error names the file (and line) that wrote the field.
        w("zzz.yaml", "# a preset\nworkers:\n  count: 100000\n");
        let e = Config::load(dir.path()).unwrap_err();
        assert_eq!(e.file, dir.path().join("zzz.yaml"));
        assert_eq!(e.line, Some(3), "{e}");
        assert_eq!(e.field, "workers.count");
        w("zzz.yaml", "workers: [1]\n");
        let e = Config::load(dir.path()).unwrap_err();
        assert_eq!(e.file, dir.path().join("zzz.yaml"), "{e}");
        w("zzz.yaml", "- 1\n");
        let e = Config::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.ends_with("zzz.yaml: must be a mapping of DataplaneConfiguration fields"),
            "{e}"
        );
        let empty = tempfile::tempdir().unwrap();
        let e = Config::load(empty.path()).unwrap_err().to_string();
        assert!(e.contains("no configuration in the directory"), "{e}");
    }

    #[test]
    fn the_state_file_is_on_by_default() {
        let c = load("").unwrap();
        assert_eq!(c.conntrack.state_file(), StateFile::Default);
        assert_eq!(
            c.conntrack.state_file_path(),
            Some("/run/kxdp/ct/conntrack")
        );
        let off = load("conntrack: {stateFile: \"\"}").unwrap();
        assert_eq!(off.conntrack.state_file(), StateFile::Off);
        assert_eq!(off.conntrack.state_file_path(), None);
        let set = load("conntrack: {stateFile: /tmp/ct}").unwrap();
        assert_eq!(set.conntrack.state_file(), StateFile::Set("/tmp/ct"));
        // What is written is what /configz shows: unset stays unset.
        assert!(!c.to_yaml().contains("stateFile:"), "{}", c.to_yaml());
        assert!(off.to_yaml().contains("stateFile: ''"), "{}", off.to_yaml());
    }

    #[test]
    fn feature_gates() {
        let e = load_err("featureGates: {NoSuchGate: true}");
        assert!(
            e.starts_with("config.yaml:3: featureGates.NoSuchGate: unknown feature gate"),
            "{e}"
        );
        let c = load("featureGates: {PreferSameTrafficDistribution: true}").unwrap();
        assert!(c.feature_enabled("PreferSameTrafficDistribution"));
        assert!(!c.feature_enabled("NoSuchGate"));
    }

    #[test]
    fn node_port_addresses_primary() {
        let c = load("nodePortAddresses: [primary]").unwrap();
        assert_eq!(c.node_port_addresses, vec![NodePortAddress::Primary]);
        let e = load_err("nodePortAddresses: [primary, 10.0.0.0/8]");
        assert!(e.contains("nodePortAddresses"), "{e}");
    }

    #[test]
    fn workers_count_zero_refused() {
        let e = load_err("workers: {count: 0}");
        assert!(e.contains("workers.count"), "{e}");
    }

    #[test]
    fn json_is_yaml() {
        let c = Config::from_yaml_str(
            r#"{"apiVersion":"kxdp.dev/v1alpha1","kind":"DataplaneConfiguration","nodeName":"n"}"#,
            Path::new("c.json"),
        )
        .unwrap();
        assert_eq!(c.node_name, "n");
    }

    #[test]
    fn missing_file() {
        let e = Config::load(Path::new("/nonexistent/kxdp.yaml")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/kxdp.yaml: cannot read"),
            "{e}"
        );
    }

    // Values that would crash or silently break the daemon are refused in plain words.
    #[test]
    fn huge_conntrack_table_refused() {
        let e = load_err("conntrack:\n  maxEntries: 4294967295\n");
        assert_eq!(
            e,
            "config.yaml:4: conntrack.maxEntries: 4294967295 is too large: at most 67108864 (0: the default, 1048576)"
        );
        assert!(load("conntrack: {maxEntries: 67108864}").is_ok());
    }

    #[test]
    fn absurd_worker_count_refused() {
        let e = load_err("workers:\n  count: 100000\n");
        assert_eq!(
            e,
            "config.yaml:4: workers.count: 100000 is too large: at most 256"
        );
        let e = load_err("workers: {count: 0}");
        assert_eq!(
            e,
            "config.yaml:3: workers.count: 0 is too small: at least 1"
        );
    }

    #[test]
    fn overflowing_duration_refused() {
        let e = load_err("conntrack: {tcpEstablishedTimeout: 18446744073709551s}");
        assert_eq!(
            e,
            "config.yaml:3: conntrack.tcpEstablishedTimeout: `18446744073709551s` is too long: no duration may exceed a year (8760h)"
        );
        let e = load_err("conntrack: {tcpEstablishedTimeout: 99999999999999999999999h}");
        assert!(e.contains("is too long"), "{e}");
        let e = load_err("conntrack: {udpTimeout: 2000h}");
        assert_eq!(
            e,
            "config.yaml:3: conntrack.udpTimeout: 2000h0m0s is too long: at most 720h0m0s (0s: the default, 30s)"
        );
        let e = load_err("sync: {syncPeriod: 1ms}");
        assert!(
            e.contains("sync.syncPeriod: 1ms is too short: at least 10ms"),
            "{e}"
        );
        let e = load_err("workers: {idle: {maxSleep: 5s}}");
        assert!(
            e.contains("workers.idle.maxSleep: 5s is too long: at most 1s"),
            "{e}"
        );
    }

    #[test]
    fn afxdp_ring_sizes_and_frames() {
        let c = load("").unwrap();
        let x = c.afxdp.xsk();
        let d = kxdp_kernel::afxdp::XskConfig::default();
        assert_eq!(
            (x.frames, x.rx_ring_size, x.fill_ring_size, x.tx_ring_size),
            (d.frames, d.rx_ring_size, d.fill_ring_size, d.tx_ring_size),
            "the defaults are the dataplane's"
        );
        let c = load(
            "afxdp: {frames: 16384, rxRingSize: 8192, fillRingSize: 4096, txRingSize: 512, completionRingSize: 1024}",
        )
        .unwrap();
        let x = c.afxdp.xsk();
        assert_eq!(x.frames, 16384);
        assert_eq!(
            (
                x.rx_ring_size,
                x.fill_ring_size,
                x.tx_ring_size,
                x.completion_ring_size
            ),
            (8192, 4096, 512, 1024)
        );
        assert_eq!(c.afxdp.umem_bytes(), 64 << 20);
        // Fields left out keep their defaults.
        let c = load("afxdp: {rxRingSize: 4096}").unwrap();
        assert_eq!(
            (c.afxdp.rx_ring_size, c.afxdp.fill_ring_size),
            (4096, d.fill_ring_size)
        );
        // Rings left out are never deeper than a smaller UMEM can fill.
        let c = load("afxdp: {frames: 4096}").unwrap();
        assert_eq!((c.afxdp.rx_ring_size, c.afxdp.fill_ring_size), (4096, 4096));
        let c = load("afxdp: {frames: 3000, fillRingSize: 1024}").unwrap();
        assert_eq!((c.afxdp.rx_ring_size, c.afxdp.fill_ring_size), (2048, 1024));
        let e = load_err("afxdp: {rxRingSize: 3000}");
        assert!(
            e.contains("afxdp.rxRingSize: 3000 is not a power of two (the kernel sizes rings in powers of two: 2048 or 4096)"),
            "{e}"
        );
        let e = load_err("afxdp: {fillRingSize: 16384}");
        assert!(
            e.contains("afxdp.fillRingSize: 16384 entries cannot be filled from a UMEM of 8192 frames (afxdp.frames): at most 8192"),
            "{e}"
        );
        let e = load_err("afxdp: {frames: 4096, rxRingSize: 8192, fillRingSize: 4096}");
        assert!(
            e.contains("afxdp.rxRingSize: 8192 entries cannot be filled"),
            "{e}"
        );
        let e = load_err("afxdp: {txRingSize: 32}");
        assert!(
            e.contains("afxdp.txRingSize: 32 is too small: at least 64 (a power of two)"),
            "{e}"
        );
        let e = load_err("afxdp: {frames: 100}");
        assert!(
            e.contains("afxdp.frames: 100 is too small: at least 1024"),
            "{e}"
        );
        let e = load_err("afxdp: {ringSize: 4096}");
        assert!(e.contains("afxdp.ringSize: unknown field"), "{e}");
        // The line of the field is named.
        let e = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nafxdp:\n  frames: 8192\n  completionRingSize: 100\n",
            Path::new("config.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("config.yaml:5: afxdp.completionRingSize: 100 is not a power of two"),
            "{e}"
        );
        // A node override replaces the section and is checked as if applied.
        let c = load(
            "nodeOverrides: [{nodeSelector: {matchLabels: {big: \"1\"}}, afxdp: {frames: 65536, rxRingSize: 16384, fillRingSize: 16384}}]",
        )
        .unwrap();
        let labels = BTreeMap::from([("big".to_string(), "1".to_string())]);
        let (n, applied) = c.for_node(&labels);
        assert_eq!(applied, [0]);
        assert_eq!((n.afxdp.frames, n.afxdp.rx_ring_size), (65536, 16384));
        assert_eq!(c.for_node(&BTreeMap::new()).0.afxdp, AfXdpConfig::default());
        let e = load_err(
            "nodeOverrides: [{nodeSelector: {matchLabels: {}}, afxdp: {fillRingSize: 16384}}]",
        );
        assert!(
            e.contains("nodeOverrides[0].afxdp.fillRingSize: 16384 entries cannot be filled"),
            "{e}"
        );
        // The memory check counts the configured UMEM.
        let c = load("afxdp: {frames: 262144}\nworkers: {count: 4}").unwrap();
        let e = c
            .check_machine(&machine(&[0], 2048), true, Path::new("config.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("4 workers need 4096 MiB of packet buffers (UMEM, 1024 MiB each)"),
            "{e}"
        );
    }

    #[test]
    fn every_numeric_field_has_a_range() {
        let c = load("workers: {cpus: [0]}").unwrap();
        let fields: Vec<String> = c
            .numeric_values()
            .into_iter()
            .map(|(f, _)| f.split('[').next().unwrap().to_string())
            .collect();
        for (f, _, _) in RANGES {
            assert!(fields.iter().any(|x| x == f), "{f} not checked");
        }
        for f in &fields {
            assert!(range_of(f).is_some(), "{f} has no range");
        }
    }

    fn machine(cpus: &[usize], mem_mib: u64) -> Machine {
        Machine {
            cpus: cpus.iter().copied().collect(),
            memory_available: Some(mem_mib << 20),
        }
    }

    #[test]
    fn cpus_that_do_not_exist_refused() {
        let c = load("workers: {count: 2, cpus: [0, 99]}").unwrap();
        let e = c
            .check_machine(&machine(&[0, 1], 4096), false, Path::new("config.yaml"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "config.yaml: workers.cpus[1]: CPU 99 does not exist on this machine (its CPUs: 0-1)"
        );
        let c = load("workers: {count: 2, cpus: [0, 1]}").unwrap();
        c.check_machine(&machine(&[0, 1], 4096), false, Path::new("c"))
            .unwrap();
        let e = load_err("workers: {cpus: [100000]}");
        assert!(e.contains("workers.cpus[0]: 100000 is too large"), "{e}");
        // This machine: CPU 0 exists, CPU 8191 almost certainly not.
        let m = Machine::probe();
        assert!(m.cpus.contains(&0), "{m:?}");
        assert!(m.memory_available.is_some_and(|b| b > 0), "{m:?}");
    }

    #[test]
    fn memory_checked_before_allocating() {
        // Default table: ~126 MiB (about 126 bytes per connection).
        let mb = conntrack_bytes(1 << 20) >> 20;
        assert!((120..130).contains(&mb), "{mb}");
        let c = load("conntrack: {maxEntries: 67108864}").unwrap();
        let e = c
            .check_machine(&machine(&[0], 1024), false, Path::new("config.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "config.yaml: conntrack.maxEntries: a conntrack table of 67108864 entries needs "
            ) && e.ends_with("but only 1024 MiB is available on this machine"),
            "{e}"
        );
        let c = load("workers: {count: 256}\ninterfaces: [eth0]").unwrap();
        let e = c
            .check_machine(&machine(&[0], 2048), true, Path::new("config.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "config.yaml: workers.count: 256 workers need 8192 MiB of packet buffers"
            ),
            "{e}"
        );
        // Without interfaces (replay), no UMEM is counted.
        c.check_machine(&machine(&[0], 2048), false, Path::new("c"))
            .unwrap();
    }

    #[test]
    fn cpu_lists() {
        let s = parse_cpu_list("0-3,8,10-11\n").unwrap();
        assert_eq!(
            s.iter().copied().collect::<Vec<_>>(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(format_cpu_list(&s), "0-3,8,10-11");
        assert!(parse_cpu_list("3-1").is_none());
    }

    #[test]
    fn node_name_defaults() {
        assert_eq!(default_node_name("a", Some("b"), Some("c")), "a");
        assert_eq!(default_node_name("", Some("b"), Some("c")), "b");
        assert_eq!(default_node_name("", Some(" "), Some("Node-C\n")), "node-c");
        assert_eq!(default_node_name("", None, None), "");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, HEADER).unwrap();
        let c = Config::load(&p).unwrap();
        let want = default_node_name(
            "",
            std::env::var("NODE_NAME").ok().as_deref(),
            hostname().as_deref(),
        );
        assert!(!want.is_empty());
        assert_eq!(c.node_name, want);
    }

    #[test]
    fn node_overrides_by_labels() {
        let c = load(
            r#"
interfaces: [eth0]
workers: {count: 2, cpus: [0, 1]}
nodeOverrides:
  - nodeSelector: {matchLabels: {node.kubernetes.io/instance-type: m5.large}}
    interfaces: [ens5]
    workers: {count: 1}
  - nodeSelector: {matchLabels: {kxdp.dev/pool: edge, kubernetes.io/os: linux}}
    xdpMode: generic
    workers: {cpus: [3]}
"#,
        )
        .unwrap();
        let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (plain, applied) = c.for_node(&labels(&[("kubernetes.io/os", "linux")]));
        assert!(applied.is_empty());
        assert_eq!(plain.interfaces, ["eth0"]);
        let (m5, applied) =
            c.for_node(&labels(&[("node.kubernetes.io/instance-type", "m5.large")]));
        assert_eq!(applied, [0]);
        assert_eq!(m5.interfaces, ["ens5"]);
        assert_eq!(m5.workers.count, 1);
        assert_eq!(m5.workers.cpus, [0, 1]);
        let (both, applied) = c.for_node(&labels(&[
            ("node.kubernetes.io/instance-type", "m5.large"),
            ("kxdp.dev/pool", "edge"),
            ("kubernetes.io/os", "linux"),
        ]));
        assert_eq!(applied, [0, 1]);
        assert_eq!(both.interfaces, ["ens5"]);
        assert_eq!(
            (both.workers.count, both.workers.cpus.clone()),
            (1, vec![3])
        );
        assert_eq!(both.xdp_mode, XdpMode::Generic);
        // Overrides are range-checked too, and name their entry.
        let e = load_err("nodeOverrides:\n  - nodeSelector: {}\n    workers: {count: 100000}\n");
        assert!(
            e.starts_with("config.yaml:5: nodeOverrides[0].workers.count: 100000 is too large"),
            "{e}"
        );
        let e = load_err("nodeOverrides: [{nodeSelector: {matchExpressions: []}}]");
        assert!(
            e.contains("nodeOverrides[0].nodeSelector") && e.contains("matchExpressions"),
            "{e}"
        );
    }

    #[test]
    fn kube_proxy_configuration_recognised() {
        let e = Config::from_yaml_str(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n",
            Path::new("kube-proxy.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("kube-proxy.yaml:2: kind: this is kube-proxy's configuration (KubeProxyConfiguration), not kxdp's: run `kxdp config convert kube-proxy.yaml`"),
            "{e}"
        );
    }

    #[test]
    fn round_trips_through_yaml() {
        let c = load(
            "nodeName: n\nnodePortAddresses: [primary]\nconntrack: {udpTimeout: 1.5s}\nmetricsBindAddress: \"\"\nnodeOverrides: [{nodeSelector: {matchLabels: {a: b}}, interfaces: [x]}]\n",
        )
        .unwrap();
        let back = Config::from_yaml_str(&c.to_yaml(), Path::new("back.yaml")).unwrap();
        assert_eq!(back, c);
        let d = load("").unwrap();
        assert_eq!(
            Config::from_yaml_str(&d.to_yaml(), Path::new("d")).unwrap(),
            d
        );
    }

    #[test]
    fn go_duration_format() {
        for (d, s) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(150), "2m30s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(300), "300ms"),
            (Duration::from_micros(50), "50µs"),
            (Duration::from_secs(86400), "24h0m0s"),
        ] {
            assert_eq!(format_go_duration(d), s);
            assert_eq!(parse_duration(s).unwrap(), d);
        }
    }

    #[test]
    fn lines_of_fields() {
        let t = "a: 1\nconntrack:\n  udpTimeout: 1s\n  maxEntries: 2\nworkers: {count: 3}\n";
        assert_eq!(line_of(t, "conntrack.maxEntries"), Some(4));
        assert_eq!(line_of(t, "workers.count"), Some(5));
        assert_eq!(line_of(t, "conntrack"), Some(2));
        assert_eq!(line_of(t, "sync"), None);
    }

    fn range_text(l: Limit) -> String {
        match l {
            Limit::Int { min, max } => format!("{min} to {max}"),
            Limit::Time { min, max } => {
                format!("{} to {}", format_go_duration(min), format_go_duration(max))
            }
        }
    }

    fn leaves(v: &yaml_serde::Value, prefix: &str, out: &mut Vec<(String, yaml_serde::Value)>) {
        match v {
            yaml_serde::Value::Mapping(m) if !m.is_empty() && prefix != "featureGates" => {
                for (k, v) in m {
                    let k = k.as_str().unwrap();
                    let p = if prefix.is_empty() {
                        k.to_string()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaves(v, &p, out);
                }
            }
            _ => out.push((prefix.to_string(), v.clone())),
        }
    }

    /// docs/config.md cannot drift from the struct: every field is a row, with its default as
    /// the configuration prints it and its range as `validate` checks it.
    #[test]
    fn docs_config_md_lists_every_field() {
        let doc = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md"),
        )
        .unwrap();
        let row = |field: &str| -> String {
            doc.lines()
                .find(|l| l.starts_with(&format!("| `{field}` |")))
                .unwrap_or_else(|| panic!("docs/config.md has no row for `{field}`"))
                .to_string()
        };
        let defaults: yaml_serde::Value = yaml_serde::to_value(load("").unwrap()).unwrap();
        let mut fields = Vec::new();
        leaves(&defaults, "", &mut fields);
        assert!(fields.len() > 20, "{fields:?}");
        for (field, value) in &fields {
            let r = row(field);
            if matches!(field.as_str(), "apiVersion" | "kind") {
                continue;
            }
            let shown = match value {
                yaml_serde::Value::String(s) if s.is_empty() => "\"\"".to_string(),
                yaml_serde::Value::String(s) => s.clone(),
                yaml_serde::Value::Sequence(items) => {
                    let items: Vec<String> = items
                        .iter()
                        .map(|v| match v {
                            yaml_serde::Value::String(s) => s.clone(),
                            v => yaml_serde::to_string(v).unwrap().trim().to_string(),
                        })
                        .collect();
                    format!("[{}]", items.join(", "))
                }
                yaml_serde::Value::Mapping(_) => "{}".into(),
                v => yaml_serde::to_string(v).unwrap().trim().to_string(),
            };
            let cells: Vec<&str> = r.split(" | ").collect();
            assert_eq!(cells[2], format!("`{shown}`"), "default of {field}: {r}");
        }
        for (field, limit, note) in RANGES {
            let r = row(field);
            let cells: Vec<&str> = r.split(" | ").collect();
            let want = if note.is_empty() {
                range_text(*limit)
            } else {
                format!("{} ({note})", range_text(*limit))
            };
            assert_eq!(cells[3], want, "range of {field}: {r}");
        }
        for extra in [
            "nodeOverrides",
            "nodeOverrides[].nodeSelector.matchLabels",
            "nodeOverrides[].interfaces",
            "nodeOverrides[].xdpMode",
            "nodeOverrides[].workers",
            "nodeOverrides[].afxdp",
        ] {
            row(extra);
        }
        // Unset by default (so that a default that cannot be used is not an error), and so
        // not among the serialized defaults.
        let r = row("conntrack.stateFile");
        assert!(
            r.split(" | ").nth(2).unwrap().contains(DEFAULT_STATE_FILE),
            "{r}"
        );
        // ...and no row for a field that does not exist.
        for l in doc.lines().filter(|l| l.starts_with("| `")) {
            let f = l[3..].split('`').next().unwrap();
            assert!(
                fields.iter().any(|(x, _)| x == f)
                    || f.starts_with("nodeOverrides")
                    || f == "conntrack.stateFile",
                "docs/config.md documents `{f}`, which the configuration does not have"
            );
        }
    }
}
