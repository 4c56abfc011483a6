//! Acceptance: `kxdp replay --routes FILE` runs the egress stage the daemon's workers run
//! (dataplane/src/egress.rs) against the node's routes given in a file: each packet leaves on
//! the interface its route names — behind a Linux bridge, on the bridge port the FDB names —
//! with its MACs rewritten and its TTL decremented, or is dropped with the egress reason
//! (`no-route`, `no-neighbour`, `no-egress`, `ttl-expired`, `no-kernel-port`), counted once.
//! Without `--routes` the same capture is replayed as before. A bad file exits 2 naming file and
//! field.

mod support;

use etherparse::PacketBuilder;
use serde_json::Value;
use support::*;

const POD_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x01, 0x00, 0x0a];
const BRIDGED_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x02, 0x00, 0x14];
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

/// node-a: eth0 (the node's address, default route), a ptp pod veth with a /32 route, pods on
/// the bridge cni0 (one port, vethb), a link kxdp has no socket on (wg0).
const ROUTES: &str = r#"
links:
  - {name: eth0, ifindex: 2, mac: "02:00:00:00:00:02"}
  - {name: cni0, ifindex: 3, mac: "02:00:00:00:00:03"}
  - {name: veth-web, ifindex: 4, mac: "02:00:00:00:00:04"}
  - {name: vethb, ifindex: 5, mac: "02:00:00:00:00:05", master: cni0}
  - {name: wg0, ifindex: 6, attached: false}
localAddresses: [192.168.0.2, 10.2.0.1]
routes:
  - {dst: default, dev: eth0, via: 192.168.0.254}
  - {dst: 192.168.0.0/24, dev: eth0}
  - {dst: 10.1.0.10/32, dev: veth-web}
  - {dst: 10.2.0.0/24, dev: cni0}
  - {dst: 10.3.0.0/16, dev: wg0}
neighbours:
  - {addr: 192.168.0.254, dev: eth0, mac: "02:00:00:00:00:fe"}
  - {addr: 10.1.0.10, dev: veth-web, mac: "0a:58:0a:01:00:0a"}
  - {addr: 10.2.0.20, dev: cni0, mac: "0a:58:0a:02:00:14"}
fdb:
  - {mac: "0a:58:0a:02:00:14", port: vethb}
"#;

fn env() -> Env {
    let mut env = Env::new();
    env.add_all(simple_service(
        "web",
        "172.30.6.10",
        80,
        8080,
        &[("10.1.0.10", NODE_A)],
    ));
    env
}

fn syn_ttl(src: [u8; 4], dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC)
        .ipv4(src, dst, ttl)
        .tcp(40000, 80, 1000, 64240)
        .syn()
        .write(&mut v, &[])
        .unwrap();
    v
}

fn capture() -> Vec<Vec<u8>> {
    vec![
        syn("10.1.0.50:40000", "172.30.6.10:80"), // 0 Service → ptp pod veth
        syn("10.1.0.50:40001", "10.2.0.20:80"),   // 1 pod behind the bridge
        syn("10.1.0.50:40002", "10.2.0.21:80"),   // 2 no neighbour entry
        syn("10.1.0.50:40003", "10.3.0.5:80"),    // 3 route via a link kxdp does not own
        syn_ttl([10, 1, 0, 50], [10, 2, 0, 20], 1), // 4 TTL runs out
        syn("10.1.0.50:40005", "203.0.113.7:443"), // 5 default route
        syn("10.1.0.50:40006", "192.168.0.2:22"), // 6 the node's own address: pass
        syn("[fd00:10:1::50]:40007", "[2001:db8::7]:443"), // 7 no IPv6 route
    ]
}

#[test]
fn egress_stage_routes_rewrites_and_names_its_drops() {
    let env = env();
    std::fs::write(env.path("routes.yaml"), ROUTES).unwrap();
    let routes = env.path("routes.yaml");
    let r = env.replay_args(
        &spaced(&capture(), DEFAULT_GAP_NS),
        &["--routes", routes.to_str().unwrap(), "--json"],
    );
    r.expect(0, "forward", "service-dnat");
    r.expect(1, "forward", "direct");
    r.expect(2, "drop", "no-neighbour");
    r.expect(3, "drop", "no-egress");
    r.expect(4, "drop", "ttl-expired");
    r.expect(5, "forward", "direct");
    r.expect(6, "drop", "no-kernel-port");
    r.expect(7, "drop", "no-route");
    let egress: Vec<Option<&str>> = r.verdicts.iter().map(|v| v["egress"].as_str()).collect();
    assert_eq!(
        egress,
        [
            Some("veth-web"),
            Some("vethb"),
            None,
            None,
            None,
            Some("eth0"),
            None,
            None
        ]
    );
    // Packets out: MACs of the next hop and of the interface (behind the bridge: the
    // bridge's, the pod's gateway), TTL one less, checksums valid (decode verifies them).
    let o = r.out(0);
    assert_eq!((o.dst_mac, o.src_mac), (POD_MAC, [2, 0, 0, 0, 0, 4]));
    assert_eq!(
        (o.dst.to_string(), o.dport, o.ttl),
        ("10.1.0.10".into(), 8080, 63)
    );
    let o = r.out(1);
    assert_eq!((o.dst_mac, o.src_mac), (BRIDGED_MAC, [2, 0, 0, 0, 0, 3]));
    assert_eq!(o.ttl, 63);
    let o = r.out(5);
    assert_eq!((o.dst_mac, o.src_mac), (GW_MAC, [2, 0, 0, 0, 0, 2]));
    assert_eq!(r.frames.len(), 3, "only the three forwarded packets leave");
    // Counted once, under the egress reasons (the summary reads the same table as stats).
    let summary: Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let reasons = &summary["reasons"];
    for (reason, n) in [
        ("service-dnat", 1),
        ("direct", 2),
        ("no-neighbour", 1),
        ("no-egress", 1),
        ("ttl-expired", 1),
        ("no-kernel-port", 1),
        ("no-route", 1),
    ] {
        assert_eq!(reasons[reason].as_u64(), Some(n), "{reason}: {summary}");
    }
    assert!(
        reasons.get("to-node").is_none_or(|v| v.as_u64() == Some(0)),
        "{summary}"
    );
}

#[test]
fn without_routes_replay_is_unchanged() {
    let r = env().replay(&capture());
    let reasons = r.reasons();
    assert_eq!(
        reasons,
        [
            "service-dnat",
            "direct",
            "direct",
            "direct",
            "direct",
            "direct",
            "to-node",
            "direct"
        ]
    );
    assert!(r.verdicts.iter().all(|v| v.get("egress").is_none()));
    // MACs as received, TTL untouched.
    let o = r.out(1);
    assert_eq!((o.dst_mac, o.ttl), (NODE_MAC, 64));
}

#[test]
fn a_bad_route_file_exits_2_naming_file_and_field() {
    let env = env();
    for (text, field) in [
        (ROUTES.replace("dev: wg0}", "dev: wg9}"), "routes[4].dev"),
        (
            ROUTES.replace("\"0a:58:0a:02:00:14\", port", "\"0a:58:zz\", port"),
            "fdb[0].mac",
        ),
        (
            ROUTES.replace("{dst: 10.3.0.0/16", "{dest: 10.3.0.0/16"),
            "routes[4]",
        ),
    ] {
        std::fs::write(env.path("routes.yaml"), &text).unwrap();
        let routes = env.path("routes.yaml");
        let o = env.run_raw(
            &spaced(&capture(), DEFAULT_GAP_NS),
            &["--routes", routes.to_str().unwrap()],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("routes.yaml") && err.contains(field),
            "{field}: {err}"
        );
    }
}
