//! Shared helpers of the `kxdp replay` acceptance suite: cluster state builders (realistic
//! Kubernetes objects), packet builders (etherparse's PacketBuilder), a wrapper that runs the real
//! binary end to end, and an independent checksum oracle (etherparse + a bitwise CRC32c) for the
//! frames that come out.
//!
//! Conventions of the test cluster (namespace `demo`):
//!
//! | what | IPv4 | IPv6 |
//! | --- | --- | --- |
//! | this node `node-a` (zone-a) | 192.168.0.2 | fd00:192::2 |
//! | `node-b` (zone-b) | 192.168.0.3 | fd00:192::3 |
//! | `node-c` (zone-a) | 192.168.0.4 | fd00:192::4 |
//! | pods on node-a / node-b / node-c | 10.1.0.0/16 / 10.2.0.0/16 / 10.3.0.0/16 | fd00:10:1::/48 ... |
//! | clusterCIDRs | 10.0.0.0/8 | fd00:10::/32 |
//! | serviceCIDRs | 172.30.0.0/16 | fd00:172:30::/112 |
//! | external client | 203.0.113.7 | 2001:db8::7 |
//!
//! Timing: unless a test says otherwise, packets are 150 ms apart in capture time. Replay batches
//! never span more than 100 ms of capture time, so each packet is decided after the previous one
//! took effect, as live traffic would be (a reply cannot reach the node before its request left).
//! Tests about packets of one flow within one batch use explicit timestamps.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use etherparse::{
    IpHeaders, IpNumber, Ipv4Extensions, Ipv4Header, Ipv6Extensions, Ipv6FlowLabel, Ipv6Header,
    Ipv6RawExtHeader, NetHeaders, PacketBuilder, PacketBuilderStep, PacketHeaders, TcpHeader,
    TransportHeader, VlanId,
};
use kxdp_packet::{IpProto, LinkType, Parsed};
use serde_json::{json, Value};

// ---- the cluster -----------------------------------------------------------------------------

pub const NS: &str = "demo";
pub const NODE_A: &str = "node-a";
pub const NODE_B: &str = "node-b";
pub const NODE_C: &str = "node-c";
pub const NODE_A_IP: &str = "192.168.0.2";
pub const NODE_A_IP6: &str = "fd00:192::2";
pub const NODE_B_IP: &str = "192.168.0.3";
pub const EXTERNAL: &str = "203.0.113.7";
pub const EXTERNAL6: &str = "2001:db8::7";
/// A pod on this node (node-a) that acts as a client.
pub const POD_CLIENT: &str = "10.1.0.50";
pub const POD_CLIENT6: &str = "fd00:10:1::50";

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// The default DataplaneConfiguration (YAML text); tests append top-level keys.
pub const BASE_CONFIG: &str = "\
apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: node-a
clusterCIDRs: [10.0.0.0/8, \"fd00:10::/32\"]
serviceCIDRs: [172.30.0.0/16, \"fd00:172:30::/112\"]
healthzBindAddress: \"\"
metricsBindAddress: \"\"
";

pub fn zone_of(node: &str) -> &'static str {
    match node {
        NODE_B => "zone-b",
        _ => "zone-a",
    }
}

pub fn namespace(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"}
    })
}

/// A v1 Node with the zone label and InternalIP addresses (plus any `ExternalIP=a.b.c.d` entries).
pub fn node(name: &str, zone: &str, addrs: &[&str]) -> Value {
    let mut addresses: Vec<Value> = addrs
        .iter()
        .map(|a| match a.strip_prefix("ExternalIP=") {
            Some(ext) => json!({"type": "ExternalIP", "address": ext}),
            None => json!({"type": "InternalIP", "address": a}),
        })
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": zone
            }
        },
        "spec": {"podCIDRs": []},
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    })
}

pub fn pod(name: &str, node_name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": "registry.k8s.io/e2e-test-images/agnhost:2.53"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": node_ip(node_name)}
    })
}

fn node_ip(node: &str) -> &'static str {
    match node {
        NODE_A => NODE_A_IP,
        NODE_B => NODE_B_IP,
        _ => "192.168.0.4",
    }
}

/// A v1 Service in namespace `demo` with the given spec (written inline by the test, as in a
/// manifest).
pub fn service(name: &str, spec: Value) -> Value {
    service_with(name, json!({}), spec)
}

pub fn service_with(name: &str, annotations: Value, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations, "uid": format!("uid-{name}")},
        "spec": spec,
        "status": {"loadBalancer": {}}
    })
}

/// A Service with a LoadBalancer status (ingress IPs; `ipMode` optional per entry).
pub fn lb_service(name: &str, spec: Value, ingress: Value) -> Value {
    let mut s = service(name, spec);
    s["status"] = json!({"loadBalancer": {"ingress": ingress}});
    s
}

/// A ready endpoint on `node_name` with its zone.
pub fn endpoint(ip: &str, node_name: &str) -> Value {
    ep_cond(ip, node_name, Some(true), Some(true), Some(false))
}

/// An endpoint with explicit conditions (None: the field is omitted).
pub fn ep_cond(
    ip: &str,
    node_name: &str,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
) -> Value {
    let mut cond = serde_json::Map::new();
    if let Some(r) = ready {
        cond.insert("ready".into(), json!(r));
    }
    if let Some(s) = serving {
        cond.insert("serving".into(), json!(s));
    }
    if let Some(t) = terminating {
        cond.insert("terminating".into(), json!(t));
    }
    json!({
        "addresses": [ip],
        "conditions": cond,
        "nodeName": node_name,
        "zone": zone_of(node_name),
        "targetRef": {"kind": "Pod", "namespace": NS, "name": format!("pod-{}", ip.replace([':', '.'], "-"))}
    })
}

/// An endpoint with zone hints.
pub fn ep_zone_hints(ip: &str, node_name: &str, zones: &[&str]) -> Value {
    let mut e = endpoint(ip, node_name);
    e["hints"] = json!({"forZones": zones.iter().map(|z| json!({"name": z})).collect::<Vec<_>>()});
    e
}

/// An endpoint with node hints (and zone hints, as the controller writes both for PreferSameNode).
pub fn ep_node_hints(ip: &str, node_name: &str, nodes: &[&str]) -> Value {
    let mut e = endpoint(ip, node_name);
    e["hints"] = json!({
        "forNodes": nodes.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
        "forZones": [{"name": zone_of(node_name)}]
    });
    e
}

/// A discovery.k8s.io/v1 EndpointSlice of Service `service` (namespace `demo`).
pub fn endpoint_slice(
    service: &str,
    name: &str,
    address_type: &str,
    ports: Value,
    endpoints: Vec<Value>,
) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": format!("uid-{service}")}]
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports
    })
}

/// One slice port: `{"name": name, "port": port, "protocol": proto}`.
pub fn sport(name: &str, port: u16, proto: &str) -> Value {
    json!({"name": name, "port": port, "protocol": proto})
}

pub fn service_cidr(name: &str, cidrs: &[&str]) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": cidrs},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "", "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
    })
}

/// The usual simple case: a ClusterIP Service `name` with one TCP port `port` → `target`, and one
/// IPv4 slice with `eps` (ip, node) all ready.
pub fn simple_service(
    name: &str,
    cluster_ip: &str,
    port: u16,
    target: u16,
    eps: &[(&str, &str)],
) -> Vec<Value> {
    vec![
        service(
            name,
            json!({
                "type": "ClusterIP",
                "clusterIP": cluster_ip,
                "clusterIPs": [cluster_ip],
                "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack",
                "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": target}]
            }),
        ),
        endpoint_slice(
            name,
            &format!("{name}-abcde"),
            "IPv4",
            json!([sport("http", target, "TCP")]),
            eps.iter().map(|(ip, n)| endpoint(ip, n)).collect(),
        ),
    ]
}

// ---- the environment: config + state in a tempdir, and the binary --------------------------

pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: String,
    /// Nodes and namespaces: written to `state/cluster/nodes.yaml`.
    pub infra: Vec<Value>,
    /// Everything else: written to `state/apps.yaml`.
    pub objects: Vec<Value>,
    pub link: LinkType,
    pub seed: u64,
}

impl Default for Env {
    fn default() -> Self {
        Self::new()
    }
}

impl Env {
    /// The test cluster: namespace `demo`, nodes a (this node), b and c, the base config.
    pub fn new() -> Env {
        let mut e = Env::bare();
        e.infra = vec![
            namespace(NS),
            node(NODE_A, "zone-a", &[NODE_A_IP, NODE_A_IP6]),
            node(NODE_B, "zone-b", &[NODE_B_IP, "fd00:192::3"]),
            node(NODE_C, "zone-a", &["192.168.0.4", "fd00:192::4"]),
            pod("client", NODE_A, POD_CLIENT),
        ];
        e
    }

    /// The base config and no objects at all.
    pub fn bare() -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
            config: BASE_CONFIG.to_string(),
            infra: Vec::new(),
            objects: Vec::new(),
            link: LinkType::Ethernet,
            seed: 1,
        }
    }

    /// Appends YAML (top-level keys) to the config.
    pub fn config_extra(&mut self, yaml: &str) -> &mut Self {
        self.config.push_str(yaml);
        if !yaml.ends_with('\n') {
            self.config.push('\n');
        }
        self
    }

    pub fn add(&mut self, obj: Value) -> &mut Self {
        self.objects.push(obj);
        self
    }

    pub fn add_all(&mut self, objs: impl IntoIterator<Item = Value>) -> &mut Self {
        self.objects.extend(objs);
        self
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes config.yaml and state/ into the tempdir.
    pub fn write_files(&self) {
        std::fs::write(self.path("config.yaml"), &self.config).unwrap();
        let state = self.path("state");
        std::fs::create_dir_all(state.join("cluster")).unwrap();
        std::fs::write(state.join("cluster/nodes.yaml"), yaml_docs(&self.infra)).unwrap();
        std::fs::write(state.join("apps.yaml"), yaml_docs(&self.objects)).unwrap();
    }

    /// Runs `kxdp replay` over `frames` (150 ms apart) and returns verdicts and output frames;
    /// panics when the binary fails.
    pub fn replay(&self, frames: &[Vec<u8>]) -> Replay {
        self.replay_at(&spaced(frames, DEFAULT_GAP_NS))
    }

    /// Same, with explicit capture timestamps (nanoseconds).
    pub fn replay_at(&self, packets: &[(u64, Vec<u8>)]) -> Replay {
        self.replay_args(packets, &[])
    }

    pub fn replay_args(&self, packets: &[(u64, Vec<u8>)], extra: &[&str]) -> Replay {
        self.write_files();
        let pcap = self.path("in.pcap");
        write_pcap(&pcap, self.link, packets);
        let out = self.run_cli(&pcap, extra);
        assert!(
            out.status.success(),
            "kxdp replay failed ({:?})\nstderr:\n{}\nstdout:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        let verdicts = read_verdicts(&self.path("v.jsonl"));
        assert_eq!(
            verdicts.len(),
            packets.len(),
            "one verdict per input packet"
        );
        for (i, v) in verdicts.iter().enumerate() {
            assert_eq!(
                v["index"].as_u64(),
                Some(i as u64),
                "verdict {i} index: {v}"
            );
        }
        let cap =
            kxdp_packet::pcap::read_file(&self.path("out.pcap")).expect("output pcap readable");
        assert_eq!(cap.link, self.link, "output pcap keeps the input link type");
        let frames: Vec<Vec<u8>> = cap.packets.into_iter().map(|p| p.data).collect();
        let by_index = assign_outputs(&verdicts, &frames);
        Replay {
            verdicts,
            frames,
            by_index,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            link: self.link,
        }
    }

    /// Runs `kxdp replay --config config.yaml --state state --pcap <pcap> --verdicts v.jsonl
    /// --out out.pcap --seed S <extra>` and returns the raw process output.
    pub fn run_cli(&self, pcap: &Path, extra: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kxdp"));
        cmd.arg("replay")
            .arg("--config")
            .arg(self.path("config.yaml"))
            .arg("--state")
            .arg(self.path("state"))
            .arg("--pcap")
            .arg(pcap)
            .arg("--verdicts")
            .arg(self.path("v.jsonl"))
            .arg("--out")
            .arg(self.path("out.pcap"))
            .arg("--seed")
            .arg(self.seed.to_string())
            .args(extra)
            .env("RUST_LOG", "warn");
        cmd.output().expect("run kxdp")
    }

    /// Writes files and a capture, runs the binary, and returns the output (success or not).
    pub fn run_raw(&self, packets: &[(u64, Vec<u8>)], extra: &[&str]) -> Output {
        self.write_files();
        let pcap = self.path("in.pcap");
        write_pcap(&pcap, self.link, packets);
        self.run_cli(&pcap, extra)
    }
}

pub const DEFAULT_GAP_NS: u64 = 150_000_000;
/// Capture time of the first packet (an arbitrary wall-clock time, 2024-01-01).
pub const T0_NS: u64 = 1_704_067_200_000_000_000;

/// Timestamps `gap_ns` apart from T0.
pub fn spaced(frames: &[Vec<u8>], gap_ns: u64) -> Vec<(u64, Vec<u8>)> {
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| (T0_NS + i as u64 * gap_ns, f.clone()))
        .collect()
}

/// Multi-document YAML; each document in JSON flow style (JSON is YAML).
pub fn yaml_docs(objs: &[Value]) -> String {
    let mut s = String::new();
    for o in objs {
        s.push_str("---\n");
        s.push_str(&serde_json::to_string_pretty(o).unwrap());
        s.push('\n');
    }
    s
}

pub fn write_pcap(path: &Path, link: LinkType, packets: &[(u64, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut w = kxdp_packet::pcap::Writer::new(std::io::BufWriter::new(f), link).unwrap();
    for (ts, data) in packets {
        w.write(*ts, data).unwrap();
    }
    use std::io::Write;
    w.finish().unwrap().flush().unwrap();
}

pub fn read_verdicts(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad verdict line {l:?}: {e}")))
        .collect()
}

/// The output pcap holds the frames that leave (forwarded or reject replies), in input order:
/// maps them back to input indexes. (Should the binary write every input index, dropped and
/// passed ones included, the mapping is one to one.)
fn assign_outputs(verdicts: &[Value], frames: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    if frames.len() == verdicts.len() {
        return frames.iter().cloned().map(Some).collect();
    }
    let mut it = frames.iter();
    let out: Vec<Option<Vec<u8>>> = verdicts
        .iter()
        .map(|v| match v["action"].as_str() {
            Some("forward") | Some("reject") => Some(
                it.next()
                    .expect("an output frame per forwarded/rejected packet")
                    .clone(),
            ),
            _ => None,
        })
        .collect();
    assert!(
        it.next().is_none(),
        "more output frames than forwarded/rejected packets"
    );
    out
}

pub struct Replay {
    pub verdicts: Vec<Value>,
    /// The output pcap's frames, in file order.
    pub frames: Vec<Vec<u8>>,
    /// The output frame of each input packet (None: dropped or passed).
    pub by_index: Vec<Option<Vec<u8>>>,
    pub stdout: String,
    pub stderr: String,
    pub link: LinkType,
}

impl Replay {
    /// The JSON summary `--json` printed (the last JSON line on stdout).
    pub fn summary(&self) -> Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .unwrap_or_else(|| panic!("no JSON summary on stdout:\n{}", self.stdout));
        serde_json::from_str(line).expect("summary is JSON")
    }

    pub fn v(&self, i: usize) -> &Value {
        &self.verdicts[i]
    }

    /// Asserts the action and reason of packet `i`.
    #[track_caller]
    pub fn expect(&self, i: usize, action: &str, reason: &str) -> &Value {
        let v = &self.verdicts[i];
        assert_eq!(
            (v["action"].as_str(), v["reason"].as_str()),
            (Some(action), Some(reason)),
            "packet {i}: {v}"
        );
        v
    }

    /// The output frame of packet `i`, decoded with every checksum verified.
    #[track_caller]
    pub fn out(&self, i: usize) -> Decoded {
        let f = self.by_index[i]
            .as_ref()
            .unwrap_or_else(|| panic!("packet {i} has no output frame: {}", self.verdicts[i]));
        decode(f, self.link)
    }

    pub fn reasons(&self) -> Vec<&str> {
        self.verdicts
            .iter()
            .map(|v| v["reason"].as_str().unwrap_or("?"))
            .collect()
    }

    pub fn count_reason(&self, reason: &str) -> usize {
        self.reasons().iter().filter(|r| **r == reason).count()
    }
}

/// The `dst` of a verdict as a socket address.
#[track_caller]
pub fn vsock(v: &Value, field: &str) -> SocketAddr {
    let s = v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {v}"));
    s.parse()
        .unwrap_or_else(|_| panic!("{field} {s:?} is not ip:port in {v}"))
}

#[track_caller]
pub fn vip(v: &Value, field: &str) -> IpAddr {
    let s = v[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {v}"));
    s.parse::<IpAddr>()
        .or_else(|_| s.parse::<SocketAddr>().map(|a| a.ip()))
        .unwrap_or_else(|_| panic!("{field} {s:?} is no address in {v}"))
}

pub fn masq(v: &Value) -> bool {
    v["masq"]
        .as_bool()
        .unwrap_or_else(|| panic!("no masq in {v}"))
}

pub fn sa(s: &str) -> SocketAddr {
    s.parse()
        .unwrap_or_else(|_| panic!("bad socket address {s}"))
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| panic!("bad address {s}"))
}

/// `ip:port` as a SocketAddr (IPv6 given bare).
pub fn sock(ip_s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(ip_s), port)
}

/// Counts destinations (ip:port) of the verdicts at `idx` that are service-dnat.
pub fn dst_histogram<'a>(
    verdicts: impl IntoIterator<Item = &'a Value>,
) -> BTreeMap<SocketAddr, usize> {
    let mut h = BTreeMap::new();
    for v in verdicts {
        assert_eq!(v["reason"].as_str(), Some("service-dnat"), "{v}");
        *h.entry(vsock(v, "dst")).or_insert(0) += 1;
    }
    h
}

/// Asserts that the histogram's keys are exactly `eligible` (each got some; nothing else did).
#[track_caller]
pub fn assert_spread(h: &BTreeMap<SocketAddr, usize>, eligible: &[&str]) {
    let want: BTreeSet<SocketAddr> = eligible.iter().map(|s| sa(s)).collect();
    let got: BTreeSet<SocketAddr> = h.keys().copied().collect();
    assert_eq!(
        got, want,
        "endpoints chosen (with counts {h:?}) vs eligible"
    );
}

// ---- packets ----------------------------------------------------------------------------------

pub use kxdp_packet::tcp::flags;

fn ip_step(link: LinkType, src: IpAddr, dst: IpAddr) -> PacketBuilderStep<IpHeaders> {
    match link {
        LinkType::Ethernet => {
            let eth = PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC);
            match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), 64),
                (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), 64),
                _ => panic!("mixed families"),
            }
        }
        LinkType::RawIp => match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => PacketBuilder::ipv4(s.octets(), d.octets(), 64),
            (IpAddr::V6(s), IpAddr::V6(d)) => PacketBuilder::ipv6(s.octets(), d.octets(), 64),
            _ => panic!("mixed families"),
        },
    }
}

/// A TCP segment (Ethernet) from `src` to `dst` ("ip:port", IPv6 as "[ip]:port").
pub fn tcp(src: &str, dst: &str, fl: u8, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    tcp_on(LinkType::Ethernet, sa(src), sa(dst), fl, seq, ack, payload)
}

pub fn tcp_on(
    link: LinkType,
    src: SocketAddr,
    dst: SocketAddr,
    fl: u8,
    seq: u32,
    ack: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut step = ip_step(link, src.ip(), dst.ip()).tcp(src.port(), dst.port(), seq, 64240);
    step = with_tcp_flags(step, fl, ack);
    let mut v = Vec::new();
    step.write(&mut v, payload).unwrap();
    v
}

fn with_tcp_flags(
    mut step: PacketBuilderStep<TcpHeader>,
    fl: u8,
    ack: u32,
) -> PacketBuilderStep<TcpHeader> {
    if fl & flags::SYN != 0 {
        step = step.syn();
    }
    if fl & flags::ACK != 0 {
        step = step.ack(ack);
    }
    if fl & flags::FIN != 0 {
        step = step.fin();
    }
    if fl & flags::RST != 0 {
        step = step.rst();
    }
    if fl & flags::PSH != 0 {
        step = step.psh();
    }
    step
}

/// A SYN with sequence number 1000.
pub fn syn(src: &str, dst: &str) -> Vec<u8> {
    tcp(src, dst, flags::SYN, 1000, 0, &[])
}

pub fn udp(src: &str, dst: &str, payload: &[u8]) -> Vec<u8> {
    udp_on(LinkType::Ethernet, sa(src), sa(dst), payload)
}

pub fn udp_on(link: LinkType, src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    ip_step(link, src.ip(), dst.ip())
        .udp(src.port(), dst.port())
        .write(&mut v, payload)
        .unwrap();
    v
}

/// UDP over IPv4 with checksum 0 ("no checksum").
pub fn udp_nocsum(src: &str, dst: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = udp(src, dst, payload);
    let m = meta(&v, LinkType::Ethernet);
    let o = m.l4_off as usize + 6;
    v[o] = 0;
    v[o + 1] = 0;
    v
}

/// An SCTP INIT (verification tag 0, valid CRC32c).
pub fn sctp_init(src: &str, dst: &str) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    let mut b = vec![0u8; 12 + 20];
    b[0..2].copy_from_slice(&s.port().to_be_bytes());
    b[2..4].copy_from_slice(&d.port().to_be_bytes());
    // INIT chunk: type 1, flags 0, length 20, initiate tag, a_rwnd, streams out/in, initial TSN.
    b[12] = 1;
    b[14..16].copy_from_slice(&20u16.to_be_bytes());
    b[16..20].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    b[20..24].copy_from_slice(&65535u32.to_be_bytes());
    b[24..26].copy_from_slice(&10u16.to_be_bytes());
    b[26..28].copy_from_slice(&10u16.to_be_bytes());
    b[28..32].copy_from_slice(&1u32.to_be_bytes());
    let crc = ref_crc32c(&b);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut v = Vec::new();
    ip_step(LinkType::Ethernet, s.ip(), d.ip())
        .write(&mut v, IpNumber(132), &b)
        .unwrap();
    v
}

pub fn icmp_echo(src: &str, dst: &str, id: u16, seq: u16) -> Vec<u8> {
    let (s, d) = (ip(src), ip(dst));
    let mut v = Vec::new();
    let step = ip_step(LinkType::Ethernet, s, d);
    if s.is_ipv6() {
        step.icmpv6_echo_request(id, seq)
            .write(&mut v, b"ping-payload")
            .unwrap();
    } else {
        step.icmpv4_echo_request(id, seq)
            .write(&mut v, b"ping-payload")
            .unwrap();
    }
    v
}

/// A TCP SYN over IPv4 with options (record route, 8 bytes: IHL 7) and the given VLAN tags.
pub fn tcp4_with(src: &str, dst: &str, ip_options: bool, vlans: &[u16]) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    let (IpAddr::V4(si), IpAddr::V4(di)) = (s.ip(), d.ip()) else {
        panic!("v4 only")
    };
    let mut h = Ipv4Header::new(0, 64, IpNumber::TCP, si.octets(), di.octets()).unwrap();
    h.identification = 0x4242;
    if ip_options {
        h.options = [7u8, 7, 4, 0, 0, 0, 0, 0][..].try_into().unwrap();
    }
    let ip = IpHeaders::Ipv4(h, Ipv4Extensions::default());
    let eth = PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC);
    let step = match vlans {
        [] => eth.ip(ip),
        [a] => eth.single_vlan(VlanId::try_new(*a).unwrap()).ip(ip),
        [a, b] => eth
            .double_vlan(VlanId::try_new(*a).unwrap(), VlanId::try_new(*b).unwrap())
            .ip(ip),
        _ => panic!("at most two tags"),
    };
    let mut v = Vec::new();
    step.tcp(s.port(), d.port(), 1000, 64240)
        .syn()
        .write(&mut v, &[])
        .unwrap();
    v
}

/// A UDP datagram over IPv6 with a destination-options extension header.
pub fn udp6_with_ext(src: &str, dst: &str, payload: &[u8]) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    let (IpAddr::V6(si), IpAddr::V6(di)) = (s.ip(), d.ip()) else {
        panic!("v6 only")
    };
    let h = Ipv6Header {
        traffic_class: 0,
        flow_label: Ipv6FlowLabel::ZERO,
        payload_length: 0,
        next_header: IpNumber::UDP,
        hop_limit: 64,
        source: si.octets(),
        destination: di.octets(),
    };
    // PadN option filling the 8-byte header.
    let e = Ipv6Extensions {
        destination_options: Some(
            Ipv6RawExtHeader::new_raw(IpNumber(0), &[1, 4, 0, 0, 0, 0]).unwrap(),
        ),
        ..Default::default()
    };
    let mut v = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC)
        .ip(IpHeaders::Ipv6(h, e))
        .udp(s.port(), d.port())
        .write(&mut v, payload)
        .unwrap();
    v
}

/// An ARP who-has for 192.168.0.2.
pub fn arp() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&[0xff; 6]);
    v.extend_from_slice(&CLIENT_MAC);
    v.extend_from_slice(&[0x08, 0x06]);
    v.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    v.extend_from_slice(&CLIENT_MAC);
    v.extend_from_slice(&[192, 168, 0, 99]);
    v.extend_from_slice(&[0; 6]);
    v.extend_from_slice(&[192, 168, 0, 2]);
    v.resize(60, 0);
    v
}

/// The fast-path parse of a frame (must be IP).
#[track_caller]
pub fn meta(frame: &[u8], link: LinkType) -> kxdp_packet::PacketMeta {
    match kxdp_packet::parse(frame, link) {
        Ok(Parsed::Ip(m)) => m,
        other => panic!("expected an IP frame, got {other:?}"),
    }
}

// ---- decoding what comes out, with an independent checksum oracle ------------------------------

#[derive(Debug, Clone)]
pub struct Decoded {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// TCP/UDP/SCTP ports; ICMP echo: both the identifier; ICMP errors: 0.
    pub sport: u16,
    pub dport: u16,
    pub proto: IpProto,
    pub ttl: u8,
    pub tcp: Option<TcpHeader>,
    pub udp_checksum: Option<u16>,
    /// ICMP/ICMPv6 (type, code).
    pub icmp: Option<(u8, u8)>,
    /// The bytes after the last parsed header (ICMP errors: the quoted packet).
    pub payload: Vec<u8>,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub vlans: usize,
    /// IPv4 options length in bytes (0 without).
    pub ipv4_options: usize,
    /// IPv6 extension headers kept.
    pub ipv6_ext: bool,
}

impl Decoded {
    pub fn src_sock(&self) -> SocketAddr {
        SocketAddr::new(self.src, self.sport)
    }
    pub fn dst_sock(&self) -> SocketAddr {
        SocketAddr::new(self.dst, self.dport)
    }
}

/// Decodes a frame with etherparse and verifies the IPv4 header checksum and the TCP/UDP/ICMP/
/// ICMPv6 checksum against etherparse's computation, the SCTP CRC32c against a bitwise reference,
/// and everything once more with `kxdp_packet::verify::checksums`.
#[track_caller]
pub fn decode(frame: &[u8], link: LinkType) -> Decoded {
    let m = meta(frame, link);
    kxdp_packet::verify::checksums(frame, &m)
        .unwrap_or_else(|e| panic!("verify::checksums: {e:?}"));
    let h = match link {
        LinkType::Ethernet => PacketHeaders::from_ethernet_slice(frame),
        LinkType::RawIp => PacketHeaders::from_ip_slice(frame),
    }
    .unwrap_or_else(|e| panic!("etherparse cannot parse the output frame: {e:?}"));
    let pl = h.payload.slice().to_vec();
    let (mut src_mac, mut dst_mac) = ([0u8; 6], [0u8; 6]);
    if let Some(etherparse::LinkHeader::Ethernet2(e)) = &h.link {
        src_mac = e.source;
        dst_mac = e.destination;
    }
    let mut d = Decoded {
        src: IpAddr::from([0u8; 4]),
        dst: IpAddr::from([0u8; 4]),
        sport: m.sport,
        dport: m.dport,
        proto: m.proto,
        ttl: m.ttl,
        tcp: None,
        udp_checksum: None,
        icmp: None,
        payload: pl.clone(),
        src_mac,
        dst_mac,
        vlans: h.link_exts.len(),
        ipv4_options: 0,
        ipv6_ext: false,
    };
    match (&h.net, &h.transport) {
        (Some(NetHeaders::Ipv4(iph, _)), t) => {
            d.src = IpAddr::from(iph.source);
            d.dst = IpAddr::from(iph.destination);
            d.ipv4_options = iph.options.len();
            assert_eq!(
                iph.header_checksum,
                iph.calc_header_checksum(),
                "IPv4 header checksum"
            );
            match t {
                Some(TransportHeader::Tcp(t)) => {
                    assert_eq!(
                        t.checksum,
                        t.calc_checksum_ipv4(iph, &pl).unwrap(),
                        "TCP checksum"
                    );
                    d.tcp = Some(t.clone());
                }
                Some(TransportHeader::Udp(u)) => {
                    if u.checksum != 0 {
                        assert_eq!(
                            u.checksum,
                            u.calc_checksum_ipv4(iph, &pl).unwrap(),
                            "UDP checksum"
                        );
                    }
                    d.udp_checksum = Some(u.checksum);
                }
                Some(TransportHeader::Icmpv4(i)) => {
                    let want =
                        etherparse::Icmpv4Header::with_checksum(i.icmp_type.clone(), &pl).checksum;
                    assert_eq!(i.checksum, want, "ICMP checksum");
                    d.icmp = Some((frame[m.l4_off as usize], frame[m.l4_off as usize + 1]));
                }
                None if iph.protocol == IpNumber(132) && !m.frag.is_fragment => check_sctp(&pl),
                _ => {}
            }
        }
        (Some(NetHeaders::Ipv6(iph, ext)), t) => {
            d.src = IpAddr::from(iph.source);
            d.dst = IpAddr::from(iph.destination);
            d.ipv6_ext = ext.destination_options.is_some()
                || ext.hop_by_hop_options.is_some()
                || ext.routing.is_some()
                || ext.fragment.is_some();
            match t {
                Some(TransportHeader::Tcp(t)) => {
                    assert_eq!(
                        t.checksum,
                        t.calc_checksum_ipv6(iph, &pl).unwrap(),
                        "TCP checksum"
                    );
                    d.tcp = Some(t.clone());
                }
                Some(TransportHeader::Udp(u)) => {
                    assert_eq!(
                        u.checksum,
                        u.calc_checksum_ipv6(iph, &pl).unwrap(),
                        "UDP checksum"
                    );
                    d.udp_checksum = Some(u.checksum);
                }
                Some(TransportHeader::Icmpv6(i)) => {
                    let want = etherparse::Icmpv6Header::with_checksum(
                        i.icmp_type,
                        iph.source,
                        iph.destination,
                        &pl,
                    )
                    .unwrap()
                    .checksum;
                    assert_eq!(i.checksum, want, "ICMPv6 checksum");
                    d.icmp = Some((frame[m.l4_off as usize], frame[m.l4_off as usize + 1]));
                }
                None if m.proto == IpProto::SCTP && !m.frag.is_fragment => check_sctp(&pl),
                _ => {}
            }
        }
        other => panic!("no IP header in the output frame: {other:?}"),
    }
    if d.icmp.is_some() && !m.is_icmp_echo_request() && !m.is_icmp_echo_reply() {
        d.sport = 0;
        d.dport = 0;
    }
    d
}

#[track_caller]
fn check_sctp(pkt: &[u8]) {
    assert!(pkt.len() >= 12, "SCTP packet too short");
    let mut z = pkt.to_vec();
    let stored = u32::from_le_bytes([z[8], z[9], z[10], z[11]]);
    z[8..12].fill(0);
    assert_eq!(stored, ref_crc32c(&z), "SCTP CRC32c");
}

/// Bitwise reference CRC32c (reflected polynomial 0x82F63B78).
pub fn ref_crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The IP packet inside an Ethernet frame (after the 14-byte header and any VLAN tags).
pub fn ip_part(frame: &[u8]) -> &[u8] {
    let m = meta(frame, LinkType::Ethernet);
    &frame[m.l3_off as usize..m.ip_end()]
}

/// The reply a backend sends to a (rewritten) packet: the decoded output's addresses swapped.
pub fn tcp_reply_to(out: &Decoded, fl: u8, seq: u32, ack: u32) -> Vec<u8> {
    tcp_on(
        LinkType::Ethernet,
        out.dst_sock(),
        out.src_sock(),
        fl,
        seq,
        ack,
        &[],
    )
}

pub fn udp_reply_to(out: &Decoded, payload: &[u8]) -> Vec<u8> {
    udp_on(LinkType::Ethernet, out.dst_sock(), out.src_sock(), payload)
}

/// The plain replay of a test directory: `dir` holds `config.yaml` and `state/`; replays `packets`
/// (150 ms apart) and returns the verdicts and the output pcap's frames.
pub fn run_replay(dir: &Path, packets: &[Vec<u8>]) -> (Vec<Value>, Vec<Vec<u8>>) {
    let pcap = dir.join("in.pcap");
    write_pcap(&pcap, LinkType::Ethernet, &spaced(packets, DEFAULT_GAP_NS));
    let out = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .arg("replay")
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--pcap")
        .arg(&pcap)
        .arg("--verdicts")
        .arg(dir.join("v.jsonl"))
        .arg("--out")
        .arg(dir.join("out.pcap"))
        .arg("--seed")
        .arg("1")
        .output()
        .expect("run kxdp");
    assert!(
        out.status.success(),
        "kxdp replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts = read_verdicts(&dir.join("v.jsonl"));
    let cap = kxdp_packet::pcap::read_file(&dir.join("out.pcap")).expect("output pcap");
    (verdicts, cap.packets.into_iter().map(|p| p.data).collect())
}

// ---- state updates ------------------------------------------------------------------------------

impl Env {
    /// Writes a complete cluster state for `kxdp replay --state-update SECONDS:PATH`: this Env's
    /// nodes and namespaces plus `objects` (which replace every other object), as one
    /// multi-document YAML file `name` in the tempdir. Returns its path.
    pub fn write_state_update(&self, name: &str, objects: &[Value]) -> PathBuf {
        let mut all = self.infra.clone();
        all.extend_from_slice(objects);
        let p = self.path(name);
        std::fs::write(&p, yaml_docs(&all)).unwrap();
        p
    }
}

/// The first packet of a new connection: TCP SYN, UDP datagram or SCTP INIT.
pub fn opener(proto: &str, src: &str, sport: u16, dst: &str, dport: u16) -> Vec<u8> {
    let hp = |ip: &str, port: u16| {
        if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        }
    };
    let (s, d) = (hp(src, sport), hp(dst, dport));
    match proto {
        "TCP" => syn(&s, &d),
        "UDP" => udp(&s, &d, b"probe"),
        "SCTP" => sctp_init(&s, &d),
        _ => unreachable!(),
    }
}

/// Replays one new connection per (row source, column destination, probe) of a reachability
/// grid and compares every verdict with its cell: `.` forwarded (`direct`), `i` / `e` dropped
/// with `policy-denied-ingress` / `policy-denied-egress`, `n` passed to this node's stack.
/// `addr` turns the grid's names into addresses.
#[track_caller]
pub fn replay_policy_grid(
    env: &Env,
    addr: impl Fn(&str) -> String,
    probes: &[(&str, u16)],
    expected: &str,
) {
    let mut lines = expected.lines().map(str::trim).filter(|l| !l.is_empty());
    let dsts: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let mut frames = Vec::new();
    let mut want = Vec::new();
    for line in lines {
        let mut w = line.split_whitespace();
        let src = w.next().unwrap();
        let cells: Vec<&str> = w.collect();
        assert_eq!(cells.len(), dsts.len(), "row {src}");
        for (dst, cell) in dsts.iter().zip(cells) {
            assert_eq!(cell.len(), probes.len(), "{src} -> {dst}");
            for (&(proto, port), c) in probes.iter().zip(cell.chars()) {
                let sport = 20000 + frames.len() as u16;
                frames.push(opener(proto, &addr(src), sport, &addr(dst), port));
                want.push((format!("{src} -> {dst} {proto}/{port}"), c));
            }
        }
    }
    let r = env.replay(&frames);
    let mut bad = Vec::new();
    for (i, (what, c)) in want.iter().enumerate() {
        let v = r.v(i);
        let got = (v["action"].as_str().unwrap(), v["reason"].as_str().unwrap());
        let expect = match c {
            '.' => ("forward", "direct"),
            'i' => ("drop", "policy-denied-ingress"),
            'e' => ("drop", "policy-denied-egress"),
            'n' => ("pass", "to-node"),
            _ => panic!("bad cell {c}"),
        };
        if got != expect {
            bad.push(format!("{what}: want {expect:?}, got {got:?}"));
        }
    }
    assert!(bad.is_empty(), "reachability differs:\n{}", bad.join("\n"));
}
