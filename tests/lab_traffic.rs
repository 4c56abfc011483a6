//! `kxdp pcap send` and `kxdp pcap sink` over a veth pair between two namespaces the test
//! creates: the sink counts exactly what the sender sent, with the sender's timestamps.

mod lab;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use lab::{ip, kxdp_in, last_json, Lab};

/// Starts a sink in `ns` on eth0; returns it once its XDP program is attached.
fn start_sink(ns: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["pcap", "sink", "--iface", "eth0", "--duration", "20"];
    args.extend_from_slice(extra);
    let mut sink = kxdp_in(ns, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kxdp pcap sink");
    let err = sink.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if l.contains("sink ready") {
                let _ = tx.send(());
            }
            eprintln!("sink: {l}");
        }
    });
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        let _ = sink.kill();
        panic!("the sink did not start");
    }
    sink
}

#[test]
fn send_n_packets_sink_counts_n_with_latency() {
    if !lab::available("send_n_packets_sink_counts_n_with_latency") {
        return;
    }
    let mut l = Lab::new();
    let a = l.netns("gen-tx");
    let b = l.netns("gen-rx");
    l.veth(&a, "eth0", &b, "eth0");
    ip(&a, "addr add 10.99.0.1/24 dev eth0");
    ip(&b, "addr add 10.99.0.2/24 dev eth0");
    let mac = l.mac(&b, "eth0");
    let mac = mac.map(|o| format!("{o:02x}")).join(":");

    let n = 20_000u64;
    let sink = start_sink(&b, &["--idle-exit", "1000", "--count", &n.to_string()]);
    let sent = kxdp_in(
        &a,
        &[
            "pcap",
            "send",
            "--iface",
            "eth0",
            "--rate",
            "50000",
            "--duration",
            "10",
            "--count",
            &n.to_string(),
            "--dst-mac",
            &mac,
            "--src",
            "10.99.0.1",
            "--dst",
            "10.99.0.2:9",
            "--flows",
            "16",
        ],
    )
    .output()
    .expect("kxdp pcap send");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let s = last_json(&sent.stdout);
    let out = sink.wait_with_output().unwrap();
    assert!(out.status.success());
    let r = last_json(&out.stdout);
    eprintln!("sent {s}\nsink {r}");
    assert_eq!(s["sent"].as_u64(), Some(n), "{s}");
    assert_eq!(r["received"].as_u64(), Some(n), "{r}");
    assert_eq!(r["timestamped"].as_u64(), Some(n), "{r}");
    assert_eq!(r["bytes"].as_u64(), Some(n * 64), "{r}");
    let p50 = r["latency_ns"]["p50"].as_u64().unwrap();
    assert!(p50 > 0 && p50 < 1_000_000_000, "{r}");
    // The sender paced itself: 20,000 packets at 50 kpps take about 0.4 s.
    let secs = s["seconds"].as_f64().unwrap();
    assert!((0.3..3.0).contains(&secs), "{s}");
}

#[test]
fn send_replays_a_capture_and_rejects_bad_flags() {
    if !lab::available("send_replays_a_capture_and_rejects_bad_flags") {
        return;
    }
    let mut l = Lab::new();
    let a = l.netns("gen-tx");
    let b = l.netns("gen-rx");
    l.veth(&a, "eth0", &b, "eth0");
    // A capture of TCP to ClusterIPs from `kxdp pcap gen`: sent as is, in a loop.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let g = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args([
            "pcap",
            "gen",
            "--out-dir",
            d,
            "--services",
            "10",
            "--flows",
            "100",
        ])
        .args(["--packets", "300"])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let sink = start_sink(&b, &["--idle-exit", "1000", "--count", "1000"]);
    let pcap = format!("{d}/capture.pcap");
    let sent = kxdp_in(
        &a,
        &[
            "pcap",
            "send",
            "--iface",
            "eth0",
            "--capture",
            &pcap,
            "--count",
            "1000",
        ],
    )
    .output()
    .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert_eq!(last_json(&sent.stdout)["frames"].as_u64(), Some(300));
    let r = last_json(&sink.wait_with_output().unwrap().stdout);
    assert_eq!(r["received"].as_u64(), Some(1000), "{r}");
    assert_eq!(r["timestamped"].as_u64(), Some(0), "{r}");

    for bad in [
        &["--rate", "0"][..],
        &["--rate", "fast"],
        &[
            "--dst-mac",
            "02:00",
            "--src",
            "10.0.0.1",
            "--dst",
            "10.0.0.2:9",
        ],
        &[
            "--size",
            "20",
            "--dst-mac",
            "02:00:00:00:00:01",
            "--src",
            "10.0.0.1",
            "--dst",
            "10.0.0.2:9",
        ],
    ] {
        let o = kxdp_in(
            &a,
            &[&["pcap", "send", "--iface", "eth0"][..], bad].concat(),
        )
        .output()
        .unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "{bad:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = kxdp_in(&a, &["pcap", "sink", "--iface", "nosuch0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}
