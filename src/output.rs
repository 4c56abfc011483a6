//! What `kxdp replay` writes: verdict lines (JSONL) and the run summary (docs/cli.md,
//! "`kxdp replay`").

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kxdp_control::admin::wire::{format_addr, proto_name};
use kxdp_dataplane::conntrack::TableMemory;
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_dataplane::verdict::{Action, Reason, Verdict};
use kxdp_packet::IpProto;
use serde::Serialize;

#[derive(Serialize)]
struct Line<'a> {
    index: u64,
    action: &'static str,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    proto: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    src: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dst: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    orig_src: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    orig_dst: Option<String>,
    masq: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    service: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply: Option<Reply>,
    /// The interface the egress stage sent the packet on (`kxdp replay --routes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    egress: Option<&'a str>,
}

#[derive(Serialize)]
struct Reply {
    src: String,
    dst: String,
}

/// One verdict as a JSON line (no trailing newline).
///
/// - Packets that were not parsed as IP (`has_addrs` false) carry no proto and no addresses.
/// - `service` names the Service port (`ns/name:port`) when `service_id` is set and the snapshot
///   knows the id.
/// - `drop` and `pass` lines: `src`/`dst` equal `orig_src`/`orig_dst` (nothing is rewritten).
/// - A `reject` line: `src`/`dst` are the offending packet's (it does not leave, and is not
///   rewritten), `reply` the generated answer's; a TCP RST keeps ports, an ICMP/ICMPv6 port
///   unreachable (the answer to every other protocol) has none.
/// - `egress`: the interface the egress stage sent the packet on (`kxdp replay --routes`).
pub fn verdict_line(index: u64, v: &Verdict, snapshot: &Snapshot, egress: Option<&str>) -> String {
    let service = if v.service_id != 0 {
        snapshot.service_port_by_id(v.service_id).map(|s| &*s.name)
    } else {
        None
    };
    let mut line = Line {
        index,
        action: v.action.as_str(),
        reason: v.reason.as_str(),
        proto: None,
        src: None,
        dst: None,
        orig_src: None,
        orig_dst: None,
        masq: v.masq,
        service,
        reply: None,
        egress,
    };
    if v.has_addrs {
        let ports = v.proto.has_ports();
        let orig_src = format_addr(v.orig_src, v.family, v.orig_sport, ports);
        let orig_dst = format_addr(v.orig_dst, v.family, v.orig_dport, ports);
        line.proto = Some(proto_name(v.proto));
        if v.action == Action::Reject {
            let reply_ports = v.proto == IpProto::TCP;
            line.reply = Some(Reply {
                src: format_addr(v.src, v.family, v.sport, reply_ports),
                dst: format_addr(v.dst, v.family, v.dport, reply_ports),
            });
            line.src = Some(orig_src.clone());
            line.dst = Some(orig_dst.clone());
        } else if v.action == Action::Forward {
            line.src = Some(format_addr(v.src, v.family, v.sport, ports));
            line.dst = Some(format_addr(v.dst, v.family, v.dport, ports));
        } else {
            // Dropped and passed packets are never rewritten.
            line.src = Some(orig_src.clone());
            line.dst = Some(orig_dst.clone());
        }
        line.orig_src = Some(orig_src);
        line.orig_dst = Some(orig_dst);
    }
    serde_json::to_string(&line).expect("verdict line serializes")
}

/// The figures of a replay run, as `--json` prints them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub packets: u64,
    pub repeat: u32,
    pub workers: usize,
    pub seconds: f64,
    pub mpps: f64,
    pub ns_per_packet: f64,
    /// Every action, zero counts included.
    pub actions: BTreeMap<&'static str, u64>,
    /// Reasons with a non-zero count.
    pub reasons: BTreeMap<&'static str, u64>,
    /// The memory the conntrack table lived in (process memory, or `--conntrack-file`'s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack_table_bytes: Option<u64>,
    /// Of it, bytes in huge pages at the end (where `/proc/self/smaps` tells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conntrack_huge_page_bytes: Option<u64>,
}

impl Summary {
    /// `actions` is indexed by `Action as usize`, `reasons` by `Reason as usize`.
    pub fn new(
        packets: u64,
        repeat: u32,
        workers: usize,
        seconds: f64,
        actions: &[u64],
        reasons: &[u64],
    ) -> Self {
        let mpps = if seconds > 0.0 {
            packets as f64 / seconds / 1e6
        } else {
            0.0
        };
        let ns_per_packet = if packets > 0 {
            seconds * 1e9 / packets as f64
        } else {
            0.0
        };
        Summary {
            packets,
            repeat,
            workers,
            seconds,
            mpps,
            ns_per_packet,
            actions: Action::ALL
                .iter()
                .map(|a| (a.as_str(), actions.get(*a as usize).copied().unwrap_or(0)))
                .collect(),
            reasons: Reason::ALL
                .iter()
                .filter_map(|r| {
                    let n = reasons.get(*r as usize).copied().unwrap_or(0);
                    (n > 0).then(|| (r.as_str(), n))
                })
                .collect(),
            conntrack_table_bytes: None,
            conntrack_huge_page_bytes: None,
        }
    }

    /// With where the conntrack table lived.
    pub fn with_table_memory(mut self, mem: TableMemory) -> Self {
        self.conntrack_table_bytes = Some(mem.bytes);
        self.conntrack_huge_page_bytes = mem.huge_page_bytes;
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("summary serializes")
    }

    /// A few lines for people.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "replayed {} packets ({} pass{}, {} worker{}) in {:.3} s: {:.3} Mpps, {:.0} ns/packet",
            self.packets,
            self.repeat,
            if self.repeat == 1 { "" } else { "es" },
            self.workers,
            if self.workers == 1 { "" } else { "s" },
            self.seconds,
            self.mpps,
            self.ns_per_packet
        );
        let actions: Vec<String> = Action::ALL
            .iter()
            .map(|a| {
                format!(
                    "{} {}",
                    a.as_str(),
                    self.actions.get(a.as_str()).copied().unwrap_or(0)
                )
            })
            .collect();
        let _ = writeln!(s, "actions: {}", actions.join(", "));
        let mut reasons: Vec<(&str, u64)> = self.reasons.iter().map(|(k, v)| (*k, *v)).collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let reasons: Vec<String> = reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
        if !reasons.is_empty() {
            let _ = writeln!(s, "reasons: {}", reasons.join(", "));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxdp_dataplane::snapshot::ServicePortInfo;
    use kxdp_packet::{Addr, Family};

    fn v4(a: [u8; 4]) -> Addr {
        Addr::from_v4(a)
    }

    fn snapshot() -> Snapshot {
        let mut s = Snapshot::empty();
        s.service_ports.insert(
            77,
            std::sync::Arc::new(ServicePortInfo {
                name: "ns1/svc1:http".into(),
                id: 77,
                proto: IpProto::TCP,
                affinity_timeout_s: 0,
            }),
        );
        s
    }

    fn tcp_verdict() -> Verdict {
        let mut v = Verdict {
            has_addrs: true,
            family: Family::V4,
            proto: IpProto::TCP,
            orig_src: v4([10, 0, 1, 1]),
            orig_sport: 40000,
            orig_dst: v4([172, 30, 0, 41]),
            orig_dport: 80,
            src: v4([10, 0, 1, 1]),
            sport: 40000,
            dst: v4([10, 180, 0, 1]),
            dport: 80,
            masq: false,
            service_id: 77,
            ..Default::default()
        };
        v.set(Reason::ServiceDnat);
        v
    }

    /// The example line docs/cli.md shows.
    #[test]
    fn documented_example() {
        let line = verdict_line(0, &tcp_verdict(), &snapshot(), None);
        assert_eq!(
            line,
            r#"{"index":0,"action":"forward","reason":"service-dnat","proto":"TCP","src":"10.0.1.1:40000","dst":"10.180.0.1:80","orig_src":"10.0.1.1:40000","orig_dst":"172.30.0.41:80","masq":false,"service":"ns1/svc1:http"}"#
        );
    }

    #[test]
    fn unknown_service_id_and_zero_id() {
        let mut v = tcp_verdict();
        v.service_id = 5;
        assert!(!verdict_line(1, &v, &snapshot(), None).contains(r#""service":"#));
        v.service_id = 0;
        assert!(!verdict_line(1, &v, &snapshot(), None).contains(r#""service":"#));
    }

    #[test]
    fn not_ip_has_no_addresses() {
        let mut v = Verdict::default();
        v.set(Reason::NotIp);
        assert_eq!(
            verdict_line(3, &v, &snapshot(), None),
            r#"{"index":3,"action":"pass","reason":"not-ip","masq":false}"#
        );
    }

    #[test]
    fn ipv6_and_icmp() {
        let a = Addr::from_ip("fd00::1".parse().unwrap());
        let b = Addr::from_ip("fd00:30::1".parse().unwrap());
        let mut v = Verdict {
            has_addrs: true,
            family: Family::V6,
            proto: IpProto::UDP,
            orig_src: a,
            orig_sport: 53,
            orig_dst: b,
            orig_dport: 5353,
            src: a,
            sport: 53,
            dst: b,
            dport: 5353,
            ..Default::default()
        };
        v.set(Reason::Direct);
        let l = verdict_line(0, &v, &snapshot(), None);
        assert!(
            l.contains(r#""proto":"UDP","src":"[fd00::1]:53","dst":"[fd00:30::1]:5353""#),
            "{l}"
        );
        v.proto = IpProto::ICMPV6;
        let l = verdict_line(0, &v, &snapshot(), None);
        assert!(
            l.contains(r#""proto":"ICMPv6","src":"fd00::1","dst":"fd00:30::1""#),
            "{l}"
        );
        v.proto = IpProto(47);
        let l = verdict_line(0, &v, &snapshot(), None);
        assert!(l.contains(r#""proto":47,"src":"fd00::1""#), "{l}");
        v.family = Family::V4;
        v.proto = IpProto::ICMP;
        v.src = v4([1, 2, 3, 4]);
        v.orig_src = v4([1, 2, 3, 4]);
        v.dst = v4([5, 6, 7, 8]);
        v.orig_dst = v4([5, 6, 7, 8]);
        let l = verdict_line(0, &v, &snapshot(), None);
        assert!(
            l.contains(r#""proto":"ICMP","src":"1.2.3.4","dst":"5.6.7.8""#),
            "{l}"
        );
    }

    #[test]
    fn reject_lines_carry_the_reply() {
        let mut v = tcp_verdict();
        v.set(Reason::NoEndpoints);
        // The reply goes back from the service address to the client.
        v.src = v.orig_dst;
        v.sport = v.orig_dport;
        v.dst = v.orig_src;
        v.dport = v.orig_sport;
        let l = verdict_line(2, &v, &snapshot(), None);
        assert!(
            l.contains(r#""action":"reject","reason":"no-endpoints""#),
            "{l}"
        );
        assert!(
            l.contains(r#""src":"10.0.1.1:40000","dst":"172.30.0.41:80""#),
            "{l}"
        );
        assert!(
            l.ends_with(r#""reply":{"src":"172.30.0.41:80","dst":"10.0.1.1:40000"}}"#),
            "{l}"
        );
        v.proto = IpProto::UDP;
        let l = verdict_line(2, &v, &snapshot(), None);
        assert!(
            l.ends_with(r#""reply":{"src":"172.30.0.41","dst":"10.0.1.1"}}"#),
            "{l}"
        );
    }

    #[test]
    fn drops_show_the_packet_as_it_came() {
        let mut v = tcp_verdict();
        v.set(Reason::ConntrackFull);
        v.src = Addr::UNSPECIFIED;
        v.dst = Addr::UNSPECIFIED;
        let l = verdict_line(4, &v, &snapshot(), None);
        assert!(
            l.contains(r#""src":"10.0.1.1:40000","dst":"172.30.0.41:80""#),
            "{l}"
        );
    }

    #[test]
    fn summary() {
        let mut actions = [0u64; Action::COUNT];
        actions[Action::Forward as usize] = 3;
        actions[Action::Reject as usize] = 1;
        let mut reasons = vec![0u64; Reason::COUNT];
        reasons[Reason::ServiceDnat as usize] = 2;
        reasons[Reason::Established as usize] = 1;
        reasons[Reason::NoEndpoints as usize] = 1;
        let s = Summary::new(4, 1, 2, 0.002, &actions, &reasons);
        assert_eq!(s.mpps, 0.002);
        assert_eq!(s.ns_per_packet, 500_000.0);
        let j: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(j["packets"], 4);
        assert_eq!(j["repeat"], 1);
        assert_eq!(j["workers"], 2);
        assert_eq!(j["actions"]["forward"], 3);
        assert_eq!(j["actions"]["drop"], 0);
        assert_eq!(j["actions"]["pass"], 0);
        assert_eq!(j["reasons"]["service-dnat"], 2);
        assert_eq!(j["reasons"].as_object().unwrap().len(), 3);
        let t = s.to_text();
        assert!(t.contains("replayed 4 packets (1 pass, 2 workers)"), "{t}");
        assert!(
            t.contains("reasons: service-dnat 2, ct-established 1, no-endpoints 1"),
            "{t}"
        );
        let empty = Summary::new(0, 1, 1, 0.0, &[], &[]);
        assert_eq!(empty.mpps, 0.0);
        assert_eq!(empty.ns_per_packet, 0.0);
    }
}
