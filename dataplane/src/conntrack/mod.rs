//! The shared connection-tracking table (being written).
mod config;
pub use config::CtConfig;
