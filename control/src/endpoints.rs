//! Endpoints of a Service as kube-proxy sees them: EndpointSlices merged per Service port
//! (`pkg/proxy/endpointslicecache.go`) and the choice of usable endpoints per traffic policy and
//! topology (`pkg/proxy/topology.go`, `CategorizeEndpoints`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The zone label of the Node (`topology.kubernetes.io/zone`).
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";

/// One endpoint of one Service port, after merging slices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    pub ip: IpAddr,
    pub port: u16,
    /// `nodeName` equals this node.
    pub local: bool,
    /// `conditions.ready`; nil = true.
    pub ready: bool,
    /// `conditions.serving`; nil = true (the API's rule and kube-proxy's).
    pub serving: bool,
    /// `conditions.terminating`; nil = false.
    pub terminating: bool,
    /// `hints.forZones[].name`.
    pub zone_hints: BTreeSet<String>,
    /// `hints.forNodes[].name` (kept only with the PreferSameTrafficDistribution gate, as in
    /// kube-proxy).
    pub node_hints: BTreeSet<String>,
}

impl EndpointInfo {
    /// kube-proxy's `Endpoint.String()`: `ip:port`, `[ip]:port` for IPv6. Dedup and sort key.
    pub fn key(&self) -> EndpointKey {
        EndpointKey::new(self.ip, self.port)
    }
}

/// The text `ip:port` (`[ip]:port` for IPv6) kept inline, ordered as the text is: kube-proxy
/// sorts and dedups endpoints by this string. Inline because a 30k-Service state has 300k of
/// them, each a heap string before (with musl's allocator that was a tenth of startup).
#[derive(Clone, Copy)]
pub struct EndpointKey {
    text: [u8; EndpointKey::CAPACITY],
    len: u8,
}

impl EndpointKey {
    /// `[` + the longest IPv6 text (45, `ffff:…:255.255.255.255`) + `]:65535`.
    const CAPACITY: usize = 1 + 45 + 7;

    pub fn new(ip: IpAddr, port: u16) -> EndpointKey {
        let mut key = EndpointKey {
            text: [0; EndpointKey::CAPACITY],
            len: 0,
        };
        match ip {
            // By hand: `Display` for addresses goes through the formatter (its buffer copies
            // showed in the startup profile).
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        key.push(b'.');
                    }
                    key.push_decimal(u32::from(octet));
                }
            }
            IpAddr::V6(v6) => {
                use std::fmt::Write;
                key.push(b'[');
                // Fits: CAPACITY holds the longest IPv6 text.
                let _ = write!(key, "{v6}");
                key.push(b']');
            }
        }
        key.push(b':');
        key.push_decimal(u32::from(port));
        key
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever pushed (digits, `.:[]` and an address's own text).
        std::str::from_utf8(self.bytes()).unwrap_or_default()
    }

    /// The text's bytes: they order as the text does.
    fn bytes(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }

    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.text.get_mut(usize::from(self.len)) {
            *slot = byte;
            self.len += 1;
        }
    }

    fn push_decimal(&mut self, mut n: u32) {
        let mut digits = [0u8; 10];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for &d in &digits[i..] {
            self.push(d);
        }
    }
}

impl std::fmt::Write for EndpointKey {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        s.bytes().for_each(|b| self.push(b));
        Ok(())
    }
}

impl PartialEq for EndpointKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for EndpointKey {}

impl PartialOrd for EndpointKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EndpointKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes().cmp(other.bytes())
    }
}

impl std::fmt::Debug for EndpointKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Service port's endpoints are found by (address family, port name, protocol): the name of
/// the EndpointSlice port must equal the Service port's name (both "" when unnamed).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    pub v6: bool,
    pub name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
}

/// Merges the EndpointSlices of one Service, as kube-proxy's EndpointSliceCache does:
///
/// - slices are read in name order (kube-proxy: map order; the result differs only for duplicates
///   with conflicting conditions, which kube-proxy also resolves arbitrarily);
/// - `addressType` IPv4/IPv6 only (FQDN and others are ignored); the first address of each
///   endpoint is used and must be of that family;
/// - slice ports are matched by name and protocol; an omitted name is `""` and an omitted protocol
///   `TCP` (the API server's defaults); a port without number (or 0) is ignored;
/// - the same `ip:port` seen twice is kept once: a later copy replaces an earlier one unless the
///   later one is terminating (kube-proxy prefers the running pod when an IP is reused);
/// - each list is sorted by `ip:port` string, as kube-proxy sorts it.
///
/// Problems (malformed endpoints) are appended to `problems` as messages.
///
/// This is `read_slice` on each slice, then `merge_read` (what an incremental build does with
/// the slices it kept read).
pub fn merge_slices<'a>(
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    node_name: &str,
    prefer_same_node_gate: bool,
    problems: &mut Vec<String>,
) -> BTreeMap<PortKey, Vec<EndpointInfo>> {
    let read: Vec<SliceEndpoints> = slices
        .into_iter()
        .map(|s| read_slice(s, node_name, prefer_same_node_gate))
        .collect();
    merge_read(read.iter(), problems)
}

/// One EndpointSlice read on its own: per port, its endpoints with their `ip:port` keys, sorted
/// by key, each key once (as `merge_slices` would keep it from this slice alone), and its
/// problems. A Service's merged endpoints are a function of its slices' `SliceEndpoints` in name
/// order (`merge_read`), so an incremental build keeps them per slice and reads again only the
/// slices that changed (a 5,000-endpoint Service in 50 slices: one slice, not 5,000 endpoints).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceEndpoints {
    ports: Vec<(PortKey, Vec<(EndpointKey, EndpointInfo)>)>,
    problems: Vec<String>,
}

impl SliceEndpoints {
    /// The slice's malformed endpoints and ports, as messages.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

/// Reads one EndpointSlice (see `merge_slices` for the rules).
pub fn read_slice(
    slice: &EndpointSlice,
    node_name: &str,
    prefer_same_node_gate: bool,
) -> SliceEndpoints {
    let mut out = SliceEndpoints::default();
    let problems = &mut out.problems;
    let slice_name = slice.metadata.name.as_deref().unwrap_or("");
    let v6 = match slice.address_type.as_str() {
        "IPv4" => false,
        "IPv6" => true,
        other => {
            tracing::debug!(
                slice = slice_name,
                address_type = other,
                "ignoring EndpointSlice of an address type kxdp does not proxy"
            );
            return out;
        }
    };
    // Parse endpoints once per slice.
    let mut eps: Vec<(IpAddr, &k8s_openapi::api::discovery::v1::Endpoint)> = Vec::new();
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let Some(first) = ep.addresses.first() else {
            problems.push(format!(
                "EndpointSlice {slice_name}: endpoints[{i}]: no address"
            ));
            continue;
        };
        match crate::validate::ip(first) {
            Ok(ip) if ip.is_ipv6() == v6 => eps.push((ip, ep)),
            Ok(_) => problems.push(format!(
                "EndpointSlice {slice_name}: endpoints[{i}].addresses[0]: {first} is not of addressType {}",
                slice.address_type
            )),
            Err(m) => problems.push(format!(
                "EndpointSlice {slice_name}: endpoints[{i}].addresses[0]: {m}"
            )),
        }
    }
    let mut sets: BTreeMap<PortKey, BTreeMap<EndpointKey, EndpointInfo>> = BTreeMap::new();
    for (pi, port) in slice.ports.iter().flatten().enumerate() {
        let number = match port.port.map(crate::validate::port) {
            Some(Ok(p)) => p,
            _ => {
                problems.push(format!("EndpointSlice {slice_name}: ports[{pi}].port: missing or invalid, port ignored"));
                continue;
            }
        };
        let key = PortKey {
            v6,
            name: port.name.clone().unwrap_or_default(),
            protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
        };
        let set = sets.entry(key).or_default();
        for &(ip, ep) in &eps {
            let info = endpoint_info(ip, number, ep, node_name, prefer_same_node_gate);
            let k = info.key();
            if !set.contains_key(&k) || !info.terminating {
                set.insert(k, info);
            }
        }
    }
    out.ports = sets
        .into_iter()
        .map(|(k, set)| (k, set.into_iter().collect()))
        .collect();
    out
}

/// The endpoints of one Service from its slices read by `read_slice`, in slice name order:
/// exactly what reading them all at once gives. Per port, the slices' sorted lists are merged
/// (a stable sort of their concatenation: sorted runs, so a k-way merge); of one key seen in
/// several slices the last that is not terminating is kept, else the first (the rule of
/// `merge_slices` applied slice after slice).
pub fn merge_read<'a>(
    slices: impl IntoIterator<Item = &'a SliceEndpoints>,
    problems: &mut Vec<String>,
) -> BTreeMap<PortKey, Vec<EndpointInfo>> {
    let mut out = BTreeMap::new();
    for (key, lists) in by_port(slices, problems) {
        let mut merged = Vec::new();
        merge_port(&lists, |(_, e), _| merged.push(e.clone()));
        if !merged.is_empty() {
            out.insert(key.clone(), merged);
        }
    }
    out
}

/// The slices' per-port lists, by port (and their problems into `problems`).
fn by_port<'a>(
    slices: impl IntoIterator<Item = &'a SliceEndpoints>,
    problems: &mut Vec<String>,
) -> BTreeMap<&'a PortKey, Vec<&'a [(EndpointKey, EndpointInfo)]>> {
    let mut by_port: BTreeMap<&PortKey, Vec<&[(EndpointKey, EndpointInfo)]>> = BTreeMap::new();
    for s in slices {
        problems.extend(s.problems.iter().cloned());
        for (k, list) in &s.ports {
            by_port.entry(k).or_default().push(list);
        }
    }
    by_port
}

/// One port's lists (in slice order) merged: `keep` is given each endpoint kept, in key
/// order, with the number of slices its key was in.
fn merge_port<'a>(
    lists: &[&'a [(EndpointKey, EndpointInfo)]],
    mut keep: impl FnMut(&'a (EndpointKey, EndpointInfo), usize),
) {
    if let [one] = lists {
        for e in one.iter() {
            keep(e, 1);
        }
        return;
    }
    let mut all: Vec<&(EndpointKey, EndpointInfo)> = lists.iter().flat_map(|l| l.iter()).collect();
    // Stable: equal keys stay in slice order.
    all.sort_by_key(|e| e.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let group = &all[i..j];
        let kept = group
            .iter()
            .rev()
            .find(|(_, e)| !e.terminating)
            .unwrap_or(&group[0]);
        keep(kept, group.len());
        i = j;
    }
}

/// A Service's endpoints merged from its slices' reads (`merge_read`), kept with their keys so
/// that a change to one slice is patched in (`replace`: that slice's endpoints taken out, its
/// new ones put in, a linear pass) instead of merging every slice again. What it holds is
/// always what `merge_read` of the slices gives (tests compare them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergedEndpoints {
    /// As `merge_read` returns them.
    pub lists: BTreeMap<PortKey, Vec<EndpointInfo>>,
    /// The `ip:port` key of each entry of `lists`.
    keys: BTreeMap<PortKey, Vec<EndpointKey>>,
    /// No key is in two slices (of one port): each entry is one slice's, so taking a slice's
    /// endpoints out leaves what the other slices give. Otherwise `replace` declines.
    disjoint: bool,
}

impl MergedEndpoints {
    /// `merge_read` of `slices`, keyed (their problems are not kept: see `merge_read`).
    pub fn new<'a>(slices: impl IntoIterator<Item = &'a SliceEndpoints>) -> MergedEndpoints {
        let mut out = MergedEndpoints {
            disjoint: true,
            ..Default::default()
        };
        for (port, lists) in by_port(slices, &mut Vec::new()) {
            let (mut keys, mut infos) = (Vec::new(), Vec::new());
            merge_port(&lists, |(k, e), seen_in| {
                out.disjoint &= seen_in == 1;
                keys.push(*k);
                infos.push(e.clone());
            });
            if !infos.is_empty() {
                out.keys.insert(port.clone(), keys);
                out.lists.insert(port.clone(), infos);
            }
        }
        out
    }

    /// The endpoints after one slice read as `old` now reads as `new`: false (and `self` left
    /// unusable: make it `new` again) when that cannot be patched in, because some key is in two
    /// slices (the merge rule then picks between their copies) or `old` is not as merged.
    pub fn replace(&mut self, old: &SliceEndpoints, new: &SliceEndpoints) -> bool {
        if !self.disjoint {
            return false;
        }
        let empty: &[(EndpointKey, EndpointInfo)] = &[];
        let list_of = |s: &'_ SliceEndpoints, port: &PortKey| -> usize {
            s.ports
                .iter()
                .position(|(k, _)| k == port)
                .unwrap_or(usize::MAX)
        };
        let ports: BTreeSet<&PortKey> = old
            .ports
            .iter()
            .chain(new.ports.iter())
            .map(|(k, _)| k)
            .collect();
        for port in ports {
            let gone = old.ports.get(list_of(old, port)).map_or(empty, |(_, l)| l);
            let come = new.ports.get(list_of(new, port)).map_or(empty, |(_, l)| l);
            if gone == come {
                continue;
            }
            let keys = self.keys.remove(port).unwrap_or_default();
            let infos = self.lists.remove(port).unwrap_or_default();
            let cap = (keys.len() + come.len()).saturating_sub(gone.len());
            let (mut out_keys, mut out_infos) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
            let (mut g, mut c) = (0, 0);
            for (k, e) in keys.into_iter().zip(infos) {
                while c < come.len() && come[c].0 < k {
                    out_keys.push(come[c].0);
                    out_infos.push(come[c].1.clone());
                    c += 1;
                }
                let is_gone = g < gone.len() && gone[g].0 == k;
                if is_gone {
                    g += 1;
                }
                if c < come.len() && come[c].0 == k {
                    if !is_gone {
                        // Another slice has this key too.
                        return false;
                    }
                    out_keys.push(come[c].0);
                    out_infos.push(come[c].1.clone());
                    c += 1;
                    continue;
                }
                if !is_gone {
                    out_keys.push(k);
                    out_infos.push(e);
                }
            }
            for (k, e) in &come[c..] {
                out_keys.push(*k);
                out_infos.push(e.clone());
            }
            if g != gone.len() {
                return false;
            }
            if !out_infos.is_empty() {
                self.keys.insert(port.clone(), out_keys);
                self.lists.insert(port.clone(), out_infos);
            }
        }
        true
    }
}

fn endpoint_info(
    ip: IpAddr,
    port: u16,
    ep: &k8s_openapi::api::discovery::v1::Endpoint,
    node_name: &str,
    prefer_same_node_gate: bool,
) -> EndpointInfo {
    let cond = ep.conditions.clone().unwrap_or_default();
    let hints = ep.hints.as_ref();
    EndpointInfo {
        ip,
        port,
        local: !node_name.is_empty() && ep.node_name.as_deref() == Some(node_name),
        ready: cond.ready.unwrap_or(true),
        serving: cond.serving.unwrap_or(true),
        terminating: cond.terminating.unwrap_or(false),
        zone_hints: hints
            .and_then(|h| h.for_zones.as_ref())
            .map(|z| z.iter().map(|z| z.name.clone()).collect())
            .unwrap_or_default(),
        node_hints: if prefer_same_node_gate {
            hints
                .and_then(|h| h.for_nodes.as_ref())
                .map(|n| n.iter().map(|n| n.name.clone()).collect())
                .unwrap_or_default()
        } else {
            BTreeSet::new()
        },
    }
}

/// The traffic-policy facts of a Service port that decide which endpoint lists it needs
/// (kube-proxy's `ServicePort` methods).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyInfo {
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` on a NodePort or LoadBalancer Service (the field means
    /// nothing on other types).
    pub external_local: bool,
    /// Reachable other than by ClusterIP: a NodePort, an externalIP or a LoadBalancer VIP.
    pub externally_accessible: bool,
}

impl PolicyInfo {
    /// Cluster endpoints are needed for internalTrafficPolicy Cluster and for any externally
    /// reachable port (even with eTP Local: pod and node traffic short-circuit to them).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_local || self.externally_accessible
    }

    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_local || (self.external_local && self.externally_accessible)
    }
}

/// This node, as topology sees it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Topology<'a> {
    pub node_name: &'a str,
    /// The Node's `topology.kubernetes.io/zone` label ("" when absent).
    pub zone: &'a str,
    /// The PreferSameTrafficDistribution gate: node hints count.
    pub prefer_same_node: bool,
}

/// Which hints decide the cluster endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TopologyMode {
    /// No topology: every ready endpoint.
    #[default]
    None,
    PreferSameZone,
    PreferSameNode,
}

/// The result of `categorize`: indexes into the endpoint list given to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Endpoints for Cluster traffic policy (empty when the port never uses them).
    pub cluster: Vec<usize>,
    /// Endpoints for Local traffic policy (empty when the port never uses them).
    pub local: Vec<usize>,
    /// The Service has a usable endpoint somewhere in the cluster.
    pub has_any: bool,
    pub topology: TopologyMode,
}

/// kube-proxy's `CategorizeEndpoints`, line for line:
///
/// - cluster endpoints (when the port uses them): ready endpoints allowed by topology; if none,
///   the endpoints that are serving and terminating. Topology applies only when every ready
///   endpoint carries hints (see `topology_mode`).
/// - local endpoints (when the port uses them): local ready endpoints; if there are none, local
///   serving-and-terminating endpoints.
/// - `has_any`: a ready or serving-and-terminating endpoint exists anywhere.
///
/// Hints are trusted as the EndpointSlice controller wrote them: kube-proxy no longer checks the
/// Service's `trafficDistribution` or `service.kubernetes.io/topology-mode` itself — the
/// controller only writes zone hints for PreferClose/PreferSameZone/`topology-mode: Auto` and
/// node hints for PreferSameNode.
pub fn categorize(
    endpoints: &[EndpointInfo],
    policy: PolicyInfo,
    topo: &Topology<'_>,
) -> Categorized {
    let mut out = Categorized::default();
    if endpoints.is_empty() {
        return out;
    }
    let filter = |pred: &dyn Fn(&EndpointInfo) -> bool| -> Vec<usize> {
        endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| pred(e))
            .map(|(i, _)| i)
            .collect()
    };

    if policy.uses_cluster_endpoints() {
        out.topology = topology_mode(endpoints, topo);
        let mode = out.topology;
        out.cluster = filter(&|e| e.ready && available_for_topology(e, mode, topo));
        if out.cluster.is_empty() {
            out.cluster = filter(&|e| e.serving && e.terminating);
        }
        if !out.cluster.is_empty() {
            out.has_any = true;
        }
    }

    if !policy.uses_local_endpoints() {
        return out;
    }

    let (mut local_ready, mut local_st) = (false, false);
    for e in endpoints {
        if e.ready {
            out.has_any = true;
            local_ready |= e.local;
        } else if e.serving && e.terminating {
            out.has_any = true;
            local_st |= e.local;
        }
    }
    if local_ready {
        out.local = filter(&|e| e.local && e.ready);
    } else if local_st {
        out.local = filter(&|e| e.local && e.serving && e.terminating);
    }
    out
}

/// kube-proxy's `topologyModeFromHints`: PreferSameNode when the gate is on, every ready endpoint
/// has node hints and one is hinted for this node; else PreferSameZone when every ready endpoint
/// has zone hints and one is hinted for this node's zone; else none (all ready endpoints).
pub fn topology_mode(endpoints: &[EndpointInfo], topo: &Topology<'_>) -> TopologyMode {
    let mut has_ready = false;
    let (mut all_node_hints, mut for_node) = (true, false);
    let (mut all_zone_hints, mut for_zone) = (true, false);
    for e in endpoints.iter().filter(|e| e.ready) {
        has_ready = true;
        if e.node_hints.is_empty() {
            all_node_hints = false;
        } else if e.node_hints.contains(topo.node_name) {
            for_node = true;
        }
        if e.zone_hints.is_empty() {
            all_zone_hints = false;
        } else if e.zone_hints.contains(topo.zone) {
            for_zone = true;
        }
    }
    if !has_ready {
        return TopologyMode::None;
    }
    if topo.prefer_same_node && all_node_hints && for_node {
        return TopologyMode::PreferSameNode;
    }
    if all_zone_hints && for_zone {
        return TopologyMode::PreferSameZone;
    }
    TopologyMode::None
}

fn available_for_topology(e: &EndpointInfo, mode: TopologyMode, topo: &Topology<'_>) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => e.node_hints.contains(topo.node_name),
        TopologyMode::PreferSameZone => e.zone_hints.contains(topo.zone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compact endpoint spec for tables: flags string of
    /// `R` ready, `S` serving, `T` terminating, `L` local; `z:` zone hints, `n:` node hints.
    fn ep(i: u8, flags: &str, zones: &[&str], nodes: &[&str]) -> EndpointInfo {
        EndpointInfo {
            ip: IpAddr::from([10, 0, 0, i]),
            port: 80,
            local: flags.contains('L'),
            ready: flags.contains('R'),
            serving: flags.contains('S'),
            terminating: flags.contains('T'),
            zone_hints: zones.iter().map(|s| s.to_string()).collect(),
            node_hints: nodes.iter().map(|s| s.to_string()).collect(),
        }
    }

    const CLUSTER: PolicyInfo = PolicyInfo {
        internal_local: false,
        external_local: false,
        externally_accessible: false,
    };
    const ITP_LOCAL: PolicyInfo = PolicyInfo {
        internal_local: true,
        external_local: false,
        externally_accessible: false,
    };
    const ETP_LOCAL: PolicyInfo = PolicyInfo {
        internal_local: false,
        external_local: true,
        externally_accessible: true,
    };
    const BOTH_LOCAL: PolicyInfo = PolicyInfo {
        internal_local: true,
        external_local: true,
        externally_accessible: true,
    };
    const ETP_LOCAL_NOT_EXTERNAL: PolicyInfo = PolicyInfo {
        internal_local: false,
        external_local: true,
        externally_accessible: false,
    };

    struct Case {
        name: &'static str,
        eps: Vec<EndpointInfo>,
        policy: PolicyInfo,
        zone: &'static str,
        gate: bool,
        cluster: &'static [usize],
        local: &'static [usize],
        has_any: bool,
        mode: TopologyMode,
    }

    /// The inline key is `SocketAddr`'s text, and orders as that text does.
    #[test]
    fn endpoint_key_is_the_socket_address_text() {
        let ips: Vec<IpAddr> = [
            "0.0.0.0",
            "1.2.3.4",
            "10.0.0.10",
            "10.0.0.2",
            "100.64.255.9",
            "255.255.255.255",
            "::",
            "fd00::1",
            "2001:db8::ff00:42:8329",
            "::ffff:255.255.255.255",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "1111:2222:3333:4444:5555:6666:255.255.255.255",
        ]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
        let mut keys = Vec::new();
        for &ip in &ips {
            for port in [0, 1, 9, 80, 443, 8080, 65535] {
                let text = std::net::SocketAddr::new(ip, port).to_string();
                let key = EndpointKey::new(ip, port);
                assert_eq!(key.as_str(), text);
                keys.push((key, text));
            }
        }
        for (a, a_text) in &keys {
            for (b, b_text) in &keys {
                assert_eq!(a.cmp(b), a_text.cmp(b_text), "{a_text} against {b_text}");
                assert_eq!(a == b, a_text == b_text);
            }
        }
    }

    #[test]
    fn categorize_table() {
        use TopologyMode::*;
        let cases = vec![
            Case {
                name: "empty",
                eps: vec![],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[],
                has_any: false,
                mode: None,
            },
            Case {
                name: "all ready, cluster policy",
                eps: vec![ep(1, "RS", &[], &[]), ep(2, "RSL", &[], &[])],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "not ready not serving excluded",
                eps: vec![ep(1, "", &[], &[]), ep(2, "RS", &[], &[])],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "no ready: fall back to serving+terminating",
                eps: vec![
                    ep(1, "ST", &[], &[]),
                    ep(2, "S", &[], &[]),
                    ep(3, "T", &[], &[]),
                ],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[0],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "ready wins over serving+terminating",
                eps: vec![ep(1, "ST", &[], &[]), ep(2, "RS", &[], &[])],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "only unusable endpoints",
                eps: vec![ep(1, "S", &[], &[]), ep(2, "T", &[], &[])],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[],
                has_any: false,
                mode: None,
            },
            Case {
                name: "zone hints for my zone",
                eps: vec![
                    ep(1, "RS", &["a"], &[]),
                    ep(2, "RS", &["b"], &[]),
                    ep(3, "RS", &["a"], &[]),
                ],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0, 2],
                local: &[],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "zone hints, none for my zone: all",
                eps: vec![ep(1, "RS", &["b"], &[]), ep(2, "RS", &["c"], &[])],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "one ready endpoint without hints: hints ignored",
                eps: vec![ep(1, "RS", &["a"], &[]), ep(2, "RS", &[], &[])],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "unready endpoint without hints does not matter",
                eps: vec![
                    ep(1, "RS", &["a"], &[]),
                    ep(2, "ST", &[], &[]),
                    ep(3, "RS", &["b"], &[]),
                ],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0],
                local: &[],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "node without zone label ignores zone hints",
                eps: vec![ep(1, "RS", &["a"], &[]), ep(2, "RS", &["b"], &[])],
                policy: CLUSTER,
                zone: "",
                gate: true,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "node hints for this node",
                eps: vec![
                    ep(1, "RS", &["a"], &["node-a"]),
                    ep(2, "RS", &["a"], &["node-b"]),
                ],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0],
                local: &[],
                has_any: true,
                mode: PreferSameNode,
            },
            Case {
                name: "node hints with the gate off: zone hints",
                eps: vec![
                    ep(1, "RS", &["a"], &["node-a"]),
                    ep(2, "RS", &["a"], &["node-b"]),
                ],
                policy: CLUSTER,
                zone: "a",
                gate: false,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "node hints, none for this node: fall back to zone",
                eps: vec![
                    ep(1, "RS", &["a"], &["node-c"]),
                    ep(2, "RS", &["b"], &["node-b"]),
                ],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0],
                local: &[],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "node hints incomplete: zone",
                eps: vec![ep(1, "RS", &["a"], &["node-a"]), ep(2, "RS", &["b"], &[])],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0],
                local: &[],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "node hints, no zone hints, none for this node: all",
                eps: vec![ep(1, "RS", &[], &["node-b"]), ep(2, "RS", &[], &["node-c"])],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "topology filters, terminating not used while a ready hinted one exists",
                eps: vec![
                    ep(1, "RS", &["b"], &[]),
                    ep(2, "STL", &["a"], &[]),
                    ep(3, "RS", &["a"], &[]),
                ],
                policy: CLUSTER,
                zone: "a",
                gate: true,
                cluster: &[2],
                local: &[],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "iTP Local: local ready only, no cluster list",
                eps: vec![
                    ep(1, "RS", &[], &[]),
                    ep(2, "RSL", &[], &[]),
                    ep(3, "RSL", &[], &[]),
                ],
                policy: ITP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[1, 2],
                has_any: true,
                mode: None,
            },
            Case {
                name: "iTP Local: no local endpoints but some remote",
                eps: vec![ep(1, "RS", &[], &[])],
                policy: ITP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "iTP Local: local serving+terminating fallback",
                eps: vec![
                    ep(1, "RS", &[], &[]),
                    ep(2, "STL", &[], &[]),
                    ep(3, "SL", &[], &[]),
                ],
                policy: ITP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[1],
                has_any: true,
                mode: None,
            },
            Case {
                name: "iTP Local: local ready preferred over local terminating",
                eps: vec![ep(1, "RSL", &[], &[]), ep(2, "STL", &[], &[])],
                policy: ITP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[0],
                has_any: true,
                mode: None,
            },
            Case {
                name: "iTP Local: remote serving+terminating counts for has_any",
                eps: vec![ep(1, "ST", &[], &[])],
                policy: ITP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "iTP Local: nothing usable",
                eps: vec![ep(1, "SL", &[], &[]), ep(2, "L", &[], &[])],
                policy: ITP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[],
                local: &[],
                has_any: false,
                mode: None,
            },
            Case {
                name: "iTP Local ignores hints",
                eps: vec![ep(1, "RSL", &["b"], &[]), ep(2, "RS", &["a"], &[])],
                policy: ITP_LOCAL,
                zone: "a",
                gate: true,
                cluster: &[],
                local: &[0],
                has_any: true,
                mode: None,
            },
            Case {
                name: "eTP Local: both lists",
                eps: vec![ep(1, "RS", &[], &[]), ep(2, "RSL", &[], &[])],
                policy: ETP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[0, 1],
                local: &[1],
                has_any: true,
                mode: None,
            },
            Case {
                name: "eTP Local: cluster list uses topology, local list does not",
                eps: vec![ep(1, "RS", &["a"], &[]), ep(2, "RSL", &["b"], &[])],
                policy: ETP_LOCAL,
                zone: "a",
                gate: true,
                cluster: &[0],
                local: &[1],
                has_any: true,
                mode: PreferSameZone,
            },
            Case {
                name: "eTP Local: cluster ready, local only terminating",
                eps: vec![ep(1, "RS", &[], &[]), ep(2, "STL", &[], &[])],
                policy: ETP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[0],
                local: &[1],
                has_any: true,
                mode: None,
            },
            Case {
                name: "eTP Local without external access: cluster only",
                eps: vec![ep(1, "RS", &[], &[]), ep(2, "RSL", &[], &[])],
                policy: ETP_LOCAL_NOT_EXTERNAL,
                zone: "",
                gate: true,
                cluster: &[0, 1],
                local: &[],
                has_any: true,
                mode: None,
            },
            Case {
                name: "iTP and eTP Local with external access: both lists",
                eps: vec![ep(1, "RS", &[], &[]), ep(2, "RSL", &[], &[])],
                policy: BOTH_LOCAL,
                zone: "",
                gate: true,
                cluster: &[0, 1],
                local: &[1],
                has_any: true,
                mode: None,
            },
            Case {
                name: "no local endpoints at all, eTP Local",
                eps: vec![ep(1, "RS", &[], &[])],
                policy: ETP_LOCAL,
                zone: "",
                gate: true,
                cluster: &[0],
                local: &[],
                has_any: true,
                mode: None,
            },
        ];
        for c in cases {
            let topo = Topology {
                node_name: "node-a",
                zone: c.zone,
                prefer_same_node: c.gate,
            };
            let got = categorize(&c.eps, c.policy, &topo);
            assert_eq!(got.cluster, c.cluster, "{}: cluster", c.name);
            assert_eq!(got.local, c.local, "{}: local", c.name);
            assert_eq!(got.has_any, c.has_any, "{}: has_any", c.name);
            if c.policy.uses_cluster_endpoints() {
                assert_eq!(got.topology, c.mode, "{}: mode", c.name);
            }
        }
    }

    fn slices(yaml: &str) -> Vec<EndpointSlice> {
        yaml_serde::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    }

    /// The merge as it was written before slices were read one by one: every slice into one
    /// map per port, in order. The reference for `merge_read`.
    fn merge_at_once(
        slices: &[EndpointSlice],
        node_name: &str,
        gate: bool,
    ) -> BTreeMap<PortKey, Vec<EndpointInfo>> {
        let mut sets: BTreeMap<PortKey, BTreeMap<EndpointKey, EndpointInfo>> = BTreeMap::new();
        for slice in slices {
            let v6 = match slice.address_type.as_str() {
                "IPv4" => false,
                "IPv6" => true,
                _ => continue,
            };
            let eps: Vec<(IpAddr, &k8s_openapi::api::discovery::v1::Endpoint)> = slice
                .endpoints
                .iter()
                .filter_map(|ep| {
                    let ip = crate::validate::ip(ep.addresses.first()?).ok()?;
                    (ip.is_ipv6() == v6).then_some((ip, ep))
                })
                .collect();
            for port in slice.ports.iter().flatten() {
                let Some(Ok(number)) = port.port.map(crate::validate::port) else {
                    continue;
                };
                let key = PortKey {
                    v6,
                    name: port.name.clone().unwrap_or_default(),
                    protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                };
                let set = sets.entry(key).or_default();
                for &(ip, ep) in &eps {
                    let info = endpoint_info(ip, number, ep, node_name, gate);
                    let k = info.key();
                    if !set.contains_key(&k) || !info.terminating {
                        set.insert(k, info);
                    }
                }
            }
        }
        sets.into_iter()
            .filter(|(_, set)| !set.is_empty())
            .map(|(k, set)| (k, set.into_values().collect()))
            .collect()
    }

    /// A random slice named `s-{k}`: addresses repeated within and across slices, terminating
    /// copies, repeated and unnamed ports, both families, bad addresses. `spread` widens the
    /// address range (fewer repeats).
    fn random_slice(below: &mut impl FnMut(u64) -> u64, k: usize, spread: u64) -> EndpointSlice {
        use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
        let v6 = below(4) == 0;
        let mut endpoints = Vec::new();
        for _ in 0..below(12) {
            let a = below(10 * spread);
            let addr = match (v6, below(20)) {
                (_, 0) => "not-an-ip".to_string(),
                (true, _) => format!("fd00::{a}"),
                (false, _) => format!("10.0.{}.{a}", below(2) * 10),
            };
            let flag = |r: u64| match r {
                0 => None,
                1 => Some(false),
                _ => Some(true),
            };
            endpoints.push(Endpoint {
                addresses: vec![addr],
                conditions: Some(EndpointConditions {
                    ready: flag(below(3)),
                    serving: flag(below(3)),
                    terminating: flag(below(3)),
                }),
                node_name: Some(format!("node-{}", below(2))),
                ..Default::default()
            });
        }
        let ports = (0..1 + below(3))
            .map(|_| EndpointPort {
                name: [None, Some("a".to_string()), Some("b".to_string())][below(3) as usize]
                    .clone(),
                port: Some(8080 + below(3) as i32),
                protocol: [None, Some("UDP".to_string())][below(2) as usize].clone(),
                ..Default::default()
            })
            .collect();
        EndpointSlice {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(format!("s-{k}")),
                ..Default::default()
            },
            address_type: if v6 { "IPv6" } else { "IPv4" }.into(),
            endpoints,
            ports: Some(ports),
        }
    }

    fn xorshift() -> impl FnMut(u64) -> u64 {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// Slices read one by one and merged (`merge_read`, what incremental builds do) give what
    /// merging them all at once gives.
    #[test]
    fn merging_slices_read_one_by_one_equals_merging_at_once() {
        let mut below = xorshift();
        for round in 0..300 {
            let n_slices = 1 + below(8) as usize;
            let slices: Vec<EndpointSlice> = (0..n_slices)
                .map(|k| random_slice(&mut below, k, 1))
                .collect();
            let want = merge_at_once(&slices, "node-0", true);
            let read: Vec<SliceEndpoints> = slices
                .iter()
                .map(|s| read_slice(s, "node-0", true))
                .collect();
            let mut problems = Vec::new();
            assert_eq!(
                merge_read(read.iter(), &mut problems),
                want,
                "round {round}"
            );
            assert_eq!(MergedEndpoints::new(read.iter()).lists, want);
            let mut p2 = Vec::new();
            assert_eq!(merge_slices(&slices, "node-0", true, &mut p2), want);
            assert_eq!(problems, p2);
        }
    }

    /// One slice after another changed and patched in (`MergedEndpoints::replace`, what an
    /// incremental build does for a Service with many slices) gives what merging every slice
    /// again gives; when it declines (a key in two slices), merging again is what the caller
    /// does. Both outcomes occur.
    #[test]
    fn patching_one_slice_in_equals_merging_again() {
        let mut below = xorshift();
        let (mut patched, mut declined) = (0, 0);
        for round in 0..200 {
            let n_slices = 1 + below(8) as usize;
            let spread = [1, 20, 1000][below(3) as usize];
            let mut slices: Vec<EndpointSlice> = (0..n_slices)
                .map(|k| random_slice(&mut below, k, spread))
                .collect();
            let mut read: Vec<SliceEndpoints> = slices
                .iter()
                .map(|s| read_slice(s, "node-0", false))
                .collect();
            let mut merged = MergedEndpoints::new(read.iter());
            for step in 0..10 {
                let k = below(n_slices as u64) as usize;
                slices[k] = random_slice(&mut below, k, spread);
                let new = read_slice(&slices[k], "node-0", false);
                let was = std::mem::replace(&mut read[k], new);
                if merged.replace(&was, &read[k]) {
                    patched += 1;
                } else {
                    declined += 1;
                    merged = MergedEndpoints::new(read.iter());
                }
                let want = merge_at_once(&slices, "node-0", false);
                assert_eq!(merged.lists, want, "round {round} step {step}");
                assert_eq!(
                    merged,
                    MergedEndpoints::new(read.iter()),
                    "round {round} step {step}"
                );
            }
        }
        assert!(
            patched > 100 && declined > 100,
            "{patched} patched, {declined} declined"
        );
    }

    #[test]
    fn merge_dedup_named_ports_families() {
        let s = slices(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: n, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: metrics, port: 9090}]
endpoints:
- {addresses: [10.0.0.2], nodeName: node-a}
- {addresses: [10.0.0.1], conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.0.0.9], conditions: {ready: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-b, namespace: n, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
# Another slice may name the same port with another number: each slice resolves its own.
ports: [{name: http, port: 8081, protocol: TCP}]
endpoints:
- {addresses: [10.0.0.3], hints: {forZones: [{name: z1}], forNodes: [{name: node-a}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-c, namespace: n, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
# duplicate of web-a's 10.0.0.1:8080, now ready: replaces the terminating copy
- {addresses: [10.0.0.1]}
# duplicate of 10.0.0.2:8080 but terminating: the earlier copy is kept
- {addresses: [10.0.0.2], conditions: {terminating: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: n, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: ["fd00::1"]}
- {addresses: [10.0.0.7]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-fqdn, namespace: n, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{name: http, port: 80}]
endpoints:
- {addresses: [example.com]}
"#,
        );
        let mut problems = Vec::new();
        let m = merge_slices(&s, "node-a", true, &mut problems);
        let http4 = &m[&PortKey {
            v6: false,
            name: "http".into(),
            protocol: "TCP".into(),
        }];
        let keys: Vec<_> = http4.iter().map(|e| e.key().to_string()).collect();
        assert_eq!(
            keys,
            vec![
                "10.0.0.1:8080",
                "10.0.0.2:8080",
                "10.0.0.3:8081",
                "10.0.0.9:8080"
            ]
        );
        assert!(
            http4[0].ready && !http4[0].terminating,
            "replaced by the ready copy"
        );
        assert!(
            http4[1].local && !http4[1].terminating,
            "kept the running copy"
        );
        assert_eq!(http4[2].zone_hints.iter().collect::<Vec<_>>(), vec!["z1"]);
        assert_eq!(
            http4[2].node_hints.iter().collect::<Vec<_>>(),
            vec!["node-a"]
        );
        let metrics = &m[&PortKey {
            v6: false,
            name: "metrics".into(),
            protocol: "TCP".into(),
        }];
        assert_eq!(metrics.len(), 3);
        assert!(metrics.iter().all(|e| e.port == 9090));
        let http6 = &m[&PortKey {
            v6: true,
            name: "http".into(),
            protocol: "TCP".into(),
        }];
        assert_eq!(
            http6
                .iter()
                .map(|e| e.key().to_string())
                .collect::<Vec<_>>(),
            vec!["[fd00::1]:8080"]
        );
        assert_eq!(m.len(), 3, "FQDN slice ignored");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("web-v6") && problems[0].contains("10.0.0.7"));

        // Without the gate, node hints are dropped at merge time.
        let m = merge_slices(&s, "node-a", false, &mut Vec::new());
        let http4 = &m[&PortKey {
            v6: false,
            name: "http".into(),
            protocol: "TCP".into(),
        }];
        assert!(http4[2].node_hints.is_empty());
    }

    #[test]
    fn merge_conditions_defaults_and_unnamed_ports() {
        let s = slices(
            r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s, namespace: n}
addressType: IPv4
ports: [{port: 53, protocol: UDP}, {name: bad}, {name: zero, port: 0}]
endpoints:
- {addresses: [10.0.0.1], conditions: {}}
- {addresses: [10.0.0.2], conditions: {ready: false}}
- {addresses: []}
- {addresses: [not-an-ip]}
"#,
        );
        let mut problems = Vec::new();
        let m = merge_slices(&s, "", true, &mut problems);
        let dns = &m[&PortKey {
            v6: false,
            name: "".into(),
            protocol: "UDP".into(),
        }];
        assert_eq!(dns.len(), 2);
        assert!(dns[0].ready && dns[0].serving && !dns[0].terminating && !dns[0].local);
        assert!(!dns[1].ready && dns[1].serving && !dns[1].terminating);
        assert_eq!(m.len(), 1);
        assert_eq!(problems.len(), 4, "{problems:?}");
    }
}
