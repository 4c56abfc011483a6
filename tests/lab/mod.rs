//! The network-namespace lab: namespaces and veth pairs built with `ip`, torn down on every exit
//! path (the `Lab` guard deletes its namespaces when dropped, also while a failing test unwinds;
//! namespaces left by a test process that was killed are removed by the next `Lab::new`).
//!
//! Namespaces are named `kxdpt-<pid>-<n>-<name>`, so concurrent test binaries never collide.
//! Traffic only flows between namespaces a test created.
#![allow(dead_code)]

pub mod kube_proxy;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

const PREFIX: &str = "kxdpt-";

pub struct Lab {
    netns: Vec<String>,
}

/// Whether lab tests can run here. Prints why not and returns false only where the kernel lacks
/// AF_XDP; without root the lab cannot be built at all, which is a failure, not a skip.
pub fn available(test: &str) -> bool {
    if !kxdp_kernel::afxdp::af_xdp_available() {
        eprintln!("SKIPPED {test}: this kernel has no AF_XDP sockets (EAFNOSUPPORT)");
        return false;
    }
    // SAFETY-free check through the uid of /proc/self.
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "{test}: the lab tests need root (network namespaces, XDP); CI runs them as root"
    );
    true
}

/// Runs a command, panicking with its output when it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip -n NS ARGS...`
pub fn ip(ns: &str, args: &str) -> String {
    let mut a = vec!["-n", ns];
    a.extend(args.split_whitespace());
    run("ip", &a)
}

/// Runs `cmd` (through `sh -c`) inside `ns`.
pub fn sh(ns: &str, cmd: &str) -> String {
    run("ip", &["netns", "exec", ns, "sh", "-c", cmd])
}

impl Lab {
    pub fn new() -> Lab {
        remove_orphans(PREFIX);
        Lab { netns: Vec::new() }
    }

    /// Creates a namespace (loopback up) and returns its name.
    pub fn netns(&mut self, name: &str) -> String {
        let full = format!(
            "{PREFIX}{}-{}-{name}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        assert!(full.len() <= 64);
        run("ip", &["netns", "add", &full]);
        self.netns.push(full.clone());
        ip(&full, "link set lo up");
        full
    }

    /// A veth pair `a` in `ns_a` and `b` in `ns_b`.
    pub fn veth(&self, ns_a: &str, a: &str, ns_b: &str, b: &str) {
        ip(
            ns_a,
            &format!("link add {a} type veth peer name {b} netns {ns_b}"),
        );
        ip(ns_a, &format!("link set {a} up"));
        ip(ns_b, &format!("link set {b} up"));
    }

    pub fn mac(&self, ns: &str, dev: &str) -> [u8; 6] {
        let s = std::fs::read_to_string(format!("/sys/class/net/{dev}/address"));
        // /sys shows the caller's namespace; ask `ip` instead.
        let _ = s;
        let out = ip(ns, &format!("-br link show dev {dev}"));
        let mac = out.split_whitespace().nth(2).expect("mac");
        let mut m = [0u8; 6];
        for (i, p) in mac.split(':').enumerate() {
            m[i] = u8::from_str_radix(p, 16).unwrap();
        }
        m
    }

    /// Path of a namespace for `kxdp_kernel::enter_netns`.
    pub fn path(ns: &str) -> String {
        format!("/var/run/netns/{ns}")
    }

    /// Runs `f` on a new thread inside `ns` and returns its result.
    pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let p = Lab::path(ns);
        std::thread::spawn(move || {
            kxdp_kernel::enter_netns(&p).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.netns.drain(..).rev() {
            delete_netns(&ns);
        }
    }
}

/// Kills what runs inside `ns`, then deletes it (its veths and XDP programs go with it).
pub fn delete_netns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
}

/// Deletes namespaces named `PREFIX<pid>-...` whose test process no longer exists (a test
/// binary killed mid-run).
pub fn remove_orphans(prefix: &str) {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete_netns(&name);
        }
    }
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The XDP program attached to `dev` as `ip link` shows it ("xdp", "xdpgeneric"), if any.
pub fn xdp_on(ns: &str, dev: &str) -> Option<String> {
    let out = ip(ns, &format!("-d link show dev {dev}"));
    out.split_whitespace()
        .find(|w| *w == "xdp" || *w == "xdpgeneric" || *w == "xdpdrv")
        .map(str::to_string)
        .or_else(|| out.contains("prog/xdp").then(|| "xdp".to_string()))
}

/// The lab cluster of `tests/lab/cluster.yaml`: an external client, the node kxdp runs in, two
/// server pods and a client pod, wired with veth pairs.
///
/// ```text
///  ext (192.168.0.100) ── eth0 ═ up0 ── node-a (192.168.0.2; 169.254.1.1 on every vpod)
///                                        ├─ vpod1 ═ eth0  web-1    10.1.0.11
///                                        ├─ vpod2 ═ eth0  web-2    10.1.0.12
///                                        └─ vpod3 ═ eth0  client-1 10.1.0.13
/// ```
///
/// Pods route everything via 169.254.1.1 (the node's side of their veth, as Calico does); the
/// node routes each pod address to its veth.
pub struct Cluster {
    pub lab: Lab,
    pub node: String,
    pub ext: String,
    /// (pod name, namespace, address)
    pub pods: Vec<(&'static str, String, &'static str)>,
}

pub const NODE_IP: &str = "192.168.0.2";
pub const EXT_IP: &str = "192.168.0.100";
pub const PODS: [(&str, &str, &str); 3] = [
    ("web-1", "vpod1", "10.1.0.11"),
    ("web-2", "vpod2", "10.1.0.12"),
    ("client-1", "vpod3", "10.1.0.13"),
];

impl Cluster {
    pub fn build() -> Cluster {
        let mut lab = Lab::new();
        let node = lab.netns("node");
        let ext = lab.netns("ext");
        lab.veth(&node, "up0", &ext, "eth0");
        ip(&node, &format!("addr add {NODE_IP}/24 dev up0"));
        ip(&ext, &format!("addr add {EXT_IP}/24 dev eth0"));
        let mut pods = Vec::new();
        for (name, host_if, addr) in PODS {
            let ns = lab.netns(name);
            lab.veth(&node, host_if, &ns, "eth0");
            ip(&node, &format!("addr add 169.254.1.1/32 dev {host_if}"));
            ip(&node, &format!("route add {addr}/32 dev {host_if}"));
            ip(&ns, &format!("addr add {addr}/32 dev eth0"));
            ip(&ns, "route add 169.254.1.1/32 dev eth0 scope link");
            ip(&ns, "route add default via 169.254.1.1 dev eth0");
            pods.push((name, ns, addr));
        }
        let c = Cluster {
            lab,
            node,
            ext,
            pods,
        };
        c.warm_neighbours();
        c
    }

    pub fn pod(&self, name: &str) -> &str {
        &self.pods.iter().find(|p| p.0 == name).expect("pod").1
    }

    /// Lets the kernels resolve each other's MAC addresses (one datagram each way) so that the
    /// first packets of a test are not spent on neighbour resolution.
    pub fn warm_neighbours(&self) {
        let targets: Vec<String> = PODS
            .iter()
            .map(|p| p.2.to_string())
            .chain([EXT_IP.to_string()])
            .collect();
        Lab::in_ns(&self.node, move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for t in &targets {
                let _ = s.send_to(b"warm", format!("{t}:9"));
            }
        });
        for (_, ns, _) in &self.pods {
            Lab::in_ns(ns, || {
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                let _ = s.send_to(b"warm", "169.254.1.1:9");
            });
        }
        Lab::in_ns(&self.ext, || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let _ = s.send_to(b"warm", format!("{NODE_IP}:9"));
        });
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Servers in a pod: TCP 8080 writes "PEER-IP:PORT\n" then reads until EOF and answers with the
/// byte count ("N\n"); UDP 5353 answers every datagram with "PEER-IP:PORT". Stopped on drop.
pub struct Servers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// One accepted connection of a lab server: writes `greeting` and a newline, counts what the
/// client sends until it closes (or `stop`), then writes the count and a newline.
pub fn serve_greet_and_count(
    mut s: std::net::TcpStream,
    greeting: &str,
    read_timeout_s: u64,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(read_timeout_s)));
    let _ = s.write_all(format!("{greeting}\n").as_bytes());
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n as u64,
        }
    }
    let _ = s.write_all(format!("{total}\n").as_bytes());
}

/// A TCP server bound to `bind` inside the namespace at `netns_path`, in a thread, answering
/// each connection with `serve_greet_and_count` (the greeting: `greet(peer)`) until `stop`.
/// Returns once it listens.
pub fn spawn_greet_and_count_server(
    netns_path: String,
    bind: String,
    greet: impl Fn(std::net::SocketAddr) -> String + Send + 'static,
    read_timeout_s: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&netns_path).expect("setns");
        let l = std::net::TcpListener::bind(&bind).expect("bind the TCP server");
        l.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((s, peer)) => {
                    let (st, greeting) = (stop.clone(), greet(peer));
                    std::thread::spawn(move || {
                        serve_greet_and_count(s, &greeting, read_timeout_s, &st)
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("TCP server up");
    t
}

impl Servers {
    pub fn start(ns: &str, addr: &str) -> Servers {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        threads.push(spawn_greet_and_count_server(
            Lab::path(ns),
            format!("{addr}:8080"),
            |peer| peer.to_string(),
            60,
            stop.clone(),
        ));
        let (p, a, st) = (Lab::path(ns), addr.to_string(), stop.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        threads.push(std::thread::spawn(move || {
            kxdp_kernel::enter_netns(&p).unwrap();
            let s = std::net::UdpSocket::bind(format!("{a}:5353")).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 2048];
            while !st.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = s.recv_from(&mut buf) {
                    let _ = s.send_to(peer.to_string().as_bytes(), peer);
                }
            }
        }));
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        Servers { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `kxdp run` inside a namespace; SIGTERM and reaped on drop (SIGKILL if it does not exit).
pub struct Kxdp {
    pub child: std::process::Child,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Kxdp {
    pub fn start(ns: &str, config: &str, state: &str) -> Kxdp {
        Kxdp::start_with_env(ns, config, state, &[])
    }

    /// `start` with extra environment variables.
    pub fn start_with_env(ns: &str, config: &str, state: &str, env: &[(&str, &str)]) -> Kxdp {
        Kxdp::start_bin(ns, config, state, &Kxdp::bin(), env)
    }

    /// The binary to run: benchmarks run a release build through `KXDP_BIN`; tests, the
    /// binary cargo built.
    pub fn bin() -> String {
        std::env::var("KXDP_BIN").unwrap_or(env!("CARGO_BIN_EXE_kxdp").into())
    }

    /// `start_with_env` with the binary at `bin`.
    pub fn start_bin(ns: &str, config: &str, state: &str, bin: &str, env: &[(&str, &str)]) -> Kxdp {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, bin, "run"])
            .args([
                "--config",
                config,
                "--state",
                state,
                "--no-admin",
                "--no-takeover",
            ])
            .envs(env.iter().copied());
        Kxdp::spawn(cmd, Duration::from_secs(20))
    }

    /// Spawns `cmd` (a `kxdp run`, possibly behind `ip netns exec` or `nice`) with its log
    /// collected, waits (bounded by `start_timeout`) until it says it forwards, then for the
    /// control loop's first tables.
    pub fn spawn(mut cmd: Command, start_timeout: Duration) -> Kxdp {
        use std::io::BufRead;
        let mut child = cmd
            // The sync's debug line "published" lets a test wait until a state it wrote is
            // in the tables (`KxdpNode::published`); the dataplane's info lines name the
            // interfaces attached and released.
            .env(
                "RUST_LOG",
                "warn,kxdp_control::run=info,kxdp_control::sync=debug,kxdp_dataplane=info",
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kxdp run");
        let err = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (l2, (tx, rx)) = (log.clone(), std::sync::mpsc::channel());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if line.contains("forwarding on") {
                    let _ = tx.send(());
                }
                l2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let mut k = Kxdp { child, stderr: log };
        if rx.recv_timeout(start_timeout).is_err() {
            let _ = k.child.kill();
            panic!("kxdp run did not start:\n{}", k.stderr.lock().unwrap());
        }
        // Tables published (the first sync) before traffic: wait for the control loop.
        std::thread::sleep(Duration::from_millis(1500));
        k
    }

    /// SIGTERM, then wait (bounded).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Kxdp {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// One UDP request from `ns` to `to` over a new connected socket (a new connection for kxdp;
/// datagrams from any other source, an un-NATed reply, are not delivered): the answer, or the
/// error after `tries` sends, each waiting `wait` for the answer.
pub fn udp_ask(ns: &str, to: &str, tries: usize, wait: Duration) -> std::io::Result<String> {
    use std::io::ErrorKind;
    let to = to.to_string();
    Lab::in_ns(ns, move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        s.connect(&to)?;
        s.set_read_timeout(Some(wait))?;
        let mut buf = [0u8; 256];
        for _ in 0..tries {
            s.send(b"hello")?;
            match s.recv(&mut buf) {
                Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
        Err(ErrorKind::TimedOut.into())
    })
}

/// The lab's config and state paths.
pub fn lab_files() -> (String, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab");
    (format!("{dir}/config.yaml"), format!("{dir}/cluster.yaml"))
}

/// `kxdp ARGS` inside the namespace `ns`.
pub fn kxdp_in(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_kxdp")])
        .args(args);
    c
}

/// The last JSON object line of a command's output (`kxdp pcap send|sink` print one).
pub fn last_json(out: &[u8]) -> serde_json::Value {
    let s = String::from_utf8_lossy(out);
    let line = s.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {s}"))
}
