//! Health as kube-proxy serves it.
//!
//! - `healthzBindAddress` (default `0.0.0.0:10256`): `/healthz` answers 200 while the tables are
//!   being published (the last publication is at most 2 × `syncPeriod` old, and the first one has
//!   happened), this node's Node object is not being deleted and no worker has stalled
//!   ([`WORKER_STALL_MS`]), else 503; `/livez` is the same without the node-deletion condition.
//!   The body is kube-proxy's JSON (`{"lastUpdated":…,"currentTime":…,"nodeEligible":…}`), plus
//!   `"stalledWorkers":[…]` while a worker is stalled.
//! - For every Service with `externalTrafficPolicy: Local` and a `healthCheckNodePort`, an HTTP
//!   server on that port (the healthzBindAddress IP) answers 200
//!   with `{"service":{"namespace":…,"name":…},"localEndpoints":N,"serviceProxyHealthy":true}` and
//!   `X-Load-Balancing-Endpoint-Weight: N` when this node has N > 0 ready local endpoints and
//!   `/healthz` is healthy (`serviceProxyHealthy`), 503
//!   with the same body otherwise. Servers start and stop as Services change.
//!
//! Every answer is counted in `kubeproxy_proxy_healthz_total{code}` / `kubeproxy_proxy_livez_total{code}`.
//!
//! The servers (these and the metrics server) are hyper's HTTP/1.1, one request per connection,
//! with bounds a slow or hostile client cannot stretch (unbounded, 200 trickling clients were
//! all held for as long as they trickled): at most `HTTP_LIMITS.max_connections` connections at once
//! per server (beyond, a new connection is closed at once) and `HTTP_LIMITS.deadline` for a
//! connection's whole life, request and answer included.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http_body_util::Full;
use hyper::body::Bytes;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::status::{HcService, Status};

/// An HTTP answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Bounds of one HTTP server.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Connections served at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// A connection's whole life: reading the request, answering, closing.
    pub deadline: Duration,
}

/// What the health and metrics servers use: probes and scrapes take milliseconds, and a few
/// dozen come at once at most.
pub const HTTP_LIMITS: HttpLimits = HttpLimits {
    max_connections: 64,
    deadline: Duration::from_secs(10),
};

/// Serves `handler` (given the request path) over HTTP/1.1 with `HTTP_LIMITS`.
pub async fn serve_http<F>(listener: TcpListener, handler: Arc<F>)
where
    F: Fn(&str) -> Response + Send + Sync + 'static,
{
    serve_http_with(listener, handler, HTTP_LIMITS).await
}

/// Same, with explicit limits.
pub async fn serve_http_with<F>(listener: TcpListener, handler: Arc<F>, limits: HttpLimits)
where
    F: Fn(&str) -> Response + Send + Sync + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Full: closing at once costs the attacker a reconnect and us nothing.
            drop(sock);
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let r = handler(req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(into_hyper(r)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .max_buf_size(8192)
                .serve_connection(hyper_util::rt::TokioIo::new(sock), service);
            // Dropping the connection at the deadline closes the socket.
            let _ = tokio::time::timeout(limits.deadline, conn).await;
        });
    }
}

fn into_hyper(r: Response) -> hyper::Response<Full<Bytes>> {
    let mut b = hyper::Response::builder()
        .status(r.status)
        .header("content-type", r.content_type)
        .header("x-content-type-options", "nosniff");
    for (k, v) in &r.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    b.body(Full::new(Bytes::from(r.body)))
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

/// A worker whose loop has not come round for this long makes `/healthz` and `/livez` answer
/// 503 (`stalledWorkers` in the body). A worker goes round at least every 250 ms when idle
/// and publishes its socket table every second, idle or busy: ten missed seconds are a stall
/// (a deadlock, a spin, a system call that never returns), not scheduling on a loaded node.
/// The DaemonSet's liveness probe (every 10 s, 6 failures) then restarts kxdp about a minute
/// later; with the state file the connections carry on.
pub const WORKER_STALL_MS: u64 = 10_000;

/// The `/healthz` and `/livez` server's view: the control loop's status, the sync period and
/// the workers' progress.
pub struct ProxyHealth {
    pub status: Arc<Mutex<Status>>,
    pub sync_period: Duration,
    pub metrics: Arc<Metrics>,
    /// The workers' counters (None: no dataplane, as in tests of the control loop alone).
    pub workers: Option<Arc<kxdp_dataplane::stats::DataplaneStats>>,
    /// How long a worker's loop may not come round before it counts as stalled
    /// ([`WORKER_STALL_MS`] in `kxdp run`).
    pub worker_stall_ms: u64,
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

    /// The workers stalled for longer than `worker_stall_ms`.
    fn stalled(&self) -> Vec<usize> {
        self.workers
            .as_ref()
            .map(|w| {
                w.stalled(self.worker_stall_ms)
                    .into_iter()
                    .map(|(i, _)| i)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What the health-check node ports report as `serviceProxyHealthy`: `/healthz`'s answer.
    pub fn healthy(&self) -> bool {
        let (fresh, eligible, _) = self.check(SystemTime::now());
        fresh && eligible && self.stalled().is_empty()
    }

    pub fn answer(&self, path: &str) -> Response {
        let now = SystemTime::now();
        let (fresh, eligible, last) = self.check(now);
        let stalled = self.stalled();
        let working = stalled.is_empty();
        let (ok, counter) = match path {
            "/healthz" => (
                fresh && eligible && working,
                &self.metrics.proxy_healthz_total,
            ),
            "/livez" => (fresh && working, &self.metrics.proxy_livez_total),
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
        if !working {
            let list: Vec<String> = stalled.iter().map(|i| i.to_string()).collect();
            body.push_str(&format!(r#","stalledWorkers":[{}]"#, list.join(",")));
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
    use crate::model::ClusterState;
    use crate::sources::files::load_str;
    use crate::status::HealthView;

    #[test]
    fn a_stalled_worker_fails_healthz_and_livez() {
        let stats = Arc::new(kxdp_dataplane::stats::DataplaneStats::new(2));
        let status = Status {
            last_sync: Some(SystemTime::now()),
            ..Default::default()
        };
        let h = ProxyHealth {
            status: Arc::new(Mutex::new(status)),
            sync_period: Duration::from_secs(30),
            metrics: Arc::new(Metrics::new()),
            workers: Some(stats.clone()),
            worker_stall_ms: 200,
        };
        stats.publish_sockets(0, |_| {});
        stats.publish_sockets(1, |_| {});
        assert_eq!(h.answer("/healthz").status, 200);
        assert_eq!(h.answer("/livez").status, 200);
        assert!(h.healthy());
        // Worker 0 goes round its loop; worker 1 does not.
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(60));
            stats.publish_sockets(0, |_| {});
        }
        for path in ["/healthz", "/livez"] {
            let r = h.answer(path);
            assert_eq!(r.status, 503, "{path}: {}", r.body);
            assert!(
                r.body.contains(r#""stalledWorkers":[1]"#),
                "{path}: {}",
                r.body
            );
        }
        assert!(!h.healthy(), "the health-check node ports follow /healthz");
        stats.publish_sockets(1, |_| {});
        let r = h.answer("/healthz");
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(!r.body.contains("stalledWorkers"), "{}", r.body);
    }

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

    fn ok_handler() -> Arc<impl Fn(&str) -> Response + Send + Sync + 'static> {
        Arc::new(|path: &str| Response {
            status: if path == "/healthz" { 200 } else { 404 },
            content_type: "text/plain",
            headers: vec![("X-Test".into(), "1".into())],
            body: "ok\n".into(),
        })
    }

    async fn get(addr: SocketAddr, head: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn answers_get_and_head() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve_http(l, ok_handler()));
        let r = get(addr, "GET /healthz?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("x-test: 1\r\n") && r.ends_with("\r\n\r\nok\n"),
            "{r}"
        );
        let r = get(addr, "HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = get(addr, "GET /nope HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        // Garbage gets an error answer or a close, never a hang or a crash.
        let r = get(addr, "\x00\x01 garbage\r\n\r\n").await;
        assert!(r.is_empty() || r.starts_with("HTTP/1.1 400"), "{r}");
    }

    #[tokio::test]
    async fn slow_clients_are_bounded_in_number_and_time() {
        // Unbounded, slowloris clients trickling bytes were held for as long as they trickled.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let limits = HttpLimits {
            max_connections: 8,
            deadline: Duration::from_millis(600),
        };
        tokio::spawn(serve_http_with(l, ok_handler(), limits));
        let started = tokio::time::Instant::now();
        let mut slow = Vec::new();
        for _ in 0..40 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
            slow.push(s);
        }
        // Every slow client trickles a header byte every 50 ms; the server must close each one,
        // those beyond the cap at once and the others at the deadline.
        let tasks: Vec<_> = slow
            .into_iter()
            .map(|mut s| {
                tokio::spawn(async move {
                    let begun = tokio::time::Instant::now();
                    loop {
                        if s.write_all(b"X").await.is_err() {
                            break;
                        }
                        let mut b = [0u8; 64];
                        match tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await
                        {
                            Ok(Ok(0)) | Ok(Err(_)) => break,
                            _ => {}
                        }
                        if begun.elapsed() > Duration::from_secs(20) {
                            return false;
                        }
                    }
                    true
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap(), "a slow client was held 20 s");
        }
        let held = started.elapsed();
        assert!(held < Duration::from_secs(5), "held {held:?}");
        // Once they are gone, a prompt client is served again.
        let r = get(addr, "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
}
