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
conntrack: {maxEntries: 4096}
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
    env.write_files();
    let admin = env.path("run/admin.sock");
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
        .stdout(Stdio::null())
        .stderr(Stdio::null())
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

    // ---- conntrack list: JSON as CONTRACT.md, and the table shape ----
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
    assert!(table.contains("insert=3 found=0"), "{table}");
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
        format!("kxdp_worker_busy_seconds_total{{{wl}}} "),
        "kxdp_workers 2".to_string(),
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} ".to_string(),
    ] {
        assert!(body.contains(&needle), "{needle} missing in\n{body}");
    }
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
