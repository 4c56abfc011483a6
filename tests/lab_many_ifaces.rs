//! One worker, many interfaces (ignored in the normal test run; a benchmark):
//!
//! `sudo cargo test --test lab_many_ifaces -- --ignored --nocapture`
//!
//! `KXDP_BENCH_IFACES` (default 250) veth pairs: `vbN` in a node namespace (kxdp's side, matched
//! by the pattern `vb*`), `pbN` in a pods namespace with 10.A.B.2/24, and a static neighbour
//! 10.A.B.3 whose MAC is `vbN`'s, so UDP sent from the pods namespace to 10.A.B.3 arrives on
//! `vbN`, is redirected to kxdp's socket and counted by the worker (the egress stage then drops
//! it, `no-neighbour`: only the receive side is measured). Measures, in one run:
//!
//! - start: the time until all links are attached, and a link added later: time to attach;
//! - idle: the worker thread's CPU over 5 s with no traffic (epoll wait over all sockets);
//! - wake-up latency after a quiet second: send one datagram on a random interface, spin until
//!   the worker's rx counter moves (50 samples; median, p90, max);
//! - busy: every interface sending (round robin, as fast as one sender thread can) for 5 s: the
//!   worker's CPU and the packets it received.

mod lab;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kxdp_dataplane::conntrack::{Conntrack, CtConfig};
use kxdp_dataplane::io::runner::{AfXdp, RunOptions};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::worker::Tables;

const NODE: &str = "dynif-many-node";
const PODS: &str = "dynif-many-pods";

struct Netns;

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [NODE, PODS] {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .status();
        }
    }
}

fn addr(i: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 100 + (i / 200) as u8, (i % 200) as u8, host)
}

fn mac(i: usize) -> String {
    format!("02:6b:00:00:{:02x}:{:02x}", i / 256, i % 256)
}

fn batch(ns: &str, cmds: &str) {
    let path = std::env::temp_dir().join(format!("{ns}.batch"));
    std::fs::write(&path, cmds).unwrap();
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-batch", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(path);
}

fn add_links(from: usize, to: usize) {
    let mut node = String::new();
    let mut pods = String::new();
    for i in from..to {
        node += &format!(
            "link add vb{i} address {} type veth peer name pb{i} netns {PODS}\nlink set vb{i} up\n",
            mac(i)
        );
        pods += &format!(
            "addr add {}/24 dev pb{i}\nlink set pb{i} up\nneigh add {} lladdr {} dev pb{i}\n",
            addr(i, 2),
            addr(i, 3),
            mac(i)
        );
    }
    batch(NODE, &node);
    batch(PODS, &pods);
}

/// CPU ticks (user + system) of this process's thread named `name`.
fn thread_ticks(name: &str) -> u64 {
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap();
            let f: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            return f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    panic!("no thread {name}");
}

fn ticks_per_sec() -> f64 {
    100.0
}

#[test]
#[ignore = "benchmark: sudo cargo test --test lab_many_ifaces -- --ignored --nocapture"]
fn bench_many_interfaces_one_worker() {
    let n: usize = std::env::var("KXDP_BENCH_IFACES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(250);
    let _cleanup = Netns;
    for ns in [NODE, PODS] {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", ns])
            .status();
        lab::run("ip", &["netns", "add", ns]);
    }
    add_links(0, n);
    // Senders live in the pods namespace (one socket per interface).
    let (to_sender, jobs) = std::sync::mpsc::channel::<(&'static str, usize)>();
    let (done_tx, done) = std::sync::mpsc::channel::<Vec<Duration>>();
    let counters_slot: Arc<ArcSwap<Option<Arc<kxdp_dataplane::worker::IoCounters>>>> =
        Arc::new(ArcSwap::from_pointee(None));
    let cs = counters_slot.clone();
    let sender = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&format!("/var/run/netns/{PODS}")).unwrap();
        let socks: Vec<(UdpSocket, SocketAddrV4)> = (0..n)
            .map(|i| {
                let s = UdpSocket::bind(SocketAddrV4::new(addr(i, 2), 0)).unwrap();
                (s, SocketAddrV4::new(addr(i, 3), 9))
            })
            .collect();
        while let Ok((job, arg)) = jobs.recv() {
            let c = cs.load_full();
            let rx = &(*c).as_ref().unwrap().rx;
            match job {
                "latency" => {
                    let mut v = Vec::new();
                    for k in 0..arg {
                        std::thread::sleep(Duration::from_millis(200));
                        let i = (k * 97) % n;
                        let before = rx.load(Ordering::Relaxed);
                        let t0 = Instant::now();
                        socks[i].0.send_to(b"ping", socks[i].1).unwrap();
                        while rx.load(Ordering::Relaxed) == before {
                            if t0.elapsed() > Duration::from_secs(1) {
                                break;
                            }
                            std::hint::spin_loop();
                        }
                        v.push(t0.elapsed());
                    }
                    done_tx.send(v).unwrap();
                }
                "baseline" => {
                    // The same measurement against a thread blocked in recv() on a plain UDP
                    // socket: the scheduler's wake-up latency on this machine, now.
                    let r = UdpSocket::bind(SocketAddrV4::new(addr(0, 2), 0)).unwrap();
                    let to = r.local_addr().unwrap();
                    let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let g = got.clone();
                    let t = std::thread::spawn(move || {
                        let mut b = [0u8; 16];
                        for _ in 0..arg {
                            r.recv(&mut b).unwrap();
                            g.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    let s = UdpSocket::bind(SocketAddrV4::new(addr(0, 2), 0)).unwrap();
                    let mut v = Vec::new();
                    for _ in 0..arg {
                        std::thread::sleep(Duration::from_millis(200));
                        let before = got.load(Ordering::Relaxed);
                        let t0 = Instant::now();
                        s.send_to(b"ping", to).unwrap();
                        while got.load(Ordering::Relaxed) == before {
                            std::hint::spin_loop();
                        }
                        v.push(t0.elapsed());
                    }
                    t.join().unwrap();
                    done_tx.send(v).unwrap();
                }
                "busy" => {
                    let end = Instant::now() + Duration::from_secs(arg as u64);
                    let mut sent = 0u64;
                    while Instant::now() < end {
                        for (s, to) in &socks {
                            if s.send_to(&[0u8; 18], to).is_ok() {
                                sent += 1;
                            }
                        }
                    }
                    done_tx.send(vec![Duration::from_nanos(sent)]).unwrap();
                }
                _ => return,
            }
        }
    });
    let main = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&format!("/var/run/netns/{NODE}")).unwrap();
        let tables: Arc<dyn Tables> = Arc::new(ArcSwap::from_pointee(Snapshot::empty()));
        let ct = Arc::new(Conntrack::new(CtConfig::default(), 1));
        let opts = RunOptions {
            interfaces: vec!["vb*".into()],
            workers: 1,
            cpus: vec![],
            xsk: Default::default(),
            backoff: Default::default(),
            mode: Default::default(),
            kernel_port: None,
            hold_for_restart: false,
        };
        let t0 = Instant::now();
        let afxdp = AfXdp::start(&opts, tables, ct, None).unwrap();
        let started = t0.elapsed();
        assert_eq!(afxdp.attached().len(), n, "every link attached");
        // A link added later.
        let t1 = Instant::now();
        add_links(n, n + 1);
        let created = t1.elapsed();
        while afxdp.attached().len() < n + 1 && t1.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let late = t1.elapsed();
        assert_eq!(afxdp.attached().len(), n + 1, "the late link attached");
        counters_slot.store(Arc::new(Some(afxdp.counters[0].1.clone())));
        // Idle CPU.
        std::thread::sleep(Duration::from_secs(1));
        let c0 = thread_ticks("kxdp-worker-0");
        std::thread::sleep(Duration::from_secs(5));
        let idle = (thread_ticks("kxdp-worker-0") - c0) as f64 / ticks_per_sec() / 5.0;
        // Wake-up latency after quiet periods.
        to_sender.send(("latency", 50)).unwrap();
        let mut lat = done.recv().unwrap();
        lat.sort();
        to_sender.send(("baseline", 50)).unwrap();
        let mut base = done.recv().unwrap();
        base.sort();
        // Busy.
        let rx0 = afxdp.counters[0].1.rx.load(Ordering::Relaxed);
        let c0 = thread_ticks("kxdp-worker-0");
        to_sender.send(("busy", 5)).unwrap();
        let sent = done.recv().unwrap()[0].as_nanos() as u64;
        let busy = (thread_ticks("kxdp-worker-0") - c0) as f64 / ticks_per_sec() / 5.0;
        let rx = afxdp.counters[0].1.rx.load(Ordering::Relaxed) - rx0;
        let _ = to_sender.send(("stop", 0));
        let workers = afxdp.stop();
        let balanced = workers
            .iter()
            .all(|w| w.frames_accounted() == w.umem.frame_count() as u64);
        println!(
            "{{\"interfaces\": {n}, \"start_all_attached_ms\": {:.1}, \"late_link_create_ms\": {:.1}, \"late_link_attached_ms\": {:.1}, \"idle_worker_cpu\": {idle:.3}, \"wake_latency_us\": {{\"median\": {}, \"p90\": {}, \"max\": {}}}, \"baseline_udp_wake_latency_us\": {{\"median\": {}, \"p90\": {}}}, \"busy_worker_cpu\": {busy:.3}, \"busy_sent\": {sent}, \"busy_received\": {rx}, \"frames_balanced\": {balanced}}}",
            started.as_secs_f64() * 1e3,
            created.as_secs_f64() * 1e3,
            late.as_secs_f64() * 1e3,
            lat[lat.len() / 2].as_micros(),
            lat[lat.len() * 9 / 10].as_micros(),
            lat[lat.len() - 1].as_micros(),
            base[base.len() / 2].as_micros(),
            base[base.len() * 9 / 10].as_micros(),
        );
        assert!(balanced);
    });
    main.join().unwrap();
    sender.join().unwrap();
}
