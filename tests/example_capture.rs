//! The shipped example: `pcaps/example.pcap`, a short capture on node-a of the example cluster
//! (`examples/cluster`, `examples/config.yaml`), and `pcaps/example.verdicts.jsonl`, what the
//! README's main command prints for it with `--seed 0 --workers 1`.
//!
//! The capture is generated here (`example_capture`), from a story: one or a few flows per Service
//! and per rule that decides a packet's fate, each packet with the verdict Kubernetes' semantics
//! call for (`Want`). The tests check that the committed capture is what the generator makes, and
//! that replaying it gives the golden verdicts and the story's.
//!
//! Regenerate both files after changing the story (or after an intended change of verdicts):
//! `KXDP_REGENERATE=1 cargo test --test example_capture`, then review the diff of the golden file.
//!
//! Replies are written only where the backend is known in advance: a Service with one eligible
//! endpoint for that client (gateway's; frontend's NodePort under externalTrafficPolicy Local from
//! outside). Where several endpoints are eligible the seeded choice decides, so the story accepts
//! any eligible one and only the golden file records which one seed 0 picked.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use kxdp_packet::{LinkType, Parsed};
use serde_json::Value;
use support::flags::{ACK, FIN, PSH, SYN};
use support::{arp, read_verdicts, tcp, udp, vip, T0_NS};

const PCAP: &str = "pcaps/example.pcap";
const GOLDEN: &str = "pcaps/example.verdicts.jsonl";
const README: &str = "pcaps/README.md";
/// Capture time between two packets.
const GAP_NS: u64 = 1_000_000;

// ---- the example cluster (examples/cluster), as node-a sees it ------------------------------

const NODE: &str = "192.168.0.2";
const NODE6: &str = "fd00:1::2";
// Pods on node-a.
const WEB_1: &str = "10.0.1.10";
const FRONTEND_1: &str = "10.0.1.20";
const API_1_6: &str = "fd00:0:0:1::30";
const PROMETHEUS_1: &str = "10.0.1.60";
// Pods on node-b (their traffic to Services is node-b's business; here they are backends and
// peers).
const FRONTEND_2: &str = "10.0.2.20";
const WEB_2: &str = "10.0.2.10";
const GATEWAY_1: &str = "10.0.2.40";
// Service addresses.
const WEB_VIP: &str = "172.30.0.10";
const API_VIP: &str = "172.30.0.30";
const API_VIP6: &str = "fd00:30::30";
const GATEWAY_VIP: &str = "172.30.0.40";
const GATEWAY_LB: &str = "192.0.2.10";
const CART_VIP: &str = "172.30.0.50";
const GRAFANA_VIP: &str = "172.30.0.60";
// Outside the cluster: two clients inside gateway's loadBalancerSourceRanges (203.0.113.0/24,
// 198.51.100.0/24) and one outside them.
const CUSTOMER: &str = "203.0.113.7";
const PARTNER: &str = "198.51.100.23";
const STRANGER: &str = "192.0.2.200";
const CUSTOMER6: &str = "2001:db8::7";

/// `ip:port`, IPv6 in brackets (as verdicts write it).
fn at(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

// ---- the story -------------------------------------------------------------------------------

/// The verdict a packet should get.
#[derive(Clone, Debug)]
enum Want {
    /// Forwarded as these addresses (fully determined by the state: no endpoint choice).
    Forward {
        reason: &'static str,
        src: String,
        dst: String,
        masq: bool,
    },
    /// A new connection from a pod to a Service port with several eligible endpoints: any of
    /// `to`, chosen by the seeded RNG. The pod keeps its address unless it is the chosen endpoint
    /// itself (hairpin: masqueraded to the node). Packets with the same `sticky` key
    /// (sessionAffinity ClientIP) must all reach the same endpoint.
    Balanced {
        to: Vec<String>,
        sticky: Option<&'static str>,
    },
    /// Answered by the dataplane (TCP RST, or ICMP port unreachable: no ports in `reply`).
    Reject {
        reason: &'static str,
        reply_src: String,
        reply_dst: String,
    },
    Drop(&'static str),
    Pass(&'static str),
}

impl Want {
    fn action(&self) -> &'static str {
        match self {
            Want::Forward { .. } | Want::Balanced { .. } => "forward",
            Want::Reject { .. } => "reject",
            Want::Drop(_) => "drop",
            Want::Pass(_) => "pass",
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Want::Forward { reason, .. } | Want::Reject { reason, .. } => reason,
            Want::Balanced { .. } => "service-dnat",
            Want::Drop(r) | Want::Pass(r) => r,
        }
    }

    /// Whether the whole verdict line follows from the state (no random endpoint choice).
    fn deterministic(&self) -> bool {
        !matches!(self, Want::Balanced { .. })
    }
}

fn fwd(reason: &'static str, src: &str, dst: &str, masq: bool) -> Want {
    Want::Forward {
        reason,
        src: src.to_string(),
        dst: dst.to_string(),
        masq,
    }
}

fn balanced(to: &[String], sticky: Option<&'static str>) -> Want {
    Want::Balanced {
        to: to.to_vec(),
        sticky,
    }
}

fn reject(reason: &'static str, reply_src: &str, reply_dst: &str) -> Want {
    Want::Reject {
        reason,
        reply_src: reply_src.to_string(),
        reply_dst: reply_dst.to_string(),
    }
}

/// One packet of the story.
struct Step {
    frame: Vec<u8>,
    /// The section of the story (pcaps/README.md has one table row per section).
    section: &'static str,
    /// What this packet is, for failure messages.
    note: String,
    /// (proto, orig_src, orig_dst) as the verdict must name them; None for frames that are not
    /// parsed as IP.
    orig: Option<(&'static str, String, String)>,
    /// The Service port the verdict must name (`namespace/name:port`), if any.
    service: Option<&'static str>,
    want: Want,
}

#[derive(Default)]
struct Story {
    steps: Vec<Step>,
    section: &'static str,
    service: Option<&'static str>,
}

impl Story {
    /// Starts a section; `service` is the Service port its packets concern (None: none).
    fn section(&mut self, title: &'static str, service: Option<&'static str>) {
        self.section = title;
        self.service = service;
    }

    fn tcp(&mut self, note: &str, src: &str, dst: &str, seg: Seg, want: Want) {
        let Seg(fl, seq, ack, payload) = seg;
        let frame = tcp(src, dst, fl, seq, ack, payload);
        self.push_ip(note, "TCP", src, dst, frame, want);
    }

    /// A SYN (sequence number 1000).
    fn syn(&mut self, note: &str, src: &str, dst: &str, want: Want) {
        self.tcp(note, src, dst, Seg(SYN, 1_000, 0, b""), want);
    }

    fn udp(&mut self, note: &str, src: &str, dst: &str, payload: &[u8], want: Want) {
        self.push_ip(note, "UDP", src, dst, udp(src, dst, payload), want);
    }

    fn push_ip(
        &mut self,
        note: &str,
        proto: &'static str,
        src: &str,
        dst: &str,
        frame: Vec<u8>,
        want: Want,
    ) {
        let service = match want {
            // Traffic that no Service port claims names none.
            Want::Forward {
                reason: "direct", ..
            }
            | Want::Pass(_)
            | Want::Drop("service-ip-unallocated")
            | Want::Reject {
                reason: "service-port-unknown",
                ..
            } => None,
            _ => self.service,
        };
        self.steps.push(Step {
            frame,
            section: self.section,
            note: note.to_string(),
            orig: Some((proto, src.to_string(), dst.to_string())),
            service,
            want,
        });
    }

    fn raw(&mut self, note: &str, frame: Vec<u8>, want: Want) {
        self.steps.push(Step {
            frame,
            section: self.section,
            note: note.to_string(),
            orig: None,
            service: None,
            want,
        });
    }
}

/// A TCP segment: flags, sequence number, acknowledgment number, payload.
#[derive(Clone, Copy)]
struct Seg<'a>(u8, u32, u32, &'a [u8]);

/// A TCP connection through a Service frontend whose backend is known in advance (one eligible
/// endpoint).
struct Conn<'a> {
    /// The client, as it sends.
    client: &'a str,
    /// What the client addresses.
    front: &'a str,
    /// The endpoint the connection is translated to.
    back: &'a str,
    /// The client as the endpoint sees it: itself, or the node when masqueraded.
    client_out: &'a str,
    masq: bool,
}

/// A conversation: handshake, one request and its response, and (with `teardown`) both FINs
/// and the last ACK. The client's packets are translated to the endpoint, the endpoint's back.
fn conversation(s: &mut Story, c: &Conn, request: &[u8], response: &[u8], teardown: bool) {
    let (c0, s0) = (100_000u32, 500_000u32);
    let (c1, s1) = (
        c0 + 1 + request.len() as u32,
        s0 + 1 + response.len() as u32,
    );
    let (client, front, back, out) = (c.client, c.front, c.back, c.client_out);
    let there = |reason| fwd(reason, out, back, c.masq);
    let back_here = || fwd("reply-unnat", front, client, c.masq);
    let est = "ct-established";
    s.tcp(
        "SYN",
        client,
        front,
        Seg(SYN, c0, 0, b""),
        there("service-dnat"),
    );
    s.tcp(
        "SYN-ACK",
        back,
        out,
        Seg(SYN | ACK, s0, c0 + 1, b""),
        back_here(),
    );
    s.tcp(
        "ACK",
        client,
        front,
        Seg(ACK, c0 + 1, s0 + 1, b""),
        there(est),
    );
    let req = Seg(PSH | ACK, c0 + 1, s0 + 1, request);
    s.tcp("request", client, front, req, there(est));
    let resp = Seg(PSH | ACK, s0 + 1, c1, response);
    s.tcp("response", back, out, resp, back_here());
    if teardown {
        s.tcp(
            "FIN",
            client,
            front,
            Seg(FIN | ACK, c1, s1, b""),
            there(est),
        );
        s.tcp(
            "FIN",
            back,
            out,
            Seg(FIN | ACK, s1, c1 + 1, b""),
            back_here(),
        );
        let last = Seg(ACK, c1 + 1, s1 + 1, b"");
        s.tcp("last ACK", client, front, last, there(est));
    }
}

/// A DNS query (RFC 1035) for `name`, type A (1) or AAAA (28).
fn dns_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::new();
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // RD; one question
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes()); // IN
    q
}

const HTTP_GET: &[u8] = b"GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n";
const HTTP_OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
// TLS is opaque here: a record header and a few bytes stand for the hello and its answer.
const TLS_HELLO: &[u8] = b"\x16\x03\x01\x00\x0bclienthello";
const TLS_ANSWER: &[u8] = b"\x16\x03\x03\x00\x0bserverhello";

fn story() -> Vec<Step> {
    let mut s = Story::default();
    let web_eps = [at(WEB_1, 8080), at(WEB_2, 8080)];
    let cart_eps = [at("10.0.1.50", 8080), at("10.0.2.50", 8080)];

    s.section(
        "ClusterIP from a pod, whole TCP connection (gateway: one endpoint)",
        Some("shop/gateway:https"),
    );
    let client = at(FRONTEND_1, 41000);
    let conn = Conn {
        client: &client,
        front: &at(GATEWAY_VIP, 443),
        back: &at(GATEWAY_1, 8443),
        client_out: &client,
        masq: false,
    };
    conversation(&mut s, &conn, TLS_HELLO, TLS_ANSWER, true);

    s.section(
        "ClusterIP with two ready endpoints and a terminating one (web)",
        Some("shop/web:http"),
    );
    for port in 41010..41013 {
        s.syn(
            "new connection, web-3 (terminating) is never chosen",
            &at(FRONTEND_1, port),
            &at(WEB_VIP, 80),
            balanced(&web_eps, None),
        );
    }

    s.section("session affinity ClientIP (cart)", Some("shop/cart:http"));
    for port in 42000..42003 {
        s.syn(
            "web-1 keeps its endpoint",
            &at(WEB_1, port),
            &at(CART_VIP, 80),
            balanced(&cart_eps, Some("web-1")),
        );
    }
    for port in 41040..41042 {
        s.syn(
            "frontend-1 keeps its own endpoint",
            &at(FRONTEND_1, port),
            &at(CART_VIP, 80),
            balanced(&cart_eps, Some("frontend-1")),
        );
    }

    s.section(
        "dual-stack Service over IPv6 and IPv4, TCP and UDP (api)",
        Some("shop/api:grpc"),
    );
    // api-1 may be given itself (hairpin): then it is masqueraded to the node.
    s.syn(
        "IPv6 gRPC connection",
        &at(API_1_6, 43000),
        &at(API_VIP6, 9000),
        balanced(&[at(API_1_6, 9000), at("fd00:0:0:2::30", 9000)], None),
    );
    s.service = Some("shop/api:dns");
    s.udp(
        "IPv6 DNS query (53 → 5353)",
        &at(API_1_6, 43001),
        &at(API_VIP6, 53),
        &dns_query(0x6001, "cart.shop.svc.cluster.local", 28),
        balanced(&[at(API_1_6, 5353), at("fd00:0:0:2::30", 5353)], None),
    );
    s.service = Some("shop/api:grpc");
    s.syn(
        "IPv4 gRPC connection: IPv4 endpoints only",
        &at(FRONTEND_1, 41050),
        &at(API_VIP, 9000),
        balanced(&[at("10.0.1.30", 9000), at("10.0.2.30", 9000)], None),
    );
    s.service = Some("shop/api:dns");
    s.udp(
        "IPv4 DNS query",
        &at(FRONTEND_1, 41051),
        &at(API_VIP, 53),
        &dns_query(0x4001, "cart.shop.svc.cluster.local", 1),
        balanced(&[at("10.0.1.30", 5353), at("10.0.2.30", 5353)], None),
    );
    s.syn(
        "TCP to port 53, which api serves over UDP only",
        &at(FRONTEND_1, 41052),
        &at(API_VIP, 53),
        reject(
            "service-port-unknown",
            &at(API_VIP, 53),
            &at(FRONTEND_1, 41052),
        ),
    );

    s.section(
        "NodePort, externalTrafficPolicy Local (frontend)",
        Some("shop/frontend:http"),
    );
    // From outside: only the local endpoint (frontend-1), the client's address kept.
    let (customer, node_port) = (at(CUSTOMER, 50000), at(NODE, 30080));
    let conn = Conn {
        client: &customer,
        front: &node_port,
        back: &at(FRONTEND_1, 8080),
        client_out: &customer,
        masq: false,
    };
    conversation(&mut s, &conn, HTTP_GET, HTTP_OK, false);
    s.syn(
        "from a pod: both endpoints, not masqueraded",
        &at(WEB_1, 42100),
        &node_port,
        balanced(&[at(FRONTEND_1, 8080), at(FRONTEND_2, 8080)], None),
    );

    s.section(
        "LoadBalancer with loadBalancerSourceRanges (gateway)",
        Some("shop/gateway:https"),
    );
    // externalTrafficPolicy Cluster: masqueraded to the node (the port is kept while free).
    let conn = Conn {
        client: &at(CUSTOMER, 50100),
        front: &at(GATEWAY_LB, 443),
        back: &at(GATEWAY_1, 8443),
        client_out: &at(NODE, 50100),
        masq: true,
    };
    conversation(&mut s, &conn, TLS_HELLO, TLS_ANSWER, false);
    s.syn(
        "client in the other allowed range",
        &at(PARTNER, 51000),
        &at(GATEWAY_LB, 443),
        fwd("service-dnat", &at(NODE, 51000), &at(GATEWAY_1, 8443), true),
    );
    s.syn(
        "client outside the ranges",
        &at(STRANGER, 52000),
        &at(GATEWAY_LB, 443),
        Want::Drop("source-range"),
    );
    s.syn(
        "same client on the NodePort: source ranges filter only the load balancer IP",
        &at(STRANGER, 52001),
        &at(NODE, 30443),
        fwd("service-dnat", &at(NODE, 52001), &at(GATEWAY_1, 8443), true),
    );

    s.section(
        "Service without endpoints (grafana)",
        Some("monitoring/grafana:http"),
    );
    s.syn(
        "TCP: answered with a RST",
        &at(PROMETHEUS_1, 44000),
        &at(GRAFANA_VIP, 3000),
        reject(
            "no-endpoints",
            &at(GRAFANA_VIP, 3000),
            &at(PROMETHEUS_1, 44000),
        ),
    );
    s.udp(
        "UDP to the same port: grafana has no UDP port, ICMP port unreachable",
        &at(PROMETHEUS_1, 44001),
        &at(GRAFANA_VIP, 3000),
        b"udp probe",
        reject("service-port-unknown", GRAFANA_VIP, PROMETHEUS_1),
    );

    s.section("unknown port on a ClusterIP", None);
    s.syn(
        "web's target port on its ClusterIP",
        &at(FRONTEND_1, 41060),
        &at(WEB_VIP, 8080),
        reject(
            "service-port-unknown",
            &at(WEB_VIP, 8080),
            &at(FRONTEND_1, 41060),
        ),
    );

    s.section("service CIDR address no Service owns", None);
    s.syn(
        "IPv4",
        &at(FRONTEND_1, 41070),
        &at("172.30.0.99", 80),
        Want::Drop("service-ip-unallocated"),
    );
    s.syn(
        "IPv6",
        &at(API_1_6, 43010),
        &at("fd00:30::99", 9000),
        Want::Drop("service-ip-unallocated"),
    );

    s.section("traffic to the node itself", None);
    s.syn(
        "SSH",
        &at(CUSTOMER, 50200),
        &at(NODE, 22),
        Want::Pass("to-node"),
    );
    s.syn(
        "load balancer health check on frontend's healthCheckNodePort",
        &at(PARTNER, 53000),
        &at(NODE, 32000),
        Want::Pass("to-node"),
    );
    s.syn(
        "frontend's NodePort on the node's IPv6 address: frontend is IPv4 only",
        &at(CUSTOMER6, 50300),
        &at(NODE6, 30080),
        Want::Pass("to-node"),
    );

    s.section("pod to pod, no Service", None);
    let (scraper, target) = (at(PROMETHEUS_1, 44100), at(WEB_2, 8080));
    s.syn(
        "prometheus-1 scrapes web-2",
        &scraper,
        &target,
        fwd("direct", &scraper, &target, false),
    );
    let (peer, prom) = (at(FRONTEND_2, 46000), at(PROMETHEUS_1, 9090));
    s.syn(
        "frontend-2 (node-b) to prometheus-1 through the headless Service's DNS answer",
        &peer,
        &prom,
        fwd("direct", &peer, &prom, false),
    );

    s.section("not IP, and malformed", None);
    s.raw("ARP who-has 192.168.0.2", arp(), Want::Pass("not-ip"));
    // A SYN cut in its TCP header (the IPv4 total length still claims the whole segment).
    let mut cut = tcp(&at(CUSTOMER, 50400), &at(NODE, 30080), SYN, 1_000, 0, b"");
    cut.truncate(14 + 20 + 10);
    s.raw("truncated TCP header", cut, Want::Drop("malformed"));

    s.steps
}

/// The capture: the story's frames, 1 ms apart from 2024-01-01T00:00:00Z.
fn example_capture() -> Vec<(u64, Vec<u8>)> {
    story()
        .into_iter()
        .enumerate()
        .map(|(i, s)| (T0_NS + i as u64 * GAP_NS, s.frame))
        .collect()
}

/// The capture as pcap file bytes.
fn pcap_bytes(packets: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut w = kxdp_packet::pcap::Writer::new(Vec::new(), LinkType::Ethernet).unwrap();
    for (ts, data) in packets {
        w.write(*ts, data).unwrap();
    }
    w.finish().unwrap()
}

// ---- running the README's main command ---------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README's main command, with the verdicts written to `verdicts`, the seed made explicit and
/// `extra` arguments: `kxdp replay --config examples/config.yaml --state examples/cluster --pcap
/// pcaps/example.pcap --verdicts <verdicts> --seed 0 <extra>`, run from the repository root.
fn replay_example(verdicts: &Path, extra: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_kxdp"))
        .current_dir(root())
        .args(["replay", "--config", "examples/config.yaml"])
        .args(["--state", "examples/cluster", "--pcap", PCAP])
        .arg("--verdicts")
        .arg(verdicts)
        .args(["--seed", "0"])
        .args(extra)
        .output()
        .expect("run kxdp");
    assert!(
        out.status.success(),
        "kxdp replay failed ({:?})\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    read_verdicts(verdicts)
}

/// The golden file is made with one worker: a replay with several workers does not yet keep the
/// capture's order between packets steered to different workers (see `readme_command_as_is`).
const GOLDEN_ARGS: &[&str] = &["--workers", "1"];

/// With `KXDP_REGENERATE=1`: writes the capture, then the golden verdicts from a replay of it.
/// Once per test process, before either test reads the files.
fn regenerate_if_asked() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var("KXDP_REGENERATE").as_deref() != Ok("1") {
            return;
        }
        std::fs::create_dir_all(root().join("pcaps")).unwrap();
        std::fs::write(root().join(PCAP), pcap_bytes(&example_capture())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("verdicts.jsonl");
        replay_example(&tmp, GOLDEN_ARGS);
        std::fs::copy(&tmp, root().join(GOLDEN)).unwrap();
        eprintln!("regenerated {PCAP} and {GOLDEN}: review the diff");
    });
}

// ---- checking verdicts against the story --------------------------------------------------

fn field<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v[k].as_str()
}

/// The node's address of the family of `addr` (what masquerading rewrites a source to).
fn node_of(addr: IpAddr) -> IpAddr {
    let n = if addr.is_ipv6() { NODE6 } else { NODE };
    n.parse().unwrap()
}

/// Checks `verdicts` (from `what`) against the story: action, reason, addresses as far as the
/// state determines them, Service names, affinity.
fn check_story(steps: &[Step], verdicts: &[Value], what: &str) {
    assert_eq!(
        verdicts.len(),
        steps.len(),
        "{what}: one verdict per packet"
    );
    let mut sticky: BTreeMap<&str, (usize, String)> = BTreeMap::new();
    for (i, (s, v)) in steps.iter().zip(verdicts).enumerate() {
        let ctx = format!("{what}, packet {i} ({}: {}): {v}", s.section, s.note);
        assert_eq!(v["index"].as_u64(), Some(i as u64), "{ctx}");
        assert_eq!(
            (field(v, "action"), field(v, "reason")),
            (Some(s.want.action()), Some(s.want.reason())),
            "{ctx}"
        );
        assert_eq!(field(v, "service"), s.service, "service; {ctx}");
        let Some((proto, osrc, odst)) = &s.orig else {
            assert!(v.get("src").is_none() && v.get("proto").is_none(), "{ctx}");
            continue;
        };
        assert_eq!(field(v, "proto"), Some(*proto), "{ctx}");
        assert_eq!(field(v, "orig_src"), Some(osrc.as_str()), "{ctx}");
        assert_eq!(field(v, "orig_dst"), Some(odst.as_str()), "{ctx}");
        let (src, dst) = (field(v, "src").unwrap(), field(v, "dst").unwrap());
        let masq = v["masq"].as_bool().unwrap();
        match &s.want {
            Want::Forward {
                src: ws,
                dst: wd,
                masq: wm,
                ..
            } => {
                assert_eq!((src, dst, masq), (ws.as_str(), wd.as_str(), *wm), "{ctx}");
            }
            Want::Balanced { to, sticky: key } => {
                assert!(to.iter().any(|t| t == dst), "endpoint not eligible; {ctx}");
                if vip(v, "dst") == vip(v, "orig_src") {
                    // Hairpin: the pod reaches itself through the Service.
                    assert!(masq, "hairpin must be masqueraded; {ctx}");
                    assert_eq!(vip(v, "src"), node_of(vip(v, "orig_src")), "{ctx}");
                } else {
                    assert_eq!((src, masq), (osrc.as_str(), false), "{ctx}");
                }
                if let Some(key) = key {
                    let (first, ep) = sticky.entry(key).or_insert((i, dst.to_string()));
                    assert_eq!(
                        dst, ep,
                        "{ctx}: affinity: packet {first} of the same client went to {ep}"
                    );
                }
            }
            Want::Reject {
                reply_src,
                reply_dst,
                ..
            } => {
                assert_eq!((src, dst), (osrc.as_str(), odst.as_str()), "{ctx}");
                assert_eq!(
                    (field(&v["reply"], "src"), field(&v["reply"], "dst")),
                    (Some(reply_src.as_str()), Some(reply_dst.as_str())),
                    "{ctx}"
                );
                assert!(!masq, "{ctx}");
            }
            Want::Drop(_) | Want::Pass(_) => {
                assert_eq!((src, dst), (osrc.as_str(), odst.as_str()), "{ctx}");
                assert!(!masq, "{ctx}");
            }
        }
        if !matches!(s.want, Want::Reject { .. }) {
            assert!(v.get("reply").is_none(), "{ctx}");
        }
    }
}

// ---- the tests ----------------------------------------------------------------------------

#[test]
fn example_capture_is_current() {
    regenerate_if_asked();
    let want = example_capture();

    // The story is what the README promises: 40-80 packets, 1 ms apart, every frame parsed as
    // intended.
    assert!((40..=80).contains(&want.len()), "{} packets", want.len());
    for w in want.windows(2) {
        assert_eq!(w[1].0 - w[0].0, GAP_NS);
    }
    for (i, s) in story().iter().enumerate() {
        let parsed = kxdp_packet::parse(&s.frame, LinkType::Ethernet);
        match s.want.reason() {
            "malformed" => assert!(parsed.is_err(), "packet {i}: {parsed:?}"),
            "not-ip" => assert_eq!(parsed, Ok(Parsed::NotIp), "packet {i}"),
            _ => assert!(
                matches!(parsed, Ok(Parsed::Ip(_))),
                "packet {i}: {parsed:?}"
            ),
        }
    }

    let path = root().join(PCAP);
    let hint = "regenerate: KXDP_REGENERATE=1 cargo test --test example_capture";
    let cap = kxdp_packet::pcap::read_file(&path).unwrap_or_else(|e| panic!("{e}; {hint}"));
    assert_eq!(cap.link, LinkType::Ethernet, "{hint}");
    assert_eq!(cap.packets.len(), want.len(), "packet count; {hint}");
    for (i, (p, (ts, data))) in cap.packets.iter().zip(&want).enumerate() {
        assert_eq!(p.ts_ns, *ts, "packet {i} timestamp; {hint}");
        assert_eq!(&p.data, data, "packet {i} bytes; {hint}");
    }
    // Byte for byte, headers included.
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes == pcap_bytes(&want),
        "{PCAP} file bytes differ; {hint}"
    );
}

/// Replays the example with `extra` arguments and compares with the golden file: action and
/// reason of every packet, and the whole line where the state determines it (no endpoint choice).
/// Both the golden file and the replay must tell the story.
fn check_replay_against_golden(extra: &[&str]) {
    regenerate_if_asked();
    let steps = story();
    let golden = read_verdicts(&root().join(GOLDEN));
    // The golden file itself must tell the story (it is not just whatever the code printed).
    check_story(&steps, &golden, GOLDEN);

    let dir = tempfile::tempdir().unwrap();
    let got = replay_example(&dir.path().join("verdicts.jsonl"), extra);
    check_story(&steps, &got, "replay");
    for (i, ((s, g), v)) in steps.iter().zip(&golden).zip(&got).enumerate() {
        let ctx = format!(
            "packet {i} ({}: {})\n golden: {g}\n replay: {v}",
            s.section, s.note
        );
        if s.want.deterministic() {
            assert_eq!(v, g, "{ctx}");
        } else {
            for k in [
                "index", "action", "reason", "proto", "orig_src", "orig_dst", "service",
            ] {
                assert_eq!(v[k], g[k], "{k}: {ctx}");
            }
        }
    }
}

#[test]
fn example_replay_matches_golden() {
    check_replay_against_golden(GOLDEN_ARGS);
}

/// Exactly the README's main command (workers from the config: 2), seed 0: the verdicts do not
/// depend on the worker count (replay steers each client's connections to one worker).
#[test]
fn readme_command_as_is() {
    check_replay_against_golden(&[]);
}

/// pcaps/README.md has a row for each section of the story, with its index range.
#[test]
fn readme_table_follows_the_story() {
    let readme = std::fs::read_to_string(root().join(README)).unwrap();
    let steps = story();
    let mut start = 0;
    while start < steps.len() {
        let section = steps[start].section;
        let end = start
            + steps[start..]
                .iter()
                .take_while(|s| s.section == section)
                .count();
        let range = if end - start == 1 {
            format!("| {start} |")
        } else {
            format!("| {start}-{} |", end - 1)
        };
        assert!(
            readme.lines().any(|l| l.starts_with(&range)),
            "{README}: no table row starting with {range:?} ({section})"
        );
        start = end;
    }
}
