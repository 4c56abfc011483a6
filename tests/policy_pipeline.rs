//! NetworkPolicy at the pipeline level (translate + `Pipeline::process`, no binary): new
//! connections are counted per rule that decided them, and a new snapshot leaves established
//! connections alone.

mod support;

use std::path::Path;
use std::sync::Arc;

use kxdp_control::model::ClusterState;
use kxdp_control::policy::counters::{self, PolicyCounterRow};
use kxdp_control::{translate, Config};
use kxdp_dataplane::conntrack::{Conntrack, CtConfig};
use kxdp_dataplane::pipeline::{Pipeline, SlotFrames};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::verdict::{Reason, Verdict};
use kxdp_packet::LinkType;
use serde_json::json;
use support::flags::*;
use support::*;

const WEB: &str = "10.1.0.1";
const DB: &str = "10.1.0.2";
const REMOTE: &str = "10.2.0.9";

fn snapshot(with_policy: bool) -> Arc<Snapshot> {
    let mut objs = vec![
        namespace(NS),
        node(NODE_A, "zone-a", &[NODE_A_IP]),
        pod("web", NODE_A, WEB),
        pod("db", NODE_A, DB),
        pod("remote", NODE_B, REMOTE),
    ];
    if with_policy {
        objs.push(json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": NS, "name": "db-from-web"},
            "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 5432}]}]}}));
    }
    let config = Config::from_yaml_str(BASE_CONFIG, Path::new("config.yaml")).unwrap();
    let mut state = ClusterState::new();
    kxdp_control::sources::files::load_str(
        &yaml_docs(&objs),
        false,
        Path::new("state.yaml"),
        &mut state,
    )
    .unwrap();
    let t = translate(&config, &state);
    assert!(t.problems.is_empty(), "{:?}", t.problems);
    Arc::new(t.snapshot)
}

fn run(
    p: &mut Pipeline,
    ct: &Conntrack,
    snap: &Snapshot,
    frames: &[Vec<u8>],
    now: u64,
) -> Vec<Reason> {
    let mut f = SlotFrames::new(frames.len(), 2048);
    for fr in frames {
        f.push(fr);
    }
    let mut v = vec![Verdict::default(); frames.len()];
    p.process(&mut f, &mut v, snap, ct, now);
    v.iter().map(|v| v.reason).collect()
}

#[test]
fn connections_are_counted_per_rule() {
    let snap = snapshot(true);
    let ct = Conntrack::new(CtConfig::default(), 1);
    let mut p = Pipeline::new(0, LinkType::Ethernet, 1, &ct);
    let frames = vec![
        syn(&format!("{WEB}:1000"), &format!("{DB}:5432")),
        syn(&format!("{REMOTE}:1000"), &format!("{DB}:5432")),
        syn(&format!("{REMOTE}:1001"), &format!("{DB}:5432")),
        syn(&format!("{DB}:1000"), &format!("{WEB}:80")),
        udp(&format!("{WEB}:1000"), &format!("{REMOTE}:53"), b"q"),
    ];
    let r = run(&mut p, &ct, &snap, &frames, 1_000);
    assert_eq!(
        r,
        [
            Reason::Direct,
            Reason::PolicyDeniedIngress,
            Reason::PolicyDeniedIngress,
            Reason::PolicyDeniedEgress,
            Reason::Direct,
        ]
    );
    let row = |direction: &str, rule: &str, verdict: &str, connections| PolicyCounterRow {
        kind: "NetworkPolicy".into(),
        policy: "demo/db-from-web".into(),
        direction: direction.into(),
        rule: rule.into(),
        verdict: verdict.into(),
        connections,
    };
    // web -> db:5432 allowed by the ingress rule; the remote pod denied twice and db's own
    // egress once by the policy's isolation; web -> remote judged by no policy.
    assert_eq!(
        counters::rows(&snap.policy, &p.counters.policy.values()),
        [
            row("egress", "isolation", "deny", 1),
            row("ingress", "0", "allow", 1),
            row("ingress", "isolation", "deny", 2),
        ]
    );
    assert_eq!(p.counters.reasons[Reason::PolicyDeniedIngress as usize], 2);
    // A new snapshot of the same policies names the same rules: the counts go on.
    let again = snapshot(true);
    let r = run(
        &mut p,
        &ct,
        &again,
        &[syn(&format!("{REMOTE}:1002"), &format!("{DB}:5432"))],
        2_000,
    );
    assert_eq!(r, [Reason::PolicyDeniedIngress]);
    assert_eq!(
        counters::rows(&again.policy, &p.counters.policy.values())[2],
        row("ingress", "isolation", "deny", 3)
    );
    // The allowed ones are tracked as is (two connections).
    assert_eq!(ct.connections().count(), 2);
}

#[test]
fn a_new_snapshot_leaves_established_connections_alone() {
    let open = snapshot(false);
    let closed = snapshot(true);
    let ct = Conntrack::new(CtConfig::default(), 1);
    let mut p = Pipeline::new(0, LinkType::Ethernet, 1, &ct);
    let (r, d) = (format!("{REMOTE}:2000"), format!("{DB}:80"));
    let first = run(
        &mut p,
        &ct,
        &open,
        &[
            tcp(&r, &d, SYN, 1, 0, b""),
            tcp(&d, &r, SYN | ACK, 9, 2, b""),
            tcp(&r, &d, ACK, 2, 10, b""),
        ],
        1_000,
    );
    assert_eq!(first, [Reason::Direct; 3]);
    // The policy arrives: db only from web, on 5432.
    let later = run(
        &mut p,
        &ct,
        &closed,
        &[
            tcp(&r, &d, ACK | PSH, 2, 10, b"data"),
            tcp(&d, &r, ACK | PSH, 10, 6, b"more"),
            syn(&format!("{REMOTE}:2001"), &d),
        ],
        2_000,
    );
    assert_eq!(
        later,
        [Reason::Direct, Reason::Direct, Reason::PolicyDeniedIngress]
    );
}
