//! ICMPv4's numbers (RFC 792): message types and codes, and which types are errors. The
//! message itself, which ICMPv4 and ICMPv6 share, is [`crate::icmp`].

/// Message types.
pub mod types {
    /// Destination unreachable.
    pub const DEST_UNREACH: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 12;
}

/// Destination-unreachable code for "port unreachable".
pub const CODE_PORT_UNREACH: u8 = 3;

/// True for the error messages that quote an offending packet.
#[inline]
pub fn is_error(t: u8) -> bool {
    matches!(
        t,
        types::DEST_UNREACH | types::TIME_EXCEEDED | types::PARAM_PROBLEM
    )
}
