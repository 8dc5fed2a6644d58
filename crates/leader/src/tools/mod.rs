//! The leader's tools: how the leader loop sees and drives the fleet.
//!
//! | tool | arguments | result (JSON text) |
//! |---|---|---|
//! | `list_fleet` | `selector?` (default: the job's), `compact?`, `limit?` | `{"slices":[{slice_id, worker_id, board, cluster, cores, backend, state, session_id?}], "free": n, "workers": n}`; with `compact: true` `{"free_slices":[ids, at most limit (1024)], "free": n, "slices_total": n, "workers": n}` |
//! | `spawn_agent` | `selector?`, `role?`, `instructions?`, `name?`, `slice_id?` | `{"agent", "session_id", "worker_id", "slice_id"}` |
//! | `assign_task` | `agent`, `instructions`, `parameters?` (object) | `{"task_id", "agent", "attempt"}` |
//! | `collect_result` | `agents?` or `tasks?` (default: every task), `mode?` any\|all, `timeout_seconds?` | a compact summary within a fixed budget ([`crate::digest::collect_summary`]): `{"tasks", "finished", "timed_out", "task_status", "candidate_status", "best", "failed_tasks", "pending_tasks", "errors", "agents", "omitted"}` |
//! | `result_details` | `task?`, `agent?`, `status?` (candidate status), `page?`, `page_size?` | one page of candidate rows ([`crate::digest::details_page`]): `{"page", "pages", "total", "rows":[{task_id, agent, index, params, status, gflops?, median_seconds?, peak_percent?, reason?}]}` |
//! | `cancel_agent` | `agent`, `reason?` | `{"agent", "cancelled"}` |
//! | `read_file` | `path` (relative to the kernel dir) | the file's text |
//! | `job_status` | none | `{"job_id", "agents":[...], "tasks_total", "tasks_done", "pending":[...]}` (lists cut at [`STATUS_LIST_LIMIT`], the rest counted under `omitted`) |
//!
//! Task parameters are free-form JSON objects passed to the worker agent in
//! `TaskAssignment.parameters_json`; the builtin policies use
//! `{"candidates":[{"MB":64,"NB":256,...}, ...]}` (each candidate a `-D` map).
//!
//! # Durable placements and idempotent re-execution
//!
//! `spawn_agent` writes the agent's `AgentPlacement` and `assign_task` the
//! task's `TaskRecord` under its key next to the `JobRecord` BEFORE calling
//! the worker / publishing, each with the identity of the tool call (the call key: the
//! model's call id and the loop step, see [`call_key`]). A leader that
//! resumes a job after a crash re-executes the interrupted calls: a known
//! spawn call returns its agent (re-issuing the idempotent `SpawnSession`
//! with `resume = true`), a known assign call returns its task without a
//! second publish. A task record's `assignment.assigned_at` is set only
//! once the publish was acknowledged, so an assignment recorded but never
//! confirmed is published again on resume (same task id and attempt, so
//! JetStream deduplicates it if it did go out). Task ids are derived from
//! (job id, call key) with UUID v5, a second line of defence.
//!
//! One file per tool; this module registers them and holds the helpers
//! they share. The job's state they work on is `job`, placement
//! (fleet view, spawn, cancel) is `placement`.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::{Tool, ToolError, ToolOutput, ToolRegistry};
use serde_json::Value;

use crate::job::JobContext;
use crate::keys::LeaderKeys;
use crate::placement::Placement;

mod assign_task;
mod cancel_agent;
mod collect_result;
mod job_status;
mod list_fleet;
mod read_file;
mod result_details;
mod spawn_agent;
mod spawning;

/// What the leader's tools work with besides the job: placement, the
/// keys that make tasks' tokens and grants, and how long a collect waits.
#[derive(Clone)]
pub(crate) struct ToolHandles {
    pub(crate) placement: Arc<Placement>,
    pub(crate) keys: LeaderKeys,
    /// How long `collect_result` waits when the call names no timeout.
    pub(crate) default_collect_timeout: Duration,
    /// The longest wait a `collect_result` call may ask for.
    pub(crate) max_collect_timeout: Duration,
}

/// What every leader tool works with: the job's state and the handles.
pub(crate) struct ToolEnv {
    pub(crate) job: Arc<JobContext>,
    pub(crate) handles: ToolHandles,
    /// What the job's concurrent `spawn_agent` calls share.
    pub(crate) spawning: spawning::Spawning,
}

impl ToolEnv {
    fn placement(&self) -> &Placement {
        &self.handles.placement
    }
}

/// The registry of leader tools for one job.
pub(crate) fn registry(handles: ToolHandles, context: Arc<JobContext>) -> ToolRegistry {
    let env = Arc::new(ToolEnv {
        job: context,
        handles,
        spawning: spawning::Spawning::default(),
    });
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(list_fleet::ListFleet(env.clone())),
        Arc::new(spawn_agent::SpawnAgent(env.clone())),
        Arc::new(assign_task::AssignTask(env.clone())),
        Arc::new(collect_result::CollectResult(env.clone())),
        Arc::new(result_details::ResultDetails(env.clone())),
        Arc::new(cancel_agent::CancelAgent(env.clone())),
        Arc::new(read_file::ReadKernelFile(env.clone())),
        Arc::new(job_status::JobStatus(env)),
    ];
    let mut registry = ToolRegistry::new();
    for tool in tools {
        // Names are distinct constants and schemas are static: cannot fail.
        if let Err(error) = registry.register(tool) {
            tracing::error!(%error, "leader tool not registered");
        }
    }
    registry
}

/// Arguments as the tool's argument type (the schema already checked
/// them); a mismatch names the field.
pub(super) fn parse_args<T: serde::de::DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| {
        ToolError::InvalidArgs(format!(
            "{e}; call the tool again with the arguments its schema lists"
        ))
    })
}

/// A text argument as given: trimmed, `None` when absent or blank.
pub(super) fn given(text: Option<String>) -> Option<String> {
    text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

pub(super) fn output(value: Value) -> ToolOutput {
    ToolOutput::text(value.to_string()).with_data(value)
}
