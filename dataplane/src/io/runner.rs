//! Run mode's I/O in one piece: for the configured interfaces, load and attach the XDP program,
//! open the workers' AF_XDP sockets, keep the program's node-address and NodePort maps in step
//! with the published tables, start the route refresher and the pinned workers. Dropping the
//! returned [`AfXdp`] (or calling `stop`) stops the workers and detaches every program.
//!
//! Queues: worker `w` owns queue `q` of every interface for which `q % workers == w`, so each
//! worker can send on every interface (on its own queue). veth has one queue: with it, worker 0
//! does all the work (the others wait on empty epoll sets, for multi-queue links to come).
//!
//! Interfaces by pattern: `interfaces` holds names and shell-style patterns (`veth*`, `eth?`).
//! The link manager matches them against the links the route refresher reads (it re-reads on
//! every netlink link event, RTNLGRP_LINK) at start and whenever the link set changes: a new
//! matching link gets its program and one socket per queue (opened by the owning worker between
//! two batches, `PortCommand`), a vanished one is detached and its sockets closed with their
//! frames reclaimed. A pattern that matches nothing yet is fine; a link that cannot take XDP or
//! AF_XDP is reported by name, retried every few seconds, and the others keep working.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam::channel::{bounded, Sender};

use crate::conntrack::{Conntrack, FLAG_MASQ};
use crate::fib::Fib;
use crate::io::route::Routes;
use crate::snapshot::{FrontendKind, Snapshot};
use crate::stats::DataplaneStats;
use crate::tap::{TapPort, TapTags};
use crate::worker::{Backoff, IoCounters, Port, PortCommand, Removed, Shared, Tables, Worker};
use kxdp_kernel::afxdp::{Umem, XskConfig};
use kxdp_kernel::sys::{driver_of, rx_queues_of, Waker};
use kxdp_kernel::tap::TapQueue;
use kxdp_kernel::xdp::{Attachment, ModeChoice, SharedMaps, XdpMode, XdpProgram};

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub interfaces: Vec<String>,
    pub workers: usize,
    /// CPU of worker i: `cpus[i % len]`; empty: not pinned.
    pub cpus: Vec<usize>,
    pub xsk: XskConfig,
    pub backoff: Backoff,
    pub mode: ModeChoice,
    /// The kernel port: ifindex of the kxdp-side end of a veth pair whose other end belongs
    /// to the node's stack (the host path sets it up). `pass` verdicts and packets for the
    /// node's own addresses are sent there; it must be one of `interfaces` (kxdp sends on it
    /// through its AF_XDP socket). None: such packets are dropped, counted `no-kernel-port`
    /// (the XDP program hands most of the node's own traffic to the kernel before it reaches
    /// a worker).
    pub kernel_port: Option<u32>,
    /// The host path's end the node's own packets to its NodePorts are redirected to (a tc
    /// program on `lo`, `kxdp_kernel::tc::redirect_node_ports`, attached once the XDP
    /// program's maps exist; the host path removes it). None: not redirected.
    pub node_ports_to: Option<crate::io::host_path::NodePortsTo>,
    /// Attach the programs so that they outlive the process (`XdpProgram::attach_held`) and
    /// hold the traffic meant for kxdp through a restart (`RESTART_HOLD`; `kxdp run` with a
    /// conntrack state file). Off: BPF links, gone with the process.
    pub hold_for_restart: bool,
    /// Source validation on pod-facing interfaces (`crate::antispoof`).
    pub source_validation: crate::antispoof::SourceValidation,
    /// Pod interfaces intercepted through kxdp's tap instead of XDP (`podInterception: tap`);
    /// None: every matched interface takes the XDP program.
    pub tap: Option<TapOptions>,
}

/// Pod interception through kxdp's tap (`crate::tap`): the tap device, created at start with
/// one queue per worker, and which of the matched interfaces get a tc redirect into it.
#[derive(Clone, Debug)]
pub struct TapOptions {
    pub device: String,
    /// Names or shell-style patterns; an interface must also match `RunOptions::interfaces`.
    pub interfaces: Vec<String>,
    /// Every veth `RunOptions::interfaces` matches is redirected too, whatever its name (but
    /// the host path's kernel port): XDP on a veth takes GSO from its peer.
    pub every_veth: bool,
    /// Established flows take the in-kernel fast path (`crate::offload`).
    pub offload: bool,
    /// Pod-to-pod frames leave straight through their egress interface (`crate::direct`).
    pub direct_routing: bool,
    /// Frames each of the tap's queues holds for its worker (the device's `txqueuelen`).
    pub queue_length: u32,
}

impl TapOptions {
    /// Whether a link `RunOptions::interfaces` matches goes through the tap rather than XDP.
    fn takes(&self, l: &kxdp_kernel::netlink::Link) -> bool {
        takes(&self.interfaces, self.every_veth, l)
    }
}

fn takes(patterns: &[String], every_veth: bool, l: &kxdp_kernel::netlink::Link) -> bool {
    matches_any(patterns, &l.name) || (every_veth && l.veth)
}

/// The tap queue's length unless configured otherwise. Short on purpose: a worker that cannot
/// keep up (a SYN flood) fills its queue, and every frame then waits behind all of it; at 256
/// frames that wait stays around a millisecond and a half, short enough for a legitimate
/// handshake to finish before a full conntrack table evicts it (docs/hardening.md). A GSO
/// super-frame is one entry, so bulk transfers do not need more.
pub const TAP_QUEUE_LENGTH: u32 = 256;

/// The tap's name unless configured otherwise.
pub const TAP_DEVICE: &str = "kxdptap0";

/// How an attached interface's traffic reaches the workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Interception {
    /// kxdp's XDP program and AF_XDP sockets.
    #[default]
    Xdp,
    /// A tc redirect of what arrives into kxdp's tap (whole GSO super-frames).
    Tap,
}

impl Interception {
    pub fn as_str(self) -> &'static str {
        match self {
            Interception::Xdp => "xdp",
            Interception::Tap => "tap",
        }
    }
}

/// kxdp's tap as the link manager uses it.
struct TapTarget {
    ifindex: u32,
    name: String,
    patterns: Vec<String>,
    every_veth: bool,
    /// The intercepted interfaces' tags, shared with the workers' ports.
    tags: Arc<TapTags>,
    /// The in-kernel fast path's maps (`TapOptions::offload`), shared with the workers.
    offload: Option<Arc<kxdp_kernel::offload::FlowOffload>>,
}

/// What was attached where (for the startup report).
#[derive(Clone, Debug)]
pub struct InterfaceReport {
    pub name: String,
    pub ifindex: u32,
    pub queues: u32,
    pub mode: XdpMode,
    pub zero_copy: bool,
    pub replaced_stale: bool,
    pub driver: String,
    pub complete_checksums: bool,
    /// XDP, or a tc redirect into the tap (`mode`, `queues` and `zero_copy` then say nothing).
    pub interception: Interception,
    /// The in-kernel fast path on its ingress (`crate::offload`): through the tap, or beside
    /// XDP, whose program hands the fast path's flows to the kernel.
    pub fast_path: bool,
}

pub struct AfXdp {
    /// The interfaces attached at start (later ones: [`AfXdp::attached`]).
    pub interfaces: Vec<InterfaceReport>,
    /// I/O counters per started worker: (worker index, counters).
    pub counters: Vec<(usize, Arc<IoCounters>)>,
    stop: Arc<AtomicBool>,
    /// Wake the workers' idle waits when the stop flag is set.
    wakers: Vec<Arc<Waker>>,
    /// Stops the link manager and the map thread (apart from the workers: a takeover stops
    /// those threads first, while the workers still forward).
    threads_stop: Arc<AtomicBool>,
    workers: Vec<std::thread::JoinHandle<Worker>>,
    maps_thread: Option<std::thread::JoinHandle<()>>,
    links_thread: Option<std::thread::JoinHandle<()>>,
    pub(crate) links: Arc<Mutex<Links>>,
    pub(crate) maps: Arc<SharedMaps>,
    /// What the workers run against (its `stop` is replaced when they restart after a takeover
    /// that did not happen, [`Quiesced::resume`]).
    shared: Shared,
    tables: Arc<dyn Tables>,
    routes: Routes,
    /// Programs held through netlink keep a hold deadline ahead (`RunOptions::hold_for_restart`).
    hold_for_restart: bool,
    /// The tc redirects into the tap stay in place when this process goes (a restart: what the
    /// pods send meanwhile is dropped, not routed by a kernel without Service rules).
    keep_redirects: bool,
}

/// The longest the link manager and the XDP-map refresh wait for news (they are woken by route
/// table changes and publications; the timeout lets them see the stop flag).
const SAFETY_WAIT: Duration = Duration::from_millis(250);

/// How often the link manager looks again while some link failed to attach.
const LINK_RETRY_POLL: Duration = Duration::from_millis(100);

/// The XDP program's node-address and NodePort maps, and what was last written to them.
struct NodeMaps {
    maps: Arc<SharedMaps>,
    tables: Arc<dyn Tables>,
    routes: Arc<ArcSwap<Fib>>,
    /// (generation, addresses, ports) written last.
    last: Mutex<(u64, Vec<IpAddr>, Vec<u16>)>,
}

impl NodeMaps {
    /// Writes the maps when the current tables or the node's addresses differ from what was
    /// written; returns the generation seen. Both inputs are read under the lock, so that the
    /// last writer always writes the newest of both.
    fn refresh(&self) -> u64 {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let snap = self.tables.current();
        let addrs = node_addrs(&snap, self.routes.load().local_addrs());
        let ports = node_ports(&snap);
        if snap.generation != last.0 || addrs != last.1 || ports != last.2 {
            if let Err(e) = self.maps.set_node(&addrs, &ports) {
                tracing::warn!("kxdp: updating the XDP maps: {e}");
            }
            *last = (snap.generation, addrs, ports);
        }
        snap.generation
    }
}

/// Whether `name` matches one of `patterns` (names or shell-style patterns: `*`, `?`).
pub fn matches_any(patterns: &[String], name: &str) -> bool {
    patterns
        .iter()
        .any(|p| wildmatch::WildMatch::new(p).matches(name))
}

/// A host-side veth name as the CNI `bridge` plugin (and flannel) make them: what a pattern
/// "could match" among the ports a bridge will get.
const CNI_PORT_NAME: &str = "veth0a1b2c3d";

/// When `interfaces` matches the bridge `bridge` and also matches, or could match, its ports:
/// (the entry that matches the bridge, the entry that matches a port, that port or a sample
/// port name). The kernel takes XDP on a bridge or on its ports, not both: with kxdp's program
/// on the bridge every port created later is refused (docs/afxdp.md § Bridges).
pub fn bridge_conflict<'p>(
    patterns: &'p [String],
    bridge: &kxdp_kernel::netlink::Link,
    links: &[kxdp_kernel::netlink::Link],
) -> Option<(&'p str, &'p str, String)> {
    if !bridge.bridge {
        return None;
    }
    let matching = |name: &str| {
        patterns
            .iter()
            .find(|p| wildmatch::WildMatch::new(p).matches(name))
    };
    let on_bridge = matching(&bridge.name)?;
    let ports = links.iter().filter(|l| l.master == Some(bridge.ifindex));
    for port in ports {
        if let Some(p) = matching(&port.name) {
            return Some((on_bridge, p, port.name.clone()));
        }
    }
    let wild = |p: &&String| p.contains(['*', '?', '[']);
    let later = patterns
        .iter()
        .filter(wild)
        .find(|p| wildmatch::WildMatch::new(p).matches(CNI_PORT_NAME))?;
    Some((
        on_bridge,
        later,
        format!("{CNI_PORT_NAME} (a port created later)"),
    ))
}

/// What happened to a link (kept for tests and the admin view; the last 256).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    Attached {
        name: String,
        ifindex: u32,
        at: Instant,
    },
    Failed {
        name: String,
        error: String,
    },
    Released {
        name: String,
        ifindex: u32,
        removed: Removed,
    },
}

pub(crate) struct AttachedLink {
    pub(crate) report: InterfaceReport,
    /// Detaches on drop; dropped before the sockets close.
    pub(crate) attachment: Option<Attachment>,
    /// None for a link intercepted through the tap.
    pub(crate) prog: Option<XdpProgram>,
}

/// A worker's command channel and what wakes it from its idle wait to read it.
struct WorkerChannel {
    commands: Sender<PortCommand>,
    waker: Option<Arc<Waker>>,
}

impl WorkerChannel {
    fn send(&self, cmd: PortCommand) -> Result<(), crossbeam::channel::SendError<PortCommand>> {
        self.commands.send(cmd)?;
        if let Some(w) = &self.waker {
            w.wake();
        }
        Ok(())
    }
}

/// What every worker runs against, with a fresh stop flag.
fn worker_shared(
    tables: Arc<dyn Tables>,
    ct: Arc<Conntrack>,
    stats: Option<Arc<DataplaneStats>>,
    routes: &Routes,
    maps: &Arc<SharedMaps>,
    source_validation: crate::antispoof::SourceValidation,
) -> Shared {
    Shared {
        tables,
        ct,
        stats,
        routes: routes.table.clone(),
        unresolved: routes.unresolved.clone(),
        masq: Some(maps.clone()),
        source_validation,
        stop: Arc::new(AtomicBool::new(false)),
    }
}

/// Started workers: their threads, command channels, wakers and counters.
#[derive(Default)]
struct Crew {
    counters: Vec<(usize, Arc<IoCounters>)>,
    handles: Vec<std::thread::JoinHandle<Worker>>,
    senders: Vec<WorkerChannel>,
    wakers: Vec<Arc<Waker>>,
}

impl Crew {
    /// Gives worker `index` its command channel and starts its thread.
    fn spawn(&mut self, index: usize, mut worker: Worker, shared: &Shared) -> io::Result<()> {
        let (tx, rx) = bounded(1024);
        worker.commands = Some(rx);
        self.wakers.extend(worker.waker());
        self.senders.push(WorkerChannel {
            commands: tx,
            waker: worker.waker(),
        });
        self.counters.push((index, worker.counters.clone()));
        self.handles.push(worker.spawn(shared.clone())?);
        Ok(())
    }
}

/// The link manager's state: attached links, links that failed (and when), the event log.
pub struct Links {
    patterns: Vec<String>,
    workers: Vec<WorkerChannel>,
    maps: Arc<SharedMaps>,
    mode: ModeChoice,
    hold_for_restart: bool,
    tap: Option<TapTarget>,
    /// The host path's port: never on the fast path (what arrives there the kernel routed).
    kernel_port: Option<u32>,
    pub(crate) attached: HashMap<u32, AttachedLink>,
    /// ifindex → (error, when, name).
    failed: HashMap<u32, (String, Instant, String)>,
    pub events: Vec<LinkEvent>,
}

/// The link manager's interfaces as `kxdp status` shows them, shared with the admin API.
#[derive(Clone)]
pub struct LinksView(Arc<Mutex<Links>>);

impl LinksView {
    /// The interfaces attached now (by name), and those matching a pattern that could not take
    /// kxdp's program, with the error (retried every few seconds).
    pub fn interfaces(&self) -> (Vec<InterfaceReport>, Vec<(String, String)>) {
        let Ok(l) = self.0.lock() else {
            return (Vec::new(), Vec::new());
        };
        let mut attached: Vec<InterfaceReport> =
            l.attached.values().map(|a| a.report.clone()).collect();
        attached.sort_by(|a, b| a.name.cmp(&b.name));
        let mut failed: Vec<(String, String)> = l
            .failed
            .values()
            .map(|(error, _, name)| (name.clone(), error.clone()))
            .collect();
        failed.sort();
        (attached, failed)
    }
}

/// How long a link that failed waits before the next attempt.
const RETRY_FAILED: Duration = Duration::from_secs(3);
/// How long the manager waits for a worker to open or close a socket.
const WORKER_REPLY: Duration = Duration::from_secs(5);

impl Links {
    /// Whether `l` goes through the tap: tap mode, its name or kind asks for it, and it is not
    /// the host path's kernel port (a veth kxdp sends on through AF_XDP).
    fn through_tap(&self, l: &kxdp_kernel::netlink::Link) -> bool {
        self.kernel_port != Some(l.ifindex)
            && (self.tap.as_ref()).is_some_and(|t| takes(&t.patterns, t.every_veth, l))
    }

    fn log(&mut self, e: LinkEvent) {
        if self.events.len() >= 256 {
            self.events.remove(0);
        }
        self.events.push(e);
    }

    /// Attaches matching links the FIB shows and releases attached links it no longer shows.
    fn sync(&mut self, fib: &Fib) {
        let links = &fib.input().links;
        let gone: Vec<u32> = self
            .attached
            .iter()
            .filter(|(i, a)| {
                !links
                    .iter()
                    .any(|l| l.ifindex == **i && l.name == a.report.name)
            })
            .map(|(i, _)| *i)
            .collect();
        for ifindex in gone {
            self.release(ifindex);
        }
        self.failed
            .retain(|i, _| links.iter().any(|l| l.ifindex == *i));
        let now = Instant::now();
        // Bridges after their ports (a generic program on a bridge keeps the kernel from
        // attaching to ports later in some kernels; measured in tests/cni_lab.rs).
        let mut order: Vec<&kxdp_kernel::netlink::Link> = links.iter().collect();
        order.sort_by_key(|l| l.bridge);
        for l in order {
            if self.attached.contains_key(&l.ifindex)
                || !matches_any(&self.patterns, &l.name)
                || self
                    .tap
                    .as_ref()
                    .is_some_and(|t| t.ifindex == l.ifindex || t.name == l.name)
            {
                continue;
            }
            if let Some((_, when, _)) = self.failed.get(&l.ifindex) {
                if now.duration_since(*when) < RETRY_FAILED {
                    continue;
                }
            }
            // A bridge whose ports kxdp owns or may own is left alone: the ports keep working.
            let attached = match bridge_conflict(&self.patterns, l, links) {
                // Worded without the port's name: the same error while ports come and go is
                // reported once.
                Some((on_bridge, on_port, _)) => Err(io::Error::other(format!(
                    "it is a bridge (matched by `{on_bridge}`) and `{on_port}` matches or could \
                     match its ports: the kernel takes XDP on a bridge or on its ports, not \
                     both; kxdp stays off the bridge and keeps its ports (remove `{on_bridge}` \
                     from interfaces, docs/afxdp.md § Bridges)"
                ))),
                None if self.through_tap(l) => self.attach_tap(&l.name, l.ifindex, l.mac),
                None => self.attach(&l.name, l.ifindex, l.mac),
            };
            match attached {
                Ok(a) => {
                    tracing::info!("kxdp: attached {}", describe(&a.report));
                    self.failed.remove(&l.ifindex);
                    self.log(LinkEvent::Attached {
                        name: l.name.clone(),
                        ifindex: l.ifindex,
                        at: Instant::now(),
                    });
                    self.attached.insert(l.ifindex, a);
                }
                Err(e) => {
                    let mut error = e.to_string();
                    if let Some(m) = l.master.and_then(|m| self.attached.get(&m)) {
                        error += &format!(
                            " (its bridge {} has kxdp's program: the kernel takes XDP on a \
                             bridge or on its ports, not both; match the ports only, docs/afxdp.md)",
                            m.report.name
                        );
                    }
                    let repeat = self
                        .failed
                        .get(&l.ifindex)
                        .is_some_and(|(last, _, _)| *last == error);
                    if !repeat {
                        tracing::warn!(
                            "kxdp: {}: cannot take {}: {error}; the other interfaces keep \
                             working (retried every {}s)",
                            l.name,
                            if self.through_tap(l) {
                                "the tc redirect into kxdp's tap"
                            } else {
                                "kxdp's XDP program and AF_XDP sockets"
                            },
                            RETRY_FAILED.as_secs()
                        );
                        self.log(LinkEvent::Failed {
                            name: l.name.clone(),
                            error: error.clone(),
                        });
                    }
                    self.failed
                        .insert(l.ifindex, (error, Instant::now(), l.name.clone()));
                }
            }
        }
    }

    /// The tc redirect of what arrives on `ifindex` into the tap, with the in-kernel fast path
    /// first when it is on; returns whether it is. Each redirect tags what it hands over with
    /// the interface's own VLAN ID (`crate::tap`), the one its redirect already pushes when a
    /// kxdp before this one set it up.
    fn redirect_into_tap(&self, name: &str, ifindex: u32) -> io::Result<bool> {
        let tap = self.tap.as_ref().expect("only with a tap");
        let wanted = kxdp_kernel::tc::redirect_tag(ifindex, crate::tap::TC_PREF)
            .ok()
            .flatten();
        let tag = tap.tags.assign(ifindex, wanted).ok_or_else(|| {
            io::Error::other(format!(
                "all {} interface tags of the tap are in use (one per intercepted interface)",
                kxdp_kernel::tc::MAX_TAG
            ))
        })?;
        let offload = tap.offload.as_ref().map(|f| f.maps());
        if offload.is_some() {
            // A reply on the fast path leaves the server's interface with the Service's address
            // as its source, which a strict reverse-path check there would drop (kxdp checks
            // the sources itself: `crate::antispoof`, and each flow is bound to its interface).
            use kxdp_kernel::netlink::IPV4_DEVCONF_RP_FILTER;
            let open = crate::io::host_path::open_rp_filter().unwrap_or(0);
            if let Err(e) =
                kxdp_kernel::netlink::set_ipv4_devconf(ifindex, &[(IPV4_DEVCONF_RP_FILTER, open)])
            {
                tracing::warn!("kxdp: {name}: rp_filter for the fast path: {e}");
            }
        }
        if let Err(e) = kxdp_kernel::tc::redirect_ingress(
            ifindex,
            tap.ifindex,
            crate::tap::TC_PREF,
            Some(tag),
            kxdp_kernel::tc::RedirectPrograms {
                offload,
                steer: Some(self.maps.steer_maps()),
            },
        ) {
            tap.tags.release(ifindex);
            return Err(e);
        }
        Ok(offload.is_some())
    }

    /// Removes the tap redirect of `ifindex` and releases its tag.
    fn remove_redirect(&self, ifindex: u32) -> io::Result<()> {
        if let Some(t) = &self.tap {
            t.tags.release(ifindex);
        }
        kxdp_kernel::tc::remove_redirect(ifindex, crate::tap::TC_PREF)
    }

    /// Redirects everything IP that arrives on `ifindex` into the tap (`podInterception: tap`):
    /// no XDP program, so the kernel leaves the pod its GSO.
    fn attach_tap(
        &mut self,
        name: &str,
        ifindex: u32,
        mac: Option<[u8; 6]>,
    ) -> io::Result<AttachedLink> {
        // What the redirect hands over is read as Ethernet frames (and direct routing answers
        // with the interface's MAC): an interface without one (a tun) cannot take it.
        mac.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no Ethernet address"))?;
        let fast_path = self.redirect_into_tap(name, ifindex)?;
        // An XDP program a kxdp in mode xdp held on the interface for its restart runs before
        // the redirect and keeps the pod's GSO off: it goes once the redirect is in place. (A
        // live predecessor's BPF link, a takeover's, refuses with EBUSY and goes with it.)
        let _ = kxdp_kernel::xdp::detach_netlink(ifindex);
        Ok(AttachedLink {
            report: InterfaceReport {
                name: name.to_string(),
                ifindex,
                queues: 0,
                mode: XdpMode::Generic,
                zero_copy: false,
                replaced_stale: false,
                driver: driver_of(name).unwrap_or_default(),
                complete_checksums: false,
                interception: Interception::Tap,
                fast_path,
            },
            attachment: None,
            prog: None,
        })
    }

    /// Removes the tap redirect of every link intercepted so, and of every XDP link with the
    /// fast path on its ingress (its program first: it hands the fast path's flows to the
    /// kernel, which must not see them without the redirect's rewrite). A clean stop: the
    /// traffic goes back to the kernel.
    fn remove_redirects(&mut self) {
        let mut redirected = Vec::new();
        for a in self.attached.values_mut() {
            if a.report.interception == Interception::Tap || a.report.fast_path {
                a.attachment.take();
                redirected.push((a.report.ifindex, a.report.name.clone()));
            }
        }
        for (ifindex, name) in redirected {
            if let Err(e) = self.remove_redirect(ifindex) {
                tracing::warn!("kxdp: {name}: removing the tap redirect: {e}");
            }
        }
    }

    /// Intercepts anew the links a predecessor intercepted otherwise than this process is
    /// configured to (a takeover across a change of `podInterception`): the new way is in
    /// place before the old one goes (a redirect runs after XDP), so no frame reaches the
    /// kernel untranslated. A link that cannot take the new way is retried by the next sync.
    fn reintercept_adopted(&mut self) {
        let links = kxdp_kernel::netlink::dump_all()
            .map(|d| d.links)
            .unwrap_or_default();
        // A link gone since is left to the next sync, which releases it.
        let tapped = |a: &AttachedLink| {
            (links.iter().find(|l| l.ifindex == a.report.ifindex)).map(|l| self.through_tap(l))
        };
        let moved: Vec<u32> = (self.attached.values())
            .filter(|a| {
                tapped(a).is_some_and(|t| t != (a.report.interception == Interception::Tap))
            })
            .map(|a| a.report.ifindex)
            .collect();
        for ifindex in moved {
            let Some(mut old) = self.attached.remove(&ifindex) else {
                continue;
            };
            let name = old.report.name.clone();
            let mac = (links.iter().find(|l| l.ifindex == ifindex)).and_then(|l| l.mac);
            let new = match old.report.interception {
                Interception::Xdp => self.attach_tap(&name, ifindex, mac),
                Interception::Tap => self.attach(&name, ifindex, mac),
            };
            if old.report.interception == Interception::Xdp {
                old.attachment.take();
                self.close_sockets(ifindex);
            }
            match new {
                Ok(a) => {
                    tracing::info!("kxdp: after the takeover: {}", describe(&a.report));
                    self.attached.insert(ifindex, a);
                }
                Err(e) => {
                    tracing::warn!(
                        "kxdp: {name}: intercepting it as configured after the takeover: {e}"
                    );
                    if old.report.interception == Interception::Tap {
                        let _ = kxdp_kernel::tc::remove_redirect(ifindex, crate::tap::TC_PREF);
                    }
                }
            }
        }
    }

    /// Puts the tap redirect with the fast path back on the XDP links a predecessor had it on
    /// (a takeover: this process's tap and tags; the adopted programs read the fast path's
    /// maps this process adopted). A link that cannot take it loses its XDP program too, and
    /// is attached again by the next sync.
    fn redirect_adopted(&mut self) {
        let adopted: Vec<(u32, String)> = (self.attached.values())
            .filter(|a| a.report.interception == Interception::Xdp && a.report.fast_path)
            .map(|a| (a.report.ifindex, a.report.name.clone()))
            .collect();
        let offloading = self.tap.as_ref().is_some_and(|t| t.offload.is_some());
        for (ifindex, name) in adopted {
            if !offloading {
                // This process runs without the fast path: its maps (emptied) hand nothing to
                // the kernel, and the predecessor's redirect goes.
                let _ = kxdp_kernel::tc::remove_redirect(ifindex, crate::tap::TC_PREF);
                if let Some(a) = self.attached.get_mut(&ifindex) {
                    a.report.fast_path = false;
                }
                continue;
            }
            if let Err(e) = self.redirect_into_tap(&name, ifindex) {
                tracing::warn!("kxdp: {name}: the fast path's redirect after a takeover: {e}");
                self.release(ifindex);
            }
        }
    }

    fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        mac: Option<[u8; 6]>,
    ) -> io::Result<AttachedLink> {
        let mac =
            mac.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no Ethernet address"))?;
        let queues = rx_queues_of(name);
        let driver = driver_of(name).unwrap_or_default();
        // Virtual interfaces hand over TCP/UDP with partial checksums (docs/afxdp.md).
        let complete = matches!(driver.as_str(), "veth" | "tun" | "");
        // With the in-kernel fast path, the flows on it arriving here go to the kernel's GRO
        // and the tc program on this ingress, which the redirect puts there first.
        let offloading = self.tap.as_ref().is_some_and(|t| t.offload.is_some());
        let fast_path = match offloading && self.kernel_port != Some(ifindex) {
            true => self.redirect_into_tap(name, ifindex)?,
            false => false,
        };
        let offload = (self.tap.as_ref().and_then(|t| t.offload.as_ref()))
            .filter(|_| fast_path)
            .map(|f| f.maps());
        let attached = self.attach_xdp(ifindex, mac, queues, complete, offload);
        if attached.is_err() && fast_path {
            let _ = self.remove_redirect(ifindex);
        }
        let (attachment, prog, zero_copy) = attached?;
        if !fast_path && self.kernel_port != Some(ifindex) {
            // A redirect a kxdp in mode tap left for its restart leads to its tap, gone: what
            // the program hands the kernel would end there. A missing one is no error.
            if let Err(e) = kxdp_kernel::tc::remove_redirect(ifindex, crate::tap::TC_PREF) {
                tracing::warn!("kxdp: {name}: removing an earlier tap redirect: {e}");
            }
        }
        Ok(AttachedLink {
            report: InterfaceReport {
                name: name.to_string(),
                ifindex,
                queues,
                mode: attachment.mode,
                zero_copy,
                replaced_stale: attachment.replaced_stale,
                driver,
                complete_checksums: complete,
                interception: Interception::Xdp,
                fast_path,
            },
            attachment: Some(attachment),
            prog: Some(prog),
        })
    }

    /// Loads the XDP program for `ifindex` (with the fast path's flows when `offload`), opens a
    /// socket per queue on the workers and attaches it: the attachment, the program, and
    /// whether a socket is zero-copy.
    fn attach_xdp(
        &mut self,
        ifindex: u32,
        mac: [u8; 6],
        queues: u32,
        complete: bool,
        offload: Option<kxdp_kernel::offload::OffloadMaps>,
    ) -> io::Result<(Attachment, XdpProgram, bool)> {
        let prog = XdpProgram::load_with(queues, self.maps.clone(), offload)?;
        let n = self.workers.len();
        let mut zero_copy = false;
        let mut result = Ok(());
        for q in 0..queues {
            let (tx, rx) = bounded(1);
            let cmd = PortCommand::Add {
                ifindex,
                queue: q,
                mac,
                complete_checksums: complete,
                fast_path: offload.is_some(),
                reply: tx,
            };
            let r = self.workers[q as usize % n]
                .send(cmd)
                .map_err(|_| io::Error::other("worker stopped"))
                .and_then(|_| {
                    rx.recv_timeout(WORKER_REPLY)
                        .map_err(|_| io::Error::other("worker did not answer"))?
                })
                .and_then(|(fd, zc)| {
                    zero_copy |= zc;
                    prog.set_socket(q, fd)
                });
            if let Err(e) = r {
                result = Err(io::Error::new(e.kind(), format!("queue {q}: {e}")));
                break;
            }
        }
        let attached = result.and_then(|_| {
            if self.hold_for_restart {
                prog.attach_held(ifindex, self.mode)
            } else {
                prog.attach(ifindex, self.mode)
            }
        });
        match attached {
            Ok(a) => Ok((a, prog, zero_copy)),
            Err(e) => {
                self.close_sockets(ifindex);
                Err(e)
            }
        }
    }

    /// Asks every worker to close its sockets on `ifindex`; adds up what came back.
    fn close_sockets(&self, ifindex: u32) -> Removed {
        let mut total = Removed {
            balanced: true,
            ..Removed::default()
        };
        for w in &self.workers {
            let (tx, rx) = bounded(1);
            if w.send(PortCommand::Remove { ifindex, reply: tx }).is_err() {
                continue;
            }
            if let Ok(r) = rx.recv_timeout(WORKER_REPLY) {
                total.sockets += r.sockets;
                total.held += r.held;
                total.reclaimed += r.reclaimed;
                total.balanced &= r.balanced;
            } else {
                total.balanced = false;
            }
        }
        total
    }

    fn release(&mut self, ifindex: u32) {
        let Some(mut a) = self.attached.remove(&ifindex) else {
            return;
        };
        if a.report.interception == Interception::Tap {
            // The link is gone, and its filters with it; a failure says only that.
            let _ = self.remove_redirect(ifindex);
            tracing::info!(
                "kxdp: {} (ifindex {ifindex}) is gone: tap redirect released",
                a.report.name
            );
            self.log(LinkEvent::Released {
                name: a.report.name.clone(),
                ifindex,
                removed: Removed {
                    balanced: true,
                    ..Removed::default()
                },
            });
            return;
        }
        // The program first (no more redirects to the sockets, no more flows handed to the
        // fast path), then the sockets and the fast path's redirect.
        a.attachment.take();
        let removed = self.close_sockets(ifindex);
        if a.report.fast_path {
            let _ = self.remove_redirect(ifindex);
        }
        tracing::info!(
            "kxdp: {} (ifindex {ifindex}) is gone: {} socket(s) closed, {} of {} frame(s) reclaimed{}",
            a.report.name,
            removed.sockets,
            removed.reclaimed,
            removed.held,
            if removed.balanced {
                ""
            } else {
                " (FRAME ACCOUNTING OFF)"
            }
        );
        self.log(LinkEvent::Released {
            name: a.report.name.clone(),
            ifindex,
            removed,
        });
    }
}

fn describe(i: &InterfaceReport) -> String {
    if i.interception == Interception::Tap {
        return format!(
            "{}: driver {}, tc redirect into kxdp's tap (GSO super-frames)",
            i.name,
            if i.driver.is_empty() { "?" } else { &i.driver }
        );
    }
    format!(
        "{}: driver {}, {} queue(s), XDP {}{}, AF_XDP {}, checksums {}",
        i.name,
        if i.driver.is_empty() { "?" } else { &i.driver },
        i.queues,
        i.mode.as_str(),
        if i.replaced_stale {
            " (replaced a stale program)"
        } else {
            ""
        },
        if i.zero_copy {
            "zero-copy"
        } else {
            "copy mode"
        },
        if i.complete_checksums {
            "completed by kxdp (virtual interface)"
        } else {
            "as received"
        }
    )
}

/// Takes the tags the redirects of an earlier kxdp push (a restart, a takeover) before the
/// workers read: frames tagged before this process started keep their meaning and pass source
/// validation, where an unknown tag would be dropped. The link manager keeps these tags when it
/// re-attaches the filters.
fn adopt_tags(tags: &TapTags, t: &TapOptions) {
    let links = match kxdp_kernel::netlink::dump_all() {
        Ok(d) => d.links,
        Err(e) => {
            tracing::warn!("kxdp: listing links for the tap's tags: {e}");
            return;
        }
    };
    for l in links.iter().filter(|l| t.takes(l)) {
        if let Ok(Some(tag)) = kxdp_kernel::tc::redirect_tag(l.ifindex, crate::tap::TC_PREF) {
            tags.assign(l.ifindex, Some(tag));
        }
    }
}

/// Opens kxdp's tap when `opts.tap` asks for it (in the calling thread's network namespace):
/// one queue per worker, set up, reverse-path filtering off on it (what the tap hands back
/// comes from pods the kernel routes through other interfaces). Returns the link manager's
/// view of it and the workers' ports (to be popped, one each).
fn open_tap(
    opts: &RunOptions,
    workers: usize,
    adopted: Option<kxdp_kernel::offload::FlowOffload>,
) -> io::Result<(Option<TapTarget>, Vec<TapPort>)> {
    let Some(t) = &opts.tap else {
        return Ok((None, Vec::new()));
    };
    if crate::io::host_path::ipv4_forwarding_off() {
        tracing::warn!(
            "kxdp: IPv4 forwarding is off on this node (net.ipv4.conf.all.forwarding = 0): the \
             kernel drops what kxdp's tap hands back for it to route and the fast path's flows \
             it routes (pods' traffic other than between pods); kxdp does not change it: set it \
             on the node (the CNI usually does), or use podInterception: {{mode: xdp}}"
        );
    }
    let queues = TapQueue::open(&t.device, workers, crate::tap::TAP_OFFLOADS)
        .map_err(|e| io::Error::new(e.kind(), format!("podInterception: tap: {e}")))?;
    let mac = queues[0].mac()?;
    let ifindex = kxdp_kernel::sys::ifindex(&t.device)?;
    // What the tap hands back comes from pods the kernel routes through their veths, and the
    // replies of masqueraded connections carry a node address as their source: no strict
    // reverse path and local sources accepted, set through netlink (a container's /proc/sys
    // is read-only). No IPv6 address of its own, set before it is up: the kernel's own DAD,
    // MLD and router solicitations would come out of it untagged, as frames of no interface.
    use kxdp_kernel::netlink::{IPV4_DEVCONF_ACCEPT_LOCAL, IPV4_DEVCONF_RP_FILTER};
    let conf = [
        (
            IPV4_DEVCONF_RP_FILTER,
            crate::io::host_path::open_rp_filter().unwrap_or(0),
        ),
        (IPV4_DEVCONF_ACCEPT_LOCAL, 1),
    ];
    kxdp_kernel::netlink::set_devconf(ifindex, &conf, true).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "podInterception: tap {}: rp_filter, accept_local and no IPv6 address: {e}",
                t.device
            ),
        )
    })?;
    queues[0].set_up()?;
    queues[0].set_queue_length(t.queue_length)?;
    let tags = Arc::new(TapTags::default());
    adopt_tags(&tags, t);
    let offload = match (t.offload, adopted) {
        // A predecessor's (a takeover): the XDP programs handed over read these.
        (true, Some(fast)) => Some(Arc::new(fast)),
        (true, None) => {
            let slots = kxdp_kernel::offload::OFFLOAD_SLOTS;
            let fast = kxdp_kernel::offload::FlowOffload::new(slots).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("podInterception.offload: the fast path's maps: {e}"),
                )
            })?;
            Some(Arc::new(fast))
        }
        (false, _) => None,
    };
    // Each queue's port takes its own share of the fast path's counter slots.
    let n = queues.len();
    let ports = queues
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let offloads =
                (offload.as_ref()).map(|f| crate::offload::Offloads::new(f.clone(), i, n));
            let direct = t
                .direct_routing
                .then(kxdp_kernel::packet_tx::PacketTx::open)
                .transpose()
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("podInterception.directRouting: {e}"))
                })?;
            TapPort::new(q, ifindex, mac, tags.clone(), offloads, direct)
        })
        .collect::<io::Result<Vec<_>>>()?;
    tracing::info!(
        "kxdp: tap {} (ifindex {ifindex}): {} queue(s); interfaces matching {:?} are intercepted \
         through it; fast path {}, direct routing {}",
        t.device,
        ports.len(),
        t.interfaces,
        if t.offload { "on" } else { "off" },
        if t.direct_routing { "on" } else { "off" },
    );
    Ok((
        Some(TapTarget {
            ifindex,
            name: t.device.clone(),
            patterns: t.interfaces.clone(),
            every_veth: t.every_veth,
            tags,
            offload,
        }),
        ports,
    ))
}

/// NodePorts of a snapshot (what the XDP program must steer at node addresses).
pub fn node_ports(snap: &Snapshot) -> Vec<u16> {
    let mut ports: Vec<u16> = snap
        .frontends
        .iter()
        .filter(|(_, f)| f.kind == FrontendKind::NodePort)
        .map(|(k, _)| k.port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn node_addrs(snap: &Snapshot, local: &[IpAddr]) -> Vec<IpAddr> {
    // IPv6 link-local addresses go to the kernel before the program looks at the node maps;
    // leaving them out keeps the maps small on a node with one per pod veth (250 pods: 250).
    let mut a: Vec<IpAddr> = local
        .iter()
        .filter(|ip| !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .copied()
        .collect();
    a.extend(snap.node.addrs.iter().map(|x| x.to_ip(x.family())));
    a.sort();
    a.dedup();
    a
}

/// How long the programs a stopped (or killed) kxdp leaves attached keep holding its traffic for
/// the next one: a DaemonSet pod restarted on the node is forwarding again well within it; past
/// it the node's traffic goes to the kernel, as without kxdp.
pub const RESTART_HOLD: Duration = Duration::from_secs(10);

fn hold_deadline_ns() -> u64 {
    kxdp_kernel::sys::monotonic_ms().saturating_add(RESTART_HOLD.as_millis() as u64) * 1_000_000
}

/// Puts every tracked connection whose replies come to a node address (masqueraded ones, and
/// those the node itself opened to a Service) into the XDP program's masquerade-reply map, as
/// the workers did when the connections began. Returns (added, failed).
pub fn restore_masq_replies(maps: &SharedMaps, ct: &Conntrack, node: &[IpAddr]) -> (u64, u64) {
    let (mut added, mut failed) = (0, 0);
    for v in ct.connections() {
        let translated = v.orig.dst != v.reply.src || v.orig.dport != v.reply.sport;
        let to_node = node.contains(&v.reply.dst.to_ip(v.reply.family));
        if v.state & FLAG_MASQ == 0 && !(translated && to_node) {
            continue;
        }
        match maps.add_masq_reply(
            v.reply.proto,
            &v.reply.src,
            v.reply.family,
            v.reply.sport,
            v.reply.dport,
        ) {
            Ok(()) => added += 1,
            Err(_) => failed += 1,
        }
    }
    (added, failed)
}

impl AfXdp {
    /// Starts everything in the calling thread's network namespace: the workers (with empty
    /// socket sets), then the links matching `opts.interfaces` that exist now, then the link
    /// manager that follows links as they come and go.
    pub fn start(
        opts: &RunOptions,
        tables: Arc<dyn Tables>,
        ct: Arc<Conntrack>,
        stats: Option<Arc<DataplaneStats>>,
    ) -> io::Result<AfXdp> {
        if opts.interfaces.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no interfaces configured (config: interfaces)",
            ));
        }
        let routes = Routes::start()?;
        let table = routes.table.load_full();
        let workers = opts.workers.max(1);
        let maps = Arc::new(SharedMaps::create()?);
        // Until the sockets are in place, what the new programs steer to kxdp is held (dropped),
        // as the previous kxdp's held program did (see `RESTART_HOLD`).
        if opts.hold_for_restart {
            maps.hold_until(hold_deadline_ns())?;
        }
        // Node addresses and NodePorts, before the program sees a packet.
        let snap = tables.current();
        let local = table.local_addrs().to_vec();
        let addrs = node_addrs(&snap, &local);
        maps.set_node(&addrs, &node_ports(&snap))?;
        drop(snap);
        // Connections continued from a conntrack state file: their replies must reach kxdp
        // before the first packet of them does (the workers add new ones as they go).
        let (restored, failed) = restore_masq_replies(&maps, &ct, &addrs);
        if restored + failed > 0 {
            tracing::info!(
                "kxdp: {restored} masquerade-reply entries rebuilt from conntrack{}",
                if failed > 0 {
                    format!(" ({failed} failed)")
                } else {
                    String::new()
                }
            );
        }
        let shared = worker_shared(
            tables.clone(),
            ct,
            stats,
            &routes,
            &maps,
            opts.source_validation,
        );
        let (tap, mut tap_ports) = open_tap(opts, workers, None)?;
        let mut crew = Crew::default();
        for w in 0..workers {
            let cpu = (!opts.cpus.is_empty()).then(|| opts.cpus[w % opts.cpus.len()]);
            let mut worker = Worker::open(w, cpu, &[], &opts.xsk, opts.backoff, opts.kernel_port)?;
            if let Some(port) = tap_ports.pop() {
                worker.attach_tap(port)?;
            }
            crew.spawn(w, worker, &shared)?;
        }
        AfXdp::assemble(
            opts,
            crew,
            HashMap::new(),
            Some(&table),
            tap,
            maps,
            shared,
            routes,
        )
    }

    /// Starts the link manager (follows links as they come and go) and the thread that keeps
    /// the XDP program's node maps in step with publications (and the hold deadline ahead).
    fn spawn_threads(&mut self) -> io::Result<()> {
        // Read before the table: a change in between is then seen by the link manager.
        let routes_seen = self.routes.changed.current();
        let table = self.routes.table.load_full();
        // Node addresses and NodePorts in the XDP program's maps: refreshed when tables are
        // published and when the node's addresses change (both threads below call this).
        let node_maps = Arc::new(NodeMaps {
            maps: self.maps.clone(),
            tables: self.tables.clone(),
            routes: self.routes.table.clone(),
            last: Mutex::new((u64::MAX, Vec::new(), Vec::new())),
        });
        // Follow links as they come and go: the refresher re-reads on every link event and
        // bumps `routes.changed`, which this thread waits on.
        let links_thread = {
            let (links, stop, rt, changed, node_maps) = (
                self.links.clone(),
                self.threads_stop.clone(),
                self.routes.table.clone(),
                self.routes.changed.clone(),
                node_maps.clone(),
            );
            std::thread::Builder::new()
                .name("kxdp-links".into())
                .spawn(move || {
                    let mut last = table;
                    let mut seen = routes_seen;
                    // Once at the start: links may have come or gone since they were last synced.
                    let mut retry = true;
                    while !stop.load(Ordering::Relaxed) {
                        // Links that failed are retried (every few seconds, `Links::sync`).
                        let wait = if retry { LINK_RETRY_POLL } else { SAFETY_WAIT };
                        seen = changed.wait_newer(seen, wait);
                        let now = rt.load_full();
                        let new = !Arc::ptr_eq(&now, &last);
                        if new || retry {
                            if let Ok(mut l) = links.lock() {
                                l.sync(&now);
                                retry = !l.failed.is_empty();
                            }
                        }
                        if new {
                            node_maps.refresh();
                        }
                        last = now;
                    }
                })?
        };
        // And subscribe to publications (NodePorts, the Node object's addresses).
        let hold = self.hold_for_restart;
        let maps_thread = {
            let (maps, tables, stop, node_maps) = (
                self.maps.clone(),
                self.tables.clone(),
                self.threads_stop.clone(),
                node_maps.clone(),
            );
            std::thread::Builder::new()
                .name("kxdp-xdp-maps".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        // Keep the hold deadline ahead: if this process dies now, the programs
                        // it leaves hold the traffic for `RESTART_HOLD`.
                        if hold {
                            let _ = maps.hold_until(hold_deadline_ns());
                        }
                        let seen = node_maps.refresh();
                        tables.wait_newer(seen, SAFETY_WAIT);
                    }
                })?
        };
        self.links_thread = Some(links_thread);
        self.maps_thread = Some(maps_thread);
        Ok(())
    }

    /// Stops the workers at a batch boundary and the link and map threads, keeping every
    /// program attached and every socket bound: packets that arrive meanwhile wait on the RX
    /// rings (up to each socket's fill share). For a takeover ([`Quiesced`]).
    pub fn quiesce(mut self) -> Quiesced {
        // The slow threads first (woken: they wait for route changes and publications), while
        // the workers still forward.
        self.threads_stop.store(true, Ordering::Relaxed);
        self.routes.changed.bump();
        if let Some(t) = self.maps_thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.links_thread.take() {
            let _ = t.join();
        }
        let (links, fast_path) = self
            .links
            .lock()
            .map(|mut l| {
                let fast = l.tap.as_ref().and_then(|t| t.offload.clone());
                (std::mem::take(&mut l.attached), fast)
            })
            .unwrap_or_default();
        self.stop.store(true, Ordering::Relaxed);
        for w in &self.wakers {
            w.wake();
        }
        let mut workers = Vec::new();
        let mut lost = 0;
        for h in self.workers.drain(..) {
            match h.join() {
                Ok(mut w) => {
                    deep_fill(&mut w);
                    workers.push(w);
                }
                Err(_) => lost += 1,
            }
        }
        let stopped_at = std::time::SystemTime::now();
        Quiesced {
            afxdp: self,
            workers,
            links,
            fast_path,
            lost_workers: lost,
            stopped_at,
        }
    }

    /// Starts from a predecessor's kernel objects (a takeover: `io::takeover::adopt` rebuilds
    /// them from its description). Nothing is created or attached: packets keep flowing into
    /// the same rings, and the workers pick them up where the predecessor stopped.
    pub(crate) fn adopt(
        opts: &RunOptions,
        tables: Arc<dyn Tables>,
        ct: Arc<Conntrack>,
        stats: Option<Arc<DataplaneStats>>,
        routes: Routes,
        parts: Parts,
    ) -> io::Result<AfXdp> {
        let maps = parts.maps;
        let shared = worker_shared(
            tables.clone(),
            ct,
            stats,
            &routes,
            &maps,
            opts.source_validation,
        );
        let (tap, mut tap_ports) = open_tap(opts, parts.workers.len(), parts.fast_path)?;
        let mut crew = Crew::default();
        for (w, (umem, ports)) in parts.workers.into_iter().enumerate() {
            let cpu = (!opts.cpus.is_empty()).then(|| opts.cpus[w % opts.cpus.len()]);
            // The adopted sockets keep their ring sizes; new ones get the configured sizes.
            let xsk = XskConfig {
                frames: umem.frame_count(),
                frame_size: umem.frame_size(),
                ..opts.xsk
            };
            let mut worker =
                Worker::adopt(w, cpu, umem, ports, &xsk, opts.backoff, opts.kernel_port)?;
            if let Some(port) = tap_ports.pop() {
                worker.attach_tap(port)?;
            }
            crew.spawn(w, worker, &shared)?;
        }
        let attached = parts
            .links
            .into_iter()
            .map(|l| (l.report.ifindex, l))
            .collect();
        let afxdp = AfXdp::assemble(opts, crew, attached, None, tap, maps, shared, routes)?;
        if let Ok(mut l) = afxdp.links.lock() {
            l.reintercept_adopted();
            l.redirect_adopted();
        }
        Ok(afxdp)
    }

    /// The dataplane around started workers: the link manager's state (with `attached`, then
    /// synced with `sync_with` when given), the threads that follow links and publications.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        opts: &RunOptions,
        crew: Crew,
        attached: HashMap<u32, AttachedLink>,
        sync_with: Option<&Fib>,
        tap: Option<TapTarget>,
        maps: Arc<SharedMaps>,
        shared: Shared,
        routes: Routes,
    ) -> io::Result<AfXdp> {
        // The node's own connections to its NodePorts: steered by the same maps as the XDP
        // program (replaced in place after a restart or a takeover).
        if let Some(to) = opts.node_ports_to {
            to.attach(maps.steer_maps())?;
        }
        let mut links = Links {
            patterns: opts.interfaces.clone(),
            workers: crew.senders,
            maps: maps.clone(),
            mode: opts.mode,
            hold_for_restart: opts.hold_for_restart,
            tap,
            kernel_port: opts.kernel_port,
            attached,
            failed: HashMap::new(),
            events: Vec::new(),
        };
        if let Some(table) = sync_with {
            links.sync(table);
        }
        let mut interfaces: Vec<InterfaceReport> =
            links.attached.values().map(|a| a.report.clone()).collect();
        interfaces.sort_by(|a, b| a.name.cmp(&b.name));
        let mut afxdp = AfXdp {
            interfaces,
            counters: crew.counters,
            stop: shared.stop.clone(),
            wakers: crew.wakers,
            threads_stop: Arc::new(AtomicBool::new(false)),
            workers: crew.handles,
            maps_thread: None,
            links_thread: None,
            links: Arc::new(Mutex::new(links)),
            maps,
            tables: shared.tables.clone(),
            shared,
            routes,
            hold_for_restart: opts.hold_for_restart,
            keep_redirects: false,
        };
        afxdp.spawn_threads()?;
        Ok(afxdp)
    }

    /// The attached and failed interfaces, readable without `self` (the admin API's status).
    pub fn links_view(&self) -> LinksView {
        LinksView(self.links.clone())
    }

    /// The interfaces attached now.
    pub fn attached(&self) -> Vec<InterfaceReport> {
        let mut v: Vec<InterfaceReport> = self
            .links
            .lock()
            .map(|l| l.attached.values().map(|a| a.report.clone()).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// What happened to links so far (attached, failed, released).
    pub fn link_events(&self) -> Vec<LinkEvent> {
        self.links
            .lock()
            .map(|l| l.events.clone())
            .unwrap_or_default()
    }

    /// One line per interface for the startup report (and one for patterns that matched
    /// nothing yet).
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.interfaces.iter().map(describe).collect();
        if let Ok(l) = self.links.lock() {
            for p in &l.patterns {
                let hit = self
                    .interfaces
                    .iter()
                    .any(|i| wildmatch::WildMatch::new(p).matches(&i.name));
                if !hit {
                    lines.push(format!(
                        "{p}: matches no interface yet (attached when one appears)"
                    ));
                }
            }
        }
        lines
    }

    /// Stops the workers, then detaches the programs.
    pub fn stop(mut self) -> Vec<Worker> {
        self.shutdown()
    }

    /// Stops the workers for a restart: the programs stay attached and hold (drop) what they
    /// would steer to kxdp for `RESTART_HOLD`, so that the next kxdp continues the connections
    /// (with the conntrack state file) instead of the kernel resetting them meanwhile. With no
    /// next kxdp, the traffic goes to the kernel after that time (the programs stay attached,
    /// passing everything, until one replaces them or `ip link set dev IF xdp off`).
    pub fn stop_for_restart(mut self) -> Vec<Worker> {
        self.keep_redirects = true;
        let _ = self
            .links
            .lock()
            .map(|l| l.maps.hold_until(hold_deadline_ns()));
        if let Ok(mut l) = self.links.lock() {
            for (_, a) in l.attached.iter_mut() {
                if let Some(att) = a.attachment.take() {
                    att.leave_attached();
                }
            }
        }
        self.shutdown()
    }

    fn shutdown(&mut self) -> Vec<Worker> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads_stop.store(true, Ordering::Relaxed);
        for w in &self.wakers {
            w.wake();
        }
        self.routes.changed.bump();
        let done = self
            .workers
            .drain(..)
            .filter_map(|h| h.join().ok())
            .collect();
        if let Some(t) = self.maps_thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.links_thread.take() {
            let _ = t.join();
        }
        if let Ok(mut l) = self.links.lock() {
            if !self.keep_redirects {
                l.remove_redirects();
            }
            l.attached.clear();
        }
        done
    }
}

impl Drop for AfXdp {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Deep fill rings while nobody polls, so that what arrives until the successor polls waits on
/// the RX rings instead of being dropped for want of a fill frame: first the busy sockets (whose
/// share grew above the base, `Port::fill_target`) get up to a full ring each, then the free
/// frames left are shared evenly (at 10 kpps a 2048-entry ring lasts 200 ms). The reserve for
/// sockets still to come stays free: a socket the successor opens (a new pod, an interface
/// intercepted otherwise) gets its share at once, where an idle ring gives nothing back.
fn deep_fill(w: &mut Worker) {
    let base = crate::worker::fill_target(&w.xsk, 0);
    let keep = crate::worker::kept_reserve(base, w.ports.len());
    for busy_first in [true, false] {
        let n = w
            .ports
            .iter()
            .filter(|p| !busy_first || p.fill_target > base)
            .count()
            .max(1);
        let share = (w.umem.free_frames().saturating_sub(keep) / n) as u32;
        for p in &mut w.ports {
            if busy_first && p.fill_target <= base {
                continue;
            }
            let room = p
                .sock
                .rings()
                .fill
                .saturating_sub(p.sock.fill_outstanding());
            p.sock.refill(&mut w.umem, room.min(share));
        }
    }
}

/// A predecessor's kernel objects, rebuilt from a takeover's description
/// (`io::takeover::adopt`).
pub(crate) struct Parts {
    pub maps: Arc<SharedMaps>,
    /// The in-kernel fast path's maps (emptied), which the adopted XDP programs read.
    pub fast_path: Option<kxdp_kernel::offload::FlowOffload>,
    pub workers: Vec<(Umem, Vec<Port>)>,
    pub links: Vec<AttachedLink>,
}

/// A dataplane whose workers stopped at a batch boundary, everything else in place (see
/// [`AfXdp::quiesce`]): either handed to a successor (`io::takeover::describe`, then dropped:
/// the successor's descriptors keep sockets bound and programs attached) or resumed.
pub struct Quiesced {
    pub(crate) afxdp: AfXdp,
    pub(crate) workers: Vec<Worker>,
    /// The attached links, out of the (stopped) link manager.
    pub(crate) links: HashMap<u32, AttachedLink>,
    /// The in-kernel fast path's maps, which the XDP programs handed over read.
    pub(crate) fast_path: Option<Arc<kxdp_kernel::offload::FlowOffload>>,
    /// Workers whose thread had panicked (their sockets cannot be handed over).
    pub lost_workers: usize,
    /// When the last worker stopped polling.
    pub stopped_at: std::time::SystemTime,
}

impl Quiesced {
    /// Starts the same workers and threads again (a takeover that did not complete).
    pub fn resume(self) -> io::Result<AfXdp> {
        let Quiesced {
            mut afxdp,
            workers,
            links,
            ..
        } = self;
        if let Ok(mut l) = afxdp.links.lock() {
            l.attached = links;
        }
        let stop = Arc::new(AtomicBool::new(false));
        afxdp.stop = stop.clone();
        afxdp.shared.stop = stop;
        afxdp.threads_stop = Arc::new(AtomicBool::new(false));
        for w in workers {
            let h = w.spawn(afxdp.shared.clone())?;
            afxdp.workers.push(h);
        }
        afxdp.spawn_threads()?;
        Ok(afxdp)
    }

    /// Frames accounted for in every worker equal their UMEM's size (nothing leaked).
    pub fn frames_balanced(&self) -> bool {
        self.workers
            .iter()
            .all(|w| w.frames_accounted() == w.umem.frame_count() as u64)
    }

    /// Gives everything up after a successor took it over: closes this process's descriptors
    /// without detaching anything (the successor holds its own).
    pub fn release(self) {
        let Quiesced {
            mut afxdp,
            workers,
            links,
            ..
        } = self;
        // A program held through netlink stays attached for the successor, which now owns it.
        for (_, mut link) in links {
            if let Some(att) = link.attachment.take() {
                att.leave_attached();
            }
        }
        drop(workers);
        // The successor owns the redirects now (it re-attaches them in place).
        afxdp.keep_redirects = true;
        afxdp.shutdown();
    }
}
