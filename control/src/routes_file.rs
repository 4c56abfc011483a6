//! The route file of `kxdp replay --routes FILE` (YAML or JSON): the node's interfaces,
//! addresses, routes, neighbours and bridge forwarding database, from which replay builds the
//! same FIB the daemon builds from netlink, so that replay runs the same egress stage.
//!
//! ```yaml
//! links:                          # every interface a route, neighbour or FDB entry names
//!   - {name: eth0, ifindex: 2, mac: "02:00:00:00:00:02"}
//!   - {name: cni0, ifindex: 3, mac: "02:00:00:00:00:03"}          # a bridge: other links name it as master
//!   - {name: veth-a, ifindex: 4, mac: "02:00:00:00:00:04", master: cni0}
//!   - {name: wg0, ifindex: 5, attached: false}                    # kxdp has no socket there (default true)
//!   - {name: kxdp0, ifindex: 6, mac: "02:00:00:00:00:06", peer: kxdp0-host}
//!   - {name: kxdp0-host, ifindex: 7, mac: "02:00:00:00:00:07", attached: false}
//! kernelPort: kxdp0               # optional: where `pass` and node-address traffic is sent
//! localAddresses: [192.168.0.10, 10.2.0.1]
//! routes:
//!   - {dst: default, dev: eth0, via: 192.168.0.1}
//!   - {dst: 10.2.0.0/24, dev: cni0, metric: 0}
//! neighbours:
//!   - {addr: 192.168.0.1, dev: eth0, mac: "02:00:00:00:00:01"}
//!   - {addr: 10.2.0.5, dev: cni0, mac: "0a:58:0a:02:00:05"}
//! fdb:
//!   - {mac: "0a:58:0a:02:00:05", port: veth-a}
//! ```
//!
//! Errors name the file and the field (`routes[1].dev: no link named cni9`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use kxdp_dataplane::egress::Egress;
use kxdp_dataplane::fib::{FdbEntry, Fib, FibInput, Link, LocalAddr, Neighbour, Route};
use kxdp_dataplane::replay::ReplayRoutes;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    #[serde(default)]
    links: Vec<LinkSpec>,
    #[serde(default)]
    kernel_port: Option<String>,
    #[serde(default)]
    local_addresses: Vec<IpAddr>,
    #[serde(default)]
    routes: Vec<RouteSpec>,
    #[serde(default)]
    neighbours: Vec<NeighbourSpec>,
    #[serde(default)]
    fdb: Vec<FdbSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkSpec {
    name: String,
    ifindex: u32,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    master: Option<String>,
    #[serde(default)]
    peer: Option<String>,
    #[serde(default = "yes")]
    attached: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteSpec {
    dst: String,
    dev: String,
    #[serde(default)]
    via: Option<IpAddr>,
    #[serde(default)]
    metric: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NeighbourSpec {
    addr: IpAddr,
    dev: String,
    mac: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FdbSpec {
    mac: String,
    port: String,
}

/// A route file that could not be used: which file, which field, why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {field}: {message}", file.display())]
pub struct RoutesError {
    pub file: std::path::PathBuf,
    pub field: String,
    pub message: String,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("`{s}` is not a MAC address (six hex bytes, e.g. 02:00:00:00:00:01)");
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        if p.is_empty() || p.len() > 2 {
            return Err(bad());
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

fn parse_dst(s: &str) -> Result<(IpAddr, u8), String> {
    if s == "default" {
        return Ok((std::net::Ipv4Addr::UNSPECIFIED.into(), 0));
    }
    if s == "default6" || s == "::/0" {
        return Ok((std::net::Ipv6Addr::UNSPECIFIED.into(), 0));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, if ip.is_ipv4() { 32 } else { 128 }));
    }
    let net: ipnet::IpNet = s.parse().map_err(|_| {
        format!("`{s}` is not a destination (an address, ADDR/LEN, `default` or `default6`)")
    })?;
    Ok((net.network(), net.prefix_len()))
}

/// Reads and checks a route file.
pub fn load(path: &Path) -> Result<ReplayRoutes, RoutesError> {
    let text = std::fs::read_to_string(path).map_err(|e| RoutesError {
        file: path.to_path_buf(),
        field: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    from_str(&text, path)
}

/// Parses route-file text; `file` only names the source in errors.
pub fn from_str(text: &str, file: &Path) -> Result<ReplayRoutes, RoutesError> {
    let err = |field: String, message: String| RoutesError {
        file: file.to_path_buf(),
        field,
        message,
    };
    let de = yaml_serde::Deserializer::from_str(text);
    let f: File = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner().to_string();
        // The YAML error repeats the path and appends a position; keep the message.
        let inner = inner
            .strip_prefix(&format!("{field}: "))
            .unwrap_or(&inner)
            .to_string();
        err(if field == "." { String::new() } else { field }, inner)
    })?;
    let mut by_name: HashMap<&str, u32> = HashMap::new();
    for (i, l) in f.links.iter().enumerate() {
        if l.ifindex == 0 {
            return Err(err(
                format!("links[{i}].ifindex"),
                "must be at least 1".into(),
            ));
        }
        if by_name.insert(&l.name, l.ifindex).is_some() {
            return Err(err(
                format!("links[{i}].name"),
                format!("{} appears twice", l.name),
            ));
        }
        if f.links[..i].iter().any(|o| o.ifindex == l.ifindex) {
            return Err(err(
                format!("links[{i}].ifindex"),
                format!("{} is used by another link", l.ifindex),
            ));
        }
    }
    let dev = |field: String, name: &str| {
        by_name
            .get(name)
            .copied()
            .ok_or_else(|| err(field, format!("no link named {name} (see links)")))
    };
    let mut input = FibInput::default();
    let mut attached = Vec::new();
    for (i, l) in f.links.iter().enumerate() {
        let mac = match &l.mac {
            Some(m) => Some(parse_mac(m).map_err(|e| err(format!("links[{i}].mac"), e))?),
            None => None,
        };
        let master = match &l.master {
            Some(m) => Some(dev(format!("links[{i}].master"), m)?),
            None => None,
        };
        let peer = match &l.peer {
            Some(p) => Some(dev(format!("links[{i}].peer"), p)?),
            None => None,
        };
        input.links.push(Link {
            ifindex: l.ifindex,
            name: l.name.clone(),
            mac,
            master,
            bridge: f.links.iter().any(|o| o.master.as_deref() == Some(&l.name)),
            veth: false,
            peer,
            rx_queues: 1,
        });
        if l.attached {
            attached.push(l.ifindex);
        }
    }
    let kernel = match &f.kernel_port {
        Some(k) => {
            let idx = dev("kernelPort".into(), k)?;
            if !attached.contains(&idx) {
                return Err(err(
                    "kernelPort".into(),
                    format!("{k} is not attached (kxdp sends to the kernel through it)"),
                ));
            }
            Some(idx)
        }
        None => None,
    };
    for a in &f.local_addresses {
        input.addrs.push(LocalAddr {
            ifindex: 0,
            addr: *a,
        });
    }
    for (i, r) in f.routes.iter().enumerate() {
        let (dst, len) = parse_dst(&r.dst).map_err(|e| err(format!("routes[{i}].dst"), e))?;
        if let Some(via) = r.via {
            if via.is_ipv4() != dst.is_ipv4() {
                return Err(err(
                    format!("routes[{i}].via"),
                    format!("{via} is not of the family of {}", r.dst),
                ));
            }
        }
        input.routes.push(Route {
            dst,
            len,
            oif: dev(format!("routes[{i}].dev"), &r.dev)?,
            gateway: r.via,
            metric: r.metric,
        });
    }
    for (i, n) in f.neighbours.iter().enumerate() {
        input.neighbours.push(Neighbour {
            ifindex: dev(format!("neighbours[{i}].dev"), &n.dev)?,
            addr: n.addr,
            mac: parse_mac(&n.mac).map_err(|e| err(format!("neighbours[{i}].mac"), e))?,
        });
    }
    for (i, e) in f.fdb.iter().enumerate() {
        let port = dev(format!("fdb[{i}].port"), &e.port)?;
        let bridge = input
            .links
            .iter()
            .find(|l| l.ifindex == port)
            .and_then(|l| l.master)
            .ok_or_else(|| {
                err(
                    format!("fdb[{i}].port"),
                    format!("{} has no master (a bridge port names its bridge)", e.port),
                )
            })?;
        input.fdb.push(FdbEntry {
            bridge,
            port,
            mac: parse_mac(&e.mac).map_err(|e| err(format!("fdb[{i}].mac"), e))?,
        });
    }
    Ok(ReplayRoutes {
        fib: Fib::new(input),
        egress: Egress::new(&attached, kernel),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxdp_dataplane::fib::Hop;
    use kxdp_packet::{Addr, Family};

    const EXAMPLE: &str = r#"
links:
  - {name: eth0, ifindex: 2, mac: "02:00:00:00:00:02"}
  - {name: cni0, ifindex: 3, mac: "02:00:00:00:00:03"}
  - {name: veth-a, ifindex: 4, mac: "02:00:00:00:00:04", master: cni0}
  - {name: wg0, ifindex: 5, attached: false}
localAddresses: [192.168.0.10]
routes:
  - {dst: default, dev: eth0, via: 192.168.0.1}
  - {dst: 10.2.0.0/24, dev: cni0}
  - {dst: 10.9.0.0/16, dev: wg0, metric: 5}
neighbours:
  - {addr: 192.168.0.1, dev: eth0, mac: "02:00:00:00:00:01"}
  - {addr: 10.2.0.5, dev: cni0, mac: "0a:58:0a:02:00:05"}
fdb:
  - {mac: "0a:58:0a:02:00:05", port: veth-a}
"#;

    fn a(s: &str) -> Addr {
        Addr::from_ip(s.parse().unwrap())
    }

    #[test]
    fn the_example_builds_a_fib() {
        let r = from_str(EXAMPLE, Path::new("routes.yaml")).unwrap();
        assert_eq!(
            r.fib.lookup(&a("10.2.0.5"), Family::V4),
            Ok(Hop::Port {
                ifindex: 4,
                dst_mac: [0x0a, 0x58, 0x0a, 0x02, 0x00, 0x05],
                src_mac: [2, 0, 0, 0, 0, 3],
            })
        );
        assert_eq!(
            r.fib.lookup(&a("192.168.0.10"), Family::V4),
            Ok(Hop::Kernel)
        );
        assert_eq!(r.egress.slot(5), None);
        assert!(r.egress.slot(4).is_some());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                EXAMPLE.replace("dev: cni0}", "dev: cni9}"),
                "routes[1].dev: no link named cni9 (see links)",
            ),
            (
                EXAMPLE.replace("\"0a:58:0a:02:00:05\", port", "\"0a:58\", port"),
                "fdb[0].mac: `0a:58` is not a MAC address",
            ),
            (
                EXAMPLE.replace("10.9.0.0/16", "10.9.0.0/99"),
                "routes[2].dst: `10.9.0.0/99` is not a destination",
            ),
            (
                EXAMPLE.replace("port: veth-a", "port: eth0"),
                "fdb[0].port: eth0 has no master",
            ),
            (EXAMPLE.replace("metric: 5", "metrc: 5"), "routes[2]"),
            (
                EXAMPLE.replace("via: 192.168.0.1", "via: fe80::1"),
                "routes[0].via: fe80::1 is not of the family",
            ),
        ];
        for (text, want) in cases {
            let e = from_str(&text, Path::new("r.yaml")).err().expect(want);
            let msg = e.to_string();
            assert!(msg.starts_with("r.yaml: "), "{msg}");
            assert!(msg.contains(want), "{msg} does not contain {want}");
        }
    }
}
