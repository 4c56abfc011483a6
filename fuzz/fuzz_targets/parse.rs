//! The packet parser on arbitrary bytes, as both link types, and what the pipeline does next with
//! a parsed packet: the ICMP error quote parser, the NAT rewrite and the TTL decrement (on a copy).
//! None may panic; a rewrite must keep the packet parseable.
#![no_main]

use kxdp_packet::{decrement_ttl, parse, parse_quoted, rewrite, Addr, LinkType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for link in [LinkType::Ethernet, LinkType::RawIp] {
        let Ok(parsed) = parse(data, link) else {
            continue;
        };
        let kxdp_packet::Parsed::Ip(mut meta) = parsed else {
            continue;
        };
        let _ = parse_quoted(data, &meta);
        let mut copy = data.to_vec();
        let to = if meta.family == kxdp_packet::Family::V4 {
            Addr::from_v4([10, 9, 8, 7])
        } else {
            Addr::from_ip("fd00::7".parse().unwrap())
        };
        let (src, sport) = (meta.src, meta.sport);
        rewrite(&mut copy, &mut meta, src, sport, to, 8080);
        let _ = decrement_ttl(&mut copy, link);
        assert!(
            parse(&copy, link).is_ok(),
            "a rewritten packet no longer parses"
        );
    }
});
