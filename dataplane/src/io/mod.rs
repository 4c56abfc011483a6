//! Packet I/O for `kxdp run`: the runner that attaches to interfaces and starts the workers
//! ([`runner`]), and the route refresher ([`route`]). The kernel-facing pieces (AF_XDP sockets
//! and UMEM, the XDP program, bpf(), netlink, ethtool) live in the `kxdp-kernel` crate, which
//! holds all of the project's `unsafe`; reach them by that crate's own paths.
//! See `docs/afxdp.md` for the design and the measured behaviour on veth.

pub mod host_path;
pub mod route;
pub mod runner;
pub mod takeover;

use crate::pipeline::Frames;

/// A batch of received frames presented to the pipeline (`Frames`), in place in the UMEM
/// (`Umem::batch`: the frames' addresses checked once, when the batch is made).
pub type UmemBatch<'a> = kxdp_kernel::afxdp::UmemFrames<'a>;

// SAFETY (of the trait's promise): `count` is the number of descriptors, which no method
// changes.
#[allow(unsafe_code)]
unsafe impl Frames for UmemBatch<'_> {
    #[inline]
    fn count(&self) -> usize {
        self.len()
    }

    #[inline]
    fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        UmemBatch::frame_mut(self, i)
    }

    #[inline]
    fn frame(&self, i: usize) -> &[u8] {
        UmemBatch::frame(self, i)
    }

    #[inline(always)]
    unsafe fn frame_unchecked(&self, i: usize) -> &[u8] {
        // SAFETY: the trait's caller's `i < count() == len()`.
        unsafe { UmemBatch::frame_unchecked(self, i) }
    }

    #[inline(always)]
    unsafe fn frame_mut_unchecked(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        // SAFETY: as in `frame_unchecked`.
        unsafe { UmemBatch::frame_mut_unchecked(self, i) }
    }
}
