//! Direct routing of pod traffic through the tap (`podInterception.directRouting`): a frame the
//! workers forward from one pod to another leaves straight through its egress interface, with
//! the next hop's MACs from kxdp's own FIB and its TTL (hop limit) one lower, instead of going back into the
//! tap for the node's IP stack to route (docs/afxdp.md § Direct routing).
//!
//! It skips, per packet, the kernel's IP receive, netfilter (the node's conntrack included) and
//! routing. Which frames: forwarded, not masqueraded, and both ends of the connection pods
//! (`clusterCIDRs`): the destination after translation and the source before it. That rule gives
//! both directions of a connection the same way (a Service connection's reply has the Service's
//! address as its translated source, the endpoint pod as its original one), so the node's
//! netfilter sees all of a connection or none of it: a connection it saw in part would stay in
//! its conntrack table as established for days. Everything else (to or from outside the
//! cluster, to the node, masqueraded, a next hop not resolved yet) goes through the tap to the
//! kernel as before, and the CNI's masquerading of traffic leaving the cluster with it. IPv6
//! goes direct from the workers only (the fast path is IPv4's): every IPv6 packet of such a
//! connection reaches a worker, so it too takes one way.

use kxdp_kernel::offload::DirectHop;
use kxdp_packet::{Addr, Family};

use crate::fib::{Fib, Hop};
use crate::snapshot::PrefixSet;
use crate::verdict::{Action, Verdict};

/// What a worker needs to route a frame itself: its FIB and the pod ranges.
pub struct DirectRouting<'a> {
    pub fib: &'a Fib,
    pub pods: &'a PrefixSet,
    /// The host path's port (`kxdp1`), if any: never a direct egress.
    pub kernel_port: Option<u32>,
}

impl DirectRouting<'_> {
    /// The hop the frame of `v` takes straight to its egress interface, or `None`: the kernel's
    /// stack routes it.
    #[inline]
    pub fn hop(&self, v: &Verdict) -> Option<DirectHop> {
        if v.action != Action::Forward || v.masq || !v.has_addrs {
            return None;
        }
        self.hop_between(&v.orig_src, &v.dst, v.family)
    }

    /// The direct hop of a connection's packet from `orig_src` (its source before translation)
    /// to `dst` (its destination after), if both are pods and the FIB has the next hop's MACs.
    pub fn hop_between(&self, orig_src: &Addr, dst: &Addr, family: Family) -> Option<DirectHop> {
        if !self.pods.contains(orig_src, family) || !self.pods.contains(dst, family) {
            return None;
        }
        match self.fib.lookup(dst, family) {
            Ok(Hop::Port {
                ifindex,
                dst_mac,
                src_mac,
            }) if Some(ifindex) != self.kernel_port && dst_mac != [0; 6] => Some(DirectHop {
                ifindex,
                dst_mac,
                src_mac,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fib::testing::{link, neigh, route};
    use crate::fib::FibInput;
    use crate::verdict::Reason;

    fn addr(s: &str) -> Addr {
        Addr::from_ip(s.parse().unwrap())
    }

    #[test]
    fn pod_to_pod_goes_direct_the_rest_to_the_kernel() {
        let fib = Fib::new(FibInput {
            links: vec![link(2, 2), link(5, 5), link(9, 9)],
            routes: vec![
                route("10.244.0.5", 32, 5, None),
                route("10.244.1.0", 24, 2, Some("192.168.0.2")),
                route("0.0.0.0", 0, 2, Some("192.168.0.1")),
                route("10.244.0.9", 32, 9, None),
                route("10.244.0.6", 32, 5, None),
                route("fd00:10::5", 128, 5, None),
            ],
            neighbours: vec![
                neigh(5, "10.244.0.5", 0x15),
                neigh(2, "192.168.0.2", 0x12),
                neigh(2, "192.168.0.1", 0x11),
                neigh(9, "10.244.0.9", 0x19),
                neigh(5, "fd00:10::5", 0x16),
            ],
            ..FibInput::default()
        });
        let mut pods = PrefixSet::new();
        pods.insert("10.244.0.0".parse().unwrap(), 16);
        pods.insert("fd00:10::".parse().unwrap(), 64);
        let routing = DirectRouting {
            fib: &fib,
            pods: &pods,
            kernel_port: Some(9),
        };
        let v = |src: &str, dst: &str| Verdict {
            action: Action::Forward,
            reason: Reason::Established,
            has_addrs: true,
            family: Family::V4,
            orig_src: addr(src),
            src: addr(src),
            orig_dst: addr("10.96.0.10"),
            dst: addr(dst),
            ..Verdict::default()
        };
        // To a pod on this node, and to one on another (through its node).
        let local = routing.hop(&v("10.244.1.7", "10.244.0.5")).unwrap();
        assert_eq!(
            (local.ifindex, local.dst_mac, local.src_mac),
            (5, [0x15; 6], [5; 6])
        );
        let remote = routing.hop(&v("10.244.0.5", "10.244.1.7")).unwrap();
        assert_eq!((remote.ifindex, remote.dst_mac), (2, [0x12; 6]));
        // A reply un-NATed to the Service's address: its original source is the pod.
        let reply = Verdict {
            src: addr("10.96.0.10"),
            ..v("10.244.1.7", "10.244.0.5")
        };
        assert!(routing.hop(&reply).is_some());
        // From or to outside the cluster, masqueraded, not forwarded, the host path: kernel.
        assert!(routing.hop(&v("192.168.0.50", "10.244.0.5")).is_none());
        assert!(routing.hop(&v("10.244.0.5", "8.8.8.8")).is_none());
        let masq = Verdict {
            masq: true,
            ..v("10.244.1.7", "10.244.0.5")
        };
        assert!(routing.hop(&masq).is_none());
        let pass = Verdict {
            action: Action::Pass,
            ..v("10.244.1.7", "10.244.0.5")
        };
        assert!(routing.hop(&pass).is_none());
        assert!(routing.hop(&v("10.244.1.7", "10.244.0.9")).is_none());
        // A pod whose neighbour is not resolved yet: the kernel resolves it.
        assert!(routing.hop(&v("10.244.1.7", "10.244.0.6")).is_none());
        // IPv6 between pods too.
        let v6 = Verdict {
            family: Family::V6,
            ..v("fd00:10::7", "fd00:10::5")
        };
        assert_eq!(routing.hop(&v6).map(|h| h.dst_mac), Some([0x16; 6]));
    }
}
