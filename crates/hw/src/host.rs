//! The `host` backend: the same kernel directory (harness, kernel, hthreads
//! runtime) compiled natively without the cycle model or instrumentation and
//! timed with the wall clock from `hthread_group_exec` to
//! `hthread_group_wait`. For kernels that are not MT-3000 specific, and for
//! checking a kernel's correctness at native speed.

use std::path::PathBuf;

use crate::HwError;
use crate::board::{Artifact, BackendKind, Board, BuildRequest, RunOutcome, RunRequest, Slice};
use crate::spec::ChipSpec;
use crate::toolchain::{Flavor, RunLimits, Toolchain};

/// The host CPU as a slice (backend `host`). Capacity limits of the spec
/// still apply (the same runtime enforces them); `peak_fraction` is 0 since
/// the host's peak is not modeled.
#[derive(Debug, Clone)]
pub struct HostBoard {
    toolchain: Toolchain,
}

impl HostBoard {
    /// A host slice with `slice.cores` worker threads per group.
    pub fn new(slice: Slice, spec: ChipSpec) -> Result<Self, HwError> {
        Ok(Self {
            toolchain: Toolchain::new(slice, spec, BackendKind::Host)?,
        })
    }

    /// Where the runtime sources and objects are cached (default
    /// [`crate::emulator::default_cache_dir`]).
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
}

#[async_trait::async_trait]
impl Board for HostBoard {
    fn slice(&self) -> &Slice {
        &self.toolchain.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        self.toolchain.build(request, Flavor::Native).await
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.toolchain.run(artifact, request, Flavor::Native).await
    }
}
