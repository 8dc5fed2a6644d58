//! The worker daemon, session and policy tests of mtswarm-worker.
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;
mod policy_support;

mod approvals;
mod auth;
mod daemon;
mod disk;
mod dispatch;
mod fencing;
mod limits;
mod nats_restart;
mod policy_pipeline;
mod policy_plan;
mod policy_search;
mod quarantine;
mod resume;
mod search_quality;
mod session;
mod tracing;
