//! A `networking.k8s.io/v1` NetworkPolicy, parsed and validated into what the compiler needs.
//!
//! Validation follows the API server's (`pkg/apis/networking/validation`). The state files may
//! hold what the API server would refuse; every such thing is a problem. A problem never widens
//! what a policy allows: an invalid peer or port is left out of its rule, and a rule whose every
//! peer (or every port) is invalid allows nothing, rather than "everything" as an empty list
//! would. A policy whose `podSelector` is invalid selects every pod of its namespace and allows
//! nothing (fail closed: kxdp cannot tell which pods it meant to protect).

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kxdp_dataplane::policy::{block_ranges, Action, Direction, Tier};
use kxdp_packet::IpProto;

use super::selector::Selector;
use crate::model::ObjectKey;

/// Which namespaces a pod peer looks in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NsScope {
    /// The policy's own namespace (a peer with `podSelector` only).
    Own(String),
    /// Namespaces matching a selector.
    Select(Selector),
}

/// One `from`/`to` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    Pods {
        ns: NsScope,
        pods: Selector,
    },
    /// `cidr` minus `except`, as `u128` ranges (see `kxdp_dataplane::policy`), and the text.
    Block {
        ranges: Vec<(u128, u128)>,
        text: String,
    },
}

/// Which ports of a protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PortSpec {
    /// `port` omitted: every port of the protocol.
    All,
    /// `port` (and `endPort`), inclusive.
    Range(u16, u16),
    /// A named port, resolved against the destination pod's container ports.
    Named(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Port {
    pub proto: IpProto,
    pub spec: PortSpec,
}

/// One ingress or egress rule. `None` lists mean "every peer" / "every port".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Index in the policy's `ingress`/`egress` list.
    pub index: u32,
    pub peers: Option<Vec<Peer>>,
    pub ports: Option<Vec<Port>>,
    /// Every listed peer or every listed port was invalid: the rule allows nothing.
    pub void: bool,
    /// A ClusterNetworkPolicy rule's action (`None`: a NetworkPolicy rule, which allows).
    pub action: Option<Action>,
}

/// A parsed NetworkPolicy.
#[derive(Clone, Debug)]
pub struct Policy {
    pub key: ObjectKey,
    /// `namespace/name`.
    pub name: Arc<str>,
    pub subject: Selector,
    /// Present when the policy applies for ingress (`policyTypes`, with the API default).
    pub ingress: Option<Vec<Rule>>,
    pub egress: Option<Vec<Rule>>,
    /// Fingerprint of the parsed content (name, subject, rules).
    pub hash: u64,
    /// A ClusterNetworkPolicy's tier and priority (`None`: a NetworkPolicy).
    pub cluster: Option<(Tier, i32)>,
}

impl Policy {
    pub fn rules(&self, dir: Direction) -> Option<&Vec<Rule>> {
        match dir {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }
}

/// An ingress or egress rule as written: (from/to, ports).
type RawRule = (
    Option<Vec<NetworkPolicyPeer>>,
    Option<Vec<NetworkPolicyPort>>,
);

/// Parses one policy; problems are `(field path, message)` pairs.
pub fn parse(key: &ObjectKey, np: &NetworkPolicy) -> (Policy, Vec<String>) {
    let mut problems = Vec::new();
    let name: Arc<str> = key.to_string().into();
    let spec = np.spec.clone().unwrap_or_default();
    let subject = match &spec.pod_selector {
        None => Selector::everything(),
        Some(s) => match Selector::parse(s, "spec.podSelector") {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!(
                    "{e}: the policy cannot tell which pods it selects; it isolates every pod of namespace {} in its policyTypes and allows nothing",
                    key.namespace
                ));
                Selector::everything()
            }
        },
    };
    let subject_invalid = !problems.is_empty();

    let mut has_ingress = false;
    let mut has_egress = false;
    let mut valid_types = 0;
    for (i, t) in spec.policy_types.iter().flatten().enumerate() {
        match t.as_str() {
            "Ingress" => {
                has_ingress = true;
                valid_types += 1
            }
            "Egress" => {
                has_egress = true;
                valid_types += 1
            }
            other => problems.push(format!(
                "spec.policyTypes[{i}]: `{other}` is not Ingress or Egress; ignored"
            )),
        }
    }
    if valid_types == 0 {
        // The API's default: Ingress always, Egress when egress rules are present.
        has_ingress = true;
        has_egress = spec.egress.as_ref().is_some_and(|e| !e.is_empty());
    }

    let mut dir_rules = |dir: Direction, list: Vec<RawRule>| {
        let (list_field, peer_field) = match dir {
            Direction::Ingress => ("spec.ingress", "from"),
            Direction::Egress => ("spec.egress", "to"),
        };
        let mut rules = Vec::new();
        for (ri, (peers, ports)) in list.into_iter().enumerate() {
            let field = format!("{list_field}[{ri}]");
            let mut void = subject_invalid;
            let peers = match peers.filter(|p| !p.is_empty()) {
                None => None,
                Some(list) => {
                    let mut out = Vec::new();
                    for (pi, p) in list.iter().enumerate() {
                        let f = format!("{field}.{peer_field}[{pi}]");
                        match parse_peer(p, &key.namespace, &f) {
                            Ok(p) => out.push(p),
                            Err(e) => problems.push(format!("{e}; this peer matches nothing")),
                        }
                    }
                    void |= out.is_empty();
                    Some(out)
                }
            };
            let ports = match ports.filter(|p| !p.is_empty()) {
                None => None,
                Some(list) => {
                    let mut out = Vec::new();
                    for (pi, p) in list.iter().enumerate() {
                        let f = format!("{field}.ports[{pi}]");
                        match parse_port(p, &f) {
                            Ok(p) => out.push(p),
                            Err(e) => problems.push(format!("{e}; this port matches nothing")),
                        }
                    }
                    void |= out.is_empty();
                    Some(out)
                }
            };
            rules.push(Rule {
                index: ri as u32,
                peers,
                ports,
                void,
                action: None,
            });
        }
        rules
    };
    let ingress = has_ingress.then(|| {
        dir_rules(
            Direction::Ingress,
            spec.ingress
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.from, r.ports))
                .collect(),
        )
    });
    let egress = has_egress.then(|| {
        dir_rules(
            Direction::Egress,
            spec.egress
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.to, r.ports))
                .collect(),
        )
    });
    if !has_ingress && spec.ingress.as_ref().is_some_and(|r| !r.is_empty()) {
        problems.push(
            "spec.ingress: rules present but policyTypes does not list Ingress; they are ignored, as by the API".into(),
        );
    }
    if !has_egress && spec.egress.as_ref().is_some_and(|r| !r.is_empty()) {
        problems.push(
            "spec.egress: rules present but policyTypes does not list Egress; they are ignored, as by the API".into(),
        );
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&name, &subject, &ingress, &egress).hash(&mut h);
    (
        Policy {
            key: key.clone(),
            name,
            subject,
            ingress,
            egress,
            hash: h.finish(),
            cluster: None,
        },
        problems,
    )
}

fn parse_peer(p: &NetworkPolicyPeer, own_ns: &str, field: &str) -> Result<Peer, String> {
    if let Some(b) = &p.ip_block {
        if p.pod_selector.is_some() || p.namespace_selector.is_some() {
            return Err(format!(
                "{field}: ipBlock cannot be combined with podSelector or namespaceSelector"
            ));
        }
        let cidr: IpNet = b
            .cidr
            .trim()
            .parse()
            .map_err(|_| format!("{field}.ipBlock.cidr: invalid CIDR `{}`", b.cidr))?;
        let mut except = Vec::new();
        for (i, e) in b.except.iter().flatten().enumerate() {
            let n: IpNet = e
                .trim()
                .parse()
                .map_err(|_| format!("{field}.ipBlock.except[{i}]: invalid CIDR `{e}`"))?;
            let inside = matches!(n, IpNet::V4(_)) == matches!(cidr, IpNet::V4(_))
                && cidr.contains(&n.network())
                && n.prefix_len() >= cidr.prefix_len();
            if !inside {
                return Err(format!(
                    "{field}.ipBlock.except[{i}]: `{e}` is not inside the cidr `{}`",
                    b.cidr
                ));
            }
            except.push((n.network(), n.prefix_len()));
        }
        let ranges = block_ranges((cidr.network(), cidr.prefix_len()), &except);
        let mut text = cidr.trunc().to_string();
        if !except.is_empty() {
            let ex: Vec<String> = except.iter().map(|(a, l)| format!("{a}/{l}")).collect();
            text.push_str(&format!(" except {}", ex.join(",")));
        }
        return Ok(Peer::Block { ranges, text });
    }
    let pods = match &p.pod_selector {
        Some(s) => Selector::parse(s, &format!("{field}.podSelector"))?,
        None => Selector::everything(),
    };
    let ns = match &p.namespace_selector {
        Some(s) => NsScope::Select(Selector::parse(s, &format!("{field}.namespaceSelector"))?),
        None if p.pod_selector.is_some() => NsScope::Own(own_ns.to_string()),
        None => {
            return Err(format!(
                "{field}: a peer needs podSelector, namespaceSelector or ipBlock"
            ))
        }
    };
    Ok(Peer::Pods { ns, pods })
}

fn parse_port(p: &NetworkPolicyPort, field: &str) -> Result<Port, String> {
    let protocol = p.protocol.as_deref().unwrap_or("TCP");
    let proto = IpProto::from_port_protocol(protocol).ok_or_else(|| {
        format!("{field}.protocol: `{protocol}` is not TCP, UDP or SCTP: kxdp cannot enforce it")
    })?;
    let num = |v: i32, f: &str| -> Result<u16, String> {
        match u16::try_from(v) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{field}.{f}: {v} is not a port number")),
        }
    };
    let spec = match (&p.port, p.end_port) {
        (None, None) => PortSpec::All,
        (None, Some(_)) => return Err(format!("{field}.endPort: needs port")),
        (Some(IntOrString::Int(n)), None) => {
            let n = num(*n, "port")?;
            PortSpec::Range(n, n)
        }
        (Some(IntOrString::Int(n)), Some(e)) => {
            let (n, e) = (num(*n, "port")?, num(e, "endPort")?);
            if e < n {
                return Err(format!("{field}.endPort: {e} is below port {n}"));
            }
            PortSpec::Range(n, e)
        }
        (Some(IntOrString::String(s)), end) => {
            if let Ok(n) = s.parse::<i32>() {
                // A number written as a string: the API server takes it as a name and then
                // refuses it; be explicit.
                return Err(format!(
                    "{field}.port: `{n}` is a string; write the number without quotes"
                ));
            }
            if end.is_some() {
                return Err(format!(
                    "{field}.endPort: only allowed with a numeric port, not the named port `{s}`"
                ));
            }
            if s.is_empty() || s.len() > 15 {
                return Err(format!("{field}.port: `{s}` is not a valid port name"));
            }
            PortSpec::Named(s.clone())
        }
    };
    Ok(Port { proto, spec })
}

/// The address of an `IpAddr` as the dataplane's `u128` line.
pub fn line(ip: IpAddr) -> u128 {
    kxdp_packet::Addr::from_ip(ip).as_u128()
}
