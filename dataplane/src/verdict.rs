//! What the pipeline decided for each packet: one action, one named reason, and the addresses
//! before and after. Every drop has exactly one reason; the reasons are counted in one place
//! (`Counters`).

use std::fmt;

use kxdp_packet::{Addr, Family};

use crate::conntrack::{packed_proto, Packed, Tuple};

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

/// Where a verdict finds the packet's client: the original source of the connection the packet
/// belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Client {
    /// The packet's own source as it came in: a packet of the original direction, or of no
    /// connection.
    #[default]
    Source,
    /// The packet's destination as it leaves: a reply travelling back to the client.
    Destination,
    /// Neither: an ICMP error about a connection, sent by a router on the way.
    Addr(Addr),
}

/// The outcome for one packet. Plain data, written by the pipeline into a caller-provided slice.
///
/// The addresses and ports are kept packed, as conntrack packs a tuple (`Tuple::pack`: each
/// address as two big-endian words, then ports, protocol and family in one word), and made into
/// `Addr`s only where they are read (`orig_src()`, `dst()`, ...): the established fast lane
/// writes the key it looked the packet up by and the words of the connection's other tuple as
/// they are, where byte-swapping them into five addresses was a fifth of its instructions
/// (session 12). The AF_XDP worker's egress reads the action, the offsets and `dst()`.
#[derive(Clone, Copy, Default)]
pub struct Verdict {
    pub action: Action,
    pub reason: Reason,
    /// False for packets that were not parsed as IP (not-ip, malformed): the addresses are unset.
    pub has_addrs: bool,
    /// The connection is masqueraded (source NAT to a node address).
    pub masq: bool,
    /// An IP fragment (its transport checksum covers the whole datagram).
    pub fragment: bool,
    /// Stable id of the Service port involved (`ServicePortInfo::id`); 0 when none.
    pub service_id: u32,
    /// Where the pipeline found the IP header, the transport header (0: none) and how long the
    /// IP packet is: the egress stage works from these instead of parsing again.
    pub l3_off: u16,
    pub l4_off: u16,
    pub ip_len: u16,
    /// The interface the egress stage sends the packet on (0: not sent, or no egress stage ran).
    pub egress: u32,
    // Written directly by the pipeline (its fast lane copies words); read elsewhere through the
    // accessors below.
    /// The packet as it came in, with its protocol and family.
    pub(crate) orig: Packed,
    /// As it leaves (for `Reject`: the generated reply's): source and destination address words
    /// as in `orig`, and the ports (source in the low 16 bits); protocol and family are `orig`'s.
    pub(crate) out_addrs: [u64; 4],
    pub(crate) out_ports: u32,
    pub(crate) client: Client,
}

impl Verdict {
    #[inline]
    pub fn set(&mut self, reason: Reason) {
        self.reason = reason;
        self.action = reason.action();
    }

    pub fn family(&self) -> Family {
        if self.orig[4] >> 40 & 1 == 1 {
            Family::V6
        } else {
            Family::V4
        }
    }

    pub fn proto(&self) -> u8 {
        packed_proto(&self.orig)
    }

    /// The packet's source as it came in.
    pub fn orig_src(&self) -> Addr {
        addr_of_words(self.orig[0], self.orig[1])
    }

    pub fn orig_sport(&self) -> u16 {
        self.orig[4] as u16
    }

    pub fn orig_dst(&self) -> Addr {
        addr_of_words(self.orig[2], self.orig[3])
    }

    pub fn orig_dport(&self) -> u16 {
        (self.orig[4] >> 16) as u16
    }

    /// The packet's source as it leaves.
    pub fn src(&self) -> Addr {
        addr_of_words(self.out_addrs[0], self.out_addrs[1])
    }

    pub fn sport(&self) -> u16 {
        self.out_ports as u16
    }

    pub fn dst(&self) -> Addr {
        addr_of_words(self.out_addrs[2], self.out_addrs[3])
    }

    pub fn dport(&self) -> u16 {
        (self.out_ports >> 16) as u16
    }

    /// The original source of the connection the packet belongs to.
    pub fn client(&self) -> Addr {
        match self.client {
            Client::Source => self.orig_src(),
            Client::Destination => self.dst(),
            Client::Addr(a) => a,
        }
    }

    /// The packet as it came in (protocol and family included).
    #[inline]
    pub fn set_orig(&mut self, t: &Tuple) {
        self.orig = t.pack();
    }

    /// `set_orig` from the tuple already packed (`Tuple::pack`).
    #[inline(always)]
    pub fn set_orig_packed(&mut self, orig: &Packed) {
        self.orig = *orig;
    }

    /// Where the packet leaves (its protocol and family are the ones it came with).
    #[inline]
    pub fn set_out(&mut self, src: Addr, sport: u16, dst: Addr, dport: u16) {
        let (s, d) = (src.as_u128(), dst.as_u128());
        self.out_addrs = [(s >> 64) as u64, s as u64, (d >> 64) as u64, d as u64];
        self.out_ports = sport as u32 | (dport as u32) << 16;
    }

    /// The packet leaves with the addresses and ports it came with.
    #[inline(always)]
    pub fn set_out_unchanged(&mut self) {
        self.out_addrs = [self.orig[0], self.orig[1], self.orig[2], self.orig[3]];
        self.out_ports = self.orig[4] as u32;
    }

    /// Where the packet leaves, as the reverse of `reply` (packed: the tuple its replies carry,
    /// conntrack's other tuple of its connection).
    #[inline(always)]
    pub fn set_out_reversing(&mut self, reply: &Packed) {
        self.out_addrs = [reply[2], reply[3], reply[0], reply[1]];
        self.out_ports = reversed_ports(reply);
    }

    #[inline]
    pub fn set_client(&mut self, client: Client) {
        self.client = client;
    }
}

/// The ports of a packed tuple reversed, as `Verdict::out_ports` keeps them (source low): the
/// ports of a packet travelling against the tuple.
#[inline(always)]
pub fn reversed_ports(p: &Packed) -> u32 {
    (p[4] >> 16 & 0xffff) as u32 | (p[4] as u32 & 0xffff) << 16
}

/// An address from the two words a packed tuple keeps it in.
#[inline(always)]
pub fn addr_of_words(high: u64, low: u64) -> Addr {
    Addr(((high as u128) << 64 | low as u128).to_be_bytes())
}

// By what the accessors say: the lane's `Client::Destination` and the full path's
// `Client::Addr` of the same address are the same verdict.
impl PartialEq for Verdict {
    fn eq(&self, o: &Verdict) -> bool {
        (
            self.action,
            self.reason,
            self.has_addrs,
            self.masq,
            self.fragment,
        ) == (o.action, o.reason, o.has_addrs, o.masq, o.fragment)
            && (
                self.service_id,
                self.l3_off,
                self.l4_off,
                self.ip_len,
                self.egress,
            ) == (o.service_id, o.l3_off, o.l4_off, o.ip_len, o.egress)
            && (self.orig, self.out_addrs, self.out_ports) == (o.orig, o.out_addrs, o.out_ports)
            && self.client() == o.client()
    }
}

impl Eq for Verdict {}

// By the addresses, not the words.
impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("action", &self.action)
            .field("reason", &self.reason)
            .field("has_addrs", &self.has_addrs)
            .field("family", &self.family())
            .field("proto", &self.proto())
            .field("orig_src", &self.orig_src())
            .field("orig_sport", &self.orig_sport())
            .field("orig_dst", &self.orig_dst())
            .field("orig_dport", &self.orig_dport())
            .field("src", &self.src())
            .field("sport", &self.sport())
            .field("dst", &self.dst())
            .field("dport", &self.dport())
            .field("masq", &self.masq)
            .field("service_id", &self.service_id)
            .field("client", &self.client())
            .field("l3_off", &self.l3_off)
            .field("l4_off", &self.l4_off)
            .field("ip_len", &self.ip_len)
            .field("fragment", &self.fragment)
            .field("egress", &self.egress)
            .finish()
    }
}
