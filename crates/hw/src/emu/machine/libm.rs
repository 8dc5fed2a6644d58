//! The device's scalar math library (slib3000's subset of `<math.h>`) as
//! host functions: computed here, charged `LIBM_CALL_CYCLES` to the
//! calling core.

use wasmtime::Linker;

use super::device::{CoreState, Ctx};
use crate::emu::contract::{IMPORT_MODULE, LIBM_CALL_CYCLES};

fn charge(caller: &mut Ctx<'_>) {
    caller.data_mut().clock.spend(LIBM_CALL_CYCLES);
}

pub(super) fn define(linker: &mut Linker<CoreState>, name: &'static str) -> wasmtime::Result<()> {
    let m = IMPORT_MODULE;
    macro_rules! unary {
        ($f:expr, $t:ty) => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, x: $t| {
                charge(&mut c);
                $f(x)
            })
        };
    }
    macro_rules! binary {
        ($f:expr, $t:ty) => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, x: $t, y: $t| {
                charge(&mut c);
                $f(x, y)
            })
        };
    }
    match name {
        "exp" => unary!(f64::exp, f64),
        "expf" => unary!(f32::exp, f32),
        "log" => unary!(f64::ln, f64),
        "logf" => unary!(f32::ln, f32),
        "sin" => unary!(f64::sin, f64),
        "sinf" => unary!(f32::sin, f32),
        "cos" => unary!(f64::cos, f64),
        "cosf" => unary!(f32::cos, f32),
        "tanh" => unary!(f64::tanh, f64),
        "tanhf" => unary!(f32::tanh, f32),
        "sqrt" => unary!(f64::sqrt, f64),
        "sqrtf" => unary!(f32::sqrt, f32),
        "fabs" => unary!(f64::abs, f64),
        "fabsf" => unary!(f32::abs, f32),
        "floor" => unary!(f64::floor, f64),
        "floorf" => unary!(f32::floor, f32),
        "ceil" => unary!(f64::ceil, f64),
        "ceilf" => unary!(f32::ceil, f32),
        "pow" => binary!(f64::powf, f64),
        "powf" => binary!(f32::powf, f32),
        "fmin" => binary!(f64::min, f64),
        "fminf" => binary!(f32::min, f32),
        "fmax" => binary!(f64::max, f64),
        "fmaxf" => binary!(f32::max, f32),
        "fma" => linker.func_wrap(m, name, |mut c: Ctx<'_>, x: f64, y: f64, z: f64| {
            charge(&mut c);
            x.mul_add(y, z)
        }),
        "fmaf" => linker.func_wrap(m, name, |mut c: Ctx<'_>, x: f32, y: f32, z: f32| {
            charge(&mut c);
            x.mul_add(y, z)
        }),
        other => {
            return Err(wasmtime::Error::msg(format!(
                "libm function `{other}` has no implementation"
            )));
        }
    }
    .map(|_| ())
}
