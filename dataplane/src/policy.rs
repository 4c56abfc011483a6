//! NetworkPolicy as the dataplane sees it: per local pod and direction, one compiled lookup
//! structure, and the judgement of a new connection. No Kubernetes types: `control` resolves
//! selectors, named ports and policy types (`control/src/policy/`) and hands over address
//! ranges with port sets.
//!
//! A connection is judged once, on its first packet, on the pod addresses after Service DNAT:
//!
//! - egress, when the source is a local pod isolated for egress: the destination must be allowed
//!   by one of its egress rules (or be this node);
//! - ingress, when the destination is a local pod isolated for ingress: the source must be
//!   allowed by one of its ingress rules (or be this node; hostNetwork pods are the node).
//!
//! A pod is never denied its own traffic. Both checks apply when both ends are local.
//!
//! The rules of one pod and direction (the union of every policy that selects it) are compiled
//! into [`DirRules`]: the address space (IPv4 as IPv4-mapped IPv6, so both families share one
//! `u128` line) cut into disjoint segments, each naming the port set allowed from/to addresses in
//! it. Pod peers are /32 (/128) segments, ipBlocks with their excepts cut out are wider ones,
//! "any peer" is the whole line. A lookup is one binary search and a scan of a short port list,
//! whatever the number of policies.

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use ahash::RandomState;
use hashbrown::HashMap;
use kxdp_packet::{Addr, IpProto};

/// `PortEntry::proto` of an entry that matches every protocol and port (a rule without `ports`).
pub const ANY_PROTO: IpProto = IpProto(0);

/// Segment value: no rule allows this address.
const NONE: u32 = u32::MAX;

/// One allowed (protocol, port range), and the rule that allows it (index into
/// [`PolicyTables::rules`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortEntry {
    /// IP protocol number, or [`ANY_PROTO`].
    pub proto: IpProto,
    pub lo: u16,
    pub hi: u16,
    pub rule: u32,
}

impl PortEntry {
    /// Every protocol and port (a rule that lists no ports).
    pub fn any(rule: u32) -> PortEntry {
        PortEntry {
            proto: ANY_PROTO,
            lo: 0,
            hi: u16::MAX,
            rule,
        }
    }

    pub fn range(proto: IpProto, lo: u16, hi: u16, rule: u32) -> PortEntry {
        PortEntry {
            proto,
            lo,
            hi,
            rule,
        }
    }

    #[inline]
    pub fn matches(&self, proto: IpProto, port: u16) -> bool {
        (self.proto == ANY_PROTO || self.proto == proto) && self.lo <= port && port <= self.hi
    }
}

/// The compiled rules of one local pod in one direction: disjoint address segments with the port
/// set allowed for each. Immutable; shared (`Arc`) by every pod whose inputs are the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirRules {
    /// Segment starts, ascending; `starts[0] == 0`. Segment `i` is `starts[i]..starts[i + 1]`.
    starts: Box<[u128]>,
    /// Per segment: index into `sets`, or `NONE`.
    seg: Box<[u32]>,
    /// Distinct port sets, each sorted.
    sets: Box<[Box<[PortEntry]>]>,
}

impl DirRules {
    /// Isolated with no rule: nothing is allowed.
    pub fn deny_all() -> DirRules {
        DirRules {
            starts: Box::new([0]),
            seg: Box::new([NONE]),
            sets: Box::new([]),
        }
    }

    /// The port set for an address (empty when nothing is allowed).
    #[inline]
    pub fn ports_for(&self, addr: &Addr) -> &[PortEntry] {
        let a = addr.as_u128();
        // starts[0] == 0, so the partition point is at least 1.
        let i = self.starts.partition_point(|&s| s <= a) - 1;
        match self.seg[i] {
            NONE => &[],
            s => &self.sets[s as usize],
        }
    }

    /// The rule allowing `proto`/`port` to or from `addr`, if any.
    #[inline]
    pub fn lookup(&self, addr: &Addr, proto: IpProto, port: u16) -> Option<u32> {
        self.ports_for(addr)
            .iter()
            .find(|e| e.matches(proto, port))
            .map(|e| e.rule)
    }

    /// The lowest rule index among the entries matching `proto`/`port` for `addr` (cluster
    /// tiers number their rules in evaluation order, so the lowest is the first that applies).
    #[inline]
    pub fn lookup_first(&self, addr: &Addr, proto: IpProto, port: u16) -> Option<u32> {
        self.ports_for(addr)
            .iter()
            .filter(|e| e.matches(proto, port))
            .map(|e| e.rule)
            .min()
    }

    /// Number of segments (for statistics and tests).
    pub fn segments(&self) -> usize {
        self.starts.len()
    }

    /// Whether no address is allowed anything.
    pub fn is_deny_all(&self) -> bool {
        self.seg.iter().all(|&s| s == NONE)
    }
}

/// Builds a [`DirRules`] from overlapping contributions: each an inclusive address range (on the
/// `u128` line) and the port entries it allows. Overlaps are unions.
#[derive(Clone, Debug, Default)]
pub struct DirRulesBuilder {
    ranges: Vec<(u128, u128, u32)>,
    lists: Vec<Vec<PortEntry>>,
    /// Rule numbers are an evaluation order (cluster tiers): an entry an any-protocol entry
    /// covers is kept when its rule comes first.
    ordered: bool,
}

impl DirRulesBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder for a ClusterNetworkPolicy tier: the lowest matching rule decides, so no
    /// entry of a lower rule is merged away (`DirRules::lookup_first`).
    pub fn ordered() -> Self {
        DirRulesBuilder {
            ordered: true,
            ..Self::default()
        }
    }

    /// Allows `entries` for every address in each of `ranges` (inclusive bounds).
    pub fn add(&mut self, ranges: &[(u128, u128)], entries: &[PortEntry]) {
        if ranges.is_empty() || entries.is_empty() {
            return;
        }
        let id = self.lists.len() as u32;
        self.lists.push(entries.to_vec());
        for &(lo, hi) in ranges {
            if lo <= hi {
                self.ranges.push((lo, hi, id));
            }
        }
    }

    /// Allows `entries` for one address.
    pub fn add_addr(&mut self, addr: &Addr, entries: &[PortEntry]) {
        let a = addr.as_u128();
        self.add(&[(a, a)], entries);
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// A sweep over the range boundaries: each elementary segment gets the union of the lists
    /// active over it; equal neighbours merge.
    pub fn build(self) -> DirRules {
        // Events: (point, +1 start / -1 end, list). An end at u128::MAX + 1 never happens.
        let mut events: Vec<(u128, bool, u32)> = Vec::with_capacity(self.ranges.len() * 2);
        for &(lo, hi, id) in &self.ranges {
            events.push((lo, true, id));
            if let Some(end) = hi.checked_add(1) {
                events.push((end, false, id));
            }
        }
        events.sort_unstable();
        let mut starts: Vec<u128> = vec![0];
        let mut seg: Vec<u32> = vec![NONE];
        let mut sets: Vec<Box<[PortEntry]>> = Vec::new();
        let mut interned: std::collections::HashMap<Vec<PortEntry>, u32> =
            std::collections::HashMap::new();
        // Active lists with multiplicity (a list may cover overlapping ranges).
        let mut active: Vec<(u32, u32)> = Vec::new();
        let mut i = 0;
        while i < events.len() {
            let p = events[i].0;
            while i < events.len() && events[i].0 == p {
                let (_, start, id) = events[i];
                match active.iter().position(|&(a, _)| a == id) {
                    Some(k) if start => active[k].1 += 1,
                    Some(k) => {
                        active[k].1 -= 1;
                        if active[k].1 == 0 {
                            active.swap_remove(k);
                        }
                    }
                    None if start => active.push((id, 1)),
                    None => {}
                }
                i += 1;
            }
            let value = if active.is_empty() {
                NONE
            } else {
                let mut set: Vec<PortEntry> = active
                    .iter()
                    .flat_map(|&(id, _)| self.lists[id as usize].iter().copied())
                    .collect();
                normalize(&mut set, self.ordered);
                match interned.get(&set) {
                    Some(&s) => s,
                    None => {
                        let s = sets.len() as u32;
                        sets.push(set.clone().into_boxed_slice());
                        interned.insert(set, s);
                        s
                    }
                }
            };
            if *seg.last().unwrap() == value {
                continue;
            }
            if *starts.last().unwrap() == p {
                *seg.last_mut().unwrap() = value;
                // The previous segment may now equal this one.
                let n = seg.len();
                if n >= 2 && seg[n - 2] == value {
                    seg.pop();
                    starts.pop();
                }
            } else {
                starts.push(p);
                seg.push(value);
            }
        }
        DirRules {
            starts: starts.into_boxed_slice(),
            seg: seg.into_boxed_slice(),
            sets: sets.into_boxed_slice(),
        }
    }
}

/// Sorts a port set and keeps one entry per (protocol, range): the lowest rule index. An entry
/// covered by an any-protocol entry is dropped too (`ordered`: unless its rule comes first).
fn normalize(set: &mut Vec<PortEntry>, ordered: bool) {
    set.sort_unstable();
    set.dedup_by(|b, a| a.proto == b.proto && a.lo == b.lo && a.hi == b.hi);
    if let Some(any) = set.first().copied().filter(|e| e.proto == ANY_PROTO) {
        set.retain(|e| {
            e.proto == ANY_PROTO
                || !(any.lo <= e.lo && e.hi <= any.hi)
                || (ordered && e.rule < any.rule)
        });
    }
}

/// The `u128` range of a prefix (IPv4 as IPv4-mapped IPv6). Host bits are ignored.
pub fn prefix_range(addr: IpAddr, len: u8) -> (u128, u128) {
    let (base, bits) = match addr {
        IpAddr::V4(_) => (Addr::from_ip(addr).as_u128(), 32u32),
        IpAddr::V6(_) => (Addr::from_ip(addr).as_u128(), 128u32),
    };
    let len = (len as u32).min(bits);
    let host = bits - len;
    let hostmask: u128 = if host == 128 {
        u128::MAX
    } else {
        (1u128 << host) - 1
    };
    (base & !hostmask, base | hostmask)
}

/// The IPv4-mapped range `::ffff:0:0/96`: never part of an IPv6 block (an IPv6 `::/0` must not
/// allow IPv4 traffic).
const V4_MAPPED: (u128, u128) = (0xffff_0000_0000, 0xffff_ffff_ffff);

/// An ipBlock as ranges: `cidr` minus every `except` (excepts of the other family are ignored),
/// IPv6 blocks minus the IPv4-mapped range.
pub fn block_ranges(cidr: (IpAddr, u8), except: &[(IpAddr, u8)]) -> Vec<(u128, u128)> {
    let mut out = vec![prefix_range(cidr.0, cidr.1)];
    let mut holes: Vec<(u128, u128)> = except
        .iter()
        .filter(|e| e.0.is_ipv4() == cidr.0.is_ipv4())
        .map(|e| prefix_range(e.0, e.1))
        .collect();
    if cidr.0.is_ipv6() {
        holes.push(V4_MAPPED);
    }
    for (hlo, hhi) in holes {
        let mut next = Vec::with_capacity(out.len() + 1);
        for (lo, hi) in out {
            if hhi < lo || hlo > hi {
                next.push((lo, hi));
                continue;
            }
            if hlo > lo {
                next.push((lo, hlo - 1));
            }
            if hhi < hi {
                next.push((hhi + 1, hi));
            }
        }
        out = next;
    }
    out
}

/// Which way a rule faces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// A ClusterNetworkPolicy tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Before NetworkPolicy.
    Admin,
    /// After NetworkPolicy, for pods no NetworkPolicy isolates.
    Baseline,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        }
    }
}

/// What a ClusterNetworkPolicy rule does with the connections it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Accept,
    Deny,
    /// Skips the rest of the tier (Admin: on to NetworkPolicy).
    Pass,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Accept => "Accept",
            Action::Deny => "Deny",
            Action::Pass => "Pass",
        }
    }
}

/// A ClusterNetworkPolicy rule's place: its tier, its policy's priority and its action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClusterRule {
    pub tier: Tier,
    pub priority: i32,
    pub action: Action,
}

/// [`RuleInfo::index`] of a NetworkPolicy direction's isolation: what denies a connection to or
/// from a pod the policy isolates when no rule of any policy allows it. Never matched by a
/// lookup; counted (against every policy isolating the pod in that direction) and listed.
pub const ISOLATION: u32 = u32::MAX;

/// Where a rule comes from: `namespace/policy` (a ClusterNetworkPolicy: its name), direction,
/// index in the policy's list (or [`ISOLATION`]), and for a ClusterNetworkPolicy its tier,
/// priority and action. A rule's index into [`PolicyTables::rules`] is its identity for the
/// whole run (the compiler never renumbers), so counters kept by that index outlive snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuleInfo {
    pub policy: Arc<str>,
    pub direction: Direction,
    pub index: u32,
    pub cluster: Option<ClusterRule>,
}

impl RuleInfo {
    /// What the connections this rule decides get: `allow` or `deny` (an Admin `Pass` decides
    /// nothing by itself and is never counted).
    pub fn verdict(&self) -> &'static str {
        match self.cluster {
            Some(ClusterRule {
                action: Action::Deny,
                ..
            }) => "deny",
            None if self.index == ISOLATION => "deny",
            _ => "allow",
        }
    }

    /// `NetworkPolicy` or `ClusterNetworkPolicy`.
    pub fn kind(&self) -> &'static str {
        if self.cluster.is_some() {
            "ClusterNetworkPolicy"
        } else {
            "NetworkPolicy"
        }
    }
}

impl fmt::Display for RuleInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cluster {
            None if self.index == ISOLATION => {
                write!(f, "{} {} isolation", self.policy, self.direction.as_str())
            }
            None => write!(
                f,
                "{} {}[{}]",
                self.policy,
                self.direction.as_str(),
                self.index
            ),
            Some(c) => write!(
                f,
                "ClusterNetworkPolicy {} ({} tier, priority {}) {}[{}] {}",
                self.policy,
                c.tier.as_str(),
                c.priority,
                self.direction.as_str(),
                self.index,
                c.action.as_str()
            ),
        }
    }
}

/// One ClusterNetworkPolicy direction compiled: `rules` names, per address, entries whose `rule`
/// is an index into `order` (the policy's rules in order), so the lowest matching index is the
/// rule that decides. Shared by every pod the policy selects; `rules` also by every policy
/// direction with the same content (only `order`, the rules' names and actions, differs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTable {
    pub rules: Arc<DirRules>,
    /// Per rule index: the rule (index into [`PolicyTables::rules`]) and its action.
    pub order: Arc<[(u32, Action)]>,
}

impl ClusterTable {
    /// The first rule matching, and its action.
    #[inline]
    pub fn first(&self, addr: &Addr, proto: IpProto, port: u16) -> Option<(u32, Action)> {
        self.rules
            .lookup_first(addr, proto, port)
            .map(|i| self.order[i as usize])
    }
}

/// One tier of a pod direction: the tables of the policies that select the pod, in evaluation
/// order (priority, then name). The first table with a matching rule decides.
pub type TierTables = Box<[Arc<ClusterTable>]>;

/// The first rule of a tier matching, and its action: one lookup per table until one matches.
#[inline]
fn tier_first(
    tier: &[Arc<ClusterTable>],
    addr: &Addr,
    proto: IpProto,
    port: u16,
) -> Option<(u32, Action)> {
    tier.iter().find_map(|t| t.first(addr, proto, port))
}

/// The ClusterNetworkPolicy tiers selecting a local pod, per direction (empty: no policy of
/// that tier selects it with rules of that direction).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterPod {
    pub admin_ingress: TierTables,
    pub admin_egress: TierTables,
    pub baseline_ingress: TierTables,
    pub baseline_egress: TierTables,
    /// The ClusterNetworkPolicies that select the pod (names, evaluation order), for listings.
    pub policies: Arc<[Arc<str>]>,
}

impl ClusterPod {
    pub fn tier(&self, tier: Tier, dir: Direction) -> &[Arc<ClusterTable>] {
        match (tier, dir) {
            (Tier::Admin, Direction::Ingress) => &self.admin_ingress,
            (Tier::Admin, Direction::Egress) => &self.admin_egress,
            (Tier::Baseline, Direction::Ingress) => &self.baseline_ingress,
            (Tier::Baseline, Direction::Egress) => &self.baseline_egress,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.admin_ingress.is_empty()
            && self.admin_egress.is_empty()
            && self.baseline_ingress.is_empty()
            && self.baseline_egress.is_empty()
    }
}

/// A pod on this node, as policy sees it.
#[derive(Debug, Default)]
pub struct LocalPod {
    /// `namespace/name`.
    pub name: Arc<str>,
    /// `None`: not isolated for ingress (everything in is allowed).
    pub ingress: Option<Arc<DirRules>>,
    /// `None`: not isolated for egress.
    pub egress: Option<Arc<DirRules>>,
    /// The policies that select this pod for ingress / egress (`namespace/name`), for listings.
    pub ingress_policies: Arc<[Arc<str>]>,
    pub egress_policies: Arc<[Arc<str>]>,
    /// The isolation rules ([`ISOLATION`], indices into [`PolicyTables::rules`]) of the
    /// policies that select this pod for ingress / egress: what a denial for want of an
    /// allowing rule is counted against.
    pub ingress_isolation: Arc<[u32]>,
    pub egress_isolation: Arc<[u32]>,
    /// The ClusterNetworkPolicies selecting this pod (`None`: none; the NetworkPolicy
    /// judgement alone, as fast as without them).
    pub cluster: Option<Arc<ClusterPod>>,
}

impl LocalPod {
    /// The pod's NetworkPolicy rules for `dir` (`None`: not isolated that way) and the
    /// isolation rules its denials there are counted against.
    #[inline(always)]
    pub fn dir(&self, dir: Direction) -> (&Option<Arc<DirRules>>, &[u32]) {
        match dir {
            Direction::Ingress => (&self.ingress, &self.ingress_isolation),
            Direction::Egress => (&self.egress, &self.egress_isolation),
        }
    }
}

/// The outcome of judging a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied by the egress isolation of local pod `n` (index into [`PolicyTables::pods`]).
    DenyEgress(u32),
    /// Denied by the ingress isolation of local pod `n`.
    DenyIngress(u32),
}

/// How one side (egress at the source, ingress at the destination) judged a connection; what
/// `kxdp policy trace` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// That end is not a pod on this node: not judged here.
    NotLocal,
    /// A local pod no policy isolates in this direction.
    NotIsolated,
    /// The peer is this node (or a hostNetwork pod on it): always allowed.
    Node,
    /// A pod talking to itself: always allowed.
    SelfTraffic,
    /// Allowed by this rule (index into [`PolicyTables::rules`]): a NetworkPolicy rule or a
    /// ClusterNetworkPolicy Accept.
    Allowed(u32),
    /// Isolated and no rule allows it.
    Denied,
    /// Denied by this ClusterNetworkPolicy rule (Deny, or an Admin Pass that NetworkPolicy
    /// then denied is `Denied`).
    DeniedBy(u32),
}

impl Side {
    /// Whether this side lets the connection through.
    #[inline]
    pub fn allows(self) -> bool {
        !matches!(self, Side::Denied | Side::DeniedBy(_))
    }
}

/// Every local pod's compiled policy, and what the judgement needs about this node.
#[derive(Debug, Default)]
pub struct PolicyTables {
    local: HashMap<Addr, u32, RandomState>,
    pods: Vec<LocalPod>,
    /// This node's addresses, hostNetwork pods' included: always allowed to and from local pods.
    node_addrs: Vec<Addr>,
    /// Every rule a `PortEntry` may name.
    pub rules: Vec<RuleInfo>,
    /// Some local pod is isolated in some direction (else the judgement is skipped).
    any_isolated: bool,
}

impl PolicyTables {
    /// Tables from local pods (each with its addresses), this node's addresses and the rule
    /// names. Later addresses of a pod that another pod already claimed are ignored.
    pub fn new(
        pods: Vec<(LocalPod, Vec<Addr>)>,
        node_addrs: Vec<Addr>,
        rules: Vec<RuleInfo>,
    ) -> PolicyTables {
        let mut t = PolicyTables {
            node_addrs,
            rules,
            ..Default::default()
        };
        for (pod, addrs) in pods {
            let i = t.pods.len() as u32;
            t.any_isolated |=
                pod.ingress.is_some() || pod.egress.is_some() || pod.cluster.is_some();
            for a in addrs {
                t.local.entry(a).or_insert(i);
            }
            t.pods.push(pod);
        }
        t
    }

    pub fn pods(&self) -> &[LocalPod] {
        &self.pods
    }

    /// The local pod with this address.
    #[inline]
    pub fn local_pod(&self, addr: &Addr) -> Option<u32> {
        if self.local.is_empty() {
            return None;
        }
        self.local.get(addr).copied()
    }

    #[inline]
    pub fn is_local_pod(&self, addr: &Addr) -> bool {
        self.local_pod(addr).is_some()
    }

    /// Whether any local pod is isolated (judging can be skipped otherwise).
    #[inline]
    pub fn any_isolated(&self) -> bool {
        self.any_isolated
    }

    #[inline]
    pub fn is_node(&self, addr: &Addr) -> bool {
        self.node_addrs.iter().any(|a| a == addr)
    }

    pub fn node_addrs(&self) -> &[Addr] {
        &self.node_addrs
    }

    /// Judges a new connection from `src` to `dst` (the pod address after DNAT) on `proto` /
    /// `dport` (the target port). Egress is judged first. Without isolated pods the answer is
    /// decided inline (out of line it was a call and 18 instructions per new connection).
    #[inline(always)]
    pub fn judge(&self, src: &Addr, dst: &Addr, proto: IpProto, dport: u16) -> Decision {
        self.judge_counted(src, dst, proto, dport, &mut ())
    }

    /// `judge`, counting in `tally` the rules that decided each side judged: the rule that
    /// allowed or denied it, or, when an isolated pod's rules allow nothing, the isolation of
    /// every policy isolating it in that direction.
    #[inline(always)]
    pub fn judge_counted<T: Tally>(
        &self,
        src: &Addr,
        dst: &Addr,
        proto: IpProto,
        dport: u16,
        tally: &mut T,
    ) -> Decision {
        if !self.any_isolated {
            return Decision::Allow;
        }
        self.judge_isolated(src, dst, proto, dport, tally)
    }

    /// `judge` when some pod is isolated.
    #[inline(never)]
    fn judge_isolated<T: Tally>(
        &self,
        src: &Addr,
        dst: &Addr,
        proto: IpProto,
        dport: u16,
        tally: &mut T,
    ) -> Decision {
        if src == dst {
            return Decision::Allow;
        }
        if let Some(i) = self.local_pod(src) {
            let p = &self.pods[i as usize];
            if !self.pod_side(p, Direction::Egress, dst, proto, dport, tally) {
                return Decision::DenyEgress(i);
            }
        }
        if let Some(i) = self.local_pod(dst) {
            let p = &self.pods[i as usize];
            if !self.pod_side(p, Direction::Ingress, src, proto, dport, tally) {
                return Decision::DenyIngress(i);
            }
        }
        Decision::Allow
    }

    /// Whether local pod `p` lets a new connection with `peer` through in direction `dir`,
    /// counting what decided in `tally`.
    #[inline(always)]
    fn pod_side<T: Tally>(
        &self,
        p: &LocalPod,
        dir: Direction,
        peer: &Addr,
        proto: IpProto,
        port: u16,
        tally: &mut T,
    ) -> bool {
        let (rules, isolation) = p.dir(dir);
        if let Some(c) = &p.cluster {
            let side = self.side(c, rules, dir, peer, proto, port);
            match side {
                Side::Allowed(r) | Side::DeniedBy(r) => tally.rule(r),
                Side::Denied => tally.rules(isolation),
                _ => {}
            }
            return side.allows();
        }
        let Some(r) = rules else {
            return true;
        };
        match r.lookup(peer, proto, port) {
            Some(rule) => tally.rule(rule),
            None if self.is_node(peer) => {}
            None => {
                tally.rules(isolation);
                return false;
            }
        }
        true
    }

    /// One side of a pod that ClusterNetworkPolicies select, in the API's order: the Admin
    /// tier (Accept and Deny final, Pass on to NetworkPolicy), NetworkPolicy (final for an
    /// isolated pod), the Baseline tier (Pass ends it), then allowed. This node is always
    /// allowed, as for NetworkPolicy. `np`: the pod's NetworkPolicy rules for `dir`.
    fn side(
        &self,
        c: &ClusterPod,
        np: &Option<Arc<DirRules>>,
        dir: Direction,
        peer: &Addr,
        proto: IpProto,
        port: u16,
    ) -> Side {
        if self.is_node(peer) {
            return Side::Node;
        }
        match tier_first(c.tier(Tier::Admin, dir), peer, proto, port) {
            Some((r, Action::Accept)) => return Side::Allowed(r),
            Some((r, Action::Deny)) => return Side::DeniedBy(r),
            Some((_, Action::Pass)) | None => {}
        }
        if let Some(r) = np {
            return match r.lookup(peer, proto, port) {
                Some(rule) => Side::Allowed(rule),
                None => Side::Denied,
            };
        }
        match tier_first(c.tier(Tier::Baseline, dir), peer, proto, port) {
            Some((r, Action::Accept)) => return Side::Allowed(r),
            Some((r, Action::Deny)) => return Side::DeniedBy(r),
            Some((_, Action::Pass)) | None => {}
        }
        Side::NotIsolated
    }

    /// Both sides of the judgement, for traces: (egress at the source, ingress at the
    /// destination). `judge` allows exactly when neither side is `Denied` or `DeniedBy`.
    pub fn explain(&self, src: &Addr, dst: &Addr, proto: IpProto, dport: u16) -> (Side, Side) {
        let side = |pod: &Addr, peer: &Addr, dir: Direction| -> Side {
            let Some(i) = self.local_pod(pod) else {
                return Side::NotLocal;
            };
            let p = &self.pods[i as usize];
            let (rules, _) = p.dir(dir);
            if let Some(c) = &p.cluster {
                if src == dst {
                    return Side::SelfTraffic;
                }
                return self.side(c, rules, dir, peer, proto, dport);
            }
            let Some(r) = rules else {
                return Side::NotIsolated;
            };
            if src == dst {
                return Side::SelfTraffic;
            }
            if let Some(rule) = r.lookup(peer, proto, dport) {
                return Side::Allowed(rule);
            }
            if self.is_node(peer) {
                return Side::Node;
            }
            Side::Denied
        };
        (
            side(src, dst, Direction::Egress),
            side(dst, src, Direction::Ingress),
        )
    }
}

/// Where a judgement counts the rules that decided it ([`PolicyTables::judge_counted`]).
pub trait Tally {
    /// Rule `rule` (index into [`PolicyTables::rules`]) decided one side of a connection.
    fn rule(&mut self, rule: u32);
    /// Each of these isolation rules denied one side of a connection.
    fn rules(&mut self, rules: &[u32]) {
        for &r in rules {
            self.rule(r);
        }
    }
}

/// Counting nothing.
impl Tally for () {
    #[inline(always)]
    fn rule(&mut self, _: u32) {}
    #[inline(always)]
    fn rules(&mut self, _: &[u32]) {}
}

/// One worker's new connections per rule, by index into [`PolicyTables::rules`] (stable for
/// the run, so the counts outlive every snapshot). Written by its worker only, read by the
/// control thread (relaxed atomics, loaded and stored rather than added: one writer). It grows
/// when a rule beyond its end is first counted: an allocation per batch of new rules, never
/// per packet.
#[derive(Debug, Default)]
pub struct PolicyCounts {
    cells: Arc<[AtomicU64]>,
    /// Bumped when `cells` is replaced, so a publisher knows to hand the new block over.
    generation: u64,
}

impl PolicyCounts {
    /// The counts so far, indexed by rule.
    pub fn values(&self) -> Vec<u64> {
        self.cells.iter().map(|c| c.load(Relaxed)).collect()
    }

    /// The shared block the counts live in, and its generation.
    pub fn cells(&self) -> (&Arc<[AtomicU64]>, u64) {
        (&self.cells, self.generation)
    }

    /// Adds `other`'s counts to these (replay's sum over workers).
    pub fn add(&mut self, other: &PolicyCounts) {
        for (r, v) in other.values().into_iter().enumerate() {
            if v != 0 {
                self.add_n(r as u32, v);
            }
        }
    }

    #[inline]
    fn add_n(&mut self, rule: u32, n: u64) {
        let r = rule as usize;
        if r >= self.cells.len() {
            self.grow(r + 1);
        }
        let c = &self.cells[r];
        c.store(c.load(Relaxed) + n, Relaxed);
    }

    #[cold]
    fn grow(&mut self, len: usize) {
        let len = len.max(self.cells.len() * 2).max(64);
        self.cells = (0..len)
            .map(|i| AtomicU64::new(self.cells.get(i).map_or(0, |c| c.load(Relaxed))))
            .collect();
        self.generation += 1;
    }
}

/// A copy with counts of its own (a clone must not write into the original's block).
impl Clone for PolicyCounts {
    fn clone(&self) -> Self {
        let mut c = PolicyCounts::default();
        c.add(self);
        c
    }
}

impl Tally for PolicyCounts {
    #[inline]
    fn rule(&mut self, rule: u32) {
        self.add_n(rule, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn a(s: &str) -> Addr {
        Addr::from_ip(ip(s))
    }

    fn cidr(s: &str) -> (IpAddr, u8) {
        let (a, l) = s.split_once('/').unwrap();
        (ip(a), l.parse().unwrap())
    }

    fn block(c: &str, except: &[&str]) -> Vec<(u128, u128)> {
        let ex: Vec<_> = except.iter().map(|e| cidr(e)).collect();
        block_ranges(cidr(c), &ex)
    }

    #[test]
    fn prefix_ranges_both_families() {
        let (lo, hi) = prefix_range(ip("10.1.2.3"), 16);
        assert_eq!(lo, a("10.1.0.0").as_u128());
        assert_eq!(hi, a("10.1.255.255").as_u128());
        let (lo, hi) = prefix_range(ip("0.0.0.0"), 0);
        assert_eq!(
            (lo, hi),
            (a("0.0.0.0").as_u128(), a("255.255.255.255").as_u128())
        );
        let (lo, hi) = prefix_range(ip("::"), 0);
        assert_eq!((lo, hi), (0, u128::MAX));
        let (lo, hi) = prefix_range(ip("fd00::1"), 128);
        assert_eq!(lo, hi);
    }

    #[test]
    fn excepts_cut_holes_and_v6_never_covers_v4() {
        let r = block("172.17.0.0/16", &["172.17.1.0/24", "fd00::/8"]);
        assert_eq!(
            r,
            vec![
                (a("172.17.0.0").as_u128(), a("172.17.0.255").as_u128()),
                (a("172.17.2.0").as_u128(), a("172.17.255.255").as_u128())
            ]
        );
        let r = block("::/0", &[]);
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|&(lo, hi)| {
            let v4 = a("10.0.0.1").as_u128();
            !(lo <= v4 && v4 <= hi)
        }));
        // An except equal to the block leaves nothing.
        assert!(block("10.0.0.0/8", &["10.0.0.0/8"]).is_empty());
        // An except wider than the block too.
        assert!(block("10.1.0.0/16", &["10.0.0.0/8"]).is_empty());
    }

    /// Rule 0: TCP 80 from 10.0.0.0/8 except 10.9.0.0/16; rule 1: anything from 10.9.0.5;
    /// rule 2: UDP 53 from everywhere (IPv4 and IPv6); rule 3: SCTP 80 from fd00::/16 except
    /// fd00:1::/32.
    fn sample() -> DirRules {
        let mut b = DirRulesBuilder::new();
        b.add(
            &block("10.0.0.0/8", &["10.9.0.0/16"]),
            &[PortEntry::range(IpProto::TCP, 80, 80, 0)],
        );
        b.add_addr(&a("10.9.0.5"), &[PortEntry::any(1)]);
        b.add(
            &block("0.0.0.0/0", &[]),
            &[PortEntry::range(IpProto::UDP, 53, 53, 2)],
        );
        b.add(
            &block("::/0", &[]),
            &[PortEntry::range(IpProto::UDP, 53, 53, 2)],
        );
        b.add(
            &block("fd00::/16", &["fd00:1::/32"]),
            &[PortEntry::range(IpProto::SCTP, 80, 80, 3)],
        );
        b.build()
    }

    #[test]
    fn dir_rules_truth_table() {
        let r = sample();
        // (peer, proto, port, expected rule)
        let cases: &[(&str, IpProto, u16, Option<u32>)] = &[
            ("10.1.2.3", IpProto::TCP, 80, Some(0)),
            ("10.1.2.3", IpProto::TCP, 81, None),
            ("10.1.2.3", IpProto::UDP, 80, None),
            ("10.1.2.3", IpProto::SCTP, 80, None),
            ("10.1.2.3", IpProto::UDP, 53, Some(2)),
            ("10.9.0.4", IpProto::TCP, 80, None),
            ("10.9.0.5", IpProto::TCP, 80, Some(1)),
            ("10.9.0.5", IpProto::TCP, 9999, Some(1)),
            ("10.9.0.5", IpProto::ICMP, 0, Some(1)),
            ("10.9.0.6", IpProto::TCP, 80, None),
            ("10.255.255.255", IpProto::TCP, 80, Some(0)),
            ("11.0.0.0", IpProto::TCP, 80, None),
            ("9.255.255.255", IpProto::TCP, 80, None),
            ("203.0.113.7", IpProto::UDP, 53, Some(2)),
            ("2001:db8::1", IpProto::UDP, 53, Some(2)),
            ("fd00::1", IpProto::SCTP, 80, Some(3)),
            ("fd00::1", IpProto::TCP, 80, None),
            ("fd00:1::1", IpProto::SCTP, 80, None),
            ("fd00:2::1", IpProto::SCTP, 80, Some(3)),
            ("fd01::1", IpProto::SCTP, 80, None),
        ];
        for &(peer, proto, port, want) in cases {
            assert_eq!(
                r.lookup(&a(peer), proto, port),
                want,
                "{peer} {proto}/{port}"
            );
        }
        assert!(DirRules::deny_all().is_deny_all());
        assert_eq!(
            DirRules::deny_all().lookup(&a("10.0.0.1"), IpProto::TCP, 80),
            None
        );
        assert!(DirRulesBuilder::new().build().is_deny_all());
    }

    #[test]
    fn adjacent_equal_segments_merge() {
        let mut b = DirRulesBuilder::new();
        let e = [PortEntry::range(IpProto::TCP, 80, 80, 0)];
        for i in 1..=100u32 {
            b.add_addr(&Addr::from_v4((0x0a00_0000 + i).to_be_bytes()), &e);
        }
        let r = b.build();
        // none | 10.0.0.1..=10.0.0.100 | none
        assert_eq!(r.segments(), 3);
        // Overlapping contributions of the same list and a range ending at the top.
        let mut b = DirRulesBuilder::new();
        b.add(&[(5, 10), (8, 20), (30, u128::MAX)], &e);
        let r = b.build();
        assert_eq!(r.segments(), 4);
        let at = |x: u128| r.lookup(&Addr(x.to_be_bytes()), IpProto::TCP, 80);
        assert_eq!(
            [at(4), at(5), at(20), at(21), at(30), at(u128::MAX)],
            [None, Some(0), Some(0), None, Some(0), Some(0)]
        );
    }

    #[test]
    fn port_sets_keep_lowest_rule_and_ranges() {
        let mut b = DirRulesBuilder::new();
        let all = block("0.0.0.0/0", &[]);
        b.add(&all, &[PortEntry::range(IpProto::TCP, 8000, 9000, 5)]);
        b.add(&all, &[PortEntry::range(IpProto::TCP, 8000, 9000, 2)]);
        b.add(&all, &[PortEntry::range(IpProto::TCP, 443, 443, 7)]);
        let r = b.build();
        let p = a("1.2.3.4");
        assert_eq!(r.lookup(&p, IpProto::TCP, 8000), Some(2));
        assert_eq!(r.lookup(&p, IpProto::TCP, 9000), Some(2));
        assert_eq!(r.lookup(&p, IpProto::TCP, 9001), None);
        assert_eq!(r.lookup(&p, IpProto::TCP, 443), Some(7));
        assert_eq!(r.lookup(&p, IpProto::UDP, 443), None);
    }

    /// Cluster tiers: the lowest evaluation index decides, even under a later any-protocol
    /// rule (which a NetworkPolicy port set merges away).
    #[test]
    fn ordered_tiers_keep_the_first_rule() {
        let all = block("0.0.0.0/0", &[]);
        let build = |mut b: DirRulesBuilder| {
            b.add(&all, &[PortEntry::range(IpProto::TCP, 8080, 8080, 0)]);
            b.add(&all, &[PortEntry::any(1)]);
            b.add(&all, &[PortEntry::range(IpProto::TCP, 80, 80, 2)]);
            b.build()
        };
        let p = a("1.2.3.4");
        let t = ClusterTable {
            rules: Arc::new(build(DirRulesBuilder::ordered())),
            order: Arc::new([(7, Action::Accept), (8, Action::Deny), (9, Action::Pass)]),
        };
        assert_eq!(t.first(&p, IpProto::TCP, 8080), Some((7, Action::Accept)));
        assert_eq!(t.first(&p, IpProto::TCP, 80), Some((8, Action::Deny)));
        assert_eq!(t.first(&p, IpProto::UDP, 8080), Some((8, Action::Deny)));
        // Unordered: the any-protocol entry covers the others.
        assert_eq!(
            build(DirRulesBuilder::new()).lookup(&p, IpProto::TCP, 8080),
            Some(1)
        );
    }

    /// A pod with cluster tiers: Admin Accept/Deny final, Pass on to NetworkPolicy, Baseline
    /// only when no NetworkPolicy isolates, the node always allowed.
    #[test]
    fn cluster_sides_in_api_order() {
        let tier = |entries: &[(&str, PortEntry)], order: &[(u32, Action)]| {
            let mut b = DirRulesBuilder::ordered();
            for (peer, e) in entries {
                b.add(&block(peer, &[]), &[*e]);
            }
            Arc::new(ClusterTable {
                rules: Arc::new(b.build()),
                order: order.into(),
            })
        };
        // Admin, two policies: the first 10.9/16 Deny TCP 22, 10.8/16 Pass; the second
        // 10.7/16 Accept, 10.8/16 Deny (never reached: the first passes 10.8/16 on). Baseline:
        // Deny everything on UDP.
        let admin = [
            tier(
                &[
                    ("10.9.0.0/16", PortEntry::range(IpProto::TCP, 22, 22, 0)),
                    ("10.8.0.0/16", PortEntry::any(1)),
                ],
                &[(0, Action::Deny), (1, Action::Pass)],
            ),
            tier(
                &[
                    ("10.7.0.0/16", PortEntry::any(0)),
                    ("10.8.0.0/16", PortEntry::any(1)),
                ],
                &[(2, Action::Accept), (5, Action::Deny)],
            ),
        ];
        let baseline = tier(
            &[("0.0.0.0/0", PortEntry::range(IpProto::UDP, 0, u16::MAX, 0))],
            &[(3, Action::Deny)],
        );
        let cluster = Arc::new(ClusterPod {
            admin_ingress: admin.into(),
            baseline_ingress: [baseline].into(),
            ..Default::default()
        });
        let mut open = pod("ns/open", None, None);
        open.cluster = Some(cluster.clone());
        // The same pod isolated by a NetworkPolicy allowing 10.8.0.1 on TCP.
        let mut isolated = pod(
            "ns/iso",
            Some(rules_from(
                &["10.8.0.1"],
                &[PortEntry::range(IpProto::TCP, 0, u16::MAX, 4)],
            )),
            None,
        );
        isolated.cluster = Some(cluster);
        let t = PolicyTables::new(
            vec![(open, vec![a("10.1.0.1")]), (isolated, vec![a("10.1.0.2")])],
            vec![a("192.168.0.2")],
            vec![],
        );
        assert!(t.any_isolated());
        use Decision::*;
        let cases: &[(&str, &str, IpProto, u16, Decision)] = &[
            ("10.9.0.1", "10.1.0.1", IpProto::TCP, 22, DenyIngress(0)),
            ("10.9.0.1", "10.1.0.1", IpProto::TCP, 23, Allow),
            ("10.9.0.1", "10.1.0.1", IpProto::UDP, 22, DenyIngress(0)),
            ("10.7.0.1", "10.1.0.1", IpProto::UDP, 53, Allow),
            ("10.8.0.1", "10.1.0.1", IpProto::UDP, 53, DenyIngress(0)),
            ("10.8.0.1", "10.1.0.2", IpProto::UDP, 53, DenyIngress(1)),
            ("10.8.0.1", "10.1.0.2", IpProto::TCP, 80, Allow),
            ("10.8.0.2", "10.1.0.2", IpProto::TCP, 80, DenyIngress(1)),
            ("10.7.0.1", "10.1.0.2", IpProto::UDP, 53, Allow),
            ("192.168.0.2", "10.1.0.2", IpProto::UDP, 53, Allow),
            ("10.1.0.2", "10.1.0.2", IpProto::UDP, 53, Allow),
        ];
        for &(s, d, proto, port, want) in cases {
            assert_eq!(
                t.judge(&a(s), &a(d), proto, port),
                want,
                "{s} -> {d} {proto}/{port}"
            );
            let (e, i) = t.explain(&a(s), &a(d), proto, port);
            assert_eq!(
                e.allows() && i.allows(),
                want == Allow,
                "{s} -> {d}: {e:?} {i:?}"
            );
        }
        assert_eq!(
            t.explain(&a("10.9.0.1"), &a("10.1.0.1"), IpProto::TCP, 22)
                .1,
            Side::DeniedBy(0)
        );
        assert_eq!(
            t.explain(&a("10.7.0.1"), &a("10.1.0.1"), IpProto::TCP, 22)
                .1,
            Side::Allowed(2)
        );
    }

    fn pod(name: &str, ingress: Option<DirRules>, egress: Option<DirRules>) -> LocalPod {
        LocalPod {
            name: name.into(),
            ingress: ingress.map(Arc::new),
            egress: egress.map(Arc::new),
            ..Default::default()
        }
    }

    fn rules_from(peers: &[&str], entries: &[PortEntry]) -> DirRules {
        let mut b = DirRulesBuilder::new();
        for p in peers {
            if p.contains('/') {
                b.add(&block(p, &[]), entries);
            } else {
                b.add_addr(&a(p), entries);
            }
        }
        b.build()
    }

    /// Local pods: web (10.1.0.1, ingress: TCP 80 from client; egress: TCP 5432 to db),
    /// db (10.1.0.2, ingress deny-all), open (10.1.0.3, not isolated), client (10.1.0.4, egress
    /// to web only, any port). Remote: 10.2.0.9 (another node's pod). Node: 192.168.0.2.
    fn tables() -> PolicyTables {
        let web_in = rules_from(&["10.1.0.4"], &[PortEntry::range(IpProto::TCP, 80, 80, 0)]);
        let web_out = rules_from(
            &["10.1.0.2"],
            &[PortEntry::range(IpProto::TCP, 5432, 5432, 1)],
        );
        let client_out = rules_from(&["10.1.0.1"], &[PortEntry::any(2)]);
        PolicyTables::new(
            vec![
                (
                    pod("ns/web", Some(web_in), Some(web_out)),
                    vec![a("10.1.0.1")],
                ),
                (
                    pod("ns/db", Some(DirRules::deny_all()), None),
                    vec![a("10.1.0.2")],
                ),
                (pod("ns/open", None, None), vec![a("10.1.0.3")]),
                (
                    pod("ns/client", None, Some(client_out)),
                    vec![a("10.1.0.4")],
                ),
            ],
            vec![a("192.168.0.2")],
            vec![],
        )
    }

    #[test]
    fn judge_truth_table() {
        use Decision::*;
        let t = tables();
        let cases: &[(&str, &str, IpProto, u16, Decision)] = &[
            // client -> web: client egress allows web (any), web ingress allows TCP 80 from client.
            ("10.1.0.4", "10.1.0.1", IpProto::TCP, 80, Allow),
            ("10.1.0.4", "10.1.0.1", IpProto::TCP, 81, DenyIngress(0)),
            ("10.1.0.4", "10.1.0.1", IpProto::UDP, 80, DenyIngress(0)),
            // client -> anything else: egress denied.
            ("10.1.0.4", "10.1.0.3", IpProto::TCP, 80, DenyEgress(3)),
            ("10.1.0.4", "10.2.0.9", IpProto::TCP, 80, DenyEgress(3)),
            // ... but not to this node.
            ("10.1.0.4", "192.168.0.2", IpProto::TCP, 10250, Allow),
            // web -> db: web egress allows 5432, db ingress denies everything.
            ("10.1.0.1", "10.1.0.2", IpProto::TCP, 5432, DenyIngress(1)),
            ("10.1.0.1", "10.1.0.2", IpProto::TCP, 80, DenyEgress(0)),
            // The node reaches every pod.
            ("192.168.0.2", "10.1.0.2", IpProto::TCP, 5432, Allow),
            ("192.168.0.2", "10.1.0.1", IpProto::UDP, 9, Allow),
            // A pod reaches itself.
            ("10.1.0.2", "10.1.0.2", IpProto::TCP, 1, Allow),
            // Remote pods: judged by ingress only.
            ("10.2.0.9", "10.1.0.1", IpProto::TCP, 80, DenyIngress(0)),
            ("10.2.0.9", "10.1.0.3", IpProto::TCP, 80, Allow),
            ("10.1.0.3", "10.2.0.9", IpProto::TCP, 80, Allow),
            // Neither end local.
            ("10.2.0.9", "10.3.0.9", IpProto::TCP, 80, Allow),
        ];
        for &(s, d, proto, port, want) in cases {
            assert_eq!(
                t.judge(&a(s), &a(d), proto, port),
                want,
                "{s} -> {d} {proto}/{port}"
            );
            let (e, i) = t.explain(&a(s), &a(d), proto, port);
            let denied = e == Side::Denied || i == Side::Denied;
            assert_eq!(denied, want != Allow, "{s} -> {d}: explain {e:?} {i:?}");
        }
        assert_eq!(
            t.explain(&a("10.1.0.4"), &a("10.1.0.1"), IpProto::TCP, 80),
            (Side::Allowed(2), Side::Allowed(0))
        );
        assert_eq!(
            t.explain(&a("192.168.0.2"), &a("10.1.0.2"), IpProto::TCP, 80),
            (Side::NotLocal, Side::Node)
        );
        assert_eq!(
            t.explain(&a("10.1.0.3"), &a("10.2.0.9"), IpProto::TCP, 80),
            (Side::NotIsolated, Side::NotLocal)
        );
    }

    #[test]
    fn nothing_isolated_skips_everything() {
        let t = PolicyTables::new(
            vec![(pod("ns/a", None, None), vec![a("10.1.0.1")])],
            vec![],
            vec![],
        );
        assert!(!t.any_isolated());
        assert!(t.is_local_pod(&a("10.1.0.1")));
        assert_eq!(
            t.judge(&a("1.1.1.1"), &a("10.1.0.1"), IpProto::TCP, 1),
            Decision::Allow
        );
        let empty = PolicyTables::default();
        assert!(!empty.is_local_pod(&a("10.1.0.1")));
    }

    #[test]
    fn judgements_are_counted_per_rule() {
        let mut t = tables();
        // Isolation rules (ids 10 and 11) for db's ingress, 12 for client's egress.
        t.pods[1].ingress_isolation = Arc::from([10, 11]);
        t.pods[3].egress_isolation = Arc::from([12]);
        let mut c = PolicyCounts::default();
        let judge = |t: &PolicyTables, c: &mut PolicyCounts, s: &str, d: &str, port: u16| {
            t.judge_counted(&a(s), &a(d), IpProto::TCP, port, c)
        };
        // client -> web:80: client's egress rule 2 and web's ingress rule 0 allow it.
        assert_eq!(
            judge(&t, &mut c, "10.1.0.4", "10.1.0.1", 80),
            Decision::Allow
        );
        // A remote pod -> db: db's isolation denies it, counted against both policies.
        for _ in 0..2 {
            let d = judge(&t, &mut c, "10.2.0.9", "10.1.0.2", 1);
            assert_eq!(d, Decision::DenyIngress(1));
        }
        // client -> a remote pod: client's egress isolation.
        assert_eq!(
            judge(&t, &mut c, "10.1.0.4", "10.2.0.9", 1),
            Decision::DenyEgress(3)
        );
        // The node and unisolated pods count nothing.
        judge(&t, &mut c, "192.168.0.2", "10.1.0.2", 1);
        judge(&t, &mut c, "10.2.0.9", "10.1.0.3", 1);
        let mut want = [0u64; 13];
        want[0] = 1;
        want[2] = 1;
        want[10] = 2;
        want[11] = 2;
        want[12] = 1;
        assert_eq!(c.values()[..13], want[..]);
        // A clone counts on its own; `judge` counts nothing.
        let mut copy = c.clone();
        copy.rule(0);
        t.judge(&a("10.1.0.4"), &a("10.1.0.1"), IpProto::TCP, 80);
        assert_eq!(c.values()[0], 1);
        assert_eq!(copy.values()[0], 2);
    }
}
