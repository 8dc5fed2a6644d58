//! The instrumentation of one function body: a charge at the start of every
//! straight-line sequence, a check before every memory access.
//!
//! A *sequence* runs from a point control can reach (function entry, loop
//! header, either arm of an `if`, after a block's `end`, after a
//! conditional branch, after a call) to the next such point; it is charged
//! once on entry with what its instructions cost ([`super::ops`]). Splitting
//! after calls keeps each core's clock right at its synchronisation points:
//! what a sequence does after a barrier is charged after the barrier.
//!
//! Every load and store is covered by a check of its address range
//! ([`super::checks`]) that runs before it.

use wasm_encoder::reencode::{Reencode, RoundtripReencoder};
use wasm_encoder::{Function, ValType};
use wasmparser::{FunctionBody, Operator};

use super::checks::{self, SCRATCH_VALUES, Scratch};
use super::context::{Context, add_to, bad_module, reencode_error};
use super::globals::Counter;
use super::ops::{Class, SLOW_VECTOR_UNITS, Vector, classify, name};
use crate::error::HwError;

/// What one straight-line sequence costs.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Cost {
    scalar: u32,
    flops: u64,
    mul: u64,
    add: u64,
    other: u64,
    broadcast: u64,
}

impl Cost {
    fn add_class(&mut self, class: Class, units_per_issue: u64) {
        match class {
            Class::Free | Class::Refused(_) => {}
            Class::Scalar { flops } => {
                self.scalar += 1;
                self.flops += u64::from(flops);
            }
            Class::Branch | Class::Call => self.scalar += 1,
            Class::Memory(access) => {
                // Bulk (vector) accesses are charged by the level they hit;
                // narrower ones take a scalar slot like any instruction.
                if access.bytes < 16 {
                    self.scalar += 1;
                }
                if access.splat {
                    self.broadcast += units_per_issue;
                }
            }
            Class::Vector { class, flops } => {
                self.flops += u64::from(flops);
                match class {
                    Vector::Mul => self.mul += 1,
                    Vector::Add => self.add += 1,
                    Vector::Slow => self.other += SLOW_VECTOR_UNITS,
                    Vector::Other => self.other += 1,
                    Vector::Splat => self.broadcast += units_per_issue,
                    Vector::Permute => self.broadcast += 1,
                }
            }
        }
    }

    /// The counter increments this cost makes.
    pub(super) fn charges(&self, cx: &Context) -> Vec<(Counter, i64)> {
        let mut out = Vec::new();
        if self.scalar > 0 {
            let cycles =
                (f64::from(self.scalar) / f64::from(cx.scalar_slots)).max(cx.min_sequence_cycles);
            out.push((Counter::ScalarMillicycles, (cycles * 1000.0).round() as i64));
        }
        // A multiply and an add of the same sequence issue as one FMA.
        let fma = self.mul.max(self.add) + self.other;
        for (counter, value) in [
            (Counter::Flops, self.flops),
            (Counter::FmaUnits, fma),
            (Counter::BroadcastUnits, self.broadcast),
        ] {
            if value > 0 {
                out.push((counter, value as i64));
            }
        }
        out
    }
}

/// Whether the instruction at `i` is an address addition that a load or
/// store folds into its addressing mode on a real core (base plus offset
/// or index): an `i32.add` whose result is the address of the next
/// access, directly, through a `local.tee`, or below a stored local.
fn is_addressing(ops: &[Operator<'_>], i: usize) -> bool {
    if !matches!(ops[i], Operator::I32Add) {
        return false;
    }
    let is_access = |k: usize| {
        ops.get(k)
            .is_some_and(|op| matches!(classify(op), Class::Memory(_)))
    };
    let is_store_of_local = |k: usize| {
        matches!(ops.get(k), Some(Operator::LocalGet { .. }))
            && ops
                .get(k + 1)
                .is_some_and(|op| matches!(classify(op), Class::Memory(a) if a.above.is_some()))
    };
    is_access(i + 1)
        || is_store_of_local(i + 1)
        || (matches!(ops.get(i + 1), Some(Operator::LocalTee { .. }))
            && (is_access(i + 2) || is_store_of_local(i + 2)))
}

/// Whether a new sequence starts after `op`.
fn ends_sequence(op: &Operator<'_>) -> bool {
    matches!(
        op,
        Operator::Loop { .. }
            | Operator::If { .. }
            | Operator::Else
            | Operator::End
            | Operator::Br { .. }
            | Operator::BrIf { .. }
            | Operator::BrTable { .. }
            | Operator::Return
            | Operator::Unreachable
            | Operator::Call { .. }
            | Operator::CallIndirect { .. }
    )
}

/// Refuse a function whose stack frame (what it subtracts from the stack
/// pointer) cannot fit a core's stack, which lives in SM.
fn check_frame(ops: &[Operator<'_>], cx: &Context, function: &str) -> Result<(), HwError> {
    for w in ops.windows(3) {
        if let [
            Operator::GlobalGet { global_index },
            Operator::I32Const { value },
            Operator::I32Sub,
        ] = w
            && *global_index == cx.stack_pointer
            && (*value as u32) > cx.stack_bytes
        {
            return Err(HwError::Capacity(format!(
                "kernel.c: {function} needs a {}-byte stack frame; the stack lives in SM ({} \
                 bytes per core, SM capacity exceeded)",
                *value as u32, cx.stack_bytes
            )));
        }
    }
    Ok(())
}

/// Instrument one body of a function (`function` names it in errors) with
/// `params` parameters.
pub(super) fn instrument(
    body: &FunctionBody<'_>,
    params: u32,
    cx: &Context,
    function: &str,
) -> Result<Function, HwError> {
    let mut re = RoundtripReencoder;
    let mut locals = Vec::new();
    let mut declared = 0u32;
    for local in body.get_locals_reader().map_err(bad_module)? {
        let (count, ty) = local.map_err(bad_module)?;
        declared = declared.saturating_add(count);
        locals.push((count, re.val_type(ty).map_err(reencode_error)?));
    }
    let first = params + declared;
    let scratch = Scratch {
        address: first,
        effective: first + 1,
        first_value: first + 2,
    };
    locals.push((2, ValType::I32));
    locals.extend(SCRATCH_VALUES.iter().map(|ty| (1, *ty)));

    let mut ops = Vec::new();
    let mut reader = body.get_operators_reader().map_err(bad_module)?;
    while !reader.eof() {
        ops.push(reader.read().map_err(bad_module)?);
    }

    check_frame(&ops, cx, function)?;

    // Sequence starts and their costs.
    let mut starts: Vec<Option<Cost>> = vec![None; ops.len()];
    let mut start = 0usize;
    let mut cost = Cost::default();
    for (i, op) in ops.iter().enumerate() {
        let class = classify(op);
        if let Class::Refused(why) = class {
            return Err(HwError::compile(format!(
                "kernel.c: {function} uses `{}`, which device code may not ({why})",
                name(op)
            )));
        }
        if !is_addressing(&ops, i) {
            cost.add_class(class, cx.units_per_issue);
        }
        if ends_sequence(op) {
            starts[start] = Some(std::mem::take(&mut cost));
            start = i + 1;
        }
    }
    if start < ops.len() {
        starts[start] = Some(cost);
    }

    let starting: Vec<bool> = starts.iter().map(Option::is_some).collect();
    let plan = checks::plan(&ops, &starting);
    let mut f = Function::new(locals);
    for (i, (op, start)) in ops.into_iter().zip(starts).enumerate() {
        if let Some(cost) = start {
            for (counter, value) in cost.charges(cx) {
                add_to(&mut f, cx.first_global + counter.slot(), value);
            }
        }
        for check in &plan.before[i] {
            checks::emit(&mut f, check, scratch, cx);
        }
        let ins = re.instruction(op).map_err(reencode_error)?;
        f.instruction(&ins);
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context {
        Context {
            first_global: 1,
            slow_fn: 9,
            window_len: 1 << 20,
            am_offset: 1 << 17,
            units_per_issue: 8,
            scalar_slots: 5,
            min_sequence_cycles: 1.0,
            stack_pointer: 0,
            stack_bytes: 65536,
        }
    }

    #[test]
    fn a_fused_multiply_add_of_sixteen_lanes_is_one_issue_and_32_flops() {
        let mut cost = Cost::default();
        for _ in 0..8 {
            cost.add_class(classify(&Operator::F64x2Mul), 8);
            cost.add_class(classify(&Operator::F64x2Add), 8);
        }
        let charges = cost.charges(&cx());
        assert!(charges.contains(&(Counter::FmaUnits, 8)), "{charges:?}");
        assert!(charges.contains(&(Counter::Flops, 32)), "{charges:?}");
        assert!(
            !charges
                .iter()
                .any(|(c, _)| *c == Counter::ScalarMillicycles)
        );
    }

    #[test]
    fn scalar_sequences_cost_at_least_the_minimum_and_a_slot_each_beyond() {
        let mut short = Cost::default();
        short.add_class(classify(&Operator::I32Add), 8);
        assert_eq!(
            short.charges(&cx()),
            vec![(Counter::ScalarMillicycles, 1000)]
        );
        let mut long = Cost::default();
        for _ in 0..12 {
            long.add_class(classify(&Operator::I32Add), 8);
        }
        assert_eq!(
            long.charges(&cx()),
            vec![(Counter::ScalarMillicycles, 2400)]
        );
        assert!(Cost::default().charges(&cx()).is_empty());
    }
}
