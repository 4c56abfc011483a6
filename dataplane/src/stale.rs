//! Connections the published tables no longer support, found after each publication by one pass
//! over the table, off the workers' path.
//!
//! UDP, cleaned as kube-proxy's conntrack reconciler does: UDP has no handshake, so a long-lived
//! one-way stream (statsd, DNS from a resolver that keeps its port) would stay pinned to a
//! removed or failed endpoint for as long as it keeps sending. UDP connections the new tables no
//! longer support are deleted; their next packet is a new connection and goes to a live endpoint.
//!
//! TCP: a connection whose endpoint has left its Service for good (no longer listed in the
//! Service's EndpointSlices at all; a terminating endpoint is still listed and keeps its
//! connections) is marked (`FLAG_BACKEND_GONE`), and the client's next packet is answered with a
//! RST (`backend-gone`). A backend that vanished without closing (pod deleted, node gone) resets
//! nothing itself, and its client would otherwise retransmit until its own timeout. The mark is
//! one bit in the state word every lookup loads: nothing is added per packet. After a restart
//! with the state file, the first publication marks the connections of endpoints that left
//! while kxdp was down.

use kxdp_packet::IpProto;

use crate::conntrack::{tcp, tcp_state_of, Conntrack, EntryView, FLAG_BACKEND_GONE};
use crate::snapshot::{FrontendKey, Snapshot};

/// What one `reconcile` pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// UDP connections deleted, per family: [IPv4, IPv6] (the metrics' `ip_family` label).
    pub udp_deleted: [usize; 2],
    /// TCP connections newly marked as having lost their endpoint.
    pub tcp_backend_gone: usize,
}

/// Deletes every UDP connection whose Service frontend is gone from `snap` or whose endpoint is
/// no longer one the frontend may send new connections to, and marks every TCP connection whose
/// endpoint is no longer listed for its Service port (`Snapshot::endpoint_listed`). Runs on the
/// control thread after a publication; it streams the table and never stops a worker.
///
/// A Service going from no endpoints to some needs nothing here: kxdp answers packets to an
/// endpoint-less Service without creating connection state (unlike the kernel, whose conntrack
/// entries for the rejected packets kube-proxy has to clear).
pub fn reconcile(ct: &Conntrack, snap: &Snapshot) -> Reconciled {
    let mut stale: Vec<EntryView> = Vec::new();
    let mut gone: Vec<EntryView> = Vec::new();
    for v in ct.connections().filter(|v| v.service_id != 0) {
        match v.orig.proto {
            IpProto::UDP if !supported(&v, snap) => stale.push(v),
            IpProto::TCP if backend_gone(&v, snap) => gone.push(v),
            _ => {}
        }
    }
    let mut out = Reconciled::default();
    for v in stale.iter().filter(|v| ct.kill_view(v)) {
        out.udp_deleted[usize::from(!v.orig.dst.is_v4_mapped())] += 1;
    }
    out.tcp_backend_gone = gone.iter().filter(|v| ct.mark_backend_gone(v)).count();
    out
}

/// `reconcile`'s UDP deletions, in total.
pub fn flush_stale_udp(ct: &Conntrack, snap: &Snapshot) -> usize {
    reconcile(ct, snap).udp_deleted.iter().sum()
}

/// A TCP connection, not yet marked and not closing, whose endpoint its Service port's
/// EndpointSlices no longer list.
fn backend_gone(v: &EntryView, snap: &Snapshot) -> bool {
    v.state & FLAG_BACKEND_GONE == 0
        && !matches!(
            tcp_state_of(v.state),
            tcp::TcpState::TimeWait | tcp::TcpState::Close
        )
        && snap.endpoint_listed(v.service_id, &v.reply.src, v.reply.sport) == Some(false)
}

fn supported(v: &EntryView, snap: &Snapshot) -> bool {
    let key = FrontendKey {
        addr: v.orig.dst,
        port: v.orig.dport,
        proto: v.orig.proto,
    };
    let Some(fe) = snap.frontend(&key) else {
        return false;
    };
    let backend = (v.reply.src, v.reply.sport);
    fe.routes.iter().any(|r| {
        fe.endpoints_of(r.endpoints)
            .iter()
            .any(|e| (e.addr, e.port) == backend)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kxdp_packet::{Addr, Family};

    use super::*;
    use crate::conntrack::{CtConfig, Tuple};

    fn tup(src: Addr, sport: u16, dst: Addr, dport: u16, proto: IpProto) -> Tuple {
        Tuple {
            src,
            dst,
            sport,
            dport,
            proto,
            family: Family::V4,
        }
    }

    /// A connection (its SYN) from client port `port` to the ClusterIP, NATed to `ep`:8080, of
    /// Service port `sid`.
    fn connect(ct: &Conntrack, port: u16, ep: [u8; 4], sid: u32) {
        let client = Addr::from_v4([10, 1, 0, 50]);
        let vip = Addr::from_v4([172, 30, 0, 10]);
        let ep = Addr::from_v4(ep);
        ct.create(
            &tup(client, port, vip, 80, IpProto::TCP),
            &tup(ep, 8080, client, port, IpProto::TCP),
            tcp::SYN,
            false,
            sid,
            1_000,
            0,
        )
        .unwrap();
    }

    fn gone(ct: &Conntrack, port: u16) -> bool {
        let v = ct.connections().find(|v| v.orig.sport == port).unwrap();
        v.state & FLAG_BACKEND_GONE != 0
    }

    /// Only connections to an endpoint missing from their Service port's list are marked, once:
    /// not one to the same address through another Service port that lists it, nor one of a
    /// Service port without a list (deleted).
    #[test]
    fn connections_of_unlisted_endpoints_are_marked_once() {
        let ct = Conntrack::new(CtConfig::default(), 1);
        connect(&ct, 40000, [10, 2, 0, 1], 7); // removed
        connect(&ct, 40001, [10, 2, 0, 2], 7); // still listed (terminating or not)
        connect(&ct, 40002, [10, 2, 0, 1], 8); // same address, another Service port that lists it
        connect(&ct, 40003, [10, 2, 0, 9], 9); // a Service port with no list
        let mut snap = Snapshot::empty();
        snap.listed_endpoints
            .insert(7, Arc::from(vec![(Addr::from_v4([10, 2, 0, 2]), 8080)]));
        snap.listed_endpoints
            .insert(8, Arc::from(vec![(Addr::from_v4([10, 2, 0, 1]), 8080)]));
        let r = reconcile(&ct, &snap);
        assert_eq!(r.tcp_backend_gone, 1);
        assert_eq!(r.udp_deleted, [0, 0]);
        assert!(gone(&ct, 40000));
        assert!(!gone(&ct, 40001) && !gone(&ct, 40002) && !gone(&ct, 40003));
        // The next publication finds nothing new to mark.
        assert_eq!(reconcile(&ct, &snap).tcp_backend_gone, 0);
        // A port change is a removal too: the connection's endpoint is no longer listed.
        snap.listed_endpoints
            .insert(8, Arc::from(vec![(Addr::from_v4([10, 2, 0, 1]), 9090)]));
        assert_eq!(reconcile(&ct, &snap).tcp_backend_gone, 1);
        assert!(gone(&ct, 40002));
    }
}
