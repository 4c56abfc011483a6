//! The immutable tables a worker reads: everything the control plane decided, precomputed so that a
//! new connection costs one frontend lookup, one source classification and one random index.
//!
//! Nothing here knows Kubernetes types: `control` translates cluster state into a `Snapshot` (a pure
//! function, unit-tested without a cluster) and publishes it; workers pick the new one up between
//! batches. Snapshots are never mutated after publication.

use std::sync::Arc;

use ahash::RandomState;
use std::hash::Hash;

pub use crate::endpoint::{Endpoint, EndpointRange};
use crate::maglev::Maglev;
use hashbrown::HashTable;
use kxdp_kernel::huge::HugeSlice;
use kxdp_packet::{Addr, Family, IpProto};

/// What a frontend is reached as. Decides nothing by itself (the routes do); it names the rule in
/// listings and verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrontendKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl FrontendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "ClusterIP",
            FrontendKind::NodePort => "NodePort",
            FrontendKind::ExternalIp => "ExternalIP",
            FrontendKind::LoadBalancer => "LoadBalancer",
        }
    }

    /// External destinations (NodePort, LoadBalancer, externalIPs) follow externalTrafficPolicy.
    pub fn is_external(self) -> bool {
        !matches!(self, FrontendKind::ClusterIp)
    }
}

/// The key of the frontend table: a destination a client may address. NodePorts are expanded to one
/// key per node address that accepts them (few addresses, so one exact lookup covers every kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrontendKey {
    pub addr: Addr,
    pub port: u16,
    pub proto: IpProto,
}

/// Where a new connection's source sits, in the order kube-proxy tests it: a source inside
/// `clusterCIDRs` is a pod; otherwise one of this node's addresses is the node; anything else is
/// external.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SourceClass {
    Pod = 0,
    Node = 1,
    External = 2,
}

impl SourceClass {
    pub const ALL: [SourceClass; 3] = [SourceClass::Pod, SourceClass::Node, SourceClass::External];
}

/// What happens to a new connection when its route has no endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EmptyAction {
    /// The Service has no usable endpoint anywhere: answer with TCP RST / ICMP port unreachable
    /// (reason `no-endpoints`).
    #[default]
    Reject,
    /// Endpoints exist, but none this traffic may use (Local policy, none on this node): drop
    /// (reason `no-local-endpoints`).
    Drop,
}

/// The decision for new connections of one source class to one frontend, precomputed at
/// translation time from the traffic policies, topology and endpoint conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Route {
    /// The endpoints to choose from: uniformly at random, or by the frontend's Maglev table of
    /// this list (`Frontend::maglev`), unless session affinity has chosen.
    pub endpoints: EndpointRange,
    /// Source-NAT the connection to this node's address of the packet's family.
    pub masquerade: bool,
    /// What to do when `endpoints` is empty.
    pub when_empty: EmptyAction,
}

/// One frontend: a (destination address, port, protocol) a Service answers on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// The Service port (shared by every frontend of it).
    pub service_port: Arc<ServicePortInfo>,
    pub kind: FrontendKind,
    /// Indexed by `SourceClass as usize`; their ranges index `endpoints`.
    pub routes: [Route; 3],
    /// The endpoints the routes choose from (shared by the frontends of one Service port and
    /// family).
    pub endpoints: Arc<[Endpoint]>,
    /// loadBalancerSourceRanges (LoadBalancer frontends only): when present, sources outside are
    /// dropped (reason `source-range`).
    pub source_ranges: Option<Arc<PrefixSet>>,
    /// The Service's `maglev` algorithm: the lookup tables of its route lists (shared by the
    /// frontends of one Service port and family); None: uniform random choice.
    pub maglev: Option<Arc<Maglev>>,
}

impl Frontend {
    /// The endpoints of one of this frontend's routes.
    #[inline]
    pub fn endpoints_of(&self, range: EndpointRange) -> &[Endpoint] {
        &self.endpoints[range.as_range()]
    }
}

/// A Service port: what listings, affinity and conntrack name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortInfo {
    /// `namespace/name:port-name` (`namespace/name` when the port is unnamed), as kube-proxy logs it.
    pub name: Arc<str>,
    /// A stable identifier (hash of namespace, name, port name and protocol): conntrack entries and
    /// affinity records keep it across snapshots.
    pub id: u32,
    pub proto: IpProto,
    /// sessionAffinity ClientIP: seconds a client stays with its endpoint; 0 = no affinity.
    pub affinity_timeout_s: u32,
}

/// Every endpoint (address, target port) a Service port's EndpointSlices list, sorted
/// (`Snapshot::listed_endpoints`).
pub type ListedEndpoints = Arc<[(Addr, u16)]>;

/// A set of IP prefixes of both families, matched linearly: the sets a packet is tested against
/// (cluster CIDRs, service CIDRs, source ranges) hold a handful of prefixes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl PrefixSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `addr/len`; host bits are cleared. Lengths beyond the family's width are clamped.
    pub fn insert(&mut self, addr: std::net::IpAddr, len: u8) {
        match addr {
            std::net::IpAddr::V4(a) => {
                let len = len.min(32) as u32;
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                let net = u32::from(a) & mask;
                if !self.v4.contains(&(net, mask)) {
                    self.v4.push((net, mask));
                }
            }
            std::net::IpAddr::V6(a) => {
                let len = len.min(128) as u32;
                let mask = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                let net = u128::from(a) & mask;
                if !self.v6.contains(&(net, mask)) {
                    self.v6.push((net, mask));
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    #[inline]
    pub fn contains(&self, addr: &Addr, family: Family) -> bool {
        match family {
            Family::V4 => {
                let a = u32::from_be_bytes(addr.v4_octets());
                self.v4.iter().any(|&(net, mask)| a & mask == net)
            }
            Family::V6 => {
                let a = addr.as_u128();
                self.v6.iter().any(|&(net, mask)| a & mask == net)
            }
        }
    }

    /// The prefixes, for listings: (address, prefix length).
    pub fn iter(&self) -> impl Iterator<Item = (std::net::IpAddr, u8)> + '_ {
        let v4 = self
            .v4
            .iter()
            .map(|&(n, m)| (std::net::IpAddr::V4(n.into()), m.count_ones() as u8));
        let v6 = self
            .v6
            .iter()
            .map(|&(n, m)| (std::net::IpAddr::V6(n.into()), m.count_ones() as u8));
        v4.chain(v6)
    }
}

/// Facts about this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The address masqueraded IPv4 traffic leaves with.
    pub snat_v4: Option<Addr>,
    /// The address masqueraded IPv6 traffic leaves with.
    pub snat_v6: Option<Addr>,
    /// Every address of this node: traffic to one of them that is no NodePort is the node's own
    /// (`pass`), and a source among them is the node itself.
    pub addrs: Vec<Addr>,
}

impl NodeInfo {
    #[inline]
    pub fn is_node_addr(&self, addr: &Addr) -> bool {
        self.addrs.iter().any(|a| a == addr)
    }

    #[inline]
    pub fn snat_addr(&self, family: Family) -> Option<Addr> {
        match family {
            Family::V4 => self.snat_v4,
            Family::V6 => self.snat_v6,
        }
    }
}

/// Number of shards of the shared tables. A one-Service update copies the few shards it touches
/// (at 30k Services about 120 frontends each) and shares the rest with the previous snapshot.
pub const SHARDS: usize = 256;

/// The tables' hasher: fixed seeds, so that a key lands in the same shard in every snapshot.
fn table_hasher() -> RandomState {
    RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    )
}

/// A hash map split into `SHARDS` copy-on-write shards: snapshots share unchanged shards, and an
/// update copies only the shards it writes. A lookup is one hash, one shard pointer, one probe.
#[derive(Clone)]
pub struct ShardedMap<K, V> {
    hasher: RandomState,
    shards: Vec<Arc<HashTable<(K, V)>>>,
    len: usize,
}

impl<K, V> Default for ShardedMap<K, V> {
    fn default() -> Self {
        let empty = Arc::new(HashTable::new());
        ShardedMap {
            hasher: table_hasher(),
            shards: vec![empty; SHARDS],
            len: 0,
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for ShardedMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> ShardedMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    fn locate(&self, k: &K) -> (u64, usize) {
        let h = self.hasher.hash_one(k);
        // hashbrown takes the bucket from the low bits and the tag from the top 7: the shard
        // comes from bits in between.
        (h, (h >> 40) as usize % SHARDS)
    }

    #[inline]
    pub fn get(&self, k: &K) -> Option<&V> {
        // An empty map answers without hashing (as hashbrown's own maps do): a node without
        // Services (replay's baseline) otherwise paid two hashes and probes per packet for
        // the frontend and ClusterIP tables.
        if self.len == 0 {
            return None;
        }
        let (h, s) = self.locate(k);
        self.shards[s].find(h, |(x, _)| x == k).map(|(_, v)| v)
    }

    #[inline]
    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// Inserts or replaces; returns the previous value. Copies the shard if it is shared.
    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        let (h, s) = self.locate(&k);
        let hasher = self.hasher.clone();
        let shard = Arc::make_mut(&mut self.shards[s]);
        match shard.entry(h, |(x, _)| *x == k, |(x, _)| hasher.hash_one(x)) {
            hashbrown::hash_table::Entry::Occupied(mut e) => {
                Some(std::mem::replace(&mut e.get_mut().1, v))
            }
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert((k, v));
                self.len += 1;
                None
            }
        }
    }

    /// Removes; returns the value. Copies the shard if it is shared.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let (h, s) = self.locate(k);
        self.shards[s].find(h, |(x, _)| x == k)?;
        let shard = Arc::make_mut(&mut self.shards[s]);
        let e = shard.find_entry(h, |(x, _)| x == k).ok()?;
        let ((_, v), _) = e.remove();
        self.len -= 1;
        Some(v)
    }

    /// A mutable reference to a value (copies the shard if it is shared).
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        let (h, s) = self.locate(k);
        self.shards[s].find(h, |(x, _)| x == k)?;
        Arc::make_mut(&mut self.shards[s])
            .find_mut(h, |(x, _)| x == k)
            .map(|(_, v)| v)
    }
}

impl<K, V> ShardedMap<K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.shards
            .iter()
            .flat_map(|s| s.iter().map(|(k, v)| (k, v)))
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// How many shards `other` shares with `self` (tests, benchmarks).
    pub fn shared_shards(&self, other: &Self) -> usize {
        self.shards
            .iter()
            .zip(&other.shards)
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count()
    }
}

/// What a new connection reads of a frontend, in one cache line: the key, the Service port's id,
/// the three routes (their endpoint ranges, masquerade and empty-route flags) and the endpoint
/// list. The rest (the Service port record, the affinity timeout, source ranges) is in the
/// frontend's cold half (`FrontendCold`), read only when a flag says it matters.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct FrontendHot {
    addr: Addr,
    port: u16,
    proto: IpProto,
    /// `HOT_MASQ << route`, `HOT_DROP << route`, `HOT_SOURCE_RANGES`, `HOT_AFFINITY`.
    flags: u8,
    service_id: u32,
    ranges: [EndpointRange; 3],
    /// A copy of the frontend's endpoints in the huge-page arena (`Frontend::endpoints`, in
    /// the cold part, is the heap's).
    endpoints: HugeSlice<Endpoint>,
}

const HOT_MASQ: u8 = 1;
const HOT_DROP: u8 = 1 << 3;
const HOT_SOURCE_RANGES: u8 = 1 << 6;
const HOT_AFFINITY: u8 = 1 << 7;
/// The flags byte is full: a Maglev frontend is marked by the top bit of its first route's
/// `start` in the hot line (an endpoint list never has 2^31 entries, `Snapshot::validate`).
const RANGE_MAGLEV: u32 = 1 << 31;

const _: () = assert!(std::mem::size_of::<Option<FrontendHot>>() == 64);

/// The rest of a frontend's table entry: the whole `Frontend` (listings, `get`), its key and
/// hash, and the affinity timeout.
#[derive(Clone, Debug)]
struct FrontendCold {
    key: FrontendKey,
    /// `FrontendTable::hash(&key)`, for moving the entry when its shard grows or shrinks.
    hash: u64,
    affinity_timeout_s: u32,
    frontend: Frontend,
}

impl FrontendCold {
    /// The frontend of a record taken out of the table (copied if a snapshot still shares it).
    fn into_frontend(cold: Arc<FrontendCold>) -> Frontend {
        Arc::try_unwrap(cold).map_or_else(|c| c.frontend.clone(), |c| c.frontend)
    }
}

impl FrontendHot {
    fn of(key: &FrontendKey, fe: &Frontend) -> FrontendHot {
        let mut flags = 0;
        for (i, r) in fe.routes.iter().enumerate() {
            if r.masquerade {
                flags |= HOT_MASQ << i;
            }
            if r.when_empty == EmptyAction::Drop {
                flags |= HOT_DROP << i;
            }
        }
        if fe.source_ranges.is_some() {
            flags |= HOT_SOURCE_RANGES;
        }
        if fe.service_port.affinity_timeout_s > 0 {
            flags |= HOT_AFFINITY;
        }
        FrontendHot {
            addr: key.addr,
            port: key.port,
            proto: key.proto,
            flags,
            service_id: fe.service_port.id,
            ranges: {
                let mut r = fe.routes.map(|r| r.endpoints);
                if fe.maglev.is_some() {
                    r[0].start |= RANGE_MAGLEV;
                }
                r
            },
            endpoints: HugeSlice::from_slice(&fe.endpoints),
        }
    }

    #[inline(always)]
    fn is(&self, key: &FrontendKey) -> bool {
        self.addr == key.addr && self.port == key.port && self.proto == key.proto
    }
}

/// A frontend found in the table (`FrontendTable::find`): what a new connection reads comes from
/// its hot line; `frontend()`, the affinity timeout and the source ranges from the cold part, a
/// separate line read only when asked.
#[derive(Clone, Copy, Debug)]
pub struct FrontendRef<'a> {
    hot: &'a FrontendHot,
    /// The slot, not the record: a lookup that does not need the cold part does not load it.
    cold: &'a Option<Arc<FrontendCold>>,
}

impl<'a> FrontendRef<'a> {
    /// The Service port's stable id.
    #[inline]
    pub fn service_id(&self) -> u32 {
        self.hot.service_id
    }

    /// The route of source class `class`.
    #[inline]
    pub fn route(&self, class: SourceClass) -> Route {
        let i = class as usize;
        let mut endpoints = self.hot.ranges[i];
        endpoints.start &= !RANGE_MAGLEV;
        Route {
            endpoints,
            masquerade: self.hot.flags & (HOT_MASQ << i) != 0,
            when_empty: if self.hot.flags & (HOT_DROP << i) != 0 {
                EmptyAction::Drop
            } else {
                EmptyAction::Reject
            },
        }
    }

    /// Every endpoint of the frontend (routes are ranges of it).
    #[inline]
    pub fn endpoints(&self) -> &'a [Endpoint] {
        &self.hot.endpoints
    }

    /// The endpoints of one of this frontend's routes.
    #[inline]
    pub fn endpoints_of(&self, range: EndpointRange) -> &'a [Endpoint] {
        &self.hot.endpoints[range.as_range()]
    }

    /// The frontend's Maglev tables, when its Service chose Maglev (read from the cold part,
    /// only then).
    #[inline]
    pub fn maglev(&self) -> Option<&'a Maglev> {
        if self.hot.ranges[0].start & RANGE_MAGLEV == 0 {
            return None;
        }
        self.cold
            .as_deref()
            .and_then(|c| c.frontend.maglev.as_deref())
    }

    /// Whether the Service port has session affinity (then `affinity_timeout_s` is not 0).
    #[inline]
    pub fn has_affinity(&self) -> bool {
        self.hot.flags & HOT_AFFINITY != 0
    }

    /// sessionAffinity ClientIP's timeout in seconds; 0 = no affinity.
    #[inline]
    pub fn affinity_timeout_s(&self) -> u32 {
        if !self.has_affinity() {
            return 0;
        }
        self.cold.as_ref().map_or(0, |c| c.affinity_timeout_s)
    }

    /// loadBalancerSourceRanges, when the frontend has them.
    #[inline]
    pub fn source_ranges(&self) -> Option<&'a PrefixSet> {
        if self.hot.flags & HOT_SOURCE_RANGES == 0 {
            return None;
        }
        self.cold
            .as_deref()
            .and_then(|c| c.frontend.source_ranges.as_deref())
    }

    /// The whole frontend.
    #[inline]
    pub fn frontend(&self) -> Option<&'a Frontend> {
        self.cold.as_deref().map(|c| &c.frontend)
    }
}

/// The smallest non-empty shard (slots).
const FRONTEND_SHARD_MIN: usize = 8;
/// A shard has at least this many slots per entry (it grows past a quarter full, and shrinks
/// below a sixteenth). Kept half full, a quarter of the lookups at 30k Services
/// went past their home slot and the probe's branch was mispredicted 0.41 times per new
/// connection, against none at 100 Services (callgrind's branch simulation): 30k Services cost
/// a new connection 1.12x what 100 do (the target: at most 1.1x).
const FRONTEND_SLOTS_PER_ENTRY: usize = 4;

/// One shard of the frontend table: two arrays of the same length, slot `i` of each holding the
/// two halves of one entry. The hot half is in the huge-page arena (`HugeSlice`), where the
/// endpoint lists are too: what a new connection reads at 30k Services then spans a few 2 MiB
/// pages instead of thousands of 4 KiB ones.
#[derive(Clone)]
struct FrontendShard {
    hot: HugeSlice<Option<FrontendHot>>,
    /// Shared records rather than the records themselves: a quarter-full shard's empty slots
    /// then cost 8 bytes each here (at 30k Services, 10 MB less than inline `FrontendCold`s).
    cold: Arc<[Option<Arc<FrontendCold>>]>,
}

impl FrontendShard {
    fn empty() -> FrontendShard {
        FrontendShard {
            hot: HugeSlice::new(),
            cold: Arc::from(Vec::new()),
        }
    }

    /// The slot holding `key`, probing from `hash`'s home.
    #[inline]
    fn position(&self, hash: u64, key: &FrontendKey) -> Option<usize> {
        if self.hot.is_empty() {
            return None;
        }
        let mask = self.hot.len() - 1;
        let mut i = hash as usize & mask;
        // A shard is at most a quarter full: the probe meets an empty slot.
        loop {
            match &self.hot[i] {
                None => return None,
                Some(h) if h.is(key) => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// This shard's entries in new arrays of `cap` slots (a power of two, at least
    /// `FRONTEND_SLOTS_PER_ENTRY` times as many).
    fn rebuilt(&self, cap: usize) -> FrontendShard {
        let mut hot: Vec<Option<FrontendHot>> = vec![None; cap];
        let mut cold: Vec<Option<Arc<FrontendCold>>> = vec![None; cap];
        let mask = cap - 1;
        for (h, c) in self.hot.iter().zip(self.cold.iter()) {
            if let (Some(h), Some(c)) = (h, c) {
                let mut i = c.hash as usize & mask;
                while hot[i].is_some() {
                    i = (i + 1) & mask;
                }
                hot[i] = Some(h.clone());
                cold[i] = Some(c.clone());
            }
        }
        FrontendShard {
            hot: HugeSlice::from_vec(hot),
            cold: Arc::from(cold),
        }
    }
}

/// The frontend table: `SHARDS` copy-on-write shards as `ShardedMap` has (an update copies the
/// shards it writes), but each shard is an open-addressing array with linear probing, kept at
/// most a quarter full, instead of a hashbrown table: a lookup reads the 64-byte slot its hash
/// names (rarely the next) and nothing else: no separate control bytes, no Service port record, and
/// the pipeline can prefetch that slot a stage before it looks (`prefetch`, `find`). What a new
/// connection does not need lives in a parallel array (`FrontendCold`), so the lines a lookup
/// touches are dense: at 30k Services 128k slots are 8 MB instead of 16 (beyond the caches either
/// way, but half the pages: the TLB's reach matters as much as the cache's there).
#[derive(Clone)]
pub struct FrontendTable {
    shards: Vec<FrontendShard>,
    /// Entries per shard.
    lens: Vec<u32>,
    len: usize,
}

impl Default for FrontendTable {
    fn default() -> Self {
        FrontendTable {
            shards: vec![FrontendShard::empty(); SHARDS],
            lens: vec![0; SHARDS],
            len: 0,
        }
    }
}

impl std::fmt::Debug for FrontendTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FrontendTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The hash of a key: fixed seeds (a key lands in the same shard and slot in every
    /// snapshot), two multiply-folds (wyhash's mixer) over the address and the port/protocol.
    #[inline]
    pub fn hash(key: &FrontendKey) -> u64 {
        #[inline(always)]
        fn mix(a: u64, b: u64) -> u64 {
            let r = (a as u128).wrapping_mul(b as u128);
            (r as u64) ^ ((r >> 64) as u64)
        }
        let a = u128::from_ne_bytes(key.addr.0);
        let x = mix(
            a as u64 ^ 0x243f_6a88_85a3_08d3,
            (a >> 64) as u64 ^ 0x1319_8a2e_0370_7344,
        );
        let pp = (key.port as u64) << 8 | key.proto.0 as u64;
        mix(x ^ pp ^ 0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89)
    }

    #[inline(always)]
    fn shard_of(hash: u64) -> usize {
        (hash >> 56) as usize % SHARDS
    }

    /// Starts loading the slot a lookup for `hash` begins at, and the next (a probe at half
    /// load often goes one further). A hint: reads nothing.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        let hot = &self.shards[Self::shard_of(hash)].hot;
        if !hot.is_empty() {
            let mask = hot.len() - 1;
            let home = hash as usize & mask;
            kxdp_packet::prefetch::prefetch(&hot[home]);
            kxdp_packet::prefetch::prefetch(&hot[(home + 1) & mask]);
        }
    }

    /// The frontend of `key`, whose hash is `hash` (`FrontendTable::hash`).
    #[inline]
    pub fn find(&self, hash: u64, key: &FrontendKey) -> Option<FrontendRef<'_>> {
        let shard = &self.shards[Self::shard_of(hash)];
        let i = shard.position(hash, key)?;
        Some(FrontendRef {
            hot: shard.hot[i].as_ref()?,
            cold: &shard.cold[i],
        })
    }

    /// The frontend of `key`. An empty table answers without hashing (replay's baseline, a node
    /// without Services, looks up every packet).
    #[inline]
    pub fn lookup(&self, key: &FrontendKey) -> Option<FrontendRef<'_>> {
        if self.len == 0 {
            return None;
        }
        self.find(Self::hash(key), key)
    }

    #[inline]
    pub fn get(&self, key: &FrontendKey) -> Option<&Frontend> {
        self.lookup(key).and_then(|r| r.frontend())
    }

    pub fn contains_key(&self, key: &FrontendKey) -> bool {
        self.lookup(key).is_some()
    }

    /// Inserts or replaces; returns the previous frontend. Copies the shard if it is shared.
    pub fn insert(&mut self, key: FrontendKey, fe: Frontend) -> Option<Frontend> {
        let hash = Self::hash(&key);
        let s = Self::shard_of(hash);
        let hot = FrontendHot::of(&key, &fe);
        let cold = FrontendCold {
            key,
            hash,
            affinity_timeout_s: fe.service_port.affinity_timeout_s,
            frontend: fe,
        };
        if let Some(i) = self.shards[s].position(hash, &key) {
            let shard = &mut self.shards[s];
            shard.hot.make_mut()[i] = Some(hot);
            let old = Arc::make_mut(&mut shard.cold)[i].replace(Arc::new(cold));
            return old.map(FrontendCold::into_frontend);
        }
        let len = self.lens[s] as usize + 1;
        if len * FRONTEND_SLOTS_PER_ENTRY > self.shards[s].hot.len() {
            let cap = (len * FRONTEND_SLOTS_PER_ENTRY)
                .next_power_of_two()
                .max(FRONTEND_SHARD_MIN);
            self.shards[s] = self.shards[s].rebuilt(cap);
        }
        let shard = &mut self.shards[s];
        let hots = shard.hot.make_mut();
        let mask = hots.len() - 1;
        let mut i = hash as usize & mask;
        while hots[i].is_some() {
            i = (i + 1) & mask;
        }
        hots[i] = Some(hot);
        Arc::make_mut(&mut shard.cold)[i] = Some(Arc::new(cold));
        self.lens[s] += 1;
        self.len += 1;
        None
    }

    /// Removes; returns the frontend. Copies the shard if it is shared.
    pub fn remove(&mut self, key: &FrontendKey) -> Option<Frontend> {
        let hash = Self::hash(key);
        let s = Self::shard_of(hash);
        let mut hole = self.shards[s].position(hash, key)?;
        let shard = &mut self.shards[s];
        let hots = shard.hot.make_mut();
        let colds = Arc::make_mut(&mut shard.cold);
        let mask = hots.len() - 1;
        hots[hole] = None;
        let removed = colds[hole].take().map(FrontendCold::into_frontend);
        // Backward-shift deletion: every entry after the hole, up to the next empty slot, that
        // may live at the hole (its home is not between the hole and itself) moves into it, so
        // that no probe stops early and no tombstones accumulate.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(home) = colds[j].as_ref().map(|c| c.hash as usize & mask) else {
                break;
            };
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                hots[hole] = hots[j].take();
                colds[hole] = colds[j].take();
                hole = j;
            }
        }
        self.lens[s] -= 1;
        self.len -= 1;
        let len = self.lens[s] as usize;
        let cap = self.shards[s].hot.len();
        if len == 0 {
            self.shards[s] = FrontendShard::empty();
        } else if len * FRONTEND_SLOTS_PER_ENTRY * 4 < cap && cap > FRONTEND_SHARD_MIN {
            let cap = (len * FRONTEND_SLOTS_PER_ENTRY)
                .next_power_of_two()
                .max(FRONTEND_SHARD_MIN);
            self.shards[s] = self.shards[s].rebuilt(cap);
        }
        removed
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every frontend with its key, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&FrontendKey, &Frontend)> + '_ {
        self.shards
            .iter()
            .flat_map(|s| s.cold.iter().filter_map(|c| c.as_deref()))
            .map(|c| (&c.key, &c.frontend))
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &FrontendKey> + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// Every frontend, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Frontend> + '_ {
        self.iter().map(|(_, f)| f)
    }

    /// How many shards `other` shares with `self` (tests, benchmarks).
    pub fn shared_shards(&self, other: &Self) -> usize {
        self.shards
            .iter()
            .zip(&other.shards)
            .filter(|(a, b)| HugeSlice::ptr_eq(&a.hot, &b.hot) && Arc::ptr_eq(&a.cold, &b.cold))
            .count()
    }
}

/// A set of addresses with the sharing of `ShardedMap`; each holds a count of the owners that
/// put it there (two Services may claim one address in bad input; removing one keeps it).
#[derive(Clone, Debug, Default)]
pub struct AddrSet {
    map: ShardedMap<Addr, u32>,
}

impl AddrSet {
    #[inline]
    pub fn contains(&self, a: &Addr) -> bool {
        self.map.contains_key(a)
    }

    /// Adds one owner of `a`.
    pub fn insert(&mut self, a: Addr) {
        match self.map.get_mut(&a) {
            Some(n) => *n += 1,
            None => {
                self.map.insert(a, 1);
            }
        }
    }

    /// Removes one owner of `a`; the address goes with its last owner.
    pub fn remove(&mut self, a: &Addr) {
        if let Some(n) = self.map.get_mut(a) {
            if *n > 1 {
                *n -= 1;
                return;
            }
        }
        self.map.remove(a);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Addr> + '_ {
        self.map.iter().map(|(a, _)| a)
    }
}

/// Everything a worker needs to decide a new connection. Built by `control`, published whole;
/// consecutive snapshots share the shards, endpoint lists and service port records that did not
/// change.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Increases with every publication; 0 is the empty startup snapshot.
    pub generation: u64,
    pub node: NodeInfo,
    /// Pod address ranges: a source inside is cluster-internal traffic.
    pub cluster_cidrs: PrefixSet,
    /// Service address ranges: a destination inside that no Service owns is dropped.
    pub service_cidrs: PrefixSet,
    /// Every ClusterIP: a packet to one on a port/protocol the Service does not define is rejected.
    pub cluster_ips: AddrSet,
    /// The frontend table: (destination address, port, protocol) → frontend.
    pub frontends: FrontendTable,
    /// Service ports by stable id (conntrack listings, verdicts).
    pub service_ports: ShardedMap<u32, Arc<ServicePortInfo>>,
    /// Per Service port (by stable id): every endpoint its EndpointSlices list, whatever its
    /// conditions (ready, serving, terminating), both families, sorted. A TCP connection whose
    /// endpoint is missing from its Service port's list has lost its backend for good and is
    /// reset (`stale::reconcile`); a terminating endpoint is still listed, so its connections
    /// drain. A Service port with no list here (the Service is gone, or the snapshot was built
    /// without lists) leaves its connections alone.
    pub listed_endpoints: ShardedMap<u32, ListedEndpoints>,
    /// NetworkPolicy: the compiled rules of this node's pods (empty: nothing is isolated).
    pub policy: Arc<crate::policy::PolicyTables>,
}

impl Snapshot {
    /// The startup snapshot: no Services; every packet is either the node's or forwarded as is.
    pub fn empty() -> Self {
        Self::default()
    }

    #[inline]
    pub fn frontend(&self, key: &FrontendKey) -> Option<&Frontend> {
        self.frontends.get(key)
    }

    /// The frontend of `key` as the table holds it (what a new connection reads).
    #[inline]
    pub fn frontend_ref(&self, key: &FrontendKey) -> Option<FrontendRef<'_>> {
        self.frontends.lookup(key)
    }

    /// Adds a frontend (and its service port to `service_ports`); replaces one with that key.
    pub fn insert_frontend(&mut self, key: FrontendKey, fe: Frontend) {
        if !self.service_ports.contains_key(&fe.service_port.id) {
            self.service_ports
                .insert(fe.service_port.id, fe.service_port.clone());
        }
        self.frontends.insert(key, fe);
    }

    #[inline]
    pub fn classify_source(&self, src: &Addr, family: Family) -> SourceClass {
        if self.cluster_cidrs.contains(src, family) {
            SourceClass::Pod
        } else if self.node.is_node_addr(src) {
            SourceClass::Node
        } else {
            SourceClass::External
        }
    }

    /// Whether the EndpointSlices of Service port `service_id` list endpoint `addr`:`port`
    /// (`listed_endpoints`); None when the snapshot has no list for that Service port.
    pub fn endpoint_listed(&self, service_id: u32, addr: &Addr, port: u16) -> Option<bool> {
        let list = self.listed_endpoints.get(&service_id)?;
        Some(list.binary_search(&(*addr, port)).is_ok())
    }

    /// The Service port a conntrack entry or affinity record names, by its stable id.
    pub fn service_port_by_id(&self, id: u32) -> Option<&ServicePortInfo> {
        self.service_ports.get(&id).map(|s| &**s)
    }

    /// Checks internal consistency (ranges in bounds). `control` calls it before publishing, so
    /// a translation bug is an error, not a worker panic.
    pub fn validate(&self) -> Result<(), String> {
        for (key, fe) in self.frontends.iter() {
            if fe.endpoints.len() >= RANGE_MAGLEV as usize {
                return Err(format!("frontend {key:?} has too many endpoints"));
            }
            for r in &fe.routes {
                if r.endpoints.as_range().end > fe.endpoints.len() {
                    return Err(format!(
                        "frontend {key:?} has an endpoint range out of bounds"
                    ));
                }
            }
            if fe.service_port.proto != key.proto {
                return Err(format!(
                    "frontend {key:?} names service port {} of another protocol",
                    fe.service_port.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn frontend(id: u32, affinity: u32) -> Frontend {
        Frontend {
            service_port: Arc::new(ServicePortInfo {
                name: format!("ns/svc-{id}").into(),
                id,
                proto: IpProto::TCP,
                affinity_timeout_s: affinity,
            }),
            kind: FrontendKind::ClusterIp,
            routes: std::array::from_fn(|i| Route {
                endpoints: EndpointRange {
                    start: id % 5,
                    len: i as u32,
                },
                masquerade: (id + i as u32) % 2 == 0,
                when_empty: if (id + i as u32) % 3 == 0 {
                    EmptyAction::Drop
                } else {
                    EmptyAction::Reject
                },
            }),
            endpoints: Arc::from(Vec::new()),
            source_ranges: None,
            maglev: None,
        }
    }

    fn key(n: u32) -> FrontendKey {
        FrontendKey {
            addr: Addr::from_v4((0xac10_0000 + n / 3).to_be_bytes()),
            port: 80 + (n % 3) as u16,
            proto: IpProto::TCP,
        }
    }

    /// The table against a `HashMap` through inserts, replacements and removals (backward-shift
    /// deletion, growing and shrinking shards): every key answers as the model does.
    #[test]
    fn frontend_table_matches_a_map() {
        let mut t = FrontendTable::new();
        let mut model: HashMap<FrontendKey, u32> = HashMap::new();
        let mut rng = 0x1234_5678u64;
        for step in 0..40_000u32 {
            let n = (wy(&mut rng) % 6_000) as u32;
            if wy(&mut rng) % 3 == 0 {
                assert_eq!(
                    t.remove(&key(n)).map(|f| f.service_port.id),
                    model.remove(&key(n))
                );
            } else {
                assert_eq!(
                    t.insert(key(n), frontend(step, n % 2))
                        .map(|f| f.service_port.id),
                    model.insert(key(n), step)
                );
            }
        }
        assert_eq!(t.len(), model.len());
        for n in 0..6_000 {
            let got = t.lookup(&key(n));
            assert_eq!(got.map(|e| e.service_id()), model.get(&key(n)).copied());
            if let Some(e) = got {
                assert_eq!(e.affinity_timeout_s(), n % 2);
                assert_eq!(e.has_affinity(), n % 2 == 1);
                let fe = e.frontend().unwrap();
                assert_eq!(e.service_id(), fe.service_port.id);
                for class in SourceClass::ALL {
                    assert_eq!(e.route(class), fe.routes[class as usize]);
                }
            }
        }
        assert_eq!(t.iter().count(), model.len());
        for (i, s) in t.shards.iter().enumerate() {
            let cap = s.hot.len();
            assert_eq!(s.cold.len(), cap);
            assert!(cap == 0 || (cap.is_power_of_two() && cap >= 2 * t.lens[i] as usize));
            assert_eq!(
                s.hot.iter().filter(|x| x.is_some()).count(),
                t.lens[i] as usize
            );
            assert_eq!(
                s.cold.iter().filter(|x| x.is_some()).count(),
                t.lens[i] as usize
            );
        }
        // Everything removed: every shard is empty again.
        for n in 0..6_000 {
            t.remove(&key(n));
        }
        assert!(t.is_empty());
        assert!(t
            .shards
            .iter()
            .all(|s| s.hot.is_empty() && s.cold.is_empty()));
        assert!(t.lookup(&key(1)).is_none());
    }

    /// A copy shares every shard; an update copies only the shard it writes.
    #[test]
    fn frontend_table_copies_only_written_shards() {
        let mut a = FrontendTable::new();
        for n in 0..3_000 {
            a.insert(key(n), frontend(n, 0));
        }
        let mut b = a.clone();
        assert_eq!(b.shared_shards(&a), SHARDS);
        b.insert(key(7), frontend(99, 0));
        assert_eq!(b.shared_shards(&a), SHARDS - 1);
        assert_eq!(a.lookup(&key(7)).map(|e| e.service_id()), Some(7));
        assert_eq!(b.lookup(&key(7)).map(|e| e.service_id()), Some(99));
        b.remove(&key(8));
        assert!(b.shared_shards(&a) >= SHARDS - 2);
        assert!(a.contains_key(&key(8)) && !b.contains_key(&key(8)));
    }

    fn wy(s: &mut u64) -> u64 {
        *s = s.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (*s as u128).wrapping_mul((*s ^ 0xe703_7ed1_a0b4_28db) as u128);
        (t >> 64) as u64 ^ t as u64
    }
}
