//! IP protocol numbers: the IPv4 Protocol field and the transport's IPv6 Next Header.
//!
//! [`IpProto`] is the one type of a protocol across the crates: the parsed packet
//! (`PacketMeta::proto`), conntrack tuples, verdicts, frontends and policy ports all carry it,
//! and its constants are matched on directly (they are patterns). It is a `repr(transparent)`
//! byte, so it costs what the byte did; the byte itself (`.0`, `u8::from`) appears only where
//! a protocol is read from or written into a header, packed into a conntrack key, or stored in
//! a file or wire format.

/// An IP protocol number.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

    /// The protocol [`IpProto::name`] gives `name` (exactly as spelt there); None for any other
    /// name.
    pub fn from_name(name: &str) -> Option<IpProto> {
        match name {
            "TCP" => Some(IpProto::TCP),
            "UDP" => Some(IpProto::UDP),
            "SCTP" => Some(IpProto::SCTP),
            "ICMP" => Some(IpProto::ICMP),
            "ICMPv6" => Some(IpProto::ICMPV6),
            _ => None,
        }
    }

    /// The transport a Service or NetworkPolicy port names (`TCP`, `UDP`, `SCTP`, as Kubernetes
    /// spells them); None for anything else.
    pub fn from_port_protocol(name: &str) -> Option<IpProto> {
        IpProto::from_name(name).filter(|p| p.has_ports())
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

impl core::fmt::Debug for IpProto {
    /// The number, as the byte it stands for: the `Debug` of a struct holding one (a frontend
    /// key, a tuple, a verdict) reads as it did when the field was a `u8`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(&self.0, f)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ports() {
        assert_eq!(IpProto::TCP.name(), Some("TCP"));
        assert_eq!(IpProto::ICMPV6.to_string(), "ICMPv6");
        assert_eq!(IpProto(47).to_string(), "47");
        assert_eq!(format!("{:?}", IpProto::TCP), "6");
        assert!(IpProto::SCTP.has_ports() && !IpProto::ICMP.has_ports());
        assert_eq!(IpProto::from_port_protocol("UDP"), Some(IpProto::UDP));
        assert_eq!(IpProto::from_port_protocol("ICMP"), None);
        for p in [1, 6, 17, 58, 132, 47].map(IpProto) {
            assert_eq!(p.name().and_then(IpProto::from_name), p.name().map(|_| p));
        }
        assert_eq!(IpProto::from_name("tcp"), None);
        assert_eq!(u8::from(IpProto::TCP), 6);
    }
}
