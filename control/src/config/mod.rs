//! `DataplaneConfiguration`: kxdp's config file, modelled on kube-proxy's `KubeProxyConfiguration`
//! (same field names where the meaning is the same). The reference is docs/config.md; a test
//! checks that every field, default and range below appears there.
//!
//! Every struct denies unknown fields: a typo is an error (exit 2), never silently ignored.
//! Errors name the file, the line and the field path in plain words
//! (`config.yaml:7: conntrack.maxEntries: 4294967295 is too large: at most 67108864`).
//!
//! Loading has three steps: `from_yaml_str` (syntax, types, ranges: the same on every machine),
//! `for_node` (the `nodeOverrides` matching this node's labels), `check_machine` (CPUs exist,
//! the memory asked for is there) just before anything is allocated.
//!
//! - `schema`: the struct and its sections, defaults, field (de)serializers;
//! - `duration`: Go durations (`1h30m`); `limits`: every numeric field's range, and the
//!   conntrack table's size (the dataplane's own formula, `conntrack::table_bytes`);
//! - `load`: files and directories, strict parsing; `errors`: `ConfigError` and the wording of
//!   YAML and serde errors; `validate`: checks across fields and ranges;
//! - `overrides`: `nodeOverrides`; `machine`: the machine's CPUs and memory, and the checks
//!   against them.

mod duration;
mod errors;
mod limits;
mod load;
mod machine;
mod overrides;
mod schema;
#[cfg(test)]
mod tests;
mod validate;

pub use duration::*;
pub use errors::*;
pub use limits::*;
pub use load::*;
pub use machine::*;
pub use schema::*;
