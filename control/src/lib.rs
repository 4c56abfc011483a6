//! kxdp-control: the control plane. Sources fill a `ClusterState` (`model`); `translate` turns it,
//! with the config, into the dataplane's `Snapshot` as a pure function; `run` is the daemon and
//! `admin` its socket's server side. The command line (parsing, output formats, the admin
//! client, exit codes) is the `kxdp` binary crate's: this library returns typed errors.

pub mod admin;
pub mod cleanup;
pub mod config;
pub mod endpoints;
pub mod error;
pub mod health;
pub mod host_path;
pub mod kubeproxy;
pub mod metrics;
pub mod model;
pub mod policy;
pub mod problem;
pub mod process_metrics;
pub mod run;
pub mod sources;
pub mod status;
pub mod store;
pub mod sync;
pub mod takeover;
pub mod translate;
pub mod validate;
pub mod yaml;

pub use config::{Config, ConfigError, DataplaneConfiguration};
pub use error::RunError;
pub use model::{ClusterState, Object, ObjectKey};
pub use problem::Problem;
pub use sources::files::{load_state, StateError};
pub use translate::{translate, Translation};
pub mod routes_file;
