//! AF_XDP sockets on veth in a network namespace: copy mode is chosen (veth refuses zero-copy),
//! the XDP program steers what it must (transit IP traffic and NodePorts to the socket; ARP,
//! other node traffic to the kernel), and under load every received frame ends up sent,
//! dropped or back on the fill ring: the UMEM's frame count is conserved. And `kxdp run` with
//! non-default ring sizes (config `afxdp`) forwards, and the kernel's per-socket drop counters
//! (`XDP_STATISTICS`) show in `/metrics` and `kxdp stats`, exactly for the frames lost while the
//! daemon was stopped.

mod lab;

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kxdp_kernel::afxdp::{Desc, Umem, XskConfig, XskSocket};
use kxdp_kernel::ifindex;
use kxdp_kernel::xdp::{ModeChoice, XdpMode, XdpProgram};
use lab::{ip, lab_files, Cluster, Kxdp, Lab, Servers};

const NODE: &str = "10.99.0.1";
const GEN: &str = "10.99.0.2";
/// Not the node: transit traffic the dataplane must see.
const TRANSIT: &str = "10.99.0.77";
const NODEPORT: u16 = 30080;

struct Topo {
    _lab: Lab,
    node: String,
    gen: String,
}

fn topo() -> Topo {
    let mut lab = Lab::new();
    let node = lab.netns("node");
    let gen = lab.netns("gen");
    lab.veth(&node, "k0", &gen, "p0");
    ip(&node, &format!("addr add {NODE}/24 dev k0"));
    ip(&gen, &format!("addr add {GEN}/24 dev p0"));
    let kmac = lab.mac(&node, "k0");
    let mac = kmac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    ip(
        &gen,
        &format!("neigh replace {TRANSIT} lladdr {mac} dev p0 nud permanent"),
    );
    Topo {
        _lab: lab,
        node,
        gen,
    }
}

/// Everything the test forwarder needs, opened inside the node namespace.
struct Io {
    _prog: XdpProgram,
    _att: kxdp_kernel::xdp::Attachment,
    umem: Umem,
    sock: XskSocket,
}

fn open_io(cfg: XskConfig) -> Io {
    let idx = ifindex("k0").unwrap();
    let prog = XdpProgram::load(1).unwrap();
    prog.set_node(&[NODE.parse().unwrap()], &[NODEPORT])
        .unwrap();
    let mut umem = Umem::new(&cfg).unwrap();
    let sock = XskSocket::open(&mut umem, None, idx, 0, &cfg).expect("AF_XDP socket");
    prog.set_socket(0, sock.fd()).unwrap();
    let att = prog.attach(idx, ModeChoice::Auto).unwrap();
    assert_eq!(att.mode, XdpMode::Native);
    assert!(!sock.zero_copy, "veth offers copy mode only");
    Io {
        _prog: prog,
        _att: att,
        umem,
        sock,
    }
}

fn udp_send(ns: &str, to: String, count: usize) {
    Lab::in_ns(ns, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..count {
            s.send_to(b"kxdp-lab", &to).unwrap();
        }
    })
}

#[test]
fn afxdp_steering_copy_mode() {
    if !lab::available("afxdp_steering_copy_mode") {
        return;
    }
    let t = topo();
    let (node, gen) = (t.node.clone(), t.gen.clone());
    // A kernel socket on the node for traffic that must not be taken.
    let kernel = Lab::in_ns(&node, || {
        let s = UdpSocket::bind(format!("{NODE}:5000")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s
    });
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let seen_ports = Arc::new(std::sync::Mutex::new(Vec::<(String, u16)>::new()));
    let (st, se, sp) = (stop.clone(), seen.clone(), seen_ports.clone());
    let ready = Arc::new(AtomicBool::new(false));
    let rd = ready.clone();
    let fwd = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&Lab::path(&node)).unwrap();
        let mut io = open_io(
            XskConfig {
                frames: 1024,
                ..XskConfig::default()
            }
            .with_ring_size(256),
        );
        rd.store(true, Ordering::SeqCst);
        let mut descs = [Desc::default(); 64];
        let end = Instant::now() + Duration::from_secs(10);
        while !st.load(Ordering::SeqCst) && Instant::now() < end {
            let n = io.sock.receive(&mut io.umem, &mut descs);
            for d in &descs[..n] {
                let f = &io.umem.frame(d.addr)[..d.len];
                if f.len() >= 38 && f[12..14] == [0x08, 0x00] && f[23] == 17 {
                    let dst = format!("{}.{}.{}.{}", f[30], f[31], f[32], f[33]);
                    let ihl = (f[14] & 0xf) as usize * 4;
                    let dport = u16::from_be_bytes([f[14 + ihl + 2], f[14 + ihl + 3]]);
                    sp.lock().unwrap().push((dst, dport));
                }
                se.fetch_add(1, Ordering::Relaxed);
                io.umem.recycle(d.addr);
            }
            io.sock.refill(&mut io.umem, 64);
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    assert!(lab::wait_until(Duration::from_secs(5), || ready.load(Ordering::SeqCst)));
    // The node's own traffic reaches the kernel: ARP (gen has no static entry for the node, so
    // this needs the node's ARP reply) and UDP to a port kxdp does not serve.
    udp_send(&gen, format!("{NODE}:5000"), 1);
    let mut buf = [0u8; 64];
    let (n, _) = kernel
        .recv_from(&mut buf)
        .expect("kernel socket got its datagram");
    assert_eq!(&buf[..n], b"kxdp-lab");
    // NodePort at the node's address and transit traffic go to the AF_XDP socket.
    udp_send(&gen, format!("{NODE}:{NODEPORT}"), 3);
    udp_send(&gen, format!("{TRANSIT}:9"), 3);
    assert!(lab::wait_until(Duration::from_secs(3), || {
        let p = seen_ports.lock().unwrap();
        p.iter()
            .filter(|(d, port)| d == NODE && *port == NODEPORT)
            .count()
            == 3
            && p.iter()
                .filter(|(d, port)| d == TRANSIT && *port == 9)
                .count()
                == 3
    }));
    stop.store(true, Ordering::SeqCst);
    fwd.join().unwrap();
    let p = seen_ports.lock().unwrap();
    assert!(
        !p.iter().any(|(d, port)| d == NODE && *port == 5000),
        "node traffic was taken: {p:?}"
    );
}

#[test]
fn afxdp_frames_conserved_under_load() {
    if !lab::available("afxdp_frames_conserved_under_load") {
        return;
    }
    let t = topo();
    let (node, gen) = (t.node.clone(), t.gen.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    let (st, rd) = (stop.clone(), ready.clone());
    let fwd = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&Lab::path(&node)).unwrap();
        // A small UMEM so that the rings run full and empty under load.
        let cfg = XskConfig {
            frames: 512,
            ..XskConfig::default()
        }
        .with_ring_size(128);
        let mut io = open_io(cfg);
        rd.store(true, Ordering::SeqCst);
        let total = io.umem.frame_count() as u64;
        let mut descs = [Desc::default(); 64];
        let mut out = Vec::with_capacity(64);
        let (mut rx, mut sent, mut dropped) = (0u64, 0u64, 0u64);
        let mut idle_since = None;
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let n = io.sock.receive(&mut io.umem, &mut descs);
            rx += n as u64;
            out.clear();
            for (i, d) in descs[..n].iter().enumerate() {
                if i % 2 == 0 {
                    // Echo: swap the MAC addresses and send it back out of k0.
                    let f = io.umem.frame_mut(d.addr);
                    let mut tmp = [0u8; 6];
                    tmp.copy_from_slice(&f[..6]);
                    f.copy_within(6..12, 0);
                    f[6..12].copy_from_slice(&tmp);
                    out.push(*d);
                } else {
                    io.umem.recycle(d.addr);
                    dropped += 1;
                }
            }
            let before = io.sock.stats.tx_ring_full;
            io.sock.send(&mut io.umem, &out);
            dropped += io.sock.stats.tx_ring_full - before;
            sent += out.len() as u64 - (io.sock.stats.tx_ring_full - before);
            io.sock.flush_tx();
            io.sock.complete(&mut io.umem);
            io.sock.refill(&mut io.umem, 128);
            // Conservation at every batch boundary.
            assert_eq!(
                io.umem.frames_accounted(&[&io.sock]),
                total,
                "frames leaked or duplicated"
            );
            assert_eq!(io.umem.in_hand(), 0);
            if n == 0 {
                if st.load(Ordering::SeqCst) {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_millis(300) && io.sock.tx_outstanding() == 0
                    {
                        break;
                    }
                }
                std::thread::yield_now();
            } else {
                idle_since = None;
            }
            assert!(Instant::now() < end, "forwarder did not drain in time");
        }
        let kstats = io.sock.kernel_stats().unwrap();
        // Drained: every frame is free or on the fill ring.
        assert_eq!(io.sock.tx_outstanding(), 0);
        assert_eq!(
            io.umem.free_frames() as u64 + io.sock.frames_held() as u64,
            total
        );
        assert_eq!(rx, sent + dropped);
        (rx, sent, dropped, io.sock.stats, kstats.rx_dropped)
    });
    assert!(lab::wait_until(Duration::from_secs(5), || ready.load(Ordering::SeqCst)));
    // Load: two senders for about a second.
    let deadline = Instant::now() + Duration::from_millis(1000);
    let senders: Vec<_> = (0..2)
        .map(|k| {
            let gen = gen.clone();
            std::thread::spawn(move || {
                Lab::in_ns(&gen, move || {
                    let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                    let mut n = 0u64;
                    let payload = vec![k as u8; 64 + 600 * k];
                    while Instant::now() < deadline {
                        for _ in 0..64 {
                            if s.send_to(&payload, format!("{TRANSIT}:9")).is_ok() {
                                n += 1;
                            }
                        }
                    }
                    n
                })
            })
        })
        .collect();
    let generated: u64 = senders.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::SeqCst);
    let (rx, sent, dropped, stats, kdropped) = fwd.join().unwrap();
    eprintln!(
        "generated {generated}, received {rx}, sent {sent}, dropped {dropped}, kernel rx_dropped {kdropped}, tx kicks {}, fill kicks {}",
        stats.tx_kicks, stats.fill_kicks
    );
    assert!(rx > 1000, "too little traffic reached the socket: {rx}");
    assert!(sent > 0 && dropped > 0);
}

/// `kxdp run` in `ns` with an admin socket at `admin` (the lab harness runs it without one).
fn start_kxdp_with_admin(ns: &str, config: &str, state: &str, admin: &str) -> Kxdp {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_kxdp"), "run"])
        .args(["--config", config, "--state", state, "--admin", admin])
        .arg("--no-takeover");
    Kxdp::spawn(cmd, Duration::from_secs(20))
}

/// `GET /metrics` from the daemon's metrics server inside `ns`.
fn scrape(ns: &str) -> String {
    use std::io::{Read, Write};
    Lab::in_ns(ns, || {
        let mut s = std::net::TcpStream::connect_timeout(
            &"127.0.0.1:10249".parse().unwrap(),
            Duration::from_secs(2),
        )
        .expect("metrics server");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    })
}

/// The value of `name{interface="IF",queue="0"...}` in a scrape (None: no such series).
fn socket_metric(text: &str, name: &str, interface: &str, extra: &str) -> Option<u64> {
    let want = format!("interface=\"{interface}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&want) && l.contains("queue=\"0\"") && l.contains(extra))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Sends `n` datagrams to the web Service's ClusterIP from one connected socket of the client
/// pod (paced in bursts of 16, so that only the AF_XDP socket can lose them), with `between`
/// run after sending; then counts the answers until 500 ms pass without one.
fn udp_burst(ns: &str, n: usize, between: impl FnOnce() + Send + 'static) -> usize {
    Lab::in_ns(ns, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect("172.30.0.10:53").unwrap();
        for i in 0..n {
            s.send(format!("burst {i}").as_bytes()).unwrap();
            if i % 16 == 15 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        between();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 256];
        let mut answers = 0;
        while s.recv(&mut buf).is_ok() {
            answers += 1;
        }
        answers
    })
}

fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill {sig} {pid}");
    if sig == "-STOP" {
        // The signal is delivered asynchronously: on a loaded machine the worker went on
        // taking frames for a while after `kill` returned. Wait until every thread is stopped.
        let stopped = lab::wait_until(Duration::from_secs(5), || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|tasks| {
                    tasks.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                            // The state follows the command name's closing parenthesis.
                            stat.rsplit_once(") ")
                                .is_some_and(|(_, rest)| rest.starts_with(['T', 't']))
                        })
                    })
                })
                .unwrap_or(false)
        });
        assert!(
            stopped,
            "pid {pid}'s threads not all stopped 5 s after SIGSTOP"
        );
    }
}

#[test]
fn afxdp_run_ring_sizes_and_kernel_drop_counters() {
    if !lab::available("afxdp_run_ring_sizes_and_kernel_drop_counters") {
        return;
    }
    let c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let (config, state) = lab_files();
    let dir = std::env::temp_dir().join(format!("kxdp-afxdp-rings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg_path = dir.join("config.yaml");
    // RX rings of 64 entries behind fill shares of 96 frames (32768 frames × 3/4 / 256
    // planned sockets): a stopped worker's RX ring fills before its fill ring runs dry, so
    // what does not fit is counted as rx_ring_full, exactly.
    std::fs::write(
        &cfg_path,
        std::fs::read_to_string(&config).unwrap()
            + "afxdp: {frames: 32768, rxRingSize: 64, fillRingSize: 1024, txRingSize: 512, completionRingSize: 256}\n",
    )
    .unwrap();
    let admin = dir.join("admin.sock");
    let kxdp = start_kxdp_with_admin(
        &c.node,
        cfg_path.to_str().unwrap(),
        &state,
        admin.to_str().unwrap(),
    );
    let client = c.pod("client-1").to_string();

    // It forwards with these rings: every request answered through the ClusterIP.
    let answered = udp_burst(&client, 20, || {});
    assert_eq!(answered, 20, "{}", kxdp.stderr.lock().unwrap());

    // The sockets' rings and counters are in /metrics (refreshed about once a second).
    let mut m = String::new();
    assert!(
        lab::wait_until(Duration::from_secs(5), || {
            m = scrape(&c.node);
            socket_metric(&m, "kxdp_xsk_ring_entries", "vpod3", "ring=\"rx\"") == Some(64)
        }),
        "no ring sizes for vpod3 in /metrics:\n{m}"
    );
    for (ring, n) in [("fill", 1024), ("tx", 512), ("completion", 256)] {
        let r = format!("ring=\"{ring}\"");
        assert_eq!(
            socket_metric(&m, "kxdp_xsk_ring_entries", "vpod3", &r),
            Some(n),
            "{ring}"
        );
    }
    for name in [
        "kxdp_xsk_rx_ring_full_total",
        "kxdp_xsk_rx_dropped_total",
        "kxdp_xsk_rx_fill_ring_empty_total",
        "kxdp_xsk_rx_invalid_descs_total",
        "kxdp_xsk_tx_invalid_descs_total",
        "kxdp_xsk_tx_ring_empty_total",
    ] {
        for iface in ["up0", "vpod1", "vpod2", "vpod3"] {
            assert!(
                socket_metric(&m, name, iface, "").is_some(),
                "{name} for {iface} missing:\n{m}"
            );
        }
    }
    let full0 = socket_metric(&m, "kxdp_xsk_rx_ring_full_total", "vpod3", "").unwrap();
    let dropped0 = socket_metric(&m, "kxdp_xsk_rx_dropped_total", "vpod3", "").unwrap();

    // The daemon stopped (SIGSTOP: its worker off the CPU, as on a busy node) while the
    // client sends 300 datagrams: the XDP program still redirects them into vpod3's socket,
    // whose 64-entry RX ring takes the first 64; the kernel drops the rest.
    let pid = kxdp.child.id();
    let sent = 300;
    signal(pid, "-STOP");
    let answered = udp_burst(&client, sent, move || {
        std::thread::sleep(Duration::from_millis(100));
        signal(pid, "-CONT");
    });
    let lost = (sent - answered) as u64;
    // The next reading (about a second later) counts them: rx_ring_full, not rx_dropped (the
    // fill ring still had frames), and nothing else was lost on the way.
    let mut full = 0;
    let mut dropped = 0;
    let counted = lab::wait_until(Duration::from_secs(5), || {
        m = scrape(&c.node);
        full = socket_metric(&m, "kxdp_xsk_rx_ring_full_total", "vpod3", "").unwrap_or(0) - full0;
        dropped =
            socket_metric(&m, "kxdp_xsk_rx_dropped_total", "vpod3", "").unwrap_or(0) - dropped0;
        full + dropped >= lost
    });
    eprintln!(
        "sent {sent} while stopped, answered {answered}; vpod3's socket: rx_ring_full +{full}, rx_dropped +{dropped}"
    );
    assert!(counted, "loss not counted:\n{m}");
    assert!((1..=64).contains(&answered), "answered {answered}");
    assert_eq!(full, lost, "every lost frame counted as ring-full");
    assert_eq!(dropped, 0);

    // `kxdp stats` shows the same counters and ring sizes per socket.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args(["stats", "--interval", "0", "-o", "json", "--admin"])
        .arg(&admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let row: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["interface"] == "vpod3")
        .unwrap_or_else(|| panic!("no vpod3 socket in `kxdp stats`:\n{text}"));
    assert_eq!(row["queue"], 0);
    assert_eq!(row["rx_ring_size"], 64);
    assert_eq!(row["fill_ring_size"], 1024);
    assert_eq!(row["rx_ring_full"].as_u64(), Some(full0 + full));
    assert_eq!(row["rx_dropped"].as_u64(), Some(dropped0));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .args(["stats", "--interval", "0", "--admin"])
        .arg(&admin)
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains(&format!(
            "socket vpod3/0 worker 0: kernel rx_ring_full={} rx_dropped={dropped0}",
            full0 + full
        )),
        "{table}"
    );

    // And it forwards on afterwards.
    assert_eq!(udp_burst(&client, 20, || {}), 20);
    drop(kxdp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kxdp pcap sink` on eth0 of `ns` (counts what arrives), returned once attached.
fn start_sink(ns: &str) -> std::process::Child {
    use std::io::BufRead;
    let mut sink = std::process::Command::new("ip")
        .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_kxdp")])
        .args(["pcap", "sink", "--iface", "eth0", "--duration", "20"])
        .args(["--idle-exit", "1500"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kxdp pcap sink");
    let err = sink.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if l.contains("sink ready") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        let _ = sink.kill();
        panic!("the sink in {ns} did not start");
    }
    sink
}

/// `kxdp pcap send` from the client pod to the ClusterIP 172.30.0.10:53 (64-byte UDP, 16
/// flows) through vpod3's MAC: `rate` ("max" or pps), at most `count` frames; returns how many
/// the kernel took.
fn pcap_send(c: &Cluster, mac: &str, rate: &str, seconds: &str, count: u64) -> u64 {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            c.pod("client-1"),
            env!("CARGO_BIN_EXE_kxdp"),
        ])
        .args(["pcap", "send", "--iface", "eth0", "--rate", rate])
        .args(["--duration", seconds, "--count", &count.to_string()])
        .args([
            "--dst-mac",
            mac,
            "--src",
            "10.1.0.13",
            "--dst",
            "172.30.0.10:53",
        ])
        .args(["--flows", "16"])
        .output()
        .expect("kxdp pcap send");
    assert!(
        out.status.success(),
        "pcap send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab::last_json(&out.stdout)["sent"].as_u64().unwrap()
}

/// A socket that carried a little traffic, then nothing, takes a burst whole while its worker
/// is off the CPU: a paced low rate (batches of 2 frames), an idle pause (the worker waits in
/// epoll), then the daemon stopped (SIGSTOP: as a busy node keeps a worker from its CPU) while
/// 100 frames arrive, paced at 20 kpps, and continued. The kernel holds what arrives on the
/// socket's RX ring as long as its fill ring has frames: every frame reaches the sinks and
/// vpod3's socket counts no kernel drop. A socket that carried only small batches used to
/// keep its base fill share (24 frames: a loop that took fewer than half of it never
/// grew it), so the kernel dropped all but 24 of the burst (`rx_dropped`, fill ring empty);
/// now any socket that carries traffic has at least `worker::ACTIVE_FILL` (128).
#[test]
fn afxdp_run_burst_after_idle_is_delivered_whole() {
    if !lab::available("afxdp_run_burst_after_idle_is_delivered_whole") {
        return;
    }
    let c = Cluster::build();
    let (config, state) = lab_files();
    let kxdp = Kxdp::start(&c.node, &config, &state);
    let pid = kxdp.child.id();
    let mac = Lab::mac(&c.lab, &c.node, "vpod3")
        .map(|o| format!("{o:02x}"))
        .join(":");
    let sinks = [start_sink(c.pod("web-1")), start_sink(c.pod("web-2"))];
    let m = scrape(&c.node);
    let lost0 = socket_metric(&m, "kxdp_xsk_rx_dropped_total", "vpod3", "").unwrap_or(0)
        + socket_metric(&m, "kxdp_xsk_rx_ring_full_total", "vpod3", "").unwrap_or(0);

    let mut sent = pcap_send(&c, &mac, "2000", "0.5", 1000);
    std::thread::sleep(Duration::from_millis(300));
    signal(pid, "-STOP");
    let burst = pcap_send(&c, &mac, "20000", "2", 100);
    std::thread::sleep(Duration::from_millis(50));
    signal(pid, "-CONT");
    sent += burst;

    let mut received = 0;
    for s in sinks {
        let o = s.wait_with_output().unwrap();
        received += lab::last_json(&o.stdout)["received"].as_u64().unwrap_or(0);
    }
    // The workers read their sockets' kernel counters about once a second.
    std::thread::sleep(Duration::from_millis(1200));
    let m = scrape(&c.node);
    let lost = socket_metric(&m, "kxdp_xsk_rx_dropped_total", "vpod3", "").unwrap_or(0)
        + socket_metric(&m, "kxdp_xsk_rx_ring_full_total", "vpod3", "").unwrap_or(0)
        - lost0;
    eprintln!(
        "sent {sent} (a burst of {burst} while stopped), the sinks received {received}; vpod3's socket dropped {lost}"
    );
    assert_eq!(burst, 100);
    assert_eq!(lost, 0, "kernel drops at vpod3's socket");
    assert_eq!(received, sent, "every frame delivered");
}
