//! The two-node CNI lab: network namespaces wired the way a container runtime wires pods, with
//! the CNI reference plugins of Debian's `containernetworking-plugins` (`/usr/lib/cni`).
//!
//! ```text
//!                       nodes' network (bridge br0 in the `sw` namespace)
//!                       192.168.77.0/24, fd77::/64
//!        ┌──────────────────────────┼──────────────────────────┐
//!   node-a eth0 .1 / ::1       node-b eth0 .2 / ::2        ext eth0 .100 / ::100
//!   CNI `ptp`                  CNI `bridge` (cni0)         (outside the cluster:
//!   pods 10.77.1.0/24,         pods 10.77.2.0/24,           no routes to pods)
//!        fd00:77:1::/64             fd00:77:2::/64
//!   veth* /32 per pod          veth* ports of cni0
//! ```
//!
//! Each node routes the other's pod ranges via the other's address. Pods are created with
//! `CNI_COMMAND=ADD` and deleted with `CNI_COMMAND=DEL`, run inside the node's namespace
//! (`ip netns exec NODE /usr/lib/cni/PLUGIN`) with the network config on stdin, exactly as a
//! container runtime does: `host-local` IPAM with a per-node `dataDir`, IPv4 and IPv6 ranges,
//! `ipMasq: true` (the plugins install iptables MASQUERADE rules in the node's namespace).
//!
//! The plugins masquerade everything leaving the pod's own /24; a real node also runs something
//! like ip-masq-agent that keeps traffic inside the cluster unmasqueraded. The lab installs that
//! one rule per family on each node (`POSTROUTING -s CLUSTER -d CLUSTER -j RETURN`), so pod to pod
//! across nodes keeps the pod's address and only traffic leaving the cluster takes the node's.
//!
//! Every pod runs plain-socket servers (threads of the test process inside the pod's namespace):
//! TCP 8080 writes `"POD PEER-IP\n"` then reads until EOF and answers with the byte count; UDP
//! 5353 answers each datagram with `"POD PEER-IP"`. The external host can run the same servers.
//!
//! Namespaces are named `kxcni-<pid>-<lab>-<name>` (parallel test binaries never collide); the
//! [`Lab`] deletes them on drop, also while a failing test unwinds, and the next lab removes those
//! of a test process that no longer exists. Labs within one test binary run one at a time (2
//! shared cores; two kxdp pairs busy-polling at once only make timings noisy). Every wait is
//! bounded.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::lab::{delete_netns, ip, remove_orphans, run, spawn_greet_and_count_server, Kxdp};

pub const PREFIX: &str = "kxcni-";
pub const CNI_PATH: &str = "/usr/lib/cni";

pub const EXT4: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 100);
pub const EXT6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 0x100);
pub const CLUSTER4: &str = "10.77.0.0/16";
pub const CLUSTER6: &str = "fd00:77::/32";
pub const SERVICE4: &str = "172.30.0.0/16";
pub const SERVICE6: &str = "fd00:30::/108";
/// The pods' TCP and UDP server ports.
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 5353;

static SEQ: AtomicU32 = AtomicU32::new(0);
static SERIAL: Mutex<()> = Mutex::new(());

/// How the nodes' pod ranges are joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Underlay {
    /// Each node routes the other's pod ranges via the other's address over `eth0`.
    Routes,
    /// VXLAN as flannel's default backend builds it: `flannel.1` (VNI 1, port 8472, the node's
    /// subnet's `.0` as a /32), `flannel-v6.1` for IPv6, the other node's subnet
    /// `via <subnet>.0 dev flannel.1 onlink`, static neighbour and FDB entries.
    FlannelVxlan,
    /// VXLAN as Calico's VXLAN mode builds it: `vxlan.calico` (VNI 4096, port 4789, a tunnel
    /// address from the node's block), IPv4.
    CalicoVxlan,
    /// A tun device `kxtun` on each node joined by a userspace relay (UDP port 8999 between the
    /// nodes' addresses), standing in for an encrypting tunnel such as a userspace WireGuard:
    /// a device without Ethernet addresses that kxdp cannot own. IPv4 and IPv6.
    Tun,
}

/// The tun underlay's device name (it must be in kxdp's `hostPath.overlayInterfaces`).
pub const TUN_DEVICE: &str = "kxtun";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugin {
    Ptp,
    Bridge,
}

impl Plugin {
    pub fn binary(self) -> &'static str {
        match self {
            Plugin::Ptp => "ptp",
            Plugin::Bridge => "bridge",
        }
    }
}

pub struct Node {
    /// The Kubernetes node name (`node-a`, `node-b`).
    pub name: &'static str,
    pub ns: String,
    pub plugin: Plugin,
    pub ip4: Ipv4Addr,
    pub ip6: Ipv6Addr,
    pub pods4: &'static str,
    pub pods6: &'static str,
    /// The pods' MTU (the overlay's headers taken off 1500).
    pub mtu: u32,
    ipam_dir: PathBuf,
}

impl Node {
    /// The network config a container runtime hands the plugin on stdin.
    pub fn network_config(&self) -> String {
        let ipam = serde_json::json!({
            "type": "host-local",
            "dataDir": self.ipam_dir,
            "ranges": [[{"subnet": self.pods4}], [{"subnet": self.pods6}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        });
        let mut c = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "kxdp-lab",
            "type": self.plugin.binary(),
            "ipMasq": true,
            "mtu": self.mtu,
            "ipam": ipam,
        });
        if self.plugin == Plugin::Bridge {
            c["bridge"] = "cni0".into();
            c["isGateway"] = true.into();
        }
        c.to_string()
    }

    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.ip6.into()
        } else {
            self.ip4.into()
        }
    }
}

/// A pod: its namespace, the CNI result, its servers.
pub struct Pod {
    pub name: String,
    /// Index into `Lab::nodes`.
    pub node: usize,
    pub ns: String,
    pub container_id: String,
    pub ip4: Ipv4Addr,
    pub ip6: Ipv6Addr,
    /// The pod's interface on the node (`veth...`).
    pub host_if: String,
    pub labels: Vec<(String, String)>,
    /// Being deleted: its endpoints are listed `terminating` (serving, not ready), as the
    /// EndpointSlice controller lists a pod between its deletion and its end.
    pub terminating: bool,
    /// The ADD result (stdout of the plugin), handed back as `prevResult` on DEL.
    pub result: serde_json::Value,
    servers: Option<Servers>,
}

impl Pod {
    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            self.ip6.into()
        } else {
            self.ip4.into()
        }
    }
}

pub struct Lab {
    pub sw: String,
    pub ext: String,
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    namespaces: Vec<String>,
    lab_id: String,
    pub dir: tempfile::TempDir,
    ext_servers: Option<Servers>,
    pub underlay: Underlay,
    /// The tun underlay's relays, one per node.
    relays: Vec<std::process::Child>,
    _serial: MutexGuard<'static, ()>,
}

/// Whether the lab can run: root and the CNI plugins are required (a failure, not a skip: CI
/// installs them, see .ci/run).
pub fn require(test: &str) {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "{test}: the CNI lab needs root (network namespaces)"
    );
    for p in ["ptp", "bridge", "host-local"] {
        assert!(
            Path::new(CNI_PATH).join(p).exists(),
            "{test}: {CNI_PATH}/{p} missing: apt-get install containernetworking-plugins"
        );
    }
    assert!(
        Command::new("iptables").arg("--version").output().is_ok(),
        "{test}: iptables missing (the plugins' ipMasq runs it): apt-get install iptables"
    );
}

fn sysctl(ns: &str, kv: &[&str]) {
    let mut a = vec!["netns", "exec", ns, "sysctl", "-qw"];
    a.extend(kv);
    run("ip", &a);
}

impl Lab {
    /// Builds the nodes' network, both nodes and the external host (no pods yet).
    pub fn build(test: &str) -> Lab {
        Lab::build_over(test, Underlay::Routes)
    }

    /// [`Lab::build`] with the nodes' pod ranges joined by `underlay`.
    pub fn build_over(test: &str, underlay: Underlay) -> Lab {
        require(test);
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        remove_orphans(PREFIX);
        let lab_id = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut lab = Lab {
            sw: String::new(),
            ext: String::new(),
            nodes: Vec::new(),
            pods: Vec::new(),
            namespaces: Vec::new(),
            lab_id,
            dir: tempfile::tempdir().expect("tempdir"),
            ext_servers: None,
            underlay,
            relays: Vec::new(),
            _serial: serial,
        };
        lab.sw = lab.netns("sw");
        ip(&lab.sw, "link add br0 type bridge");
        ip(&lab.sw, "link set br0 up");
        let specs = [
            ("node-a", Plugin::Ptp, 1u8, "10.77.1.0/24", "fd00:77:1::/64"),
            (
                "node-b",
                Plugin::Bridge,
                2,
                "10.77.2.0/24",
                "fd00:77:2::/64",
            ),
        ];
        for (name, plugin, n, pods4, pods6) in specs {
            let ns = lab.netns(name);
            // Forwarding on (the plugins set it too), no DAD: addresses usable at once.
            sysctl(
                &ns,
                &[
                    "net.ipv4.ip_forward=1",
                    "net.ipv6.conf.all.forwarding=1",
                    "net.ipv6.conf.all.accept_dad=0",
                    "net.ipv6.conf.default.accept_dad=0",
                ],
            );
            let port = format!("{}0", &name[5..]);
            lab.uplink(&ns, &port);
            let ip4 = Ipv4Addr::new(192, 168, 77, n);
            let ip6 = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, n as u16);
            ip(&ns, &format!("addr add {ip4}/24 dev eth0"));
            ip(&ns, &format!("addr add {ip6}/64 dev eth0 nodad"));
            let ipam_dir = lab.dir.path().join(format!("ipam-{name}"));
            lab.nodes.push(Node {
                name,
                ns,
                plugin,
                ip4,
                ip6,
                pods4,
                pods6,
                mtu: match underlay {
                    Underlay::Routes => 1500,
                    // IPv6 VXLAN takes 70 bytes: the dual-stack pods get the smaller MTU
                    // (a larger one black-holes big segments of Service traffic: the
                    // kernel's Packet Too Big would quote the translated packet).
                    Underlay::FlannelVxlan => 1430,
                    Underlay::CalicoVxlan => 1450,
                    Underlay::Tun => 1400,
                },
                ipam_dir,
            });
        }
        // Each node reaches the other's pods (over the underlay); the ip-masq-agent-like
        // exclusion.
        for i in 0..2 {
            lab.join_pod_ranges(i);
            let me = &lab.nodes[i];
            for (cmd, cidr) in [("iptables", CLUSTER4), ("ip6tables", CLUSTER6)] {
                run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &me.ns,
                        cmd,
                        "-t",
                        "nat",
                        "-I",
                        "POSTROUTING",
                        "-s",
                        cidr,
                        "-d",
                        cidr,
                        "-j",
                        "RETURN",
                    ],
                );
            }
        }
        lab.ext = lab.netns("ext");
        sysctl(&lab.ext, &["net.ipv6.conf.default.accept_dad=0"]);
        let ext = lab.ext.clone();
        lab.uplink(&ext, "x0");
        ip(&ext, &format!("addr add {EXT4}/24 dev eth0"));
        ip(&ext, &format!("addr add {EXT6}/64 dev eth0 nodad"));
        lab
    }

    /// Node `i`'s route to the other node's pods, as `self.underlay` builds it.
    fn join_pod_ranges(&mut self, i: usize) {
        let (me, other) = (&self.nodes[i], &self.nodes[1 - i]);
        // The subnet's first address (`.0` / `::`) and one near its end, per node.
        let base4 = |n: &Node, last: u8| {
            let a: Ipv4Addr = n.pods4.split('/').next().unwrap().parse().unwrap();
            let o = a.octets();
            Ipv4Addr::new(o[0], o[1], o[2], last)
        };
        let base6 = |n: &Node| n.pods6.split('/').next().unwrap().to_string();
        let mac = |n: &Node, dev: u8| format!("02:6b:00:00:{dev:02x}:{:02x}", n.ip4.octets()[3]);
        let ns = me.ns.clone();
        match self.underlay {
            Underlay::Routes => {
                ip(&ns, &format!("route add {} via {}", other.pods4, other.ip4));
                ip(
                    &ns,
                    &format!("-6 route add {} via {}", other.pods6, other.ip6),
                );
            }
            Underlay::FlannelVxlan | Underlay::CalicoVxlan => {
                let flannel = self.underlay == Underlay::FlannelVxlan;
                let (dev, vni, port, last) = if flannel {
                    ("flannel.1", 1, 8472, 0)
                } else {
                    ("vxlan.calico", 4096, 4789, 250)
                };
                let v4 = Vxlan {
                    dev,
                    vni,
                    port,
                    mtu: 1450,
                    local: me.ip4.into(),
                    mac: mac(me, 4),
                    addr: format!("{}/32", base4(me, last)),
                    remote_pods: other.pods4,
                    remote_hop: base4(other, last).to_string(),
                    remote_mac: mac(other, 4),
                    remote: other.ip4.into(),
                };
                v4.build(&ns);
                if flannel {
                    Vxlan {
                        dev: "flannel-v6.1",
                        mtu: 1430,
                        local: me.ip6.into(),
                        mac: mac(me, 6),
                        addr: format!("{}/128", base6(me)),
                        remote_pods: other.pods6,
                        remote_hop: base6(other),
                        remote_mac: mac(other, 6),
                        remote: other.ip6.into(),
                        ..v4
                    }
                    .build(&ns);
                } else {
                    // Calico's VXLAN mode carries IPv6 on vxlan-v6.calico; the lab keeps its
                    // IPv6 pod ranges routed over eth0.
                    ip(
                        &ns,
                        &format!("-6 route add {} via {}", other.pods6, other.ip6),
                    );
                }
            }
            Underlay::Tun => {
                let child = Command::new("ip")
                    .args(["netns", "exec", &ns, "python3", "-c", TUN_RELAY])
                    .args([TUN_DEVICE, &me.ip4.to_string(), &other.ip4.to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("the tun relay starts");
                let mut child = child;
                let mut ready = String::new();
                BufReader::new(child.stdout.as_mut().unwrap())
                    .read_line(&mut ready)
                    .expect("the tun relay says it is ready");
                assert_eq!(ready.trim(), "ready", "tun relay");
                self.relays.push(child);
                let dev = TUN_DEVICE;
                ip(&ns, &format!("link set {dev} mtu 1400 up"));
                ip(&ns, &format!("addr add {}/32 dev {dev}", base4(me, 253)));
                ip(&ns, &format!("route add {} dev {dev}", other.pods4));
                ip(&ns, &format!("-6 route add {} dev {dev}", other.pods6));
            }
        }
    }

    /// Creates a namespace (loopback up) and returns its name.
    pub fn netns(&mut self, name: &str) -> String {
        let full = format!("{}-{name}", self.lab_id);
        run("ip", &["netns", "add", &full]);
        self.namespaces.push(full.clone());
        ip(&full, "link set lo up");
        full
    }

    /// `eth0` in `ns`, its peer `port` a port of the nodes' bridge.
    fn uplink(&self, ns: &str, port: &str) {
        ip(
            &self.sw,
            &format!("link add {port} type veth peer name eth0 netns {ns}"),
        );
        ip(&self.sw, &format!("link set {port} master br0 up"));
        ip(ns, "link set eth0 up");
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).expect("node")
    }

    fn node_index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .expect("node")
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    pub fn pods_on(&self, node: &str) -> Vec<&Pod> {
        let i = self.node_index(node);
        self.pods.iter().filter(|p| p.node == i).collect()
    }

    /// Creates pod `name` on `node` as a container runtime does (namespace, then CNI ADD in the
    /// node's namespace), starts its servers and lets the node and the pod learn each other's
    /// MAC addresses.
    pub fn add_pod(&mut self, node: &str, name: &str, labels: &[(&str, &str)]) -> &Pod {
        let ni = self.node_index(node);
        let ns = self.netns(&format!("p-{name}"));
        sysctl(
            &ns,
            &[
                "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0",
            ],
        );
        let container_id = format!("{}-{name}", self.lab_id);
        let n = &self.nodes[ni];
        let out = cni(n, "ADD", &container_id, &ns, &n.network_config());
        let result: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("CNI ADD result of {name}: {e}: {out}"));
        let mut ip4 = None;
        let mut ip6 = None;
        for a in result["ips"].as_array().expect("ips") {
            let addr = a["address"].as_str().expect("address");
            match addr.split('/').next().unwrap().parse::<IpAddr>().unwrap() {
                IpAddr::V4(v) => ip4 = Some(v),
                IpAddr::V6(v) => ip6 = Some(v),
            }
        }
        let host_if = result["interfaces"]
            .as_array()
            .expect("interfaces")
            .iter()
            .filter(|i| i.get("sandbox").is_none())
            .filter_map(|i| i["name"].as_str())
            .find(|n| n.starts_with("veth"))
            .expect("the pod's host-side veth in the CNI result")
            .to_string();
        let servers = Servers::start(&ns, name);
        let pod = Pod {
            name: name.to_string(),
            node: ni,
            ns,
            container_id,
            ip4: ip4.expect("an IPv4 address"),
            ip6: ip6.expect("an IPv6 address"),
            host_if,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            result,
            servers: Some(servers),
            terminating: false,
        };
        warm(&n.ns, &[pod.ip4.into(), pod.ip6.into()]);
        warm(&pod.ns, &[gateway(&pod, false), gateway(&pod, true)]);
        self.pods.push(pod);
        self.pods.last().unwrap()
    }

    /// Deletes a pod as a container runtime does: its processes stop, CNI DEL in the node's
    /// namespace (with the ADD result as `prevResult`), then the namespace goes. Checks that DEL
    /// removed the pod's interface, masquerade rules and address reservation.
    pub fn delete_pod(&mut self, name: &str) {
        let i = self.pods.iter().position(|p| p.name == name).expect("pod");
        let mut pod = self.pods.remove(i);
        drop(pod.servers.take());
        let n = &self.nodes[pod.node];
        let mut conf: serde_json::Value = serde_json::from_str(&n.network_config()).unwrap();
        conf["prevResult"] = pod.result.clone();
        cni(n, "DEL", &pod.container_id, &pod.ns, &conf.to_string());
        let links = ip(&n.ns, "-br link");
        assert!(
            !links.contains(&format!("{}@", pod.host_if)),
            "CNI DEL left {} behind: {links}",
            pod.host_if
        );
        let nat = run(
            "ip",
            &["netns", "exec", &n.ns, "iptables-save", "-t", "nat"],
        );
        assert!(
            !nat.contains(&format!("id: \\\"{}\\\"", pod.container_id)),
            "CNI DEL left masquerade rules: {nat}"
        );
        let reserved = n.ipam_dir.join("kxdp-lab").join(pod.ip4.to_string());
        assert!(!reserved.exists(), "host-local kept {}", pod.ip4);
        self.namespaces.retain(|ns| *ns != pod.ns);
        delete_netns(&pod.ns);
    }

    /// Starts the pods' servers in the external host too (for egress tests).
    pub fn ext_servers(&mut self) {
        if self.ext_servers.is_none() {
            self.ext_servers = Some(Servers::start(&self.ext, "ext"));
        }
    }

    /// The two-node layout most tests use: web-a1 (app=web-a), client-a (app=client) and
    /// front-a (app=client, role=frontend) on node-a; web-b1 and web-b2 (app=web) and client-b
    /// (app=client) on node-b; neighbours warmed.
    pub fn two_node_pods(test: &str) -> Lab {
        let mut lab = Lab::build(test);
        lab.add_pod("node-a", "web-a1", &[("app", "web-a")]);
        lab.add_pod("node-a", "client-a", &[("app", "client")]);
        lab.add_pod(
            "node-a",
            "front-a",
            &[("app", "client"), ("role", "frontend")],
        );
        lab.add_pod("node-b", "web-b1", &[("app", "web")]);
        lab.add_pod("node-b", "web-b2", &[("app", "web")]);
        lab.add_pod("node-b", "client-b", &[("app", "client")]);
        lab.warm_neighbours();
        lab
    }

    /// Lets nodes, the external host and pods learn each other's MAC addresses (one datagram
    /// each way) so that the first packets of a test are not spent on neighbour resolution.
    pub fn warm_neighbours(&self) {
        let a = &self.nodes[0];
        let b = &self.nodes[1];
        warm(
            &a.ns,
            &[b.ip4.into(), b.ip6.into(), EXT4.into(), EXT6.into()],
        );
        warm(
            &b.ns,
            &[a.ip4.into(), a.ip6.into(), EXT4.into(), EXT6.into()],
        );
        warm(
            &self.ext,
            &[a.ip4.into(), a.ip6.into(), b.ip4.into(), b.ip6.into()],
        );
        for p in &self.pods {
            warm(&self.nodes[p.node].ns, &[p.ip4.into(), p.ip6.into()]);
            warm(&p.ns, &[gateway(p, false), gateway(p, true)]);
        }
    }

    /// kxdp's configuration for `node` as a DaemonSet has it: the uplink and every pod's veth
    /// by pattern (`veth*`: pods created later are attached as their interfaces appear) and, on
    /// the bridge node, `cni0`.
    pub fn kxdp_config(&self, node: &str, with_bridge: bool) -> String {
        let n = self.node(node);
        let mut ifs = vec!["eth0".to_string(), "veth*".to_string()];
        if n.plugin == Plugin::Bridge && with_bridge {
            ifs.push("cni0".into());
        }
        self.kxdp_config_with(node, &ifs)
    }

    pub fn kxdp_config_with(&self, node: &str, interfaces: &[String]) -> String {
        let n = self.node(node);
        let overlay = if self.underlay == Underlay::Tun {
            format!("hostPath: {{overlayInterfaces: [{TUN_DEVICE}]}}\n")
        } else {
            String::new()
        };
        format!(
            "apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: {}
nodeIPs: [{}, \"{}\"]
clusterCIDRs: [{CLUSTER4}, \"{CLUSTER6}\"]
serviceCIDRs: [{SERVICE4}, \"{SERVICE6}\"]
healthzBindAddress: \"\"
metricsBindAddress: \"\"
interfaces: [{}]
workers: {{count: 1, cpus: []}}
conntrack: {{stateFile: \"\"}}
{overlay}",
            n.name,
            n.ip4,
            n.ip6,
            interfaces
                .iter()
                .map(|i| format!("\"{i}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// Nodes, the namespace and every pod as Kubernetes objects (for `--state`).
    pub fn cluster_objects(&self) -> String {
        let mut s = String::new();
        for n in &self.nodes {
            s += &format!(
                "apiVersion: v1
kind: Node
metadata: {{name: {0}, labels: {{kubernetes.io/hostname: {0}}}}}
spec: {{podCIDRs: [{1}, \"{2}\"]}}
status:
  addresses:
  - {{type: InternalIP, address: {3}}}
  - {{type: InternalIP, address: \"{4}\"}}
  - {{type: Hostname, address: {0}}}
---
",
                n.name, n.pods4, n.pods6, n.ip4, n.ip6
            );
        }
        s += "apiVersion: v1\nkind: Namespace\nmetadata: {name: lab}\n---\n";
        for p in &self.pods {
            let n = &self.nodes[p.node];
            let labels = p
                .labels
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ");
            s += &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {0}, namespace: lab, labels: {{{1}}}}}
spec: {{nodeName: {2}, containers: [{{name: c, image: lab/server}}]}}
status:
  phase: Running
  hostIP: {3}
  podIP: {4}
  podIPs: [{{ip: {4}}}, {{ip: \"{5}\"}}]
  conditions: [{{type: Ready, status: \"True\"}}]
---
",
                p.name, labels, n.name, n.ip4, p.ip4, p.ip6
            );
        }
        s
    }

    /// A dual-stack Service `name` (ClusterIPs 172.30.0.N and fd00:30::N) on port 80 (TCP, to
    /// 8080) and 53 (UDP, to 5353) selecting `app: SELECTOR`, with NodePorts `node_port` (TCP)
    /// and `node_port + 1000` (UDP) when given, and one EndpointSlice per family listing the
    /// selected pods.
    pub fn service(
        &self,
        name: &str,
        n: u8,
        selector: &str,
        node_port: Option<u16>,
        local: bool,
    ) -> String {
        let kind = if node_port.is_some() {
            "NodePort"
        } else {
            "ClusterIP"
        };
        let (np_tcp, np_udp) = match node_port {
            Some(p) => (
                format!(", nodePort: {p}"),
                format!(", nodePort: {}", p + 1000),
            ),
            None => (String::new(), String::new()),
        };
        let policy = if local {
            "  externalTrafficPolicy: Local\n"
        } else {
            ""
        };
        let mut s = format!(
            "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: lab}}
spec:
  type: {kind}
{policy}  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 172.30.0.{n}
  clusterIPs: [172.30.0.{n}, \"fd00:30::{n:x}\"]
  selector: {{app: {selector}}}
  ports:
  - {{name: tcp, port: 80, targetPort: {TCP_PORT}, protocol: TCP{np_tcp}}}
  - {{name: udp, port: 53, targetPort: {UDP_PORT}, protocol: UDP{np_udp}}}
---
"
        );
        let selected: Vec<&Pod> = self
            .pods
            .iter()
            .filter(|p| p.labels.iter().any(|(k, v)| k == "app" && v == selector))
            .collect();
        for (family, v6) in [("IPv4", false), ("IPv6", true)] {
            let eps = selected
                .iter()
                .map(|p| {
                    let conditions = if p.terminating {
                        "{ready: false, serving: true, terminating: true}"
                    } else {
                        "{ready: true}"
                    };
                    format!(
                        "- {{addresses: [\"{}\"], conditions: {conditions}, nodeName: {}}}\n",
                        p.ip(v6),
                        self.nodes[p.node].name
                    )
                })
                .collect::<String>();
            s += &format!(
                "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-{}
  namespace: lab
  labels: {{kubernetes.io/service-name: {name}}}
addressType: {family}
ports:
- {{name: tcp, port: {TCP_PORT}, protocol: TCP}}
- {{name: udp, port: {UDP_PORT}, protocol: UDP}}
endpoints:{}
---
",
                family.to_lowercase(),
                if eps.is_empty() {
                    " []\n".to_string()
                } else {
                    format!("\n{eps}")
                }
            );
        }
        s
    }

    /// Writes the config of `node` and the cluster state (`objects` appended to the nodes and
    /// pods) and starts `kxdp run` in the node's namespace.
    pub fn start_kxdp(&self, node: &str, config: &str, objects: &str) -> KxdpNode {
        self.start_kxdp_bin(node, config, objects, &Kxdp::bin())
    }

    /// [`Lab::start_kxdp`] with the binary at `bin`.
    pub fn start_kxdp_bin(&self, node: &str, config: &str, objects: &str, bin: &str) -> KxdpNode {
        let (config_path, state) = self.kxdp_files(node, config, objects);
        let k = Kxdp::start_bin(
            &self.node(node).ns,
            config_path.to_str().unwrap(),
            state.to_str().unwrap(),
            bin,
            &[],
        );
        KxdpNode { kxdp: k, state }
    }

    /// [`Lab::start_kxdp`] listening on the takeover socket `socket`: started again with the
    /// same socket while one runs, the new one takes the running one's dataplane over.
    pub fn start_kxdp_takeover(
        &self,
        node: &str,
        config: &str,
        objects: &str,
        socket: &Path,
    ) -> KxdpNode {
        let (config_path, state) = self.kxdp_files(node, config, objects);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node(node).ns, &Kxdp::bin(), "run"])
            .arg("--config")
            .arg(&config_path)
            .arg("--state")
            .arg(&state)
            .arg("--no-admin")
            .arg("--takeover-socket")
            .arg(socket);
        let k = Kxdp::spawn(cmd, Duration::from_secs(20));
        KxdpNode { kxdp: k, state }
    }

    /// Writes the config of `node` and the cluster state (`objects` appended to the nodes and
    /// pods): the config file's path and the state directory.
    fn kxdp_files(&self, node: &str, config: &str, objects: &str) -> (PathBuf, PathBuf) {
        let dir = self.dir.path().join(format!("kxdp-{node}"));
        let state = dir.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config).unwrap();
        std::fs::write(state.join("cluster.yaml"), self.cluster_objects() + objects).unwrap();
        (config_path, state)
    }

    /// Rewrites a running kxdp's cluster state (the state directory is watched).
    pub fn update_state(&self, k: &KxdpNode, objects: &str) {
        let tmp = k.state.join(".cluster.yaml.tmp");
        std::fs::write(&tmp, self.cluster_objects() + objects).unwrap();
        std::fs::rename(&tmp, k.state.join("cluster.yaml")).unwrap();
    }

    /// [`Lab::update_state`], then waits (bounded) until kxdp has published tables from it.
    /// For a change that alters the tables: a test that acts on the change (deleting a pod
    /// whose endpoint it removed) must not race the file watch and the sync, which take longer
    /// on a busy machine than any fixed sleep allows for.
    pub fn update_state_published(&self, k: &KxdpNode, objects: &str) {
        let before = k.published();
        self.update_state(k, objects);
        assert!(
            crate::lab::wait_until(Duration::from_secs(30), || k.published() > before),
            "kxdp did not publish the new state within 30 s:\n{}",
            k.log()
        );
    }
}

/// A running `kxdp run` of one node and its state directory.
pub struct KxdpNode {
    pub kxdp: Kxdp,
    pub state: PathBuf,
}

impl KxdpNode {
    pub fn log(&self) -> String {
        self.kxdp.stderr.lock().unwrap().clone()
    }

    /// Syncs so far that published changed Services or rebuilt everything (the sync's debug
    /// line, which `Kxdp::spawn` enables).
    pub fn published(&self) -> usize {
        self.kxdp
            .stderr
            .lock()
            .unwrap()
            .lines()
            .filter(|l| {
                l.contains("kxdp_control::sync: published") && !l.contains("full=false services=0")
            })
            .count()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in &mut self.pods {
            drop(p.servers.take());
        }
        drop(self.ext_servers.take());
        for r in &mut self.relays {
            let _ = r.kill();
            let _ = r.wait();
        }
        for ns in self.namespaces.drain(..).rev() {
            delete_netns(&ns);
        }
    }
}

/// One VXLAN device as flannel and Calico build theirs: no learning, the node's own address
/// on it, the other node's pod range through the other node's tunnel address (`onlink`), with
/// a static neighbour entry and an FDB entry to the other node's address.
struct Vxlan {
    dev: &'static str,
    vni: u32,
    port: u16,
    mtu: u32,
    local: IpAddr,
    mac: String,
    /// The node's tunnel address with its prefix length.
    addr: String,
    remote_pods: &'static str,
    remote_hop: String,
    remote_mac: String,
    remote: IpAddr,
}

impl Vxlan {
    fn build(&self, ns: &str) {
        let (dev, fam) = (self.dev, if self.local.is_ipv6() { "-6" } else { "-4" });
        ip(
            ns,
            &format!(
                "link add {dev} type vxlan id {} local {} dev eth0 dstport {} nolearning",
                self.vni, self.local, self.port
            ),
        );
        ip(ns, &format!("link set {dev} address {}", self.mac));
        ip(ns, &format!("link set {dev} mtu {} up", self.mtu));
        ip(ns, &format!("{fam} addr add {} dev {dev} nodad", self.addr));
        let (pods, hop) = (self.remote_pods, &self.remote_hop);
        ip(
            ns,
            &format!("{fam} route add {pods} via {hop} dev {dev} onlink"),
        );
        ip(
            ns,
            &format!(
                "{fam} neigh add {hop} lladdr {} dev {dev} nud permanent",
                self.remote_mac
            ),
        );
        let remote = self.remote.to_string();
        let fdb = [
            "bridge",
            "fdb",
            "append",
            &self.remote_mac,
            "dev",
            dev,
            "dst",
            &remote,
        ];
        run("ip", &[&["netns", "exec", ns][..], &fdb[..]].concat());
    }
}

/// A userspace tunnel over UDP between two nodes (argv: device, local address, peer address):
/// opens the tun device (no packet information header), prints `ready`, then relays every
/// packet the kernel routes into the device to the peer's relay and every datagram from the
/// peer into the device. Ends with its process (the lab kills it).
const TUN_RELAY: &str = r#"
import fcntl, os, select, socket, struct, sys
dev, local, peer = sys.argv[1], sys.argv[2], sys.argv[3]
TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
tun = os.open("/dev/net/tun", os.O_RDWR)
fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((local, 8999))
print("ready", flush=True)
while True:
    r, _, _ = select.select([tun, sock], [], [])
    if tun in r:
        sock.sendto(os.read(tun, 65535), (peer, 8999))
    if sock in r:
        data, _ = sock.recvfrom(65535)
        os.write(tun, data)
"#;

/// The pod's next hop (the gateway of its CNI result).
fn gateway(p: &Pod, v6: bool) -> IpAddr {
    p.result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["gateway"].as_str())
        .filter_map(|g| g.parse::<IpAddr>().ok())
        .find(|g| g.is_ipv6() == v6)
        .expect("gateway in the CNI result")
}

/// Runs a CNI plugin as a container runtime does: in the node's namespace, command and pod in
/// the environment, the network config on stdin. Bounded to 30 s.
fn cni(node: &Node, command: &str, container_id: &str, pod_ns: &str, config: &str) -> String {
    let plugin = format!("{CNI_PATH}/{}", node.plugin.binary());
    let mut child = Command::new("ip")
        .args(["netns", "exec", &node.ns, &plugin])
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_NETNS", format!("/var/run/netns/{pod_ns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", CNI_PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{plugin}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.as_bytes())
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            child.stdout.take().unwrap().read_to_string(&mut out).ok();
            child.stderr.take().unwrap().read_to_string(&mut err).ok();
            assert!(
                st.success(),
                "CNI {command} {} for {container_id} failed ({st}): {out}{err}",
                node.plugin.binary()
            );
            return out;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("CNI {command} for {container_id} took more than 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `f` on a new thread inside `ns` and returns its result.
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    crate::lab::Lab::in_ns(ns, f)
}

/// One datagram from `ns` to each target (discard port): neighbours resolved both ways.
pub fn warm(ns: &str, targets: &[IpAddr]) {
    let targets = targets.to_vec();
    in_ns(ns, move || {
        for t in targets {
            let bind: SocketAddr = if t.is_ipv6() {
                "[::]:0".parse().unwrap()
            } else {
                "0.0.0.0:0".parse().unwrap()
            };
            if let Ok(s) = UdpSocket::bind(bind) {
                let _ = s.send_to(b"warm", SocketAddr::new(t, 9));
            }
        }
    });
    std::thread::sleep(Duration::from_millis(50));
}

/// What a server answered: which pod (or host) and the client address it saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub server: String,
    pub peer: IpAddr,
}

fn parse_answer(line: &str) -> io::Result<Answer> {
    let mut w = line.split_whitespace();
    let server = w.next().unwrap_or_default().to_string();
    let peer = w
        .next()
        .and_then(|p| p.parse::<IpAddr>().ok())
        .ok_or_else(|| io::Error::new(ErrorKind::InvalidData, format!("answer {line:?}")))?;
    Ok(Answer { server, peer })
}

use std::io;

/// One TCP request from `ns` to `to`: connect (bounded by `timeout`), read the server's line,
/// send `send` bytes, check the server counted them all.
pub fn tcp(ns: &str, to: SocketAddr, timeout: Duration, send: usize) -> io::Result<Answer> {
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&to, timeout)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.set_write_timeout(Some(Duration::from_secs(5)))?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut line = String::new();
        r.read_line(&mut line)?;
        let answer = parse_answer(&line)?;
        let chunk = vec![0x5au8; 16 * 1024];
        let mut left = send;
        while left > 0 {
            let n = left.min(chunk.len());
            s.write_all(&chunk[..n])?;
            left -= n;
        }
        s.shutdown(Shutdown::Write)?;
        let mut count = String::new();
        r.read_line(&mut count)?;
        let got: usize = count
            .trim()
            .parse()
            .map_err(|_| io::Error::new(ErrorKind::InvalidData, format!("byte count {count:?}")))?;
        if got != send {
            return Err(io::Error::new(
                ErrorKind::InvalidData,
                format!("sent {send} bytes, the server counted {got}"),
            ));
        }
        Ok(answer)
    })
}

/// One UDP exchange from `ns` over a connected socket (a reply from any other source, an
/// un-NATed one, is not delivered): up to 3 tries of `timeout` each.
pub fn udp(ns: &str, to: SocketAddr, timeout: Duration) -> io::Result<Answer> {
    in_ns(ns, move || {
        let bind: SocketAddr = if to.is_ipv6() {
            "[::]:0".parse().unwrap()
        } else {
            "0.0.0.0:0".parse().unwrap()
        };
        let s = UdpSocket::bind(bind)?;
        s.connect(to)?;
        s.set_read_timeout(Some(timeout))?;
        let mut buf = [0u8; 512];
        for _ in 0..3 {
            s.send(b"hello")?;
            match s.recv(&mut buf) {
                Ok(n) => return parse_answer(&String::from_utf8_lossy(&buf[..n])),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
        Err(ErrorKind::TimedOut.into())
    })
}

/// Whether kxdp intercepts `dev` in `ns`, either way: its XDP program, or its tc redirect
/// into the tap (`podInterception: tap`, the default for the pods' veths).
pub fn intercepted(ns: &str, dev: &str) -> bool {
    crate::lab::xdp_on(ns, dev).is_some()
        || crate::lab::sh(ns, &format!("tc filter show dev {dev} ingress")).contains("kxdp-tap")
}

pub fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// A pod's servers (see the module docs). Stopped on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Servers {
    pub fn start(ns: &str, name: &str) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        // [::] with IPV6_V6ONLY off (Linux's default): IPv4 and IPv6 on one socket.
        let who = name.to_string();
        threads.push(spawn_greet_and_count_server(
            format!("/var/run/netns/{ns}"),
            "[::]:8080".to_string(),
            move |peer| format!("{who} {}", peer.ip().to_canonical()),
            10,
            stop.clone(),
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        let (path, who, st) = (
            format!("/var/run/netns/{ns}"),
            name.to_string(),
            stop.clone(),
        );
        threads.push(std::thread::spawn(move || {
            kxdp_kernel::enter_netns(&path).expect("setns");
            let s = UdpSocket::bind("[::]:5353").expect("bind UDP 5353");
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            tx.send(()).unwrap();
            let mut buf = [0u8; 2048];
            while !st.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = s.recv_from(&mut buf) {
                    let ip = peer.ip().to_canonical();
                    let _ = s.send_to(format!("{who} {ip}").as_bytes(), peer);
                }
            }
        }));
        rx.recv_timeout(Duration::from_secs(5))
            .expect("UDP server up");
        Servers { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One request of a [`Load`]: where it went and what came back.
pub type Outcome = (SocketAddr, Result<Answer, String>);

/// Requests that keep flowing from a client pod to a changing set of targets while pods come
/// and go: each request picks the next target of the current set; every outcome is recorded.
pub struct Load {
    pub targets: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Outcome>>>,
    in_flight: Arc<Mutex<Option<SocketAddr>>>,
}

impl Load {
    pub fn start(ns: &str, targets: Vec<SocketAddr>) -> Load {
        let targets = Arc::new(Mutex::new(targets));
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(Mutex::new(None));
        let (t, st, fl, ns) = (
            targets.clone(),
            stop.clone(),
            in_flight.clone(),
            ns.to_string(),
        );
        let thread = std::thread::spawn(move || {
            let mut log = Vec::new();
            let mut i = 0usize;
            while !st.load(Ordering::Relaxed) {
                let to = {
                    let t = t.lock().unwrap();
                    if t.is_empty() {
                        None
                    } else {
                        i = i.wrapping_add(1);
                        let to = t[i % t.len()];
                        *fl.lock().unwrap() = Some(to);
                        Some(to)
                    }
                };
                let Some(to) = to else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let r = tcp(&ns, to, Duration::from_secs(3), 1000).map_err(|e| e.to_string());
                *fl.lock().unwrap() = None;
                log.push((to, r));
            }
            log
        });
        Load {
            targets,
            stop,
            thread: Some(thread),
            in_flight,
        }
    }

    /// Takes `to` out of the set and waits (bounded) until no request to it is in flight.
    pub fn retire(&self, to: SocketAddr) {
        self.targets.lock().unwrap().retain(|t| *t != to);
        let end = Instant::now() + Duration::from_secs(10);
        while *self.in_flight.lock().unwrap() == Some(to) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn add(&self, to: SocketAddr) {
        self.targets.lock().unwrap().push(to);
    }

    pub fn finish(mut self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The sum of the metric lines that start with `prefix` of the kxdp in `ns` (metrics on
/// 127.0.0.1:10249).
pub fn metric(ns: &str, prefix: &str) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-s",
            "--max-time",
            "5",
            "http://127.0.0.1:10249/metrics",
        ])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}
