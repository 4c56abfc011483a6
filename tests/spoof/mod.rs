//! Crafted packets with any source address, and what a pod receives of them: the probes of the
//! source-validation tests (`tests/cni/spoof.py`: raw sockets, python3, no scapy).

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::cni::{TCP_PORT, UDP_PORT};

const SPOOF_PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cni/spoof.py");

/// One crafted packet: from namespace `ns`, source `src` (any), to `dst`, TCP SYN or UDP.
pub struct Probe {
    pub ns: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub tcp: bool,
}

impl Probe {
    pub fn send(&self) {
        let (dport, proto) = if self.tcp {
            (TCP_PORT, "tcp")
        } else {
            (UDP_PORT, "udp")
        };
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "python3", SPOOF_PY, "send"])
            .args([
                self.src.to_string(),
                self.dst.to_string(),
                dport.to_string(),
                self.sport.to_string(),
                proto.to_string(),
            ])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "spoof.py send: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The sniffer's line for this probe.
    pub fn seen_as(&self) -> String {
        let port = if self.tcp { TCP_PORT } else { UDP_PORT };
        format!("{} {} {port}", self.src, self.sport)
    }
}

/// Sends `probes` while a packet socket on `ns`'s eth0 records the TCP SYNs and UDP datagrams
/// to the lab's ports; returns which probes arrived.
pub fn observe(ns: &str, probes: &[Probe]) -> Vec<bool> {
    let mut sniff = Command::new("ip")
        // Long enough for every probe (two python3 starts each) and their flight.
        .args(["netns", "exec", ns, "python3", SPOOF_PY, "sniff", "eth0"])
        .arg((3 + probes.len() / 2).to_string())
        .args([TCP_PORT.to_string(), UDP_PORT.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 sniff");
    let mut lines = BufReader::new(sniff.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    for p in probes {
        // Twice: a datagram lost to a neighbour still being resolved is not a verdict.
        p.send();
        std::thread::sleep(Duration::from_millis(50));
        p.send();
    }
    let seen: Vec<String> = lines.map_while(Result::ok).collect();
    let _ = sniff.wait();
    probes.iter().map(|p| seen.contains(&p.seen_as())).collect()
}

/// `kxdp_drops_total{reason="spoofed-source"}` of the kxdp in `ns` (metrics on 127.0.0.1:10249).
pub fn spoofed_drops(ns: &str) -> u64 {
    crate::cni::metric(ns, "kxdp_drops_total{reason=\"spoofed-source\"}")
}
