//! The real `kubectl` as an independent client of the fake API server, writing manifests while
//! kxdp's control loop watches: create, replace, server-side apply, merge patch, delete; each
//! change observed the way a worker reads the tables.

mod fake_apiserver;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fake_apiserver::FakeApiServer;
use kxdp_control::metrics::Metrics;
use kxdp_control::sources::kube::KubeOptions;
use kxdp_control::sync::{ControlLoop, Published, Source};
use kxdp_control::Config;
use kxdp_dataplane::snapshot::{FrontendKey, Snapshot};
use kxdp_packet::Addr;
use kxdp_packet::IpProto;

fn kubectl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", dir.join("kubeconfig").display()))
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .arg("--request-timeout=10s")
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn endpoints(snap: &Snapshot, ip: &str, port: u16) -> Option<Vec<String>> {
    let fe = snap.frontend(&FrontendKey {
        addr: Addr::from_ip(ip.parse().unwrap()),
        port,
        proto: IpProto::TCP,
    })?;
    let mut v: Vec<String> = fe
        .endpoints_of(fe.routes[0].endpoints)
        .iter()
        .map(|e| format!("{}:{}", e.addr.to_ip(kxdp_packet::Family::V4), e.port))
        .collect();
    v.sort();
    Some(v)
}

fn wait_for(published: &Published, what: &str, pred: impl Fn(&Snapshot) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !pred(&published.load()) {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: 192.168.0.2}]
";

fn svc(port: u16, extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop{extra}}}
spec:
  clusterIP: 172.30.0.10
  clusterIPs: [172.30.0.10]
  ports: [{{name: http, port: {port}, protocol: TCP, targetPort: 8080}}]
"
    )
}

fn slice(ips: &[&str]) -> String {
    let eps: Vec<String> = ips
        .iter()
        .map(|ip| format!("- {{addresses: [{ip}], conditions: {{ready: true}}}}"))
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{}
",
        eps.join("\n")
    )
}

#[test]
fn kubectl_drives_the_fake_api_server() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: kubectl is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server = FakeApiServer::start();
    server.write_kubeconfig(&d.join("kubeconfig"));
    let write = |name: &str, text: &str| {
        std::fs::write(d.join(name), text).unwrap();
        d.join(name).display().to_string()
    };

    let f = write("node.yaml", NODE);
    kubectl(d, &["create", "--validate=false", "-f", &f]);
    let f = write("svc.yaml", &svc(80, ""));
    kubectl(d, &["create", "--validate=false", "-f", &f]);

    let cfg = Config::from_yaml_str(
        "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: node-a\nclusterCIDRs: [10.0.0.0/8]\nsync: {minSyncPeriod: 0s}\n",
        Path::new("config.yaml"),
    )
    .unwrap();
    let (published, h) = ControlLoop::spawn(
        cfg,
        Source::Kube {
            config: Box::new(server.kube_config()),
            options: KubeOptions {
                backoff_min: Duration::from_millis(50),
                backoff_max: Duration::from_millis(400),
                watch_timeout_s: 290,
                read_timeout: Duration::from_secs(90),
            },
        },
        Arc::new(Metrics::new()),
    )
    .unwrap();
    wait_for(&published, "service from kubectl create", |s| {
        endpoints(s, "172.30.0.10", 80) == Some(vec![])
    });

    // create: endpoints appear.
    let f = write("slice.yaml", &slice(&["10.1.0.1", "10.1.0.2"]));
    kubectl(d, &["create", "--validate=false", "-f", &f]);
    wait_for(&published, "endpoints from kubectl create", |s| {
        endpoints(s, "172.30.0.10", 80).is_some_and(|e| e.len() == 2)
    });

    // replace (PUT).
    let f = write("slice.yaml", &slice(&["10.1.0.3"]));
    kubectl(d, &["replace", "--validate=false", "-f", &f]);
    wait_for(&published, "endpoints from kubectl replace", |s| {
        endpoints(s, "172.30.0.10", 80) == Some(vec!["10.1.0.3:8080".into()])
    });

    // server-side apply (PATCH application/apply-patch+yaml).
    let f = write("svc.yaml", &svc(81, ""));
    kubectl(
        d,
        &[
            "apply",
            "--server-side",
            "--validate=false",
            "--field-manager=test",
            "-f",
            &f,
        ],
    );
    wait_for(&published, "port from kubectl apply --server-side", |s| {
        endpoints(s, "172.30.0.10", 81).is_some() && endpoints(s, "172.30.0.10", 80).is_none()
    });

    // merge patch.
    kubectl(
        d,
        &[
            "patch",
            "-n",
            "shop",
            "service",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"ports":[{"name":"http","port":82,"protocol":"TCP","targetPort":8080}]}}"#,
        ],
    );
    wait_for(&published, "port from kubectl patch", |s| {
        endpoints(s, "172.30.0.10", 82).is_some()
    });

    // get reads what kubectl wrote.
    let out = kubectl(d, &["get", "-n", "shop", "service", "web", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["spec"]["ports"][0]["port"], 82);

    // delete.
    kubectl(d, &["delete", "--wait=false", "-f", &f]);
    wait_for(&published, "service gone after kubectl delete", |s| {
        endpoints(s, "172.30.0.10", 82).is_none()
    });
    h.shutdown();
}
