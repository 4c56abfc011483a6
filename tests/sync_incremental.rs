//! The incremental path equals the full translation: random sequences of Service and
//! EndpointSlice changes (with contested frontends: shared externalIPs, NodePorts clashing with
//! each other and with externalIPs on the node's address), each applied through the control
//! loop's `Store` and `Builder::update`, compared after every step with a full build of the same
//! state. Also: an update copies only the shards it touches.

use std::collections::BTreeSet;
use std::path::Path;

use kxdp_control::model::{ClusterState, Kind, Object, ObjectKey};
use kxdp_control::sources::files::load_str;
use kxdp_control::store::Store;
use kxdp_control::translate::Builder;
use kxdp_control::Config;
use kxdp_dataplane::snapshot::Snapshot;

fn config() -> Config {
    Config::from_yaml_str(
        "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2, \"fd00:1::2\"]\nclusterCIDRs: [10.0.0.0/8, \"fd00::/48\"]\nserviceCIDRs: [172.30.0.0/16]\n",
        Path::new("config.yaml"),
    )
    .unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn object(yaml: &str) -> Object {
    let mut st = ClusterState::new();
    load_str(yaml, false, Path::new("gen.yaml"), &mut st).unwrap();
    if let Some(s) = st.services.into_values().next() {
        return Object::Service(Box::new(s));
    }
    Object::EndpointSlice(Box::new(st.endpoint_slices.into_values().next().unwrap()))
}

fn service(r: &mut Rng, i: u64) -> Object {
    let ns = ["a", "b", "c"][(i % 3) as usize];
    let ty = ["ClusterIP", "NodePort", "LoadBalancer"][r.below(3) as usize];
    let port = [80, 443, 30001][r.below(3) as usize];
    let mut spec = format!(
        "  type: {ty}\n  clusterIP: 172.30.0.{}\n  ports:\n  - {{name: p, port: {port}, targetPort: 8080",
        i + 1
    );
    if ty != "ClusterIP" {
        spec.push_str(&format!(", nodePort: {}", 30000 + r.below(3)));
    }
    spec.push_str("}\n");
    if r.below(2) == 0 {
        spec.push_str("  - {name: q, port: 53, protocol: UDP}\n");
    }
    match r.below(4) {
        0 => spec.push_str("  externalIPs: [203.0.113.1]\n"),
        1 => spec.push_str("  externalIPs: [192.168.0.2]\n"),
        _ => {}
    }
    if ty != "ClusterIP" && r.below(2) == 0 {
        spec.push_str("  externalTrafficPolicy: Local\n");
    }
    if r.below(4) == 0 {
        spec.push_str("  internalTrafficPolicy: Local\n");
    }
    let status = if ty == "LoadBalancer" {
        format!(
            "status:\n  loadBalancer:\n    ingress: [{{ip: 198.51.100.{}}}]\n",
            r.below(3)
        )
    } else {
        String::new()
    };
    // A third of the Services choose Maglev: their tables are part of what must be equal.
    let annotations = if r.below(3) == 0 {
        ", annotations: {service.kxdp.dev/lb-algorithm: maglev}"
    } else {
        ""
    };
    object(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: {ns}{annotations}}}\nspec:\n{spec}{status}"
    ))
}

fn slice(r: &mut Rng, i: u64, k: u64) -> Object {
    let ns = ["a", "b", "c"][(i % 3) as usize];
    let n = r.below(4);
    let mut eps = String::new();
    for j in 0..n {
        let node = if r.below(2) == 0 { "node-a" } else { "node-b" };
        let ready = r.below(5) != 0;
        eps.push_str(&format!(
            "- {{addresses: [10.{i}.{k}.{j}], nodeName: {node}, conditions: {{ready: {ready}, serving: true, terminating: {}}}}}\n",
            !ready
        ));
    }
    if eps.is_empty() {
        eps = "[]\n".into();
        return object(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-{k}, namespace: {ns}, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080}}, {{name: q, port: 53, protocol: UDP}}]\nendpoints: {eps}"
        ));
    }
    object(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-{k}, namespace: {ns}, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{name: p, port: 8080}}, {{name: q, port: 53, protocol: UDP}}]\nendpoints:\n{eps}"
    ))
}

fn same(a: &Snapshot, b: &Snapshot) -> Result<(), String> {
    if a.frontends.len() != b.frontends.len() {
        return Err(format!(
            "{} frontends, full build has {}",
            a.frontends.len(),
            b.frontends.len()
        ));
    }
    for (k, fa) in a.frontends.iter() {
        match b.frontends.get(k) {
            Some(fb) if fb == fa => {}
            Some(fb) => return Err(format!("{k:?}: {fa:?}\n  full build: {fb:?}")),
            None => return Err(format!("{k:?} not in the full build")),
        }
    }
    let ips = |s: &Snapshot| s.cluster_ips.iter().copied().collect::<BTreeSet<_>>();
    if ips(a) != ips(b) {
        return Err("cluster IPs differ".into());
    }
    let ids = |s: &Snapshot| s.service_ports.keys().copied().collect::<BTreeSet<_>>();
    if ids(a) != ids(b) {
        return Err("service port ids differ".into());
    }
    Ok(())
}

#[test]
fn incremental_updates_equal_full_builds() {
    for seed in 1..=6u64 {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut store = Store::new("node-a");
        let now = std::time::SystemTime::now();
        for i in 0..24 {
            store.apply(service(&mut r, i), now);
            for k in 0..r.below(3) {
                store.apply(slice(&mut r, i, k), now);
            }
        }
        let mut inc = Builder::new(config());
        store.changes = Default::default();
        let mut prev = inc.full(&store.state);
        for step in 0..150 {
            let i = r.below(30);
            match r.below(6) {
                0 | 1 => store.apply(service(&mut r, i), now),
                2 => {
                    let k = r.below(3);
                    store.apply(slice(&mut r, i, k), now)
                }
                3 => {
                    let ns = ["a", "b", "c"][(i % 3) as usize];
                    store.delete(Kind::Service, &ObjectKey::new(ns, format!("s{i}")), now)
                }
                4 => {
                    let ns = ["a", "b", "c"][(i % 3) as usize];
                    let k = r.below(3);
                    store.delete(
                        Kind::EndpointSlice,
                        &ObjectKey::new(ns, format!("s{i}-{k}")),
                        now,
                    )
                }
                _ => {
                    // Several at once, as a coalesced batch.
                    for _ in 0..3 {
                        let j = r.below(30);
                        store.apply(service(&mut r, j), now);
                    }
                }
            }
            let changes = std::mem::take(&mut store.changes);
            let snap = inc.update(&store.state, &changes.services);
            let mut full = Builder::new(config());
            let want = full.full(&store.state);
            if let Err(e) = same(&snap, &want) {
                panic!("seed {seed} step {step}: {e}");
            }
            let mut p1: Vec<String> = inc.problems().iter().map(|p| p.to_string()).collect();
            let mut p2: Vec<String> = full.problems().iter().map(|p| p.to_string()).collect();
            p1.sort();
            p2.sort();
            assert_eq!(p1, p2, "seed {seed} step {step}: problems");
            assert_eq!(inc.no_local_endpoints(), full.no_local_endpoints());
            // The previous snapshot is untouched by the update (it may still be published).
            same(&prev, &prev.clone()).unwrap();
            prev = snap;
        }
    }
}

#[test]
fn an_update_copies_only_the_shards_it_touches() {
    let mut st = ClusterState::new();
    let mut yaml = String::new();
    for i in 0..2000 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: n}}\nspec: {{clusterIP: 172.30.{}.{}, ports: [{{port: 80}}]}}\n",
            i / 250,
            i % 250 + 1
        ));
    }
    load_str(&yaml, false, Path::new("s.yaml"), &mut st).unwrap();
    let mut b = Builder::new(config());
    let before = b.full(&st);
    let key = ObjectKey::new("n", "s7");
    let mut svc = st.services[&key].clone();
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    st.services.insert(key.clone(), svc);
    let after = b.update(&st, &BTreeSet::from([key]));
    // One frontend removed, one added: at most two shards copied.
    let shared = after.frontends.shared_shards(&before.frontends);
    assert!(shared >= kxdp_dataplane::snapshot::SHARDS - 2, "{shared}");
    assert_eq!(after.frontends.len(), before.frontends.len());
    assert_eq!(
        after.cluster_ips.len(),
        2000,
        "ClusterIPs kept across the update"
    );
}

/// A change to one Maglev Service's endpoints rebuilds its tables only: the others' are the
/// same allocations as before.
#[test]
fn an_endpoint_change_rebuilds_only_that_services_maglev_tables() {
    let mut st = ClusterState::new();
    let mut yaml = String::new();
    for i in 0..50 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: n, annotations: {{service.kxdp.dev/lb-algorithm: maglev}}}}\nspec: {{clusterIP: 172.30.0.{}, ports: [{{port: 80, targetPort: 8080}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-1, namespace: n, labels: {{kubernetes.io/service-name: s{i}}}}}\naddressType: IPv4\nports: [{{port: 8080}}]\nendpoints: [{{addresses: [10.1.{i}.1]}}, {{addresses: [10.1.{i}.2]}}, {{addresses: [10.1.{i}.3]}}]\n",
            i + 1
        ));
    }
    load_str(&yaml, false, Path::new("s.yaml"), &mut st).unwrap();
    let mut b = Builder::new(config());
    let before = b.full(&st);
    let mut slice_yaml = String::new();
    slice_yaml.push_str("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s7-1, namespace: n, labels: {kubernetes.io/service-name: s7}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.1.7.1]}, {addresses: [10.1.7.2]}]\n");
    load_str(&slice_yaml, false, Path::new("s7.yaml"), &mut st).unwrap();
    let after = b.update(&st, &BTreeSet::from([ObjectKey::new("n", "s7")]));
    let mut kept = 0;
    for (k, fb) in before.frontends.iter() {
        let fa = after.frontends.get(k).unwrap();
        let (mb, ma) = (fb.maglev.as_ref().unwrap(), fa.maglev.as_ref().unwrap());
        if fb.service_port.name.as_ref() == "n/s7" {
            assert_ne!(mb, ma);
            assert_eq!(ma.tables().next().unwrap().0.len, 2);
        } else {
            assert!(std::sync::Arc::ptr_eq(mb, ma), "{k:?} rebuilt");
            kept += 1;
        }
    }
    assert_eq!(kept, 49);
}

/// A Service with many EndpointSlices (read slice by slice and kept, `translate::SliceCache`):
/// random changes to single slices (endpoints moved, shared with other slices, terminating,
/// slices added, deleted, moved to another Service, so that the count crosses
/// `SLICE_CACHE_MIN_SLICES` both ways), to the Service, and full builds in between (which keep
/// the slices read), each compared with a full build by a fresh builder. Half the seeds draw
/// addresses from a small pool (the same endpoint in several slices: the merge is redone), half
/// from a wide one (slices rarely share one: the changed slice is patched into the kept merge).
#[test]
fn per_slice_updates_of_a_many_slice_service_equal_full_builds() {
    fn big_slice(r: &mut Rng, owner: &str, k: u64, pool: u64) -> Object {
        let mut eps = String::new();
        for _ in 0..1 + r.below(20) {
            let node = if r.below(3) == 0 { "node-a" } else { "node-b" };
            let (ready, term) = match r.below(6) {
                0 => (false, true),
                1 => (false, false),
                _ => (true, false),
            };
            eps.push_str(&format!(
                "- {{addresses: [10.9.{}.{}], nodeName: {node}, conditions: {{ready: {ready}, serving: true, terminating: {term}}}}}\n",
                r.below(pool / 40),
                r.below(40)
            ));
        }
        let port = 8080 + r.below(2);
        object(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: big-{k}, namespace: a, labels: {{kubernetes.io/service-name: {owner}}}}}\naddressType: IPv4\nports: [{{name: p, port: {port}}}, {{name: q, port: 53, protocol: UDP}}]\nendpoints:\n{eps}"
        ))
    }
    fn big_service(r: &mut Rng, name: &str, ip: u8) -> Object {
        let local = ["Cluster", "Local"][r.below(2) as usize];
        object(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: a}}\nspec:\n  type: NodePort\n  clusterIP: 172.30.9.{ip}\n  internalTrafficPolicy: {local}\n  ports:\n  - {{name: p, port: 80, nodePort: 3100{ip}}}\n  - {{name: q, port: 53, protocol: UDP}}\n"
        ))
    }
    for seed in 1..=6u64 {
        let mut r = Rng(0x51af_d7ed_558c_cd01 ^ seed);
        // 120 addresses, or 10,000.
        let pool = if seed % 2 == 1 { 120 } else { 10_000 };
        let mut store = Store::new("node-a");
        let now = std::time::SystemTime::now();
        store.apply(big_service(&mut r, "big", 1), now);
        store.apply(big_service(&mut r, "other", 2), now);
        for k in 0..10 {
            store.apply(big_slice(&mut r, "big", k, pool), now);
        }
        let mut inc = Builder::new(config());
        store.changes = Default::default();
        inc.full(&store.state);
        for step in 0..200 {
            let k = r.below(14);
            match r.below(10) {
                0..=5 => store.apply(big_slice(&mut r, "big", k, pool), now),
                6 => store.apply(big_slice(&mut r, "other", k, pool), now),
                7 => store.delete(
                    Kind::EndpointSlice,
                    &ObjectKey::new("a", format!("big-{k}")),
                    now,
                ),
                8 => store.apply(big_service(&mut r, "big", 1), now),
                _ => {
                    // A full build in between (kept slices are checked, not trusted).
                    store.changes.full = true;
                }
            }
            let changes = std::mem::take(&mut store.changes);
            let snap = inc
                .apply(&store.state, &changes, &|| false)
                .expect("never stopped");
            let mut full = Builder::new(config());
            let want = full.full(&store.state);
            if let Err(e) = same(&snap, &want) {
                panic!("seed {seed} step {step}: {e}");
            }
            let p1: Vec<String> = inc.problems().iter().map(|p| p.to_string()).collect();
            let p2: Vec<String> = full.problems().iter().map(|p| p.to_string()).collect();
            assert_eq!(p1, p2, "seed {seed} step {step}: problems");
            assert_eq!(inc.no_local_endpoints(), full.no_local_endpoints());
        }
    }
}
