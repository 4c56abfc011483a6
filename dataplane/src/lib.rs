//! kxdp's fast path.

pub mod conntrack;
pub mod pipeline;
pub mod policy;
pub mod replay;
pub mod snapshot;
pub mod verdict;
