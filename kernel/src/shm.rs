//! Shared memory viewed as arrays of atomics: the conntrack table's storage, either anonymous
//! (process memory, as replay and tests use) or a `MAP_SHARED` mapping of a file, so that the
//! table outlives the process that wrote it (a restart maps the same file again).
//!
//! Safe code above this crate gets `&[T]` for `T: AtomicPod` only: types made of atomics, for
//! which every bit pattern (including all zeroes) is a valid value and every access is an atomic
//! one, so another process (or a later one) writing the same bytes is no different from another
//! thread doing so. Written with `libc::mmap` by hand (as the UMEM is) rather than with memmap2:
//! memmap2 hands out byte slices, and the atomic views would need the same unsafe casts anyway.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

/// Gives the first `len` bytes of `file` their blocks now (`fallocate`), so that a full
/// filesystem is an error here rather than a SIGBUS in whichever thread first writes a page of
/// a hole. A filesystem without `fallocate` keeps the file as it is.
fn allocate(file: &File, len: usize) -> io::Result<()> {
    // SAFETY: fallocate reads its integer arguments only; the descriptor is open (borrowed).
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Ok(()),
        Some(libc::ENOSPC) => Err(io::Error::new(
            e.kind(),
            format!("no space for its {len} bytes on its filesystem ({e})"),
        )),
        _ => Err(e),
    }
}

/// Types that may be laid over shared memory: made of atomics only, any bit pattern valid, no
/// padding that matters, `Sync`.
///
/// # Safety
/// Implement only for `repr(C)` (or primitive) types all of whose bytes belong to atomic fields
/// and for which every bit pattern is a valid value.
pub unsafe trait AtomicPod: Sync + Sized {}

// SAFETY: an atomic integer is valid for every bit pattern and accessed atomically only.
unsafe impl AtomicPod for AtomicU32 {}
// SAFETY: as above.
unsafe impl AtomicPod for AtomicU64 {}

/// A fixed record of `N64` 64-bit atomics followed by `N32` 32-bit atomics, aligned to 16 bytes
/// (the conntrack entry: `AtomicRecord<12, 4>`, 112 bytes, so that a table spends no padding).
#[repr(C, align(16))]
pub struct AtomicRecord<const N64: usize, const N32: usize> {
    pub w64: [AtomicU64; N64],
    pub w32: [AtomicU32; N32],
}

// SAFETY: repr(C) arrays of atomics; every bit pattern of every field is valid. Padding up to
// the alignment is never read as a value.
unsafe impl<const N64: usize, const N32: usize> AtomicPod for AtomicRecord<N64, N32> {}

/// One mapping (anonymous or of a file), unmapped when the last view of it goes.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
    shared_file: bool,
}

// SAFETY: the mapping is plain memory reached only through atomic views (`AtomicPod`); it may
// be used and dropped from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above: shared access goes through atomics only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes of zeroed process memory, prefaulted (as a preallocated table should be), in
    /// transparent huge pages where the machine offers them (`MADV_HUGEPAGE`: a table far larger
    /// than the caches then costs one TLB entry per 2 MiB rather than per 4 KiB); 4 KiB pages
    /// otherwise (THP `never`, or no 2 MiB page free), which work the same.
    pub fn anonymous(len: usize) -> io::Result<Arc<Mapping>> {
        let m = Self::map(len.max(1), libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)?;
        // Miri's mmap takes exactly MAP_PRIVATE|MAP_ANONYMOUS and knows no madvise: advice and
        // prefaulting are only speed-ups.
        if !cfg!(miri) {
            m.advise_huge_pages();
            m.prefault_zeroed();
        }
        Ok(Arc::new(m))
    }

    /// Asks for transparent huge pages (best effort: an error or THP `never` leaves 4 KiB pages).
    fn advise_huge_pages(&self) -> bool {
        // SAFETY: advice on exactly the range mmap returned; it changes no contents.
        unsafe { libc::madvise(self.base.as_ptr().cast(), self.len, libc::MADV_HUGEPAGE) == 0 }
    }

    /// `MADV_POPULATE_WRITE` (Linux 5.14) over the whole mapping: every page faulted in
    /// writable, no contents changed. False where the kernel lacks it.
    fn populate_write(&self) -> bool {
        // SAFETY: exactly the range mmap returned; populating changes no contents.
        unsafe {
            libc::madvise(
                self.base.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            ) == 0
        }
    }

    /// Faults every page in (after `advise_huge_pages`, so that they come as huge pages where
    /// possible): `MADV_POPULATE_WRITE` (Linux 5.14), else a write of zero per 4 KiB page.
    fn prefault_zeroed(&self) {
        if self.populate_write() {
            return;
        }
        for off in (0..self.len).step_by(4096) {
            // SAFETY: a fresh private anonymous mapping of `len` bytes, zero-filled, that no
            // view refers to yet (called before `Arc::new`): writing the zero it holds changes
            // nothing but faults the page in.
            unsafe { std::ptr::write_volatile(self.base.as_ptr().add(off), 0u8) };
        }
    }

    /// The first `len` bytes of `file` (opened read-write, at least `len` long), shared with
    /// every other process mapping it. The file may be closed afterwards.
    pub fn file(file: &File, len: usize) -> io::Result<Arc<Mapping>> {
        if (file.metadata()?.len() as usize) < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than the mapping asked for",
            ));
        }
        allocate(file, len)?;
        let m = Self::map(len.max(1), libc::MAP_SHARED, file.as_raw_fd())?;
        // Huge pages of a file on tmpfs come only with the tmpfs `huge=` mount option
        // (`kxdp_kernel::mount`; with `huge=advise`, this advice is what asks). Advised before
        // the pages are faulted in, so that they come huge rather than wait for khugepaged.
        if !cfg!(miri) {
            m.advise_huge_pages();
            m.prefault_file();
        }
        Ok(Arc::new(m))
    }

    /// Faults every page of a file mapping in, keeping its contents: `MADV_POPULATE_WRITE`
    /// (Linux 5.14; as `MAP_POPULATE` did, before the advice), else a read per 4 KiB page.
    fn prefault_file(&self) {
        if self.populate_write() {
            return;
        }
        for off in (0..self.len).step_by(4096) {
            // SAFETY: within the mapping (`off < len`), which the file backs whole (checked by
            // `file`); a volatile read of a byte changes nothing.
            unsafe { std::ptr::read_volatile(self.base.as_ptr().add(off)) };
        }
    }

    /// How many bytes of this mapping the kernel backs with huge pages now (anonymous THP or
    /// PMD-mapped tmpfs pages, from `/proc/self/smaps`); None when smaps cannot be read (no
    /// procfs) or does not list the mapping.
    pub fn huge_page_bytes(&self) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        smaps_huge_bytes(&smaps, self.base.as_ptr() as usize, self.len)
    }

    fn map(len: usize, flags: i32, fd: i32) -> io::Result<Mapping> {
        // SAFETY: a new mapping at an address the kernel picks; nothing else refers to it yet.
        // A file mapping needs the file to be `len` long (checked by the caller): a shorter file
        // would fault (SIGBUS) past its end.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
            shared_file: fd >= 0,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this maps a file (`MAP_SHARED`) rather than process memory.
    pub fn is_file(&self) -> bool {
        self.shared_file
    }

    /// `count` values of `T` starting `offset` bytes into the mapping; None when that range is
    /// out of bounds or misaligned for `T`.
    pub fn view<T: AtomicPod>(
        self: &Arc<Self>,
        offset: usize,
        count: usize,
    ) -> Option<SharedSlice<T>> {
        let bytes = count.checked_mul(std::mem::size_of::<T>())?;
        let end = offset.checked_add(bytes)?;
        if end > self.len || offset % std::mem::align_of::<T>() != 0 {
            return None;
        }
        // The base is page aligned; `offset` is aligned for T, so the pointer is.
        let ptr = self.base.as_ptr().wrapping_add(offset).cast::<T>();
        Some(SharedSlice {
            ptr: NonNull::new(ptr)?,
            len: count,
            _map: self.clone(),
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; every view holds an `Arc` of this
        // mapping, so none outlives it.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// The huge-page bytes of the smaps entry that holds `base` (at most `len`: a neighbour the kernel
/// merged into the same entry is not this mapping's). Written by hand: a few lines of `key: N kB`
/// under a range header; procfs' parser would bring the whole of procfs for it.
fn smaps_huge_bytes(smaps: &str, base: usize, len: usize) -> Option<u64> {
    let mut inside = false;
    let mut kb = None;
    for line in smaps.lines() {
        let first = line.split(' ').next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) {
                if inside {
                    break;
                }
                inside = start <= base && base < end;
                continue;
            }
        }
        if !inside {
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            if matches!(key, "AnonHugePages" | "ShmemPmdMapped" | "FilePmdMapped") {
                let n: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
                kb = Some(kb.unwrap_or(0) + n);
            }
        }
    }
    kb.map(|kb| (kb * 1024).min(len as u64))
}

/// A slice of `T` inside a [`Mapping`] (keeps it mapped). Dereferences to `[T]` at the cost of a
/// `Box<[T]>`'s: a pointer and a length.
pub struct SharedSlice<T: AtomicPod> {
    ptr: NonNull<T>,
    len: usize,
    _map: Arc<Mapping>,
}

// SAFETY: T is Sync (AtomicPod) and the memory lives as long as `_map`.
unsafe impl<T: AtomicPod> Send for SharedSlice<T> {}
// SAFETY: as above.
unsafe impl<T: AtomicPod> Sync for SharedSlice<T> {}

impl<T: AtomicPod> SharedSlice<T> {
    /// The mapping this slice lies in.
    pub fn mapping(&self) -> &Mapping {
        &self._map
    }
}

impl<T: AtomicPod> std::ops::Deref for SharedSlice<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr..ptr+len` lies inside the mapping (checked in `view`), is aligned for T,
        // stays mapped while `_map` lives, and every bit pattern is a valid T (AtomicPod); all
        // access is through atomics, so aliasing with other views or processes is sound.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: AtomicPod> std::fmt::Debug for SharedSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedSlice(len {})", self.len)
    }
}

/// Takes an exclusive advisory lock (`flock`) on `file` without waiting: `Ok(false)` when another
/// open file description holds it. (std's `File::try_lock` needs Rust 1.89; the workspace's MSRV
/// is older.)
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Releases `try_lock_exclusive`'s lock (a mapping of the file would otherwise keep it).
pub fn unlock(file: &File) -> io::Result<()> {
    // SAFETY: as above.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// A file on a full filesystem: an error at the mapping, not a SIGBUS at the first write.
    /// Needs root (mounts a 1 MiB tmpfs); skipped otherwise.
    #[test]
    fn file_on_a_full_filesystem_is_an_error() {
        // SAFETY: geteuid reads the process's credentials only.
        if unsafe { libc::geteuid() } != 0 || cfg!(miri) {
            eprintln!("skipped: needs root to mount a tmpfs");
            return;
        }
        let dir = std::env::temp_dir().join(format!("kxdp-shm-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "kxdp-test"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(mounted, "mount -t tmpfs {}", dir.display());
        let result = (|| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join("table"))?;
            let len = 4 << 20;
            file.set_len(len as u64)?;
            Mapping::file(&file, len).map(|_| ())
        })();
        let _ = std::process::Command::new("umount").arg(&dir).status();
        let _ = std::fs::remove_dir(&dir);
        let e = result.expect_err("4 MiB on a 1 MiB tmpfs");
        assert_eq!(e.raw_os_error(), None, "{e}");
        assert!(e.to_string().contains("no space"), "{e}");
    }

    #[test]
    fn record_has_no_padding() {
        assert_eq!(std::mem::size_of::<AtomicRecord<12, 4>>(), 112);
        assert_eq!(std::mem::align_of::<AtomicRecord<12, 4>>(), 16);
    }

    #[test]
    fn anonymous_mapping_is_zeroed_and_writable() {
        // Larger than a huge page, not a multiple of one.
        let m = Mapping::anonymous(5 << 20 | 4096).unwrap();
        let v = m.view::<AtomicU64>(0, m.len() / 8).unwrap();
        assert!(v.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        v[v.len() - 1].store(7, Ordering::Relaxed);
        assert_eq!(v[v.len() - 1].load(Ordering::Relaxed), 7);
    }

    /// A file of `len` zero bytes, made anew at `path`, open read-write.
    fn open_sized(path: &std::path::Path, len: u64) -> File {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        f.set_len(len).unwrap();
        f
    }

    /// `open_sized` in a directory of the test's own (`name`), which the test removes.
    fn new_file(name: &str, len: u64) -> (std::path::PathBuf, File) {
        let dir = std::env::temp_dir().join(format!("kxdp-shm-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let f = open_sized(&dir.join("map"), len);
        (dir, f)
    }

    #[test]
    fn file_mapping_is_shared_and_bounds_checked() {
        let (dir, f) = new_file("test", 8192);
        let a = Mapping::file(&f, 8192).unwrap();
        let b = Mapping::file(&f, 8192).unwrap();
        let va = a.view::<AtomicU64>(4096, 512).unwrap();
        let vb = b.view::<AtomicU64>(4096, 512).unwrap();
        va[3].store(42, Ordering::Relaxed);
        assert_eq!(vb[3].load(Ordering::Relaxed), 42);
        assert!(a.view::<AtomicU64>(4096, 513).is_none());
        assert!(a.view::<AtomicU64>(4, 1).is_none());
        assert!(Mapping::file(&f, 16384).is_err());
        assert!(crate::sys::monotonic_ms() > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_mapped_again_keeps_its_contents() {
        // The prefault after the advice must not write: a restart maps a table full of entries.
        let (dir, f) = new_file("keep", 3 << 20);
        {
            let a = Mapping::file(&f, 3 << 20).unwrap();
            let v = a.view::<AtomicU64>(0, (3 << 20) / 8).unwrap();
            for i in (0..v.len()).step_by(512) {
                v[i].store(i as u64 + 1, Ordering::Relaxed);
            }
        }
        let b = Mapping::file(&f, 3 << 20).unwrap();
        let v = b.view::<AtomicU64>(0, (3 << 20) / 8).unwrap();
        assert!((0..v.len())
            .step_by(512)
            .all(|i| v[i].load(Ordering::Relaxed) == i as u64 + 1));
        assert!(b.huge_page_bytes().is_some(), "smaps lists the mapping");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn smaps_huge_bytes_are_the_mappings_own() {
        let smaps = "\
7f0000000000-7f0000400000 rw-s 00000000 00:30 12 /run/kxdp/ct/conntrack
Size:               4096 kB
AnonHugePages:         0 kB
ShmemPmdMapped:     2048 kB
FilePmdMapped:         0 kB
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
AnonHugePages:      2048 kB
";
        assert_eq!(
            smaps_huge_bytes(smaps, 0x7f00_0000_0000, 4 << 20),
            Some(2 << 20)
        );
        assert_eq!(
            smaps_huge_bytes(smaps, 0x7f00_0040_0000, 1 << 20),
            Some(1 << 20),
            "capped at the mapping's length"
        );
        assert_eq!(smaps_huge_bytes(smaps, 0x1000, 4096), None);
    }

    /// On a tmpfs mounted with `huge=within_size` (what `kxdp run` mounts for the state file) a
    /// file mapping is in huge pages. Root only (mount); skipped where the kernel gives none.
    #[test]
    fn a_file_on_a_huge_tmpfs_is_in_huge_pages() {
        if is_root() {
            let dir = std::env::temp_dir().join(format!("kxdp-shm-huge-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            if let Err(e) = crate::mount::mount_huge_tmpfs(&dir) {
                let _ = std::fs::remove_dir(&dir);
                panic!("mounting a tmpfs as root: {e}");
            }
            let result = std::panic::catch_unwind(|| {
                assert!(crate::mount::mount_at(&dir)
                    .unwrap()
                    .is_some_and(|m| m.gives_huge_pages()));
                let f = open_sized(&dir.join("table"), 8 << 20);
                let m = Mapping::file(&f, 8 << 20).unwrap();
                let thp =
                    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
                        .unwrap_or_default();
                if !thp.contains("[deny]") {
                    // (At least half: a 2 MiB page the kernel cannot find at that moment
                    // leaves that part in small pages, which work the same.)
                    let huge = m.huge_page_bytes().unwrap();
                    assert!(huge >= 4 << 20, "{huge} of 8 MiB in huge pages");
                }
            });
            crate::mount::unmount(&dir).unwrap();
            std::fs::remove_dir(&dir).unwrap();
            result.unwrap();
        }
    }

    fn is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
            })
            .unwrap_or(false)
    }
}
