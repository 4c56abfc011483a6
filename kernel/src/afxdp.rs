//! AF_XDP sockets, their UMEM and their four rings, driven in batches.
//!
//! One [`Umem`] per worker: a shared mapping of a memfd cut into `frame_size` chunks, with the
//! free list of the chunks the application holds. The memfd is what a takeover passes on: the
//! successor maps the same pages ([`Umem::adopt`]) and adopts the sockets ([`XskSocket::adopt`]),
//! whose rings it maps again from the socket's descriptor (`XDP_MMAP_OFFSETS`). Every socket of the worker (one per (interface, queue))
//! shares it (`XDP_SHARED_UMEM`, each socket with its own fill and completion ring), so a frame
//! received on one interface is sent on another without a copy.
//!
//! Frame accounting: a frame is always in exactly one of these places — the free list, a fill
//! ring or the kernel's hands after it (until it shows up on an RX ring), the application's
//! hands during a batch, a TX ring or the kernel's hands after it (until it shows up on a
//! completion ring). [`Umem::frames_accounted`] adds them up; `tests/lab_afxdp.rs` checks that
//! the sum stays equal to the frame count under load.
//!
//! `need_wakeup` is honoured on both producer rings: a TX batch is followed by `sendto()` only
//! when the kernel flags the TX ring, the fill ring gets a `recvfrom()` only when flagged.
//! Zero-copy binding is tried first and copy mode is the fallback (veth only offers copy).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::sys::fd_result;

/// Sizes of one worker's UMEM and rings.
#[derive(Clone, Copy, Debug)]
pub struct XskConfig {
    /// Frames in the UMEM (shared by the worker's sockets).
    pub frames: u32,
    /// Bytes per frame: 2048 or 4096 (a power of two, at most a page).
    pub frame_size: u32,
    /// Entries of each socket's RX ring (a power of two): frames the kernel can deliver while
    /// the worker is away, as long as the fill ring has frames for them.
    pub rx_ring_size: u32,
    /// Entries of each socket's TX ring (a power of two).
    pub tx_ring_size: u32,
    /// Entries of each socket's fill ring (a power of two): the most frames a socket can hold
    /// ready for the kernel to receive into.
    pub fill_ring_size: u32,
    /// Entries of each socket's completion ring (a power of two).
    pub completion_ring_size: u32,
    /// Try zero-copy first (falls back to copy mode).
    pub zero_copy: bool,
    /// Frames a new socket's fill ring gets at open (None: `fill_ring_size`). A worker with many
    /// sockets gives each its share of the UMEM, not a full ring.
    pub fill_target: Option<u32>,
}

/// The defaults: 8192 frames of 4 KiB (32 MiB per worker), RX and fill rings as deep as the
/// UMEM (8192 entries: a busy socket's fill share can grow into the frames kept for sockets
/// still to come, `kxdp_dataplane::worker::kept_reserve`, and the RX ring must hold what the
/// share lets the kernel deliver), TX and completion rings of 2048 (a batch is 64 frames).
impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            frames: 8192,
            frame_size: 4096,
            rx_ring_size: 8192,
            tx_ring_size: 2048,
            fill_ring_size: 8192,
            completion_ring_size: 2048,
            zero_copy: true,
            fill_target: None,
        }
    }
}

impl XskConfig {
    /// The same configuration with all four rings of `n` entries.
    pub fn with_ring_size(self, n: u32) -> XskConfig {
        XskConfig {
            rx_ring_size: n,
            tx_ring_size: n,
            fill_ring_size: n,
            completion_ring_size: n,
            ..self
        }
    }

    /// The sizes of the four rings of a socket.
    pub fn rings(&self) -> RingSizes {
        RingSizes {
            rx: self.rx_ring_size,
            tx: self.tx_ring_size,
            fill: self.fill_ring_size,
            completion: self.completion_ring_size,
        }
    }
}

/// Entries of a socket's four rings (each a power of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSizes {
    pub rx: u32,
    pub tx: u32,
    pub fill: u32,
    pub completion: u32,
}

impl RingSizes {
    /// All four rings of `n` entries.
    pub fn all(n: u32) -> RingSizes {
        RingSizes {
            rx: n,
            tx: n,
            fill: n,
            completion: n,
        }
    }

    fn check(&self) -> io::Result<()> {
        for (what, n) in [
            ("RX", self.rx),
            ("TX", self.tx),
            ("fill", self.fill),
            ("completion", self.completion),
        ] {
            if !n.is_power_of_two() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} ring size {n}: not a power of two"),
                ));
            }
        }
        Ok(())
    }
}

impl Default for RingSizes {
    fn default() -> Self {
        XskConfig::default().rings()
    }
}

/// The kernel's counters of one socket (`XDP_STATISTICS`), cumulative since the socket was
/// bound. They count frames lost or refused *before* the application sees them, so no verdict
/// (and no drop reason) of kxdp's covers them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelXskStats {
    /// Frames dropped on receive for other reasons than a full RX ring: in copy mode, no frame
    /// on the fill ring to copy into (also counted in `rx_fill_ring_empty_descs`), or a frame
    /// larger than a UMEM chunk.
    pub rx_dropped: u64,
    /// Descriptors the application put on the fill ring that the kernel refused.
    pub rx_invalid_descs: u64,
    /// Descriptors the application put on the TX ring that the kernel refused (not sent).
    pub tx_invalid_descs: u64,
    /// Frames dropped because the socket's RX ring was full (the application did not consume
    /// it in time).
    pub rx_ring_full: u64,
    /// Times the kernel wanted a frame from the fill ring and found it empty.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the kernel looked at the TX ring (on a kick) and found it empty.
    pub tx_ring_empty_descs: u64,
}

impl KernelXskStats {
    /// Frames the kernel dropped on their way into the socket (`rx_dropped + rx_ring_full`).
    pub fn rx_lost(&self) -> u64 {
        self.rx_dropped + self.rx_ring_full
    }
}

/// A frame descriptor: the address of the frame's data in the UMEM and its length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: usize,
}

/// A batch of frames in place in the UMEM (`Umem::batch`): what a worker hands its pipeline.
/// Every address was checked against the mapping when the batch was made, so an access is an
/// add and a mask: the pipeline reaches each frame two or three times a packet, and
/// `Umem::frame`'s check at each, with the mapping's fields loaded again through `&mut Umem`,
/// cost est-10k 12 instructions per packet more (docs/benchmarks.md, "The workers' frames and
/// the profile-guided build").
pub struct UmemFrames<'a> {
    area: NonNull<u8>,
    /// The frame size less one (a power of two).
    chunk_mask: usize,
    descs: &'a mut [Desc],
    /// The frames are the UMEM's, borrowed mutably for as long as the batch lives.
    _umem: std::marker::PhantomData<&'a mut Umem>,
}

impl UmemFrames<'_> {
    pub fn len(&self) -> usize {
        self.descs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    pub fn descs(&self) -> &[Desc] {
        self.descs
    }

    /// Frame `i`'s buffer (from its address to the end of its chunk) and its length.
    #[inline]
    pub fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        let (area, mask) = (self.area, self.chunk_mask);
        let d = &mut self.descs[i];
        let (off, cap) = place(d, mask);
        // SAFETY: see `chunk_mut`; `&mut self` is held for the slice's lifetime.
        (unsafe { Self::chunk_mut(area, off, cap) }, &mut d.len)
    }

    /// Frame `i`'s bytes (its length clamped to its chunk).
    #[inline]
    pub fn frame(&self, i: usize) -> &[u8] {
        let d = &self.descs[i];
        let (off, cap) = place(d, self.chunk_mask);
        // SAFETY: see `chunk`.
        unsafe { self.chunk(off, d.len.min(cap)) }
    }

    /// `frame(i)` without the check of `i`.
    ///
    /// # Safety
    ///
    /// `i < self.len()`.
    #[inline(always)]
    pub unsafe fn frame_unchecked(&self, i: usize) -> &[u8] {
        // SAFETY: the caller's `i < descs.len()`.
        let d = unsafe { self.descs.get_unchecked(i) };
        let (off, cap) = place(d, self.chunk_mask);
        // SAFETY: see `chunk`.
        unsafe { self.chunk(off, d.len.min(cap)) }
    }

    /// `frame_mut(i)` without the check of `i`.
    ///
    /// # Safety
    ///
    /// `i < self.len()`.
    #[inline(always)]
    pub unsafe fn frame_mut_unchecked(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        let (area, mask) = (self.area, self.chunk_mask);
        // SAFETY: the caller's `i < descs.len()`.
        let d = unsafe { self.descs.get_unchecked_mut(i) };
        let (off, cap) = place(d, mask);
        // SAFETY: see `chunk_mut`; `&mut self` is held for the slice's lifetime.
        (unsafe { Self::chunk_mut(area, off, cap) }, &mut d.len)
    }

    /// The `len` bytes at `off`.
    ///
    /// # Safety
    ///
    /// `off` is a descriptor's address and `len` at most the rest of its chunk.
    #[inline(always)]
    unsafe fn chunk(&self, off: usize, len: usize) -> &[u8] {
        // SAFETY: `Umem::batch` checked every descriptor's address against the mapping, whose
        // length is a whole number of chunks, so [off, off + len) is inside the mapping and one
        // chunk; the batch borrows the UMEM for its lifetime, so nothing else writes it.
        unsafe { std::slice::from_raw_parts(self.area.as_ptr().add(off), len) }
    }

    /// The `len` bytes at `off` of the mapping at `area`, writable, for as long as the caller
    /// says.
    ///
    /// # Safety
    ///
    /// As `chunk`, and the caller holds the batch mutably for the slice's lifetime, so no other
    /// slice of the batch lives while this one does.
    #[inline(always)]
    unsafe fn chunk_mut<'b>(area: NonNull<u8>, off: usize, len: usize) -> &'b mut [u8] {
        // SAFETY: as in `chunk`; exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(area.as_ptr().add(off), len) }
    }
}

/// Where a descriptor's frame starts in the mapping, and how many bytes its chunk has from there
/// (`chunk_mask`: the frame size less one).
#[inline(always)]
fn place(d: &Desc, chunk_mask: usize) -> (usize, usize) {
    let off = d.addr as usize;
    (off, chunk_mask + 1 - (off & chunk_mask))
}

/// The packet buffer area shared by a worker's sockets.
pub struct Umem {
    /// The memfd behind the mapping (passed on in a takeover).
    memfd: OwnedFd,
    area: NonNull<u8>,
    len: usize,
    frame_size: u32,
    frames: u32,
    /// Chunk addresses the application holds and nothing uses.
    free: Vec<u64>,
    /// Frames handed out by `take_batch` and not yet returned (sent or recycled).
    in_hand: u32,
    /// Per frame: the id of the socket it was last given to (fill or TX ring). A frame that is
    /// neither free nor in hand is held by that socket, so closing a socket gives back exactly
    /// its frames ([`Umem::reclaim`]). One store per frame placed on a ring; no lookup.
    owner: Vec<u32>,
    next_socket_id: u32,
}

// SAFETY: the mapping is owned by this struct and only reached through `&mut self` (or shared
// reads through `&self`); moving it to another thread moves that ownership.
unsafe impl Send for Umem {}

impl Umem {
    pub fn new(cfg: &XskConfig) -> io::Result<Umem> {
        assert!(cfg.frame_size.is_power_of_two() && (2048..=4096).contains(&cfg.frame_size));
        Umem::map(cfg.frames, cfg.frame_size)
    }

    /// A UMEM that no socket will use, with frames of any power of two from 2048 bytes: `kxdp
    /// replay` runs the workers' pipeline over it (their frames type, `UmemBatch`, so that it
    /// measures, and a profile-guided build learns, the code the workers run), and a capture
    /// may hold frames longer than a page.
    pub fn in_memory(frames: u32, frame_size: u32) -> io::Result<Umem> {
        assert!(frame_size.is_power_of_two() && frame_size >= 2048);
        Umem::map(frames, frame_size)
    }

    fn map(frames: u32, frame_size: u32) -> io::Result<Umem> {
        let len = frames as usize * frame_size as usize;
        let memfd = crate::handover::memfd(c"kxdp-umem", len)?;
        let area = map_shared(memfd.as_fd(), len)?;
        let free = (0..frames as u64)
            .rev()
            .map(|i| i * frame_size as u64)
            .collect();
        Ok(Umem {
            memfd,
            area,
            len,
            frame_size,
            frames,
            free,
            in_hand: 0,
            owner: vec![0; frames as usize],
            next_socket_id: 1,
        })
    }

    /// The memfd behind the frames (for a takeover).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Where every frame is, for a successor ([`Umem::adopt`]). Only between batches: no frame
    /// may be in the application's hands.
    pub fn export(&self) -> io::Result<UmemState> {
        if self.in_hand != 0 {
            return Err(io::Error::other(format!(
                "{} frame(s) in hand: export only between batches",
                self.in_hand
            )));
        }
        Ok(UmemState {
            frames: self.frames,
            frame_size: self.frame_size,
            free: self.free.clone(),
            owner: self.owner.clone(),
            next_socket_id: self.next_socket_id,
        })
    }

    /// Maps a predecessor's UMEM (its memfd) with the frame ownership it exported. The sockets
    /// that use it are adopted next ([`XskSocket::adopt`]).
    pub fn adopt(memfd: OwnedFd, state: UmemState) -> io::Result<Umem> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        if !state.frame_size.is_power_of_two() || !(2048..=4096).contains(&state.frame_size) {
            return Err(bad(format!("UMEM frame size {}", state.frame_size)));
        }
        let len = state.frames as usize * state.frame_size as usize;
        let file = crate::handover::file_len(memfd.as_fd())?;
        if file != len as u64 || state.owner.len() != state.frames as usize {
            return Err(bad(format!(
                "UMEM of {} frames of {} bytes: the memfd has {file} bytes, {} owner entries",
                state.frames,
                state.frame_size,
                state.owner.len()
            )));
        }
        let mut seen = vec![false; state.frames as usize];
        for &a in &state.free {
            let i = (a / state.frame_size as u64) as usize;
            if a % state.frame_size as u64 != 0 || i >= seen.len() || seen[i] {
                return Err(bad(format!(
                    "free frame address {a:#x} invalid or repeated"
                )));
            }
            seen[i] = true;
        }
        let area = map_shared(memfd.as_fd(), len)?;
        Ok(Umem {
            memfd,
            area,
            len,
            frame_size: state.frame_size,
            frames: state.frames,
            free: state.free,
            in_hand: 0,
            owner: state.owner,
            next_socket_id: state.next_socket_id.max(1),
        })
    }

    pub fn frame_count(&self) -> u32 {
        self.frames
    }

    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Frames the application holds in a batch (taken from RX, not yet sent or recycled).
    pub fn in_hand(&self) -> u32 {
        self.in_hand
    }

    #[inline]
    fn set_owner(&mut self, addr: u64, id: u32) {
        let i = (addr / self.frame_size as u64) as usize;
        self.owner[i] = id;
    }

    /// Closes `sock` and returns the frames it held (its fill and TX rings, and whatever the
    /// kernel had taken from them) to the free list. Call between batches (no frame in hand
    /// came from it). Returns how many frames came back; equal to `sock.frames_held()` before
    /// the call when the accounting is right.
    pub fn reclaim(&mut self, sock: XskSocket) -> u32 {
        let id = sock.id;
        // Closing unbinds the socket from its device and queue (the kernel waits for the RX
        // path to let go of it), so nothing writes to its frames afterwards.
        drop(sock);
        let mut is_free = vec![false; self.frames as usize];
        for a in &self.free {
            is_free[(a / self.frame_size as u64) as usize] = true;
        }
        let mut n = 0;
        for (i, o) in self.owner.iter_mut().enumerate() {
            if *o == id && !is_free[i] {
                self.free.push(i as u64 * self.frame_size as u64);
                *o = 0;
                n += 1;
            }
        }
        n
    }

    /// Takes a free frame into the application's hands (to build a packet in and send, or
    /// give back with `recycle`). For senders that own their frames' contents, such as the
    /// load generator (`kxdp pcap send`), which builds each frame once and re-sends it.
    #[inline]
    pub fn take_free(&mut self) -> Option<u64> {
        let addr = self.free.pop()?;
        self.in_hand += 1;
        Some(addr)
    }

    /// Returns a received frame that will not be sent to the free list.
    #[inline]
    pub fn recycle(&mut self, addr: u64) {
        self.in_hand -= 1;
        self.free.push(addr & !(self.frame_size as u64 - 1));
    }

    /// A batch of received frames (`descs`, off an RX ring), their addresses checked against the
    /// mapping here, once, rather than at every access ([`UmemFrames`]).
    #[inline]
    pub fn batch<'a>(&'a mut self, descs: &'a mut [Desc]) -> UmemFrames<'a> {
        for d in descs.iter() {
            assert!(
                (d.addr as usize) < self.len,
                "frame address outside the UMEM"
            );
        }
        UmemFrames {
            area: self.area,
            chunk_mask: self.frame_size as usize - 1,
            descs,
            _umem: std::marker::PhantomData,
        }
    }

    /// The frame's buffer from `addr` to the end of its chunk.
    #[inline]
    pub fn frame_mut(&mut self, addr: u64) -> &mut [u8] {
        let (off, cap) = self.bounds(addr);
        // SAFETY: `bounds` keeps [off, off+cap) inside the mapping and inside one chunk; the
        // chunk belongs to the application (it came off an RX ring) and `&mut self` makes this
        // the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.area.as_ptr().add(off), cap) }
    }

    #[inline]
    pub fn frame(&self, addr: u64) -> &[u8] {
        let (off, cap) = self.bounds(addr);
        // SAFETY: as in `frame_mut`, read-only.
        unsafe { std::slice::from_raw_parts(self.area.as_ptr().add(off), cap) }
    }

    #[inline]
    fn bounds(&self, addr: u64) -> (usize, usize) {
        let off = addr as usize;
        assert!(off < self.len, "frame address outside the UMEM");
        let chunk_end = (off & !(self.frame_size as usize - 1)) + self.frame_size as usize;
        (off, chunk_end - off)
    }
}

/// Frame ownership of a UMEM between batches (see [`Umem::export`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UmemState {
    pub frames: u32,
    pub frame_size: u32,
    /// Free chunk addresses.
    pub free: Vec<u64>,
    /// Per frame: the id of the socket it was last given to.
    pub owner: Vec<u32>,
    pub next_socket_id: u32,
}

/// A shared read-write mapping of `len` bytes of `fd` (populated): the UMEM's memfd, the fast
/// path's counter array (`crate::offload`).
pub(crate) fn map_shared(fd: BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new shared mapping of a descriptor we hold; the kernel picks the address, so
    // nothing else in this process aliases it, and checks `len` against what `fd` can map.
    // Others mapping the same pages (a takeover's other process, the kernel's BPF programs)
    // reach them only as their owners document: the UMEM's frames one process at a time, the
    // counters through atomic adds.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping created in `new`; sockets using it are dropped first
        // (they borrow it only during calls), and the kernel keeps its own pin until they close.
        unsafe {
            libc::munmap(self.area.as_ptr().cast(), self.len);
        }
    }
}

/// One mmap'd ring (producer/consumer indices, flags, descriptors).
struct Ring {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    size: u32,
    mask: u32,
    /// Local copies: for a producer ring `cached_prod` is ours and `cached_cons` the last seen
    /// consumer; for a consumer ring the other way round.
    cached_prod: u32,
    cached_cons: u32,
    map: *mut libc::c_void,
    map_len: usize,
}

impl Ring {
    fn map(
        fd: i32,
        off: &libc::xdp_ring_offset,
        size: u32,
        desc_size: usize,
        pgoff: u64,
    ) -> io::Result<Ring> {
        let map_len = off.desc as usize + size as usize * desc_size;
        // SAFETY: mapping the ring the kernel created for this socket at its documented offset.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p.cast::<u8>();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the mapping.
        let ring = unsafe {
            Ring {
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                desc: base.add(off.desc as usize),
                size,
                mask: size - 1,
                cached_prod: 0,
                cached_cons: 0,
                map: p,
                map_len,
            }
        };
        Ok(ring)
    }

    #[inline]
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live ring mapping, aligned by the kernel.
        unsafe { &*self.producer }
    }

    #[inline]
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    #[inline]
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as above.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer side: free slots (refreshing the consumer index when short of `want`).
    #[inline]
    fn prod_free(&mut self, want: u32) -> u32 {
        let free = self.size - self.cached_prod.wrapping_sub(self.cached_cons);
        if free >= want {
            return free;
        }
        self.cached_cons = self.consumer().load(Ordering::Acquire);
        self.size - self.cached_prod.wrapping_sub(self.cached_cons)
    }

    #[inline]
    fn prod_submit(&mut self) {
        self.producer().store(self.cached_prod, Ordering::Release);
    }

    /// Consumer side: entries ready.
    #[inline]
    fn cons_ready(&mut self) -> u32 {
        let ready = self.cached_prod.wrapping_sub(self.cached_cons);
        if ready > 0 {
            return ready;
        }
        self.cached_prod = self.producer().load(Ordering::Acquire);
        self.cached_prod.wrapping_sub(self.cached_cons)
    }

    #[inline]
    fn cons_release(&mut self) {
        self.consumer().store(self.cached_cons, Ordering::Release);
    }

    /// Entries the kernel has not consumed yet on a producer ring.
    fn pending(&self) -> u32 {
        self.cached_prod
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    #[inline]
    fn addr_slot(&self, idx: u32) -> *mut u64 {
        // SAFETY: idx is masked into the ring; fill/completion descriptors are u64.
        unsafe { self.desc.cast::<u64>().add((idx & self.mask) as usize) }
    }

    #[inline]
    fn desc_slot(&self, idx: u32) -> *mut libc::xdp_desc {
        // SAFETY: idx is masked into the ring; RX/TX descriptors are xdp_desc.
        unsafe {
            self.desc
                .cast::<libc::xdp_desc>()
                .add((idx & self.mask) as usize)
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping our own ring mapping.
        unsafe {
            libc::munmap(self.map, self.map_len);
        }
    }
}

/// Per-socket counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct XskStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    /// Frames that found the TX ring full and were recycled (dropped).
    pub tx_ring_full: u64,
    pub completions: u64,
    pub tx_kicks: u64,
    pub fill_kicks: u64,
}

/// One AF_XDP socket bound to (interface, queue), sharing its worker's UMEM.
pub struct XskSocket {
    fd: OwnedFd,
    fill: Ring,
    comp: Ring,
    rx: Ring,
    tx: Ring,
    pub ifindex: u32,
    pub queue: u32,
    pub zero_copy: bool,
    /// Entries of its four rings.
    rings: RingSizes,
    /// Frames one copy-mode TX kick sends at most (see [`raise_tx_budget`]).
    tx_budget: u32,
    /// Tags the frames given to this socket (see `Umem::reclaim`).
    id: u32,
    /// Frames on the TX ring or in the kernel's hands after it.
    tx_outstanding: u32,
    /// Frames on the fill ring or in the kernel's hands after it (until they appear on RX).
    fill_outstanding: u32,
    pub stats: XskStats,
}

// SAFETY: the ring pointers point into mappings this socket owns; it is used by one thread at a
// time (`&mut self`).
unsafe impl Send for XskSocket {}

fn setsockopt<T>(fd: i32, opt: i32, val: &T) -> io::Result<()> {
    // SAFETY: `val` is a valid T of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as u32,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `XDP_MAX_TX_SKB_BUDGET` (Linux 6.17+, `include/uapi/linux/if_xdp.h`; not in the `libc` crate
/// yet): how many frames one copy-mode TX kick sends.
const XDP_MAX_TX_SKB_BUDGET: i32 = 9;

/// The kernel's default of frames per copy-mode TX kick (`TX_BATCH_SIZE` in `net/xdp/xsk.c`).
pub const COPY_TX_BATCH: u32 = 32;

/// Lets one copy-mode TX kick send up to a whole TX ring (`XDP_MAX_TX_SKB_BUDGET`) instead of
/// the kernel's 32 frames: a 64-frame batch then costs one `sendto()`, not two, and no frame
/// waits on the ring for the next kick. Returns the budget in force: the ring's size, or 32
/// on a kernel without the option (`ENOPROTOOPT`), which is not an error. Call after the TX
/// ring exists (the kernel refuses it before, and above the ring's size, with `EACCES`).
fn raise_tx_budget(fd: i32, tx_ring: u32) -> u32 {
    match setsockopt(fd, XDP_MAX_TX_SKB_BUDGET, &tx_ring) {
        Ok(()) => tx_ring,
        Err(_) => COPY_TX_BATCH,
    }
}

/// A socket's identity and frame counts between batches (see [`XskSocket::export`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskState {
    pub ifindex: u32,
    pub queue: u32,
    pub zero_copy: bool,
    pub rings: RingSizes,
    /// The tag of the frames it holds (`UmemState::owner`).
    pub id: u32,
    pub tx_outstanding: u32,
    pub fill_outstanding: u32,
}

/// Maps the four rings of the socket `raw` (of `n` entries each): (rx, tx, fill, completion).
fn map_rings(raw: i32, n: RingSizes) -> io::Result<(Ring, Ring, Ring, Ring)> {
    // SAFETY: a zeroed xdp_mmap_offsets is a valid out-buffer of the size passed.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut optlen = std::mem::size_of::<libc::xdp_mmap_offsets>() as u32;
    // SAFETY: `off`/`optlen` are valid out-pointers.
    let r = unsafe {
        libc::getsockopt(
            raw,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut optlen,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let desc = std::mem::size_of::<libc::xdp_desc>();
    let rx = Ring::map(raw, &off.rx, n.rx, desc, libc::XDP_PGOFF_RX_RING as u64)?;
    let tx = Ring::map(raw, &off.tx, n.tx, desc, libc::XDP_PGOFF_TX_RING as u64)?;
    let fill = Ring::map(raw, &off.fr, n.fill, 8, libc::XDP_UMEM_PGOFF_FILL_RING)?;
    let comp = Ring::map(
        raw,
        &off.cr,
        n.completion,
        8,
        libc::XDP_UMEM_PGOFF_COMPLETION_RING,
    )?;
    Ok((rx, tx, fill, comp))
}

/// Whether this kernel offers AF_XDP sockets at all (false: EAFNOSUPPORT).
pub fn af_xdp_available() -> bool {
    // SAFETY: plain socket creation; closed right away.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return io::Error::last_os_error().raw_os_error() != Some(libc::EAFNOSUPPORT);
    }
    // SAFETY: closing the descriptor just created.
    unsafe { libc::close(fd) };
    true
}

impl XskSocket {
    /// Opens a socket on (`ifindex`, `queue`). The first socket of a UMEM registers it; later
    /// ones pass `shared` (the first socket) and share it.
    pub fn open(
        umem: &mut Umem,
        shared: Option<&XskSocket>,
        ifindex: u32,
        queue: u32,
        cfg: &XskConfig,
    ) -> io::Result<XskSocket> {
        let n = cfg.rings();
        n.check()?;
        // SAFETY: plain socket creation; the result is checked.
        let fd =
            fd_result(
                unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) }
                    as libc::c_long,
            )?;
        let raw = fd.as_raw_fd();
        if shared.is_none() {
            let reg = libc::xdp_umem_reg {
                addr: umem.area.as_ptr() as u64,
                len: umem.len as u64,
                chunk_size: umem.frame_size,
                headroom: 0,
                flags: 0,
                tx_metadata_len: 0,
            };
            setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        }
        setsockopt(raw, libc::XDP_UMEM_FILL_RING, &n.fill)?;
        setsockopt(raw, libc::XDP_UMEM_COMPLETION_RING, &n.completion)?;
        setsockopt(raw, libc::XDP_RX_RING, &n.rx)?;
        setsockopt(raw, libc::XDP_TX_RING, &n.tx)?;
        let tx_budget = raise_tx_budget(raw, n.tx);
        let (rx, tx, fill, comp) = map_rings(raw, n)?;

        let bind = |flags: u16| -> io::Result<()> {
            let mut sa: libc::sockaddr_xdp =
                // SAFETY: sockaddr_xdp is plain data; zero is a valid value.
                unsafe { std::mem::zeroed() };
            sa.sxdp_family = libc::AF_XDP as u16;
            sa.sxdp_ifindex = ifindex;
            sa.sxdp_queue_id = queue;
            sa.sxdp_flags = flags | libc::XDP_USE_NEED_WAKEUP;
            if let Some(s) = shared {
                // A sharing socket inherits copy/zero-copy and need_wakeup from the UMEM's
                // owner; the kernel refuses those flags here (EINVAL).
                sa.sxdp_flags = libc::XDP_SHARED_UMEM;
                sa.sxdp_shared_umem_fd = s.fd.as_raw_fd() as u32;
            }
            // SAFETY: `sa` is a valid sockaddr_xdp of the size passed.
            let r = unsafe {
                libc::bind(
                    raw,
                    (&sa as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as u32,
                )
            };
            if r != 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let zero_copy = if let Some(s) = shared {
            bind(0).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("binding AF_XDP socket to ifindex {ifindex} queue {queue} (shared UMEM): {e}"),
                )
            })?;
            s.zero_copy
        } else if cfg.zero_copy && bind(libc::XDP_ZEROCOPY).is_ok() {
            true
        } else {
            bind(libc::XDP_COPY).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("binding AF_XDP socket to ifindex {ifindex} queue {queue}: {e}"),
                )
            })?;
            false
        };
        let mut s = XskSocket {
            fd,
            fill,
            comp,
            rx,
            tx,
            ifindex,
            queue,
            zero_copy,
            rings: n,
            tx_budget,
            id: umem.next_socket_id,
            tx_outstanding: 0,
            fill_outstanding: 0,
            stats: XskStats::default(),
        };
        umem.next_socket_id = umem.next_socket_id.wrapping_add(1).max(1);
        s.refill(umem, cfg.fill_target.unwrap_or(n.fill).min(n.fill));
        Ok(s)
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The socket's descriptor (for a takeover).
    pub fn fd_borrowed(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// What a successor needs besides the descriptor ([`XskSocket::adopt`]). Only between
    /// batches, after the last submission (the rings' shared indices then say everything).
    pub fn export(&self) -> XskState {
        XskState {
            ifindex: self.ifindex,
            queue: self.queue,
            zero_copy: self.zero_copy,
            rings: self.rings,
            id: self.id,
            tx_outstanding: self.tx_outstanding,
            fill_outstanding: self.fill_outstanding,
        }
    }

    /// Adopts a predecessor's bound socket: maps its rings again from the descriptor and takes
    /// the ring positions from the shared producer and consumer indices (the predecessor
    /// submitted and released everything before it exported). Frames the kernel put on the RX
    /// and completion rings meanwhile are simply there to be read.
    pub fn adopt(fd: OwnedFd, st: &XskState) -> io::Result<XskSocket> {
        st.rings
            .check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let (mut rx, mut tx, mut fill, mut comp) = map_rings(fd.as_raw_fd(), st.rings)?;
        let tx_budget = raise_tx_budget(fd.as_raw_fd(), st.rings.tx);
        // Each consumer ring before its producer ring: a frame moving from one to the other
        // meanwhile is then counted at most once.
        for r in [&mut rx, &mut comp, &mut fill, &mut tx] {
            r.cached_prod = r.producer().load(Ordering::Acquire);
            r.cached_cons = r.consumer().load(Ordering::Acquire);
        }
        // The kernel never holds more than the rings it was given.
        let held = |r: &Ring| r.cached_prod.wrapping_sub(r.cached_cons) as u64;
        if held(&fill) + held(&rx) > st.fill_outstanding as u64
            || held(&tx) + held(&comp) > st.tx_outstanding as u64
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "socket on ifindex {} queue {}: rings hold more frames than exported",
                    st.ifindex, st.queue
                ),
            ));
        }
        Ok(XskSocket {
            fd,
            fill,
            comp,
            rx,
            tx,
            ifindex: st.ifindex,
            queue: st.queue,
            zero_copy: st.zero_copy,
            rings: st.rings,
            tx_budget,
            id: st.id,
            tx_outstanding: st.tx_outstanding,
            fill_outstanding: st.fill_outstanding,
            stats: XskStats::default(),
        })
    }

    /// Entries of the socket's four rings.
    pub fn rings(&self) -> RingSizes {
        self.rings
    }

    /// Frames on the fill ring or in the kernel's hands after it.
    pub fn fill_outstanding(&self) -> u32 {
        self.fill_outstanding
    }

    /// Frames still on the fill ring, not yet taken by the kernel (one load of the kernel's
    /// consumer index). `fill_outstanding() - fill_ring_level()` are the frames the kernel took
    /// since they were placed: on the RX ring waiting for the application, or being copied into.
    pub fn fill_ring_level(&self) -> u32 {
        self.fill.pending()
    }

    /// Frames one copy-mode TX kick sends at most: the TX ring's size where the kernel lets
    /// the socket raise it (Linux 6.17+), else 32.
    pub fn tx_budget(&self) -> u32 {
        self.tx_budget
    }

    /// Frames on the TX ring the kernel has not taken yet (a copy-mode kick sends at most
    /// [`XskSocket::tx_budget`]; the rest wait for the next kick).
    pub fn tx_pending(&self) -> u32 {
        self.tx.pending()
    }

    /// Moves up to `max` free frames onto the fill ring.
    pub fn refill(&mut self, umem: &mut Umem, max: u32) {
        let want = max.min(umem.free.len() as u32);
        if want == 0 {
            return;
        }
        let n = self.fill.prod_free(want).min(want);
        for _ in 0..n {
            let addr = umem.free.pop().expect("counted above");
            umem.set_owner(addr, self.id);
            // SAFETY: slot reserved above (n free slots), inside the ring.
            unsafe { self.fill.addr_slot(self.fill.cached_prod).write(addr) };
            self.fill.cached_prod = self.fill.cached_prod.wrapping_add(1);
        }
        if n > 0 {
            self.fill.prod_submit();
            self.fill_outstanding += n;
        }
        if self.fill.needs_wakeup() {
            self.stats.fill_kicks += 1;
            // SAFETY: a zero-length, non-blocking recvfrom on our socket: the documented way to
            // wake the kernel's RX processing.
            unsafe {
                libc::recvfrom(
                    self.fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Takes up to `out.len()` received frames; they are in the application's hands until sent
    /// or recycled.
    pub fn receive(&mut self, umem: &mut Umem, out: &mut [Desc]) -> usize {
        let n = (self.rx.cons_ready() as usize).min(out.len());
        for (i, o) in out.iter_mut().enumerate().take(n) {
            // SAFETY: the kernel produced these slots (ready count above).
            let d = unsafe {
                self.rx
                    .desc_slot(self.rx.cached_cons.wrapping_add(i as u32))
                    .read()
            };
            *o = Desc {
                addr: d.addr,
                len: d.len as usize,
            };
        }
        if n > 0 {
            self.rx.cached_cons = self.rx.cached_cons.wrapping_add(n as u32);
            self.rx.cons_release();
            self.fill_outstanding -= n as u32;
            umem.in_hand += n as u32;
            self.stats.rx_frames += n as u64;
        }
        n
    }

    /// Places frames on the TX ring; those that do not fit are recycled (and counted). Returns
    /// how many were placed (the first ones). Call `flush_tx` after a batch.
    pub fn send(&mut self, umem: &mut Umem, frames: &[Desc]) -> usize {
        let n = (self.tx.prod_free(frames.len() as u32) as usize).min(frames.len());
        for (i, f) in frames.iter().enumerate().take(n) {
            umem.set_owner(f.addr, self.id);
            let d = libc::xdp_desc {
                addr: f.addr,
                len: f.len as u32,
                options: 0,
            };
            // SAFETY: slot reserved above, inside the ring.
            unsafe {
                self.tx
                    .desc_slot(self.tx.cached_prod.wrapping_add(i as u32))
                    .write(d)
            };
        }
        if n > 0 {
            self.tx.cached_prod = self.tx.cached_prod.wrapping_add(n as u32);
            self.tx.prod_submit();
            self.tx_outstanding += n as u32;
            umem.in_hand -= n as u32;
            self.stats.tx_frames += n as u64;
        }
        for f in &frames[n..] {
            self.stats.tx_ring_full += 1;
            umem.recycle(f.addr);
        }
        n
    }

    /// Kicks the kernel to send what is on the TX ring, when it asks for it (need_wakeup).
    pub fn flush_tx(&mut self) {
        if self.tx.pending() > 0 && (self.tx.needs_wakeup() || self.zero_copy) {
            self.stats.tx_kicks += 1;
            // SAFETY: a zero-length, non-blocking sendto on our socket: the documented TX kick.
            let r = unsafe {
                libc::sendto(
                    self.fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            let _ = r; // EAGAIN/EBUSY: the kernel is busy; the next flush retries.
        }
    }

    /// Moves completed TX frames to the free list.
    pub fn complete(&mut self, umem: &mut Umem) -> u32 {
        let n = self.comp.cons_ready();
        for i in 0..n {
            // SAFETY: the kernel produced these slots.
            let addr = unsafe {
                self.comp
                    .addr_slot(self.comp.cached_cons.wrapping_add(i))
                    .read()
            };
            umem.free.push(addr & !(umem.frame_size as u64 - 1));
        }
        if n > 0 {
            self.comp.cached_cons = self.comp.cached_cons.wrapping_add(n);
            self.comp.cons_release();
            self.tx_outstanding -= n;
            self.stats.completions += n as u64;
        }
        n
    }

    /// Frames this socket's rings (and the kernel behind them) hold.
    pub fn frames_held(&self) -> u32 {
        self.tx_outstanding + self.fill_outstanding
    }

    pub fn tx_outstanding(&self) -> u32 {
        self.tx_outstanding
    }

    /// Reads the kernel's counters of this socket (`XDP_STATISTICS`): one `getsockopt`, for a
    /// periodic read off the packet path (the worker's maintenance step, a sink's summary).
    pub fn kernel_stats(&self) -> io::Result<KernelXskStats> {
        read_xdp_statistics(self.fd.as_fd())
    }
}

/// `getsockopt(SOL_XDP, XDP_STATISTICS)` on an AF_XDP socket, with the full structure (Linux
/// 5.9+: the ring-full and ring-empty counters). A kernel that only knows the first three fields
/// answers with those (`optlen` shorter) and then adds ring-full drops into `rx_dropped`; the
/// others stay 0.
fn read_xdp_statistics(fd: BorrowedFd<'_>) -> io::Result<KernelXskStats> {
    // SAFETY: xdp_statistics is plain data (six u64); all zeroes is a valid value.
    let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: `st` and `len` are valid, writable, and `len` is the size of `st`; the kernel
    // writes at most `len` bytes into it.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            (&mut st as *mut libc::xdp_statistics).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(KernelXskStats {
        rx_dropped: st.rx_dropped,
        rx_invalid_descs: st.rx_invalid_descs,
        tx_invalid_descs: st.tx_invalid_descs,
        rx_ring_full: st.rx_ring_full,
        rx_fill_ring_empty_descs: st.rx_fill_ring_empty_descs,
        tx_ring_empty_descs: st.tx_ring_empty_descs,
    })
}

impl Umem {
    /// Free list + frames in hand + frames held by `sockets`: equals `frame_count()` when no
    /// frame has leaked.
    pub fn frames_accounted(&self, sockets: &[&XskSocket]) -> u64 {
        self.free.len() as u64
            + self.in_hand as u64
            + sockets.iter().map(|s| s.frames_held() as u64).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's frames are where their descriptors say, each writable to the end of its chunk,
    /// and a length past the chunk (a caller's mistake) is cut to it.
    #[test]
    fn a_batch_reaches_each_frame_in_place() {
        let mut umem = Umem::in_memory(4, 2048).unwrap();
        for (k, addr) in [0u64, 2048 + 256, 3 * 2048].into_iter().enumerate() {
            umem.frame_mut(addr)[..3].copy_from_slice(&[k as u8; 3]);
        }
        let mut descs = [
            Desc { addr: 0, len: 3 },
            Desc {
                addr: 2048 + 256,
                len: 3,
            },
            Desc {
                addr: 3 * 2048,
                len: 3,
            },
        ];
        let mut batch = umem.batch(&mut descs);
        assert_eq!(batch.len(), 3);
        for k in 0..3 {
            assert_eq!(batch.frame(k), &[k as u8; 3][..]);
            // SAFETY: `k < batch.len()`.
            assert_eq!(unsafe { batch.frame_unchecked(k) }, batch.frame(k));
        }
        let (buf, len) = batch.frame_mut(1);
        assert_eq!(buf.len(), 2048 - 256);
        buf[3] = 9;
        *len = 4;
        assert_eq!(batch.frame(1), &[1, 1, 1, 9][..]);
        // SAFETY: `2 < batch.len()`.
        let (buf, len) = unsafe { batch.frame_mut_unchecked(2) };
        assert_eq!(buf.len(), 2048);
        *len = 5000;
        assert_eq!(batch.frame(2).len(), 2048);
        assert_eq!(batch.descs()[1].len, 4);
    }

    #[test]
    #[should_panic(expected = "frame address outside the UMEM")]
    fn a_batch_refuses_an_address_outside_the_umem() {
        let mut umem = Umem::in_memory(2, 2048).unwrap();
        let mut descs = [Desc {
            addr: 2 * 2048,
            len: 64,
        }];
        umem.batch(&mut descs);
    }
}
