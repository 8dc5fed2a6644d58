//! End-to-end tests with real processes: a real nats-server, the leader
//! (in this process, so tests can script its model) and worker daemons as
//! separate `mtswarm-node` processes, talking gRPC over loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod abuse;
mod approvals;
mod cli_client;
mod clients;
mod confirmation;
mod insider_approvals;
mod insider_endpoints;
mod insider_records;
mod introspection;
mod invalid_requests;
mod job;
mod outcome;
mod secure_up;
mod support;
mod up;
