//! kxdp's fast path. Safe Rust but for a few hot-path helpers: the kernel boundary (AF_XDP,
//! bpf(), netlink, ethtool) is the `kxdp-kernel` crate. `unsafe` is denied crate-wide; the
//! helpers that measured faster without a bounds check the compiler cannot drop each
//! carry `#[allow(unsafe_code)]` and a `// SAFETY:` note (docs/dataplane.md, "Unsafe code").

#![deny(unsafe_code)]

pub mod antispoof;
pub mod clock;
pub mod conntrack;
pub mod direct;
pub mod egress;
pub mod endpoint;
pub mod fib;
pub mod fragments;
pub mod hold;
pub mod io;
pub mod maglev;
pub mod neigh;
pub mod offload;
pub mod pipeline;
pub mod policy;
pub mod replay;
pub mod snapshot;
pub mod stale;
pub mod stats;
pub mod tap;
pub mod verdict;
pub mod worker;
