//! Reference-counted slices in memory advised for transparent huge pages ([`HugeSlice`]).
//!
//! The frontend table's slots and endpoint lists are read by every new connection, at random:
//! at 30k Services they are ~10 MB, far beyond the TLB's reach in 4 KiB pages (a page walk per
//! lookup on top of the cache miss). glibc can put its whole heap in huge pages
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`), the image's static musl binary cannot; so these
//! arrays come from an arena of their own: 2 MiB-aligned chunks advised `MADV_HUGEPAGE`, cut
//! into blocks (powers of two from 64 bytes to 1 KiB, then multiples of 1 KiB: a shard of 2^k
//! slots plus its header would waste half of a power-of-two block) kept on free lists for
//! reuse. Larger slices are mappings of their own. Memory is never given back to the kernel, only reused: the arena
//! holds what the largest snapshot needed, as a `malloc` would.
//!
//! A `HugeSlice` is shared as `Arc<[T]>` is (a count in the block's header; `Clone` shares,
//! `make_mut` copies when shared), so snapshots stay copy-on-write.
//!
//! Written here because no crate serves: `Arc<[T], A>` with an allocator of our own needs the
//! unstable `allocator_api`, and the arena crates either never free (bump allocators) or do not
//! place blocks in huge-page-advised chunks.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::Mutex;

/// One huge page: the arena maps memory in chunks of this size, aligned to it.
pub const CHUNK: usize = 2 << 20;
/// The smallest block, log2: one cache line, so that no two blocks share a line.
const MIN_SHIFT: u32 = 6;
/// Blocks up to this size are powers of two; larger ones multiples of it.
const STEP: usize = 1024;
/// Power-of-two classes (64 bytes ..= `STEP`).
const SMALL_CLASSES: usize = (STEP.trailing_zeros() - MIN_SHIFT + 1) as usize;
/// Block classes: the powers of two, then 2 KiB ..= 2 MiB in steps of 1 KiB.
const CLASSES: usize = SMALL_CLASSES + CHUNK / STEP - 1;

/// Power-of-two blocks carved from huge-page chunks.
pub struct Arena {
    /// Free blocks of each class.
    free: [Vec<NonNull<u8>>; CLASSES],
    /// The chunk blocks are cut from, and how far.
    chunk: Option<NonNull<u8>>,
    used: usize,
    /// Every chunk (never unmapped: their blocks are reused).
    chunks: Vec<NonNull<u8>>,
}

// SAFETY: the arena's pointers name memory it owns (chunks it mapped, blocks no one holds);
// it is only reached through a `Mutex`.
unsafe impl Send for Arena {}

const NO_BLOCKS: Vec<NonNull<u8>> = Vec::new();

impl Arena {
    pub const fn new() -> Arena {
        Arena {
            free: [NO_BLOCKS; CLASSES],
            chunk: None,
            used: 0,
            chunks: Vec::new(),
        }
    }

    /// The class of a block of `bytes`, or None past the largest (a mapping of its own).
    fn class_of(bytes: usize) -> Option<usize> {
        if bytes <= STEP {
            let shift = bytes
                .max(1 << MIN_SHIFT)
                .next_power_of_two()
                .trailing_zeros();
            return Some((shift - MIN_SHIFT) as usize);
        }
        let class = SMALL_CLASSES + bytes.div_ceil(STEP) - 2;
        (class < CLASSES).then_some(class)
    }

    /// The size of a class's blocks.
    fn class_size(class: usize) -> usize {
        if class < SMALL_CLASSES {
            1 << (class as u32 + MIN_SHIFT)
        } else {
            (class - SMALL_CLASSES + 2) * STEP
        }
    }

    /// A 64-byte-aligned block of at least `bytes` (at most `CHUNK`).
    pub fn alloc(&mut self, bytes: usize) -> NonNull<u8> {
        let class = Self::class_of(bytes).expect("a block of at most a chunk");
        if let Some(p) = self.free[class].pop() {
            return p;
        }
        let size = Self::class_size(class);
        if self.chunk.is_none() || CHUNK - self.used < size {
            self.retire_chunk_rest();
            let c = map_chunks(CHUNK);
            self.chunks.push(c);
            self.chunk = Some(c);
            self.used = 0;
        }
        let c = self.chunk.expect("a chunk was just mapped");
        // SAFETY: `used + size <= CHUNK`: the block lies within the chunk.
        let p = unsafe { add(c, self.used) };
        self.used += size;
        p
    }

    /// Gives back a block `alloc(bytes)` returned.
    pub fn free(&mut self, p: NonNull<u8>, bytes: usize) {
        let class = Self::class_of(bytes).expect("a block of at most a chunk");
        self.free[class].push(p);
    }

    /// What is left of the current chunk goes on the free lists, as the largest blocks that
    /// fit (every size is a multiple of 64, so each piece is 64-byte aligned).
    fn retire_chunk_rest(&mut self) {
        let Some(c) = self.chunk else { return };
        while CHUNK - self.used >= 1 << MIN_SHIFT {
            let rest = CHUNK - self.used;
            let size = if rest >= STEP {
                rest / STEP * STEP
            } else {
                1 << (usize::BITS - 1 - rest.leading_zeros())
            };
            let class = Self::class_of(size).expect("a piece of a chunk");
            debug_assert_eq!(Self::class_size(class), size);
            // SAFETY: `used + size <= CHUNK`.
            let p = unsafe { add(c, self.used) };
            self.free[class].push(p);
            self.used += size;
        }
    }

    /// Bytes mapped (chunks only).
    pub fn mapped(&self) -> usize {
        self.chunks.len() * CHUNK
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        for c in self.chunks.drain(..) {
            // SAFETY: a chunk `map_chunks` made; blocks still handed out are raw pointers, which
            // their holders may no longer use (the global arena is never dropped).
            unsafe { unmap_chunks(c, CHUNK) };
        }
    }
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

/// The arena every `HugeSlice` takes its blocks from.
static ARENA: Mutex<Arena> = Mutex::new(Arena::new());

/// Bytes the slices' arena has mapped (tests, benchmarks).
pub fn arena_mapped() -> usize {
    ARENA.lock().unwrap_or_else(|e| e.into_inner()).mapped()
}

/// `p + n` for a pointer into an allocation at least `n` bytes past `p`.
///
/// # Safety
/// `p + n` stays within the allocation `p` points into.
unsafe fn add(p: NonNull<u8>, n: usize) -> NonNull<u8> {
    // SAFETY: the caller keeps the result within the allocation, which is not at address 0.
    unsafe { NonNull::new_unchecked(p.as_ptr().add(n)) }
}

/// `len` bytes (a multiple of `CHUNK`) of zeroed memory aligned to `CHUNK`, advised for huge
/// pages (faulted in as they are first written: a huge page each where the kernel has one).
fn map_chunks(len: usize) -> NonNull<u8> {
    if cfg!(miri) {
        // Miri knows neither madvise nor munmap of part of a mapping.
        let layout = std::alloc::Layout::from_size_align(len, CHUNK).expect("a valid layout");
        // SAFETY: the layout's size is not zero.
        let p = unsafe { std::alloc::alloc(layout) };
        return NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
    }
    // Map one chunk more than needed and trim both ends to the alignment.
    let over = len + CHUNK;
    // SAFETY: a new private anonymous mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let layout = std::alloc::Layout::from_size_align(len, CHUNK).expect("a valid layout");
        std::alloc::handle_alloc_error(layout);
    }
    let start = p as usize;
    let head = (CHUNK - start % CHUNK) % CHUNK;
    let tail = over - head - len;
    // SAFETY: the head and tail lie within the mapping just made, which nothing refers to yet;
    // the advice covers exactly the part kept and changes no contents.
    unsafe {
        let base = p.cast::<u8>().add(head);
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap(base.add(len).cast(), tail);
        }
        libc::madvise(base.cast(), len, libc::MADV_HUGEPAGE);
        NonNull::new_unchecked(base)
    }
}

/// Undoes `map_chunks` for a slice's own mapping.
///
/// # Safety
/// `p` and `len` are a `map_chunks` result and its length, no longer referred to.
unsafe fn unmap_chunks(p: NonNull<u8>, len: usize) {
    if cfg!(miri) {
        let layout = std::alloc::Layout::from_size_align(len, CHUNK).expect("a valid layout");
        // SAFETY: allocated by `map_chunks` with this layout (the caller's promise).
        unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
        return;
    }
    // SAFETY: exactly the range `map_chunks` kept (the caller's promise).
    unsafe { libc::munmap(p.as_ptr().cast(), len) };
}

/// A block's header: the count of `HugeSlice`s sharing it.
#[repr(C)]
struct Header {
    refs: AtomicUsize,
}

/// An immutable, shared slice of `T` in the huge-page arena: `Arc<[T]>`'s interface as far as
/// snapshots use it (`Clone` shares, `make_mut` copies a shared slice before writing). An empty
/// slice takes no block. `T`'s alignment is at most 64. The length is kept beside the pointer,
/// as in `Arc<[T]>`'s fat pointer, so that indexing reads no header line; an `Option` of it is
/// no larger (the pointer is never null).
pub struct HugeSlice<T> {
    /// The first value, `DATA` bytes into the block; dangling when `len` is 0 (no block).
    /// (The values' address rather than the header's: indexing then costs what a slice's does.)
    data: NonNull<T>,
    len: usize,
    _own: PhantomData<T>,
}

// SAFETY: as `Arc<[T]>`: the values are shared between threads (`Sync` needed) and dropped by
// whichever thread holds the last reference (`Send` needed); the count is atomic.
unsafe impl<T: Send + Sync> Send for HugeSlice<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Sync for HugeSlice<T> {}

impl<T> HugeSlice<T> {
    /// Where the values start in a block: past the header, at `T`'s alignment.
    const DATA: usize = {
        assert!(std::mem::align_of::<T>() <= 1 << MIN_SHIFT);
        let h = std::mem::size_of::<Header>();
        let a = std::mem::align_of::<T>();
        h.div_ceil(a) * a
    };

    pub const fn new() -> Self {
        HugeSlice {
            data: NonNull::dangling(),
            len: 0,
            _own: PhantomData,
        }
    }

    fn block_bytes(len: usize) -> usize {
        std::mem::size_of::<T>()
            .checked_mul(len)
            .and_then(|b| b.checked_add(Self::DATA))
            .expect("a slice that fits in memory")
    }

    /// The values of `v`, moved into the arena.
    pub fn from_vec(mut v: Vec<T>) -> Self {
        let len = v.len();
        if len == 0 {
            return Self::new();
        }
        let bytes = Self::block_bytes(len);
        let block = if bytes > CHUNK {
            map_chunks(bytes.div_ceil(CHUNK) * CHUNK)
        } else {
            ARENA.lock().unwrap_or_else(|e| e.into_inner()).alloc(bytes)
        };
        // SAFETY: the block is ours, at least `bytes` long and 64-byte aligned (so aligned for
        // the header and, at `DATA`, for `T`). The values are moved out of `v` (a bitwise copy),
        // whose length is then 0, so they are dropped once: by the slice.
        let data = unsafe {
            block.cast::<Header>().as_ptr().write(Header {
                refs: AtomicUsize::new(1),
            });
            let data = add(block, Self::DATA).cast::<T>();
            std::ptr::copy_nonoverlapping(v.as_ptr(), data.as_ptr(), len);
            v.set_len(0);
            data
        };
        HugeSlice {
            data,
            len,
            _own: PhantomData,
        }
    }

    /// A copy of `s` in the arena.
    pub fn from_slice(s: &[T]) -> Self
    where
        T: Clone,
    {
        Self::from_vec(s.to_vec())
    }

    /// The block's start (its header), when the slice has one.
    fn block(&self) -> Option<NonNull<u8>> {
        // SAFETY: a slice of at least one value has a block, whose values start `DATA` bytes in.
        (self.len > 0).then(|| unsafe {
            NonNull::new_unchecked(self.data.cast::<u8>().as_ptr().sub(Self::DATA))
        })
    }

    fn header(&self) -> Option<&Header> {
        // SAFETY: the block stays allocated while a slice refers to it.
        self.block()
            .map(|b| unsafe { &*b.cast::<Header>().as_ptr() })
    }

    #[inline]
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `len` initialised values at `data` (or none at a dangling, aligned pointer),
        // shared and not written while any `&` to them lives (`make_mut` writes only a slice
        // no one else holds).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr(), self.len) }
    }

    /// The values, for writing: copied first if another slice shares them.
    pub fn make_mut(&mut self) -> &mut [T]
    where
        T: Clone,
    {
        let unique = self
            .header()
            .is_none_or(|h| h.refs.load(Ordering::Acquire) == 1);
        if !unique {
            *self = Self::from_slice(self.as_slice());
        }
        let len = self.len;
        // SAFETY: this is the block's only slice (count 1, and `&mut self` excludes any other
        // use of it), so no other reference to the values exists while this one lives.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_ptr(), len) }
    }

    /// Whether two slices share one block (two empty slices do).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.data == b.data && a.len == b.len
    }
}

impl<T> Default for HugeSlice<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::ops::Deref for HugeSlice<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> Clone for HugeSlice<T> {
    fn clone(&self) -> Self {
        if let Some(h) = self.header() {
            // As `Arc`: relaxed, since a new reference is made from an existing one.
            let old = h.refs.fetch_add(1, Ordering::Relaxed);
            assert!(old < isize::MAX as usize, "HugeSlice count overflow");
        }
        HugeSlice {
            data: self.data,
            len: self.len,
            _own: PhantomData,
        }
    }
}

impl<T> Drop for HugeSlice<T> {
    fn drop(&mut self) {
        let (Some(block), Some(h)) = (self.block(), self.header()) else {
            return;
        };
        // As `Arc`: release our writes, then acquire everyone's before dropping.
        if h.refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        fence(Ordering::Acquire);
        let len = self.len;
        // SAFETY: the last reference: the values are dropped once and the block is given back;
        // nothing refers to either any more.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(self.data.as_ptr(), len));
        }
        let bytes = Self::block_bytes(len);
        if bytes > CHUNK {
            // SAFETY: a slice's own mapping, of this length (`from_vec`).
            unsafe { unmap_chunks(block, bytes.div_ceil(CHUNK) * CHUNK) };
        } else {
            ARENA
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .free(block, bytes);
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for HugeSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl<T> From<Vec<T>> for HugeSlice<T> {
    fn from(v: Vec<T>) -> Self {
        Self::from_vec(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_freed_block_is_reused_and_the_rest_of_a_chunk_is_kept() {
        let mut a = Arena::new();
        let x = a.alloc(100); // 128-byte class
        let y = a.alloc(64);
        assert_eq!(
            x.as_ptr() as usize % CHUNK,
            0,
            "chunks are huge-page aligned"
        );
        assert_eq!(y.as_ptr() as usize, x.as_ptr() as usize + 128);
        a.free(x, 100);
        assert_eq!(a.alloc(128), x, "same class: the freed block");
        // Past 1 KiB, sizes go in steps of 1 KiB: 16 KiB and a header is 17 KiB, not 32.
        assert_eq!(
            Arena::class_size(Arena::class_of(16_384 + 64).unwrap()),
            17 * 1024
        );
        assert_eq!(Arena::class_size(Arena::class_of(1025).unwrap()), 2048);
        assert_eq!(Arena::class_size(Arena::class_of(1024).unwrap()), 1024);
        assert_eq!(Arena::class_of(CHUNK + 1), None);
        // A block that does not fit in what is left opens a new chunk; the rest is reused.
        let big = a.alloc(CHUNK);
        assert_eq!(a.mapped(), 2 * CHUNK);
        let small = a.alloc(CHUNK - 1024);
        assert_eq!(a.mapped(), 2 * CHUNK, "cut from the first chunk's rest");
        assert_eq!(small.as_ptr() as usize, x.as_ptr() as usize + 192);
        let tiny = a.alloc(512);
        assert_eq!(
            tiny.as_ptr() as usize,
            small.as_ptr() as usize + CHUNK - 1024
        );
        a.free(big, CHUNK);
        assert_eq!(a.alloc(CHUNK), big);
    }

    #[test]
    fn slices_share_until_written() {
        let a = HugeSlice::from_vec((0..1000u64).collect());
        let mut b = a.clone();
        assert!(HugeSlice::ptr_eq(&a, &b));
        b.make_mut()[3] = 7;
        assert!(!HugeSlice::ptr_eq(&a, &b));
        assert_eq!((a[3], b[3], a.len(), b.len()), (3, 7, 1000, 1000));
        let mut c = b.clone();
        drop(b);
        let p = c.as_ptr();
        c.make_mut()[0] = 9;
        assert_eq!(c.as_ptr(), p, "the only reference writes in place");
        assert_eq!(HugeSlice::<u8>::new().len(), 0);
        assert_eq!(&*HugeSlice::<u32>::from_vec(vec![]), &[] as &[u32]);
    }

    #[test]
    fn values_are_dropped_once_with_the_last_slice() {
        let token = Arc::new(());
        let a = HugeSlice::from_vec(vec![token.clone(), token.clone()]);
        let b = a.clone();
        assert_eq!(Arc::strong_count(&token), 3);
        drop(a);
        assert_eq!(Arc::strong_count(&token), 3);
        let mut c = b.clone();
        c.make_mut(); // shared: copies (two more references to the token)
        assert_eq!(Arc::strong_count(&token), 5);
        drop((b, c));
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn a_slice_larger_than_a_chunk_is_a_mapping_of_its_own() {
        let n = if cfg!(miri) { 70_000 } else { 1 << 20 };
        let a = HugeSlice::from_vec(vec![5u32; n * 8]);
        assert_eq!((a.len(), a[n * 8 - 1]), (n * 8, 5));
        assert_eq!(a.as_ptr() as usize % CHUNK, HugeSlice::<u32>::DATA);
    }

    #[test]
    fn slices_are_shared_and_dropped_across_threads() {
        let a = HugeSlice::from_vec((0..64u64).map(Arc::new).collect());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let s = a.clone();
                std::thread::spawn(move || {
                    let mut own = s.clone();
                    if t % 2 == 0 {
                        own.make_mut()[0] = Arc::new(100);
                    }
                    s.iter().map(|v| **v).sum::<u64>() + *own[0]
                })
            })
            .collect();
        drop(a);
        for (t, h) in threads.into_iter().enumerate() {
            let sum = h.join().expect("thread");
            assert_eq!(sum, 63 * 64 / 2 + if t % 2 == 0 { 100 } else { 0 });
        }
    }
}
