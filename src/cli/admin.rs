//! `kxdp status|conntrack|services|stats|monitor`: clients of a running daemon's admin socket.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use ipnet::IpNet;

use kxdp_control::admin::wire::*;
use kxdp_control::policy::counters::PolicyCounterRow;
use kxdp_packet::IpProto;

use super::client::request;
use super::{bad_input, failure, CliError};

#[derive(Clone, Copy, Debug, Default, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// conntrack -L's line shape (tables for the other commands).
    #[default]
    Table,
    /// One JSON object per line.
    Json,
    /// conntrack's `-o extended`: the table line with the layer 3 name and number first.
    Extended,
}

#[derive(Args, Debug, Clone)]
pub struct AdminArgs {
    /// The daemon's admin socket.
    #[arg(long, value_name = "PATH", default_value = kxdp_control::admin::DEFAULT_SOCKET, global = true)]
    pub admin: PathBuf,
    /// Output: `table` (conntrack -L's shape), `json` (one object per line) or `extended`
    /// (conntrack's `-o extended`: layer 3 name and number first).
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
    /// Per-worker conntrack counters with the kernel's names (conntrack -S): found, invalid,
    /// insert, insert_failed, drop, error, ...; then the table's entries, size and early drops.
    Stats,
    /// Stream connection events (conntrack -E): [NEW], [UPDATE], [DESTROY], with the same
    /// filters.
    #[command(alias = "-E")]
    Events(EventsArgs),
}

#[derive(Args, Debug, Default, Clone)]
pub struct EventsArgs {
    #[command(flatten)]
    pub filter: CtFilterArgs,
    /// Event types, comma-separated (conntrack's -e): NEW, UPDATE, DESTROY, ALL.
    #[arg(
        short = 'e',
        long = "event-mask",
        value_name = "TYPES",
        value_delimiter = ','
    )]
    pub event_mask: Vec<String>,
    /// How often the daemon compares the table, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=60000))]
    pub interval_ms: u64,
    /// Stop after N events.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
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
    /// Source-NATed (masqueraded) connections; with an address, NATed to it.
    #[arg(long = "src-nat", value_name = "IP[:PORT]", num_args = 0..=1, default_missing_value = "")]
    pub src_nat: Option<String>,
    /// Destination-NATed connections (to Service endpoints); with an address, to that endpoint.
    #[arg(long = "dst-nat", value_name = "IP[:PORT]", num_args = 0..=1, default_missing_value = "")]
    pub dst_nat: Option<String>,
    /// Either source- or destination-NATed; with an address, NATed to it either way.
    #[arg(long = "any-nat", value_name = "IP[:PORT]", num_args = 0..=1, default_missing_value = "")]
    pub any_nat: Option<String>,
    /// Status bits, comma-separated, all required: ASSURED, SEEN_REPLY, UNSET (neither),
    /// EXPECTED, FIXED_TIMEOUT (never set in kxdp).
    #[arg(
        short = 'u',
        long = "status",
        value_name = "STATUS",
        value_delimiter = ','
    )]
    pub status: Vec<String>,
    /// Connection mark VALUE[/MASK]. kxdp has no marks: every connection's is 0.
    #[arg(short = 'm', long = "mark", value_name = "MARK[/MASK]")]
    pub mark: Option<String>,
    /// Conntrack zone. kxdp has one table, zone 0.
    #[arg(short = 'w', long = "zone", value_name = "ZONE")]
    pub zone: Option<u16>,
}

pub fn parse_proto(s: &str) -> Result<IpProto, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "tcp" => IpProto::TCP,
        "udp" => IpProto::UDP,
        "sctp" => IpProto::SCTP,
        "icmp" => IpProto::ICMP,
        "icmpv6" | "ipv6-icmp" => IpProto::ICMPV6,
        n => IpProto(
            n.parse()
                .map_err(|_| format!("--proto: unknown protocol `{s}`"))?,
        ),
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

/// `IP[:PORT]` / `[IPv6]:PORT` / `CIDR` / empty (any) of a NAT filter.
fn parse_nat(flag: &str, s: &str) -> Result<NatMatch, String> {
    if s.is_empty() {
        return Ok(NatMatch::default());
    }
    if let Ok(n) = parse_net(flag, s) {
        return Ok(NatMatch {
            addr: Some(n),
            port: None,
        });
    }
    let (a, p) = split_endpoint(s);
    let port = p
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| format!("{flag}: `{p}` is not a port"))
        })
        .transpose()?;
    Ok(NatMatch {
        addr: Some(parse_net(flag, &a)?),
        port,
    })
}

/// conntrack's `--mark VALUE[/MASK]`, decimal or 0x-hex.
fn parse_mark(s: &str) -> Result<(u32, u32), String> {
    let num = |x: &str| {
        let r = match x.strip_prefix("0x").or_else(|| x.strip_prefix("0X")) {
            Some(h) => u32::from_str_radix(h, 16),
            None => x.parse(),
        };
        r.map_err(|_| format!("--mark: `{s}` is not VALUE[/MASK] (numbers up to 2^32-1)"))
    };
    match s.split_once('/') {
        Some((v, m)) => Ok((num(v)?, num(m)?)),
        None => Ok((num(s)?, u32::MAX)),
    }
}

impl CtFilterArgs {
    /// Says on stderr what `--mark` and `--zone` mean here (they are accepted so that scripts
    /// written for conntrack run).
    pub fn explain(&self) {
        if self.mark.is_some() {
            eprintln!(
                "kxdp conntrack: note: kxdp sets no connection marks; every connection has mark 0"
            );
        }
        if self.zone.is_some() {
            eprintln!(
                "kxdp conntrack: note: kxdp has no conntrack zones; every connection is in zone 0"
            );
        }
    }

    pub fn to_filter(&self) -> Result<CtFilter, String> {
        let net =
            |flag: &str, v: &Option<String>| v.as_deref().map(|s| parse_net(flag, s)).transpose();
        let nat =
            |flag: &str, v: &Option<String>| v.as_deref().map(|s| parse_nat(flag, s)).transpose();
        let f = CtFilter {
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
            src_nat: nat("--src-nat", &self.src_nat)?,
            dst_nat: nat("--dst-nat", &self.dst_nat)?,
            any_nat: nat("--any-nat", &self.any_nat)?,
            status: self.status.iter().map(|s| s.to_ascii_uppercase()).collect(),
            mark: self.mark.as_deref().map(parse_mark).transpose()?,
            zone: self.zone,
        };
        f.validate()?;
        Ok(f)
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
    /// Event types (repeatable): drop (the default), trace (every forwarded or passed
    /// packet), policy-verdict (new connections NetworkPolicy judged, allowed or denied).
    #[arg(short = 't', long = "type", value_name = "TYPE")]
    pub types: Vec<String>,
    /// Show one matching event in N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: Option<u32>,
    /// Hex-dump the first 128 bytes of each packet (as received).
    #[arg(long)]
    pub hex: bool,
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
        OutputFormat::Extended => {
            let e: CtEntry = serde_json::from_str(l).map_err(std::io::Error::other)?;
            writeln!(w, "{}", e.extended_line())
        }
    }
}

/// A filter from flags: bad values are bad input (exit 2, conntrack's PARAMETER_PROBLEM).
fn filter_of(f: &CtFilterArgs) -> Result<CtFilter, CmdError> {
    let filter = f.to_filter().map_err(bad)?;
    f.explain();
    Ok(filter)
}

pub fn conntrack(cmd: &ConntrackCommand, a: &AdminArgs) -> Result<(), CmdError> {
    let fmt = a.output;
    match cmd {
        ConntrackCommand::List(f) | ConntrackCommand::Get(f) => {
            let filter = filter_of(f)?;
            if matches!(cmd, ConntrackCommand::Get(_)) {
                let ports = filter.proto.is_some_and(|p| p.has_ports());
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
            let filter = filter_of(f)?;
            let end =
                request(&a.admin, &Request::ConntrackCount { filter }, |_| Ok(())).map_err(fail)?;
            let n = end.get("count").and_then(|c| c.as_u64()).unwrap_or(0);
            match fmt {
                OutputFormat::Json => println!("{}", serde_json::json!({ "count": n })),
                _ => println!("{n}"),
            }
            Ok(())
        }
        ConntrackCommand::Delete(f) | ConntrackCommand::Flush(f) => {
            let filter = filter_of(f)?;
            let filtered = filter != CtFilter::default();
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
                // As conntrack -D: deleting nothing is a failure.
                if n == 0 {
                    return Err(fail("conntrack delete: no connection matched".into()));
                }
            } else if fmt == OutputFormat::Json {
                println!("{}", serde_json::json!({ "deleted": n }));
            } else if filtered {
                println!("kxdp conntrack: {n} flow entries matching the filter have been deleted; the rest of the table is kept.");
            } else {
                println!("kxdp conntrack: connection tracking table has been emptied ({n} flow entries deleted).");
            }
            Ok(())
        }
        ConntrackCommand::Events(e) => events(e, a),
        ConntrackCommand::Stats => {
            let mut rows = Vec::new();
            let end = request(&a.admin, &Request::ConntrackStats, |l| {
                rows.push(serde_json::from_str::<WorkerRow>(l).map_err(std::io::Error::other)?);
                Ok(())
            })
            .map_err(fail)?;
            let mut w = out();
            let g = |k: &str| end.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            // The kernel's per-CPU names, per worker. search_restart, clash_resolve and
            // chaintoolong are always 0: the table has no hash chains and its lookups never
            // restart (a lookup racing a writer is a miss). early_drop is the table's, on the
            // last line: the table does not know which worker's insert evicted an entry.
            let counters = |r: &WorkerRow| {
                [
                    ("found", r.ct_found),
                    ("invalid", r.ct_invalid),
                    ("insert", r.ct_insert),
                    ("insert_failed", r.ct_insert_failed),
                    ("drop", r.ct_drop),
                    ("error", r.ct_error),
                    ("search_restart", 0),
                    ("clash_resolve", 0),
                    ("chaintoolong", 0),
                    ("expired", r.ct_expired),
                ]
            };
            match fmt {
                OutputFormat::Json => {
                    for r in &rows {
                        let mut o = serde_json::Map::new();
                        o.insert("worker".into(), r.worker.into());
                        for (k, v) in counters(r) {
                            o.insert(k.into(), v.into());
                        }
                        let _ = writeln!(w, "{}", serde_json::Value::Object(o));
                    }
                    let _ = writeln!(
                        w,
                        "{}",
                        serde_json::json!({"entries": g("entries"), "max_entries": g("max_entries"), "early_drop": g("early_drops")})
                    );
                }
                _ => {
                    for r in &rows {
                        let fields: Vec<String> = counters(r)
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect();
                        let _ = writeln!(w, "worker={:<3} {}", r.worker, fields.join(" "));
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
    if fmt != OutputFormat::Json {
        let _ = writeln!(
            w,
            "{:<10} {:<28} {:<12} {:<30} BACKEND",
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
        // The Service port's stable id, whole (JSON `id`, conntrack and monitor `service_id`).
        let id = r.id;
        if r.backends.is_empty() {
            return writeln!(
                w,
                "{id:<10} {fe:<28} {:<12} {:<30} (none)",
                r.kind, r.service
            );
        }
        for (i, b) in r.backends.iter().enumerate() {
            let local = if b.local { " local" } else { "" };
            let be = format!("{}. {}/{} ({}{local})", i + 1, b.address, proto, b.state);
            if i == 0 {
                writeln!(w, "{id:<10} {fe:<28} {:<12} {:<30} {be}", r.kind, r.service)?;
            } else {
                writeln!(w, "{:<10} {:<28} {:<12} {:<30} {be}", "", "", "", "")?;
            }
        }
        Ok(())
    })
    .map_err(fail)?;
    let _ = w.flush();
    Ok(())
}

/// `kxdp policy counters`: new connections per policy rule, one line each.
pub fn policy_counters(a: &AdminArgs) -> Result<(), CmdError> {
    let mut w = out();
    let fmt = a.output;
    if fmt != OutputFormat::Json {
        let _ = writeln!(
            w,
            "{:<21} {:<40} {:<9} {:<10} {:<7} CONNECTIONS",
            "KIND", "POLICY", "DIRECTION", "RULE", "VERDICT"
        );
    }
    request(&a.admin, &Request::PolicyCounters, |l| {
        if fmt == OutputFormat::Json {
            return writeln!(w, "{l}");
        }
        let r: PolicyCounterRow = serde_json::from_str(l).map_err(std::io::Error::other)?;
        writeln!(
            w,
            "{:<21} {:<40} {:<9} {:<10} {:<7} {}",
            r.kind, r.policy, r.direction, r.rule, r.verdict, r.connections
        )
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
            _ => {
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
    // The AF_XDP sockets: frames the kernel lost before kxdp saw them (cumulative).
    let sockets: Vec<SocketRow> = end
        .get("sockets")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    for s in &sockets {
        match a.output {
            OutputFormat::Json => {
                let _ = writeln!(w, "{}", serde_json::to_value(s).unwrap_or_default());
            }
            _ => {
                let _ = writeln!(
                    w,
                    "socket {}/{} worker {}: kernel rx_ring_full={} rx_dropped={} fill_ring_empty={} invalid_descs={}/{} rings rx={} fill={} tx={} completion={}",
                    s.interface,
                    s.queue,
                    s.worker,
                    s.rx_ring_full,
                    s.rx_dropped,
                    s.rx_fill_ring_empty,
                    s.rx_invalid_descs,
                    s.tx_invalid_descs,
                    s.rx_ring_size,
                    s.fill_ring_size,
                    s.tx_ring_size,
                    s.completion_ring_size,
                );
            }
        }
    }
    // kxdp's tap: frames the kernel dropped for want of room in a queue (cumulative).
    let tap: Option<TapRow> = end
        .get("tap")
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    if let Some(t) = &tap {
        let _ = match a.output {
            OutputFormat::Json => writeln!(w, "{}", serde_json::to_value(t).unwrap_or_default()),
            _ => writeln!(w, "tap {}: kernel queue_full={}", t.tap, t.queue_full),
        };
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
        _ => {
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
        types: args.types.clone(),
        sample: args.sample,
        hex: args.hex,
    };
    for r in &filter.reasons {
        if kxdp_dataplane::verdict::Reason::from_code(r).is_none() {
            return Err(bad(format!("--reason: unknown reason `{r}`")));
        }
    }
    for t in &filter.types {
        if !MONITOR_TYPES.contains(&t.as_str()) {
            return Err(bad(format!(
                "--type: unknown event type `{t}` (one of {})",
                MONITOR_TYPES.join(", ")
            )));
        }
    }
    let what = if filter.types.is_empty() {
        "drops and rejects".to_string()
    } else {
        filter.types.join(", ") + " events"
    };
    let mut n = 0u64;
    let limit = args.count;
    let fmt = a.output;
    let r = request(&a.admin, &Request::Monitor { filter }, |l| {
        let v: serde_json::Value = serde_json::from_str(l).map_err(std::io::Error::other)?;
        let mut w = std::io::stdout().lock();
        if v.get("monitoring").is_some() {
            eprintln!("kxdp monitor: listening for {what} (Ctrl-C to stop)");
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
            writeln!(w, "{}", event_text(&e))?;
            if let Some(h) = &e.hex {
                write!(w, "{}", hex_dump(h))?;
            }
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

/// One monitor event for people:
/// `TIME ACTION  REASON  PROTO SRC -> DST [=> OUT_SRC -> OUT_DST] [service=NS/NAME:PORT (id N)] [policy-verdict: allow]`.
fn event_text(e: &EventRow) -> String {
    let mut s = format!(
        "{} {:<7} {:<24} {} {} -> {}",
        e.time,
        e.action.to_uppercase(),
        e.reason,
        e.proto
            .as_ref()
            .map(|p| p.as_str().map(str::to_string).unwrap_or(p.to_string()))
            .unwrap_or_default(),
        e.src.as_deref().unwrap_or_default(),
        e.dst.as_deref().unwrap_or_default(),
    );
    if let (Some(os), Some(od)) = (&e.out_src, &e.out_dst) {
        s.push_str(&format!(" => {os} -> {od}"));
    }
    if let Some(svc) = &e.service {
        s.push_str(&format!(" service={svc}"));
        if let Some(id) = e.service_id {
            s.push_str(&format!(" (id {id})"));
        }
    }
    if let Some(p) = &e.policy {
        s.push_str(&format!(" policy-verdict: {p}"));
    }
    s
}

/// `xxd`-like lines of a hex string: offset, then 16 bytes in groups of two.
fn hex_dump(hex: &str) -> String {
    let bytes = hex.as_bytes();
    let mut out = String::new();
    for (row, chunk) in bytes.chunks(32).enumerate() {
        let pairs: Vec<String> = chunk
            .chunks(4)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        out.push_str(&format!("  {:04x}: {}\n", row * 16, pairs.join(" ")));
    }
    out
}

/// `kxdp conntrack events` (conntrack -E).
fn events(args: &EventsArgs, a: &AdminArgs) -> Result<(), CmdError> {
    let filter = filter_of(&args.filter)?;
    let mut mask = CtEventMask {
        interval_ms: Some(args.interval_ms),
        ..Default::default()
    };
    for t in &args.event_mask {
        match t.to_ascii_uppercase().as_str() {
            "NEW" => mask.new = true,
            "UPDATE" => mask.update = true,
            "DESTROY" => mask.destroy = true,
            "ALL" => {
                mask.new = true;
                mask.update = true;
                mask.destroy = true;
            }
            _ => {
                return Err(bad(format!(
                    "--event-mask: unknown event `{t}` (NEW, UPDATE, DESTROY or ALL)"
                )))
            }
        }
    }
    let fmt = a.output;
    let limit = args.count;
    let mut n = 0u64;
    let r = request(
        &a.admin,
        &Request::ConntrackEvents {
            filter,
            events: mask,
        },
        |l| {
            let mut w = std::io::stdout().lock();
            if l.starts_with("{\"watching\"") {
                eprintln!("kxdp conntrack: listening for connection events (Ctrl-C to stop)");
                return Ok(());
            }
            if fmt == OutputFormat::Json {
                writeln!(w, "{l}")?;
            } else {
                let e: CtEventRow = serde_json::from_str(l).map_err(std::io::Error::other)?;
                writeln!(
                    w,
                    "{}",
                    e.entry.event_line(&e.event, fmt == OutputFormat::Extended)
                )?;
            }
            w.flush()?;
            n += 1;
            if limit.is_some_and(|l| n >= l) {
                // Closing the connection ends the server's stream.
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            }
            Ok(())
        },
    );
    r.map(|_| ()).map_err(fail)?;
    // stderr may be gone by now (a reader that stopped listening): not an error.
    let _ = writeln!(
        std::io::stderr(),
        "kxdp conntrack: {n} flow events have been shown."
    );
    Ok(())
}

/// `kxdp policy trace` against a running daemon: its state and its published tables.
pub fn policy_trace(
    from: IpAddr,
    to: IpAddr,
    port: u16,
    proto: IpProto,
    admin: &std::path::Path,
) -> Result<(), CmdError> {
    let end = request(
        admin,
        &Request::PolicyTrace {
            from,
            to,
            port,
            proto,
        },
        |_| Ok(()),
    )
    .map_err(fail)?;
    print!(
        "{}",
        end.get("text").and_then(|t| t.as_str()).unwrap_or_default()
    );
    Ok(())
}

/// `kxdp status`: the daemon at a glance. `-o json`: the daemon's answer as one JSON object.
pub fn status(a: &AdminArgs) -> Result<(), CmdError> {
    let end = request(&a.admin, &Request::Status, |_| Ok(())).map_err(fail)?;
    let mut w = out();
    let text = match a.output {
        OutputFormat::Json => format!("{end}\n"),
        _ => status_text(&end),
    };
    let _ = w.write_all(text.as_bytes());
    let _ = w.flush();
    Ok(())
}

/// The human form of the `status` answer.
fn status_text(s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let mut o = String::new();
    let ready = s["ready"].as_bool().unwrap_or(false);
    let health = match s["healthy"].as_bool() {
        Some(true) => ", /healthz ok",
        Some(false) => ", /healthz failing",
        None => "",
    };
    let _ = writeln!(
        o,
        "ready:       {}{health}",
        if ready {
            "yes"
        } else {
            "no (the first sync has not completed)"
        }
    );
    let last = match s["last_sync"].as_str() {
        // To the second: the JSON keeps the nanoseconds.
        Some(t) => format!(
            "last published {} ({:.0}s ago, took {:.1} ms)",
            t.split_once('.')
                .map_or(t.to_string(), |(s, _)| format!("{s}Z")),
            s["last_sync_ago_s"].as_f64().unwrap_or(0.0),
            s["last_sync_duration_ms"].as_f64().unwrap_or(0.0)
        ),
        None => "never published".into(),
    };
    let stale = s["stale_since"]
        .as_str()
        .map(|t| format!("; changes waiting since {t}"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "tables:      generation {}, {last}, {} sync(s), {} problem(s){stale}",
        u(&s["generation"]),
        u(&s["syncs"]),
        u(&s["problems"]),
    );
    let src = &s["source"];
    let kind = match src["kind"].as_str().unwrap_or("") {
        "files" => "--state files",
        "api-server" => "API server",
        other => other,
    };
    let detail = src["detail"]
        .as_str()
        .filter(|d| !d.is_empty())
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    let errors: Vec<String> = src["errors"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let src_health = if !errors.is_empty() {
        format!("failing: {}", errors.join("; "))
    } else if src["healthy"].as_bool() == Some(true) {
        "healthy".into()
    } else {
        "not synced yet".into()
    };
    let _ = writeln!(o, "source:      {kind}{detail}, {src_health}");
    let ifaces = s["interfaces"].as_array().cloned().unwrap_or_default();
    let configured: Vec<&str> = s["interfaces_configured"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    if ifaces.is_empty() {
        let _ = writeln!(
            o,
            "interfaces:  {}",
            if configured.is_empty() {
                "none configured (no packet is forwarded by kxdp)".to_string()
            } else {
                format!("none attached (configured: {})", configured.join(", "))
            }
        );
    }
    for (n, i) in ifaces.iter().enumerate() {
        let head = if n == 0 { "interfaces:" } else { "" };
        let name = i["name"].as_str().unwrap_or("?");
        let line = if i["attached"].as_bool() == Some(true) {
            format!(
                "{name:<16} attached, XDP {}, {} socket(s), {} queue(s), AF_XDP {}, driver {}",
                i["xdp_mode"].as_str().unwrap_or("?"),
                u(&i["sockets"]),
                u(&i["queues"]),
                if i["zero_copy"].as_bool() == Some(true) {
                    "zero-copy"
                } else {
                    "copy mode"
                },
                i["driver"]
                    .as_str()
                    .filter(|d| !d.is_empty())
                    .unwrap_or("?"),
            )
        } else {
            format!(
                "{name:<16} NOT attached: {}",
                i["error"].as_str().unwrap_or("?")
            )
        };
        let _ = writeln!(o, "{head:<12} {line}");
    }
    let drops = &s["drops"];
    let top: Vec<String> = drops["top"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| format!("{} {}", d["reason"].as_str().unwrap_or("?"), u(&d["count"])))
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "drops:       {} total{}",
        u(&drops["total"]),
        if top.is_empty() {
            String::new()
        } else {
            format!(" (top: {})", top.join(", "))
        }
    );
    let ct = &s["conntrack"];
    let _ = writeln!(
        o,
        "conntrack:   {}/{} entries, {} early drop(s)",
        u(&ct["entries"]),
        u(&ct["max_entries"]),
        u(&ct["early_drops"]),
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_text_shape() {
        let s = serde_json::json!({
            "ready": true, "healthy": true, "generation": 7, "syncs": 3, "problems": 0,
            "last_sync": "2026-01-01T00:00:00.000000000Z", "last_sync_ago_s": 2.0,
            "last_sync_duration_ms": 1.25, "stale_since": null,
            "source": {"kind": "api-server", "detail": "", "healthy": false,
                       "errors": {"services": "connection refused"}},
            "interfaces_configured": ["eth0", "veth*"],
            "interfaces": [
                {"name": "eth0", "attached": true, "xdp_mode": "native", "sockets": 2,
                 "queues": 2, "zero_copy": true, "driver": "ixgbe"},
                {"name": "vethx", "attached": false, "error": "no XDP", "sockets": 0}
            ],
            "drops": {"total": 12, "top": [{"reason": "no-endpoints", "count": 10},
                                           {"reason": "malformed", "count": 2}]},
            "conntrack": {"entries": 5, "max_entries": 1024, "early_drops": 0}
        });
        let t = status_text(&s);
        for want in [
            "ready:       yes, /healthz ok\n",
            "tables:      generation 7, last published 2026-01-01T00:00:00Z (2s ago, took 1.2 ms), 3 sync(s), 0 problem(s)\n",
            "source:      API server, failing: services: connection refused\n",
            "interfaces:  eth0             attached, XDP native, 2 socket(s), 2 queue(s), AF_XDP zero-copy, driver ixgbe\n",
            "             vethx            NOT attached: no XDP\n",
            "drops:       12 total (top: no-endpoints 10, malformed 2)\n",
            "conntrack:   5/1024 entries, 0 early drop(s)\n",
        ] {
            assert!(t.contains(want), "{want:?} not in:\n{t}");
        }
    }

    #[test]
    fn nat_and_mark_values() {
        assert_eq!(parse_nat("--src-nat", "").unwrap(), NatMatch::default());
        let m = parse_nat("--dst-nat", "10.1.0.10:8080").unwrap();
        assert_eq!(m.addr, Some("10.1.0.10/32".parse().unwrap()));
        assert_eq!(m.port, Some(8080));
        let m = parse_nat("--dst-nat", "[fd00::1]:80").unwrap();
        assert_eq!(m.port, Some(80));
        assert!(parse_nat("--dst-nat", "10.1.0.10:http").is_err());
        assert_eq!(parse_mark("0x10/0xff").unwrap(), (16, 255));
        assert_eq!(parse_mark("7").unwrap(), (7, u32::MAX));
        assert!(parse_mark("x").is_err());
        let f = CtFilterArgs {
            state: Some("bogus".into()),
            ..Default::default()
        };
        assert!(f.to_filter().unwrap_err().contains("unknown state `bogus`"));
        let f = CtFilterArgs {
            status: vec!["assured".into(), "NOPE".into()],
            ..Default::default()
        };
        assert!(f.to_filter().unwrap_err().contains("--status"));
    }

    #[test]
    fn hex_dump_rows() {
        let h = "45".repeat(18);
        assert_eq!(
            hex_dump(&h),
            "  0000: 4545 4545 4545 4545 4545 4545 4545 4545\n  0010: 4545\n"
        );
    }
}
