//! NetworkPolicy through `kxdp replay`: reachability truth tables over the real binary, traffic
//! through a Service to a policed pod, stateful replies, a policy change under established
//! connections, and reported problems.
//!
//! Cluster (this node: node-a, 192.168.0.2):
//!
//! | pod | namespace (labels) | address | node | labels | named ports |
//! | --- | --- | --- | --- | --- | --- |
//! | A | prod (env=prod) | 10.1.0.1 | a | app=web | http 8080/TCP, sig 8080/SCTP |
//! | B | prod | 10.1.0.2 | a | app=db | pg 5432/TCP |
//! | C | dev (env=dev) | 10.1.0.3 | a | app=cli | — |
//! | D | dev | 10.2.0.4 | b | app=web | — |
//! | E | dev | 10.2.0.5 | b | app=cli | — |
//! | agent | prod | 192.168.0.2 (hostNetwork) | a | app=cli | — |
//!
//! Policies (`policies()`):
//! - prod/default-deny: every prod pod isolated for ingress;
//! - prod/web-in: A from dev's app=cli pods on named ports `http` (TCP) and `sig` (SCTP), and from
//!   203.0.113.0/24 except 203.0.113.128/25 on TCP 8080;
//! - prod/db-in: B from prod's app=web pods on TCP 5432;
//! - dev/cli-egress: C (app=cli) may only reach prod namespace pods on TCP 8000-8100 (endPort)
//!   and 10.2.0.0/16 on UDP 53.

mod support;

use serde_json::{json, Value};
use support::*;

const A: &str = "10.1.0.1";
const B: &str = "10.1.0.2";
const C: &str = "10.1.0.3";
const D: &str = "10.2.0.4";
const E: &str = "10.2.0.5";
const EXT2: &str = "203.0.113.200";
const VIP: &str = "172.30.0.10";

fn ns_labelled(name: &str, labels: Value) -> Value {
    let mut n = namespace(name);
    for (k, v) in labels.as_object().unwrap() {
        n["metadata"]["labels"][k] = v.clone();
    }
    n
}

fn pod_in(ns: &str, name: &str, node_name: &str, ip: &str, labels: Value, ports: Value) -> Value {
    let mut p = pod(name, node_name, ip);
    p["metadata"]["namespace"] = json!(ns);
    p["metadata"]["labels"] = labels;
    p["spec"]["containers"][0]["ports"] = ports;
    p
}

fn netpol(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

fn cluster() -> Vec<Value> {
    let mut agent = pod_in(
        "prod",
        "agent",
        NODE_A,
        NODE_A_IP,
        json!({"app": "cli"}),
        json!([]),
    );
    agent["spec"]["hostNetwork"] = json!(true);
    vec![
        node(NODE_A, "zone-a", &[NODE_A_IP, NODE_A_IP6]),
        node(NODE_B, "zone-b", &[NODE_B_IP]),
        ns_labelled("prod", json!({"env": "prod"})),
        ns_labelled("dev", json!({"env": "dev"})),
        pod_in(
            "prod",
            "a",
            NODE_A,
            A,
            json!({"app": "web"}),
            json!([{"name": "http", "containerPort": 8080}, {"name": "sig", "containerPort": 8080, "protocol": "SCTP"}]),
        ),
        pod_in(
            "prod",
            "b",
            NODE_A,
            B,
            json!({"app": "db"}),
            json!([{"name": "pg", "containerPort": 5432}]),
        ),
        pod_in("dev", "c", NODE_A, C, json!({"app": "cli"}), json!([])),
        pod_in("dev", "d", NODE_B, D, json!({"app": "web"}), json!([])),
        pod_in("dev", "e", NODE_B, E, json!({"app": "cli"}), json!([])),
        agent,
    ]
}

fn policies() -> Vec<Value> {
    vec![
        netpol(
            "prod",
            "default-deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        ),
        netpol(
            "prod",
            "web-in",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
              {"from": [{"namespaceSelector": {"matchLabels": {"env": "dev"}},
                         "podSelector": {"matchLabels": {"app": "cli"}}}],
               "ports": [{"port": "http"}, {"port": "sig", "protocol": "SCTP"}]},
              {"from": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}],
               "ports": [{"port": 8080}]}
            ]}),
        ),
        netpol(
            "prod",
            "db-in",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                "ports": [{"protocol": "TCP", "port": 5432}]}]}),
        ),
        netpol(
            "dev",
            "cli-egress",
            json!({"podSelector": {"matchLabels": {"app": "cli"}}, "policyTypes": ["Egress"],
            "egress": [
              {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prod"}}}],
               "ports": [{"port": 8000, "endPort": 8100}]},
              {"to": [{"ipBlock": {"cidr": "10.2.0.0/16"}}], "ports": [{"protocol": "UDP", "port": 53}]}
            ]}),
        ),
    ]
}

fn env_with(objects: Vec<Value>) -> Env {
    let mut env = Env::bare();
    env.infra = cluster();
    env.objects = objects;
    env
}

fn addr(name: &str) -> &str {
    match name {
        "A" => A,
        "B" => B,
        "C" => C,
        "D" => D,
        "E" => E,
        "ext" => EXTERNAL,
        "ext2" => EXT2,
        "node" => NODE_A_IP,
        other => other,
    }
}

/// Replays the reachability grid `expected` (`support::replay_policy_grid`) with this file's
/// names for addresses.
#[track_caller]
fn replay_grid(env: &Env, probes: &[(&str, u16)], expected: &str) {
    replay_policy_grid(env, |n| addr(n).to_string(), probes, expected)
}

const PROBES: &[(&str, u16)] = &[("TCP", 8080), ("SCTP", 8080), ("TCP", 5432), ("UDP", 53)];

/// Every pair on four probes. Covers namespaceSelector AND podSelector, namespace by name,
/// ipBlock with except, named ports (TCP and SCTP on the same number), endPort, default deny,
/// egress and ingress together (C to A), remote sources judged by ingress only, the node and
/// external sources.
#[test]
fn reachability_truth_table() {
    let env = env_with(policies());
    replay_grid(
        &env,
        PROBES,
        "
              A    B    C    D
        A     .... ii.i .... ....
        B     iiii .... .... ....
        C     .eee ieee .... eee.
        D     iiii iiii .... ....
        E     ..ii iiii .... ....
        ext   .iii iiii .... ....
        ext2  iiii iiii .... ....
        node  .... .... .... ....
        ",
    );
}

/// Without any policy nothing is denied (and pod traffic is still forwarded `direct`).
#[test]
fn no_policy_allows_everything() {
    let env = env_with(vec![]);
    replay_grid(
        &env,
        PROBES,
        "
              A    B    C    D
        C     .... .... .... ....
        E     .... .... .... ....
        ext   .... .... .... ....
        ",
    );
}

/// Deleting a policy and relabelling pods and namespaces between steps (each step its own
/// state).
#[test]
fn label_changes_and_deleted_policies() {
    // Step 2: db-in deleted, C relabelled app=web (no longer cli: cli-egress and web-in no
    // longer apply to it, db-in would have), dev relabelled env=staging (web-in's dev clause
    // no longer matches E).
    let mut infra = cluster();
    infra[3]["metadata"]["labels"]["env"] = json!("staging");
    infra[6]["metadata"]["labels"] = json!({"app": "web"});
    let mut env = Env::bare();
    env.infra = infra;
    env.objects = policies()
        .into_iter()
        .filter(|p| p["metadata"]["name"] != "db-in")
        .collect();
    replay_grid(
        &env,
        PROBES,
        "
              A    B    C    D
        A     .... iiii .... ....
        C     iiii iiii .... ....
        E     iiii iiii .... ....
        ",
    );
}

/// A ClusterIP connection is judged against the backend it was sent to: B may not reach A, so
/// its connections through the Service either go to the remote backend D or are dropped as
/// denied by A's ingress; C may reach A but not D (its egress), so the other way round.
#[test]
fn service_traffic_is_judged_on_the_chosen_backend() {
    let mut objects = policies();
    objects.extend(simple_service(
        "web",
        VIP,
        80,
        8080,
        &[(A, NODE_A), (D, NODE_B)],
    ));
    for o in objects.iter_mut() {
        if o["kind"] == "Service" || o["kind"] == "EndpointSlice" {
            o["metadata"]["namespace"] = json!("prod");
        }
    }
    let env = env_with(objects);
    let mut frames = Vec::new();
    for i in 0..24u16 {
        frames.push(syn(&format!("{B}:{}", 30000 + i), &format!("{VIP}:80")));
        frames.push(syn(&format!("{C}:{}", 30000 + i), &format!("{VIP}:80")));
    }
    let r = env.replay(&frames);
    let (mut kinds_b, mut kinds_c) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    for i in 0..frames.len() {
        let v = r.v(i);
        let reason = v["reason"].as_str().unwrap();
        assert_eq!(v["service"], "prod/web:http", "{v}");
        let from_b = i % 2 == 0;
        match (from_b, reason) {
            (true, "service-dnat") => assert_eq!(vsock(v, "dst"), sock(D, 8080), "{v}"),
            (true, "policy-denied-ingress") => assert_eq!(v["action"], "drop"),
            (false, "service-dnat") => assert_eq!(vsock(v, "dst"), sock(A, 8080), "{v}"),
            (false, "policy-denied-egress") => assert_eq!(v["action"], "drop"),
            _ => panic!("unexpected verdict {v}"),
        }
        if from_b {
            kinds_b.insert(reason);
        } else {
            kinds_c.insert(reason);
        }
    }
    // Both backends were chosen for both clients (24 draws each).
    assert_eq!(kinds_b.len(), 2, "{kinds_b:?}");
    assert_eq!(kinds_c.len(), 2, "{kinds_c:?}");
}

/// Replies and the rest of an allowed connection pass through conntrack, although the pods'
/// policies would not allow them as new connections: A (isolated for ingress) talks to D and
/// gets its answers; C (isolated for egress) is reached from outside and answers.
#[test]
fn replies_and_later_packets_pass_statefully() {
    use support::flags::*;
    let env = env_with(policies());
    let (a, d) = (format!("{A}:40000"), format!("{D}:80"));
    let (x, c) = (format!("{EXTERNAL}:50000"), format!("{C}:22"));
    let frames = vec![
        tcp(&a, &d, SYN, 100, 0, b""),
        tcp(&d, &a, SYN | ACK, 500, 101, b""),
        tcp(&a, &d, ACK, 101, 501, b""),
        tcp(&a, &d, ACK | PSH, 101, 501, b"GET /"),
        tcp(&d, &a, ACK | PSH, 501, 106, b"200 OK"),
        // A new connection from D to A is still denied.
        syn(&format!("{D}:40001"), &format!("{A}:80")),
        // UDP: a query out of A and its answer; an unsolicited datagram in is denied.
        udp(&format!("{A}:5353"), &format!("{D}:53"), b"q"),
        udp(&format!("{D}:53"), &format!("{A}:5353"), b"a"),
        udp(&format!("{D}:53"), &format!("{A}:5354"), b"a"),
        // C may not reach the outside, but answers a connection from it.
        tcp(&x, &c, SYN, 1, 0, b""),
        tcp(&c, &x, SYN | ACK, 9, 2, b""),
        tcp(&x, &c, ACK, 2, 10, b""),
        tcp(&c, &x, ACK | PSH, 10, 2, b"SSH-2.0"),
        syn(&format!("{C}:40002"), &format!("{EXTERNAL}:22")),
        // The connection closes.
        tcp(&a, &d, FIN | ACK, 106, 507, b""),
        tcp(&d, &a, FIN | ACK, 507, 107, b""),
        tcp(&a, &d, ACK, 107, 508, b""),
    ];
    let r = env.replay(&frames);
    let want = [
        "direct",
        "direct",
        "direct",
        "direct",
        "direct",
        "policy-denied-ingress",
        "direct",
        "direct",
        "policy-denied-ingress",
        "direct",
        "direct",
        "direct",
        "direct",
        "policy-denied-egress",
        "direct",
        "direct",
        "direct",
    ];
    assert_eq!(r.reasons(), want);
    // Forwarded unchanged.
    let out = r.out(4);
    assert_eq!(out.src_sock(), sa(&d));
    assert_eq!(out.dst_sock(), sa(&a));
}

/// The documented choice: a policy change does not touch established connections (they go on
/// until they end, as with iptables-based plugins); new connections follow the new policy. The
/// same holds through a Service.
#[test]
fn policy_change_keeps_established_connections() {
    use support::flags::*;
    let mut service = simple_service("web", VIP, 80, 8080, &[(A, NODE_A)]);
    for o in service.iter_mut() {
        o["metadata"]["namespace"] = json!("prod");
    }
    let env = env_with(service.clone());
    // The second state: everything in prod denied.
    let mut later = service;
    later.push(netpol(
        "prod",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    ));
    let state2 = env.path("state2");
    std::fs::create_dir_all(&state2).unwrap();
    std::fs::write(state2.join("nodes.yaml"), yaml_docs(&cluster())).unwrap();
    std::fs::write(state2.join("apps.yaml"), yaml_docs(&later)).unwrap();

    let (c, a) = (format!("{C}:41000"), format!("{A}:8080"));
    let (cs, vip) = (format!("{C}:41001"), format!("{VIP}:80"));
    let at = |ms: u64, f: Vec<u8>| (T0_NS + ms * 1_000_000, f);
    let packets = vec![
        at(0, tcp(&c, &a, SYN, 1, 0, b"")),
        at(150, tcp(&a, &c, SYN | ACK, 7, 2, b"")),
        at(300, tcp(&c, &a, ACK, 2, 8, b"")),
        at(450, tcp(&cs, &vip, SYN, 1, 0, b"")),
        at(600, tcp(&format!("{A}:8080"), &cs, SYN | ACK, 7, 2, b"")),
        at(750, udp(&format!("{C}:5000"), &format!("{A}:53"), b"q")),
        // The state changes at 1 s.
        at(1200, tcp(&c, &a, ACK | PSH, 2, 8, b"still here")),
        at(1350, tcp(&a, &c, ACK | PSH, 8, 12, b"yes")),
        at(1500, udp(&format!("{C}:5000"), &format!("{A}:53"), b"q2")),
        at(1650, udp(&format!("{A}:53"), &format!("{C}:5000"), b"a2")),
        at(1800, tcp(&cs, &vip, ACK, 2, 8, b"")),
        at(1950, syn(&format!("{C}:41002"), &a)),
        at(2100, syn(&format!("{C}:41003"), &vip)),
        at(2250, udp(&format!("{C}:5001"), &format!("{A}:53"), b"q3")),
    ];
    let update = format!("1:{}", state2.display());
    let r = env.replay_args(&packets, &["--state-update", &update]);
    assert_eq!(
        r.reasons(),
        [
            "direct",
            "direct",
            "direct",
            "service-dnat",
            "reply-unnat",
            "direct",
            "direct",
            "direct",
            "direct",
            "direct",
            "ct-established",
            "policy-denied-ingress",
            "policy-denied-ingress",
            "policy-denied-ingress",
        ]
    );
}

/// A policy kxdp cannot enforce is reported (and the replay still runs, failing closed).
#[test]
fn unenforceable_policy_is_reported() {
    let env = env_with(vec![netpol(
        "prod",
        "icmp",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"ports": [{"protocol": "ICMP"}]}]}),
    )]);
    let r = env.replay(&[syn(&format!("{C}:1000"), &format!("{A}:8080"))]);
    assert!(
        r.stderr.contains("warning: NetworkPolicy prod/icmp: spec.ingress[0].ports[0].protocol: `ICMP` is not TCP, UDP or SCTP"),
        "{}",
        r.stderr
    );
    r.expect(0, "drop", "policy-denied-ingress");
}

/// `kxdp policy trace`: the Service translation with every eligible backend, the policies on
/// each side, and the rule that allowed it or why nothing did.
#[test]
fn policy_trace_cli() {
    let mut objects = policies();
    objects.extend(simple_service(
        "web",
        VIP,
        80,
        8080,
        &[(A, NODE_A), (D, NODE_B)],
    ));
    for o in objects.iter_mut() {
        if o["kind"] == "Service" || o["kind"] == "EndpointSlice" {
            o["metadata"]["namespace"] = json!("prod");
        }
    }
    let env = env_with(objects);
    env.write_files();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
            .args(["policy", "trace", "--config"])
            .arg(env.path("config.yaml"))
            .arg("--state")
            .arg(env.path("state"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--from", C, "--to", "172.30.0.10:80"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "connection   TCP 10.1.0.3 -> 172.30.0.10:80",
        "source       10.1.0.3: pod dev/c on node node-a (local: policy is enforced here)",
        "  egress policies selecting it: dev/cli-egress",
        "service      ClusterIP 172.30.0.10:80 of prod/web:http (source class pod)",
        "  2 eligible endpoint(s)",
        "destination  10.1.0.1:8080: pod prod/a on node node-a (local: policy is enforced here)",
        "  ingress policies selecting it: prod/default-deny, prod/web-in",
        "  egress  at source:      allowed by dev/cli-egress egress[0]",
        "  ingress at destination: allowed by prod/web-in ingress[0]",
        "  verdict: forward (service-dnat)",
        "destination  10.2.0.4:8080: pod dev/d on node node-b",
        "  egress  at source:      denied: 10.2.0.4 is a peer only on UDP 53 (dev/cli-egress egress[1]) (not TCP on this port)",
        "  verdict: drop (policy-denied-egress)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let out = run(&["--from", B, "--to", "10.1.0.1:5432"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("  ingress at destination: denied: no ingress rule of prod/default-deny, prod/web-in allows any traffic from 10.1.0.2"),
        "{text}"
    );
    let out = run(&["--from", E, "--to", "10.1.0.1:5432", "--proto", "udp"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("  ingress at destination: denied: 10.2.0.5 is a peer only on TCP 8080 (prod/web-in ingress[0]), SCTP 8080 (prod/web-in ingress[0]) (not UDP on this port)"),
        "{text}"
    );
    let out = run(&["--from", NODE_A_IP, "--to", "10.1.0.2:1"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "ingress at destination: allowed: traffic between this node and its pods always is"
        ),
        "{text}"
    );
    assert_eq!(
        run(&["--from", C, "--to", "nowhere"]).status.code(),
        Some(2)
    );
    assert_eq!(
        run(&["--from", C, "--to", "fd00::1", "--proto", "TCP"])
            .status
            .code(),
        Some(2)
    );
}

/// IPv6 (and a dual-stack pod): ipBlocks with excepts per family; an IPv6 block never admits
/// IPv4 sources and the reverse.
#[test]
fn ipv6_blocks_and_dual_stack() {
    let mut infra = cluster();
    let mut v6pod = pod_in(
        "prod",
        "v6",
        NODE_A,
        "10.1.0.66",
        json!({"app": "v6"}),
        json!([]),
    );
    v6pod["status"]["podIPs"] = json!([{"ip": "10.1.0.66"}, {"ip": "fd00:10:1::66"}]);
    infra.push(v6pod);
    let mut env = Env::bare();
    env.infra = infra;
    env.objects = vec![netpol(
        "prod",
        "v6-in",
        json!({"podSelector": {"matchLabels": {"app": "v6"}},
        "ingress": [
          {"from": [{"ipBlock": {"cidr": "fd00:10:2::/48", "except": ["fd00:10:2:1::/64"]}}], "ports": [{"port": 80}]},
          {"from": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"protocol": "UDP", "port": 53}]},
          {"from": [{"ipBlock": {"cidr": "10.2.0.0/16"}}], "ports": [{"protocol": "SCTP", "port": 80}]}
        ]}),
    )];
    let probes = &[("TCP", 80), ("UDP", 53), ("SCTP", 80)];
    replay_grid(
        &env,
        probes,
        "
                           fd00:10:1::66
        fd00:10:2::9       ..i
        fd00:10:2:1::9     i.i
        2001:db8::7        i.i
        fd00:10:1::66      ...
        ",
    );
    replay_grid(
        &env,
        probes,
        "
                           10.1.0.66
        10.2.0.9           ii.
        203.0.113.7        iii
        10.1.0.1           iii
        ",
    );
}
