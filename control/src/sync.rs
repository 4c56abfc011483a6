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
//!   EndpointSlice naming it); a partial sync retranslates only those (`translate::Builder`).
//!   Pods, Namespaces and NetworkPolicies recompile the policy tables only; changes to this node
//!   or to ServiceCIDRs rebuild everything.
//! - **Publication**: `Published` is an `ArcSwap<Snapshot>`. A worker `load`s it between batches
//!   (a few atomic operations, never a lock, never waiting on this thread) and keeps using what it
//!   loaded until its next batch, so no packet sees a half-built table. Old snapshots are dropped
//!   by this thread, not by a worker, once no worker holds them.
//! - **Bad input never blanks the dataplane**: an object that cannot be decoded or translated is
//!   skipped and reported (log, `kxdp_sync_problems_total`, `Status::events`); an unreadable
//!   `--state` or an unreachable API server leaves the last good snapshot published and says why.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::{ArcSwap, Cache, Guard};
use kxdp_dataplane::snapshot::Snapshot;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::{Kind, ObjectKey};
use crate::problem::Problem;
use crate::sources::event::Update;
use crate::status::{HealthView, Status};
use crate::store::Store;
use crate::translate::Builder;

/// The tables the workers read, swapped whole and without a lock, and the subscribers told of
/// each publication (stale-UDP flush, XDP map refresh) instead of polling the generation.
pub struct Published {
    current: ArcSwap<Snapshot>,
    /// The generation last published, for blocking subscribers.
    published_gen: Mutex<u64>,
    changed: Condvar,
    /// The same, for async subscribers.
    notify: tokio::sync::watch::Sender<u64>,
}

impl Published {
    pub fn new(snapshot: Snapshot) -> Published {
        let gen = snapshot.generation;
        Published {
            current: ArcSwap::from_pointee(snapshot),
            published_gen: Mutex::new(gen),
            changed: Condvar::new(),
            notify: tokio::sync::watch::Sender::new(gen),
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

    /// Replaces the snapshot and tells the subscribers; returns the previous one.
    pub fn store(&self, snapshot: Arc<Snapshot>) -> Arc<Snapshot> {
        let gen = snapshot.generation;
        let old = self.current.swap(snapshot);
        *self.published_gen.lock().unwrap() = gen;
        self.changed.notify_all();
        self.notify.send_replace(gen);
        old
    }

    /// For async subscribers: `rx.changed().await` returns at each publication (several
    /// publications while the subscriber is busy are seen as one); `*rx.borrow_and_update()` is
    /// the generation, `load_full()` the tables.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// For subscribers on a plain thread: waits until a generation other than `seen` is
    /// published, or `timeout` passes; returns the generation published now.
    pub fn wait_newer(&self, seen: u64, timeout: Duration) -> u64 {
        let gen = self.published_gen.lock().unwrap();
        let (gen, _) = self
            .changed
            .wait_timeout_while(gen, timeout, |g| *g == seen)
            .unwrap();
        *gen
    }
}

/// Where the cluster state comes from.
pub enum Source {
    /// `--state` files, reread when they change (checked every `poll`); `preloaded`, when
    /// given, is the first state (read once by the caller, not read again if unchanged).
    Files {
        path: PathBuf,
        poll: Duration,
        preloaded: Option<Box<crate::sources::watch_files::Preloaded>>,
    },
    /// The API server.
    Kube {
        config: Box<kube::Config>,
        options: crate::sources::kube::KubeOptions,
    },
    /// Updates sent by the caller through `ControlHandle::sender`; the loop syncs once the caller
    /// has sent a `ReplaceAll` or a `Relisted` for each of `required`.
    Manual { required: Vec<&'static str> },
}

/// The running control loop: its thread, its runtime (sources), its status.
pub struct ControlHandle {
    tx: Sender<Update>,
    thread: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    status: Arc<Mutex<Status>>,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
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
        // The flag ends a full rebuild in progress; the message wakes a sleeping loop.
        self.stopping.store(true, Ordering::Relaxed);
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
        Self::spawn_inner(config, source, metrics, TestSeam::default())
    }

    /// `spawn`, with what tests change in the loop (`TestSeam`: nothing outside tests).
    fn spawn_inner(
        config: Config,
        source: Source,
        metrics: Arc<Metrics>,
        seam: TestSeam,
    ) -> std::io::Result<(Arc<Published>, ControlHandle)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kxdp-sources")
            .enable_all()
            .build()?;
        let (tx, rx) = mpsc::channel();
        let published = Arc::new(Published::new(Snapshot::empty()));
        let status = Arc::new(Mutex::new(Status::default()));
        metrics.attach_status(status.clone());
        let stopping = Arc::new(AtomicBool::new(false));

        let required: Vec<String> = match source {
            Source::Files {
                path,
                poll,
                preloaded,
            } => {
                crate::sources::watch_files::spawn(
                    runtime.handle(),
                    path,
                    poll,
                    preloaded.map(|p| *p),
                    tx.clone(),
                );
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
            pending_since: None,
            stopping: stopping.clone(),
            seam,
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
                stopping,
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
    object_problems: BTreeMap<(Kind, ObjectKey), Problem>,
    /// Problems already logged (each is logged once, when it appears).
    reported: BTreeSet<String>,
    generation: u64,
    /// The oldest unpublished change (mirrored in `Status::pending_since`).
    pending_since: Option<SystemTime>,
    /// Set by `ControlHandle::stop`: a full rebuild in progress gives up.
    stopping: Arc<AtomicBool>,
    seam: TestSeam,
}

/// What the loop's own tests change in it; empty (and every hook a no-op) outside them, so no
/// test knob is in the product's loop.
#[derive(Clone, Copy, Debug, Default)]
struct TestSeam {
    /// Every full rebuild after the first takes at least this long (tests of long rebuilds).
    #[cfg(test)]
    slow_full: Duration,
}

impl TestSeam {
    /// Before a full rebuild that started at `t0`: waits out `slow_full`, serving stop
    /// requests; false when one came.
    #[cfg(test)]
    fn delay_full(&self, t0: Instant, stop: &dyn Fn() -> bool) -> bool {
        while t0.elapsed() < self.slow_full {
            if stop() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    #[cfg(not(test))]
    #[inline(always)]
    fn delay_full(&self, _: Instant, _: &dyn Fn() -> bool) -> bool {
        true
    }
}

/// What draining the queue ended with.
enum Drained {
    Open,
    Stop,
}

impl Loop {
    fn ready(&self) -> bool {
        self.required.iter().all(|r| self.synced.contains(r))
    }

    /// Serves updates and rebuilds, forever until `Stop`. Every turn first takes everything
    /// queued (so a change or a stop request waits for at most one rebuild, whatever its length),
    /// then sleeps until the next rebuild is due or an update arrives. The next full rebuild is
    /// due `syncPeriod` after the previous one *ended*: a rebuild longer than the period cannot
    /// starve the queue.
    fn run(&mut self, rx: Receiver<Update>) {
        let min = self.config.sync.min_sync_period.0;
        let period = self.config.sync.sync_period.0.max(Duration::from_millis(1));
        let mut last_sync: Option<Instant> = None;
        let mut last_full = Instant::now();
        let mut first = true;
        loop {
            // Everything already queued, before deciding anything.
            match self.drain(&rx) {
                Drained::Stop => break,
                Drained::Open => {}
            }
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
            if !wait.is_zero() {
                match rx.recv_timeout(wait) {
                    Ok(u) => {
                        if !self.handle(u) {
                            break;
                        }
                        self.note_pending();
                        self.metrics.sync_queued();
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
            let started = Instant::now();
            let full = first || started >= full_due || self.store.changes.full;
            if !full && self.store.changes.is_empty() {
                continue;
            }
            if !self.sync(full) {
                break;
            }
            first = false;
            last_sync = Some(started);
            if full {
                last_full = Instant::now();
            }
        }
        self.retired.clear();
    }

    /// Applies every update already queued; `Stop` when the loop must end.
    fn drain(&mut self, rx: &Receiver<Update>) -> Drained {
        let mut any = false;
        loop {
            match rx.try_recv() {
                Ok(u) => {
                    any = true;
                    if !self.handle(u) {
                        return Drained::Stop;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Drained::Stop,
            }
        }
        if any {
            self.note_pending();
        }
        Drained::Open
    }

    /// The pending-change metrics and the time the oldest unpublished change arrived.
    fn note_pending(&mut self) {
        let c = &self.store.changes;
        self.metrics
            .service_changes_pending
            .set(c.service_changes as i64);
        self.metrics
            .endpoint_changes_pending
            .set(c.endpoint_changes as i64);
        if !c.is_empty() && self.pending_since.is_none() {
            let now = SystemTime::now();
            self.pending_since = Some(now);
            self.status.lock().unwrap().pending_since = Some(now);
        }
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
            Update::Inspect(q) => (q.0)(&self.store.state),
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

    fn clear_object_problem(&mut self, kind: Kind, key: &ObjectKey) {
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

    /// One rebuild and publication; false when a stop request ended it.
    fn sync(&mut self, full: bool) -> bool {
        let t0 = Instant::now();
        let mut changes = std::mem::take(&mut self.store.changes);
        changes.full |= full;
        let full = changes.full;
        self.status.lock().unwrap().building_since = Some(SystemTime::now());
        let stopping = self.stopping.clone();
        let stop = move || stopping.load(Ordering::Relaxed);
        if full && self.generation > 0 && !self.seam.delay_full(t0, &stop) {
            return false;
        }
        let Some(mut snap) = self.builder.apply(&self.store.state, &changes, &stop) else {
            return false;
        };
        snap.generation = self.generation + 1;
        let valid = if full {
            snap.validate()
        } else {
            self.builder.validate_services(&changes.services)
        };
        self.status.lock().unwrap().building_since = None;
        if let Err(e) = valid {
            // A translation bug, not bad input: keep the last good tables.
            tracing::error!(error = %e, "built tables are inconsistent; keeping the last good ones");
            self.event(format!("inconsistent tables not published: {e}"));
            self.metrics.problems_total.inc();
            self.store.changes.full = true;
            return true;
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
            st.pending_since = None;
            st.health = if full {
                HealthView::from_state(&self.store.state, &self.config.node_name)
            } else {
                st.health
                    .updated(&self.store.state, &self.config.node_name, &changes.services)
            };
        }
        self.publish_status_problems();
        self.pending_since = None;
        tracing::debug!(
            generation = self.generation,
            full,
            services = changes.services.len(),
            ms = elapsed.as_secs_f64() * 1e3,
            "published"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterState, Object};
    use crate::sources::files::load_str;
    use crate::store::Changes;
    use kxdp_dataplane::snapshot::FrontendKey;
    use kxdp_packet::Addr;
    use kxdp_packet::IpProto;
    use std::path::Path;

    /// A config whose full rebuilds are due every `period`: below the 1 s the config file
    /// accepts, so that the loop's pacing can be tested quickly.
    fn fast_config(period: Duration) -> Config {
        let mut c = config("{minSyncPeriod: 0s, syncPeriod: 1h}");
        c.sync.sync_period = crate::config::GoDuration(period);
        c
    }

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

    /// The first `replace_all` takes the state whole: the same store and the same changes as
    /// each kind's first list; later ones are diffed as before.
    #[test]
    fn first_replace_all_takes_the_state_whole() {
        let yaml = format!(
            "{}{}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: a-1, namespace: ns, labels: {{kubernetes.io/service-name: a}}}}\naddressType: IPv4\nendpoints: [{{addresses: [10.0.0.1]}}]\n",
            svc_yaml("a", "172.30.0.1", 80),
            svc_yaml("b", "172.30.0.2", 80)
        );
        let now = SystemTime::now();
        let mut whole = Store::new("node-a");
        whole.replace_all(state(&yaml), now);
        let mut listed = Store::new("node-a");
        let mut st = state(&yaml);
        for kind in Kind::ALL {
            listed.replace_kind(kind, st.take_kind(kind), &[], now);
        }
        let summary = |c: &Changes| {
            (
                c.full,
                c.policy,
                c.services.len(),
                c.service_changes,
                c.endpoint_changes,
                c.triggers.len(),
            )
        };
        assert_eq!(summary(&whole.changes), summary(&listed.changes));
        assert_eq!(summary(&whole.changes), (true, false, 0, 2, 1, 3));
        assert_eq!(whole.state.len(), 3);
        let a = ObjectKey::new("ns", "a");
        assert_eq!(whole.state.slices_of(&a).count(), 1);
        whole.changes = Changes::default();
        whole.replace_all(state(&svc_yaml("a", "172.30.0.1", 81)), now);
        assert_eq!(whole.state.len(), 1);
        assert!(!whole.changes.full && whole.changes.services.contains(&a));
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
                proto: IpProto::TCP,
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
            fast_config(Duration::from_millis(100)),
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

    /// Runs `f` on another thread; fails if it takes longer than `limit` (a hung loop).
    fn within(limit: Duration, what: &str, f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"));
    }

    #[test]
    fn changes_are_served_while_full_rebuilds_outlast_the_sync_period() {
        // Every full rebuild takes 300 ms and one is due every 100 ms. The loop used to start the
        // next one as soon as the last ended and never read its queue again.
        let (p, h) = ControlLoop::spawn_inner(
            fast_config(Duration::from_millis(100)),
            Source::Manual {
                required: vec!["m"],
            },
            Arc::new(Metrics::new()),
            TestSeam {
                slow_full: Duration::from_millis(300),
            },
        )
        .unwrap();
        let tx = h.sender();
        tx.send(Update::ReplaceAll {
            source: "m".into(),
            state: state(&svc_yaml("web", "172.30.0.1", 80)),
        })
        .unwrap();
        wait("first publication", || has(&p, "172.30.0.1", 80));
        // Let full rebuilds run back to back for a while.
        wait("full rebuilds", || h.status().full_syncs >= 3);
        for port in [81, 82, 83] {
            tx.send(Update::Apply(object(&svc_yaml("web", "172.30.0.1", port))))
                .unwrap();
            wait("change published", || has(&p, "172.30.0.1", port));
        }
        let st = h.status();
        assert!(
            st.syncs > st.full_syncs,
            "changes go out in partial syncs between the full ones: {} syncs, {} full",
            st.syncs,
            st.full_syncs
        );
        within(Duration::from_secs(5), "shutdown", move || h.shutdown());
    }

    #[test]
    fn a_long_rebuild_makes_health_fail_and_stop_interrupts_it() {
        let sync_period = Duration::from_millis(100);
        let (p, h) = ControlLoop::spawn_inner(
            fast_config(Duration::from_millis(100)),
            Source::Manual {
                required: vec!["m"],
            },
            Arc::new(Metrics::new()),
            TestSeam {
                slow_full: Duration::from_secs(600),
            },
        )
        .unwrap();
        let health = crate::health::ProxyHealth {
            status: h.status_cell(),
            sync_period,
            metrics: h.metrics().clone(),
            workers: None,
            worker_stall_ms: crate::health::WORKER_STALL_MS,
        };
        h.sender()
            .send(Update::ReplaceAll {
                source: "m".into(),
                state: state(&svc_yaml("web", "172.30.0.1", 80)),
            })
            .unwrap();
        wait("first publication", || has(&p, "172.30.0.1", 80));
        // The next full rebuild starts 100 ms later and would last 10 minutes: once it has run
        // longer than 2 × syncPeriod the tables are stale and health says so.
        wait("stale while rebuilding", || {
            h.status().building_since.is_some() && !health.healthy()
        });
        assert!(h.status().stale_since().is_some());
        // SIGTERM's path: the stop request ends the rebuild in progress.
        within(
            Duration::from_secs(5),
            "shutdown during a rebuild",
            move || h.shutdown(),
        );
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
                preloaded: None,
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
        // Parsable but invalid (a ClusterIP that is not an address): the same.
        std::fs::write(&f, svc_yaml("web", "172.30.0.300", 81)).unwrap();
        wait("invalid Service reported", || {
            h.status()
                .source_errors
                .get("files")
                .is_some_and(|e| e.contains("state.yaml") && e.contains("spec.clusterIP"))
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
