//! Connection tracking shared by all workers: both directions of every NATed connection, protocol
//! state with kube-proxy/kernel-style timeouts, bounded size with early drop, incremental expiry.
//! Session-affinity records live in the same table (as IPVS keeps its persistence templates in its
//! connection table), keyed by client address and Service port, invisible to connection listings.

mod config;
mod fifo;
mod grace;
mod persist;
pub mod sctp;
mod table;
pub mod tcp;
mod tuple;

pub use config::CtConfig;
pub use persist::{
    Environment as StateEnvironment, RestoreReport, RestoreResult, LAYOUT_VERSION,
    VERSION_OVERRIDE_ENV,
};
pub use table::{
    Candidate, EntryView, Found, InsertError, Retired, TableMemory, DIR_ORIG, DIR_REPLY,
    FLAG_ASSURED, FLAG_BACKEND_GONE, FLAG_MASQ, FLAG_SEEN_REPLY,
};
pub use tuple::{addr_word, hash_packed, packed_proto, Packed, Tuple};

use kxdp_packet::{Addr, Family, IpProto};
use table::{
    Clock32, Table, DIR_FLAGS_SHIFT, FLAG_SINGLE_KEY, PROTO_STATE_MASK, PROTO_STATE_SHIFT,
};
use tcp::TcpState;

/// Pseudo-protocol of affinity records: never a real IP protocol number kxdp tracks.
pub const AFFINITY_PROTO: IpProto = IpProto(255);

/// How long a replied UDP flow must have lived before it counts as a stream (the kernel's 2 s).
const UDP_STREAM_AGE_MS: u64 = 2_000;
/// The packet of a direction from which a UDP flow may take the fast path (`offloadable`).
const OFFLOAD_UDP_FROM: u32 = 2;

/// Timeouts in milliseconds, resolved once from `CtConfig`.
#[derive(Clone, Copy, Debug)]
struct Timeouts {
    tcp: [u64; tcp::STATE_COUNT],
    udp: u64,
    udp_stream: u64,
    icmp: u64,
    sctp_established: u64,
    sctp_short: u64,
}

pub struct Conntrack {
    table: Table,
    config: CtConfig,
    timeouts: Timeouts,
    /// The state file the table lives in, if any (`open_file`).
    state_file: Option<persist::StateFile>,
    restore: Option<RestoreReport>,
}

/// The hash seed of every table (a state file records it; a different one means migration).
const SEED: u64 = 0x6b78_6470_2d63_7421;

/// Longest session-affinity timeout Kubernetes allows (`timeoutSeconds` ≤ 86400).
const MAX_AFFINITY_MS: u64 = 86_400_000;

/// What conntrack needs of a packet to move a connection's protocol state.
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstPacket {
    pub tcp_flags: u8,
    /// IP length, counted when the packet creates the connection.
    pub bytes: u64,
    /// SCTP: the packet's chunks (None for a later fragment).
    pub sctp: Option<kxdp_packet::sctp::ChunkSummary>,
}

impl From<u8> for FirstPacket {
    /// A packet known by its TCP flags alone (TCP, UDP, ICMP).
    fn from(tcp_flags: u8) -> FirstPacket {
        FirstPacket {
            tcp_flags,
            bytes: 0,
            sctp: None,
        }
    }
}

/// The expiry words (`Clock32`) a packet at one clock gives the connections the established fast
/// lane handles (`Conntrack::on_plain_packet`), by TCP state and for UDP: computed once per
/// batch, not per packet.
#[derive(Clone, Copy, Debug)]
pub struct LaneClock {
    tcp: [u32; tcp::STATE_COUNT],
    udp: u32,
    udp_stream: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateError {
    Insert(InsertError),
    /// The packet cannot open a connection (SCTP: anything but an INIT or a lone HEARTBEAT).
    Invalid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketError {
    /// The connection ended between lookup and now.
    Gone,
    /// The packet does not fit the connection's state.
    Invalid,
}

impl Timeouts {
    fn of(config: &CtConfig) -> Timeouts {
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        let mut tcp_t = [0u64; tcp::STATE_COUNT];
        for s in TcpState::ALL {
            tcp_t[s as usize] = ms(match s {
                TcpState::None | TcpState::SynSent => config.tcp_syn_sent,
                TcpState::SynRecv => config.tcp_syn_recv,
                TcpState::Established => config.tcp_established,
                TcpState::FinWait => config.tcp_fin_wait,
                TcpState::CloseWait => config.tcp_close_wait,
                TcpState::LastAck => config.tcp_last_ack,
                TcpState::TimeWait => config.tcp_time_wait,
                TcpState::Close => config.tcp_close,
            });
        }
        Timeouts {
            tcp: tcp_t,
            udp: ms(config.udp),
            udp_stream: ms(config.udp_stream),
            icmp: ms(config.icmp),
            sctp_established: ms(config.sctp_established),
            sctp_short: ms(config.sctp_short),
        }
    }

    /// The longest timeout: no entry expires later than this after its last packet.
    fn max(&self) -> u64 {
        let t = self.tcp.iter().copied().max().unwrap_or(0);
        [
            t,
            self.udp,
            self.udp_stream,
            self.icmp,
            self.sctp_established,
            self.sctp_short,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

/// Bytes a table of `max_entries` allocates up front (its entries and index, `table::Geometry`;
/// a state file adds a 4 KiB header).
pub fn table_bytes(max_entries: u32) -> u64 {
    let g = table::Geometry::for_max_live(max_entries);
    g.array_bytes().iter().sum::<usize>() as u64
}

impl Conntrack {
    /// `workers`: how many threads call `enter`/`leave`/`maintain` (each with its own index).
    /// The table lives in process memory (replay, tests, `kxdp run` without a state file).
    pub fn new(config: CtConfig, workers: usize) -> Conntrack {
        Self::with_seed(config, workers, SEED)
    }

    pub fn with_seed(config: CtConfig, workers: usize, seed: u64) -> Conntrack {
        Conntrack {
            table: Table::new(config.max_entries, workers, seed),
            timeouts: Timeouts::of(&config),
            config,
            state_file: None,
            restore: None,
        }
    }

    /// A table kept in the state file at `path` (created when missing), continuing the
    /// connections a previous process left there when the file is readable (see `persist` for
    /// the checks). An unreadable, corrupt, truncated or other-boot file is replaced by an empty
    /// table; the report says which and why. Errors only when the file cannot be created or
    /// mapped at all. Call it before any worker runs, and only once the previous owner of the
    /// file (a process being replaced) has stopped its workers: the index is rebuilt in place.
    pub fn open_file(
        path: &std::path::Path,
        config: CtConfig,
        workers: usize,
    ) -> std::io::Result<(Conntrack, RestoreReport)> {
        Self::open_file_with(path, config, workers, &StateEnvironment::current())
    }

    /// `open_file` with the boot id, clock and layout version given (tests).
    pub fn open_file_with(
        path: &std::path::Path,
        config: CtConfig,
        workers: usize,
        env: &StateEnvironment,
    ) -> std::io::Result<(Conntrack, RestoreReport)> {
        let timeouts = Timeouts::of(&config);
        let max_expiry = env.now_ms + timeouts.max().max(MAX_AFFINITY_MS) + 60_000;
        let (table, state, report) = persist::open(
            path,
            table::Geometry::for_max_live(config.max_entries),
            workers,
            SEED,
            env,
            max_expiry,
        )?;
        Ok((
            Conntrack {
                table,
                config,
                timeouts,
                state_file: Some(state),
                restore: Some(report.clone()),
            },
            report,
        ))
    }

    /// What opening the state file found (None without one).
    pub fn restore_report(&self) -> Option<&RestoreReport> {
        self.restore.as_ref()
    }

    /// The state file's path, if the table lives in one.
    pub fn state_path(&self) -> Option<&std::path::Path> {
        self.state_file.as_ref().map(|s| s.path.as_path())
    }

    /// Marks the state file cleanly written: call once the workers have stopped (SIGTERM). The
    /// next process then reports a clean restore (it checks every entry either way). Does
    /// nothing without a state file, or when another process has opened the file since.
    pub fn mark_clean_shutdown(&self) -> bool {
        self.state_file
            .as_ref()
            .is_some_and(|s| s.mark_clean(crate::clock::clock_ms()))
    }

    pub fn config(&self) -> &CtConfig {
        &self.config
    }

    /// Entries allocated at start: the configured maximum plus room for entries in their grace
    /// period.
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// The memory the table lives in, and how much of it is in huge pages.
    pub fn memory(&self) -> TableMemory {
        self.table.memory()
    }

    /// Live entries (connections and affinity records).
    pub fn len(&self) -> u32 {
        self.table.live()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn early_drops(&self) -> u64 {
        self.table.early_drops()
    }

    #[inline]
    pub fn hash(&self, key: &Packed) -> u64 {
        self.table.hash(key)
    }

    /// Prefetch hints for a batch's lookups (`Table::prefetch_slot`, `Table::prefetch_entry`):
    /// hash every packet and prefetch its slot, then prefetch the entries, then look up.
    #[inline]
    pub fn prefetch_slot(&self, hash: u64) {
        self.table.prefetch_slot(hash)
    }

    #[inline]
    pub fn prefetch_entry(&self, key: &Packed, hash: u64) -> Candidate {
        self.table.prefetch_entry(key, hash)
    }

    /// Finds the connection a packet with tuple `key` (packed, with its hash) belongs to. An entry
    /// past its expiry is gone, whether or not the expiry scan has reached it yet. Always inlined:
    /// out of line, its call and the copy of its `Found` cost 44 instructions per packet.
    #[inline(always)]
    pub fn lookup(&self, key: &Packed, hash: u64, now_ms: u64) -> Option<Found> {
        let mut found = Found::default();
        self.lookup_into(key, hash, now_ms, &mut found)
            .then_some(found)
    }

    /// [`Conntrack::lookup`] into the caller's `out` (`Table::lookup_into`): whether the packet's
    /// connection was found, `out` then holding what `lookup` would have returned (and nothing
    /// usable when not). With no candidate: a lookup after this worker's own inserts (the
    /// batch's re-lookup) must not trust what the prefetch pass saw before them.
    #[inline(always)]
    pub fn lookup_into(&self, key: &Packed, hash: u64, now_ms: u64, out: &mut Found) -> bool {
        self.lookup_into_from(key, hash, Candidate::NONE, now_ms, out)
    }

    /// [`Conntrack::lookup_into`] trying first the entry `prefetch_entry` named for `hash`
    /// (`Table::lookup_into_from`).
    #[inline(always)]
    pub fn lookup_into_from(
        &self,
        key: &Packed,
        hash: u64,
        candidate: Candidate,
        now_ms: u64,
        out: &mut Found,
    ) -> bool {
        if !self.table.lookup_into_from(key, hash, candidate, out) {
            return false;
        }
        if out.expired(now_ms) {
            self.table.kill(out.idx);
            return false;
        }
        true
    }

    /// Whether some live connection already uses `reply` as its reply tuple.
    #[inline]
    pub fn reply_taken(&self, reply: &Tuple) -> bool {
        self.table.contains(&reply.pack())
    }

    /// Tracks a new connection whose first packet (direction original) has TCP flags `tcp_flags`.
    /// Takes shared atomics for the entry and the live count: workers use `create_with`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        orig: &Tuple,
        reply: &Tuple,
        first: impl Into<FirstPacket>,
        masq: bool,
        service_id: u32,
        now_ms: u64,
        early_drop_hint: u64,
    ) -> Result<u32, CreateError> {
        self.create_in(
            None,
            &orig.pack(),
            &reply.pack(),
            &first.into(),
            masq,
            service_id,
            now_ms,
            early_drop_hint,
            None,
        )
    }

    /// `create_with` for a caller that has both tuples packed and hashed at hand (`hash` of the
    /// packed original and reply tuples), as the pipeline does: the insert packs and hashes
    /// neither again. The original tuple's hash is also where an early drop looks for a victim.
    /// `first` by reference: the pipeline holds it across its endpoint choice, and passed by
    /// value it was copied on the stack on the way in.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn create_hashed(
        &self,
        cache: &mut Retired,
        orig: &Packed,
        reply: &Packed,
        first: &FirstPacket,
        masq: bool,
        service_id: u32,
        now_ms: u64,
        hashes: (u64, u64),
    ) -> Result<u32, CreateError> {
        self.create_in(
            Some(cache),
            orig,
            reply,
            first,
            masq,
            service_id,
            now_ms,
            hashes.0,
            Some(hashes),
        )
    }

    /// Prefetches the entries the next `n` connections this worker creates will take from its
    /// allocation cache (a hint: reads nothing, changes nothing).
    #[inline]
    pub fn prefetch_allocations(&self, cache: &Retired, n: usize) {
        self.table.prefetch_allocations(cache, n)
    }

    /// `create` by a worker, from its own allocation cache (its `Retired` list, which its
    /// `maintain` calls fill): no shared atomic per new connection.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn create_with(
        &self,
        cache: &mut Retired,
        orig: &Tuple,
        reply: &Tuple,
        first: impl Into<FirstPacket>,
        masq: bool,
        service_id: u32,
        now_ms: u64,
        early_drop_hint: u64,
    ) -> Result<u32, CreateError> {
        self.create_in(
            Some(cache),
            &orig.pack(),
            &reply.pack(),
            &first.into(),
            masq,
            service_id,
            now_ms,
            early_drop_hint,
            None,
        )
    }

    /// Always inlined: a call of its own (ten arguments, one a 40-byte `FirstPacket`, and a
    /// saved-register prologue) was about 40 instructions per new connection.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn create_in(
        &self,
        cache: Option<&mut Retired>,
        orig: &Packed,
        reply: &Packed,
        first: &FirstPacket,
        masq: bool,
        service_id: u32,
        now_ms: u64,
        early_drop_hint: u64,
        hashes: Option<(u64, u64)>,
    ) -> Result<u32, CreateError> {
        let proto = packed_proto(orig);
        let (proto_state, tags) = match (proto, first.sctp.as_ref()) {
            (IpProto::TCP, _) => (
                tcp::next(TcpState::None, 0, DIR_ORIG, first.tcp_flags).0 as u32,
                0,
            ),
            (IpProto::SCTP, Some(chunks)) => {
                let mut tags = [0u32; 2];
                let st = sctp::next(sctp::SctpState::None, DIR_ORIG, chunks, &mut tags)
                    .map_err(|_| CreateError::Invalid)?;
                (st.as_u8() as u32, sctp::pack_tags(tags))
            }
            _ => (0, 0),
        };
        let mut state = proto_state << PROTO_STATE_SHIFT;
        if masq {
            state |= FLAG_MASQ;
        }
        let expires = now_ms + self.timeout_ms(proto, state);
        // The first packet is the connection's too (conntrack -L counts it). SCTP keeps both
        // directions' bytes in one word, 32 bits each (`Table::count_sctp`).
        let first_bytes = if proto == IpProto::SCTP {
            first.bytes as u32 as u64
        } else {
            first.bytes
        };
        let idx = self
            .table
            .insert(
                orig,
                reply,
                state,
                service_id,
                now_ms,
                expires,
                (1, first_bytes),
                early_drop_hint,
                cache,
                hashes,
            )
            .map_err(CreateError::Insert)?;
        if proto == IpProto::SCTP {
            self.table.set_tags(idx, tags);
        }
        Ok(idx)
    }

    /// Moves a tracked connection's state for one packet in direction `found.dir`, refreshes its
    /// expiry and counts it. Returns the new state word; `Gone` when the entry vanished
    /// meanwhile, `Invalid` when the packet does not fit the connection's state (SCTP: a wrong
    /// verification tag or an impossible chunk), which leaves the entry as it was.
    #[inline]
    pub fn on_packet(
        &self,
        found: &Found,
        packet: impl Into<FirstPacket>,
        bytes: u64,
        now_ms: u64,
    ) -> Result<u32, PacketError> {
        let packet = &packet.into();
        if found.proto() == IpProto::SCTP {
            return self.on_sctp_packet(found, packet, bytes, now_ms);
        }
        let state = self.advance(found, packet.tcp_flags, now_ms)?;
        self.table.count(found.idx, found.dir, bytes);
        Ok(state)
    }

    /// `on_packet`'s state machine for TCP and UDP without the count: the state after a packet
    /// with `tcp_flags` in direction `found.dir`, the closing queue and the expiry.
    #[inline]
    fn advance(&self, found: &Found, tcp_flags: u8, now_ms: u64) -> Result<u32, PacketError> {
        let proto = found.proto();
        let dir = found.dir;
        // UDP becomes a stream (assured, long timeout) once answered and still active two
        // seconds after it began, as in the kernel: a single DNS exchange stays short-lived.
        let udp_stream_age =
            proto == IpProto::UDP && self.table.age_ms(found.idx, now_ms) >= UDP_STREAM_AGE_MS;
        let state = self
            .table
            .update_state(found.idx, |cur| {
                next_state(cur, proto, dir, tcp_flags, udp_stream_age)
            })
            .ok_or(PacketError::Gone)?;
        if proto == IpProto::TCP
            && tcp_flags & (tcp::FIN | tcp::RST) != 0
            && state & FLAG_ASSURED != 0
            && tcp_state_of(state) as u8 >= TcpState::FinWait as u8
        {
            // Closing: droppable early from now on (a second FIN queues it again; the older
            // record is the one that counts).
            self.table.note_closing(found.idx, state);
        }
        self.table
            .set_expires(found.idx, now_ms + self.timeout_ms(proto, state));
        Ok(state)
    }

    /// What the fast lane needs of the clock `now_ms` (`on_plain_packet`), once per batch.
    #[inline]
    pub fn lane_clock(&self, now_ms: u64) -> LaneClock {
        let t = &self.timeouts;
        LaneClock {
            tcp: t.tcp.map(|timeout| Clock32::encode(now_ms + timeout)),
            udp: Clock32::encode(now_ms + t.udp),
            udp_stream: Clock32::encode(now_ms + t.udp_stream),
        }
    }

    /// The established fast lane's `on_packet`, for a packet that leaves its connection's state
    /// word as it is (TCP without SYN, FIN or RST that does not move the state machine, in any
    /// state but CLOSE; UDP but the packet that may make a flow a stream): refreshes the expiry
    /// and counts the packet with the fewest loads and stores (no `update_state` loop), and returns
    /// the state word: exactly what `on_packet` would have done and returned. Anything else
    /// (another protocol, a packet that would change the state, an entry gone since the lookup)
    /// returns None having changed nothing: the caller takes `on_packet`.
    #[inline(always)]
    pub fn on_plain_packet(
        &self,
        found: &Found,
        tcp_flags: u8,
        bytes: u64,
        clock: &LaneClock,
    ) -> Option<u32> {
        let proto = found.proto();
        let plain = match proto {
            IpProto::TCP => tcp_flags & (tcp::SYN | tcp::FIN | tcp::RST) == 0,
            IpProto::UDP => true,
            _ => false,
        };
        if !plain {
            return None;
        }
        // The state word as it is now (not the lookup's copy: an earlier packet of the batch
        // may have moved it).
        self.table
            .touch_if_live(found.idx, found.dir, bytes, |state| {
                if proto == IpProto::TCP {
                    let st = (state & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT;
                    // After a RST the full path refuses the packet (`ct-invalid`); a state this
                    // packet would move goes there too.
                    // A connection whose backend is gone goes to the full path, which resets it.
                    if state & FLAG_BACKEND_GONE != 0
                        || !tcp_plain_keeps(state, found.dir, tcp_flags)
                    {
                        return None;
                    }
                    return Some(clock.tcp[st as usize]);
                }
                let expires = if state & FLAG_ASSURED != 0 {
                    clock.udp_stream
                } else if state & FLAG_SEEN_REPLY != 0 {
                    // Answered but not yet a stream: whether it becomes one depends on its age.
                    return None;
                } else {
                    clock.udp
                };
                (next_state(state, proto, found.dir, tcp_flags, false) == state).then_some(expires)
            })
    }

    /// SCTP: the association state machine with verification tags (see `sctp`).
    fn on_sctp_packet(
        &self,
        found: &Found,
        packet: &FirstPacket,
        bytes: u64,
        now_ms: u64,
    ) -> Result<u32, PacketError> {
        let Some(chunks) = packet.sctp.as_ref() else {
            // A later fragment carries no chunks: it only refreshes the association.
            return self.refresh(found, bytes, now_ms);
        };
        let old_tags = self.table.tags(found.idx);
        let outcome = std::cell::Cell::new(None);
        let mut new_tags = sctp::unpack_tags(old_tags);
        let state = self
            .table
            .update_state(found.idx, |cur| {
                let old =
                    sctp::SctpState::from_u8(((cur & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT) as u8);
                let mut tags = sctp::unpack_tags(old_tags);
                match sctp::next(old, found.dir, chunks, &mut tags) {
                    Ok(new) => {
                        outcome.set(Some((old, new, tags)));
                        let mut s =
                            (cur & !PROTO_STATE_MASK) | (new.as_u8() as u32) << PROTO_STATE_SHIFT;
                        if found.dir == DIR_REPLY {
                            s |= FLAG_SEEN_REPLY;
                        }
                        if sctp::is_assured(new) {
                            s |= FLAG_ASSURED;
                        }
                        s
                    }
                    Err(_) => {
                        outcome.set(None);
                        cur
                    }
                }
            })
            .ok_or(PacketError::Gone)?;
        let Some((old, new, tags)) = outcome.get() else {
            return Err(PacketError::Invalid);
        };
        new_tags.copy_from_slice(&tags);
        let packed = sctp::pack_tags(new_tags);
        if packed != old_tags {
            // Another packet of the handshake may have won the race: then its tags stand.
            self.table.swap_tags(found.idx, old_tags, packed);
        }
        if sctp::refreshes_timeout(old, new, chunks) {
            self.table
                .set_expires(found.idx, now_ms + self.timeout_ms(IpProto::SCTP, state));
        }
        self.table.count_sctp(found.idx, found.dir, bytes);
        Ok(state)
    }

    fn refresh(&self, found: &Found, bytes: u64, now_ms: u64) -> Result<u32, PacketError> {
        let state = self
            .table
            .update_state(found.idx, |cur| cur)
            .ok_or(PacketError::Gone)?;
        self.table
            .set_expires(found.idx, now_ms + self.timeout_ms(found.proto(), state));
        if found.proto() == IpProto::SCTP {
            self.table.count_sctp(found.idx, found.dir, bytes);
        } else {
            self.table.count(found.idx, found.dir, bytes);
        }
        Ok(state)
    }

    /// Whether the connection of the packets with tuple `t` may have them on the kernel's fast
    /// path (`crate::offload`): TCP established and assured, or UDP answered, from the second
    /// packet in this direction (made a stream at 2 s, as its packets would make it); neither
    /// masqueraded (a node address as the source is refused on a pod's interface) nor with its
    /// endpoint gone. When the fast path moved `packets` (`bytes` in all) since the last call,
    /// they are counted in that direction and the expiry refreshed first, as the packets would
    /// have done. False when the connection is gone.
    pub fn offloadable(&self, t: &Tuple, packets: u64, bytes: u64, now_ms: u64) -> bool {
        self.offloadable_as(t, packets, bytes, now_ms, false)
    }

    /// `offloadable` for a TCP connection put on the fast path with its SYN: qualifies as well
    /// while its handshake is under way (SYN_SENT, SYN_RECV; `crate::offload::OPENING_MS`).
    pub fn offloadable_opening(&self, t: &Tuple, packets: u64, bytes: u64, now_ms: u64) -> bool {
        self.offloadable_as(t, packets, bytes, now_ms, true)
    }

    fn offloadable_as(
        &self,
        t: &Tuple,
        packets: u64,
        bytes: u64,
        now_ms: u64,
        opening: bool,
    ) -> bool {
        let key = t.pack();
        let Some(found) = self.lookup(&key, self.hash(&key), now_ms) else {
            return false;
        };
        let mut state = found.state;
        let proto = found.proto();
        let eligible = state & (FLAG_MASQ | FLAG_BACKEND_GONE) == 0
            && match proto {
                // From the handshake's ACK, both directions (`offload::Offloads::consider`): a
                // request and its answer skip the tap, which costs more than the map updates.
                IpProto::TCP => {
                    let st = tcp_state_of(state);
                    (state & FLAG_ASSURED != 0 && st == TcpState::Established)
                        || (opening && matches!(st, TcpState::SynSent | TcpState::SynRecv))
                }
                // Answered, and this direction's second packet or later: a one-shot exchange
                // (a DNS query and its answer) never goes on, a flow that keeps talking does
                // without waiting to become a stream (it becomes one below, as it would here).
                IpProto::UDP => {
                    state & FLAG_SEEN_REPLY != 0
                        && (state & FLAG_ASSURED != 0
                            || self.table.packets(found.idx, found.dir) >= OFFLOAD_UDP_FROM)
                }
                _ => false,
            };
        if eligible && packets > 0 {
            if proto == IpProto::UDP
                && state & FLAG_ASSURED == 0
                && self.table.age_ms(found.idx, now_ms) >= UDP_STREAM_AGE_MS
            {
                if let Some(s) = self.table.update_state(found.idx, |s| s | FLAG_ASSURED) {
                    state = s;
                }
            }
            self.table
                .set_expires(found.idx, now_ms + self.timeout_ms(proto, state));
            self.table
                .count_many(found.idx, found.dir, packets as u32, bytes);
        }
        eligible
    }

    /// Moves the TCP connection of `t` as a segment with `tcp_flags` in that direction would
    /// (the state, the closing queue, the expiry) without counting it: a FIN or the close's last
    /// ACK that the fast path moved and counted (`crate::offload`). Nothing when the connection
    /// is gone.
    pub fn offloaded_segment(&self, t: &Tuple, tcp_flags: u8, now_ms: u64) {
        let key = t.pack();
        if let Some(found) = self.lookup(&key, self.hash(&key), now_ms) {
            if found.proto() == IpProto::TCP {
                let _ = self.advance(&found, tcp_flags, now_ms);
            }
        }
    }

    /// Counts `packets` (`bytes` in all) that the fast path moved for the connection of `t`, in
    /// that direction, whatever its state now (a flow taken off as its connection closes: its
    /// last packets came before the FIN that took it off, which set the expiry).
    pub fn count_offloaded(&self, t: &Tuple, packets: u64, bytes: u64, now_ms: u64) {
        if packets == 0 {
            return;
        }
        let key = t.pack();
        if let Some(found) = self.lookup(&key, self.hash(&key), now_ms) {
            self.table
                .count_many(found.idx, found.dir, packets as u32, bytes);
        }
    }

    /// Removes a connection now (its next packet starts a new one).
    pub fn kill(&self, idx: u32) -> bool {
        self.table.kill(idx)
    }

    /// Removes the connection a listing showed, if that entry still holds it (it may have ended
    /// and been reused since).
    pub fn kill_view(&self, view: &EntryView) -> bool {
        match self.table.view(view.idx) {
            Some(now) if now.orig == view.orig && now.reply == view.reply => {
                self.table.kill(view.idx)
            }
            _ => false,
        }
    }

    /// Marks the connection a listing showed as one whose endpoint has left its Service for good
    /// (`FLAG_BACKEND_GONE`), if that entry still holds it; true when this call marked it.
    pub fn mark_backend_gone(&self, view: &EntryView) -> bool {
        match self.table.view(view.idx) {
            Some(now) if now.orig == view.orig && now.reply == view.reply => {
                let marked = std::cell::Cell::new(false);
                self.table.update_state(view.idx, |s| {
                    marked.set(s & FLAG_BACKEND_GONE == 0);
                    s | FLAG_BACKEND_GONE
                });
                marked.get()
            }
            _ => false,
        }
    }

    fn timeout_ms(&self, proto: IpProto, state: u32) -> u64 {
        let t = &self.timeouts;
        match proto {
            IpProto::TCP => t.tcp[tcp_state_of(state) as usize],
            IpProto::UDP if state & FLAG_ASSURED != 0 => t.udp_stream,
            IpProto::UDP => t.udp,
            IpProto::SCTP => match sctp::timeout_class(sctp::SctpState::from_u8(
                ((state & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT) as u8,
            )) {
                sctp::SctpTimeout::Established => t.sctp_established,
                sctp::SctpTimeout::Short => t.sctp_short,
            },
            _ => t.icmp,
        }
    }

    // ---- session affinity ------------------------------------------------------------------

    /// The key of a client's affinity record: the client, and the Service port's id in place of
    /// the destination (as an IPv4-mapped address for an IPv4 client: the table keeps an IPv4
    /// tuple's addresses as 32 bits, `table::Hot`).
    fn affinity_key(service_id: u32, client: &Addr, family: Family) -> Tuple {
        let svc = match family {
            Family::V4 => Addr::from_v4(service_id.to_be_bytes()),
            Family::V6 => {
                let mut svc = [0u8; 16];
                svc[12..].copy_from_slice(&service_id.to_be_bytes());
                Addr(svc)
            }
        };
        Tuple {
            src: *client,
            dst: svc,
            sport: 0,
            dport: 0,
            proto: AFFINITY_PROTO,
            family,
        }
    }

    /// The endpoint `client` was last sent to for this Service port, if the record is fresh.
    #[inline]
    pub fn affinity_get(
        &self,
        service_id: u32,
        client: &Addr,
        family: Family,
        now_ms: u64,
    ) -> Option<(Addr, u16, u32)> {
        let key = Self::affinity_key(service_id, client, family).pack();
        let found = self.lookup(&key, self.hash(&key), now_ms)?;
        let other = found.other_tuple();
        Some((other.src, other.sport, found.idx))
    }

    /// Refreshes an existing record's timeout.
    #[inline]
    pub fn affinity_touch(&self, idx: u32, timeout_s: u32, now_ms: u64) {
        self.table
            .set_expires(idx, now_ms + timeout_s as u64 * 1000);
    }

    /// Records that `client` goes to `endpoint` for this Service port for `timeout_s` seconds.
    #[allow(clippy::too_many_arguments)]
    pub fn affinity_set(
        &self,
        service_id: u32,
        client: &Addr,
        family: Family,
        endpoint: (Addr, u16),
        timeout_s: u32,
        now_ms: u64,
        hint: u64,
    ) -> Result<u32, InsertError> {
        let key = Self::affinity_key(service_id, client, family);
        let value = Tuple {
            src: endpoint.0,
            dst: *client,
            sport: endpoint.1,
            dport: 0,
            proto: AFFINITY_PROTO,
            family,
        };
        self.table.insert(
            &key.pack(),
            &value.pack(),
            FLAG_SINGLE_KEY | FLAG_ASSURED,
            service_id,
            now_ms,
            now_ms + timeout_s as u64 * 1000,
            (0, 0),
            hint,
            None,
            None,
        )
    }

    // ---- worker life cycle -------------------------------------------------------------------

    /// A worker starts a batch (see `grace`).
    #[inline]
    pub fn enter(&self, worker: usize) {
        self.table.grace.enter(worker)
    }

    #[inline]
    pub fn leave(&self, worker: usize) {
        self.table.grace.leave(worker)
    }

    /// Incremental expiry, between batches. Returns how many entries expired.
    pub fn maintain(&self, now_ms: u64, budget: usize, retired: &mut Retired) -> usize {
        self.table.maintain(now_ms, budget, retired)
    }

    /// Adds what a worker's `retired` cache has not yet added to the live count: with several
    /// workers a maintenance step adds it only when the clock moved (or it grew large), so a
    /// worker that stops calls this for an exact count at rest.
    pub fn flush_pending(&self, retired: &mut Retired) {
        self.table.flush_pending(retired)
    }

    /// A `Retired` list sized for this table's maintenance.
    pub fn retired_list(&self) -> Retired {
        Retired::with_capacity(4096)
    }

    // ---- listings ------------------------------------------------------------------------------

    /// Every live connection (affinity records excluded), streamed, including those past their
    /// expiry that the scan has not reclaimed yet (see `connections_at`).
    pub fn connections(&self) -> impl Iterator<Item = EntryView> + '_ {
        self.table.iter().filter(|v| v.orig.proto != AFFINITY_PROTO)
    }

    /// `connections` that have not expired at `now_ms`: what listings show. As the kernel's
    /// `conntrack -L`, an expired connection is gone to them whether or not the expiry scan,
    /// which may take a minute to reach it, has reclaimed its entry.
    pub fn connections_at(&self, now_ms: u64) -> impl Iterator<Item = EntryView> + '_ {
        self.connections().filter(move |v| v.expires_ms >= now_ms)
    }

    /// Seconds left before `view` expires at `now_ms`.
    pub fn timeout_left_s(view: &EntryView, now_ms: u64) -> u64 {
        view.expires_ms.saturating_sub(now_ms) / 1000
    }

    /// The kernel's name of the entry's protocol state (TCP), for listings.
    pub fn state_name(view: &EntryView) -> Option<&'static str> {
        let st = ((view.state & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT) as u8;
        match view.orig.proto {
            IpProto::TCP => Some(TcpState::from_u8(st).name()),
            IpProto::SCTP => Some(sctp::SctpState::from_u8(st).name()),
            _ => None,
        }
    }
}

/// The state word after a packet of `proto` (not SCTP) with `tcp_flags` in direction `dir`:
/// the seen-reply and assured flags, the TCP state machine. `udp_stream_age`: the connection is
/// old enough to become a UDP stream (`UDP_STREAM_AGE_MS`).
#[inline(always)]
fn next_state(cur: u32, proto: IpProto, dir: u8, tcp_flags: u8, udp_stream_age: bool) -> u32 {
    let mut s = cur;
    if dir == DIR_REPLY {
        s |= FLAG_SEEN_REPLY;
    }
    if s & FLAG_SEEN_REPLY != 0 {
        match proto {
            IpProto::UDP if udp_stream_age => s |= FLAG_ASSURED,
            // ICMP is assured once answered; TCP once established, SCTP once its association is.
            IpProto::ICMP | IpProto::ICMPV6 => s |= FLAG_ASSURED,
            _ => {}
        }
    }
    if proto == IpProto::TCP {
        let (next, dirflags) = tcp::next(
            TcpState::from_u8(((s & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT) as u8),
            (s >> DIR_FLAGS_SHIFT) as u8,
            dir,
            tcp_flags,
        );
        s = (s & !PROTO_STATE_MASK & !(0xff << DIR_FLAGS_SHIFT))
            | (next as u32) << PROTO_STATE_SHIFT
            | (dirflags as u32) << DIR_FLAGS_SHIFT;
        if next == TcpState::Established {
            s |= FLAG_ASSURED;
        }
    }
    s
}

/// Whether a TCP packet without SYN, FIN or RST (`tcp_flags`) in direction `dir` leaves the
/// state word `state` as it is (`next_state` would return it unchanged), in a state the fast
/// lane handles (not CLOSE). The transitions `tcp::next` makes on such a packet, as a mask of
/// the states that stay: NONE moves to SYN_SENT; SYN_RECV to ESTABLISHED on an ACK from the
/// client; once both sides sent a FIN, ESTABLISHED, FIN_WAIT and CLOSE_WAIT move to LAST_ACK and
/// LAST_ACK on an ACK to TIME_WAIT. Besides: a reply sets SEEN_REPLY, ESTABLISHED sets ASSURED.
/// A few masks and compares instead of the state machine's match (`next_state`, inlined, was
/// about 30 instructions per packet of the lane); `tests::tcp_plain_keeps_is_next_state`
/// compares the two on every state word the machine can see.
#[inline(always)]
fn tcp_plain_keeps(state: u32, dir: u8, tcp_flags: u8) -> bool {
    use TcpState::*;
    const fn bits(states: &[TcpState]) -> u32 {
        let mut m = 0;
        let mut i = 0;
        while i < states.len() {
            m |= 1 << states[i] as u32;
            i += 1;
        }
        m
    }
    const KEPT: u32 = bits(&[
        SynSent,
        SynRecv,
        Established,
        FinWait,
        CloseWait,
        LastAck,
        TimeWait,
    ]);
    const CLIENT_ACK_MOVES: u32 = bits(&[SynRecv]);
    const BOTH_FINS_MOVE: u32 = bits(&[Established, FinWait, CloseWait]);
    const BOTH_FINS_ACK_MOVES: u32 = bits(&[LastAck]);
    let st = (state & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT;
    let ack = tcp_flags & tcp::ACK != 0;
    let both_fins = (state >> DIR_FLAGS_SHIFT) & 0xff == tcp::BOTH_FINS as u32;
    let mut kept = KEPT;
    if ack && dir == DIR_ORIG {
        kept &= !CLIENT_ACK_MOVES;
    }
    if both_fins {
        kept &= !BOTH_FINS_MOVE;
        if ack {
            kept &= !BOTH_FINS_ACK_MOVES;
        }
    }
    st < 32
        && kept >> st & 1 == 1
        && (dir == DIR_ORIG || state & FLAG_SEEN_REPLY != 0)
        && (st != Established as u32 || state & FLAG_ASSURED != 0)
}

#[inline]
pub fn tcp_state_of(state: u32) -> TcpState {
    TcpState::from_u8(((state & PROTO_STATE_MASK) >> PROTO_STATE_SHIFT) as u8)
}

#[cfg(test)]
mod tests;
