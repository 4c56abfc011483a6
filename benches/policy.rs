//! NetworkPolicy benchmarks: a synthetic cluster of 10k pods in 20 namespaces (500 of them on this
//! node) and 1k NetworkPolicies of every kind (default deny, pod and namespace selectors with
//! expressions, named ports, endPort ranges, ipBlocks with excepts, egress and ingress).
//!
//! - `judge`: the per-new-connection verdict (`PolicyTables::judge`) over a mix of allowed and
//!   denied pod pairs, local and remote, both directions judged; also with 100
//!   ClusterNetworkPolicies besides the NetworkPolicies;
//! - `pipeline_new_connection`: `Pipeline::process` on batches of 64 first packets between pods
//!   (allowed ones tracked as is, denied ones dropped), conntrack fresh per batch;
//! - `compile_full` / `recompile_one_label`: the control plane's compilation, from scratch and
//!   after one pod's label changed (the incremental compiler rebuilds only affected pods).
//!
//! The compile benchmarks run at that size and at 5,000 nodes' worth of pods (150k pods in 100
//! namespaces, 30 on this node, 1k policies): `policy_compile_150k`.
//!
//! Short runs (2 s per benchmark, 20 samples): `cargo bench --bench policy`;
//! `cargo bench --bench policy -- policy_compile` for the compile benchmarks alone.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use etherparse::PacketBuilder;
use kxdp_control::model::ClusterState;
use kxdp_control::model::ObjectKey;
use kxdp_control::policy::{PolicyChanges, PolicyCompiler};
use kxdp_dataplane::conntrack::{Conntrack, CtConfig};
use kxdp_dataplane::pipeline::{Pipeline, SlotFrames};
use kxdp_dataplane::policy::{Decision, PolicyTables};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::verdict::Verdict;
use kxdp_packet::{Addr, IpProto, LinkType};
use serde_json::{json, Value};

const NAMESPACES: u32 = 20;
const PODS_PER_NS: u32 = 500;
const NODES: u32 = 20;
const POLICIES_PER_NS: u32 = 50;
const APPS: u32 = 25;

/// A cluster's size.
#[derive(Clone, Copy, Debug)]
struct Scale {
    namespaces: u32,
    pods_per_ns: u32,
    nodes: u32,
    policies_per_ns: u32,
}

/// 10k pods in 20 namespaces on 20 nodes (500 on this node), 1k policies.
const SMALL: Scale = Scale {
    namespaces: NAMESPACES,
    pods_per_ns: PODS_PER_NS,
    nodes: NODES,
    policies_per_ns: POLICIES_PER_NS,
};

/// 5,000 nodes' worth of pods: 150k pods in 100 namespaces (30 on this node), 1k policies.
const LARGE: Scale = Scale {
    namespaces: 100,
    pods_per_ns: 1500,
    nodes: 5000,
    policies_per_ns: 10,
};

fn pod_ip(ns: u32, j: u32) -> String {
    pod_ip_at(SMALL, ns, j)
}

fn pod_ip_at(sc: Scale, ns: u32, j: u32) -> String {
    let k = ns * sc.pods_per_ns + j;
    if sc.nodes > 250 {
        let k = k + 1;
        return format!("10.{}.{}.{}", 1 + (k >> 16), (k >> 8) & 255, k & 255);
    }
    format!(
        "10.{}.{}.{}",
        1 + k % sc.nodes,
        (k / sc.nodes) / 250,
        1 + (k / sc.nodes) % 250
    )
}

fn node_of_at(sc: Scale, ns: u32, j: u32) -> u32 {
    (ns * sc.pods_per_ns + j) % sc.nodes
}

fn cluster(relabel: Option<u32>) -> ClusterState {
    cluster_at(SMALL, relabel)
}

fn cluster_at(sc: Scale, relabel: Option<u32>) -> ClusterState {
    let mut docs: Vec<Value> = Vec::new();
    for n in 0..sc.namespaces {
        docs.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": format!("ns-{n}"),
            "labels": {"team": format!("t{}", n % 5), "env": if n % 2 == 0 { "prod" } else { "dev" }}}}));
        for j in 0..sc.pods_per_ns {
            let app = if relabel == Some(n * sc.pods_per_ns + j) {
                "relabelled".to_string()
            } else {
                format!("app-{}", j % APPS)
            };
            docs.push(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"namespace": format!("ns-{n}"), "name": format!("p-{j}"),
                             "labels": {"app": app, "tier": if j % 2 == 0 { "front" } else { "back" }, "version": format!("v{}", j % 3)}},
                "spec": {"nodeName": format!("node-{}", node_of_at(sc, n, j)), "containers": [{"name": "c", "image": "i",
                         "ports": [{"name": "http", "containerPort": 8080 + (j % 3)}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
                "status": {"phase": "Running", "podIP": pod_ip_at(sc, n, j)}}));
        }
        for k in 0..sc.policies_per_ns {
            let app = format!("app-{}", k % APPS);
            let peer_app = format!("app-{}", (k * 7 + 3) % APPS);
            let spec = match k % 6 {
                0 => json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
                1 => json!({"podSelector": {"matchLabels": {"app": app}},
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": peer_app}}}],
                                         "ports": [{"port": 80}, {"port": 8080, "endPort": 8090}]}]}),
                2 => json!({"podSelector": {"matchLabels": {"app": app}},
                            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", k % 5)}},
                                                   "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}}],
                                         "ports": [{"port": "http"}]}]}),
                3 => {
                    json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": [app, peer_app]}]},
                            "policyTypes": ["Egress"],
                            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [format!("10.{}.0.0/16", 1 + k % sc.nodes.min(250))]}}],
                                        "ports": [{"protocol": "TCP", "port": 5432, "endPort": 5440}]},
                                       {"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": "dns"}]}]})
                }
                4 => json!({"podSelector": {"matchLabels": {"app": app}},
                            "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}}],
                                         "ports": [{"protocol": "SCTP", "port": 9000}]},
                                        {"from": [{"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}]}]}),
                _ => {
                    json!({"podSelector": {"matchExpressions": [{"key": "version", "operator": "Exists"}, {"key": "app", "operator": "NotIn", "values": [app]}]},
                            "policyTypes": ["Ingress", "Egress"],
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"version": "v1"}}}], "ports": [{"port": 443}]}],
                            "egress": [{"to": [{"podSelector": {}}, {"namespaceSelector": {"matchLabels": {"env": "prod"}}}]}]})
                }
            };
            docs.push(json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                             "metadata": {"namespace": format!("ns-{n}"), "name": format!("np-{k}")}, "spec": spec}));
        }
    }
    let text: String = docs
        .iter()
        .map(|d| format!("{}\n", serde_json::to_string(d).unwrap()))
        .collect();
    let mut st = ClusterState::new();
    kxdp_control::sources::files::load_str(&text, true, Path::new("bench.json"), &mut st).unwrap();
    st
}

/// `n` ClusterNetworkPolicies of every kind (Admin and Baseline; namespace and pod subjects;
/// Accept, Deny and Pass; namespace, pod and network peers; TCP/UDP/SCTP numbers, ranges and
/// named ports), `priority_of_first` the first one's priority (a change toggles it).
fn cluster_policies(n: u32, priority_of_first: i64) -> String {
    let mut out = String::new();
    for k in 0..n {
        let team = format!("t{}", k % 5);
        let app = format!("app-{}", k % APPS);
        let (tier, spec) = match k % 5 {
            0 => (
                "Admin",
                json!({
                "subject": {"namespaces": {"matchLabels": {"team": team}}},
                "ingress": [
                    {"action": "Deny", "from": [{"namespaces": {"matchLabels": {"env": "dev"}}}],
                     "protocols": [{"tcp": {"destinationPort": {"number": 22}}}]},
                    {"action": "Accept", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": app}}}}]}]}),
            ),
            1 => (
                "Admin",
                json!({
                "subject": {"pods": {"namespaceSelector": {"matchLabels": {"env": "prod"}}, "podSelector": {"matchLabels": {"tier": "front"}}}},
                "egress": [
                    {"action": "Pass", "to": [{"namespaces": {"matchLabels": {"team": team}}}]},
                    {"action": "Accept", "to": [{"networks": ["10.0.0.0/8"]}],
                     "protocols": [{"tcp": {"destinationPort": {"range": {"start": 5432, "end": 5440}}}}]},
                    {"action": "Deny", "to": [{"networks": ["0.0.0.0/0", "::/0"]}],
                     "protocols": [{"udp": {"destinationPort": {"number": 53}}}]}]}),
            ),
            2 => (
                "Baseline",
                json!({
                "subject": {"pods": {"namespaceSelector": {"matchLabels": {"team": team}}, "podSelector": {"matchLabels": {"app": app}}}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {"matchLabels": {"team": team}}}]}]}),
            ),
            3 => (
                "Admin",
                json!({
                "subject": {"namespaces": {}},
                "ingress": [{"action": "Accept", "from": [{"namespaces": {"matchLabels": {"env": "prod"}}}],
                             "protocols": [{"destinationNamedPort": "http"}, {"sctp": {"destinationPort": {"number": 9000}}}]}]}),
            ),
            _ => (
                "Baseline",
                json!({
                "subject": {"namespaces": {"matchLabels": {"env": "dev"}}},
                "egress": [
                    {"action": "Accept", "to": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"tier": "front"}}}}],
                     "protocols": [{"destinationNamedPort": "dns"}]},
                    {"action": "Deny", "to": [{"networks": ["203.0.113.0/24"]}]}]}),
            ),
        };
        let mut spec = spec;
        spec["tier"] = json!(tier);
        spec["priority"] = json!(if k == 0 {
            priority_of_first
        } else {
            (k % 50) as i64
        });
        let doc = json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
                         "metadata": {"name": format!("cnp-{k}")}, "spec": spec});
        out.push_str(&format!("{}\n", serde_json::to_string(&doc).unwrap()));
    }
    out
}

/// `st` with `n` ClusterNetworkPolicies.
fn with_cluster_policies(st: &ClusterState, n: u32, priority_of_first: i64) -> ClusterState {
    let mut st = st.clone();
    kxdp_control::sources::files::load_str(
        &cluster_policies(n, priority_of_first),
        true,
        Path::new("cnp.json"),
        &mut st,
    )
    .unwrap();
    st
}

fn node_addrs() -> Vec<Addr> {
    vec![Addr::from_v4([192, 168, 0, 2])]
}

/// Connection attempts: mostly from or to a local pod, a quarter of them to remote pods, some
/// from outside; ports 80, 8080-8082, 5432, 443, 53/UDP, 9000/SCTP.
fn attempts(n: usize) -> Vec<(Addr, Addr, IpProto, u16)> {
    let mut out = Vec::with_capacity(n);
    let mut x: u64 = 0x1234_5678;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    let ip = |s: String| Addr::from_ip(s.parse().unwrap());
    let local = |r: u32| {
        // Pods with node_of == 0 are on this node (node-0).
        let k = (r % (NAMESPACES * PODS_PER_NS / NODES)) * NODES;
        (k / PODS_PER_NS, k % PODS_PER_NS)
    };
    let ports = [
        (IpProto::TCP, 80),
        (IpProto::TCP, 8080),
        (IpProto::TCP, 8081),
        (IpProto::TCP, 5432),
        (IpProto::TCP, 443),
        (IpProto::UDP, 53),
        (IpProto::SCTP, 9000),
    ];
    while out.len() < n {
        let (p, port) = ports[next() as usize % ports.len()];
        let (ln, lj) = local(next());
        let other = next() % (NAMESPACES * PODS_PER_NS);
        let (on, oj) = (other / PODS_PER_NS, other % PODS_PER_NS);
        let (src, dst) = match next() % 4 {
            0 => (ip(pod_ip(on, oj)), ip(pod_ip(ln, lj))),
            1 => (ip(pod_ip(ln, lj)), ip(pod_ip(on, oj))),
            2 => {
                let (l2n, l2j) = local(next());
                (ip(pod_ip(ln, lj)), ip(pod_ip(l2n, l2j)))
            }
            _ => (
                ip(format!("203.0.113.{}", next() % 256)),
                ip(pod_ip(ln, lj)),
            ),
        };
        out.push((src, dst, p, port));
    }
    out
}

fn frames_for(att: &[(Addr, Addr, IpProto, u16)]) -> Vec<Vec<u8>> {
    att.iter()
        .enumerate()
        .map(|(i, &(s, d, p, port))| {
            let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(
                s.v4_octets(),
                d.v4_octets(),
                64,
            );
            let mut v = Vec::new();
            let sport = 1024 + i as u16;
            match p {
                IpProto::TCP => b
                    .tcp(sport, port, 1, 64240)
                    .syn()
                    .write(&mut v, &[])
                    .unwrap(),
                IpProto::UDP => b.udp(sport, port).write(&mut v, b"q").unwrap(),
                _ => {
                    // SCTP is not in etherparse's builder: a UDP datagram stands in (same path).
                    b.udp(sport, port).write(&mut v, b"q").unwrap()
                }
            }
            v
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let state = cluster(None);
    let mut compiler = PolicyCompiler::new();
    let (tables, problems) = compiler.compile("node-0", &node_addrs(), &state);
    assert!(problems.is_empty(), "{problems:?}");
    eprintln!("policy bench: {:?}", compiler.stats);
    let att = attempts(4096);
    let denied = att
        .iter()
        .filter(|a| tables.judge(&a.0, &a.1, a.2, a.3) != Decision::Allow)
        .count();
    eprintln!("policy bench: {} of {} attempts denied", denied, att.len());

    let mut g = c.benchmark_group("policy");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(att.len() as u64));
    g.bench_function("judge_1k_policies_10k_pods", |b| {
        b.iter(|| {
            let t: &PolicyTables = &tables;
            let mut allowed = 0u32;
            for a in &att {
                allowed += (t.judge(&a.0, &a.1, a.2, a.3) == Decision::Allow) as u32;
            }
            black_box(allowed)
        })
    });

    // The same attempts with 100 ClusterNetworkPolicies besides (most local pods are the
    // subject of several, in both tiers): the walk over a pod's cluster tables.
    let (cnp_tables, problems) = PolicyCompiler::new().compile(
        "node-0",
        &node_addrs(),
        &with_cluster_policies(&state, 100, 10),
    );
    assert!(problems.is_empty(), "{problems:?}");
    let denied = att
        .iter()
        .filter(|a| cnp_tables.judge(&a.0, &a.1, a.2, a.3) != Decision::Allow)
        .count();
    eprintln!(
        "policy bench (100 ClusterNetworkPolicies): {} of {} attempts denied",
        denied,
        att.len()
    );
    g.bench_function("judge_1k_np_100_cnp_10k_pods", |b| {
        b.iter(|| {
            let t: &PolicyTables = &cnp_tables;
            let mut allowed = 0u32;
            for a in &att {
                allowed += (t.judge(&a.0, &a.1, a.2, a.3) == Decision::Allow) as u32;
            }
            black_box(allowed)
        })
    });
    drop(cnp_tables);

    // The pipeline: first packets of pod connections, 64 per batch.
    let mut snap = Snapshot::empty();
    snap.node.addrs = node_addrs();
    snap.cluster_cidrs.insert("10.0.0.0".parse().unwrap(), 8);
    snap.policy = std::sync::Arc::new(tables);
    let frames = frames_for(&att[..64]);
    let cfg = CtConfig {
        max_entries: 4096,
        ..CtConfig::default()
    };
    g.throughput(Throughput::Elements(64));
    g.bench_function("pipeline_new_connection_batch64", |b| {
        b.iter_batched(
            || {
                let ct = Conntrack::new(cfg.clone(), 1);
                let p = Pipeline::new(0, LinkType::Ethernet, 1, &ct);
                let mut f = SlotFrames::new(64, 256);
                for fr in &frames {
                    f.push(fr);
                }
                (ct, p, f, vec![Verdict::default(); 64])
            },
            |(ct, mut p, mut f, mut v)| {
                p.process(&mut f, &mut v, &snap, &ct, 1_000);
                black_box(&v);
                (ct, p)
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("policy_compile");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.bench_function("compile_full_1k_policies_10k_pods", |b| {
        b.iter(|| black_box(PolicyCompiler::new().compile("node-0", &node_addrs(), &state)))
    });
    // One local pod's label toggled between two states: the incremental compiler rebuilds
    // only the pod directions whose inputs changed.
    let relabelled = cluster(Some(0));
    // The changed pod (`Changes::pods` in the control loop): the peer index is updated from it.
    let changed: std::collections::BTreeSet<ObjectKey> = [ObjectKey::new("ns-0", "p-0")].into();
    let changes = PolicyChanges {
        pods: &changed,
        namespaces: false,
        policies: false,
        cluster_policies: false,
    };
    let mut flip = false;
    g.bench_function("recompile_one_label_change", |b| {
        b.iter(|| {
            flip = !flip;
            let st = if flip { &relabelled } else { &state };
            black_box(compiler.compile_changes("node-0", &node_addrs(), st, Some(changes)))
        })
    });
    eprintln!(
        "policy bench: last incremental compile {:?}",
        compiler.stats
    );
    g.finish();

    // 5,000 nodes' worth of pods: 150k pods, 1k policies, 30 pods on this node.
    let large = cluster_at(LARGE, None);
    let large_relabelled = cluster_at(LARGE, Some(0));
    let mut compiler = PolicyCompiler::new();
    let (_, problems) = compiler.compile("node-0", &node_addrs(), &large);
    assert!(problems.is_empty(), "{problems:?}");
    eprintln!("policy bench (150k pods): {:?}", compiler.stats);
    let mut g = c.benchmark_group("policy_compile_150k");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.bench_function("compile_full_1k_policies_150k_pods", |b| {
        b.iter(|| black_box(PolicyCompiler::new().compile("node-0", &node_addrs(), &large)))
    });
    let mut flip = false;
    g.bench_function("recompile_one_label_change_150k_pods", |b| {
        b.iter(|| {
            flip = !flip;
            let st = if flip { &large_relabelled } else { &large };
            black_box(compiler.compile_changes("node-0", &node_addrs(), st, Some(changes)))
        })
    });
    g.finish();

    // The same with 100 ClusterNetworkPolicies: full compile, one pod label change, and one
    // ClusterNetworkPolicy changed (its priority toggled).
    let large_cnp = with_cluster_policies(&large, 100, 10);
    let large_cnp_relabelled = with_cluster_policies(&large_relabelled, 100, 10);
    let large_cnp_changed = with_cluster_policies(&large, 100, 11);
    let mut compiler = PolicyCompiler::new();
    let (t, problems) = compiler.compile("node-0", &node_addrs(), &large_cnp);
    assert!(problems.is_empty(), "{problems:?}");
    let selected = t.pods().iter().filter(|p| p.cluster.is_some()).count();
    eprintln!(
        "policy bench (150k pods, 100 ClusterNetworkPolicies): {:?}, {selected} local pods selected",
        compiler.stats
    );
    let mut g = c.benchmark_group("policy_compile_150k_cnp");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.bench_function("compile_full_1k_np_100_cnp_150k_pods", |b| {
        b.iter(|| black_box(PolicyCompiler::new().compile("node-0", &node_addrs(), &large_cnp)))
    });
    // ClusterNetworkPolicies alone (no NetworkPolicy): what they cost by themselves.
    let cnp_only = with_cluster_policies(
        &cluster_at(
            Scale {
                policies_per_ns: 0,
                ..LARGE
            },
            None,
        ),
        100,
        10,
    );
    g.bench_function("compile_full_100_cnp_no_np_150k_pods", |b| {
        b.iter(|| black_box(PolicyCompiler::new().compile("node-0", &node_addrs(), &cnp_only)))
    });
    drop(cnp_only);
    let mut flip = false;
    g.bench_function("recompile_one_label_change_100_cnp_150k_pods", |b| {
        b.iter(|| {
            flip = !flip;
            let st = if flip {
                &large_cnp_relabelled
            } else {
                &large_cnp
            };
            black_box(compiler.compile_changes("node-0", &node_addrs(), st, Some(changes)))
        })
    });
    let none = std::collections::BTreeSet::new();
    let cnp_changes = PolicyChanges {
        pods: &none,
        namespaces: false,
        policies: false,
        cluster_policies: true,
    };
    let mut flip = false;
    g.bench_function("recompile_one_cnp_change_150k_pods", |b| {
        b.iter(|| {
            flip = !flip;
            let st = if flip { &large_cnp_changed } else { &large_cnp };
            black_box(compiler.compile_changes("node-0", &node_addrs(), st, Some(cnp_changes)))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
