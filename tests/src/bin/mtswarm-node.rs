//! The `mtswarm` command line as a binary of the tests crate, so end-to-end
//! tests can spawn it (`env!("CARGO_BIN_EXE_mtswarm-node")`) and Cargo
//! builds it, from the sources under test, before running them.

fn main() -> std::process::ExitCode {
    mtswarm_cli::run()
}
