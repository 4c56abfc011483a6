//! SCTP common header (RFC 9260) and chunk headers. The checksum is CRC32c over the whole SCTP
//! packet with the checksum field zeroed, stored in the byte order RFC 9260 appendix A gives
//! (which reads as the little-endian encoding of the crate-computed value). NAT has to recompute
//! it: unlike the Internet checksum, CRC32c has no cheap incremental update for a changed port.

use crate::field::{get16, get32, set16, set32};
use crate::ParseError;

/// Common header length.
pub const HEADER_LEN: usize = 12;
/// Chunk header length.
pub const CHUNK_HEADER_LEN: usize = 4;

/// Chunk types the dataplane looks at.
pub mod chunk {
    /// DATA.
    pub const DATA: u8 = 0;
    /// INIT.
    pub const INIT: u8 = 1;
    /// INIT ACK.
    pub const INIT_ACK: u8 = 2;
    /// ABORT.
    pub const ABORT: u8 = 6;
    /// SHUTDOWN.
    pub const SHUTDOWN: u8 = 7;
    /// SHUTDOWN COMPLETE.
    pub const SHUTDOWN_COMPLETE: u8 = 14;
}

/// CRC32c (Castagnoli) of `data`, via the `crc32c` crate (hardware accelerated where available).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// The checksum an SCTP packet should carry: CRC32c over `pkt` with bytes 8..12 taken as zero.
/// Returns 0 for buffers shorter than the common header.
#[inline]
pub fn checksum_of(pkt: &[u8]) -> u32 {
    if pkt.len() < HEADER_LEN {
        return 0;
    }
    let c = ::crc32c::crc32c(&pkt[..8]);
    let c = ::crc32c::crc32c_append(c, &[0u8; 4]);
    ::crc32c::crc32c_append(c, &pkt[HEADER_LEN..])
}

/// Validates the common header and the first chunk header (present, 4 <= length <= packet).
#[inline]
pub(crate) fn check_with_chunk(b: &[u8]) -> Result<(), ParseError> {
    if b.len() < HEADER_LEN + CHUNK_HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    let cl = get16(b, HEADER_LEN + 2) as usize;
    if cl < CHUNK_HEADER_LEN || cl > b.len() - HEADER_LEN {
        return Err(ParseError::BadLength);
    }
    Ok(())
}

/// Zero-copy view of an SCTP packet (common header + chunks).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking. Prefer [`Packet::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after checking the 12-byte common header is present.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
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

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        get16(self.b(), 0)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        get16(self.b(), 2)
    }

    /// Verification tag.
    #[inline]
    pub fn verification_tag(&self) -> u32 {
        get32(self.b(), 4)
    }

    /// Checksum field as stored (compare with [`checksum_of`]).
    #[inline]
    pub fn checksum(&self) -> u32 {
        let b = self.b();
        u32::from_le_bytes([b[8], b[9], b[10], b[11]])
    }

    /// Chunks (everything after the common header).
    pub fn chunks(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }

    /// First chunk's (type, flags, length), if its header is present.
    pub fn first_chunk(&self) -> Option<(u8, u8, u16)> {
        let c = self.chunks();
        if c.len() < CHUNK_HEADER_LEN {
            return None;
        }
        Some((c[0], c[1], get16(c, 2)))
    }

    /// True when the CRC32c verifies.
    pub fn verify_checksum(&self) -> bool {
        self.checksum() == checksum_of(self.b())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port (checksum not updated).
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        set16(self.buffer.as_mut(), 0, v)
    }

    /// Sets the destination port (checksum not updated).
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        set16(self.buffer.as_mut(), 2, v)
    }

    /// Sets the verification tag.
    pub fn set_verification_tag(&mut self, v: u32) {
        set32(self.buffer.as_mut(), 4, v)
    }

    /// Stores a checksum value.
    #[inline]
    pub fn set_checksum(&mut self, c: u32) {
        self.buffer.as_mut()[8..12].copy_from_slice(&c.to_le_bytes());
    }

    /// Recomputes the CRC32c over the whole buffer.
    #[inline]
    pub fn fill_checksum(&mut self) {
        let c = checksum_of(self.b());
        self.set_checksum(c);
    }
}

/// SCTP common header as plain values (chunks are written by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Verification tag.
    pub verification_tag: u32,
}

impl Repr {
    /// Reads a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            verification_tag: p.verification_tag(),
        }
    }

    /// Always 12.
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the common header at the start of `pkt` (chunks already in place after it) and
    /// fills the CRC32c over all of `pkt`.
    pub fn emit(&self, pkt: &mut [u8]) -> Result<(), ParseError> {
        if pkt.len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let mut p = Packet::new_unchecked(pkt);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_verification_tag(self.verification_tag);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_vectors() {
        // The CRC-32C check value.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        // RFC 3720 B.4: 32 bytes of zeros -> bytes on the wire aa 36 91 8a.
        assert_eq!(crc32c(&[0u8; 32]).to_le_bytes(), [0xaa, 0x36, 0x91, 0x8a]);
        // RFC 3720 B.4: 32 bytes of 0xff -> 43 ab a8 62.
        assert_eq!(
            crc32c(&[0xffu8; 32]).to_le_bytes(),
            [0x43, 0xab, 0xa8, 0x62]
        );
        // RFC 3720 B.4: 0x00..0x1f -> 4e 79 dd 46.
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc).to_le_bytes(), [0x4e, 0x79, 0xdd, 0x46]);
    }

    #[test]
    fn emit_verify() {
        // INIT chunk (type 1, length 20) after the common header.
        let mut b = [0u8; 32];
        b[12] = chunk::INIT;
        b[14..16].copy_from_slice(&20u16.to_be_bytes());
        Repr {
            src_port: 5000,
            dst_port: 38412,
            verification_tag: 0,
        }
        .emit(&mut b)
        .unwrap();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(p.first_chunk(), Some((chunk::INIT, 0, 20)));
        let mut z = b;
        z[8..12].fill(0);
        assert_eq!(crc32c(&z), p.checksum());
        assert_eq!(check_with_chunk(&b), Ok(()));
        assert_eq!(check_with_chunk(&b[..15]), Err(ParseError::Truncated));
        assert_eq!(check_with_chunk(&b[..31]), Err(ParseError::BadLength));
    }
}
