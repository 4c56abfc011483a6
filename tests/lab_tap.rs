//! `podInterception: tap` end to end (needs root, the CNI plugins and Debian's iperf3): node-a
//! of the CNI lab (pods made by the `ptp` plugin, a host-side veth each) runs `kxdp run` with
//! `interfaces: [eth0, "veth*"]` and `podInterception: {mode: tap, everyVeth: false}`, so the
//! pods' veths get a tc redirect into kxdp's tap instead of the XDP program, and the uplink (a
//! veth here, which the default would intercept through the tap too) keeps XDP as a NIC does.
//!
//! Checked: no XDP program on the pods' veths and kxdp's redirect on them; bulk TCP (iperf3)
//! from a pod to a ClusterIP whose endpoint is a pod on the same node completes, the client pod
//! keeps TSO and GSO on, no TCP checksum error in either pod, conntrack tracked the flow (the
//! Service's DNAT, its replies un-NATed, a connection created), and super-frames were counted
//! as their segments; a NetworkPolicy deny is enforced on the tap path (the connection times
//! out, `policy-denied-ingress`); IPv6 through the IPv6 ClusterIP after the pod's neighbour
//! cache was flushed (neighbour discovery stays with the kernel); a Service without endpoints is refused with kxdp's RST
//! written into the tap; a ClusterIP whose endpoint is on node-b works, its short
//! connections on the fast path from their SYN, what comes back on the uplink handed by the XDP
//! program to the tc fast path beside it (the workers see each connection's SYN only); a NodePort from outside the cluster to a pod on
//! node-a (masqueraded, the reply through the tap); source validation (the default, strict) on the tap
//! path: a pod sending with an admitted pod's address (IPv4 and IPv6, TCP and UDP) does not
//! reach the policy-protected pod and is counted as `spoofed-source`, the admitted pod's own
//! crafted packets arrive; a clean stop removes the redirects and the tap.
//!
//! `tap_mode_with_the_uplink`: both nodes with the default `podInterception`, whose veth
//! uplink goes through the tap as well (no XDP anywhere); bulk TCP across the nodes on both fast paths, the node's own traffic left to the
//! kernel, a NodePort, a clean stop that gives the uplink back.
//!
//! `interception_changes_across_restarts_and_takeovers`: mode xdp, a restart into mode tap (the
//! programs held for it removed), a takeover into mode xdp and one back: the pods' veths end as
//! the running kxdp is configured, the pod's TSO with them, and a ClusterIP keeps working.
//!
//! ```sh
//! cargo test --test lab_tap -- --nocapture
//! ```

mod cni;
mod lab;
mod spoof;

use std::net::{IpAddr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use cni::{metric, sa, tcp, Lab, TCP_PORT};

const TAP: &str = "kxdptap0";
const IPERF_PORT: u16 = 5201;
/// A server of the node's own (not a NodePort).
const NODE_PORT: u16 = 5299;
const T: Duration = Duration::from_secs(5);

/// `TcpInCsumErrors` of a namespace.
fn csum_errors(ns: &str) -> u64 {
    let snmp = lab::sh(ns, "cat /proc/net/snmp");
    let tcp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let names: Vec<&str> = tcp[0].split_whitespace().collect();
    let vals: Vec<&str> = tcp[1].split_whitespace().collect();
    let i = names.iter().position(|n| *n == "InCsumErrors").unwrap();
    vals[i].parse().unwrap()
}

/// An iperf3 server in `ns` on `port`, stopped when dropped (by its own pid: the tests of this
/// file run side by side, so no `pkill`).
struct Iperf3Server(String);

impl Iperf3Server {
    fn start(ns: &str, port: u16) -> Iperf3Server {
        let pidfile = format!("/tmp/kxdp-iperf3-{ns}-{port}.pid");
        lab::sh(
            ns,
            &format!("iperf3 -s -D -p {port} --logfile /dev/null -I {pidfile}"),
        );
        Iperf3Server(pidfile)
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args([
                "-c",
                &format!("kill $(cat {0}) 2>/dev/null; rm -f {0}", self.0),
            ])
            .status();
    }
}

/// The ClusterIP 172.30.0.12 port 80 → the iperf3 servers of the pods labelled `app`.
fn iperf_service(lab: &Lab, app: &str) -> String {
    lab.service("iperf", 12, app, None, false)
        .replace(
            &format!("targetPort: {TCP_PORT}"),
            &format!("targetPort: {IPERF_PORT}"),
        )
        .replace(
            &format!("{{name: tcp, port: {TCP_PORT},"),
            &format!("{{name: tcp, port: {IPERF_PORT},"),
        )
}

/// The CNI lab (or the test's skip) and Debian's iperf3.
fn require_lab_and_iperf3(test: &str) {
    cni::require(test);
    assert!(
        Command::new("iperf3").arg("--version").output().is_ok(),
        "iperf3 missing: apt-get install iperf3"
    );
}

/// 3 s of iperf3 from `client` through the ClusterIP 172.30.0.12:80 to the server in `server`:
/// it completes and neither pod counts a TCP checksum error. Returns the bytes received.
fn iperf3_through(client: &str, server: &str, through: &str, log: impl Fn() -> String) -> f64 {
    let errors = (csum_errors(client), csum_errors(server));
    let out = lab::sh(
        client,
        "timeout 30 iperf3 -c 172.30.0.12 -p 80 -t 3 -J || true",
    );
    let j: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("iperf3: {e}: {out}\n{}", log()));
    assert!(
        j.get("error").is_none(),
        "iperf3: {}\n{}",
        j["error"],
        log()
    );
    let gbit = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e9;
    let bytes = j["end"]["sum_received"]["bytes"].as_f64().unwrap();
    eprintln!("iperf3 through {through}: {gbit:.2} Gbit/s, {bytes} bytes");
    assert!(bytes > 1e6, "{out}");
    assert_eq!(
        (csum_errors(client), csum_errors(server)),
        errors,
        "TcpInCsumErrors rose"
    );
    bytes
}

/// The pod's `eth0` offload `feature` (`on`/`off`).
fn offload(ns: &str, feature: &str) -> String {
    lab::sh(ns, "ethtool -k eth0 2>/dev/null || true")
        .lines()
        .find(|l| l.starts_with(feature))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string()
}

/// Short connections from `client` to the ClusterIP `service`'s port 80 (answered by
/// `server`), each on the fast path from its SYN: the workers see its SYN only, the
/// handshake's rest, the request, the answer and the close going by in the kernel (`node`'s
/// metrics).
fn short_connections_on_the_fast_path(
    node: &str,
    client: &str,
    service: [u8; 4],
    server: &str,
    k: &cni::KxdpNode,
) {
    const SHORT: u64 = 20;
    let (packets, offloaded) = (
        metric(node, "kxdp_packets_total"),
        metric(node, "kxdp_offloaded_packets_total"),
    );
    for _ in 0..SHORT {
        let to = sa(service, 80);
        let answer = tcp(client, to, Duration::from_secs(2), 100).expect("a short connection");
        assert_eq!(answer.server, server);
    }
    std::thread::sleep(Duration::from_millis(300));
    let moved = metric(node, "kxdp_offloaded_packets_total") - offloaded;
    let seen = metric(node, "kxdp_packets_total") - packets - moved;
    eprintln!(
        "{SHORT} short connections to {server}: {seen} packets through the workers, {moved} in \
         the kernel"
    );
    assert!(
        moved >= 6 * SHORT && seen <= 2 * SHORT,
        "{seen} packets through the workers, {moved} on the fast path\n{}",
        k.log()
    );
}

#[test]
fn tap_mode_end_to_end() {
    require_lab_and_iperf3("tap_mode_end_to_end");
    let mut lab = Lab::build("lab_tap");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-a", "other-a", &[("app", "other")]);
    lab.add_pod("node-a", "web-a1", &[("app", "web")]);
    lab.add_pod("node-b", "remote-b1", &[("app", "remote")]);
    lab.add_pod("node-a", "np-a1", &[("app", "np")]);
    lab.warm_neighbours();
    let node = lab.node("node-a").ns.clone();
    let (client, other, web) = (lab.pod("client-a"), lab.pod("other-a"), lab.pod("web-a1"));
    let _iperf3 = Iperf3Server::start(&web.ns, IPERF_PORT);
    // The web pods admit clients only: other-a's connections are dropped by kxdp.
    let objects = lab.service("web", 10, "web", None, false)
        + &iperf_service(&lab, "web")
        + &lab.service("remote", 11, "remote", None, false)
        + &lab.service("empty", 13, "nobody", None, false)
        + &lab.service("np", 14, "np", Some(30081), false)
        + "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: lab}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {app: client}}
---
";
    let config = lab.kxdp_config("node-a", false).replace(
        "metricsBindAddress: \"\"",
        "metricsBindAddress: 127.0.0.1:10249",
    ) + "podInterception: {mode: tap, everyVeth: false}\n";
    let takeover = lab.dir.path().join("takeover.sock");
    let mut k = lab.start_kxdp_takeover("node-a", &config, &objects, &takeover);

    // Attached: the redirect on the pods' veths, XDP on the uplink only.
    for p in [client, other, web] {
        assert_eq!(lab::xdp_on(&node, &p.host_if), None, "{}", k.log());
        let tc = lab::sh(&node, &format!("tc filter show dev {} ingress", p.host_if));
        assert!(
            tc.contains("kxdp-tap tag") && tc.contains("direct-action"),
            "{}: {tc}",
            p.host_if
        );
    }
    assert!(lab::xdp_on(&node, "eth0").is_some(), "{}", k.log());
    // Beside it, the fast path on the uplink's ingress (what the XDP program hands over).
    let tc = lab::sh(&node, "tc filter show dev eth0 ingress");
    assert!(tc.contains("kxdp-tap tag"), "eth0: {tc}");
    assert!(
        k.log().contains("tc redirect into kxdp's tap"),
        "{}",
        k.log()
    );

    // Bulk TCP through the ClusterIP, both ends on node-a.
    let bytes = iperf3_through(&client.ns, &web.ns, "the tap", || k.log());
    assert_eq!(
        offload(&client.ns, "tcp-segmentation-offload:"),
        "on",
        "the pod keeps TSO"
    );
    assert_eq!(offload(&client.ns, "generic-segmentation-offload:"), "on");

    // Conntrack tracked it: the DNAT, its replies un-NATed, and the super-frames counted as
    // their segments (more packets than the tap handed over frames).
    let dnat = metric(&node, "kxdp_verdicts_total{reason=\"service-dnat\"}");
    let unnat = metric(&node, "kxdp_verdicts_total{reason=\"reply-unnat\"}");
    let est = metric(&node, "kxdp_verdicts_total{reason=\"ct-established\"}");
    let created = metric(&node, "kxdp_conntrack_created_total");
    eprintln!("service-dnat {dnat}, reply-unnat {unnat}, ct-established {est}, created {created}");
    assert!(dnat >= 2, "the control and data connections: {dnat}");
    assert!(created >= 2 && unnat > 0, "{created} {unnat}");
    // 3 s at well over 100 Mbit/s is far more than 10,000 segments of 1,448 bytes.
    assert!(
        est as f64 * 1448.0 >= bytes * 0.9,
        "{est} segments for {bytes} bytes"
    );
    // Once established, the transfer took the kernel's fast path (counted as it went, by
    // reason too); closed, its flows left it.
    let offloaded = metric(&node, "kxdp_offloaded_packets_total");
    eprintln!("offloaded {offloaded} packets");
    assert!(
        offloaded as f64 * 1448.0 >= bytes * 0.5,
        "{offloaded} packets offloaded for {bytes} bytes\n{}",
        k.log()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(metric(&node, "kxdp_offloaded_flows"), 0, "{}", k.log());
    // Short connections through the ClusterIP, both pods here (routed directly); closed, the
    // flows leave the fast path.
    short_connections_on_the_fast_path(&node, &client.ns, [172, 30, 0, 10], "web-a1", &k);
    assert_eq!(metric(&node, "kxdp_offloaded_flows"), 0, "{}", k.log());
    // The tap's own drops (its queues full) are published beside the sockets' counters.
    let m = lab::sh(
        &node,
        "curl -s http://127.0.0.1:10249/metrics | grep '^kxdp_tap_queue_full_total' || true",
    );
    assert!(
        m.starts_with("kxdp_tap_queue_full_total{interface=\"kxdptap0\"} "),
        "{m}"
    );
    // The tap's queues hold `podInterception.queueLength` frames (the default, 256).
    let qlen = lab::sh(&node, &format!("cat /sys/class/net/{TAP}/tx_queue_len"));
    assert_eq!(qlen.trim(), "256", "{}", k.log());
    // Direct routing: pod to pod, the connections never passed the node's netfilter, so the
    // node's own conntrack (active: the CNI's masquerade rules) has no entry for them.
    let kernel_ct = lab::sh(&node, "cat /proc/net/nf_conntrack 2>/dev/null || true");
    let to_web = format!("dst={} sport=", web.ip4);
    let seen: Vec<&str> = (kernel_ct.lines())
        .filter(|l| l.contains(&to_web) && l.contains(&format!("dport={IPERF_PORT} ")))
        .collect();
    assert!(seen.is_empty(), "the node's conntrack saw {seen:?}");
    let direct = metric(&node, "kxdp_direct_routed_packets_total");
    assert!(
        direct as f64 * 1448.0 >= bytes * 0.5,
        "{direct} packets routed directly for {bytes} bytes"
    );
    // Longer than the egress interface's MTU (web-a1's veth at 1300, the client's at 1500): the
    // direct send is refused and the kernel routes the datagram from the tap as it would
    // without kxdp: "fragmentation needed" to the client, whose next try goes in fragments.
    lab::sh(&node, &format!("ip link set {} mtu 1300", web.host_if));
    lab::sh(&web.ns, "ip link set eth0 mtu 1300");
    let to = sa(web.ip4, 5353);
    let answer = cni::in_ns(&client.ns, move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect(to).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 512];
        (0..4).find_map(|_| {
            let _ = s.send(&[b'x'; 1400]);
            s.recv(&mut buf)
                .ok()
                .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        })
    });
    lab::sh(&web.ns, "ip link set eth0 mtu 1500");
    lab::sh(&node, &format!("ip link set {} mtu 1500", web.host_if));
    assert!(
        answer.as_deref().is_some_and(|a| a.starts_with("web-a1")),
        "a 1428-byte datagram past a 1300-byte MTU: {answer:?}\n{}",
        k.log()
    );

    // The NetworkPolicy: other-a is not a client; its connection is dropped (times out), the
    // client's is admitted.
    let a = tcp(&client.ns, sa([172, 30, 0, 10], 80), T, 1000).expect("client admitted");
    assert_eq!(a.peer, IpAddr::from(client.ip4));
    let t0 = Instant::now();
    let e = tcp(
        &other.ns,
        sa([172, 30, 0, 10], 80),
        Duration::from_secs(2),
        0,
    )
    .unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "denied: times out: {e}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(2));
    assert!(metric(&node, "kxdp_drops_total{reason=\"policy-denied-ingress\"}") >= 1);

    // IPv6: the pod resolves its gateway again (neighbour discovery stays with the kernel),
    // then connects through the IPv6 ClusterIP.
    lab::sh(&client.ns, "ip -6 neigh flush dev eth0");
    let v6 = Ipv6Addr::new(0xfd00, 0x30, 0, 0, 0, 0, 0, 0xa);
    let a = tcp(&client.ns, sa(v6, 80), T, 1000).expect("IPv6 ClusterIP");
    assert_eq!(a.peer, IpAddr::from(client.ip6));
    // Routed directly too: the node's conntrack (which prints IPv6 addresses in full) has no
    // entry for it.
    let full: Vec<String> = web
        .ip6
        .segments()
        .iter()
        .map(|g| format!("{g:04x}"))
        .collect();
    let to_web6 = format!("dst={} ", full.join(":"));
    let kernel_ct = lab::sh(&node, "cat /proc/net/nf_conntrack 2>/dev/null || true");
    let seen: Vec<&str> = (kernel_ct.lines())
        .filter(|l| l.contains(" tcp ") && l.contains(&to_web6))
        .collect();
    assert!(seen.is_empty(), "the node's conntrack saw {seen:?}");

    // A Service without endpoints: kxdp's RST, written into the tap, refuses at once.
    let t0 = Instant::now();
    let e = tcp(&client.ns, sa([172, 30, 0, 13], 80), T, 0).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(metric(&node, "kxdp_verdicts_total{reason=\"no-endpoints\"}") >= 1);

    // An endpoint on node-b: the connection leaves node-a routed directly out of the uplink,
    // and node-b's answers come back on the uplink.
    let remote = lab.pod("remote-b1").ip4;
    let a = tcp(&client.ns, sa([172, 30, 0, 11], 80), T, 10_000).expect("remote endpoint");
    assert_eq!(a.peer, IpAddr::from(client.ip4));
    assert_eq!(a.server, "remote-b1", "({remote})");
    // Short connections to it: what node-b sends back arrives on the uplink, where the XDP
    // program hands the flows on the fast path to the kernel and the tc program beside it
    // carries them.
    short_connections_on_the_fast_path(&node, &client.ns, [172, 30, 0, 11], "remote-b1", &k);
    // A takeover: the successor keeps the uplink's XDP program, which reads the fast path's
    // map, so it is handed that map (emptied) and re-attaches the uplink's redirect over it;
    // connections across nodes go on the fast path from their SYN again.
    let mut old = k;
    k = lab.start_kxdp_takeover("node-a", &config, &objects, &takeover);
    assert!(k.log().contains("took over from pid"), "{}", k.log());
    assert!(
        lab::wait_until(Duration::from_secs(10), || {
            old.kxdp.child.try_wait().is_ok_and(|s| s.is_some())
        }),
        "the predecessor exits after the handover:\n{}",
        old.log()
    );
    let tc = lab::sh(&node, "tc filter show dev eth0 ingress");
    assert!(tc.contains("kxdp-tap tag"), "eth0 after the takeover: {tc}");
    short_connections_on_the_fast_path(&node, &client.ns, [172, 30, 0, 11], "remote-b1", &k);

    // A NodePort from outside the cluster whose endpoint is a pod on node-a: the request comes
    // in on the uplink (AF_XDP), masqueraded, and reaches the pod through the kernel port; the
    // reply comes back through the tap with the node's address as its source after the un-NAT,
    // which the kernel takes from the tap only with accept_local.
    let node_a = lab.node("node-a").ip4;
    let a = tcp(&lab.ext, sa(node_a, 30081), T, 1000).unwrap_or_else(|e| {
        let m = lab::sh(&node, "curl -s http://127.0.0.1:10249/metrics | grep -E 'verdicts_total|drops_total' | grep -v ' 0$' || true");
        let np = lab::sh(&lab.pod("np-a1").ns, "nstat -az | grep -E '^Tcp' || true");
        panic!("NodePort from outside: {e}\nnode-a:\n{m}\nnp-a1:\n{np}\n{}", k.log())
    });
    assert_eq!(a.server, "np-a1");
    assert_eq!(a.peer, IpAddr::from(node_a), "masqueraded");

    // Source validation on the tap path: other-a with client-a's address does not reach
    // web-a1 (admits clients only); client-a's own crafted packets do.
    let mut probes = Vec::new();
    let mut sport = 42000;
    for v6 in [false, true] {
        for tcp in [true, false] {
            for (from, as_) in [(client, client), (other, client)] {
                sport += 1;
                probes.push(spoof::Probe {
                    ns: from.ns.clone(),
                    src: as_.ip(v6),
                    dst: web.ip(v6),
                    sport,
                    tcp,
                });
            }
        }
    }
    let before = spoof::spoofed_drops(&node);
    let seen = spoof::observe(&web.ns, &probes);
    for (p, s) in probes.iter().zip(&seen) {
        let own = p.ns == client.ns;
        assert_eq!(
            *s,
            own,
            "{} as {} (TCP {}): arrived {s}\n{}",
            p.ns,
            p.src,
            p.tcp,
            k.log()
        );
    }
    // Each spoofed probe is sent twice.
    assert_eq!(spoof::spoofed_drops(&node) - before, 2 * 4, "{}", k.log());

    // A clean stop gives the pods back to the kernel: no redirect, no tap.
    let st = k.kxdp.stop();
    assert!(st.is_some_and(|s| s.success()), "{}", k.log());
    for dev in [&client.host_if, &web.host_if, "eth0"] {
        let tc = lab::sh(&node, &format!("tc filter show dev {dev} ingress"));
        assert!(!tc.contains(TAP) && !tc.contains("kxdp-tap"), "{dev}: {tc}");
    }
    assert!(!lab::ip(&node, "link show").contains(TAP));
    let a = tcp(&client.ns, sa(web.ip4, TCP_PORT), T, 0).expect("pod to pod via the kernel");
    assert_eq!(a.peer, IpAddr::from(client.ip4));
}

/// The uplink through the tap as well (the default `podInterception` on both nodes, whose
/// uplink is a veth: `everyVeth`): no XDP anywhere, so the nodes exchange GSO super-frames; bulk TCP through a
/// ClusterIP whose endpoint is on node-b completes on both nodes' fast paths without a
/// checksum error; the node's own traffic stays with the kernel (never in the tap: no
/// `to-node` verdict), a NodePort from outside is kxdp's; a clean stop gives the uplink back.
#[test]
fn tap_mode_with_the_uplink() {
    require_lab_and_iperf3("tap_mode_with_the_uplink");
    let mut lab = Lab::build("lab_tapup");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-b", "remote-b1", &[("app", "remote")]);
    lab.add_pod("node-a", "np-a1", &[("app", "np")]);
    lab.warm_neighbours();
    let (client, remote) = (lab.pod("client-a"), lab.pod("remote-b1"));
    let _iperf3 = Iperf3Server::start(&remote.ns, IPERF_PORT);
    let objects = lab.service("remote", 11, "remote", None, false)
        + &iperf_service(&lab, "remote")
        + &lab.service("np", 14, "np", Some(30081), false);
    let config = |n: &str| {
        lab.kxdp_config(n, false).replace(
            "metricsBindAddress: \"\"",
            "metricsBindAddress: 127.0.0.1:10249",
        )
    };
    let mut ka = lab.start_kxdp("node-a", &config("node-a"), &objects);
    let kb = lab.start_kxdp("node-b", &config("node-b"), &objects);
    let (node_a, node_b) = (lab.node("node-a").ns.clone(), lab.node("node-b").ns.clone());
    for (ns, k) in [(&node_a, &ka), (&node_b, &kb)] {
        assert_eq!(lab::xdp_on(ns, "eth0"), None, "{}", k.log());
        let tc = lab::sh(ns, "tc filter show dev eth0 ingress");
        assert!(tc.contains("kxdp-tap tag"), "{ns}: {tc}\n{}", k.log());
        // The other node's program left this uplink its segmentation offload.
        let features = lab::sh(ns, "ethtool -k eth0");
        assert!(
            features.contains("tcp-segmentation-offload: on"),
            "{ns}: {features}"
        );
    }

    // Bulk TCP to the endpoint on node-b.
    let bytes = iperf3_through(&client.ns, &remote.ns, "the nodes", || ka.log() + &kb.log());
    // Both nodes moved most of it on their fast paths: node-a the DNAT (client's veth) and
    // the un-NAT (uplink), node-b the connection as is (uplink and the server's veth).
    for (ns, k) in [(&node_a, &ka), (&node_b, &kb)] {
        let offloaded = metric(ns, "kxdp_offloaded_packets_total");
        eprintln!("{ns}: offloaded {offloaded} packets");
        assert!(
            offloaded as f64 * 1448.0 >= bytes * 0.5,
            "{ns}: {offloaded} packets offloaded for {bytes} bytes\n{}",
            k.log()
        );
    }

    // The node's own traffic stays with the kernel: connections from outside to a server in
    // node-a's namespace open and never reach kxdp.
    let a_ip = lab.node("node-a").ip4;
    let node_server = || {
        lab::sh(
            &lab.ext,
            &format!(
                "timeout 3 bash -c 'echo > /dev/tcp/{a_ip}/{NODE_PORT}' && echo open || echo closed"
            ),
        )
        .trim()
        .to_string()
    };
    let _node_server = Iperf3Server::start(&node_a, NODE_PORT);
    std::thread::sleep(Duration::from_millis(200));
    let before = metric(&node_a, "kxdp_verdicts_total{reason=\"to-node\"}");
    for _ in 0..3 {
        assert_eq!(node_server(), "open");
    }
    assert_eq!(
        metric(&node_a, "kxdp_verdicts_total{reason=\"to-node\"}"),
        before,
        "the node's own traffic reached kxdp"
    );

    // A NodePort from outside to a pod on node-a: through the tap, masqueraded.
    let a = tcp(&lab.ext, sa(a_ip, 30081), T, 1000).expect("NodePort");
    assert_eq!(a.server, "np-a1");
    assert_eq!(a.peer, IpAddr::from(a_ip), "masqueraded");
    // And a short connection to the remote endpoint, its first packets through both taps.
    let a = tcp(&client.ns, sa([172, 30, 0, 11], 80), T, 1000).expect("remote endpoint");
    assert_eq!(a.server, "remote-b1");

    // A clean stop gives the uplink back to the kernel.
    let st = ka.kxdp.stop();
    assert!(st.is_some_and(|s| s.success()), "{}", ka.log());
    let tc = lab::sh(&node_a, "tc filter show dev eth0 ingress");
    assert!(!tc.contains("kxdp-tap"), "{tc}");
    assert_eq!(node_server(), "open");
}

/// A change of `podInterception.mode` across a restart (the XDP programs held for it, with a
/// conntrack state file) and across takeovers, both ways: each pod's veth, and the veth uplink
/// (`everyVeth`), ends intercepted as the running kxdp is configured (its XDP program, or the redirect with no XDP program left
/// and the pod's TSO back on), and connections through a ClusterIP keep working.
#[test]
fn interception_changes_across_restarts_and_takeovers() {
    require_lab_and_iperf3("interception_changes_across_restarts_and_takeovers");
    let mut lab = Lab::build("lab_tapmode");
    lab.add_pod("node-a", "client-a", &[("app", "client")]);
    lab.add_pod("node-a", "web-a1", &[("app", "web")]);
    lab.warm_neighbours();
    let node = lab.node("node-a").ns.clone();
    let (client, web) = (lab.pod("client-a"), lab.pod("web-a1"));
    let objects = lab.service("web", 10, "web", None, false);
    let state_file = lab.dir.path().join("conntrack.state");
    let tap = (lab.kxdp_config("node-a", false))
        .replace(
            "conntrack: {stateFile: \"\"}",
            &format!("conntrack: {{stateFile: \"{}\"}}", state_file.display()),
        )
        .replace(
            "metricsBindAddress: \"\"",
            "metricsBindAddress: 127.0.0.1:10249",
        );
    assert!(
        tap.contains("conntrack.state"),
        "the lab's conntrack line moved"
    );
    let xdp = tap.clone() + "podInterception: {mode: xdp}\n";
    let takeover = lab.dir.path().join("takeover.sock");
    let check = |k: &cni::KxdpNode, on_xdp: bool, step: &str| {
        for veth in [client.host_if.as_str(), web.host_if.as_str(), "eth0"] {
            let settled = lab::wait_until(Duration::from_secs(5), || {
                let tc = lab::sh(&node, &format!("tc filter show dev {veth} ingress"));
                lab::xdp_on(&node, veth).is_some() == on_xdp && tc.contains("kxdp-tap") != on_xdp
            });
            let tc = lab::sh(&node, &format!("tc filter show dev {veth} ingress"));
            let xdp = lab::xdp_on(&node, veth);
            assert!(settled, "{step}: {veth}: XDP {xdp:?}, tc {tc}\n{}", k.log());
        }
        let tso = if on_xdp { "off" } else { "on" };
        assert_eq!(
            offload(&client.ns, "tcp-segmentation-offload"),
            tso,
            "{step}"
        );
        for _ in 0..3 {
            let a = tcp(&client.ns, sa([172, 30, 0, 10], 80), T, 100).unwrap_or_else(|e| {
                let m = lab::sh(&node, "curl -s http://127.0.0.1:10249/metrics | grep -E '_total' | grep -v ' 0$' || true");
                panic!("{step}: {e}\n{m}\n{}", k.log())
            });
            assert_eq!(a.server, "web-a1", "{step}");
        }
    };
    let mut k = lab.start_kxdp_takeover("node-a", &xdp, &objects, &takeover);
    check(&k, true, "mode xdp");
    // A restart into the default (the tap): the programs held for it go once the redirects
    // are in place.
    k.kxdp.stop();
    assert!(
        lab::xdp_on(&node, &web.host_if).is_some(),
        "held for the restart"
    );
    k = lab.start_kxdp_takeover("node-a", &tap, &objects, &takeover);
    check(&k, false, "a restart into mode tap");
    for (config, on_xdp, step) in [
        (&xdp, true, "a takeover into mode xdp"),
        (&tap, false, "a takeover into mode tap"),
    ] {
        let mut old = k;
        k = lab.start_kxdp_takeover("node-a", config, &objects, &takeover);
        assert!(
            k.log().contains("took over from pid"),
            "{step}: {}",
            k.log()
        );
        assert!(
            lab::wait_until(Duration::from_secs(10), || {
                old.kxdp.child.try_wait().is_ok_and(|s| s.is_some())
            }),
            "{step}: the predecessor exits after the handover:\n{}",
            old.log()
        );
        check(&k, on_xdp, step);
    }
}
