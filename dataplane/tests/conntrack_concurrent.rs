//! The conntrack table's lock-free code under concurrency, small enough for Miri
//! (`cargo +nightly miri test -p kxdp-dataplane --test conntrack_concurrent`, run by `.ci/run`),
//! which checks every interleaving it explores for data races and undefined behaviour and
//! emulates weak memory: two workers insert (each from its own allocation cache), look up, kill
//! and expire their own connections
//! while a third thread looks up theirs and checks that whatever it finds is whole (the seqlock:
//! never one connection's tuple with another's reply).
//!
//! Also an ordinary test: `cargo test -p kxdp-dataplane --test conntrack_concurrent`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kxdp_dataplane::conntrack::{Conntrack, CtConfig, Tuple, DIR_ORIG, DIR_REPLY};
use kxdp_packet::{Addr, Family, IpProto};

/// Connections per worker, and rounds of insert / look up / kill / expire.
const FLOWS: u8 = if cfg!(miri) { 4 } else { 64 };
const ROUNDS: u64 = if cfg!(miri) { 2 } else { 50 };

/// Worker `w`'s flow `f`: client 10.w.0.f:1000+round to Service 172.30.0.1:80, DNATed to
/// endpoint 10.128.w.f:8080.
fn flow(w: u8, f: u8, round: u64) -> (Tuple, Tuple) {
    let orig = Tuple {
        src: Addr::from_v4([10, w, 0, f]),
        dst: Addr::from_v4([172, 30, 0, 1]),
        sport: 1000 + round as u16,
        dport: 80,
        proto: IpProto::UDP,
        family: Family::V4,
    };
    let reply = Tuple {
        src: Addr::from_v4([10, 128, w, f]),
        dst: orig.src,
        sport: 8080,
        dport: orig.sport,
        proto: IpProto::UDP,
        family: Family::V4,
    };
    (orig, reply)
}

fn config() -> CtConfig {
    CtConfig {
        // The smallest table (16 live entries plus the slack for entries in their grace
        // period): inserts beyond it exercise early drop and the free list's reuse.
        max_entries: 16,
        udp: Duration::from_millis(5),
        ..CtConfig::default()
    }
}

fn worker(ct: &Conntrack, w: u8) {
    let mut retired = ct.retired_list();
    for round in 0..ROUNDS {
        let now = round * 10;
        ct.enter(w as usize);
        for f in 0..FLOWS {
            let (orig, reply) = flow(w, f, round);
            let hint = ct.hash(&orig.pack());
            // Full tables refuse (and early-drop): both are fine here; what is found must be right.
            // From the worker's own allocation cache (its retired list), as the pipeline does.
            let _ = ct.create_with(&mut retired, &orig, &reply, 0u8, false, 7, now, hint);
        }
        for f in 0..FLOWS {
            let (orig, reply) = flow(w, f, round);
            for (key, dir, other) in [(orig, DIR_ORIG, reply), (reply, DIR_REPLY, orig)] {
                let packed = key.pack();
                if let Some(found) = ct.lookup(&packed, ct.hash(&packed), now) {
                    assert_eq!(found.dir, dir);
                    assert_eq!(
                        found.other_tuple(),
                        other,
                        "worker {w} flow {f}: torn entry"
                    );
                    assert_eq!(found.service_id, 7);
                    if f % 2 == 0 && dir == DIR_ORIG {
                        ct.kill(found.idx);
                    }
                }
            }
        }
        ct.leave(w as usize);
        // The next round's clock expires the rest (UDP, 5 ms): maintenance retires and recycles.
        ct.maintain(now + 10, 64, &mut retired);
    }
}

#[test]
fn workers_insert_look_up_kill_and_expire_while_a_reader_checks_entries_whole() {
    let ct = Conntrack::with_seed(config(), 3, 1);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers = [s.spawn(|| worker(&ct, 0)), s.spawn(|| worker(&ct, 1))];
        s.spawn(|| {
            // A reader of worker 0's connections: an entry it finds must be one whole
            // connection, whatever the workers are doing to it.
            while !done.load(Ordering::Acquire) {
                ct.enter(2);
                for round in 0..ROUNDS {
                    for f in 0..FLOWS {
                        let (orig, reply) = flow(0, f, round);
                        let packed = orig.pack();
                        if let Some(found) = ct.lookup(&packed, ct.hash(&packed), 0) {
                            assert_eq!(found.other_tuple(), reply, "reader: torn entry");
                        }
                    }
                }
                ct.leave(2);
                if cfg!(miri) {
                    break;
                }
                std::thread::yield_now();
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
    });
    // Everything expired or was killed: after enough maintenance the table is empty again.
    let mut retired = ct.retired_list();
    // (Stops at the first empty count: under Miri each full scan of the index takes seconds.)
    for k in 0..64 {
        ct.maintain(10_000 + k * 1_000, 4096, &mut retired);
        if ct.is_empty() {
            break;
        }
    }
    assert_eq!(ct.len(), 0);
}

/// SYNs per worker in `two_workers_flood_a_full_table`.
const FLOOD_SYNS: u16 = if cfg!(miri) { 12 } else { 4_000 };

/// Worker `w`'s SYN `i` to 172.30.0.1:80, DNATed to 10.128.0.1:8080.
fn syn(w: u8, i: u16) -> (Tuple, Tuple) {
    let orig = Tuple {
        src: Addr::from_v4([10, 64 + w, (i >> 8) as u8, i as u8]),
        dst: Addr::from_v4([172, 30, 0, 1]),
        sport: 40_000,
        dport: 80,
        proto: IpProto::TCP,
        family: Family::V4,
    };
    let reply = Tuple {
        src: Addr::from_v4([10, 128, 0, 1]),
        dst: orig.src,
        sport: 8080,
        dport: 40_000,
        proto: IpProto::TCP,
        family: Family::V4,
    };
    (orig, reply)
}

/// Two workers flood a full table with SYNs, each from its own allocation cache, so that both
/// push early-drop records, pop them and drop victims at once (`fifo`): what a lookup finds is
/// whole, and the table never holds more than its maximum. (Some SYNs are refused: a victim's
/// entry is reused only once the other worker has left the batch it was in, and with both
/// workers always in one, none is ready at times.)
#[test]
fn two_workers_flood_a_full_table() {
    let ct = Conntrack::with_seed(
        CtConfig {
            max_entries: 16,
            ..CtConfig::default()
        },
        2,
        1,
    );
    std::thread::scope(|s| {
        for w in 0..2u8 {
            let ct = &ct;
            s.spawn(move || {
                let mut retired = ct.retired_list();
                for i in 0..FLOOD_SYNS {
                    let (orig, reply) = syn(w, i);
                    ct.enter(w as usize);
                    let hint = ct.hash(&orig.pack());
                    let _ = ct.create_with(&mut retired, &orig, &reply, 0x02u8, false, 7, 1, hint);
                    let packed = reply.pack();
                    if let Some(found) = ct.lookup(&packed, ct.hash(&packed), 1) {
                        assert_eq!(found.other_tuple(), orig, "torn entry");
                    }
                    ct.leave(w as usize);
                    if i % 8 == 0 {
                        ct.maintain(1 + i as u64 / 8, 16, &mut retired);
                    }
                }
                ct.flush_pending(&mut retired);
            });
        }
    });
    assert!(ct.len() <= 16, "{} live", ct.len());
    assert!(ct.early_drops() > 0);
}
