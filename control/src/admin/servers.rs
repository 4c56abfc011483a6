//! What `kxdp run` starts for operators next to the control loop: the shared dataplane state
//! (conntrack, worker stats), `/metrics`, `/healthz` + `/livez`, the health-check node port
//! servers and the admin socket. One call from `run.rs`: `start`.
//! With `--inject-pcap` (a test path), also the pseudo-worker of `super::inject`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kxdp_dataplane::conntrack::Conntrack;
use kxdp_dataplane::stats::DataplaneStats;

use super::{AdminContext, AdminServer, Dataplane};
use crate::config::{Config, StateFile, DEFAULT_STATE_FILE};
use crate::error::RunError;
use crate::health::{serve_http, ProxyHealth, Response};
use crate::metrics::Metrics;
use crate::sync::{ControlHandle, Published};

/// `kxdp run`'s operator options.
#[derive(Clone, Debug, Default)]
pub struct OpsOptions {
    /// Admin socket path (default `/run/kxdp/admin.sock`); `None` with `no_admin`.
    pub admin_socket: Option<PathBuf>,
    pub no_admin: bool,
    /// Test path: a capture replayed by a pseudo-worker whenever it changes.
    pub inject_pcap: Option<PathBuf>,
}

/// Keeps the servers running; dropping it stops them.
pub struct Ops {
    pub dataplane: Dataplane,
    pub context: Arc<AdminContext>,
    _admin: Option<AdminServer>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Ops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The dataplane state `kxdp run` shares between workers and the admin API: conntrack sized by
/// the config, and one stats block per worker (`extra` more for pseudo-workers).
pub fn dataplane(config: &Config, extra: usize) -> Dataplane {
    let workers = config.workers.count.max(1) + extra;
    let ct = match config.conntrack.state_file() {
        StateFile::Off => Conntrack::new(config.ct_config(), workers),
        StateFile::Set(path) => {
            if config.conntrack.state_file_huge_pages {
                huge_page_dir(Path::new(path));
            }
            open_state_file(Path::new(path), config, workers)
        }
        StateFile::Default => open_default_state_file(config, workers),
    };
    Dataplane {
        ct: Arc::new(ct),
        stats: Arc::new(DataplaneStats::new(workers)),
    }
}

/// The conntrack table in `conntrack.stateFile`, continuing the previous process's connections
/// when the file is readable. A file another kxdp still holds (one that is stopping, or handing
/// over) is waited for; a file that cannot be created at all leaves the table in process memory
/// with a warning: forwarding matters more than keeping state.
fn open_state_file(path: &Path, config: &Config, workers: usize) -> Conntrack {
    open_file_waiting(path, config, workers).unwrap_or_else(|e| {
        tracing::warn!(
            "kxdp run: conntrack.stateFile {}: {e}; keeping the conntrack table in process memory (a restart will lose it)",
            path.display()
        );
        Conntrack::new(config.ct_config(), workers)
    })
}

/// `conntrack.stateFile` unset: `DEFAULT_STATE_FILE` when its directory is (or can be made) on a
/// tmpfs and the file can be written there; otherwise the table in process memory, with one
/// line saying why and what to set. A file on a disk would outlive a reboot and be written back
/// to the disk page by page as connections come and go.
fn open_default_state_file(config: &Config, workers: usize) -> Conntrack {
    let path = Path::new(DEFAULT_STATE_FILE);
    let in_memory = |why: String| {
        tracing::warn!(
            "kxdp run: conntrack.stateFile is not set and its default {DEFAULT_STATE_FILE} cannot be used ({why}): the conntrack table is in process memory, so a restart of kxdp loses every connection; set conntrack.stateFile to a file on a tmpfs, or to \"\" to keep the table in memory without this warning"
        );
        Conntrack::new(config.ct_config(), workers)
    };
    if let Err(why) = default_state_dir_usable(path) {
        return in_memory(why);
    }
    if config.conntrack.state_file_huge_pages {
        huge_page_dir(path);
    }
    match open_file_waiting(path, config, workers) {
        Ok(ct) => ct,
        Err(e) => in_memory(e.to_string()),
    }
}

/// Whether the default state file's directory is on a tmpfs (looked at before it is made, so
/// that nothing is left on a disk), and exists or can be made.
fn default_state_dir_usable(path: &Path) -> Result<(), String> {
    use kxdp_kernel::mount;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let existing = dir
        .ancestors()
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    let m = mount::mount_of(existing).map_err(|e| format!("{}: {e}", existing.display()))?;
    if m.fs_type != "tmpfs" {
        return Err(format!(
            "{} is on {}, not a tmpfs",
            existing.display(),
            m.fs_type
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the directory {}: {e}", dir.display()))
}

/// `Conntrack::open_file`, waiting (up to `STATE_FILE_WAIT`) for another kxdp that still holds
/// the file (one that is stopping, or handing over).
fn open_file_waiting(path: &Path, config: &Config, workers: usize) -> std::io::Result<Conntrack> {
    let deadline = std::time::Instant::now() + STATE_FILE_WAIT;
    loop {
        match Conntrack::open_file(path, config.ct_config(), workers) {
            // (`kxdp run` logs the report.)
            Ok((ct, _report)) => return Ok(ct),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// What `conntrack.stateFileHugePages` asks: the state file's directory a tmpfs that gives huge
/// pages. An earlier kxdp's mount (the DaemonSet shares it with the host) is used as it is; an
/// empty directory that is not a mount point gets one; anything else is left alone (mounting
/// over files would hide them), with a warning: the table then works the same in 4 KiB pages.
fn huge_page_dir(state_file: &Path) {
    match prepare_huge_page_dir(state_file) {
        Ok(None) => {}
        Ok(Some(done)) => tracing::info!("kxdp run: {done}"),
        Err(why) => tracing::warn!("kxdp run: {why}; the state file stays in 4 KiB pages"),
    }
}

/// `kxdp prepare` and `kxdp run`: makes the directory of `conntrack.stateFile` a tmpfs with huge
/// pages when the config asks (see `huge_page_dir`). Ok(None): nothing to do (not asked, or
/// already one); Ok(Some(what was done)); Err(why not, in words).
pub fn prepare_state_dir(config: &Config) -> Result<Option<String>, String> {
    let ct = &config.conntrack;
    match ct.state_file_path() {
        Some(path) if ct.state_file_huge_pages => prepare_huge_page_dir(Path::new(path)),
        _ => Ok(None),
    }
}

fn prepare_huge_page_dir(state_file: &Path) -> Result<Option<String>, String> {
    let Some(dir) = state_file.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Err(format!(
            "conntrack.stateFileHugePages: {}: the state file needs a directory of its own, named in its path (such as /run/kxdp/ct/conntrack)",
            state_file.display()
        ));
    };
    let why = |e: String| format!("conntrack.stateFileHugePages: {}: {e}", dir.display());
    let outcome = ensure_huge_page_dir(dir).map_err(why)?;
    if matches!(outcome, HugeDir::MountedPrivate) {
        tracing::warn!(
            "kxdp: the tmpfs mounted at {} has private propagation, in a mount namespace kxdp cannot compare with the host's: if it is kxdp's own (a container volume without mountPropagation: Bidirectional), a restarted kxdp will not find the state file",
            dir.display()
        );
    }
    Ok((!matches!(outcome, HugeDir::Present)).then(|| {
        format!(
            "mounted a tmpfs with huge pages (huge=within_size) at {} for conntrack.stateFile",
            dir.display()
        )
    }))
}

enum HugeDir {
    /// Already a tmpfs with huge pages.
    Present,
    /// Mounted now, shared with the host (or in its namespace).
    Mounted,
    /// Mounted now, private, in a namespace that may be kxdp's own.
    MountedPrivate,
}

fn ensure_huge_page_dir(dir: &Path) -> Result<HugeDir, String> {
    use kxdp_kernel::mount;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create the directory: {e}"))?;
    match mount::mount_at(dir).map_err(|e| format!("cannot read the mount table: {e}"))? {
        Some(m) if m.gives_huge_pages() => return Ok(HugeDir::Present),
        Some(m) => {
            return Err(format!(
                "already a mount point ({}, options {}) without huge pages",
                m.fs_type, m.super_options
            ))
        }
        None => {}
    }
    let empty = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list the directory: {e}"))?
        .next()
        .is_none();
    if !empty {
        return Err("not empty, and not a mount point: kxdp mounts a tmpfs only on an empty directory (move the state file into a directory of its own)".into());
    }
    mount::mount_huge_tmpfs(dir).map_err(|e| format!("cannot mount a tmpfs there: {e}"))?;
    // A mount private to kxdp's mount namespace (a container volume without
    // `mountPropagation: Bidirectional`, `ip netns exec`) goes with the process, and with it
    // the state file: the next kxdp would find an empty directory and lose every connection.
    // Keeping connections matters more than huge pages: undo it. (In PID 1's namespace a
    // private mount stays: a host whose root is not shared.)
    if mount::mount_at(dir).is_ok_and(|m| m.is_some_and(|m| m.shared)) {
        return Ok(HugeDir::Mounted);
    }
    match mount::in_init_mount_namespace() {
        Some(true) => Ok(HugeDir::Mounted),
        None => Ok(HugeDir::MountedPrivate),
        Some(false) => {
            let undone = mount::unmount(dir);
            Err(format!(
                "a tmpfs mounted there would be private to kxdp's mount namespace{}, so a restarted kxdp would not find the state file; share the directory with the host (DaemonSet: mountPropagation: Bidirectional) or mount the tmpfs there beforehand (mount -t tmpfs -o huge=within_size,mode=0700 tmpfs DIR)",
                match undone {
                    Ok(()) => String::new(),
                    Err(e) => format!(" (and unmounting it failed: {e})"),
                }
            ))
        }
    }
}

/// How long a start waits for another kxdp to let go of the state file.
const STATE_FILE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn bind(
    rt: &tokio::runtime::Handle,
    addr: SocketAddr,
    what: &'static str,
) -> Result<tokio::net::TcpListener, RunError> {
    rt.block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|source| RunError::Listen { what, addr, source })
}

/// Starts `/metrics`, health, the health-check node port servers and the admin socket.
pub fn start(
    config: &Config,
    published: Arc<Published>,
    handle: &ControlHandle,
    metrics: Arc<Metrics>,
    dp: Dataplane,
    opts: &OpsOptions,
) -> Result<Ops, RunError> {
    let rt = handle.runtime().clone();
    let stop = Arc::new(AtomicBool::new(false));
    metrics.attach_dataplane(dp.stats.clone(), dp.ct.clone());
    let tables = published.clone();
    metrics.attach_policy_tables(move || tables.load_full().policy.clone());
    let context = Arc::new(AdminContext {
        published: published.clone(),
        dataplane: dp.clone(),
        status: handle.status_cell(),
        listening: Mutex::new(serde_json::Map::new()),
        control: Some(handle.sender()),
        daemon: Default::default(),
    });
    let mut threads = Vec::new();

    if let Some(addr) = config.metrics_bind_address {
        let l = bind(&rt, addr, "metricsBindAddress")?;
        let local = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        context
            .listening
            .lock()
            .unwrap()
            .insert("metrics".into(), local.into());
        let m = metrics.clone();
        let configz = crate::metrics::configz(config);
        rt.spawn(serve_http(
            l,
            Arc::new(move |path: &str| {
                if let Some((content_type, body)) =
                    crate::metrics::metrics_route(path, &m, &configz)
                {
                    Response {
                        status: 200,
                        content_type,
                        headers: vec![],
                        body,
                    }
                } else {
                    Response {
                        status: 404,
                        content_type: "text/plain; charset=utf-8",
                        headers: vec![],
                        body: "404 page not found\n".into(),
                    }
                }
            }),
        ));
    }
    let hc_ip = config
        .healthz_bind_address
        .map(|a| a.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let proxy_health = Arc::new(ProxyHealth {
        status: handle.status_cell(),
        sync_period: config.sync.sync_period.0,
        metrics: metrics.clone(),
        workers: Some(dp.stats.clone()),
        worker_stall_ms: crate::health::WORKER_STALL_MS,
    });
    {
        let mut info = context.daemon.lock().unwrap();
        info.health = Some(proxy_health.clone());
        info.interfaces = config.interfaces.clone();
    }
    if let Some(addr) = config.healthz_bind_address {
        let h = proxy_health.clone();
        // As kube-proxy: a health server that cannot listen is logged and retried, it does not
        // stop the dataplane.
        let ctx = context.clone();
        rt.spawn(async move {
            let mut warned = false;
            loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => {
                        let local = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                        ctx.listening
                            .lock()
                            .unwrap()
                            .insert("healthz".into(), local.into());
                        serve_http(l, Arc::new(move |p: &str| h.answer(p))).await;
                        return;
                    }
                    Err(e) => {
                        if !warned {
                            tracing::error!(
                                "kxdp run: healthzBindAddress {addr}: {e}; retrying every 5 s"
                            );
                            warned = true;
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            }
        });
    }
    threads.push(
        crate::health::spawn_service_health(rt.clone(), hc_ip, proxy_health, stop.clone())
            .map_err(|source| RunError::Spawn {
                what: "the health check node port servers",
                source,
            })?,
    );

    let admin = if opts.no_admin {
        None
    } else {
        let path = opts
            .admin_socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(super::DEFAULT_SOCKET));
        // Without its admin socket the dataplane still runs: say so loudly and go on (another
        // kxdp holding the socket is the usual cause).
        match super::serve(&path, context.clone(), &rt) {
            Ok(server) => {
                context
                    .listening
                    .lock()
                    .unwrap()
                    .insert("admin".into(), path.display().to_string().into());
                Some(server)
            }
            Err(e) => {
                tracing::error!(
                    "kxdp run: admin socket {}: {e}; running without it",
                    path.display()
                );
                None
            }
        }
    };

    if let Some(pcap) = &opts.inject_pcap {
        threads.push(super::inject::spawn(pcap, &dp, &published, &stop)?);
    }

    Ok(Ops {
        dataplane: dp,
        context,
        _admin: admin,
        stop,
        threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
    }

    /// `conntrack.stateFileHugePages`: an empty directory gets a huge-page tmpfs, which a later
    /// start finds and keeps; a directory with files is left alone. Root only (mount), as CI runs.
    #[test]
    fn a_huge_page_dir_is_mounted_once_and_only_where_empty() {
        if !is_root() {
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("ct");
        let busy = base.path().join("busy");
        std::fs::create_dir(&busy).unwrap();
        std::fs::write(busy.join("other"), b"x").unwrap();
        let first = ensure_huge_page_dir(&dir);
        let outcome = std::panic::catch_unwind(|| {
            assert!(
                matches!(first, Ok(HugeDir::Mounted | HugeDir::MountedPrivate)),
                "{:?}",
                first.as_ref().err()
            );
            assert!(matches!(ensure_huge_page_dir(&dir), Ok(HugeDir::Present)));
            // The state file made there is in huge pages (where the kernel has any to give).
            let cfg = kxdp_dataplane::conntrack::CtConfig {
                max_entries: 100_000,
                ..Default::default()
            };
            let (ct, _) = Conntrack::open_file(&dir.join("conntrack"), cfg, 1).unwrap();
            let mem = ct.memory();
            assert!(mem.in_file);
            let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_default();
            if !thp.contains("[never]") {
                assert!(
                    mem.huge_page_bytes.unwrap() >= mem.bytes / 2,
                    "{mem:?}: the file is not in huge pages"
                );
            }
            let e = ensure_huge_page_dir(&busy).err().unwrap();
            assert!(e.contains("not empty"), "{e}");
            assert!(busy.join("other").exists());
        });
        if matches!(first, Ok(HugeDir::Mounted | HugeDir::MountedPrivate)) {
            kxdp_kernel::mount::unmount(&dir).unwrap();
        }
        outcome.unwrap();
    }
}
