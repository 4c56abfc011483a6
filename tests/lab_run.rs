//! `kxdp run` on the lab (tests/lab/mod.rs: an external client, the node, two server pods and a
//! client pod in network namespaces) with real sockets: ClusterIP TCP and UDP with responses
//! reverse-NATed, NodePort from the external client (masqueraded; externalTrafficPolicy Local
//! keeps the client's address), a Service without endpoints refused at once, an ICMP error
//! translated back through the NAT, a NetworkPolicy deny that times the client out, a kxdp
//! restart during a long transfer, and the clients of a backend that vanished reset once its
//! endpoint is removed.

mod lab;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use lab::{lab_files, Cluster, Kxdp, Lab, Servers, NODE_IP};

struct Running {
    c: Cluster,
    _servers: Vec<Servers>,
    kxdp: Kxdp,
}

fn start(test: &str) -> Option<Running> {
    if !lab::available(test) {
        return None;
    }
    let c = Cluster::build();
    let servers = vec![
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let (config, state) = lab_files();
    let kxdp = Kxdp::start(&c.node, &config, &state);
    Some(Running {
        c,
        _servers: servers,
        kxdp,
    })
}

/// Connects from `ns` to `to`, returns (the peer address the server saw, bytes the server
/// counted after we sent `send` bytes).
fn tcp_exchange(ns: &str, to: &str, send: usize) -> (String, u64) {
    let to = to.to_string();
    Lab::in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {to}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut peer = String::new();
        r.read_line(&mut peer).unwrap();
        let chunk = vec![0x5au8; 16 * 1024];
        let mut left = send;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n]).unwrap();
            left -= n;
        }
        s.shutdown(Shutdown::Write).unwrap();
        let mut count = String::new();
        r.read_line(&mut count).unwrap();
        (
            peer.trim().to_string(),
            count.trim().parse().unwrap_or(u64::MAX),
        )
    })
}

fn udp_exchange(ns: &str, to: &str) -> std::io::Result<String> {
    lab::udp_ask(ns, to, 3, Duration::from_secs(2))
}

fn host(peer: &str) -> &str {
    peer.rsplit_once(':').map(|(h, _)| h).unwrap_or(peer)
}

#[test]
fn lab_clusterip_tcp_and_udp_reverse_nat() {
    let Some(r) = start("lab_clusterip_tcp_and_udp_reverse_nat") else {
        return;
    };
    let client = r.c.pod("client-1").to_string();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (peer, count) = tcp_exchange(&client, "172.30.0.10:80", 200_000);
        assert_eq!(host(&peer), "10.1.0.13", "pod traffic is not masqueraded");
        assert_eq!(count, 200_000, "every byte reached the pod");
        let udp = udp_exchange(&client, "172.30.0.10:53").expect("UDP through the ClusterIP");
        assert_eq!(host(&udp), "10.1.0.13");
        seen.insert(peer);
    }
    drop(r.kxdp);
}

#[test]
fn lab_nodeport_external_local_keeps_client_address() {
    let Some(r) = start("lab_nodeport_external_local_keeps_client_address") else {
        return;
    };
    let (peer, count) = tcp_exchange(&r.c.ext, &format!("{NODE_IP}:30081"), 50_000);
    assert_eq!(host(&peer), lab::EXT_IP, "externalTrafficPolicy Local");
    assert_eq!(count, 50_000);
}

#[test]
fn lab_service_without_endpoints_refused_at_once() {
    let Some(r) = start("lab_service_without_endpoints_refused_at_once") else {
        return;
    };
    let client = r.c.pod("client-1").to_string();
    let t0 = Instant::now();
    let e = Lab::in_ns(&client, || {
        TcpStream::connect_timeout(&"172.30.0.20:80".parse().unwrap(), Duration::from_secs(5))
            .map(|_| ())
            .unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "TCP RST: {e}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    let t0 = Instant::now();
    let e = udp_exchange(&client, "172.30.0.20:53").unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::ConnectionRefused,
        "ICMP port unreachable: {e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}

#[test]
fn lab_icmp_error_translated_through_nat() {
    let Some(r) = start("lab_icmp_error_translated_through_nat") else {
        return;
    };
    // Nothing listens on the endpoints' UDP 5454: the pod's kernel answers with ICMP port
    // unreachable from 10.1.0.1x quoting the DNATed datagram. Only translated back (source the
    // ClusterIP, quoted destination 172.30.0.10:54) does it reach the client's socket.
    let client = r.c.pod("client-1").to_string();
    let e = udp_exchange(&client, "172.30.0.10:54").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
}

#[test]
fn lab_nodeport_external_cluster_is_masqueraded() {
    let Some(r) = start("lab_nodeport_external_cluster_is_masqueraded") else {
        return;
    };
    // The pod sees the node's address (masquerade) and its replies, addressed to the node on the
    // client's port, are steered back to kxdp (MASQ map), not to the node's kernel.
    for _ in 0..4 {
        let (peer, count) = tcp_exchange(&r.c.ext, &format!("{NODE_IP}:30080"), 100_000);
        assert_eq!(host(&peer), NODE_IP, "masqueraded to the node address");
        assert_eq!(count, 100_000);
    }
    let udp = udp_exchange(&r.c.ext, &format!("{NODE_IP}:30053")).expect("UDP NodePort");
    assert_eq!(host(&udp), NODE_IP);
}

/// What a kxdp restart without a state file does to a long transfer through a ClusterIP
/// (docs/afxdp.md): conntrack lives in the process, so the connection's state is lost. While kxdp
/// is down the node's kernel gets the packets and drops them (no route to the ClusterIP,
/// forwarding off); after the restart the stream's next packet is mid-connection without a
/// conntrack entry and answered with a RST (`ct-lost`): the old connection ends at once
/// instead of stalling until the application gives up, and new connections work at once. (With
/// `conntrack.stateFile` the connection continues: tests/cni_restart.rs.)
#[test]
fn lab_restart_during_long_transfer() {
    let Some(mut r) = start("lab_restart_during_long_transfer") else {
        return;
    };
    let client = r.c.pod("client-1").to_string();
    let (tx, rx) = std::sync::mpsc::channel::<&'static str>();
    let (progress_tx, progress_rx) = std::sync::mpsc::channel::<u64>();
    let path = Lab::path(&client);
    let transfer = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&path).unwrap();
        let mut s =
            TcpStream::connect_timeout(&"172.30.0.10:80".parse().unwrap(), Duration::from_secs(5))
                .unwrap();
        s.set_write_timeout(Some(Duration::from_secs(4))).unwrap();
        let chunk = vec![1u8; 64 * 1024];
        let mut sent = 0u64;
        loop {
            match s.write(&chunk) {
                Ok(n) => {
                    sent += n as u64;
                    let _ = progress_tx.send(sent);
                }
                Err(e) => {
                    let _ = tx.send(
                        if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut {
                            "stalled"
                        } else {
                            "error"
                        },
                    );
                    return sent;
                }
            }
        }
    });
    // The transfer runs through kxdp.
    let mut last = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(800) {
        if let Ok(n) = progress_rx.recv_timeout(Duration::from_millis(100)) {
            last = n;
        }
    }
    assert!(
        last > 1_000_000,
        "transfer running before the restart: {last} bytes"
    );
    let st = r.kxdp.stop().expect("kxdp exited");
    assert!(st.success(), "SIGTERM is a clean exit: {st:?}");
    assert!(
        lab::xdp_on(&r.c.node, "up0").is_none(),
        "programs detached on SIGTERM"
    );
    let (config, state) = lab_files();
    r.kxdp = Kxdp::start(&r.c.node, &config, &state);
    // New connections work right away.
    let (peer, count) = tcp_exchange(&client, "172.30.0.10:80", 10_000);
    assert_eq!(host(&peer), "10.1.0.13");
    assert_eq!(count, 10_000);
    // The old one does not recover: it is reset (its writes fail), well before a write timeout.
    let outcome = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the old transfer neither stalled nor failed");
    assert_eq!(outcome, "error", "reset by ct-lost, not stalled");
    transfer.join().unwrap();
}

#[test]
fn lab_network_policy_deny_times_out() {
    if !lab::available("lab_network_policy_deny_times_out") {
        return;
    }
    // web pods accept ingress only from pods labelled role=frontend; client-1 is not one.
    let dir = tempfile::tempdir().unwrap();
    let (config, state) = lab_files();
    std::fs::copy(&state, dir.path().join("00-cluster.yaml")).unwrap();
    std::fs::write(
        dir.path().join("10-policy.yaml"),
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-frontend, namespace: lab}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: frontend}}
",
    )
    .unwrap();
    let c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let _kxdp = Kxdp::start(&c.node, &config, dir.path().to_str().unwrap());
    let client = c.pod("client-1").to_string();
    let t0 = Instant::now();
    let e = Lab::in_ns(&client, || {
        TcpStream::connect_timeout(&"172.30.0.10:80".parse().unwrap(), Duration::from_secs(3))
            .map(|_| ())
            .unwrap_err()
    });
    assert!(
        matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
        "denied: the client times out (no RST): {e}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(3));
    // A Service whose pods no policy selects is unaffected: the empty Service still refuses.
    let e = Lab::in_ns(&client, || {
        TcpStream::connect_timeout(&"172.30.0.20:80".parse().unwrap(), Duration::from_secs(3))
            .map(|_| ())
            .unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
}

/// A backend that vanishes without closing (its pod's interface deleted while a client holds a
/// keep-alive connection to it through the ClusterIP): until the endpoint's removal arrives
/// nothing tells the client (its data would go unanswered, retransmitted until its own timeout);
/// once the state without the endpoint is published, the client's next send is answered with a RST from the
/// frontend (`backend-gone`) and the connection fails with ECONNRESET within a second, and a new
/// connection goes to the endpoint still listed (docs/nat.md §4).
#[test]
fn removed_backend_resets_its_clients() {
    if !lab::available("removed_backend_resets_its_clients") {
        return;
    }
    let (config, state) = lab_files();
    let cluster = std::fs::read_to_string(&state).unwrap();
    let both = "- {addresses: [10.1.0.11], conditions: {ready: true}, nodeName: node-a}\n\
                - {addresses: [10.1.0.12], conditions: {ready: true}, nodeName: node-a}\n";
    assert_eq!(cluster.matches(both).count(), 1, "the lab's web endpoints");
    let only = |ip: &str| {
        cluster.replace(
            both,
            &format!("- {{addresses: [{ip}], conditions: {{ready: true}}, nodeName: node-a}}\n"),
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let state_file = dir.path().join("cluster.yaml");
    std::fs::write(&state_file, only("10.1.0.11")).unwrap();
    let c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let kxdp = Kxdp::start(&c.node, &config, dir.path().to_str().unwrap());
    let client = c.pod("client-1").to_string();
    // The keep-alive connection, to web-1 (the only endpoint), greeted by the server.
    let (to_client, conn) = std::sync::mpsc::channel::<TcpStream>();
    let path = Lab::path(&client);
    std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&path).unwrap();
        let s =
            TcpStream::connect_timeout(&"172.30.0.10:80".parse().unwrap(), Duration::from_secs(5))
                .unwrap();
        to_client.send(s).unwrap();
    })
    .join()
    .unwrap();
    let s = conn.recv().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut greeting = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut greeting)
        .unwrap();
    assert_eq!(host(greeting.trim()), "10.1.0.13", "greeted by web-1");
    // web-1 vanishes without a FIN or a RST: its interface is deleted (its host veth with it).
    lab::ip(c.pod("web-1"), "link del eth0");
    // Before the removal arrives nothing tells the client: its connection stays open. (Data it
    // sent now would go unanswered and back its retransmission timer off, so that the reset
    // would come only with a retransmission seconds later; a keep-alive client is idle here.)
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    let e = (&s)
        .read(&mut buf)
        .expect_err("nothing from a vanished backend");
    assert!(
        matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "no reset before the removal: {e}"
    );
    // The EndpointSlice update: web-1 removed for good.
    std::fs::write(&state_file, only("10.1.0.12")).unwrap();
    reset_once_marked(&kxdp, &s);
    // A new connection goes to the endpoint still listed.
    let (peer, count) = tcp_exchange(&client, "172.30.0.10:80", 1000);
    assert_eq!(host(&peer), "10.1.0.13");
    assert_eq!(count, 1000);
    drop(kxdp);
}

/// As `removed_backend_resets_its_clients`, across a restart with the conntrack state file: the
/// endpoint is removed while kxdp is down; the new process continues the connection from the
/// file, and its first tables find the endpoint gone, so the client's next send is reset.
#[test]
fn backend_removed_while_kxdp_is_down_resets_its_clients() {
    if !lab::available("backend_removed_while_kxdp_is_down_resets_its_clients") {
        return;
    }
    let (config, state) = lab_files();
    let dir = tempfile::tempdir().unwrap();
    let config_text = std::fs::read_to_string(&config).unwrap();
    let ct_file = dir.path().join("conntrack");
    let with_file = config_text.replace(
        "conntrack: {stateFile: \"\"}",
        &format!(
            "conntrack: {{stateFile: \"{}\", stateFileHugePages: false}}",
            ct_file.display()
        ),
    );
    assert_ne!(
        with_file, config_text,
        "the lab config names its state file"
    );
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, with_file).unwrap();
    let config = config.to_str().unwrap().to_string();
    let cluster = std::fs::read_to_string(&state).unwrap();
    let both = "- {addresses: [10.1.0.11], conditions: {ready: true}, nodeName: node-a}\n\
                - {addresses: [10.1.0.12], conditions: {ready: true}, nodeName: node-a}\n";
    let only = |ip: &str| {
        cluster.replace(
            both,
            &format!("- {{addresses: [{ip}], conditions: {{ready: true}}, nodeName: node-a}}\n"),
        )
    };
    let states = dir.path().join("state");
    std::fs::create_dir(&states).unwrap();
    std::fs::write(states.join("cluster.yaml"), only("10.1.0.11")).unwrap();
    let c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let mut kxdp = Kxdp::start(&c.node, &config, states.to_str().unwrap());
    let client = c.pod("client-1").to_string();
    let path = Lab::path(&client);
    let s = std::thread::spawn(move || {
        kxdp_kernel::enter_netns(&path).unwrap();
        TcpStream::connect_timeout(&"172.30.0.10:80".parse().unwrap(), Duration::from_secs(5))
            .unwrap()
    })
    .join()
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut greeting = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut greeting)
        .unwrap();
    assert_eq!(host(greeting.trim()), "10.1.0.13", "greeted by web-1");
    let st = kxdp.stop().expect("kxdp exited");
    assert!(st.success(), "{st:?}");
    // While kxdp is down, web-1 vanishes and its endpoint is removed.
    lab::ip(c.pod("web-1"), "link del eth0");
    std::fs::write(states.join("cluster.yaml"), only("10.1.0.12")).unwrap();
    let kxdp = Kxdp::start(&c.node, &config, states.to_str().unwrap());
    reset_once_marked(&kxdp, &s);
    drop(kxdp);
}

/// Waits (10 s at most) until kxdp has marked the connections of the removed endpoint, then
/// requires the client's next send on `s` to be reset within a second. Nagle off: otherwise
/// the send waits behind the unanswered data, whose retransmission timer has backed off by
/// then (seconds on a loaded machine).
fn reset_once_marked(kxdp: &Kxdp, s: &TcpStream) {
    let marked = "TCP connections of removed endpoints marked";
    assert!(
        lab::wait_until(Duration::from_secs(10), || kxdp
            .stderr
            .lock()
            .unwrap()
            .contains(marked)),
        "the removal was published and the connection marked:\n{}",
        kxdp.stderr.lock().unwrap()
    );
    s.set_nodelay(true).unwrap();
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = (&*s).write_all(b"hello again");
    let mut buf = [0u8; 64];
    let e = (&*s).read(&mut buf).expect_err("the connection is reset");
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "reset within a second: {:?}",
        t0.elapsed()
    );
}
