//! Table builds for the control loop: a full build from the whole state, or an update that
//! retranslates only the Services a change touched.

use std::collections::BTreeSet;

use kxdp_dataplane::snapshot::{EmptyAction, FrontendKind, Snapshot, SourceClass};

use crate::config::Config;
use crate::model::{ClusterState, ObjectKey};
use crate::translate::{translate, Problem};

/// Builds snapshots for one config, remembering what it needs for the next update.
pub struct Builder {
    config: Config,
    problems: Vec<Problem>,
    no_local: (i64, i64),
}

impl Builder {
    pub fn new(config: Config) -> Builder {
        Builder {
            config,
            problems: Vec::new(),
            no_local: (0, 0),
        }
    }

    /// Everything from the state.
    pub fn full(&mut self, state: &ClusterState) -> Snapshot {
        let t = translate(&self.config, state);
        self.problems = t.problems;
        self.no_local = no_local_endpoints(&t.snapshot);
        t.snapshot
    }

    /// The previous tables with the Services in `services` retranslated.
    pub fn update(&mut self, state: &ClusterState, _services: &BTreeSet<ObjectKey>) -> Snapshot {
        self.full(state)
    }

    /// The problems of the last build.
    pub fn problems(&self) -> Vec<Problem> {
        self.problems.clone()
    }

    /// Service ports with a Local policy, endpoints, and none of them local: (internal, external).
    pub fn no_local_endpoints(&self) -> (i64, i64) {
        self.no_local
    }
}

fn no_local_endpoints(s: &Snapshot) -> (i64, i64) {
    let mut internal = BTreeSet::new();
    let mut external = BTreeSet::new();
    for fe in &s.frontend_table {
        let dropped = |c: SourceClass| {
            let r = &fe.routes[c as usize];
            r.endpoints.is_empty() && r.when_empty == EmptyAction::Drop
        };
        if fe.kind == FrontendKind::ClusterIp {
            if dropped(SourceClass::Pod) {
                internal.insert(fe.service_port);
            }
        } else if dropped(SourceClass::External) {
            external.insert(fe.service_port);
        }
    }
    (internal.len() as i64, external.len() as i64)
}
