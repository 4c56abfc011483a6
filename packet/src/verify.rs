//! Verification of a parsed packet's checksums (tests, tooling, `kxdp pcap gen`): the IPv4
//! header's and the transport's, each by the protocol's own rule. Apart from `checksum` (the
//! arithmetic) because it reads the parsed metadata and the protocols' fields, which themselves
//! use that arithmetic.

use crate::addr::Family;
use crate::checksum::{fold, pseudo_header, sum};
use crate::field::get16;
use crate::meta::PacketMeta;
use crate::udp;
use crate::IpProto;

/// A checksum that does not verify, or a meta that does not match the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChecksumError {
    /// The frame is shorter than `meta` says.
    Truncated,
    /// IPv4 header checksum is wrong.
    Ipv4Header,
    /// Transport checksum (TCP, UDP, SCTP CRC32c, ICMP, ICMPv6; protocol number inside) is wrong.
    L4(IpProto),
}

impl core::fmt::Display for ChecksumError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ChecksumError::Truncated => f.write_str("frame shorter than its headers say"),
            ChecksumError::Ipv4Header => f.write_str("bad IPv4 header checksum"),
            ChecksumError::L4(p) => write!(f, "bad checksum for IP protocol {}", p.0),
        }
    }
}

impl std::error::Error for ChecksumError {}

/// Verifies the IPv4 header checksum and the L4 checksum of a parsed packet (for tests and
/// tooling). The L4 checksum of a fragment is not verifiable alone and is skipped.
pub fn checksums(frame: &[u8], meta: &PacketMeta) -> Result<(), ChecksumError> {
    let l3 = meta.l3_off as usize;
    let ip_end = l3 + meta.ip_len as usize;
    if ip_end > frame.len() {
        return Err(ChecksumError::Truncated);
    }
    let ip = &frame[l3..ip_end];
    if meta.family == Family::V4 {
        if ip.is_empty() {
            return Err(ChecksumError::Truncated);
        }
        let hl = ((ip[0] & 0x0f) as usize) * 4;
        if hl < 20 || hl > ip.len() {
            return Err(ChecksumError::Truncated);
        }
        if fold(sum(&ip[..hl], 0)) != 0 {
            return Err(ChecksumError::Ipv4Header);
        }
    }
    let l4_off = meta.l4_off as usize;
    if l4_off == 0 || meta.frag.is_fragment {
        return Ok(());
    }
    if l4_off > ip_end {
        return Err(ChecksumError::Truncated);
    }
    let l4 = &frame[l4_off..ip_end];
    let bad = ChecksumError::L4(meta.proto);
    let ok = match meta.proto {
        // The pseudo-header covers the whole segment (TCP) or message (ICMPv6).
        IpProto::TCP | IpProto::ICMPV6 => {
            fold(sum(
                l4,
                pseudo_header(
                    &meta.src,
                    &meta.dst,
                    meta.family,
                    meta.proto,
                    l4.len() as u32,
                ),
            )) == 0
        }
        IpProto::UDP => {
            if l4.len() < 8 {
                return Err(ChecksumError::Truncated);
            }
            let ulen = get16(l4, udp::field::LEN) as usize;
            if ulen < 8 || ulen > l4.len() {
                return Err(ChecksumError::Truncated);
            }
            if meta.family == Family::V4 && get16(l4, udp::field::CHECKSUM) == 0 {
                true
            } else {
                let ph =
                    pseudo_header(&meta.src, &meta.dst, meta.family, IpProto::UDP, ulen as u32);
                fold(sum(&l4[..ulen], ph)) == 0
            }
        }
        IpProto::SCTP => {
            if l4.len() < 12 {
                return Err(ChecksumError::Truncated);
            }
            let stored = u32::from_le_bytes([l4[8], l4[9], l4[10], l4[11]]);
            stored == crate::sctp::checksum_of(l4)
        }
        IpProto::ICMP => fold(sum(l4, 0)) == 0,
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(bad)
    }
}
