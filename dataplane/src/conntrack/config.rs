//! Conntrack limits and timeouts (KubeProxyConfiguration's `conntrack` section, plus the short TCP
//! timeouts kube-proxy leaves to the kernel, with the kernel's defaults).

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtConfig {
    /// Entries (connections) the table holds at most; beyond it unassured entries are dropped early,
    /// then new connections are refused (`conntrack-full`).
    pub max_entries: u32,
    pub tcp_established: Duration,
    pub tcp_close_wait: Duration,
    /// SYN_SENT / SYN_RECV (kernel: 120 s / 60 s).
    pub tcp_syn_sent: Duration,
    pub tcp_syn_recv: Duration,
    /// FIN_WAIT / LAST_ACK / TIME_WAIT (kernel: 120 s / 30 s / 120 s).
    pub tcp_fin_wait: Duration,
    pub tcp_last_ack: Duration,
    pub tcp_time_wait: Duration,
    /// After an RST (kernel: 10 s).
    pub tcp_close: Duration,
    /// UDP seen in one direction only.
    pub udp: Duration,
    /// UDP seen in both directions (assured).
    pub udp_stream: Duration,
    /// ICMP echo (kernel: 30 s).
    pub icmp: Duration,
    /// SCTP: established associations and the short handshake/shutdown states.
    pub sctp_established: Duration,
    pub sctp_short: Duration,
}

impl Default for CtConfig {
    fn default() -> Self {
        CtConfig {
            max_entries: 1 << 20,
            tcp_established: Duration::from_secs(24 * 3600),
            tcp_close_wait: Duration::from_secs(3600),
            tcp_syn_sent: Duration::from_secs(120),
            tcp_syn_recv: Duration::from_secs(60),
            tcp_fin_wait: Duration::from_secs(120),
            tcp_last_ack: Duration::from_secs(30),
            tcp_time_wait: Duration::from_secs(120),
            tcp_close: Duration::from_secs(10),
            udp: Duration::from_secs(30),
            udp_stream: Duration::from_secs(120),
            icmp: Duration::from_secs(30),
            sctp_established: Duration::from_secs(5 * 24 * 3600),
            sctp_short: Duration::from_secs(3),
        }
    }
}
