//! A SYN flood against a full conntrack table, replayed (`support/flood.rs`): established flows
//! keep every packet, and legitimate connections opened during the flood complete.

#[path = "support/flood.rs"]
mod flood;

use std::sync::Arc;

use kxdp_dataplane::conntrack::CtConfig;
use kxdp_dataplane::replay::{replay, ReplayOptions};

fn run(case: &flood::Case) -> flood::Score {
    let (cap, roles) = flood::capture(case);
    let r = replay(
        Arc::new(flood::snapshot()),
        CtConfig {
            max_entries: case.table,
            ..CtConfig::default()
        },
        &cap,
        &ReplayOptions::default(),
    )
    .expect("a replay in process memory does not fail");
    let s = flood::score(case, &roles, &r);
    eprintln!("{s:?}");
    s
}

/// 1,000 entries, 200 established flows, 100,000 SYNs 10 µs apart, 1,000 legitimate
/// connections answered three flood SYNs later: every established packet passes and at least
/// 95 % of the legitimate connections complete.
#[test]
fn syn_flood_at_a_full_table_spares_established_and_legitimate() {
    let case = flood::Case::reference();
    let s = run(&case);
    assert_eq!(s.setup_dropped, 0, "{s:?}");
    assert_eq!(s.established_pct, 100.0, "{s:?}");
    assert!(s.legit_pct >= 95.0, "{s:?}");
}

/// The same with legitimate connections that stay open.
#[test]
fn syn_flood_open_legit() {
    let case = flood::Case {
        close: false,
        ..flood::Case::reference()
    };
    let s = run(&case);
    assert_eq!(s.setup_dropped, 0, "{s:?}");
}
