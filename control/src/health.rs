//! Health as kube-proxy serves it.
//!
//! - `healthzBindAddress` (default `0.0.0.0:10256`): `/healthz` answers 200 while the tables are
//!   being published (the last publication is at most 2 × `syncPeriod` old, and the first one has
//!   happened) and this node's Node object is not being deleted, else 503; `/livez` is the same
//!   without the node-deletion condition. The body is kube-proxy's JSON
//!   (`{"lastUpdated":…,"currentTime":…,"nodeEligible":…}`).
//! - For every Service with `externalTrafficPolicy: Local` and a `healthCheckNodePort`, an HTTP
//!   server on that port (the healthzBindAddress IP) answers 200
//!   with `{"service":{"namespace":…,"name":…},"localEndpoints":N,"serviceProxyHealthy":true}` and
//!   `X-Load-Balancing-Endpoint-Weight: N` when this node has N > 0 ready local endpoints and
//!   `/healthz` is healthy (`serviceProxyHealthy`), 503
//!   with the same body otherwise. Servers start and stop as Services change.
//!
//! Every answer is counted in `kubeproxy_proxy_healthz_total{code}` / `kubeproxy_proxy_livez_total{code}`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::model::{ClusterState, ObjectKey};
use crate::sync::Status;

/// One Service's health-check node port answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcService {
    pub namespace: String,
    pub name: String,
    /// Ready endpoints on this node.
    pub local_endpoints: usize,
}

/// What the health servers need of the cluster state, computed at each publication.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthView {
    /// This node's Node object has a deletionTimestamp.
    pub node_deleting: bool,
    /// healthCheckNodePort → its Service.
    pub services: Arc<BTreeMap<u16, HcService>>,
}

impl HealthView {
    pub fn from_state(state: &ClusterState, node_name: &str) -> HealthView {
        let node_deleting = state
            .nodes
            .get(node_name)
            .is_some_and(|n| n.metadata.deletion_timestamp.is_some());
        let mut services = BTreeMap::new();
        Self::add_services(&mut services, state, node_name, state.services.iter());
        HealthView {
            node_deleting,
            services: Arc::new(services),
        }
    }

    /// The view after the Services in `changed` changed (or their EndpointSlices): costs the
    /// changed Services, not the cluster (the control loop calls it at every partial sync).
    pub fn updated(
        &self,
        state: &ClusterState,
        node_name: &str,
        changed: &BTreeSet<ObjectKey>,
    ) -> HealthView {
        let touched =
            |s: &HcService| changed.contains(&ObjectKey::new(s.namespace.clone(), s.name.clone()));
        let now = changed
            .iter()
            .filter_map(|k| state.services.get_key_value(k));
        if !self.services.values().any(touched) && now.clone().next().is_none() {
            return self.clone();
        }
        let mut services: BTreeMap<u16, HcService> = self
            .services
            .iter()
            .filter(|(_, s)| !touched(s))
            .map(|(p, s)| (*p, s.clone()))
            .collect();
        Self::add_services(&mut services, state, node_name, now);
        HealthView {
            node_deleting: self.node_deleting,
            services: Arc::new(services),
        }
    }

    fn add_services<'a>(
        services: &mut BTreeMap<u16, HcService>,
        state: &ClusterState,
        node_name: &str,
        list: impl Iterator<Item = (&'a ObjectKey, &'a k8s_openapi::api::core::v1::Service)>,
    ) {
        for (key, svc) in list {
            let Some(spec) = &svc.spec else { continue };
            if spec.external_traffic_policy.as_deref() != Some("Local")
                || !matches!(
                    spec.type_.as_deref(),
                    Some("LoadBalancer") | Some("NodePort")
                )
            {
                continue;
            }
            let Some(port) = spec
                .health_check_node_port
                .filter(|p| (1..=65535).contains(p))
            else {
                continue;
            };
            services.insert(
                port as u16,
                HcService {
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    local_endpoints: local_endpoints(state, key, node_name),
                },
            );
        }
    }
}

/// Ready endpoints of a Service on this node (distinct addresses, as kube-proxy counts them).
fn local_endpoints(state: &ClusterState, key: &ObjectKey, node_name: &str) -> usize {
    let mut addrs = BTreeSet::new();
    for slice in state.slices_of(key) {
        for ep in &slice.endpoints {
            if ep.node_name.as_deref() != Some(node_name) {
                continue;
            }
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if ready {
                if let Some(a) = ep.addresses.first() {
                    addrs.insert(a.clone());
                }
            }
        }
    }
    addrs.len()
}

/// An HTTP answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// A minimal HTTP/1.1 server (one request per connection): enough for probes and scrapes, no
/// dependency. `handler` gets the request path.
pub async fn serve_http<F>(listener: TcpListener, handler: Arc<F>)
where
    F: Fn(&str) -> Response + Send + Sync + 'static,
{
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut n = 0;
            while n < buf.len() {
                match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[n..])).await {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(k)) => {
                        n += k;
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let mut words = head.split_whitespace();
            let method = words.next().unwrap_or("");
            let target = words.next().unwrap_or("");
            let path = target.split('?').next().unwrap_or("");
            let r = handler(path);
            let mut resp = format!(
                "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nx-content-type-options: nosniff\r\nconnection: close\r\n",
                r.status,
                reason(r.status),
                r.content_type,
                r.body.len()
            );
            for (k, v) in &r.headers {
                resp.push_str(&format!("{k}: {v}\r\n"));
            }
            resp.push_str("\r\n");
            if method != "HEAD" {
                resp.push_str(&r.body);
            }
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// The `/healthz` and `/livez` server's view: the control loop's status and the sync period.
pub struct ProxyHealth {
    pub status: Arc<Mutex<Status>>,
    pub sync_period: Duration,
    pub metrics: Arc<Metrics>,
}

impl ProxyHealth {
    /// (healthy, node eligible, last update).
    fn check(&self, now: SystemTime) -> (bool, bool, Option<SystemTime>) {
        let st = self.status.lock().unwrap();
        let timeout = self.sync_period * 2;
        let within = |t: SystemTime| now.duration_since(t).unwrap_or_default() <= timeout;
        // Stale too when a change waits (or a rebuild runs) longer than the timeout, even if
        // something was published recently.
        let fresh = st.last_sync.is_some_and(within) && st.stale_since().is_none_or(within);
        (fresh, !st.health.node_deleting, st.last_sync)
    }

    /// What the health-check node ports report as `serviceProxyHealthy`: `/healthz`'s answer.
    pub fn healthy(&self) -> bool {
        let (fresh, eligible, _) = self.check(SystemTime::now());
        fresh && eligible
    }

    pub fn answer(&self, path: &str) -> Response {
        let now = SystemTime::now();
        let (fresh, eligible, last) = self.check(now);
        let (ok, counter) = match path {
            "/healthz" => (fresh && eligible, &self.metrics.proxy_healthz_total),
            "/livez" => (fresh, &self.metrics.proxy_livez_total),
            _ => {
                return Response {
                    status: 404,
                    content_type: "text/plain; charset=utf-8",
                    headers: vec![],
                    body: "404 page not found\n".into(),
                }
            }
        };
        let status = if ok { 200 } else { 503 };
        counter
            .get_or_create(&crate::metrics::CodeLabel {
                code: status.to_string(),
            })
            .inc();
        // kube-proxy's field order.
        let mut body = format!(
            r#"{{"lastUpdated":"{}","currentTime":"{}""#,
            last.map(rfc3339).unwrap_or_default(),
            rfc3339(now)
        );
        if path == "/healthz" {
            body.push_str(&format!(r#","nodeEligible":{eligible}"#));
        }
        body.push('}');
        Response {
            status,
            content_type: "application/json",
            headers: vec![],
            body,
        }
    }
}

/// The body kube-proxy's service health servers answer: 200 when this node has local endpoints
/// and the proxy itself is healthy (`/healthz`), else 503.
pub fn service_answer(s: &HcService, proxy_healthy: bool) -> Response {
    // kube-proxy's field order (a Go struct), not serde_json's sorted map.
    let body = format!(
        r#"{{"service":{{"namespace":{},"name":{}}},"localEndpoints":{},"serviceProxyHealthy":{}}}"#,
        serde_json::Value::from(s.namespace.as_str()),
        serde_json::Value::from(s.name.as_str()),
        s.local_endpoints,
        proxy_healthy
    );
    let mut headers = vec![];
    if s.local_endpoints > 0 {
        headers.push((
            "X-Load-Balancing-Endpoint-Weight".to_string(),
            s.local_endpoints.to_string(),
        ));
    }
    Response {
        status: if s.local_endpoints > 0 && proxy_healthy {
            200
        } else {
            503
        },
        content_type: "application/json",
        headers,
        body,
    }
}

/// The health-check node port servers, started and stopped to follow `HealthView::services`.
pub struct ServiceHealthServers {
    rt: tokio::runtime::Handle,
    /// The address the servers listen on (port replaced per Service).
    ip: std::net::IpAddr,
    proxy: Arc<ProxyHealth>,
    running: HashMap<u16, (Arc<Mutex<HcService>>, tokio::task::JoinHandle<()>)>,
}

impl ServiceHealthServers {
    pub fn new(rt: tokio::runtime::Handle, ip: std::net::IpAddr, proxy: Arc<ProxyHealth>) -> Self {
        ServiceHealthServers {
            rt,
            ip,
            proxy,
            running: HashMap::new(),
        }
    }

    /// Ports served now.
    pub fn ports(&self) -> Vec<u16> {
        let mut p: Vec<u16> = self.running.keys().copied().collect();
        p.sort_unstable();
        p
    }

    pub fn update(&mut self, want: &BTreeMap<u16, HcService>) {
        self.running.retain(|port, (_, task)| {
            let keep = want.contains_key(port);
            if !keep {
                task.abort();
                tracing::info!(port, "health check node port server stopped");
            }
            keep
        });
        for (port, svc) in want {
            if let Some((cur, _)) = self.running.get(port) {
                *cur.lock().unwrap() = svc.clone();
                continue;
            }
            let addr = SocketAddr::new(self.ip, *port);
            let std_listener = match std::net::TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    // Retried at the next update (kube-proxy logs and retries the same way).
                    tracing::warn!(%addr, error = %e, service = %format!("{}/{}", svc.namespace, svc.name), "health check node port: cannot listen");
                    continue;
                }
            };
            let _ = std_listener.set_nonblocking(true);
            let cur = Arc::new(Mutex::new(svc.clone()));
            let c2 = cur.clone();
            let proxy = self.proxy.clone();
            let _guard = self.rt.enter();
            let Ok(listener) = TcpListener::from_std(std_listener) else {
                continue;
            };
            let task = self.rt.spawn(serve_http(
                listener,
                Arc::new(move |_path: &str| {
                    let healthy = proxy.healthy();
                    service_answer(&c2.lock().unwrap(), healthy)
                }),
            ));
            tracing::info!(%addr, "health check node port server started");
            self.running.insert(*port, (cur, task));
        }
    }
}

impl Drop for ServiceHealthServers {
    fn drop(&mut self) {
        for (_, (_, t)) in self.running.drain() {
            t.abort();
        }
    }
}

/// Follows the control loop's status: starts/stops health check node port servers. Runs on a
/// thread of its own until `stop` is set.
pub fn spawn_service_health(
    rt: tokio::runtime::Handle,
    ip: std::net::IpAddr,
    proxy: Arc<ProxyHealth>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let status = proxy.status.clone();
    std::thread::Builder::new()
        .name("kxdp-hcnp".into())
        .spawn(move || {
            let mut servers = ServiceHealthServers::new(rt, ip, proxy);
            let mut last: Option<Arc<BTreeMap<u16, HcService>>> = None;
            let mut retry = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let view = status.lock().unwrap().health.services.clone();
                retry += 1;
                let changed = last.as_ref().is_none_or(|l| !Arc::ptr_eq(l, &view));
                // Bind failures are retried every few seconds.
                if changed || (retry % 20 == 0 && servers.ports().len() != view.len()) {
                    servers.update(&view);
                    last = Some(view);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::files::load_str;

    #[test]
    fn view_from_state() {
        let mut state = ClusterState::new();
        load_str(
            r#"
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: ns}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 30999
  clusterIP: 172.30.0.9
  ports: [{port: 80, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: ns, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
endpoints:
- {addresses: [10.0.0.1], nodeName: a}
- {addresses: [10.0.0.2], nodeName: a, conditions: {ready: false}}
- {addresses: [10.0.0.3], nodeName: b}
ports: [{port: 80}]
"#,
            false,
            std::path::Path::new("t.yaml"),
            &mut state,
        )
        .unwrap();
        let v = HealthView::from_state(&state, "a");
        assert_eq!(v.services[&30999].local_endpoints, 1);
        assert_eq!(v.services[&30999].name, "lb");
        let r = service_answer(&v.services[&30999], true);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body,
            r#"{"service":{"namespace":"ns","name":"lb"},"localEndpoints":1,"serviceProxyHealthy":true}"#
        );
        let v = HealthView::from_state(&state, "c");
        assert_eq!(service_answer(&v.services[&30999], true).status, 503);
        let v = HealthView::from_state(&state, "a");
        let r = service_answer(&v.services[&30999], false);
        assert_eq!(r.status, 503);
        assert!(r.body.ends_with(r#""serviceProxyHealthy":false}"#));
    }
}
