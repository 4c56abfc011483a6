//! The `kxdp` command line. Thin: parsing, loading, calling the crates, exit codes. Formatting
//! lives in `output`.
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad input (unreadable or invalid config, state,
//! pcap, flags), with a message on stderr naming the file, the document and the field.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use kxdp_dataplane::replay::{replay, ReplayOptions};

use crate::config::Config;
use crate::output::{verdict_line, Summary};
use crate::sources::files::load_state;
use crate::translate::translate;

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_BAD_INPUT: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "kxdp",
    version,
    about = "A userspace Kubernetes dataplane (AF_XDP) replacing kube-proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the version.
    Version,
    /// The daemon. Today the control plane only: syncs from the API server (or `--state` files
    /// watched for changes), publishes the tables and serves /metrics; no AF_XDP workers yet.
    Run(RunArgs),
    /// Replay a pcap through the pipeline, from memory, as fast as it goes.
    Replay(ReplayArgs),
    /// Captures and clusters for benchmarks and tests.
    Pcap {
        #[command(subcommand)]
        command: PcapCommand,
    },
    /// Connection tracking of a running daemon, with conntrack-tools' filter names.
    Conntrack {
        #[command(subcommand)]
        command: crate::admin::commands::ConntrackCommand,
        #[command(flatten)]
        admin: crate::admin::commands::AdminArgs,
    },
    /// Services of a running daemon: frontend -> backends with their state.
    Services {
        #[command(flatten)]
        admin: crate::admin::commands::AdminArgs,
    },
    /// Per-worker packets, batches, Mpps, busy share and drops by reason of a running daemon.
    Stats {
        #[command(flatten)]
        args: crate::admin::commands::StatsArgs,
        #[command(flatten)]
        admin: crate::admin::commands::AdminArgs,
    },
    /// Live stream of drops and rejects (policy denials included) of a running daemon.
    Monitor {
        #[command(flatten)]
        args: crate::admin::commands::MonitorArgs,
        #[command(flatten)]
        admin: crate::admin::commands::AdminArgs,
    },
    /// NetworkPolicy tools.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Remove another proxy's leftovers from this node.
    Cleanup {
        #[command(subcommand)]
        command: CleanupCommand,
    },
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
enum CleanupCommand {
    /// Remove kube-proxy's iptables, nftables and IPVS rules, as `kube-proxy --cleanup` does.
    KubeProxy {
        /// Only print what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Print the DataplaneConfiguration equivalent to a kube-proxy KubeProxyConfiguration, with
    /// every field that could not be carried over named in comments.
    Convert {
        /// The KubeProxyConfiguration file (e.g. `config.conf` of the kube-proxy ConfigMap).
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum PcapCommand {
    /// Generate a synthetic cluster (config.yaml, state.yaml) and a capture (capture.pcap) of
    /// TCP traffic to its ClusterIPs.
    Gen(GenArgs),
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// How a new connection would be decided: the Service translation (every eligible backend),
    /// the policies selecting source and destination, and the rule that allows it or why none
    /// does.
    Trace(TraceArgs),
}

#[derive(Args, Debug)]
struct TraceArgs {
    /// DataplaneConfiguration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Kubernetes manifests: a file or a directory.
    #[arg(long, value_name = "PATH")]
    state: PathBuf,
    /// Source address.
    #[arg(long, value_name = "IP")]
    from: std::net::IpAddr,
    /// Destination: IP or IP:PORT (IPv6 with a port as [addr]:port).
    #[arg(long, value_name = "IP[:PORT]")]
    to: String,
    /// TCP, UDP, SCTP or ICMP.
    #[arg(long, value_name = "P", default_value = "TCP")]
    proto: String,
}

#[derive(Args, Debug)]
struct GenArgs {
    /// Directory to write config.yaml, state.yaml and capture.pcap into (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// ClusterIP Services (one TCP port each).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    services: u32,
    /// Ready endpoints per Service.
    #[arg(long, value_name = "N", default_value_t = 10)]
    endpoints: u32,
    /// Long-lived flows (established and mixed modes).
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    flows: u32,
    /// Packets in the capture.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    packets: u64,
    /// established: SYNs then data over the flows; new: every packet a new connection; mixed: 90/10.
    #[arg(long, value_name = "MODE", default_value = "established")]
    mode: crate::pcapgen::GenMode,
    /// IPv6 instead of IPv4.
    #[arg(long)]
    ipv6: bool,
    /// Largest frame in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    payload: usize,
    /// Seed of the generator.
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// DataplaneConfiguration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Kubernetes manifests (a file or a directory), watched for changes, instead of the API
    /// server.
    #[arg(long, value_name = "PATH")]
    state: Option<PathBuf>,
    /// kubeconfig of the API server (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, value_name = "FILE", conflicts_with = "state")]
    kubeconfig: Option<PathBuf>,
    /// Admin socket path (mode 0600, root only).
    #[arg(long, value_name = "PATH", default_value = crate::admin::DEFAULT_SOCKET)]
    admin: PathBuf,
    /// Do not serve the admin socket.
    #[arg(long)]
    no_admin: bool,
    /// Testing: replay this capture through the pipeline inside the daemon (a pseudo-worker)
    /// each time the file appears or changes.
    #[arg(long, value_name = "FILE", hide = true)]
    inject_pcap: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// DataplaneConfiguration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Kubernetes manifests: a file or a directory.
    #[arg(long, value_name = "PATH")]
    state: PathBuf,
    /// Input capture (pcap or pcapng).
    #[arg(long, value_name = "IN")]
    pcap: PathBuf,
    /// Write the packets as they leave (pcap, input link type).
    #[arg(long, value_name = "OUT.pcap")]
    out: Option<PathBuf>,
    /// Write one JSON verdict per input packet.
    #[arg(long, value_name = "OUT.jsonl")]
    verdicts: Option<PathBuf>,
    /// Worker threads (default: the config's workers.count).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    workers: Option<u32>,
    /// Passes over the capture (time keeps advancing across passes).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Seed of the endpoint choice (replays are deterministic for a seed).
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// From SECONDS after the capture's first packet on, the cluster state is PATH (repeatable):
    /// replays what a control plane publishing new tables mid-capture does, stale UDP cleanup
    /// included.
    #[arg(long = "state-update", value_name = "SECONDS:PATH")]
    state_updates: Vec<String>,
}

/// The binary's entry point; returns the process exit code.
pub fn main() -> i32 {
    run(std::env::args_os())
}

/// `main` with explicit arguments (tests).
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                EXIT_BAD_INPUT
            } else {
                EXIT_OK
            };
        }
    };
    init_tracing();
    match cli.command {
        Command::Version => {
            println!("kxdp {}", env!("CARGO_PKG_VERSION"));
            EXIT_OK
        }
        Command::Run(args) => {
            let ops = crate::admin::daemon::OpsOptions {
                admin_socket: Some(args.admin.clone()),
                no_admin: args.no_admin,
                inject_pcap: args.inject_pcap.clone(),
            };
            match crate::run::run(
                &args.config,
                args.state.clone(),
                args.kubeconfig.clone(),
                ops,
            ) {
                Ok(()) => EXIT_OK,
                Err((code, message)) => {
                    eprintln!("kxdp: {message}");
                    code
                }
            }
        }
        Command::Replay(args) => finish(cmd_replay(&args)),
        Command::Pcap {
            command: PcapCommand::Gen(args),
        } => finish(cmd_pcap_gen(&args)),
        Command::Policy {
            command: PolicyCommand::Trace(args),
        } => finish(cmd_policy_trace(&args)),
        Command::Conntrack { command, admin } => {
            admin_finish(crate::admin::commands::conntrack(&command, &admin))
        }
        Command::Services { admin } => admin_finish(crate::admin::commands::services(&admin)),
        Command::Stats { args, admin } => {
            admin_finish(crate::admin::commands::stats(&args, &admin))
        }
        Command::Monitor { args, admin } => {
            admin_finish(crate::admin::commands::monitor(&args, &admin))
        }
        Command::Cleanup {
            command: CleanupCommand::KubeProxy { dry_run },
        } => {
            let opts = crate::cleanup::Options {
                dry_run,
                netns: None,
            };
            let (removed, code) = match crate::cleanup::kube_proxy(&opts) {
                Ok(r) => (r.removed, EXIT_OK),
                Err(e) => {
                    eprintln!("kxdp: {e}");
                    (e.report.removed, EXIT_FAILURE)
                }
            };
            let verb = if dry_run { "would remove" } else { "removed" };
            for line in &removed {
                println!("{verb} {line}");
            }
            if removed.is_empty() {
                println!("no kube-proxy rules found");
            }
            code
        }
        Command::Config {
            command: ConfigCommand::Convert { file },
        } => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            match crate::kubeproxy::convert_file(&file, cpus) {
                Ok(c) => {
                    print!("{}", c.render(&file));
                    EXIT_OK
                }
                Err(e) => {
                    eprintln!("kxdp: {e}");
                    EXIT_BAD_INPUT
                }
            }
        }
    }
}

fn admin_finish(r: Result<(), (i32, String)>) -> i32 {
    finish(r.map_err(|(code, message)| CliError { code, message }))
}

fn finish(r: Result<(), CliError>) -> i32 {
    match r {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("kxdp: {}", e.message);
            e.code
        }
    }
}

fn cmd_pcap_gen(args: &GenArgs) -> Result<(), CliError> {
    if args.services == 0 || args.endpoints == 0 {
        return Err(bad_input("--services and --endpoints must be at least 1"));
    }
    let spec = crate::pcapgen::GenSpec {
        services: args.services,
        endpoints_per_service: args.endpoints,
        flows: args.flows.max(1),
        packets: args.packets,
        mode: args.mode,
        ipv6: args.ipv6,
        payload: args.payload,
        seed: args.seed,
    };
    let summary = crate::pcapgen::generate(&spec, &args.out_dir)
        .map_err(|e| failure(format!("{}: {e}", args.out_dir.display())))?;
    eprintln!(
        "wrote {} ({} services, {} endpoints), {} ({} packets: {} SYN, {} data; {} flows)",
        summary.state.display(),
        summary.services,
        summary.endpoints,
        summary.pcap.display(),
        summary.packets,
        summary.syn_packets,
        summary.data_packets,
        summary.flows
    );
    Ok(())
}

fn cmd_policy_trace(args: &TraceArgs) -> Result<(), CliError> {
    use crate::policy::trace::{parse_proto, parse_target, trace, TraceQuery};
    let (to, port) = parse_target(&args.to).map_err(bad_input)?;
    let proto = parse_proto(&args.proto, to).map_err(bad_input)?;
    if args.from.is_ipv4() != to.is_ipv4() {
        return Err(bad_input("--from and --to must be of the same IP family"));
    }
    let config = Config::load(&args.config).map_err(bad_input)?;
    let state = load_state(&args.state).map_err(bad_input)?;
    let translation = translate(&config, &state);
    for p in &translation.problems {
        eprintln!("warning: {p}");
    }
    let q = TraceQuery {
        from: args.from,
        to,
        port,
        proto,
    };
    print!("{}", trace(&state, &translation.snapshot, &q).text);
    Ok(())
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A second init (tests calling `run` twice) is harmless.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

struct CliError {
    code: i32,
    message: String,
}

fn bad_input(message: impl ToString) -> CliError {
    CliError {
        code: EXIT_BAD_INPUT,
        message: message.to_string(),
    }
}

fn failure(message: impl ToString) -> CliError {
    CliError {
        code: EXIT_FAILURE,
        message: message.to_string(),
    }
}

fn cmd_replay(args: &ReplayArgs) -> Result<(), CliError> {
    let config = Config::load(&args.config).map_err(bad_input)?;
    config
        .check_memory(&crate::config::Machine::probe(), false, &args.config)
        .map_err(bad_input)?;
    let state = load_state(&args.state).map_err(bad_input)?;
    let translation = translate(&config, &state);
    for p in &translation.problems {
        eprintln!("warning: {p}");
    }
    let mut snapshot = translation.snapshot;
    snapshot.generation = 1;
    snapshot
        .validate()
        .map_err(|e| failure(format!("internal error: inconsistent tables: {e}")))?;
    let capture = kxdp_packet::pcap::read_file(&args.pcap).map_err(bad_input)?;
    let first_ts = capture.packets.iter().map(|p| p.ts_ns).min().unwrap_or(0);
    let mut updates = Vec::new();
    for spec in &args.state_updates {
        let (secs, path) = spec
            .split_once(':')
            .ok_or_else(|| bad_input(format!("--state-update {spec}: expected SECONDS:PATH")))?;
        let secs: f64 = secs
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| bad_input(format!("--state-update {spec}: bad SECONDS `{secs}`")))?;
        let state = load_state(Path::new(path)).map_err(bad_input)?;
        let t = translate(&config, &state);
        for p in &t.problems {
            eprintln!("warning: {path}: {p}");
        }
        let mut snap = t.snapshot;
        snap.generation = 2 + updates.len() as u64;
        snap.validate()
            .map_err(|e| failure(format!("internal error: inconsistent tables: {e}")))?;
        updates.push(kxdp_dataplane::replay::StateUpdate {
            at_ns: first_ts + (secs * 1e9) as u64,
            snapshot: Arc::new(snap),
        });
    }
    updates.sort_by_key(|u| u.at_ns);

    let workers = args.workers.map_or(config.workers.count, |w| w as usize);
    let total = capture.packets.len() as u64 * args.repeat as u64;
    let bar = progress_bar(total);
    let progress = bar.clone().map(|b| {
        Arc::new(move |done: u64, _total: u64| b.set_position(done))
            as Arc<dyn Fn(u64, u64) + Send + Sync>
    });
    let opts = ReplayOptions {
        workers,
        repeat: args.repeat,
        seed: args.seed,
        record: args.verdicts.is_some() || args.out.is_some(),
        progress,
        updates,
    };
    let snapshot = Arc::new(snapshot);
    let result = replay(snapshot.clone(), config.ct_config(), &capture, &opts);
    if let Some(b) = bar {
        b.finish_and_clear();
    }

    if let Some(path) = &args.verdicts {
        write_file(path, |w| {
            for (i, v) in result.verdicts.iter().enumerate() {
                // A Service port named by a later state update is found in that state's tables.
                let names = std::iter::once(&snapshot)
                    .chain(opts.updates.iter().map(|u| &u.snapshot))
                    .find(|s| s.service_port_by_id(v.service_id).is_some())
                    .unwrap_or(&snapshot);
                writeln!(w, "{}", verdict_line(i as u64, v, names))?;
            }
            Ok(())
        })?;
    }
    if let Some(path) = &args.out {
        write_file(path, |w| {
            let mut pw = kxdp_packet::pcap::Writer::new(w, capture.link)?;
            for (i, frame) in result.output.iter().enumerate() {
                if let Some(frame) = frame {
                    pw.write(capture.packets[i].ts_ns, frame)?;
                }
            }
            pw.finish()?;
            Ok(())
        })?;
    }

    let summary = Summary::new(
        result.packets,
        args.repeat,
        workers,
        result.seconds,
        &result.actions,
        &result.reasons,
    );
    // The JSON summary is data (stdout); the human one is commentary (stderr), so that
    // `--verdicts -` on stdout stays pure JSON lines.
    if args.json {
        let mut out = std::io::stdout().lock();
        match out
            .write_all((summary.to_json() + "\n").as_bytes())
            .and_then(|_| out.flush())
        {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(failure(format!("stdout: {e}")))
            }
            _ => {}
        }
    } else {
        eprint!("{}", summary.to_text());
    }
    Ok(())
}

/// Creates `path` and hands a buffered writer to `f`; any I/O error is a runtime failure naming
/// the file.
fn write_file(
    path: &Path,
    f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), CliError> {
    let err = |e: std::io::Error| failure(format!("{}: {e}", path.display()));
    // `-` and /dev/stdout are this process's stdout, written from where it stands (opening the
    // path anew would truncate a redirected file under earlier output). A reader that went away
    // (`| head`) is not an error.
    if path == Path::new("-") || path == Path::new("/dev/stdout") {
        let mut w = BufWriter::new(std::io::stdout().lock());
        return match f(&mut w).and_then(|_| w.flush()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(err(e)),
            _ => Ok(()),
        };
    }
    let mut w = BufWriter::new(File::create(path).map_err(err)?);
    f(&mut w).map_err(err)?;
    w.flush().map_err(err)
}

/// A progress bar on stderr, only when stderr is a terminal (scripts and CI see nothing).
fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() || total == 0 {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} packets {per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    Some(bar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        assert_eq!(run(["kxdp", "version"]), EXIT_OK);
        assert_eq!(run(["kxdp", "--help"]), EXIT_OK);
        assert_eq!(run(["kxdp", "nope"]), EXIT_BAD_INPUT);
        assert_eq!(run(["kxdp", "replay", "--config", "c"]), EXIT_BAD_INPUT);
        assert_eq!(
            run([
                "kxdp",
                "replay",
                "--config",
                "c",
                "--state",
                "s",
                "--pcap",
                "p",
                "--workers",
                "0"
            ]),
            EXIT_BAD_INPUT
        );
        assert_eq!(
            run([
                "kxdp", "replay", "--config", "c", "--state", "s", "--pcap", "p", "--repeat", "0"
            ]),
            EXIT_BAD_INPUT
        );
    }

    #[test]
    fn missing_files_are_bad_input() {
        assert_eq!(
            run([
                "kxdp",
                "replay",
                "--config",
                "/nonexistent/c.yaml",
                "--state",
                "/nonexistent",
                "--pcap",
                "/nonexistent.pcap"
            ]),
            EXIT_BAD_INPUT
        );
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.yaml");
        std::fs::write(
            &cfg,
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: n\n",
        )
        .unwrap();
        let state = dir.path().join("s.yaml");
        std::fs::write(&state, "apiVersion: v1\nkind: Node\nmetadata: {name: n}\n").unwrap();
        let c = cfg.to_str().unwrap();
        let s = state.to_str().unwrap();
        assert_eq!(
            run([
                "kxdp",
                "replay",
                "--config",
                c,
                "--state",
                s,
                "--pcap",
                "/nonexistent.pcap"
            ]),
            EXIT_BAD_INPUT
        );
        std::fs::write(
            &state,
            "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: 1}\n",
        )
        .unwrap();
        assert_eq!(
            run([
                "kxdp",
                "replay",
                "--config",
                c,
                "--state",
                s,
                "--pcap",
                "/nonexistent.pcap"
            ]),
            EXIT_BAD_INPUT
        );
    }
}
