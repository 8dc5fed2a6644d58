//! mtswarm-worker: the worker daemon. One daemon owns the slices of one
//! board of a fleet file and runs worker agent sessions on them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mtswarm_worker::WorkerError> {
//! use mtswarm_worker::{WorkerConfig, WorkerDaemon};
//! let mut config = WorkerConfig::new("fleet.toml", "board0");
//! config.nats_urls = vec!["nats://127.0.0.1:4222".into()];
//! config.kernel_root = "examples/kernels".into();
//! let handle = WorkerDaemon::start(config).await?;
//! println!("worker {} on {}", handle.worker_id(), handle.grpc_addr());
//! handle.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What the daemon does
//!
//! - Builds a `Board` per slice of its board (the emulator by default),
//!   takes a lease per slice in the leases bucket (TTL, renewed every third
//!   of it; one `LeaseSet` loop renews all of the daemon's leases, so a
//!   slice owns no timer; a restarted daemon reclaims its own), and
//!   registers a `WorkerRecord` (endpoint = its gRPC address) with a
//!   heartbeat. A slice's lease names the session and job running on it.
//! - Serves `mtswarm.v1.Worker` with `grpc.health.v1` (SERVING once
//!   registered) and reflection (v1 and v1alpha).
//! - `SpawnSession` binds a session to a free slice (named, or the first
//!   free one matching the selector); it is idempotent per `session_id`
//!   and refuses with FAILED_PRECONDITION (slice busy, quarantined, daemon
//!   draining), NOT_FOUND (unknown slice, nothing matches),
//!   RESOURCE_EXHAUSTED (max sessions, disk quota) or INVALID_ARGUMENT (bad ids, bad
//!   selector, bad kernel directory).
//! - The daemon owns one durable task consumer over
//!   `mtswarm.task.<worker>.>` (`dispatch.rs`), which files each task in
//!   the inbox of the session it names (`inbox.rs`); a session is a tokio
//!   task that takes its tasks one at a time, so a waiting session costs
//!   memory only (no consumer, no timer). Per task it runs the ReAct engine with the `mtswarm-tools` tools in
//!   the session's workspace (`<workspace_root>/<session_id>`, the kernel
//!   directory copied in from the kernel root by the session's first task,
//!   not at spawn), the slice's hardware lock
//!   as the engine's resource lock, publishes every engine event as an
//!   `AgentEvent` (per-session gapless sequence; what one engine poll
//!   emits goes out as one `AgentEventBatch`: see `events.rs`),
//!   checkpoints the loop to the checkpoints bucket (the state before and
//!   after every tool batch synchronously, states in between write-behind,
//!   no final state for a first attempt that stored nothing: see
//!   `checkpoint/mod.rs`),
//!   publishes the `TaskResult` and then acks.
//!   A task whose session id is not the session's is terminated.
//! - Budgets (the task's, else the session's): `max_steps`, `max_tokens` and
//!   `wall_time_seconds` go to the engine; `device_seconds` (time spent in
//!   hardware tools) is checked after every event and stops the run when
//!   spent; the task's `deadline` cancels it. An attempt older than the one
//!   that owns the session's checkpoint is fenced off (a fenced result, then
//!   terminated).
//! - A task with `resume_from_checkpoint` (or a redelivery) resumes from the
//!   session's checkpoint when that checkpoint belongs to the same task.
//! - Approvals across processes: see `approval`.
//! - Fencing: an attempt that loses its slice while it runs (the slice's
//!   lease lost to a lapse or a takeover, a checkpoint write refused because
//!   a later attempt owns the session, the slice quarantined) stops, and its
//!   task ends with a `TaskResult` with `fenced = true`, status CANCELLED and
//!   an error `fenced off: <reason>`; the delivery is terminated. When the
//!   slice itself was lost the session ends too (its checkpoint stays for a
//!   resume elsewhere). A shutdown instead leaves the attempt without result
//!   or ack, to be redelivered or reassigned and resumed.
//! - Quarantine: every hardware run of a slice is counted; `quarantine_after`
//!   failed runs in a row (crash, timeout, wrong answer; compile errors do
//!   not count, a valid run resets the count) write a `SliceQuarantine`
//!   record and fence the slice's session. SpawnSession refuses a
//!   quarantined slice until the record is deleted.
//! - Resume on another slice: SpawnSession with `resume` and the session id
//!   of a session that ran elsewhere reports the checkpoint's step; a task
//!   with `resume_from_checkpoint` (attempt above the checkpoint's) resumes
//!   from it, including a run paused on approvals (see `approval`).
//! - NATS outages: the task subscription is re-opened with backoff, lease
//!   renewals are retried until the TTL would have run out, the worker
//!   record is re-registered and the quarantine watch re-created; nothing of
//!   this ends a session or the daemon.
//! - Disk: the workspaces of finished sessions are removed
//!   `workspace_retention` after their last change (`janitor`); with a
//!   `disk_quota_bytes`, SpawnSession is refused with RESOURCE_EXHAUSTED
//!   while the workspace root uses the whole quota ([`DiskError`]).
//! - Limits: `max_sessions` per daemon; a task whose `parameters_json` or
//!   `instructions` exceeds `max_task_parameters_bytes` /
//!   `max_task_instructions_bytes` ends FAILED with an error naming the limit.
//!
//! # Conventions others rely on
//!
//! - Bus slice ids are the hardware slice ids with every character outside
//!   `[A-Za-z0-9_-]` replaced by `-` ([`bus_slice_id`]: `board0/c1` ->
//!   `board0-c1`). They appear in WorkerRecord slices, leases, task subjects
//!   and results; SpawnSession accepts either form.
//! - Worker id default: `worker-<board>`.
//! - The task's first user message is rendered by
//!   [`mtswarm_policy::worker::render_task_message`]; `parameters_json` is the policy's
//!   task-parameter object (see [`mtswarm_policy::worker`]).
//! - `TaskResult.result_json`: `best` (the benchmark tool's best candidate:
//!   defines, median seconds, GFLOPS, peak fraction, kernel hash),
//!   `candidates`, `benchmarks`, `evidence` (passed checks), `answer`,
//!   `answer_json` (the answer's ```` ```json ```` block), `verdict`,
//!   `stop_reason`, `steps`.
//! - Event payloads are the engine's event JSON (`type` = transition,
//!   tool_call, tool_result, ...) plus `task_id`, `attempt` and
//!   `engine_seq`; the worker adds `session_started`, `task_started`,
//!   `task_finished`, `approval_decided` and `session_finished`.
//!
//! # Layers
//!
//! Modules import one way, top down:
//!
//! - `daemon`: starts and stops everything ([`WorkerDaemon`],
//!   [`WorkerHandle`]); `service`: the `Worker` gRPC service;
//! - `session`: SpawnSession (the only session code speaking
//!   `tonic::Status`), session start, the session loop and one task
//!   attempt's stages (validation, resume point, run, drive, result,
//!   fencing);
//! - `approval`, `quarantine`, `heartbeat`, `leases`, `janitor`: what
//!   acts on the shared state besides sessions;
//! - `shared`: the daemon's shared state (configuration, bus stores,
//!   slices, the session table); `session_entry`: a session as the table
//!   knows it; `stop`: how a session is asked to stop;
//! - leaves: `config`, `disk`, `error`, `events`, `health`,
//!   `checkpoint`, `results`, `prompt`, `text`, `workspace`.
//! - entry points for outside drivers: `fuzzing` (the fuzz targets) and
//!   `benching` (the durable-step bench, over `checkpoint`).

mod approval;
mod approval_rules;
pub mod benching;
mod checkpoint;
mod config;
mod daemon;
mod disk;
mod dispatch;
mod error;
mod events;
pub mod fuzzing;
mod health;
mod heartbeat;
mod host;
mod identity;
mod inbox;
mod janitor;
mod leases;
mod observations;
mod prompt;
mod provenance;
mod quarantine;
mod requests;
mod results;
mod service;
mod session;
mod session_entry;
mod slices;
mod stop;
mod stores;
mod text;
mod workspace;

pub use checkpoint::CHECKPOINT_FORMAT_VERSION;
pub use config::{DefaultVerdict, ModelFactory, SessionModelContext, WorkerConfig, WorkerModel};
pub use daemon::{WorkerDaemon, WorkerHandle, bus_slice_id};
pub use disk::{
    DiskError, DiskUsage, JanitorReport, RemovedWorkspace, parse_disk_quota, parse_retention,
};
pub use error::WorkerError;
pub use service::WorkerService;
