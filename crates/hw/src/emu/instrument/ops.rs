//! What each WebAssembly instruction of device code costs on the modeled
//! core, and which ones device code may not use.
//!
//! The module was validated against a small feature set (the MVP, SIMD,
//! sign extension, saturating conversions) before it gets here, so only
//! those instructions occur. Scalar instructions take one scalar issue
//! slot; moves between locals, constants and block markers are free (they
//! are register names, immediates and labels on a real core). SIMD
//! instructions are the host's rendering of the 1024-bit vector unit: a
//! 128-bit WebAssembly vector is one *unit*, an MT-3000 vector issue is
//! `vector_lanes / 2` units (8 for 16 FP64 lanes).

use wasmparser::{MemArg, Operator, ValType};

/// The vector class an instruction issues in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vector {
    /// A floating-point multiply: pairs with an add into one FMA issue.
    Mul,
    /// A floating-point add or subtract: pairs with a multiply.
    Add,
    /// Division or square root: not pipelined, `SLOW_VECTOR_UNITS` units.
    Slow,
    /// Any other arithmetic, logic, compare or conversion on the FMA units.
    Other,
    /// A broadcast of a scalar into every lane: one whole vector issue.
    Splat,
    /// Lane moves (extract, replace, shuffle): the broadcast/shuffle unit.
    Permute,
}

/// Units a vector division or square root costs (a pipelined operation
/// costs one): an estimate, the MT-3000 has no published figure.
pub(super) const SLOW_VECTOR_UNITS: u64 = 8;

/// A memory access: its size in bytes and, for stores (and lane loads,
/// which take a vector operand above the address), the type of the value
/// above the address on the operand stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Access {
    pub(super) memarg: MemArg,
    pub(super) bytes: u32,
    pub(super) store: bool,
    /// The operand above the address, to be set aside while the address is
    /// checked.
    pub(super) above: Option<ValType>,
    /// `v128.loadN_splat`: a scalar load and a broadcast.
    pub(super) splat: bool,
}

/// How the cost model sees one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Costs nothing: locals, constants, block markers, `nop`, `drop`.
    Free,
    /// One scalar issue slot; `flops` floating-point operations.
    Scalar { flops: u8 },
    /// One scalar issue slot, and control may leave the straight line here.
    Branch,
    /// A call: one scalar issue, and the callee runs before what follows.
    Call,
    /// A load or store, checked and charged by the memory it touches.
    Memory(Access),
    /// Vector work in units, with its floating-point operations.
    Vector { class: Vector, flops: u8 },
    /// Not part of the device ISA (the reason).
    Refused(&'static str),
}

macro_rules! define_name {
    ($( @$proposal:ident $op:ident $({ $($arg:ident: $argty:ty),* })? => $visit:ident ($($ann:tt)*))*) => {
        /// The instruction's name as `wasmparser` spells it.
        pub(super) fn name(op: &Operator<'_>) -> &'static str {
            match op {
                $( Operator::$op { .. } => stringify!($op), )*
                _ => "unknown",
            }
        }
    };
}
wasmparser::for_each_operator!(define_name);

fn access(memarg: MemArg, bytes: u32, store: bool, above: Option<ValType>) -> Class {
    Class::Memory(Access {
        memarg,
        bytes,
        store,
        above,
        splat: false,
    })
}

/// The class of `op`.
pub(super) fn classify(op: &Operator<'_>) -> Class {
    use Operator as O;
    match op {
        O::Nop
        | O::Drop
        | O::Block { .. }
        | O::Loop { .. }
        | O::End
        | O::Else
        | O::LocalGet { .. }
        | O::LocalSet { .. }
        | O::LocalTee { .. }
        | O::GlobalGet { .. }
        | O::GlobalSet { .. }
        | O::I32Const { .. }
        | O::I64Const { .. }
        | O::F32Const { .. }
        | O::F64Const { .. }
        | O::V128Const { .. } => Class::Free,
        O::If { .. }
        | O::Br { .. }
        | O::BrIf { .. }
        | O::BrTable { .. }
        | O::Return
        | O::Unreachable => Class::Branch,
        O::Call { .. } | O::CallIndirect { .. } => Class::Call,
        O::MemoryGrow { .. } | O::MemorySize { .. } => {
            Class::Refused("device memory has a fixed size")
        }
        O::I32Load { memarg } | O::F32Load { memarg } => access(*memarg, 4, false, None),
        O::I64Load { memarg } | O::F64Load { memarg } => access(*memarg, 8, false, None),
        O::I32Load8S { memarg }
        | O::I32Load8U { memarg }
        | O::I64Load8S { memarg }
        | O::I64Load8U { memarg } => access(*memarg, 1, false, None),
        O::I32Load16S { memarg }
        | O::I32Load16U { memarg }
        | O::I64Load16S { memarg }
        | O::I64Load16U { memarg } => access(*memarg, 2, false, None),
        O::I64Load32S { memarg } | O::I64Load32U { memarg } => access(*memarg, 4, false, None),
        O::I32Store { memarg } => access(*memarg, 4, true, Some(ValType::I32)),
        O::I64Store { memarg } => access(*memarg, 8, true, Some(ValType::I64)),
        O::F32Store { memarg } => access(*memarg, 4, true, Some(ValType::F32)),
        O::F64Store { memarg } => access(*memarg, 8, true, Some(ValType::F64)),
        O::I32Store8 { memarg } => access(*memarg, 1, true, Some(ValType::I32)),
        O::I32Store16 { memarg } => access(*memarg, 2, true, Some(ValType::I32)),
        O::I64Store8 { memarg } => access(*memarg, 1, true, Some(ValType::I64)),
        O::I64Store16 { memarg } => access(*memarg, 2, true, Some(ValType::I64)),
        O::I64Store32 { memarg } => access(*memarg, 4, true, Some(ValType::I64)),
        O::V128Load { memarg } => access(*memarg, 16, false, None),
        O::V128Load8x8S { memarg }
        | O::V128Load8x8U { memarg }
        | O::V128Load16x4S { memarg }
        | O::V128Load16x4U { memarg }
        | O::V128Load32x2S { memarg }
        | O::V128Load32x2U { memarg }
        | O::V128Load64Zero { memarg } => access(*memarg, 8, false, None),
        O::V128Load32Zero { memarg } => access(*memarg, 4, false, None),
        O::V128Load8Splat { memarg } => splat(*memarg, 1),
        O::V128Load16Splat { memarg } => splat(*memarg, 2),
        O::V128Load32Splat { memarg } => splat(*memarg, 4),
        O::V128Load64Splat { memarg } => splat(*memarg, 8),
        O::V128Store { memarg } => access(*memarg, 16, true, Some(ValType::V128)),
        O::V128Load8Lane { memarg, .. } => access(*memarg, 1, false, Some(ValType::V128)),
        O::V128Load16Lane { memarg, .. } => access(*memarg, 2, false, Some(ValType::V128)),
        O::V128Load32Lane { memarg, .. } => access(*memarg, 4, false, Some(ValType::V128)),
        O::V128Load64Lane { memarg, .. } => access(*memarg, 8, false, Some(ValType::V128)),
        O::V128Store8Lane { memarg, .. } => access(*memarg, 1, true, Some(ValType::V128)),
        O::V128Store16Lane { memarg, .. } => access(*memarg, 2, true, Some(ValType::V128)),
        O::V128Store32Lane { memarg, .. } => access(*memarg, 4, true, Some(ValType::V128)),
        O::V128Store64Lane { memarg, .. } => access(*memarg, 8, true, Some(ValType::V128)),
        other => by_name(name(other)),
    }
}

fn splat(memarg: MemArg, bytes: u32) -> Class {
    Class::Memory(Access {
        memarg,
        bytes,
        store: false,
        above: None,
        splat: true,
    })
}

/// Classes of the remaining scalar and SIMD instructions, by name.
fn by_name(name: &'static str) -> Class {
    let simd = ["I8x16", "I16x8", "I32x4", "I64x2", "F32x4", "F64x2", "V128"]
        .iter()
        .any(|p| name.starts_with(p));
    if !simd {
        // Scalar arithmetic, compares, conversions, select.
        let fp = name.starts_with("F32") || name.starts_with("F64");
        let flop = fp
            && ["Add", "Sub", "Mul", "Div", "Sqrt"]
                .iter()
                .any(|o| name.ends_with(o));
        return Class::Scalar {
            flops: u8::from(flop),
        };
    }
    let lanes_flops = if name.starts_with("F64x2") {
        2
    } else if name.starts_with("F32x4") {
        4
    } else {
        0
    };
    let vector = |class, flops| Class::Vector { class, flops };
    if name.ends_with("Splat") {
        vector(Vector::Splat, 0)
    } else if name.contains("Lane") || name.ends_with("Shuffle") || name.ends_with("Swizzle") {
        vector(Vector::Permute, 0)
    } else if lanes_flops > 0 && name.ends_with("Mul") {
        vector(Vector::Mul, lanes_flops)
    } else if lanes_flops > 0 && (name.ends_with("Add") || name.ends_with("Sub")) {
        vector(Vector::Add, lanes_flops)
    } else if lanes_flops > 0 && (name.ends_with("Div") || name.ends_with("Sqrt")) {
        vector(Vector::Slow, lanes_flops)
    } else {
        vector(Vector::Other, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_arithmetic_is_classed_by_unit_and_counts_lane_flops() {
        assert_eq!(
            classify(&Operator::F64x2Mul),
            Class::Vector {
                class: Vector::Mul,
                flops: 2
            }
        );
        assert_eq!(
            classify(&Operator::F32x4Sub),
            Class::Vector {
                class: Vector::Add,
                flops: 4
            }
        );
        assert_eq!(
            classify(&Operator::F64x2Splat),
            Class::Vector {
                class: Vector::Splat,
                flops: 0
            }
        );
        assert_eq!(
            classify(&Operator::F64x2ExtractLane { lane: 1 }),
            Class::Vector {
                class: Vector::Permute,
                flops: 0
            }
        );
        assert_eq!(
            classify(&Operator::I32x4Add),
            Class::Vector {
                class: Vector::Other,
                flops: 0
            }
        );
        assert_eq!(
            classify(&Operator::F64x2Sqrt),
            Class::Vector {
                class: Vector::Slow,
                flops: 2
            }
        );
    }

    #[test]
    fn scalar_instructions_cost_a_slot_and_moves_are_free() {
        assert_eq!(classify(&Operator::F64Mul), Class::Scalar { flops: 1 });
        assert_eq!(classify(&Operator::I32Add), Class::Scalar { flops: 0 });
        assert_eq!(classify(&Operator::F64Neg), Class::Scalar { flops: 0 });
        assert_eq!(
            classify(&Operator::LocalGet { local_index: 0 }),
            Class::Free
        );
        assert!(matches!(
            classify(&Operator::MemoryGrow { mem: 0 }),
            Class::Refused(_)
        ));
        assert_eq!(
            name(&Operator::I64Store32 { memarg: memarg() }),
            "I64Store32"
        );
    }

    #[test]
    fn stores_and_lane_loads_set_their_top_operand_aside() {
        let Class::Memory(a) = classify(&Operator::F64Store { memarg: memarg() }) else {
            panic!("store is memory");
        };
        assert!(a.store && a.bytes == 8 && a.above == Some(ValType::F64));
        let Class::Memory(a) = classify(&Operator::V128Load64Lane {
            memarg: memarg(),
            lane: 0,
        }) else {
            panic!("lane load is memory");
        };
        assert!(!a.store && a.above == Some(ValType::V128));
        let Class::Memory(a) = classify(&Operator::V128Load64Splat { memarg: memarg() }) else {
            panic!("splat load is memory");
        };
        assert!(a.splat && a.bytes == 8);
    }

    fn memarg() -> MemArg {
        MemArg {
            align: 3,
            max_align: 3,
            offset: 0,
            memory: 0,
        }
    }
}
