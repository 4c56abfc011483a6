//! kxdp's kernel boundary: every system call and every line of `unsafe` the project has.
//!
//! - [`afxdp`]: AF_XDP sockets, their UMEM and rings (shared memory with the kernel).
//! - [`bpf`]: the `bpf()` system call: maps, program loading and the assembler kxdp's programs
//!   are written with (each command, map type and helper number named once).
//! - [`xdp`]: the hand-assembled XDP program, its maps and BPF links.
//! - [`netlink`]: routes, addresses, links, neighbours and the bridge FDB, and the requests kxdp
//!   makes (neighbour resolution, stale XDP detach), through `netlink-packet-route`.
//! - [`shm`]: anonymous or file-backed shared memory seen as atomics (the conntrack table's
//!   storage, which survives a restart when it is a file), and the CLOCK_MONOTONIC clock.
//! - [`huge`]: reference-counted slices in memory advised for transparent huge pages (the
//!   frontend table's slots and endpoint lists).
//! - [`mount`]: whether a directory is a tmpfs that gives huge pages, and mounting one (the
//!   conntrack state file's directory).
//! - [`handover`]: memfds and descriptors passed over a Unix socket (a takeover).
//! - [`packet_tx`]: routed frames straight to an interface's transmit (an `AF_PACKET` socket
//!   with a virtio-net header: GSO super-frames whole), past the node's IP stack.
//! - [`tap`]: a multi-queue tap with a virtio-net header: whole GSO packets to and from the kernel.
//! - [`offload`]: the in-kernel fast path for established pod flows (a prefix of the tap
//!   redirect's tc program) and its maps.
//! - [`tc`]: clsact + match-everything `u32` filters whose `mirred` action redirects a pod
//!   veth's packets to the tap.
//! - [`sys`]: interface indexes, network namespaces, ethtool queries, CPU pinning.
//!
//! Each `unsafe` block sits in a small named helper with a `// SAFETY:` note saying why it is
//! sound. `kxdp-packet` and `kxdp-dataplane` deny `unsafe` but for a few measured fast-path
//! helpers (a prefetch, the pass's unchecked frame accessors: docs/dataplane.md, "Unsafe code
//! in the fast path"). Building needs no C or BPF toolchain.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod afxdp;
pub mod bpf;
pub mod handover;
pub mod huge;
pub mod mount;
pub mod netlink;
pub mod offload;
pub mod packet_tx;
pub mod shm;
pub mod sys;
pub mod tap;
pub mod tc;
pub mod xdp;

pub use sys::{enter_netns, ifindex};
