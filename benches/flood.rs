//! SYN flood against a full conntrack table (`tests/support/flood.rs` builds the captures): for
//! floods of 10k, 100k and 1M SYN/s against tables of 1k, 100k and 1M entries, what happens to
//! - established flows (200, or a fifth of the table if smaller), each sending a data packet and
//!   getting an answer every 10 ms: their delivery (goal: 100%);
//! - 1,000 legitimate new connections spread over the flood (SYN, SYN-ACK 1 ms later, ACK, data
//!   20 ms later; 400 against the 1k table, whose room they and the established flows would
//!   otherwise fill with assured entries by themselves): the share that completes (every one of
//!   its packets forwarded);
//! - the flood itself: drop reasons.
//!
//! Then the reference case (`Case::reference`, also `tests/replay_flood.rs`): 1,000 entries, 200
//! established flows, 100k SYN/s, 1,000 legitimate connections answered three flood SYNs
//! (30 µs) later, each a short exchange that closes (goal: at least 95 % complete).
//!
//! Everything goes through `replay` (the workers' pipeline, shared conntrack, capture clock) with
//! one worker, so the numbers are the same on every run: this is a measurement of behaviour, not of
//! speed. One second of flood per case; `cargo bench --bench flood` (a few minutes in release on
//! a 2-core machine; `-- 1k` runs only the cases whose name contains `1k`, `-- reference` the
//! reference case). `--json` prints one JSON object per case.

#[path = "../tests/support/flood.rs"]
mod flood;

use std::sync::Arc;

use flood::Case;
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::verdict::{Action, Reason};

/// Legitimate connections per case of the matrix.
const LEGIT_MAX: u32 = 1_000;

fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let json = args.iter().any(|a| a == "--json");
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();
    let snap = Arc::new(flood::snapshot());
    if !json {
        println!(
            "{:<22} {:>12} {:>12} {:>10} {:>12} {:>12}  other drops",
            "case", "established", "legit new", "flood ok", "conntrack-full", "ct-invalid"
        );
    }
    let mut cases = Vec::new();
    for rate in [10_000u64, 100_000, 1_000_000] {
        for table in [1_000u32, 100_000, 1_000_000] {
            let case = Case {
                rate,
                table,
                legit: LEGIT_MAX.min(table * 2 / 5),
                handshake_ns: 1_000_000,
                close: false,
            };
            cases.push((
                format!("{}SYN/s-table{}", human(rate), human(table as u64)),
                case,
            ));
        }
    }
    cases.push(("reference".to_string(), Case::reference()));
    for (name, case) in cases {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        run_case(&snap, &name, &case, json);
    }
}

fn run_case(snap: &Arc<Snapshot>, name: &str, case: &Case, json: bool) {
    let (s, r) = flood::run(snap, case);
    assert_eq!(s.setup_dropped, 0, "{name}: setup packets dropped");
    let count = |reason: Reason| r.reasons[reason as usize];
    let others: Vec<String> = Reason::ALL
        .iter()
        .filter(|&&x| x != Reason::ConntrackFull && x != Reason::CtInvalid)
        .filter(|&&x| x.action() == Action::Drop && r.reasons[x as usize] > 0)
        .map(|&x| format!("{}={}", x.as_str(), r.reasons[x as usize]))
        .collect();
    if json {
        println!(
            "{{\"case\":\"{name}\",\"established_delivered_pct\":{:.2},\"legit_completed_pct\":{:.1},\"flood_forwarded_pct\":{:.1},\"conntrack_full\":{},\"ct_invalid\":{},\"conntrack_entries\":{}}}",
            s.established_pct,
            s.legit_pct,
            s.flood_pct,
            count(Reason::ConntrackFull),
            count(Reason::CtInvalid),
            r.conntrack_entries
        );
    } else {
        println!(
            "{:<22} {:>11.2}% {:>11.1}% {:>9.1}% {:>12} {:>12}  {}",
            name,
            s.established_pct,
            s.legit_pct,
            s.flood_pct,
            count(Reason::ConntrackFull),
            count(Reason::CtInvalid),
            if others.is_empty() {
                "-".into()
            } else {
                others.join(" ")
            }
        );
    }
}
