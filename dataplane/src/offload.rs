//! Established pod flows handed to the kernel's fast path (`podInterception: {mode: tap}`,
//! `offload: true`; docs/afxdp.md § "Pod traffic as super-frames").
//!
//! The decision stays with the workers: a flow goes on the fast path
//! (`kxdp_kernel::offload`) only after a worker forwarded one of its packets from the tap (or
//! from an XDP port whose program hands the fast path's flows to the kernel:
//! `Port::fast_path`, an uplink beside pods on the tap) as an established connection, with conntrack saying TCP established and assured (or UDP
//! answered, from its second packet in that direction), not masqueraded, its endpoint not
//! gone; or, routed directly, with its connection's first SYN (below). The worker installs the translation its pipeline applied, bound to the interface the
//! packet came through, and the frame's direct hop if it had one (`crate::direct`); from then on
//! the kernel rewrites the flow's packets itself, whole GSO super-frames included, counts them
//! per flow, and sends them to the hop's interface or on to its own routing. A TCP connection
//! goes on in both directions with its handshake's ACK: the worker keeps what it forwarded of
//! the SYN-ACK (the reply's translation, interface and hop) until then, so a request and its
//! answer both skip the tap.
//!
//! The worker that installed a flow keeps it: every [`CHECK_EVERY`] it reads the flow's counts
//! (a load from the mapped counters, no system call), counts what the fast path moved as the
//! pipeline would have (the verdict's reason, packets and bytes, the conntrack entry's counts
//! and expiry), and takes the flow off the fast path when its connection no longer qualifies:
//! gone or expired, closing, its endpoint gone, or a monitor of every verdict attached (then
//! every packet is seen again). A connection's first SYN and a RST never take the fast path, so
//! the worker decides every connection and sees every reset; one of an installed flow takes it
//! off at once. The rest of a connection may: the kernel reports the flags it saw per flow (a
//! SYN-ACK, a FIN, a segment without FIN after one: the last ACK), and the check plays them into
//! conntrack as those segments would have moved it, in the order a connection sends them
//! (every SYN-ACK, then the handshake's ACK, then every FIN, then the ACKs after them), after
//! which a closed connection no longer qualifies and its flows come off. A SYN that reopens a
//! flow still on the fast path (a client reusing its port within a check) has the close played
//! first.
//!
//! A connection routed directly (`crate::direct`) goes on in both directions with its SYN
//! when the worker has room ([`Offloads::may_open`]: a quarter of its slots at most, and no
//! early drop in the conntrack table since the last check, so a flood neither fills the map
//! nor costs the workers system calls once the table is under pressure): its handshake's
//! SYN-ACK and ACK then skip the tap too. Such a flow stays on while its handshake is under way
//! for [`OPENING_MS`], after which only an established connection qualifies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use kxdp_kernel::offload::{DirectHop, FlowKey, FlowOffload, FlowRewrite, AFTER_FIN};
use kxdp_packet::tcp::flags::{ACK, FIN, RST, SYN};
use kxdp_packet::{Addr, Family, IpProto};

use crate::conntrack::{Conntrack, Tuple};
use crate::direct::DirectRouting;
use crate::pipeline::Counters;
use crate::verdict::{Action, Reason, Verdict};

/// How often a worker reads its offloaded flows' counts and checks their connections: the
/// longest a flow stays on the fast path after its connection stopped qualifying (its
/// endpoint left, a policy monitor attached), and the lag of the counters.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

const SYN_FIN_RST: u8 = SYN | FIN | RST;

/// How long a connection put on the fast path with its SYN may stay on it before conntrack
/// says it is established: a SYN never answered (a scan, a flood, an endpoint gone) comes off.
pub const OPENING_MS: u64 = 1_000;

/// The most connections a worker keeps put on with their SYN and not yet acknowledged by the
/// client: it looks for their handshake's ACK every millisecond ([`Offloads::play_handshakes`]),
/// so that a connection is established and assured in conntrack (not droppable early) within
/// a millisecond of its ACK, not at the next check. More, and connections wait for their ACK to
/// go on: a flood's SYNs cost no more than that.
const OPENING_MAX: usize = 256;

/// What the check plays into conntrack of the flags the fast path reported for a flow, in the
/// order a connection sends them: the reported bit, the segment played, and whether only a flow
/// put on with its SYN plays it (another saw its handshake on the tap).
const PLAYS: [(u64, u8, bool); 4] = [
    (SYN as u64, SYN | ACK, true),
    (ACK as u64, ACK, true),
    (FIN as u64, FIN | ACK, false),
    (AFTER_FIN, ACK, false),
];

/// The most SYN-ACKs a worker keeps waiting for their handshake's ACK, and for how long: an
/// ACK follows within a round trip; a SYN-ACK never acknowledged (a scan, a flood the pod
/// answers) must not grow the worker's memory.
const AWAITING_MAX: usize = 4096;
const AWAITING_MS: u64 = 1_000;

/// One offloaded flow, as its worker keeps it.
#[derive(Clone, Copy, Debug)]
struct Offloaded {
    /// The counts of its slot (`rewrite.slot`) when last read.
    seen: (u64, u64),
    /// The flow's tuple as it arrives (conntrack's key for this direction).
    tuple: Tuple,
    /// What the pipeline counted its packets as.
    reason: Reason,
    /// What the fast path does with its packets.
    rewrite: FlowRewrite,
    /// The reported flags (`FlowOffload::flags`) already played into conntrack.
    played: u64,
    /// When a flow put on with its connection's SYN went on (`None`: on once established).
    opened_ms: Option<u64>,
}

/// A flow the fast path could carry, as a worker forwarded one of its packets: what
/// [`Offloaded`] keeps but the slot, which it gets when installed.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    tuple: Tuple,
    reason: Reason,
    /// Its translation, interface and hop (`slot` not yet set).
    rewrite: FlowRewrite,
}

/// A connection's reply direction, as the worker forwarded its SYN-ACK: it goes on the fast
/// path with the handshake's ACK, the first packet after which conntrack says established.
#[derive(Clone, Copy, Debug)]
struct AwaitingAck {
    reply: Candidate,
    since_ms: u64,
}

/// A connection put on with its SYN, waiting for its handshake's ACK: its two flows' keys.
#[derive(Clone, Copy, Debug)]
struct Opening {
    orig: FlowKey,
    reply: FlowKey,
}

/// A worker's offloaded flows and its share of the fast path's counter slots.
pub struct Offloads {
    fast: Arc<FlowOffload>,
    /// Free counter slots, reused oldest first: a packet the kernel was still counting for a
    /// flow as it came off lands in a slot no flow uses yet.
    free: VecDeque<u32>,
    flows: hashbrown::HashMap<FlowKey, Offloaded, ahash::RandomState>,
    /// SYN-ACKs forwarded, by their flow's key (at most `AWAITING_MAX`, capacity reserved).
    awaiting: hashbrown::HashMap<FlowKey, AwaitingAck, ahash::RandomState>,
    next_check: Instant,
    /// The FIB the flows' direct hops were last checked against (`Fib::id`).
    hops_of: u64,
    /// The counter slots this worker owns.
    owned: usize,
    /// The conntrack table's early drops at the last check (`Offloads::may_open`).
    early_drops: u64,
    /// Connections put on with their SYN, oldest first (at most `OPENING_MAX`).
    opening: VecDeque<Opening>,
    /// When `play_handshakes` looks at them next (ms).
    next_opening_ms: u64,
    /// The flows a check takes off, with what it counted of them (kept for its capacity).
    leaving: Vec<(FlowKey, Offloaded, (u64, u64))>,
}

impl Offloads {
    /// Worker `worker` of `workers`: it owns every `workers`th counter slot from `worker`.
    pub fn new(fast: Arc<FlowOffload>, worker: usize, workers: usize) -> Offloads {
        let free: VecDeque<u32> = (0..fast.slots())
            .filter(|s| *s as usize % workers.max(1) == worker)
            .collect();
        Offloads {
            flows: hashbrown::HashMap::with_capacity_and_hasher(
                free.len(),
                ahash::RandomState::new(),
            ),
            awaiting: hashbrown::HashMap::with_capacity_and_hasher(
                AWAITING_MAX,
                ahash::RandomState::new(),
            ),
            owned: free.len(),
            free,
            fast,
            next_check: Instant::now(),
            hops_of: 0,
            early_drops: 0,
            opening: VecDeque::with_capacity(OPENING_MAX),
            next_opening_ms: 0,
            leaving: Vec::new(),
        }
    }

    /// Whether a connection may go on with its SYN: this worker uses under a quarter of its
    /// slots, waits for fewer than `OPENING_MAX` handshakes, and the conntrack table has
    /// dropped nothing early since the last check (a full table: a flood, whose SYNs would cost
    /// a map update and removal each).
    pub fn may_open(&self, ct: &Conntrack) -> bool {
        self.flows.len() * 4 < self.owned
            && self.opening.len() < OPENING_MAX
            && ct.early_drops() == self.early_drops
    }

    /// Whether connections put on with their SYN wait for their handshake's ACK (the worker
    /// then waits a millisecond at most when idle).
    pub fn has_openings(&self) -> bool {
        !self.opening.is_empty()
    }

    /// At most every millisecond: plays the handshake of each connection put on with its SYN
    /// whose client's ACK the fast path has reported (its SYN-ACK, then that ACK: established
    /// and assured), and forgets those older than `OPENING_MS` or taken off.
    pub fn play_handshakes(&mut self, ct: &Conntrack, now_ms: u64) {
        if self.opening.is_empty() || now_ms < self.next_opening_ms {
            return;
        }
        self.next_opening_ms = now_ms + 1;
        let (fast, flows) = (&self.fast, &mut self.flows);
        self.opening.retain(|op| {
            let Some(o) = flows.get(&op.orig) else {
                return false;
            };
            if o.opened_ms
                .is_none_or(|t| now_ms.saturating_sub(t) >= OPENING_MS)
            {
                return false;
            }
            if fast.flags(o.rewrite.slot) & u64::from(ACK) == 0 {
                return true;
            }
            for &play in &PLAYS[..2] {
                for k in [&op.reply, &op.orig] {
                    if let Some(o) = flows.get_mut(k) {
                        play_reported(fast, o, ct, now_ms, play);
                    }
                }
            }
            false
        });
    }

    /// Flows this worker has on the fast path.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// Whether [`Offloads::maintain`] has work: a check is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_check
    }

    /// After the pipeline and the write: puts the flow of `frame` (verdict `v`, arrived on
    /// `ingress`, sent on to `egress` or to the kernel) on the fast path if it qualifies
    /// (`allowed`: the worker lets it, when no monitor wants every verdict and its translated
    /// source is not the node's own address), with its reply direction when `frame` is a
    /// handshake's ACK, or takes it off when the frame answers, closes or resets its connection
    /// (a connection's first SYN: [`Offloads::settle_reopened`] and [`Offloads::open`]).
    ///
    /// A flow taken off has what the fast path moved for it since the last check counted into
    /// `counters` and its connection; returns those packets.
    #[allow(clippy::too_many_arguments)]
    pub fn consider(
        &mut self,
        frame: &[u8],
        v: &Verdict,
        ingress: u32,
        egress: Option<DirectHop>,
        ct: &Conntrack,
        counters: &mut Counters,
        now_ms: u64,
        allowed: bool,
    ) -> u64 {
        let Some(key) = flow_key(v) else {
            return 0;
        };
        let flags = match v.proto {
            IpProto::TCP => frame.get(v.l4_off as usize + 13).copied().unwrap_or(0xff),
            _ => 0,
        };
        if flags & (SYN_FIN_RST | ACK) == SYN {
            return 0;
        }
        if flags & SYN_FIN_RST != 0 {
            let moved = self.take_off(&key, ct, counters, now_ms);
            if flags & SYN_FIN_RST == SYN {
                self.await_ack(key, v, ingress, egress, now_ms, allowed);
            }
            return moved;
        }
        let Some(flow) = candidate(v, ingress, egress, allowed) else {
            return 0;
        };
        if !self.put_on(key, flow, ct, now_ms) || v.proto != IpProto::TCP {
            return 0;
        }
        // The handshake's ACK (or any later packet): the reply direction, if its SYN-ACK went
        // through this worker, arrives as the reverse of this direction's translation.
        let reply_key = reply_of(&key, &flow.rewrite);
        if let Some(a) = self.awaiting.remove(&reply_key) {
            self.put_on(reply_key, a.reply, ct, now_ms);
        }
        0
    }

    /// After the pipeline, before the write (the answer to a SYN may come back before the write
    /// returns): when `frame` is a connection's first SYN (verdict `v`), forwarded, routed
    /// directly to `egress` (the interface it leaves by is the one its replies arrive on),
    /// tracked by conntrack, not masqueraded, and the worker has room ([`Offloads::may_open`]),
    /// puts the connection on the fast path in both directions: its handshake's SYN-ACK and ACK,
    /// as all that follows, skip the tap (played into conntrack at the checks). `allowed` as
    /// for [`Offloads::consider`].
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        frame: &[u8],
        v: &Verdict,
        ingress: u32,
        egress: Option<DirectHop>,
        routing: Option<&DirectRouting>,
        ct: &Conntrack,
        now_ms: u64,
        allowed: bool,
    ) {
        let (Some(hop), Some(routing), Some(key)) = (egress, routing, flow_key(v)) else {
            return;
        };
        let flags = frame.get(v.l4_off as usize + 13).copied().unwrap_or(0xff);
        if v.proto != IpProto::TCP
            || flags & (SYN_FIN_RST | ACK) != SYN
            || !allowed
            || v.action != Action::Forward
            || v.masq
            || v.fragment
            || ingress == 0
            || !self.may_open(ct)
        {
            return;
        }
        let (reason, reply_reason) = match v.reason {
            Reason::Direct => (Reason::Direct, Reason::Direct),
            _ => (Reason::Established, Reason::ReplyUnnat),
        };
        let orig = forwarded_flow(v, reason, ingress, Some(hop));
        let reply = Candidate {
            tuple: Tuple {
                src: v.dst,
                dst: v.src,
                sport: v.dport,
                dport: v.sport,
                proto: v.proto,
                family: v.family,
            },
            reason: reply_reason,
            rewrite: FlowRewrite {
                src: v.orig_dst.v4_octets(),
                dst: v.orig_src.v4_octets(),
                sport: v.orig_dport,
                dport: v.orig_sport,
                slot: 0,
                ingress: hop.ifindex,
                egress: routing.hop_between(&v.dst, &v.orig_src, v.family),
            },
        };
        let reply_key = reply_of(&key, &orig.rewrite);
        // Both directions or neither: one alone would carry the handshake past conntrack
        // half-seen.
        let tracked = |k: &FlowKey, c: &Candidate| {
            !self.flows.contains_key(k) && ct.offloadable_opening(&c.tuple, 0, 0, now_ms)
        };
        if key == reply_key || !tracked(&key, &orig) || !tracked(&reply_key, &reply) {
            return;
        }
        let (Some(&a), Some(&b)) = (self.free.front(), self.free.get(1)) else {
            return;
        };
        let on = [(key, orig, a), (reply_key, reply, b)].map(|(k, c, slot)| {
            let rewrite = FlowRewrite { slot, ..c.rewrite };
            self.fast.clear_flags(slot);
            (k, c, rewrite)
        });
        // Refused (no memory): the connection stays with the tap.
        if (self.fast)
            .install_pair([(&on[0].0, &on[0].2), (&on[1].0, &on[1].2)])
            .is_err()
        {
            return;
        }
        self.free.drain(..2);
        for (k, c, rewrite) in on {
            self.track(k, c, rewrite, Some(now_ms));
        }
        self.opening.push_back(Opening {
            orig: key,
            reply: reply_key,
        });
    }

    /// Before the pipeline sees `frame`: when it opens a TCP connection (SYN without ACK) on a
    /// tuple this worker still has on the fast path (its close was reported but not played yet:
    /// a client reusing its port within a check), plays that close into conntrack and takes the
    /// flow and its reply direction off, so the SYN finds the old connection closed and opens a
    /// new one. Returns the packets the two flows moved since their last check (counted).
    pub fn settle_reopened(
        &mut self,
        frame: &[u8],
        ct: &Conntrack,
        counters: &mut Counters,
        now_ms: u64,
    ) -> u64 {
        if self.flows.is_empty() {
            return 0;
        }
        let Some(key) = opening_key(frame) else {
            return 0;
        };
        let Some(o) = self.flows.get(&key) else {
            return 0;
        };
        let reply_key = reply_of(&key, &o.rewrite);
        for play in PLAYS {
            for k in [&key, &reply_key] {
                if let Some(o) = self.flows.get_mut(k) {
                    play_reported(&self.fast, o, ct, now_ms, play);
                }
            }
        }
        self.take_off(&key, ct, counters, now_ms) + self.take_off(&reply_key, ct, counters, now_ms)
    }

    /// Keeps the SYN-ACK `v` (its flow `key`) until its handshake's ACK (bounded: a SYN-ACK
    /// that finds the table full stays with the tap until its direction's next packet).
    fn await_ack(
        &mut self,
        key: FlowKey,
        v: &Verdict,
        ingress: u32,
        egress: Option<DirectHop>,
        now_ms: u64,
        allowed: bool,
    ) {
        if self.awaiting.len() >= AWAITING_MAX && !self.awaiting.contains_key(&key) {
            return;
        }
        if let Some(reply) = candidate(v, ingress, egress, allowed) {
            self.awaiting.insert(
                key,
                AwaitingAck {
                    reply,
                    since_ms: now_ms,
                },
            );
        }
    }

    /// Installs `flow` as `key` if it is not on the fast path yet and conntrack says its
    /// connection qualifies; whether it is on now.
    fn put_on(&mut self, key: FlowKey, flow: Candidate, ct: &Conntrack, now_ms: u64) -> bool {
        if self.flows.contains_key(&key) {
            return true;
        }
        if !ct.offloadable(&flow.tuple, 0, 0, now_ms) {
            return false;
        }
        self.install(key, flow)
    }

    /// Gives `flow` a slot and puts it in the kernel's map as `key`; whether it is on now.
    fn install(&mut self, key: FlowKey, flow: Candidate) -> bool {
        let Some(slot) = self.free.pop_front() else {
            return false;
        };
        let rewrite = FlowRewrite {
            slot,
            ..flow.rewrite
        };
        self.fast.clear_flags(slot);
        // Refused (no memory): the flow stays on the tap.
        if self.fast.install(&key, &rewrite).is_err() {
            self.free.push_front(slot);
            return false;
        }
        self.track(key, flow, rewrite, None);
        true
    }

    /// Keeps `key`, just put in the kernel's map with `rewrite`, among this worker's flows.
    fn track(&mut self, key: FlowKey, flow: Candidate, rewrite: FlowRewrite, opened: Option<u64>) {
        let seen = self.fast.counts(rewrite.slot);
        self.flows.insert(
            key,
            Offloaded {
                seen,
                tuple: flow.tuple,
                reason: flow.reason,
                rewrite,
                played: 0,
                opened_ms: opened,
            },
        );
    }

    /// When [`Offloads::due`]: counts what the fast path moved into `counters` and the
    /// connections, and takes off the flows whose connections no longer qualify (all of them
    /// unless `allowed`); with `routing`, on a new FIB, gives each flow the direct hop that FIB
    /// has for it now. Returns the packets counted.
    pub fn maintain(
        &mut self,
        ct: &Conntrack,
        counters: &mut Counters,
        now: Instant,
        now_ms: u64,
        allowed: bool,
        routing: Option<&DirectRouting>,
    ) -> u64 {
        if !self.due(now) {
            return 0;
        }
        self.next_check = now + CHECK_EVERY;
        self.awaiting
            .retain(|_, a| now_ms.saturating_sub(a.since_ms) < AWAITING_MS);
        if let Some(r) = routing.filter(|r| r.fib.id() != self.hops_of) {
            self.hops_of = r.fib.id();
            self.rehop(r);
        }
        self.early_drops = ct.early_drops();
        let (fast, free) = (&self.fast, &mut self.free);
        // In the order a connection sends them, whichever direction is visited first: a
        // connection opened and closed on the fast path reaches SYN_RECV before its ACK makes
        // it ESTABLISHED, LAST_ACK before the ACK after the second FIN makes it TIME_WAIT.
        let (last, plays) = PLAYS.split_last().expect("plays");
        for &play in plays {
            for o in self.flows.values_mut() {
                play_reported(fast, o, ct, now_ms, play);
            }
        }
        let mut moved = 0;
        let leaving = &mut self.leaving;
        leaving.clear();
        self.flows.retain(|key, o| {
            play_reported(fast, o, ct, now_ms, *last);
            let (packets, bytes) = count_moved(fast, o, counters);
            moved += packets;
            let opening = o
                .opened_ms
                .is_some_and(|t| now_ms.saturating_sub(t) < OPENING_MS);
            let keep = allowed
                && if opening {
                    ct.offloadable_opening(&o.tuple, packets, bytes, now_ms)
                } else {
                    ct.offloadable(&o.tuple, packets, bytes, now_ms)
                };
            if !keep {
                leaving.push((*key, *o, (packets, bytes)));
            }
            keep
        });
        // Off the map in one system call, then what moved until each entry went is counted, in
        // the counters and (as the connection no longer qualifies) here in the connection.
        let keys: Vec<FlowKey> = leaving.iter().map(|(k, _, _)| *k).collect();
        let mut gone = vec![false; keys.len()];
        fast.remove_all(&keys, &mut gone);
        for ((_, o, (packets, bytes)), gone) in leaving.iter_mut().zip(gone) {
            let (last, last_bytes) = count_moved(fast, o, counters);
            ct.count_offloaded(&o.tuple, *packets + last, *bytes + last_bytes, now_ms);
            moved += last;
            // A removal the kernel refused leaves an entry no worker counts: its slot is not
            // reused until the entry is replaced.
            if gone {
                free.push_back(o.rewrite.slot);
            }
        }
        counters.offloaded_flows = self.flows.len() as u64;
        moved
    }

    /// Gives every flow routed directly the hop `routing`'s FIB has for it now (a neighbour's new
    /// MAC, a route moved); one that has none any more goes to the kernel's routing.
    fn rehop(&mut self, routing: &DirectRouting) {
        for (key, o) in self.flows.iter_mut() {
            if o.rewrite.egress.is_none() {
                continue;
            }
            let dst = Addr::from_v4(o.rewrite.dst);
            let hop = routing.hop_between(&o.tuple.src, &dst, o.tuple.family);
            if hop != o.rewrite.egress {
                let rewrite = FlowRewrite {
                    egress: hop,
                    ..o.rewrite
                };
                if self.fast.install(key, &rewrite).is_ok() {
                    o.rewrite = rewrite;
                }
            }
        }
    }

    /// Takes the flow `key` off the fast path, if it is on it (a SYN, FIN or RST of it), and
    /// counts what it moved since it was last read; returns those packets.
    fn take_off(
        &mut self,
        key: &FlowKey,
        ct: &Conntrack,
        counters: &mut Counters,
        now_ms: u64,
    ) -> u64 {
        let Some(mut o) = self.flows.remove(key) else {
            return 0;
        };
        for play in PLAYS {
            play_reported(&self.fast, &mut o, ct, now_ms, play);
        }
        let (packets, bytes) = release(&self.fast, &mut self.free, key, &mut o, counters);
        ct.count_offloaded(&o.tuple, packets, bytes, now_ms);
        counters.offloaded_flows = self.flows.len() as u64;
        packets
    }
}

/// Plays into conntrack one of [`PLAYS`] that the fast path reported for `o` and `o` has not
/// played yet. The ACK after a FIN waits for that FIN: the close's last ACK when both sides
/// sent theirs (conntrack TIME_WAIT), nothing in a half-close.
fn play_reported(
    fast: &FlowOffload,
    o: &mut Offloaded,
    ct: &Conntrack,
    now_ms: u64,
    (bit, segment, opening_only): (u64, u8, bool),
) {
    if o.played & bit != 0 || (opening_only && o.opened_ms.is_none()) {
        return;
    }
    if bit == AFTER_FIN && o.played & u64::from(FIN) == 0 {
        return;
    }
    if fast.flags(o.rewrite.slot) & bit != 0 {
        ct.offloaded_segment(&o.tuple, segment, now_ms);
        o.played |= bit;
    }
}

/// The reply direction of the flow `key` that `r` translates: the reverse of the translated
/// tuple, as the replies arrive.
fn reply_of(key: &FlowKey, r: &FlowRewrite) -> FlowKey {
    FlowKey {
        src: r.dst,
        dst: r.src,
        sport: r.dport,
        dport: r.sport,
        proto: key.proto,
    }
}

/// The fast path's key of an untagged Ethernet frame carrying a TCP SYN without ACK over IPv4
/// (a connection opening); None for anything else.
fn opening_key(frame: &[u8]) -> Option<FlowKey> {
    let m = kxdp_packet::meta::parse(frame, kxdp_packet::LinkType::Ethernet)
        .ok()?
        .ip()?;
    if m.family != Family::V4
        || m.proto != IpProto::TCP
        || m.frag.is_fragment
        || m.tcp_flags & (SYN | ACK | RST) != SYN
    {
        return None;
    }
    Some(FlowKey {
        src: m.src.v4_octets(),
        dst: m.dst.v4_octets(),
        sport: m.sport,
        dport: m.dport,
        proto: IpProto::TCP.0,
    })
}

/// Counts into `counters` what the fast path moved for `o` since its slot was last read, as the
/// pipeline would have counted those packets; returns the packets (segments) and bytes.
fn count_moved(fast: &FlowOffload, o: &mut Offloaded, counters: &mut Counters) -> (u64, u64) {
    let counts = fast.counts(o.rewrite.slot);
    let (packets, bytes) = (counts.0 - o.seen.0, counts.1 - o.seen.1);
    o.seen = counts;
    if packets > 0 {
        counters.packets += packets;
        counters.bytes += bytes;
        counters.reasons[o.reason as usize] += packets;
        counters.actions[Action::Forward as usize] += packets;
        counters.offloaded += packets;
        if o.rewrite.egress.is_some() {
            counters.direct_routed += packets;
        }
    }
    (packets, bytes)
}

/// Takes a flow off the fast path: its entry first, then what the kernel moved until then is
/// counted ([`count_moved`], returned), then its slot is freed. A removal the kernel refuses
/// leaves an entry no worker counts: the slot is not reused until the entry is replaced.
fn release(
    fast: &FlowOffload,
    free: &mut VecDeque<u32>,
    key: &FlowKey,
    o: &mut Offloaded,
    counters: &mut Counters,
) -> (u64, u64) {
    let removed = fast.remove(key).is_ok();
    let last = count_moved(fast, o, counters);
    if removed {
        free.push_back(o.rewrite.slot);
    }
    last
}

/// The flow of the forwarded packet `v` (arrived on `ingress`, sent on to `egress`) as the fast
/// path would carry it, if the verdict allows that: forwarded as part of a connection
/// (`ct-established`, `reply-unnat`, or `direct`: a pod connection tracked as is, which goes on
/// with its own addresses and the kernel moves without a rewrite), not masqueraded, not a
/// fragment, from a known interface, and no monitor wants every verdict (`allowed`). Conntrack
/// has the last word (`Conntrack::offloadable`).
fn candidate(
    v: &Verdict,
    ingress: u32,
    egress: Option<DirectHop>,
    allowed: bool,
) -> Option<Candidate> {
    let established = matches!(
        v.reason,
        Reason::Established | Reason::ReplyUnnat | Reason::Direct
    );
    if !allowed
        || v.action != Action::Forward
        || !established
        || v.masq
        || v.fragment
        || ingress == 0
    {
        return None;
    }
    Some(forwarded_flow(v, v.reason, ingress, egress))
}

/// The flow of the forwarded packet `v` as it arrived on `ingress`, with the translation the
/// pipeline applied and `egress`, counted as `reason` (its slot not yet set).
fn forwarded_flow(
    v: &Verdict,
    reason: Reason,
    ingress: u32,
    egress: Option<DirectHop>,
) -> Candidate {
    Candidate {
        tuple: Tuple {
            src: v.orig_src,
            dst: v.orig_dst,
            sport: v.orig_sport,
            dport: v.orig_dport,
            proto: v.proto,
            family: v.family,
        },
        reason,
        rewrite: FlowRewrite {
            src: v.src.v4_octets(),
            dst: v.dst.v4_octets(),
            sport: v.sport,
            dport: v.dport,
            slot: 0,
            ingress,
            egress,
        },
    }
}

/// The fast path's key for the flow of `v` as it arrived (IPv4 TCP and UDP only).
fn flow_key(v: &Verdict) -> Option<FlowKey> {
    if !v.has_addrs || v.family != Family::V4 || !matches!(v.proto, IpProto::TCP | IpProto::UDP) {
        return None;
    }
    Some(FlowKey {
        src: v.orig_src.v4_octets(),
        dst: v.orig_dst.v4_octets(),
        sport: v.orig_sport,
        dport: v.orig_dport,
        proto: v.proto.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conntrack::{tcp, CtConfig};
    use kxdp_packet::Addr;

    fn tuple(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Tuple {
        Tuple {
            src: Addr::from_v4(src),
            dst: Addr::from_v4(dst),
            sport,
            dport,
            proto: IpProto::TCP,
            family: Family::V4,
        }
    }

    /// A forwarded packet of `orig` translated to `to`, with TCP flags `flags` (its frame).
    fn forwarded(orig: &Tuple, to: &Tuple, reason: Reason, flags: u8) -> (Verdict, Vec<u8>) {
        let mut v = Verdict {
            has_addrs: true,
            family: Family::V4,
            proto: IpProto::TCP,
            orig_src: orig.src,
            orig_sport: orig.sport,
            orig_dst: orig.dst,
            orig_dport: orig.dport,
            src: to.src,
            sport: to.sport,
            dst: to.dst,
            dport: to.dport,
            l3_off: 14,
            l4_off: 34,
            ..Verdict::default()
        };
        v.set(reason);
        let mut frame = vec![0u8; 54];
        frame[34 + 13] = flags;
        (v, frame)
    }

    /// Needs root (BPF maps); skipped with a note otherwise. A connection goes on the fast path
    /// once established and assured, is counted from it, and leaves it when it closes, when its
    /// entry goes, and when every verdict is wanted.
    #[test]
    fn established_flows_go_on_and_come_off_the_fast_path() {
        let Some((fast, ct, mut o, mut cs)) = fast_path() else {
            return;
        };
        let client = tuple([10, 0, 0, 1], 40000, [172, 30, 0, 10], 80);
        let reply = tuple([10, 0, 0, 9], 5201, [10, 0, 0, 1], 40000);
        let backend = tuple([10, 0, 0, 1], 40000, [10, 0, 0, 9], 5201);
        let find = |t: &Tuple| {
            let p = t.pack();
            ct.lookup(&p, ct.hash(&p), 0).unwrap()
        };
        ct.create(&client, &reply, tcp::SYN, false, 1, 0, 0)
            .unwrap();
        let (v, f) = forwarded(&client, &backend, Reason::Established, tcp::ACK);
        // Not yet answered: not established.
        o.consider(&f, &v, 7, None, &ct, &mut cs, 0, true);
        assert!(o.is_empty());
        // Packets of an established connection in the direction of `t`.
        let talk = |t: &Tuple, n: usize, now: u64| {
            for _ in 0..n {
                ct.on_packet(&find(t), tcp::ACK, 60, now).unwrap();
            }
        };
        ct.on_packet(&find(&reply), tcp::SYN | tcp::ACK, 60, 0)
            .unwrap();
        // The handshake's ACK makes it established.
        talk(&client, 1, 0);
        // Unknown interface, a monitor of every verdict, a masqueraded one: not installed.
        o.consider(&f, &v, 0, None, &ct, &mut cs, 0, true);
        o.consider(&f, &v, 7, None, &ct, &mut cs, 0, false);
        o.consider(
            &f,
            &Verdict { masq: true, ..v },
            7,
            None,
            &ct,
            &mut cs,
            0,
            true,
        );
        assert!(o.is_empty());
        o.consider(&f, &v, 7, None, &ct, &mut cs, 0, true);
        assert_eq!(o.len(), 1);
        // Counted from the slot: nothing moved yet.
        let mut c = Counters::default();
        let t0 = Instant::now();
        assert_eq!(o.maintain(&ct, &mut c, t0, 10, true, None), 0);
        assert_eq!((c.offloaded, c.offloaded_flows), (0, 1));
        // A FIN takes it off at once, and counts what the fast path moved since the last check
        // (here 5 segments, 7,000 bytes), in the counters and in the connection.
        let key = flow_key(&v).unwrap();
        fast.add_counts(o.flows[&key].rewrite.slot, 5, 7_000);
        let before = ct.connections().next().unwrap();
        let (fin, ff) = forwarded(&client, &backend, Reason::Established, tcp::FIN | tcp::ACK);
        assert_eq!(o.consider(&ff, &fin, 7, None, &ct, &mut cs, 10, true), 5);
        assert!(o.is_empty());
        assert_eq!((cs.offloaded, cs.bytes, cs.offloaded_flows), (5, 7_000, 0));
        assert_eq!(cs.reasons[Reason::Established as usize], 5);
        let after = ct.connections().next().unwrap();
        assert_eq!(after.idx, before.idx);
        assert_eq!(after.packets[0], before.packets[0] + 5);
        assert_eq!(after.bytes[0], before.bytes[0] + 7_000);
        assert!(
            !fast.remove(&flow_key(&v).unwrap()).unwrap(),
            "removed from the map"
        );
        // Back on, then its entry goes: off at the next check.
        o.consider(&f, &v, 7, None, &ct, &mut cs, 10, true);
        assert_eq!(o.len(), 1);
        ct.kill(find(&client).idx);
        o.maintain(&ct, &mut c, t0 + CHECK_EVERY, 20, true, None);
        assert!(o.is_empty());
        assert_eq!(c.offloaded_flows, 0);
        // The reply direction of another connection, then a monitor of every verdict.
        let c2 = tuple([10, 0, 0, 2], 40001, [172, 30, 0, 10], 80);
        let r2 = tuple([10, 0, 0, 9], 5201, [10, 0, 0, 2], 40001);
        ct.create(&c2, &r2, tcp::SYN, false, 1, 0, 20).unwrap();
        ct.on_packet(&find(&r2), tcp::SYN | tcp::ACK, 60, 20)
            .unwrap();
        ct.on_packet(&find(&c2), tcp::ACK, 60, 20).unwrap();
        talk(&r2, 3, 20);
        talk(&c2, 2, 20);
        let back = tuple([172, 30, 0, 10], 80, [10, 0, 0, 2], 40001);
        let (rv, rf) = forwarded(&r2, &back, Reason::ReplyUnnat, tcp::ACK);
        o.consider(&rf, &rv, 8, None, &ct, &mut cs, 20, true);
        assert_eq!(o.len(), 1);
        o.maintain(&ct, &mut c, t0 + 2 * CHECK_EVERY, 30, false, None);
        assert!(o.is_empty());
        // Pod to pod, tracked as is: on with its own addresses once established; a packet
        // that no connection tracks (transit) stays with the tap.
        let p = tuple([10, 0, 0, 3], 40002, [10, 0, 1, 7], 5201);
        let (dv, df) = forwarded(&p, &p, Reason::Direct, tcp::ACK);
        o.consider(&df, &dv, 9, None, &ct, &mut cs, 30, true);
        assert!(o.is_empty(), "untracked");
        ct.create(&p, &p.reversed(), tcp::SYN, false, 0, 0, 30)
            .unwrap();
        ct.on_packet(&find(&p.reversed()), tcp::SYN | tcp::ACK, 60, 30)
            .unwrap();
        talk(&p, 3, 30);
        o.consider(&df, &dv, 9, None, &ct, &mut cs, 30, true);
        assert_eq!(o.len(), 1);
        // Routed directly: a new FIB gives the flow the hop it has for it now (the neighbour's
        // new MAC), and none once the route is gone (then the kernel routes it).
        let key = flow_key(&dv).unwrap();
        o.take_off(&key, &ct, &mut cs, 30);
        let hop = DirectHop {
            ifindex: 4,
            dst_mac: [2, 0, 0, 0, 0, 7],
            src_mac: [4; 6],
        };
        o.consider(&df, &dv, 9, Some(hop), &ct, &mut cs, 30, true);
        assert_eq!(o.flows[&key].rewrite.egress, Some(hop));
        let mut pods = crate::snapshot::PrefixSet::new();
        pods.insert("10.0.0.0".parse().unwrap(), 16);
        let fib_with = |neighbour_mac: u8, routed: bool| {
            use crate::fib::testing::{link, neigh, route};
            crate::fib::Fib::new(crate::fib::FibInput {
                links: vec![link(4, 4)],
                routes: routed
                    .then(|| route("10.0.1.0", 24, 4, None))
                    .into_iter()
                    .collect(),
                neighbours: vec![neigh(4, "10.0.1.7", neighbour_mac)],
                ..crate::fib::FibInput::default()
            })
        };
        let moved = fib_with(8, true);
        let routing = DirectRouting {
            fib: &moved,
            pods: &pods,
            kernel_port: None,
        };
        o.maintain(&ct, &mut c, t0 + 3 * CHECK_EVERY, 40, true, Some(&routing));
        let now = o.flows[&key].rewrite.egress.unwrap();
        assert_eq!((now.ifindex, now.dst_mac), (4, [8; 6]));
        let gone = fib_with(8, false);
        let routing = DirectRouting {
            fib: &gone,
            ..routing
        };
        o.maintain(&ct, &mut c, t0 + 4 * CHECK_EVERY, 50, true, Some(&routing));
        assert_eq!(o.flows[&key].rewrite.egress, None, "the kernel routes it");
        assert_eq!(o.len(), 1);
    }

    /// Needs root (BPF maps). A forwarded SYN-ACK waits for its handshake's ACK, which puts both
    /// directions on the fast path, the reply with the translation, interface and hop its SYN-ACK
    /// had; a SYN-ACK never acknowledged is forgotten.
    #[test]
    fn a_handshake_puts_both_directions_on() {
        let Some((_, ct, mut o, mut cs)) = fast_path() else {
            return;
        };
        let ((sa, saf), (ack, ackf), client) = answered(&ct);
        let hop = DirectHop {
            ifindex: 3,
            dst_mac: [2, 0, 0, 0, 0, 1],
            src_mac: [4; 6],
        };
        o.consider(&saf, &sa, 8, Some(hop), &ct, &mut cs, 0, true);
        assert!(o.is_empty(), "a SYN-ACK never goes on itself");
        assert_eq!(o.awaiting.len(), 1);
        // The handshake's ACK: this direction and the reply go on.
        ct.on_packet(&find(&ct, &client), tcp::ACK, 60, 0).unwrap();
        o.consider(&ackf, &ack, 7, None, &ct, &mut cs, 0, true);
        assert_eq!(o.len(), 2);
        assert!(o.awaiting.is_empty());
        let back = o.flows[&flow_key(&sa).unwrap()];
        assert_eq!(back.rewrite.src, [172, 30, 0, 10]);
        assert_eq!((back.rewrite.ingress, back.rewrite.egress), (8, Some(hop)));
        assert_eq!(back.reason, Reason::ReplyUnnat);
        assert_eq!(o.flows[&flow_key(&ack).unwrap()].rewrite.ingress, 7);
        // A SYN-ACK whose ACK never comes is forgotten after AWAITING_MS.
        let c2 = tuple([10, 0, 0, 2], 40001, [10, 0, 1, 9], 8080);
        ct.create(&c2, &c2.reversed(), tcp::SYN, false, 0, 0, 0)
            .unwrap();
        let (sa2, saf2) = forwarded(
            &c2.reversed(),
            &c2.reversed(),
            Reason::Direct,
            tcp::SYN | tcp::ACK,
        );
        o.consider(&saf2, &sa2, 9, None, &ct, &mut cs, 0, true);
        assert_eq!(o.awaiting.len(), 1);
        let mut c = Counters::default();
        o.maintain(&ct, &mut c, Instant::now(), AWAITING_MS - 1, true, None);
        assert_eq!(o.awaiting.len(), 1);
        o.maintain(
            &ct,
            &mut c,
            Instant::now() + CHECK_EVERY,
            AWAITING_MS,
            true,
            None,
        );
        assert!(o.awaiting.is_empty());
        assert_eq!(o.len(), 2);
    }

    /// The fast path's maps (4,096 flows), a conntrack table, a worker's offloads and counters;
    /// None (the test skipped, with a note) where BPF maps cannot be made (not root).
    fn fast_path() -> Option<(Arc<FlowOffload>, Conntrack, Offloads, Counters)> {
        let Ok(fast) = FlowOffload::new(4096) else {
            eprintln!("SKIPPED: no BPF maps here");
            return None;
        };
        let fast = Arc::new(fast);
        let o = Offloads::new(fast.clone(), 0, 1);
        let ct = Conntrack::new(CtConfig::default(), 1);
        Some((fast, ct, o, Counters::default()))
    }

    /// `t`'s connection in `ct`.
    fn find(ct: &Conntrack, t: &Tuple) -> crate::conntrack::Found {
        let p = t.pack();
        ct.lookup(&p, ct.hash(&p), 0).unwrap()
    }

    /// A connection to a ClusterIP whose SYN-ACK conntrack has seen: that SYN-ACK as a worker
    /// forwards it, the handshake's ACK as a worker forwards it (conntrack has not seen it), the
    /// client's tuple.
    #[allow(clippy::type_complexity)]
    fn answered(ct: &Conntrack) -> ((Verdict, Vec<u8>), (Verdict, Vec<u8>), Tuple) {
        let client = tuple([10, 0, 0, 1], 40000, [172, 30, 0, 10], 80);
        let backend = tuple([10, 0, 0, 1], 40000, [10, 0, 1, 9], 8080);
        let reply = backend.reversed();
        let unnat = tuple([172, 30, 0, 10], 80, [10, 0, 0, 1], 40000);
        ct.create(&client, &reply, tcp::SYN, false, 1, 0, 0)
            .unwrap();
        ct.on_packet(&find(ct, &reply), tcp::SYN | tcp::ACK, 60, 0)
            .unwrap();
        (
            forwarded(&reply, &unnat, Reason::ReplyUnnat, tcp::SYN | tcp::ACK),
            forwarded(&client, &backend, Reason::Established, tcp::ACK),
            client,
        )
    }

    /// A connection through a ClusterIP, established, both directions on the fast path (what
    /// its handshake's ACK does): the worker's offloads, the connection, the two flows' keys.
    fn on_fast_path(
        fast: Arc<FlowOffload>,
        ct: &Conntrack,
        cs: &mut Counters,
    ) -> (Offloads, Tuple, FlowKey, FlowKey) {
        let mut o = Offloads::new(fast, 0, 1);
        let ((sa, saf), (ack, ackf), client) = answered(ct);
        o.consider(&saf, &sa, 8, None, ct, cs, 0, true);
        ct.on_packet(&find(ct, &client), tcp::ACK, 60, 0).unwrap();
        o.consider(&ackf, &ack, 7, None, ct, cs, 0, true);
        assert_eq!(o.len(), 2);
        let keys = (flow_key(&ack).unwrap(), flow_key(&sa).unwrap());
        (o, client, keys.0, keys.1)
    }

    fn state_of(ct: &Conntrack) -> &'static str {
        Conntrack::state_name(&ct.connections().next().unwrap()).unwrap()
    }

    /// Needs root (BPF maps). A close the fast path carried (the server's FIN, the client's FIN,
    /// the server's last ACK, reported in the flows' slots) is played into conntrack at the next
    /// check, whichever direction comes first: TIME_WAIT, both flows off, their segments
    /// counted.
    #[test]
    fn a_close_on_the_fast_path_is_played_at_the_check() {
        let Some((fast, ct, _, mut cs)) = fast_path() else {
            return;
        };
        let (mut o, _, orig, back) = on_fast_path(fast.clone(), &ct, &mut cs);
        let slot = |k: &FlowKey| o.flows[k].rewrite.slot;
        let (so, sb) = (slot(&orig), slot(&back));
        // The server's answer and FIN, its last ACK; the client's ACK and FIN.
        fast.add_counts(sb, 3, 300);
        fast.add_flags(sb, u64::from(tcp::FIN | tcp::ACK) | AFTER_FIN);
        fast.add_counts(so, 2, 120);
        fast.add_flags(so, u64::from(tcp::FIN | tcp::ACK));
        let mut c = Counters::default();
        assert_eq!(o.maintain(&ct, &mut c, Instant::now(), 10, true, None), 5);
        assert_eq!(state_of(&ct), "TIME_WAIT");
        assert!(o.is_empty(), "a closed connection's flows come off");
        assert!(!fast.remove(&orig).unwrap() && !fast.remove(&back).unwrap());
        let e = ct.connections().next().unwrap();
        assert_eq!((e.packets[0], e.packets[1]), (2 + 2, 3 + 1));
        assert_eq!(c.reasons[Reason::Established as usize], 2);
        assert_eq!(c.reasons[Reason::ReplyUnnat as usize], 3);
        // A half-close: the client's FIN alone leaves it FIN_WAIT, the flows off (the rest of
        // the connection goes through the tap).
        let ct = Conntrack::new(CtConfig::default(), 1);
        let (mut o, _, orig, _) = on_fast_path(fast.clone(), &ct, &mut cs);
        fast.add_flags(o.flows[&orig].rewrite.slot, u64::from(tcp::FIN | tcp::ACK));
        o.maintain(&ct, &mut c, Instant::now(), 10, true, None);
        assert_eq!(state_of(&ct), "FIN_WAIT");
        assert!(o.is_empty());
    }

    /// Needs root (BPF maps). A connection routed directly goes on in both directions with its
    /// SYN (the reply bound to the interface the SYN left by, with its own hop); its handshake
    /// and close on the fast path are played at the checks in a connection's order (SYN_RECV,
    /// ESTABLISHED, then TIME_WAIT, flows off); a SYN never answered comes off after
    /// OPENING_MS; one not routed directly waits for its handshake's ACK.
    #[test]
    fn a_connection_routed_directly_goes_on_with_its_syn() {
        use crate::fib::testing::{link, neigh, route};
        let Some((fast, ct, mut o, mut cs)) = fast_path() else {
            return;
        };
        let mut pods = crate::snapshot::PrefixSet::new();
        pods.insert("10.0.0.0".parse().unwrap(), 16);
        let fib = crate::fib::Fib::new(crate::fib::FibInput {
            links: vec![link(4, 4), link(5, 5)],
            routes: vec![
                route("10.0.1.0", 24, 4, None),
                route("10.0.0.0", 24, 5, None),
            ],
            neighbours: vec![neigh(4, "10.0.1.9", 9), neigh(5, "10.0.0.1", 1)],
            ..crate::fib::FibInput::default()
        });
        let routing = DirectRouting {
            fib: &fib,
            pods: &pods,
            kernel_port: None,
        };
        let client = tuple([10, 0, 0, 1], 40000, [172, 30, 0, 10], 80);
        let backend = tuple([10, 0, 0, 1], 40000, [10, 0, 1, 9], 8080);
        ct.create(&client, &backend.reversed(), tcp::SYN, false, 1, 0, 0)
            .unwrap();
        let (syn, synf) = forwarded(&client, &backend, Reason::ServiceDnat, tcp::SYN);
        let hop = routing.hop(&syn);
        assert_eq!(hop.map(|h| h.ifindex), Some(4));
        // Without a direct hop, or routing: stays with the tap.
        o.open(&synf, &syn, 5, None, Some(&routing), &ct, 0, true);
        o.open(&synf, &syn, 5, hop, None, &ct, 0, true);
        // After the write, the SYN changes nothing.
        o.consider(&synf, &syn, 5, hop, &ct, &mut cs, 0, true);
        assert!(o.is_empty());
        o.open(&synf, &syn, 5, hop, Some(&routing), &ct, 0, true);
        // Its write: the SYN does not take it off again.
        o.consider(&synf, &syn, 5, hop, &ct, &mut cs, 0, true);
        assert_eq!(o.len(), 2);
        let orig = flow_key(&syn).unwrap();
        let back = reply_of(&orig, &o.flows[&orig].rewrite);
        let r = o.flows[&back];
        assert_eq!(
            (r.rewrite.src, r.rewrite.dst),
            ([172, 30, 0, 10], [10, 0, 0, 1])
        );
        assert_eq!((r.rewrite.sport, r.rewrite.dport), (80, 40000));
        assert_eq!(
            r.rewrite.ingress, 4,
            "the replies arrive where the SYN left"
        );
        assert_eq!(r.rewrite.egress.map(|h| h.ifindex), Some(5));
        assert_eq!(r.reason, Reason::ReplyUnnat);
        assert_eq!(o.flows[&orig].reason, Reason::Established);
        // The SYN-ACK, the handshake's ACK and a request and answer on the fast path.
        let (so, sb) = (o.flows[&orig].rewrite.slot, o.flows[&back].rewrite.slot);
        fast.add_flags(sb, u64::from(tcp::SYN | tcp::ACK));
        fast.add_counts(sb, 2, 200);
        // The SYN-ACK alone: the handshake waits for the client's ACK.
        o.play_handshakes(&ct, 1);
        assert_eq!((state_of(&ct), o.has_openings()), ("SYN_SENT", true));
        fast.add_flags(so, u64::from(tcp::ACK));
        fast.add_counts(so, 2, 150);
        // Within a millisecond of the ACK, not at the next check: established and assured.
        o.play_handshakes(&ct, 1);
        assert_eq!(state_of(&ct), "SYN_SENT", "at most every millisecond");
        o.play_handshakes(&ct, 2);
        assert_eq!((state_of(&ct), o.has_openings()), ("ESTABLISHED", false));
        let t0 = Instant::now();
        let mut c = Counters::default();
        assert_eq!(o.maintain(&ct, &mut c, t0, 10, true, None), 4);
        assert_eq!(state_of(&ct), "ESTABLISHED");
        assert_eq!(o.len(), 2);
        // Its close.
        fast.add_flags(so, u64::from(tcp::FIN | tcp::ACK));
        fast.add_flags(sb, u64::from(tcp::FIN | tcp::ACK) | AFTER_FIN);
        o.maintain(&ct, &mut c, t0 + CHECK_EVERY, 20, true, None);
        assert_eq!(state_of(&ct), "TIME_WAIT");
        assert!(o.is_empty());
        // A SYN never answered: on until OPENING_MS, then off.
        let ct = Conntrack::new(CtConfig::default(), 1);
        ct.create(&client, &backend.reversed(), tcp::SYN, false, 1, 0, 0)
            .unwrap();
        o.open(&synf, &syn, 5, hop, Some(&routing), &ct, 0, true);
        assert_eq!(o.len(), 2);
        o.maintain(
            &ct,
            &mut c,
            t0 + 2 * CHECK_EVERY,
            OPENING_MS - 1,
            true,
            None,
        );
        assert_eq!((o.len(), state_of(&ct)), (2, "SYN_SENT"));
        o.maintain(&ct, &mut c, t0 + 3 * CHECK_EVERY, OPENING_MS, true, None);
        assert!(o.is_empty());
        o.play_handshakes(&ct, OPENING_MS + 10);
        assert!(!o.has_openings());
    }

    /// Needs root (BPF maps). A client that reuses its port before the check: its SYN has the
    /// reported close played first (TIME_WAIT: the SYN opens a new connection), both flows
    /// off; another frame, or a SYN of a flow not on the fast path, changes nothing.
    #[test]
    fn a_syn_reopening_a_flow_settles_its_close_first() {
        let Some((fast, ct, _, mut cs)) = fast_path() else {
            return;
        };
        let (mut o, client, orig, back) = on_fast_path(fast.clone(), &ct, &mut cs);
        let frame = |t: &Tuple, flags: u8| {
            let mut f = vec![0u8; 54];
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[14] = 0x45;
            f[16..18].copy_from_slice(&40u16.to_be_bytes());
            f[22] = 64;
            f[23] = 6;
            f[26..30].copy_from_slice(&t.src.v4_octets());
            f[30..34].copy_from_slice(&t.dst.v4_octets());
            f[34..36].copy_from_slice(&t.sport.to_be_bytes());
            f[36..38].copy_from_slice(&t.dport.to_be_bytes());
            f[46] = 0x50;
            f[47] = flags;
            f
        };
        fast.add_counts(o.flows[&back].rewrite.slot, 1, 60);
        fast.add_flags(
            o.flows[&back].rewrite.slot,
            u64::from(tcp::FIN | tcp::ACK) | AFTER_FIN,
        );
        fast.add_flags(o.flows[&orig].rewrite.slot, u64::from(tcp::FIN | tcp::ACK));
        let other = tuple([10, 0, 0, 2], 40000, [172, 30, 0, 10], 80);
        for f in [frame(&client, tcp::ACK), frame(&other, tcp::SYN)] {
            assert_eq!(o.settle_reopened(&f, &ct, &mut cs, 10), 0);
            assert_eq!(o.len(), 2);
        }
        assert_eq!(state_of(&ct), "ESTABLISHED");
        assert_eq!(
            o.settle_reopened(&frame(&client, tcp::SYN), &ct, &mut cs, 10),
            1
        );
        assert!(o.is_empty());
        assert_eq!(state_of(&ct), "TIME_WAIT");
        assert!(crate::conntrack::tcp::TcpState::TimeWait.allows_reopen());
    }
}
