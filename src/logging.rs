//! Logs: to stderr, as plain text (ANSI colour only when stderr is a terminal, so that
//! `kubectl logs` and files never see escape codes; `NO_COLOR` turns it off there too) or as one
//! JSON object per line (`--log-format json`, for log pipelines).
//!
//! The level: `--log-level` (a level or a full `RUST_LOG`-style directive list) wins, then `-v`
//! (once: info, twice: debug, three times: trace), then `RUST_LOG`, then the command's default
//! (`info` for `kxdp run`, as kube-proxy logs; `warn` for the one-shot commands).

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `2026-01-01T00:00:00.000000Z  INFO target: message key=value`.
    #[default]
    Text,
    /// `{"timestamp":"...","level":"INFO","fields":{"message":"...",...},"target":"..."}`.
    Json,
}

/// What the flags asked for.
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    pub format: LogFormat,
    /// `--log-level`.
    pub level: Option<String>,
    /// `-v` count.
    pub verbose: u8,
    /// The command's default level.
    pub default_level: &'static str,
}

impl LogOptions {
    /// The filter directives, by the precedence in the module docs; `rust_log` is `RUST_LOG`.
    pub fn directives(&self, rust_log: Option<&str>) -> String {
        if let Some(l) = &self.level {
            return l.clone();
        }
        match self.verbose {
            0 => {}
            1 => return "info".into(),
            2 => return "debug".into(),
            _ => return "trace".into(),
        }
        match rust_log {
            Some(s) if !s.trim().is_empty() => s.to_string(),
            _ => self.default_level.to_string(),
        }
    }
}

/// Checks a `--log-level` value (clap value parser), so that a typo is bad input, not silence.
pub fn parse_level(s: &str) -> Result<String, String> {
    EnvFilter::builder()
        .parse(s)
        .map(|_| s.to_string())
        .map_err(|e| {
            format!("`{s}`: {e} (expected error, warn, info, debug, trace or target=level,...)")
        })
}

/// Whether logs are JSON: then the binary's own messages (a failed command's `kxdp: ...`, a
/// panic) are log events too, so that stderr stays one JSON object per line.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// Installs the subscriber (a second call, as in unit tests, is harmless).
pub fn init(opts: &LogOptions) {
    if opts.format == LogFormat::Json {
        JSON.store(true, std::sync::atomic::Ordering::Relaxed);
        // The default hook writes plain lines (and a backtrace note) to stderr.
        std::panic::set_hook(Box::new(|info| {
            tracing::error!(target: "kxdp", "kxdp: {info}");
        }));
    }
    let rust_log = std::env::var("RUST_LOG").ok();
    let directives = opts.directives(rust_log.as_deref());
    let filter = EnvFilter::builder()
        .parse(&directives)
        .unwrap_or_else(|_| EnvFilter::new(opts.default_level));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match opts.format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence() {
        let mut o = LogOptions {
            default_level: "warn",
            ..Default::default()
        };
        assert_eq!(o.directives(None), "warn");
        assert_eq!(o.directives(Some("debug")), "debug");
        o.verbose = 2;
        assert_eq!(o.directives(Some("error")), "debug");
        o.level = Some("kxdp_control=trace".into());
        assert_eq!(o.directives(Some("error")), "kxdp_control=trace");
        assert!(parse_level("info").is_ok());
        assert!(parse_level("kxdp_control=debug,warn").is_ok());
        assert!(parse_level("loud=").is_err() || parse_level("=bogus=").is_err());
    }
}
