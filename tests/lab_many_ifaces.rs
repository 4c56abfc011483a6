//! One worker, many interfaces: a benchmark (ignored in the normal test run).
//!
//! `sudo KXDP_BENCH_IFACES=250 cargo test --test lab_many_ifaces -- --ignored --nocapture`
//!
//! Three namespaces (`node-many-{n,p,s}`): `KXDP_BENCH_IFACES` (default 250) veth pairs `vbI`
//! (node, matched by kxdp's pattern `vb*`) / `pbI` (pods, `10.A.B.2`), and one pair `vs0`
//! (node) / `ps0` (server). The node has no addresses: routes and permanent neighbours only,
//! so kxdp's node-address map stays empty and nothing waits for ARP. Pod `I` reaches the echo
//! server at its own address `10.98.x.y` (one /32 per pod interface on `ps0`), and a sink
//! `10.97.x.y` routed to a neighbour whose MAC nobody owns (the server namespace drops those
//! frames at layer 2: forwarded load that costs the forwarder, not the echo server).
//!
//! Each phase runs twice in one process, against the same topology: first the **baseline**, the
//! node's kernel forwarding (`ip_forward=1`, no XDP), then **kxdp** (`AfXdp::start`, one worker,
//! pattern `vb*` plus `vs0`), then the baseline again (so drift of the shared machine shows):
//!
//! - idle: the process's CPU (and kxdp's worker's) over 3 s without traffic;
//! - request/response latency at idle: UDP echo from a pod interface (round robin over all of
//!   them) to the server and back, one request every 10 ms (so kxdp's worker is asleep in its
//!   epoll wait before each one): p50, p99;
//! - busy: every pod interface sends to its sink, paced at `KXDP_BENCH_PPS` (default 20 000)
//!   in total, while the same request/response latency is sampled; the process's CPU and the
//!   worker's over that window;
//! - kxdp only: attach time of all links at start and of a link created later; wake-up
//!   latency (one datagram after 30 ms of silence until the worker's rx counter moves) against
//!   a thread blocked in `recv()` on a plain UDP socket (the machine's own wake-up latency).
//!
//! Everything has a deadline (a lost echo counts as lost after 1 s; waits are bounded), and the
//! namespaces are deleted on every exit path.

mod lab;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kxdp_dataplane::conntrack::{Conntrack, CtConfig};
use kxdp_dataplane::io::runner::{AfXdp, RunOptions};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::worker::{IoCounters, Tables};

const NODE: &str = "node-many-n";
const PODS: &str = "node-many-p";
const SRV: &str = "node-many-s";
const ECHO_PORT: u16 = 7;
const SINK_PORT: u16 = 9;
const NODE_SRV_MAC: &str = "02:6b:01:00:00:01";
const SRV_MAC: &str = "02:6b:01:00:00:02";
const NOBODY_MAC: &str = "02:6b:01:00:00:ee";

struct Netns;

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [NODE, PODS, SRV] {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}

/// Pod interface `i`'s address (`host` 2) and the node side's next hop for it (`host` 1).
fn pod(i: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 100 + (i / 200) as u8, (i % 200) as u8, host)
}

/// The echo server's address for pod interface `i`.
fn server(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 98, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// The sink's address for pod interface `i` (forwarded, then dropped at layer 2).
fn sink(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 97, (i / 250) as u8, (i % 250 + 1) as u8)
}

fn node_mac(i: usize) -> String {
    format!("02:6b:00:00:{:02x}:{:02x}", i / 256, i % 256)
}

fn pod_mac(i: usize) -> String {
    format!("02:6b:00:01:{:02x}:{:02x}", i / 256, i % 256)
}

fn batch(ns: &str, cmds: &str) {
    let path = std::env::temp_dir().join(format!("{ns}-{}.batch", std::process::id()));
    std::fs::write(&path, cmds).unwrap();
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-batch", path.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "ip -batch in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pod interfaces `from..to`, with everything both sides need to route them (one `ip -batch`
/// per namespace: a few hundred links in well under a second).
fn add_links(from: usize, to: usize) {
    let (mut node, mut pods, mut srv) = (String::new(), String::new(), String::new());
    for i in from..to {
        node += &format!(
            "link add vb{i} address {} type veth peer name pb{i} address {} netns {PODS}\n\
             link set vb{i} up\n\
             route add {}/24 dev vb{i}\n\
             neigh replace {} lladdr {} dev vb{i} nud permanent\n",
            node_mac(i),
            pod_mac(i),
            pod(i, 0),
            pod(i, 2),
            pod_mac(i),
        );
        pods += &format!(
            "addr add {}/24 dev pb{i}\nlink set pb{i} up\n\
             neigh replace {} lladdr {} dev pb{i} nud permanent\n\
             route add {}/32 via {} dev pb{i}\nroute add {}/32 via {} dev pb{i}\n",
            pod(i, 2),
            pod(i, 1),
            node_mac(i),
            server(i),
            pod(i, 1),
            sink(i),
            pod(i, 1),
        );
        srv += &format!("addr add {}/32 dev ps0\n", server(i));
    }
    batch(NODE, &node);
    batch(PODS, &pods);
    batch(SRV, &srv);
}

fn setup(n: usize) {
    for ns in [NODE, PODS, SRV] {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", ns])
            .status();
        lab::run("ip", &["netns", "add", ns]);
        lab::ip(ns, "link set lo up");
    }
    batch(
        NODE,
        &format!(
            "link add vs0 address {NODE_SRV_MAC} type veth peer name ps0 address {SRV_MAC} netns {SRV}\n\
             link set vs0 up\n\
             route add 10.99.255.0/24 dev vs0\n\
             neigh replace 10.99.255.2 lladdr {SRV_MAC} dev vs0 nud permanent\n\
             neigh replace 10.99.255.3 lladdr {NOBODY_MAC} dev vs0 nud permanent\n\
             route add 10.98.0.0/16 via 10.99.255.2 dev vs0\n\
             route add 10.97.0.0/16 via 10.99.255.3 dev vs0\n"
        ),
    );
    batch(
        SRV,
        &format!(
            "addr add 10.99.255.2/24 dev ps0\nlink set ps0 up\n\
             neigh replace 10.99.255.1 lladdr {NODE_SRV_MAC} dev ps0 nud permanent\n\
             route add 10.100.0.0/14 via 10.99.255.1 dev ps0\n"
        ),
    );
    lab::run(
        "ip",
        &[
            "netns",
            "exec",
            NODE,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
    );
    add_links(0, n);
}

/// CPU ticks (user + system) of this process's thread named `name`.
fn thread_ticks(name: &str) -> u64 {
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            return stat_ticks(&std::fs::read_to_string(t.path().join("stat")).unwrap());
        }
    }
    panic!("no thread {name}");
}

/// `/proc/.../schedstat` of this process's thread named `name`: nanoseconds on a CPU,
/// nanoseconds runnable but waiting for one, time slices.
fn schedstat(name: &str) -> Vec<u64> {
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap();
            return s.split_whitespace().map(|x| x.parse().unwrap()).collect();
        }
    }
    panic!("no thread {name}");
}

/// CPU ticks (user + system) of the whole process, every thread.
fn process_ticks() -> u64 {
    stat_ticks(&std::fs::read_to_string("/proc/self/stat").unwrap())
}

fn stat_ticks(stat: &str) -> u64 {
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// USER_HZ: what /proc's tick counts are in.
const TICKS_PER_SEC: f64 = 100.0;

/// CPU (fraction of a core) of the process and of kxdp's worker (when running) over `f`.
fn cpu_during<T>(worker: bool, f: impl FnOnce() -> T) -> (f64, Option<f64>, T) {
    let w0 = worker.then(|| thread_ticks("kxdp-worker-0"));
    let p0 = process_ticks();
    let t0 = Instant::now();
    let r = f();
    let secs = t0.elapsed().as_secs_f64();
    let p = (process_ticks() - p0) as f64 / TICKS_PER_SEC / secs;
    let w = w0.map(|w0| (thread_ticks("kxdp-worker-0") - w0) as f64 / TICKS_PER_SEC / secs);
    (p, w, r)
}

enum Job {
    /// Request/response samples: (count, gap between requests).
    Echo(usize, Duration),
    /// Worker wake-up samples (count): until the worker's rx counter moves.
    Wake(usize, Arc<IoCounters>),
    /// The same against a thread blocked in recv() on a plain UDP socket.
    WakeBaseline(usize),
}

/// Latencies, and how many requests got no answer within 1 s.
struct Samples {
    v: Vec<Duration>,
    lost: usize,
    /// More JSON fields (`, "name": value`).
    extra: String,
}

impl Samples {
    fn pct(&self, p: f64) -> f64 {
        if self.v.is_empty() {
            return f64::NAN;
        }
        let i = ((self.v.len() as f64 * p).ceil() as usize).clamp(1, self.v.len()) - 1;
        self.v[i].as_secs_f64() * 1e6
    }

    fn json(&self) -> String {
        format!(
            "{{\"p50_us\": {:.0}, \"p99_us\": {:.0}, \"max_us\": {:.0}, \"samples\": {}, \"lost\": {}{}}}",
            self.pct(0.5),
            self.pct(0.99),
            self.pct(1.0),
            self.v.len(),
            self.lost,
            self.extra
        )
    }
}

/// The client: one socket per pod interface, in the pods namespace.
fn client(n: usize, jobs: Receiver<Job>, done: Sender<Samples>) {
    kxdp_kernel::enter_netns(&format!("/var/run/netns/{PODS}")).unwrap();
    let socks: Vec<UdpSocket> = (0..n)
        .map(|i| {
            let s = UdpSocket::bind(SocketAddrV4::new(pod(i, 2), 0)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            s
        })
        .collect();
    let mut next = 0usize;
    let mut seq = 0u64;
    while let Ok(job) = jobs.recv() {
        let mut out = Samples {
            v: Vec::new(),
            lost: 0,
            extra: String::new(),
        };
        match job {
            Job::Echo(count, gap) => {
                for _ in 0..count {
                    std::thread::sleep(gap);
                    let i = next % n;
                    next += 1;
                    seq += 1;
                    let t0 = Instant::now();
                    socks[i]
                        .send_to(&seq.to_be_bytes(), SocketAddrV4::new(server(i), ECHO_PORT))
                        .unwrap();
                    let mut b = [0u8; 16];
                    // Skip late answers to earlier (lost) requests.
                    let got = loop {
                        match socks[i].recv(&mut b) {
                            Ok(8) if b[..8] == seq.to_be_bytes() => break true,
                            Ok(_) => continue,
                            Err(_) => break false,
                        }
                    };
                    if got {
                        out.v.push(t0.elapsed());
                    } else {
                        out.lost += 1;
                    }
                }
            }
            Job::Wake(count, rx) => {
                let s0 = schedstat("kxdp-worker-0");
                for _ in 0..count {
                    std::thread::sleep(Duration::from_millis(30));
                    let i = next % n;
                    next += 1;
                    let before = rx.rx.load(Ordering::Relaxed);
                    let t0 = Instant::now();
                    socks[i]
                        .send_to(b"ping", SocketAddrV4::new(sink(i), SINK_PORT))
                        .unwrap();
                    while rx.rx.load(Ordering::Relaxed) == before {
                        if t0.elapsed() > Duration::from_secs(1) {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    if rx.rx.load(Ordering::Relaxed) == before {
                        out.lost += 1;
                    } else {
                        out.v.push(t0.elapsed());
                    }
                }
                // Where a wake-up's time goes: the worker's time on a CPU and waiting for one.
                let s1 = schedstat("kxdp-worker-0");
                out.extra = format!(
                    ", \"worker_on_cpu_per_wake_us\": {}, \"worker_run_delay_per_wake_us\": {}",
                    (s1[0] - s0[0]) / 1000 / count as u64,
                    (s1[1] - s0[1]) / 1000 / count as u64
                );
            }
            Job::WakeBaseline(count) => {
                let r = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
                r.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
                let to = r.local_addr().unwrap();
                let got = Arc::new(AtomicU64::new(0));
                let g = got.clone();
                let t = std::thread::spawn(move || {
                    let mut b = [0u8; 16];
                    for _ in 0..count {
                        if r.recv(&mut b).is_ok() {
                            g.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
                let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
                for _ in 0..count {
                    std::thread::sleep(Duration::from_millis(30));
                    let before = got.load(Ordering::Relaxed);
                    let t0 = Instant::now();
                    s.send_to(b"ping", to).unwrap();
                    while got.load(Ordering::Relaxed) == before {
                        if t0.elapsed() > Duration::from_secs(1) {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    if got.load(Ordering::Relaxed) == before {
                        out.lost += 1;
                    } else {
                        out.v.push(t0.elapsed());
                    }
                }
                t.join().unwrap();
            }
        }
        out.v.sort();
        done.send(out).unwrap();
    }
}

/// The echo server: one socket on all of the server's addresses.
fn echo(stop: Arc<AtomicBool>) {
    kxdp_kernel::enter_netns(&format!("/var/run/netns/{SRV}")).unwrap();
    let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ECHO_PORT)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut b = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((len, from)) = s.recv_from(&mut b) {
            let _ = s.send_to(&b[..len], from);
        }
    }
}

/// Background load: every pod interface sends to its sink, round robin, paced at `pps` in
/// total while `on` is set; returns the datagrams sent per run on `done`.
fn background(n: usize, pps: u64, on: Arc<AtomicBool>, stop: Arc<AtomicBool>, done: Sender<u64>) {
    kxdp_kernel::enter_netns(&format!("/var/run/netns/{PODS}")).unwrap();
    let socks: Vec<(UdpSocket, SocketAddrV4)> = (0..n)
        .map(|i| {
            let s = UdpSocket::bind(SocketAddrV4::new(pod(i, 2), 0)).unwrap();
            (s, SocketAddrV4::new(sink(i), SINK_PORT))
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        if !on.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let t0 = Instant::now();
        let mut sent = 0u64;
        let mut k = 0usize;
        while on.load(Ordering::Relaxed) {
            let due = (t0.elapsed().as_secs_f64() * pps as f64) as u64;
            while sent < due {
                let (s, to) = &socks[k % n];
                k += 1;
                if s.send_to(&[0u8; 18], to).is_ok() {
                    sent += 1;
                } else {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        done.send(sent).unwrap();
    }
}

struct Bench {
    jobs: Sender<Job>,
    done: Receiver<Samples>,
    load_on: Arc<AtomicBool>,
    load_done: Receiver<u64>,
    samples: usize,
}

impl Bench {
    fn run(&self, job: Job) -> Samples {
        self.jobs.send(job).unwrap();
        self.done.recv_timeout(Duration::from_secs(600)).unwrap()
    }

    /// Idle CPU, idle and busy request/response latency; one JSON object.
    fn phase(&self, worker: bool) -> String {
        let (idle_p, idle_w, ()) =
            cpu_during(worker, || std::thread::sleep(Duration::from_secs(3)));
        let idle = self.run(Job::Echo(self.samples, Duration::from_millis(10)));
        self.load_on.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(500));
        let (busy_p, busy_w, busy) = cpu_during(worker, || {
            self.run(Job::Echo(self.samples, Duration::from_millis(10)))
        });
        self.load_on.store(false, Ordering::Relaxed);
        let sent = self
            .load_done
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        let w = |c: Option<f64>| c.map_or("null".to_string(), |c| format!("{c:.3}"));
        format!(
            "{{\"idle_process_cpu\": {idle_p:.3}, \"idle_worker_cpu\": {}, \"idle_echo\": {}, \"busy_process_cpu\": {busy_p:.3}, \"busy_worker_cpu\": {}, \"busy_echo\": {}, \"busy_sink_datagrams\": {sent}}}",
            w(idle_w),
            idle.json(),
            w(busy_w),
            busy.json(),
        )
    }
}

#[test]
#[ignore = "benchmark: sudo KXDP_BENCH_IFACES=250 cargo test --test lab_many_ifaces -- --ignored --nocapture"]
fn bench_many_interfaces_one_worker() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("KXDP_BENCH_IFACES", 250);
    let pps = env("KXDP_BENCH_PPS", 20_000) as u64;
    let samples = env("KXDP_BENCH_SAMPLES", 300);
    let _cleanup = Netns;
    let t_setup = Instant::now();
    setup(n);
    let setup_ms = t_setup.elapsed().as_secs_f64() * 1e3;

    let stop = Arc::new(AtomicBool::new(false));
    let (jobs, jobs_rx) = channel();
    let (done_tx, done) = channel();
    let client = std::thread::spawn(move || client(n, jobs_rx, done_tx));
    let s = stop.clone();
    let echo = std::thread::spawn(move || echo(s));
    let load_on = Arc::new(AtomicBool::new(false));
    let (load_tx, load_done) = channel();
    let (o, s) = (load_on.clone(), stop.clone());
    let load = std::thread::spawn(move || background(n, pps, o, s, load_tx));
    let bench = Bench {
        jobs,
        done,
        load_on,
        load_done,
        samples,
    };

    let baseline = bench.phase(false);

    // kxdp, from a thread in the node's namespace.
    let (started_tx, started_rx) = channel();
    let (stop_kxdp, stop_kxdp_rx) = channel::<()>();
    let kxdp = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&format!("/var/run/netns/{NODE}")).unwrap();
        let tables: Arc<dyn Tables> = Arc::new(ArcSwap::from_pointee(Snapshot::empty()));
        let ct = Arc::new(Conntrack::new(CtConfig::default(), 1));
        let opts = RunOptions {
            interfaces: vec!["vb*".into(), "vs0".into()],
            workers: 1,
            cpus: vec![],
            xsk: Default::default(),
            backoff: Default::default(),
            mode: Default::default(),
            kernel_port: None,
            node_ports_to: None,
            hold_for_restart: false,
            source_validation: Default::default(),
            tap: None,
        };
        let t0 = Instant::now();
        let afxdp = AfXdp::start(&opts, tables, ct, None).unwrap();
        let started = t0.elapsed();
        assert_eq!(afxdp.attached().len(), n + 1, "every link attached");
        // A link added later.
        let t1 = Instant::now();
        add_links(n, n + 1);
        let created = t1.elapsed();
        while afxdp.attached().len() < n + 2 && t1.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let late = t1.elapsed();
        assert_eq!(afxdp.attached().len(), n + 2, "the late link attached");
        started_tx
            .send((started, created, late, afxdp.counters[0].1.clone()))
            .unwrap();
        let _ = stop_kxdp_rx.recv_timeout(Duration::from_secs(900));
        let t2 = Instant::now();
        let workers = afxdp.stop();
        let stopped = t2.elapsed();
        let balanced = workers
            .iter()
            .all(|w| w.frames_accounted() == w.umem.frame_count() as u64);
        (stopped, balanced)
    });
    let (started, created, late, counters) = started_rx
        .recv_timeout(Duration::from_secs(300))
        .expect("kxdp started");
    let with_kxdp = bench.phase(true);
    let wake = bench.run(Job::Wake(bench.samples / 2, counters));
    let wake_base = bench.run(Job::WakeBaseline(bench.samples / 2));
    stop_kxdp.send(()).unwrap();
    let (stopped, balanced) = kxdp.join().unwrap();

    let baseline_again = bench.phase(false);
    stop.store(true, Ordering::Relaxed);
    drop(bench);
    client.join().unwrap();
    echo.join().unwrap();
    load.join().unwrap();

    println!(
        "{{\"interfaces\": {n}, \"sink_pps\": {pps}, \"setup_ms\": {setup_ms:.0}, \"start_all_attached_ms\": {:.0}, \"late_link_create_ms\": {:.1}, \"late_link_attached_ms\": {:.1}, \"stop_ms\": {:.0}, \"frames_balanced\": {balanced},\n \"baseline\": {baseline},\n \"kxdp\": {with_kxdp},\n \"baseline_again\": {baseline_again},\n \"kxdp_wake\": {},\n \"plain_socket_wake\": {}}}",
        started.as_secs_f64() * 1e3,
        created.as_secs_f64() * 1e3,
        late.as_secs_f64() * 1e3,
        stopped.as_secs_f64() * 1e3,
        wake.json(),
        wake_base.json(),
    );
    assert!(balanced, "every frame accounted for after stop");
}
