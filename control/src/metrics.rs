//! The control plane's metrics, in one prometheus-client `Registry` (the ops issue's `/metrics`
//! endpoint encodes it with `Metrics::encode`).
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
//!
//! kxdp's own, prefixed `kxdp_`:
//!
//! | metric | type | meaning |
//! | --- | --- | --- |
//! | `kxdp_sync_problems_total` | counter | objects (or parts) skipped because they could not be translated or decoded |
//! | `kxdp_sync_problems` | gauge | problems in the currently published tables |
//! | `kxdp_sync_snapshot_generation` | gauge | generation of the published snapshot |
//! | `kxdp_sync_source_errors_total{source}` | counter | source failures (API server unreachable, unreadable state files); the last good tables stay |
//! | `kxdp_sync_source_up{source}` | gauge | 1 while the source is connected and synced |
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
//! | `kxdp_conntrack_entries` | gauge | live conntrack entries (connections and affinity records) |
//! | `kxdp_conntrack_max_entries` | gauge | the configured maximum |
//! | `kxdp_conntrack_early_drops_total` | counter | unassured entries dropped to make room |
//! | `kxdp_conntrack_created_total{worker}` | counter | connections created |
//! | `kxdp_conntrack_expired_total{worker}` | counter | entries expired by the worker's scan |

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use kxdp_dataplane::conntrack::Conntrack;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficPolicyLabel {
    /// `internal` or `external`.
    pub traffic_policy: String,
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

/// The dataplane state a scrape reads.
struct DataplaneSource {
    stats: Arc<DataplaneStats>,
    ct: Arc<Conntrack>,
    /// Per worker: busy nanoseconds and when, at the previous scrape.
    prev: Mutex<Vec<(u64, Instant)>>,
}

/// Encodes the dataplane metrics at scrape time (nothing when no dataplane is attached).
#[derive(Clone, Default)]
struct DataplaneCollector(Arc<OnceLock<DataplaneSource>>);

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
        Ok(())
    }
}

/// Every control-plane metric. Cheap to clone handles (the metrics are `Arc`s inside).
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub sync_full_duration: Histogram,
    pub sync_partial_duration: Histogram,
    pub sync_last_timestamp: Gauge<f64, AtomicU64>,
    pub network_programming_duration: Histogram,
    pub endpoint_changes_total: Counter,
    pub endpoint_changes_pending: Gauge,
    pub service_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub no_local_endpoints: Family<TrafficPolicyLabel, Gauge>,
    pub problems_total: Counter,
    pub problems: Gauge,
    pub generation: Gauge,
    pub source_errors_total: Family<SourceLabel, Counter>,
    pub source_up: Family<SourceLabel, Gauge>,
    pub proxy_healthz_total: Family<CodeLabel, Counter>,
    pub proxy_livez_total: Family<CodeLabel, Counter>,
    dataplane: DataplaneCollector,
}

/// kube-proxy's sync duration buckets: `ExponentialBuckets(0.001, 2, 15)`.
fn sync_buckets() -> impl Iterator<Item = f64> {
    (0..15).map(|i| 0.001 * 2f64.powi(i))
}

/// kube-proxy's network programming buckets: 0.25 s, 0.5 s, 1..59 s by 1 s, 60..300 s by 5 s,
/// then 360..1800 s by 60 s... (abridged to the same shape).
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.001, 0.01, 0.1, 0.25, 0.5];
    b.extend((1..60).map(f64::from));
    b.extend((0..48).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((1..=25).map(|i| 300.0 + 60.0 * f64::from(i)));
    b
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
            sync_duration: Histogram::new(sync_buckets()),
            sync_full_duration: Histogram::new(sync_buckets()),
            sync_partial_duration: Histogram::new(sync_buckets()),
            sync_last_timestamp: Gauge::default(),
            network_programming_duration: Histogram::new(programming_buckets()),
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
        };
        registry.register_collector(Box::new(m.dataplane.clone()));
        {
            let kp = registry.sub_registry_with_prefix("kubeproxy");
            kp.register(
                "sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds (one table build and publication)",
                m.sync_duration.clone(),
            );
            kp.register(
                "sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
                m.sync_full_duration.clone(),
            );
            kp.register(
                "sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
                m.sync_partial_duration.clone(),
            );
            kp.register(
                "sync_proxy_rules_last_timestamp_seconds",
                "The last time the tables were successfully published",
                m.sync_last_timestamp.clone(),
            );
            kp.register(
                "network_programming_duration_seconds",
                "In Cluster Network Programming Latency in seconds",
                m.network_programming_duration.clone(),
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
        for (p, v) in [("internal", internal), ("external", external)] {
            self.no_local_endpoints
                .get_or_create(&TrafficPolicyLabel {
                    traffic_policy: p.into(),
                })
                .set(v);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_names() {
        let m = Metrics::new();
        m.service_changes_total.inc();
        m.set_no_local_endpoints(1, 2);
        m.sync_duration.observe(0.01);
        m.problems_total.inc();
        let text = m.encode();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds ",
            "kubeproxy_network_programming_duration_seconds_count",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 0",
            "kubeproxy_sync_proxy_rules_service_changes_total 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 2",
            "kxdp_sync_problems_total 1",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
