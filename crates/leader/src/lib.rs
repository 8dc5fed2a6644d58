//! mtswarm leader: the `Control` gRPC service, the job manager (one job
//! runner per job driving the leader's ReAct loop with the leader tools),
//! the durable result consumer, the approval broker, the job event journal
//! behind `WatchJob`; it hosts the builtin leader policy of `mtswarm-policy`.
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
//! SubmitJob validates (`validate`), stores a QUEUED `JobRecord` (jobs KV)
//! inside the `SubmitJob` span (its traceparent is stored in the record) and
//! starts a job runner (`runner`) in an `invoke_workflow` span below it. The
//! runner moves the job to RUNNING and runs the engine with the leader
//! `tools`; every step's loop state is stored under the job's loop key
//! (`<job>.loop`, as the model is shown it). `spawn_agent` calls `Worker.SpawnSession`,
//! `assign_task` publishes a `TaskAssignment` (attempt 1) from inside the
//! tool span, and the single durable result consumer (`result_consumer`)
//! fills the job's result table (`results`) that `collect_result` waits
//! on; `collect_result`
//! returns a compact summary within a fixed budget and `result_details`
//! pages through the candidates (`digest`). When the loop answers, the
//! job's typed outcome is computed from the accepted results' records in
//! the results store (`outcome`): SUCCEEDED with a best configuration, or
//! FAILED with the reason when there is no accepted valid measurement. The
//! answer is kept as `final_answer` (its last ```` ```json ```` block is
//! `result_json`); a completion gate rejects answers claiming figures no
//! accepted result backs. A stopped loop FAILED; CancelJob CANCELLED (the
//! loop and the agents are cancelled).
//!
//! Reliability (the leader side of the reliability contract):
//! - `spawn_agent` / `assign_task` record the agent's placement / the task
//!   under the job's agent / task key before acting, and a
//!   re-executed call (same call id and step) returns what the first
//!   execution did without spawning or publishing again (`tools`).
//! - The reassigner (`reassign.rs`) moves agents whose slice lease lapsed,
//!   was released or names another session, whose slice was quarantined,
//!   or whose current attempt came back fenced, and re-publishes their
//!   tasks as the next attempt (`task_reassigned` LOG events in the
//!   journal); a sweep every lease TTL / 2 catches what the watches missed.
//! - A starting leader resumes the jobs left QUEUED or RUNNING
//!   (`runner`), replaying their results from the results stream.
//! - Admission: at most `max_active_jobs` loops run, at most
//!   `max_queued_jobs` wait QUEUED, beyond that SubmitJob is
//!   RESOURCE_EXHAUSTED naming the limits.
//! - Every background loop re-creates its NATS subscription, consumer or
//!   watch with backoff after a NATS restart.
//! - [`LeaderHandle::counters`] reports accepted, restored, duplicate,
//!   stale and fenced results and re-published attempts.
//!
//! `WatchJob` reads the job's journal (`journal`): a JetStream stream
//! `MTSWARM_JOB_EVENTS` holding the job's approval requests and decisions,
//! accepted task results, state changes and the leader agent's events,
//! which the leader appends (`mtswarm.jobevent.<job_id>`), and its workers'
//! agent events, which the NATS server sources from the events stream
//! (`mtswarm.jobevent.<job_id>.agents`) without the leader.
//!
//! # Modules, lowest layer first
//!
//! Each module imports only modules above it in this list (no cycles;
//! `.ci/module_cycles.py` checks it):
//!
//! - `ids`: the leader's agent and session ids, call keys, task ids;
//!   `error`: the error enums (the final answer's JSON block is read by
//!   `mtswarm_core::answer`).
//! - `config`, `fleet` (joining
//!   workers, leases and quarantine), `validate`, `scheduler`
//!   (admission), `digest` (tool output budgets), `space` (the kernel's
//!   tuning space as the model reads it, and the check of a plan's
//!   candidates).
//! - `results`: the per-job result tables; `journal`: the job event
//!   stream; `trigger`: the reassigner's queue messages.
//! - `job`: the job's durable state (`JobContext`, agent entries, task
//!   records and their writes into the `JobRecord`), the admitted and the
//!   running job's handles.
//! - `shared`: the daemon's shared handles (a plain struct).
//! - `placement`: the one fleet view, `SpawnSession`, cancelling agents.
//! - `tools` (one file per tool), `prompt`, `approvals` (the broker
//!   and the leader loop's own approval wait), `result_consumer`,
//!   `grounding` (the completion gate), `outcome`, `reassign`.
//! - `runner`: state transitions, resume, the event relay, the loop.
//! - `service` (the `Control` gRPC service, which only translates), `job_manager`
//!   (admission: place, ownership, record, start or queue, rolled back by a
//!   guard) and `daemon` (start, stop).
//!
//! # Invariants
//!
//! - SubmitJob stores nothing unless the whole request is valid.
//! - A task result is accepted once (by task id), only from the task's
//!   current attempt and only when not fenced; everything else is dropped,
//!   logged and counted (a fenced current attempt is reassigned).
//! - A job's record is final once SUCCEEDED, FAILED or CANCELLED: later
//!   state writes leave it alone.
//! - Per-message work (results, events, approvals) is a lookup by id; none
//!   of it scans all jobs.

mod approvals;
mod config;
mod confirm;
mod cost;
mod daemon;
mod digest;
mod error;
mod fleet;
pub mod fuzzing;
mod grounding;
mod host;
mod ids;
mod job;
mod job_manager;
mod journal;
mod keys;
mod outcome;
mod ownerships;
mod placement;
mod prices;
mod prompt;
mod reassign;
mod requests;
mod result_consumer;
mod results;
mod runner;
mod scheduler;
mod service;
mod space;
mod spans;
mod stores;
mod tables;
mod tools;
mod trigger;
mod validate;
mod worker_dial;

pub use config::{LeaderConfig, ModelFactory, SubmitLimits};
pub use daemon::{LeaderDaemon, LeaderHandle};
pub use error::{LeaderError, ModelFactoryError};
pub use ids::LEADER_AGENT_ID;
pub use journal::{JOB_EVENTS_STREAM, job_events_subject};
pub use prices::{MAX_PRICE_PER_MILLION, ModelPrice, PriceError, PriceTable};
pub use results::LeaderCounters;
pub use tables::LeaderTableSizes;
// What tests and benchmarks outside the crate look at: the confirmation
// tasks' call ids, the journal, the result table, the collect budget.
pub use confirm::CONFIRM_CALL_PREFIX;
pub use digest::COLLECT_BUDGET_BYTES;
pub use journal::Journal;
pub use results::ResultTable;
