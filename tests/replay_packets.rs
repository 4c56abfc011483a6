//! Acceptance: the packet layer seen through `kxdp replay`: IPv4 options, VLAN tags, IPv6
//! extension headers, NAT of TCP/UDP/SCTP with valid checksums, malformed frames, non-IP frames,
//! pcapng input.

mod support;

use kxdp_packet::IpProto;
use serde_json::json;
use support::*;

fn env() -> Env {
    let mut env = Env::new();
    env.add(service(
        "multi",
        json!({
            "type": "NodePort",
            "clusterIP": "172.30.5.10",
            "clusterIPs": ["172.30.5.10", "fd00:172:30::510"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "RequireDualStack",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30510},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30511},
                {"name": "sig", "port": 3868, "protocol": "SCTP", "targetPort": 3869, "nodePort": 30512}
            ]
        }),
    ));
    let ports = json!([
        sport("http", 8080, "TCP"),
        sport("dns", 5353, "UDP"),
        sport("sig", 3869, "SCTP")
    ]);
    env.add(endpoint_slice(
        "multi",
        "multi-v4",
        "IPv4",
        ports.clone(),
        vec![endpoint("10.2.0.10", NODE_B)],
    ));
    env.add(endpoint_slice(
        "multi",
        "multi-v6",
        "IPv6",
        ports,
        vec![endpoint("fd00:10:2::10", NODE_B)],
    ));
    env
}

#[test]
fn ipv4_options_and_vlan_tags_survive_nat() {
    let r = env().replay(&[
        tcp4_with("10.1.0.50:40000", "172.30.5.10:80", true, &[]),
        tcp4_with("10.1.0.50:40001", "172.30.5.10:80", false, &[100]),
        tcp4_with("10.1.0.50:40002", "172.30.5.10:80", true, &[200, 300]),
    ]);
    for (i, (opts, vlans)) in [(8, 0), (0, 1), (8, 2)].into_iter().enumerate() {
        let v = r.expect(i, "forward", "service-dnat");
        assert_eq!(v["dst"], "10.2.0.10:8080");
        let o = r.out(i);
        assert_eq!(o.dst_sock(), sa("10.2.0.10:8080"), "packet {i}");
        assert_eq!(o.src_sock(), sock(POD_CLIENT, 40000 + i as u16));
        assert_eq!(o.ipv4_options, opts, "packet {i}: IPv4 options kept");
        assert_eq!(o.vlans, vlans, "packet {i}: VLAN tags kept");
    }
}

#[test]
fn ipv6_with_extension_header_nat() {
    let r = env().replay(&[
        udp6_with_ext("[fd00:10:1::50]:40000", "[fd00:172:30::510]:53", b"query"),
        udp6_with_ext("[2001:db8::7]:40001", "[fd00:192::2]:30511", b"query"),
    ]);
    let v = r.expect(0, "forward", "service-dnat");
    assert_eq!(vsock(v, "dst"), sa("[fd00:10:2::10]:5353"));
    let o = r.out(0);
    assert!(o.ipv6_ext, "destination options header kept");
    assert_eq!(o.dst_sock(), sa("[fd00:10:2::10]:5353"));
    assert_eq!(o.src_sock(), sa("[fd00:10:1::50]:40000"));
    assert_eq!(o.payload, b"query");
    // Masqueraded (NodePort): both addresses rewritten, checksum still valid.
    r.expect(1, "forward", "service-dnat");
    let o = r.out(1);
    assert!(o.ipv6_ext);
    assert_eq!(o.src, ip(NODE_A_IP6));
    assert_eq!(o.dst_sock(), sa("[fd00:10:2::10]:5353"));
}

#[test]
fn tcp_udp_sctp_nat_checksums_with_dnat_and_snat() {
    let r = env().replay(&[
        tcp(
            "10.1.0.50:40000",
            "172.30.5.10:80",
            flags::SYN,
            1000,
            0,
            b"",
        ),
        udp("10.1.0.50:40001", "172.30.5.10:53", b"q"),
        sctp_init("10.1.0.50:40002", "172.30.5.10:3868"),
        tcp(
            "203.0.113.7:40003",
            "192.168.0.2:30510",
            flags::SYN,
            1000,
            0,
            b"",
        ),
        udp("203.0.113.7:40004", "192.168.0.2:30511", b"odd-length"),
        sctp_init("203.0.113.7:40005", "192.168.0.2:30512"),
        sctp_init("[fd00:10:1::50]:40006", "[fd00:172:30::510]:3868"),
    ]);
    let want = [
        "10.2.0.10:8080",
        "10.2.0.10:5353",
        "10.2.0.10:3869",
        "10.2.0.10:8080",
        "10.2.0.10:5353",
        "10.2.0.10:3869",
        "[fd00:10:2::10]:3869",
    ];
    for (i, w) in want.iter().enumerate() {
        r.expect(i, "forward", "service-dnat");
        // `out` verifies every checksum (etherparse, reference CRC32c, verify::checksums).
        let o = r.out(i);
        assert_eq!(o.dst_sock(), sa(w), "packet {i}");
        if (3..6).contains(&i) {
            assert_eq!(o.src, ip(NODE_A_IP), "packet {i} masqueraded");
        }
    }
    assert_eq!(r.out(2).proto, IpProto::SCTP);
    assert_eq!(r.out(5).proto, IpProto::SCTP);
    assert_eq!(r.out(6).proto, IpProto::SCTP);
}

#[test]
fn udp_zero_checksum_over_ipv4_stays_zero() {
    let r = env().replay(&[
        udp_nocsum("10.1.0.50:40000", "172.30.5.10:53", b"no checksum"),
        udp_nocsum("203.0.113.7:40001", "192.168.0.2:30511", b"no checksum"),
    ]);
    for i in 0..2 {
        r.expect(i, "forward", "service-dnat");
        let o = r.out(i);
        assert_eq!(
            o.udp_checksum,
            Some(0),
            "packet {i}: a zero UDP checksum stays zero"
        );
        assert_eq!(o.dst_sock(), sa("10.2.0.10:5353"));
    }
}

fn set_ipv4_total_len(f: &mut [u8], len: u16) {
    f[16..18].copy_from_slice(&len.to_be_bytes());
}

#[test]
fn malformed_frames_dropped_and_arp_passed() {
    let good = syn("10.1.0.50:40000", "172.30.5.10:80");
    let mut frames = Vec::new();
    // 0: truncated inside the IPv4 header.
    frames.push(good[..30].to_vec());
    // 1: truncated inside the TCP header (IP total length says so too).
    let mut f = good[..44].to_vec();
    set_ipv4_total_len(&mut f, 30);
    frames.push(f);
    // 2: IHL 4.
    let mut f = good.clone();
    f[14] = 0x44;
    frames.push(f);
    // 3: TCP data offset 4.
    let mut f = good.clone();
    f[14 + 20 + 12] = 0x40;
    frames.push(f);
    // 4: IPv4 total length beyond the frame.
    let mut f = good.clone();
    set_ipv4_total_len(&mut f, 1000);
    frames.push(f);
    // 5: IPv4 total length shorter than the header.
    let mut f = good.clone();
    set_ipv4_total_len(&mut f, 12);
    frames.push(f);
    // 6: UDP length larger than the IP payload.
    let mut f = udp("10.1.0.50:40001", "172.30.5.10:53", b"abc");
    f[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&200u16.to_be_bytes());
    frames.push(f);
    // 7: IPv6 payload length beyond the frame.
    let mut f = udp("[fd00:10:1::50]:40002", "[fd00:172:30::510]:53", b"abc");
    f[14 + 4..14 + 6].copy_from_slice(&900u16.to_be_bytes());
    frames.push(f);
    // 8: an Ethernet header and nothing else (EtherType IPv4).
    frames.push(good[..14].to_vec());
    // 9: ARP.
    frames.push(arp());
    // 10: the good frame, to show the others did not disturb anything.
    frames.push(good.clone());
    let r = env().replay(&frames);
    for i in 0..9 {
        r.expect(i, "drop", "malformed");
        assert!(r.by_index[i].is_none());
    }
    r.expect(9, "pass", "not-ip");
    r.expect(10, "forward", "service-dnat");
    assert_eq!(r.out(10).dst_sock(), sa("10.2.0.10:8080"));
    assert_eq!(r.frames.len(), 1, "only the good frame leaves");
}

/// A pcapng file (SHB, IDB with Ethernet, two EPBs, microsecond timestamps) written by hand.
fn pcapng(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::new();
    // Section header block.
    b.extend_from_slice(&0x0A0D_0D0Au32.to_le_bytes());
    b.extend_from_slice(&28u32.to_le_bytes());
    b.extend_from_slice(&0x1A2B_3C4Du32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&(-1i64).to_le_bytes());
    b.extend_from_slice(&28u32.to_le_bytes());
    // Interface description block: LINKTYPE_ETHERNET, snaplen 65535.
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&20u32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&20u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        let padded = f.len().div_ceil(4) * 4;
        let total = (32 + padded) as u32;
        let ts_us = T0_NS / 1000 + i as u64 * 150_000;
        b.extend_from_slice(&6u32.to_le_bytes());
        b.extend_from_slice(&total.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&((ts_us >> 32) as u32).to_le_bytes());
        b.extend_from_slice(&(ts_us as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(f);
        b.resize(b.len() + padded - f.len(), 0);
        b.extend_from_slice(&total.to_le_bytes());
    }
    b
}

#[test]
fn pcapng_input() {
    let env = env();
    env.write_files();
    let path = env.path("in.pcapng");
    std::fs::write(
        &path,
        pcapng(&[
            syn("10.1.0.50:40000", "172.30.5.10:80"),
            udp("10.1.0.50:40001", "172.30.5.10:53", b"q"),
            arp(),
        ]),
    )
    .unwrap();
    let out = env.run_cli(&path, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = read_verdicts(&env.path("v.jsonl"));
    assert_eq!(v.len(), 3);
    assert_eq!(
        (v[0]["action"].as_str(), v[0]["reason"].as_str()),
        (Some("forward"), Some("service-dnat"))
    );
    assert_eq!(v[0]["dst"], "10.2.0.10:8080");
    assert_eq!(v[1]["dst"], "10.2.0.10:5353");
    assert_eq!(v[2]["reason"], "not-ip");
    let cap = kxdp_packet::pcap::read_file(&env.path("out.pcap")).unwrap();
    assert_eq!(cap.link, kxdp_packet::LinkType::Ethernet);
    assert_eq!(cap.packets.len(), 2);
    assert_eq!(
        decode(&cap.packets[0].data, cap.link).dst_sock(),
        sa("10.2.0.10:8080")
    );
}
