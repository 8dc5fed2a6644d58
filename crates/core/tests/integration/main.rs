//! The engine's tests: loop transitions, approvals, middleware, concurrency,
//! a model's context window, unreadable tool calls, which states a resume
//! needs stored.
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

mod approval;
mod completion_gate;
mod concurrency;
mod context_window;
mod durability;
mod loop_transitions;
mod middleware;
mod unreadable_calls;
