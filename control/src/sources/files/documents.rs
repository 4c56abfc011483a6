//! The fast path of `--state` YAML (the plain way, 47 MB of manifests took 5.7-10.9 s to load,
//! the parser building a JSON tree of every document and a second pass turning it into the typed
//! objects). Here the text is split at its document markers and the documents are decoded on
//! all cores, each straight into its k8s-openapi type in one pass, by `block_yaml.rs` (or
//! `yaml_serde` for what it leaves) read through `typed_yaml.rs` (`typed`), as strictly as the
//! reader reads them.
//!
//! It only ever answers when it is sure to agree with the one-pass reader in `files/mod.rs`: text
//! with directives (`%YAML`), document-end markers (`...`) or a byte-order mark is left to it,
//! and so is any document, or file, with an error of any kind: the reader then parses the file
//! again and names the file, document, object, field and line as before. Errors are rare and
//! the fast path costs at most its own time on them.
//!
//! Splitting is sound because a line starting with `---` followed by a blank (or the end of
//! the line) always starts a document in YAML 1.2 (such a line cannot be scalar content, the
//! spec forbids it as `c-forbidden`); every document therefore lies in one segment.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::model::Object;

/// Below this, one thread (the tests' and small clusters' states): threads cost more than they
/// save.
const PARALLEL_MIN_BYTES: usize = 1 << 20;
/// Decoding threads at most (one per core up to this).
const MAX_THREADS: usize = 8;

/// Decoding threads at most as the application set it (`super::set_max_decode_threads`).
static MAX_DECODE_THREADS: AtomicUsize = AtomicUsize::new(MAX_THREADS);

pub(super) fn set_max_decode_threads(n: usize) {
    MAX_DECODE_THREADS.store(n.clamp(1, MAX_THREADS), Ordering::Relaxed);
}

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
/// decide (see the module docs). Each document passes `crate::yaml::check` before it is parsed.
pub(super) fn load(text: &str, validate: bool) -> Option<Vec<(usize, Object)>> {
    if text.len() > crate::yaml::MAX_BYTES {
        return None;
    }
    let segments = split(text)?;
    let threads = if text.len() < PARALLEL_MIN_BYTES {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_DECODE_THREADS.load(Ordering::Relaxed))
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
    for line in crate::yaml::lines_inclusive(text) {
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
    for (n, line) in crate::yaml::lines(text).enumerate() {
        let b = line.as_bytes();
        if n == 0 && is_marker(b, b"---") {
            let rest = line[3..].trim();
            if rest.is_empty() || rest.starts_with('#') {
                continue;
            }
            return None;
        }
        match b.first() {
            // A `- ` at the left margin is an item of a top-level key's sequence (`ports:` then
            // `- {port: 80}`, as `kubectl` and `kxdp pcap gen` write EndpointSlices): part of
            // a value, like an indented line. (Were the whole document a sequence, no line
            // would name its kind, and the typed decoding refuses a kind it is not.)
            None | Some(b' ' | b'#' | b'-') => continue,
            Some(b'\t' | b'[' | b'{' | b'?' | b'&' | b'!' | b'*' | b'|' | b'>') => return None,
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

/// One document straight into its type, read by `super::subset` (the block style kubectl writes,
/// scalars borrowed) or, for what it leaves, `yaml_serde`, through `super::strict` (every
/// value read as the one-pass reader's JSON values read it: a plain `80` or `true` in a string
/// field, a quoted `"80"` in a number field, a YAML 1.1 `yes` for a boolean are errors there as
/// in the reader), so that a document it accepts is one the reader accepts with the same
/// meaning; anything else goes to the reader. Merge keys (`<<`) and duplicate keys are read as
/// the reader reads them (`<<` an ordinary key, the last duplicate wins), through the same parser.
///
/// This was `serde-saphyr` at first (its `no_schema` options made it as strict), which
/// decodes at 0.38-0.42× the speed of `yaml_serde` (measured on a 30,000-Service state).
fn typed<T: DeserializeOwned>(text: &str) -> Option<Box<T>> {
    decode_typed(text).map(Box::new)
}

/// One segment's objects; `None` on any error (the limits of `crate::yaml::check` included).
fn decode(text: &str, validate: bool) -> Option<SegmentOut> {
    crate::yaml::check(text).ok()?;
    let explicit = is_marker(
        crate::yaml::lines(text).next().unwrap_or("").as_bytes(),
        b"---",
    );
    if !explicit
        && crate::yaml::lines(text).all(|l| {
            let t = l.trim_start();
            t.is_empty() || t.starts_with('#')
        })
    {
        // Comments and blank lines before the first `---` are no document.
        return Some(SegmentOut::default());
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
    let obj = super::object::finish(obj, "", "", validate).ok()?;
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
        super::object::decode_document(v, "", validate, &mut out.objects).ok()?;
    }
    Some(out)
}

/// `T` decoded from one YAML document (`text` holds exactly one) as the one-pass reader would
/// decode it, or `None` when it would not, or might not, decode it the same way. The block
/// subset kubectl writes is read by `super::block_yaml` (scalars borrowed from the text, no event
/// vector), anything else, or anything it does not take, by `yaml_serde`; both through `Strict`.
pub(super) fn decode_typed<T: serde::de::DeserializeOwned>(text: &str) -> Option<T> {
    super::block_yaml::from_str(text).or_else(|| super::typed_yaml::with_yaml_serde(text))
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

    /// Every string field kxdp reads, of every kind it reads, with a plain scalar that the
    /// reader's JSON values read as a number, a boolean or null: the reader refuses it (or, for
    /// null in an optional field, reads it as absent) and the fast path either leaves it to the
    /// reader or reads the same. The same documents with a proper string are taken by both.
    #[test]
    fn as_strict_as_the_one_pass_reader_in_every_string_field() {
        const SVC: &str =
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\n";
        const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: web}\n";
        // (document with `X` where the value goes, a value the reader takes there)
        let fields: Vec<(String, &str)> = vec![
            ("apiVersion: v1\nkind: Service\nmetadata: {name: X}\n".into(), "web"),
            ("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: X}\n".into(), "shop"),
            (format!("{SVC}  labels: {{app: X}}\n"), "web"),
            (format!("{SVC}  annotations: {{a: X}}\n"), "x"),
            (format!("{SVC}  resourceVersion: X\n"), "v7"),
            (format!("{SVC}spec:\n  clusterIP: X\n"), "172.30.0.1"),
            (format!("{SVC}spec:\n  clusterIPs: [X]\n"), "172.30.0.1"),
            (format!("{SVC}spec:\n  type: X\n"), "NodePort"),
            (format!("{SVC}spec:\n  ports: [{{name: X, port: 80}}]\n"), "http"),
            (format!("{SVC}spec:\n  ports: [{{port: 80, protocol: X}}]\n"), "UDP"),
            (format!("{SVC}spec:\n  ports: [{{port: 80, appProtocol: X}}]\n"), "h2c"),
            (format!("{SVC}spec:\n  selector: {{app: X}}\n"), "web"),
            (format!("{SVC}spec:\n  externalIPs: [X]\n"), "192.0.2.1"),
            (format!("{SVC}spec:\n  type: LoadBalancer\n  loadBalancerSourceRanges: [X]\n"), "10.0.0.0/8"),
            (format!("{SVC}spec:\n  sessionAffinity: X\n"), "ClientIP"),
            (format!("{SVC}spec:\n  externalTrafficPolicy: X\n"), "Local"),
            (format!("{SVC}spec:\n  internalTrafficPolicy: X\n"), "Local"),
            (format!("{SVC}spec:\n  ipFamilies: [X]\n"), "IPv4"),
            (format!("{SVC}spec:\n  ipFamilyPolicy: X\n"), "SingleStack"),
            (format!("{SVC}spec:\n  externalName: X\n"), "example.com"),
            (format!("{SVC}spec:\n  trafficDistribution: X\n"), "PreferClose"),
            (format!("{SVC}status:\n  loadBalancer:\n    ingress: [{{ip: X}}]\n"), "192.0.2.9"),
            (format!("{SLICE}addressType: X\n"), "IPv4"),
            (format!("{SLICE}addressType: IPv4\nendpoints: [{{addresses: [X]}}]\n"), "10.0.0.1"),
            (format!("{SLICE}addressType: IPv4\nendpoints: [{{addresses: [10.0.0.1], nodeName: X}}]\n"), "node-1"),
            (format!("{SLICE}addressType: IPv4\nendpoints: [{{addresses: [10.0.0.1], hostname: X}}]\n"), "h"),
            (format!("{SLICE}addressType: IPv4\nendpoints: [{{addresses: [10.0.0.1], zone: X}}]\n"), "z1"),
            (format!("{SLICE}addressType: IPv4\nendpoints: [{{addresses: [10.0.0.1], targetRef: {{kind: Pod, name: X}}}}]\n"), "p"),
            (format!("{SLICE}addressType: IPv4\nendpoints: [{{addresses: [10.0.0.1], hints: {{forZones: [{{name: X}}]}}}}]\n"), "z1"),
            (format!("{SLICE}addressType: IPv4\nports: [{{name: X, port: 80}}]\n"), "http"),
            (format!("{SLICE}addressType: IPv4\nports: [{{port: 80, protocol: X}}]\n"), "TCP"),
            (format!("{SLICE}addressType: IPv4\nports: [{{port: 80, appProtocol: X}}]\n"), "http"),
            ("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: X}}\naddressType: IPv4\n".into(), "web"),
            ("apiVersion: v1\nkind: Node\nmetadata: {name: n, labels: {zone: X}}\n".into(), "z1"),
            ("apiVersion: v1\nkind: Node\nmetadata: {name: n}\nspec: {podCIDR: X, podCIDRs: [10.1.0.0/24]}\n".into(), "10.1.0.0/24"),
            ("apiVersion: v1\nkind: Node\nmetadata: {name: n}\nspec: {podCIDRs: [X]}\n".into(), "10.1.0.0/24"),
            ("apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: X}]}\n".into(), "192.0.2.2"),
            ("apiVersion: v1\nkind: Namespace\nmetadata: {name: n, labels: {team: X}}\n".into(), "a"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a, labels: {app: X}}\nspec: {containers: [{name: c}]}\n".into(), "web"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {nodeName: X, containers: [{name: c}]}\n".into(), "node-1"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{name: X, containerPort: 80}]}]}\n".into(), "http"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 80, protocol: X}]}]}\n".into(), "UDP"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\nstatus: {podIP: X}\n".into(), "10.0.0.5"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\nstatus: {podIPs: [{ip: X}]}\n".into(), "10.0.0.5"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\nstatus: {phase: X}\n".into(), "Running"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {matchLabels: {app: X}}}\n".into(), "web"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {matchExpressions: [{key: X, operator: Exists}]}}\n".into(), "app"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {matchExpressions: [{key: app, operator: In, values: [X]}]}}\n".into(), "web"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, policyTypes: [X]}\n".into(), "Ingress"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: X}}]}]}\n".into(), "10.0.0.0/8"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [X]}}]}]}\n".into(), "10.1.0.0/16"),
            ("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec: {podSelector: {}, ingress: [{ports: [{protocol: X, port: 80}]}]}\n".into(), "UDP"),
            ("apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: c}\nspec: {cidrs: [X]}\n".into(), "10.96.0.0/12"),
        ];
        for (doc, good) in &fields {
            let ok = doc.replace('X', good);
            assert!(agree(&ok), "fast path did not take {ok}");
            // Quoted, anything is a string.
            let quoted = doc.replace('X', "\"80\"");
            let slow =
                super::super::one_pass(&quoted, false, std::path::Path::new("s.yaml"), false);
            if slow.is_ok() {
                assert_eq!(load(&quoted, false).map(Ok), Some(slow), "{quoted}");
            }
            for plain in [
                "80", "true", "False", "1.5", "0x50", "1e3", "-7", "null", "~", ".inf",
            ] {
                let t = doc.replace('X', plain);
                let slow = super::super::one_pass(&t, false, std::path::Path::new("s.yaml"), false);
                if !matches!(plain, "null" | "~" | ".inf") {
                    assert!(slow.is_err(), "the reader took a {plain} string in {t}");
                }
                match load(&t, false) {
                    None => {}
                    Some(fast) => assert_eq!(Ok(fast), slow, "{t}"),
                }
            }
        }
    }

    /// The state files the sync benchmark writes (as `kxdp pcap gen` writes them) are taken
    /// by the fast path whole.
    #[test]
    fn generated_state_files_take_the_fast_path() {
        let mut text = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-0\nstatus:\n  addresses:\n    - {type: InternalIP, address: 192.168.0.2}\n".to_string();
        for i in 0..3 {
            text.push_str(&format!("---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: default\nspec:\n  type: ClusterIP\n  clusterIP: \"172.16.0.{i}\"\n  clusterIPs: [\"172.16.0.{i}\"]\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}\n"));
            text.push_str(&format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{i}-0\n  namespace: default\n  labels: {{kubernetes.io/service-name: svc-{i}}}\naddressType: IPv4\nports:\n- {{name: http, port: 8080, protocol: TCP}}\nendpoints:\n- addresses: [\"10.0.0.{i}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n  nodeName: node-1\n"));
        }
        assert!(agree(&text), "fast path did not take {text}");
    }

    /// A state large enough to be decoded on several threads decodes to the same objects, in
    /// the same order, on one (`set_max_decode_threads(1)`, the musl build's setting).
    #[test]
    fn one_decoding_thread_gives_what_several_give() {
        let mut text = String::new();
        let mut i = 0;
        while text.len() <= PARALLEL_MIN_BYTES * 2 {
            text.push_str(&format!("---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{i}\n  namespace: default\nspec:\n  clusterIP: 172.16.{}.{}\n  ports:\n  - {{name: http, port: 80, protocol: TCP, targetPort: 8080}}\n", i / 250, i % 250));
            i += 1;
        }
        let several = load(&text, true).expect("fast path");
        set_max_decode_threads(1);
        let one = load(&text, true).expect("fast path");
        set_max_decode_threads(MAX_THREADS);
        assert_eq!(several.len(), i);
        let keys = |objs: &[(usize, Object)]| -> Vec<(usize, String)> {
            objs.iter()
                .map(|(d, o)| (*d, format!("{:?}", o.key())))
                .collect()
        };
        assert_eq!(keys(&several), keys(&one));
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
        // A top-level key's sequence at the left margin (EndpointSlices as written by kubectl).
        assert_eq!(
            head("apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nports:\n- {port: 80}\nendpoints:\n- addresses: [10.0.0.1]\n  nodeName: n\n"),
            Some(("discovery.k8s.io/v1", "EndpointSlice"))
        );
        assert_eq!(head("- apiVersion: v1\n  kind: Service\n"), None);
    }
}
