//! Replay: a capture, preloaded in memory, pushed through the same pipeline the AF_XDP workers
//! run, as fast as it goes.
//!
//! Each worker thread owns the packets a symmetric flow hash gives it (both directions of an
//! un-NATed flow land on the same worker, as RSS with a symmetric key does on a NIC) and copies
//! them batch by batch into its own frame slots, as the kernel copies received frames into UMEM.
//! Conntrack is shared, exactly as in `kxdp run`. Time is the capture's: a batch runs at the
//! timestamp of its first packet, so timeouts in a capture behave as they would have live; a batch
//! never spans more than `MAX_BATCH_SPAN_MS` of capture time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use kxdp_packet::pcap::Capture;
use kxdp_packet::{parse, Parsed};

use crate::conntrack::{Conntrack, CtConfig};
use crate::pipeline::{Counters, Pipeline, SlotFrames};
use crate::snapshot::Snapshot;
use crate::verdict::{Action, Verdict};

/// Frames per batch: what one AF_XDP RX burst typically delivers.
pub const BATCH: usize = 64;

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
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            workers: 1,
            repeat: 1,
            seed: 0,
            record: true,
            progress: None,
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

pub fn replay(
    snapshot: Arc<Snapshot>,
    ct_config: CtConfig,
    capture: &Capture,
    opts: &ReplayOptions,
) -> ReplayResult {
    let workers = opts.workers.max(1);
    let repeat = opts.repeat.max(1);
    let n = capture.packets.len();
    let total = n as u64 * repeat as u64;
    let ct = Conntrack::new(ct_config, workers);

    // Steering, done before the clock starts.
    let mut shares: Vec<Vec<u32>> = vec![Vec::new(); workers];
    for (i, p) in capture.packets.iter().enumerate() {
        let w = if workers == 1 {
            0
        } else {
            (flow_hash(&p.data, capture.link) % workers as u64) as usize
        };
        shares[w].push(i as u32);
    }
    let max_len = capture
        .packets
        .iter()
        .map(|p| p.data.len())
        .max()
        .unwrap_or(0);
    // Room for a reply longer than the packet it answers (ICMP quotes the packet).
    let slot_size = (max_len + 256).max(2048).next_power_of_two();
    let first_ts = capture.packets.first().map(|p| p.ts_ns).unwrap_or(0);
    let last_ts = capture.packets.iter().map(|p| p.ts_ns).max().unwrap_or(0);
    let pass_span_ms = last_ts.saturating_sub(first_ts) / 1_000_000 + 1;

    let done = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let barrier = Barrier::new(workers + 1);
    let mut outs: Vec<WorkerOut> = Vec::with_capacity(workers);
    let mut seconds = 0.0;

    std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .iter()
            .enumerate()
            .map(|(w, share)| {
                let (ct, snapshot, barrier, done, finished) =
                    (&ct, &snapshot, &barrier, &done, &finished);
                scope.spawn(move || {
                    let mut pipeline = Pipeline::new(w, capture.link, opts.seed, ct);
                    let mut frames = SlotFrames::new(BATCH, slot_size);
                    let mut verdicts = [Verdict::default(); BATCH];
                    let mut batch_idx = [0u32; BATCH];
                    let mut recorded =
                        Vec::with_capacity(if opts.record { share.len() } else { 0 });
                    barrier.wait();
                    let mut now_floor = 0u64;
                    for pass in 0..repeat {
                        let pass_offset = pass as u64 * pass_span_ms;
                        let mut k = 0;
                        while k < share.len() {
                            frames.clear();
                            let start_ts = capture.packets[share[k] as usize].ts_ns;
                            let mut m = 0;
                            while k < share.len() && m < BATCH {
                                let p = &capture.packets[share[k] as usize];
                                if p.ts_ns.saturating_sub(start_ts) / 1_000_000 > MAX_BATCH_SPAN_MS
                                {
                                    break;
                                }
                                frames.push(&p.data);
                                batch_idx[m] = share[k];
                                m += 1;
                                k += 1;
                            }
                            let now = (CLOCK_START_MS
                                + start_ts.saturating_sub(first_ts) / 1_000_000
                                + pass_offset)
                                .max(now_floor);
                            now_floor = now;
                            pipeline.process(&mut frames, &mut verdicts[..m], snapshot, ct, now);
                            if opts.record && pass == 0 {
                                for j in 0..m {
                                    let v = verdicts[j];
                                    let out = matches!(v.action, Action::Forward | Action::Reject)
                                        .then(|| frames.get(j).to_vec());
                                    recorded.push((batch_idx[j], v, out));
                                }
                            }
                            done.fetch_add(m as u64, Ordering::Relaxed);
                        }
                    }
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
    ReplayResult {
        packets: counters.packets,
        seconds,
        actions: counters.actions(),
        reasons: counters.reasons.to_vec(),
        verdicts,
        output,
        conntrack_entries: ct.len(),
        counters,
    }
}

/// A hash equal for both directions of a flow (addresses and ports sorted), for steering.
fn flow_hash(frame: &[u8], link: kxdp_packet::LinkType) -> u64 {
    let Ok(Parsed::Ip(m)) = parse(frame, link) else {
        return 0;
    };
    let a = (m.src.as_u128(), m.sport);
    let b = (m.dst.as_u128(), m.dport);
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let packed = [
        (lo.0 >> 64) as u64 ^ hi.0 as u64,
        lo.0 as u64 ^ (hi.0 >> 64) as u64,
        (lo.1 as u64) << 16 | hi.1 as u64,
        m.proto as u64,
        0,
    ];
    crate::conntrack::hash_packed(&packed, 0x5eed)
}
