//! The pure translation from cluster state to dataplane tables: `translate(config, state)`.
//!
//! It follows kube-proxy's nftables proxier (`pkg/proxy/nftables/proxier.go`, `syncProxyRules`)
//! rule for rule; where kube-proxy builds chains, this builds one `Route` per frontend and source
//! class. Choices the Kubernetes docs leave open are stated on the functions below.
//!
//! Nothing here fails as a whole: an object that cannot be translated is skipped and reported as
//! a `Problem`; everything else is built.
//!
//! - `service`: one Service's translation (`translate_service`) and this node's shared facts
//!   (`globals`); `addr_guard` checks their addresses.
//! - `builder`: the `Builder` assembles the tables from the Services' translations, for a full
//!   build (what `translate` is) and for the control loop's partial updates.
//! - `output`: what a Service's translation gives; `slices`: EndpointSlices kept between builds.

mod addr_guard;
mod builder;
mod output;
mod service;
mod slices;
#[cfg(test)]
mod tests;

use kxdp_dataplane::snapshot::Snapshot;

use crate::config::Config;
use crate::model::ClusterState;
use crate::problem::Problem;

pub use builder::Builder;
pub use output::{Globals, ServiceOutput};
pub use service::{
    globals, service_port_id, translate_service, translate_service_with, ANNOTATION_LB_ALGORITHM,
    ANNOTATION_LB_SOURCE_RANGES, DEFAULT_AFFINITY_TIMEOUT_S, LABEL_SERVICE_PROXY_NAME,
};
pub use slices::{SliceCache, SLICE_CACHE_MIN_SLICES};

/// The tables built from one state, and what was wrong on the way.
#[derive(Debug)]
pub struct Translation {
    /// `generation` is 0: the publisher sets it.
    pub snapshot: Snapshot,
    pub problems: Vec<Problem>,
}

/// Builds the dataplane tables for this node from the config and the cluster state: every
/// Service through `translate_service`, assembled by `Builder` (the control loop's
/// partial updates run the same per-Service code).
pub fn translate(config: &Config, state: &ClusterState) -> Translation {
    let mut b = Builder::new(config.clone());
    let snapshot = b.full(state);
    Translation {
        snapshot,
        problems: b.problems(),
    }
}
