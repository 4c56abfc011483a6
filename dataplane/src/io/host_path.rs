//! The host path: what kxdp sets up on the node so that
//!
//! - the node's own processes (and hostNetwork pods, kubelet) reach ClusterIPs, externalIPs,
//!   LoadBalancer IPs and NodePorts, also on the node's own addresses: their packets never meet
//!   an XDP program unless the kernel routes them out of an interface kxdp owns;
//! - kxdp can hand frames to the kernel (`pass` verdicts, pod traffic to outside the cluster that
//!   the CNI's masquerade rules must see, replies for the node's own connections).
//!
//! ```text
//!   node's processes ──► kernel routing ──► kxdp0 ═══ veth ═══ kxdp1 ──► XDP ─► AF_XDP ─► kxdp
//!   (ClusterIP, node-IP:NodePort)            (kernel's side)   (kxdp's side, attached like
//!                                                               any interface)
//!   kernel ◄── kxdp0 RX ◄══════════════════════════════════ kxdp1 TX ◄── kxdp (frames for the
//!                                                                        kernel: dst MAC kxdp0)
//! ```
//!
//! What [`HostPath::setup`] installs (everything tagged with the route/rule protocol
//! `opts.protocol`, so that a start replaces what a previous run left and
//! [`HostPath::teardown`] removes exactly what was added):
//!
//! - the veth pair `kxdp0` (stays with the kernel) / `kxdp1` (kxdp attaches XDP and AF_XDP to
//!   it). `kxdp0` gets a link-local /32 (`169.254.107.2`) so that a loose reverse-path check
//!   has an address to work with, and the IPv4 per-device settings: `accept_local 1` (frames
//!   kxdp injects may carry a node address as source: replies of NodePort connections to the
//!   node itself), `forwarding 1` (pod traffic handed over is routed on), `rp_filter 0` — or
//!   `2` (loose) when `conf/all/rp_filter` is 1, because the kernel uses the maximum of `all`
//!   and the interface: strict mode would drop every handed-over pod packet (its source routes
//!   via the pod's veth, not `kxdp0`). Both sides have IPv6 address generation `none`: no
//!   link-local address, so the kernel never runs DAD or sends solicitations on the pair (IPv6
//!   routes go `via fe80::6b:1 onlink` and need no address on `kxdp0`). IPv6 forwarding is
//!   gated by `conf/all/forwarding` only (`ip6_forward`), which is the node's to set:
//!   [`ipv6_forwarding_off`] tells the caller to warn.
//! - a permanent neighbour on `kxdp0` for the next hops `169.254.107.1` and `fe80::6b:1` with
//!   `kxdp1`'s MAC: routes through `kxdp0` never wait for ARP/ND (nobody would answer).
//! - service routes (service CIDRs, externalIPs and LoadBalancer IPs, [`HostPath::set_service_routes`])
//!   in the main table: `PREFIX via NEXTHOP dev kxdp0 onlink src NODE-IP proto TAG`. The `src`
//!   is the node's address of that family: without it the kernel would pick any address (a
//!   pod gateway's), and the replies would not come back to the node.
//! - NodePorts on the node's own addresses: the kernel delivers a packet to a local address
//!   without consulting a route, so the node's own connections to its NodePorts would never
//!   reach kxdp. A tc program at `lo`'s egress (`kxdp_kernel::tc::redirect_node_ports`, attached
//!   by the runner once the XDP program's maps exist, [`HostPath::node_ports_to`]) runs the XDP
//!   program's steering over what the node sends to itself and redirects what the dataplane
//!   must see (a node address and a NodePort kxdp serves) to `kxdp0`'s egress, addressed as a
//!   route through the pair would address it; everything else stays local. Not policy-routing
//!   rules: from a namespace's first rule on, the kernel looks every route up through its rule
//!   list and checks every forwarded packet's source with a full lookup, for as long as the
//!   namespace lives (docs/afxdp.md § The host path, "What the rules cost"). Teardown removes the
//!   filter; an earlier kxdp's NodePort rules and moved `local` rule are removed (the `local`
//!   rule put back) like anything else it left.
//!
//! - overlay devices (`opts.overlay_ifs`: VXLAN, IPIP, WireGuard, tun — any device kxdp has
//!   no socket on that carries pod traffic between nodes): the egress stage hands what it routes
//!   through them to the kernel port, and one rule per device present and family
//!   (`pref 1 iif DEV lookup OVERLAY-TABLE proto TAG`, a default route through `kxdp0` in that
//!   table) sends what the kernel receives on them to kxdp, so replies are un-NATed and new
//!   connections to local pods meet NetworkPolicy ([`overlay_table`], [`overlay_rules`]); a
//!   device that appears later gets its rules from [`NodeAddressFollower`].
//!
//! The node's addresses change (an address added to or removed from an interface): the service
//! routes' source follows them. [`NodeAddressFollower`] holds the candidates (`nodeIPs`, else
//! the Node object's addresses, updated at each publication) and, on every netlink address
//! event, sets those that are local now ([`HostPath::set_node_ips`]): a route's `src` must be
//! local. The node-ports redirect reads the node's addresses from the XDP program's maps, which
//! the runner keeps in step with the node's local addresses.
//!
//! Netlink goes through the `rtnetlink` crate on a private current-thread tokio runtime (the API
//! here is synchronous: setup and route updates are rare control-path calls). The per-device
//! settings are netlink too (RTM_SETLINK with IFLA_AF_SPEC, `devconf_af_spec`), not writes
//! under `/proc/sys`: that needs only CAP_NET_ADMIN and works where `/proc/sys` is read-only,
//! as in a container that is not privileged. `/proc/sys` is only read (it shows the calling
//! thread's network namespace).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use ipnet::IpNet;
use kxdp_kernel::netlink::{
    devconf_af_spec, IPV4_DEVCONF_ACCEPT_LOCAL, IPV4_DEVCONF_FORWARDING, IPV4_DEVCONF_RP_FILTER,
};
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::neighbour::NeighbourState;
use rtnetlink::packet_route::route::{RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, IpVersion, LinkUnspec, LinkVeth, RouteMessageBuilder};

/// The kernel's `local` routing table.
const RT_TABLE_LOCAL: u32 = 255;
const RT_TABLE_MAIN: u32 = 254;

/// What the host path sets up; [`HostPathOptions::default`] gives kxdp's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPathOptions {
    /// The kernel's side of the pair.
    pub host_if: String,
    /// kxdp's side (attach XDP and AF_XDP sockets to it).
    pub kxdp_if: String,
    /// The node's addresses: the `src` of service routes (the first of each family).
    pub node_ips: Vec<IpAddr>,
    /// Service CIDRs, externalIPs and LoadBalancer IPs routed to kxdp.
    pub service_routes: Vec<IpNet>,
    /// The route and rule protocol number that marks what kxdp installed.
    pub protocol: u8,
    /// `kxdp0`'s own link-local address.
    pub host_addr4: Ipv4Addr,
    /// The next hops behind `kxdp0` (permanent neighbours with `kxdp1`'s MAC).
    pub next_hop4: Ipv4Addr,
    pub next_hop6: Ipv6Addr,
    /// Devices kxdp does not own that carry pod traffic between nodes (an overlay's VXLAN, IPIP,
    /// WireGuard or tun device): what the kernel receives on them is steered to kxdp
    /// ([`overlay_rules`]). Exact names: a device that does not exist (yet) gets its rules when
    /// it appears.
    pub overlay_ifs: Vec<String>,
    /// The routing table of the overlay rules (a default route through `kxdp0`).
    pub overlay_table: u32,
    /// The overlay rules' preference: after the `local` rule (preference 0), so that what the
    /// overlay carries to the node's own addresses is delivered as before, and before `main`.
    pub overlay_priority: u32,
}

impl Default for HostPathOptions {
    fn default() -> Self {
        HostPathOptions {
            host_if: "kxdp0".into(),
            kxdp_if: "kxdp1".into(),
            node_ips: Vec::new(),
            service_routes: Vec::new(),
            // 107 = 'k'; unused by iproute2's rt_protos and the common routing daemons.
            protocol: 107,
            host_addr4: Ipv4Addr::new(169, 254, 107, 2),
            next_hop4: Ipv4Addr::new(169, 254, 107, 1),
            next_hop6: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0x6b, 1),
            overlay_ifs: Vec::new(),
            // "ky" in ASCII.
            overlay_table: 0x6b79,
            overlay_priority: 1,
        }
    }
}

/// The installed host path. [`HostPath::teardown`] (or drop) removes it.
pub struct HostPath {
    rt: tokio::runtime::Runtime,
    handle: Handle,
    opts: HostPathOptions,
    host_ifindex: u32,
    kxdp_ifindex: u32,
    host_mac: [u8; 6],
    kxdp_mac: [u8; 6],
    /// The `local` rules moved behind kxdp's (family, priority, protocol), restored on teardown.
    moved_local: Vec<(IpVersion, u32, RouteProtocol)>,
    /// Overlay devices whose rules are installed.
    overlay_ruled: Vec<String>,
    /// The network namespace it was set up in (netlink's rtnetlink handle is bound to it;
    /// the tc calls are made in it).
    netns: std::fs::File,
    torn_down: bool,
}

/// Where the node's own packets to its NodePorts are redirected ([`HostPath::node_ports_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePortsTo {
    /// `kxdp0`'s ifindex: the packets leave through it and arrive on `kxdp1`.
    pub ifindex: u32,
    /// Their Ethernet destination (`kxdp1`'s MAC) and source (`kxdp0`'s).
    pub macs: [u8; 12],
}

impl NodePortsTo {
    /// Attaches (or replaces in place) the redirect on `lo` of the calling thread's namespace,
    /// steered by the XDP program's maps (`kxdp_kernel::tc::redirect_node_ports`).
    pub fn attach(&self, steer: kxdp_kernel::xdp::SteerMaps) -> io::Result<()> {
        kxdp_kernel::tc::redirect_node_ports(
            kxdp_kernel::tc::LOOPBACK,
            self.ifindex,
            self.macs,
            steer,
            kxdp_kernel::tc::NODE_PORTS_PREF,
        )
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("host path: {what}: {e}"))
}

/// Sets per-device settings of `index` through netlink ([`devconf_af_spec`]): needs only
/// CAP_NET_ADMIN, where writes under /proc/sys need a writable /proc/sys, which a container
/// that is not privileged does not have.
async fn set_devconf(
    handle: &Handle,
    index: u32,
    name: &str,
    ipv4: &[(u16, u32)],
    addr_gen_none: bool,
) -> io::Result<()> {
    let mut msg = LinkUnspec::new_with_index(index).build();
    msg.attributes.push(devconf_af_spec(ipv4, addr_gen_none));
    handle
        .link()
        .set(msg)
        .execute()
        .await
        .map_err(|e| err(&format!("per-device settings of {name} (netlink)"), e))
}

/// Whether IPv6 forwarding is off on the node (`net/ipv6/conf/all/forwarding` 0): the kernel
/// then drops the IPv6 pod traffic kxdp hands over on `kxdp0` (only `conf/all` gates IPv6
/// forwarding, see net/ipv6/ip6_output.c `ip6_forward`; kxdp reads it and leaves it to the
/// node). False without IPv6.
pub fn ipv6_forwarding_off() -> bool {
    read_sysctl("net/ipv6/conf/all/forwarding").is_ok_and(|v| v == "0")
}

/// Whether IPv4 forwarding is off on the node (`net/ipv4/conf/all/forwarding` 0): the kernel
/// then drops what kxdp's tap hands back and the fast path's flows it must route.
pub fn ipv4_forwarding_off() -> bool {
    read_sysctl("net/ipv4/conf/all/forwarding").is_ok_and(|v| v == "0")
}

/// The `rp_filter` of a device whose packets come from addresses routed elsewhere (kxdp's
/// host side, its tap): off, or loose where `conf/all` is strict, since the kernel applies the
/// larger of the two and loose passes every routed source.
pub(crate) fn open_rp_filter() -> io::Result<u32> {
    Ok(if read_sysctl("net/ipv4/conf/all/rp_filter")? == "1" {
        2
    } else {
        0
    })
}

/// Whether IPv6 is on for `dev` (its per-device settings exist).
fn ipv6_on(dev: &str) -> bool {
    std::path::Path::new(&format!("/proc/sys/net/ipv6/conf/{dev}")).exists()
}

fn read_sysctl(path: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/{path}"))
        .map(|s| s.trim().to_string())
        .map_err(|e| err(path, e))
}

fn rule_protocol(r: &RuleMessage) -> RouteProtocol {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Protocol(p) => Some(*p),
            _ => None,
        })
        .unwrap_or(RouteProtocol::Unspec)
}

fn rule_table(r: &RuleMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(r.header.table as u32)
}

fn route_table(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(r.header.table as u32)
}

fn route_oif(r: &RouteMessage) -> Option<u32> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    })
}

fn route_prefix(r: &RouteMessage) -> Option<IpNet> {
    let len = r.header.destination_prefix_length;
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(d) => {
            let ip: IpAddr = match d {
                rtnetlink::packet_route::route::RouteAddress::Inet(v4) => (*v4).into(),
                rtnetlink::packet_route::route::RouteAddress::Inet6(v6) => (*v6).into(),
                _ => return None,
            };
            IpNet::new(ip, len).ok()
        }
        _ => None,
    })
}

fn link_mac(l: &LinkMessage) -> Option<[u8; 6]> {
    l.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(m) if m.len() == 6 => m.as_slice().try_into().ok(),
        _ => None,
    })
}

async fn link_by_name(handle: &Handle, name: &str) -> io::Result<Option<LinkMessage>> {
    match handle
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_next()
        .await
    {
        Ok(l) => Ok(l),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(err(&format!("looking up {name}"), e)),
    }
}

async fn rules(handle: &Handle, v: IpVersion) -> io::Result<Vec<RuleMessage>> {
    handle
        .rule()
        .get(v)
        .execute()
        .try_collect()
        .await
        .map_err(|e| err("listing rules", e))
}

async fn routes(handle: &Handle, v: IpVersion) -> io::Result<Vec<RouteMessage>> {
    let msg = match v {
        IpVersion::V4 => RouteMessageBuilder::<Ipv4Addr>::new().build(),
        IpVersion::V6 => RouteMessageBuilder::<Ipv6Addr>::new().build(),
    };
    handle
        .route()
        .get(msg)
        .execute()
        .try_collect()
        .await
        .map_err(|e| err("listing routes", e))
}

/// Adds a `lookup local` rule at `priority` with protocol `proto` (after the rules already at
/// that preference): the kernel's own, put back where an earlier kxdp moved it.
async fn add_local_rule(
    handle: &Handle,
    v: IpVersion,
    priority: u32,
    proto: RouteProtocol,
) -> io::Result<()> {
    let mut req = handle
        .rule()
        .add()
        .table_id(RT_TABLE_LOCAL)
        .priority(priority);
    let m = req.message_mut();
    m.header.family = match v {
        IpVersion::V4 => AddressFamily::Inet,
        IpVersion::V6 => AddressFamily::Inet6,
    };
    m.header.action = RuleAction::ToTable;
    m.attributes.push(RuleAttribute::Protocol(proto));
    req.execute()
        .await
        .map_err(|e| err("adding the local rule", e))
}

/// Removes what a previous run (or this one) installed: tagged rules (with an untagged `local`
/// rule put back first if only kxdp's copy is left), tagged routes, the veth pair.
async fn remove_tagged(
    handle: &Handle,
    netns: &std::fs::File,
    opts: &HostPathOptions,
    restore: &[(IpVersion, u32, RouteProtocol)],
) -> io::Result<()> {
    let tag = RouteProtocol::Other(opts.protocol);
    kxdp_kernel::sys::in_netns(netns, || {
        kxdp_kernel::tc::remove_node_ports_redirect(
            kxdp_kernel::tc::LOOPBACK,
            kxdp_kernel::tc::NODE_PORTS_PREF,
        )
    })
    .and_then(|r| r)
    .map_err(|e| err("removing the node-ports redirect", e))?;
    for v in [IpVersion::V4, IpVersion::V6] {
        let list = rules(handle, v.clone()).await?;
        let untagged_local = list
            .iter()
            .any(|r| rule_table(r) == RT_TABLE_LOCAL && rule_protocol(r) != tag);
        let tagged_local = list
            .iter()
            .any(|r| rule_table(r) == RT_TABLE_LOCAL && rule_protocol(r) == tag);
        if !untagged_local && tagged_local {
            // The original as it was (this run), else the kernel's default.
            let (prio, proto) = restore
                .iter()
                .find(|(rv, _, _)| *rv == v)
                .map(|(_, p, pr)| (*p, *pr))
                .unwrap_or((0, RouteProtocol::Kernel));
            add_local_rule(handle, v.clone(), prio, proto).await?;
        }
        for r in list.into_iter().filter(|r| rule_protocol(r) == tag) {
            handle
                .rule()
                .del(r)
                .execute()
                .await
                .map_err(|e| err("deleting a kxdp rule", e))?;
        }
        for r in routes(handle, v.clone()).await? {
            if r.header.protocol == tag {
                let what = format!("deleting route {:?}", route_prefix(&r));
                match handle.route().del(r).execute().await {
                    Ok(()) => {}
                    // Gone with its interface meanwhile.
                    Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => {}
                    Err(e) => return Err(err(&what, e)),
                }
            }
        }
    }
    if let Some(l) = link_by_name(handle, &opts.host_if).await? {
        handle
            .link()
            .del(l.header.index)
            .execute()
            .await
            .map_err(|e| err(&format!("deleting {}", opts.host_if), e))?;
    }
    // A lone kxdp1 (its peer renamed or moved) would make the veth creation fail.
    if let Some(l) = link_by_name(handle, &opts.kxdp_if).await? {
        handle
            .link()
            .del(l.header.index)
            .execute()
            .await
            .map_err(|e| err(&format!("deleting {}", opts.kxdp_if), e))?;
    }
    Ok(())
}

impl HostPath {
    /// Installs the host path in the calling thread's network namespace, replacing whatever a
    /// previous run left (see the module docs).
    pub fn setup(opts: &HostPathOptions) -> io::Result<HostPath> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let handle = rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            Ok::<_, io::Error>(handle)
        })?;
        let mut hp = HostPath {
            rt,
            handle,
            opts: opts.clone(),
            host_ifindex: 0,
            kxdp_ifindex: 0,
            host_mac: [0; 6],
            kxdp_mac: [0; 6],
            moved_local: Vec::new(),
            overlay_ruled: Vec::new(),
            netns: kxdp_kernel::sys::current_netns()?,
            torn_down: false,
        };
        if let Err(e) = hp.install() {
            let _ = hp.remove();
            hp.torn_down = true;
            return Err(e);
        }
        Ok(hp)
    }

    /// Takes over the host path a predecessor installed (a takeover): finds the pair by name,
    /// keeps every rule and route as it is, and remembers the `local` rules the predecessor
    /// moved (`moved_local`: family 4|6, priority, protocol, from [`HostPath::moved_local`]), so
    /// that a later teardown restores them. Nothing is removed or re-created: `kxdp1` keeps
    /// its ifindex, so the AF_XDP socket the successor adopted stays bound to it.
    pub fn adopt(opts: &HostPathOptions, moved_local: &[(u8, u32, u8)]) -> io::Result<HostPath> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let (handle, host, kxdp) = rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            let host = link_by_name(&handle, &opts.host_if).await?;
            let kxdp = link_by_name(&handle, &opts.kxdp_if).await?;
            Ok::<_, io::Error>((handle, host, kxdp))
        })?;
        let (Some(host), Some(kxdp)) = (host, kxdp) else {
            return Err(err(
                "adopting the predecessor's pair",
                format!("{} or {} not found", opts.host_if, opts.kxdp_if),
            ));
        };
        Ok(HostPath {
            rt,
            handle,
            opts: opts.clone(),
            host_ifindex: host.header.index,
            kxdp_ifindex: kxdp.header.index,
            host_mac: link_mac(&host).ok_or_else(|| err(&opts.host_if, "no MAC"))?,
            kxdp_mac: link_mac(&kxdp).ok_or_else(|| err(&opts.kxdp_if, "no MAC"))?,
            moved_local: moved_local
                .iter()
                .map(|&(v, prio, proto)| {
                    let v = if v == 6 { IpVersion::V6 } else { IpVersion::V4 };
                    (v, prio, RouteProtocol::from(proto))
                })
                .collect(),
            overlay_ruled: Vec::new(),
            netns: kxdp_kernel::sys::current_netns()?,
            torn_down: false,
        })
    }

    /// The `local` rules moved behind kxdp's: (family 4|6, priority, protocol), for a successor.
    pub fn moved_local(&self) -> Vec<(u8, u32, u8)> {
        self.moved_local
            .iter()
            .map(|(v, prio, proto)| {
                let v = if matches!(v, IpVersion::V6) { 6 } else { 4 };
                (v, *prio, u8::from(*proto))
            })
            .collect()
    }

    /// Leaves everything installed for a successor that adopted it (no teardown on drop).
    pub fn leave(mut self) {
        self.torn_down = true;
    }

    fn install(&mut self) -> io::Result<()> {
        let (handle, opts) = (self.handle.clone(), self.opts.clone());
        self.rt
            .block_on(remove_tagged(&handle, &self.netns, &opts, &[]))?;
        let (host, kxdp) = self.rt.block_on(async {
            handle
                .link()
                .add(LinkVeth::new(&opts.host_if, &opts.kxdp_if).build())
                .execute()
                .await
                .map_err(|e| err(&format!("creating {}/{}", opts.host_if, opts.kxdp_if), e))?;
            let host = link_by_name(&handle, &opts.host_if).await?;
            let kxdp = link_by_name(&handle, &opts.kxdp_if).await?;
            match (host, kxdp) {
                (Some(h), Some(k)) => Ok((h, k)),
                _ => Err(err(
                    "creating the veth pair",
                    "links not found after creation",
                )),
            }
        })?;
        self.host_ifindex = host.header.index;
        self.kxdp_ifindex = kxdp.header.index;
        self.host_mac = link_mac(&host).ok_or_else(|| err(&opts.host_if, "no MAC"))?;
        self.kxdp_mac = link_mac(&kxdp).ok_or_else(|| err(&opts.kxdp_if, "no MAC"))?;

        // Per-device settings before the links come up, through netlink (a container's
        // /proc/sys is read-only; reading it works). conf/all/rp_filter is max'ed with the
        // interface's. (A `forwarding` write under /proc/sys also turns LRO off on the device;
        // a veth has none.) IPv6: no addresses on either side (address generation none), so the
        // kernel never runs DAD or sends solicitations on the pair; routes use the permanent
        // neighbour of fe80::6b:1 onlink and need no address on kxdp0.
        let h = &opts.host_if;
        let rp = open_rp_filter()?;
        let v6 = ipv6_on(h);
        let ipv4 = [
            (IPV4_DEVCONF_RP_FILTER, rp),
            (IPV4_DEVCONF_ACCEPT_LOCAL, 1),
            (IPV4_DEVCONF_FORWARDING, 1),
        ];
        let (hi, ki) = (self.host_ifindex, self.kxdp_ifindex);
        self.rt.block_on(async {
            set_devconf(&handle, hi, h, &ipv4, v6).await?;
            if v6 {
                set_devconf(&handle, ki, &opts.kxdp_if, &[], true).await?;
            }
            Ok::<_, io::Error>(())
        })?;

        let kmac = self.kxdp_mac;
        self.rt.block_on(async {
            handle
                .address()
                .add(hi, opts.host_addr4.into(), 32)
                .execute()
                .await
                .map_err(|e| err("the link-local address of the host side", e))?;
            for i in [hi, ki] {
                handle
                    .link()
                    .set(LinkUnspec::new_with_index(i).up().build())
                    .execute()
                    .await
                    .map_err(|e| err("setting the pair up", e))?;
            }
            let mut hops: Vec<IpAddr> = vec![opts.next_hop4.into()];
            if v6 {
                hops.push(opts.next_hop6.into());
            }
            for nh in hops {
                handle
                    .neighbours()
                    .add(hi, nh)
                    .link_layer_address(&kmac)
                    .state(NeighbourState::Permanent)
                    .replace()
                    .execute()
                    .await
                    .map_err(|e| err(&format!("permanent neighbour {nh}"), e))?;
            }
            overlay_table(&handle, &opts, hi, v6).await
        })?;
        let links = kxdp_kernel::netlink::dump_all()?.links;
        self.sync_overlay_rules(&link_names(&links))?;
        self.set_service_routes(&opts.service_routes)
    }

    /// Replaces the set of prefixes routed to kxdp (service CIDRs, externalIPs, LoadBalancer
    /// IPs): adds what is new, removes what is gone. A prefix of a family the node has no
    /// address of is kept in the set but not installed (there is no source address for it)
    /// until an address of that family appears ([`HostPath::set_node_ips`]).
    pub fn set_service_routes(&mut self, nets: &[IpNet]) -> io::Result<()> {
        let (handle, opts, hi) = (self.handle.clone(), self.opts.clone(), self.host_ifindex);
        let src4 = opts.node_ips.iter().find(|a| a.is_ipv4()).copied();
        let src6 = opts.node_ips.iter().find(|a| a.is_ipv6()).copied();
        let mut wanted: Vec<IpNet> = nets.iter().map(|n| n.trunc()).collect();
        wanted.sort();
        wanted.dedup();
        let want: Vec<IpNet> = wanted
            .iter()
            .filter(|n| match n {
                IpNet::V4(_) => src4.is_some(),
                IpNet::V6(_) => src6.is_some(),
            })
            .copied()
            .collect();
        let tag = RouteProtocol::Other(opts.protocol);
        self.rt.block_on(async {
            for v in [IpVersion::V4, IpVersion::V6] {
                for r in routes(&handle, v).await? {
                    if r.header.protocol != tag
                        || route_table(&r) != RT_TABLE_MAIN
                        || route_oif(&r) != Some(hi)
                    {
                        continue;
                    }
                    if route_prefix(&r).is_some_and(|p| want.contains(&p)) {
                        continue;
                    }
                    handle
                        .route()
                        .del(r)
                        .execute()
                        .await
                        .map_err(|e| err("removing a service route", e))?;
                }
            }
            for n in &want {
                let msg = route_via_host(&opts, hi, *n, RT_TABLE_MAIN, src4, src6);
                add_or_replace_route(&handle, msg, &format!("service route {n}")).await?;
            }
            Ok::<(), io::Error>(())
        })?;
        self.opts.service_routes = wanted;
        Ok(())
    }

    /// Follows the node's addresses: the service routes' source addresses re-chosen from the
    /// new set.
    pub fn set_node_ips(&mut self, ips: &[IpAddr]) -> io::Result<()> {
        // In the given order: the first of each family is the service routes' source.
        let mut want: Vec<IpAddr> = Vec::new();
        for a in ips {
            if !want.contains(a) {
                want.push(*a);
            }
        }
        if want == self.opts.node_ips {
            return Ok(());
        }
        self.opts.node_ips = want;
        // The service routes' `src` is the first address of each family (and a family without
        // one has none of its routes installed).
        let routes = self.opts.service_routes.clone();
        self.set_service_routes(&routes)
    }

    /// Adds the overlay rules of overlay devices that appeared ([`overlay_rules`]); `present`:
    /// the names of the node's links now.
    pub fn sync_overlay_rules(&mut self, present: &[&str]) -> io::Result<()> {
        let (handle, opts) = (self.handle.clone(), self.opts.clone());
        let v6 = ipv6_on(&opts.host_if);
        let mut done = std::mem::take(&mut self.overlay_ruled);
        let r = (self.rt).block_on(overlay_rules(&handle, &opts, v6, present, &mut done));
        self.overlay_ruled = done;
        r
    }

    /// Where the node's own packets to its NodePorts go (`kxdp_kernel::tc::redirect_node_ports`):
    /// the egress of `kxdp0`, addressed to `kxdp1` from `kxdp0` as a route through the pair
    /// would address them.
    pub fn node_ports_to(&self) -> NodePortsTo {
        let mut macs = [0u8; 12];
        macs[..6].copy_from_slice(&self.kxdp_mac);
        macs[6..].copy_from_slice(&self.host_mac);
        NodePortsTo {
            ifindex: self.host_ifindex,
            macs,
        }
    }

    /// The kxdp side's interface index (for the runner: attach to it like any interface).
    pub fn kxdp_ifindex(&self) -> u32 {
        self.kxdp_ifindex
    }

    /// The kernel side's interface index.
    pub fn host_ifindex(&self) -> u32 {
        self.host_ifindex
    }

    /// The kernel side's MAC: the destination MAC of frames kxdp hands to the kernel.
    pub fn host_mac(&self) -> [u8; 6] {
        self.host_mac
    }

    /// The kxdp side's MAC (the source MAC of frames kxdp hands to the kernel).
    pub fn kxdp_mac(&self) -> [u8; 6] {
        self.kxdp_mac
    }

    pub fn options(&self) -> &HostPathOptions {
        &self.opts
    }

    /// Removes everything setup installed and puts the `local` rules back where they were.
    pub fn teardown(mut self) -> io::Result<()> {
        self.torn_down = true;
        self.remove()
    }

    fn remove(&mut self) -> io::Result<()> {
        let (handle, opts, moved) = (
            self.handle.clone(),
            self.opts.clone(),
            self.moved_local.clone(),
        );
        self.rt
            .block_on(remove_tagged(&handle, &self.netns, &opts, &moved))
    }
}

impl Drop for HostPath {
    fn drop(&mut self) {
        if !self.torn_down {
            if let Err(e) = self.remove() {
                tracing::warn!("kxdp: removing the host path: {e}");
            }
        }
    }
}

/// `PREFIX via NEXTHOP dev HOST_IF onlink src NODE-IP proto TAG table TABLE`.
fn route_via_host(
    opts: &HostPathOptions,
    oif: u32,
    net: IpNet,
    table: u32,
    src4: Option<IpAddr>,
    src6: Option<IpAddr>,
) -> RouteMessage {
    let tag = RouteProtocol::Other(opts.protocol);
    match net {
        IpNet::V4(n) => {
            let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(n.addr(), n.prefix_len())
                .gateway(opts.next_hop4)
                .output_interface(oif)
                .onlink()
                .protocol(tag)
                .table_id(table);
            if let Some(IpAddr::V4(s)) = src4 {
                b = b.pref_source(s);
            }
            b.build()
        }
        IpNet::V6(n) => {
            let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(n.addr(), n.prefix_len())
                .gateway(opts.next_hop6)
                .output_interface(oif)
                .protocol(tag)
                .table_id(table);
            if let Some(IpAddr::V6(s)) = src6 {
                b = b.pref_source(s);
            }
            b.build()
        }
    }
}

/// A rule `pref PRIORITY iif IIF lookup TABLE proto TAG` of one family, to be completed with
/// further selectors and executed.
fn tagged_rule(
    handle: &Handle,
    opts: &HostPathOptions,
    iif: &str,
    table: u32,
    priority: u32,
    v6: bool,
) -> rtnetlink::RuleAddRequest {
    let mut req = handle
        .rule()
        .add()
        .input_interface(iif)
        .table_id(table)
        .priority(priority);
    let m = req.message_mut();
    m.header.action = RuleAction::ToTable;
    m.header.family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    m.attributes
        .push(RuleAttribute::Protocol(RouteProtocol::Other(opts.protocol)));
    req
}

/// Adds a route, replacing one of the same destination, table and metric.
async fn add_or_replace_route(handle: &Handle, msg: RouteMessage, what: &str) -> io::Result<()> {
    handle
        .route()
        .add(msg)
        .replace()
        .execute()
        .await
        .map_err(|e| err(what, e))
}

/// What the kernel receives on an overlay device (decapsulated or decrypted: a reply of a
/// connection kxdp translated, or a new connection to a local pod that NetworkPolicy must judge)
/// would otherwise go straight to the pod. In the overlay table a default route through `kxdp0`
/// per family (installed here), and per device present and family one rule
/// `pref P iif DEV lookup OVERLAY-TABLE proto TAG` ([`overlay_rules`]), send it to kxdp instead;
/// kxdp forwards it to the pod's interface. What kxdp sends to such a device goes back through
/// `kxdp0` and arrives with `iif kxdp0`, so it never loops.
async fn overlay_table(
    handle: &Handle,
    opts: &HostPathOptions,
    oif: u32,
    v6: bool,
) -> io::Result<()> {
    if opts.overlay_ifs.is_empty() {
        return Ok(());
    }
    let mut defaults: Vec<IpNet> = vec!["0.0.0.0/0".parse().unwrap()];
    if v6 {
        defaults.push("::/0".parse().unwrap());
    }
    for net in defaults {
        let msg = route_via_host(opts, oif, net, opts.overlay_table, None, None);
        add_or_replace_route(
            handle,
            msg,
            &format!("the overlay table's default route ({net})"),
        )
        .await?;
    }
    Ok(())
}

/// The overlay rules of the devices in `opts.overlay_ifs` that exist now (in `present`) and are
/// not in `done` (added to it). Only for devices present: a namespace's first policy-routing rule, even one
/// for a device it does not have, puts all its forwarding on the kernel's slower rule-based
/// lookup for as long as it lives (docs/afxdp.md § The host path, "What the rules cost"). A
/// rule already there (a predecessor's, in a takeover) counts as added.
async fn overlay_rules(
    handle: &Handle,
    opts: &HostPathOptions,
    v6: bool,
    present: &[&str],
    done: &mut Vec<String>,
) -> io::Result<()> {
    for name in &opts.overlay_ifs {
        if done.contains(name) || !present.contains(&name.as_str()) {
            continue;
        }
        for v6 in [false, true].into_iter().filter(|f| !f || v6) {
            let added = tagged_rule(
                handle,
                opts,
                name,
                opts.overlay_table,
                opts.overlay_priority,
                v6,
            )
            .execute()
            .await;
            match added {
                Ok(()) => {}
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => {}
                Err(e) => return Err(err(&format!("the overlay rule for {name}"), e)),
            }
        }
        done.push(name.clone());
    }
    Ok(())
}

/// The node's addresses that can be the service routes' source: global unicast addresses on
/// any interface but the host path's pair (loopback and link-local left out).
pub fn local_node_addrs(opts: &HostPathOptions) -> io::Result<Vec<IpAddr>> {
    Ok(node_addrs_in(&kxdp_kernel::netlink::dump_all()?, opts))
}

/// The names of `links`.
fn link_names(links: &[kxdp_kernel::netlink::Link]) -> Vec<&str> {
    links.iter().map(|l| l.name.as_str()).collect()
}

/// [`local_node_addrs`] in a dump already read.
fn node_addrs_in(dump: &kxdp_kernel::netlink::Dump, opts: &HostPathOptions) -> Vec<IpAddr> {
    let pair: Vec<u32> = dump
        .links
        .iter()
        .filter(|l| l.name == opts.host_if || l.name == opts.kxdp_if)
        .map(|l| l.ifindex)
        .collect();
    let mut v: Vec<IpAddr> = dump
        .addrs
        .iter()
        .filter(|a| !pair.contains(&a.ifindex))
        .map(|a| a.addr)
        .filter(|a| {
            !a.is_loopback()
                && !matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
                && !matches!(a, IpAddr::V4(v4) if v4.is_link_local())
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Keeps a host path's service routes on the node's addresses as they come and go, and gives
/// overlay devices that appear their rules (see the module docs): a thread waits for netlink
/// link and address events; [`NodeAddressFollower::set_candidates`] changes the addresses that
/// count as the node's (a publication changed them).
pub struct NodeAddressFollower {
    candidates: Arc<Mutex<Vec<IpAddr>>>,
    host_path: Arc<Mutex<Option<HostPath>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NodeAddressFollower {
    /// Subscribes to address events (in the calling thread's namespace), applies `candidates`
    /// once, and starts following. The host path is shared: `None` in it (torn down) stops the
    /// thread's work.
    pub fn start(
        host_path: Arc<Mutex<Option<HostPath>>>,
        candidates: Vec<IpAddr>,
    ) -> io::Result<NodeAddressFollower> {
        // Subscribed before the first read: no change in between is missed.
        let mut events = kxdp_kernel::netlink::Events::subscribe_links_and_addresses()?;
        let candidates = Arc::new(Mutex::new(candidates));
        let stop = Arc::new(AtomicBool::new(false));
        sync_node_ips(&host_path, &candidates);
        let (c, hp, s) = (candidates.clone(), host_path.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("kxdp-host-addrs".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if events.wait(Duration::from_millis(200)) {
                        sync_node_ips(&hp, &c);
                    }
                }
            })?;
        Ok(NodeAddressFollower {
            candidates,
            host_path,
            stop,
            thread: Some(thread),
        })
    }

    /// The addresses that count as the node's changed (applied at once, for those local now).
    pub fn set_candidates(&self, ips: Vec<IpAddr>) {
        *self.candidates.lock().unwrap_or_else(|e| e.into_inner()) = ips;
        sync_node_ips(&self.host_path, &self.candidates);
    }

    /// Stops following (the rules stay as they are).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for NodeAddressFollower {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sets the host path's node addresses to the candidates that are local now, and adds the
/// rules of overlay devices that appeared.
fn sync_node_ips(host_path: &Mutex<Option<HostPath>>, candidates: &Mutex<Vec<IpAddr>>) {
    let mut guard = host_path.lock().unwrap_or_else(|e| e.into_inner());
    let Some(hp) = guard.as_mut() else { return };
    // One dump for both: the addresses and the links present.
    let dump = match kxdp_kernel::netlink::dump_all() {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("kxdp: host path: reading the node's addresses: {e}");
            return;
        }
    };
    let local = node_addrs_in(&dump, &hp.opts);
    let want: Vec<IpAddr> = candidates
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|a| local.contains(a))
        .copied()
        .collect();
    if let Err(e) = hp.set_node_ips(&want) {
        tracing::warn!("kxdp: host path: following the node's addresses: {e}");
    }
    if let Err(e) = hp.sync_overlay_rules(&link_names(&dump.links)) {
        tracing::warn!("kxdp: host path: following the overlay devices: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::Emitable;

    /// (type without flags, nested flag, value) of each attribute in `buf`.
    fn nlas(mut buf: &[u8]) -> Vec<(u16, bool, Vec<u8>)> {
        let mut out = Vec::new();
        while buf.len() >= 4 {
            let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
            let kind = u16::from_ne_bytes([buf[2], buf[3]]);
            out.push((kind & 0x3fff, kind & 0x8000 != 0, buf[4..len].to_vec()));
            buf = &buf[(len + 3) & !3..];
        }
        out
    }

    #[test]
    fn hostpath_devconf_is_the_kernels_set_form() {
        let attr = devconf_af_spec(
            &[(IPV4_DEVCONF_RP_FILTER, 0), (IPV4_DEVCONF_ACCEPT_LOCAL, 1)],
            true,
        );
        let mut buf = vec![0u8; attr.buffer_len()];
        attr.emit(&mut buf);
        let spec = nlas(&buf);
        assert_eq!(spec.len(), 1);
        assert_eq!(spec[0].0, 26, "IFLA_AF_SPEC");
        let families = nlas(&spec[0].2);
        assert_eq!(families.len(), 2);
        assert_eq!(families[0].0, libc::AF_INET as u16);
        let inet = nlas(&families[0].2);
        assert_eq!(inet.len(), 1);
        assert_eq!(
            (inet[0].0, inet[0].1),
            (kxdp_kernel::netlink::IFLA_INET_CONF, true)
        );
        // Nested u32 attributes typed by the index; a zero is sent, not left out.
        let conf = nlas(&inet[0].2);
        assert_eq!(
            conf,
            vec![
                (8, false, 0u32.to_ne_bytes().to_vec()),
                (23, false, 1u32.to_ne_bytes().to_vec()),
            ]
        );
        assert_eq!(families[1].0, libc::AF_INET6 as u16);
        // IFLA_INET6_ADDR_GEN_MODE (8) = IN6_ADDR_GEN_MODE_NONE (1), one byte.
        assert_eq!(nlas(&families[1].2), vec![(8, false, vec![1])]);

        // kxdp1: IPv6 only, no AF_INET part.
        let attr = devconf_af_spec(&[], true);
        let mut buf = vec![0u8; attr.buffer_len()];
        attr.emit(&mut buf);
        let families = nlas(&nlas(&buf)[0].2);
        assert_eq!(families.len(), 1);
        assert_eq!(families[0].0, libc::AF_INET6 as u16);
    }
}
