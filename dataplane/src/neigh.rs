//! Keeping the next hops kxdp forwards to addressable. kxdp sends to a pod or gateway itself,
//! so the kernel neither sends there nor sees the answers, and the two tables the FIB takes a
//! next hop's MAC and port from decay behind its back:
//!
//! - a neighbour entry nothing confirms turns STALE after the reachable time (~30 s), and the
//!   kernel's garbage collector removes STALE entries unused for `gc_stale_time` (60 s) once the
//!   table holds more than `gc_thresh1` (128) entries; a change of the device's MAC (a bridge
//!   without a MAC of its own takes its lowest port's) or `ip neigh flush` removes them all;
//! - a bridge forgets which port a MAC is on `ageing_time` (300 s) after it last saw a frame
//!   from it, and the frames of a pod behind a bridge port go to kxdp, not through the bridge.
//!
//! Either costs the next hop's packets a `no-neighbour` until the kernel resolves it again
//! (seconds: a STALE entry waits `delay_first_probe_time`, 5 s, before probing). The [`Keeper`]
//! (run by the route refresher, `io::route`) prevents it:
//!
//! - it asks the kernel to use every STALE neighbour (`RTM_NEWNEIGH` with `NTF_USE`), as sending
//!   there would: the kernel marks it used, which the collector respects, probes it with a
//!   unicast ARP / neighbour solicitation and marks it REACHABLE on the answer. The answer
//!   crosses the bridge, which relearns the pod's port. A next hop that no longer answers turns
//!   FAILED and is dropped, as the kernel would drop it;
//! - a neighbour the kernel dropped is kept (its last MAC) for [`KEEP`] while the kernel
//!   resolves it again, asked every [`ASK_KEPT`], unless its interface went or the kernel found
//!   it FAILED;
//! - a bridge FDB entry the bridge aged out is kept as long as its port is still a port of that
//!   bridge and no other port has claimed the MAC: a pod's MAC moves only with its veth, whose
//!   removal ends the entry;
//! - a neighbour behind a bridge whose MAC is on no port (its FDB entry aged out before kxdp
//!   started, or never learned) is probed at once (its entry set to PROBE), every
//!   [`ASK_KEPT`]: the answer crosses the bridge, which learns the port.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::fib::{FdbEntry, FibInput, Neighbour};

/// How long a neighbour the kernel dropped keeps its last MAC while it is resolved again (the
/// kernel gives up on an unanswered resolution after 3 probes a second apart).
pub const KEEP: Duration = Duration::from_secs(5);
/// How often a kept neighbour is asked for again.
pub const ASK_KEPT: Duration = Duration::from_secs(1);
/// How often a STALE neighbour is asked for again if it stays STALE (it normally moves on to
/// DELAY, PROBE and REACHABLE at once).
pub const ASK_STALE: Duration = Duration::from_secs(5);
/// FDB entries kept at most (one per pod MAC behind a bridge: far above a node's pods).
const MAX_FDB: usize = 16_384;

type Key = (u32, IpAddr);

#[derive(Clone, Copy, Debug)]
struct Seen {
    mac: [u8; 6],
    at: Instant,
}

/// What to ask the kernel for a next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Use it (`RTM_NEWNEIGH` with `NTF_USE`): resolve it, or refresh a STALE entry.
    Use(u32, IpAddr),
    /// Probe it now with this MAC (its entry set to PROBE).
    Probe(u32, IpAddr, [u8; 6]),
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Keeper {
    neigh: HashMap<Key, Seen>,
    /// (bridge, MAC) → port.
    fdb: HashMap<(u32, [u8; 6]), u32>,
    /// Neighbours kept at the last [`Keeper::complete`].
    kept: Vec<Key>,
    /// STALE neighbours at the last [`Keeper::complete`].
    stale: Vec<Key>,
    /// Neighbours behind a bridge whose MAC is on none of its ports, with that MAC.
    unported: Vec<(Key, [u8; 6])>,
    asked: HashMap<Key, Instant>,
}

impl Keeper {
    /// Adds to a fresh read of the kernel's tables the neighbours and FDB entries it dropped
    /// but are still to be used (module docs), and remembers what it read.
    pub fn complete(&mut self, input: &mut FibInput, now: Instant) {
        let links: HashMap<u32, Option<u32>> =
            input.links.iter().map(|l| (l.ifindex, l.master)).collect();
        let failed: HashSet<Key> = input.failed.iter().copied().collect();
        let mut present = HashSet::with_capacity(input.neighbours.len());
        for n in &input.neighbours {
            let key = (n.ifindex, n.addr);
            present.insert(key);
            self.neigh.insert(
                key,
                Seen {
                    mac: n.mac,
                    at: now,
                },
            );
        }
        self.kept.clear();
        self.neigh.retain(|key, seen| {
            if present.contains(key) {
                return true;
            }
            let keep = links.contains_key(&key.0)
                && !failed.contains(key)
                && now.saturating_duration_since(seen.at) < KEEP;
            if keep {
                input.neighbours.push(Neighbour {
                    ifindex: key.0,
                    addr: key.1,
                    mac: seen.mac,
                });
                self.kept.push(*key);
            }
            keep
        });
        self.kept.sort_unstable();

        let mut learned = HashSet::with_capacity(input.fdb.len());
        for e in &input.fdb {
            learned.insert((e.bridge, e.mac));
            self.fdb.insert((e.bridge, e.mac), e.port);
        }
        if self.fdb.len() > MAX_FDB {
            self.fdb.retain(|k, _| learned.contains(k));
        }
        self.fdb.retain(|&(bridge, mac), port| {
            if learned.contains(&(bridge, mac)) {
                return true;
            }
            let still_a_port = links.get(port) == Some(&Some(bridge));
            if still_a_port {
                input.fdb.push(FdbEntry {
                    bridge,
                    port: *port,
                    mac,
                });
            }
            still_a_port
        });

        self.stale.clear();
        self.stale
            .extend(input.stale.iter().filter(|k| present.contains(k)).copied());
        self.stale.sort_unstable();
        self.stale.dedup();

        let bridges: HashSet<u32> = input
            .links
            .iter()
            .filter(|l| l.bridge)
            .map(|l| l.ifindex)
            .collect();
        let ported: HashSet<(u32, [u8; 6])> = input.fdb.iter().map(|e| (e.bridge, e.mac)).collect();
        self.unported.clear();
        self.unported.extend(
            input
                .neighbours
                .iter()
                .filter(|n| bridges.contains(&n.ifindex) && !ported.contains(&(n.ifindex, n.mac)))
                .map(|n| ((n.ifindex, n.addr), n.mac)),
        );
        self.unported.sort_unstable();

        let (kept, stale, unported) = (&self.kept, &self.stale, &self.unported);
        self.asked.retain(|k, _| {
            kept.binary_search(k).is_ok()
                || stale.binary_search(k).is_ok()
                || unported.iter().any(|(u, _)| u == k)
        });
    }

    /// What to ask the kernel now: kept neighbours (used) and neighbours on no bridge port
    /// (probed) every [`ASK_KEPT`], STALE ones (used) every [`ASK_STALE`].
    pub fn due(&mut self, now: Instant) -> Vec<Ask> {
        let mut out = Vec::new();
        let mut ask = |k: &Key, every: Duration, what: Ask| {
            let due = self
                .asked
                .get(k)
                .is_none_or(|t| now.saturating_duration_since(*t) >= every);
            if due {
                self.asked.insert(*k, now);
                out.push(what);
            }
        };
        for &(k, mac) in &self.unported {
            ask(&k, ASK_KEPT, Ask::Probe(k.0, k.1, mac));
        }
        for k in &self.kept {
            ask(k, ASK_KEPT, Ask::Use(k.0, k.1));
        }
        for k in &self.stale {
            ask(k, ASK_STALE, Ask::Use(k.0, k.1));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fib::Link;

    fn link(ifindex: u32, master: Option<u32>) -> Link {
        Link {
            ifindex,
            name: format!("if{ifindex}"),
            mac: Some([ifindex as u8; 6]),
            master,
            bridge: ifindex == 10,
            veth: false,
            peer: None,
            rx_queues: 1,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A bridge (10) with ports 11 and 12, an uplink (1); pod 10.2.0.5 behind port 11.
    fn input() -> FibInput {
        FibInput {
            links: vec![
                link(1, None),
                link(10, None),
                link(11, Some(10)),
                link(12, Some(10)),
            ],
            neighbours: vec![
                Neighbour {
                    ifindex: 10,
                    addr: ip("10.2.0.5"),
                    mac: [0xb5; 6],
                },
                Neighbour {
                    ifindex: 1,
                    addr: ip("192.168.0.1"),
                    mac: [0xee; 6],
                },
            ],
            fdb: vec![FdbEntry {
                bridge: 10,
                port: 11,
                mac: [0xb5; 6],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_dropped_neighbour_keeps_its_mac_for_a_while_and_is_asked_for() {
        let t0 = Instant::now();
        let mut k = Keeper::default();
        let mut first = input();
        k.complete(&mut first, t0);
        assert_eq!(first.neighbours.len(), 2);
        assert!(k.due(t0).is_empty(), "nothing stale, nothing dropped");

        // Flushed (or collected): kept with its last MAC, asked for at once, then every second.
        let mut flushed = input();
        flushed.neighbours.clear();
        let t1 = t0 + Duration::from_secs(1);
        k.complete(&mut flushed, t1);
        let mut got: Vec<_> = flushed.neighbours.iter().map(|n| (n.addr, n.mac)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![(ip("10.2.0.5"), [0xb5; 6]), (ip("192.168.0.1"), [0xee; 6])]
        );
        assert_eq!(k.due(t1).len(), 2);
        assert!(k.due(t1 + Duration::from_millis(500)).is_empty());
        assert_eq!(k.due(t1 + ASK_KEPT).len(), 2);

        // The kernel found one FAILED: no longer kept; the other is kept until KEEP runs out.
        let mut failed = input();
        failed.neighbours.clear();
        failed.failed = vec![(1, ip("192.168.0.1"))];
        k.complete(&mut failed, t0 + Duration::from_secs(3));
        assert_eq!(failed.neighbours.len(), 1);
        assert_eq!(failed.neighbours[0].addr, ip("10.2.0.5"));
        let mut late = input();
        late.neighbours.clear();
        k.complete(&mut late, t0 + KEEP);
        assert!(late.neighbours.is_empty(), "{:?}", late.neighbours);
        assert!(k.due(t0 + KEEP + ASK_KEPT).is_empty());
    }

    #[test]
    fn a_neighbour_on_a_link_that_went_is_not_kept() {
        let t0 = Instant::now();
        let mut k = Keeper::default();
        k.complete(&mut input(), t0);
        let mut gone = input();
        gone.neighbours.clear();
        gone.links.retain(|l| l.ifindex != 1);
        k.complete(&mut gone, t0);
        assert_eq!(gone.neighbours.len(), 1);
        assert_eq!(gone.neighbours[0].ifindex, 10);
    }

    #[test]
    fn an_aged_out_fdb_entry_is_kept_while_its_port_is_on_the_bridge() {
        let t0 = Instant::now();
        let mut k = Keeper::default();
        k.complete(&mut input(), t0);
        // Aged out: kept, however long.
        let mut aged = input();
        aged.fdb.clear();
        k.complete(&mut aged, t0 + Duration::from_secs(3600));
        assert_eq!(
            aged.fdb,
            vec![FdbEntry {
                bridge: 10,
                port: 11,
                mac: [0xb5; 6]
            }]
        );
        // The MAC shows up on the other port: that one is kept from then on.
        let mut moved = input();
        moved.fdb[0].port = 12;
        k.complete(&mut moved, t0);
        let mut after = input();
        after.fdb.clear();
        k.complete(&mut after, t0);
        assert_eq!(after.fdb[0].port, 12);
        // The port leaves the bridge (or goes): the entry goes.
        let mut left = input();
        left.fdb.clear();
        left.links.retain(|l| l.ifindex != 12);
        k.complete(&mut left, t0);
        assert!(left.fdb.is_empty());
        let mut again = input();
        again.fdb.clear();
        k.complete(&mut again, t0);
        assert!(again.fdb.is_empty(), "forgotten once its port went");
    }

    #[test]
    fn stale_neighbours_are_asked_for_every_few_seconds() {
        let t0 = Instant::now();
        let mut k = Keeper::default();
        let mut i = input();
        i.stale = vec![(10, ip("10.2.0.5")), (10, ip("10.2.0.99"))];
        k.complete(&mut i, t0);
        // Only the listed (usable) one; again only after ASK_STALE.
        assert_eq!(k.due(t0), vec![Ask::Use(10, ip("10.2.0.5"))]);
        assert!(k.due(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(k.due(t0 + ASK_STALE), vec![Ask::Use(10, ip("10.2.0.5"))]);
        // Confirmed since (no longer STALE): not asked for.
        k.complete(&mut input(), t0 + ASK_STALE);
        assert!(k.due(t0 + ASK_STALE * 3).is_empty());
    }

    #[test]
    fn a_neighbour_on_no_bridge_port_is_probed() {
        let t0 = Instant::now();
        let mut k = Keeper::default();
        // The bridge never learned the pod's port (or forgot it before kxdp started).
        let mut i = input();
        i.fdb.clear();
        k.complete(&mut i, t0);
        assert_eq!(k.due(t0), vec![Ask::Probe(10, ip("10.2.0.5"), [0xb5; 6])]);
        assert!(k.due(t0 + Duration::from_millis(500)).is_empty());
        assert_eq!(k.due(t0 + ASK_KEPT).len(), 1);
        // Learned: no more probes (and the entry is kept from then on).
        k.complete(&mut input(), t0 + ASK_KEPT);
        assert!(k.due(t0 + ASK_KEPT * 3).is_empty());
        // A neighbour on a plain link needs no port.
        let mut up = input();
        up.fdb.clear();
        up.neighbours.retain(|n| n.ifindex == 1);
        let mut k = Keeper::default();
        k.complete(&mut up, t0);
        assert!(k.due(t0).is_empty());
    }
}
