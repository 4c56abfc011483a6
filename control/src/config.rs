//! `DataplaneConfiguration`: kxdp's config file, modelled on kube-proxy's `KubeProxyConfiguration`
//! (same field names where the meaning is the same). See CONTRACT.md.
//!
//! Every struct denies unknown fields: a typo is an error (exit 2), never silently ignored.
//! Errors name the file and the field path (`config.yaml: conntrack.maxEntries: invalid type: ...`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use kxdp_dataplane::conntrack::CtConfig;
use serde::de::{self, Deserializer};
use serde::Deserialize;

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

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataplaneConfiguration {
    /// Must be `kxdp.dev/v1alpha1`.
    pub api_version: String,
    /// Must be `DataplaneConfiguration`.
    pub kind: String,
    /// Which Node object is "this node"; endpoints with this `nodeName` are local.
    #[serde(default)]
    pub node_name: String,
    /// This node's addresses; empty: the Node object's InternalIP/ExternalIP addresses.
    #[serde(default, rename = "nodeIPs")]
    pub node_ips: Vec<IpAddr>,
    /// Pod address ranges (kube-proxy's `clusterCIDR`, here a list for dual-stack).
    #[serde(default, rename = "clusterCIDRs")]
    pub cluster_cidrs: Vec<IpNet>,
    /// Service address ranges (merged with ServiceCIDR objects' `spec.cidrs`).
    #[serde(default, rename = "serviceCIDRs")]
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
    #[serde(default = "default_healthz", deserialize_with = "de_bind_address")]
    pub healthz_bind_address: Option<SocketAddr>,
    /// `/metrics`; an empty string disables the server.
    #[serde(default = "default_metrics", deserialize_with = "de_bind_address")]
    pub metrics_bind_address: Option<SocketAddr>,
    /// Run mode: the interfaces the workers own.
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// How the XDP program attaches: `auto` (native, generic when the driver has no native XDP),
    /// `native` or `generic`.
    #[serde(default)]
    pub xdp_mode: XdpMode,
    #[serde(default)]
    pub workers: WorkersConfig,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpMode {
    #[default]
    Auto,
    Native,
    Generic,
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
        IpNet::from_str(s.trim())
            .map(NodePortAddress::Cidr)
            .map_err(|_| {
                de::Error::custom(format!("invalid CIDR `{s}` (expected a CIDR or `primary`)"))
            })
    }
}

/// kube-proxy's `conntrack` section, with one absolute limit instead of maxPerCore/min. Omitted
/// fields keep their defaults.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConntrackConfig {
    /// 0 = the default (kube-proxy: 0 leaves the kernel's limit alone).
    pub max_entries: u32,
    pub tcp_established_timeout: GoDuration,
    pub tcp_close_wait_timeout: GoDuration,
    pub udp_timeout: GoDuration,
    pub udp_stream_timeout: GoDuration,
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
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
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

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
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

/// An idle worker polls its rings `spinPolls` times, then sleeps from 10 µs doubling up to
/// `maxSleep` between polls: more spinning and shorter sleeps cost CPU and save latency.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
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
            "invalid address `{s}` (expected IP:PORT, e.g. 0.0.0.0:10256)"
        ))
    })
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

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// Parses Go's duration syntax (`[0-9.]+(ns|us|µs|ms|s|m|h)` repeated, or a bare `0`), then
/// falls back to humantime. Negative durations are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Some(d) = parse_go_duration(t) {
        return Ok(d);
    }
    humantime::parse_duration(t)
        .map_err(|_| format!("invalid duration `{s}` (expected e.g. `30s`, `1h0m0s`, `24h`)"))
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
    if !total.is_finite() || total > u64::MAX as f64 {
        return None;
    }
    Some(Duration::from_nanos(total.round() as u64))
}

/// yaml_serde prefixes messages with its own (coarser) idea of the path; the path from
/// serde_path_to_error is the one shown, so drop yaml_serde's when it is a prefix of it.
fn strip_yaml_path(msg: &str, path: &str) -> String {
    if let Some((head, rest)) = msg.split_once(": ") {
        if !head.contains(' ') && (path.starts_with(head) || head == ".") {
            return rest.to_string();
        }
    }
    msg.to_string()
}

/// A config that could not be loaded: the file, the field path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Dotted field path (`conntrack.maxEntries`); empty for file-level errors.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() || self.field == "." {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}: {}: {}",
                self.file.display(),
                self.field,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

impl DataplaneConfiguration {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            field: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::from_yaml_str(&text, path)
    }

    /// Parses and validates config text; `file` only names the source in errors.
    pub fn from_yaml_str(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let err = |field: String, message: String| ConfigError {
            file: file.to_path_buf(),
            field,
            message,
        };
        crate::yaml::check(text).map_err(|e| err(String::new(), e.to_string()))?;
        let de = yaml_serde::Deserializer::from_str(text);
        let cfg: DataplaneConfiguration = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = strip_yaml_path(&e.into_inner().to_string(), &field);
            err(field, inner)
        })?;
        cfg.validate().map_err(|(f, m)| err(f, m))?;
        Ok(cfg)
    }

    /// Checks what serde cannot: the header, refused options, feature gate names.
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
        if self.workers.count == 0 {
            return Err(("workers.count".into(), "must be at least 1".into()));
        }
        if self.nodeport_has_primary_mixed() {
            return Err((
                "nodePortAddresses".into(),
                "`primary` must be the only entry".into(),
            ));
        }
        Ok(())
    }

    fn nodeport_has_primary_mixed(&self) -> bool {
        self.node_port_addresses.len() > 1
            && self.node_port_addresses.contains(&NodePortAddress::Primary)
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
            e.starts_with("config.yaml: conntrack.udpTimeout: invalid duration `forever`"),
            "{e}"
        );
        let e = load_err("sync: {syncPeriod: 10}");
        assert!(e.contains("sync.syncPeriod"), "{e}");
    }

    #[test]
    fn wrong_type_names_field() {
        let e = load_err("conntrack: {maxEntries: lots}");
        assert!(
            e.starts_with("config.yaml: conntrack.maxEntries: invalid type"),
            "{e}"
        );
        let e = load_err("nodeIPs: [192.168.0.300]");
        assert!(e.starts_with("config.yaml: nodeIPs[0]:"), "{e}");
        let e = load_err("clusterCIDRs: [10.0.0.0/40]");
        assert!(e.starts_with("config.yaml: clusterCIDRs[0]:"), "{e}");
        let e = load_err("workers: {count: -1}");
        assert!(e.starts_with("config.yaml: workers.count:"), "{e}");
        let e = load_err("healthzBindAddress: localhost");
        assert!(
            e.starts_with("config.yaml: healthzBindAddress: invalid address"),
            "{e}"
        );
        let e = load_err("nodePortAddresses: [nope]");
        assert!(
            e.starts_with("config.yaml: nodePortAddresses[0]: invalid CIDR"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_rejected_with_path() {
        let e = load_err("nodename: x");
        assert!(
            e.starts_with("config.yaml: ") && e.contains("unknown field `nodename`"),
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
            e.starts_with("config.yaml: localhostNodePorts: true is not supported"),
            "{e}"
        );
        assert!(load("localhostNodePorts: false").is_ok());
    }

    #[test]
    fn feature_gates() {
        let e = load_err("featureGates: {NoSuchGate: true}");
        assert!(
            e.starts_with("config.yaml: featureGates.NoSuchGate: unknown feature gate"),
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
}
