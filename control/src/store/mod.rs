//! The `Store`: the cluster as last seen by the control loop, and what changed since the last
//! sync (`Changes`).

mod changes;

use std::collections::HashSet;
use std::time::SystemTime;

use crate::model::{ClusterState, Kind, Object, ObjectKey};

pub use changes::{Changes, ANNOTATION_TRIGGER_TIME};

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
        if self.state.holds(&obj) {
            return;
        }
        let key = obj.key();
        let trigger = match &obj {
            Object::EndpointSlice(s) => trigger_time(s).unwrap_or(now),
            _ => now,
        };
        self.changes.touch(&key, &obj, &self.node_name);
        self.changes.count(obj.kind(), trigger);
        if let Some(old) = self.state.put(obj) {
            self.changes.touch(&key, &old, &self.node_name);
        }
    }

    /// Removes an object, recording what it touches.
    pub fn delete(&mut self, kind: Kind, key: &ObjectKey, now: SystemTime) {
        if let Some(old) = self.state.delete(kind, key) {
            self.changes.touch(key, &old, &self.node_name);
            self.changes.count(kind, now);
        }
    }

    /// Replaces every object of `kind` by `objects` (a relist), keeping the objects named in
    /// `keep`. Only the objects that differ count as changes.
    pub fn replace_kind(
        &mut self,
        kind: Kind,
        objects: Vec<Object>,
        keep: &[ObjectKey],
        now: SystemTime,
    ) {
        if self.state.keys_len(kind) == 0 {
            // The first list of a kind (startup): nothing to diff against, and everything is
            // rebuilt anyway; skip the per-object comparisons and change records.
            if !objects.is_empty() {
                self.changes.full = true;
            }
            for o in objects {
                self.changes.count(kind, now);
                self.state.put(o);
            }
            return;
        }
        let listed: HashSet<ObjectKey> = objects
            .iter()
            .map(Object::key)
            .chain(keep.iter().cloned())
            .collect();
        for key in self.state.keys(kind) {
            if !listed.contains(&key) {
                self.delete(kind, &key, now);
            }
        }
        for o in objects {
            self.apply(o, now);
        }
    }

    /// Replaces everything (the files source).
    pub fn replace_all(&mut self, mut state: ClusterState, now: SystemTime) {
        if self.state.is_empty() {
            // The first state (startup): taken whole, as `replace_kind` takes a first list
            // (no diff, a full build), without moving every object out of one store and into
            // this one again (60,000 objects: 0.1-0.2 s of a `kxdp run --state` startup).
            self.changes.full |= !state.is_empty();
            for kind in Kind::ALL {
                for _ in 0..state.keys_len(kind) {
                    self.changes.count(kind, now);
                }
            }
            self.state = state;
            return;
        }
        for kind in Kind::ALL {
            let objects = state.take_kind(kind);
            self.replace_kind(kind, objects, &[], now);
        }
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
