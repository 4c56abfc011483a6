//! Per-policy counters as operators read them (`kxdp policy counters`, `/metrics`): the
//! workers' per-rule counts of new connections (`DataplaneStats::policy_counts`, indexed like
//! `PolicyTables::rules`) named by policy, direction and rule.
//!
//! Only the policies that select a pod of this node in the published tables are listed (a
//! deleted policy's counts leave the listing with it), and only rules that counted a connection.
//! Versions of one rule that differ only in what the listing does not name (a
//! ClusterNetworkPolicy's priority changed) are summed.

use std::collections::{BTreeMap, HashSet};

use kxdp_dataplane::policy::{PolicyTables, ISOLATION};
use serde::{Deserialize, Serialize};

/// One policy rule's count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCounterRow {
    /// `NetworkPolicy` or `ClusterNetworkPolicy`.
    pub kind: String,
    /// `namespace/name` (a ClusterNetworkPolicy: its name).
    pub policy: String,
    /// `ingress` or `egress`.
    pub direction: String,
    /// The rule's index in the policy's list for that direction, or `isolation`: a connection
    /// to or from a pod the policy isolates that no rule of any policy allowed.
    pub rule: String,
    /// What the rule did with the connections: `allow` or `deny`.
    pub verdict: String,
    /// New connections it decided, since the daemon started.
    pub connections: u64,
}

/// The rows for `tables` (the published policy tables) and `counts` (per rule index), in
/// policy, direction, rule order.
pub fn rows(tables: &PolicyTables, counts: &[u64]) -> Vec<PolicyCounterRow> {
    let mut live: HashSet<&str> = HashSet::new();
    for p in tables.pods() {
        for names in [&p.ingress_policies, &p.egress_policies] {
            live.extend(names.iter().map(|n| &**n));
        }
        if let Some(c) = &p.cluster {
            live.extend(c.policies.iter().map(|n| &**n));
        }
    }
    let mut sums: BTreeMap<(&str, &str, &str, u32, &str), u64> = BTreeMap::new();
    for (info, &n) in tables.rules.iter().zip(counts) {
        if n == 0 || !live.contains(&*info.policy) {
            continue;
        }
        let key = (
            &*info.policy,
            info.kind(),
            info.direction.as_str(),
            info.index,
            info.verdict(),
        );
        *sums.entry(key).or_default() += n;
    }
    sums.into_iter()
        .map(
            |((policy, kind, direction, index, verdict), connections)| PolicyCounterRow {
                kind: kind.into(),
                policy: policy.into(),
                direction: direction.into(),
                rule: if index == ISOLATION {
                    "isolation".into()
                } else {
                    index.to_string()
                },
                verdict: verdict.into(),
                connections,
            },
        )
        .collect()
}
