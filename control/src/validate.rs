//! Field checks of Services and EndpointSlices, shared by the `--state` loader (which refuses an
//! object that fails one, naming file, document and field, as the API server would have refused
//! it) and the translation (which skips what fails, as objects from the API server have passed
//! the same checks there and anything left is reported as a `Problem`).
//!
//! Each check returns the message in plain words; callers add the field path.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kxdp_packet::IpProto;

/// One field that fails a check: its path inside the object and why, in plain words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// An IP address field (`clusterIPs[i]`, `externalIPs[i]`, an endpoint address).
pub fn ip(s: &str) -> Result<IpAddr, String> {
    s.trim()
        .parse::<IpAddr>()
        .map_err(|_| format!("`{s}` is not a valid IP address"))
}

/// A CIDR field (`loadBalancerSourceRanges[i]`).
pub fn cidr(s: &str) -> Result<IpNet, String> {
    s.trim()
        .parse::<IpNet>()
        .map_err(|_| format!("`{s}` is not a valid CIDR (address/prefix length)"))
}

/// A port's protocol (TCP when omitted).
pub fn protocol(p: Option<&str>) -> Result<IpProto, String> {
    let name = p.unwrap_or("TCP");
    IpProto::from_port_protocol(name).ok_or_else(|| format!("`{name}` is not TCP, UDP or SCTP"))
}

/// A port number: 1-65535.
pub fn port(n: i32) -> Result<u16, String> {
    match u16::try_from(n) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!("{n} is not a port number (1-65535)")),
    }
}

/// A NodePort: 0 or omitted means none.
pub fn node_port(n: Option<i32>) -> Result<Option<u16>, String> {
    match n.unwrap_or(0) {
        0 => Ok(None),
        p => port(p).map(Some),
    }
}

/// `sessionAffinityConfig.clientIP.timeoutSeconds`: positive.
pub fn affinity_timeout(t: i32) -> Result<u32, String> {
    if t > 0 {
        Ok(t as u32)
    } else {
        Err(format!("{t} is not a positive number of seconds"))
    }
}

/// Every field of a Service that fails a check, in field order.
pub fn service(svc: &Service) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut err = |field: String, message: String| out.push(FieldError { field, message });
    let Some(spec) = svc.spec.as_ref() else {
        return out;
    };
    let is_ip_field = |s: &str| !s.is_empty() && s != "None";
    if let Some(s) = spec.cluster_ip.as_deref().filter(|s| is_ip_field(s)) {
        if let Err(m) = ip(s) {
            err("spec.clusterIP".into(), m);
        }
    }
    let mut families: Vec<bool> = Vec::new();
    for (i, s) in spec.cluster_ips.iter().flatten().enumerate() {
        if !is_ip_field(s) {
            continue;
        }
        match ip(s) {
            Ok(a) if families.contains(&a.is_ipv6()) => err(
                format!("spec.clusterIPs[{i}]"),
                format!("`{s}` is a second ClusterIP of the same IP family"),
            ),
            Ok(a) => families.push(a.is_ipv6()),
            Err(m) => err(format!("spec.clusterIPs[{i}]"), m),
        }
    }
    for (i, s) in spec.external_ips.iter().flatten().enumerate() {
        if let Err(m) = ip(s) {
            err(format!("spec.externalIPs[{i}]"), m);
        }
    }
    for (i, s) in spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .enumerate()
    {
        if let Err(m) = cidr(s) {
            err(format!("spec.loadBalancerSourceRanges[{i}]"), m);
        }
    }
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    if let Some(Err(m)) = timeout.map(affinity_timeout) {
        err(
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds".into(),
            m,
        );
    }
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        if let Err(m) = protocol(p.protocol.as_deref()) {
            err(format!("spec.ports[{i}].protocol"), m);
        }
        if let Err(m) = port(p.port) {
            err(format!("spec.ports[{i}].port"), m);
        }
        if let Err(m) = node_port(p.node_port) {
            err(format!("spec.ports[{i}].nodePort"), m);
        }
    }
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref());
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        if let Some(s) = ing.ip.as_deref().filter(|s| !s.is_empty()) {
            if let Err(m) = ip(s) {
                err(format!("status.loadBalancer.ingress[{i}].ip"), m);
            }
        }
    }
    out
}

/// Every field of an EndpointSlice that fails a check. Addresses are checked against
/// `addressType` when it is IPv4 or IPv6 (FQDN slices are not proxied, so not checked); a port
/// without a number is allowed (the API server allows it; proxies ignore it).
pub fn endpoint_slice(slice: &EndpointSlice) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut err = |field: String, message: String| out.push(FieldError { field, message });
    let v6 = match slice.address_type.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        "FQDN" => None,
        other => {
            err(
                "addressType".into(),
                format!("`{other}` is not IPv4, IPv6 or FQDN"),
            );
            None
        }
    };
    if let Some(v6) = v6 {
        for (i, ep) in slice.endpoints.iter().enumerate() {
            for (j, a) in ep.addresses.iter().enumerate() {
                match ip(a) {
                    Ok(addr) if addr.is_ipv6() != v6 => err(
                        format!("endpoints[{i}].addresses[{j}]"),
                        format!("`{a}` is not of addressType {}", slice.address_type),
                    ),
                    Ok(_) => {}
                    Err(m) => err(format!("endpoints[{i}].addresses[{j}]"), m),
                }
            }
        }
    }
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        if let Err(m) = protocol(p.protocol.as_deref()) {
            err(format!("ports[{i}].protocol"), m);
        }
        if let Some(Err(m)) = p.port.map(port) {
            err(format!("ports[{i}].port"), m);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn service_fields() {
        let ok = svc(serde_json::json!({
            "clusterIP": "10.0.0.3", "clusterIPs": ["10.0.0.3", "fd00::3"],
            "ports": [{"port": 80, "protocol": "UDP", "nodePort": 30080}]
        }));
        assert_eq!(service(&ok), vec![]);
        let headless = svc(serde_json::json!({"clusterIP": "None", "ports": [{"port": 53}]}));
        assert_eq!(service(&headless), vec![]);
        let bad = svc(serde_json::json!({
            "clusterIP": "10.0.0.300",
            "clusterIPs": ["10.0.0.3", "10.0.0.4"],
            "externalIPs": ["1.2.3"],
            "loadBalancerSourceRanges": ["10.0.0.0/33"],
            "ports": [{"port": 70000}, {"port": 80, "protocol": "ICMP", "nodePort": -1}]
        }));
        let fields: Vec<String> = service(&bad)
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        assert_eq!(
            fields,
            vec![
                "spec.clusterIP: `10.0.0.300` is not a valid IP address",
                "spec.clusterIPs[1]: `10.0.0.4` is a second ClusterIP of the same IP family",
                "spec.externalIPs[0]: `1.2.3` is not a valid IP address",
                "spec.loadBalancerSourceRanges[0]: `10.0.0.0/33` is not a valid CIDR (address/prefix length)",
                "spec.ports[0].port: 70000 is not a port number (1-65535)",
                "spec.ports[1].protocol: `ICMP` is not TCP, UDP or SCTP",
                "spec.ports[1].nodePort: -1 is not a port number (1-65535)",
            ]
        );
    }

    #[test]
    fn endpoint_slice_fields() {
        let s: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["fd00::1", "10.0.0.256"]}],
            "ports": [{"port": 0}, {"protocol": "ICMP"}, {}]
        }))
        .unwrap();
        let fields: Vec<String> = endpoint_slice(&s).iter().map(|e| e.field.clone()).collect();
        assert_eq!(
            fields,
            vec![
                "endpoints[1].addresses[0]",
                "endpoints[1].addresses[1]",
                "ports[0].port",
                "ports[1].protocol"
            ]
        );
    }
}
