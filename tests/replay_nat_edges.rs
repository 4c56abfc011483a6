//! Acceptance: NAT at the edges, packets in and packets out through the real
//! `kxdp replay` binary. ICMP/ICMPv6 errors about tracked connections, in both directions;
//! IPv4 fragments and IPv6 fragment headers; non-SYN TCP without a connection, RST/FIN and
//! TIME_WAIT reuse; stale UDP state across a published state update; an SCTP association.
//!
//! Every frame that leaves is re-parsed with etherparse and `kxdp_packet::verify::checksums`
//! (`support::decode`); quoted headers of ICMP errors and reassembled datagrams are checked the
//! same way. The rules are documented in docs/nat.md.

mod support;

use std::net::{IpAddr, SocketAddr};

use etherparse::{
    icmpv4, icmpv6, Icmpv4Type, Icmpv6Type, IpFragOffset, IpNumber, Ipv4Header, Ipv6FlowLabel,
    Ipv6Header, PacketBuilder, TcpHeader, UdpHeader,
};
use kxdp_packet::{IpProto, LinkType};
use serde_json::{json, Value};
use support::*;

// ---- the cluster -----------------------------------------------------------------------------

/// `web`: TCP, NodePort, dual-stack ClusterIP, port 80 → 8080, one endpoint per family.
const WEB_VIP: &str = "172.30.9.10";
const WEB_VIP6: &str = "fd00:172:30::910";
const WEB_NODE_PORT: u16 = 30910;
const WEB_EP: &str = "10.2.0.10";
const WEB_EP6: &str = "fd00:10:2::10";
const WEB_EP_NEW: &str = "10.3.0.10";
/// `dns`: UDP, dual-stack ClusterIP, port 53 → 5353.
const DNS_VIP: &str = "172.30.9.53";
const DNS_VIP6: &str = "fd00:172:30::953";
const DNS_EP: &str = "10.2.0.53";
const DNS_EP6: &str = "fd00:10:2::53";
/// `empty`: TCP ClusterIP without endpoints.
const EMPTY_VIP: &str = "172.30.9.20";
/// `stats`: UDP ClusterIP, port 8125 → 8125 (statsd), endpoints chosen per test.
const STATS_VIP: &str = "172.30.9.125";
const STATS_OLD: &str = "10.2.0.125";
const STATS_NEW: &str = "10.3.0.125";
/// `diameter`: SCTP ClusterIP, port 3868 → 3869 (the port changes: the CRC32c must be redone).
const SCTP_VIP: &str = "172.30.9.70";
const SCTP_EP: &str = "10.2.0.70";
/// A router between this node and the others (not a node, pod or Service address).
const ROUTER: &str = "192.168.0.1";
const ROUTER6: &str = "fd00:192::1";
/// A router on the external client's side.
const EXT_ROUTER: &str = "198.51.100.1";

fn node_of(addr: &str) -> &'static str {
    if addr.starts_with("10.2.") || addr.starts_with("fd00:10:2:") {
        NODE_B
    } else if addr.starts_with("10.3.") || addr.starts_with("fd00:10:3:") {
        NODE_C
    } else {
        NODE_A
    }
}

fn eps(addrs: &[&str]) -> Vec<Value> {
    addrs.iter().map(|a| endpoint(a, node_of(a))).collect()
}

fn web_service(eps4: &[&str], eps6: &[&str]) -> Vec<Value> {
    vec![
        service(
            "web",
            json!({
                "type": "NodePort",
                "clusterIP": WEB_VIP,
                "clusterIPs": [WEB_VIP, WEB_VIP6],
                "ipFamilies": ["IPv4", "IPv6"],
                "ipFamilyPolicy": "PreferDualStack",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080,
                           "nodePort": WEB_NODE_PORT}]
            }),
        ),
        endpoint_slice(
            "web",
            "web-v4",
            "IPv4",
            json!([sport("http", 8080, "TCP")]),
            eps(eps4),
        ),
        endpoint_slice(
            "web",
            "web-v6",
            "IPv6",
            json!([sport("http", 8080, "TCP")]),
            eps(eps6),
        ),
    ]
}

fn dns_service() -> Vec<Value> {
    vec![
        service(
            "dns",
            json!({
                "type": "ClusterIP",
                "clusterIP": DNS_VIP,
                "clusterIPs": [DNS_VIP, DNS_VIP6],
                "ipFamilies": ["IPv4", "IPv6"],
                "ipFamilyPolicy": "PreferDualStack",
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]
            }),
        ),
        endpoint_slice(
            "dns",
            "dns-v4",
            "IPv4",
            json!([sport("dns", 5353, "UDP")]),
            eps(&[DNS_EP]),
        ),
        endpoint_slice(
            "dns",
            "dns-v6",
            "IPv6",
            json!([sport("dns", 5353, "UDP")]),
            eps(&[DNS_EP6]),
        ),
    ]
}

/// `stats` with the given endpoint objects (empty: a Service without endpoints).
fn stats_service(endpoints: Vec<Value>) -> Vec<Value> {
    vec![
        service(
            "stats",
            json!({
                "type": "ClusterIP",
                "clusterIP": STATS_VIP,
                "clusterIPs": [STATS_VIP],
                "ports": [{"name": "statsd", "port": 8125, "protocol": "UDP", "targetPort": 8125}]
            }),
        ),
        endpoint_slice(
            "stats",
            "stats-abcde",
            "IPv4",
            json!([sport("statsd", 8125, "UDP")]),
            endpoints,
        ),
    ]
}

fn sctp_service() -> Vec<Value> {
    vec![
        service(
            "diameter",
            json!({
                "type": "ClusterIP",
                "clusterIP": SCTP_VIP,
                "clusterIPs": [SCTP_VIP],
                "ports": [{"name": "diameter", "port": 3868, "protocol": "SCTP", "targetPort": 3869}]
            }),
        ),
        endpoint_slice(
            "diameter",
            "diameter-abcde",
            "IPv4",
            json!([sport("diameter", 3869, "SCTP")]),
            eps(&[SCTP_EP]),
        ),
    ]
}

/// The cluster of most tests: `web`, `dns`, `empty` and `diameter`.
fn edges_env() -> Env {
    let mut env = Env::new();
    env.add_all(web_service(&[WEB_EP], &[WEB_EP6]))
        .add_all(dns_service())
        .add_all(simple_service("empty", EMPTY_VIP, 80, 8080, &[]))
        .add_all(sctp_service());
    env
}

fn node_front() -> String {
    format!("{NODE_A_IP}:{WEB_NODE_PORT}")
}

// ---- packet helpers --------------------------------------------------------------------------

fn v4(s: &str) -> [u8; 4] {
    match ip(s) {
        IpAddr::V4(a) => a.octets(),
        _ => panic!("{s} is not IPv4"),
    }
}

fn v6(s: &str) -> [u8; 16] {
    match ip(s) {
        IpAddr::V6(a) => a.octets(),
        _ => panic!("{s} is not IPv6"),
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn eth_header(ethertype: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(1514);
    v.extend_from_slice(&NODE_MAC);
    v.extend_from_slice(&CLIENT_MAC);
    v.extend_from_slice(&ethertype.to_be_bytes());
    v
}

/// Sets Don't Fragment on an IPv4 frame built by the support helpers (header checksum redone).
fn with_df(mut frame: Vec<u8>) -> Vec<u8> {
    let (mut h, _) = Ipv4Header::from_slice(&frame[14..]).unwrap();
    h.dont_fragment = true;
    h.header_checksum = h.calc_header_checksum();
    let bytes = h.to_bytes();
    frame[14..14 + bytes.len()].copy_from_slice(&bytes);
    frame
}

/// The first `max` bytes of the IP packet in `frame`: what an ICMP error quotes.
fn quote_of(frame: &[u8], max: usize) -> Vec<u8> {
    let p = ip_part(frame);
    p[..p.len().min(max)].to_vec()
}

/// An ICMP error from `src` to `dst` quoting `quote` (etherparse computes the checksum).
fn icmp4_error(src: &str, dst: &str, ty: Icmpv4Type, quote: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC)
        .ipv4(v4(src), v4(dst), 64)
        .icmpv4(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

fn icmp6_error(src: &str, dst: &str, ty: Icmpv6Type, quote: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC)
        .ipv6(v6(src), v6(dst), 64)
        .icmpv6(ty)
        .write(&mut v, quote)
        .unwrap();
    v
}

fn frag_needed(mtu: u16) -> Icmpv4Type {
    Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::FragmentationNeeded {
        next_hop_mtu: mtu,
    })
}

/// The ICMP/ICMPv6 header bytes 4..8 of an output frame (next-hop MTU, PTB MTU).
fn icmp_rest_of_header(frame: &[u8]) -> [u8; 4] {
    let m = meta(frame, LinkType::Ethernet);
    let l4 = m.l4_off as usize;
    frame[l4 + 4..l4 + 8].try_into().unwrap()
}

/// The packet quoted by an ICMP error, parsed independently of kxdp_packet.
#[derive(Debug)]
struct Quote {
    src: SocketAddr,
    dst: SocketAddr,
    proto: IpProto,
    /// The original packet's length as its quoted IP header gives it.
    orig_ip_len: usize,
    ident: u16,
    dont_fragment: bool,
    /// The quoted transport bytes (possibly truncated).
    l4: Vec<u8>,
}

/// Parses a quote; an IPv4 quoted header's checksum must verify.
#[track_caller]
fn parse_quote(q: &[u8]) -> Quote {
    let (src, dst, proto, orig_ip_len, ident, df, l4) = match q[0] >> 4 {
        4 => {
            let (h, rest) = Ipv4Header::from_slice(q).expect("quoted IPv4 header");
            assert_eq!(
                h.header_checksum,
                h.calc_header_checksum(),
                "quoted IPv4 header checksum"
            );
            (
                IpAddr::from(h.source),
                IpAddr::from(h.destination),
                h.protocol.0,
                h.total_len as usize,
                h.identification,
                h.dont_fragment,
                rest.to_vec(),
            )
        }
        6 => {
            let (h, rest) = Ipv6Header::from_slice(q).expect("quoted IPv6 header");
            (
                IpAddr::from(h.source),
                IpAddr::from(h.destination),
                h.next_header.0,
                40 + h.payload_length as usize,
                0,
                false,
                rest.to_vec(),
            )
        }
        v => panic!("quoted IP version {v}"),
    };
    assert!(l4.len() >= 4, "the quote names no ports: {q:?}");
    Quote {
        src: SocketAddr::new(src, be16(&l4, 0)),
        dst: SocketAddr::new(dst, be16(&l4, 2)),
        proto: IpProto(proto),
        orig_ip_len,
        ident,
        dont_fragment: df,
        l4,
    }
}

impl Quote {
    /// The quoted TCP/UDP checksum field, when the quote reaches it.
    fn l4_checksum(&self) -> Option<u16> {
        let at = match self.proto {
            IpProto::TCP => 16,
            IpProto::UDP => 6,
            _ => return None,
        };
        (self.l4.len() >= at + 2).then(|| be16(&self.l4, at))
    }

    /// The whole original segment is quoted: its TCP or UDP checksum verifies against the quoted
    /// addresses (etherparse's computation; an IPv4 UDP checksum of 0 means none).
    #[track_caller]
    fn assert_whole_l4_checksum(&self) {
        let hl = if self.src.is_ipv4() { 20 } else { 40 };
        assert_eq!(
            hl + self.l4.len(),
            self.orig_ip_len,
            "the whole segment is quoted"
        );
        let (s4, d4, s6, d6) = match (self.src.ip(), self.dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (s.octets(), d.octets(), None, None),
            (IpAddr::V6(s), IpAddr::V6(d)) => ([0; 4], [0; 4], Some(s.octets()), Some(d.octets())),
            _ => unreachable!(),
        };
        match self.proto {
            IpProto::TCP => {
                let (t, payload) = TcpHeader::from_slice(&self.l4).expect("quoted TCP header");
                let want = match (s6, d6) {
                    (Some(s), Some(d)) => t.calc_checksum_ipv6_raw(s, d, payload),
                    _ => t.calc_checksum_ipv4_raw(s4, d4, payload),
                }
                .unwrap();
                assert_eq!(t.checksum, want, "quoted TCP checksum");
            }
            IpProto::UDP => {
                let (u, payload) = UdpHeader::from_slice(&self.l4).expect("quoted UDP header");
                if u.checksum == 0 && s6.is_none() {
                    return;
                }
                let want = match (s6, d6) {
                    (Some(s), Some(d)) => u.calc_checksum_ipv6_raw(s, d, payload),
                    _ => u.calc_checksum_ipv4_raw(s4, d4, payload),
                }
                .unwrap();
                assert_eq!(u.checksum, want, "quoted UDP checksum");
            }
            p => panic!("quoted protocol {p}"),
        }
    }
}

/// The TCP checksum field of a frame built by the test.
fn tcp_checksum_of(frame: &[u8]) -> u16 {
    decode(frame, LinkType::Ethernet).tcp.unwrap().checksum
}

fn reason_count(s: &Value, reason: &str) -> u64 {
    s["reasons"][reason].as_u64().unwrap_or(0)
}

/// A TCP connection from `client` to `front` up to ESTABLISHED (SYN, the backend's SYN-ACK, ACK),
/// learnt by a first replay of the SYN. Returns the packets and the SYN as it left.
fn handshake(env: &Env, client: &str, front: &str) -> (Vec<Vec<u8>>, Decoded) {
    let first = syn(client, front);
    let r = env.replay(std::slice::from_ref(&first));
    r.expect(0, "forward", "service-dnat");
    let out = r.out(0);
    let pkts = vec![
        first,
        tcp_reply_to(&out, flags::SYN | flags::ACK, 5000, 1001),
        tcp(client, front, flags::ACK, 1001, 5001, b""),
    ];
    (pkts, out)
}

// ---- 1. ICMP and ICMPv6 errors -----------------------------------------------------------------

/// Path MTU discovery through a NodePort: an external client reaches a NodePort (masqueraded to the node
/// address), sends a large segment with DF, and the backend answers with "fragmentation needed".
/// The error must reach the client from the node address it talked to, quoting the packet as the
/// client sent it (client:port → nodeIP:nodePort), every checksum valid, the MTU untouched.
#[test]
fn icmp_frag_needed_from_backend_through_nodeport_reaches_client() {
    let env = edges_env();
    let client = "203.0.113.7:40000";
    let front = node_front();
    let (mut pkts, to_backend) = handshake(&env, client, &front);
    assert_eq!(
        to_backend.src,
        ip(NODE_A_IP),
        "NodePort traffic is masqueraded"
    );
    assert_eq!(to_backend.dst_sock(), sock(WEB_EP, 8080));
    let data = with_df(tcp(
        client,
        &front,
        flags::ACK | flags::PSH,
        1001,
        5001,
        &[0x5a; 1400],
    ));
    pkts.push(data.clone());
    let r = env.replay(&pkts);
    assert_eq!(
        r.reasons(),
        [
            "service-dnat",
            "reply-unnat",
            "ct-established",
            "ct-established"
        ]
    );
    let sent = r.by_index[3].clone().unwrap();
    let sent_d = r.out(3);
    assert_eq!(sent_d.dst_sock(), sock(WEB_EP, 8080));

    // As much of the packet as fits in 576 bytes (RFC 1812), and RFC 792's minimum: the IP header
    // and 8 bytes of the segment.
    pkts.push(icmp4_error(
        WEB_EP,
        NODE_A_IP,
        frag_needed(1200),
        &quote_of(&sent, 576 - 28),
    ));
    pkts.push(icmp4_error(
        WEB_EP,
        NODE_A_IP,
        frag_needed(1100),
        &quote_of(&sent, 28),
    ));
    let r = env.replay(&pkts);
    for (i, mtu) in [(4, 1200u16), (5, 1100)] {
        let v = r.expect(i, "forward", "icmp-related");
        assert!(masq(v), "{v}");
        let o = r.out(i); // outer IPv4 header and ICMP checksums verified here
        assert_eq!(
            o.icmp,
            Some((3, 4)),
            "packet {i}: still fragmentation needed"
        );
        assert_eq!(o.src, ip(NODE_A_IP), "packet {i}: from the node address");
        assert_eq!(o.dst, ip(EXTERNAL), "packet {i}: to the original client");
        let frame = r.by_index[i].as_ref().unwrap();
        assert_eq!(
            be16(&icmp_rest_of_header(frame), 2),
            mtu,
            "packet {i}: next-hop MTU kept"
        );
        let q = parse_quote(&o.payload); // quoted IPv4 header checksum verified here
        assert_eq!(q.proto, IpProto::TCP);
        assert_eq!(
            (q.src, q.dst),
            (sa(client), sa(&front)),
            "packet {i}: the quote is the packet as the client sent it"
        );
        assert_eq!(q.orig_ip_len, 1440, "packet {i}: quoted total length kept");
        assert!(q.dont_fragment, "packet {i}: quoted DF kept");
        assert_eq!(q.ident, be16(ip_part(&data), 4), "packet {i}: quoted IP id");
        assert_eq!(be32(&q.l4, 4), 1001, "packet {i}: quoted sequence number");
    }
    // The long quote reaches the TCP checksum: translated back to the client's own value.
    let q = parse_quote(&r.out(4).payload);
    assert_eq!(q.l4.len(), 576 - 28 - 20);
    assert_eq!(q.l4_checksum(), Some(tcp_checksum_of(&data)));
    // The short one does not: 8 bytes of TCP, ports and sequence number only.
    let q = parse_quote(&r.out(5).payload);
    assert_eq!(q.l4.len(), 8);
    assert_eq!(q.l4_checksum(), None);
    assert_eq!(
        ip_part(r.by_index[4].as_ref().unwrap()).len(),
        576,
        "the error keeps its length"
    );
}

/// The same for IPv6: a packet-too-big about a pod's connection to an IPv6 ClusterIP, from the
/// backend (it comes from the Service address) and from a router on the way (its address stays).
#[test]
fn icmpv6_packet_too_big_about_ipv6_clusterip_connection() {
    let env = edges_env();
    let client = "[fd00:10:1::50]:41000";
    let front = format!("[{WEB_VIP6}]:80");
    let (mut pkts, to_backend) = handshake(&env, client, &front);
    assert_eq!(
        to_backend.src_sock(),
        sa(client),
        "a pod is not masqueraded"
    );
    assert_eq!(to_backend.dst_sock(), sock(WEB_EP6, 8080));
    let data = tcp(
        client,
        &front,
        flags::ACK | flags::PSH,
        1001,
        5001,
        &[0xa5; 1400],
    );
    pkts.push(data.clone());
    let r = env.replay(&pkts);
    r.expect(3, "forward", "ct-established");
    let sent = r.by_index[3].clone().unwrap();
    // RFC 4443: as much of the packet as fits in the minimum MTU.
    let q = quote_of(&sent, 1280 - 48);
    pkts.push(icmp6_error(
        WEB_EP6,
        "fd00:10:1::50",
        Icmpv6Type::PacketTooBig { mtu: 1280 },
        &q,
    ));
    pkts.push(icmp6_error(
        ROUTER6,
        "fd00:10:1::50",
        Icmpv6Type::PacketTooBig { mtu: 1400 },
        &q,
    ));
    let r = env.replay(&pkts);
    for (i, from, mtu) in [(4, WEB_VIP6, 1280u32), (5, ROUTER6, 1400)] {
        let v = r.expect(i, "forward", "icmp-related");
        assert!(!masq(v), "{v}");
        let o = r.out(i); // ICMPv6 checksum (pseudo-header included) verified here
        assert_eq!(o.icmp, Some((2, 0)), "packet {i}: packet too big");
        assert_eq!(o.src, ip(from), "packet {i}: source");
        assert_eq!(o.dst, ip("fd00:10:1::50"), "packet {i}: to the client pod");
        let frame = r.by_index[i].as_ref().unwrap();
        assert_eq!(
            u32::from_be_bytes(icmp_rest_of_header(frame)),
            mtu,
            "packet {i}: MTU kept"
        );
        let q = parse_quote(&o.payload);
        assert_eq!((q.src, q.dst), (sa(client), sa(&front)), "packet {i}");
        assert_eq!(q.orig_ip_len, 40 + 20 + 1400);
        assert_eq!(
            q.l4_checksum(),
            Some(tcp_checksum_of(&data)),
            "packet {i}: quoted TCP checksum is the client's own again"
        );
    }
}

/// A router between the node and the backend reports "TTL exceeded" about a packet on its way to
/// the backend. The error travels in the reply direction: to the client, the router's address
/// kept, the quote translated back. Once for a pod → ClusterIP connection (not masqueraded: the
/// error is addressed to the pod) and once through the NodePort (masqueraded: to the node).
/// The whole packet is quoted, so the quoted TCP checksum is verified in full.
#[test]
fn icmp_time_exceeded_from_router_keeps_router_address() {
    let env = edges_env();
    for (client, front, client_ip, error_to) in [
        (
            "10.1.0.50:42000",
            format!("{WEB_VIP}:80"),
            POD_CLIENT,
            POD_CLIENT,
        ),
        ("203.0.113.7:42001", node_front(), EXTERNAL, NODE_A_IP),
    ] {
        let (mut pkts, _) = handshake(&env, client, &front);
        let data = tcp(
            client,
            &front,
            flags::ACK | flags::PSH,
            1001,
            5001,
            b"GET /",
        );
        pkts.push(data.clone());
        let r = env.replay(&pkts);
        r.expect(3, "forward", "ct-established");
        let sent = r.by_index[3].clone().unwrap();
        pkts.push(icmp4_error(
            ROUTER,
            error_to,
            Icmpv4Type::TimeExceeded(icmpv4::TimeExceededCode::TtlExceededInTransit),
            ip_part(&sent),
        ));
        let r = env.replay(&pkts);
        r.expect(4, "forward", "icmp-related");
        let o = r.out(4);
        assert_eq!(o.icmp, Some((11, 0)), "{client}");
        assert_eq!(o.src, ip(ROUTER), "{client}: the router's address stays");
        assert_eq!(o.dst, ip(client_ip), "{client}: to the client");
        let q = parse_quote(&o.payload);
        assert_eq!((q.src, q.dst), (sa(client), sa(&front)), "{client}");
        q.assert_whole_l4_checksum();
        assert_eq!(q.l4_checksum(), Some(tcp_checksum_of(&data)), "{client}");
    }
}

/// An error about the reply direction: the backend's answer cannot reach the client (its router
/// says host unreachable, or the client itself says port unreachable). The error travels in the
/// original direction and must reach the backend quoting the packet as the backend sent it. From
/// the client itself it leaves from the address the backend knows the client by (the node's, when
/// masqueraded); from a router, the router's address stays. IPv4 through the NodePort and ICMPv6
/// from a pod to the IPv6 ClusterIP.
#[test]
fn icmp_unreachable_about_reply_direction_goes_back_to_backend() {
    let env = edges_env();
    let cases = [
        // (client, front, client address, the error's sources and their expected outer source)
        ("203.0.113.7:43000", node_front(), EXTERNAL),
        (
            "[fd00:10:1::50]:43001",
            format!("[{WEB_VIP6}]:80"),
            "fd00:10:1::50",
        ),
    ];
    for (client, front, client_ip) in cases {
        let (mut pkts, to_backend) = handshake(&env, client, &front);
        // The backend's answer with data (quoted whole below).
        let answer = tcp_on(
            LinkType::Ethernet,
            to_backend.dst_sock(),
            to_backend.src_sock(),
            flags::ACK | flags::PSH,
            5001,
            1001,
            b"HTTP/1.1 200 OK\r\n\r\n",
        );
        pkts.push(answer.clone());
        let r = env.replay(&pkts);
        r.expect(3, "forward", "reply-unnat");
        let back = r.by_index[3].clone().unwrap();
        let back_d = r.out(3);
        assert_eq!(
            (back_d.src_sock(), back_d.dst_sock()),
            (sa(&front), sa(client))
        );
        let v6 = client_ip.contains(':');
        let quote = ip_part(&back).to_vec();
        let front_ip = sa(&front).ip().to_string();
        if v6 {
            pkts.push(icmp6_error(
                ROUTER6,
                &front_ip,
                Icmpv6Type::DestinationUnreachable(icmpv6::DestUnreachableCode::Address),
                &quote,
            ));
            pkts.push(icmp6_error(
                client_ip,
                &front_ip,
                Icmpv6Type::DestinationUnreachable(icmpv6::DestUnreachableCode::Port),
                &quote,
            ));
        } else {
            pkts.push(icmp4_error(
                EXT_ROUTER,
                &front_ip,
                Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Host),
                &quote,
            ));
            pkts.push(icmp4_error(
                client_ip,
                &front_ip,
                Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Port),
                &quote,
            ));
        }
        let r = env.replay(&pkts);
        // What the backend sent, and where the backend believes the client is.
        let backend_view = decode(&answer, LinkType::Ethernet);
        let router = if v6 { ROUTER6 } else { EXT_ROUTER };
        let want_codes = if v6 {
            [(1, 3), (1, 4)]
        } else {
            [(3, 1), (3, 3)]
        };
        for (k, i) in [4usize, 5].into_iter().enumerate() {
            r.expect(i, "forward", "icmp-related");
            let o = r.out(i);
            assert_eq!(o.icmp, Some(want_codes[k]), "{client} packet {i}");
            let want_src = if k == 0 {
                ip(router)
            } else {
                backend_view.dst // the client as the backend knows it
            };
            assert_eq!(o.src, want_src, "{client} packet {i}: outer source");
            assert_eq!(
                o.dst, backend_view.src,
                "{client} packet {i}: to the backend"
            );
            let q = parse_quote(&o.payload);
            assert_eq!(
                (q.src, q.dst),
                (backend_view.src_sock(), backend_view.dst_sock()),
                "{client} packet {i}: the quote is the packet as the backend sent it"
            );
            q.assert_whole_l4_checksum();
            assert_eq!(q.l4_checksum(), Some(tcp_checksum_of(&answer)));
        }
    }
}

/// Port unreachable from a UDP backend (nothing listens on its target port) about a DNS query:
/// back to the client from the Service address, the quoted UDP checksum translated back (and a
/// zero "no checksum" kept zero). IPv4 from a pod, IPv6 from an external client (masqueraded:
/// the error is addressed to the node).
#[test]
fn icmp_port_unreachable_from_udp_backend_reaches_client() {
    let env = edges_env();
    let dns4 = format!("{DNS_VIP}:53");
    let dns6 = format!("[{DNS_VIP6}]:53");
    let queries = vec![
        udp("10.1.0.50:36000", &dns4, b"query-with-checksum"),
        udp_nocsum("10.1.0.50:36001", &dns4, b"query-without-checksum"),
        udp("[2001:db8::7]:36002", &dns6, b"query-over-ipv6"),
    ];
    let r = env.replay(&queries);
    let sent: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            r.expect(i, "forward", "service-dnat");
            r.by_index[i].clone().unwrap()
        })
        .collect();
    assert!(masq(r.v(2)));
    let mut pkts = queries.clone();
    let port = || Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Port);
    pkts.push(icmp4_error(DNS_EP, POD_CLIENT, port(), ip_part(&sent[0])));
    pkts.push(icmp4_error(DNS_EP, POD_CLIENT, port(), ip_part(&sent[1])));
    pkts.push(icmp6_error(
        DNS_EP6,
        NODE_A_IP6,
        Icmpv6Type::DestinationUnreachable(icmpv6::DestUnreachableCode::Port),
        ip_part(&sent[2]),
    ));
    let r = env.replay(&pkts);
    for (k, (client, front, to)) in [
        ("10.1.0.50:36000", &dns4, POD_CLIENT),
        ("10.1.0.50:36001", &dns4, POD_CLIENT),
        ("[2001:db8::7]:36002", &dns6, EXTERNAL6),
    ]
    .into_iter()
    .enumerate()
    {
        let i = 3 + k;
        r.expect(i, "forward", "icmp-related");
        let o = r.out(i);
        assert_eq!(
            o.src,
            sa(front).ip(),
            "packet {i}: from the Service address"
        );
        assert_eq!(o.dst, ip(to), "packet {i}: to the client");
        let q = parse_quote(&o.payload);
        assert_eq!((q.src, q.dst), (sa(client), sa(front)), "packet {i}");
        q.assert_whole_l4_checksum();
        let original = decode(&queries[k], LinkType::Ethernet).udp_checksum;
        assert_eq!(
            q.l4_checksum(),
            original,
            "packet {i}: the client's own checksum"
        );
    }
    assert_eq!(parse_quote(&r.out(4).payload).l4_checksum(), Some(0));
}

/// Errors about masqueraded connections may be steered to another replay worker than their
/// connection (the error comes from the backend, not from the client the steering keys on). They
/// must get the same verdicts as with one worker: `kxdp replay` is deterministic. Each client
/// first sends a burst of unrelated traffic, so that its worker is still busy when the errors'
/// worker (with 8 workers, mostly one without clients) reaches them.
#[test]
fn icmp_errors_same_verdicts_with_several_workers() {
    let env = edges_env();
    let front = node_front();
    let clients: Vec<String> = (0..8)
        .map(|k| format!("203.0.113.{}:{}", 20 + k, 40100 + k))
        .collect();
    let syns: Vec<Vec<u8>> = clients.iter().map(|c| syn(c, &front)).collect();
    let r = env.replay(&syns);
    let sent: Vec<Vec<u8>> = (0..clients.len())
        .map(|i| r.by_index[i].clone().unwrap())
        .collect();
    let mut pkts = Vec::new();
    for _ in 0..1000 {
        for c in &clients {
            let from = sa(c).ip().to_string();
            pkts.push(udp(&format!("{from}:9"), "10.9.9.9:9", b"filler"));
        }
    }
    let filler = pkts.len();
    pkts.extend(syns.iter().cloned());
    for f in &sent {
        pkts.push(icmp4_error(
            WEB_EP,
            NODE_A_IP,
            frag_needed(1200),
            ip_part(f),
        ));
    }
    let at = spaced(&pkts, 1_000);
    let one = env.replay_args(&at, &["--workers", "1"]);
    let n = clients.len();
    for i in filler + n..filler + 2 * n {
        one.expect(i, "forward", "icmp-related");
    }
    for run in 0..3 {
        let many = env.replay_args(&at, &["--workers", "8"]);
        assert_eq!(
            many.reasons()[filler..],
            one.reasons()[filler..],
            "run {run} with 8 workers"
        );
    }
}

/// Errors that quote no tracked connection: to a Service address (a ClusterIP, or an unallocated
/// address of the service CIDR) dropped `icmp-error-untracked`; to the node passed `to-node`;
/// elsewhere forwarded unchanged `direct`. A quote too short to name ports matches nothing and is
/// judged as an ordinary ICMP packet (to a ClusterIP: dropped). The drops are counted.
#[test]
fn icmp_errors_quoting_no_connection() {
    let env = edges_env();
    let unreach = || Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Port);
    // A packet nobody tracks, sent by `from` to 10.2.0.99:5555, quoted whole.
    let quote_from = |from: &str| ip_part(&syn(from, "10.2.0.99:5555")).to_vec();
    let pkts = vec![
        icmp4_error(
            "10.2.0.99",
            WEB_VIP,
            unreach(),
            &quote_from(&format!("{WEB_VIP}:80")),
        ),
        icmp4_error(
            "10.2.0.99",
            "172.30.9.99",
            unreach(),
            &quote_from("172.30.9.99:80"),
        ),
        icmp4_error(
            "10.2.0.99",
            NODE_A_IP,
            unreach(),
            &quote_from(&format!("{NODE_A_IP}:45000")),
        ),
        icmp4_error(
            "10.2.0.99",
            "10.1.0.77",
            unreach(),
            &quote_from("10.1.0.77:45000"),
        ),
        icmp6_error(
            "fd00:10:2::99",
            WEB_VIP6,
            Icmpv6Type::DestinationUnreachable(icmpv6::DestUnreachableCode::Port),
            ip_part(&syn(&format!("[{WEB_VIP6}]:80"), "[fd00:10:2::99]:5555")),
        ),
        // A quote with the IP header only.
        icmp4_error(
            "10.2.0.99",
            WEB_VIP,
            unreach(),
            &quote_from(&format!("{WEB_VIP}:80"))[..20],
        ),
    ];
    let r = env.replay_args(&spaced(&pkts, DEFAULT_GAP_NS), &["--json"]);
    r.expect(0, "drop", "icmp-error-untracked");
    r.expect(1, "drop", "icmp-error-untracked");
    r.expect(2, "pass", "to-node");
    r.expect(3, "forward", "direct");
    assert_eq!(
        r.by_index[3].as_deref(),
        Some(&pkts[3][..]),
        "forwarded unchanged"
    );
    r.out(3);
    r.expect(4, "drop", "icmp-error-untracked");
    // Judged as ICMP to the ClusterIP: a reject reason, but nothing answers an ICMP error.
    r.expect(5, "drop", "service-port-unknown");
    let s = r.summary();
    assert_eq!(reason_count(&s, "icmp-error-untracked"), 3, "{s}");
}

// ---- 2. fragments ------------------------------------------------------------------------------

/// A UDP datagram (checksum over the whole datagram, RFC 768) as bytes: header + payload.
fn udp_datagram(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut h = UdpHeader {
        source_port: src.port(),
        destination_port: dst.port(),
        length: (8 + payload.len()) as u16,
        checksum: 0,
    };
    h.checksum = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => h
            .calc_checksum_ipv4_raw(s.octets(), d.octets(), payload)
            .unwrap(),
        (IpAddr::V6(s), IpAddr::V6(d)) => h
            .calc_checksum_ipv6_raw(s.octets(), d.octets(), payload)
            .unwrap(),
        _ => panic!("mixed families"),
    };
    let mut v = h.to_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// Cuts `data` into pieces: `cuts` are the sizes of all pieces but the last (multiples of 8).
/// Returns (byte offset, bytes, more fragments).
fn cut(data: &[u8], cuts: &[usize]) -> Vec<(usize, Vec<u8>, bool)> {
    let mut out = Vec::new();
    let mut off = 0;
    for &c in cuts {
        assert_eq!(c % 8, 0);
        out.push((off, data[off..off + c].to_vec(), true));
        off += c;
    }
    out.push((off, data[off..].to_vec(), false));
    out
}

/// A UDP datagram from `src` to `dst` as IPv4 fragments with identification `id`, built by hand:
/// the first carries the UDP header (length and checksum of the whole datagram).
fn udp4_fragments(src: &str, dst: &str, id: u16, payload: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let (s, d) = (sa(src), sa(dst));
    let dgram = udp_datagram(s, d, payload);
    cut(&dgram, cuts)
        .into_iter()
        .map(|(off, piece, more)| {
            let mut h = Ipv4Header::new(
                piece.len() as u16,
                64,
                IpNumber::UDP,
                v4(&s.ip().to_string()),
                v4(&d.ip().to_string()),
            )
            .unwrap();
            h.identification = id;
            h.dont_fragment = false;
            h.more_fragments = more;
            h.fragment_offset = IpFragOffset::try_new((off / 8) as u16).unwrap();
            h.header_checksum = h.calc_header_checksum();
            let mut f = eth_header(0x0800);
            f.extend_from_slice(&h.to_bytes());
            f.extend_from_slice(&piece);
            f
        })
        .collect()
}

/// The same over IPv6: a fragment header (RFC 8200 4.5) right after the fixed header.
fn udp6_fragments(src: &str, dst: &str, id: u32, payload: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let (s, d) = (sa(src), sa(dst));
    let dgram = udp_datagram(s, d, payload);
    cut(&dgram, cuts)
        .into_iter()
        .map(|(off, piece, more)| {
            let h = Ipv6Header {
                traffic_class: 0,
                flow_label: Ipv6FlowLabel::ZERO,
                payload_length: (8 + piece.len()) as u16,
                next_header: IpNumber(44),
                hop_limit: 64,
                source: v6(&s.ip().to_string()),
                destination: v6(&d.ip().to_string()),
            };
            let mut f = eth_header(0x86dd);
            f.extend_from_slice(&h.to_bytes());
            f.extend_from_slice(&[17, 0]);
            f.extend_from_slice(&(((off / 8) as u16) << 3 | more as u16).to_be_bytes());
            f.extend_from_slice(&id.to_be_bytes());
            f.extend_from_slice(&piece);
            f
        })
        .collect()
}

/// (IP identification, byte offset, more fragments, data) of a fragment frame, read by hand.
fn frag_fields(frame: &[u8]) -> (u32, usize, bool, Vec<u8>) {
    let p = ip_part(frame);
    match p[0] >> 4 {
        4 => {
            let hl = (p[0] & 0x0f) as usize * 4;
            let fo = be16(p, 6);
            (
                be16(p, 4) as u32,
                (fo & 0x1fff) as usize * 8,
                fo & 0x2000 != 0,
                p[hl..].to_vec(),
            )
        }
        _ => {
            assert_eq!(p[6], 44, "fragment header right after the IPv6 header");
            let fo = be16(p, 42);
            (
                be32(p, 44),
                (fo >> 3) as usize * 8,
                fo & 1 != 0,
                p[48..].to_vec(),
            )
        }
    }
}

/// Reassembles output fragments (any order) and returns the datagram as one unfragmented frame,
/// decoded: the UDP checksum is verified by etherparse and `kxdp_packet::verify::checksums`
/// against the fragments' (translated) addresses.
#[track_caller]
fn reassemble(frames: &[Vec<u8>]) -> Decoded {
    let first = decode(&frames[0], LinkType::Ethernet);
    let mut parts: Vec<_> = frames
        .iter()
        .map(|f| {
            let d = decode(f, LinkType::Ethernet); // IPv4 header checksum of every fragment
            assert_eq!(
                (d.src, d.dst),
                (first.src, first.dst),
                "fragments of one datagram leave with the same addresses"
            );
            frag_fields(f)
        })
        .collect();
    parts.sort_by_key(|p| p.1);
    let id = parts[0].0;
    let mut dgram = Vec::new();
    for (k, (pid, off, more, data)) in parts.iter().enumerate() {
        assert_eq!(*pid, id, "one IP identification");
        assert_eq!(*off, dgram.len(), "fragments are contiguous");
        assert_eq!(*more, k + 1 < parts.len(), "MF on all but the last");
        dgram.extend_from_slice(data);
    }
    let mut whole = Vec::new();
    let step = PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC);
    match (first.src, first.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            step.ipv4(s.octets(), d.octets(), 64)
                .write(&mut whole, IpNumber::UDP, &dgram)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            step.ipv6(s.octets(), d.octets(), 64)
                .write(&mut whole, IpNumber::UDP, &dgram)
        }
        _ => unreachable!(),
    }
    .unwrap();
    decode(&whole, LinkType::Ethernet)
}

fn payload_of(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Runs a fragmented datagram's frames (in the order `order` gives, indexes into `frags`) and
/// checks each is forwarded `service-dnat` to the backend, later fragments with their first
/// fragment's translation; returns the output frames in `frags` order.
#[track_caller]
fn expect_all_dnat(r: &Replay, base: usize, order: &[usize], backend: IpAddr) -> Vec<Vec<u8>> {
    let mut outs = vec![Vec::new(); order.len()];
    for (k, &which) in order.iter().enumerate() {
        let i = base + k;
        let v = r.expect(i, "forward", "service-dnat");
        assert_eq!(vip(v, "dst"), backend, "packet {i}: {v}");
        let o = r.out(i);
        assert_eq!(o.dst, backend, "packet {i}");
        outs[which] = r.by_index[i].clone().unwrap();
    }
    outs
}

/// Fragmented UDP through a ClusterIP: 3 IPv4 fragments, first fragment first with
/// the rest in order, and (another datagram, another flow) the rest out of order. All are
/// forwarded with the first fragment's translation and reason; the reassembled output is a UDP
/// datagram to the backend whose checksum verifies.
#[test]
fn udp_fragments_through_clusterip_in_order_and_out_of_order() {
    let env = edges_env();
    let dns = format!("{DNS_VIP}:53");
    let payload_a = payload_of(3000, 1);
    let payload_b = payload_of(2500, 2);
    let a = udp4_fragments("10.1.0.50:33001", &dns, 0x1001, &payload_a, &[1232, 1232]);
    let b = udp4_fragments("10.1.0.50:33002", &dns, 0x1002, &payload_b, &[1480, 8]);
    let order_b = [0, 2, 1];
    let mut pkts = a.clone();
    pkts.extend(order_b.iter().map(|&k| b[k].clone()));
    let r = env.replay(&pkts);
    let backend = ip(DNS_EP);
    for (base, order, frags, client_port, payload) in [
        (0, &[0, 1, 2][..], &a, 33001u16, &payload_a),
        (3, &order_b[..], &b, 33002, &payload_b),
    ] {
        let outs = expect_all_dnat(&r, base, order, backend);
        assert_eq!(vsock(r.v(base), "dst"), sock(DNS_EP, 5353));
        for (k, out) in outs.iter().enumerate() {
            let (id_in, off_in, more_in, data_in) = frag_fields(&frags[k]);
            let (id, off, more, data) = frag_fields(out);
            assert_eq!((id, off, more), (id_in, off_in, more_in), "fragment {k}");
            if k > 0 {
                assert_eq!(data, data_in, "later fragment {k}: data untouched");
            }
        }
        let d = reassemble(&outs);
        assert_eq!(d.src_sock(), sock(POD_CLIENT, client_port));
        assert_eq!(d.dst_sock(), sock(DNS_EP, 5353));
        assert_eq!(&d.payload, payload);
    }
}

/// A later fragment that arrives before its first fragment cannot be translated: dropped,
/// `fragment-no-state` (not held). The first fragment and the rest still pass; the sender's next
/// datagram on the flow goes through whole.
#[test]
fn udp_later_fragment_before_first_is_dropped_then_rest_pass() {
    let env = edges_env();
    let dns = format!("{DNS_VIP}:53");
    let f = udp4_fragments(
        "10.1.0.50:33003",
        &dns,
        0x2001,
        &payload_of(3000, 3),
        &[1232, 1232],
    );
    let again = udp4_fragments(
        "10.1.0.50:33003",
        &dns,
        0x2002,
        &payload_of(3000, 4),
        &[1232, 1232],
    );
    let mut pkts = vec![f[1].clone(), f[0].clone(), f[2].clone()];
    pkts.extend(again.iter().cloned());
    let r = env.replay_args(&spaced(&pkts, DEFAULT_GAP_NS), &["--json"]);
    let v = r.expect(0, "drop", "fragment-no-state");
    assert_eq!(vip(v, "dst"), ip(DNS_VIP));
    r.expect(1, "forward", "service-dnat");
    r.expect(2, "forward", "service-dnat");
    assert_eq!(r.out(2).dst, ip(DNS_EP));
    for i in 3..6 {
        r.expect(i, "forward", "ct-established");
    }
    let d = reassemble(&[3, 4, 5].map(|i| r.by_index[i].clone().unwrap()));
    assert_eq!(d.dst_sock(), sock(DNS_EP, 5353));
    assert_eq!(d.payload, payload_of(3000, 4));
    assert_eq!(reason_count(&r.summary(), "fragment-no-state"), 1);
}

/// The same with IPv6 fragment headers: in order, out of order, and a later fragment first.
#[test]
fn ipv6_udp_fragments_through_clusterip() {
    let env = edges_env();
    let dns = format!("[{DNS_VIP6}]:53");
    let pa = payload_of(3000, 5);
    let pb = payload_of(2600, 6);
    let pc = payload_of(2000, 7);
    let a = udp6_fragments(
        "[fd00:10:1::50]:34001",
        &dns,
        0x0001_0001,
        &pa,
        &[1232, 1232],
    );
    let b = udp6_fragments(
        "[fd00:10:1::50]:34002",
        &dns,
        0x0001_0002,
        &pb,
        &[1232, 1232],
    );
    let c = udp6_fragments("[fd00:10:1::50]:34003", &dns, 0x0001_0003, &pc, &[1232]);
    let mut pkts = a.clone();
    pkts.extend([b[0].clone(), b[2].clone(), b[1].clone()]);
    pkts.extend([c[1].clone(), c[0].clone()]);
    let r = env.replay(&pkts);
    let backend = ip(DNS_EP6);
    for (base, order, port, payload) in [
        (0, &[0, 1, 2][..], 34001u16, &pa),
        (3, &[0, 2, 1][..], 34002, &pb),
    ] {
        let outs = expect_all_dnat(&r, base, order, backend);
        for o in &outs {
            assert!(
                decode(o, LinkType::Ethernet).ipv6_ext,
                "fragment header kept"
            );
        }
        let d = reassemble(&outs);
        assert_eq!(d.src_sock(), sock("fd00:10:1::50", port));
        assert_eq!(d.dst_sock(), sock(DNS_EP6, 5353));
        assert_eq!(&d.payload, payload);
    }
    r.expect(6, "drop", "fragment-no-state");
    r.expect(7, "forward", "service-dnat");
    assert_eq!(r.out(7).dst_sock(), sock(DNS_EP6, 5353));
}

/// Fragments of a masqueraded datagram (an external client to the ClusterIP): later fragments
/// get the first fragment's source NAT too, and the reassembled datagram's checksum verifies
/// against the node address.
#[test]
fn udp_fragments_from_external_client_are_masqueraded() {
    let env = edges_env();
    let payload = payload_of(3000, 10);
    let f = udp4_fragments(
        "203.0.113.7:37000",
        &format!("{DNS_VIP}:53"),
        0x4001,
        &payload,
        &[1232, 1232],
    );
    let r = env.replay(&f);
    let outs = expect_all_dnat(&r, 0, &[0, 1, 2], ip(DNS_EP));
    for i in 0..3 {
        assert!(masq(r.v(i)), "{}", r.v(i));
        assert_eq!(r.out(i).src, ip(NODE_A_IP), "fragment {i}: source NAT");
    }
    let d = reassemble(&outs);
    assert_eq!(d.src, ip(NODE_A_IP));
    assert_eq!(d.src_sock(), vsock(r.v(0), "src"));
    assert_eq!(d.dst_sock(), sock(DNS_EP, 5353));
    assert_eq!(d.payload, payload);
}

/// A flood of 5000 distinct datagrams' first fragments (5 s, well inside the fragment timeout)
/// overflows the bounded fragment table: the oldest datagram is forgotten, so its later fragment
/// is `fragment-no-state`, while the newest is still known. The replay completes: memory does not
/// grow with the flood.
#[test]
fn fragment_flood_evicts_old_datagrams_and_stays_bounded() {
    let env = edges_env();
    let dns = format!("{DNS_VIP}:53");
    let n = 5000u16;
    let mut firsts = Vec::new();
    let mut lasts = Vec::new();
    for id in 0..n {
        let f = udp4_fragments("10.1.0.50:35000", &dns, id, &payload_of(32, 8), &[24]);
        firsts.push(f[0].clone());
        lasts.push(f[1].clone());
    }
    let mut pkts = firsts;
    pkts.push(lasts[0].clone());
    pkts.push(lasts[n as usize - 1].clone());
    let r = env.replay_at(&spaced(&pkts, 1_000_000));
    r.expect(0, "forward", "service-dnat");
    assert_eq!(r.count_reason("ct-established"), n as usize - 1 + 1);
    r.expect(n as usize, "drop", "fragment-no-state");
    r.expect(n as usize + 1, "forward", "ct-established");
    assert_eq!(r.out(n as usize + 1).dst, ip(DNS_EP));
}

/// The fragment table forgets a datagram 10 s after its first fragment: a later fragment within
/// that passes, one after it is `fragment-no-state`.
#[test]
fn later_fragment_after_fragment_timeout_has_no_state() {
    let env = edges_env();
    let f = udp4_fragments(
        "10.1.0.50:35001",
        &format!("{DNS_VIP}:53"),
        0x3001,
        &payload_of(3000, 9),
        &[1232, 1232],
    );
    let s = 1_000_000_000u64;
    let r = env.replay_at(&[
        (T0_NS, f[0].clone()),
        (T0_NS + 9 * s, f[1].clone()),
        (T0_NS + 11 * s, f[2].clone()),
    ]);
    r.expect(0, "forward", "service-dnat");
    r.expect(1, "forward", "service-dnat");
    r.expect(2, "drop", "fragment-no-state");
}

// ---- 3. TCP --------------------------------------------------------------------------------------

/// A TCP packet other than a SYN, to a Service frontend with endpoints and no connection (its
/// state is gone: a start without the previous process's state, a flush), is answered with a RST
/// from the frontend (`ct-lost`) and creates nothing; a stray RST is dropped `ct-invalid`. A SYN
/// on the same tuple afterwards is a new connection. A Service without endpoints still answers
/// with a RST as `no-endpoints`. The backend's packets of such a connection pass untranslated
/// (the client's stack resets the backend). Counted in the summary.
#[test]
fn non_syn_tcp_without_connection_is_reset() {
    let env = edges_env();
    let vip = format!("{WEB_VIP}:80");
    let c = "10.1.0.50:44000";
    let pkts = vec![
        tcp(c, &vip, flags::ACK, 1001, 5001, b""),
        tcp(c, &vip, flags::RST, 1001, 0, b""),
        tcp(c, &vip, flags::RST | flags::ACK, 1001, 5001, b""),
        tcp(c, &vip, flags::ACK | flags::PSH, 1001, 5001, b"mid-stream"),
        tcp(c, &vip, flags::FIN | flags::ACK, 1001, 5001, b""),
        tcp(c, &vip, flags::SYN | flags::ACK, 1000, 5001, b""),
        tcp("203.0.113.7:44001", &node_front(), flags::ACK, 1, 1, b""),
        tcp(
            "[fd00:10:1::50]:44002",
            &format!("[{WEB_VIP6}]:80"),
            flags::ACK,
            1,
            1,
            b"",
        ),
        // Nothing was created: the SYN is a new connection.
        syn(c, &vip),
        // No endpoints: reject with a RST (seq from the ACK), as before.
        tcp(c, &format!("{EMPTY_VIP}:80"), flags::ACK, 1001, 7777, b""),
    ];
    let r = env.replay_args(&spaced(&pkts, DEFAULT_GAP_NS), &["--json"]);
    for i in [1, 2] {
        let v = r.expect(i, "drop", "ct-invalid");
        assert!(r.by_index[i].is_none(), "{v}");
    }
    let v6_client = "[fd00:10:1::50]:44002".to_string();
    let v6_front = format!("[{WEB_VIP6}]:80");
    let nodeport_client = "203.0.113.7:44001".to_string();
    // (packet, its ACK number, who sent it to which frontend)
    let lost = [
        (0, 5001, c.to_string(), vip.clone()),
        (3, 5001, c.to_string(), vip.clone()),
        (4, 5001, c.to_string(), vip.clone()),
        (5, 5001, c.to_string(), vip.clone()),
        (6, 1, nodeport_client, node_front()),
        (7, 1, v6_client, v6_front),
    ];
    for (i, ack, client, front) in lost {
        r.expect(i, "reject", "ct-lost");
        let rst = r.out(i);
        let t = rst.tcp.clone().unwrap();
        assert!(t.rst, "{i}: {t:?}");
        // RFC 9293 3.10.7.1: a RST answering a segment with ACK takes its sequence number from
        // that ACK; it comes from the frontend the client talked to.
        assert_eq!(t.sequence_number, ack, "{i}");
        assert_eq!(rst.src_sock(), sa(&front), "{i}");
        assert_eq!(rst.dst_sock(), sa(&client), "{i}");
    }
    r.expect(8, "forward", "service-dnat");
    assert_eq!(r.out(8).dst_sock(), sock(WEB_EP, 8080));
    r.expect(9, "reject", "no-endpoints");
    let rst = r.out(9);
    let t = rst.tcp.clone().unwrap();
    assert!(t.rst, "{t:?}");
    assert_eq!(t.sequence_number, 7777);
    assert_eq!(rst.dst_sock(), sa(c));
    let s = r.summary();
    assert_eq!(reason_count(&s, "ct-invalid"), 2, "{s}");
    assert_eq!(reason_count(&s, "ct-lost"), 6, "{s}");
}

/// RST ends a connection: the RST itself is forwarded (translated), after it a data segment of
/// the old connection is `ct-invalid`, and a SYN on the same tuple opens a new connection. Once
/// from the client, once from the backend.
#[test]
fn rst_closes_the_connection_and_old_data_is_invalid() {
    let env = edges_env();
    let vip = format!("{WEB_VIP}:80");
    for (k, client) in ["10.1.0.50:45000", "10.1.0.50:45001"]
        .into_iter()
        .enumerate()
    {
        let (mut pkts, out) = handshake(&env, client, &vip);
        pkts.push(tcp(
            client,
            &vip,
            flags::ACK | flags::PSH,
            1001,
            5001,
            b"hi",
        ));
        let rst_from_backend = k == 1;
        if rst_from_backend {
            pkts.push(tcp_reply_to(&out, flags::RST, 5001, 0));
        } else {
            pkts.push(tcp(client, &vip, flags::RST | flags::ACK, 1003, 5001, b""));
        }
        pkts.push(tcp(
            client,
            &vip,
            flags::ACK | flags::PSH,
            1003,
            5001,
            b"more",
        ));
        pkts.push(syn(client, &vip));
        let r = env.replay(&pkts);
        r.expect(3, "forward", "ct-established");
        if rst_from_backend {
            r.expect(4, "forward", "reply-unnat");
            let o = r.out(4);
            assert_eq!((o.src_sock(), o.dst_sock()), (sa(&vip), sa(client)));
            assert!(o.tcp.unwrap().rst);
        } else {
            r.expect(4, "forward", "ct-established");
            let o = r.out(4);
            assert_eq!(o.dst_sock(), sock(WEB_EP, 8080));
            assert!(o.tcp.unwrap().rst);
        }
        r.expect(5, "drop", "ct-invalid");
        r.expect(6, "forward", "service-dnat");
        assert_eq!(r.out(6).dst_sock(), sock(WEB_EP, 8080));
    }
}

/// FIN moves the state through FIN_WAIT/LAST_ACK to TIME_WAIT (a half-closed connection still
/// carries the other side's data); a SYN reusing the 5-tuple in TIME_WAIT starts a fresh
/// connection (`service-dnat`), whose handshake then works. A SYN on the tuple while it is
/// ESTABLISHED is just a packet of the connection.
#[test]
fn fin_teardown_to_time_wait_then_syn_reuses_tuple() {
    let env = edges_env();
    let vip = format!("{WEB_VIP}:80");
    let client = "10.1.0.50:46000";
    let (mut pkts, out) = handshake(&env, client, &vip);
    pkts.extend([
        syn(client, &vip), // 3: a retransmitted SYN on the live connection
        tcp(client, &vip, flags::FIN | flags::ACK, 1001, 5001, b""), // 4
        tcp_reply_to(&out, flags::ACK | flags::PSH, 5001, 1002), // 5: half-closed, data back
        tcp_reply_to(&out, flags::FIN | flags::ACK, 5003, 1002), // 6
        tcp(client, &vip, flags::ACK, 1002, 5004, b""), // 7: TIME_WAIT
        syn(client, &vip), // 8: reuse
        tcp_reply_to(&out, flags::SYN | flags::ACK, 9000, 1001), // 9
        tcp(client, &vip, flags::ACK, 1001, 9001, b""), // 10
    ]);
    let r = env.replay(&pkts);
    assert_eq!(
        r.reasons(),
        [
            "service-dnat",
            "reply-unnat",
            "ct-established",
            "ct-established",
            "ct-established",
            "reply-unnat",
            "reply-unnat",
            "ct-established",
            "service-dnat",
            "reply-unnat",
            "ct-established"
        ],
        "{:#?}",
        r.verdicts
    );
    for i in [3, 4, 7, 8, 10] {
        assert_eq!(r.out(i).dst_sock(), sock(WEB_EP, 8080), "packet {i}");
    }
    for i in [5, 6, 9] {
        let o = r.out(i);
        assert_eq!((o.src_sock(), o.dst_sock()), (sa(&vip), sa(client)), "{i}");
    }
}

// ---- 4. stale UDP state --------------------------------------------------------------------------

/// One packet a second from a statsd client to `stats`, for `n` seconds.
fn udp_stream(n: u64) -> Vec<(u64, Vec<u8>)> {
    (0..n)
        .map(|s| {
            (
                T0_NS + s * 1_000_000_000,
                udp(
                    "10.1.0.50:50000",
                    &format!("{STATS_VIP}:8125"),
                    format!("requests:{s}|c").as_bytes(),
                ),
            )
        })
        .collect()
}

fn stats_env(endpoints: Vec<Value>) -> Env {
    let mut env = Env::new();
    env.add_all(stats_service(endpoints));
    env
}

#[track_caller]
fn expect_stream_to(r: &Replay, range: std::ops::Range<usize>, backend: &str) {
    for i in range.clone() {
        let reason = if i == range.start {
            "service-dnat"
        } else {
            "ct-established"
        };
        let v = r.expect(i, "forward", reason);
        assert_eq!(vsock(v, "dst"), sock(backend, 8125), "packet {i}");
        assert_eq!(r.out(i).dst_sock(), sock(backend, 8125), "packet {i}");
    }
}

/// A long-lived one-way UDP stream whose only endpoint is replaced at t = 5 s: packets
/// before go to the old endpoint, from 5 s on to the new one (the stale entry was deleted when the
/// state was published). Without the state update the stream stays on the old endpoint.
#[test]
fn udp_stream_moves_when_its_endpoint_is_replaced() {
    let env = stats_env(eps(&[STATS_OLD]));
    let state2 = env.write_state_update("state2.yaml", &stats_service(eps(&[STATS_NEW])));
    let stream = udp_stream(10);
    let update = format!("5:{}", state2.display());
    let r = env.replay_args(&stream, &["--state-update", &update]);
    expect_stream_to(&r, 0..5, STATS_OLD);
    expect_stream_to(&r, 5..10, STATS_NEW);
    // The control run: no update, no move.
    let r = env.replay_at(&stream);
    expect_stream_to(&r, 0..10, STATS_OLD);
}

/// An endpoint that stops serving (still listed, ready and serving false) counts as gone: the
/// stream moves to the endpoint that is ready.
#[test]
fn udp_stream_moves_when_its_endpoint_stops_serving() {
    let env = stats_env(eps(&[STATS_OLD]));
    let state2 = env.write_state_update(
        "state2.yaml",
        &stats_service(vec![
            ep_cond(
                STATS_OLD,
                node_of(STATS_OLD),
                Some(false),
                Some(false),
                Some(true),
            ),
            endpoint(STATS_NEW, node_of(STATS_NEW)),
        ]),
    );
    let update = format!("5:{}", state2.display());
    let r = env.replay_args(&udp_stream(10), &["--state-update", &update]);
    expect_stream_to(&r, 0..5, STATS_OLD);
    expect_stream_to(&r, 5..10, STATS_NEW);
}

/// A Service deleted in the update leaves no UDP entries behind: its packets afterwards are
/// `service-ip-unallocated` (the address is inside the service CIDR; a live entry would have been
/// found first), and the old backend's replies are no longer un-NATed (`direct`).
#[test]
fn udp_to_deleted_service_is_unallocated_and_leaves_no_entries() {
    let env = stats_env(eps(&[STATS_OLD]));
    let state2 = env.write_state_update("state2.yaml", &[]);
    let mut pkts = udp_stream(8);
    let reply = || {
        udp(
            &format!("{STATS_OLD}:8125"),
            "10.1.0.50:50000",
            b"backend says hi",
        )
    };
    pkts.insert(2, (T0_NS + 1_500_000_000, reply()));
    pkts.push((T0_NS + 8_000_000_000, reply()));
    let update = format!("5:{}", state2.display());
    let r = env.replay_args(&pkts, &["--state-update", &update, "--json"]);
    r.expect(0, "forward", "service-dnat");
    r.expect(1, "forward", "ct-established");
    r.expect(2, "forward", "reply-unnat");
    assert_eq!(r.out(2).src_sock(), sock(STATS_VIP, 8125));
    for i in 3..6 {
        r.expect(i, "forward", "ct-established");
    }
    for i in 6..9 {
        let v = r.expect(i, "drop", "service-ip-unallocated");
        assert_eq!(vsock(v, "dst"), sock(STATS_VIP, 8125));
    }
    r.expect(9, "forward", "direct");
    assert_eq!(r.out(9).src_sock(), sock(STATS_OLD, 8125), "not un-NATed");
}

/// A Service going from no endpoints to some: rejected before (ICMP port unreachable, no state
/// kept), served after.
#[test]
fn udp_service_from_no_endpoints_to_some() {
    let env = stats_env(vec![]);
    let state2 = env.write_state_update("state2.yaml", &stats_service(eps(&[STATS_NEW])));
    let update = format!("5:{}", state2.display());
    let r = env.replay_args(&udp_stream(8), &["--state-update", &update]);
    for i in 0..5 {
        r.expect(i, "reject", "no-endpoints");
        assert_eq!(r.out(i).icmp, Some((3, 3)));
    }
    expect_stream_to(&r, 5..8, STATS_NEW);
}

/// The `web` Service with its IPv4 slice's endpoints as given (conditions included).
fn web_service_eps(eps4: Vec<Value>) -> Vec<Value> {
    let mut objs = web_service(&[], &[WEB_EP6]);
    objs[1]["endpoints"] = json!(eps4);
    objs
}

/// The SYNs of `n` connections to the `web` ClusterIP from one client's ports, 0.1 s apart.
fn web_syns(n: u16) -> Vec<(u64, Vec<u8>)> {
    let vip = format!("{WEB_VIP}:80");
    (0..n)
        .map(|i| {
            (
                T0_NS + i as u64 * 100_000_000,
                syn(&format!("10.1.0.50:{}", 47000 + i), &vip),
            )
        })
        .collect()
}

/// Which endpoint each of `web_syns(n)` went to, from a replay of the SYNs alone (replay is
/// deterministic: the same capture prefix makes the same choices).
fn web_backends(env: &Env, n: u16) -> Vec<SocketAddr> {
    let r = env.replay_at(&web_syns(n));
    (0..n as usize)
        .map(|i| vsock(r.expect(i, "forward", "service-dnat"), "dst"))
        .collect()
}

/// `n` established connections to `web` (handshakes before 5 s: the SYNs, then each backend's
/// SYN-ACK and its client's ACK), then at 6 s and 7 s one data segment per connection from its
/// client, and at 8 s one from each backend, with a state update at 5 s: the replay, and the
/// backend each connection went to.
fn web_connections_across(
    env: &Env,
    update: &std::path::Path,
    n: u16,
) -> (Replay, Vec<SocketAddr>) {
    let backends = web_backends(env, n);
    let vip = format!("{WEB_VIP}:80");
    let s = 1_000_000_000u64;
    let mut pkts = web_syns(n);
    for (i, b) in backends.iter().enumerate() {
        let client = format!("10.1.0.50:{}", 47000 + i);
        let t = T0_NS + 2 * s + i as u64 * 100_000_000;
        pkts.push((
            t,
            tcp(
                &b.to_string(),
                &client,
                flags::SYN | flags::ACK,
                5000,
                1001,
                b"",
            ),
        ));
        pkts.push((t + s, tcp(&client, &vip, flags::ACK, 1001, 5001, b"")));
    }
    for (k, at) in [6u64, 7].into_iter().enumerate() {
        for i in 0..n as usize {
            let client = format!("10.1.0.50:{}", 47000 + i);
            let seq = 1001 + 5 * k as u32;
            let t = T0_NS + at * s + i as u64 * 1_000_000;
            pkts.push((
                t,
                tcp(&client, &vip, flags::ACK | flags::PSH, seq, 5001, b"hello"),
            ));
        }
    }
    for (i, b) in backends.iter().enumerate() {
        let client = format!("10.1.0.50:{}", 47000 + i);
        let t = T0_NS + 8 * s + i as u64 * 1_000_000;
        pkts.push((
            t,
            tcp(
                &b.to_string(),
                &client,
                flags::ACK | flags::PSH,
                5001,
                1011,
                b"ok",
            ),
        ));
    }
    pkts.sort_by_key(|(t, _)| *t);
    let update = format!("5:{}", update.display());
    let r = env.replay_args(&pkts, &["--state-update", &update, "--json"]);
    (r, backends)
}

/// Verdict indexes of `web_connections_across`'s packets, in capture order: the client's data
/// at 6 s and at 7 s, and the backends' at 8 s, of connection `i` of `n`.
fn data_index(n: usize, i: usize) -> [usize; 3] {
    let base = 3 * n;
    [base + i, base + n + i, base + 2 * n + i]
}

/// An endpoint removed for good (gone from the EndpointSlices, as when its pod is deleted): the
/// next packet from the client of a connection pinned to it is answered with a RST from the
/// frontend (`backend-gone`, sequence number from the packet's ACK) and the connection removed,
/// so the client ends it at once rather than retransmitting into a vanished backend; its next
/// packet is `ct-lost`, and a new connection goes to a listed endpoint. Connections to the other
/// endpoint carry on. Counted once per connection.
#[test]
fn tcp_connection_to_a_removed_endpoint_is_reset() {
    let mut env = Env::new();
    env.add_all(web_service(&[WEB_EP, WEB_EP_NEW], &[WEB_EP6]));
    let state2 = env.write_state_update("state2.yaml", &web_service(&[WEB_EP_NEW], &[WEB_EP6]));
    let n = 16;
    let (r, backends) = web_connections_across(&env, &state2, n);
    let gone = sock(WEB_EP, 8080);
    let kept = sock(WEB_EP_NEW, 8080);
    assert!(
        backends.contains(&gone) && backends.contains(&kept),
        "{backends:?}"
    );
    let vip = sa(&format!("{WEB_VIP}:80"));
    for (i, b) in backends.iter().enumerate() {
        let client = sock("10.1.0.50", 47000 + i as u16);
        let [first, second, reply] = data_index(n as usize, i);
        if *b == gone {
            r.expect(first, "reject", "backend-gone");
            let rst = r.out(first);
            let t = rst.tcp.clone().unwrap();
            assert!(t.rst, "{i}: {t:?}");
            assert_eq!(t.sequence_number, 5001, "{i}");
            assert_eq!(rst.src_sock(), vip, "{i}");
            assert_eq!(rst.dst_sock(), client, "{i}");
            // The connection is gone: what follows is a connection without state.
            r.expect(second, "reject", "ct-lost");
            r.expect(reply, "forward", "direct");
        } else {
            for k in [first, second] {
                r.expect(k, "forward", "ct-established");
                assert_eq!(r.out(k).dst_sock(), kept, "{i}");
            }
            r.expect(reply, "forward", "reply-unnat");
            assert_eq!(r.out(reply).src_sock(), vip, "{i}");
        }
    }
    let lost = backends.iter().filter(|b| **b == gone).count();
    let s = r.summary();
    assert_eq!(reason_count(&s, "backend-gone"), lost as u64, "{s}");
    // A new connection after the update goes to the endpoint still listed.
    let late = vec![
        (T0_NS, syn("10.1.0.60:40000", &format!("{WEB_VIP}:80"))),
        (
            T0_NS + 2_000_000_000,
            syn("10.1.0.60:40001", &format!("{WEB_VIP}:80")),
        ),
    ];
    let update = format!("1:{}", state2.display());
    let r = env.replay_args(&late, &["--state-update", &update]);
    r.expect(1, "forward", "service-dnat");
    assert_eq!(r.out(1).dst_sock(), kept);
}

/// A terminating endpoint (still listed, `terminating: true`) keeps its connections while it
/// drains: packets both ways are forwarded as before, and only new connections avoid it. Once
/// it is removed, its connections are reset.
#[test]
fn tcp_connection_to_a_terminating_endpoint_keeps_working() {
    let mut env = Env::new();
    env.add_all(web_service(&[WEB_EP, WEB_EP_NEW], &[WEB_EP6]));
    let draining = web_service_eps(vec![
        ep_cond(WEB_EP, node_of(WEB_EP), Some(false), Some(true), Some(true)),
        endpoint(WEB_EP_NEW, node_of(WEB_EP_NEW)),
    ]);
    let state2 = env.write_state_update("state2.yaml", &draining);
    let n = 16;
    let (r, backends) = web_connections_across(&env, &state2, n);
    let vip = sa(&format!("{WEB_VIP}:80"));
    assert!(backends.contains(&sock(WEB_EP, 8080)), "{backends:?}");
    for (i, b) in backends.iter().enumerate() {
        let [first, second, reply] = data_index(n as usize, i);
        for k in [first, second] {
            r.expect(k, "forward", "ct-established");
            assert_eq!(r.out(k).dst_sock(), *b, "{i}");
        }
        r.expect(reply, "forward", "reply-unnat");
        assert_eq!(r.out(reply).src_sock(), vip, "{i}");
    }
    assert_eq!(reason_count(&r.summary(), "backend-gone"), 0);
    // Not ready, not serving and not terminating (a failing readiness probe): still listed, so
    // its connections carry on too.
    let unready = web_service_eps(vec![
        ep_cond(
            WEB_EP,
            node_of(WEB_EP),
            Some(false),
            Some(false),
            Some(false),
        ),
        endpoint(WEB_EP_NEW, node_of(WEB_EP_NEW)),
    ]);
    let state3 = env.write_state_update("state3.yaml", &unready);
    let (r, _) = web_connections_across(&env, &state3, n);
    assert_eq!(reason_count(&r.summary(), "backend-gone"), 0);
}

// ---- 5. SCTP -------------------------------------------------------------------------------------

/// One SCTP chunk (padded to 4 bytes).
fn chunk(ty: u8, flags: u8, value: &[u8]) -> Vec<u8> {
    let mut c = vec![ty, flags];
    c.extend_from_slice(&((4 + value.len()) as u16).to_be_bytes());
    c.extend_from_slice(value);
    while c.len() % 4 != 0 {
        c.push(0);
    }
    c
}

/// INIT / INIT ACK fixed part: initiate tag, a_rwnd, outbound streams, inbound streams, TSN.
fn init_value(tag: u32, tsn: u32) -> Vec<u8> {
    let mut v = tag.to_be_bytes().to_vec();
    v.extend_from_slice(&65535u32.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&tsn.to_be_bytes());
    v
}

const COOKIE: &[u8] = b"state-cookie-0123456789ab";

fn init(tag: u32) -> Vec<u8> {
    chunk(1, 0, &init_value(tag, 100))
}

fn init_ack(tag: u32) -> Vec<u8> {
    let mut v = init_value(tag, 500);
    // State Cookie parameter (type 7).
    v.extend_from_slice(&7u16.to_be_bytes());
    v.extend_from_slice(&((4 + COOKIE.len()) as u16).to_be_bytes());
    v.extend_from_slice(COOKIE);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    chunk(2, 0, &v)
}

fn data_chunk(tsn: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = tsn.to_be_bytes().to_vec();
    v.extend_from_slice(&[0, 0, 0, 0]); // stream 0, sequence 0
    v.extend_from_slice(&46u32.to_be_bytes()); // PPID: Diameter
    v.extend_from_slice(payload);
    chunk(0, 0x03, &v) // B|E: unfragmented message
}

fn sack(cum_tsn: u32) -> Vec<u8> {
    let mut v = cum_tsn.to_be_bytes().to_vec();
    v.extend_from_slice(&65535u32.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 0]); // no gap blocks, no duplicates
    chunk(3, 0, &v)
}

/// An SCTP packet (common header with a valid CRC32c, then `chunks`) over IPv4.
fn sctp(src: &str, dst: &str, vtag: u32, chunks: &[Vec<u8>]) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    let mut b = Vec::new();
    b.extend_from_slice(&s.port().to_be_bytes());
    b.extend_from_slice(&d.port().to_be_bytes());
    b.extend_from_slice(&vtag.to_be_bytes());
    b.extend_from_slice(&[0; 4]);
    for c in chunks {
        b.extend_from_slice(c);
    }
    let crc = ref_crc32c(&b);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut v = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, NODE_MAC)
        .ipv4(v4(&s.ip().to_string()), v4(&d.ip().to_string()), 64)
        .write(&mut v, IpNumber(132), &b)
        .unwrap();
    v
}

/// An SCTP association through a ClusterIP (3868 → 10.2.0.70:3869), from INIT to
/// SHUTDOWN COMPLETE, with the verification tags of RFC 9260: every packet forwarded with its
/// addresses and ports translated, its tag and chunks untouched and its CRC32c valid. A packet
/// with a wrong verification tag is `ct-invalid`.
#[test]
fn sctp_association_through_clusterip() {
    let env = edges_env();
    let c = "10.1.0.50:5000";
    let vip = format!("{SCTP_VIP}:3868");
    let ep = format!("{SCTP_EP}:3869");
    let (t1, t2) = (0x1111_2222u32, 0x3333_4444u32);
    let pkts = vec![
        sctp(c, &vip, 0, &[init(t1)]),     // 0
        sctp(&ep, c, t1, &[init_ack(t2)]), // 1
        sctp(
            c,
            &vip,
            t2,
            &[chunk(10, 0, COOKIE), data_chunk(100, b"CER")],
        ), // 2
        sctp(&ep, c, t1, &[chunk(11, 0, &[])]), // 3 COOKIE ACK
        sctp(&ep, c, t1, &[sack(100)]),    // 4
        sctp(&ep, c, t1, &[data_chunk(500, b"CEA")]), // 5
        sctp(c, &vip, t2, &[sack(500)]),   // 6
        sctp(c, &vip, 0xdead_beef, &[data_chunk(101, b"?")]), // 7 wrong tag
        sctp(c, &vip, t2, &[data_chunk(101, b"DWR")]), // 8
        sctp(&ep, c, t1, &[sack(101), data_chunk(501, b"DWA")]), // 9
        sctp(c, &vip, t2, &[chunk(7, 0, &501u32.to_be_bytes())]), // 10 SHUTDOWN
        sctp(&ep, c, t1, &[chunk(8, 0, &[])]), // 11 SHUTDOWN ACK
        sctp(c, &vip, t2, &[chunk(14, 0, &[])]), // 12 SHUTDOWN COMPLETE
    ];
    let r = env.replay(&pkts);
    let from_client = [0, 2, 6, 7, 8, 10, 12];
    for (i, p) in pkts.iter().enumerate() {
        if i == 7 {
            let v = r.expect(7, "drop", "ct-invalid");
            assert!(r.by_index[7].is_none(), "{v}");
            continue;
        }
        let want = match i {
            0 => "service-dnat",
            _ if from_client.contains(&i) => "ct-established",
            _ => "reply-unnat",
        };
        r.expect(i, "forward", want);
        let o = r.out(i); // CRC32c verified (bitwise reference and kxdp_packet)
        let input = decode(p, LinkType::Ethernet);
        if from_client.contains(&i) {
            assert_eq!((o.src_sock(), o.dst_sock()), (sa(c), sa(&ep)), "packet {i}");
        } else {
            assert_eq!(
                (o.src_sock(), o.dst_sock()),
                (sa(&vip), sa(c)),
                "packet {i}"
            );
        }
        assert_eq!(
            o.payload[4..8],
            input.payload[4..8],
            "packet {i}: verification tag"
        );
        assert_eq!(o.payload[12..], input.payload[12..], "packet {i}: chunks");
    }
}

/// SCTP packets that do not fit the association, or cannot start one, are `ct-invalid` and leave
/// nothing behind: a wrong tag in the reply direction, a CRC32c that does not verify (NAT would
/// otherwise send it on with a valid one), an INIT with a non-zero tag, an INIT bundled with
/// DATA, DATA with no association, a chunk whose length runs past the packet (the first chunk's:
/// `malformed`), one chunk more than 64.
#[test]
fn sctp_invalid_packets_are_dropped() {
    let env = edges_env();
    let c = "10.1.0.50:5001";
    let vip = format!("{SCTP_VIP}:3868");
    let ep = format!("{SCTP_EP}:3869");
    let (t1, t2) = (0x0101_0101u32, 0x0202_0202u32);
    let mut bad_crc = sctp(c, &vip, t2, &[data_chunk(100, b"x")]);
    let n = bad_crc.len();
    bad_crc[n - 1] ^= 0xff; // payload byte: the CRC no longer matches
    let mut overrun = sctp("10.1.0.50:5002", &vip, 0, &[init(t1)]);
    let at = overrun.len() - 20 + 2; // the INIT chunk's length field
    overrun[at..at + 2].copy_from_slice(&200u16.to_be_bytes());
    // A second chunk whose length runs past the packet.
    let mut overrun_second = sctp(c, &vip, t2, &[sack(500), data_chunk(101, b"x")]);
    let at = overrun_second.len() - 20 + 2;
    overrun_second[at..at + 2].copy_from_slice(&300u16.to_be_bytes());
    // One chunk more than MAX_CHUNKS (64).
    let too_many: Vec<Vec<u8>> = (0..65).map(|k| data_chunk(200 + k, b"y")).collect();
    let pkts = vec![
        sctp(c, &vip, 0, &[init(t1)]),                                     // 0
        sctp(&ep, c, t1, &[init_ack(t2)]),                                 // 1
        sctp(c, &vip, t2, &[chunk(10, 0, COOKIE)]),                        // 2
        sctp(&ep, c, t1, &[chunk(11, 0, &[])]),                            // 3
        sctp(&ep, c, 0x0bad_0bad, &[data_chunk(500, b"?")]),               // 4 wrong tag
        bad_crc,                                                           // 5
        sctp(c, &vip, t2, &[data_chunk(100, b"ok")]),                      // 6
        sctp("10.1.0.50:5003", &vip, 7, &[init(t1)]),                      // 7 INIT, tag 7
        sctp("10.1.0.50:5004", &vip, 0, &[init(t1), data_chunk(1, b"x")]), // 8
        sctp("10.1.0.50:5005", &vip, t2, &[data_chunk(1, b"x")]),          // 9
        overrun,                                                           // 10
        overrun_second,                                                    // 11
        sctp(c, &vip, t2, &too_many),                                      // 12
    ];
    let r = env.replay(&pkts);
    r.expect(0, "forward", "service-dnat");
    r.expect(1, "forward", "reply-unnat");
    r.expect(2, "forward", "ct-established");
    r.expect(3, "forward", "reply-unnat");
    for i in [4, 5, 7, 8, 9] {
        r.expect(i, "drop", "ct-invalid");
    }
    r.expect(6, "forward", "ct-established");
    assert_eq!(r.out(6).dst_sock(), sa(&ep));
    // The first chunk's length is checked when the packet is parsed; the others when conntrack
    // reads the chunks.
    r.expect(10, "drop", "malformed");
    r.expect(11, "drop", "ct-invalid");
    r.expect(12, "drop", "ct-invalid");
}
