//! `kxdp cleanup kube-proxy` against rules in kube-proxy's layout (iptables mode for IPv4 and
//! IPv6, its nftables tables), in a network namespace this test creates: kube-proxy's chains and
//! the jumps into them go, the CNI's and the kubelet's rules stay, and a second run finds
//! nothing. Needs root and iptables/nft (CI installs them); skipped otherwise.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "opsinst-kpclean";

/// What kube-proxy (iptables mode, v1.3x) writes for one ClusterIP Service with one endpoint and
/// one NodePort, plus what it shares the tables with: a CNI's chain that jumps into a Service
/// chain, the kubelet's KUBE-FIREWALL and canary.
const NAT: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SVC-NPX46M4PTMTKRN6Y - [0:0]
:KUBE-SEP-AWXKJFKBRSHYCFIX - [0:0]
:KUBE-EXT-R2VK7O5AFVLRAXSH - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16 -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web" -m tcp --dport 30080 -j KUBE-EXT-R2VK7O5AFVLRAXSH
-A KUBE-EXT-R2VK7O5AFVLRAXSH -j KUBE-MARK-MASQ
-A KUBE-EXT-R2VK7O5AFVLRAXSH -j KUBE-SVC-NPX46M4PTMTKRN6Y
-A KUBE-SVC-NPX46M4PTMTKRN6Y ! -s 10.244.0.0/16 -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https cluster IP" -m tcp --dport 443 -j KUBE-MARK-MASQ
-A KUBE-SVC-NPX46M4PTMTKRN6Y -m comment --comment "default/kubernetes:https -> 192.168.0.2:6443" -j KUBE-SEP-AWXKJFKBRSHYCFIX
-A KUBE-SEP-AWXKJFKBRSHYCFIX -s 192.168.0.2/32 -m comment --comment "default/kubernetes:https" -j KUBE-MARK-MASQ
-A KUBE-SEP-AWXKJFKBRSHYCFIX -p tcp -m comment --comment "default/kubernetes:https" -m tcp -j DNAT --to-destination 192.168.0.2:6443
-A CNI-HOSTPORT-DNAT -p tcp --dport 8443 -j KUBE-SVC-NPX46M4PTMTKRN6Y
COMMIT
"#;

const FILTER: &str = r#"*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
"#;

const MANGLE: &str = "*mangle\n:KUBE-PROXY-CANARY - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";

const NFT: &str = r#"table ip kube-proxy {
	comment "rules for kube-proxy"
	chain services {
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
}
table ip6 kube-proxy {
	chain nat-output {
		type nat hook output priority -100; policy accept;
	}
}
table inet cni-firewall {
	chain forward {
		type filter hook forward priority 0; policy accept;
	}
}
"#;

fn sh(args: &[&str], stdin: Option<&str>) -> Output {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn ns(args: &[&str], stdin: Option<&str>) -> String {
    let mut full = vec!["ip", "netns", "exec", NS];
    full.extend_from_slice(args);
    let out = sh(&full, stdin);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Netns;

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", NS], None);
    }
}

fn have(tool: &str) -> bool {
    sh(&["sh", "-c", &format!("command -v {tool}")], None)
        .status
        .success()
}

fn kxdp_cleanup(extra: &[&str]) -> Output {
    let bin = env!("CARGO_BIN_EXE_kxdp");
    let mut args = vec!["ip", "netns", "exec", NS, bin, "cleanup", "kube-proxy"];
    args.extend_from_slice(extra);
    sh(&args, None)
}

#[test]
fn removes_kube_proxy_rules_and_keeps_the_others() {
    let uid = sh(&["id", "-u"], None);
    if String::from_utf8_lossy(&uid.stdout).trim() != "0"
        || !have("iptables-restore")
        || !have("ip6tables-restore")
        || !have("nft")
    {
        eprintln!("skipped: needs root, iptables and nft");
        return;
    }
    let started = Instant::now();
    let _ = sh(&["ip", "netns", "del", NS], None);
    assert!(sh(&["ip", "netns", "add", NS], None).status.success());
    let _guard = Netns;

    ns(&["iptables-restore", "--noflush"], Some(NAT));
    ns(&["iptables-restore", "--noflush"], Some(FILTER));
    ns(&["iptables-restore", "--noflush"], Some(MANGLE));
    // IPv6: the same layout with IPv6 addresses.
    let nat6 = NAT
        .replace("10.244.0.0/16", "fd00:10:244::/56")
        .replace("10.96.0.1/32", "fd00:96::1/128")
        .replace("192.168.0.2/32", "fd00:1::2/128")
        .replace("192.168.0.2:6443", "[fd00:1::2]:6443");
    ns(&["ip6tables-restore", "--noflush"], Some(&nat6));
    let filter6 = FILTER.replace("127.0.0.0/8", "::1/128");
    ns(&["ip6tables-restore", "--noflush"], Some(&filter6));
    ns(&["nft", "-f", "-"], Some(NFT));
    let before = ns(&["iptables-save"], None);
    assert!(before.contains("KUBE-SEP-AWXKJFKBRSHYCFIX"), "{before}");

    // A dry run changes nothing and says what it would do.
    let dry = kxdp_cleanup(&["--dry-run"]);
    let dry_out = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(
        dry_out.contains("would remove iptables -t nat: 8 chain(s)"),
        "{dry_out}"
    );
    assert_eq!(
        ns(&["iptables-save"], None)
            .lines()
            .filter(|l| l.starts_with(':'))
            .count(),
        before.lines().filter(|l| l.starts_with(':')).count()
    );

    let out = kxdp_cleanup(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "removed iptables -t nat: 8 chain(s)",
        "removed iptables -t filter: 6 chain(s)",
        "removed iptables -t mangle: 1 chain(s)",
        "removed ip6tables -t nat: 8 chain(s)",
        "removed ip6tables -t filter: 6 chain(s)",
        "removed nft: table ip kube-proxy",
        "removed nft: table ip6 kube-proxy",
    ] {
        assert!(stdout.contains(line), "{line} missing in\n{stdout}");
    }

    for tool in ["iptables-save", "ip6tables-save"] {
        let after = ns(&[tool], None);
        for gone in [
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "KUBE-SVC-",
            "KUBE-SEP-",
            "KUBE-EXT-",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-PROXY-FIREWALL",
            "KUBE-PROXY-CANARY",
        ] {
            assert!(!after.contains(gone), "{tool}: {gone} left:\n{after}");
        }
        // What is not kube-proxy's stays, rules included.
        for kept in [
            ":KUBE-FIREWALL",
            ":KUBE-KUBELET-CANARY",
            ":CNI-HOSTPORT-DNAT",
            "-A INPUT -j KUBE-FIREWALL",
            "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
            "-j MASQUERADE",
        ] {
            assert!(after.contains(kept), "{tool}: {kept} removed:\n{after}");
        }
    }
    let tables = ns(&["nft", "list", "tables"], None);
    assert!(!tables.contains("kube-proxy"), "{tables}");
    assert!(tables.contains("table inet cni-firewall"), "{tables}");

    // Nothing left: a second run succeeds and says so.
    let again = kxdp_cleanup(&[]);
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "no kube-proxy rules found\n"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
