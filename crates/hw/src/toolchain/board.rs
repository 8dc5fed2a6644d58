//! The one `Board` over the C toolchain: the `emulator` and `host` backends
//! are the same board (same builder, same build and launch) and differ only
//! in the flavour their marker type names.

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;

use super::{Flavor, RunLimits, Toolchain};
use crate::HwError;
use crate::board::{Artifact, BackendKind, Board, BuildRequest, RunOutcome, RunRequest, Slice};
use crate::spec::ChipSpec;

pub(crate) mod sealed {
    /// Only this crate's backends are toolchain backends.
    pub trait Sealed {
        /// The backend kind of the board's slice and artifacts.
        const BACKEND: crate::board::BackendKind;
    }
}

/// The flavour of the shared build/run machinery `B` uses: only the
/// emulator instruments; the host backend is the native build.
fn flavor<B: ToolchainBackend>() -> Flavor {
    if B::BACKEND == BackendKind::Emulator {
        Flavor::Emulated
    } else {
        Flavor::Native
    }
}

/// A backend built on the C toolchain: [`crate::emulator::Emulator`] or
/// [`crate::host::Host`].
pub trait ToolchainBackend: sealed::Sealed + Send + Sync + 'static {}

/// A board whose kernels are compiled by the host C compiler against the
/// hthreads runtime and launched as confined processes; `B` chooses the
/// backend ([`crate::EmulatorBoard`], [`crate::HostBoard`]).
pub struct ToolchainBoard<B: ToolchainBackend> {
    pub(crate) toolchain: Toolchain,
    backend: PhantomData<fn() -> B>,
}

impl<B: ToolchainBackend> ToolchainBoard<B> {
    /// A board for `slice` modeled with `spec`; uses `gcc` and
    /// [`crate::emulator::default_cache_dir`]. Rejects slices the chip
    /// cannot have.
    pub fn new(slice: Slice, spec: ChipSpec) -> Result<Self, HwError> {
        Ok(Self {
            toolchain: Toolchain::new(slice, spec, B::BACKEND)?,
            backend: PhantomData,
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
}

impl<B: ToolchainBackend> Clone for ToolchainBoard<B> {
    fn clone(&self) -> Self {
        Self {
            toolchain: self.toolchain.clone(),
            backend: PhantomData,
        }
    }
}

impl<B: ToolchainBackend> fmt::Debug for ToolchainBoard<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolchainBoard")
            .field("toolchain", &self.toolchain)
            .finish()
    }
}

#[async_trait::async_trait]
impl<B: ToolchainBackend> Board for ToolchainBoard<B> {
    fn slice(&self) -> &Slice {
        &self.toolchain.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        self.toolchain.build(request, flavor::<B>()).await
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.toolchain.run(artifact, request, flavor::<B>()).await
    }
}
