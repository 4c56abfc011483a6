//! kxdp's fast path.

pub mod conntrack;
pub mod fragments;
pub mod io;
pub mod pipeline;
pub mod policy;
pub mod replay;
pub mod snapshot;
pub mod stale;
pub mod stats;
pub mod verdict;
pub mod worker;
