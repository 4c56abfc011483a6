//! The configuration as an operator meets it through the binary: a KubeProxyConfiguration is
//! recognised and converted, values the machine cannot honour are refused before anything is
//! allocated (exit 2, file, line and field in plain words).

use std::path::Path;
use std::process::Command;

fn kxdp(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

const KUBE_PROXY: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: 10.244.0.0/16\nnftables: {syncPeriod: 20s}\nipvs: {scheduler: lc}\n";

#[test]
fn kube_proxy_configuration_is_recognised_and_converted() {
    let dir = tempfile::tempdir().unwrap();
    let kp = write(dir.path(), "kube-proxy.yaml", KUBE_PROXY);
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let (code, _, err) = kxdp(&["run", "--config", &kp, "--state", state.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("kube-proxy.yaml:2: kind: this is kube-proxy's configuration (KubeProxyConfiguration), not kxdp's: run `kxdp config convert"),
        "{err}"
    );
    let (code, out, err) = kxdp(&["config", "convert", &kp]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("#   ipvs.scheduler: lc"), "{out}");
    let converted = write(dir.path(), "kxdp.yaml", &out);
    let c = kxdp_control::Config::load(Path::new(&converted)).unwrap();
    assert_eq!(c.sync.sync_period.0.as_secs(), 20);
    assert_eq!(c.cluster_cidrs[0].to_string(), "10.244.0.0/16");
}

#[test]
fn absurd_values_are_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let st = state.to_str().unwrap();
    let head = "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: n\n";
    for (body, want) in [
        (
            "workers:\n  cpus: [0, 99]\n",
            "c.yaml: workers.cpus[1]: CPU 99 does not exist on this machine",
        ),
        (
            "conntrack:\n  maxEntries: 4294967295\n",
            "c.yaml:5: conntrack.maxEntries: 4294967295 is too large: at most 67108864",
        ),
        (
            "workers:\n  count: 100000\n",
            "c.yaml:5: workers.count: 100000 is too large: at most 256",
        ),
        (
            "conntrack:\n  tcpEstablishedTimeout: 18446744073709551s\n",
            "c.yaml:5: conntrack.tcpEstablishedTimeout: `18446744073709551s` is too long",
        ),
    ] {
        let c = write(dir.path(), "c.yaml", &format!("{head}{body}"));
        let (code, _, err) = kxdp(&["run", "--config", &c, "--state", st, "--no-admin"]);
        assert_eq!(code, 2, "{body}: {err}");
        assert!(err.contains(want), "{body}: {err}");
    }
}

fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The running daemon's metrics port answers /configz (the configuration after nodeOverrides
/// and the NODE_NAME default), /proxyMode, and /metrics with build and process metrics.
#[test]
fn configz_proxy_mode_and_process_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    write(
        &state,
        "node.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-z, labels: {pool: edge}}\n",
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = write(
        dir.path(),
        "c.yaml",
        &format!(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nhealthzBindAddress: \"\"\nmetricsBindAddress: 127.0.0.1:{port}\nconntrack: {{maxEntries: 1024, stateFile: \"\"}}\nworkers: {{count: 1}}\nnodeOverrides:\n  - nodeSelector: {{matchLabels: {{pool: edge}}}}\n    workers: {{count: 3}}\n"
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args([
            "run",
            "--config",
            &c,
            "--state",
            state.to_str().unwrap(),
            "--no-admin",
        ])
        .env("NODE_NAME", "node-z")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let configz = loop {
        if let Some(r) = http_get(&addr, "/configz") {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metrics server never answered"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let body = configz.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["kxdp.dev"]["nodeName"], "node-z", "{body}");
    assert_eq!(v["kxdp.dev"]["workers"]["count"], 3, "{body}");
    let mode = http_get(&addr, "/proxyMode").unwrap();
    assert!(
        mode.starts_with("HTTP/1.1 200") && mode.ends_with("kxdp"),
        "{mode}"
    );
    let metrics = http_get(&addr, "/metrics").unwrap();
    for needle in [
        "kxdp_build_info{version=\"0.1.0\"",
        "process_resident_memory_bytes ",
        "process_start_time_seconds ",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}",
    ] {
        assert!(metrics.contains(needle), "{needle} missing in\n{metrics}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A KubeProxyConfiguration kube-proxy would refuse for a wrong type is refused by convert too:
/// exit 2, the file, the field's full path and what was expected.
#[test]
fn convert_refuses_wrong_types() {
    let dir = tempfile::tempdir().unwrap();
    for (body, want) in [
        (
            "masqueradeAll: \"yes\"\n",
            "masqueradeAll: expected a boolean (true or false), found the string \"yes\"",
        ),
        (
            "conntrack:\n  maxPerCore: lots\n",
            "conntrack.maxPerCore: expected an integer from 0 to 2147483647, found the string \"lots\"",
        ),
        (
            "conntrack:\n  tcpEstablishedTimeout: 86400\n",
            "conntrack.tcpEstablishedTimeout: expected a duration string",
        ),
    ] {
        let kp = write(
            dir.path(),
            "kube-proxy.yaml",
            &format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}"),
        );
        let (code, out, err) = kxdp(&["config", "convert", &kp]);
        assert_eq!(code, 2, "{body}: {err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(&format!("kube-proxy.yaml: {want}")), "{body}: {err}");
    }
}
