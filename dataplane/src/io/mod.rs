//! Packet I/O for `kxdp run`: the XDP program that steers frames into AF_XDP sockets
//! ([`xdp`]), and the sockets themselves with their UMEM and rings ([`afxdp`]).
//!
//! Everything here talks to the kernel directly through `libc` (raw `bpf()` syscalls, netlink,
//! `setsockopt`/`mmap` on AF_XDP sockets): building kxdp needs no C or BPF toolchain. See
//! `docs/afxdp.md` for the design and the measured behaviour on veth.

pub mod afxdp;
pub mod hostpath;
pub mod route;
pub mod runner;
pub mod xdp;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The interface index of `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {name}: {}", io::Error::last_os_error()),
        ))
    } else {
        Ok(idx)
    }
}

/// Moves the calling thread into the network namespace at `path` (e.g. `/var/run/netns/NAME`).
/// Threads it spawns afterwards start there too. Used by the lab tests and harness.
pub fn enter_netns(path: &str) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    // SAFETY: setns on a valid namespace fd only changes this thread's namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Wraps a returned file descriptor (or the errno of a failed call).
pub(crate) fn fd_result(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }
}

/// Sends one netlink request that asks for an ACK and returns the kernel's answer.
pub(crate) fn netlink_request(protocol: i32, msg: &[u8]) -> io::Result<()> {
    // SAFETY: plain socket creation; the result is checked.
    let fd = fd_result(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    } as libc::c_long)?;
    // SAFETY: `msg` is a valid buffer of `msg.len()` bytes; the kernel address is zeroed
    // (sockaddr_nl with nl_pid 0).
    let sent = unsafe {
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: `buf` is writable for its full length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(buf[off + 4..off + 6].try_into().unwrap());
            if kind == libc::NLMSG_ERROR as u16 && off + 20 <= n {
                let err = i32::from_ne_bytes(buf[off + 16..off + 20].try_into().unwrap());
                return if err == 0 {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(-err))
                };
            }
            if len < 16 {
                break;
            }
            off += (len + 3) & !3;
        }
    }
}
