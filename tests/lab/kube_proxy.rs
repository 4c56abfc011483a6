//! kube-proxy's NAT rules for a set of Services, written as kube-proxy writes them, for the
//! benchmarks that compare kxdp with the kernel doing the same job on the same lab.
//!
//! - iptables mode: `KUBE-SERVICES` (jumped to from `PREROUTING`) matches each ClusterIP and
//!   port into its `KUBE-SVC-*` chain, which marks traffic from outside the cluster for
//!   masquerade and picks a `KUBE-SEP-*` with `statistic --mode random` (probability 1/n, then
//!   1/(n-1), ...); each `KUBE-SEP-*` DNATs to its endpoint. `KUBE-POSTROUTING` masquerades
//!   what was marked (`--random-fully`). Fed to `iptables-restore`.
//! - nftables mode: table `ip kube-proxy` with the `service-ips` verdict map
//!   (address . protocol . port), one `service-*` chain per Service port choosing an
//!   `endpoint-*` chain with `numgen random`, the same masquerade marks. Fed to `nft -f`.

use std::fmt::Write as _;

/// One Service port and its endpoints, as kube-proxy sees it.
pub struct Service {
    /// Unique among the Services of one rule set (chain names are made from it).
    pub name: String,
    pub vip: String,
    /// `tcp` or `udp`.
    pub proto: &'static str,
    pub port: u16,
    /// (address, port) of each ready endpoint.
    pub endpoints: Vec<(String, u16)>,
}

impl Service {
    pub fn new(name: &str, vip: &str, proto: &'static str, port: u16, eps: &[(&str, u16)]) -> Self {
        Service {
            name: name.to_string(),
            vip: vip.to_string(),
            proto,
            port,
            endpoints: eps.iter().map(|(a, p)| (a.to_string(), *p)).collect(),
        }
    }
}

/// `n` filler Services (ClusterIP 172.30.{1..}.x:80/TCP, two endpoints each in 10.2/10.3,
/// nowhere reachable): a Service among many, as on a real node.
pub fn filler(n: u64) -> Vec<Service> {
    (0..n)
        .map(|i| {
            let (a, b) = (1 + i / 250, 1 + i % 250);
            Service::new(
                &format!("F{i}"),
                &format!("172.30.{a}.{b}"),
                "tcp",
                80,
                &[
                    (&format!("10.2.{a}.{b}"), 8080),
                    (&format!("10.3.{a}.{b}"), 8080),
                ],
            )
        })
        .collect()
}

/// The `nat` table for `iptables-restore` (with `--noflush` it adds to a table that already
/// holds other rules, such as the CNI plugins' masquerade). `cluster` is the cluster's pod
/// range: traffic from outside it is masqueraded (`--cluster-cidr`).
pub fn iptables(services: &[Service], cluster: &str) -> String {
    let mut r = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
         -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n",
    );
    for s in services {
        let (name, vip, proto, port) = (&s.name, &s.vip, s.proto, s.port);
        let _ = writeln!(r, ":KUBE-SVC-{name} - [0:0]");
        let _ = writeln!(
            r,
            "-A KUBE-SERVICES -d {vip}/32 -p {proto} -m {proto} --dport {port} -j KUBE-SVC-{name}"
        );
        let _ = writeln!(
            r,
            "-A KUBE-SVC-{name} ! -s {cluster} -d {vip}/32 -p {proto} -m {proto} --dport {port} -j KUBE-MARK-MASQ"
        );
        for (k, (ep, eport)) in s.endpoints.iter().enumerate() {
            let sep = format!("KUBE-SEP-{name}-{k}");
            let _ = writeln!(r, ":{sep} - [0:0]");
            let left = s.endpoints.len() - k;
            if left > 1 {
                let _ = writeln!(
                    r,
                    "-A KUBE-SVC-{name} -m statistic --mode random --probability {:.11} -j {sep}",
                    1.0 / left as f64
                );
            } else {
                let _ = writeln!(r, "-A KUBE-SVC-{name} -j {sep}");
            }
            let _ = writeln!(r, "-A {sep} -s {ep}/32 -j KUBE-MARK-MASQ");
            let _ = writeln!(
                r,
                "-A {sep} -p {proto} -m {proto} -j DNAT --to-destination {ep}:{eport}"
            );
        }
    }
    r.push_str("COMMIT\n");
    r
}

/// The table `ip kube-proxy` for `nft -f` (remove it with `nft delete table ip kube-proxy`).
pub fn nftables(services: &[Service], cluster: &str) -> String {
    let mut elems = Vec::new();
    let mut chains = String::new();
    for s in services {
        let (name, vip, proto, port) = (&s.name, &s.vip, s.proto, s.port);
        elems.push(format!("{vip} . {proto} . {port} : goto service-{name}"));
        let arms: Vec<String> = (0..s.endpoints.len())
            .map(|k| format!("{k} : goto endpoint-{name}-{k}"))
            .collect();
        let _ = writeln!(
            chains,
            "  chain service-{name} {{\n    ip daddr {vip} {proto} dport {port} ip saddr != {cluster} jump mark-for-masquerade\n    numgen random mod {} vmap {{ {} }}\n  }}",
            s.endpoints.len(),
            arms.join(", ")
        );
        for (k, (ep, eport)) in s.endpoints.iter().enumerate() {
            let _ = writeln!(
                chains,
                "  chain endpoint-{name}-{k} {{\n    ip saddr {ep} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {ep}:{eport}\n  }}"
            );
        }
    }
    format!(
        "table ip kube-proxy {{\n  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {{ {} }}\n  }}\n\
         {chains}\
         \x20 chain mark-for-masquerade {{\n    meta mark set meta mark or 0x4000\n  }}\n\
         \x20 chain masquerading {{\n    meta mark & 0x4000 == 0 return\n    meta mark set meta mark xor 0x4000\n    masquerade fully-random\n  }}\n\
         \x20 chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }}\n\
         \x20 chain nat-prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    jump services\n  }}\n\
         \x20 chain nat-postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    jump masquerading\n  }}\n}}\n",
        elems.join(",\n      ")
    )
}

/// Feeds `input` to `cmd` (through `sh -c`) inside `ns`; panics with its output if it fails.
pub fn pipe_into(ns: &str, cmd: &str, input: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} in {ns} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
