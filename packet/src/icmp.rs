//! What ICMPv4 (RFC 792) and ICMPv6 (RFC 4443) messages share: an 8-byte header (type, code,
//! checksum, a rest-of-header word that an echo splits into identifier and sequence number),
//! then the body, which an error fills with the packet it quotes. One view serves both
//! versions; what differs lives in [`crate::icmpv4`] and [`crate::icmpv6`] (the type and code
//! numbers) and in the checksum, which for ICMPv6 covers the IPv6 pseudo-header as TCP's and
//! UDP's do and for ICMPv4 covers the message alone. Echo identifiers are what NAT rewrites in
//! place of ports.

use crate::addr::{Addr, Family};
use crate::checksum;
use crate::field::{get16, get32, set16, set32};
use crate::{icmpv4, icmpv6, IpProto, ParseError};

/// Header length (type, code, checksum, 4 bytes rest-of-header).
pub const HEADER_LEN: usize = 8;

/// Field offsets, named once.
pub mod field {
    /// Message type.
    pub const TYPE: usize = 0;
    /// Code.
    pub const CODE: usize = 1;
    /// Checksum.
    pub const CHECKSUM: usize = 2;
    /// Rest-of-header word (unused, MTU or pointer for errors).
    pub const REST_OF_HEADER: usize = 4;
    /// An echo's identifier (the rest-of-header word's first half).
    pub const ECHO_IDENT: usize = 4;
    /// An echo's sequence number.
    pub const ECHO_SEQ: usize = 6;
}

/// True for an echo request or reply of `family`'s ICMP.
#[inline]
pub fn is_echo(family: Family, msg_type: u8) -> bool {
    match family {
        Family::V4 => matches!(
            msg_type,
            icmpv4::types::ECHO_REQUEST | icmpv4::types::ECHO_REPLY
        ),
        Family::V6 => matches!(
            msg_type,
            icmpv6::types::ECHO_REQUEST | icmpv6::types::ECHO_REPLY
        ),
    }
}

/// True for the error messages of `family`'s ICMP, which quote an offending packet.
#[inline]
pub fn is_error(family: Family, msg_type: u8) -> bool {
    match family {
        Family::V4 => icmpv4::is_error(msg_type),
        Family::V6 => icmpv6::is_error(msg_type),
    }
}

/// The message's checksum over `b` (checksum field included): ICMPv6's covers the pseudo-header
/// of `src` and `dst`, ICMPv4's the message alone.
fn checksum_of(b: &[u8], src: &Addr, dst: &Addr, family: Family) -> u16 {
    match family {
        Family::V4 => checksum::fold(checksum::sum(b, 0)),
        Family::V6 => checksum::l4_checksum(src, dst, family, IpProto::ICMPV6, b),
    }
}

/// Zero-copy view of an ICMP or ICMPv6 message (header + body).
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
        self.b()[field::TYPE]
    }

    /// Code.
    #[inline]
    pub fn code(&self) -> u8 {
        self.b()[field::CODE]
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        get16(self.b(), field::CHECKSUM)
    }

    /// Rest-of-header word (unused / MTU / pointer for errors).
    #[inline]
    pub fn rest_of_header(&self) -> u32 {
        get32(self.b(), field::REST_OF_HEADER)
    }

    /// Echo identifier (meaningful for echo request/reply).
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        get16(self.b(), field::ECHO_IDENT)
    }

    /// Echo sequence number.
    #[inline]
    pub fn echo_seq(&self) -> u16 {
        get16(self.b(), field::ECHO_SEQ)
    }

    /// Body after the header (the quoted packet for errors).
    pub fn data(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }

    /// True when the checksum verifies (`src` and `dst` count for ICMPv6 only).
    pub fn verify_checksum(&self, src: &Addr, dst: &Addr, family: Family) -> bool {
        checksum_of(self.b(), src, dst, family) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Message<T> {
    /// Sets the type.
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }

    /// Sets the code.
    pub fn set_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::CODE] = v;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set16(self.buffer.as_mut(), field::CHECKSUM, v)
    }

    /// Sets the rest-of-header word.
    pub fn set_rest_of_header(&mut self, v: u32) {
        set32(self.buffer.as_mut(), field::REST_OF_HEADER, v)
    }

    /// Sets the echo identifier (checksum not updated).
    #[inline]
    pub fn set_echo_ident(&mut self, v: u16) {
        set16(self.buffer.as_mut(), field::ECHO_IDENT, v)
    }

    /// Sets the echo sequence number (checksum not updated).
    pub fn set_echo_seq(&mut self, v: u16) {
        set16(self.buffer.as_mut(), field::ECHO_SEQ, v)
    }

    /// Recomputes the checksum over the whole buffer (`src` and `dst` count for ICMPv6 only).
    pub fn fill_checksum(&mut self, src: &Addr, dst: &Addr, family: Family) {
        self.set_checksum(0);
        let c = checksum_of(self.buffer.as_ref(), src, dst, family);
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

    /// Writes the header at the start of `msg` (body already in place) and fills the checksum
    /// over all of `msg`, with the pseudo-header of `src` and `dst` for ICMPv6.
    pub fn emit(
        &self,
        msg: &mut [u8],
        src: &Addr,
        dst: &Addr,
        family: Family,
    ) -> Result<(), ParseError> {
        let mut m = Message::new_checked(msg)?;
        m.set_msg_type(self.msg_type);
        m.set_code(self.code);
        m.set_rest_of_header(self.rest_of_header);
        m.fill_checksum(src, dst, family);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_v4() {
        let none = Addr::UNSPECIFIED;
        let mut b = [0u8; 12];
        b[8..].copy_from_slice(b"ping");
        Repr {
            msg_type: icmpv4::types::ECHO_REQUEST,
            code: 0,
            rest_of_header: 0x1234_0001,
        }
        .emit(&mut b, &none, &none, Family::V4)
        .unwrap();
        let m = Message::new_checked(&b[..]).unwrap();
        // ICMPv4's checksum covers no pseudo-header: any addresses verify.
        let other = Addr::from_v4([10, 0, 0, 1]);
        assert!(m.verify_checksum(&other, &other, Family::V4));
        assert!(is_echo(Family::V4, m.msg_type()) && !is_echo(Family::V6, m.msg_type()));
        assert_eq!(
            (m.echo_ident(), m.echo_seq(), m.data()),
            (0x1234, 1, &b"ping"[..])
        );
        assert!(!is_error(Family::V4, m.msg_type()));
        assert!(is_error(Family::V4, icmpv4::types::DEST_UNREACH));
        assert!(Message::new_checked(&b[..7]).is_err());
    }

    #[test]
    fn echo_v6() {
        let (s, d) = (Addr::from_v6([1; 16]), Addr::from_v6([2; 16]));
        let mut b = [0u8; 13];
        Repr {
            msg_type: icmpv6::types::ECHO_REPLY,
            code: 0,
            rest_of_header: 0xbeef_0002,
        }
        .emit(&mut b, &s, &d, Family::V6)
        .unwrap();
        let m = Message::new_checked(&b[..]).unwrap();
        assert!(m.verify_checksum(&s, &d, Family::V6) && !m.verify_checksum(&d, &d, Family::V6));
        assert!(is_echo(Family::V6, m.msg_type()));
        assert_eq!((m.echo_ident(), m.echo_seq()), (0xbeef, 2));
        assert!(is_error(Family::V6, icmpv6::types::PACKET_TOO_BIG));
    }
}
