//! Traffic control through route netlink: steering every IPv4 and IPv6 packet that arrives on
//! an interface (a pod's host-side veth) to another device (kxdp's tap), as `tc` would with
//!
//! ```text
//! tc qdisc add dev VETH clsact
//! tc filter add dev VETH ingress protocol ip pref P u32 skip_hw \
//!     match u32 0 0 action mirred egress redirect dev TAP
//! ```
//!
//! (and `protocol ipv6` at `P + 2`). A `u32` filter with one empty key matches everything; it is
//! used rather than `matchall` because kernels may lack `CONFIG_NET_CLS_MATCHALL` (this lab's
//! does) while `u32` is everywhere. ARP and everything else stays with the kernel, so the pod
//! still resolves its gateway; so does IPv6 neighbour discovery: a filter at `P + 1` lets
//! ICMPv6 with hop limit 255 (RFC 4861 requires it of router and neighbour messages; other
//! traffic leaves a host with less) on to the kernel without an action, as
//!
//! ```text
//! tc filter add dev VETH ingress protocol ipv6 pref P+1 u32 skip_hw \
//!     match u32 0x00003aff 0x0000ffff at 4
//! ```
//!
//! since a neighbour solicitation answered from the tap would leave through the tap.
//!
//! With a tag, the redirect is a small tc program instead (`cls_bpf`, direct action, assembled
//! here like the XDP program): it pushes an 802.1Q tag whose VLAN ID names the interface
//! (`bpf_skb_vlan_push`), then redirects to the target's egress (`bpf_redirect`). Before that
//! it may run the in-kernel fast path (`crate::offload`) and the XDP program's steering
//! (`crate::xdp::steer`), which hands the node's own traffic to the kernel (`TC_ACT_OK`). The tap hands
//! frames over without saying where they came from; a reader that knows which interface a tag
//! stands for can check the source addresses per interface. A program, not `act_vlan`, because
//! kernels may lack `CONFIG_NET_ACT_VLAN` (this lab's does) while `cls_bpf` is there wherever
//! XDP is. One tag only: the kernel keeps a single-tagged super-frame whole through the tap (a
//! second tag would make it segment the frame in software). The tag is also in the filter's
//! name (`kxdp-tap tag N`), so a restart finds what an earlier kxdp chose.
//!
//! The filter works on whole socket buffers: a GSO super-frame is
//! redirected as one, unlike an XDP program on a veth, which makes the kernel turn the peer's
//! GSO off. Attaching again replaces kxdp's own filter in place (a restart or a takeover never
//! leaves a moment without it) and leaves other filters of the qdisc alone.

use std::io;
use std::os::fd::AsRawFd;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionGeneric, TcActionMirrorOption, TcActionOption,
    TcActionType, TcAttribute, TcBpfFlags, TcFilterBpf, TcFilterBpfOption, TcFilterU32Option,
    TcHandle, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key, TcU32OptionFlags,
    TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

use crate::netlink::{acked, dumped};
use crate::offload::OffloadMaps;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const EEXIST: i32 = 17;
const ENOENT: i32 = 2;
const EINVAL: i32 = 22;

/// The clsact qdisc's ingress hook of `ifindex`.
fn ingress() -> TcHandle {
    TcHandle {
        major: 0xffff,
        minor: TcHandle::MIN_INGRESS,
    }
}

/// `tcm_info` of a filter: its preference (priority) and protocol (network byte order).
fn info(pref: u16, protocol: u16) -> u32 {
    ((pref as u32) << 16) | protocol.to_be() as u32
}

fn clsact(ifindex: u32) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.parent = TcHandle::CLSACT;
    m.header.handle = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    m.attributes.push(TcAttribute::Kind("clsact".into()));
    m
}

/// The clsact qdisc's egress hook.
fn egress() -> TcHandle {
    TcHandle {
        major: 0xffff,
        minor: TcHandle::MIN_EGRESS,
    }
}

fn filter(ifindex: u32, pref: u16, protocol: u16, handle: TcHandle) -> TcMessage {
    filter_at(ingress(), ifindex, pref, protocol, handle)
}

/// A filter message for the clsact hook `hook` (ingress or egress).
fn filter_at(
    hook: TcHandle,
    ifindex: u32,
    pref: u16,
    protocol: u16,
    handle: TcHandle,
) -> TcMessage {
    let mut m = TcMessage::with_index(ifindex as i32);
    m.header.parent = hook;
    m.header.handle = handle;
    m.header.info = info(pref, protocol);
    m
}

/// The handle of the u32 node at `pref`/`protocol` on `ifindex`'s ingress, if there is one. The
/// kernel names a u32 node after its tcf_proto's root hash table (`800:`, `801:`...), which
/// depends on what was attached before, so a replacement asks rather than guesses.
/// Also its kind, and the tag of a tagged redirect.
fn existing(
    ifindex: u32,
    pref: u16,
    protocol: u16,
) -> io::Result<Option<(TcHandle, String, Option<u16>)>> {
    existing_at(ingress(), ifindex, pref, protocol)
}

/// [`existing`] at the clsact hook `hook`.
fn existing_at(
    hook: TcHandle,
    ifindex: u32,
    pref: u16,
    protocol: u16,
) -> io::Result<Option<(TcHandle, String, Option<u16>)>> {
    let mut found = None;
    let q = filter_at(hook, ifindex, pref, protocol, TcHandle::UNSPEC);
    dumped(RouteNetlinkMessage::GetTrafficFilter(q), |m| {
        if let RouteNetlinkMessage::NewTrafficFilter(m) = m {
            let h = m.header.handle;
            // A u32 node has a non-zero node id (the low 12 bits); `800:` itself is the table.
            // A cls_bpf filter's handle is small and non-zero (the header line has 0).
            if m.header.index == ifindex as i32
                && m.header.info == info(pref, protocol)
                && h.minor & 0x0fff != 0
            {
                let (kind, tag) = kind_and_tag(&m);
                found.get_or_insert((h, kind, tag));
            }
        }
    })
    .map(|_| found)
}

/// The u32 filter that lets IPv6 neighbour discovery (ICMPv6, hop limit 255: the word at
/// offset 4 of the IPv6 header ends in next header 58 and hop limit 255) on to the kernel: a
/// match without an action ends the classification with "ok".
fn nd_pass_filter(ifindex: u32, pref: u16, handle: TcHandle) -> TcMessage {
    let mut m = filter(ifindex, pref, ETH_P_IPV6, handle);
    let mut sel = TcU32Selector::default();
    sel.flags = TcU32SelectorFlags::Terminal;
    sel.nkeys = 1;
    let mut key = TcU32Key::default();
    key.mask = 0x0000_ffff;
    key.val = 0x0000_3aff;
    key.off = 4;
    sel.keys = vec![key];
    m.attributes.push(TcAttribute::Kind("u32".into()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::Selector(sel)),
        TcOption::U32(TcFilterU32Option::Flags(TcU32OptionFlags::SkipHw)),
    ]));
    m
}

/// The highest VLAN ID a tag can carry (4095 is reserved).
pub const MAX_TAG: u16 = 4094;

/// The name of a tagged redirect's filter, which carries its tag.
const TAG_NAME: &str = "kxdp-tap tag ";

/// What a tagged redirect's program does besides tagging: the in-kernel fast path for the
/// flows the workers installed (`crate::offload`), and the XDP program's steering, which
/// leaves the node's own traffic to the kernel (`crate::xdp::steer`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RedirectPrograms {
    pub offload: Option<OffloadMaps>,
    pub steer: Option<crate::xdp::SteerMaps>,
}

/// The XDP program's steering over a socket buffer (context in r6), with what it leaves to the
/// kernel (`to.kernel`) going on as it was (`TC_ACT_OK`); the other targets are the caller's.
fn steer_or_pass(
    a: &mut crate::bpf::asm::Asm,
    maps: crate::xdp::SteerMaps,
    to: crate::xdp::SteerTo,
) {
    use crate::bpf::asm::*;
    crate::xdp::steer(a, maps, crate::offload::SKB_POINTERS, to);
    a.label(to.kernel);
    a.mov_k(R0, crate::offload::TC_ACT_OK);
    a.exit();
}

/// Ends a program: redirect to the egress of `target` (`TC_ACT_REDIRECT`) and return that.
fn redirect_and_finish(mut a: crate::bpf::asm::Asm, target: u32) -> Vec<crate::bpf::Insn> {
    use crate::bpf::asm::*;
    a.mov_k(R1, target as i32);
    a.mov_k(R2, 0);
    a.call(crate::bpf::HELPER_REDIRECT);
    a.exit();
    a.finish()
}

/// Makes `m` a direct-action `cls_bpf` filter running `prog`, named `name`.
fn bpf_filter(m: &mut TcMessage, prog: &std::os::fd::OwnedFd, name: String) {
    m.attributes
        .push(TcAttribute::Kind(TcFilterBpf::KIND.into()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::Bpf(TcFilterBpfOption::ProgFd(prog.as_raw_fd() as u32)),
        TcOption::Bpf(TcFilterBpfOption::ProgName(name)),
        TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
    ]));
}

/// The tc program of a tagged redirect: push an 802.1Q tag with VLAN ID `tag`, then redirect
/// to the egress of `target` (`TC_ACT_REDIRECT`); with `with.offload`, the established flows
/// the workers installed take the in-kernel fast path first (`crate::offload`); with
/// `with.steer`, what the XDP program would pass to the kernel goes on to it (`TC_ACT_OK`)
/// and only the rest to the tap.
fn tag_and_redirect(tag: u16, target: u32, with: RedirectPrograms) -> Vec<crate::bpf::Insn> {
    use crate::bpf::asm::*;
    let mut a = Asm::default();
    a.mov_x(R6, R1);
    if let Some(maps) = with.offload {
        crate::offload::emit(&mut a, maps, "steer");
        a.label("steer");
    }
    if let Some(maps) = with.steer {
        steer_or_pass(
            &mut a,
            maps,
            crate::xdp::SteerTo {
                dataplane: "redirect",
                kernel: "kernel",
                // Headers past the linear part: the workers read the whole frame.
                short: "redirect",
                other: "redirect",
            },
        );
    }
    a.label("redirect");
    // r1 is the packet (kept in r6); the protocol is big-endian as it sits in the frame.
    a.mov_x(R1, R6);
    a.mov_k(R2, u16::from_ne_bytes(ETH_P_8021Q.to_be_bytes()) as i32);
    a.mov_k(R3, tag as i32);
    a.call(crate::bpf::HELPER_SKB_VLAN_PUSH);
    // A failed push (no memory) still goes to the tap: the reader drops an untagged frame it
    // must check, rather than the kernel forwarding it past kxdp.
    redirect_and_finish(a, target)
}

/// The tagged redirect at `pref`/`protocol`: [`tag_and_redirect`] loaded and attached as a
/// direct-action `cls_bpf` filter (the filter holds the program; its descriptor closes here).
fn tagged_filter(
    ifindex: u32,
    pref: u16,
    protocol: u16,
    target: u32,
    tag: u16,
    with: RedirectPrograms,
    handle: TcHandle,
) -> io::Result<(TcMessage, std::os::fd::OwnedFd)> {
    let prog = crate::bpf::load_program(
        crate::bpf::BPF_PROG_TYPE_SCHED_CLS,
        0,
        &tag_and_redirect(tag, target, with),
        "the tap redirect's tc program",
    )?;
    let mut m = filter(ifindex, pref, protocol, handle);
    bpf_filter(&mut m, &prog, format!("{TAG_NAME}{tag}"));
    Ok((m, prog))
}

/// The filter's kind and, for a tagged redirect, its tag (from its name).
fn kind_and_tag(m: &TcMessage) -> (String, Option<u16>) {
    let kind = m.attributes.iter().find_map(|a| match a {
        TcAttribute::Kind(k) => Some(k.clone()),
        _ => None,
    });
    let tag = m.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(opts) => opts.iter().find_map(|o| match o {
            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => n.strip_prefix(TAG_NAME)?.parse().ok(),
            _ => None,
        }),
        _ => None,
    });
    (kind.unwrap_or_default(), tag)
}

/// The match-everything u32 filter whose action redirects to the egress of `target`.
fn redirect_filter(
    ifindex: u32,
    pref: u16,
    protocol: u16,
    target: u32,
    handle: TcHandle,
) -> TcMessage {
    let mut generic = TcActionGeneric::default();
    // The packet is consumed here: the redirect is its only way on.
    generic.action = TcActionType::Stolen;
    let mut mirror = TcMirror::default();
    mirror.generic = generic;
    mirror.eaction = TcMirrorActionType::EgressRedir;
    mirror.ifindex = target;
    let mut action = TcAction::default();
    action.tab = 1;
    action.attributes = vec![
        TcActionAttribute::Kind("mirred".into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
            mirror,
        ))]),
    ];
    let mut m = filter(ifindex, pref, protocol, handle);
    // One key that masks nothing matches every packet; terminal: no further lookups.
    let mut sel = TcU32Selector::default();
    sel.flags = TcU32SelectorFlags::Terminal;
    sel.nkeys = 1;
    sel.keys = vec![TcU32Key::default()];
    m.attributes.push(TcAttribute::Kind("u32".into()));
    m.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::Selector(sel)),
        TcOption::U32(TcFilterU32Option::Action(vec![action])),
        // Never offloaded to a NIC: the redirect target is a tap.
        TcOption::U32(TcFilterU32Option::Flags(TcU32OptionFlags::SkipHw)),
    ]));
    m
}

/// The preferences kxdp's filters take from `pref`: the IPv4 redirect, the IPv6 neighbour
/// discovery pass (`true`), the IPv6 redirect.
fn prefs(pref: u16) -> io::Result<[(u16, u16, bool); 3]> {
    match pref.checked_add(2) {
        Some(last) if pref > 0 => Ok([
            (pref, ETH_P_IP, false),
            (pref + 1, ETH_P_IPV6, true),
            (last, ETH_P_IPV6, false),
        ]),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("tc filter preference {pref}: 1 to 65533 (it and the next two are used)"),
        )),
    }
}

fn context(e: io::Error, what: &str, ifindex: u32) -> io::Error {
    io::Error::new(e.kind(), format!("{what} on interface {ifindex}: {e}"))
}

/// Redirects every IPv4 (filter preference `pref`) and IPv6 (`pref + 2`) packet arriving on
/// `ifindex` to the egress of `target` but IPv6 neighbour discovery (passed at `pref + 1`),
/// adding the clsact qdisc when missing; with `tag` (1 to [`MAX_TAG`]), each packet redirected
/// carries an 802.1Q tag with that VLAN ID (module docs); with a tag, `with.offload` puts the
/// flows in those maps on the in-kernel fast path (the IPv4 filter's program only:
/// `crate::offload`) and `with.steer` leaves the node's own traffic to the kernel.
pub fn redirect_ingress(
    ifindex: u32,
    target: u32,
    pref: u16,
    tag: Option<u16>,
    with: RedirectPrograms,
) -> io::Result<()> {
    let prefs = prefs(pref)?;
    if let Some(t) = tag.filter(|t| !(1..=MAX_TAG).contains(t)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("VLAN ID {t}: 1 to {MAX_TAG}"),
        ));
    }
    match acked(
        RouteNetlinkMessage::NewQueueDiscipline(clsact(ifindex)),
        NLM_F_CREATE | NLM_F_EXCL,
    ) {
        Err(e) if e.raw_os_error() == Some(EEXIST) => {}
        r => r.map_err(|e| context(e, "adding the clsact qdisc", ifindex))?,
    }
    for (p, proto, nd) in prefs {
        let kind = match (nd, tag) {
            (false, Some(_)) => TcFilterBpf::KIND,
            _ => "u32",
        };
        let (handle, flags) = match existing(ifindex, p, proto)
            .map_err(|e| context(e, "listing the ingress filters", ifindex))?
        {
            Some((h, k, _)) if k == kind => (h, NLM_F_REPLACE),
            // Another kind at this preference (a redirect without tags before): the kernel
            // replaces a filter only with one of its kind, so it goes first.
            Some(_) => {
                remove_filter(ifindex, p, proto)?;
                (TcHandle::UNSPEC, NLM_F_CREATE | NLM_F_EXCL)
            }
            None => (TcHandle::UNSPEC, NLM_F_CREATE | NLM_F_EXCL),
        };
        // The program's descriptor lives until the filter holds it.
        let (m, _prog) = match (nd, tag) {
            (true, _) => (nd_pass_filter(ifindex, p, handle), None),
            (false, Some(t)) => {
                let with = RedirectPrograms {
                    offload: with.offload.filter(|_| proto == ETH_P_IP),
                    ..with
                };
                let (m, prog) = tagged_filter(ifindex, p, proto, target, t, with, handle)
                    .map_err(|e| context(e, "loading the tap redirect", ifindex))?;
                (m, Some(prog))
            }
            (false, None) => (redirect_filter(ifindex, p, proto, target, handle), None),
        };
        acked(RouteNetlinkMessage::NewTrafficFilter(m), flags)
            .map_err(|e| context(e, "adding the redirect filter", ifindex))?;
    }
    Ok(())
}

/// The VLAN ID the IPv4 redirect at `pref` on `ifindex` pushes (what an earlier kxdp chose: a
/// restart keeps it, so frames already tagged keep their meaning); None without one.
pub fn redirect_tag(ifindex: u32, pref: u16) -> io::Result<Option<u16>> {
    Ok(existing(ifindex, pref, ETH_P_IP)?.and_then(|(_, _, tag)| tag))
}

/// Removes the filters [`redirect_ingress`] added at `pref` (a missing one is not an error;
/// the clsact qdisc stays for whoever else uses it).
pub fn remove_redirect(ifindex: u32, pref: u16) -> io::Result<()> {
    for (p, proto, _) in prefs(pref)? {
        remove_filter(ifindex, p, proto)?;
    }
    Ok(())
}

/// Removes the filters at `pref`/`protocol` (a missing one is not an error).
fn remove_filter(ifindex: u32, pref: u16, protocol: u16) -> io::Result<()> {
    remove_filter_at(ingress(), ifindex, pref, protocol)
}

/// [`remove_filter`] at the clsact hook `hook`.
fn remove_filter_at(hook: TcHandle, ifindex: u32, pref: u16, protocol: u16) -> io::Result<()> {
    match acked(
        // No handle: the whole tcf_proto at this preference, which is kxdp's alone.
        RouteNetlinkMessage::DelTrafficFilter(filter_at(
            hook,
            ifindex,
            pref,
            protocol,
            TcHandle::UNSPEC,
        )),
        0,
    ) {
        // No such filter, or no clsact qdisc at all (EINVAL).
        Err(e) if matches!(e.raw_os_error(), Some(ENOENT) | Some(EINVAL)) => Ok(()),
        r => r.map_err(|e| context(e, "removing the redirect filter", ifindex)),
    }
}

/// The loopback device: ifindex 1 in every network namespace.
pub const LOOPBACK: u32 = 1;
/// The preference of kxdp's node-ports redirect on `lo`'s egress.
pub const NODE_PORTS_PREF: u16 = 0xcd10;
/// Every protocol (the filter's program tells IPv4 and IPv6 apart).
const ETH_P_ALL: u16 = 0x0003;
/// The name of the node-ports redirect's filter.
const NODE_PORTS_NAME: &str = "kxdp-node-ports";

/// The program of [`redirect_node_ports`]: the XDP program's steering on the packet; what it
/// would hand to the dataplane (a node address and a NodePort kxdp serves) gets `macs`
/// (destination, source) and goes to the egress of `target`; everything else goes on as it was
/// (`TC_ACT_OK`).
fn node_ports_to(
    target: u32,
    macs: [u8; 12],
    maps: crate::xdp::SteerMaps,
) -> Vec<crate::bpf::Insn> {
    use crate::bpf::asm::*;
    const MACS: i16 = -64;
    let mut a = Asm::default();
    a.mov_x(R6, R1);
    steer_or_pass(
        &mut a,
        maps,
        crate::xdp::SteerTo {
            dataplane: "redirect",
            kernel: "local",
            short: "local",
            other: "local",
        },
    );
    a.label("redirect");
    for (i, w) in macs.chunks_exact(4).enumerate() {
        a.mov_k(R1, i32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
        a.stx(W, R10, MACS + 4 * i as i16, R1);
    }
    a.mov_x(R1, R6);
    a.mov_k(R2, 0);
    a.mov_x(R3, R10);
    a.alu_k(ADD, R3, MACS as i32);
    a.mov_k(R4, 12);
    a.mov_k(R5, 0);
    a.call(crate::bpf::HELPER_SKB_STORE_BYTES);
    redirect_and_finish(a, target)
}

/// Sends the node's own packets to its NodePorts to kxdp: a direct-action `cls_bpf` filter at
/// `lo`'s egress (preference `pref`, every protocol) whose program runs the XDP program's
/// steering over each packet the node sends to itself and redirects those the dataplane must
/// see (a node address and a NodePort kxdp serves, the `ports` bitmap) to the egress of
/// `target` (the host path's `kxdp0`, so they arrive on `kxdp1`), with `macs` as their
/// Ethernet destination and source (`kxdp1`'s and `kxdp0`'s, as a route through `kxdp0`
/// would write them). The rest stays local. Where policy-routing rules did this, the kernel
/// would look every route up through its rule list for as long as the namespace lives. Attaching
/// again replaces the filter in place.
pub fn redirect_node_ports(
    lo: u32,
    target: u32,
    macs: [u8; 12],
    steer: crate::xdp::SteerMaps,
    pref: u16,
) -> io::Result<()> {
    match acked(
        RouteNetlinkMessage::NewQueueDiscipline(clsact(lo)),
        NLM_F_CREATE | NLM_F_EXCL,
    ) {
        Err(e) if e.raw_os_error() == Some(EEXIST) => {}
        r => r.map_err(|e| context(e, "adding the clsact qdisc", lo))?,
    }
    let (handle, flags) = match existing_at(egress(), lo, pref, ETH_P_ALL)
        .map_err(|e| context(e, "listing the egress filters", lo))?
    {
        Some((h, k, _)) if k == TcFilterBpf::KIND => (h, NLM_F_REPLACE),
        Some(_) => {
            remove_filter_at(egress(), lo, pref, ETH_P_ALL)?;
            (TcHandle::UNSPEC, NLM_F_CREATE | NLM_F_EXCL)
        }
        None => (TcHandle::UNSPEC, NLM_F_CREATE | NLM_F_EXCL),
    };
    let prog = crate::bpf::load_program(
        crate::bpf::BPF_PROG_TYPE_SCHED_CLS,
        0,
        &node_ports_to(target, macs, steer),
        "the node-ports redirect's tc program",
    )
    .map_err(|e| context(e, "loading the node-ports redirect", lo))?;
    let mut m = filter_at(egress(), lo, pref, ETH_P_ALL, handle);
    bpf_filter(&mut m, &prog, NODE_PORTS_NAME.into());
    acked(RouteNetlinkMessage::NewTrafficFilter(m), flags)
        .map_err(|e| context(e, "adding the node-ports redirect", lo))
}

/// Removes the filter [`redirect_node_ports`] added at `pref` (a missing one is not an error).
pub fn remove_node_ports_redirect(lo: u32, pref: u16) -> io::Result<()> {
    remove_filter_at(egress(), lo, pref, ETH_P_ALL)
}

/// Whether [`redirect_node_ports`]'s filter is at `pref` on `lo`.
pub fn node_ports_redirected(lo: u32, pref: u16) -> io::Result<bool> {
    Ok(existing_at(egress(), lo, pref, ETH_P_ALL)?.is_some())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sys::testing::{capture_on, in_private_netns};
    use netlink_packet_core::{Emitable, Parseable};

    #[test]
    fn preferences_out_of_range_are_refused() {
        for p in [0, u16::MAX - 1, u16::MAX] {
            let e =
                redirect_ingress(1, 2, p, None, RedirectPrograms::default()).expect_err("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{p}");
            assert!(remove_redirect(1, p).is_err());
        }
    }

    #[test]
    fn the_filter_is_what_tc_would_send() {
        let m = redirect_filter(7, 100, ETH_P_IP, 9, TcHandle::UNSPEC);
        let mut buf = vec![0u8; m.buffer_len()];
        m.emit(&mut buf);
        let back = TcMessage::parse(&buf[..]).unwrap();
        assert_eq!(back, m);
        assert_eq!(kind_and_tag(&back), ("u32".to_string(), None));
        for t in [0, MAX_TAG + 1] {
            let e = redirect_ingress(1, 2, 100, Some(t), RedirectPrograms::default())
                .expect_err("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{t}");
        }
        assert_eq!(back.header.index, 7);
        assert_eq!(back.header.parent.major, 0xffff);
        assert_eq!(back.header.parent.minor, 0xfff2);
        // tcm_info as tc prints it: pref 100, protocol 0x0800 in network order.
        assert_eq!(buf[16..20], info(100, ETH_P_IP).to_ne_bytes());
        assert_eq!(info(100, ETH_P_IP) >> 16, 100);
        assert_eq!((info(100, ETH_P_IP) as u16).to_ne_bytes(), [0x08, 0x00]);
        let nd = nd_pass_filter(7, 101, TcHandle::UNSPEC);
        let mut buf = vec![0u8; nd.buffer_len()];
        nd.emit(&mut buf);
        assert_eq!(TcMessage::parse(&buf[..]).unwrap(), nd);
        // The key as tc sends it: value and mask in network order.
        let key = [0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x3a, 0xff];
        assert!(buf.windows(8).any(|w| w == key), "{buf:02x?}");
    }

    /// Needs root, `ip` and `tc`; runs in a private network namespace (a thread of its own).
    #[test]
    fn attaches_replaces_in_place_and_removes() {
        in_private_netns(|| {
            // The output without the action's index (a replacement makes a new action).
            let sh = |c: &str| {
                let o = std::process::Command::new("sh").args(["-c", c]).output();
                o.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("index "))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            sh("ip link add kxva type veth peer name kxvb");
            let (Ok(veth), Ok(other)) = (crate::ifindex("kxva"), crate::ifindex("kxvb")) else {
                eprintln!("SKIPPED: no veth here");
                return;
            };
            redirect_ingress(veth, other, 100, None, RedirectPrograms::default()).unwrap();
            let first = sh("tc filter show dev kxva ingress");
            redirect_ingress(veth, other, 100, None, RedirectPrograms::default()).unwrap();
            let again = sh("tc filter show dev kxva ingress");
            assert_eq!(first, again, "attaching again replaces in place");
            for (pref, proto) in [("100", "ip"), ("101", "ipv6"), ("102", "ipv6")] {
                let nodes = again
                    .lines()
                    .filter(|l| l.contains(&format!("protocol {proto} pref {pref} u32")))
                    .filter(|l| l.contains("::"))
                    .count();
                assert_eq!(nodes, 1, "{again}");
            }
            assert!(again.contains("Egress Redirect to device kxvb"), "{again}");
            // Neighbour discovery passes: the key at 4 with no action.
            assert!(again.contains("match 00003aff/0000ffff at 4"), "{again}");
            assert_eq!(redirect_tag(veth, 100).unwrap(), None);
            // Tagged: the program takes the untagged redirect's place, and again in place.
            for tag in [7, 7, 9] {
                redirect_ingress(veth, other, 100, Some(tag), RedirectPrograms::default()).unwrap();
                assert_eq!(redirect_tag(veth, 100).unwrap(), Some(tag));
                let tagged = sh("tc filter show dev kxva ingress");
                for (pref, proto) in [("100", "ip"), ("102", "ipv6")] {
                    let filters = tagged
                        .lines()
                        .filter(|l| l.contains(&format!("protocol {proto} pref {pref} bpf")))
                        .filter(|l| l.contains(&format!("kxdp-tap tag {tag} direct-action")))
                        .count();
                    assert_eq!(filters, 1, "{tagged}");
                }
                assert!(tagged.contains("match 00003aff/0000ffff at 4"), "{tagged}");
            }
            remove_redirect(veth, 100).unwrap();
            assert_eq!(sh("tc filter show dev kxva ingress").trim(), "");
            assert_eq!(redirect_tag(veth, 100).unwrap(), None);
            remove_redirect(veth, 100).unwrap();
        });
    }

    /// kxdp's test tap `kxtap1` (one queue, up) and the indexes of the veths `kxva` and `kxvb`
    /// and of the tap; None, with a note, where there are none.
    fn tap_and_veths() -> Option<(Vec<crate::tap::TapQueue>, u32, u32, u32)> {
        let Ok(qs) = crate::tap::TapQueue::open("kxtap1", 1, 0) else {
            eprintln!("SKIPPED: no tap here");
            return None;
        };
        qs[0].set_up().unwrap();
        let (Ok(a), Ok(b), Ok(tap)) = (
            crate::ifindex("kxva"),
            crate::ifindex("kxvb"),
            crate::ifindex("kxtap1"),
        ) else {
            eprintln!("SKIPPED: no veth here");
            return None;
        };
        Some((qs, a, b, tap))
    }

    /// Sends `frame` out of `ifindex` through a packet socket (it arrives on the veth's peer).
    fn send_raw(ifindex: u32, frame: &[u8]) {
        // SAFETY: a plain socket(2) call; the descriptor is owned right away.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = ifindex as i32;
        sa.sll_halen = 6;
        // SAFETY: `frame` and `sa` are live for the call, their lengths as given.
        let n = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(n, frame.len() as isize, "{}", io::Error::last_os_error());
    }

    /// Needs root and a tap; runs in a private network namespace (a thread of its own). A frame
    /// redirected with a tag is read back untagged with the tag; without one, whole.
    #[test]
    fn a_tagged_redirect_names_the_interface() {
        in_private_netns(|| {
            let run = |c: &str| std::process::Command::new("sh").args(["-c", c]).status();
            // No IPv6: its multicast listener reports would be redirected too.
            let _ = run(
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
            );
            let _ = run("ip link add kxva type veth peer name kxvb && ip link set kxva up && ip link set kxvb up");
            let Some((qs, a, b, tap)) = tap_and_veths() else {
                return;
            };
            // An IPv4 UDP frame (what is in it does not matter to the redirect).
            let mut frame = vec![0u8; 60];
            frame[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
            frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
            frame[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
            frame[14] = 0x45;
            frame[23] = 17;
            for (i, x) in frame[34..].iter_mut().enumerate() {
                *x = i as u8 + 1;
            }
            let mut buf = vec![0u8; 2048];
            for tag in [Some(7), None, Some(MAX_TAG)] {
                redirect_ingress(b, tap, 100, tag, RedirectPrograms::default()).unwrap();
                send_raw(a, &frame);
                // The kernel's own frames (if any) are passed over; ours comes within 2 s.
                let mut found = false;
                while !found && qs[0].wait_readable(2000).unwrap() {
                    let (_, len, got) = qs[0].read_untagged(&mut buf).unwrap();
                    if buf[..len] == frame[..] {
                        assert_eq!(got, tag);
                        found = true;
                    }
                }
                assert!(found, "{tag:?}: not in the tap");
            }
            remove_redirect(b, 100).unwrap();
        });
    }

    /// The first frame on `fd` that `want` accepts, within a few receive timeouts.
    fn recv_matching(fd: &std::os::fd::OwnedFd, want: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        for _ in 0..300 {
            // SAFETY: `buf` is live and writable for its length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return None;
            }
            if want(&buf[..n as usize]) {
                return Some(buf[..n as usize].to_vec());
            }
        }
        None
    }

    /// A TCP/IPv4 frame to `dst:dport` from 10.8.0.2:40000 addressed to `mac`, checksums
    /// complete, with TCP flags `flags`.
    /// A client's flow to a ClusterIP (10.8.0.2:40000 to 172.30.0.10:80, the frames of
    /// [`tcp_frame`]) and its translation to an endpoint (10.9.0.2:5201), counted in slot 3 and
    /// bound to `ingress`.
    pub(crate) fn sample_flow(
        ingress: u32,
    ) -> (crate::offload::FlowKey, crate::offload::FlowRewrite) {
        let key = crate::offload::FlowKey {
            src: [10, 8, 0, 2],
            dst: [172, 30, 0, 10],
            sport: 40000,
            dport: 80,
            proto: 6,
        };
        let rewrite = crate::offload::FlowRewrite {
            src: [10, 8, 0, 2],
            dst: [10, 9, 0, 2],
            sport: 40000,
            dport: 5201,
            slot: 3,
            ingress,
            egress: None,
        };
        (key, rewrite)
    }

    pub(crate) fn tcp_frame(mac: [u8; 6], dst: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + 16];
        f[..6].copy_from_slice(&mac);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xa]);
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        let total = (f.len() - 14) as u16;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 8, 0, 2]);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&40000u16.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[38..42].copy_from_slice(&1u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = flags;
        f[48..50].copy_from_slice(&1024u16.to_be_bytes());
        for (i, x) in f[54..].iter_mut().enumerate() {
            *x = i as u8;
        }
        let ip = !sum(&f[14..34], 0);
        f[24..26].copy_from_slice(&ip.to_be_bytes());
        let tcp = !sum(&f[34..], pseudo(&f));
        f[50..52].copy_from_slice(&tcp.to_be_bytes());
        f
    }

    /// The one's-complement sum of `b` (folded), starting from `start`.
    fn sum(b: &[u8], start: u32) -> u16 {
        let mut s = start;
        for c in b.chunks(2) {
            s += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The TCP pseudo-header's sum of an IPv4 frame.
    fn pseudo(f: &[u8]) -> u32 {
        sum(&f[26..34], 0) as u32 + 6 + (f.len() - 34) as u32
    }

    /// Needs root, a tap and veths; runs in a private network namespace (a thread of its own).
    /// A flow on the fast path is rewritten (checksums right), counted and routed on by the
    /// kernel; its SYN, and any flow not on it, still go to the tap; the node's own traffic
    /// stays with the kernel, a NodePort goes to the tap.
    #[test]
    fn an_offloaded_flow_is_rewritten_counted_and_routed() {
        in_private_netns(|| {
            let run = |c: &str| std::process::Command::new("sh").args(["-c", c]).status();
            let _ = run(
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
                 net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0",
            );
            let _ = run(
                "ip link add kxva type veth peer name kxvb && ip link add kxvc type veth peer name kxvd \
                 && ip link set kxvd address 02:00:00:00:00:0d \
                 && ip link set kxvb address 02:00:00:00:00:0b \
                 && for l in kxva kxvb kxvc kxvd; do ip link set $l up; done \
                 && ip addr add 10.9.0.1/24 dev kxvc \
                 && ip neigh replace 10.9.0.2 lladdr 02:00:00:00:00:0d dev kxvc nud permanent \
                 && ip addr add 10.8.0.99/24 dev kxvb \
                 && ip neigh replace 10.8.0.2 lladdr 02:00:00:00:00:0a dev kxvb nud permanent",
            );
            let (Some((qs, a, b, tap)), Ok(d)) = (tap_and_veths(), crate::ifindex("kxvd")) else {
                return;
            };
            let mac = [0x02, 0, 0, 0, 0, 0x0b];
            let fast = crate::offload::FlowOffload::new(4096).unwrap();
            let node = crate::xdp::SharedMaps::create().unwrap();
            node.set_node(&["10.8.0.99".parse().unwrap()], &[30080])
                .unwrap();
            redirect_ingress(
                b,
                tap,
                100,
                Some(5),
                RedirectPrograms {
                    offload: Some(fast.maps()),
                    steer: Some(node.steer_maps()),
                },
            )
            .unwrap();
            let (key, rewrite) = sample_flow(b);
            fast.install(&key, &rewrite).unwrap();
            let capture = capture_on(d, 1);
            let ack = tcp_frame(mac, [172, 30, 0, 10], 80, 0x10);
            send_raw(a, &ack);
            let got = recv_matching(&capture, |f| f.len() == ack.len() && f[23] == 6)
                .expect("the offloaded frame leaves through kxvc");
            assert_eq!(&got[30..34], &[10, 9, 0, 2]);
            assert_eq!(u16::from_be_bytes([got[36], got[37]]), 5201);
            assert_eq!(got[22], 63, "the kernel routed it");
            assert_eq!(sum(&got[14..34], 0), 0xffff, "IP checksum");
            assert_eq!(sum(&got[34..], pseudo(&got)), 0xffff, "TCP checksum");
            assert_eq!(fast.counts(3), (1, ack.len() as u64));
            // With an egress from the worker's FIB: straight to kxvc's transmit with its MACs
            // (not the neighbour entry's), TTL one lower, past the kernel's routing.
            let c = crate::ifindex("kxvc").unwrap();
            let hop = crate::offload::DirectHop {
                ifindex: c,
                dst_mac: [0x02, 0, 0, 0, 0, 0xee],
                src_mac: [0x02, 0, 0, 0, 0, 0x0c],
            };
            let direct = crate::offload::FlowRewrite {
                egress: Some(hop),
                ..rewrite
            };
            fast.install(&key, &direct).unwrap();
            send_raw(a, &ack);
            // (The kernel's copies of the frame before may still be arriving: kxvd forwards
            // what is addressed to it back out of kxvc until its TTL runs out.)
            let got = recv_matching(&capture, |f| f.len() == ack.len() && f[..6] == hop.dst_mac)
                .expect("the direct frame leaves through kxvc");
            assert_eq!(&got[6..12], &hop.src_mac);
            assert_eq!(&got[30..34], &[10, 9, 0, 2]);
            assert_eq!(got[22], 63, "TTL one lower");
            assert_eq!(sum(&got[14..34], 0), 0xffff, "IP checksum");
            assert_eq!(sum(&got[34..], pseudo(&got)), 0xffff, "TCP checksum");
            assert_eq!(fast.counts(3), (2, 2 * ack.len() as u64));
            fast.install(&key, &rewrite).unwrap();
            // A SYN and a RST of the same flow, and a flow not installed, go to the tap.
            let mut buf = vec![0u8; 2048];
            for frame in [
                tcp_frame(mac, [172, 30, 0, 10], 80, 0x02),
                tcp_frame(mac, [172, 30, 0, 10], 80, 0x14),
                tcp_frame(mac, [172, 30, 0, 11], 80, 0x10),
            ] {
                send_raw(a, &frame);
                let mut found = false;
                while !found && qs[0].wait_readable(2000).unwrap() {
                    let (_, len, got) = qs[0].read_untagged(&mut buf).unwrap();
                    found = buf[..len] == frame[..] && got == Some(5);
                }
                assert!(found, "not in the tap: {frame:02x?}");
            }
            assert_eq!(fast.counts(3).0, 2);
            // A SYN-ACK and a FIN take the fast path, their flags reported in the slot; a
            // segment without FIN after the FIN (the close's last ACK) sets AFTER_FIN.
            let reported = |want: u64| {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
                while fast.flags(3) != want && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                fast.flags(3)
            };
            assert_eq!(reported(0x10), 0x10);
            for (flags, seen) in [(0x12, 0x12), (0x11, 0x13)] {
                let f = tcp_frame(mac, [172, 30, 0, 10], 80, flags);
                send_raw(a, &f);
                let got = recv_matching(&capture, |g| g.len() == f.len() && g[47] == flags)
                    .expect("it leaves through kxvc");
                assert_eq!(&got[30..34], &[10, 9, 0, 2]);
                assert_eq!(reported(seen), seen);
            }
            send_raw(a, &ack);
            let last = 0x13 | crate::offload::AFTER_FIN;
            assert_eq!(reported(last), last);
            assert_eq!(fast.counts(3).0, 5);
            // Bound to another interface, the flow takes the tap.
            let elsewhere = crate::offload::FlowRewrite {
                ingress: a,
                ..rewrite
            };
            fast.install(&key, &elsewhere).unwrap();
            send_raw(a, &ack);
            let mut found = false;
            while !found && qs[0].wait_readable(2000).unwrap() {
                let (_, len, _) = qs[0].read_untagged(&mut buf).unwrap();
                found = buf[..len] == ack[..];
            }
            assert!(found, "a flow bound elsewhere is not on the fast path");
            assert_eq!(fast.counts(3).0, 5);
            assert!(fast.remove(&key).unwrap());
            assert!(!fast.remove(&key).unwrap());
            // The node's own traffic stays with the kernel (which resets a SYN to a closed
            // port), a NodePort goes to the tap.
            let back = capture_on(a, 1);
            send_raw(a, &tcp_frame(mac, [10, 8, 0, 99], 22, 0x02));
            let rst = recv_matching(&back, |f| {
                f.len() >= 54 && f[23] == 6 && f[26..30] == [10, 8, 0, 99]
            });
            assert!(
                rst.is_some_and(|f| f[47] & 0x04 != 0),
                "the kernel answered"
            );
            let node_port = tcp_frame(mac, [10, 8, 0, 99], 30080, 0x02);
            send_raw(a, &node_port);
            let mut found = false;
            while !found && qs[0].wait_readable(2000).unwrap() {
                let (_, len, _) = qs[0].read_untagged(&mut buf).unwrap();
                found = buf[..len] == node_port[..];
            }
            assert!(found, "a NodePort goes to the tap");
            remove_redirect(b, 100).unwrap();
        });
    }

    /// Needs root and `ip`; a private network namespace. The node's own TCP to its address
    /// leaves through the redirect when the port is a NodePort kxdp serves, with the host
    /// path's MACs; another port stays local (refused at once); without the filter, all local.
    #[test]
    fn the_nodes_own_node_port_packets_go_to_the_host_path() {
        in_private_netns(|| {
            let run = |c: &str| std::process::Command::new("sh").args(["-c", c]).status();
            let _ = run(
                "ip link set lo up && ip link add kxva type veth peer name kxvb \
                 && ip link set kxva address 02:00:00:00:00:0a \
                 && ip link set kxvb address 02:00:00:00:00:0b \
                 && ip link set kxva up && ip link set kxvb up \
                 && ip addr add 10.8.0.99/24 dev kxvb",
            );
            let (Ok(a), Ok(b)) = (crate::ifindex("kxva"), crate::ifindex("kxvb")) else {
                eprintln!("SKIPPED: no veth pair");
                return;
            };
            let node = crate::xdp::SharedMaps::create().unwrap();
            node.set_node(&["10.8.0.99".parse().unwrap()], &[30080])
                .unwrap();
            // To kxva (as to kxdp1), from kxvb (as from kxdp0): sent into kxvb, seen on kxva.
            let macs = [2, 0, 0, 0, 0, 0x0a, 2, 0, 0, 0, 0, 0x0b];
            redirect_node_ports(LOOPBACK, b, macs, node.steer_maps(), 7).unwrap();
            assert!(node_ports_redirected(LOOPBACK, 7).unwrap());
            // Again: replaced in place.
            redirect_node_ports(LOOPBACK, b, macs, node.steer_maps(), 7).unwrap();
            let capture = capture_on(a, 1);
            let connect = |port: u16| {
                let to = std::net::SocketAddr::from(([10, 8, 0, 99], port));
                std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_millis(300))
            };
            let syn_to = |port: u16| {
                move |f: &[u8]| {
                    f.len() >= 54
                        && f[12..14] == [0x08, 0x00]
                        && f[23] == 6
                        && u16::from_be_bytes([f[36], f[37]]) == port
                        && f[47] & 0x02 != 0
                }
            };
            // A NodePort: nobody answers on kxva, so the connect times out; its SYN is there.
            assert!(connect(30080).is_err());
            let got = recv_matching(&capture, syn_to(30080)).expect("the SYN on the host path");
            assert_eq!(&got[..12], &macs, "the host path's MACs");
            assert_eq!(&got[26..30], &[10, 8, 0, 99], "from the node's address");
            // Not a NodePort: local, refused at once, nothing on the host path.
            let e = connect(30081).expect_err("nothing listens");
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
            assert!(recv_matching(&capture, syn_to(30081)).is_none());
            // Without the filter the NodePort is local again.
            remove_node_ports_redirect(LOOPBACK, 7).unwrap();
            assert!(!node_ports_redirected(LOOPBACK, 7).unwrap());
            let e = connect(30080).expect_err("nothing listens");
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
            remove_node_ports_redirect(LOOPBACK, 7).unwrap();
        });
    }
}
