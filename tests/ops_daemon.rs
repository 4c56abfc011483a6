//! Operations acceptance: a real `kxdp run` (file-source mode) driven through its admin socket,
//! its HTTP ports and the CLI, as an operator would.
//!
//! Packets: until AF_XDP workers are attached, the daemon's conntrack table is filled by its
//! hidden `--inject-pcap FILE` test path: a pseudo-worker inside the daemon pushes FILE through
//! the real pipeline (the daemon's own conntrack, published tables, clock and stats feed) each
//! time FILE changes. Everything the commands show is what the pipeline left behind.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_kxdp");
const DEADLINE: Duration = Duration::from_secs(20);

struct Daemon {
    child: Child,
    admin: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One raw admin request (the wire format), for the daemon's status.
fn admin_raw(path: &Path, req: &str) -> Option<Vec<Value>> {
    let mut s = std::os::unix::net::UnixStream::connect(path).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    writeln!(s, "{req}").ok()?;
    let lines: Vec<Value> = BufReader::new(s)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    Some(lines)
}

fn kxdp(admin: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).arg("--admin").arg(admin);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bound the command's time.
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("kxdp {args:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn ok(admin: &Path, args: &[&str]) -> String {
    let o = kxdp(admin, args);
    assert!(
        o.status.success(),
        "kxdp {args:?}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// (status, headers (lowercase names), body).
type HttpResponse = (u16, Vec<(String, String)>, String);

/// GET `path` from `addr`.
fn http_get(addr: &str, path: &str) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}

fn lb_local(name: &str, ip: &str, hc: u16, node_port: u16, eps: &[(&str, &str)]) -> Vec<Value> {
    vec![
        lb_service(
            name,
            json!({
                "type": "LoadBalancer",
                "clusterIP": ip, "clusterIPs": [ip],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "externalTrafficPolicy": "Local",
                "healthCheckNodePort": hc,
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": node_port}]
            }),
            json!([]),
        ),
        endpoint_slice(
            name,
            &format!("{name}-abcde"),
            "IPv4",
            json!([sport("http", 8080, "TCP")]),
            eps.iter().map(|(ip, n)| endpoint(ip, n)).collect(),
        ),
    ]
}

fn write_inject(path: &Path, frames: &[Vec<u8>], bump: u64) {
    let tmp = path.with_extension("tmp");
    write_pcap(
        &tmp,
        kxdp_packet::LinkType::Ethernet,
        &spaced(frames, 1_000),
    );
    let f = std::fs::File::options().write(true).open(&tmp).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + bump))
        .unwrap();
    drop(f);
    std::fs::rename(&tmp, path).unwrap();
}

fn config(env: &Env) -> String {
    let _ = env;
    "apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: node-a
clusterCIDRs: [10.0.0.0/8]
serviceCIDRs: [172.30.0.0/16]
healthzBindAddress: 127.0.0.1:0
metricsBindAddress: 127.0.0.1:0
conntrack: {maxEntries: 4096, stateFile: \"\"}
sync: {minSyncPeriod: 100ms, syncPeriod: 2s}
workers: {count: 1}
"
    .into()
}

struct Setup {
    env: Env,
    daemon: Daemon,
    healthz: String,
    metrics: String,
    hc_local: u16,
    hc_remote: u16,
    inject: PathBuf,
}

fn start() -> Setup {
    start_with(|_| {}, &[])
}

/// `start` with more objects in the state and more flags for `kxdp run`; the daemon's stderr
/// goes to `stderr.log` in the test's directory.
fn start_with(extra: impl FnOnce(&mut Env), run_flags: &[&str]) -> Setup {
    let mut env = Env::new();
    env.config = config(&env);
    let (hc_local, hc_remote) = (free_port(), free_port());
    env.add_all(simple_service(
        "web",
        "172.30.0.10",
        80,
        8080,
        &[("10.1.0.10", NODE_A), ("10.2.0.10", NODE_B)],
    ));
    env.add(service(
        "empty",
        json!({"type": "ClusterIP", "clusterIP": "172.30.0.11", "clusterIPs": ["172.30.0.11"],
               "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
               "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]}),
    ));
    env.add_all(lb_local(
        "lb-local",
        "172.30.0.12",
        hc_local,
        30080,
        &[("10.1.0.12", NODE_A), ("10.2.0.12", NODE_B)],
    ));
    env.add_all(lb_local(
        "lb-remote",
        "172.30.0.13",
        hc_remote,
        30081,
        &[("10.2.0.13", NODE_B)],
    ));
    extra(&mut env);
    env.write_files();
    let admin = env.path("run/admin.sock");
    let log = std::fs::File::create(env.path("stderr.log")).unwrap();
    let inject = env.path("inject.pcap");
    let child = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(env.path("config.yaml"))
        .arg("--state")
        .arg(env.path("state"))
        .arg("--admin")
        .arg(&admin)
        .arg("--inject-pcap")
        .arg(&inject)
        .args(run_flags)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let daemon = Daemon { child, admin };
    let status = wait_for("the daemon's first publication", || {
        let l = admin_raw(&daemon.admin, r#"{"op":"status"}"#)?;
        let end = l.last()?.get("end")?.clone();
        (end["generation"].as_u64()? > 0 && end["listening"]["healthz"].is_string()).then_some(end)
    });
    let healthz = status["listening"]["healthz"].as_str().unwrap().to_string();
    let metrics = status["listening"]["metrics"].as_str().unwrap().to_string();
    Setup {
        env,
        daemon,
        healthz,
        metrics,
        hc_local,
        hc_remote,
        inject,
    }
}

fn traffic() -> Vec<Vec<u8>> {
    vec![
        syn("10.1.0.50:40000", "172.30.0.10:80"),
        syn("10.1.0.50:40001", "172.30.0.10:80"),
        syn("10.1.0.50:40002", "172.30.0.10:80"),
        // No endpoints: rejected, not tracked.
        syn("10.1.0.50:40003", "172.30.0.11:80"),
    ]
}

#[test]
fn daemon_ops_end_to_end() {
    let s = start();
    let a = s.daemon.admin.clone();
    let a = a.as_path();
    write_inject(&s.inject, &traffic(), 0);
    wait_for("3 conntrack entries", || {
        (ok(a, &["conntrack", "count"]).trim() == "3").then_some(())
    });

    // ---- conntrack list: JSON as docs/operations.md has it, and the table shape ----
    let entries = json_lines(&ok(a, &["conntrack", "list", "-o", "json"]));
    assert_eq!(entries.len(), 3);
    for e in &entries {
        let keys: Vec<&str> = e.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        for k in [
            "proto",
            "state",
            "timeout_s",
            "assured",
            "orig_src",
            "orig_dst",
            "reply_src",
            "reply_dst",
            "service",
            "packets_orig",
            "bytes_orig",
            "packets_reply",
            "bytes_reply",
        ] {
            assert!(keys.contains(&k), "{k} missing in {e}");
        }
        assert_eq!(e["proto"], "TCP");
        assert_eq!(e["state"], "SYN_SENT");
        assert_eq!(e["assured"], false);
        assert_eq!(e["orig_dst"], "172.30.0.10:80");
        assert_eq!(e["reply_dst"], e["orig_src"]);
        assert!(
            ["10.1.0.10:8080", "10.2.0.10:8080"].contains(&e["reply_src"].as_str().unwrap()),
            "{e}"
        );
        assert_eq!(e["service"], "demo/web:http");
        // The packet that created the entry counts (as in the kernel); the counts grow with the
        // second injection below.
        assert_eq!(e["packets_orig"].as_u64().unwrap(), 1);
        assert_eq!(e["packets_reply"], 0);
        let t = e["timeout_s"].as_u64().unwrap();
        assert!(t > 0 && t <= 120, "SYN_SENT timeout {t}");
    }
    let table = ok(a, &["conntrack", "list", "--sport", "40000"]);
    let line = table.lines().next().expect("one line");
    assert!(line.starts_with("tcp      6 "), "{line}");
    let e0 = entries
        .iter()
        .find(|e| e["orig_src"] == "10.1.0.50:40000")
        .unwrap();
    assert!(
        line.contains(&format!(
            " SYN_SENT src=10.1.0.50 dst=172.30.0.10 sport=40000 dport=80 packets={} bytes={} ",
            e0["packets_orig"], e0["bytes_orig"]
        )),
        "{line}"
    );
    assert!(line.contains("[UNREPLIED] src=10."), "{line}");
    assert!(
        line.contains(" dst=10.1.0.50 sport=8080 dport=40000 packets=0 bytes=0 "),
        "{line}"
    );
    assert!(line.ends_with("service=demo/web:http"), "{line}");
    assert!(!line.contains("[ASSURED]"), "{line}");

    // ---- filters (conntrack-tools' names) ----
    let count = |args: &[&str]| {
        let mut v = vec!["conntrack", "list", "-o", "json"];
        v.extend_from_slice(args);
        json_lines(&ok(a, &v)).len()
    };
    assert_eq!(count(&["-p", "tcp"]), 3);
    assert_eq!(count(&["--proto", "udp"]), 0);
    assert_eq!(count(&["-s", "10.1.0.50"]), 3);
    assert_eq!(count(&["--orig-src", "10.1.0.51"]), 0);
    assert_eq!(count(&["-d", "172.30.0.0/16"]), 3);
    assert_eq!(count(&["--orig-dst", "172.30.0.11"]), 0);
    let via_a = entries
        .iter()
        .filter(|e| e["reply_src"] == "10.1.0.10:8080")
        .count();
    assert_eq!(count(&["-r", "10.1.0.10"]), via_a);
    assert_eq!(count(&["--reply-src", "10.2.0.10"]), 3 - via_a);
    assert_eq!(count(&["-q", "10.1.0.50"]), 3);
    assert_eq!(count(&["--sport", "40001"]), 1);
    assert_eq!(count(&["--dport", "80"]), 3);
    assert_eq!(count(&["--orig-port-dst", "81"]), 0);
    assert_eq!(count(&["--state", "SYN_SENT"]), 3);
    assert_eq!(count(&["--state", "ESTABLISHED"]), 0);
    assert_eq!(count(&["-f", "ipv4"]), 3);
    assert_eq!(count(&["-f", "ipv6"]), 0);
    assert_eq!(count(&["--service", "demo/web"]), 3);
    assert_eq!(
        ok(a, &["conntrack", "count", "--sport", "40002"]).trim(),
        "1"
    );
    assert_eq!(
        json_lines(&ok(a, &["conntrack", "count", "-o", "json"]))[0]["count"],
        3
    );
    assert_eq!(
        kxdp(a, &["conntrack", "list", "-s", "nope"]).status.code(),
        Some(2)
    );

    // ---- get ----
    let got = json_lines(&ok(
        a,
        &[
            "conntrack",
            "get",
            "-p",
            "tcp",
            "-s",
            "10.1.0.50",
            "-d",
            "172.30.0.10",
            "--sport",
            "40001",
            "--dport",
            "80",
            "-o",
            "json",
        ],
    ));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["orig_src"], "10.1.0.50:40001");
    let missing = kxdp(
        a,
        &[
            "conntrack",
            "get",
            "-p",
            "tcp",
            "-s",
            "10.1.0.50",
            "-d",
            "172.30.0.10",
            "--sport",
            "49999",
            "--dport",
            "80",
        ],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        kxdp(a, &["conntrack", "get", "-p", "tcp"]).status.code(),
        Some(2)
    );

    // ---- conntrack stats, stats, services ----
    let st = ok(a, &["conntrack", "stats", "-o", "json"]);
    let st = json_lines(&st);
    let inject_worker = st.len() - 2; // the pseudo-worker is the last one; then the table line
    assert_eq!(st[inject_worker]["insert"], 3);
    assert_eq!(st.last().unwrap()["entries"], 3);
    assert_eq!(st.last().unwrap()["max_entries"], 4096);
    let table = ok(a, &["conntrack", "stats"]);
    assert!(
        table
            .contains("found=0 invalid=0 insert=3 insert_failed=0 drop=0 error=0 search_restart=0"),
        "{table}"
    );
    assert!(table.contains("entries=3 max=4096 early_drop=0"), "{table}");

    let stats = json_lines(&ok(a, &["stats", "-o", "json", "--interval", "0.2"]));
    let w = &stats[inject_worker];
    assert_eq!(w["packets"], 4);
    assert_eq!(w["drops"], json!({"no-endpoints": 1}));
    assert_eq!(w["actions"], json!({"forward": 3, "reject": 1}));
    assert!(w["mpps"].is_number() && w["busy"].is_number());
    assert_eq!(stats.last().unwrap()["conntrack_entries"], 3);
    let text = ok(a, &["stats", "--interval", "0"]);
    assert!(text.contains("packets=4"), "{text}");
    assert!(text.contains("no-endpoints=1"), "{text}");

    let svcs = json_lines(&ok(a, &["services", "-o", "json"]));
    let web = svcs
        .iter()
        .find(|r| r["frontend"] == "172.30.0.10:80")
        .expect("web frontend");
    assert_eq!(web["service"], "demo/web:http");
    assert_eq!(web["kind"], "ClusterIP");
    assert_eq!(web["proto"], "TCP");
    let backends: Vec<&str> = web["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap())
        .collect();
    assert_eq!(backends, ["10.1.0.10:8080", "10.2.0.10:8080"]);
    assert!(web["backends"][0]["local"].as_bool().unwrap());
    assert_eq!(web["backends"][0]["state"], "active");
    assert!(svcs
        .iter()
        .any(|r| r["kind"] == "NodePort" && r["service"] == "demo/lb-local:http"));
    let text = ok(a, &["services"]);
    assert!(text.starts_with("ID"), "{text}");
    assert!(
        text.lines().any(|l| l.contains("172.30.0.10:80/TCP")
            && l.contains("demo/web:http")
            && l.contains("1. 10.1.0.10:8080/TCP (active local)")),
        "{text}"
    );
    assert!(text.contains("2. 10.2.0.10:8080/TCP (active)"), "{text}");

    // ---- monitor: filtered, JSON, live ----
    let mut mon = Command::new(BIN)
        .args([
            "monitor",
            "-o",
            "json",
            "--reason",
            "no-endpoints",
            "--addr",
            "172.30.0.11",
            "--count",
            "1",
            "--admin",
        ])
        .arg(a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(mon.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(first.contains("listening"), "{first}");
    write_inject(&s.inject, &traffic(), 1);
    let t = Instant::now();
    while mon.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < DEADLINE, "monitor saw no event");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = mon.wait_with_output().unwrap();
    assert!(out.status.success());
    let ev = json_lines(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["reason"], "no-endpoints");
    assert_eq!(ev[0]["action"], "reject");
    assert_eq!(ev[0]["proto"], "TCP");
    assert_eq!(ev[0]["src"], "10.1.0.50:40003");
    assert_eq!(ev[0]["dst"], "172.30.0.11:80");
    assert!(ev[0]["time"].as_str().unwrap().ends_with('Z'), "{}", ev[0]);
    assert_eq!(ev[0]["service"], "demo/empty:http");
    assert_eq!(
        kxdp(a, &["monitor", "--reason", "bogus"]).status.code(),
        Some(2)
    );
    // The retransmitted SYNs of the second injection were counted on their entries.
    wait_for("the second injection's counts", || {
        let again = json_lines(&ok(
            a,
            &["conntrack", "list", "-o", "json", "--sport", "40000"],
        ));
        (again[0]["packets_orig"].as_u64()? == e0["packets_orig"].as_u64()? + 1
            && again[0]["bytes_orig"].as_u64()? > e0["bytes_orig"].as_u64()?)
        .then_some(())
    });

    // ---- HTTP: metrics ----
    let (code, _, body) = http_get(&s.metrics, "/metrics").unwrap();
    assert_eq!(code, 200);
    let wl = format!("worker=\"{inject_worker}\"");
    for needle in [
        format!("kxdp_packets_total{{{wl},action=\"forward\"}} 6"),
        format!("kxdp_packets_total{{{wl},action=\"reject\"}} 2"),
        "kxdp_drops_total{reason=\"no-endpoints\"} 2".to_string(),
        "kxdp_conntrack_entries 3".to_string(),
        "kxdp_conntrack_max_entries 4096".to_string(),
        "kxdp_conntrack_early_drops_total 0".to_string(),
        format!("kxdp_conntrack_created_total{{{wl}}} 3"),
        format!("kxdp_worker_busy_ratio{{{wl}}} "),
        format!("kxdp_umem_frames{{{wl}}} "),
        format!("kxdp_umem_free_frames{{{wl}}} "),
        format!("kxdp_worker_busy_seconds_total{{{wl}}} "),
        "kxdp_workers 2".to_string(),
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} ".to_string(),
    ] {
        assert!(body.contains(&needle), "{needle} missing in\n{body}");
    }
    // Up to date (a periodic resync may be running: allow a moment).
    let stale: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("kxdp_sync_stale_seconds "))
        .unwrap_or_else(|| panic!("kxdp_sync_stale_seconds missing in\n{body}"))
        .parse()
        .unwrap();
    assert!(stale < 5.0, "kxdp_sync_stale_seconds {stale}");
    assert_eq!(http_get(&s.metrics, "/nope").unwrap().0, 404);

    // ---- HTTP: healthz, livez ----
    let (code, _, body) = http_get(&s.healthz, "/healthz").unwrap();
    assert_eq!(code, 200, "{body}");
    let h: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(h["nodeEligible"], true);
    assert!(h["lastUpdated"].as_str().unwrap().ends_with('Z'));
    assert!(h["currentTime"].is_string());
    let (code, _, body) = http_get(&s.healthz, "/livez").unwrap();
    assert_eq!(code, 200, "{body}");
    let (_, _, m) = http_get(&s.metrics, "/metrics").unwrap();
    assert!(
        m.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("kubeproxy_proxy_livez_total{code=\"200\"} 1"),
        "{m}"
    );

    // ---- health check node ports ----
    let hc = |port: u16| http_get(&format!("127.0.0.1:{port}"), "/");
    let (code, headers, body) =
        wait_for("the health check node port server", || hc(s.hc_local).ok());
    assert_eq!(code, 200);
    assert_eq!(
        body,
        r#"{"service":{"namespace":"demo","name":"lb-local"},"localEndpoints":1,"serviceProxyHealthy":true}"#
    );
    assert!(headers.contains(&("x-load-balancing-endpoint-weight".into(), "1".into())));
    assert!(headers.contains(&("content-type".into(), "application/json".into())));
    let (code, headers, body) = wait_for("the second server", || hc(s.hc_remote).ok());
    assert_eq!(code, 503);
    assert_eq!(
        body,
        r#"{"service":{"namespace":"demo","name":"lb-remote"},"localEndpoints":0,"serviceProxyHealthy":true}"#
    );
    assert!(!headers
        .iter()
        .any(|(k, _)| k == "x-load-balancing-endpoint-weight"));

    // Services change: lb-remote deleted (its server stops), lb-local loses its local endpoint
    // (503 now); this node is being deleted (healthz 503, livez still 200).
    let mut env2 = Env::bare();
    env2.infra = s.env.infra.clone();
    env2.infra[1]["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    env2.infra[1]["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let mut objects: Vec<Value> = s
        .env
        .objects
        .iter()
        .filter(|o| {
            let n = o["metadata"]["name"].as_str().unwrap_or("");
            !n.starts_with("lb-")
        })
        .cloned()
        .collect();
    objects.extend(lb_local(
        "lb-local",
        "172.30.0.12",
        s.hc_local,
        30080,
        &[("10.2.0.12", NODE_B)],
    ));
    std::fs::write(
        s.env.path("state/cluster/nodes.yaml"),
        yaml_docs(&env2.infra),
    )
    .unwrap();
    std::fs::write(s.env.path("state/apps.yaml"), yaml_docs(&objects)).unwrap();
    wait_for("the remote server to stop", || {
        hc(s.hc_remote).is_err().then_some(())
    });
    wait_for("lb-local to lose its local endpoint", || {
        hc(s.hc_local).ok().filter(|r| r.0 == 503).map(|_| ())
    });
    let (code, _, body) = wait_for("healthz 503 for a node being deleted", || {
        http_get(&s.healthz, "/healthz").ok().filter(|r| r.0 == 503)
    });
    assert_eq!(code, 503);
    assert!(body.contains(r#""nodeEligible":false"#), "{body}");
    assert_eq!(http_get(&s.healthz, "/livez").unwrap().0, 200);
    // The health check node ports report the proxy's own health too (kube-proxy's
    // serviceProxyHealthy): a node being deleted is not a healthy backend.
    let (code, _, body) = hc(s.hc_local).unwrap();
    assert_eq!(code, 503);
    assert_eq!(
        body,
        r#"{"service":{"namespace":"demo","name":"lb-local"},"localEndpoints":0,"serviceProxyHealthy":false}"#
    );

    // ---- delete and flush (same filters) ----
    let deleted = json_lines(&ok(
        a,
        &["conntrack", "delete", "--sport", "40000", "-o", "json"],
    ));
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0]["orig_src"], "10.1.0.50:40000");
    assert_eq!(ok(a, &["conntrack", "count"]).trim(), "2");
    let out = ok(a, &["conntrack", "flush", "-p", "udp", "-o", "json"]);
    assert_eq!(json_lines(&out)[0]["deleted"], 0);
    let out = ok(a, &["conntrack", "flush"]);
    assert!(out.contains("2 flow entries deleted"), "{out}");
    assert_eq!(ok(a, &["conntrack", "count"]).trim(), "0");
    assert!(ok(a, &["conntrack", "list"]).is_empty());
    let (_, _, m) = http_get(&s.metrics, "/metrics").unwrap();
    assert!(m.contains("kxdp_conntrack_entries 0"), "{m}");

    // No daemon behind the socket: a runtime failure that says so.
    let o = kxdp(&s.env.path("nope.sock"), &["conntrack", "list"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect to the admin socket"));
}

/// The socket is root only: mode 0600, and a non-root peer that gets through anyway (the mode
/// loosened by hand) is refused by its credentials (SO_PEERCRED).
#[test]
fn non_root_client_is_refused() {
    let s = start();
    let a = s.daemon.admin.clone();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The binary and the socket must be reachable by uid 65534.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("kxdp");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |admin: &Path| {
        use std::os::unix::process::CommandExt;
        Command::new(&bin)
            .args(["conntrack", "count", "--admin"])
            .arg(admin)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let o = as_nobody(&a);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot connect"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for p in [s.env.dir.path(), a.parent().unwrap()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody(&a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("uid 65534"), "{err}");
    assert!(o.stdout.is_empty());
    // Root still gets in.
    assert_eq!(ok(&a, &["conntrack", "count"]).trim(), "0");
}

/// `kxdp monitor --rate N`: at most N events a second reach the client; the rest are counted and
/// reported once a second.
#[test]
fn monitor_is_rate_limited() {
    let s = start();
    let a = s.daemon.admin.clone();
    let mut mon = Command::new(BIN)
        .args(["monitor", "-o", "json", "--rate", "5", "--admin"])
        .arg(&a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(mon.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(first.contains("listening"), "{first}");
    // 40 new connections to a Service without endpoints: 40 rejects in one injection.
    let frames: Vec<Vec<u8>> = (0..40)
        .map(|i| syn(&format!("10.1.0.50:{}", 41000 + i), "172.30.0.11:80"))
        .collect();
    write_inject(&s.inject, &frames, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let out = mon.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut events = 0;
    let summary = loop {
        let l = rx
            .recv_timeout(DEADLINE)
            .expect("monitor output within the deadline");
        let v: Value = serde_json::from_str(&l).unwrap();
        if v.get("suppressed").is_some() {
            break v;
        }
        assert_eq!(v["reason"], "no-endpoints");
        events += 1;
    };
    let _ = mon.kill();
    let _ = mon.wait();
    assert_eq!(events, 5);
    assert_eq!(summary, json!({"suppressed": 35, "lost": 0}));
}

/// A UDP Service with one endpoint (`ip`), port 53 → 5353.
fn udp_service(ip: &str) -> Vec<Value> {
    vec![
        service(
            "dns",
            json!({"type": "ClusterIP", "clusterIP": "172.30.0.53", "clusterIPs": ["172.30.0.53"],
                   "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                   "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}),
        ),
        endpoint_slice(
            "dns",
            "dns-abcde",
            "IPv4",
            json!([sport("dns", 5353, "UDP")]),
            vec![endpoint(ip, NODE_A)],
        ),
    ]
}

/// Stale UDP state in the daemon (docs/nat.md): when a publication replaces a UDP Service's only
/// endpoint, the connection pinned to the old one is deleted, and the stream's next packet goes
/// to the new endpoint.
#[test]
fn daemon_deletes_stale_udp_connections_on_publication() {
    let mut s = start();
    let a = s.daemon.admin.clone();
    let a = a.as_path();
    s.env.add_all(udp_service("10.1.0.53"));
    s.env.write_files();
    let stream = || vec![udp("10.1.0.50:5000", "172.30.0.53:53", b"stat")];
    let udp_entries =
        |a: &Path| json_lines(&ok(a, &["conntrack", "list", "-p", "udp", "-o", "json"]));
    let mut bump = 0;
    let first = wait_for("a UDP connection to the first endpoint", || {
        bump += 1;
        write_inject(&s.inject, &stream(), bump);
        std::thread::sleep(Duration::from_millis(200));
        udp_entries(a).into_iter().next()
    });
    assert_eq!(first["reply_src"], "10.1.0.53:5353");

    // The endpoint is replaced (the later slice of the same name wins).
    s.env.add_all(udp_service("10.1.0.54"));
    s.env.write_files();
    wait_for("the stale UDP connection to be deleted", || {
        udp_entries(a).is_empty().then_some(())
    });
    let moved = wait_for("the stream on the new endpoint", || {
        bump += 1;
        write_inject(&s.inject, &stream(), bump);
        std::thread::sleep(Duration::from_millis(200));
        udp_entries(a).into_iter().next()
    });
    assert_eq!(moved["reply_src"], "10.1.0.54:5353");
}

/// A streaming command (`monitor`, `conntrack events`): started, waited for until it says on
/// stderr that it listens, then read line by line from stdout.
struct Stream {
    child: Child,
    rx: std::sync::mpsc::Receiver<String>,
}

impl Stream {
    fn start(admin: &Path, args: &[&str]) -> Stream {
        let mut child = Command::new(BIN)
            .args(args)
            .arg("--admin")
            .arg(admin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        err.read_line(&mut first).unwrap();
        assert!(first.contains("listening"), "{args:?}: {first}");
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Stream { child, rx }
    }

    fn next(&self, what: &str) -> String {
        self.rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("no {what} within the deadline"))
    }

    fn next_json(&self, what: &str) -> Value {
        let l = self.next(what);
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    }

    /// Nothing more within `d`.
    fn quiet_for(&self, d: Duration) -> Option<String> {
        self.rx.recv_timeout(d).ok()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// conntrack-tools' options beyond the filters: NAT, status, mark/zone (accepted, explained),
/// `-o extended`, validation and exit codes, `-S` with the kernel's counter names, and the
/// Service ids that `services`, `conntrack` and `monitor` share.
#[test]
fn conntrack_tools_options_and_exit_codes() {
    let s = start();
    let a = s.daemon.admin.clone();
    let a = a.as_path();
    let mut frames = traffic();
    // From outside the cluster CIDRs: masqueraded (source NAT to the node's address).
    frames.push(syn("203.0.113.7:40010", "172.30.0.10:80"));
    write_inject(&s.inject, &frames, 0);
    wait_for("4 conntrack entries", || {
        (ok(a, &["conntrack", "count"]).trim() == "4").then_some(())
    });
    let entries = json_lines(&ok(a, &["conntrack", "list", "-o", "json"]));
    let count = |args: &[&str]| {
        let mut v = vec!["conntrack", "list", "-o", "json"];
        v.extend_from_slice(args);
        json_lines(&ok(a, &v)).len()
    };

    // ---- NAT ----
    let snat: Vec<&Value> = entries
        .iter()
        .filter(|e| e["reply_dst"] != e["orig_src"])
        .collect();
    assert_eq!(snat.len(), 1, "{entries:?}");
    assert_eq!(snat[0]["orig_src"], "203.0.113.7:40010");
    let nat_addr = snat[0]["reply_dst"].as_str().unwrap();
    let nat_ip = nat_addr.split(':').next().unwrap();
    assert_eq!(count(&["--src-nat"]), 1);
    assert_eq!(count(&["--src-nat", nat_ip]), 1);
    assert_eq!(count(&["--src-nat", nat_addr]), 1);
    assert_eq!(count(&["--src-nat", "10.9.9.9"]), 0);
    assert_eq!(count(&["--dst-nat"]), 4);
    let via_a = entries
        .iter()
        .filter(|e| e["reply_src"] == "10.1.0.10:8080")
        .count();
    assert_eq!(count(&["--dst-nat", "10.1.0.10"]), via_a);
    assert_eq!(count(&["--dst-nat", "10.1.0.10:8080"]), via_a);
    assert_eq!(count(&["--dst-nat", "10.1.0.10:9999"]), 0);
    assert_eq!(count(&["--any-nat"]), 4);
    assert_eq!(count(&["--any-nat", nat_ip]), 1);
    assert_eq!(
        kxdp(a, &["conntrack", "list", "--dst-nat", "10.1.0.10:http"])
            .status
            .code(),
        Some(2)
    );

    // ---- status, mark, zone ----
    assert_eq!(count(&["--status", "UNSET"]), 4);
    assert_eq!(count(&["-u", "ASSURED"]), 0);
    assert_eq!(count(&["--status", "SEEN_REPLY,ASSURED"]), 0);
    let o = kxdp(a, &["conntrack", "list", "--status", "BOGUS"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr_of(&o).contains("unknown status `BOGUS`"),
        "{}",
        stderr_of(&o)
    );
    let o = kxdp(a, &["conntrack", "list", "-o", "json", "--mark", "0"]);
    assert!(o.status.success());
    assert_eq!(
        json_lines(&String::from_utf8(o.stdout.clone()).unwrap()).len(),
        4
    );
    assert!(stderr_of(&o).contains("mark 0"), "{}", stderr_of(&o));
    assert_eq!(count(&["--mark", "1"]), 0);
    assert_eq!(count(&["--mark", "0x10/0x0"]), 4);
    assert_eq!(count(&["--zone", "0"]), 4);
    assert_eq!(count(&["--zone", "3"]), 0);

    // ---- --state validation, -o extended ----
    let o = kxdp(a, &["conntrack", "list", "--state", "bogus"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr_of(&o).contains("unknown state `bogus`"),
        "{}",
        stderr_of(&o)
    );
    let ext = ok(
        a,
        &["conntrack", "list", "-o", "extended", "--sport", "40000"],
    );
    assert!(
        ext.starts_with("ipv4     2 tcp      6 ") && ext.contains(" SYN_SENT src=10.1.0.50 "),
        "{ext}"
    );

    // ---- exit codes: delete of nothing is 1 (conntrack -D), flush says what it removed ----
    let o = kxdp(a, &["conntrack", "delete", "--sport", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr_of(&o).contains("0 flow entries have been deleted"),
        "{}",
        stderr_of(&o)
    );
    let out = ok(a, &["conntrack", "flush", "-p", "udp"]);
    assert!(
        out.contains(
            "0 flow entries matching the filter have been deleted; the rest of the table is kept"
        ),
        "{out}"
    );
    assert_eq!(ok(a, &["conntrack", "count"]).trim(), "4");

    // ---- -S: the kernel's counter names, per worker ----
    let st = json_lines(&ok(a, &["conntrack", "stats", "-o", "json"]));
    let inject_worker = st.len() - 2;
    for k in [
        "found",
        "invalid",
        "insert",
        "insert_failed",
        "drop",
        "error",
        "search_restart",
        "clash_resolve",
        "chaintoolong",
    ] {
        assert!(st[inject_worker].get(k).is_some(), "{k} missing: {}", st[0]);
    }
    assert_eq!(st[inject_worker]["insert"], 4);
    assert!(st.last().unwrap().get("early_drop").is_some());
    let text = ok(a, &["conntrack", "stats"]);
    assert!(
        text.contains("found=0 invalid=0 insert=4 insert_failed=0 drop=0 error=0"),
        "{text}"
    );

    // ---- stable Service ids: services (table and JSON), conntrack, monitor agree ----
    let svcs = json_lines(&ok(a, &["services", "-o", "json"]));
    let web = svcs
        .iter()
        .find(|r| r["frontend"] == "172.30.0.10:80")
        .unwrap();
    let id = web["id"].as_u64().unwrap();
    assert!(id > 100_000, "ids are 32-bit hashes: {id}");
    let table = ok(a, &["services"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&format!("{id:<10} 172.30.0.10:80/TCP"))),
        "{table}"
    );
    assert!(entries.iter().all(|e| e["service_id"] == id), "{entries:?}");
}

/// `kxdp conntrack events` (conntrack -E): NEW when a connection appears, UPDATE when its state
/// changes, DESTROY when it goes, in conntrack's line shape or as JSON, with filters.
#[test]
fn conntrack_events_stream() {
    let s = start();
    let a = s.daemon.admin.clone();
    let a = a.as_path();
    let all = Stream::start(a, &["conntrack", "events", "-o", "json"]);
    let table = Stream::start(
        a,
        &[
            "conntrack",
            "events",
            "-e",
            "NEW",
            "--dport",
            "80",
            "--count",
            "3",
        ],
    );
    write_inject(&s.inject, &traffic(), 0);
    let mut news = Vec::new();
    for _ in 0..3 {
        let e = all.next_json("a NEW event");
        assert_eq!(e["event"], "new", "{e}");
        assert_eq!(e["orig_dst"], "172.30.0.10:80");
        assert_eq!(e["state"], "SYN_SENT");
        assert!(e["time"].as_str().unwrap().ends_with('Z'));
        news.push(e["orig_src"].as_str().unwrap().to_string());
    }
    news.sort();
    assert_eq!(
        news,
        ["10.1.0.50:40000", "10.1.0.50:40001", "10.1.0.50:40002"]
    );
    for _ in 0..3 {
        let l = table.next("a table line");
        assert!(
            l.starts_with("    [NEW] tcp      6 ")
                && l.contains(" SYN_SENT src=10.1.0.50 dst=172.30.0.10 "),
            "{l}"
        );
        assert!(l.ends_with("mark=0 service=demo/web:http"), "{l}");
    }

    // The backend answers: SYN_SENT -> SYN_RECV is an UPDATE.
    let e = &json_lines(&ok(
        a,
        &["conntrack", "list", "-o", "json", "--sport", "40001"],
    ))[0];
    let backend = e["reply_src"].as_str().unwrap().to_string();
    write_inject(
        &s.inject,
        &[tcp(
            &backend,
            "10.1.0.50:40001",
            flags::SYN | flags::ACK,
            5000,
            1001,
            &[],
        )],
        1,
    );
    let e = all.next_json("an UPDATE event");
    assert_eq!(e["event"], "update", "{e}");
    assert_eq!(e["orig_src"], "10.1.0.50:40001");
    assert_eq!(e["state"], "SYN_RECV");

    // Deleted: DESTROY, as last seen.
    ok(a, &["conntrack", "delete", "--sport", "40000"]);
    let e = all.next_json("a DESTROY event");
    assert_eq!(e["event"], "destroy", "{e}");
    assert_eq!(e["orig_src"], "10.1.0.50:40000");
    assert!(all.quiet_for(Duration::from_millis(500)).is_none());

    // The table stream stopped after its 3 events, and said so.
    let t = Instant::now();
    let mut child = table;
    while child.child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < DEADLINE, "events --count 3 did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(child.child.try_wait().unwrap().unwrap().success());
    let o = kxdp(a, &["conntrack", "events", "-e", "BOGUS"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr_of(&o).contains("--event-mask"), "{}", stderr_of(&o));
}

/// A pod of this node that may not talk to anyone (egress isolated, no rule).
fn locked_pod(env: &mut Env) {
    env.add(pod("locked", NODE_A, "10.1.0.60"));
    env.add(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": NS, "name": "lock-down"},
        "spec": {"podSelector": {"matchLabels": {"app": "locked"}}, "policyTypes": ["Egress"]}}),
    );
}

/// `kxdp monitor --type policy-verdict|trace`, `--sample`, `--hex`; `kxdp policy trace` against
/// the running daemon gives what the offline trace gives for the same files; `kxdp policy
/// counters` and `/metrics` count the denials per rule.
#[test]
fn monitor_policy_verdicts_sampling_hex_and_live_policy_trace() {
    let s = start_with(locked_pod, &[]);
    let a = s.daemon.admin.clone();
    let a = a.as_path();

    // ---- policy verdicts, with the packets' bytes ----
    let pv = Stream::start(
        a,
        &["monitor", "--type", "policy-verdict", "-o", "json", "--hex"],
    );
    let denied = syn("10.1.0.60:42000", "172.30.0.10:80");
    let allowed = syn("10.1.0.50:42001", "172.30.0.10:80");
    write_inject(&s.inject, &[denied.clone(), allowed.clone()], 0);
    let mut evs = [pv.next_json("a policy verdict"), pv.next_json("another")];
    evs.sort_by_key(|e| e["src"].as_str().unwrap().to_string());
    let hex = |f: &[u8]| f.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(evs[0]["type"], "policy-verdict");
    assert_eq!(evs[0]["policy"], "allow");
    assert_eq!(evs[0]["reason"], "service-dnat");
    assert_eq!(evs[0]["src"], "10.1.0.50:42001");
    assert!(
        ["10.1.0.10:8080", "10.2.0.10:8080"].contains(&evs[0]["out_dst"].as_str().unwrap()),
        "{}",
        evs[0]
    );
    assert_eq!(evs[0]["hex"], hex(&allowed));
    assert_eq!(evs[0]["len"], allowed.len());
    assert_eq!(evs[1]["policy"], "deny");
    assert_eq!(evs[1]["reason"], "policy-denied-egress");
    assert_eq!(evs[1]["action"], "drop");
    assert_eq!(evs[1]["hex"], hex(&denied));
    drop(pv);

    // The table form: one line per event, the hex dump under it.
    let pv = Stream::start(
        a,
        &[
            "monitor",
            "--type",
            "policy-verdict",
            "--hex",
            "--count",
            "1",
        ],
    );
    write_inject(&s.inject, &[syn("10.1.0.60:42002", "172.30.0.10:80")], 1);
    let l = pv.next("a policy verdict line");
    assert!(
        l.contains("DROP    policy-denied-egress") && l.ends_with("policy-verdict: deny"),
        "{l}"
    );
    let d = pv.next("the hex dump");
    assert!(d.starts_with("  0000: "), "{d}");
    drop(pv);

    // ---- trace events, one in two ----
    let tr = Stream::start(
        a,
        &[
            "monitor", "--type", "trace", "--sample", "2", "--rate", "1000", "-o", "json",
        ],
    );
    let frames: Vec<Vec<u8>> = (0..10)
        .map(|i| syn(&format!("203.0.113.7:{}", 43000 + i), "172.30.0.10:80"))
        .collect();
    write_inject(&s.inject, &frames, 2);
    for _ in 0..5 {
        let e = tr.next_json("a trace event");
        assert_eq!(e["type"], "trace", "{e}");
        assert_eq!(e["action"], "forward");
        assert_eq!(e["service"], "demo/web:http");
        assert!(e.get("hex").is_none());
    }
    assert_eq!(tr.quiet_for(Duration::from_millis(1500)), None);
    drop(tr);
    assert_eq!(
        kxdp(a, &["monitor", "--type", "bogus"]).status.code(),
        Some(2)
    );

    // ---- policy trace: live (admin socket) = offline (the same files) ----
    let q = ["--from", "10.1.0.60", "--to", "172.30.0.10:80"];
    let mut live_args = vec!["policy", "trace"];
    live_args.extend_from_slice(&q);
    let live = ok(a, &live_args);
    let offline = Command::new(BIN)
        .args(["policy", "trace", "--config"])
        .arg(s.env.path("config.yaml"))
        .arg("--state")
        .arg(s.env.path("state"))
        .args(q)
        .output()
        .unwrap();
    assert!(offline.status.success(), "{}", stderr_of(&offline));
    assert_eq!(live, String::from_utf8(offline.stdout).unwrap());
    assert!(live.contains("lock-down"), "{live}");
    let o = kxdp(&s.env.path("nope.sock"), &live_args);
    assert_eq!(o.status.code(), Some(1));

    // ---- per-rule counters: the two SYNs the lock-down's isolation denied ----
    let rows = json_lines(&ok(a, &["policy", "counters", "-o", "json"]));
    assert_eq!(
        rows,
        [
            json!({"kind": "NetworkPolicy", "policy": "demo/lock-down", "direction": "egress",
                "rule": "isolation", "verdict": "deny", "connections": 2})
        ]
    );
    let table = ok(a, &["policy", "counters"]);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("KIND "), "{table}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        [
            "NetworkPolicy",
            "demo/lock-down",
            "egress",
            "isolation",
            "deny",
            "2"
        ]
    );
    let (_, _, m) = http_get(&s.metrics, "/metrics").unwrap();
    let want = "kxdp_policy_connections_total{kind=\"NetworkPolicy\",policy=\"demo/lock-down\",direction=\"egress\",rule=\"isolation\",verdict=\"deny\"} 2";
    assert!(m.contains(want), "{m}");
}

/// `kxdp status`: readiness, the tables (generation, last publication), the source and its
/// health, the interfaces, drops and conntrack, as a table and as one JSON object.
#[test]
fn status_at_a_glance() {
    let s = start();
    let a = s.daemon.admin.clone();
    let a = a.as_path();
    write_inject(&s.inject, &traffic(), 0);
    wait_for("3 conntrack entries and a drop", || {
        let v: Value = serde_json::from_str(ok(a, &["status", "-o", "json"]).trim()).ok()?;
        (v["conntrack"]["entries"] == 3 && v["drops"]["total"].as_u64()? > 0).then_some(())
    });
    let out = ok(a, &["status", "-o", "json"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["ready"], true, "{v}");
    assert_eq!(v["healthy"], true, "{v}");
    assert!(v["generation"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["last_sync"].is_string() && v["last_sync_ago_s"].is_number(),
        "{v}"
    );
    assert_eq!(v["source"]["kind"], "files", "{v}");
    assert_eq!(
        v["source"]["detail"],
        s.env.path("state").display().to_string(),
        "{v}"
    );
    assert_eq!(v["source"]["healthy"], true, "{v}");
    assert_eq!(v["interfaces"], json!([]), "{v}");
    assert_eq!(v["conntrack"]["max_entries"], 4096, "{v}");
    // The SYN to the Service without endpoints was rejected.
    assert_eq!(v["drops"]["top"][0]["reason"], "no-endpoints", "{v}");
    assert_eq!(v["drops"]["by_reason"]["no-endpoints"], 1, "{v}");

    let text = ok(a, &["status"]);
    for want in [
        "ready:       yes, /healthz ok\n".to_string(),
        format!(
            "tables:      generation {}, last published ",
            v["generation"]
        ),
        format!(
            "source:      --state files ({}), healthy\n",
            s.env.path("state").display()
        ),
        "interfaces:  none configured (no packet is forwarded by kxdp)\n".to_string(),
        "drops:       1 total (top: no-endpoints 1)\n".to_string(),
        "conntrack:   3/4096 entries, 0 early drop(s)\n".to_string(),
    ] {
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }

    // A source that fails: the state directory becomes unreadable (a file that is no manifest).
    std::fs::write(s.env.path("state/broken.yaml"), "kind: [\n").unwrap();
    let v = wait_for("the source's failure", || {
        let v: Value = serde_json::from_str(ok(a, &["status", "-o", "json"]).trim()).ok()?;
        (v["source"]["healthy"] == false).then_some(v)
    });
    assert!(
        v["source"]["errors"]["files"]
            .as_str()
            .unwrap()
            .contains("broken.yaml"),
        "{v}"
    );
    let text = ok(a, &["status"]);
    assert!(text.contains("failing: files: "), "{text}");
    // No daemon: the same message and exit code as the other commands.
    let o = kxdp(&s.env.path("nowhere.sock"), &["status"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect to the admin socket"));
}

/// Logs: `--log-format json` gives one JSON object per line; text logs carry no ANSI colour
/// when stderr is not a terminal.
#[test]
fn daemon_logs_text_and_json() {
    let s = start_with(|_| {}, &["--log-format", "json"]);
    let log = wait_for("a JSON log line", || {
        let l = std::fs::read_to_string(s.env.path("stderr.log")).ok()?;
        l.contains("control plane running").then_some(l)
    });
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{v}");
    }
    // The stop (SIGTERM, as the daemon is dropped) too: every line of the whole run is JSON.
    let Setup { env, daemon, .. } = s;
    drop(daemon);
    let log = std::fs::read_to_string(env.path("stderr.log")).unwrap();
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{v}");
    }
    drop(env);
    let s = start_with(|_| {}, &["-v"]);
    let log = wait_for("a text log line", || {
        let l = std::fs::read_to_string(s.env.path("stderr.log")).ok()?;
        l.contains("control plane running").then_some(l)
    });
    assert!(!log.contains('\u{1b}'), "ANSI escapes in {log}");
    assert!(log.contains(" WARN "), "{log}");
    assert_eq!(
        Command::new(BIN)
            .args(["version", "--log-level", "nope=="])
            .output()
            .unwrap()
            .status
            .code(),
        Some(2)
    );
}
