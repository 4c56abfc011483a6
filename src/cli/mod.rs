//! The `kxdp` command line: parsing, loading, calling the library crates, and the one place
//! their typed errors become exit codes. Formatting lives in `crate::output`; the admin socket's
//! client commands in `admin`.
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad input (unreadable or invalid config, state,
//! pcap, flags), with a message on stderr naming the file, the document and the field.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use kxdp_dataplane::replay::{replay, ReplayOptions};

use kxdp_control::{load_state, translate, Config, RunError};

use crate::output::{verdict_line, Summary};

pub mod admin;
pub mod client;
pub mod traffic;

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
    /// Log format on stderr: text (colour only on a terminal) or json (one object per line).
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: crate::logging::LogFormat,
    /// Log level or RUST_LOG-style directives (`debug`, `kxdp_control=debug,warn`); wins over
    /// -v and RUST_LOG.
    #[arg(long, value_name = "LEVEL", global = true, value_parser = crate::logging::parse_level)]
    log_level: Option<String>,
    /// More logs: -v info, -vv debug, -vvv trace.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the version.
    Version,
    /// The daemon: syncs from the API server (or `--state` files watched for changes),
    /// publishes the tables to AF_XDP workers on the configured interfaces, serves /metrics,
    /// health and the admin socket.
    Run(RunArgs),
    /// Prepare this node for `kxdp run` with this config, then exit: the huge-page tmpfs for
    /// the conntrack state file (conntrack.stateFileHugePages). For an init container that may
    /// mount (CAP_SYS_ADMIN) where the daemon's container may not.
    Prepare {
        /// DataplaneConfiguration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
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
        command: Box<admin::ConntrackCommand>,
        #[command(flatten)]
        admin: admin::AdminArgs,
    },
    /// A running daemon at a glance: ready or not, the tables' generation and last
    /// publication, their source and its health, the interfaces (XDP mode, sockets), drops and
    /// conntrack.
    Status {
        #[command(flatten)]
        admin: admin::AdminArgs,
    },
    /// Services of a running daemon: frontend -> backends with their state.
    Services {
        #[command(flatten)]
        admin: admin::AdminArgs,
    },
    /// Per-worker packets, batches, Mpps, busy share and drops by reason of a running daemon.
    Stats {
        #[command(flatten)]
        args: admin::StatsArgs,
        #[command(flatten)]
        admin: admin::AdminArgs,
    },
    /// Live packet events of a running daemon: drops and rejects (the default), policy verdicts,
    /// traces of forwarded packets; sampled, rate-limited, optionally with hex dumps.
    Monitor {
        #[command(flatten)]
        args: admin::MonitorArgs,
        #[command(flatten)]
        admin: admin::AdminArgs,
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
    /// Send generated UDP flows (or a capture's frames) out of an interface through an AF_XDP
    /// socket at a given rate: the lab's load generator. Prints one JSON line.
    Send(traffic::SendArgs),
    /// Count the frames arriving on an interface (AF_XDP) and the latency of `pcap send`'s
    /// timestamped frames. Prints one JSON line.
    Sink(traffic::SinkArgs),
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// How a new connection would be decided: the Service translation (every eligible backend),
    /// the policies selecting source and destination, and the rule that allows it or why none
    /// does. Asks the running daemon, or reads --config and --state.
    Trace(TraceArgs),
    /// New connections each policy rule of a running daemon decided (allowed or denied), for
    /// the policies selecting a pod of its node; rules that decided none are left out.
    Counters {
        #[command(flatten)]
        admin: admin::AdminArgs,
    },
}

#[derive(Args, Debug)]
struct TraceArgs {
    /// Offline: the DataplaneConfiguration file (with --state). Without both, the running
    /// daemon is asked (its state and the tables its workers use).
    #[arg(long, value_name = "FILE", requires = "state")]
    config: Option<PathBuf>,
    /// Offline: Kubernetes manifests, a file or a directory (with --config).
    #[arg(long, value_name = "PATH", requires = "config")]
    state: Option<PathBuf>,
    /// The running daemon's admin socket (when --config and --state are not given).
    #[arg(long, value_name = "PATH", default_value = kxdp_control::admin::DEFAULT_SOCKET, conflicts_with = "state")]
    admin: PathBuf,
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
    /// Packets per second of the capture's timestamps (the replay's conntrack clock).
    #[arg(long, value_name = "PPS", default_value_t = crate::pcapgen::DEFAULT_RATE_PPS)]
    rate: u64,
    /// Client addresses the flows come from (1 to 65534; fewer: more source ports per client).
    #[arg(long, value_name = "N", default_value_t = crate::pcapgen::CLIENT_ADDRS as u32)]
    clients: u32,
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
    #[arg(long, value_name = "PATH", default_value = kxdp_control::admin::DEFAULT_SOCKET)]
    admin: PathBuf,
    /// Do not serve the admin socket.
    #[arg(long)]
    no_admin: bool,
    /// Takeover socket: a new `kxdp run` takes the dataplane over from the one listening here
    /// without losing a packet; this one listens here for its successor (mode 0600, root only).
    #[arg(long, value_name = "PATH", default_value = kxdp_control::takeover::DEFAULT_SOCKET)]
    takeover_socket: PathBuf,
    /// Neither take over a running kxdp nor listen for a successor.
    #[arg(long)]
    no_takeover: bool,
    /// Start clean: do not take over a running kxdp (still listen for a successor).
    #[arg(long)]
    clean_start: bool,
    /// After handing the dataplane to a successor, stay idle until SIGTERM instead of exiting
    /// (a DaemonSet's container that exits is restarted; see docs/operations.md).
    #[arg(long)]
    wait_after_handover: bool,
    /// Testing: receive the running kxdp's dataplane, then report a failure instead of adopting
    /// it (the running one resumes).
    #[arg(long, hide = true)]
    takeover_fail_for_test: bool,
    /// Testing: claim another dataplane description version (a layout change).
    #[arg(long, hide = true, value_name = "N")]
    takeover_description_for_test: Option<u32>,
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
    /// Run the egress stage after the pipeline against this node's routes (YAML or JSON: links,
    /// localAddresses, routes, neighbours, fdb, kernelPort; see docs/cli.md), as `kxdp run` does.
    #[arg(long, value_name = "FILE")]
    routes: Option<PathBuf>,
    /// Keep the conntrack table in a state file made at PATH (which must not exist; removed at
    /// the end), as `kxdp run` with conntrack.stateFile does: the file's filesystem decides its
    /// pages (a tmpfs without `huge=` gives 4 KiB ones).
    #[arg(long, value_name = "PATH")]
    conntrack_file: Option<PathBuf>,
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
    crate::logging::init(&crate::logging::LogOptions {
        format: cli.log_format,
        level: cli.log_level.clone(),
        verbose: cli.verbose,
        default_level: if matches!(cli.command, Command::Run(_)) {
            "info"
        } else {
            "warn"
        },
    });
    match cli.command {
        Command::Version => {
            println!("kxdp {}", env!("CARGO_PKG_VERSION"));
            EXIT_OK
        }
        Command::Run(args) => {
            let ops = kxdp_control::admin::servers::OpsOptions {
                admin_socket: Some(args.admin.clone()),
                no_admin: args.no_admin,
                inject_pcap: args.inject_pcap.clone(),
            };
            finish(
                kxdp_control::run::run(
                    &args.config,
                    args.state.clone(),
                    args.kubeconfig.clone(),
                    ops,
                    kxdp_control::takeover::TakeoverOptions {
                        socket: (!args.no_takeover).then(|| args.takeover_socket.clone()),
                        clean_start: args.clean_start,
                        wait_after_handover: args.wait_after_handover,
                        fail_for_test: args.takeover_fail_for_test,
                        description_for_test: args.takeover_description_for_test,
                    },
                )
                .map_err(run_error),
            )
        }
        Command::Prepare { config } => finish(cmd_prepare(&config)),
        Command::Replay(args) => finish(cmd_replay(&args)),
        Command::Pcap {
            command: PcapCommand::Gen(args),
        } => finish(cmd_pcap_gen(&args)),
        Command::Pcap {
            command: PcapCommand::Send(args),
        } => finish(traffic::send(&args)),
        Command::Pcap {
            command: PcapCommand::Sink(args),
        } => finish(traffic::sink(&args)),
        Command::Policy {
            command: PolicyCommand::Trace(args),
        } => finish(cmd_policy_trace(&args)),
        Command::Policy {
            command: PolicyCommand::Counters { admin },
        } => finish(admin::policy_counters(&admin)),
        Command::Conntrack { command, admin } => finish(admin::conntrack(&command, &admin)),
        Command::Services { admin } => finish(admin::services(&admin)),
        Command::Status { admin } => finish(admin::status(&admin)),
        Command::Stats { args, admin } => finish(admin::stats(&args, &admin)),
        Command::Monitor { args, admin } => finish(admin::monitor(&args, &admin)),
        Command::Cleanup {
            command: CleanupCommand::KubeProxy { dry_run },
        } => {
            let opts = kxdp_control::cleanup::Options {
                dry_run,
                netns: None,
            };
            let (removed, code) = match kxdp_control::cleanup::kube_proxy(&opts) {
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
            match kxdp_control::kubeproxy::convert_file(&file, cpus) {
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

/// `kxdp run`'s errors: bad input (config, state, kubeconfig) exits 2, the rest 1.
fn run_error(e: RunError) -> CliError {
    CliError {
        code: if e.is_bad_input() {
            EXIT_BAD_INPUT
        } else {
            EXIT_FAILURE
        },
        message: e.to_string(),
    }
}

fn finish(r: Result<(), CliError>) -> i32 {
    match r {
        Ok(()) => EXIT_OK,
        Err(e) => {
            if crate::logging::json() {
                tracing::error!(target: "kxdp", "kxdp: {}", e.message);
            } else {
                eprintln!("kxdp: {}", e.message);
            }
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
        rate_pps: args.rate,
        clients: args.clients,
    };
    // A spec the generator refuses (`InvalidInput`) is bad input; anything else (the directory,
    // the disk) a runtime failure.
    let summary = crate::pcapgen::generate(&spec, &args.out_dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => bad_input(format!("pcap gen: {e}")),
        _ => failure(format!("{}: {e}", args.out_dir.display())),
    })?;
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
    use kxdp_control::policy::trace::{parse_proto, parse_target, trace, TraceQuery};
    let (to, port) = parse_target(&args.to).map_err(bad_input)?;
    let proto = parse_proto(&args.proto, to).map_err(bad_input)?;
    if args.from.is_ipv4() != to.is_ipv4() {
        return Err(bad_input("--from and --to must be of the same IP family"));
    }
    let (Some(config), Some(state)) = (&args.config, &args.state) else {
        return admin::policy_trace(args.from, to, port, proto, &args.admin);
    };
    let config = Config::load(config).map_err(bad_input)?;
    let state = load_state(state).map_err(bad_input)?;
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

/// A command's failure: the exit code and the message printed as `kxdp: MESSAGE`.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

pub fn bad_input(message: impl ToString) -> CliError {
    CliError {
        code: EXIT_BAD_INPUT,
        message: message.to_string(),
    }
}

pub fn failure(message: impl ToString) -> CliError {
    CliError {
        code: EXIT_FAILURE,
        message: message.to_string(),
    }
}

fn cmd_prepare(path: &Path) -> Result<(), CliError> {
    let config = Config::load(path).map_err(bad_input)?;
    match kxdp_control::admin::servers::prepare_state_dir(&config) {
        Ok(Some(done)) => eprintln!("kxdp prepare: {done}"),
        Ok(None) => eprintln!("kxdp prepare: nothing to do"),
        Err(why) => return Err(failure(why)),
    }
    Ok(())
}

fn cmd_replay(args: &ReplayArgs) -> Result<(), CliError> {
    if let Some(path) = &args.conntrack_file {
        if path.exists() {
            return Err(bad_input(format!(
                "--conntrack-file {}: exists; a replay makes its table in a new file (and removes it at the end), so name a path that does not exist",
                path.display()
            )));
        }
    }
    let config = Config::load(&args.config).map_err(bad_input)?;
    config
        .check_memory(&kxdp_control::config::Machine::probe(), false, &args.config)
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

    let routes = match &args.routes {
        Some(p) => Some(Arc::new(
            kxdp_control::routes_file::load(p).map_err(bad_input)?,
        )),
        None => None,
    };
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
        routes: routes.clone(),
        conntrack_file: args.conntrack_file.clone(),
    };
    let snapshot = Arc::new(snapshot);
    let result = replay(snapshot.clone(), config.ct_config(), &capture, &opts).map_err(|e| {
        failure(format!(
            "--conntrack-file {}: {e}",
            args.conntrack_file
                .as_deref()
                .unwrap_or(Path::new(""))
                .display()
        ))
    })?;
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
                let egress = routes
                    .as_ref()
                    .and_then(|r| r.fib.link(v.egress))
                    .map(|l| l.name.as_str());
                writeln!(w, "{}", verdict_line(i as u64, v, names, egress))?;
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

    if result.workers != workers {
        eprintln!(
            "kxdp replay: the capture fills the conntrack table (conntrack.maxEntries): replayed on {} worker(s) instead of {workers}, so that early drop evicts the same connections as with --workers 1 (docs/cli.md)",
            result.workers
        );
    }
    let summary = Summary::new(
        result.packets,
        args.repeat,
        result.workers,
        result.seconds,
        &result.actions,
        &result.reasons,
    )
    .with_table_memory(result.table_memory);
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

/// A progress bar on stderr, only when stderr is a terminal (scripts and CI see nothing): the
/// rate in Mpps with two decimals, and an ETA only once a second of progress makes it worth
/// something (indicatif's own starts far off).
fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() || total == 0 {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} packets {mpps} eta {eta_settled}",
    ) {
        let style = style
            .with_key(
                "mpps",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&mpps_text(s.pos(), s.elapsed()));
                },
            )
            .with_key(
                "eta_settled",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&eta_text(s.pos(), s.len().unwrap_or(0), s.elapsed()));
                },
            );
        bar.set_style(style);
    }
    Some(bar)
}

/// `12.34 Mpps` (average since the start; `-` before any time has passed).
fn mpps_text(done: u64, elapsed: std::time::Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return "- Mpps".into();
    }
    format!("{:.2} Mpps", done as f64 / secs / 1e6)
}

/// The remaining time at the average rate so far, as `1m05s`; `-` during the first second or
/// before any progress.
fn eta_text(done: u64, total: u64, elapsed: std::time::Duration) -> String {
    let secs = elapsed.as_secs_f64();
    if secs < 1.0 || done == 0 {
        return "-".into();
    }
    let left = total.saturating_sub(done) as f64 * secs / done as f64;
    let left = left.round() as u64;
    if left >= 60 {
        format!("{}m{:02}s", left / 60, left % 60)
    } else {
        format!("{left}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_texts() {
        use std::time::Duration;
        assert_eq!(mpps_text(0, Duration::ZERO), "- Mpps");
        assert_eq!(mpps_text(3_000_000, Duration::from_secs(2)), "1.50 Mpps");
        assert_eq!(eta_text(10, 100, Duration::from_millis(500)), "-");
        assert_eq!(eta_text(0, 100, Duration::from_secs(5)), "-");
        assert_eq!(eta_text(50, 100, Duration::from_secs(2)), "2s");
        assert_eq!(eta_text(1, 100, Duration::from_secs(2)), "3m18s");
    }

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
