//! The workload benchmark (run by `benches/workload.sh`; ignored in the normal test run): real
//! servers and clients in the pods of the two-node CNI lab (tests/cni/mod.rs, pod ranges joined
//! by routes), through a ClusterIP whose endpoint is on the other node (`remote`,
//! 172.30.0.10) and one whose endpoint is on the client's node (`local`, 172.30.0.11), with the
//! Service dataplane alternated within each round (each round starting one mode later, so no
//! mode always follows the same one; each test once the machine is quiet):
//!
//! - `kxdp`: `kxdp run` on both nodes (`interfaces: [eth0, "veth*"]`, one worker,
//!   `podInterception: {mode: xdp}`: XDP on the pods' veths too, the rest default; the release
//!   build through `KXDP_BIN`),
//! - `iptables`: no kxdp; kube-proxy's iptables rules for the same Services on both nodes
//!   (`iptables-restore --noflush`, the backend the CNI plugins use),
//! - `nftables`: no kxdp; kube-proxy's nftables table for the same Services on both nodes.
//!
//! Tests per mode, each `KXDP_WORKLOAD_SECONDS` long, from the client pod on node A: iperf3 one
//! and four streams (remote and local); wrk keep-alive against nginx (100-byte body, 32
//! connections; req/s, p50, p99); wrk with `Connection: close` (one new connection per request);
//! sockperf UDP ping-pong (transactions/s, round-trip p50 and p99); dnsperf against dnsmasq (64
//! queries in flight; remote and local). The whole machine's busy CPU time (/proc/stat) over
//! each test gives the CPU per unit of work: ms per Gbit, µs per request, connection,
//! transaction or query.
//!
//! Knobs: `KXDP_WORKLOAD_ROUNDS` (3), `KXDP_WORKLOAD_SECONDS` (5), `KXDP_WORKLOAD_QUICK=1` (one
//! round of one second: checks that everything works, not how fast), `KXDP_WORKLOAD_MODES`
//! (`kxdp-tap iptables nftables`; also `kxdp-base`: the build at `KXDP_BASE_BIN`, for a same-run
//! comparison of two builds (any kxdp mode followed by `@base` runs that build too, e.g.
//! `kxdp-tap@base`), `kxdp-pinned`: each node's worker pinned to a CPU of its
//! own (any kxdp mode followed by `-pinned`, e.g. `kxdp-tap-uplink-pinned`), `kxdp-tap`: kxdp with `podInterception: {mode: tap}` (the default: the pods' veths
//! and the lab's veth uplink through the tap), `kxdp-tap-pods`: the uplink on XDP
//! (`everyVeth: false`, as a NIC keeps it), `kxdp-tap-no-offload`, `kxdp-tap-uplink`: the
//! uplink `eth0` named in `podInterception.interfaces` (on the lab the same as the default); `iptables-ip-rule`: iptables on
//! nodes with one policy-routing rule, what the kernel's rule-based lookup costs),
//! `KXDP_WORKLOAD_OUT` (target/workload). Output: one JSON line per
//! measurement in `results.jsonl`, the medians, ratios and CPU per unit in `summary.md`
//! (`benches/workload.sh` draws the charts from it). Fails if any measurement did not produce
//! a result. Figures: docs/benchmarks.md, "Workloads".

mod cni;
mod lab;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cni::{KxdpNode, Lab, CLUSTER4};
use lab::kube_proxy::{self, pipe_into};

const REMOTE_VIP: &str = "172.30.0.10";
const LOCAL_VIP: &str = "172.30.0.11";
/// The servers' ports in the pods (the lab's own servers hold 8080/TCP and 5353/UDP).
const IPERF_PORT: u16 = 5201;
const HTTP_PORT: u16 = 8000;
const SOCKPERF_PORT: u16 = 11111;
const DNS_PORT: u16 = 5300;
/// The name dnsmasq answers for itself (no upstream).
const DNS_NAME: &str = "www.bench.kxdp.test";

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number")),
        Err(_) => default,
    }
}

/// Busy and total jiffies of the whole machine.
fn cpu_jiffies() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    assert!(f.len() >= 8, "/proc/stat: unexpected first line");
    let total: u64 = f.iter().take(8).sum();
    let idle = f[3] + f[4];
    (total - idle, total)
}

/// The busy share of all CPU time between two `cpu_jiffies` readings (0 to 1).
fn busy_share((busy0, total0): (u64, u64), (busy1, total1): (u64, u64)) -> f64 {
    (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64
}

/// Waits (5 s at most) until the machine is quiet: under 15% of its CPU busy over a quarter
/// of a second. What the last mode or test left behind (the kernel's clean-up of deleted
/// namespaces and of closed connections runs in its workqueues after the fact) must not be
/// charged to the next.
fn settle() {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let before = cpu_jiffies();
        std::thread::sleep(Duration::from_millis(250));
        if busy_share(before, cpu_jiffies()) < 0.15 {
            return;
        }
    }
}

/// One test of a mode.
#[derive(Clone, Copy)]
struct Test {
    case: &'static str,
    name: &'static str,
    unit: &'static str,
    /// The unit of the CPU per unit of work.
    cpu_unit: &'static str,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Iperf { streams: u32 },
    Wrk { close: bool },
    Sockperf,
    Dnsperf,
}

const TESTS: &[Test] = &[
    Test {
        case: "remote",
        name: "iperf3 x1",
        unit: "Gbit/s",
        cpu_unit: "ms/Gbit",
        kind: Kind::Iperf { streams: 1 },
    },
    Test {
        case: "remote",
        name: "iperf3 x4",
        unit: "Gbit/s",
        cpu_unit: "ms/Gbit",
        kind: Kind::Iperf { streams: 4 },
    },
    Test {
        case: "local",
        name: "iperf3 x1",
        unit: "Gbit/s",
        cpu_unit: "ms/Gbit",
        kind: Kind::Iperf { streams: 1 },
    },
    Test {
        case: "local",
        name: "iperf3 x4",
        unit: "Gbit/s",
        cpu_unit: "ms/Gbit",
        kind: Kind::Iperf { streams: 4 },
    },
    Test {
        case: "remote",
        name: "wrk",
        unit: "req/s",
        cpu_unit: "µs/req",
        kind: Kind::Wrk { close: false },
    },
    Test {
        case: "remote",
        name: "wrk close",
        unit: "conn/s",
        cpu_unit: "µs/conn",
        kind: Kind::Wrk { close: true },
    },
    Test {
        case: "remote",
        name: "sockperf",
        unit: "txn/s",
        cpu_unit: "µs/txn",
        kind: Kind::Sockperf,
    },
    Test {
        case: "remote",
        name: "dnsperf",
        unit: "q/s",
        cpu_unit: "µs/query",
        kind: Kind::Dnsperf,
    },
    Test {
        case: "local",
        name: "dnsperf",
        unit: "q/s",
        cpu_unit: "µs/query",
        kind: Kind::Dnsperf,
    },
];

/// What one tool run reported.
#[derive(Default)]
struct Outcome {
    value: f64,
    /// Latency percentiles in ms (wrk: per request; sockperf: round trip).
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    /// Socket errors, non-2xx answers, lost datagrams or queries, TCP retransmits.
    errors: u64,
}

/// Runs `cmd` through `sh -c` inside `ns`, bounded by `limit` (`timeout` kills it), and
/// returns its stdout and stderr together; an error names the command and its output.
fn run_in(ns: &str, cmd: &str, limit: Duration) -> Result<String, String> {
    let secs = limit.as_secs().max(1).to_string();
    let out = Command::new("timeout")
        .args(["-k", "5", &secs, "ip", "netns", "exec", ns, "sh", "-c", cmd])
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{cmd} failed ({}): {text}", out.status))
    }
}

/// The number after `key` on the first line that contains it (`key` included), e.g.
/// `Requests/sec:   123.4`.
fn number_after(text: &str, key: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.contains(key))?;
    let rest = &line[line.find(key)? + key.len()..];
    rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// A wrk latency cell (`702.00us`, `1.05ms`, `1.20s`) in ms.
fn wrk_ms(cell: &str) -> Option<f64> {
    let (num, scale) = if let Some(n) = cell.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = cell.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = cell.strip_suffix('s') {
        (n, 1e3)
    } else {
        (cell, 1.0)
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

fn parse_iperf(out: &str) -> Result<Outcome, String> {
    let start = out
        .find('{')
        .ok_or_else(|| format!("iperf3: no JSON: {out}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&out[start..]).map_err(|e| format!("iperf3 JSON: {e}: {out}"))?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("iperf3: {e}"));
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| format!("iperf3: no end.sum_received: {out}"))?;
    Ok(Outcome {
        value: bps / 1e9,
        errors: v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        ..Outcome::default()
    })
}

fn parse_wrk(out: &str) -> Result<Outcome, String> {
    let rate = number_after(out, "Requests/sec:").ok_or_else(|| format!("wrk: {out}"))?;
    let pct = |p: &str| {
        out.lines()
            .map(str::split_whitespace)
            .filter_map(|mut w| Some((w.next()?, w.next()?)))
            .find(|(k, _)| *k == p)
            .and_then(|(_, v)| wrk_ms(v))
    };
    let mut errors = 0;
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors:")) {
        errors += l
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse::<u64>().ok())
            .sum::<u64>();
    }
    errors += number_after(out, "Non-2xx or 3xx responses:").unwrap_or(0.0) as u64;
    Ok(Outcome {
        value: rate,
        p50_ms: pct("50%"),
        p99_ms: pct("99%"),
        errors,
    })
}

fn parse_sockperf(out: &str) -> Result<Outcome, String> {
    let valid = out
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .ok_or_else(|| format!("sockperf: no valid duration: {out}"))?;
    let run = number_after(valid, "RunTime=").ok_or_else(|| format!("sockperf: {valid}"))?;
    let got =
        number_after(valid, "ReceivedMessages=").ok_or_else(|| format!("sockperf: {valid}"))?;
    if run <= 0.0 {
        return Err(format!("sockperf: {valid}"));
    }
    let us = |p: &str| number_after(out, &format!("percentile {p} =")).map(|v| v / 1e3);
    Ok(Outcome {
        value: got / run,
        p50_ms: us("50.000"),
        p99_ms: us("99.000"),
        errors: number_after(out, "# dropped messages =").unwrap_or(0.0) as u64,
    })
}

fn parse_dnsperf(out: &str) -> Result<Outcome, String> {
    let qps = number_after(out, "Queries per second:").ok_or_else(|| format!("dnsperf: {out}"))?;
    Ok(Outcome {
        value: qps,
        errors: number_after(out, "Queries lost:").unwrap_or(0.0) as u64,
        ..Outcome::default()
    })
}

/// Runs one test from the client pod; `seconds` long.
fn run_test(
    t: &Test,
    client: &str,
    vip: &str,
    seconds: u64,
    dir: &Path,
) -> Result<Outcome, String> {
    let limit = Duration::from_secs(seconds + 30);
    match t.kind {
        Kind::Iperf { streams } => parse_iperf(&run_in(
            client,
            &format!("iperf3 -c {vip} -p {IPERF_PORT} -t {seconds} -P {streams} -J"),
            limit,
        )?),
        Kind::Wrk { close } => {
            let header = if close { " -H 'Connection: close'" } else { "" };
            parse_wrk(&run_in(
                client,
                &format!("wrk -t2 -c32 -d{seconds}s --latency{header} http://{vip}/"),
                limit,
            )?)
        }
        // The first 400 ms are sockperf's warm-up, not counted.
        Kind::Sockperf => parse_sockperf(&run_in(
            client,
            &format!(
                "sockperf ping-pong -i {vip} -p {SOCKPERF_PORT} -t {} --full-rtt",
                seconds + 1
            ),
            limit,
        )?),
        Kind::Dnsperf => {
            let queries = dir.join("queries.txt");
            parse_dnsperf(&run_in(
                client,
                &format!(
                    "dnsperf -s {vip} -p 53 -d {} -l {seconds} -q 64",
                    queries.display()
                ),
                limit,
            )?)
        }
    }
}

/// The servers of one pod, as their own processes with their own config files; killed on drop.
struct PodServers {
    children: Vec<(String, Child)>,
}

impl PodServers {
    fn start(ns: &str, dir: &Path) -> PodServers {
        std::fs::create_dir_all(dir).unwrap();
        let d = dir.display();
        let body = "x".repeat(100);
        let nginx = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000;\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
             server {{ listen {HTTP_PORT} backlog=4096; location / {{ default_type text/plain; return 200 \"{body}\"; }} }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), nginx).unwrap();
        let dnsmasq = format!(
            "port={DNS_PORT}\nno-resolv\nno-hosts\nkeep-in-foreground\nuser=root\n\
             pid-file={d}/dnsmasq.pid\naddress=/{DNS_NAME}/10.0.0.1\ncache-size=1000\n"
        );
        std::fs::write(dir.join("dnsmasq.conf"), dnsmasq).unwrap();
        let mut s = PodServers {
            children: Vec::new(),
        };
        let cmds: [(&str, Vec<String>); 4] = [
            (
                "nginx",
                vec![
                    "nginx".into(),
                    "-c".into(),
                    format!("{d}/nginx.conf"),
                    "-g".into(),
                    "daemon off;".into(),
                ],
            ),
            (
                "dnsmasq",
                vec!["dnsmasq".into(), format!("--conf-file={d}/dnsmasq.conf")],
            ),
            (
                "sockperf",
                vec![
                    "sockperf".into(),
                    "server".into(),
                    "-i".into(),
                    "0.0.0.0".into(),
                    "-p".into(),
                    SOCKPERF_PORT.to_string(),
                ],
            ),
            (
                "iperf3",
                vec![
                    "iperf3".into(),
                    "-s".into(),
                    "-p".into(),
                    IPERF_PORT.to_string(),
                ],
            ),
        ];
        for (name, argv) in cmds {
            let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
            let child = Command::new("ip")
                .args(["netns", "exec", ns])
                .args(&argv)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("{name} in {ns}: {e}"));
            s.children.push((name.to_string(), child));
        }
        // Listening (bounded): TCP for nginx and iperf3, UDP for dnsmasq and sockperf.
        for (proto, port) in [
            ("t", HTTP_PORT),
            ("t", IPERF_PORT),
            ("u", DNS_PORT),
            ("u", SOCKPERF_PORT),
        ] {
            let up = lab::wait_until(Duration::from_secs(10), || {
                !lab::sh(ns, &format!("ss -Hl{proto}n sport = :{port}"))
                    .trim()
                    .is_empty()
            });
            if !up {
                // The logs go with the lab's temporary directory: show them now.
                let logs: String = ["nginx", "nginx-error", "dnsmasq", "sockperf", "iperf3"]
                    .iter()
                    .map(|n| {
                        let log = std::fs::read_to_string(dir.join(format!("{n}.log")));
                        format!("--- {n}.log\n{}\n", log.unwrap_or_default())
                    })
                    .collect();
                panic!("a server in {ns} does not listen on {port} after 10 s:\n{logs}");
            }
        }
        s
    }
}

impl Drop for PodServers {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        for (_, c) in &mut self.children {
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The Services as Kubernetes objects (kxdp's `--state`): `remote` selects the server pod on
/// node B, `local` the one on node A; IPv4.
fn service_objects(lab: &Lab) -> String {
    let mut s = String::new();
    for (name, vip, pod) in [
        ("remote", REMOTE_VIP, "server-b"),
        ("local", LOCAL_VIP, "server-a"),
    ] {
        let p = lab.pod(pod);
        let node = lab.nodes[p.node].name;
        let _ = write!(
            s,
            "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: lab}}
spec:
  type: ClusterIP
  ipFamilies: [IPv4]
  clusterIP: {vip}
  clusterIPs: [{vip}]
  selector: {{app: {name}}}
  ports:
  - {{name: iperf, port: {IPERF_PORT}, targetPort: {IPERF_PORT}, protocol: TCP}}
  - {{name: http, port: 80, targetPort: {HTTP_PORT}, protocol: TCP}}
  - {{name: sockperf, port: {SOCKPERF_PORT}, targetPort: {SOCKPERF_PORT}, protocol: UDP}}
  - {{name: dns, port: 53, targetPort: {DNS_PORT}, protocol: UDP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-ipv4
  namespace: lab
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
ports:
- {{name: iperf, port: {IPERF_PORT}, protocol: TCP}}
- {{name: http, port: {HTTP_PORT}, protocol: TCP}}
- {{name: sockperf, port: {SOCKPERF_PORT}, protocol: UDP}}
- {{name: dns, port: {DNS_PORT}, protocol: UDP}}
endpoints:
- {{addresses: [\"{}\"], conditions: {{ready: true}}, nodeName: {node}}}
---
",
            p.ip4
        );
    }
    s
}

/// The same Services as kube-proxy's rules see them.
fn kube_proxy_services(lab: &Lab) -> Vec<kube_proxy::Service> {
    let mut out = Vec::new();
    for (tag, vip, pod) in [("R", REMOTE_VIP, "server-b"), ("L", LOCAL_VIP, "server-a")] {
        let ep = lab.pod(pod).ip4.to_string();
        for (what, proto, port, target) in [
            ("IPERF", "tcp", IPERF_PORT, IPERF_PORT),
            ("HTTP", "tcp", 80, HTTP_PORT),
            ("SOCK", "udp", SOCKPERF_PORT, SOCKPERF_PORT),
            ("DNS", "udp", 53, DNS_PORT),
        ] {
            out.push(kube_proxy::Service::new(
                &format!("{tag}-{what}"),
                vip,
                proto,
                port,
                &[(&ep, target)],
            ));
        }
    }
    out
}

/// What a mode leaves running or changed; undone on drop.
enum ModeGuard<'a> {
    Kxdp(Vec<KxdpNode>),
    /// Each node's `nat` table as it was (`iptables-save`), restored whole.
    Iptables(Vec<(&'a str, String)>),
    Nftables(Vec<&'a str>),
}

impl Drop for ModeGuard<'_> {
    fn drop(&mut self) {
        match self {
            ModeGuard::Kxdp(nodes) => {
                for mut k in nodes.drain(..) {
                    k.kxdp.stop();
                }
            }
            ModeGuard::Iptables(saved) => {
                for (ns, table) in saved.iter() {
                    pipe_into(ns, "iptables-restore", table);
                }
            }
            ModeGuard::Nftables(nodes) => {
                for ns in nodes.iter() {
                    let _ = lab::sh(ns, "nft delete table ip kube-proxy 2>/dev/null || true");
                }
            }
        }
    }
}

/// The lab of one mode's measurements: the two nodes, the client pod on node A, the servers on
/// both nodes, the Services' objects. Each mode gets fresh nodes because a node keeps traces of
/// the dataplane that ran before: a policy-routing rule (`ip rule`, as an earlier kxdp's host
/// path added) turns on the kernel's rule-based route lookup and full reverse-path check for
/// every packet the namespace forwards, and the kernel never turns them off again (a
/// per-namespace flag that deleting the rules leaves set), so kube-proxy's rules measured after
/// such a kxdp paid for its rules; and the kernel's conntrack entries and the client's
/// TIME_WAIT sockets of one mode clashed with the next mode's connections.
struct FreshNodes {
    // Dropped in this order: the servers before the lab whose pods they run in.
    _servers_b: PodServers,
    _servers_a: PodServers,
    objects: String,
    client: String,
    dir: PathBuf,
    lab: Lab,
}

impl FreshNodes {
    fn build() -> FreshNodes {
        let mut lab = Lab::build("lab_workload");
        lab.add_pod("node-a", "client", &[("app", "client")]);
        lab.add_pod("node-b", "server-b", &[("app", "remote")]);
        lab.add_pod("node-a", "server-a", &[("app", "local")]);
        let dir = lab.dir.path().to_path_buf();
        std::fs::write(dir.join("queries.txt"), format!("{DNS_NAME} A\n")).unwrap();
        let servers_b = PodServers::start(&lab.pod("server-b").ns, &dir.join("server-b"));
        let servers_a = PodServers::start(&lab.pod("server-a").ns, &dir.join("server-a"));
        lab.warm_neighbours();
        let objects = service_objects(&lab);
        let client = lab.pod("client").ns.clone();
        // Every port for the client's connections: `wrk close` opens up to ~13k connections a
        // second, which would wrap the default 28k-port range within one 5 s test. And ports
        // in TIME_WAIT reused, as load generators are set up: wrk closes first in part of its
        // connections, and with back-to-back tests the client's TIME_WAIT sockets (60 s) took
        // every even port (`connect` prefers them), until connect spent both CPUs searching
        // for a free one and every mode collapsed to a few hundred connections a second.
        lab::sh(
            &client,
            "sysctl -qw net.ipv4.ip_local_port_range='1024 65535' net.ipv4.tcp_tw_reuse=1",
        );
        FreshNodes {
            _servers_b: servers_b,
            _servers_a: servers_a,
            objects,
            client,
            dir,
            lab,
        }
    }
}

/// The modes `KXDP_WORKLOAD_MODES` may name: kxdp's (each also with `-pinned`, and with `@base`
/// after that; `kxdp-base` is `kxdp@base`) and the kernel's.
const KXDP_MODES: [&str; 5] = [
    "kxdp",
    "kxdp-tap",
    "kxdp-tap-pods",
    "kxdp-tap-no-offload",
    "kxdp-tap-uplink",
];
const KERNEL_MODES: [&str; 3] = ["iptables", "iptables-ip-rule", "nftables"];

/// Whether `mode` is one the benchmark knows (see [`KXDP_MODES`]).
fn known_mode(mode: &str) -> bool {
    if KERNEL_MODES.contains(&mode) || mode == "kxdp-base" {
        return true;
    }
    let m = mode.strip_suffix("@base").unwrap_or(mode);
    KXDP_MODES.contains(&m.strip_suffix("-pinned").unwrap_or(m))
}

fn modes_help() -> String {
    format!(
        "{}, kxdp-base, {}; a kxdp mode with `-pinned`: each node's worker on a CPU of its own; then `@base`: the build at KXDP_BASE_BIN",
        KXDP_MODES.join(", "),
        KERNEL_MODES.join(", ")
    )
}

fn set_up<'a>(lab: &'a Lab, mode: &str, objects: &str) -> ModeGuard<'a> {
    // `kxdp-base` is `kxdp@base`: a kxdp mode run with the build at KXDP_BASE_BIN.
    let (mode, base) = match mode.strip_suffix("@base") {
        Some(m) => (m, true),
        None if mode == "kxdp-base" => ("kxdp", true),
        None => (mode, false),
    };
    let (mode, pinned) = match mode.strip_suffix("-pinned") {
        Some(m) if m.starts_with("kxdp") => (m, true),
        _ => (mode, false),
    };
    let nodes: Vec<&str> = lab.nodes.iter().map(|n| n.ns.as_str()).collect();
    match mode {
        "kxdp" | "kxdp-tap" | "kxdp-tap-no-offload" | "kxdp-tap-uplink" | "kxdp-tap-pods" => {
            ModeGuard::Kxdp(
                ["node-a", "node-b"]
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        let mut config = lab.kxdp_config(n, false);
                        // The pods' veths through kxdp's tap (docs/afxdp.md), with and without the
                        // in-kernel fast path for established flows.
                        if mode == "kxdp" {
                            // XDP on the pods' veths too.
                            config += "podInterception: {mode: xdp}\n";
                        } else if mode == "kxdp-tap" {
                            config += "podInterception: {mode: tap}\n";
                        } else if mode == "kxdp-tap-uplink" {
                            // No XDP anywhere: the nodes exchange super-frames as the kernel
                            // modes do (docs/afxdp.md § The uplink through the tap).
                            config +=
                                "podInterception: {mode: tap, interfaces: [\"veth*\", eth0]}\n";
                        } else if mode == "kxdp-tap-pods" {
                            // The pods through the tap, the uplink on XDP as a NIC keeps it (the
                            // lab's uplink is a veth, which the default intercepts too).
                            config += "podInterception: {mode: tap, everyVeth: false}\n";
                        } else if mode == "kxdp-tap-no-offload" {
                            config += "podInterception: {mode: tap, offload: false}\n";
                        }
                        if pinned {
                            // Each node's worker on a CPU of its own (node A's on CPU 0, node B's
                            // on CPU 1), beside the pods as on a node without isolated cores.
                            config = config.replace(
                                "workers: {count: 1, cpus: []}",
                                &format!("workers: {{count: 1, cpus: [{i}]}}"),
                            );
                            assert!(
                                config.contains(&format!("cpus: [{i}]")),
                                "the lab's workers line moved"
                            );
                        }
                        if base {
                            // Another build in the same run (a same-run comparison of two builds).
                            let bin = std::env::var("KXDP_BASE_BIN").expect(
                            "a mode with @base (or kxdp-base): KXDP_BASE_BIN names the other build",
                        );
                            return lab.start_kxdp_bin(n, &config, objects, &bin);
                        }
                        lab.start_kxdp(n, &config, objects)
                    })
                    .collect(),
            )
        }
        "iptables" | "iptables-ip-rule" => {
            let rules = kube_proxy::iptables(&kube_proxy_services(lab), CLUSTER4);
            let mut saved = Vec::new();
            for ns in nodes {
                if mode == "iptables-ip-rule" {
                    // One policy-routing rule that matches nothing (as a node with an overlay,
                    // a CNI's policy routing or an earlier kxdp has): what the kernel's
                    // rule-based lookup costs kube-proxy's forwarding.
                    lab::ip(ns, "rule add pref 1 iif kxdp-none lookup 27513");
                }
                saved.push((ns, lab::sh(ns, "iptables-save -t nat")));
                pipe_into(ns, "iptables-restore --noflush", &rules);
            }
            ModeGuard::Iptables(saved)
        }
        "nftables" => {
            let rules = kube_proxy::nftables(&kube_proxy_services(lab), CLUSTER4);
            for ns in &nodes {
                pipe_into(ns, "nft -f -", &rules);
            }
            ModeGuard::Nftables(nodes)
        }
        other => panic!(
            "KXDP_WORKLOAD_MODES: unknown mode {other:?} ({})",
            modes_help()
        ),
    }
}

/// One measurement, as written to results.jsonl.
struct Record {
    round: u64,
    mode: String,
    test: Test,
    seconds: u64,
    outcome: Result<Outcome, String>,
    /// CPUs busy on average over the test (the whole machine).
    cpus: f64,
}

impl Record {
    /// CPU per unit of work: ms per Gbit for Gbit/s, else µs per request/connection/...
    fn cpu_per_unit(&self) -> Option<f64> {
        let o = self.outcome.as_ref().ok()?;
        if o.value <= 0.0 {
            return None;
        }
        let scale = if self.test.unit == "Gbit/s" { 1e3 } else { 1e6 };
        Some(self.cpus * scale / o.value)
    }

    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "round": self.round,
            "mode": self.mode,
            "case": self.test.case,
            "test": self.test.name,
            "unit": self.test.unit,
            "seconds": self.seconds,
            "cpus_busy": round3(self.cpus),
            "cpu_unit": self.test.cpu_unit,
        });
        match &self.outcome {
            Ok(o) => {
                v["value"] = round3(o.value).into();
                v["errors"] = o.errors.into();
                if let Some(p) = o.p50_ms {
                    v["p50_ms"] = round3(p).into();
                }
                if let Some(p) = o.p99_ms {
                    v["p99_ms"] = round3(p).into();
                }
                if let Some(c) = self.cpu_per_unit() {
                    v["cpu_per_unit"] = round3(c).into();
                }
            }
            Err(e) => v["error"] = e.clone().into(),
        }
        v
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// A figure with three significant digits, thousands separated.
fn fmt(x: f64) -> String {
    if x >= 1000.0 {
        let s = format!("{x:.0}");
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// The Markdown summary: medians per mode, ratios to each kernel mode, then the same relative
/// to iptables (the charts' table).
fn summary(records: &[Record], modes: &[String], rounds: u64, seconds: u64) -> String {
    type Key = (&'static str, &'static str, String);
    let mut by: BTreeMap<Key, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by.entry((r.test.case, r.test.name, r.mode.clone()))
            .or_default()
            .push(r);
    }
    let med = |t: &Test, mode: &str, f: &dyn Fn(&Record) -> Option<f64>| {
        by.get(&(t.case, t.name, mode.to_string()))
            .and_then(|rs| median(rs.iter().filter_map(|r| f(r)).collect()))
    };
    type Get<'a> = &'a dyn Fn(&Record) -> Option<f64>;
    let value: Get = &|r| r.outcome.as_ref().ok().map(|o| o.value);
    let p50: Get = &|r| r.outcome.as_ref().ok().and_then(|o| o.p50_ms);
    let p99: Get = &|r| r.outcome.as_ref().ok().and_then(|o| o.p99_ms);
    let cpu: Get = &|r| r.cpu_per_unit();
    let errors: Get = &|r| r.outcome.as_ref().ok().map(|o| o.errors as f64);

    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut s = format!(
        "# Workloads\n\n{rounds} round(s), {seconds} s per test, modes alternated within each round ({}; \
         each round starting one mode later); medians. CPU: {cpu_model}, {cpus} CPUs; load average at the end: {}.\n\n",
        modes.join(", "),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let kernel: Vec<&String> = modes.iter().filter(|m| !m.starts_with("kxdp")).collect();
    let has_kxdp = modes.iter().any(|m| m == "kxdp");
    s += "| case | test | unit |";
    for m in modes {
        let _ = write!(s, " {m} |");
    }
    if has_kxdp {
        for k in &kernel {
            let _ = write!(s, " kxdp / {k} |");
        }
    }
    s += "\n| --- | --- | --- |";
    for _ in 0..modes.len() + if has_kxdp { kernel.len() } else { 0 } {
        s += " --- |";
    }
    s += "\n";
    type Metric<'a> = (&'a str, &'a str, Get<'a>);
    for t in TESTS {
        let metrics: Vec<Metric> = match t.kind {
            Kind::Wrk { close: false } | Kind::Sockperf => vec![
                ("", t.unit, value),
                (" p50", "ms", p50),
                (" p99", "ms", p99),
                (" CPU", t.cpu_unit, cpu),
                (" errors", "count", errors),
            ],
            _ => vec![
                ("", t.unit, value),
                (" CPU", t.cpu_unit, cpu),
                (" errors", "count", errors),
            ],
        };
        for (what, unit, f) in metrics {
            let meds: Vec<Option<f64>> = modes.iter().map(|m| med(t, m, f)).collect();
            let _ = write!(s, "| {} | {}{what} | {unit} |", t.case, t.name);
            for m in &meds {
                let cell = match m {
                    Some(e) if what == " errors" => format!("{e:.0}"),
                    Some(v) => fmt(*v),
                    None => "-".into(),
                };
                let _ = write!(s, " {cell} |");
            }
            if has_kxdp {
                let k = med(t, "kxdp", f);
                for km in &kernel {
                    let ratio = match (k, med(t, km, f)) {
                        (_, _) if what == " errors" => "".to_string(),
                        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                        _ => "-".into(),
                    };
                    let _ = write!(s, " {ratio} |");
                }
            }
            s += "\n";
        }
    }
    if modes.iter().any(|m| m == "iptables") {
        s += "\n## Relative to iptables\n\nEach mode's median divided by the iptables median of the same test \
              (throughput: higher is better; CPU per unit of work: lower is better).\n\n\
              | mode | test | throughput / iptables | CPU per unit / iptables |\n| --- | --- | --- | --- |\n";
        for t in TESTS {
            for m in modes {
                let rel = |f: Get| match (med(t, m, f), med(t, "iptables", f)) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
                    _ => "-".into(),
                };
                let _ = writeln!(
                    s,
                    "| {m} | {} {} | {} | {} |",
                    t.case,
                    t.name,
                    rel(value),
                    rel(cpu)
                );
            }
        }
    }
    s
}

fn out_dir() -> PathBuf {
    std::env::var_os("KXDP_WORKLOAD_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/workload"))
}

/// Whether `KXDP_WORKLOAD_TESTS` (comma-separated `case test`, e.g. `remote wrk close`) asks
/// for `t`; all tests without it.
fn wanted(t: &Test) -> bool {
    std::env::var("KXDP_WORKLOAD_TESTS").map_or(true, |list| {
        list.split(',')
            .any(|w| w.trim() == format!("{} {}", t.case, t.name))
    })
}

#[test]
#[ignore = "benchmark: run by benches/workload.sh (root, Debian's iperf3, wrk, nginx-light, sockperf, dnsperf, dnsmasq)"]
fn workload() {
    let quick = std::env::var("KXDP_WORKLOAD_QUICK").as_deref() == Ok("1");
    let rounds = env_u64("KXDP_WORKLOAD_ROUNDS", if quick { 1 } else { 3 });
    let seconds = env_u64("KXDP_WORKLOAD_SECONDS", if quick { 1 } else { 5 });
    assert!(
        rounds >= 1 && seconds >= 1,
        "KXDP_WORKLOAD_ROUNDS and KXDP_WORKLOAD_SECONDS must be at least 1"
    );
    let modes: Vec<String> = std::env::var("KXDP_WORKLOAD_MODES")
        .unwrap_or_else(|_| "kxdp-tap iptables nftables".into())
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for m in &modes {
        assert!(
            known_mode(m),
            "KXDP_WORKLOAD_MODES: unknown mode {m:?} ({})",
            modes_help()
        );
    }
    for tool in [
        "iperf3",
        "wrk",
        "nginx",
        "sockperf",
        "dnsperf",
        "dnsmasq",
        "nft",
        "conntrack",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} missing: benches/workload.sh installs it (apt-get install iperf3 wrk nginx-light sockperf dnsperf dnsmasq-base nftables conntrack)"
        );
    }
    let out = out_dir();
    std::fs::create_dir_all(&out).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let mut jsonl = std::fs::File::create(out.join("results.jsonl"))
        .unwrap_or_else(|e| panic!("{}/results.jsonl: {e}", out.display()));

    let mut records = Vec::new();
    for round in 1..=rounds {
        // Each round starts one mode later, so that no mode always follows the same one.
        let first = (round - 1) as usize % modes.len();
        for mode in modes.iter().cycle().skip(first).take(modes.len()) {
            // Every mode on nodes of its own, as a node that never ran another dataplane.
            let nodes = FreshNodes::build();
            let (lab, client, dir) = (&nodes.lab, &nodes.client, &nodes.dir);
            let guard = set_up(lab, mode, &nodes.objects);
            // Neighbours resolved through this mode's path before anything is measured.
            lab.warm_neighbours();
            for t in TESTS.iter().filter(|t| wanted(t)) {
                let vip = if t.case == "remote" {
                    REMOTE_VIP
                } else {
                    LOCAL_VIP
                };
                settle();
                let before = cpu_jiffies();
                let outcome = run_test(t, client, vip, seconds, dir);
                // Busy share of all jiffies times the CPUs: CPUs busy on average.
                let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
                let cpus = busy_share(before, cpu_jiffies()) * ncpu;
                let r = Record {
                    round,
                    mode: mode.clone(),
                    test: *t,
                    seconds,
                    outcome,
                    cpus,
                };
                let line = r.json();
                eprintln!("{line}");
                writeln!(jsonl, "{line}").unwrap();
                records.push(r);
            }
            drop(guard);
        }
    }
    let md = summary(&records, &modes, rounds, seconds);
    std::fs::write(out.join("summary.md"), &md).unwrap();
    eprintln!(
        "\n{md}\nresults: {}/results.jsonl, summary.md",
        out.display()
    );
    let failed: Vec<String> = records
        .iter()
        .filter_map(|r| match &r.outcome {
            Err(e) => Some(format!("{} {} {}: {e}", r.mode, r.test.case, r.test.name)),
            Ok(o) if o.value <= 0.0 => Some(format!(
                "{} {} {}: no throughput",
                r.mode, r.test.case, r.test.name
            )),
            Ok(_) => None,
        })
        .collect();
    assert!(
        failed.is_empty(),
        "measurements without a result:\n{}",
        failed.join("\n")
    );
}
