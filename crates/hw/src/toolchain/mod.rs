//! The C toolchain of the emulator and host backends: how a kernel
//! directory becomes a harness (confined compiles with an object cache)
//! and how that harness is launched and read back.
//!
//! The two backends differ in `Flavor`: the emulator builds WebAssembly
//! with clang (`emulated`) and runs it isolated in this process, reporting
//! modeled cycles; the host backend builds natively (`build`) and launches
//! a confined process, reporting wall time. Both read the same output
//! protocol. The one check of `-D` defines every backend applies
//! (`check_defines`) lives here too.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::board::{BackendKind, BuildRequest, Slice};
use crate::emu::runtime::{default_cache_dir, materialize_runtime};
use crate::error::{HwError, io_err};
use crate::faults::FaultInjector;
use crate::spec::ChipSpec;

mod board;
mod build;
mod compile;
mod emulated;
mod run;

pub(crate) use crate::emu::Flavor;
pub use board::ToolchainBoard;
pub(crate) use build::model_figures;
pub use run::EMULATED_LAUNCH_NICENESS;

/// Flags shared by every compile. `-fno-ivopts` only shortens the host
/// compile of the 1024-bit vector code; it changes no modeled cost.
const OPT_FLAGS: &[&str] = &[
    "-O2",
    "-fno-ivopts",
    "-Wall",
    "-Wno-psabi",
    "-Wno-unused-parameter",
];
/// Most output kept from a compiler or a harness.
const MAX_OUTPUT_BYTES: usize = 4 << 20;
/// Characters of output kept in errors and `output_tail`.
const TAIL_CHARS: usize = 4000;

/// Limits of a launched harness. CPU seconds are derived from the run's
/// timeout when not set.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLimits {
    /// `RLIMIT_AS` of the harness, bytes (default 16 GiB; `None`: inherited).
    pub address_space_bytes: Option<u64>,
    /// `RLIMIT_CPU` of the harness; `None`: (timeout + 1 s) x host threads + 1 s.
    pub cpu_seconds: Option<u64>,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            // Each core thread reserves a stack and a malloc arena.
            address_space_bytes: Some(16 << 30),
            cpu_seconds: None,
        }
    }
}

/// Shared state of the emulator and host backends.
#[derive(Debug, Clone)]
pub(crate) struct Toolchain {
    pub(crate) slice: Slice,
    pub(crate) spec: ChipSpec,
    pub(crate) cache_dir: PathBuf,
    /// The native C compiler (the `host` backend).
    pub(crate) compiler: String,
    /// clang, which builds the emulator's WebAssembly (with wasm-ld and
    /// wasi-libc installed).
    pub(crate) clang: String,
    pub(crate) limits: RunLimits,
    /// Fault injection (emulator only; `None` = off).
    pub(crate) faults: Option<std::sync::Arc<FaultInjector>>,
}

impl Toolchain {
    /// The build and run settings of a board on `slice`, with `gcc` and the
    /// default cache directory. Rejects slices the chip cannot have: the
    /// emulator and host backends share the same runtime and its limits.
    pub(crate) fn new(slice: Slice, spec: ChipSpec, backend: BackendKind) -> Result<Self, HwError> {
        spec.validate()?;
        if slice.cores == 0 || slice.cores > spec.cores_per_cluster {
            return Err(HwError::Config(format!(
                "slice {} has {} cores; a cluster has 1..={} (cores_per_cluster)",
                slice.id(),
                slice.cores,
                spec.cores_per_cluster
            )));
        }
        if let Some(c) = slice.cluster
            && c >= spec.clusters
        {
            return Err(HwError::Config(format!(
                "slice {}: cluster {c} does not exist (clusters 0..{})",
                slice.id(),
                spec.clusters
            )));
        }
        Ok(Self {
            slice: Slice { backend, ..slice },
            spec,
            cache_dir: default_cache_dir(),
            compiler: "gcc".to_owned(),
            clang: "clang".to_owned(),
            limits: RunLimits::default(),
            faults: None,
        })
    }
}

/// Where one build of the emulator or host backend reads and writes, each
/// path canonical.
pub(crate) struct BuildDirs {
    /// The kernel directory (it has `kernel.c` and `host.c`).
    pub(crate) kernel_dir: PathBuf,
    /// The build directory, created.
    pub(crate) out_dir: PathBuf,
    /// The emulator's runtime tree, materialized in the cache.
    pub(crate) runtime_dir: PathBuf,
    /// `-DNAME=VALUE` of each define.
    pub(crate) defines: Vec<String>,
}

impl Toolchain {
    /// Check a build request (its defines, `kernel.c` and `host.c`), create
    /// its build directory and materialize the runtime.
    pub(crate) fn build_dirs(&self, request: &BuildRequest) -> Result<BuildDirs, HwError> {
        check_defines(&request.defines)?;
        let kernel_dir = &request.kernel_dir;
        for file in ["kernel.c", "host.c"] {
            if !kernel_dir.join(file).is_file() {
                return Err(HwError::kernel(format!(
                    "{}: missing {file}",
                    kernel_dir.display()
                )));
            }
        }
        let kernel_dir = kernel_dir
            .canonicalize()
            .map_err(|e| HwError::kernel_caused(format!("{}: {e}", kernel_dir.display()), e))?;
        let out_dir = &request.out_dir;
        std::fs::create_dir_all(out_dir).map_err(|e| io_err("creating", out_dir, e))?;
        let out_dir = out_dir
            .canonicalize()
            .map_err(|e| io_err("resolving", out_dir, e))?;
        let runtime_dir = materialize_runtime(&self.cache_dir)?;
        let defines = request
            .defines
            .iter()
            .map(|(k, v)| format!("-D{k}={v}"))
            .collect();
        Ok(BuildDirs {
            kernel_dir,
            out_dir,
            runtime_dir,
            defines,
        })
    }
}

/// Define names are C identifiers; values have no control characters.
pub(crate) fn check_defines(defines: &BTreeMap<String, String>) -> Result<(), HwError> {
    for (name, value) in defines {
        let mut chars = name.chars();
        let starts_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !starts_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(HwError::Config(format!(
                "define name `{name}` is not a C identifier"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(HwError::Config(format!(
                "define `{name}` has a control character in its value"
            )));
        }
    }
    Ok(())
}
