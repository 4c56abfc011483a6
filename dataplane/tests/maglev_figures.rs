//! The Maglev figures of docs/benchmarks.md ("Maglev"): table memory and build time at 30k
//! Services × 10 endpoints and for one Service of 5,000 endpoints, and the share of flows that
//! move when one of N endpoints goes. Prints them; run in release:
//!
//! ```sh
//! cargo test --release -p kxdp-dataplane --test maglev_figures -- --ignored --nocapture
//! ```

use std::time::Instant;

use kxdp_dataplane::maglev::{seed_of, table_size, Maglev, DEFAULT_TABLE_SIZE};
use kxdp_dataplane::snapshot::{Endpoint, EndpointRange};
use kxdp_packet::{Addr, IpProto, PacketMeta};

fn endpoints(service: u32, n: u32) -> Vec<Endpoint> {
    (0..n)
        .map(|i| Endpoint {
            addr: Addr::from_v4((0x0a00_0000 + service * 16 + i).to_be_bytes()),
            port: 8080,
            local: false,
        })
        .collect()
}

fn all(n: u32) -> EndpointRange {
    EndpointRange { start: 0, len: n }
}

/// The share of `flows` 5-tuples whose endpoint changes when endpoint `gone` of `n` goes.
fn moved_share(n: u32, flows: u32) -> (f64, f64) {
    let seed = seed_of("");
    let before_eps = endpoints(0, n);
    let mut after_eps = before_eps.clone();
    after_eps.remove(n as usize / 2);
    let before = Maglev::build(seed, DEFAULT_TABLE_SIZE, &before_eps, &[all(n)]).unwrap();
    let after = Maglev::build(seed, DEFAULT_TABLE_SIZE, &after_eps, &[all(n - 1)]).unwrap();
    let (mut moved, mut moved_others) = (0u32, 0u32);
    let mut meta = PacketMeta {
        proto: IpProto::TCP,
        dport: 80,
        dst: Addr::from_v4([172, 30, 0, 10]),
        ..Default::default()
    };
    for f in 0..flows {
        meta.src = Addr::from_v4((0xc000_0000u32 + f / 50_000).to_be_bytes());
        meta.sport = (1024 + f % 50_000) as u16;
        let b = before_eps[before.pick(all(n), &meta).unwrap()];
        let a = after_eps[after.pick(all(n - 1), &meta).unwrap()];
        if a != b {
            moved += 1;
            if b != before_eps[n as usize / 2] {
                moved_others += 1;
            }
        }
    }
    (
        moved as f64 / flows as f64,
        moved_others as f64 / flows as f64,
    )
}

#[test]
#[ignore]
fn maglev_figures() {
    let seed = seed_of("");
    // 30k Services × 10 endpoints: one table each (the cluster list).
    let pools: Vec<Vec<Endpoint>> = (0..30_000).map(|s| endpoints(s, 10)).collect();
    let t = Instant::now();
    let tables: Vec<Maglev> = pools
        .iter()
        .map(|p| Maglev::build(seed, DEFAULT_TABLE_SIZE, p, &[all(10)]).unwrap())
        .collect();
    let took = t.elapsed();
    let bytes: usize = tables.iter().map(|m| m.bytes()).sum();
    println!(
        "30k Services x 10 endpoints: {} slots each, {:.1} MiB of slots, built in {:.0} ms ({:.1} µs per table)",
        table_size(DEFAULT_TABLE_SIZE, 10).unwrap(),
        bytes as f64 / (1 << 20) as f64,
        took.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e6 / 30_000.0
    );
    println!(
        "  (at a fixed 16381 slots they would be {:.0} MiB)",
        30_000.0 * 16381.0 * 2.0 / (1 << 20) as f64
    );

    // One Service of 5,000 endpoints.
    let big = endpoints(0, 5000);
    for max in [DEFAULT_TABLE_SIZE, 524_287] {
        let t = Instant::now();
        let m = Maglev::build(seed, max, &big, &[all(5000)]).unwrap();
        println!(
            "1 Service x 5000 endpoints, maglevTableSize {max}: {} slots, {:.1} KiB, built in {:.2} ms",
            m.table(all(5000)).unwrap().len(),
            m.bytes() as f64 / 1024.0,
            t.elapsed().as_secs_f64() * 1e3
        );
    }

    // Flows that move when one of N endpoints goes.
    for n in [3, 10, 100, 1000] {
        let (moved, others) = moved_share(n, 1_000_000);
        println!(
            "one of {n} endpoints gone: {:.2} % of 1M flows moved (1/N = {:.2} %), {:.2} % of flows on other endpoints",
            moved * 100.0,
            100.0 / n as f64,
            others * 100.0
        );
    }
}
