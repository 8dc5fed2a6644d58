//! The device contract: every function device code may import, with its
//! exact WebAssembly signature.
//!
//! Device code is linked with nothing but what the runtime provides (no C
//! library at all), so this table is the whole of what a kernel can call
//! outside its own code: the hthreads device API, the memory functions the
//! compiler may emit calls to, and a scalar math subset. A module importing
//! anything else, or one of these with another signature, is refused at
//! build time with the reason.

use DeviceFn::{Api, Libm, Memory};
use wasmparser::ValType::{self, F32, F64, I32};

/// Module name of every device import.
pub(crate) const IMPORT_MODULE: &str = "env";
/// The one memory device code imports.
pub(crate) const MEMORY_IMPORT: &str = "memory";

/// What an import is, for the runtime's dispatch and the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceFn {
    /// The hthreads device API.
    Api,
    /// `memcpy`, `memmove`, `memset`: charged by each level they touch.
    Memory,
    /// A scalar math library call, charged `LIBM_CALL_CYCLES`.
    Libm,
}

/// Modeled cost of one call of the device's scalar math library (slib3000):
/// an estimate of a polynomial evaluation, not a published figure.
pub(crate) const LIBM_CALL_CYCLES: f64 = 20.0;

/// One importable function.
#[derive(Debug)]
pub(crate) struct Import {
    pub(crate) name: &'static str,
    pub(crate) params: &'static [ValType],
    pub(crate) results: &'static [ValType],
    pub(crate) kind: DeviceFn,
}

const fn import(
    kind: DeviceFn,
    name: &'static str,
    params: &'static [ValType],
    results: &'static [ValType],
) -> Import {
    Import {
        name,
        params,
        results,
        kind,
    }
}

/// Every importable function. Pointers, `int`, `unsigned int` and
/// `unsigned long` are all `i32` on wasm32.
pub(crate) const IMPORTS: &[Import] = &[
    import(Api, "get_thread_id", &[], &[I32]),
    import(Api, "get_group_size", &[], &[I32]),
    import(Api, "get_core_id", &[], &[I32]),
    import(Api, "group_barrier", &[I32], &[]),
    import(Api, "core_barrier", &[I32, I32], &[]),
    import(Api, "hthread_printf", &[I32, I32], &[I32]),
    import(Api, "get_clk", &[], &[I32]),
    import(Api, "scalar_malloc", &[I32], &[I32]),
    import(Api, "scalar_free", &[I32], &[]),
    import(Api, "vector_malloc", &[I32], &[I32]),
    import(Api, "vector_free", &[I32], &[]),
    import(
        Api,
        "dma_p2p",
        &[I32, I32, I32, I32, I32, I32, I32, I32, I32, I32],
        &[I32],
    ),
    import(Api, "dma_wait", &[I32], &[]),
    import(Api, "dma_query", &[I32], &[I32]),
    import(Memory, "memcpy", &[I32, I32, I32], &[I32]),
    import(Memory, "memmove", &[I32, I32, I32], &[I32]),
    import(Memory, "memset", &[I32, I32, I32], &[I32]),
    import(Libm, "exp", &[F64], &[F64]),
    import(Libm, "expf", &[F32], &[F32]),
    import(Libm, "log", &[F64], &[F64]),
    import(Libm, "logf", &[F32], &[F32]),
    import(Libm, "pow", &[F64, F64], &[F64]),
    import(Libm, "powf", &[F32, F32], &[F32]),
    import(Libm, "sin", &[F64], &[F64]),
    import(Libm, "sinf", &[F32], &[F32]),
    import(Libm, "cos", &[F64], &[F64]),
    import(Libm, "cosf", &[F32], &[F32]),
    import(Libm, "tanh", &[F64], &[F64]),
    import(Libm, "tanhf", &[F32], &[F32]),
    import(Libm, "fmin", &[F64, F64], &[F64]),
    import(Libm, "fminf", &[F32, F32], &[F32]),
    import(Libm, "fmax", &[F64, F64], &[F64]),
    import(Libm, "fmaxf", &[F32, F32], &[F32]),
    import(Libm, "fma", &[F64, F64, F64], &[F64]),
    import(Libm, "fmaf", &[F32, F32, F32], &[F32]),
    // Usually single instructions; imported when the compiler keeps the call.
    import(Libm, "sqrt", &[F64], &[F64]),
    import(Libm, "sqrtf", &[F32], &[F32]),
    import(Libm, "fabs", &[F64], &[F64]),
    import(Libm, "fabsf", &[F32], &[F32]),
    import(Libm, "floor", &[F64], &[F64]),
    import(Libm, "floorf", &[F32], &[F32]),
    import(Libm, "ceil", &[F64], &[F64]),
    import(Libm, "ceilf", &[F32], &[F32]),
];

/// The importable function called `name`.
pub(crate) fn lookup(name: &str) -> Option<&'static Import> {
    IMPORTS.iter().find(|i| i.name == name)
}

/// `(i32, i32) -> i32` and the like, for error messages.
pub(crate) fn signature(params: &[ValType], results: &[ValType]) -> String {
    let list = |tys: &[ValType]| {
        tys.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("({}) -> ({})", list(params), list(results))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_api_is_complete() {
        let mut names: Vec<_> = IMPORTS.iter().map(|i| i.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "duplicate import names");
        for name in ["dma_p2p", "group_barrier", "vector_malloc", "memcpy", "exp"] {
            assert!(lookup(name).is_some(), "{name} missing");
        }
        assert!(lookup("fopen").is_none());
        assert_eq!(signature(&[I32, F64], &[I32]), "(i32, f64) -> (i32)");
    }
}
