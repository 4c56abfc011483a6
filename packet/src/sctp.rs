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
    /// SACK.
    pub const SACK: u8 = 3;
    /// HEARTBEAT.
    pub const HEARTBEAT: u8 = 4;
    /// HEARTBEAT ACK.
    pub const HEARTBEAT_ACK: u8 = 5;
    /// SHUTDOWN.
    pub const SHUTDOWN: u8 = 7;
    /// SHUTDOWN ACK.
    pub const SHUTDOWN_ACK: u8 = 8;
    /// ERROR (Operation Error).
    pub const ERROR: u8 = 9;
    /// COOKIE ECHO.
    pub const COOKIE_ECHO: u8 = 10;
    /// COOKIE ACK.
    pub const COOKIE_ACK: u8 = 11;
    /// SHUTDOWN COMPLETE.
    pub const SHUTDOWN_COMPLETE: u8 = 14;

    /// The T flag of ABORT and SHUTDOWN COMPLETE (RFC 9260 3.3.7, 3.3.13): the verification tag
    /// is the one the sender *received* (reflected), not the peer's own.
    pub const FLAG_T: u8 = 0x01;
}

/// Most chunks [`ChunkIter`] walks in one packet; one more is an error. Bounds the per-packet work
/// of the conntrack summary. A 1500-byte packet of the smallest legal DATA chunks (20 bytes padded)
/// holds about 73, so a pathological but legal sender could exceed it; real stacks bundle far fewer.
pub const MAX_CHUNKS: usize = 64;

/// Fixed part of an INIT / INIT ACK value (RFC 9260 3.3.2, 3.3.3): Initiate Tag, a_rwnd, outbound
/// and inbound stream counts, initial TSN.
pub const INIT_FIXED_LEN: usize = 16;

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

    /// Every chunk, in order (see [`ChunkIter`]).
    pub fn chunk_iter(&self) -> ChunkIter<'_> {
        ChunkIter::new(self.chunks())
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

/// One chunk as [`ChunkIter`] yields it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Chunk Type.
    pub chunk_type: u8,
    /// Chunk Flags.
    pub flags: u8,
    /// Chunk Length as carried: header and value, padding excluded (at least 4).
    pub length: u16,
    /// Where the chunk starts, counted from the end of the common header.
    pub offset: usize,
    /// The value: the `length - 4` bytes after the chunk header.
    pub value: &'a [u8],
}

/// Walks the chunks of an SCTP packet: over the bytes after the 12-byte common header, each chunk
/// header (type, flags, length), then the value and up to 3 padding bytes to the next multiple of
/// 4. The last chunk's padding may be missing (as Linux accepts it); padding bytes are ignored
/// (RFC 9260 3.2).
///
/// Yields `Err` once and then ends, when: a chunk header is cut short (`Truncated`); a chunk length
/// is below 4 (zero included) or runs past the end (`BadLength`); a chunk would be the
/// [`MAX_CHUNKS`]+1-th (`BadLength`). No chunk at all is an empty iteration, not an error.
#[derive(Clone, Debug)]
pub struct ChunkIter<'a> {
    buf: &'a [u8],
    off: usize,
    count: usize,
    done: bool,
    prefix: bool,
}

impl<'a> ChunkIter<'a> {
    /// Iterates over `chunks`: the SCTP packet without its 12-byte common header.
    pub fn new(chunks: &'a [u8]) -> Self {
        ChunkIter {
            buf: chunks,
            off: 0,
            count: 0,
            done: false,
            prefix: false,
        }
    }

    /// Iterates over the start of the chunks only (a first IP fragment's): a chunk running past the
    /// end is yielded with the part of its value present and ends the iteration, and a chunk header
    /// cut short ends it silently. Chunk lengths below 4 and the chunk count are checked as usual.
    pub fn new_prefix(chunks: &'a [u8]) -> Self {
        ChunkIter {
            prefix: true,
            ..ChunkIter::new(chunks)
        }
    }

    /// Chunks yielded so far.
    pub fn count_so_far(&self) -> usize {
        self.count
    }

    fn fail(&mut self, e: ParseError) -> Option<Result<Chunk<'a>, ParseError>> {
        self.done = true;
        Some(Err(e))
    }
}

impl<'a> Iterator for ChunkIter<'a> {
    type Item = Result<Chunk<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        // Invariant: off <= buf.len().
        let rest = self.buf.len() - self.off;
        if rest == 0 {
            self.done = true;
            return None;
        }
        if self.count >= MAX_CHUNKS {
            return self.fail(ParseError::BadLength);
        }
        if rest < CHUNK_HEADER_LEN {
            if self.prefix {
                self.done = true;
                return None;
            }
            return self.fail(ParseError::Truncated);
        }
        let off = self.off;
        let len = get16(self.buf, off + 2) as usize;
        if len < CHUNK_HEADER_LEN || (len > rest && !self.prefix) {
            return self.fail(ParseError::BadLength);
        }
        let c = Chunk {
            chunk_type: self.buf[off],
            flags: self.buf[off + 1],
            length: len as u16,
            offset: off,
            value: &self.buf[off + CHUNK_HEADER_LEN..off + len.min(rest)],
        };
        let padded = (len + 3) & !3;
        self.off += padded.min(rest);
        self.count += 1;
        Some(Ok(c))
    }
}

impl core::iter::FusedIterator for ChunkIter<'_> {}

/// What conntrack needs from one SCTP packet, gathered in one pass by [`summarize`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkSummary {
    /// The common header's verification tag.
    pub vtag: u32,
    /// The chunk types present: bit `t` for type `t` < 31 ([`ChunkSummary::bit`]); every type from
    /// 31 up (I-DATA 64, PAD 132, FORWARD TSN 192, ASCONF 193, ...) shares [`ChunkSummary::OTHER`].
    pub chunks: u32,
    /// The Initiate Tag of the INIT or INIT ACK chunk (never 0).
    pub init_tag: Option<u32>,
    /// An ABORT chunk has the T flag: its tag is the one the sender received (RFC 9260 8.5.1).
    pub abort_t_bit: bool,
    /// A SHUTDOWN COMPLETE chunk has the T flag.
    pub shutdown_complete_t_bit: bool,
}

impl ChunkSummary {
    /// The bit shared by all chunk types >= 31.
    pub const OTHER: u32 = 1 << 31;

    /// The bit of chunk type `chunk_type` in [`ChunkSummary::chunks`].
    #[inline]
    pub const fn bit(chunk_type: u8) -> u32 {
        if chunk_type < 31 {
            1 << chunk_type
        } else {
            Self::OTHER
        }
    }

    /// Whether a chunk of this type is present (any type >= 31 tests the shared bit).
    #[inline]
    pub const fn has(&self, chunk_type: u8) -> bool {
        self.chunks & Self::bit(chunk_type) != 0
    }
}

/// Reads every chunk of `sctp_packet` (common header included, the whole SCTP packet: a first IP
/// fragment is not enough) into a [`ChunkSummary`], enforcing the packet-level rules of RFC 9260
/// (the same ones Linux's conntrack checks):
///
/// - at least one chunk; every chunk well-formed ([`ChunkIter`]);
/// - INIT, INIT ACK and SHUTDOWN COMPLETE are the only chunk of their packet (6.10);
/// - COOKIE ECHO and COOKIE ACK, when bundled, come first (5.1, 6.10);
/// - a packet with INIT has verification tag 0 (8.5.1 A);
/// - INIT and INIT ACK have their 16-byte fixed part and a non-zero Initiate Tag (3.3.2, 3.3.3);
/// - several ABORT chunks agree on the T flag.
///
/// A header cut short is `Truncated` (so is a packet without chunks); every other broken rule is
/// `BadLength`, the crate's error for an inconsistent SCTP packet.
pub fn summarize(sctp_packet: &[u8]) -> Result<ChunkSummary, ParseError> {
    summarize_with(sctp_packet, false)
}

/// [`summarize`] for the start of an SCTP packet only: the payload of a first IP fragment (later
/// fragments carry no SCTP header). The chunks whose headers are present are summarised
/// ([`ChunkIter::new_prefix`]); an INIT or INIT ACK still needs its fixed part present. Chunks in
/// the missing part are not seen, so "alone in its packet" holds only as far as can be told.
pub fn summarize_prefix(sctp_prefix: &[u8]) -> Result<ChunkSummary, ParseError> {
    summarize_with(sctp_prefix, true)
}

fn summarize_with(sctp_packet: &[u8], prefix: bool) -> Result<ChunkSummary, ParseError> {
    if sctp_packet.len() < HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    const ALONE: u32 = ChunkSummary::bit(chunk::INIT)
        | ChunkSummary::bit(chunk::INIT_ACK)
        | ChunkSummary::bit(chunk::SHUTDOWN_COMPLETE);
    let mut s = ChunkSummary {
        vtag: get32(sctp_packet, 4),
        ..ChunkSummary::default()
    };
    let mut n = 0usize;
    let chunks = &sctp_packet[HEADER_LEN..];
    let iter = if prefix {
        ChunkIter::new_prefix(chunks)
    } else {
        ChunkIter::new(chunks)
    };
    for c in iter {
        let c = c?;
        let ty = c.chunk_type;
        if n > 0 && (s.chunks & ALONE != 0 || ChunkSummary::bit(ty) & ALONE != 0) {
            return Err(ParseError::BadLength);
        }
        match ty {
            chunk::INIT | chunk::INIT_ACK => {
                if c.value.len() < INIT_FIXED_LEN || (ty == chunk::INIT && s.vtag != 0) {
                    return Err(ParseError::BadLength);
                }
                let tag = get32(c.value, 0);
                if tag == 0 {
                    return Err(ParseError::BadLength);
                }
                s.init_tag = Some(tag);
            }
            chunk::COOKIE_ECHO | chunk::COOKIE_ACK if n > 0 => {
                return Err(ParseError::BadLength);
            }
            chunk::ABORT => {
                let t = c.flags & chunk::FLAG_T != 0;
                if s.has(chunk::ABORT) && t != s.abort_t_bit {
                    return Err(ParseError::BadLength);
                }
                s.abort_t_bit = t;
            }
            chunk::SHUTDOWN_COMPLETE => {
                s.shutdown_complete_t_bit = c.flags & chunk::FLAG_T != 0;
            }
            _ => {}
        }
        s.chunks |= ChunkSummary::bit(ty);
        n += 1;
    }
    if n == 0 {
        return Err(ParseError::Truncated);
    }
    Ok(s)
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
