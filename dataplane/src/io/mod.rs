//! Packet I/O for `kxdp run`: the runner that attaches to interfaces and starts the workers
//! ([`runner`]), and the route refresher ([`route`]). The kernel-facing pieces (AF_XDP sockets
//! and UMEM, the XDP program, bpf(), netlink, ethtool) live in the `kxdp-kernel` crate, which
//! holds all of the project's `unsafe`; they are re-exported here under their old paths.
//! See `docs/afxdp.md` for the design and the measured behaviour on veth.

pub mod hostpath;
pub mod route;
pub mod runner;
pub mod takeover;

pub use kxdp_kernel::{afxdp, enter_netns, handover, ifindex, xdp};

use crate::pipeline::Frames;
use kxdp_kernel::afxdp::{Desc, Umem};

/// A batch of received frames presented to the pipeline (`Frames`), in place in the UMEM.
pub struct UmemBatch<'a> {
    pub umem: &'a mut Umem,
    pub descs: &'a mut [Desc],
}

// SAFETY (of the trait's promise): `count` is the length of `descs`, which no method changes.
#[allow(unsafe_code)]
unsafe impl Frames for UmemBatch<'_> {
    #[inline]
    fn count(&self) -> usize {
        self.descs.len()
    }

    #[inline]
    fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        let d = &mut self.descs[i];
        (self.umem.frame_mut(d.addr), &mut d.len)
    }

    #[inline]
    fn frame(&self, i: usize) -> &[u8] {
        let d = &self.descs[i];
        &self.umem.frame(d.addr)[..d.len]
    }

    // Only the descriptor's index goes unchecked: its address and length come from the kernel's
    // RX ring and stay checked (`Umem::frame`'s assert, the slice to `len`).
    #[inline(always)]
    unsafe fn frame_unchecked(&self, i: usize) -> &[u8] {
        // SAFETY: the caller's `i < count() == descs.len()`.
        let d = unsafe { self.descs.get_unchecked(i) };
        &self.umem.frame(d.addr)[..d.len]
    }

    #[inline(always)]
    unsafe fn frame_mut_unchecked(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        // SAFETY: as in `frame_unchecked`.
        let d = unsafe { self.descs.get_unchecked_mut(i) };
        (self.umem.frame_mut(d.addr), &mut d.len)
    }
}
