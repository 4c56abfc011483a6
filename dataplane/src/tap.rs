//! The tap port: pod traffic as whole GSO super-frames (`podInterception: tap`, docs/afxdp.md
//! § "Pod traffic as super-frames").
//!
//! A tc filter on each intercepted pod veth redirects what the pod sends into kxdp's tap
//! (`kxdp_kernel::tc`), one tap per node with one queue per worker. A worker reads up to
//! [`TAP_BATCH`] frames from its queue without waiting, each with its `virtio_net_hdr`, into
//! buffers allocated once ([`MAX_FRAME`] bytes each: a 64 KB super-frame fits), runs the same
//! `Pipeline` as on its AF_XDP sockets over them, and writes each frame back into the tap with
//! its header: the kernel routes it on (FIB, neighbours, TTL, segmentation), so kxdp's egress
//! stage is skipped. A drop is not written; a reject's answer (RST, ICMP) is written instead of
//! the frame.
//!
//! Checksums: a frame with `VIRTIO_NET_HDR_F_NEEDS_CSUM` carries in its L4 checksum field the
//! uncomplemented pseudo-header sum, which the kernel completes later over the payload. The
//! pipeline's rewrite updates that field as a complete checksum (RFC 1624, ports included), so
//! for such frames [`PartialSum`] puts the field back to what it was and adds the address
//! change in the opposite sense (`S' = S + ~m + m'`); ports are not in the pseudo-header. No
//! frame is summed over its payload.
//!
//! Source validation: the tap does not say which interface a frame came through, so each
//! redirect pushes an 802.1Q tag whose VLAN ID names its interface ([`TapTags`], assigned by
//! the link manager before the redirect exists). A worker reads the tag out of the frame as it
//! reads the frame (no copy) and, with `sourceValidation: strict`, checks the source against
//! that interface as on an AF_XDP port (`crate::antispoof`). A frame whose tag names no
//! interface kxdp intercepts (or that has none) cannot be checked and is dropped as
//! `spoofed-source`.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use kxdp_kernel::offload::DirectHop;
use kxdp_kernel::packet_tx::{self, PacketTx};
use kxdp_kernel::tap::{TapQueue, VirtioNetHdr, MAX_FRAME};
use kxdp_kernel::tc::MAX_TAG;
use kxdp_packet::checksum;

use crate::antispoof::SourceValidation;
use crate::fib::Fib;
use crate::pipeline::{Frames, SlotFrames};
use crate::snapshot::PrefixSet;
use crate::stats::FRAME_BYTES;
use crate::verdict::{Action, Reason, Verdict};

/// Frames a worker reads from its tap queue per loop (8 × 64 KB buffers: half a MB per worker).
pub const TAP_BATCH: usize = 8;

/// The bytes of a frame's head a direct send keeps, to give the frame back to the kernel as it
/// came when the egress refuses it: Ethernet with an 802.1Q tag, then the IPv4 header's TTL and
/// checksum or the IPv6 header's hop limit.
const HEAD_KEPT: usize = 18 + 12;

/// The tc filter preference of kxdp's redirects (IPv4 here, IPv6 neighbour discovery passed at
/// the next one, the IPv6 redirect at the one after: `kxdp_kernel::tc`).
pub const TC_PREF: u16 = 0xcd00;

/// The offloads kxdp's tap takes: partial checksums and TCP super-frames of both families.
pub const TAP_OFFLOADS: u32 =
    kxdp_kernel::tap::TUN_F_CSUM | kxdp_kernel::tap::TUN_F_TSO4 | kxdp_kernel::tap::TUN_F_TSO6;

/// The interfaces kxdp's tap intercepts, by the VLAN ID their redirect pushes (1 to
/// [`MAX_TAG`]): written by the link manager alone (one thread), read by the workers.
pub struct TapTags {
    /// VLAN ID → ifindex (0: free).
    by_tag: Box<[AtomicU32]>,
    /// Where the search for a free tag starts: after the last one given, so a released tag is
    /// reused as late as possible (frames with it may still wait in the tap).
    next: AtomicU32,
}

impl Default for TapTags {
    fn default() -> Self {
        TapTags {
            by_tag: (0..=MAX_TAG).map(|_| AtomicU32::new(0)).collect(),
            next: AtomicU32::new(1),
        }
    }
}

impl TapTags {
    /// The interface `tag` stands for; 0 for none.
    #[inline]
    pub fn ingress(&self, tag: u16) -> u32 {
        self.by_tag
            .get(tag as usize)
            .map_or(0, |t| t.load(Ordering::Acquire))
    }

    /// The tag of `ifindex`, if it has one.
    pub fn tag_of(&self, ifindex: u32) -> Option<u16> {
        (1..=MAX_TAG).find(|&t| self.ingress(t) == ifindex)
    }

    /// A tag for `ifindex`: the one it has, else `wanted` if free (what its redirect already
    /// pushes: a restart keeps the tags), else the next free one; None when all are taken.
    pub fn assign(&self, ifindex: u32, wanted: Option<u16>) -> Option<u16> {
        if let Some(t) = self.tag_of(ifindex) {
            return Some(t);
        }
        let free = |t: u16| self.ingress(t) == 0;
        let start = self.next.load(Ordering::Relaxed) as u16;
        let tag = wanted
            .filter(|&t| (1..=MAX_TAG).contains(&t) && free(t))
            .or_else(|| {
                (0..MAX_TAG)
                    .map(|i| (start.saturating_sub(1) + i) % MAX_TAG + 1)
                    .find(|&t| free(t))
            })?;
        self.by_tag[tag as usize].store(ifindex, Ordering::Release);
        self.next
            .store(tag as u32 % MAX_TAG as u32 + 1, Ordering::Relaxed);
        Some(tag)
    }

    /// Frees the tag of `ifindex` (its redirect is gone).
    pub fn release(&self, ifindex: u32) {
        if let Some(t) = self.tag_of(ifindex) {
            self.by_tag[t as usize].store(0, Ordering::Release);
        }
    }
}

/// What a worker checks the sources of its tap's frames against (`sourceValidation: strict`).
pub struct SourceCheck<'a> {
    pub fib: &'a Fib,
    pub pod_ranges: &'a PrefixSet,
    pub kernel_port: Option<u32>,
    /// The FIB's id and the tables' generation: what [`TapPort`]'s per-tag cache is valid for.
    pub generation: (u64, u64),
}

/// Per tag: the interface it stood for when worked out, and whether that interface's sources
/// are checked (`crate::antispoof::checked`, which walks the routes: once per FIB, not per frame).
struct CheckedTags {
    valid_for: (u64, u64),
    by_tag: Box<[(u32, bool)]>,
}

impl CheckedTags {
    fn new() -> CheckedTags {
        CheckedTags {
            valid_for: (u64::MAX, u64::MAX),
            by_tag: vec![(0, false); MAX_TAG as usize + 1].into_boxed_slice(),
        }
    }

    /// Whether `frame`, tagged `tag` (standing for `ingress`), may go on.
    fn allows(&mut self, c: &SourceCheck, tag: Option<u16>, ingress: u32, frame: &[u8]) -> bool {
        let Some(tag) = tag.filter(|_| ingress != 0) else {
            return false;
        };
        if self.valid_for != c.generation {
            self.valid_for = c.generation;
            self.by_tag.fill((0, false));
        }
        let slot = &mut self.by_tag[tag as usize];
        if slot.0 != ingress {
            let checked = crate::antispoof::checked(
                SourceValidation::Strict,
                c.fib,
                c.pod_ranges,
                ingress,
                c.kernel_port,
            );
            *slot = (ingress, checked);
        }
        !slot.1 || crate::antispoof::source_ok(frame, c.fib, ingress, &[])
    }
}

/// Where a frame's IP header starts and whether it is IPv6 (untagged Ethernet only: what a pod's
/// veth hands over).
fn ip_layout(frame: &[u8]) -> Option<(usize, bool)> {
    match frame.get(12..14)? {
        [0x08, 0x00] => Some((14, false)),
        [0x86, 0xdd] => Some((14, true)),
        _ => None,
    }
}

/// The addresses and partial L4 checksum of a frame as it was received, kept across the
/// pipeline to redo the checksum field for a partial frame (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct PartialSum {
    /// The checksum field's offset in the frame (0: the frame has no partial checksum).
    field_at: usize,
    l3: usize,
    v6: bool,
    /// Source and destination as received (IPv4: the first 8 bytes).
    addrs: [u8; 32],
    field: u16,
}

impl PartialSum {
    /// What [`PartialSum::apply`] needs of `frame`, read before the pipeline rewrites it.
    pub fn read(frame: &[u8], hdr: &VirtioNetHdr) -> PartialSum {
        let none = PartialSum::default();
        if !hdr.needs_csum() {
            return none;
        }
        let Some((l3, v6)) = ip_layout(frame) else {
            return none;
        };
        let field_at = hdr.csum_start as usize + hdr.csum_offset as usize;
        let (at, len) = if v6 { (l3 + 8, 32) } else { (l3 + 12, 8) };
        let (Some(a), Some(f)) = (frame.get(at..at + len), frame.get(field_at..field_at + 2))
        else {
            return none;
        };
        // A checksum field inside the IP header is not an L4 one (never sent so; ignored).
        if field_at < l3 + if v6 { 40 } else { 20 } {
            return none;
        }
        let mut addrs = [0u8; 32];
        addrs[..len].copy_from_slice(a);
        PartialSum {
            field_at,
            l3,
            v6,
            addrs,
            field: u16::from_be_bytes([f[0], f[1]]),
        }
    }

    /// Sets the partial checksum field of `frame` (rewritten by the pipeline) to the one
    /// received plus the change of its addresses; nothing for a frame without one.
    pub fn apply(&self, frame: &mut [u8]) {
        if self.field_at == 0 {
            return;
        }
        let (at, len) = if self.v6 {
            (self.l3 + 8, 32)
        } else {
            (self.l3 + 12, 8)
        };
        let Some(now) = frame.get(at..at + len) else {
            return;
        };
        let word = |b: &[u8], i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut delta = 0u32;
        for i in (0..len).step_by(4) {
            delta += checksum::delta32(word(&self.addrs, i), word(now, i));
        }
        // The field holds an uncomplemented sum: the change is added to it as it is.
        let field = !checksum::fold(self.field as u32 + delta);
        if let Some(f) = frame.get_mut(self.field_at..self.field_at + 2) {
            f.copy_from_slice(&field.to_be_bytes());
        }
    }
}

/// The packets a frame stands for: the segments a GSO super-frame becomes
/// (`ceil(payload / gso_size)`), else one.
pub fn segments(hdr: &VirtioNetHdr, len: usize) -> u64 {
    if !hdr.is_gso() || hdr.gso_size == 0 {
        return 1;
    }
    // `hdr_len` is the headers' length as the sender saw them (a hint); the L4 header starts
    // at `csum_start` at the latest.
    let headers = if (1..=len).contains(&(hdr.hdr_len as usize)) {
        hdr.hdr_len as usize
    } else {
        (hdr.csum_start as usize).min(len)
    };
    let payload = (len - headers) as u64;
    payload.div_ceil(hdr.gso_size as u64).max(1)
}

/// What [`TapPort::send`] did with a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapSent {
    pub frames: u64,
    pub segments: u64,
    /// Of `segments`, those sent straight to their egress interface (direct routing).
    pub direct: u64,
}

impl TapSent {
    /// Counts a frame sent as the `segs` packets it stands for (a reject's answer as one;
    /// `direct`: straight to its egress), or makes its verdict a `tx-ring-full` drop.
    fn count(&mut self, written: io::Result<()>, v: &mut Verdict, segs: u64, direct: bool) {
        match written {
            Ok(()) => {
                let segments = if v.action == Action::Reject { 1 } else { segs };
                self.frames += 1;
                self.segments += segments;
                if direct {
                    self.direct += segments;
                }
            }
            Err(_) => {
                v.egress = 0;
                v.set(Reason::TxRingFull);
            }
        }
    }
}

/// One worker's queue of kxdp's tap and its buffers (allocated once).
pub struct TapPort {
    pub queue: TapQueue,
    /// The tap's interface index (for its drop counter).
    pub ifindex: u32,
    /// The tap's Ethernet address: every frame written back is addressed to it.
    pub mac: [u8; 6],
    pub frames: SlotFrames,
    hdrs: [VirtioNetHdr; TAP_BATCH],
    sums: [PartialSum; TAP_BATCH],
    /// Per frame of the batch: the packets it stands for ([`segments`]).
    pub segs: [u64; TAP_BATCH],
    /// Per frame of the batch: the interface it came through (its tag's; 0 when unknown).
    pub ingress: [u32; TAP_BATCH],
    /// The established flows this worker put on the kernel's fast path (`offload: true`).
    pub offloads: Option<crate::offload::Offloads>,
    /// Direct routing (`crate::direct`): frames with a hop leave through this socket, straight
    /// to their egress interface.
    pub direct: Option<PacketTx>,
    /// Per frame of the batch: its direct hop, if it has one (set before [`TapPort::send`]).
    pub hops: [Option<DirectHop>; TAP_BATCH],
    /// Read errors other than "nothing to read" (the device went away, ...).
    pub read_errors: u64,
    tags: Arc<TapTags>,
    checked: CheckedTags,
    /// The frames of the last [`TapPort::receive`] dropped for their source: verdicts, the
    /// packets each stands for, and their bytes.
    pub spoofed: [Verdict; TAP_BATCH],
    pub spoofed_segs: [u64; TAP_BATCH],
    pub spoofed_count: usize,
    pub spoofed_bytes: u64,
    /// Their first bytes (for a `--hex` monitor; copied on the drop path only).
    spoofed_heads: [[u8; FRAME_BYTES]; TAP_BATCH],
    spoofed_head_len: [usize; TAP_BATCH],
}

impl TapPort {
    /// A worker's port on `queue` (made non-blocking) of the tap `ifindex`; `mac` is the tap's
    /// address, `tags` the interfaces' tags.
    pub fn new(
        queue: TapQueue,
        ifindex: u32,
        mac: [u8; 6],
        tags: Arc<TapTags>,
        offloads: Option<crate::offload::Offloads>,
        direct: Option<PacketTx>,
    ) -> io::Result<TapPort> {
        queue.set_nonblocking(true)?;
        Ok(TapPort {
            queue,
            ifindex,
            mac,
            frames: SlotFrames::new(TAP_BATCH, MAX_FRAME),
            hdrs: [VirtioNetHdr::default(); TAP_BATCH],
            sums: [PartialSum::default(); TAP_BATCH],
            segs: [1; TAP_BATCH],
            ingress: [0; TAP_BATCH],
            offloads,
            direct,
            hops: [None; TAP_BATCH],
            read_errors: 0,
            tags,
            checked: CheckedTags::new(),
            spoofed: [Verdict::default(); TAP_BATCH],
            spoofed_segs: [0; TAP_BATCH],
            spoofed_count: 0,
            spoofed_bytes: 0,
            spoofed_heads: [[0; FRAME_BYTES]; TAP_BATCH],
            spoofed_head_len: [0; TAP_BATCH],
        })
    }

    /// Reads what the queue has, up to [`TAP_BATCH`] frames, without waiting, each without
    /// its tag, and keeps what the checksum fix needs of each; returns the frame count. With
    /// `check`, a frame whose source does not arrive on its interface is not kept: its verdict
    /// goes to [`TapPort::spoofed`] (at most [`TAP_BATCH`] such per call).
    pub fn receive(&mut self, check: Option<&SourceCheck>) -> usize {
        self.frames.clear();
        self.spoofed_count = 0;
        self.spoofed_bytes = 0;
        let (queue, hdrs, errors) = (&self.queue, &mut self.hdrs, &mut self.read_errors);
        let ingresses = &mut self.ingress;
        let (tags, checked) = (&*self.tags, &mut self.checked);
        let (spoofed, spoofed_segs) = (&mut self.spoofed, &mut self.spoofed_segs);
        let (heads, head_len) = (&mut self.spoofed_heads, &mut self.spoofed_head_len);
        let (spoofed_count, spoofed_bytes) = (&mut self.spoofed_count, &mut self.spoofed_bytes);
        let n = self.frames.receive(|i, buf| loop {
            match queue.read_untagged(buf) {
                Ok((hdr, len, tag)) => {
                    let frame = &buf[..len.min(buf.len())];
                    let ingress = tag.map_or(0, |t| tags.ingress(t));
                    if check.is_none_or(|c| checked.allows(c, tag, ingress, frame)) {
                        hdrs[i] = hdr;
                        ingresses[i] = ingress;
                        return Some(len);
                    }
                    let (j, k) = (*spoofed_count, frame.len().min(FRAME_BYTES));
                    heads[j][..k].copy_from_slice(&frame[..k]);
                    head_len[j] = k;
                    spoofed[j] = match tag {
                        Some(_) => crate::antispoof::spoofed(frame),
                        None => crate::antispoof::screened(frame, Reason::TapUntagged),
                    };
                    spoofed_segs[j] = segments(&hdr, frame.len());
                    *spoofed_bytes += frame.len() as u64;
                    *spoofed_count += 1;
                    if *spoofed_count == TAP_BATCH {
                        return None;
                    }
                }
                Err(e) => {
                    if e.kind() != io::ErrorKind::WouldBlock {
                        *errors += 1;
                    }
                    return None;
                }
            }
        });
        for i in 0..n {
            let f = self.frames.get(i);
            self.sums[i] = PartialSum::read(f, &self.hdrs[i]);
            self.segs[i] = segments(&self.hdrs[i], f.len());
        }
        n
    }

    /// Sends the batch's frames on by their verdicts: a forward or pass with its header (its
    /// partial checksum redone), a reject's answer with a plain header (its checksums
    /// complete), a drop not at all. A forward with a direct hop leaves straight through its
    /// egress interface (TTL one lower, the hop's MACs), all of the batch's in one `sendmmsg`
    /// after the rest; the rest go back into the tap, for the kernel to route. A failed send
    /// becomes a `tx-ring-full` drop.
    pub fn send(&mut self, verdicts: &mut [Verdict]) -> TapSent {
        let mut sent = TapSent::default();
        let n = self.frames.count().min(verdicts.len());
        // The frames that go direct: (batch index, egress interface, header), and every
        // frame's first bytes as they came (its MACs and the IP header's TTL and checksum):
        // what a direct send that the egress refuses gives back to the kernel.
        let mut direct = [(0usize, 0u32, VirtioNetHdr::default()); TAP_BATCH];
        let mut n_direct = 0;
        let mut heads = [[0u8; HEAD_KEPT]; TAP_BATCH];
        for (i, v) in verdicts.iter_mut().enumerate().take(n) {
            let hdr = match v.action {
                Action::Drop => continue,
                Action::Reject => VirtioNetHdr::default(),
                Action::Forward | Action::Pass => self.hdrs[i],
            };
            let (buf, len) = self.frames.frame_mut(i);
            let frame = &mut buf[..*len];
            if v.action != Action::Reject {
                self.sums[i].apply(frame);
            }
            let l3 = v.l3_off as usize;
            let kept = frame.len().min(HEAD_KEPT);
            heads[i][..kept].copy_from_slice(&frame[..kept]);
            match self.hops[i] {
                Some(hop)
                    if self.direct.is_some()
                        && v.action == Action::Forward
                        && l3 + 12 <= kept
                        && kxdp_packet::decrement_ttl_at(frame, l3) =>
                {
                    frame[..6].copy_from_slice(&hop.dst_mac);
                    frame[6..12].copy_from_slice(&hop.src_mac);
                    direct[n_direct] = (i, hop.ifindex, hdr);
                    n_direct += 1;
                }
                _ => {
                    if frame.len() >= 6 {
                        frame[..6].copy_from_slice(&self.mac);
                    }
                    let written = self.queue.write(&hdr, frame);
                    sent.count(written, v, self.segs[i], false);
                }
            }
        }
        let Some(tx) = self.direct.as_ref().filter(|_| n_direct > 0) else {
            return sent;
        };
        let mut results: [Option<io::Result<()>>; TAP_BATCH] = Default::default();
        let out: [packet_tx::Outgoing<'_>; TAP_BATCH] = std::array::from_fn(|j| {
            let (i, ifindex, hdr) = direct[j];
            packet_tx::Outgoing {
                ifindex,
                hdr,
                frame: if j < n_direct {
                    self.frames.get(i)
                } else {
                    &[]
                },
            }
        });
        tx.send_batch(&out[..n_direct], |j, r| results[j] = Some(r));
        for (j, &(i, _, hdr)) in direct[..n_direct].iter().enumerate() {
            // Every frame is reported; one that was not would count as not sent.
            let mut written = results[j]
                .take()
                .unwrap_or_else(|| Err(io::ErrorKind::WriteZero.into()));
            // Longer than the egress interface's MTU (a pod's MTU above it, no GSO): the kernel
            // routes it as it came, and fragments it or answers "too big" as it would without
            // direct routing.
            let went_direct = !matches!(&written, Err(e) if packet_tx::too_big(e));
            if !went_direct {
                let (buf, len) = self.frames.frame_mut(i);
                let frame = &mut buf[..*len];
                let kept = frame.len().min(HEAD_KEPT);
                frame[..kept].copy_from_slice(&heads[i][..kept]);
                frame[..6].copy_from_slice(&self.mac);
                written = self.queue.write(&hdr, frame);
            }
            sent.count(written, &mut verdicts[i], self.segs[i], went_direct);
        }
        sent
    }

    /// The first bytes of the `i`th frame of the last receive dropped for its source.
    pub fn spoofed_head(&self, i: usize) -> &[u8] {
        &self.spoofed_heads[i][..self.spoofed_head_len[i]]
    }

    /// The packets frame `i` of the batch stands for, by its verdict (a reject's answer is one).
    pub fn weight(&self, i: usize, v: &Verdict) -> u64 {
        if v.action == Action::Reject {
            1
        } else {
            self.segs[i]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kxdp_kernel::tap::{
        VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
    };

    /// A TCP frame (IPv4 or IPv6) with `payload` bytes, its checksum complete.
    fn frame(v6: bool, payload: usize) -> Vec<u8> {
        let (l3, ip_len) = if v6 { (14, 40) } else { (14, 20) };
        let l4 = l3 + ip_len;
        let mut f = vec![0u8; l4 + 20 + payload];
        if v6 {
            f[12..14].copy_from_slice(&[0x86, 0xdd]);
            f[l3] = 0x60;
            f[l3 + 4..l3 + 6].copy_from_slice(&((20 + payload) as u16).to_be_bytes());
            f[l3 + 6] = 6;
            f[l3 + 7] = 64;
            f[l3 + 8..l3 + 24]
                .copy_from_slice(&[0xfd, 0, 0, 0x77, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            f[l3 + 24..l3 + 40]
                .copy_from_slice(&[0xfd, 0, 0, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0a]);
        } else {
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[l3] = 0x45;
            f[l3 + 2..l3 + 4].copy_from_slice(&((20 + 20 + payload) as u16).to_be_bytes());
            f[l3 + 8] = 64;
            f[l3 + 9] = 6;
            f[l3 + 12..l3 + 16].copy_from_slice(&[10, 77, 1, 2]);
            f[l3 + 16..l3 + 20].copy_from_slice(&[172, 30, 0, 10]);
        }
        f[l4..l4 + 2].copy_from_slice(&40000u16.to_be_bytes());
        f[l4 + 2..l4 + 4].copy_from_slice(&80u16.to_be_bytes());
        f[l4 + 12] = 0x50;
        for (i, b) in f[l4 + 20..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let c = full(&f, v6);
        f[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        f
    }

    fn layout(v6: bool) -> (usize, usize) {
        if v6 {
            (14, 54)
        } else {
            (14, 34)
        }
    }

    /// The pseudo-header's partial sum of `f` as it stands.
    fn pseudo_sum(f: &[u8], v6: bool) -> u32 {
        let (l3, l4) = layout(v6);
        let mut ph = Vec::new();
        if v6 {
            ph.extend_from_slice(&f[l3 + 8..l3 + 40]);
        } else {
            ph.extend_from_slice(&f[l3 + 12..l3 + 20]);
        }
        ph.extend_from_slice(&[0, 6]);
        ph.extend_from_slice(&((f.len() - l4) as u16).to_be_bytes());
        checksum::sum(&ph, 0)
    }

    /// The complete TCP checksum of `f`, recomputed over everything.
    fn full(f: &[u8], v6: bool) -> u16 {
        let (_, l4) = layout(v6);
        let mut t = f[l4..].to_vec();
        t[16] = 0;
        t[17] = 0;
        checksum::fold(checksum::sum(&t, pseudo_sum(f, v6)))
    }

    /// What a sender stores in a CHECKSUM_PARTIAL field: the uncomplemented pseudo-header sum.
    fn partial(f: &[u8], v6: bool) -> u16 {
        !checksum::fold(pseudo_sum(f, v6))
    }

    /// Completes a partial field the way the kernel does (sum over `csum_start..` from it).
    fn complete(f: &[u8], v6: bool) -> u16 {
        let (_, l4) = layout(v6);
        let field = u16::from_be_bytes([f[l4 + 16], f[l4 + 17]]);
        let mut t = f[l4..].to_vec();
        t[16] = 0;
        t[17] = 0;
        checksum::fold(checksum::sum(&t, field as u32))
    }

    fn hdr(v6: bool, gso: bool) -> VirtioNetHdr {
        let (_, l4) = layout(v6);
        VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: match (gso, v6) {
                (false, _) => 0,
                (true, false) => VIRTIO_NET_HDR_GSO_TCPV4,
                (true, true) => VIRTIO_NET_HDR_GSO_TCPV6,
            },
            hdr_len: (l4 + 20) as u16,
            gso_size: if gso { 1448 } else { 0 },
            csum_start: l4 as u16,
            csum_offset: 16,
        }
    }

    /// The pipeline's rewrite of a DNAT (address and port), as on a complete checksum: the
    /// field ends up wrong for a partial frame until [`PartialSum::apply`].
    fn dnat(f: &mut [u8], v6: bool) {
        let (l3, l4) = layout(v6);
        let ck = u16::from_be_bytes([f[l4 + 16], f[l4 + 17]]);
        let (at, new): (usize, &[u8]) = if v6 {
            (
                l3 + 24,
                &[0xfd, 0, 0, 0x77, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3],
            )
        } else {
            (l3 + 16, &[10, 77, 1, 3])
        };
        let mut ck32 = (!ck) as u32;
        for i in (0..new.len()).step_by(4) {
            let w = |b: &[u8]| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            ck32 += checksum::delta32(w(&f[at..]), w(new));
        }
        f[at..at + new.len()].copy_from_slice(new);
        let ck = checksum::update16(checksum::fold(ck32), 80, 5201);
        f[l4 + 2..l4 + 4].copy_from_slice(&5201u16.to_be_bytes());
        f[l4 + 16..l4 + 18].copy_from_slice(&ck.to_be_bytes());
    }

    #[test]
    fn a_partial_checksum_takes_the_address_change_only() {
        for v6 in [false, true] {
            for payload in [0, 5, 1448 * 40 + 3] {
                let mut f = frame(v6, payload);
                let (_, l4) = layout(v6);
                let p = partial(&f, v6);
                f[l4 + 16..l4 + 18].copy_from_slice(&p.to_be_bytes());
                let h = hdr(v6, payload > 1448);
                let sum = PartialSum::read(&f, &h);
                dnat(&mut f, v6);
                sum.apply(&mut f);
                // The kernel's completion of the redone field is the exact checksum of the
                // rewritten frame.
                assert_eq!(complete(&f, v6), full(&f, v6), "v6 {v6} payload {payload}");
                // And the field is the new pseudo-header sum (0 and 0xffff are one number).
                let got = u16::from_be_bytes([f[l4 + 16], f[l4 + 17]]);
                let want = partial(&f, v6);
                assert!(
                    got == want || got | want == 0xffff && got & want == 0,
                    "{got:#x} {want:#x}"
                );
            }
        }
    }

    #[test]
    fn a_complete_checksum_is_left_to_the_pipeline() {
        for v6 in [false, true] {
            let mut f = frame(v6, 100);
            let plain = VirtioNetHdr::default();
            let sum = PartialSum::read(&f, &plain);
            dnat(&mut f, v6);
            let before = f.clone();
            sum.apply(&mut f);
            assert_eq!(f, before, "no partial checksum: untouched");
            // The pipeline's incremental update (ports included) is exact for such a frame.
            let (_, l4) = layout(v6);
            assert_eq!(u16::from_be_bytes([f[l4 + 16], f[l4 + 17]]), full(&f, v6));
        }
    }

    #[test]
    fn odd_frames_get_no_fix() {
        let h = hdr(false, false);
        // Not IP, truncated, or a field inside the IP header: nothing kept, nothing written.
        let mut arp = frame(false, 0);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(PartialSum::read(&arp, &h).field_at, 0);
        assert_eq!(PartialSum::read(&frame(false, 0)[..40], &h).field_at, 0);
        let inside = VirtioNetHdr {
            csum_start: 14,
            csum_offset: 10,
            ..h
        };
        assert_eq!(PartialSum::read(&frame(false, 0), &inside).field_at, 0);
        let mut short = frame(false, 0);
        let sum = PartialSum::read(&short, &h);
        short.truncate(20);
        sum.apply(&mut short);
    }

    #[test]
    fn super_frames_count_as_their_segments() {
        let h = hdr(false, true);
        // 54 bytes of headers: 10 full segments and a short one.
        assert_eq!(segments(&h, 54 + 1448 * 10 + 1), 11);
        assert_eq!(segments(&h, 54 + 1448 * 10), 10);
        assert_eq!(segments(&h, 54), 1);
        // Not GSO, or no segment size: one packet.
        assert_eq!(segments(&hdr(false, false), 9000), 1);
        let no_size = VirtioNetHdr { gso_size: 0, ..h };
        assert_eq!(segments(&no_size, 9000), 1);
        // A bogus header length falls back to csum_start (34: 20 more bytes of payload).
        let bogus = VirtioNetHdr {
            hdr_len: 60_000,
            ..h
        };
        assert_eq!(segments(&bogus, 34 + 1448 * 2), 2);
    }

    #[test]
    fn tags_name_interfaces_and_are_reused_late() {
        let tags = TapTags::default();
        assert_eq!(tags.ingress(0), 0);
        assert_eq!(tags.ingress(MAX_TAG + 1), 0, "out of range: nobody");
        // What a filter already carries is kept; an interface keeps its tag.
        assert_eq!(tags.assign(10, Some(300)), Some(300));
        assert_eq!(tags.assign(10, Some(5)), Some(300));
        assert_eq!(tags.ingress(300), 10);
        // Otherwise the next free one after the last given; a taken wish is not honoured.
        assert_eq!(tags.assign(11, Some(300)), Some(301));
        assert_eq!(tags.assign(12, None), Some(302));
        tags.release(11);
        assert_eq!(tags.ingress(301), 0);
        assert_eq!(
            tags.assign(13, None),
            Some(303),
            "a freed tag is not reused at once"
        );
        // Exhaustion, then room again.
        let mut n = 3;
        while tags.assign(1000 + n, None).is_some() {
            n += 1;
        }
        assert_eq!(n, MAX_TAG as u32, "every tag in use");
        assert_eq!(tags.assign(99, None), None);
        tags.release(12);
        assert_eq!(tags.assign(99, None), Some(302));
        assert_eq!(tags.tag_of(99), Some(302));
    }
}
