//! Whole Ethernet frames straight to an interface's transmit path.
//!
//! A frame the workers have already routed (its MACs from their FIB) needs nothing more from the
//! node: sending it through the tap would have the kernel's IP stack route it again, and
//! netfilter see it, for nothing. A [`PacketTx`] hands it to the egress interface's transmit
//! instead (`dev_queue_xmit`, through its qdisc), through an `AF_PACKET` `SOCK_RAW` socket with
//! `PACKET_VNET_HDR`: each frame goes with its [`VirtioNetHdr`], so GSO super-frames and partial
//! checksums pass whole and are segmented and completed by the device (or the kernel just
//! before it). The socket's protocol is 0, so it is bound to nothing and receives nothing.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::tap::VirtioNetHdr;

/// An Ethernet header's length: the destination and source MACs and the EtherType.
const ETH_HLEN: usize = 14;

/// A send-only packet socket whose frames carry a virtio-net header.
pub struct PacketTx {
    fd: OwnedFd,
}

/// `setsockopt(fd, level, name, &value)` for an `int` option.
fn setsockopt_int(fd: &OwnedFd, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length given is its size; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The link-layer address a frame is sent to: the interface, the EtherType (which becomes the
/// skb's protocol, what the GSO and checksum code go by) and the destination MAC.
fn sockaddr_ll(ifindex: u32, frame: &[u8]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as libc::c_ushort;
    // Already in network order in the frame: kept as it is.
    sa.sll_protocol = u16::from_ne_bytes([frame[12], frame[13]]);
    sa.sll_ifindex = ifindex as libc::c_int;
    sa.sll_halen = 6;
    sa.sll_addr[..6].copy_from_slice(&frame[..6]);
    sa
}

impl PacketTx {
    /// An `AF_PACKET` `SOCK_RAW` socket (non-blocking, protocol 0) in the calling thread's
    /// network namespace, with `PACKET_VNET_HDR` on.
    pub fn open() -> io::Result<PacketTx> {
        let fd = crate::sys::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, 0)
            .map_err(|e| io::Error::new(e.kind(), format!("AF_PACKET socket: {e}")))?;
        setsockopt_int(&fd, libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1).map_err(|e| {
            io::Error::new(e.kind(), format!("AF_PACKET socket: PACKET_VNET_HDR: {e}"))
        })?;
        Ok(PacketTx { fd })
    }

    /// Sends one frame (from its Ethernet header) out of interface `ifindex`, GSO and partial
    /// checksum as `hdr` says. Never blocks: a full queue is `WouldBlock` (or `ENOBUFS`), and
    /// the errno is returned as it is (no context: this is the fast path, the caller knows the
    /// interface). A frame shorter than an Ethernet header is `InvalidInput`.
    pub fn send(&self, ifindex: u32, hdr: &VirtioNetHdr, frame: &[u8]) -> io::Result<()> {
        if frame.len() < ETH_HLEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("AF_PACKET send: a {}-byte frame", frame.len()),
            ));
        }
        let h = hdr.to_bytes();
        let iov = crate::tap::header_and_frame(&h, frame);
        let mut sa = sockaddr_ll(ifindex, frame);
        // SAFETY: msghdr is plain data; all-zero (no control data, no flags) is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut sa as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: `msg` points to `sa` and to the two iovecs, which describe live buffers of the
        // given lengths (`h`, `frame`); all outlive the call and sendmsg only reads them.
        let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // A packet socket takes a frame whole or not at all; the count includes the virtio-net
        // header (6.x kernels), so anything short of the frame means it was not sent.
        if (n as usize) < frame.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("AF_PACKET send: {n} of {} bytes", frame.len()),
            ));
        }
        Ok(())
    }
}

/// The most frames [`PacketTx::send_batch`] hands the kernel in one `sendmmsg`.
const SEND_BATCH: usize = 8;

/// One frame for [`PacketTx::send_batch`]: out of interface `ifindex`, GSO and partial
/// checksum as `hdr` says.
#[derive(Clone, Copy)]
pub struct Outgoing<'a> {
    pub ifindex: u32,
    pub hdr: VirtioNetHdr,
    pub frame: &'a [u8],
}

impl PacketTx {
    /// Sends `frames` with one `sendmmsg` per [`SEND_BATCH`] of them (one more where the kernel
    /// refuses a frame: it stops there, and the rest go in the next call), and says how each
    /// went through `sent(i, result)`, every frame once, in order, with the errors of
    /// [`PacketTx::send`].
    pub fn send_batch(&self, frames: &[Outgoing<'_>], mut sent: impl FnMut(usize, io::Result<()>)) {
        for (c, chunk) in frames.chunks(SEND_BATCH).enumerate() {
            self.send_chunk(chunk, &mut |i, r| sent(c * SEND_BATCH + i, r));
        }
    }

    /// [`PacketTx::send_batch`] of at most [`SEND_BATCH`] frames.
    fn send_chunk(&self, frames: &[Outgoing<'_>], sent: &mut impl FnMut(usize, io::Result<()>)) {
        let n = frames.len().min(SEND_BATCH);
        let hdrs: [[u8; VirtioNetHdr::LEN]; SEND_BATCH] = std::array::from_fn(|i| {
            frames
                .get(i)
                .map_or([0; VirtioNetHdr::LEN], |f| f.hdr.to_bytes())
        });
        let iovs: [[libc::iovec; 2]; SEND_BATCH] = std::array::from_fn(|i| {
            crate::tap::header_and_frame(&hdrs[i], frames.get(i).map_or(&[][..], |f| f.frame))
        });
        let mut addrs: [libc::sockaddr_ll; SEND_BATCH] =
            std::array::from_fn(|i| match frames.get(i) {
                Some(f) if f.frame.len() >= ETH_HLEN => sockaddr_ll(f.ifindex, f.frame),
                // SAFETY: sockaddr_ll is plain data; all-zero is a valid value (never sent).
                _ => unsafe { std::mem::zeroed() },
            });
        // SAFETY: mmsghdr is plain data; all-zero (no name, no data, no control) is valid.
        let mut msgs: [libc::mmsghdr; SEND_BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            let h = &mut msgs[i].msg_hdr;
            h.msg_name = (&mut addrs[i] as *mut libc::sockaddr_ll).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            h.msg_iov = iovs[i].as_ptr() as *mut libc::iovec;
            h.msg_iovlen = 2;
        }
        let mut at = 0;
        while at < n {
            if frames[at].frame.len() < ETH_HLEN {
                sent(
                    at,
                    Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("AF_PACKET send: a {}-byte frame", frames[at].frame.len()),
                    )),
                );
                at += 1;
                continue;
            }
            // Up to the next frame too short to send (refused above, on its turn).
            let end = (at..n)
                .find(|&i| frames[i].frame.len() < ETH_HLEN)
                .unwrap_or(n);
            // SAFETY: `msgs[at..end]` point to `addrs`, `iovs` and, through them, to `hdrs` and
            // the frames, all live for the call; sendmmsg only reads them and writes each
            // message's `msg_len`.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs[at..end].as_mut_ptr(),
                    (end - at) as libc::c_uint,
                    libc::MSG_DONTWAIT as _,
                )
            };
            if r <= 0 {
                // The first message failed (its errno; the rest are tried next).
                sent(
                    at,
                    Err(if r < 0 {
                        io::Error::last_os_error()
                    } else {
                        io::Error::from(io::ErrorKind::WriteZero)
                    }),
                );
                at += 1;
                continue;
            }
            for i in at..at + r as usize {
                let len = msgs[i].msg_len as usize;
                sent(
                    i,
                    if len < frames[i].frame.len() {
                        Err(io::Error::new(
                            io::ErrorKind::WriteZero,
                            format!("AF_PACKET send: {len} of {} bytes", frames[i].frame.len()),
                        ))
                    } else {
                        Ok(())
                    },
                );
            }
            at += r as usize;
        }
    }
}

/// Whether `e`, from [`PacketTx::send`], says the frame is longer than the interface's MTU (a
/// frame without GSO; the kernel's `packet_snd` checks no more than that): the caller can still
/// hand it to the kernel's routing, which fragments it or answers with an ICMP "too big".
pub fn too_big(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EMSGSIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::testing::{capture_on, in_private_netns};
    use crate::tap::{VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4};
    use std::time::{Duration, Instant};

    /// One received frame's length; None on timeout.
    fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: `buf` is live and writable for its length during the call.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        (n >= 0).then_some(n as usize)
    }

    /// The Internet checksum's 16-bit one's-complement sum of `data`, folded, not complemented.
    fn sum16(data: &[u8], mut acc: u32) -> u16 {
        for c in data.chunks(2) {
            acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    /// An Ethernet + IPv4 frame from 10.0.0.1 to 10.0.0.2 with protocol `proto` and `l4` after the
    /// IP header (whose checksum is filled in).
    fn ipv4_frame(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 34];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        f[22] = 64;
        f[23] = proto;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        let c = !sum16(&f[14..34], 0);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(l4);
        f
    }

    /// Whether `ip link show` calls the interface's operational state up: until then its qdisc
    /// may still be the one that drops everything.
    fn wait_up(name: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let o = std::process::Command::new("ip")
                .args(["-o", "link", "show", name])
                .output();
            if o.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("state UP")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn a_short_frame_is_refused() {
        let Ok(tx) = PacketTx::open() else {
            eprintln!("SKIPPED: no AF_PACKET socket here (not root?)");
            return;
        };
        let e = tx
            .send(1, &VirtioNetHdr::default(), &[0u8; 13])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    /// Needs root and `ip`; runs in a private network namespace (a thread of its own). Frames
    /// sent on one end of a veth arrive on the other: a plain one byte for byte, a TCP GSO
    /// super-frame with a partial checksum whole or as segments.
    #[test]
    fn frames_go_out_whole() {
        in_private_netns(|| {
            let run = |c: &str| std::process::Command::new("sh").args(["-c", c]).status();
            // No IPv6: fewer frames of the kernel's own on the link.
            let _ = run(
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
            );
            let _ = run("ip link add kxpa type veth peer name kxpb && ip link set kxpa up && ip link set kxpb up");
            let (Ok(a), Ok(b)) = (crate::ifindex("kxpa"), crate::ifindex("kxpb")) else {
                eprintln!("SKIPPED: no veth here");
                return;
            };
            assert!(wait_up("kxpa") && wait_up("kxpb"), "the veth comes up");
            let rx = capture_on(b, 2);
            let tx = PacketTx::open().unwrap();
            let mut buf = vec![0u8; 70_000];

            // 1. A plain UDP frame, no offloads: byte for byte.
            let mut udp = vec![0u8; 26];
            udp[..2].copy_from_slice(&1000u16.to_be_bytes());
            udp[2..4].copy_from_slice(&2000u16.to_be_bytes());
            udp[4..6].copy_from_slice(&26u16.to_be_bytes());
            for (i, x) in udp[8..].iter_mut().enumerate() {
                *x = i as u8 + 1;
            }
            let plain = ipv4_frame(17, &udp);
            assert_eq!(plain.len(), 60);
            tx.send(a, &VirtioNetHdr::default(), &plain).unwrap();
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut found = false;
            while !found && Instant::now() < deadline {
                let Some(n) = recv(&rx, &mut buf) else { break };
                found = buf[..n] == plain[..];
            }
            assert!(found, "the plain frame arrives whole");

            // 2. A TCP super-frame of 3000 bytes, MSS 1000, its checksum partial: the field holds
            // the pseudo-header sum (addresses, protocol, TCP length), not complemented.
            let payload = 3000;
            let mut tcp = vec![0u8; 20 + payload];
            tcp[..2].copy_from_slice(&1000u16.to_be_bytes());
            tcp[2..4].copy_from_slice(&2000u16.to_be_bytes());
            tcp[4..8].copy_from_slice(&1u32.to_be_bytes());
            tcp[12] = 5 << 4;
            tcp[13] = 0x18; // PSH, ACK
            tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
            for (i, x) in tcp[20..].iter_mut().enumerate() {
                *x = i as u8;
            }
            let mut pseudo = [0u8; 12];
            pseudo[..4].copy_from_slice(&[10, 0, 0, 1]);
            pseudo[4..8].copy_from_slice(&[10, 0, 0, 2]);
            pseudo[9] = 6;
            pseudo[10..12].copy_from_slice(&(tcp.len() as u16).to_be_bytes());
            tcp[16..18].copy_from_slice(&sum16(&pseudo, 0).to_be_bytes());
            let sf = ipv4_frame(6, &tcp);
            let hdr = VirtioNetHdr {
                flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
                gso_type: VIRTIO_NET_HDR_GSO_TCPV4,
                hdr_len: 54,
                gso_size: 1000,
                csum_start: 34,
                csum_offset: 16,
            };
            tx.send(a, &hdr, &sf).unwrap();
            // Its TCP payload bytes, whole or segmented, between the same addresses and ports.
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut got = 0;
            while got < payload && Instant::now() < deadline {
                let Some(n) = recv(&rx, &mut buf) else { break };
                let f = &buf[..n];
                if n >= 54 && f[12..14] == sf[12..14] && f[23] == 6 && f[26..38] == sf[26..38] {
                    let ip_len = usize::from(u16::from_be_bytes([f[16], f[17]]));
                    got += ip_len.saturating_sub(20 + usize::from(f[46] >> 4) * 4);
                }
            }
            assert!(got >= payload, "{got} of {payload} payload bytes arrived");

            // 3. No such interface: the kernel's errno as it is.
            let e = tx.send(9999, &VirtioNetHdr::default(), &plain).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
            assert!(!too_big(&e));

            // 4. Longer than the interface's MTU, no GSO: refused as too big; the super-frame
            // above still goes (the device segments it).
            let _ = run("ip link set kxpa mtu 1280");
            let big = ipv4_frame(17, &vec![0u8; 1400]);
            let e = tx.send(a, &VirtioNetHdr::default(), &big).unwrap_err();
            assert!(too_big(&e), "{e}");
            tx.send(a, &hdr, &sf).unwrap();

            // 5. A batch: each frame's own result, in order; the ones the kernel or the length
            // check refuse do not hold back those after them, which arrive.
            let marked = |m: u8| {
                let mut f = plain.clone();
                f[59] = m;
                f
            };
            let (one, two, three) = (marked(0xa1), marked(0xa2), marked(0xa3));
            let plain_hdr = VirtioNetHdr::default();
            let out = |ifindex, frame| Outgoing {
                ifindex,
                hdr: plain_hdr,
                frame,
            };
            let batch = [
                out(a, &one[..]),
                out(a, &big[..]),
                out(a, &two[..]),
                out(a, &[0u8; 13][..]),
                out(9999, &plain[..]),
                out(a, &three[..]),
            ];
            let mut results = Vec::new();
            tx.send_batch(&batch, |i, r| results.push((i, r)));
            let order: Vec<usize> = results.iter().map(|(i, _)| *i).collect();
            assert_eq!(order, [0, 1, 2, 3, 4, 5]);
            let ok: Vec<bool> = results.iter().map(|(_, r)| r.is_ok()).collect();
            assert_eq!(ok, [true, false, true, false, false, true], "{results:?}");
            assert!(matches!(&results[1].1, Err(e) if too_big(e)));
            assert!(matches!(&results[3].1, Err(e) if e.kind() == io::ErrorKind::InvalidInput));
            assert!(matches!(&results[4].1, Err(e) if e.raw_os_error() == Some(libc::ENXIO)));
            let mut arrived = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(2);
            while arrived.len() < 3 && Instant::now() < deadline {
                let Some(n) = recv(&rx, &mut buf) else { break };
                if n == 60 && buf[..59] == plain[..59] {
                    arrived.push(buf[59]);
                }
            }
            assert_eq!(arrived, [0xa1, 0xa2, 0xa3]);

            // 6. More frames than one `sendmmsg` takes: all of them, in order.
            let many: Vec<Vec<u8>> = (0..SEND_BATCH as u8 + 3)
                .map(|m| marked(0xb0 + m))
                .collect();
            let batch: Vec<Outgoing> = many.iter().map(|f| out(a, &f[..])).collect();
            let mut results = Vec::new();
            tx.send_batch(&batch, |i, r| results.push((i, r.is_ok())));
            let want: Vec<(usize, bool)> = (0..many.len()).map(|i| (i, true)).collect();
            assert_eq!(results, want);
            let mut arrived = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(2);
            while arrived.len() < many.len() && Instant::now() < deadline {
                let Some(n) = recv(&rx, &mut buf) else { break };
                if n == 60 && buf[..59] == plain[..59] {
                    arrived.push(buf[59]);
                }
            }
            let want: Vec<u8> = many.iter().map(|f| f[59]).collect();
            assert_eq!(arrived, want);
        });
    }
}
