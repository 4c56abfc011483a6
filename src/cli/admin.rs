//! `kxdp conntrack|services|stats|monitor`: clients of a running daemon's admin socket.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use ipnet::IpNet;

use kxdp_control::admin::wire::*;

use super::client::request;
use super::{bad_input, failure, CliError};

#[derive(Clone, Copy, Debug, Default, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct AdminArgs {
    /// The daemon's admin socket.
    #[arg(long, value_name = "PATH", default_value = kxdp_control::admin::DEFAULT_SOCKET, global = true)]
    pub admin: PathBuf,
    /// Output: `table` (conntrack -L's shape) or `json` (one object per line).
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "table",
        global = true
    )]
    pub output: OutputFormat,
}

#[derive(Subcommand, Debug)]
pub enum ConntrackCommand {
    /// List connections (conntrack -L).
    #[command(alias = "-L")]
    List(CtFilterArgs),
    /// Count connections (conntrack -C).
    Count(CtFilterArgs),
    /// Show one connection (conntrack -G): -p, -s, -d and, for TCP/UDP/SCTP, --sport and --dport.
    Get(CtFilterArgs),
    /// Delete the matching connections (conntrack -D); prints each one deleted.
    Delete(CtFilterArgs),
    /// Delete every matching connection (conntrack -F; no filter: the whole table).
    Flush(CtFilterArgs),
    /// Per-worker conntrack counters (conntrack -S): insert, found, expired; table size and early drops.
    Stats,
}

/// conntrack-tools' filter names.
#[derive(Args, Debug, Default, Clone)]
pub struct CtFilterArgs {
    /// Layer 4 protocol: tcp, udp, sctp, icmp, icmpv6 or a number.
    #[arg(short = 'p', long = "proto", value_name = "PROTO")]
    pub proto: Option<String>,
    /// Original source address (or CIDR).
    #[arg(short = 's', long = "orig-src", alias = "src", value_name = "IP")]
    pub orig_src: Option<String>,
    /// Original destination address (or CIDR).
    #[arg(short = 'd', long = "orig-dst", alias = "dst", value_name = "IP")]
    pub orig_dst: Option<String>,
    /// Reply source address (or CIDR).
    #[arg(short = 'r', long = "reply-src", value_name = "IP")]
    pub reply_src: Option<String>,
    /// Reply destination address (or CIDR).
    #[arg(short = 'q', long = "reply-dst", value_name = "IP")]
    pub reply_dst: Option<String>,
    /// Original source port.
    #[arg(long = "sport", alias = "orig-port-src", value_name = "PORT")]
    pub sport: Option<u16>,
    /// Original destination port.
    #[arg(long = "dport", alias = "orig-port-dst", value_name = "PORT")]
    pub dport: Option<u16>,
    /// Reply source port.
    #[arg(long = "reply-port-src", value_name = "PORT")]
    pub reply_sport: Option<u16>,
    /// Reply destination port.
    #[arg(long = "reply-port-dst", value_name = "PORT")]
    pub reply_dport: Option<u16>,
    /// Protocol state (ESTABLISHED, SYN_SENT, TIME_WAIT, ...).
    #[arg(long = "state", value_name = "STATE")]
    pub state: Option<String>,
    /// Address family.
    #[arg(short = 'f', long = "family", value_name = "ipv4|ipv6")]
    pub family: Option<String>,
    /// The Service: `ns/name` or `ns/name:port` (kxdp's extension).
    #[arg(long = "service", value_name = "NS/NAME[:PORT]")]
    pub service: Option<String>,
}

pub fn parse_proto(s: &str) -> Result<u8, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        "icmpv6" | "ipv6-icmp" => 58,
        n => n
            .parse()
            .map_err(|_| format!("--proto: unknown protocol `{s}`"))?,
    })
}

pub fn parse_net(flag: &str, s: &str) -> Result<IpNet, String> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(n);
    }
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| format!("{flag}: `{s}` is not an IP address or CIDR"))
}

impl CtFilterArgs {
    pub fn to_filter(&self) -> Result<CtFilter, String> {
        let net =
            |flag: &str, v: &Option<String>| v.as_deref().map(|s| parse_net(flag, s)).transpose();
        Ok(CtFilter {
            proto: self.proto.as_deref().map(parse_proto).transpose()?,
            orig_src: net("--orig-src", &self.orig_src)?,
            orig_dst: net("--orig-dst", &self.orig_dst)?,
            reply_src: net("--reply-src", &self.reply_src)?,
            reply_dst: net("--reply-dst", &self.reply_dst)?,
            sport: self.sport,
            dport: self.dport,
            reply_sport: self.reply_sport,
            reply_dport: self.reply_dport,
            state: self.state.clone(),
            family: match self.family.as_deref() {
                None => None,
                Some("ipv4") | Some("4") => Some(4),
                Some("ipv6") | Some("6") => Some(6),
                Some(f) => return Err(format!("--family: `{f}` is not ipv4 or ipv6")),
            },
            service: self.service.clone(),
        })
    }
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Seconds between the two samples rates are computed from (0: totals only).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
}

#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// Only events whose source or destination (before or after NAT) is inside.
    #[arg(long, value_name = "IP|CIDR")]
    pub addr: Option<String>,
    /// Only these reasons (repeatable): no-endpoints, policy-denied-ingress, ...
    #[arg(long = "reason", value_name = "REASON")]
    pub reasons: Vec<String>,
    /// Events per second at most (the rest are counted as suppressed).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub rate: u32,
    /// Stop after N events.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

type CmdError = CliError;

fn bad(m: String) -> CmdError {
    bad_input(m)
}
fn fail(m: String) -> CmdError {
    failure(m)
}

fn out() -> std::io::BufWriter<std::io::StdoutLock<'static>> {
    std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock())
}

fn print_entry(w: &mut impl Write, l: &str, fmt: OutputFormat) -> std::io::Result<()> {
    match fmt {
        OutputFormat::Json => writeln!(w, "{l}"),
        OutputFormat::Table => {
            let e: CtEntry = serde_json::from_str(l).map_err(std::io::Error::other)?;
            writeln!(w, "{}", e.table_line())
        }
    }
}

pub fn conntrack(cmd: &ConntrackCommand, a: &AdminArgs) -> Result<(), CmdError> {
    let fmt = a.output;
    match cmd {
        ConntrackCommand::List(f) | ConntrackCommand::Get(f) => {
            let filter = f.to_filter().map_err(bad)?;
            if matches!(cmd, ConntrackCommand::Get(_)) {
                let ports = filter
                    .proto
                    .is_some_and(kxdp_dataplane::conntrack::has_ports);
                if filter.proto.is_none()
                    || filter.orig_src.is_none()
                    || filter.orig_dst.is_none()
                    || (ports && (filter.sport.is_none() || filter.dport.is_none()))
                {
                    return Err(bad("conntrack get: needs -p, -s, -d (and --sport, --dport for TCP, UDP and SCTP)".into()));
                }
            }
            let mut w = out();
            let end = request(&a.admin, &Request::ConntrackList { filter }, |l| {
                print_entry(&mut w, l, fmt)
            })
            .map_err(fail)?;
            let _ = w.flush();
            if end.is_null() {
                // The reader went away (`| head`): nothing more to say.
                return Ok(());
            }
            let n = end.get("count").and_then(|c| c.as_u64()).unwrap_or(0);
            if matches!(cmd, ConntrackCommand::Get(_)) && n == 0 {
                return Err(fail("conntrack get: no such connection".into()));
            }
            eprintln!("kxdp conntrack: {n} flow entries have been shown.");
            Ok(())
        }
        ConntrackCommand::Count(f) => {
            let filter = f.to_filter().map_err(bad)?;
            let end =
                request(&a.admin, &Request::ConntrackCount { filter }, |_| Ok(())).map_err(fail)?;
            let n = end.get("count").and_then(|c| c.as_u64()).unwrap_or(0);
            match fmt {
                OutputFormat::Json => println!("{}", serde_json::json!({ "count": n })),
                OutputFormat::Table => println!("{n}"),
            }
            Ok(())
        }
        ConntrackCommand::Delete(f) | ConntrackCommand::Flush(f) => {
            let filter = f.to_filter().map_err(bad)?;
            let show = matches!(cmd, ConntrackCommand::Delete(_));
            let mut w = out();
            let end = request(&a.admin, &Request::ConntrackDelete { filter }, |l| {
                if show {
                    print_entry(&mut w, l, fmt)
                } else {
                    Ok(())
                }
            })
            .map_err(fail)?;
            let _ = w.flush();
            let n = end.get("deleted").and_then(|c| c.as_u64()).unwrap_or(0);
            if show {
                eprintln!("kxdp conntrack: {n} flow entries have been deleted.");
            } else if fmt == OutputFormat::Json {
                println!("{}", serde_json::json!({ "deleted": n }));
            } else {
                println!("kxdp conntrack: connection tracking table has been emptied ({n} flow entries deleted).");
            }
            Ok(())
        }
        ConntrackCommand::Stats => {
            let mut rows = Vec::new();
            let end = request(&a.admin, &Request::ConntrackStats, |l| {
                rows.push(serde_json::from_str::<WorkerRow>(l).map_err(std::io::Error::other)?);
                Ok(())
            })
            .map_err(fail)?;
            let mut w = out();
            let g = |k: &str| end.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            match fmt {
                OutputFormat::Json => {
                    for r in &rows {
                        let _ = writeln!(
                            w,
                            "{}",
                            serde_json::json!({"worker": r.worker, "insert": r.ct_insert, "found": r.ct_found, "expired": r.ct_expired})
                        );
                    }
                    let _ = writeln!(
                        w,
                        "{}",
                        serde_json::json!({"entries": g("entries"), "max_entries": g("max_entries"), "early_drop": g("early_drops")})
                    );
                }
                OutputFormat::Table => {
                    for r in &rows {
                        let _ = writeln!(
                            w,
                            "worker={:<3} insert={} found={} expired={}",
                            r.worker, r.ct_insert, r.ct_found, r.ct_expired
                        );
                    }
                    let _ = writeln!(
                        w,
                        "entries={} max={} early_drop={}",
                        g("entries"),
                        g("max_entries"),
                        g("early_drops")
                    );
                }
            }
            let _ = w.flush();
            Ok(())
        }
    }
}

pub fn services(a: &AdminArgs) -> Result<(), CmdError> {
    let mut w = out();
    let fmt = a.output;
    if fmt == OutputFormat::Table {
        let _ = writeln!(
            w,
            "{:<5} {:<28} {:<12} {:<30} BACKEND",
            "ID", "FRONTEND", "SERVICE TYPE", "SERVICE"
        );
    }
    request(&a.admin, &Request::Services, |l| {
        if fmt == OutputFormat::Json {
            return writeln!(w, "{l}");
        }
        let r: ServiceRow = serde_json::from_str(l).map_err(std::io::Error::other)?;
        let proto = match &r.proto {
            serde_json::Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let fe = format!("{}/{}", r.frontend, proto);
        let id = r.id % 100_000;
        if r.backends.is_empty() {
            return writeln!(
                w,
                "{id:<5} {fe:<28} {:<12} {:<30} (none)",
                r.kind, r.service
            );
        }
        for (i, b) in r.backends.iter().enumerate() {
            let local = if b.local { " local" } else { "" };
            let be = format!("{}. {}/{} ({}{local})", i + 1, b.address, proto, b.state);
            if i == 0 {
                writeln!(w, "{id:<5} {fe:<28} {:<12} {:<30} {be}", r.kind, r.service)?;
            } else {
                writeln!(w, "{:<5} {:<28} {:<12} {:<30} {be}", "", "", "", "")?;
            }
        }
        Ok(())
    })
    .map_err(fail)?;
    let _ = w.flush();
    Ok(())
}

fn sample(a: &AdminArgs) -> Result<(Vec<WorkerRow>, serde_json::Value), CmdError> {
    let mut rows = Vec::new();
    let end = request(&a.admin, &Request::Stats, |l| {
        rows.push(serde_json::from_str::<WorkerRow>(l).map_err(std::io::Error::other)?);
        Ok(())
    })
    .map_err(fail)?;
    Ok((rows, end))
}

pub fn stats(args: &StatsArgs, a: &AdminArgs) -> Result<(), CmdError> {
    if !(args.interval.is_finite() && args.interval >= 0.0) {
        return Err(bad("--interval: must be a non-negative number".into()));
    }
    let (first, _) = sample(a)?;
    let (rows, end) = if args.interval > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(args.interval));
        sample(a)?
    } else {
        (first.clone(), serde_json::Value::Null)
    };
    let end = if end.is_null() { sample(a)?.1 } else { end };
    let mut w = out();
    for r in &rows {
        let prev = first.iter().find(|p| p.worker == r.worker);
        let (mpps, busy) = match prev {
            Some(p) if r.now_ms > p.now_ms && args.interval > 0.0 => {
                let dt_ns = (r.now_ms - p.now_ms) as f64 * 1e6;
                (
                    (r.packets - p.packets) as f64 / dt_ns * 1e3,
                    ((r.busy_ns - p.busy_ns) as f64 / dt_ns).min(1.0),
                )
            }
            _ => (0.0, 0.0),
        };
        match a.output {
            OutputFormat::Json => {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["mpps"] = mpps.into();
                v["busy"] = busy.into();
                let _ = writeln!(w, "{v}");
            }
            OutputFormat::Table => {
                let drops: Vec<String> = r.drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(
                    w,
                    "worker {:<3} packets={} batches={} mpps={:.3} busy={:.1}% drops: {}",
                    r.worker,
                    r.packets,
                    r.batches,
                    mpps,
                    busy * 100.0,
                    if drops.is_empty() {
                        "none".into()
                    } else {
                        drops.join(" ")
                    }
                );
            }
        }
    }
    let g = |k: &str| end.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    match a.output {
        OutputFormat::Json => {
            let _ = writeln!(
                w,
                "{}",
                serde_json::json!({"conntrack_entries": g("entries"), "conntrack_max": g("max_entries"), "early_drops": g("early_drops")})
            );
        }
        OutputFormat::Table => {
            let _ = writeln!(
                w,
                "conntrack entries={} max={} early_drops={}",
                g("entries"),
                g("max_entries"),
                g("early_drops")
            );
        }
    }
    let _ = w.flush();
    Ok(())
}

pub fn monitor(args: &MonitorArgs, a: &AdminArgs) -> Result<(), CmdError> {
    let filter = MonitorFilter {
        addr: args
            .addr
            .as_deref()
            .map(|s| parse_net("--addr", s))
            .transpose()
            .map_err(bad)?,
        reasons: args.reasons.clone(),
        rate: Some(args.rate),
    };
    for r in &filter.reasons {
        if kxdp_dataplane::verdict::Reason::from_code(r).is_none() {
            return Err(bad(format!("--reason: unknown reason `{r}`")));
        }
    }
    let mut n = 0u64;
    let limit = args.count;
    let fmt = a.output;
    let r = request(&a.admin, &Request::Monitor { filter }, |l| {
        let v: serde_json::Value = serde_json::from_str(l).map_err(std::io::Error::other)?;
        let mut w = std::io::stdout().lock();
        if v.get("monitoring").is_some() {
            eprintln!("kxdp monitor: listening for drops and rejects (Ctrl-C to stop)");
            return Ok(());
        }
        if v.get("suppressed").is_some() {
            if fmt == OutputFormat::Json {
                writeln!(w, "{l}")?;
            } else {
                writeln!(
                    w,
                    "... {} events suppressed by the rate limit, {} lost",
                    v["suppressed"], v["lost"]
                )?;
            }
            return w.flush();
        }
        if fmt == OutputFormat::Json {
            writeln!(w, "{l}")?;
        } else {
            let e: EventRow = serde_json::from_str(l).map_err(std::io::Error::other)?;
            writeln!(
                w,
                "{} {:<7} {:<24} {} {} -> {}{}",
                e.time,
                e.action.to_uppercase(),
                e.reason,
                e.proto
                    .as_ref()
                    .map(|p| p.as_str().map(str::to_string).unwrap_or(p.to_string()))
                    .unwrap_or_default(),
                e.src.unwrap_or_default(),
                e.dst.unwrap_or_default(),
                e.service
                    .map(|s| format!(" service={s}"))
                    .unwrap_or_default()
            )?;
        }
        w.flush()?;
        n += 1;
        if limit.is_some_and(|l| n >= l) {
            // Closing the connection ends the server's stream.
            return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        }
        Ok(())
    });
    r.map(|_| ()).map_err(fail)
}
