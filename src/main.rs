//! The `kxdp` binary: the application. Command-line parsing, output formats, the admin socket's
//! client and the capture generator live here (as ripgrep keeps its application apart from its
//! libraries); the library crates (`kxdp-packet`, `kxdp-dataplane`, `kxdp-control`) return typed
//! errors, and `cli` alone turns them into messages and exit codes.

mod cli;
mod logging;
mod output;
mod pcapgen;

fn main() {
    std::process::exit(cli::main());
}
