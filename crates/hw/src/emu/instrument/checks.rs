//! The checks on memory accesses: where each goes, what it covers, and the
//! code that makes it.
//!
//! Compiled C addresses memory mostly as `base + constant`: a vector load
//! is eight 16-byte loads at offsets 0..112 from one pointer, the next
//! vectors of a tile the same pointer at other offsets, often through
//! locals that hold `base + c`. Within one straight-line sequence (nothing
//! jumps in or out between its instructions) the accesses whose address is
//! one base (a local, or the sum of two) plus a constant, with nothing
//! writing the base's locals in between, form a *group*, checked once for
//! the whole range they cover, right before the first of them runs.
//! Accesses whose address is computed otherwise are checked one by one,
//! right before they run. Either way no access runs unchecked: a group's
//! check reads the locals its members' addresses derive from, at values
//! nothing changes before the last member, and covers the hull of their
//! ranges.
//!
//! A check tests the range against the core's window (stack, SM, AM)
//! inline and charges bulk (16-byte) accesses there; a range outside goes
//! to the slow path ([`super::slow`]), which charges GSM and DDR accesses,
//! one request each, or stops the core.

use wasm_encoder::{BlockType, Function, Instruction, ValType};
use wasmparser::Operator;

use super::context::{Context, add_to};
use super::globals::{Counter, State};
use super::ops::{Access, Class, classify};

/// Largest range one group check covers; beyond it accesses start a new
/// group.
const MAX_GROUP_SPAN: i64 = 1 << 20;

/// An address held in locals: `a` or `a + b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Base {
    pub(super) a: u32,
    pub(super) b: Option<u32>,
}

impl Base {
    fn uses(&self, local: u32) -> bool {
        self.a == local || self.b == Some(local)
    }
}

/// What a check covers and where its address comes from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Check {
    /// `Some(base)`: the range starts at the base plus `lo`. `None`: the
    /// address is the access's own operand (the range starts there plus
    /// `lo`, the access's offset).
    pub(super) base: Option<Base>,
    pub(super) lo: i64,
    pub(super) hi: i64,
    /// Accesses covered (direct requests if the range is not on-core).
    pub(super) requests: u32,
    /// Their bytes, each rounded up to 8 (what a direct access moves).
    pub(super) bytes: u32,
    /// Their bytes of 16-byte (vector) accesses.
    pub(super) bulk: u32,
    pub(super) store: bool,
    /// For an operand check: the type of the value above the address.
    pub(super) above: Option<wasmparser::ValType>,
}

impl Check {
    fn span(&self) -> u32 {
        (self.hi - self.lo) as u32
    }
}

/// Where the checks of one function go.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Checks to emit right before instruction `i` (they leave the operand
    /// stack as they find it).
    pub(super) before: Vec<Vec<Check>>,
}

/// What straight-line code knows of its locals: which hold a base plus a
/// constant (set from `local.get x [i32.const c i32.add]`,
/// `local.get a local.get b i32.add` or a copy).
#[derive(Debug, Default)]
struct Locals {
    derived: Vec<(u32, Base, i64)>,
}

impl Locals {
    /// The base and constant `local` holds (itself plus 0 when unknown).
    fn resolve(&self, local: u32) -> (Base, i64) {
        self.derived
            .iter()
            .find(|(l, _, _)| *l == local)
            .map(|(_, base, c)| (*base, *c))
            .unwrap_or((Base { a: local, b: None }, 0))
    }

    /// `local` was written: forget what depended on it.
    fn written(&mut self, local: u32) {
        self.derived
            .retain(|(l, base, _)| *l != local && !base.uses(local));
    }
}

/// The value the instructions ending right before `end` push, when it is
/// a base plus a constant.
fn value_before(
    ops: &[Operator<'_>],
    end: usize,
    from: usize,
    locals: &Locals,
) -> Option<(Base, i64)> {
    let at = |k: usize| end.checked_sub(k).filter(|i| *i >= from).map(|i| &ops[i]);
    match (at(3), at(2), at(1)) {
        (
            Some(Operator::LocalGet { local_index }),
            Some(Operator::I32Const { value }),
            Some(Operator::I32Add),
        ) => {
            let (base, c) = locals.resolve(*local_index);
            Some((base, c + i64::from(*value)))
        }
        (
            Some(Operator::LocalGet { local_index: a }),
            Some(Operator::LocalGet { local_index: b }),
            Some(Operator::I32Add),
        ) => {
            let (ba, ca) = locals.resolve(*a);
            let (bb, cb) = locals.resolve(*b);
            match (ba.b, bb.b) {
                (None, None) => Some((
                    Base {
                        a: ba.a,
                        b: Some(bb.a),
                    },
                    ca + cb,
                )),
                _ => None,
            }
        }
        (_, _, Some(Operator::LocalGet { local_index } | Operator::LocalTee { local_index })) => {
            Some(locals.resolve(*local_index))
        }
        _ => None,
    }
}

/// The base and constant of an access's address, if known.
fn address_of(
    ops: &[Operator<'_>],
    at: usize,
    access: &Access,
    from: usize,
    locals: &Locals,
) -> Option<(Base, i64)> {
    // The address comes right before the access, or before a value that
    // is one `local.get`.
    let end = match access.above {
        None => at,
        Some(_) => match at.checked_sub(1).filter(|i| *i >= from).map(|i| &ops[i]) {
            Some(Operator::LocalGet { .. }) => at - 1,
            _ => return None,
        },
    };
    let (base, c) = value_before(ops, end, from, locals)?;
    let offset = i64::try_from(access.memarg.offset).ok()?;
    Some((base, c + offset))
}

/// Plan the checks of `ops`, whose sequences start at the indices where
/// `starts` is true.
pub(super) fn plan(ops: &[Operator<'_>], starts: &[bool]) -> Plan {
    let mut plan = Plan {
        before: vec![Vec::new(); ops.len() + 1],
    };
    // Open groups of the current sequence: (base, store) -> where its
    // check is (`plan.before[at][slot]`).
    let mut open: Vec<((Base, bool), usize, usize)> = Vec::new();
    let mut locals = Locals::default();
    let mut sequence_start = 0;
    for (i, op) in ops.iter().enumerate() {
        if starts[i] {
            open.clear();
            locals = Locals::default();
            sequence_start = i;
        }
        if let Operator::LocalSet { local_index } | Operator::LocalTee { local_index } = op {
            let value = value_before(ops, i, sequence_start, &locals);
            locals.written(*local_index);
            open.retain(|((base, _), _, _)| !base.uses(*local_index));
            if let Some((base, c)) = value.filter(|(base, _)| !base.uses(*local_index)) {
                locals.derived.push((*local_index, base, c));
            }
            continue;
        }
        let Class::Memory(access) = classify(op) else {
            continue;
        };
        let bytes = access.bytes;
        let rounded = bytes.div_ceil(8) * 8;
        let bulk = if bytes >= 16 { bytes } else { 0 };
        if let Some((base, offset)) = address_of(ops, i, &access, sequence_start, &locals) {
            let key = (base, access.store);
            if let Some((_, at, slot)) = open.iter().find(|(k, _, _)| *k == key).copied() {
                let check = &mut plan.before[at][slot];
                let lo = check.lo.min(offset);
                let hi = check.hi.max(offset + i64::from(bytes));
                if hi - lo <= MAX_GROUP_SPAN {
                    check.lo = lo;
                    check.hi = hi;
                    check.requests += 1;
                    check.bytes += rounded;
                    check.bulk += bulk;
                    continue;
                }
                open.retain(|(k, _, _)| *k != key);
            }
            if i32::try_from(offset).is_ok() {
                let slot = plan.before[i].len();
                plan.before[i].push(Check {
                    base: Some(base),
                    lo: offset,
                    hi: offset + i64::from(bytes),
                    requests: 1,
                    bytes: rounded,
                    bulk,
                    store: access.store,
                    above: None,
                });
                open.push((key, i, slot));
                continue;
            }
        }
        let lo = i64::try_from(access.memarg.offset).unwrap_or(i64::MAX);
        plan.before[i].push(Check {
            base: None,
            lo,
            hi: lo.saturating_add(i64::from(bytes)),
            requests: 1,
            bytes: rounded,
            bulk,
            store: access.store,
            above: access.above,
        });
    }
    plan
}

/// Scratch locals every instrumented function gets.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scratch {
    pub(super) address: u32,
    pub(super) effective: u32,
    pub(super) first_value: u32,
}

/// The types of the value scratch locals, in order.
pub(super) const SCRATCH_VALUES: [ValType; 5] = [
    ValType::I32,
    ValType::I64,
    ValType::F32,
    ValType::F64,
    ValType::V128,
];

fn value_local(scratch: Scratch, ty: wasmparser::ValType) -> u32 {
    let k = match ty {
        wasmparser::ValType::I32 => 0,
        wasmparser::ValType::I64 => 1,
        wasmparser::ValType::F32 => 2,
        wasmparser::ValType::F64 => 3,
        _ => 4,
    };
    scratch.first_value + k
}

/// The word the slow path gets with the bytes: bit 31 says store.
fn bytes_and_store(check: &Check) -> i32 {
    (check.bytes & 0x7fff_ffff | (u32::from(check.store) << 31)) as i32
}

/// Emit `check`; leaves the operand stack as it found it.
pub(super) fn emit(f: &mut Function, check: &Check, scratch: Scratch, cx: &Context) {
    let window_lo = cx.first_global + State::WindowLo.slot();
    match check.base {
        Some(base) => {
            f.instruction(&Instruction::LocalGet(base.a));
            if let Some(b) = base.b {
                f.instruction(&Instruction::LocalGet(b))
                    .instruction(&Instruction::I32Add);
            }
        }
        None => {
            if let Some(ty) = check.above {
                f.instruction(&Instruction::LocalSet(value_local(scratch, ty)));
            }
            f.instruction(&Instruction::LocalTee(scratch.address));
        }
    }
    if check.lo != 0 {
        f.instruction(&Instruction::I32Const(check.lo as i32))
            .instruction(&Instruction::I32Add);
    }
    let span = check.span();
    // Outside the window: (ea - lo) > len - span, unsigned.
    f.instruction(&Instruction::LocalTee(scratch.effective))
        .instruction(&Instruction::GlobalGet(window_lo))
        .instruction(&Instruction::I32Sub)
        .instruction(&Instruction::I32Const(
            cx.window_len.saturating_sub(span) as i32
        ))
        .instruction(&Instruction::I32GtU)
        .instruction(&Instruction::If(BlockType::Empty))
        .instruction(&Instruction::LocalGet(scratch.effective))
        .instruction(&Instruction::I32Const(span as i32))
        .instruction(&Instruction::I32Const(check.requests as i32))
        .instruction(&Instruction::I32Const(bytes_and_store(check)))
        .instruction(&Instruction::Call(cx.slow_fn));
    if check.bulk > 0 {
        // Vector accesses inside the window: AM takes the vector
        // load/store units, the stack and SM a word per slot.
        f.instruction(&Instruction::Else)
            .instruction(&Instruction::LocalGet(scratch.effective))
            .instruction(&Instruction::GlobalGet(window_lo))
            .instruction(&Instruction::I32Sub)
            .instruction(&Instruction::I32Const(cx.am_offset as i32))
            .instruction(&Instruction::I32LtU)
            .instruction(&Instruction::If(BlockType::Empty));
        add_to(
            f,
            cx.first_global + Counter::SmBulkBytes.slot(),
            i64::from(check.bulk),
        );
        f.instruction(&Instruction::Else);
        add_to(
            f,
            cx.first_global + Counter::AmBulkBytes.slot(),
            i64::from(check.bulk),
        );
        f.instruction(&Instruction::End);
    }
    f.instruction(&Instruction::End);
    if check.base.is_none() {
        f.instruction(&Instruction::LocalGet(scratch.address));
        if let Some(ty) = check.above {
            f.instruction(&Instruction::LocalGet(value_local(scratch, ty)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmparser::MemArg;

    fn memarg(offset: u64) -> MemArg {
        MemArg {
            align: 0,
            max_align: 4,
            offset,
            memory: 0,
        }
    }

    fn starts_at(n: usize, at: &[usize]) -> Vec<bool> {
        (0..n).map(|i| at.contains(&i)).collect()
    }

    fn local(a: u32) -> Option<Base> {
        Some(Base { a, b: None })
    }

    #[test]
    fn loads_off_one_base_in_a_sequence_are_one_check_of_their_hull() {
        let ops = vec![
            Operator::LocalGet { local_index: 3 },
            Operator::V128Load { memarg: memarg(0) },
            Operator::LocalGet { local_index: 3 },
            Operator::I32Const { value: 96 },
            Operator::I32Add,
            Operator::V128Load { memarg: memarg(0) },
            Operator::LocalGet { local_index: 3 },
            Operator::V128Load { memarg: memarg(16) },
        ];
        let plan = plan(&ops, &starts_at(ops.len(), &[0]));
        assert_eq!(plan.before[1].len(), 1, "{plan:?}");
        let check = &plan.before[1][0];
        assert_eq!((check.base, check.lo, check.hi), (local(3), 0, 112));
        assert_eq!((check.requests, check.bulk), (3, 48));
        let checks: usize = plan.before.iter().map(Vec::len).sum();
        assert_eq!(checks, 1);
    }

    #[test]
    fn locals_derived_from_a_base_join_its_group() {
        // y = x - 128 (tee), loads through y; then z = x - 256.
        let ops = vec![
            Operator::LocalGet { local_index: 9 },
            Operator::I32Const { value: -128 },
            Operator::I32Add,
            Operator::LocalTee { local_index: 1 },
            Operator::V128Load { memarg: memarg(32) },
            Operator::Drop,
            Operator::LocalGet { local_index: 1 },
            Operator::V128Load { memarg: memarg(0) },
            Operator::Drop,
            Operator::LocalGet { local_index: 9 },
            Operator::I32Const { value: -256 },
            Operator::I32Add,
            Operator::LocalTee { local_index: 2 },
            Operator::V128Load { memarg: memarg(0) },
        ];
        let plan = plan(&ops, &starts_at(ops.len(), &[0]));
        let checks: Vec<&Check> = plan.before.iter().flatten().collect();
        assert_eq!(checks.len(), 1, "{plan:?}");
        assert_eq!(
            (checks[0].base, checks[0].lo, checks[0].hi),
            (local(9), -256, -80)
        );
        assert_eq!(checks[0].requests, 3);
    }

    #[test]
    fn a_write_to_the_base_or_a_new_sequence_starts_a_new_group() {
        let ops = vec![
            Operator::LocalGet { local_index: 3 },
            Operator::F64Load { memarg: memarg(0) },
            Operator::Drop,
            Operator::I32Const { value: 8 },
            Operator::LocalSet { local_index: 3 },
            Operator::LocalGet { local_index: 3 },
            Operator::F64Load { memarg: memarg(0) },
            Operator::Drop,
            Operator::LocalGet { local_index: 3 },
            Operator::F64Load { memarg: memarg(8) },
        ];
        let plan = plan(&ops, &starts_at(ops.len(), &[0, 8]));
        let at: Vec<usize> = (0..ops.len())
            .filter(|i| !plan.before[*i].is_empty())
            .collect();
        assert_eq!(at, vec![1, 6, 9]);
    }

    #[test]
    fn stores_are_grouped_apart_from_loads_and_other_addresses_checked_alone() {
        let ops = vec![
            Operator::LocalGet { local_index: 1 },
            Operator::LocalGet { local_index: 2 },
            Operator::V128Store { memarg: memarg(0) },
            Operator::LocalGet { local_index: 1 },
            Operator::V128Load { memarg: memarg(0) },
            Operator::LocalGet { local_index: 1 },
            Operator::LocalGet { local_index: 4 },
            Operator::I32Mul,
            Operator::F64Load { memarg: memarg(0) },
        ];
        let plan = plan(&ops, &starts_at(ops.len(), &[0]));
        assert!(plan.before[2][0].store && plan.before[2][0].base == local(1));
        assert!(!plan.before[4][0].store && plan.before[4][0].base == local(1));
        let alone = &plan.before[8][0];
        assert_eq!((alone.base, alone.hi), (None, 8));
    }
}
