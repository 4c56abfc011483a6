//! Service addresses and ranges that would take over this node's own traffic (the
//! CVE-2020-8554 class). Called from the translation entry points (`translate::globals` and
//! `translate::translate_service`) on their output, so the translation itself stays as it is.
//!
//! The choices, against what kube-proxy does:
//!
//! | what | kube-proxy | kxdp |
//! | --- | --- | --- |
//! | a ClusterIP equal to a node address | never sees one (the API server allocates ClusterIPs inside the service CIDRs) | **refused**: kxdp rejects every port of a ClusterIP that the Service does not declare, so it would cut the node off (SSH, kubelet) |
//! | an externalIP or LoadBalancer IP equal to a node address | accepted: the declared ports go to the Service, other ports are untouched | **accepted, with a problem** (`kxdp_sync_problems_total`, log, status): a documented way to expose a Service on a node's address, and exactly the CVE-2020-8554 hijack when the Service is not the operator's |
//! | a service CIDR (config `serviceCIDRs` or a ServiceCIDR object) containing a node address or overlapping a cluster CIDR | the API server refuses such ServiceCIDRs only partly; kube-proxy drops traffic to unallocated service addresses | **refused, with a problem**: that CIDR is left out of the service ranges, since kxdp drops traffic to unallocated addresses inside them and pod-to-pod or node traffic would die (0.0.0.0/0) |

use std::net::IpAddr;

use ipnet::IpNet;
use kxdp_dataplane::snapshot::{FrontendKind, PrefixSet};
use kxdp_packet::Addr;

use crate::config::Config;
use crate::model::{ClusterState, ObjectKey};
use crate::problem::Problem;
use crate::translate::output::{Globals, ServiceOutput};

/// Leaves out of `g.service_cidrs` every service CIDR that contains a node address or overlaps a
/// cluster CIDR, with a problem naming it.
pub fn guard_ranges(config: &Config, state: &ClusterState, mut g: Globals) -> Globals {
    let mut origins: Vec<(String, IpNet)> = config
        .service_cidrs
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("config serviceCIDRs[{i}]"), *n))
        .collect();
    for (name, sc) in &state.service_cidrs {
        let cidrs = sc.spec.iter().flat_map(|s| s.cidrs.iter().flatten());
        for (i, c) in cidrs.enumerate() {
            // Invalid ones were reported by the translation already.
            if let Ok(n) = c.trim().parse::<IpNet>() {
                origins.push((format!("ServiceCIDR {name} spec.cidrs[{i}]"), n));
            }
        }
    }
    let mut kept = PrefixSet::new();
    let mut refused = false;
    for (origin, net) in origins {
        let why = if let Some(ip) = g.node_ips.iter().find(|ip| net.contains(*ip)) {
            Some(format!("contains this node's address {ip}"))
        } else {
            config
                .cluster_cidrs
                .iter()
                .find(|c| net.contains(*c) || c.contains(&net))
                .map(|c| format!("overlaps the cluster CIDR {c}"))
        };
        match why {
            Some(why) => {
                refused = true;
                g.problems.push(Problem {
                    object: origin,
                    message: format!(
                        "service CIDR {net} {why}: left out of the service ranges (traffic to \
                         unallocated addresses inside them is dropped, which would cut off pods \
                         and nodes)"
                    ),
                });
            }
            None => kept.insert(net.addr(), net.prefix_len()),
        }
    }
    if refused {
        g.service_cidrs = kept;
    }
    g
}

/// Refuses the Service's ClusterIPs that are node addresses (their frontends go), and reports
/// externalIPs and LoadBalancer IPs that are (they stay, as in kube-proxy).
pub fn guard_service(g: &Globals, key: &ObjectKey, mut out: ServiceOutput) -> ServiceOutput {
    let node: Vec<(Addr, IpAddr)> = g
        .node_ips
        .iter()
        .map(|&ip| (Addr::from_ip(ip), ip))
        .collect();
    if node.is_empty() || out.frontends.is_empty() {
        return out;
    }
    let ip_of = |a: &Addr| node.iter().find(|(n, _)| n == a).map(|(_, ip)| *ip);
    let label = format!("Service {}/{}", key.namespace, key.name);
    let mut problems = Vec::new();
    let taken: Vec<Addr> = out
        .cluster_ips
        .iter()
        .copied()
        .filter(|a| ip_of(a).is_some())
        .collect();
    for a in &taken {
        problems.push(Problem {
            object: label.clone(),
            message: format!(
                "clusterIP {} is this node's address: refused (a ClusterIP rejects the ports it \
                 does not serve, which would cut the node off)",
                ip_of(a).expect("a node address")
            ),
        });
    }
    out.frontends
        .retain(|(k, fe, _)| !(fe.kind == FrontendKind::ClusterIp && taken.contains(&k.addr)));
    out.cluster_ips.retain(|a| !taken.contains(a));
    let mut warned: Vec<Addr> = Vec::new();
    for (k, fe, _) in &out.frontends {
        let Some(ip) = ip_of(&k.addr) else { continue };
        if matches!(
            fe.kind,
            FrontendKind::ExternalIp | FrontendKind::LoadBalancer
        ) && !warned.contains(&k.addr)
        {
            warned.push(k.addr);
            problems.push(Problem {
                object: label.clone(),
                message: format!(
                    "{} {} is this node's address: accepted as kube-proxy does (its ports of this \
                     node now go to the Service; restrict who may set externalIPs, \
                     CVE-2020-8554)",
                    fe.kind.as_str(),
                    ip
                ),
            });
        }
    }
    out.problems.extend(problems);
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sources::files::load_str;
    use crate::translate::translate;
    use kxdp_dataplane::snapshot::FrontendKey;
    use kxdp_packet::IpProto;

    const CONFIG: &str = "apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: node-a
nodeIPs: [192.168.0.2]
clusterCIDRs: [10.0.0.0/8]
";

    fn run(extra_config: &str, yaml: &str) -> crate::translate::Translation {
        let config =
            Config::from_yaml_str(&format!("{CONFIG}{extra_config}"), Path::new("c")).unwrap();
        let mut state = ClusterState::new();
        load_str(yaml, false, Path::new("state.yaml"), &mut state).unwrap();
        translate(&config, &state)
    }

    fn svc(cluster_ip: &str, external_ips: &str) -> String {
        format!(
            "apiVersion: v1
kind: Service
metadata: {{name: grab, namespace: ns}}
spec:
  clusterIP: {cluster_ip}
  externalIPs: [{external_ips}]
  ports: [{{name: ssh, port: 22, targetPort: 2222}}]
"
        )
    }

    fn has(t: &crate::translate::Translation, ip: &str, port: u16) -> bool {
        t.snapshot
            .frontend(&FrontendKey {
                addr: Addr::from_ip(ip.parse().unwrap()),
                port,
                proto: IpProto::TCP,
            })
            .is_some()
    }

    fn problems(t: &crate::translate::Translation) -> String {
        t.problems
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_cluster_ip_equal_to_a_node_address_is_refused() {
        // Unguarded, it captured the node's SSH port and rejected every other port of the node.
        let t = run("serviceCIDRs: [172.30.0.0/16]\n", &svc("192.168.0.2", ""));
        assert!(!has(&t, "192.168.0.2", 22));
        assert!(!t
            .snapshot
            .cluster_ips
            .contains(&Addr::from_ip("192.168.0.2".parse().unwrap())));
        let p = problems(&t);
        assert!(
            p.contains("Service ns/grab: clusterIP 192.168.0.2 is this node's address: refused"),
            "{p}"
        );
        // An ordinary one is untouched.
        let t = run("serviceCIDRs: [172.30.0.0/16]\n", &svc("172.30.0.9", ""));
        assert!(has(&t, "172.30.0.9", 22));
        assert!(t.problems.is_empty(), "{}", problems(&t));
    }

    #[test]
    fn an_external_ip_equal_to_a_node_address_is_accepted_with_a_problem() {
        let t = run(
            "serviceCIDRs: [172.30.0.0/16]\n",
            &svc("172.30.0.9", "192.168.0.2, 203.0.113.9"),
        );
        assert!(has(&t, "192.168.0.2", 22), "kube-proxy serves it");
        assert!(has(&t, "203.0.113.9", 22));
        let p = problems(&t);
        assert!(
            p.contains("ExternalIP 192.168.0.2 is this node's address: accepted")
                && !p.contains("203.0.113.9"),
            "{p}"
        );
    }

    #[test]
    fn service_cidrs_over_node_or_pod_ranges_are_left_out() {
        // Unguarded, a ServiceCIDR of 0.0.0.0/0 dropped pod-to-pod and node traffic.
        let state = format!(
            "{}---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {{name: everything}}
spec: {{cidrs: [0.0.0.0/0]}}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {{name: pods}}
spec: {{cidrs: [10.1.0.0/16]}}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {{name: fine}}
spec: {{cidrs: [172.31.0.0/16]}}
",
            svc("172.30.0.9", "")
        );
        let t = run("serviceCIDRs: [172.30.0.0/16, 192.168.0.0/24]\n", &state);
        let s = &t.snapshot.service_cidrs;
        let v4 = |ip: &str| Addr::from_ip(ip.parse().unwrap());
        use kxdp_packet::Family::V4;
        assert!(!s.contains(&v4("10.2.3.4"), V4), "pod traffic stays");
        assert!(!s.contains(&v4("192.168.0.3"), V4), "node traffic stays");
        assert!(s.contains(&v4("172.30.1.1"), V4));
        assert!(s.contains(&v4("172.31.1.1"), V4));
        let p = problems(&t);
        assert!(p.contains("ServiceCIDR everything spec.cidrs[0]: service CIDR 0.0.0.0/0 contains this node's address 192.168.0.2"), "{p}");
        assert!(p.contains("ServiceCIDR pods spec.cidrs[0]: service CIDR 10.1.0.0/16 overlaps the cluster CIDR 10.0.0.0/8"), "{p}");
        assert!(
            p.contains(
                "config serviceCIDRs[1]: service CIDR 192.168.0.0/24 contains this node's address"
            ),
            "{p}"
        );
    }
}
