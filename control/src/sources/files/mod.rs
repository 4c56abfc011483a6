//! `--state PATH`: Kubernetes manifests from a file or a directory tree.
//!
//! - A directory is read recursively in path order; only `*.yaml`, `*.yml` and `*.json` files are
//!   read, and entries whose name starts with `.` are skipped (a ConfigMap mounted as a volume
//!   carries `..data`-style links that would otherwise duplicate every file).
//! - A file is multi-document YAML (`---`), or JSON (`.json`: one or more concatenated values).
//! - `kind: List` (and typed lists such as `ServiceList`) contribute their `items`.
//! - Namespaced objects without `metadata.namespace` land in `default`, as `kubectl apply` puts them.
//! - An object whose key was already seen replaces the earlier one (later files win).
//! - Kinds other than those kxdp reads are skipped (logged at debug), as are empty documents.
//! - Only regular files are read: `PATH`, or a `*.yaml`/`*.yml`/`*.json` entry under it, that is a
//!   FIFO, socket or device is refused with an error (reading one could block the source for
//!   ever), and files are opened non-blocking and checked again once open.
//! - YAML text goes through `crate::yaml::check` first (size and nesting limits, linear time).
//! - Services and EndpointSlices go through `crate::validate` (the checks the translation applies):
//!   a field the API server would have refused (an address that is not one, a port out of range,
//!   an unknown protocol) is an error naming file, document, object and field.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::model::{ClusterState, Object};

mod block_yaml;
mod documents;
mod object;
mod typed_yaml;

use object::decode_document;

/// At most `n` threads decode a large `--state` file (default: one per core, up to 8). An
/// application whose global allocator takes one lock for every allocation sets 1: the musl
/// build's dlmalloc (src/main.rs), where two decoding threads contending on its lock took 1.8×
/// the time of one (docs/benchmarks.md, "Control plane at cluster scale", current figures).
pub fn set_max_decode_threads(n: usize) {
    documents::set_max_decode_threads(n);
}

/// One YAML document (`text` holds exactly one) decoded straight into `T` as the fast path of
/// `load_state` decodes it: as strictly as the one-pass reader (`None` where the reader would
/// refuse it or might read it otherwise). For benchmarks (benches/sync.rs `startup`).
pub fn decode_one_document<T: DeserializeOwned>(text: &str) -> Option<T> {
    documents::decode_typed(text)
}

/// A state source that could not be read: names the file, the document and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError {
    pub file: PathBuf,
    /// 0-based index of the document in the file (None for file-level errors).
    pub document: Option<usize>,
    /// `Kind namespace/name` when known.
    pub object: Option<String>,
    /// Field path inside the document (`spec.ports[0].port`); empty when not about one field.
    pub field: String,
    pub message: String,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(d) = self.document {
            write!(f, ": document {d}")?;
        }
        if let Some(o) = &self.object {
            write!(f, " ({o})")?;
        }
        if !self.field.is_empty() && self.field != "." {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for StateError {}

/// Loads every object under `path` into a new `ClusterState`.
pub fn load_state(path: &Path) -> Result<ClusterState, StateError> {
    let (state, times) = load_state_timed(path)?;
    tracing::debug!(
        read_ms = times.read.as_secs_f64() * 1e3,
        decode_ms = times.decode.as_secs_f64() * 1e3,
        store_ms = times.store.as_secs_f64() * 1e3,
        objects = state.len(),
        "state loaded"
    );
    Ok(state)
}

/// Where `load_state`'s time went (summed over the files).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadTimes {
    /// Reading the files into memory.
    pub read: std::time::Duration,
    /// Splitting, checking, parsing and decoding into objects (validation included).
    pub decode: std::time::Duration,
    /// Putting the objects into the store.
    pub store: std::time::Duration,
}

/// `load_state`, with where its time went (for benchmarks and the debug log).
pub fn load_state_timed(path: &Path) -> Result<(ClusterState, LoadTimes), StateError> {
    let mut state = ClusterState::new();
    let mut times = LoadTimes::default();
    for file in collect_files(path)? {
        load_file_timed(&file, &mut state, &mut times)?;
    }
    Ok((state, times))
}

/// The files `load_state` reads, in order.
pub fn collect_files(path: &Path) -> Result<Vec<PathBuf>, StateError> {
    let meta =
        std::fs::metadata(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        refuse_special(path, &meta)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    walk(path, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), StateError> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| file_error(dir, format!("cannot read directory: {e}")))?;
    for entry in rd {
        let entry = entry.map_err(|e| file_error(dir, format!("cannot read directory: {e}")))?;
        let p = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let meta =
            std::fs::metadata(&p).map_err(|e| file_error(&p, format!("cannot read: {e}")))?;
        if meta.is_dir() {
            walk(&p, out)?;
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            refuse_special(&p, &meta)?;
            out.push(p);
        }
    }
    Ok(())
}

/// Anything but a regular file (after symlinks): a FIFO, socket or device.
fn refuse_special(path: &Path, meta: &std::fs::Metadata) -> Result<(), StateError> {
    if meta.is_file() {
        return Ok(());
    }
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let what = if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(file_error(
        path,
        format!("is {what}, not a regular file or directory: refusing to read it"),
    ))
}

fn file_error(file: &Path, message: String) -> StateError {
    StateError {
        file: file.to_path_buf(),
        document: None,
        object: None,
        field: String::new(),
        message,
    }
}

/// Reads one file into `state`.
pub fn load_file(file: &Path, state: &mut ClusterState) -> Result<(), StateError> {
    load_file_timed(file, state, &mut LoadTimes::default())
}

fn load_file_timed(
    file: &Path,
    state: &mut ClusterState,
    times: &mut LoadTimes,
) -> Result<(), StateError> {
    let t = std::time::Instant::now();
    let text = read_regular(file)?;
    times.read += t.elapsed();
    let is_json = file.extension().and_then(|e| e.to_str()) == Some("json");
    load_str_with(&text, is_json, file, state, true, times)
}

/// Reads a regular file of at most `yaml::MAX_BYTES`. Opened with `O_NONBLOCK`, so a FIFO put in
/// its place since it was listed cannot block the caller, and checked again once open.
fn read_regular(file: &Path) -> Result<String, StateError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| file_error(file, format!("cannot read: {e}"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)
        .map_err(cannot)?;
    let meta = f.metadata().map_err(cannot)?;
    refuse_special(file, &meta)?;
    if meta.len() > crate::yaml::MAX_BYTES as u64 {
        let e = crate::yaml::LimitError::TooLarge { bytes: meta.len() };
        return Err(file_error(file, e.to_string()));
    }
    let mut text = String::with_capacity(meta.len() as usize);
    // A file growing while read stops at the limit (and fails the check below).
    f.take(crate::yaml::MAX_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    Ok(text)
}

/// Parses manifests text (`file` names it in errors) into `state`.
pub fn load_str(
    text: &str,
    is_json: bool,
    file: &Path,
    state: &mut ClusterState,
) -> Result<(), StateError> {
    load_str_with(text, is_json, file, state, true, &mut LoadTimes::default())
}

/// `load_str` without the `crate::validate` checks: for tests of how the translation treats
/// objects those checks would refuse (objects from the API server are not checked here).
#[cfg(test)]
pub(crate) fn load_str_unvalidated(
    text: &str,
    file: &Path,
    state: &mut ClusterState,
) -> Result<(), StateError> {
    load_str_with(text, false, file, state, false, &mut LoadTimes::default())
}

fn load_str_with(
    text: &str,
    is_json: bool,
    file: &Path,
    state: &mut ClusterState,
    validate: bool,
    times: &mut LoadTimes,
) -> Result<(), StateError> {
    let t = std::time::Instant::now();
    let objects = if is_json {
        one_pass(text, true, file, validate)?
    } else {
        // The size and nesting limits (`crate::yaml::check`) hold before any parsing: the fast
        // path checks each document before parsing it, on its decoding threads (the check is
        // reset at every `---` line, so the documents' checks are the whole text's); the
        // one-pass reader checks the whole text. Something the fast path does not take, or an
        // error: the one-pass reader decides, and names the document, object, field and line.
        match documents::load(text, validate) {
            Some(objects) => objects,
            None => {
                crate::yaml::check(text).map_err(|e| file_error(file, e.to_string()))?;
                one_pass(text, false, file, validate)?
            }
        }
    };
    times.decode += t.elapsed();
    let t = std::time::Instant::now();
    for (index, obj) in objects {
        let key = obj.key();
        if state.apply(obj) {
            tracing::debug!(file = %file.display(), document = index, %key, "object replaces an earlier one with the same key");
        }
    }
    times.store += t.elapsed();
    Ok(())
}

/// Every object of the text with its document's index, one document after the other, through
/// JSON values (YAML text has passed `crate::yaml::check`).
fn one_pass(
    text: &str,
    is_json: bool,
    file: &Path,
    validate: bool,
) -> Result<Vec<(usize, Object)>, StateError> {
    let mut out = Vec::new();
    for (index, doc) in documents(text, is_json, file)?.into_iter().enumerate() {
        let mut objects = Vec::new();
        decode_document(doc, "", validate, &mut objects).map_err(|(object, field, message)| {
            StateError {
                file: file.to_path_buf(),
                document: Some(index),
                object,
                field,
                message,
            }
        })?;
        out.extend(objects.into_iter().map(|o| (index, o)));
    }
    Ok(out)
}

/// Splits text into documents (as JSON values: manifests are JSON-compatible).
fn documents(text: &str, is_json: bool, file: &Path) -> Result<Vec<Value>, StateError> {
    let mut docs = Vec::new();
    if is_json {
        for (i, v) in serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .enumerate()
        {
            let v = v.map_err(|e| StateError {
                file: file.to_path_buf(),
                document: Some(i),
                object: None,
                field: String::new(),
                message: format!("invalid JSON: {e}"),
            })?;
            docs.push(v);
        }
    } else {
        // `crate::yaml::check` has passed (`load_str_with`).
        for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
            // Once the parser fails it keeps yielding the same error: stop at the first.
            let v = Value::deserialize(de).map_err(|e| StateError {
                file: file.to_path_buf(),
                document: Some(i),
                object: None,
                field: String::new(),
                message: format!("invalid YAML: {e}"),
            })?;
            docs.push(v);
        }
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjectKey;

    fn parse(text: &str) -> Result<ClusterState, StateError> {
        let mut st = ClusterState::new();
        load_str(text, false, Path::new("state.yaml"), &mut st)?;
        Ok(st)
    }

    const SVC: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 172.30.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

    #[test]
    fn multi_document_yaml() {
        let text = format!(
            "{SVC}---\napiVersion: v1\nkind: Node\nmetadata: {{name: node-a}}\n---\n# only a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n"
        );
        let st = parse(&text).unwrap();
        assert_eq!(st.services.len(), 1);
        let svc = &st.services[&ObjectKey::new("shop", "web")];
        assert_eq!(
            svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("172.30.0.10")
        );
        assert!(st.nodes.contains_key("node-a"));
        assert!(st.namespaces.contains_key("shop"));
        assert_eq!(st.len(), 3);
    }

    #[test]
    fn list_items() {
        let st = parse(
            r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: a}
  spec: {clusterIP: 172.30.0.1}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: a-1, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: [{addresses: [10.0.0.1]}]
"#,
        )
        .unwrap();
        // No namespace: `default`, like kubectl.
        assert!(st.services.contains_key(&ObjectKey::new("default", "a")));
        assert_eq!(st.slices_of(&ObjectKey::new("default", "a")).count(), 1);
    }

    #[test]
    fn json_documents() {
        let mut st = ClusterState::new();
        let text = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}
{"apiVersion":"v1","kind":"ServiceList","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"x"},"spec":{"clusterIP":"172.30.0.2"}}]}"#;
        load_str(text, true, Path::new("s.json"), &mut st).unwrap();
        assert!(st.nodes.contains_key("n1"));
        assert!(st.services.contains_key(&ObjectKey::new("x", "s")));
    }

    #[test]
    fn all_kinds_and_ignored_kinds() {
        let st = parse(
            r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: a}
spec: {containers: [{name: c}]}
status: {podIP: 10.0.0.5}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: a}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: extra}
spec: {cidrs: [172.31.0.0/16]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec: {whatever: [1, 2]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {a: b}
---
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old}
"#,
        )
        .unwrap();
        assert_eq!(st.pods.len(), 1);
        assert_eq!(st.network_policies.len(), 1);
        assert_eq!(st.service_cidrs.len(), 1);
        assert_eq!(st.len(), 3);
    }

    #[test]
    fn invalid_object_names_file_document_and_field() {
        let text = format!("{SVC}---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad, namespace: shop}}\nspec:\n  ports:\n  - port: eighty\n");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.document, Some(1));
        assert_eq!(e.field, "spec.ports[0].port");
        let s = e.to_string();
        assert!(
            s.starts_with(
                "state.yaml: document 1 (Service shop/bad): spec.ports[0].port: invalid type"
            ),
            "{s}"
        );
    }

    #[test]
    fn invalid_list_item_path() {
        let e = parse(
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Node\n  metadata: {name: n}\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n  spec: {clusterIPs: 5}\n",
        )
        .unwrap_err();
        assert_eq!(e.document, Some(0));
        assert_eq!(e.field, "items[1].spec.clusterIPs");
    }

    #[test]
    fn missing_kind_and_name() {
        let e = parse("apiVersion: v1\nmetadata: {name: x}\n").unwrap_err();
        assert_eq!(e.field, "kind");
        let e = parse("apiVersion: v1\nkind: Service\nmetadata: {namespace: x}\n").unwrap_err();
        assert_eq!(e.field, "metadata.name");
        let e = parse("- a\n- b\n").unwrap_err();
        assert!(e.message.contains("expected an object"), "{e}");
    }

    #[test]
    fn wrong_api_version_of_known_kind_is_ignored() {
        let st = parse("apiVersion: v2\nkind: Service\nmetadata: {name: x}\n").unwrap();
        assert!(st.is_empty());
    }

    #[test]
    fn yaml_syntax_error() {
        let e = parse(&format!("{SVC}---\nkind: [unclosed\n")).unwrap_err();
        assert_eq!(e.document, Some(1));
        assert!(e.message.starts_with("invalid YAML"), "{e}");
    }

    #[test]
    fn directory_recursive_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("b/sub")).unwrap();
        std::fs::create_dir_all(p.join(".hidden")).unwrap();
        let svc = |ip: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: s, namespace: n}}\nspec: {{clusterIP: {ip}}}\n")
        };
        std::fs::write(p.join("a.yaml"), svc("172.30.0.1")).unwrap();
        std::fs::write(p.join("b/sub/z.yml"), svc("172.30.0.3")).unwrap();
        std::fs::write(p.join("b/c.json"), r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"n"},"spec":{"clusterIP":"172.30.0.2"}}"#).unwrap();
        std::fs::write(p.join(".hidden/x.yaml"), svc("172.30.0.9")).unwrap();
        std::fs::write(p.join("README.md"), "not yaml: [").unwrap();
        let files = collect_files(p).unwrap();
        let rel: Vec<_> = files
            .iter()
            .map(|f| f.strip_prefix(p).unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(rel, vec!["a.yaml", "b/c.json", "b/sub/z.yml"]);
        // Later files replace earlier objects with the same key.
        let st = load_state(p).unwrap();
        let svc = &st.services[&ObjectKey::new("n", "s")];
        assert_eq!(
            svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
            Some("172.30.0.3")
        );
    }

    #[test]
    fn single_file_and_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.txt");
        std::fs::write(&f, SVC).unwrap();
        assert_eq!(load_state(&f).unwrap().services.len(), 1);
        let e = load_state(&dir.path().join("nope")).unwrap_err();
        assert!(e.to_string().contains("nope: cannot read"), "{e}");
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_fifo_is_refused_not_read() {
        // Read, a FIFO in place of the state file would block the file source for ever.
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("state.yaml");
        mkfifo(&fifo);
        let err = load_state(&fifo).unwrap_err();
        assert_eq!(err.file, fifo);
        assert!(err.message.contains("FIFO"), "{err}");
        // Inside a directory too, when it would be read.
        std::fs::write(dir.path().join("a.yaml"), SVC).unwrap();
        let err = load_state(dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("is a FIFO (named pipe), not a regular file"),
            "{err}"
        );
        // A FIFO the loader would not read anyway is no error.
        std::fs::remove_file(&fifo).unwrap();
        mkfifo(&dir.path().join("notes.txt"));
        assert_eq!(load_state(dir.path()).unwrap().services.len(), 1);
    }

    #[test]
    fn deep_nesting_is_refused_before_parsing() {
        let text = format!("{SVC}---\nitems: {}", "[".repeat(200_000));
        let err = parse(&text).unwrap_err();
        assert!(
            err.to_string().contains("nested deeper than 100 levels"),
            "{err}"
        );
        assert!(err.to_string().starts_with("state.yaml: line 9"), "{err}");
    }

    #[test]
    fn invalid_service_or_slice_names_file_document_object_and_field() {
        let bad_ip = SVC.replace("172.30.0.10", "172.30.0.300");
        let e = parse(&format!("{SVC}---\n{bad_ip}")).unwrap_err();
        assert_eq!(e.document, Some(1));
        assert_eq!(e.object.as_deref(), Some("Service shop/web"));
        assert_eq!(e.field, "spec.clusterIP");
        assert_eq!(
            e.to_string(),
            "state.yaml: document 1 (Service shop/web): spec.clusterIP: `172.30.0.300` is not a valid IP address"
        );
        let bad_port = SVC.replace("port: 80,", "port: 70000,");
        let e = parse(&bad_port).unwrap_err();
        assert_eq!(
            (e.document, e.field.as_str()),
            (Some(0), "spec.ports[0].port")
        );
        let bad_proto = SVC.replace("port: 80,", "port: 80, protocol: ICMP,");
        let e = parse(&bad_proto).unwrap_err();
        assert!(
            e.to_string()
                .contains("spec.ports[0].protocol: `ICMP` is not TCP, UDP or SCTP"),
            "{e}"
        );
        // Inside a List the field path includes the item.
        let list = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {name: web-1, namespace: shop}\n  addressType: IPv4\n  endpoints: [{addresses: [10.0.0.999]}]\n";
        let e = parse(list).unwrap_err();
        assert_eq!(e.field, "items[0].endpoints[0].addresses[0]");
        assert_eq!(e.object.as_deref(), Some("EndpointSlice shop/web-1"));
    }
}
