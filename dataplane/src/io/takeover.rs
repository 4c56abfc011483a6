//! What a running dataplane hands to its successor in a takeover (docs/operations.md): the
//! kernel objects as file descriptors, and a [`Description`] saying what each one is and where
//! every UMEM frame is.
//!
//! The predecessor stops its workers at a batch boundary ([`AfXdp::quiesce`](super::runner::AfXdp::quiesce)):
//! then no frame is in the application's hands, every ring submission has been published, and
//! a frame is on the free list or held by exactly one socket (on its fill or TX ring, in the
//! kernel's hands behind them, or on its RX or completion ring). The description carries the
//! free list, each frame's owning socket and each socket's counts, so the successor's
//! accounting continues exactly; `Umem::adopt` and `XskSocket::adopt` check it against the
//! memfd's size and the rings' shared indices.
//!
//! Descriptors: per worker its UMEM's memfd and one AF_XDP socket per port; per attached
//! interface its XDP program, XSKMAP and BPF link; the five maps the programs share. The
//! description refers to them by index into the descriptor list.

use std::net::IpAddr;
use std::os::fd::{BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use crate::conntrack::Conntrack;
use crate::io::route::Routes;
use crate::io::runner::{AfXdp, AttachedLink, InterfaceReport, Parts, Quiesced, RunOptions};
use crate::stats::DataplaneStats;
use crate::worker::Port;
use crate::worker::Tables;
use kxdp_kernel::afxdp::{RingSizes, Umem, UmemState, XskSocket, XskState};
use kxdp_kernel::xdp::{Attachment, SharedMaps, XdpMode, XdpProgram};

/// The description's format; a successor refuses another one (and the predecessor resumes).
pub const DESCRIPTION_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Description {
    pub version: u32,
    /// Indexes of the shared maps: node4, node6, ports, masq4, masq6, hold.
    pub maps: [usize; 6],
    /// The node addresses last written to the node maps.
    pub node_addrs: Vec<IpAddr>,
    /// The in-kernel fast path's maps, when the XDP programs read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_path: Option<FastPathDesc>,
    pub workers: Vec<WorkerDesc>,
    pub links: Vec<LinkDesc>,
}

/// The in-kernel fast path's two maps (descriptor indexes) and its slot count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FastPathDesc {
    pub flows: usize,
    pub counters: usize,
    pub slots: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerDesc {
    pub index: usize,
    /// Index of the UMEM's memfd.
    pub memfd: usize,
    pub frames: u32,
    pub frame_size: u32,
    pub free: Vec<u64>,
    pub owner: Vec<u32>,
    pub next_socket_id: u32,
    pub ports: Vec<PortDesc>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PortDesc {
    /// Index of the AF_XDP socket.
    pub fd: usize,
    pub ifindex: u32,
    pub queue: u32,
    pub zero_copy: bool,
    /// The size of all four rings when they are equal; 0 when they differ (see `rings`): a
    /// successor built before `rings` existed then refuses the socket (0 is no ring size)
    /// instead of mapping its rings with the wrong size, and the predecessor resumes.
    pub ring_size: u32,
    /// Entries of the RX, TX, fill and completion rings (absent in a description written
    /// before the sizes could differ: `ring_size` each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<[u32; 4]>,
    pub id: u32,
    pub tx_outstanding: u32,
    pub fill_outstanding: u32,
    pub mac: [u8; 6],
    pub complete_checksums: bool,
    pub fill_target: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LinkDesc {
    pub name: String,
    pub ifindex: u32,
    pub queues: u32,
    /// "native" or "generic".
    pub mode: String,
    pub zero_copy: bool,
    pub driver: String,
    pub complete_checksums: bool,
    pub insn_count: usize,
    /// Indexes of the program, its XSKMAP and its BPF link (none for a program held through
    /// netlink, with a conntrack state file: `XdpProgram::attach_held`).
    pub prog: usize,
    pub xsks: usize,
    pub link: Option<usize>,
    /// Its program hands the fast path's flows to the kernel, and a tc redirect with the fast
    /// path is on its ingress.
    #[serde(default)]
    pub fast_path: bool,
}

impl Description {
    /// Frames per worker, sockets and interfaces: for the log line of both sides.
    pub fn summary(&self) -> String {
        let sockets: usize = self.workers.iter().map(|w| w.ports.len()).sum();
        let free: usize = self.workers.iter().map(|w| w.free.len()).sum();
        let frames: u64 = self.workers.iter().map(|w| w.frames as u64).sum();
        format!(
            "{} worker(s), {} interface(s) ({}), {} socket(s), {} of {} frame(s) free, the rest on rings",
            self.workers.len(),
            self.links.len(),
            self.links
                .iter()
                .map(|l| l.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            sockets,
            free,
            frames
        )
    }
}

/// The description of a quiesced dataplane and the descriptors it refers to (borrowed from it:
/// send them before dropping or resuming it).
pub fn describe(q: &Quiesced) -> std::io::Result<(Description, Vec<BorrowedFd<'_>>)> {
    if q.lost_workers > 0 {
        return Err(std::io::Error::other(format!(
            "{} worker thread(s) had stopped: their sockets cannot be handed over",
            q.lost_workers
        )));
    }
    let mut fds: Vec<BorrowedFd<'_>> = Vec::new();
    let maps = &q.afxdp.maps;
    let map_fds = maps.fds();
    let mut map_idx = [0usize; 6];
    for (i, fd) in map_fds.into_iter().enumerate() {
        fds.push(fd);
        map_idx[i] = fds.len() - 1;
    }
    let fast_path = q.fast_path.as_ref().map(|f| {
        let [flows, counters] = f.fds();
        fds.push(flows);
        fds.push(counters);
        FastPathDesc {
            flows: fds.len() - 2,
            counters: fds.len() - 1,
            slots: f.slots(),
        }
    });
    let mut workers = Vec::new();
    for w in &q.workers {
        let st: UmemState = w.umem.export()?;
        fds.push(w.umem.memfd());
        let memfd = fds.len() - 1;
        let mut ports = Vec::new();
        for p in &w.ports {
            let x: XskState = p.sock.export();
            fds.push(p.sock.fd_borrowed());
            ports.push(PortDesc {
                fd: fds.len() - 1,
                ifindex: x.ifindex,
                queue: x.queue,
                zero_copy: x.zero_copy,
                ring_size: if x.rings == RingSizes::all(x.rings.rx) {
                    x.rings.rx
                } else {
                    0
                },
                rings: Some([x.rings.rx, x.rings.tx, x.rings.fill, x.rings.completion]),
                id: x.id,
                tx_outstanding: x.tx_outstanding,
                fill_outstanding: x.fill_outstanding,
                mac: p.mac,
                complete_checksums: p.complete_checksums,
                fill_target: p.fill_target,
            });
        }
        workers.push(WorkerDesc {
            index: w.index,
            memfd,
            frames: st.frames,
            frame_size: st.frame_size,
            free: st.free,
            owner: st.owner,
            next_socket_id: st.next_socket_id,
            ports,
        });
    }
    let mut link_descs = Vec::new();
    for a in q.links.values() {
        // Tap links have neither: the successor redirects them again (in place).
        let (Some(att), Some(xdp)) = (&a.attachment, &a.prog) else {
            continue;
        };
        let r = &a.report;
        fds.push(xdp.fd_borrowed());
        let prog = fds.len() - 1;
        fds.push(xdp.xsks.fd_borrowed());
        let xsks = fds.len() - 1;
        // A held (netlink) attachment has no link: the program stays attached by itself.
        let link = att.fd_borrowed().map(|fd| {
            fds.push(fd);
            fds.len() - 1
        });
        link_descs.push(LinkDesc {
            name: r.name.clone(),
            ifindex: r.ifindex,
            queues: r.queues,
            mode: r.mode.as_str().to_string(),
            zero_copy: r.zero_copy,
            driver: r.driver.clone(),
            complete_checksums: r.complete_checksums,
            insn_count: xdp.insn_count,
            prog,
            xsks,
            link,
            fast_path: r.fast_path,
        });
    }
    Ok((
        Description {
            version: DESCRIPTION_VERSION,
            maps: map_idx,
            fast_path,
            node_addrs: maps.node_addrs(),
            workers,
            links: link_descs,
        },
        fds,
    ))
}

/// Starts from a predecessor's kernel objects: its UMEMs, bound sockets, attached programs,
/// links and maps, described by `desc`, with `fds` in the order the description's indexes give
/// (`AfXdp::adopt` does the rest: nothing is created or attached).
pub fn adopt(
    opts: &RunOptions,
    tables: Arc<dyn Tables>,
    ct: Arc<Conntrack>,
    stats: Option<Arc<DataplaneStats>>,
    routes: Routes,
    desc: Description,
    fds: Vec<OwnedFd>,
) -> std::io::Result<AfXdp> {
    let parts = Parts::take(desc, fds)?;
    AfXdp::adopt(opts, tables, ct, stats, routes, parts)
}

impl Parts {
    /// The objects a description and its descriptors stand for, each checked against it.
    fn take(desc: Description, fds: Vec<OwnedFd>) -> std::io::Result<Parts> {
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        if desc.version != DESCRIPTION_VERSION {
            return Err(bad(format!(
                "description version {} (this build reads {DESCRIPTION_VERSION})",
                desc.version
            )));
        }
        let mut slots: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        let mut take = |i: usize| {
            slots
                .get_mut(i)
                .and_then(Option::take)
                .ok_or_else(|| bad(format!("descriptor {i} missing or used twice")))
        };
        let m = desc.maps;
        let maps = SharedMaps::from_fds(
            [
                take(m[0])?,
                take(m[1])?,
                take(m[2])?,
                take(m[3])?,
                take(m[4])?,
                take(m[5])?,
            ],
            desc.node_addrs.clone(),
        );
        // Emptied whether or not this process uses it: the programs handed over read it.
        let fast_path = match desc.fast_path {
            Some(f) => Some(
                kxdp_kernel::offload::FlowOffload::adopt(
                    take(f.flows)?,
                    take(f.counters)?,
                    f.slots,
                )
                .map_err(|e| bad(format!("the fast path's maps: {e}")))?,
            ),
            None => None,
        };
        // Interface names for the ports' counters, from the attached links.
        let names: Vec<(u32, String)> = desc
            .links
            .iter()
            .map(|l| (l.ifindex, l.name.clone()))
            .collect();
        let fast_path_links: Vec<u32> = (desc.links.iter())
            .filter(|l| l.fast_path && fast_path.is_some())
            .map(|l| l.ifindex)
            .collect();
        let mut workers = Vec::new();
        for w in desc.workers {
            let umem = Umem::adopt(
                take(w.memfd)?,
                UmemState {
                    frames: w.frames,
                    frame_size: w.frame_size,
                    free: w.free,
                    owner: w.owner,
                    next_socket_id: w.next_socket_id,
                },
            )?;
            let mut ports = Vec::new();
            for p in w.ports {
                let [rx, tx, fill, completion] = p.rings.unwrap_or([p.ring_size; 4]);
                let sock = XskSocket::adopt(
                    take(p.fd)?,
                    &XskState {
                        ifindex: p.ifindex,
                        queue: p.queue,
                        zero_copy: p.zero_copy,
                        rings: RingSizes {
                            rx,
                            tx,
                            fill,
                            completion,
                        },
                        id: p.id,
                        tx_outstanding: p.tx_outstanding,
                        fill_outstanding: p.fill_outstanding,
                    },
                )?;
                ports.push(Port {
                    sock,
                    ifindex: p.ifindex,
                    name: names
                        .iter()
                        .find(|(i, _)| *i == p.ifindex)
                        .map_or_else(|| crate::worker::port_name(p.ifindex), |(_, n)| n.clone()),
                    kernel: Default::default(),
                    mac: p.mac,
                    complete_checksums: p.complete_checksums,
                    fast_path: fast_path_links.contains(&p.ifindex),
                    fill_target: p.fill_target,
                    demand: Default::default(),
                });
            }
            workers.push((umem, ports));
        }
        let maps_arc = std::sync::Arc::new(maps);
        let mut links = Vec::new();
        for l in desc.links {
            let mode = match l.mode.as_str() {
                "native" => XdpMode::Native,
                "generic" => XdpMode::Generic,
                other => return Err(bad(format!("XDP mode {other:?} of {}", l.name))),
            };
            let prog =
                XdpProgram::from_fds(take(l.prog)?, take(l.xsks)?, maps_arc.clone(), l.insn_count);
            links.push(AttachedLink {
                report: InterfaceReport {
                    name: l.name,
                    ifindex: l.ifindex,
                    queues: l.queues,
                    mode,
                    zero_copy: l.zero_copy,
                    replaced_stale: false,
                    driver: l.driver,
                    complete_checksums: l.complete_checksums,
                    interception: Default::default(),
                    fast_path: fast_path_links.contains(&l.ifindex),
                },
                attachment: Some(Attachment::from_fd(
                    l.link.map(&mut take).transpose()?,
                    l.ifindex,
                    mode,
                )),
                prog: Some(prog),
            });
        }
        Ok(Parts {
            maps: maps_arc,
            fast_path,
            workers,
            links,
        })
    }
}
