//! `RunError`: why `kxdp run` could not start or stopped, for the binary's exit codes.

/// Why `run` could not start or stopped. The binary maps the variants to exit codes: bad input
/// (config, state, kubeconfig) is the operator's to fix; the rest are runtime failures.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    State(#[from] crate::sources::files::StateError),
    /// The kubeconfig (or the in-cluster configuration) could not be read.
    #[error("API server: {0}")]
    Kubeconfig(String),
    /// A listener could not be bound.
    #[error("{what} {addr}: {source}")]
    Listen {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// The AF_XDP dataplane could not attach.
    #[error("attaching to {interfaces}: {source}")]
    Attach {
        interfaces: String,
        source: std::io::Error,
    },
    /// The process lacks capabilities the dataplane needs (`check_capabilities`).
    #[error("{0}")]
    Capabilities(String),
    /// A takeover of a running kxdp started and failed (the running one carries on).
    #[error("taking over from the running kxdp: {0}")]
    Takeover(String),
    /// A thread or runtime could not be started.
    #[error("starting {what}: {source}")]
    Spawn {
        what: &'static str,
        source: std::io::Error,
    },
}

impl RunError {
    /// Whether the operator's input (config, state, kubeconfig) is at fault.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            RunError::Config(_) | RunError::State(_) | RunError::Kubeconfig(_)
        )
    }
}
