//! ICMPv4 messages (RFC 792): the 8-byte header (type, code, checksum, rest-of-header) and the body.
//! Echo identifiers are what NAT rewrites in place of ports.

use crate::addr::Addr;
use crate::checksum;
use crate::field::{get16, get32, set16, set32};
use crate::ParseError;

/// Header length (type, code, checksum, 4 bytes rest-of-header).
pub const HEADER_LEN: usize = 8;
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

/// Zero-copy view of an ICMP message (header + body).
#[derive(Debug, Clone)]
pub struct Message<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Message<T> {
    /// Wraps without checking. Prefer [`Message::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Message { buffer }
    }

    /// Wraps after checking the 8-byte header is present.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        Ok(Message { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Type.
    #[inline]
    pub fn msg_type(&self) -> u8 {
        self.b()[0]
    }

    /// Code.
    #[inline]
    pub fn code(&self) -> u8 {
        self.b()[1]
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        get16(self.b(), 2)
    }

    /// Rest-of-header word (unused / MTU / pointer for errors).
    #[inline]
    pub fn rest_of_header(&self) -> u32 {
        get32(self.b(), 4)
    }

    /// Echo identifier (meaningful for echo request/reply).
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        get16(self.b(), 4)
    }

    /// Echo sequence number.
    #[inline]
    pub fn echo_seq(&self) -> u16 {
        get16(self.b(), 6)
    }

    /// True for echo request / reply.
    #[inline]
    pub fn is_echo(&self) -> bool {
        matches!(self.msg_type(), types::ECHO_REQUEST | types::ECHO_REPLY)
    }

    /// Body after the header (the quoted packet for errors).
    pub fn data(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }

    /// True when the checksum over the message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.b(), 0)) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Message<T> {
    /// Sets the type.
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }

    /// Sets the code.
    pub fn set_code(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set16(self.buffer.as_mut(), 2, v)
    }

    /// Sets the rest-of-header word.
    pub fn set_rest_of_header(&mut self, v: u32) {
        set32(self.buffer.as_mut(), 4, v)
    }

    /// Sets the echo identifier (checksum not updated).
    #[inline]
    pub fn set_echo_ident(&mut self, v: u16) {
        set16(self.buffer.as_mut(), 4, v)
    }

    /// Sets the echo sequence number (checksum not updated).
    pub fn set_echo_seq(&mut self, v: u16) {
        set16(self.buffer.as_mut(), 6, v)
    }

    /// Recomputes the checksum over the whole buffer.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::fold(checksum::sum(self.buffer.as_ref(), 0));
        self.set_checksum(c);
    }
}

/// An ICMP header as plain values (the body is written by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Type.
    pub msg_type: u8,
    /// Code.
    pub code: u8,
    /// Rest-of-header word (echo: identifier << 16 | sequence).
    pub rest_of_header: u32,
}

impl Repr {
    /// Reads a checked message.
    pub fn parse<T: AsRef<[u8]>>(m: &Message<T>) -> Repr {
        Repr {
            msg_type: m.msg_type(),
            code: m.code(),
            rest_of_header: m.rest_of_header(),
        }
    }

    /// Always 8.
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header at the start of `msg` (body already in place) and fills the checksum over
    /// all of `msg`. `addrs` is unused for ICMPv4 (no pseudo-header) and kept for symmetry.
    pub fn emit(&self, msg: &mut [u8], _addrs: Option<(&Addr, &Addr)>) -> Result<(), ParseError> {
        if msg.len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let mut m = Message::new_unchecked(msg);
        m.set_msg_type(self.msg_type);
        m.set_code(self.code);
        m.set_rest_of_header(self.rest_of_header);
        m.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo() {
        let mut b = [0u8; 12];
        b[8..].copy_from_slice(b"ping");
        Repr {
            msg_type: types::ECHO_REQUEST,
            code: 0,
            rest_of_header: 0x1234_0001,
        }
        .emit(&mut b, None)
        .unwrap();
        let m = Message::new_checked(&b[..]).unwrap();
        assert!(m.verify_checksum() && m.is_echo());
        assert_eq!(
            (m.echo_ident(), m.echo_seq(), m.data()),
            (0x1234, 1, &b"ping"[..])
        );
        assert!(!is_error(m.msg_type()) && is_error(types::DEST_UNREACH));
        assert!(Message::new_checked(&b[..7]).is_err());
    }
}
