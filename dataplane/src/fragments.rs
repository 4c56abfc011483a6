//! Per-worker memory of fragmented datagrams: the first fragment carries the ports and is decided
//! like any packet; later fragments of the same datagram (same source, destination, protocol and
//! IP identification) get the same translation and verdict from here.
//!
//! Per worker, without locks: NICs hash every fragment of a datagram by addresses only, so they
//! all reach the same queue (replay steers by client, to the same effect). Fixed size and
//! set-associative: a flood of datagrams evicts the oldest entries and never grows memory.

use kxdp_packet::{Addr, PacketMeta};

use crate::conntrack::{hash_packed, Packed, Tuple};
use crate::verdict::{Action, Reason};

/// How long a datagram's later fragments are recognised after its first one.
pub const FRAGMENT_TIMEOUT_MS: u64 = 10_000;

const WAYS: usize = 4;

/// What the first fragment got, for the rest of its datagram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragDecision {
    pub action: Action,
    pub reason: Reason,
    /// Addresses the later fragments leave with (forwarded datagrams).
    pub src: Addr,
    pub dst: Addr,
    pub masq: bool,
    pub service_id: u32,
}

#[derive(Clone, Copy, Default)]
struct Entry {
    key: Packed,
    expires_ms: u64,
    decision: FragDecision,
}

pub struct FragmentTable {
    sets: Box<[[Entry; WAYS]]>,
    mask: usize,
}

impl FragmentTable {
    /// Room for `datagrams` datagrams in flight (rounded up to a power of two).
    pub fn new(datagrams: usize) -> FragmentTable {
        let sets = (datagrams / WAYS).max(1).next_power_of_two();
        FragmentTable {
            sets: vec![[Entry::default(); WAYS]; sets].into_boxed_slice(),
            mask: sets - 1,
        }
    }

    /// The key of the datagram a fragment belongs to (addresses as received).
    pub fn key(meta: &PacketMeta) -> Packed {
        Tuple {
            src: meta.src,
            dst: meta.dst,
            sport: (meta.frag.id >> 16) as u16,
            dport: meta.frag.id as u16,
            proto: meta.proto,
            family: meta.family,
        }
        .pack()
    }

    /// Remembers the first fragment's decision.
    pub fn insert(&mut self, key: Packed, now_ms: u64, decision: FragDecision) {
        let set = &mut self.sets[hash_packed(&key, 0x6672_6167) as usize & self.mask];
        // The same datagram again, else a free or expired way, else the one expiring first.
        let way = set
            .iter()
            .position(|e| e.key == key && e.expires_ms >= now_ms)
            .or_else(|| set.iter().position(|e| e.expires_ms < now_ms))
            .unwrap_or_else(|| {
                (0..WAYS)
                    .min_by_key(|&w| set[w].expires_ms)
                    .unwrap_or_default()
            });
        set[way] = Entry {
            key,
            expires_ms: now_ms + FRAGMENT_TIMEOUT_MS,
            decision,
        };
    }

    /// The decision for a later fragment's datagram, if its first fragment was seen recently.
    pub fn get(&self, key: &Packed, now_ms: u64) -> Option<FragDecision> {
        let set = &self.sets[hash_packed(key, 0x6672_6167) as usize & self.mask];
        set.iter()
            .find(|e| e.key == *key && e.expires_ms >= now_ms && e.expires_ms != 0)
            .map(|e| e.decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxdp_packet::IpProto;

    fn meta(id: u32) -> PacketMeta {
        let mut m = PacketMeta {
            src: Addr::from_v4([10, 0, 0, 1]),
            dst: Addr::from_v4([10, 0, 0, 2]),
            proto: IpProto::UDP,
            ..PacketMeta::default()
        };
        m.frag.id = id;
        m
    }

    #[test]
    fn remembers_expires_and_stays_bounded() {
        let mut t = FragmentTable::new(16);
        let d = FragDecision {
            action: Action::Forward,
            reason: Reason::ServiceDnat,
            ..FragDecision::default()
        };
        t.insert(FragmentTable::key(&meta(1)), 1000, d);
        assert_eq!(t.get(&FragmentTable::key(&meta(1)), 1500), Some(d));
        assert_eq!(t.get(&FragmentTable::key(&meta(2)), 1500), None);
        assert_eq!(
            t.get(
                &FragmentTable::key(&meta(1)),
                1000 + FRAGMENT_TIMEOUT_MS + 1
            ),
            None
        );
        // A flood of datagrams: the table never grows; recent ones are still found.
        for id in 0..100_000 {
            t.insert(FragmentTable::key(&meta(id)), 2000 + id as u64, d);
        }
        assert_eq!(t.sets.len(), 4);
        assert!(t
            .get(&FragmentTable::key(&meta(99_999)), 2000 + 99_999)
            .is_some());
    }
}
