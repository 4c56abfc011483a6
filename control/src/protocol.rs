//! Protocol names as the Kubernetes API spells them (`TCP`, `UDP`, `SCTP`), to and from the
//! dataplane's protocol numbers; shared by the cluster model and the policy compiler.

use kxdp_dataplane::snapshot::proto;

/// The protocol number of a Kubernetes protocol name (`None`: not one kxdp carries).
pub fn proto_number(name: &str) -> Option<u8> {
    match name {
        "TCP" => Some(proto::TCP),
        "UDP" => Some(proto::UDP),
        "SCTP" => Some(proto::SCTP),
        _ => None,
    }
}

/// The name of a protocol number, for messages and listings.
pub fn proto_name(p: u8) -> &'static str {
    match p {
        proto::TCP => "TCP",
        proto::UDP => "UDP",
        proto::SCTP => "SCTP",
        1 => "ICMP",
        58 => "ICMPv6",
        _ => "other",
    }
}
