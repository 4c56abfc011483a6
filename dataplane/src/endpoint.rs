//! The backends a Service's frontends choose from: one `Endpoint`, and a contiguous run of a
//! frontend's endpoints (`EndpointRange`). Their own module because both the snapshot's tables
//! and the Maglev tables built over them (`maglev.rs`) use them.

use kxdp_packet::Addr;

/// One backend a connection may be sent to. In C order, so that `local` is its last byte in
/// use (bytes 0-18 of 20): prefetching the lines of `addr` and `local` covers an endpoint that
/// straddles two (`Pipeline::prepare_new_flows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Endpoint {
    pub addr: Addr,
    /// The target port, already resolved for this Service port.
    pub port: u16,
    /// The endpoint is on this node.
    pub local: bool,
}

const _: () = assert!(
    std::mem::offset_of!(Endpoint, local) + 1 == std::mem::size_of::<Endpoint>() - 1
        && std::mem::offset_of!(Endpoint, addr) == 0
);

/// A contiguous run of a frontend's `endpoints`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EndpointRange {
    pub start: u32,
    pub len: u32,
}

impl EndpointRange {
    pub const EMPTY: EndpointRange = EndpointRange { start: 0, len: 0 };

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_range(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}
