//! `kxdp run --log-format json` on the lab (tests/lab/mod.rs): from start to stop, with real
//! XDP programs, AF_XDP workers and the host path, every line the daemon writes on stderr is one
//! JSON object, as log pipelines (`kubectl logs` into Loki, Elasticsearch...) expect. On the way,
//! `kxdp status` shows the interfaces as attached, with their XDP mode and sockets.

mod lab;

use std::process::Command;
use std::time::{Duration, Instant};

use lab::{lab_files, Cluster, Kxdp};

#[test]
fn lab_json_logs_from_start_to_stop() {
    if !lab::available("lab_json_logs_from_start_to_stop") {
        return;
    }
    let c = Cluster::build();
    let (config, state) = lab_files();
    let dir = tempfile::tempdir().unwrap();
    // The lab's config, plus a pattern matching a tun device, which cannot take XDP (no
    // Ethernet address): `status` reports it as not attached, with the error.
    let config_text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("interfaces: [up0,", "interfaces: [\"vtun*\", up0,");
    assert!(config_text.contains("vtun*"), "{config_text}");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, config_text).unwrap();
    let config = config.to_str().unwrap().to_string();
    let st = Command::new("ip")
        .args([
            "netns", "exec", &c.node, "ip", "tuntap", "add", "dev", "vtun0", "mode", "tun",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let admin = dir.path().join("admin.sock");
    let admin = admin.to_str().unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &c.node, env!("CARGO_BIN_EXE_kxdp"), "run"])
        .args(["--config", &config, "--state", &state])
        .args(["--admin", admin, "--no-takeover"])
        // --log-level wins over the lab's RUST_LOG: the default level of `kxdp run`.
        .args(["--log-format", "json", "--log-level", "info"]);
    let mut k = Kxdp::spawn(cmd, Duration::from_secs(20));

    // The admin socket is a path: reachable from outside the node's network namespace.
    let out = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args(["status", "-o", "json", "--admin", admin])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ready"], true, "{v}");
    let ifaces = v["interfaces"].as_array().unwrap();
    // up0, the pods' veths and the host path's kxdp1: all attached, each with its socket(s).
    for name in ["up0", "vpod1", "vpod2", "vpod3", "kxdp1"] {
        let i = ifaces
            .iter()
            .find(|i| i["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {v}"));
        assert_eq!(i["attached"], true, "{i}");
        assert!(
            i["xdp_mode"] == "native" || i["xdp_mode"] == "generic",
            "{i}"
        );
        assert!(i["sockets"].as_u64().unwrap() >= 1, "{i}");
    }
    let tun = ifaces
        .iter()
        .find(|i| i["name"] == "vtun0")
        .unwrap_or_else(|| panic!("vtun0 not in {v}"));
    assert_eq!(tun["attached"], false, "{tun}");
    assert!(!tun["error"].as_str().unwrap().is_empty(), "{tun}");
    let text = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args(["status", "--admin", admin])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    assert!(text.contains("interfaces:  kxdp1 "), "{text}");
    assert!(text.contains("attached, XDP "), "{text}");
    assert!(text.contains("vtun0            NOT attached: "), "{text}");

    let status = k.stop().expect("kxdp run exits");
    assert!(status.success(), "{status:?}");
    // The reader thread sees EOF shortly after the exit.
    let t = Instant::now();
    let log = loop {
        let log = k.stderr.lock().unwrap().clone();
        if log.contains("host path removed") || t.elapsed() > Duration::from_secs(5) {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut messages = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{log}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string() && v["target"].is_string(),
            "{line}"
        );
        messages.push(
            v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    // The start, the interfaces, and the stop's report: each of them a JSON line.
    for want in [
        "kxdp run: forwarding on",
        "kxdp: attached up0",
        "kxdp: vtun0: cannot take kxdp's XDP program",
        "kxdp run: XDP programs detached",
        "kxdp run: worker 0: rx",
        "kxdp run: host path removed",
    ] {
        assert!(
            messages.iter().any(|m| m.starts_with(want)),
            "no {want:?} in:\n{log}"
        );
    }
}
