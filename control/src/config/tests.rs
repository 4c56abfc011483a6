//! The config's tests: parsing, ranges, wording of errors, overrides, machine checks.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use kxdp_dataplane::conntrack::CtConfig;

use super::{duration::*, errors::*, limits::*, load::*, machine::*, schema::*};

const HEADER: &str = "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\n";

fn load(body: &str) -> Result<Config, ConfigError> {
    Config::from_yaml_str(&format!("{HEADER}{body}"), Path::new("config.yaml"))
}

fn load_err(body: &str) -> String {
    load(body).unwrap_err().to_string()
}

#[test]
fn load_balancing_section() {
    let c = load("").unwrap();
    assert_eq!(c.load_balancing.algorithm, LbAlgorithm::Random);
    assert_eq!(c.load_balancing.maglev_table_size, 16381);
    let c = load("loadBalancing: {algorithm: maglev, maglevTableSize: 65521, maglevSeed: 7}\n")
        .unwrap();
    assert_eq!(c.load_balancing.algorithm, LbAlgorithm::Maglev);
    assert_eq!(c.load_balancing.maglev_seed, "7");
    let c = load("loadBalancing: {maglevSeed: prod-eu}\n").unwrap();
    assert_eq!(c.load_balancing.maglev_seed, "prod-eu");
    assert_eq!(
            load_err("loadBalancing:\n  maglevTableSize: 16384\n"),
            "config.yaml:4: loadBalancing.maglevTableSize: 16384 is not a prime (Maglev needs a prime table size), e.g. 16381"
        );
    assert_eq!(
        load_err("loadBalancing: {maglevTableSize: 13}\n"),
        "config.yaml:3: loadBalancing.maglevTableSize: 13 is too small: at least 251 (a prime)"
    );
    assert!(load_err("loadBalancing: {algorithm: ring}\n").contains("loadBalancing.algorithm"));
    assert!(
        load_err("loadBalancing: {maglevSeed: [1]}\n").contains("must be a string or an integer")
    );
}

#[test]
fn host_path_section() {
    let c = load("").unwrap();
    assert!(c.host_path.enabled);
    assert_eq!(c.host_path.node_port_range, PortRange(30000, 32767));
    let c = load("hostPath: {enabled: false, nodePortRange: 20000-20100}\n").unwrap();
    assert!(!c.host_path.enabled);
    assert_eq!(c.host_path.node_port_range, PortRange(20000, 20100));
    for bad in ["32767-30000", "0-10", "30000", "30000-70000", "a-b"] {
        let e = load_err(&format!("hostPath: {{nodePortRange: \"{bad}\"}}\n"));
        assert!(
            e.contains("hostPath.nodePortRange") && e.contains(bad),
            "{e}"
        );
    }
    assert!(load_err("hostPath: {on: true}\n").contains("hostPath"));
    assert_eq!(c.host_path.overlay_interfaces, DEFAULT_OVERLAY_INTERFACES);
    let c = load("hostPath: {overlayInterfaces: [wg0, tun-lab]}\n").unwrap();
    assert_eq!(c.host_path.overlay_interfaces, ["wg0", "tun-lab"]);
    for bad in ["\"flannel*\"", "\"\"", "a-name-longer-than-15"] {
        let e = load_err(&format!("hostPath: {{overlayInterfaces: [ok0, {bad}]}}\n"));
        assert!(e.contains("hostPath.overlayInterfaces[1]"), "{e}");
    }
}

#[test]
fn interfaces_matching_a_bridge_and_its_ports_are_refused() {
    let link = |ifindex, name: &str, master, bridge| kxdp_dataplane::fib::Link {
        ifindex,
        name: name.into(),
        mac: Some([2; 6]),
        master,
        bridge,
        veth: false,
        peer: None,
        rx_queues: 1,
    };
    let links = vec![
        link(2, "eth0", None, false),
        link(3, "cni0", None, true),
        link(4, "veth1234abcd", Some(3), false),
    ];
    let cfg = |ifs: &str| load(&format!("interfaces: {ifs}\n")).unwrap();
    let f = Path::new("config.yaml");
    let e = cfg("[eth0, \"veth*\", cni0]")
        .check_interfaces(&links, f)
        .unwrap_err();
    assert_eq!(e.field, "interfaces[2]");
    assert!(e.message.contains("veth1234abcd"), "{}", e.message);
    assert!(e.message.contains("[eth0, \"veth*\"]"), "{}", e.message);
    // No port yet: a pattern that could match one is refused too; `*` matches both.
    let e = cfg("[eth0, \"veth*\", cni0]")
        .check_interfaces(&links[..2], f)
        .unwrap_err();
    assert!(e.message.contains("created later"), "{}", e.message);
    assert_eq!(
        cfg("[\"*\"]")
            .check_interfaces(&links, f)
            .unwrap_err()
            .field,
        "interfaces[0]"
    );
    // The ports only, or the bridge only: fine.
    cfg("[eth0, \"veth*\"]")
        .check_interfaces(&links, f)
        .unwrap();
    cfg("[eth0, cni0]").check_interfaces(&links, f).unwrap();
    cfg("[]").check_interfaces(&links, f).unwrap();
}

#[test]
fn pod_interception() {
    let c = load("").unwrap();
    assert_eq!(c.pod_interception, PodInterceptionConfig::default());
    // The pods' veths go through the tap unless XDP is asked for.
    assert_eq!(c.pod_interception.mode, InterceptionMode::Tap);
    let c = load("podInterception: {mode: xdp}\n").unwrap();
    assert!(c.pod_interception.run_options().is_none());
    // Source validation stays strict with the tap: its redirects tag each interface.
    let c = load("interfaces: [eth0, \"veth*\"]\n").unwrap();
    assert_eq!(c.source_validation, SourceValidation::Strict);
    let t = c.pod_interception.run_options().expect("tap");
    assert_eq!(t.interfaces, ["veth*"]);
    assert_eq!(t.device, "kxdptap0");
    assert_eq!(t.queue_length, 256);
    // Every veth too (a container's uplink), unless asked otherwise.
    assert!(t.every_veth);
    let c = load("podInterception: {everyVeth: false}\n").unwrap();
    assert!(!c.pod_interception.run_options().unwrap().every_veth);
    let c = load("podInterception: {interfaces: []}\n").unwrap();
    assert!(c
        .pod_interception
        .run_options()
        .unwrap()
        .interfaces
        .is_empty());
    let c = load("podInterception: {mode: tap, queueLength: 1000}\n").unwrap();
    assert_eq!(c.pod_interception.run_options().unwrap().queue_length, 1000);
    let c =
        load("podInterception: {mode: tap, interfaces: [\"lxc*\"], tapDevice: pods0}\n").unwrap();
    assert_eq!(c.pod_interception.run_options().unwrap().device, "pods0");
    for (bad, field) in [
        ("podInterception: {mode: bpf}\n", "podInterception.mode"),
        ("podInterception: tap\n", "podInterception"),
        (
            "podInterception: {mode: tap, interfaces: [], everyVeth: false}\n",
            "podInterception.interfaces",
        ),
        (
            "podInterception: {interfaces: [\"a b\"]}\n",
            "podInterception.interfaces[0]",
        ),
        (
            "podInterception: {tapDevice: \"a/b\"}\n",
            "podInterception.tapDevice",
        ),
        (
            "podInterception: {tapDevice: pods0, queues: 2}\n",
            "podInterception",
        ),
        (
            "podInterception: {queueLength: 8}\n",
            "podInterception.queueLength: 8 is too small: at least 32",
        ),
    ] {
        let e = load_err(bad);
        assert!(e.contains(field), "{bad:?}: {e}");
    }
    // kxdp's own tap is never one of its interfaces, whatever `interfaces` matches.
    let c = load("interfaces: [\"*\"]\n").unwrap();
    assert_eq!(c.pod_interception.run_options().unwrap().device, "kxdptap0");
}

#[test]
fn xdp_mode_and_idle_back_off() {
    let c = load("").unwrap();
    assert_eq!(c.xdp_mode, XdpMode::Auto);
    assert_eq!(c.workers.idle, IdleConfig::default());
    let c = load("xdpMode: generic\nworkers: {count: 2, idle: {spinPolls: 10, maxSleep: 50us}}\n")
        .unwrap();
    assert_eq!(c.xdp_mode, XdpMode::Generic);
    assert_eq!(c.workers.idle.spin_polls, 10);
    assert_eq!(c.workers.idle.max_sleep.0, Duration::from_micros(50));
    assert!(load_err("xdpMode: turbo\n").contains("xdpMode"));
    assert_eq!(c.source_validation, SourceValidation::Strict);
    let off = load("sourceValidation: off\n").unwrap();
    assert_eq!(off.source_validation, SourceValidation::Off);
    assert!(load_err("sourceValidation: loose\n").contains("sourceValidation"));
    assert!(load_err("workers: {idle: {spin: 1}}\n").contains("workers.idle"));
}

#[test]
fn defaults() {
    let c = load("").unwrap();
    assert_eq!(c.node_name, "");
    assert!(c.node_ips.is_empty() && c.cluster_cidrs.is_empty() && c.service_cidrs.is_empty());
    assert!(c.node_port_addresses.is_empty());
    assert!(!c.masquerade_all && !c.localhost_node_ports);
    assert!(c.feature_enabled("PreferSameTrafficDistribution"));
    assert_eq!(c.conntrack, ConntrackConfig::default());
    assert_eq!(c.ct_config(), CtConfig::default());
    assert_eq!(c.conntrack.max_entries, 1_048_576);
    assert_eq!(
        c.conntrack.tcp_established_timeout.0,
        Duration::from_secs(86400)
    );
    assert_eq!(
        c.conntrack.tcp_close_wait_timeout.0,
        Duration::from_secs(3600)
    );
    assert_eq!(c.conntrack.udp_timeout.0, Duration::from_secs(30));
    assert_eq!(c.conntrack.udp_stream_timeout.0, Duration::from_secs(120));
    assert_eq!(c.sync.min_sync_period.0, Duration::from_secs(1));
    assert_eq!(c.sync.sync_period.0, Duration::from_secs(30));
    assert_eq!(
        c.healthz_bind_address,
        Some("0.0.0.0:10256".parse().unwrap())
    );
    assert_eq!(
        c.metrics_bind_address,
        Some("127.0.0.1:10249".parse().unwrap())
    );
    assert!(c.interfaces.is_empty());
    assert_eq!(
        c.workers,
        WorkersConfig {
            count: 1,
            cpus: vec![],
            idle: IdleConfig::default(),
        }
    );
}

#[test]
fn every_field() {
    let c = load(
            r#"
nodeName: node-a
nodeIPs: [192.168.0.2, "fd00:1::2"]
clusterCIDRs: [10.0.0.0/8, "fd00::/48"]
serviceCIDRs: [172.30.0.0/16, "fd00:30::/108"]
nodePortAddresses: [192.168.0.0/24]
masqueradeAll: true
localhostNodePorts: false
featureGates: {PreferSameTrafficDistribution: false}
conntrack: {maxEntries: 1000, tcpEstablishedTimeout: 1h0m0s, tcpCloseWaitTimeout: 30m, udpTimeout: 10s, udpStreamTimeout: 2m30s}
sync: {minSyncPeriod: 500ms, syncPeriod: 1m}
healthzBindAddress: 127.0.0.1:1
metricsBindAddress: ""
interfaces: [eth0, eth1]
workers: {count: 2, cpus: [0, 1]}
"#,
        )
        .unwrap();
    assert_eq!(c.node_name, "node-a");
    assert_eq!(
        c.node_ips,
        vec![
            "192.168.0.2".parse::<IpAddr>().unwrap(),
            "fd00:1::2".parse().unwrap()
        ]
    );
    assert_eq!(c.cluster_cidrs.len(), 2);
    assert_eq!(
        c.service_cidrs[1],
        "fd00:30::/108".parse::<IpNet>().unwrap()
    );
    assert_eq!(
        c.node_port_addresses,
        vec![NodePortAddress::Cidr("192.168.0.0/24".parse().unwrap())]
    );
    assert!(c.masquerade_all);
    assert!(!c.feature_enabled("PreferSameTrafficDistribution"));
    let ct = c.ct_config();
    assert_eq!(ct.max_entries, 1000);
    assert_eq!(ct.tcp_established, Duration::from_secs(3600));
    assert_eq!(ct.tcp_close_wait, Duration::from_secs(1800));
    assert_eq!(ct.udp, Duration::from_secs(10));
    assert_eq!(ct.udp_stream, Duration::from_secs(150));
    assert_eq!(ct.tcp_syn_sent, CtConfig::default().tcp_syn_sent);
    assert_eq!(c.sync.min_sync_period.0, Duration::from_millis(500));
    assert_eq!(c.sync.sync_period.0, Duration::from_secs(60));
    assert_eq!(c.healthz_bind_address, Some("127.0.0.1:1".parse().unwrap()));
    assert_eq!(c.metrics_bind_address, None);
    assert_eq!(c.interfaces, vec!["eth0", "eth1"]);
    assert_eq!(
        c.workers,
        WorkersConfig {
            count: 2,
            cpus: vec![0, 1],
            idle: IdleConfig::default(),
        }
    );
}

#[test]
fn zero_timeouts_keep_defaults() {
    let c = load("conntrack: {maxEntries: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}").unwrap();
    assert_eq!(c.ct_config(), CtConfig::default());
}

#[test]
fn partial_conntrack_section_keeps_other_defaults() {
    let c = load("conntrack: {udpTimeout: 5s}");
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(c.unwrap().ct_config().udp, Duration::from_secs(5));
}

#[test]
fn durations() {
    let cases: &[(&str, Option<u64>)] = &[
        ("24h", Some(86_400_000)),
        ("1h0m0s", Some(3_600_000)),
        ("1h30m", Some(5_400_000)),
        ("1.5h", Some(5_400_000)),
        ("30s", Some(30_000)),
        ("1s", Some(1000)),
        ("0s", Some(0)),
        ("0", Some(0)),
        ("300ms", Some(300)),
        ("2min", Some(120_000)),
        ("1day", Some(86_400_000)),
        ("", None),
        ("abc", None),
        ("-1s", None),
        ("10", None),
        ("1x", None),
        ("h", None),
    ];
    for &(s, want) in cases {
        let got = parse_duration(s).ok().map(|d| d.as_millis() as u64);
        assert_eq!(got, want, "{s:?}");
    }
}

#[test]
fn bad_duration_names_field() {
    let e = load_err("conntrack: {udpTimeout: forever}");
    assert!(
        e.starts_with("config.yaml:3: conntrack.udpTimeout: `forever` is not a duration"),
        "{e}"
    );
    let e = load_err("sync: {syncPeriod: 10}");
    assert!(e.contains("sync.syncPeriod"), "{e}");
}

#[test]
fn wrong_type_names_field() {
    let e = load_err("conntrack: {maxEntries: lots}");
    assert_eq!(
            e,
            "config.yaml:3: conntrack.maxEntries: got the text \"lots\", expected a whole number from 0 to 67108864"
        );
    let e = load_err("nodeIPs: [192.168.0.300]");
    assert_eq!(
            e,
            "config.yaml:3: nodeIPs[0]: `192.168.0.300` is not an IP address (expected e.g. 192.168.0.10 or fd00::10)"
        );
    let e = load_err("clusterCIDRs: [10.0.0.0/40]");
    assert_eq!(
            e,
            "config.yaml:3: clusterCIDRs[0]: `10.0.0.0/40`: the prefix length 40 is too long (an IPv4 prefix is at most /32)"
        );
    let e = load_err("serviceCIDRs: [10.0.0.0/8, 10.96.0.0/33]");
    assert!(
        e.starts_with("config.yaml:3: serviceCIDRs[1]: `10.96.0.0/33`: the prefix length 33"),
        "{e}"
    );
    let e = load_err("workers: {count: -1}");
    assert_eq!(
        e,
        "config.yaml:3: workers.count: got -1, expected a whole number from 1 to 256"
    );
    let e = load_err("healthzBindAddress: localhost");
    assert!(
        e.starts_with("config.yaml:3: healthzBindAddress: `localhost` is not an address and port"),
        "{e}"
    );
    let e = load_err("nodePortAddresses: [nope]");
    assert!(
        e.starts_with("config.yaml:3: nodePortAddresses[0]: `nope` is not a CIDR"),
        "{e}"
    );
    let e = load_err("interfaces: {eth0: 1}");
    assert!(
        e.starts_with("config.yaml:3: interfaces: got a mapping, expected a list"),
        "{e}"
    );
    for rust in ["u32", "usize", "u64", "invalid type", "IP address syntax"] {
        for body in [
            "conntrack: {maxEntries: lots}",
            "workers: {count: x}",
            "nodeIPs: [1.2.3.4/33]",
        ] {
            assert!(!load_err(body).contains(rust), "{body}: {}", load_err(body));
        }
    }
}

#[test]
fn unknown_fields_rejected_with_path() {
    let e = load_err("nodename: x");
    assert!(
            e.starts_with("config.yaml:3: nodename: unknown field `nodename` (did you mean `nodeName`? known fields here: apiVersion, kind, nodeName,"),
            "{e}"
        );
    let e = load_err("conntrack: {maxPerCore: 1}");
    assert!(
        e.starts_with("config.yaml: conntrack: unknown field `maxPerCore`")
            || e.contains("conntrack"),
        "{e}"
    );
    assert!(e.contains("maxPerCore"), "{e}");
    let e = load_err("sync: {period: 1s}");
    assert!(e.contains("sync") && e.contains("period"), "{e}");
    let e = load_err("workers: {threads: 1}");
    assert!(e.contains("workers") && e.contains("threads"), "{e}");
}

#[test]
fn header_checked() {
    let e =
        Config::from_yaml_str("kind: DataplaneConfiguration\n", Path::new("c.yaml")).unwrap_err();
    assert!(e.to_string().contains("apiVersion"), "{e}");
    let e = Config::from_yaml_str(
        "apiVersion: v1\nkind: DataplaneConfiguration\n",
        Path::new("c.yaml"),
    )
    .unwrap_err();
    assert_eq!(e.field, "apiVersion");
    let e = Config::from_yaml_str(
        "apiVersion: kxdp.dev/v1alpha1\nkind: KubeProxyConfiguration\n",
        Path::new("c.yaml"),
    )
    .unwrap_err();
    assert_eq!(e.field, "kind");
}

#[test]
fn localhost_node_ports_refused() {
    let e = load_err("localhostNodePorts: true");
    assert!(
        e.starts_with("config.yaml:3: localhostNodePorts: true is not supported"),
        "{e}"
    );
    assert!(load("localhostNodePorts: false").is_ok());
}

#[test]
fn state_file_huge_pages_needs_a_state_file() {
    let e = load_err("conntrack: {stateFile: \"\", stateFileHugePages: true}");
    assert!(
        e.starts_with(
            "config.yaml:3: conntrack.stateFileHugePages: true needs a conntrack.stateFile"
        ),
        "{e}"
    );
    let c =
        load("conntrack: {stateFile: /run/kxdp/ct/conntrack, stateFileHugePages: true}").unwrap();
    assert!(c.conntrack.state_file_huge_pages);
    // Unset: the default path, in huge pages.
    let c = load("conntrack: {stateFileHugePages: true}").unwrap();
    assert_eq!(c.conntrack.state_file(), StateFile::Default);
    assert_eq!(c.conntrack.state_file_path(), Some(DEFAULT_STATE_FILE));
}

#[test]
fn a_directory_applies_config_yaml_then_the_others_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let w = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    w(
            "config.yaml",
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nnodeName: n\nconntrack:\n  maxEntries: 4096\n  stateFile: /run/x/ct\ninterfaces: [eth0]\nworkers: {count: 2}\n",
        );
    // Before config.yaml by name, after it in effect.
    w(
        "aaa.yaml",
        "interfaces: [eth0, \"cali*\"]\nconntrack: {udpTimeout: 5s}\n",
    );
    w("zzz.yaml", "workers: {count: 1}\n");
    // Not configuration: another extension, and the ConfigMap volume's own entries.
    w("notes.txt", "interfaces: [nope]");
    std::fs::create_dir(dir.path().join("..data")).unwrap();
    w(".hidden.yaml", "interfaces: [nope]");
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.interfaces, ["eth0", "cali*"]);
    assert_eq!(c.conntrack.max_entries, 4096);
    assert_eq!(c.conntrack.state_file.as_deref(), Some("/run/x/ct"));
    assert_eq!(c.conntrack.udp_timeout.0, Duration::from_secs(5));
    assert_eq!(c.workers.count, 1);
    let files = config_dir_files(dir.path()).unwrap();
    let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap()).collect();
    assert_eq!(names, ["config.yaml", "aaa.yaml", "zzz.yaml"]);

    // An error names the file (and line) that wrote the field.
    w("zzz.yaml", "# a preset\nworkers:\n  count: 100000\n");
    let e = Config::load(dir.path()).unwrap_err();
    assert_eq!(e.file, dir.path().join("zzz.yaml"));
    assert_eq!(e.line, Some(3), "{e}");
    assert_eq!(e.field, "workers.count");
    w("zzz.yaml", "workers: [1]\n");
    let e = Config::load(dir.path()).unwrap_err();
    assert_eq!(e.file, dir.path().join("zzz.yaml"), "{e}");
    w("zzz.yaml", "- 1\n");
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(
        e.ends_with("zzz.yaml: must be a mapping of DataplaneConfiguration fields"),
        "{e}"
    );
    let empty = tempfile::tempdir().unwrap();
    let e = Config::load(empty.path()).unwrap_err().to_string();
    assert!(e.contains("no configuration in the directory"), "{e}");
}

#[test]
fn the_state_file_is_on_by_default() {
    let c = load("").unwrap();
    assert_eq!(c.conntrack.state_file(), StateFile::Default);
    assert_eq!(
        c.conntrack.state_file_path(),
        Some("/run/kxdp/ct/conntrack")
    );
    let off = load("conntrack: {stateFile: \"\"}").unwrap();
    assert_eq!(off.conntrack.state_file(), StateFile::Off);
    assert_eq!(off.conntrack.state_file_path(), None);
    let set = load("conntrack: {stateFile: /tmp/ct}").unwrap();
    assert_eq!(set.conntrack.state_file(), StateFile::Set("/tmp/ct"));
    // What is written is what /configz shows: unset stays unset.
    assert!(!c.to_yaml().contains("stateFile:"), "{}", c.to_yaml());
    assert!(off.to_yaml().contains("stateFile: ''"), "{}", off.to_yaml());
}

#[test]
fn feature_gates() {
    let e = load_err("featureGates: {NoSuchGate: true}");
    assert!(
        e.starts_with("config.yaml:3: featureGates.NoSuchGate: unknown feature gate"),
        "{e}"
    );
    let c = load("featureGates: {PreferSameTrafficDistribution: true}").unwrap();
    assert!(c.feature_enabled("PreferSameTrafficDistribution"));
    assert!(!c.feature_enabled("NoSuchGate"));
}

#[test]
fn node_port_addresses_primary() {
    let c = load("nodePortAddresses: [primary]").unwrap();
    assert_eq!(c.node_port_addresses, vec![NodePortAddress::Primary]);
    let e = load_err("nodePortAddresses: [primary, 10.0.0.0/8]");
    assert!(e.contains("nodePortAddresses"), "{e}");
}

#[test]
fn workers_count_zero_refused() {
    let e = load_err("workers: {count: 0}");
    assert!(e.contains("workers.count"), "{e}");
}

#[test]
fn json_is_yaml() {
    let c = Config::from_yaml_str(
        r#"{"apiVersion":"kxdp.dev/v1alpha1","kind":"DataplaneConfiguration","nodeName":"n"}"#,
        Path::new("c.json"),
    )
    .unwrap();
    assert_eq!(c.node_name, "n");
}

#[test]
fn missing_file() {
    let e = Config::load(Path::new("/nonexistent/kxdp.yaml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/kxdp.yaml: cannot read"),
        "{e}"
    );
}

// Values that would crash or silently break the daemon are refused in plain words.
#[test]
fn huge_conntrack_table_refused() {
    let e = load_err("conntrack:\n  maxEntries: 4294967295\n");
    assert_eq!(
            e,
            "config.yaml:4: conntrack.maxEntries: 4294967295 is too large: at most 67108864 (0: the default, 1048576)"
        );
    assert!(load("conntrack: {maxEntries: 67108864}").is_ok());
}

#[test]
fn absurd_worker_count_refused() {
    let e = load_err("workers:\n  count: 100000\n");
    assert_eq!(
        e,
        "config.yaml:4: workers.count: 100000 is too large: at most 256"
    );
    let e = load_err("workers: {count: 0}");
    assert_eq!(
        e,
        "config.yaml:3: workers.count: 0 is too small: at least 1"
    );
}

#[test]
fn overflowing_duration_refused() {
    let e = load_err("conntrack: {tcpEstablishedTimeout: 18446744073709551s}");
    assert_eq!(
            e,
            "config.yaml:3: conntrack.tcpEstablishedTimeout: `18446744073709551s` is too long: no duration may exceed a year (8760h)"
        );
    let e = load_err("conntrack: {tcpEstablishedTimeout: 99999999999999999999999h}");
    assert!(e.contains("is too long"), "{e}");
    let e = load_err("conntrack: {udpTimeout: 2000h}");
    assert_eq!(
            e,
            "config.yaml:3: conntrack.udpTimeout: 2000h0m0s is too long: at most 720h0m0s (0s: the default, 30s)"
        );
    let e = load_err("sync: {syncPeriod: 1ms}");
    assert!(
        e.contains("sync.syncPeriod: 1ms is too short: at least 10ms"),
        "{e}"
    );
    let e = load_err("workers: {idle: {maxSleep: 5s}}");
    assert!(
        e.contains("workers.idle.maxSleep: 5s is too long: at most 1s"),
        "{e}"
    );
}

#[test]
fn afxdp_ring_sizes_and_frames() {
    let c = load("").unwrap();
    let x = c.afxdp.xsk();
    let d = kxdp_kernel::afxdp::XskConfig::default();
    assert_eq!(
        (x.frames, x.rx_ring_size, x.fill_ring_size, x.tx_ring_size),
        (d.frames, d.rx_ring_size, d.fill_ring_size, d.tx_ring_size),
        "the defaults are the dataplane's"
    );
    let c = load(
            "afxdp: {frames: 16384, rxRingSize: 8192, fillRingSize: 4096, txRingSize: 512, completionRingSize: 1024}",
        )
        .unwrap();
    let x = c.afxdp.xsk();
    assert_eq!(x.frames, 16384);
    assert_eq!(
        (
            x.rx_ring_size,
            x.fill_ring_size,
            x.tx_ring_size,
            x.completion_ring_size
        ),
        (8192, 4096, 512, 1024)
    );
    assert_eq!(c.afxdp.umem_bytes(), 64 << 20);
    // Fields left out keep their defaults.
    let c = load("afxdp: {rxRingSize: 4096}").unwrap();
    assert_eq!(
        (c.afxdp.rx_ring_size, c.afxdp.fill_ring_size),
        (4096, d.fill_ring_size)
    );
    // Rings left out are never deeper than a smaller UMEM can fill.
    let c = load("afxdp: {frames: 4096}").unwrap();
    assert_eq!((c.afxdp.rx_ring_size, c.afxdp.fill_ring_size), (4096, 4096));
    let c = load("afxdp: {frames: 3000, fillRingSize: 1024}").unwrap();
    assert_eq!((c.afxdp.rx_ring_size, c.afxdp.fill_ring_size), (2048, 1024));
    let e = load_err("afxdp: {rxRingSize: 3000}");
    assert!(
            e.contains("afxdp.rxRingSize: 3000 is not a power of two (the kernel sizes rings in powers of two: 2048 or 4096)"),
            "{e}"
        );
    let e = load_err("afxdp: {fillRingSize: 16384}");
    assert!(
            e.contains("afxdp.fillRingSize: 16384 entries cannot be filled from a UMEM of 8192 frames (afxdp.frames): at most 8192"),
            "{e}"
        );
    let e = load_err("afxdp: {frames: 4096, rxRingSize: 8192, fillRingSize: 4096}");
    assert!(
        e.contains("afxdp.rxRingSize: 8192 entries cannot be filled"),
        "{e}"
    );
    let e = load_err("afxdp: {txRingSize: 32}");
    assert!(
        e.contains("afxdp.txRingSize: 32 is too small: at least 64 (a power of two)"),
        "{e}"
    );
    let e = load_err("afxdp: {frames: 100}");
    assert!(
        e.contains("afxdp.frames: 100 is too small: at least 1024"),
        "{e}"
    );
    let e = load_err("afxdp: {ringSize: 4096}");
    assert!(e.contains("afxdp.ringSize: unknown field"), "{e}");
    // The line of the field is named.
    let e = Config::from_yaml_str(
            "apiVersion: kxdp.dev/v1alpha1\nkind: DataplaneConfiguration\nafxdp:\n  frames: 8192\n  completionRingSize: 100\n",
            Path::new("config.yaml"),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("config.yaml:5: afxdp.completionRingSize: 100 is not a power of two"),
        "{e}"
    );
    // A node override replaces the section and is checked as if applied.
    let c = load(
            "nodeOverrides: [{nodeSelector: {matchLabels: {big: \"1\"}}, afxdp: {frames: 65536, rxRingSize: 16384, fillRingSize: 16384}}]",
        )
        .unwrap();
    let labels = BTreeMap::from([("big".to_string(), "1".to_string())]);
    let (n, applied) = c.for_node(&labels);
    assert_eq!(applied, [0]);
    assert_eq!((n.afxdp.frames, n.afxdp.rx_ring_size), (65536, 16384));
    assert_eq!(c.for_node(&BTreeMap::new()).0.afxdp, AfXdpConfig::default());
    let e = load_err(
        "nodeOverrides: [{nodeSelector: {matchLabels: {}}, afxdp: {fillRingSize: 16384}}]",
    );
    assert!(
        e.contains("nodeOverrides[0].afxdp.fillRingSize: 16384 entries cannot be filled"),
        "{e}"
    );
    // The memory check counts the configured UMEM.
    let c = load("afxdp: {frames: 262144}\nworkers: {count: 4}").unwrap();
    let e = c
        .check_machine(&machine(&[0], 2048), true, Path::new("config.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("4 workers need 4096 MiB of packet buffers (UMEM, 1024 MiB each)"),
        "{e}"
    );
}

#[test]
fn every_numeric_field_has_a_range() {
    let c = load("workers: {cpus: [0]}").unwrap();
    let fields: Vec<String> = c
        .numeric_values()
        .into_iter()
        .map(|(f, _)| f.split('[').next().unwrap().to_string())
        .collect();
    for (f, _, _) in RANGES {
        assert!(fields.iter().any(|x| x == f), "{f} not checked");
    }
    for f in &fields {
        assert!(range_of(f).is_some(), "{f} has no range");
    }
}

fn machine(cpus: &[usize], mem_mib: u64) -> Machine {
    Machine {
        cpus: cpus.iter().copied().collect(),
        memory_available: Some(mem_mib << 20),
    }
}

#[test]
fn cpus_that_do_not_exist_refused() {
    let c = load("workers: {count: 2, cpus: [0, 99]}").unwrap();
    let e = c
        .check_machine(&machine(&[0, 1], 4096), false, Path::new("config.yaml"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "config.yaml: workers.cpus[1]: CPU 99 does not exist on this machine (its CPUs: 0-1)"
    );
    let c = load("workers: {count: 2, cpus: [0, 1]}").unwrap();
    c.check_machine(&machine(&[0, 1], 4096), false, Path::new("c"))
        .unwrap();
    let e = load_err("workers: {cpus: [100000]}");
    assert!(e.contains("workers.cpus[0]: 100000 is too large"), "{e}");
    // This machine: CPU 0 exists, CPU 8191 almost certainly not.
    let m = Machine::probe();
    assert!(m.cpus.contains(&0), "{m:?}");
    assert!(m.memory_available.is_some_and(|b| b > 0), "{m:?}");
}

#[test]
fn memory_checked_before_allocating() {
    // Default table: ~126 MiB (about 126 bytes per connection).
    let mb = conntrack_bytes(1 << 20) >> 20;
    assert!((120..130).contains(&mb), "{mb}");
    let c = load("conntrack: {maxEntries: 67108864}").unwrap();
    let e = c
        .check_machine(&machine(&[0], 1024), false, Path::new("config.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "config.yaml: conntrack.maxEntries: a conntrack table of 67108864 entries needs "
        ) && e.ends_with("but only 1024 MiB is available on this machine"),
        "{e}"
    );
    let c = load("workers: {count: 256}\ninterfaces: [eth0]").unwrap();
    let e = c
        .check_machine(&machine(&[0], 2048), true, Path::new("config.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("config.yaml: workers.count: 256 workers need 8192 MiB of packet buffers"),
        "{e}"
    );
    // Without interfaces (replay), no UMEM is counted.
    c.check_machine(&machine(&[0], 2048), false, Path::new("c"))
        .unwrap();
}

#[test]
fn cpu_lists() {
    let s = parse_cpu_list("0-3,8,10-11\n").unwrap();
    assert_eq!(
        s.iter().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3, 8, 10, 11]
    );
    assert_eq!(format_cpu_list(&s), "0-3,8,10-11");
    assert!(parse_cpu_list("3-1").is_none());
}

#[test]
fn node_name_defaults() {
    assert_eq!(default_node_name("a", Some("b"), Some("c")), "a");
    assert_eq!(default_node_name("", Some("b"), Some("c")), "b");
    assert_eq!(default_node_name("", Some(" "), Some("Node-C\n")), "node-c");
    assert_eq!(default_node_name("", None, None), "");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.yaml");
    std::fs::write(&p, HEADER).unwrap();
    let c = Config::load(&p).unwrap();
    let want = default_node_name(
        "",
        std::env::var("NODE_NAME").ok().as_deref(),
        hostname().as_deref(),
    );
    assert!(!want.is_empty());
    assert_eq!(c.node_name, want);
}

#[test]
fn node_overrides_by_labels() {
    let c = load(
        r#"
interfaces: [eth0]
workers: {count: 2, cpus: [0, 1]}
nodeOverrides:
  - nodeSelector: {matchLabels: {node.kubernetes.io/instance-type: m5.large}}
    interfaces: [ens5]
    workers: {count: 1}
  - nodeSelector: {matchLabels: {kxdp.dev/pool: edge, kubernetes.io/os: linux}}
    xdpMode: generic
    workers: {cpus: [3]}
"#,
    )
    .unwrap();
    let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (plain, applied) = c.for_node(&labels(&[("kubernetes.io/os", "linux")]));
    assert!(applied.is_empty());
    assert_eq!(plain.interfaces, ["eth0"]);
    let (m5, applied) = c.for_node(&labels(&[("node.kubernetes.io/instance-type", "m5.large")]));
    assert_eq!(applied, [0]);
    assert_eq!(m5.interfaces, ["ens5"]);
    assert_eq!(m5.workers.count, 1);
    assert_eq!(m5.workers.cpus, [0, 1]);
    let (both, applied) = c.for_node(&labels(&[
        ("node.kubernetes.io/instance-type", "m5.large"),
        ("kxdp.dev/pool", "edge"),
        ("kubernetes.io/os", "linux"),
    ]));
    assert_eq!(applied, [0, 1]);
    assert_eq!(both.interfaces, ["ens5"]);
    assert_eq!(
        (both.workers.count, both.workers.cpus.clone()),
        (1, vec![3])
    );
    assert_eq!(both.xdp_mode, XdpMode::Generic);
    // Overrides are range-checked too, and name their entry.
    let e = load_err("nodeOverrides:\n  - nodeSelector: {}\n    workers: {count: 100000}\n");
    assert!(
        e.starts_with("config.yaml:5: nodeOverrides[0].workers.count: 100000 is too large"),
        "{e}"
    );
    let e = load_err("nodeOverrides: [{nodeSelector: {matchExpressions: []}}]");
    assert!(
        e.contains("nodeOverrides[0].nodeSelector") && e.contains("matchExpressions"),
        "{e}"
    );
}

#[test]
fn kube_proxy_configuration_recognised() {
    let e = Config::from_yaml_str(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n",
            Path::new("kube-proxy.yaml"),
        )
        .unwrap_err()
        .to_string();
    assert!(
            e.starts_with("kube-proxy.yaml:2: kind: this is kube-proxy's configuration (KubeProxyConfiguration), not kxdp's: run `kxdp config convert kube-proxy.yaml`"),
            "{e}"
        );
}

#[test]
fn round_trips_through_yaml() {
    let c = load(
            "nodeName: n\nnodePortAddresses: [primary]\nconntrack: {udpTimeout: 1.5s}\nmetricsBindAddress: \"\"\nnodeOverrides: [{nodeSelector: {matchLabels: {a: b}}, interfaces: [x]}]\n",
        )
        .unwrap();
    let back = Config::from_yaml_str(&c.to_yaml(), Path::new("back.yaml")).unwrap();
    assert_eq!(back, c);
    let d = load("").unwrap();
    assert_eq!(
        Config::from_yaml_str(&d.to_yaml(), Path::new("d")).unwrap(),
        d
    );
}

#[test]
fn go_duration_format() {
    for (d, s) in [
        (Duration::ZERO, "0s"),
        (Duration::from_secs(3600), "1h0m0s"),
        (Duration::from_secs(150), "2m30s"),
        (Duration::from_millis(1500), "1.5s"),
        (Duration::from_millis(300), "300ms"),
        (Duration::from_micros(50), "50µs"),
        (Duration::from_secs(86400), "24h0m0s"),
    ] {
        assert_eq!(format_go_duration(d), s);
        assert_eq!(parse_duration(s).unwrap(), d);
    }
}

#[test]
fn lines_of_fields() {
    let t = "a: 1\nconntrack:\n  udpTimeout: 1s\n  maxEntries: 2\nworkers: {count: 3}\n";
    assert_eq!(line_of(t, "conntrack.maxEntries"), Some(4));
    assert_eq!(line_of(t, "workers.count"), Some(5));
    assert_eq!(line_of(t, "conntrack"), Some(2));
    assert_eq!(line_of(t, "sync"), None);
}

fn range_text(l: Limit) -> String {
    match l {
        Limit::Int { min, max } => format!("{min} to {max}"),
        Limit::Time { min, max } => {
            format!("{} to {}", format_go_duration(min), format_go_duration(max))
        }
    }
}

fn leaves(v: &yaml_serde::Value, prefix: &str, out: &mut Vec<(String, yaml_serde::Value)>) {
    match v {
        yaml_serde::Value::Mapping(m) if !m.is_empty() && prefix != "featureGates" => {
            for (k, v) in m {
                let k = k.as_str().unwrap();
                let p = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &p, out);
            }
        }
        _ => out.push((prefix.to_string(), v.clone())),
    }
}

/// docs/config.md cannot drift from the struct: every field is a row, with its default as
/// the configuration prints it and its range as `validate` checks it.
#[test]
fn docs_config_md_lists_every_field() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md"))
            .unwrap();
    let row = |field: &str| -> String {
        doc.lines()
            .find(|l| l.starts_with(&format!("| `{field}` |")))
            .unwrap_or_else(|| panic!("docs/config.md has no row for `{field}`"))
            .to_string()
    };
    let defaults: yaml_serde::Value = yaml_serde::to_value(load("").unwrap()).unwrap();
    let mut fields = Vec::new();
    leaves(&defaults, "", &mut fields);
    assert!(fields.len() > 20, "{fields:?}");
    for (field, value) in &fields {
        let r = row(field);
        if matches!(field.as_str(), "apiVersion" | "kind") {
            continue;
        }
        let shown = match value {
            yaml_serde::Value::String(s) if s.is_empty() => "\"\"".to_string(),
            yaml_serde::Value::String(s) => s.clone(),
            yaml_serde::Value::Sequence(items) => {
                let items: Vec<String> = items
                    .iter()
                    .map(|v| match v {
                        yaml_serde::Value::String(s) => s.clone(),
                        v => yaml_serde::to_string(v).unwrap().trim().to_string(),
                    })
                    .collect();
                format!("[{}]", items.join(", "))
            }
            yaml_serde::Value::Mapping(_) => "{}".into(),
            v => yaml_serde::to_string(v).unwrap().trim().to_string(),
        };
        let cells: Vec<&str> = r.split(" | ").collect();
        assert_eq!(cells[2], format!("`{shown}`"), "default of {field}: {r}");
    }
    for (field, limit, note) in RANGES {
        let r = row(field);
        let cells: Vec<&str> = r.split(" | ").collect();
        let want = if note.is_empty() {
            range_text(*limit)
        } else {
            format!("{} ({note})", range_text(*limit))
        };
        assert_eq!(cells[3], want, "range of {field}: {r}");
    }
    for extra in [
        "nodeOverrides",
        "nodeOverrides[].nodeSelector.matchLabels",
        "nodeOverrides[].interfaces",
        "nodeOverrides[].xdpMode",
        "nodeOverrides[].workers",
        "nodeOverrides[].afxdp",
    ] {
        row(extra);
    }
    // Unset by default (so that a default that cannot be used is not an error), and so
    // not among the serialized defaults.
    let r = row("conntrack.stateFile");
    assert!(
        r.split(" | ").nth(2).unwrap().contains(DEFAULT_STATE_FILE),
        "{r}"
    );
    // ...and no row for a field that does not exist.
    for l in doc.lines().filter(|l| l.starts_with("| `")) {
        let f = l[3..].split('`').next().unwrap();
        assert!(
            fields.iter().any(|(x, _)| x == f)
                || f.starts_with("nodeOverrides")
                || f == "conntrack.stateFile",
            "docs/config.md documents `{f}`, which the configuration does not have"
        );
    }
}
