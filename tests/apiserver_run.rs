//! `kxdp run` without interfaces (the control plane alone) against the fake API server and against `--state`
//! files: it syncs, serves /metrics, says that no packet is forwarded, and exits 0 on
//! SIGTERM.

mod fake_apiserver;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_apiserver::FakeApiServer;
use serde_json::json;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn run_until_synced(args: &[&str], port: u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(m) = scrape(port) {
            if m.contains("kxdp_sync_snapshot_generation 1")
                || m.contains("kxdp_sync_snapshot_generation 2")
            {
                assert!(m.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds"));
                break;
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "kxdp run never synced: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kxdp run did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status:?}: {err}");
    // Without interfaces in the config no AF_XDP worker runs, and it says so.
    assert!(err.contains("no packet is forwarded by kxdp"), "{err}");
}

#[test]
fn run_against_the_api_server() {
    let server = FakeApiServer::start();
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}}));
    server.apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ns"},
                        "spec": {"clusterIP": "172.30.0.10", "ports": [{"port": 80}]}}));
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc);
    let port = free_port();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nmetricsBindAddress: 127.0.0.1:{port}\nhealthzBindAddress: \"\"\nconntrack: {{stateFile: \"\"}}\n"),
    )
    .unwrap();
    run_until_synced(
        &[
            "run",
            "--no-admin",
            "--config",
            cfg.to_str().unwrap(),
            "--kubeconfig",
            kc.to_str().unwrap(),
        ],
        port,
    );
}

#[test]
fn run_with_state_files() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(
        state.join("svc.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec: {clusterIP: 172.30.0.10, ports: [{port: 80}]}\n",
    )
    .unwrap();
    let port = free_port();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2]\nmetricsBindAddress: 127.0.0.1:{port}\nhealthzBindAddress: \"\"\nconntrack: {{stateFile: \"\"}}\n"),
    )
    .unwrap();
    run_until_synced(
        &[
            "run",
            "--no-admin",
            "--config",
            cfg.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ],
        port,
    );
    // Bad state at startup: exit 2 naming the file.
    std::fs::write(state.join("bad.yaml"), "kind: [\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args([
            "run",
            "--no-admin",
            "--config",
            cfg.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.yaml"));
}
