//! Faults of the node's links that must not take `kxdp run` down or leave it wrong, on the lab
//! (tests/lab/mod.rs): a storm of 250 pod interfaces created at once (more link events than the
//! netlink socket's buffer holds: kxdp re-reads the links and attaches every one), and the
//! uplink's carrier flapping while traffic flows.

mod lab;

use std::time::{Duration, Instant};

use lab::{ip, lab_files, wait_until, xdp_on, Cluster, Kxdp, Servers};

const STORM: usize = 250;

/// The lab's configuration with `extra` interface patterns added.
fn config_with(dir: &std::path::Path, extra: &str) -> String {
    let (config, _) = lab_files();
    let text = std::fs::read_to_string(config).unwrap().replace(
        "interfaces: [up0, vpod1, vpod2, vpod3]",
        &format!("interfaces: [up0, vpod1, vpod2, vpod3{extra}]"),
    );
    assert!(
        text.contains("vpod3,"),
        "the lab config's interfaces line changed"
    );
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// One UDP request over a new socket, each try waiting 500 ms (`lab::udp_ask`).
fn udp_ask(ns: &str, to: &str, tries: usize) -> std::io::Result<String> {
    lab::udp_ask(ns, to, tries, Duration::from_millis(500))
}

/// The storm's links (`stN`) that carry an XDP program, from one `ip -d -o link show`.
fn storm_links_with_xdp(ns: &str) -> std::collections::BTreeSet<String> {
    ip(ns, "-d -o link show")
        .lines()
        .filter_map(|l| {
            let name = l.split(": ").nth(1)?.split('@').next()?;
            let xdp = l.contains("prog/xdp") || l.contains(" xdp");
            (name.starts_with("st") && xdp).then(|| name.to_string())
        })
        .collect()
}

fn alive(k: &mut Kxdp) -> bool {
    matches!(k.child.try_wait(), Ok(None))
}

/// `ip -batch` in `ns`: one process for many link changes, so that their events arrive at once.
fn ip_batch(ns: &str, cmds: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cmds.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "ip -batch failed");
}

#[test]
fn a_storm_of_interfaces_is_attached_and_released() {
    if !lab::available("a_storm_of_interfaces_is_attached_and_released") {
        return;
    }
    let mut c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let peer = c.lab.netns("storm");
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), ", \"st*\"");
    let (_, state) = lab_files();
    let mut kxdp = Kxdp::start(&c.node, &config, &state);
    let client = c.pod("client-1").to_string();
    assert!(
        udp_ask(&client, "172.30.0.10:53", 3).is_ok(),
        "before the storm"
    );

    let mut add = String::new();
    for i in 0..STORM {
        add.push_str(&format!(
            "link add st{i} type veth peer name ps{i} netns {peer}\n"
        ));
    }
    for i in 0..STORM {
        add.push_str(&format!("link set st{i} up\n"));
    }
    let started = Instant::now();
    ip_batch(&c.node, &add);
    let attached = wait_until(Duration::from_secs(120), || {
        storm_links_with_xdp(&c.node).len() == STORM
    });
    let with = storm_links_with_xdp(&c.node);
    let missing: Vec<usize> = (0..STORM)
        .filter(|i| !with.contains(&format!("st{i}")))
        .collect();
    assert!(
        attached,
        "{} of {STORM} interfaces without kxdp's program after 120 s (e.g. {:?}):\n{}",
        missing.len(),
        &missing[..missing.len().min(10)],
        kxdp.stderr.lock().unwrap()
    );
    eprintln!(
        "{STORM} interfaces attached {:?} after they were created",
        started.elapsed()
    );
    assert!(alive(&mut kxdp), "kxdp exited during the storm");
    assert!(
        udp_ask(&client, "172.30.0.10:53", 3).is_ok(),
        "the ClusterIP still answers after the storm"
    );

    let mut del = String::new();
    for i in 0..STORM {
        del.push_str(&format!("link del st{i}\n"));
    }
    ip_batch(&c.node, &del);
    // Every link released (its log line, frames reclaimed), and forwarding goes on.
    let released = wait_until(Duration::from_secs(60), || {
        let log = kxdp.stderr.lock().unwrap();
        log.lines()
            .filter(|l| l.contains("kxdp: st") && l.contains("is gone:"))
            .count()
            >= STORM
    });
    assert!(alive(&mut kxdp), "kxdp exited while the interfaces went");
    assert!(
        released,
        "not every interface released:\n{}",
        kxdp.stderr.lock().unwrap()
    );
    assert!(
        udp_ask(&client, "172.30.0.10:53", 3).is_ok(),
        "after the storm"
    );
    let log = kxdp.stderr.lock().unwrap().clone();
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("FRAME ACCOUNTING OFF"), "{log}");
}

/// The uplink's carrier flapping (the external host's end of the link going down and up, as a
/// cable or a switch port would) while NodePort traffic from outside and ClusterIP traffic
/// from a pod flow: kxdp stays up, keeps its program and sockets on the link, and every new
/// connection is answered once the link stays up (the neighbours the kernel flushed with the
/// carrier are resolved again).
#[test]
fn a_flapping_uplink_under_traffic() {
    if !lab::available("a_flapping_uplink_under_traffic") {
        return;
    }
    let c = Cluster::build();
    let _servers = [
        Servers::start(c.pod("web-1"), "10.1.0.11"),
        Servers::start(c.pod("web-2"), "10.1.0.12"),
    ];
    let (config, state) = lab_files();
    let mut kxdp = Kxdp::start(&c.node, &config, &state);
    let client = c.pod("client-1").to_string();
    let nodeport = format!("{}:30053", lab::NODE_IP);
    assert!(
        udp_ask(&client, "172.30.0.10:53", 3).is_ok(),
        "ClusterIP before"
    );
    assert!(udp_ask(&c.ext, &nodeport, 3).is_ok(), "NodePort before");

    // Traffic all along: a new connection every 20 ms from the pod and from outside.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = [
        (client.clone(), "172.30.0.10:53".to_string()),
        (c.ext.clone(), nodeport.clone()),
    ]
    .into_iter()
    .map(|(ns, to)| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = udp_ask(&ns, &to, 1);
                sent += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            sent
        })
    })
    .collect();
    for _ in 0..10 {
        ip(&c.ext, "link set eth0 down");
        std::thread::sleep(Duration::from_millis(200));
        ip(&c.ext, "link set eth0 up");
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        assert!(l.join().unwrap() > 0);
    }
    assert!(alive(&mut kxdp), "kxdp exited while the uplink flapped");
    assert!(xdp_on(&c.node, "up0").is_some(), "up0 lost kxdp's program");

    for (ns, to) in [(&client, "172.30.0.10:53"), (&c.ext, nodeport.as_str())] {
        for i in 0..20 {
            if let Err(e) = udp_ask(ns, to, 3) {
                panic!(
                    "{to} from {ns}, request {i} after the flapping: {e}\nneighbours: {}\n{}",
                    ip(&c.node, "neigh show"),
                    kxdp.stderr.lock().unwrap()
                );
            }
        }
    }
    let log = kxdp.stderr.lock().unwrap().clone();
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("FRAME ACCOUNTING OFF"), "{log}");
}
