//! The admin API: a Unix socket (default `/run/kxdp/admin.sock`, mode 0600) served by the control
//! side of `kxdp run`, never on the network. Only root may talk to it: the server reads the
//! peer's credentials (SO_PEERCRED) on every connection and refuses any other uid (the daemon's
//! own uid is accepted too, so that an unprivileged test daemon can be driven by its own user).
//!
//! Everything is read without stopping workers: conntrack is listed by walking the shared table
//! (each entry read under its own sequence number, see `conntrack::table`), counters come from
//! what the workers publish after each batch (`kxdp_dataplane::stats`), Services from the
//! published snapshot. Answers stream: a 1M-entry listing is written entry by entry into the
//! socket (the handler thread blocks on a slow reader; nothing else does).
//!
//! Wire format: see `wire`. Each connection is served on a thread of its own. The client side
//! (the `kxdp conntrack|services|stats|monitor` commands) lives in the `kxdp` binary crate.

mod inject;
pub mod servers;
pub mod wire;

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kxdp_dataplane::clock::clock_ms;
use kxdp_dataplane::conntrack::Conntrack;
use kxdp_dataplane::stats::{DataplaneStats, Event};
use kxdp_dataplane::verdict::{Action, Reason};
use kxdp_packet::{Family, IpProto};

use crate::status::Status;
use crate::sync::Published;
use wire::*;

/// The default socket path.
pub const DEFAULT_SOCKET: &str = "/run/kxdp/admin.sock";

/// What the dataplane shares with the admin API (and the workers): the conntrack table and the
/// workers' published counters.
#[derive(Clone)]
pub struct Dataplane {
    pub ct: Arc<Conntrack>,
    pub stats: Arc<DataplaneStats>,
}

/// What the server reads.
pub struct AdminContext {
    pub published: Arc<Published>,
    pub dataplane: Dataplane,
    pub status: Arc<Mutex<Status>>,
    /// Addresses the daemon listens on (`metrics`, `healthz`), for `kxdp stats` and tests.
    pub listening: Mutex<serde_json::Map<String, serde_json::Value>>,
    /// The control loop, for queries against the cluster state (`policy trace`); `None`: no
    /// such queries (they fail with a message saying so).
    pub control: Option<std::sync::mpsc::Sender<crate::sources::event::Update>>,
    /// What `status` reports beyond the tables and counters, filled in as `kxdp run` starts.
    pub daemon: Mutex<DaemonInfo>,
}

/// The daemon's setup as `kxdp status` shows it.
#[derive(Default)]
pub struct DaemonInfo {
    /// Where the tables come from: `api-server` or `files`.
    pub source: String,
    /// The `--state` path, or the API server's address.
    pub source_detail: String,
    /// `interfaces` of the configuration (names and patterns).
    pub interfaces: Vec<String>,
    /// The AF_XDP dataplane's link manager (None: no interfaces, or not started yet).
    pub links: Option<kxdp_dataplane::io::runner::LinksView>,
    /// What `/healthz` answers.
    pub health: Option<Arc<crate::health::ProxyHealth>>,
}

/// How many drop reasons `status` names (the rest are in `kxdp stats`).
const TOP_DROP_REASONS: usize = 5;

/// The `status` answer: readiness, the tables and their source, the interfaces, drops and
/// conntrack at a glance (`kxdp status`).
fn status(ctx: &AdminContext) -> serde_json::Value {
    use serde_json::json;
    let st = ctx.status.lock().unwrap().clone();
    let info = ctx.daemon.lock().unwrap();
    let ct = &ctx.dataplane.ct;
    let rfc3339 = |t: std::time::SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    let ago = |t: std::time::SystemTime| {
        std::time::SystemTime::now()
            .duration_since(t)
            .unwrap_or_default()
            .as_secs_f64()
    };
    // Sockets per interface, from what the workers publish.
    let mut sockets: std::collections::BTreeMap<String, usize> = Default::default();
    for s in ctx.dataplane.stats.socket_samples() {
        *sockets.entry(s.interface).or_default() += 1;
    }
    let (attached, failed) = info
        .links
        .as_ref()
        .map(|l| l.interfaces())
        .unwrap_or_default();
    let mut interfaces: Vec<serde_json::Value> = attached
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "attached": true,
                "interception": i.interception.as_str(),
                "xdp_mode": i.mode.as_str(),
                "zero_copy": i.zero_copy,
                "driver": i.driver,
                "queues": i.queues,
                "sockets": sockets.get(&i.name).copied().unwrap_or(0),
            })
        })
        .collect();
    for (name, error) in failed {
        if !attached.iter().any(|i| i.name == name) {
            interfaces.push(json!({
                "name": name,
                "attached": false,
                "error": error,
                "sockets": sockets.get(&name).copied().unwrap_or(0),
            }));
        }
    }
    // Drops and rejects by reason, all workers.
    let mut by_reason: std::collections::BTreeMap<String, u64> = Default::default();
    for row in worker_rows(&ctx.dataplane.stats) {
        for (r, n) in row.drops {
            *by_reason.entry(r).or_default() += n;
        }
    }
    let total: u64 = by_reason.values().sum();
    let mut top: Vec<(&String, &u64)> = by_reason.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let top: Vec<serde_json::Value> = top
        .into_iter()
        .take(TOP_DROP_REASONS)
        .map(|(r, n)| json!({"reason": r, "count": n}))
        .collect();
    let healthy = info.health.as_ref().map(|h| h.healthy());
    json!({
        "generation": ctx.published.generation(),
        "ready": st.ready,
        "healthy": healthy,
        "syncs": st.syncs,
        "full_syncs": st.full_syncs,
        "last_sync": st.last_sync.map(|t| humantime::format_rfc3339(t).to_string()),
        "last_sync_ago_s": st.last_sync.map(ago),
        "last_sync_duration_ms": st.last_sync_duration.as_secs_f64() * 1e3,
        "stale_since": st.stale_since().map(rfc3339),
        "problems": st.problems.len(),
        "source": {
            "kind": info.source,
            "detail": info.source_detail,
            "healthy": st.ready && st.source_errors.is_empty(),
            "errors": st.source_errors,
        },
        "interfaces_configured": info.interfaces,
        "interfaces": interfaces,
        "drops": {"total": total, "top": top, "by_reason": by_reason},
        "workers": ctx.dataplane.stats.workers(),
        "conntrack": {
            "entries": ct.len(),
            "max_entries": ct.config().max_entries,
            "early_drops": ct.early_drops(),
        },
        "conntrack_entries": ct.len(),
        "health_check_node_ports": st.health.services.keys().collect::<Vec<_>>(),
        "listening": ctx.listening.lock().unwrap().clone(),
    })
}

/// The running server; dropping it removes the socket.
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
    }
}

fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

/// Binds `path` (mode 0600; its directory is created with mode 0700 when missing) and serves it on
/// `rt`.
pub fn serve(
    path: &Path,
    ctx: Arc<AdminContext>,
    rt: &tokio::runtime::Handle,
) -> std::io::Result<AdminServer> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    // A socket left by a previous run (not a live one: connecting to it fails).
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
        std::fs::remove_file(path)?;
    }
    let std_listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    std_listener.set_nonblocking(true)?;
    let _guard = rt.enter();
    let listener = tokio::net::UnixListener::from_std(std_listener)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let me = own_uid();
    rt.spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if stop2.load(Ordering::Relaxed) {
                break;
            }
            let uid = sock.peer_cred().map(|c| c.uid()).ok();
            let Ok(std_sock) = sock.into_std() else {
                continue;
            };
            let _ = std_sock.set_nonblocking(false);
            let ctx = ctx.clone();
            let stop = stop2.clone();
            let _ = std::thread::Builder::new()
                .name("kxdp-admin".into())
                .spawn(move || {
                    let allowed = matches!(uid, Some(u) if u == 0 || u == me);
                    if !allowed {
                        tracing::warn!(?uid, "admin socket: refused a non-root peer");
                        let mut w = &std_sock;
                        let _ = writeln!(
                            w,
                            "{}",
                            serde_json::to_string(&Trailer::Error {
                                error: format!(
                                    "permission denied: the admin socket is for root only (peer uid {})",
                                    uid.map_or("unknown".into(), |u| u.to_string())
                                ),
                            })
                            .unwrap()
                        );
                        return;
                    }
                    handle(std_sock, &ctx, &stop);
                });
        }
    });
    Ok(AdminServer {
        path: path.to_path_buf(),
        stop,
    })
}

fn line<T: serde::Serialize>(w: &mut impl Write, v: &T) -> std::io::Result<()> {
    serde_json::to_writer(&mut *w, v).map_err(std::io::Error::other)?;
    w.write_all(b"\n")
}

fn handle(sock: std::os::unix::net::UnixStream, ctx: &AdminContext, stop: &AtomicBool) {
    let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(match sock.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut req = String::new();
    if reader.read_line(&mut req).is_err() {
        return;
    }
    let mut w = BufWriter::with_capacity(64 * 1024, &sock);
    let result = match serde_json::from_str::<Request>(&req) {
        Err(e) => Err(format!("bad request: {e}")),
        Ok(r) => answer(r, ctx, &mut w, &sock, stop),
    };
    let trailer = match result {
        Ok(end) => Trailer::End { end },
        Err(error) => Trailer::Error { error },
    };
    let _ = line(&mut w, &trailer);
    let _ = w.flush();
}

type Answer = Result<serde_json::Value, String>;

fn io_err(e: std::io::Error) -> String {
    format!("write: {e}")
}

fn answer(
    req: Request,
    ctx: &AdminContext,
    w: &mut impl Write,
    sock: &std::os::unix::net::UnixStream,
    stop: &AtomicBool,
) -> Answer {
    let ct = &ctx.dataplane.ct;
    match &req {
        Request::ConntrackList { filter }
        | Request::ConntrackCount { filter }
        | Request::ConntrackDelete { filter }
        | Request::ConntrackEvents { filter, .. } => filter.validate()?,
        _ => {}
    }
    match req {
        Request::ConntrackList { filter } => {
            let snap = ctx.published.load_full();
            let now = clock_ms();
            let mut n = 0u64;
            for v in ct.connections_at(now) {
                if filter.matches(&v, &snap) {
                    line(w, &CtEntry::from_view(&v, &snap, now)).map_err(io_err)?;
                    n += 1;
                }
            }
            Ok(serde_json::json!({ "count": n }))
        }
        Request::ConntrackCount { filter } => {
            let snap = ctx.published.load_full();
            let n = ct
                .connections_at(clock_ms())
                .filter(|v| filter.matches(v, &snap))
                .count();
            Ok(serde_json::json!({ "count": n }))
        }
        Request::ConntrackDelete { filter } => {
            let snap = ctx.published.load_full();
            let now = clock_ms();
            let mut n = 0u64;
            for v in ct.connections_at(now) {
                if filter.matches(&v, &snap) && ct.kill_view(&v) {
                    n += 1;
                    line(w, &CtEntry::from_view(&v, &snap, now)).map_err(io_err)?;
                }
            }
            Ok(serde_json::json!({ "deleted": n }))
        }
        Request::ConntrackStats | Request::Stats => {
            for row in worker_rows(&ctx.dataplane.stats) {
                line(w, &row).map_err(io_err)?;
            }
            let sockets: Vec<SocketRow> = ctx
                .dataplane
                .stats
                .socket_samples()
                .iter()
                .map(SocketRow::from_sample)
                .collect();
            let tap = (ctx.dataplane.stats.tap_sample()).map(|t| TapRow::from_sample(&t));
            Ok(serde_json::json!({
                "entries": ct.len(),
                "max_entries": ct.config().max_entries,
                "early_drops": ct.early_drops(),
                "now_ms": clock_ms(),
                "sockets": sockets,
                "tap": tap,
            }))
        }
        Request::Services => {
            for row in service_rows(&ctx.published.load_full()) {
                line(w, &row).map_err(io_err)?;
            }
            Ok(serde_json::json!({}))
        }
        Request::Status => Ok(status(ctx)),
        Request::Monitor { filter } => monitor(ctx, filter, w, sock, stop),
        Request::ConntrackEvents { filter, events } => {
            conntrack_events(ctx, filter, events, w, sock, stop)
        }
        Request::PolicyTrace {
            from,
            to,
            port,
            proto,
        } => policy_trace(ctx, from, to, port, proto),
        Request::PolicyCounters => {
            let snap = ctx.published.load_full();
            let counts = ctx.dataplane.stats.policy_counts();
            for row in crate::policy::counters::rows(&snap.policy, &counts) {
                line(w, &row).map_err(io_err)?;
            }
            Ok(serde_json::json!({}))
        }
    }
}

/// `kxdp policy trace --admin`: the trace runs on the control thread, against the state it
/// holds and the tables it last published (what the workers use).
fn policy_trace(
    ctx: &AdminContext,
    from: std::net::IpAddr,
    to: std::net::IpAddr,
    port: u16,
    proto: IpProto,
) -> Answer {
    if from.is_ipv4() != to.is_ipv4() {
        return Err("--from and --to must be of the same IP family".into());
    }
    let Some(control) = &ctx.control else {
        return Err("this daemon does not answer policy traces".into());
    };
    let published = ctx.published.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let query =
        crate::sources::event::Inspect(Box::new(move |state: &crate::model::ClusterState| {
            let snap = published.load_full();
            let q = crate::policy::trace::TraceQuery {
                from,
                to,
                port,
                proto,
            };
            let t = crate::policy::trace::trace(state, &snap, &q);
            let _ = tx.send((t, snap.generation));
        }));
    control
        .send(crate::sources::event::Update::Inspect(query))
        .map_err(|_| "the control loop has stopped".to_string())?;
    let (t, generation) = rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "the control loop did not answer within 10 s".to_string())?;
    let verdicts: Vec<serde_json::Value> = t
        .verdicts
        .iter()
        .map(|v| {
            serde_json::json!({"addr": v.addr.to_string(), "port": v.port, "action": v.action, "reason": v.reason})
        })
        .collect();
    Ok(serde_json::json!({"text": t.text, "verdicts": verdicts, "generation": generation}))
}

/// What `conntrack -E` compares between two walks of the table: the entry (its slot, so that a
/// connection deleted and re-created between walks is a DESTROY and a NEW) and the state the
/// events report on.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    idx: u32,
    state: u32,
}

fn seen(v: &kxdp_dataplane::conntrack::EntryView) -> Seen {
    use kxdp_dataplane::conntrack::{FLAG_ASSURED, FLAG_SEEN_REPLY};
    const PROTO_STATE: u32 = 0xff << 8;
    Seen {
        idx: v.idx,
        state: v.state & (PROTO_STATE | FLAG_ASSURED | FLAG_SEEN_REPLY),
    }
}

/// `kxdp conntrack events` (conntrack -E). The dataplane emits nothing: the table is walked every
/// `interval_ms` (default 100) while a client is attached, and compared with the previous walk:
/// an entry that appeared is NEW, one whose protocol state, ASSURED or SEEN_REPLY changed is an
/// UPDATE, one that went away is a DESTROY (shown as last seen). Workers pay nothing; the cost
/// is one walk of the table per interval and a copy of the matching entries, only while someone
/// listens. A connection born and gone within one interval is not seen, and several changes
/// within one interval are one UPDATE.
fn conntrack_events(
    ctx: &AdminContext,
    filter: CtFilter,
    mask: CtEventMask,
    w: &mut impl Write,
    sock: &std::os::unix::net::UnixStream,
    stop: &AtomicBool,
) -> Answer {
    use std::collections::HashMap;
    let interval = Duration::from_millis(mask.interval_ms.unwrap_or(100).clamp(10, 60_000));
    let all = !(mask.new || mask.update || mask.destroy);
    let closed = watch_close(sock);
    let ct = &ctx.dataplane.ct;
    let walk = |snap: &kxdp_dataplane::snapshot::Snapshot| {
        ct.connections_at(clock_ms())
            .filter(|v| filter.matches(v, snap))
            .map(|v| (v.orig.pack(), v))
            .collect::<HashMap<_, _>>()
    };
    let mut before = walk(&ctx.published.load_full());
    line(w, &serde_json::json!({"watching": before.len()})).map_err(io_err)?;
    w.flush().map_err(io_err)?;
    let mut n = 0u64;
    while !closed.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(interval);
        let snap = ctx.published.load_full();
        let now = clock_ms();
        let after = walk(&snap);
        let time = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let mut emit = |event: &str, v: &kxdp_dataplane::conntrack::EntryView| {
            n += 1;
            line(
                w,
                &CtEventRow {
                    event: event.into(),
                    time: time.clone(),
                    entry: CtEntry::from_view(v, &snap, now),
                },
            )
        };
        for (k, old) in &before {
            match after.get(k) {
                Some(v) if v.idx == old.idx => {}
                _ if all || mask.destroy => emit("destroy", old).map_err(io_err)?,
                _ => {}
            }
        }
        for (k, v) in &after {
            let event = match before.get(k) {
                Some(old) if old.idx == v.idx => (seen(old) != seen(v)).then_some("update"),
                _ => Some("new"),
            };
            let wanted = match event {
                Some("update") => all || mask.update,
                Some(_) => all || mask.new,
                None => false,
            };
            if let (true, Some(event)) = (wanted, event) {
                emit(event, v).map_err(io_err)?;
            }
        }
        w.flush().map_err(io_err)?;
        before = after;
    }
    Ok(serde_json::json!({ "events": n }))
}

/// A flag set once the client closes its end (seen as EOF on a reader thread).
fn watch_close(sock: &std::os::unix::net::UnixStream) -> Arc<AtomicBool> {
    let closed = Arc::new(AtomicBool::new(false));
    if let Ok(mut r) = sock.try_clone() {
        let closed = closed.clone();
        let _ = r.set_read_timeout(None);
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            while matches!(std::io::Read::read(&mut r, &mut b), Ok(n) if n > 0) {}
            closed.store(true, Ordering::Relaxed);
        });
    }
    closed
}

pub fn worker_rows(stats: &DataplaneStats) -> Vec<WorkerRow> {
    let now = clock_ms();
    stats
        .samples()
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut actions = std::collections::BTreeMap::new();
            for a in Action::ALL {
                let n = s.actions[a as usize];
                if n > 0 {
                    actions.insert(a.as_str().to_string(), n);
                }
            }
            let mut drops = std::collections::BTreeMap::new();
            for r in Reason::ALL {
                let n = s.reasons[*r as usize];
                if n > 0 && matches!(r.action(), Action::Drop | Action::Reject) {
                    drops.insert(r.as_str().to_string(), n);
                }
            }
            WorkerRow {
                worker: i,
                packets: s.packets,
                bytes: s.bytes,
                batches: s.batches,
                busy_ns: s.busy_ns,
                updated_ms: s.updated_ms,
                now_ms: now,
                ct_insert: s.ct_created,
                ct_found: s.ct_found(),
                ct_expired: s.ct_expired,
                ct_invalid: [
                    Reason::CtInvalid,
                    Reason::CtLost,
                    Reason::IcmpErrorUntracked,
                    Reason::FragmentNoState,
                ]
                .iter()
                .map(|r| s.reasons[*r as usize])
                .sum(),
                ct_insert_failed: s.reasons[Reason::SnatExhausted as usize],
                ct_drop: s.reasons[Reason::ConntrackFull as usize],
                ct_error: s.reasons[Reason::IcmpErrorUntracked as usize],
                actions,
                drops,
            }
        })
        .collect()
}

pub fn service_rows(snap: &kxdp_dataplane::snapshot::Snapshot) -> Vec<ServiceRow> {
    let mut rows: Vec<ServiceRow> = snap
        .frontends
        .iter()
        .map(|(key, fe)| {
            let family = key.addr.family();
            let mut active = vec![false; fe.endpoints.len()];
            for r in &fe.routes {
                for i in r.endpoints.as_range() {
                    if let Some(a) = active.get_mut(i) {
                        *a = true;
                    }
                }
            }
            let backends = fe
                .endpoints
                .iter()
                .zip(active)
                .map(|(e, a)| BackendRow {
                    address: format_addr(e.addr, family, e.port, true),
                    state: if a { "active" } else { "inactive" }.into(),
                    local: e.local,
                })
                .collect();
            ServiceRow {
                frontend: format_addr(key.addr, family, key.port, true),
                proto: proto_name(key.proto),
                kind: fe.kind.as_str().into(),
                service: fe.service_port.name.to_string(),
                id: fe.service_port.id,
                backends,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (&a.service, &a.kind, &a.frontend).cmp(&(&b.service, &b.kind, &b.frontend))
    });
    rows
}

/// The monitor's event type of a verdict: `drop` (dropped or rejected), `policy-verdict` (a new
/// connection NetworkPolicy judged: denied, or allowed with a pod of this node at one end),
/// `trace` (any other packet).
fn event_kind(
    e: &Event,
    snap: &kxdp_dataplane::snapshot::Snapshot,
) -> (&'static str, Option<&'static str>) {
    let v = &e.verdict;
    match v.reason {
        Reason::PolicyDeniedIngress | Reason::PolicyDeniedEgress => {
            ("policy-verdict", Some("deny"))
        }
        Reason::ServiceDnat | Reason::Direct
            if v.has_addrs
                && (snap.policy.is_local_pod(&v.orig_src) || snap.policy.is_local_pod(&v.dst)) =>
        {
            ("policy-verdict", Some("allow"))
        }
        _ if matches!(v.action, Action::Drop | Action::Reject) => ("drop", None),
        _ => ("trace", None),
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn event_row(e: &Event, snap: &kxdp_dataplane::snapshot::Snapshot) -> EventRow {
    let v = &e.verdict;
    let ports = v.proto.has_ports();
    let translated = v.has_addrs
        && v.action == Action::Forward
        && (v.src != v.orig_src
            || v.dst != v.orig_dst
            || v.sport != v.orig_sport
            || v.dport != v.orig_dport);
    let ago = Duration::from_millis(clock_ms().saturating_sub(e.at_ms));
    let wall = std::time::SystemTime::now()
        .checked_sub(ago)
        .unwrap_or(std::time::UNIX_EPOCH);
    EventRow {
        time: humantime::format_rfc3339_millis(wall).to_string(),
        at_ms: e.at_ms,
        worker: e.worker,
        action: v.action.as_str().into(),
        reason: v.reason.as_str().into(),
        proto: v.has_addrs.then(|| proto_name(v.proto)),
        src: v
            .has_addrs
            .then(|| format_addr(v.orig_src, v.family, v.orig_sport, ports)),
        dst: v
            .has_addrs
            .then(|| format_addr(v.orig_dst, v.family, v.orig_dport, ports)),
        service: snap
            .service_port_by_id(v.service_id)
            .map(|p| p.name.to_string()),
        service_id: (v.service_id != 0).then_some(v.service_id),
        out_src: translated.then(|| format_addr(v.src, v.family, v.sport, ports)),
        out_dst: translated.then(|| format_addr(v.dst, v.family, v.dport, ports)),
        kind: event_kind(e, snap).0.into(),
        policy: event_kind(e, snap).1.map(str::to_string),
        hex: (e.frame_len > 0).then(|| hex(e.frame())),
        len: (e.frame_len > 0).then_some(e.frame_len),
    }
}

fn event_matches(e: &Event, f: &MonitorFilter, snap: &kxdp_dataplane::snapshot::Snapshot) -> bool {
    let v = &e.verdict;
    let kind = event_kind(e, snap).0;
    let wanted = if f.types.is_empty() {
        // The default: what is dropped (policy denials included).
        matches!(v.action, Action::Drop | Action::Reject)
    } else {
        f.types.iter().any(|t| t == kind)
            // A policy denial is a drop too.
            || (kind == "policy-verdict"
                && matches!(v.action, Action::Drop | Action::Reject)
                && f.types.iter().any(|t| t == "drop"))
    };
    if !wanted {
        return false;
    }
    if !f.reasons.is_empty() && !f.reasons.iter().any(|r| r == v.reason.as_str()) {
        return false;
    }
    if let Some(net) = &f.addr {
        if !v.has_addrs {
            return false;
        }
        let fam = v.family;
        let hit = [v.orig_src, v.orig_dst, v.src, v.dst]
            .iter()
            .any(|a| net.contains(&a.to_ip(fam)));
        if !hit || (fam == Family::V4) != net.addr().is_ipv4() {
            return false;
        }
    }
    true
}

/// Streams events until the client closes the connection (or the server stops). At most
/// `rate` events a second are sent (default 100); the rest are counted and reported as
/// `{"suppressed":N,"lost":M}` lines once a second.
fn monitor(
    ctx: &AdminContext,
    filter: MonitorFilter,
    w: &mut impl Write,
    sock: &std::os::unix::net::UnixStream,
    stop: &AtomicBool,
) -> Answer {
    for r in &filter.reasons {
        if Reason::from_code(r).is_none() {
            return Err(format!("unknown reason `{r}`"));
        }
    }
    for t in &filter.types {
        if !MONITOR_TYPES.contains(&t.as_str()) {
            return Err(format!(
                "unknown event type `{t}` (one of {})",
                MONITOR_TYPES.join(", ")
            ));
        }
    }
    let rate = filter.rate.unwrap_or(100).max(1) as u64;
    let sample = filter.sample.unwrap_or(1).max(1) as u64;
    let mut matched = 0u64;
    let closed = watch_close(sock);
    // Drops only unless another type was asked for: then the workers record every verdict.
    let all = filter.types.iter().any(|t| t != "drop");
    let mut mon = ctx.dataplane.stats.monitor_with(all, filter.hex);
    // Say we are attached (clients and tests wait for this before generating traffic).
    line(
        w,
        &serde_json::json!({"monitoring": ctx.dataplane.stats.workers()}),
    )
    .map_err(io_err)?;
    w.flush().map_err(io_err)?;
    let mut events = Vec::new();
    let mut window_start = std::time::Instant::now();
    let (mut sent, mut suppressed, mut reported_lost) = (0u64, 0u64, 0u64);
    while !closed.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
        events.clear();
        mon.poll(&mut events);
        let snap = ctx.published.load();
        for e in &events {
            if !event_matches(e, &filter, &snap) {
                continue;
            }
            matched += 1;
            if (matched - 1) % sample != 0 {
                continue;
            }
            if sent < rate {
                sent += 1;
                line(w, &event_row(e, &snap)).map_err(io_err)?;
            } else {
                suppressed += 1;
            }
        }
        if window_start.elapsed() >= Duration::from_secs(1) {
            if suppressed > 0 || mon.lost > reported_lost {
                line(
                    w,
                    &serde_json::json!({"suppressed": suppressed, "lost": mon.lost - reported_lost}),
                )
                .map_err(io_err)?;
            }
            reported_lost = mon.lost;
            suppressed = 0;
            sent = 0;
            window_start = std::time::Instant::now();
        }
        w.flush().map_err(io_err)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(serde_json::json!({}))
}
