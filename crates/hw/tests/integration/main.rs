//! The emulator, toolchain, sandbox and board tests of mtswarm-hw.
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod emulator_support;
mod sdk_support;

mod confinement;
mod emulator_adversarial;
mod emulator_determinism;
mod emulator_dgemm;
mod emulator_dgemm_gsm;
mod emulator_limits;
mod emulator_model;
mod emulator_object_cache;
mod emulator_tune;
mod faults;
mod fleet;
mod landscapes;
mod lock;
mod measure;
mod sandbox;
mod sdk;
