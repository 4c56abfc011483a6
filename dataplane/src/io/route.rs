//! Where a forwarded packet leaves and with which MAC addresses: the kernel's routes (main table)
//! and neighbour table, read over netlink, kept as an immutable [`RouteTable`] that a refresher
//! thread rebuilds whenever the kernel announces a route, address or neighbour change (netlink
//! multicast groups) and publishes through an `ArcSwap`. Workers look up per packet without a
//! lock or syscall.
//!
//! A next hop the neighbour table does not know (or knows as INCOMPLETE/FAILED) cannot be
//! addressed: the packet is dropped (counted `no-neighbour`) and the refresher asks the kernel
//! to resolve it (`RTM_NEWNEIGH` with `NTF_USE`, what `ip neigh` would trigger by sending), so
//! the next packets of the flow go through.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use kxdp_packet::{Addr, Family};

use super::fd_result;

/// One unicast route of the main table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteEntry {
    pub family: Family,
    pub prefix: u128,
    pub len: u8,
    pub oif: u32,
    /// The gateway; None: on-link (the destination itself is the next hop).
    pub gateway: Option<Addr>,
    pub metric: u32,
}

/// The result of a lookup: leave through `oif` toward `mac`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    pub oif: u32,
    pub mac: [u8; 6],
}

/// Why a lookup found no next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    NoRoute,
    /// The route's next hop (oif, address) has no usable neighbour entry.
    NoNeighbour(u32, Addr),
}

/// Routes (longest prefix first) and neighbours, as of one read of the kernel's tables.
#[derive(Clone, Debug, Default)]
pub struct RouteTable {
    routes: Vec<RouteEntry>,
    neigh: HashMap<(u32, u128), [u8; 6]>,
    /// Interface MAC addresses.
    pub link_macs: HashMap<u32, [u8; 6]>,
    /// Interface RX queue counts.
    pub link_queues: HashMap<u32, u32>,
    /// The namespace's own addresses (every interface).
    pub local_addrs: Vec<std::net::IpAddr>,
}

fn mask(family: Family, len: u8) -> u128 {
    let bits = match family {
        Family::V4 => 32u32,
        Family::V6 => 128,
    };
    let len = (len as u32).min(bits);
    if len == 0 {
        return 0;
    }
    let m = if bits == 32 {
        (u32::MAX << (32 - len)) as u128
    } else {
        u128::MAX << (128 - len)
    };
    // IPv4 addresses sit in the low 32 bits of the u128 (v4-mapped form: ::ffff:a.b.c.d),
    // whose upper bits are the same for every IPv4 address.
    if bits == 32 {
        m | !(u32::MAX as u128)
    } else {
        m
    }
}

impl RouteTable {
    pub fn new(
        mut routes: Vec<RouteEntry>,
        neigh: HashMap<(u32, u128), [u8; 6]>,
        link_macs: HashMap<u32, [u8; 6]>,
    ) -> RouteTable {
        routes.sort_by(|a, b| b.len.cmp(&a.len).then(a.metric.cmp(&b.metric)));
        RouteTable {
            routes,
            neigh,
            link_macs,
            link_queues: HashMap::new(),
            local_addrs: Vec::new(),
        }
    }

    pub fn routes(&self) -> &[RouteEntry] {
        &self.routes
    }

    /// The route for `dst` (longest prefix, then lowest metric).
    pub fn route(&self, dst: &Addr, family: Family) -> Option<&RouteEntry> {
        let d = dst.as_u128();
        self.routes.iter().find(|r| {
            r.family == family && d & mask(family, r.len) == r.prefix & mask(family, r.len)
        })
    }

    /// Where a packet to `dst` leaves and the MAC it is sent to.
    pub fn lookup(&self, dst: &Addr, family: Family) -> Result<NextHop, Miss> {
        let r = self.route(dst, family).ok_or(Miss::NoRoute)?;
        let nh = r.gateway.unwrap_or(*dst);
        match self.neigh.get(&(r.oif, nh.as_u128())) {
            Some(mac) => Ok(NextHop {
                oif: r.oif,
                mac: *mac,
            }),
            None => Err(Miss::NoNeighbour(r.oif, nh)),
        }
    }

    /// Next hops known in advance (gateways, host routes such as a pod's /32) that have no
    /// usable neighbour entry yet.
    pub fn unresolved_next_hops(&self) -> Vec<(u32, Addr, Family)> {
        let mut out = Vec::new();
        for r in &self.routes {
            let host = match r.family {
                Family::V4 => r.len == 32,
                Family::V6 => r.len == 128,
            };
            let nh = match (r.gateway, host) {
                (Some(g), _) => g,
                (None, true) => Addr(r.prefix.to_be_bytes()),
                _ => continue,
            };
            if !self.neigh.contains_key(&(r.oif, nh.as_u128())) {
                out.push((r.oif, nh, r.family));
            }
        }
        out.truncate(4096);
        out
    }

    /// Reads the calling thread's namespace's tables.
    pub fn read() -> io::Result<RouteTable> {
        let mut routes = Vec::new();
        let mut neigh = HashMap::new();
        let mut link_macs = HashMap::new();
        let mut link_queues = HashMap::new();
        let mut local_addrs = Vec::new();
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            dump(RTM_GETROUTE, family, |kind, body| {
                if kind == RTM_NEWROUTE {
                    if let Some(r) = parse_route(body) {
                        routes.push(r);
                    }
                }
            })?;
            dump(RTM_GETNEIGH, family, |kind, body| {
                if kind == RTM_NEWNEIGH {
                    if let Some((k, mac)) = parse_neigh(body) {
                        neigh.insert(k, mac);
                    }
                }
            })?;
        }
        dump(RTM_GETLINK, libc::AF_UNSPEC as u8, |kind, body| {
            if kind == RTM_NEWLINK {
                if let Some((idx, mac, queues)) = parse_link(body) {
                    link_macs.insert(idx, mac);
                    link_queues.insert(idx, queues);
                }
            }
        })?;
        dump(RTM_GETADDR, libc::AF_UNSPEC as u8, |kind, body| {
            if kind == RTM_NEWADDR {
                if let Some(a) = parse_addr(body) {
                    local_addrs.push(a);
                }
            }
        })?;
        let mut t = RouteTable::new(routes, neigh, link_macs);
        t.link_queues = link_queues;
        t.local_addrs = local_addrs;
        Ok(t)
    }
}

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;

fn netlink_socket(groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; checked.
    let fd = fd_result(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    } as libc::c_long)?;
    // SAFETY: a zeroed sockaddr_nl with our groups; bind to it.
    let r = unsafe {
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn send(fd: &OwnedFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: `msg` is readable for its length; the kernel address is zeroed.
    let r = unsafe {
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Calls `f(type, body)` for every message of a dump of `kind` for `family`.
fn dump(kind: u16, family: u8, mut f: impl FnMut(u16, &[u8])) -> io::Result<()> {
    let fd = netlink_socket(0)?;
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    // The family byte leads rtmsg, ndmsg and ifinfomsg alike; pad to the largest header (16).
    msg.push(family);
    msg.extend_from_slice(&[0u8; 15]);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());
    send(&fd, &msg)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(&fd, &mut buf)?;
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            let t = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
            if len < 16 || off + len > n {
                break;
            }
            match t {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let err = i32::from_ne_bytes(buf[off + 16..off + 20].try_into().unwrap());
                    return if err == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-err))
                    };
                }
                _ => f(t, &buf[off + 16..off + len]),
            }
            off += (len + 3) & !3;
        }
    }
}

/// Iterates rtattrs: (type, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let t = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((t, payload))
    })
}

fn addr_of(family: Family, p: &[u8]) -> Option<Addr> {
    let ip: std::net::IpAddr = match family {
        Family::V4 => <[u8; 4]>::try_from(p).ok()?.into(),
        Family::V6 => <[u8; 16]>::try_from(p).ok()?.into(),
    };
    Some(Addr::from_ip(ip))
}

fn family_of(f: u8) -> Option<Family> {
    match f as i32 {
        libc::AF_INET => Some(Family::V4),
        libc::AF_INET6 => Some(Family::V6),
        _ => None,
    }
}

fn parse_route(b: &[u8]) -> Option<RouteEntry> {
    const RTA_DST: u16 = 1;
    const RTA_OIF: u16 = 4;
    const RTA_GATEWAY: u16 = 5;
    const RTA_PRIORITY: u16 = 6;
    const RTA_TABLE: u16 = 15;
    const RTN_UNICAST: u8 = 1;
    const RT_TABLE_MAIN: u32 = 254;
    if b.len() < 12 {
        return None;
    }
    let family = family_of(b[0])?;
    let (len, mut table, kind) = (b[1], b[4] as u32, b[7]);
    if kind != RTN_UNICAST {
        return None;
    }
    let mut r = RouteEntry {
        family,
        prefix: Addr::from_ip(match family {
            Family::V4 => std::net::Ipv4Addr::UNSPECIFIED.into(),
            Family::V6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
        })
        .as_u128(),
        len,
        oif: 0,
        gateway: None,
        metric: 0,
    };
    for (t, p) in attrs(&b[12..]) {
        match t {
            RTA_DST => r.prefix = addr_of(family, p)?.as_u128(),
            RTA_OIF if p.len() == 4 => r.oif = u32::from_ne_bytes(p.try_into().unwrap()),
            RTA_GATEWAY => r.gateway = addr_of(family, p),
            RTA_PRIORITY if p.len() == 4 => r.metric = u32::from_ne_bytes(p.try_into().unwrap()),
            RTA_TABLE if p.len() == 4 => table = u32::from_ne_bytes(p.try_into().unwrap()),
            _ => {}
        }
    }
    (table == RT_TABLE_MAIN && r.oif != 0).then_some(r)
}

fn parse_neigh(b: &[u8]) -> Option<((u32, u128), [u8; 6])> {
    const NDA_DST: u16 = 1;
    const NDA_LLADDR: u16 = 2;
    const NUD_INCOMPLETE: u16 = 0x01;
    const NUD_FAILED: u16 = 0x20;
    const NUD_NOARP: u16 = 0x40;
    if b.len() < 12 {
        return None;
    }
    let family = family_of(b[0])?;
    let ifindex = i32::from_ne_bytes(b[4..8].try_into().unwrap()) as u32;
    let state = u16::from_ne_bytes([b[8], b[9]]);
    if state & (NUD_INCOMPLETE | NUD_FAILED | NUD_NOARP) != 0 || state == 0 {
        return None;
    }
    let (mut dst, mut mac) = (None, None);
    for (t, p) in attrs(&b[12..]) {
        match t {
            NDA_DST => dst = addr_of(family, p),
            NDA_LLADDR => mac = <[u8; 6]>::try_from(p).ok(),
            _ => {}
        }
    }
    Some(((ifindex, dst?.as_u128()), mac?))
}

fn parse_link(b: &[u8]) -> Option<(u32, [u8; 6], u32)> {
    const IFLA_ADDRESS: u16 = 1;
    const IFLA_NUM_RX_QUEUES: u16 = 32;
    if b.len() < 16 {
        return None;
    }
    let ifindex = i32::from_ne_bytes(b[4..8].try_into().unwrap()) as u32;
    let (mut mac, mut queues) = (None, 1);
    for (t, p) in attrs(&b[16..]) {
        match t {
            IFLA_ADDRESS => mac = <[u8; 6]>::try_from(p).ok(),
            IFLA_NUM_RX_QUEUES if p.len() == 4 => {
                queues = u32::from_ne_bytes(p.try_into().unwrap()).max(1)
            }
            _ => {}
        }
    }
    Some((ifindex, mac?, queues))
}

fn parse_addr(b: &[u8]) -> Option<std::net::IpAddr> {
    const IFA_ADDRESS: u16 = 1;
    const IFA_LOCAL: u16 = 2;
    if b.len() < 8 {
        return None;
    }
    let family = family_of(b[0])?;
    let (mut local, mut address) = (None, None);
    for (t, p) in attrs(&b[8..]) {
        match t {
            IFA_LOCAL => local = addr_of(family, p),
            IFA_ADDRESS => address = addr_of(family, p),
            _ => {}
        }
    }
    local.or(address).map(|a| a.to_ip(family))
}

/// Asks the kernel to resolve `addr` on `ifindex` (RTM_NEWNEIGH with NTF_USE).
pub fn request_resolution(ifindex: u32, addr: &Addr, family: Family) -> io::Result<()> {
    const NTF_USE: u8 = 0x01;
    const NUD_NONE: u16 = 0;
    const NDA_DST: u16 = 1;
    let ip = match family {
        Family::V4 => addr.v4_octets().to_vec(),
        Family::V6 => addr.0.to_vec(),
    };
    let mut msg = Vec::with_capacity(48);
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&RTM_NEWNEIGH.to_ne_bytes());
    msg.extend_from_slice(
        &((libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_REPLACE)
            as u16)
            .to_ne_bytes(),
    );
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.push(match family {
        Family::V4 => libc::AF_INET as u8,
        Family::V6 => libc::AF_INET6 as u8,
    });
    msg.extend_from_slice(&[0, 0, 0]);
    msg.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    msg.extend_from_slice(&NUD_NONE.to_ne_bytes());
    msg.push(NTF_USE);
    msg.push(0);
    msg.extend_from_slice(&((4 + ip.len()) as u16).to_ne_bytes());
    msg.extend_from_slice(&NDA_DST.to_ne_bytes());
    msg.extend_from_slice(&ip);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());
    super::netlink_request(libc::NETLINK_ROUTE, &msg)
}

/// The published route table and the thread that keeps it current.
pub struct Routes {
    pub table: Arc<ArcSwap<RouteTable>>,
    /// Next hops workers could not address; the refresher asks the kernel to resolve them.
    pub unresolved: crossbeam::channel::Sender<(u32, Addr, Family)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Routes {
    /// Reads the tables and starts the refresher (in the calling thread's namespace).
    pub fn start() -> io::Result<Routes> {
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_NEIGH: u32 = 0x4;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV4_ROUTE: u32 = 0x40;
        const RTMGRP_IPV6_IFADDR: u32 = 0x100;
        const RTMGRP_IPV6_ROUTE: u32 = 0x400;
        // Subscribe before the first read so that no change is missed in between.
        let events = netlink_socket(
            RTMGRP_LINK
                | RTMGRP_NEIGH
                | RTMGRP_IPV4_IFADDR
                | RTMGRP_IPV4_ROUTE
                | RTMGRP_IPV6_IFADDR
                | RTMGRP_IPV6_ROUTE,
        )?;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: setting a receive timeout with a valid timeval.
        unsafe {
            libc::setsockopt(
                events.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let first = RouteTable::read()?;
        // Resolve the next hops we already know of, so that the first packet toward a pod or
        // gateway the node has not talked to yet is not dropped for want of a MAC address.
        for (oif, a, f) in first.unresolved_next_hops() {
            let _ = request_resolution(oif, &a, f);
        }
        let table = Arc::new(ArcSwap::from_pointee(first));
        let (tx, rx) = crossbeam::channel::bounded::<(u32, Addr, Family)>(1024);
        let stop = Arc::new(AtomicBool::new(false));
        let (t2, s2) = (table.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("kxdp-routes".into())
            .spawn(move || refresher(events, &t2, &rx, &s2))?;
        Ok(Routes {
            table,
            unresolved: tx,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Routes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn refresher(
    events: OwnedFd,
    table: &ArcSwap<RouteTable>,
    unresolved: &crossbeam::channel::Receiver<(u32, Addr, Family)>,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut asked: HashMap<(u32, u128), std::time::Instant> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let mut changed = false;
        match recv(&events, &mut buf) {
            Ok(n) if n > 0 => changed = true,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => changed = true,
            _ => {}
        }
        // Coalesce a burst of changes into one re-read.
        if changed {
            std::thread::sleep(Duration::from_millis(5));
            // SAFETY: draining queued messages without blocking.
            while unsafe {
                libc::recv(
                    events.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            } > 0
            {}
            match RouteTable::read() {
                Ok(t) => {
                    let now = std::time::Instant::now();
                    for (oif, a, f) in t.unresolved_next_hops() {
                        let key = (oif, a.as_u128());
                        if asked
                            .get(&key)
                            .is_none_or(|t| now.duration_since(*t) >= Duration::from_secs(5))
                        {
                            asked.insert(key, now);
                            let _ = request_resolution(oif, &a, f);
                        }
                    }
                    table.store(Arc::new(t))
                }
                Err(e) => eprintln!("kxdp: reading routes and neighbours: {e}"),
            }
        }
        while let Ok((oif, addr, family)) = unresolved.try_recv() {
            let now = std::time::Instant::now();
            let key = (oif, addr.as_u128());
            if asked
                .get(&key)
                .is_some_and(|t| now.duration_since(*t) < Duration::from_millis(500))
            {
                continue;
            }
            asked.insert(key, now);
            let _ = request_resolution(oif, &addr, family);
        }
        if asked.len() > 4096 {
            asked.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Addr {
        Addr::from_ip(s.parse().unwrap())
    }

    fn r(prefix: &str, len: u8, oif: u32, gw: Option<&str>, metric: u32) -> RouteEntry {
        RouteEntry {
            family: Family::V4,
            prefix: a(prefix).as_u128(),
            len,
            oif,
            gateway: gw.map(a),
            metric,
        }
    }

    #[test]
    fn longest_prefix_then_metric_and_neighbours() {
        let mut neigh = HashMap::new();
        neigh.insert((2, a("10.1.0.11").as_u128()), [2; 6]);
        neigh.insert((1, a("192.168.0.1").as_u128()), [1; 6]);
        let t = RouteTable::new(
            vec![
                r("0.0.0.0", 0, 1, Some("192.168.0.1"), 0),
                r("10.1.0.0", 24, 3, None, 100),
                r("10.1.0.0", 24, 4, None, 10),
                r("10.1.0.11", 32, 2, None, 0),
            ],
            neigh,
            HashMap::new(),
        );
        // /32 on-link with a neighbour.
        assert_eq!(
            t.lookup(&a("10.1.0.11"), Family::V4),
            Ok(NextHop {
                oif: 2,
                mac: [2; 6]
            })
        );
        // /24: the lower metric wins; no neighbour known yet.
        assert_eq!(
            t.lookup(&a("10.1.0.12"), Family::V4),
            Err(Miss::NoNeighbour(4, a("10.1.0.12")))
        );
        // Default route: the gateway's MAC.
        assert_eq!(
            t.lookup(&a("203.0.113.7"), Family::V4),
            Ok(NextHop {
                oif: 1,
                mac: [1; 6]
            })
        );
        // No IPv6 route at all.
        assert_eq!(t.lookup(&a("2001:db8::1"), Family::V6), Err(Miss::NoRoute));
    }
}
