//! The ranges every numeric field must lie in, and the sizes they bound.

use std::time::Duration;

/// The allowed values of one numeric field (docs/config.md lists the same table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Int { min: u64, max: u64 },
    Time { min: Duration, max: Duration },
}

/// Every numeric field, its range, and what 0 means where 0 is special. `validate` checks each;
/// a test checks that docs/config.md states each.
pub const RANGES: &[(&str, Limit, &str)] = &[
    (
        "conntrack.maxEntries",
        Limit::Int {
            min: 0,
            max: MAX_CONNTRACK_ENTRIES as u64,
        },
        "0: the default, 1048576",
    ),
    (
        "conntrack.tcpEstablishedTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 24h",
    ),
    (
        "conntrack.tcpCloseWaitTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 1h",
    ),
    (
        "conntrack.udpTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 30s",
    ),
    (
        "conntrack.udpStreamTimeout",
        Limit::Time {
            min: Duration::ZERO,
            max: MAX_CT_TIMEOUT,
        },
        "0s: the default, 2m",
    ),
    (
        "sync.minSyncPeriod",
        Limit::Time {
            min: Duration::ZERO,
            max: Duration::from_secs(3600),
        },
        "",
    ),
    (
        "sync.syncPeriod",
        Limit::Time {
            min: Duration::from_millis(10),
            max: Duration::from_secs(24 * 3600),
        },
        "",
    ),
    (
        "workers.count",
        Limit::Int {
            min: 1,
            max: MAX_WORKERS as u64,
        },
        "",
    ),
    (
        "workers.cpus",
        Limit::Int {
            min: 0,
            max: MAX_CPU_ID as u64,
        },
        "each entry; and it must be a CPU this machine has",
    ),
    (
        "workers.idle.spinPolls",
        Limit::Int {
            min: 0,
            max: 100_000_000,
        },
        "",
    ),
    (
        "workers.idle.maxSleep",
        Limit::Time {
            min: Duration::from_micros(10),
            max: Duration::from_secs(1),
        },
        "",
    ),
    (
        "afxdp.frames",
        Limit::Int {
            min: MIN_UMEM_FRAMES as u64,
            max: MAX_UMEM_FRAMES as u64,
        },
        "",
    ),
    (
        "afxdp.rxRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two, at most afxdp.frames",
    ),
    (
        "afxdp.fillRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two, at most afxdp.frames",
    ),
    (
        "afxdp.txRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two",
    ),
    (
        "afxdp.completionRingSize",
        Limit::Int {
            min: MIN_RING as u64,
            max: MAX_RING as u64,
        },
        "a power of two",
    ),
    (
        "loadBalancing.maglevTableSize",
        Limit::Int {
            min: kxdp_dataplane::maglev::MIN_TABLE_SIZE as u64,
            max: kxdp_dataplane::maglev::MAX_TABLE_SIZE as u64,
        },
        "a prime",
    ),
    (
        "podInterception.queueLength",
        Limit::Int {
            min: MIN_TAP_QUEUE as u64,
            max: MAX_TAP_QUEUE as u64,
        },
        "",
    ),
];

/// The shortest tap queue: a round's frames (`tap::TAP_BATCH`) several times over.
pub const MIN_TAP_QUEUE: u32 = 32;
/// The longest tap queue: 64 Ki frames per queue, far past where waiting in it stops helping.
pub const MAX_TAP_QUEUE: u32 = 1 << 16;

/// Fewer UMEM frames than this cannot give a worker's sockets their smallest fill shares and a
/// batch in hand.
pub const MIN_UMEM_FRAMES: u32 = 1024;
/// 1 Mi frames: 4 GiB of packet buffers per worker; more is a typo, not a node.
pub const MAX_UMEM_FRAMES: u32 = 1 << 20;
/// The smallest ring: one batch (`worker::BATCH`).
pub const MIN_RING: u32 = 64;
/// The deepest ring: 64 Ki entries (1 MiB of descriptors for an RX or TX ring, per socket).
pub const MAX_RING: u32 = 1 << 16;

/// 64 Mi entries: about 14 GiB of table; more is a typo, not a node.
pub const MAX_CONNTRACK_ENTRIES: u32 = 1 << 26;
/// The kernel's `nf_conntrack_tcp_timeout_established` default is 5 days; 30 days is plenty.
pub const MAX_CT_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
pub const MAX_WORKERS: usize = 256;
/// Linux's largest CPU number on x86-64 (`CONFIG_NR_CPUS` at most 8192).
pub const MAX_CPU_ID: usize = 8191;

/// Bytes the conntrack table allocates up front for `max_entries`
/// (`kxdp_dataplane::conntrack::table_bytes`: 112-byte entries for `max + max/128` entries, and
/// 4-byte index slots, 3.2 per entry, at least 2^17 below about 40k entries).
pub fn conntrack_bytes(max_entries: u32) -> u64 {
    kxdp_dataplane::conntrack::table_bytes(max_entries)
}
