//! The lab benchmark (run by `benches/lab.sh`; ignored in the normal test run): 64-byte UDP
//! from the client pod through the ClusterIP 172.30.0.10:53 to the two web pods, forwarded by
//! one of (`KXDP_BENCH_MODE`)
//!
//! - `kxdp`: `kxdp run` on the node's interfaces, the full pipeline (one worker pinned to CPU 1),
//! - `kxdp-floor`: the same daemon with `KXDP_BENCH_IO_FLOOR=vpod1,vpod2`: every received
//!   frame goes out unchanged to web-1 or web-2 (batches in turn), without pipeline or egress
//!   stage (the AF_XDP I/O floor),
//! - `kxdp-deep`: `kxdp` with deeper AF_XDP rings and a larger UMEM (config `afxdp`, from
//!   `KXDP_BENCH_AFXDP`, default `{frames: 65536, rxRingSize: 8192, fillRingSize: 8192}`),
//! - `kxdp-ref`: `kxdp` with a reference binary (`benches/lab.sh` puts `KXDP_BENCH_REF` in place
//!   of target/release/kxdp for this mode only: the same run compares two builds),
//! - `routing`: the node's kernel routing, no NAT rules (the client sends to web-1 directly),
//! - `iptables`: the node's kernel with kube-proxy's iptables NAT rules (iptables-restore),
//! - `nftables`: the node's kernel with kube-proxy's nftables layout (nft -f),
//!
//! each with `KXDP_BENCH_SERVICES` other Services in its tables. The load generator is
//! `kxdp pcap send` (AF_XDP TX, pinned to CPU 0) on the client pod's eth0, `KXDP_BENCH_FLOWS`
//! UDP flows; the sinks are `kxdp pcap sink` (AF_XDP RX) on the web pods' eth0. For each rate of
//! `KXDP_BENCH_RATES` (packets/s, or `max`), `KXDP_BENCH_SECONDS` long, one JSON line: offered
//! and delivered pps, loss, the whole machine's busy CPU time per delivered packet (from
//! /proc/stat; generator and sinks included, the same for every mode) and latency percentiles
//! from the generator's timestamps. Then one more point at half the highest delivered rate:
//! the latency at half load (`"half_load": true`).
//!
//! `KXDP_BENCH_PEER_THREADED=1`: the web pods' `eth0` (the veth end that receives what the
//! forwarder sends) polled by a NAPI thread (`/sys/class/net/eth0/threaded`) instead of in the
//! softirq of the CPU that sent, in every mode alike (the threads unpinned).

mod lab;

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use lab::kube_proxy::{self, pipe_into};
use lab::{ip, kxdp_in, lab_files, last_json, Cluster, Kxdp, Lab};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Busy and total jiffies of the whole machine.
fn cpu_jiffies() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = f.iter().take(8).sum();
    let idle = f[3] + f[4];
    (total - idle, total)
}

/// `n` filler Services (ClusterIP 172.30.{1..}.x:80/TCP, two endpoints on another node).
fn filler_state(n: u64) -> String {
    let mut y = String::new();
    for i in 0..n {
        let (a, b) = (1 + i / 250, 1 + i % 250);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: filler-{i}, namespace: lab}}\n\
             spec: {{type: ClusterIP, clusterIP: 172.30.{a}.{b}, clusterIPs: [172.30.{a}.{b}], \
             ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: filler-{i}, \
             namespace: lab, labels: {{kubernetes.io/service-name: filler-{i}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
             endpoints: [{{addresses: [10.2.{a}.{b}], conditions: {{ready: true}}, nodeName: node-b}}, \
             {{addresses: [10.3.{a}.{b}], conditions: {{ready: true}}, nodeName: node-b}}]\n"
        );
    }
    y
}

/// The filler Services and the measured one (`172.30.0.10:53/UDP` to the two web pods, last
/// of the list: as a Service among many would be on average half-way), as kube-proxy's rules.
fn kube_proxy_services(n: u64) -> Vec<kube_proxy::Service> {
    let mut s = kube_proxy::filler(n);
    s.push(kube_proxy::Service::new(
        "WEB",
        "172.30.0.10",
        "udp",
        53,
        &[("10.1.0.11", 5353), ("10.1.0.12", 5353)],
    ));
    s
}

fn iptables_rules(n: u64) -> String {
    kube_proxy::iptables(&kube_proxy_services(n), "10.0.0.0/8")
}

fn nft_rules(n: u64) -> String {
    kube_proxy::nftables(&kube_proxy_services(n), "10.0.0.0/8")
}

/// `kxdp pcap sink` on eth0 of `ns`, returned once attached.
fn start_sink(ns: &str, seconds: f64, cpu: Option<&str>) -> std::process::Child {
    let d = format!("{}", seconds + 10.0);
    let mut args = vec![
        "pcap",
        "sink",
        "--iface",
        "eth0",
        "--duration",
        &d,
        "--idle-exit",
        "300",
    ];
    if let Some(cpu) = cpu {
        args.extend(["--cpu", cpu]);
    }
    let mut sink = kxdp_in(ns, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kxdp pcap sink");
    let err = sink.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if l.contains("sink ready") {
                let _ = tx.send(());
            } else {
                eprintln!("sink: {l}");
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        let _ = sink.kill();
        panic!("the sink in {ns} did not start");
    }
    sink
}

/// What one rate point measured.
struct Point {
    offered_pps: f64,
    delivered_pps: f64,
    sent: u64,
    received: u64,
    busy_ns_per_packet: f64,
    p50_ns: u64,
    p99_ns: u64,
    /// Frames the sinks' sockets dropped (their rings were full: the sink was too slow).
    sink_dropped: u64,
    /// Where frames were lost, by counter (each that moved during the point): the sender veth's
    /// `tx_dropped`, the node-side veths' `ethtool -S` drops (`vpod3 rx drops`: frames the
    /// forwarder's XDP program could not hand to its AF_XDP socket) and `tx_dropped`, the web
    /// pods' `eth0` drops (the sinks' XDP redirects that failed).
    lost: std::collections::BTreeMap<String, u64>,
    /// kxdp's worker thread during the point: (ms on a CPU, ms runnable but waiting for one).
    worker_ms: Option<(f64, f64)>,
}

/// The lab's loss counters at one moment (see `Point::lost`).
fn loss_counters(c: &Cluster) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let tx_dropped = |ns: &str, dev: &str| {
        lab::sh(
            ns,
            &format!("cat /sys/class/net/{dev}/statistics/tx_dropped 2>/dev/null || echo 0"),
        )
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
    };
    for dev in ["vpod1", "vpod2", "vpod3"] {
        for (k, v) in veth_drop_counters(&c.node, dev) {
            out.insert(format!("node {dev} {k}"), v);
        }
        out.insert(format!("node {dev} tx_dropped"), tx_dropped(&c.node, dev));
    }
    for p in ["web-1", "web-2"] {
        for (k, v) in veth_drop_counters(c.pod(p), "eth0") {
            out.insert(format!("{p} eth0 {k}"), v);
        }
    }
    out.extend(xsk_counters(&c.node));
    // One value for the whole machine; the lab is all there is on it while a point runs.
    out.insert("machine softnet backlog dropped".into(), softnet_dropped());
    out
}

/// A running kxdp's AF_XDP sockets' kernel drop counters, from its `/metrics` in the node
/// namespace (`kxdp IF xsk rx_ring_full`, `... rx_dropped`); none when no kxdp runs.
fn xsk_counters(node: &str) -> Vec<(String, u64)> {
    use std::io::{Read, Write};
    let text = Lab::in_ns(node, || {
        let mut s = std::net::TcpStream::connect_timeout(
            &"127.0.0.1:10249".parse().unwrap(),
            Duration::from_millis(500),
        )
        .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    })
    .unwrap_or_default();
    let mut out = Vec::new();
    for l in text.lines() {
        // What kxdp forwarded (placed on a TX ring): delivered less than that was lost after it.
        if l.starts_with("kxdp_packets_total{") && l.contains("action=\"forward\"") {
            if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()) {
                let n = out
                    .iter()
                    .position(|(k, _): &(String, u64)| k == "kxdp forwarded");
                match n {
                    Some(i) => out[i].1 += v,
                    None => out.push(("kxdp forwarded".to_string(), v)),
                }
            }
        }
        // Frames kxdp itself dropped (each with its reason: tx-ring-full, no-route, ...).
        if let Some(rest) = l.strip_prefix("kxdp_drops_total{reason=\"") {
            let reason = rest.split('"').next().unwrap_or("?");
            if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()) {
                out.push((format!("kxdp drop {reason}"), v));
            }
        }
        for what in ["rx_ring_full", "rx_dropped"] {
            let Some(rest) = l.strip_prefix(&format!("kxdp_xsk_{what}_total{{")) else {
                continue;
            };
            let iface = rest
                .split("interface=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?");
            if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()) {
                out.push((format!("kxdp {iface} xsk {what}"), v));
            }
        }
    }
    out
}

/// The scheduler's account of kxdp's worker thread (`kxdp-worker-0` of process `pid`):
/// nanoseconds on a CPU and waiting runnable for one (`/proc/PID/task/TID/schedstat`).
/// With `KXDP_BENCH_WORKER_RT=1`, kxdp's worker thread gets `SCHED_FIFO`: on this shared
/// 2-vCPU machine that models the CPU a node dedicates to it, as the kernel's forwarding, which
/// runs in softirq, is never made to wait behind other processes either. Off by default.
fn worker_realtime(pid: u32) {
    if std::env::var("KXDP_BENCH_WORKER_RT").as_deref() != Ok("1") {
        return;
    }
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim().starts_with("kxdp-worker-") {
            let tid = t.file_name().to_string_lossy().into_owned();
            lab::run("chrt", &["-f", "-p", "10", &tid]);
        }
    }
}

fn worker_sched(pid: u32) -> Option<(u64, u64)> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "kxdp-worker-0" {
            let st = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            let mut f = st.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
            return Some((f.next()?, f.next()?));
        }
    }
    None
}

/// Where the sinks run: `KXDP_BENCH_SINK_CPU` (a CPU, or `none`: unpinned), else the CPU the
/// forwarder leaves free — CPU 0, beside the generator: kxdp's worker has CPU 1, and the
/// kernel's paths forward there too (`kernel_rps`; with it off they forward in the generator's
/// own softirq on CPU 0, and the sinks go to CPU 1).
fn sink_cpu(kxdp: bool) -> Option<String> {
    match std::env::var("KXDP_BENCH_SINK_CPU") {
        Ok(v) if v == "none" => None,
        Ok(v) => Some(v),
        // The kernel's paths forward on CPU 1 too unless their RPS steering is off, which
        // leaves their forwarding in the generator's sendto() on CPU 0.
        Err(_) => Some(if kxdp || kernel_rps() { "0" } else { "1" }.into()),
    }
}

/// The web pods' `eth0` polled by a NAPI thread (see the module docs): what the forwarder
/// sends to them is then received in batches of up to 64 frames by that thread, not one frame
/// per poll inside a copy-mode AF_XDP `sendto()` (kxdp) or in CPU 1's softirq (the kernel).
/// Set once the sinks are attached: a veth has a NAPI instance only while an XDP program (the
/// sink's) or GRO is on, and the kernel refuses the flag without one (`EIO`). The thread is
/// left where the scheduler puts it, in every mode alike.
fn peer_napi_threaded(c: &Cluster) {
    for pod in ["web-1", "web-2"] {
        lab::sh(c.pod(pod), "echo 1 > /sys/class/net/eth0/threaded");
    }
}

/// Whether the kernel's paths forward on CPU 1, the CPU kxdp's worker gets (default), rather
/// than inside the generator's own `sendto()` on CPU 0. veth hands a frame to the receiving side
/// with `netif_rx`, which RPS steers: with `rps_cpus` of the node's client-side veth set to
/// CPU 1, routing and the iptables/nftables DNAT run there, in that CPU's backlog, and when they
/// cannot keep up the backlog drops (counted: `machine softnet backlog dropped`) instead of the
/// generator slowing down. So every forwarder has the same CPUs: generator and sinks on CPU 0,
/// the forwarding on CPU 1. `KXDP_BENCH_KERNEL_RPS=off`: the old layout.
fn kernel_rps() -> bool {
    std::env::var("KXDP_BENCH_KERNEL_RPS").as_deref() != Ok("off")
}

/// Sends at `rate` (0: max) for `seconds` from the client pod; the sinks in the web pods count.
/// `worker`: kxdp's process, whose worker thread's CPU time and run-queue wait are recorded.
fn measure(
    c: &Cluster,
    dst: &str,
    mac: &str,
    rate: u64,
    seconds: f64,
    flows: u64,
    worker: Option<u32>,
) -> Point {
    let cpu = sink_cpu(worker.is_some());
    let sinks: Vec<_> = ["web-1", "web-2"]
        .iter()
        .map(|p| start_sink(c.pod(p), seconds, cpu.as_deref()))
        .collect();
    if std::env::var("KXDP_BENCH_PEER_THREADED").as_deref() == Ok("1") {
        peer_napi_threaded(c);
    }
    let rate_s = if rate == 0 {
        "max".to_string()
    } else {
        rate.to_string()
    };
    let (secs, flows) = (seconds.to_string(), flows.to_string());
    let lost0 = loss_counters(c);
    let sched0 = worker.and_then(worker_sched);
    let (busy0, _) = cpu_jiffies();
    let out = kxdp_in(
        c.pod("client-1"),
        &[
            "pcap",
            "send",
            "--iface",
            "eth0",
            "--rate",
            &rate_s,
            "--duration",
            &secs,
            "--dst-mac",
            mac,
            "--src",
            "10.1.0.13",
            "--dst",
            dst,
            "--flows",
            &flows,
            "--cpu",
            "0",
        ],
    )
    .output()
    .expect("kxdp pcap send");
    let (busy1, _) = cpu_jiffies();
    assert!(
        out.status.success(),
        "pcap send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = last_json(&out.stdout);
    let (mut received, mut p50, mut p99, mut stamped) = (0u64, 0u64, 0u64, 0u64);
    let mut sink_dropped = 0;
    for sink in sinks {
        let o = sink.wait_with_output().unwrap();
        let r = last_json(&o.stdout);
        let n = r["received"].as_u64().unwrap_or(0);
        let t = r["timestamped"].as_u64().unwrap_or(0);
        // Percentiles of the two sinks weighted by their samples (they see the same mix).
        if t > 0 {
            p50 = (p50 * stamped + r["latency_ns"]["p50"].as_u64().unwrap() * t) / (stamped + t);
            p99 = p99.max(r["latency_ns"]["p99"].as_u64().unwrap());
            stamped += t;
        }
        received += n;
        sink_dropped += r["kernel_rx_dropped"].as_u64().unwrap_or(0);
    }
    // kxdp's workers read their sockets' kernel counters about once a second.
    if lost0.keys().any(|k| k.contains(" xsk ")) {
        std::thread::sleep(Duration::from_millis(1200));
    }
    let mut lost = moved(
        |k: &String| lost0.get(k).copied().unwrap_or(0),
        loss_counters(c),
    );
    // The worker's time on CPU 1 and waiting for it, from the generator's start to the
    // counters' reading (what explains a ring that overflowed).
    let worker_ms = match (sched0, worker.and_then(worker_sched)) {
        (Some((r0, w0)), Some((r1, w1))) => Some((
            r1.saturating_sub(r0) as f64 / 1e6,
            w1.saturating_sub(w0) as f64 / 1e6,
        )),
        _ => None,
    };
    let tx_dropped = s["iface_tx_dropped"].as_u64().unwrap_or(0);
    if tx_dropped > 0 {
        lost.insert("client-1 eth0 tx_dropped".into(), tx_dropped);
    }
    let sent = s["sent"].as_u64().unwrap();
    let seconds = s["seconds"].as_f64().unwrap();
    let busy_s = (busy1 - busy0) as f64 / 100.0; // USER_HZ
    Point {
        offered_pps: sent as f64 / seconds,
        delivered_pps: received as f64 / seconds,
        sent,
        received,
        busy_ns_per_packet: if received > 0 {
            busy_s * 1e9 / received as f64
        } else {
            0.0
        },
        p50_ns: p50,
        p99_ns: p99,
        sink_dropped,
        lost,
        worker_ms,
    }
}

/// Sets the forwarder `mode` up in the cluster's node; returns the daemon (kxdp modes) and
/// the destination the client sends to.
fn setup(c: &Cluster, mode: &str, services: u64, dir: &std::path::Path) -> (Option<Kxdp>, String) {
    let vip = "172.30.0.10:53".to_string();
    match mode {
        "kxdp" | "kxdp-floor" | "kxdp-deep" | "kxdp-ref" => {
            let (config, state) = lab_files();
            let mut cfg = std::fs::read_to_string(&config).unwrap().replace(
                "workers: {count: 1, cpus: []}",
                "workers: {count: 1, cpus: [1]}",
            );
            if mode == "kxdp-deep" {
                let afxdp = std::env::var("KXDP_BENCH_AFXDP").unwrap_or_else(|_| {
                    "{frames: 65536, rxRingSize: 8192, fillRingSize: 8192}".into()
                });
                cfg += &format!("afxdp: {afxdp}\n");
            }
            std::fs::write(dir.join("config.yaml"), cfg).unwrap();
            // State files: a directory of manifests; the config sits outside it.
            let sdir = dir.join("state");
            std::fs::create_dir(&sdir).unwrap();
            std::fs::copy(&state, sdir.join("00.yaml")).unwrap();
            std::fs::write(sdir.join("10.yaml"), filler_state(services)).unwrap();
            // The daemon inherits the variable; only a build with the `bench-io-floor` feature
            // reads it (dataplane/src/worker.rs).
            if mode == "kxdp-floor" {
                let floor_built = cfg!(feature = "bench-io-floor");
                if !floor_built {
                    panic!("KXDP_BENCH_MODE=kxdp-floor needs `--features bench-io-floor` (benches/lab.sh)");
                }
                std::env::set_var("KXDP_BENCH_IO_FLOOR", "vpod1,vpod2");
            } else {
                std::env::remove_var("KXDP_BENCH_IO_FLOOR");
            }
            let k = Kxdp::start(
                &c.node,
                dir.join("config.yaml").to_str().unwrap(),
                sdir.to_str().unwrap(),
            );
            (Some(k), vip)
        }
        kernel => {
            if kernel_rps() {
                // The node's forwarding on CPU 1 (`kernel_rps`).
                lab::sh(
                    &c.node,
                    "echo 2 > /sys/class/net/vpod3/queues/rx-0/rps_cpus",
                );
            }
            setup_kernel(c, kernel, services)
        }
    }
}

/// The kernel's forwarders (`routing`, `iptables`, `nftables`): the node's rules for `mode`.
fn setup_kernel(c: &Cluster, mode: &str, services: u64) -> (Option<Kxdp>, String) {
    let vip = "172.30.0.10:53".to_string();
    match mode {
        "routing" => {
            lab::sh(&c.node, "sysctl -qw net.ipv4.ip_forward=1");
            (None, "10.1.0.11:5353".into())
        }
        "iptables" => {
            lab::sh(&c.node, "sysctl -qw net.ipv4.ip_forward=1");
            let restore = if lab::run("sh", &["-c", "command -v iptables-legacy-restore || true"])
                .trim()
                .is_empty()
            {
                "iptables-restore"
            } else {
                "iptables-legacy-restore"
            };
            pipe_into(&c.node, restore, &iptables_rules(services));
            (None, vip)
        }
        "nftables" => {
            lab::sh(&c.node, "sysctl -qw net.ipv4.ip_forward=1");
            pipe_into(&c.node, "nft -f -", &nft_rules(services));
            (None, vip)
        }
        other => panic!(
            "KXDP_BENCH_MODE={other}: kxdp, kxdp-floor, kxdp-deep, kxdp-ref, routing, iptables or nftables"
        ),
    }
}

#[test]
#[ignore = "benchmark: run by benches/lab.sh"]
fn bench_lab_udp_clusterip() {
    let mode = std::env::var("KXDP_BENCH_MODE").unwrap_or_else(|_| "kxdp".into());
    if !lab::available("bench_lab_udp_clusterip") {
        return;
    }
    let seconds = std::env::var("KXDP_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0f64);
    let flows = env_or("KXDP_BENCH_FLOWS", 64);
    let services = env_or("KXDP_BENCH_SERVICES", 1000);
    let rates: Vec<u64> = std::env::var("KXDP_BENCH_RATES")
        .unwrap_or_else(|_| "100000,250000,500000,750000,1000000,1500000,2000000,max".into())
        .split(',')
        .map(|r| {
            if r.trim() == "max" {
                0
            } else {
                r.trim().parse().expect("KXDP_BENCH_RATES")
            }
        })
        .collect();
    let c = Cluster::build();
    let dir = tempfile::tempdir().unwrap();
    let (kxdp, dst) = setup(&c, &mode, services, dir.path());
    let mac = lab::Lab::mac(&c.lab, &c.node, "vpod3")
        .map(|o| format!("{o:02x}"))
        .join(":");
    let worker = kxdp.as_ref().map(|k| k.child.id());
    if let Some(pid) = worker {
        worker_realtime(pid);
    }
    // Warm-up: neighbours, conntrack entries of every flow.
    let w = measure(&c, &dst, &mac, 10_000, 0.5, flows, worker);
    assert!(w.received > 0, "nothing was forwarded in mode {mode}");
    let mut best = 0f64;
    let line = |p: &Point, rate: u64, half: bool| {
        format!(
            "{{\"mode\":\"{mode}\",\"services\":{services},\"flows\":{flows},\"rate\":{},\"half_load\":{half},\"sent\":{},\"received\":{},\"offered_pps\":{:.0},\"delivered_pps\":{:.0},\"loss\":{:.5},\"busy_ns_per_packet\":{:.0},\"p50_us\":{:.1},\"p99_us\":{:.1},\"sink_dropped\":{},\"lost\":{},\"worker_cpu_ms\":{},\"worker_wait_ms\":{}}}",
            if rate == 0 { "\"max\"".to_string() } else { rate.to_string() },
            p.sent,
            p.received,
            p.offered_pps,
            p.delivered_pps,
            1.0 - p.received as f64 / p.sent.max(1) as f64,
            p.busy_ns_per_packet,
            p.p50_ns as f64 / 1e3,
            p.p99_ns as f64 / 1e3,
            p.sink_dropped,
            serde_json::to_string(&p.lost).unwrap(),
            p.worker_ms.map_or("null".into(), |w| format!("{:.0}", w.0)),
            p.worker_ms.map_or("null".into(), |w| format!("{:.0}", w.1)),
        )
    };
    for &rate in &rates {
        let p = measure(&c, &dst, &mac, rate, seconds, flows, worker);
        best = best.max(p.delivered_pps);
        println!("BENCH {}", line(&p, rate, false));
    }
    let half = ((best / 2.0) as u64).max(1000);
    let p = measure(&c, &dst, &mac, half, seconds, flows, worker);
    println!("BENCH {}", line(&p, half, true));
    if let Some(mut k) = kxdp {
        k.stop();
    }
    let _ = ip(&c.node, "link show up0");
    let _ = Lab::path(&c.node);
}

/// `nf_conntrack_max` and `nf_conntrack_buckets` are one value each for the whole machine (on
/// 6.18 too: both are read-only in any namespace but the first), while the count they limit is
/// each namespace's own. Set for the flood benchmark (buckets = max: the kernel's own default
/// ratio, so that its early drop, which looks at 8 buckets, finds victims as it would in a table
/// of that size) and put back when it ends, also when it fails.
struct ConntrackMax(Vec<(&'static str, String)>);

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const CT_BUCKETS: &str = "/proc/sys/net/netfilter/nf_conntrack_buckets";

impl ConntrackMax {
    fn set(n: u64) -> ConntrackMax {
        let mut saved = Vec::new();
        for path in [CT_MAX, CT_BUCKETS] {
            let old = std::fs::read_to_string(path).expect("reading the conntrack sysctls");
            saved.push((path, old.trim().to_string()));
        }
        let guard = ConntrackMax(saved);
        std::fs::write(CT_BUCKETS, n.to_string()).expect("setting nf_conntrack_buckets");
        std::fs::write(CT_MAX, n.to_string()).expect("setting nf_conntrack_max");
        guard
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        for (path, old) in &self.0 {
            let _ = std::fs::write(path, old);
            eprintln!("{path} restored to {old}");
        }
    }
}

/// The namespace's nf_conntrack statistics (/proc/net/stat/nf_conntrack: one hex row per CPU),
/// summed over CPUs, by column name.
fn nf_conntrack_stats(ns: &str) -> std::collections::HashMap<String, u64> {
    let s = lab::sh(ns, "cat /proc/net/stat/nf_conntrack 2>/dev/null || true");
    let mut lines = s.lines();
    let names: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let mut out = std::collections::HashMap::new();
    for l in lines {
        for (k, v) in names.iter().zip(l.split_whitespace()) {
            *out.entry(k.to_string()).or_insert(0) += u64::from_str_radix(v, 16).unwrap_or(0);
        }
    }
    out
}

/// kxdp's drop counters from its metrics endpoint (127.0.0.1:10249 in the node namespace):
/// `kxdp_drops_total` by reason, the kernel's drops before kxdp (AF_XDP rings, the tap's
/// queues), plus the conntrack's early drops and created connections.
fn kxdp_drop_counters(ns: &str) -> std::collections::BTreeMap<String, u64> {
    let s = lab::sh(
        ns,
        "curl -s --max-time 5 http://127.0.0.1:10249/metrics || true",
    );
    let mut out = std::collections::BTreeMap::new();
    for l in s.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = l.rsplit_once(' ') else {
            continue;
        };
        let value = value.parse::<f64>().unwrap_or(0.0) as u64;
        if let Some(rest) = name.strip_prefix("kxdp_drops_total{") {
            if let Some(r) = rest
                .split("reason=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
            {
                *out.entry(r.to_string()).or_insert(0) += value;
            }
        } else if let Some(rest) = ["kxdp_xsk_rx_ring_full_total{", "kxdp_xsk_rx_dropped_total{"]
            .iter()
            .find_map(|p| name.strip_prefix(p).map(|r| (p, r)))
        {
            // The kernel's drops before kxdp, per interface: RX ring full, no fill frame.
            let (prefix, labels) = rest;
            let iface = labels
                .split("interface=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("?");
            let what = if prefix.contains("ring_full") {
                "rx ring full"
            } else {
                "no fill frame"
            };
            *out.entry(format!("xsk {iface} {what}")).or_insert(0) += value;
        } else if name.starts_with("kxdp_tap_queue_full_total") {
            // The kernel's drops before kxdp through the tap: a queue to a worker full.
            *out.entry("tap queue full".into()).or_insert(0) += value;
        } else if name.starts_with("kxdp_conntrack_early_drops") {
            *out.entry("early-drop (evictions)".into()).or_insert(0) += value;
        }
    }
    out
}

/// The veth's own counters (`ethtool -S`, e.g. `rx_queue_0_xdp_drops`: frames the XDP program
/// could not hand over, such as an XSK ring full), summed over queues by counter name.
fn veth_drop_counters(ns: &str, dev: &str) -> std::collections::BTreeMap<String, u64> {
    let s = lab::sh(ns, &format!("ethtool -S {dev} 2>/dev/null || true"));
    let mut out = std::collections::BTreeMap::new();
    for l in s.lines() {
        let Some((k, v)) = l.trim().split_once(':') else {
            continue;
        };
        let k = k.trim();
        let k = k
            .strip_prefix("rx_queue_")
            .and_then(|r| r.split_once('_').map(|x| x.1))
            .unwrap_or(k);
        if k.contains("drop") || k.contains("full") || k.contains("err") {
            if let Ok(v) = v.trim().parse::<u64>() {
                *out.entry(k.to_string()).or_insert(0) += v;
            }
        }
    }
    out
}

/// Frames the machine's receive backlogs dropped (/proc/net/softnet_stat, second column, summed
/// over CPUs; one value for the whole machine, not per namespace).
fn softnet_dropped() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

/// `after - before` for every counter that moved.
fn moved<K: Ord + Clone + std::hash::Hash + ToString>(
    before: impl Fn(&K) -> u64,
    after: impl IntoIterator<Item = (K, u64)>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .into_iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before(&k));
            (d > 0).then(|| (k.to_string(), d))
        })
        .collect()
}

/// A counter of the namespace's TCP statistics (`/proc/net/snmp`, e.g. "RetransSegs").
fn tcp_stat(ns: &str, name: &str) -> u64 {
    let s = lab::sh(ns, "cat /proc/net/snmp");
    let mut lines = s.lines().filter(|l| l.starts_with("Tcp:"));
    let (h, v) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    h.split_whitespace()
        .zip(v.split_whitespace())
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// SYN flood against a conntrack table of `KXDP_FLOOD_TABLE` entries, forwarded by
/// `KXDP_FLOOD_MODE`: `kernel` (nftables DNAT, nf_conntrack with `nf_conntrack_max` set to the
/// table size for the run and restored after), `kxdp` (`conntrack.maxEntries`), `kxdp-tap`
/// (the same with every interface through the tap) or `kxdp-tap-pods` (the pods through the
/// tap, the uplink on XDP beside the fast path). The flood:
/// `kxdp pcap send --syn --vary-src` from the ext namespace at `KXDP_FLOOD_RATE` SYN/s (or
/// `max`) to the ClusterIP's TCP port, each SYN from a new spoofed source in 10.64.0.0/10,
/// never answered (the backends' SYN-ACKs have no route back). Meanwhile the client pod keeps
/// 200 established connections sending a byte every 10 ms, and opens a legitimate new
/// connection every 20 ms (success: the backend's greeting within 1 s). One JSON line.
#[test]
#[ignore = "benchmark: run by benches/lab-flood.sh"]
fn bench_lab_syn_flood() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    if !lab::available("bench_lab_syn_flood") {
        return;
    }
    let mode = std::env::var("KXDP_FLOOD_MODE").unwrap_or_else(|_| "kxdp".into());
    let table = env_or("KXDP_FLOOD_TABLE", 1000);
    let rate = std::env::var("KXDP_FLOOD_RATE").unwrap_or_else(|_| "10000".into());
    let seconds = 4.0f64;
    let established_n = 200usize;
    let c = Cluster::build();
    let dir = tempfile::tempdir().unwrap();
    let mut _guard = None;
    let mut _kxdp = None;
    lab::sh(
        &c.node,
        "sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.up0.rp_filter=0",
    );
    match mode.as_str() {
        "kxdp" | "kxdp-tap" | "kxdp-tap-pods" => {
            let (config, state) = lab_files();
            let mut cfg = std::fs::read_to_string(&config)
                .unwrap()
                .replace(
                    "workers: {count: 1, cpus: []}",
                    "workers: {count: 1, cpus: [1]}",
                )
                .replace(
                    "conntrack: {stateFile: \"\"}",
                    &format!("conntrack: {{stateFile: \"\", maxEntries: {table}}}"),
                );
            // The lab's configuration has XDP everywhere (`kxdp`).
            let xdp = "podInterception: {mode: xdp}";
            assert!(cfg.contains(xdp), "the lab's podInterception line moved");
            if mode == "kxdp-tap" {
                // Every interface through the tap, the uplink too: no XDP on the node, the
                // flood read from the tap frame by frame (docs/afxdp.md § The uplink through
                // the tap).
                cfg = cfg.replace(
                    xdp,
                    "podInterception: {mode: tap, interfaces: [up0, \"vpod*\"]}",
                );
            }
            if mode == "kxdp-tap-pods" {
                // The pods through the tap, the flood arriving on the uplink's XDP program, as
                // on a NIC (the lab's uplink is a veth, which `everyVeth` would intercept too).
                cfg = cfg.replace(
                    xdp,
                    "podInterception: {mode: tap, interfaces: [\"vpod*\"], everyVeth: false}",
                );
            }
            std::fs::write(dir.path().join("config.yaml"), cfg).unwrap();
            _kxdp = Some(Kxdp::start(
                &c.node,
                dir.path().join("config.yaml").to_str().unwrap(),
                &state,
            ));
        }
        "kernel" => {
            lab::sh(&c.node, "sysctl -qw net.ipv4.ip_forward=1");
            pipe_into(
                &c.node,
                "nft -f -",
                "table ip kube-proxy {\n  chain nat-prerouting {\n    type nat hook prerouting priority dstnat; policy accept;\n\
                 \x20   ip daddr 172.30.0.10 tcp dport 80 numgen random mod 2 vmap { 0 : goto ep1, 1 : goto ep2 }\n  }\n\
                 \x20 chain ep1 {\n    meta l4proto tcp dnat to 10.1.0.11:8080\n  }\n  chain ep2 {\n    meta l4proto tcp dnat to 10.1.0.12:8080\n  }\n}\n",
            );
            _guard = Some(ConntrackMax::set(table));
            // The node's forwarding on CPU 1, the CPU kxdp's worker gets (the flood sender is
            // on CPU 0). Without this, veth runs the node's whole receive path in the sender's
            // own sendto() on CPU 0, and the kernel slows the flood down instead of facing it.
            lab::sh(&c.node, "echo 2 > /sys/class/net/up0/queues/rx-0/rps_cpus");
        }
        other => panic!("KXDP_FLOOD_MODE={other}: kxdp, kxdp-tap, kxdp-tap-pods or kernel"),
    }
    let _servers: Vec<lab::Servers> = ["web-1", "web-2"]
        .iter()
        .map(|p| {
            lab::Servers::start(
                c.pod(p),
                if *p == "web-1" {
                    "10.1.0.11"
                } else {
                    "10.1.0.12"
                },
            )
        })
        .collect();
    // The backends count the flood's SYNs that reach them (sources in 10.64.0.0/10).
    for p in ["web-1", "web-2"] {
        pipe_into(
            c.pod(p),
            "nft -f -",
            "table ip flood {\n  chain input {\n    type filter hook input priority 0; policy accept;\n\
             \x20   ip saddr 10.64.0.0/10 tcp flags & (syn | ack) == syn counter\n  }\n}\n",
        );
    }
    // Established connections, opened before the flood; their entries are assured.
    let stop = Arc::new(AtomicBool::new(false));
    let client = Lab::path(c.pod("client-1"));
    let (st, cl) = (stop.clone(), client.clone());
    let established = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&cl).unwrap();
        // A connection that cannot be opened (three tries) counts as not intact.
        let mut conns: Vec<(TcpStream, u64)> = (0..established_n)
            .filter_map(|_| {
                let mut s = (0..3).find_map(|_| {
                    TcpStream::connect_timeout(
                        &"172.30.0.10:80".parse().unwrap(),
                        Duration::from_secs(2),
                    )
                    .ok()
                })?;
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut b = [0u8; 64];
                let _ = s.read(&mut b);
                Some((s, 0))
            })
            .collect();
        while !st.load(Ordering::Relaxed) {
            for (s, n) in &mut conns {
                if s.write_all(b"x").is_ok() {
                    *n += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Intact: the backend counted every byte written.
        let mut intact = 0;
        for (mut s, n) in conns {
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            if got
                .lines()
                .last()
                .and_then(|l| l.trim().parse::<u64>().ok())
                == Some(n)
            {
                intact += 1;
            }
        }
        intact
    });
    std::thread::sleep(Duration::from_millis(500));
    let retrans0 = tcp_stat(c.pod("client-1"), "RetransSegs");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("0").to_string();
    let ct0 = nf_conntrack_stats(&c.node);
    let kx0 = kxdp_drop_counters(&c.node);
    // Every node-side veth of the lab: the flood's (up0) and the pods' (their XDP receive rings
    // fill too when the worker falls behind).
    let veths = ["up0", "vpod1", "vpod2", "vpod3"];
    let veth0: Vec<_> = veths
        .iter()
        .map(|v| veth_drop_counters(&c.node, v))
        .collect();
    let softnet0 = softnet_dropped();
    // The flood.
    let mac = c
        .lab
        .mac(&c.node, "up0")
        .map(|o| format!("{o:02x}"))
        .join(":");
    let secs = seconds.to_string();
    let flood = kxdp_in(
        &c.ext,
        &[
            "pcap",
            "send",
            "--iface",
            "eth0",
            "--syn",
            "--size",
            "54",
            "--rate",
            &rate,
            "--duration",
            &secs,
            "--dst-mac",
            &mac,
            "--src",
            "10.64.0.0",
            "--dst",
            "172.30.0.10:80",
            "--flows",
            "1",
            "--vary-src",
            "4000000",
            "--cpu",
            "0",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("flood");
    // Legitimate new connections during the flood.
    std::thread::sleep(Duration::from_millis(300));
    let ok = Arc::new(AtomicU64::new(0));
    let mut attempts = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < seconds - 0.8 {
        let (cl, ok) = (client.clone(), ok.clone());
        attempts.push(std::thread::spawn(move || {
            kxdp_kernel::enter_netns(&cl).unwrap();
            let t = Instant::now();
            match TcpStream::connect_timeout(
                &"172.30.0.10:80".parse().unwrap(),
                Duration::from_secs(1),
            ) {
                Ok(mut s) => {
                    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
                    let mut b = [0u8; 64];
                    match s.read(&mut b) {
                        Ok(n) if n > 0 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        r => eprintln!(
                            "legitimate connection failed after connecting ({:?} after {:?}): {r:?}",
                            s.local_addr(),
                            t.elapsed()
                        ),
                    }
                }
                Err(e) => eprintln!("legitimate connection failed to connect after {:?}: {e}", t.elapsed()),
            }
        }));
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = flood.wait_with_output().unwrap();
    let f = last_json(&out.stdout);
    let legit = attempts.len();
    for a in attempts {
        let _ = a.join();
    }
    let ct_count = if mode == "kernel" {
        lab::sh(
            &c.node,
            "cat /proc/sys/net/netfilter/nf_conntrack_count || echo 0",
        )
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
    } else {
        0
    };
    let retrans = tcp_stat(c.pod("client-1"), "RetransSegs") - retrans0;
    // Drop reasons during the flood, each counter that moved: the kernel's nf_conntrack
    // statistics (`drop`: refused, table full; `early_drop`: evictions) and the machine's
    // softnet backlog drops; kxdp's drop reasons and evictions, and the veth's XDP drops
    // (frames its XDP program could not hand to kxdp's socket).
    let mut drops = if mode == "kernel" {
        let ct = nf_conntrack_stats(&c.node);
        let keep = [
            "drop",
            "early_drop",
            "insert_failed",
            "invalid",
            "new",
            "error",
        ];
        moved(
            |k: &String| ct0.get(k).copied().unwrap_or(0),
            ct.into_iter().filter(|(k, _)| keep.contains(&k.as_str())),
        )
        .into_iter()
        .map(|(k, v)| (format!("nf_conntrack {k}"), v))
        .collect::<std::collections::BTreeMap<_, _>>()
    } else {
        let mut d = moved(
            |k: &String| kx0.get(k).copied().unwrap_or(0),
            kxdp_drop_counters(&c.node),
        );
        for (veth, before) in veths.iter().zip(&veth0) {
            for (k, v) in moved(
                |k: &String| before.get(k).copied().unwrap_or(0),
                veth_drop_counters(&c.node, veth),
            ) {
                d.insert(format!("veth {veth} {k}"), v);
            }
        }
        d
    };
    // Frames the sender's veth could not hand to the node's side (its XDP receive ring full).
    let tx_dropped = f["iface_tx_dropped"].as_u64().unwrap_or(0);
    if tx_dropped > 0 {
        drops.insert("sender veth tx_dropped".into(), tx_dropped);
    }
    let softnet = softnet_dropped().saturating_sub(softnet0);
    if softnet > 0 {
        drops.insert("softnet backlog (whole machine)".into(), softnet);
    }
    let at_backends: u64 = ["web-1", "web-2"]
        .iter()
        .map(|p| {
            lab::sh(c.pod(p), "nft list chain ip flood input")
                .split("packets ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    stop.store(true, Ordering::Relaxed);
    let intact = established.join().unwrap();
    let sent = f["sent"].as_u64().unwrap_or(0);
    let line = format!(
        "{{\"mode\":\"{mode}\",\"table\":{table},\"rate\":\"{rate}\",\"flood_sent\":{sent},\"flood_pps\":{:.0},\"flood_at_backends\":{at_backends},\"established\":{established_n},\"established_intact\":{intact},\"client_retransmits\":{retrans},\"legit\":{legit},\"legit_ok\":{},\"legit_success\":{:.3},\"nf_conntrack_count\":{ct_count},\"drops\":{},\"load\":{load}}}",
        f["offered_pps"].as_f64().unwrap_or(0.0),
        ok.load(Ordering::Relaxed),
        ok.load(Ordering::Relaxed) as f64 / legit.max(1) as f64,
        serde_json::to_string(&drops).unwrap(),
    );
    println!("BENCH {line}");
    drop(_guard);
}
