//! The `kxdp` binary: the application. Command-line parsing, output formats, the admin socket's
//! client and the capture generator live here (as ripgrep keeps its application apart from its
//! libraries); the library crates (`kxdp-packet`, `kxdp-dataplane`, `kxdp-control`) return typed
//! errors, and `cli` alone turns them into messages and exit codes.

mod cli;
mod logging;
mod output;
mod pcapgen;

/// musl's allocator (mallocng) costs the control plane 2-5x glibc's: decoding and building a
/// 30k-Service state spent a quarter of its time in its malloc, free and lock, and another
/// quarter in the kernel, as it returns pages eagerly and faults them in again. dlmalloc (the
/// allocator ptmalloc descends from, which Rust's own std uses on wasm) keeps freed memory for
/// reuse. The workers allocate nothing per packet, so its one global lock is taken only by the
/// control plane.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() {
    // dlmalloc serialises every allocation on one lock: decoding a state file on several
    // threads then contends on it and is slower than one thread.
    #[cfg(target_env = "musl")]
    kxdp_control::sources::files::set_max_decode_threads(1);
    std::process::exit(cli::main());
}
