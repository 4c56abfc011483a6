//! ICMPv6's numbers (RFC 4443): message types and codes, and which types are errors. The
//! message itself, which ICMPv4 and ICMPv6 share, is [`crate::icmp`].

/// Message types.
pub mod types {
    /// Destination unreachable.
    pub const DEST_UNREACH: u8 = 1;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 4;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
}

/// Destination-unreachable code for "port unreachable".
pub const CODE_PORT_UNREACH: u8 = 4;

/// True for the error messages that quote an offending packet.
#[inline]
pub fn is_error(t: u8) -> bool {
    matches!(
        t,
        types::DEST_UNREACH | types::PACKET_TOO_BIG | types::TIME_EXCEEDED | types::PARAM_PROBLEM
    )
}
