//! Where cluster state comes from. Each source fills a `ClusterState` (kube-rs `runtime` style:
//! sources feed a store, reconciliation reads it).

pub mod event;
pub mod files;
pub mod kube;
pub mod watch_files;
