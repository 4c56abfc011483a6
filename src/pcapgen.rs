//! Synthetic traffic for benchmarks and tests (`kxdp pcap gen`): a cluster of ClusterIP Services
//! (config + state manifests) and a capture of pod clients talking to them.
//!
//! Everything is a pure function of the `GenSpec`: the same spec (seed included) gives
//! byte-identical files, so benchmark runs on different machines replay the same traffic. The
//! capture is streamed to disk, so captures of many millions of packets need memory only for the
//! per-flow sequence numbers and the flow order, not for the frames.
//!
//! Address plan (chosen so that no two roles overlap, and every frame is an ordinary pod-to-Service
//! packet for the dataplane):
//!
//! | role | IPv4 | IPv6 |
//! | --- | --- | --- |
//! | ClusterIP of Service `i` | 172.16.0.0/12, `+ 1 + i` | fd00:30::/108, `+ 1 + i` |
//! | endpoint `k` (all Services) | 10.128.0.0/9, `+ 1 + k` | fd00:0:0:2::/64, `+ 1 + k` |
//! | client of flow `f` | 10.1.0.0/16 (address `1 + f % C`) | fd00:0:0:1::/64 (same index) |
//! | source port of flow `f` | `1024 + (f / C) % 64512` | same |
//! | nodes | 192.168.0.2 (this node) .. .5 | fd00:ff::2 .. ::5 |
//!
//! `C` is `GenSpec::clients`: 65,534 by default (every address of the /16), so that 10k flows
//! come from 10k clients; fewer put many flows on each client address, as a node's own
//! processes, an ingress controller or a NAT gateway in front of the pods would.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use kxdp_packet::pcap::Writer;
use kxdp_packet::{ethernet, ipv4, ipv6, tcp, Addr, Family, IpProto, LinkType};

/// What the capture's packets are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GenMode {
    /// Every flow opens with a SYN (all SYNs first), then data segments (ACK, ACK|PSH) cycle over
    /// the flows in a shuffled order: after the SYNs, every packet is a conntrack hit.
    #[default]
    Established,
    /// Every packet is the SYN of a new flow: every packet is a conntrack miss and an insert.
    NewConnections,
    /// `Established`, except that every tenth packet after the initial SYNs is the SYN of a new flow.
    Mixed,
}

impl GenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GenMode::Established => "established",
            GenMode::NewConnections => "new",
            GenMode::Mixed => "mixed",
        }
    }
}

impl FromStr for GenMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "established" => Ok(GenMode::Established),
            "new" | "new-connections" => Ok(GenMode::NewConnections),
            "mixed" => Ok(GenMode::Mixed),
            _ => Err(format!(
                "unknown mode `{s}` (expected established, new or mixed)"
            )),
        }
    }
}

/// What to generate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenSpec {
    /// ClusterIP Services, one TCP port each (80 → targetPort 8080).
    pub services: u32,
    /// Ready endpoints per Service, spread over four nodes.
    pub endpoints_per_service: u32,
    /// Long-lived flows (`Established`, `Mixed`); unused by `NewConnections`, where every packet is
    /// its own flow.
    pub flows: u32,
    /// Packets in the capture.
    pub packets: u64,
    pub mode: GenMode,
    /// IPv6 Services, endpoints and traffic instead of IPv4.
    pub ipv6: bool,
    /// Largest frame in bytes (Ethernet header included, no FCS): data segments are between 64 (or
    /// the bare headers, if longer) and this many bytes; SYNs carry no payload and are padded to 64
    /// bytes like on the wire.
    pub payload: usize,
    pub seed: u64,
    /// Client addresses the flows are spread over (1 to 65,534): flow `f` comes from client
    /// `f % clients` with source port `1024 + f / clients` (see the module's address plan).
    pub clients: u32,
    /// Packets per second of the capture's clock (the gap between timestamps). Conntrack's
    /// timeouts and its expiry scan run on this clock in `kxdp replay`: the scan reads each used
    /// entry once per capture second, so a capture replayed faster than its own rate pays that
    /// scan more often per packet than live traffic at the replay's rate would.
    pub rate_pps: u64,
}

impl Default for GenSpec {
    fn default() -> Self {
        GenSpec {
            services: 1000,
            endpoints_per_service: 10,
            flows: 10_000,
            packets: 1_000_000,
            mode: GenMode::Established,
            ipv6: false,
            payload: 64,
            seed: 1,
            clients: CLIENT_ADDRS as u32,
            rate_pps: DEFAULT_RATE_PPS,
        }
    }
}

/// What `generate` wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenSummary {
    pub config: PathBuf,
    pub state: PathBuf,
    pub pcap: PathBuf,
    pub services: u32,
    pub endpoints: u64,
    pub packets: u64,
    /// SYNs in the capture: one per distinct flow.
    pub syn_packets: u64,
    pub data_packets: u64,
    /// Distinct flows in the capture (what conntrack has to hold after one pass).
    pub flows: u64,
    /// Frame bytes in the capture.
    pub bytes: u64,
    /// `conntrack.maxEntries` written to the config.
    pub conntrack_max_entries: u32,
}

/// Node names and addresses: the first is this node (`nodeName` in the config).
const NODES: usize = 4;
const NODE_NAME: &str = "bench-node";
const NAMESPACE: &str = "bench";
/// kube's default `--max-endpoints-per-slice`.
const ENDPOINTS_PER_SLICE: u32 = 100;
/// Client addresses per family (10.1.0.1 .. 10.1.255.254) and source ports per address.
pub const CLIENT_ADDRS: u64 = 65_534;
const CLIENT_PORTS: u64 = 64_512;
/// Limits of the address plan (see the module docs).
const MAX_SERVICES: u32 = (1 << 20) - 2;
const MAX_ENDPOINTS: u64 = (1 << 23) - 2;
/// Capture clock: the first packet's time, and the default rate (1 Mpps on the wire). With one
/// packet per microsecond, a repeated replay of a million-packet capture stays well inside the
/// 120 s timeout of unanswered (SYN_SENT) connections.
const TS_START_NS: u64 = 1_700_000_000_000_000_000;
pub const DEFAULT_RATE_PPS: u64 = 1_000_000;
/// The fastest clock: one packet per nanosecond (the capture's timestamp resolution).
const MAX_RATE_PPS: u64 = 1_000_000_000;
/// Frames shorter than this are padded, as on Ethernet (60 bytes + 4 bytes FCS on the wire; the
/// benchmark convention counts 64).
const MIN_FRAME: usize = 64;
const ETH_HDR: usize = 14;
const TCP_HDR: usize = 20;
/// Largest frame generated (a standard 1500-byte MTU plus the Ethernet header).
const MAX_FRAME: usize = 1514;

use kxdp_packet::tcp::flags::{ACK, PSH, SYN};

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The packet counts a spec leads to, decided before anything is written (the config's conntrack
/// size depends on them).
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Long-lived flows that get a SYN at the start (`Established`, `Mixed`).
    long_flows: u64,
    /// SYNs of one-packet flows (`NewConnections`, the 10 % of `Mixed`).
    new_flows: u64,
    data: u64,
}

impl Plan {
    fn of(spec: &GenSpec) -> Plan {
        match spec.mode {
            GenMode::NewConnections => Plan {
                long_flows: 0,
                new_flows: spec.packets,
                data: 0,
            },
            GenMode::Established | GenMode::Mixed => {
                let long_flows = (spec.flows as u64).min(spec.packets);
                let rest = spec.packets - long_flows;
                // With no long flow there is nothing to send data on: everything is new.
                let new_flows = if long_flows == 0 {
                    rest
                } else if spec.mode == GenMode::Mixed {
                    rest / 10
                } else {
                    0
                };
                Plan {
                    long_flows,
                    new_flows,
                    data: rest - new_flows,
                }
            }
        }
    }

    fn flows(&self) -> u64 {
        self.long_flows + self.new_flows
    }
}

/// Writes `config.yaml`, `state.yaml` and `capture.pcap` into `out_dir` (created if missing).
pub fn generate(spec: &GenSpec, out_dir: &Path) -> io::Result<GenSummary> {
    if spec.services == 0 || spec.services > MAX_SERVICES {
        return Err(invalid(format!(
            "services must be between 1 and {MAX_SERVICES}, not {}",
            spec.services
        )));
    }
    let endpoints = spec.services as u64 * spec.endpoints_per_service as u64;
    if endpoints > MAX_ENDPOINTS {
        return Err(invalid(format!(
            "services × endpoints must be at most {MAX_ENDPOINTS}, not {endpoints}"
        )));
    }
    if spec.rate_pps == 0 || spec.rate_pps > MAX_RATE_PPS {
        return Err(invalid(format!(
            "rate must be between 1 and {MAX_RATE_PPS} packets per second, not {}",
            spec.rate_pps
        )));
    }
    if spec.clients == 0 || spec.clients as u64 > CLIENT_ADDRS {
        return Err(invalid(format!(
            "clients must be between 1 and {CLIENT_ADDRS}, not {}",
            spec.clients
        )));
    }
    let plan = Plan::of(spec);
    if plan.flows() > spec.clients as u64 * CLIENT_PORTS {
        return Err(invalid(format!(
            "{} distinct flows do not fit the client plan ({} addresses × {CLIENT_PORTS} source ports)",
            plan.flows(),
            spec.clients
        )));
    }
    std::fs::create_dir_all(out_dir)?;
    // Room for every flow of one pass with a quarter to spare, so that a benchmark never measures
    // early drop or `conntrack-full`.
    let max_entries = (plan.flows() + plan.flows() / 4).clamp(1024, 1 << 29) as u32;

    let config = out_dir.join("config.yaml");
    std::fs::write(&config, config_yaml(spec, max_entries))?;
    let state = out_dir.join("state.yaml");
    write_state(spec, &state)?;
    let pcap = out_dir.join("capture.pcap");
    let (packets, bytes) = write_capture(spec, &plan, &pcap)?;

    Ok(GenSummary {
        config,
        state,
        pcap,
        services: spec.services,
        endpoints,
        packets,
        syn_packets: plan.flows(),
        data_packets: plan.data,
        flows: plan.flows(),
        bytes,
        conntrack_max_entries: max_entries,
    })
}

// ---- addresses -------------------------------------------------------------------------------

fn family(spec: &GenSpec) -> Family {
    if spec.ipv6 {
        Family::V6
    } else {
        Family::V4
    }
}

/// `base + offset` in the given family (offsets stay inside the prefixes; see `generate`'s checks).
fn addr_plus(fam: Family, v4_base: u32, v6_base: u128, offset: u64) -> Addr {
    match fam {
        Family::V4 => Addr::from_v4((v4_base + offset as u32).to_be_bytes()),
        Family::V6 => Addr::from_v6((v6_base + offset as u128).to_be_bytes()),
    }
}

fn cluster_ip(fam: Family, service: u32) -> Addr {
    addr_plus(
        fam,
        0xac10_0000,                                   // 172.16.0.0
        0xfd00_0030_0000_0000_0000_0000_0000_0000u128, // fd00:30::
        1 + service as u64,
    )
}

fn endpoint_ip(fam: Family, k: u64) -> Addr {
    addr_plus(
        fam,
        0x0a80_0000,                                   // 10.128.0.0
        0xfd00_0000_0000_0002_0000_0000_0000_0000u128, // fd00:0:0:2::
        1 + k,
    )
}

/// Flow `flow`'s client address and source port, over `clients` addresses.
fn client(fam: Family, clients: u64, flow: u64) -> (Addr, u16) {
    let addr = addr_plus(
        fam,
        0x0a01_0000,                                   // 10.1.0.0
        0xfd00_0000_0000_0001_0000_0000_0000_0000u128, // fd00:0:0:1::
        1 + flow % clients,
    );
    (addr, (1024 + (flow / clients) % CLIENT_PORTS) as u16)
}

fn node_ip(fam: Family, n: usize) -> String {
    match fam {
        Family::V4 => format!("192.168.0.{}", 2 + n),
        Family::V6 => format!("fd00:ff::{}", 2 + n),
    }
}

fn node_name(n: usize) -> String {
    if n == 0 {
        NODE_NAME.to_string()
    } else {
        format!("{NODE_NAME}-{n}")
    }
}

fn ip_string(fam: Family, a: Addr) -> String {
    a.to_ip(fam).to_string()
}

// ---- config and state ------------------------------------------------------------------------

fn config_yaml(spec: &GenSpec, max_entries: u32) -> String {
    // IPv6 runs are dual-stack clusters (as IPv6 clusters usually are), with IPv6 Services.
    let (node_ips, cluster, service) = if spec.ipv6 {
        (
            format!("[{}, {}]", node_ip(Family::V4, 0), node_ip(Family::V6, 0)),
            "[10.0.0.0/8, fd00::/48]",
            "[172.16.0.0/12, fd00:30::/108]",
        )
    } else {
        (
            format!("[{}]", node_ip(Family::V4, 0)),
            "[10.0.0.0/8]",
            "[172.16.0.0/12]",
        )
    };
    format!(
        "# Generated by `kxdp pcap gen` (mode {mode}, seed {seed}).\n\
         apiVersion: kxdp.dev/v1alpha1\n\
         kind: DataplaneConfiguration\n\
         nodeName: {NODE_NAME}\n\
         nodeIPs: {node_ips}\n\
         clusterCIDRs: {cluster}\n\
         serviceCIDRs: {service}\n\
         conntrack: {{maxEntries: {max_entries}}}\n\
         healthzBindAddress: \"\"\n\
         metricsBindAddress: \"\"\n",
        mode = spec.mode.as_str(),
        seed = spec.seed,
    )
}

fn write_state(spec: &GenSpec, path: &Path) -> io::Result<()> {
    let fam = family(spec);
    let (fam_name, addr_type) = match fam {
        Family::V4 => ("IPv4", "IPv4"),
        Family::V6 => ("IPv6", "IPv6"),
    };
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut addresses = format!(
        "    - {{type: InternalIP, address: {}}}\n",
        node_ip(Family::V4, 0)
    );
    if spec.ipv6 {
        let _ = writeln!(
            addresses,
            "    - {{type: InternalIP, address: \"{}\"}}",
            node_ip(Family::V6, 0)
        );
    }
    write!(
        w,
        "apiVersion: v1\n\
         kind: Node\n\
         metadata:\n  name: {NODE_NAME}\n\
         status:\n  addresses:\n{addresses}"
    )?;
    write!(
        w,
        "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
    )?;
    let eps = spec.endpoints_per_service;
    let mut doc = String::with_capacity(4096);
    for s in 0..spec.services {
        doc.clear();
        let ip = ip_string(fam, cluster_ip(fam, s));
        let _ = write!(
            doc,
            "---\n\
             apiVersion: v1\n\
             kind: Service\n\
             metadata:\n  name: svc-{s}\n  namespace: {NAMESPACE}\n\
             spec:\n  type: ClusterIP\n  clusterIP: \"{ip}\"\n  clusterIPs: [\"{ip}\"]\n  \
             ipFamilies: [{fam_name}]\n  ipFamilyPolicy: SingleStack\n  \
             selector: {{app: svc-{s}}}\n  \
             ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}\n"
        );
        // kube splits a Service's endpoints into slices of at most 100.
        let mut first = 0;
        let mut slice = 0;
        while first < eps || (eps == 0 && slice == 0) {
            let n = (eps - first).min(ENDPOINTS_PER_SLICE);
            let _ = write!(
                doc,
                "---\n\
                 apiVersion: discovery.k8s.io/v1\n\
                 kind: EndpointSlice\n\
                 metadata:\n  name: svc-{s}-{slice}\n  namespace: {NAMESPACE}\n  \
                 labels: {{kubernetes.io/service-name: svc-{s}}}\n\
                 addressType: {addr_type}\n\
                 ports:\n- {{name: http, port: 8080, protocol: TCP}}\n\
                 endpoints:{}\n",
                if n == 0 { " []" } else { "" }
            );
            for j in first..first + n {
                let k = s as u64 * eps as u64 + j as u64;
                let _ = writeln!(
                    doc,
                    "- addresses: [\"{}\"]\n  \
                     conditions: {{ready: true, serving: true, terminating: false}}\n  \
                     nodeName: {}",
                    ip_string(fam, endpoint_ip(fam, k)),
                    node_name(k as usize % NODES)
                );
            }
            first += n;
            slice += 1;
        }
        w.write_all(doc.as_bytes())?;
    }
    w.flush()
}

// ---- capture ---------------------------------------------------------------------------------

/// splitmix64: tiny, and fixed forever (the capture must not change with a crate upgrade).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (n > 0), multiply-shift.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Builds frames into one reusable buffer.
struct FrameBuilder {
    fam: Family,
    buf: Vec<u8>,
    ip_hdr: usize,
}

impl FrameBuilder {
    fn new(fam: Family) -> FrameBuilder {
        FrameBuilder {
            fam,
            buf: vec![0; MAX_FRAME.max(MIN_FRAME)],
            ip_hdr: match fam {
                Family::V4 => 20,
                Family::V6 => 40,
            },
        }
    }

    fn headers(&self) -> usize {
        ETH_HDR + self.ip_hdr + TCP_HDR
    }

    /// A TCP segment with `payload` bytes of data; returns the frame (padded to 64 bytes).
    #[allow(clippy::too_many_arguments)]
    fn tcp(
        &mut self,
        src: Addr,
        sport: u16,
        dst: Addr,
        dport: u16,
        flags: u8,
        seq: u32,
        ack: u32,
        payload: usize,
        ident: u16,
    ) -> &[u8] {
        let ip_off = ETH_HDR;
        let l4_off = ip_off + self.ip_hdr;
        let seg_len = TCP_HDR + payload;
        let end = l4_off + seg_len;
        let frame_len = end.max(MIN_FRAME);
        let buf = &mut self.buf[..frame_len];
        // Zeroed padding and payload: the same bytes every time, and nothing left from the
        // previous frame.
        buf[l4_off..].fill(0);
        let eth = ethernet::Repr {
            src_addr: [0x02, 0, 0, 0, 0, 0x01],
            dst_addr: [0x02, 0, 0, 0, 0, 0x02],
            vlans: Default::default(),
            ethertype: match self.fam {
                Family::V4 => 0x0800,
                Family::V6 => 0x86dd,
            },
        };
        eth.emit(buf).expect("frame buffer holds the headers");
        match self.fam {
            Family::V4 => ipv4::Repr {
                src_addr: src.v4_octets(),
                dst_addr: dst.v4_octets(),
                protocol: IpProto::TCP.0,
                ttl: 64,
                ident,
                dont_frag: true,
                dscp_ecn: 0,
                payload_len: seg_len,
            }
            .emit(&mut buf[ip_off..])
            .expect("frame buffer holds the headers"),
            Family::V6 => ipv6::Repr {
                src_addr: src.0,
                dst_addr: dst.0,
                next_header: IpProto::TCP.0,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
                payload_len: seg_len,
            }
            .emit(&mut buf[ip_off..])
            .expect("frame buffer holds the headers"),
        }
        tcp::Repr {
            src_port: sport,
            dst_port: dport,
            seq_number: seq,
            ack_number: ack,
            flags,
            window: 64240,
        }
        .emit(&mut buf[l4_off..end], &src, &dst, self.fam)
        .expect("frame buffer holds the headers");
        &self.buf[..frame_len]
    }
}

/// Streams the capture; returns (packets, bytes).
fn write_capture(spec: &GenSpec, plan: &Plan, path: &Path) -> io::Result<(u64, u64)> {
    let fam = family(spec);
    let mut rng = Rng(spec.seed ^ 0x6b78_6470_7063_6170);
    let mut fb = FrameBuilder::new(fam);
    let max_frame = spec.payload.clamp(fb.headers().max(MIN_FRAME), MAX_FRAME);
    let min_data_frame = fb.headers().max(MIN_FRAME);
    let services = spec.services as u64;
    let clients = spec.clients as u64;
    let seed = spec.seed;
    // Flow `f` always goes to the same Service, drawn from the seed (no table needed).
    let service_of =
        |f: u64| ((mix(f ^ seed.rotate_left(17)) as u128 * services as u128) >> 64) as u32;
    let isn_of = |f: u64| mix(f.wrapping_add(seed) ^ 0x5151) as u32;

    let w = Writer::new(
        BufWriter::with_capacity(1 << 20, File::create(path)?),
        LinkType::Ethernet,
    )?;
    let mut out = Out {
        w,
        index: 0,
        bytes: 0,
        rate_pps: spec.rate_pps,
    };

    // The long flows' SYNs, all first.
    for f in 0..plan.long_flows {
        let (src, sport) = client(fam, clients, f);
        let dst = cluster_ip(fam, service_of(f));
        let frame = fb.tcp(src, sport, dst, 80, SYN, isn_of(f), 0, 0, f as u16);
        out.emit(frame)?;
    }
    // Next sequence number of each long flow (SYN consumed one).
    let mut next_seq: Vec<u32> = (0..plan.long_flows)
        .map(|f| isn_of(f).wrapping_add(1))
        .collect();
    // The order data cycles over the flows in: shuffled once (Fisher-Yates), then repeated.
    let mut order: Vec<u32> = (0..plan.long_flows as u32).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let mut cursor = 0usize;
    let mut new_flow = plan.long_flows;
    let (mut data_left, mut new_left) = (plan.data, plan.new_flows);
    let mut k = 0u64;
    while data_left + new_left > 0 {
        // Mixed: one new flow in ten packets, evenly spread; otherwise whatever is left.
        let is_new = if data_left == 0 {
            true
        } else if new_left == 0 {
            false
        } else {
            k % 10 == 9
        };
        k += 1;
        let frame = if is_new {
            new_left -= 1;
            let f = new_flow;
            new_flow += 1;
            let (src, sport) = client(fam, clients, f);
            let dst = cluster_ip(fam, service_of(f));
            fb.tcp(src, sport, dst, 80, SYN, isn_of(f), 0, 0, f as u16)
        } else {
            data_left -= 1;
            let f = order[cursor] as u64;
            cursor = if cursor + 1 == order.len() {
                0
            } else {
                cursor + 1
            };
            let len = min_data_frame + rng.below((max_frame - min_data_frame) as u64 + 1) as usize;
            let data = len - fb.headers();
            let seq = next_seq[f as usize];
            next_seq[f as usize] = seq.wrapping_add(data as u32);
            // Every fourth segment pushes, as an application write boundary would.
            let flags = if rng.below(4) == 0 { ACK | PSH } else { ACK };
            let (src, sport) = client(fam, clients, f);
            let dst = cluster_ip(fam, service_of(f));
            let ack = isn_of(f ^ 0xffff_ffff).wrapping_add(1);
            fb.tcp(src, sport, dst, 80, flags, seq, ack, data, out.index as u16)
        };
        out.emit(frame)?;
    }
    out.w.finish()?;
    Ok((out.index, out.bytes))
}

struct Out {
    w: Writer<BufWriter<File>>,
    index: u64,
    bytes: u64,
    rate_pps: u64,
}

impl Out {
    fn emit(&mut self, frame: &[u8]) -> io::Result<()> {
        self.w.write(ts_ns(self.index, self.rate_pps), frame)?;
        self.index += 1;
        self.bytes += frame.len() as u64;
        Ok(())
    }
}

/// Packet `index`'s timestamp at `rate_pps` (exact: no drift when the gap is not whole
/// nanoseconds).
fn ts_ns(index: u64, rate_pps: u64) -> u64 {
    TS_START_NS + (index as u128 * 1_000_000_000 / rate_pps as u128) as u64
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kxdp_packet::pcap::read_file;
    use kxdp_packet::{parse, verify, PacketMeta, Parsed};
    use serde::Deserialize;

    use super::*;

    fn spec(mode: GenMode) -> GenSpec {
        GenSpec {
            services: 7,
            endpoints_per_service: 3,
            flows: 20,
            packets: 300,
            mode,
            ipv6: false,
            payload: 200,
            seed: 42,
            clients: CLIENT_ADDRS as u32,
            rate_pps: DEFAULT_RATE_PPS,
        }
    }

    fn metas(dir: &Path) -> Vec<(PacketMeta, usize)> {
        let cap = read_file(&dir.join("capture.pcap")).unwrap();
        assert_eq!(cap.link, LinkType::Ethernet);
        cap.packets
            .iter()
            .map(|p| {
                let Ok(Parsed::Ip(m)) = parse(&p.data, LinkType::Ethernet) else {
                    panic!("unparsable frame");
                };
                verify::checksums(&p.data, &m).expect("valid checksums");
                (m, p.data.len())
            })
            .collect()
    }

    fn is_syn(m: &PacketMeta) -> bool {
        m.tcp_flags == SYN
    }

    #[test]
    fn established_syns_first_then_data_over_every_flow() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(GenMode::Established);
        let sum = generate(&s, dir.path()).unwrap();
        assert_eq!(
            (sum.packets, sum.syn_packets, sum.data_packets),
            (300, 20, 280)
        );
        let ms = metas(dir.path());
        assert_eq!(ms.len(), 300);
        let cips: HashSet<Addr> = (0..s.services).map(|i| cluster_ip(Family::V4, i)).collect();
        let mut syn_flows = HashSet::new();
        for (i, (m, len)) in ms.iter().enumerate() {
            assert_eq!((m.proto, m.dport, m.family), (IpProto::TCP, 80, Family::V4));
            assert!(cips.contains(&m.dst));
            assert!((64..=200).contains(len), "frame of {len} bytes");
            if i < 20 {
                assert!(is_syn(m));
                assert_eq!(*len, 64);
                syn_flows.insert((m.src, m.sport));
            } else {
                assert!(m.tcp_flags & ACK != 0 && m.tcp_flags & SYN == 0);
                assert!(
                    syn_flows.contains(&(m.src, m.sport)),
                    "data of an unopened flow"
                );
            }
        }
        assert_eq!(syn_flows.len(), 20);
        // One full cycle touches every flow once.
        let cycle: HashSet<_> = ms[20..40].iter().map(|(m, _)| (m.src, m.sport)).collect();
        assert_eq!(cycle.len(), 20);
        // A flow's data segments follow each other in sequence space.
        let f = (ms[20].0.src, ms[20].0.sport);
        let cap = read_file(&dir.path().join("capture.pcap")).unwrap();
        let segs: Vec<(u32, usize)> = ms
            .iter()
            .zip(&cap.packets)
            .filter(|((m, _), _)| (m.src, m.sport) == f)
            .map(|((m, _), p)| {
                let t = &p.data[m.l4_off as usize..];
                (
                    u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
                    m.l4_len as usize - 20,
                )
            })
            .collect();
        for w in segs.windows(2) {
            let step = if w[0].1 == 0 { 1 } else { w[0].1 as u32 };
            assert_eq!(w[1].0, w[0].0.wrapping_add(step));
        }
    }

    #[test]
    fn new_connections_are_distinct_syns() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(GenMode::NewConnections);
        s.packets = 70_000; // more than one source port per client address
        let sum = generate(&s, dir.path()).unwrap();
        assert_eq!(
            (sum.syn_packets, sum.flows, sum.data_packets),
            (70_000, 70_000, 0)
        );
        let ms = metas(dir.path());
        assert!(ms.iter().all(|(m, len)| is_syn(m) && *len == 64));
        let flows: HashSet<_> = ms.iter().map(|(m, _)| (m.src, m.sport)).collect();
        assert_eq!(flows.len(), 70_000);
        assert!(sum.conntrack_max_entries as u64 >= 70_000);
    }

    #[test]
    fn the_capture_clock_runs_at_the_given_rate() {
        let dir = tempfile::tempdir().unwrap();
        let ts = |rate_pps| {
            let s = GenSpec {
                rate_pps,
                ..spec(GenMode::Established)
            };
            generate(&s, dir.path()).unwrap();
            let cap = read_file(&dir.path().join("capture.pcap")).unwrap();
            cap.packets.iter().map(|p| p.ts_ns).collect::<Vec<_>>()
        };
        // The default: one packet per microsecond.
        let us = ts(DEFAULT_RATE_PPS);
        assert!(us.windows(2).all(|w| w[1] - w[0] == 1_000));
        // 10 Mpps: 100 ns apart, the same packets in a tenth of the time.
        let fast = ts(10_000_000);
        assert!(fast.windows(2).all(|w| w[1] - w[0] == 100));
        assert_eq!(fast[299] - fast[0], (us[299] - us[0]) / 10);
        // A gap of no whole nanoseconds does not drift: 3 Mpps puts packet 300 at 100 µs.
        let odd = ts(3_000_000);
        assert_eq!(odd[299] - odd[0], 299 * 1_000_000_000 / 3_000_000);
        // No rate, or faster than the timestamps resolve, is refused.
        for rate_pps in [0, 2_000_000_000] {
            let s = GenSpec {
                rate_pps,
                ..spec(GenMode::Established)
            };
            let e = generate(&s, dir.path()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("rate"), "{e}");
        }
    }

    #[test]
    fn mixed_is_one_new_flow_in_ten() {
        let dir = tempfile::tempdir().unwrap();
        let sum = generate(&spec(GenMode::Mixed), dir.path()).unwrap();
        assert_eq!((sum.syn_packets, sum.data_packets), (20 + 28, 252));
        let ms = metas(dir.path());
        let syns = ms.iter().filter(|(m, _)| is_syn(m)).count();
        assert_eq!(syns, 48);
        let flows: HashSet<_> = ms.iter().map(|(m, _)| (m.src, m.sport)).collect();
        assert_eq!(flows.len(), 48);
    }

    #[test]
    fn ipv6_traffic_parses() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(GenMode::Mixed);
        s.ipv6 = true;
        s.payload = 64; // below the IPv6 headers: frames are the bare headers
        generate(&s, dir.path()).unwrap();
        let ms = metas(dir.path());
        assert_eq!(ms.len(), 300);
        for (m, len) in &ms {
            assert_eq!(m.family, Family::V6);
            assert_eq!(*len, 74);
            assert!(m.dst.to_ip(Family::V6).to_string().starts_with("fd00:30::"));
        }
        let cfg = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap();
        assert!(cfg.contains("fd00::/48") && cfg.contains("fd00:30::/108"));
    }

    #[test]
    fn deterministic_for_a_seed() {
        let read = |d: &Path| {
            ["config.yaml", "state.yaml", "capture.pcap"].map(|f| std::fs::read(d.join(f)).unwrap())
        };
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let s = spec(GenMode::Mixed);
        generate(&s, a.path()).unwrap();
        generate(&s, b.path()).unwrap();
        generate(&GenSpec { seed: 43, ..s }, c.path()).unwrap();
        assert_eq!(read(a.path()), read(b.path()));
        assert_ne!(read(a.path())[2], read(c.path())[2]);
    }

    #[test]
    fn manifests_are_valid_kubernetes_objects() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(GenMode::Established);
        s.endpoints_per_service = 150; // two slices per Service
        generate(&s, dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join("state.yaml")).unwrap();
        let (mut nodes, mut services, mut slices, mut endpoints) = (0, 0, 0, 0);
        let mut node_names = HashSet::new();
        for de in yaml_serde::Deserializer::from_str(&text) {
            let v = yaml_serde::Value::deserialize(de).unwrap();
            match v["kind"].as_str().unwrap() {
                "Node" => {
                    let n: Node = yaml_serde::from_value(v).unwrap();
                    assert_eq!(n.metadata.name.as_deref(), Some(NODE_NAME));
                    nodes += 1;
                }
                "Service" => {
                    let svc: Service = yaml_serde::from_value(v).unwrap();
                    let spec = svc.spec.unwrap();
                    assert!(spec.cluster_ip.unwrap().starts_with("172.16."));
                    assert_eq!(spec.ports.unwrap()[0].port, 80);
                    services += 1;
                }
                "EndpointSlice" => {
                    let es: EndpointSlice = yaml_serde::from_value(v).unwrap();
                    assert_eq!(es.address_type, "IPv4");
                    assert!(es.endpoints.len() <= 100);
                    for e in &es.endpoints {
                        assert_eq!(e.conditions.as_ref().unwrap().ready, Some(true));
                        node_names.insert(e.node_name.clone().unwrap());
                    }
                    endpoints += es.endpoints.len();
                    slices += 1;
                }
                "Namespace" => {}
                k => panic!("unexpected kind {k}"),
            }
        }
        assert_eq!((nodes, services, slices, endpoints), (1, 7, 14, 7 * 150));
        assert_eq!(node_names.len(), NODES);
        let cfg: yaml_serde::Value =
            yaml_serde::from_str(&std::fs::read_to_string(dir.path().join("config.yaml")).unwrap())
                .unwrap();
        assert_eq!(cfg["kind"].as_str(), Some("DataplaneConfiguration"));
        assert_eq!(cfg["nodeName"].as_str(), Some(NODE_NAME));
        assert!(cfg["conntrack"]["maxEntries"].as_u64().unwrap() >= 300);
    }

    #[test]
    fn bad_specs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let refused = |s: &GenSpec| generate(s, dir.path()).unwrap_err().kind();
        let mut s = spec(GenMode::Established);
        s.services = 0;
        assert_eq!(refused(&s), io::ErrorKind::InvalidInput);
        for clients in [0, CLIENT_ADDRS as u32 + 1] {
            let s = GenSpec {
                clients,
                ..spec(GenMode::Established)
            };
            assert_eq!(
                refused(&s),
                io::ErrorKind::InvalidInput,
                "{clients} clients"
            );
        }
        // More flows than one client's source ports.
        let s = GenSpec {
            clients: 1,
            mode: GenMode::NewConnections,
            packets: CLIENT_PORTS + 1,
            ..spec(GenMode::Established)
        };
        assert_eq!(refused(&s), io::ErrorKind::InvalidInput);
    }

    /// `clients` puts the flows on that many addresses, each with its own source ports: every
    /// flow stays distinct, and the default is the plan every earlier capture had.
    #[test]
    fn flows_share_the_clients_given() {
        let dir = tempfile::tempdir().unwrap();
        let s = GenSpec {
            clients: 3,
            flows: 50,
            ..spec(GenMode::Established)
        };
        generate(&s, dir.path()).unwrap();
        let ms = metas(dir.path());
        let srcs: HashSet<Addr> = ms.iter().map(|(m, _)| m.src).collect();
        let flows: HashSet<_> = ms.iter().map(|(m, _)| (m.src, m.sport)).collect();
        assert_eq!((srcs.len(), flows.len()), (3, 50));
        assert_eq!(
            client(Family::V4, 3, 7),
            (Addr::from_v4([10, 1, 0, 2]), 1026)
        );
        assert_eq!(
            client(Family::V4, CLIENT_ADDRS, 65_535),
            (Addr::from_v4([10, 1, 0, 2]), 1025)
        );
    }
}
