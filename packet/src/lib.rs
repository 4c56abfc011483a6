//! kxdp-packet: zero-copy packet views, the one-pass fast-path parser, in-place NAT rewriting with
//! incremental checksums, reply builders (TCP RST, ICMP port unreachable) and pcap I/O.
//!
//! Why handwritten views rather than a parsing crate: `etherparse` (used by the tests as an
//! independent oracle) offers zero-copy read slices, but no in-place *mutable* rewrite with
//! RFC 1624 incremental checksum updates, which is what NAT on the fast path needs. The views here
//! follow smoltcp's `wire` style: `Packet<T: AsRef<[u8]>>` over a byte buffer, `new_checked`
//! validating every length once so the getters can index without further checks, setters when
//! `T: AsMut<[u8]>`, and a plain `Repr` per protocol for building packets.
//!
//! Nothing in this crate panics on any input: malformed input is a [`ParseError`].
// `deny`, not `forbid`: the one exception is the prefetch hint in `prefetch` (measured on the fast
// path, docs/benchmarks.md), allowed on that one function.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod addr;
pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod icmp_error;
pub mod icmpv4;
pub mod icmpv6;
pub mod ipv4;
pub mod ipv6;
pub mod meta;
pub mod pcap;
pub mod prefetch;

pub mod reply;
pub mod rewrite;
pub mod sctp;
pub mod tcp;
pub mod udp;
pub mod verify;

mod field;
mod protocol;

pub use addr::{Addr, Family};
pub use icmp_error::{parse_quoted, rewrite_icmp_error, ErrorRewrite, Quoted};
pub use meta::{
    parse, parse_into, parse_plain_v4, Frag, PacketMeta, Parsed, PlainV4, PLAIN_V4_L3, PLAIN_V4_L4,
};
pub use protocol::IpProto;
pub use reply::{build_port_unreachable, build_tcp_rst};
pub use rewrite::{
    decrement_ttl, decrement_ttl_at, rewrite, rewrite_plain_v4, rewrite_plain_v4_from,
    rewrite_v4_ports,
};

/// Why a frame could not be parsed. Each variant names the first rule the frame broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParseError {
    /// The buffer ends before a header that must be there.
    Truncated,
    /// The IP version nibble does not match the EtherType / link type.
    BadVersion,
    /// IPv4 IHL < 5 or the header does not fit.
    BadHeaderLength,
    /// IPv4 total length (or IPv6 payload length) is larger than the frame or smaller than the header.
    BadTotalLength,
    /// TCP data offset < 5 or past the end of the segment.
    BadDataOffset,
    /// IPv6 extension-header chain is malformed (misplaced hop-by-hop, past the payload, too long).
    BadExtensionHeader,
    /// UDP length or SCTP chunk length inconsistent with the packet.
    BadLength,
}

impl core::fmt::Display for ParseError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            ParseError::Truncated => "truncated packet",
            ParseError::BadVersion => "bad IP version",
            ParseError::BadHeaderLength => "bad IPv4 header length",
            ParseError::BadTotalLength => "bad IP total length",
            ParseError::BadDataOffset => "bad TCP data offset",
            ParseError::BadExtensionHeader => "bad IPv6 extension header chain",
            ParseError::BadLength => "bad UDP/SCTP length",
        };
        f.write_str(s)
    }
}

impl std::error::Error for ParseError {}

/// Link-layer framing of a frame buffer (what precedes the IP header).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum LinkType {
    /// Ethernet II, optionally with 802.1Q / 802.1ad tags.
    Ethernet,
    /// No link header: the frame starts with the IP header (version from the first nibble).
    RawIp,
}

impl LinkType {
    /// Maps a pcap LINKTYPE_ code: 1 = Ethernet; 101 (RAW), 228 (IPV4), 229 (IPV6) = raw IP.
    pub fn from_pcap(code: u32) -> Option<LinkType> {
        match code {
            1 => Some(LinkType::Ethernet),
            101 | 228 | 229 => Some(LinkType::RawIp),
            _ => None,
        }
    }

    /// The pcap LINKTYPE_ code written for this link type (raw IP is written as 101).
    pub fn pcap_code(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::RawIp => 101,
        }
    }
}
