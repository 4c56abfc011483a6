//! What the pipeline decided for each packet: one action, one named reason, and the addresses
//! before and after. Every drop has exactly one reason; the reasons are counted in one place
//! (`Counters`).

use kxdp_packet::{Addr, Family, IpProto};

/// What happens to the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Action {
    /// Sent on by the dataplane, rewritten or not.
    #[default]
    Forward = 0,
    Drop = 1,
    /// The dataplane answered in the packet's place (TCP RST or ICMP/ICMPv6 port unreachable).
    Reject = 2,
    /// Handed to the node's own stack unchanged.
    Pass = 3,
}

impl Action {
    pub const COUNT: usize = 4;
    pub const ALL: [Action; 4] = [Action::Forward, Action::Drop, Action::Reject, Action::Pass];

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Forward => "forward",
            Action::Drop => "drop",
            Action::Reject => "reject",
            Action::Pass => "pass",
        }
    }
}

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal => $action:ident, )*) => {
        /// Why. Stable kebab-case codes: they appear in verdict files, metrics and the CLI.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        #[repr(u8)]
        pub enum Reason {
            #[default]
            $( $(#[$doc])* $variant, )*
        }

        impl Reason {
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),*];
            pub const COUNT: usize = Reason::ALL.len();

            pub fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => $code,)* }
            }

            /// The action a packet with this reason gets.
            pub fn action(self) -> Action {
                match self { $(Reason::$variant => Action::$action,)* }
            }

            pub fn from_code(s: &str) -> Option<Reason> {
                match s { $($code => Some(Reason::$variant),)* _ => None }
            }
        }
    };
}

reasons! {
    /// A new connection to a Service, destination-NATed to the chosen endpoint.
    ServiceDnat = "service-dnat" => Forward,
    /// A packet of a tracked connection in its original direction, translated as the connection is.
    Established = "ct-established" => Forward,
    /// A reply of a tracked connection, translated back.
    ReplyUnnat = "reply-unnat" => Forward,
    /// An ICMP/ICMPv6 error about a tracked connection, translated with it (quoted header too).
    IcmpRelated = "icmp-related" => Forward,
    /// Not addressed to a Service and not the node's own: forwarded unchanged.
    Direct = "direct" => Forward,
    /// Addressed to this node (not a NodePort): the node's stack handles it.
    ToNode = "to-node" => Pass,
    /// Not IPv4/IPv6 (ARP, LLDP, ...): the node's stack handles it.
    NotIp = "not-ip" => Pass,
    /// Could not be parsed: truncated, inconsistent lengths, bad header fields.
    Malformed = "malformed" => Drop,
    /// The Service has no usable endpoint at all.
    NoEndpoints = "no-endpoints" => Reject,
    /// The Service has endpoints, but none on this node under a Local traffic policy.
    NoLocalEndpoints = "no-local-endpoints" => Drop,
    /// A ClusterIP on a port or protocol its Service does not define.
    ServicePortUnknown = "service-port-unknown" => Reject,
    /// A later fragment to a Service address whose first fragment was not seen (yet, or recently).
    FragmentNoState = "fragment-no-state" => Drop,
    /// An ICMP error to a Service address that quotes no tracked connection.
    IcmpErrorUntracked = "icmp-error-untracked" => Drop,
    /// A TCP packet other than a SYN for a Service with no connection (or state that forbids it).
    CtInvalid = "ct-invalid" => Drop,
    /// A TCP packet of a connection whose state is gone (no entry, not a SYN, not a RST) to a
    /// Service frontend with endpoints: answered with a RST from the frontend, so that the client
    /// ends the connection at once instead of retransmitting into a void (after a start without
    /// the previous process's state, a flush, a failover).
    CtLost = "ct-lost" => Reject,
    /// A TCP packet from the client of a connection whose endpoint has left its Service for good
    /// (removed from the EndpointSlices; a terminating endpoint keeps its connections): answered
    /// with a RST from the frontend and the connection removed, so that a client whose backend
    /// vanished without closing ends it at once instead of retransmitting until its timeout.
    BackendGone = "backend-gone" => Reject,
    /// An address inside a service CIDR that no Service owns.
    ServiceIpUnallocated = "service-ip-unallocated" => Drop,
    /// A LoadBalancer IP reached from outside loadBalancerSourceRanges.
    SourceRange = "source-range" => Drop,
    /// The conntrack table is full even after dropping unassured entries.
    ConntrackFull = "conntrack-full" => Drop,
    /// No source port gives the connection a unique reply tuple (every candidate collides).
    SnatExhausted = "snat-exhausted" => Drop,
    /// Masquerade needed but this node has no address of the packet's family.
    NoNodeAddress = "no-node-address" => Drop,
    /// A new connection into a local pod that its ingress NetworkPolicies do not allow.
    PolicyDeniedIngress = "policy-denied-ingress" => Drop,
    /// A new connection out of a local pod that its egress NetworkPolicies do not allow.
    PolicyDeniedEgress = "policy-denied-egress" => Drop,
    /// Arrived on a pod-facing interface with a source address the node does not route back
    /// through that interface (strict reverse path, `crate::antispoof`): a pod using another's
    /// address. Checked before conntrack, so such a packet touches no connection.
    SpoofedSource = "spoofed-source" => Drop,
    /// A frame on kxdp's tap without an interface tag: no intercepted interface handed it over;
    /// the node's own stack sent it out of the tap (its IPv6 multicast listener reports when
    /// the tap comes up). It belongs to no pod.
    TapUntagged = "tap-untagged" => Drop,
    // The egress stage (`crate::egress`), after the pipeline: where the packet leaves.
    /// No route to the destination (main table).
    NoRoute = "no-route" => Drop,
    /// The route's next hop has no usable neighbour entry (or, behind a bridge, no port yet);
    /// the kernel is asked to resolve it.
    NoNeighbour = "no-neighbour" => Drop,
    /// The route leaves through an interface kxdp has no socket on.
    NoEgress = "no-egress" => Drop,
    /// A forwarded packet's TTL / hop limit ran out here (dropped, as a router does).
    TtlExpired = "ttl-expired" => Drop,
    /// The egress socket's TX ring had no room.
    TxRingFull = "tx-ring-full" => Drop,
    /// For the node's stack (a `pass`, or a destination that is a node address), but no kernel
    /// port is configured to hand it over.
    NoKernelPort = "no-kernel-port" => Drop,
}

/// The outcome for one packet. Plain data, written by the pipeline into a caller-provided slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    pub action: Action,
    pub reason: Reason,
    /// False for packets that were not parsed as IP (not-ip, malformed): the address fields are unset.
    pub has_addrs: bool,
    pub family: Family,
    pub proto: IpProto,
    /// As the packet came in.
    pub orig_src: Addr,
    pub orig_sport: u16,
    pub orig_dst: Addr,
    pub orig_dport: u16,
    /// As the packet leaves (for `Reject`: the generated reply's addresses).
    pub src: Addr,
    pub sport: u16,
    pub dst: Addr,
    pub dport: u16,
    /// The connection is masqueraded (source NAT to a node address).
    pub masq: bool,
    /// Stable id of the Service port involved (`ServicePortInfo::id`); 0 when none.
    pub service_id: u32,
    /// The original source of the connection the packet belongs to (its client): the packet's
    /// own source unless it is a reply or an ICMP error travelling toward the client.
    pub client: Addr,
    /// Where the pipeline found the IP header, the transport header (0: none) and how long the
    /// IP packet is: the egress stage works from these instead of parsing again.
    pub l3_off: u16,
    pub l4_off: u16,
    pub ip_len: u16,
    /// An IP fragment (its transport checksum covers the whole datagram).
    pub fragment: bool,
    /// The interface the egress stage sends the packet on (0: not sent, or no egress stage ran).
    pub egress: u32,
}

impl Verdict {
    #[inline]
    pub fn set(&mut self, reason: Reason) {
        self.reason = reason;
        self.action = reason.action();
    }
}
