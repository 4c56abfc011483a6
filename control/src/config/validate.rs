//! Checks across fields, and every numeric field against its range (`limits::RANGES`).

use std::time::Duration;

use super::duration::format_go_duration;
use super::errors::range_of;
use super::limits::Limit;
use super::schema::{
    check_interface_name, DataplaneConfiguration, InterceptionMode, NodePortAddress, StateFile,
    API_VERSION, FEATURE_GATES, KIND,
};

impl DataplaneConfiguration {
    /// Checks what serde cannot: the header, refused options, feature gate names, ranges.
    pub(super) fn validate(&self) -> Result<(), (String, String)> {
        if self.api_version != API_VERSION {
            return Err((
                "apiVersion".into(),
                format!("must be `{API_VERSION}`, not `{}`", self.api_version),
            ));
        }
        if self.kind != KIND {
            return Err((
                "kind".into(),
                format!("must be `{KIND}`, not `{}`", self.kind),
            ));
        }
        if self.localhost_node_ports {
            return Err((
                "localhostNodePorts".into(),
                "true is not supported: kxdp sees traffic on the wire (AF_XDP), never on loopback; set it to false".into(),
            ));
        }
        for name in self.feature_gates.keys() {
            if !FEATURE_GATES.iter().any(|(g, _)| g == name) {
                let known: Vec<&str> = FEATURE_GATES.iter().map(|(g, _)| *g).collect();
                return Err((
                    format!("featureGates.{name}"),
                    format!("unknown feature gate (known: {})", known.join(", ")),
                ));
            }
        }
        if self.nodeport_has_primary_mixed() {
            return Err((
                "nodePortAddresses".into(),
                "`primary` must be the only entry".into(),
            ));
        }
        if self.conntrack.state_file_huge_pages && self.conntrack.state_file() == StateFile::Off {
            return Err((
                "conntrack.stateFileHugePages".into(),
                "true needs a conntrack.stateFile (the huge pages are the state file's), and stateFile is \"\" (process memory); set a path there (or leave it unset for the default) or set this to false".into(),
            ));
        }
        let pods = &self.pod_interception;
        check_interface_name(&pods.tap_device)
            .map_err(|m| ("podInterception.tapDevice".into(), m))?;
        if pods.mode == InterceptionMode::Tap && pods.interfaces.is_empty() && !pods.every_veth {
            return Err((
                "podInterception.interfaces".into(),
                "mode tap with everyVeth false needs at least one interface name or pattern \
                 (e.g. [\"veth*\"])"
                    .into(),
            ));
        }
        for (i, p) in pods.interfaces.iter().enumerate() {
            if p.is_empty() || p.len() > 15 || p.chars().any(|c| c.is_whitespace() || c == '/') {
                return Err((
                    format!("podInterception.interfaces[{i}]"),
                    format!(
                        "`{p}`: an interface name or pattern has 1 to 15 bytes, no blank or `/`"
                    ),
                ));
            }
        }
        for (i, name) in self.host_path.overlay_interfaces.iter().enumerate() {
            check_interface_name(name)
                .map_err(|m| (format!("hostPath.overlayInterfaces[{i}]"), m))?;
        }
        self.check_ranges()?;
        let size = self.load_balancing.maglev_table_size;
        if !kxdp_dataplane::maglev::is_prime(size.into()) {
            let near = kxdp_dataplane::maglev::LADDER
                .iter()
                .min_by_key(|&&p| p.abs_diff(size))
                .copied()
                .unwrap_or(kxdp_dataplane::maglev::DEFAULT_TABLE_SIZE);
            return Err((
                "loadBalancing.maglevTableSize".into(),
                format!("{size} is not a prime (Maglev needs a prime table size), e.g. {near}"),
            ));
        }
        for (i, o) in self.node_overrides.iter().enumerate() {
            let mut applied = self.clone();
            applied.apply(o);
            applied
                .check_ranges()
                .map_err(|(f, m)| (format!("nodeOverrides[{i}].{f}"), m))?;
        }
        Ok(())
    }

    /// The numeric fields with their values, in `RANGES` order.
    pub(super) fn numeric_values(&self) -> Vec<(String, Numeric)> {
        let c = &self.conntrack;
        let w = &self.workers;
        let mut v = vec![
            (
                "conntrack.maxEntries".to_string(),
                Numeric::Int(c.max_entries.into()),
            ),
            (
                "conntrack.tcpEstablishedTimeout".into(),
                Numeric::Time(c.tcp_established_timeout.0),
            ),
            (
                "conntrack.tcpCloseWaitTimeout".into(),
                Numeric::Time(c.tcp_close_wait_timeout.0),
            ),
            (
                "conntrack.udpTimeout".into(),
                Numeric::Time(c.udp_timeout.0),
            ),
            (
                "conntrack.udpStreamTimeout".into(),
                Numeric::Time(c.udp_stream_timeout.0),
            ),
            (
                "sync.minSyncPeriod".into(),
                Numeric::Time(self.sync.min_sync_period.0),
            ),
            (
                "sync.syncPeriod".into(),
                Numeric::Time(self.sync.sync_period.0),
            ),
            ("workers.count".into(), Numeric::Int(w.count as u64)),
        ];
        for (i, cpu) in w.cpus.iter().enumerate() {
            v.push((format!("workers.cpus[{i}]"), Numeric::Int(*cpu as u64)));
        }
        v.push((
            "workers.idle.spinPolls".into(),
            Numeric::Int(w.idle.spin_polls.into()),
        ));
        v.push((
            "workers.idle.maxSleep".into(),
            Numeric::Time(w.idle.max_sleep.0),
        ));
        let x = &self.afxdp;
        for (f, n) in [
            ("afxdp.frames", x.frames),
            ("afxdp.rxRingSize", x.rx_ring_size),
            ("afxdp.fillRingSize", x.fill_ring_size),
            ("afxdp.txRingSize", x.tx_ring_size),
            ("afxdp.completionRingSize", x.completion_ring_size),
        ] {
            v.push((f.into(), Numeric::Int(n.into())));
        }
        v.push((
            "loadBalancing.maglevTableSize".into(),
            Numeric::Int(self.load_balancing.maglev_table_size.into()),
        ));
        v.push((
            "podInterception.queueLength".into(),
            Numeric::Int(self.pod_interception.queue_length.into()),
        ));
        v
    }

    pub(super) fn check_ranges(&self) -> Result<(), (String, String)> {
        for (field, value) in self.numeric_values() {
            let Some((limit, note)) = range_of(&field) else {
                continue;
            };
            let note = if note.is_empty() || note.starts_with("each") {
                String::new()
            } else {
                format!(" ({note})")
            };
            match (limit, value) {
                (Limit::Int { min, max }, Numeric::Int(v)) => {
                    if v > max {
                        return Err((field, format!("{v} is too large: at most {max}{note}")));
                    }
                    if v < min {
                        return Err((field, format!("{v} is too small: at least {min}{note}")));
                    }
                }
                (Limit::Time { min, max }, Numeric::Time(v)) => {
                    let show = format_go_duration;
                    if v > max {
                        return Err((
                            field,
                            format!("{} is too long: at most {}{note}", show(v), show(max)),
                        ));
                    }
                    if v < min {
                        return Err((
                            field,
                            format!("{} is too short: at least {}{note}", show(v), show(min)),
                        ));
                    }
                }
                _ => {}
            }
        }
        self.afxdp.check()
    }

    pub(super) fn nodeport_has_primary_mixed(&self) -> bool {
        self.node_port_addresses.len() > 1
            && self.node_port_addresses.contains(&NodePortAddress::Primary)
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Numeric {
    Int(u64),
    Time(Duration),
}
