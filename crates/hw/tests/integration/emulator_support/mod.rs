//! Shared helpers of the emulator tests: real gcc, real kernel directories.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::tune::{Config, TuneSpace};
use mtswarm_hw::{
    BackendKind, Board, BuildRequest, ChipSpec, HwError, RunOutcome, RunRequest, Slice,
};

pub(crate) fn kernels_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
}

pub(crate) fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("emu-cache")
}

pub(crate) fn slice(cores: u32) -> Slice {
    Slice {
        board: "test".into(),
        cluster: Some(0),
        cores,
        backend: BackendKind::Emulator,
    }
}

pub(crate) fn board(cores: u32) -> EmulatorBoard {
    board_with_spec(cores, ChipSpec::default())
}

pub(crate) fn board_with_spec(cores: u32, spec: ChipSpec) -> EmulatorBoard {
    EmulatorBoard::new(slice(cores), spec)
        .expect("valid slice")
        .with_cache_dir(cache_dir())
}

/// The tune.toml defaults of `kernel` with `overrides` on top.
pub(crate) fn defines(kernel: &str, overrides: &[(&str, &str)]) -> BTreeMap<String, String> {
    let space = TuneSpace::load(&kernels_dir().join(kernel)).expect("tune.toml parses");
    let mut d = space.defines(&space.default_config());
    for (k, v) in overrides {
        d.insert((*k).to_owned(), (*v).to_owned());
    }
    d
}

pub(crate) fn config_defines(kernel: &str, config: &Config) -> BTreeMap<String, String> {
    let space = TuneSpace::load(&kernels_dir().join(kernel)).expect("tune.toml parses");
    space.defines(config)
}

pub(crate) async fn build_and_run(
    board: &EmulatorBoard,
    kernel_dir: &Path,
    defines: BTreeMap<String, String>,
    cores: u32,
    runs: u32,
) -> Result<RunOutcome, HwError> {
    let out = tempfile::tempdir().expect("tempdir");
    let artifact = board
        .build(&BuildRequest {
            kernel_dir: kernel_dir.to_path_buf(),
            defines,
            out_dir: out.path().to_path_buf(),
        })
        .await?;
    board
        .run(
            &artifact,
            &RunRequest::new(cores, runs, Duration::from_secs(120)),
        )
        .await
}

/// [`build_and_run`] of the example `kernel` at its tune.toml defaults
/// with `overrides` on top, on a fresh `cores`-core board.
pub(crate) async fn run_example(
    kernel: &str,
    overrides: &[(&str, &str)],
    cores: u32,
    runs: u32,
) -> Result<RunOutcome, HwError> {
    let dir = kernels_dir().join(kernel);
    build_and_run(&board(cores), &dir, defines(kernel, overrides), cores, runs).await
}

/// A kernel directory in a temp dir: the vecadd harness with `kernel_c` as
/// its device code (which must define `vecadd_kernel`).
pub(crate) fn fixture(kernel_c: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        kernels_dir().join("vecadd/host.c"),
        dir.path().join("host.c"),
    )
    .expect("copy host.c");
    std::fs::write(dir.path().join("kernel.c"), kernel_c).expect("write kernel.c");
    dir
}

/// Device code around `body`, with the vecadd entry signature.
pub(crate) fn kernel_with_body(prelude: &str, body: &str) -> String {
    format!(
        "#include <stdint.h>\n#include <compiler/m3000.h>\n#include <hthread_device.h>\n{prelude}\n\
         __global__ void vecadd_kernel(uint64_t n, uint64_t e, double *a, double *b, double *c) {{\n\
         (void)n; (void)e; (void)a; (void)b; (void)c;\n{body}\n}}\n"
    )
}
