//! A kxdp-owned tap device that exchanges whole GSO packets with the kernel: opened with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` (and `IFF_MULTI_QUEUE`, one descriptor per queue) and the
//! checksum and TSO offloads turned on (`TUNSETOFFLOAD`), so that a packet the kernel sends out of
//! the tap arrives here as one frame of up to 64 KB with a [`VirtioNetHdr`] saying how to segment
//! and checksum it, and a frame written back with its header re-enters the kernel the same way.
//!
//! The header's fields are in the host's byte order (a tap without `TUNSETVNETLE`/`BE` uses the
//! legacy virtio layout, which is native on little-endian hosts). The device exists while one of
//! its queue descriptors is open; dropping the last [`TapQueue`] removes it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::sys::fd_result;

/// The `iovec` of `buf` (for `readv`; the borrow ends here, the caller keeps `buf` alive).
fn iovec(buf: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

/// The `iovec`s of a frame sent with its virtio-net header: the header's bytes, then the frame
/// (for `writev`/`sendmsg`, which only read them; the caller keeps both alive).
pub(crate) fn header_and_frame(h: &[u8; VirtioNetHdr::LEN], frame: &[u8]) -> [libc::iovec; 2] {
    [
        libc::iovec {
            iov_base: h.as_ptr() as *mut libc::c_void,
            iov_len: h.len(),
        },
        libc::iovec {
            iov_base: frame.as_ptr() as *mut libc::c_void,
            iov_len: frame.len(),
        },
    ]
}

/// An 802.1Q tag's length and EtherType.
const VLAN_HLEN: usize = 4;
const ETH_P_8021Q: u16 = 0x8100;

/// `virtio_net_hdr.flags`: the L4 checksum is partial (`CHECKSUM_PARTIAL`): the field at
/// `csum_start + csum_offset` holds the uncomplemented pseudo-header sum and whoever sends the
/// packet on completes it over `csum_start..`.
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// `virtio_net_hdr.flags`: the checksums were verified (`CHECKSUM_UNNECESSARY`).
pub const VIRTIO_NET_HDR_F_DATA_VALID: u8 = 2;
/// `virtio_net_hdr.gso_type` values.
pub const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
pub const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
pub const VIRTIO_NET_HDR_GSO_UDP: u8 = 3;
pub const VIRTIO_NET_HDR_GSO_TCPV6: u8 = 4;
pub const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
/// Flag bit of `gso_type`: the TCP segments carry ECN (CWR set on the first only).
pub const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;

/// `TUNSETOFFLOAD` bits: what the tap accepts from the kernel unsegmented / with partial checksums.
pub const TUN_F_CSUM: u32 = 0x01;
pub const TUN_F_TSO4: u32 = 0x02;
pub const TUN_F_TSO6: u32 = 0x04;
pub const TUN_F_TSO_ECN: u32 = 0x08;
pub const TUN_F_USO4: u32 = 0x20;
pub const TUN_F_USO6: u32 = 0x40;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
// _IOW('T', 202, int) and _IOW('T', 208, unsigned int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;

/// The largest frame a tap hands over: a 64 KB GSO packet and its Ethernet header, with room.
pub const MAX_FRAME: usize = 65_536 + 256;

/// `struct virtio_net_hdr` (10 bytes), the metadata of one tap frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioNetHdr {
    /// `VIRTIO_NET_HDR_F_*`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`, possibly with [`VIRTIO_NET_HDR_GSO_ECN`].
    pub gso_type: u8,
    /// Length of the headers (Ethernet to L4) each segment repeats; a hint.
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS for TCP) when `gso_type` is not NONE.
    pub gso_size: u16,
    /// With NEEDS_CSUM: where checksumming starts, from the frame's first (Ethernet) byte.
    pub csum_start: u16,
    /// With NEEDS_CSUM: where the checksum field is, from `csum_start`.
    pub csum_offset: u16,
}

impl VirtioNetHdr {
    pub const LEN: usize = 10;

    pub fn from_bytes(b: &[u8; Self::LEN]) -> VirtioNetHdr {
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
    }

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }

    /// The L4 checksum field holds a partial (pseudo-header) sum, not a complete checksum.
    pub fn needs_csum(&self) -> bool {
        self.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0
    }

    /// The frame is a GSO super-frame the kernel segments on its way out.
    pub fn is_gso(&self) -> bool {
        self.gso_type & !VIRTIO_NET_HDR_GSO_ECN != VIRTIO_NET_HDR_GSO_NONE
    }
}

/// One queue of a tap device (a descriptor from `/dev/net/tun`).
pub struct TapQueue {
    fd: OwnedFd,
    name: String,
}

/// `struct ifreq` with the name and the flags only (what TUNSETIFF reads).
fn ifreq(name: &str, flags: libc::c_short) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IF_NAMESIZE || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("tap name {name:?}: 1 to 15 bytes, no NUL"),
        ));
    }
    // SAFETY: a zeroed ifreq is a valid value of this plain C struct.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in name.bytes().enumerate() {
        ifr.ifr_name[i] = b as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = flags;
    Ok(ifr)
}

/// A datagram socket of the calling thread's network namespace, for the device ioctls.
fn device_socket() -> io::Result<OwnedFd> {
    // SAFETY: a plain socket() call; the result is checked.
    fd_result(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }
            as libc::c_long,
    )
}

/// `ioctl(fd, req, arg)` for requests whose argument is a pointer or an integer.
fn ioctl(fd: &OwnedFd, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the callers pass requests with an argument of the kind the request expects (a
    // pointer to a live ifreq for TUNSETIFF and the SIOC* device requests, an integer for
    // TUNSETOFFLOAD).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl TapQueue {
    /// Opens `queues` queues of the tap `name` in the calling thread's network namespace
    /// (created if missing, attached to if it exists as a multi-queue tap with a vnet header)
    /// with the `offloads` (`TUN_F_*`) turned on. The device starts down.
    pub fn open(name: &str, queues: usize, offloads: u32) -> io::Result<Vec<TapQueue>> {
        let mut out = Vec::with_capacity(queues);
        let path = CString::new("/dev/net/tun").expect("no NUL");
        for _ in 0..queues.max(1) {
            // SAFETY: `path` is a valid NUL-terminated string; the result is checked.
            let fd = fd_result(
                unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }
                    as libc::c_long,
            )
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
            let mut ifr = ifreq(name, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE)?;
            ioctl(
                &fd,
                TUNSETIFF,
                &mut ifr as *mut libc::ifreq as libc::c_ulong,
            )
            .map_err(|e| io::Error::new(e.kind(), format!("tap {name}: TUNSETIFF: {e}")))?;
            ioctl(&fd, TUNSETOFFLOAD, offloads as libc::c_ulong).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("tap {name}: TUNSETOFFLOAD {offloads:#x}: {e}"),
                )
            })?;
            out.push(TapQueue {
                fd,
                name: name.to_string(),
            });
        }
        Ok(out)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes [`TapQueue::read`] return `WouldBlock` instead of waiting when there is no frame
    /// (a worker that polls several ports, or busy-polls).
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        // SAFETY: F_GETFL/F_SETFL on a descriptor this queue owns; no memory is passed.
        let flags = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        if unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_SETFL, flags) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The device's Ethernet address (`SIOCGIFHWADDR` on the queue): what a frame written into
    /// the tap must be addressed to, or the kernel drops it as another host's.
    pub fn mac(&self) -> io::Result<[u8; 6]> {
        let mut ifr = ifreq(&self.name, 0)?;
        ioctl(
            &self.fd,
            libc::SIOCGIFHWADDR as libc::c_ulong,
            &mut ifr as *mut libc::ifreq as libc::c_ulong,
        )
        .map_err(|e| io::Error::new(e.kind(), format!("tap {}: SIOCGIFHWADDR: {e}", self.name)))?;
        // SAFETY: SIOCGIFHWADDR filled in the sockaddr member of the union.
        let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (m, b) in mac.iter_mut().zip(sa.sa_data.iter()) {
            *m = *b as u8;
        }
        Ok(mac)
    }

    /// Sets the device up (`SIOCSIFFLAGS` through a datagram socket of the calling thread's
    /// network namespace, the one the tap was opened in).
    pub fn set_up(&self) -> io::Result<()> {
        let sock = device_socket()?;
        let mut ifr = ifreq(&self.name, 0)?;
        let get = &mut ifr as *mut libc::ifreq as libc::c_ulong;
        ioctl(&sock, libc::SIOCGIFFLAGS as libc::c_ulong, get)?;
        // SAFETY: SIOCGIFFLAGS filled in the flags member of the union.
        let flags = unsafe { ifr.ifr_ifru.ifru_flags };
        ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        let set = &mut ifr as *mut libc::ifreq as libc::c_ulong;
        ioctl(&sock, libc::SIOCSIFFLAGS as libc::c_ulong, set)
            .map_err(|e| io::Error::new(e.kind(), format!("tap {}: setting it up: {e}", self.name)))
    }

    /// Sets the device's transmit queue length (`SIOCSIFTXQLEN`): for a tap, how many frames
    /// each queue holds for its reader; the kernel drops what comes beyond (`tx_dropped`).
    pub fn set_queue_length(&self, frames: u32) -> io::Result<()> {
        let qlen = libc::c_int::try_from(frames)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "queue length"))?;
        let sock = device_socket()?;
        let mut ifr = ifreq(&self.name, 0)?;
        // `ifr_qlen` is the union's int member.
        ifr.ifr_ifru.ifru_metric = qlen;
        let set = &mut ifr as *mut libc::ifreq as libc::c_ulong;
        ioctl(&sock, libc::SIOCSIFTXQLEN as libc::c_ulong, set).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("tap {}: queue length {frames}: {e}", self.name),
            )
        })
    }

    /// Waits up to `timeout_ms` for a frame to read; false on timeout.
    pub fn wait_readable(&self, timeout_ms: i32) -> io::Result<bool> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, the count says one.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        match r {
            r if r < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }

    /// Reads one frame (blocking) into `frame`: its header and its length. `frame` should hold
    /// [`MAX_FRAME`] bytes; a shorter buffer truncates large frames (the kernel drops the rest).
    pub fn read(&self, frame: &mut [u8]) -> io::Result<(VirtioNetHdr, usize)> {
        let mut hdr = [0u8; VirtioNetHdr::LEN];
        let iov = [iovec(&mut hdr), iovec(frame)];
        let len = self.readv_frame(&iov)?;
        Ok((VirtioNetHdr::from_bytes(&hdr), len))
    }

    /// One `readv` of a frame into `iov`, whose first entry is the vnet header: the length read
    /// after the header.
    fn readv_frame(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: every iovec describes a live, writable buffer of its length, disjoint from
        // the others (made by `iovec` from distinct `&mut` slices the caller holds).
        let n = unsafe { libc::readv(self.fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < VirtioNetHdr::LEN {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "tap {}: {n}-byte read, shorter than its vnet header",
                    self.name
                ),
            ));
        }
        Ok(n - VirtioNetHdr::LEN)
    }

    /// Reads one frame (blocking) as [`TapQueue::read`] does, taking an 802.1Q tag after the
    /// Ethernet addresses out of it on the way (scattered into a word of its own, so the
    /// frame is not moved): its header (`csum_start` then counts from the untagged frame),
    /// its untagged length and the tag's VLAN ID. A frame without a tag comes back whole,
    /// with None.
    pub fn read_untagged(
        &self,
        frame: &mut [u8],
    ) -> io::Result<(VirtioNetHdr, usize, Option<u16>)> {
        const MACS: usize = 12;
        let mut hdr = [0u8; VirtioNetHdr::LEN];
        let mut tag = [0u8; VLAN_HLEN];
        if frame.len() < MACS + VLAN_HLEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("tap {}: a {}-byte buffer", self.name, frame.len()),
            ));
        }
        let (macs, rest) = frame.split_at_mut(MACS);
        let rest_len = rest.len() - VLAN_HLEN;
        let iov = [
            iovec(&mut hdr),
            iovec(macs),
            iovec(&mut tag),
            iovec(&mut rest[..rest_len]),
        ];
        let len = self.readv_frame(&iov)?;
        let mut hdr = VirtioNetHdr::from_bytes(&hdr);
        if len >= MACS + VLAN_HLEN && tag[..2] == ETH_P_8021Q.to_be_bytes() {
            if hdr.needs_csum() {
                hdr.csum_start = hdr.csum_start.saturating_sub(VLAN_HLEN as u16);
            }
            let vid = u16::from_be_bytes([tag[2], tag[3]]) & 0x0fff;
            return Ok((hdr, len - VLAN_HLEN, Some(vid)));
        }
        // No tag: the word read aside belongs in the frame, after the addresses.
        let len = len.min(frame.len());
        if len > MACS {
            let moved = len.saturating_sub(MACS + VLAN_HLEN);
            frame.copy_within(MACS..MACS + moved, MACS + VLAN_HLEN);
            let word = (len - MACS).min(VLAN_HLEN);
            frame[MACS..MACS + word].copy_from_slice(&tag[..word]);
        }
        Ok((hdr, len, None))
    }

    /// Writes one frame (from its Ethernet header) with its header: the kernel receives it on
    /// the tap as if the wire had (GSO and partial checksum as `hdr` says).
    pub fn write(&self, hdr: &VirtioNetHdr, frame: &[u8]) -> io::Result<()> {
        let h = hdr.to_bytes();
        let iov = header_and_frame(&h, frame);
        // SAFETY: both iovecs describe live buffers of the given lengths; writev only reads them.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != h.len() + frame.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "tap {}: short write {n} of {}",
                    self.name,
                    h.len() + frame.len()
                ),
            ));
        }
        Ok(())
    }
}

impl AsRawFd for TapQueue {
    fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_ECN,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        assert_eq!(VirtioNetHdr::from_bytes(&h.to_bytes()), h);
        assert!(h.needs_csum() && h.is_gso());
        let plain = VirtioNetHdr::default();
        assert!(!plain.needs_csum() && !plain.is_gso());
        let ecn_only = VirtioNetHdr {
            gso_type: VIRTIO_NET_HDR_GSO_ECN,
            ..plain
        };
        assert!(!ecn_only.is_gso());
    }

    #[test]
    fn bad_names_are_refused() {
        for n in ["", "a-name-of-16-byt", "a\0b"] {
            let e = TapQueue::open(n, 1, 0).err().expect("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{n:?}");
        }
    }

    /// Needs root and /dev/net/tun; skipped (with a note) without them. Runs in a private
    /// network namespace (a thread of its own) so the host's never sees the device.
    #[test]
    fn opens_queues_and_sets_offloads() {
        std::thread::spawn(|| {
            // SAFETY: unshare only changes this thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "SKIPPED: no private network namespace: {}",
                    io::Error::last_os_error()
                );
                return;
            }
            let name = "kxtap0";
            let qs = match TapQueue::open(name, 2, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) {
                Ok(q) => q,
                Err(e) => {
                    eprintln!("SKIPPED: no tap here: {e}");
                    return;
                }
            };
            assert_eq!(qs.len(), 2);
            assert_eq!(qs[1].name(), name);
            assert!(crate::ifindex(name).is_ok());
            assert!(
                !qs[0].wait_readable(0).unwrap(),
                "a down tap has nothing to read"
            );
            let mac = qs[0].mac().unwrap();
            assert_eq!(mac[0] & 1, 0, "a unicast address: {mac:02x?}");
            qs[0].set_up().unwrap();
            qs[0].set_queue_length(256).unwrap();
            let sock = device_socket().unwrap();
            let mut ifr = ifreq(name, 0).unwrap();
            let get = &mut ifr as *mut libc::ifreq as libc::c_ulong;
            ioctl(&sock, libc::SIOCGIFTXQLEN as libc::c_ulong, get).unwrap();
            // SAFETY: SIOCGIFTXQLEN filled in the union's int member.
            assert_eq!(unsafe { ifr.ifr_ifru.ifru_metric }, 256);
            drop(qs);
            // A test running beside this one may fork while it holds the descriptors (until the
            // child's exec closes them): the device goes within moments, not always at once.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while crate::ifindex(name).is_ok() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(
                crate::ifindex(name).is_err(),
                "the device goes with its last queue"
            );
        })
        .join()
        .unwrap();
    }
}
