//! The FIB from the real kernel (netlink through `kxdp_kernel::netlink`), on the shape the CNI
//! `bridge` plugin builds: pods' host-side veths enslaved to a Linux bridge that carries the pod
//! subnet's gateway address. A pod's MAC is learned by the bridge when the pod sends (here: a UDP
//! datagram to its gateway, whose ARP request the bridge learns from); the FIB then sends packets
//! for that pod straight on its host veth (the bridge port), with the bridge's MAC as source.
//! The route refresher picks up a pod that appears later (link, neighbour and FDB events).

mod lab;

use std::net::UdpSocket;
use std::time::Duration;

use kxdp_dataplane::fib::Hop;
use kxdp_packet::{Addr, Family};
use lab::{ip, wait_until, Lab};

fn a(s: &str) -> Addr {
    Addr::from_ip(s.parse().unwrap())
}

/// A pod namespace on the bridge: host veth `host_if` (a bridge port), `eth0` inside.
fn add_pod(lab: &mut Lab, node: &str, name: &str, host_if: &str, addr: &str) -> String {
    let pod = lab.netns(name);
    lab.veth(node, host_if, &pod, "eth0");
    ip(node, &format!("link set {host_if} master br0"));
    ip(&pod, &format!("addr add {addr}/24 dev eth0"));
    ip(&pod, "route add default via 10.2.0.1");
    pod
}

/// The pod says something to its gateway: the bridge learns its MAC on its port, the node its
/// neighbour entry.
fn pod_speaks(pod: &str) {
    Lab::in_ns(pod, || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            let _ = s.send_to(b"hello", "10.2.0.1:9");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

#[test]
fn bridge_pods_leave_on_their_bridge_port() {
    if !lab::available("bridge_pods_leave_on_their_bridge_port") {
        return;
    }
    let mut lab = Lab::new();
    let node = lab.netns("fib-node");
    ip(&node, "link add br0 type bridge");
    ip(&node, "addr add 10.2.0.1/24 dev br0");
    ip(&node, "link set br0 up");
    let pod1 = add_pod(&mut lab, &node, "fib-pod1", "vb1", "10.2.0.5");
    pod_speaks(&pod1);
    let pod1_mac = lab.mac(&pod1, "eth0");
    let br_mac = lab.mac(&node, "br0");

    let (fib_hop, gw_hop, vb1) = Lab::in_ns(&node, || {
        let fib = kxdp_dataplane::io::route::read().expect("netlink dump");
        let vb1 = kxdp_kernel::ifindex("vb1").unwrap();
        let br0 = kxdp_kernel::ifindex("br0").unwrap();
        assert!(fib.link(br0).is_some_and(|l| l.bridge), "br0 is a bridge");
        assert_eq!(fib.link(vb1).and_then(|l| l.master), Some(br0));
        (
            fib.lookup(&a("10.2.0.5"), Family::V4),
            fib.lookup(&a("10.2.0.1"), Family::V4),
            vb1,
        )
    });
    assert_eq!(
        fib_hop,
        Ok(Hop::Port {
            ifindex: vb1,
            dst_mac: pod1_mac,
            src_mac: br_mac
        })
    );
    assert_eq!(
        gw_hop,
        Ok(Hop::Kernel),
        "the bridge's address is the node's own"
    );

    // A pod created while the refresher runs is found through link/neighbour/FDB events.
    let routes = Lab::in_ns(&node, || {
        kxdp_dataplane::io::route::Routes::start().expect("refresher")
    });
    let pod2 = add_pod(&mut lab, &node, "fib-pod2", "vb2", "10.2.0.6");
    pod_speaks(&pod2);
    let pod2_mac = lab.mac(&pod2, "eth0");
    let vb2 = Lab::in_ns(&node, || kxdp_kernel::ifindex("vb2").unwrap());
    // A bridge without a MAC of its own takes the lowest of its ports': adding vb2 may change it.
    let br_mac = lab.mac(&node, "br0");
    let found = wait_until(Duration::from_secs(3), || {
        routes.table.load().lookup(&a("10.2.0.6"), Family::V4)
            == Ok(Hop::Port {
                ifindex: vb2,
                dst_mac: pod2_mac,
                src_mac: br_mac,
            })
    });
    assert!(
        found,
        "10.2.0.6: {:?}",
        routes.table.load().lookup(&a("10.2.0.6"), Family::V4)
    );
    drop(routes);
}
