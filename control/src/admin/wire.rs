//! The admin socket's wire format: newline-delimited JSON.
//!
//! The client writes one `Request` line. The server answers with zero or more data lines (one
//! JSON object each: a conntrack entry as `kxdp conntrack list -o json` prints it, a service, a worker, an event)
//! and ends with exactly one trailer line: `{"end":{...}}` (success, with a summary) or
//! `{"error":"message"}`. `monitor` streams until the client closes the connection.

use std::net::IpAddr;

use ipnet::IpNet;
use kxdp_dataplane::conntrack::{Conntrack, EntryView, Tuple, FLAG_ASSURED, FLAG_SEEN_REPLY};
use kxdp_dataplane::snapshot::Snapshot;
use kxdp_packet::Family;
use serde::{Deserialize, Serialize};

use kxdp_packet::{Addr, IpProto};

/// The protocol as verdicts and listings name it in JSON: `TCP`, `UDP`, `SCTP`, `ICMP`,
/// `ICMPv6`, else the number.
pub fn proto_name(p: IpProto) -> serde_json::Value {
    p.name().map_or_else(|| p.0.into(), Into::into)
}

/// A protocol on the wire: its number (`#[serde(with = "proto_number")]`).
mod proto_number {
    use kxdp_packet::IpProto;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(p: &IpProto, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(p.0)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IpProto, D::Error> {
        u8::deserialize(d).map(IpProto)
    }

    /// The same for an optional protocol (absent or null: None).
    pub mod option {
        use kxdp_packet::IpProto;
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(p: &Option<IpProto>, s: S) -> Result<S::Ok, S::Error> {
            p.map(|p| p.0).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpProto>, D::Error> {
            Option::<u8>::deserialize(d).map(|p| p.map(IpProto))
        }
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
    ConntrackList {
        filter: CtFilter,
    },
    ConntrackCount {
        filter: CtFilter,
    },
    ConntrackDelete {
        filter: CtFilter,
    },
    ConntrackStats,
    Services,
    Stats,
    Status,
    Monitor {
        filter: MonitorFilter,
    },
    /// `conntrack -E`: streams `CtEventRow`s until the client closes the connection.
    ConntrackEvents {
        filter: CtFilter,
        events: CtEventMask,
    },
    /// `kxdp policy trace` against the daemon's own state and published tables.
    PolicyTrace {
        from: IpAddr,
        to: IpAddr,
        /// 0: no port given.
        port: u16,
        #[serde(with = "proto_number")]
        proto: IpProto,
    },
    /// `kxdp policy counters`: one `PolicyCounterRow` line per rule that counted a connection.
    PolicyCounters,
}

/// Which `conntrack -E` events a client wants (conntrack's `-e NEW,UPDATE,DESTROY`), and how
/// often the table is compared (milliseconds; default 100).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CtEventMask {
    pub new: bool,
    pub update: bool,
    pub destroy: bool,
    pub interval_ms: Option<u64>,
}

/// A NAT filter (`--src-nat`, `--dst-nat`, `--any-nat`): the connection is translated that way,
/// and, when given, to an address inside `addr` (and to `port`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NatMatch {
    pub addr: Option<IpNet>,
    pub port: Option<u16>,
}

/// conntrack's `--status` names kxdp knows; EXPECTED and FIXED_TIMEOUT never hold (no helpers,
/// no fixed timeouts), UNSET means neither ASSURED nor SEEN_REPLY.
pub const STATUS_NAMES: &[&str] = &[
    "ASSURED",
    "SEEN_REPLY",
    "UNSET",
    "EXPECTED",
    "FIXED_TIMEOUT",
];

/// Every protocol state name `--state` accepts (TCP and SCTP as the kernel names them).
/// LISTEN and SYN_SENT2 are accepted for conntrack-tools' sake; kxdp never enters them.
pub const STATE_NAMES: &[&str] = &[
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "LISTEN",
    "SYN_SENT2",
    "CLOSED",
    "COOKIE_WAIT",
    "COOKIE_ECHOED",
    "SHUTDOWN_SENT",
    "SHUTDOWN_RECD",
    "SHUTDOWN_ACK_SENT",
    "HEARTBEAT_SENT",
    "HEARTBEAT_ACKED",
];

/// conntrack-tools' filters. Addresses accept a CIDR (`10.0.0.0/8`) as well as an address.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CtFilter {
    /// IP protocol number.
    #[serde(with = "proto_number::option")]
    pub proto: Option<IpProto>,
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
    /// Source-NATed (masqueraded) connections, optionally to this address/port.
    pub src_nat: Option<NatMatch>,
    /// Destination-NATed connections (Services), optionally to this endpoint address/port.
    pub dst_nat: Option<NatMatch>,
    /// Either.
    pub any_nat: Option<NatMatch>,
    /// conntrack status names (all must hold): ASSURED, SEEN_REPLY, UNSET, EXPECTED, FIXED_TIMEOUT.
    pub status: Vec<String>,
    /// conntrack's `--mark VALUE[/MASK]`: kxdp has no marks, every connection's is 0.
    pub mark: Option<(u32, u32)>,
    /// conntrack's `--zone`: kxdp has one zone, 0.
    pub zone: Option<u16>,
}

fn nat_hit(m: &NatMatch, to: &Tuple, src: bool) -> bool {
    let (ip, port) = if src {
        (to.src.to_ip(to.family), to.sport)
    } else {
        (to.dst.to_ip(to.family), to.dport)
    };
    net_has(&m.addr, ip) && m.port.is_none_or(|p| p == port)
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
        // SNAT: the reply comes back to another address/port than the client's (the NAT address
        // is the reply's destination); DNAT: it comes from another than the one dialled (the
        // endpoint is the reply's source).
        let snat = r.dst != o.src || r.dport != o.sport;
        let dnat = r.src != o.dst || r.sport != o.dport;
        if let Some(m) = &self.src_nat {
            if !snat || !nat_hit(m, r, false) {
                return false;
            }
        }
        if let Some(m) = &self.dst_nat {
            if !dnat || !nat_hit(m, r, true) {
                return false;
            }
        }
        if let Some(m) = &self.any_nat {
            if !((snat && nat_hit(m, r, false)) || (dnat && nat_hit(m, r, true))) {
                return false;
            }
        }
        for st in &self.status {
            let ok = match st.to_ascii_uppercase().as_str() {
                "ASSURED" => v.state & FLAG_ASSURED != 0,
                "SEEN_REPLY" => v.state & FLAG_SEEN_REPLY != 0,
                "UNSET" => v.state & (FLAG_ASSURED | FLAG_SEEN_REPLY) == 0,
                _ => false,
            };
            if !ok {
                return false;
            }
        }
        if let Some((value, mask)) = self.mark {
            if value & mask != 0 {
                return false;
            }
        }
        if self.zone.is_some_and(|z| z != 0) {
            return false;
        }
        true
    }

    /// Checks names and values a client may have typed (the server refuses a bad filter
    /// instead of silently matching nothing).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(st) = &self.state {
            if !STATE_NAMES.iter().any(|n| n.eq_ignore_ascii_case(st)) {
                return Err(format!(
                    "--state: unknown state `{st}` (one of {})",
                    STATE_NAMES.join(", ")
                ));
            }
        }
        for st in &self.status {
            if !STATUS_NAMES.iter().any(|n| n.eq_ignore_ascii_case(st)) {
                return Err(format!(
                    "--status: unknown status `{st}` (one of {})",
                    STATUS_NAMES.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// One connection, as `kxdp conntrack list -o json` prints it (docs/operations.md).
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
    /// The Service port's stable id (as `kxdp services` shows it); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u32>,
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
    pub proto_num: IpProto,
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
            service_id: (v.service_id != 0).then_some(v.service_id),
            packets_orig: v.packets[0],
            bytes_orig: v.bytes[0],
            packets_reply: v.packets[1],
            bytes_reply: v.bytes[1],
            icmp_id: matches!(v.orig.proto, IpProto::ICMP | IpProto::ICMPV6)
                .then_some(v.orig.sport),
            replied: v.state & FLAG_SEEN_REPLY != 0,
            proto_num: v.orig.proto,
        }
    }

    /// `conntrack -L`'s line shape, with the Service appended:
    /// `tcp      6 86395 ESTABLISHED src=… dst=… sport=… dport=… packets=3 bytes=180 src=… dst=… sport=… dport=… packets=2 bytes=120 [ASSURED] service=ns1/svc1:http`
    pub fn table_line(&self) -> String {
        self.line(LineShape::List)
    }

    /// `conntrack -L -o extended`: the layer 3 name and number first.
    pub fn extended_line(&self) -> String {
        self.line(LineShape::Extended)
    }

    /// `conntrack -E`'s line: `    [NEW] tcp      6 120 SYN_SENT src=…`; DESTROY lines carry no
    /// timeout and no state, as the kernel's.
    pub fn event_line(&self, event: &str, extended: bool) -> String {
        let tag = format!("[{}]", event.to_ascii_uppercase());
        let shape = if event.eq_ignore_ascii_case("destroy") {
            LineShape::Destroy { extended }
        } else {
            LineShape::Event { extended }
        };
        format!("{tag:>9} {}", self.line(shape))
    }

    fn line(&self, shape: LineShape) -> String {
        let pname = match &self.proto {
            serde_json::Value::String(s) => s.to_ascii_lowercase(),
            v => format!("unknown {v}"),
        };
        let proto = self.proto_num_or_guess();
        // conntrack prints the number after the name.
        let num = proto.0;
        let extended = matches!(
            shape,
            LineShape::Extended
                | LineShape::Event { extended: true }
                | LineShape::Destroy { extended: true }
        );
        let mut s = String::new();
        if extended {
            let v6 = self.orig_src.starts_with('[') || self.orig_src.matches(':').count() > 1;
            s.push_str(&format!(
                "{:<8} {} ",
                if v6 { "ipv6" } else { "ipv4" },
                if v6 { 10 } else { 2 }
            ));
        }
        if matches!(shape, LineShape::Destroy { .. }) {
            s.push_str(&format!("{pname:<8} {num} "));
        } else {
            s.push_str(&format!("{pname:<8} {num} {} ", self.timeout_s));
            if let Some(st) = &self.state {
                s.push_str(st);
                s.push(' ');
            }
        }
        tuple_fields(
            &mut s,
            &self.orig_src,
            &self.orig_dst,
            proto,
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
            proto,
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
        s.push_str("mark=0");
        if !matches!(shape, LineShape::Event { .. } | LineShape::Destroy { .. }) {
            s.push_str(" use=1");
        }
        if let Some(svc) = &self.service {
            s.push_str(" service=");
            s.push_str(svc);
        }
        s
    }

    fn proto_num_or_guess(&self) -> IpProto {
        if self.proto_num != IpProto::default() {
            return self.proto_num;
        }
        match &self.proto {
            serde_json::Value::String(s) => IpProto::from_name(s).unwrap_or_default(),
            serde_json::Value::Number(n) => IpProto(n.as_u64().unwrap_or(0) as u8),
            _ => IpProto::default(),
        }
    }
}

#[derive(Clone, Copy)]
enum LineShape {
    List,
    Extended,
    Event { extended: bool },
    Destroy { extended: bool },
}

/// One `conntrack -E` event (`kxdp conntrack events -o json`): the connection as `list` shows
/// it, with the event type (`new`, `update`, `destroy`) and when it was seen.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CtEventRow {
    pub event: String,
    pub time: String,
    #[serde(flatten)]
    pub entry: CtEntry,
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
    proto: IpProto,
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
            (IpProto::ICMP, true) => 8,
            (IpProto::ICMP, false) => 0,
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
    /// conntrack -S's `invalid`: packets conntrack could not track (ct-invalid, ct-lost,
    /// icmp-error-untracked, fragment-no-state).
    #[serde(default)]
    pub ct_invalid: u64,
    /// `insert_failed`: a new connection found no unique reply tuple (snat-exhausted).
    #[serde(default)]
    pub ct_insert_failed: u64,
    /// `drop`: a new connection dropped for want of room (conntrack-full).
    #[serde(default)]
    pub ct_drop: u64,
    /// `error`: ICMP errors that quote no tracked connection (a subset of `invalid`).
    #[serde(default)]
    pub ct_error: u64,
    /// By action, non-zero only.
    pub actions: std::collections::BTreeMap<String, u64>,
    /// Drops and rejects by reason, non-zero only.
    pub drops: std::collections::BTreeMap<String, u64>,
}

/// One AF_XDP socket of `kxdp stats` (in the summary's `sockets`): the kernel's counters of
/// frames lost before kxdp saw them (`XDP_STATISTICS`, read by the worker about once a second)
/// and the socket's ring sizes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SocketRow {
    pub interface: String,
    pub queue: u32,
    pub worker: usize,
    pub rx_ring_size: u32,
    pub fill_ring_size: u32,
    pub tx_ring_size: u32,
    pub completion_ring_size: u32,
    /// Frames dropped: RX ring full.
    pub rx_ring_full: u64,
    /// Frames dropped otherwise (no fill-ring frame to copy into, too large).
    pub rx_dropped: u64,
    pub rx_fill_ring_empty: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub tx_ring_empty: u64,
}

impl SocketRow {
    pub fn from_sample(s: &kxdp_dataplane::stats::SocketSample) -> SocketRow {
        let k = &s.kernel;
        SocketRow {
            interface: s.interface.clone(),
            queue: s.queue,
            worker: s.worker,
            rx_ring_size: s.rings.rx,
            fill_ring_size: s.rings.fill,
            tx_ring_size: s.rings.tx,
            completion_ring_size: s.rings.completion,
            rx_ring_full: k.rx_ring_full,
            rx_dropped: k.rx_dropped,
            rx_fill_ring_empty: k.rx_fill_ring_empty_descs,
            rx_invalid_descs: k.rx_invalid_descs,
            tx_invalid_descs: k.tx_invalid_descs,
            tx_ring_empty: k.tx_ring_empty_descs,
        }
    }
}

/// kxdp's tap in `kxdp stats` (the summary's `tap`, with `podInterception: tap`): the frames
/// the kernel dropped because the tap's queue to a worker was full (cumulative, read by the
/// workers about once a second).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TapRow {
    pub tap: String,
    pub queue_full: u64,
}

impl TapRow {
    pub fn from_sample(s: &kxdp_dataplane::stats::TapSample) -> TapRow {
        TapRow {
            tap: s.interface.clone(),
            queue_full: s.queue_full,
        }
    }
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
    /// Event types (any of): `drop` (drops and rejects; the default when empty), `trace` (every
    /// other packet: forwarded or passed), `policy-verdict` (new connections NetworkPolicy
    /// judged: allowed or denied).
    pub types: Vec<String>,
    /// Keep one matching event in N (1 or none: all).
    pub sample: Option<u32>,
    /// Carry the first bytes of each packet (`hex`).
    pub hex: bool,
}

/// The `kxdp monitor --type` names.
pub const MONITOR_TYPES: &[&str] = &["drop", "trace", "policy-verdict"];

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u32>,
    /// Forwarded packets that were translated: source and destination as they leave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_src: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_dst: Option<String>,
    /// `drop`, `trace` or `policy-verdict`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// policy-verdict events: `allow` or `deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The packet's first bytes as captured (hex, when asked for and available).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    /// The packet's length on the wire, when `hex` is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<u32>,
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
                proto: Some(IpProto::TCP),
                orig_dst: Some("172.30.0.0/16".parse().unwrap()),
                ..Default::default()
            },
        };
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.starts_with(r#"{"op":"conntrack-list""#), "{s}");
        // Protocols travel as their numbers.
        assert!(s.contains(r#""proto":6,"#), "{s}");
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        let t = Request::PolicyTrace {
            from: "10.0.0.1".parse().unwrap(),
            to: "10.0.0.2".parse().unwrap(),
            port: 53,
            proto: IpProto::UDP,
        };
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(
            s,
            r#"{"op":"policy-trace","from":"10.0.0.1","to":"10.0.0.2","port":53,"proto":17}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), t);
        let none: CtFilter = serde_json::from_str("{}").unwrap();
        assert_eq!(none.proto, None);
        assert_eq!(
            serde_json::from_str::<CtFilter>(r#"{"proto":null}"#).unwrap(),
            none
        );
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
            service_id: None,
            packets_orig: 1,
            bytes_orig: 84,
            packets_reply: 1,
            bytes_reply: 84,
            icmp_id: Some(7),
            replied: true,
            proto_num: IpProto::ICMP,
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
