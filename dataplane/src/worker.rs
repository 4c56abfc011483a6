//! The AF_XDP worker: one pinned thread that polls its sockets, pushes every received batch
//! through the same [`Pipeline`] `kxdp replay` uses, and sends each packet on toward its new
//! destination with the right MAC addresses.
//!
//! Per batch: receive up to `BATCH` frames from one socket; load the current tables (an
//! `ArcSwap` guard, picked up between batches); `Pipeline::process` in place in the UMEM; then
//! per packet by verdict:
//!
//! - forward / reject (the reply built in place): look the destination up in the route table;
//!   set the next hop's MAC as destination and the egress interface's MAC as source; complete
//!   the L4 checksum when the frame came from a virtual interface (veth hands over TCP/UDP with
//!   a partial checksum, see `docs/afxdp.md`); queue it for the egress socket. No route, an
//!   unowned egress interface or an unresolved neighbour: dropped and counted (the neighbour is
//!   queued for resolution).
//! - drop, pass: the frame goes back to the free list. (Pass never reaches the worker in
//!   practice: the XDP program hands the node's own traffic to the kernel before it does; a
//!   user-space AF_XDP socket cannot hand a frame to the kernel stack.)
//!
//! Then one TX ring submission and kick per egress socket, completions back to the free list,
//! the fill rings topped up. No allocation, lock or syscall per packet: the syscalls are the TX
//! kicks (one per socket per batch, only when the kernel asks), the idle back-off's sleeps, and
//! one `bpf()` map update per new masqueraded connection (its reply, see `io::xdp`).
//!
//! Idle back-off: after an empty poll of all sockets the worker spins `spin_polls` polls, then
//! sleeps, doubling from `min_sleep_us` up to `max_sleep_us`; any received frame resets it. Busy
//! polling costs a full core while idle and gives the lowest latency; each sleep step adds up to
//! its duration to the first packet's latency after a quiet period (at most `max_sleep_us`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use kxdp_packet::{checksum, parse_into, Family, LinkType, PacketMeta};

use crate::conntrack::Conntrack;
use crate::io::afxdp::{Desc, Umem, UmemBatch, XskConfig, XskSocket};
use crate::io::route::{Miss, RouteTable};
use crate::pipeline::Pipeline;
use crate::snapshot::Snapshot;
use crate::stats::{clock_ms, DataplaneStats};
use crate::verdict::{Action, Reason, Verdict};

/// Frames per RX batch.
pub const BATCH: usize = 64;

/// Where a worker gets the current tables.
pub trait Tables: Send + Sync {
    fn current(&self) -> Guard<Arc<Snapshot>>;
}

impl Tables for ArcSwap<Snapshot> {
    fn current(&self) -> Guard<Arc<Snapshot>> {
        self.load()
    }
}

/// The idle back-off (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub spin_polls: u32,
    pub min_sleep_us: u32,
    pub max_sleep_us: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            spin_polls: 2000,
            min_sleep_us: 10,
            max_sleep_us: 1000,
        }
    }
}

/// I/O counters of one worker (the pipeline's own counters go to `DataplaneStats`).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct IoCounters {
    pub rx: AtomicU64,
    pub tx: AtomicU64,
    pub dropped: AtomicU64,
    /// Verdict `pass` seen by the worker (dropped: it cannot be handed to the kernel).
    pub pass_dropped: AtomicU64,
    pub no_route: AtomicU64,
    pub no_neighbour: AtomicU64,
    /// The route leaves through an interface kxdp has no socket on.
    pub no_egress: AtomicU64,
    pub tx_ring_full: AtomicU64,
    pub checksums_completed: AtomicU64,
    /// Forwarded packets whose TTL / hop limit ran out here (dropped, as a router does).
    pub ttl_expired: AtomicU64,
    /// New masqueraded connections whose reply could not be registered with the XDP program.
    pub masq_map_errors: AtomicU64,
    pub idle_sleeps: AtomicU64,
    pub batches: AtomicU64,
}

/// One (interface, queue) a worker polls and sends on.
pub struct Port {
    pub sock: XskSocket,
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// Complete TCP/UDP checksums of frames received here (virtual interfaces: veth).
    pub complete_checksums: bool,
}

/// Everything a worker thread owns.
pub struct Worker {
    pub index: usize,
    pub cpu: Option<usize>,
    pub umem: Umem,
    pub ports: Vec<Port>,
    pub backoff: Backoff,
    pub counters: Arc<IoCounters>,
}

/// Shared state a worker runs against.
#[derive(Clone)]
pub struct Shared {
    pub tables: Arc<dyn Tables>,
    pub ct: Arc<Conntrack>,
    pub stats: Option<Arc<DataplaneStats>>,
    pub routes: Arc<ArcSwap<RouteTable>>,
    pub unresolved: crossbeam::channel::Sender<(u32, kxdp_packet::Addr, Family)>,
    /// Where replies of new masqueraded connections are registered for the XDP program.
    pub masq: Option<Arc<crate::io::xdp::SharedMaps>>,
    pub stop: Arc<AtomicBool>,
}

impl Worker {
    /// Creates the worker's UMEM and opens one socket per (ifindex, queue, mac, complete
    /// checksums); the caller registers each socket's fd in its interface's XSKMAP.
    pub fn open(
        index: usize,
        cpu: Option<usize>,
        ports: &[(u32, u32, [u8; 6], bool)],
        cfg: &XskConfig,
        backoff: Backoff,
    ) -> std::io::Result<Worker> {
        let mut umem = Umem::new(cfg)?;
        let mut opened: Vec<Port> = Vec::new();
        for &(ifindex, queue, mac, complete_checksums) in ports {
            let sock = XskSocket::open(
                &mut umem,
                opened.first().map(|p| &p.sock),
                ifindex,
                queue,
                cfg,
            )?;
            opened.push(Port {
                sock,
                ifindex,
                mac,
                complete_checksums,
            });
        }
        Ok(Worker {
            index,
            cpu,
            umem,
            ports: opened,
            backoff,
            counters: Arc::new(IoCounters::default()),
        })
    }

    pub fn spawn(self, shared: Shared) -> std::io::Result<std::thread::JoinHandle<Worker>> {
        std::thread::Builder::new()
            .name(format!("kxdp-worker-{}", self.index))
            .spawn(move || {
                let mut w = self;
                if let Some(cpu) = w.cpu {
                    pin(cpu);
                }
                w.run(&shared);
                w
            })
    }

    /// The poll loop; returns when `shared.stop` is set.
    pub fn run(&mut self, shared: &Shared) {
        let mut pipeline = Pipeline::new(
            self.index,
            LinkType::Ethernet,
            0x6b78_6470 ^ self.index as u64,
            &shared.ct,
        );
        let mut descs = [Desc::default(); BATCH];
        let mut verdicts = [Verdict::default(); BATCH];
        let nports = self.ports.len();
        // Per egress port: frames queued in this batch. Fixed capacity, allocated once.
        let mut out: Vec<Vec<Desc>> = (0..nports).map(|_| Vec::with_capacity(BATCH)).collect();
        let mut meta = PacketMeta::default();
        let mut idle_polls = 0u32;
        let mut sleep_us = self.backoff.min_sleep_us;
        let c = self.counters.clone();
        while !shared.stop.load(Ordering::Relaxed) {
            let mut got = 0;
            for p in 0..nports {
                let n = self.ports[p].sock.receive(&mut self.umem, &mut descs);
                if n == 0 {
                    continue;
                }
                got += n;
                let t0 = Instant::now();
                let snap = shared.tables.current();
                let now = clock_ms();
                {
                    let mut batch = UmemBatch {
                        umem: &mut self.umem,
                        descs: &mut descs[..n],
                    };
                    pipeline.process(&mut batch, &mut verdicts, &snap, &shared.ct, now);
                }
                let routes = shared.routes.load();
                let complete = self.ports[p].complete_checksums;
                for i in 0..n {
                    let v = &verdicts[i];
                    let d = descs[i];
                    // A new masqueraded connection: its replies come to a node address on a
                    // port the kernel could own; tell the XDP program before the packet leaves.
                    if v.masq && v.reason == Reason::ServiceDnat {
                        if let Some(m) = &shared.masq {
                            if m.add_masq_reply(v.proto, &v.dst, v.family, v.dport, v.sport)
                                .is_err()
                            {
                                c.masq_map_errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    match v.action {
                        Action::Forward | Action::Reject if v.has_addrs => {
                            match routes.lookup(&v.dst, v.family) {
                                Ok(nh) => {
                                    let Some(e) =
                                        self.ports.iter().position(|q| q.ifindex == nh.oif)
                                    else {
                                        c.no_egress.fetch_add(1, Ordering::Relaxed);
                                        self.umem.recycle(d.addr);
                                        continue;
                                    };
                                    let f = self.umem.frame_mut(d.addr);
                                    // kxdp routes what it forwards: TTL / hop limit go down by
                                    // one (replies it generates start fresh).
                                    if v.action == Action::Forward
                                        && !kxdp_packet::decrement_ttl(
                                            &mut f[..d.len],
                                            LinkType::Ethernet,
                                        )
                                    {
                                        c.ttl_expired.fetch_add(1, Ordering::Relaxed);
                                        self.umem.recycle(d.addr);
                                        continue;
                                    }
                                    let f = self.umem.frame_mut(d.addr);
                                    f[..6].copy_from_slice(&nh.mac);
                                    f[6..12].copy_from_slice(&self.ports[e].mac);
                                    if complete
                                        && v.action == Action::Forward
                                        && complete_l4_checksum(&mut f[..d.len], &mut meta)
                                    {
                                        c.checksums_completed.fetch_add(1, Ordering::Relaxed);
                                    }
                                    out[e].push(d);
                                }
                                Err(miss) => {
                                    match miss {
                                        Miss::NoRoute => {
                                            c.no_route.fetch_add(1, Ordering::Relaxed);
                                        }
                                        Miss::NoNeighbour(oif, a) => {
                                            c.no_neighbour.fetch_add(1, Ordering::Relaxed);
                                            let _ = shared.unresolved.try_send((oif, a, v.family));
                                        }
                                    }
                                    self.umem.recycle(d.addr);
                                }
                            }
                        }
                        Action::Pass => {
                            c.pass_dropped.fetch_add(1, Ordering::Relaxed);
                            self.umem.recycle(d.addr);
                        }
                        _ => {
                            c.dropped.fetch_add(1, Ordering::Relaxed);
                            self.umem.recycle(d.addr);
                        }
                    }
                }
                for (e, q) in out.iter_mut().enumerate() {
                    if q.is_empty() {
                        continue;
                    }
                    let full = self.ports[e].sock.stats.tx_ring_full;
                    self.ports[e].sock.send(&mut self.umem, q);
                    let lost = self.ports[e].sock.stats.tx_ring_full - full;
                    c.tx.fetch_add(q.len() as u64 - lost, Ordering::Relaxed);
                    c.tx_ring_full.fetch_add(lost, Ordering::Relaxed);
                    self.ports[e].sock.flush_tx();
                    q.clear();
                }
                c.rx.fetch_add(n as u64, Ordering::Relaxed);
                c.batches.fetch_add(1, Ordering::Relaxed);
                if let Some(stats) = &shared.stats {
                    stats.after_batch(
                        self.index,
                        &pipeline.counters,
                        &verdicts[..n],
                        t0.elapsed().as_nanos() as u64,
                        now,
                    );
                }
            }
            // Completions and refills for every socket (frames sent on one socket may have
            // been received on another: the UMEM is shared).
            let share = (self.umem.free_frames() / nports.max(1)) as u32;
            for port in &mut self.ports {
                port.sock.complete(&mut self.umem);
                port.sock.flush_tx();
            }
            for port in &mut self.ports {
                port.sock.refill(&mut self.umem, share.max(BATCH as u32));
            }
            if got > 0 {
                idle_polls = 0;
                sleep_us = self.backoff.min_sleep_us;
            } else {
                idle_polls = idle_polls.saturating_add(1);
                if idle_polls > self.backoff.spin_polls {
                    c.idle_sleeps.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(sleep_us as u64));
                    sleep_us = (sleep_us * 2).min(self.backoff.max_sleep_us);
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Frames accounted for across the UMEM and the worker's sockets (equal to the frame count
    /// when none leaked).
    pub fn frames_accounted(&self) -> u64 {
        let socks: Vec<&XskSocket> = self.ports.iter().map(|p| &p.sock).collect();
        self.umem.frames_accounted(&socks)
    }
}

/// Recomputes the TCP/UDP checksum of a whole (unfragmented) packet. Returns whether it did.
pub fn complete_l4_checksum(frame: &mut [u8], meta: &mut PacketMeta) -> bool {
    if !matches!(parse_into(frame, LinkType::Ethernet, meta), Ok(true)) {
        return false;
    }
    if meta.l4_off == 0 || meta.frag.is_fragment {
        return false;
    }
    let (l4, end) = (
        meta.l4_off as usize,
        meta.l3_off as usize + meta.ip_len as usize,
    );
    let off = match meta.proto {
        6 => 16,
        17 => 6,
        _ => return false,
    };
    if end > frame.len() || l4 + off + 2 > end {
        return false;
    }
    frame[l4 + off..l4 + off + 2].copy_from_slice(&[0, 0]);
    let mut c = checksum::l4_checksum(
        &meta.src,
        &meta.dst,
        meta.family,
        meta.proto,
        &frame[l4..end],
    );
    if meta.proto == 17 && c == 0 {
        c = 0xffff;
    }
    frame[l4 + off..l4 + off + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it; sched_setaffinity(0, ..)
    // affects only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame as a veth with TX checksum offload hands it over: the L4 checksum field holds
    /// only the pseudo-header sum. Completing it gives what a full computation gives.
    #[test]
    fn partial_checksums_are_completed() {
        for tcp in [false, true] {
            let b = etherparse::PacketBuilder::ethernet2([1; 6], [2; 6]).ipv4(
                [10, 1, 0, 13],
                [10, 1, 0, 11],
                64,
            );
            let mut frame = Vec::new();
            if tcp {
                b.tcp(40000, 8080, 1, 1000)
                    .syn()
                    .write(&mut frame, b"payload")
                    .unwrap();
            } else {
                b.udp(40000, 5353).write(&mut frame, b"payload").unwrap();
            }
            let good = frame.clone();
            let mut meta = PacketMeta::default();
            let off = 14 + 20 + if tcp { 16 } else { 6 };
            frame[off..off + 2].copy_from_slice(&[0x12, 0x34]); // partial / stale
            assert!(complete_l4_checksum(&mut frame, &mut meta));
            assert_eq!(frame, good, "tcp={tcp}");
            assert!(checksum::verify(&frame, &meta).is_ok());
        }
    }
}
