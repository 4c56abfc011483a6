//! Listings: a consistent copy of each live entry (`EntryView`), read without stopping anyone.

use std::sync::atomic::Ordering;

use kxdp_packet::IpProto;

use super::super::tuple::Tuple;
use super::clock32::Clock32;
use super::shared::Table;
use super::state::{LIFE_LIVE, LIFE_MASK, SEQ_MASK, SEQ_SHIFT};
use super::update::SCTP_BYTES;

/// A consistent copy of an entry, for listings.
#[derive(Clone, Copy, Debug)]
pub struct EntryView {
    pub idx: u32,
    pub orig: Tuple,
    pub reply: Tuple,
    pub state: u32,
    pub service_id: u32,
    pub expires_ms: u64,
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
}

impl Table {
    /// A consistent copy of entry `idx` if it is live.
    pub fn view(&self, idx: u32) -> Option<EntryView> {
        let e = self.entries.get(idx as usize)?;
        loop {
            let st1 = e.state().load(Ordering::Acquire);
            if (st1 >> SEQ_SHIFT) & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            if st1 & LIFE_MASK != LIFE_LIVE {
                return None;
            }
            let orig = e.key(0);
            let reply = e.key(1);
            let stash = e.stash();
            std::sync::atomic::fence(Ordering::Acquire);
            let state = e.state().load(Ordering::Acquire);
            if (state ^ st1) & SEQ_MASK != 0 {
                continue;
            }
            if state & LIFE_MASK != LIFE_LIVE {
                return None;
            }
            let orig = Tuple::unpack(&orig);
            let packets = [0, 1].map(|d| e.packets(d).load(Ordering::Relaxed) as u64);
            let bytes = if orig.proto == IpProto::SCTP {
                let w = e.bytes(SCTP_BYTES).load(Ordering::Relaxed);
                [w & 0xffff_ffff, w >> 32]
            } else {
                [0, 1].map(|d| e.bytes(d).load(Ordering::Relaxed))
            };
            return Some(EntryView {
                idx,
                orig,
                reply: Tuple::unpack(&reply),
                state: state & !SEQ_MASK,
                service_id: stash.service_id,
                expires_ms: Clock32::decode(
                    e.expires_or_next().load(Ordering::Relaxed),
                    self.recent_ms.load(Ordering::Relaxed),
                ),
                packets,
                bytes,
            });
        }
    }

    /// Every live entry, one at a time, without stopping anyone (streams; holds nothing).
    pub fn iter(&self) -> impl Iterator<Item = EntryView> + '_ {
        let used = (self.next_unused.load(Ordering::Relaxed) as usize).min(self.entries.len());
        (0..used as u32).filter_map(move |i| self.view(i))
    }
}
