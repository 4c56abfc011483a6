//! `kxdp policy trace`: how a new connection would be decided, in words. It reads the same
//! snapshot the pipeline does (frontend lookup, routes, endpoint lists, policy tables), so what it
//! prints is what the dataplane does; the cluster state only names things.

use std::fmt::Write as _;
use std::net::IpAddr;

use kxdp_dataplane::policy::{Direction, PolicyTables, Side, ANY_PROTO};
use kxdp_dataplane::snapshot::{EmptyAction, FrontendKey, Snapshot, SourceClass};
use kxdp_packet::{Addr, Family, IpProto};

use super::spec;
use super::{pod_view, PodView};
use crate::model::ClusterState;

/// The connection to trace.
#[derive(Clone, Copy, Debug)]
pub struct TraceQuery {
    pub from: IpAddr,
    pub to: IpAddr,
    /// Destination port (0 when not given).
    pub port: u16,
    pub proto: IpProto,
}

/// The verdict the pipeline would give one backend (or the destination itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendVerdict {
    pub addr: IpAddr,
    pub port: u16,
    pub action: &'static str,
    pub reason: &'static str,
}

/// The whole trace: text and the per-backend verdicts.
#[derive(Clone, Debug)]
pub struct Trace {
    pub text: String,
    pub verdicts: Vec<BackendVerdict>,
}

fn who(state: &ClusterState, ip: IpAddr, snap: &Snapshot) -> String {
    let a = Addr::from_ip(ip);
    let pod = find_pod(state, ip);
    let mut s = match &pod {
        Some(p) if p.host_network => format!(
            "hostNetwork pod {} on node {} (counts as that node)",
            p.key, p.node
        ),
        Some(p) => format!("pod {} on node {}", p.key, p.node),
        None if snap.node.is_node_addr(&a) || snap.policy.is_node(&a) => "this node".to_string(),
        None => "not a known pod".to_string(),
    };
    if snap.policy.is_local_pod(&a) {
        s.push_str(" (local: policy is enforced here)");
    }
    s
}

/// The (non-finished) pod with this address.
pub fn find_pod(state: &ClusterState, ip: IpAddr) -> Option<PodView<'_>> {
    state
        .pods
        .iter()
        .find(|(_, p)| !p.finished() && p.ips.contains(&ip))
        .and_then(|(k, p)| pod_view(k.to_key(), p))
}

/// The policies of the pod's namespace that select it, per direction (from the state; for pods
/// on other nodes this is what their node enforces).
pub fn selecting(state: &ClusterState, pod: &PodView<'_>) -> (Vec<String>, Vec<String>) {
    let (mut ing, mut eg) = (vec![], vec![]);
    if pod.host_network {
        return (ing, eg);
    }
    for (key, np) in &state.network_policies {
        if key.namespace != pod.key.namespace {
            continue;
        }
        let (p, _) = spec::parse(key, np);
        if !p.subject.matches(pod.labels) {
            continue;
        }
        if p.ingress.is_some() {
            ing.push(key.to_string());
        }
        if p.egress.is_some() {
            eg.push(key.to_string());
        }
    }
    // ClusterNetworkPolicies, in evaluation order.
    if !state.cluster_network_policies.is_empty() {
        let ns = super::namespace_labels(state);
        let empty = Default::default();
        let ns_labels = ns.get(&pod.key.namespace).unwrap_or(&empty);
        let mut cluster: Vec<_> = state
            .cluster_network_policies
            .iter()
            .map(|(name, c)| super::cluster::parse(name, c).0)
            .filter(|c| c.subject.matches(ns_labels, pod.labels))
            .collect();
        cluster.sort_by(|a, b| {
            (a.tier, a.priority, &a.policy.name).cmp(&(b.tier, b.priority, &b.policy.name))
        });
        for c in cluster {
            let text = format!(
                "ClusterNetworkPolicy {} ({} tier, priority {})",
                c.policy.name,
                c.tier.as_str(),
                c.priority
            );
            if c.policy.ingress.is_some() {
                ing.push(text.clone());
            }
            if c.policy.egress.is_some() {
                eg.push(text);
            }
        }
    }
    (ing, eg)
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn sock(ip: IpAddr, port: u16, proto: IpProto) -> String {
    if proto.has_ports() {
        match ip {
            IpAddr::V4(a) => format!("{a}:{port}"),
            IpAddr::V6(a) => format!("[{a}]:{port}"),
        }
    } else {
        ip.to_string()
    }
}

fn describe_side(
    t: &PolicyTables,
    side: Side,
    dir: Direction,
    pod: &Addr,
    peer: &Addr,
    proto: IpProto,
) -> String {
    match side {
        Side::NotLocal => "not a pod on this node: not judged here".into(),
        Side::NotIsolated => format!("allowed: not isolated for {}", dir.as_str()),
        Side::Node => "allowed: traffic between this node and its pods always is".into(),
        Side::SelfTraffic => "allowed: a pod can always reach itself".into(),
        Side::Allowed(r) => format!(
            "allowed by {}",
            t.rules
                .get(r as usize)
                .map(|r| r.to_string())
                .unwrap_or_else(|| format!("rule #{r}"))
        ),
        Side::DeniedBy(r) => format!(
            "denied by {}",
            t.rules
                .get(r as usize)
                .map(|r| r.to_string())
                .unwrap_or_else(|| format!("rule #{r}"))
        ),
        Side::Denied => {
            let Some(i) = t.local_pod(pod) else {
                return "denied".into();
            };
            let p = &t.pods()[i as usize];
            let (rules, names) = match dir {
                Direction::Ingress => (&p.ingress, &p.ingress_policies),
                Direction::Egress => (&p.egress, &p.egress_policies),
            };
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let peer_word = match dir {
                Direction::Ingress => "from",
                Direction::Egress => "to",
            };
            let ports = rules.as_ref().map(|r| r.ports_for(peer)).unwrap_or(&[]);
            let peer_ip = peer.to_ip(peer.family());
            if ports.is_empty() {
                format!(
                    "denied: no {} rule of {} allows any traffic {peer_word} {peer_ip}",
                    dir.as_str(),
                    list(&names)
                )
            } else {
                let allowed: Vec<String> = ports
                    .iter()
                    .map(|e| {
                        let what = if e.proto == ANY_PROTO {
                            "any".to_string()
                        } else if e.lo == 0 && e.hi == u16::MAX {
                            format!("{} any port", e.proto.name().unwrap_or("other"))
                        } else if e.lo == e.hi {
                            format!("{} {}", e.proto.name().unwrap_or("other"), e.lo)
                        } else {
                            format!("{} {}-{}", e.proto.name().unwrap_or("other"), e.lo, e.hi)
                        };
                        let by = t.rules.get(e.rule as usize).map(|r| r.to_string());
                        format!("{what} ({})", by.unwrap_or_default())
                    })
                    .collect();
                format!(
                    "denied: {peer_ip} is a peer only on {} (not {} on this port)",
                    allowed.join(", "),
                    proto.name().unwrap_or("other")
                )
            }
        }
    }
}

/// Traces a new connection from `q.from` to `q.to`.
pub fn trace(state: &ClusterState, snap: &Snapshot, q: &TraceQuery) -> Trace {
    let mut out = String::new();
    let mut verdicts = Vec::new();
    let src = Addr::from_ip(q.from);
    let dst = Addr::from_ip(q.to);
    let family = if q.from.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    };
    let t = &snap.policy;
    let _ = writeln!(
        out,
        "connection   {} {} -> {}",
        q.proto.name().unwrap_or("other"),
        q.from,
        sock(q.to, q.port, q.proto)
    );
    let _ = writeln!(out, "source       {}: {}", q.from, who(state, q.from, snap));
    if let Some(p) = find_pod(state, q.from) {
        let (_, eg) = selecting(state, &p);
        let _ = writeln!(out, "  egress policies selecting it: {}", list(&eg));
    }

    // The Service translation, as the pipeline does it.
    let fe = snap.frontend(&FrontendKey {
        addr: dst,
        port: q.port,
        proto: q.proto,
    });
    let mut backends: Vec<(Addr, u16)> = Vec::new();
    let mut service_reason: &'static str = "direct";
    match fe {
        Some(fe) => {
            let sp = &*fe.service_port;
            let class = snap.classify_source(&src, family);
            let route = fe.routes[class as usize];
            let class_name = match class {
                SourceClass::Pod => "pod",
                SourceClass::Node => "node",
                SourceClass::External => "external",
            };
            let _ = writeln!(
                out,
                "service      {} {} of {} (source class {class_name})",
                fe.kind.as_str(),
                sock(q.to, q.port, q.proto),
                sp.name
            );
            if fe
                .source_ranges
                .as_ref()
                .is_some_and(|r| !r.contains(&src, family))
            {
                let _ = writeln!(
                    out,
                    "  source outside loadBalancerSourceRanges: drop (source-range)"
                );
                verdicts.push(BackendVerdict {
                    addr: q.to,
                    port: q.port,
                    action: "drop",
                    reason: "source-range",
                });
                return Trace {
                    text: out,
                    verdicts,
                };
            }
            if route.endpoints.is_empty() {
                let (action, reason) = match route.when_empty {
                    EmptyAction::Reject => ("reject", "no-endpoints"),
                    EmptyAction::Drop => ("drop", "no-local-endpoints"),
                };
                let _ = writeln!(out, "  no eligible endpoint: {action} ({reason})");
                verdicts.push(BackendVerdict {
                    addr: q.to,
                    port: q.port,
                    action,
                    reason,
                });
                return Trace {
                    text: out,
                    verdicts,
                };
            }
            let eps = fe.endpoints_of(route.endpoints);
            let _ = writeln!(
                out,
                "  {} eligible endpoint(s), one chosen per connection{}{}{}; policy judges the chosen one:",
                eps.len(),
                if fe.maglev.as_ref().is_some_and(|m| m.table(route.endpoints).is_some()) {
                    " by Maglev"
                } else {
                    ""
                },
                if sp.affinity_timeout_s > 0 {
                    " (ClientIP affinity)"
                } else {
                    ""
                },
                if route.masquerade { ", masqueraded" } else { "" }
            );
            backends.extend(eps.iter().map(|e| (e.addr, e.port)));
            service_reason = "service-dnat";
        }
        None => {
            if snap.cluster_ips.contains(&dst) {
                let _ = writeln!(
                    out,
                    "service      {} is a ClusterIP without {} port {}: reject (service-port-unknown)",
                    q.to,
                    q.proto.name().unwrap_or("other"),
                    q.port
                );
                verdicts.push(BackendVerdict {
                    addr: q.to,
                    port: q.port,
                    action: "reject",
                    reason: "service-port-unknown",
                });
                return Trace {
                    text: out,
                    verdicts,
                };
            }
            if snap.node.is_node_addr(&dst) {
                let _ = writeln!(
                    out,
                    "service      none; {} is this node: pass (to-node), no policy applies",
                    q.to
                );
                verdicts.push(BackendVerdict {
                    addr: q.to,
                    port: q.port,
                    action: "pass",
                    reason: "to-node",
                });
                return Trace {
                    text: out,
                    verdicts,
                };
            }
            let _ = writeln!(out, "service      none: the destination as addressed");
            backends.push((dst, q.port));
        }
    }

    for (addr, port) in backends {
        let ip = addr.to_ip(family);
        let _ = writeln!(
            out,
            "destination  {}: {}",
            sock(ip, port, q.proto),
            who(state, ip, snap)
        );
        if let Some(p) = find_pod(state, ip) {
            let (ing, _) = selecting(state, &p);
            let _ = writeln!(out, "  ingress policies selecting it: {}", list(&ing));
        }
        let (e, i) = t.explain(&src, &addr, q.proto, port);
        let _ = writeln!(
            out,
            "  egress  at source:      {}",
            describe_side(t, e, Direction::Egress, &src, &addr, q.proto)
        );
        let _ = writeln!(
            out,
            "  ingress at destination: {}",
            describe_side(t, i, Direction::Ingress, &addr, &src, q.proto)
        );
        let (action, reason) = if !e.allows() {
            ("drop", "policy-denied-egress")
        } else if !i.allows() {
            ("drop", "policy-denied-ingress")
        } else {
            ("forward", service_reason)
        };
        let _ = writeln!(out, "  verdict: {action} ({reason})");
        verdicts.push(BackendVerdict {
            addr: ip,
            port,
            action,
            reason,
        });
    }
    Trace {
        text: out,
        verdicts,
    }
}

/// `--to IP[:PORT]`: an address with an optional port (IPv6 with a port as `[addr]:port`).
pub fn parse_target(s: &str) -> Result<(IpAddr, u16), String> {
    let s = s.trim();
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Ok((sa.ip(), sa.port()));
    }
    let bare = s.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>()
        .map(|ip| (ip, 0))
        .map_err(|_| format!("--to: `{s}` is not IP or IP:PORT (IPv6 as [addr]:port)"))
}

/// `--proto`: TCP, UDP, SCTP (any case), or ICMP (ICMPv6 for an IPv6 destination).
pub fn parse_proto(s: &str, to: IpAddr) -> Result<IpProto, String> {
    match s.to_ascii_uppercase().as_str() {
        "TCP" => Ok(IpProto::TCP),
        "UDP" => Ok(IpProto::UDP),
        "SCTP" => Ok(IpProto::SCTP),
        "ICMP" | "ICMPV6" => Ok(if to.is_ipv4() {
            IpProto::ICMP
        } else {
            IpProto::ICMPV6
        }),
        _ => Err(format!("--proto: `{s}` is not TCP, UDP, SCTP or ICMP")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_protocols() {
        assert_eq!(
            parse_target("10.0.0.1:80").unwrap(),
            ("10.0.0.1".parse().unwrap(), 80)
        );
        assert_eq!(
            parse_target("10.0.0.1").unwrap(),
            ("10.0.0.1".parse().unwrap(), 0)
        );
        assert_eq!(
            parse_target("[fd00::1]:443").unwrap(),
            ("fd00::1".parse().unwrap(), 443)
        );
        assert_eq!(
            parse_target("fd00::1").unwrap(),
            ("fd00::1".parse().unwrap(), 0)
        );
        assert!(parse_target("web:80").is_err());
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(parse_proto("sctp", v6), Ok(IpProto::SCTP));
        assert_eq!(parse_proto("ICMP", v6), Ok(IpProto::ICMPV6));
        assert!(parse_proto("GRE", v6).is_err());
    }
}
