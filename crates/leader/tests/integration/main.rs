//! The leader's tests: job flow, approvals, auth, restarts, limits, the
//! completion gate's push-back.
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

// Shared with the tests that are binaries of their own.
#[path = "../common/mod.rs"]
mod common;

mod approvals;
mod auth;
mod bad_data;
mod builtin_policy;
mod fleet;
mod idempotency;
mod job_flow;
mod journal;
mod journal_cluster;
mod limits;
mod nats_restart;
mod plan_refused;
mod push_back;
mod reassign;
mod record_size;
mod restart;
mod submit;
