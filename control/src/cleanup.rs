//! `kxdp cleanup kube-proxy`: removes what kube-proxy leaves on a node, as `kube-proxy --cleanup`
//! does, so that its rules stop catching Service traffic once kxdp runs.
//!
//! - **iptables** (each of `iptables`/`ip6tables`, and their `-legacy` variants when installed):
//!   in the `nat`, `filter` and `mangle` tables, every rule that jumps to a kube-proxy chain is
//!   deleted, then the chains are flushed and deleted, in one `iptables-restore --noflush`
//!   transaction per table. kube-proxy's chains: `KUBE-SERVICES`, `KUBE-NODEPORTS`,
//!   `KUBE-POSTROUTING`, `KUBE-MARK-MASQ`, `KUBE-EXTERNAL-SERVICES`, `KUBE-FORWARD`,
//!   `KUBE-PROXY-FIREWALL`, `KUBE-PROXY-CANARY`, the per-Service `KUBE-SVC-*`, `KUBE-SVL-*`,
//!   `KUBE-SEP-*`, `KUBE-FW-*`, `KUBE-EXT-*`, and the IPVS mode's `KUBE-NODE-PORT`,
//!   `KUBE-LOAD-BALANCER`, `KUBE-SOURCE-RANGES-FIREWALL`, `KUBE-IPVS-FILTER`,
//!   `KUBE-IPVS-OUT-FILTER`. The kubelet's chains (`KUBE-FIREWALL`, `KUBE-KUBELET-CANARY`) stay,
//!   as kube-proxy leaves them.
//! - **nftables**: the `kube-proxy` tables of the `ip` and `ip6` families are deleted.
//! - **IPVS**: when the `kube-ipvs0` dummy interface exists (kube-proxy ran in IPVS mode), every
//!   IPVS virtual server is flushed (`ipvsadm -C`, as kube-proxy does: other IPVS users on the
//!   node lose theirs too), `kube-ipvs0` is deleted, and kube-proxy's `KUBE-*` ipsets destroyed.
//!
//! The work is done by the node's own `iptables-save`/`iptables-restore`, `nft`, `ipvsadm`,
//! `ipset` and `ip`, as kube-proxy does: they speak each kernel interface (legacy xtables,
//! nf_tables, IPVS netlink) and there is no maintained Rust crate covering all of them. A tool
//! that is not installed means there is nothing of that kind to clean.

use std::io::Write;
use std::process::{Command, Stdio};

/// kube-proxy's fixed chain names (iptables and IPVS modes), in any table.
pub const KUBE_PROXY_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// Prefixes of kube-proxy's per-Service and per-endpoint chains.
pub const KUBE_PROXY_CHAIN_PREFIXES: &[&str] = &[
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
];

/// The ipsets kube-proxy's IPVS mode creates.
pub const KUBE_PROXY_IPSETS: &[&str] = &[
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
];

/// The IPVS mode's dummy interface holding the Service addresses.
pub const IPVS_DUMMY: &str = "kube-ipvs0";
/// kube-proxy's nftables table (in the `ip` and `ip6` families).
pub const NFT_TABLE: &str = "kube-proxy";

pub fn is_kube_proxy_chain(name: &str) -> bool {
    KUBE_PROXY_CHAINS.contains(&name)
        || KUBE_PROXY_CHAIN_PREFIXES
            .iter()
            .any(|p| name.starts_with(p))
}

/// How to run the cleanup.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only say what would be removed.
    pub dry_run: bool,
    /// Run the tools inside this network namespace (`ip netns exec`); None: the current one.
    pub netns: Option<String>,
}

/// What was removed (or, with `dry_run`, would be), one line each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub removed: Vec<String>,
}

/// A step that failed; the others still ran (as `kube-proxy --cleanup` goes on past errors).
#[derive(Debug, thiserror::Error)]
#[error("cleanup of kube-proxy's leftovers incomplete: {}", .failures.join("; "))]
pub struct CleanupError {
    /// What was removed before and after the failures.
    pub report: Report,
    pub failures: Vec<String>,
}

/// Removes kube-proxy's iptables, nftables and IPVS leftovers.
pub fn kube_proxy(opts: &Options) -> Result<Report, CleanupError> {
    let mut report = Report::default();
    let mut failures = Vec::new();
    for family in ["iptables", "ip6tables"] {
        for variant in ["", "-legacy"] {
            let tool = format!("{family}{variant}");
            // `iptables` is usually one of the two variants: clean it, then the legacy one if
            // it is installed (kube-proxy's rules may be in either).
            if !installed(&format!("{tool}-save")) {
                continue;
            }
            for table in ["nat", "filter", "mangle"] {
                if let Err(e) = clean_iptables_table(opts, &tool, table, &mut report) {
                    failures.push(e);
                }
            }
        }
    }
    if installed("nft") {
        for family in ["ip", "ip6"] {
            if let Err(e) = clean_nft(opts, family, &mut report) {
                failures.push(e);
            }
        }
    }
    if let Err(e) = clean_ipvs(opts, &mut report) {
        failures.push(e);
    }
    if failures.is_empty() {
        Ok(report)
    } else {
        Err(CleanupError { report, failures })
    }
}

/// The `iptables-restore --noflush` script that removes kube-proxy's chains from the output of
/// `iptables-save -t TABLE`, or None when there are none. Jumps into the removed chains from the
/// chains that stay are deleted first (deleting a referenced chain fails).
pub fn restore_script(table: &str, saved: &str) -> Option<(String, Vec<String>)> {
    let mut chains = Vec::new();
    for line in saved.lines() {
        if let Some(rest) = line.strip_prefix(':') {
            let name = rest.split_whitespace().next().unwrap_or("");
            if is_kube_proxy_chain(name) {
                chains.push(name.to_string());
            }
        }
    }
    if chains.is_empty() {
        return None;
    }
    let mut script = format!("*{table}\n");
    for line in saved.lines() {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let chain = rule.split_whitespace().next().unwrap_or("");
        if is_kube_proxy_chain(chain) {
            continue; // flushed with its chain
        }
        let words: Vec<&str> = rule.split_whitespace().collect();
        let target = words
            .windows(2)
            .find(|w| w[0] == "-j" || w[0] == "-g")
            .map(|w| w[1]);
        if target.is_some_and(is_kube_proxy_chain) {
            script.push_str(&format!("-D {rule}\n"));
        }
    }
    for c in &chains {
        script.push_str(&format!(":{c} - [0:0]\n"));
    }
    for c in &chains {
        script.push_str(&format!("-X {c}\n"));
    }
    script.push_str("COMMIT\n");
    Some((script, chains))
}

fn clean_iptables_table(
    opts: &Options,
    tool: &str,
    table: &str,
    report: &mut Report,
) -> Result<(), String> {
    let saved = match run(opts, &format!("{tool}-save"), &["-t", table], None) {
        Ok(s) => s,
        // A table the kernel does not have (no module): nothing of kube-proxy's in it.
        Err(e) if e.contains("does not exist") || e.contains("Table does not exist") => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    let Some((script, chains)) = restore_script(table, &saved) else {
        return Ok(());
    };
    if !opts.dry_run {
        run(
            opts,
            &format!("{tool}-restore"),
            &["--noflush"],
            Some(&script),
        )?;
    }
    report.removed.push(format!(
        "{tool} -t {table}: {} chain(s): {}",
        chains.len(),
        chains.join(" ")
    ));
    Ok(())
}

fn clean_nft(opts: &Options, family: &str, report: &mut Report) -> Result<(), String> {
    let tables = run(opts, "nft", &["list", "tables", family], None)?;
    let present = tables
        .lines()
        .any(|l| l.trim() == format!("table {family} {NFT_TABLE}"));
    if !present {
        return Ok(());
    }
    if !opts.dry_run {
        run(opts, "nft", &["delete", "table", family, NFT_TABLE], None)?;
    }
    report
        .removed
        .push(format!("nft: table {family} {NFT_TABLE}"));
    Ok(())
}

fn clean_ipvs(opts: &Options, report: &mut Report) -> Result<(), String> {
    let links = run(opts, "ip", &["-o", "link", "show", "type", "dummy"], None).unwrap_or_default();
    let has_dummy = links
        .lines()
        .any(|l| l.split(':').nth(1).map(str::trim) == Some(IPVS_DUMMY));
    if !has_dummy {
        return Ok(());
    }
    let mut failures = Vec::new();
    if installed("ipvsadm") {
        if opts.dry_run {
            report
                .removed
                .push("ipvs: every virtual server (ipvsadm -C)".into());
        } else {
            match run(opts, "ipvsadm", &["-C"], None) {
                Ok(_) => report
                    .removed
                    .push("ipvs: every virtual server (ipvsadm -C)".into()),
                Err(e) => failures.push(e),
            }
        }
    }
    if !opts.dry_run {
        if let Err(e) = run(opts, "ip", &["link", "delete", IPVS_DUMMY], None) {
            failures.push(e);
        }
    }
    report.removed.push(format!("link {IPVS_DUMMY}"));
    if installed("ipset") {
        let sets = run(opts, "ipset", &["list", "-n"], None).unwrap_or_default();
        for set in sets.lines().map(str::trim) {
            if !KUBE_PROXY_IPSETS.contains(&set) {
                continue;
            }
            if !opts.dry_run {
                if let Err(e) = run(opts, "ipset", &["destroy", set], None) {
                    failures.push(e);
                    continue;
                }
            }
            report.removed.push(format!("ipset {set}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn installed(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
        || ["/usr/sbin", "/sbin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).is_file())
}

/// Runs `tool args` (in `opts.netns`), with `stdin`; the output, or the failure in words.
fn run(opts: &Options, tool: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = match &opts.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, tool]);
            c
        }
        None => Command::new(tool),
    };
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = format!("{tool} {}", args.join(" "));
    let mut child = cmd.spawn().map_err(|e| format!("{shown}: {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| format!("{shown}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{shown}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_removes_jumps_then_chains() {
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n:KUBE-FIREWALL - [0:0]\n:CNI-XYZ - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A PREROUTING -j CNI-XYZ\n-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-ABC\n-A CNI-XYZ -j KUBE-SVC-ABC\nCOMMIT\n";
        let (script, chains) = restore_script("nat", saved).unwrap();
        assert_eq!(chains, ["KUBE-SERVICES", "KUBE-SVC-ABC"]);
        assert_eq!(
            script,
            "*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-D CNI-XYZ -j KUBE-SVC-ABC\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n-X KUBE-SERVICES\n-X KUBE-SVC-ABC\nCOMMIT\n"
        );
        assert!(restore_script("nat", "*nat\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n").is_none());
    }
}
