//! What every piece of the instrumentation needs: where the added globals
//! and the slow path are, the layout's and the chip's numbers, and the one
//! way a counter is bumped, and the errors of a module that cannot be
//! read or rewritten.

use wasm_encoder::{Function, Instruction};

use crate::error::HwError;

/// What the instrumentation of a body needs to know.
#[derive(Debug, Clone, Copy)]
pub(super) struct Context {
    /// Index of the first added global.
    pub(super) first_global: u32,
    /// Index of the injected slow-path function.
    pub(super) slow_fn: u32,
    /// Bytes of a core's window.
    pub(super) window_len: u32,
    /// Offset of AM in a window (stack and SM come first).
    pub(super) am_offset: u32,
    /// 128-bit units per vector issue (`vector_lanes / 2`).
    pub(super) units_per_issue: u64,
    /// Scalar issue slots per cycle.
    pub(super) scalar_slots: u32,
    /// Least a sequence with scalar work costs, cycles.
    pub(super) min_sequence_cycles: f64,
    /// The module's stack pointer global.
    pub(super) stack_pointer: u32,
    /// Bytes of a core's stack.
    pub(super) stack_bytes: u32,
}

/// `global += value` (i64).
pub(super) fn add_to(f: &mut Function, global: u32, value: i64) {
    f.instruction(&Instruction::GlobalGet(global))
        .instruction(&Instruction::I64Const(value))
        .instruction(&Instruction::I64Add)
        .instruction(&Instruction::GlobalSet(global));
}

pub(super) fn bad_module(e: wasmparser::BinaryReaderError) -> HwError {
    HwError::compile(format!("kernel.c: the compiled module does not parse: {e}"))
}

pub(super) fn reencode_error<E: std::fmt::Display>(e: E) -> HwError {
    HwError::compile(format!(
        "kernel.c: the compiled module cannot be rewritten: {e}"
    ))
}
