//! kxdp's fast path.

pub mod conntrack;
pub mod snapshot;
