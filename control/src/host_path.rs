//! `kxdp run`'s host path (config `hostPath`, docs/afxdp.md "The host path",
//! docs/operations.md): set up before the workers start (replacing what a previous run left),
//! service routes kept in step with every publication, removed on exit.
//!
//! The dataplane attaches to `kxdp1` like to any interface and uses it as its kernel port: the
//! egress stage sends `pass` verdicts, packets for the node's own addresses and untranslated pod
//! traffic leaving the cluster there, with `kxdp0`'s MAC as destination.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;
use kxdp_dataplane::io::host_path::{
    local_node_addrs, HostPath, HostPathOptions, NodeAddressFollower, NodePortsTo,
};
use kxdp_dataplane::snapshot::{FrontendKind, Snapshot};

use crate::config::Config;
use crate::sync::Published;

/// How long `start` waits for the first publication when `nodeIPs` is empty.
const FIRST_PUBLICATION_WAIT: Duration = Duration::from_secs(10);

/// The installed host path and the thread that keeps its service routes in step.
pub struct RunningHostPath {
    host_path: Arc<Mutex<Option<HostPath>>>,
    stop: Arc<AtomicBool>,
    updater: Option<std::thread::JoinHandle<()>>,
    /// Keeps the service routes' source on the node addresses that are local now and the
    /// overlay devices' rules (netlink link and address events); the updater gives it the
    /// addresses of each publication.
    follower: Arc<Mutex<Option<NodeAddressFollower>>>,
    /// `kxdp1`: added to the interfaces, the dataplane's kernel port.
    pub kxdp_if: String,
    pub kxdp_ifindex: u32,
    /// Where the node's own packets to its NodePorts go (the runner attaches the redirect).
    pub node_ports_to: NodePortsTo,
    /// What was set up, for the startup report.
    pub describe: String,
}

/// The routes the node's own processes need toward kxdp: every service CIDR, and each
/// externalIP and LoadBalancer IP as a host route (sorted, without duplicates).
pub fn service_routes(snap: &Snapshot, config: &Config) -> Vec<IpNet> {
    let mut nets: Vec<IpNet> = config.service_cidrs.clone();
    nets.extend(
        snap.service_cidrs
            .iter()
            .filter_map(|(a, len)| IpNet::new(a, len).ok()),
    );
    for (k, f) in snap.frontends.iter() {
        if matches!(
            f.kind,
            FrontendKind::ExternalIp | FrontendKind::LoadBalancer
        ) {
            let ip = k.addr.to_ip(k.addr.family());
            nets.push(IpNet::from(ip));
        }
    }
    let mut nets: Vec<IpNet> = nets.into_iter().map(|n| n.trunc()).collect();
    nets.sort();
    nets.dedup();
    nets
}

/// The node's addresses: `nodeIPs`, else those of the published Node object.
fn node_ips(config: &Config, snap: &Snapshot) -> Vec<IpAddr> {
    if !config.node_ips.is_empty() {
        return config.node_ips.clone();
    }
    snap.node
        .addrs
        .iter()
        .map(|a| a.to_ip(a.family()))
        .collect()
}

impl RunningHostPath {
    /// Sets the host path up (replacing a previous run's leftovers) and starts following the
    /// publications.
    pub fn start(config: &Config, published: Arc<Published>) -> std::io::Result<RunningHostPath> {
        RunningHostPath::start_or_adopt(config, published, None)
    }

    /// As `start`, or, with `adopt` (the predecessor's moved `local` rules, a takeover), takes
    /// over the pair, rules and routes a predecessor installed without re-creating them
    /// (`HostPath::adopt`); the service routes are then brought in step with the tables.
    pub fn start_or_adopt(
        config: &Config,
        published: Arc<Published>,
        adopt: Option<&[(u8, u32, u8)]>,
    ) -> std::io::Result<RunningHostPath> {
        // Without `nodeIPs` the addresses come from the Node object: wait (bounded) for the
        // first publication rather than set up without NodePort rules.
        if config.node_ips.is_empty() && published.load().generation == 0 {
            published.wait_newer(0, FIRST_PUBLICATION_WAIT);
        }
        let snap = published.load_full();
        let node_ips = node_ips(config, &snap);
        if node_ips.is_empty() {
            tracing::warn!("host path: no node address known yet (nodeIPs empty, no Node object published): service routes leave without a fixed source");
        }
        let mut opts = HostPathOptions {
            node_ips: node_ips.clone(),
            service_routes: service_routes(&snap, config),
            overlay_ifs: config.host_path.overlay_interfaces.clone(),
            ..HostPathOptions::default()
        };
        // Routes only for the addresses the node has now (a route's `src` must be local); the
        // follower adds the others when they appear.
        let local = local_node_addrs(&opts)?;
        opts.node_ips.retain(|a| local.contains(a));
        let hp = match adopt {
            Some(moved) => {
                let mut hp = HostPath::adopt(&opts, moved)?;
                hp.set_service_routes(&opts.service_routes)?;
                hp
            }
            None => HostPath::setup(&opts)?,
        };
        let uses_v6 = node_ips.iter().any(|a| a.is_ipv6())
            || opts
                .service_routes
                .iter()
                .any(|n| matches!(n, IpNet::V6(_)));
        if uses_v6 && kxdp_dataplane::io::host_path::ipv6_forwarding_off() {
            tracing::warn!("host path: IPv6 forwarding is off on this node (net.ipv6.conf.all.forwarding = 0): the kernel drops the IPv6 pod traffic kxdp hands it on {} (to outside the cluster, replies to pods); kxdp does not change it: set it on the node (the CNI usually does)", opts.host_if);
        }
        let (kxdp_if, kxdp_ifindex) = (opts.kxdp_if.clone(), hp.kxdp_ifindex());
        let node_ports_to = hp.node_ports_to();
        let describe = format!(
            "host path: {} (kernel) / {} (kxdp), {} service route(s) from {}, the node's own NodePort connections through {} (a tc redirect on lo), overlay devices steered to kxdp when present: {}; route protocol {}, table {}",
            opts.host_if,
            opts.kxdp_if,
            opts.service_routes.len(),
            node_ips
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            opts.host_if,
            if opts.overlay_ifs.is_empty() {
                "none".to_string()
            } else {
                opts.overlay_ifs.join(", ")
            },
            opts.protocol,
            opts.overlay_table
        );
        let host_path = Arc::new(Mutex::new(Some(hp)));
        let follower = Arc::new(Mutex::new(Some(NodeAddressFollower::start(
            host_path.clone(),
            node_ips.clone(),
        )?)));
        let stop = Arc::new(AtomicBool::new(false));
        let updater = {
            let (host_path, stop, config) = (host_path.clone(), stop.clone(), config.clone());
            let follower = follower.clone();
            let mut last_ips = node_ips.clone();
            let mut last = opts.service_routes.clone();
            std::thread::Builder::new()
                .name("kxdp-host-routes".into())
                .spawn(move || {
                    let mut seen = snap.generation;
                    drop(snap);
                    while !stop.load(Ordering::Relaxed) {
                        let gen = published.wait_newer(seen, Duration::from_millis(200));
                        if gen == seen {
                            continue;
                        }
                        seen = gen;
                        let snap = published.load();
                        let ips = self::node_ips(&config, &snap);
                        if ips != last_ips {
                            if let Some(f) =
                                follower.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                            {
                                f.set_candidates(ips.clone());
                            }
                            tracing::info!(node_ips = ?ips, "host path: node addresses updated");
                            last_ips = ips;
                        }
                        let routes = service_routes(&snap, &config);
                        drop(snap);
                        if routes == last {
                            continue;
                        }
                        let mut guard = host_path.lock().unwrap_or_else(|e| e.into_inner());
                        let Some(hp) = guard.as_mut() else { break };
                        match hp.set_service_routes(&routes) {
                            Ok(()) => {
                                tracing::info!(
                                    routes = routes.len(),
                                    generation = gen,
                                    "host path: service routes updated"
                                );
                                last = routes;
                            }
                            // Kept as `last` was: the next publication tries again.
                            Err(e) => tracing::warn!("host path: updating service routes: {e}"),
                        }
                    }
                })?
        };
        Ok(RunningHostPath {
            host_path,
            stop,
            updater: Some(updater),
            follower,
            kxdp_if,
            kxdp_ifindex,
            node_ports_to,
            describe,
        })
    }

    /// The `local` rules the host path moved (for a successor, `start_or_adopt`).
    pub fn moved_local(&self) -> Vec<(u8, u32, u8)> {
        self.host_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|h| h.moved_local())
            .unwrap_or_default()
    }

    /// Stops following publications and leaves everything installed (a successor took over).
    pub fn leave(mut self) {
        self.stop_updater();
        if let Some(hp) = self
            .host_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            hp.leave();
        }
    }

    /// Stops following publications and removes everything the host path installed.
    pub fn teardown(mut self) -> std::io::Result<()> {
        self.stop_updater();
        let hp = self
            .host_path
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match hp {
            Some(hp) => hp.teardown(),
            None => Ok(()),
        }
    }

    fn stop_updater(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.updater.take() {
            let _ = t.join();
        }
        // Dropping it stops its thread.
        drop(
            self.follower
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

impl Drop for RunningHostPath {
    fn drop(&mut self) {
        // An early return (a failed attach): HostPath's own drop removes it.
        self.stop_updater();
    }
}
