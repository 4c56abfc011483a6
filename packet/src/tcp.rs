//! TCP header (RFC 9293). `new_checked` enforces data offset >= 5 and within the segment.

use crate::addr::{Addr, Family};
use crate::checksum;
use crate::field::{get16, get32, set16, set32};
use crate::{IpProto, ParseError};

/// Header length without options.
pub const MIN_HEADER_LEN: usize = 20;

/// Byte offsets of the header's fields (each named once).
pub mod field {
    /// Source port.
    pub const SRC_PORT: usize = 0;
    /// Destination port.
    pub const DST_PORT: usize = 2;
    /// Sequence number.
    pub const SEQ: usize = 4;
    /// Acknowledgment number.
    pub const ACK: usize = 8;
    /// Data offset (high nibble, in 32-bit words).
    pub const DATA_OFF: usize = 12;
    /// Flags (`flags`).
    pub const FLAGS: usize = 13;
    /// Window.
    pub const WINDOW: usize = 14;
    /// Checksum.
    pub const CHECKSUM: usize = 16;
    /// Urgent pointer.
    pub const URGENT: usize = 18;
}

/// Flag bits of the flags byte (offset 13).
pub mod flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
}

/// Validates a segment; returns its header length.
#[inline]
pub(crate) fn check(b: &[u8]) -> Result<usize, ParseError> {
    if b.len() < MIN_HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    let hl = ((b[field::DATA_OFF] >> 4) as usize) * 4;
    if hl < MIN_HEADER_LEN || hl > b.len() {
        return Err(ParseError::BadDataOffset);
    }
    Ok(hl)
}

/// Zero-copy view of a TCP segment (the buffer is the whole segment: header + payload).
#[derive(Debug, Clone)]
pub struct Segment<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Segment<T> {
    /// Wraps without checking. Prefer [`Segment::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Segment { buffer }
    }

    /// Wraps after validating the data offset.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        check(buffer.as_ref())?;
        Ok(Segment { buffer })
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

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        get32(self.b(), field::SEQ)
    }

    /// Acknowledgement number.
    #[inline]
    pub fn ack_number(&self) -> u32 {
        get32(self.b(), field::ACK)
    }

    /// Header length in bytes (data offset * 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.b()[field::DATA_OFF] >> 4) as usize) * 4
    }

    /// Flags byte (see [`flags`]).
    #[inline]
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }

    /// SYN set.
    #[inline]
    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
    }

    /// FIN set.
    #[inline]
    pub fn fin(&self) -> bool {
        self.flags() & flags::FIN != 0
    }

    /// RST set.
    #[inline]
    pub fn rst(&self) -> bool {
        self.flags() & flags::RST != 0
    }

    /// ACK set.
    #[inline]
    pub fn ack(&self) -> bool {
        self.flags() & flags::ACK != 0
    }

    /// Window.
    #[inline]
    pub fn window(&self) -> u16 {
        get16(self.b(), field::WINDOW)
    }

    /// Checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        get16(self.b(), field::CHECKSUM)
    }

    /// Urgent pointer.
    #[inline]
    pub fn urgent(&self) -> u16 {
        get16(self.b(), field::URGENT)
    }

    /// Options.
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }

    /// Payload.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }

    /// Sequence space the segment occupies: payload + SYN + FIN.
    pub fn segment_len(&self) -> u32 {
        self.payload().len() as u32 + self.syn() as u32 + self.fin() as u32
    }

    /// True when the checksum verifies under the given pseudo-header addresses.
    pub fn verify_checksum(&self, src: &Addr, dst: &Addr, fam: Family) -> bool {
        checksum::l4_checksum(src, dst, fam, IpProto::TCP, self.b()) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Segment<T> {
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

    /// Sets the sequence number.
    pub fn set_seq_number(&mut self, v: u32) {
        set32(self.bm(), 4, v)
    }

    /// Sets the acknowledgement number.
    pub fn set_ack_number(&mut self, v: u32) {
        set32(self.bm(), 8, v)
    }

    /// Sets the header length in bytes (multiple of 4).
    pub fn set_header_len(&mut self, hl: usize) {
        self.bm()[field::DATA_OFF] = ((hl / 4) as u8) << 4;
    }

    /// Sets the flags byte.
    pub fn set_flags(&mut self, f: u8) {
        self.bm()[field::FLAGS] = f;
    }

    /// Sets the window.
    pub fn set_window(&mut self, v: u16) {
        set16(self.bm(), field::WINDOW, v)
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set16(self.bm(), field::CHECKSUM, v)
    }

    /// Sets the urgent pointer.
    pub fn set_urgent(&mut self, v: u16) {
        set16(self.bm(), field::URGENT, v)
    }

    /// Recomputes the checksum over the whole buffer from scratch.
    pub fn fill_checksum(&mut self, src: &Addr, dst: &Addr, fam: Family) {
        self.set_checksum(0);
        let c = checksum::l4_checksum(src, dst, fam, IpProto::TCP, self.b());
        self.set_checksum(c);
    }
}

/// A TCP header without options, as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq_number: u32,
    /// Acknowledgement number.
    pub ack_number: u32,
    /// Flags byte.
    pub flags: u8,
    /// Window.
    pub window: u16,
}

impl Repr {
    /// Reads the fields of a checked segment.
    pub fn parse<T: AsRef<[u8]>>(s: &Segment<T>) -> Repr {
        Repr {
            src_port: s.src_port(),
            dst_port: s.dst_port(),
            seq_number: s.seq_number(),
            ack_number: s.ack_number(),
            flags: s.flags(),
            window: s.window(),
        }
    }

    /// Always 20.
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN
    }

    /// Writes a 20-byte header at the start of `seg` (the whole segment: header + payload) and
    /// fills the checksum over all of `seg`.
    pub fn emit(
        &self,
        seg: &mut [u8],
        src: &Addr,
        dst: &Addr,
        fam: Family,
    ) -> Result<(), ParseError> {
        if seg.len() < MIN_HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let mut s = Segment::new_unchecked(seg);
        s.set_src_port(self.src_port);
        s.set_dst_port(self.dst_port);
        s.set_seq_number(self.seq_number);
        s.set_ack_number(self.ack_number);
        s.set_header_len(MIN_HEADER_LEN);
        s.set_flags(self.flags);
        s.set_window(self.window);
        s.set_urgent(0);
        s.fill_checksum(src, dst, fam);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_checks() {
        let r = Repr {
            src_port: 1,
            dst_port: 2,
            seq_number: 3,
            ack_number: 4,
            flags: flags::SYN | flags::FIN,
            window: 5,
        };
        let (a, b) = (Addr::from_v4([1, 1, 1, 1]), Addr::from_v4([2, 2, 2, 2]));
        let mut buf = [0u8; 23];
        r.emit(&mut buf, &a, &b, Family::V4).unwrap();
        let s = Segment::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&s), r);
        assert!(s.verify_checksum(&a, &b, Family::V4));
        assert!(!s.verify_checksum(&b, &b, Family::V4));
        assert_eq!(s.segment_len(), 5);
        buf[12] = 0x40;
        assert_eq!(
            Segment::new_checked(&buf[..]).err(),
            Some(ParseError::BadDataOffset)
        );
        buf[12] = 0x60;
        assert_eq!(
            Segment::new_checked(&buf[..]).err(),
            Some(ParseError::BadDataOffset)
        );
        assert_eq!(
            Segment::new_checked(&buf[..19]).err(),
            Some(ParseError::Truncated)
        );
    }
}
