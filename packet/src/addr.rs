//! Addresses as the tables hold them: one 16-byte type for both families so that keys, maps and
//! conntrack entries have a single fixed layout; IPv4 is stored IPv4-mapped (`::ffff:a.b.c.d`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IP address: 16 bytes, IPv4 as IPv4-mapped IPv6. The family travels separately ([`Family`]).
#[derive(Clone, Copy, Eq, PartialOrd, Ord, Default)]
pub struct Addr(pub [u8; 16]);

// Compared and hashed as one 128-bit word: the derived byte-array versions compile to `memcmp`
// calls, which showed up at the top of the replay profile.
impl PartialEq for Addr {
    #[inline(always)]
    fn eq(&self, other: &Addr) -> bool {
        u128::from_ne_bytes(self.0) == u128::from_ne_bytes(other.0)
    }
}

impl std::hash::Hash for Addr {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(u128::from_ne_bytes(self.0));
    }
}

/// Address family, carried next to an [`Addr`] wherever both families may meet.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Family {
    /// IPv4.
    #[default]
    V4,
    /// IPv6.
    V6,
}

impl Addr {
    /// `::` (all zero).
    pub const UNSPECIFIED: Addr = Addr([0; 16]);

    /// IPv4 octets as `::ffff:a.b.c.d`.
    #[inline]
    pub const fn from_v4(o: [u8; 4]) -> Addr {
        // Built as one integer: byte-wise construction became byte stores that later wide loads
        // of the address could not forward from (seen in the replay profile).
        Addr(((0xffff_u128 << 32) | u32::from_be_bytes(o) as u128).to_be_bytes())
    }

    /// IPv6 octets as they are.
    #[inline]
    pub const fn from_v6(o: [u8; 16]) -> Addr {
        Addr(o)
    }

    /// From a std address (IPv4 becomes IPv4-mapped).
    #[inline]
    pub fn from_ip(ip: IpAddr) -> Addr {
        match ip {
            IpAddr::V4(v4) => Addr::from_v4(v4.octets()),
            IpAddr::V6(v6) => Addr(v6.octets()),
        }
    }

    /// To a std address of the given family (V4 takes the last 4 bytes).
    #[inline]
    pub fn to_ip(self, fam: Family) -> IpAddr {
        match fam {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(self.v4_octets())),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(self.0)),
        }
    }

    /// True for `::ffff:0:0/96`.
    #[inline]
    pub fn is_v4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// The last 4 bytes (the IPv4 address of an IPv4-mapped address).
    #[inline]
    pub fn v4_octets(&self) -> [u8; 4] {
        // One 4-byte load: byte by byte it was four loads and shifts per use (the NAT rewrite
        // uses it per packet).
        let mut o = [0u8; 4];
        o.copy_from_slice(&self.0[12..]);
        o
    }

    /// The address as a big-endian integer (for prefix arithmetic).
    #[inline]
    pub fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    /// The family an address most likely belongs to: V4 when IPv4-mapped.
    #[inline]
    pub fn family(&self) -> Family {
        if self.is_v4_mapped() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

impl From<IpAddr> for Addr {
    fn from(ip: IpAddr) -> Addr {
        Addr::from_ip(ip)
    }
}

impl From<Ipv4Addr> for Addr {
    fn from(ip: Ipv4Addr) -> Addr {
        Addr::from_v4(ip.octets())
    }
}

impl From<Ipv6Addr> for Addr {
    fn from(ip: Ipv6Addr) -> Addr {
        Addr(ip.octets())
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ip(self.family()), f)
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_mapped_roundtrip() {
        let a = Addr::from_v4([10, 0, 0, 1]);
        assert!(a.is_v4_mapped());
        assert_eq!(a.v4_octets(), [10, 0, 0, 1]);
        assert_eq!(a.to_string(), "10.0.0.1");
        assert_eq!(a, Addr::from_ip("10.0.0.1".parse().unwrap()));
        assert_eq!(a.to_ip(Family::V4), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(a.as_u128(), 0xffff_0a00_0001);
        assert_eq!(a.family(), Family::V4);
    }

    #[test]
    fn v6() {
        let ip: IpAddr = "fd00::1".parse().unwrap();
        let a = Addr::from_ip(ip);
        assert!(!a.is_v4_mapped());
        assert_eq!(format!("{a:?}"), "fd00::1");
        assert_eq!(a.to_ip(Family::V6), ip);
        assert_eq!(Addr::UNSPECIFIED.to_string(), "::");
        assert_eq!(Family::default(), Family::V4);
    }
}
