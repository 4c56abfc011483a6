//! Source validation on pod-facing interfaces: a packet that arrives on a pod's interface with a
//! source address the node does not route back through that interface is dropped as
//! `spoofed-source`, before the pipeline (so it touches no conntrack entry and no NetworkPolicy
//! sees a borrowed address). XDP runs before the kernel's `rp_filter`, so without this a pod
//! could send with another pod's address and pass a NetworkPolicy that admits that pod.
//!
//! The rule is the kernel's strict reverse path (`rp_filter=1`) over kxdp's own FIB
//! ([`Fib::source_arrives_on`]): the route back to the source must leave through the interface
//! the packet came in on; for a route through a Linux bridge (the CNI `bridge` plugin, flannel),
//! through the port the bridge's FDB maps the source's (or its gateway's) MAC to — stricter than
//! the kernel, which sees only the bridge. Unspecified and link-local sources pass (DHCP,
//! duplicate address detection, neighbour discovery), as the kernel lets them.
//!
//! Which interfaces: those that face pods ([`Fib::pod_facing`]: the main table routes part of a
//! pod range, `clusterCIDRs`, on-link through the interface or its bridge), never the kernel
//! port (`kxdp1`, the node's own traffic) nor an uplink (it reaches other nodes' pod ranges
//! through a gateway). `sourceValidation: off` turns the check off (docs/config.md).
//!
//! Cost: nothing on an interface that is not checked; on one that is, per packet a read of the
//! source address at its fixed offset and one FIB probe (a pod's address is precomputed when the
//! FIB is built); a spoofed packet is moved to the batch's tail. No allocation, lock or syscall.

use kxdp_packet::{Addr, Family, LinkType, PacketMeta};

use crate::fib::Fib;
use crate::pipeline::Counters;
use crate::snapshot::PrefixSet;
use crate::verdict::{Reason, Verdict};

/// `sourceValidation` (docs/config.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SourceValidation {
    /// Strict reverse path on pod-facing interfaces.
    #[default]
    Strict,
    /// No check.
    Off,
}

/// Whether packets received on `ifindex` are checked: validation is on, the interface faces
/// pods and it is not the kernel port.
pub fn checked(
    mode: SourceValidation,
    fib: &Fib,
    pod_ranges: &PrefixSet,
    ifindex: u32,
    kernel_port: Option<u32>,
) -> bool {
    mode == SourceValidation::Strict
        && kernel_port != Some(ifindex)
        && !pod_ranges.is_empty()
        && fib.pod_facing(ifindex, pod_ranges)
}

/// The IP source address of an Ethernet frame (after up to two VLAN tags): None for a frame
/// that is not IPv4/IPv6 or too short to hold the address (the pipeline judges those).
#[inline]
pub fn source_of(frame: &[u8]) -> Option<(Addr, Family)> {
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    for _ in 0..2 {
        if !matches!(ethertype, 0x8100 | 0x88a8) {
            break;
        }
        off += 4;
        ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    }
    let l3 = off + 2;
    match ethertype {
        0x0800 => {
            let s: [u8; 4] = frame.get(l3 + 12..l3 + 16)?.try_into().ok()?;
            Some((
                Addr::from_ip(std::net::Ipv4Addr::from(s).into()),
                Family::V4,
            ))
        }
        0x86dd => {
            let s: [u8; 16] = frame.get(l3 + 8..l3 + 24)?.try_into().ok()?;
            Some((
                Addr::from_ip(std::net::Ipv6Addr::from(s).into()),
                Family::V6,
            ))
        }
        _ => None,
    }
}

/// The addresses of an interface compared before the FIB is asked (`Fib::sources_on`): a pod
/// has one per family.
pub const OWN_SOURCES: usize = 4;

/// Screens a batch received on `ingress`: the frames whose source does not arrive on `ingress`
/// by the FIB are moved to the end of `descs` (the others keep their order), their verdicts
/// written into `verdicts[kept..]` (`spoofed-source`, with the addresses as received; counted
/// with the batch's other verdicts by the caller, `Counters::record`) and their packets and
/// bytes added to `counters`. Returns `kept`: the pipeline takes
/// `descs[..kept]`. `frame_of` reads a descriptor's frame; `own` is `fib.sources_on(ingress,
/// OWN_SOURCES)` (or any part of it), worked out when the FIB changes: a source among them
/// costs a few compares instead of a probe.
pub fn screen<'f, D: Copy>(
    descs: &mut [D],
    frame_of: impl Fn(&D) -> &'f [u8],
    fib: &Fib,
    ingress: u32,
    own: &[(Addr, Family)],
    verdicts: &mut [Verdict],
    counters: &mut Counters,
) -> usize {
    let n = descs.len().min(verdicts.len());
    let mut kept = 0;
    for i in 0..n {
        if source_ok(frame_of(&descs[i]), fib, ingress, own) {
            // Stable: the spoofed frames between `kept` and `i` move up by one.
            if kept != i {
                descs[kept..=i].rotate_right(1);
            }
            kept += 1;
        }
    }
    for i in kept..n {
        let frame = frame_of(&descs[i]);
        verdicts[i] = spoofed(frame);
        counters.packets += 1;
        counters.bytes += frame.len() as u64;
    }
    kept
}

/// Whether `frame`'s source arrives on `ingress` (one of `own`, or by the FIB); a frame
/// without an IP source passes (the pipeline judges it).
#[inline]
pub fn source_ok(frame: &[u8], fib: &Fib, ingress: u32, own: &[(Addr, Family)]) -> bool {
    match source_of(frame) {
        Some(s) if own.contains(&s) => true,
        Some((src, family)) => fib.source_arrives_on(&src, family, ingress),
        None => true,
    }
}

/// The `spoofed-source` verdict of `frame`, with its addresses as received (for `monitor`).
pub fn spoofed(frame: &[u8]) -> Verdict {
    screened(frame, Reason::SpoofedSource)
}

/// The verdict of a frame the screen drops for `reason`, with its addresses and ports when it
/// parses (for `monitor` and the counters).
pub fn screened(frame: &[u8], reason: Reason) -> Verdict {
    let mut v = Verdict::default();
    let mut meta = PacketMeta::default();
    if kxdp_packet::parse_into(frame, LinkType::Ethernet, &mut meta).is_ok() {
        v.has_addrs = true;
        v.family = meta.family;
        v.proto = meta.proto;
        (v.orig_src, v.orig_sport, v.orig_dst, v.orig_dport) =
            (meta.src, meta.sport, meta.dst, meta.dport);
        (v.src, v.sport, v.dst, v.dport) = (meta.src, meta.sport, meta.dst, meta.dport);
        v.client = meta.src;
        (v.l3_off, v.l4_off, v.ip_len) = (meta.l3_off, meta.l4_off, meta.ip_len);
    }
    v.set(reason);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fib::testing::{ip, link, local, neigh, route};
    use crate::fib::{FdbEntry, FibInput, Route};
    use crate::verdict::Action;
    use std::net::IpAddr;

    fn a(s: &str) -> Addr {
        Addr::from_ip(ip(s))
    }

    /// eth0 (1: the node network, other nodes' pods via 192.168.0.2), ptp pod veths 2
    /// (10.1.0.11, fd00:1::11) and 3 (10.1.0.12), bridge cni0 (10: 10.2.0.0/24, fd00:2::/64)
    /// with ports 11 (MAC b1, 10.2.0.5) and 12 (MAC b2, 10.2.0.6), kernel port 30 ↔ 31.
    fn fib() -> Fib {
        let mut links = vec![
            link(1, 1),
            link(2, 2),
            link(3, 3),
            link(10, 10),
            link(11, 11),
            link(12, 12),
            link(30, 30),
            link(31, 31),
        ];
        links[3].bridge = true;
        links[4].master = Some(10);
        links[5].master = Some(10);
        links[6].peer = Some(31);
        links[7].peer = Some(30);
        Fib::new(FibInput {
            links,
            addrs: vec![local(1, "192.168.0.10"), local(10, "10.2.0.1")],
            routes: vec![
                route("0.0.0.0", 0, 1, Some("192.168.0.1")),
                route("192.168.0.0", 24, 1, None),
                route("10.3.0.0", 24, 1, Some("192.168.0.2")),
                route("10.1.0.11", 32, 2, None),
                route("fd00:1::11", 128, 2, None),
                route("10.1.0.12", 32, 3, None),
                route("10.2.0.0", 24, 10, None),
                route("fd00:2::", 64, 10, None),
            ],
            neighbours: vec![
                neigh(1, "192.168.0.1", 0xee),
                neigh(10, "10.2.0.5", 0xb1),
                neigh(10, "10.2.0.6", 0xb2),
                neigh(10, "fd00:2::5", 0xb1),
                neigh(2, "fe80::2", 0x22),
            ],
            fdb: vec![
                FdbEntry {
                    bridge: 10,
                    port: 11,
                    mac: [0xb1; 6],
                },
                FdbEntry {
                    bridge: 10,
                    port: 12,
                    mac: [0xb2; 6],
                },
            ],
            ..Default::default()
        })
    }

    fn pod_ranges() -> PrefixSet {
        let mut p = PrefixSet::new();
        p.insert(ip("10.0.0.0"), 8);
        p.insert(ip("fd00::"), 16);
        p
    }

    #[test]
    fn ptp_pods_only_send_from_their_own_addresses() {
        let f = fib();
        assert!(f.source_arrives_on(&a("10.1.0.11"), Family::V4, 2));
        assert!(f.source_arrives_on(&a("fd00:1::11"), Family::V6, 2));
        assert!(f.source_arrives_on(&a("10.1.0.12"), Family::V4, 3));
        // Another pod's address, another node's pod, the node's own, the outside world.
        assert!(!f.source_arrives_on(&a("10.1.0.12"), Family::V4, 2));
        assert!(!f.source_arrives_on(&a("10.3.0.7"), Family::V4, 2));
        assert!(!f.source_arrives_on(&a("192.168.0.10"), Family::V4, 2));
        assert!(!f.source_arrives_on(&a("10.2.0.1"), Family::V4, 2));
        assert!(!f.source_arrives_on(&a("203.0.113.9"), Family::V4, 2));
        assert!(!f.source_arrives_on(&a("fd00:1::12"), Family::V6, 2));
        // The uplink gets what routes through it.
        assert!(f.source_arrives_on(&a("203.0.113.9"), Family::V4, 1));
        assert!(f.source_arrives_on(&a("10.3.0.7"), Family::V4, 1));
        assert!(!f.source_arrives_on(&a("10.1.0.11"), Family::V4, 1));
    }

    #[test]
    fn bridge_ports_are_told_apart_by_the_fdb() {
        let f = fib();
        assert!(f.source_arrives_on(&a("10.2.0.5"), Family::V4, 11));
        assert!(f.source_arrives_on(&a("10.2.0.6"), Family::V4, 12));
        assert!(f.source_arrives_on(&a("fd00:2::5"), Family::V6, 11));
        // Each other's addresses: the neighbour's MAC is on the other port.
        assert!(!f.source_arrives_on(&a("10.2.0.5"), Family::V4, 12));
        assert!(!f.source_arrives_on(&a("10.2.0.6"), Family::V4, 11));
        assert!(!f.source_arrives_on(&a("fd00:2::5"), Family::V6, 12));
        // Not known yet on any port: the bridge's ports, as the kernel's rp_filter on cni0.
        assert!(f.source_arrives_on(&a("10.2.0.77"), Family::V4, 12));
        assert!(!f.source_arrives_on(&a("10.2.0.77"), Family::V4, 2));
        // Outside the bridge's subnet, and the bridge's own address.
        assert!(!f.source_arrives_on(&a("10.1.0.11"), Family::V4, 11));
        assert!(!f.source_arrives_on(&a("10.2.0.1"), Family::V4, 11));
    }

    #[test]
    fn unspecified_and_link_local_sources_pass() {
        let f = fib();
        for (s, family) in [
            ("0.0.0.0", Family::V4),
            ("169.254.1.2", Family::V4),
            ("::", Family::V6),
            ("fe80::2", Family::V6),
            ("fe80::99", Family::V6),
            ("febf::1", Family::V6),
        ] {
            assert!(f.source_arrives_on(&a(s), family, 3), "{s}");
        }
        assert!(!f.source_arrives_on(&a("fec0::1"), Family::V6, 3));
        assert!(!f.source_arrives_on(&a("169.253.1.2"), Family::V4, 3));
    }

    #[test]
    fn pod_facing_interfaces() {
        let f = fib();
        let p = pod_ranges();
        for (ifindex, facing) in [
            (1, false),
            (2, true),
            (3, true),
            (10, true),
            (11, true),
            (12, true),
            (30, false),
        ] {
            assert_eq!(f.pod_facing(ifindex, &p), facing, "{ifindex}");
        }
        assert!(checked(SourceValidation::Strict, &f, &p, 2, Some(30)));
        assert!(!checked(SourceValidation::Off, &f, &p, 2, Some(30)));
        assert!(!checked(SourceValidation::Strict, &f, &p, 2, Some(2)));
        assert!(!checked(
            SourceValidation::Strict,
            &f,
            &PrefixSet::new(),
            2,
            None
        ));
    }

    fn udp4(src: [u8; 4], vlan: bool) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[6..12].copy_from_slice(&[2; 6]);
        if vlan {
            f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
            f.extend_from_slice(&[0, 5, 0x08, 0x00]);
        } else {
            f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        }
        let mut ip = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&[10, 2, 0, 6]);
        ip.extend_from_slice(&[0x30, 0x39, 0x14, 0xe9, 0, 8, 0, 0]);
        f.extend_from_slice(&ip);
        f
    }

    #[test]
    fn source_of_reads_ipv4_ipv6_and_vlan_tagged_frames() {
        assert_eq!(
            source_of(&udp4([10, 1, 0, 11], false)),
            Some((a("10.1.0.11"), Family::V4))
        );
        assert_eq!(
            source_of(&udp4([10, 1, 0, 12], true)),
            Some((a("10.1.0.12"), Family::V4))
        );
        let mut v6 = vec![0u8; 14 + 40];
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        v6[14] = 0x60;
        let src: std::net::Ipv6Addr = "fd00:1::11".parse().unwrap();
        v6[22..38].copy_from_slice(&src.octets());
        assert_eq!(source_of(&v6), Some((a("fd00:1::11"), Family::V6)));
        // ARP, and a frame cut short: the pipeline's.
        let mut arp = udp4([10, 1, 0, 11], false);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(source_of(&arp), None);
        assert_eq!(source_of(&udp4([10, 1, 0, 11], false)[..20]), None);
    }

    #[test]
    fn screen_moves_spoofed_frames_to_the_tail_with_their_verdicts() {
        let f = fib();
        let frames = [
            udp4([10, 1, 0, 11], false),
            udp4([10, 1, 0, 12], false), // pod 3's address on pod 2's veth
            udp4([10, 1, 0, 11], true),
            udp4([10, 2, 0, 5], false), // a bridge pod's
            udp4([0, 0, 0, 0], false),
        ];
        let mut descs: Vec<usize> = (0..frames.len()).collect();
        let mut verdicts = [Verdict::default(); 8];
        let mut counters = Counters::default();
        let own = f.sources_on(2, OWN_SOURCES);
        assert_eq!(
            own,
            vec![(a("10.1.0.11"), Family::V4), (a("fd00:1::11"), Family::V6)]
        );
        assert_eq!(
            f.sources_on(12, OWN_SOURCES),
            vec![(a("10.2.0.6"), Family::V4)]
        );
        let kept = screen(
            &mut descs,
            |&d| &frames[d][..],
            &f,
            2,
            &own,
            &mut verdicts,
            &mut counters,
        );
        assert_eq!(kept, 3);
        assert_eq!(descs, vec![0, 2, 4, 1, 3]);
        for v in &verdicts[3..5] {
            assert_eq!((v.reason, v.action), (Reason::SpoofedSource, Action::Drop));
            assert!(v.has_addrs);
            assert_eq!(
                (v.proto, v.orig_dst, v.orig_dport),
                (kxdp_packet::IpProto::UDP, a("10.2.0.6"), 5353)
            );
        }
        assert_eq!(verdicts[3].orig_src, a("10.1.0.12"));
        assert_eq!(verdicts[4].orig_src, a("10.2.0.5"));
        assert_eq!(counters.packets, 2);
        counters.record(&verdicts[kept..5]);
        assert_eq!(counters.reasons[Reason::SpoofedSource as usize], 2);
        assert_eq!(counters.actions[Action::Drop as usize], 2);
        assert_eq!(counters.bytes, 2 * 42);
        // Nothing spoofed: nothing moves.
        let mut descs = vec![0usize, 2, 4];
        let kept = screen(
            &mut descs,
            |&d| &frames[d][..],
            &f,
            2,
            &[],
            &mut verdicts,
            &mut counters,
        );
        assert_eq!((kept, descs), (3, vec![0, 2, 4]));
    }

    /// The screen's cost per packet on a node with 250 ptp pods (each a /32 on its veth):
    /// `cargo test -p kxdp-dataplane --release --lib antispoof::tests::screen_cost -- --ignored
    /// --nocapture` (docs/hardening.md § Spoofed sources from pods).
    #[test]
    #[ignore = "measurement; run in release"]
    fn screen_cost() {
        let mut links = vec![link(1, 1)];
        let mut routes = vec![Route {
            dst: ip("0.0.0.0"),
            len: 0,
            oif: 1,
            gateway: Some(ip("192.168.0.1")),
            metric: 0,
        }];
        for i in 0..250u32 {
            links.push(link(100 + i, 7));
            routes.push(Route {
                dst: IpAddr::from([10, 1, (i / 200) as u8, (i % 200) as u8 + 2]),
                len: 32,
                oif: 100 + i,
                gateway: None,
                metric: 0,
            });
        }
        let f = Fib::new(FibInput {
            links,
            routes,
            ..Default::default()
        });
        let own: Vec<Vec<u8>> = (0..64).map(|_| udp4([10, 1, 0, 9], false)).collect();
        let spoofed: Vec<Vec<u8>> = (0..64).map(|_| udp4([10, 1, 0, 10], false)).collect();
        let listed = f.sources_on(107, OWN_SOURCES);
        for (what, frames, list) in [
            ("own source, listed", &own, &listed[..]),
            ("own source, FIB probe", &own, &[][..]),
            ("spoofed (another pod's)", &spoofed, &listed[..]),
        ] {
            let mut verdicts = [Verdict::default(); 64];
            let mut counters = Counters::default();
            let rounds = 50_000;
            let t0 = std::time::Instant::now();
            let mut kept = 0;
            for _ in 0..rounds {
                let mut descs: [usize; 64] = std::array::from_fn(|i| i);
                kept += screen(
                    &mut descs,
                    |&d| &frames[d][..],
                    &f,
                    107,
                    list,
                    &mut verdicts,
                    &mut counters,
                );
            }
            let ns = t0.elapsed().as_nanos() as f64 / (rounds * 64) as f64;
            println!("{what}: {ns:.1} ns/packet (kept {kept})");
        }
    }
}
