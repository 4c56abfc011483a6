//! A benchmark, not a test (ignored by default; needs root, Debian's iperf3 and the CNI plugins):
//! bulk TCP from a pod to a ClusterIP whose endpoint is a pod on the same node, through the ways a
//! node can carry it, rounds alternated. The lab is node-a of the CNI lab (tests/cni/mod.rs: pods
//! made by the `ptp` plugin, one host-side veth and a /32 route per pod). The Service is
//! 172.30.0.10:80 → the server pod's iperf3 on 5201 (the port changes, as with a real Service).
//!
//! Paths, per round, iperf3 with 1 and 4 streams:
//! - `kernel`: pod to pod address, no Service (the kernel's routing alone);
//! - `iptables`: the ClusterIP as kube-proxy's iptables rules DNAT it (the target);
//! - `kxdp`: `kxdp run` on the node (`interfaces: [eth0, "veth*"]`, `podInterception: {mode:
//!   xdp}`: XDP on the pods' veths),
//!   only when `KXDP_BIN` names a release build;
//! - `kxdp-tap`: the same with `podInterception: {mode: tap}` (the default: the pods' veths redirected into
//!   kxdp's tap, the workers' tap port: `kxdp_dataplane::tap`), also only with `KXDP_BIN`;
//! - `tap`: no XDP on the pods' veths; a clsact qdisc on each host-side veth with a match-all
//!   `u32` filter whose `mirred egress redirect` sends every IPv4 packet from the pod to a tap opened
//!   with a virtio-net header and TSO offloads (`kxdp_kernel::tap`), so whole GSO super-frames
//!   reach userspace; a small forwarder here does the DNAT and its reverse with a flow table and
//!   exact checksums (a partial one updated as a pseudo-header sum), and writes the frame back
//!   into the tap for the kernel to route, GSO intact;
//! - `tap2`: the same with two tap queues, one forwarding thread each;
//! - `tap-spin`: one queue, its thread busy-polling (non-blocking reads) instead of sleeping.
//!
//! Every run must complete without errors, the server pod's `TcpInCsumErrors` must stay 0, and the
//! client pod's TSO must be on for the paths that claim super-frames. CPU is the whole machine's
//! busy time from /proc/stat over the run (ms per Gbit moved).
//!
//! ```sh
//! cargo build --release --bin kxdp
//! KXDP_BIN=$PWD/target/release/kxdp cargo test --test lab_gso_paths -- --ignored --nocapture
//! ```
//!
//! `KXDP_GSO_PATHS` (comma separated, e.g. `iptables,kxdp,kxdp-tap`) runs only those paths
//! (`iptables` always runs: the ratios are to it); `KXDP_GSO_ROUNDS` sets the rounds.
//!
//! Figures and the decision they support: docs/afxdp.md, "Pod traffic as super-frames".

mod cni;
mod lab;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cni::Lab;
use kxdp_kernel::tap::{TapQueue, VirtioNetHdr, MAX_FRAME, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6};
use kxdp_packet::{checksum, IpProto};

const SECONDS: u32 = 4;
const ROUNDS: usize = 3;
/// The tc filter preference of the redirect.
const PREF: u16 = 100;
const VIP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 10);
const VPORT: u16 = 80;
const TPORT: u16 = 5201;
const TAP: &str = "kxgso0";
const TAP_MAC: [u8; 6] = [0x02, 0x6b, 0x67, 0x73, 0x6f, 0x00];

/// Busy and total jiffies of the whole machine.
fn cpu() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    (total - v[3] - v[4], total)
}

/// User and system jiffies of process `pid` (kxdp), or of this one (the tap forwarder's
/// threads; iperf3 runs apart).
fn own_cpu(pid: Option<u32>) -> u64 {
    let at = pid.map_or("self".to_string(), |p| p.to_string());
    let s = std::fs::read_to_string(format!("/proc/{at}/stat")).unwrap_or_default();
    if s.is_empty() {
        return 0;
    }
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime), counted from the state (field 3).
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// One iperf3 run: Gbit/s received, the machine's CPU ms per Gbit and the forwarder's (kxdp's
/// process `pid`, or this one's); panics on an error.
fn iperf(lab: &Lab, to: &str, port: u16, streams: u32, pid: Option<u32>) -> (f64, f64, f64) {
    let c = lab.pod("client-a");
    let ticks = 1000 / 100; // USER_HZ
    let mut tries = 0;
    let (j, b0, b1, o0, o1) = loop {
        let o0 = own_cpu(pid);
        let (b0, _) = cpu();
        let out = lab::sh(
            &c.ns,
            &format!("timeout 20 iperf3 -c {to} -p {port} -P {streams} -t {SECONDS} -J || true"),
        );
        let (b1, _) = cpu();
        let o1 = own_cpu(pid);
        let j: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("iperf3 output: {e}: {out}"));
        // The server may still be closing the previous test: not a failure of the path.
        let busy = j["error"].as_str().is_some_and(|e| e.contains("busy"));
        if busy && tries < 5 {
            tries += 1;
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        break (j, b0, b1, o0, o1);
    };
    assert!(j.get("error").is_none(), "iperf3 to {to}: {}", j["error"]);
    let bps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .expect("bits_per_second");
    let gbit = bps / 1e9;
    let ms = ((b1 - b0) * ticks) as f64;
    let own = ((o1 - o0) * ticks) as f64;
    let per = |ms: f64| ms / (gbit * SECONDS as f64);
    (gbit, per(ms), per(own))
}

/// `TcpInCsumErrors` of the pod's namespace.
fn csum_errors(ns: &str) -> u64 {
    let snmp = lab::sh(ns, "cat /proc/net/snmp");
    let tcp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let names: Vec<&str> = tcp[0].split_whitespace().collect();
    let vals: Vec<&str> = tcp[1].split_whitespace().collect();
    let i = names.iter().position(|n| *n == "InCsumErrors").unwrap();
    vals[i].parse().unwrap()
}

/// The client pod's eth0 TSO and GSO states (`on`/`off`).
fn offloads(lab: &Lab) -> String {
    let k = lab::sh(
        &lab.pod("client-a").ns,
        "ethtool -k eth0 2>/dev/null || true",
    );
    let get = |f: &str| {
        k.lines()
            .find(|l| l.starts_with(f))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "tso {} gso {}",
        get("tcp-segmentation-offload:"),
        get("generic-segmentation-offload:")
    )
}

// --- The tap forwarder ---------------------------------------------------------------------

#[derive(Default)]
struct Counts {
    frames: AtomicU64,
    gso: AtomicU64,
    bytes: AtomicU64,
    nat: AtomicU64,
}

/// The rewrite: ClusterIP → endpoint for new and known flows, endpoint → ClusterIP for the
/// replies of flows it translated. Fills in the checksums as the header says they are.
struct Nat {
    endpoint: Ipv4Addr,
    /// Client (address, port) of each translated flow, shared by the queues' threads (the two
    /// directions of a flow may come out of different queues).
    flows: Arc<Mutex<HashMap<(Ipv4Addr, u16), ()>>>,
}

/// Updates a checksum field for a 32-bit (address) change. A partial field (the frame's
/// `NEEDS_CSUM`, the kernel's CHECKSUM_PARTIAL) holds the uncomplemented pseudo-header sum the
/// sender completes later: it takes the change added, not the RFC 1624 complement form.
fn fix32(check: u16, old: u32, new: u32, partial: bool) -> u16 {
    if partial {
        !checksum::update32(!check, old, new)
    } else {
        checksum::update32(check, old, new)
    }
}

impl Nat {
    /// Rewrites one frame in place; returns whether it translated it.
    fn rewrite(&mut self, hdr: &VirtioNetHdr, f: &mut [u8]) -> bool {
        if f.len() < 14 + 20 || f[12..14] != [0x08, 0x00] || f[14] >> 4 != 4 {
            return false;
        }
        let ihl = ((f[14] & 0x0f) as usize) * 4;
        let proto = IpProto(f[14 + 9]);
        let l4 = 14 + ihl;
        if !(proto == IpProto::TCP || proto == IpProto::UDP)
            || f.len() < l4 + 8
            || f[14 + 6] & 0x3f != 0
        {
            return false; // not TCP/UDP, or a fragment (the lab sends none)
        }
        let ip = |f: &[u8], at: usize| Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]);
        let port = |f: &[u8], at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
        let (src, dst) = (ip(f, 14 + 12), ip(f, 14 + 16));
        let (sport, dport) = (port(f, l4), port(f, l4 + 2));
        // Which address and port field change: (ip offset, port offset, new ip, new port).
        let (ip_at, port_at, new_ip, new_port) = if dst == VIP && dport == VPORT {
            self.flows.lock().unwrap().insert((src, sport), ());
            (14 + 16, l4 + 2, self.endpoint, TPORT)
        } else if src == self.endpoint
            && sport == TPORT
            && self.flows.lock().unwrap().contains_key(&(dst, dport))
        {
            (14 + 12, l4, VIP, VPORT)
        } else {
            return false;
        };
        let old_ip = u32::from_be_bytes(f[ip_at..ip_at + 4].try_into().unwrap());
        let new_ip32 = u32::from(new_ip);
        let old_port = port(f, port_at);
        f[ip_at..ip_at + 4].copy_from_slice(&new_ip.octets());
        f[port_at..port_at + 2].copy_from_slice(&new_port.to_be_bytes());
        let ipc = u16::from_be_bytes([f[24], f[25]]);
        f[24..26].copy_from_slice(&checksum::update32(ipc, old_ip, new_ip32).to_be_bytes());
        let ck_at = l4 + if proto == IpProto::TCP { 16 } else { 6 };
        if f.len() < ck_at + 2 {
            return true;
        }
        let partial = hdr.needs_csum() && hdr.csum_start as usize == l4;
        let ck = u16::from_be_bytes([f[ck_at], f[ck_at + 1]]);
        if proto == IpProto::UDP && ck == 0 && !partial {
            return true; // UDP without a checksum
        }
        let mut ck = fix32(ck, old_ip, new_ip32, partial);
        if !partial {
            // The port is in the complete checksum, not in the pseudo-header.
            ck = checksum::update16(ck, old_port, new_port);
            if proto == IpProto::UDP && ck == 0 {
                ck = 0xffff;
            }
        }
        f[ck_at..ck_at + 2].copy_from_slice(&ck.to_be_bytes());
        true
    }
}

struct Forwarder {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counts: Arc<Counts>,
}

impl Forwarder {
    /// Opens the tap in `node_ns` with `queues` queues, one forwarding thread each; `spin`:
    /// busy-poll the queue instead of sleeping in poll() until a frame comes.
    fn start(node_ns: &str, queues: usize, spin: bool, endpoint: Ipv4Addr) -> Forwarder {
        let path = lab::Lab::path(node_ns);
        let qs = {
            let path = path.clone();
            std::thread::spawn(move || {
                kxdp_kernel::enter_netns(&path).expect("setns");
                TapQueue::open(TAP, queues, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6).expect("tap")
            })
            .join()
            .unwrap()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let mut threads = Vec::new();
        let flows = Arc::new(Mutex::new(HashMap::new()));
        for q in qs {
            let (stop, counts, flows) = (stop.clone(), counts.clone(), flows.clone());
            threads.push(std::thread::spawn(move || {
                let mut nat = Nat { endpoint, flows };
                let mut buf = vec![0u8; MAX_FRAME];
                q.set_nonblocking(spin).expect("O_NONBLOCK");
                while !stop.load(Ordering::Relaxed) {
                    if !spin && !q.wait_readable(100).expect("poll") {
                        continue;
                    }
                    let (hdr, n) = match q.read(&mut buf) {
                        Ok(r) => r,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::yield_now();
                            continue;
                        }
                        Err(e) => panic!("tap read: {e}"),
                    };
                    let f = &mut buf[..n];
                    counts.frames.fetch_add(1, Ordering::Relaxed);
                    counts.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    if hdr.is_gso() {
                        counts.gso.fetch_add(1, Ordering::Relaxed);
                    }
                    if nat.rewrite(&hdr, f) {
                        counts.nat.fetch_add(1, Ordering::Relaxed);
                    }
                    // Addressed to the tap, or the kernel drops it as another host's.
                    f[0..6].copy_from_slice(&TAP_MAC);
                    if let Err(e) = q.write(&hdr, f) {
                        eprintln!("tap write: {e} ({hdr:?}, {n} bytes)");
                    }
                }
            }));
        }
        Forwarder {
            stop,
            threads,
            counts,
        }
    }

    fn stop(self) -> Arc<Counts> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("forwarder thread");
        }
        self.counts
    }
}

/// Steers every IP packet the pod behind `veth` sends into the tap (or undoes it), through
/// `kxdp_kernel::tc` (netlink).
fn steer(node_ns: &str, veth: &str, on: bool) {
    let veth = veth.to_string();
    lab::Lab::in_ns(node_ns, move || {
        let i = kxdp_kernel::ifindex(&veth).expect("veth");
        if on {
            let tap = kxdp_kernel::ifindex(TAP).expect("tap");
            kxdp_kernel::tc::redirect_ingress(i, tap, PREF, None, Default::default())
                .expect("redirect");
        } else {
            kxdp_kernel::tc::remove_redirect(i, PREF).expect("remove redirect");
        }
    });
}

// --- The rounds ----------------------------------------------------------------------------

type Results = BTreeMap<String, Vec<(f64, f64, f64)>>;

fn record(results: &mut Results, lab: &Lab, path: &str, to: &str, port: u16, pid: Option<u32>) {
    for streams in [1, 4] {
        let server = lab.pod("web-a1").ns.clone();
        let before = csum_errors(&server);
        let (g, ms, own) = iperf(lab, to, port, streams, pid);
        let bad = csum_errors(&server) - before;
        let off = offloads(lab);
        eprintln!(
            "  {path:<10} P{streams}: {g:6.2} Gbit/s  {ms:5.0} CPU ms/Gbit (forwarder {own:4.0})  \
             client {off}  TcpInCsumErrors +{bad}"
        );
        assert_eq!(bad, 0, "{path}: the server saw bad TCP checksums");
        if path != "kxdp" {
            // Only an XDP program on the veth takes the pod's GSO away.
            assert!(off.starts_with("tso on gso on"), "{path}: client pod {off}");
        }
        results
            .entry(format!("{path} P{streams}"))
            .or_default()
            .push((g, ms, own));
    }
}

fn iptables_dnat(ns: &str, endpoint: Ipv4Addr, on: bool) {
    // kube-proxy's layout for one Service with one endpoint.
    let rules = format!(
        "*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEB - [0:0]
:KUBE-SEP-WEB1 - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-SERVICES -d {VIP}/32 -p tcp -m comment --comment \"lab/web:tcp cluster IP\" -m tcp --dport {VPORT} -j KUBE-SVC-WEB
-A KUBE-SVC-WEB -m comment --comment \"lab/web:tcp -> {endpoint}:{TPORT}\" -j KUBE-SEP-WEB1
-A KUBE-SEP-WEB1 -p tcp -m comment --comment \"lab/web:tcp\" -m tcp -j DNAT --to-destination {endpoint}:{TPORT}
COMMIT
"
    );
    if on {
        lab::sh(
            ns,
            &format!("printf '%s' '{rules}' | iptables-restore --noflush"),
        );
    } else {
        lab::sh(
            ns,
            "iptables -t nat -D PREROUTING -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES; \
             iptables -t nat -D OUTPUT -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES; \
             for c in KUBE-SERVICES KUBE-SVC-WEB KUBE-SEP-WEB1; do iptables -t nat -F $c; done; \
             for c in KUBE-SERVICES KUBE-SVC-WEB KUBE-SEP-WEB1; do iptables -t nat -X $c; done",
        );
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: needs root, iperf3 and the CNI plugins; run with --ignored (module docs)"]
fn gso_paths() {
    let mut lab = Lab::build("lab_gso_paths");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-a", "web-a1", &[("app", "web")]);
    lab.warm_neighbours();
    let node = lab.node("node-a").ns.clone();
    let web = lab.pod("web-a1").ip4;
    let veths = [
        lab.pod("client-a").host_if.clone(),
        lab.pod("web-a1").host_if.clone(),
    ];
    lab::sh(&lab.pod("web-a1").ns, &format!("iperf3 -s -D -p {TPORT}"));
    std::thread::sleep(Duration::from_millis(300));
    let objects = lab
        .service("web", 10, "web", None, false)
        .replace("port: 80, targetPort: 8080", "port: 80, targetPort: 5201")
        .replace("{name: tcp, port: 8080,", "{name: tcp, port: 5201,");
    let kxdp = std::env::var("KXDP_BIN").is_ok();
    if !kxdp {
        eprintln!("KXDP_BIN unset: the kxdp path is left out (a debug build says nothing)");
    }
    // The kernel must be able to route what the tap hands back: no reverse-path check there.
    lab::sh(
        &node,
        "sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0",
    );
    eprintln!(
        "CPU: {}",
        std::fs::read_to_string("/proc/cpuinfo")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("model name"))
            .unwrap_or("?")
    );
    let mut results = Results::new();
    let rounds: usize = std::env::var("KXDP_GSO_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS);
    let only = std::env::var("KXDP_GSO_PATHS").ok();
    let on =
        |p: &str| p == "iptables" || only.as_ref().is_none_or(|o| o.split(',').any(|x| x == p));
    for round in 0..rounds {
        eprintln!("round {}", round + 1);
        if on("kernel") {
            record(&mut results, &lab, "kernel", &web.to_string(), TPORT, None);
        }

        iptables_dnat(&node, web, true);
        record(
            &mut results,
            &lab,
            "iptables",
            &VIP.to_string(),
            VPORT,
            None,
        );
        iptables_dnat(&node, web, false);

        for (path, extra) in [
            ("kxdp", "podInterception: {mode: xdp}\n"),
            ("kxdp-tap", "podInterception: {mode: tap}\n"),
        ] {
            if !kxdp || !on(path) {
                continue;
            }
            let config = lab.kxdp_config("node-a", false) + extra;
            let k = lab.start_kxdp("node-a", &config, &objects);
            lab.warm_neighbours();
            let pid = Some(k.kxdp.child.id());
            record(&mut results, &lab, path, &VIP.to_string(), VPORT, pid);
            drop(k);
            lab.warm_neighbours();
        }

        for (path, queues, spin) in [("tap", 1, false), ("tap2", 2, false), ("tap-spin", 1, true)] {
            if !on(path) {
                continue;
            }
            let fwd = Forwarder::start(&node, queues, spin, web);
            lab::sh(
                &node,
                &format!(
                    "ip link set {TAP} address {} up && sysctl -qw net.ipv4.conf.{TAP}.rp_filter=0",
                    TAP_MAC.map(|b| format!("{b:02x}")).join(":")
                ),
            );
            for v in &veths {
                steer(&node, v, true);
            }
            if round == 0 && queues == 1 {
                eprint!(
                    "{}",
                    lab::sh(&node, &format!("tc filter show dev {} ingress", veths[0]))
                );
            }
            record(&mut results, &lab, path, &VIP.to_string(), VPORT, None);
            for v in &veths {
                steer(&node, v, false);
            }
            let c = fwd.stop();
            let frames = c.frames.load(Ordering::Relaxed).max(1);
            let s = format!(
                "{path} forwarder: {} frames, {:.0}% GSO, {:.0} B per frame, {} translated",
                frames,
                100.0 * c.gso.load(Ordering::Relaxed) as f64 / frames as f64,
                c.bytes.load(Ordering::Relaxed) as f64 / frames as f64,
                c.nat.load(Ordering::Relaxed)
            );
            eprintln!("  {s}");
        }
    }
    lab::sh(&lab.pod("web-a1").ns, "pkill -x iperf3 || true");
    eprintln!(
        "\nmedians of {rounds} rounds ({SECONDS} s per run, CPU = the whole 2-vCPU machine):"
    );
    eprintln!(
        "| path | Gbit/s | CPU ms per Gbit | of which the forwarder | Gbit/s vs iptables | CPU/Gbit vs iptables |"
    );
    eprintln!("| --- | --- | --- | --- | --- | --- |");
    let med = |k: &str| -> Option<(f64, f64, f64)> {
        let v = results.get(k)?;
        let mut g: Vec<f64> = v.iter().map(|x| x.0).collect();
        let mut c: Vec<f64> = v.iter().map(|x| x.1).collect();
        let mut o: Vec<f64> = v.iter().map(|x| x.2).collect();
        Some((median(&mut g), median(&mut c), median(&mut o)))
    };
    for streams in [1, 4] {
        let base = med(&format!("iptables P{streams}")).unwrap();
        for path in [
            "kernel", "iptables", "kxdp", "kxdp-tap", "tap", "tap2", "tap-spin",
        ] {
            if let Some((g, c, o)) = med(&format!("{path} P{streams}")) {
                eprintln!(
                    "| {path}, {streams} stream{} | {g:.2} | {c:.0} | {o:.0} | {:.2} | {:.2} |",
                    if streams == 1 { "" } else { "s" },
                    g / base.0,
                    c / base.1
                );
            }
        }
    }
}

#[cfg(test)]
mod rewrite {
    use super::*;

    /// A TCP/IPv4 frame from 10.77.1.2:40000 to the ClusterIP, its checksum complete.
    fn frame() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + 5];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&45u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 77, 1, 2]);
        ip[16..20].copy_from_slice(&VIP.octets());
        let c = checksum::fold(checksum::sum(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f[34..36].copy_from_slice(&40000u16.to_be_bytes());
        f[36..38].copy_from_slice(&VPORT.to_be_bytes());
        f[46] = 0x50;
        f[54..59].copy_from_slice(b"hello");
        let c = l4(&f);
        f[50..52].copy_from_slice(&c.to_be_bytes());
        f
    }

    /// The complete TCP checksum of `f` as it stands.
    fn l4(f: &[u8]) -> u16 {
        let mut t = f[34..].to_vec();
        t[16] = 0;
        t[17] = 0;
        let mut ph = Vec::new();
        ph.extend_from_slice(&f[26..34]);
        ph.extend_from_slice(&[0, 6]);
        ph.extend_from_slice(&(t.len() as u16).to_be_bytes());
        checksum::fold(checksum::sum(&t, checksum::sum(&ph, 0)))
    }

    /// What a sender stores in a CHECKSUM_PARTIAL field: the uncomplemented pseudo-header sum.
    fn pseudo(f: &[u8]) -> u16 {
        let mut ph = Vec::new();
        ph.extend_from_slice(&f[26..34]);
        ph.extend_from_slice(&[0, 6]);
        ph.extend_from_slice(&((f.len() - 34) as u16).to_be_bytes());
        !checksum::fold(checksum::sum(&ph, 0))
    }

    fn nat() -> Nat {
        Nat {
            endpoint: Ipv4Addr::new(10, 77, 1, 3),
            flows: Arc::default(),
        }
    }

    #[test]
    fn complete_checksums_stay_exact_both_ways() {
        let mut n = nat();
        let mut f = frame();
        assert!(n.rewrite(&VirtioNetHdr::default(), &mut f));
        assert_eq!(&f[30..34], &[10, 77, 1, 3]);
        assert_eq!(&f[36..38], &TPORT.to_be_bytes());
        assert_eq!(checksum::fold(checksum::sum(&f[14..34], 0)), 0, "IP header");
        assert_eq!(u16::from_be_bytes([f[50], f[51]]), l4(&f), "TCP");
        // The reply (addresses and ports swapped) is un-translated.
        let mut r = f.clone();
        for (a, b) in [(26, 30), (27, 31), (28, 32), (29, 33), (34, 36), (35, 37)] {
            r.swap(a, b);
        }
        assert!(n.rewrite(&VirtioNetHdr::default(), &mut r));
        assert_eq!(&r[26..30], &VIP.octets());
        assert_eq!(&r[34..36], &VPORT.to_be_bytes());
        assert_eq!(u16::from_be_bytes([r[50], r[51]]), l4(&r));
        // An unknown flow from the endpoint is left alone.
        let mut other = r.clone();
        other[36..38].copy_from_slice(&1u16.to_be_bytes());
        let before = other.clone();
        assert!(!nat().rewrite(&VirtioNetHdr::default(), &mut other));
        assert_eq!(other, before);
    }

    #[test]
    fn partial_checksums_take_the_address_change_only() {
        let mut f = frame();
        let p = pseudo(&f);
        f[50..52].copy_from_slice(&p.to_be_bytes());
        let hdr = VirtioNetHdr {
            flags: kxdp_kernel::tap::VIRTIO_NET_HDR_F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            ..Default::default()
        };
        assert!(nat().rewrite(&hdr, &mut f));
        let got = u16::from_be_bytes([f[50], f[51]]);
        // Equal as ones' complement numbers (0 and 0xffff are both zero).
        let want = pseudo(&f);
        assert!(
            got == want || (got | want) == 0xffff && (got & want) == 0,
            "{got:#x} {want:#x}"
        );
        // Completing it the way the kernel does gives the exact checksum.
        let mut t = f[34..].to_vec();
        t[16] = 0;
        t[17] = 0;
        let done = checksum::fold(checksum::sum(&t, got as u32));
        assert_eq!(done, l4(&f));
    }
}
