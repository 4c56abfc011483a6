//! The AF_XDP worker: one pinned thread that polls its sockets, pushes every received batch
//! through the same [`Pipeline`] `kxdp replay` uses, and sends each packet on toward its new
//! destination with the right MAC addresses.
//!
//! Per batch: receive up to `BATCH` frames from one socket; load the current tables (an
//! `ArcSwap` guard, picked up between batches); `Pipeline::decide` in place in the UMEM; then
//! the egress stage (`crate::egress`: FIB lookup, TTL, MACs, checksum completion, the kernel
//! port) decides each packet's port, and its drops become the verdicts' reasons. Frames to send
//! are queued per egress port; frames whose next hop has no neighbour yet are held until it
//! resolves (`crate::hold`; looked at again when a new FIB is published); the rest go back to
//! the free list. The batch's final verdicts are counted once, after the TX submission
//! (`Counters::record`).
//!
//! Then one TX ring submission and kick per egress socket, completions back to the free list,
//! the fill rings topped up. No allocation, lock or syscall per packet: the syscalls are the TX
//! kicks (one per socket per batch, only when the kernel asks), the idle back-off's yields and
//! sleeps, and one `bpf()` map update per new masqueraded connection (its reply, see
//! `kxdp_kernel::xdp`).
//!
//! Idle wait: after an empty poll of all sockets the worker spins `spin_polls` polls (each
//! yielding its CPU to whatever else is runnable there), then waits
//! on all its sockets at once (one `poll()` over their fds, `IDLE_WAIT_MS` at most) and
//! wakes as soon as any of them receives; the timeout only bounds how late it sees a command or
//! the stop flag (1 ms while a TX ring still holds frames the kernel has not taken). Without an
//! poll set (creating one failed) it sleeps instead, doubling from `min_sleep_us` up to
//! `max_sleep_us`.
//!
//! Sockets come and go while the worker runs: the runner sends [`PortCommand`]s on the worker's
//! channel, checked once per loop (`try_recv`, no syscall). A removed socket is closed and the
//! frames it held go back to the free list (`Umem::reclaim`). Each socket's fill ring is kept at
//! its share of the UMEM ([`fill_target`]) and topped up by what it consumed, so a worker with
//! many sockets never starves one of frames. A busy socket's share grows into three quarters of
//! the reserve kept for sockets still to come, and shrinks back once its backlog stays small
//! for a [`FILL_SHARE_WINDOW`] ([`next_fill_share`], [`shrunk_fill_share`], [`kept_reserve`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use kxdp_packet::{Family, LinkType};

use crate::clock::clock_ms;
use crate::conntrack::Conntrack;
use crate::egress::{Egress, EgressStats, HOLD, NOT_SENT};
use crate::fib::Fib;
use crate::fib::Miss;
use crate::hold::{self, Held, HoldQueue};
use crate::pipeline::{Counters, Pipeline};
use crate::snapshot::{PrefixSet, Snapshot};
use crate::stats::{DataplaneStats, SocketSample, FRAME_BYTES, SOCKET_STATS_PERIOD};
use crate::tap::TapPort;
use crate::verdict::{Reason, Verdict};
use kxdp_kernel::afxdp::{Desc, KernelXskStats, Umem, XskConfig, XskSocket};
use kxdp_kernel::sys::{Poller, Waker};

/// Frames per RX batch.
pub const BATCH: usize = 64;

/// The longest an idle worker waits on its sockets. A received frame, a command and the stop
/// flag wake it at once (the last two through its `Waker`); the timeout is only a safety net.
pub const IDLE_WAIT_MS: i32 = 250;

/// The longest an idle worker spins (polls its rings without a syscall) before it waits, however
/// many polls `Backoff::spin_polls` allows. A poll costs more the more sockets a worker has
/// (with 250 sockets, 2000 polls were milliseconds of spinning after every packet), and on a
/// shared CPU a worker that spins long loses its scheduling credit and is woken late next time
/// (docs/afxdp.md, "Idle wait"). A wake-up costs tens of microseconds, so spinning longer than
/// a few of them buys little.
pub const SPIN_LIMIT: Duration = Duration::from_micros(100);

/// The smallest fill-ring share of a socket, however many sockets a worker has.
pub const MIN_FILL: u32 = 16;

/// The sockets a worker's UMEM is planned for: each starts with `1/PLANNED_SOCKETS` of three
/// quarters of the frames. A quarter of the base shares of the sockets not yet open is never
/// lent ([`kept_reserve`]), so late sockets find theirs free even while busy sockets borrow the
/// rest (a fill ring cannot be emptied without closing its socket, so a borrower gives frames
/// back only as it receives: [`shrunk_fill_share`]).
pub const PLANNED_SOCKETS: u32 = 256;

/// How often a socket's share is compared with its backlog: a share four times larger than the
/// most the kernel took off it between two top-ups within a window is halved. Long enough that
/// a share does not shrink between the bursts it exists to absorb (a sender catching up, a
/// worker kept off its CPU), short enough that borrowed frames come back within seconds.
pub const FILL_SHARE_WINDOW: Duration = Duration::from_secs(1);

/// Changes to a running worker's sockets (see the module docs).
pub enum PortCommand {
    /// Open a socket on (ifindex, queue); the reply carries its fd (for the XSKMAP) and whether
    /// it is zero-copy.
    Add {
        ifindex: u32,
        queue: u32,
        mac: [u8; 6],
        complete_checksums: bool,
        /// The interface's XDP program hands the in-kernel fast path's flows to the kernel: the
        /// flows arriving here may go on it (`crate::offload`).
        fast_path: bool,
        reply: crossbeam::channel::Sender<std::io::Result<(i32, bool)>>,
    },
    /// Close every socket on `ifindex` and take back its frames.
    Remove {
        ifindex: u32,
        reply: crossbeam::channel::Sender<Removed>,
    },
}

/// What removing an interface's sockets gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub sockets: u32,
    /// Frames the sockets held by the worker's accounting.
    pub held: u32,
    /// Frames returned to the free list (equal to `held` when nothing leaked).
    pub reclaimed: u32,
    /// `Umem::frames_accounted` after the removal equals the frame count.
    pub balanced: bool,
}

/// Where a worker gets the current tables.
pub trait Tables: Send + Sync {
    fn current(&self) -> Guard<Arc<Snapshot>>;

    /// Waits until a generation other than `seen` is published, or `timeout` passes; returns
    /// the generation now. Publishers that can tell their subscribers (control's `Published`)
    /// override it; this default looks again after `timeout`.
    fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        let now = self.current().generation;
        if now == seen {
            std::thread::sleep(timeout);
            return self.current().generation;
        }
        now
    }
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

/// I/O counters of one worker. Packets the I/O drops are not here: they are verdicts with
/// their own reasons (`no-route`, `tx-ring-full`, ...), counted with the pipeline's.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct IoCounters {
    pub rx: AtomicU64,
    pub tx: AtomicU64,
    pub checksums_completed: AtomicU64,
    /// New masqueraded connections whose reply could not be registered with the XDP program.
    pub masq_map_errors: AtomicU64,
    pub idle_sleeps: AtomicU64,
    pub batches: AtomicU64,
    /// Frames read from the tap queue (`rx` counts the packets they stand for).
    pub tap_frames: AtomicU64,
}

/// Where a batch was received: what the egress stage and a held frame need of it.
#[derive(Clone, Copy)]
struct Ingress {
    ifindex: u32,
    partial_checksums: bool,
    from_kernel: bool,
}

/// A received batch after the egress stage: its frames, verdicts and hops.
struct Batch<'a> {
    descs: &'a [Desc],
    verdicts: &'a mut [Verdict],
    hops: &'a mut [u16],
}

/// Per egress port: the frames queued in a batch and their positions in it (fixed capacity,
/// allocated when the sockets change, never per packet).
struct TxQueues<'a> {
    out: &'a mut [Vec<Desc>],
    out_idx: &'a mut [Vec<u16>],
}

/// One (interface, queue) a worker polls and sends on.
pub struct Port {
    pub sock: XskSocket,
    pub ifindex: u32,
    /// The interface's name when the socket was opened (for the socket's counters).
    pub name: String,
    pub mac: [u8; 6],
    /// Complete TCP/UDP checksums of frames received here (virtual interfaces: veth).
    pub complete_checksums: bool,
    /// The flows arriving here may go on the in-kernel fast path (`PortCommand::Add`).
    pub fast_path: bool,
    /// Frames this socket's fill ring is kept at: starts at the base share, is at least
    /// [`ACTIVE_FILL`] once the socket carries traffic, doubles (up to a ring) under pressure
    /// while frames beyond the kept reserve are free ([`next_fill_share`]), and halves when its
    /// backlog stayed under a quarter of it for a window ([`shrunk_fill_share`]).
    pub fill_target: u32,
    /// What the worker saw of the socket's demand since the last top-up and in this window.
    pub demand: FillDemand,
    /// The kernel's counters of the socket as last read (kept when a read fails).
    pub kernel: KernelXskStats,
}

impl Port {
    /// Frames the socket's fill ring lacks to reach its share.
    fn fill_deficit(&self) -> usize {
        self.fill_target
            .saturating_sub(self.sock.fill_outstanding()) as usize
    }
}

/// The name of interface `ifindex` (its number when it has none any more), for a new port.
pub fn port_name(ifindex: u32) -> String {
    kxdp_kernel::sys::ifname(ifindex).unwrap_or_else(|_| ifindex.to_string())
}

/// Everything a worker thread owns.
pub struct Worker {
    pub index: usize,
    pub cpu: Option<usize>,
    pub umem: Umem,
    pub ports: Vec<Port>,
    pub backoff: Backoff,
    pub counters: Arc<IoCounters>,
    /// The kernel port's ifindex (see `RunOptions::kernel_port`).
    pub kernel_port: Option<u32>,
    pub xsk: XskConfig,
    /// Socket changes from the runner (None: a fixed set).
    pub commands: Option<crossbeam::channel::Receiver<PortCommand>>,
    poller: Option<Poller>,
    /// Wakes the idle wait (in the poller with the sockets); see [`Worker::waker`].
    waker: Option<Arc<Waker>>,
    /// Frames waiting for their next hop's neighbour (`crate::hold`), in hand in the UMEM.
    held: HoldQueue<Desc>,
    /// The FIB the held frames were last looked up in (a new one may have their neighbours).
    held_fib: u64,
    /// Held frames taken out to be sent on (capacity `hold::CAPACITY`, never grown).
    releasing: Vec<Held<Desc>>,
    /// Verdicts of held frames dropped outside a batch (their socket removed), to be counted.
    discarded: Vec<Verdict>,
    /// This worker's queue of kxdp's tap (`podInterception: tap`, `crate::tap`).
    tap: Option<TapPort>,
}

/// Shared state a worker runs against.
#[derive(Clone)]
pub struct Shared {
    pub tables: Arc<dyn Tables>,
    pub ct: Arc<Conntrack>,
    pub stats: Option<Arc<DataplaneStats>>,
    pub routes: Arc<ArcSwap<Fib>>,
    pub unresolved: crossbeam::channel::Sender<(u32, kxdp_packet::Addr, Family)>,
    /// Where replies of new masqueraded connections are registered for the XDP program.
    pub masq: Option<Arc<kxdp_kernel::xdp::SharedMaps>>,
    /// Source validation on pod-facing interfaces (`crate::antispoof`).
    pub source_validation: crate::antispoof::SourceValidation,
    pub stop: Arc<AtomicBool>,
}

/// The poll set an idle worker waits in, and the eventfd in it that wakes the worker for
/// commands and stop. Without a waker the worker still sees commands, at the wait's timeout;
/// without a poll set it sleeps instead. (`poll()`, not epoll: see `kxdp_kernel::sys::Poller`.)
fn idle_wait(index: usize) -> (Option<Poller>, Option<Arc<Waker>>) {
    let mut poller = match Poller::new() {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("kxdp: worker {index}: no poll set ({e}); idle workers sleep instead");
            None
        }
    };
    let waker = poller
        .as_mut()
        .and_then(|p| Waker::new().and_then(|w| p.add(w.fd()).map(|_| w)).ok())
        .map(Arc::new);
    (poller, waker)
}

/// What [`Worker::run`] keeps from one loop to the next: the pipeline, a batch's buffers, the
/// per-port TX queues and the loop's clocks. Sized when the sockets change, never per packet.
struct RunState {
    pipeline: Pipeline,
    descs: [Desc; BATCH],
    verdicts: [Verdict; BATCH],
    /// The first bytes of each received packet, kept only while a `--hex` monitor listens (the
    /// pipeline rewrites frames in place; monitors show packets as received).
    received: [[u8; FRAME_BYTES]; BATCH],
    received_len: [usize; BATCH],
    hops: [u16; BATCH],
    /// Per egress port: frames queued in this batch and their batch positions (fixed
    /// capacity).
    out: Vec<Vec<Desc>>,
    out_idx: Vec<Vec<u16>>,
    egress: Egress,
    egress_stats: EgressStats,
    /// The base fill share and the frames kept for sockets still to come ([`kept_reserve`]).
    base: u32,
    kept: usize,
    /// The sockets changed since the per-port state was sized (true at the start).
    changed: bool,
    /// Frames still on TX rings after the last refill.
    tx_left: u32,
    /// When this loop's housekeeping ran.
    loop_at: Instant,
    share_window_end: Instant,
    socket_stats_due: Instant,
    idle: IdleState,
    spoof: SpoofState,
    /// The worker's I/O counters (its `counters`), held apart so that `transmit` can borrow
    /// the worker.
    io: Arc<IoCounters>,
}

/// The idle back-off's state (see the module docs).
struct IdleState {
    polls: u32,
    busy_at: Instant,
    sleep_us: u32,
}

/// Per port: whether its packets' sources are checked (`antispoof::checked`) and the port's
/// own sources, for the FIB and tables (`valid_for`) they were worked out from.
struct SpoofState {
    checked: Vec<bool>,
    own: Vec<Vec<(kxdp_packet::Addr, Family)>>,
    valid_for: (u64, u64),
}

/// The seed of a worker's random endpoint choice: random per process (std's `RandomState` keys
/// come from the OS), so that the n-th new connection does not get the same endpoint on every
/// node and after every restart. Replay keeps its fixed seeds (its runs are deterministic).
fn endpoint_choice_seed(worker: usize) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(worker)
}

impl RunState {
    fn new(w: &Worker, shared: &Shared) -> RunState {
        let now = Instant::now();
        RunState {
            pipeline: Pipeline::new(
                w.index,
                LinkType::Ethernet,
                endpoint_choice_seed(w.index),
                &shared.ct,
            ),
            descs: [Desc::default(); BATCH],
            verdicts: [Verdict::default(); BATCH],
            received: [[0u8; FRAME_BYTES]; BATCH],
            received_len: [0usize; BATCH],
            hops: [NOT_SENT; BATCH],
            out: Vec::new(),
            out_idx: Vec::new(),
            egress: Egress::new(&[], w.kernel_port).holding(true),
            egress_stats: EgressStats::default(),
            base: fill_target(&w.xsk, 0),
            kept: 0,
            changed: true,
            tx_left: 0,
            loop_at: now,
            share_window_end: now + FILL_SHARE_WINDOW,
            socket_stats_due: now,
            idle: IdleState {
                polls: 0,
                busy_at: now,
                sleep_us: w.backoff.min_sleep_us,
            },
            spoof: SpoofState {
                checked: Vec::new(),
                own: Vec::new(),
                valid_for: (u64::MAX, u64::MAX),
            },
            io: w.counters.clone(),
        }
    }

    /// Copies the first bytes of the batch's `n` frames as received, for a `--hex` monitor.
    fn keep_received(&mut self, umem: &Umem, n: usize) {
        for i in 0..n {
            let (d, f) = (self.descs[i], umem.frame(self.descs[i].addr));
            self.keep_frame(i, &f[..d.len.min(f.len())]);
        }
    }

    /// Copies the first bytes of `frame` as received into slot `at`, for a `--hex` monitor.
    fn keep_frame(&mut self, at: usize, frame: &[u8]) {
        let k = frame.len().min(FRAME_BYTES);
        self.received[at][..k].copy_from_slice(&frame[..k]);
        self.received_len[at] = k;
    }
}

/// The benchmark-only I/O floor (`benches/lab.sh`): which interfaces a worker sends every
/// received frame out of, unchanged.
#[cfg(feature = "bench-io-floor")]
mod io_floor {
    /// The interfaces named (comma separated) in `KXDP_BENCH_IO_FLOOR`, None when it is unset
    /// or names none.
    pub fn from_env() -> Option<Vec<u32>> {
        let ports: Vec<u32> = std::env::var("KXDP_BENCH_IO_FLOOR")
            .ok()?
            .split(',')
            .filter_map(|n| kxdp_kernel::sys::ifindex(n.trim()).ok())
            .collect();
        (!ports.is_empty()).then_some(ports)
    }
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
        kernel_port: Option<u32>,
    ) -> std::io::Result<Worker> {
        let umem = Umem::new(cfg)?;
        let idle = idle_wait(index);
        let mut w = Worker::assemble(
            index,
            cpu,
            umem,
            Vec::new(),
            cfg,
            backoff,
            kernel_port,
            idle,
        );
        let target = fill_target(cfg, 0);
        for &(ifindex, queue, mac, complete_checksums) in ports {
            w.add_port(ifindex, queue, mac, complete_checksums, false, target)?;
        }
        Ok(w)
    }

    /// A worker made of a predecessor's UMEM and sockets (a takeover): the ports keep their
    /// frames and fill shares; new sockets share the UMEM as usual.
    pub fn adopt(
        index: usize,
        cpu: Option<usize>,
        umem: Umem,
        ports: Vec<Port>,
        cfg: &XskConfig,
        backoff: Backoff,
        kernel_port: Option<u32>,
    ) -> std::io::Result<Worker> {
        let (mut poller, waker) = idle_wait(index);
        if let Some(p) = &mut poller {
            for port in &ports {
                p.add(port.sock.fd())?;
            }
        }
        Ok(Worker::assemble(
            index,
            cpu,
            umem,
            ports,
            cfg,
            backoff,
            kernel_port,
            (poller, waker),
        ))
    }

    /// The worker of `open` and `adopt`: its ports, UMEM and idle wait, nothing held yet.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        index: usize,
        cpu: Option<usize>,
        umem: Umem,
        ports: Vec<Port>,
        cfg: &XskConfig,
        backoff: Backoff,
        kernel_port: Option<u32>,
        (poller, waker): (Option<Poller>, Option<Arc<Waker>>),
    ) -> Worker {
        Worker {
            index,
            cpu,
            umem,
            ports,
            backoff,
            counters: Arc::new(IoCounters::default()),
            kernel_port,
            xsk: *cfg,
            commands: None,
            poller,
            waker,
            held: HoldQueue::default(),
            held_fib: 0,
            releasing: Vec::with_capacity(hold::CAPACITY),
            discarded: Vec::with_capacity(hold::CAPACITY),
            tap: None,
        }
    }

    fn add_port(
        &mut self,
        ifindex: u32,
        queue: u32,
        mac: [u8; 6],
        complete_checksums: bool,
        fast_path: bool,
        fill: u32,
    ) -> std::io::Result<(i32, bool)> {
        let cfg = XskConfig {
            fill_target: Some(fill),
            ..self.xsk
        };
        let sock = XskSocket::open(
            &mut self.umem,
            self.ports.first().map(|p| &p.sock),
            ifindex,
            queue,
            &cfg,
        )?;
        if let Some(p) = &mut self.poller {
            p.add(sock.fd())?;
        }
        let r = (sock.fd(), sock.zero_copy);
        let sock_held = sock.fill_outstanding();
        self.ports.push(Port {
            sock,
            ifindex,
            name: port_name(ifindex),
            mac,
            complete_checksums,
            fast_path,
            fill_target: fill,
            demand: FillDemand {
                topped: sock_held,
                ..FillDemand::default()
            },
            kernel: KernelXskStats::default(),
        });
        Ok(r)
    }

    /// Gives the worker its queue of kxdp's tap (before it starts): polled beside its sockets,
    /// and in the set its idle wait waits on.
    pub fn attach_tap(&mut self, port: TapPort) -> std::io::Result<()> {
        if let Some(p) = &mut self.poller {
            use std::os::fd::AsRawFd;
            p.add(port.queue.as_raw_fd())?;
        }
        self.tap = Some(port);
        Ok(())
    }

    fn remove_ports(&mut self, ifindex: u32) -> Removed {
        // Held frames received on its sockets are theirs by the UMEM's accounting (`reclaim`
        // takes back what they own and is not free): they go back to the free list first.
        // Those waiting to leave through it have nowhere to go.
        self.discard_held(|h| h.ingress == ifindex || h.oif == ifindex);
        let mut r = Removed::default();
        let mut i = 0;
        while i < self.ports.len() {
            if self.ports[i].ifindex != ifindex {
                i += 1;
                continue;
            }
            let port = self.ports.remove(i);
            if let Some(p) = &mut self.poller {
                let _ = p.remove(port.sock.fd());
            }
            r.sockets += 1;
            r.held += port.sock.frames_held();
            r.reclaimed += self.umem.reclaim(port.sock);
        }
        r.balanced = self.frames_accounted() == self.umem.frame_count() as u64;
        r
    }

    /// Applies the pending commands; true when the set of sockets changed.
    fn apply_commands(&mut self) -> bool {
        let Some(rx) = self.commands.clone() else {
            return false;
        };
        let mut changed = false;
        while let Ok(cmd) = rx.try_recv() {
            changed = true;
            match cmd {
                PortCommand::Add {
                    ifindex,
                    queue,
                    mac,
                    complete_checksums,
                    fast_path,
                    reply,
                } => {
                    let fill = fill_target(&self.xsk, 0);
                    let r = self.add_port(ifindex, queue, mac, complete_checksums, fast_path, fill);
                    let _ = reply.send(r);
                }
                PortCommand::Remove { ifindex, reply } => {
                    let _ = reply.send(self.remove_ports(ifindex));
                }
            }
        }
        changed
    }

    /// What wakes this worker from its idle wait: signal it after sending a command or setting
    /// the stop flag (None: the worker has no poll set and sleeps in short steps anyway).
    pub fn waker(&self) -> Option<Arc<Waker>> {
        self.waker.clone()
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

    /// The poll loop; returns when `shared.stop` is set. One loop: apply the runner's commands,
    /// receive and process a batch per socket and from the tap queue (when the worker has one)
    /// as many frames as the sockets gave, send on the held frames whose neighbour resolved,
    /// transmit and refill every socket, then the housekeeping of the clocks and, when nothing
    /// came, the idle back-off.
    pub fn run(&mut self, shared: &Shared) {
        #[cfg(feature = "bench-io-floor")]
        if let Some(floor) = io_floor::from_env() {
            return self.run_io_floor(shared, &floor);
        }
        let mut st = RunState::new(self, shared);
        while !shared.stop.load(Ordering::Relaxed) {
            self.commands(&mut st);
            let got = self.receive_and_process(shared, &mut st);
            let got = got + self.tap_rounds(shared, &mut st, got);
            self.send_released(shared, &mut st);
            self.complete_and_refill(&mut st);
            self.housekeeping(shared, &mut st);
            self.idle(shared, &mut st, got);
        }
        self.finish(shared, &mut st.pipeline);
    }

    /// Applies the runner's commands and, when the sockets changed, sizes what is per port;
    /// returns whether they changed.
    fn commands(&mut self, st: &mut RunState) -> bool {
        st.changed |= self.apply_commands();
        self.count_discarded(&mut st.pipeline.counters);
        if !st.changed {
            return false;
        }
        st.changed = false;
        // A new or closed socket shows in the socket table at once.
        st.socket_stats_due = Instant::now();
        let nports = self.ports.len();
        st.out = (0..nports).map(|_| Vec::with_capacity(BATCH)).collect();
        st.out_idx = (0..nports).map(|_| Vec::with_capacity(BATCH)).collect();
        let ifindexes: Vec<u32> = self.ports.iter().map(|p| p.ifindex).collect();
        // A worker has one socket per (interface, queue) it owns; it sends on one of them per
        // interface.
        st.egress = Egress::new(&ifindexes, self.kernel_port).holding(true);
        st.kept = kept_reserve(st.base, nports);
        st.spoof.valid_for = (u64::MAX, u64::MAX);
        true
    }

    /// Receives up to a batch from every socket and takes each batch through the pipeline, the
    /// egress stage and TX; returns the frames received.
    #[inline]
    fn receive_and_process(&mut self, shared: &Shared, st: &mut RunState) -> usize {
        let mut got = 0;
        for p in 0..self.ports.len() {
            let n = self.ports[p].sock.receive(&mut self.umem, &mut st.descs);
            if n > 0 {
                got += n;
                self.process_batch(shared, st, p, n);
            }
        }
        got
    }

    /// One received batch of `n` frames on port `p`: source validation, the pipeline, the
    /// egress stage, queueing and TX, then its final verdicts counted once.
    #[inline]
    fn process_batch(&mut self, shared: &Shared, st: &mut RunState, p: usize, n: usize) {
        let t0 = Instant::now();
        let snap = shared.tables.current();
        // Received from the node's own stack (the host path's kxdp1).
        let from_kernel = self.kernel_port == Some(self.ports[p].ifindex);
        let now = clock_ms();
        let fib = shared.routes.load();
        // Spoofed sources go to the batch's tail with their verdicts; the pipeline takes the
        // rest.
        let screened = self.screen_sources(shared, st, &fib, &snap, p, n);
        // The port's flows may take the in-kernel fast path (its XDP program hands them to the
        // kernel): a SYN reopening one still on it has its close settled first.
        let fast_path = self.ports[p].fast_path && !from_kernel;
        let mut moved = 0;
        if let Some(o) = fast_path
            .then(|| self.tap.as_mut()?.offloads.as_mut())
            .flatten()
        {
            for d in &st.descs[..screened] {
                let frame = received(&self.umem, d);
                let c = &mut st.pipeline.counters;
                moved += o.settle_reopened(frame, &shared.ct, c, now);
            }
        }
        let hex = shared.stats.as_ref().is_some_and(|s| s.wants_frames());
        if hex {
            st.keep_received(&self.umem, n);
        }
        {
            let mut batch = self.umem.batch(&mut st.descs[..n]);
            (st.pipeline).decide(
                &mut batch,
                &mut st.verdicts[..screened],
                &snap,
                &shared.ct,
                now,
            );
            let before = st.egress_stats.checksums_completed;
            st.egress.process(
                &mut batch,
                &mut st.verdicts[..n],
                &mut st.hops[..n],
                &fib,
                LinkType::Ethernet,
                self.ports[p].complete_checksums,
                // What the kernel port delivered the kernel already routed to kxdp.
                (!from_kernel).then_some(&snap.cluster_cidrs),
                &mut st.egress_stats,
                |oif, addr, family| {
                    let _ = shared.unresolved.try_send((oif, addr, family));
                },
            );
            let done = st.egress_stats.checksums_completed - before;
            if done > 0 {
                (st.io.checksums_completed).fetch_add(done, Ordering::Relaxed);
            }
        }
        if fast_path {
            let open = FastPathStep::Open;
            self.fast_path_step(open, shared, st, &snap, &fib, p, screened, now);
        }
        let mut q = TxQueues {
            out: &mut st.out,
            out_idx: &mut st.out_idx,
        };
        let rx = Ingress {
            ifindex: self.ports[p].ifindex,
            partial_checksums: self.ports[p].complete_checksums,
            from_kernel,
        };
        let batch = Batch {
            descs: &st.descs[..n],
            verdicts: &mut st.verdicts[..n],
            hops: &mut st.hops[..n],
        };
        self.queue_batch(shared, &fib, rx, batch, &mut q, now);
        self.transmit(&mut q, &mut st.verdicts[..n], &st.io);
        if fast_path {
            let consider = FastPathStep::Consider;
            moved += self.fast_path_step(consider, shared, st, &snap, &fib, p, screened, now);
        }
        let c = &st.io;
        if moved > 0 {
            // What the fast path moved for the flows this batch took off, counted now.
            c.rx.fetch_add(moved, Ordering::Relaxed);
            c.tx.fetch_add(moved, Ordering::Relaxed);
        }
        // The batch's final verdicts, counted once (held frames when they leave).
        st.pipeline.counters.record(
            (st.verdicts[..n].iter().zip(&st.hops[..n]))
                .filter(|&(_, &h)| h != HOLD)
                .map(|(v, _)| v),
        );
        c.rx.fetch_add(n as u64, Ordering::Relaxed);
        c.batches.fetch_add(1, Ordering::Relaxed);
        if let Some(stats) = &shared.stats {
            let frame = |i: usize| hex.then(|| &st.received[i][..st.received_len[i]]);
            stats.after_batch_with_frames(
                self.index,
                &st.pipeline.counters,
                &st.verdicts[..n],
                &frame,
                t0.elapsed().as_nanos() as u64,
                now,
            );
        }
    }

    /// Port `p`'s batch and the in-kernel fast path (`Port::fast_path`), at `step`: returns the
    /// packets the fast path moved for the flows the batch took off (counted).
    #[allow(clippy::too_many_arguments)]
    fn fast_path_step(
        &mut self,
        step: FastPathStep,
        shared: &Shared,
        st: &mut RunState,
        snap: &Snapshot,
        fib: &Fib,
        p: usize,
        screened: usize,
        now: u64,
    ) -> u64 {
        let Some(tap) = self.tap.as_mut() else {
            return 0;
        };
        let Some(o) = tap.offloads.as_mut() else {
            return 0;
        };
        let routing = tap
            .direct
            .is_some()
            .then_some(crate::direct::DirectRouting {
                fib,
                pods: &snap.cluster_cidrs,
                kernel_port: self.kernel_port,
            });
        let (allowed, ingress, ct) = (offload_allowed(shared), self.ports[p].ifindex, &shared.ct);
        let mut moved = 0;
        for (d, v) in st.descs[..screened].iter().zip(&st.verdicts[..screened]) {
            let hop = routing.as_ref().and_then(|r| r.hop(v));
            let frame = received(&self.umem, d);
            let allowed = allowed && !snap.node.is_node_addr(&v.src);
            match step {
                FastPathStep::Open => {
                    o.open(frame, v, ingress, hop, routing.as_ref(), ct, now, allowed)
                }
                FastPathStep::Consider => {
                    let c = &mut st.pipeline.counters;
                    moved += o.consider(frame, v, ingress, hop, ct, c, now, allowed);
                }
            }
        }
        moved
    }

    /// Batches from the tap queue until it has no full batch left or has given as many frames
    /// as the sockets did in this loop (`sockets`): a backlog on the tap is served as fast as
    /// the sockets' traffic. What the sockets bring may be answered through the tap (a flood
    /// arriving on an uplink on XDP, forwarded to pods on the tap, whose SYN-ACKs come back
    /// through it); at one tap batch per loop those answers filled the tap's queue and crowded
    /// out the pods' own packets. Returns the frames read.
    fn tap_rounds(&mut self, shared: &Shared, st: &mut RunState, sockets: usize) -> usize {
        let mut got = 0;
        loop {
            let n = self.tap_round(shared, st);
            got += n;
            if n < crate::tap::TAP_BATCH || got >= sockets {
                return got;
            }
        }
    }

    /// One batch from the tap queue (`crate::tap`), if the worker has one: up to `TAP_BATCH`
    /// frames read without waiting, the pipeline over them, each written back into the tap by
    /// its verdict (the kernel routes it: no egress stage); counted as the packets they stand
    /// for (a super-frame as its segments). Returns the frames read.
    fn tap_round(&mut self, shared: &Shared, st: &mut RunState) -> usize {
        let Some(tap) = &mut self.tap else {
            return 0;
        };
        let snap = shared.tables.current();
        let fib = shared.routes.load();
        let check =
            (shared.source_validation == crate::antispoof::SourceValidation::Strict).then(|| {
                crate::tap::SourceCheck {
                    fib: &fib,
                    pod_ranges: &snap.cluster_cidrs,
                    kernel_port: self.kernel_port,
                    generation: (fib.id(), snap.generation),
                }
            });
        let n = tap.receive(check.as_ref());
        let spoofed = tap.spoofed_count;
        if n + spoofed == 0 {
            return 0;
        }
        let t0 = Instant::now();
        let now = clock_ms();
        // A SYN reopening a tuple whose close the fast path has not reported yet: that close
        // first (what those flows moved is counted with this batch).
        let mut moved = 0;
        if let Some(o) = &mut tap.offloads {
            for i in 0..n {
                let c = &mut st.pipeline.counters;
                moved += o.settle_reopened(tap.frames.get(i), &shared.ct, c, now);
            }
        }
        let hex = shared.stats.as_ref().is_some_and(|s| s.wants_frames());
        if hex {
            for i in 0..n {
                st.keep_frame(i, tap.frames.get(i));
            }
            for i in 0..spoofed {
                st.keep_frame(n + i, tap.spoofed_head(i));
            }
        }
        (st.pipeline).decide(
            &mut tap.frames,
            &mut st.verdicts[..n],
            &snap,
            &shared.ct,
            now,
        );
        for v in st.verdicts[..n].iter() {
            register_masq_reply(shared, &self.counters, v, false);
        }
        let routing = tap.direct.is_some().then(|| crate::direct::DirectRouting {
            fib: &fib,
            pods: &snap.cluster_cidrs,
            kernel_port: self.kernel_port,
        });
        if let Some(routing) = &routing {
            for (hop, v) in tap.hops.iter_mut().zip(&st.verdicts[..n]) {
                *hop = routing.hop(v);
            }
        }
        let allowed = offload_allowed(shared);
        // Translated to the node's own source (a NodePort's reply), the kernel would drop the
        // flow's packets as martians where the fast path hands them over.
        let allowed_for = |v: &Verdict| allowed && !snap.node.is_node_addr(&v.src);
        if let Some(o) = &mut tap.offloads {
            for (i, v) in st.verdicts[..n].iter().enumerate() {
                let (frame, ingress, hop) = (tap.frames.get(i), tap.ingress[i], tap.hops[i]);
                let (r, ct) = (routing.as_ref(), &shared.ct);
                o.open(frame, v, ingress, hop, r, ct, now, allowed_for(v));
            }
        }
        let sent = tap.send(&mut st.verdicts[..n]);
        // What the fast path moved for the flows these frames take off (their last packets
        // before a SYN or RST), counted now.
        if let Some(o) = &mut tap.offloads {
            let c = &mut st.pipeline.counters;
            for (i, v) in st.verdicts[..n].iter().enumerate() {
                let (frame, ingress, hop) = (tap.frames.get(i), tap.ingress[i], tap.hops[i]);
                let allowed = allowed_for(v);
                moved += o.consider(frame, v, ingress, hop, &shared.ct, c, now, allowed);
            }
        }
        // The frames dropped for their source, after the batch's (counted and shown with it).
        st.verdicts[n..n + spoofed].copy_from_slice(&tap.spoofed[..spoofed]);
        let verdicts = &st.verdicts[..n + spoofed];
        let weights: [u64; 2 * crate::tap::TAP_BATCH] = std::array::from_fn(|i| match i {
            i if i < n => tap.weight(i, &verdicts[i]),
            i if i < n + spoofed => tap.spoofed_segs[i - n],
            _ => 0,
        });
        let c = &mut st.pipeline.counters;
        // The pipeline counted one packet per frame it saw; the spoofed frames, nothing.
        c.packets += weights.iter().sum::<u64>() - n as u64;
        c.direct_routed += sent.direct;
        c.bytes += tap.spoofed_bytes;
        c.record_weighted(verdicts.iter().zip(weights));
        let io = &st.io;
        let received: u64 = tap.segs[..n].iter().sum::<u64>() + weights[n..].iter().sum::<u64>();
        io.rx.fetch_add(received + moved, Ordering::Relaxed);
        io.tx.fetch_add(sent.segments + moved, Ordering::Relaxed);
        io.tap_frames
            .fetch_add((n + spoofed) as u64, Ordering::Relaxed);
        io.batches.fetch_add(1, Ordering::Relaxed);
        if let Some(stats) = &shared.stats {
            let busy = t0.elapsed().as_nanos() as u64;
            let frame = |i: usize| hex.then(|| &st.received[i][..st.received_len[i]]);
            let c = &st.pipeline.counters;
            stats.after_batch_with_frames(self.index, c, verdicts, &frame, busy, now);
        }
        n + spoofed
    }

    /// Moves the batch's frames with spoofed sources to its tail with their verdicts (on ports
    /// whose sources are checked: `antispoof::checked`); returns how many frames are left for
    /// the pipeline.
    #[inline]
    fn screen_sources(
        &self,
        shared: &Shared,
        st: &mut RunState,
        fib: &Fib,
        snap: &Snapshot,
        p: usize,
        n: usize,
    ) -> usize {
        let spoof = &mut st.spoof;
        if spoof.valid_for != (fib.id(), snap.generation) {
            spoof.valid_for = (fib.id(), snap.generation);
            spoof.checked = (self.ports.iter())
                .map(|q| {
                    let (mode, pods) = (shared.source_validation, &snap.cluster_cidrs);
                    crate::antispoof::checked(mode, fib, pods, q.ifindex, self.kernel_port)
                })
                .collect();
            spoof.own = (self.ports.iter())
                .map(|q| fib.sources_on(q.ifindex, crate::antispoof::OWN_SOURCES))
                .collect();
        }
        match spoof.checked.get(p) {
            Some(true) => crate::antispoof::screen(
                &mut st.descs[..n],
                |d| {
                    let f = self.umem.frame(d.addr);
                    &f[..d.len.min(f.len())]
                },
                fib,
                self.ports[p].ifindex,
                &spoof.own[p],
                &mut st.verdicts,
                &mut st.pipeline.counters,
            ),
            _ => n,
        }
    }

    /// Sends on the held frames whose neighbour resolved or whose time is up
    /// ([`Worker::release_held`]).
    fn send_released(&mut self, shared: &Shared, st: &mut RunState) {
        if self.held.is_empty() {
            return;
        }
        let (fib, snap) = (shared.routes.load(), shared.tables.current());
        let mut q = TxQueues {
            out: &mut st.out,
            out_idx: &mut st.out_idx,
        };
        let (egress, pods) = (&st.egress, &snap.cluster_cidrs);
        self.release_held(
            shared,
            &fib,
            egress,
            pods,
            &mut q,
            &mut st.pipeline.counters,
        );
    }

    /// Completions and refills for every socket (frames sent on one socket may have been
    /// received on another: the UMEM is shared). Each fill ring is topped up to its share, i.e.
    /// by what it consumed: an idle socket keeps its share, a busy one gets back what it used,
    /// and no socket hoards what another needs.
    fn complete_and_refill(&mut self, st: &mut RunState) {
        for port in &mut self.ports {
            port.sock.complete(&mut self.umem);
            port.sock.flush_tx();
        }
        st.tx_left = 0;
        let owed = self.ports.iter().map(|p| p.fill_deficit()).sum();
        let mut round = FillRound::new(st.kept, owed);
        for port in &mut self.ports {
            let held = port.sock.fill_outstanding();
            let own = port.fill_deficit();
            port.fill_target = round.share(
                port.fill_target,
                &mut port.demand,
                held,
                port.sock.fill_ring_level(),
                port.sock.rings().fill,
                self.umem.free_frames(),
            );
            // Above its share (it shrank): no top-up until the kernel has used the excess.
            if held < port.fill_target {
                port.sock.refill(&mut self.umem, port.fill_target - held);
            }
            let (deficit, topped) = (port.fill_deficit(), port.sock.fill_outstanding());
            round.topped(&mut port.demand, own, deficit, topped);
            st.tx_left += port.sock.tx_pending();
        }
        if round.starved() > 0 {
            for port in &mut self.ports {
                let held = port.sock.fill_outstanding();
                port.demand
                    .yield_to(&mut port.fill_target, held, round.starved());
            }
        }
    }

    /// The loop's clocks: the fill shares' window, and the kernel's counters of frames lost
    /// before kxdp saw them (one getsockopt per socket about once a second, never per packet).
    fn housekeeping(&mut self, shared: &Shared, st: &mut RunState) {
        let now = Instant::now();
        st.loop_at = now;
        if now >= st.share_window_end {
            for port in &mut self.ports {
                let ring = port.sock.rings().fill;
                port.demand.end_window(&mut port.fill_target, ring);
            }
            st.share_window_end = now + FILL_SHARE_WINDOW;
        }
        self.offload_round(shared, st, now);
        if let Some(stats) = &shared.stats {
            if now >= st.socket_stats_due {
                self.publish_sockets(stats);
                st.socket_stats_due = now + SOCKET_STATS_PERIOD;
            }
        }
    }

    /// Plays the handshakes the kernel's fast path carried (every millisecond while there are
    /// any); counts what it moved for this worker's offloaded flows and takes off those whose
    /// connections no longer qualify (`crate::offload`, every `CHECK_EVERY`).
    fn offload_round(&mut self, shared: &Shared, st: &mut RunState, now: Instant) {
        let kernel_port = self.kernel_port;
        let Some(tap) = self.tap.as_mut() else {
            return;
        };
        let direct = tap.direct.is_some();
        let Some(o) = tap.offloads.as_mut() else {
            return;
        };
        if o.has_openings() {
            o.play_handshakes(&shared.ct, clock_ms());
        }
        if !o.due(now) {
            return;
        }
        let (fib, snap) = (shared.routes.load(), shared.tables.current());
        let routing = direct.then(|| crate::direct::DirectRouting {
            fib: &fib,
            pods: &snap.cluster_cidrs,
            kernel_port,
        });
        let now_ms = clock_ms();
        let c = &mut st.pipeline.counters;
        let flows = c.offloaded_flows;
        let allowed = offload_allowed(shared);
        let moved = o.maintain(&shared.ct, c, now, now_ms, allowed, routing.as_ref());
        if moved > 0 || c.offloaded_flows != flows {
            st.io.rx.fetch_add(moved, Ordering::Relaxed);
            st.io.tx.fetch_add(moved, Ordering::Relaxed);
            if let Some(stats) = &shared.stats {
                stats.after_batch(self.index, c, &[], 0, now_ms);
            }
        }
    }

    /// The idle back-off (see the module docs): after `got` frames, resets it; after an empty
    /// poll, spins, then waits on the sockets (or sleeps without a poll set).
    fn idle(&mut self, shared: &Shared, st: &mut RunState, got: usize) {
        let idle = &mut st.idle;
        if got > 0 {
            idle.polls = 0;
            idle.busy_at = st.loop_at;
            idle.sleep_us = self.backoff.min_sleep_us;
            return;
        }
        idle.polls = idle.polls.saturating_add(1);
        if idle.polls <= self.backoff.spin_polls && idle.busy_at.elapsed() <= SPIN_LIMIT {
            // Spin by yielding: on a CPU shared with the pods, the client or server the last
            // packet woke runs at once instead of waiting for the spin to end (docs/afxdp.md
            // § Workers, "Idle wait"); on a CPU of its own the worker is back at once.
            std::thread::yield_now();
            return;
        }
        self.counters.idle_sleeps.fetch_add(1, Ordering::Relaxed);
        // Idle: the live count gets this worker's new connections now rather than at its next
        // busy millisecond.
        st.pipeline.flush_conntrack(&shared.ct);
        match &mut self.poller {
            Some(p) => {
                // The sockets' fds wake the wait only for RX. Frames still on a TX ring (a
                // copy-mode kick sends at most `tx_budget`: 32 on kernels before 6.17; the rest
                // wait for the next kick) are kicked again a millisecond later, not after the
                // safety-net timeout; held frames look for their neighbour as often.
                // So do connections whose handshake the fast path carries (assured within a
                // millisecond of their ACK: `Offloads::play_handshakes`).
                let opening = (self.tap.as_ref())
                    .and_then(|t| t.offloads.as_ref())
                    .is_some_and(|o| o.has_openings());
                let busy = st.tx_left > 0 || !self.held.is_empty() || opening;
                let ready = p.wait(if busy { 1 } else { IDLE_WAIT_MS });
                if let Some(w) = &self.waker {
                    if p.is_ready(ready, w.fd()) {
                        w.clear();
                    }
                }
                // Spin again after a wake-up: what woke us usually brings more.
                idle.polls = 0;
                idle.busy_at = Instant::now();
            }
            None => {
                std::thread::sleep(Duration::from_micros(idle.sleep_us as u64));
                idle.sleep_us = (idle.sleep_us * 2).min(self.backoff.max_sleep_us);
            }
        }
    }

    /// After the stop: held frames go back to the free list (a takeover's successor gets a
    /// balanced UMEM), and the last reading is published for whoever looks after the stop (a
    /// takeover's successor, the log).
    fn finish(&mut self, shared: &Shared, pipeline: &mut Pipeline) {
        self.discard_held(|_| true);
        self.count_discarded(&mut pipeline.counters);
        if let Some(stats) = &shared.stats {
            stats.after_batch(self.index, &pipeline.counters, &[], 0, clock_ms());
            self.publish_sockets(stats);
        }
    }

    /// The I/O floor (benchmarks only, `bench-io-floor` feature): every received frame is sent
    /// out unchanged, without the pipeline or the egress stage, batch by batch in turn out of
    /// the `floor` interfaces; completions, refills and the idle back-off as in `run`.
    #[cfg(feature = "bench-io-floor")]
    fn run_io_floor(&mut self, shared: &Shared, floor: &[u32]) {
        let mut st = RunState::new(self, shared);
        let (mut turn, mut out) = (0usize, Vec::new());
        while !shared.stop.load(Ordering::Relaxed) {
            if self.commands(&mut st) {
                out = (floor.iter())
                    .filter_map(|&i| self.ports.iter().position(|p| p.ifindex == i))
                    .collect();
            }
            let mut got = 0;
            for p in 0..self.ports.len() {
                let n = self.ports[p].sock.receive(&mut self.umem, &mut st.descs);
                got += n;
                if n == 0 {
                    continue;
                }
                if out.is_empty() {
                    // None of the floor's interfaces is this worker's: the product path.
                    self.process_batch(shared, &mut st, p, n);
                    continue;
                }
                turn = (turn + 1) % out.len();
                let e = out[turn];
                let sent = self.ports[e].sock.send(&mut self.umem, &st.descs[..n]);
                self.ports[e].sock.flush_tx();
                (self.counters.tx).fetch_add(sent as u64, Ordering::Relaxed);
                (self.counters.rx).fetch_add(n as u64, Ordering::Relaxed);
            }
            self.complete_and_refill(&mut st);
            self.housekeeping(shared, &mut st);
            self.idle(shared, &mut st, got);
        }
        self.finish(shared, &mut st.pipeline);
    }

    /// Queues each sent frame of a batch on its egress port (`hops[i]`, from the egress stage),
    /// holds those waiting for a neighbour ([`HOLD`]; a frame the hold queue has no room for
    /// becomes a `no-neighbour` drop) and gives the others back to the free list. A new
    /// masqueraded connection, or one the node itself opened (through the kernel port, source a
    /// node address), has its reply registered with the XDP program before the packet leaves:
    /// replies come to a node address on a port the kernel owns or could own, and must be
    /// steered to kxdp (and un-NATed).
    fn queue_batch(
        &mut self,
        shared: &Shared,
        fib: &Fib,
        rx: Ingress,
        b: Batch<'_>,
        q: &mut TxQueues<'_>,
        now_ms: u64,
    ) {
        for (i, v) in b.verdicts.iter_mut().enumerate() {
            register_masq_reply(shared, &self.counters, v, rx.from_kernel);
            match b.hops[i] {
                NOT_SENT => self.umem.recycle(b.descs[i].addr),
                HOLD => {
                    let held = match fib.lookup(&v.dst, v.family) {
                        Err(Miss::NoNeighbour(oif, next_hop)) => self.held.hold(Held {
                            frame: b.descs[i],
                            verdict: *v,
                            oif,
                            next_hop,
                            ingress: rx.ifindex,
                            partial_checksums: rx.partial_checksums,
                            from_kernel: rx.from_kernel,
                            deadline_ms: now_ms + hold::HOLD_MS,
                        }),
                        _ => false,
                    };
                    if !held {
                        v.set(Reason::NoNeighbour);
                        b.hops[i] = NOT_SENT;
                        self.umem.recycle(b.descs[i].addr);
                    }
                }
                e => {
                    q.out[e as usize].push(b.descs[i]);
                    q.out_idx[e as usize].push(i as u16);
                }
            }
        }
    }

    /// Sends on the held frames whose neighbour the FIB now has (looked up again when a new
    /// FIB is published: the refresher's answer to the resolution the egress stage asked for),
    /// through the egress stage as if they had just been processed, and drops as
    /// `no-neighbour` those whose time is up. Their final verdicts are counted here, once.
    fn release_held(
        &mut self,
        shared: &Shared,
        fib: &Fib,
        egress: &Egress,
        pods: &PrefixSet,
        q: &mut TxQueues<'_>,
        counters: &mut Counters,
    ) {
        let now = clock_ms();
        let fib_changed = fib.id() != self.held_fib;
        if !fib_changed && self.held.next_deadline().is_some_and(|d| d > now) {
            return;
        }
        self.held_fib = fib.id();
        let releasing = &mut self.releasing;
        self.held.take_where(
            |h| {
                h.deadline_ms <= now
                    || fib_changed
                        && !matches!(
                            fib.lookup(&h.verdict.dst, h.verdict.family),
                            Err(Miss::NoNeighbour(..))
                        )
            },
            |h| releasing.push(h),
        );
        if self.releasing.is_empty() {
            return;
        }
        let mut verdicts = [Verdict::default(); hold::CAPACITY];
        let mut hops = [NOT_SENT; hold::CAPACITY];
        let mut stats = EgressStats::default();
        let k = self.releasing.len().min(hold::CAPACITY);
        for j in 0..k {
            let h = self.releasing[j];
            let mut frame = [h.frame];
            verdicts[j] = h.verdict;
            {
                let mut batch = self.umem.batch(&mut frame);
                egress.process(
                    &mut batch,
                    &mut verdicts[j..=j],
                    &mut hops[j..=j],
                    fib,
                    LinkType::Ethernet,
                    h.partial_checksums,
                    (!h.from_kernel).then_some(pods),
                    &mut stats,
                    |oif, addr, family| {
                        let _ = shared.unresolved.try_send((oif, addr, family));
                    },
                );
            }
            match hops[j] {
                NOT_SENT => self.umem.recycle(h.frame.addr),
                // Still no neighbour: back in the queue until its deadline.
                HOLD if h.deadline_ms > now && self.held.hold(h) => {}
                HOLD => {
                    verdicts[j].set(Reason::NoNeighbour);
                    hops[j] = NOT_SENT;
                    self.umem.recycle(h.frame.addr);
                }
                e => {
                    q.out[e as usize].push(h.frame);
                    q.out_idx[e as usize].push(j as u16);
                }
            }
        }
        self.releasing.clear();
        let io = self.counters.clone();
        self.transmit(q, &mut verdicts[..k], &io);
        if stats.checksums_completed > 0 {
            (io.checksums_completed).fetch_add(stats.checksums_completed, Ordering::Relaxed);
        }
        counters.record(
            (verdicts[..k].iter().zip(&hops[..k]))
                .filter(|&(_, &h)| h != HOLD)
                .map(|(v, _)| v),
        );
        if let Some(stats) = &shared.stats {
            stats.after_batch(self.index, counters, &[], 0, now);
        }
    }

    /// Gives the held frames `pick` selects back to the free list, as `no-neighbour` drops (to
    /// be counted: [`Worker::count_discarded`]).
    fn discard_held(&mut self, pick: impl FnMut(&Held<Desc>) -> bool) {
        let (umem, discarded) = (&mut self.umem, &mut self.discarded);
        self.held.take_where(pick, |mut h| {
            umem.recycle(h.frame.addr);
            h.verdict.set(Reason::NoNeighbour);
            h.verdict.egress = 0;
            discarded.push(h.verdict);
        });
    }

    /// Counts the held frames dropped outside a batch.
    fn count_discarded(&mut self, counters: &mut Counters) {
        if !self.discarded.is_empty() {
            counters.record(&self.discarded);
            self.discarded.clear();
        }
    }

    /// One TX submission and kick per egress port with queued frames. Frames that did not fit
    /// on a TX ring (already back on the free list) become `tx-ring-full` drops in `verdicts`.
    fn transmit(&mut self, q: &mut TxQueues<'_>, verdicts: &mut [Verdict], c: &IoCounters) {
        for e in 0..q.out.len().min(self.ports.len()) {
            if q.out[e].is_empty() {
                continue;
            }
            let sent = self.ports[e].sock.send(&mut self.umem, &q.out[e]);
            c.tx.fetch_add(sent as u64, Ordering::Relaxed);
            for &i in &q.out_idx[e][sent..] {
                let v = &mut verdicts[i as usize];
                v.egress = 0;
                v.set(Reason::TxRingFull);
            }
            self.ports[e].sock.flush_tx();
            q.out[e].clear();
            q.out_idx[e].clear();
        }
    }

    /// Reads every socket's kernel counters (`XDP_STATISTICS`, one `getsockopt` each) and
    /// publishes them with the ring sizes in `stats`' socket table, and the tap's drops (one
    /// netlink request) when the worker has a tap queue. A failed read keeps the previous
    /// values (counters never go back).
    pub fn publish_sockets(&mut self, stats: &DataplaneStats) {
        for p in &mut self.ports {
            if let Ok(k) = p.sock.kernel_stats() {
                p.kernel = k;
            }
        }
        if let Some(tap) = &self.tap {
            if let Ok(n) = kxdp_kernel::netlink::link_tx_dropped(tap.ifindex) {
                stats.publish_tap(tap.queue.name(), n);
            }
        }
        let index = self.index;
        stats.publish_umem(
            index,
            u64::from(self.umem.frame_count()),
            self.umem.free_frames() as u64,
        );
        stats.publish_sockets(index, |rows| {
            rows.extend(self.ports.iter().map(|p| SocketSample {
                worker: index,
                interface: p.name.clone(),
                ifindex: p.ifindex,
                queue: p.sock.queue,
                rings: p.sock.rings(),
                kernel: p.kernel,
            }))
        });
    }

    /// Frames accounted for across the UMEM and the worker's sockets (equal to the frame count
    /// when none leaked).
    pub fn frames_accounted(&self) -> u64 {
        let socks: Vec<&XskSocket> = self.ports.iter().map(|p| &p.sock).collect();
        self.umem.frames_accounted(&socks)
    }
}

/// Whether flows may go on (and stay on) the kernel's fast path: not while a monitor wants
/// every verdict, which the fast path would not show (`crate::offload`).
fn offload_allowed(shared: &Shared) -> bool {
    !shared
        .stats
        .as_ref()
        .is_some_and(|s| s.wants_all_verdicts())
}

/// Registers the reply of a new connection whose replies come to a node address (masqueraded,
/// or opened by the node itself: `from_kernel`) with the XDP program, which must steer them to
/// kxdp (and the un-NAT) however they arrive.
#[inline]
fn register_masq_reply(shared: &Shared, io: &IoCounters, v: &Verdict, from_kernel: bool) {
    if (v.masq || from_kernel) && v.reason == Reason::ServiceDnat {
        if let Some(m) = &shared.masq {
            if m.add_masq_reply(v.proto, &v.dst, v.family, v.dport, v.sport)
                .is_err()
            {
                io.masq_map_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Where a batch from an XDP port stands with the in-kernel fast path: after the pipeline and
/// the egress stage, before TX (the answer to a SYN may come back before TX returns), the
/// connections whose first SYN it carries go on (`Offloads::open`); after TX, its flows that
/// qualify go on and those a frame closed or reset come off (`Offloads::consider`).
#[derive(Clone, Copy)]
enum FastPathStep {
    Open,
    Consider,
}

/// The bytes of received frame `d` in the UMEM.
#[inline]
fn received<'u>(umem: &'u Umem, d: &Desc) -> &'u [u8] {
    let f = umem.frame(d.addr);
    &f[..d.len.min(f.len())]
}

/// Frames every socket that carries traffic is given at least (as long as the UMEM keeps the
/// other sockets' reserve): a veth's NAPI poll delivers up to 64 frames and a kick of the
/// sender in copy mode 32 before the worker can wake, more than the base share (24 with the
/// defaults), so an idle socket's first burst lost what did not fit (measured in the lab at low
/// rates, docs/benchmarks.md "AF_XDP lab", "Where the time goes, and where the loss happens").
pub const ACTIVE_FILL: u32 = 2 * BATCH as u32;

/// A socket's fill share after a loop (see `Port::fill_target`), from its share now, the
/// frames the kernel `taken` off its fill ring since the last top-up (on the RX ring waiting,
/// or being copied into), the frames the worker `consumed` from it in this loop, its fill
/// ring's size and the frames the free list can give beyond the other sockets' reserve.
///
/// - Under pressure (the kernel took half the share, or the worker consumed half of it or half
///   a batch in one loop) it doubles, and at least to twice what the kernel took: a burst
///   grows the share within the loop that sees it, however low the average rate (a loop
///   takes at most one batch per socket, so "consumed half the share" alone stopped at 192
///   frames; "taken" sees the whole backlog).
/// - A socket that carried any frame has at least [`ACTIVE_FILL`].
///
/// Never above the ring nor beyond what the free list can grant; never shrinks here (see
/// [`shrunk_fill_share`]).
pub fn next_fill_share(share: u32, taken: u32, consumed: u32, ring: u32, grantable: u32) -> u32 {
    let pressure = taken >= share / 2 || consumed >= (share / 2).min(BATCH as u32 / 2);
    let want = if pressure && (taken > 0 || consumed > 0) {
        (share * 2).max(taken * 2).max(ACTIVE_FILL)
    } else if taken > 0 || consumed > 0 {
        ACTIVE_FILL
    } else {
        share
    };
    want.min(ring)
        .min(share.saturating_add(grantable))
        .max(share)
}

/// One loop's pass of the share rule over a worker's sockets, in order (`Worker::run`; the
/// tests' model of a worker takes the same steps). A socket's growth takes only the frames free
/// beyond the kept reserve and beyond what the sockets' shares are still owed (consumed, not yet
/// topped up).
pub struct FillRound {
    kept: usize,
    owed: usize,
    /// The smallest share a socket under pressure wanted and was not granted (0: none).
    starved: u32,
}

impl FillRound {
    /// `kept`: [`kept_reserve`]; `owed`: the sum of the sockets' deficits before the round.
    pub fn new(kept: usize, owed: usize) -> FillRound {
        FillRound {
            kept,
            owed,
            starved: 0,
        }
    }

    /// The share some socket wanted in this round and did not get (0: none): the other sockets'
    /// shares then yield ([`yielded_fill_share`]).
    pub fn starved(&self) -> u32 {
        self.starved
    }

    /// A socket's share after the loop ([`next_fill_share`]), from its share now, the frames
    /// it `held` (fill ring and the kernel's hands) and those on its fill ring (`level`): since
    /// the last top-up the kernel took `demand.topped - level` off the ring (on the RX ring or
    /// received since) and the worker received `demand.topped - held` of them.
    pub fn share(
        &mut self,
        share: u32,
        demand: &mut FillDemand,
        held: u32,
        level: u32,
        ring: u32,
        free: usize,
    ) -> u32 {
        let taken = demand.topped.saturating_sub(level);
        let consumed = demand.topped.saturating_sub(held);
        demand.peak = demand.peak.max(taken);
        let grantable = free.saturating_sub(self.kept + self.owed) as u32;
        let wanted = next_fill_share(share, taken, consumed, ring, u32::MAX);
        let mut granted = next_fill_share(share, taken, consumed, ring, grantable);
        if demand.cap > 0 {
            granted = granted.min(demand.cap.max(share));
        }
        if granted < wanted && (self.starved == 0 || wanted < self.starved) {
            self.starved = wanted;
        }
        granted
    }

    /// After the socket's top-up: its deficit went from `own` to `deficit`, and it holds
    /// `topped` frames.
    pub fn topped(&mut self, demand: &mut FillDemand, own: usize, deficit: usize, topped: u32) {
        self.owed = self.owed - own + deficit;
        demand.topped = topped;
    }
}

/// A socket's fill share at the end of a [`FILL_SHARE_WINDOW`] in which the kernel took at most
/// `peak` frames off it between two top-ups: halved when `peak` stayed under a quarter of it,
/// but never below twice `peak`, nor below [`ACTIVE_FILL`] once it got there (a socket that
/// carried traffic keeps room for a NAPI poll's worth), nor below a base share. The worker
/// then skips the socket's top-ups until the kernel has used the excess, so a borrower hands
/// its frames back as it receives; an idle socket keeps what its fill ring holds.
pub fn shrunk_fill_share(share: u32, peak: u32) -> u32 {
    if peak >= share / 4 {
        return share;
    }
    (share / 2).max(peak * 2).max(share.min(ACTIVE_FILL))
}

/// A socket's fill share after a loop in which another socket under pressure could not grow to
/// `starved` frames because nothing was left to lend: a share more than twice that is halved
/// (never below `starved`), once the kernel has used the last excess (`held <= share`, so one
/// loop's halving is not stacked on the previous one's before it took effect). Without it, one
/// flooded socket kept the frames every other socket needed: in the lab's SYN flood the client
/// pod's socket stayed at its base share of 24 frames and lost whole bursts of its connections'
/// packets (docs/afxdp.md § "Frame budget").
pub fn yielded_fill_share(share: u32, held: u32, starved: u32) -> u32 {
    if starved == 0 || share <= starved.saturating_mul(2) || held > share {
        return share;
    }
    (share / 2).max(starved)
}

/// Frames of the free list a worker with `sockets` open never lends to busy sockets: a quarter
/// of the base shares of the sockets still to come (up to [`PLANNED_SOCKETS`]), and a batch.
/// The other three quarters are lent ([`next_fill_share`]'s `grantable`) and come back as the
/// borrowers' shares shrink; until then a late socket's base share comes from the quarter kept
/// (with the defaults, 1,576 frames with four sockets open: the base shares of 63 more).
pub fn kept_reserve(base: u32, sockets: usize) -> usize {
    base as usize * (PLANNED_SOCKETS as usize).saturating_sub(sockets) / 4 + BATCH
}

/// The fill-ring share a socket starts with: three quarters of the frames (the rest covers
/// frames in a batch and on TX rings) split among `max(sockets, PLANNED_SOCKETS)`, at most a
/// ring, at least `MIN_FILL` (8192 frames: 24). Busy sockets grow theirs (see `Port`). More
/// than `frames * 3/4 / MIN_FILL` sockets over-commit the UMEM: the last get what is free (size
/// `xsk.frames` for the interfaces a worker serves, docs/afxdp.md).
pub fn fill_target(cfg: &XskConfig, sockets: usize) -> u32 {
    let budget = cfg.frames as u64 * 3 / 4;
    let share = (budget / sockets.max(PLANNED_SOCKETS as usize) as u64) as u32;
    share.clamp(MIN_FILL.min(cfg.fill_ring_size), cfg.fill_ring_size)
}

/// What the worker saw of a socket's demand for fill frames (see `Port::fill_target`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillDemand {
    /// Frames the socket held (fill ring and the kernel's hands) right after its last top-up.
    pub topped: u32,
    /// The most frames the kernel took off the fill ring between two top-ups in this window.
    pub peak: u32,
    /// The most the share may grow to after it yielded to a starved socket (0: no limit);
    /// doubled at every window's end ([`FillDemand::end_window`]), so a share that yielded grows
    /// back by steps and yields again if the starved socket still needs the frames.
    pub cap: u32,
}

impl FillDemand {
    /// After a round in which a socket wanted `starved` frames the free list could not grant:
    /// this socket's `share` yields ([`yielded_fill_share`]) and stays capped there.
    pub fn yield_to(&mut self, share: &mut u32, held: u32, starved: u32) {
        let yielded = yielded_fill_share(*share, held, starved);
        if yielded < *share {
            *share = yielded;
            self.cap = yielded;
        }
    }

    /// A window's end: the share shrinks to what the window used ([`shrunk_fill_share`]), the
    /// cap of a share that yielded doubles (gone once it reaches the ring).
    pub fn end_window(&mut self, share: &mut u32, ring: u32) {
        *share = shrunk_fill_share(*share, self.peak);
        self.peak = 0;
        self.cap = match self.cap.saturating_mul(2) {
            c if c >= ring => 0,
            c => c,
        };
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) -> bool {
    kxdp_kernel::sys::pin_current_thread(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_that_carries_traffic_gets_at_least_the_active_share() {
        // 10 frames into a base share of 24: no pressure, but traffic.
        assert_eq!(next_fill_share(24, 10, 10, 2048, 6000), ACTIVE_FILL);
        // The base share emptied at once: at least the active share, not just twice the base.
        assert_eq!(next_fill_share(24, 24, 24, 2048, 6000), ACTIVE_FILL);
        // Idle: unchanged.
        assert_eq!(next_fill_share(24, 0, 0, 2048, 6000), 24);
        // The UMEM cannot grant it: unchanged, never less.
        assert_eq!(next_fill_share(24, 10, 10, 2048, 0), 24);
        assert_eq!(next_fill_share(24, 10, 10, 2048, 50), 74);
    }

    #[test]
    fn a_burst_grows_the_share_to_twice_what_the_kernel_took() {
        // The worker consumed one batch, but the kernel took 900 frames off the fill ring
        // (the rest wait on the RX ring): the old rule doubled to 512, this one to 1800.
        assert_eq!(next_fill_share(256, 900, 64, 2048, 6000), 1800);
        // Capped by the ring and by what the free list grants.
        assert_eq!(next_fill_share(1024, 1024, 64, 2048, 6000), 2048);
        assert_eq!(next_fill_share(1024, 1024, 64, 2048, 300), 1324);
        // Half a batch consumed in one loop is pressure too, whatever the kernel took.
        assert_eq!(next_fill_share(512, 40, 32, 2048, 6000), 1024);
        // Below both thresholds: unchanged.
        assert_eq!(next_fill_share(512, 100, 20, 2048, 6000), 512);
    }

    #[test]
    fn a_share_shrinks_when_its_backlog_stays_small() {
        // A quarter or more of the share used at the peak: kept.
        assert_eq!(shrunk_fill_share(4096, 1024), 4096);
        // Less: halved, but never below twice the peak.
        assert_eq!(shrunk_fill_share(4096, 100), 2048);
        assert_eq!(shrunk_fill_share(4096, 1000), 2048);
        assert_eq!(shrunk_fill_share(1024, 200), 512);
        assert_eq!(shrunk_fill_share(8192, 1500), 4096);
        assert_eq!(shrunk_fill_share(8192, 2000), 4096);
        // Never below the active share once there, nor below a base share.
        assert_eq!(shrunk_fill_share(256, 0), 128);
        assert_eq!(shrunk_fill_share(128, 0), ACTIVE_FILL);
        assert_eq!(shrunk_fill_share(24, 0), 24);
    }

    /// A worker's UMEM and sockets as the worker's loop sees them: frames received are sent
    /// and completed within the loop (as on veth in copy mode), so they are free again before
    /// the top-ups; the kernel takes frames off the fill rings between loops.
    struct Model {
        free: u32,
        base: u32,
        ring: u32,
        /// Per socket: its share, demand, and the frames on its fill ring.
        sockets: Vec<(u32, FillDemand, u32)>,
    }

    impl Model {
        fn new(cfg: &XskConfig, sockets: usize) -> Model {
            let base = fill_target(cfg, 0);
            let mut m = Model {
                free: cfg.frames,
                base,
                ring: cfg.fill_ring_size,
                sockets: Vec::new(),
            };
            for _ in 0..sockets {
                m.open();
            }
            m
        }

        /// A new socket gets its base share from the free list, what there is of it.
        fn open(&mut self) -> usize {
            let got = self.base.min(self.free);
            self.free -= got;
            let demand = FillDemand {
                topped: got,
                ..FillDemand::default()
            };
            self.sockets.push((self.base, demand, got));
            self.sockets.len() - 1
        }

        /// One loop: socket `i` received `arrivals[i]` frames (at most what its fill ring
        /// held; the rest are lost), all consumed and sent; then every share is updated and
        /// topped up as `Worker::run` does. Returns the frames lost.
        fn step(&mut self, arrivals: &[u32]) -> u32 {
            let mut lost = 0;
            for (i, s) in self.sockets.iter_mut().enumerate() {
                let a = arrivals.get(i).copied().unwrap_or(0);
                let got = a.min(s.2);
                lost += a - got;
                s.2 -= got;
                self.free += got;
            }
            let kept = kept_reserve(self.base, self.sockets.len());
            let deficit = |share: u32, held: u32| share.saturating_sub(held) as usize;
            let mut round =
                FillRound::new(kept, self.sockets.iter().map(|s| deficit(s.0, s.2)).sum());
            for (share, demand, held) in &mut self.sockets {
                let own = deficit(*share, *held);
                // Every frame received is consumed at once: the fill ring holds what is held.
                *share = round.share(*share, demand, *held, *held, self.ring, self.free as usize);
                if *held < *share {
                    let add = (*share - *held).min(self.free);
                    self.free -= add;
                    *held += add;
                }
                round.topped(demand, own, deficit(*share, *held), *held);
            }
            for (share, demand, held) in &mut self.sockets {
                demand.yield_to(share, *held, round.starved());
            }
            lost
        }

        fn end_window(&mut self) {
            for (share, demand, _) in &mut self.sockets {
                demand.end_window(share, self.ring);
            }
        }

        fn held(&self) -> u32 {
            self.sockets.iter().map(|s| s.2).sum()
        }
    }

    #[test]
    fn a_busy_socket_borrows_the_reserve_and_gives_it_back() {
        let cfg = XskConfig::default();
        let mut m = Model::new(&cfg, 4);
        let kept = kept_reserve(m.base, 4) as u32;
        // Bursts of growing size on socket 0 (a sender catching up): the share follows.
        for burst in [24, 128, 256, 512, 1024, 2048, 4096] {
            m.step(&[burst]);
        }
        let grown = m.sockets[0].0;
        // Beyond ~2,000 frames (a share capped there lost bursts): three quarters of the
        // planned sockets' reserve are lent; the quarter kept stays free.
        assert!(grown > 6000, "{grown}");
        assert!(m.free >= kept, "{} free, {kept} kept", m.free);
        // A burst of 6,000 frames while the worker is away is delivered whole.
        assert_eq!(m.step(&[6000]), 0);
        assert_eq!(m.free + m.held(), cfg.frames, "no frame lost track of");
        // Then a steady trickle: the share halves window by window down to the active share,
        // and the frames come back to the free list as the kernel uses them.
        for _ in 0..8 {
            for _ in 0..100 {
                m.step(&[20]);
            }
            m.end_window();
        }
        for _ in 0..100 {
            m.step(&[20]);
        }
        assert_eq!(m.sockets[0].0, ACTIVE_FILL);
        assert!(m.sockets[0].2 <= ACTIVE_FILL);
        let planned = kept_reserve(m.base, 4) as u32 * 4;
        assert!(m.free >= planned - 4 * BATCH as u32, "{} free", m.free);
        assert_eq!(m.free + m.held(), cfg.frames);
    }

    #[test]
    fn a_late_socket_gets_its_frames_while_another_has_borrowed() {
        let cfg = XskConfig::default();
        let mut m = Model::new(&cfg, 4);
        for burst in [24, 128, 256, 512, 1024, 2048, 4096] {
            assert_eq!(m.step(&[burst]), 0);
        }
        // The borrower now goes idle: its frames stay on its fill ring.
        assert!(m.sockets[0].2 > 6000);
        // Pods appear: the base shares come from the quarter kept, 60 of them at once.
        for _ in 0..60 {
            let s = m.open();
            assert_eq!(m.sockets[s].2, m.base, "socket {s} got its share");
            m.step(&[]);
        }
        // The borrower receives again at a low rate: its share shrinks, its frames come back,
        // and the sockets opened later can grow in their turn.
        let busy = vec![0u32; m.sockets.len()];
        for _ in 0..10 {
            for _ in 0..200 {
                m.step(&[30]);
            }
            m.end_window();
        }
        assert_eq!(m.sockets[0].0, ACTIVE_FILL);
        let late = m.sockets.len() - 1;
        let mut arrivals = busy;
        for burst in [24, 128, 256, 512, 1024, 2048, 4096] {
            arrivals[late] = burst;
            assert_eq!(m.step(&arrivals), 0, "burst of {burst} on the late socket");
        }
        assert!(m.sockets[late].0 >= 4096, "{}", m.sockets[late].0);
        assert_eq!(m.free + m.held(), cfg.frames);
    }

    #[test]
    fn a_flooded_socket_leaves_frames_for_the_others_bursts() {
        let cfg = XskConfig::default();
        let mut m = Model::new(&cfg, 4);
        // Socket 0 is flooded: every loop it receives all its fill ring holds, and its share
        // grows over every frame there is to lend.
        let flood = cfg.frames;
        for _ in 0..50 {
            m.step(&[flood]);
        }
        assert!(m.sockets[0].0 > 6000, "{}", m.sockets[0].0);
        // Socket 3 (a client pod) sends a burst of 200 frames every tenth loop. Its first
        // bursts lose frames; the flooded share yields until the bursts fit.
        let mut lost = Vec::new();
        for i in 0..400 {
            let burst = if i % 10 == 0 { 200 } else { 0 };
            let before = m.sockets[3].2;
            m.step(&[flood, 0, 0, burst]);
            if burst > 0 {
                lost.push(burst.saturating_sub(before));
            }
        }
        assert!(lost[0] > 0, "the first burst found the base share only");
        assert!(
            lost[10..].iter().all(|&l| l == 0),
            "later bursts lost {:?}",
            &lost[10..]
        );
        assert!(m.sockets[3].0 >= 200, "{}", m.sockets[3].0);
        // The flood keeps most of the frames.
        assert!(m.sockets[0].0 >= 2048, "{}", m.sockets[0].0);
        assert_eq!(m.free + m.held(), cfg.frames);
    }

    #[test]
    fn a_share_yields_to_a_starved_socket_once_per_excess() {
        assert_eq!(yielded_fill_share(6000, 6000, 0), 6000);
        assert_eq!(yielded_fill_share(6000, 6000, 256), 3000);
        // Still holding the last halving's excess: no second halving yet.
        assert_eq!(yielded_fill_share(3000, 6000, 256), 3000);
        assert_eq!(yielded_fill_share(600, 600, 256), 300);
        assert_eq!(yielded_fill_share(500, 500, 256), 500);
    }

    #[test]
    fn the_kept_reserve_is_a_quarter_of_the_sockets_to_come() {
        let base = fill_target(&XskConfig::default(), 0);
        assert_eq!(base, 24);
        assert_eq!(kept_reserve(base, 4), 24 * 252 / 4 + BATCH);
        assert_eq!(kept_reserve(base, 256), BATCH);
        assert_eq!(kept_reserve(base, 300), BATCH);
    }
}
