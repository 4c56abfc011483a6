//! Test path (`kxdp run --inject-pcap FILE`, hidden): until AF_XDP workers are attached, a
//! file-source daemon has tables and an empty conntrack table but no packets. With this flag, a
//! pseudo-worker (the last worker index, beside the configured ones) pushes FILE through the real
//! pipeline — the daemon's own conntrack, published snapshot, clock and `after_batch` stats feed,
//! exactly as an AF_XDP worker would — each time FILE appears or changes. Nothing else is faked:
//! listings, deletes, stats, policy counters and monitor events are what the pipeline left
//! behind. It lives apart from the servers so that no product loop carries it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kxdp_dataplane::clock::clock_ms;
use kxdp_dataplane::pipeline::{Pipeline, SlotFrames};
use kxdp_dataplane::verdict::Verdict;

use super::Dataplane;
use crate::error::RunError;
use crate::sync::Published;

/// Starts the pseudo-worker on `pcap` (it stops when `stop` is set).
pub fn spawn(
    pcap: &Path,
    dp: &Dataplane,
    published: &Arc<Published>,
    stop: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, RunError> {
    let worker = dp.stats.workers() - 1;
    let (dp, published, stop, pcap): (Dataplane, Arc<Published>, Arc<AtomicBool>, PathBuf) = (
        dp.clone(),
        published.clone(),
        stop.clone(),
        pcap.to_path_buf(),
    );
    std::thread::Builder::new()
        .name("kxdp-inject".into())
        .spawn(move || inject_loop(&pcap, worker, &dp, &published, &stop))
        .map_err(|source| RunError::Spawn {
            what: "the --inject-pcap worker",
            source,
        })
}

/// The pseudo-worker's loop (see the module docs).
fn inject_loop(
    path: &std::path::Path,
    worker: usize,
    dp: &Dataplane,
    published: &Published,
    stop: &AtomicBool,
) {
    let mut last: Option<std::time::SystemTime> = None;
    let mut pipeline: Option<Pipeline> = None;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if published.generation() == 0 {
            continue;
        }
        let Ok(mtime) = std::fs::metadata(path).and_then(|m| m.modified()) else {
            continue;
        };
        if last == Some(mtime) {
            continue;
        }
        last = Some(mtime);
        let capture = match kxdp_packet::pcap::read_file(path) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "--inject-pcap: unreadable capture");
                continue;
            }
        };
        let p = pipeline.get_or_insert_with(|| Pipeline::new(worker, capture.link, 1, &dp.ct));
        let mut frames = SlotFrames::new(64, 2048);
        let mut verdicts = vec![Verdict::default(); 64];
        for chunk in capture.packets.chunks(64) {
            let t0 = Instant::now();
            frames.clear();
            for pkt in chunk {
                frames.push(&pkt.data);
            }
            let snap = published.load_full();
            let now = clock_ms();
            p.process(&mut frames, &mut verdicts, &snap, &dp.ct, now);
            // The frames as captured (the pipeline rewrote `frames` in place).
            let captured = |i: usize| chunk.get(i).map(|p| &p.data[..]);
            dp.stats.after_batch_with_frames(
                worker,
                &p.counters,
                &verdicts[..chunk.len()],
                &captured,
                t0.elapsed().as_nanos() as u64,
                now,
            );
        }
        tracing::info!(packets = capture.packets.len(), "--inject-pcap: replayed");
    }
}
