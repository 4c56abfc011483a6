//! deploy/: every manifest parses into its k8s-openapi type (and round-trips: no misspelt or
//! unknown field survives), the ClusterRole grants exactly the requests the code makes (found in
//! the source, control/src/sources/kube.rs's table), the ConfigMap holds a valid
//! DataplaneConfiguration, the DaemonSet is wired as docs/operations.md says, and every CNI
//! overlay only adds its interfaces to the base.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::serde::Serialize;
use serde_json::Value;

#[derive(Default)]
struct Objects {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    bindings: Vec<ClusterRoleBinding>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
}

/// Drops nulls and empty objects (what a typed round trip cannot tell from absent).
fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), normalize(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        v => v.clone(),
    }
}

fn typed<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: {}: {e}", doc["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    assert_eq!(
        normalize(&back),
        normalize(doc),
        "{file}: {} does not round-trip (unknown or misspelt field?)",
        doc["kind"]
    );
    t
}

fn load() -> Objects {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut o = Objects::default();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        for de in yaml_serde::Deserializer::from_str(&text) {
            let doc: Value = k8s_openapi::serde::Deserialize::deserialize(de)
                .unwrap_or_else(|e| panic!("{file}: invalid YAML: {e}"));
            if doc.is_null() {
                continue;
            }
            match (doc["apiVersion"].as_str(), doc["kind"].as_str()) {
                (Some("v1"), Some("Namespace")) => o.namespaces.push(typed(&file, &doc)),
                (Some("v1"), Some("ServiceAccount")) => o.service_accounts.push(typed(&file, &doc)),
                (Some("v1"), Some("ConfigMap")) => o.config_maps.push(typed(&file, &doc)),
                (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRole")) => {
                    o.cluster_roles.push(typed(&file, &doc))
                }
                (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRoleBinding")) => {
                    o.bindings.push(typed(&file, &doc))
                }
                (Some("apps/v1"), Some("DaemonSet")) => o.daemon_sets.push(typed(&file, &doc)),
                other => panic!("{file}: unexpected object {other:?}"),
            }
        }
    }
    o
}

/// The source files (control/src, src) that build an API client call.
fn rust_sources() -> Vec<(std::path::PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    for d in ["control/src", "src", "dataplane/src", "kernel/src"] {
        walk(&root().join(d), &mut out);
    }
    out
}

/// The API requests the source makes, found by reading it: each `kube::Api` it builds (bound to
/// a variable: `let NAME... = Api::...`), its resource (`Api::<Kind>`: that kind; otherwise the
/// resource of a watch spec, `kube::specs`), and the calls on that variable.
fn requests_in_source() -> BTreeSet<(String, String, String)> {
    let watched: Vec<(String, String)> = kxdp_control::sources::kube::specs("")
        .iter()
        .map(|s| (s.resource.group.clone(), s.resource.plural.clone()))
        .collect();
    let verbs_of = |text: &str, var: &str| -> BTreeSet<&'static str> {
        let mut v = BTreeSet::new();
        for (call, verbs) in [
            ("watcher::watcher({var}", &["list", "watch"][..]),
            ("metadata_watcher({var}", &["list", "watch"]),
            ("{var}.get(", &["get"]),
            ("{var}.get_opt(", &["get"]),
            ("{var}.get_metadata(", &["get"]),
            ("{var}.get_metadata_opt(", &["get"]),
            ("{var}.list(", &["list"]),
            ("{var}.list_metadata(", &["list"]),
            ("{var}.watch(", &["watch"]),
            ("{var}.create(", &["create"]),
            ("{var}.patch(", &["patch"]),
            ("{var}.patch_status(", &["patch"]),
            ("{var}.replace(", &["update"]),
            ("{var}.delete(", &["delete"]),
            ("{var}.delete_collection(", &["deletecollection"]),
            ("{var}.entry(", &["get", "create", "update"]),
        ] {
            if text.contains(&call.replace("{var}", var)) {
                v.extend(verbs);
            }
        }
        v
    };
    let mut found = BTreeSet::new();
    let mut clients = 0;
    for (path, text) in rust_sources() {
        let mut prev = "";
        for line in text.lines() {
            let l = line.trim();
            // `let NAME: Type =` on the line before (rustfmt's break).
            let binding = if l.starts_with("let ") || !prev.ends_with('=') {
                l
            } else {
                prev
            };
            prev = l;
            if l.starts_with("//") || l.starts_with("use ") || !l.contains("Api::") {
                continue;
            }
            let Some(ctor) = [
                "Api::<",
                "Api::all",
                "Api::namespaced",
                "Api::default_namespaced",
            ]
            .iter()
            .find_map(|c| l.find(c)) else {
                continue;
            };
            clients += 1;
            let var = binding
                .strip_prefix("let ")
                .and_then(|r| r.split([':', ' ', '=']).next())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| {
                    panic!(
                        "{}: `{l}`: an API client not bound by `let NAME = ...`: the requests it makes cannot be read here",
                        path.display()
                    )
                });
            let resources: Vec<(String, String)> = if l[ctor..].starts_with("Api::<") {
                let kind = l[ctor + 6..].split('>').next().unwrap();
                let kind = kind.rsplit("::").next().unwrap();
                // A kind kxdp watches has its group and plural there; another is named so
                // that the comparison below fails and says which.
                let known = kxdp_control::sources::kube::specs("")
                    .into_iter()
                    .find(|s| s.resource.kind == kind)
                    .map(|s| (s.resource.group, s.resource.plural));
                vec![known.unwrap_or_else(|| (format!("(group of {kind})"), kind.to_lowercase()))]
            } else {
                watched.clone()
            };
            let verbs = verbs_of(&text, var);
            assert!(
                !verbs.is_empty(),
                "{}: `{l}`: no request found on `{var}`",
                path.display()
            );
            for (g, r) in &resources {
                for v in &verbs {
                    found.insert((g.clone(), r.clone(), v.to_string()));
                }
            }
        }
    }
    assert!(clients >= 3, "{clients} API clients found in the source");
    found
}

#[test]
fn cluster_role_grants_exactly_the_requests_the_code_makes() {
    let o = load();
    assert_eq!(o.cluster_roles.len(), 1);
    let role = &o.cluster_roles[0];
    let mut granted = BTreeSet::new();
    for rule in role.rules.as_deref().unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for g in rule.api_groups.as_deref().unwrap_or_default() {
            for r in rule.resources.as_deref().unwrap_or_default() {
                for v in &rule.verbs {
                    granted.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    let table = kxdp_control::sources::kube::api_requests();
    assert_eq!(
        requests_in_source(),
        table,
        "the source's API requests differ from control/src/sources/kube.rs's table"
    );
    assert_eq!(
        granted, table,
        "deploy/base/rbac.yaml grants other than what kxdp requests"
    );
    // nodeOverrides reads the Node with a GET.
    assert!(table.contains(&("".into(), "nodes".into(), "get".into())));
    assert_eq!(table.len(), 17, "{table:?}");

    // Bound to the DaemonSet's ServiceAccount.
    let sa = &o.service_accounts[0];
    let b = &o.bindings[0];
    assert_eq!(b.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&b.role_ref.name), role.metadata.name.as_ref());
    let subj = &b.subjects.as_ref().unwrap()[0];
    assert_eq!(subj.kind, "ServiceAccount");
    assert_eq!(Some(&subj.name), sa.metadata.name.as_ref());
    assert_eq!(subj.namespace, sa.metadata.namespace);
}

#[test]
fn daemon_set_and_config() {
    let o = load();
    let ds = &o.daemon_sets[0];
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.service_account_name,
        o.service_accounts[0].metadata.name
    );
    assert_eq!(
        ds.metadata.namespace,
        o.service_accounts[0].metadata.namespace
    );
    // Tolerates every taint.
    let tol = pod.tolerations.as_ref().unwrap();
    assert!(tol
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()));
    let c = &pod.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_ne!(sc.privileged, Some(true));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let add: BTreeSet<&str> = caps
        .add
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| s.as_str())
        .collect();
    assert_eq!(add, ["BPF", "IPC_LOCK", "NET_ADMIN", "NET_RAW"].into());
    // Probes on kube-proxy's health port.
    let live = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.path.as_deref(), Some("/livez"));
    let ready = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(ready.path.as_deref(), Some("/healthz"));
    // The config comes from the ConfigMap.
    let cm = o
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("kxdp-config"))
        .unwrap();
    let vol = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.config_map.is_some())
        .unwrap();
    assert_eq!(
        Some(&vol.config_map.as_ref().unwrap().name),
        cm.metadata.name.as_ref()
    );
    let data = cm.data.as_ref().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["config.yaml"]);
    let config = config_of(data, "deploy/base/configmap.yaml");
    // No nodeName: kxdp takes NODE_NAME, which the DaemonSet sets from spec.nodeName.
    assert_eq!(config.node_name, "");
    assert!(!config.interfaces.is_empty());
    assert_eq!(
        config.healthz_bind_address,
        Some("0.0.0.0:10256".parse().unwrap())
    );
    assert_eq!(
        live.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10256)
    );
    // The command runs the daemon on the ConfigMap's config, with no shell (the image has none).
    let cmd = c.command.as_ref().unwrap().join(" ");
    assert_eq!(
        cmd,
        "/usr/local/bin/kxdp run --config /etc/kxdp --admin /run/kxdp/admin.sock \
         --takeover-socket /run/kxdp/takeover.sock --wait-after-handover"
    );
    // Upgrades take over: the new pod starts beside the old one (surge), and no port is
    // declared (in a hostNetwork pod each would be a hostPort and keep the surge pod off the
    // node). The takeover socket's directory is the host's.
    assert!(c.ports.as_ref().is_none_or(|p| p.is_empty()));
    let ru = ds
        .spec
        .as_ref()
        .unwrap()
        .update_strategy
        .as_ref()
        .unwrap()
        .rolling_update
        .as_ref()
        .unwrap();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    assert_eq!(ru.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(ru.max_unavailable, Some(IntOrString::Int(0)));
    let run = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == "run")
        .unwrap();
    assert_eq!(run.host_path.as_ref().unwrap().path, "/run/kxdp");
    // The tun device, for podInterception: tap.
    let tun = (pod.volumes.as_ref().unwrap().iter())
        .find(|v| v.name == "dev-net-tun")
        .and_then(|v| v.host_path.as_ref())
        .unwrap();
    assert_eq!(
        (tun.path.as_str(), tun.type_.as_deref()),
        ("/dev/net/tun", Some("CharDevice"))
    );
    assert!((c.volume_mounts.as_ref().unwrap().iter())
        .any(|m| m.name == "dev-net-tun" && m.mount_path == "/dev/net/tun"));
    assert!(c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .any(|m| m.name == "run" && m.mount_path == "/run/kxdp"));
    // The state file in huge pages: the config asks for them in a directory of its own under
    // the shared host path, and an init container (the only privileged step: a mount that
    // outlives the pod needs Bidirectional propagation) mounts it with `kxdp prepare`; the
    // daemon sees it through HostToContainer.
    assert_eq!(
        config.conntrack.state_file.as_deref(),
        Some("/run/kxdp/ct/conntrack")
    );
    // CPUs differ between nodes: the workers are not pinned unless nodeOverrides says so.
    assert!(config.workers.cpus.is_empty(), "{:?}", config.workers.cpus);
    assert!(config.conntrack.state_file_huge_pages);
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        init.command.as_ref().unwrap().join(" "),
        "/usr/local/bin/kxdp prepare --config /etc/kxdp"
    );
    assert_eq!(init.image, c.image);
    let propagation = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "run" && m.mount_path == "/run/kxdp")
            .and_then(|m| m.mount_propagation.clone())
    };
    assert_eq!(propagation(init).as_deref(), Some("Bidirectional"));
    assert_eq!(propagation(c).as_deref(), Some("HostToContainer"));
    assert!(pod.termination_grace_period_seconds.unwrap() >= 10);
    // The metrics port the monitoring Service targets is the configured one.
    let svc: Value = yaml_serde::from_str(
        &std::fs::read_to_string(root().join("deploy/monitoring/service.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config.metrics_bind_address.map(|a| a.port() as i64),
        svc["spec"]["ports"][0]["targetPort"].as_i64()
    );
    // Memory follows the measurement.
    let res = c.resources.as_ref().unwrap();
    let req = &res.requests.as_ref().unwrap()["memory"].0;
    assert_eq!(req, "320Mi");
    assert!(c.env.as_ref().unwrap().iter().any(|e| e.name == "NODE_NAME"
        && e.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str())
            == Some("spec.nodeName")));
    // The API server's own address, from the ConfigMap kxdp-apiserver that the install fills in
    // (optional: unset, Kubernetes' ClusterIP stays and kxdp warns).
    let apiserver = o
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("kxdp-apiserver"))
        .expect("the ConfigMap kxdp-apiserver");
    assert_eq!(apiserver.metadata.namespace, ds.metadata.namespace);
    for var in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
        let e = c.env.as_ref().unwrap().iter().find(|e| e.name == var);
        let r = e
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.config_map_key_ref.as_ref())
            .unwrap_or_else(|| panic!("{var} is not taken from a ConfigMap"));
        assert_eq!(Some(&r.name), apiserver.metadata.name.as_ref());
        assert_eq!(r.key, var);
        assert_eq!(r.optional, Some(true));
        assert!(apiserver.data.as_ref().is_none_or(|d| !d.contains_key(var)));
    }
    // The Dockerfile is multi-stage and ships the binary the command runs.
    let docker =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/Dockerfile"))
            .unwrap();
    assert!(docker.matches("\nFROM ").count() + usize::from(docker.starts_with("FROM ")) >= 2);
    assert!(docker.contains("COPY --from=build") && docker.contains("/usr/local/bin/kxdp"));
}

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The configuration kxdp reads from a ConfigMap's data mounted as its directory.
fn config_of(data: &BTreeMap<String, String>, what: &str) -> kxdp_control::Config {
    let dir = tempfile::tempdir().unwrap();
    for (k, v) in data {
        std::fs::write(dir.path().join(k), v).unwrap();
    }
    kxdp_control::Config::load_dir(dir.path()).unwrap_or_else(|e| panic!("{what}: {e}"))
}

const CNIS: [(&str, &str); 6] = [
    ("calico", "cali*"),
    ("flannel", "veth*"),
    ("kindnet", "veth*"),
    ("aws-vpc-cni", "eni*"),
    ("bridge", "veth*"),
    ("ptp", "veth*"),
];

/// Every CNI overlay builds on the base and only adds a `preset.yaml` with that CNI's pod
/// interfaces: the base's config.yaml (state file, ports, workers) stays as it is.
#[test]
fn cni_overlays() {
    let o = load();
    let base = o
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("kxdp-config"))
        .unwrap()
        .data
        .clone()
        .unwrap();
    for (cni, pattern) in CNIS {
        let dir = root().join("deploy/overlays").join(cni);
        let k = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        let k: Value = yaml_serde::from_str(&k).unwrap();
        assert_eq!(k["resources"][0], "../../base", "{cni}");
        let patches = k["patches"].as_array().unwrap();
        assert_eq!(patches.len(), 1, "{cni}");
        let patch = patches[0]["path"].as_str().unwrap();
        let text = std::fs::read_to_string(dir.join(patch)).unwrap();
        let doc: Value = yaml_serde::from_str(&text).unwrap();
        let cm: ConfigMap = typed(patch, &doc);
        assert_eq!(cm.metadata.name.as_deref(), Some("kxdp-config"), "{cni}");
        let preset = cm.data.unwrap();
        assert_eq!(preset.keys().collect::<Vec<_>>(), ["preset.yaml"], "{cni}");
        let fields: Value = yaml_serde::from_str(&preset["preset.yaml"]).unwrap();
        let fields: Vec<&str> = fields
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert!(
            fields
                .iter()
                .all(|f| ["interfaces", "podInterception"].contains(f)),
            "{cni}: a preset sets the interfaces only: {fields:?}"
        );
        let mut data = base.clone();
        data.extend(preset);
        let config = config_of(&data, &format!("overlays/{cni}"));
        assert!(
            config.interfaces.iter().any(|i| i == pattern),
            "{cni}: {:?}",
            config.interfaces
        );
        // The CNI's pod interfaces go through the tap, which keeps their GSO.
        let tap = config.pod_interception.run_options().expect("mode tap");
        assert!(
            tap.interfaces.iter().any(|i| i == pattern),
            "{cni}: {tap:?}"
        );
        assert_eq!(
            config.conntrack.state_file.as_deref(),
            Some("/run/kxdp/ct/conntrack")
        );
        assert!(config.workers.cpus.is_empty());
    }
    let base = std::fs::read_to_string(root().join("deploy/base/kustomization.yaml")).unwrap();
    let base: Value = yaml_serde::from_str(&base).unwrap();
    for r in base["resources"].as_array().unwrap() {
        assert!(
            root()
                .join("deploy/base")
                .join(r.as_str().unwrap())
                .is_file(),
            "{r}"
        );
    }
}

/// Every metric the alert rules and the dashboard use is one kxdp exports (named in
/// control/src/metrics.rs or process_metrics.rs), so neither can drift from the code.
#[test]
fn monitoring_uses_exported_metrics() {
    let src = ["control/src/metrics.rs", "control/src/process_metrics.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(root().join(f)).unwrap())
        .collect::<String>();
    let rules =
        std::fs::read_to_string(root().join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let dash =
        std::fs::read_to_string(root().join("deploy/monitoring/kxdp-dashboard.json")).unwrap();
    let _: Value = serde_json::from_str(&dash).unwrap();
    let rules_doc: Value = yaml_serde::from_str(&rules).unwrap();
    let alerts: Vec<&str> = rules_doc["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["alert"].as_str().unwrap())
        .collect();
    for a in [
        "KxdpSyncStalled",
        "KxdpDropsRising",
        "KxdpConntrackNearFull",
        "KxdpWorkerBusy",
        "KxdpConntrackSmallPages",
    ] {
        assert!(alerts.contains(&a), "{a} missing: {alerts:?}");
    }
    let mut checked = 0;
    for text in [&rules, &dash] {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !(word.starts_with("kxdp_")
                || word.starts_with("kubeproxy_")
                || word.starts_with("process_"))
            {
                continue;
            }
            let base = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            let short = base.strip_prefix("kubeproxy_").unwrap_or(base);
            let short = short.strip_prefix("kxdp_sync_").unwrap_or(short);
            assert!(
                src.contains(&format!("\"{base}\"")) || src.contains(&format!("\"{short}\"")),
                "{word} is not a metric kxdp exports"
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked}");
}

/// `kubectl kustomize` renders the base, every CNI overlay and the monitoring directory. Each
/// rendered overlay is the base plus its interfaces: every object but the kxdp-config ConfigMap
/// is the base's as rendered (so the DaemonSet's probes, capabilities, volumes and the RBAC
/// stay), that ConfigMap keeps the base's config.yaml (its state file) and adds preset.yaml, and
/// the two read as kxdp reads them make a valid configuration with the CNI's pod interfaces.
/// Skipped (with a message) when `kubectl` is not installed or its kustomize predates v4.
#[test]
fn kustomize_renders_every_overlay() {
    let version = match std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("kustomize_renders_every_overlay: skipped: kubectl is not installed");
            return;
        }
        Err(e) => panic!("kubectl: {e}"),
    };
    if ![
        "Kustomize Version: v4",
        "Kustomize Version: v5",
        "Kustomize Version: v6",
    ]
    .iter()
    .any(|v| version.contains(v))
    {
        eprintln!(
            "kustomize_renders_every_overlay: skipped: kubectl's kustomize is older than v4 ({})",
            version.trim().replace('\n', "; ")
        );
        return;
    }
    let render = |dir: &str| -> Vec<Value> {
        let out = std::process::Command::new("kubectl")
            .args(["kustomize", dir])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        yaml_serde::Deserializer::from_str(&text)
            .map(|d| <Value as k8s_openapi::serde::Deserialize>::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect()
    };
    let root = root();
    let dir = |d: &str| root.join(d).to_str().unwrap().to_string();
    let base = render(&dir("deploy/base"));
    let monitoring = render(&dir("deploy/monitoring"));
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(monitoring.iter().any(|d| d["kind"] == kind), "{kind}");
    }
    let is_config = |d: &Value| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "kxdp-config";
    let base_config = base.iter().find(|d| is_config(d)).unwrap();
    let ds: DaemonSet = typed(
        "base",
        base.iter().find(|d| d["kind"] == "DaemonSet").unwrap(),
    );
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());
    assert!(c.security_context.as_ref().unwrap().capabilities.is_some());
    assert!(base.iter().any(|d| d["kind"] == "ClusterRole"));
    for (cni, pattern) in CNIS {
        let docs = render(&dir(&format!("deploy/overlays/{cni}")));
        assert_eq!(docs.len(), base.len(), "{cni}");
        for (d, b) in docs.iter().zip(&base) {
            if is_config(d) {
                continue;
            }
            assert_eq!(
                d, b,
                "{cni}: {} {} differs from the base's",
                d["kind"], d["metadata"]["name"]
            );
        }
        let cm: ConfigMap = typed(cni, docs.iter().find(|d| is_config(d)).unwrap());
        let data = cm.data.unwrap();
        assert_eq!(
            data["config.yaml"], base_config["data"]["config.yaml"],
            "{cni}: the base's config.yaml"
        );
        let config = config_of(&data, &format!("kubectl kustomize deploy/overlays/{cni}"));
        assert!(
            config.interfaces.iter().any(|i| i == pattern),
            "{cni}: {:?}",
            config.interfaces
        );
        assert_eq!(
            config.conntrack.state_file.as_deref(),
            Some("/run/kxdp/ct/conntrack"),
            "{cni}"
        );
        assert!(config.conntrack.state_file_huge_pages, "{cni}");
        assert!(config.workers.cpus.is_empty(), "{cni}");
    }
}
