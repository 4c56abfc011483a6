//! Connections across a restart of kxdp, in the two-node CNI lab (tests/cni/mod.rs):
//! long downloads from a pod on node-b, through node-a's kxdp, one from a pod on node-a to a
//! ClusterIP (DNAT) and one from the external host to a NodePort of node-a (DNAT and masquerade),
//! while node-a's kxdp is restarted:
//!
//! - SIGTERM, then a new kxdp: every byte arrives;
//! - SIGKILL, then a new kxdp: every byte arrives;
//! - a new kxdp whose state layout differs (a test-only override of the layout version): it
//!   starts clean, says so in its log, and both connections are reset promptly, at both ends,
//!   rather than hanging.
//!
//! Only node-a runs kxdp; node-b's kernel forwards. The first two run twice: with
//! `conntrack.stateFile` in the test's directory, on a huge-page tmpfs that `kxdp prepare`
//! mounts, as the DaemonSet's init container does; and with the default configuration (no
//! `conntrack.stateFile` key, so `/run/kxdp/ct/conntrack`), each kxdp in a mount namespace of
//! its own where `/run/kxdp` is a tmpfs of the test's, so nothing of the host's `/run/kxdp` (made
//! if missing) is touched. Every wait is bounded.

mod cni;
mod lab;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cni::{sa, Lab};
use lab::Kxdp;

/// The download server's port in the backend pod (the Service's targetPort).
const DL_PORT: u16 = 9000;
/// Service port and NodePort of the download Service.
const SVC_PORT: u16 = 90;
const NODE_PORT: u16 = 30090;
const CLUSTER_IP: [u8; 4] = [172, 30, 0, 20];
/// Each download: this many chunks of `CHUNK` bytes, one every `PACE`: about 8 s.
const CHUNKS: usize = 400;
const CHUNK: usize = 16 * 1024;
const PACE: Duration = Duration::from_millis(20);
const TOTAL: usize = CHUNKS * CHUNK;

/// The byte at offset `i` of every download.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A Service `dl` (ClusterIP 172.30.0.20:90, NodePort 30090) whose one endpoint is `pod`:9000.
fn service(lab: &Lab, pod: &str) -> String {
    let p = lab.pod(pod);
    let node = lab.node("node-b").name;
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: dl, namespace: lab}}
spec:
  type: NodePort
  ipFamilies: [IPv4]
  clusterIP: 172.30.0.20
  clusterIPs: [172.30.0.20]
  selector: {{app: dl}}
  ports:
  - {{name: tcp, port: {SVC_PORT}, targetPort: {DL_PORT}, protocol: TCP, nodePort: {NODE_PORT}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dl-ipv4
  namespace: lab
  labels: {{kubernetes.io/service-name: dl}}
addressType: IPv4
ports:
- {{name: tcp, port: {DL_PORT}, protocol: TCP}}
endpoints:
- {{addresses: [\"{}\"], conditions: {{ready: true}}, nodeName: {node}}}
---
",
        p.ip4
    )
}

/// How one side of a download ended.
#[derive(Debug)]
struct Ended {
    /// Bytes moved (sent by the server, received and checked by the client).
    bytes: usize,
    error: Option<ErrorKind>,
    at: Instant,
}

/// The download server in the backend pod: every connection gets `TOTAL` bytes, paced; how
/// each ended is sent on the channel.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    ended: mpsc::Receiver<Ended>,
}

impl Server {
    fn start(ns: &str) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, ended) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let (path, st) = (format!("/var/run/netns/{ns}"), stop.clone());
        let thread = std::thread::spawn(move || {
            kxdp_kernel::enter_netns(&path).expect("setns");
            let l = TcpListener::bind(("0.0.0.0", DL_PORT)).expect("bind the download port");
            l.set_nonblocking(true).unwrap();
            ready_tx.send(()).unwrap();
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let (st, tx) = (st.clone(), tx.clone());
                        std::thread::spawn(move || {
                            let _ = tx.send(serve(s, &st));
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        ready
            .recv_timeout(Duration::from_secs(5))
            .expect("download server up");
        Server {
            stop,
            thread: Some(thread),
            ended,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut s: TcpStream, stop: &AtomicBool) -> Ended {
    let _ = s.set_nonblocking(false);
    // Bounded: a peer that stops reading ends the download with an error, not a hang.
    let _ = s.set_write_timeout(Some(Duration::from_secs(20)));
    let mut sent = 0;
    for _ in 0..CHUNKS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let data: Vec<u8> = (0..CHUNK).map(|i| pattern(sent + i)).collect();
        if let Err(e) = s.write_all(&data) {
            return Ended {
                bytes: sent,
                error: Some(e.kind()),
                at: Instant::now(),
            };
        }
        sent += CHUNK;
        std::thread::sleep(PACE);
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Wait for the client's close (or a reset) so that a reset after the data is seen too.
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    let mut b = [0u8; 64];
    let error = match s.read(&mut b) {
        Ok(_) => None,
        Err(e) => Some(e.kind()),
    };
    Ended {
        bytes: sent,
        error,
        at: Instant::now(),
    }
}

/// One download from `ns` to `to`: reads until the end (checking every byte) or an error, at
/// most 25 s.
fn download(ns: &str, to: SocketAddr) -> JoinHandle<Ended> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&path).expect("setns");
        let mut s = match TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
            Ok(s) => s,
            Err(e) => {
                return Ended {
                    bytes: 0,
                    error: Some(e.kind()),
                    at: Instant::now(),
                }
            }
        };
        // As an application with TCP keepalive (or anything to say) would: after a second
        // without data, the client sends a byte; a connection whose state is gone is then reset.
        // The whole download is bounded: a connection that hangs ends as `TimedOut`.
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(25);
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0usize;
        loop {
            match s.read(&mut buf) {
                Err(e)
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
                        && Instant::now() < deadline =>
                {
                    if let Err(e) = s.write_all(b"?") {
                        return Ended {
                            bytes: got,
                            error: Some(e.kind()),
                            at: Instant::now(),
                        };
                    }
                }
                Ok(0) => break,
                Ok(n) => {
                    if let Some(i) = (0..n).find(|&i| buf[i] != pattern(got + i)) {
                        panic!("download from {to}: byte {} is wrong", got + i);
                    }
                    got += n;
                }
                Err(e) => {
                    return Ended {
                        bytes: got,
                        error: Some(e.kind()),
                        at: Instant::now(),
                    }
                }
            }
        }
        let _ = s.write_all(b"done");
        Ended {
            bytes: got,
            error: None,
            at: Instant::now(),
        }
    })
}

/// Unmounts the state file's huge-page tmpfs when the test ends (before the lab's directory
/// goes).
struct HugeDir(std::path::PathBuf);

impl Drop for HugeDir {
    fn drop(&mut self) {
        let _ = kxdp_kernel::mount::unmount(&self.0);
    }
}

/// Where node-a's kxdp keeps its conntrack table.
#[derive(Clone, Copy, PartialEq)]
enum StateFile {
    /// `conntrack.stateFile` in the test's directory, in huge pages.
    HugePages,
    /// No `conntrack.stateFile` key: the default path, on a tmpfs of the test's seen as
    /// `/run/kxdp` by kxdp only.
    Default,
}

struct Setup {
    /// Unmounted on drop, before the lab's directory goes.
    mounted: HugeDir,
    lab: Lab,
    server: Server,
    mode: StateFile,
    config: String,
    state: String,
    objects: String,
}

impl Setup {
    fn new(test: &str) -> Setup {
        Setup::with(test, StateFile::HugePages)
    }

    fn with(test: &str, mode: StateFile) -> Setup {
        let mut lab = Lab::build(test);
        lab.add_pod("node-a", "client-a", &[("app", "client")]);
        lab.add_pod("node-b", "dl-b1", &[("app", "dl")]);
        lab.warm_neighbours();
        let server = Server::start(&lab.pod("dl-b1").ns);
        let objects = service(&lab, "dl-b1");
        if mode == StateFile::Default {
            let config = lab
                .kxdp_config("node-a", false)
                .replace("conntrack: {stateFile: \"\"}\n", "");
            assert!(!config.contains("stateFile"), "{config}");
            // The host's view of kxdp's /run/kxdp: a tmpfs (the default path must be on one),
            // unmounted when the test ends.
            let run = lab.dir.path().join("run-kxdp");
            std::fs::create_dir_all(&run).unwrap();
            lab::run(
                "mount",
                &["-t", "tmpfs", "kxdp-test", run.to_str().unwrap()],
            );
            return Setup {
                mounted: HugeDir(run),
                lab,
                server,
                mode,
                config,
                state: String::new(),
                objects,
            };
        }
        // The state file in huge pages, in a directory of its own that `kxdp prepare` mounts
        // (as the DaemonSet's init container does, on the host): kxdp runs behind `ip netns
        // exec`, whose mount namespace is its own, and a mount it made there would go with it.
        let ct = lab.dir.path().join("run-kxdp").join("ct").join("conntrack");
        let config = lab.kxdp_config("node-a", false).replace(
            "conntrack: {stateFile: \"\"}",
            &format!(
                "conntrack: {{stateFile: \"{}\", stateFileHugePages: true}}",
                ct.display()
            ),
        );
        let prepare = lab.dir.path().join("prepare.yaml");
        std::fs::write(&prepare, &config).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
            .args(["prepare", "--config", prepare.to_str().unwrap()])
            .output()
            .unwrap();
        let huge = HugeDir(ct.parent().unwrap().to_path_buf());
        assert!(
            out.status.success(),
            "kxdp prepare: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Setup {
            mounted: huge,
            lab,
            server,
            mode,
            config,
            state: String::new(),
            objects,
        }
    }

    /// Starts node-a's kxdp (first time: writes its config and state files).
    fn start(&mut self, env: &[(&str, &str)]) -> Kxdp {
        if self.mode == StateFile::Default {
            return self.start_default();
        }
        if self.state.is_empty() {
            let k = self.lab.start_kxdp("node-a", &self.config, &self.objects);
            self.state = k.state.to_string_lossy().into_owned();
            let node = k;
            // Hand the process over: the test restarts it by hand.
            let cni::KxdpNode { kxdp, .. } = node;
            return kxdp;
        }
        let dir = std::path::Path::new(&self.state).parent().unwrap();
        let config = dir.join("config.yaml");
        Kxdp::start_with_env(
            &self.lab.node("node-a").ns,
            config.to_str().unwrap(),
            &self.state,
            env,
        )
    }

    /// `kxdp run` with the default state file: in a private mount namespace whose `/run/kxdp`
    /// is the test's tmpfs (`unshare` and `ip netns exec` exec, so the child is kxdp itself and
    /// the test's signals reach it).
    fn start_default(&mut self) -> Kxdp {
        let dir = self.lab.dir.path().join("kxdp-node-a");
        let state = dir.join("state");
        if self.state.is_empty() {
            std::fs::create_dir_all(&state).unwrap();
            std::fs::write(dir.join("config.yaml"), &self.config).unwrap();
            std::fs::write(
                state.join("cluster.yaml"),
                self.lab.cluster_objects() + &self.objects,
            )
            .unwrap();
            self.state = state.to_string_lossy().into_owned();
        }
        let bin = Kxdp::bin();
        let script = format!(
            "mkdir -p /run/kxdp && mount --bind {run} /run/kxdp && exec ip netns exec {ns} {bin} run --config {cfg} --state {state} --no-admin --no-takeover",
            run = self.mounted.0.display(),
            ns = self.lab.node("node-a").ns,
            cfg = dir.join("config.yaml").display(),
            state = self.state,
        );
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
        Kxdp::spawn(cmd, Duration::from_secs(20))
    }

    fn targets(&self) -> [(&'static str, String, SocketAddr); 2] {
        let node_a = self.lab.node("node-a").ip4;
        [
            (
                "ClusterIP",
                self.lab.pod("client-a").ns.clone(),
                sa(IpAddr::from(CLUSTER_IP), SVC_PORT),
            ),
            ("NodePort", self.lab.ext.clone(), sa(node_a, NODE_PORT)),
        ]
    }
}

fn log_of(k: &Kxdp) -> String {
    k.stderr.lock().unwrap().clone()
}

/// SIGKILL, bounded wait.
fn kill(k: &mut Kxdp) {
    let _ = k.child.kill();
    let _ = k.child.wait();
}

enum Restart {
    Term,
    Kill,
}

/// Downloads through ClusterIP and NodePort complete with every byte across a restart.
fn survives(test: &str, how: Restart, mode: StateFile) {
    let mut s = Setup::with(test, mode);
    let mut k = s.start(&[]);
    let downloads: Vec<_> = s
        .targets()
        .into_iter()
        .map(|(what, ns, to)| (what, download(&ns, to)))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let old_log = log_of(&k);
    let t0 = Instant::now();
    match how {
        Restart::Term => {
            k.stop();
        }
        Restart::Kill => kill(&mut k),
    }
    let k2 = s.start(&[]);
    let restarted_in = t0.elapsed();
    let new_log = log_of(&k2);
    let mut failures = Vec::new();
    for (what, d) in downloads {
        let e = d.join().expect("download thread");
        if e.bytes != TOTAL || e.error.is_some() {
            failures.push(format!(
                "{what}: {} of {TOTAL} bytes, {:?}",
                e.bytes, e.error
            ));
        }
    }
    eprintln!("{test}: new kxdp forwarding {restarted_in:?} after the signal");
    assert!(
        failures.is_empty(),
        "{failures:?}\nfirst kxdp:\n{old_log}\nsecond kxdp:\n{new_log}"
    );
    assert!(
        new_log.contains("restored") && !new_log.contains("discarded"),
        "the new kxdp continued the table:\n{new_log}"
    );
    for log in [&old_log, &new_log] {
        if mode == StateFile::HugePages {
            // In huge pages, both times: the tmpfs `kxdp prepare` mounted outlived the first kxdp.
            assert!(
                log.contains("MiB of it in huge pages")
                    && !log.contains(" 0 MiB of it in huge pages"),
                "the state file is in huge pages:\n{log}"
            );
        } else {
            assert!(
                log.contains("in the state file /run/kxdp/ct/conntrack")
                    && !log.contains("cannot be used"),
                "the default state file, with the default configuration:\n{log}"
            );
        }
    }
    if matches!(how, Restart::Term) {
        assert!(new_log.contains("clean shutdown"), "{new_log}");
    } else {
        assert!(new_log.contains("crash"), "{new_log}");
    }
    // Both server ends finished cleanly too.
    for _ in 0..2 {
        let e = s
            .server
            .ended
            .recv_timeout(Duration::from_secs(25))
            .expect("server side ended");
        assert_eq!((e.bytes, e.error), (TOTAL, None), "server side");
    }
    drop(k2);
}

#[test]
fn downloads_survive_sigterm_restart() {
    survives(
        "downloads_survive_sigterm_restart",
        Restart::Term,
        StateFile::HugePages,
    );
}

#[test]
fn downloads_survive_sigkill_restart() {
    survives(
        "downloads_survive_sigkill_restart",
        Restart::Kill,
        StateFile::HugePages,
    );
}

/// The default configuration (no `conntrack.stateFile`): the state file is on by default, so a
/// SIGTERM restart loses no download.
#[test]
fn default_config_downloads_survive_sigterm_restart() {
    survives(
        "default_config_downloads_survive_sigterm_restart",
        Restart::Term,
        StateFile::Default,
    );
}

/// The default configuration: a SIGKILL restart loses no download.
#[test]
fn default_config_downloads_survive_sigkill_restart() {
    survives(
        "default_config_downloads_survive_sigkill_restart",
        Restart::Kill,
        StateFile::Default,
    );
}

/// A new build that cannot read the state file's layout starts clean, says so, and the
/// connections whose state is gone are reset at both ends within seconds (not left to hang
/// until a timeout).
#[test]
fn unreadable_layout_starts_clean_and_resets_connections() {
    let test = "unreadable_layout_starts_clean_and_resets_connections";
    let mut s = Setup::new(test);
    let mut k = s.start(&[]);
    let downloads: Vec<_> = s
        .targets()
        .into_iter()
        .map(|(what, ns, to)| (what, download(&ns, to)))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    k.stop();
    let k2 = s.start(&[(kxdp_dataplane::conntrack::VERSION_OVERRIDE_ENV, "999")]);
    let up = Instant::now();
    let log = log_of(&k2);
    assert!(
        log.contains("discarded_version") && log.contains("layout version"),
        "the new kxdp says it starts clean and why:\n{log}"
    );
    for (what, d) in downloads {
        let e = d.join().expect("download thread");
        assert!(
            e.bytes < TOTAL,
            "{what}: the connection cannot have completed"
        );
        assert!(
            matches!(
                e.error,
                Some(ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted)
            ),
            "{what}: reset, not hanging: {e:?}\n{log}"
        );
        let after = e.at.saturating_duration_since(up);
        assert!(
            after < Duration::from_secs(5),
            "{what}: reset {after:?} after the start"
        );
    }
    // The server's ends too.
    for _ in 0..2 {
        let e = s
            .server
            .ended
            .recv_timeout(Duration::from_secs(25))
            .expect("server side ended");
        assert!(e.error.is_some(), "server side reset: {e:?}");
        let after = e.at.saturating_duration_since(up);
        assert!(
            after < Duration::from_secs(5),
            "server side: {after:?} after the start"
        );
    }
    drop(k2);
}
