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

/// Runs kxdp until it has synced, stops it; its log.
fn run_until_synced(args: &[&str], port: u16) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kxdp"));
    cmd.args(args);
    run_cmd_until_synced(cmd, port)
}

/// `run_until_synced` of a command that runs (or execs) kxdp.
fn run_cmd_until_synced(mut cmd: Command, port: u16) -> String {
    let mut child = cmd
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
    err
}

/// Against the fake API server through a kubeconfig; with serviceCIDRs that hold the server's
/// address, kxdp warns at start that the address is a ClusterIP (and syncs all the same).
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
    for service_cidrs in ["[172.30.0.0/16]", "[172.30.0.0/16, 127.0.0.0/8]"] {
        let port = free_port();
        let cfg = dir.path().join("config.yaml");
        std::fs::write(
            &cfg,
            format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nserviceCIDRs: {service_cidrs}\nmetricsBindAddress: 127.0.0.1:{port}\nhealthzBindAddress: \"\"\nconntrack: {{stateFile: \"\"}}\n"),
        )
        .unwrap();
        let err = run_until_synced(
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
        let warned = err.matches("is in serviceCIDRs (127.0.0.0/8)").count();
        let want = usize::from(service_cidrs.contains("127."));
        assert_eq!(warned, want, "{service_cidrs}: {err}");
    }
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

/// A TLS front for the fake API server on 127.0.0.1 (a certificate for that address signed by
/// `ca`): kxdp in a pod speaks https only. Runs until the test process ends.
fn tls_front(backend: std::net::SocketAddr, cert: &std::path::Path, key: &std::path::Path) -> u16 {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(tls));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(conn).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
    });
    port
}

/// A CA and a server certificate for 127.0.0.1 signed by it (openssl); (ca.crt, server.crt,
/// server.key).
fn certificates(
    dir: &std::path::Path,
) -> Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: Vec<Vec<String>> = vec![
        [
            &["req", "-x509"][..],
            &ec[..],
            &[
                "-days",
                "1",
                "-subj",
                "/CN=kxdp-test-ca",
                "-keyout",
                &p("ca.key"),
                "-out",
                &p("ca.crt"),
            ],
        ]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect(),
        [
            &["req"][..],
            &ec[..],
            &[
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                &p("server.key"),
                "-out",
                &p("server.csr"),
            ],
        ]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect(),
        [
            "x509",
            "-req",
            "-in",
            &p("server.csr"),
            "-CA",
            &p("ca.crt"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &p("ext.cnf"),
            "-out",
            &p("server.crt"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    for args in steps {
        let out = match Command::new("openssl").args(&args).output() {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("openssl: {e}"),
        };
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some((
        dir.join("ca.crt"),
        dir.join("server.crt"),
        dir.join("server.key"),
    ))
}

/// kxdp as the DaemonSet runs it: no kubeconfig, the API server's own address in
/// KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT (from the ConfigMap kxdp-apiserver), the
/// service account's token and CA at their fixed paths. The fake API server is reachable only
/// at its own address (127.0.0.1, behind TLS); kxdp syncs from it and does not warn (the address
/// is outside serviceCIDRs). The secrets are put in place in a mount namespace of kxdp's own (a
/// tmpfs over /run), so the host's /var/run/secrets is not touched. Needs root, unshare and
/// openssl; skipped (saying so) without them.
#[test]
fn run_in_cluster_with_the_api_servers_own_address() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !root {
        eprintln!("run_in_cluster_with_the_api_servers_own_address: skipped: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some((ca, cert, key)) = certificates(dir.path()) else {
        eprintln!("run_in_cluster_with_the_api_servers_own_address: skipped: no openssl");
        return;
    };
    let server = FakeApiServer::start();
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}}));
    server.apply(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "ns"},
                        "spec": {"clusterIP": "172.30.0.10", "ports": [{"port": 80}]}}));
    let backend: std::net::SocketAddr = server.url().trim_start_matches("http://").parse().unwrap();
    let tls_port = tls_front(backend, &cert, &key);
    let sa = dir.path().join("serviceaccount");
    std::fs::create_dir(&sa).unwrap();
    std::fs::copy(&ca, sa.join("ca.crt")).unwrap();
    std::fs::write(sa.join("token"), "kxdp-test-token").unwrap();
    std::fs::write(sa.join("namespace"), "kube-system").unwrap();
    let port = free_port();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nserviceCIDRs: [172.30.0.0/16]\nmetricsBindAddress: 127.0.0.1:{port}\nhealthzBindAddress: \"\"\nconntrack: {{stateFile: \"\"}}\n"),
    )
    .unwrap();
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && cp {sa}/* /run/secrets/kubernetes.io/serviceaccount/ && exec {kxdp} run --no-admin --config {cfg}",
        sa = sa.display(),
        kxdp = env!("CARGO_BIN_EXE_kxdp"),
        cfg = cfg.display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env_remove("KUBECONFIG")
        .env("HOME", dir.path())
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", tls_port.to_string());
    let err = run_cmd_until_synced(cmd, port);
    assert!(!err.contains("is in serviceCIDRs"), "{err}");
}

/// `conntrack.stateFile` unset: `kxdp run` keeps the table in /run/kxdp/ct/conntrack when /run
/// is a tmpfs it can write, and otherwise starts all the same with the table in process memory,
/// saying why in one warning line. Each case in a mount namespace of its own with a tmpfs of
/// its own on /run (read-only for the second), so the host's /run is not touched. Needs root
/// and unshare; skipped (saying so) without them.
#[test]
fn run_with_the_default_state_file() {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !root || Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("run_with_the_default_state_file: skipped: needs root and unshare");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(
        state.join("svc.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec: {clusterIP: 172.30.0.10, ports: [{port: 80}]}\n",
    )
    .unwrap();
    for (mount, want) in [
        ("rw", "conntrack table: 0 MiB in the state file /run/kxdp/ct/conntrack"),
        ("ro", "conntrack.stateFile is not set and its default /run/kxdp/ct/conntrack cannot be used (cannot create the directory /run/kxdp/ct"),
    ] {
        let port = free_port();
        let cfg = dir.path().join("config.yaml");
        std::fs::write(
            &cfg,
            format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nmetricsBindAddress: 127.0.0.1:{port}\nhealthzBindAddress: \"\"\nconntrack: {{maxEntries: 1024}}\n"),
        )
        .unwrap();
        let script = format!(
            "mount -t tmpfs -o {mount} tmpfs /run && exec {kxdp} run --no-admin --config {cfg} --state {state}",
            kxdp = env!("CARGO_BIN_EXE_kxdp"),
            cfg = cfg.display(),
            state = state.display(),
        );
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
        let err = run_cmd_until_synced(cmd, port);
        assert!(err.contains(want), "{mount}: {err}");
        let warnings = err
            .lines()
            .filter(|l| l.contains("conntrack.stateFile"))
            .count();
        assert_eq!(warnings, usize::from(mount == "ro"), "{mount}: {err}");
    }
}
