//! Probes of the machine (CPUs online, memory left) and the checks of the config against
//! them, run just before anything is allocated.

use std::collections::BTreeSet;
use std::path::Path;

use super::errors::ConfigError;
use super::limits::{conntrack_bytes, MAX_CPU_ID};
use super::schema::DataplaneConfiguration;

/// What the machine offers, for `check_machine`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// CPU numbers online (`/sys/devices/system/cpu/online`).
    pub cpus: BTreeSet<usize>,
    /// Bytes this process may still allocate: MemAvailable, or the cgroup's limit minus its
    /// usage when lower. None: unknown (not checked).
    pub memory_available: Option<u64>,
}

impl Machine {
    /// Reads the machine's CPUs and memory from /sys and /proc.
    pub fn probe() -> Machine {
        let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|s| parse_cpu_list(&s))
            .unwrap_or_else(|| {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..n).collect()
            });
        let meminfo = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| meminfo_field(&s, "MemAvailable:"));
        let cgroup = cgroup_memory_left();
        let memory_available = match (meminfo, cgroup) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Machine {
            cpus,
            memory_available,
        }
    }
}

/// Parses the kernel's CPU list format: `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<BTreeSet<usize>> {
    let mut out = BTreeSet::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b > MAX_CPU_ID {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    Some(out)
}

/// `0-3,8` back from a set.
pub(super) fn format_cpu_list(cpus: &BTreeSet<usize>) -> String {
    let mut parts = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end = it.next().unwrap_or(end);
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    parts.join(",")
}

pub(super) fn meminfo_field(meminfo: &str, name: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line[name.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// cgroup v2: `memory.max` minus `memory.current` of this process's cgroup (a pod's limit).
pub(super) fn cgroup_memory_left() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max": no limit
    let cur: u64 = std::fs::read_to_string(dir.join("memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(max.saturating_sub(cur))
}

pub(super) fn mib(b: u64) -> u64 {
    b.div_ceil(1 << 20)
}

impl DataplaneConfiguration {
    /// Checks the configuration against the machine it is about to run on: every CPU in
    /// `workers.cpus` exists, and the memory it asks for (the conntrack table; with
    /// `with_umem`, one UMEM per worker) is available. `file` names the source in errors.
    pub fn check_machine(
        &self,
        machine: &Machine,
        with_umem: bool,
        file: &Path,
    ) -> Result<(), ConfigError> {
        self.check_cpus(machine, file)?;
        self.check_memory(machine, with_umem, file)
    }

    /// `interfaces` against the node's links: an entry that matches a bridge while an entry
    /// matches, or could match, the bridge's ports is refused (the kernel takes XDP on a bridge
    /// or on its ports, not both; every pod created later would be refused its program).
    pub fn check_interfaces(
        &self,
        links: &[kxdp_dataplane::fib::Link],
        file: &Path,
    ) -> Result<(), ConfigError> {
        for bridge in links {
            let Some((on_bridge, on_port, port)) =
                kxdp_dataplane::io::runner::bridge_conflict(&self.interfaces, bridge, links)
            else {
                continue;
            };
            let i = self
                .interfaces
                .iter()
                .position(|p| p == on_bridge)
                .unwrap_or(0);
            return Err(ConfigError {
                file: file.to_path_buf(),
                line: None,
                field: format!("interfaces[{i}]"),
                message: format!(
                    "`{on_bridge}` matches the bridge {} and `{on_port}` matches its port {port}: \
                     the kernel takes XDP on a bridge or on its ports, not both, so pods created \
                     later could not be attached; list the ports only (remove `{on_bridge}`, \
                     e.g. interfaces: [eth0, \"veth*\"]; docs/afxdp.md § Bridges)",
                    bridge.name
                ),
            });
        }
        Ok(())
    }

    /// The CPU half of `check_machine`: every CPU in `workers.cpus` is online.
    pub fn check_cpus(&self, machine: &Machine, file: &Path) -> Result<(), ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            file: file.to_path_buf(),
            line: None,
            field: field.to_string(),
            message,
        };
        for (i, cpu) in self.workers.cpus.iter().enumerate() {
            if !machine.cpus.contains(cpu) {
                return Err(err(
                    &format!("workers.cpus[{i}]"),
                    format!(
                        "CPU {cpu} does not exist on this machine (its CPUs: {})",
                        format_cpu_list(&machine.cpus)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The memory half of `check_machine` (what `replay` checks: it pins no worker to the
    /// configured CPUs, but allocates the conntrack table).
    pub fn check_memory(
        &self,
        machine: &Machine,
        with_umem: bool,
        file: &Path,
    ) -> Result<(), ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            file: file.to_path_buf(),
            line: None,
            field: field.to_string(),
            message,
        };
        let Some(available) = machine.memory_available else {
            return Ok(());
        };
        let ct = conntrack_bytes(self.ct_config().max_entries);
        let umem = if with_umem {
            self.afxdp.umem_bytes() * self.workers.count as u64
        } else {
            0
        };
        if ct + umem > available {
            let (field, what) = if umem > ct {
                (
                    "workers.count",
                    format!(
                        "{} workers need {} MiB of packet buffers (UMEM, {} MiB each) plus {} MiB of conntrack table",
                        self.workers.count,
                        mib(umem),
                        mib(self.afxdp.umem_bytes()),
                        mib(ct)
                    ),
                )
            } else {
                (
                    "conntrack.maxEntries",
                    format!(
                        "a conntrack table of {} entries needs {} MiB{}",
                        self.ct_config().max_entries,
                        mib(ct),
                        if umem > 0 {
                            format!(" plus {} MiB of packet buffers (UMEM)", mib(umem))
                        } else {
                            String::new()
                        }
                    ),
                )
            };
            return Err(err(
                field,
                format!(
                    "{what}, but only {} MiB is available on this machine",
                    mib(available)
                ),
            ));
        }
        Ok(())
    }
}
