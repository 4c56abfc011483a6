//! Stale UDP state, cleaned as kube-proxy's conntrack reconciler does: UDP has no handshake, so a
//! long-lived one-way stream (statsd, DNS from a resolver that keeps its port) would stay pinned
//! to a removed or failed endpoint for as long as it keeps sending. When new tables are published,
//! UDP connections they no longer support are deleted; their next packet is a new connection and
//! goes to a live endpoint.
//!
//! TCP needs none of this: a dead backend resets, and the client reconnects.

use crate::conntrack::{Conntrack, EntryView};
use crate::snapshot::{FrontendKey, Snapshot};

/// Deletes every UDP connection whose Service frontend is gone from `snap` or whose endpoint is
/// no longer one the frontend may send new connections to. Runs on the control thread after a
/// publication; it streams the table and never stops a worker. Returns how many were deleted.
///
/// A Service going from no endpoints to some needs nothing here: kxdp answers packets to an
/// endpoint-less Service without creating connection state (unlike the kernel, whose conntrack
/// entries for the rejected packets kube-proxy has to clear).
pub fn flush_stale_udp(ct: &Conntrack, snap: &Snapshot) -> usize {
    flush_stale_udp_by_family(ct, snap).iter().sum()
}

/// `flush_stale_udp`, counting the deleted connections per family: [IPv4, IPv6] (the metrics'
/// `ip_family` label).
pub fn flush_stale_udp_by_family(ct: &Conntrack, snap: &Snapshot) -> [usize; 2] {
    let stale: Vec<EntryView> = ct
        .connections()
        .filter(|v| v.orig.proto == 17 && v.service_id != 0 && !supported(v, snap))
        .collect();
    let mut by_family = [0; 2];
    for v in stale.iter().filter(|v| ct.kill_view(v)) {
        by_family[usize::from(!v.orig.dst.is_v4_mapped())] += 1;
    }
    by_family
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
