//! mtswarm leader: the `Control` gRPC service, the job manager (one job
//! runner per job driving the leader's ReAct loop with the leader tools),
//! the durable result consumer, the approval broker, the job event journal
//! behind `WatchJob`, and the builtin leader policy.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mtswarm_leader::LeaderError> {
//! use mtswarm_leader::{LeaderConfig, LeaderDaemon};
//! let config = LeaderConfig::new("nats://127.0.0.1:4222", "examples/kernels");
//! let leader = LeaderDaemon::start(config).await?;
//! println!("listening on {}", leader.grpc_addr());
//! leader.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Data flow
//!
//! SubmitJob validates ([`validate`]), stores a QUEUED `JobRecord` (jobs KV)
//! inside the `SubmitJob` span (its traceparent is stored in the record) and
//! starts a job runner ([`runner`]) in a `leader.job` span below it. The
//! runner moves the job to RUNNING and runs the engine with the leader
//! [`tools`]; every step's loop state is stored in
//! `JobRecord.leader_state_json`. `spawn_agent` calls `Worker.SpawnSession`,
//! `assign_task` publishes a `TaskAssignment` (attempt 1) from inside the
//! tool span, and the single durable result consumer ([`results`]) fills the
//! job's result table that `collect_result` waits on. The final answer (its
//! last ```` ```json ```` block is `result_json`) makes the job SUCCEEDED;
//! a stopped loop FAILED; CancelJob CANCELLED (the loop and the agents are
//! cancelled).
//!
//! `WatchJob` reads the job's journal ([`journal`]): a JetStream stream
//! `MTSWARM_JOB_EVENTS` (subjects `mtswarm.jobevent.<job_id>`) into which
//! the leader relays every agent event, approval request and decision,
//! accepted task result and state change.
//!
//! # Invariants
//!
//! - SubmitJob stores nothing unless the whole request is valid.
//! - A task result is accepted once (by task id) and only from the task's
//!   current attempt; everything else is dropped and logged.
//! - A job's record is final once SUCCEEDED, FAILED or CANCELLED: later
//!   state writes leave it alone.
//! - Per-message work (results, events, approvals) is a lookup by id; none
//!   of it scans all jobs.

pub mod approvals;
pub mod config;
mod daemon;
pub mod error;
pub mod fleet;
pub mod journal;
pub mod policy;
pub mod results;
pub mod runner;
mod service;
mod shared;
pub mod tools;
pub mod validate;

pub use config::{LeaderConfig, ModelFactory, SubmitLimits};
pub use daemon::{LeaderDaemon, LeaderHandle};
pub use error::LeaderError;
pub use journal::{JOB_EVENTS_STREAM, job_events_subject};
pub use policy::BuiltinLeaderPolicy;
pub use runner::LEADER_AGENT_ID;
