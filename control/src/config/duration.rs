//! Go durations (`1h30m`, `250ms`), as kube-proxy's config spells them.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

/// A duration written as Kubernetes writes them (Go's `time.Duration` format: `24h`, `1h0m0s`,
/// `1.5h`, `300ms`, `0s`); humantime's forms (`2min`, `1day`) are accepted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct GoDuration(pub Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(GoDuration)
            .map_err(de::Error::custom)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

/// Go's `time.Duration.String()`: `1h0m0s`, `2m30s`, `1.5s`, `300ms`, `50µs`, `0s`.
pub fn format_go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let frac = |v: u128, unit: u128| {
        let (whole, rest) = (v / unit, v % unit);
        if rest == 0 {
            whole.to_string()
        } else {
            let digits = unit.ilog10() as usize;
            let s = format!("{whole}.{rest:0digits$}");
            s.trim_end_matches('0').to_string()
        }
    };
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", frac(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", frac(ns, 1_000_000));
    }
    let secs_ns = ns % 60_000_000_000;
    let mins = (ns / 60_000_000_000) % 60;
    let hours = ns / 3_600_000_000_000;
    let secs = format!("{}s", frac(secs_ns, 1_000_000_000));
    if hours > 0 {
        format!("{hours}h{mins}m{secs}")
    } else if mins > 0 {
        format!("{mins}m{secs}")
    } else {
        secs
    }
}

/// Longest duration any field takes: beyond it a value is a typo (and a deadline computed from it
/// could overflow), whatever the field's own range.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses Go's duration syntax (`[0-9.]+(ns|us|µs|ms|s|m|h)` repeated, or a bare `0`), then
/// falls back to humantime. Negative durations, and durations over a year, are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = match parse_go_duration(t) {
        Some(d) => d,
        None => humantime::parse_duration(t).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => too_long(s),
            _ => format!("`{s}` is not a duration (expected e.g. `30s`, `1h0m0s`, `24h`)"),
        })?,
    };
    if d > MAX_DURATION {
        return Err(too_long(s));
    }
    Ok(d)
}

pub(super) fn too_long(s: &str) -> String {
    format!("`{s}` is too long: no duration may exceed a year (8760h)")
}

pub(super) fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut rest = s;
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale_ns = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * scale_ns;
    }
    if !total.is_finite() {
        return None;
    }
    // Saturates: anything this long is refused as over MAX_DURATION by the caller.
    Some(Duration::from_nanos(
        total.min(u64::MAX as f64).round() as u64
    ))
}
