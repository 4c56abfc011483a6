//! Replay: a capture, preloaded in memory, pushed through the same pipeline the AF_XDP workers
//! run, as fast as it goes.
//!
//! Each worker thread owns the packets of the clients assigned to it: both directions of every
//! connection (a sequential dry run before the clock starts learns which connection a NATed reply
//! belongs to) and all connections of one client, in capture order, so verdicts do not depend on
//! thread timing. Clients are assigned so that every epoch (below) splits evenly among the
//! workers ([`balance_clients`]): the workers wait for each other at every epoch's end, so an
//! epoch lasts as long as its largest share (a hash of the client left that share ~2.5 % above
//! an even split at 1,000 packets an epoch). A worker copies its packets batch by batch into its
//! own UMEM, as the kernel copies received frames into a socket's (copy mode), and hands them to
//! the pipeline as the workers do (`UmemBatch`): the replay runs the workers' own instance of
//! `Pipeline::process`, so it measures, and a profile-guided build learns, the code `kxdp run`
//! runs.
//! Conntrack is shared, exactly as in `kxdp run`. Time is the capture's: the capture is cut into
//! batches once (at most `BATCH` packets, never more than `MAX_BATCH_SPAN_MS` of capture time, a
//! table update starts a new one), and a batch runs at the timestamp of its first packet (in
//! milliseconds, the conntrack clock's unit). Consecutive batches that run at the same
//! millisecond form an *epoch*: every worker handles its packets of epoch k at that time, in
//! batches of its own, and waits for the others before epoch k+1 (lockstep). So a connection's
//! expiry, the expiry scan and early drops see the same clock in every worker, and verdicts do
//! not depend on the worker count even when the table is under pressure (without the lockstep a
//! worker ran seconds of capture time ahead and expired or evicted what another still
//! used). Every packet runs at exactly the clock it would with a barrier per batch; the barrier is
//! only as frequent as the clock moves (about once per 1,000 packets at a packet per
//! microsecond, instead of once per 64), so workers scale.
//!
//! A full table is the exception: which entry early drop evicts for a new connection depends on
//! where entries sit in the slab and the index, and on which inserts of a batch come first — so
//! on how the workers' inserts interleave (305 of 12,000 verdicts differed). The
//! sequential dry run that steers packets (below) sees the table's peak occupancy; a capture
//! that brings the table within [`pressure_margin`] of full is replayed by one worker, so its
//! verdicts are exactly those of `--workers 1` at any table pressure, and every other capture
//! keeps all its workers ([`ReplayResult::workers`] says how many ran).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use kxdp_packet::pcap::Capture;
use kxdp_packet::Addr;

use crate::conntrack::{Conntrack, CtConfig, TableMemory};
use crate::io::UmemBatch;
use crate::pipeline::{copy_frame, Counters, Pipeline};
use crate::snapshot::Snapshot;
use crate::verdict::{Action, Verdict};
use kxdp_kernel::afxdp::{Desc, Umem};
use std::io;

/// Frames per batch: what one AF_XDP RX burst typically delivers.
pub const BATCH: usize = 64;

/// Packets a worker handles between two additions to the shared progress count.
const PROGRESS_STEP: u64 = 16 * 1024;

/// A batch never mixes packets further apart in capture time than this.
const MAX_BATCH_SPAN_MS: u64 = 100;

/// Where the replay clock starts, so that "expires at 0" never looks fresh.
const CLOCK_START_MS: u64 = 1_000;

pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

#[derive(Clone)]
pub struct ReplayOptions {
    pub workers: usize,
    pub repeat: u32,
    pub seed: u64,
    /// Keep per-packet verdicts and output frames of the first pass.
    pub record: bool,
    /// Called about ten times a second with (packets done, packets total).
    pub progress: Option<Progress>,
    /// New tables taking effect at capture timestamps (sorted), as a control plane would publish
    /// them: from `at_ns` on, packets see `snapshot`, and UDP connections it no longer supports
    /// are deleted and TCP connections of removed endpoints marked (`stale::reconcile`). Every
    /// pass starts from the initial snapshot.
    pub updates: Vec<StateUpdate>,
    /// Run the egress stage after the pipeline against these routes (`kxdp replay --routes`),
    /// as the daemon's workers do: verdicts then carry egress drops and the egress interface,
    /// output frames their new MACs and TTL. None: the pipeline only.
    pub routes: Option<Arc<ReplayRoutes>>,
    /// Keep the conntrack table in a state file made at this path (`kxdp replay
    /// --conntrack-file`), as `kxdp run` with `conntrack.stateFile` does, rather than in process
    /// memory: where the file lives decides its pages (docs/benchmarks.md, "The state file in
    /// huge pages"). The path must not exist; the file is removed at the end.
    pub conntrack_file: Option<std::path::PathBuf>,
}

/// A FIB given in a file and the interfaces kxdp is taken to send on.
pub struct ReplayRoutes {
    pub fib: crate::fib::Fib,
    pub egress: crate::egress::Egress,
}

/// Tables published during a replay.
#[derive(Clone)]
pub struct StateUpdate {
    pub at_ns: u64,
    pub snapshot: Arc<Snapshot>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            workers: 1,
            repeat: 1,
            seed: 0,
            record: true,
            progress: None,
            updates: Vec::new(),
            routes: None,
            conntrack_file: None,
        }
    }
}

#[derive(Debug, Default)]
pub struct ReplayResult {
    pub packets: u64,
    pub seconds: f64,
    pub actions: [u64; Action::COUNT],
    pub reasons: Vec<u64>,
    /// First pass, input order (empty without `record`).
    pub verdicts: Vec<Verdict>,
    /// First pass, input order: the frame as it leaves (forwarded, or the reject reply); None for
    /// dropped and passed packets (empty without `record`).
    pub output: Vec<Option<Vec<u8>>>,
    pub counters: Counters,
    /// Live conntrack entries at the end.
    pub conntrack_entries: u32,
    /// Workers that ran: the ones asked for, or 1 when the capture fills the conntrack table
    /// (see the module docs).
    pub workers: usize,
    /// Where the conntrack table lived, and how much of it in huge pages (taken at the end).
    pub table_memory: TableMemory,
}

impl ReplayResult {
    pub fn mpps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.packets as f64 / self.seconds / 1e6
        } else {
            0.0
        }
    }

    pub fn ns_per_packet(&self) -> f64 {
        if self.packets > 0 {
            self.seconds * 1e9 / self.packets as f64
        } else {
            0.0
        }
    }
}

/// A worker's share of the capture and what it recorded.
struct WorkerOut {
    counters: Counters,
    recorded: Vec<(u32, Verdict, Option<Vec<u8>>)>,
}

/// Replays `capture` through `opts.workers` pipelines (the module docs). Fails when a worker's
/// UMEM cannot be mapped (`Umem::in_memory`: no memory, or no memfd), and with
/// `opts.conntrack_file` when the table's file cannot be made (it exists, or its directory does
/// not) or removed.
pub fn replay(
    snapshot: Arc<Snapshot>,
    ct_config: CtConfig,
    capture: &Capture,
    opts: &ReplayOptions,
) -> io::Result<ReplayResult> {
    let mut workers = opts.workers.max(1);
    let repeat = opts.repeat.max(1);
    let n = capture.packets.len();
    let total = n as u64 * repeat as u64;

    // Steering, done before the clock starts.
    let shares = if workers == 1 {
        vec![(0..n as u32).collect()]
    } else {
        let (shares, peak) = steer_by_client(
            &snapshot,
            &opts.updates,
            &ct_config,
            capture,
            opts.seed,
            workers,
        )?;
        if near_full(peak, &ct_config) {
            workers = 1;
            vec![(0..n as u32).collect()]
        } else {
            shares
        }
    };
    let ct = match &opts.conntrack_file {
        None => Conntrack::new(ct_config.clone(), workers),
        Some(path) => table_file(path, &ct_config, workers)?,
    };
    // Each worker's frames, made before any thread starts (a failure is the replay's error).
    let slot_size = slot_size_for(capture);
    let mut frames = (0..workers)
        .map(|_| ReplayFrames::new(slot_size))
        .collect::<io::Result<Vec<_>>>()?;

    let epochs = cut_epochs(capture, &opts.updates);
    let lockstep = SpinBarrier::new(workers);
    let done = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let barrier = Barrier::new(workers + 1);
    let mut outs: Vec<WorkerOut> = Vec::with_capacity(workers);
    let mut seconds = 0.0;

    std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .iter()
            .zip(frames.drain(..))
            .enumerate()
            .map(|(w, (share, mut frames))| {
                let (ct, snapshot, barrier, done, finished) =
                    (&ct, &snapshot, &barrier, &done, &finished);
                let (epochs, lockstep) = (&epochs, &lockstep);
                scope.spawn(move || {
                    let _poison = PoisonOnPanic(lockstep);
                    let mut pipeline = Pipeline::new(w, capture.link, opts.seed, ct);
                    let mut recorded =
                        Vec::with_capacity(if opts.record { share.len() } else { 0 });
                    let clock = Clock::new(capture);
                    let share = Share::new(capture, share);
                    // Progress is published in steps: an add per batch to the one counter all
                    // workers share moved its cache line between them every 64 packets.
                    let mut unpublished = 0u64;
                    barrier.wait();
                    drive(
                        &mut pipeline,
                        ct,
                        snapshot,
                        &opts.updates,
                        opts.routes.as_deref(),
                        &share,
                        &clock,
                        Lockstep {
                            epochs,
                            barrier: lockstep,
                            leader: w == 0,
                        },
                        repeat,
                        &mut frames,
                        |pass, idx, verdicts, frames| {
                            if opts.record && pass == 0 {
                                for (j, v) in verdicts.iter().enumerate() {
                                    // What leaves: forwarded packets and replies, and with the
                                    // egress stage also passes it hands to the kernel port.
                                    let out =
                                        (matches!(v.action, Action::Forward | Action::Reject)
                                            || v.egress != 0)
                                            .then(|| frames.frame(j).to_vec());
                                    recorded.push((idx[j], *v, out));
                                }
                            }
                            unpublished += idx.len() as u64;
                            if opts.progress.is_some() && unpublished >= PROGRESS_STEP {
                                done.fetch_add(unpublished, Ordering::Relaxed);
                                unpublished = 0;
                            }
                        },
                    );
                    pipeline.flush_conntrack(ct);
                    done.fetch_add(unpublished, Ordering::Relaxed);
                    finished.fetch_add(1, Ordering::Release);

                    WorkerOut {
                        counters: pipeline.counters,
                        recorded,
                    }
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        if let Some(progress) = &opts.progress {
            while finished.load(Ordering::Acquire) < workers {
                std::thread::sleep(std::time::Duration::from_millis(100));
                progress(done.load(Ordering::Relaxed), total);
            }
        }
        for h in handles {
            outs.push(h.join().expect("replay worker panicked"));
        }
        seconds = started.elapsed().as_secs_f64();
        if let Some(progress) = &opts.progress {
            progress(total, total);
        }
    });

    let mut counters = Counters::default();
    let mut verdicts = Vec::new();
    let mut output = Vec::new();
    if opts.record {
        verdicts = vec![Verdict::default(); n];
        output = vec![None; n];
    }
    for o in outs {
        counters.add(&o.counters);
        for (i, v, out) in o.recorded {
            verdicts[i as usize] = v;
            output[i as usize] = out;
        }
    }
    let result = ReplayResult {
        packets: counters.packets,
        seconds,
        actions: counters.actions,
        reasons: counters.reasons.to_vec(),
        verdicts,
        output,
        workers,
        conntrack_entries: ct.len(),
        counters,
        table_memory: ct.memory(),
    };
    if let Some(path) = ct.state_path() {
        // The table is this replay's alone (`table_file`): its file goes with it.
        std::fs::remove_file(path)?;
    }
    Ok(result)
}

/// A fresh conntrack table in a state file at `path`, which must not exist (a replay never
/// continues, nor clobbers, another table: a running kxdp's state file included).
fn table_file(path: &std::path::Path, config: &CtConfig, workers: usize) -> io::Result<Conntrack> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    match Conntrack::open_file(path, config.clone(), workers) {
        Ok((ct, _)) => Ok(ct),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

/// The capture's clock: a batch runs at its first packet's timestamp (milliseconds, from
/// `CLOCK_START_MS`), later passes continue after the capture's span.
struct Clock {
    first_ts: u64,
    pass_span_ms: u64,
}

impl Clock {
    fn new(capture: &Capture) -> Clock {
        let first_ts = capture.packets.iter().map(|p| p.ts_ns).min().unwrap_or(0);
        let last_ts = capture.packets.iter().map(|p| p.ts_ns).max().unwrap_or(0);
        Clock {
            first_ts,
            pass_span_ms: (last_ts - first_ts) / 1_000_000 + 1,
        }
    }

    fn at(&self, ts_ns: u64, pass: u32) -> u64 {
        CLOCK_START_MS
            + ts_ns.saturating_sub(self.first_ts) / 1_000_000
            + pass as u64 * self.pass_span_ms
    }
}

/// A worker's packets, copied out of the capture into one contiguous buffer before the clock
/// starts: reading them back in order is then a sequential stream the CPU prefetches (the capture
/// holds each packet in its own allocation).
struct Share {
    data: Vec<u8>,
    spans: Vec<(usize, usize)>,
    ts: Vec<u64>,
    index: Vec<u32>,
}

impl Share {
    fn new(capture: &Capture, indexes: &[u32]) -> Share {
        let total = indexes
            .iter()
            .map(|&i| capture.packets[i as usize].data.len())
            .sum();
        let mut share = Share {
            data: Vec::with_capacity(total),
            spans: Vec::with_capacity(indexes.len()),
            ts: Vec::with_capacity(indexes.len()),
            index: indexes.to_vec(),
        };
        for &i in indexes {
            let p = &capture.packets[i as usize];
            share.spans.push((share.data.len(), p.data.len()));
            share.data.extend_from_slice(&p.data);
            share.ts.push(p.ts_ns);
        }
        share
    }
}

/// One batch of the whole capture: its packets are the capture's indexes below `end` (and at or
/// above the previous batch's), it runs at `start_ts`, and `updates` table updates take effect
/// before it.
#[derive(Clone, Copy, Debug)]
struct GlobalBatch {
    end: u32,
    start_ts: u64,
    updates: u32,
}

/// Cuts the capture (in capture order) into the batches every worker follows.
fn cut_batches(capture: &Capture, updates: &[StateUpdate]) -> Vec<GlobalBatch> {
    let mut batches = Vec::with_capacity(capture.packets.len() / BATCH + 1);
    let mut next_update = 0;
    let mut k = 0;
    let n = capture.packets.len();
    while k < n {
        let start_ts = capture.packets[k].ts_ns;
        let first_update = next_update;
        while updates
            .get(next_update)
            .is_some_and(|u| u.at_ns <= start_ts)
        {
            next_update += 1;
        }
        let update_ts = updates.get(next_update).map_or(u64::MAX, |u| u.at_ns);
        let mut m = 0;
        while k < n && m < BATCH {
            let ts = capture.packets[k].ts_ns;
            if ts.saturating_sub(start_ts) / 1_000_000 > MAX_BATCH_SPAN_MS
                || (m > 0 && ts >= update_ts)
            {
                break;
            }
            m += 1;
            k += 1;
        }
        batches.push(GlobalBatch {
            end: k as u32,
            start_ts,
            updates: (next_update - first_update) as u32,
        });
    }
    batches
}

/// Consecutive batches of the capture that run at the same clock: the workers meet only between
/// epochs. `clock_ms` is the first pass's clock (pass p runs at `clock_ms + p * pass_span_ms`);
/// `updates` table updates take effect before the epoch, and an update always starts one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Epoch {
    end: u32,
    clock_ms: u64,
    updates: u32,
}

/// Groups the capture's batches ([`cut_batches`]) into epochs. A batch's clock is its first
/// packet's timestamp, never below the previous batch's (capture timestamps may go backwards;
/// the pipeline's clock never does), so every packet keeps the clock it had with one barrier per
/// batch.
fn cut_epochs(capture: &Capture, updates: &[StateUpdate]) -> Vec<Epoch> {
    let clock = Clock::new(capture);
    let mut epochs: Vec<Epoch> = Vec::new();
    let mut floor = 0u64;
    for b in cut_batches(capture, updates) {
        let now = clock.at(b.start_ts, 0).max(floor);
        floor = now;
        match epochs.last_mut() {
            Some(e) if e.clock_ms == now && b.updates == 0 => e.end = b.end,
            _ => epochs.push(Epoch {
                end: b.end,
                clock_ms: now,
                updates: b.updates,
            }),
        }
    }
    epochs
}

/// How a worker keeps in step with the others.
struct Lockstep<'a> {
    epochs: &'a [Epoch],
    barrier: &'a SpinBarrier,
    /// Applies what all workers share (stale UDP flushes on table updates).
    leader: bool,
}

/// Runs `share` (packets in capture order) through `pipeline` (and the egress stage when
/// `routes` are given) `repeat` times, epoch by epoch in step with the other workers, handing
/// every batch's (pass, indexes, verdicts, frames) to `on_batch`.
// Out of line: called once per worker; a build that inlined it into the worker's closure
// lost the function the benchmarks' callgrind figure (`replay::drive` inclusive)
// names.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn drive(
    pipeline: &mut Pipeline,
    ct: &Conntrack,
    snapshot: &Snapshot,
    updates: &[StateUpdate],
    routes: Option<&ReplayRoutes>,
    share: &Share,
    clock: &Clock,
    step: Lockstep,
    repeat: u32,
    frames: &mut ReplayFrames,
    mut on_batch: impl FnMut(u32, &[u32], &[Verdict], &UmemBatch<'_>),
) {
    let mut verdicts = [Verdict::default(); BATCH];
    let mut batch_idx = [0u32; BATCH];
    let mut hops = [crate::egress::NOT_SENT; BATCH];
    let mut egress_stats = crate::egress::EgressStats::default();
    for pass in 0..repeat {
        let mut tables = snapshot;
        let mut next_update = 0;
        let mut k = 0;
        for e in step.epochs {
            if e.updates > 0 {
                // Everyone has finished the previous epoch (the barrier at its end); the leader
                // flushes what the new tables no longer support, then everyone starts this one.
                for _ in 0..e.updates {
                    tables = &updates[next_update].snapshot;
                    next_update += 1;
                    if step.leader {
                        crate::stale::reconcile(ct, tables);
                    }
                }
                step.barrier.wait();
            }
            let now = e.clock_ms + pass as u64 * clock.pass_span_ms;
            // This worker's packets of the epoch (its share is in capture order: `k..end`), in
            // full batches; at least one call, also with no packet, so that the expiry scan
            // keeps its pace. The epoch's end found once, not compared per packet.
            let end = k + share.index[k..].partition_point(|&i| i < e.end);
            loop {
                let m = (end - k).min(BATCH);
                let mut frames = frames.fill(&share.data, &share.spans[k..k + m]);
                batch_idx[..m].copy_from_slice(&share.index[k..k + m]);
                k += m;
                pipeline.decide(&mut frames, &mut verdicts[..m], tables, ct, now);
                if let Some(r) = routes {
                    r.egress.process(
                        &mut frames,
                        &mut verdicts[..m],
                        &mut hops[..m],
                        &r.fib,
                        pipeline.link(),
                        false,
                        Some(&tables.cluster_cidrs),
                        &mut egress_stats,
                        |_, _, _| {},
                    );
                }
                // The batch's final verdicts, counted once.
                pipeline.counters.record(&verdicts[..m]);
                if m > 0 {
                    on_batch(pass, &batch_idx[..m], &verdicts[..m], &frames);
                }
                if m < BATCH || k == end {
                    break;
                }
            }
            step.barrier.wait();
        }
    }
}

/// A barrier for workers that meet every epoch: spins briefly, then yields (std's Barrier parks
/// on a mutex and condition variable, which costs more than a batch at this rate).
struct SpinBarrier {
    parties: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    /// A worker panicked: the others stop waiting for it (and panic too) instead of hanging.
    poisoned: std::sync::atomic::AtomicBool,
}

/// Poisons the barrier when the worker holding it unwinds.
struct PoisonOnPanic<'a>(&'a SpinBarrier);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poisoned.store(true, Ordering::Release);
        }
    }
}

impl SpinBarrier {
    fn new(parties: usize) -> SpinBarrier {
        SpinBarrier {
            parties: parties.max(1),
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            poisoned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn wait(&self) {
        if self.parties == 1 {
            return;
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            assert!(
                !self.poisoned.load(Ordering::Acquire),
                "another replay worker panicked"
            );
            if spins < 64 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Splits the capture among `workers` by the client of the connection each packet belongs to, so
/// that both directions of a connection — also when NAT changed the reply's addresses — and all
/// connections of one client (session affinity) are handled by one worker, in capture order. A
/// sequential dry run, before the clock starts, learns which connection a reply belongs to;
/// [`balance_clients`] then assigns the clients.
fn steer_by_client(
    snapshot: &Snapshot,
    updates: &[StateUpdate],
    ct_config: &CtConfig,
    capture: &Capture,
    seed: u64,
    workers: usize,
) -> io::Result<(Vec<Vec<u32>>, u32)> {
    let ct = Conntrack::new(ct_config.clone(), 1);
    let mut peak = 0u32;
    let mut pipeline = Pipeline::new(0, capture.link, seed, &ct);
    let all = Share::new(
        capture,
        &(0..capture.packets.len() as u32).collect::<Vec<_>>(),
    );
    let mut frames = ReplayFrames::new(slot_size_for(capture))?;
    let mut shares: Vec<Vec<u32>> = vec![Vec::new(); workers];
    let clock = Clock::new(capture);
    let epochs = cut_epochs(capture, updates);
    // Each packet's client, numbered in order of first appearance.
    let mut ids: std::collections::HashMap<u128, u32> = std::collections::HashMap::new();
    let mut client_of = vec![0u32; capture.packets.len()];
    drive(
        &mut pipeline,
        &ct,
        snapshot,
        updates,
        None,
        &all,
        &clock,
        Lockstep {
            epochs: &epochs,
            barrier: &SpinBarrier::new(1),
            leader: true,
        },
        1,
        &mut frames,
        |_, idx, verdicts, _| {
            for (i, v) in idx.iter().zip(verdicts) {
                let client = if v.has_addrs {
                    v.client
                } else {
                    Addr::UNSPECIFIED
                };
                let next = ids.len() as u32;
                client_of[*i as usize] = *ids.entry(client.as_u128()).or_insert(next);
            }
            peak = peak.max(ct.len());
        },
    );
    let owner = balance_clients(&client_of, ids.len(), &epochs, workers);
    for (i, &c) in client_of.iter().enumerate() {
        shares[owner[c as usize] as usize].push(i as u32);
    }
    Ok((shares, peak))
}

/// Assigns each client (`client_of`: every packet's, numbered in order of first appearance) to a
/// worker so that every epoch's packets split as evenly as the clients allow: the workers meet
/// at the end of every epoch, so an epoch lasts as long as its largest share. Greedy, clients in
/// order of first appearance, each to the worker whose epochs it raises least (the least loaded
/// one on a tie); then moves of single clients while they shorten the sum of the epochs' largest
/// shares.
fn balance_clients(
    client_of: &[u32],
    clients: usize,
    epochs: &[Epoch],
    workers: usize,
) -> Vec<u32> {
    // Each client's packets per epoch, in epoch order.
    let mut runs: Vec<Vec<(u32, u32)>> = vec![Vec::new(); clients];
    let mut start = 0usize;
    for (k, e) in epochs.iter().enumerate() {
        for &c in &client_of[start..e.end as usize] {
            let r = &mut runs[c as usize];
            match r.last_mut() {
                Some((ep, n)) if *ep == k as u32 => *n += 1,
                _ => r.push((k as u32, 1)),
            }
        }
        start = e.end as usize;
    }
    let mut load = vec![0u32; epochs.len() * workers];
    let mut owner = vec![0u32; clients];
    // How much adding `n` packets to worker `w` raises epoch `e`'s largest share.
    let raise = |load: &[u32], e: usize, w: usize, n: u32| {
        let l = &load[e * workers..(e + 1) * workers];
        let max = *l.iter().max().unwrap_or(&0);
        (l[w] + n).saturating_sub(max) as u64
    };
    for (c, r) in runs.iter().enumerate() {
        let mut best = (u64::MAX, u64::MAX, 0usize);
        for w in 0..workers {
            let (mut up, mut level) = (0u64, 0u64);
            for &(e, n) in r {
                up += raise(&load, e as usize, w, n);
                level += load[e as usize * workers + w] as u64;
            }
            if (up, level) < (best.0, best.1) {
                best = (up, level, w);
            }
        }
        owner[c] = best.2 as u32;
        for &(e, n) in r {
            load[e as usize * workers + best.2] += n;
        }
    }
    for _ in 0..4 {
        let mut moved = false;
        for (c, r) in runs.iter().enumerate() {
            let from = owner[c] as usize;
            // Taking the client off `from`, then adding it to `to`: the change of the sum.
            for &(e, n) in r {
                load[e as usize * workers + from] -= n;
            }
            let cost = |load: &[u32], w: usize| -> u64 {
                r.iter().map(|&(e, n)| raise(load, e as usize, w, n)).sum()
            };
            let stay = cost(&load, from);
            let mut best = (stay, from);
            for to in 0..workers {
                let c2 = cost(&load, to);
                if c2 < best.0 {
                    best = (c2, to);
                }
            }
            owner[c] = best.1 as u32;
            moved |= best.1 != from;
            for &(e, n) in r {
                load[e as usize * workers + best.1] += n;
            }
        }
        if !moved {
            break;
        }
    }
    owner
}

/// How close to full (live entries below the configured maximum) the dry run's peak may come
/// before a replay runs on one worker: the workers' expiry scans may lag the dry run's a little
/// (each rounds its share of the sweep), so a table that came this close could fill up in the
/// parallel run.
pub fn pressure_margin(max_entries: u32) -> u32 {
    (max_entries / 8).max(4 * BATCH as u32)
}

/// Whether a dry-run peak of `peak` live entries is close enough to full that early drop could
/// pick victims (see the module docs).
fn near_full(peak: u32, cfg: &CtConfig) -> bool {
    // As the table clamps it.
    let max = cfg.max_entries.clamp(16, 1 << 29);
    peak.saturating_add(pressure_margin(max)) >= max
}

/// A worker's frames: a UMEM of one batch (`Umem::in_memory`, no socket) and its descriptors,
/// handed to the pipeline as the workers hand theirs (`UmemBatch`).
struct ReplayFrames {
    umem: Umem,
    descs: [Desc; BATCH],
    frame_size: usize,
}

impl ReplayFrames {
    fn new(frame_size: usize) -> io::Result<ReplayFrames> {
        Ok(ReplayFrames {
            umem: Umem::in_memory(BATCH as u32, frame_size as u32)?,
            descs: [Desc::default(); BATCH],
            frame_size,
        })
    }

    /// Copies a batch's frames (`spans` of `data`, at most `BATCH`) into the UMEM, as the kernel
    /// copies received frames, each truncated to its frame, and returns them as a batch.
    #[inline]
    fn fill(&mut self, data: &[u8], spans: &[(usize, usize)]) -> UmemBatch<'_> {
        let m = spans.len().min(BATCH);
        for (j, &(start, len)) in spans[..m].iter().enumerate() {
            let addr = (j * self.frame_size) as u64;
            let n = len.min(self.frame_size);
            copy_frame(&mut self.umem.frame_mut(addr)[..n], &data[start..][..n]);
            self.descs[j] = Desc { addr, len: n };
        }
        self.umem.batch(&mut self.descs[..m])
    }
}

/// Room for a reply longer than the packet it answers (ICMP quotes the packet).
fn slot_size_for(capture: &Capture) -> usize {
    let max_len = capture
        .packets
        .iter()
        .map(|p| p.data.len())
        .max()
        .unwrap_or(0);
    (max_len + 256).max(2048).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxdp_packet::pcap::CapturedPacket;
    use kxdp_packet::LinkType;

    fn capture(ts_us: &[u64]) -> Capture {
        Capture {
            link: LinkType::Ethernet,
            packets: ts_us
                .iter()
                .map(|&t| CapturedPacket {
                    ts_ns: 5_000_000_000 + t * 1_000,
                    data: vec![0; 60],
                })
                .collect(),
        }
    }

    /// The sum over epochs of the largest worker's packets, for `owner` (client -> worker).
    fn longest_shares(client_of: &[u32], owner: &[u32], epochs: &[Epoch], workers: usize) -> u64 {
        let mut start = 0;
        let mut sum = 0;
        for e in epochs {
            let mut n = vec![0u64; workers];
            for &c in &client_of[start..e.end as usize] {
                n[owner[c as usize] as usize] += 1;
            }
            sum += n.iter().max().unwrap();
            start = e.end as usize;
        }
        sum
    }

    /// Clients drawn at random, 1,000 packets an epoch (the benchmark captures' rate): a hash
    /// of the client leaves the largest share of an epoch ~2.5 % above half (two workers wait
    /// for it at every epoch's end); the balanced assignment comes within 0.5 % of an even
    /// split, for two and three workers, and keeps every client on one worker.
    #[test]
    fn balanced_clients_split_every_epoch_evenly() {
        let (clients, epochs_n, per_epoch) = (20_000u64, 200u32, 1_000u32);
        let mut x = 0x1234_5678u64;
        let mut client_of = Vec::new();
        let mut first = std::collections::HashMap::new();
        for _ in 0..epochs_n * per_epoch {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let c = (x >> 33) % clients;
            let next = first.len() as u32;
            client_of.push(*first.entry(c).or_insert(next));
        }
        let epochs: Vec<Epoch> = (1..=epochs_n)
            .map(|k| Epoch {
                end: k * per_epoch,
                clock_ms: k as u64,
                updates: 0,
            })
            .collect();
        for workers in [2usize, 3] {
            let ideal = (epochs_n * per_epoch) as f64 / workers as f64;
            let hashed: Vec<u32> = (0..first.len() as u32)
                .map(|c| {
                    (crate::conntrack::hash_packed(&[c as u64, 0, 0, 0, 0], 1) % workers as u64)
                        as u32
                })
                .collect();
            let balanced = balance_clients(&client_of, first.len(), &epochs, workers);
            let by_hash = longest_shares(&client_of, &hashed, &epochs, workers) as f64 / ideal;
            let by_balance = longest_shares(&client_of, &balanced, &epochs, workers) as f64 / ideal;
            assert!(by_hash > 1.02, "{workers} workers: hashed {by_hash}");
            assert!(
                by_balance < 1.005,
                "{workers} workers: balanced {by_balance}"
            );
        }
    }

    /// Every packet runs at the clock it had with a barrier per batch: batches at the same
    /// millisecond share an epoch, a new millisecond starts one, and a batch whose timestamp goes
    /// backwards keeps the clock where it was (so it joins the epoch before it).
    #[test]
    fn epochs_group_the_batches_of_one_millisecond() {
        // Two batches at ms 0, two at ms 1, one back at ms 0, one at ms 7.
        let mut ts: Vec<u64> = (0..128).collect();
        ts.extend((0..128).map(|i| 1_000 + i));
        ts.extend(0..64);
        ts.extend((0..64).map(|i| 7_000 + i));
        let cap = capture(&ts);
        assert_eq!(cut_batches(&cap, &[]).len(), 6);
        let epoch = |end, ms| Epoch {
            end,
            clock_ms: CLOCK_START_MS + ms,
            updates: 0,
        };
        assert_eq!(
            cut_epochs(&cap, &[]),
            vec![epoch(128, 0), epoch(320, 1), epoch(384, 7)]
        );
    }
}
