//! The per-packet pipeline: one function that `kxdp replay` and the AF_XDP workers both call.
//!
//! A batch of frames is processed in place, in passes so that memory latency overlaps: parse
//! every frame and prefetch its conntrack slot; prefetch the entries the slots name; look every
//! packet up in conntrack; look up the frontends of the misses; then decide and rewrite. The decision is a short sequence of table lookups:
//!
//! ```text
//! parse ─► conntrack hit? ─► translate as the connection is            (ct-established / reply-unnat)
//!            └─ miss ─► frontend (dst, port, proto)?
//!                        ├─ yes ─► source range ─► route by source class ─► endpoint (affinity | Maglev | random)
//!                        │         ─► masquerade? ─► SNAT port ─► conntrack insert ─► rewrite (service-dnat)
//!                        └─ no ─► ClusterIP? reject · service CIDR? drop · node address? pass · else forward
//! ```
//!
//! NetworkPolicy (`crate::policy`) judges a new connection once its destination is final: a
//! Service's chosen endpoint, or the destination as addressed for pod traffic, which is then
//! tracked as is so that its replies and later packets pass statefully.
//!
//! Every outcome is one `Reason`, written into the packet's verdict; `Counters::record` counts
//! the final verdicts once the last stage is done (`Pipeline::process` when the pipeline is the
//! only stage; the egress stage's callers after it). No allocation, lock or syscall per packet.

use kxdp_packet::{
    build_port_unreachable, build_tcp_rst, parse_into, parse_plain_v4, parse_quoted, rewrite,
    rewrite_icmp_error, rewrite_plain_v4_from, rewrite_v4_ports, Addr, ErrorRewrite, IpProto,
    LinkType, PacketMeta, PlainV4, Quoted,
};

use crate::conntrack::{
    addr_word, tcp, tcp_state_of, Candidate, Conntrack, CreateError, FirstPacket, Found,
    InsertError, LaneClock, Packed, PacketError, Tuple, DIR_ORIG, DIR_REPLY, FLAG_BACKEND_GONE,
    FLAG_MASQ,
};
use crate::fragments::{FragDecision, FragmentTable};
use crate::policy::{Decision, PolicyCounts};
use crate::snapshot::{EmptyAction, FrontendKey, FrontendRef, FrontendTable, Snapshot};
use crate::verdict::{Action, Reason, Verdict};

/// Frames handled per pass; larger batches are processed in chunks of this size.
pub const MAX_BATCH: usize = 256;

/// Source ports tried for a unique reply tuple before a connection is refused (`snat-exhausted`).
const SNAT_ATTEMPTS: u32 = 32;

/// Most conntrack entries a worker examines for expiry after one batch (the scan is paced by
/// time; this bounds one step).
const EXPIRY_BUDGET: usize = 256;

/// A batch of frames the pipeline processes in place. Each frame is a buffer (its full capacity,
/// so that a reply may be longer than the packet it answers) and the length of the frame in it.
///
/// # Safety
///
/// `count()` does not change through this trait's methods (`frame`, `frame_mut` and their
/// unchecked forms): a caller that has checked an index against `count()` once may call the
/// unchecked forms with it for as long as it holds the batch borrowed.
#[allow(unsafe_code)]
pub unsafe trait Frames {
    fn count(&self) -> usize;
    fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize);
    fn frame(&self, i: usize) -> &[u8];

    /// `frame(i)` without the implementation's own bounds checks (the pass checks its range
    /// once: `PassFrames`).
    ///
    /// # Safety
    ///
    /// `i < self.count()`.
    #[inline(always)]
    unsafe fn frame_unchecked(&self, i: usize) -> &[u8] {
        self.frame(i)
    }

    /// `frame_mut(i)` without the implementation's own bounds checks.
    ///
    /// # Safety
    ///
    /// `i < self.count()`.
    #[inline(always)]
    unsafe fn frame_mut_unchecked(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        self.frame_mut(i)
    }
}

/// The frames `base..base + m` of a batch, their range checked against `Frames::count` once
/// (`new`), so that the pass's per-packet accesses skip the implementation's checks
/// (`SlotFrames`, then the replay's frames, made three per access, two accesses a packet;
/// docs/benchmarks.md "Bounds checked once"). `i < m` is still asserted per access: in the pass's
/// loops over `0..m` the compiler proves it and drops the test.
struct PassFrames<'f, F> {
    frames: &'f mut F,
    base: usize,
    m: usize,
}

impl<'f, F: Frames> PassFrames<'f, F> {
    #[inline(always)]
    fn new(frames: &'f mut F, base: usize, m: usize) -> Self {
        let count = frames.count();
        assert!(
            base <= count && m <= count - base,
            "a pass past the batch's frames"
        );
        PassFrames { frames, base, m }
    }

    /// Frame `i` of the pass.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn frame(&self, i: usize) -> &[u8] {
        assert!(i < self.m);
        // SAFETY: `i < m` (just asserted) and `base + m <= count()` (checked in `new`; `Frames`
        // guarantees that `count()` does not change through its methods, and `&mut` keeps any
        // other change out while this value lives), so `base + i < count()`.
        unsafe { self.frames.frame_unchecked(self.base + i) }
    }

    /// Frame `i` of the pass, to rewrite, and its length.
    #[inline(always)]
    #[allow(unsafe_code)]
    fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        assert!(i < self.m);
        // SAFETY: as in `frame`.
        unsafe { self.frames.frame_mut_unchecked(self.base + i) }
    }
}

/// Per-worker counters: every packet counted once, by reason (the action follows from it).
#[derive(Clone, Debug)]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    pub batches: u64,
    pub reasons: [u64; Reason::COUNT],
    /// By the action taken, which differs from the reason's usual action when a reject cannot be
    /// answered (an ICMP error, a multicast destination): then the packet is dropped.
    pub actions: [u64; Action::COUNT],
    pub ct_created: u64,
    pub ct_expired: u64,
    /// ICMP errors that quoted no tracked connection (whatever happened to them).
    pub icmp_untracked: u64,
    /// Packets the established fast lane translated (`established_lane`), also counted by
    /// reason: how much of the traffic took the short path.
    pub fast_lane: u64,
    /// Packets the kernel's fast path moved for this worker's offloaded flows
    /// (`crate::offload`), also counted by reason, and those flows now.
    pub offloaded: u64,
    pub offloaded_flows: u64,
    /// Packets sent straight to their egress interface by direct routing (`crate::direct`):
    /// from the tap by the worker and on the fast path for its flows; also counted by reason.
    pub direct_routed: u64,
    /// New connections per policy rule that decided them (allowed or denied).
    pub policy: PolicyCounts,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            packets: 0,
            bytes: 0,
            batches: 0,
            reasons: [0; Reason::COUNT],
            actions: [0; Action::COUNT],
            ct_created: 0,
            ct_expired: 0,
            icmp_untracked: 0,
            fast_lane: 0,
            offloaded: 0,
            offloaded_flows: 0,
            direct_routed: 0,
            policy: PolicyCounts::default(),
        }
    }
}

impl Counters {
    /// Counts a batch's final verdicts, by reason and action: the one place packets are counted
    /// by their fate, called once per batch after its last stage (the pipeline alone:
    /// [`Pipeline::process`]; the egress stage and a worker's TX: their caller), so a drop a
    /// later stage decides is counted once, under its own reason.
    #[inline]
    pub fn record<'v>(&mut self, verdicts: impl IntoIterator<Item = &'v Verdict>) {
        for v in verdicts {
            self.reasons[v.reason as usize] += 1;
            self.actions[v.action as usize] += 1;
        }
    }

    /// [`Counters::record`] for verdicts that stand for several packets each (a GSO super-frame
    /// counts as the segments it becomes): `(verdict, packets)`.
    #[inline]
    pub fn record_weighted<'v>(&mut self, verdicts: impl IntoIterator<Item = (&'v Verdict, u64)>) {
        for (v, n) in verdicts {
            self.reasons[v.reason as usize] += n;
            self.actions[v.action as usize] += n;
        }
    }

    pub fn add(&mut self, other: &Counters) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.batches += other.batches;
        for (a, b) in self.reasons.iter_mut().zip(other.reasons.iter()) {
            *a += b;
        }
        for (a, b) in self.actions.iter_mut().zip(other.actions.iter()) {
            *a += b;
        }
        self.ct_created += other.ct_created;
        self.ct_expired += other.ct_expired;
        self.icmp_untracked += other.icmp_untracked;
        self.fast_lane += other.fast_lane;
        self.offloaded += other.offloaded;
        self.offloaded_flows += other.offloaded_flows;
        self.direct_routed += other.direct_routed;
        self.policy.add(&other.policy);
    }
}

/// Per-packet scratch of one pass.
#[derive(Clone, Copy, Default)]
struct Slot {
    meta: PacketMeta,
    /// 0: not IP, 1: malformed, 2: IP
    kind: u8,
    /// The frame is a plain IPv4 TCP/UDP one (`parse_plain_v4`): `key` was packed and hashed
    /// by the parse loop, and the fast lane rewrites it at constant offsets from the key and
    /// the other tuple's words (`rewrite_plain_v4_from`).
    plain: bool,
    key: Packed,
    hash: u64,
    /// The entry the key's probe names under its tag (`Conntrack::prefetch_entry`), which
    /// the lookup tries first.
    candidate: Candidate,
    /// Whether conntrack knows the packet's connection; then `found` is what it found (written
    /// in place by `Conntrack::lookup_into`; nothing usable otherwise).
    hit: bool,
    found: Found,
    /// For ICMP errors: the quoted packet, whose connection the error is looked up by.
    quoted: Option<Quoted>,
}

const KIND_NOT_IP: u8 = 0;
const KIND_MALFORMED: u8 = 1;
/// An IP packet with a tuple to look up (whole packets, first fragments, ICMP errors).
const KIND_IP: u8 = 2;
/// A non-first fragment: no ports; decided by its datagram's first fragment.
const KIND_LATER_FRAGMENT: u8 = 3;

/// Scratch of `prepare_new_flows`, per packet of a pass that conntrack does not know: which
/// packet, its frontend key's hash, and the endpoint predicted for it (index into the frontend's
/// endpoints, `NO_PICK` for none) with its route's masquerade flag.
///
/// `reply`, `reply_hash` and `predicted` are by the packet's index in the pass (not by miss):
/// the reply tuple stage 3 built for the predicted endpoint, packed, and its hash, which
/// `new_flow` inserts as they are when it chooses that endpoint (`Miss::prepared`) rather than
/// pack and hash the same tuple again. Valid for the packets whose frontend stage 2 found this pass
/// (`predicted` is reset there); `NO_PICK` when stage 3 built nothing.
struct NewFlowScratch {
    packet: [u16; MAX_BATCH],
    hash: [u64; MAX_BATCH],
    pick: [u32; MAX_BATCH],
    masq: [bool; MAX_BATCH],
    predicted: [u32; MAX_BATCH],
    reply_hash: [u64; MAX_BATCH],
    reply: [Packed; MAX_BATCH],
}

const NO_PICK: u32 = u32::MAX;

/// Words of `Pipeline::created`.
const CREATED_WORDS: usize = 64;

/// Datagrams in flight a worker remembers the first fragment's decision for.
const FRAGMENT_DATAGRAMS: usize = 1024;

/// What every packet of a batch is decided against, passed down as one value: the tables, the
/// batch's clock, and what the established fast lane derives from the clock once per batch.
#[derive(Clone, Copy)]
struct Batch<'a> {
    snap: &'a Snapshot,
    ct: &'a Conntrack,
    now_ms: u64,
    lane: LaneClock,
}

/// A packet conntrack does not know, as `new_flow` takes it: its index in the pass (its packed
/// tuple and that tuple's hash are its scratch's, the lookup's: the insert takes them as they
/// are, read where it needs them rather than copied along), its frontend (`frontend_of`;
/// looked up a stage ahead by `prepare_new_flows`), and whether that stage also prepared its
/// reply tuple (`NewFlowScratch::predicted`: only for a frontend it found this pass).
#[derive(Clone, Copy)]
struct Miss<'s> {
    packet: usize,
    frontend: Option<FrontendRef<'s>>,
    prepared: bool,
}

/// What every insert attempt of one new connection shares (`new_flow`, `insert_remapped`): the
/// packet's index in the pass (its packed tuple is the scratch's), that tuple's hash, its first
/// packet, whether it is masqueraded, and its Service port.
struct NewEntry<'a> {
    packet: usize,
    hash: u64,
    first: &'a FirstPacket,
    masq: bool,
    service_id: u32,
}

/// The reason a new connection's insert failed for, but for a taken reply tuple (remapped).
fn create_failed(e: CreateError) -> Reason {
    match e {
        CreateError::Invalid => Reason::CtInvalid,
        CreateError::Insert(InsertError::Full) => Reason::ConntrackFull,
        CreateError::Insert(InsertError::Exists) => Reason::SnatExhausted,
    }
}

/// A packet of a tracked connection, as `established` takes it: its index in the pass (should
/// it become a new connection: `Miss`) and what the lookup found.
#[derive(Clone, Copy)]
struct Hit<'a> {
    packet: usize,
    found: &'a Found,
}

impl Hit<'_> {
    /// The same packet as a new connection's first (its connection is over: reopened by a SYN
    /// or gone since the lookup).
    fn anew<'s>(&self, snap: &'s Snapshot, meta: &PacketMeta) -> Miss<'s> {
        Miss {
            packet: self.packet,
            frontend: frontend_of(snap, meta),
            prepared: false,
        }
    }
}

/// One worker's pipeline: its RNG, scratch and counters. The tables are passed in per batch.
pub struct Pipeline {
    worker: usize,
    link: LinkType,
    rng: u64,
    scratch: Box<[Slot; MAX_BATCH]>,
    new_scratch: Box<NewFlowScratch>,
    /// A 4096-bit filter of the tuple hashes of connections created during the current pass (a
    /// pass of 256 new connections sets up to 512 bits: at 1024 bits a quarter of the later
    /// packets of such a pass looked conntrack up a second time for nothing).
    created: [u64; CREATED_WORDS],
    /// Whether `created` has a bit set.
    created_any: bool,
    retired: crate::conntrack::Retired,
    fragments: FragmentTable,
    /// Whether plain packets of known connections take the established fast lane (always, but
    /// for tests that compare it with the full path: `set_fast_lane`).
    fast_lane: bool,
    pub counters: Counters,
}

impl Pipeline {
    /// `worker` is this pipeline's index among the threads sharing `ct` (below the count given to
    /// `Conntrack::new`); `seed` seeds endpoint choice.
    pub fn new(worker: usize, link: LinkType, seed: u64, ct: &Conntrack) -> Pipeline {
        Pipeline {
            worker,
            link,
            rng: seed ^ 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(worker as u64 + 1),
            scratch: Box::new([Slot::default(); MAX_BATCH]),
            new_scratch: Box::new(NewFlowScratch {
                packet: [0; MAX_BATCH],
                hash: [0; MAX_BATCH],
                pick: [NO_PICK; MAX_BATCH],
                masq: [false; MAX_BATCH],
                predicted: [NO_PICK; MAX_BATCH],
                reply_hash: [0; MAX_BATCH],
                reply: [[0; 5]; MAX_BATCH],
            }),
            created: [0; CREATED_WORDS],
            created_any: false,
            retired: ct.retired_list(),
            fragments: FragmentTable::new(FRAGMENT_DATAGRAMS),
            fast_lane: true,
            counters: Counters::default(),
        }
    }

    /// With `false`, every packet takes the full path (`established`), as before the fast lane:
    /// for tests that check the lane changes nothing but speed.
    pub fn set_fast_lane(&mut self, on: bool) {
        self.fast_lane = on;
    }

    pub fn link(&self) -> LinkType {
        self.link
    }

    /// Processes `frames` in place, writes one verdict per frame into `verdicts` (which must be
    /// at least as long) and counts them (`Counters::record`): for callers with no stage after
    /// the pipeline. `now_ms` is the time of the batch (monotonic milliseconds).
    pub fn process<F: Frames>(
        &mut self,
        frames: &mut F,
        verdicts: &mut [Verdict],
        snap: &Snapshot,
        ct: &Conntrack,
        now_ms: u64,
    ) {
        let n = frames.count().min(verdicts.len());
        self.decide(frames, verdicts, snap, ct, now_ms);
        self.counters.record(&verdicts[..n]);
    }

    /// `process` without counting the verdicts by reason and action: a later stage (egress, a
    /// worker's TX) may still change them, and the caller counts the final ones once
    /// (`Counters::record`).
    pub fn decide<F: Frames>(
        &mut self,
        frames: &mut F,
        verdicts: &mut [Verdict],
        snap: &Snapshot,
        ct: &Conntrack,
        now_ms: u64,
    ) {
        let batch = Batch {
            snap,
            ct,
            now_ms,
            lane: ct.lane_clock(now_ms),
        };
        let n = frames.count().min(verdicts.len());
        let mut base = 0;
        while base < n {
            let m = (n - base).min(MAX_BATCH);
            ct.enter(self.worker);
            self.pass(frames, base, m, verdicts, &batch);
            ct.leave(self.worker);
            base += m;
        }
        self.counters.batches += 1;
        self.counters.ct_expired += ct.maintain(now_ms, EXPIRY_BUDGET, &mut self.retired) as u64;
    }

    /// Adds this worker's new connections that the shared live count does not have yet (its
    /// maintenance adds them when the clock moves): for a worker that stops or goes idle.
    pub fn flush_conntrack(&mut self, ct: &Conntrack) {
        ct.flush_pending(&mut self.retired);
    }

    /// One pass of at most `MAX_BATCH` frames (`base..base + m` of the batch), one stage at a
    /// time over the whole pass so that the pass's cache misses overlap (at 1M connections a
    /// lookup is two dependent DRAM accesses: slot, then entry): parse, key, prefetch the
    /// entries, look up, prepare the new connections, decide and rewrite.
    fn pass<F: Frames>(
        &mut self,
        frames: &mut F,
        base: usize,
        m: usize,
        verdicts: &mut [Verdict],
        b: &Batch<'_>,
    ) {
        // The pass's bounds, checked once (`process` passes at most `MAX_BATCH` frames of a batch
        // no longer than `verdicts`): with `m` and the verdicts' slice proven here, the stages'
        // `scratch[i]` and `verdicts[i]` (`i < m`) compile without a check of their own.
        assert!(m <= MAX_BATCH);
        let verdicts = &mut verdicts[base..base + m];
        let mut frames = PassFrames::new(frames, base, m);
        self.parse(&frames, m, b.ct);
        self.key_others(m, b.ct);
        self.prefetch_entries(m, b.ct);
        let misses = self.lookup(m, b.ct, b.now_ms);
        // The frontend of every packet conntrack does not know, and what its new connection
        // will touch, prefetched a stage ahead (`prepare_new_flows`). A pass of known
        // connections only (or on a node without Services) does not set up the array at all
        // (its 4 KB of `None`, and the filter's clearing below, were about 25 instructions per
        // packet of est-10k); a packet the array does not cover was not a miss when it was
        // filled: no frontend, as then.
        let mut frontend_buf;
        let frontends: &[Option<FrontendRef<'_>>] = if misses && !b.snap.frontends.is_empty() {
            frontend_buf = [None; MAX_BATCH];
            self.prepare_new_flows(&mut frontend_buf[..m], b.snap, b.ct);
            &frontend_buf[..m]
        } else {
            &[]
        };
        self.decide_all(&mut frames, m, verdicts, frontends, b);
    }

    /// Stage 1, parse: each frame's kind and meta. The common frame (plain IPv4 TCP/UDP on
    /// Ethernet) also has its key packed from the numbers the parse read (not read back from the
    /// meta it just stored), hashed and its conntrack index slot prefetched.
    // The stages index `self.scratch` by the packet (their bodies call `&mut self` methods, so
    // no iterator over the scratch can stay borrowed across them).
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn parse<F: Frames>(&mut self, frames: &PassFrames<'_, F>, m: usize, ct: &Conntrack) {
        for i in 0..m {
            let s = &mut self.scratch[i];
            s.hit = false;
            s.quoted = None;
            let frame = frames.frame(i);
            if self.link == LinkType::Ethernet {
                if let Some(p) = parse_plain_v4(frame, &mut s.meta) {
                    s.kind = KIND_IP;
                    s.plain = true;
                    s.key = Tuple::pack_v4(p.src, p.dst, p.sport, p.dport, p.proto);
                    // Hashed here, from the words in registers (two of them known zeros), not
                    // read back in the key loop: nothing was stored that a load could stall on;
                    // and its slot prefetched a whole parse loop before the entry prefetch reads
                    // it (est-1m and est-10k 1-2 % faster than from the key loop).
                    s.hash = ct.hash(&s.key);
                    ct.prefetch_slot(s.hash);
                    continue;
                }
            }
            s.plain = false;
            s.kind = match parse_into(frame, self.link, &mut s.meta) {
                Ok(true) if s.meta.frag.offset != 0 => KIND_LATER_FRAGMENT,
                Ok(true) => {
                    // An ICMP error belongs to the connection of the packet it quotes, which
                    // travelled the other way.
                    // (The common case decided inline: `parse_quoted` is out of line.)
                    if s.meta.is_icmp_error() {
                        s.quoted = parse_quoted(frame, &s.meta).filter(|q| q.has_ports);
                    }
                    KIND_IP
                }
                Ok(false) => KIND_NOT_IP,
                Err(_) => KIND_MALFORMED,
            };
        }
    }

    /// Stage 1b: the keys of the other IP frames, hashed and their slots prefetched, in a loop
    /// of their own: right after the parse, its wide loads of the fields the parse had just
    /// stored one by one stalled on store forwarding (callgrind); a packet later those stores
    /// have long reached the cache.
    #[inline(always)]
    fn key_others(&mut self, m: usize, ct: &Conntrack) {
        for s in &mut self.scratch[..m] {
            if s.kind != KIND_IP || s.plain {
                continue;
            }
            s.key = match &s.quoted {
                Some(q) => Tuple {
                    src: q.dst,
                    dst: q.src,
                    sport: q.dport,
                    dport: q.sport,
                    proto: q.proto,
                    family: q.family,
                }
                .pack(),
                None => Tuple::from_meta(&s.meta).pack(),
            };
            s.hash = ct.hash(&s.key);
            ct.prefetch_slot(s.hash);
        }
    }

    /// Stage 2: prefetch the conntrack entry each slot names.
    #[inline(always)]
    fn prefetch_entries(&mut self, m: usize, ct: &Conntrack) {
        for s in &mut self.scratch[..m] {
            if s.kind == KIND_IP {
                s.candidate = ct.prefetch_entry(&s.key, s.hash);
            }
        }
    }

    /// Stage 3: look every IP packet's connection up; returns whether any was not found.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn lookup(&mut self, m: usize, ct: &Conntrack, now_ms: u64) -> bool {
        let mut misses = false;
        for i in 0..m {
            let s = &mut self.scratch[i];
            // Protocol 255 (IANA reserved) is the affinity records' pseudo-protocol: never a
            // connection.
            if s.kind == KIND_IP
                && s.key[4] >> 32 & 0xff != crate::conntrack::AFFINITY_PROTO.0 as u64
            {
                s.hit = ct.lookup_into_from(&s.key, s.hash, s.candidate, now_ms, &mut s.found);
            }
            misses |= s.kind == KIND_IP && !s.hit;
        }
        misses
    }

    /// Stage 4, decide and rewrite: the established fast lane for plain packets of known
    /// connections, the full path ([`Pipeline::decide_slow`]) for the rest. A packet may belong
    /// to a connection an earlier packet of this pass created (a SYN and its SYN-ACK, a burst
    /// of one new UDP flow): the lookup is redone for packets whose hash the `created` filter
    /// has seen (cleared only when the pass before set a bit).
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn decide_all<F: Frames>(
        &mut self,
        frames: &mut PassFrames<'_, F>,
        m: usize,
        verdicts: &mut [Verdict],
        frontends: &[Option<FrontendRef<'_>>],
        b: &Batch<'_>,
    ) {
        let (ct, now_ms) = (b.ct, b.now_ms);
        if self.created_any {
            self.created = [0; CREATED_WORDS];
            self.created_any = false;
        }
        let (lane_on, mut lane) = (self.fast_lane, 0u64);
        self.counters.packets += m as u64;
        for i in 0..m {
            let (kind, hash) = (self.scratch[i].kind, self.scratch[i].hash);
            // (`created_any` first: until this pass creates a connection, one test per packet.)
            if self.created_any
                && kind == KIND_IP
                && self.maybe_created(hash)
                && self.scratch[i].key[4] >> 32 & 0xff != crate::conntrack::AFFINITY_PROTO.0 as u64
            {
                let s = &mut self.scratch[i];
                s.hit = ct.lookup_into(&s.key, hash, now_ms, &mut s.found);
            }
            let v = &mut verdicts[i];
            let (buf, len) = frames.frame_mut(i);
            self.counters.bytes += *len as u64;
            // The established fast lane: most packets are plain packets of known connections.
            let s = &self.scratch[i];
            if let (KIND_IP, true, None, true) = (kind, s.hit, &s.quoted, lane_on) {
                if established_lane(buf, s, &s.found, v, b).is_some() {
                    lane += 1;
                    continue;
                }
            }
            self.decide_slow(buf, len, i, kind, v, frontends, b);
        }
        self.counters.fast_lane += lane;
    }

    /// The full path of one packet (`i` of the pass, of `kind`): not IP, malformed, a later
    /// fragment, an ICMP error, a packet of a known connection, or a new connection's first.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn decide_slow(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        i: usize,
        kind: u8,
        v: &mut Verdict,
        frontends: &[Option<FrontendRef<'_>>],
        b: &Batch<'_>,
    ) {
        let (snap, now_ms) = (b.snap, b.now_ms);
        *v = Verdict::default();
        match kind {
            KIND_NOT_IP => v.set(Reason::NotIp),
            KIND_MALFORMED => v.set(Reason::Malformed),
            KIND_LATER_FRAGMENT => {
                let mut meta = self.scratch[i].meta;
                fill_orig(v, &meta);
                self.later_fragment(buf, &mut meta, v, snap, now_ms);
            }
            _ => {
                let mut meta = self.scratch[i].meta;
                fill_orig(v, &meta);
                let found = self.scratch[i].hit.then_some(self.scratch[i].found);
                if let Some(q) = self.scratch[i].quoted {
                    self.icmp_error(buf, &mut meta, &q, found.as_ref(), v, snap);
                    return;
                }
                match found {
                    Some(found) => {
                        let hit = Hit {
                            packet: i,
                            found: &found,
                        };
                        self.established(buf, len, &mut meta, hit, v, b)
                    }
                    None => {
                        let frontend = frontends.get(i).copied().flatten();
                        let miss = Miss {
                            packet: i,
                            frontend,
                            prepared: frontend.is_some(),
                        };
                        self.new_flow(buf, len, &mut meta, miss, v, b)
                    }
                }
                if meta.frag.more {
                    self.remember_first_fragment(&meta, v, now_ms);
                }
            }
        }
    }

    /// Looks up the frontends of a pass's conntrack misses, and prefetches what their new
    /// connections will touch, in stages over the batch so that the misses of one stage overlap
    /// (at 30k Services the frontend table, the endpoint lists and at 1M connections the
    /// conntrack index are far beyond the caches; one after another they cost a new connection
    /// several DRAM accesses):
    ///
    /// 1. hash each frontend key and prefetch its slot (`FrontendTable::prefetch`);
    /// 2. look the frontend up, predict the endpoint `new_flow` will choose and prefetch it;
    /// 3. build the reply tuple that endpoint gives and prefetch its conntrack index slot (the
    ///    tuple, packed, and its hash kept for `new_flow`); then prefetch the entries the batch's
    ///    inserts will take from this worker's allocation cache.
    ///
    /// The prediction runs `new_flow`'s choices (a Maglev lookup, or a draw from a copy of the
    /// random generator), for the common path only (no session affinity, a SYN or a
    /// connectionless first packet, a source the frontend accepts, a non-empty route). It decides nothing: `new_flow` chooses again, in the
    /// same order with the same generator, so a wrong guess (an affinity hit, a remapped source
    /// port, a connection an earlier packet of the batch created) only wastes a prefetch.
    fn prepare_new_flows<'s>(
        &mut self,
        frontends: &mut [Option<FrontendRef<'s>>],
        snap: &'s Snapshot,
        ct: &Conntrack,
    ) {
        if snap.frontends.is_empty() {
            return;
        }
        let nf = &mut *self.new_scratch;
        // 1. Hash and prefetch the slot.
        let mut n = 0;
        for (i, s) in self.scratch[..frontends.len()].iter().enumerate() {
            if s.kind == KIND_IP && !s.hit && s.quoted.is_none() && s.meta.l4_off != 0 {
                let h = FrontendTable::hash(&frontend_key(&s.meta));
                snap.frontends.prefetch(h);
                nf.hash[n] = h;
                nf.packet[n] = i as u16;
                n += 1;
            }
        }
        // 2. Look up; predict the endpoint and prefetch it.
        let mut rng = self.rng;
        for k in 0..n {
            let meta = &self.scratch[nf.packet[k] as usize].meta;
            nf.pick[k] = NO_PICK;
            let Some(fe) = snap.frontends.find(nf.hash[k], &frontend_key(meta)) else {
                continue;
            };
            frontends[nf.packet[k] as usize] = Some(fe);
            nf.predicted[nf.packet[k] as usize] = NO_PICK;
            if fe.has_affinity()
                || fe
                    .source_ranges()
                    .is_some_and(|r| !r.contains(&meta.src, meta.family))
                || (meta.proto == IpProto::TCP
                    && meta.tcp_flags & (tcp::SYN | tcp::ACK | tcp::RST) != tcp::SYN)
            {
                continue;
            }
            let route = fe.route(snap.classify_source(&meta.src, meta.family));
            if route.endpoints.is_empty() {
                continue;
            }
            let j = route.endpoints.start as usize
                + match fe.maglev().and_then(|m| m.pick(route.endpoints, meta)) {
                    Some(p) => p,
                    None => pick_index(&mut rng, route.endpoints.len as usize),
                };
            if let Some(ep) = fe.endpoints().get(j) {
                // A 20-byte endpoint straddles two lines about a third of the time: its first
                // and its last byte in use (`local`, the same line but for a straddle).
                kxdp_packet::prefetch::prefetch(ep);
                kxdp_packet::prefetch::prefetch(&ep.local);
                nf.pick[k] = j as u32;
                nf.masq[k] = route.masquerade;
            }
        }
        // 3. The reply tuple's index slot, and the entries the inserts will take. The tuple,
        // packed, and its hash are kept for `new_flow` (which would otherwise build both again).
        let mut inserts = 0;
        for k in 0..n {
            if nf.pick[k] == NO_PICK {
                continue;
            }
            let i = nf.packet[k] as usize;
            let (Some(fe), meta) = (frontends[i], &self.scratch[i].meta) else {
                continue;
            };
            let ep = fe.endpoints()[nf.pick[k] as usize];
            let mut reply = Tuple::reply_from_backend(meta, ep.addr, ep.port);
            if nf.masq[k] || ep.addr == meta.src {
                match snap.node.snat_addr(meta.family) {
                    Some(node) => reply.dst = node,
                    None => continue,
                }
            }
            let key = reply.pack();
            let hash = ct.hash(&key);
            ct.prefetch_slot(hash);
            (nf.reply[i], nf.reply_hash[i], nf.predicted[i]) = (key, hash, nf.pick[k]);
            inserts += 1;
        }
        ct.prefetch_allocations(&self.retired, inserts);
    }

    /// A packet of a tracked connection: translated as the connection is.
    fn established(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        meta: &mut PacketMeta,
        hit: Hit<'_>,
        v: &mut Verdict,
        b: &Batch<'_>,
    ) {
        let found = hit.found;
        let Batch {
            snap, ct, now_ms, ..
        } = *b;
        // A SYN on a connection that is over starts a new one on the same tuple.
        if meta.proto == IpProto::TCP
            && found.dir == DIR_ORIG
            && meta.tcp_flags & (tcp::SYN | tcp::ACK) == tcp::SYN
            && tcp_state_of(found.state).allows_reopen()
        {
            ct.kill(found.idx);
            // Fall through to a new connection; the tuple is free again.
            return self.new_flow(buf, len, meta, hit.anew(snap, meta), v, b);
        }
        // The connection's endpoint has left its Service for good (`stale::reconcile`): the
        // client's packet is answered with a RST and the connection removed, so a client whose
        // backend vanished without closing learns it now. (A client's RST is let through: it
        // ends the connection anyway. The backend's packets, if it still sends, pass as ever.)
        if found.state & FLAG_BACKEND_GONE != 0
            && found.dir == DIR_ORIG
            && meta.proto == IpProto::TCP
            && meta.tcp_flags & tcp::RST == 0
        {
            ct.kill(found.idx);
            v.service_id = found.service_id;
            return self.reject(buf, len, meta, v, Reason::BackendGone);
        }
        // After a RST nothing but a new SYN (above) or another RST belongs to the connection.
        if meta.proto == IpProto::TCP
            && tcp_state_of(found.state) == tcp::TcpState::Close
            && meta.tcp_flags & tcp::RST == 0
        {
            return v.set(Reason::CtInvalid);
        }
        let Ok(first) = first_packet(buf, meta) else {
            return v.set(Reason::CtInvalid);
        };
        let state = match ct.on_packet(found, first, meta.ip_len as u64, now_ms) {
            Ok(state) => state,
            Err(PacketError::Invalid) => return v.set(Reason::CtInvalid),
            Err(PacketError::Gone) => {
                // The connection ended between lookup and now (expired, flushed): a new one.
                return self.new_flow(buf, len, meta, hit.anew(snap, meta), v, b);
            }
        };
        let other = found.other_tuple();
        if found.dir == DIR_REPLY {
            v.client = other.src;
        }
        // The packet leaves as the other direction's tuple, reversed.
        let to = other.reversed();
        let translated = to.src != meta.src
            || to.dst != meta.dst
            || to.sport != meta.sport
            || to.dport != meta.dport;
        if translated {
            rewrite_into(buf, meta, v, to.src, to.sport, to.dst, to.dport);
        } else {
            fill_out(v, meta);
        }
        v.masq = state & FLAG_MASQ != 0;
        v.service_id = found.service_id;
        v.set(if !translated && found.service_id == 0 {
            // A pod connection tracked as is (`track_as_is`): forwarded unchanged, as ever.
            Reason::Direct
        } else if found.dir == DIR_ORIG {
            Reason::Established
        } else {
            Reason::ReplyUnnat
        });
    }

    /// A packet no connection knows (`miss`: its tuple's hash and its frontend).
    fn new_flow(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        meta: &mut PacketMeta,
        miss: Miss<'_>,
        v: &mut Verdict,
        b: &Batch<'_>,
    ) {
        let Batch {
            snap, ct, now_ms, ..
        } = *b;
        let Miss {
            packet,
            frontend,
            prepared,
        } = miss;
        let hash = self.scratch[packet].hash;
        let family = meta.family;
        let Some(fe) = frontend else {
            return self.not_a_frontend(buf, len, meta, hash, v, b);
        };
        // What the frontend table keeps in the frontend's hot line: the Service port record is
        // not read (a cache miss of its own at 30k Services); the affinity timeout and source
        // ranges only when the frontend has them.
        let service_id = fe.service_id();
        let affinity_timeout_s = fe.affinity_timeout_s();
        v.service_id = service_id;
        if let Some(ranges) = fe.source_ranges() {
            if !ranges.contains(&meta.src, family) {
                return v.set(Reason::SourceRange);
            }
        }
        let class = snap.classify_source(&meta.src, family);
        let route = fe.route(class);
        if route.endpoints.is_empty() {
            return match route.when_empty {
                EmptyAction::Reject => self.reject(buf, len, meta, v, Reason::NoEndpoints),
                EmptyAction::Drop => v.set(Reason::NoLocalEndpoints),
            };
        }
        // Only a SYN opens a TCP connection to a Service. Anything else without a connection is
        // a connection whose state is gone (mid-stream after a start without the state file, a
        // flush, a failover): answered with a RST, so the client ends it now rather than
        // retransmitting until its timeout (its backend, still sending, is reset by the client's
        // stack). A stray RST is only dropped. (After the empty-route check: a Service with no
        // endpoints at all answers every TCP packet with a RST as `no-endpoints`.)
        // A Maglev Service instead picks such a packet (an ACK without SYN) up: its table gives
        // the endpoint the connection's SYN got, whichever node saw it (ECMP moved the flow, or
        // this node restarted without its state).
        if meta.proto == IpProto::TCP
            && meta.tcp_flags & (tcp::SYN | tcp::ACK | tcp::RST) != tcp::SYN
            && !(meta.tcp_flags & (tcp::SYN | tcp::ACK | tcp::RST) == tcp::ACK
                && fe
                    .maglev()
                    .is_some_and(|m| m.table(route.endpoints).is_some()))
        {
            if meta.tcp_flags & tcp::RST != 0 {
                return v.set(Reason::CtInvalid);
            }
            return self.reject(buf, len, meta, v, Reason::CtLost);
        }
        let Ok(first) = first_packet(buf, meta) else {
            return v.set(Reason::CtInvalid);
        };
        let eps = fe.endpoints_of(route.endpoints);

        // Endpoint: the client's affinity record if it still names an eligible endpoint, else
        // the one the Service's Maglev table gives the 5-tuple, else a uniformly random one.
        let mut chosen = None;
        if affinity_timeout_s > 0 {
            if let Some((addr, port, idx)) = ct.affinity_get(service_id, &meta.src, family, now_ms)
            {
                if let Some(ep) = eps.iter().find(|e| e.addr == addr && e.port == port) {
                    ct.affinity_touch(idx, affinity_timeout_s, now_ms);
                    chosen = Some(*ep);
                } else {
                    ct.kill(idx);
                }
            }
        }
        let (ep, record, picked) = match chosen {
            Some(ep) => (ep, false, None),
            None => {
                let p = match fe.maglev().and_then(|m| m.pick(route.endpoints, meta)) {
                    Some(p) if p < eps.len() => p,
                    _ => self.pick(eps.len()),
                };
                (eps[p], affinity_timeout_s > 0, Some(p as u32))
            }
        };
        // NetworkPolicy judges the connection as the backend sees it: to the chosen endpoint, from
        // the client's own address (before any masquerade). A denied connection leaves no state,
        // not even an affinity record.
        let decision = snap.policy.judge_counted(
            &meta.src,
            &ep.addr,
            meta.proto,
            ep.port,
            &mut self.counters.policy,
        );
        if decision != Decision::Allow {
            return policy_deny(v, meta, decision);
        }
        if record {
            // Without room for the record the connection still goes ahead, unpinned.
            let _ = ct.affinity_set(
                service_id,
                &meta.src,
                family,
                (ep.addr, ep.port),
                affinity_timeout_s,
                now_ms,
                hash,
            );
        }

        // Masquerade: when the route says so, and always for a pod sent to itself (hairpin), or
        // its reply would bypass us.
        let masq = route.masquerade || ep.addr == meta.src;
        let mut reply = Tuple::reply_from_backend(meta, ep.addr, ep.port);
        if masq {
            let Some(node) = snap.node.snat_addr(family) else {
                return v.set(Reason::NoNodeAddress);
            };
            reply.dst = node;
        }
        // The reply tuple must be unique. Without masquerade it clashes only when the client
        // reaches one backend through two frontends from the same port; then, as the kernel's NAT
        // does, the source port is remapped (the address is kept), up to `SNAT_ATTEMPTS` times
        // (`insert_remapped`, out of line). The insert itself checks the reply tuple
        // (`InsertError::Exists`), before it takes anything: no separate lookup first.
        let entry = NewEntry {
            packet,
            hash,
            first: &first,
            masq,
            service_id,
        };
        // The first attempt's reply tuple, packed, and its hash are the ones `prepare_new_flows`
        // built when this is the endpoint it predicted (the same frontend, route and packet give
        // the same tuple): not packed and hashed again.
        let packed;
        let (reply_key, reply_hash) = if prepared
            && picked.map(|p| route.endpoints.start + p) == Some(self.new_scratch.predicted[packet])
        {
            let nf = &self.new_scratch;
            (&nf.reply[packet], nf.reply_hash[packet])
        } else {
            packed = reply.pack();
            (&packed, ct.hash(&packed))
        };
        let inserted = ct.create_hashed(
            &mut self.retired,
            &self.scratch[packet].key,
            reply_key,
            entry.first,
            masq,
            service_id,
            now_ms,
            (hash, reply_hash),
        );
        let reply_hash = match inserted {
            Ok(_) => reply_hash,
            Err(CreateError::Insert(InsertError::Exists)) => {
                match self.insert_remapped(&entry, &mut reply, ct, now_ms) {
                    Ok(reply_hash) => reply_hash,
                    Err(reason) => return v.set(reason),
                }
            }
            Err(e) => return v.set(create_failed(e)),
        };
        self.counters.ct_created += 1;
        self.note_created(hash);
        self.note_created(reply_hash);
        rewrite_into(buf, meta, v, reply.dst, reply.dport, reply.src, reply.sport);
        v.masq = masq;
        v.set(Reason::ServiceDnat);
    }

    /// `new_flow`'s insert after its reply tuple was taken (before, or by another worker since):
    /// the source port remapped, up to `SNAT_ATTEMPTS` times; the reply tuple's hash, or why the
    /// connection is refused. Out of line: rare, and inlined, its loop's invariant halves of the
    /// pack and hash were computed ahead of every first attempt.
    #[cold]
    #[inline(never)]
    fn insert_remapped(
        &mut self,
        entry: &NewEntry<'_>,
        reply: &mut Tuple,
        ct: &Conntrack,
        now_ms: u64,
    ) -> Result<u64, Reason> {
        let mut remaps = 0;
        loop {
            if remaps == SNAT_ATTEMPTS || !reply.proto.has_ports() {
                return Err(Reason::SnatExhausted);
            }
            reply.dport = 1024 + (self.next_u64() % (65536 - 1024)) as u16;
            remaps += 1;
            let reply_key = reply.pack();
            let reply_hash = ct.hash(&reply_key);
            match ct.create_hashed(
                &mut self.retired,
                &self.scratch[entry.packet].key,
                &reply_key,
                entry.first,
                entry.masq,
                entry.service_id,
                now_ms,
                (entry.hash, reply_hash),
            ) {
                Ok(_) => return Ok(reply_hash),
                Err(CreateError::Insert(InsertError::Exists)) => continue,
                Err(e) => return Err(create_failed(e)),
            }
        }
    }

    /// An ICMP/ICMPv6 error quoting a packet of a tracked connection is translated like a packet
    /// of that connection travelling the same way: outer addresses, the quoted header's addresses
    /// and ports, and every checksum, so the client sees the error about the packet it sent (a
    /// PMTU error from a backend reaches the client quoting the Service address). An error that
    /// matches no connection is handled by its own addresses, except that one addressed to a
    /// Service address is dropped (`icmp-error-untracked`): nothing behind it sent anything.
    fn icmp_error(
        &mut self,
        buf: &mut [u8],
        meta: &mut PacketMeta,
        q: &Quoted,
        found: Option<&Found>,
        v: &mut Verdict,
        snap: &Snapshot,
    ) {
        let Some(found) = found else {
            self.counters.icmp_untracked += 1;
            fill_out(v, meta);
            return v.set(untranslatable(snap, meta, Reason::IcmpErrorUntracked));
        };
        // `matched` is the quoted packet reversed: the direction the error travels in.
        let other = found.other_tuple();
        let to = other.reversed();
        let from_peer = meta.src == q.dst;
        let rw = ErrorRewrite {
            // The error comes from the connection's far end itself, or from a router on the way
            // (whose address stays).
            outer_src: if from_peer { to.src } else { meta.src },
            outer_dst: to.dst,
            inner_src: to.dst,
            inner_sport: to.dport,
            inner_dst: to.src,
            inner_dport: to.sport,
        };
        rewrite_icmp_error(buf, meta, q, &rw);
        fill_out(v, meta);
        // The quoted packet reversed matched the connection in `found.dir`.
        v.client = if found.dir == DIR_ORIG {
            q.dst
        } else {
            other.src
        };
        v.masq = found.state & FLAG_MASQ != 0;
        v.service_id = found.service_id;
        v.set(Reason::IcmpRelated);
    }

    /// Remembers a first fragment's outcome for the rest of its datagram.
    fn remember_first_fragment(&mut self, meta: &PacketMeta, v: &Verdict, now_ms: u64) {
        let mut first = *meta;
        first.src = v.orig_src;
        first.dst = v.orig_dst;
        let action = match v.action {
            Action::Reject => Action::Drop, // the answer went out once, for the first fragment
            a => a,
        };
        self.fragments.insert(
            FragmentTable::key(&first),
            now_ms,
            FragDecision {
                action,
                reason: v.reason,
                src: meta.src,
                dst: meta.dst,
                masq: v.masq,
                service_id: v.service_id,
            },
        );
    }

    /// A non-first fragment: translated and judged as its datagram's first fragment was. One that
    /// comes before its first fragment (or after the table forgot it) cannot be translated: to a
    /// Service address it is dropped (`fragment-no-state`), else handled by its addresses.
    fn later_fragment(
        &mut self,
        buf: &mut [u8],
        meta: &mut PacketMeta,
        v: &mut Verdict,
        snap: &Snapshot,
        now_ms: u64,
    ) {
        match self.fragments.get(&FragmentTable::key(meta), now_ms) {
            Some(d) => {
                if d.action == Action::Forward && (d.src != meta.src || d.dst != meta.dst) {
                    rewrite(buf, meta, d.src, 0, d.dst, 0);
                }
                fill_out(v, meta);
                v.masq = d.masq;
                v.service_id = d.service_id;
                v.reason = d.reason;
                v.action = d.action;
            }
            None => {
                fill_out(v, meta);
                v.set(untranslatable(snap, meta, Reason::FragmentNoState))
            }
        }
    }

    /// Traffic that is not for a Service frontend.
    fn not_a_frontend(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        meta: &mut PacketMeta,
        hash: u64,
        v: &mut Verdict,
        b: &Batch<'_>,
    ) {
        let Batch {
            snap, ct, now_ms, ..
        } = *b;
        fill_out(v, meta);
        if snap.cluster_ips.contains(&meta.dst) {
            return self.reject(buf, len, meta, v, Reason::ServicePortUnknown);
        }
        if snap.service_cidrs.contains(&meta.dst, meta.family) {
            return v.set(Reason::ServiceIpUnallocated);
        }
        if snap.node.is_node_addr(&meta.dst) {
            return v.set(Reason::ToNode);
        }
        // Traffic of a pod on this node: NetworkPolicy, then tracked as is, so that its replies
        // and later packets pass statefully, whatever policies say by then (docs/policy.md).
        let policy = &snap.policy;
        if !policy.is_local_pod(&meta.src) && !policy.is_local_pod(&meta.dst) {
            return v.set(Reason::Direct);
        }
        let decision = policy.judge_counted(
            &meta.src,
            &meta.dst,
            meta.proto,
            meta.dport,
            &mut self.counters.policy,
        );
        if decision != Decision::Allow {
            return policy_deny(v, meta, decision);
        }
        self.track_as_is(buf, meta, hash, ct, now_ms);
        v.set(Reason::Direct)
    }

    /// Tracks an allowed pod connection without translation (both tuples the packet's own):
    /// TCP from a SYN, UDP, SCTP (from an INIT), ICMP echo. Without room in the table, or for
    /// anything else, the packet goes on untracked and the next one is judged anew.
    fn track_as_is(
        &mut self,
        buf: &[u8],
        meta: &PacketMeta,
        hash: u64,
        ct: &Conntrack,
        now_ms: u64,
    ) {
        let trackable = match meta.proto {
            IpProto::TCP => meta.tcp_flags & (tcp::SYN | tcp::ACK | tcp::RST) == tcp::SYN,
            IpProto::UDP | IpProto::SCTP => true,
            _ => meta.is_icmp_echo_request(),
        };
        if !trackable || meta.l4_off == 0 {
            return;
        }
        let Ok(first) = first_packet(buf, meta) else {
            return;
        };
        let orig = Tuple::from_meta(meta);
        let reply = orig.reversed();
        if ct
            .create_with(
                &mut self.retired,
                &orig,
                &reply,
                first,
                false,
                0,
                now_ms,
                hash,
            )
            .is_ok()
        {
            self.counters.ct_created += 1;
            self.note_created(hash);
            self.note_created(ct.hash(&reply.pack()));
        }
    }

    /// Answers in the packet's place: TCP RST for TCP, ICMP(v6) port unreachable otherwise. An
    /// ICMP error is never answered with another (RFC 1122 3.2.2): it is dropped instead.
    fn reject(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        meta: &PacketMeta,
        v: &mut Verdict,
        reason: Reason,
    ) {
        v.set(reason);
        if meta.is_icmp_error() {
            v.action = Action::Drop;
            return;
        }
        let reply_len = if meta.proto == IpProto::TCP {
            build_tcp_rst(buf, *len, self.link, meta)
        } else {
            build_port_unreachable(buf, *len, self.link, meta)
        };
        if reply_len == 0 {
            // Nothing may answer this packet (a RST, a fragment, a multicast destination): the
            // reason stands, the packet is dropped.
            v.action = Action::Drop;
            return;
        }
        *len = reply_len;
        v.src = meta.dst;
        v.sport = if meta.proto == IpProto::TCP {
            meta.dport
        } else {
            0
        };
        v.dst = meta.src;
        v.dport = if meta.proto == IpProto::TCP {
            meta.sport
        } else {
            0
        };
    }

    #[inline]
    fn note_created(&mut self, hash: u64) {
        let bit = (hash >> 52) as usize; // 12 bits: 0..4096
        self.created[bit >> 6] |= 1 << (bit & 63);
        self.created_any = true;
    }

    #[inline]
    fn maybe_created(&self, hash: u64) -> bool {
        let bit = (hash >> 52) as usize;
        self.created[bit >> 6] & (1 << (bit & 63)) != 0
    }

    #[inline]
    fn next_u64(&mut self) -> u64 {
        wyrand(&mut self.rng)
    }

    #[inline]
    fn pick(&mut self, n: usize) -> usize {
        pick_index(&mut self.rng, n)
    }
}

/// The established fast lane (Katran/Cilium style: a known connection is a lookup and a
/// rewrite): a plain packet of a tracked connection — TCP without SYN, FIN or RST on an
/// established connection, or UDP of an assured stream; not an ICMP error, not a fragment — is
/// translated straight from the packed words of the entry's other tuple, its entry refreshed
/// with the fewest stores (`Conntrack::on_plain_packet`), and its verdict written once. Returns
/// the reason, with every effect `Pipeline::established` would have had (the same verdict, the
/// same bytes, the same entry); None, having changed nothing, for any other packet, which then
/// takes the full path.
#[inline(always)]
fn established_lane(
    buf: &mut [u8],
    s: &Slot,
    found: &Found,
    v: &mut Verdict,
    b: &Batch<'_>,
) -> Option<Reason> {
    let meta = &s.meta;
    if meta.frag.is_fragment {
        return None;
    }
    // The verdict's fields that come from the meta, written first, while the parse's values are
    // at hand: held across the rewrite, they went through the stack (the decide loop has no free
    // register). A packet the lane declines gets its
    // verdict written whole by the full path. Every field of `Verdict` is written here or below.
    v.action = Action::Forward;
    fill_orig_packet(v, meta);
    v.egress = 0;
    let state =
        b.ct.on_plain_packet(found, meta.tcp_flags, meta.ip_len as u64, &b.lane)?;
    v.masq = state & FLAG_MASQ != 0;
    // Packed tuples: [src high, src low, dst high, dst low, ports | proto | family]; the packet
    // leaves as the other tuple reversed, from that tuple's destination to its source.
    let key = &s.key;
    let other = found.other();
    let out_ports = (found.other_last >> 16 & 0xffff) | (found.other_last & 0xffff) << 16;
    // Untranslated: the other tuple is the key reversed. (An IPv4 connection's addresses are
    // compared in one word: the other tuple's, halves swapped, against the key's.)
    let translated = out_ports != key[4] & 0xffff_ffff
        || if found.is_v4() {
            found.other_addrs.rotate_left(32) != addr_word(key)
        } else {
            other[2] != key[0] || other[3] != key[1] || other[0] != key[2] || other[1] != key[3]
        };
    let (sport, dport) = (out_ports as u16, (out_ports >> 16) as u16);
    // (The connection's protocol is the packet's: taken from the other tuple's word, which stays
    // in a register for the ports, rather than from the meta.)
    let proto = found.proto();
    // What the general rewrite left, for the rare frame the word rewrites refuse: the verdict
    // reports it instead of the other tuple. (The addresses are made from the words only where
    // the verdict is written: held across the rewrite, they went through the stack.)
    let mut general = None;
    if translated {
        // IPv4 from the words themselves (a v4-mapped address's low 32 bits); anything the
        // word rewrite refuses (IPv6, or a meta that does not fit) through the general one.
        let (out_src, out_dst) = (other[3] as u32, other[1] as u32);
        let words = if s.plain {
            // The checksum deltas from the key the lookup compared (what the parse read from
            // this frame) and the words of the other tuple: nothing read back from the frame.
            let was = PlainV4 {
                src: key[1] as u32,
                dst: key[3] as u32,
                sport: key[4] as u16,
                dport: (key[4] >> 16) as u16,
                proto,
            };
            let to = PlainV4 {
                src: out_src,
                dst: out_dst,
                sport,
                dport,
                proto,
            };
            rewrite_plain_v4_from(buf, &was, &to)
        } else {
            rewrite_v4_ports(buf, meta, out_src, sport, out_dst, dport)
        };
        if words.is_err() {
            let mut m = *meta;
            let (src, dst) = (
                addr_of_words(other[2], other[3]),
                addr_of_words(other[0], other[1]),
            );
            rewrite(buf, &mut m, src, sport, dst, dport);
            general = Some(m);
        }
    }
    let reason = if !translated && found.service_id == 0 {
        // A pod connection tracked as is (`track_as_is`): forwarded unchanged, as ever.
        Reason::Direct
    } else if found.dir == DIR_ORIG {
        Reason::Established
    } else {
        Reason::ReplyUnnat
    };
    v.reason = reason;
    v.src = addr_of_words(other[2], other[3]);
    v.sport = sport;
    v.dst = addr_of_words(other[0], other[1]);
    v.dport = dport;
    v.service_id = found.service_id;
    v.client = if found.dir == DIR_REPLY {
        addr_of_words(other[0], other[1])
    } else {
        meta.src
    };
    if let Some(m) = &general {
        fill_out(v, m);
    }
    Some(reason)
}

/// Rewrites the packet to `src`:`sport` → `dst`:`dport` (`kxdp_packet::rewrite`) and writes
/// where it leaves into the verdict (`fill_out` after the rewrite). A whole IPv4 TCP or UDP
/// packet — nearly every new connection's — takes the fast lane's `rewrite_v4_ports`: the same
/// bytes, without `try_rewrite`'s dispatch over families and protocols; `meta` then keeps the
/// old values (only a fragment, which that rewrite refuses, needs them updated afterwards:
/// `remember_first_fragment`). Anything else, and a `meta` that does not fit the frame (left
/// untouched, and so reported in the verdict), through `rewrite`.
#[inline(always)]
fn rewrite_into(
    buf: &mut [u8],
    meta: &mut PacketMeta,
    v: &mut Verdict,
    src: Addr,
    sport: u16,
    dst: Addr,
    dport: u16,
) {
    let v4 = |a: Addr| u32::from_be_bytes(a.v4_octets());
    if rewrite_v4_ports(buf, meta, v4(src), sport, v4(dst), dport).is_ok() {
        (v.src, v.sport, v.dst, v.dport) = (src, sport, dst, dport);
    } else {
        rewrite(buf, meta, src, sport, dst, dport);
        fill_out(v, meta);
    }
}

/// An address from the two words a packed tuple keeps it in.
#[inline(always)]
fn addr_of_words(high: u64, low: u64) -> Addr {
    Addr(((high as u128) << 64 | low as u128).to_be_bytes())
}

/// The next number of the wyrand generator whose state is `state`.
#[inline]
fn wyrand(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0xa076_1d64_78bd_642f);
    let t = (*state as u128).wrapping_mul((*state ^ 0xe703_7ed1_a0b4_28db) as u128);
    (t >> 64) as u64 ^ t as u64
}

/// A uniform index below `n` (multiply-shift) from the generator `state`.
#[inline]
fn pick_index(state: &mut u64, n: usize) -> usize {
    ((wyrand(state) as u128 * n as u128) >> 64) as usize
}

/// The frontend key a packet is addressed to (for packets with ports or ICMP ids).
#[inline(always)]
fn frontend_key(meta: &PacketMeta) -> FrontendKey {
    FrontendKey {
        addr: meta.dst,
        port: meta.dport,
        proto: meta.proto,
    }
}

/// The frontend a packet is addressed to, if any (only packets with ports or ICMP ids have one).
#[inline]
fn frontend_of<'s>(snap: &'s Snapshot, meta: &PacketMeta) -> Option<FrontendRef<'s>> {
    if meta.l4_off == 0 {
        return None;
    }
    snap.frontend_ref(&frontend_key(meta))
}

/// Where a packet kxdp cannot translate (an ICMP error quoting no connection, a later fragment
/// without its first) goes by its destination alone: to a Service address it is dropped with
/// `at_service` (nothing behind that address can use it); to the node it is passed; anything else
/// is forwarded unchanged.
#[inline]
fn untranslatable(snap: &Snapshot, meta: &PacketMeta, at_service: Reason) -> Reason {
    if snap.cluster_ips.contains(&meta.dst) || snap.service_cidrs.contains(&meta.dst, meta.family) {
        at_service
    } else if snap.node.is_node_addr(&meta.dst) {
        Reason::ToNode
    } else {
        Reason::Direct
    }
}

/// What conntrack needs of a packet: TCP flags, and for SCTP its chunks (an SCTP packet whose
/// chunks break RFC 9260's bundling rules, or whose CRC32c is wrong, is invalid: NAT recomputes
/// the checksum, so a corrupted packet must not leave with a valid one).
#[inline(always)]
fn first_packet(buf: &[u8], meta: &PacketMeta) -> Result<FirstPacket, ()> {
    if meta.proto != IpProto::SCTP || meta.l4_off == 0 {
        return Ok(FirstPacket {
            tcp_flags: meta.tcp_flags,
            bytes: meta.ip_len as u64,
            sctp: None,
        });
    }
    first_sctp_packet(buf, meta)
}

/// `first_packet` of an SCTP packet (out of line: the common case was a call of its own, 22
/// instructions per new connection, for a test of two fields).
#[inline(never)]
fn first_sctp_packet(buf: &[u8], meta: &PacketMeta) -> Result<FirstPacket, ()> {
    let sctp = buf.get(meta.l4_off as usize..meta.ip_end()).ok_or(())?;
    let summary = if meta.frag.more {
        kxdp_packet::sctp::summarize_prefix(sctp)
    } else {
        if !kxdp_packet::sctp::Packet::new_unchecked(sctp).verify_checksum() {
            return Err(());
        }
        kxdp_packet::sctp::summarize(sctp)
    }
    .map_err(|_| ())?;
    Ok(FirstPacket {
        tcp_flags: 0,
        bytes: meta.ip_len as u64,
        sctp: Some(summary),
    })
}

/// Drops a new connection policy denies (the rules that denied it are counted by the
/// judgement).
#[inline]
fn policy_deny(v: &mut Verdict, meta: &PacketMeta, decision: Decision) {
    fill_out(v, meta);
    v.set(match decision {
        Decision::DenyEgress(_) => Reason::PolicyDeniedEgress,
        _ => Reason::PolicyDeniedIngress,
    });
}

#[inline]
fn fill_orig(v: &mut Verdict, m: &PacketMeta) {
    fill_orig_packet(v, m);
    v.client = m.src;
}

/// The verdict's fields that describe the packet as it arrived (`client` aside: the lane writes
/// it once it knows the packet's direction).
#[inline(always)]
fn fill_orig_packet(v: &mut Verdict, m: &PacketMeta) {
    v.has_addrs = true;
    v.family = m.family;
    v.proto = m.proto;
    v.orig_src = m.src;
    v.orig_sport = m.sport;
    v.orig_dst = m.dst;
    v.orig_dport = m.dport;
    v.l3_off = m.l3_off;
    v.l4_off = m.l4_off;
    v.ip_len = m.ip_len;
    v.fragment = m.frag.is_fragment;
}

#[inline]
fn fill_out(v: &mut Verdict, m: &PacketMeta) {
    v.src = m.src;
    v.sport = m.sport;
    v.dst = m.dst;
    v.dport = m.dport;
}

/// Frames held in one contiguous buffer of fixed-size slots (tests, criterion benchmarks, the fuzz
/// target, `kxdp run --inject-pcap`; the replay runs the workers' `UmemBatch`).
pub struct SlotFrames {
    buf: Vec<u8>,
    lens: Vec<usize>,
    slot: usize,
    count: usize,
}

impl SlotFrames {
    /// `slots` frames of `slot_size` bytes each.
    pub fn new(slots: usize, slot_size: usize) -> SlotFrames {
        let bytes = slots.checked_mul(slot_size).expect("frame slots overflow");
        SlotFrames {
            buf: vec![0; bytes],
            lens: vec![0; slots],
            slot: slot_size,
            count: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.lens.len()
    }

    pub fn slot_size(&self) -> usize {
        self.slot
    }

    pub fn clear(&mut self) {
        self.count = 0;
    }

    /// Copies a frame into the next slot (truncated to the slot size); false when full.
    #[inline]
    pub fn push(&mut self, data: &[u8]) -> bool {
        if self.count == self.lens.len() {
            return false;
        }
        let n = data.len().min(self.slot);
        let off = self.count * self.slot;
        copy_frame(&mut self.buf[off..][..n], &data[..n]);
        self.lens[self.count] = n;
        self.count += 1;
        true
    }

    /// Receives frames straight into the free slots after a `clear`: `read(i, slot)` writes
    /// frame `i` into its slot and returns its length, or None when there is no more. Stops
    /// when the slots are full; returns the frame count.
    #[inline]
    pub fn receive(&mut self, mut read: impl FnMut(usize, &mut [u8]) -> Option<usize>) -> usize {
        while self.count < self.lens.len() {
            let off = self.count * self.slot;
            let Some(n) = read(self.count, &mut self.buf[off..][..self.slot]) else {
                break;
            };
            self.lens[self.count] = n.min(self.slot);
            self.count += 1;
        }
        self.count
    }

    // `[off..][..len]`: two length checks and no overflow check of `off + len`.
    pub fn get(&self, i: usize) -> &[u8] {
        &self.buf[i * self.slot..][..self.lens[i]]
    }
}

/// `dst.copy_from_slice(src)` (equal lengths) for frames of any length, with the short frames of
/// a fast path (16 to 128 bytes) copied as two fixed-size blocks that may overlap, which compile
/// to a few vector moves: a variable-length copy is a `memmove` call per frame, 20 % of the
/// replay baseline's samples.
#[inline(always)]
pub(crate) fn copy_frame(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    macro_rules! two_blocks {
        ($w:literal) => {{
            dst[..$w].copy_from_slice(&src[..$w]);
            dst[n - $w..].copy_from_slice(&src[n - $w..]);
        }};
    }
    match n {
        16..=32 => two_blocks!(16),
        33..=64 => two_blocks!(32),
        65..=128 => two_blocks!(64),
        _ => dst.copy_from_slice(src),
    }
}

// SAFETY (of the trait's promise): `count` changes only in `push`, `receive` and `clear`.
#[allow(unsafe_code)]
unsafe impl Frames for SlotFrames {
    #[inline]
    fn count(&self) -> usize {
        self.count
    }

    #[inline]
    fn frame_mut(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        let off = i * self.slot;
        (&mut self.buf[off..][..self.slot], &mut self.lens[i])
    }

    #[inline]
    fn frame(&self, i: usize) -> &[u8] {
        self.get(i)
    }

    // The unchecked forms rest on what `new`, `push` and `receive` keep: `buf.len() == lens.len() * slot`
    // (`new`, its product checked), `count <= lens.len()` (`push` and `receive` stop at full). A frame's
    // length is clamped to the slot (a caller of `frame_mut` may have written any length).
    #[inline(always)]
    unsafe fn frame_unchecked(&self, i: usize) -> &[u8] {
        let off = i * self.slot;
        // SAFETY: the caller's `i < count <= lens.len()`, so `lens[i]` is in bounds, and
        // `off + len <= (i + 1) * slot <= lens.len() * slot == buf.len()` (no overflow: that
        // product fitted in `new`).
        unsafe {
            let len = (*self.lens.get_unchecked(i)).min(self.slot);
            self.buf.get_unchecked(off..off + len)
        }
    }

    #[inline(always)]
    unsafe fn frame_mut_unchecked(&mut self, i: usize) -> (&mut [u8], &mut usize) {
        let off = i * self.slot;
        // SAFETY: as in `frame_unchecked`: `i < lens.len()`, `off + slot <= buf.len()`; the two
        // borrows are of different fields.
        unsafe {
            (
                self.buf.get_unchecked_mut(off..off + self.slot),
                self.lens.get_unchecked_mut(i),
            )
        }
    }
}

/// The address a packet leaves with, for tests and listings.
pub fn endpoint_string(addr: &Addr, port: u16, v: &Verdict) -> String {
    Tuple::endpoint(addr, port, v.family, v.proto)
}

#[cfg(test)]
mod frames_tests {
    use super::*;

    /// `SlotFrames`' unchecked accessors give what the checked ones give, a length written past
    /// the slot through `frame_mut` is clamped, and `PassFrames` maps a pass's index to the batch's.
    /// Also run under Miri (`cargo +nightly miri test -p kxdp-dataplane --lib frames_tests`).
    #[allow(unsafe_code)]
    #[test]
    fn unchecked_frames_are_the_checked_ones() {
        let mut f = SlotFrames::new(4, 64);
        for (k, n) in [10usize, 64, 100].into_iter().enumerate() {
            assert!(f.push(&vec![k as u8 + 1; n]));
        }
        assert_eq!(f.count(), 3);
        for i in 0..3 {
            // SAFETY: i < count().
            let u = unsafe { f.frame_unchecked(i) }.to_vec();
            assert_eq!(u, f.frame(i));
            let (a, la) = {
                let (b, l) = f.frame_mut(i);
                (b.as_ptr(), *l)
            };
            // SAFETY: i < count().
            let (b, l) = unsafe { f.frame_mut_unchecked(i) };
            assert_eq!((b.as_ptr(), b.len(), *l), (a, 64, la));
        }
        *f.frame_mut(2).1 = 1000;
        // SAFETY: 2 < count().
        assert_eq!(unsafe { f.frame_unchecked(2) }.len(), 64);
        *f.frame_mut(2).1 = 64;
        let p = PassFrames::new(&mut f, 1, 2);
        assert_eq!(p.frame(0), &[2u8; 64][..]);
        assert_eq!(p.frame(1), &[3u8; 64][..]);
    }

    #[test]
    #[should_panic(expected = "a pass past the batch's frames")]
    fn a_pass_past_the_frames_is_refused() {
        let mut f = SlotFrames::new(4, 64);
        f.push(&[0; 20]);
        PassFrames::new(&mut f, 1, 1);
    }

    #[test]
    #[should_panic]
    fn a_pass_index_past_the_pass_is_refused() {
        let mut f = SlotFrames::new(4, 64);
        f.push(&[0; 20]);
        f.push(&[0; 20]);
        let p = PassFrames::new(&mut f, 0, 1);
        p.frame(1);
    }
}
