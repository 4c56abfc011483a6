//! `kxdp run`, as far as it goes today: the control plane alone. It syncs from the API server (or
//! from `--state` files watched for changes), publishes the tables, and serves `/metrics` on
//! `metricsBindAddress`. The AF_XDP workers (the AF_XDP issue) attach to the `Published` tables
//! this starts; until they exist no packet is forwarded, and the command says so at startup.

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

/// Why `run` could not start: (exit code, message).
pub type RunError = (i32, String);

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
            load_state(p).map_err(|e| (crate::cli::EXIT_BAD_INPUT, e.to_string()))?;
            Source::Files {
                path: p.to_path_buf(),
                poll: STATE_POLL,
            }
        }
        None => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| (crate::cli::EXIT_FAILURE, e.to_string()))?;
            let kc = rt
                .block_on(client_config(kubeconfig))
                .map_err(|e| (crate::cli::EXIT_BAD_INPUT, format!("API server: {e}")))?;
            Source::Kube {
                config: Box::new(kc),
                options: KubeOptions::default(),
            }
        }
    };
    ControlLoop::spawn(config.clone(), source, metrics)
        .map_err(|e| (crate::cli::EXIT_FAILURE, e.to_string()))
}

/// `kxdp run`: runs until SIGINT or SIGTERM.
pub fn run(
    config_path: &Path,
    state: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    ops_opts: crate::admin::daemon::OpsOptions,
) -> Result<(), RunError> {
    let config =
        Config::load(config_path).map_err(|e| (crate::cli::EXIT_BAD_INPUT, e.to_string()))?;
    let metrics = Arc::new(Metrics::new());
    let (published, handle) = start(
        &config,
        state.as_deref(),
        kubeconfig.as_deref(),
        metrics.clone(),
    )?;
    let rt = handle.runtime().clone();
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
    tracing::warn!(
        source = if state.is_some() { "state files" } else { "API server" },
        "kxdp run: control plane only; no AF_XDP workers are attached yet, so no packet is forwarded by kxdp"
    );
    eprintln!(
        "kxdp run: control plane running (tables from {}); no AF_XDP workers are attached yet, so no packet is forwarded by kxdp",
        if state.is_some() { "--state files" } else { "the API server" }
    );
    let _keep = published;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    });
    drop(ops);
    handle.shutdown();
    Ok(())
}
