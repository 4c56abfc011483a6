//! Memory per tracked connection (the goal: at most 128 bytes, both directions and the index
//! included): the process's resident memory grows by the table when it is made (it is
//! preallocated and prefaulted, sized by `maxEntries`) and by nothing more when a million
//! connections fill it. A measurement, not a timed test: ignored by default; run with
//! `cargo test -p kxdp-dataplane --test conntrack_memory -- --ignored --nocapture`.

use kxdp_dataplane::conntrack::{Conntrack, CtConfig, Tuple};
use kxdp_packet::{Addr, Family, IpProto};

/// Resident memory of this process (`VmRSS`), in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Anonymous memory in transparent huge pages (`AnonHugePages`), in bytes.
fn anon_huge_bytes() -> u64 {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    rollup
        .lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

#[test]
#[ignore]
fn resident_bytes_per_connection_at_a_million() {
    const N: u32 = 1 << 20;
    let before = rss_bytes();
    let ct = Conntrack::with_seed(
        CtConfig {
            max_entries: N,
            ..CtConfig::default()
        },
        1,
        1,
    );
    let made = rss_bytes();
    let mut created = 0u32;
    for i in 0..N {
        let [_, a, b, c] = i.to_be_bytes();
        let orig = Tuple {
            src: Addr::from_v4([10, a, b, c]),
            dst: Addr::from_v4([172, 30, 0, 1]),
            sport: 40000,
            dport: 80,
            proto: IpProto::TCP,
            family: Family::V4,
        };
        let reply = Tuple {
            src: Addr::from_v4([10, 128, 0, (i % 250) as u8 + 1]),
            dst: orig.src,
            sport: 8080,
            dport: orig.sport,
            proto: IpProto::TCP,
            family: Family::V4,
        };
        let hint = ct.hash(&orig.pack());
        if ct
            .create(&orig, &reply, 0x02u8, false, 7, 1_000, hint)
            .is_ok()
        {
            created += 1;
        }
    }
    let full = rss_bytes();
    println!(
        "table made: {} bytes ({:.1} per connection of maxEntries {N}); after {created} \
         connections: {} bytes ({:.1} per connection); growth while filling: {} bytes",
        made - before,
        (made - before) as f64 / N as f64,
        full - before,
        (full - before) as f64 / created as f64,
        full.saturating_sub(made),
    );
    println!("in transparent huge pages: {} bytes", anon_huge_bytes());
    assert_eq!(created, N);
    assert_eq!(ct.len(), N);
}
