//! A SYN flood against a full conntrack table, replayed (`support/flood.rs`): established flows
//! keep every packet, and legitimate connections opened during the flood complete.

#[path = "support/flood.rs"]
mod flood;

use std::sync::Arc;

fn run(case: &flood::Case) -> flood::Score {
    let (s, _) = flood::run(&Arc::new(flood::snapshot()), case);
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

/// The same with legitimate connections that stay open: 200 established flows and 1,000 open
/// connections are more assured connections than 1,000 entries hold. Every one admitted while
/// there is room completes (none loses its SYN_SENT entry to the flood); the rest are refused
/// (`conntrack-full`): the table's size, not early drop, decides.
#[test]
fn syn_flood_with_open_legitimate_connections_fills_the_table_with_them() {
    let case = flood::Case {
        close: false,
        ..flood::Case::reference()
    };
    let s = run(&case);
    assert_eq!(s.setup_dropped, 0, "{s:?}");
    assert_eq!(s.established_pct, 100.0, "{s:?}");
    let room = 100.0 * (case.table - case.established()) as f64 / case.legit as f64;
    assert!(
        (s.legit_pct - room).abs() <= 1.0,
        "{s:?}, room for {room} %"
    );
}
