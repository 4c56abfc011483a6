//! The control loop: sources feed updates, the loop keeps a `Store` (the cluster as last seen),
//! rebuilds the dataplane tables with kube-proxy's pacing and publishes them to the workers
//! without a lock.
//!
//! - **Sources** (`sources::kube` for the API server, `sources::watch_files` for `--state`, or the
//!   caller through `ControlHandle::sender`) send `Update`s over a channel. They run on a small
//!   tokio runtime the loop owns; the loop itself is one plain thread.
//! - **Coalescing** as kube-proxy's `BoundedFrequencyRunner`: changes are batched so that at most
//!   one rebuild starts per `sync.minSyncPeriod` (0: at once), and a full rebuild runs at least
//!   every `sync.syncPeriod`. Nothing is published before every source has synced once (as
//!   kube-proxy waits for its informers).
//! - **Incremental work**: the `Store` records which Services a change touches (a Service, or an
//!   EndpointSlice naming it); a partial sync retranslates only those (`incremental::Builder`).
//!   Pods, Namespaces and NetworkPolicies recompile the policy tables only; changes to this node
//!   or to ServiceCIDRs rebuild everything.
//! - **Publication**: `Published` is an `ArcSwap<Snapshot>`. A worker `load`s it between batches
//!   (a few atomic operations, never a lock, never waiting on this thread) and keeps using what it
//!   loaded until its next batch, so no packet sees a half-built table. Old snapshots are dropped
//!   by this thread, not by a worker, once no worker holds them.
//! - **Bad input never blanks the dataplane**: an object that cannot be decoded or translated is
//!   skipped and reported (log, `kxdp_sync_problems_total`, `Status::events`); an unreadable
//!   `--state` or an unreachable API server leaves the last good snapshot published and says why.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, Cache, Guard};
use kxdp_dataplane::snapshot::Snapshot;

use crate::config::Config;
use crate::incremental::Builder;
use crate::metrics::Metrics;
use crate::model::{service_name_of, ClusterState, Object, ObjectKey};
use crate::translate::Problem;

/// The tables the workers read, swapped whole and without a lock.
pub struct Published {
    current: ArcSwap<Snapshot>,
}

impl Published {
    pub fn new(snapshot: Snapshot) -> Published {
        Published {
            current: ArcSwap::from_pointee(snapshot),
        }
    }

    /// The current snapshot, for one batch. Lock-free and wait-free in the common case; hold the
    /// guard for the batch and drop it before the next `load`.
    #[inline]
    pub fn load(&self) -> Guard<Arc<Snapshot>> {
        self.current.load()
    }

    /// The current snapshot as an owned `Arc` (one atomic increment more than `load`).
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// A per-worker cache: `cache.load()` costs one atomic load when nothing changed.
    pub fn cache(&self) -> Cache<&ArcSwap<Snapshot>, Arc<Snapshot>> {
        Cache::new(&self.current)
    }

    pub fn generation(&self) -> u64 {
        self.current.load().generation
    }

    /// Replaces the snapshot; returns the previous one.
    pub fn store(&self, snapshot: Arc<Snapshot>) -> Arc<Snapshot> {
        self.current.swap(snapshot)
    }
}

/// What a source tells the control loop.
#[derive(Debug)]
pub enum Update {
    /// An object was added or modified.
    Apply(Object),
    /// An object was deleted (`kind` as `Object::kind`).
    Delete { kind: &'static str, key: ObjectKey },
    /// Every object of a kind, after a (re)list: objects of that kind not listed are gone.
    /// `keep` names objects that were listed but could not be decoded: their last good version
    /// stays.
    Relisted {
        source: String,
        kind: &'static str,
        objects: Vec<Object>,
        keep: Vec<ObjectKey>,
    },
    /// A whole new state (the files source): replaces everything.
    ReplaceAll { source: String, state: ClusterState },
    /// An object that could not be decoded: skipped (its last good version stays), reported.
    Problem {
        kind: &'static str,
        key: ObjectKey,
        problem: Problem,
    },
    /// A source failed (API server unreachable, state unreadable); the last good tables stay.
    SourceError { source: String, message: String },
    /// A source is connected and synced again.
    SourceUp { source: String },
    /// Rebuild everything at the next opportunity.
    Resync,
    /// Stop the loop.
    Stop,
}

/// Where the cluster state comes from.
pub enum Source {
    /// `--state` files, reread when they change (checked every `poll`).
    Files { path: PathBuf, poll: Duration },
    /// The API server.
    Kube {
        config: Box<kube::Config>,
        options: crate::sources::kube::KubeOptions,
    },
    /// Updates sent by the caller through `ControlHandle::sender`; the loop syncs once the caller
    /// has sent a `ReplaceAll` or a `Relisted` for each of `required`.
    Manual { required: Vec<&'static str> },
}

/// Every kind kxdp reads, as `Object::kind` names them.
pub const KINDS: [&str; 7] = [
    "Node",
    "Namespace",
    "Pod",
    "Service",
    "EndpointSlice",
    "NetworkPolicy",
    "ServiceCIDR",
];

/// What the loop is doing, for `kxdp` status output and tests.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub generation: u64,
    /// Every source has synced once (before that nothing is published).
    pub ready: bool,
    pub syncs: u64,
    pub full_syncs: u64,
    pub last_sync: Option<SystemTime>,
    pub last_sync_duration: Duration,
    /// Problems of the published tables (translation) and of skipped objects (decoding).
    pub problems: Vec<Problem>,
    /// Sources that are failing, with the last error.
    pub source_errors: BTreeMap<String, String>,
    /// Recent events (problems, source errors and recoveries), newest last; at most 256.
    pub events: VecDeque<String>,
    /// What the health servers answer (ops: `health`), as of the last publication.
    pub health: crate::health::HealthView,
}

const MAX_EVENTS: usize = 256;

impl Status {
    fn event(&mut self, e: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }
}

/// What changed since the last sync.
#[derive(Debug, Default)]
pub struct Changes {
    /// Services to retranslate (changed, or one of their EndpointSlices changed).
    pub services: BTreeSet<ObjectKey>,
    /// Rebuild everything (this node, ServiceCIDRs).
    pub full: bool,
    /// Recompile the NetworkPolicy tables (Pods, Namespaces, NetworkPolicies).
    pub policy: bool,
    pub service_changes: u64,
    pub endpoint_changes: u64,
    /// Change times of the objects (for network_programming_duration_seconds); bounded.
    pub triggers: Vec<SystemTime>,
}

const MAX_TRIGGERS: usize = 4096;
/// The EndpointSlice controller's annotation: when the change that caused this slice happened.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.full && !self.policy
    }

    fn trigger(&mut self, t: SystemTime) {
        if self.triggers.len() < MAX_TRIGGERS {
            self.triggers.push(t);
        }
    }
}

/// The cluster as last seen, and what changed since the last sync.
pub struct Store {
    pub state: ClusterState,
    pub changes: Changes,
    node_name: String,
}

impl Store {
    pub fn new(node_name: &str) -> Store {
        Store {
            state: ClusterState::new(),
            changes: Changes::default(),
            node_name: node_name.to_string(),
        }
    }

    /// Inserts or replaces an object, recording what it touches. An object equal to the one held
    /// (a relist, a resync) changes nothing.
    pub fn apply(&mut self, obj: Object, now: SystemTime) {
        let key = obj.key();
        let c = &mut self.changes;
        match &obj {
            Object::Service(s) => {
                if self.state.services.get(&key) == Some(s) {
                    return;
                }
                c.services.insert(key.clone());
                c.service_changes += 1;
                c.trigger(now);
            }
            Object::EndpointSlice(s) => {
                let old = self.state.endpoint_slices.get(&key);
                if old == Some(s) {
                    return;
                }
                for svc in old
                    .and_then(service_name_of)
                    .into_iter()
                    .chain(service_name_of(s))
                {
                    c.services
                        .insert(ObjectKey::new(key.namespace.clone(), svc));
                }
                c.endpoint_changes += 1;
                c.trigger(trigger_time(s).unwrap_or(now));
            }
            Object::Node(n) => {
                if self.state.nodes.get(&key.name) == Some(n) {
                    return;
                }
                if key.name == self.node_name {
                    c.full = true;
                }
            }
            Object::Namespace(n) => {
                if self.state.namespaces.get(&key.name) == Some(n) {
                    return;
                }
                c.policy = true;
            }
            Object::Pod(p) => {
                if self.state.pods.get(&key) == Some(p) {
                    return;
                }
                c.policy = true;
            }
            Object::NetworkPolicy(p) => {
                if self.state.network_policies.get(&key) == Some(p) {
                    return;
                }
                c.policy = true;
            }
            Object::ServiceCidr(s) => {
                if self.state.service_cidrs.get(&key.name) == Some(s) {
                    return;
                }
                c.full = true;
            }
        }
        self.state.apply(obj);
    }

    /// Removes an object, recording what it touches.
    pub fn delete(&mut self, kind: &str, key: &ObjectKey, now: SystemTime) {
        let c = &mut self.changes;
        match kind {
            "Service" => {
                if self.state.services.contains_key(key) {
                    c.services.insert(key.clone());
                    c.service_changes += 1;
                    c.trigger(now);
                }
            }
            "EndpointSlice" => {
                if let Some(s) = self.state.endpoint_slices.get(key) {
                    if let Some(svc) = service_name_of(s) {
                        c.services
                            .insert(ObjectKey::new(key.namespace.clone(), svc.to_string()));
                    }
                    c.endpoint_changes += 1;
                    c.trigger(now);
                }
            }
            "Node" => {
                if key.name == self.node_name && self.state.nodes.contains_key(&key.name) {
                    c.full = true;
                }
            }
            "ServiceCIDR" => {
                if self.state_contains(kind, key) {
                    self.changes.full = true;
                }
            }
            _ => {
                if self.state_contains(kind, key) {
                    self.changes.policy = true;
                }
            }
        }
        self.state.delete(kind, key);
    }

    fn state_contains(&self, kind: &str, key: &ObjectKey) -> bool {
        let s = &self.state;
        match kind {
            "Node" => s.nodes.contains_key(&key.name),
            "Namespace" => s.namespaces.contains_key(&key.name),
            "Pod" => s.pods.contains_key(key),
            "Service" => s.services.contains_key(key),
            "EndpointSlice" => s.endpoint_slices.contains_key(key),
            "NetworkPolicy" => s.network_policies.contains_key(key),
            "ServiceCIDR" => s.service_cidrs.contains_key(&key.name),
            _ => false,
        }
    }

    fn keys_of(&self, kind: &str) -> Vec<ObjectKey> {
        let s = &self.state;
        match kind {
            "Node" => s.nodes.keys().map(ObjectKey::cluster).collect(),
            "Namespace" => s.namespaces.keys().map(ObjectKey::cluster).collect(),
            "Pod" => s.pods.keys().cloned().collect(),
            "Service" => s.services.keys().cloned().collect(),
            "EndpointSlice" => s.endpoint_slices.keys().cloned().collect(),
            "NetworkPolicy" => s.network_policies.keys().cloned().collect(),
            "ServiceCIDR" => s.service_cidrs.keys().map(ObjectKey::cluster).collect(),
            _ => Vec::new(),
        }
    }

    /// Replaces every object of `kind` by `objects` (a relist), keeping the objects named in
    /// `keep`. Only the objects that differ count as changes.
    pub fn replace_kind(
        &mut self,
        kind: &str,
        objects: Vec<Object>,
        keep: &[ObjectKey],
        now: SystemTime,
    ) {
        let listed: BTreeSet<ObjectKey> = objects
            .iter()
            .map(Object::key)
            .chain(keep.iter().cloned())
            .collect();
        for key in self.keys_of(kind) {
            if !listed.contains(&key) {
                self.delete(kind, &key, now);
            }
        }
        for o in objects {
            self.apply(o, now);
        }
    }

    /// Replaces everything (the files source).
    pub fn replace_all(&mut self, state: ClusterState, now: SystemTime) {
        let ClusterState {
            nodes,
            namespaces,
            pods,
            services,
            endpoint_slices,
            network_policies,
            service_cidrs,
        } = state;
        let b = |o| Box::new(o);
        self.replace_kind(
            "Node",
            nodes.into_values().map(|o| Object::Node(b(o))).collect(),
            &[],
            now,
        );
        self.replace_kind(
            "Namespace",
            namespaces
                .into_values()
                .map(|o| Object::Namespace(Box::new(o)))
                .collect(),
            &[],
            now,
        );
        self.replace_kind(
            "Pod",
            pods.into_values()
                .map(|o| Object::Pod(Box::new(o)))
                .collect(),
            &[],
            now,
        );
        self.replace_kind(
            "Service",
            services
                .into_values()
                .map(|o| Object::Service(Box::new(o)))
                .collect(),
            &[],
            now,
        );
        self.replace_kind(
            "EndpointSlice",
            endpoint_slices
                .into_values()
                .map(|o| Object::EndpointSlice(Box::new(o)))
                .collect(),
            &[],
            now,
        );
        self.replace_kind(
            "NetworkPolicy",
            network_policies
                .into_values()
                .map(|o| Object::NetworkPolicy(Box::new(o)))
                .collect(),
            &[],
            now,
        );
        self.replace_kind(
            "ServiceCIDR",
            service_cidrs
                .into_values()
                .map(|o| Object::ServiceCidr(Box::new(o)))
                .collect(),
            &[],
            now,
        );
    }
}

/// `endpoints.kubernetes.io/last-change-trigger-time` of an EndpointSlice (RFC 3339).
fn trigger_time(s: &k8s_openapi::api::discovery::v1::EndpointSlice) -> Option<SystemTime> {
    let v = s
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_TRIGGER_TIME)?;
    humantime::parse_rfc3339_weak(v.trim_end_matches('Z'))
        .ok()
        .or_else(|| humantime::parse_rfc3339(v).ok())
}

/// The running control loop: its thread, its runtime (sources), its status.
pub struct ControlHandle {
    tx: Sender<Update>,
    thread: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    status: Arc<Mutex<Status>>,
    metrics: Arc<Metrics>,
}

impl ControlHandle {
    /// A sender of updates into the loop (tests, `Source::Manual`).
    pub fn sender(&self) -> Sender<Update> {
        self.tx.clone()
    }

    pub fn status(&self) -> Status {
        self.status.lock().unwrap().clone()
    }

    /// The shared status, for servers that outlive a borrow of the handle (ops: admin, health).
    pub fn status_cell(&self) -> Arc<Mutex<Status>> {
        self.status.clone()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The runtime the sources run on (to serve metrics or health next to them).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("runtime lives until shutdown")
            .handle()
    }

    /// Stops the sources and the loop and waits for them.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Update::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl Drop for ControlHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The control loop (see the module docs).
pub struct ControlLoop;

impl ControlLoop {
    /// Starts the sources and the loop. The returned `Published` starts with the empty snapshot
    /// (generation 0) and is replaced once every source has synced.
    pub fn spawn(
        config: Config,
        source: Source,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<(Arc<Published>, ControlHandle)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kxdp-sources")
            .enable_all()
            .build()?;
        let (tx, rx) = mpsc::channel();
        let published = Arc::new(Published::new(Snapshot::empty()));
        let status = Arc::new(Mutex::new(Status::default()));

        let required: Vec<String> = match source {
            Source::Files { path, poll } => {
                crate::sources::watch_files::spawn(runtime.handle(), path, poll, tx.clone());
                vec![crate::sources::watch_files::SOURCE.to_string()]
            }
            Source::Kube {
                config: kc,
                options,
            } => {
                let specs = crate::sources::kube::specs(&config.node_name);
                let names = specs.iter().map(|s| s.source.to_string()).collect();
                crate::sources::kube::spawn(runtime.handle(), *kc, options, specs, tx.clone());
                names
            }
            Source::Manual { required } => required.iter().map(|s| s.to_string()).collect(),
        };

        let mut lp = Loop {
            builder: Builder::new(config.clone()),
            store: Store::new(&config.node_name),
            config,
            published: published.clone(),
            status: status.clone(),
            metrics: metrics.clone(),
            required,
            synced: BTreeSet::new(),
            retired: Vec::new(),
            object_problems: BTreeMap::new(),
            reported: BTreeSet::new(),
            generation: 0,
        };
        let thread = std::thread::Builder::new()
            .name("kxdp-control".into())
            .spawn(move || lp.run(rx))?;
        Ok((
            published,
            ControlHandle {
                tx,
                thread: Some(thread),
                runtime: Some(runtime),
                status,
                metrics,
            },
        ))
    }
}

struct Loop {
    config: Config,
    builder: Builder,
    store: Store,
    published: Arc<Published>,
    status: Arc<Mutex<Status>>,
    metrics: Arc<Metrics>,
    /// Sources that must have synced before the first publication.
    required: Vec<String>,
    synced: BTreeSet<String>,
    /// Snapshots replaced but perhaps still held by a worker: dropped here once they are not.
    retired: Vec<Arc<Snapshot>>,
    /// Objects skipped because they could not be decoded.
    object_problems: BTreeMap<(&'static str, ObjectKey), Problem>,
    /// Problems already logged (each is logged once, when it appears).
    reported: BTreeSet<String>,
    generation: u64,
}

impl Loop {
    fn ready(&self) -> bool {
        self.required.iter().all(|r| self.synced.contains(r))
    }

    fn run(&mut self, rx: Receiver<Update>) {
        let min = self.config.sync.min_sync_period.0;
        let period = self.config.sync.sync_period.0.max(Duration::from_millis(1));
        let mut last_sync: Option<Instant> = None;
        let mut last_full = Instant::now();
        let mut first = true;
        loop {
            let now = Instant::now();
            let ready = self.ready();
            let pending = first || !self.store.changes.is_empty();
            let full_due = last_full + period;
            let due = if !ready {
                None
            } else if pending {
                Some(last_sync.map_or(now, |t| (t + min).max(now)).min(full_due))
            } else {
                Some(full_due)
            };
            let wait = due
                .map(|d| d.saturating_duration_since(now))
                .unwrap_or(Duration::from_secs(1));
            if !(ready && wait.is_zero()) {
                match rx.recv_timeout(wait) {
                    Ok(u) => {
                        if !self.handle(u) {
                            break;
                        }
                        // Take everything already queued before deciding.
                        let mut stop = false;
                        while let Ok(u) = rx.try_recv() {
                            if !self.handle(u) {
                                stop = true;
                                break;
                            }
                        }
                        if stop {
                            break;
                        }
                        self.metrics.sync_queued();
                        self.metrics
                            .service_changes_pending
                            .set(self.store.changes.service_changes as i64);
                        self.metrics
                            .endpoint_changes_pending
                            .set(self.store.changes.endpoint_changes as i64);
                        continue;
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            if !self.ready() {
                self.drop_retired();
                continue;
            }
            let now = Instant::now();
            let full = first || now >= full_due || self.store.changes.full;
            if !full && self.store.changes.is_empty() {
                continue;
            }
            self.sync(full);
            first = false;
            last_sync = Some(now);
            if full {
                last_full = now;
            }
        }
        self.retired.clear();
    }

    /// Applies one update; false on `Stop`.
    fn handle(&mut self, u: Update) -> bool {
        let now = SystemTime::now();
        match u {
            Update::Apply(o) => {
                self.clear_object_problem(o.kind(), &o.key());
                self.store.apply(o, now);
            }
            Update::Delete { kind, key } => {
                self.clear_object_problem(kind, &key);
                self.store.delete(kind, &key, now);
            }
            Update::Relisted {
                source,
                kind,
                objects,
                keep,
            } => {
                let keep_set: BTreeSet<&ObjectKey> = keep.iter().collect();
                self.object_problems
                    .retain(|(k, key), _| *k != kind || keep_set.contains(key));
                self.store.replace_kind(kind, objects, &keep, now);
                self.source_up(&source);
            }
            Update::ReplaceAll { source, state } => {
                self.store.replace_all(state, now);
                self.source_up(&source);
            }
            Update::Problem { kind, key, problem } => {
                self.metrics.problems_total.inc();
                tracing::warn!(problem = %problem, "object skipped; its last good version (if any) stays");
                self.event(format!("skipped: {problem}"));
                self.object_problems.insert((kind, key), problem);
                self.publish_status_problems();
            }
            Update::SourceError { source, message } => {
                self.metrics.source_error(&source);
                let mut st = self.status.lock().unwrap();
                if st.source_errors.get(&source) != Some(&message) {
                    tracing::warn!(%source, error = %message, "source failing; forwarding continues on the last good tables");
                    st.event(format!("{source}: {message}"));
                }
                st.source_errors.insert(source, message);
            }
            Update::SourceUp { source } => self.source_up(&source),
            Update::Resync => self.store.changes.full = true,
            Update::Stop => return false,
        }
        true
    }

    fn source_up(&mut self, source: &str) {
        self.metrics.source_up(source);
        self.synced.insert(source.to_string());
        let mut st = self.status.lock().unwrap();
        if st.source_errors.remove(source).is_some() {
            tracing::info!(%source, "source recovered");
            st.event(format!("{source}: recovered"));
        }
        st.ready = self.required.iter().all(|r| self.synced.contains(r));
    }

    fn clear_object_problem(&mut self, kind: &'static str, key: &ObjectKey) {
        if self.object_problems.remove(&(kind, key.clone())).is_some() {
            self.publish_status_problems();
        }
    }

    fn event(&self, e: String) {
        self.status.lock().unwrap().event(e);
    }

    fn publish_status_problems(&self) {
        let problems = self.builder.problems();
        let mut st = self.status.lock().unwrap();
        st.problems = problems
            .into_iter()
            .chain(self.object_problems.values().cloned())
            .collect();
        self.metrics.problems.set(st.problems.len() as i64);
    }

    fn drop_retired(&mut self) {
        // A worker that still holds an old snapshot keeps its count above 1; the last drop of a
        // big snapshot happens here, never on a worker.
        self.retired.retain(|s| Arc::strong_count(s) > 1);
    }

    fn sync(&mut self, full: bool) {
        let t0 = Instant::now();
        let changes = std::mem::take(&mut self.store.changes);
        let full = full || changes.full;
        let translation = if full {
            self.builder.full(&self.store.state)
        } else {
            if changes.policy {
                self.builder.update_policy(&self.store.state);
            }
            self.builder.update(&self.store.state, &changes.services)
        };
        let mut snap = translation;
        snap.generation = self.generation + 1;
        if let Err(e) = snap.validate() {
            // A translation bug, not bad input: keep the last good tables.
            tracing::error!(error = %e, "built tables are inconsistent; keeping the last good ones");
            self.event(format!("inconsistent tables not published: {e}"));
            self.metrics.problems_total.inc();
            self.store.changes.full = true;
            return;
        }
        self.generation += 1;
        let old = self.published.store(Arc::new(snap));
        self.retired.push(old);
        self.drop_retired();
        let elapsed = t0.elapsed();
        let wall = SystemTime::now();

        self.metrics.sync_duration.observe(elapsed.as_secs_f64());
        if full {
            self.metrics
                .sync_full_duration
                .observe(elapsed.as_secs_f64());
        } else {
            self.metrics
                .sync_partial_duration
                .observe(elapsed.as_secs_f64());
        }
        self.metrics.sync_last_timestamp.set(
            wall.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        for t in &changes.triggers {
            if let Ok(d) = wall.duration_since(*t) {
                self.metrics
                    .network_programming_duration
                    .observe(d.as_secs_f64());
            }
        }
        self.metrics
            .service_changes_total
            .inc_by(changes.service_changes);
        self.metrics
            .endpoint_changes_total
            .inc_by(changes.endpoint_changes);
        self.metrics.service_changes_pending.set(0);
        self.metrics.endpoint_changes_pending.set(0);
        let (nl_int, nl_ext) = self.builder.no_local_endpoints();
        self.metrics.set_no_local_endpoints(nl_int, nl_ext);
        self.metrics.generation.set(self.generation as i64);

        // Problems: each logged (and counted) when it appears.
        let problems = self.builder.problems();
        let now_set: BTreeSet<String> = problems.iter().map(|p| p.to_string()).collect();
        for p in &problems {
            let s = p.to_string();
            if !self.reported.contains(&s) {
                tracing::warn!(problem = %s, "skipped in translation");
                self.metrics.problems_total.inc();
                self.event(format!("translation: {s}"));
            }
        }
        self.reported = now_set;

        {
            let mut st = self.status.lock().unwrap();
            st.generation = self.generation;
            st.syncs += 1;
            if full {
                st.full_syncs += 1;
            }
            st.last_sync = Some(wall);
            st.last_sync_duration = elapsed;
            st.health =
                crate::health::HealthView::from_state(&self.store.state, &self.config.node_name);
        }
        self.publish_status_problems();
        tracing::debug!(
            generation = self.generation,
            full,
            services = changes.services.len(),
            ms = elapsed.as_secs_f64() * 1e3,
            "published"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::files::load_str;
    use kxdp_dataplane::snapshot::{proto, FrontendKey};
    use kxdp_packet::Addr;
    use std::path::Path;

    fn config(sync: &str) -> Config {
        Config::from_yaml_str(
            &format!("apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nnodeIPs: [192.168.0.2]\nclusterCIDRs: [10.0.0.0/8]\nsync: {sync}\n"),
            Path::new("config.yaml"),
        )
        .unwrap()
    }

    fn svc_yaml(name: &str, ip: &str, port: u16) -> String {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\nspec:\n  clusterIP: {ip}\n  ports: [{{port: {port}}}]\n")
    }

    fn state(yaml: &str) -> ClusterState {
        let mut st = ClusterState::new();
        load_str(yaml, false, Path::new("s.yaml"), &mut st).unwrap();
        st
    }

    fn object(yaml: &str) -> Object {
        let st = state(yaml);
        Object::Service(Box::new(st.services.into_values().next().unwrap()))
    }

    fn has(p: &Published, ip: &str, port: u16) -> bool {
        p.load()
            .frontend(&FrontendKey {
                addr: Addr::from_ip(ip.parse().unwrap()),
                port,
                proto: proto::TCP,
            })
            .is_some()
    }

    fn wait(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn nothing_published_before_sources_sync() {
        let (p, h) = ControlLoop::spawn(
            config("{minSyncPeriod: 0s}"),
            Source::Manual {
                required: vec!["a", "b"],
            },
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let tx = h.sender();
        tx.send(Update::ReplaceAll {
            source: "a".into(),
            state: state(&svc_yaml("web", "172.30.0.1", 80)),
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(p.generation(), 0);
        assert!(!h.status().ready);
        tx.send(Update::SourceUp { source: "b".into() }).unwrap();
        wait("first publication", || has(&p, "172.30.0.1", 80));
        assert_eq!(p.generation(), 1);
        h.shutdown();
    }

    #[test]
    fn changes_are_coalesced_by_min_sync_period() {
        let (p, h) = ControlLoop::spawn(
            config("{minSyncPeriod: 400ms, syncPeriod: 1h}"),
            Source::Manual {
                required: vec!["m"],
            },
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let tx = h.sender();
        tx.send(Update::ReplaceAll {
            source: "m".into(),
            state: state(&svc_yaml("web", "172.30.0.1", 80)),
        })
        .unwrap();
        wait("first publication", || p.generation() == 1);
        let t0 = Instant::now();
        for i in 0..20u16 {
            tx.send(Update::Apply(object(&svc_yaml(
                "web",
                "172.30.0.1",
                100 + i,
            ))))
            .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        wait("last change", || has(&p, "172.30.0.1", 119));
        // One sync for the burst, and not before minSyncPeriod after the first one.
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
        let st = h.status();
        assert!(st.syncs <= 3, "{} syncs for one burst", st.syncs);
        assert_eq!(st.full_syncs, 1, "one full build, then partial updates");
        let text = h.metrics().encode();
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_service_changes_total 21"),
            "{text}"
        );
        h.shutdown();
    }

    #[test]
    fn full_resync_every_sync_period() {
        let (p, h) = ControlLoop::spawn(
            config("{minSyncPeriod: 0s, syncPeriod: 100ms}"),
            Source::Manual {
                required: vec!["m"],
            },
            Arc::new(Metrics::new()),
        )
        .unwrap();
        h.sender()
            .send(Update::ReplaceAll {
                source: "m".into(),
                state: state(&svc_yaml("web", "172.30.0.1", 80)),
            })
            .unwrap();
        wait("resyncs", || h.status().full_syncs >= 3);
        assert!(has(&p, "172.30.0.1", 80));
        h.shutdown();
    }

    #[test]
    fn watched_files_keep_last_good_state() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.yaml");
        std::fs::write(&f, svc_yaml("web", "172.30.0.1", 80)).unwrap();
        let (p, h) = ControlLoop::spawn(
            config("{minSyncPeriod: 0s}"),
            Source::Files {
                path: dir.path().to_path_buf(),
                poll: Duration::from_millis(20),
            },
            Arc::new(Metrics::new()),
        )
        .unwrap();
        wait("initial", || has(&p, "172.30.0.1", 80));
        // An edit (a second file too).
        std::fs::write(&f, svc_yaml("web", "172.30.0.1", 81)).unwrap();
        std::fs::write(
            dir.path().join("more.yaml"),
            svc_yaml("db", "172.30.0.2", 5432),
        )
        .unwrap();
        wait("edited", || {
            has(&p, "172.30.0.1", 81) && has(&p, "172.30.0.2", 5432)
        });
        let gen = p.generation();
        // Malformed: the last good tables stay, the error names the file and field.
        std::fs::write(
            &f,
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec: {ports: [{port: eighty}]}\n",
        )
        .unwrap();
        wait("error reported", || {
            h.status()
                .source_errors
                .get("files")
                .is_some_and(|e| e.contains("state.yaml") && e.contains("spec.ports[0].port"))
        });
        assert_eq!(p.generation(), gen);
        assert!(has(&p, "172.30.0.1", 81));
        // Fixed.
        std::fs::write(&f, svc_yaml("web", "172.30.0.1", 82)).unwrap();
        wait("fixed", || has(&p, "172.30.0.1", 82));
        wait("recovered", || h.status().source_errors.is_empty());
        h.shutdown();
    }
}
