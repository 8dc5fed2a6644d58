//! The one `Board` over the C toolchain: the `emulator` and `host` backends
//! are the same board (same builder, same build and launch) and differ only
//! in the flavour of the build, which its `EMULATED` parameter chooses.

use std::path::PathBuf;

use super::{Flavor, RunLimits, Toolchain};
use crate::board::{Artifact, Board, BuildRequest, RunOutcome, RunRequest, Slice};
use crate::error::HwError;
use crate::spec::ChipSpec;

/// A board whose kernels are compiled against the hthreads headers: to
/// WebAssembly run isolated in this process, with modeled cycles, when
/// `EMULATED` ([`crate::EmulatorBoard`]); natively and launched as a
/// confined process, with wall-clock time, otherwise
/// ([`crate::HostBoard`]).
#[derive(Debug, Clone)]
pub struct ToolchainBoard<const EMULATED: bool> {
    pub(crate) toolchain: Toolchain,
}

impl<const EMULATED: bool> ToolchainBoard<EMULATED> {
    /// The flavour of the shared build/run machinery.
    const FLAVOR: Flavor = if EMULATED {
        Flavor::Emulated
    } else {
        Flavor::Native
    };

    /// A board for `slice` modeled with `spec`; uses `gcc` and
    /// [`crate::emulator::default_cache_dir`]. Rejects slices the chip
    /// cannot have.
    pub fn new(slice: Slice, spec: ChipSpec) -> Result<Self, HwError> {
        Ok(Self {
            toolchain: Toolchain::new(slice, spec, Self::FLAVOR.backend())?,
        })
    }

    /// Where the runtime sources and objects are cached.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.toolchain.cache_dir = dir.into();
        self
    }

    /// The C compiler to use: the native compiler of the `host` backend
    /// (default `gcc`), clang for the emulator (default `clang`).
    pub fn with_compiler(mut self, compiler: impl Into<String>) -> Self {
        if EMULATED {
            self.toolchain.clang = compiler.into();
        } else {
            self.toolchain.compiler = compiler.into();
        }
        self
    }

    /// Limits of each launched harness (default [`RunLimits::default`]).
    pub fn with_limits(mut self, limits: RunLimits) -> Self {
        self.toolchain.limits = limits;
        self
    }
}

#[async_trait::async_trait]
impl<const EMULATED: bool> Board for ToolchainBoard<EMULATED> {
    fn slice(&self) -> &Slice {
        &self.toolchain.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        if EMULATED {
            self.toolchain.build_emulated(request).await
        } else {
            self.toolchain.build_native(request).await
        }
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.toolchain.run(artifact, request, Self::FLAVOR).await
    }
}
