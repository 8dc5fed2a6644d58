//! The builtin policies' tests: the worker policy's plans against simulated
//! tool results, driven through the engine with the real tools on an
//! emulated slice, the search's quality on a recorded landscape, and the
//! split of a space between agents.
//!
//! Every file beside this one is a module of one test binary (one link of
//! the emulator instead of one per file). Run one file's tests with
//! `cargo test -p mtswarm-policy --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod support;

mod partition;
mod search_quality;
mod worker_pipeline;
mod worker_plan;
mod worker_search;
