//! Small system-call helpers: interface indexes, network namespaces, descriptors, ethtool
//! queries, CPU pinning.

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

/// The name of interface `ifindex` in the calling thread's network namespace.
pub fn ifname(ifindex: u32) -> io::Result<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname may write (the name and its NUL).
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {ifindex}: {}", io::Error::last_os_error()),
        ));
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
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

/// The calling thread's network namespace, held open (for [`in_netns`]).
pub fn current_netns() -> io::Result<std::fs::File> {
    std::fs::File::open("/proc/thread-self/ns/net")
}

/// Runs `f` in the network namespace `ns` (from [`current_netns`]): for a netlink call that
/// must reach the namespace an object was set up in, whatever namespace the caller is in. In
/// that namespace already (kxdp's own case), directly; else on a thread of its own that enters
/// it (`setns`, which needs CAP_SYS_ADMIN: tests that set up in one namespace and tear down
/// from another).
pub fn in_netns<T: Send>(ns: &std::fs::File, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    use std::os::unix::fs::MetadataExt;
    let (want, here) = (
        ns.metadata()?,
        std::fs::metadata("/proc/thread-self/ns/net")?,
    );
    if (want.dev(), want.ino()) == (here.dev(), here.ino()) {
        return Ok(f());
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a valid namespace fd only changes this (scoped) thread's
            // namespace.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .map_err(|_| io::Error::other("a thread in the host path's namespace panicked"))?
    })
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

/// A new socket (`socket(2)`), owned.
pub(crate) fn socket(domain: i32, kind: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the result is checked by `fd_result`.
    fd_result(unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) } as libc::c_long)
}

/// One SIOCETHTOOL request on `name` with `data` (a struct starting with its command).
fn ethtool(name: &str, data: &mut [u8]) -> io::Result<()> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: a zeroed ifreq is a valid value of this plain C struct.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in name.bytes().take(15).enumerate() {
        ifr.ifr_name[i] = b as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = data.as_mut_ptr().cast();
    // SAFETY: the name is NUL-terminated within its 16 bytes (zeroed, at most 15 copied) and
    // ifr_data points to `data`, which the callers size for the struct their command fills.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The interface's driver name (ETHTOOL_GDRVINFO), e.g. "veth".
pub fn driver_of(name: &str) -> io::Result<String> {
    const ETHTOOL_GDRVINFO: u32 = 3;
    // struct ethtool_drvinfo is 196 bytes.
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    ethtool(name, &mut info)?;
    let d = &info[4..36];
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    Ok(String::from_utf8_lossy(&d[..end]).into_owned())
}

/// RX queues in use (ETHTOOL_GCHANNELS: rx + combined channels); 1 when the driver does not
/// say.
pub fn rx_queues_of(name: &str) -> u32 {
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    // struct ethtool_channels: nine u32.
    let mut ch = [0u8; 36];
    ch[..4].copy_from_slice(&ETHTOOL_GCHANNELS.to_ne_bytes());
    if ethtool(name, &mut ch).is_err() {
        return 1;
    }
    let field = |i: usize| u32::from_ne_bytes(ch[i * 4..i * 4 + 4].try_into().unwrap());
    // cmd, max_rx, max_tx, max_other, max_combined, rx_count, tx_count, other, combined
    field(5).max(field(8)).max(1)
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process and namespace of the machine,
/// so a sender's timestamp in a packet can be compared with a receiver's clock (`kxdp pcap
/// send` / `sink` latency).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in milliseconds: the same clock in every process of one boot (unlike
/// `Instant`, whose value is opaque), so times stored in a file stay meaningful to the next
/// process.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Pins the calling thread to `cpu`. Returns whether the kernel accepted it.
pub fn pin_current_thread(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so CPU_SET writes inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Waits up to `timeout` for `fd` to become readable (or to report an error).
pub(crate) fn poll_readable(fd: i32, timeout: std::time::Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `p` is one valid pollfd, and the count passed is 1.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0
}

/// The set of descriptors an idle worker waits on (its AF_XDP sockets and its waker): one
/// `poll()` over all of them (one syscall) instead of sleeping blindly; an XSK fd turns
/// readable when its RX ring gets frames (the kernel calls `sk_data_ready` when it flushes the
/// ring).
///
/// `poll()`, not epoll: an epoll registration stays on every socket's wait queue while the
/// worker runs, so the kernel walked that queue (a lock with interrupts off and the epoll
/// callback) for every frame it sent (`sock_wfree` wakes writers) and every RX flush, even
/// with nobody waiting: about 7% of a saturated worker's CPU in the lab (docs/benchmarks.md,
/// "AF_XDP lab", "Where the time goes, and where the loss happens"). `poll()` is on the wait queues only while the
/// worker sleeps.
pub struct Poller {
    fds: Vec<libc::pollfd>,
}

impl Poller {
    pub fn new() -> io::Result<Poller> {
        Ok(Poller { fds: Vec::new() })
    }

    /// Watches `fd` for readability.
    pub fn add(&mut self, fd: i32) -> io::Result<()> {
        if self.fds.iter().any(|p| p.fd == fd) {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        self.fds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        Ok(())
    }

    /// Stops watching `fd` (before closing it).
    pub fn remove(&mut self, fd: i32) -> io::Result<()> {
        let i = self
            .fds
            .iter()
            .position(|p| p.fd == fd)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        self.fds.swap_remove(i);
        Ok(())
    }

    /// Waits until a watched fd is readable or `timeout_ms` passes; returns how many are ready
    /// (0 on timeout or EINTR).
    pub fn wait(&mut self, timeout_ms: i32) -> usize {
        for p in &mut self.fds {
            p.revents = 0;
        }
        // SAFETY: `fds` is a valid array of pollfd of the length passed.
        let r = unsafe {
            libc::poll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                timeout_ms,
            )
        };
        r.max(0) as usize
    }

    /// Whether `fd` was readable in the last `wait` (`ready`: what it returned).
    pub fn is_ready(&self, ready: usize, fd: i32) -> bool {
        ready > 0
            && self
                .fds
                .iter()
                .any(|p| p.fd == fd && p.revents & libc::POLLIN != 0)
    }
}

/// An eventfd that wakes a worker blocked in its `Poller`: the runner signals it after putting
/// a command on the worker's channel or setting the stop flag, so a command is applied at
/// once, not when the idle wait times out. No crate offers a bare eventfd beside our own
/// epoll set (mio's `Waker` needs mio's `Poll`), hence the two small calls here.
pub struct Waker {
    fd: std::os::fd::OwnedFd,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: plain eventfd creation; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    pub fn fd(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// Makes the eventfd readable (wakes the waiting worker); never blocks.
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a valid 8-byte buffer to our eventfd (non-blocking: at
        // the counter's limit it fails with EAGAIN, and the fd is readable anyway).
        let _ = unsafe { libc::write(self.fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the eventfd (after the wait that it ended).
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a valid 8-byte buffer (non-blocking).
        let _ = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }
}

/// Capability numbers (include/uapi/linux/capability.h) `kxdp run` checks for.
pub mod cap {
    pub const NET_ADMIN: u32 = 12;
    pub const NET_RAW: u32 = 13;
    pub const IPC_LOCK: u32 = 14;
    pub const SYS_ADMIN: u32 = 21;
    pub const BPF: u32 = 39;
}

/// The process's effective capabilities (the `CapEff` mask of /proc/self/status, bit N for
/// capability N); None when it cannot be read.
pub fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Whether RLIMIT_MEMLOCK is unlimited (pinned memory then needs no CAP_IPC_LOCK).
pub fn memlock_unlimited() -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer for getrlimit.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    ok && r.rlim_cur == libc::RLIM_INFINITY
}

/// Helpers of the privileged unit tests: a private network namespace and a capture socket.
#[cfg(test)]
pub(crate) mod testing {
    use std::io;
    use std::os::fd::{AsRawFd, OwnedFd};

    /// Runs `f` in a thread of its own in a private network namespace (skipped, with a note,
    /// where none can be made), and waits for it; the namespace goes with the thread.
    pub fn in_private_netns(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(|| {
            // SAFETY: unshare only changes this thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!("SKIPPED: no private network namespace");
                return;
            }
            f();
        })
        .join()
        .unwrap();
    }

    /// A packet socket that receives every frame of `ifindex`, with a receive timeout of
    /// `secs` seconds.
    pub fn capture_on(ifindex: u32, secs: i64) -> OwnedFd {
        let all = (libc::ETH_P_ALL as u16).to_be();
        let fd = super::socket(libc::AF_PACKET, libc::SOCK_RAW, all as i32).unwrap();
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = all;
        sa.sll_ifindex = ifindex as i32;
        // SAFETY: `sa` is live for the call, its length as given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, 0, "bind: {}", io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: secs,
            tv_usec: 0,
        };
        // SAFETY: `tv` is live for the call, its length as given.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        assert_eq!(r, 0, "SO_RCVTIMEO: {}", io::Error::last_os_error());
        fd
    }
}
