//! Whole-system tests that are neither the e2e, chaos nor k8s suites nor
//! the tests that install process-wide telemetry (`metrics`, `trace`,
//! `trace_conventions`, binaries of their own).
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod deploy_files;
mod farm;
mod llm_check;
mod mcp;
mod observability_assets;
mod real_model;
mod source_edit;
