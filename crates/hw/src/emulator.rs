//! The `emulator` backend: MT-3000 kernels compiled with the host C compiler
//! against the emulator's hthreads headers and runtime (shipped inside this
//! crate), run as a confined process, and measured in modeled cycles.
//!
//! The emulator's own pieces (runtime sources, instrumentation, output
//! protocol) are in `emu/`, the build and launch machinery it shares with
//! the `host` backend in [`crate::toolchain`].

use crate::faults::{FaultConfig, FaultInjector};
use crate::spec::ChipSpec;
use crate::toolchain::ToolchainBoard;

// Where callers have always found them.
pub use crate::emu::instrument::charge_basic_blocks;
pub use crate::emu::runtime::{default_cache_dir, materialize_runtime, spec_string};
pub use crate::toolchain::{EMULATED_LAUNCH_NICENESS, RunLimits};

/// The MT-3000 emulator on one slice (backend `emulator`).
pub type EmulatorBoard = ToolchainBoard<true>;

/// What only the emulator has: fault injection and the chip model it runs.
impl ToolchainBoard<true> {
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
