//! What a source tells the control loop (`Update`), shared by the sources and the loop.

use crate::model::{ClusterState, Kind, Object, ObjectKey};
use crate::problem::Problem;

/// A query `Update::Inspect` runs on the control thread.
pub struct Inspect(pub Box<dyn FnOnce(&ClusterState) + Send>);

impl std::fmt::Debug for Inspect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Inspect(..)")
    }
}

/// What a source tells the control loop.
#[derive(Debug)]
pub enum Update {
    /// An object was added or modified.
    Apply(Object),
    /// An object was deleted (`kind` as `Object::kind`).
    Delete { kind: Kind, key: ObjectKey },
    /// Every object of a kind, after a (re)list: objects of that kind not listed are gone.
    /// `keep` names objects that were listed but could not be decoded: their last good version
    /// stays.
    Relisted {
        source: String,
        kind: Kind,
        objects: Vec<Object>,
        keep: Vec<ObjectKey>,
    },
    /// A whole new state (the files source): replaces everything.
    ReplaceAll { source: String, state: ClusterState },
    /// An object that could not be decoded: skipped (its last good version stays), reported.
    Problem {
        kind: Kind,
        key: ObjectKey,
        problem: Problem,
    },
    /// A source failed (API server unreachable, state unreadable); the last good tables stay.
    SourceError { source: String, message: String },
    /// A source is connected and synced again.
    SourceUp { source: String },
    /// Rebuild everything at the next opportunity.
    Resync,
    /// Runs a read-only query against the cluster state on the control thread (the admin
    /// socket's `policy trace`): the state is read in place, never copied.
    Inspect(Inspect),
    /// Stop the loop.
    Stop,
}
