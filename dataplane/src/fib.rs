//! The forwarding information base as plain data: where a packet to a destination leaves and
//! with which MAC addresses. Built from the kernel's tables (links, local addresses, main-table
//! routes, neighbours, bridge forwarding databases: `io::route` reads them over netlink and
//! rebuilds the FIB on every change) or from a file (`kxdp replay --routes`). Immutable once
//! built; workers look up without a lock, allocation or syscall.
//!
//! Lookup order for a destination:
//!
//! 1. one of the node's own addresses → [`Hop::Kernel`] (the node's stack delivers it);
//! 2. the route: longest prefix, then lowest metric (one hash probe per distinct prefix length
//!    in the table, longest first — a node with 250 pod /32 routes costs one probe for them);
//! 3. the next hop (the gateway, or the destination itself on-link) in the neighbour table of
//!    the route's interface → its MAC;
//! 4. a route through a Linux bridge (the CNI `bridge` plugin: pods' host-side veths enslaved to
//!    `cni0`, the pod subnet routed to `cni0`): the bridge port its forwarding database maps that
//!    MAC to. kxdp then sends straight on the pod's host veth, without owning the bridge; the
//!    source MAC is the bridge's (the pod's gateway), as if the bridge had forwarded it.
//!
//! Cost: the outcome for the node's addresses, host routes (a pod's /32) and every neighbour is
//! computed when the FIB is built, so a packet to one of them costs one hash probe; any other
//! destination costs one probe per prefix length, its route's outcome precomputed too when it does
//! not depend on the destination (a gateway route such as the default).
//!
//! A route through an interface without an Ethernet address (tun, wireguard) yields a port
//! hop with zero MACs: kxdp cannot send there, so the egress stage reports `no-egress`.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use kxdp_packet::{Addr, Family};

pub use kxdp_kernel::netlink::{Dump as FibInput, FdbEntry, Link, LocalAddr, Neighbour, Route};

/// Where a packet leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// Sent on interface `ifindex`, to `dst_mac`, from `src_mac`.
    Port {
        ifindex: u32,
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
    },
    /// Addressed to the node itself: handed to its stack.
    Kernel,
}

/// Why a lookup found no next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    NoRoute,
    /// The route's next hop (interface, address) has no usable neighbour entry, or its MAC no
    /// bridge port yet.
    NoNeighbour(u32, Addr),
}

#[derive(Clone, Copy, Debug)]
struct RouteHop {
    oif: u32,
    gateway: Option<Addr>,
    metric: u32,
    /// The lookup's outcome when it does not depend on the destination (a route through a
    /// gateway, a link without MAC): computed at build time, so such a route costs its probe.
    fixed: Option<Result<Hop, Miss>>,
}

/// The routes of one family and prefix length.
#[derive(Clone, Debug)]
struct PrefixTable {
    family: Family,
    len: u8,
    mask: u128,
    routes: HashMap<u128, RouteHop, ahash::RandomState>,
}

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Fib {
    links: HashMap<u32, Link, ahash::RandomState>,
    local: HashSet<u128, ahash::RandomState>,
    local_addrs: Vec<IpAddr>,
    /// Longest prefix first.
    tables: Vec<PrefixTable>,
    neigh: HashMap<(u32, u128), [u8; 6], ahash::RandomState>,
    /// (bridge, MAC) → port.
    fdb: HashMap<(u32, [u8; 6]), u32, ahash::RandomState>,
    /// The whole lookup, done once at build time for the destinations packets usually have
    /// (the node's addresses, host routes such as a pod's /32, every neighbour): one probe here
    /// replaces the four to six of `resolve` (local, routes, link, neighbour, bridge port).
    /// Keyed by (address, 6 for IPv6 / 4 for IPv4): a route lookup depends on the family.
    resolved: HashMap<(u128, u8), Result<Hop, Miss>, ahash::RandomState>,
    /// The reverse path of the same destinations (not the node's addresses): the interface a
    /// packet from that address must arrive on ([`Fib::source_arrives_on`]), one probe.
    sources: HashMap<(u128, u8), Ingress, ahash::RandomState>,
    /// Unique per built FIB (0: the empty default): what a worker keys its per-interface
    /// precomputation on (`crate::antispoof::checked`).
    id: u64,
    input: FibInput,
}

/// Where a packet from a source address must arrive (the strict reverse path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingress {
    /// On this interface (the route's, or the bridge port its FDB maps the next hop's MAC to).
    Port(u32),
    /// On some port of this bridge: the route goes to the bridge, but which port the next hop
    /// is on is not known yet (no neighbour entry or FDB entry).
    Bridge(u32),
    /// Never from outside: one of the node's own addresses, or no route back.
    Nowhere,
}

fn family_key(family: Family) -> u8 {
    match family {
        Family::V4 => 4,
        Family::V6 => 6,
    }
}

fn family_of(ip: &IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    }
}

/// The mask of a `len`-bit prefix over `Addr::as_u128` (IPv4 addresses sit in the low 32 bits,
/// v4-mapped: the bits above are the same for every IPv4 address and are kept).
fn mask(family: Family, len: u8) -> u128 {
    match family {
        Family::V4 => {
            let len = len.min(32) as u32;
            let m = if len == 0 {
                0
            } else {
                (u32::MAX << (32 - len)) as u128
            };
            m | !(u32::MAX as u128)
        }
        Family::V6 => {
            let len = len.min(128) as u32;
            if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            }
        }
    }
}

/// Sources a strict reverse-path check lets through whatever the route: unspecified and
/// link-local (`Fib::source_arrives_on`).
fn exempt_source(src: &Addr, family: Family) -> bool {
    match family {
        Family::V4 => {
            let o = src.v4_octets();
            o == [0; 4] || (o[0] == 169 && o[1] == 254)
        }
        Family::V6 => {
            let a = src.as_u128();
            a == 0 || a >> 118 == 0xfe80 >> 6
        }
    }
}

impl Fib {
    pub fn new(input: FibInput) -> Fib {
        let mut fib = Fib::default();
        for l in &input.links {
            fib.links.insert(l.ifindex, l.clone());
        }
        for a in &input.addrs {
            fib.local.insert(Addr::from_ip(a.addr).as_u128());
            fib.local_addrs.push(a.addr);
        }
        for r in &input.routes {
            let family = family_of(&r.dst);
            let m = mask(family, r.len);
            let key = Addr::from_ip(r.dst).as_u128() & m;
            let t = match fib
                .tables
                .iter()
                .position(|t| t.family == family && t.len == r.len)
            {
                Some(i) => &mut fib.tables[i],
                None => {
                    fib.tables.push(PrefixTable {
                        family,
                        len: r.len,
                        mask: m,
                        routes: HashMap::default(),
                    });
                    fib.tables.last_mut().unwrap()
                }
            };
            let hop = RouteHop {
                oif: r.oif,
                gateway: r.gateway.map(Addr::from_ip),
                metric: r.metric,
                fixed: None,
            };
            t.routes
                .entry(key)
                .and_modify(|h| {
                    if hop.metric < h.metric {
                        *h = hop
                    }
                })
                .or_insert(hop);
        }
        fib.tables.sort_by_key(|t| std::cmp::Reverse(t.len));
        for n in &input.neighbours {
            fib.neigh
                .insert((n.ifindex, Addr::from_ip(n.addr).as_u128()), n.mac);
        }
        for e in &input.fdb {
            fib.fdb.insert((e.bridge, e.mac), e.port);
        }
        let mut tables = std::mem::take(&mut fib.tables);
        for t in &mut tables {
            for hop in t.routes.values_mut() {
                let no_mac = fib.links.get(&hop.oif).is_some_and(|l| l.mac.is_none());
                // The destination only matters as the next hop of an on-link route (a link
                // without MAC never gets as far as the next hop).
                let next_hop = hop.gateway.or(no_mac.then_some(Addr([0; 16])));
                if let Some(nh) = next_hop {
                    hop.fixed = Some(fib.via(hop, nh));
                }
            }
        }
        fib.tables = tables;
        let host_routes = input.routes.iter().filter(|r| match family_of(&r.dst) {
            Family::V4 => r.len == 32,
            Family::V6 => r.len == 128,
        });
        let destinations: Vec<IpAddr> = input
            .addrs
            .iter()
            .map(|a| a.addr)
            .chain(host_routes.map(|r| r.dst))
            .chain(input.neighbours.iter().map(|n| n.addr))
            .collect();
        for ip in destinations {
            let (addr, family) = (Addr::from_ip(ip), family_of(&ip));
            let hop = fib.resolve(&addr, family);
            fib.resolved
                .insert((addr.as_u128(), family_key(family)), hop);
            let from = fib.reverse_path(&addr, family);
            fib.sources
                .insert((addr.as_u128(), family_key(family)), from);
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        fib.id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        fib.input = input;
        fib
    }

    /// Unique per FIB built (`Fib::new`); 0 for the empty default.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// What the FIB was built from.
    pub fn input(&self) -> &FibInput {
        &self.input
    }

    pub fn link(&self, ifindex: u32) -> Option<&Link> {
        self.links.get(&ifindex)
    }

    pub fn link_by_name(&self, name: &str) -> Option<&Link> {
        self.input.links.iter().find(|l| l.name == name)
    }

    /// The node's own addresses (every interface).
    pub fn local_addrs(&self) -> &[IpAddr] {
        &self.local_addrs
    }

    pub fn is_local(&self, a: &Addr) -> bool {
        self.local.contains(&a.as_u128())
    }

    /// The route for `dst`: (interface, gateway). `hosts`: whether to look at host routes (/32,
    /// /128) too.
    fn route(&self, d: u128, family: Family, hosts: bool) -> Option<RouteHop> {
        let host_len = match family {
            Family::V4 => 32,
            Family::V6 => 128,
        };
        self.tables
            .iter()
            .filter(|t| t.family == family && (hosts || t.len != host_len))
            .find_map(|t| t.routes.get(&(d & t.mask)).copied())
    }

    /// Where a packet to `dst` leaves (module docs): one probe for a destination resolved at
    /// build time. Any other destination is no local address and matches no host route (those
    /// are all resolved), so only the shorter prefixes are left to probe.
    #[inline]
    pub fn lookup(&self, dst: &Addr, family: Family) -> Result<Hop, Miss> {
        if let Some(hop) = self.resolved.get(&(dst.as_u128(), family_key(family))) {
            return *hop;
        }
        let r = self
            .route(dst.as_u128(), family, false)
            .ok_or(Miss::NoRoute)?;
        match r.fixed {
            Some(hop) => hop,
            None => self.via(&r, *dst),
        }
    }

    /// The full lookup (module docs).
    fn resolve(&self, dst: &Addr, family: Family) -> Result<Hop, Miss> {
        let d = dst.as_u128();
        if self.local.contains(&d) {
            return Ok(Hop::Kernel);
        }
        let r = self.route(d, family, true).ok_or(Miss::NoRoute)?;
        match r.fixed {
            Some(hop) => hop,
            None => self.via(&r, *dst),
        }
    }

    /// The next hop through route `r` for a packet to `dst` (its gateway, if any, is used instead).
    fn via(&self, r: &RouteHop, dst: Addr) -> Result<Hop, Miss> {
        let Some(link) = self.links.get(&r.oif) else {
            return Err(Miss::NoRoute);
        };
        let Some(src_mac) = link.mac else {
            return Ok(Hop::Port {
                ifindex: r.oif,
                dst_mac: [0; 6],
                src_mac: [0; 6],
            });
        };
        let nh = r.gateway.unwrap_or(dst);
        let Some(&dst_mac) = self.neigh.get(&(r.oif, nh.as_u128())) else {
            return Err(Miss::NoNeighbour(r.oif, nh));
        };
        let ifindex = if link.bridge {
            *self
                .fdb
                .get(&(r.oif, dst_mac))
                .ok_or(Miss::NoNeighbour(r.oif, nh))?
        } else {
            r.oif
        };
        Ok(Hop::Port {
            ifindex,
            dst_mac,
            src_mac,
        })
    }

    /// Whether the neighbour table has a usable entry for `addr` (`Addr::as_u128`) on `ifindex`.
    pub fn has_neighbour(&self, ifindex: u32, addr: u128) -> bool {
        self.neigh.contains_key(&(ifindex, addr))
    }

    /// Whether `ifindex` is a Linux bridge (its ports, not the bridge, carry frames).
    pub fn is_bridge(&self, ifindex: u32) -> bool {
        self.links.get(&ifindex).is_some_and(|l| l.bridge)
    }

    /// The strict reverse path of `src` (module docs of `crate::antispoof`): the interface
    /// through which the FIB would send a packet to `src`, as the kernel's `rp_filter=1` asks,
    /// and for a route through a bridge the port its FDB maps the next hop's MAC to.
    fn reverse_path(&self, src: &Addr, family: Family) -> Ingress {
        let d = src.as_u128();
        if self.local.contains(&d) {
            return Ingress::Nowhere;
        }
        let Some(r) = self.route(d, family, true) else {
            return Ingress::Nowhere;
        };
        let bridge = self.links.get(&r.oif).is_some_and(|l| l.bridge);
        if !bridge {
            return Ingress::Port(r.oif);
        }
        let nh = r.gateway.unwrap_or(*src);
        match self
            .neigh
            .get(&(r.oif, nh.as_u128()))
            .and_then(|mac| self.fdb.get(&(r.oif, *mac)))
        {
            Some(&port) => Ingress::Port(port),
            None => Ingress::Bridge(r.oif),
        }
    }

    /// Whether a packet from `src` that arrived on interface `ingress` came the way the FIB
    /// routes back to `src` (strict reverse-path validation). Sources the kernel's strict
    /// `rp_filter` lets through whatever the route are accepted: the unspecified address
    /// (DHCP's `0.0.0.0`, IPv6 duplicate address detection's `::`) and link-local sources
    /// (`169.254.0.0/16`, `fe80::/10`: ND, router solicitations). One probe for a pod's
    /// address, a host route or a neighbour (precomputed when the FIB is built); a prefix
    /// probe per prefix length for anything else.
    #[inline]
    pub fn source_arrives_on(&self, src: &Addr, family: Family, ingress: u32) -> bool {
        if exempt_source(src, family) {
            return true;
        }
        let from = match self.sources.get(&(src.as_u128(), family_key(family))) {
            Some(from) => *from,
            None => self.reverse_path(src, family),
        };
        match from {
            Ingress::Port(p) => p == ingress,
            Ingress::Bridge(b) => self.links.get(&ingress).and_then(|l| l.master) == Some(b),
            Ingress::Nowhere => false,
        }
    }

    /// The addresses (at most `max`) whose strict reverse path is interface `ifindex` among
    /// those resolved when the FIB was built (a ptp pod's /32 and /128; a bridge port's pod by
    /// its neighbour entry and the FDB): a worker compares a source with these first and asks
    /// [`Fib::source_arrives_on`] only for the others. Same answer, fewer probes.
    pub fn sources_on(&self, ifindex: u32, max: usize) -> Vec<(Addr, Family)> {
        let mut out: Vec<(Addr, Family)> = self
            .sources
            .iter()
            .filter(|(_, from)| **from == Ingress::Port(ifindex))
            .map(|((a, f), _)| {
                let family = if *f == 6 { Family::V6 } else { Family::V4 };
                (Addr(a.to_be_bytes()), family)
            })
            .collect();
        out.sort_unstable_by_key(|(a, f)| (a.as_u128(), family_key(*f)));
        out.truncate(max);
        out
    }

    /// Whether interface `ifindex` faces pods: the main table routes part of a pod range
    /// on-link (no gateway) through it or through the bridge it is a port of (a pod's /32 on
    /// its host veth with the CNI `ptp` plugin or Calico; the pod subnet on `cni0` with the
    /// `bridge` plugin or flannel). An uplink reaches other nodes' pod ranges through a
    /// gateway only, so it is not one.
    pub fn pod_facing(&self, ifindex: u32, pod_ranges: &crate::snapshot::PrefixSet) -> bool {
        let master = self.links.get(&ifindex).and_then(|l| l.master);
        self.input.routes.iter().any(|r| {
            r.gateway.is_none()
                && (r.oif == ifindex || Some(r.oif) == master)
                && pod_ranges.contains(&Addr::from_ip(r.dst), family_of(&r.dst))
        })
    }

    /// The MACs of a frame handed to the node's stack through `kernel_port` (the kxdp-side end
    /// of a veth pair): (destination: the peer's MAC, source: the port's). None when the port
    /// or its peer is unknown.
    pub fn kernel_macs(&self, kernel_port: u32) -> Option<([u8; 6], [u8; 6])> {
        let port = self.links.get(&kernel_port)?;
        let peer = self.links.get(&port.peer?)?;
        Some((peer.mac?, port.mac?))
    }

    /// Next hops known in advance (gateways, host routes such as a pod's /32) that have no
    /// usable neighbour entry yet.
    pub fn unresolved_next_hops(&self) -> Vec<(u32, Addr, Family)> {
        let mut out = Vec::new();
        for r in &self.input.routes {
            let family = family_of(&r.dst);
            let host = match family {
                Family::V4 => r.len == 32,
                Family::V6 => r.len == 128,
            };
            let nh = match (r.gateway, host) {
                (Some(g), _) => Addr::from_ip(g),
                (None, true) => Addr::from_ip(r.dst),
                _ => continue,
            };
            if !self.neigh.contains_key(&(r.oif, nh.as_u128())) {
                out.push((r.oif, nh, family));
            }
        }
        out.truncate(4096);
        out
    }
}

/// Builders of FIB inputs for the unit tests of the stages that read a FIB.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Link, LocalAddr, Neighbour, Route};

    pub fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    /// An Ethernet link `if<ifindex>` whose MAC is six times `mac`.
    pub fn link(ifindex: u32, mac: u8) -> Link {
        Link {
            ifindex,
            name: format!("if{ifindex}"),
            mac: Some([mac; 6]),
            master: None,
            bridge: false,
            veth: false,
            peer: None,
            rx_queues: 1,
        }
    }

    pub fn route(dst: &str, len: u8, oif: u32, gateway: Option<&str>) -> Route {
        Route {
            dst: ip(dst),
            len,
            oif,
            gateway: gateway.map(ip),
            metric: 0,
        }
    }

    pub fn neigh(ifindex: u32, addr: &str, mac: u8) -> Neighbour {
        Neighbour {
            ifindex,
            addr: ip(addr),
            mac: [mac; 6],
        }
    }

    pub fn local(ifindex: u32, addr: &str) -> LocalAddr {
        LocalAddr {
            ifindex,
            addr: ip(addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Addr {
        Addr::from_ip(s.parse().unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn link(ifindex: u32, name: &str, mac: u8) -> Link {
        Link {
            ifindex,
            name: name.into(),
            mac: Some([mac; 6]),
            master: None,
            bridge: false,
            veth: false,
            peer: None,
            rx_queues: 1,
        }
    }

    fn route(dst: &str, len: u8, oif: u32, gw: Option<&str>, metric: u32) -> Route {
        Route {
            dst: ip(dst),
            len,
            oif,
            gateway: gw.map(ip),
            metric,
        }
    }

    fn neigh(ifindex: u32, addr: &str, mac: u8) -> Neighbour {
        Neighbour {
            ifindex,
            addr: ip(addr),
            mac: [mac; 6],
        }
    }

    /// eth0 (1), a ptp pod veth (2), two more (3, 4), the cni0 bridge (10) with ports 11 and
    /// 12, a wireguard-like link without MAC (20), a kernel port pair (30 ↔ 31).
    fn fib() -> Fib {
        let mut links = vec![
            link(1, "eth0", 1),
            link(2, "veth-a", 2),
            link(3, "veth-b", 3),
            link(4, "veth-c", 4),
            link(10, "cni0", 10),
            link(11, "vethb1", 11),
            link(12, "vethb2", 12),
            link(20, "wg0", 0),
            link(30, "kxdp0", 30),
            link(31, "kxdp0-host", 31),
        ];
        links[4].bridge = true;
        links[5].master = Some(10);
        links[6].master = Some(10);
        links[7].mac = None;
        links[8].peer = Some(31);
        links[9].peer = Some(30);
        Fib::new(FibInput {
            links,
            addrs: vec![
                LocalAddr {
                    ifindex: 1,
                    addr: ip("192.168.0.10"),
                },
                LocalAddr {
                    ifindex: 10,
                    addr: ip("10.2.0.1"),
                },
            ],
            routes: vec![
                route("0.0.0.0", 0, 1, Some("192.168.0.1"), 0),
                route("10.1.0.0", 24, 3, None, 100),
                route("10.1.0.0", 24, 4, None, 10),
                route("10.1.0.11", 32, 2, None, 0),
                route("10.2.0.0", 24, 10, None, 0),
                route("10.9.0.0", 16, 20, None, 0),
                route("2001:db8::", 64, 1, None, 0),
            ],
            neighbours: vec![
                neigh(2, "10.1.0.11", 0xa1),
                neigh(1, "192.168.0.1", 0xee),
                neigh(10, "10.2.0.5", 0xb5),
                neigh(10, "10.2.0.6", 0xb6),
                neigh(1, "2001:db8::7", 0x77),
            ],
            fdb: vec![FdbEntry {
                bridge: 10,
                port: 12,
                mac: [0xb5; 6],
            }],
            ..Default::default()
        })
    }

    #[test]
    fn longest_prefix_then_metric_then_neighbour() {
        let f = fib();
        // /32 on-link with a neighbour.
        assert_eq!(
            f.lookup(&a("10.1.0.11"), Family::V4),
            Ok(Hop::Port {
                ifindex: 2,
                dst_mac: [0xa1; 6],
                src_mac: [2; 6]
            })
        );
        // /24: the lower metric wins; no neighbour known yet.
        assert_eq!(
            f.lookup(&a("10.1.0.12"), Family::V4),
            Err(Miss::NoNeighbour(4, a("10.1.0.12")))
        );
        // Default route: the gateway's MAC.
        assert_eq!(
            f.lookup(&a("203.0.113.7"), Family::V4),
            Ok(Hop::Port {
                ifindex: 1,
                dst_mac: [0xee; 6],
                src_mac: [1; 6]
            })
        );
        // IPv6 on-link; no IPv6 default route.
        assert_eq!(
            f.lookup(&a("2001:db8::7"), Family::V6),
            Ok(Hop::Port {
                ifindex: 1,
                dst_mac: [0x77; 6],
                src_mac: [1; 6]
            })
        );
        assert_eq!(f.lookup(&a("2001:db9::1"), Family::V6), Err(Miss::NoRoute));
    }

    #[test]
    fn bridge_routes_leave_on_the_port_the_fdb_names() {
        let f = fib();
        assert_eq!(
            f.lookup(&a("10.2.0.5"), Family::V4),
            Ok(Hop::Port {
                ifindex: 12,
                dst_mac: [0xb5; 6],
                src_mac: [10; 6]
            })
        );
        // Neighbour known, MAC not (yet) learned on any port.
        assert_eq!(
            f.lookup(&a("10.2.0.6"), Family::V4),
            Err(Miss::NoNeighbour(10, a("10.2.0.6")))
        );
    }

    #[test]
    fn local_addresses_go_to_the_kernel_and_mac_less_links_have_no_macs() {
        let f = fib();
        assert_eq!(f.lookup(&a("192.168.0.10"), Family::V4), Ok(Hop::Kernel));
        assert_eq!(f.lookup(&a("10.2.0.1"), Family::V4), Ok(Hop::Kernel));
        assert_eq!(
            f.lookup(&a("10.9.1.1"), Family::V4),
            Ok(Hop::Port {
                ifindex: 20,
                dst_mac: [0; 6],
                src_mac: [0; 6]
            })
        );
        assert_eq!(f.kernel_macs(30), Some(([31; 6], [30; 6])));
        assert_eq!(f.kernel_macs(1), None);
    }

    #[test]
    fn precomputed_destinations_agree_with_the_full_lookup() {
        let f = fib();
        // 2 local addresses, 1 host route, 5 neighbours (one of them the host route's).
        assert_eq!(f.resolved.len(), 7);
        for dst in [
            "10.1.0.11",
            "10.1.0.12",
            "192.168.0.1",
            "192.168.0.10",
            "10.2.0.1",
            "10.2.0.5",
            "10.2.0.6",
            "203.0.113.7",
            "2001:db8::7",
            "2001:db9::1",
            "10.9.1.1",
        ] {
            let family = family_of(&ip(dst));
            assert_eq!(
                f.lookup(&a(dst), family),
                f.resolve(&a(dst), family),
                "{dst}"
            );
        }
        // An IPv4 destination looked up as IPv6 (v4-mapped) is not the IPv4 lookup's.
        assert_eq!(f.lookup(&a("10.1.0.11"), Family::V6), Err(Miss::NoRoute));
    }

    #[test]
    fn next_hops_to_resolve() {
        let f = fib();
        let u = f.unresolved_next_hops();
        // The /32 and the gateway are resolved; the on-link /24s are not host routes.
        assert!(u.is_empty(), "{u:?}");
        let mut input = f.input().clone();
        input.neighbours.clear();
        let u = Fib::new(input).unresolved_next_hops();
        assert_eq!(
            u,
            vec![
                (1, a("192.168.0.1"), Family::V4),
                (2, a("10.1.0.11"), Family::V4)
            ]
        );
    }
}
