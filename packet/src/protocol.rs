//! IP protocol numbers: the IPv4 Protocol field and the transport's IPv6 Next Header.
//!
//! [`IpProto`] is the one vocabulary of protocols across the crates: its constants, its name as
//! verdicts, listings and Kubernetes spell it, and whether it has ports. The fields that carry a
//! protocol on the fast path (`PacketMeta::proto`, conntrack tuples, verdicts) stay a byte, as
//! it sits in the header and in the packed keys; [`proto`](crate::proto) names the same numbers
//! as bytes for matching on those fields.

/// An IP protocol number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct IpProto(pub u8);

impl IpProto {
    /// ICMP (IPv4).
    pub const ICMP: IpProto = IpProto(1);
    /// TCP.
    pub const TCP: IpProto = IpProto(6);
    /// UDP.
    pub const UDP: IpProto = IpProto(17);
    /// ICMPv6.
    pub const ICMPV6: IpProto = IpProto(58);
    /// SCTP.
    pub const SCTP: IpProto = IpProto(132);

    /// The name verdicts, listings and Kubernetes objects use (`TCP`, `UDP`, `SCTP`, `ICMP`,
    /// `ICMPv6`); None for other numbers.
    pub const fn name(self) -> Option<&'static str> {
        match self {
            IpProto::TCP => Some("TCP"),
            IpProto::UDP => Some("UDP"),
            IpProto::SCTP => Some("SCTP"),
            IpProto::ICMP => Some("ICMP"),
            IpProto::ICMPV6 => Some("ICMPv6"),
            _ => None,
        }
    }

    /// The transport a Service or NetworkPolicy port names (`TCP`, `UDP`, `SCTP`, as Kubernetes
    /// spells them); None for anything else.
    pub fn from_port_protocol(name: &str) -> Option<IpProto> {
        match name {
            "TCP" => Some(IpProto::TCP),
            "UDP" => Some(IpProto::UDP),
            "SCTP" => Some(IpProto::SCTP),
            _ => None,
        }
    }

    /// Whether the protocol's header starts with source and destination ports (TCP, UDP, SCTP):
    /// the ones NAT rewrites and connections are keyed by.
    #[inline(always)]
    pub const fn has_ports(self) -> bool {
        matches!(self, IpProto::TCP | IpProto::UDP | IpProto::SCTP)
    }
}

impl From<u8> for IpProto {
    #[inline(always)]
    fn from(p: u8) -> IpProto {
        IpProto(p)
    }
}

impl From<IpProto> for u8 {
    #[inline(always)]
    fn from(p: IpProto) -> u8 {
        p.0
    }
}

impl core::fmt::Display for IpProto {
    /// The name, else the number.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}

/// [`IpProto`]'s numbers as bytes, for matching on the fields that hold a protocol byte.
pub mod proto {
    use super::IpProto;

    /// ICMP (IPv4).
    pub const ICMP: u8 = IpProto::ICMP.0;
    /// TCP.
    pub const TCP: u8 = IpProto::TCP.0;
    /// UDP.
    pub const UDP: u8 = IpProto::UDP.0;
    /// ICMPv6.
    pub const ICMPV6: u8 = IpProto::ICMPV6.0;
    /// SCTP.
    pub const SCTP: u8 = IpProto::SCTP.0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ports() {
        assert_eq!(IpProto::TCP.name(), Some("TCP"));
        assert_eq!(IpProto::ICMPV6.to_string(), "ICMPv6");
        assert_eq!(IpProto(47).to_string(), "47");
        assert!(IpProto::SCTP.has_ports() && !IpProto::ICMP.has_ports());
        assert_eq!(IpProto::from_port_protocol("UDP"), Some(IpProto::UDP));
        assert_eq!(IpProto::from_port_protocol("ICMP"), None);
        assert_eq!(proto::TCP, 6);
    }
}
