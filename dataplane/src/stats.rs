//! Worker state the control thread reads without stopping workers: per-worker counters published
//! after every batch (relaxed atomics, one cache-line-aligned block per worker, written by that
//! worker only) and a per-worker ring of drop/reject verdicts for `kxdp monitor`.
//!
//! A worker loop feeds it with one call after each batch:
//!
//! ```ignore
//! let t0 = Instant::now();
//! pipeline.process(&mut frames, &mut verdicts, &snap, &ct, now_ms);
//! // ... transmit ...
//! stats.after_batch(worker, &pipeline.counters, &verdicts[..n], t0.elapsed().as_nanos() as u64, now_ms);
//! ```
//!
//! `after_batch` stores the pipeline's cumulative `Counters` (a few dozen relaxed stores, no
//! read-modify-write), and copies dropped/rejected verdicts into the worker's ring only while a
//! `kxdp monitor` client is attached (one relaxed load otherwise); every verdict while a client
//! asked for all of them (`Monitor::all`), and the packets' first `FRAME_BYTES` bytes while one
//! asked for hex dumps and the worker hands its frames over (`after_batch_with_frames`). Workers should use
//! `clock::clock_ms` as their `now_ms`, so that conntrack timeouts shown by the admin API use the same clock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use kxdp_kernel::afxdp::{KernelXskStats, RingSizes};
use kxdp_packet::{Addr, Family, IpProto};

use crate::clock::clock_ms;
use crate::pipeline::Counters;
use crate::verdict::{Action, Reason, Verdict};

/// One worker's cumulative counters, as last published.
#[repr(align(128))]
pub struct WorkerStats {
    packets: AtomicU64,
    bytes: AtomicU64,
    batches: AtomicU64,
    ct_created: AtomicU64,
    ct_expired: AtomicU64,
    offloaded: AtomicU64,
    offloaded_flows: AtomicU64,
    direct_routed: AtomicU64,
    busy_ns: AtomicU64,
    updated_ms: AtomicU64,
    /// `clock_ms` when the worker last went round its loop's periodic step (its socket table,
    /// about once a second, idle or busy): a worker whose loop stopped lets it age.
    alive_ms: AtomicU64,
    /// The worker's UMEM: its frames and those on its free list (the rest are lent to the
    /// kernel's rings, in flight, or held for a neighbour), published with its socket table.
    umem_frames: AtomicU64,
    umem_free: AtomicU64,
    reasons: [AtomicU64; Reason::COUNT],
    actions: [AtomicU64; Action::COUNT],
    /// The worker's per-rule policy counts (`PolicyCounts`: the worker writes them in place),
    /// and the generation of that block: handed over again only when the worker grew it.
    policy: Mutex<Arc<[AtomicU64]>>,
    policy_generation: AtomicU64,
}

/// A plain copy of one worker's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerSample {
    pub packets: u64,
    pub bytes: u64,
    pub batches: u64,
    pub ct_created: u64,
    pub ct_expired: u64,
    /// Packets the kernel's fast path moved for the worker's offloaded flows (also in
    /// `packets` and by reason), and those flows now (`crate::offload`).
    pub offloaded: u64,
    pub offloaded_flows: u64,
    /// Packets direct routing sent straight to their egress interface (`crate::direct`).
    pub direct_routed: u64,
    /// Time spent processing batches (not waiting for packets), nanoseconds.
    pub busy_ns: u64,
    /// `clock_ms` of the last publication (0: never).
    pub updated_ms: u64,
    /// Frames of the worker's UMEM, and those on its free list (0 and 0 before its first
    /// socket table).
    pub umem_frames: u64,
    pub umem_free: u64,
    pub reasons: Vec<u64>,
    pub actions: Vec<u64>,
}

impl WorkerSample {
    /// Packets of tracked connections (ct-established, reply-unnat, icmp-related): conntrack
    /// lookups that found their entry.
    pub fn ct_found(&self) -> u64 {
        [Reason::Established, Reason::ReplyUnnat, Reason::IcmpRelated]
            .iter()
            .map(|r| self.reasons[*r as usize])
            .sum()
    }
}

impl WorkerStats {
    fn new() -> WorkerStats {
        WorkerStats {
            packets: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            ct_created: AtomicU64::new(0),
            ct_expired: AtomicU64::new(0),
            offloaded: AtomicU64::new(0),
            offloaded_flows: AtomicU64::new(0),
            direct_routed: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            updated_ms: AtomicU64::new(0),
            // Counted from the start: a worker that never gets going is a stall too.
            alive_ms: AtomicU64::new(clock_ms()),
            umem_frames: AtomicU64::new(0),
            umem_free: AtomicU64::new(0),
            reasons: std::array::from_fn(|_| AtomicU64::new(0)),
            actions: std::array::from_fn(|_| AtomicU64::new(0)),
            policy: Mutex::new(Arc::from([])),
            policy_generation: AtomicU64::new(0),
        }
    }

    /// Publishes a worker's cumulative counters (only that worker calls it).
    pub fn publish(&self, c: &Counters, busy_ns_total: u64, now_ms: u64) {
        self.packets.store(c.packets, Relaxed);
        self.bytes.store(c.bytes, Relaxed);
        self.batches.store(c.batches, Relaxed);
        self.ct_created.store(c.ct_created, Relaxed);
        self.ct_expired.store(c.ct_expired, Relaxed);
        self.offloaded.store(c.offloaded, Relaxed);
        self.offloaded_flows.store(c.offloaded_flows, Relaxed);
        self.direct_routed.store(c.direct_routed, Relaxed);
        self.busy_ns.store(busy_ns_total, Relaxed);
        for (a, v) in self.reasons.iter().zip(c.reasons.iter()) {
            a.store(*v, Relaxed);
        }
        for (a, v) in self.actions.iter().zip(c.actions.iter()) {
            a.store(*v, Relaxed);
        }
        let (cells, generation) = c.policy.cells();
        if self.policy_generation.load(Relaxed) != generation {
            // Only when the worker's block grew (a batch that counted a new rule): rare.
            *self.policy.lock().unwrap_or_else(|e| e.into_inner()) = cells.clone();
            self.policy_generation.store(generation, Relaxed);
        }
        self.updated_ms.store(now_ms, Relaxed);
    }

    /// Adds this worker's policy counts into `sums` (indexed by rule), growing it as needed.
    fn add_policy_counts(&self, sums: &mut Vec<u64>) {
        let cells = self
            .policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if sums.len() < cells.len() {
            sums.resize(cells.len(), 0);
        }
        for (s, c) in sums.iter_mut().zip(cells.iter()) {
            *s += c.load(Relaxed);
        }
    }

    pub fn sample(&self) -> WorkerSample {
        WorkerSample {
            packets: self.packets.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            batches: self.batches.load(Relaxed),
            ct_created: self.ct_created.load(Relaxed),
            ct_expired: self.ct_expired.load(Relaxed),
            offloaded: self.offloaded.load(Relaxed),
            offloaded_flows: self.offloaded_flows.load(Relaxed),
            direct_routed: self.direct_routed.load(Relaxed),
            busy_ns: self.busy_ns.load(Relaxed),
            updated_ms: self.updated_ms.load(Relaxed),
            umem_frames: self.umem_frames.load(Relaxed),
            umem_free: self.umem_free.load(Relaxed),
            reasons: self.reasons.iter().map(|a| a.load(Relaxed)).collect(),
            actions: self.actions.iter().map(|a| a.load(Relaxed)).collect(),
        }
    }
}

/// Events a worker's ring holds; older ones are overwritten (the reader counts them as lost).
pub const RING_EVENTS: usize = 1024;

const WORDS: usize = 11;

/// Bytes of each packet a hex-dumping monitor gets.
pub const FRAME_BYTES: usize = 128;
const FRAME_WORDS: usize = FRAME_BYTES / 8;

/// One monitored verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub worker: usize,
    pub at_ms: u64,
    pub verdict: Verdict,
    /// The frame's length on the wire, and its first `min(len, FRAME_BYTES)` bytes (`len` 0: not
    /// captured).
    pub frame_len: u32,
    pub frame: [u8; FRAME_BYTES],
}

impl Event {
    /// The captured bytes (empty when none were).
    pub fn frame(&self) -> &[u8] {
        &self.frame[..(self.frame_len as usize).min(FRAME_BYTES)]
    }
}

/// Single-writer ring of verdicts with a sequence number per slot (a seqlock made of atomics).
struct Ring {
    /// Events ever pushed.
    head: AtomicU64,
    /// Per slot: 2 × (event number + 1) when complete, odd while being written.
    seqs: Box<[AtomicU64]>,
    words: Box<[[AtomicU64; WORDS]]>,
    /// Per slot: the frame's length, then its first bytes.
    frames: Box<[(AtomicU64, [AtomicU64; FRAME_WORDS])]>,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            head: AtomicU64::new(0),
            seqs: (0..RING_EVENTS).map(|_| AtomicU64::new(0)).collect(),
            words: (0..RING_EVENTS)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            frames: (0..RING_EVENTS)
                .map(|_| {
                    (
                        AtomicU64::new(0),
                        std::array::from_fn(|_| AtomicU64::new(0)),
                    )
                })
                .collect(),
        }
    }

    fn push(&self, v: &Verdict, at_ms: u64, frame: Option<&[u8]>) {
        let n = self.head.load(Relaxed);
        let slot = (n as usize) % RING_EVENTS;
        let seq = &self.seqs[slot];
        seq.store(2 * (n + 1) - 1, std::sync::atomic::Ordering::Release);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        let w = encode(v, at_ms);
        for (a, x) in self.words[slot].iter().zip(w) {
            a.store(x, Relaxed);
        }
        let (len, bytes) = &self.frames[slot];
        len.store(frame.map_or(0, |f| f.len() as u64), Relaxed);
        if let Some(f) = frame {
            for (a, chunk) in bytes.iter().zip(f.chunks(8)) {
                let mut b = [0u8; 8];
                b[..chunk.len()].copy_from_slice(chunk);
                a.store(u64::from_le_bytes(b), Relaxed);
            }
        }
        seq.store(2 * (n + 1), std::sync::atomic::Ordering::Release);
        self.head.store(n + 1, std::sync::atomic::Ordering::Release);
    }

    /// Event number `n`, if still in the ring and not being overwritten.
    fn read(&self, n: u64) -> Option<(Verdict, u64, u32, [u8; FRAME_BYTES])> {
        let slot = (n as usize) % RING_EVENTS;
        let seq = &self.seqs[slot];
        let before = seq.load(std::sync::atomic::Ordering::Acquire);
        if before != 2 * (n + 1) {
            return None;
        }
        let w: [u64; WORDS] = std::array::from_fn(|i| self.words[slot][i].load(Relaxed));
        let (len, bytes) = &self.frames[slot];
        let frame_len = len.load(Relaxed) as u32;
        let mut frame = [0u8; FRAME_BYTES];
        if frame_len > 0 {
            for (chunk, a) in frame.chunks_mut(8).zip(bytes.iter()) {
                chunk.copy_from_slice(&a.load(Relaxed).to_le_bytes());
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        if seq.load(Relaxed) != before {
            return None;
        }
        let (v, at_ms) = decode(&w);
        Some((v, at_ms, frame_len, frame))
    }
}

fn encode(v: &Verdict, at_ms: u64) -> [u64; WORDS] {
    let a = |x: &Addr| {
        let u = x.as_u128();
        [(u >> 64) as u64, u as u64]
    };
    let [s0, s1] = a(&v.orig_src);
    let [d0, d1] = a(&v.orig_dst);
    let [t0, t1] = a(&v.src);
    let [u0, u1] = a(&v.dst);
    let ports = v.orig_sport as u64
        | (v.orig_dport as u64) << 16
        | (v.sport as u64) << 32
        | (v.dport as u64) << 48;
    let meta = v.action as u64
        | (v.reason as u64) << 8
        | (v.proto.0 as u64) << 16
        | (matches!(v.family, Family::V6) as u64) << 24
        | (v.masq as u64) << 25
        | (v.has_addrs as u64) << 26
        | (v.service_id as u64) << 32;
    [s0, s1, d0, d1, t0, t1, u0, u1, ports, meta, at_ms]
}

// `..Verdict::default()` keeps this compiling when Verdict grows fields the monitor ignores.
#[allow(clippy::needless_update)]
fn decode(w: &[u64; WORDS]) -> (Verdict, u64) {
    let addr = |h: u64, l: u64| Addr((((h as u128) << 64) | l as u128).to_be_bytes());
    let meta = w[9];
    let reason = Reason::ALL
        .get(((meta >> 8) & 0xff) as usize)
        .copied()
        .unwrap_or_default();
    let action = Action::ALL
        .get((meta & 0xff) as usize)
        .copied()
        .unwrap_or_default();
    let v = Verdict {
        action,
        reason,
        has_addrs: meta >> 26 & 1 == 1,
        family: if meta >> 24 & 1 == 1 {
            Family::V6
        } else {
            Family::V4
        },
        proto: IpProto((meta >> 16) as u8),
        orig_src: addr(w[0], w[1]),
        client: addr(w[0], w[1]),
        orig_sport: w[8] as u16,
        orig_dst: addr(w[2], w[3]),
        orig_dport: (w[8] >> 16) as u16,
        src: addr(w[4], w[5]),
        sport: (w[8] >> 32) as u16,
        dst: addr(w[6], w[7]),
        dport: (w[8] >> 48) as u16,
        masq: meta >> 25 & 1 == 1,
        service_id: (meta >> 32) as u32,
        // Fields the monitor does not show are not carried.
        ..Verdict::default()
    };
    (v, w[10])
}

/// One AF_XDP socket as its worker last read it: the kernel's counters of frames lost before
/// kxdp saw them (`XDP_STATISTICS`, read every [`SOCKET_STATS_PERIOD`] off the packet path)
/// and the socket's ring sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SocketSample {
    pub worker: usize,
    /// The interface's name when the socket was opened.
    pub interface: String,
    pub ifindex: u32,
    pub queue: u32,
    pub rings: RingSizes,
    pub kernel: KernelXskStats,
}

/// kxdp's tap (`podInterception: tap`): the frames the kernel dropped on their way to a worker
/// because the tap's queue for it was full (the tap's `tx_dropped`, cumulative; read by the
/// workers with their sockets' counters). Like a socket's `rx_ring_full`, these never reached
/// kxdp: no verdict, no reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TapSample {
    pub interface: String,
    pub queue_full: u64,
}

/// How often a worker reads its sockets' kernel counters (one `getsockopt` per socket).
pub const SOCKET_STATS_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Every worker's published state.
pub struct DataplaneStats {
    workers: Box<[WorkerStats]>,
    /// Per worker: its sockets, replaced whole by that worker about once a second (a lock taken
    /// off the packet path by the worker, and by readers at scrape time).
    sockets: Box<[Mutex<Vec<SocketSample>>]>,
    /// The tap's drops (device-wide: every worker with a queue publishes what it read).
    tap: Mutex<Option<TapSample>>,
    rings: Box<[Ring]>,
    monitors: AtomicUsize,
    /// Attached monitors that want every verdict, not only drops and rejects.
    monitors_all: AtomicUsize,
    /// Attached monitors that want the packets' bytes.
    monitors_hex: AtomicUsize,
}

impl DataplaneStats {
    pub fn new(workers: usize) -> DataplaneStats {
        DataplaneStats {
            workers: (0..workers).map(|_| WorkerStats::new()).collect(),
            sockets: (0..workers).map(|_| Mutex::new(Vec::new())).collect(),
            tap: Mutex::new(None),
            rings: (0..workers).map(|_| Ring::new()).collect(),
            monitors: AtomicUsize::new(0),
            monitors_all: AtomicUsize::new(0),
            monitors_hex: AtomicUsize::new(0),
        }
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    pub fn worker(&self, i: usize) -> &WorkerStats {
        &self.workers[i]
    }

    /// What a worker calls after each batch: publishes its counters (cumulative, as the
    /// pipeline keeps them), adds `busy_ns` to its busy time, and, while a monitor is attached,
    /// records the batch's drops and rejects.
    pub fn after_batch(
        &self,
        worker: usize,
        counters: &Counters,
        verdicts: &[Verdict],
        busy_ns: u64,
        now_ms: u64,
    ) {
        self.after_batch_with_frames(worker, counters, verdicts, &|_| None, busy_ns, now_ms)
    }

    /// Whether a `--hex` monitor listens: a worker whose frames are rewritten in place copies
    /// each packet's first [`FRAME_BYTES`] before the pipeline only then.
    pub fn wants_frames(&self) -> bool {
        self.monitors_hex.load(Relaxed) != 0
    }

    /// Whether a monitor of every verdict listens: then no flow takes the kernel's fast path,
    /// where its packets would not be seen (`crate::offload`).
    pub fn wants_all_verdicts(&self) -> bool {
        self.monitors_all.load(Relaxed) != 0
    }

    /// `after_batch`, with the batch's frames (`frame(i)`: packet `i` as received) for monitors
    /// that asked for hex dumps. `frame` is called only while such a monitor is attached.
    pub fn after_batch_with_frames<'f>(
        &self,
        worker: usize,
        counters: &Counters,
        verdicts: &[Verdict],
        frame: &dyn Fn(usize) -> Option<&'f [u8]>,
        busy_ns: u64,
        now_ms: u64,
    ) {
        let w = &self.workers[worker];
        let busy = w.busy_ns.load(Relaxed) + busy_ns;
        w.publish(counters, busy, now_ms);
        if self.monitors.load(Relaxed) != 0 {
            let ring = &self.rings[worker];
            let all = self.monitors_all.load(Relaxed) != 0;
            let hex = self.monitors_hex.load(Relaxed) != 0;
            for (i, v) in verdicts.iter().enumerate() {
                if all || matches!(v.action, Action::Drop | Action::Reject) {
                    ring.push(v, now_ms, if hex { frame(i) } else { None });
                }
            }
        }
    }

    pub fn samples(&self) -> Vec<WorkerSample> {
        self.workers.iter().map(|w| w.sample()).collect()
    }

    /// New connections per policy rule (index into `PolicyTables::rules`) that decided them,
    /// summed over the workers, as last published; rules past the end counted none.
    pub fn policy_counts(&self) -> Vec<u64> {
        let mut sums = Vec::new();
        for w in self.workers.iter() {
            w.add_policy_counts(&mut sums);
        }
        sums
    }

    /// Replaces worker `worker`'s socket table (only that worker calls it, periodically and
    /// when its sockets change). `fill` writes the rows into the table's own vector, whose
    /// capacity is kept.
    pub fn publish_sockets(&self, worker: usize, fill: impl FnOnce(&mut Vec<SocketSample>)) {
        let Some(slot) = self.sockets.get(worker) else {
            return;
        };
        let mut v = slot.lock().unwrap_or_else(|e| e.into_inner());
        v.clear();
        fill(&mut v);
        self.workers[worker].alive_ms.store(clock_ms(), Relaxed);
    }

    /// Publishes what a worker read of the tap's drops (the highest reading stays: the workers
    /// read the same device-wide counter at different times).
    pub fn publish_tap(&self, interface: &str, queue_full: u64) {
        let mut t = self.tap.lock().unwrap_or_else(|e| e.into_inner());
        match t.as_mut() {
            Some(t) if t.interface == interface => t.queue_full = t.queue_full.max(queue_full),
            _ => {
                *t = Some(TapSample {
                    interface: interface.to_string(),
                    queue_full,
                })
            }
        }
    }

    /// The tap's drops, once a worker with a tap queue has published them.
    pub fn tap_sample(&self) -> Option<TapSample> {
        self.tap.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Publishes worker `worker`'s UMEM occupancy: `frames` in all, `free` on its free list
    /// (only that worker calls it, with its socket table).
    pub fn publish_umem(&self, worker: usize, frames: u64, free: u64) {
        if let Some(w) = self.workers.get(worker) {
            w.umem_frames.store(frames, Relaxed);
            w.umem_free.store(free, Relaxed);
        }
    }

    /// The workers whose loop has not come round for longer than `after_ms` (they publish
    /// their socket table about once a second, idle or busy), with how long, in ms.
    pub fn stalled(&self, after_ms: u64) -> Vec<(usize, u64)> {
        let now = clock_ms();
        self.workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let age = now.saturating_sub(w.alive_ms.load(Relaxed));
                (age > after_ms).then_some((i, age))
            })
            .collect()
    }

    /// Every worker's sockets, by interface name and queue.
    pub fn socket_samples(&self) -> Vec<SocketSample> {
        let mut all: Vec<SocketSample> = self
            .sockets
            .iter()
            .flat_map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect();
        all.sort_by(|a, b| (&a.interface, a.queue).cmp(&(&b.interface, b.queue)));
        all
    }

    /// Starts recording events for a reader; recording stops when the last one is dropped.
    pub fn monitor(&self) -> Monitor<'_> {
        self.monitor_with(false, false)
    }

    /// `monitor`, recording every verdict (`all`) rather than drops and rejects only, and the
    /// packets' first bytes (`hex`) where workers hand them over.
    pub fn monitor_with(&self, all: bool, hex: bool) -> Monitor<'_> {
        if all {
            self.monitors_all.fetch_add(1, Relaxed);
        }
        if hex {
            self.monitors_hex.fetch_add(1, Relaxed);
        }
        self.monitors.fetch_add(1, Relaxed);
        Monitor {
            all,
            hex,
            stats: self,
            cursors: self
                .rings
                .iter()
                .map(|r| r.head.load(std::sync::atomic::Ordering::Acquire))
                .collect(),
            lost: 0,
        }
    }
}

/// A reader of the event rings (see `DataplaneStats::monitor`).
pub struct Monitor<'a> {
    stats: &'a DataplaneStats,
    all: bool,
    hex: bool,
    cursors: Vec<u64>,
    /// Events overwritten before this reader got to them.
    pub lost: u64,
}

impl Monitor<'_> {
    /// Appends the events recorded since the last poll to `out`.
    pub fn poll(&mut self, out: &mut Vec<Event>) {
        for (worker, ring) in self.stats.rings.iter().enumerate() {
            let head = ring.head.load(std::sync::atomic::Ordering::Acquire);
            let cur = &mut self.cursors[worker];
            if head.saturating_sub(*cur) > RING_EVENTS as u64 {
                let start = head - RING_EVENTS as u64;
                self.lost += start - *cur;
                *cur = start;
            }
            while *cur < head {
                match ring.read(*cur) {
                    // Bytes recorded for another (`--hex`) reader are not this one's to show.
                    Some((verdict, at_ms, frame_len, frame)) => out.push(Event {
                        worker,
                        at_ms,
                        verdict,
                        frame_len: if self.hex { frame_len } else { 0 },
                        frame,
                    }),
                    None => self.lost += 1,
                }
                *cur += 1;
            }
        }
    }
}

impl Drop for Monitor<'_> {
    fn drop(&mut self) {
        if self.all {
            self.stats.monitors_all.fetch_sub(1, Relaxed);
        }
        if self.hex {
            self.stats.monitors_hex.fetch_sub(1, Relaxed);
        }
        self.stats.monitors.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umem_occupancy_per_worker() {
        let s = DataplaneStats::new(2);
        assert_eq!(
            (s.samples()[1].umem_frames, s.samples()[1].umem_free),
            (0, 0)
        );
        s.publish_umem(1, 8192, 8000);
        s.publish_umem(5, 1, 1); // no such worker: ignored
        let w = &s.samples()[1];
        assert_eq!((w.umem_frames, w.umem_free), (8192, 8000));
        assert_eq!(s.samples()[0].umem_frames, 0);
    }

    #[test]
    fn policy_counts_are_summed_over_workers_and_follow_growth() {
        use crate::policy::Tally;
        let s = DataplaneStats::new(2);
        assert!(s.policy_counts().is_empty());
        let (mut a, mut b) = (Counters::default(), Counters::default());
        a.policy.rule(3);
        b.policy.rule(3);
        b.policy.rule(1);
        s.after_batch(0, &a, &[], 1, 1);
        s.after_batch(1, &b, &[], 1, 1);
        assert_eq!(s.policy_counts()[..4], [0, 1, 0, 2]);
        // Counted in place after publication; a grown block is handed over again.
        a.policy.rule(3);
        a.policy.rule(500);
        assert_eq!(s.policy_counts()[..4], [0, 1, 0, 3]);
        s.after_batch(0, &a, &[], 1, 2);
        let sums = s.policy_counts();
        assert_eq!((sums[3], sums[500]), (3, 1));
    }

    #[test]
    fn counters_and_events() {
        let s = DataplaneStats::new(2);
        let mut c = Counters {
            packets: 5,
            ..Counters::default()
        };
        c.reasons[Reason::Established as usize] = 3;
        let mut v = Verdict::default();
        v.set(Reason::NoEndpoints);
        v.has_addrs = true;
        v.proto = IpProto::TCP;
        v.orig_dport = 80;
        v.service_id = 7;
        s.after_batch(1, &c, &[v], 1000, 5);
        assert_eq!(s.samples()[1].packets, 5);
        assert_eq!(s.samples()[1].ct_found(), 3);
        assert_eq!(s.samples()[1].busy_ns, 1000);
        let mut m = s.monitor();
        s.after_batch(1, &c, &[v, Verdict::default()], 1000, 6);
        let mut out = Vec::new();
        m.poll(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].verdict, v);
        assert_eq!(out[0].at_ms, 6);
        assert_eq!(s.samples()[1].busy_ns, 2000);
        for _ in 0..RING_EVENTS + 10 {
            s.after_batch(0, &c, &[v], 1, 7);
        }
        out.clear();
        m.poll(&mut out);
        assert_eq!(out.len(), RING_EVENTS);
        assert_eq!(m.lost, 10);
        drop(m);
        assert_eq!(s.monitors.load(Relaxed), 0);
    }

    #[test]
    fn all_verdicts_and_frames_on_request() {
        let s = DataplaneStats::new(1);
        let c = Counters::default();
        let mut fwd = Verdict::default();
        fwd.set(Reason::ServiceDnat);
        let mut drop = Verdict::default();
        drop.set(Reason::Malformed);
        let frames: [&[u8]; 2] = [&[1, 2, 3], &[9; 200]];
        let frame = |i: usize| frames.get(i).copied();
        let mut drops_only = s.monitor();
        let mut all = s.monitor_with(true, true);
        s.after_batch_with_frames(0, &c, &[fwd, drop], &frame, 1, 5);
        let mut out = Vec::new();
        all.poll(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].verdict.reason, Reason::ServiceDnat);
        assert_eq!(out[0].frame(), &[1, 2, 3]);
        assert_eq!(out[1].frame_len, 200);
        assert_eq!(out[1].frame(), &[9; FRAME_BYTES]);
        // The drops-only reader sees what the ring holds; it filters on its side.
        out.clear();
        drops_only.poll(&mut out);
        assert_eq!(out.len(), 2);
        assert!(
            out.iter().all(|e| e.frame_len == 0),
            "bytes recorded for the hex reader are not shown to this one"
        );
        drop_all(all);
        s.after_batch_with_frames(0, &c, &[fwd, drop], &frame, 1, 6);
        out.clear();
        drops_only.poll(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].frame_len, 0, "no hex monitor: no bytes copied");
    }

    fn drop_all(m: Monitor<'_>) {
        drop(m);
    }

    #[test]
    fn socket_tables_replaced_per_worker_and_listed_by_interface() {
        let s = DataplaneStats::new(2);
        let row = |worker, interface: &str, queue, full| SocketSample {
            worker,
            interface: interface.into(),
            ifindex: 7,
            queue,
            rings: RingSizes::all(2048),
            kernel: KernelXskStats {
                rx_ring_full: full,
                ..KernelXskStats::default()
            },
        };
        s.publish_sockets(1, |v| {
            v.extend([row(1, "vpod1", 1, 3), row(1, "eth0", 1, 0)])
        });
        s.publish_sockets(0, |v| v.push(row(0, "eth0", 0, 5)));
        let all = s.socket_samples();
        let keys: Vec<(&str, u32)> = all
            .iter()
            .map(|x| (x.interface.as_str(), x.queue))
            .collect();
        assert_eq!(keys, [("eth0", 0), ("eth0", 1), ("vpod1", 1)]);
        // A worker's next publication replaces its rows (a closed socket disappears).
        s.publish_sockets(1, |v| v.push(row(1, "eth0", 1, 9)));
        let all = s.socket_samples();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].kernel.rx_ring_full, 9);
        // A worker index out of range is ignored, not a panic.
        s.publish_sockets(5, |v| v.push(row(5, "x", 0, 0)));
        assert_eq!(s.socket_samples().len(), 2);
    }

    #[test]
    fn the_tap_keeps_its_highest_reading() {
        let s = DataplaneStats::new(2);
        assert_eq!(s.tap_sample(), None);
        // Two workers read the device-wide counter at different times.
        s.publish_tap("kxdptap0", 7);
        s.publish_tap("kxdptap0", 5);
        assert_eq!(s.tap_sample().map(|t| t.queue_full), Some(7));
        s.publish_tap("kxdptap0", 9);
        assert_eq!(s.tap_sample().map(|t| t.queue_full), Some(9));
        // Another tap (a restart with another name) starts over.
        s.publish_tap("pods0", 1);
        let t = s.tap_sample().unwrap();
        assert_eq!((t.interface.as_str(), t.queue_full), ("pods0", 1));
    }
}
