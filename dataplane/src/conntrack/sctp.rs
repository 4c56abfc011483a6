//! The SCTP association state machine, after the kernel's nf_conntrack_proto_sctp (as of Linux 6.x:
//! INIT leaves the entry CLOSED, the INIT ACK makes it COOKIE_WAIT), with the verification tags of
//! both directions checked on every packet (RFC 9260 8.5, 8.5.1).
//!
//! Input is the one-pass [`ChunkSummary`] of a packet (`kxdp_packet::sctp::summarize`), which has
//! already enforced the packet-level rules (INIT / INIT ACK / SHUTDOWN COMPLETE alone, INIT with tag
//! 0, a non-zero Initiate Tag). State-changing chunks of one packet are applied in a fixed order
//! that is the order RFC 9260 lets them be bundled in (COOKIE ECHO / COOKIE ACK first, ABORT last).
//!
//! Tags: `tags[0]` is the verification tag packets in the original direction must carry (the
//! replying endpoint's Initiate Tag, learnt from its INIT ACK), `tags[1]` the reply direction's
//! (the initiator's, from its INIT). 0 means "not known yet": no real tag is 0.
//!
//! Where this differs from the kernel:
//! - a new entry starts only from an INIT or a lone HEARTBEAT in the original direction (the kernel
//!   also creates entries for other chunks whose tag check then fails anyway, or for SHUTDOWN ACK);
//! - SHUTDOWN ACK, HEARTBEAT and HEARTBEAT ACK must carry the expected tag like any other chunk;
//!   a tag is learnt from a heartbeat only while the entry is HEARTBEAT_SENT (the kernel also
//!   re-learns tags of secondary multi-homing paths, which a Service's NAT does not carry);
//! - no INIT-collision bookkeeping: an INIT ACK (whose own tag is verified) always records its
//!   Initiate Tag;
//! - an ABORT answering a HEARTBEAT_SENT entry closes it (the kernel finds it invalid), so a peer
//!   that lost its association tells the heartbeating endpoint at once; an INIT in that state
//!   leaves it CLOSED, as any INIT starting an association (the kernel: COOKIE_WAIT).

use kxdp_packet::sctp::{chunk, ChunkSummary};

pub const STATE_COUNT: usize = 9;

/// Association states, numbered as the kernel's `enum sctp_conntrack` (so also as conntrack
/// netlink's `CTA_PROTOINFO_SCTP_STATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SctpState {
    /// No packet yet (a new entry is computed from this state).
    None = 0,
    /// INIT seen (no INIT ACK yet), or the association ended (ABORT, SHUTDOWN COMPLETE).
    Closed = 1,
    /// INIT ACK seen in the reply direction.
    CookieWait = 2,
    /// COOKIE ECHO seen.
    CookieEchoed = 3,
    /// COOKIE ACK seen.
    Established = 4,
    /// SHUTDOWN seen in the original direction.
    ShutdownSent = 5,
    /// SHUTDOWN seen in the reply direction.
    ShutdownRecd = 6,
    /// SHUTDOWN ACK seen.
    ShutdownAckSent = 7,
    /// The entry began with a HEARTBEAT (an association already running, e.g. after the entry
    /// was lost): established once a HEARTBEAT ACK answers.
    HeartbeatSent = 8,
}

/// The packet does not belong to the association as tracked (wrong verification tag, or a chunk
/// that cannot come in this state and direction): drop it as `ct-invalid`, keep the entry as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Invalid;

/// Which configured timeout applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SctpTimeout {
    /// Handshake, shutdown, closed (`sctp_short`: a few seconds).
    Short,
    /// ESTABLISHED (`sctp_established`).
    Established,
}

impl SctpState {
    pub const ALL: [SctpState; STATE_COUNT] = [
        SctpState::None,
        SctpState::Closed,
        SctpState::CookieWait,
        SctpState::CookieEchoed,
        SctpState::Established,
        SctpState::ShutdownSent,
        SctpState::ShutdownRecd,
        SctpState::ShutdownAckSent,
        SctpState::HeartbeatSent,
    ];

    #[inline]
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The state stored as `v`; values past the last state read as `None`.
    #[inline]
    pub fn from_u8(v: u8) -> SctpState {
        *SctpState::ALL.get(v as usize).unwrap_or(&SctpState::None)
    }

    /// conntrack-tools' (the kernel's) names.
    pub fn name(self) -> &'static str {
        match self {
            SctpState::None => "NONE",
            SctpState::Closed => "CLOSED",
            SctpState::CookieWait => "COOKIE_WAIT",
            SctpState::CookieEchoed => "COOKIE_ECHOED",
            SctpState::Established => "ESTABLISHED",
            SctpState::ShutdownSent => "SHUTDOWN_SENT",
            SctpState::ShutdownRecd => "SHUTDOWN_RECD",
            SctpState::ShutdownAckSent => "SHUTDOWN_ACK_SENT",
            SctpState::HeartbeatSent => "HEARTBEAT_SENT",
        }
    }
}

/// The timeout class of `state`.
#[inline]
pub fn timeout_class(state: SctpState) -> SctpTimeout {
    match state {
        SctpState::Established => SctpTimeout::Established,
        _ => SctpTimeout::Short,
    }
}

/// Whether an entry in `state` counts as assured (ESTABLISHED and the shutdown states after it).
/// The entry's assured flag should stay set once set, as the kernel's does.
#[inline]
pub fn is_assured(state: SctpState) -> bool {
    matches!(
        state,
        SctpState::Established
            | SctpState::ShutdownSent
            | SctpState::ShutdownRecd
            | SctpState::ShutdownAckSent
    )
}

/// Entries the table may evict first when full even though assured (the kernel's
/// `sctp_can_early_drop`): associations already shutting down.
#[inline]
pub fn can_early_drop(state: SctpState) -> bool {
    matches!(
        state,
        SctpState::ShutdownSent | SctpState::ShutdownRecd | SctpState::ShutdownAckSent
    )
}

/// Whether an accepted packet refreshes the entry's expiry. An INIT that finds the entry CLOSED and
/// leaves it CLOSED does not (as in the kernel): retransmitted INITs towards an endpoint that never
/// answers, or a client reusing its port, must not keep the entry (and its NAT choice) alive.
#[inline]
pub fn refreshes_timeout(old: SctpState, new: SctpState, s: &ChunkSummary) -> bool {
    !(s.has(chunk::INIT) && old == SctpState::Closed && new == SctpState::Closed)
}

/// The two expected tags as one word (for one atomic store): `tags[0]` in the high half.
#[inline]
pub fn pack_tags(tags: [u32; 2]) -> u64 {
    (tags[0] as u64) << 32 | tags[1] as u64
}

#[inline]
pub fn unpack_tags(v: u64) -> [u32; 2] {
    [(v >> 32) as u32, v as u32]
}

/// The state-changing chunk types, in the order they are applied within one packet.
const ORDER: [u8; 11] = [
    chunk::INIT,
    chunk::INIT_ACK,
    chunk::SHUTDOWN_COMPLETE,
    chunk::COOKIE_ECHO,
    chunk::COOKIE_ACK,
    chunk::ERROR,
    chunk::HEARTBEAT,
    chunk::HEARTBEAT_ACK,
    chunk::SHUTDOWN,
    chunk::SHUTDOWN_ACK,
    chunk::ABORT,
];

const STATE_CHANGING: u32 = {
    let mut m = 0;
    let mut i = 0;
    while i < ORDER.len() {
        m |= ChunkSummary::bit(ORDER[i]);
        i += 1;
    }
    m
};

/// The state after one chunk of type `ty` (a state-changing one) in direction `orig`/reply, or
/// `None` when it cannot come there. Transitions as the kernel's table, except from
/// `SctpState::None` (only INIT and HEARTBEAT start an entry) and ABORT in reply to
/// HEARTBEAT_SENT (closes).
fn step(state: SctpState, orig: bool, ty: u8) -> Option<SctpState> {
    use SctpState::*;
    let next = match (state, ty) {
        // A new entry.
        (None, chunk::INIT) if orig => Closed,
        (None, chunk::HEARTBEAT) if orig => HeartbeatSent,
        (None, _) => return Option::None,

        // An association that began with a heartbeat: the reply side may only answer the
        // heartbeat or abort; the original side's other chunks end it (an INIT starts over).
        (HeartbeatSent, chunk::HEARTBEAT) => HeartbeatSent,
        (HeartbeatSent, chunk::HEARTBEAT_ACK) if orig => HeartbeatSent,
        (HeartbeatSent, chunk::HEARTBEAT_ACK) => Established,
        (HeartbeatSent, chunk::ABORT) => Closed,
        (HeartbeatSent, chunk::SHUTDOWN_ACK) if orig => ShutdownAckSent,
        (HeartbeatSent, _) if orig => Closed,
        (HeartbeatSent, _) => return Option::None,

        (_, chunk::ABORT) => Closed,

        // INIT: a new association (or a retransmission) once the old one is over; an INIT into a
        // live association (peer restart, collision) leaves the state to the chunks that follow.
        (ShutdownSent | ShutdownRecd, chunk::INIT) if orig => Closed,
        (s, chunk::INIT) => s,

        (Closed, chunk::INIT_ACK) if !orig => CookieWait,
        (s, chunk::INIT_ACK) => s,

        (CookieWait, chunk::COOKIE_ECHO) => CookieEchoed,
        (s, chunk::COOKIE_ECHO) => s,

        (CookieEchoed, chunk::COOKIE_ACK) => Established,
        (s, chunk::COOKIE_ACK) => s,

        // A stale-cookie ERROR answering the COOKIE ECHO ends the attempt.
        (CookieEchoed, chunk::ERROR) if !orig => Closed,
        (s, chunk::ERROR) => s,

        (Established, chunk::SHUTDOWN) => {
            if orig {
                ShutdownSent
            } else {
                ShutdownRecd
            }
        }
        (s, chunk::SHUTDOWN) => s,

        (ShutdownSent | ShutdownRecd, chunk::SHUTDOWN_ACK) => ShutdownAckSent,
        (s, chunk::SHUTDOWN_ACK) => s,

        (ShutdownAckSent, chunk::SHUTDOWN_COMPLETE) => Closed,
        (s, chunk::SHUTDOWN_COMPLETE) => s,

        (s, chunk::HEARTBEAT | chunk::HEARTBEAT_ACK) => s,

        // DATA, SACK and the rest do not move the state.
        (s, _) => s,
    };
    Some(next)
}

/// The state after a packet summarised as `s` travelling in `dir` (0 original, 1 reply), checking
/// its verification tag against `tags` and recording new tags (see the module docs). For a new
/// entry, call it with `SctpState::None`, `dir` 0 and `tags` `[0, 0]`.
///
/// On `Err(Invalid)` neither the state nor `tags` changed.
pub fn next(
    state: SctpState,
    dir: u8,
    s: &ChunkSummary,
    tags: &mut [u32; 2],
) -> Result<SctpState, Invalid> {
    let d = (dir & 1) as usize;
    let o = d ^ 1;
    let orig = d == 0;
    let mut t = *tags;

    // The verification tag (RFC 9260 8.5 and 8.5.1).
    let reflected = (s.has(chunk::ABORT) && s.abort_t_bit)
        || (s.has(chunk::SHUTDOWN_COMPLETE) && s.shutdown_complete_t_bit);
    let heartbeat_only = s.chunks
        & !(ChunkSummary::bit(chunk::HEARTBEAT))
        & !(ChunkSummary::bit(chunk::HEARTBEAT_ACK))
        == 0;
    if s.has(chunk::INIT) {
        // (A): tag 0, alone in its packet; records the tag the other direction must carry.
        let init_tag = s.init_tag.ok_or(Invalid)?;
        if s.vtag != 0 || s.chunks != ChunkSummary::bit(chunk::INIT) {
            return Err(Invalid);
        }
        t[o] = init_tag;
    } else if state == SctpState::None {
        // Only a lone HEARTBEAT may start an entry besides INIT: learn the original tag.
        if !orig || s.chunks != ChunkSummary::bit(chunk::HEARTBEAT) || s.vtag == 0 {
            return Err(Invalid);
        }
        t[d] = s.vtag;
    } else if state == SctpState::HeartbeatSent && t[d] == 0 && heartbeat_only && s.vtag != 0 {
        // The answer to the heartbeat that began the entry: learn the reply tag.
        t[d] = s.vtag;
    } else {
        // (B), (C): ABORT / SHUTDOWN COMPLETE with T carry the tag the *other* direction uses.
        let expected = if reflected { t[o] } else { t[d] };
        if expected == 0 || s.vtag != expected {
            return Err(Invalid);
        }
        if s.has(chunk::INIT_ACK) {
            t[o] = s.init_tag.ok_or(Invalid)?;
        }
    }

    // The state.
    let mut st = state;
    if s.chunks & STATE_CHANGING == 0 {
        // Only DATA / SACK / others: nothing moves, but a new entry cannot start like that.
        if state == SctpState::None {
            return Err(Invalid);
        }
    } else {
        for ty in ORDER {
            if s.has(ty) {
                st = step(st, orig, ty).ok_or(Invalid)?;
            }
        }
    }
    *tags = t;
    Ok(st)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::SctpState::*;
    use super::*;
    use kxdp_packet::sctp::{summarize, Repr, HEADER_LEN};

    const ORIG: u8 = 0;
    const REPLY: u8 = 1;
    /// The client's Initiate Tag (carried by the reply direction) and the server's.
    const CTAG: u32 = 0x1111_2222;
    const STAG: u32 = 0x3333_4444;

    fn push_chunk(out: &mut Vec<u8>, ty: u8, flags: u8, value: &[u8]) {
        out.push(ty);
        out.push(flags);
        out.extend_from_slice(&((4 + value.len()) as u16).to_be_bytes());
        out.extend_from_slice(value);
        while out.len() % 4 != 0 {
            out.push(0);
        }
    }

    /// A summary of a packet built byte by byte: common header with `vtag`, then `chunks`.
    fn pkt(vtag: u32, chunks: &[(u8, u8, &[u8])]) -> ChunkSummary {
        let mut b = vec![0u8; HEADER_LEN];
        for &(ty, flags, value) in chunks {
            push_chunk(&mut b, ty, flags, value);
        }
        Repr {
            src_port: 40000,
            dst_port: 38412,
            verification_tag: vtag,
        }
        .emit(&mut b)
        .unwrap();
        summarize(&b).unwrap()
    }

    fn init_value(tag: u32) -> Vec<u8> {
        let mut v = tag.to_be_bytes().to_vec();
        v.extend_from_slice(&[0, 1, 0, 0, 0, 10, 0, 10, 0, 0, 0, 1]);
        v
    }

    pub(crate) fn init(tag: u32) -> ChunkSummary {
        pkt(0, &[(chunk::INIT, 0, &init_value(tag))])
    }

    fn init_ack(vtag: u32, tag: u32) -> ChunkSummary {
        let mut v = init_value(tag);
        v.extend_from_slice(&[0, 7, 0, 8, 1, 2, 3, 4]); // state cookie
        pkt(vtag, &[(chunk::INIT_ACK, 0, &v)])
    }

    const DATA: &[u8] = &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, b'h', b'i'];
    const SACK: &[u8] = &[0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0];

    fn data(vtag: u32) -> ChunkSummary {
        pkt(vtag, &[(chunk::DATA, 3, DATA)])
    }

    fn sack(vtag: u32) -> ChunkSummary {
        pkt(vtag, &[(chunk::SACK, 0, SACK)])
    }

    fn only(vtag: u32, ty: u8, flags: u8) -> ChunkSummary {
        pkt(vtag, &[(ty, flags, &[])])
    }

    /// Runs `steps` from a new entry, panicking at the first invalid one.
    fn run(steps: &[(u8, ChunkSummary)]) -> (SctpState, [u32; 2]) {
        let mut st = None;
        let mut tags = [0, 0];
        for (i, (dir, s)) in steps.iter().enumerate() {
            st = next(st, *dir, s, &mut tags).unwrap_or_else(|_| panic!("step {i} invalid"));
        }
        (st, tags)
    }

    fn handshake() -> Vec<(u8, ChunkSummary)> {
        vec![
            (ORIG, init(CTAG)),
            (REPLY, init_ack(CTAG, STAG)),
            (ORIG, pkt(STAG, &[(chunk::COOKIE_ECHO, 0, &[9; 8])])),
            (REPLY, only(CTAG, chunk::COOKIE_ACK, 0)),
        ]
    }

    fn established() -> (SctpState, [u32; 2]) {
        run(&handshake())
    }

    #[test]
    fn full_association() {
        let mut st = None;
        let mut tags = [0, 0];
        let mut go = |dir, s: ChunkSummary, want: SctpState, tags_want: [u32; 2]| {
            st = next(st, dir, &s, &mut tags).unwrap();
            assert_eq!((st, tags), (want, tags_want));
        };
        go(ORIG, init(CTAG), Closed, [0, CTAG]);
        go(ORIG, init(CTAG), Closed, [0, CTAG]); // retransmitted
        go(REPLY, init_ack(CTAG, STAG), CookieWait, [STAG, CTAG]);
        go(
            ORIG,
            pkt(
                STAG,
                &[(chunk::COOKIE_ECHO, 0, &[9; 8]), (chunk::DATA, 3, DATA)],
            ),
            CookieEchoed,
            [STAG, CTAG],
        );
        go(
            REPLY,
            pkt(CTAG, &[(chunk::COOKIE_ACK, 0, &[]), (chunk::SACK, 0, SACK)]),
            Established,
            [STAG, CTAG],
        );
        go(ORIG, data(STAG), Established, [STAG, CTAG]);
        go(REPLY, sack(CTAG), Established, [STAG, CTAG]);
        go(REPLY, data(CTAG), Established, [STAG, CTAG]);
        go(
            ORIG,
            pkt(STAG, &[(chunk::SACK, 0, SACK), (chunk::DATA, 3, DATA)]),
            Established,
            [STAG, CTAG],
        );
        go(
            ORIG,
            only(STAG, chunk::HEARTBEAT, 0),
            Established,
            [STAG, CTAG],
        );
        go(
            REPLY,
            only(CTAG, chunk::HEARTBEAT_ACK, 0),
            Established,
            [STAG, CTAG],
        );
        go(
            ORIG,
            pkt(STAG, &[(chunk::SHUTDOWN, 0, &[0, 0, 0, 1])]),
            ShutdownSent,
            [STAG, CTAG],
        );
        go(REPLY, data(CTAG), ShutdownSent, [STAG, CTAG]);
        go(
            REPLY,
            only(CTAG, chunk::SHUTDOWN_ACK, 0),
            ShutdownAckSent,
            [STAG, CTAG],
        );
        go(
            ORIG,
            only(STAG, chunk::SHUTDOWN_COMPLETE, 0),
            Closed,
            [STAG, CTAG],
        );
    }

    #[test]
    fn shutdown_from_the_reply_side() {
        let (st, mut tags) = established();
        let st = next(
            st,
            REPLY,
            &pkt(CTAG, &[(chunk::SHUTDOWN, 0, &[0, 0, 0, 1])]),
            &mut tags,
        );
        assert_eq!(st, Ok(ShutdownRecd));
        let st = next(
            st.unwrap(),
            ORIG,
            &only(STAG, chunk::SHUTDOWN_ACK, 0),
            &mut tags,
        );
        assert_eq!(st, Ok(ShutdownAckSent));
        // SHUTDOWN COMPLETE with T (the sender had no TCB any more): carries the tag it received.
        let sc_t = only(STAG, chunk::SHUTDOWN_COMPLETE, chunk::FLAG_T);
        assert_eq!(next(st.unwrap(), REPLY, &sc_t, &mut tags), Ok(Closed));
        // With T but the reply direction's own tag: wrong.
        let bad = only(CTAG, chunk::SHUTDOWN_COMPLETE, chunk::FLAG_T);
        assert_eq!(next(ShutdownAckSent, REPLY, &bad, &mut tags), Err(Invalid));
    }

    #[test]
    fn abort_from_either_side() {
        // Without T: the sender's own expected tag.
        for (dir, tag) in [(ORIG, STAG), (REPLY, CTAG)] {
            let (st, mut tags) = established();
            let abort = pkt(tag, &[(chunk::DATA, 3, DATA), (chunk::ABORT, 0, &[])]);
            assert_eq!(next(st, dir, &abort, &mut tags), Ok(Closed));
            assert_eq!(tags, [STAG, CTAG]);
            // Nor does a T-bit ABORT carry the own tag.
            let (st, mut tags) = established();
            let wrong = only(tag, chunk::ABORT, chunk::FLAG_T);
            assert_eq!(next(st, dir, &wrong, &mut tags), Err(Invalid));
        }
        // With T: the tag the other direction carries (the one the aborting side received).
        for (dir, tag) in [(ORIG, CTAG), (REPLY, STAG)] {
            let (st, mut tags) = established();
            let abort = only(tag, chunk::ABORT, chunk::FLAG_T);
            assert_eq!(next(st, dir, &abort, &mut tags), Ok(Closed));
            let (st, mut tags) = established();
            let wrong = only(tag, chunk::ABORT, 0);
            assert_eq!(next(st, dir, &wrong, &mut tags), Err(Invalid));
        }
        // A server refusing the INIT: ABORT without T, tagged with the INIT's Initiate Tag.
        let (st, mut tags) = run(&[(ORIG, init(CTAG))]);
        assert_eq!(
            next(st, REPLY, &only(CTAG, chunk::ABORT, 0), &mut tags),
            Ok(Closed)
        );
        // ABORT during the handshake and shutdown.
        let (st, mut tags) = run(&handshake()[..2]);
        assert_eq!(st, CookieWait);
        assert_eq!(
            next(st, ORIG, &only(STAG, chunk::ABORT, 0), &mut tags),
            Ok(Closed)
        );
        // A random tag never aborts.
        let (st, mut tags) = established();
        assert_eq!(
            next(
                st,
                REPLY,
                &only(0x5555_5555, chunk::ABORT, chunk::FLAG_T),
                &mut tags
            ),
            Err(Invalid)
        );
        assert_eq!(
            next(st, REPLY, &only(0, chunk::ABORT, chunk::FLAG_T), &mut tags),
            Err(Invalid)
        );
    }

    #[test]
    fn wrong_vtag_rejected() {
        let (st, tags0) = established();
        let cases: [(u8, ChunkSummary); 8] = [
            (ORIG, data(CTAG)), // the other direction's tag
            (REPLY, data(STAG)),
            (ORIG, data(0)),
            (REPLY, sack(0xdead_beef)),
            (ORIG, only(CTAG, chunk::SHUTDOWN_ACK, 0)),
            (REPLY, only(STAG, chunk::HEARTBEAT, 0)),
            (ORIG, only(0x1, chunk::SHUTDOWN_COMPLETE, 0)),
            (ORIG, pkt(CTAG, &[(chunk::SHUTDOWN, 0, &[0, 0, 0, 1])])),
        ];
        for (i, (dir, s)) in cases.iter().enumerate() {
            let mut tags = tags0;
            assert_eq!(next(st, *dir, s, &mut tags), Err(Invalid), "case {i}");
            assert_eq!(tags, tags0, "case {i}: tags unchanged");
        }
        // During the handshake: the INIT ACK must carry the INIT's tag; the COOKIE ECHO the
        // INIT ACK's; nothing but INIT ACK / ABORT may come before the server's tag is known.
        let (st, mut tags) = run(&[(ORIG, init(CTAG))]);
        assert_eq!(
            next(st, REPLY, &init_ack(0x999, STAG), &mut tags),
            Err(Invalid)
        );
        assert_eq!(next(st, ORIG, &data(0), &mut tags), Err(Invalid));
        assert_eq!(next(st, ORIG, &data(STAG), &mut tags), Err(Invalid));
        assert_eq!(tags, [0, CTAG]);
        let (st, mut tags) = run(&handshake()[..2]);
        let echo = pkt(CTAG, &[(chunk::COOKIE_ECHO, 0, &[9; 8])]);
        assert_eq!(next(st, ORIG, &echo, &mut tags), Err(Invalid));
    }

    #[test]
    fn restart_init_after_close() {
        let (st, mut tags) = established();
        let st = next(st, ORIG, &only(STAG, chunk::ABORT, 0), &mut tags).unwrap();
        assert_eq!(st, Closed);
        // The old association's packets no longer move anything, a new INIT restarts.
        const CTAG2: u32 = 0x7777_8888;
        const STAG2: u32 = 0x9999_aaaa;
        let st2 = next(st, ORIG, &init(CTAG2), &mut tags).unwrap();
        assert_eq!(st2, Closed);
        assert_eq!(tags[1], CTAG2);
        assert!(!refreshes_timeout(st, st2, &init(CTAG2)));
        // The old reply tag is no longer accepted.
        assert_eq!(next(st2, REPLY, &data(CTAG), &mut tags), Err(Invalid));
        let st = next(st2, REPLY, &init_ack(CTAG2, STAG2), &mut tags).unwrap();
        assert_eq!((st, tags), (CookieWait, [STAG2, CTAG2]));
        let st = next(
            st,
            ORIG,
            &pkt(STAG2, &[(chunk::COOKIE_ECHO, 0, &[1; 4])]),
            &mut tags,
        );
        let st = next(
            st.unwrap(),
            REPLY,
            &only(CTAG2, chunk::COOKIE_ACK, 0),
            &mut tags,
        );
        assert_eq!(st, Ok(Established));
        assert_eq!(
            next(Established, ORIG, &data(STAG2), &mut tags),
            Ok(Established)
        );
        assert_eq!(
            next(Established, ORIG, &data(STAG), &mut tags),
            Err(Invalid)
        );

        // Also after a SHUTDOWN COMPLETE, and from the middle of a shutdown.
        let (_, mut tags) = established();
        assert_eq!(
            next(ShutdownSent, ORIG, &init(CTAG2), &mut tags),
            Ok(Closed)
        );
        assert_eq!(tags, [STAG, CTAG2]);
    }

    #[test]
    fn init_into_a_live_association() {
        // A peer restart (RFC 9260 5.2.2): the state stays, the new tags are recorded.
        let (st, mut tags) = established();
        const CTAG2: u32 = 0x7777_8888;
        assert_eq!(next(st, ORIG, &init(CTAG2), &mut tags), Ok(Established));
        assert_eq!(
            next(st, REPLY, &init_ack(CTAG2, STAG), &mut tags),
            Ok(Established)
        );
        assert_eq!(tags, [STAG, CTAG2]);
        // INIT with a non-zero tag or bundled is never accepted (built by hand: summarize
        // rejects such packets already).
        let mut s = init(CTAG2);
        s.vtag = STAG;
        assert_eq!(next(st, ORIG, &s, &mut tags), Err(Invalid));
        let mut s = init(CTAG2);
        s.chunks |= ChunkSummary::bit(chunk::DATA);
        assert_eq!(next(st, ORIG, &s, &mut tags), Err(Invalid));
        let mut s = init(CTAG2);
        s.init_tag = Option::None;
        assert_eq!(next(Closed, ORIG, &s, &mut tags), Err(Invalid));
    }

    #[test]
    fn new_entries() {
        let mut tags = [0, 0];
        for s in [
            data(STAG),
            sack(STAG),
            only(STAG, chunk::ABORT, 0),
            only(STAG, chunk::ABORT, chunk::FLAG_T),
            only(STAG, chunk::SHUTDOWN_COMPLETE, chunk::FLAG_T),
            only(STAG, chunk::COOKIE_ACK, 0),
            pkt(STAG, &[(chunk::COOKIE_ECHO, 0, &[9; 8])]),
            only(STAG, chunk::SHUTDOWN_ACK, 0),
            only(STAG, chunk::HEARTBEAT_ACK, 0),
            init_ack(STAG, CTAG),
            pkt(
                STAG,
                &[(chunk::HEARTBEAT, 0, &[0, 1, 0, 4]), (chunk::DATA, 3, DATA)],
            ),
        ] {
            assert_eq!(next(None, ORIG, &s, &mut tags), Err(Invalid), "{s:?}");
            assert_eq!(tags, [0, 0]);
        }
        assert_eq!(next(None, REPLY, &init(CTAG), &mut tags), Err(Invalid));
        assert_eq!(next(None, ORIG, &init(CTAG), &mut tags), Ok(Closed));
        assert_eq!(tags, [0, CTAG]);
    }

    #[test]
    fn heartbeat_started_entry() {
        // An association already running when the entry was created.
        let (st, tags) = run(&[(ORIG, only(STAG, chunk::HEARTBEAT, 0))]);
        assert_eq!((st, tags), (HeartbeatSent, [STAG, 0]));
        let mut t = tags;
        assert_eq!(next(st, ORIG, &data(STAG), &mut t), Ok(HeartbeatSent));
        assert_eq!(next(st, ORIG, &init(CTAG), &mut t), Ok(Closed));
        assert_eq!(t, [STAG, CTAG]);
        // Before the HEARTBEAT ACK the reply tag is unknown: reply DATA is invalid, and a
        // HEARTBEAT ACK bundled with DATA teaches nothing.
        let mut t = tags;
        assert_eq!(next(st, REPLY, &data(CTAG), &mut t), Err(Invalid));
        let hb_ack_data = pkt(
            CTAG,
            &[
                (chunk::HEARTBEAT_ACK, 0, &[0, 1, 0, 4]),
                (chunk::DATA, 3, DATA),
            ],
        );
        assert_eq!(next(st, REPLY, &hb_ack_data, &mut t), Err(Invalid));
        assert_eq!(t, tags);
        let (st, tags) = run(&[
            (ORIG, only(STAG, chunk::HEARTBEAT, 0)),
            (REPLY, only(CTAG, chunk::HEARTBEAT_ACK, 0)),
        ]);
        assert_eq!((st, tags), (Established, [STAG, CTAG]));
        assert!(is_assured(st));
        let mut t = tags;
        assert_eq!(next(st, REPLY, &data(CTAG), &mut t), Ok(Established));
        assert_eq!(next(st, REPLY, &data(STAG), &mut t), Err(Invalid));
        // The peer lost the association: its ABORT (T, reflecting the heartbeat's tag) closes.
        let (st, mut tags) = run(&[(ORIG, only(STAG, chunk::HEARTBEAT, 0))]);
        assert_eq!(
            next(
                st,
                REPLY,
                &only(STAG, chunk::ABORT, chunk::FLAG_T),
                &mut tags
            ),
            Ok(Closed)
        );
        let (st, mut tags) = run(&[(ORIG, only(STAG, chunk::HEARTBEAT, 0))]);
        assert_eq!(
            next(
                st,
                REPLY,
                &only(CTAG, chunk::ABORT, chunk::FLAG_T),
                &mut tags
            ),
            Err(Invalid)
        );
        assert_eq!(next(st, REPLY, &data(CTAG), &mut tags), Err(Invalid));
    }

    #[test]
    fn stale_cookie_error_closes() {
        let (st, mut tags) = run(&handshake()[..3]);
        assert_eq!(st, CookieEchoed);
        let err = pkt(CTAG, &[(chunk::ERROR, 0, &[0, 3, 0, 8, 0, 0, 0, 1])]);
        assert_eq!(next(st, REPLY, &err, &mut tags), Ok(Closed));
        // An ERROR bundled after the COOKIE ACK does not.
        let (st, mut tags) = run(&handshake()[..3]);
        let ack_err = pkt(
            CTAG,
            &[
                (chunk::COOKIE_ACK, 0, &[]),
                (chunk::ERROR, 0, &[0, 6, 0, 4]),
            ],
        );
        assert_eq!(next(st, REPLY, &ack_err, &mut tags), Ok(Established));
    }

    #[test]
    fn classes_and_packing() {
        for s in SctpState::ALL {
            assert_eq!(SctpState::from_u8(s.as_u8()), s);
            assert_eq!(
                timeout_class(s) == SctpTimeout::Established,
                s == Established
            );
            assert!(!s.name().is_empty());
        }
        assert_eq!(SctpState::from_u8(200), None);
        assert!(is_assured(Established) && is_assured(ShutdownAckSent));
        assert!(!is_assured(CookieEchoed) && !is_assured(Closed) && !is_assured(HeartbeatSent));
        assert!(can_early_drop(ShutdownSent) && !can_early_drop(Established));
        assert_eq!(unpack_tags(pack_tags([STAG, CTAG])), [STAG, CTAG]);
        assert_eq!(pack_tags([1, 2]), 0x1_0000_0002);
        assert_eq!(std::mem::size_of::<SctpState>(), 1);
        assert_eq!(std::mem::size_of::<Invalid>(), 0);
        assert_eq!(Established.name(), "ESTABLISHED");
        assert_eq!(ShutdownAckSent.name(), "SHUTDOWN_ACK_SENT");
        assert!(refreshes_timeout(None, Closed, &init(CTAG)));
        assert!(refreshes_timeout(Closed, Closed, &data(CTAG)));
    }
}
