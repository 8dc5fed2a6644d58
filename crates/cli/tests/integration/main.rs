//! The command line's tests: demo, emu run and sweep, search replay,
//! quarantine, results store.
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

mod demo;
mod emu_run;
mod landscapes;
mod quarantine;
mod results_store;
