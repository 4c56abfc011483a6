//! IPv6 header (RFC 8200) and its extension-header chain. The chain walk is bounded
//! ([`MAX_EXT_HEADERS`]) and every header must lie inside the IPv6 payload, so a hostile chain
//! costs at most a few reads and never indexes out of bounds.

use crate::field::{arr, get16, get32, set16};
use crate::{IpProto, ParseError};

/// Fixed header length.
pub const HEADER_LEN: usize = 40;

/// Byte offsets of the fixed header's fields (each named once).
pub mod field {
    /// Version, traffic class and flow label (32 bits).
    pub const VER_TC_FLOW: usize = 0;
    /// Payload length.
    pub const PAYLOAD_LEN: usize = 4;
    /// Next header.
    pub const NEXT_HEADER: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address (16 bytes).
    pub const SRC: usize = 8;
    /// Destination address (16 bytes).
    pub const DST: usize = 24;
}
/// Most extension headers walked before the chain is declared bad.
pub const MAX_EXT_HEADERS: usize = 8;

/// Next-header values of extension headers (and the chain terminators).
pub mod ext {
    /// Hop-by-hop options (must come first).
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing header.
    pub const ROUTING: u8 = 43;
    /// Fragment header.
    pub const FRAGMENT: u8 = 44;
    /// Encapsulating security payload: the chain ends here (opaque).
    pub const ESP: u8 = 50;
    /// Authentication header (length in 4-octet units).
    pub const AH: u8 = 51;
    /// No next header.
    pub const NO_NEXT: u8 = 59;
    /// Destination options.
    pub const DEST_OPTS: u8 = 60;
    /// Mobility header.
    pub const MOBILITY: u8 = 135;
    /// Host identity protocol.
    pub const HIP: u8 = 139;
    /// Shim6.
    pub const SHIM6: u8 = 140;

    /// True for the headers the chain walk steps over.
    #[inline]
    pub fn is_walkable(n: u8) -> bool {
        matches!(
            n,
            HOP_BY_HOP | ROUTING | FRAGMENT | AH | DEST_OPTS | MOBILITY | HIP | SHIM6
        )
    }
}

/// Checks the fixed header and payload length; returns the IP packet length.
#[inline]
pub(crate) fn check(b: &[u8]) -> Result<usize, ParseError> {
    if b.len() < HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    if b[0] >> 4 != 6 {
        return Err(ParseError::BadVersion);
    }
    let len = HEADER_LEN + get16(b, field::PAYLOAD_LEN) as usize;
    if len > b.len() {
        return Err(ParseError::BadTotalLength);
    }
    Ok(len)
}

/// Zero-copy view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking. Prefer [`Packet::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after validating version and payload length against the buffer.
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

    /// Version nibble (6).
    #[inline]
    pub fn version(&self) -> u8 {
        self.b()[0] >> 4
    }

    /// Traffic class.
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        ((get16(self.b(), 0) >> 4) & 0xff) as u8
    }

    /// Flow label (20 bits).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        get32(self.b(), 0) & 0x000f_ffff
    }

    /// Payload length (extension headers included).
    #[inline]
    pub fn payload_len(&self) -> u16 {
        get16(self.b(), field::PAYLOAD_LEN)
    }

    /// First next-header value.
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.b()[field::NEXT_HEADER]
    }

    /// Hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> [u8; 16] {
        arr(self.b(), 8)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 16] {
        arr(self.b(), 24)
    }

    /// Payload (extension headers + upper layer), Ethernet padding excluded.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }

    /// Iterates the extension headers of the payload.
    pub fn ext_headers(&self) -> ExtHeaderIter<'_> {
        ExtHeaderIter::new(self.payload(), self.next_header())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets version 6, traffic class and flow label.
    pub fn set_version_tc_flow(&mut self, tc: u8, flow: u32) {
        let v = (6u32 << 28) | ((tc as u32) << 20) | (flow & 0x000f_ffff);
        self.bm()[0..4].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        set16(self.bm(), field::PAYLOAD_LEN, v)
    }

    /// Sets the first next-header value.
    pub fn set_next_header(&mut self, v: u8) {
        self.bm()[field::NEXT_HEADER] = v;
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.bm()[field::HOP_LIMIT] = v;
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 16]) {
        self.bm()[field::SRC..field::SRC + 16].copy_from_slice(&a);
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 16]) {
        self.bm()[field::DST..field::DST + 16].copy_from_slice(&a);
    }
}

/// One extension header found in the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtHeader {
    /// Its own type (the next-header value that introduced it).
    pub kind: u8,
    /// Offset from the start of the IPv6 payload.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// The next-header value it carries.
    pub next_header: u8,
}

/// Fragment header contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragInfo {
    /// Offset in bytes.
    pub offset: u16,
    /// More-fragments flag.
    pub more: bool,
    /// Identification.
    pub id: u32,
}

/// Iterator over the extension-header chain; yields `Err` once and stops on a malformed chain.
#[derive(Debug, Clone)]
pub struct ExtHeaderIter<'a> {
    payload: &'a [u8],
    next: u8,
    off: usize,
    count: usize,
    failed: bool,
}

impl<'a> ExtHeaderIter<'a> {
    /// Walks `payload` (the IPv6 payload) starting from next-header value `first`.
    pub fn new(payload: &'a [u8], first: u8) -> Self {
        ExtHeaderIter {
            payload,
            next: first,
            off: 0,
            count: 0,
            failed: false,
        }
    }

    /// The next-header value and payload offset where the walk stands (the upper layer once the
    /// iterator is exhausted without error).
    pub fn position(&self) -> (u8, usize) {
        (self.next, self.off)
    }
}

impl Iterator for ExtHeaderIter<'_> {
    type Item = Result<ExtHeader, ParseError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || !ext::is_walkable(self.next) {
            return None;
        }
        let fail = |s: &mut Self| {
            s.failed = true;
            Some(Err(ParseError::BadExtensionHeader))
        };
        if (self.next == ext::HOP_BY_HOP && self.count != 0) || self.count >= MAX_EXT_HEADERS {
            return fail(self);
        }
        let rest = &self.payload[self.off.min(self.payload.len())..];
        if rest.len() < 8 {
            return fail(self);
        }
        let len = match self.next {
            ext::FRAGMENT => 8,
            ext::AH => (rest[1] as usize + 2) * 4,
            _ => (rest[1] as usize + 1) * 8,
        };
        if len > rest.len() {
            return fail(self);
        }
        let h = ExtHeader {
            kind: self.next,
            offset: self.off,
            len,
            next_header: rest[0],
        };
        self.next = rest[0];
        self.off += len;
        self.count += 1;
        Some(Ok(h))
    }
}

/// Where the chain walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ChainEnd {
    /// Upper-layer protocol (or ESP / no-next-header, or what a non-first fragment carries).
    pub proto: IpProto,
    /// Offset of the upper-layer header from the start of the IPv6 payload.
    pub offset: usize,
    /// Fragment header, if any.
    pub frag: Option<FragInfo>,
    /// False when there is no parseable upper-layer header: ESP, no-next-header, or a
    /// non-first fragment.
    pub has_l4: bool,
}

/// Walks the chain of `payload` from `first`. Stops at ESP / no-next-header (no L4) and at a
/// non-first fragment (no L4; `proto` is what the fragment carries).
#[inline]
pub fn walk_chain(payload: &[u8], first: u8) -> Result<ChainEnd, ParseError> {
    let mut it = ExtHeaderIter::new(payload, first);
    let mut frag = None;
    while let Some(h) = it.next() {
        let h = h?;
        if h.kind == ext::FRAGMENT {
            let fo = get16(payload, h.offset + 2);
            let f = FragInfo {
                offset: fo & 0xfff8,
                more: fo & 1 != 0,
                id: get32(payload, h.offset + 4),
            };
            frag = Some(f);
            if f.offset != 0 {
                return Ok(ChainEnd {
                    proto: IpProto(h.next_header),
                    offset: it.off,
                    frag,
                    has_l4: false,
                });
            }
        }
    }
    let (proto, offset) = it.position();
    let has_l4 = proto != ext::ESP && proto != ext::NO_NEXT;
    Ok(ChainEnd {
        proto: IpProto(proto),
        offset,
        frag,
        has_l4,
    })
}

/// An IPv6 fixed header as plain values (extension headers are emitted by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source address.
    pub src_addr: [u8; 16],
    /// Destination address.
    pub dst_addr: [u8; 16],
    /// First next-header value.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Payload length.
    pub payload_len: usize,
}

impl Repr {
    /// Reads the fixed header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            payload_len: p.payload_len() as usize,
        }
    }

    /// Always 40.
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 40-byte header; `Truncated` when `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), ParseError> {
        if buf.len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_version_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(self.payload_len.min(0xffff) as u16);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_roundtrip() {
        let r = Repr {
            src_addr: [1; 16],
            dst_addr: [2; 16],
            next_header: 17,
            hop_limit: 9,
            traffic_class: 0xab,
            flow_label: 0x12345,
            payload_len: 0,
        };
        let mut b = [0u8; 40];
        r.emit(&mut b).unwrap();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p), r);
        assert_eq!(p.version(), 6);
    }

    #[test]
    fn chain() {
        // hop-by-hop (8) -> dest opts (16) -> fragment (offset 0, M) -> UDP
        let mut p = vec![0u8; 8 + 16 + 8 + 8];
        p[0] = ext::DEST_OPTS;
        p[8] = ext::FRAGMENT;
        p[9] = 1;
        p[24] = 17;
        p[26..28].copy_from_slice(&1u16.to_be_bytes());
        p[28..32].copy_from_slice(&0xdeadbeefu32.to_be_bytes());
        let e = walk_chain(&p, ext::HOP_BY_HOP).unwrap();
        assert_eq!((e.proto, e.offset, e.has_l4), (IpProto::UDP, 32, true));
        assert_eq!(
            e.frag,
            Some(FragInfo {
                offset: 0,
                more: true,
                id: 0xdeadbeef
            })
        );
        let kinds: Vec<u8> = ExtHeaderIter::new(&p, 0).map(|h| h.unwrap().kind).collect();
        assert_eq!(kinds, vec![0, 60, 44]);
        // Non-first fragment stops with no L4.
        p[26..28].copy_from_slice(&0x0100u16.to_be_bytes());
        let e = walk_chain(&p, ext::HOP_BY_HOP).unwrap();
        assert_eq!(
            (e.proto, e.has_l4, e.frag.unwrap().offset),
            (IpProto::UDP, false, 0x100)
        );
        // Hop-by-hop not first.
        p[0] = ext::HOP_BY_HOP;
        assert_eq!(
            walk_chain(&p, ext::HOP_BY_HOP),
            Err(ParseError::BadExtensionHeader)
        );
        // Length past the payload.
        p[0] = ext::DEST_OPTS;
        p[9] = 9;
        assert_eq!(
            walk_chain(&p, ext::HOP_BY_HOP),
            Err(ParseError::BadExtensionHeader)
        );
        // ESP ends the chain without L4.
        let e = walk_chain(&p, ext::ESP).unwrap();
        assert!(!e.has_l4);
        // Too many headers.
        let long: Vec<u8> = (0..20)
            .flat_map(|_| [ext::DEST_OPTS, 0, 0, 0, 0, 0, 0, 0])
            .collect();
        assert_eq!(
            walk_chain(&long, ext::DEST_OPTS),
            Err(ParseError::BadExtensionHeader)
        );
    }
}
