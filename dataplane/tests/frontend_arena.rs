//! The frontend table's hot slots and endpoint lists live in the huge-page arena
//! (`kxdp_kernel::huge`): snapshots share them copy-on-write, and what a replaced snapshot held
//! is reused by the next ones rather than mapped anew. Its own test binary: the arena is
//! process-wide, and no other test allocates from it meanwhile.

use std::sync::Arc;

use kxdp_dataplane::snapshot::{
    EmptyAction, Endpoint, EndpointRange, Frontend, FrontendKey, FrontendKind, FrontendTable,
    Route, ServicePortInfo, SourceClass,
};
use kxdp_kernel::huge::{arena_mapped, CHUNK};
use kxdp_packet::Addr;
use kxdp_packet::IpProto;

fn frontend(id: u32, endpoints: u32) -> Frontend {
    let eps: Vec<Endpoint> = (0..endpoints)
        .map(|e| Endpoint {
            addr: Addr::from_v4((0x0a00_0000 + id * 64 + e).to_be_bytes()),
            port: 8000 + e as u16,
            local: e % 2 == 0,
        })
        .collect();
    Frontend {
        service_port: Arc::new(ServicePortInfo {
            name: format!("ns/svc-{id}").into(),
            id,
            proto: IpProto::TCP,
            affinity_timeout_s: 0,
        }),
        kind: FrontendKind::ClusterIp,
        routes: [Route {
            endpoints: EndpointRange {
                start: 0,
                len: endpoints,
            },
            masquerade: false,
            when_empty: EmptyAction::Reject,
        }; 3],
        endpoints: Arc::from(eps),
        source_ranges: None,
        maglev: None,
    }
}

fn key(n: u32) -> FrontendKey {
    FrontendKey {
        addr: Addr::from_v4((0xac10_0000 + n).to_be_bytes()),
        port: 80,
        proto: IpProto::TCP,
    }
}

fn check(t: &FrontendTable, n: u32, id: u32, endpoints: u32) {
    let e = t.lookup(&key(n)).expect("present");
    assert_eq!(e.service_id(), id);
    let whole = e.frontend().expect("cold part");
    assert_eq!(e.endpoints(), &whole.endpoints[..]);
    assert_eq!(e.endpoints().len(), endpoints as usize);
    let r = e.route(SourceClass::ALL[0]);
    assert_eq!(e.endpoints_of(r.endpoints), &whole.endpoints[..]);
}

#[test]
fn snapshots_share_the_arena_and_reuse_what_they_release() {
    const SERVICES: u32 = 3_000;
    let mut current = FrontendTable::new();
    for n in 0..SERVICES {
        current.insert(key(n), frontend(n, 10));
    }
    let mut mapped_after_warmup = 0;
    for round in 0..60u32 {
        // The next snapshot: a copy sharing every shard, with a tenth of the Services changed
        // (their shards copied) and one large Service replaced.
        let n = round % 10;
        let before = current.lookup(&key(n)).expect("present");
        let (id, len) = (before.service_id(), before.endpoints().len() as u32);
        let mut next = current.clone();
        for k in (n..SERVICES).step_by(10) {
            next.insert(key(k), frontend(k + round, 10 + round % 3));
        }
        next.insert(key(SERVICES), frontend(SERVICES, 5_000 + round));
        check(&current, n, id, len);
        check(&next, n, n + round, 10 + round % 3);
        check(&next, SERVICES, SERVICES, 5_000 + round);
        // The old snapshot goes: its unshared shards and endpoint lists back to the arena.
        current = next;
        if round == 10 {
            mapped_after_warmup = arena_mapped();
        }
    }
    // Without reuse the 50 rounds after the warm-up would need ~300 KB of endpoint lists and
    // ~100 KB of shards each (about 10 chunks); with it, at most a chunk of fragmentation.
    assert!(mapped_after_warmup > 0);
    assert!(
        arena_mapped() <= mapped_after_warmup + CHUNK,
        "{} > {} + a chunk",
        arena_mapped(),
        mapped_after_warmup
    );
    for n in 0..SERVICES {
        current.remove(&key(n));
    }
    assert_eq!(current.len(), 1);
}
