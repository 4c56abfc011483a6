//! Reading the config: one file, or a directory of files merged in name order, parsed
//! strictly, validated, with `nodeName` defaulted.

use std::path::{Path, PathBuf};

use super::errors::{line_of, plain_words, strip_yaml_path, ConfigError};
use super::schema::DataplaneConfiguration;

pub(super) fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: None,
        field: String::new(),
        message: format!("cannot read: {e}"),
    })
}

/// A config directory's files in the order they apply (see `DataplaneConfiguration::load_dir`).
pub fn config_dir_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("cannot list the directory: {e}"))? {
        let entry = entry.map_err(|e| format!("cannot list the directory: {e}"))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // Followed: a ConfigMap volume's files are links into its `..data` directory.
        if name.starts_with('.') || !name.ends_with(".yaml") || !entry.path().is_file() {
            continue;
        }
        files.push(entry.path());
    }
    files.sort_by_key(|p| (!p.ends_with("config.yaml"), p.clone()));
    if files.is_empty() {
        return Err("no configuration in the directory (no *.yaml file)".into());
    }
    Ok(files)
}

/// `over` written over `base`: mappings merge key by key, anything else replaces.
pub(super) fn merge_yaml(base: &mut yaml_serde::Value, over: yaml_serde::Value) {
    match (base, over) {
        (yaml_serde::Value::Mapping(b), yaml_serde::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge_yaml(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Whether `text` writes the dotted `field` (each of its keys, in turn).
pub(super) fn writes_field(text: &str, field: &str) -> bool {
    let Ok(v) = yaml_serde::from_str::<yaml_serde::Value>(text) else {
        return false;
    };
    let mut at = &v;
    for seg in field.split('.') {
        let key = seg.split('[').next().unwrap_or(seg);
        if key.is_empty() {
            continue;
        }
        match at.get(key) {
            Some(next) => at = next,
            None => return false,
        }
    }
    !field.is_empty()
}

/// The `apiVersion` and `kind` of a kube-proxy configuration file.
pub const KUBE_PROXY_KIND: &str = "KubeProxyConfiguration";

/// Whether `text` is a KubeProxyConfiguration (any apiVersion).
pub fn is_kube_proxy_configuration(text: &str) -> bool {
    yaml_serde::from_str::<yaml_serde::Value>(text)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
        .is_some_and(|k| k == KUBE_PROXY_KIND)
}

impl DataplaneConfiguration {
    /// Reads and validates a config file, or a directory of them (`load_dir`); an empty
    /// `nodeName` becomes `$NODE_NAME`, else the hostname (as kube-proxy's `hostnameOverride`
    /// falls back to the hostname).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut cfg = if path.is_dir() {
            Self::load_dir(path)?
        } else {
            Self::from_yaml_str(&read_config(path)?, path)?
        };
        cfg.node_name = default_node_name(
            &cfg.node_name,
            std::env::var("NODE_NAME").ok().as_deref(),
            hostname().as_deref(),
        );
        Ok(cfg)
    }

    /// A config directory (a ConfigMap mounted whole): `config.yaml` first, then every other
    /// `*.yaml` file in name order, each setting the fields it writes over those before it (a
    /// mapping merges key by key, anything else, lists included, is replaced). So a deployment
    /// preset adds a file with its `interfaces` and keeps the rest of the base's `config.yaml`.
    /// Names starting with `.` (the ConfigMap volume's own `..data`) are skipped. An error names
    /// the file and line that wrote the field at fault (the last one that writes it).
    pub fn load_dir(dir: &Path) -> Result<Self, ConfigError> {
        let err = |file: &Path, line: Option<usize>, message: String| ConfigError {
            file: file.to_path_buf(),
            line,
            field: String::new(),
            message,
        };
        let files = config_dir_files(dir).map_err(|e| err(dir, None, e))?;
        let mut texts = Vec::with_capacity(files.len());
        for f in files {
            let text = read_config(&f)?;
            crate::yaml::check(&text).map_err(|e| err(&f, None, e.to_string()))?;
            texts.push((f, text));
        }
        if let [(file, text)] = &texts[..] {
            return Self::from_yaml_str(text, file);
        }
        let mut merged = yaml_serde::Value::Mapping(Default::default());
        for (file, text) in &texts {
            if is_kube_proxy_configuration(text) {
                // (Refused, with the way to convert it.)
                return Self::from_yaml_str(text, file);
            }
            let v: yaml_serde::Value = yaml_serde::from_str(text)
                .map_err(|e| err(file, e.location().map(|l| l.line()), e.to_string()))?;
            match v {
                yaml_serde::Value::Null => {}
                v @ yaml_serde::Value::Mapping(_) => merge_yaml(&mut merged, v),
                _ => {
                    return Err(err(
                        file,
                        None,
                        "must be a mapping of DataplaneConfiguration fields".into(),
                    ))
                }
            }
        }
        let text = yaml_serde::to_string(&merged).expect("a YAML value always serializes");
        Self::from_yaml_str(&text, dir).map_err(|mut e| {
            // The file that wrote the field, at its line; else the directory.
            match texts
                .iter()
                .rev()
                .find_map(|(f, t)| writes_field(t, &e.field).then(|| (f, line_of(t, &e.field))))
            {
                Some((f, line)) => {
                    e.file = f.clone();
                    e.line = line;
                }
                None => e.line = None,
            }
            e
        })
    }

    /// Parses and validates config text; `file` only names the source in errors.
    pub fn from_yaml_str(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let err = |field: String, line: Option<usize>, message: String| ConfigError {
            file: file.to_path_buf(),
            line,
            field,
            message,
        };
        crate::yaml::check(text).map_err(|e| err(String::new(), None, e.to_string()))?;
        if is_kube_proxy_configuration(text) {
            return Err(err(
                "kind".into(),
                line_of(text, "kind"),
                format!(
                    "this is kube-proxy's configuration (KubeProxyConfiguration), not kxdp's: \
                     run `kxdp config convert {}` to print the equivalent DataplaneConfiguration \
                     (and the fields it cannot carry over)",
                    file.display()
                ),
            ));
        }
        let de = yaml_serde::Deserializer::from_str(text);
        let cfg: DataplaneConfiguration = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            // The field's own line; yaml_serde's position is that of the enclosing value for
            // errors raised by a field's own parser, so it is only the fallback (syntax errors).
            let line = line_of(text, &field).or_else(|| inner.location().map(|l| l.line()));
            let msg = strip_yaml_path(&inner.to_string(), &field);
            err(field.clone(), line, plain_words(&msg, &field))
        })?;
        cfg.validate()
            .map_err(|(f, m)| err(f.clone(), line_of(text, &f), m))?;
        Ok(cfg)
    }
}

/// `nodeName` when the file leaves it empty: `NODE_NAME` (the downward API), else the
/// hostname, lowercased as kube-proxy does.
pub fn default_node_name(configured: &str, env: Option<&str>, hostname: Option<&str>) -> String {
    if !configured.is_empty() {
        return configured.to_string();
    }
    if let Some(n) = env.map(str::trim).filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    hostname
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_default()
}

/// The kernel's hostname (no libc call needed).
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}
