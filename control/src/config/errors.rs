//! `ConfigError`, and YAML and serde messages reworded to name the field in plain words.

use std::fmt;
use std::path::PathBuf;

use super::limits::{Limit, RANGES};

/// yaml_serde prefixes messages with its own (coarser) idea of the path and appends the
/// position; the path from serde_path_to_error is the one shown and the line goes in its own
/// place, so drop both.
pub(super) fn strip_yaml_path(msg: &str, path: &str) -> String {
    let msg = match msg.rfind(" at line ") {
        Some(i) if msg[i..].contains(" column ") => &msg[..i],
        _ => msg,
    };
    if let Some((head, rest)) = msg.split_once(": ") {
        if !head.contains(' ') && (path.starts_with(head) || head == ".") {
            return rest.to_string();
        }
    }
    msg.to_string()
}

/// serde's messages in plain words: no Rust type names (`expected u32`), `map` is a mapping.
pub(super) fn plain_words(msg: &str, field: &str) -> String {
    let range = range_of(field).map(|(l, _)| match l {
        Limit::Int { min, max } => format!("a whole number from {min} to {max}"),
        Limit::Time { .. } => "a duration".to_string(),
    });
    let number = range.unwrap_or_else(|| "a whole number".to_string());
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((name, known)) = rest.split_once("`, expected one of ") {
            let known: Vec<&str> = known.split(", ").map(|k| k.trim_matches('`')).collect();
            let hint = known
                .iter()
                .find(|k| k.eq_ignore_ascii_case(name))
                .map(|k| format!("did you mean `{k}`? "))
                .unwrap_or_default();
            return format!(
                "unknown field `{name}` ({hint}known fields here: {})",
                known.join(", ")
            );
        }
    }
    let mut m = msg.to_string();
    for ty in [
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "isize",
    ] {
        let pat = format!("expected {ty}");
        if m.ends_with(&pat) {
            m = format!("{}expected {number}", &m[..m.len() - pat.len()]);
        }
    }
    m = m
        .replace("expected a sequence", "expected a list")
        .replace("invalid type: map,", "got a mapping,")
        .replace("invalid type: sequence,", "got a list,")
        .replace("invalid type: ", "got ")
        .replace("invalid value: integer", "got")
        .replace("invalid value: ", "got ")
        .replace("expected a boolean", "expected true or false")
        .replace("got string ", "got the text ")
        .replace("got integer ", "got ")
        .replace("got floating point ", "got ")
        .replace("struct DataplaneConfiguration", "a mapping")
        .replace("struct ", "a mapping ");
    // "got `-1`, ..." -> "got -1, ...": numbers need no quoting.
    if let Some(rest) = m.strip_prefix("got `") {
        if let Some((n, tail)) = rest.split_once('`') {
            if n.parse::<f64>().is_ok() {
                m = format!("got {n}{tail}");
            }
        }
    }
    m
}

pub(super) fn range_of(field: &str) -> Option<(Limit, &'static str)> {
    // `nodeOverrides[0].workers.count` has the range of `workers.count`, `workers.cpus[1]` that
    // of `workers.cpus`.
    let f = match field.strip_prefix("nodeOverrides[") {
        Some(r) => r.split_once("].").map_or(field, |(_, r)| r),
        None => field,
    };
    let base = f.split('[').next().unwrap_or(f);
    RANGES
        .iter()
        .find(|(f, _, _)| *f == base)
        .map(|(_, l, n)| (*l, *n))
}

/// The line (1-based) where a dotted field path is written, found by looking for each key in
/// turn after the previous one. None when it is not written (a default, or a missing field).
pub fn line_of(text: &str, field: &str) -> Option<usize> {
    let mut pos = 0;
    let mut found = false;
    for seg in field.split('.') {
        let key = seg.split('[').next().unwrap_or(seg);
        if key.is_empty() {
            continue;
        }
        let hit = [
            format!("{key}:"),
            format!("\"{key}\":"),
            format!("'{key}':"),
        ]
        .iter()
        .filter_map(|pat| {
            text[pos..].match_indices(pat.as_str()).find_map(|(i, _)| {
                let at = pos + i;
                // A whole key: not the tail of a longer one.
                let before = text[..at].chars().next_back();
                let whole = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                whole.then_some(at)
            })
        })
        .min();
        match hit {
            Some(at) => {
                pos = at;
                found = true;
            }
            None => return found.then(|| text[..pos].lines().count().max(1)),
        }
    }
    found.then(|| text[..pos].matches('\n').count() + 1)
}

/// A config that could not be loaded: the file, line and field path, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line of the offending field, when known.
    pub line: Option<usize>,
    /// Dotted field path (`conntrack.maxEntries`); empty for file-level errors.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.field.is_empty() || self.field == "." {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}
