//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
//! Balancer", NSDI 2016): a lookup table of a prime size M whose slots name endpoints, filled from
//! one permutation of the slots per endpoint, so that each endpoint holds about M/N slots and
//! removing one of N endpoints moves about 1/N of the slots.
//!
//! Everything here is a function of the endpoints' identities (address and port) and a
//! cluster-wide seed, never of node-local state: two nodes given the same endpoint list build the
//! same table, and a new connection's 5-tuple (`flow_hash`) picks the same endpoint on both, and
//! after a restart. Tables are built by the control thread (translation) and only read here.

use kxdp_packet::{Addr, PacketMeta};

use crate::endpoint::{Endpoint, EndpointRange};

/// The default and the largest table size the configuration accepts (Cilium's default).
pub const DEFAULT_TABLE_SIZE: u32 = 16381;
/// The smallest table size (and the smallest table built).
pub const MIN_TABLE_SIZE: u32 = 251;
/// The largest table size.
pub const MAX_TABLE_SIZE: u32 = 1_048_573;
/// A table is given at least this many slots per endpoint when the configured size allows (the
/// paper's M ≥ 100 N: the share of each endpoint is then within a few percent of 1/N).
pub const SLOTS_PER_ENDPOINT: u64 = 100;

/// The sizes a table takes below the configured one: the largest prime below each power of two
/// from 2^8. A route's table has the first of these (or the configured size) that gives
/// `SLOTS_PER_ENDPOINT` slots per endpoint, so that 10 endpoints cost 1021 slots, not 16381;
/// a fixed ladder keeps the size a function of the endpoint count alone (the same on every node).
pub const LADDER: [u32; 13] = [
    251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131_071, 262_139, 524_287, 1_048_573,
];

/// Whether `n` is prime (trial division: configuration values only).
pub fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

/// The size of the table of a route of `n` endpoints under a configured size `max`: the first
/// ladder prime below `max`, or `max`, with at least `SLOTS_PER_ENDPOINT` slots per endpoint;
/// `max` when none has; when `max` is not above `n`, the first ladder prime above `n`. None
/// when `n` is 0 or more than the largest ladder prime.
pub fn table_size(max: u32, n: usize) -> Option<u32> {
    let n = n as u64;
    if n == 0 || n >= MAX_TABLE_SIZE as u64 {
        return None;
    }
    let want = n * SLOTS_PER_ENDPOINT;
    if let Some(&p) = LADDER.iter().find(|&&p| p < max && p as u64 >= want) {
        return Some(p);
    }
    if max as u64 > n {
        return Some(max);
    }
    LADDER.iter().copied().find(|&p| p as u64 > n)
}

/// The 64-bit seed of a configured seed string (`loadBalancing.maglevSeed`): FNV-1a 64 over its
/// bytes, the same in every build.
pub fn seed_of(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Murmur3's 64-bit finalizer.
#[inline(always)]
fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// An address as two words (little-endian: the same on every node whatever the build).
#[inline(always)]
fn words(a: &Addr) -> (u64, u64) {
    let b = &a.0;
    (
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
    )
}

/// The hash of a new connection's 5-tuple under `seed`: what indexes a Maglev table. A few
/// multiplications, no allocation.
#[inline]
pub fn flow_hash(seed: u64, meta: &PacketMeta) -> u64 {
    let (s0, s1) = words(&meta.src);
    let (d0, d1) = words(&meta.dst);
    let ports = (meta.sport as u64) << 32 | (meta.dport as u64) << 16 | meta.proto.0 as u64;
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    h = (h ^ s0).wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(31);
    h = (h ^ s1).wrapping_mul(0x94d0_49bb_1331_11eb).rotate_left(29);
    h = (h ^ d0).wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(31);
    h = (h ^ d1).wrapping_mul(0x94d0_49bb_1331_11eb).rotate_left(29);
    fmix(h ^ ports)
}

/// The two hashes of an endpoint's identity (its address and port) that give its permutation.
fn endpoint_hashes(seed: u64, ep: &Endpoint) -> (u64, u64) {
    let (a0, a1) = words(&ep.addr);
    let h = |k: u64| {
        let mut h = fmix(seed ^ k);
        h = fmix(h ^ a0);
        h = fmix(h ^ a1);
        fmix(h ^ ep.port as u64)
    };
    (h(0x6d61_676c_6576_3031), h(0x6d61_676c_6576_3032))
}

/// The slots of one table: indices into the route's endpoint list, 2 bytes each when the list
/// has at most 65536 endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Slots {
    Narrow(Box<[u16]>),
    Wide(Box<[u32]>),
}

/// One route's lookup table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaglevTable {
    slots: Slots,
}

impl MaglevTable {
    /// The table of `eps` (a route's list) with `m` slots (`m` prime and above `eps.len()`, as
    /// `table_size` gives). Endpoints fill their preferred slots in turn in the order of their
    /// identities (address, then port), not of the list, so that the table does not depend on
    /// the order the list was assembled in.
    pub fn build(seed: u64, eps: &[Endpoint], m: u32) -> MaglevTable {
        let n = eps.len();
        assert!(
            n > 0 && (m as usize) > n,
            "maglev: {m} slots for {n} endpoints"
        );
        let m64 = m as u64;
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_unstable_by(|&a, &b| {
            let (a, b) = (&eps[a as usize], &eps[b as usize]);
            (a.addr.0, a.port).cmp(&(b.addr.0, b.port))
        });
        // (next slot of the permutation, skip) per endpoint, in `order`.
        let mut perm: Vec<(u64, u64)> = order
            .iter()
            .map(|&i| {
                let (h1, h2) = endpoint_hashes(seed, &eps[i as usize]);
                (h1 % m64, h2 % (m64 - 1) + 1)
            })
            .collect();
        const EMPTY: u32 = u32::MAX;
        let mut table = vec![EMPTY; m as usize];
        let mut filled = 0u64;
        'fill: loop {
            for (k, &i) in order.iter().enumerate() {
                let (next, skip) = &mut perm[k];
                // Each permutation visits every slot (m prime, 0 < skip < m): this ends.
                while table[*next as usize] != EMPTY {
                    *next = (*next + *skip) % m64;
                }
                table[*next as usize] = i;
                *next = (*next + *skip) % m64;
                filled += 1;
                if filled == m64 {
                    break 'fill;
                }
            }
        }
        let slots = if n <= 1 << 16 {
            Slots::Narrow(table.into_iter().map(|i| i as u16).collect())
        } else {
            Slots::Wide(table.into_boxed_slice())
        };
        MaglevTable { slots }
    }

    /// Slots in the table.
    pub fn len(&self) -> usize {
        match &self.slots {
            Slots::Narrow(s) => s.len(),
            Slots::Wide(s) => s.len(),
        }
    }

    /// Always false: a table has at least `MIN_TABLE_SIZE` slots.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its slots.
    pub fn bytes(&self) -> usize {
        match &self.slots {
            Slots::Narrow(s) => s.len() * 2,
            Slots::Wide(s) => s.len() * 4,
        }
    }

    /// The endpoint (an index into the route's list) of a flow whose hash is `hash`: the slot
    /// `hash` scales to (multiply and shift, no division).
    #[inline]
    pub fn lookup(&self, hash: u64) -> usize {
        let slot = |len: usize| ((hash as u128 * len as u128) >> 64) as usize;
        match &self.slots {
            Slots::Narrow(s) => s.get(slot(s.len())).map_or(0, |&i| i as usize),
            Slots::Wide(s) => s.get(slot(s.len())).map_or(0, |&i| i as usize),
        }
    }

    /// The endpoint index of every slot, in slot order.
    pub fn slots(&self) -> Vec<u32> {
        match &self.slots {
            Slots::Narrow(s) => s.iter().map(|&i| i as u32).collect(),
            Slots::Wide(s) => s.to_vec(),
        }
    }
}

/// The Maglev tables of one Service port and family: one per distinct route list (the cluster
/// list and the node-local one), shared by the frontends of that port and family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Maglev {
    seed: u64,
    tables: Box<[(EndpointRange, MaglevTable)]>,
}

impl Maglev {
    /// The tables of the routes `ranges` of the endpoints `pool` (duplicate and empty ranges
    /// skipped), at most `max` slots each as `table_size` says. None when no range has a table.
    pub fn build(
        seed: u64,
        max: u32,
        pool: &[Endpoint],
        ranges: &[EndpointRange],
    ) -> Option<Maglev> {
        let mut tables: Vec<(EndpointRange, MaglevTable)> = Vec::new();
        for &r in ranges {
            if r.is_empty() || tables.iter().any(|(x, _)| *x == r) {
                continue;
            }
            let Some(eps) = pool.get(r.as_range()) else {
                continue;
            };
            let Some(m) = table_size(max, eps.len()) else {
                continue;
            };
            tables.push((r, MaglevTable::build(seed, eps, m)));
        }
        (!tables.is_empty()).then(|| Maglev {
            seed,
            tables: tables.into(),
        })
    }

    /// The table of a route's list.
    #[inline]
    pub fn table(&self, range: EndpointRange) -> Option<&MaglevTable> {
        self.tables
            .iter()
            .find(|(r, _)| *r == range)
            .map(|(_, t)| t)
    }

    /// The endpoint (an index into the route's list `range`) Maglev gives a new connection whose
    /// first packet is `meta`; None when the route has no table.
    #[inline]
    pub fn pick(&self, range: EndpointRange, meta: &PacketMeta) -> Option<usize> {
        let t = self.table(range)?;
        Some(t.lookup(flow_hash(self.seed, meta)))
    }

    /// The seed the tables were built with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The tables, by route list.
    pub fn tables(&self) -> impl Iterator<Item = (EndpointRange, &MaglevTable)> + '_ {
        self.tables.iter().map(|(r, t)| (*r, t))
    }

    /// Bytes of the tables' slots.
    pub fn bytes(&self) -> usize {
        self.tables.iter().map(|(_, t)| t.bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxdp_packet::IpProto;

    fn eps(n: usize, base: u32) -> Vec<Endpoint> {
        (0..n as u32)
            .map(|i| Endpoint {
                addr: Addr::from_ip(std::net::Ipv4Addr::from(0x0a01_0000 + base + i).into()),
                port: 8080,
                local: false,
            })
            .collect()
    }

    #[test]
    fn primes_and_sizes() {
        assert!(LADDER.iter().all(|&p| is_prime(p as u64)));
        assert!(is_prime(DEFAULT_TABLE_SIZE as u64) && !is_prime(16384) && !is_prime(1));
        assert_eq!(table_size(16381, 10), Some(1021));
        assert_eq!(table_size(16381, 1), Some(251));
        assert_eq!(table_size(16381, 200), Some(16381));
        assert_eq!(table_size(16381, 5000), Some(16381));
        assert_eq!(table_size(1021, 5000), Some(8191));
        assert_eq!(table_size(65521, 5000), Some(65521));
        // A configured size off the ladder is used as it is.
        assert_eq!(table_size(1009, 50), Some(1009));
        assert_eq!(table_size(16381, 0), None);
    }

    #[test]
    fn each_endpoint_gets_its_share() {
        for n in [1usize, 3, 10, 100] {
            let m = 16381;
            let t = MaglevTable::build(7, &eps(n, 0), m);
            let mut count = vec![0usize; n];
            for i in t.slots() {
                count[i as usize] += 1;
            }
            let fair = m as f64 / n as f64;
            for c in count {
                assert!(
                    (c as f64 - fair).abs() <= fair * 0.1 + 1.0,
                    "n {n}: {c} slots, fair {fair}"
                );
            }
        }
    }

    #[test]
    fn removing_one_of_n_moves_about_one_nth() {
        let n = 10;
        let all = eps(n, 0);
        let m = table_size(DEFAULT_TABLE_SIZE, n).unwrap();
        let before = MaglevTable::build(1, &all, m);
        let mut fewer = all.clone();
        let gone = fewer.remove(3);
        let after = MaglevTable::build(1, &fewer, m);
        let (b, a) = (before.slots(), after.slots());
        let moved = b
            .iter()
            .zip(&a)
            .filter(|(x, y)| all[**x as usize] != fewer[**y as usize])
            .count();
        let of_gone = b.iter().filter(|x| all[**x as usize] == gone).count();
        // The slots of the one that went move, and only a few others.
        let share = moved as f64 / m as f64;
        assert!(share < 1.0 / n as f64 * 1.3 + 0.02, "moved {share}");
        assert!(moved >= of_gone);
    }

    #[test]
    fn same_input_same_table_whatever_the_order() {
        let a = eps(50, 0);
        let mut b = a.clone();
        b.reverse();
        let ta = MaglevTable::build(5, &a, 5009);
        let tb = MaglevTable::build(5, &b, 5009);
        let ma: Vec<Endpoint> = ta.slots().iter().map(|&i| a[i as usize]).collect();
        let mb: Vec<Endpoint> = tb.slots().iter().map(|&i| b[i as usize]).collect();
        assert_eq!(ma, mb);
        assert_eq!(ta, MaglevTable::build(5, &a, 5009));
        // The node-local flag is not part of the identity.
        let mut c = a.clone();
        c[0].local = true;
        assert_eq!(ta, MaglevTable::build(5, &c, 5009));
    }

    #[test]
    fn different_seed_different_table() {
        let a = eps(10, 0);
        let t1 = MaglevTable::build(seed_of("a"), &a, 1021);
        let t2 = MaglevTable::build(seed_of("b"), &a, 1021);
        let same = t1
            .slots()
            .iter()
            .zip(t2.slots())
            .filter(|(x, y)| **x == *y)
            .count();
        assert!(same < 1021 / 4, "{same} slots alike");
    }

    #[test]
    fn wide_tables_and_lookup_bounds() {
        let n = 70_000;
        let all = eps(n, 0);
        let m = table_size(DEFAULT_TABLE_SIZE, n).unwrap();
        assert_eq!(m, 131_071);
        let t = MaglevTable::build(0, &all, m);
        assert_eq!(t.bytes(), m as usize * 4);
        assert!(t.slots().iter().all(|&i| (i as usize) < n));
        for h in [0, u64::MAX, 1 << 63] {
            assert!(t.lookup(h) < n);
        }
    }

    #[test]
    fn set_per_range() {
        let pool = eps(12, 0);
        let cluster = EndpointRange { start: 0, len: 10 };
        let local = EndpointRange { start: 10, len: 2 };
        let m = Maglev::build(3, DEFAULT_TABLE_SIZE, &pool, &[cluster, local, cluster]).unwrap();
        assert_eq!(m.tables().count(), 2);
        assert_eq!(m.table(cluster).unwrap().len(), 1021);
        assert_eq!(m.table(local).unwrap().len(), 251);
        assert!(m.table(EndpointRange { start: 0, len: 3 }).is_none());
        assert!(Maglev::build(3, DEFAULT_TABLE_SIZE, &pool, &[EndpointRange::EMPTY]).is_none());
        let meta = PacketMeta {
            src: Addr::from_ip("192.0.2.1".parse().unwrap()),
            dst: Addr::from_ip("203.0.113.7".parse().unwrap()),
            sport: 40000,
            dport: 80,
            proto: IpProto::TCP,
            ..Default::default()
        };
        let p = m.pick(cluster, &meta).unwrap();
        assert!(p < 10);
        assert_eq!(Some(p), m.pick(cluster, &meta));
        assert!(m.pick(local, &meta).unwrap() < 2);
    }
}
