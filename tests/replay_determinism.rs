//! Acceptance: a replay's verdicts (actions and reasons) do not depend on the worker count, also
//! when connections expire by capture time all the way through, because every worker runs on the
//! same capture clock (without it, 43 of these 12,000 verdicts differed between one and two
//! workers, and they differed from run to run).

mod support;

use serde_json::Value;
use support::*;

const VIP: &str = "172.30.4.10";

/// 3,000 pod clients each send UDP datagrams to a ClusterIP at scattered times over 70 s of
/// capture time; unreplied UDP lives 30 s, so whether a later datagram finds its connection
/// depends on the clock its worker and the expiry scan run at.
fn pressure_capture() -> Vec<(u64, Vec<u8>)> {
    let mut packets = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut t = T0_NS;
    for _ in 0..12_000 {
        let client = next() % 3_000;
        let src = format!(
            "10.1.{}.{}:{}",
            client / 200,
            client % 200 + 1,
            20_000 + client % 7
        );
        packets.push((t, udp(&src, &format!("{VIP}:53"), b"q")));
        t += 1_000_000 + next() % 10_000_000; // 1-11 ms apart: ~70 s in all
    }
    packets
}

fn outcome(r: &Replay) -> Vec<(String, String)> {
    r.verdicts
        .iter()
        .map(|v: &Value| {
            (
                v["action"].as_str().unwrap_or("").to_string(),
                v["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn udp_dns_env() -> Env {
    let mut env = Env::new();
    env.add_all(simple_service(
        "dns",
        VIP,
        53,
        5353,
        &[("10.2.0.10", NODE_B), ("10.3.0.10", NODE_C)],
    ));
    // The service is UDP.
    for o in env.objects.iter_mut() {
        if let Some(ports) = o.pointer_mut("/spec/ports") {
            for p in ports.as_array_mut().unwrap() {
                p["protocol"] = "UDP".into();
            }
        }
        if let Some(ports) = o.pointer_mut("/ports") {
            for p in ports.as_array_mut().unwrap() {
                p["protocol"] = "UDP".into();
            }
        }
    }
    env
}

#[test]
fn verdicts_are_identical_for_any_worker_count_as_connections_expire() {
    let env = udp_dns_env();
    let packets = pressure_capture();
    let base = env.replay_args(&packets, &["--workers", "1"]);
    let reference = outcome(&base);
    let hits = base.count_reason("ct-established");
    let new = base.count_reason("service-dnat");
    assert!(
        hits > 1_000 && new > 1_000,
        "the capture exercises both hits and misses ({hits} / {new})"
    );
    for workers in ["1", "2", "4", "2", "4"] {
        let r = env.replay_args(&packets, &["--workers", workers]);
        let got = outcome(&r);
        // The normal case keeps its workers (a full table would run on one).
        assert!(
            r.stderr.contains(&format!("{workers} worker")),
            "--workers {workers}: {}",
            r.stderr
        );
        let differ = got.iter().zip(&reference).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ,
            0,
            "--workers {workers}: {differ} verdicts differ from one worker's \
             (ct-established {} vs {hits})",
            r.count_reason("ct-established")
        );
    }
}

/// The same capture against a table that holds a fraction of its connections (500 entries for
/// ~3,000 live clients): most new connections find the table full, early drop evicts an
/// unassured entry for each of them (or the connection is refused, `conntrack-full`), and which
/// one goes must not depend on how many workers insert at once (without the single-worker
/// fallback, 305 of these 12,000 verdicts differed between one and two workers).
#[test]
fn verdicts_are_identical_for_any_worker_count_at_a_full_table() {
    let mut env = udp_dns_env();
    env.config_extra("conntrack:\n  maxEntries: 500\n");
    let packets = pressure_capture();
    let base = env.replay_args(&packets, &["--workers", "1"]);
    let reference = outcome(&base);
    let hits = base.count_reason("ct-established");
    let new = base.count_reason("service-dnat");
    assert!(
        hits > 500 && new > 5_000,
        "the table is under pressure: hits and evictions ({hits} / {new})"
    );
    for workers in ["2", "4", "2", "4", "1"] {
        let r = env.replay_args(&packets, &["--workers", workers]);
        let got = outcome(&r);
        if workers != "1" {
            assert!(
                r.stderr
                    .contains(&format!("replayed on 1 worker(s) instead of {workers}")),
                "--workers {workers}: {}",
                r.stderr
            );
        }
        let differ = got.iter().zip(&reference).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ,
            0,
            "--workers {workers}: {differ} verdicts differ from one worker's \
             (ct-established {} vs {hits}, service-dnat {} vs {new})",
            r.count_reason("ct-established"),
            r.count_reason("service-dnat"),
        );
    }
}
