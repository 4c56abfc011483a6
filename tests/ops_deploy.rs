//! deploy/: every manifest parses into its k8s-openapi type (and round-trips: no misspelt or
//! unknown field survives), the ClusterRole grants exactly list+watch on each resource the
//! control plane watches (control/src/sources/kube.rs), the ConfigMap holds a valid
//! DataplaneConfiguration, and the DaemonSet is wired as docs/operations.md says.

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

#[test]
fn cluster_role_grants_exactly_what_the_control_plane_watches() {
    let o = load();
    assert_eq!(o.cluster_roles.len(), 1);
    let role = &o.cluster_roles[0];
    // (group, resource) → verbs granted.
    let mut granted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in role.rules.as_deref().unwrap_or_default() {
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
        for g in rule.api_groups.as_deref().unwrap_or_default() {
            for r in rule.resources.as_deref().unwrap_or_default() {
                granted
                    .entry((g.clone(), r.clone()))
                    .or_default()
                    .extend(rule.verbs.iter().cloned());
            }
        }
    }
    let watched: BTreeSet<(String, String)> = kxdp_control::sources::kube::specs("node-a")
        .iter()
        .map(|s| (s.resource.group.clone(), s.resource.plural.clone()))
        .collect();
    assert_eq!(watched.len(), 7, "{watched:?}");
    let list_watch: BTreeSet<String> = ["list".to_string(), "watch".to_string()].into();
    for w in &watched {
        assert_eq!(
            granted.get(w),
            Some(&list_watch),
            "{w:?}: the control plane lists and watches it"
        );
    }
    let extra: Vec<_> = granted.keys().filter(|k| !watched.contains(*k)).collect();
    assert!(extra.is_empty(), "granted but never watched: {extra:?}");

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
    let cm = &o.config_maps[0];
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
    let text = &cm.data.as_ref().unwrap()["config.yaml"];
    let config = kxdp_control::Config::from_yaml_str(text, Path::new("configmap.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
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
        "/usr/local/bin/kxdp run --config /etc/kxdp/config.yaml --admin /run/kxdp/admin.sock \
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
        config.conntrack.state_file_path(),
        Some("/run/kxdp/ct/conntrack")
    );
    assert!(config.conntrack.state_file_huge_pages);
    let init = &pod.init_containers.as_ref().unwrap()[0];
    assert_eq!(
        init.command.as_ref().unwrap().join(" "),
        "/usr/local/bin/kxdp prepare --config /etc/kxdp/config.yaml"
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

/// Every CNI overlay builds on the base and carries a valid configuration with that CNI's
/// pod interfaces.
#[test]
fn cni_overlays() {
    let want = [
        ("calico", "cali*"),
        ("flannel", "veth*"),
        ("kindnet", "veth*"),
        ("aws-vpc-cni", "eni*"),
        ("bridge", "veth*"),
        ("ptp", "veth*"),
    ];
    for (cni, pattern) in want {
        let dir = root().join("deploy/overlays").join(cni);
        let k = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
        let k: Value = yaml_serde::from_str(&k).unwrap();
        assert_eq!(k["resources"][0], "../../base", "{cni}");
        let patch = k["patches"][0]["path"].as_str().unwrap();
        let text = std::fs::read_to_string(dir.join(patch)).unwrap();
        let doc: Value = yaml_serde::from_str(&text).unwrap();
        let cm: ConfigMap = typed(patch, &doc);
        assert_eq!(cm.metadata.name.as_deref(), Some("kxdp-config"), "{cni}");
        let config = kxdp_control::Config::from_yaml_str(
            &cm.data.unwrap()["config.yaml"],
            Path::new(&format!("overlays/{cni}/{patch}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            config.interfaces.iter().any(|i| i == pattern),
            "{cni}: {:?}",
            config.interfaces
        );
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

/// `kubectl kustomize` renders the base, every CNI overlay and the monitoring directory; in each
/// rendered overlay the DaemonSet mounts the ConfigMap that is rendered with it, and that
/// ConfigMap's configuration names the CNI's pod interfaces. Skipped (with a message) when
/// `kubectl` is not installed.
#[test]
fn kustomize_renders_every_overlay() {
    let render = |dir: &str| -> Option<Vec<Value>> {
        let out = match std::process::Command::new("kubectl")
            .args(["kustomize", dir])
            .output()
        {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("kubectl: {e}"),
        };
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let docs = yaml_serde::Deserializer::from_str(&text)
            .map(|d| <Value as k8s_openapi::serde::Deserialize>::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect();
        Some(docs)
    };
    let root = root();
    let dir = |d: &str| root.join(d).to_str().unwrap().to_string();
    let Some(base) = render(&dir("deploy/base")) else {
        eprintln!("kustomize_renders_every_overlay: skipped: kubectl is not installed");
        return;
    };
    assert!(base.iter().any(|d| d["kind"] == "DaemonSet"));
    let monitoring = render(&dir("deploy/monitoring")).unwrap();
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(monitoring.iter().any(|d| d["kind"] == kind), "{kind}");
    }
    for (cni, pattern) in [
        ("calico", "cali*"),
        ("flannel", "veth*"),
        ("kindnet", "veth*"),
        ("aws-vpc-cni", "eni*"),
        ("bridge", "veth*"),
        ("ptp", "veth*"),
    ] {
        let docs = render(&dir(&format!("deploy/overlays/{cni}"))).unwrap();
        let of_kind = |k: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == k).collect() };
        let ds = of_kind("DaemonSet");
        assert_eq!(ds.len(), 1, "{cni}");
        let ds: DaemonSet = typed(cni, ds[0]);
        let spec = ds.spec.unwrap().template.spec.unwrap();
        let cm_name = spec
            .volumes
            .iter()
            .flatten()
            .find_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
            .unwrap_or_else(|| panic!("{cni}: the DaemonSet mounts no ConfigMap"));
        let cm: ConfigMap = of_kind("ConfigMap")
            .into_iter()
            .map(|d| typed::<ConfigMap>(cni, d))
            .find(|c| c.metadata.name.as_deref() == Some(cm_name.as_str()))
            .unwrap_or_else(|| panic!("{cni}: ConfigMap {cm_name} is not rendered"));
        let config = kxdp_control::Config::from_yaml_str(
            &cm.data.unwrap()["config.yaml"],
            Path::new(&format!("kubectl kustomize deploy/overlays/{cni}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            config.interfaces.iter().any(|i| i == pattern),
            "{cni}: {:?}",
            config.interfaces
        );
    }
}
