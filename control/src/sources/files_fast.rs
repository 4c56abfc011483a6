//! The fast path of `--state` YAML (issue 14: 47 MB of manifests took 5.7-10.9 s to load, the
//! parser building a JSON tree of every document and a second pass turning it into the typed
//! objects). Here the text is split at its document markers and the documents are decoded on
//! all cores, each straight into its k8s-openapi type in one pass, by `serde-saphyr` (`typed`),
//! as strictly as the reader reads them.
//!
//! It only ever answers when it is sure to agree with the one-pass reader in `files.rs`: text
//! with directives (`%YAML`), document-end markers (`...`) or a byte-order mark is left to it,
//! and so is any document, or file, with an error of any kind: the reader then parses the file
//! again and names the file, document, object, field and line as before. Errors are rare and
//! the fast path costs at most its own time on them.
//!
//! Splitting is sound because a line starting with `---` followed by a blank (or the end of
//! the line) always starts a document in YAML 1.2 (such a line cannot be scalar content, the
//! spec forbids it as `c-forbidden`); every document therefore lies in one segment.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::model::Object;

/// Below this, one thread (the tests' and small clusters' states): threads cost more than they
/// save.
const PARALLEL_MIN_BYTES: usize = 1 << 20;
/// Decoding threads at most (one per core up to this).
const MAX_THREADS: usize = 8;

/// One document's text (with its `---` line, if any).
struct Segment<'a> {
    text: &'a str,
}

/// What one segment held: its documents (0 or 1) and their objects.
#[derive(Default)]
struct SegmentOut {
    documents: usize,
    objects: Vec<Object>,
}

/// The objects of `text` with their document index, or `None` when the one-pass reader must
/// decide (see the module docs). `text` has passed `crate::yaml::check`.
pub(super) fn load(text: &str, validate: bool) -> Option<Vec<(usize, Object)>> {
    let segments = split(text)?;
    let threads = if text.len() < PARALLEL_MIN_BYTES {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)
    };
    let failed = AtomicBool::new(false);
    let outs: Vec<SegmentOut> = if threads == 1 {
        decode_all(&segments, validate, &failed)?
    } else {
        // Contiguous runs of segments of about equal bytes, one per thread, in order.
        let per = text.len() / threads + 1;
        let mut chunks: Vec<&[Segment<'_>]> = Vec::with_capacity(threads);
        let (mut start, mut bytes) = (0, 0);
        for (i, s) in segments.iter().enumerate() {
            bytes += s.text.len();
            if bytes >= per {
                chunks.push(&segments[start..=i]);
                (start, bytes) = (i + 1, 0);
            }
        }
        chunks.push(&segments[start..]);
        let results: Vec<Option<Vec<SegmentOut>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunks
                .iter()
                .map(|chunk| {
                    let failed = &failed;
                    scope.spawn(move || decode_all(chunk, validate, failed))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().ok().flatten())
                .collect()
        });
        let mut all = Vec::with_capacity(segments.len());
        for r in results {
            all.extend(r?);
        }
        all
    };
    let mut out = Vec::with_capacity(outs.len());
    let mut index = 0;
    for seg in outs {
        for obj in seg.objects {
            out.push((index, obj));
        }
        index += seg.documents;
    }
    Some(out)
}

fn decode_all(
    segments: &[Segment<'_>],
    validate: bool,
    failed: &AtomicBool,
) -> Option<Vec<SegmentOut>> {
    let mut out = Vec::with_capacity(segments.len());
    for s in segments {
        if failed.load(Ordering::Relaxed) {
            return None;
        }
        match decode(s.text, validate) {
            Some(o) => out.push(o),
            None => {
                failed.store(true, Ordering::Relaxed);
                return None;
            }
        }
    }
    Some(out)
}

/// Whether `line` (without its line break) is a document marker (`---` or `...`) line.
fn is_marker(line: &[u8], marker: &[u8]) -> bool {
    line.starts_with(marker) && matches!(line.get(3), None | Some(b' ' | b'\t' | b'\r'))
}

/// The text cut before every `---` line; `None` if the text has what the split does not handle.
fn split(text: &str) -> Option<Vec<Segment<'_>>> {
    if text.starts_with('\u{feff}') {
        return None;
    }
    let mut out = Vec::new();
    let (mut start, mut pos) = (0, 0);
    for line in text.split_inclusive('\n') {
        let b = line.trim_end_matches('\n').as_bytes();
        if b.first() == Some(&b'%') || is_marker(b, b"...") {
            return None;
        }
        if is_marker(b, b"---") && pos > start {
            out.push(Segment {
                text: &text[start..pos],
            });
            start = pos;
        }
        pos += line.len();
    }
    if pos > start {
        out.push(Segment {
            text: &text[start..pos],
        });
    }
    Some(out)
}

/// The document's top-level `apiVersion` and `kind`, when the text says them plainly (a
/// block mapping at the top, plain values). Anything else: `None` (the generic decoder reads it).
fn head(text: &str) -> Option<(&str, &str)> {
    let (mut api_version, mut kind) = (None, None);
    for (n, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        if n == 0 && is_marker(b, b"---") {
            let rest = line[3..].trim();
            if rest.is_empty() || rest.starts_with('#') {
                continue;
            }
            return None;
        }
        match b.first() {
            None | Some(b' ' | b'#') => continue,
            Some(b'\t' | b'-' | b'[' | b'{' | b'?' | b'&' | b'!' | b'*' | b'|' | b'>') => {
                return None
            }
            _ => {}
        }
        let value = |key: &str| -> Option<Option<&str>> {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            let v = rest.split(" #").next().unwrap_or("").trim();
            let plain = !v.is_empty()
                && v.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'/' | b'-'));
            Some(plain.then_some(v))
        };
        if let Some(v) = value("apiVersion") {
            if api_version.is_some() {
                return None;
            }
            api_version = Some(v?);
        } else if let Some(v) = value("kind") {
            if kind.is_some() {
                return None;
            }
            kind = Some(v?);
        }
    }
    Some((api_version?, kind?))
}

/// One document straight into its type, with `serde-saphyr` (a pure-Rust YAML parser that
/// deserialises from its event stream without building a tree). Chosen for strictness, not
/// speed: measured on a quiet machine it decodes at 0.38-0.42× the speed of `yaml_serde`
/// (docs/benchmarks.md, "Session 4: the merged tree on a quiet machine"), which cannot be made
/// to refuse a plain `80` in a string field. Its options make it exactly as strict
/// as the one-pass reader, which goes through JSON values, so that a document it accepts is one
/// the reader accepts with the same meaning; anything else goes to the reader:
///
/// - `no_schema`: a plain scalar that reads as a boolean or a number (`true`, `80`) in a string
///   field is an error, as a JSON `true` or `80` is for a string (by default it would be taken as
///   the text `"true"`/`"80"`);
/// - `strict_booleans`: only YAML 1.2 booleans are booleans (`yes`/`on` are strings, as in the
///   reader);
/// - merge keys (`<<`) and duplicate keys are errors here (the reader decides about them);
/// - no budget and no comments or snippets: `crate::yaml::check` has bounded the text already,
///   and an error is only a signal to hand the document over.
/// - a document with a quoted scalar that reads as a number or a boolean (`"80"`, `'true'`) is
///   decoded through JSON values as the reader does (`generic`, see `decode`): serde-saphyr
///   would read `"80"` into a number field, which the reader rejects, and no option turns that
///   off. Such documents are few (a Pod's `pod-template-generation: "1"` label), and only they
///   take the slower path.
fn typed<T: DeserializeOwned>(text: &str) -> Option<Box<T>> {
    serde_saphyr::from_str_with_options(text, saphyr_options())
        .ok()
        .map(Box::new)
}

/// Whether a quoted scalar of `text` may read as a number or a boolean. Every quote character
/// is tried as an opening quote up to the next one on its line, so an apostrophe in a plain
/// scalar cannot hide a real quoted scalar (it can only add a candidate, which errs towards the
/// reader).
fn quoted_non_string(text: &str) -> bool {
    let looks_typed = |c: &str| {
        let c = c.trim();
        let digits: String = c.chars().filter(|&ch| ch != '_').collect();
        !c.is_empty()
            && (digits.parse::<i128>().is_ok()
                || digits.parse::<f64>().is_ok()
                || matches!(c.to_ascii_lowercase().as_str(), "true" | "false")
                || ["0x", "0o", "0b", "+0x", "-0x"]
                    .iter()
                    .any(|p| c.to_ascii_lowercase().starts_with(p)))
    };
    for line in text.lines() {
        if !line.contains(['"', '\'']) {
            continue;
        }
        for (i, q) in line.char_indices().filter(|&(_, c)| c == '"' || c == '\'') {
            let rest = &line[i + 1..];
            if let Some(end) = rest.find(q) {
                if looks_typed(&rest[..end]) {
                    return true;
                }
            }
        }
    }
    false
}

fn saphyr_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.no_schema = true;
    o.strict_booleans = true;
    o.merge_keys = serde_saphyr::MergeKeyPolicy::Error;
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    o.budget = None;
    o.emit_comments = false;
    o.with_snippet = false;
    o
}

/// One segment's objects; `None` on any error.
fn decode(text: &str, validate: bool) -> Option<SegmentOut> {
    let explicit = is_marker(text.lines().next().unwrap_or("").as_bytes(), b"---");
    if !explicit
        && text.lines().all(|l| {
            let t = l.trim_start();
            t.is_empty() || t.starts_with('#')
        })
    {
        // Comments and blank lines before the first `---` are no document.
        return Some(SegmentOut::default());
    }
    if quoted_non_string(text) {
        return generic(text, validate);
    }
    let obj = match head(text) {
        Some(("v1", "Node")) => Object::Node(typed(text)?),
        Some(("v1", "Namespace")) => Object::Namespace(typed(text)?),
        Some(("v1", "Pod")) => Object::Pod(typed(text)?),
        Some(("v1", "Service")) => Object::Service(typed(text)?),
        Some(("discovery.k8s.io/v1", "EndpointSlice")) => Object::EndpointSlice(typed(text)?),
        Some(("networking.k8s.io/v1", "NetworkPolicy")) => Object::NetworkPolicy(typed(text)?),
        Some(("networking.k8s.io/v1", "ServiceCIDR")) => Object::ServiceCidr(typed(text)?),
        _ => return generic(text, validate),
    };
    let obj = super::finish(obj, "", "", validate).ok()?;
    Some(SegmentOut {
        documents: 1,
        objects: vec![obj],
    })
}

/// Any other document (other kinds, lists, flow style, empty documents): through a JSON tree, as
/// the one-pass reader does.
fn generic(text: &str, validate: bool) -> Option<SegmentOut> {
    let mut out = SegmentOut::default();
    for de in yaml_serde::Deserializer::from_str(text) {
        let v = <Value as serde::Deserialize>::deserialize(de).ok()?;
        out.documents += 1;
        super::decode_document(v, "", validate, &mut out.objects).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_at_markers_only() {
        let text = "# head\n---\na: 1\n--- # c\nb: |\n  ---x\n---\n";
        let s: Vec<&str> = split(text).unwrap().iter().map(|s| s.text).collect();
        assert_eq!(
            s,
            vec![
                "# head\n",
                "---\na: 1\n",
                "--- # c\nb: |\n  ---x\n",
                "---\n"
            ]
        );
        assert!(split("a: 1\n...\n---\nb: 2\n").is_none());
        assert!(split("%YAML 1.2\n---\na: 1\n").is_none());
        assert_eq!(split("a: 1\n----\n").unwrap().len(), 1);
    }

    /// The fast path gives what the one-pass reader gives (objects, document indexes), or
    /// leaves the text to it.
    fn agree(text: &str) -> bool {
        let slow = super::super::one_pass(text, false, std::path::Path::new("s.yaml"), true);
        match load(text, true) {
            Some(fast) => {
                assert_eq!(Ok(fast), slow, "{text}");
                true
            }
            None => false,
        }
    }

    #[test]
    fn agrees_with_the_one_pass_reader() {
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 172.30.0.10\n  ports: [{name: http, port: 80, targetPort: 8080}]\n";
        let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nendpoints:\n- addresses: [10.0.0.1]\n";
        let texts = [
            format!("{svc}---\n{slice}"),
            format!("# leading comment\n---\n{svc}---\n# only a comment\n---\n{slice}---\n"),
            format!("---\n{svc}---\napiVersion: v1\nkind: List\nitems:\n- {{apiVersion: v1, kind: Node, metadata: {{name: n}}}}\n---\n{slice}"),
            format!("{svc}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d}}\n---\n--- {{apiVersion: v1, kind: Namespace, metadata: {{name: x}}}}\n"),
            format!("{svc}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: a}}\nspec: {{containers: [{{name: c}}]}}\n"),
        ];
        for t in &texts {
            assert!(agree(t), "fast path did not take {t}");
        }
        // Errors are the one-pass reader's.
        let bad = format!("{svc}---\napiVersion: v1\nkind: Service\nmetadata: {{name: bad}}\nspec:\n  ports:\n  - port: eighty\n");
        assert!(!agree(&bad));
        assert!(!agree(&format!("{svc}---\nkind: [unclosed\n")));
        assert!(!agree(&svc.replace("172.30.0.10", "172.30.0.300")));
    }

    /// The known difference is gone: what the one-pass reader rejects (a plain `true` or `80`
    /// in a string field, a quoted number in a number field, a YAML 1.1 `yes` for a boolean,
    /// merge keys) the fast path leaves to it; and what they both accept reads the same.
    #[test]
    fn as_strict_as_the_one_pass_reader() {
        let svc = |spec: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec:\n{spec}")
        };
        let slice = |ep: &str| {
            format!("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: shop}}\naddressType: IPv4\nendpoints:\n- {ep}\n")
        };
        let rejected = [
            svc("  clusterIP: 80\n"),
            svc("  clusterIP: true\n"),
            svc("  type: 1.5\n"),
            svc("  ports: [{name: 80, port: 80}]\n"),
            svc("  ports: [{name: http, port: \"80\"}]\n"),
            svc("  ports: [{name: http, port: 80.0}]\n"),
            svc("  ports: [{name: http, port: 0x50}]\n"),
            svc("  ports: [{name: http, port: 80, protocol: null}]\n  clusterIP: null\n  type: ~\n  selector: {app: true}\n"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: true}\n".to_string(),
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, labels: {a: 1}}\n".to_string(),
            slice("{addresses: [10.0.0.1], conditions: {ready: yes}}"),
            slice("{addresses: [10.0.0.1], conditions: {ready: \"true\"}}"),
            slice("{addresses: [10.0.0.1], nodeName: 12}"),
            format!("{}---\n{}", svc("  clusterIP: 172.30.0.1\n"), slice("{addresses: [10.0.0.1], nodeName: false}")),
            "apiVersion: v1\nkind: Service\nmetadata: &m {name: web}\nspec:\n  <<: {clusterIP: 172.30.0.1}\n".to_string(),
            svc("  clusterIP: 172.30.0.1\n  clusterIP: 172.30.0.2\n"),
            svc("  ports: [{name: \"80\", port: 80}]\n  selector: {app: \"true\"}\n"),
        ];
        for t in &rejected {
            let slow = super::super::one_pass(t, false, std::path::Path::new("s.yaml"), true);
            let fast = load(t, true);
            assert!(
                fast.is_none() || Ok(fast.clone().unwrap()) == slow,
                "fast path accepted what the reader reads otherwise: {t}\nfast: {fast:?}\nreader: {slow:?}"
            );
        }
        // Strings that only look like other things, quoted or not, read the same both ways.
        let accepted = [
            svc("  clusterIP: \"172.30.0.1\"\n  type: 'ClusterIP'\n  ports: [{name: \"p80\", port: 80, targetPort: 8080}, {name: \"yes\", port: 81, targetPort: http}]\n  selector: {app: \"it's\", on: yes, tier: null-ish}\n"),
            slice("{addresses: [\"10.0.0.1\"], conditions: {ready: true, serving: false, terminating: FALSE}, nodeName: node-1}"),
        ];
        for t in &accepted {
            assert!(agree(t), "fast path did not take {t}");
        }
    }

    #[test]
    fn quoted_numbers_and_booleans_are_left_to_the_reader() {
        for t in [
            "port: \"80\"\n",
            "a: '1_000'\n",
            "a: [\"0x50\"]\n",
            "x: it's \"true\"\n",
        ] {
            assert!(quoted_non_string(t), "{t}");
        }
        for t in [
            "clusterIP: \"172.30.0.1\"\n",
            "a: [\"10.0.0.1\"]\n",
            "n: \"web-1\"\n",
            "d: it's\n",
        ] {
            assert!(!quoted_non_string(t), "{t}");
        }
    }

    #[test]
    fn head_reads_plain_top_level_keys() {
        assert_eq!(
            head("---\napiVersion: v1\nmetadata:\n  kind: x\nkind: Service # c\n"),
            Some(("v1", "Service"))
        );
        assert_eq!(head("kind: \"Service\"\napiVersion: v1\n"), None);
        assert_eq!(head("--- {kind: Service, apiVersion: v1}\n"), None);
        assert_eq!(head("kind: Service\nkind: Pod\napiVersion: v1\n"), None);
    }
}
