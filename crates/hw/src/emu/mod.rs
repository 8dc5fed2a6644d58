//! The emulator itself, as the C backends use it: its runtime sources
//! (`crates/hw/emu/`, embedded and written to a cache), the instrumentation
//! that turns device code into modeled cycles, and the protocol the runtime
//! and the harness print on stdout.
//!
//! The `emulator` and `host` backends both compile the same runtime (the
//! host one without the cycle model) through [`crate::toolchain`]; the
//! pieces here know nothing of boards or slices, so both backends and the
//! toolchain can stand on them.
//!
//! The chip spec reaches the C runtime as a `key=value;...` string: baked
//! into each build and passed again in `$MTSWARM_SPEC` at run time, so a
//! TOML change changes the model.

use crate::board::BackendKind;

pub(crate) mod instrument;
pub(crate) mod protocol;
pub(crate) mod runtime;

/// Which flavour of the shared build/run machinery to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// Instrumented kernel, cycle model, modeled time.
    Emulated,
    /// Plain native build, wall-clock time.
    Native,
}

impl Flavor {
    /// The backend whose artifacts this flavour builds.
    pub(crate) fn backend(self) -> BackendKind {
        match self {
            Self::Emulated => BackendKind::Emulator,
            Self::Native => BackendKind::Host,
        }
    }
    /// File name of this flavour's compiled runtime in the cache.
    pub(crate) fn runtime_object(self) -> &'static str {
        match self {
            Self::Emulated => "runtime-emu.o",
            Self::Native => "runtime-host.o",
        }
    }
}
