//! `mtswarm`: the command-line entry point; everything lives in the library
//! (`mtswarm_cli::run`) so other binaries can run the same command line.

fn main() -> std::process::ExitCode {
    mtswarm_cli::run()
}
