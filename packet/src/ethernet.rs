//! Ethernet II frames with up to two VLAN tags (802.1Q `0x8100`, 802.1ad `0x88a8`; the legacy
//! QinQ `0x9100` is accepted too, as switches still emit it).

use crate::field::{arr, get16, set16};
use crate::ParseError;

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of one VLAN tag (TPID + TCI).
pub const VLAN_TAG_LEN: usize = 4;
/// Most tags the parser walks (single tag or QinQ).
pub const MAX_VLAN_TAGS: usize = 2;

/// EtherType values the crate cares about.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// 802.1Q customer VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service VLAN tag (QinQ outer).
    pub const QINQ: u16 = 0x88a8;
    /// Pre-standard QinQ outer tag.
    pub const QINQ_LEGACY: u16 = 0x9100;

    /// True for the TPIDs that introduce a VLAN tag.
    #[inline]
    pub fn is_vlan(t: u16) -> bool {
        t == VLAN || t == QINQ || t == QINQ_LEGACY
    }
}

/// Walks the Ethernet header and up to [`MAX_VLAN_TAGS`] tags: returns the inner EtherType and the
/// offset of the L3 header. A third tag is left as the "EtherType" (not IP), so such frames are
/// handed to the kernel rather than misparsed.
#[inline]
pub fn l3_offset(frame: &[u8]) -> Result<(u16, usize), ParseError> {
    if frame.len() < HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    let mut et = get16(frame, 12);
    let mut off = HEADER_LEN;
    let mut tags = 0;
    while ethertype::is_vlan(et) && tags < MAX_VLAN_TAGS {
        if frame.len() < off + VLAN_TAG_LEN {
            return Err(ParseError::Truncated);
        }
        et = get16(frame, off + 2);
        off += VLAN_TAG_LEN;
        tags += 1;
    }
    Ok((et, off))
}

/// Zero-copy view of an Ethernet II header (the first 14 bytes; tags are in the payload).
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps without checking; getters may panic on short buffers. Prefer [`Frame::new_checked`].
    pub fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    /// Wraps after checking that the 14-byte header is present.
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        Ok(Frame { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 6] {
        arr(self.buffer.as_ref(), 0)
    }

    /// Source MAC.
    #[inline]
    pub fn src_addr(&self) -> [u8; 6] {
        arr(self.buffer.as_ref(), 6)
    }

    /// Outer EtherType (a TPID when tagged).
    #[inline]
    pub fn ethertype(&self) -> u16 {
        get16(self.buffer.as_ref(), 12)
    }

    /// Everything after the 14-byte header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination MAC.
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a);
    }

    /// Sets the source MAC.
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 6]) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a);
    }

    /// Sets the outer EtherType.
    #[inline]
    pub fn set_ethertype(&mut self, t: u16) {
        set16(self.buffer.as_mut(), 12, t)
    }

    /// Swaps source and destination MAC (for replies).
    #[inline]
    pub fn swap_addrs(&mut self) {
        let (d, s) = (self.dst_addr(), self.src_addr());
        self.set_dst_addr(s);
        self.set_src_addr(d);
    }

    /// Mutable payload after the 14-byte header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// Zero-copy view of one 4-byte VLAN tag as it follows a TPID: TCI then the next EtherType.
#[derive(Debug, Clone)]
pub struct VlanTag<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VlanTag<T> {
    /// Wraps the 4 bytes after a TPID (TCI + next EtherType).
    pub fn new_checked(buffer: T) -> Result<Self, ParseError> {
        if buffer.as_ref().len() < 4 {
            return Err(ParseError::Truncated);
        }
        Ok(VlanTag { buffer })
    }

    /// Tag control information (PCP, DEI, VID).
    #[inline]
    pub fn tci(&self) -> u16 {
        get16(self.buffer.as_ref(), 0)
    }

    /// VLAN id (12 bits).
    #[inline]
    pub fn vid(&self) -> u16 {
        self.tci() & 0x0fff
    }

    /// Priority code point.
    #[inline]
    pub fn pcp(&self) -> u8 {
        (self.tci() >> 13) as u8
    }

    /// Drop eligible indicator.
    #[inline]
    pub fn dei(&self) -> bool {
        self.tci() & 0x1000 != 0
    }

    /// The EtherType (or next TPID) after this tag.
    #[inline]
    pub fn ethertype(&self) -> u16 {
        get16(self.buffer.as_ref(), 2)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VlanTag<T> {
    /// Sets the TCI.
    pub fn set_tci(&mut self, tci: u16) {
        set16(self.buffer.as_mut(), 0, tci)
    }

    /// Sets the next EtherType.
    pub fn set_ethertype(&mut self, t: u16) {
        set16(self.buffer.as_mut(), 2, t)
    }
}

/// One VLAN tag in a [`Repr`]: the TPID that introduces it and its TCI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Vlan {
    /// 0x8100 or 0x88a8 (or 0x9100).
    pub tpid: u16,
    /// PCP/DEI/VID.
    pub tci: u16,
}

/// Ethernet header plus up to two VLAN tags, as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Repr {
    /// Source MAC.
    pub src_addr: [u8; 6],
    /// Destination MAC.
    pub dst_addr: [u8; 6],
    /// Tags outermost first.
    pub vlans: [Option<Vlan>; MAX_VLAN_TAGS],
    /// Inner EtherType.
    pub ethertype: u16,
}

impl Repr {
    /// Parses the header and tags at the start of `frame`.
    pub fn parse(frame: &[u8]) -> Result<Repr, ParseError> {
        let f = Frame::new_checked(frame)?;
        let (ethertype, _) = l3_offset(frame)?;
        let mut vlans = [None; MAX_VLAN_TAGS];
        let mut tpid = f.ethertype();
        let mut off = HEADER_LEN;
        for v in vlans.iter_mut() {
            if !ethertype::is_vlan(tpid) {
                break;
            }
            let tag = VlanTag::new_checked(&frame[off..])?;
            *v = Some(Vlan {
                tpid,
                tci: tag.tci(),
            });
            tpid = tag.ethertype();
            off += VLAN_TAG_LEN;
        }
        Ok(Repr {
            src_addr: f.src_addr(),
            dst_addr: f.dst_addr(),
            vlans,
            ethertype,
        })
    }

    /// Header length including tags.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + VLAN_TAG_LEN * self.vlans.iter().filter(|v| v.is_some()).count()
    }

    /// Writes the header and tags; returns the L3 offset, or `Truncated` when `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, ParseError> {
        let hl = self.header_len();
        if buf.len() < hl {
            return Err(ParseError::Truncated);
        }
        buf[0..6].copy_from_slice(&self.dst_addr);
        buf[6..12].copy_from_slice(&self.src_addr);
        let mut off = 12;
        for v in self.vlans.iter().flatten() {
            set16(buf, off, v.tpid);
            set16(buf, off + 2, v.tci);
            off += VLAN_TAG_LEN;
        }
        set16(buf, off, self.ethertype);
        Ok(hl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qinq_roundtrip() {
        let r = Repr {
            src_addr: [1, 2, 3, 4, 5, 6],
            dst_addr: [7, 8, 9, 10, 11, 12],
            vlans: [
                Some(Vlan {
                    tpid: ethertype::QINQ,
                    tci: 100,
                }),
                Some(Vlan {
                    tpid: ethertype::VLAN,
                    tci: 0x2005,
                }),
            ],
            ethertype: ethertype::IPV6,
        };
        let mut b = [0u8; 22];
        assert_eq!(r.emit(&mut b), Ok(22));
        assert_eq!(Repr::parse(&b), Ok(r));
        assert_eq!(l3_offset(&b), Ok((ethertype::IPV6, 22)));
        let tag = VlanTag::new_checked(&b[18..]).unwrap();
        assert_eq!((tag.vid(), tag.pcp(), tag.dei()), (5, 1, false));
        for n in 0..22 {
            assert_eq!(l3_offset(&b[..n]), Err(ParseError::Truncated), "len {n}");
        }
    }

    #[test]
    fn swap() {
        let mut b = [0u8; 14];
        let mut f = Frame::new_checked(&mut b[..]).unwrap();
        f.set_src_addr([1; 6]);
        f.set_dst_addr([2; 6]);
        f.set_ethertype(ethertype::ARP);
        f.swap_addrs();
        assert_eq!(
            (f.src_addr(), f.dst_addr(), f.ethertype()),
            ([2; 6], [1; 6], ethertype::ARP)
        );
        assert_eq!(f.payload_mut().len(), 0);
    }
}
