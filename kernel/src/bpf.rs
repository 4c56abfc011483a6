//! The `bpf()` system call as kxdp uses it: maps this process owns, program loading (with the
//! verifier's log on a refusal), and the small assembler kxdp's hand-written programs are
//! emitted with: the XDP program (`crate::xdp`), the tap redirect (`crate::tc`) and the fast
//! path's prefix (`crate::offload`). Each command, map type and helper number is named here
//! once. Building needs no C or BPF toolchain: the programs are written instruction by
//! instruction.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::sys::fd_result;

// bpf() commands.
const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_LOOKUP_ELEM: u32 = 1;
const BPF_MAP_UPDATE_ELEM: u32 = 2;
const BPF_MAP_DELETE_ELEM: u32 = 3;
const BPF_MAP_GET_NEXT_KEY: u32 = 4;
const BPF_PROG_LOAD: u32 = 5;
#[cfg(test)]
pub(crate) const BPF_PROG_TEST_RUN: u32 = 10;
const BPF_MAP_UPDATE_BATCH: u32 = 26;
const BPF_MAP_DELETE_BATCH: u32 = 27;
pub(crate) const BPF_LINK_CREATE: u32 = 28;

// Map types (`enum bpf_map_type`) and flags.
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
/// The map's memory can be `mmap`ed (an array's values read without a system call).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

// Program types (`enum bpf_prog_type`).
pub(crate) const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
pub(crate) const BPF_PROG_TYPE_XDP: u32 = 6;

// Helpers (`enum bpf_func_id`).
pub(crate) const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
pub(crate) const HELPER_KTIME_GET_NS: i32 = 5;
pub(crate) const HELPER_SKB_STORE_BYTES: i32 = 9;
pub(crate) const HELPER_L3_CSUM_REPLACE: i32 = 10;
pub(crate) const HELPER_L4_CSUM_REPLACE: i32 = 11;
pub(crate) const HELPER_SKB_VLAN_PUSH: i32 = 18;
pub(crate) const HELPER_REDIRECT: i32 = 23;
pub(crate) const HELPER_REDIRECT_MAP: i32 = 51;

/// `bpf(cmd, attr, size)`.
pub(crate) fn sys_bpf(cmd: u32, attr: &mut [u64; 16]) -> libc::c_long {
    // SAFETY: `attr` is a zero-padded 128-byte `union bpf_attr` laid out for `cmd`; the kernel
    // reads (and for some commands writes) at most `size` bytes of it. Pointers stored in it
    // refer to buffers the caller keeps alive across the call.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_long,
        )
    }
}

/// Packs two u32 fields into one u64 slot of `bpf_attr` (little- and big-endian hosts alike).
pub(crate) fn pair(lo: u32, hi: u32) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&lo.to_ne_bytes());
    b[4..].copy_from_slice(&hi.to_ne_bytes());
    u64::from_ne_bytes(b)
}

/// A BPF map owned by this process.
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

impl Map {
    pub fn create(kind: u32, key_size: u32, value_size: u32, max_entries: u32) -> io::Result<Map> {
        Map::create_with_flags(kind, key_size, value_size, max_entries, 0)
    }

    /// `create` with `map_flags` (`BPF_F_MMAPABLE`, ...).
    pub fn create_with_flags(
        kind: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
    ) -> io::Result<Map> {
        let mut attr = [0u64; 16];
        attr[0] = pair(kind, key_size);
        attr[1] = pair(value_size, max_entries);
        attr[2] = flags as u64;
        let fd = fd_result(sys_bpf(BPF_MAP_CREATE, &mut attr))?;
        Ok(Map {
            fd,
            key_size: key_size as usize,
            value_size: value_size as usize,
        })
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// A map a predecessor created (received in a takeover) with its key and value sizes.
    pub fn from_fd(fd: OwnedFd, key_size: u32, value_size: u32) -> Map {
        Map {
            fd,
            key_size: key_size as usize,
            value_size: value_size as usize,
        }
    }

    pub fn fd_borrowed(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        assert!(key.len() == self.key_size && value.len() == self.value_size);
        let mut attr = [0u64; 16];
        attr[0] = self.fd() as u32 as u64;
        attr[1] = key.as_ptr() as u64;
        attr[2] = value.as_ptr() as u64;
        attr[3] = 0; // BPF_ANY
        if sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn delete(&self, key: &[u8]) -> io::Result<()> {
        assert!(key.len() == self.key_size);
        let mut attr = [0u64; 16];
        attr[0] = self.fd() as u32 as u64;
        attr[1] = key.as_ptr() as u64;
        if sys_bpf(BPF_MAP_DELETE_ELEM, &mut attr) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Updates (or adds) `keys.len() / key_size` entries in one system call: `keys` and
    /// `values` hold them back to back. On an error, the entries before the one that failed are
    /// in the map: `Err((error, entries done))`.
    pub fn update_batch(&self, keys: &[u8], values: &[u8]) -> Result<(), (io::Error, usize)> {
        let n = keys.len() / self.key_size;
        assert!(keys.len() == n * self.key_size && values.len() == n * self.value_size);
        self.batch(BPF_MAP_UPDATE_BATCH, keys, Some(values), n)
    }

    /// Deletes `keys.len() / key_size` entries (`keys` back to back) in one system call. The
    /// kernel stops at the first key it cannot delete (one not in the map: `ENOENT`):
    /// `Err((error, entries deleted before it))`.
    pub fn delete_batch(&self, keys: &[u8]) -> Result<(), (io::Error, usize)> {
        let n = keys.len() / self.key_size;
        assert!(keys.len() == n * self.key_size);
        self.batch(BPF_MAP_DELETE_BATCH, keys, None, n)
    }

    fn batch(
        &self,
        cmd: u32,
        keys: &[u8],
        values: Option<&[u8]>,
        n: usize,
    ) -> Result<(), (io::Error, usize)> {
        if n == 0 {
            return Ok(());
        }
        // `batch` of `union bpf_attr`: in_batch, out_batch (unused here), keys, values,
        // count (in: entries; out: entries done) and map_fd, elem_flags (BPF_ANY), flags.
        let mut attr = [0u64; 16];
        attr[2] = keys.as_ptr() as u64;
        attr[3] = values.map_or(0, |v| v.as_ptr() as u64);
        attr[4] = pair(n as u32, self.fd() as u32);
        if sys_bpf(cmd, &mut attr) < 0 {
            let b = attr[4].to_ne_bytes();
            let done = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
            return Err((io::Error::last_os_error(), done.min(n)));
        }
        Ok(())
    }

    /// Writes into `next` the key after `key` (the first key without one); false after the
    /// last.
    pub fn next_key(&self, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
        assert!(next.len() == self.key_size && key.is_none_or(|k| k.len() == self.key_size));
        let mut attr = [0u64; 16];
        attr[0] = self.fd() as u32 as u64;
        attr[1] = key.map_or(0, |k| k.as_ptr() as u64);
        attr[2] = next.as_mut_ptr() as u64;
        found(sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut attr))
    }

    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
        assert!(key.len() == self.key_size && value.len() == self.value_size);
        let mut attr = [0u64; 16];
        attr[0] = self.fd() as u32 as u64;
        attr[1] = key.as_ptr() as u64;
        attr[2] = value.as_mut_ptr() as u64;
        found(sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr))
    }
}

/// A map command's result where `ENOENT` means "no such key": false, not an error.
fn found(r: libc::c_long) -> io::Result<bool> {
    if r >= 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT) => Ok(false),
        _ => Err(e),
    }
}

/// Loads `insns` as a program of `prog_type` (named "kxdp"); the verifier's log is in the
/// error when it refuses (`what` names the program there).
pub(crate) fn load_program(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[Insn],
    what: &str,
) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = [0u64; 16];
    attr[0] = pair(prog_type, insns.len() as u32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    attr[3] = pair(1, log.len() as u32); // log_level, log_size
    attr[4] = log.as_mut_ptr() as u64;
    // prog_name at byte 48 (attr[6..8])
    let mut name = [0u8; 16];
    name[..4].copy_from_slice(b"kxdp");
    attr[6] = u64::from_ne_bytes(name[..8].try_into().unwrap());
    attr[7] = u64::from_ne_bytes(name[8..].try_into().unwrap());
    attr[8] = pair(0, expected_attach_type); // prog_ifindex, expected_attach_type
    let r = sys_bpf(BPF_PROG_LOAD, &mut attr);
    fd_result(r).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        io::Error::new(e.kind(), format!("loading {what}: {e}\n{text}"))
    })
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// dst_reg in the low nibble, src_reg in the high nibble.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// A tiny assembler: instructions with symbolic jump targets, resolved by `finish`.
pub(crate) mod asm {
    use super::Insn;

    pub const R0: u8 = 0;
    pub const R1: u8 = 1;
    pub const R2: u8 = 2;
    pub const R3: u8 = 3;
    pub const R4: u8 = 4;
    pub const R5: u8 = 5;
    pub const R6: u8 = 6;
    pub const R7: u8 = 7;
    pub const R8: u8 = 8;
    pub const R9: u8 = 9;
    pub const R10: u8 = 10;

    const LD: u8 = 0x00;
    const LDX: u8 = 0x01;
    const STX: u8 = 0x03;
    const ALU: u8 = 0x04;
    const JMP: u8 = 0x05;
    const ALU64: u8 = 0x07;
    pub const W: u8 = 0x00;
    pub const H: u8 = 0x08;
    pub const B: u8 = 0x10;
    pub const DW: u8 = 0x18;
    const MEM: u8 = 0x60;
    const IMM: u8 = 0x00;
    const K: u8 = 0x00;
    const X: u8 = 0x08;

    pub const ADD: u8 = 0x00;
    pub const OR: u8 = 0x40;
    pub const AND: u8 = 0x50;
    pub const LSH: u8 = 0x60;
    pub const RSH: u8 = 0x70;
    pub const MOV: u8 = 0xb0;
    const END: u8 = 0xd0;
    const TO_BE: u8 = 0x08;

    pub const JEQ: u8 = 0x10;
    pub const JGT: u8 = 0x20;
    pub const JGE: u8 = 0x30;
    pub const JNE: u8 = 0x50;
    pub const JLT: u8 = 0xa0;
    pub const JLE: u8 = 0xb0;
    const JA: u8 = 0x00;
    const CALL: u8 = 0x80;
    const EXIT: u8 = 0x90;

    const PSEUDO_MAP_FD: u8 = 1;

    fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: dst | src << 4,
            off,
            imm,
        }
    }

    #[derive(Default)]
    pub struct Asm {
        pub insns: Vec<Insn>,
        /// (instruction index, label) of jumps to patch.
        fixups: Vec<(usize, &'static str)>,
        labels: Vec<(&'static str, usize)>,
    }

    impl Asm {
        pub fn label(&mut self, name: &'static str) {
            assert!(self.labels.iter().all(|(n, _)| *n != name), "label {name}");
            self.labels.push((name, self.insns.len()));
        }
        pub fn alu_k(&mut self, op: u8, dst: u8, imm: i32) {
            self.insns.push(insn(ALU64 | op | K, dst, 0, 0, imm));
        }
        pub fn alu_x(&mut self, op: u8, dst: u8, src: u8) {
            self.insns.push(insn(ALU64 | op | X, dst, src, 0, 0));
        }
        pub fn mov_k(&mut self, dst: u8, imm: i32) {
            self.alu_k(MOV, dst, imm);
        }
        pub fn mov_x(&mut self, dst: u8, src: u8) {
            self.alu_x(MOV, dst, src);
        }
        /// Byte-swaps the low 16 bits from network order (host order afterwards).
        pub fn be16(&mut self, dst: u8) {
            self.insns.push(insn(ALU | END | TO_BE, dst, 0, 0, 16));
        }
        pub fn ldx(&mut self, size: u8, dst: u8, src: u8, off: i16) {
            self.insns.push(insn(LDX | MEM | size, dst, src, off, 0));
        }
        pub fn stx(&mut self, size: u8, dst: u8, off: i16, src: u8) {
            self.insns.push(insn(STX | MEM | size, dst, src, off, 0));
        }
        pub fn ld_map(&mut self, dst: u8, fd: i32) {
            self.insns
                .push(insn(LD | IMM | DW, dst, PSEUDO_MAP_FD, 0, fd));
            self.insns.push(insn(0, 0, 0, 0, 0));
        }
        pub fn jmp_k(&mut self, op: u8, dst: u8, imm: i32, to: &'static str) {
            self.fixups.push((self.insns.len(), to));
            self.insns.push(insn(JMP | op | K, dst, 0, 0, imm));
        }
        pub fn jmp_x(&mut self, op: u8, dst: u8, src: u8, to: &'static str) {
            self.fixups.push((self.insns.len(), to));
            self.insns.push(insn(JMP | op | X, dst, src, 0, 0));
        }
        pub fn ja(&mut self, to: &'static str) {
            self.fixups.push((self.insns.len(), to));
            self.insns.push(insn(JMP | JA, 0, 0, 0, 0));
        }
        /// `lock *(u64 *)(dst + off) += src` (`BPF_ATOMIC | BPF_ADD`, doubleword).
        pub fn atomic_add64(&mut self, dst: u8, off: i16, src: u8) {
            self.atomic64(ADD, dst, off, src);
        }
        /// `lock *(u64 *)(dst + off) |= src` (`BPF_ATOMIC | BPF_OR`, doubleword).
        pub fn atomic_or64(&mut self, dst: u8, off: i16, src: u8) {
            self.atomic64(OR, dst, off, src);
        }
        /// A doubleword atomic operation: the ALU operation is the instruction's immediate.
        fn atomic64(&mut self, op: u8, dst: u8, off: i16, src: u8) {
            const ATOMIC: u8 = 0xc0;
            self.insns
                .push(insn(STX | ATOMIC | DW, dst, src, off, op as i32));
        }
        pub fn call(&mut self, helper: i32) {
            self.insns.push(insn(JMP | CALL, 0, 0, 0, helper));
        }
        pub fn exit(&mut self) {
            self.insns.push(insn(JMP | EXIT, 0, 0, 0, 0));
        }
        pub fn finish(mut self) -> Vec<Insn> {
            for (at, name) in std::mem::take(&mut self.fixups) {
                let target = self
                    .labels
                    .iter()
                    .find(|(n, _)| *n == name)
                    .unwrap_or_else(|| panic!("no label {name}"))
                    .1;
                self.insns[at].off = (target as isize - at as isize - 1) as i16;
            }
            self.insns
        }
    }
}

/// Where the packet's bytes are: the offsets of the data and data-end pointers in the
/// program's context.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PacketPointers {
    pub data: i16,
    pub data_end: i16,
}
