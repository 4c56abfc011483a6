//! The lab benchmark (run by `benches/lab.sh`; ignored in the normal test run): 64-byte UDP
//! from the client pod through the ClusterIP 172.30.0.10:53 to the two web pods, forwarded by
//! one of
//!
//! - `kxdp`: `kxdp run` on the node's interfaces (one worker pinned to CPU 1),
//! - `iptables`: the node's kernel with kube-proxy's iptables NAT rules (iptables-restore),
//! - `nftables`: the node's kernel with kube-proxy's nftables layout (nft -f),
//!
//! each with `KXDP_BENCH_SERVICES` other Services in its tables. The sender (pinned to CPU 0)
//! sends from `KXDP_BENCH_FLOWS` sockets as fast as it can for `KXDP_BENCH_SECONDS`; the sinks in
//! the pods count what arrives. Prints one JSON line: packets sent and received, received pps,
//! and the whole machine's busy CPU time per received packet (from /proc/stat; sender and sinks
//! included, the same for every mode).

mod lab;

use std::fmt::Write as _;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lab::{ip, lab_files, Cluster, Kxdp, Lab};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Busy and total jiffies of the whole machine.
fn cpu_jiffies() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = f.iter().take(8).sum();
    let idle = f[3] + f[4];
    (total - idle, total)
}

/// `n` filler Services (ClusterIP 172.30.{1..}.x:80/TCP, two endpoints on another node).
fn filler_state(n: u64) -> String {
    let mut y = String::new();
    for i in 0..n {
        let (a, b) = (1 + i / 250, 1 + i % 250);
        let _ = write!(
            y,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: filler-{i}, namespace: lab}}\n\
             spec: {{type: ClusterIP, clusterIP: 172.30.{a}.{b}, clusterIPs: [172.30.{a}.{b}], \
             ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: filler-{i}, \
             namespace: lab, labels: {{kubernetes.io/service-name: filler-{i}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\n\
             endpoints: [{{addresses: [10.2.{a}.{b}], conditions: {{ready: true}}, nodeName: node-b}}, \
             {{addresses: [10.3.{a}.{b}], conditions: {{ready: true}}, nodeName: node-b}}]\n"
        );
    }
    y
}

fn iptables_rules(n: u64) -> String {
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
    let mut svc = |name: &str, vip: &str, proto: &str, port: u16, eps: &[(&str, u16)]| {
        let _ = writeln!(r, ":KUBE-SVC-{name} - [0:0]");
        let _ = writeln!(
            r,
            "-A KUBE-SERVICES -d {vip}/32 -p {proto} -m {proto} --dport {port} -j KUBE-SVC-{name}"
        );
        let _ = writeln!(
            r,
            "-A KUBE-SVC-{name} ! -s 10.0.0.0/8 -d {vip}/32 -p {proto} -m {proto} --dport {port} -j KUBE-MARK-MASQ"
        );
        for (k, (ep, eport)) in eps.iter().enumerate() {
            let sep = format!("KUBE-SEP-{name}-{k}");
            let _ = writeln!(r, ":{sep} - [0:0]");
            let left = eps.len() - k;
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
    };
    // Filler first: the measured Service is the last of KUBE-SERVICES' linear list, as a
    // Service among many would be on average half-way.
    for i in 0..n {
        let (a, b) = (1 + i / 250, 1 + i % 250);
        svc(
            &format!("F{i}"),
            &format!("172.30.{a}.{b}"),
            "tcp",
            80,
            &[
                (&format!("10.2.{a}.{b}"), 8080),
                (&format!("10.3.{a}.{b}"), 8080),
            ],
        );
    }
    svc(
        "WEB",
        "172.30.0.10",
        "udp",
        53,
        &[("10.1.0.11", 5353), ("10.1.0.12", 5353)],
    );
    r.push_str("COMMIT\n");
    r
}

fn nft_rules(n: u64) -> String {
    let mut elems = Vec::new();
    let mut chains = String::new();
    let mut svc = |name: &str, vip: &str, proto: &str, port: u16, eps: &[(String, u16)]| {
        elems.push(format!("{vip} . {proto} . {port} : goto service-{name}"));
        let arms: Vec<String> = (0..eps.len())
            .map(|k| format!("{k} : goto endpoint-{name}-{k}"))
            .collect();
        let _ = writeln!(
            chains,
            "  chain service-{name} {{\n    ip daddr {vip} {proto} dport {port} ip saddr != 10.0.0.0/8 jump mark-for-masquerade\n    numgen random mod {} vmap {{ {} }}\n  }}",
            eps.len(),
            arms.join(", ")
        );
        for (k, (ep, eport)) in eps.iter().enumerate() {
            let _ = writeln!(
                chains,
                "  chain endpoint-{name}-{k} {{\n    ip saddr {ep} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {ep}:{eport}\n  }}"
            );
        }
    };
    for i in 0..n {
        let (a, b) = (1 + i / 250, 1 + i % 250);
        svc(
            &format!("F{i}"),
            &format!("172.30.{a}.{b}"),
            "tcp",
            80,
            &[
                (format!("10.2.{a}.{b}"), 8080),
                (format!("10.3.{a}.{b}"), 8080),
            ],
        );
    }
    svc(
        "WEB",
        "172.30.0.10",
        "udp",
        53,
        &[("10.1.0.11".into(), 5353), ("10.1.0.12".into(), 5353)],
    );
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

fn pipe_into(ns: &str, cmd: &str, input: &str) {
    use std::io::Write;
    let mut c = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    assert!(c.wait().unwrap().success(), "{cmd} failed");
}

#[test]
#[ignore = "benchmark: run by benches/lab.sh"]
fn bench_lab_udp_clusterip() {
    let mode = std::env::var("KXDP_BENCH_MODE").unwrap_or_else(|_| "kxdp".into());
    if !lab::available("bench_lab_udp_clusterip") {
        return;
    }
    let seconds = env_or("KXDP_BENCH_SECONDS", 5);
    let flows = env_or("KXDP_BENCH_FLOWS", 64) as usize;
    let services = env_or("KXDP_BENCH_SERVICES", 1000);
    let c = Cluster::build();
    let dir = tempfile::tempdir().unwrap();
    let mut _kxdp = None;
    match mode.as_str() {
        "kxdp" => {
            let (config, state) = lab_files();
            let cfg = std::fs::read_to_string(&config).unwrap().replace(
                "workers: {count: 1, cpus: []}",
                "workers: {count: 1, cpus: [1]}",
            );
            std::fs::write(dir.path().join("config.yaml"), cfg).unwrap();
            std::fs::copy(&state, dir.path().join("state-00.yaml")).unwrap();
            std::fs::write(
                dir.path().join("state-10-filler.yaml"),
                filler_state(services),
            )
            .unwrap();
            // State files: a directory of manifests; the config sits outside it.
            let sdir = dir.path().join("state");
            std::fs::create_dir(&sdir).unwrap();
            std::fs::rename(dir.path().join("state-00.yaml"), sdir.join("00.yaml")).unwrap();
            std::fs::rename(
                dir.path().join("state-10-filler.yaml"),
                sdir.join("10.yaml"),
            )
            .unwrap();
            _kxdp = Some(Kxdp::start(
                &c.node,
                dir.path().join("config.yaml").to_str().unwrap(),
                sdir.to_str().unwrap(),
            ));
        }
        "iptables" => {
            lab::sh(&c.node, "sysctl -qw net.ipv4.ip_forward=1");
            let restore = if lab::run("sh", &["-c", "command -v iptables-legacy-restore || true"])
                .trim()
                .is_empty()
            {
                "iptables-restore"
            } else {
                "iptables-legacy-restore"
            };
            pipe_into(&c.node, restore, &iptables_rules(services));
        }
        "nftables" => {
            lab::sh(&c.node, "sysctl -qw net.ipv4.ip_forward=1");
            pipe_into(&c.node, "nft -f -", &nft_rules(services));
        }
        other => panic!("KXDP_BENCH_MODE={other}: kxdp, iptables or nftables"),
    }
    // Sinks in the two web pods.
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let mut sinks = Vec::new();
    for (pod, addr) in [("web-1", "10.1.0.11"), ("web-2", "10.1.0.12")] {
        let (p, a) = (Lab::path(c.pod(pod)), addr.to_string());
        let (st, rc, cn) = (stop.clone(), received.clone(), counting.clone());
        sinks.push(std::thread::spawn(move || {
            kxdp_dataplane::io::enter_netns(&p).unwrap();
            let s = UdpSocket::bind(format!("{a}:5353")).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = [0u8; 2048];
            let mut n = 0u64;
            while !st.load(Ordering::Relaxed) {
                if s.recv(&mut buf).is_ok() && cn.load(Ordering::Relaxed) {
                    n += 1;
                    if n % 1024 == 0 {
                        rc.fetch_add(1024, Ordering::Relaxed);
                    }
                }
            }
            rc.fetch_add(n % 1024, Ordering::Relaxed);
        }));
    }
    // Warm-up (neighbours, conntrack entries for every flow), then the measured window.
    let (p, st, cn) = (Lab::path(c.pod("client-1")), stop.clone(), counting.clone());
    let sender = std::thread::spawn(move || {
        kxdp_dataplane::io::enter_netns(&p).unwrap();
        kxdp_dataplane::worker::pin(0);
        let socks: Vec<UdpSocket> = (0..flows)
            .map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                s.connect("172.30.0.10:53").unwrap();
                s
            })
            .collect();
        let payload = [0x42u8; 22]; // 14 + 20 + 8 + 22 = 64-byte frames
        let mut sent = 0u64;
        let mut sent_at_start = None;
        while !st.load(Ordering::Relaxed) {
            for s in &socks {
                if s.send(&payload).is_ok() {
                    sent += 1;
                }
            }
            if sent_at_start.is_none() && cn.load(Ordering::Relaxed) {
                sent_at_start = Some(sent);
            }
        }
        sent - sent_at_start.unwrap_or(0)
    });
    std::thread::sleep(Duration::from_secs(1));
    let (busy0, total0) = cpu_jiffies();
    counting.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    counting.store(false, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let (busy1, total1) = cpu_jiffies();
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().unwrap();
    for s in sinks {
        s.join().unwrap();
    }
    let got = received.load(Ordering::Relaxed);
    let hz = 100.0; // USER_HZ
    let busy_s = (busy1 - busy0) as f64 / hz;
    let cpus = (total1 - total0) as f64 / hz / secs;
    let line = format!(
        "{{\"mode\":\"{mode}\",\"services\":{services},\"flows\":{flows},\"seconds\":{secs:.2},\"sent\":{sent},\"received\":{got},\"sent_pps\":{:.0},\"received_pps\":{:.0},\"busy_cpu_s\":{busy_s:.2},\"cpus\":{cpus:.1},\"busy_ns_per_received_packet\":{:.0}}}",
        sent as f64 / secs,
        got as f64 / secs,
        if got > 0 { busy_s * 1e9 / got as f64 } else { 0.0 }
    );
    println!("BENCH {line}");
    assert!(got > 0, "nothing was forwarded in mode {mode}");
    let _ = ip(&c.node, "link show up0");
}
