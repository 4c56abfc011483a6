//! UDP header (RFC 768). `new_checked` enforces 8 <= length field <= buffer.

use crate::addr::{Addr, Family};
use crate::checksum;
use crate::field::{get16, set16};
use crate::{IpProto, ParseError};

/// Header length.
pub const HEADER_LEN: usize = 8;

/// Byte offsets of the header's fields (each named once).
pub mod field {
    /// Source port.
    pub const SRC_PORT: usize = 0;
    /// Destination port.
    pub const DST_PORT: usize = 2;
    /// Length (header and payload).
    pub const LEN: usize = 4;
    /// Checksum (0: none, IPv4 only).
    pub const CHECKSUM: usize = 6;
}

/// Zero-copy view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct Datagram<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Datagram<T> {
    /// Wraps without checking. Prefer [`Datagram::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Datagram { buffer }
    }

    /// Wraps after validating the length field against the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let l = get16(b, field::LEN) as usize;
        if l < HEADER_LEN || l > b.len() {
            return Err(ParseError::BadLength);
        }
        Ok(Datagram { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        get16(self.b(), field::SRC_PORT)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        get16(self.b(), field::DST_PORT)
    }

    /// Length field (header + payload).
    #[inline]
    pub fn len(&self) -> u16 {
        get16(self.b(), field::LEN)
    }

    /// True when the length field says there is no payload.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() as usize <= HEADER_LEN
    }

    /// Checksum field (0 = none, IPv4 only).
    #[inline]
    pub fn checksum(&self) -> u16 {
        get16(self.b(), field::CHECKSUM)
    }

    /// Payload (up to the length field).
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.len() as usize]
    }

    /// True when the checksum verifies (or is absent over IPv4).
    pub fn verify_checksum(&self, src: &Addr, dst: &Addr, fam: Family) -> bool {
        if fam == Family::V4 && self.checksum() == 0 {
            return true;
        }
        checksum::l4_checksum(
            src,
            dst,
            fam,
            IpProto::UDP,
            &self.b()[..self.len() as usize],
        ) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Datagram<T> {
    #[inline]
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        set16(self.bm(), field::SRC_PORT, v)
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        set16(self.bm(), field::DST_PORT, v)
    }

    /// Sets the length field.
    pub fn set_len(&mut self, v: u16) {
        set16(self.bm(), field::LEN, v)
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set16(self.bm(), field::CHECKSUM, v)
    }

    /// Recomputes the checksum (a computed 0 is sent as 0xffff, RFC 768).
    pub fn fill_checksum(&mut self, src: &Addr, dst: &Addr, fam: Family) {
        self.set_checksum(0);
        let l = (self.len() as usize).min(self.b().len());
        let c = checksum::l4_checksum(src, dst, fam, IpProto::UDP, &self.b()[..l]);
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }
}

/// A UDP header as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length.
    pub payload_len: usize,
}

impl Repr {
    /// Reads a checked datagram.
    pub fn parse<T: AsRef<[u8]>>(d: &Datagram<T>) -> Repr {
        Repr {
            src_port: d.src_port(),
            dst_port: d.dst_port(),
            payload_len: d.payload().len(),
        }
    }

    /// Always 8.
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header at the start of `dgram` (header + payload already in place) and fills the
    /// checksum (`None` for the IPv4 "no checksum" zero).
    pub fn emit(
        &self,
        dgram: &mut [u8],
        addrs: Option<(&Addr, &Addr, Family)>,
    ) -> Result<(), ParseError> {
        let total = HEADER_LEN + self.payload_len;
        if dgram.len() < total || total > 0xffff {
            return Err(ParseError::Truncated);
        }
        let mut d = Datagram::new_unchecked(&mut dgram[..total]);
        d.set_src_port(self.src_port);
        d.set_dst_port(self.dst_port);
        d.set_len(total as u16);
        match addrs {
            Some((s, t, f)) => d.fill_checksum(s, t, f),
            None => d.set_checksum(0),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let (a, b) = (Addr::from_v6([1; 16]), Addr::from_v6([2; 16]));
        let mut buf = [0u8; 12];
        let r = Repr {
            src_port: 53,
            dst_port: 1000,
            payload_len: 4,
        };
        r.emit(&mut buf, Some((&a, &b, Family::V6))).unwrap();
        let d = Datagram::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&d), r);
        assert!(d.verify_checksum(&a, &b, Family::V6));
        assert!(!d.is_empty());
        buf[5] = 7;
        assert_eq!(
            Datagram::new_checked(&buf[..]).err(),
            Some(ParseError::BadLength)
        );
        buf[5] = 13;
        assert_eq!(
            Datagram::new_checked(&buf[..]).err(),
            Some(ParseError::BadLength)
        );
    }
}
