//! The emulator itself: device code isolated from its own accounting.
//!
//! A kernel is compiled to WebAssembly and can call nothing but the device
//! contract ([`contract`]); [`instrument`] rewrites it so that every
//! stretch of code charges its issue slots and every memory access is
//! checked and charged by the memory it touches, into counters the C code
//! cannot address; [`layout`] fixes where every memory level lives; and
//! [`machine`] runs the harness and one instance of the kernel per core in
//! this process, computing every figure on the host side. [`protocol`]
//! reads the harness's output lines, [`runtime`] materializes the headers,
//! the harness shim and the `host` backend's native C runtime.
//!
//! The pieces here know nothing of boards or slices, so both C backends
//! and the toolchain can stand on them.

use crate::board::BackendKind;

pub(crate) mod contract;
pub(crate) mod instrument;
pub(crate) mod layout;
pub(crate) mod machine;
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
}
