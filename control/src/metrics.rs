//! The control plane's metrics, in one prometheus-client `Registry` (the `/metrics` endpoint
//! encodes it with `Metrics::encode`; the list: docs/operations.md "Metrics").
//!
//! Where the meaning matches kube-proxy's, the name is kube-proxy's, with its `kubeproxy_`
//! subsystem prefix, so that existing dashboards and alerts keep working:
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `kubeproxy_sync_proxy_rules_duration_seconds` | histogram | one table build + publication |
//! | `kubeproxy_sync_proxy_rules_last_timestamp_seconds` | gauge | unix time of the last publication |
//! | `kubeproxy_network_programming_duration_seconds` | histogram | object change (EndpointSlice `endpoints.kubernetes.io/last-change-trigger-time`, else the time kxdp received it) to publication |
//! | `kubeproxy_sync_proxy_rules_endpoint_changes_total` | counter | EndpointSlice adds, updates and deletes seen |
//! | `kubeproxy_sync_proxy_rules_endpoint_changes_pending` | gauge | of those, not yet published |
//! | `kubeproxy_sync_proxy_rules_service_changes_total` | counter | Service adds, updates and deletes seen |
//! | `kubeproxy_sync_proxy_rules_service_changes_pending` | gauge | of those, not yet published |
//! | `kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy}` | gauge (as in kube-proxy, despite the name) | Service ports with a Local policy (`internal`/`external`) and endpoints, none of them on this node |
//! | `kubeproxy_sync_full_proxy_rules_duration_seconds` | histogram | full rebuilds only |
//! | `kubeproxy_sync_partial_proxy_rules_duration_seconds` | histogram | incremental updates only |
//! | `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` | gauge | unix time a change last arrived |
//! | `kubeproxy_conntrack_reconciler_sync_duration_seconds` | histogram | one stale-UDP cleanup pass |
//! | `kubeproxy_conntrack_reconciler_deleted_entries_total` | counter | stale UDP connections deleted |
//!
//! The sync histograms, timestamps, no-local-endpoints gauge and reconciler metrics carry
//! kube-proxy's `ip_family` label (`IPv4`, `IPv6`): one kxdp sync serves both families and is
//! recorded under both, as kube-proxy's two per-family proxiers would each record theirs.
//! `process_*` and `kxdp_build_info`: `process_metrics`. `/configz` and `/proxyMode`:
//! `configz`, `PROXY_MODE`, served with `/metrics` by `metrics_route`.
//!
//! kxdp's own, prefixed `kxdp_`:
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `kxdp_sync_problems_total` | counter | objects (or parts) skipped because they could not be translated or decoded |
//! | `kxdp_sync_problems_current` | gauge | problems in the currently published tables |
//! | `kxdp_sync_snapshot_generation` | gauge | generation of the published snapshot |
//! | `kxdp_sync_source_errors_total{source}` | counter | source failures (API server unreachable, unreadable state files); the last good tables stay |
//! | `kxdp_sync_source_up{source}` | gauge | 1 while the source is connected and synced |
//! | `kxdp_sync_stale_seconds` | gauge | how long the published tables have lagged behind the sources (`Status::stale_since`, read at scrape time); 0 when up to date |
//!
//! Health (kube-proxy's names): `kubeproxy_proxy_healthz_total{code}`,
//! `kubeproxy_proxy_livez_total{code}` count `/healthz` and `/livez` answers by HTTP status.
//!
//! The dataplane, read at scrape time from the workers' published counters
//! (`kxdp_dataplane::stats`) and the shared conntrack table (ops: `attach_dataplane`):
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `kxdp_workers` | gauge | worker threads publishing counters |
//! | `kxdp_packets_total{worker,action}` | counter | packets by the action taken |
//! | `kxdp_bytes_total{worker}` | counter | bytes received |
//! | `kxdp_batches_total{worker}` | counter | batches processed |
//! | `kxdp_drops_total{reason}` | counter | dropped and rejected packets by reason, all workers |
//! | `kxdp_verdicts_total{reason}` | counter | every packet by reason, all workers |
//! | `kxdp_worker_busy_seconds_total{worker}` | counter | time spent processing batches |
//! | `kxdp_worker_busy_ratio{worker}` | gauge | share of wall time busy since the previous scrape |
//! | `kxdp_umem_frames{worker}`, `kxdp_umem_free_frames{worker}` | gauge | the worker's UMEM frames, and those on its free list |
//! | `kxdp_offloaded_packets_total{worker}` | counter | packets the kernel's fast path moved for the worker's offloaded flows (`podInterception.offload`; also in the packet and verdict counters) |
//! | `kxdp_offloaded_flows{worker}` | gauge | flows the worker has on the kernel's fast path |
//! | `kxdp_direct_routed_packets_total{worker}` | counter | packets direct routing sent straight to their egress interface, from the tap and on the fast path (`podInterception.directRouting`; also in the packet and verdict counters) |
//! | `kxdp_conntrack_entries` | gauge | live conntrack entries (connections and affinity records) |
//! | `kxdp_conntrack_max_entries` | gauge | the configured maximum |
//! | `kxdp_conntrack_early_drops_total` | counter | unassured entries dropped to make room |
//! | `kxdp_conntrack_created_total{worker}` | counter | connections created |
//! | `kxdp_conntrack_expired_total{worker}` | counter | entries expired by the worker's scan |
//! | `kxdp_policy_connections_total{kind,policy,direction,rule,verdict}` | counter | new connections a policy rule decided (`rule`: its index, or `isolation`; `crate::policy::counters`) |
//! | `kxdp_conntrack_table_bytes` | gauge | memory the table lives in (process memory, or the state file) |
//! | `kxdp_conntrack_table_huge_page_bytes` | gauge | of it, bytes in huge pages (a state file: only on a tmpfs with `huge=`, `conntrack.stateFileHugePages`) |
//! | `kxdp_conntrack_restore_total{result}` | counter | with `conntrack.stateFile`: 1 for what the start made of the file (`created`, `restored`, `migrated`, `discarded_version`, `discarded_corrupt`, `discarded_boot`, `discarded_truncated`) |
//! | `kxdp_conntrack_restored_entries` | gauge | entries continued from the state file at start |
//! | `kxdp_conntrack_restore_dropped_entries` | gauge | malformed or duplicate entries dropped from it |
//! | `kxdp_xsk_rx_ring_full_total{interface,queue}` | counter | frames the kernel dropped at the AF_XDP socket: RX ring full |
//! | `kxdp_xsk_rx_dropped_total{interface,queue}` | counter | frames the kernel dropped at the socket otherwise (no fill-ring frame, too large) |
//! | `kxdp_xsk_rx_fill_ring_empty_total{interface,queue}` | counter | the kernel found the fill ring empty |
//! | `kxdp_xsk_rx_invalid_descs_total{interface,queue}`, `kxdp_xsk_tx_invalid_descs_total{...}` | counter | descriptors the kernel refused |
//! | `kxdp_xsk_tx_ring_empty_total{interface,queue}` | counter | the kernel found the TX ring empty when kicked |
//! | `kxdp_xsk_ring_entries{interface,queue,ring}` | gauge | ring sizes (config `afxdp`) |
//! | `kxdp_tap_queue_full_total{interface}` | counter | frames the kernel dropped at kxdp's tap: a queue to a worker full (`podInterception: tap`) |

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use kxdp_dataplane::conntrack::Conntrack;
use kxdp_dataplane::policy::PolicyTables;
use kxdp_dataplane::stats::DataplaneStats;
use kxdp_dataplane::verdict::{Action, Reason};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::policy::counters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficPolicyLabel {
    /// `internal` or `external`.
    pub traffic_policy: String,
}

/// `kxdp_conntrack_restore_total`'s `result` (`kxdp_dataplane::conntrack::RestoreResult`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestoreLabel {
    pub result: String,
}

/// kube-proxy's `ip_family` label: `IPv4` or `IPv6`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IpFamilyLabel {
    pub ip_family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyPolicyLabel {
    pub ip_family: String,
    pub traffic_policy: String,
}

/// The IP families kxdp serves (both: one table build covers IPv4 and IPv6, where kube-proxy
/// runs one proxier per family, each observing its own sync).
pub const IP_FAMILIES: [&str; 2] = ["IPv4", "IPv6"];

/// A histogram with kube-proxy's `ip_family` label: each observation is recorded for every
/// family, as each of kube-proxy's per-family proxiers would record its own sync.
#[derive(Clone, Debug)]
pub struct FamilyHistogram(Family<IpFamilyLabel, Histogram, fn() -> Histogram>);

impl FamilyHistogram {
    fn new(make: fn() -> Histogram) -> Self {
        FamilyHistogram(Family::new_with_constructor(make))
    }

    pub fn observe(&self, v: f64) {
        for f in IP_FAMILIES {
            self.observe_family(f, v);
        }
    }

    pub fn observe_family(&self, family: &str, v: f64) {
        self.0
            .get_or_create(&IpFamilyLabel {
                ip_family: family.into(),
            })
            .observe(v);
    }
}

/// A gauge with the `ip_family` label, set for every family.
#[derive(Clone, Debug, Default)]
pub struct FamilyGauge(Family<IpFamilyLabel, Gauge<f64, AtomicU64>>);

impl FamilyGauge {
    pub fn set(&self, v: f64) {
        for f in IP_FAMILIES {
            self.0
                .get_or_create(&IpFamilyLabel {
                    ip_family: f.into(),
                })
                .set(v);
        }
    }
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// A source name: `files`, or the API resource (`services`, `endpointslices`, ...).
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// HTTP status code.
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerActionLabel {
    worker: String,
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyRuleLabel {
    kind: String,
    policy: String,
    direction: String,
    rule: String,
    verdict: String,
}

/// One AF_XDP socket: the interface's name and the queue it is bound to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SocketLabel {
    interface: String,
    queue: String,
}

/// An interface of kxdp's own (its tap).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InterfaceLabel {
    interface: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SocketRingLabel {
    interface: String,
    queue: String,
    /// `rx`, `tx`, `fill` or `completion`.
    ring: String,
}

/// The kernel's per-socket counters (`XDP_STATISTICS`) as `/metrics` names them:
/// (metric name without `_total`, help, field).
type KernelField = fn(&kxdp_kernel::afxdp::KernelXskStats) -> u64;
const XSK_COUNTERS: [(&str, &str, KernelField); 6] = [
    (
        "kxdp_xsk_rx_ring_full",
        "Frames the kernel dropped because the AF_XDP socket's RX ring was full (the worker did not keep up or was off its CPU)",
        |k| k.rx_ring_full,
    ),
    (
        "kxdp_xsk_rx_dropped",
        "Frames the kernel dropped on their way into the AF_XDP socket for other reasons than a full RX ring (no fill-ring frame to copy into, a frame larger than a UMEM frame)",
        |k| k.rx_dropped,
    ),
    (
        "kxdp_xsk_rx_fill_ring_empty",
        "Times the kernel found the AF_XDP socket's fill ring empty when it needed a frame",
        |k| k.rx_fill_ring_empty_descs,
    ),
    (
        "kxdp_xsk_rx_invalid_descs",
        "Fill-ring descriptors the kernel refused",
        |k| k.rx_invalid_descs,
    ),
    (
        "kxdp_xsk_tx_invalid_descs",
        "TX-ring descriptors the kernel refused (not sent)",
        |k| k.tx_invalid_descs,
    ),
    (
        "kxdp_xsk_tx_ring_empty",
        "Times the kernel found the AF_XDP socket's TX ring empty when kicked",
        |k| k.tx_ring_empty_descs,
    ),
];

/// The dataplane state a scrape reads.
struct DataplaneSource {
    stats: Arc<DataplaneStats>,
    ct: Arc<Conntrack>,
    /// Per worker: busy nanoseconds and when, at the previous scrape.
    prev: Mutex<Vec<(u64, Instant)>>,
}

/// Encodes the dataplane metrics at scrape time (nothing when no dataplane is attached).
#[derive(Clone, Default)]
struct DataplaneCollector(
    Arc<OnceLock<DataplaneSource>>,
    Arc<OnceLock<PolicyTablesFn>>,
);

/// Reads the published policy tables (what names the per-rule counts).
type PolicyTablesFn = Box<dyn Fn() -> Arc<PolicyTables> + Send + Sync>;

impl std::fmt::Debug for DataplaneCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataplaneCollector")
    }
}

fn put<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    m: &M,
) -> Result<(), std::fmt::Error> {
    m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)
}

/// Encodes `kxdp_sync_stale_seconds` at scrape time from the control loop's status (nothing
/// until a loop attaches it). Read at scrape time so that a loop stuck in a rebuild still shows
/// a growing value.
#[derive(Clone, Default)]
struct StaleCollector(Arc<OnceLock<Arc<Mutex<crate::status::Status>>>>);

impl std::fmt::Debug for StaleCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StaleCollector")
    }
}

impl Collector for StaleCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(status) = self.0.get() else {
            return Ok(());
        };
        let since = status.lock().unwrap().stale_since();
        let stale = Gauge::<f64, AtomicU64>::default();
        stale.set(since.map_or(0.0, stale_seconds));
        put(
            &mut enc,
            "kxdp_sync_stale_seconds",
            "Seconds the published tables have lagged behind the sources (0: up to date)",
            &stale,
        )
    }
}

/// Seconds from `since` to now (0 when the clock went back).
fn stale_seconds(since: std::time::SystemTime) -> f64 {
    std::time::SystemTime::now()
        .duration_since(since)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Collector for DataplaneCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(src) = self.0.get() else {
            return Ok(());
        };
        let samples = src.stats.samples();
        let now = Instant::now();
        let packets = Family::<WorkerActionLabel, Counter>::default();
        let bytes = Family::<WorkerLabel, Counter>::default();
        let batches = Family::<WorkerLabel, Counter>::default();
        let busy = Family::<WorkerLabel, Counter<f64, AtomicU64>>::default();
        let ratio = Family::<WorkerLabel, Gauge<f64, AtomicU64>>::default();
        let created = Family::<WorkerLabel, Counter>::default();
        let expired = Family::<WorkerLabel, Counter>::default();
        let offloaded = Family::<WorkerLabel, Counter>::default();
        let offloaded_flows = Family::<WorkerLabel, Gauge>::default();
        let direct_routed = Family::<WorkerLabel, Counter>::default();
        let umem_frames = Family::<WorkerLabel, Gauge>::default();
        let umem_free = Family::<WorkerLabel, Gauge>::default();
        let drops = Family::<ReasonLabel, Counter>::default();
        let verdicts = Family::<ReasonLabel, Counter>::default();
        let mut prev = src.prev.lock().unwrap();
        prev.resize(samples.len(), (0, now));
        for (i, s) in samples.iter().enumerate() {
            let w = WorkerLabel {
                worker: i.to_string(),
            };
            for a in Action::ALL {
                packets
                    .get_or_create(&WorkerActionLabel {
                        worker: i.to_string(),
                        action: a.as_str().into(),
                    })
                    .inc_by(s.actions[a as usize]);
            }
            bytes.get_or_create(&w).inc_by(s.bytes);
            batches.get_or_create(&w).inc_by(s.batches);
            busy.get_or_create(&w).inc_by(s.busy_ns as f64 / 1e9);
            created.get_or_create(&w).inc_by(s.ct_created);
            expired.get_or_create(&w).inc_by(s.ct_expired);
            offloaded.get_or_create(&w).inc_by(s.offloaded);
            offloaded_flows
                .get_or_create(&w)
                .set(s.offloaded_flows as i64);
            direct_routed.get_or_create(&w).inc_by(s.direct_routed);
            umem_frames.get_or_create(&w).set(s.umem_frames as i64);
            umem_free.get_or_create(&w).set(s.umem_free as i64);
            let (pb, pt) = prev[i];
            let wall = now.duration_since(pt).as_nanos() as f64;
            let r = if wall > 0.0 {
                (s.busy_ns.saturating_sub(pb) as f64 / wall).min(1.0)
            } else {
                0.0
            };
            ratio.get_or_create(&w).set(r);
            prev[i] = (s.busy_ns, now);
        }
        drop(prev);
        for r in Reason::ALL {
            let n: u64 = samples.iter().map(|s| s.reasons[*r as usize]).sum();
            let l = ReasonLabel {
                reason: r.as_str().into(),
            };
            verdicts.get_or_create(&l).inc_by(n);
            if matches!(r.action(), Action::Drop | Action::Reject) {
                drops.get_or_create(&l).inc_by(n);
            }
        }
        let workers = Gauge::<i64>::default();
        workers.set(samples.len() as i64);
        put(
            &mut enc,
            "kxdp_workers",
            "Worker threads publishing counters",
            &workers,
        )?;
        put(
            &mut enc,
            "kxdp_packets",
            "Packets by the action taken",
            &packets,
        )?;
        put(&mut enc, "kxdp_bytes", "Bytes received", &bytes)?;
        put(&mut enc, "kxdp_batches", "Batches processed", &batches)?;
        put(
            &mut enc,
            "kxdp_drops",
            "Dropped and rejected packets by reason",
            &drops,
        )?;
        put(&mut enc, "kxdp_verdicts", "Packets by reason", &verdicts)?;
        put(
            &mut enc,
            "kxdp_worker_busy_seconds",
            "Time spent processing batches",
            &busy,
        )?;
        put(
            &mut enc,
            "kxdp_worker_busy_ratio",
            "Share of wall time spent processing batches since the previous scrape",
            &ratio,
        )?;
        put(
            &mut enc,
            "kxdp_umem_frames",
            "Frames of the worker's UMEM",
            &umem_frames,
        )?;
        put(
            &mut enc,
            "kxdp_umem_free_frames",
            "Frames on the worker's UMEM free list (the others are on the kernel's rings, in flight or held)",
            &umem_free,
        )?;
        encode_sockets(&mut enc, &src.stats)?;
        if let Some(tables) = self.1.get() {
            let per_rule = Family::<PolicyRuleLabel, Counter>::default();
            for r in counters::rows(&tables(), &src.stats.policy_counts()) {
                per_rule
                    .get_or_create(&PolicyRuleLabel {
                        kind: r.kind,
                        policy: r.policy,
                        direction: r.direction,
                        rule: r.rule,
                        verdict: r.verdict,
                    })
                    .inc_by(r.connections);
            }
            put(
                &mut enc,
                "kxdp_policy_connections",
                "New connections per policy rule that decided them",
                &per_rule,
            )?;
        }
        let entries = Gauge::<i64>::default();
        entries.set(src.ct.len() as i64);
        put(
            &mut enc,
            "kxdp_conntrack_entries",
            "Live conntrack entries",
            &entries,
        )?;
        let max = Gauge::<i64>::default();
        max.set(src.ct.config().max_entries as i64);
        put(
            &mut enc,
            "kxdp_conntrack_max_entries",
            "The configured conntrack maximum",
            &max,
        )?;
        let early = Counter::<u64>::default();
        early.inc_by(src.ct.early_drops());
        put(
            &mut enc,
            "kxdp_conntrack_early_drops",
            "Unassured conntrack entries dropped to make room",
            &early,
        )?;
        put(
            &mut enc,
            "kxdp_conntrack_created",
            "Connections created",
            &created,
        )?;
        put(
            &mut enc,
            "kxdp_conntrack_expired",
            "Conntrack entries expired",
            &expired,
        )?;
        put(
            &mut enc,
            "kxdp_offloaded_packets",
            "Packets the kernel's fast path moved for offloaded flows",
            &offloaded,
        )?;
        put(
            &mut enc,
            "kxdp_offloaded_flows",
            "Flows on the kernel's fast path",
            &offloaded_flows,
        )?;
        put(
            &mut enc,
            "kxdp_direct_routed_packets",
            "Packets direct routing sent straight to their egress interface",
            &direct_routed,
        )?;
        let memory = src.ct.memory();
        let table_bytes = Gauge::<i64>::default();
        table_bytes.set(memory.bytes as i64);
        put(
            &mut enc,
            "kxdp_conntrack_table_bytes",
            "Memory the conntrack table lives in (process memory or the state file)",
            &table_bytes,
        )?;
        if let Some(huge) = memory.huge_page_bytes {
            let huge_bytes = Gauge::<i64>::default();
            huge_bytes.set(huge as i64);
            put(
                &mut enc,
                "kxdp_conntrack_table_huge_page_bytes",
                "Of the conntrack table's memory, bytes in huge pages",
                &huge_bytes,
            )?;
        }
        if let Some(r) = src.ct.restore_report() {
            let results = Family::<RestoreLabel, Counter>::default();
            for x in kxdp_dataplane::conntrack::RestoreResult::ALL {
                results
                    .get_or_create(&RestoreLabel {
                        result: x.as_str().into(),
                    })
                    .inc_by(u64::from(x == r.result));
            }
            put(
                &mut enc,
                "kxdp_conntrack_restore",
                "What the start made of the conntrack state file, by result",
                &results,
            )?;
            let restored = Gauge::<i64>::default();
            restored.set(r.restored as i64);
            put(
                &mut enc,
                "kxdp_conntrack_restored_entries",
                "Conntrack entries continued from the state file at start",
                &restored,
            )?;
            let dropped = Gauge::<i64>::default();
            dropped.set(r.dropped as i64);
            put(
                &mut enc,
                "kxdp_conntrack_restore_dropped_entries",
                "Malformed or duplicate entries dropped from the state file at start",
                &dropped,
            )?;
        }
        Ok(())
    }
}

/// The AF_XDP sockets' kernel counters and ring sizes, from the table the workers refresh about
/// once a second (`DataplaneStats::socket_samples`).
fn encode_sockets(
    enc: &mut DescriptorEncoder,
    stats: &DataplaneStats,
) -> Result<(), std::fmt::Error> {
    let sockets = stats.socket_samples();
    let label = |s: &kxdp_dataplane::stats::SocketSample| SocketLabel {
        interface: s.interface.clone(),
        queue: s.queue.to_string(),
    };
    for (name, help, field) in XSK_COUNTERS {
        let f = Family::<SocketLabel, Counter>::default();
        for s in &sockets {
            f.get_or_create(&label(s)).inc_by(field(&s.kernel));
        }
        put(enc, name, help, &f)?;
    }
    let rings = Family::<SocketRingLabel, Gauge>::default();
    for s in &sockets {
        for (ring, n) in [
            ("rx", s.rings.rx),
            ("tx", s.rings.tx),
            ("fill", s.rings.fill),
            ("completion", s.rings.completion),
        ] {
            rings
                .get_or_create(&SocketRingLabel {
                    interface: s.interface.clone(),
                    queue: s.queue.to_string(),
                    ring: ring.into(),
                })
                .set(i64::from(n));
        }
    }
    put(
        enc,
        "kxdp_xsk_ring_entries",
        "Entries of each AF_XDP socket's rings (config afxdp)",
        &rings,
    )?;
    if let Some(t) = stats.tap_sample() {
        let f = Family::<InterfaceLabel, Counter>::default();
        f.get_or_create(&InterfaceLabel {
            interface: t.interface,
        })
        .inc_by(t.queue_full);
        put(
            enc,
            "kxdp_tap_queue_full",
            "Frames the kernel dropped at kxdp's tap because its queue to a worker was full (the worker did not keep up)",
            &f,
        )?;
    }
    Ok(())
}

/// Every control-plane metric. Cheap to clone handles (the metrics are `Arc`s inside).
pub struct Metrics {
    registry: Registry,
    pub sync_duration: FamilyHistogram,
    pub sync_full_duration: FamilyHistogram,
    pub sync_partial_duration: FamilyHistogram,
    pub sync_last_timestamp: FamilyGauge,
    pub sync_last_queued_timestamp: FamilyGauge,
    pub network_programming_duration: FamilyHistogram,
    pub conntrack_reconciler_duration: FamilyHistogram,
    pub conntrack_reconciler_deleted: Family<IpFamilyLabel, Counter>,
    pub endpoint_changes_total: Counter,
    pub endpoint_changes_pending: Gauge,
    pub service_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub no_local_endpoints: Family<FamilyPolicyLabel, Gauge>,
    pub problems_total: Counter,
    pub problems: Gauge,
    pub generation: Gauge,
    pub source_errors_total: Family<SourceLabel, Counter>,
    pub source_up: Family<SourceLabel, Gauge>,
    pub proxy_healthz_total: Family<CodeLabel, Counter>,
    pub proxy_livez_total: Family<CodeLabel, Counter>,
    dataplane: DataplaneCollector,
    stale: StaleCollector,
}

/// kube-proxy's sync duration buckets: `ExponentialBuckets(0.001, 2, 15)`.
fn sync_buckets() -> impl Iterator<Item = f64> {
    (0..15).map(|i| 0.001 * 2f64.powi(i))
}

fn sync_histogram() -> Histogram {
    Histogram::new(sync_buckets())
}

/// kube-proxy's network programming buckets: `LinearBuckets(0.25, 0.25, 2)` (0.25 s, 0.5 s),
/// `LinearBuckets(1, 1, 59)` (1..59 s), `LinearBuckets(60, 5, 12)` (60..115 s),
/// `LinearBuckets(120, 30, 7)` (2..5 min).
pub fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..60).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

fn programming_histogram() -> Histogram {
    Histogram::new(programming_buckets())
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            sync_duration: FamilyHistogram::new(sync_histogram),
            sync_full_duration: FamilyHistogram::new(sync_histogram),
            sync_partial_duration: FamilyHistogram::new(sync_histogram),
            sync_last_timestamp: FamilyGauge::default(),
            sync_last_queued_timestamp: FamilyGauge::default(),
            network_programming_duration: FamilyHistogram::new(programming_histogram),
            conntrack_reconciler_duration: FamilyHistogram::new(sync_histogram),
            conntrack_reconciler_deleted: Family::default(),
            endpoint_changes_total: Counter::default(),
            endpoint_changes_pending: Gauge::default(),
            service_changes_total: Counter::default(),
            service_changes_pending: Gauge::default(),
            no_local_endpoints: Family::default(),
            problems_total: Counter::default(),
            problems: Gauge::default(),
            generation: Gauge::default(),
            source_errors_total: Family::default(),
            source_up: Family::default(),
            proxy_healthz_total: Family::default(),
            proxy_livez_total: Family::default(),
            dataplane: DataplaneCollector::default(),
            stale: StaleCollector::default(),
        };
        registry.register_collector(Box::new(m.dataplane.clone()));
        registry.register_collector(Box::new(m.stale.clone()));
        registry.register_collector(Box::new(crate::process_metrics::ProcessCollector));
        // kube-proxy synthesizes a "queued" time as its informers start.
        m.sync_queued();
        {
            let kp = registry.sub_registry_with_prefix("kubeproxy");
            kp.register(
                "sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds (one table build and publication)",
                m.sync_duration.0.clone(),
            );
            kp.register(
                "sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                m.sync_full_duration.0.clone(),
            );
            kp.register(
                "sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                m.sync_partial_duration.0.clone(),
            );
            kp.register(
                "sync_proxy_rules_last_timestamp_seconds",
                "The last time the tables were successfully published",
                m.sync_last_timestamp.0.clone(),
            );
            kp.register(
                "sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of the tables was queued (a change arrived)",
                m.sync_last_queued_timestamp.0.clone(),
            );
            kp.register(
                "conntrack_reconciler_sync_duration_seconds",
                "ReconcileConntrackFlowsLatency latency in seconds (stale UDP connections deleted after a publication)",
                m.conntrack_reconciler_duration.0.clone(),
            );
            kp.register(
                "conntrack_reconciler_deleted_entries",
                "Cumulative conntrack flows deleted by conntrack reconciler",
                m.conntrack_reconciler_deleted.clone(),
            );
            kp.register(
                "network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                m.network_programming_duration.0.clone(),
            );
            // prometheus-client appends `_total` to counters.
            kp.register(
                "sync_proxy_rules_endpoint_changes",
                "Cumulative EndpointSlice changes",
                m.endpoint_changes_total.clone(),
            );
            kp.register(
                "sync_proxy_rules_endpoint_changes_pending",
                "Pending EndpointSlice changes",
                m.endpoint_changes_pending.clone(),
            );
            kp.register(
                "sync_proxy_rules_service_changes",
                "Cumulative Service changes",
                m.service_changes_total.clone(),
            );
            kp.register(
                "sync_proxy_rules_service_changes_pending",
                "Pending Service changes",
                m.service_changes_pending.clone(),
            );
            kp.register(
                "proxy_healthz",
                "Cumulative proxy healthz HTTP status",
                m.proxy_healthz_total.clone(),
            );
            kp.register(
                "proxy_livez",
                "Cumulative proxy livez HTTP status",
                m.proxy_livez_total.clone(),
            );
            kp.register(
                "sync_proxy_rules_no_local_endpoints_total",
                "Number of Service ports with a Local traffic policy and no local endpoints",
                m.no_local_endpoints.clone(),
            );
        }
        {
            let k = registry.sub_registry_with_prefix("kxdp_sync");
            k.register(
                "problems",
                "Objects (or parts) skipped because they could not be translated or decoded",
                m.problems_total.clone(),
            );
            k.register(
                "problems_current",
                "Problems in the currently published tables",
                m.problems.clone(),
            );
            k.register(
                "snapshot_generation",
                "Generation of the published snapshot",
                m.generation.clone(),
            );
            k.register(
                "source_errors",
                "Source failures; the last good tables stay published",
                m.source_errors_total.clone(),
            );
            k.register(
                "source_up",
                "1 while the source is connected and synced",
                m.source_up.clone(),
            );
        }
        Metrics { registry, ..m }
    }

    /// The registry, for an endpoint that serves more than these metrics.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The registry in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry)
            .expect("encoding into a String cannot fail");
        s
    }

    pub fn set_no_local_endpoints(&self, internal: i64, external: i64) {
        for f in IP_FAMILIES {
            for (p, v) in [("internal", internal), ("external", external)] {
                self.no_local_endpoints
                    .get_or_create(&FamilyPolicyLabel {
                        ip_family: f.into(),
                        traffic_policy: p.into(),
                    })
                    .set(v);
            }
        }
    }

    /// A change arrived: a sync is queued (kube-proxy's `Sync()`).
    pub fn sync_queued(&self) {
        self.sync_last_queued_timestamp.set(now_unix());
    }

    /// One pass of the stale-UDP reconciler (kube-proxy's conntrack reconciler): its duration
    /// and the connections it deleted, per family.
    pub fn conntrack_reconciled(&self, seconds: f64, deleted: [usize; 2]) {
        for (f, n) in IP_FAMILIES.iter().zip(deleted) {
            self.conntrack_reconciler_duration
                .observe_family(f, seconds);
            self.conntrack_reconciler_deleted
                .get_or_create(&IpFamilyLabel {
                    ip_family: (*f).into(),
                })
                .inc_by(n as u64);
        }
    }

    /// Adds the dataplane metrics (read at each scrape); a second call is ignored.
    pub fn attach_dataplane(&self, stats: Arc<DataplaneStats>, ct: Arc<Conntrack>) {
        let _ = self.dataplane.0.set(DataplaneSource {
            stats,
            ct,
            prev: Mutex::new(Vec::new()),
        });
    }

    /// Adds `kxdp_policy_connections_total`, its rules named from the tables `tables` returns
    /// (the published ones) at each scrape; a second call is ignored.
    pub fn attach_policy_tables(
        &self,
        tables: impl Fn() -> Arc<PolicyTables> + Send + Sync + 'static,
    ) {
        let _ = self.dataplane.1.set(Box::new(tables));
    }

    /// Adds `kxdp_sync_stale_seconds`, read from the control loop's status at each scrape
    /// (`ControlLoop::spawn` attaches its own); a second call is ignored.
    pub fn attach_status(&self, status: Arc<Mutex<crate::status::Status>>) {
        let _ = self.stale.0.set(status);
    }

    pub fn source_error(&self, source: &str) {
        let l = SourceLabel {
            source: source.into(),
        };
        self.source_errors_total.get_or_create(&l).inc();
        self.source_up.get_or_create(&l).set(0);
    }

    pub fn source_up(&self, source: &str) {
        self.source_up
            .get_or_create(&SourceLabel {
                source: source.into(),
            })
            .set(1);
    }
}

/// What kube-proxy's `/proxyMode` answers with its mode (`iptables`, `ipvs`, `nftables`).
pub const PROXY_MODE: &str = "kxdp";

/// The body of `/configz`: the running configuration (after `nodeOverrides`), as kube-proxy's
/// `/configz` nests its KubeProxyConfiguration under its API group.
pub fn configz(config: &crate::config::Config) -> String {
    let mut out = serde_json::Map::new();
    out.insert(
        "kxdp.dev".into(),
        serde_json::to_value(config).unwrap_or_default(),
    );
    serde_json::Value::Object(out).to_string()
}

/// The metrics server's routes: `/metrics`, `/configz`, `/proxyMode`; (content type, body), or
/// None for a path it does not serve (404). `configz` is the `configz` body, computed once.
pub fn metrics_route(
    path: &str,
    metrics: &Metrics,
    configz: &str,
) -> Option<(&'static str, String)> {
    match path {
        "/metrics" => Some((
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        )),
        "/configz" => Some(("application/json", configz.to_string())),
        "/proxyMode" => Some(("text/plain; charset=utf-8", PROXY_MODE.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_names() {
        let m = Metrics::new();
        m.service_changes_total.inc();
        m.set_no_local_endpoints(1, 2);
        m.sync_duration.observe(0.01);
        m.conntrack_reconciled(0.002, [1, 2]);
        m.sync_last_timestamp.set(1.7e9);
        m.network_programming_duration.observe(0.3);
        m.problems_total.inc();
        let text = m.encode();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1700000000",
            "kubeproxy_network_programming_duration_seconds_count",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 0",
            "kubeproxy_sync_proxy_rules_service_changes_total 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv6\",traffic_policy=\"external\"} 2",
            "kxdp_sync_problems_total 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.016\",ip_family=\"IPv6\"} 1",
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"} 1",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv6\"} 2",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family=\"IPv4\"} 1",
            "kxdp_build_info{version=\"0.1.0\",git_commit=",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        // kube-proxy's programming buckets: 0.25, 0.5, 1..59, 60..115 by 5, 120..300 by 30.
        let b = programming_buckets();
        assert_eq!(b.len(), 2 + 59 + 12 + 7);
        assert_eq!(
            (b[0], b[2], b[60], b[61], b[72], b[73], b[79]),
            (0.25, 1.0, 59.0, 60.0, 115.0, 120.0, 300.0)
        );
    }

    #[test]
    fn policy_connections_per_rule() {
        use kxdp_dataplane::pipeline::Counters;
        use kxdp_dataplane::policy::{Direction, LocalPod, RuleInfo, Tally, ISOLATION};
        let rule = |policy: &str, direction, index| RuleInfo {
            policy: policy.into(),
            direction,
            index,
            cluster: None,
        };
        let db = LocalPod {
            name: "demo/db".into(),
            ingress_policies: Arc::from([Arc::from("demo/db-in")]),
            ..Default::default()
        };
        let tables = Arc::new(PolicyTables::new(
            vec![(db, vec![])],
            vec![],
            vec![
                rule("demo/db-in", Direction::Ingress, 0),
                rule("demo/db-in", Direction::Ingress, ISOLATION),
                // A deleted policy's counts are not listed.
                rule("demo/gone", Direction::Ingress, 0),
            ],
        ));
        let stats = Arc::new(DataplaneStats::new(1));
        let mut c = Counters::default();
        for r in [0, 1, 1, 2] {
            c.policy.rule(r);
        }
        stats.after_batch(0, &c, &[], 1, 1);
        let ct = Conntrack::new(Default::default(), 1);
        let m = Metrics::new();
        m.attach_dataplane(stats, Arc::new(ct));
        m.attach_policy_tables(move || tables.clone());
        let text = m.encode();
        let line = |rule: &str, verdict: &str, n: u64| {
            format!(
                "kxdp_policy_connections_total{{kind=\"NetworkPolicy\",policy=\"demo/db-in\",direction=\"ingress\",rule=\"{rule}\",verdict=\"{verdict}\"}} {n}"
            )
        };
        assert!(text.contains(&line("0", "allow", 1)), "{text}");
        assert!(text.contains(&line("isolation", "deny", 2)), "{text}");
        assert!(!text.contains("demo/gone"), "{text}");
    }

    #[test]
    fn conntrack_restore_result() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conntrack");
        let cfg = kxdp_dataplane::conntrack::CtConfig {
            max_entries: 100,
            ..Default::default()
        };
        let (ct, _) = Conntrack::open_file(&path, cfg, 1).unwrap();
        let m = Metrics::new();
        m.attach_dataplane(Arc::new(DataplaneStats::new(1)), Arc::new(ct));
        let text = m.encode();
        for line in [
            "kxdp_conntrack_restore_total{result=\"created\"} 1",
            "kxdp_conntrack_restore_total{result=\"restored\"} 0",
            "kxdp_conntrack_restore_total{result=\"discarded_version\"} 0",
            "kxdp_conntrack_restored_entries 0",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        // The file's length, and a huge-page figure (0 on an ordinary filesystem).
        let bytes = std::fs::metadata(&path).unwrap().len();
        assert!(
            text.contains(&format!("kxdp_conntrack_table_bytes {bytes}\n")),
            "table bytes missing in\n{text}"
        );
        assert!(
            text.contains("kxdp_conntrack_table_huge_page_bytes "),
            "{text}"
        );
    }

    #[test]
    fn configz_and_proxy_mode() {
        let m = Metrics::new();
        let c = crate::config::Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: n1\n",
            std::path::Path::new("c.yaml"),
        )
        .unwrap();
        let body = configz(&c);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["kxdp.dev"]["nodeName"], "n1");
        assert_eq!(
            v["kxdp.dev"]["conntrack"]["tcpEstablishedTimeout"],
            "24h0m0s"
        );
        assert_eq!(metrics_route("/configz", &m, &body).unwrap().1, body);
        assert_eq!(metrics_route("/proxyMode", &m, &body).unwrap().1, "kxdp");
        assert!(metrics_route("/metrics", &m, &body)
            .unwrap()
            .1
            .contains("kxdp_build_info"));
        assert!(metrics_route("/nope", &m, &body).is_none());
    }

    #[test]
    fn stale_seconds_from_status() {
        let m = Metrics::new();
        assert!(!m.encode().contains("kxdp_sync_stale_seconds"));
        let status = Arc::new(Mutex::new(crate::status::Status::default()));
        m.attach_status(status.clone());
        assert!(
            m.encode().contains("kxdp_sync_stale_seconds 0.0\n"),
            "{}",
            m.encode()
        );
        status.lock().unwrap().pending_since =
            Some(std::time::SystemTime::now() - std::time::Duration::from_secs(30));
        let text = m.encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("kxdp_sync_stale_seconds "))
            .unwrap();
        let v: f64 = line.split(' ').nth(1).unwrap().parse().unwrap();
        assert!((30.0..60.0).contains(&v), "{line}");
    }
}
