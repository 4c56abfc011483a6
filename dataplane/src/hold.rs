//! The hold queue: frames whose next hop has no neighbour entry yet, kept until the neighbour
//! resolves (then sent through the egress stage again) or their time is up (then dropped as
//! `no-neighbour`), as the kernel keeps such packets in its unresolved-neighbour queue.
//!
//! Bounded in frames (per neighbour and in all) and in time: a neighbour that never answers
//! ties up at most [`PER_NEIGHBOUR`] frames for [`HOLD_MS`]. Fixed capacity, allocated once per
//! worker; holding, releasing and expiring never allocate. The worker keeps the frames "in
//! hand" (`Umem::in_hand`), so the UMEM's accounting balances while they wait.

use kxdp_packet::Addr;

use crate::verdict::Verdict;

/// Frames a worker holds at most (all neighbours together).
pub const CAPACITY: usize = 64;

/// Frames held per next hop (interface, address): a connection's first packets, a few
/// connections opened at once. Like the kernel's unresolved queue, what comes beyond is dropped.
pub const PER_NEIGHBOUR: usize = 4;

/// How long a frame waits for its neighbour. A neighbour that answers at all does so within
/// milliseconds of the kernel's first probe; past a second the sender's own retransmission
/// (TCP's first is 1 s) takes over, and holding longer would only tie up frames.
pub const HOLD_MS: u64 = 1000;

/// One held frame and what the egress stage needs to send it on later.
#[derive(Clone, Copy, Debug)]
pub struct Held<T> {
    /// The frame (a UMEM descriptor in a worker).
    pub frame: T,
    /// Its verdict as the pipeline left it (the egress stage runs again from it).
    pub verdict: Verdict,
    /// The next hop that had no neighbour: interface and address.
    pub oif: u32,
    pub next_hop: Addr,
    /// The interface it was received on, whether that hands over partial checksums, and
    /// whether it is the kernel port (the egress stage's inputs of its batch).
    pub ingress: u32,
    pub partial_checksums: bool,
    pub from_kernel: bool,
    /// When it is dropped if its neighbour has not resolved (monotonic milliseconds).
    pub deadline_ms: u64,
}

/// Frames waiting for their neighbours, in arrival order.
#[derive(Debug)]
pub struct HoldQueue<T> {
    held: Vec<Held<T>>,
    capacity: usize,
    per_neighbour: usize,
}

impl<T: Copy> Default for HoldQueue<T> {
    fn default() -> Self {
        HoldQueue::new(CAPACITY, PER_NEIGHBOUR)
    }
}

impl<T: Copy> HoldQueue<T> {
    pub fn new(capacity: usize, per_neighbour: usize) -> HoldQueue<T> {
        HoldQueue {
            held: Vec::with_capacity(capacity),
            capacity,
            per_neighbour,
        }
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Holds `h`; false (not held) when the queue or its neighbour's share is full.
    pub fn hold(&mut self, h: Held<T>) -> bool {
        if self.held.len() >= self.capacity {
            return false;
        }
        let same = (self.held.iter())
            .filter(|o| o.oif == h.oif && o.next_hop == h.next_hop)
            .count();
        if same >= self.per_neighbour {
            return false;
        }
        self.held.push(h);
        true
    }

    /// Takes out every held frame `pick` selects, in arrival order, handing each to `out`.
    pub fn take_where(
        &mut self,
        mut pick: impl FnMut(&Held<T>) -> bool,
        mut out: impl FnMut(Held<T>),
    ) {
        self.held.retain(|h| {
            if pick(h) {
                out(*h);
                false
            } else {
                true
            }
        });
    }

    /// The earliest deadline of a held frame.
    pub fn next_deadline(&self) -> Option<u64> {
        self.held.iter().map(|h| h.deadline_ms).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(frame: u32, oif: u32, nh: u8, deadline_ms: u64) -> Held<u32> {
        Held {
            frame,
            verdict: Verdict::default(),
            oif,
            next_hop: Addr::from_ip([10, 1, 0, nh].into()),
            ingress: 1,
            partial_checksums: false,
            from_kernel: false,
            deadline_ms,
        }
    }

    #[test]
    fn holds_a_few_frames_per_neighbour_within_the_capacity() {
        let mut q = HoldQueue::new(6, 2);
        assert!(q.hold(held(1, 2, 11, 100)));
        assert!(q.hold(held(2, 2, 11, 100)));
        // The neighbour's share is full; another neighbour (or the same address on another
        // interface) still has its own.
        assert!(!q.hold(held(3, 2, 11, 100)));
        assert!(q.hold(held(4, 2, 12, 100)));
        assert!(q.hold(held(5, 3, 11, 100)));
        assert!(q.hold(held(6, 3, 12, 100)));
        assert!(q.hold(held(7, 4, 11, 100)));
        // The whole queue is full.
        assert!(!q.hold(held(8, 5, 11, 100)));
        assert_eq!(q.len(), 6);
        // The capacity was set aside at creation: holding allocates nothing.
        assert!(q.held.capacity() >= 6);
    }

    #[test]
    fn releases_a_resolved_neighbour_s_frames_in_arrival_order() {
        let mut q = HoldQueue::new(8, 4);
        for (f, nh) in [(1, 11), (2, 12), (3, 11), (4, 11)] {
            assert!(q.hold(held(f, 2, nh, 100)));
        }
        let mut out = Vec::new();
        let nh = Addr::from_ip([10, 1, 0, 11].into());
        q.take_where(|h| h.next_hop == nh, |h| out.push(h.frame));
        assert_eq!(out, [1, 3, 4]);
        assert_eq!(q.len(), 1);
        // Released frames free their neighbour's share.
        for f in 5..9 {
            assert!(q.hold(held(f, 2, 11, 100)));
        }
    }

    #[test]
    fn frames_expire_at_their_deadline() {
        let mut q = HoldQueue::new(8, 4);
        assert!(q.hold(held(1, 2, 11, 100)));
        assert!(q.hold(held(2, 2, 12, 50)));
        assert!(q.hold(held(3, 2, 11, 150)));
        assert_eq!(q.next_deadline(), Some(50));
        let mut out = Vec::new();
        q.take_where(|h| h.deadline_ms <= 100, |h| out.push(h.frame));
        assert_eq!(out, [1, 2]);
        assert_eq!(q.next_deadline(), Some(150));
        q.take_where(|h| h.deadline_ms <= 1000, |h| out.push(h.frame));
        assert!(q.is_empty());
        assert_eq!(q.next_deadline(), None);
    }
}
