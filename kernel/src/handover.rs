//! Handing kernel objects to another process: a memfd for memory both can map, and messages
//! with file descriptors attached (`SCM_RIGHTS`) over a Unix stream socket.
//!
//! A takeover (docs/operations.md) passes a running kxdp's UMEM (a memfd), AF_XDP sockets, XDP
//! programs, BPF links and maps to its successor. A descriptor received this way refers to the
//! same kernel object as the sender's (as after `dup`): an AF_XDP socket stays bound, a BPF link
//! keeps its program attached, for as long as either process holds it.
//!
//! Wire format of one message: a header (`u32` payload length, `u32` descriptor count, little
//! endian), the payload, then the descriptors in groups of at most [`FDS_PER_GROUP`], each group
//! riding on one marker byte (`sendmsg` with `SCM_RIGHTS`). The receiver reads each marker with
//! its own `recvmsg` of one byte, so no descriptor is ever attached to bytes read with `read`
//! (which would close them).

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::sys::fd_result;

/// Descriptors per `sendmsg` (the kernel's limit, `SCM_MAX_FD`, is 253).
pub const FDS_PER_GROUP: usize = 200;

/// The largest payload accepted (a description of frames and sockets: well below this).
pub const MAX_PAYLOAD: usize = 64 << 20;

/// A memfd of `len` bytes (`memfd_create` + `ftruncate`), for memory another process can map.
pub fn memfd(name: &CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; the result is checked by `fd_result`.
    let fd =
        fd_result(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) } as libc::c_long)?;
    // SAFETY: plain syscall on the descriptor just created.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The size of the file behind `fd` (`fstat`).
pub fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: a zeroed `stat` is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// Sends one message: `payload` and `fds` (any number).
pub fn send_message(sock: &UnixStream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut header = [0u8; 8];
    header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..].copy_from_slice(&(fds.len() as u32).to_le_bytes());
    let mut w = sock;
    w.write_all(&header)?;
    w.write_all(payload)?;
    for group in fds.chunks(FDS_PER_GROUP) {
        send_fds(sock, group)?;
    }
    Ok(())
}

/// Receives one message sent by [`send_message`].
pub fn recv_message(sock: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut r = sock;
    let mut header = [0u8; 8];
    r.read_exact(&mut header)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let count = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
    if len > MAX_PAYLOAD || count > 1 << 20 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("handover message too large: {len} bytes, {count} descriptors"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    let mut fds = Vec::with_capacity(count);
    while fds.len() < count {
        let want = (count - fds.len()).min(FDS_PER_GROUP);
        let got = recv_fds(sock, want)?;
        if got.len() != want {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "handover message: expected {want} descriptors in a group, got {}",
                    got.len()
                ),
            ));
        }
        fds.extend(got);
    }
    Ok((payload, fds))
}

/// Space for the control message of `n` descriptors, as `u64`s (aligned for `cmsghdr`).
fn cmsg_buffer(n: usize) -> Vec<u64> {
    // SAFETY: CMSG_SPACE only computes a size.
    let bytes = unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<i32>()) as u32) } as usize;
    vec![0u64; bytes.div_ceil(8)]
}

/// One marker byte carrying `fds` (at most `FDS_PER_GROUP`).
fn send_fds(sock: &UnixStream, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut buf = cmsg_buffer(fds.len());
    let mut marker = [b'F'];
    let mut iov = libc::iovec {
        iov_base: marker.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(buf.as_slice()) as _;
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: the control buffer was sized with CMSG_SPACE for these descriptors, so the first
    // header and its data area lie inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
        let data = libc::CMSG_DATA(c).cast::<i32>();
        for (i, fd) in fds.iter().enumerate() {
            data.add(i).write_unaligned(fd.as_raw_fd());
        }
        msg.msg_controllen = libc::CMSG_SPACE(data_len) as _;
    }
    // SAFETY: `msg` points at live buffers (above); the socket is ours.
    let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if r != 1 {
        return Err(if r < 0 {
            io::Error::last_os_error()
        } else {
            io::Error::new(io::ErrorKind::WriteZero, "handover: marker not sent")
        });
    }
    Ok(())
}

/// Reads one marker byte and the descriptors riding on it (at most `max`).
fn recv_fds(sock: &UnixStream, max: usize) -> io::Result<Vec<OwnedFd>> {
    let mut buf = cmsg_buffer(max);
    let mut marker = [0u8];
    let mut iov = libc::iovec {
        iov_base: marker.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(buf.as_slice()) as _;
    // SAFETY: `msg` points at live buffers; the socket is ours.
    let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "handover: the peer closed the connection",
        ));
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `buf` with the CMSG macros;
    // each SCM_RIGHTS payload holds `(cmsg_len - CMSG_LEN(0)) / 4` descriptors that are now
    // ours (installed in this process by the kernel), taken over by `OwnedFd` exactly once.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<i32>();
                let data = libc::CMSG_DATA(c).cast::<i32>();
                for i in 0..n {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "handover: descriptors truncated (too many in one group)",
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn message_with_many_descriptors_round_trips() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<OwnedFd> = (0..450)
            .map(|i| memfd(c"kxdp-test", 4096 + i).unwrap())
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let t = std::thread::spawn(move || recv_message(&b).unwrap());
        send_message(&a, b"hello", &borrowed).unwrap();
        let (payload, fds) = t.join().unwrap();
        assert_eq!(payload, b"hello");
        assert_eq!(fds.len(), 450);
        for (i, fd) in fds.iter().enumerate() {
            assert_eq!(file_len(fd.as_fd()).unwrap(), 4096 + i as u64);
        }
    }

    #[test]
    fn empty_message_and_closed_peer() {
        let (a, b) = UnixStream::pair().unwrap();
        send_message(&a, b"", &[]).unwrap();
        let (p, f) = recv_message(&b).unwrap();
        assert!(p.is_empty() && f.is_empty());
        drop(a);
        assert!(recv_message(&b).is_err());
    }
}
