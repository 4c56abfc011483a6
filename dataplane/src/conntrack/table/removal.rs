//! Taking a connection out: made invisible to lookups (`kill`), claimed for retirement, and its
//! index slots turned into tombstones stamped with the epoch. The entry is reused only after
//! the grace period (`alloc`).

use std::sync::atomic::Ordering;

use super::shared::Table;
use super::slot::{slot_tomb, SLOT_EMPTY};
use super::state::{
    DIR_ORIG, DIR_REPLY, FLAG_SINGLE_KEY, LIFE_DYING, LIFE_LIVE, LIFE_MASK, LIFE_RETIRED,
};

impl Table {
    /// Makes a live entry invisible (one caller wins); the expiry scan then retires it.
    pub fn kill(&self, idx: u32) -> bool {
        let killed = self.kill_uncounted(idx);
        if killed {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        killed
    }

    /// `kill`, leaving the live count to the caller.
    pub(super) fn kill_uncounted(&self, idx: u32) -> bool {
        let e = self.entries.at(idx as usize);
        let mut cur = e.state().load(Ordering::Acquire);
        loop {
            if cur & LIFE_MASK != LIFE_LIVE {
                return false;
            }
            let new = (cur & !LIFE_MASK) | LIFE_DYING;
            match e
                .state()
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    pub(super) fn claim_retire(&self, idx: u32) -> bool {
        let e = self.entries.at(idx as usize);
        let cur = e.state().load(Ordering::Acquire);
        cur & LIFE_MASK == LIFE_DYING
            && e.state()
                .compare_exchange(
                    cur,
                    (cur & !LIFE_MASK) | LIFE_RETIRED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Replaces the entry's index slots by tombstones stamped with `epoch`.
    pub(super) fn unindex(&self, idx: u32, epoch: u64) {
        let e = self.entries.at(idx as usize);
        let single = e.state().load(Ordering::Acquire) & FLAG_SINGLE_KEY != 0;
        for dir in [DIR_ORIG, DIR_REPLY] {
            if single && dir == DIR_REPLY {
                continue;
            }
            let key = e.key(dir as usize);
            let hash = self.hash(&key);
            let want = self.code.live(self.code.tag(hash), idx, dir);
            let mut i = self.home(hash);
            for _ in 0..self.slots.len() {
                let s = self.slots[i].load(Ordering::Acquire);
                if s == SLOT_EMPTY {
                    break;
                }
                if s == want {
                    let _ = self.slots[i].compare_exchange(
                        s,
                        slot_tomb(epoch),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    break;
                }
                i = self.next_slot(i);
            }
        }
    }
}
