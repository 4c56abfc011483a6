//! Room for a new connection in a full table: which entries may go (`droppable`), the victim
//! that became droppable first (the drop queue, `fifo`) or a sample of the index, and its
//! retirement at once.

use std::sync::atomic::Ordering;

use kxdp_packet::IpProto;

use super::shared::Table;
use super::slot::{SLOT_EMPTY, TOMB_BIT};
use super::state::{
    FLAG_ASSURED, FLAG_SEEN_REPLY, LIFE_LIVE, LIFE_MASK, PROTO_STATE_MASK, PROTO_STATE_SHIFT,
    SEQ_MASK, SEQ_SHIFT,
};

/// Index slots looked at per early drop (the kernel looks at 8 hash buckets). At most a quarter
/// of the slots are live, so this sees a few dozen entries.
const EARLY_DROP_SCAN: usize = 128;

/// Records of `drop_queue` one early drop looks at, at most, for a victim still droppable. Each
/// record is looked at once: under a flood an early drop pops about one. When a flood begins, the
/// records of the connections admitted before it (assured since, or gone) come first: this
/// bounds what one packet spends on them (256 loads of state words, tens of microseconds at
/// worst), and the sampled scan stands in until they are through (at 2^20 entries, about 4,000
/// early drops).
const DROP_QUEUE_LOOK: usize = 256;

/// Whether an entry (its state word `st`, its protocol `proto`) may be dropped early to make
/// room: live, and unassured or a TCP connection that is closing (FIN_WAIT, CLOSE_WAIT,
/// LAST_ACK, TIME_WAIT, CLOSE: the kernel's `tcp_can_early_drop`, which its garbage collector
/// applies near a full table). Closed connections otherwise hold the room for their 120 s of
/// TIME_WAIT: a full table of them refuses every new connection.
#[inline]
pub(super) fn droppable(st: u32, proto: IpProto) -> bool {
    st & LIFE_MASK == LIFE_LIVE
        && (st & FLAG_ASSURED == 0
            || (proto == IpProto::TCP
                && (st & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT
                    >= super::super::tcp::TcpState::FinWait as u32))
}

impl Table {
    /// An assured TCP connection `idx` started closing (its state word now `state`): it joins
    /// the early-drop victims, behind those already waiting (the kernel's `tcp_can_early_drop`:
    /// a closing connection may go to make room).
    pub fn note_closing(&self, idx: u32, state: u32) {
        self.drop_queue
            .push(idx, (state & SEQ_MASK) >> SEQ_SHIFT, false);
    }

    /// Early drop (as the kernel's): removes one droppable entry (`droppable`: unassured, or a
    /// closing TCP connection) and frees it for the caller's insert at once (see `limbo`).
    ///
    /// The victim is the entry that became droppable first (`drop_queue`), beyond the kernel,
    /// which takes the first it meets in a few hash buckets: under a flood every handshake then
    /// has the time the flood needs to turn over all the droppable room, rather than the odds
    /// of a draw at every new connection. A handshake its server answered (SEEN_REPLY, not yet
    /// assured) is put back once at the tail: it is about to be assured, a bare SYN may never
    /// be. When the queue has nothing (its records all stale, or lapped), a sample of the
    /// index near `hint`, then of the slab, gives its oldest droppable entry.
    pub(super) fn early_drop(&self, hint: u64, now_ms: u64) -> bool {
        for _attempt in 0..4 {
            let Some(idx) = self
                .oldest_droppable()
                .or_else(|| self.sampled_droppable(hint, now_ms))
            else {
                return false;
            };
            // The victim's place in the live count goes to the caller's connection.
            if self.kill_uncounted(idx) {
                self.early_drops.fetch_add(1, Ordering::Relaxed);
                self.retire_now(idx);
                return true;
            }
            // Another worker took this one: look again.
        }
        false
    }

    /// The entry that became droppable first and still is, from `drop_queue` (stale records
    /// skipped, at most `DROP_QUEUE_LOOK` of them per call).
    fn oldest_droppable(&self) -> Option<u32> {
        for _ in 0..DROP_QUEUE_LOOK {
            let rec = self.drop_queue.pop()?;
            let Some(e) = self.entries.get(rec.idx as usize) else {
                continue;
            };
            let st = e.state().load(Ordering::Acquire);
            let seq = (st & SEQ_MASK) >> SEQ_SHIFT;
            if !self.drop_queue.seq_matches(&rec, seq) || !droppable(st, e.proto()) {
                continue;
            }
            if st & (FLAG_ASSURED | FLAG_SEEN_REPLY) == FLAG_SEEN_REPLY && !rec.second_chance {
                self.drop_queue.push(rec.idx, seq, true);
                continue;
            }
            return Some(rec.idx);
        }
        None
    }

    /// The oldest droppable entry of `EARLY_DROP_SCAN` index slots from `hint`'s (by creation
    /// time, to 16 ms), else the first of the slab from `hint` on.
    fn sampled_droppable(&self, hint: u64, now_ms: u64) -> Option<u32> {
        // Walk the index from the hint's slot, as the kernel walks hash buckets from the new
        // tuple's: the index holds live entries only, whatever their place in the slab.
        let mut victim = None;
        let mut oldest_age = 0u64;
        let mut i = self.home(hint);
        for _ in 0..EARLY_DROP_SCAN {
            let s = self.slots[i].load(Ordering::Acquire);
            i = self.next_slot(i);
            if s == SLOT_EMPTY || s & TOMB_BIT != 0 {
                continue;
            }
            let (_, idx, _) = self.code.decode(s);
            let e = self.entries.at(idx as usize);
            if !droppable(e.state().load(Ordering::Acquire), e.proto()) {
                continue;
            }
            let age = e.stash().age_ms(now_ms);
            if victim.is_none() || age > oldest_age {
                victim = Some(idx);
                oldest_age = age;
            }
        }
        // A small table spreads its few entries thinly over the index: then the slab.
        victim.or_else(|| self.droppable_in_slab(hint))
    }

    /// The first droppable entry of the slab from `hint` on (a bounded look).
    fn droppable_in_slab(&self, hint: u64) -> Option<u32> {
        let n = (self.next_unused.load(Ordering::Relaxed) as usize).clamp(1, self.entries.len());
        let start = hint as usize % n;
        (0..EARLY_DROP_SCAN.min(n))
            .map(|k| ((start + k) % n) as u32)
            .find(|&idx| {
                let s = self
                    .entries
                    .at(idx as usize)
                    .state()
                    .load(Ordering::Acquire);
                droppable(s, self.entries.at(idx as usize).proto())
            })
    }

    /// Unindexes a just-killed entry and queues it for reuse after the grace period.
    fn retire_now(&self, idx: u32) {
        if !self.claim_retire(idx) {
            return; // the expiry scan got there first; it recycles the entry
        }
        // Advancing here keeps victims flowing back under a flood even when the expiry scan has
        // nothing to do (it is what moves the epoch otherwise).
        let epoch = self.grace.try_advance();
        self.unindex(idx, epoch);
        if self.limbo.push((idx, epoch)).is_err() {
            self.fall_back_to_scan(idx);
        }
    }
}
