//! Acceptance: the `kxdp replay` command line: workers, repeat and the JSON summary, output link
//! types, and bad input (config, state, pcap) → exit code 2 with a message naming the culprit.

mod support;

use std::collections::BTreeMap;
use std::process::Output;

use kxdp_packet::LinkType;
use serde_json::{json, Value};
use support::*;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn assert_exit_2(o: &Output, must_name: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "exit code; stderr:\n{err}");
    for s in must_name {
        assert!(err.contains(s), "stderr should name {s:?}:\n{err}");
    }
}

fn services_env() -> Env {
    let mut env = Env::new();
    env.add_all(simple_service(
        "web",
        "172.30.6.10",
        80,
        8080,
        &[
            ("10.1.0.10", NODE_A),
            ("10.2.0.10", NODE_B),
            ("10.3.0.10", NODE_C),
        ],
    ));
    env.add(service(
        "dns",
        json!({
            "type": "ClusterIP",
            "clusterIP": "172.30.6.53",
            "clusterIPs": ["172.30.6.53"],
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
        }),
    ))
    .add(endpoint_slice(
        "dns",
        "dns-1",
        "IPv4",
        json!([sport("dns", 5353, "UDP")]),
        vec![endpoint("10.2.0.53", NODE_B), endpoint("10.3.0.53", NODE_C)],
    ));
    env.add_all(simple_service("empty", "172.30.6.20", 80, 8080, &[]));
    env
}

/// A mixed capture where every flow goes one direction only.
fn one_way_capture() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for i in 0..200u16 {
        let client = format!("10.1.{}.{}:{}", i % 3, 10 + i % 50, 30000 + i);
        match i % 10 {
            0 => v.push(udp(&client, "172.30.6.53:53", b"q")),
            1 => v.push(arp()),
            2 => v.push(syn(&client, "172.30.6.20:80")),
            3 => v.push(syn(&client, "172.30.99.1:80")),
            4 => v.push(syn(&client, "10.2.0.99:80")),
            5 => v.push(syn(&client, "192.168.0.2:22")),
            6 => v.push(syn(&client, "172.30.6.10:81")),
            7 => v.push(syn(&client, "172.30.6.10:80")[..30].to_vec()),
            _ => v.push(syn(&client, "172.30.6.10:80")),
        }
    }
    v
}

#[test]
fn workers_2_gives_same_verdicts_in_input_order_as_workers_1() {
    let env = services_env();
    let frames = one_way_capture();
    let pkts = spaced(&frames, 1_000_000);
    let one = env.replay_args(&pkts, &["--workers", "1"]);
    let two = env.replay_args(&pkts, &["--workers", "2"]);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (a, b)) in one.verdicts.iter().zip(&two.verdicts).enumerate() {
        assert_eq!(b["index"].as_u64(), Some(i as u64));
        for k in ["action", "reason", "proto", "orig_src", "orig_dst"] {
            assert_eq!(a[k], b[k], "packet {i}, field {k}: {a} vs {b}");
        }
        *seen
            .entry(a["reason"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    for r in [
        "service-dnat",
        "no-endpoints",
        "service-ip-unallocated",
        "direct",
        "to-node",
        "service-port-unknown",
        "malformed",
        "not-ip",
    ] {
        assert!(seen.contains_key(r), "capture exercises {r}: {seen:?}");
    }
    for v in &two.verdicts {
        if v["reason"] == "service-dnat" {
            let d = v["dst"].as_str().unwrap();
            assert!(
                [
                    "10.1.0.10:8080",
                    "10.2.0.10:8080",
                    "10.3.0.10:8080",
                    "10.2.0.53:5353",
                    "10.3.0.53:5353"
                ]
                .contains(&d),
                "{v}"
            );
        }
    }
    assert_eq!(one.frames.len(), two.frames.len());
}

#[test]
fn repeat_3_json_summary() {
    let env = services_env();
    let frames = one_way_capture();
    let n = frames.len() as u64;
    let r = env.replay_args(&spaced(&frames, 1_000_000), &["--repeat", "3", "--json"]);
    let s = r.summary();
    assert_eq!(s["packets"].as_u64(), Some(3 * n), "{s}");
    assert_eq!(s["repeat"].as_u64(), Some(3), "{s}");
    assert_eq!(s["workers"].as_u64(), Some(1), "{s}");
    assert!(s["mpps"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["seconds"].as_f64().unwrap() >= 0.0, "{s}");
    assert!(s["ns_per_packet"].as_f64().unwrap() > 0.0, "{s}");
    let sum = |m: &Value| {
        m.as_object()
            .unwrap()
            .values()
            .map(|x| x.as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(sum(&s["actions"]), 3 * n, "{s}");
    assert_eq!(sum(&s["reasons"]), 3 * n, "{s}");
    // Verdicts of one pass are in the file; non-IP and malformed frames are the same every pass.
    assert_eq!(r.verdicts.len() as u64, n);
    assert_eq!(s["reasons"]["not-ip"].as_u64(), Some(3 * 20), "{s}");
    assert_eq!(s["reasons"]["malformed"].as_u64(), Some(3 * 20), "{s}");
    assert_eq!(
        s["actions"]["pass"].as_u64(),
        Some(3 * 40),
        "not-ip + to-node: {s}"
    );
}

/// `--conntrack-file`: the table in a state file, as `kxdp run` keeps it; the same verdicts as
/// in process memory, the table's memory in the summary, and the file removed at the end. A
/// path that exists is refused (a replay never takes over another table, a running kxdp's
/// included).
#[test]
fn conntrack_file_gives_the_same_verdicts_and_goes_away() {
    let env = services_env();
    let frames = spaced(&one_way_capture(), 1_000_000);
    let memory = env.replay_args(&frames, &["--json"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("conntrack");
    let in_file = env.replay_args(
        &frames,
        &["--json", "--conntrack-file", file.to_str().unwrap()],
    );
    let (a, b) = (memory.summary(), in_file.summary());
    assert_eq!(a["reasons"], b["reasons"]);
    assert_eq!(memory.verdicts, in_file.verdicts);
    assert!(b["conntrack_table_bytes"].as_u64().unwrap() > 0, "{b}");
    assert!(b["conntrack_huge_page_bytes"].is_u64(), "{b}");
    assert!(!file.exists(), "the replay's table file is removed");
    // A path that exists is bad input, and is left as it was.
    std::fs::write(&file, b"someone's table").unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args([
            "replay",
            "--config",
            "/nonexistent.yaml",
            "--state",
            "/nonexistent",
        ])
        .args(["--pcap", "/nonexistent.pcap", "--conntrack-file"])
        .arg(&file)
        .output()
        .unwrap();
    assert_exit_2(&o, &["--conntrack-file", "exists"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"someone's table");
}

/// The link type field of a pcap file header (either byte order).
fn pcap_linktype(path: &std::path::Path) -> u32 {
    let b = std::fs::read(path).unwrap();
    let magic_le = u32::from_le_bytes(b[0..4].try_into().unwrap());
    if magic_le == 0xa1b2_c3d4 || magic_le == 0xa1b2_3c4d {
        u32::from_le_bytes(b[20..24].try_into().unwrap())
    } else {
        u32::from_be_bytes(b[20..24].try_into().unwrap())
    }
}

#[test]
fn output_keeps_ethernet_link_type() {
    let env = services_env();
    let r = env.replay(&[syn("10.1.0.50:40000", "172.30.6.10:80")]);
    assert_eq!(pcap_linktype(&env.path("out.pcap")), 1);
    assert_eq!(r.out(0).dst_mac, NODE_MAC);
}

#[test]
fn output_keeps_raw_ip_link_type_101() {
    let mut env = services_env();
    env.link = LinkType::RawIp;
    let frames = vec![
        tcp_on(
            LinkType::RawIp,
            sa("10.1.0.50:40000"),
            sa("172.30.6.10:80"),
            flags::SYN,
            1000,
            0,
            b"",
        ),
        udp_on(
            LinkType::RawIp,
            sa("10.1.0.50:40001"),
            sa("172.30.6.53:53"),
            b"q",
        ),
        tcp_on(
            LinkType::RawIp,
            sa("10.1.0.50:40002"),
            sa("172.30.6.20:80"),
            flags::SYN,
            1000,
            0,
            b"",
        ),
    ];
    let r = env.replay(&frames);
    assert_eq!(pcap_linktype(&env.path("out.pcap")), 101);
    r.expect(0, "forward", "service-dnat");
    let o = r.out(0);
    assert!(["10.1.0.10:8080", "10.2.0.10:8080", "10.3.0.10:8080"]
        .contains(&o.dst_sock().to_string().as_str()));
    r.expect(1, "forward", "service-dnat");
    assert_eq!(r.out(1).dport, 5353);
    r.expect(2, "reject", "no-endpoints");
    let rst = r.out(2);
    assert!(rst.tcp.as_ref().unwrap().rst);
    assert_eq!(rst.src_sock(), sa("172.30.6.20:80"));
}

// ---- bad input ---------------------------------------------------------------------------------

fn one_packet() -> Vec<(u64, Vec<u8>)> {
    vec![(T0_NS, syn("10.1.0.50:40000", "172.30.6.10:80"))]
}

#[test]
fn unknown_config_field_is_exit_2_naming_file_and_field() {
    let mut env = services_env();
    env.config_extra("masqueradeAl: true");
    assert_exit_2(
        &env.run_raw(&one_packet(), &[]),
        &["config.yaml", "masqueradeAl"],
    );
}

#[test]
fn unknown_nested_config_field_is_exit_2() {
    let mut env = services_env();
    env.config_extra("conntrack:\n  maxEntriez: 5");
    assert_exit_2(
        &env.run_raw(&one_packet(), &[]),
        &["config.yaml", "maxEntriez"],
    );
}

#[test]
fn localhost_node_ports_true_is_refused() {
    let mut env = services_env();
    env.config_extra("localhostNodePorts: true");
    assert_exit_2(&env.run_raw(&one_packet(), &[]), &["localhostNodePorts"]);
}

#[test]
fn unknown_feature_gate_is_refused() {
    let mut env = services_env();
    env.config_extra("featureGates: {NoSuchGate: true}");
    assert_exit_2(&env.run_raw(&one_packet(), &[]), &["NoSuchGate"]);
}

#[test]
fn invalid_state_object_is_exit_2_naming_file_and_document() {
    let mut env = Env::new();
    env.objects = vec![
        namespace("other"),
        service(
            "ok",
            json!({"type": "ClusterIP", "clusterIP": "172.30.6.30", "ports": [{"port": 80, "protocol": "TCP"}]}),
        ),
        // Document 2 (0-based): a port number that is not a number.
        service(
            "broken",
            json!({"type": "ClusterIP", "clusterIP": "172.30.6.31", "ports": [{"port": "eighty", "protocol": "TCP"}]}),
        ),
    ];
    let o = env.run_raw(&one_packet(), &[]);
    assert_exit_2(&o, &["apps.yaml"]);
    let err = stderr(&o);
    let lower = err.to_lowercase();
    let idx = lower
        .find("document")
        .or_else(|| lower.find("doc "))
        .or_else(|| lower.find("index"));
    let Some(idx) = idx else {
        panic!("stderr should name the document index:\n{err}");
    };
    let after: String = lower[idx..].chars().take(24).collect();
    assert!(
        after.contains('2') || after.contains('3'),
        "document index 2 (0-based) or 3 (1-based) expected:\n{err}"
    );
}

/// A Service the API server would refuse (here: an address that is not one, a port out of range,
/// an unknown protocol) is an error naming file, document, object and field, not a warning.
#[test]
fn invalid_service_fields_are_exit_2_naming_file_document_and_field() {
    let cases = [
        (
            json!({"type": "ClusterIP", "clusterIP": "10.0.0.300", "ports": [{"port": 80}]}),
            "spec.clusterIP: `10.0.0.300` is not a valid IP address",
        ),
        (
            json!({"type": "ClusterIP", "clusterIP": "172.30.6.31", "ports": [{"port": 70000}]}),
            "spec.ports[0].port: 70000 is not a port number",
        ),
        (
            json!({"type": "ClusterIP", "clusterIP": "172.30.6.31", "ports": [{"port": 80, "protocol": "ICMP"}]}),
            "spec.ports[0].protocol: `ICMP` is not TCP, UDP or SCTP",
        ),
    ];
    for (spec, message) in cases {
        let mut env = Env::new();
        env.objects = vec![namespace("other"), service("broken", spec)];
        let o = env.run_raw(&one_packet(), &[]);
        assert_exit_2(&o, &["apps.yaml", "document 1", "broken", message]);
    }
}

#[test]
fn service_cidr_objects_make_unallocated_addresses_drop() {
    let pkts = vec![
        (T0_NS, syn("10.1.0.50:40000", "172.31.0.5:80")),
        (
            T0_NS + DEFAULT_GAP_NS,
            syn("10.1.0.50:40001", "172.31.0.10:80"),
        ),
    ];
    // Without a ServiceCIDR object, 172.31.0.0/16 is nobody's: routed as is.
    let mut env = services_env();
    let r = env.replay_at(&pkts[..1]);
    r.expect(0, "forward", "direct");
    // With one, an unallocated address inside it is dropped and a Service in it works.
    env.add(service_cidr("secondary", &["172.31.0.0/16"]));
    env.add_all(simple_service(
        "in-secondary",
        "172.31.0.10",
        80,
        8080,
        &[("10.2.0.40", NODE_B)],
    ));
    let r = env.replay_at(&pkts);
    r.expect(0, "drop", "service-ip-unallocated");
    let v = r.expect(1, "forward", "service-dnat");
    assert_eq!(v["dst"], "10.2.0.40:8080");
}

fn pcap_header(linktype: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&0i32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&linktype.to_le_bytes());
    b
}

fn pcap_record(data: &[u8], incl: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&1_704_067_200u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&incl.to_le_bytes());
    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
    b.extend_from_slice(data);
    b
}

fn run_with_pcap_bytes(name: &str, bytes: &[u8]) -> Output {
    let env = services_env();
    env.write_files();
    let path = env.path(name);
    std::fs::write(&path, bytes).unwrap();
    env.run_cli(&path, &[])
}

#[test]
fn pcap_with_unknown_link_type_is_exit_2() {
    let pkt = syn("10.1.0.50:40000", "172.30.6.10:80");
    let mut b = pcap_header(147);
    b.extend(pcap_record(&pkt, pkt.len() as u32));
    assert_exit_2(&run_with_pcap_bytes("user0.pcap", &b), &["user0.pcap"]);
}

#[test]
fn truncated_pcap_is_exit_2() {
    let pkt = syn("10.1.0.50:40000", "172.30.6.10:80");
    let mut b = pcap_header(1);
    b.extend(pcap_record(&pkt, pkt.len() as u32));
    let mut second = pcap_record(&pkt, pkt.len() as u32);
    second.truncate(16 + 10);
    b.extend(second);
    assert_exit_2(&run_with_pcap_bytes("cut.pcap", &b), &["cut.pcap"]);
}

#[test]
fn garbage_pcap_is_exit_2() {
    assert_exit_2(
        &run_with_pcap_bytes(
            "garbage.pcap",
            b"this is not a capture file at all, just text\n",
        ),
        &["garbage.pcap"],
    );
}

#[test]
fn missing_pcap_is_exit_2() {
    let env = services_env();
    env.write_files();
    assert_exit_2(&env.run_cli(&env.path("nope.pcap"), &[]), &["nope.pcap"]);
}

#[test]
fn bad_flag_is_exit_2() {
    let env = services_env();
    assert_exit_2(
        &env.run_raw(&one_packet(), &["--no-such-flag"]),
        &["--no-such-flag"],
    );
}

/// `kxdp pcap gen` refuses a spec its address plan cannot hold as bad input, naming the flag,
/// and writes nothing.
#[test]
fn pcap_gen_refuses_flows_beyond_its_clients() {
    let dir = tempfile::tempdir().unwrap();
    let gen = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
            .args(["pcap", "gen", "--out-dir"])
            .arg(dir.path())
            .args(extra)
            .output()
            .unwrap()
    };
    assert_exit_2(&gen(&["--clients", "0"]), &["clients"]);
    assert_exit_2(
        &gen(&["--clients", "1", "--flows", "70000", "--packets", "70000"]),
        &["70000 distinct flows", "1 addresses"],
    );
    assert!(!dir.path().join("capture.pcap").exists());
    // Within the plan: 10 flows from 2 clients.
    let o = gen(&["--clients", "2", "--flows", "10", "--packets", "20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.path().join("capture.pcap").exists());
}
