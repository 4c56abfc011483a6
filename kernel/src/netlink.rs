//! Route netlink through `netlink-sys` (the socket) and `netlink-packet-route` (the messages):
//! one-shot dumps of links, addresses, routes, neighbours and the bridge forwarding database,
//! a socket subscribed to their change events, and the two requests kxdp makes (ask the kernel
//! to resolve a neighbour; remove an XDP program attached the old way).
//!
//! Everything is returned as plain records ([`Dump`]): the layers above never see netlink types.
//! Synchronous sockets: the callers are the route refresher thread and startup, never a worker.

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage, LinkXdp};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// One network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    pub name: String,
    /// None for interfaces without an Ethernet address (loopback has one of zeros; tun none).
    pub mac: Option<[u8; 6]>,
    /// The bridge (or bond) this interface is enslaved to (IFLA_MASTER).
    pub master: Option<u32>,
    /// The interface is a Linux bridge.
    pub bridge: bool,
    /// The interface is one end of a veth pair (an XDP program on it takes GSO from its peer).
    pub veth: bool,
    /// The other end of a veth pair, when in this namespace (IFLA_LINK).
    pub peer: Option<u32>,
    pub rx_queues: u32,
}

/// One address of the node (any interface).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalAddr {
    pub ifindex: u32,
    pub addr: IpAddr,
}

/// One unicast route of the main table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The destination network (address bits beyond `len` as the kernel reports them: zero).
    pub dst: IpAddr,
    pub len: u8,
    pub oif: u32,
    /// None: on-link (the destination itself is the next hop).
    pub gateway: Option<IpAddr>,
    pub metric: u32,
}

/// One usable IPv4 ARP / IPv6 neighbour discovery entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    pub mac: [u8; 6],
}

/// One learned (or static) entry of a bridge's forwarding database: frames to `mac` leave
/// the bridge through `port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdbEntry {
    pub bridge: u32,
    pub port: u32,
    pub mac: [u8; 6],
}

/// The namespace's tables, as of one read.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    pub links: Vec<Link>,
    pub addrs: Vec<LocalAddr>,
    pub routes: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    /// Those of `neighbours` the kernel holds as STALE: usable, but nothing has confirmed them
    /// lately, and the kernel's garbage collector may remove them.
    pub stale: Vec<(u32, IpAddr)>,
    /// Next hops the kernel tried to resolve and got no answer from (FAILED).
    pub failed: Vec<(u32, IpAddr)>,
    pub fdb: Vec<FdbEntry>,
}

fn open(groups: u32) -> io::Result<Socket> {
    let mut s = Socket::new(NETLINK_ROUTE)?;
    s.bind(&SocketAddr::new(0, groups))?;
    Ok(s)
}

fn send(s: &Socket, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    req.finalize();
    let mut buf = vec![0; req.header.length as usize];
    req.serialize(&mut buf[..]);
    s.send(&buf, 0)?;
    Ok(())
}

/// Receives until the end of a dump (or the ACK of a request), passing every route message to
/// `f`.
fn receive(s: &Socket, mut f: impl FnMut(RouteNetlinkMessage)) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = s.recv(&mut &mut buf[..], 0)?;
        let mut off = 0;
        while off < n.min(buf.len()) {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(()),
                        Some(_) => Err(e.to_io()),
                    }
                }
                NetlinkPayload::InnerMessage(m) => f(m),
                _ => {}
            }
            if len == 0 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}

/// Sends `msg` with `flags` on a socket of its own and passes every answer to `f` until the
/// dump's end or the request's acknowledgement.
fn exchange(
    msg: RouteNetlinkMessage,
    flags: u16,
    f: impl FnMut(RouteNetlinkMessage),
) -> io::Result<()> {
    let s = open(0)?;
    send(&s, msg, flags)?;
    receive(&s, f)
}

fn dump(msg: RouteNetlinkMessage, f: impl FnMut(RouteNetlinkMessage)) -> io::Result<()> {
    exchange(msg, NLM_F_REQUEST | NLM_F_DUMP, f)
}

fn request(msg: RouteNetlinkMessage) -> io::Result<()> {
    acked(msg, NLM_F_CREATE | NLM_F_REPLACE)
}

fn mac_of(b: &[u8]) -> Option<[u8; 6]> {
    <[u8; 6]>::try_from(b).ok()
}

fn link_of(m: &LinkMessage) -> Link {
    let mut l = Link {
        ifindex: m.header.index,
        name: String::new(),
        mac: None,
        master: None,
        bridge: false,
        veth: false,
        peer: None,
        rx_queues: 1,
    };
    let mut elsewhere = false;
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Address(b) => l.mac = mac_of(b),
            LinkAttribute::Controller(i) => l.master = Some(*i),
            LinkAttribute::Link(i) if *i != 0 && *i != m.header.index => l.peer = Some(*i),
            LinkAttribute::LinkNetNsId(_) => elsewhere = true,
            LinkAttribute::NumRxQueues(q) => l.rx_queues = (*q).max(1),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        LinkInfo::Kind(InfoKind::Bridge) => l.bridge = true,
                        LinkInfo::Kind(InfoKind::Veth) => l.veth = true,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if elsewhere {
        // IFLA_LINK then names an interface of that other namespace.
        l.peer = None;
    }
    l
}

fn addr_of(m: &AddressMessage) -> Option<LocalAddr> {
    let (mut local, mut address) = (None, None);
    for a in &m.attributes {
        match a {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    Some(LocalAddr {
        ifindex: m.header.index,
        addr: local.or(address)?,
    })
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some((*v4).into()),
        RouteAddress::Inet6(v6) => Some((*v6).into()),
        _ => None,
    }
}

fn route_of(m: &RouteMessage) -> Option<Route> {
    const RT_TABLE_MAIN: u32 = 254;
    if m.header.kind != RouteType::Unicast {
        return None;
    }
    let mut table = m.header.table as u32;
    let mut r = Route {
        dst: match m.header.address_family {
            AddressFamily::Inet => std::net::Ipv4Addr::UNSPECIFIED.into(),
            AddressFamily::Inet6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
            _ => return None,
        },
        len: m.header.destination_prefix_length,
        oif: 0,
        gateway: None,
        metric: 0,
    };
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => r.dst = route_addr(d)?,
            RouteAttribute::Oif(i) => r.oif = *i,
            RouteAttribute::Gateway(g) => r.gateway = route_addr(g),
            RouteAttribute::Priority(p) => r.metric = *p,
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    (table == RT_TABLE_MAIN && r.oif != 0).then_some(r)
}

fn usable(state: NeighbourState) -> bool {
    !matches!(
        state,
        NeighbourState::Incomplete
            | NeighbourState::Failed
            | NeighbourState::Noarp
            | NeighbourState::None
    )
}

/// The interface and address of a neighbour entry, whatever its state.
fn neighbour_addr(m: &NeighbourMessage) -> Option<(u32, IpAddr)> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
            Some((m.header.ifindex, (*v4).into()))
        }
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
            Some((m.header.ifindex, (*v6).into()))
        }
        _ => None,
    })
}

fn neighbour_of(m: &NeighbourMessage) -> Option<Neighbour> {
    if !usable(m.header.state) {
        return None;
    }
    let (mut addr, mut mac) = (None, None);
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                addr = Some((*v4).into())
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                addr = Some((*v6).into())
            }
            NeighbourAttribute::LinkLayerAddress(b) => mac = mac_of(b),
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex: m.header.ifindex,
        addr: addr?,
        mac: mac?,
    })
}

/// A bridge FDB entry that says where frames to a MAC leave: entries the bridge learned or was
/// given for a port (NTF_MASTER). The bridge's own addresses (`permanent`, "local") and the
/// ports' own hardware entries (NTF_SELF) say nothing about where a neighbour is.
fn fdb_of(m: &NeighbourMessage) -> Option<FdbEntry> {
    if m.header.state == NeighbourState::Permanent || m.header.flags.contains(NeighbourFlags::Own) {
        return None;
    }
    let (mut bridge, mut mac) = (None, None);
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Controller(b) => bridge = Some(*b),
            NeighbourAttribute::LinkLayerAddress(b) => mac = mac_of(b),
            _ => {}
        }
    }
    Some(FdbEntry {
        bridge: bridge?,
        port: m.header.ifindex,
        mac: mac?,
    })
}

/// Reads the calling thread's namespace's links, addresses, main-table routes, neighbours
/// and bridge forwarding databases.
pub fn dump_all() -> io::Result<Dump> {
    let mut d = Dump::default();
    dump(RouteNetlinkMessage::GetLink(LinkMessage::default()), |m| {
        if let RouteNetlinkMessage::NewLink(l) = m {
            d.links.push(link_of(&l));
        }
    })?;
    dump(
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        |m| {
            if let RouteNetlinkMessage::NewAddress(a) = m {
                d.addrs.extend(addr_of(&a));
            }
        },
    )?;
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut rm = RouteMessage::default();
        rm.header.address_family = family;
        dump(RouteNetlinkMessage::GetRoute(rm), |m| {
            if let RouteNetlinkMessage::NewRoute(r) = m {
                d.routes.extend(route_of(&r));
            }
        })?;
        let mut nm = NeighbourMessage::default();
        nm.header.family = family;
        dump(RouteNetlinkMessage::GetNeighbour(nm), |m| {
            if let RouteNetlinkMessage::NewNeighbour(n) = m {
                match n.header.state {
                    NeighbourState::Stale => d.stale.extend(neighbour_addr(&n)),
                    NeighbourState::Failed => d.failed.extend(neighbour_addr(&n)),
                    _ => {}
                }
                d.neighbours.extend(neighbour_of(&n));
            }
        })?;
    }
    let mut nm = NeighbourMessage::default();
    nm.header.family = AddressFamily::Bridge;
    dump(RouteNetlinkMessage::GetNeighbour(nm), |m| {
        if let RouteNetlinkMessage::NewNeighbour(n) = m {
            d.fdb.extend(fdb_of(&n));
        }
    })?;
    Ok(d)
}

/// Asks the kernel to resolve `addr` on `ifindex` (RTM_NEWNEIGH with NTF_USE: the kernel
/// starts ARP / neighbour discovery as if it were about to send there).
pub fn request_resolution(ifindex: u32, addr: IpAddr) -> io::Result<()> {
    let mut m = NeighbourMessage::default();
    m.header.family = match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    m.header.ifindex = ifindex;
    m.header.state = NeighbourState::None;
    m.header.flags = NeighbourFlags::Use;
    m.attributes
        .push(NeighbourAttribute::Destination(match addr {
            IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
            IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
        }));
    request(RouteNetlinkMessage::NewNeighbour(m))
}

/// Asks the kernel to probe `addr` on `ifindex` now: its entry set to PROBE with `mac` (the MAC
/// it has), so the kernel sends a unicast ARP / neighbour solicitation at once and marks it
/// REACHABLE on the answer. `NTF_USE` does nothing to a REACHABLE entry and lets a STALE one wait
/// `delay_first_probe_time` (5 s) before probing.
pub fn probe_neighbour(ifindex: u32, addr: IpAddr, mac: [u8; 6]) -> io::Result<()> {
    let mut m = NeighbourMessage::default();
    m.header.family = match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    m.header.ifindex = ifindex;
    m.header.state = NeighbourState::Probe;
    m.attributes
        .push(NeighbourAttribute::Destination(match addr {
            IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
            IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
        }));
    m.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    request(RouteNetlinkMessage::NewNeighbour(m))
}

/// Sends one request with `flags` (plus REQUEST and ACK) and waits for its acknowledgement (the
/// kernel's error, if any). For the traffic-control requests of [`crate::tc`].
pub(crate) fn acked(msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
    exchange(msg, NLM_F_REQUEST | NLM_F_ACK | flags, |_| {})
}

/// A dump request (`msg` says what), every answer passed to `f`. For [`crate::tc`].
pub(crate) fn dumped(
    msg: RouteNetlinkMessage,
    f: impl FnMut(RouteNetlinkMessage),
) -> io::Result<()> {
    dump(msg, f)
}

/// The packets interface `ifindex` dropped on their way out (`tx_dropped` of its 64-bit
/// statistics): for a tap, the frames it had no room for in a queue.
pub fn link_tx_dropped(ifindex: u32) -> io::Result<u64> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    let mut dropped = None;
    exchange(
        RouteNetlinkMessage::GetLink(m),
        NLM_F_REQUEST | NLM_F_ACK,
        |msg| {
            if let RouteNetlinkMessage::NewLink(l) = msg {
                for a in l.attributes {
                    if let LinkAttribute::Stats64(st) = a {
                        dropped = Some(st.tx_dropped);
                    }
                }
            }
        },
    )?;
    dropped.ok_or_else(|| io::Error::other(format!("interface {ifindex}: no statistics")))
}

/// RTM_SETLINK with IFLA_XDP { fd, flags }: attaches (fd >= 0) or removes (fd = -1) an XDP
/// program the old way, which outlives the process. kxdp attaches with BPF links; this
/// removes programs others (or an older kxdp) left, and serves the tests that leave one.
pub fn set_link_xdp(ifindex: u32, fd: i32, flags: u32) -> io::Result<()> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    m.attributes.push(LinkAttribute::Xdp(vec![
        LinkXdp::Fd(fd),
        LinkXdp::Flags(flags),
    ]));
    acked(RouteNetlinkMessage::SetLink(m), 0)
}

// Attribute types inside IFLA_AF_SPEC → AF_INET → IFLA_INET_CONF: the IPV4_DEVCONF_* indices
// of include/uapi/linux/ip.h (1-based; the kernel's `inet_validate_link_af` refuses 0 and
// anything above IPV4_DEVCONF_MAX).
pub const IFLA_INET_CONF: u16 = 1;
pub const IPV4_DEVCONF_FORWARDING: u16 = 1;
pub const IPV4_DEVCONF_RP_FILTER: u16 = 8;
pub const IPV4_DEVCONF_ACCEPT_LOCAL: u16 = 23;

/// The `IFLA_AF_SPEC` attribute of an RTM_SETLINK that sets IPv4 per-device settings
/// (`ipv4`: IPV4_DEVCONF_* index and value, what `conf/IF/...` under /proc/sys shows) and,
/// with `addr_gen_none`, IPv6's address generation mode to none (IFLA_INET6_ADDR_GEN_MODE 1:
/// no link-local address, so no DAD, router or neighbour solicitations from the interface).
///
/// The IPv4 part is built by hand: the kernel's set path (`inet_set_link_af`) reads
/// IFLA_INET_CONF as nested u32 attributes whose type is the index, not the flat u32 array a
/// dump carries, and netlink-packet-route's `AfSpecInet::DevConf` emits the flat array while
/// its `DevConfRequest` leaves out every zero value, so `rp_filter 0` could not be set.
pub fn devconf_af_spec(ipv4: &[(u16, u32)], addr_gen_none: bool) -> LinkAttribute {
    use netlink_packet_core::{DefaultNla, Emitable, NLA_F_NESTED};
    use netlink_packet_route::link::{AfSpecInet, AfSpecInet6, AfSpecUnspec, In6AddrGenMode};
    let mut spec = Vec::new();
    if !ipv4.is_empty() {
        let conf: Vec<DefaultNla> = ipv4
            .iter()
            .map(|&(index, value)| DefaultNla::new(index, value.to_ne_bytes().to_vec()))
            .collect();
        let mut nested = vec![0u8; conf.as_slice().buffer_len()];
        conf.as_slice().emit(&mut nested);
        spec.push(AfSpecUnspec::Inet(vec![AfSpecInet::Other(
            DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, nested),
        )]));
    }
    if addr_gen_none {
        spec.push(AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(
            In6AddrGenMode::None,
        )]));
    }
    LinkAttribute::AfSpecUnspec(spec)
}

/// Sets IPv4 per-device settings of `ifindex` ([`devconf_af_spec`]) with one RTM_SETLINK: needs
/// only CAP_NET_ADMIN, where a write under /proc/sys needs a writable /proc/sys, which a
/// container's is not.
pub fn set_ipv4_devconf(ifindex: u32, ipv4: &[(u16, u32)]) -> io::Result<()> {
    set_devconf(ifindex, ipv4, false)
}

/// [`set_ipv4_devconf`], and with `addr_gen_none` IPv6's address generation mode to none
/// (before the interface is up: it then sends nothing of its own).
pub fn set_devconf(ifindex: u32, ipv4: &[(u16, u32)], addr_gen_none: bool) -> io::Result<()> {
    let mut m = LinkMessage::default();
    m.header.index = ifindex;
    m.attributes.push(devconf_af_spec(ipv4, addr_gen_none));
    acked(RouteNetlinkMessage::SetLink(m), 0)
}

/// A socket subscribed to link, address, route and neighbour (including bridge FDB) changes.
pub struct Events {
    socket: Socket,
    buf: Vec<u8>,
}

impl Events {
    pub fn subscribe() -> io::Result<Events> {
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_NEIGH: u32 = 0x4;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV4_ROUTE: u32 = 0x40;
        const RTMGRP_IPV6_IFADDR: u32 = 0x100;
        const RTMGRP_IPV6_ROUTE: u32 = 0x400;
        let socket = open(
            RTMGRP_LINK
                | RTMGRP_NEIGH
                | RTMGRP_IPV4_IFADDR
                | RTMGRP_IPV4_ROUTE
                | RTMGRP_IPV6_IFADDR
                | RTMGRP_IPV6_ROUTE,
        )?;
        Ok(Events {
            socket,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Only link and address changes (IPv4 and IPv6): for what follows the node's devices and
    /// addresses.
    pub fn subscribe_links_and_addresses() -> io::Result<Events> {
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV6_IFADDR: u32 = 0x100;
        Ok(Events {
            socket: open(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR)?,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Waits up to `timeout` for a change; true when one (or an overrun, ENOBUFS: changes were
    /// lost, so everything must be re-read) arrived. Queued notifications are drained, so a
    /// burst counts once.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let changed = if crate::sys::poll_readable(self.socket.as_raw_fd(), timeout) {
            match self.socket.recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT) {
                Ok(n) => n > 0,
                Err(e) => e.raw_os_error() == Some(libc::ENOBUFS),
            }
        } else {
            false
        };
        if changed {
            // Coalesce a burst of changes into one re-read.
            std::thread::sleep(Duration::from_millis(5));
            while self
                .socket
                .recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT)
                .is_ok_and(|n| n > 0)
            {}
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A veth's IFLA_LINK is its peer here only when no IFLA_LINK_NETNSID says the peer is in
    /// another namespace (a pod's host-side end: the index is the pod's `eth0`).
    #[test]
    fn a_peer_in_another_namespace_is_not_one_here() {
        let veth = |netnsid: Option<i32>| {
            let mut m = LinkMessage::default();
            m.header.index = 7;
            m.attributes.push(LinkAttribute::IfName("veth1".into()));
            m.attributes.push(LinkAttribute::Link(2));
            m.attributes.extend(netnsid.map(LinkAttribute::LinkNetNsId));
            m.attributes
                .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                    InfoKind::Veth,
                )]));
            link_of(&m)
        };
        let here = veth(None);
        assert!(here.veth);
        assert_eq!(here.peer, Some(2));
        let elsewhere = veth(Some(0));
        assert!(elsewhere.veth);
        assert_eq!(elsewhere.peer, None);
    }
}
