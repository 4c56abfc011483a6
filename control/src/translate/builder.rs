//! Table builds for the control loop and for `translate`: a full build from the whole state, or
//! an update that retranslates only the Services a change touched and patches the shared tables.
//!
//! The `Snapshot`'s tables are sharded copy-on-write maps (`ShardedMap`): the builder keeps the
//! last snapshot it built, and an update writes into a clone of it, which copies only the shards
//! it touches (the published snapshot keeps the old ones). Each Service's translation
//! (`translate::translate_service`, a pure function) is kept, so that removing a Service removes
//! exactly what it added.
//!
//! Two Services may claim one frontend key (an externalIP that is another's ClusterIP, a NodePort
//! on an address that is also an externalIP). The winner is decided as the full translation
//! decides it: IP frontends before NodePorts, then the first Service in namespace/name order.
//! Every claim is remembered, so when the winner goes the next claimant takes over, whatever the
//! order of updates; the losers are reported as problems.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kxdp_dataplane::snapshot::{FrontendKey, Snapshot};

use crate::config::Config;
use crate::model::{ClusterState, ObjectKey};
use crate::policy::PolicyCompiler;
use crate::problem::Problem;
use crate::store::Changes;
use crate::translate::output::{Globals, ServiceOutput};
use crate::translate::service::{globals, translate_service_with};
use crate::translate::slices::SliceCache;

/// Who claims a frontend key: (is a NodePort, Service id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    node_port: bool,
    sid: u32,
}

/// Builds snapshots for one config, remembering what it needs for the next update.
pub struct Builder {
    config: Config,
    globals: Globals,
    policy_problems: Vec<Problem>,
    /// Each Service's translation and id.
    outputs: HashMap<ObjectKey, (u32, ServiceOutput)>,
    /// Service ids: index → key (None when free).
    keys: Vec<Option<ObjectKey>>,
    free: Vec<u32>,
    /// The claim that holds each frontend key.
    owner: HashMap<FrontendKey, Claim>,
    /// Further claims of contested keys.
    contested: HashMap<FrontendKey, Vec<Claim>>,
    /// Problems of Services that have any.
    service_problems: BTreeMap<ObjectKey, Vec<Problem>>,
    no_local: (i64, i64),
    snap: Snapshot,
    /// A complete build is held (false at first, and after a full build was stopped).
    built: bool,
    policy_compiler: PolicyCompiler,
    /// The EndpointSlices of Services with many, as last read: a change to one slice reads that
    /// slice again, not the Service's every endpoint. Kept across full builds (it checks each
    /// slice against the state, so it is never stale).
    slices: SliceCache,
}

impl Builder {
    pub fn new(config: Config) -> Builder {
        Builder {
            config,
            globals: Globals::default(),
            policy_problems: Vec::new(),
            outputs: HashMap::new(),
            keys: Vec::new(),
            free: Vec::new(),
            owner: HashMap::new(),
            contested: HashMap::new(),
            service_problems: BTreeMap::new(),
            no_local: (0, 0),
            snap: Snapshot::empty(),
            built: false,
            policy_compiler: PolicyCompiler::new(),
            slices: SliceCache::default(),
        }
    }

    /// The tables for `state` after `changes` (what changed since the last call): a full build
    /// when `changes.full` (or nothing was built yet), else the previous tables with the policy
    /// recompiled if Pods, Namespaces or NetworkPolicies changed and the changed Services
    /// retranslated. One call, no required order; `stop` is polled during a full build, which
    /// then gives up (`None`, the builder must then be rebuilt in full).
    pub fn apply(
        &mut self,
        state: &ClusterState,
        changes: &Changes,
        stop: &dyn Fn() -> bool,
    ) -> Option<Snapshot> {
        if changes.full || !self.built {
            return self.full_until(state, stop);
        }
        if changes.policy {
            self.policy(
                state,
                Some(crate::policy::PolicyChanges {
                    pods: &changes.pods,
                    namespaces: changes.namespaces,
                    policies: changes.network_policies,
                    cluster_policies: changes.cluster_network_policies,
                }),
            );
        }
        Some(self.update(state, &changes.services))
    }

    /// Everything from the state (nothing shared with earlier snapshots).
    pub fn full(&mut self, state: &ClusterState) -> Snapshot {
        self.full_until(state, &|| false)
            .expect("a build that is never stopped completes")
    }

    /// `full`, giving up (`None`) as soon as `stop` says so (checked every 256 Services).
    pub fn full_until(
        &mut self,
        state: &ClusterState,
        stop: &dyn Fn() -> bool,
    ) -> Option<Snapshot> {
        let config = self.config.clone();
        let policy = std::mem::take(&mut self.policy_compiler);
        let slices = std::mem::take(&mut self.slices);
        *self = Builder::new(config);
        self.policy_compiler = policy;
        self.slices = slices;
        self.slices.retain(|k| state.services.contains_key(k));
        self.globals = globals(&self.config, state);
        self.snap.node = self.globals.node.clone();
        self.snap.cluster_cidrs = self.globals.cluster_cidrs.clone();
        self.snap.service_cidrs = self.globals.service_cidrs.clone();
        self.policy(state, None);
        self.outputs.reserve(state.services.len());
        self.owner.reserve(state.services.len());
        for (i, (key, svc)) in state.services.iter().enumerate() {
            if i % 256 == 255 && stop() {
                self.built = false;
                return None;
            }
            self.translate_and_add(state, key, svc);
        }
        self.built = true;
        Some(self.snap.clone())
    }

    /// The previous tables with the Services in `services` retranslated from `state` (those no
    /// longer in it removed). Changes to this node, ServiceCIDRs or the config need `full`.
    pub fn update(&mut self, state: &ClusterState, services: &BTreeSet<ObjectKey>) -> Snapshot {
        for key in services {
            self.remove(key);
        }
        for key in services {
            if let Some(svc) = state.services.get(key) {
                self.translate_and_add(state, key, svc);
            } else {
                self.slices.forget(key);
            }
        }
        self.snap.clone()
    }

    /// Checks the frontends the Services in `services` hold now (what `Snapshot::validate`
    /// checks, for the part an update wrote).
    pub fn validate_services(&self, services: &BTreeSet<ObjectKey>) -> Result<(), String> {
        for key in services {
            let Some((_, out)) = self.outputs.get(key) else {
                continue;
            };
            for (k, fe, _) in &out.frontends {
                for r in &fe.routes {
                    if r.endpoints.as_range().end > fe.endpoints.len() {
                        return Err(format!(
                            "frontend {k:?} has an endpoint range out of bounds"
                        ));
                    }
                }
                if fe.service_port.proto != k.proto {
                    return Err(format!(
                        "frontend {k:?} names service port {} of another protocol",
                        fe.service_port.name
                    ));
                }
            }
        }
        Ok(())
    }

    fn policy(&mut self, state: &ClusterState, changes: Option<crate::policy::PolicyChanges<'_>>) {
        // NetworkPolicy: this node's pods, compiled (control/src/policy, docs/policy.md); the
        // compiler keeps its peer index and what it built, and redoes only what the changes
        // touch (None: everything, from scratch).
        let (tables, problems) = self.policy_compiler.compile_changes(
            &self.config.node_name,
            &self.snap.node.addrs,
            state,
            changes,
        );
        self.snap.policy = Arc::new(tables);
        self.policy_problems = problems;
    }

    /// The problems of the tables last built: this node and ranges, then Services in
    /// namespace/name order, then frontend clashes, then policy.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = self.globals.problems.clone();
        for p in self.service_problems.values() {
            out.extend(p.iter().cloned());
        }
        let mut clashes: Vec<(ObjectKey, Problem)> = Vec::new();
        for (k, claims) in &self.contested {
            let Some(owner) = self.snap.frontends.get(k) else {
                continue;
            };
            for c in claims {
                let Some(key) = self.key(c.sid) else { continue };
                let kind = self
                    .outputs
                    .get(key)
                    .and_then(|(_, o)| o.frontends.iter().find(|(x, _, _)| x == k))
                    .map(|(_, fe, _)| fe.kind.as_str())
                    .unwrap_or("frontend");
                clashes.push((
                    key.clone(),
                    Problem {
                        object: format!("Service {key}"),
                        message: format!(
                            "{kind} {}:{} (proto {}) is already {}'s; ignored",
                            k.addr, k.port, k.proto, owner.service_port.name
                        ),
                    },
                ));
            }
        }
        clashes.sort_by(|a, b| (&a.0, &a.1.message).cmp(&(&b.0, &b.1.message)));
        out.extend(clashes.into_iter().map(|(_, p)| p));
        out.extend(self.policy_problems.iter().cloned());
        out
    }

    /// Service ports with a Local policy, endpoints, and none of them local: (internal, external).
    pub fn no_local_endpoints(&self) -> (i64, i64) {
        self.no_local
    }

    fn key(&self, sid: u32) -> Option<&ObjectKey> {
        self.keys.get(sid as usize).and_then(Option::as_ref)
    }

    /// Whether claim `a` wins over claim `b`.
    fn wins(&self, a: Claim, b: Claim) -> bool {
        (a.node_port, self.key(a.sid)) < (b.node_port, self.key(b.sid))
    }

    /// Translates one Service (reusing the kept reads of its slices) and adds its tables.
    fn translate_and_add(
        &mut self,
        state: &ClusterState,
        key: &ObjectKey,
        svc: &k8s_openapi::api::core::v1::Service,
    ) {
        let out = translate_service_with(
            &self.config,
            &self.globals,
            key,
            svc,
            state,
            Some(&mut self.slices),
        );
        self.add(key, out);
    }

    fn add(&mut self, key: &ObjectKey, out: ServiceOutput) {
        let sid = match self.free.pop() {
            Some(i) => {
                self.keys[i as usize] = Some(key.clone());
                i
            }
            None => {
                self.keys.push(Some(key.clone()));
                (self.keys.len() - 1) as u32
            }
        };
        for (k, fe, np) in &out.frontends {
            let c = Claim {
                node_port: *np,
                sid,
            };
            match self.owner.get(k).copied() {
                None => {
                    self.owner.insert(*k, c);
                    self.snap.frontends.insert(*k, fe.clone());
                }
                Some(o) if self.wins(c, o) => {
                    self.contested.entry(*k).or_default().push(o);
                    self.owner.insert(*k, c);
                    self.snap.frontends.insert(*k, fe.clone());
                }
                Some(_) => self.contested.entry(*k).or_default().push(c),
            }
        }
        for a in &out.cluster_ips {
            self.snap.cluster_ips.insert(*a);
        }
        let mut problems = out.problems.clone();
        for sp in &out.ports {
            match self.snap.service_ports.get(&sp.id) {
                None => {
                    self.snap.service_ports.insert(sp.id, sp.clone());
                }
                Some(other) if other.name != sp.name => problems.push(Problem {
                    object: format!("Service {key}"),
                    message: format!(
                        "port `{}` has the same id {:#010x} as `{}`: conntrack listings may name the wrong one",
                        sp.name, sp.id, other.name
                    ),
                }),
                Some(_) => {}
            }
        }
        for (id, list) in &out.listed {
            // One list per id, as one record: the first Service to claim an id keeps both.
            if !self.snap.listed_endpoints.contains_key(id) {
                self.snap.listed_endpoints.insert(*id, list.clone());
            }
        }
        self.no_local.0 += out.no_local.0;
        self.no_local.1 += out.no_local.1;
        if !problems.is_empty() {
            self.service_problems.insert(key.clone(), problems);
        }
        self.outputs.insert(key.clone(), (sid, out));
    }

    fn remove(&mut self, key: &ObjectKey) {
        let Some((sid, out)) = self.outputs.remove(key) else {
            return;
        };
        for (k, _, np) in &out.frontends {
            let c = Claim {
                node_port: *np,
                sid,
            };
            if self.owner.get(k) == Some(&c) {
                self.promote(k);
            } else if let Some(list) = self.contested.get_mut(k) {
                list.retain(|x| *x != c);
                if list.is_empty() {
                    self.contested.remove(k);
                }
            }
        }
        for a in &out.cluster_ips {
            self.snap.cluster_ips.remove(a);
        }
        for sp in &out.ports {
            if self
                .snap
                .service_ports
                .get(&sp.id)
                .is_some_and(|x| Arc::ptr_eq(x, sp))
            {
                self.snap.service_ports.remove(&sp.id);
            }
        }
        for (id, list) in &out.listed {
            if self
                .snap
                .listed_endpoints
                .get(id)
                .is_some_and(|x| Arc::ptr_eq(x, list))
            {
                self.snap.listed_endpoints.remove(id);
            }
        }
        self.no_local.0 -= out.no_local.0;
        self.no_local.1 -= out.no_local.1;
        self.service_problems.remove(key);
        self.keys[sid as usize] = None;
        self.free.push(sid);
    }

    /// The owner of `k` is going: the best other claimant takes over, or the key goes.
    fn promote(&mut self, k: &FrontendKey) {
        let next = self.contested.get(k).and_then(|list| {
            list.iter()
                .copied()
                .reduce(|best, c| if self.wins(c, best) { c } else { best })
        });
        let Some(next) = next else {
            self.owner.remove(k);
            self.snap.frontends.remove(k);
            return;
        };
        if let Some(list) = self.contested.get_mut(k) {
            list.retain(|x| *x != next);
            if list.is_empty() {
                self.contested.remove(k);
            }
        }
        self.owner.insert(*k, next);
        let fe = self
            .key(next.sid)
            .and_then(|key| self.outputs.get(key))
            .and_then(|(_, o)| o.frontends.iter().find(|(x, _, _)| x == k))
            .map(|(_, fe, _)| fe.clone());
        match fe {
            Some(fe) => {
                self.snap.frontends.insert(*k, fe);
            }
            None => {
                self.owner.remove(k);
                self.snap.frontends.remove(k);
            }
        }
    }
}
