//! `kxdp config convert`: a kube-proxy `KubeProxyConfiguration` (kubeproxy.config.k8s.io/v1alpha1,
//! as kubeadm writes it into the `kube-proxy` ConfigMap) turned into the equivalent
//! `DataplaneConfiguration`, with every field that has no equivalent named and explained.
//!
//! Mapped fields (kube-proxy → kxdp): `hostnameOverride` → `nodeName`; `clusterCIDR` (comma
//! separated) → `clusterCIDRs`; `nodePortAddresses` → `nodePortAddresses`;
//! `iptables.masqueradeAll` / `masqueradeAll` → `masqueradeAll`; `iptables.localhostNodePorts:
//! false` → `localhostNodePorts: false`; the sync periods of the active mode's section
//! (`iptables`/`ipvs`/`nftables`), or the top-level ones → `sync`; `conntrack.*Timeout` →
//! `conntrack.*Timeout`; `conntrack.maxPerCore`/`min` → `conntrack.maxEntries` (on this machine's
//! CPU count, and named as unmapped: the value depends on each node); `healthzBindAddress`,
//! `metricsBindAddress` → the same; `featureGates` kxdp knows → `featureGates`. Fields kube-proxy
//! leaves empty, zero or at their defaults are not reported.
//!
//! Every field read is type-checked as kube-proxy's strict decoder does (a boolean is `true` or
//! `false`, not `"yes"`; a count is an integer; a duration a string such as `1h0m0s`): kube-proxy
//! refuses such a file, so converting it would hide the mistake. `null` is a field left alone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use yaml_serde::Value;

use crate::config::{
    parse_cidr, parse_duration, DataplaneConfiguration, GoDuration, NodePortAddress, API_VERSION,
    FEATURE_GATES, KIND, KUBE_PROXY_KIND, MAX_CONNTRACK_ENTRIES,
};

/// The KubeProxyConfiguration's API version.
const KUBE_PROXY_API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";

/// A kube-proxy field kxdp could not carry over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmapped {
    /// Dotted path in the KubeProxyConfiguration (`ipvs.scheduler`).
    pub field: String,
    /// Its value, as YAML.
    pub value: String,
    /// Why, and what to do instead.
    pub reason: String,
}

/// The result of a conversion.
#[derive(Clone, Debug)]
pub struct Conversion {
    pub config: DataplaneConfiguration,
    /// The DataplaneConfiguration as YAML, ready for `kxdp run --config`.
    pub yaml: String,
    pub unmapped: Vec<Unmapped>,
}

/// Why a file could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{file}: cannot read: {source}", file = .file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: not valid YAML: {message}", file = .file.display())]
    Yaml { file: PathBuf, message: String },
    #[error("{file}: kind is {kind:?}, not KubeProxyConfiguration: only kube-proxy's configuration can be converted", file = .file.display())]
    NotKubeProxy { file: PathBuf, kind: String },
    #[error("{file}: {field}: {message}", file = .file.display())]
    Field {
        file: PathBuf,
        field: String,
        message: String,
    },
}

/// Reads a KubeProxyConfiguration file and converts it.
pub fn convert_file(path: &Path, cpus: usize) -> Result<Conversion, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConvertError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    convert(&text, path, cpus)
}

/// Converts KubeProxyConfiguration text (`file` names it in errors); `cpus` sizes
/// `conntrack.maxPerCore` as kube-proxy would on this machine.
pub fn convert(text: &str, file: &Path, cpus: usize) -> Result<Conversion, ConvertError> {
    let doc: Value = yaml_serde::from_str(text).map_err(|e| ConvertError::Yaml {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind != KUBE_PROXY_KIND {
        return Err(ConvertError::NotKubeProxy {
            file: file.to_path_buf(),
            kind,
        });
    }
    let bad = |field: &str, message: String| ConvertError::Field {
        file: file.to_path_buf(),
        field: field.to_string(),
        message,
    };
    let mut f = Fields { doc, file };
    let mut cfg: DataplaneConfiguration =
        yaml_serde::from_str(&format!("apiVersion: {API_VERSION}\nkind: {KIND}\n"))
            .expect("the minimal configuration is valid");
    let mut unmapped = Vec::new();
    let mut note = |field: &str, value: &Value, reason: &str| {
        unmapped.push(Unmapped {
            field: field.to_string(),
            value: show(value),
            reason: reason.to_string(),
        });
    };
    // The one version kube-proxy has decoded since 1.10; another would be refused there.
    if let Some(v) = f.string("apiVersion")? {
        if v != KUBE_PROXY_API_VERSION {
            return Err(bad(
                "apiVersion",
                format!("`{v}`: expected {KUBE_PROXY_API_VERSION}"),
            ));
        }
    }
    f.take("kind")?;

    if let Some(v) = f.string("hostnameOverride")? {
        cfg.node_name = v.to_lowercase();
    }
    if let Some(v) = f.string("clusterCIDR")? {
        for (i, c) in v
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .enumerate()
        {
            let net = parse_cidr(c).map_err(|m| bad(&format!("clusterCIDR (entry {i})"), m))?;
            cfg.cluster_cidrs.push(net);
        }
    }
    if let Some(list) = f.take("nodePortAddresses")? {
        let Value::Sequence(list) = list else {
            return Err(f.expected("nodePortAddresses", "a list of CIDRs (or `primary`)", &list));
        };
        for (i, v) in list.iter().enumerate() {
            let field = format!("nodePortAddresses[{i}]");
            let Some(s) = v.as_str() else {
                return Err(f.expected(&field, "a string (a CIDR or `primary`)", v));
            };
            match s {
                "primary" => cfg.node_port_addresses.push(NodePortAddress::Primary),
                // kube-proxy's other keywords: `all` is kxdp's empty list; `localhost` has no
                // meaning for a dataplane that never sees loopback.
                "all" => {}
                "localhost" => note(
                    &field,
                    v,
                    "kxdp never sees loopback traffic (AF_XDP works on the wire), so NodePorts on localhost are not served",
                ),
                _ => cfg
                    .node_port_addresses
                    .push(NodePortAddress::Cidr(parse_cidr(s).map_err(|m| bad(&field, m))?)),
            }
        }
        if cfg.node_port_addresses.len() > 1
            && cfg.node_port_addresses.contains(&NodePortAddress::Primary)
        {
            return Err(bad(
                "nodePortAddresses",
                "`primary` mixed with CIDRs has no kxdp equivalent: keep either `primary` or the CIDRs".into(),
            ));
        }
    }

    let mode = f.string("mode")?.unwrap_or_default();
    let mode_section = match mode.as_str() {
        "" | "iptables" => "iptables",
        "ipvs" => "ipvs",
        "nftables" => "nftables",
        other => {
            note(
                "mode",
                &Value::String(other.into()),
                "kxdp replaces kube-proxy whatever its mode",
            );
            "iptables"
        }
    };
    // The active mode's sync periods; the top-level ones (newer kube-proxy) take precedence.
    // The other modes' are type-checked too: kube-proxy decodes them all.
    for section in ["iptables", "ipvs", "nftables", ""] {
        for key in ["syncPeriod", "minSyncPeriod"] {
            let path = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            let Some(d) = f.duration(&path)? else {
                continue;
            };
            if section != mode_section && !section.is_empty() {
                continue;
            }
            match key {
                // kube-proxy treats a zero syncPeriod as unset.
                "syncPeriod" if d.is_zero() => {}
                "syncPeriod" => cfg.sync.sync_period = GoDuration(d),
                _ => cfg.sync.min_sync_period = GoDuration(d),
            }
        }
    }
    for path in [
        "iptables.masqueradeAll",
        "nftables.masqueradeAll",
        "masqueradeAll",
    ] {
        if let Some(b) = f.boolean(path)? {
            cfg.masquerade_all |= b;
        }
    }
    if let Some(true) = f.boolean("iptables.localhostNodePorts")? {
        note(
            "iptables.localhostNodePorts",
            &Value::Bool(true),
            "kxdp never sees loopback traffic (AF_XDP works on the wire): NodePorts are not served on 127.0.0.1",
        );
    }
    for (key, field) in [
        ("iptables.masqueradeBit", "masqueradeBit"),
        ("nftables.masqueradeBit", "masqueradeBit"),
        ("masqueradeBit", "masqueradeBit"),
    ] {
        // kube-proxy's validation: a bit of the 32-bit mark.
        if let Some(n) = f.integer(key, 0, 31)? {
            if n != 0 && n != 14 {
                note(
                    key,
                    &Value::Number(n.into()),
                    &format!(
                        "kxdp marks nothing in the kernel ({field} is for iptables/nftables marks)"
                    ),
                );
            }
        }
    }

    // conntrack
    for (kp, set) in [
        ("conntrack.tcpEstablishedTimeout", 0),
        ("conntrack.tcpCloseWaitTimeout", 1),
        ("conntrack.udpTimeout", 2),
        ("conntrack.udpStreamTimeout", 3),
    ] {
        let Some(d) = f.duration(kp)? else {
            continue;
        };
        let d = GoDuration(d);
        let c = &mut cfg.conntrack;
        match set {
            0 => c.tcp_established_timeout = d,
            1 => c.tcp_close_wait_timeout = d,
            2 => c.udp_timeout = d,
            _ => c.udp_stream_timeout = d,
        }
    }
    // int32 in kube-proxy, validated at least 0.
    let per_core_n = f
        .integer("conntrack.maxPerCore", 0, i32::MAX.into())?
        .unwrap_or(0) as u64;
    let min_n = f.integer("conntrack.min", 0, i32::MAX.into())?.unwrap_or(0) as u64;
    if per_core_n > 0 {
        let want = (per_core_n * cpus as u64).max(min_n);
        cfg.conntrack.max_entries = want.min(u64::from(MAX_CONNTRACK_ENTRIES)) as u32;
        note(
            "conntrack.maxPerCore",
            &Value::Number(per_core_n.into()),
            &format!(
                "kxdp sizes its table with one absolute conntrack.maxEntries; set to {} ({} per core × {cpus} CPUs here, at least conntrack.min): check it for your nodes",
                cfg.conntrack.max_entries, per_core_n
            ),
        );
    } else if min_n > 0 {
        note(
            "conntrack.min",
            &Value::Number(min_n.into()),
            "without maxPerCore kube-proxy leaves the kernel's limit alone; kxdp keeps its default conntrack.maxEntries",
        );
    }
    if let Some(true) = f.boolean("conntrack.tcpBeLiberal")? {
        note(
            "conntrack.tcpBeLiberal",
            &Value::Bool(true),
            "kxdp's conntrack does not mark out-of-window TCP packets invalid, so there is nothing to relax",
        );
    }

    for (key, is_healthz) in [("healthzBindAddress", true), ("metricsBindAddress", false)] {
        let Some(s) = f.string(key)? else {
            continue;
        };
        let addr = bind_address(&s, if is_healthz { 10256 } else { 10249 });
        match addr {
            Some(a) if is_healthz => cfg.healthz_bind_address = Some(a),
            Some(a) => cfg.metrics_bind_address = Some(a),
            None => note(
                key,
                &Value::String(s),
                "not an IP:PORT or CIDR kxdp can bind; kxdp's default is kept",
            ),
        }
    }

    if let Some(gates) = f.take("featureGates")? {
        let Value::Mapping(gates) = gates else {
            return Err(f.expected(
                "featureGates",
                "a mapping of gate names to true or false",
                &gates,
            ));
        };
        for (k, v) in gates {
            let Some(name) = k.as_str() else {
                return Err(f.expected("featureGates", "gate names (strings)", &k));
            };
            let field = format!("featureGates.{name}");
            let Some(on) = v.as_bool() else {
                return Err(f.expected(&field, "a boolean (true or false)", &v));
            };
            if FEATURE_GATES.iter().any(|(g, _)| *g == name) {
                cfg.feature_gates.insert(name.to_string(), on);
            } else {
                note(
                    &field,
                    &v,
                    "a gate kxdp does not have (its behaviour is either always on in kxdp or not applicable)",
                );
            }
        }
    }
    let doc = f.doc;

    // Known fields without an equivalent, with the reason; anything else left is reported as
    // unknown to kxdp.
    let reasons: BTreeMap<&str, &str> = [
        ("clientConnection.kubeconfig", "pass the kubeconfig to `kxdp run --kubeconfig` (in a pod, the service account is used)"),
        ("clientConnection.qps", "kxdp watches (list+watch) and has no client-side rate limit setting"),
        ("clientConnection.burst", "kxdp watches (list+watch) and has no client-side rate limit setting"),
        ("clientConnection.contentType", "kxdp always talks JSON to the API server"),
        ("clientConnection.acceptContentTypes", "kxdp always talks JSON to the API server"),
        ("bindAddress", "kxdp takes this node's addresses from nodeIPs or the Node object"),
        ("bindAddressHardFail", "kxdp always fails when it cannot bind its servers"),
        ("enableProfiling", "kxdp has no pprof endpoint"),
        ("showHiddenMetricsForVersion", "kxdp has no hidden metrics"),
        ("oomScoreAdj", "set the pod's priority class (the DaemonSet uses system-node-critical)"),
        ("configSyncPeriod", "kxdp watches continuously and resyncs every sync.syncPeriod"),
        ("portRange", "the userspace proxy's setting; removed from kube-proxy"),
        ("udpIdleTimeout", "the userspace proxy's setting; removed from kube-proxy"),
        ("detectLocalMode", "kxdp tells pod traffic by clusterCIDRs"),
        ("detectLocal.bridgeInterface", "kxdp tells pod traffic by clusterCIDRs"),
        ("detectLocal.interfaceNamePrefix", "kxdp tells pod traffic by clusterCIDRs; put the pod interfaces in `interfaces`"),
        ("iptables.masqueradeBit", "kxdp marks nothing in the kernel"),
        ("ipvs.scheduler", "kxdp balances with Maglev-style consistent hashing (docs/services.md)"),
        ("ipvs.excludeCIDRs", "kxdp owns only Service addresses and never cleans up other rules"),
        ("ipvs.strictARP", "kxdp answers no ARP for Service addresses"),
        ("ipvs.tcpTimeout", "use conntrack.tcpEstablishedTimeout"),
        ("ipvs.tcpFinTimeout", "use conntrack.tcpCloseWaitTimeout"),
        ("ipvs.udpTimeout", "use conntrack.udpTimeout"),
        ("winkernel", "Windows only"),
        ("logging", "use `kxdp run -v`/`--log-level` and RUST_LOG"),
        ("conntrack.maxPerCore", "see conntrack.maxEntries"),
        ("linux.masqueradeAll", "see masqueradeAll"),
    ]
    .into_iter()
    .collect();
    let mut rest = Vec::new();
    leaves(&doc, String::new(), &mut rest);
    for (field, value) in rest {
        if is_default(&value) {
            continue;
        }
        let reason = reasons
            .iter()
            .find(|(k, _)| field == **k || field.starts_with(&format!("{k}.")))
            .map(|(_, r)| r.to_string())
            .unwrap_or_else(|| "kxdp has no equivalent of this field".to_string());
        note(&field, &value, &reason);
    }

    let yaml = cfg.to_yaml();
    // The result must load: a conversion never produces a configuration kxdp refuses.
    let cfg =
        DataplaneConfiguration::from_yaml_str(&yaml, file).map_err(|e| ConvertError::Field {
            file: file.to_path_buf(),
            field: e.field.clone(),
            message: e.message.clone(),
        })?;
    Ok(Conversion {
        config: cfg,
        yaml,
        unmapped,
    })
}

impl Conversion {
    /// The YAML with the unmapped fields as comments on top: what `kxdp config convert` prints.
    pub fn render(&self, source: &Path) -> String {
        let mut out = format!(
            "# Converted from {} (KubeProxyConfiguration) by `kxdp config convert`.\n",
            source.display()
        );
        if self.unmapped.is_empty() {
            out.push_str("# Every field set in it was carried over.\n");
        } else {
            out.push_str(&format!(
                "# {} field(s) could not be carried over:\n",
                self.unmapped.len()
            ));
            for u in &self.unmapped {
                out.push_str(&format!("#   {}: {} — {}\n", u.field, u.value, u.reason));
            }
        }
        out.push_str("# Add `interfaces` (and `workers`) for this node before `kxdp run`.\n");
        out.push_str(&self.yaml);
        out
    }
}

/// kube-proxy accepts `IP:PORT`, a bare IP, or a CIDR (`0.0.0.0/0`: any address) with the
/// port implied.
fn bind_address(s: &str, port: u16) -> Option<SocketAddr> {
    if s.is_empty() {
        return None;
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    if let Ok(net) = s.parse::<ipnet::IpNet>() {
        let ip = if net.prefix_len() == 0 {
            net.network()
        } else {
            net.addr()
        };
        return Some(SocketAddr::new(ip, port));
    }
    None
}

/// The KubeProxyConfiguration being converted: fields are taken out of it as they are read
/// (what is left is reported as unmapped), each checked for the type kube-proxy decodes it as.
struct Fields<'a> {
    doc: Value,
    file: &'a Path,
}

impl Fields<'_> {
    fn expected(&self, field: &str, what: &str, found: &Value) -> ConvertError {
        ConvertError::Field {
            file: self.file.to_path_buf(),
            field: field.to_string(),
            message: format!("expected {what}, found {}", describe(found)),
        }
    }

    /// Takes the field at a dotted `path`; `None` when it (or a section on the way) is missing
    /// or null. A section that is not a mapping is an error.
    fn take(&mut self, path: &str) -> Result<Option<Value>, ConvertError> {
        let mut at = &mut self.doc;
        let mut walked = String::new();
        let mut parts = path.split('.').peekable();
        while let Some(key) = parts.next() {
            if matches!(at, Value::Null) {
                return Ok(None);
            }
            if !at.is_mapping() {
                let found = at.clone();
                return Err(self.expected(&walked, "a mapping", &found));
            }
            let map = at.as_mapping_mut().expect("checked to be a mapping");
            if parts.peek().is_none() {
                return Ok(map.remove(key).filter(|v| !v.is_null()));
            }
            match map.get_mut(key) {
                Some(next) => at = next,
                None => return Ok(None),
            }
            if !walked.is_empty() {
                walked.push('.');
            }
            walked.push_str(key);
        }
        Ok(None)
    }

    /// A string field; empty is unset.
    fn string(&mut self, path: &str) -> Result<Option<String>, ConvertError> {
        match self.take(path)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s).filter(|s| !s.is_empty())),
            Some(v) => Err(self.expected(path, "a string", &v)),
        }
    }

    fn boolean(&mut self, path: &str) -> Result<Option<bool>, ConvertError> {
        match self.take(path)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(self.expected(path, "a boolean (true or false)", &v)),
        }
    }

    /// An integer in `min..=max`.
    fn integer(&mut self, path: &str, min: i64, max: i64) -> Result<Option<i64>, ConvertError> {
        let Some(v) = self.take(path)? else {
            return Ok(None);
        };
        let what = format!("an integer from {min} to {max}");
        match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(self.expected(path, &what, &v)),
        }
    }

    /// A Go duration string (`30s`, `1h0m0s`); empty is unset. A bare number is refused as
    /// kube-proxy refuses it (metav1.Duration decodes only strings).
    fn duration(&mut self, path: &str) -> Result<Option<Duration>, ConvertError> {
        let Some(s) = (match self.take(path)? {
            None => None,
            Some(Value::String(s)) => Some(s).filter(|s| !s.is_empty()),
            Some(v) => {
                return Err(self.expected(
                    path,
                    "a duration string such as \"30s\" or \"1h0m0s\"",
                    &v,
                ))
            }
        }) else {
            return Ok(None);
        };
        parse_duration(&s)
            .map(Some)
            .map_err(|message| ConvertError::Field {
                file: self.file.to_path_buf(),
                field: path.to_string(),
                message,
            })
    }
}

/// A value as an error message names it: `the string "yes"`, `the number 5`, `a list`.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

/// Empty, zero, false or null: what kubeadm writes for a field left alone.
fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty() || s == "0s" || s == "0",
        Value::Sequence(s) => s.is_empty(),
        Value::Mapping(m) => m.is_empty(),
        Value::Tagged(_) => false,
    }
}

fn leaves(v: &Value, prefix: String, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, v) in m {
                let k = k.as_str().map(str::to_owned).unwrap_or_else(|| show(k));
                let p = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, p, out);
            }
        }
        _ if !prefix.is_empty() => out.push((prefix, v.clone())),
        _ => {}
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        _ => yaml_serde::to_string(v)
            .unwrap_or_default()
            .trim()
            .replace('\n', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `kubeadm init` writes into the kube-proxy ConfigMap (v1.35), with a few changes.
    const KUBEADM: &str = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: "rr"
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 0.0.0.0:10249
mode: nftables
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 2s
  syncPeriod: 45s
nodePortAddresses: [primary]
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
featureGates:
  PreferSameTrafficDistribution: true
  SomethingElse: true
"#;

    #[test]
    fn kubeadm_configuration_converts() {
        let c = convert(KUBEADM, Path::new("kube-proxy.yaml"), 4).unwrap();
        let cfg = &c.config;
        assert_eq!(cfg.cluster_cidrs.len(), 2);
        assert_eq!(cfg.node_port_addresses, vec![NodePortAddress::Primary]);
        assert_eq!(cfg.sync.sync_period.0, Duration::from_secs(45));
        assert_eq!(cfg.sync.min_sync_period.0, Duration::from_secs(2));
        assert_eq!(cfg.conntrack.max_entries, 131072);
        assert_eq!(
            cfg.conntrack.tcp_close_wait_timeout.0,
            Duration::from_secs(3600)
        );
        assert_eq!(
            cfg.metrics_bind_address,
            Some("0.0.0.0:10249".parse().unwrap())
        );
        assert!(cfg.feature_enabled("PreferSameTrafficDistribution"));
        let names: Vec<&str> = c.unmapped.iter().map(|u| u.field.as_str()).collect();
        assert_eq!(
            names,
            [
                "conntrack.maxPerCore",
                "featureGates.SomethingElse",
                "bindAddress",
                "clientConnection.kubeconfig",
                "ipvs.scheduler",
            ],
            "{:#?}",
            c.unmapped
        );
        assert!(c.unmapped[3].reason.contains("--kubeconfig"));
        // The output loads as it is.
        let text = c.render(Path::new("kube-proxy.yaml"));
        let back =
            DataplaneConfiguration::from_yaml_str(&text, Path::new("converted.yaml")).unwrap();
        assert_eq!(&back, cfg);
        assert!(
            text.contains("#   ipvs.scheduler: rr — kxdp balances"),
            "{text}"
        );
    }

    #[test]
    fn iptables_mode_and_bad_values() {
        let c = convert(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nhostnameOverride: Node-A\niptables: {masqueradeAll: true, syncPeriod: 10s, localhostNodePorts: true}\nhealthzBindAddress: 0.0.0.0/0\n",
            Path::new("kp.yaml"),
            2,
        )
        .unwrap();
        assert_eq!(c.config.node_name, "node-a");
        assert!(c.config.masquerade_all);
        assert_eq!(c.config.sync.sync_period.0, Duration::from_secs(10));
        assert_eq!(
            c.config.healthz_bind_address,
            Some("0.0.0.0:10256".parse().unwrap())
        );
        assert_eq!(c.unmapped[0].field, "iptables.localhostNodePorts");
        let e = convert(
            "kind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/33\n",
            Path::new("kp.yaml"),
            2,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "kp.yaml: clusterCIDR (entry 0): `10.0.0.0/33`: the prefix length 33 is too long (an IPv4 prefix is at most /32)"
        );
        let e = convert(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\n",
            Path::new("c.yaml"),
            2,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not KubeProxyConfiguration"), "{e}");
    }

    /// Every field convert reads is type-checked as kube-proxy's strict decoding does: a wrong
    /// type names the field's full path and what was expected.
    #[test]
    fn wrong_types_are_refused() {
        let head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
        for (body, want) in [
            ("masqueradeAll: \"yes\"\n", "kp.yaml: masqueradeAll: expected a boolean (true or false), found the string \"yes\""),
            ("conntrack: {maxPerCore: lots}\n", "kp.yaml: conntrack.maxPerCore: expected an integer from 0 to 2147483647, found the string \"lots\""),
            ("conntrack: {maxPerCore: -1}\n", "kp.yaml: conntrack.maxPerCore: expected an integer from 0 to 2147483647, found the number -1"),
            ("conntrack: {min: 1.5}\n", "kp.yaml: conntrack.min: expected an integer"),
            ("conntrack: {tcpBeLiberal: 1}\n", "kp.yaml: conntrack.tcpBeLiberal: expected a boolean"),
            ("conntrack: {udpTimeout: 30}\n", "kp.yaml: conntrack.udpTimeout: expected a duration string such as \"30s\" or \"1h0m0s\", found the number 30"),
            ("conntrack: {udpTimeout: forever}\n", "kp.yaml: conntrack.udpTimeout: "),
            ("conntrack: 5\n", "kp.yaml: conntrack: expected a mapping, found the number 5"),
            ("iptables: {masqueradeAll: \"true\"}\n", "kp.yaml: iptables.masqueradeAll: expected a boolean"),
            ("nftables: {masqueradeAll: 1}\n", "kp.yaml: nftables.masqueradeAll: expected a boolean"),
            ("iptables: {localhostNodePorts: \"false\"}\n", "kp.yaml: iptables.localhostNodePorts: expected a boolean"),
            ("iptables: {masqueradeBit: \"14\"}\n", "kp.yaml: iptables.masqueradeBit: expected an integer from 0 to 31"),
            ("masqueradeBit: 40\n", "kp.yaml: masqueradeBit: expected an integer from 0 to 31, found the number 40"),
            ("ipvs: {syncPeriod: 30}\n", "kp.yaml: ipvs.syncPeriod: expected a duration string"),
            ("minSyncPeriod: true\n", "kp.yaml: minSyncPeriod: expected a duration string"),
            ("hostnameOverride: 42\n", "kp.yaml: hostnameOverride: expected a string, found the number 42"),
            ("clusterCIDR: [10.0.0.0/8]\n", "kp.yaml: clusterCIDR: expected a string, found a list"),
            ("mode: {iptables: true}\n", "kp.yaml: mode: expected a string, found a mapping"),
            ("nodePortAddresses: primary\n", "kp.yaml: nodePortAddresses: expected a list of CIDRs (or `primary`), found the string \"primary\""),
            ("nodePortAddresses: [10.0.0.0/8, 7]\n", "kp.yaml: nodePortAddresses[1]: expected a string (a CIDR or `primary`), found the number 7"),
            ("healthzBindAddress: 10256\n", "kp.yaml: healthzBindAddress: expected a string"),
            ("metricsBindAddress: false\n", "kp.yaml: metricsBindAddress: expected a string"),
            ("featureGates: {PreferSameTrafficDistribution: \"on\"}\n", "kp.yaml: featureGates.PreferSameTrafficDistribution: expected a boolean (true or false), found the string \"on\""),
            ("featureGates: [a]\n", "kp.yaml: featureGates: expected a mapping of gate names to true or false, found a list"),
        ] {
            let e = convert(&format!("{head}{body}"), Path::new("kp.yaml"), 2)
                .err()
                .unwrap_or_else(|| panic!("{body} converted"))
                .to_string();
            assert!(e.starts_with(want), "{body}: {e}");
        }
        let e = convert(
            "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
            Path::new("kp.yaml"),
            2,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "kp.yaml: apiVersion: `kubeproxy.config.k8s.io/v1beta1`: expected kubeproxy.config.k8s.io/v1alpha1"
        );
        // Null is a field left alone, as kubeadm writes it.
        let c = convert(
            &format!("{head}masqueradeAll: null\nconntrack: {{maxPerCore: null, udpTimeout: null}}\niptables: null\nfeatureGates: null\n"),
            Path::new("kp.yaml"),
            2,
        )
        .unwrap();
        assert!(!c.config.masquerade_all);
        assert!(c.unmapped.is_empty(), "{:?}", c.unmapped);
    }
}
