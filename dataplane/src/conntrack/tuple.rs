//! A connection's 5-tuple in one direction, and its packed form as the table stores it.

use std::fmt;

use kxdp_packet::{Addr, Family, IpProto, PacketMeta};

/// One direction of a connection. For ICMP echo both ports carry the identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Tuple {
    pub src: Addr,
    pub dst: Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: IpProto,
    pub family: Family,
}

impl Tuple {
    #[inline]
    pub fn from_meta(m: &PacketMeta) -> Tuple {
        Tuple {
            src: m.src,
            dst: m.dst,
            sport: m.sport,
            dport: m.dport,
            proto: m.proto,
            family: m.family,
        }
    }

    /// The reply to packet `m` once its destination is translated to the backend at
    /// `addr`:`port` (before any masquerade): from the backend back to the client.
    #[inline]
    pub fn reply_from_backend(m: &PacketMeta, addr: Addr, port: u16) -> Tuple {
        Tuple {
            src: addr,
            dst: m.src,
            sport: port,
            dport: m.sport,
            proto: m.proto,
            family: m.family,
        }
    }

    /// The tuple of a packet travelling the other way.
    #[inline]
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
            family: self.family,
        }
    }

    /// Five machine words: compared and hashed as a whole, stored in atomics. The last uses 41
    /// bits (ports, protocol, family).
    #[inline]
    pub fn pack(&self) -> Packed {
        let s = self.src.as_u128();
        let d = self.dst.as_u128();
        // The family is one bit (40): the table keeps other fields above it (`table::KEY_BITS`).
        let fam = match self.family {
            Family::V4 => 0u64,
            Family::V6 => 1u64,
        };
        [
            (s >> 64) as u64,
            s as u64,
            (d >> 64) as u64,
            d as u64,
            self.sport as u64 | (self.dport as u64) << 16 | (self.proto.0 as u64) << 32 | fam << 40,
        ]
    }

    /// `pack` of an IPv4 tuple from its addresses as numbers (`u32::from_be_bytes` of the
    /// octets, as `kxdp_packet::parse_plain_v4` reads them): the v4-mapped words directly.
    #[inline(always)]
    pub fn pack_v4(src: u32, dst: u32, sport: u16, dport: u16, proto: IpProto) -> Packed {
        const MAPPED: u64 = 0xffff << 32;
        [
            0,
            MAPPED | src as u64,
            0,
            MAPPED | dst as u64,
            sport as u64 | (dport as u64) << 16 | (proto.0 as u64) << 32,
        ]
    }

    #[inline]
    pub fn unpack(p: &Packed) -> Tuple {
        let s = (p[0] as u128) << 64 | p[1] as u128;
        let d = (p[2] as u128) << 64 | p[3] as u128;
        Tuple {
            src: Addr(s.to_be_bytes()),
            dst: Addr(d.to_be_bytes()),
            sport: p[4] as u16,
            dport: (p[4] >> 16) as u16,
            proto: packed_proto(p),
            family: if (p[4] >> 40) & 1 == 1 {
                Family::V6
            } else {
                Family::V4
            },
        }
    }

    /// Formats `addr:port` as the verdict and conntrack listings do (`[v6]:port`; no port for
    /// protocols without ports).
    pub fn endpoint(addr: &Addr, port: u16, family: Family, proto: IpProto) -> String {
        let ip = addr.to_ip(family);
        if proto.has_ports() {
            match ip {
                std::net::IpAddr::V4(a) => format!("{a}:{port}"),
                std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
            }
        } else {
            ip.to_string()
        }
    }
}

impl fmt::Debug for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} -> {}",
            self.proto.0,
            Tuple::endpoint(&self.src, self.sport, self.family, IpProto::TCP),
            Tuple::endpoint(&self.dst, self.dport, self.family, IpProto::TCP)
        )
    }
}

pub type Packed = [u64; 5];

/// The IP protocol of a packed tuple (`Tuple::pack`'s last word, bits 32..40).
#[inline(always)]
pub fn packed_proto(p: &Packed) -> IpProto {
    IpProto((p[4] >> 32) as u8)
}

/// A packed tuple's addresses' low 32 bits in one word, the source's above: all of an IPv4
/// tuple's addresses (the conntrack entry keeps them so, and the fast lane compares them so).
#[inline(always)]
pub fn addr_word(p: &Packed) -> u64 {
    (p[1] as u32 as u64) << 32 | p[3] as u32 as u64
}

/// A keyed hash of a packed tuple (folded multiply, as in wyhash): fast, and seeded per table so
/// that nobody can aim tuples at one probe chain.
#[inline]
pub fn hash_packed(p: &Packed, seed: u64) -> u64 {
    #[inline]
    fn mix(a: u64, b: u64) -> u64 {
        let r = (a as u128).wrapping_mul(b as u128);
        (r as u64) ^ ((r >> 64) as u64)
    }
    const K0: u64 = 0xa076_1d64_78bd_642f;
    const K1: u64 = 0xe703_7ed1_a0b4_28db;
    const K2: u64 = 0x8ebc_6af0_9c88_c6e3;
    if p[4] >> 40 & 1 == 0 {
        // IPv4: the key's 13 bytes are two words (the other three are the mapped prefix), so
        // two multiplies rather than four (wyhash's 16-byte case). The conntrack index is
        // rebuilt on every start (`Table::rebuild`), so no file keeps these values.
        return mix(mix(addr_word(p) ^ K0 ^ seed, p[4] ^ K1) ^ seed, K2);
    }
    let a = mix(p[0] ^ K0 ^ seed, p[1] ^ K1);
    let b = mix(p[2] ^ K2 ^ seed, p[3] ^ K0);
    let c = mix(p[4] ^ K1, a ^ b ^ K2);
    mix(c ^ seed, K0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_v4_is_pack() {
        for (src, dst, sport, dport, proto) in [
            ([10, 0, 1, 1], [172, 30, 0, 41], 40000, 80, IpProto::TCP),
            ([0, 0, 0, 0], [255, 255, 255, 255], 0, 65535, IpProto::UDP),
            ([192, 168, 255, 1], [1, 2, 3, 4], 65535, 0, IpProto::TCP),
        ] {
            let t = Tuple {
                src: Addr::from_v4(src),
                dst: Addr::from_v4(dst),
                sport,
                dport,
                proto,
                family: Family::V4,
            };
            let words = |o: [u8; 4]| u32::from_be_bytes(o);
            assert_eq!(
                Tuple::pack_v4(words(src), words(dst), sport, dport, proto),
                t.pack()
            );
        }
    }

    #[test]
    fn pack_roundtrip_both_families() {
        let t4 = Tuple {
            src: Addr::from_v4([10, 0, 1, 1]),
            dst: Addr::from_v4([172, 30, 0, 41]),
            sport: 40000,
            dport: 80,
            proto: IpProto::TCP,
            family: Family::V4,
        };
        assert_eq!(Tuple::unpack(&t4.pack()), t4);
        let mut o = [0u8; 16];
        o[0] = 0xfd;
        o[15] = 7;
        let t6 = Tuple {
            src: Addr::from_v6(o),
            dst: Addr::from_v6([0xff; 16]),
            sport: 1,
            dport: 65535,
            proto: IpProto::SCTP,
            family: Family::V6,
        };
        assert_eq!(Tuple::unpack(&t6.pack()), t6);
        assert_ne!(
            hash_packed(&t4.pack(), 1),
            hash_packed(&t4.reversed().pack(), 1)
        );
    }
}
