//! Run mode's I/O in one piece: for the configured interfaces, load and attach the XDP program,
//! open the workers' AF_XDP sockets, keep the program's node-address and NodePort maps in step
//! with the published tables, start the route refresher and the pinned workers. Dropping the
//! returned [`AfXdp`] (or calling `stop`) stops the workers and detaches every program.
//!
//! Queues: worker `w` owns queue `q` of every interface for which `q % workers == w`, so each
//! worker can send on every interface (on its own queue). veth has one queue: with it, worker 0
//! does all the work and the others are not started (reported at startup).

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::conntrack::Conntrack;
use crate::io::afxdp::XskConfig;
use crate::io::route::Routes;
use crate::io::xdp::{Attachment, ModeChoice, SharedMaps, XdpMode, XdpProgram};
use crate::snapshot::{FrontendKind, Snapshot};
use crate::stats::DataplaneStats;
use crate::worker::{Backoff, IoCounters, Shared, Tables, Worker};
use kxdp_kernel::sys::{driver_of, rx_queues_of};

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub interfaces: Vec<String>,
    pub workers: usize,
    /// CPU of worker i: `cpus[i % len]`; empty: not pinned.
    pub cpus: Vec<usize>,
    pub xsk: XskConfig,
    pub backoff: Backoff,
    pub mode: ModeChoice,
    /// The kernel port: ifindex of the kxdp-side end of a veth pair whose other end belongs
    /// to the node's stack (the host path sets it up). `pass` verdicts and packets for the
    /// node's own addresses are sent there; it must be one of `interfaces` (kxdp sends on it
    /// through its AF_XDP socket). None: such packets are dropped, counted `no-kernel-port`
    /// (the XDP program hands most of the node's own traffic to the kernel before it reaches
    /// a worker).
    pub kernel_port: Option<u32>,
}

/// What was attached where (for the startup report).
#[derive(Clone, Debug)]
pub struct InterfaceReport {
    pub name: String,
    pub ifindex: u32,
    pub queues: u32,
    pub mode: XdpMode,
    pub zero_copy: bool,
    pub replaced_stale: bool,
    pub driver: String,
    pub complete_checksums: bool,
}

pub struct AfXdp {
    pub interfaces: Vec<InterfaceReport>,
    /// I/O counters per started worker: (worker index, counters).
    pub counters: Vec<(usize, Arc<IoCounters>)>,
    stop: Arc<AtomicBool>,
    workers: Vec<std::thread::JoinHandle<Worker>>,
    maps_thread: Option<std::thread::JoinHandle<()>>,
    attachments: Vec<Attachment>,
    _progs: Arc<Vec<XdpProgram>>,
    _routes: Routes,
}

/// NodePorts of a snapshot (what the XDP program must steer at node addresses).
pub fn node_ports(snap: &Snapshot) -> Vec<u16> {
    let mut ports: Vec<u16> = snap
        .frontends
        .iter()
        .filter(|(_, f)| f.kind == FrontendKind::NodePort)
        .map(|(k, _)| k.port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn node_addrs(snap: &Snapshot, local: &[IpAddr]) -> Vec<IpAddr> {
    let mut a: Vec<IpAddr> = local.to_vec();
    a.extend(snap.node.addrs.iter().map(|x| x.to_ip(x.family())));
    a.sort();
    a.dedup();
    a
}

impl AfXdp {
    /// Starts everything in the calling thread's network namespace.
    pub fn start(
        opts: &RunOptions,
        tables: Arc<dyn Tables>,
        ct: Arc<Conntrack>,
        stats: Option<Arc<DataplaneStats>>,
    ) -> io::Result<AfXdp> {
        if opts.interfaces.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no interfaces configured (config: interfaces)",
            ));
        }
        let routes = Routes::start()?;
        let table = routes.table.load_full();
        let workers = opts.workers.max(1);
        struct If {
            name: String,
            ifindex: u32,
            queues: u32,
            mac: [u8; 6],
            driver: String,
            complete: bool,
        }
        let mut ifs = Vec::new();
        for name in &opts.interfaces {
            let ifindex = kxdp_kernel::ifindex(name)?;
            let mac = table.link(ifindex).and_then(|l| l.mac).ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{name}: no MAC address"))
            })?;
            let queues = rx_queues_of(name);
            let driver = driver_of(name).unwrap_or_default();
            // Virtual interfaces hand over TCP/UDP with partial checksums (docs/afxdp.md).
            let complete = matches!(driver.as_str(), "veth" | "tun" | "");
            ifs.push(If {
                name: name.clone(),
                ifindex,
                queues,
                mac,
                driver,
                complete,
            });
        }
        let maps = Arc::new(SharedMaps::create()?);
        let progs: Vec<XdpProgram> = ifs
            .iter()
            .map(|i| XdpProgram::load_with(i.queues, maps.clone()))
            .collect::<io::Result<_>>()?;
        // Sockets, worker by worker.
        let mut opened = Vec::new();
        for w in 0..workers {
            let mut ports = Vec::new();
            let mut regs = Vec::new();
            for (k, i) in ifs.iter().enumerate() {
                for q in (0..i.queues).filter(|q| *q as usize % workers == w) {
                    ports.push((i.ifindex, q, i.mac, i.complete));
                    regs.push((k, q));
                }
            }
            if ports.is_empty() {
                continue;
            }
            let cpu = (!opts.cpus.is_empty()).then(|| opts.cpus[w % opts.cpus.len()]);
            let worker = Worker::open(w, cpu, &ports, &opts.xsk, opts.backoff, opts.kernel_port)?;
            for ((k, q), port) in regs.iter().zip(&worker.ports) {
                progs[*k].set_socket(*q, port.sock.fd())?;
            }
            opened.push(worker);
        }
        // Node addresses and NodePorts, before the program sees a packet.
        let snap = tables.current();
        let local = table.local_addrs().to_vec();
        maps.set_node(&node_addrs(&snap, &local), &node_ports(&snap))?;
        drop(snap);
        let mut attachments = Vec::new();
        let mut interfaces = Vec::new();
        for (i, p) in ifs.iter().zip(&progs) {
            let a = p.attach(i.ifindex, opts.mode)?;
            let zero_copy = opened
                .iter()
                .flat_map(|w| w.ports.iter())
                .any(|port| port.ifindex == i.ifindex && port.sock.zero_copy);
            interfaces.push(InterfaceReport {
                name: i.name.clone(),
                ifindex: i.ifindex,
                queues: i.queues,
                mode: a.mode,
                zero_copy,
                replaced_stale: a.replaced_stale,
                driver: i.driver.clone(),
                complete_checksums: i.complete,
            });
            attachments.push(a);
        }
        let progs = Arc::new(progs);
        let stop = Arc::new(AtomicBool::new(false));
        // Keep the maps in step with publications.
        let maps_thread = {
            let (maps, tables, stop, rt) = (
                maps.clone(),
                tables.clone(),
                stop.clone(),
                routes.table.clone(),
            );
            std::thread::Builder::new()
                .name("kxdp-xdp-maps".into())
                .spawn(move || {
                    let mut last = (u64::MAX, Vec::new(), Vec::new());
                    while !stop.load(Ordering::Relaxed) {
                        let snap = tables.current();
                        let local = rt.load().local_addrs().to_vec();
                        let addrs = node_addrs(&snap, &local);
                        let ports = node_ports(&snap);
                        if snap.generation != last.0 || addrs != last.1 || ports != last.2 {
                            if let Err(e) = maps.set_node(&addrs, &ports) {
                                eprintln!("kxdp: updating the XDP maps: {e}");
                            }
                            last = (snap.generation, addrs, ports);
                        }
                        drop(snap);
                        std::thread::sleep(Duration::from_millis(200));
                    }
                })?
        };
        let shared = Shared {
            tables,
            ct,
            stats,
            routes: routes.table.clone(),
            unresolved: routes.unresolved.clone(),
            masq: Some(maps.clone()),
            stop: stop.clone(),
        };
        let mut counters = Vec::new();
        let mut handles = Vec::new();
        for w in opened {
            counters.push((w.index, w.counters.clone()));
            handles.push(w.spawn(shared.clone())?);
        }
        Ok(AfXdp {
            interfaces,
            counters,
            stop,
            workers: handles,
            maps_thread: Some(maps_thread),
            attachments,
            _progs: progs,
            _routes: routes,
        })
    }

    /// One line per interface for the startup report.
    pub fn describe(&self) -> Vec<String> {
        self.interfaces
            .iter()
            .map(|i| {
                format!(
                    "{}: driver {}, {} queue(s), XDP {}{}, AF_XDP {}, checksums {}",
                    i.name,
                    if i.driver.is_empty() { "?" } else { &i.driver },
                    i.queues,
                    i.mode.as_str(),
                    if i.replaced_stale {
                        " (replaced a stale program)"
                    } else {
                        ""
                    },
                    if i.zero_copy {
                        "zero-copy"
                    } else {
                        "copy mode"
                    },
                    if i.complete_checksums {
                        "completed by kxdp (virtual interface)"
                    } else {
                        "as received"
                    }
                )
            })
            .collect()
    }

    /// Stops the workers, then detaches the programs.
    pub fn stop(mut self) -> Vec<Worker> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Vec<Worker> {
        self.stop.store(true, Ordering::Relaxed);
        let done = self
            .workers
            .drain(..)
            .filter_map(|h| h.join().ok())
            .collect();
        if let Some(t) = self.maps_thread.take() {
            let _ = t.join();
        }
        self.attachments.clear();
        done
    }
}

impl Drop for AfXdp {
    fn drop(&mut self) {
        self.shutdown();
    }
}
