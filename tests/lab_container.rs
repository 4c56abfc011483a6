//! `kxdp run` as the DaemonSet's container sees the node (deploy/base/daemonset.yaml): in the
//! node's network namespace (the lab's node), in a mount namespace of its own where `/proc/sys`
//! and `/sys` are read-only (what a container runtime mounts for a container that is not
//! privileged), with exactly the capabilities the manifest adds to the container (read from the
//! manifest, so the two cannot drift), uid 0 and no new privileges (`allowPrivilegeEscalation:
//! false`), applied with util-linux's `setpriv`. It must start and forward: a pod's TCP
//! connection to a ClusterIP and the node's own connection to a ClusterIP (the host path), with
//! the host path's per-device settings in place. Without one of the manifest's capabilities it
//! must fail at once and say what it could not do; with an IPv6 node address and IPv6
//! forwarding off on the node it must say so in its log. Its worker pins itself to a CPU
//! (`workers.cpus`), which needs no capability. An upgrade as the DaemonSet does it (the
//! manifest's command line, the conntrack table in a state file, a second container taking
//! the dataplane over) works with the same capabilities.
//!
//! Needs root, `unshare`, `mount` and `setpriv` (util-linux).

mod lab;

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use lab::{ip, lab_files, Cluster, Kxdp, Lab, Servers, NODE_IP};

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/daemonset.yaml");

/// The lab node's IPv6 address (the IPv6 forwarding warning needs a node address of IPv6).
const NODE6: &str = "fd00:168::2";

/// The `kxdp` container's capabilities (`securityContext.capabilities.add`), checking that the
/// container is not privileged and drops everything else.
fn manifest_caps() -> Vec<String> {
    let text = std::fs::read_to_string(MANIFEST).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"));
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"));
    let containers = doc["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap_or_else(|| panic!("{MANIFEST}: spec.template.spec.containers"));
    let kxdp = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("kxdp"))
        .unwrap_or_else(|| panic!("{MANIFEST}: no container named kxdp"));
    let sc = &kxdp["securityContext"];
    assert_eq!(
        sc["privileged"].as_bool(),
        Some(false),
        "{MANIFEST}: the kxdp container is not privileged"
    );
    assert_eq!(sc["runAsUser"].as_u64(), Some(0), "{MANIFEST}: runAsUser 0");
    assert_eq!(
        sc["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{MANIFEST}: allowPrivilegeEscalation false"
    );
    let drop: Vec<&str> = sc["capabilities"]["drop"]
        .as_sequence()
        .map(|s| s.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(drop, ["ALL"], "{MANIFEST}: capabilities.drop [ALL]");
    let caps: Vec<String> = sc["capabilities"]["add"]
        .as_sequence()
        .unwrap_or_else(|| panic!("{MANIFEST}: securityContext.capabilities.add"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("{MANIFEST}: capabilities.add: {v:?}"))
                .to_string()
        })
        .collect();
    assert!(!caps.is_empty(), "{MANIFEST}: capabilities.add is empty");
    caps
}

/// The capability's bit (include/uapi/linux/capability.h) for the /proc/PID/status check.
fn cap_bit(name: &str) -> u32 {
    match name {
        "NET_BIND_SERVICE" => 10,
        "NET_BROADCAST" => 11,
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "IPC_LOCK" => 14,
        "SYS_RESOURCE" => 24,
        "SYS_ADMIN" => 21,
        "SYS_NICE" => 23,
        "PERFMON" => 38,
        "BPF" => 39,
        _ => panic!("{MANIFEST}: capability {name} unknown to this test: add its bit"),
    }
}

/// `kxdp run ARGS` in the lab's node namespace as the container runs it: a private mount
/// namespace with `/proc/sys` and `/sys` remounted read-only, then `setpriv` keeps uid 0 with
/// `caps` as the bounding, inheritable and ambient sets (for uid 0 the bounding set is what
/// the process keeps at exec) and no new privileges.
fn container_cmd(ns: &str, caps: &[String], args: &[&str]) -> Command {
    let mut argv = vec![env!("CARGO_BIN_EXE_kxdp"), "run"];
    argv.extend_from_slice(args);
    container(ns, caps, &argv)
}

/// `argv` in the lab's node namespace as the container runs it (see `container_cmd`).
fn container(ns: &str, caps: &[String], argv: &[&str]) -> Command {
    let list = caps
        .iter()
        .map(|c| format!("+{}", c.to_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let set = if list.is_empty() {
        "-all".to_string()
    } else {
        format!("-all,{list}")
    };
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        ns,
        "unshare",
        "--mount",
        "--propagation",
        "private",
    ])
    .args(["sh", "-ec"])
    .arg(
        "mount --bind /proc/sys /proc/sys; mount -o remount,bind,ro /proc/sys; \
             mount -o remount,bind,ro /sys; exec \"$@\"",
    )
    .arg("container")
    .args([
        "setpriv",
        "--reuid=0",
        "--regid=0",
        "--clear-groups",
        "--no-new-privs",
    ])
    .arg(format!("--inh-caps={set}"))
    .arg(format!("--ambient-caps={set}"))
    .arg(format!("--bounding-set={set}"))
    .arg("--")
    .args(argv);
    cmd
}

/// The lab's configuration with the node's IPv6 address added to `nodeIPs` and the worker
/// pinned to `cpu`, in a file of its own.
fn lab_config(dir: &std::path::Path, cpu: usize) -> String {
    let (config, _) = lab_files();
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text
        .replace(
            &format!("nodeIPs: [{NODE_IP}]"),
            &format!("nodeIPs: [{NODE_IP}, {NODE6}]"),
        )
        .replace(
            "workers: {count: 1, cpus: []}",
            &format!("workers: {{count: 1, cpus: [{cpu}]}}"),
        );
    assert!(text.contains(NODE6), "tests/lab/config.yaml: nodeIPs line");
    assert!(
        text.contains(&format!("cpus: [{cpu}]")),
        "tests/lab/config.yaml: workers line"
    );
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("kxdp-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the tools the container needs are here; prints why not.
fn tools(test: &str) -> bool {
    for t in ["unshare", "setpriv", "mount"] {
        let found = Command::new(t)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            eprintln!("SKIPPED {test}: `{t}` (util-linux) is not installed");
            return false;
        }
    }
    true
}

/// Connects from `ns` to `to`, sends `send` bytes; returns (the peer the server saw, the byte
/// count it answered).
fn tcp_exchange(ns: &str, to: &str, send: usize) -> std::io::Result<(String, u64)> {
    let to = to.to_string();
    Lab::in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut peer = String::new();
        r.read_line(&mut peer)?;
        s.write_all(&vec![0x5au8; send])?;
        s.shutdown(Shutdown::Write)?;
        let mut count = String::new();
        r.read_line(&mut count)?;
        Ok((
            peer.trim().to_string(),
            count.trim().parse().unwrap_or(u64::MAX),
        ))
    })
}

fn host(peer: &str) -> &str {
    peer.rsplit_once(':').map(|(h, _)| h).unwrap_or(peer)
}

/// The effective capability set of `pid` (CapEff of /proc/PID/status).
fn cap_eff(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("CapEff:"))
        .expect("CapEff");
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

/// A /proc/sys value as the node sees it (from the node's namespace, not the container's).
fn sysctl(ns: &str, path: &str) -> String {
    lab::sh(ns, &format!("cat /proc/sys/{path}"))
        .trim()
        .to_string()
}

#[test]
fn lab_container_runs_with_the_manifests_capabilities_and_read_only_proc_sys() {
    let test = "lab_container_runs_with_the_manifests_capabilities_and_read_only_proc_sys";
    if !lab::available(test) || !tools(test) {
        return;
    }
    let caps = manifest_caps();
    let c = Cluster::build();
    // The container's view: /proc/sys and /sys refuse writes, even with NET_ADMIN.
    for path in [
        "/proc/sys/net/ipv4/conf/lo/forwarding",
        "/sys/class/net/lo/mtu",
    ] {
        let out = container(
            &c.node,
            &caps,
            &["sh", "-c", &format!("cat {path} > {path}")],
        )
        .output()
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("Read-only file system"),
            "{path} is read-only in the container: {err}"
        );
    }
    ip(&c.node, &format!("addr add {NODE6}/64 dev up0 nodad"));
    assert_eq!(sysctl(&c.node, "net/ipv6/conf/all/forwarding"), "0");
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let dir = TempDir::new("lab-container");
    // The last CPU: pinning (sched_setaffinity) needs no capability.
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let config = lab_config(&dir.0, cpu);
    let (_, state) = lab_files();
    let cmd = container_cmd(
        &c.node,
        &caps,
        &[
            "--config",
            &config,
            "--state",
            &state,
            "--no-admin",
            "--no-takeover",
        ],
    );
    let mut kxdp = Kxdp::spawn(cmd, Duration::from_secs(30));
    let stderr = kxdp.stderr.clone();
    let log = move || stderr.lock().unwrap().clone();

    // The process runs with exactly the manifest's capabilities (the exec chain keeps the pid).
    let want = caps.iter().fold(0u64, |m, c| m | 1 << cap_bit(c));
    assert_eq!(
        cap_eff(kxdp.child.id()),
        want,
        "kxdp's effective capabilities are the manifest's {caps:?}"
    );

    // The worker pinned itself.
    let pid = kxdp.child.id();
    let worker = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .find(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "kxdp-worker-0")
        })
        .expect("the worker thread kxdp-worker-0");
    let status = std::fs::read_to_string(worker.path().join("status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Cpus_allowed_list:") && l.ends_with(&format!("\t{cpu}"))),
        "the worker is pinned to CPU {cpu}: {status}"
    );

    // The host path's per-device settings, set through netlink.
    assert_eq!(sysctl(&c.node, "net/ipv4/conf/kxdp0/rp_filter"), "0");
    assert_eq!(sysctl(&c.node, "net/ipv4/conf/kxdp0/accept_local"), "1");
    assert_eq!(sysctl(&c.node, "net/ipv4/conf/kxdp0/forwarding"), "1");
    for dev in ["kxdp0", "kxdp1"] {
        let link = ip(&c.node, &format!("-d link show dev {dev}"));
        assert!(
            link.contains("addrgenmode none"),
            "{dev}: IPv6 address generation none: {link}"
        );
        let addrs = ip(&c.node, &format!("-6 addr show dev {dev}"));
        assert!(!addrs.contains("inet6"), "{dev}: no IPv6 address: {addrs}");
    }

    // A pod's connection to a ClusterIP, and the node's own through the host path (kxdp0 →
    // kxdp1 → kxdp → pod; the reply back through kxdp0 with the ClusterIP as its source).
    let client = c.pod("client-1").to_string();
    for _ in 0..3 {
        let (peer, count) = tcp_exchange(&client, "172.30.0.10:80", 100_000)
            .unwrap_or_else(|e| panic!("pod → ClusterIP: {e}\n{}", log()));
        assert_eq!(host(&peer), "10.1.0.13", "pod → ClusterIP\n{}", log());
        assert_eq!(count, 100_000, "pod → ClusterIP: every byte\n{}", log());
        let (peer, count) = tcp_exchange(&c.node, "172.30.0.10:80", 100_000)
            .unwrap_or_else(|e| panic!("node → ClusterIP: {e}\n{}", log()));
        assert_eq!(host(&peer), NODE_IP, "node → ClusterIP\n{}", log());
        assert_eq!(count, 100_000, "node → ClusterIP: every byte\n{}", log());
    }

    let out = log();
    assert!(
        !out.contains("Read-only file system") && !out.contains("ERROR"),
        "nothing failed: {out}"
    );
    assert!(
        out.contains("IPv6 forwarding is off"),
        "IPv6 node address with net.ipv6.conf.all.forwarding 0: a warning\n{out}"
    );
    let st = kxdp.stop().expect("kxdp run exits");
    assert!(
        st.success(),
        "kxdp run exits cleanly on SIGTERM: {st}\n{}",
        log()
    );
    assert!(
        ip(&c.node, "link show")
            .lines()
            .all(|l| !l.contains("kxdp0")),
        "the host path is removed"
    );
}

#[test]
fn lab_container_without_a_manifest_capability_fails_clearly() {
    let test = "lab_container_without_a_manifest_capability_fails_clearly";
    if !lab::available(test) || !tools(test) {
        return;
    }
    let caps = manifest_caps();
    let c = Cluster::build();
    let (config, state) = lab_files();
    let mut problems = Vec::new();
    for missing in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        let mut cmd = container_cmd(
            &c.node,
            &fewer,
            &[
                "--config",
                &config,
                "--state",
                &state,
                "--no-admin",
                "--no-takeover",
            ],
        );
        let mut child = cmd
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kxdp run");
        let end = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() >= end {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
        match status {
            None => problems.push(format!("without {missing}: kxdp run kept running:\n{err}")),
            Some(st) if st.success() => {
                problems.push(format!("without {missing}: kxdp run succeeded:\n{err}"))
            }
            Some(_) if !err.contains(&format!("CAP_{missing}")) => problems.push(format!(
                "without {missing}: the error does not name the capability:\n{err}"
            )),
            Some(_) => eprintln!("without {missing}:\n{err}"),
        }
        // Nothing is left behind on the node by a run that failed (a killed one leaves the
        // pair, removed here for the next round).
        let left = ip(&c.node, "link show")
            .lines()
            .any(|l| l.contains("kxdp0"));
        if status.is_some() {
            assert!(!left, "without {missing}: the host path is removed");
        } else if left {
            ip(&c.node, "link del kxdp0");
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The DaemonSet's upgrade in the container: `kxdp run` with the manifest's command line
/// (`--admin`, `--takeover-socket`, `--wait-after-handover`) and the conntrack table in a state
/// file; a second one, in a container of its own, takes the dataplane over (sockets, UMEM,
/// programs and maps passed over the takeover socket) and forwards, with the same
/// capabilities.
#[test]
fn lab_container_takeover_with_the_manifests_capabilities() {
    let test = "lab_container_takeover_with_the_manifests_capabilities";
    if !lab::available(test) || !tools(test) {
        return;
    }
    let caps = manifest_caps();
    let c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let dir = TempDir::new("lab-container-takeover");
    let (config, state) = lab_files();
    let text = std::fs::read_to_string(&config).unwrap();
    let config = dir.0.join("config.yaml");
    // The lab's config keeps its table in memory (`stateFile: ""`); this one in a file.
    let file = format!(
        "conntrack: {{stateFile: {}}}",
        dir.0.join("conntrack").display()
    );
    assert!(text.contains("conntrack: {stateFile: \"\"}"), "{text}");
    std::fs::write(&config, text.replace("conntrack: {stateFile: \"\"}", &file)).unwrap();
    let (config, admin, takeover) = (
        config.display().to_string(),
        dir.0.join("admin.sock").display().to_string(),
        dir.0.join("takeover.sock").display().to_string(),
    );
    let args = [
        "--config",
        &config,
        "--state",
        &state,
        "--admin",
        &admin,
        "--takeover-socket",
        &takeover,
        "--wait-after-handover",
    ];
    let client = c.pod("client-1").to_string();
    let exchange = |log: &dyn Fn() -> String| {
        let (peer, count) = tcp_exchange(&client, "172.30.0.10:80", 50_000)
            .unwrap_or_else(|e| panic!("pod → ClusterIP: {e}\n{}", log()));
        assert_eq!(host(&peer), "10.1.0.13", "pod → ClusterIP\n{}", log());
        assert_eq!(count, 50_000, "pod → ClusterIP: every byte\n{}", log());
    };
    let mut old = Kxdp::spawn(
        container_cmd(&c.node, &caps, &args),
        Duration::from_secs(30),
    );
    let old_log = {
        let s = old.stderr.clone();
        move || s.lock().unwrap().clone()
    };
    exchange(&old_log);
    let mut new = Kxdp::spawn(
        container_cmd(&c.node, &caps, &args),
        Duration::from_secs(30),
    );
    let new_log = {
        let s = new.stderr.clone();
        move || s.lock().unwrap().clone()
    };
    assert!(
        new_log().contains("took over from pid"),
        "the new kxdp took over:\n{}\nold:\n{}",
        new_log(),
        old_log()
    );
    exchange(&new_log);
    for (k, out) in [(&mut new, new_log()), (&mut old, old_log())] {
        assert!(
            !out.contains("Operation not permitted") && !out.contains("Read-only file system"),
            "nothing refused: {out}"
        );
        k.stop();
    }
}
