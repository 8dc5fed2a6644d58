//! The `emulator` backend: MT-3000 kernels compiled to WebAssembly against
//! the emulator's device headers, run isolated in this process with one
//! instance per DSP core, and measured in modeled cycles the kernel cannot
//! reach.
//!
//! The emulator's own pieces (device contract, instrumentation, memory
//! layout, the machine that runs a launch, output protocol) are in `emu/`,
//! the build and launch machinery it shares with the `host` backend in
//! [`crate::toolchain`].

use crate::faults::{FaultConfig, FaultInjector};
use crate::spec::ChipSpec;
use crate::toolchain::ToolchainBoard;

// Where callers have always found them.
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
