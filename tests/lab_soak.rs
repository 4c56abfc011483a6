//! The soak benchmark (run by `benches/soak.sh`; ignored in the normal test run): kxdp on both
//! nodes of the two-node CNI lab (tests/cni/mod.rs) for `KXDP_SOAK_SECS` (1800) under continuous
//! traffic while the cluster keeps changing, watching for leaks and for requests that fail.
//!
//! - Sources: each node's kxdp reads a fake API server (tests/fake_apiserver) of its own,
//!   listening on the node's loopback (one per node: the lab's nodes share no address the test
//!   process could listen on for both); the test writes the same objects to both.
//! - Traffic, each a loop recording every outcome: HTTP (a new connection per request) to nginx
//!   in two pods through a ClusterIP from a client pod on each node and through a NodePort of
//!   node-a from the external host (masqueraded); TCP request/response and UDP to a Service
//!   whose endpoints are the pods that come and go, from both client pods.
//! - Changes: a pod created every few seconds, alternately on each node, listed ready, then
//!   terminating, then removed from the Service and deleted (the order kubelet and the
//!   EndpointSlice controller follow); a NetworkPolicy that admits the client pods to the
//!   Service's pods replaced every 10 s (three versions, one of them none); a Service created
//!   and deleted; every watch of both API servers cut every 15 s (kxdp resumes them), and once
//!   answered with 410 Gone (kxdp lists again).
//! - One takeover of node-b's kxdp at a third of the run, one SIGKILL of node-a's and a new
//!   kxdp at half (both nodes keep their conntrack table in a state file on a tmpfs).
//! - Both nodes' configuration is the lab's, with `KXDP_SOAK_CONFIG` (YAML) appended when set,
//!   e.g. `podInterception: {mode: xdp}`.
//! - Sampled every `KXDP_SOAK_SAMPLE_SECS` (5; 2 in quick runs) from each node's `/metrics`
//!   and the XDP program's maps (bpftool): RSS, open descriptors, conntrack entries, UMEM
//!   frames in use (`kxdp_umem_frames - kxdp_umem_free_frames`), entries of the program's hash
//!   maps. Slopes by least squares over each process's life after a warm-up.
//! - Drops by reason (`kxdp_drops_total`) per process, and around each failure outside the gap.
//!
//! Output (`KXDP_SOAK_OUT`, target/soak): `samples.csv`, `requests.csv` (failures only),
//! `kxdp-node-*.log`, and the report `soak.md` (without `KXDP_SOAK_OUT`, also `target/soak.md`). Fails when a
//! request failed outside the SIGKILL gap or a kxdp logged an error it should not have.
//! Method and figures: docs/benchmarks.md, "Soak".

mod cni;
mod fake_apiserver;
mod lab;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cni::{sa, Lab};
use fake_apiserver::FakeApiServer;
use lab::Kxdp;
use serde_json::Value;

const HTTP_PORT: u16 = 8081;
const HTTP_IP: [u8; 4] = [172, 30, 0, 20];
const HTTP_NODE_PORT: u16 = 30020;
const WEB_IP: [u8; 4] = [172, 30, 0, 10];
const METRICS: &str = "127.0.0.1:10249";

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: not a whole number")),
        Err(_) => default,
    }
}

/// Seconds since the run started.
fn since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// The API servers
// ---------------------------------------------------------------------------------------------

type Key = (String, String, String);

/// One fake API server per node (on the node's loopback), written in step.
struct Api {
    servers: Vec<FakeApiServer>,
    current: BTreeMap<Key, Value>,
}

impl Api {
    /// Makes the servers hold exactly `docs` (YAML documents): changed objects written,
    /// missing ones deleted, equal ones left alone.
    fn set(&mut self, docs: &str) {
        let mut want = BTreeMap::new();
        for de in yaml_serde::Deserializer::from_str(docs) {
            let v: Value = serde::Deserialize::deserialize(de).expect("lab objects");
            if v.is_null() {
                continue;
            }
            let key = (
                v["kind"].as_str().unwrap().to_string(),
                v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                v["metadata"]["name"].as_str().unwrap().to_string(),
            );
            want.insert(key, v);
        }
        for (k, v) in &want {
            if self.current.get(k) != Some(v) {
                for s in &self.servers {
                    s.apply(v.clone());
                }
            }
        }
        for k in self.current.keys() {
            if !want.contains_key(k) {
                for s in &self.servers {
                    s.delete(&k.0, &k.1, &k.2);
                }
            }
        }
        self.current = want;
    }

    fn drop_watches(&self) {
        for s in &self.servers {
            s.drop_watches();
        }
    }

    fn send_gone(&self) {
        for s in &self.servers {
            s.send_gone();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster objects
// ---------------------------------------------------------------------------------------------

/// The changing parts of the cluster besides the pods.
#[derive(Default)]
struct Toggles {
    /// 0: no policy; 1: the client pods admitted to app=web; 2: the same, to the two ports only.
    policy: u32,
    extra_service: bool,
}

fn objects(lab: &Lab, t: &Toggles) -> String {
    let mut s = lab.cluster_objects();
    s += &lab.service("web", 10, "web", None, false);
    let nginx: Vec<String> = lab
        .pods
        .iter()
        .filter(|p| p.labels.iter().any(|(k, v)| k == "app" && v == "nginx"))
        .map(|p| {
            format!(
                "- {{addresses: [\"{}\"], conditions: {{ready: true}}, nodeName: {}}}\n",
                p.ip4, lab.nodes[p.node].name
            )
        })
        .collect();
    s += &format!(
        "apiVersion: v1
kind: Service
metadata: {{name: http, namespace: lab}}
spec:
  type: NodePort
  ipFamilies: [IPv4]
  clusterIP: {ip}
  clusterIPs: [{ip}]
  selector: {{app: nginx}}
  ports:
  - {{name: http, port: 80, targetPort: {HTTP_PORT}, protocol: TCP, nodePort: {HTTP_NODE_PORT}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: http-ipv4
  namespace: lab
  labels: {{kubernetes.io/service-name: http}}
addressType: IPv4
ports:
- {{name: http, port: {HTTP_PORT}, protocol: TCP}}
endpoints:
{}---
",
        nginx.concat(),
        ip = IpAddr::from(HTTP_IP),
    );
    if t.extra_service {
        s += &lab.service("extra", 30, "web", None, false);
    }
    let ports = if t.policy == 2 {
        "    ports: [{protocol: TCP, port: 8080}, {protocol: UDP, port: 5353}]\n"
    } else {
        ""
    };
    if t.policy > 0 {
        s += &format!(
            "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: web-clients, namespace: lab}}
spec:
  podSelector: {{matchLabels: {{app: web}}}}
  policyTypes: [Ingress]
  ingress:
  - from: [{{podSelector: {{matchLabels: {{app: client}}}}}}]
{ports}---
"
        );
    }
    s
}

// ---------------------------------------------------------------------------------------------
// nginx in a pod
// ---------------------------------------------------------------------------------------------

struct Nginx(Child);

impl Nginx {
    fn start(ns: &str, dir: &Path) -> Nginx {
        std::fs::create_dir_all(dir).unwrap();
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
             server {{ listen {HTTP_PORT}; location / {{ default_type text/plain; return 200 \"soak\\n\"; }} }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "nginx", "-c"])
            .arg(dir.join("nginx.conf"))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx");
        let up = lab::wait_until(Duration::from_secs(10), || {
            !lab::sh(ns, &format!("ss -Hltn sport = :{HTTP_PORT}"))
                .trim()
                .is_empty()
        });
        assert!(up, "nginx in {ns} does not listen");
        Nginx(child)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Traffic
// ---------------------------------------------------------------------------------------------

/// One request's outcome: when it started (s), which load, the error if it failed.
#[derive(Clone)]
struct Outcome {
    at: f64,
    load: &'static str,
    error: Option<String>,
}

type Outcomes = Arc<Mutex<Vec<Outcome>>>;

/// One HTTP/1.1 GET on a new connection, answered 200.
fn http_get(to: SocketAddr) -> Result<(), String> {
    let mut s =
        TcpStream::connect_timeout(&to, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    if body.starts_with("HTTP/1.1 200") && body.ends_with("soak\n") {
        Ok(())
    } else {
        Err(format!("answer {:?}", body.lines().next()))
    }
}

/// The lab servers' TCP exchange (tests/cni/mod.rs): the pod's line, 1000 bytes, their count.
fn tcp_exchange(to: SocketAddr) -> Result<(), String> {
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    (&s).write_all(&[0x5a; 1000]).map_err(|e| e.to_string())?;
    s.shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let mut count = String::new();
    r.read_line(&mut count).map_err(|e| e.to_string())?;
    if line.starts_with("churn-") && count.trim() == "1000" {
        Ok(())
    } else {
        Err(format!("answer {line:?} {count:?}"))
    }
}

/// One UDP exchange over a connected socket, up to 3 tries of a second.
fn udp_exchange(to: SocketAddr) -> Result<(), String> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    s.connect(to).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 256];
    for _ in 0..3 {
        s.send(b"soak").map_err(|e| e.to_string())?;
        if let Ok(n) = s.recv(&mut buf) {
            return if buf[..n].starts_with(b"churn-") {
                Ok(())
            } else {
                Err(format!("answer {:?}", String::from_utf8_lossy(&buf[..n])))
            };
        }
    }
    Err("no answer in 3 tries".into())
}

type Request = fn(SocketAddr) -> Result<(), String>;

/// One traffic loop: its name, the namespace it runs in, one request every `period` to `to`.
struct Load {
    name: &'static str,
    ns: String,
    period: Duration,
    f: Request,
    to: SocketAddr,
}

/// Runs `l` until `stop`, recording every outcome.
fn load(l: Load, t0: Instant, stop: Arc<AtomicBool>, out: Outcomes) -> std::thread::JoinHandle<()> {
    let Load {
        name,
        ns,
        period,
        f,
        to,
    } = l;
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&path).expect("setns");
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let at = since(t0);
            let error = f(to).err();
            out.lock().unwrap().push(Outcome {
                at,
                load: name,
                error,
            });
            next += period;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Samples
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct Sample {
    at: f64,
    node: &'static str,
    pid: u32,
    rss_mib: f64,
    fds: f64,
    conntrack: f64,
    umem_in_use: f64,
    bpf_entries: f64,
    /// `kxdp_drops_total` by reason (cumulative over the process's life).
    drops: BTreeMap<String, f64>,
}

/// `kxdp_drops_total{reason="R"} N` lines: R → N.
fn drops(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("kxdp_drops_total{reason=\"")?;
            let (reason, n) = rest.split_once("\"} ")?;
            Some((reason.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// Drops by reason between two samples of one process, the reasons that rose.
fn drops_between(a: &Sample, b: &Sample) -> String {
    let rose: Vec<String> = b
        .drops
        .iter()
        .filter_map(|(r, n)| {
            let d = n - a.drops.get(r).copied().unwrap_or(0.0);
            (d > 0.0).then(|| format!("{r} {d}"))
        })
        .collect();
    if rose.is_empty() {
        "none".into()
    } else {
        rose.join(", ")
    }
}

/// `/metrics` of the kxdp in `ns` (its metrics address on the node's loopback).
fn scrape(ns: &str) -> Option<String> {
    cni::in_ns(ns, || {
        let mut s =
            TcpStream::connect_timeout(&METRICS.parse().unwrap(), Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        Some(body)
    })
}

/// The sum of a metric's samples (every label set).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ' | b'{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn bpftool(ns: &str, args: &str) -> Option<Value> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "bpftool", "-j"])
        .args(args.split_whitespace())
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// Entries of the hash maps of the XDP program on the node's eth0 (the masquerade-reply and
/// node-address maps; arrays and the socket map have a fixed size).
fn bpf_entries(ns: &str) -> f64 {
    let Some(net) = bpftool(ns, "net show dev eth0") else {
        return f64::NAN;
    };
    let Some(prog) = net[0]["xdp"][0]["id"].as_u64() else {
        return f64::NAN;
    };
    let Some(p) = bpftool(ns, &format!("prog show id {prog}")) else {
        return f64::NAN;
    };
    let mut n = 0.0;
    for id in p["map_ids"].as_array().into_iter().flatten() {
        let Some(m) = bpftool(ns, &format!("map show id {id}")) else {
            continue;
        };
        if m["type"].as_str().is_some_and(|t| t.contains("hash")) {
            if let Some(d) = bpftool(ns, &format!("map dump id {id}")) {
                n += d.as_array().map_or(0, |a| a.len()) as f64;
            }
        }
    }
    n
}

fn sample(node: &'static str, ns: &str, pid: u32, at: f64) -> Option<Sample> {
    let m = scrape(ns)?;
    Some(Sample {
        at,
        node,
        pid,
        rss_mib: metric(&m, "process_resident_memory_bytes") / 1048576.0,
        fds: metric(&m, "process_open_fds"),
        conntrack: metric(&m, "kxdp_conntrack_entries"),
        umem_in_use: metric(&m, "kxdp_umem_frames") - metric(&m, "kxdp_umem_free_frames"),
        bpf_entries: bpf_entries(ns),
        drops: drops(&m),
    })
}

/// Least-squares slope of (x, y), per hour of x in seconds.
fn slope_per_hour(points: &[(f64, f64)]) -> Option<f64> {
    let pts: Vec<_> = points.iter().filter(|p| p.1.is_finite()).collect();
    if pts.len() < 3 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx * 3600.0)
}

// ---------------------------------------------------------------------------------------------
// kxdp
// ---------------------------------------------------------------------------------------------

struct Node {
    name: &'static str,
    ns: String,
    config: PathBuf,
    kubeconfig: PathBuf,
    takeover: PathBuf,
    kxdp: Kxdp,
    /// Logs of the processes that ended.
    old_logs: String,
}

/// `kxdp run` in `ns` against its API server, with a takeover socket.
fn spawn_kxdp(ns: &str, config: &Path, kubeconfig: &Path, takeover: &Path) -> Kxdp {
    let bin = Kxdp::bin();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, &bin, "run", "--no-admin"])
        .arg("--config")
        .arg(config)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--takeover-socket")
        .arg(takeover);
    Kxdp::spawn(cmd, Duration::from_secs(30))
}

impl Node {
    fn spawn(&self) -> Kxdp {
        spawn_kxdp(&self.ns, &self.config, &self.kubeconfig, &self.takeover)
    }

    fn log(&self) -> String {
        self.old_logs.clone() + &self.kxdp.stderr.lock().unwrap()
    }
}

/// A tmpfs for the state files, unmounted on drop (before the lab's directory goes).
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Warnings and errors a soak expects (the events it causes): everything else is reported and
/// fails the run.
const EXPECTED: &[&str] = &[
    // A watch cut mid-stream: kube-rs says so, and kxdp resumes the watch.
    "eof in poll",
    // The 410 Gone: each watch of the source fails once and lists again.
    "too old resource version",
    // The machine had too few free huge pages for the whole state file (an environment
    // warning: other processes hold them).
    "of it in huge pages (lookups will walk page tables",
];

/// A log line's message with numbers and addresses blanked, to group lines.
fn template(line: &str) -> String {
    let msg = line
        .split_once(" WARN ")
        .or_else(|| line.split_once(" ERROR "));
    let msg = msg.map_or(line, |m| m.1);
    msg.chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect::<String>()
        .chars()
        .take(160)
        .collect()
}

#[test]
#[ignore = "the soak benchmark: benches/soak.sh runs it"]
fn soak() {
    let secs = env_u64("KXDP_SOAK_SECS", 1800);
    let sample_every = Duration::from_secs(env_u64(
        "KXDP_SOAK_SAMPLE_SECS",
        if secs < 300 { 2 } else { 5 },
    ));
    let out_dir = PathBuf::from(
        std::env::var("KXDP_SOAK_OUT")
            .unwrap_or(concat!(env!("CARGO_MANIFEST_DIR"), "/target/soak").into()),
    );
    std::fs::create_dir_all(&out_dir).unwrap();

    let mut lab = Lab::build("soak");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-b", "client-b", &[("app", "client")]);
    lab.add_pod("node-a", "nginx-a", &[("app", "nginx")]);
    lab.add_pod("node-b", "nginx-b", &[("app", "nginx")]);
    lab.add_pod("node-a", "churn-0", &[("app", "web")]);
    lab.add_pod("node-b", "churn-1", &[("app", "web")]);
    lab.warm_neighbours();
    let _nginx: Vec<Nginx> = ["nginx-a", "nginx-b"]
        .iter()
        .map(|p| Nginx::start(&lab.pod(p).ns, &lab.dir.path().join(p)))
        .collect();

    let run = lab.dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    lab::run(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "huge=within_size",
            "kxdp-soak",
            run.to_str().unwrap(),
        ],
    );
    // In huge pages, as the DaemonSet has it (`kxdp prepare`): otherwise kxdp warns at start.
    let _tmpfs = Tmpfs(run.clone());

    let mut toggles = Toggles::default();
    let servers = ["node-a", "node-b"]
        .iter()
        .map(|n| cni::in_ns(&lab.node(n).ns, FakeApiServer::start))
        .collect();
    let mut api = Api {
        servers,
        current: BTreeMap::new(),
    };
    api.set(&objects(&lab, &toggles));

    let mut nodes: Vec<Node> = Vec::new();
    for name in ["node-a", "node-b"] {
        let dir = lab.dir.path().join(format!("kxdp-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = lab
            .kxdp_config(name, false)
            .replace(
                "conntrack: {stateFile: \"\"}",
                &format!(
                    "conntrack: {{stateFile: \"{}\"}}",
                    run.join(name).join("conntrack").display()
                ),
            )
            .replace(
                "metricsBindAddress: \"\"",
                &format!("metricsBindAddress: \"{METRICS}\""),
            )
            + &std::env::var("KXDP_SOAK_CONFIG").map_or(String::new(), |c| c + "\n");
        std::fs::create_dir_all(run.join(name)).unwrap();
        std::fs::write(dir.join("config.yaml"), config).unwrap();
        let server = &api.servers[nodes.len()];
        server.write_kubeconfig(&dir.join("kubeconfig"));
        let ns = lab.node(name).ns.clone();
        let (config, kubeconfig) = (dir.join("config.yaml"), dir.join("kubeconfig"));
        let takeover = dir.join("takeover.sock");
        let kxdp = spawn_kxdp(&ns, &config, &kubeconfig, &takeover);
        nodes.push(Node {
            name,
            ns,
            config,
            kubeconfig,
            takeover,
            kxdp,
            old_logs: String::new(),
        });
    }
    lab.warm_neighbours();

    // Traffic.
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Outcomes = Arc::default();
    let (ca, cb) = (
        lab.pod("client-a").ns.clone(),
        lab.pod("client-b").ns.clone(),
    );
    let http = sa(IpAddr::from(HTTP_IP), 80);
    let web_tcp = sa(IpAddr::from(WEB_IP), 80);
    let web_udp = sa(IpAddr::from(WEB_IP), 53);
    let node_port = sa(lab.node("node-a").ip4, HTTP_NODE_PORT);
    let ms = Duration::from_millis;
    let l = |name, ns: &String, period, f: Request, to| Load {
        name,
        ns: ns.clone(),
        period,
        f,
        to,
    };
    let loads = vec![
        l("http ClusterIP from node-a", &ca, ms(100), http_get, http),
        l("http ClusterIP from node-b", &cb, ms(100), http_get, http),
        l(
            "http NodePort (node-a) from outside",
            &lab.ext,
            ms(200),
            http_get,
            node_port,
        ),
        l(
            "tcp to churned pods from node-a",
            &ca,
            ms(200),
            tcp_exchange,
            web_tcp,
        ),
        l(
            "tcp to churned pods from node-b",
            &cb,
            ms(200),
            tcp_exchange,
            web_tcp,
        ),
        l(
            "udp to churned pods from node-a",
            &ca,
            ms(100),
            udp_exchange,
            web_udp,
        ),
        l(
            "udp to churned pods from node-b",
            &cb,
            ms(100),
            udp_exchange,
            web_udp,
        ),
    ];
    let names: Vec<&'static str> = loads.iter().map(|l| l.name).collect();
    let threads: Vec<_> = loads
        .into_iter()
        .map(|l| load(l, t0, stop.clone(), outcomes.clone()))
        .collect();

    // Events.
    let end = Duration::from_secs(secs);
    let takeover_at = end / 3;
    let kill_at = end / 2;
    let mut events: Vec<(f64, String)> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut kill_window: Option<(f64, f64)> = None;
    let mut took_over = false;
    let mut next_sample = Duration::ZERO;
    let mut next_churn = Duration::from_secs(3);
    let mut next_policy = Duration::from_secs(10);
    let mut next_service = Duration::from_secs(7);
    let mut next_watch_cut = Duration::from_secs(15);
    let mut gone_sent = false;
    let mut churn_seq = 2u32;
    // Churned pods: name → (phase, since); phases: 0 ready, 1 terminating, 2 removed.
    let mut churn: BTreeMap<String, (u8, Duration)> = BTreeMap::new();
    churn.insert("churn-0".into(), (0, Duration::ZERO));
    churn.insert("churn-1".into(), (0, Duration::ZERO));
    let (mut pods_created, mut pods_deleted, mut cuts, mut changes) = (0u32, 0u32, 0u32, 0u32);

    while t0.elapsed() < end {
        let now = t0.elapsed();
        if now >= next_sample {
            for n in &nodes {
                if let Some(s) = sample(n.name, &n.ns, n.kxdp.child.id(), since(t0)) {
                    samples.push(s);
                }
            }
            next_sample += sample_every;
        }
        let mut changed = false;
        if now >= next_churn {
            // Each pod: ready for ~12 s, terminating 2 s, out of the Service 2 s, then deleted.
            for (name, (phase, at)) in churn.clone() {
                let age = now.saturating_sub(at);
                let i = lab.pods.iter().position(|p| p.name == name).unwrap();
                match phase {
                    0 if age >= Duration::from_secs(12) => {
                        lab.pods[i].terminating = true;
                        churn.insert(name, (1, now));
                    }
                    1 if age >= Duration::from_secs(2) => {
                        lab.pods[i].labels = vec![("app".into(), "leaving".into())];
                        churn.insert(name, (2, now));
                    }
                    2 if age >= Duration::from_secs(2) => {
                        lab.delete_pod(&name);
                        churn.remove(&name);
                        pods_deleted += 1;
                    }
                    _ => {}
                }
            }
            let node = if churn_seq % 2 == 0 {
                "node-a"
            } else {
                "node-b"
            };
            let name = format!("churn-{churn_seq}");
            churn_seq += 1;
            lab.add_pod(node, &name, &[("app", "web")]);
            cni::warm(&lab.pod(&name).ns, &[IpAddr::from(lab.node(node).ip4)]);
            churn.insert(name, (0, now));
            pods_created += 1;
            changed = true;
            next_churn += Duration::from_secs(4);
        }
        if now >= next_policy {
            toggles.policy = (toggles.policy + 1) % 3;
            changes += 1;
            changed = true;
            next_policy += Duration::from_secs(10);
        }
        if now >= next_service {
            toggles.extra_service = !toggles.extra_service;
            changes += 1;
            changed = true;
            next_service += Duration::from_secs(7);
        }
        if changed {
            api.set(&objects(&lab, &toggles));
        }
        if now >= next_watch_cut {
            if !gone_sent && now >= end / 4 {
                api.send_gone();
                gone_sent = true;
                events.push((since(t0), "every watch answered 410 Gone".into()));
            } else {
                api.drop_watches();
            }
            cuts += 1;
            next_watch_cut += Duration::from_secs(15);
        }
        if !took_over && now >= takeover_at {
            let at = since(t0);
            let b = &mut nodes[1];
            let successor = b.spawn();
            let old = std::mem::replace(&mut b.kxdp, successor);
            let mut old = old;
            let exited = lab::wait_until(Duration::from_secs(15), || {
                matches!(old.child.try_wait(), Ok(Some(_)))
            });
            b.old_logs += &old.stderr.lock().unwrap();
            drop(old);
            events.push((
                at,
                format!(
                    "takeover of node-b's kxdp (the old one exited by itself: {exited}; took {:.1} s)",
                    since(t0) - at
                ),
            ));
            took_over = true;
        }
        if kill_window.is_none() && now >= kill_at {
            let at = since(t0);
            let a = &mut nodes[0];
            let _ = a.kxdp.child.kill();
            let _ = a.kxdp.child.wait();
            a.old_logs += &a.kxdp.stderr.lock().unwrap();
            a.kxdp = a.spawn();
            // `Kxdp::spawn` returns once the new one forwards and has its first tables.
            let ready = since(t0);
            kill_window = Some((at, ready));
            events.push((
                at,
                format!(
                    "SIGKILL of node-a's kxdp; the new one forwarding with its tables {:.1} s later",
                    ready - at
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let total = since(t0);
    for n in &nodes {
        if let Some(s) = sample(n.name, &n.ns, n.kxdp.child.id(), total) {
            samples.push(s);
        }
    }
    let logs: Vec<(String, String)> = nodes
        .iter()
        .map(|n| (n.name.to_string(), n.log()))
        .collect();
    for (name, log) in &logs {
        std::fs::write(out_dir.join(format!("kxdp-{name}.log")), log).unwrap();
    }
    drop(nodes);

    // Requests.
    let outcomes = outcomes.lock().unwrap().clone();
    // A request that started up to its own timeout (8 s) before the kill, or before the new
    // kxdp was forwarding (plus 2 s for its neighbours and the first retries), is in the gap.
    let in_gap = |at: f64| kill_window.is_some_and(|(k, r)| at >= k - 8.0 && at <= r + 2.0);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "# Soak\n\n{:.0} s on the two-node CNI lab (sampled every {} s), binary {}, finished {}.\n",
        total,
        sample_every.as_secs(),
        Kxdp::bin(),
        lab::run("date", &["-u", "+%Y-%m-%dT%H:%MZ"]).trim()
    );
    let _ = writeln!(
        report,
        "Changes: {pods_created} pods created and {pods_deleted} deleted, {changes} Service and NetworkPolicy changes, {cuts} watch cuts.\n\nEvents:\n"
    );
    for (at, e) in &events {
        let _ = writeln!(report, "- {at:.1} s: {e}");
    }
    let _ = writeln!(
        report,
        "\n## Requests\n\n| load | requests | answered | failed in the SIGKILL gap | failed otherwise |\n| --- | ---: | ---: | ---: | ---: |"
    );
    let mut unexpected = Vec::new();
    let mut gap_failures: Vec<f64> = Vec::new();
    for name in &names {
        let mine: Vec<&Outcome> = outcomes.iter().filter(|o| o.load == *name).collect();
        let ok = mine.iter().filter(|o| o.error.is_none()).count();
        let gap: Vec<&&Outcome> = mine
            .iter()
            .filter(|o| o.error.is_some() && in_gap(o.at))
            .collect();
        let other: Vec<&&Outcome> = mine
            .iter()
            .filter(|o| o.error.is_some() && !in_gap(o.at))
            .collect();
        gap_failures.extend(gap.iter().map(|o| o.at));
        unexpected.extend(
            other
                .iter()
                .map(|o| format!("{:.1} s {}: {}", o.at, o.load, o.error.as_deref().unwrap())),
        );
        let _ = writeln!(
            report,
            "| {name} | {} | {ok} | {} | {} |",
            mine.len(),
            gap.len(),
            other.len()
        );
    }
    let failed: String = outcomes
        .iter()
        .filter(|o| o.error.is_some())
        .map(|o| {
            format!(
                "{:.3},{},{}\n",
                o.at,
                o.load,
                o.error.as_deref().unwrap().replace(',', ";")
            )
        })
        .collect();
    std::fs::write(
        out_dir.join("requests.csv"),
        format!("at,load,error\n{failed}"),
    )
    .unwrap();
    if let Some((k, r)) = kill_window {
        // Per load that failed in the gap: the first request started after the kill that was
        // answered (a failing request blocks its loop for its timeout, so the failures alone
        // understate the gap).
        let back: Vec<String> = names
            .iter()
            .filter(|n| {
                outcomes
                    .iter()
                    .any(|o| o.load == **n && o.error.is_some() && in_gap(o.at))
            })
            .filter_map(|n| {
                let t = outcomes
                    .iter()
                    .filter(|o| o.load == *n && o.error.is_none() && o.at >= k)
                    .map(|o| o.at)
                    .fold(f64::MAX, f64::min);
                (t < f64::MAX)
                    .then(|| format!("{n}: answered again from {:.1} s after the kill", t - k))
            })
            .collect();
        if !back.is_empty() {
            let _ = writeln!(report, "\n{}.", back.join("; "));
        }
        let (first, last) = gap_failures
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), t| (a.min(*t), b.max(*t)));
        let _ = writeln!(
            report,
            "\nSIGKILL gap: the kill at {k:.1} s, the new kxdp forwarding at {r:.1} s ({:.1} s); {}.",
            r - k,
            if gap_failures.is_empty() {
                "no request failed".to_string()
            } else {
                format!(
                    "{} requests failed, started from {first:.1} s to {last:.1} s ({:.1} s of failing requests)",
                    gap_failures.len(),
                    last - first
                )
            }
        );
    }

    // Resources.
    let mut csv = String::from(
        "at,node,pid,rss_mib,open_fds,conntrack_entries,umem_frames_in_use,bpf_map_entries\n",
    );
    for s in &samples {
        let _ = writeln!(
            csv,
            "{:.1},{},{},{:.2},{},{},{},{}",
            s.at, s.node, s.pid, s.rss_mib, s.fds, s.conntrack, s.umem_in_use, s.bpf_entries
        );
    }
    std::fs::write(out_dir.join("samples.csv"), csv).unwrap();
    let warm = (secs as f64 * 0.1).clamp(10.0, 120.0);
    let _ = writeln!(
        report,
        "\n## Resources\n\nPer process (a takeover or a restart starts a new one), from {warm:.0} s after its start to its end: first and last sample, and the least-squares slope per hour.\n\n| node | process | from–to (s) | samples | RSS MiB | open fds | conntrack entries | UMEM frames in use | BPF map entries |\n| --- | --- | --- | ---: | --- | --- | --- | --- | --- |"
    );
    type Get = fn(&Sample) -> f64;
    let metrics: [(&str, Get); 5] = [
        ("rss", |s| s.rss_mib),
        ("fds", |s| s.fds),
        ("ct", |s| s.conntrack),
        ("umem", |s| s.umem_in_use),
        ("bpf", |s| s.bpf_entries),
    ];
    let pids: BTreeSet<(&str, u32)> = samples.iter().map(|s| (s.node, s.pid)).collect();
    for (node, pid) in pids {
        let mine: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.node == node && s.pid == pid)
            .collect();
        let start = mine.first().map_or(0.0, |s| s.at);
        let kept: Vec<&&Sample> = mine.iter().filter(|s| s.at >= start + warm).collect();
        if kept.len() < 3 {
            continue;
        }
        let mut cells = Vec::new();
        for (_, get) in metrics {
            let pts: Vec<(f64, f64)> = kept.iter().map(|s| (s.at, get(s))).collect();
            let slope = slope_per_hour(&pts).map_or("n/a".into(), |v| format!("{v:+.1}/h"));
            cells.push(format!(
                "{:.1} → {:.1} ({slope})",
                pts.first().unwrap().1,
                pts.last().unwrap().1
            ));
        }
        let _ = writeln!(
            report,
            "| {node} | pid {pid} | {:.0}–{:.0} | {} | {} |",
            kept.first().unwrap().at,
            kept.last().unwrap().at,
            kept.len(),
            cells.join(" | ")
        );
    }

    // Logs.
    // Drops: over each process's life, and around each failure outside the gap (the samples
    // before and after it on each node), to tell where a lost request's packets went.
    let _ = writeln!(report, "\n## Drops by reason\n");
    let pids: BTreeSet<(&str, u32)> = samples.iter().map(|s| (s.node, s.pid)).collect();
    for (node, pid) in &pids {
        let mine: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.node == *node && s.pid == *pid)
            .collect();
        if let (Some(a), Some(b)) = (mine.first(), mine.last()) {
            let _ = writeln!(
                report,
                "- {node} pid {pid}, {:.0}-{:.0} s: {}",
                a.at,
                b.at,
                drops_between(a, b)
            );
        }
    }
    let mut failed_at: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.error.is_some() && !in_gap(o.at))
        .map(|o| o.at)
        .collect();
    failed_at.sort_by(f64::total_cmp);
    let mut episodes: Vec<f64> = Vec::new();
    for at in failed_at {
        if episodes.last().is_none_or(|t| at - t > 10.0) {
            episodes.push(at);
        }
    }
    for t in &episodes {
        for (node, pid) in &pids {
            let mine: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.node == *node && s.pid == *pid)
                .collect();
            let before = mine.iter().rev().find(|s| s.at <= t - 1.0);
            let after = mine.iter().find(|s| s.at >= t + 6.0);
            if let (Some(a), Some(b)) = (before, after) {
                let _ = writeln!(
                    report,
                    "- around the failures at {t:.1} s, {node} ({:.0}-{:.0} s): {}",
                    a.at,
                    b.at,
                    drops_between(a, b)
                );
            }
        }
    }

    let _ = writeln!(report, "\n## Warnings and errors in the logs\n");
    let mut bad = Vec::new();
    for (name, log) in &logs {
        let mut groups: BTreeMap<(String, bool), usize> = BTreeMap::new();
        for l in log
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        {
            let expected = EXPECTED.iter().any(|e| l.contains(e));
            *groups.entry((template(l), expected)).or_default() += 1;
        }
        if groups.is_empty() {
            let _ = writeln!(report, "- {name}: none");
        }
        for ((t, expected), n) in groups {
            let _ = writeln!(
                report,
                "- {name}: {n} × `{t}`{}",
                if expected { " (expected)" } else { "" }
            );
            if !expected {
                bad.push(format!("{name}: {n} × {t}"));
            }
        }
        if log.contains("panicked") {
            bad.push(format!("{name}: a panic"));
        }
    }
    std::fs::write(out_dir.join("soak.md"), &report).unwrap();
    if std::env::var("KXDP_SOAK_OUT").is_err() {
        let _ = std::fs::write(
            concat!(env!("CARGO_MANIFEST_DIR"), "/target/soak.md"),
            &report,
        );
    }
    println!("{report}");
    drop(api);
    assert!(
        unexpected.is_empty(),
        "{} requests failed outside the SIGKILL gap:\n{}",
        unexpected.len(),
        unexpected
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(bad.is_empty(), "unexpected log lines:\n{}", bad.join("\n"));
}

/// The report's arithmetic (no lab needed).
#[test]
fn metrics_drops_and_slopes() {
    let text = "# HELP kxdp_drops_total x\nkxdp_drops_total{reason=\"policy-deny\"} 3\nkxdp_drops_total{reason=\"no-endpoints\"} 0\nkxdp_umem_frames{worker=\"0\"} 8192\nkxdp_umem_frames{worker=\"1\"} 8192\nkxdp_umem_free_frames{worker=\"0\"} 8000\n";
    let d = drops(text);
    assert_eq!(d["policy-deny"], 3.0);
    assert_eq!(d["no-endpoints"], 0.0);
    assert_eq!(metric(text, "kxdp_umem_frames"), 16384.0);
    assert_eq!(metric(text, "kxdp_umem_free_frames"), 8000.0);
    let (mut a, mut b) = (Sample::default(), Sample::default());
    a.drops = d.clone();
    b.drops = d;
    b.drops.insert("policy-deny".into(), 5.0);
    assert_eq!(drops_between(&a, &b), "policy-deny 2");
    assert_eq!(drops_between(&a, &a), "none");
    let pts: Vec<(f64, f64)> = (0..10)
        .map(|i| (i as f64 * 60.0, 100.0 + i as f64))
        .collect();
    assert!((slope_per_hour(&pts).unwrap() - 60.0).abs() < 1e-9);
    assert_eq!(slope_per_hour(&pts[..2]), None);
}
