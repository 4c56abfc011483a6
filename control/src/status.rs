//! What the control loop shows of itself: its `Status` (`kxdp` status output, metrics, tests)
//! and the `HealthView` the health servers answer from, computed at each publication.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::model::{ClusterState, ObjectKey};
use crate::problem::Problem;

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
    pub health: HealthView,
    /// When the oldest change not yet published was taken from the sources (None: none).
    pub pending_since: Option<SystemTime>,
    /// When the rebuild in progress started (None: none in progress).
    pub building_since: Option<SystemTime>,
}

const MAX_EVENTS: usize = 256;

impl Status {
    /// Since when the published tables lag behind what the sources said: the oldest
    /// unpublished change, or the start of a rebuild still in progress. `None`: up to date
    /// (as far as the loop has read its queue). Health (`/healthz`) fails once this is older
    /// than its timeout, as kube-proxy's does for a queued update not applied in time.
    pub fn stale_since(&self) -> Option<SystemTime> {
        match (self.pending_since, self.building_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn event(&mut self, e: String) {
        if self.events.len() == MAX_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(e);
    }
}

/// One Service's health-check node port answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcService {
    pub namespace: String,
    pub name: String,
    /// Ready endpoints on this node.
    pub local_endpoints: usize,
}

/// What the health servers need of the cluster state, computed at each publication.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthView {
    /// This node's Node object has a deletionTimestamp.
    pub node_deleting: bool,
    /// healthCheckNodePort → its Service.
    pub services: Arc<BTreeMap<u16, HcService>>,
}

impl HealthView {
    pub fn from_state(state: &ClusterState, node_name: &str) -> HealthView {
        let node_deleting = state
            .nodes
            .get(node_name)
            .is_some_and(|n| n.metadata.deletion_timestamp.is_some());
        let mut services = BTreeMap::new();
        Self::add_services(&mut services, state, node_name, state.services.iter());
        HealthView {
            node_deleting,
            services: Arc::new(services),
        }
    }

    /// The view after the Services in `changed` changed (or their EndpointSlices): costs the
    /// changed Services, not the cluster (the control loop calls it at every partial sync).
    pub fn updated(
        &self,
        state: &ClusterState,
        node_name: &str,
        changed: &BTreeSet<ObjectKey>,
    ) -> HealthView {
        let touched =
            |s: &HcService| changed.contains(&ObjectKey::new(s.namespace.clone(), s.name.clone()));
        let now = changed
            .iter()
            .filter_map(|k| state.services.get_key_value(k));
        if !self.services.values().any(touched) && now.clone().next().is_none() {
            return self.clone();
        }
        let mut services: BTreeMap<u16, HcService> = self
            .services
            .iter()
            .filter(|(_, s)| !touched(s))
            .map(|(p, s)| (*p, s.clone()))
            .collect();
        Self::add_services(&mut services, state, node_name, now);
        HealthView {
            node_deleting: self.node_deleting,
            services: Arc::new(services),
        }
    }

    fn add_services<'a>(
        services: &mut BTreeMap<u16, HcService>,
        state: &ClusterState,
        node_name: &str,
        list: impl Iterator<Item = (&'a ObjectKey, &'a k8s_openapi::api::core::v1::Service)>,
    ) {
        for (key, svc) in list {
            let Some(spec) = &svc.spec else { continue };
            if spec.external_traffic_policy.as_deref() != Some("Local")
                || !matches!(
                    spec.type_.as_deref(),
                    Some("LoadBalancer") | Some("NodePort")
                )
            {
                continue;
            }
            let Some(port) = spec
                .health_check_node_port
                .filter(|p| (1..=65535).contains(p))
            else {
                continue;
            };
            services.insert(
                port as u16,
                HcService {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    local_endpoints: local_endpoints(state, key, node_name),
                },
            );
        }
    }
}

/// Ready endpoints of a Service on this node (distinct addresses, as kube-proxy counts them).
fn local_endpoints(state: &ClusterState, key: &ObjectKey, node_name: &str) -> usize {
    let mut addrs = BTreeSet::new();
    for slice in state.slices_of(key) {
        for ep in &slice.endpoints {
            if ep.node_name.as_deref() != Some(node_name) {
                continue;
            }
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if ready {
                if let Some(a) = ep.addresses.first() {
                    addrs.insert(a.clone());
                }
            }
        }
    }
    addrs.len()
}
