//! kxdp-control: the control plane. Sources fill a `ClusterState` (`model`); `translate` turns it,
//! with the config, into the dataplane's `Snapshot` as a pure function; `cli` is the `kxdp`
//! binary's entry point.

pub mod admin;
pub mod cleanup;
pub mod cli;
pub mod config;
pub mod endpoints;
pub mod health;
pub mod incremental;
pub mod kubeproxy;
pub mod metrics;
pub mod model;
pub mod output;
pub mod policy;
pub mod process_metrics;
pub mod run;
pub mod sources;
pub mod sync;
pub mod translate;

pub use config::{Config, ConfigError, DataplaneConfiguration};
pub use model::{ClusterState, Object, ObjectKey};
pub use sources::files::{load_state, StateError};
pub use translate::{translate, Problem, Translation};
pub mod pcapgen;
