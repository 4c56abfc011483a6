//! The network-namespace lab: namespaces and veth pairs built with `ip`, torn down on every exit
//! path (the `Lab` guard deletes its namespaces when dropped, also while a failing test unwinds;
//! namespaces left by a test process that was killed are removed by the next `Lab::new`).
//!
//! Namespaces are named `kxdpt-<pid>-<n>-<name>`, so concurrent test binaries never collide.
//! Traffic only flows between namespaces a test created.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicU32 = AtomicU32::new(0);

const PREFIX: &str = "kxdpt-";

pub struct Lab {
    netns: Vec<String>,
}

/// Whether lab tests can run here. Prints why not and returns false only where the kernel lacks
/// AF_XDP; without root the lab cannot be built at all, which is a failure, not a skip.
pub fn available(test: &str) -> bool {
    if !kxdp_dataplane::io::afxdp::af_xdp_available() {
        eprintln!("SKIPPED {test}: this kernel has no AF_XDP sockets (EAFNOSUPPORT)");
        return false;
    }
    // SAFETY-free check through the uid of /proc/self.
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "{test}: the lab tests need root (network namespaces, XDP); CI runs them as root"
    );
    true
}

/// Runs a command, panicking with its output when it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip -n NS ARGS...`
pub fn ip(ns: &str, args: &str) -> String {
    let mut a = vec!["-n", ns];
    a.extend(args.split_whitespace());
    run("ip", &a)
}

/// Runs `cmd` (through `sh -c`) inside `ns`.
pub fn sh(ns: &str, cmd: &str) -> String {
    run("ip", &["netns", "exec", ns, "sh", "-c", cmd])
}

impl Lab {
    pub fn new() -> Lab {
        remove_orphans();
        Lab { netns: Vec::new() }
    }

    /// Creates a namespace (loopback up) and returns its name.
    pub fn netns(&mut self, name: &str) -> String {
        let full = format!(
            "{PREFIX}{}-{}-{name}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        assert!(full.len() <= 64);
        run("ip", &["netns", "add", &full]);
        self.netns.push(full.clone());
        ip(&full, "link set lo up");
        full
    }

    /// A veth pair `a` in `ns_a` and `b` in `ns_b`.
    pub fn veth(&self, ns_a: &str, a: &str, ns_b: &str, b: &str) {
        ip(
            ns_a,
            &format!("link add {a} type veth peer name {b} netns {ns_b}"),
        );
        ip(ns_a, &format!("link set {a} up"));
        ip(ns_b, &format!("link set {b} up"));
    }

    pub fn mac(&self, ns: &str, dev: &str) -> [u8; 6] {
        let s = std::fs::read_to_string(format!("/sys/class/net/{dev}/address"));
        // /sys shows the caller's namespace; ask `ip` instead.
        let _ = s;
        let out = ip(ns, &format!("-br link show dev {dev}"));
        let mac = out.split_whitespace().nth(2).expect("mac");
        let mut m = [0u8; 6];
        for (i, p) in mac.split(':').enumerate() {
            m[i] = u8::from_str_radix(p, 16).unwrap();
        }
        m
    }

    /// Path of a namespace for `kxdp_dataplane::io::enter_netns`.
    pub fn path(ns: &str) -> String {
        format!("/var/run/netns/{ns}")
    }

    /// Runs `f` on a new thread inside `ns` and returns its result.
    pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let p = Lab::path(ns);
        std::thread::spawn(move || {
            kxdp_dataplane::io::enter_netns(&p).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.netns.drain(..).rev() {
            delete_netns(&ns);
        }
    }
}

/// Kills what runs inside `ns`, then deletes it (its veths and XDP programs go with it).
fn delete_netns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
}

/// Deletes namespaces of lab processes that no longer exist (a test binary killed mid-run).
fn remove_orphans() {
    let Ok(dir) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            delete_netns(&name);
        }
    }
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The XDP program attached to `dev` as `ip link` shows it ("xdp", "xdpgeneric"), if any.
pub fn xdp_on(ns: &str, dev: &str) -> Option<String> {
    let out = ip(ns, &format!("-d link show dev {dev}"));
    out.split_whitespace()
        .find(|w| *w == "xdp" || *w == "xdpgeneric" || *w == "xdpdrv")
        .map(str::to_string)
        .or_else(|| out.contains("prog/xdp").then(|| "xdp".to_string()))
}
