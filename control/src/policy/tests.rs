//! Compilation truth tables: a small cluster, policies, and the expected reachability of every
//! (source, destination) pair on several probes, written down per case as the Kubernetes
//! NetworkPolicy e2e suite writes its reachability matrices.
//!
//! Cluster (this node: node-a, 192.168.0.2 / fd00:192::2):
//!
//! | pod | namespace (labels) | address | node | labels | named ports |
//! | --- | --- | --- | --- | --- | --- |
//! | A | prod (env=prod) | 10.1.0.1 | a | app=web, tier=front | http 8080/TCP, dns 53/UDP, sig 8080/SCTP |
//! | B | prod | 10.1.0.2 | a | app=db, tier=back | pg 5432/TCP |
//! | C | prod | 10.1.0.3 | a | app=cli | — |
//! | D | dev (env=dev) | 10.1.0.4 | a | app=cli, tier=front | — |
//! | E | dev | 10.2.0.5 | b | app=web | http 8081/TCP |
//! | F | other (no labels) | 10.1.0.6, fd00:10:1::6 | a | app=x | — |
//! | agent | prod | 192.168.0.2 (hostNetwork) | a | app=cli | — |
//!
//! Grid cells: one character per probe: `.` allowed, `i` denied by ingress, `e` denied by egress.

use std::path::Path;

use kxdp_dataplane::policy::{Decision, PolicyTables};
use kxdp_packet::{Addr, IpProto};
use serde_json::{json, Value};

use super::*;
use crate::sources::files::load_str;

const NODE: &str = "192.168.0.2";
const EXT: &str = "203.0.113.7";

fn ns(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn pod(ns: &str, name: &str, node: &str, ips: &[&str], labels: Value, ports: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ips[0], "podIPs": ips.iter().map(|i| json!({"ip": i})).collect::<Vec<_>>()}
    })
}

fn netpol(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

fn cluster() -> Vec<Value> {
    let mut agent = pod(
        "prod",
        "agent",
        "node-a",
        &[NODE],
        json!({"app": "cli"}),
        json!([]),
    );
    agent["spec"]["hostNetwork"] = json!(true);
    vec![
        ns("prod", json!({"env": "prod"})),
        ns("dev", json!({"env": "dev"})),
        ns("other", json!({})),
        pod(
            "prod",
            "a",
            "node-a",
            &["10.1.0.1"],
            json!({"app": "web", "tier": "front"}),
            json!([{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}, {"name": "sig", "containerPort": 8080, "protocol": "SCTP"}]),
        ),
        pod(
            "prod",
            "b",
            "node-a",
            &["10.1.0.2"],
            json!({"app": "db", "tier": "back"}),
            json!([{"name": "pg", "containerPort": 5432}]),
        ),
        pod(
            "prod",
            "c",
            "node-a",
            &["10.1.0.3"],
            json!({"app": "cli"}),
            json!([]),
        ),
        pod(
            "dev",
            "d",
            "node-a",
            &["10.1.0.4"],
            json!({"app": "cli", "tier": "front"}),
            json!([]),
        ),
        pod(
            "dev",
            "e",
            "node-b",
            &["10.2.0.5"],
            json!({"app": "web"}),
            json!([{"name": "http", "containerPort": 8081}]),
        ),
        pod(
            "other",
            "f",
            "node-a",
            &["10.1.0.6", "fd00:10:1::6"],
            json!({"app": "x"}),
            json!([]),
        ),
        agent,
    ]
}

fn state_of(objs: &[Value]) -> ClusterState {
    let mut text = String::new();
    for o in objs {
        text.push_str("---\n");
        text.push_str(&serde_json::to_string(o).unwrap());
        text.push('\n');
    }
    let mut st = ClusterState::new();
    load_str(&text, false, Path::new("state.yaml"), &mut st).unwrap();
    st
}

fn node_addrs() -> Vec<Addr> {
    vec![
        Addr::from_ip(NODE.parse().unwrap()),
        Addr::from_ip("fd00:192::2".parse().unwrap()),
    ]
}

/// Policies the incremental-compilation tests share: `prod` isolated both ways, its `db` pods
/// open to `dev`'s `web` pods, and `other` open on the named port `http`.
fn prod_deny() -> Value {
    netpol(
        "prod",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    )
}

fn prod_db_from_dev_web() -> Value {
    netpol(
        "prod",
        "db-from-dev-web",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "dev"}},
                                      "podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    )
}

fn other_x_named() -> Value {
    netpol(
        "other",
        "x-named",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]}),
    )
}

fn tables(policies: &[Value]) -> (PolicyTables, Vec<Problem>) {
    let mut objs = cluster();
    objs.extend_from_slice(policies);
    compile("node-a", &node_addrs(), &state_of(&objs))
}

fn addr_of(name: &str) -> Addr {
    let ip = match name {
        "A" => "10.1.0.1",
        "B" => "10.1.0.2",
        "C" => "10.1.0.3",
        "D" => "10.1.0.4",
        "E" => "10.2.0.5",
        "F" => "10.1.0.6",
        "node" => NODE,
        "ext" => EXT,
        other => other,
    };
    Addr::from_ip(ip.parse().unwrap())
}

fn cell(t: &PolicyTables, src: &str, dst: &str, probes: &[(IpProto, u16)]) -> String {
    probes
        .iter()
        .map(
            |&(p, port)| match t.judge(&addr_of(src), &addr_of(dst), p, port) {
                Decision::Allow => '.',
                Decision::DenyIngress(_) => 'i',
                Decision::DenyEgress(_) => 'e',
            },
        )
        .collect()
}

/// Checks every (row source, column destination) pair. `expected`: a header line of
/// destinations, then one line per source: `SRC cell cell ...`.
#[track_caller]
fn grid(t: &PolicyTables, probes: &[(IpProto, u16)], expected: &str) {
    let mut lines = expected.lines().map(str::trim).filter(|l| !l.is_empty());
    let dsts: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let mut bad = Vec::new();
    for line in lines {
        let mut w = line.split_whitespace();
        let src = w.next().unwrap();
        let cells: Vec<&str> = w.collect();
        assert_eq!(cells.len(), dsts.len(), "row {src}");
        for (dst, want) in dsts.iter().zip(cells) {
            let got = cell(t, src, dst, probes);
            if got != want {
                bad.push(format!("{src} -> {dst}: want {want}, got {got}"));
            }
        }
    }
    assert!(bad.is_empty(), "reachability differs:\n{}", bad.join("\n"));
}

const P4: &[(IpProto, u16)] = &[
    (IpProto::TCP, 80),
    (IpProto::TCP, 8080),
    (IpProto::UDP, 53),
    (IpProto::SCTP, 8080),
];

#[test]
fn no_policies_nothing_isolated() {
    let (t, problems) = tables(&[]);
    assert!(problems.is_empty());
    assert!(!t.any_isolated());
    // Local pods are known (for conntrack), remote and hostNetwork ones are not.
    for p in ["A", "B", "C", "D", "F", "fd00:10:1::6"] {
        assert!(t.is_local_pod(&addr_of(p)), "{p}");
    }
    for p in ["E", "node"] {
        assert!(!t.is_local_pod(&addr_of(p)), "{p}");
    }
    assert!(t.is_node(&addr_of("node")));
}

/// Default deny ingress in prod, plus web from cli pods of prod on TCP 8080. A podSelector peer
/// alone means the policy's namespace. The node (and the hostNetwork agent, which is the node)
/// always gets in.
#[test]
fn default_deny_and_pod_selector() {
    let (t, problems) = tables(&[
        netpol(
            "prod",
            "default-deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        ),
        netpol(
            "prod",
            "web-from-cli",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                                "ports": [{"protocol": "TCP", "port": 8080}]}]}),
        ),
    ]);
    assert!(problems.is_empty(), "{problems:?}");
    grid(
        &t,
        P4,
        "
             A    B    C    D    E    F    ext
        A    .... iiii iiii .... .... .... ....
        B    iiii .... iiii .... .... .... ....
        C    i.ii iiii .... .... .... .... ....
        D    iiii iiii iiii .... .... .... ....
        E    iiii iiii iiii .... .... .... ....
        F    iiii iiii iiii .... .... .... ....
        node .... .... .... .... .... .... ....
        ext  iiii iiii iiii .... .... .... ....
        ",
    );
}

/// namespaceSelector alone, namespaceSelector AND podSelector in one peer, matchExpressions
/// (In, NotIn, Exists, DoesNotExist), namespace by name.
#[test]
fn namespace_selectors_and_expressions() {
    let (t, problems) = tables(&[netpol(
        "prod",
        "db",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
        "ingress": [
          {"from": [{"namespaceSelector": {"matchLabels": {"env": "dev"}}}], "ports": [{"port": 80}]},
          {"from": [{"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "dev"]}]},
                     "podSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}}]},
          {"from": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["cli", "web"]}]}}]},
          {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}},
                     "podSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}}],
           "ports": [{"protocol": "UDP", "port": 53}]}
        ]}),
    )]);
    assert!(problems.is_empty(), "{problems:?}");
    grid(
        &t,
        P4,
        "
             A    B    C    D    E    F
        A    .... .... .... .... .... ....
        B    .... .... .... .... .... ....
        C    .... iiii .... .... .... ....
        D    .... .... .... .... .... ....
        E    .... .iii .... .... .... ....
        F    .... ii.i .... .... .... ....
        node .... .... .... .... .... ....
        ext  .... iiii .... .... .... ....
        ",
    );
    // The first rule's TCP 80 for E is rule index 0.
    let (_, side) = t.explain(&addr_of("E"), &addr_of("B"), IpProto::TCP, 80);
    assert_eq!(
        side,
        kxdp_dataplane::policy::Side::Allowed(
            t.rules
                .iter()
                .position(|r| r.to_string() == "prod/db ingress[0]")
                .unwrap() as u32
        )
    );
}

/// ipBlocks with excepts, IPv4 and IPv6, egress; endPort ranges. An IPv6 block never allows
/// IPv4 traffic.
#[test]
fn ip_blocks_except_and_end_port() {
    let (t, problems) = tables(&[netpol(
        "other",
        "blocks",
        json!({"podSelector": {"matchLabels": {"app": "x"}}, "policyTypes": ["Egress"],
        "egress": [
          {"to": [{"ipBlock": {"cidr": "10.1.0.0/16", "except": ["10.1.0.2/32", "10.1.0.4/31"]}}],
           "ports": [{"port": 80, "endPort": 8080}]},
          {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"protocol": "UDP", "port": 53}]},
          {"to": [{"ipBlock": {"cidr": "fd00:10::/32", "except": ["fd00:10:1::/48"]}}]},
          {"to": [{"ipBlock": {"cidr": "2001:db8::/32"}}], "ports": [{"protocol": "SCTP", "port": 8080}]},
          {"to": [{"ipBlock": {"cidr": "::/0"}}], "ports": [{"protocol": "TCP", "port": 9999}]}
        ]}),
    )]);
    assert!(problems.is_empty(), "{problems:?}");
    grid(
        &t,
        P4,
        "
             A    B    C    D    E    F    ext
        F    ..ee eeee ..ee eeee eeee .... ee.e
        A    .... .... .... .... .... .... ....
        ",
    );
    let six = &[
        (IpProto::TCP, 80),
        (IpProto::UDP, 53),
        (IpProto::SCTP, 8080),
        (IpProto::TCP, 9999),
        (IpProto::TCP, 79),
        (IpProto::TCP, 8081),
    ];
    grid(
        &t,
        six,
        "
                          fd00:10:2::9 fd00:10:1::9 2001:db8::7 2001:db9::7
        fd00:10:1::6      ......       eee.ee       ee..ee      eee.ee
        ",
    );
    grid(&t, six, "10.1.0.1 8.8.8.8\n F .eeeee eeeeee");
}

/// Named ports: ingress resolved against the selected pod's own ports (per pod), egress against
/// each destination pod's; SCTP and TCP on the same port number are different ports.
#[test]
fn named_ports_and_sctp_vs_tcp() {
    let (t, problems) = tables(&[netpol(
        "prod",
        "named",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"ports": [{"port": "http"}, {"port": "sig", "protocol": "SCTP"}]}],
        "egress": [
          {"to": [{"podSelector": {}}], "ports": [{"port": "pg"}]},
          {"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}
        ]}),
    )]);
    assert!(problems.is_empty(), "{problems:?}");
    let probes = &[
        (IpProto::TCP, 8080),
        (IpProto::SCTP, 8080),
        (IpProto::TCP, 5432),
        (IpProto::TCP, 8081),
    ];
    grid(
        &t,
        probes,
        "
             A    B    C    D    E
        A    .... eeie eeee eeee eee.
        B    .eee .... eeee eeee eee.
        C    .eee eeie .... eeee eee.
        D    ..ii iiii iiii .... ....
        E    ..ii iiii iiii .... ....
        node .... .... .... .... ....
        ",
    );
}

/// Stacked policies are a union; a policyType listed with no rules denies; egress and ingress
/// together; deleting policies and changing labels (separate states).
#[test]
fn stacked_policies_deletion_and_label_changes() {
    let deny_egress = netpol(
        "prod",
        "deny-egress-cli",
        json!({"podSelector": {"matchLabels": {"app": "cli"}}, "policyTypes": ["Egress"]}),
    );
    let dns = netpol(
        "prod",
        "allow-dns",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 53}]}]}),
    );
    let web = netpol(
        "prod",
        "cli-to-web",
        json!({"podSelector": {"matchLabels": {"app": "cli"}},
               "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                           "ports": [{"port": 80}, {"port": 8080}]}]}),
    );
    let web_in = netpol(
        "prod",
        "web-in",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}], "ports": [{"port": 8080}]}]}),
    );
    let (t, _) = tables(&[
        deny_egress.clone(),
        dns.clone(),
        web.clone(),
        web_in.clone(),
    ]);
    grid(
        &t,
        P4,
        "
             A    B    C    D    E    F    ext
        A    .... ee.e eeie ee.e ee.e ee.e eeee
        B    eeie .... eeie ee.e ee.e ee.e eeee
        C    i.ie ee.e .... ee.e ee.e ee.e eeee
        D    iiii .... iiii .... .... .... ....
        node .... .... .... .... .... .... ....
        ",
    );
    // allow-dns and cli-to-web deleted: C keeps only deny-egress; A and B are free again.
    let (t, _) = tables(&[deny_egress.clone(), web_in.clone()]);
    grid(
        &t,
        P4,
        "
             A    B    C    D    E    F    ext
        A    .... .... .... .... .... .... ....
        B    iiii .... .... .... .... .... ....
        C    eeee eeee .... eeee eeee eeee eeee
        ",
    );
    // C relabelled app=web (a label change between steps): no longer cli, so deny-egress and
    // cli-to-web leave it, web-in now isolates it, and it reaches A only as a non-cli.
    let mut objs = cluster();
    objs[5]["metadata"]["labels"] = json!({"app": "web"});
    objs.extend([deny_egress, dns, web, web_in]);
    let (t, _) = compile("node-a", &node_addrs(), &state_of(&objs));
    grid(
        &t,
        P4,
        "
             A    B    C    D    E    F
        C    eeie ee.e .... ee.e ee.e ee.e
        D    iiii .... iiii .... .... ....
        ",
    );
    // The dev namespace relabelled env=prod: namespace label changes count too.
    let ns_sel = netpol(
        "prod",
        "from-prod-env",
        json!({"podSelector": {"matchLabels": {"app": "db"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}}}]}]}),
    );
    let (t, _) = tables(std::slice::from_ref(&ns_sel));
    grid(&t, P4, "  B\n D iiii\n E iiii\n C ....");
    let mut objs = cluster();
    objs[1]["metadata"]["labels"] = json!({"env": "prod"});
    objs.push(ns_sel);
    let (t, _) = compile("node-a", &node_addrs(), &state_of(&objs));
    grid(&t, P4, "  B\n D ....\n E ....\n C ....\n F iiii");
}

/// What kxdp cannot enforce or the API would refuse is reported, and never widens a rule.
#[test]
fn problems_are_reported_and_fail_closed() {
    let (t, problems) = tables(&[
        netpol(
            "prod",
            "bad-port",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"ports": [{"protocol": "ICMP"}]}]}),
        ),
        netpol(
            "prod",
            "bad-peer",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}},
                                         {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/8"]}},
                                         {"ipBlock": {"cidr": "10.1.0.3/32"}}]},
                               {"ports": [{"port": "http", "endPort": 9000}, {"port": 0}, {"port": 9000, "endPort": 80}]}]}),
        ),
        netpol(
            "prod",
            "bad-subject",
            json!({"podSelector": {"matchExpressions": [{"key": "x", "operator": "In"}]},
                   "policyTypes": ["Egress", "Sideways"],
                   "egress": [{}]}),
        ),
    ]);
    let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    let expect = [
        "NetworkPolicy prod/bad-port: spec.ingress[0].ports[0].protocol: `ICMP` is not TCP, UDP or SCTP",
        "NetworkPolicy prod/bad-peer: spec.ingress[0].from[0].podSelector.matchExpressions[0].operator: `Gt`",
        "NetworkPolicy prod/bad-peer: spec.ingress[0].from[1].ipBlock.except[0]: `11.0.0.0/8` is not inside",
        "NetworkPolicy prod/bad-peer: spec.ingress[1].ports[0].endPort: only allowed with a numeric port",
        "NetworkPolicy prod/bad-peer: spec.ingress[1].ports[1].port: 0 is not a port number",
        "NetworkPolicy prod/bad-peer: spec.ingress[1].ports[2].endPort: 80 is below port 9000",
        "NetworkPolicy prod/bad-subject: spec.podSelector.matchExpressions[0]: operator In needs at least one value",
        "NetworkPolicy prod/bad-subject: spec.policyTypes[1]: `Sideways` is not Ingress or Egress",
    ];
    for e in expect {
        assert!(
            text.iter().any(|t| t.starts_with(e)),
            "missing problem {e:?} in\n{}",
            text.join("\n")
        );
    }
    assert_eq!(text.len(), expect.len(), "{}", text.join("\n"));
    // bad-port: its only port is invalid, so its rule allows nothing (not every port).
    // bad-peer: only the valid peer (10.1.0.3 = C) remains; its second rule allows nothing.
    // bad-subject: selects every prod pod for egress and allows nothing.
    grid(
        &t,
        P4,
        "
             A    B    C    D
        A    .... eeee eeee eeee
        C    eeee eeee .... eeee
        D    iiii iiii .... ....
        F    iiii iiii .... ....
        node .... .... .... ....
        ",
    );
    // C's egress is denied (bad-subject), but B's ingress does allow C (the valid ipBlock).
    assert_eq!(cell(&t, "C", "B", &[(IpProto::TCP, 1)]), "e");
    assert!(matches!(
        t.explain(&addr_of("C"), &addr_of("B"), IpProto::TCP, 1).1,
        kxdp_dataplane::policy::Side::Allowed(_)
    ));
}

/// Per-pod compiled rules are keyed by their inputs: compiling the same state again builds
/// nothing; a change rebuilds only the pod directions it affects; pods with equal inputs share.
#[test]
fn incremental_recompilation() {
    let policies = vec![prod_deny(), prod_db_from_dev_web(), other_x_named()];
    let mut objs = cluster();
    objs.extend(policies.clone());
    let mut c = PolicyCompiler::new();
    let (t1, _) = c.compile("node-a", &node_addrs(), &state_of(&objs));
    // Ingress: A and C share (deny only), B (deny + db rule), F (x-named, no http port);
    // egress: A, B, C share. D is in dev: no policy.
    assert_eq!(
        c.stats,
        CompileStats {
            policies: 3,
            local_pods: 5,
            isolated_pods: 4,
            built: 4,
            reused: 3,
            cluster_built: 0,
        }
    );
    let ing = |t: &PolicyTables, p: &str| {
        let i = t.local_pod(&addr_of(p)).unwrap() as usize;
        t.pods()[i].ingress.clone()
    };
    assert!(Arc::ptr_eq(
        ing(&t1, "A").as_ref().unwrap(),
        ing(&t1, "C").as_ref().unwrap()
    ));

    // The same state again: nothing built.
    let (t2, _) = c.compile("node-a", &node_addrs(), &state_of(&objs));
    assert_eq!((c.stats.built, c.stats.reused), (0, 7));
    assert!(Arc::ptr_eq(
        ing(&t1, "B").as_ref().unwrap(),
        ing(&t2, "B").as_ref().unwrap()
    ));

    // The remote peer E relabelled: only B's ingress (which selects dev/web) is rebuilt.
    objs[7]["metadata"]["labels"] = json!({"app": "web2"});
    let (t3, _) = c.compile("node-a", &node_addrs(), &state_of(&objs));
    assert_eq!((c.stats.built, c.stats.reused), (1, 6));
    assert!(!Arc::ptr_eq(
        ing(&t2, "B").as_ref().unwrap(),
        ing(&t3, "B").as_ref().unwrap()
    ));
    assert!(Arc::ptr_eq(
        ing(&t2, "A").as_ref().unwrap(),
        ing(&t3, "A").as_ref().unwrap()
    ));
    assert_eq!(cell(&t3, "E", "B", &[(IpProto::TCP, 1)]), "i");
    assert_eq!(cell(&t2, "E", "B", &[(IpProto::TCP, 1)]), ".");

    // F gains a named port `http`: only F's ingress is rebuilt (its own ports are an input).
    objs[8]["spec"]["containers"][0]["ports"] = json!([{"name": "http", "containerPort": 81}]);
    let (t4, _) = c.compile("node-a", &node_addrs(), &state_of(&objs));
    assert_eq!((c.stats.built, c.stats.reused), (1, 6));
    assert_eq!(
        cell(&t4, "D", "F", &[(IpProto::TCP, 81), (IpProto::TCP, 80)]),
        ".i"
    );

    // A new policy in another namespace changes nothing in prod.
    objs.push(netpol("dev", "deny", json!({"podSelector": {}})));
    let (_, _) = c.compile("node-a", &node_addrs(), &state_of(&objs));
    assert_eq!((c.stats.built, c.stats.reused), (1, 7));
}

/// With `compile_changes`, a change costs what it affects: local pods whose record and whose
/// selecting policy directions did not change keep their last output (the same `Arc`s), and
/// policy directions whose selector results did not change are not looked at again.
#[test]
fn incremental_changes_touch_only_affected_pods() {
    let mut objs = cluster();
    objs.extend(vec![prod_deny(), prod_db_from_dev_web(), other_x_named()]);
    let mut c = PolicyCompiler::new();
    let (t1, _) = c.compile("node-a", &node_addrs(), &state_of(&objs));
    assert_eq!((c.stats.built, c.stats.reused), (4, 3));
    let ing = |t: &PolicyTables, p: &str| {
        let i = t.local_pod(&addr_of(p)).unwrap() as usize;
        t.pods()[i].ingress.clone().unwrap()
    };
    let mut step = |objs: &[Value], key: ObjectKey| {
        let pods: std::collections::BTreeSet<ObjectKey> = [key].into();
        let changes = PolicyChanges {
            pods: &pods,
            namespaces: false,
            policies: false,
            cluster_policies: false,
        };
        let (t, _) = c.compile_changes("node-a", &node_addrs(), &state_of(objs), Some(changes));
        (t, c.stats)
    };
    // Remote E leaves dev/web: B's ingress (which selects it) is rebuilt, nothing else.
    objs[7]["metadata"]["labels"] = json!({"app": "web2"});
    let (t2, s) = step(&objs, ObjectKey::new("dev", "e"));
    assert_eq!((s.built, s.reused, s.isolated_pods), (1, 6, 4));
    assert!(!Arc::ptr_eq(&ing(&t1, "B"), &ing(&t2, "B")));
    assert!(Arc::ptr_eq(&ing(&t1, "A"), &ing(&t2, "A")));
    // E relabelled again, still outside every selector: nothing is rebuilt.
    objs[7]["metadata"]["labels"] = json!({"app": "web3"});
    let (t3, s) = step(&objs, ObjectKey::new("dev", "e"));
    assert_eq!((s.built, s.reused), (0, 7));
    assert!(Arc::ptr_eq(&ing(&t2, "B"), &ing(&t3, "B")));
    // Local C relabelled: C's directions are looked up again (equal keys: reused).
    objs[5]["metadata"]["labels"] = json!({"app": "cli", "x": "y"});
    let (t4, s) = step(&objs, ObjectKey::new("prod", "c"));
    assert_eq!((s.built, s.reused), (0, 7));
    assert!(Arc::ptr_eq(&ing(&t3, "C"), &ing(&t4, "C")));
}

/// A terminated pod's address is nobody's; a pod without an address is not enforced.
#[test]
fn finished_pods_are_ignored() {
    let mut done = pod(
        "prod",
        "old",
        "node-a",
        &["10.1.0.9"],
        json!({"app": "cli"}),
        json!([]),
    );
    done["status"]["phase"] = json!("Succeeded");
    let mut objs = cluster();
    objs.push(done);
    objs.push(netpol(
        "prod",
        "web",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}]}]}),
    ));
    let (t, _) = compile("node-a", &node_addrs(), &state_of(&objs));
    assert!(!t.is_local_pod(&addr_of("10.1.0.9")));
    assert_eq!(cell(&t, "10.1.0.9", "A", &[(IpProto::TCP, 80)]), "i");
    assert_eq!(cell(&t, "C", "A", &[(IpProto::TCP, 80)]), ".");
}

/// The peer index updated from changes gives the tables a compilation from scratch gives, step
/// after step (pods relabelled, local and remote, added, deleted, readdressed; a namespace
/// relabelled; a policy added).
#[test]
fn incremental_peer_index_equals_full_compile() {
    let policies = vec![
        prod_deny(),
        prod_db_from_dev_web(),
        netpol(
            "prod",
            "web-from-cli",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}]}],
                   "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}),
        ),
        other_x_named(),
    ];
    let mut objs = cluster();
    objs.extend(policies);
    let names = ["A", "B", "C", "D", "E", "F", "node", "ext", "10.2.0.9"];
    let same = |a: &PolicyTables, b: &PolicyTables, step: &str| {
        for s in names {
            for d in names {
                assert_eq!(cell(a, s, d, P4), cell(b, s, d, P4), "{step}: {s} -> {d}");
            }
        }
    };
    let mut c = PolicyCompiler::new();
    c.compile("node-a", &node_addrs(), &state_of(&objs));
    type Step = Box<dyn Fn(&mut Vec<Value>) -> (Option<ObjectKey>, bool, bool)>;
    let steps: Vec<(&str, Step)> = vec![
        (
            "remote E relabelled",
            Box::new(|o: &mut Vec<Value>| {
                o[7]["metadata"]["labels"] = json!({"app": "web2"});
                (Some(ObjectKey::new("dev", "e")), false, false)
            }),
        ),
        (
            "local C becomes web",
            Box::new(|o: &mut Vec<Value>| {
                o[5]["metadata"]["labels"] = json!({"app": "web"});
                (Some(ObjectKey::new("prod", "c")), false, false)
            }),
        ),
        (
            "E back, with a new address",
            Box::new(|o: &mut Vec<Value>| {
                o[7]["metadata"]["labels"] = json!({"app": "web"});
                o[7]["status"]["podIP"] = json!("10.2.0.9");
                o[7]["status"]["podIPs"] = json!([{"ip": "10.2.0.9"}]);
                (Some(ObjectKey::new("dev", "e")), false, false)
            }),
        ),
        (
            "B deleted",
            Box::new(|o: &mut Vec<Value>| {
                let k = ObjectKey::new("prod", "b");
                o.retain(|x| !(x["kind"] == "Pod" && x["metadata"]["name"] == "b"));
                (Some(k), false, false)
            }),
        ),
        (
            "B back",
            Box::new(|o: &mut Vec<Value>| {
                o.push(pod(
                    "prod",
                    "b",
                    "node-a",
                    &["10.1.0.2"],
                    json!({"app": "db", "tier": "back"}),
                    json!([{"name": "pg", "containerPort": 5432}]),
                ));
                (Some(ObjectKey::new("prod", "b")), false, false)
            }),
        ),
        (
            "dev relabelled",
            Box::new(|o: &mut Vec<Value>| {
                for x in o.iter_mut() {
                    if x["kind"] == "Namespace" && x["metadata"]["name"] == "dev" {
                        x["metadata"]["labels"] = json!({"env": "staging"});
                    }
                }
                (None, true, false)
            }),
        ),
        (
            "policy added",
            Box::new(|o: &mut Vec<Value>| {
                o.push(netpol(
                    "other",
                    "deny-egress",
                    json!({"podSelector": {}, "policyTypes": ["Egress"]}),
                ));
                (None, false, true)
            }),
        ),
    ];
    for (step, f) in steps {
        let (pod, namespaces, policies) = f(&mut objs);
        let st = state_of(&objs);
        let pods: std::collections::BTreeSet<ObjectKey> = pod.into_iter().collect();
        let (inc, _) = c.compile_changes(
            "node-a",
            &node_addrs(),
            &st,
            Some(PolicyChanges {
                pods: &pods,
                namespaces,
                policies,
                cluster_policies: false,
            }),
        );
        let (full, _) = compile("node-a", &node_addrs(), &st);
        same(&inc, &full, step);
    }
}

/// Random changes (pods relabelled, readdressed, given other named ports, finished, deleted,
/// added; namespaces relabelled; policies added and removed) applied one at a time, each
/// compiled incrementally and from scratch: every local pod's verdict and allowing rule, for
/// every pair of known addresses and several ports, must be the same.
#[test]
fn randomized_incremental_equals_full_compile() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let namespaces = ["a", "b", "c"];
    let apps = ["web", "db", "cli"];
    let label = |r: u64| json!({"app": apps[(r % 3) as usize], "tier": if r % 2 == 0 { "front" } else { "back" }});
    let ports = |r: u64| match r % 3 {
        0 => json!([{"name": "http", "containerPort": 8080}]),
        1 => {
            json!([{"name": "http", "containerPort": 8081}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}])
        }
        _ => json!([]),
    };
    let policy_specs = [
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}], "ports": [{"port": "http"}]}]}),
        json!({"podSelector": {"matchLabels": {"app": "db"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                      "podSelector": {"matchLabels": {"tier": "front"}}}]}]}),
        json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["cli", "web"]}]},
               "policyTypes": ["Egress"],
               "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": "dns"}, {"port": "http"}]},
                          {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.1.0/24"]}}], "ports": [{"port": 80}]}]}),
        json!({"podSelector": {"matchLabels": {"tier": "back"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}}]}],
               "egress": [{"to": [{"podSelector": {}}]}]}),
    ];
    let mut objs: Vec<Value> = Vec::new();
    for (i, n) in namespaces.iter().enumerate() {
        objs.push(ns(n, json!({"env": if i == 0 { "prod" } else { "dev" }})));
    }
    let pod_at = |ns: &str, i: u64, ip: u64, r: u64| {
        let node = if i % 3 == 0 { "node-a" } else { "node-b" };
        pod(
            ns,
            &format!("p{i}"),
            node,
            &[&format!("10.0.{}.{}", ip / 200, 1 + ip % 200)],
            label(r),
            ports(r / 3),
        )
    };
    for i in 0..24u64 {
        objs.push(pod_at(namespaces[(i % 3) as usize], i, i, rnd(1000)));
    }
    for (k, spec) in policy_specs.iter().enumerate().take(3) {
        objs.push(netpol(namespaces[k % 3], &format!("np{k}"), spec.clone()));
    }
    let mut c = PolicyCompiler::new();
    c.compile("node-a", &node_addrs(), &state_of(&objs));
    for step in 0..150 {
        let mut changed = std::collections::BTreeSet::new();
        let (mut namespaces_changed, mut policies_changed) = (false, false);
        let what = rnd(10);
        let pods: Vec<usize> = (0..objs.len())
            .filter(|&i| objs[i]["kind"] == "Pod")
            .collect();
        match what {
            0..=5 if !pods.is_empty() => {
                let i = pods[rnd(pods.len() as u64) as usize];
                let key = ObjectKey::new(
                    objs[i]["metadata"]["namespace"].as_str().unwrap(),
                    objs[i]["metadata"]["name"].as_str().unwrap(),
                );
                match rnd(6) {
                    0 | 1 => objs[i]["metadata"]["labels"] = label(rnd(1000)),
                    2 => {
                        let ip = format!("10.0.{}.{}", rnd(3), 1 + rnd(200));
                        objs[i]["status"]["podIP"] = json!(ip);
                        objs[i]["status"]["podIPs"] = json!([{"ip": ip}]);
                    }
                    3 => objs[i]["spec"]["containers"][0]["ports"] = ports(rnd(3)),
                    4 => {
                        objs[i]["status"]["phase"] =
                            json!(if rnd(2) == 0 { "Succeeded" } else { "Running" })
                    }
                    _ => {
                        objs.remove(i);
                    }
                }
                changed.insert(key);
            }
            0..=6 => {
                let n = namespaces[rnd(3) as usize];
                let id = 100 + step as u64;
                objs.push(pod_at(n, id, rnd(600), rnd(1000)));
                changed.insert(ObjectKey::new(n, format!("p{id}")));
            }
            7 => {
                let n = rnd(3) as usize;
                for o in objs.iter_mut() {
                    if o["kind"] == "Namespace" && o["metadata"]["name"] == namespaces[n] {
                        o["metadata"]["labels"] =
                            json!({"env": if rnd(2) == 0 { "prod" } else { "dev" }});
                    }
                }
                namespaces_changed = true;
            }
            _ => {
                let k = rnd(policy_specs.len() as u64) as usize;
                let n = namespaces[rnd(3) as usize];
                let name = format!("np{k}");
                let before = objs.len();
                objs.retain(|o| {
                    !(o["kind"] == "NetworkPolicy"
                        && o["metadata"]["namespace"] == n
                        && o["metadata"]["name"] == name.as_str())
                });
                if objs.len() == before {
                    objs.push(netpol(n, &name, policy_specs[k].clone()));
                }
                policies_changed = true;
            }
        }
        let st = state_of(&objs);
        let (inc, _) = c.compile_changes(
            "node-a",
            &node_addrs(),
            &st,
            Some(PolicyChanges {
                pods: &changed,
                namespaces: namespaces_changed,
                policies: policies_changed,
                cluster_policies: false,
            }),
        );
        let (full, _) = compile("node-a", &node_addrs(), &st);
        let mut addrs: Vec<Addr> = vec![
            Addr::from_ip(NODE.parse().unwrap()),
            Addr::from_ip(EXT.parse().unwrap()),
        ];
        for o in &objs {
            if o["kind"] == "Pod" {
                addrs.push(Addr::from_ip(
                    o["status"]["podIP"].as_str().unwrap().parse().unwrap(),
                ));
            }
        }
        let rule = |t: &PolicyTables, d: Decision| match d {
            Decision::Allow => "allow".to_string(),
            Decision::DenyEgress(i) => format!("deny egress {}", t.pods()[i as usize].name),
            Decision::DenyIngress(i) => format!("deny ingress {}", t.pods()[i as usize].name),
        };
        // What each side allows for the peer: every port entry (protocol and ports), sorted.
        // Which rule an entry names may differ: entries equal but for the rule are deduplicated
        // by rule id, and ids depend on the order rules were first seen.
        let allowing = |t: &PolicyTables, a: &Addr, b: &Addr| {
            let entries = |r: &Option<Arc<DirRules>>, peer: &Addr| {
                r.as_ref().map(|r| {
                    let mut v: Vec<(IpProto, u16, u16)> = r
                        .ports_for(peer)
                        .iter()
                        .map(|e| (e.proto, e.lo, e.hi))
                        .collect();
                    v.sort();
                    v
                })
            };
            let e = t
                .local_pod(a)
                .map(|i| entries(&t.pods()[i as usize].egress, b));
            let g = t
                .local_pod(b)
                .map(|j| entries(&t.pods()[j as usize].ingress, a));
            (e, g)
        };
        for a in &addrs {
            for b in &addrs {
                assert_eq!(
                    allowing(&inc, a, b),
                    allowing(&full, a, b),
                    "step {step}: rules {a:?} -> {b:?}"
                );
                for &(proto, port) in &[
                    (IpProto::TCP, 80),
                    (IpProto::TCP, 8080),
                    (IpProto::TCP, 8081),
                    (IpProto::UDP, 53),
                    (IpProto::SCTP, 9),
                ] {
                    assert_eq!(
                        rule(&inc, inc.judge(a, b, proto, port)),
                        rule(&full, full.judge(a, b, proto, port)),
                        "step {step} (change {what}): {a:?} -> {b:?} {proto}/{port}"
                    );
                }
            }
        }
    }
}

fn cnp(name: &str, tier: &str, priority: i64, spec: Value) -> Value {
    let mut spec = spec;
    spec["tier"] = json!(tier);
    spec["priority"] = json!(priority);
    json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
           "metadata": {"name": name}, "spec": spec})
}

fn env_ns(env: &str) -> Value {
    json!({"namespaces": {"matchLabels": {"env": env}}})
}

/// Admin (by priority, Pass on to NetworkPolicy), NetworkPolicy, Baseline (only where no
/// NetworkPolicy isolates), default allow; this node always allowed.
#[test]
fn cluster_tiers_in_api_order() {
    let policies = [
        // prod: Deny from dev on TCP 80, then Pass from dev; Accept from other.
        cnp(
            "guard",
            "Admin",
            10,
            json!({"subject": env_ns("prod"),
                   "ingress": [
                       {"action": "Deny", "from": [env_ns("dev")], "protocols": [{"tcp": {"destinationPort": {"number": 80}}}]},
                       {"action": "Pass", "from": [env_ns("dev")]},
                       {"action": "Accept", "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}]}]}),
        ),
        // A later Admin policy never sees what `guard` decided or passed.
        cnp(
            "later",
            "Admin",
            20,
            json!({"subject": env_ns("prod"),
                   "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
        ),
        // Baseline: deny everything into prod and dev on UDP.
        cnp(
            "base",
            "Baseline",
            1,
            json!({"subject": {"namespaces": {"matchExpressions": [{"key": "env", "operator": "Exists"}]}},
                   "ingress": [{"action": "Deny", "from": [{"namespaces": {}}], "protocols": [{"udp": {"destinationPort": {"range": {"start": 1, "end": 65535}}}}]}]}),
        ),
        // NetworkPolicy: prod/b (db) isolated, open to dev on TCP 8080.
        netpol(
            "prod",
            "db",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"env": "dev"}}}], "ports": [{"port": 8080}]}]}),
        ),
    ];
    let (t, problems) = tables(&policies);
    assert!(problems.is_empty(), "{problems:?}");
    // D (dev) -> A (prod, no NP): TCP 80 denied by guard[0]; others passed: no NP isolates A,
    // Baseline denies UDP. D -> B: passed to the NP: 8080 only. F (other) -> A/B: accepted by
    // guard[2] whatever the NP and Baseline. C (prod) -> A/B: `later` denies. D -> D: self.
    // E (remote dev) like D. The node always.
    grid(
        &t,
        P4,
        "
              A    B    D
        D     i.i. i.ii ....
        E     i.i. i.ii ..i.
        F     .... .... ..i.
        C     iiii iiii ..i.
        node  .... .... ....
        ",
    );
}

/// What kxdp cannot read never widens what is allowed: experimental peers refused by name, an
/// unreadable Deny covers more, an unreadable Pass denies, a policy-level problem fails closed.
#[test]
fn cluster_problems_fail_closed() {
    let policies = [
        cnp(
            "exp",
            "Admin",
            1,
            json!({"subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}},
                   "ingress": [{"action": "Pass", "from": [env_ns("dev")], "protocols": [{"icmp": {}}]},
                               {"action": "Accept", "from": [{"nodes": {}}]}]}),
        ),
        cnp(
            "bad-tier",
            "Middle",
            5,
            json!({"subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}},
                   "ingress": [{"action": "Accept", "from": [env_ns("prod")]},
                               {"action": "Pass", "from": [env_ns("dev")]}]}),
        ),
    ];
    let (t, problems) = tables(&policies);
    let text: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.object, p.message))
        .collect();
    for want in [
        "ClusterNetworkPolicy exp: spec.ingress[0].protocols[0].icmp: is not a field of the standard ClusterNetworkPolicy; refused",
        "ClusterNetworkPolicy exp: spec.ingress[0]: a Pass rule kxdp cannot read fully denies instead",
        "ClusterNetworkPolicy exp: spec.ingress[1].from[0].nodes: is in the experimental channel, which kxdp does not build; refused",
        "ClusterNetworkPolicy exp: spec.ingress[1]: this Accept rule matches nothing",
        "ClusterNetworkPolicy bad-tier: spec.tier: `Middle` is not Admin or Baseline",
        "ClusterNetworkPolicy bad-tier: the policy fails closed: Admin tier, its Accept rules match nothing and its Pass rules deny",
    ] {
        assert!(text.iter().any(|t| t == want), "missing {want:?} in {text:#?}");
    }
    // A (web): every port from dev denied (the Pass became a Deny over every port); C -> A
    // untouched. F (other): Accept void, Pass from dev denies.
    grid(
        &t,
        P4,
        "
              A    F
        D     iiii iiii
        C     .... ....
        ",
    );
    // The trace names the rule that denied.
    let (_, i) = t.explain(&addr_of("D"), &addr_of("A"), IpProto::TCP, 80);
    let kxdp_dataplane::policy::Side::DeniedBy(r) = i else {
        panic!("{i:?}")
    };
    assert_eq!(
        t.rules[r as usize].to_string(),
        "ClusterNetworkPolicy exp (Admin tier, priority 1) ingress[0] Deny"
    );
}

/// The incremental compiler with ClusterNetworkPolicies equals a fresh compile through policy
/// additions, changes and deletions, pod and namespace relabelling; one CNP change rebuilds
/// only tiers it is part of.
#[test]
fn cluster_incremental_equals_full() {
    let base = cluster();
    let guard = |prio: i64, action: &str| {
        cnp(
            "guard",
            "Admin",
            prio,
            json!({"subject": env_ns("prod"),
                   "ingress": [{"action": action, "from": [env_ns("dev")]}],
                   "egress": [{"action": "Deny", "to": [{"networks": ["203.0.113.0/24"]}]}]}),
        )
    };
    let allow = cnp(
        "allow",
        "Admin",
        15,
        json!({"subject": env_ns("prod"), "ingress": [{"action": "Accept", "from": [{"namespaces": {}}],
               "protocols": [{"destinationNamedPort": "http"}]}]}),
    );
    let base_deny = cnp(
        "base",
        "Baseline",
        3,
        json!({"subject": {"namespaces": {}}, "ingress": [{"action": "Deny", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cli"}}}}]}]}),
    );
    let mut steps: Vec<(&str, Vec<Value>, PolicyChanges)> = Vec::new();
    let none: &'static std::collections::BTreeSet<ObjectKey> = Box::leak(Box::default());
    let relabelled: &'static std::collections::BTreeSet<ObjectKey> =
        Box::leak(Box::new([ObjectKey::new("dev", "d")].into()));
    let ch = |pods, namespaces, cluster_policies| PolicyChanges {
        pods,
        namespaces,
        policies: false,
        cluster_policies,
    };
    steps.push(("guard", vec![guard(10, "Deny")], ch(none, false, true)));
    steps.push((
        "guard+allow+base",
        vec![guard(10, "Deny"), allow.clone(), base_deny.clone()],
        ch(none, false, true),
    ));
    steps.push((
        "guard priority after allow",
        vec![guard(20, "Deny"), allow.clone(), base_deny.clone()],
        ch(none, false, true),
    ));
    steps.push((
        "guard passes",
        vec![guard(20, "Pass"), allow.clone(), base_deny.clone()],
        ch(none, false, true),
    ));
    let mut relabel = base.clone();
    for o in relabel.iter_mut() {
        if o["metadata"]["name"] == "d" {
            o["metadata"]["labels"] = json!({"app": "web"});
        }
    }
    steps.push(("pod relabelled", vec![], ch(relabelled, false, false)));
    steps.push(("guard deleted", vec![], ch(none, false, true)));
    let mut c = PolicyCompiler::new();
    let mut current: Vec<Value> = Vec::new();
    let mut infra = base.clone();
    for (i, (what, policies, changes)) in steps.into_iter().enumerate() {
        match what {
            "pod relabelled" => infra = relabel.clone(),
            "guard deleted" => current.retain(|p| p["metadata"]["name"] != "guard"),
            _ => current = policies,
        }
        let mut objs = infra.clone();
        objs.extend(current.iter().cloned());
        let st = state_of(&objs);
        let changes = if i == 0 { None } else { Some(changes) };
        let (inc, _) = c.compile_changes("node-a", &node_addrs(), &st, changes);
        let (full, _) = compile("node-a", &node_addrs(), &st);
        same_judgement(&inc, &full, what);
    }
}

/// Every pair and probe judged alike by `inc` and `full`, the deciding rule named alike.
fn same_judgement(inc: &PolicyTables, full: &PolicyTables, what: &str) {
    for s in ["A", "B", "C", "D", "E", "F", "node", "ext"] {
        for d in ["A", "B", "C", "D", "E", "F", "node", "ext"] {
            assert_eq!(
                cell(inc, s, d, P4),
                cell(full, s, d, P4),
                "step {what}: {s} -> {d}"
            );
            // Rule ids differ between compilers (by first sight): compared by name.
            use kxdp_dataplane::policy::Side;
            let text = |t: &PolicyTables, side: Side| match side {
                Side::Allowed(r) => format!("allowed by {}", t.rules[r as usize]),
                Side::DeniedBy(r) => format!("denied by {}", t.rules[r as usize]),
                other => format!("{other:?}"),
            };
            for &(p, port) in P4 {
                let (a, b) = (addr_of(s), addr_of(d));
                let (ie, ii) = inc.explain(&a, &b, p, port);
                let (fe, fi) = full.explain(&a, &b, p, port);
                assert_eq!(
                    (text(inc, ie), text(inc, ii)),
                    (text(full, fe), text(full, fi)),
                    "step {what}: {s} -> {d} {p}/{port}"
                );
            }
        }
    }
}

/// Each ClusterNetworkPolicy direction is one table, shared by the pods it selects and by
/// directions of equal content: a priority change compiles no table, a content change only
/// that policy's, a label change only the tables whose peers it changes; each step's tables
/// judge as a fresh compile's, subjects gained and lost by relabelling included.
#[test]
fn cluster_tables_follow_what_changed() {
    // `twin-a` and `twin-b`: the same rules (one table), around `web` in priority.
    let twin = |name: &str, prio: i64| {
        cnp(
            name,
            "Admin",
            prio,
            json!({"subject": {"namespaces": {}},
                   "ingress": [{"action": "Pass", "from": [env_ns("dev")], "protocols": [{"udp": {"destinationPort": {"number": 53}}}]},
                               {"action": "Deny", "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}]}]}),
        )
    };
    let cli =
        json!({"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cli"}}}});
    let web = |port: i64| {
        cnp(
            "web",
            "Admin",
            6,
            json!({"subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}},
                   "ingress": [{"action": "Deny", "from": [cli], "protocols": [{"tcp": {"destinationPort": {"number": port}}}]},
                               {"action": "Accept", "from": [{"namespaces": {}}], "protocols": [{"destinationNamedPort": "http"}]}],
                   "egress": [{"action": "Accept", "to": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"tier": "front"}}}}],
                               "protocols": [{"destinationNamedPort": "http"}]}]}),
        )
    };
    let base = cnp(
        "base",
        "Baseline",
        1,
        json!({"subject": {"namespaces": {}},
               "ingress": [{"action": "Deny", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}}]}]}),
    );
    let relabel = |objs: &mut Vec<Value>, name: &str, labels: Value| {
        for o in objs.iter_mut() {
            if o["metadata"]["name"] == name {
                o["metadata"]["labels"] = labels.clone();
            }
        }
    };
    let none: &'static std::collections::BTreeSet<ObjectKey> = Box::leak(Box::default());
    let d_key: &'static std::collections::BTreeSet<ObjectKey> =
        Box::leak(Box::new([ObjectKey::new("dev", "d")].into()));
    let ch = |pods, namespaces, cluster_policies| {
        Some(PolicyChanges {
            pods,
            namespaces,
            policies: false,
            cluster_policies,
        })
    };
    let mut infra = cluster();
    let mut policies = vec![twin("twin-a", 5), twin("twin-b", 7), web(80), base.clone()];
    let mut c = PolicyCompiler::new();
    let mut step = |what: &str,
                    infra: &[Value],
                    policies: &[Value],
                    changes: Option<PolicyChanges<'static>>| {
        let mut objs = infra.to_vec();
        objs.extend_from_slice(policies);
        let st = state_of(&objs);
        let (inc, problems) = c.compile_changes("node-a", &node_addrs(), &st, changes);
        assert!(problems.is_empty(), "{problems:?}");
        let (full, _) = compile("node-a", &node_addrs(), &st);
        same_judgement(&inc, &full, what);
        c.stats.cluster_built
    };
    // twin (one table for both), web ingress (for A, its one subject here: with A's http
    // port), web egress, base.
    assert_eq!(step("first", &infra, &policies, None), 4);
    // The twins share their table, so a pod's tier holds it once (twin-b never decides: twin-a
    // matched the same first); B (prod) and F (other) hold one allocation.
    let (t, _) = compile("node-a", &node_addrs(), &{
        let mut objs = infra.clone();
        objs.extend_from_slice(&policies);
        state_of(&objs)
    });
    let tier = |p: &str| {
        let i = t.local_pod(&addr_of(p)).unwrap() as usize;
        t.pods()[i].cluster.clone().unwrap()
    };
    let (b, f) = (tier("B"), tier("F"));
    assert_eq!(b.admin_ingress.len(), 1, "the twins, once");
    let names: Vec<&str> = b.policies.iter().map(|n| &**n).collect();
    assert_eq!(names, ["twin-a", "twin-b", "base"]);
    assert!(Arc::ptr_eq(&b.admin_ingress[0], &f.admin_ingress[0]));
    assert_eq!(tier("A").admin_ingress.len(), 2, "twin-a, web");

    // D becomes a `web` pod: a subject of `web`, no longer a `cli` peer (web's ingress peers
    // change: its table for A, and one for D, without named ports), a peer of `base` (its
    // peers change). Web's egress and the twins are untouched.
    relabel(&mut infra, "d", json!({"app": "web", "tier": "front"}));
    assert_eq!(
        step(
            "D relabelled web",
            &infra,
            &policies,
            ch(d_key, false, false)
        ),
        3
    );
    relabel(&mut infra, "d", json!({"app": "cli", "tier": "front"}));
    assert_eq!(
        step("D back to cli", &infra, &policies, ch(d_key, false, false)),
        2
    );
    // A priority: the same tables, in another order.
    policies[0] = twin("twin-a", 9);
    assert_eq!(
        step("twin-a after web", &infra, &policies, ch(none, false, true)),
        0
    );
    // One policy's rules: its ingress table only.
    policies[2] = web(81);
    assert_eq!(
        step("web port changed", &infra, &policies, ch(none, false, true)),
        1
    );
    // A policy deleted; a namespace relabelled (other becomes dev).
    policies.remove(1);
    assert_eq!(
        step("twin-b deleted", &infra, &policies, ch(none, false, true)),
        0
    );
    for o in infra.iter_mut() {
        if o["kind"] == "Namespace" && o["metadata"]["name"] == "other" {
            o["metadata"]["labels"] = json!({"env": "dev"});
        }
    }
    step("other is dev", &infra, &policies, ch(none, true, false));
}
