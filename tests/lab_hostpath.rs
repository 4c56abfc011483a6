//! The host path (dataplane/src/io/host_path.rs) in a network namespace: the node's own packets
//! to a ClusterIP, an externalIP and a NodePort on the node's own address leave on `kxdp0` and
//! arrive on `kxdp1` (seen with tcpdump on `kxdp1`), other local traffic stays local, frames
//! written into `kxdp1` reach local sockets (also with a local source address, and through a
//! loose reverse-path check when `conf/all/rp_filter` is strict; IPv6 too, through a `kxdp0`
//! without IPv6 address, and routed on only when `net.ipv6.conf.all.forwarding` is 1), a second
//! setup replaces the first (nothing stacked) and teardown restores the rules exactly.
//!
//! Needs root, `tcpdump` and `python3` (an AF_PACKET writer); .ci/run installs them.

mod lab;

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kxdp_dataplane::io::host_path::{HostPath, HostPathOptions};
use lab::{ip, run, Lab};

const NODE4: &str = "192.168.55.2";
const NODE6: &str = "fd55::2";

fn node(test: &str) -> (Lab, String) {
    let _ = test;
    let mut lab = Lab::new();
    let ns = lab.netns("hp");
    let peer = lab.netns("hp-peer");
    lab.veth(&ns, "up0", &peer, "eth0");
    ip(&ns, &format!("addr add {NODE4}/24 dev up0"));
    ip(&ns, &format!("addr add {NODE6}/64 dev up0 nodad"));
    (lab, ns)
}

fn options() -> HostPathOptions {
    HostPathOptions {
        node_ips: vec![NODE4.parse().unwrap(), NODE6.parse().unwrap()],
        service_routes: vec![
            "172.30.0.0/16".parse().unwrap(),
            "fd00:30::/108".parse().unwrap(),
            "203.0.113.10/32".parse().unwrap(),
        ],
        ..HostPathOptions::default()
    }
}

fn setup(ns: &str, opts: HostPathOptions) -> HostPath {
    Lab::in_ns(ns, move || HostPath::setup(&opts).expect("host path setup"))
}

/// The node-ports redirect on `lo`, as the runner attaches it: the XDP program's maps with the
/// node's addresses and these NodePorts (the maps live as long as the filter's program).
fn redirect_node_ports(ns: &str, hp: &HostPath, ports: &[u16]) {
    let maps = kxdp_kernel::xdp::SharedMaps::create().expect("maps");
    maps.set_node(&[NODE4.parse().unwrap(), NODE6.parse().unwrap()], ports)
        .expect("node maps");
    let to = hp.node_ports_to();
    Lab::in_ns(ns, move || {
        to.attach(maps.steer_maps()).expect("node-ports redirect")
    })
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs tcpdump on `dev` in `ns` for the first packet matching `filter`, does `act` once the
/// capture listens, returns tcpdump's line (empty when nothing matched within 3 s).
fn capture(ns: &str, dev: &str, filter: &str, act: impl FnOnce()) -> String {
    let mut child = Command::new("ip")
        .args([
            "netns", "exec", ns, "tcpdump", "-i", dev, "-e", "-n", "-l", "-c", "1",
        ])
        .args(filter.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (apt-get install tcpdump)");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("listening on") {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("tcpdump: {seen}");
        }
        seen += &line;
    }
    act();
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    out
}

fn tcp_attempt(ns: &str, to: &str) -> std::io::Result<()> {
    let to: SocketAddr = to.parse().unwrap();
    Lab::in_ns(ns, move || {
        TcpStream::connect_timeout(&to, Duration::from_millis(300)).map(|_| ())
    })
}

#[test]
fn hostpath_local_traffic_leaves_on_kxdp0_and_arrives_on_kxdp1() {
    let (_lab, ns) = node("hostpath_local_traffic_leaves_on_kxdp0_and_arrives_on_kxdp1");
    let hp = setup(&ns, options());
    redirect_node_ports(&ns, &hp, &[30080, 31000, 32767]);
    let (host_mac, kxdp_mac) = (mac_str(hp.host_mac()), mac_str(hp.kxdp_mac()));
    let cases = [
        ("ClusterIP", "172.30.0.10:80", NODE4),
        ("externalIP", "203.0.113.10:443", NODE4),
        (
            "NodePort on the node's address",
            "192.168.55.2:30080",
            NODE4,
        ),
        ("IPv6 ClusterIP", "[fd00:30::10]:80", NODE6),
        (
            "IPv6 NodePort on the node's address",
            "[fd55::2]:32767",
            NODE6,
        ),
    ];
    for (what, to, src) in cases {
        let dst: SocketAddr = to.parse().unwrap();
        let filter = format!("tcp and dst host {} and dst port {}", dst.ip(), dst.port());
        let out = capture(&ns, "kxdp1", &filter, || {
            let _ = tcp_attempt(&ns, to);
        });
        assert!(!out.is_empty(), "{what}: nothing arrived on kxdp1");
        assert!(
            out.contains(&format!("{src}.")) && out.contains(&format!("> {}", dst.ip())),
            "{what}: from the node's address: {out}"
        );
        assert!(
            out.contains(&format!("{host_mac} > {kxdp_mac}")),
            "{what}: from kxdp0 to kxdp1's MAC (as the route through the pair): {out}"
        );
    }
    // UDP to a NodePort on the node's own address goes the same way.
    let out = capture(&ns, "kxdp1", "udp and dst port 31000", || {
        Lab::in_ns(&ns, || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.send_to(b"x", "192.168.55.2:31000").unwrap();
        })
    });
    assert!(out.contains("192.168.55.2.31000"), "UDP NodePort: {out}");
    // Everything else for the node's own addresses stays local: a port that is no NodePort
    // (in the NodePort range or not) is refused by the node's own stack at once, and nothing
    // reaches kxdp1.
    for port in [29999, 30081] {
        let out = capture(&ns, "kxdp1", &format!("tcp and dst port {port}"), || {
            let e = tcp_attempt(&ns, &format!("192.168.55.2:{port}")).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        });
        assert!(out.is_empty(), "local traffic stays local: {out}");
    }
    // No policy-routing rule: the kernel keeps its fast route lookup for what it forwards.
    assert!(
        !ip(&ns, "rule show").contains("proto 107"),
        "{}",
        ip(&ns, "rule show")
    );
    hp.teardown().expect("teardown");
    // Teardown takes the redirect away: the NodePort is the node's own again.
    let e = tcp_attempt(&ns, "192.168.55.2:30080").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
}

/// Writes `frame` into `dev` (AF_PACKET, through python3: no unsafe in the tests).
fn inject(ns: &str, dev: &str, frame: &[u8]) {
    let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
    run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "python3",
            "-c",
            "import socket,sys; s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); \
             s.bind((sys.argv[1], 0)); s.send(bytes.fromhex(sys.argv[2]))",
            dev,
            &hex,
        ],
    );
}

fn udp_frame(hp: &HostPath, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(hp.kxdp_mac(), hp.host_mac())
        .ipv4(src, dst, 64)
        .udp(sport, dport)
        .write(&mut f, b"from kxdp1")
        .unwrap();
    f
}

/// Binds UDP `port` in `ns`, injects `frame` into kxdp1, returns the source the socket saw.
fn deliver(ns: &str, port: u16, frame: Vec<u8>) -> Option<SocketAddr> {
    let p = Lab::path(ns);
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&p).unwrap();
        let s = UdpSocket::bind(("0.0.0.0", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        tx.send(()).unwrap();
        let mut buf = [0u8; 64];
        s.recv_from(&mut buf).ok().map(|(_, from)| from)
    });
    rx.recv_timeout(Duration::from_secs(2)).unwrap();
    inject(ns, "kxdp1", &frame);
    t.join().unwrap()
}

#[test]
fn hostpath_frames_written_into_kxdp1_reach_local_sockets() {
    let (_lab, ns) = node("hostpath_frames_written_into_kxdp1_reach_local_sockets");
    let hp = setup(&ns, options());
    let node4 = [192, 168, 55, 2];
    // An un-NATed reply from a ClusterIP (its source routes back through kxdp0).
    let f = udp_frame(&hp, [172, 30, 0, 10], 53, node4, 7001);
    assert_eq!(
        deliver(&ns, 7001, f),
        Some("172.30.0.10:53".parse().unwrap())
    );
    // A reply of a NodePort connection to the node itself: the source is a local address
    // (accept_local).
    let f = udp_frame(&hp, node4, 30053, node4, 7002);
    assert_eq!(
        deliver(&ns, 7002, f),
        Some("192.168.55.2:30053".parse().unwrap())
    );
    // A source that routes through another interface (a pod's, an external client's): kxdp0
    // does no strict reverse-path check.
    let f = udp_frame(&hp, [192, 168, 55, 77], 5000, node4, 7003);
    assert_eq!(
        deliver(&ns, 7003, f),
        Some("192.168.55.77:5000".parse().unwrap())
    );
    drop(hp);

    // conf/all/rp_filter = 1 (strict) is max'ed with kxdp0's value: kxdp0 goes loose (2) and
    // the same frames still arrive.
    lab::sh(&ns, "sysctl -qw net.ipv4.conf.all.rp_filter=1");
    let hp = setup(&ns, options());
    let rp = lab::sh(&ns, "cat /proc/sys/net/ipv4/conf/kxdp0/rp_filter");
    assert_eq!(rp.trim(), "2");
    let f = udp_frame(&hp, [192, 168, 55, 77], 5000, node4, 7004);
    assert_eq!(
        deliver(&ns, 7004, f),
        Some("192.168.55.77:5000".parse().unwrap())
    );
    let f = udp_frame(&hp, node4, 30053, node4, 7005);
    assert_eq!(
        deliver(&ns, 7005, f),
        Some("192.168.55.2:30053".parse().unwrap())
    );
    let f = udp_frame(&hp, [172, 30, 0, 10], 53, node4, 7006);
    assert_eq!(
        deliver(&ns, 7006, f),
        Some("172.30.0.10:53".parse().unwrap())
    );
}

/// What the host path is made of, as `ip` shows it (names, not indexes).
fn host_state(ns: &str) -> String {
    let mut s = String::new();
    s += &ip(ns, "-d rule show");
    s += &ip(ns, "-6 -d rule show");
    s += &ip(ns, "route show table all proto 107");
    s += &ip(ns, "-6 route show table all proto 107");
    // The permanent neighbours, without the (per pair) MAC.
    for l in ip(ns, "neigh show dev kxdp0 nud permanent").lines() {
        s += l.split_whitespace().next().unwrap_or("");
        s += " permanent\n";
    }
    let links: Vec<String> = ip(ns, "-br link")
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect();
    s += &links.join(" ");
    s
}

fn state_without_hostpath(ns: &str) -> String {
    let mut s = String::new();
    s += &ip(ns, "-d rule show");
    s += &ip(ns, "-6 -d rule show");
    s += &ip(ns, "route show table all proto 107");
    s += &ip(ns, "-6 route show table all proto 107");
    s += &ip(ns, "-br link");
    s
}

#[test]
fn hostpath_setup_replaces_and_teardown_restores_exactly() {
    let (_lab, ns) = node("hostpath_setup_replaces_and_teardown_restores_exactly");
    let before = state_without_hostpath(&ns);
    let t = Instant::now();
    let hp = setup(&ns, options());
    eprintln!("host path setup: {:?}", t.elapsed());
    let first = host_state(&ns);
    let first_index = hp.kxdp_ifindex();
    // No rule of kxdp's: the `local` rule where it was (overlay devices, none here, would
    // have theirs).
    let rules = ip(&ns, "rule show");
    assert!(!rules.contains("proto 107"), "{rules}");
    assert_eq!(rules.matches("lookup local").count(), 1, "{rules}");
    let routes = ip(&ns, "route show proto 107");
    assert!(
        routes.contains("172.30.0.0/16 via 169.254.107.1 dev kxdp0")
            && routes.contains("src 192.168.55.2"),
        "{routes}"
    );
    // A crashed run (nothing removed), then a new start: replaced, not stacked.
    std::mem::forget(hp);
    let hp = setup(&ns, options());
    assert_eq!(host_state(&ns), first, "a second setup replaces the first");
    let neigh = ip(&ns, "neigh show dev kxdp0 nud permanent");
    assert_eq!(neigh.matches(&mac_str(hp.kxdp_mac())).count(), 2, "{neigh}");
    assert_ne!(hp.kxdp_ifindex(), first_index, "a fresh pair");
    // Changing the service prefixes replaces the routes.
    let mut hp = hp;
    hp.set_service_routes(&[
        "172.31.0.0/16".parse().unwrap(),
        "fd00:30::/108".parse().unwrap(),
    ])
    .unwrap();
    let routes = ip(&ns, "route show proto 107");
    assert!(routes.contains("172.31.0.0/16") && !routes.contains("172.30.0.0/16"));
    assert!(!routes.contains("203.0.113.10"), "{routes}");
    let t = Instant::now();
    hp.teardown().unwrap();
    eprintln!("host path teardown: {:?}", t.elapsed());
    assert_eq!(
        state_without_hostpath(&ns),
        before,
        "teardown restores exactly"
    );
    // Drop (kxdp exiting without an explicit teardown) restores too.
    let hp = setup(&ns, options());
    drop(hp);
    assert_eq!(state_without_hostpath(&ns), before);
}

/// Waits up to 3 s for `ok(state)`; returns the last state.
fn wait_for(ns: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + Duration::from_secs(3);
    loop {
        let rules = ip(ns, "rule show") + &ip(ns, "-6 rule show");
        if ok(&rules) {
            return rules;
        }
        assert!(Instant::now() < end, "{what}: {rules}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What follows the node (netlink link and address events): an overlay device that appears
/// gets its rules (a name the node does not have gets none: a namespace's first rule puts all
/// its forwarding on the kernel's slower rule-based lookup), and the service routes' source
/// follows the node's addresses (the first local one of each family among the candidates);
/// teardown still restores `ip rule` exactly.
#[test]
fn hostpath_follows_overlay_devices_and_node_addresses() {
    use kxdp_dataplane::io::host_path::NodeAddressFollower;
    use std::sync::{Arc, Mutex};
    const EXTRA4: &str = "192.168.55.9";
    let (_lab, ns) = node("hostpath_follows_overlay_devices_and_node_addresses");
    let before = state_without_hostpath(&ns);
    let opts = HostPathOptions {
        overlay_ifs: vec!["kxov0".into(), "kxov1".into()],
        ..options()
    };
    let hp = Arc::new(Mutex::new(Some(setup(&ns, opts))));
    let candidates: Vec<std::net::IpAddr> = [EXTRA4, NODE4, NODE6]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let h = hp.clone();
    let mut follower = Lab::in_ns(&ns, move || {
        NodeAddressFollower::start(h, candidates).expect("follower")
    });
    // Neither overlay device exists: no rule at all.
    let rules = ip(&ns, "rule show") + &ip(&ns, "-6 rule show");
    assert!(!rules.contains("proto 107"), "{rules}");
    let routes = ip(&ns, "route show proto 107");
    assert!(routes.contains(&format!("src {NODE4}")), "{routes}");

    let t = Instant::now();
    ip(&ns, "link add kxov0 type veth peer name kxov0p");
    let rules = wait_for(&ns, "the overlay rules of kxov0", |r| {
        r.matches("iif kxov0").count() == 2
    });
    eprintln!("overlay rules after {:?}", t.elapsed());
    assert!(rules.contains("lookup 27513"), "{rules}");
    assert!(
        !rules.contains("kxov1"),
        "no rule for a device the node lacks: {rules}"
    );

    // The first candidate becomes local: the service routes leave from it.
    ip(&ns, &format!("addr add {EXTRA4}/24 dev up0"));
    let end = Instant::now() + Duration::from_secs(3);
    while !ip(&ns, "route show proto 107").contains(&format!("src {EXTRA4}")) {
        assert!(Instant::now() < end, "{}", ip(&ns, "route show proto 107"));
        std::thread::sleep(Duration::from_millis(50));
    }
    ip(&ns, &format!("addr del {EXTRA4}/24 dev up0"));
    let end = Instant::now() + Duration::from_secs(3);
    while !ip(&ns, "route show proto 107").contains(&format!("src {NODE4}")) {
        assert!(Instant::now() < end, "{}", ip(&ns, "route show proto 107"));
        std::thread::sleep(Duration::from_millis(50));
    }
    follower.stop();
    let hp = hp.lock().unwrap().take().unwrap();
    hp.teardown().expect("teardown");
    ip(&ns, "link del kxov0");
    assert_eq!(
        state_without_hostpath(&ns),
        before,
        "teardown restores exactly"
    );
}

/// IPv6 through `kxdp0`, which has no IPv6 address (address generation none on both sides of
/// the pair): a frame kxdp hands over for the node's own address reaches its socket, and one
/// for elsewhere (a pod's traffic leaving the cluster) is routed on exactly when the node's
/// `net.ipv6.conf.all.forwarding` is 1 (only `all` gates IPv6 forwarding).
#[test]
fn hostpath_ipv6_frames_written_into_kxdp1_are_delivered_and_forwarded() {
    let mut lab = Lab::new();
    let ns = lab.netns("hp6");
    let peer = lab.netns("hp6-peer");
    lab.veth(&ns, "up0", &peer, "eth0");
    ip(&ns, &format!("addr add {NODE4}/24 dev up0"));
    ip(&ns, &format!("addr add {NODE6}/64 dev up0 nodad"));
    ip(&peer, "addr add fd55::77/64 dev eth0 nodad");
    let hp = setup(&ns, options());
    for dev in ["kxdp0", "kxdp1"] {
        let link = ip(&ns, &format!("-d link show dev {dev}"));
        assert!(link.contains("addrgenmode none"), "{dev}: {link}");
        let addrs = ip(&ns, &format!("-6 addr show dev {dev}"));
        assert!(
            !addrs.contains("inet6"),
            "{dev} has no IPv6 address: {addrs}"
        );
    }
    let frame = |src: &str, dst: &str, dport: u16| {
        let (src, dst): (std::net::Ipv6Addr, std::net::Ipv6Addr) =
            (src.parse().unwrap(), dst.parse().unwrap());
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2(hp.kxdp_mac(), hp.host_mac())
            .ipv6(src.octets(), dst.octets(), 64)
            .udp(5000, dport)
            .write(&mut f, b"from kxdp1")
            .unwrap();
        f
    };
    // Binds UDP `port` on [::] in `at`, writes `f` into kxdp1 (every 200 ms: the first may
    // wait for neighbour discovery on up0) until the socket sees it, bounded.
    let receive = |at: &str, port: u16, f: Vec<u8>| -> Option<SocketAddr> {
        let p = Lab::path(at);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            kxdp_kernel::enter_netns(&p).unwrap();
            let s = UdpSocket::bind(("::", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 64];
            s.recv_from(&mut buf).ok().map(|(_, from)| from)
        });
        rx.recv_timeout(Duration::from_secs(2)).unwrap();
        let end = Instant::now() + Duration::from_millis(2500);
        while !t.is_finished() && Instant::now() < end {
            inject(&ns, "kxdp1", &f);
            std::thread::sleep(Duration::from_millis(200));
        }
        t.join().unwrap()
    };
    // An un-NATed reply from an IPv6 ClusterIP to the node's own address.
    assert_eq!(
        receive(&ns, 7101, frame("fd00:30::10", NODE6, 7101)),
        Some("[fd00:30::10]:5000".parse().unwrap())
    );
    // A pod's packet to outside the cluster: dropped while IPv6 forwarding is off on the node
    // (kxdp warns about it), routed out of up0 once it is on.
    lab::sh(&ns, "sysctl -qw net.ipv6.conf.all.forwarding=0");
    assert_eq!(
        receive(&peer, 7102, frame("fd00:10::5", "fd55::77", 7102)),
        None
    );
    lab::sh(&ns, "sysctl -qw net.ipv6.conf.all.forwarding=1");
    assert_eq!(
        receive(&peer, 7103, frame("fd00:10::5", "fd55::77", 7103)),
        Some("[fd00:10::5]:5000".parse().unwrap())
    );
    hp.teardown().expect("teardown");
}
