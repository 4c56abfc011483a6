//! The in-kernel fast path for established pod flows (`podInterception: tap`): the workers
//! decide, the kernel repeats their translation.
//!
//! The tap redirect's tc program (`crate::tc`) first looks the packet's IPv4 5-tuple up in
//! [`FlowOffload`]'s hash map. A flow is there only after a worker decided its connection
//! (conntrack, policy and endpoint choice done: from its SYN, or once established) and installed
//! the translation it applied: new source and destination address and ports. On a hit the program
//! rewrites the header with the kernel's checksum helpers (`bpf_l3_csum_replace`,
//! `bpf_l4_csum_replace` with `BPF_F_PSEUDO_HDR` for the addresses: right for the partial
//! checksums of GSO super-frames, which stay whole), counts the packet (the segments it stands
//! for, and its bytes) in the flow's slot of an mmap-able array, and sends it on: with the
//! direct hop the worker installed (a flow between pods, docs/afxdp.md § Direct routing), TTL
//! one lower and the hop's MACs, to that interface's transmit (`bpf_redirect`); without one, to
//! the kernel (`TC_ACT_OK`), which routes it as it routes what kxdp writes into its tap.
//! Everything else, and every TCP SYN without ACK or RST, takes the redirect into the tap as
//! before, so the workers decide each connection and see each reset. The rest of a
//! connection's handshake and its close take the fast path when the flow is on it: the
//! program ORs each TCP segment's flags into the flow's slot (and a bit for a segment without
//! FIN after one with it: the close's last ACK), and the worker that owns the flow plays them
//! into conntrack at its next check ([`FlowOffload::flags`]).
//!
//! A flow is bound to the interface it arrived on: the same tuple arriving elsewhere (a pod
//! spoofing another's connection) takes the tap and its source check.
//!
//! On an interface that keeps kxdp's XDP program (an uplink beside pods on the tap), the XDP
//! program looks the frame up the same way ([`emit_lookup`], shared by both programs) and hands
//! a flow on the fast path to the kernel (`XDP_PASS`) instead of to AF_XDP; the tc program on
//! that interface's ingress then carries it, after the kernel's GRO has merged its frames.
//!
//! Not on the fast path (the tap takes them): IPv6, IPv4 with options or fragments, a TTL of
//! 1 or less, frames whose headers are not in the buffer's linear part.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use kxdp_packet::tcp::flags as tcp;

use crate::bpf::asm::*;
use crate::bpf::{
    Map, PacketPointers, BPF_F_MMAPABLE, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH,
    HELPER_L3_CSUM_REPLACE, HELPER_L4_CSUM_REPLACE, HELPER_MAP_LOOKUP_ELEM, HELPER_REDIRECT,
    HELPER_SKB_STORE_BYTES,
};
/// The kernel's "operation not supported" for a map without batch operations (not in libc:
/// kernel-internal, yet what `bpf()` returns then).
const ENOTSUPP: i32 = 524;

/// Flows kxdp can offload at once, per node (the hash map's and the counter array's size).
pub const OFFLOAD_SLOTS: u32 = 65536;

/// The hash map's key: an IPv4 flow as it arrives (addresses and ports in network order, the
/// protocol, three zero bytes).
pub const KEY_LEN: usize = 16;
/// The hash map's value: source and destination address, source and destination port (network
/// order), the counter slot, the interface the flow arrives on and the one it leaves by (host
/// order; 0: the kernel routes it), then the destination and source MAC to leave with.
pub const VALUE_LEN: usize = 36;
/// A counter slot: packets (segments), bytes, the TCP flags seen ([`FlowOffload::flags`]), a
/// spare word.
const COUNTER_LEN: u32 = 32;
/// The words of a counter slot.
const SLOT_WORDS: usize = COUNTER_LEN as usize / 8;
const SLOT_FLAGS: i16 = 16;
/// In a slot's flags word beside the TCP flags: a segment without FIN came after one with FIN
/// in this direction (the close's last ACK, or an ACK of data after a half-close).
pub const AFTER_FIN: u64 = 0x100;
/// The TCP flags the program tests, as immediates.
const TCP_FIN: i32 = tcp::FIN as i32;
const TCP_SYN: i32 = tcp::SYN as i32;
const TCP_RST: i32 = tcp::RST as i32;
const TCP_ACK: i32 = tcp::ACK as i32;

/// An IPv4 flow as the fast path keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
    /// The IP protocol number (TCP or UDP: the program looks nothing else up).
    pub proto: u8,
}

impl FlowKey {
    pub fn bytes(&self) -> [u8; KEY_LEN] {
        let mut k = [0u8; KEY_LEN];
        put_addrs(&mut k, self.src, self.dst, self.sport, self.dport);
        k[12] = self.proto;
        k
    }
}

/// Addresses and ports as key and value both start: 12 bytes in network order.
fn put_addrs(b: &mut [u8], src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) {
    b[..4].copy_from_slice(&src);
    b[4..8].copy_from_slice(&dst);
    b[8..10].copy_from_slice(&sport.to_be_bytes());
    b[10..12].copy_from_slice(&dport.to_be_bytes());
}

/// What the fast path makes of a flow's packets, and where it counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRewrite {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
    pub slot: u32,
    /// The only interface whose packets of the flow take the fast path: one with the same
    /// tuple elsewhere (a spoof) goes to the tap and its source check.
    pub ingress: u32,
    /// Where the rewritten packets go: `Some`, straight to that interface's transmit with
    /// those MACs and the TTL one lower (the worker's FIB decided); `None`, to the kernel's
    /// stack, which routes them.
    pub egress: Option<DirectHop>,
}

/// A next hop the workers resolved: the interface and the MACs to send with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectHop {
    pub ifindex: u32,
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
}

impl FlowRewrite {
    fn bytes(&self) -> [u8; VALUE_LEN] {
        let mut v = [0u8; VALUE_LEN];
        put_addrs(&mut v, self.src, self.dst, self.sport, self.dport);
        v[12..16].copy_from_slice(&self.slot.to_ne_bytes());
        v[16..20].copy_from_slice(&self.ingress.to_ne_bytes());
        if let Some(hop) = self.egress {
            v[20..24].copy_from_slice(&hop.ifindex.to_ne_bytes());
            v[24..30].copy_from_slice(&hop.dst_mac);
            v[30..36].copy_from_slice(&hop.src_mac);
        }
        v
    }
}

/// The descriptors of the fast path's maps (for the program that uses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadMaps {
    pub flows: i32,
    pub counters: i32,
}

/// The fast path's flow map and its counters (mapped into this process: reading a flow's
/// counts is a load, not a system call).
pub struct FlowOffload {
    flows: Map,
    counters: Map,
    counts: NonNull<AtomicU64>,
    slots: u32,
    mapped: usize,
}

// SAFETY: `counts` points into a shared mapping that lives as long as `self` and is only ever
// accessed through atomics; the maps are descriptors.
unsafe impl Send for FlowOffload {}
// SAFETY: as for Send: every access through `counts` is atomic.
unsafe impl Sync for FlowOffload {}

impl FlowOffload {
    /// New, empty maps for `slots` flows (a multiple of 4096).
    pub fn new(slots: u32) -> io::Result<FlowOffload> {
        // Whole pages of any size up to 64 KiB.
        let mapped = slots as usize * COUNTER_LEN as usize;
        if slots == 0 || mapped % 65536 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("offload slots {slots}: a multiple of 4096"),
            ));
        }
        let flows = Map::create(BPF_MAP_TYPE_HASH, KEY_LEN as u32, VALUE_LEN as u32, slots)?;
        let counters =
            Map::create_with_flags(BPF_MAP_TYPE_ARRAY, 4, COUNTER_LEN, slots, BPF_F_MMAPABLE)?;
        FlowOffload::with_maps(flows, counters, slots)
    }

    fn with_maps(flows: Map, counters: Map, slots: u32) -> io::Result<FlowOffload> {
        let mapped = slots as usize * COUNTER_LEN as usize;
        let counts = crate::afxdp::map_shared(counters.fd_borrowed(), mapped)?.cast();
        Ok(FlowOffload {
            flows,
            counters,
            counts,
            slots,
            mapped,
        })
    }

    /// The two maps' descriptors, flows then counters (for a takeover: [`FlowOffload::adopt`]).
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.flows.fd_borrowed(), self.counters.fd_borrowed()]
    }

    /// The maps a predecessor made for `slots` flows (received in a takeover), emptied: the
    /// flows on them were that process's to take off, and the programs that read these maps
    /// stay attached (the XDP programs of a takeover), so nothing may stay on them unowned.
    pub fn adopt(flows: OwnedFd, counters: OwnedFd, slots: u32) -> io::Result<FlowOffload> {
        let fast = FlowOffload::with_maps(
            Map::from_fd(flows, KEY_LEN as u32, VALUE_LEN as u32),
            Map::from_fd(counters, 4, COUNTER_LEN),
            slots,
        )?;
        fast.clear()?;
        Ok(fast)
    }

    /// Takes every flow off the fast path; returns how many were on it.
    pub fn clear(&self) -> io::Result<usize> {
        // Every key first (one call each), then as few deletions as the kernel allows.
        let mut keys = Vec::new();
        let mut key = [0u8; KEY_LEN];
        let mut more = self.flows.next_key(None, &mut key)?;
        while more {
            keys.extend_from_slice(&key);
            let at = key;
            more = self.flows.next_key(Some(&at), &mut key)?;
        }
        let mut at = 0;
        while at < keys.len() {
            match self.flows.delete_batch(&keys[at..]) {
                Ok(()) => break,
                Err((e, done)) => {
                    at += done * KEY_LEN;
                    // Gone meanwhile, or no batch operations (a kernel before 5.6).
                    match self.flows.delete(&keys[at..at + KEY_LEN]) {
                        Err(d) if d.raw_os_error() != Some(libc::ENOENT) => {
                            return Err(io::Error::new(e.kind(), format!("clearing: {d}")))
                        }
                        _ => at += KEY_LEN,
                    }
                }
            }
        }
        Ok(keys.len() / KEY_LEN)
    }

    pub fn maps(&self) -> OffloadMaps {
        OffloadMaps {
            flows: self.flows.fd(),
            counters: self.counters.fd(),
        }
    }

    /// The counter slots (0 to `slots() - 1`).
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Puts `flow` on the fast path (replacing what it had).
    pub fn install(&self, flow: &FlowKey, rewrite: &FlowRewrite) -> io::Result<()> {
        if rewrite.slot >= self.slots {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("offload slot {} of {}", rewrite.slot, self.slots),
            ));
        }
        self.flows.update(&flow.bytes(), &rewrite.bytes())
    }

    /// Puts two flows on the fast path in one system call (a connection's two directions), or
    /// neither.
    pub fn install_pair(&self, flows: [(&FlowKey, &FlowRewrite); 2]) -> io::Result<()> {
        if flows.iter().any(|(_, r)| r.slot >= self.slots) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("offload slot of {}", self.slots),
            ));
        }
        let mut keys = [0u8; 2 * KEY_LEN];
        let mut values = [0u8; 2 * VALUE_LEN];
        for (i, (k, r)) in flows.iter().enumerate() {
            keys[i * KEY_LEN..][..KEY_LEN].copy_from_slice(&k.bytes());
            values[i * VALUE_LEN..][..VALUE_LEN].copy_from_slice(&r.bytes());
        }
        match self.flows.update_batch(&keys, &values) {
            Ok(()) => Ok(()),
            // No batch operations (a kernel before 5.6): one at a time.
            Err((e, 0)) if matches!(e.raw_os_error(), Some(libc::EINVAL | ENOTSUPP)) => {
                self.install(flows[0].0, flows[0].1)?;
                self.install(flows[1].0, flows[1].1).inspect_err(|_| {
                    let _ = self.remove(flows[0].0);
                })
            }
            Err((e, done)) => {
                if done > 0 {
                    let _ = self.remove(flows[0].0);
                }
                Err(e)
            }
        }
    }

    /// Takes `flows` off the fast path in as few system calls as the kernel allows; `gone[i]`
    /// says whether `flows[i]` is off it now (it was removed, or was not on it).
    pub fn remove_all(&self, flows: &[FlowKey], gone: &mut [bool]) {
        let keys: Vec<u8> = flows.iter().flat_map(|k| k.bytes()).collect();
        let mut at = 0;
        while at < flows.len() {
            match self.flows.delete_batch(&keys[at * KEY_LEN..]) {
                Ok(()) => {
                    gone[at..flows.len()].fill(true);
                    return;
                }
                Err((e, done)) => {
                    gone[at..at + done].fill(true);
                    at += done;
                    // The flow the kernel stopped at, on its own; without batch operations
                    // (a kernel before 5.6), every flow left.
                    let alone = match e.raw_os_error() {
                        Some(libc::ENOENT) => at + 1,
                        _ => flows.len(),
                    };
                    while at < alone {
                        gone[at] = self.remove(&flows[at]).is_ok();
                        at += 1;
                    }
                }
            }
        }
    }

    /// Takes `flow` off the fast path; false when it was not on it.
    pub fn remove(&self, flow: &FlowKey) -> io::Result<bool> {
        match self.flows.delete(&flow.bytes()) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The packets and bytes the fast path has counted in `slot` since the maps were made
    /// (never reset: a user keeps the value it started from).
    pub fn counts(&self, slot: u32) -> (u64, u64) {
        if slot >= self.slots {
            return (0, 0);
        }
        (
            self.word(slot, 0).load(Ordering::Relaxed),
            self.word(slot, 1).load(Ordering::Relaxed),
        )
    }

    /// The TCP flags the fast path has seen in `slot` since the maps were made, ORed, with
    /// [`AFTER_FIN`] once a segment without FIN followed one with it (never reset: a user keeps
    /// what it has already acted on). 0 for UDP.
    pub fn flags(&self, slot: u32) -> u64 {
        if slot >= self.slots {
            return 0;
        }
        self.word(slot, 2).load(Ordering::Relaxed)
    }

    /// Clears `slot`'s flags for a new flow (the packets and bytes go on: a user keeps the
    /// value it started from).
    pub fn clear_flags(&self, slot: u32) {
        if slot < self.slots {
            self.word(slot, 2).store(0, Ordering::Relaxed);
        }
    }

    /// Word `i` of `slot` (which is below `slots`).
    fn word(&self, slot: u32, i: usize) -> &AtomicU64 {
        debug_assert!(slot < self.slots && i < SLOT_WORDS);
        // SAFETY: `slot < slots` and `i < SLOT_WORDS` keep the word within the mapping, which
        // lives as long as `self`; the kernel writes these words only with atomic operations
        // and so do we access them.
        unsafe { &*self.counts.as_ptr().add(slot as usize * SLOT_WORDS + i) }
    }

    /// Adds to `slot`'s counts as the program does for each packet it moves: for tests of the
    /// workers' side, which cannot run the program.
    #[doc(hidden)]
    pub fn add_counts(&self, slot: u32, packets: u64, bytes: u64) {
        if slot >= self.slots {
            return;
        }
        self.word(slot, 0).fetch_add(packets, Ordering::Relaxed);
        self.word(slot, 1).fetch_add(bytes, Ordering::Relaxed);
    }

    /// Adds to `slot`'s flags as the program does for a TCP segment: for tests of the workers'
    /// side.
    #[doc(hidden)]
    pub fn add_flags(&self, slot: u32, flags: u64) {
        if slot < self.slots {
            self.word(slot, 2).fetch_or(flags, Ordering::Relaxed);
        }
    }
}

impl Drop for FlowOffload {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map_shared` with this length and nothing refers to
        // it once `self` goes.
        unsafe {
            libc::munmap(self.counts.as_ptr().cast(), self.mapped);
        }
    }
}

/// The checksum helpers' flags: the changed field's size is in the low bits.
const F_PSEUDO_HDR: i32 = 0x10;
const F_MARK_MANGLED_0: i32 = 0x20;
/// `struct __sk_buff` fields the program reads.
const SKB_LEN: i16 = 0;
const SKB_IFINDEX: i16 = 40;
/// Where the packet's bytes are (`data`, `data_end`): the tc programs' context.
pub(crate) const SKB_POINTERS: PacketPointers = PacketPointers {
    data: 76,
    data_end: 80,
};
const SKB_GSO_SEGS: i16 = 164;
/// Offsets in an untagged Ethernet frame carrying IPv4 without options.
const ETH_TYPE: i16 = 12;
const IP: i16 = 14;
const IP_VER_IHL: i16 = IP;
const IP_FRAG: i16 = IP + 6;
const IP_TTL: i16 = IP + 8;
const IP_PROTO: i16 = IP + 9;
const IP_CSUM: i32 = IP as i32 + 10;
const IP_SRC: i16 = IP + 12;
const IP_DST: i16 = IP + 16;
const L4: i16 = IP + 20;
const TCP_FLAGS: i16 = L4 + 13;
const TCP_CSUM: i32 = L4 as i32 + 16;
const UDP_CSUM: i32 = L4 as i32 + 6;
/// The bytes the program reads: up to the end of a TCP header without options.
const HEADERS: i32 = L4 as i32 + 20;
/// Stack slots (below the frame pointer r10).
const KEY: i16 = -16;
const SLOT: i16 = -20;
const TTL_BYTE: i16 = -24;
const ADDR_FLAGS: i16 = -32;
const PORT_FLAGS: i16 = -40;
const SEEN_FLAGS: i16 = -48;
pub(crate) const TC_ACT_OK: i32 = 0;

/// Emits the flow lookup the tc program and the XDP program share (context in r6, packet
/// pointers at `at`, the packet's interface index at `ifindex_at` in the context): an IPv4
/// frame without options, not a fragment, TTL above 1, TCP but a SYN without ACK or a RST, or
/// UDP; its 5-tuple in the flow map, bound to this interface. On a hit r9 holds the flow's
/// value, r7 the IP protocol and `SEEN_FLAGS` the TCP flags (0 for UDP); otherwise it jumps
/// to `not`.
pub(crate) fn emit_lookup(
    a: &mut Asm,
    flows: i32,
    at: PacketPointers,
    ifindex_at: i16,
    not: &'static str,
) {
    a.ldx(W, R2, R6, at.data);
    a.ldx(W, R3, R6, at.data_end);
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, HEADERS);
    a.jmp_x(JGT, R4, R3, not);
    // IPv4 (as it sits in the frame, read little-endian), no options, not a fragment.
    a.ldx(H, R4, R2, ETH_TYPE);
    a.jmp_k(JNE, R4, 0x0008, not);
    a.ldx(B, R4, R2, IP_VER_IHL);
    a.jmp_k(JNE, R4, 0x45, not);
    a.ldx(H, R4, R2, IP_FRAG);
    a.alu_k(AND, R4, 0xff3f);
    a.jmp_k(JNE, R4, 0, not);
    // The kernel answers an expiring TTL; the tap path leaves that to it too.
    a.ldx(B, R4, R2, IP_TTL);
    a.jmp_k(JLE, R4, 1, not);
    a.ldx(B, R7, R2, IP_PROTO);
    a.mov_k(R4, 0);
    a.jmp_k(JEQ, R7, 17, "lookup_flags");
    a.jmp_k(JNE, R7, 6, not);
    // A connection's first SYN and every RST go to the workers: they decide each connection
    // and see every reset at once. What else a flow carries (a SYN-ACK, FINs) is reported
    // (below).
    a.ldx(B, R4, R2, TCP_FLAGS);
    a.mov_x(R5, R4);
    a.alu_k(AND, R5, TCP_RST);
    a.jmp_k(JNE, R5, 0, not);
    a.mov_x(R5, R4);
    a.alu_k(AND, R5, TCP_SYN | TCP_ACK);
    a.jmp_k(JEQ, R5, TCP_SYN, not);
    a.label("lookup_flags");
    a.stx(DW, R10, SEEN_FLAGS, R4);
    a.ldx(W, R4, R2, IP_SRC);
    a.stx(W, R10, KEY, R4);
    a.ldx(W, R4, R2, IP_DST);
    a.stx(W, R10, KEY + 4, R4);
    a.ldx(W, R4, R2, L4);
    a.stx(W, R10, KEY + 8, R4);
    a.stx(W, R10, KEY + 12, R7);
    a.ld_map(R1, flows);
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, KEY as i32);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JEQ, R0, 0, not);
    a.mov_x(R9, R0);
    a.ldx(W, R4, R9, 16);
    a.ldx(W, R5, R6, ifindex_at);
    a.jmp_x(JNE, R4, R5, not);
}

/// Emits the fast path at the start of a tc program: on a hit the program ends there
/// (`TC_ACT_OK`); on a miss it jumps to `miss`. The context is in r6 (the caller's first
/// instruction puts it there) and stays there.
pub(crate) fn emit(a: &mut Asm, maps: OffloadMaps, miss: &'static str) {
    const NOT: &str = "offload_not";
    emit_lookup(a, maps.flows, SKB_POINTERS, SKB_IFINDEX, NOT);
    // The checksum each rewrite updates, and how.
    a.jmp_k(JEQ, R7, 6, "offload_tcp");
    // UDP: a zero checksum (none) stays zero.
    a.mov_k(R8, UDP_CSUM);
    a.mov_k(R4, F_PSEUDO_HDR | F_MARK_MANGLED_0 | 4);
    a.stx(DW, R10, ADDR_FLAGS, R4);
    a.mov_k(R4, F_MARK_MANGLED_0 | 4);
    a.stx(DW, R10, PORT_FLAGS, R4);
    a.ja("offload_count");
    a.label("offload_tcp");
    a.mov_k(R8, TCP_CSUM);
    a.mov_k(R4, F_PSEUDO_HDR | 4);
    a.stx(DW, R10, ADDR_FLAGS, R4);
    a.mov_k(R4, 4);
    a.stx(DW, R10, PORT_FLAGS, R4);
    a.label("offload_count");
    // Count: the segments a super-frame stands for (one for a plain frame), and its bytes.
    a.ldx(W, R4, R9, 12);
    a.stx(W, R10, SLOT, R4);
    a.ld_map(R1, maps.counters);
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, SLOT as i32);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JEQ, R0, 0, "offload_rewrite");
    a.ldx(W, R1, R6, SKB_GSO_SEGS);
    a.jmp_k(JNE, R1, 0, "offload_segs");
    a.mov_k(R1, 1);
    a.label("offload_segs");
    a.atomic_add64(R0, 0, R1);
    a.ldx(W, R1, R6, SKB_LEN);
    a.atomic_add64(R0, 8, R1);
    emit_report_flags(a);
    a.label("offload_rewrite");
    // Each changed field: the L4 checksum, the IP checksum (addresses), then the bytes.
    let fields: [(i16, i16, i32, Option<i32>, &'static str); 3] = [
        (KEY + 4, 4, IP_DST as i32, Some(IP_CSUM), "offload_dst_same"),
        (KEY, 0, IP_SRC as i32, Some(IP_CSUM), "offload_src_same"),
        (KEY + 8, 8, L4 as i32, None, "offload_ports_same"),
    ];
    for (old, new, at, l3, same) in fields {
        a.ldx(W, R3, R10, old);
        a.ldx(W, R4, R9, new);
        a.jmp_x(JEQ, R3, R4, same);
        a.mov_x(R1, R6);
        a.mov_x(R2, R8);
        a.ldx(
            DW,
            R5,
            R10,
            if l3.is_some() { ADDR_FLAGS } else { PORT_FLAGS },
        );
        a.call(HELPER_L4_CSUM_REPLACE);
        if let Some(csum) = l3 {
            a.mov_x(R1, R6);
            a.mov_k(R2, csum);
            a.ldx(W, R3, R10, old);
            a.ldx(W, R4, R9, new);
            a.mov_k(R5, 4);
            a.call(HELPER_L3_CSUM_REPLACE);
        }
        a.mov_x(R1, R6);
        a.mov_k(R2, at);
        a.mov_x(R3, R9);
        a.alu_k(ADD, R3, new as i32);
        a.mov_k(R4, 4);
        a.mov_k(R5, 0);
        a.call(HELPER_SKB_STORE_BYTES);
        a.label(same);
    }
    emit_direct(a);
    a.label(NOT);
    a.ja(miss);
}

/// After the counts (r0: the flow's counter slot): ORs the segment's TCP flags into the slot,
/// with [`AFTER_FIN`] when this direction sent a FIN before and this segment has none. UDP
/// (flags 0) reports nothing.
fn emit_report_flags(a: &mut Asm) {
    const REPORT: &str = "offload_report";
    const DONE: &str = "offload_reported";
    a.ldx(DW, R1, R10, SEEN_FLAGS);
    a.jmp_k(JEQ, R1, 0, DONE);
    a.ldx(DW, R2, R0, SLOT_FLAGS);
    a.alu_k(AND, R2, TCP_FIN);
    a.jmp_k(JEQ, R2, 0, REPORT);
    a.mov_x(R2, R1);
    a.alu_k(AND, R2, TCP_FIN);
    a.jmp_k(JNE, R2, 0, REPORT);
    a.alu_k(OR, R1, AFTER_FIN as i32);
    a.label(REPORT);
    a.atomic_or64(R0, SLOT_FLAGS, R1);
    a.label(DONE);
}

/// The value's fields past the rewrite: the egress interface, then its two MACs.
const VALUE_EGRESS: i16 = 20;
const VALUE_MACS: i16 = 24;

/// After the rewrite (r6: context, r9: the flow's value): a flow with an egress goes straight
/// to that interface's transmit, TTL one lower and with the MACs the worker's FIB gave, so it
/// skips the node's IP receive, netfilter and routing; one without goes to the kernel's stack
/// (`TC_ACT_OK`), which routes it.
fn emit_direct(a: &mut Asm) {
    const KERNEL: &str = "offload_kernel";
    a.ldx(W, R4, R9, VALUE_EGRESS);
    a.jmp_k(JEQ, R4, 0, KERNEL);
    // The rewrite's helpers invalidated the packet pointers.
    a.ldx(W, R2, R6, SKB_POINTERS.data);
    a.ldx(W, R3, R6, SKB_POINTERS.data_end);
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, L4 as i32);
    a.jmp_x(JGT, R4, R3, KERNEL);
    // TTL and protocol as they sit; the TTL is above 1 (checked before the lookup).
    a.ldx(H, R3, R2, IP_TTL);
    a.mov_x(R4, R3);
    a.alu_k(ADD, R4, -1);
    a.stx(B, R10, TTL_BYTE, R4);
    a.mov_x(R1, R6);
    a.mov_k(R2, IP_CSUM);
    a.mov_k(R5, 2);
    a.call(HELPER_L3_CSUM_REPLACE);
    let stores: [(i32, u8, i16, i32); 2] =
        [(IP_TTL as i32, R10, TTL_BYTE, 1), (0, R9, VALUE_MACS, 12)];
    for (at, base, from, len) in stores {
        a.mov_x(R1, R6);
        a.mov_k(R2, at);
        a.mov_x(R3, base);
        a.alu_k(ADD, R3, from as i32);
        a.mov_k(R4, len);
        a.mov_k(R5, 0);
        a.call(HELPER_SKB_STORE_BYTES);
    }
    a.ldx(W, R1, R9, VALUE_EGRESS);
    a.mov_k(R2, 0);
    a.call(HELPER_REDIRECT);
    a.exit();
    a.label(KERNEL);
    a.mov_k(R0, TC_ACT_OK);
    a.exit();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_path_is_short() {
        let mut a = Asm::default();
        emit(
            &mut a,
            OffloadMaps {
                flows: 3,
                counters: 4,
            },
            "miss",
        );
        a.label("miss");
        let n = a.finish().len();
        eprintln!("fast path: {n} instructions");
        // A hit runs at most all of them once; a miss at most the parse and one lookup.
        assert!(n <= 180, "{n}");
    }

    /// Needs root (BPF maps). Two flows go on in one call, or neither; flows come off in one
    /// call, one that was not on in the middle included.
    #[test]
    fn flows_go_on_in_pairs_and_come_off_in_batches() {
        let Ok(fast) = FlowOffload::new(4096) else {
            eprintln!("SKIPPED: no BPF maps here");
            return;
        };
        let key = |port: u16| FlowKey {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            sport: port,
            dport: 80,
            proto: 6,
        };
        let rewrite = |slot: u32| FlowRewrite {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            sport: 1,
            dport: 80,
            slot,
            ingress: 3,
            egress: None,
        };
        let mut value = [0u8; VALUE_LEN];
        let on = |k: &FlowKey, v: &mut [u8; VALUE_LEN]| fast.flows.lookup(&k.bytes(), v).unwrap();
        fast.install_pair([(&key(1), &rewrite(1)), (&key(2), &rewrite(2))])
            .unwrap();
        assert!(on(&key(1), &mut value) && on(&key(2), &mut value));
        assert_eq!(value, rewrite(2).bytes());
        // A slot out of range: neither goes on.
        assert!(fast
            .install_pair([(&key(3), &rewrite(3)), (&key(4), &rewrite(1 << 20))])
            .is_err());
        assert!(!on(&key(3), &mut value) && !on(&key(4), &mut value));
        fast.install(&key(5), &rewrite(5)).unwrap();
        let keys = [key(1), key(9), key(2), key(5)];
        let mut gone = [false; 4];
        fast.remove_all(&keys, &mut gone);
        assert_eq!(gone, [true; 4], "one not on it is off it too");
        assert!(keys.iter().all(|k| !on(k, &mut value)));
        fast.remove_all(&[], &mut []);
        // A successor adopts the maps emptied, counters kept.
        for i in 1..=300 {
            fast.install(&key(i), &rewrite(u32::from(i % 8))).unwrap();
        }
        fast.add_counts(3, 2, 120);
        let [flows, counters] = fast.fds().map(|fd| fd.try_clone_to_owned().unwrap());
        let adopted = FlowOffload::adopt(flows, counters, 4096).unwrap();
        assert!(!on(&key(1), &mut value) && !on(&key(300), &mut value));
        assert_eq!(adopted.counts(3), (2, 120));
        assert_eq!(adopted.clear().unwrap(), 0);
    }

    #[test]
    fn keys_and_values_are_laid_out_as_the_program_reads_them() {
        let k = FlowKey {
            src: [10, 0, 0, 1],
            dst: [172, 30, 0, 10],
            sport: 40000,
            dport: 80,
            proto: 6,
        };
        assert_eq!(
            k.bytes(),
            [10, 0, 0, 1, 172, 30, 0, 10, 0x9c, 0x40, 0, 80, 6, 0, 0, 0]
        );
        let v = FlowRewrite {
            src: [10, 0, 0, 1],
            dst: [10, 1, 0, 5],
            sport: 40000,
            dport: 5201,
            slot: 7,
            ingress: 9,
            egress: Some(DirectHop {
                ifindex: 4,
                dst_mac: [2, 0, 0, 0, 0, 0xd],
                src_mac: [2, 0, 0, 0, 0, 0xc],
            }),
        };
        assert_eq!(
            &v.bytes()[..12],
            &[10, 0, 0, 1, 10, 1, 0, 5, 0x9c, 0x40, 0x14, 0x51]
        );
        assert_eq!(u32::from_ne_bytes(v.bytes()[12..16].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(v.bytes()[16..20].try_into().unwrap()), 9);
        assert_eq!(u32::from_ne_bytes(v.bytes()[20..24].try_into().unwrap()), 4);
        assert_eq!(
            &v.bytes()[24..36],
            &[2, 0, 0, 0, 0, 0xd, 2, 0, 0, 0, 0, 0xc]
        );
        let kernel = FlowRewrite { egress: None, ..v };
        assert_eq!(&kernel.bytes()[20..36], &[0; 16]);
    }
}
