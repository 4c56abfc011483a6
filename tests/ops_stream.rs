//! A 1M-entry conntrack listing streams through the admin socket: the client receives entries
//! while the server is still walking the table, the server holds no copy of the listing (its
//! memory does not grow with it), and a worker thread using the table meanwhile is never stalled,
//! not even while the client stops reading.
//!
//! In-process (the server is `kxdp_control::admin::serve`, the same code `kxdp run` starts), so
//! that the table can be filled directly and the worker's batch times measured.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kxdp_control::admin::{AdminContext, Dataplane};
use kxdp_control::status::Status;
use kxdp_control::sync::Published;
use kxdp_dataplane::clock::clock_ms;
use kxdp_dataplane::conntrack::{Conntrack, CtConfig, Tuple};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::stats::DataplaneStats;
use kxdp_packet::{Addr, Family, IpProto};

const N: u32 = 1 << 20;
use kxdp_packet::tcp::flags::SYN;

fn tuple(src: IpAddr, sport: u16, dst: IpAddr, dport: u16) -> Tuple {
    Tuple {
        src: Addr::from_ip(src),
        dst: Addr::from_ip(dst),
        sport,
        dport,
        proto: IpProto::TCP,
        family: Family::V4,
    }
}

fn conn(i: u32, vip: Ipv4Addr) -> (Tuple, Tuple) {
    let client = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (i >> 8)));
    let sport = 10_000 + (i & 0xff) as u16;
    let backend = IpAddr::V4(Ipv4Addr::new(10, 200, 0, (i % 200) as u8 + 1));
    (
        tuple(client, sport, IpAddr::V4(vip), 80),
        tuple(backend, 8080, client, sport),
    )
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn million_entry_listing_streams_without_stalling_workers() {
    let started = Instant::now();
    let vip = Ipv4Addr::new(172, 30, 0, 1);
    let ct = Arc::new(Conntrack::new(
        CtConfig {
            max_entries: N,
            ..CtConfig::default()
        },
        2,
    ));
    let now = clock_ms();
    for i in 0..N {
        let (o, r) = conn(i, vip);
        ct.create(&o, &r, SYN, false, 0, now, i as u64).unwrap();
    }
    assert_eq!(ct.len(), N);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.sock");
    let ctx = Arc::new(AdminContext {
        published: Arc::new(Published::new(Snapshot::empty())),
        dataplane: Dataplane {
            ct: ct.clone(),
            stats: Arc::new(DataplaneStats::new(2)),
        },
        status: Arc::new(Mutex::new(Status::default())),
        listening: Mutex::new(serde_json::Map::new()),
        control: None,
        daemon: Default::default(),
    });
    let _server = kxdp_control::admin::serve(&path, ctx, rt.handle()).unwrap();

    // A worker: batches of lookups of listed connections plus short-lived new ones (another
    // VIP, so the listing's count stays exact), timed.
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (ct, stop) = (ct.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut batches = 0u64;
            let mut i = 0u32;
            let other = Ipv4Addr::new(172, 30, 0, 2);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                ct.enter(0);
                for _ in 0..64 {
                    i = i.wrapping_add(7919) % N;
                    let (o, _) = conn(i, vip);
                    let k = o.pack();
                    assert!(ct.lookup(&k, ct.hash(&k), clock_ms()).is_some());
                }
                let (o, r) = conn(batches as u32 % N, other);
                if let Ok(idx) = ct.create(&o, &r, SYN, false, 0, clock_ms(), 0) {
                    ct.kill(idx);
                }
                ct.leave(0);
                worst = worst.max(t.elapsed());
                batches += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            (worst, batches)
        })
    };

    let rss_before = rss_kib();
    let mut sock = std::os::unix::net::UnixStream::connect(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    writeln!(
        sock,
        r#"{{"op":"conntrack-list","filter":{{"orig_dst":"172.30.0.1/32"}}}}"#
    )
    .unwrap();
    let mut r = BufReader::with_capacity(64 * 1024, sock);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let first: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(first["orig_dst"], "172.30.0.1:80");
    // The client stops reading for a while: the server blocks on the socket, the worker not.
    std::thread::sleep(Duration::from_secs(2));
    let mut n = 1u64;
    let end = loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream ended early");
        if line.starts_with("{\"end\":") {
            break serde_json::from_str::<serde_json::Value>(&line).unwrap();
        }
        n += 1;
    };
    let rss_after = rss_kib();
    stop.store(true, Ordering::Relaxed);
    let (worst, batches) = worker.join().unwrap();

    assert_eq!(n, N as u64);
    assert_eq!(end["end"]["count"], N as u64);
    // 1M JSON lines are ~250 MB of text: the server never held them.
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB during the listing"
    );
    assert!(batches > 100, "worker ran only {batches} batches");
    assert!(
        worst < Duration::from_millis(500),
        "a worker batch took {worst:?} during the listing"
    );
    eprintln!(
        "listed {n} entries; worker: {batches} batches, worst {worst:?}; RSS {rss_before} -> {rss_after} KiB; {:?} in all",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(300));
}
