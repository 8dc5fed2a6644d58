//! The bus tests against real nats-server processes.
//!
//! Every file beside this one is a module of one test binary. A binary per
//! file would link the whole dependency tree (the emulator's compiler and
//! runtime among it, ~120 MB unoptimized) once per file: minutes of linking
//! and gigabytes of disk. Run one file's tests with
//! `cargo test --test integration <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

mod bad_data;
mod cluster;
mod jetstream;
mod job_parts;
mod lease_cluster;
mod lease_set;
mod owner_writes;
mod results;
mod topology;
mod trace_context;
