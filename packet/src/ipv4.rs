//! IPv4 header (RFC 791) with options. `new_checked` enforces IHL >= 5, the header inside the
//! buffer and `IHL*4 <= total length <= buffer` (trailing Ethernet padding is allowed).

use crate::checksum;
use crate::field::{arr, get16, set16};
use crate::ParseError;

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// Byte offsets of the header's fields (each named once: views, parser and rewrite use these).
pub mod field {
    /// Version (high nibble) and header length in 32-bit words (low nibble).
    pub const VER_IHL: usize = 0;
    /// Total length.
    pub const TOTAL_LEN: usize = 2;
    /// Identification.
    pub const IDENT: usize = 4;
    /// Flags (3 bits) and fragment offset (13 bits, in 8-byte units).
    pub const FLAGS_FRAG: usize = 6;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Protocol of the payload.
    pub const PROTOCOL: usize = 9;
    /// Header checksum.
    pub const CHECKSUM: usize = 10;
    /// Source address (4 bytes).
    pub const SRC: usize = 12;
    /// Destination address (4 bytes).
    pub const DST: usize = 16;
}

/// Zero-copy view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

/// Checks everything `Packet`'s getters rely on; shared with the fast-path parser.
#[inline]
pub(crate) fn check(b: &[u8]) -> Result<(usize, usize), ParseError> {
    if b.len() < MIN_HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    if b[0] >> 4 != 4 {
        return Err(ParseError::BadVersion);
    }
    let hl = ((b[0] & 0x0f) as usize) * 4;
    if hl < MIN_HEADER_LEN || hl > b.len() {
        return Err(ParseError::BadHeaderLength);
    }
    let tl = get16(b, field::TOTAL_LEN) as usize;
    if tl < hl || tl > b.len() {
        return Err(ParseError::BadTotalLength);
    }
    Ok((hl, tl))
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking. Prefer [`Packet::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after validating version, IHL and total length against the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        check(buffer.as_ref())?;
        Ok(Packet { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Version nibble (4).
    #[inline]
    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }

    /// Header length in bytes (IHL * 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        ((self.b()[0] & 0x0f) as usize) * 4
    }

    /// DSCP and ECN byte.
    #[inline]
    pub fn dscp_ecn(&self) -> u8 {
        self.b()[1]
    }

    /// Total length (header + payload).
    #[inline]
    pub fn total_len(&self) -> u16 {
        get16(self.b(), field::TOTAL_LEN)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        get16(self.b(), field::IDENT)
    }

    /// Don't-fragment flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        self.b()[6] & 0x40 != 0
    }

    /// More-fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        self.b()[6] & 0x20 != 0
    }

    /// Fragment offset in bytes.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (get16(self.b(), field::FLAGS_FRAG) & 0x1fff) << 3
    }

    /// True for any fragment (MF set or offset non-zero).
    #[inline]
    pub fn is_fragment(&self) -> bool {
        get16(self.b(), field::FLAGS_FRAG) & 0x3fff != 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.b()[8]
    }

    /// Protocol number of the payload.
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.b()[field::PROTOCOL]
    }

    /// Header checksum field.
    #[inline]
    pub fn checksum(&self) -> u16 {
        get16(self.b(), field::CHECKSUM)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> [u8; 4] {
        arr(self.b(), field::SRC)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 4] {
        arr(self.b(), field::DST)
    }

    /// Options (between the fixed header and the payload).
    pub fn options(&self) -> &[u8] {
        &self.b()[MIN_HEADER_LEN..self.header_len()]
    }

    /// Payload, up to the total length (Ethernet padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len() as usize]
    }

    /// True when the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(&self.b()[..self.header_len()], 0)) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets version 4 and the header length in bytes (multiple of 4).
    pub fn set_version_and_header_len(&mut self, hl: usize) {
        self.bm()[0] = 0x40 | ((hl / 4) as u8 & 0x0f);
    }

    /// Sets DSCP/ECN.
    pub fn set_dscp_ecn(&mut self, v: u8) {
        self.bm()[1] = v;
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        set16(self.bm(), field::TOTAL_LEN, v)
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        set16(self.bm(), field::IDENT, v)
    }

    /// Sets flags and fragment offset (bytes, multiple of 8).
    pub fn set_frag(&mut self, dont_frag: bool, more: bool, offset: u16) {
        let v = ((dont_frag as u16) << 14) | ((more as u16) << 13) | ((offset >> 3) & 0x1fff);
        set16(self.bm(), field::FLAGS_FRAG, v)
    }

    /// Sets the TTL.
    pub fn set_ttl(&mut self, v: u8) {
        self.bm()[field::TTL] = v;
    }

    /// Sets the protocol.
    pub fn set_protocol(&mut self, v: u8) {
        self.bm()[field::PROTOCOL] = v;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        set16(self.bm(), field::CHECKSUM, v)
    }

    /// Sets the source address (checksum not updated).
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 4]) {
        self.bm()[field::SRC..field::SRC + 4].copy_from_slice(&a);
    }

    /// Sets the destination address (checksum not updated).
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 4]) {
        self.bm()[field::DST..field::DST + 4].copy_from_slice(&a);
    }

    /// Recomputes the header checksum from scratch.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::fold(checksum::sum(&self.b()[..hl], 0));
        self.set_checksum(c);
    }

    /// Mutable payload.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, tl) = (self.header_len(), self.total_len() as usize);
        &mut self.bm()[hl..tl]
    }
}

/// An IPv4 header without options, as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source address.
    pub src_addr: [u8; 4],
    /// Destination address.
    pub dst_addr: [u8; 4],
    /// Payload protocol.
    pub protocol: u8,
    /// TTL.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// DF flag.
    pub dont_frag: bool,
    /// DSCP/ECN.
    pub dscp_ecn: u8,
    /// Payload length (total length minus header).
    pub payload_len: usize,
}

impl Repr {
    /// Reads the fields of a checked packet (options are skipped; their length is not kept).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            protocol: p.protocol(),
            ttl: p.ttl(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            dscp_ecn: p.dscp_ecn(),
            payload_len: p.payload().len(),
        }
    }

    /// Header length when emitted (no options).
    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN
    }

    /// Writes a 20-byte header with a valid checksum; `Truncated` when `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), ParseError> {
        if buf.len() < MIN_HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let mut p = Packet::new_unchecked(&mut buf[..MIN_HEADER_LEN]);
        p.set_version_and_header_len(MIN_HEADER_LEN);
        p.set_dscp_ecn(self.dscp_ecn);
        p.set_total_len((MIN_HEADER_LEN + self.payload_len).min(0xffff) as u16);
        p.set_ident(self.ident);
        p.set_frag(self.dont_frag, false, 0);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let r = Repr {
            src_addr: [10, 0, 0, 1],
            dst_addr: [10, 0, 0, 2],
            protocol: 17,
            ttl: 64,
            ident: 7,
            dont_frag: true,
            dscp_ecn: 0,
            payload_len: 4,
        };
        let mut b = vec![0u8; 24];
        r.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn emit_parse() {
        let b = sample();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.total_len(), 24);
        assert!(p.dont_frag() && !p.more_frags() && !p.is_fragment());
        let r = Repr::parse(&p);
        assert_eq!(r.payload_len, 4);
        assert_eq!(p.options().len(), 0);
    }

    #[test]
    fn malformed() {
        let mut b = sample();
        assert_eq!(
            Packet::new_checked(&b[..19]).err(),
            Some(ParseError::Truncated)
        );
        b[0] = 0x65;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::BadVersion)
        );
        b[0] = 0x44;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::BadHeaderLength)
        );
        b[0] = 0x47; // 28 bytes > 24
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::BadHeaderLength)
        );
        b[0] = 0x45;
        b[3] = 25;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::BadTotalLength)
        );
        b[3] = 19;
        assert_eq!(
            Packet::new_checked(&b[..]).err(),
            Some(ParseError::BadTotalLength)
        );
    }

    #[test]
    fn frag_fields() {
        let mut b = sample();
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_frag(false, true, 1480);
        assert!(p.more_frags() && p.is_fragment());
        assert_eq!(p.frag_offset(), 1480);
    }
}
