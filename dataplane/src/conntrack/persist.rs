//! The conntrack state file: the table's arrays in a `MAP_SHARED` mapping of a file on a host path,
//! so that a restarted (or upgraded) kxdp continues every connection the previous process tracked.
//!
//! File layout (native byte order; the file never leaves its node):
//!
//! ```text
//! 0       header (4096 bytes, `HEADER_WORDS` u64 words used)
//! 4096    hot      capacity × 64 bytes   (table::Hot: IPv4 tuples, state, counters; SCTP tags)
//!         cold     capacity × 48 bytes   (table::Cold: the rest of IPv6 tuples)
//!         index    nslots × 4 bytes      (rebuilt on every open)
//! ```
//!
//! Header words: magic, layout version, layout fingerprint (entry size and field offsets), entry
//! size, capacity, index slots, configured maximum, hash seed, boot id (2 words), clean-shutdown
//! flag, time of the clean shutdown, owner (pid, open number), checksum (FNV-1a over the words before it).
//!
//! Opening checks the header, in this order: magic (else `discarded_corrupt`), checksum
//! (`discarded_corrupt`), layout version and fingerprint (`discarded_version`), boot id
//! (`discarded_boot`: CLOCK_MONOTONIC times mean nothing after a reboot), length
//! (`discarded_truncated`). A file that passes is mapped and every entry is checked
//! (`table::check_entry`) whether or not the previous process shut down cleanly; the index, the
//! free list and the counts are rebuilt from the entries kept. A file written for another table
//! size (`maxEntries` changed) is migrated: its good entries are copied into a new file of the new
//! size, which then replaces it. A discarded file is replaced by an empty one; opening never
//! fails because of what the file holds, only when the file cannot be created at all.
//!
//! Versions: `LAYOUT_VERSION` is what this build writes; `readable` lists what it can read. When
//! the entry layout changes, bump the version, keep the old `LAYOUT` description and add a
//! converter from the old version next to `migrate` (copy the old records into the new form), so
//! that an upgrade keeps its connections and a rollback (an older build meeting a newer file)
//! starts clean with a warning. Version 4 changed only the index's size for small tables
//! (`Geometry::for_max_live`): a version-3 file is read as this version's, and migrated (its
//! entries copied into a file of the new geometry) where its index is smaller than this build's.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kxdp_kernel::shm::{Mapping, SharedSlice};

use super::table::{
    check_entry, check_fields, Check, Cold, EntryRef, Geometry, Hot, Storage, Table, KEY_MASK,
};
use super::tuple::Packed;

pub const HEADER_BYTES: usize = 4096;
pub const MAGIC: u64 = u64::from_le_bytes(*b"KXDPCTRK");
/// The entry layout this build writes (see `table::Hot`).
pub const LAYOUT_VERSION: u64 = 4;
/// The entry layout of versions 3 and 4, field by field, with offsets (the index slots' rule
/// follows: `LAYOUT_V3`, `LAYOUT`).
macro_rules! layout_v3_entries {
    () => {
        "hot 64 align 16, array on a 64-byte boundary; u64 addrs_orig @0 (src low 32 << 32 | dst low \
32); u64 word4_orig @8 (key bits 0..41, created tick 7 bits @41, service_id low 16 @48); u64 \
addrs_reply @16; u64 word4_reply @24 (key, created tick high 7 @41, service_id high 16 @48); \
u64x2 bytes @32 (sctp: bytes orig|reply<<32 @32, tags @40); u32 state @48 (seq bits 24..32); u32 \
expires_or_next @52 (2 ms units); u32x2 packets @56; cold 48 after capacity hots: per tuple \
(ipv6 only) u64 src_high, u64 dst_high, u64 src_low_high32 << 32 | dst_low_high32; tuple family \
bit 40 (set: ipv6; ipv4 addresses are ::ffff:a.b.c.d); slots u32 ((tag<<key_bits | \
(idx<<1|dir)+1)<<1, tomb epoch<<1|1), "
    };
}
/// The entry layout, field by field, with offsets: hashed into the header's fingerprint, so that
/// a change nobody remembered to version is still caught. Version 4 is version 3 with a small
/// table's index sparser (`Geometry::for_max_live`): the same entries.
const LAYOUT: &str = concat!(
    layout_v3_entries!(),
    "nslots = 16-rounded 3.2 x capacity, at least min(2^17, 16 x capacity)"
);
/// Layout version 3 (one 64-byte line per IPv4 connection, a denser index), which this build reads as its own entries, migrating a
/// small table to its sparser index.
const LAYOUT_V3: &str = concat!(layout_v3_entries!(), "nslots = 16-rounded 3.2 x capacity");
/// Layout version 2, which this build converts: one 112-byte record per entry.
const LAYOUT_V2: &str =
    "entry 112 align 16; u64x5 tuple_orig @0 (word 4: key bits 0..41, created tick 7 bits @41, \
service_id low 16 @48); u64x5 tuple_reply @40 (word 4: key, created tick high 7 @41, service_id \
high 16 @48); u64x2 bytes @80 (sctp: bytes orig|reply<<32 @80, tags @88); u32 state @96 (seq \
bits 24..32); u32 expires_or_next @100 (2 ms units); u32x2 packets @104; tuple family bit 40; \
slots u32 ((tag<<key_bits | (idx<<1|dir)+1)<<1, tomb epoch<<1|1), nslots = 16-rounded 3.2 x capacity";
/// A version-2 entry.
type EntryV2 = kxdp_kernel::shm::AtomicRecord<12, 4>;
/// Bytes of one entry (both records; a version-2 entry is as long, so the file's length for a
/// geometry is the same in both versions).
const ENTRY_BYTES: usize = std::mem::size_of::<Hot>() + std::mem::size_of::<Cold>();
const _: () = assert!(ENTRY_BYTES == std::mem::size_of::<EntryV2>());
/// Test-only: pretend this build's layout version is another (lab tests of an upgrade into an
/// unreadable layout). Not documented for operators.
pub const VERSION_OVERRIDE_ENV: &str = "KXDP_TEST_CONNTRACK_LAYOUT_VERSION";

// Header word indexes.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_FINGERPRINT: usize = 2;
const H_ENTRY_SIZE: usize = 3;
const H_CAPACITY: usize = 4;
const H_NSLOTS: usize = 5;
const H_MAX_LIVE: usize = 6;
const H_SEED: usize = 7;
const H_BOOT: usize = 8; // and 9
const H_CLEAN: usize = 10;
const H_SAVED_AT: usize = 11;
const H_OWNER: usize = 12;
const H_CHECKSUM: usize = 13;
pub const HEADER_WORDS: usize = 14;

/// What opening a state file did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestoreResult {
    /// No file (or an empty one): a new, empty table.
    Created,
    /// The previous process's connections continue.
    Restored,
    /// Restored into a table of another size (`maxEntries` changed).
    Migrated,
    /// Written by a build with a layout this one cannot read: started empty.
    DiscardedVersion,
    /// Bad magic or header checksum, or an impossible geometry: started empty.
    DiscardedCorrupt,
    /// Written before the last reboot: started empty.
    DiscardedBoot,
    /// Shorter than its header says: started empty.
    DiscardedTruncated,
}

impl RestoreResult {
    pub const ALL: [RestoreResult; 7] = [
        RestoreResult::Created,
        RestoreResult::Restored,
        RestoreResult::Migrated,
        RestoreResult::DiscardedVersion,
        RestoreResult::DiscardedCorrupt,
        RestoreResult::DiscardedBoot,
        RestoreResult::DiscardedTruncated,
    ];

    /// The `result` label of `kxdp_conntrack_restore_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreResult::Created => "created",
            RestoreResult::Restored => "restored",
            RestoreResult::Migrated => "migrated",
            RestoreResult::DiscardedVersion => "discarded_version",
            RestoreResult::DiscardedCorrupt => "discarded_corrupt",
            RestoreResult::DiscardedBoot => "discarded_boot",
            RestoreResult::DiscardedTruncated => "discarded_truncated",
        }
    }

    pub fn is_discarded(self) -> bool {
        matches!(
            self,
            RestoreResult::DiscardedVersion
                | RestoreResult::DiscardedCorrupt
                | RestoreResult::DiscardedBoot
                | RestoreResult::DiscardedTruncated
        )
    }
}

/// What `Conntrack::open_file` found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    pub path: PathBuf,
    pub result: RestoreResult,
    /// Why the file was discarded (for the log), if it was.
    pub reason: Option<String>,
    /// Whether the previous process marked the file clean at exit (SIGTERM) rather than dying.
    pub clean_shutdown: bool,
    /// Connections and affinity records kept.
    pub restored: u64,
    /// Entries past their expiry.
    pub expired: u64,
    /// Malformed or duplicate entries, and (migration) entries that did not fit the new size.
    pub dropped: u64,
}

impl RestoreReport {
    /// One line for the log.
    pub fn describe(&self) -> String {
        let p = self.path.display();
        match self.result {
            RestoreResult::Created => format!("conntrack state file {p}: created (empty table)"),
            RestoreResult::Restored | RestoreResult::Migrated => format!(
                "conntrack state file {p}: {} {} entries after a {} ({} expired, {} malformed or duplicate dropped)",
                if self.result == RestoreResult::Migrated {
                    "migrated to the new size"
                } else {
                    "restored"
                },
                self.restored,
                if self.clean_shutdown {
                    "clean shutdown"
                } else {
                    "crash (no clean-shutdown mark; every entry checked)"
                },
                self.expired,
                self.dropped,
            ),
            _ => format!(
                "warning: conntrack state file {p} discarded ({}): {}; starting with an empty table \
                 (connections through this node are reset)",
                self.result.as_str(),
                self.reason.as_deref().unwrap_or("unreadable"),
            ),
        }
    }
}

/// What the process compares a file against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Environment {
    pub boot_id: [u8; 16],
    pub now_ms: u64,
    /// The layout version this process writes and reads (`LAYOUT_VERSION` unless a test says
    /// otherwise through `VERSION_OVERRIDE_ENV`).
    pub version: u64,
}

impl Environment {
    pub fn current() -> Environment {
        Environment {
            boot_id: boot_id(),
            now_ms: crate::clock::clock_ms(),
            version: std::env::var(VERSION_OVERRIDE_ENV)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(LAYOUT_VERSION),
        }
    }
}

/// The kernel's boot id (a UUID), or zeroes when it cannot be read.
pub fn boot_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            let v = std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok());
            id[i] = v.unwrap_or(0);
        }
    }
    id
}

/// FNV-1a over 64-bit words (a checksum against damage, not against an adversary).
fn fnv(words: &[u64]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The fingerprint of layout `version` (this build's, or version 2's or 3's).
fn fingerprint_of(version: u64) -> u64 {
    let layout = match version {
        2 => LAYOUT_V2,
        3 => LAYOUT_V3,
        _ => LAYOUT,
    };
    let words: Vec<u64> = layout
        .as_bytes()
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect();
    fnv(&words) ^ ENTRY_BYTES as u64
}

fn fingerprint() -> u64 {
    fingerprint_of(LAYOUT_VERSION)
}

/// The versions this build can read (see the module notes on adding a converter): its own,
/// version 2 (converted: `convert_v2`) and version 3 (the same entries: `same_entries`).
fn readable(version: u64, ours: u64) -> bool {
    version == ours || (ours == LAYOUT_VERSION && (version == 2 || version == 3))
}

/// Whether a file of layout `version` holds entries as this build's (`ours`) are: its own, or
/// version 3, which differs only in the index's size (rebuilt on every open anyway).
fn same_entries(version: u64, ours: u64) -> bool {
    version == ours || (ours == LAYOUT_VERSION && version == 3)
}

/// The geometry a file of layout `version` has for `max_live` entries.
fn geometry_of(version: u64, max_live: u32) -> Geometry {
    if version < 4 {
        Geometry::before_v4(max_live)
    } else {
        Geometry::for_max_live(max_live)
    }
}

pub fn file_len(g: &Geometry) -> usize {
    HEADER_BYTES + g.array_bytes().iter().sum::<usize>()
}

/// The open file's header, kept mapped for the clean-shutdown mark.
pub(crate) struct StateFile {
    header: SharedSlice<AtomicU64>,
    pub path: PathBuf,
    /// The open file, holding an exclusive lock (`flock`) until the clean-shutdown mark: two
    /// processes never work on one file at once.
    lock: std::sync::Mutex<Option<File>>,
    /// Who opened the file last (pid and a per-open number, in the header): the clean-shutdown
    /// mark is only written by the current owner.
    owner: u64,
}

fn next_owner() -> u64 {
    static OPENS: AtomicU64 = AtomicU64::new(1);
    (std::process::id() as u64) << 32 | (OPENS.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff)
}

impl StateFile {
    fn write_header(&self, g: &Geometry, seed: u64, env: &Environment, clean: bool) {
        let owner = self.owner;
        let h = &self.header;
        let boot = env.boot_id;
        let words = [
            MAGIC,
            env.version,
            fingerprint(),
            ENTRY_BYTES as u64,
            g.capacity as u64,
            g.nslots as u64,
            g.max_live as u64,
            seed,
            u64::from_ne_bytes(boot[..8].try_into().unwrap()),
            u64::from_ne_bytes(boot[8..].try_into().unwrap()),
            clean as u64,
            if clean { env.now_ms } else { 0 },
            owner,
        ];
        for (w, v) in h.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        h[H_CHECKSUM].store(fnv(&words), Ordering::Release);
    }

    /// Marks the file cleanly written (after the workers stopped), unless another process has
    /// opened it since (a takeover: the new owner's header stands).
    pub fn mark_clean(&self, now_ms: u64) -> bool {
        let h = &self.header;
        if h[H_OWNER].load(Ordering::Acquire) != self.owner {
            return false;
        }
        h[H_CLEAN].store(1, Ordering::Relaxed);
        h[H_SAVED_AT].store(now_ms, Ordering::Relaxed);
        let words: Vec<u64> = h[..H_CHECKSUM]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        h[H_CHECKSUM].store(fnv(&words), Ordering::Release);
        // Let the next process in (a takeover's new process may be waiting for it).
        // (Explicitly: the mapping holds the open file, and with it the lock, until unmapped.)
        if let Ok(mut f) = self.lock.lock() {
            if let Some(f) = f.take() {
                let _ = kxdp_kernel::shm::unlock(&f);
            }
        }
        true
    }
}

/// Takes the file's exclusive lock, or says who has it.
fn lock(file: &File, path: &Path) -> io::Result<()> {
    if kxdp_kernel::shm::try_lock_exclusive(file)? {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "{} is in use by another kxdp process (locked)",
                path.display()
            ),
        ))
    }
}

/// Why a header cannot be used as it is.
enum Reject {
    Discard(RestoreResult, String),
    /// Readable, but written for another table size or hash seed, or in layout version 2 (its
    /// geometry, its clean flag, its layout version).
    Migrate(Geometry, bool, u64),
}

/// Checks a header read from a file `len` bytes long against what this process expects.
fn check_header(
    words: &[u64; HEADER_WORDS],
    len: usize,
    want: &Geometry,
    seed: u64,
    env: &Environment,
) -> Result<bool, Reject> {
    use RestoreResult::*;
    let discard = |r, why: String| Err(Reject::Discard(r, why));
    if words[H_MAGIC] != MAGIC {
        return discard(
            DiscardedCorrupt,
            "bad magic (not a kxdp conntrack file)".into(),
        );
    }
    if fnv(&words[..H_CHECKSUM]) != words[H_CHECKSUM] {
        return discard(DiscardedCorrupt, "header checksum mismatch".into());
    }
    if !readable(words[H_VERSION], env.version) {
        return discard(
            DiscardedVersion,
            format!(
                "layout version {} (this build reads version {})",
                words[H_VERSION], env.version
            ),
        );
    }
    if words[H_FINGERPRINT] != fingerprint_of(words[H_VERSION])
        || words[H_ENTRY_SIZE] != ENTRY_BYTES as u64
    {
        return discard(
            DiscardedVersion,
            "entry layout fingerprint differs from this build's".into(),
        );
    }
    let boot = [words[H_BOOT], words[H_BOOT + 1]];
    let ours = [
        u64::from_ne_bytes(env.boot_id[..8].try_into().unwrap()),
        u64::from_ne_bytes(env.boot_id[8..].try_into().unwrap()),
    ];
    if boot != ours {
        return discard(
            DiscardedBoot,
            "written before the last reboot (boot id differs)".into(),
        );
    }
    let old = Geometry {
        max_live: words[H_MAX_LIVE] as u32,
        capacity: words[H_CAPACITY] as usize,
        nslots: words[H_NSLOTS] as usize,
    };
    if old != geometry_of(words[H_VERSION], old.max_live) || words[H_MAX_LIVE] > u32::MAX as u64 {
        return discard(
            DiscardedCorrupt,
            format!(
                "impossible geometry (capacity {}, {} index slots)",
                old.capacity, old.nslots
            ),
        );
    }
    let need = file_len(&old);
    if len < need {
        return discard(
            DiscardedTruncated,
            format!("{len} bytes, its header needs {need}"),
        );
    }
    // (A version-3 file of the geometry this build wants, any table from about 40k entries up,
    // is taken as it is: its header is rewritten as this version's on open.)
    if old != *want || words[H_SEED] != seed || !same_entries(words[H_VERSION], env.version) {
        return Err(Reject::Migrate(old, words[H_CLEAN] == 1, words[H_VERSION]));
    }
    Ok(words[H_CLEAN] == 1)
}

fn read_header(file: &mut File) -> io::Result<[u64; HEADER_WORDS]> {
    let mut buf = [0u8; HEADER_WORDS * 8];
    file.read_exact(&mut buf)?;
    Ok(std::array::from_fn(|i| {
        u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap())
    }))
}

fn open_rw(path: &Path, truncate: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(truncate)
        .open(path)
}

/// Maps `file` (resized to `g`'s length when `fresh`) and views its arrays and header.
fn map(file: &File, g: &Geometry, fresh: bool) -> io::Result<(Storage, SharedSlice<AtomicU64>)> {
    let len = file_len(g);
    if fresh {
        file.set_len(0)?;
        file.set_len(len as u64)?;
    }
    let m: Arc<Mapping> = Mapping::file(file, len)?;
    let storage = Storage::view(&m, HEADER_BYTES, g)
        .ok_or_else(|| io::Error::other("state file mapping too small"))?;
    let header = m
        .view(0, HEADER_WORDS)
        .ok_or_else(|| io::Error::other("state file mapping too small"))?;
    Ok((storage, header))
}

/// A table over the state file at `path`, with its report. `participants` and `seed` as
/// `Table::with_storage`; `max_expiry_ms`: no entry's expiry may lie beyond it.
pub(crate) fn open(
    path: &Path,
    g: Geometry,
    participants: usize,
    seed: u64,
    env: &Environment,
    max_expiry_ms: u64,
) -> io::Result<(Table, StateFile, RestoreReport)> {
    let seed = seed | 1;
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let mut report = RestoreReport {
        path: path.to_path_buf(),
        result: RestoreResult::Created,
        reason: None,
        clean_shutdown: false,
        restored: 0,
        expired: 0,
        dropped: 0,
    };
    let mut file = open_rw(path, false)?;
    lock(&file, path)?;
    let len = file.metadata()?.len() as usize;
    let verdict = if len == 0 {
        None
    } else if len < HEADER_BYTES {
        Some(Err(Reject::Discard(
            RestoreResult::DiscardedTruncated,
            format!("{len} bytes, shorter than its header"),
        )))
    } else {
        Some(check_header(&read_header(&mut file)?, len, &g, seed, env))
    };
    let (mut table, header, path_file) = match verdict {
        Some(Ok(clean)) => {
            let (storage, header) = map(&file, &g, false)?;
            report.result = RestoreResult::Restored;
            report.clean_shutdown = clean;
            (
                Table::with_storage(g, storage, participants, seed),
                header,
                file,
            )
        }
        Some(Err(Reject::Migrate(old, clean, version))) => {
            // Copy the old file's good entries into a new file, then put it in the old one's place
            // (the old mapping stays valid after the rename).
            let tmp = path.with_extension("migrating");
            let new_file = open_rw(&tmp, true)?;
            lock(&new_file, &tmp)?;
            let (storage, header) = map(&new_file, &g, true)?;
            let mut k = 0usize;
            let mut take = |report: &mut RestoreReport| {
                if k >= g.max_live as usize {
                    report.dropped += 1;
                    return None;
                }
                k += 1;
                Some(storage.entries.at(k - 1))
            };
            if version == 2 {
                for e in map_v2(&file, &old)?.iter() {
                    if check_entry_v2(e, env.now_ms, max_expiry_ms) != Check::Keep {
                        continue;
                    }
                    if let Some(to) = take(&mut report) {
                        convert_v2(e, to);
                    }
                }
            } else {
                let (old_storage, _) = map(&file, &old, false)?;
                for e in old_storage.entries.iter() {
                    if check_entry(e, env.now_ms, max_expiry_ms) != Check::Keep {
                        continue;
                    }
                    if let Some(to) = take(&mut report) {
                        copy_entry(e, to);
                    }
                }
            }
            std::fs::rename(&tmp, path)?;
            report.result = RestoreResult::Migrated;
            report.clean_shutdown = clean;
            (
                Table::with_storage(g, storage, participants, seed),
                header,
                new_file,
            )
        }
        Some(Err(Reject::Discard(result, why))) => {
            report.result = result;
            report.reason = Some(why);
            // A new file rather than the old one emptied: a process still mapping the old one
            // (a takeover that went wrong) keeps what it has.
            let _ = std::fs::remove_file(path);
            let file = open_rw(path, true)?;
            lock(&file, path)?;
            let (storage, header) = map(&file, &g, true)?;
            (
                Table::with_storage(g, storage, participants, seed),
                header,
                file,
            )
        }
        None => {
            let (storage, header) = map(&file, &g, true)?;
            (
                Table::with_storage(g, storage, participants, seed),
                header,
                file,
            )
        }
    };
    let counts = table.rebuild(env.now_ms, max_expiry_ms);
    report.restored = counts.kept;
    report.expired = counts.expired;
    report.dropped += counts.dropped;
    let state = StateFile {
        header,
        path: path.to_path_buf(),
        lock: std::sync::Mutex::new(Some(path_file)),
        owner: next_owner(),
    };
    state.write_header(&g, seed, env, false);
    Ok((table, state, report))
}

/// Copies entry `from` (another file's) into `to`, with the new table's sequence number.
fn copy_entry(from: EntryRef<'_>, to: EntryRef<'_>) {
    to.copy_from(from);
    let st = to.state().load(Ordering::Relaxed);
    to.state()
        .store(st & !super::table::SEQ_MASK, Ordering::Relaxed);
}

/// The entries of a version-2 file of geometry `g`.
fn map_v2(file: &File, g: &Geometry) -> io::Result<SharedSlice<EntryV2>> {
    let m: Arc<Mapping> = Mapping::file(file, file_len(g))?;
    m.view(HEADER_BYTES, g.capacity)
        .ok_or_else(|| io::Error::other("state file mapping too small"))
}

/// A version-2 entry's original and reply tuples, packed, and their last words' stash bits;
/// None when an IPv4 tuple is not as this layout keeps one (`canonical_v4`).
fn tuples_v2(e: &EntryV2) -> Option<([Packed; 2], [u64; 2])> {
    let raw: [Packed; 2] =
        [0, 1].map(|d| std::array::from_fn(|j| e.w64[5 * d + j].load(Ordering::Relaxed)));
    let [o, r] = raw.map(|mut p| {
        p[4] &= KEY_MASK;
        canonical_v4(p)
    });
    Some(([o?, r?], raw.map(|p| p[4] & !KEY_MASK)))
}

/// A version-2 packed tuple as this layout keeps it: an IPv6 one as it is; an IPv4 one with its
/// addresses IPv4-mapped. (Version 2 kept an IPv4 affinity record's Service id unmapped, in the
/// low 32 bits of its destination: mapped now, as `Conntrack::affinity_key` makes it.) None
/// for an IPv4 tuple with anything else above its addresses' low 32 bits.
fn canonical_v4(p: Packed) -> Option<Packed> {
    if p[4] >> 40 & 1 == 1 {
        return Some(p);
    }
    let mapped = |w: u64| matches!(w >> 32, 0 | 0xffff).then_some(0xffff << 32 | w & 0xffff_ffff);
    if p[0] != 0 || p[2] != 0 {
        return None;
    }
    Some([0, mapped(p[1])?, 0, mapped(p[3])?, p[4]])
}

/// `check_entry` of a version-2 entry.
fn check_entry_v2(e: &EntryV2, now_ms: u64, max_expiry_ms: u64) -> Check {
    let Some((keys, _)) = tuples_v2(e) else {
        return if e.w32[0].load(Ordering::Relaxed) & super::table::LIFE_MASK
            == super::table::LIFE_LIVE
        {
            Check::Bad
        } else {
            Check::NotLive
        };
    };
    check_fields(
        e.w32[0].load(Ordering::Relaxed),
        keys,
        e.w32[1].load(Ordering::Relaxed),
        now_ms,
        max_expiry_ms,
    )
}

/// Converts a version-2 entry (`check_entry_v2` kept it: its tuples are canonical) into `to`,
/// with the new table's sequence number.
fn convert_v2(from: &EntryV2, to: EntryRef<'_>) {
    let Some((keys, stash)) = tuples_v2(from) else {
        return;
    };
    for d in 0..2 {
        to.store_tuple(d, &keys[d], stash[d]);
        to.bytes(d)
            .store(from.w64[10 + d].load(Ordering::Relaxed), Ordering::Relaxed);
        to.packets(d)
            .store(from.w32[2 + d].load(Ordering::Relaxed), Ordering::Relaxed);
    }
    to.expires_or_next()
        .store(from.w32[1].load(Ordering::Relaxed), Ordering::Relaxed);
    to.state().store(
        from.w32[0].load(Ordering::Relaxed) & !super::table::SEQ_MASK,
        Ordering::Relaxed,
    );
}

#[cfg(test)]
mod tests {
    use super::super::{tcp, Conntrack, CtConfig, Tuple, DIR_REPLY};
    use super::*;
    use kxdp_packet::IpProto;
    use kxdp_packet::{Addr, Family};
    use std::io::{Seek, SeekFrom, Write};

    const NOW: u64 = 100_000;

    fn env() -> Environment {
        Environment {
            boot_id: [7; 16],
            now_ms: NOW,
            version: LAYOUT_VERSION,
        }
    }

    fn config(max: u32) -> CtConfig {
        CtConfig {
            max_entries: max,
            ..CtConfig::default()
        }
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(name: &str) -> (Dir, PathBuf) {
        let d = std::env::temp_dir().join(format!("kxdp-ct-persist-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        (Dir(d.clone()), d.join("conntrack"))
    }

    fn tup(a: u8, sport: u16, b: u8, dport: u16, proto: IpProto) -> Tuple {
        Tuple {
            src: Addr::from_v4([10, 0, 0, a]),
            dst: Addr::from_v4([10, 1, 0, b]),
            sport,
            dport,
            proto,
            family: Family::V4,
        }
    }

    fn find(ct: &Conntrack, t: &Tuple) -> Option<super::super::Found> {
        let p = t.pack();
        ct.lookup(&p, ct.hash(&p), NOW + 1)
    }

    /// Three connections (entries 0, 1, 2) and one affinity record (entry 3).
    fn populate(ct: &Conntrack) {
        for i in 0..3u8 {
            let orig = tup(i, 40000 + i as u16, 41, 80, IpProto::TCP);
            let reply = tup(9, 8080, i, 40000 + i as u16, IpProto::TCP);
            let idx = ct
                .create(&orig, &reply, tcp::SYN, i == 1, 5, NOW, 0)
                .unwrap();
            assert_eq!(idx, i as u32);
            let r = find(ct, &reply).unwrap();
            ct.on_packet(&r, tcp::SYN | tcp::ACK, 60, NOW).unwrap();
        }
        ct.affinity_set(
            5,
            &Addr::from_v4([10, 0, 0, 1]),
            Family::V4,
            (Addr::from_v4([10, 2, 0, 9]), 8080),
            600,
            NOW,
            0,
        )
        .unwrap();
    }

    fn open(path: &Path, max: u32, e: &Environment) -> (Conntrack, RestoreReport) {
        Conntrack::open_file_with(path, config(max), 2, e).unwrap()
    }

    fn patch(path: &Path, offset: u64, bytes: &[u8]) {
        let mut f = OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(bytes).unwrap();
    }

    fn header(path: &Path) -> [u64; HEADER_WORDS] {
        read_header(&mut File::open(path).unwrap()).unwrap()
    }

    /// Rewrites header word `i` and fixes the checksum (a consistent header of another kind).
    fn set_header_word(path: &Path, i: usize, v: u64) {
        let mut h = header(path);
        h[i] = v;
        h[H_CHECKSUM] = fnv(&h[..H_CHECKSUM]);
        let bytes: Vec<u8> = h.iter().flat_map(|w| w.to_ne_bytes()).collect();
        patch(path, 0, &bytes);
    }

    /// A new TCP connection from client 50 to a backend of Service `service_id`: its original
    /// tuple.
    fn connect_client_50(ct: &Conntrack, service_id: u32) -> Tuple {
        let orig = tup(50, 1, 41, 80, IpProto::TCP);
        let reply = tup(9, 8080, 50, 1, IpProto::TCP);
        ct.create(&orig, &reply, tcp::SYN, false, service_id, NOW, 0)
            .unwrap();
        orig
    }

    fn assert_restored(ct: &Conntrack) {
        for i in 0..3u8 {
            let reply = tup(9, 8080, i, 40000 + i as u16, IpProto::TCP);
            let f = find(ct, &reply).expect("restored connection");
            assert_eq!(f.dir, DIR_REPLY);
            assert_eq!(
                f.other_tuple(),
                tup(i, 40000 + i as u16, 41, 80, IpProto::TCP)
            );
            assert_eq!(f.state & super::super::FLAG_MASQ != 0, i == 1);
            assert_eq!(super::super::tcp_state_of(f.state), tcp::TcpState::SynRecv);
        }
        assert!(ct
            .affinity_get(5, &Addr::from_v4([10, 0, 0, 1]), Family::V4, NOW + 1)
            .is_some());
        assert!(ct.len() >= 4);
    }

    #[test]
    fn connections_survive_a_clean_restart_and_a_crash() {
        let (_d, path) = dir("survive");
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::Created);
        populate(&ct);
        assert!(ct.mark_clean_shutdown());
        drop(ct);
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(
            (r.result, r.clean_shutdown, r.restored),
            (RestoreResult::Restored, true, 4)
        );
        assert_restored(&ct);
        // New connections go on from where the old process left off.
        let orig = connect_client_50(&ct, 0);
        drop(ct); // no clean mark: a crash
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(
            (r.result, r.clean_shutdown, r.restored),
            (RestoreResult::Restored, false, 5)
        );
        assert_restored(&ct);
        assert!(find(&ct, &orig).is_some());
        // Expired by a later clock: gone, counted.
        drop(ct);
        let late = Environment {
            now_ms: NOW + 300_000,
            ..env()
        };
        let (_ct, r) = open(&path, 100, &late);
        assert_eq!((r.restored, r.expired, r.dropped), (1, 4, 0)); // the affinity record: 600 s
    }

    /// A connection marked as having lost its backend keeps the mark across a restart: its
    /// client is still reset at its next packet.
    #[test]
    fn the_backend_gone_mark_survives_a_restart() {
        let (_d, path) = dir("gone");
        let (ct, _) = open(&path, 100, &env());
        connect_client_50(&ct, 7);
        let view = ct.connections().next().unwrap();
        assert!(ct.mark_backend_gone(&view));
        assert!(!ct.mark_backend_gone(&view), "marked once");
        drop(ct);
        let (ct, r) = open(&path, 100, &env());
        assert_eq!((r.result, r.restored), (RestoreResult::Restored, 1));
        let view = ct.connections().next().unwrap();
        assert_ne!(view.state & super::super::FLAG_BACKEND_GONE, 0);
    }

    #[test]
    fn truncated_files_are_discarded() {
        let (_d, path) = dir("truncated");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        drop(ct);
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 4096)
            .unwrap();
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::DiscardedTruncated);
        assert!(r.describe().contains("discarded"), "{}", r.describe());
        assert_eq!(ct.len(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        drop(ct);
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let (_, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::DiscardedTruncated);
    }

    #[test]
    fn other_versions_and_layouts_are_discarded() {
        let (_d, path) = dir("version");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        drop(ct);
        // A build that writes another version meets this file.
        let next = Environment {
            version: LAYOUT_VERSION + 1,
            ..env()
        };
        let (ct, r) = open(&path, 100, &next);
        assert_eq!(r.result, RestoreResult::DiscardedVersion);
        let reason = r.reason.unwrap();
        assert!(
            reason.contains(&format!("layout version {LAYOUT_VERSION}")),
            "{reason}"
        );
        assert_eq!(ct.len(), 0);
        drop(ct);
        // ... and this build meets the file that one wrote.
        let (_, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::DiscardedVersion);
        // A fingerprint of another entry layout under the same version number.
        set_header_word(&path, H_FINGERPRINT, fingerprint() ^ 1);
        let (_, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::DiscardedVersion);
    }

    #[test]
    fn bit_flips_in_the_header_are_caught() {
        let (_d, path) = dir("flips");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        ct.mark_clean_shutdown();
        drop(ct);
        let good = header(&path);
        for bit in (0..HEADER_WORDS * 64).step_by(5) {
            let mut h = good;
            h[bit / 64] ^= 1 << (bit % 64);
            let bytes: Vec<u8> = h.iter().flat_map(|w| w.to_ne_bytes()).collect();
            patch(&path, 0, &bytes);
            let mut words = header(&path);
            let v = check_header(
                &words,
                std::fs::metadata(&path).unwrap().len() as usize,
                &Geometry::for_max_live(100),
                super::super::SEED | 1,
                &env(),
            );
            assert!(
                matches!(v, Err(Reject::Discard(RestoreResult::DiscardedCorrupt, _))),
                "bit {bit} flipped went unnoticed"
            );
            words[0] = 0;
        }
        // One full open with a flipped bit: discarded, empty.
        let mut h = good;
        h[H_CAPACITY] ^= 1 << 3;
        patch(
            &path,
            0,
            &h.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>(),
        );
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::DiscardedCorrupt);
        assert_eq!(ct.len(), 0);
        // Not a kxdp file at all.
        drop(ct);
        patch(&path, 0, b"#!/bin/sh\necho hello\n");
        let (_, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::DiscardedCorrupt);
    }

    #[test]
    fn one_process_at_a_time() {
        let (_d, path) = dir("lock");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        let e = Conntrack::open_file_with(&path, config(100), 2, &env())
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // The clean-shutdown mark lets go (a takeover's new process opens it next).
        assert!(ct.mark_clean_shutdown());
        let (ct2, r) = open(&path, 100, &env());
        assert_eq!((r.result, r.restored), (RestoreResult::Restored, 4));
        // The old process's late mark does not overwrite the new owner's header.
        assert!(!ct.mark_clean_shutdown());
        drop(ct2);
    }

    #[test]
    fn another_boot_is_discarded() {
        let (_d, path) = dir("boot");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        ct.mark_clean_shutdown();
        drop(ct);
        let rebooted = Environment {
            boot_id: [8; 16],
            now_ms: 5_000,
            ..env()
        };
        let (ct, r) = open(&path, 100, &rebooted);
        assert_eq!(r.result, RestoreResult::DiscardedBoot);
        assert_eq!(ct.len(), 0);
    }

    #[test]
    fn garbage_entries_are_dropped_and_good_ones_kept() {
        let (_d, path) = dir("garbage");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        drop(ct); // a crash

        // `Hot` records (64 bytes): state word at 48, expiry at 52.
        let entry = |idx: u64, word_byte: u64| HEADER_BYTES as u64 + idx * 64 + word_byte;
        // Entry 0: a torn insert (live, with an odd sequence number in the state word).
        patch(&path, entry(0, 48), &(1u32 << 24 | 1).to_ne_bytes());
        // Entry 2: garbage in the ports/proto/family word of its original tuple (w64[1]).
        patch(&path, entry(2, 8), &[0xff; 8]);
        // Entry 5 (never used): garbage with a live state; its tuples are zero (protocol 0).
        patch(&path, entry(5, 48), &1u32.to_ne_bytes());
        // Entry 6: a live-looking entry expiring in 40 days (past any timeout).
        let orig = tup(60, 1, 41, 80, IpProto::UDP).pack();
        let reply = tup(9, 53, 60, 1, IpProto::UDP).pack();
        let mut raw = [0u8; 64];
        let expiry = |ms: u64| super::super::table::Clock32::encode(ms).to_ne_bytes();
        raw[52..56].copy_from_slice(&expiry(NOW + 40 * 86_400_000));
        for (i, p) in [orig, reply].iter().enumerate() {
            let words = [super::super::addr_word(p), p[4]];
            for (j, w) in words.iter().enumerate() {
                raw[16 * i + 8 * j..][..8].copy_from_slice(&w.to_ne_bytes());
            }
        }
        raw[48..52].copy_from_slice(&1u32.to_ne_bytes());
        patch(&path, entry(6, 0), &raw);
        // Entry 7: the same with a sane expiry: a good entry the old process wrote last.
        raw[52..56].copy_from_slice(&expiry(NOW + 10_000));
        patch(&path, entry(7, 0), &raw);
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(r.result, RestoreResult::Restored);
        assert_eq!((r.restored, r.dropped), (3, 4), "{r:?}");
        assert!(find(&ct, &tup(0, 40000, 41, 80, IpProto::TCP)).is_none());
        assert!(find(&ct, &tup(1, 40001, 41, 80, IpProto::TCP)).is_some());
        assert!(find(&ct, &tup(60, 1, 41, 80, IpProto::UDP)).is_some());
        // The freed entries are handed out again, and nothing collides.
        for i in 0..20u8 {
            ct.create(
                &tup(100 + i, 1, 41, 80, IpProto::TCP),
                &tup(9, 8080, 100 + i, 1, IpProto::TCP),
                tcp::SYN,
                false,
                0,
                NOW,
                0,
            )
            .unwrap();
        }
        assert_eq!(ct.len(), 23);
        assert!(find(&ct, &tup(1, 40001, 41, 80, IpProto::TCP)).is_some());
    }

    /// A file of layout version 2 (one 112-byte record per entry) is converted:
    /// its connections, IPv4 and IPv6, continue; its garbage is dropped as ever.
    #[test]
    fn a_version_2_file_is_converted() {
        let (_d, path) = dir("v2");
        let (ct, _) = open(&path, 100, &env());
        ct.mark_clean_shutdown();
        drop(ct);
        let v6 = |last: u16| {
            Addr([
                0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0xab, 0xcd, 0, 0, 0, 0, 0, last as u8,
            ])
        };
        let conns = [
            (
                tup(1, 40001, 41, 80, IpProto::TCP),
                tup(9, 8080, 1, 40001, IpProto::TCP),
            ),
            (
                tup(2, 40002, 41, 53, IpProto::UDP),
                tup(9, 53, 2, 40002, IpProto::UDP),
            ),
            (
                Tuple {
                    src: v6(1),
                    dst: v6(2),
                    sport: 1234,
                    dport: 443,
                    proto: IpProto::TCP,
                    family: Family::V6,
                },
                Tuple {
                    src: v6(3),
                    dst: v6(1),
                    sport: 8443,
                    dport: 1234,
                    proto: IpProto::TCP,
                    family: Family::V6,
                },
            ),
        ];
        // Version 2's record: tuples at 0 and 40, bytes at 80, state at 96, expiry at 100,
        // packets at 104.
        let mut file = vec![0u8; 112 * 5];
        for (k, (o, r)) in conns.iter().enumerate() {
            let raw = &mut file[112 * k..][..112];
            for (i, w) in o.pack().iter().chain(&r.pack()).enumerate() {
                raw[i * 8..][..8].copy_from_slice(&w.to_ne_bytes());
            }
            // Service id 7 in the stash (the low 16 bits in the original tuple's last word).
            raw[32..40].copy_from_slice(&(o.pack()[4] | 7 << 48).to_ne_bytes());
            raw[80..88].copy_from_slice(&1500u64.to_ne_bytes());
            let established =
                (tcp::TcpState::Established as u32) << super::super::table::PROTO_STATE_SHIFT;
            let state = super::super::table::LIFE_LIVE
                | if o.proto == IpProto::TCP {
                    established
                } else {
                    0
                };
            raw[96..100].copy_from_slice(&state.to_ne_bytes());
            let expiry = super::super::table::Clock32::encode(NOW + 60_000);
            raw[100..104].copy_from_slice(&expiry.to_ne_bytes());
            raw[104..108].copy_from_slice(&3u32.to_ne_bytes());
        }
        // Entry 3: live garbage (protocol 0), dropped.
        file[112 * 3 + 96..][..4].copy_from_slice(&1u32.to_ne_bytes());
        patch(&path, HEADER_BYTES as u64, &file);
        set_header_word(&path, H_FINGERPRINT, fingerprint_of(2));
        set_header_word(&path, H_VERSION, 2);
        set_header_word(&path, H_NSLOTS, Geometry::before_v4(100).nslots as u64);
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(
            (r.result, r.restored, r.dropped),
            (RestoreResult::Migrated, 3, 0),
            "{r:?}"
        );
        for (o, r) in &conns {
            let p = r.pack();
            let f = ct
                .lookup(&p, ct.hash(&p), NOW + 1)
                .expect("converted connection");
            assert_eq!((f.dir, f.other_tuple(), f.service_id), (DIR_REPLY, *o, 7));
            let v = ct.connections().find(|v| v.idx == f.idx).unwrap();
            assert_eq!(
                (v.orig, v.reply, v.packets, v.bytes),
                (*o, *r, [3, 0], [1500, 0])
            );
        }
        assert_eq!(header(&path)[H_VERSION], LAYOUT_VERSION);
        // A second open reads the converted file as it is.
        drop(ct);
        let (_ct, r) = open(&path, 100, &env());
        assert_eq!(
            (r.result, r.restored),
            (RestoreResult::Restored, 3),
            "{r:?}"
        );
    }

    /// What version-3 builds wrote into the header (`LAYOUT_V3` must stay byte for byte).
    #[test]
    fn version_3_keeps_its_fingerprint() {
        assert_eq!(fingerprint_of(3), 0x5d65_7772_f6fd_accf);
        assert_ne!(fingerprint_of(3), fingerprint());
    }

    /// A version-3 file as its build left it: this build's entries, the index sized by the rule
    /// of version 3.
    fn make_version_3(path: &Path, max: u32) {
        let (ct, _) = open(path, max, &env());
        populate(&ct);
        assert!(ct.mark_clean_shutdown());
        drop(ct);
        let g = Geometry::before_v4(max);
        set_header_word(path, H_VERSION, 3);
        set_header_word(path, H_FINGERPRINT, fingerprint_of(3));
        set_header_word(path, H_NSLOTS, g.nslots as u64);
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(file_len(&g) as u64)
            .unwrap();
    }

    #[test]
    fn a_version_3_file_keeps_its_connections() {
        // A small table: its index grows (version 4), so the entries are copied into a new file.
        let (_d, path) = dir("v3small");
        make_version_3(&path, 100);
        assert!(Geometry::before_v4(100).nslots < Geometry::for_max_live(100).nslots);
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(
            (r.result, r.restored, r.clean_shutdown),
            (RestoreResult::Migrated, 4, true),
            "{r:?}"
        );
        assert_restored(&ct);
        let h = header(&path);
        assert_eq!(
            (h[H_VERSION], h[H_NSLOTS] as usize),
            (LAYOUT_VERSION, Geometry::for_max_live(100).nslots)
        );
        // A large one (about 40k entries up) has the same geometry in both: taken as it is.
        let (_d, path) = dir("v3large");
        make_version_3(&path, 50_000);
        assert_eq!(Geometry::before_v4(50_000), Geometry::for_max_live(50_000));
        let (ct, r) = open(&path, 50_000, &env());
        assert_eq!(
            (r.result, r.restored, r.clean_shutdown),
            (RestoreResult::Restored, 4, true),
            "{r:?}"
        );
        assert_restored(&ct);
        assert_eq!(header(&path)[H_VERSION], LAYOUT_VERSION);
    }

    #[test]
    fn a_new_size_migrates_the_entries() {
        let (_d, path) = dir("migrate");
        let (ct, _) = open(&path, 100, &env());
        populate(&ct);
        ct.mark_clean_shutdown();
        drop(ct);
        let (ct, r) = open(&path, 5000, &env());
        assert_eq!(
            (r.result, r.restored, r.clean_shutdown),
            (RestoreResult::Migrated, 4, true)
        );
        assert_restored(&ct);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            file_len(&Geometry::for_max_live(5000))
        );
        drop(ct);
        let (ct, r) = open(&path, 5000, &env());
        assert_eq!(r.result, RestoreResult::Restored);
        assert_restored(&ct);
    }

    #[test]
    fn sctp_tags_survive() {
        let (_d, path) = dir("sctp");
        let (ct, _) = open(&path, 100, &env());
        let orig = tup(1, 5000, 41, 5000, IpProto::SCTP);
        let reply = tup(9, 5000, 1, 5000, IpProto::SCTP);
        let chunks = super::super::sctp::tests::init(0x1234);
        let idx = ct
            .create(
                &orig,
                &reply,
                super::super::FirstPacket {
                    tcp_flags: 0,
                    bytes: 0,
                    sctp: Some(chunks),
                },
                false,
                0,
                NOW,
                0,
            )
            .unwrap();
        let tags = ct.table.tags(idx);
        assert_ne!(tags, 0);
        drop(ct);
        let (ct, r) = open(&path, 100, &env());
        assert_eq!(r.restored, 1);
        let f = find(&ct, &orig).unwrap();
        assert_eq!(ct.table.tags(f.idx), tags);
    }
}
