//! The egress stage: after `Pipeline::process`, where each packet leaves and in what shape.
//! `kxdp run`'s workers and `kxdp replay --routes` run it alike, so they agree.
//!
//! Per packet, from what the pipeline already parsed (the verdict's addresses and the offsets it
//! recorded; nothing is parsed again):
//!
//! ```text
//! forward / reject ─► FIB lookup (crate::fib) ─┬─ node address ─► kernel port
//!                                              ├─ port kxdp owns ─► TTL − 1 (forward only) ─► MACs
//!                                              │                   ─► L4 checksum completion ─► queued
//!                                              ├─ port kxdp does not own (overlay) ─► kernel port
//!                                              └─ miss ─► no-route / no-neighbour / no-egress
//!                                                  (no-neighbour: held instead, for a worker)
//! direct, destination outside `leaving` ──────────► kernel port (when there is one)
//! pass ─────────────────────────────────────────► kernel port (or no-kernel-port)
//! drop ─────────────────────────────────────────► nothing
//! ```
//!
//! Its drops are `Reason`s beside the pipeline's (`no-route`, `no-neighbour`, `no-egress`,
//! `ttl-expired`, `no-kernel-port`; the worker adds `tx-ring-full` when a TX ring has no room):
//! the stage sets them in the packet's verdict. Nothing is counted here: the caller counts the
//! final verdicts once, after the last stage (`Counters::record`), so stats, `/metrics` and
//! `kxdp monitor` count such a packet once, as the drop it is.
//!
//! The kernel port is the kxdp-side end of a veth pair whose other end is in the node's stack
//! (created by the host path, `io::host_path`): `pass` verdicts and packets for the node's own
//! addresses are sent there, with the peer's MAC as destination (broadcast and multicast frames
//! keep theirs), and the node's stack takes them as if they had arrived on that veth.
//!
//! Pod traffic kxdp does not translate (`direct`) to a destination outside the cluster's pod
//! ranges (a host outside the cluster, another node's address) also goes to the kernel port,
//! after NetworkPolicy has judged it: the kernel routes it on and the CNI's own masquerade rule
//! applies, so the outside host sees the node's address as it would without kxdp
//! (docs/services.md, "Pod egress"). The caller passes the pod ranges as `leaving` (None for a
//! batch received on the kernel port itself: the kernel already routed it to kxdp).
//!
//! Checksums: a frame a virtual interface (veth) received from a local sender carries TCP/UDP
//! checksums that are only partial (the sender offloaded them and veth never computes them);
//! when the ingress port is such an interface, the stage completes them for every packet it
//! sends on (forwarded or passed), using the pipeline's offsets. Generated replies (reject) are
//! built with full checksums.
//!
//! No allocation, lock or syscall per packet: one FIB lookup (one hash probe for a pod, a
//! neighbour or a node address; one per prefix length otherwise: `crate::fib`), an array load
//! for the port, in-place writes.

use std::collections::HashMap;

use kxdp_packet::{checksum, Addr, Family, IpProto, LinkType};

use crate::fib::{Fib, Hop, Miss};
use crate::pipeline::Frames;
use crate::snapshot::PrefixSet;
use crate::verdict::{Action, Reason, Verdict};

/// `out[i]` of a packet that is not sent.
pub const NOT_SENT: u16 = u16::MAX;

/// `out[i]` of a packet whose next hop has no neighbour yet, for a stage that holds such
/// packets ([`Egress::holding`]): its caller keeps the frame until the neighbour resolves
/// (`crate::hold`) and its verdict is left as the pipeline wrote it.
pub const HOLD: u16 = u16::MAX - 1;

/// The ports kxdp sends on (their position is the "slot" the stage writes into `out`) and the
/// optional kernel port.
#[derive(Clone, Debug, Default)]
pub struct Egress {
    slots: HashMap<u32, u16, ahash::RandomState>,
    /// `slots` as an array indexed by ifindex, for ifindexes below `DENSE_IFINDEX` (all of them
    /// on most nodes): the per-packet port lookup is then one load, not a hash probe.
    dense: Vec<u16>,
    kernel: Option<u32>,
    /// A next hop without a neighbour entry gives [`HOLD`] instead of a `no-neighbour` drop.
    hold: bool,
}

/// Ifindexes below this are looked up in `Egress::dense`.
const DENSE_IFINDEX: u32 = 1 << 16;

/// What the stage did beyond verdicts (counted by the caller).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressStats {
    pub checksums_completed: u64,
}

impl Egress {
    /// `ports[slot]` is the ifindex of the port at that slot; `kernel` the kernel port's ifindex
    /// (it must be one of `ports` to be used).
    pub fn new(ports: &[u32], kernel: Option<u32>) -> Egress {
        let slots: HashMap<u32, u16, ahash::RandomState> = ports
            .iter()
            .enumerate()
            .map(|(i, &ifindex)| (ifindex, i as u16))
            .collect();
        let dense_len = ports
            .iter()
            .filter(|&&i| i < DENSE_IFINDEX)
            .max()
            .map_or(0, |&i| i as usize + 1);
        let mut dense = vec![NOT_SENT; dense_len];
        for (&ifindex, &slot) in &slots {
            if ifindex < DENSE_IFINDEX {
                dense[ifindex as usize] = slot;
            }
        }
        Egress {
            slots,
            dense,
            kernel,
            hold: false,
        }
    }

    /// The stage for a caller that holds frames whose next hop has no neighbour yet: those get
    /// [`HOLD`] (the resolution is still requested) instead of a `no-neighbour` drop.
    pub fn holding(mut self, on: bool) -> Egress {
        self.hold = on;
        self
    }

    /// The slot of the port `ifindex`, if kxdp sends on it.
    #[inline]
    pub fn slot(&self, ifindex: u32) -> Option<u16> {
        if ifindex < DENSE_IFINDEX {
            return self
                .dense
                .get(ifindex as usize)
                .copied()
                .filter(|&s| s != NOT_SENT);
        }
        self.slots.get(&ifindex).copied()
    }

    /// Runs the stage over a batch the pipeline just processed: `verdicts[i]` belongs to frame
    /// `i`; `out[i]` receives the slot of the port to send frame `i` on, or [`NOT_SENT`].
    /// `link`: the frames' link type. `partial_checksums`: the batch came from an interface that hands over partial TCP/UDP
    /// checksums (veth). `unresolved` is told of next hops without a neighbour entry.
    #[allow(clippy::too_many_arguments)]
    pub fn process<F: Frames>(
        &self,
        frames: &mut F,
        verdicts: &mut [Verdict],
        out: &mut [u16],
        fib: &Fib,
        link: LinkType,
        partial_checksums: bool,
        leaving: Option<&PrefixSet>,
        stats: &mut EgressStats,
        mut unresolved: impl FnMut(u32, Addr, Family),
    ) {
        // Raw IP frames (a replayed capture of that link type) have no MACs to write.
        let ethernet = link == LinkType::Ethernet;
        let kernel = self
            .kernel
            .and_then(|k| Some((self.slot(k)?, k, fib.kernel_macs(k))));
        let n = frames.count().min(verdicts.len()).min(out.len());
        for i in 0..n {
            out[i] = NOT_SENT;
            let v = &mut verdicts[i];
            v.egress = 0;
            let hop = match v.action {
                Action::Drop => continue,
                Action::Pass => Ok(Hop::Kernel),
                // Untranslated pod traffic leaving the cluster: the kernel's path (and the
                // CNI's masquerade).
                Action::Forward
                    if v.reason == Reason::Direct
                        && v.has_addrs
                        // The original direction only: a reply of a connection the kernel never
                        // saw (from outside to a pod) must not meet its masquerade rule.
                        && v.client == v.orig_src
                        && kernel.is_some()
                        && leaving.is_some_and(|c| !c.is_empty() && !c.contains(&v.dst, v.family)) =>
                {
                    Ok(Hop::Kernel)
                }
                Action::Forward | Action::Reject if v.has_addrs => {
                    self.via_kernel_if_unowned(fib.lookup(&v.dst, v.family), fib, kernel.is_some())
                }
                // Forward/reject always carry addresses; nothing to route otherwise.
                Action::Forward | Action::Reject => Err(Miss::NoRoute),
            };
            let (frame, len) = frames.frame_mut(i);
            let frame = &mut frame[..*len];
            match hop {
                Ok(Hop::Kernel) => {
                    let Some((slot, ifindex, macs)) = kernel else {
                        v.set(Reason::NoKernelPort);
                        continue;
                    };
                    if let Some((dst_mac, src_mac)) = macs {
                        // Broadcast / multicast frames (ARP requests, ND) keep their destination.
                        if ethernet && frame.len() >= 12 && frame[0] & 1 == 0 {
                            frame[..6].copy_from_slice(&dst_mac);
                            frame[6..12].copy_from_slice(&src_mac);
                        }
                    }
                    if partial_checksums
                        && v.action != Action::Reject
                        && complete_l4_checksum(frame, v)
                    {
                        stats.checksums_completed += 1;
                    }
                    out[i] = slot;
                    v.egress = ifindex;
                }
                Ok(Hop::Port {
                    ifindex,
                    dst_mac,
                    src_mac,
                }) => {
                    let Some(slot) = self.slot(ifindex) else {
                        v.set(Reason::NoEgress);
                        continue;
                    };
                    // kxdp routes what it forwards: TTL / hop limit go down by one (replies it
                    // generates start fresh).
                    if v.action == Action::Forward
                        && !kxdp_packet::decrement_ttl_at(frame, v.l3_off as usize)
                    {
                        v.set(Reason::TtlExpired);
                        continue;
                    }
                    if ethernet && frame.len() >= 12 {
                        frame[..6].copy_from_slice(&dst_mac);
                        frame[6..12].copy_from_slice(&src_mac);
                    }
                    if partial_checksums
                        && v.action == Action::Forward
                        && complete_l4_checksum(frame, v)
                    {
                        stats.checksums_completed += 1;
                    }
                    out[i] = slot;
                    v.egress = ifindex;
                }
                Err(Miss::NoRoute) => v.set(Reason::NoRoute),
                Err(Miss::NoNeighbour(oif, addr)) => {
                    unresolved(oif, addr, v.family);
                    if self.hold {
                        out[i] = HOLD;
                    } else {
                        v.set(Reason::NoNeighbour);
                    }
                }
            }
        }
    }
}

impl Egress {
    /// A route through an interface kxdp does not send on — an overlay's VXLAN, IPIP, Geneve,
    /// WireGuard or tun device, whatever its kind — leads to the kernel port when there is one:
    /// the packet is already translated and judged, and the kernel's path applies the device's
    /// encapsulation or encryption and the CNI's rules. The host path steers what arrives on
    /// such devices back to kxdp (`hostPath.overlayInterfaces`), so replies are un-NATed.
    /// A missing neighbour behind such a device is the kernel's to resolve too; behind a bridge
    /// whose ports kxdp owns it stays a `no-neighbour` (the refresher resolves it).
    #[inline]
    fn via_kernel_if_unowned(
        &self,
        hop: Result<Hop, Miss>,
        fib: &Fib,
        has_kernel_port: bool,
    ) -> Result<Hop, Miss> {
        match hop {
            Ok(Hop::Port { ifindex, .. }) if has_kernel_port && self.slot(ifindex).is_none() => {
                Ok(Hop::Kernel)
            }
            Err(Miss::NoNeighbour(oif, _))
                if has_kernel_port && self.slot(oif).is_none() && !fib.is_bridge(oif) =>
            {
                Ok(Hop::Kernel)
            }
            hop => hop,
        }
    }
}

/// Recomputes the TCP/UDP checksum of a whole (unfragmented) packet at the offsets the pipeline
/// recorded, over the packet's current addresses. Returns whether it did.
pub fn complete_l4_checksum(frame: &mut [u8], v: &Verdict) -> bool {
    if !v.has_addrs || v.l4_off == 0 || v.fragment {
        return false;
    }
    let (l4, end) = (v.l4_off as usize, v.l3_off as usize + v.ip_len as usize);
    let off = match v.proto {
        IpProto::TCP => 16,
        IpProto::UDP => 6,
        _ => return false,
    };
    if end > frame.len() || l4 + off + 2 > end {
        return false;
    }
    // Forwarded packets carry their translated addresses; passed ones are untouched.
    let (src, dst) = match v.action {
        Action::Forward => (v.src, v.dst),
        _ => (v.orig_src, v.orig_dst),
    };
    frame[l4 + off..l4 + off + 2].copy_from_slice(&[0, 0]);
    let mut c = checksum::l4_checksum(&src, &dst, v.family, v.proto, &frame[l4..end]);
    if v.proto == IpProto::UDP && c == 0 {
        c = 0xffff;
    }
    frame[l4 + off..l4 + off + 2].copy_from_slice(&c.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fib::testing::{ip, link, local, neigh, route};
    use crate::fib::{FdbEntry, FibInput};
    use crate::pipeline::{Counters, SlotFrames};
    use kxdp_packet::verify;

    /// eth0 (1, default route via 192.168.0.1), pod veth (2, 10.1.0.11/32), unowned link (3,
    /// 10.3.0.0/16), bridge cni0 (10, 10.2.0.0/24) with port 12, kernel port 30 ↔ 31.
    fn fib() -> Fib {
        let mut links = vec![
            link(1, 1),
            link(2, 2),
            link(3, 3),
            link(10, 10),
            link(12, 12),
            link(30, 30),
            link(31, 31),
        ];
        links[3].bridge = true;
        links[4].master = Some(10);
        links[5].peer = Some(31);
        links[6].peer = Some(30);
        Fib::new(FibInput {
            links,
            addrs: vec![local(1, "192.168.0.10")],
            routes: vec![
                route("0.0.0.0", 0, 1, Some("192.168.0.1")),
                route("10.1.0.11", 32, 2, None),
                route("10.1.0.12", 32, 2, None),
                route("10.3.0.0", 16, 3, None),
                route("10.2.0.0", 24, 10, None),
            ],
            neighbours: vec![
                neigh(1, "192.168.0.1", 0xee),
                neigh(2, "10.1.0.11", 0xa1),
                neigh(3, "10.3.0.1", 0xa3),
                neigh(10, "10.2.0.5", 0xb5),
            ],
            fdb: vec![FdbEntry {
                bridge: 10,
                port: 12,
                mac: [0xb5; 6],
            }],
            ..Default::default()
        })
    }

    fn udp(dst: [u8; 4], ttl: u8, tcp: bool) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([9; 6], [8; 6]).ipv4([10, 1, 0, 13], dst, ttl);
        let mut f = Vec::new();
        if tcp {
            b.tcp(40000, 8080, 1, 1000)
                .syn()
                .write(&mut f, b"payload")
                .unwrap();
        } else {
            b.udp(40000, 5353).write(&mut f, b"payload").unwrap();
        }
        f
    }

    /// What the pipeline would have written for a packet it forwarded unchanged.
    fn meta(frame: &[u8]) -> kxdp_packet::PacketMeta {
        let mut m = kxdp_packet::PacketMeta::default();
        assert!(kxdp_packet::parse_into(frame, kxdp_packet::LinkType::Ethernet, &mut m).unwrap());
        m
    }

    fn verdict(frame: &[u8], reason: Reason) -> Verdict {
        let m = meta(frame);
        let mut v = Verdict::default();
        v.set(reason);
        v.has_addrs = true;
        v.family = m.family;
        v.proto = m.proto;
        (v.orig_src, v.src, v.orig_dst, v.dst) = (m.src, m.src, m.dst, m.dst);
        v.client = m.src;
        (v.l3_off, v.l4_off, v.ip_len) = (m.l3_off, m.l4_off, m.ip_len);
        v
    }

    struct Run {
        frames: SlotFrames,
        verdicts: Vec<Verdict>,
        out: Vec<u16>,
        counters: Counters,
        stats: EgressStats,
        unresolved: Vec<(u32, Addr)>,
    }

    fn run(packets: &[(Vec<u8>, Reason)], egress: &Egress, partial: bool) -> Run {
        run_leaving(packets, egress, partial, None, &[])
    }

    fn run_leaving(
        packets: &[(Vec<u8>, Reason)],
        egress: &Egress,
        partial: bool,
        leaving: Option<&PrefixSet>,
        replies: &[usize],
    ) -> Run {
        let mut frames = SlotFrames::new(packets.len(), 2048);
        let mut counters = Counters::default();
        let mut verdicts = Vec::new();
        for (p, r) in packets {
            frames.push(p);
            let mut v = verdict(p, *r);
            if replies.contains(&verdicts.len()) {
                v.client = v.dst;
            }
            verdicts.push(v);
        }
        let mut out = vec![0; packets.len()];
        let mut stats = EgressStats::default();
        let mut unresolved = Vec::new();
        egress.process(
            &mut frames,
            &mut verdicts,
            &mut out,
            &fib(),
            LinkType::Ethernet,
            partial,
            leaving,
            &mut stats,
            |oif, a, _| unresolved.push((oif, a)),
        );
        counters.record(&verdicts);
        Run {
            frames,
            verdicts,
            out,
            counters,
            stats,
            unresolved,
        }
    }

    #[test]
    fn each_packet_gets_a_port_or_one_named_drop() {
        let egress = Egress::new(&[1, 2, 12, 30], None);
        let packets = vec![
            (udp([10, 1, 0, 11], 64, false), Reason::ServiceDnat), // pod veth
            (udp([10, 1, 0, 12], 64, false), Reason::Direct),      // no neighbour
            (udp([10, 3, 0, 1], 64, false), Reason::Direct),       // unowned link
            (udp([10, 1, 0, 11], 1, false), Reason::Established),  // TTL runs out
            (udp([10, 2, 0, 5], 64, false), Reason::Direct),       // behind the bridge
            (udp([203, 0, 113, 7], 64, false), Reason::ReplyUnnat), // default route
            (udp([192, 168, 0, 10], 64, false), Reason::ToNode),   // pass, no kernel port
            (udp([10, 1, 0, 11], 64, false), Reason::CtInvalid),   // pipeline drop
        ];
        let r = run(&packets, &egress, false);
        let reasons: Vec<&str> = r.verdicts.iter().map(|v| v.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "service-dnat",
                "no-neighbour",
                "no-egress",
                "ttl-expired",
                "direct",
                "reply-unnat",
                "no-kernel-port",
                "ct-invalid"
            ]
        );
        assert_eq!(
            r.out,
            [1, NOT_SENT, NOT_SENT, NOT_SENT, 2, 0, NOT_SENT, NOT_SENT]
        );
        let egresses: Vec<u32> = r.verdicts.iter().map(|v| v.egress).collect();
        assert_eq!(egresses, [2, 0, 0, 0, 12, 1, 0, 0]);
        assert_eq!(r.unresolved, [(2, Addr::from_ip(ip("10.1.0.12")))]);
        // Counted once each, under the final reason and action.
        assert_eq!(r.counters.reasons.iter().sum::<u64>(), 8);
        assert_eq!(r.counters.reasons[Reason::NoEgress as usize], 1);
        assert_eq!(r.counters.reasons[Reason::Direct as usize], 1);
        assert_eq!(r.counters.actions[Action::Forward as usize], 3);
        assert_eq!(r.counters.actions[Action::Drop as usize], 5);
        // MACs rewritten, TTL decremented with a valid header checksum.
        let f = r.frames.get(0);
        assert_eq!(&f[..12], &[[0xa1; 6], [2; 6]].concat()[..]);
        assert_eq!(f[14 + 8], 63);
        let f = r.frames.get(4);
        assert_eq!(
            &f[..12],
            &[[0xb5; 6], [10; 6]].concat()[..],
            "bridge MAC as source"
        );
        assert!(verify::checksums(r.frames.get(5), &meta(r.frames.get(5))).is_ok());
        // The dropped TTL-1 packet is untouched.
        assert_eq!(r.frames.get(3)[14 + 8], 1);
    }

    #[test]
    fn node_traffic_and_passes_go_to_the_kernel_port() {
        let egress = Egress::new(&[1, 2, 30], Some(30));
        let packets = vec![
            (udp([192, 168, 0, 10], 64, false), Reason::ToNode),
            (udp([192, 168, 0, 10], 64, true), Reason::ReplyUnnat),
        ];
        let r = run(&packets, &egress, false);
        assert_eq!(r.out, [2, 2]);
        assert_eq!(r.verdicts[0].reason, Reason::ToNode);
        assert_eq!(r.verdicts[1].egress, 30);
        for i in 0..2 {
            assert_eq!(&r.frames.get(i)[..12], &[[31; 6], [30; 6]].concat()[..]);
        }
    }

    /// Untranslated pod traffic to outside the pod ranges takes the kernel's path (where the
    /// CNI's masquerade applies); inside them, and translated traffic, stay on kxdp's path.
    #[test]
    fn direct_traffic_leaving_the_cluster_goes_to_the_kernel_port() {
        let mut pods = PrefixSet::new();
        pods.insert(ip("10.0.0.0"), 8);
        let packets = vec![
            (udp([203, 0, 113, 7], 64, false), Reason::Direct),
            (udp([10, 1, 0, 11], 64, false), Reason::Direct),
            (udp([203, 0, 113, 7], 64, false), Reason::ReplyUnnat),
            // A pod's reply to an outside client whose connection came in through kxdp.
            (udp([203, 0, 113, 7], 64, false), Reason::Direct),
        ];
        let egress = Egress::new(&[1, 2, 30], Some(30));
        let r = run_leaving(&packets, &egress, false, Some(&pods), &[3]);
        assert_eq!(r.out, [2, 1, 0, 0]);
        assert_eq!(r.verdicts[0].reason, Reason::Direct);
        assert_eq!(&r.frames.get(0)[..12], &[[31; 6], [30; 6]].concat()[..]);
        // Not decremented: the kernel routes it on and does that.
        assert_eq!(r.frames.get(0)[14 + 8], 64);
        // Received on the kernel port (None), or no kernel port: the FIB decides.
        let r = run_leaving(&packets, &egress, false, None, &[3]);
        assert_eq!(r.out, [0, 1, 0, 0]);
        let egress = Egress::new(&[1, 2, 30], None);
        let r = run_leaving(&packets, &egress, false, Some(&pods), &[3]);
        assert_eq!(r.out, [0, 1, 0, 0]);
    }

    /// A route through an interface kxdp has no socket on (an overlay device) leads to the
    /// kernel port, translated and with its TTL left to the kernel; so does a next hop without a
    /// neighbour behind it. Without a kernel port it stays a `no-egress` drop; a next hop
    /// without a neighbour on a port kxdp owns, or behind a bridge, stays `no-neighbour`.
    #[test]
    fn routes_through_unowned_interfaces_go_to_the_kernel_port() {
        let packets = vec![
            (udp([10, 3, 0, 1], 64, false), Reason::ServiceDnat), // unowned link, neighbour known
            (udp([10, 3, 0, 9], 64, true), Reason::ReplyUnnat),   // unowned link, no neighbour
            (udp([10, 1, 0, 12], 64, false), Reason::Direct),     // owned veth, no neighbour
            (udp([10, 2, 0, 6], 64, false), Reason::Direct),      // behind the bridge, unknown
        ];
        let egress = Egress::new(&[1, 2, 12, 30], Some(30));
        let r = run(&packets, &egress, false);
        let reasons: Vec<&str> = r.verdicts.iter().map(|v| v.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "service-dnat",
                "reply-unnat",
                "no-neighbour",
                "no-neighbour"
            ]
        );
        assert_eq!(r.out, [3, 3, NOT_SENT, NOT_SENT]);
        for i in 0..2 {
            assert_eq!(r.verdicts[i].egress, 30);
            assert_eq!(&r.frames.get(i)[..12], &[[31; 6], [30; 6]].concat()[..]);
            assert_eq!(r.frames.get(i)[14 + 8], 64, "the kernel decrements the TTL");
        }
        assert_eq!(r.counters.reasons.iter().sum::<u64>(), 4);
        let egress = Egress::new(&[1, 2, 12, 30], None);
        let r = run(&packets[..1], &egress, false);
        assert_eq!(r.verdicts[0].reason, Reason::NoEgress);
    }

    /// A stage that holds (a worker's) gives a next hop without a neighbour `HOLD`, leaves the
    /// frame and its verdict as the pipeline left them (so that the stage can run again once
    /// the neighbour resolves) and still asks for the resolution; other outcomes are as usual.
    #[test]
    fn a_holding_stage_holds_what_has_no_neighbour_untouched() {
        let packets = vec![
            (udp([10, 1, 0, 12], 64, false), Reason::ServiceDnat), // owned veth, no neighbour
            (udp([10, 2, 0, 6], 64, false), Reason::Direct),       // behind the bridge, unknown
            (udp([10, 1, 0, 11], 64, false), Reason::Direct),      // resolved
        ];
        let egress = Egress::new(&[1, 2, 12, 30], Some(30)).holding(true);
        let r = run(&packets, &egress, true);
        assert_eq!(r.out, [HOLD, HOLD, 1]);
        let reasons: Vec<&str> = r.verdicts.iter().map(|v| v.reason.as_str()).collect();
        assert_eq!(reasons, ["service-dnat", "direct", "direct"]);
        assert_eq!(r.verdicts[0].action, Action::Forward);
        for (i, (p, _)) in packets.iter().enumerate().take(2) {
            assert_eq!(r.frames.get(i), &p[..], "untouched");
        }
        assert_eq!(
            r.unresolved,
            [
                (2, Addr::from_ip(ip("10.1.0.12"))),
                (10, Addr::from_ip(ip("10.2.0.6")))
            ]
        );
        // Once the FIB has the neighbour, the same frame and verdict go out as if never held.
        let mut frames = SlotFrames::new(1, 2048);
        frames.push(r.frames.get(0));
        let mut verdicts = [r.verdicts[0]];
        let mut out = [NOT_SENT];
        let mut input = fib().input().clone();
        input.neighbours.push(neigh(2, "10.1.0.12", 0xa2));
        egress.process(
            &mut frames,
            &mut verdicts,
            &mut out,
            &Fib::new(input),
            LinkType::Ethernet,
            true,
            None,
            &mut EgressStats::default(),
            |_, _, _| {},
        );
        assert_eq!(out, [1]);
        assert_eq!(verdicts[0].egress, 2);
        assert_eq!(&frames.get(0)[..12], &[[0xa2; 6], [2; 6]].concat()[..]);
        assert_eq!(frames.get(0)[14 + 8], 63, "TTL decremented once");
    }

    /// A frame as a veth with TX checksum offload hands it over: the L4 checksum field holds
    /// only the pseudo-header sum. Completing it at the pipeline's offsets gives what a full
    /// computation gives.
    #[test]
    fn partial_checksums_are_completed() {
        let egress = Egress::new(&[2], None);
        for tcp in [false, true] {
            let good = udp([10, 1, 0, 11], 64, tcp);
            let mut frame = good.clone();
            let off = 14 + 20 + if tcp { 16 } else { 6 };
            frame[off..off + 2].copy_from_slice(&[0x12, 0x34]); // partial / stale
            let r = run(&[(frame, Reason::Direct)], &egress, true);
            assert_eq!(r.stats.checksums_completed, 1);
            let f = r.frames.get(0);
            assert_eq!(&f[off..off + 2], &good[off..off + 2], "tcp={tcp}");
            assert!(verify::checksums(f, &meta(f)).is_ok());
        }
    }
}
