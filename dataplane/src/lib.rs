//! kxdp's fast path. Safe Rust only: the kernel boundary (AF_XDP, bpf(), netlink, ethtool)
//! is the `kxdp-kernel` crate.

#![forbid(unsafe_code)]

pub mod conntrack;
pub mod egress;
pub mod fib;
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
