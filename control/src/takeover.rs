//! Takeover: a new `kxdp run` takes the dataplane over from a running one without losing a
//! packet (docs/operations.md § Upgrades).
//!
//! The running kxdp listens on a Unix socket (`--takeover-socket`, default
//! `/run/kxdp/takeover.sock`, mode 0600 in a 0700 directory: root only). A new one, once its
//! tables are published, connects and the two talk (JSON messages, descriptors attached with
//! `SCM_RIGHTS`; `kxdp_kernel::handover`):
//!
//! 1. new → old `Request` (protocol version, the new one's pid, network namespace and node name).
//!    The old one refuses a request from another network namespace or node (`Refused`): the
//!    new one then starts clean.
//! 2. old: stops its workers at a batch boundary (sockets stay bound, programs attached: what
//!    arrives waits on the RX rings) → new `Parcel`: the dataplane's description
//!    (`kxdp_dataplane::io::takeover`), the host path's moved `local` rules, and every
//!    descriptor (UMEM memfds, AF_XDP sockets, programs, XSKMAPs, BPF links, shared maps).
//! 3. new: adopts them (`io::takeover::adopt`, `RunningHostPath::start_or_adopt`), starts its workers
//!    → old `Adopted` (or `Failed`: the old one restarts its workers and carries on).
//! 4. old: closes its descriptors without detaching anything, stops its servers (so the new
//!    one can bind the same ports and admin socket) → new `Released`; the old one exits 0.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kxdp_dataplane::io::runner::{AfXdp, Quiesced};
use kxdp_dataplane::io::takeover::Description;
use kxdp_kernel::handover::{recv_message, send_message};
use serde::{Deserialize, Serialize};

/// Where a running kxdp listens for its successor.
pub const DEFAULT_SOCKET: &str = "/run/kxdp/takeover.sock";

/// The conversation's version (the description has its own).
pub const PROTOCOL: u32 = 1;

/// How long the old process waits for the new one to adopt (its workers are stopped meanwhile,
/// so packets queue on the RX rings): a successor that takes longer is treated as failed.
const ADOPT_WAIT: Duration = Duration::from_secs(10);

/// How long a successor waits for a predecessor that stops (it detaches and removes the host
/// path, as on SIGTERM).
const STOP_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    protocol: u32,
    /// The dataplane description version the new side reads.
    #[serde(default)]
    description: u32,
    pid: u32,
    netns: String,
    node_name: String,
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Refused {
        reason: String,
    },
    /// The two builds cannot hand over (their descriptions differ): the old one stops as on
    /// SIGTERM and closes the connection when it is gone; the new one then starts clean (a
    /// restart, with its gap).
    Stopping {
        reason: String,
    },
    Parcel {
        pid: u32,
        dataplane: Description,
        /// The host path's moved `local` rules (family, priority, protocol); None: no host path.
        host_path: Option<Vec<(u8, u32, u8)>>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Adopted,
    Failed { reason: String },
}

#[derive(Debug, Serialize, Deserialize)]
enum Done {
    Released,
}

/// This thread's network namespace, as `/proc` names it (`net:[4026531840]`).
fn netns() -> String {
    std::fs::read_link("/proc/thread-self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn send_json<T: Serialize>(
    sock: &UnixStream,
    v: &T,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    let bytes = serde_json::to_vec(v).map_err(io::Error::other)?;
    send_message(sock, &bytes, fds)
}

fn recv_json<T: for<'de> Deserialize<'de>>(sock: &UnixStream) -> io::Result<(T, Vec<OwnedFd>)> {
    let (bytes, fds) = recv_message(sock)?;
    let v = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("takeover message: {e}"))
    })?;
    Ok((v, fds))
}

/// The running side's listener: accepted connections go to `on_connection`'s channel.
pub struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    /// Binds `path` (replacing a socket nobody answers on; the directory is created 0700) and
    /// hands every connection to `tx`.
    pub fn start(
        path: &Path,
        tx: tokio::sync::mpsc::UnboundedSender<UnixStream>,
    ) -> io::Result<Listener> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::create_dir_all(dir)?;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
        }
        // The predecessor's socket (it has released everything by now) or a dead one.
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let l = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kxdp-takeover".into())
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((c, _)) => {
                            let _ = c.set_nonblocking(false);
                            if tx.send(c).is_err() {
                                return;
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })?;
        Ok(Listener {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // The socket file is left: after a takeover it is the successor's.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What became of a takeover request on the running side.
pub enum Outcome {
    /// The successor adopted everything: release `Quiesced`, stop the servers, then `released`.
    HandedOver {
        quiesced: Quiesced,
        conn: UnixStream,
        pid: u32,
        took: Duration,
        summary: String,
    },
    /// Refused or failed: the dataplane runs on (resumed if it had been stopped).
    Continue { afxdp: AfXdp, why: String },
    /// The successor cannot adopt this build's dataplane: stop as on SIGTERM (keep `conn` open
    /// until exiting, the successor waits for it to close).
    Stop {
        afxdp: AfXdp,
        conn: UnixStream,
        why: String,
    },
}

/// Answers a takeover request on the running side (see the module docs).
pub fn hand_over(
    conn: UnixStream,
    afxdp: AfXdp,
    moved_local: Option<Vec<(u8, u32, u8)>>,
    node_name: &str,
    ct: &kxdp_dataplane::conntrack::Conntrack,
) -> Outcome {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let req: Request = match recv_json(&conn) {
        Ok((r, _)) => r,
        Err(e) => {
            return Outcome::Continue {
                afxdp,
                why: format!("unreadable request: {e}"),
            }
        }
    };
    let own = netns();
    let refuse = if req.protocol != PROTOCOL {
        Some(format!(
            "protocol {} (this kxdp speaks {PROTOCOL})",
            req.protocol
        ))
    } else if req.netns != own {
        Some(format!(
            "pid {} is in network namespace {}, this kxdp in {own}",
            req.pid, req.netns
        ))
    } else if req.node_name != node_name {
        Some(format!(
            "pid {} runs for node {:?}, this kxdp for {node_name:?}",
            req.pid, req.node_name
        ))
    } else {
        None
    };
    let version = kxdp_dataplane::io::takeover::DESCRIPTION_VERSION;
    if refuse.is_none() && req.description != version {
        let reason = format!(
            "pid {} reads dataplane description version {}, this kxdp writes {version}",
            req.pid, req.description
        );
        let _ = send_json(
            &conn,
            &Answer::Stopping {
                reason: reason.clone(),
            },
            &[],
        );
        return Outcome::Stop {
            afxdp,
            conn,
            why: reason,
        };
    }
    if let Some(reason) = refuse {
        let _ = send_json(
            &conn,
            &Answer::Refused {
                reason: reason.clone(),
            },
            &[],
        );
        return Outcome::Continue {
            afxdp,
            why: format!("refused: {reason}"),
        };
    }
    let started = std::time::Instant::now();
    let quiesced = afxdp.quiesce();
    // The workers have stopped: the conntrack state file is consistent. Mark it so and let go
    // of its lock, so that the successor maps it (and rebuilds its index) before it adopts the
    // sockets. Should the takeover fail, this kxdp carries on with the same mapping.
    ct.mark_clean_shutdown();
    let sent = match kxdp_dataplane::io::takeover::describe(&quiesced) {
        Ok((desc, fds)) => {
            let summary = desc.summary();
            let answer = Answer::Parcel {
                pid: std::process::id(),
                dataplane: desc,
                host_path: moved_local,
            };
            send_json(&conn, &answer, &fds).map(|_| summary)
        }
        Err(e) => {
            let _ = send_json(
                &conn,
                &Answer::Refused {
                    reason: e.to_string(),
                },
                &[],
            );
            Err(e)
        }
    };
    let reply = sent.and_then(|summary| {
        conn.set_read_timeout(Some(ADOPT_WAIT))?;
        let (r, _) = recv_json::<Reply>(&conn)?;
        Ok((r, summary))
    });
    match reply {
        Ok((Reply::Adopted, summary)) => Outcome::HandedOver {
            quiesced,
            conn,
            pid: req.pid,
            took: started.elapsed(),
            summary,
        },
        other => {
            let why = match other {
                Ok((Reply::Failed { reason }, _)) => format!("pid {} failed: {reason}", req.pid),
                Err(e) => format!("pid {}: {e}", req.pid),
                Ok((Reply::Adopted, _)) => unreachable!(),
            };
            match quiesced.resume() {
                Ok(afxdp) => Outcome::Continue { afxdp, why },
                Err(e) => {
                    // Workers that cannot restart leave nothing to forward with.
                    tracing::error!(
                        "kxdp run: takeover by {why}; restarting the workers failed: {e}"
                    );
                    std::process::exit(1);
                }
            }
        }
    }
}

/// Tells the successor everything is released (its servers may bind now).
pub fn released(conn: &UnixStream) {
    let _ = send_json(conn, &Done::Released, &[]);
}

/// What the new side received.
pub struct Parcel {
    pub pid: u32,
    pub dataplane: Description,
    pub fds: Vec<OwnedFd>,
    pub host_path: Option<Vec<(u8, u32, u8)>>,
}

/// The new side: connects to a running kxdp (None with the reason when there is none).
pub fn connect(path: &Path) -> Result<UnixStream, String> {
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Asks for the dataplane. `Ok(Err(reason))`: refused (nothing was stopped; start clean), or
/// the predecessor cannot hand over to this build and has stopped (this function returns once
/// it is gone, at most `STOP_WAIT` later): start clean.
pub fn request(
    conn: &UnixStream,
    node_name: &str,
    description: u32,
) -> io::Result<Result<Parcel, String>> {
    conn.set_read_timeout(Some(ADOPT_WAIT))?;
    send_json(
        conn,
        &Request {
            protocol: PROTOCOL,
            description,
            pid: std::process::id(),
            netns: netns(),
            node_name: node_name.to_string(),
        },
        &[],
    )?;
    let (answer, fds) = recv_json::<Answer>(conn)?;
    Ok(match answer {
        Answer::Refused { reason } => Err(reason),
        Answer::Stopping { reason } => {
            // The connection closes when the predecessor exits (its sockets and programs are
            // gone by then).
            conn.set_read_timeout(Some(STOP_WAIT))?;
            let mut buf = [0u8; 64];
            let mut r = conn;
            while matches!(std::io::Read::read(&mut r, &mut buf), Ok(n) if n > 0) {}
            Err(format!("{reason}; it stopped (a restart, not a takeover)"))
        }
        Answer::Parcel {
            pid,
            dataplane,
            host_path,
        } => Ok(Parcel {
            pid,
            dataplane,
            fds,
            host_path,
        }),
    })
}

/// The new side's answer after adopting (or failing to).
pub fn reply(conn: &UnixStream, result: Result<(), String>) -> io::Result<()> {
    let r = match result {
        Ok(()) => Reply::Adopted,
        Err(reason) => Reply::Failed { reason },
    };
    send_json(conn, &r, &[])
}

/// Waits (bounded) until the predecessor has released its servers.
pub fn wait_released(conn: &UnixStream, timeout: Duration) -> io::Result<()> {
    conn.set_read_timeout(Some(timeout))?;
    let (Done::Released, _) = recv_json::<Done>(conn)?;
    Ok(())
}

/// `--takeover-socket` and `--clean-start`.
#[derive(Clone, Debug, Default)]
pub struct TakeoverOptions {
    /// Where to listen for a successor and look for a predecessor; None: neither.
    pub socket: Option<PathBuf>,
    /// Do not take over a running kxdp (still listen for a successor).
    pub clean_start: bool,
    /// After handing over, stay (doing nothing) until SIGTERM instead of exiting: a DaemonSet
    /// pod's container that exits is restarted by the kubelet, and the restarted old version
    /// would take the dataplane back.
    pub wait_after_handover: bool,
    /// Testing: receive the predecessor's dataplane, then report a failure instead of adopting
    /// it (the predecessor resumes; tests/takeover_lab.rs).
    pub fail_for_test: bool,
    /// Testing: claim to read this description version instead of this build's (a layout
    /// change: the predecessor stops and this process starts clean).
    pub description_for_test: Option<u32>,
}
