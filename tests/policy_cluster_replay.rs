//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`) through `kxdp replay`: the
//! scenarios of the Network Policy API's conformance suite (`conformance/tests/` in
//! kubernetes-sigs/network-policy-api: Admin and Baseline tiers, TCP/UDP/SCTP rules, priority,
//! Pass, inline CIDR peers, integration with NetworkPolicy), named ports, stateful replies,
//! refused experimental fields and `kxdp policy trace`.
//!
//! Cluster (this node: node-a, 192.168.0.2), namespaces labelled `conformance-house`:
//!
//! | pod | namespace | address | node | labels | named ports |
//! | --- | --- | --- | --- | --- | --- |
//! | G | gryffindor | 10.1.0.1 | a | app=web | web 8080/TCP |
//! | G2 | gryffindor | 10.1.0.2 | a | app=db | — |
//! | S | slytherin | 10.1.0.3 | a | app=cli | — |
//! | H | hufflepuff | 10.1.0.4 | a | app=web | dns 53/UDP |
//! | R | ravenclaw | 10.2.0.5 | b | app=cli | — |

mod support;

use serde_json::{json, Value};
use support::*;

const G: &str = "10.1.0.1";
const G2: &str = "10.1.0.2";
const S: &str = "10.1.0.3";
const H: &str = "10.1.0.4";
const R: &str = "10.2.0.5";

fn house(name: &str) -> Value {
    let mut n = namespace(name);
    n["metadata"]["labels"]["conformance-house"] = json!(name);
    n
}

fn pod_in(ns: &str, name: &str, node_name: &str, ip: &str, labels: Value, ports: Value) -> Value {
    let mut p = pod(name, node_name, ip);
    p["metadata"]["namespace"] = json!(ns);
    p["metadata"]["labels"] = labels;
    p["spec"]["containers"][0]["ports"] = ports;
    p
}

fn cluster() -> Vec<Value> {
    vec![
        node(NODE_A, "zone-a", &[NODE_A_IP, NODE_A_IP6]),
        node(NODE_B, "zone-b", &[NODE_B_IP]),
        house("gryffindor"),
        house("slytherin"),
        house("hufflepuff"),
        house("ravenclaw"),
        pod_in(
            "gryffindor",
            "g",
            NODE_A,
            G,
            json!({"app": "web"}),
            json!([{"name": "web", "containerPort": 8080}]),
        ),
        pod_in(
            "gryffindor",
            "g2",
            NODE_A,
            G2,
            json!({"app": "db"}),
            json!([]),
        ),
        pod_in(
            "slytherin",
            "s",
            NODE_A,
            S,
            json!({"app": "cli"}),
            json!([]),
        ),
        pod_in(
            "hufflepuff",
            "h",
            NODE_A,
            H,
            json!({"app": "web"}),
            json!([{"name": "dns", "containerPort": 53, "protocol": "UDP"}]),
        ),
        pod_in(
            "ravenclaw",
            "r",
            NODE_B,
            R,
            json!({"app": "cli"}),
            json!([]),
        ),
    ]
}

fn cnp(name: &str, tier: &str, priority: i64, spec: Value) -> Value {
    let mut spec = spec;
    spec["tier"] = json!(tier);
    spec["priority"] = json!(priority);
    json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
           "metadata": {"name": name}, "spec": spec})
}

fn netpol(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"namespace": ns, "name": name}, "spec": spec})
}

fn houses(h: &str) -> Value {
    json!({"namespaces": {"matchLabels": {"conformance-house": h}}})
}

fn subject_house(h: &str) -> Value {
    json!({"namespaces": {"matchLabels": {"conformance-house": h}}})
}

fn rule(action: &str, peers: Value, protocols: Option<Value>) -> Value {
    let mut r = json!({"action": action});
    // `from` or `to` is set by the caller's direction.
    r["peers"] = peers;
    if let Some(p) = protocols {
        r["protocols"] = p;
    }
    r
}

/// Rules for one direction: `peers` becomes `from` (ingress) or `to` (egress).
fn gress(dir: &str, rules: Vec<Value>) -> Value {
    let key = if dir == "ingress" { "from" } else { "to" };
    Value::Array(
        rules
            .into_iter()
            .map(|mut r| {
                let p = r["peers"].take();
                r.as_object_mut().unwrap().remove("peers");
                r[key] = p;
                r
            })
            .collect(),
    )
}

fn port(proto: &str, n: u16) -> Value {
    json!([{proto: {"destinationPort": {"number": n}}}])
}

fn env_with(objects: Vec<Value>) -> Env {
    let mut env = Env::bare();
    env.infra = cluster();
    env.objects = objects;
    env
}

fn addr(name: &str) -> &str {
    match name {
        "G" => G,
        "G2" => G2,
        "S" => S,
        "H" => H,
        "R" => R,
        "ext" => EXTERNAL,
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

/// The conformance suite's `egress-tcp` / `egress-udp` / `egress-sctp` Admin policies (and
/// their ingress twins) for one protocol: rules in order, the first that matches decides —
/// Accept to ravenclaw shadows the Deny and Pass after it; Deny to slytherin on port 80 (only
/// this protocol); Accept to hufflepuff on 8080, Deny the rest of hufflepuff.
fn gress_rules(dir: &str, proto: &str) -> Value {
    let p = proto.to_lowercase();
    cnp(
        &format!("{dir}-{p}"),
        "Admin",
        6,
        json!({
            "subject": subject_house("gryffindor"),
            dir: gress(dir, vec![
                rule("Accept", json!([houses("ravenclaw")]), None),
                rule("Deny", json!([houses("ravenclaw")]), None),
                rule("Pass", json!([houses("ravenclaw")]), None),
                rule("Deny", json!([houses("slytherin")]), Some(port(&p, 80))),
                rule("Pass", json!([houses("slytherin")]), Some(port(&p, 80))),
                rule("Accept", json!([houses("hufflepuff")]), Some(port(&p, 8080))),
                rule("Deny", json!([houses("hufflepuff")]), None),
            ]),
        }),
    )
}

/// Admin tier, egress, for TCP, UDP and SCTP: G and G2 (gryffindor) are the subjects.
#[test]
fn admin_egress_rules_per_protocol() {
    for proto in ["TCP", "UDP", "SCTP"] {
        let other = if proto == "TCP" { "UDP" } else { "TCP" };
        let probes = [(proto, 80), (proto, 8080), (other, 80), (proto, 81)];
        let env = env_with(vec![gress_rules("egress", proto)]);
        // Columns: S (slytherin), H (hufflepuff), R (ravenclaw, remote), G2 (own house: not
        // a peer of any rule).
        replay_grid(
            &env,
            &probes,
            "
                  S    H    R    G2
            G     e... e.ee .... ....
            G2    e... e.ee .... ....
            S     .... .... .... ....
            ",
        );
    }
}

/// Admin tier, ingress, for TCP, UDP and SCTP; remote sources (R) are judged at the local
/// destination.
#[test]
fn admin_ingress_rules_per_protocol() {
    for proto in ["TCP", "UDP", "SCTP"] {
        let other = if proto == "TCP" { "UDP" } else { "TCP" };
        let probes = [(proto, 80), (proto, 8080), (other, 80), (proto, 81)];
        let env = env_with(vec![gress_rules("ingress", proto)]);
        replay_grid(
            &env,
            &probes,
            "
                  G    G2   S
            S     i... i... ....
            H     i.ii i.ii ....
            R     .... .... ....
            G2    .... .... ....
            ",
        );
    }
}

/// The same rules in the Baseline tier: with no NetworkPolicy they decide as in the Admin
/// tier.
#[test]
fn baseline_rules_without_network_policy() {
    let mut p = gress_rules("egress", "TCP");
    p["spec"]["tier"] = json!("Baseline");
    let env = env_with(vec![p]);
    replay_grid(
        &env,
        &[("TCP", 80), ("TCP", 8080), ("UDP", 80)],
        "
              S   H   R
        G     e.. e.e ...
        ",
    );
}

/// Priority: lower numbers first, whatever the names; equal priorities by name (kxdp's
/// tie-break); a higher-priority Pass sends both directions on past the Admin tier (here to a
/// Baseline Deny, as the conformance suite's `CNPAdminTierPriorityField`).
#[test]
fn priority_orders_policies() {
    let deny = |name: &str, prio: i64| {
        cnp(
            name,
            "Admin",
            prio,
            json!({"subject": subject_house("gryffindor"),
                   "ingress": gress("ingress", vec![rule("Deny", json!([houses("slytherin")]), None)])}),
        )
    };
    let accept = |name: &str, prio: i64| {
        cnp(
            name,
            "Admin",
            prio,
            json!({"subject": subject_house("gryffindor"),
                   "ingress": gress("ingress", vec![rule("Accept", json!([houses("slytherin")]), None)])}),
        )
    };
    let grid_denied = "
              G
        S     i
        ";
    let grid_allowed = "
              G
        S     .
        ";
    let probes = [("TCP", 80)];
    // The Accept at priority 10 comes before the Deny at 20 (names in the other order).
    replay_grid(
        &env_with(vec![deny("a-deny", 20), accept("z-accept", 10)]),
        &probes,
        grid_allowed,
    );
    replay_grid(
        &env_with(vec![deny("a-deny", 10), accept("z-accept", 20)]),
        &probes,
        grid_denied,
    );
    // Equal priorities: by name.
    replay_grid(
        &env_with(vec![deny("a-deny", 10), accept("z-accept", 10)]),
        &probes,
        grid_denied,
    );
    replay_grid(
        &env_with(vec![deny("z-deny", 10), accept("a-accept", 10)]),
        &probes,
        grid_allowed,
    );
    // Pass at priority 5 skips the Admin Accept at 10 and reaches the Baseline Deny.
    let pass = cnp(
        "pass",
        "Admin",
        5,
        json!({"subject": subject_house("gryffindor"),
               "ingress": gress("ingress", vec![rule("Pass", json!([houses("slytherin")]), None)]),
               "egress": gress("egress", vec![rule("Pass", json!([houses("slytherin")]), None)])}),
    );
    let baseline = cnp(
        "default",
        "Baseline",
        10,
        json!({"subject": subject_house("gryffindor"),
               "ingress": gress("ingress", vec![rule("Deny", json!([houses("slytherin")]), None)]),
               "egress": gress("egress", vec![rule("Deny", json!([houses("slytherin")]), None)])}),
    );
    replay_grid(
        &env_with(vec![pass, accept("allow", 10), baseline]),
        &probes,
        "
              G S
        S     i .
        G     . e
        ",
    );
}

/// The conformance suite's `CNPAdminTierIntegration` (`standard-anp-np-banp.yaml`): an Admin
/// Deny beats a NetworkPolicy that allows; turned into Pass, the NetworkPolicy decides; with
/// the NetworkPolicy gone, the Baseline Deny applies; Baseline never applies to a pod a
/// NetworkPolicy isolates.
#[test]
fn integration_with_network_policy() {
    let admin = |action: &str| {
        cnp(
            "pass-example",
            "Admin",
            10,
            json!({"subject": subject_house("gryffindor"),
                   "ingress": gress("ingress", vec![rule(action, json!([houses("slytherin")]), None)]),
                   "egress": gress("egress", vec![rule(action, json!([houses("slytherin")]), None)])}),
        )
    };
    let np = netpol(
        "gryffindor",
        "allow-gress-from-to-slytherin-to-gryffindor",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}}}]}],
               "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}}}]}]}),
    );
    let baseline = cnp(
        "default",
        "Baseline",
        10,
        json!({"subject": subject_house("gryffindor"),
               "ingress": gress("ingress", vec![rule("Deny", json!([houses("slytherin")]), None)]),
               "egress": gress("egress", vec![rule("Deny", json!([houses("slytherin")]), None)])}),
    );
    let probes = [("TCP", 80), ("UDP", 53)];
    // Admin Deny over the NetworkPolicy's allow, both directions.
    replay_grid(
        &env_with(vec![admin("Deny"), np.clone(), baseline.clone()]),
        &probes,
        "
              G  S  H
        S     ii .. ..
        G     .. ee ee
        ",
    );
    // Pass: the NetworkPolicy allows slytherin (and, isolating G for egress, denies
    // hufflepuff); the Baseline Deny is not reached.
    replay_grid(
        &env_with(vec![admin("Pass"), np.clone(), baseline.clone()]),
        &probes,
        "
              G  S  H
        S     .. .. ..
        G     .. .. ee
        H     ii .. ..
        ",
    );
    // Pass without the NetworkPolicy: the Baseline Deny.
    replay_grid(
        &env_with(vec![admin("Pass"), baseline.clone()]),
        &probes,
        "
              G  S  H
        S     ii .. ..
        G     .. ee ..
        ",
    );
    // Admin Accept is final: the NetworkPolicy default-deny below it does not apply.
    let deny_all = netpol(
        "gryffindor",
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    replay_grid(
        &env_with(vec![admin("Accept"), deny_all, baseline]),
        &probes,
        "
              G  G2
        S     .. ..
        H     ii ii
        ",
    );
}

/// The conformance suite's `inline-cidr-as-peers-example`: egress Accept to slytherin's pods,
/// then Deny to `0.0.0.0/0` and `::/0` (which covers pods too); this node stays reachable.
#[test]
fn inline_cidr_networks() {
    let p = cnp(
        "inline-cidr-as-peers-example",
        "Admin",
        85,
        json!({"subject": {"pods": {"namespaceSelector": {"matchLabels": {"conformance-house": "gryffindor"}},
                              "podSelector": {"matchLabels": {"app": "web"}}}},
        "egress": gress("egress", vec![
            rule("Accept", json!([{"pods": {"namespaceSelector": {"matchLabels": {"conformance-house": "slytherin"}},
                                           "podSelector": {}}}]), None),
            rule("Accept", json!([{"networks": ["203.0.113.0/28"]}]), Some(port("tcp", 443))),
            rule("Deny", json!([{"networks": ["0.0.0.0/0", "::/0"]}]), None),
        ])}),
    );
    let env = env_with(vec![p]);
    replay_grid(
        &env,
        &[("TCP", 443), ("UDP", 53)],
        "
              S  H  R  ext node
        G     .. ee ee .e  nn
        G2    .. .. .. ..  nn
        ",
    );
}

/// Named ports: ingress against the selected pod's own container ports (G has `web` 8080/TCP,
/// G2 none), egress against each peer's (H has `dns` 53/UDP).
#[test]
fn named_ports() {
    let p = cnp(
        "named",
        "Admin",
        1,
        json!({"subject": subject_house("gryffindor"),
        "ingress": gress("ingress", vec![
            rule("Accept", json!([houses("slytherin")]), Some(json!([{"destinationNamedPort": "web"}]))),
            rule("Deny", json!([houses("slytherin")]), None),
        ]),
        "egress": gress("egress", vec![
            rule("Accept", json!([houses("hufflepuff")]), Some(json!([{"destinationNamedPort": "dns"}]))),
            rule("Deny", json!([houses("hufflepuff")]), None),
        ])}),
    );
    let env = env_with(vec![p]);
    replay_grid(
        &env,
        &[("TCP", 8080), ("UDP", 8080), ("UDP", 53), ("TCP", 53)],
        "
              G    G2   H
        S     .iii iiii ....
        G     .... .... ee.e
        ",
    );
}

/// Stateful: the replies of a connection an Admin rule accepted pass although a Deny covers
/// the other way; a denied connection leaves nothing.
#[test]
fn replies_pass_statefully() {
    use support::flags::*;
    let p = cnp(
        "one-way",
        "Admin",
        1,
        json!({"subject": subject_house("gryffindor"),
               "egress": gress("egress", vec![rule("Accept", json!([houses("slytherin")]), None)]),
               "ingress": gress("ingress", vec![rule("Deny", json!([houses("slytherin")]), None)])}),
    );
    let env = env_with(vec![p]);
    let (g, s) = (format!("{G}:40000"), format!("{S}:80"));
    let r = env.replay(&[
        tcp(&g, &s, SYN, 1, 0, b""),
        tcp(&s, &g, SYN | ACK, 7, 2, b""),
        tcp(&g, &s, ACK, 2, 8, b""),
        udp(&format!("{G}:5000"), &format!("{S}:53"), b"q"),
        udp(&format!("{S}:53"), &format!("{G}:5000"), b"a"),
        syn(&format!("{S}:40001"), &format!("{G}:80")),
    ]);
    assert_eq!(
        r.reasons(),
        [
            "direct",
            "direct",
            "direct",
            "direct",
            "direct",
            "policy-denied-ingress"
        ]
    );
}

/// Experimental-channel fields are refused by name: a `nodes` peer in a Deny rule makes it
/// deny every peer; a `domainNames` peer in an Accept rule matches nothing (the rule's other
/// peers still do).
#[test]
fn experimental_fields_are_refused() {
    let env = env_with(vec![
        cnp(
            "exp-deny",
            "Admin",
            1,
            json!({"subject": subject_house("gryffindor"),
                   "ingress": gress("ingress", vec![rule("Deny", json!([{"nodes": {"matchLabels": {"x": "y"}}}]), Some(port("tcp", 22)))])}),
        ),
        cnp(
            "exp-accept",
            "Admin",
            2,
            json!({"subject": subject_house("gryffindor"),
            "egress": gress("egress", vec![
                rule("Accept", json!([{"domainNames": ["example.com"]}, houses("slytherin")]), None),
                rule("Deny", json!([{"networks": ["0.0.0.0/0"]}]), None),
            ])}),
        ),
    ]);
    let r = env.replay(&[
        syn(&format!("{S}:1000"), &format!("{G}:22")),
        syn(&format!("{S}:1001"), &format!("{G}:80")),
        syn(&format!("{G}:1002"), &format!("{S}:80")),
        syn(&format!("{G}:1003"), &format!("{EXTERNAL}:443")),
    ]);
    for want in [
        "warning: ClusterNetworkPolicy exp-deny: spec.ingress[0].from[0].nodes: is in the experimental channel, which kxdp does not build; refused",
        "warning: ClusterNetworkPolicy exp-deny: spec.ingress[0]: this Deny rule covers every peer",
        "warning: ClusterNetworkPolicy exp-accept: spec.egress[0].to[0].domainNames: is in the experimental channel, which kxdp does not build; refused",
        "warning: ClusterNetworkPolicy exp-accept: spec.egress[0]: this Accept rule matches only what kxdp could read",
    ] {
        assert!(r.stderr.contains(want), "missing {want:?} in\n{}", r.stderr);
    }
    assert_eq!(
        r.reasons(),
        [
            "policy-denied-ingress",
            "direct",
            "direct",
            "policy-denied-egress"
        ]
    );
}

#[test]
fn policy_trace_names_policy_tier_and_rule() {
    let env = env_with(vec![
        gress_rules("egress", "TCP"),
        cnp(
            "default",
            "Baseline",
            10,
            json!({"subject": subject_house("gryffindor"),
                   "ingress": gress("ingress", vec![rule("Deny", json!([houses("hufflepuff")]), None)])}),
        ),
    ]);
    env.write_files();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
            .args(["policy", "trace", "--config"])
            .arg(env.path("config.yaml"))
            .arg("--state")
            .arg(env.path("state"))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(&["--from", G, "--to", "10.1.0.3:80"]);
    for want in [
        "  egress policies selecting it: ClusterNetworkPolicy egress-tcp (Admin tier, priority 6)",
        "  egress  at source:      denied by ClusterNetworkPolicy egress-tcp (Admin tier, priority 6) egress[3] Deny",
        "  verdict: drop (policy-denied-egress)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let text = run(&["--from", G, "--to", "10.2.0.5:80"]);
    assert!(
        text.contains("  egress  at source:      allowed by ClusterNetworkPolicy egress-tcp (Admin tier, priority 6) egress[0] Accept"),
        "{text}"
    );
    let text = run(&["--from", H, "--to", "10.1.0.1:80"]);
    for want in [
        "  ingress policies selecting it: ClusterNetworkPolicy default (Baseline tier, priority 10)",
        "  ingress at destination: denied by ClusterNetworkPolicy default (Baseline tier, priority 10) ingress[0] Deny",
        "  verdict: drop (policy-denied-ingress)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}
