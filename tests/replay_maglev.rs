//! Acceptance: Maglev consistent hashing through `kxdp replay`. Each "node" is an independent run
//! (its own process, `nodeName`, random seed and endpoint order), as two nodes behind ECMP or one
//! node restarted without its connection state are: a Maglev Service sends a 5-tuple to the same
//! endpoint in every run; a random one does not.

mod support;

use serde_json::{json, Value};
use support::*;

const VIP: &str = "198.51.100.10";

/// A LoadBalancer Service `web` (VIP 198.51.100.10, externalTrafficPolicy Cluster) with
/// `annotations` and the endpoints 10.2.0.1..=n on node-b and node-c, in two slices; `reverse`
/// lists them the other way round (another node's watch may assemble them in another order).
fn web(annotations: Value, n: u32, skip: Option<u32>, reverse: bool) -> Vec<Value> {
    let mut svc = service_with(
        "web",
        annotations,
        json!({
            "type": "LoadBalancer",
            "clusterIP": "172.30.0.10",
            "clusterIPs": ["172.30.0.10"],
            "ipFamilies": ["IPv4"],
            "externalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]
        }),
    );
    svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": VIP}]}});
    let mut eps: Vec<Value> = (1..=n)
        .filter(|i| Some(*i) != skip)
        .map(|i| {
            let node = if i % 2 == 0 { NODE_B } else { NODE_C };
            endpoint(&format!("10.2.0.{i}"), node)
        })
        .collect();
    if reverse {
        eps.reverse();
    }
    let half = eps.len() / 2;
    let second = eps.split_off(half);
    vec![
        svc,
        endpoint_slice(
            "web",
            "web-a",
            "IPv4",
            json!([sport("http", 8080, "TCP")]),
            eps,
        ),
        endpoint_slice(
            "web",
            "web-b",
            "IPv4",
            json!([sport("http", 8080, "TCP")]),
            second,
        ),
    ]
}

fn maglev() -> Value {
    json!({"service.kxdp.dev/lb-algorithm": "maglev"})
}

/// A node of the test cluster: node-a, or node-b (its own name and random seed).
fn node_env(on_b: bool, config: &str, objects: Vec<Value>) -> Env {
    let mut env = Env::new();
    if on_b {
        env.config = env.config.replace("nodeName: node-a", "nodeName: node-b");
        env.seed = 99;
    }
    env.config_extra(config);
    env.add_all(objects);
    env
}

/// `n` new connections from external clients to the VIP.
fn flows(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            syn(
                &format!("203.0.113.{}:{}", 1 + i % 200, 30000 + i * 7),
                &format!("{VIP}:80"),
            )
        })
        .collect()
}

/// The endpoint each flow reached.
fn backends(env: &Env, packets: &[Vec<u8>]) -> Vec<String> {
    let r = env.replay(packets);
    (0..packets.len())
        .map(|i| {
            r.expect(i, "forward", "service-dnat")["dst"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn differing(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

#[test]
fn maglev_picks_the_same_backend_on_two_nodes() {
    let packets = flows(120);
    let a = backends(
        &node_env(false, "", web(maglev(), 10, None, false)),
        &packets,
    );
    let b = backends(&node_env(true, "", web(maglev(), 10, None, true)), &packets);
    assert_eq!(a, b, "node-a and node-b chose differently");
    // ...and spread the flows over the endpoints.
    let mut seen = a.clone();
    seen.sort();
    seen.dedup();
    assert!(seen.len() >= 8, "{seen:?}");
}

#[test]
fn random_is_the_default_and_differs_between_nodes() {
    let packets = flows(60);
    let a = backends(
        &node_env(false, "", web(json!({}), 10, None, false)),
        &packets,
    );
    let b = backends(
        &node_env(true, "", web(json!({}), 10, None, true)),
        &packets,
    );
    assert!(differing(&a, &b) > 20, "{a:?}\n{b:?}");
    // The annotation's `random` is the same choice.
    let r = backends(
        &node_env(
            true,
            "",
            web(
                json!({"service.kxdp.dev/lb-algorithm": "random"}),
                10,
                None,
                true,
            ),
        ),
        &packets,
    );
    assert!(differing(&a, &r) > 20);
}

#[test]
fn configured_default_seed_and_invalid_annotation() {
    let packets = flows(60);
    let config = "loadBalancing: {algorithm: maglev, maglevSeed: cluster-1}";
    let a = backends(
        &node_env(false, config, web(json!({}), 10, None, false)),
        &packets,
    );
    let b = backends(
        &node_env(true, config, web(json!({}), 10, None, true)),
        &packets,
    );
    assert_eq!(a, b);
    // Another seed, another table.
    let other = "loadBalancing: {algorithm: maglev, maglevSeed: cluster-2}";
    let c = backends(
        &node_env(false, other, web(json!({}), 10, None, false)),
        &packets,
    );
    assert!(differing(&a, &c) > 20, "{a:?}\n{c:?}");
    // An invalid annotation is reported and the configured default (maglev here) applies.
    let bad = json!({"service.kxdp.dev/lb-algorithm": "Maglev"});
    let env = node_env(true, config, web(bad, 10, None, true));
    let r = env.replay(&packets);
    assert!(
        r.stderr.contains(
            "warning: Service demo/web: metadata.annotations[service.kxdp.dev/lb-algorithm]: `Maglev` is not `maglev` or `random`; using the configured default, maglev"
        ),
        "{}",
        r.stderr
    );
    for (i, want) in a.iter().enumerate() {
        assert_eq!(r.expect(i, "forward", "service-dnat")["dst"], want.as_str());
    }
}

#[test]
fn one_endpoint_of_ten_gone_moves_about_a_tenth() {
    let packets = flows(400);
    let before = backends(
        &node_env(false, "", web(maglev(), 10, None, false)),
        &packets,
    );
    let after = backends(
        &node_env(true, "", web(maglev(), 10, Some(4), true)),
        &packets,
    );
    let gone = "10.2.0.4:8080";
    let on_gone = before.iter().filter(|b| *b == gone).count();
    assert!(on_gone > 0);
    assert!(after.iter().all(|b| b != gone));
    let moved = differing(&before, &after);
    let others_moved = moved - on_gone;
    // The flows of the endpoint that went move; of the others, only a few.
    assert!(
        moved as f64 <= packets.len() as f64 * 0.16,
        "{moved} of {} moved ({on_gone} were on the endpoint that went)",
        packets.len()
    );
    assert!(
        others_moved <= packets.len() / 20,
        "{others_moved} others moved"
    );
}

#[test]
fn mid_stream_packets_are_picked_up_on_another_node() {
    // The SYNs reached node-a; ECMP then moves the flows to node-b, which has no state for
    // them: a Maglev Service forwards their next packets to the endpoint node-a chose.
    let syns = flows(40);
    let acks: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            tcp(
                &format!("203.0.113.{}:{}", 1 + i % 200, 30000 + i * 7),
                &format!("{VIP}:80"),
                flags::ACK | flags::PSH,
                1001,
                5001,
                b"GET / HTTP/1.1\r\n\r\n",
            )
        })
        .collect();
    let a = backends(&node_env(false, "", web(maglev(), 10, None, false)), &syns);
    let b = node_env(true, "", web(maglev(), 10, None, true));
    let r = b.replay(&acks);
    for (i, want) in a.iter().enumerate() {
        let v = r.expect(i, "forward", "service-dnat");
        assert_eq!(v["dst"], want.as_str(), "flow {i}");
    }
    // The connection is tracked from there on, as established.
    let mut both = acks.clone();
    both.push(tcp(
        "203.0.113.1:30000",
        &format!("{VIP}:80"),
        flags::ACK,
        1019,
        5001,
        b"",
    ));
    let r = b.replay(&both);
    let v = r.expect(40, "forward", "ct-established");
    assert_eq!(v["dst"], a[0].as_str());
    // A random Service answers them with a RST, as before (no endpoint knows the connection).
    let r = node_env(true, "", web(json!({}), 10, None, true)).replay(&acks[..1]);
    r.expect(0, "reject", "ct-lost");
}
