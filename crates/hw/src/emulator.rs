//! The `emulator` backend: MT-3000 kernels compiled with the host C compiler
//! against the emulator's hthreads headers and runtime (shipped inside this
//! crate), run as a confined process, and measured in modeled cycles.
//!
//! The emulator's own pieces (runtime sources, instrumentation, output
//! protocol) are in `emu/`, the build and launch machinery it shares with
//! the `host` backend in [`crate::toolchain`].

use std::path::PathBuf;

use crate::HwError;
use crate::board::{Artifact, BackendKind, Board, BuildRequest, RunOutcome, RunRequest, Slice};
use crate::faults::{FaultConfig, FaultInjector};
use crate::spec::ChipSpec;
use crate::toolchain::{Flavor, Toolchain};

// Where callers have always found them.
pub use crate::emu::instrument::charge_basic_blocks;
pub use crate::emu::runtime::{default_cache_dir, materialize_runtime, spec_string};
pub use crate::toolchain::{EMULATED_LAUNCH_NICENESS, RunLimits};

/// The MT-3000 emulator on one slice (backend `emulator`).
#[derive(Debug, Clone)]
pub struct EmulatorBoard {
    toolchain: Toolchain,
}

impl EmulatorBoard {
    /// A board for `slice` modeled with `spec`; uses `gcc` and
    /// [`default_cache_dir`]. Rejects slices the chip cannot have.
    pub fn new(slice: Slice, spec: ChipSpec) -> Result<Self, HwError> {
        Ok(Self {
            toolchain: Toolchain::new(slice, spec, BackendKind::Emulator)?,
        })
    }

    /// Where the runtime sources and objects are cached.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.toolchain.cache_dir = dir.into();
        self
    }

    /// The C compiler to use (default `gcc`).
    pub fn with_compiler(mut self, compiler: impl Into<String>) -> Self {
        self.toolchain.compiler = compiler.into();
        self
    }

    /// Limits of each launched harness (default [`RunLimits::default`]).
    pub fn with_limits(mut self, limits: RunLimits) -> Self {
        self.toolchain.limits = limits;
        self
    }

    /// Inject faults into launches at these rates (see [`crate::faults`]);
    /// the launch counter starts at 0. Rates of 0 turn injection off.
    pub fn with_faults(mut self, faults: FaultConfig) -> Self {
        self.toolchain.faults =
            (!faults.is_off()).then(|| std::sync::Arc::new(FaultInjector::new(faults)));
        self
    }

    /// The fault rates in force, if any.
    pub fn faults(&self) -> Option<FaultConfig> {
        self.toolchain.faults.as_ref().map(|f| *f.config())
    }

    /// The chip model the emulator runs with.
    pub fn spec(&self) -> &ChipSpec {
        &self.toolchain.spec
    }
}

#[async_trait::async_trait]
impl Board for EmulatorBoard {
    fn slice(&self) -> &Slice {
        &self.toolchain.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        self.toolchain.build(request, Flavor::Emulated).await
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.toolchain
            .run(artifact, request, Flavor::Emulated)
            .await
    }
}
