//! Shared helpers for the workspace-level end-to-end tests: real processes
//! (killed with their whole process group when the guard drops), readiness
//! through `--ready-file` with a bounded wait, an in-process OTLP collector (`mtswarm_telemetry::testing`),
//! jobs driven through the Control service (`jobs`), the `mtswarm` command
//! line as a child process (`cli`), a scripted OpenAI-compatible endpoint
//! that plays the model of both loops (`scripted_model`), and paths to the
//! example kernels and fleet files.
//!
//! The processes are the tests crate's own `mtswarm-node` binary, which runs
//! the `mtswarm` command line (`mtswarm_cli::run`). Cargo builds it before the
//! tests and exposes its path as `env!("CARGO_BIN_EXE_mtswarm-node")`, so no
//! prior manual `cargo build` is needed and the binary always matches the
//! sources under test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

pub mod chaos;
pub mod cli;
pub mod farm;
pub mod jobs;
pub mod observability;
pub mod process;
pub mod scripted_model;
pub mod stack;

use std::path::{Path, PathBuf};

pub use chaos::{ChaosOptions, ChaosStack, Observer};
pub use mtswarm_telemetry::testing::{CollectedSpan, OtlpCollector};
pub use process::{NodeProcess, ReadyInfo};
pub use stack::{StackOptions, TestStack};

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// `examples/kernels`: the kernel root of every test stack.
pub fn kernel_root() -> PathBuf {
    repo_root().join("examples").join("kernels")
}

/// Emulator build cache shared by the test processes (the emulator runtime
/// is compiled once, not once per test).
pub fn emulator_cache_dir() -> PathBuf {
    std::env::temp_dir().join("mtswarm-tests-emu-cache")
}

/// A fleet of `boards` emulated boards named `board0..`, each cut into its
/// four DSP clusters (`slicing = "per-cluster"`), as fleet.toml text.
pub fn emulator_fleet_toml(boards: usize) -> String {
    let mut text = String::new();
    for index in 0..boards {
        text.push_str(&format!(
            "[[board]]\nid = \"board{index}\"\nbackend = \"emulator\"\nslicing = \"per-cluster\"\n\n"
        ));
    }
    text
}

/// A fleet of `boards` emulated boards, each offering `clusters` cluster
/// slices of `cores` cores (small slices keep emulated runs quick).
pub fn small_fleet_toml(boards: usize, clusters: u32, cores: u32) -> String {
    let mut text = String::new();
    for index in 0..boards {
        let slices: Vec<String> = (0..clusters)
            .map(|cluster| format!("{{ cluster = {cluster}, cores = {cores} }}"))
            .collect();
        text.push_str(&format!(
            "[[board]]\nid = \"board{index}\"\nbackend = \"emulator\"\nslices = [{}]\n\n",
            slices.join(", ")
        ));
    }
    text
}
