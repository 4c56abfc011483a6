//! `kxdp run`: the control plane (syncing from the API server or from `--state` files watched for
//! changes, publishing the tables), the operator servers (`admin::daemon`), and — for the
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
use crate::metrics::Metrics;
use crate::sources::files::load_state;
use crate::sources::kube::{client_config, KubeOptions};
use crate::sync::{ControlHandle, ControlLoop, Published, Source};

/// How often `--state` is checked for changes.
pub const STATE_POLL: Duration = Duration::from_millis(500);

/// Why `run` could not start or stopped. The binary maps the variants to exit codes: bad input
/// (config, state, kubeconfig) is the operator's to fix; the rest are runtime failures.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    State(#[from] crate::sources::files::StateError),
    /// The kubeconfig (or the in-cluster configuration) could not be read.
    #[error("API server: {0}")]
    Kubeconfig(String),
    /// A listener could not be bound.
    #[error("{what} {addr}: {source}")]
    Listen {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// The AF_XDP dataplane could not attach.
    #[error("attaching to {interfaces}: {source}")]
    Attach {
        interfaces: String,
        source: std::io::Error,
    },
    /// A thread or runtime could not be started.
    #[error("starting {what}: {source}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
}

impl RunError {
    /// Whether the operator's input (config, state, kubeconfig) is at fault.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            RunError::Config(_) | RunError::State(_) | RunError::Kubeconfig(_)
        )
    }
}

/// Starts the control plane for `config`; the caller attaches workers to the returned tables.
pub fn start(
    config: &Config,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
    metrics: Arc<Metrics>,
) -> Result<(Arc<Published>, ControlHandle), RunError> {
    let source = match state {
        Some(p) => {
            // Bad input at startup is an error (exit 2); later it keeps the last good tables.
            load_state(p)?;
            Source::Files {
                path: p.to_path_buf(),
                poll: STATE_POLL,
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
/// against the machine (CPUs exist, the memory is there) before anything is allocated.
fn node_config(
    config: Config,
    config_path: &Path,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
) -> Result<Config, RunError> {
    let config = if config.node_overrides.is_empty() {
        config
    } else {
        let labels = node_labels(&config.node_name, state, kubeconfig).unwrap_or_else(|e| {
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
    Ok(config)
}

fn node_labels(
    node: &str,
    state: Option<&Path>,
    kubeconfig: Option<&Path>,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let labels =
        |n: &k8s_openapi::api::core::v1::Node| n.metadata.labels.clone().unwrap_or_default();
    if let Some(p) = state {
        let s = load_state(p).map_err(|e| e.to_string())?;
        return s
            .nodes
            .get(node)
            .map(labels)
            .ok_or_else(|| format!("no Node {node} in --state"));
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

/// `kxdp run`: runs until SIGINT or SIGTERM.
pub fn run(
    config_path: &Path,
    state: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    ops_opts: crate::admin::daemon::OpsOptions,
) -> Result<(), RunError> {
    let config = Config::load(config_path)?;
    let config = node_config(config, config_path, state.as_deref(), kubeconfig.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let (published, handle) = start(
        &config,
        state.as_deref(),
        kubeconfig.as_deref(),
        metrics.clone(),
    )?;
    let rt = handle.runtime().clone();
    // SIGTERM/SIGINT are caught from here on: one arriving while the servers and workers start
    // (a probe or a test may already see /metrics) stops the daemon cleanly instead of killing it.
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        (
            signal(SignalKind::terminate()).expect("SIGTERM handler"),
            signal(SignalKind::interrupt()).expect("SIGINT handler"),
        )
    };
    // Operators: /metrics, /healthz, health check node ports, the admin socket (admin::daemon).
    // Workers use `ops.dataplane` (conntrack and stats shared with the admin API).
    let extra = usize::from(ops_opts.inject_pcap.is_some());
    let dataplane = crate::admin::daemon::dataplane(&config, extra);
    let ops = crate::admin::daemon::start(
        &config,
        published.clone(),
        &handle,
        metrics.clone(),
        dataplane,
        &ops_opts,
    )?;
    let source = if state.is_some() {
        "--state files"
    } else {
        "the API server"
    };
    // Startup lines are log events (plain or JSON as `--log-format` says, info level: shown by
    // default), so that `kubectl logs` of a JSON-logging daemon stays one object per line.
    let afxdp = if config.interfaces.is_empty() {
        tracing::warn!(
            "kxdp run: control plane running (tables from {source}); no interfaces configured, so no packet is forwarded by kxdp"
        );
        None
    } else {
        // The host path before the workers: kxdp1 is one of their interfaces.
        let host_path = if config.host_path.enabled {
            let hp = crate::host_path::RunningHostPath::start(&config, published.clone()).map_err(
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
        let afxdp = start_dataplane(
            &config,
            published.clone(),
            &ops.dataplane,
            host_path.as_ref(),
        )?;
        tracing::info!(
            "kxdp run: forwarding on {}{} with {} worker(s) (tables from {source})",
            config.interfaces.join(", "),
            host_path
                .as_ref()
                .map(|h| format!(", {}", h.kxdp_if))
                .unwrap_or_default(),
            afxdp.counters.len()
        );
        for line in afxdp.describe() {
            tracing::info!("kxdp run:   {line}");
        }
        Some((afxdp, host_path))
    };
    // Stale UDP state (docs/nat.md): after every publication, UDP connections the new tables no
    // longer support are deleted, off the workers' path.
    let stale_cleaner = {
        let published = published.clone();
        let ct = ops.dataplane.ct.clone();
        let metrics = metrics.clone();
        rt.spawn(async move {
            // Told of each publication (several while a flush runs are seen as one).
            let mut publications = published.subscribe();
            while publications.changed().await.is_ok() {
                let snapshot = published.load_full();
                let seen = snapshot.generation;
                let ct = ct.clone();
                let started = std::time::Instant::now();
                let by_family = tokio::task::spawn_blocking(move || {
                    kxdp_dataplane::stale::flush_stale_udp_by_family(&ct, &snapshot)
                })
                .await
                .unwrap_or([0, 0]);
                metrics.conntrack_reconciled(started.elapsed().as_secs_f64(), by_family);
                let flushed = by_family[0] + by_family[1];
                if flushed > 0 {
                    tracing::info!(flushed, generation = seen, "stale UDP connections deleted");
                }
            }
        })
    };
    rt.block_on(async {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    });
    stale_cleaner.abort();
    // Workers stop and the XDP programs are detached before anything else goes away.
    if let Some((afxdp, host_path)) = afxdp {
        let counters = afxdp.counters.clone();
        drop(afxdp.stop());
        for (w, c) in counters {
            let g = |x: &std::sync::atomic::AtomicU64| x.load(std::sync::atomic::Ordering::Relaxed);
            eprintln!(
                "kxdp run: worker {w}: rx {} tx {} checksums-completed {} (its drops are counted by reason with the pipeline's)",
                g(&c.rx),
                g(&c.tx),
                g(&c.checksums_completed),
            );
        }
        eprintln!("kxdp run: XDP programs detached");
        if let Some(hp) = host_path {
            match hp.teardown() {
                Ok(()) => eprintln!("kxdp run: host path removed"),
                Err(e) => eprintln!(
                    "kxdp run: removing the host path: {e} (the next start replaces what is left)"
                ),
            }
        }
    }
    drop(ops);
    handle.shutdown();
    Ok(())
}

impl kxdp_dataplane::worker::Tables for Published {
    fn current(&self) -> arc_swap::Guard<Arc<kxdp_dataplane::snapshot::Snapshot>> {
        self.load()
    }

    fn wait_newer(&self, seen: u64, timeout: std::time::Duration) -> u64 {
        Published::wait_newer(self, seen, timeout)
    }
}

/// Attaches the AF_XDP dataplane to the configured interfaces.
fn start_dataplane(
    config: &Config,
    published: Arc<Published>,
    dp: &crate::admin::Dataplane,
    host_path: Option<&crate::host_path::RunningHostPath>,
) -> Result<kxdp_dataplane::io::runner::AfXdp, RunError> {
    use kxdp_dataplane::io::xdp::ModeChoice;
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
    let opts = kxdp_dataplane::io::runner::RunOptions {
        xsk: Default::default(),
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
    };
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
