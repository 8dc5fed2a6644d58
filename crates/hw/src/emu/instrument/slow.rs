//! The injected slow path: every access outside the core's own window.
//!
//! A WebAssembly function the instrumentation appends to the module,
//! `(address, span, requests, bytes | store << 31) -> ()`, called by the
//! inline check of an access (or a group of accesses, see
//! [`super::checks`]) whose range left the window. It charges direct
//! accesses to GSM or DDR (each a request, its bytes rounded up to 8: the
//! core stalls and its bytes share its port with DMA, see the cycle model)
//! or stops the core: it records the address and the reason in the fault
//! globals and executes `unreachable`, which the runtime turns into an
//! error naming the address and the nearest buffer. A store into a
//! read-only DDR buffer or into the kernel image's read-only data is such
//! a stop.

use wasm_encoder::{BlockType, Function, Instruction, ValType};

use super::globals::{Counter, Fault, State};
use crate::emu::layout::{Layout, Span};

const ADDRESS: u32 = 0;
const SPAN: u32 = 1;
const REQUESTS: u32 = 2;
const BYTES_STORE: u32 = 3;
const WIDE: u32 = 4;

/// The body of the slow-path function for `layout`, whose added globals
/// start at `first_global`.
pub(super) fn function(layout: &Layout, first_global: u32) -> Function {
    let g = |slot: u32| first_global + slot;
    let mut f = Function::new([(1, ValType::I64)]);
    f.instruction(&Instruction::LocalGet(ADDRESS))
        .instruction(&Instruction::I64ExtendI32U)
        .instruction(&Instruction::LocalSet(WIDE));

    // GSM: the cluster's shared arrays.
    let gsm = layout.image.gsm;
    if gsm.len > 0 {
        in_fixed_span(&mut f, gsm);
        f.instruction(&Instruction::If(BlockType::Empty));
        charge_and_return(&mut f, first_global, GSM);
    }

    // DDR buffers: [ddr_lo, ddr_lo + ddr_len), read-only ones first.
    let ddr_lo = i64::from(layout.ddr_lo);
    f.instruction(&Instruction::LocalGet(WIDE))
        .instruction(&Instruction::I64Const(ddr_lo))
        .instruction(&Instruction::I64GeU)
        .instruction(&Instruction::LocalGet(WIDE))
        .instruction(&Instruction::LocalGet(SPAN))
        .instruction(&Instruction::I64ExtendI32U)
        .instruction(&Instruction::I64Add)
        .instruction(&Instruction::I64Const(ddr_lo))
        .instruction(&Instruction::GlobalGet(g(State::DdrLen.slot())))
        .instruction(&Instruction::I64ExtendI32U)
        .instruction(&Instruction::I64Add)
        .instruction(&Instruction::I64LeU)
        .instruction(&Instruction::I32And)
        .instruction(&Instruction::If(BlockType::Empty));
    // A store that starts below the end of the read-only buffers.
    is_store(&mut f);
    f.instruction(&Instruction::LocalGet(WIDE))
        .instruction(&Instruction::I64Const(ddr_lo))
        .instruction(&Instruction::GlobalGet(g(State::DdrReadOnlyLen.slot())))
        .instruction(&Instruction::I64ExtendI32U)
        .instruction(&Instruction::I64Add)
        .instruction(&Instruction::I64LtU)
        .instruction(&Instruction::I32And)
        .instruction(&Instruction::If(BlockType::Empty));
    fault(&mut f, first_global, Fault::ReadOnlyBuffer);
    f.instruction(&Instruction::End);
    charge_and_return(&mut f, first_global, DDR);

    // The kernel image's other static data lives in DDR.
    let image = layout.image.all;
    if image.len > 0 {
        in_fixed_span(&mut f, image);
        f.instruction(&Instruction::If(BlockType::Empty));
        let rodata = layout.image.rodata;
        if rodata.len > 0 {
            is_store(&mut f);
            in_fixed_span(&mut f, rodata);
            f.instruction(&Instruction::I32And)
                .instruction(&Instruction::If(BlockType::Empty));
            fault(&mut f, first_global, Fault::ReadOnlyImage);
            f.instruction(&Instruction::End);
        }
        charge_and_return(&mut f, first_global, DDR);
    }

    fault(&mut f, first_global, Fault::Outside);
    f.instruction(&Instruction::End);
    f
}

/// Pushes whether `[address, address + bytes)` lies inside `span`.
fn in_fixed_span(f: &mut Function, span: Span) {
    f.instruction(&Instruction::LocalGet(WIDE))
        .instruction(&Instruction::I64Const(i64::from(span.lo)))
        .instruction(&Instruction::I64GeU)
        .instruction(&Instruction::LocalGet(WIDE))
        .instruction(&Instruction::LocalGet(SPAN))
        .instruction(&Instruction::I64ExtendI32U)
        .instruction(&Instruction::I64Add)
        .instruction(&Instruction::I64Const(span.hi() as i64))
        .instruction(&Instruction::I64LeU)
        .instruction(&Instruction::I32And);
}

/// Pushes the store bit.
fn is_store(f: &mut Function) {
    f.instruction(&Instruction::LocalGet(BYTES_STORE))
        .instruction(&Instruction::I32Const(31))
        .instruction(&Instruction::I32ShrU);
}

/// The counters of direct accesses to GSM: requests, bytes.
const GSM: (Counter, Counter) = (Counter::GsmRequests, Counter::GsmBytes);
/// The counters of direct accesses to DDR: requests, bytes.
const DDR: (Counter, Counter) = (Counter::DdrRequests, Counter::DdrBytes);

/// Charge the direct requests and their bytes to a memory's `counters`
/// ([`GSM`], [`DDR`]; globals from `first_global` on), then return: the
/// access is accounted for (the `if` that chose its memory ends here).
fn charge_and_return(f: &mut Function, first_global: u32, counters: (Counter, Counter)) {
    let (requests, bytes) = counters;
    for (counter, local, mask) in [
        (requests, REQUESTS, -1i32),
        (bytes, BYTES_STORE, 0x7fff_ffff),
    ] {
        let global = first_global + counter.slot();
        f.instruction(&Instruction::GlobalGet(global))
            .instruction(&Instruction::LocalGet(local))
            .instruction(&Instruction::I32Const(mask))
            .instruction(&Instruction::I32And)
            .instruction(&Instruction::I64ExtendI32U)
            .instruction(&Instruction::I64Add)
            .instruction(&Instruction::GlobalSet(global));
    }
    f.instruction(&Instruction::Return)
        .instruction(&Instruction::End);
}

/// Record the fault and stop the core.
fn fault(f: &mut Function, first_global: u32, why: Fault) {
    f.instruction(&Instruction::LocalGet(ADDRESS))
        .instruction(&Instruction::GlobalSet(
            first_global + State::FaultAddress.slot(),
        ))
        .instruction(&Instruction::LocalGet(SPAN))
        .instruction(&Instruction::I32Const(0x00ff_ffff))
        .instruction(&Instruction::I32And);
    is_store(f);
    f.instruction(&Instruction::I32Const(24))
        .instruction(&Instruction::I32Shl)
        .instruction(&Instruction::I32Or)
        .instruction(&Instruction::I32Const((why as i32) << 28))
        .instruction(&Instruction::I32Or)
        .instruction(&Instruction::GlobalSet(
            first_global + State::FaultInfo.slot(),
        ))
        .instruction(&Instruction::Unreachable);
}
