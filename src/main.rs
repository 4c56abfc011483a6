//! The `kxdp` binary: everything lives in the crates; this only hands over the process.

fn main() {
    std::process::exit(kxdp_control::cli::main());
}
