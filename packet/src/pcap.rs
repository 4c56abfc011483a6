//! pcap / pcapng I/O for tests, replay and tooling (not the fast path), on top of `pcap-file`.
//!
//! Reading accepts classic pcap in both byte orders and both timestamp resolutions, and pcapng
//! (auto-detected by magic), honouring each interface's `if_tsresol`. Packets of all interfaces
//! must share one link type. Errors name the file and, once packets are being read, the
//! 0-based index of the packet that failed.

use std::fmt;
use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::LinkType;

/// Snap length written into pcap headers; longer packets are truncated (original length kept).
pub const SNAPLEN: u32 = 65535;

/// A whole capture in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capture {
    /// Link type shared by all packets.
    pub link: LinkType,
    /// Packets in file order.
    pub packets: Vec<CapturedPacket>,
}

/// One captured packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedPacket {
    /// Timestamp in nanoseconds since the epoch.
    pub ts_ns: u64,
    /// Captured bytes (may be shorter than the original packet).
    pub data: Vec<u8>,
}

/// What went wrong reading a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PcapErrorKind {
    /// The file could not be opened or read.
    Io(String),
    /// Neither a pcap nor a pcapng magic number.
    NotPcap,
    /// A link type other than Ethernet or raw IP.
    UnknownLinkType(u32),
    /// Interfaces with different link types in one pcapng.
    MixedLinkTypes,
    /// The file ends inside a header or a packet record.
    Truncated,
    /// A field is invalid (message from the decoder).
    Malformed(String),
}

/// A capture read error: `Display` is `"<path>: <what>"` plus `" at packet N"` when it concerns a
/// packet (N counts from 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapError {
    /// The file, or `None` for [`read`] from memory (shown as `<memory>`).
    pub path: Option<PathBuf>,
    /// Index of the packet being read when it failed.
    pub packet: Option<usize>,
    /// What went wrong.
    pub kind: PcapErrorKind,
}

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: ", p.display())?,
            None => f.write_str("<memory>: ")?,
        }
        match &self.kind {
            PcapErrorKind::Io(e) => write!(f, "cannot read: {e}")?,
            PcapErrorKind::NotPcap => {
                f.write_str("not a pcap or pcapng file (unknown magic number)")?
            }
            PcapErrorKind::UnknownLinkType(c) => write!(
                f,
                "unsupported link type {c} (supported: 1 Ethernet, 101/228/229 raw IP)"
            )?,
            PcapErrorKind::MixedLinkTypes => f.write_str("interfaces with different link types")?,
            PcapErrorKind::Truncated => f.write_str("truncated file")?,
            PcapErrorKind::Malformed(m) => write!(f, "malformed: {m}")?,
        }
        if let Some(n) = self.packet {
            write!(f, " at packet {n}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PcapError {}

fn err(kind: PcapErrorKind, packet: Option<usize>) -> PcapError {
    PcapError {
        path: None,
        packet,
        kind,
    }
}

fn from_lib(e: pcap_file::PcapError, packet: Option<usize>) -> PcapError {
    let kind = match e {
        pcap_file::PcapError::IncompleteBuffer => PcapErrorKind::Truncated,
        pcap_file::PcapError::IoError(io) if io.kind() == ErrorKind::UnexpectedEof => {
            PcapErrorKind::Truncated
        }
        pcap_file::PcapError::IoError(io) => PcapErrorKind::Io(io.to_string()),
        other => PcapErrorKind::Malformed(other.to_string()),
    };
    err(kind, packet)
}

fn link_of(dl: DataLink) -> Result<LinkType, PcapError> {
    let code = u32::from(dl);
    LinkType::from_pcap(code).ok_or_else(|| err(PcapErrorKind::UnknownLinkType(code), None))
}

/// Reads a pcap or pcapng file (detected by magic number).
pub fn read_file(path: &Path) -> Result<Capture, PcapError> {
    let bytes = std::fs::read(path).map_err(|e| PcapError {
        path: Some(path.to_path_buf()),
        packet: None,
        kind: PcapErrorKind::Io(e.to_string()),
    })?;
    read(&bytes).map_err(|mut e| {
        e.path = Some(path.to_path_buf());
        e
    })
}

/// Reads a pcap or pcapng capture from memory (detected by magic number).
pub fn read(bytes: &[u8]) -> Result<Capture, PcapError> {
    if bytes.len() < 4 {
        return Err(err(PcapErrorKind::Truncated, None));
    }
    match [bytes[0], bytes[1], bytes[2], bytes[3]] {
        [0x0a, 0x0d, 0x0d, 0x0a] => read_pcapng(bytes),
        [0xa1, 0xb2, 0xc3, 0xd4]
        | [0xd4, 0xc3, 0xb2, 0xa1]
        | [0xa1, 0xb2, 0x3c, 0x4d]
        | [0x4d, 0x3c, 0xb2, 0xa1] => read_pcap(bytes),
        _ => Err(err(PcapErrorKind::NotPcap, None)),
    }
}

fn read_pcap(bytes: &[u8]) -> Result<Capture, PcapError> {
    let mut r = PcapReader::new(bytes).map_err(|e| from_lib(e, None))?;
    let header = r.header();
    let link = link_of(header.datalink)?;
    let nanos = header.ts_resolution == TsResolution::NanoSecond;
    let mut packets = Vec::new();
    // Raw records: the decoded form rejects orig_len > snaplen, which real captures with a short
    // snap length routinely have.
    while let Some(p) = r.next_raw_packet() {
        let idx = packets.len();
        let p = p.map_err(|e| from_lib(e, Some(idx)))?;
        let frac = if nanos {
            p.ts_frac as u64
        } else {
            p.ts_frac as u64 * 1000
        };
        packets.push(CapturedPacket {
            ts_ns: p.ts_sec as u64 * 1_000_000_000 + frac,
            data: p.data.into_owned(),
        });
    }
    Ok(Capture { link, packets })
}

/// Nanoseconds per tick for an `if_tsresol` value (default 6: microseconds).
fn ticks_to_ns(ticks: u64, tsresol: u8) -> u64 {
    let t = ticks as u128;
    let ns = if tsresol & 0x80 == 0 {
        let e = (tsresol & 0x7f) as u32;
        if e <= 9 {
            t * 10u128.pow(9 - e)
        } else {
            t / 10u128.pow((e - 9).min(38))
        }
    } else {
        let e = (tsresol & 0x7f) as u32;
        if e >= 127 {
            0
        } else {
            (t * 1_000_000_000) >> e
        }
    };
    ns.min(u64::MAX as u128) as u64
}

fn read_pcapng(bytes: &[u8]) -> Result<Capture, PcapError> {
    let mut r = PcapNgReader::new(bytes).map_err(|e| from_lib(e, None))?;
    // (link, tsresol) per interface of the current section.
    let mut ifaces: Vec<(LinkType, u8)> = Vec::new();
    let mut link: Option<LinkType> = None;
    let mut packets = Vec::new();
    while let Some(b) = r.next_block() {
        let idx = packets.len();
        let b = b.map_err(|e| from_lib(e, Some(idx)))?;
        let (iface, ticks, data) = match b {
            Block::SectionHeader(_) => {
                ifaces.clear();
                continue;
            }
            Block::InterfaceDescription(idb) => {
                let l = link_of(idb.linktype).map_err(|mut e| {
                    e.packet = Some(idx);
                    e
                })?;
                if link.is_some_and(|x| x != l) {
                    return Err(err(PcapErrorKind::MixedLinkTypes, Some(idx)));
                }
                link = Some(l);
                let tsresol = idb
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                        _ => None,
                    })
                    .unwrap_or(6);
                ifaces.push((l, tsresol));
                continue;
            }
            // pcap-file hands the raw 64-bit tick count over as "nanoseconds".
            Block::EnhancedPacket(p) => (
                p.interface_id,
                p.timestamp.as_nanos() as u64,
                p.data.into_owned(),
            ),
            Block::Packet(p) => (p.interface_id as u32, p.timestamp, p.data.into_owned()),
            Block::SimplePacket(p) => (0, 0, p.data.into_owned()),
            _ => continue,
        };
        let Some(&(_, tsresol)) = ifaces.get(iface as usize) else {
            return Err(err(
                PcapErrorKind::Malformed(format!("no interface {iface}")),
                Some(idx),
            ));
        };
        packets.push(CapturedPacket {
            ts_ns: ticks_to_ns(ticks, tsresol),
            data,
        });
    }
    Ok(Capture {
        link: link.unwrap_or(LinkType::Ethernet),
        packets,
    })
}

fn to_io(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        other => io::Error::new(ErrorKind::InvalidData, other.to_string()),
    }
}

/// Writes a classic pcap (nanosecond-resolution magic, little endian,
/// snaplen 65535) of one link type.
pub struct Writer<W: Write> {
    inner: PcapWriter<W>,
}

impl<W: Write> Writer<W> {
    /// Writes the file header.
    pub fn new(w: W, link: LinkType) -> io::Result<Self> {
        let header = PcapHeader {
            snaplen: SNAPLEN,
            datalink: DataLink::from(link.pcap_code()),
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        Ok(Writer {
            inner: PcapWriter::with_header(w, header).map_err(to_io)?,
        })
    }

    /// Writes one packet (truncated to the snap length, original length kept).
    pub fn write(&mut self, ts_ns: u64, data: &[u8]) -> io::Result<()> {
        let cap = &data[..data.len().min(SNAPLEN as usize)];
        let orig = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let p = PcapPacket::new(Duration::from_nanos(ts_ns), orig, cap);
        self.inner.write_packet(&p).map_err(to_io)?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(self) -> io::Result<W> {
        let mut w = self.inner.into_writer();
        w.flush()?;
        Ok(w)
    }
}
