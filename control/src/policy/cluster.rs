//! `policy.networking.k8s.io/v1alpha2` ClusterNetworkPolicy (standard channel): the object
//! (`model/cluster_network_policy.rs`) parsed into the compiler's [`Policy`] (rules with actions,
//! the tier and priority).
//!
//! Semantics and choices: `docs/policy.md` ("ClusterNetworkPolicy"). What kxdp cannot read is a
//! problem naming the field, never silently ignored, and never widens what is allowed: an
//! invalid or refused part of an Accept rule matches nothing; of a Deny rule, everything (the
//! rule denies more, never less); a Pass rule with such a part becomes a Deny over what it
//! could have matched (passing less could let a later Admin Accept in, passing more could skip
//! a later Deny). A policy-level problem (tier, priority, subject) makes the whole policy fail
//! closed: Admin tier, its subject every pod when the subject is unreadable, its Accept rules
//! void and its Pass rules Deny.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kxdp_dataplane::policy::{block_ranges, Action, Direction, Tier};
use kxdp_packet::IpProto;

use super::selector::Selector;
use super::spec::{NsScope, Peer, Policy, Port, PortSpec, Rule};
use crate::model::cluster_network_policy::{
    ClusterNetworkPolicy, CnpPeer, CnpProtocol, CnpRule, Other, PodsSelector,
};
use crate::model::ObjectKey;

/// Whom a ClusterNetworkPolicy selects: pods of the namespaces `ns` matches whose labels
/// `pods` matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClusterSubject {
    pub ns: Selector,
    pub pods: Selector,
}

impl ClusterSubject {
    pub fn matches(
        &self,
        ns_labels: &BTreeMap<String, String>,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.ns.matches(ns_labels) && self.pods.matches(pod_labels)
    }
}

/// A parsed ClusterNetworkPolicy: `policy` is what the compiler reads (its name, rules with
/// their actions, tier and priority in `cluster`; its `subject` unused), `subject` whom it
/// selects.
#[derive(Clone, Debug)]
pub struct ClusterPolicy {
    pub policy: Policy,
    pub subject: ClusterSubject,
    pub tier: Tier,
    pub priority: i32,
}

fn refuse_other(other: &Other, field: &str, problems: &mut Vec<String>) -> bool {
    for k in other.keys() {
        let what = match k.as_str() {
            "nodes" | "domainNames" => "is in the experimental channel, which kxdp does not build",
            _ => "is not a field of the standard ClusterNetworkPolicy",
        };
        problems.push(format!("{field}.{k}: {what}; refused"));
    }
    !other.is_empty()
}

fn selector(s: &Option<LabelSelector>, field: &str) -> Result<Selector, String> {
    match s {
        None => Ok(Selector::everything()),
        Some(s) => Selector::parse(s, field),
    }
}

fn pods_selector(p: &PodsSelector, field: &str) -> Result<(Selector, Selector), String> {
    let mut probs = Vec::new();
    if refuse_other(&p.other, field, &mut probs) {
        return Err(probs.join("; "));
    }
    if p.pod_selector.is_none() {
        return Err(format!("{field}.podSelector: required"));
    }
    Ok((
        selector(&p.namespace_selector, &format!("{field}.namespaceSelector"))?,
        selector(&p.pod_selector, &format!("{field}.podSelector"))?,
    ))
}

/// One peer as the compiler's peers (`networks` may give several blocks).
fn parse_peer(p: &CnpPeer, dir: Direction, field: &str) -> Result<Vec<Peer>, String> {
    let mut probs = Vec::new();
    if refuse_other(&p.other, field, &mut probs) {
        return Err(probs.join("; "));
    }
    let set = p.namespaces.is_some() as u8 + p.pods.is_some() as u8 + p.networks.is_some() as u8;
    if set != 1 {
        return Err(format!(
            "{field}: exactly one of namespaces, pods{} is needed",
            if dir == Direction::Egress {
                ", networks"
            } else {
                ""
            }
        ));
    }
    if let Some(ns) = &p.namespaces {
        return Ok(vec![Peer::Pods {
            ns: NsScope::Select(Selector::parse(ns, &format!("{field}.namespaces"))?),
            pods: Selector::everything(),
        }]);
    }
    if let Some(pods) = &p.pods {
        let (ns, pods) = pods_selector(pods, &format!("{field}.pods"))?;
        return Ok(vec![Peer::Pods {
            ns: NsScope::Select(ns),
            pods,
        }]);
    }
    let nets = p.networks.as_deref().unwrap_or_default();
    if dir == Direction::Ingress {
        return Err(format!("{field}.networks: only egress peers have networks"));
    }
    if nets.is_empty() {
        return Err(format!("{field}.networks: empty"));
    }
    let mut out = Vec::new();
    for (i, n) in nets.iter().enumerate() {
        let cidr: IpNet = n
            .trim()
            .parse()
            .map_err(|_| format!("{field}.networks[{i}]: invalid CIDR `{n}`"))?;
        out.push(Peer::Block {
            ranges: block_ranges((cidr.network(), cidr.prefix_len()), &[]),
            text: cidr.trunc().to_string(),
        });
    }
    Ok(out)
}

/// One protocol match as the compiler's ports (a named port: one per protocol).
fn parse_protocol(p: &CnpProtocol, field: &str) -> Result<Vec<Port>, String> {
    let mut probs = Vec::new();
    if refuse_other(&p.other, field, &mut probs) {
        return Err(probs.join("; "));
    }
    let set = p.tcp.is_some() as u8
        + p.udp.is_some() as u8
        + p.sctp.is_some() as u8
        + p.destination_named_port.is_some() as u8;
    if set != 1 {
        return Err(format!(
            "{field}: exactly one of tcp, udp, sctp, destinationNamedPort is needed"
        ));
    }
    if let Some(name) = &p.destination_named_port {
        if name.is_empty() || name.len() > 15 {
            return Err(format!(
                "{field}.destinationNamedPort: `{name}` is not a valid port name"
            ));
        }
        // The container port's own protocol, whichever it is.
        return Ok([IpProto::TCP, IpProto::UDP, IpProto::SCTP]
            .map(|proto| Port {
                proto,
                spec: PortSpec::Named(name.clone()),
            })
            .to_vec());
    }
    let (proto, pp, f) = if let Some(t) = &p.tcp {
        (IpProto::TCP, t, "tcp")
    } else if let Some(u) = &p.udp {
        (IpProto::UDP, u, "udp")
    } else {
        (IpProto::SCTP, p.sctp.as_ref().expect("one is set"), "sctp")
    };
    let field = format!("{field}.{f}");
    if refuse_other(&pp.other, &field, &mut probs) {
        return Err(probs.join("; "));
    }
    let Some(d) = &pp.destination_port else {
        return Err(format!("{field}.destinationPort: required"));
    };
    let field = format!("{field}.destinationPort");
    if refuse_other(&d.other, &field, &mut probs) {
        return Err(probs.join("; "));
    }
    let num = |v: i64, f: &str| -> Result<u16, String> {
        match u16::try_from(v) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{field}.{f}: {v} is not a port number")),
        }
    };
    let spec = match (&d.number, &d.range) {
        (Some(n), None) => {
            let n = num(*n, "number")?;
            PortSpec::Range(n, n)
        }
        (None, Some(r)) => {
            if refuse_other(&r.other, &format!("{field}.range"), &mut probs) {
                return Err(probs.join("; "));
            }
            let (s, e) = (num(r.start, "range.start")?, num(r.end, "range.end")?);
            if s >= e {
                return Err(format!(
                    "{field}.range: start {s} must be less than end {e}"
                ));
            }
            PortSpec::Range(s, e)
        }
        _ => return Err(format!("{field}: exactly one of number, range is needed")),
    };
    Ok(vec![Port { proto, spec }])
}

/// The whole address line: what an unreadable peer of a Deny rule stands for.
fn everything() -> Peer {
    Peer::Block {
        ranges: vec![(0, u128::MAX)],
        text: "every address (an unreadable peer of a Deny rule)".into(),
    }
}

/// Parses one policy; problems are messages starting with the field path.
pub fn parse(name: &str, cnp: &ClusterNetworkPolicy) -> (ClusterPolicy, Vec<String>) {
    let mut problems = Vec::new();
    let spec = &cnp.spec;
    let mut fail_closed = refuse_other(&spec.other, "spec", &mut problems);
    let tier = match spec.tier.as_deref() {
        Some("Admin") => Tier::Admin,
        Some("Baseline") => Tier::Baseline,
        other => {
            problems.push(match other {
                None => "spec.tier: required (Admin or Baseline)".to_string(),
                Some(t) => format!("spec.tier: `{t}` is not Admin or Baseline"),
            });
            fail_closed = true;
            Tier::Admin
        }
    };
    let priority = match spec.priority {
        Some(p) if (0..=1000).contains(&p) => p as i32,
        other => {
            problems.push(match other {
                None => "spec.priority: required (0 to 1000)".to_string(),
                Some(p) => format!("spec.priority: {p} is not within 0 to 1000"),
            });
            fail_closed = true;
            // Evaluated first: it can only deny.
            0
        }
    };
    let subject = (|| -> Result<ClusterSubject, String> {
        let Some(s) = &spec.subject else {
            return Err("spec.subject: required".into());
        };
        let mut probs = Vec::new();
        if refuse_other(&s.other, "spec.subject", &mut probs) {
            return Err(probs.join("; "));
        }
        match (&s.namespaces, &s.pods) {
            (Some(ns), None) => Ok(ClusterSubject {
                ns: Selector::parse(ns, "spec.subject.namespaces")?,
                pods: Selector::everything(),
            }),
            (None, Some(p)) => {
                let (ns, pods) = pods_selector(p, "spec.subject.pods")?;
                Ok(ClusterSubject { ns, pods })
            }
            _ => Err("spec.subject: exactly one of namespaces, pods is needed".into()),
        }
    })();
    let subject = match subject {
        Ok(s) => s,
        Err(e) => {
            problems.push(format!(
                "{e}: kxdp cannot tell which pods the policy selects; it applies to every pod and only denies"
            ));
            fail_closed = true;
            ClusterSubject {
                ns: Selector::everything(),
                pods: Selector::everything(),
            }
        }
    };
    if fail_closed {
        problems.push(
            "the policy fails closed: Admin tier, its Accept rules match nothing and its Pass rules deny".into(),
        );
    }

    let mut dir_rules = |dir: Direction, list: &Option<Vec<CnpRule>>| -> Option<Vec<Rule>> {
        let list = list.as_ref()?;
        let (list_field, peer_field) = match dir {
            Direction::Ingress => ("spec.ingress", "from"),
            Direction::Egress => ("spec.egress", "to"),
        };
        let mut rules = Vec::new();
        for (ri, r) in list.iter().enumerate() {
            let field = format!("{list_field}[{ri}]");
            // A part kxdp cannot read: for Accept, the rule matches less; for Deny, more.
            let mut unreadable = refuse_other(&r.other, &field, &mut problems);
            let mut action = match r.action.as_deref() {
                Some("Accept") => Action::Accept,
                Some("Deny") => Action::Deny,
                Some("Pass") => Action::Pass,
                other => {
                    problems.push(format!(
                        "{field}.action: {} is not Accept, Deny or Pass; the rule denies",
                        other.map_or("missing".to_string(), |a| format!("`{a}`"))
                    ));
                    unreadable = true;
                    Action::Deny
                }
            };
            let (peers_raw, wrong) = match dir {
                Direction::Ingress => (&r.from, r.to.is_some().then_some("to")),
                Direction::Egress => (&r.to, r.from.is_some().then_some("from")),
            };
            if let Some(w) = wrong {
                problems.push(format!(
                    "{field}.{w}: not a field of an {} rule; refused",
                    dir.as_str()
                ));
                unreadable = true;
            }
            let mut peers = Vec::new();
            let mut bad_peer = false;
            match peers_raw.as_deref() {
                None | Some([]) => {
                    problems.push(format!(
                        "{field}.{peer_field}: required (at least one peer)"
                    ));
                    bad_peer = true;
                }
                Some(list) => {
                    for (pi, p) in list.iter().enumerate() {
                        let f = format!("{field}.{peer_field}[{pi}]");
                        match parse_peer(p, dir, &f) {
                            Ok(p) => peers.extend(p),
                            Err(e) => {
                                problems.push(e);
                                bad_peer = true;
                            }
                        }
                    }
                }
            }
            let mut ports = None;
            let mut bad_port = false;
            if let Some(list) = &r.protocols {
                let mut out = Vec::new();
                for (pi, p) in list.iter().enumerate() {
                    match parse_protocol(p, &format!("{field}.protocols[{pi}]")) {
                        Ok(p) => out.extend(p),
                        Err(e) => {
                            problems.push(e);
                            bad_port = true;
                        }
                    }
                }
                if list.is_empty() {
                    problems.push(format!("{field}.protocols: empty"));
                    bad_port = true;
                }
                ports = Some(out);
            }
            if fail_closed && action == Action::Pass {
                action = Action::Deny;
            }
            let mut void = false;
            match action {
                Action::Accept => {
                    // What could not be read matches nothing.
                    void = fail_closed
                        || unreadable
                        || (bad_peer && peers.is_empty())
                        || (bad_port && ports.as_ref().is_some_and(|p| p.is_empty()));
                    if bad_peer || bad_port || unreadable {
                        problems.push(format!(
                            "{field}: this Accept rule matches {}",
                            if void {
                                "nothing"
                            } else {
                                "only what kxdp could read"
                            }
                        ));
                    }
                }
                Action::Deny | Action::Pass => {
                    let (every_peer, every_port) = (unreadable || bad_peer, unreadable || bad_port);
                    if every_peer || every_port {
                        if action == Action::Pass {
                            problems.push(format!(
                                "{field}: a Pass rule kxdp cannot read fully denies instead"
                            ));
                            action = Action::Deny;
                        }
                        if every_peer {
                            peers = vec![everything()];
                        }
                        if every_port {
                            ports = None;
                        }
                        problems.push(format!(
                            "{field}: this Deny rule covers {} for what kxdp could not read",
                            match (every_peer, every_port) {
                                (true, true) => "every peer and every port",
                                (true, false) => "every peer",
                                _ => "every port",
                            }
                        ));
                    }
                }
            }
            rules.push(Rule {
                index: ri as u32,
                peers: Some(peers),
                ports,
                void,
                action: Some(action),
            });
        }
        Some(rules)
    };
    let ingress = dir_rules(Direction::Ingress, &spec.ingress);
    let egress = dir_rules(Direction::Egress, &spec.egress);
    let name: Arc<str> = name.into();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&name, tier, priority, &subject, &ingress, &egress).hash(&mut h);
    (
        ClusterPolicy {
            policy: Policy {
                key: ObjectKey::cluster(name.to_string()),
                name,
                subject: Selector::everything(),
                ingress,
                egress,
                hash: h.finish(),
                cluster: Some((tier, priority)),
            },
            subject,
            tier,
            priority,
        },
        problems,
    )
}
