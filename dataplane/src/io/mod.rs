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

impl Frames for UmemBatch<'_> {
    fn count(&self) -> usize {
        self.descs.len()
    }

    fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        let d = &mut self.descs[i];
        (self.umem.frame_mut(d.addr), &mut d.len)
    }

    fn frame(&self, i: usize) -> &[u8] {
        let d = &self.descs[i];
        &self.umem.frame(d.addr)[..d.len]
    }
}
