//! The WebAssembly globals the instrumentation adds: the accounting of one
//! core and the few facts its checks need.
//!
//! They are appended after the module's own globals, so nothing the kernel
//! was compiled with can name them: C code reaches memory, never globals,
//! and the compiler's only global is the stack pointer. The host reads and
//! resets them through exports whose names (`mtswarm.*`) no C function can
//! have.

use wasmparser::ValType;

/// A per-core counter the instrumented code adds to (i64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    /// Scalar issue, thousandths of a cycle (straight-line sequences).
    ScalarMillicycles,
    /// Floating-point operations executed (scalar and vector lanes).
    Flops,
    /// Vector units (128-bit operations) on the FMA units, fused pairs
    /// counted once.
    FmaUnits,
    /// Vector units on the broadcast/shuffle unit.
    BroadcastUnits,
    /// Bytes of bulk (16-byte) accesses to the core's AM.
    AmBulkBytes,
    /// Bytes of bulk accesses to the core's SM or stack.
    SmBulkBytes,
    /// Direct accesses to GSM (one request each).
    GsmRequests,
    /// Bytes of direct GSM accesses (rounded up to 8).
    GsmBytes,
    /// Direct accesses to DDR (buffers and static data).
    DdrRequests,
    /// Bytes of direct DDR accesses (rounded up to 8).
    DdrBytes,
}

impl Counter {
    /// Every counter, in global order.
    pub(crate) const ALL: [Counter; 10] = [
        Counter::ScalarMillicycles,
        Counter::Flops,
        Counter::FmaUnits,
        Counter::BroadcastUnits,
        Counter::AmBulkBytes,
        Counter::SmBulkBytes,
        Counter::GsmRequests,
        Counter::GsmBytes,
        Counter::DdrRequests,
        Counter::DdrBytes,
    ];

    /// Position among the added globals.
    pub(crate) fn slot(self) -> u32 {
        self as u32
    }

    /// The export the host reads it through.
    pub(crate) fn export(self) -> &'static str {
        match self {
            Counter::ScalarMillicycles => "mtswarm.scalar_millicycles",
            Counter::Flops => "mtswarm.flops",
            Counter::FmaUnits => "mtswarm.fma_units",
            Counter::BroadcastUnits => "mtswarm.broadcast_units",
            Counter::AmBulkBytes => "mtswarm.am_bulk_bytes",
            Counter::SmBulkBytes => "mtswarm.sm_bulk_bytes",
            Counter::GsmRequests => "mtswarm.gsm_requests",
            Counter::GsmBytes => "mtswarm.gsm_bytes",
            Counter::DdrRequests => "mtswarm.ddr_requests",
            Counter::DdrBytes => "mtswarm.ddr_bytes",
        }
    }
}

/// Per-core facts the checks read, and where a fault is reported (i32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// First byte of this core's window (stack, SM, AM).
    WindowLo,
    /// Bytes of the launch's DDR buffers from the layout's `ddr_lo`.
    DdrLen,
    /// Bytes of read-only DDR buffers at the start of the DDR range.
    DdrReadOnlyLen,
    /// Address of the access that faulted.
    FaultAddress,
    /// What faulted: access size, store bit and [`Fault`] (see `info`).
    FaultInfo,
}

impl State {
    /// Every state global, in order (after the counters).
    pub(crate) const ALL: [State; 5] = [
        State::WindowLo,
        State::DdrLen,
        State::DdrReadOnlyLen,
        State::FaultAddress,
        State::FaultInfo,
    ];

    /// Position among the added globals.
    pub(crate) fn slot(self) -> u32 {
        Counter::ALL.len() as u32 + self as u32
    }

    /// The export the host reads and sets it through.
    pub(crate) fn export(self) -> &'static str {
        match self {
            State::WindowLo => "mtswarm.window_lo",
            State::DdrLen => "mtswarm.ddr_len",
            State::DdrReadOnlyLen => "mtswarm.ddr_read_only_len",
            State::FaultAddress => "mtswarm.fault_address",
            State::FaultInfo => "mtswarm.fault_info",
        }
    }
}

/// Why an access faulted (bits 28.. of the fault info).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Outside every memory the core may use.
    Outside = 1,
    /// A store into a DDR buffer the host allocated read-only.
    ReadOnlyBuffer = 2,
    /// A store into the kernel image's read-only data.
    ReadOnlyImage = 3,
}

/// The fault info word's parts: (bytes of the checked range, store,
/// fault). The word is the range's span (bits 0..24), the store bit (24)
/// and the [`Fault`] (bits 28..).
pub(crate) fn decode_info(word: i32) -> (u32, bool, Option<Fault>) {
    let word = word as u32;
    let fault = match word >> 28 {
        1 => Some(Fault::Outside),
        2 => Some(Fault::ReadOnlyBuffer),
        3 => Some(Fault::ReadOnlyImage),
        _ => None,
    };
    (word & 0x00ff_ffff, word & (1 << 24) != 0, fault)
}

/// Export name of the stack pointer (the module's own global).
pub(crate) const STACK_POINTER_EXPORT: &str = "mtswarm.stack_pointer";

/// Type of an added global.
pub(crate) fn val_type(slot: u32) -> ValType {
    if slot < Counter::ALL.len() as u32 {
        ValType::I64
    } else {
        ValType::I32
    }
}

/// Number of added globals.
pub(crate) const COUNT: u32 = (Counter::ALL.len() + State::ALL.len()) as u32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_dense_and_exports_unique() {
        let mut names: Vec<&str> = Counter::ALL.iter().map(|c| c.export()).collect();
        names.extend(State::ALL.iter().map(|s| s.export()));
        names.push(STACK_POINTER_EXPORT);
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c.slot() as usize, i);
            assert_eq!(val_type(c.slot()), ValType::I64);
        }
        assert_eq!(State::FaultInfo.slot() + 1, COUNT);
        assert_eq!(val_type(State::WindowLo.slot()), ValType::I32);
    }

    #[test]
    fn fault_info_decodes_span_store_and_fault() {
        let word = 128 | (1 << 24) | ((Fault::ReadOnlyBuffer as i32) << 28);
        assert_eq!(decode_info(word), (128, true, Some(Fault::ReadOnlyBuffer)));
        assert_eq!(decode_info(8), (8, false, None));
    }
}
