//! `kxdp run`: the control plane (syncing from the API server or from `--state` files watched for
//! changes, publishing the tables), the operator servers (`admin::servers`), and — for the
//! configured `interfaces` — the AF_XDP dataplane (`kxdp_dataplane::io::runner`): the XDP program
//! attached to every interface, pinned poll-mode workers that pick up each publication between
//! batches. With no interfaces configured only the control plane runs, and the command says so.
//! With interfaces and `hostPath.enabled` (the default), the host path (`crate::host_path`) is
//! set up before the workers, `kxdp1` joins the interfaces as the kernel port, and it is removed
//! after the workers stop.
//!
//! The dataplane's knobs are config fields: `xdpMode` (`auto`|`native`|`generic`) and
//! `workers.idle` (`spinPolls`, `maxSleep`: the idle back-off, see `docs/afxdp.md`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::error::RunError;
use crate::metrics::Metrics;
use crate::sources::kube::{client_config, KubeOptions};
use crate::sources::watch_files::Preloaded;
use crate::sync::{ControlHandle, ControlLoop, Published, Source};

/// How often `--state` is checked for changes.
pub const STATE_POLL: Duration = Duration::from_millis(500);

/// Starts the control plane for `config`; the caller attaches workers to the returned tables.
pub fn start(
    config: &Config,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
    metrics: Arc<Metrics>,
) -> Result<(Arc<Published>, ControlHandle), RunError> {
    start_preloaded(config, state, kubeconfig, metrics, None)
}

/// `start`, with the state under `state` already read (`preloaded`, by `node_config`) or not.
fn start_preloaded(
    config: &Config,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
    metrics: Arc<Metrics>,
    preloaded: Option<Preloaded>,
) -> Result<(Arc<Published>, ControlHandle), RunError> {
    let source = match state {
        Some(p) => {
            // Bad input at startup is an error (exit 2); later it keeps the last good tables.
            // The state read here is the watch's first (not read twice).
            let preloaded = match preloaded {
                Some(pre) => pre,
                None => Preloaded::load(p)?,
            };
            Source::Files {
                path: p.to_path_buf(),
                poll: STATE_POLL,
                preloaded: Some(Box::new(preloaded)),
            }
        }
        None => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| RunError::Spawn {
                    what: "the kubeconfig reader",
                    source,
                })?;
            let kc = rt
                .block_on(client_config(kubeconfig))
                .map_err(RunError::Kubeconfig)?;
            if let Some(w) =
                crate::sources::kube::service_address_warning(&kc, &config.service_cidrs)
            {
                tracing::warn!("{w}");
            }
            Source::Kube {
                config: Box::new(kc),
                options: KubeOptions::default(),
            }
        }
    };
    ControlLoop::spawn(config.clone(), source, metrics).map_err(|source| RunError::Spawn {
        what: "the control loop",
        source,
    })
}

/// This node's configuration: `nodeOverrides` applied for the Node object's labels (from
/// `--state`, or one GET from the API server; none found: the top-level settings), then checked
/// against the machine (CPUs exist, the memory is there) before anything is allocated. The
/// state read for the labels is kept in `preloaded` for the watch (not read again).
fn node_config(
    config: Config,
    config_path: &Path,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
    preloaded: &mut Option<Preloaded>,
) -> Result<Config, RunError> {
    let config = if config.node_overrides.is_empty() {
        config
    } else {
        let labels = node_labels(&config.node_name, state, kubeconfig, preloaded);
        let labels = labels.unwrap_or_else(|e| {
            tracing::warn!(node = %config.node_name, "node labels unknown ({e}): nodeOverrides not applied");
            Default::default()
        });
        let (node, applied) = config.for_node(&labels);
        for i in &applied {
            tracing::info!(node = %config.node_name, "nodeOverrides[{i}] applies to this node");
        }
        node
    };
    // `interfaces` patterns stay patterns: the runner matches them as links come and go.
    config.check_machine(
        &crate::config::Machine::probe(),
        !config.interfaces.is_empty(),
        config_path,
    )?;
    if !config.interfaces.is_empty() {
        // The links as they are now; a bridge that appears later is checked by the runner.
        if let Ok(fib) = kxdp_dataplane::io::route::read() {
            config.check_interfaces(&fib.input().links, config_path)?;
        }
    }
    Ok(config)
}

/// The Node's labels, from `state` (read into `preloaded` when it can be: an unreadable state
/// is read again, and refused, by `start_preloaded`) or from the API server.
fn node_labels(
    node: &str,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
    preloaded: &mut Option<Preloaded>,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let labels =
        |n: &k8s_openapi::api::core::v1::Node| n.metadata.labels.clone().unwrap_or_default();
    if let Some(p) = state {
        let pre = Preloaded::load(p).map_err(|e| e.to_string())?;
        let found = pre.state().nodes.get(node).map(labels);
        *preloaded = Some(pre);
        return found.ok_or_else(|| format!("no Node {node} in --state"));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let kc = client_config(kubeconfig).await?;
        let client = kube::Client::try_from(kc).map_err(|e| e.to_string())?;
        let api = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client);
        let n = tokio::time::timeout(Duration::from_secs(10), api.get_opt(node))
            .await
            .map_err(|_| "the API server did not answer in 10 s".to_string())?
            .map_err(|e| e.to_string())?;
        n.as_ref()
            .map(labels)
            .ok_or_else(|| format!("no Node {node}"))
    })
}

/// The AF_XDP workers and, with `hostPath.enabled`, the host path they forward through.
type Forwarding = (
    kxdp_dataplane::io::runner::AfXdp,
    Option<crate::host_path::RunningHostPath>,
);

/// What `kxdp run` holds from `build` to `stop` (or `finish_handover`). Fields drop in this
/// order (an early error drops them all): the servers before the control plane.
struct Daemon {
    /// The operator servers, and the dataplane (conntrack, stats) they share with the workers.
    ops: crate::admin::servers::Ops,
    /// SIGTERM and SIGINT, caught from the control plane's start on.
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    handle: ControlHandle,
    published: Arc<Published>,
    metrics: Arc<Metrics>,
    config: Config,
    /// Where the tables come from, for the startup lines.
    source: &'static str,
}

/// How `serve` ended.
enum Ended {
    /// SIGTERM or SIGINT; or a successor that cannot adopt this build's dataplane, whose
    /// connection (`successor`) stays open until this process exits (it waits for that, then
    /// starts clean).
    Stop {
        successor: Option<std::os::unix::net::UnixStream>,
    },
    /// A successor adopted the dataplane.
    HandedOver(Box<Handover>),
}

/// A takeover that happened (`crate::takeover::Outcome::HandedOver`), and the host path still
/// to leave to the successor.
struct Handover {
    quiesced: kxdp_dataplane::io::runner::Quiesced,
    conn: std::os::unix::net::UnixStream,
    pid: u32,
    took: Duration,
    summary: String,
    host_path: Option<crate::host_path::RunningHostPath>,
}

/// `kxdp run`: runs until SIGINT or SIGTERM, or until a successor takes over. The phases, in
/// order: `build` (the node's config, the control plane, the dataplane's tables, the operator
/// servers), `start_forwarding` (the host path and the workers, unless taken over), the
/// successor's listener and the stale-state cleaner, `serve` (until a signal or a takeover),
/// then `stop` or `finish_handover`.
pub fn run(
    config_path: &Path,
    state: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    ops_opts: crate::admin::servers::OpsOptions,
    takeover: crate::takeover::TakeoverOptions,
) -> Result<(), RunError> {
    let (mut daemon, adopted) = build(
        config_path,
        state.as_deref(),
        kubeconfig.as_deref(),
        &ops_opts,
        &takeover,
    )?;
    let mut forwarding = start_forwarding(&daemon, adopted)?;
    // Listen for a successor (after any predecessor has released the socket path).
    let (conn_tx, mut conns) = tokio::sync::mpsc::unbounded_channel();
    let listener = listen_for_successor(&takeover, forwarding.is_some(), &conn_tx);
    let stale_cleaner = spawn_stale_cleaner(&daemon);
    match serve(&mut daemon, &mut forwarding, &mut conns) {
        Ended::HandedOver(handover) => {
            stale_cleaner.abort();
            drop(listener);
            finish_handover(daemon, *handover, takeover.wait_after_handover);
        }
        Ended::Stop { successor } => {
            drop(conn_tx);
            drop(listener);
            stale_cleaner.abort();
            stop(daemon, forwarding);
            // The successor waiting for this process to be gone starts when the connection
            // closes.
            drop(successor);
        }
    }
    Ok(())
}

/// Everything before forwarding: the config for this node, the control plane (signals caught
/// from then on), the dataplane's tables (adopted from a running kxdp, with its workers, or
/// made anew) and the operator servers. Returns the adopted workers, if any.
fn build(
    config_path: &Path,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
    ops_opts: &crate::admin::servers::OpsOptions,
    takeover: &crate::takeover::TakeoverOptions,
) -> Result<(Daemon, Option<Forwarding>), RunError> {
    let config = Config::load(config_path)?;
    let mut preloaded = None;
    let config = node_config(config, config_path, state, kubeconfig, &mut preloaded)?;
    if !config.interfaces.is_empty() {
        check_capabilities()?;
    }
    let metrics = Arc::new(Metrics::new());
    let (published, handle) =
        start_preloaded(&config, state, kubeconfig, metrics.clone(), preloaded)?;
    let rt = handle.runtime().clone();
    // SIGTERM/SIGINT are caught from here on: one arriving while the servers and workers start
    // (a probe or a test may already see /metrics) stops the daemon cleanly instead of killing it.
    let (term, int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        (
            signal(SignalKind::terminate()).expect("SIGTERM handler"),
            signal(SignalKind::interrupt()).expect("SIGINT handler"),
        )
    };
    let extra = usize::from(ops_opts.inject_pcap.is_some());
    // A running kxdp to take over (docs/operations.md § Upgrades): before the servers start,
    // since the predecessor holds their ports until it has handed over. The conntrack table
    // (its state file) is opened only once the predecessor's workers have stopped.
    let make_dataplane = || crate::admin::servers::dataplane(&config, extra);
    let (dataplane, adopted) = if config.interfaces.is_empty() {
        (make_dataplane(), None)
    } else {
        take_over(&config, &published, make_dataplane, takeover)?
    };
    if let Some(report) = dataplane.ct.restore_report() {
        if report.result.is_discarded() {
            tracing::warn!("kxdp run: {}", report.describe());
        } else {
            tracing::info!("kxdp run: {}", report.describe());
        }
    }
    log_table_memory(&dataplane.ct, &config);
    // Operators: /metrics, /healthz, health check node ports, the admin socket (admin::servers).
    // Workers use `ops.dataplane` (conntrack and stats shared with the admin API).
    let ops = crate::admin::servers::start(
        &config,
        published.clone(),
        &handle,
        metrics.clone(),
        dataplane,
        ops_opts,
    )?;
    let source = if state.is_some() {
        "--state files"
    } else {
        "the API server"
    };
    {
        let mut info = ops.context.daemon.lock().unwrap();
        (info.source, info.source_detail) = match (state, kubeconfig) {
            (Some(s), _) => ("files".into(), s.display().to_string()),
            (None, Some(k)) => ("api-server".into(), format!("kubeconfig {}", k.display())),
            (None, None) => ("api-server".into(), String::new()),
        };
    }
    let daemon = Daemon {
        ops,
        int,
        term,
        handle,
        published,
        metrics,
        config,
        source,
    };
    Ok((daemon, adopted))
}

/// The workers on the configured interfaces, the host path set up before them: those `adopted`
/// from a predecessor, or started now. None when no interface is configured (the control plane
/// alone runs). Startup lines are log events (plain or JSON as `--log-format` says, info level:
/// shown by default), so that `kubectl logs` of a JSON-logging daemon stays one object per line.
fn start_forwarding(
    daemon: &Daemon,
    adopted: Option<Forwarding>,
) -> Result<Option<Forwarding>, RunError> {
    let Daemon {
        config,
        published,
        ops,
        source,
        ..
    } = daemon;
    if config.interfaces.is_empty() {
        tracing::warn!(
            "kxdp run: control plane running (tables from {source}); no interfaces configured, so no packet is forwarded by kxdp"
        );
        return Ok(None);
    }
    if adopted.is_some() {
        return Ok(adopted);
    }
    // The host path before the workers: kxdp1 is one of their interfaces.
    let host_path = if config.host_path.enabled {
        let hp = crate::host_path::RunningHostPath::start(config, published.clone()).map_err(
            |source| RunError::Attach {
                interfaces: "the host path (kxdp0/kxdp1)".into(),
                source,
            },
        )?;
        tracing::info!("kxdp run: {}", hp.describe);
        Some(hp)
    } else {
        None
    };
    // A restart with a state file: the previous kxdp's programs hold the traffic; take it
    // over only once the tables are there (a NodePort unknown to the new programs would go
    // to the kernel, which resets its connections). Bounded by the hold itself.
    if ops.dataplane.ct.state_path().is_some() && published.load().generation == 0 {
        published.wait_newer(0, kxdp_dataplane::io::runner::RESTART_HOLD / 2);
    }
    let afxdp = start_dataplane(
        config,
        published.clone(),
        &ops.dataplane,
        host_path.as_ref(),
    )?;
    log_forwarding(
        config,
        host_path.as_ref(),
        &afxdp,
        &format!("tables from {source}"),
    );
    Ok(Some((afxdp, host_path)))
}

/// Listens for a successor on the takeover socket, when there is one and workers to hand over;
/// its connections go to `conn_tx`. A socket that cannot be bound is a warning: upgrades then
/// restart instead of taking over.
fn listen_for_successor(
    takeover: &crate::takeover::TakeoverOptions,
    forwarding: bool,
    conn_tx: &tokio::sync::mpsc::UnboundedSender<std::os::unix::net::UnixStream>,
) -> Option<crate::takeover::Listener> {
    match (&takeover.socket, forwarding) {
        (Some(path), true) => match crate::takeover::Listener::start(path, conn_tx.clone()) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(
                    "kxdp run: cannot listen for a successor on {}: {e} (upgrades restart instead of taking over)",
                    path.display()
                );
                None
            }
        },
        _ => None,
    }
}

/// Stale state (docs/nat.md): after every publication, UDP connections the new tables no
/// longer support are deleted and TCP connections of removed endpoints marked for a reset,
/// off the workers' path.
fn spawn_stale_cleaner(daemon: &Daemon) -> tokio::task::JoinHandle<()> {
    let published = daemon.published.clone();
    let ct = daemon.ops.dataplane.ct.clone();
    let metrics = daemon.metrics.clone();
    daemon.handle.runtime().spawn(async move {
        // Told of each publication (several while a flush runs are seen as one). The tables
        // published before this task subscribed are reconciled first: after a restart with
        // the state file, they find the connections of endpoints removed while kxdp was down.
        let mut publications = published.subscribe();
        let mut pending = published.load().generation > 0;
        while std::mem::take(&mut pending) || publications.changed().await.is_ok() {
            let snapshot = published.load_full();
            let seen = snapshot.generation;
            let ct = ct.clone();
            let started = std::time::Instant::now();
            let done = tokio::task::spawn_blocking(move || {
                kxdp_dataplane::stale::reconcile(&ct, &snapshot)
            })
            .await
            .unwrap_or_default();
            let by_family = done.udp_deleted;
            metrics.conntrack_reconciled(started.elapsed().as_secs_f64(), by_family);
            let flushed = by_family[0] + by_family[1];
            if flushed > 0 {
                tracing::info!(flushed, generation = seen, "stale UDP connections deleted");
            }
            if done.tcp_backend_gone > 0 {
                tracing::info!(
                    marked = done.tcp_backend_gone,
                    generation = seen,
                    "TCP connections of removed endpoints marked: their clients are reset at their next packet (backend-gone)"
                );
            }
        }
    })
}

/// Runs until SIGTERM or SIGINT, answering each successor that connects (`conns`): a takeover
/// that is refused or fails leaves `forwarding` running.
fn serve(
    daemon: &mut Daemon,
    forwarding: &mut Option<Forwarding>,
    conns: &mut tokio::sync::mpsc::UnboundedReceiver<std::os::unix::net::UnixStream>,
) -> Ended {
    let rt = daemon.handle.runtime().clone();
    loop {
        // `kxdp status` reads the link manager of the dataplane running now (a takeover that
        // did not happen resumes the workers).
        daemon.ops.context.daemon.lock().unwrap().links =
            forwarding.as_ref().map(|(a, _)| a.links_view());
        let (term, int) = (&mut daemon.term, &mut daemon.int);
        let conn = rt.block_on(async {
            tokio::select! {
                _ = int.recv() => None,
                _ = term.recv() => None,
                Some(c) = conns.recv() => Some(c),
            }
        });
        let Some(conn) = conn else {
            return Ended::Stop { successor: None };
        };
        let Some((a, hp)) = forwarding.take() else {
            return Ended::Stop { successor: None };
        };
        let moved = hp.as_ref().map(|h| h.moved_local());
        match crate::takeover::hand_over(
            conn,
            a,
            moved,
            &daemon.config.node_name,
            &daemon.ops.dataplane.ct,
        ) {
            crate::takeover::Outcome::Continue { afxdp: a, why } => {
                tracing::warn!("kxdp run: takeover request: {why}; this kxdp carries on");
                *forwarding = Some((a, hp));
            }
            crate::takeover::Outcome::Stop {
                afxdp: a,
                conn,
                why,
            } => {
                tracing::warn!(
                    "kxdp run: takeover request: {why}; stopping so that it can start clean"
                );
                *forwarding = Some((a, hp));
                return Ended::Stop {
                    successor: Some(conn),
                };
            }
            crate::takeover::Outcome::HandedOver {
                quiesced,
                conn,
                pid,
                took,
                summary,
            } => {
                return Ended::HandedOver(Box::new(Handover {
                    quiesced,
                    conn,
                    pid,
                    took,
                    summary,
                    host_path: hp,
                }))
            }
        }
    }
}

/// After a takeover: lets the successor have the workers' sockets and the host path, stops the
/// servers, then tells it (`released`). With `wait_after_handover`, waits for a signal before
/// returning.
fn finish_handover(daemon: Daemon, handover: Handover, wait_after_handover: bool) {
    let Handover {
        quiesced,
        conn,
        pid,
        took,
        summary,
        host_path,
    } = handover;
    let balanced = quiesced.frames_balanced();
    let stopped_at = quiesced
        .stopped_at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    quiesced.release();
    if let Some(hp) = host_path {
        hp.leave();
    }
    // The servers go before `released`: the successor binds the same ports.
    drop(daemon.ops);
    daemon.handle.shutdown();
    crate::takeover::released(&conn);
    tracing::info!(
        "kxdp run: handed over to pid {pid} in {} ms, workers stopped at {stopped_at:.6} ({summary}; frames {}); {}",
        took.as_millis(),
        if balanced { "all accounted for" } else { "NOT ALL ACCOUNTED FOR" },
        if wait_after_handover {
            "waiting for SIGTERM (--wait-after-handover)"
        } else {
            "exiting"
        }
    );
    if wait_after_handover {
        wait_for_signal();
    }
}

/// Stops on a signal: the workers first, their XDP programs detached (or, with a state file,
/// left to hold the traffic for the next kxdp), then the host path; the state file marked
/// clean; then the servers and the control plane.
fn stop(daemon: Daemon, forwarding: Option<Forwarding>) {
    let Daemon { ops, handle, .. } = daemon;
    // Workers stop and the XDP programs are detached before anything else goes away.
    if let Some((afxdp, host_path)) = forwarding {
        let counters = afxdp.counters.clone();
        // With a state file: a restart. The programs stay and hold the traffic until the next
        // kxdp takes over (RESTART_HOLD); without, they go now.
        if ops.dataplane.ct.state_path().is_some() {
            drop(afxdp.stop_for_restart());
            tracing::info!(
                "kxdp run: XDP programs left attached, holding traffic for the next kxdp (up to {}s)",
                kxdp_dataplane::io::runner::RESTART_HOLD.as_secs()
            );
        } else {
            drop(afxdp.stop());
            tracing::info!("kxdp run: XDP programs detached");
        }
        for (w, c) in counters {
            let g = |x: &std::sync::atomic::AtomicU64| x.load(std::sync::atomic::Ordering::Relaxed);
            tracing::info!(
                "kxdp run: worker {w}: rx {} tx {} checksums-completed {} (its drops are counted by reason with the pipeline's)",
                g(&c.rx),
                g(&c.tx),
                g(&c.checksums_completed),
            );
        }
        // Frames the kernel dropped at the sockets before kxdp saw them (not drop reasons: no
        // verdict was ever made for them; docs/afxdp.md).
        for s in ops.dataplane.stats.socket_samples() {
            if s.kernel.rx_lost() > 0 {
                tracing::warn!(
                    "kxdp run: socket {}/{}: the kernel dropped {} frame(s) before kxdp saw them (RX ring full {}, other {}; afxdp ring sizes: docs/afxdp.md)",
                    s.interface,
                    s.queue,
                    s.kernel.rx_lost(),
                    s.kernel.rx_ring_full,
                    s.kernel.rx_dropped
                );
            }
        }
        if let Some(t) = ops
            .dataplane
            .stats
            .tap_sample()
            .filter(|t| t.queue_full > 0)
        {
            tracing::warn!(
                "kxdp run: tap {}: the kernel dropped {} frame(s) before kxdp saw them (a queue to a worker full: docs/afxdp.md)",
                t.interface,
                t.queue_full
            );
        }
        if let Some(hp) = host_path {
            match hp.teardown() {
                Ok(()) => tracing::info!("kxdp run: host path removed"),
                Err(e) => tracing::warn!(
                    "kxdp run: removing the host path: {e} (the next start replaces what is left)"
                ),
            }
        }
    }
    // The workers have stopped: the state file is consistent; mark it so (the next process
    // reports a clean restore) and let go of it.
    if ops.dataplane.ct.mark_clean_shutdown() {
        if let Some(p) = ops.dataplane.ct.state_path() {
            tracing::info!(
                "kxdp run: conntrack state kept in {} ({} entries)",
                p.display(),
                ops.dataplane.ct.len()
            );
        }
    }
    drop(ops);
    handle.shutdown();
}

/// Blocks until SIGTERM or SIGINT (the control plane's runtime is gone: a small one listens).
fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    rt.block_on(async {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    });
}

impl kxdp_dataplane::worker::Tables for Published {
    fn current(&self) -> arc_swap::Guard<Arc<kxdp_dataplane::snapshot::Snapshot>> {
        self.load()
    }

    fn wait_newer(&self, seen: u64, timeout: std::time::Duration) -> u64 {
        Published::wait_newer(self, seen, timeout)
    }
}

/// Fails, naming them, when the process lacks capabilities the dataplane needs (those
/// deploy/base/daemonset.yaml grants): without the check a missing one shows up as EPERM or
/// ENOBUFS from a socket, bpf() or netlink call, some of them retried for ever per interface.
/// No check when the capabilities cannot be read.
fn check_capabilities() -> Result<(), RunError> {
    use kxdp_kernel::sys::cap;
    let Some(eff) = kxdp_kernel::sys::effective_capabilities() else {
        return Ok(());
    };
    let has = |c: u32| eff & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(cap::NET_ADMIN) {
        missing.push("CAP_NET_ADMIN (XDP attach, XSKMAP, the host path's links, routes and rules)");
    }
    if !has(cap::NET_RAW) {
        missing.push("CAP_NET_RAW (AF_XDP sockets)");
    }
    if !has(cap::BPF) && !has(cap::SYS_ADMIN) {
        missing.push("CAP_BPF (loading the XDP program and creating its maps; CAP_SYS_ADMIN on kernels before 5.8)");
    }
    if !has(cap::IPC_LOCK) && !kxdp_kernel::sys::memlock_unlimited() {
        missing.push("CAP_IPC_LOCK (the UMEM is pinned memory beyond RLIMIT_MEMLOCK)");
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(RunError::Capabilities(format!(
        "missing capabilities: {}; with interfaces configured kxdp run needs CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_IPC_LOCK (deploy/base/daemonset.yaml adds them to the container)",
        missing.join(", ")
    )))
}

/// Attaches the AF_XDP dataplane to the configured interfaces.
fn start_dataplane(
    config: &Config,
    published: Arc<Published>,
    dp: &crate::admin::Dataplane,
    host_path: Option<&crate::host_path::RunningHostPath>,
) -> Result<kxdp_dataplane::io::runner::AfXdp, RunError> {
    let opts = run_options(config, host_path, dp.ct.state_path().is_some());
    kxdp_dataplane::io::runner::AfXdp::start(
        &opts,
        published,
        dp.ct.clone(),
        Some(dp.stats.clone()),
    )
    .map_err(|source| RunError::Attach {
        interfaces: config.interfaces.join(", "),
        source,
    })
}

/// Takes the dataplane over from a running kxdp when one answers on the takeover socket (see
/// `crate::takeover`); None: start clean (no socket, nobody listening, refused, or
/// `--clean-start`). An error: the predecessor was stopped and the adoption failed (it has
/// been told and carries on).
#[allow(clippy::type_complexity)]
fn take_over(
    config: &Config,
    published: &Arc<Published>,
    make_dataplane: impl Fn() -> crate::admin::Dataplane,
    opts: &crate::takeover::TakeoverOptions,
) -> Result<
    (
        crate::admin::Dataplane,
        Option<(
            kxdp_dataplane::io::runner::AfXdp,
            Option<crate::host_path::RunningHostPath>,
        )>,
    ),
    RunError,
> {
    // Without a state file the table is the process's own: made now, outside the window in
    // which the predecessor's workers are stopped (allocating a large table takes a while).
    // With one, it is mapped once the predecessor has stopped writing it (below).
    let early =
        (config.conntrack.state_file() == crate::config::StateFile::Off).then(&make_dataplane);
    let Some(path) = &opts.socket else {
        return Ok((early.unwrap_or_else(make_dataplane), None));
    };
    if opts.clean_start {
        tracing::info!("kxdp run: --clean-start: not taking over a running kxdp");
        return Ok((early.unwrap_or_else(make_dataplane), None));
    }
    let conn = match crate::takeover::connect(path) {
        Ok(c) => c,
        Err(why) => {
            tracing::info!("kxdp run: no running kxdp to take over ({why}); starting clean");
            return Ok((early.unwrap_or_else(make_dataplane), None));
        }
    };
    // Tables first: the workers forward the moment they adopt the sockets.
    if published.load().generation == 0 {
        published.wait_newer(0, Duration::from_secs(30));
    }
    let routes = kxdp_dataplane::io::route::Routes::start().map_err(|source| RunError::Attach {
        interfaces: config.interfaces.join(", "),
        source,
    })?;
    let started = std::time::Instant::now();
    let description = opts
        .description_for_test
        .unwrap_or(kxdp_dataplane::io::takeover::DESCRIPTION_VERSION);
    let parcel = match crate::takeover::request(&conn, &config.node_name, description) {
        Ok(Ok(p)) => p,
        Ok(Err(reason)) => {
            tracing::warn!(
                "kxdp run: the running kxdp did not hand over ({reason}); starting clean"
            );
            return Ok((early.unwrap_or_else(make_dataplane), None));
        }
        Err(e) => return Err(RunError::Takeover(e.to_string())),
    };
    let pid = parcel.pid;
    // The predecessor's workers have stopped and its conntrack state file is released: map it
    // now (its index is rebuilt in place, which is only safe while nobody else writes it).
    let dp = &early.unwrap_or_else(make_dataplane);
    let summary = parcel.dataplane.summary();
    // Only what the workers need happens while the predecessor's are stopped: the sockets,
    // UMEMs and programs are adopted, the routes were read before asking. The host path (its
    // rules and routes stay as they are) is adopted after the predecessor has been told.
    let kxdp_if = config
        .host_path
        .enabled
        .then(|| kxdp_dataplane::io::host_path::HostPathOptions::default().kxdp_if);
    let kernel_port = kxdp_if.as_ref().and_then(|name| {
        parcel
            .dataplane
            .links
            .iter()
            .find(|l| &l.name == name)
            .map(|l| l.ifindex)
    });
    let mut run_opts = run_options(config, None, dp.ct.state_path().is_some());
    if let Some(name) = &kxdp_if {
        run_opts.interfaces.push(name.clone());
    }
    run_opts.kernel_port = kernel_port;
    if opts.fail_for_test {
        let why = "--takeover-fail-for-test";
        let _ = crate::takeover::reply(&conn, Err(why.into()));
        return Err(RunError::Takeover(format!(
            "{why}: not adopting pid {pid}'s dataplane ({summary}; pid {pid} carries on)"
        )));
    }
    let adopted = kxdp_dataplane::io::takeover::adopt(
        &run_opts,
        published.clone(),
        dp.ct.clone(),
        Some(dp.stats.clone()),
        routes,
        parcel.dataplane,
        parcel.fds,
    );
    let afxdp = match adopted {
        Ok(a) => a,
        Err(e) => {
            let _ = crate::takeover::reply(&conn, Err(e.to_string()));
            return Err(RunError::Takeover(format!(
                "adopting pid {pid}'s dataplane: {e} (pid {pid} carries on)"
            )));
        }
    };
    crate::takeover::reply(&conn, Ok(())).map_err(|e| RunError::Takeover(e.to_string()))?;
    // Logged at once: the line's time is when forwarding resumed (tests/takeover_lab.rs).
    tracing::info!(
        "kxdp run: took over from pid {pid}: its workers were stopped for {} ms; {summary}",
        started.elapsed().as_millis()
    );
    let host_path = if config.host_path.enabled {
        let moved = parcel.host_path.clone().unwrap_or_default();
        match crate::host_path::RunningHostPath::start_or_adopt(
            config,
            published.clone(),
            Some(&moved),
        ) {
            Ok(hp) => Some(hp),
            Err(e) => {
                // Forwarding works; the node's own Service traffic may not until a restart.
                tracing::error!("kxdp run: adopting the host path: {e}");
                None
            }
        }
    } else {
        None
    };
    if let Err(e) = crate::takeover::wait_released(&conn, Duration::from_secs(10)) {
        tracing::warn!("kxdp run: pid {pid} did not confirm it released its servers: {e}");
    }
    log_forwarding(config, host_path.as_ref(), &afxdp, "taken over");
    Ok((dp.clone(), Some((afxdp, host_path))))
}

/// The runner's options from the config (plus the host path's kxdp1).
fn run_options(
    config: &Config,
    host_path: Option<&crate::host_path::RunningHostPath>,
    hold_for_restart: bool,
) -> kxdp_dataplane::io::runner::RunOptions {
    use kxdp_kernel::xdp::ModeChoice;
    let mode = match config.xdp_mode {
        crate::config::XdpMode::Auto => ModeChoice::Auto,
        crate::config::XdpMode::Native => ModeChoice::Native,
        crate::config::XdpMode::Generic => ModeChoice::Generic,
    };
    let defaults = kxdp_dataplane::worker::Backoff::default();
    let idle = &config.workers.idle;
    let mut interfaces = config.interfaces.clone();
    if let Some(hp) = host_path {
        interfaces.push(hp.kxdp_if.clone());
    }
    kxdp_dataplane::io::runner::RunOptions {
        xsk: config.afxdp.xsk(),
        interfaces,
        workers: config.workers.count.max(1),
        cpus: config.workers.cpus.clone(),
        backoff: kxdp_dataplane::worker::Backoff {
            spin_polls: idle.spin_polls,
            min_sleep_us: defaults.min_sleep_us,
            max_sleep_us: (idle.max_sleep.0.as_micros() as u32).max(defaults.min_sleep_us),
        },
        mode,
        kernel_port: host_path.map(|h| h.kxdp_ifindex),
        node_ports_to: host_path.map(|h| h.node_ports_to),
        // With a state file the next kxdp continues the connections: hold them meanwhile.
        hold_for_restart,
        source_validation: match config.source_validation {
            crate::config::SourceValidation::Strict => {
                kxdp_dataplane::antispoof::SourceValidation::Strict
            }
            crate::config::SourceValidation::Off => {
                kxdp_dataplane::antispoof::SourceValidation::Off
            }
        },
        tap: config.pod_interception.run_options(),
    }
}

/// Where the conntrack table lives, and how much of it is in huge pages: a state file on a plain
/// tmpfs is in 4 KiB pages, which at a million connections costs a page walk on most lookups.
fn log_table_memory(ct: &kxdp_dataplane::conntrack::Conntrack, config: &Config) {
    let mem = ct.memory();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let place = match ct.state_path() {
        Some(p) => format!("the state file {}", p.display()),
        None => "process memory".to_string(),
    };
    let Some(huge) = mem.huge_page_bytes else {
        tracing::info!(
            "kxdp run: conntrack table: {:.0} MiB in {place}",
            mib(mem.bytes)
        );
        return;
    };
    let line = format!(
        "kxdp run: conntrack table: {:.0} MiB in {place}, {:.0} MiB of it in huge pages",
        mib(mem.bytes),
        mib(huge)
    );
    if mem.in_file && huge < mem.bytes / 2 && mem.bytes >= 64 << 20 {
        let hint = if config.conntrack.state_file_huge_pages {
            "see the warning above"
        } else {
            "set conntrack.stateFileHugePages: true, docs/operations.md"
        };
        tracing::warn!("{line} (lookups will walk page tables: {hint})");
    } else {
        tracing::info!("{line}");
    }
}

/// The line lab tests and operators wait for ("forwarding on ..."), then what was attached.
fn log_forwarding(
    config: &crate::DataplaneConfiguration,
    host_path: Option<&crate::host_path::RunningHostPath>,
    afxdp: &kxdp_dataplane::io::runner::AfXdp,
    how: &str,
) {
    tracing::info!(
        "kxdp run: forwarding on {}{} with {} worker(s) ({how})",
        config.interfaces.join(", "),
        host_path
            .map(|h| format!(", {}", h.kxdp_if))
            .unwrap_or_default(),
        afxdp.counters.len()
    );
    for line in afxdp.describe() {
        tracing::info!("kxdp run:   {line}");
    }
}
