//! The admin socket's wire format: newline-delimited JSON.
//!
//! The client writes one `Request` line. The server answers with zero or more data lines (one
//! JSON object each: a conntrack entry as CONTRACT.md shows it, a service, a worker, an event)
//! and ends with exactly one trailer line: `{"end":{...}}` (success, with a summary) or
//! `{"error":"message"}`. `monitor` streams until the client closes the connection.

use std::net::IpAddr;

use ipnet::IpNet;
use kxdp_dataplane::conntrack::{Conntrack, EntryView, Tuple, FLAG_ASSURED, FLAG_SEEN_REPLY};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_packet::Family;
use serde::{Deserialize, Serialize};

use kxdp_packet::{proto, Addr};

/// The protocol as verdicts and listings name it: `TCP`, `UDP`, `SCTP`, `ICMP`, `ICMPv6`, else
/// the number.
pub fn proto_name(p: u8) -> serde_json::Value {
    match p {
        proto::TCP => "TCP".into(),
        proto::UDP => "UDP".into(),
        proto::SCTP => "SCTP".into(),
        proto::ICMP => "ICMP".into(),
        proto::ICMPV6 => "ICMPv6".into(),
        n => n.into(),
    }
}

/// `ip:port` when `with_port`, `ip` otherwise; IPv6 as `[addr]:port`.
pub fn format_addr(addr: Addr, family: Family, port: u16, with_port: bool) -> String {
    let ip = addr.to_ip(family);
    match (with_port, ip) {
        (false, ip) => ip.to_string(),
        (true, IpAddr::V4(a)) => format!("{a}:{port}"),
        (true, IpAddr::V6(a)) => format!("[{a}]:{port}"),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    ConntrackList { filter: CtFilter },
    ConntrackCount { filter: CtFilter },
    ConntrackDelete { filter: CtFilter },
    ConntrackStats,
    Services,
    Stats,
    Status,
    Monitor { filter: MonitorFilter },
}

/// conntrack-tools' filters. Addresses accept a CIDR (`10.0.0.0/8`) as well as an address.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CtFilter {
    /// IP protocol number.
    pub proto: Option<u8>,
    pub orig_src: Option<IpNet>,
    pub orig_dst: Option<IpNet>,
    pub reply_src: Option<IpNet>,
    pub reply_dst: Option<IpNet>,
    /// Original direction source port.
    pub sport: Option<u16>,
    /// Original direction destination port.
    pub dport: Option<u16>,
    pub reply_sport: Option<u16>,
    pub reply_dport: Option<u16>,
    /// Protocol state name (`ESTABLISHED`, `SYN_SENT`, ...), case-insensitive.
    pub state: Option<String>,
    /// 4 or 6.
    pub family: Option<u8>,
    /// `ns/name` or `ns/name:port` of the Service.
    pub service: Option<String>,
}

fn net_has(net: &Option<IpNet>, ip: IpAddr) -> bool {
    net.as_ref().is_none_or(|n| n.contains(&ip))
}

impl CtFilter {
    pub fn matches(&self, v: &EntryView, snap: &Snapshot) -> bool {
        let (o, r) = (&v.orig, &v.reply);
        if self.proto.is_some_and(|p| p != o.proto) {
            return false;
        }
        if let Some(f) = self.family {
            let fam = match o.family {
                Family::V4 => 4,
                Family::V6 => 6,
            };
            if f != fam {
                return false;
            }
        }
        let ip = |t: &Tuple, src: bool| (if src { t.src } else { t.dst }).to_ip(t.family);
        if !net_has(&self.orig_src, ip(o, true))
            || !net_has(&self.orig_dst, ip(o, false))
            || !net_has(&self.reply_src, ip(r, true))
            || !net_has(&self.reply_dst, ip(r, false))
        {
            return false;
        }
        if self.sport.is_some_and(|p| p != o.sport)
            || self.dport.is_some_and(|p| p != o.dport)
            || self.reply_sport.is_some_and(|p| p != r.sport)
            || self.reply_dport.is_some_and(|p| p != r.dport)
        {
            return false;
        }
        if let Some(st) = &self.state {
            if !Conntrack::state_name(v).is_some_and(|n| n.eq_ignore_ascii_case(st)) {
                return false;
            }
        }
        if let Some(s) = &self.service {
            let name = snap.service_port_by_id(v.service_id).map(|p| &*p.name);
            match name {
                Some(n) if n == s || n.split(':').next() == Some(s.as_str()) => {}
                _ => return false,
            }
        }
        true
    }
}

/// One connection, as `kxdp conntrack list -o json` prints it (CONTRACT.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CtEntry {
    pub proto: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    pub timeout_s: u64,
    pub assured: bool,
    pub orig_src: String,
    pub orig_dst: String,
    pub reply_src: String,
    pub reply_dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    pub packets_orig: u64,
    pub bytes_orig: u64,
    pub packets_reply: u64,
    pub bytes_reply: u64,
    /// ICMP/ICMPv6 echo: the identifier (both directions keep it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_id: Option<u16>,
    /// Not in the JSON: whether a reply was seen ([UNREPLIED] in the table).
    #[serde(skip)]
    pub replied: bool,
    #[serde(skip)]
    pub proto_num: u8,
}

impl CtEntry {
    pub fn from_view(v: &EntryView, snap: &Snapshot, now_ms: u64) -> CtEntry {
        let ep = |t: &Tuple, src: bool| {
            if src {
                Tuple::endpoint(&t.src, t.sport, t.family, t.proto)
            } else {
                Tuple::endpoint(&t.dst, t.dport, t.family, t.proto)
            }
        };
        CtEntry {
            proto: proto_name(v.orig.proto),
            state: Conntrack::state_name(v).map(str::to_string),
            timeout_s: Conntrack::timeout_left_s(v, now_ms),
            assured: v.state & FLAG_ASSURED != 0,
            orig_src: ep(&v.orig, true),
            orig_dst: ep(&v.orig, false),
            reply_src: ep(&v.reply, true),
            reply_dst: ep(&v.reply, false),
            service: snap
                .service_port_by_id(v.service_id)
                .map(|p| p.name.to_string()),
            packets_orig: v.packets[0],
            bytes_orig: v.bytes[0],
            packets_reply: v.packets[1],
            bytes_reply: v.bytes[1],
            icmp_id: matches!(v.orig.proto, 1 | 58).then_some(v.orig.sport),
            replied: v.state & FLAG_SEEN_REPLY != 0,
            proto_num: v.orig.proto,
        }
    }

    /// `conntrack -L`'s line shape, with the Service appended:
    /// `tcp      6 86395 ESTABLISHED src=… dst=… sport=… dport=… packets=3 bytes=180 src=… dst=… sport=… dport=… packets=2 bytes=120 [ASSURED] service=ns1/svc1:http`
    pub fn table_line(&self) -> String {
        let pname = match &self.proto {
            serde_json::Value::String(s) => s.to_ascii_lowercase(),
            v => format!("unknown {v}"),
        };
        let num = self.proto_num_or_guess();
        let mut s = format!("{pname:<8} {num} {} ", self.timeout_s);
        if let Some(st) = &self.state {
            s.push_str(st);
            s.push(' ');
        }
        tuple_fields(
            &mut s,
            &self.orig_src,
            &self.orig_dst,
            num,
            self.icmp_id,
            true,
        );
        s.push_str(&format!(
            "packets={} bytes={} ",
            self.packets_orig, self.bytes_orig
        ));
        if !self.replied && self.packets_reply == 0 {
            s.push_str("[UNREPLIED] ");
        }
        tuple_fields(
            &mut s,
            &self.reply_src,
            &self.reply_dst,
            num,
            self.icmp_id,
            false,
        );
        s.push_str(&format!(
            "packets={} bytes={} ",
            self.packets_reply, self.bytes_reply
        ));
        if self.assured {
            s.push_str("[ASSURED] ");
        }
        s.push_str("mark=0 use=1");
        if let Some(svc) = &self.service {
            s.push_str(" service=");
            s.push_str(svc);
        }
        s
    }

    fn proto_num_or_guess(&self) -> u8 {
        if self.proto_num != 0 {
            return self.proto_num;
        }
        match &self.proto {
            serde_json::Value::String(s) => match s.as_str() {
                "TCP" => 6,
                "UDP" => 17,
                "SCTP" => 132,
                "ICMP" => 1,
                "ICMPv6" => 58,
                _ => 0,
            },
            serde_json::Value::Number(n) => n.as_u64().unwrap_or(0) as u8,
            _ => 0,
        }
    }
}

/// Splits `ip:port` / `[v6]:port` / `ip`.
pub fn split_endpoint(s: &str) -> (String, Option<String>) {
    if let Some(rest) = s.strip_prefix('[') {
        if let Some((a, p)) = rest.split_once("]:") {
            return (a.to_string(), Some(p.to_string()));
        }
        return (rest.trim_end_matches(']').to_string(), None);
    }
    match s.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') => (a.to_string(), Some(p.to_string())),
        _ => (s.to_string(), None),
    }
}

fn tuple_fields(
    out: &mut String,
    src: &str,
    dst: &str,
    proto: u8,
    icmp_id: Option<u16>,
    orig: bool,
) {
    let (sa, sp) = split_endpoint(src);
    let (da, dp) = split_endpoint(dst);
    out.push_str(&format!("src={sa} dst={da} "));
    if let (Some(sp), Some(dp)) = (sp, dp) {
        out.push_str(&format!("sport={sp} dport={dp} "));
    } else if let Some(id) = icmp_id {
        // Tracked ICMP is echo: request in the original direction, reply in the other.
        let t = match (proto, orig) {
            (1, true) => 8,
            (1, false) => 0,
            (_, true) => 128,
            (_, false) => 129,
        };
        out.push_str(&format!("type={t} code=0 id={id} "));
    }
}

/// One frontend of `kxdp services`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ServiceRow {
    /// Frontend address as `ip:port` (`[v6]:port`).
    pub frontend: String,
    pub proto: serde_json::Value,
    /// ClusterIP, NodePort, ExternalIP, LoadBalancer.
    pub kind: String,
    /// `ns/name:port`.
    pub service: String,
    pub id: u32,
    pub backends: Vec<BackendRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BackendRow {
    pub address: String,
    /// `active` (used for new connections from some source), `terminating` (a fallback, used
    /// only when no ready endpoint exists), `inactive` (in the list but not routed to).
    pub state: String,
    pub local: bool,
}

/// One worker of `kxdp stats` and `kxdp conntrack stats`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkerRow {
    pub worker: usize,
    pub packets: u64,
    pub bytes: u64,
    pub batches: u64,
    pub busy_ns: u64,
    /// Dataplane clock (ms) when the worker last published (0: never).
    pub updated_ms: u64,
    /// Dataplane clock now (ms), for rates.
    pub now_ms: u64,
    pub ct_insert: u64,
    pub ct_found: u64,
    pub ct_expired: u64,
    /// By action, non-zero only.
    pub actions: std::collections::BTreeMap<String, u64>,
    /// Drops and rejects by reason, non-zero only.
    pub drops: std::collections::BTreeMap<String, u64>,
}

/// `kxdp monitor` filters.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorFilter {
    /// Either address (source or destination, before or after translation) inside.
    pub addr: Option<IpNet>,
    /// Reason codes (any of).
    pub reasons: Vec<String>,
    /// Events per second sent at most (the rest are counted as suppressed).
    pub rate: Option<u32>,
}

/// One event of `kxdp monitor -o json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventRow {
    /// Wall-clock time of the batch (RFC 3339, UTC).
    pub time: String,
    /// Dataplane clock, ms.
    pub at_ms: u64,
    pub worker: usize,
    pub action: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

/// The trailer of an answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Trailer {
    End { end: serde_json::Value },
    Error { error: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request::ConntrackList {
            filter: CtFilter {
                proto: Some(6),
                orig_dst: Some("172.30.0.0/16".parse().unwrap()),
                ..Default::default()
            },
        };
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.starts_with(r#"{"op":"conntrack-list""#), "{s}");
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        assert_eq!(
            split_endpoint("[fd00::1]:80"),
            ("fd00::1".into(), Some("80".into()))
        );
        assert_eq!(split_endpoint("fd00::1"), ("fd00::1".into(), None));
        assert_eq!(split_endpoint("10.0.0.1"), ("10.0.0.1".into(), None));
        let e = CtEntry {
            proto: "ICMP".into(),
            state: None,
            timeout_s: 29,
            assured: true,
            orig_src: "10.0.0.1".into(),
            orig_dst: "172.30.0.1".into(),
            reply_src: "10.1.0.1".into(),
            reply_dst: "10.0.0.1".into(),
            service: None,
            packets_orig: 1,
            bytes_orig: 84,
            packets_reply: 1,
            bytes_reply: 84,
            icmp_id: Some(7),
            replied: true,
            proto_num: 1,
        };
        assert_eq!(
            e.table_line(),
            "icmp     1 29 src=10.0.0.1 dst=172.30.0.1 type=8 code=0 id=7 packets=1 bytes=84 src=10.1.0.1 dst=10.0.0.1 type=0 code=0 id=7 packets=1 bytes=84 [ASSURED] mark=0 use=1"
        );
        let j = serde_json::to_value(&e).unwrap();
        assert_eq!(j["icmp_id"], 7);
        assert!(j.get("state").is_none());
    }
}
