//! kxdp's XDP program: hand-assembled eBPF, loaded and attached through raw `bpf()` syscalls.
//!
//! The program is the smallest that steers what the dataplane must see into the AF_XDP socket of
//! the receiving queue (an `XSKMAP` indexed by `rx_queue_index`) and hands the rest to the kernel:
//!
//! ```text
//! not IPv4/IPv6 (ARP, LLDP, ...)                              → kernel (XDP_PASS)
//! IPv4 multicast/broadcast, IPv6 multicast and link-local,
//!   ICMPv6 neighbour discovery (types 133-137)                → kernel
//! destination is a node address (NODE4 / NODE6 maps):
//!   TCP/UDP/SCTP reply of a masqueraded connection (MASQ4/6)  → AF_XDP
//!   TCP/UDP/SCTP to a port set in the PORTS bitmap           → AF_XDP (NodePorts)
//!   anything else                                             → kernel (the node's own traffic)
//! any other IP packet (pods, Services, transit)               → AF_XDP
//! no socket on this queue                                     → kernel (bpf_redirect_map's default)
//! ```
//!
//! Masqueraded connections get replies at a node address on a port the kernel may also use; the
//! worker that creates such a connection records its reply (protocol, endpoint address and port,
//! node port) in the MASQ map (an LRU hash, one `bpf()` call per new masqueraded connection) before
//! the first packet leaves, so the reply is steered to the dataplane and not to the kernel.
//!
//! The maps other than the XSKMAP are shared by the programs of all interfaces ([`SharedMaps`]).
//!
//! The program is attached with a BPF link (`BPF_LINK_CREATE`), native (driver) mode first and
//! generic (skb) mode as the fallback. A link lives exactly as long as its file descriptor: when
//! kxdp exits, is killed by SIGTERM or SIGKILL, or crashes, the kernel closes the descriptor and
//! the program is gone. A program left by something else through the older netlink interface (a
//! previous kxdp built that way, `ip link set xdp`) makes the attach fail with EBUSY; it is
//! removed and the attach retried, so programs are replaced, never stacked.
//!
//! With a conntrack state file, `kxdp run` attaches through netlink instead
//! ([`XdpProgram::attach_held`]): the program then outlives the process, and a packet it would
//! redirect to a socket that is gone (kxdp restarting) is dropped until a deadline kxdp keeps
//! moving ahead ([`SharedMaps::hold_until`]), then passed to the kernel. The next kxdp replaces
//! the program in one netlink call and continues the connections.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::bpf::{
    asm, load_program, pair, sys_bpf, Insn, Map, PacketPointers, BPF_LINK_CREATE,
    BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_XSKMAP,
    BPF_PROG_TYPE_XDP, HELPER_KTIME_GET_NS, HELPER_MAP_LOOKUP_ELEM, HELPER_REDIRECT_MAP,
};
use crate::sys::fd_result;

/// Masqueraded connections whose replies the program recognises (LRU: the oldest go first).
pub const MASQ_ENTRIES: u32 = 65536;
const BPF_XDP: u32 = 37;

/// `XDP_FLAGS_*` (linux/if_link.h).
const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1;
const XDP_FLAGS_SKB_MODE: u32 = 2;
const XDP_FLAGS_DRV_MODE: u32 = 4;

/// Node addresses the program recognises (per family).
pub const MAX_NODE_ADDRS: u32 = 64;
/// The PORTS bitmap: 65536 bits as 2048 u32 words.
const PORT_WORDS: u32 = 2048;

/// How the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// Driver (native) XDP.
    Native,
    /// Generic (skb) XDP: works everywhere, slower; senders need GSO/TSO off.
    Generic,
}

impl XdpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }
}

/// Which modes to try when attaching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ModeChoice {
    /// Native, falling back to generic.
    #[default]
    Auto,
    Native,
    Generic,
}

const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;

/// The map descriptors the program refers to.
#[derive(Clone, Copy, Debug)]
pub struct ProgramMaps {
    pub xsks: i32,
    pub steer: SteerMaps,
    pub hold: i32,
    /// The in-kernel fast path's flow map (`crate::offload`), when the interface's ingress has
    /// the tc fast path too: a flow installed there goes to the kernel (see `program`).
    pub fast_path: Option<i32>,
}

/// The maps [`steer`] reads: which packets at a node address are the dataplane's.
#[derive(Clone, Copy, Debug)]
pub struct SteerMaps {
    pub node4: i32,
    pub node6: i32,
    pub ports: i32,
    pub masq4: i32,
    pub masq6: i32,
}

/// `struct xdp_md`'s.
const XDP_POINTERS: PacketPointers = PacketPointers {
    data: 0,
    data_end: 4,
};
/// `struct xdp_md`'s `ingress_ifindex`.
const XDP_INGRESS_IFINDEX: i16 = 12;

/// Where [`steer`] jumps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SteerTo {
    /// What the dataplane must see.
    pub dataplane: &'static str,
    /// What the kernel keeps (the node's own traffic, multicast, neighbour discovery, not IP).
    pub kernel: &'static str,
    /// A packet whose headers end before the program can read them (an XDP frame: to the
    /// kernel; a socket buffer, whose headers may sit past its linear part: to the dataplane).
    pub short: &'static str,
    /// A destination that is not the node's (pods, Services, transit: the dataplane's on an
    /// interface kxdp serves; the kernel's on `lo`, where every destination is local).
    pub other: &'static str,
}

/// The L4 header offsets the program reads ports at (IPv4 IHL 5..=15; IPv6's 54 is IHL 10's),
/// with their labels.
const L4_OFFSETS: [(i32, &str); 11] = [
    (34, "l4_34"),
    (38, "l4_38"),
    (42, "l4_42"),
    (46, "l4_46"),
    (50, "l4_50"),
    (54, "l4_54"),
    (58, "l4_58"),
    (62, "l4_62"),
    (66, "l4_66"),
    (70, "l4_70"),
    (74, "l4_74"),
];

/// Emits the program (see the module comment for what it does).
pub fn program(maps: ProgramMaps) -> Vec<Insn> {
    use asm::*;
    let mut a = Asm::default();
    a.mov_x(R6, R1);
    if let Some(flows) = maps.fast_path {
        // A flow the workers put on the in-kernel fast path goes to the kernel as the frame it
        // is: its receive path builds super-frames (GRO) and the tc program on this interface's
        // ingress rewrites and sends them on (`crate::offload`). The workers see none of it.
        crate::offload::emit_lookup(&mut a, flows, XDP_POINTERS, XDP_INGRESS_IFINDEX, "steer");
        a.ja("pass");
        a.label("steer");
    }
    steer(
        &mut a,
        maps.steer,
        XDP_POINTERS,
        SteerTo {
            dataplane: "redirect",
            kernel: "pass",
            short: "pass",
            other: "redirect",
        },
    );

    a.label("redirect");
    a.ldx(W, R2, R6, 16); // rx_queue_index
    a.ld_map(R1, maps.xsks);
    a.mov_k(R3, XDP_PASS); // no socket on this queue: see below
    a.call(HELPER_REDIRECT_MAP);
    a.jmp_k(JNE, R0, XDP_PASS, "done");
    // No socket on this queue: kxdp is restarting (or gone). Until the hold deadline
    // (CLOCK_MONOTONIC ns, `SharedMaps::hold_until`) the packet is dropped, as a paused
    // dataplane would lose it: its connection retransmits into the next kxdp, which continues it
    // from the conntrack state file. Passed to the kernel instead, a reply to a translated
    // connection would reach its client untranslated (which resets it) and a packet to a
    // NodePort or a masquerade port would be answered with a RST by the node's stack. After the
    // deadline (no kxdp came back) everything goes to the kernel, as without kxdp.
    a.mov_k(R5, 0);
    a.stx(W, R10, -56, R5);
    a.ld_map(R1, maps.hold);
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, -56);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JEQ, R0, 0, "pass");
    a.ldx(DW, R7, R0, 0);
    a.call(HELPER_KTIME_GET_NS);
    a.jmp_x(JGE, R0, R7, "pass");
    a.mov_k(R0, XDP_DROP);
    a.label("done");
    a.exit();

    a.label("pass");
    a.mov_k(R0, XDP_PASS);
    a.exit();
    a.finish()
}

/// Emits the steering both kinds of program share (the table in the module comment): with
/// the context in r6, jumps to `to.dataplane` or `to.kernel` (or `to.short`). Clobbers r0-r5
/// and r7-r9; uses the stack from fp-48.
pub(crate) fn steer(a: &mut asm::Asm, maps: SteerMaps, at: PacketPointers, to: SteerTo) {
    use asm::*;
    // r2 = data; r3 = data_end
    a.ldx(W, R2, R6, at.data);
    a.ldx(W, R3, R6, at.data_end);
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, 14);
    a.jmp_x(JGT, R4, R3, to.short);
    a.ldx(H, R5, R2, 12); // EtherType, network order
    a.jmp_k(JEQ, R5, 0x0008, "v4");
    a.jmp_k(JEQ, R5, 0xdd86u16 as i32, "v6");
    a.ja(to.kernel);

    // IPv4 (no VLAN tags: those go to the kernel as "not IP").
    a.label("v4");
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, 34);
    a.jmp_x(JGT, R4, R3, to.short);
    a.ldx(W, R7, R2, 30); // destination
    a.ldx(W, R5, R2, 26); // source, for the MASQ key
    a.stx(W, R10, -40, R5);
    a.mov_x(R5, R7);
    a.alu_k(AND, R5, 0xff); // first octet
    a.jmp_k(JGE, R5, 224, to.kernel); // multicast, broadcast
    a.ldx(B, R8, R2, 23); // protocol
    a.ldx(B, R9, R2, 14); // version, IHL
    a.alu_k(AND, R9, 0x0f);
    a.alu_k(LSH, R9, 2);
    a.alu_k(ADD, R9, 14); // L4 offset
    a.ldx(H, R5, R2, 20); // flags, fragment offset
    a.alu_k(AND, R5, 0xff1f); // the offset (network order)
    a.jmp_k(JEQ, R5, 0, "v4_lookup");
    a.mov_k(R8, 0); // a later fragment has no ports
    a.label("v4_lookup");
    a.stx(W, R10, -4, R7);
    a.ld_map(R1, maps.node4);
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, -4);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JEQ, R0, 0, to.other);
    a.mov_k(R7, 4);
    a.ja("node");

    // IPv6 (extension headers are not walked: a node-addressed packet with one goes to the
    // kernel).
    a.label("v6");
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, 54);
    a.jmp_x(JGT, R4, R3, to.short);
    a.ldx(B, R5, R2, 38); // first byte of the destination
    a.jmp_k(JEQ, R5, 0xff, to.kernel); // multicast
    a.jmp_k(JNE, R5, 0xfe, "v6_global");
    a.ldx(B, R5, R2, 39);
    a.alu_k(AND, R5, 0xc0);
    a.jmp_k(JEQ, R5, 0x80, to.kernel); // fe80::/10
    a.label("v6_global");
    a.ldx(B, R8, R2, 20); // next header
    a.mov_k(R9, 54);
    a.jmp_k(JNE, R8, 58, "v6_lookup");
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, 55);
    a.jmp_x(JGT, R4, R3, to.short);
    a.ldx(B, R5, R2, 54); // ICMPv6 type
    a.jmp_k(JLT, R5, 133, "v6_lookup");
    a.jmp_k(JLE, R5, 137, to.kernel); // neighbour discovery
    a.label("v6_lookup");
    for i in 0..4i16 {
        a.ldx(W, R5, R2, 38 + 4 * i);
        a.stx(W, R10, -16 + 4 * i, R5);
        a.ldx(W, R5, R2, 22 + 4 * i); // source, for the MASQ key
        a.stx(W, R10, -40 + 4 * i, R5);
    }
    a.ld_map(R1, maps.node6);
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, -16);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JEQ, R0, 0, to.other);
    a.mov_k(R7, 6);

    // For this node: only the ports kxdp serves (NodePorts) go to the dataplane.
    a.label("node");
    a.jmp_k(JEQ, R8, 6, "node_ports");
    a.jmp_k(JEQ, R8, 17, "node_ports");
    a.jmp_k(JEQ, R8, 132, "node_ports");
    a.ja(to.kernel);
    a.label("node_ports");
    a.ldx(W, R2, R6, at.data);
    a.ldx(W, R3, R6, at.data_end);
    // r2 = data + r9 (the L4 offset: 14 + 4 * IHL, or 54), one constant addition per possible
    // offset: adding a register to a packet pointer needs CAP_PERFMON (the verifier's Spectre
    // v1 sanitation knows no limit for packet pointers: "pointer arithmetic with it prohibited
    // for !root"), which the DaemonSet does not grant. An IHL below 5 goes to the kernel.
    for (off, l) in L4_OFFSETS {
        a.jmp_k(JEQ, R9, off, l);
    }
    a.ja(to.kernel);
    for (off, l) in L4_OFFSETS {
        a.label(l);
        a.alu_k(ADD, R2, off);
        if off != L4_OFFSETS[L4_OFFSETS.len() - 1].0 {
            a.ja("l4");
        }
    }
    a.label("l4");
    a.mov_x(R4, R2);
    a.alu_k(ADD, R4, 4);
    a.jmp_x(JGT, R4, R3, to.short);
    // MASQ key at fp-48: proto, 0, sport, dport (network order), 0, 0, source address.
    a.ldx(H, R5, R2, 0);
    a.stx(H, R10, -46, R5);
    a.ldx(H, R9, R2, 2); // destination port
    a.stx(H, R10, -44, R9);
    a.be16(R9);
    a.stx(B, R10, -48, R8);
    a.mov_k(R5, 0);
    a.stx(B, R10, -47, R5);
    a.stx(H, R10, -42, R5);
    a.ld_map(R1, maps.masq4);
    a.jmp_k(JEQ, R7, 4, "masq_lookup");
    a.ld_map(R1, maps.masq6);
    a.label("masq_lookup");
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, -48);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JNE, R0, 0, to.dataplane);
    a.mov_x(R5, R9);
    a.alu_k(RSH, R5, 5);
    a.stx(W, R10, -20, R5);
    a.ld_map(R1, maps.ports);
    a.mov_x(R2, R10);
    a.alu_k(ADD, R2, -20);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jmp_k(JEQ, R0, 0, to.kernel);
    a.ldx(W, R0, R0, 0);
    a.alu_k(AND, R9, 31);
    a.alu_x(RSH, R0, R9);
    a.alu_k(AND, R0, 1);
    a.jmp_k(JEQ, R0, 0, to.kernel);
    a.ja(to.dataplane);
}

/// The maps the programs of all interfaces share.
#[derive(Debug)]
pub struct SharedMaps {
    /// IPv4 node addresses (4-byte keys, network order).
    pub node4: Map,
    /// IPv6 node addresses (16-byte keys).
    pub node6: Map,
    /// Destination ports at node addresses that go to the dataplane (65536-bit bitmap).
    pub ports: Map,
    /// Replies of masqueraded connections: [proto, 0, sport, dport, 0, 0] + IPv4 source.
    pub masq4: Map,
    /// The same with an IPv6 source.
    pub masq6: Map,
    /// One u64: until when (CLOCK_MONOTONIC ns) a packet meant for a missing AF_XDP socket is
    /// dropped rather than passed to the kernel (a restart of kxdp; see `program`).
    pub hold: Map,
    node_addrs: std::sync::Mutex<Vec<std::net::IpAddr>>,
}

impl SharedMaps {
    pub fn create() -> io::Result<SharedMaps> {
        Ok(SharedMaps {
            node4: Map::create(BPF_MAP_TYPE_HASH, 4, 4, MAX_NODE_ADDRS)?,
            node6: Map::create(BPF_MAP_TYPE_HASH, 16, 4, MAX_NODE_ADDRS)?,
            ports: Map::create(BPF_MAP_TYPE_ARRAY, 4, 4, PORT_WORDS)?,
            masq4: Map::create(BPF_MAP_TYPE_LRU_HASH, 12, 4, MASQ_ENTRIES)?,
            masq6: Map::create(BPF_MAP_TYPE_LRU_HASH, 24, 4, MASQ_ENTRIES)?,
            hold: Map::create(BPF_MAP_TYPE_ARRAY, 4, 8, 1)?,
            node_addrs: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The six maps' descriptors in a fixed order (for a takeover; [`SharedMaps::from_fds`]).
    pub fn fds(&self) -> [BorrowedFd<'_>; 6] {
        [
            self.node4.fd_borrowed(),
            self.node6.fd_borrowed(),
            self.ports.fd_borrowed(),
            self.masq4.fd_borrowed(),
            self.masq6.fd_borrowed(),
            self.hold.fd_borrowed(),
        ]
    }

    /// The maps a predecessor created, in the order of [`SharedMaps::fds`]; `node_addrs` are
    /// the addresses it last set (so that the next `set_node` removes those that went away).
    pub fn from_fds(fds: [OwnedFd; 6], node_addrs: Vec<std::net::IpAddr>) -> SharedMaps {
        let [node4, node6, ports, masq4, masq6, hold] = fds;
        SharedMaps {
            node4: Map::from_fd(node4, 4, 4),
            node6: Map::from_fd(node6, 16, 4),
            ports: Map::from_fd(ports, 4, 4),
            masq4: Map::from_fd(masq4, 12, 4),
            masq6: Map::from_fd(masq6, 24, 4),
            hold: Map::from_fd(hold, 4, 8),
            node_addrs: std::sync::Mutex::new(node_addrs),
        }
    }

    /// The descriptors [`steer`] reads.
    pub fn steer_maps(&self) -> SteerMaps {
        SteerMaps {
            node4: self.node4.fd(),
            node6: self.node6.fd(),
            ports: self.ports.fd(),
            masq4: self.masq4.fd(),
            masq6: self.masq6.fd(),
        }
    }

    /// The node addresses last set.
    pub fn node_addrs(&self) -> Vec<std::net::IpAddr> {
        self.node_addrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sets the node addresses and NodePorts (replacing what was there).
    pub fn set_node(&self, addrs: &[std::net::IpAddr], ports: &[u16]) -> io::Result<()> {
        let mut old = self.node_addrs.lock().unwrap_or_else(|e| e.into_inner());
        for a in old.iter().filter(|a| !addrs.contains(a)) {
            let _ = match a {
                std::net::IpAddr::V4(v4) => self.node4.delete(&v4.octets()),
                std::net::IpAddr::V6(v6) => self.node6.delete(&v6.octets()),
            };
        }
        for a in addrs {
            match a {
                std::net::IpAddr::V4(v4) => self.node4.update(&v4.octets(), &1u32.to_ne_bytes())?,
                std::net::IpAddr::V6(v6) => self.node6.update(&v6.octets(), &1u32.to_ne_bytes())?,
            }
        }
        *old = addrs.to_vec();
        let mut words = vec![0u32; PORT_WORDS as usize];
        for &p in ports {
            words[p as usize >> 5] |= 1 << (p & 31);
        }
        for (i, w) in words.iter().enumerate() {
            self.ports
                .update(&(i as u32).to_ne_bytes(), &w.to_ne_bytes())?;
        }
        Ok(())
    }

    /// Packets meant for kxdp while it has no socket (a restart) are dropped until
    /// `monotonic_ns` (CLOCK_MONOTONIC, as the program's `bpf_ktime_get_ns`), then passed to the
    /// kernel. A running kxdp keeps moving this ahead; the program, attached so that it outlives
    /// the process (`XdpProgram::attach_held`), holds the traffic for the next one.
    pub fn hold_until(&self, monotonic_ns: u64) -> io::Result<()> {
        self.hold
            .update(&0u32.to_ne_bytes(), &monotonic_ns.to_ne_bytes())
    }

    /// Records the reply of a masqueraded connection: `proto` from `remote`:`remote_port` to a
    /// node address on `node_port`.
    pub fn add_masq_reply(
        &self,
        proto: kxdp_packet::IpProto,
        remote: &kxdp_packet::Addr,
        family: kxdp_packet::Family,
        remote_port: u16,
        node_port: u16,
    ) -> io::Result<()> {
        let mut key = [0u8; 24];
        key[0] = proto.0;
        key[2..4].copy_from_slice(&remote_port.to_be_bytes());
        key[4..6].copy_from_slice(&node_port.to_be_bytes());
        match family {
            kxdp_packet::Family::V4 => {
                key[8..12].copy_from_slice(&remote.v4_octets());
                self.masq4.update(&key[..12], &1u32.to_ne_bytes())
            }
            kxdp_packet::Family::V6 => {
                key[8..24].copy_from_slice(&remote.0);
                self.masq6.update(&key, &1u32.to_ne_bytes())
            }
        }
    }
}

/// The loaded program and its maps (not yet attached anywhere).
#[derive(Debug)]
pub struct XdpProgram {
    prog: OwnedFd,
    /// Queue index → AF_XDP socket.
    pub xsks: Map,
    pub maps: std::sync::Arc<SharedMaps>,
    pub insn_count: usize,
}

impl XdpProgram {
    /// Creates the maps and loads the program; `queues` is the XSKMAP's size.
    pub fn load(queues: u32) -> io::Result<XdpProgram> {
        XdpProgram::load_with(queues, std::sync::Arc::new(SharedMaps::create()?), None)
    }

    /// Loads a program that uses `maps` (shared with other interfaces' programs); with
    /// `fast_path`, the flows installed there go to the kernel (the interface's ingress must
    /// have the tc fast path over the same maps: `crate::tc::redirect_ingress`).
    pub fn load_with(
        queues: u32,
        maps: std::sync::Arc<SharedMaps>,
        fast_path: Option<crate::offload::OffloadMaps>,
    ) -> io::Result<XdpProgram> {
        let xsks = Map::create(BPF_MAP_TYPE_XSKMAP, 4, 4, queues.max(1))?;
        let insns = program(ProgramMaps {
            xsks: xsks.fd(),
            steer: maps.steer_maps(),
            hold: maps.hold.fd(),
            fast_path: fast_path.map(|m| m.flows),
        });
        let prog = load_program(BPF_PROG_TYPE_XDP, BPF_XDP, &insns, "the XDP program")?;
        Ok(XdpProgram {
            prog,
            xsks,
            maps,
            insn_count: insns.len(),
        })
    }

    pub fn fd(&self) -> i32 {
        self.prog.as_raw_fd()
    }

    /// The program's descriptor (for a takeover).
    pub fn fd_borrowed(&self) -> BorrowedFd<'_> {
        self.prog.as_fd()
    }

    /// A program a predecessor loaded (received in a takeover): its descriptor, its XSKMAP
    /// and the shared maps it uses.
    pub fn from_fds(
        prog: OwnedFd,
        xsks: OwnedFd,
        maps: std::sync::Arc<SharedMaps>,
        insn_count: usize,
    ) -> XdpProgram {
        XdpProgram {
            prog,
            xsks: Map::from_fd(xsks, 4, 4),
            maps,
            insn_count,
        }
    }

    /// Sets the node addresses and NodePorts (see `SharedMaps::set_node`).
    pub fn set_node(&self, addrs: &[std::net::IpAddr], ports: &[u16]) -> io::Result<()> {
        self.maps.set_node(addrs, ports)
    }

    /// Registers the AF_XDP socket `xsk_fd` for `queue`.
    pub fn set_socket(&self, queue: u32, xsk_fd: i32) -> io::Result<()> {
        self.xsks
            .update(&queue.to_ne_bytes(), &(xsk_fd as u32).to_ne_bytes())
    }

    /// Attaches to `ifindex` (see the module comment for modes and stale programs).
    pub fn attach(&self, ifindex: u32, choice: ModeChoice) -> io::Result<Attachment> {
        let modes: &[XdpMode] = match choice {
            ModeChoice::Auto => &[XdpMode::Native, XdpMode::Generic],
            ModeChoice::Native => &[XdpMode::Native],
            ModeChoice::Generic => &[XdpMode::Generic],
        };
        let mut replaced_stale = false;
        let mut last: Option<io::Error> = None;
        let mut tried = Vec::new();
        for &mode in modes {
            match self.link_create(ifindex, mode) {
                Ok(link) => {
                    return Ok(Attachment {
                        _link: Some(link),
                        detach_on_drop: false,
                        ifindex,
                        mode,
                        replaced_stale,
                    })
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !replaced_stale => {
                    // A program attached through netlink (not a link of a live process).
                    detach_netlink(ifindex)?;
                    replaced_stale = true;
                    match self.link_create(ifindex, mode) {
                        Ok(link) => {
                            return Ok(Attachment {
                                _link: Some(link),
                                detach_on_drop: false,
                                ifindex,
                                mode,
                                replaced_stale,
                            })
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(e) => last = Some(e),
            }
            if let Some(e) = &last {
                tried.push(format!("{}: {e}", mode.as_str()));
            }
        }
        let e = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::Unsupported));
        Err(io::Error::new(
            e.kind(),
            format!("attaching XDP to ifindex {ifindex}: {}", tried.join("; ")),
        ))
    }

    /// Attaches through netlink rather than a link, replacing in one step a program a previous
    /// kxdp left (held) on the interface: the program then outlives this process unless the
    /// attachment is dropped, so a restart (SIGTERM with `leave_attached`, SIGKILL, a crash)
    /// leaves the interface's traffic held rather than handed to the kernel (`program`). Native
    /// mode first, then generic, as `attach`. A BPF link on the interface (another running
    /// kxdp) makes it fail with EBUSY.
    pub fn attach_held(&self, ifindex: u32, choice: ModeChoice) -> io::Result<Attachment> {
        let modes: &[XdpMode] = match choice {
            ModeChoice::Auto => &[XdpMode::Native, XdpMode::Generic],
            ModeChoice::Native => &[XdpMode::Native],
            ModeChoice::Generic => &[XdpMode::Generic],
        };
        let mut replaced_stale = false;
        let mut tried = Vec::new();
        let mut last = None;
        for &mode in modes {
            let flags = match mode {
                XdpMode::Native => XDP_FLAGS_DRV_MODE,
                XdpMode::Generic => XDP_FLAGS_SKB_MODE,
            };
            let mut r = set_link_xdp(ifindex, self.fd(), flags);
            if r.is_err() && !replaced_stale {
                // A program in the other mode (the kernel runs one mode at a time): remove it.
                if detach_netlink(ifindex).is_ok() {
                    replaced_stale = true;
                    r = set_link_xdp(ifindex, self.fd(), flags);
                }
            }
            match r {
                Ok(()) => {
                    return Ok(Attachment {
                        _link: None,
                        detach_on_drop: true,
                        ifindex,
                        mode,
                        replaced_stale,
                    })
                }
                Err(e) => {
                    tried.push(format!("{}: {e}", mode.as_str()));
                    last = Some(e);
                }
            }
        }
        let e = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::Unsupported));
        Err(io::Error::new(
            e.kind(),
            format!("attaching XDP to ifindex {ifindex}: {}", tried.join("; ")),
        ))
    }

    fn link_create(&self, ifindex: u32, mode: XdpMode) -> io::Result<OwnedFd> {
        let flags = match mode {
            XdpMode::Native => XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
        };
        let mut attr = [0u64; 16];
        attr[0] = pair(self.fd() as u32, ifindex);
        attr[1] = pair(BPF_XDP, flags);
        fd_result(sys_bpf(BPF_LINK_CREATE, &mut attr))
    }

    /// Attaches through netlink instead of a link: the program then outlives this process.
    /// Only for tests that need a stale program to replace.
    pub fn attach_netlink_for_test(&self, ifindex: u32, mode: XdpMode) -> io::Result<()> {
        let flags = XDP_FLAGS_UPDATE_IF_NOEXIST
            | match mode {
                XdpMode::Native => XDP_FLAGS_DRV_MODE,
                XdpMode::Generic => XDP_FLAGS_SKB_MODE,
            };
        set_link_xdp(ifindex, self.fd(), flags)
    }
}

/// The program attached to one interface. Dropping it detaches the program; so does the process
/// ending in any way for a BPF link (`attach`). A program attached with `attach_held` stays when
/// the process ends without dropping it (a crash, SIGKILL) or after `leave_attached` (a restart),
/// holding the traffic for the next kxdp (`SharedMaps::hold_until`).
#[derive(Debug)]
pub struct Attachment {
    /// The BPF link (`attach`); None when attached through netlink (`attach_held`).
    _link: Option<OwnedFd>,
    /// Netlink-attached and still to be detached on drop.
    detach_on_drop: bool,
    pub ifindex: u32,
    pub mode: XdpMode,
    /// A program attached by someone else was removed first.
    pub replaced_stale: bool,
}

impl Attachment {
    /// Leaves a program attached with `attach_held` in place when this process goes (it keeps
    /// holding the interface's traffic for the next kxdp, which replaces it). A link-attached
    /// program goes with the process anyway.
    pub fn leave_attached(mut self) {
        self.detach_on_drop = false;
    }

    /// The BPF link's descriptor, if attached through one (for a takeover: the successor's copy
    /// keeps the program attached after this process exits). A held (netlink) attachment has
    /// none: the program stays attached by itself.
    pub fn fd_borrowed(&self) -> Option<BorrowedFd<'_>> {
        self._link.as_ref().map(|l| l.as_fd())
    }

    /// An attachment a predecessor made (received in a takeover): through a BPF link when
    /// `link` is given, else held through netlink (`attach_held`), which this process now owns.
    pub fn from_fd(link: Option<OwnedFd>, ifindex: u32, mode: XdpMode) -> Attachment {
        Attachment {
            detach_on_drop: link.is_none(),
            _link: link,
            ifindex,
            mode,
            replaced_stale: false,
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        if self.detach_on_drop {
            let flags = match self.mode {
                XdpMode::Native => XDP_FLAGS_DRV_MODE,
                XdpMode::Generic => XDP_FLAGS_SKB_MODE,
            };
            let _ = set_link_xdp(self.ifindex, -1, flags);
        }
    }
}

/// Removes a netlink-attached XDP program from `ifindex` in both modes.
pub fn detach_netlink(ifindex: u32) -> io::Result<()> {
    let mut last = Ok(());
    for flags in [XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE] {
        if let Err(e) = set_link_xdp(ifindex, -1, flags) {
            last = Err(e);
        }
    }
    // Removing from the mode nothing is attached in fails harmlessly; only report when both did.
    match last {
        Err(e) if e.raw_os_error() != Some(libc::EBUSY) => Ok(()),
        other => other,
    }
}

/// RTM_SETLINK with IFLA_XDP { IFLA_XDP_FD = fd, IFLA_XDP_FLAGS = flags }.
fn set_link_xdp(ifindex: u32, fd: i32, flags: u32) -> io::Result<()> {
    crate::netlink::set_link_xdp(ifindex, fd, flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_is_small_and_jumps_stay_inside() {
        let insns = program(ProgramMaps {
            xsks: 3,
            steer: SteerMaps {
                node4: 4,
                node6: 5,
                ports: 6,
                masq4: 7,
                masq6: 8,
            },
            hold: 9,
            fast_path: None,
        });
        eprintln!("XDP program: {} instructions", insns.len());
        // About 30 of them are the constant additions of the L4 offsets (`L4_OFFSETS`).
        assert!(insns.len() < 200);
        for (i, ins) in insns.iter().enumerate() {
            let class = ins.code & 0x07;
            let op = ins.code & 0xf0;
            if class == 0x05 && op != 0x80 && op != 0x90 {
                let t = i as i64 + 1 + ins.off as i64;
                assert!(t >= 0 && (t as usize) < insns.len(), "jump at {i} to {t}");
            }
        }
        assert_eq!(insns.last().unwrap().code, 0x95, "ends with exit");
    }

    /// Runs `prog` once over `frame` as if it arrived on `ingress` (`BPF_PROG_TEST_RUN`):
    /// its verdict.
    fn verdict(prog: &XdpProgram, frame: &[u8], ingress: u32) -> u32 {
        let mut out = vec![0u8; frame.len() + 512];
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        let ctx: [u32; 6] = [0, frame.len() as u32, 0, ingress, 0, 0];
        let mut attr = [0u64; 16];
        attr[0] = pair(prog.fd() as u32, 0);
        attr[1] = pair(frame.len() as u32, out.len() as u32);
        attr[2] = frame.as_ptr() as u64;
        attr[3] = out.as_mut_ptr() as u64;
        attr[4] = pair(1, 0);
        attr[5] = pair(std::mem::size_of_val(&ctx) as u32, 0);
        attr[6] = ctx.as_ptr() as u64;
        let r = sys_bpf(crate::bpf::BPF_PROG_TEST_RUN, &mut attr);
        assert!(r >= 0, "test run: {}", io::Error::last_os_error());
        let b = attr[0].to_ne_bytes();
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]])
    }

    /// Needs root. A flow on the in-kernel fast path and bound to the interface goes to the
    /// kernel (its GRO and the tc fast path); its SYN, its RST, the same flow from another
    /// interface and a flow not installed go the dataplane's way (dropped here: no socket, and
    /// a hold deadline ahead).
    #[test]
    fn a_flow_on_the_fast_path_goes_to_the_kernel() {
        crate::sys::testing::in_private_netns(|| {
            let Ok(fast) = crate::offload::FlowOffload::new(4096) else {
                eprintln!("SKIPPED: no BPF maps here");
                return;
            };
            let maps = std::sync::Arc::new(SharedMaps::create().unwrap());
            maps.hold_until(u64::MAX).unwrap();
            let prog = XdpProgram::load_with(1, maps, Some(fast.maps())).unwrap();
            let lo = 1;
            let (key, rewrite) = crate::tc::tests::sample_flow(lo);
            let mac = [0x02, 0, 0, 0, 0, 0x0b];
            let frame = |dst, flags| crate::tc::tests::tcp_frame(mac, dst, 80, flags);
            let service = [172, 30, 0, 10];
            assert_eq!(verdict(&prog, &frame(service, 0x10), lo), XDP_DROP as u32);
            fast.install(&key, &rewrite).unwrap();
            for flags in [0x10, 0x12, 0x11, 0x18] {
                let got = verdict(&prog, &frame(service, flags), lo);
                assert_eq!(got, XDP_PASS as u32, "flags {flags:#x}");
            }
            for flags in [0x02, 0x04, 0x14] {
                let got = verdict(&prog, &frame(service, flags), lo);
                assert_eq!(got, XDP_DROP as u32, "flags {flags:#x}");
            }
            let other = frame([172, 30, 0, 11], 0x10);
            assert_eq!(verdict(&prog, &other, lo), XDP_DROP as u32);
            fast.install(
                &key,
                &crate::offload::FlowRewrite {
                    ingress: 7,
                    ..rewrite
                },
            )
            .unwrap();
            assert_eq!(verdict(&prog, &frame(service, 0x10), lo), XDP_DROP as u32);
            // Nothing counted here: the tc program counts what it carries.
            assert_eq!(fast.counts(3), (0, 0));
        });
    }
}
