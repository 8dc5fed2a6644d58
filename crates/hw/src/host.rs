//! The `host` backend: the same kernel directory (harness, kernel, hthreads
//! runtime) compiled natively without the cycle model or instrumentation and
//! timed with the wall clock from `hthread_group_exec` to
//! `hthread_group_wait`. For kernels that are not MT-3000 specific, and for
//! checking a kernel's correctness at native speed.

use crate::toolchain::ToolchainBoard;

/// The host CPU as a slice (backend `host`). Capacity limits of the spec
/// still apply (the same runtime enforces them); `peak_fraction` is 0 since
/// the host's peak is not modeled. `new(slice, spec)` gives a host slice
/// with `slice.cores` worker threads per group.
pub type HostBoard = ToolchainBoard<false>;
