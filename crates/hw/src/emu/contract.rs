//! The device contract: every function device code may import, with its
//! exact WebAssembly signature.
//!
//! Device code is linked with nothing but what the runtime provides (no C
//! library at all), so this table is the whole of what a kernel can call
//! outside its own code: the hthreads device API, the memory functions the
//! compiler may emit calls to, and a scalar math subset. A module importing
//! anything else, or one of these with another signature, is refused at
//! build time with the reason.

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

const fn api(
    name: &'static str,
    params: &'static [ValType],
    results: &'static [ValType],
) -> Import {
    Import {
        name,
        params,
        results,
        kind: DeviceFn::Api,
    }
}

const fn libm(
    name: &'static str,
    params: &'static [ValType],
    results: &'static [ValType],
) -> Import {
    Import {
        name,
        params,
        results,
        kind: DeviceFn::Libm,
    }
}

/// Every importable function. Pointers, `int`, `unsigned int` and
/// `unsigned long` are all `i32` on wasm32.
pub(crate) const IMPORTS: &[Import] = &[
    api("get_thread_id", &[], &[I32]),
    api("get_group_size", &[], &[I32]),
    api("get_core_id", &[], &[I32]),
    api("group_barrier", &[I32], &[]),
    api("core_barrier", &[I32, I32], &[]),
    api("hthread_printf", &[I32, I32], &[I32]),
    api("get_clk", &[], &[I32]),
    api("scalar_malloc", &[I32], &[I32]),
    api("scalar_free", &[I32], &[]),
    api("vector_malloc", &[I32], &[I32]),
    api("vector_free", &[I32], &[]),
    api(
        "dma_p2p",
        &[I32, I32, I32, I32, I32, I32, I32, I32, I32, I32],
        &[I32],
    ),
    api("dma_wait", &[I32], &[]),
    api("dma_query", &[I32], &[I32]),
    Import {
        name: "memcpy",
        params: &[I32, I32, I32],
        results: &[I32],
        kind: DeviceFn::Memory,
    },
    Import {
        name: "memmove",
        params: &[I32, I32, I32],
        results: &[I32],
        kind: DeviceFn::Memory,
    },
    Import {
        name: "memset",
        params: &[I32, I32, I32],
        results: &[I32],
        kind: DeviceFn::Memory,
    },
    libm("exp", &[F64], &[F64]),
    libm("expf", &[F32], &[F32]),
    libm("log", &[F64], &[F64]),
    libm("logf", &[F32], &[F32]),
    libm("pow", &[F64, F64], &[F64]),
    libm("powf", &[F32, F32], &[F32]),
    libm("sin", &[F64], &[F64]),
    libm("sinf", &[F32], &[F32]),
    libm("cos", &[F64], &[F64]),
    libm("cosf", &[F32], &[F32]),
    libm("tanh", &[F64], &[F64]),
    libm("tanhf", &[F32], &[F32]),
    libm("fmin", &[F64, F64], &[F64]),
    libm("fminf", &[F32, F32], &[F32]),
    libm("fmax", &[F64, F64], &[F64]),
    libm("fmaxf", &[F32, F32], &[F32]),
    libm("fma", &[F64, F64, F64], &[F64]),
    libm("fmaf", &[F32, F32, F32], &[F32]),
    // Usually single instructions; imported when the compiler keeps the call.
    libm("sqrt", &[F64], &[F64]),
    libm("sqrtf", &[F32], &[F32]),
    libm("fabs", &[F64], &[F64]),
    libm("fabsf", &[F32], &[F32]),
    libm("floor", &[F64], &[F64]),
    libm("floorf", &[F32], &[F32]),
    libm("ceil", &[F64], &[F64]),
    libm("ceilf", &[F32], &[F32]),
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
