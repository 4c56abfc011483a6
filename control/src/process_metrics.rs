//! The process metrics every Prometheus client exports (`process_*`, the names of the Go and
//! Python clients, which kube-proxy's `/metrics` carries too) and `kxdp_build_info` (the shape of
//! `kubernetes_build_info`), read from /proc at scrape time. prometheus-client has no process
//! collector on Linux without extra C-free crates, and /proc is a few lines of text.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};

/// Linux reports CPU times in /proc in USER_HZ ticks, 100 per second on every architecture
/// (part of the ABI, independent of the kernel's CONFIG_HZ).
const USER_HZ: f64 = 100.0;

/// What /proc says about this process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub start_time_seconds: f64,
}

impl ProcessSample {
    pub fn read() -> Option<ProcessSample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces: fields start after its closing paren.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): utime is field 14, stime 15, starttime 22, vsize 23,
        // rss 24 (pages).
        let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
        let cpu_seconds = (num(14)? + num(15)?) as f64 / USER_HZ;
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let kb = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|k| k * 1024)
        };
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()?
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
            .unwrap_or(0);
        Some(ProcessSample {
            cpu_seconds,
            resident_bytes: kb("VmRSS:").unwrap_or(0),
            virtual_bytes: num(23).unwrap_or(0),
            open_fds,
            max_fds,
            start_time_seconds: btime + num(22)? as f64 / USER_HZ,
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    git_commit: String,
    compiler: String,
    platform: String,
}

/// The labels of `kxdp_build_info`: the crate version, the commit (`KXDP_GIT_COMMIT` at build
/// time, e.g. set by the Dockerfile; else `unknown`), and the target platform.
pub fn build_info() -> [(&'static str, String); 4] {
    [
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        (
            "git_commit",
            option_env!("KXDP_GIT_COMMIT")
                .unwrap_or("unknown")
                .to_string(),
        ),
        ("compiler", "rustc".to_string()),
        (
            "platform",
            format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ),
    ]
}

/// Encodes `process_*` and `kxdp_build_info` at each scrape.
#[derive(Debug)]
pub struct ProcessCollector;

fn put<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    m: &M,
) -> Result<(), std::fmt::Error> {
    m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let [v, g, c, p] = build_info();
        let info = Family::<BuildLabels, Gauge>::default();
        info.get_or_create(&BuildLabels {
            version: v.1,
            git_commit: g.1,
            compiler: c.1,
            platform: p.1,
        })
        .set(1);
        put(
            &mut enc,
            "kxdp_build_info",
            "A metric with a constant '1' value labeled by the version, commit, compiler and platform kxdp was built from",
            &info,
        )?;
        let Some(s) = ProcessSample::read() else {
            return Ok(());
        };
        put(
            &mut enc,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            &ConstCounter::new(s.cpu_seconds),
        )?;
        put(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            &ConstGauge::new(s.resident_bytes as i64),
        )?;
        put(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            &ConstGauge::new(s.virtual_bytes as i64),
        )?;
        put(
            &mut enc,
            "process_open_fds",
            "Number of open file descriptors",
            &ConstGauge::new(s.open_fds as i64),
        )?;
        put(
            &mut enc,
            "process_max_fds",
            "Maximum number of open file descriptors",
            &ConstGauge::new(s.max_fds as i64),
        )?;
        put(
            &mut enc,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            &ConstGauge::new(s.start_time_seconds),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let s = ProcessSample::read().unwrap();
        assert!(s.resident_bytes > 1 << 20, "{s:?}");
        assert!(s.virtual_bytes >= s.resident_bytes, "{s:?}");
        assert!(s.open_fds >= 3 && s.max_fds >= s.open_fds, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86400.0 * 365.0,
            "{s:?}"
        );
    }
}
