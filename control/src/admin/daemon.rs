//! What `kxdp run` starts for operators next to the control loop: the shared dataplane state
//! (conntrack, worker stats), `/metrics`, `/healthz` + `/livez`, the health-check node port
//! servers and the admin socket. One call from `run.rs`: `start`.
//!
//! Test path (`--inject-pcap FILE`, hidden): until AF_XDP workers are attached, a file-source
//! daemon has tables and an empty conntrack table but no packets. With this flag, a pseudo-worker
//! (an extra worker index, beside the configured ones) pushes FILE through the real pipeline —
//! the daemon's own conntrack, published snapshot, clock and `after_batch` stats feed, exactly as
//! an AF_XDP worker would — each time FILE appears or changes. Nothing else is faked: listings,
//! deletes, stats and monitor events are what the pipeline left behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kxdp_dataplane::conntrack::Conntrack;
use kxdp_dataplane::pipeline::{Pipeline, SlotFrames};
use kxdp_dataplane::stats::{clock_ms, DataplaneStats};
use kxdp_dataplane::verdict::Verdict;

use super::{AdminContext, AdminServer, Dataplane};
use crate::config::Config;
use crate::health::{serve_http, ProxyHealth, Response};
use crate::metrics::Metrics;
use crate::run::RunError;
use crate::sync::{ControlHandle, Published};

/// `kxdp run`'s operator options.
#[derive(Clone, Debug, Default)]
pub struct OpsOptions {
    /// Admin socket path (default `/run/kxdp/admin.sock`); `None` with `no_admin`.
    pub admin_socket: Option<PathBuf>,
    pub no_admin: bool,
    /// Test path: a capture replayed by a pseudo-worker whenever it changes.
    pub inject_pcap: Option<PathBuf>,
}

/// Keeps the servers running; dropping it stops them.
pub struct Ops {
    pub dataplane: Dataplane,
    pub context: Arc<AdminContext>,
    _admin: Option<AdminServer>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Ops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The dataplane state `kxdp run` shares between workers and the admin API: conntrack sized by
/// the config, and one stats block per worker (`extra` more for pseudo-workers).
pub fn dataplane(config: &Config, extra: usize) -> Dataplane {
    let workers = config.workers.count.max(1) + extra;
    let ct = match config.conntrack.state_file.as_str() {
        "" => Conntrack::new(config.ct_config(), workers),
        path => open_state_file(Path::new(path), config, workers),
    };
    Dataplane {
        ct: Arc::new(ct),
        stats: Arc::new(DataplaneStats::new(workers)),
    }
}

/// The conntrack table in `conntrack.stateFile`, continuing the previous process's connections
/// when the file is readable. A file another kxdp still holds (one that is stopping, or handing
/// over) is waited for; a file that cannot be created at all leaves the table in process memory
/// with a warning: forwarding matters more than keeping state.
fn open_state_file(path: &Path, config: &Config, workers: usize) -> Conntrack {
    let deadline = std::time::Instant::now() + STATE_FILE_WAIT;
    loop {
        match Conntrack::open_file(path, config.ct_config(), workers) {
            // (`kxdp run` logs the report.)
            Ok((ct, _report)) => return ct,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(
                    "kxdp run: conntrack.stateFile {}: {e}; keeping the conntrack table in process memory (a restart will lose it)",
                    path.display()
                );
                return Conntrack::new(config.ct_config(), workers);
            }
        }
    }
}

/// How long a start waits for another kxdp to let go of the state file.
const STATE_FILE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn bind(
    rt: &tokio::runtime::Handle,
    addr: SocketAddr,
    what: &'static str,
) -> Result<tokio::net::TcpListener, RunError> {
    rt.block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|source| RunError::Listen { what, addr, source })
}

/// Starts `/metrics`, health, the health-check node port servers and the admin socket.
pub fn start(
    config: &Config,
    published: Arc<Published>,
    handle: &ControlHandle,
    metrics: Arc<Metrics>,
    dp: Dataplane,
    opts: &OpsOptions,
) -> Result<Ops, RunError> {
    let rt = handle.runtime().clone();
    let stop = Arc::new(AtomicBool::new(false));
    metrics.attach_dataplane(dp.stats.clone(), dp.ct.clone());
    let context = Arc::new(AdminContext {
        published: published.clone(),
        dataplane: dp.clone(),
        status: handle.status_cell(),
        listening: Mutex::new(serde_json::Map::new()),
        control: Some(handle.sender()),
    });
    let mut threads = Vec::new();

    if let Some(addr) = config.metrics_bind_address {
        let l = bind(&rt, addr, "metricsBindAddress")?;
        let local = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        context
            .listening
            .lock()
            .unwrap()
            .insert("metrics".into(), local.into());
        let m = metrics.clone();
        let configz = crate::metrics::configz(config);
        rt.spawn(serve_http(
            l,
            Arc::new(move |path: &str| {
                if let Some((content_type, body)) =
                    crate::metrics::metrics_route(path, &m, &configz)
                {
                    Response {
                        status: 200,
                        content_type,
                        headers: vec![],
                        body,
                    }
                } else {
                    Response {
                        status: 404,
                        content_type: "text/plain; charset=utf-8",
                        headers: vec![],
                        body: "404 page not found\n".into(),
                    }
                }
            }),
        ));
    }
    let hc_ip = config
        .healthz_bind_address
        .map(|a| a.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let proxy_health = Arc::new(ProxyHealth {
        status: handle.status_cell(),
        sync_period: config.sync.sync_period.0,
        metrics: metrics.clone(),
    });
    if let Some(addr) = config.healthz_bind_address {
        let h = proxy_health.clone();
        // As kube-proxy: a health server that cannot listen is logged and retried, it does not
        // stop the dataplane.
        let ctx = context.clone();
        rt.spawn(async move {
            let mut warned = false;
            loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => {
                        let local = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                        ctx.listening
                            .lock()
                            .unwrap()
                            .insert("healthz".into(), local.into());
                        serve_http(l, Arc::new(move |p: &str| h.answer(p))).await;
                        return;
                    }
                    Err(e) => {
                        if !warned {
                            tracing::error!(%addr, error = %e, "healthzBindAddress: cannot listen; retrying every 5 s");
                            eprintln!("kxdp run: healthzBindAddress {addr}: {e}; retrying every 5 s");
                            warned = true;
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            }
        });
    }
    threads.push(
        crate::health::spawn_service_health(rt.clone(), hc_ip, proxy_health, stop.clone())
            .map_err(|source| RunError::Spawn {
                what: "the health check node port servers",
                source,
            })?,
    );

    let admin = if opts.no_admin {
        None
    } else {
        let path = opts
            .admin_socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(super::DEFAULT_SOCKET));
        // Without its admin socket the dataplane still runs: say so loudly and go on (another
        // kxdp holding the socket is the usual cause).
        match super::serve(&path, context.clone(), &rt) {
            Ok(server) => {
                context
                    .listening
                    .lock()
                    .unwrap()
                    .insert("admin".into(), path.display().to_string().into());
                Some(server)
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "admin socket: cannot listen; running without it");
                eprintln!(
                    "kxdp run: admin socket {}: {e}; running without it",
                    path.display()
                );
                None
            }
        }
    };

    if let Some(pcap) = &opts.inject_pcap {
        let worker = dp.stats.workers() - 1;
        let (dp2, published2, stop2, pcap) =
            (dp.clone(), published.clone(), stop.clone(), pcap.clone());
        threads.push(
            std::thread::Builder::new()
                .name("kxdp-inject".into())
                .spawn(move || inject_loop(&pcap, worker, &dp2, &published2, &stop2))
                .map_err(|source| RunError::Spawn {
                    what: "the --inject-pcap worker",
                    source,
                })?,
        );
    }

    Ok(Ops {
        dataplane: dp,
        context,
        _admin: admin,
        stop,
        threads,
    })
}

/// The `--inject-pcap` pseudo-worker (see the module docs).
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
