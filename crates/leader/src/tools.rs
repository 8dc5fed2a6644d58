//! The leader's tools: how the leader loop sees and drives the fleet.
//!
//! | tool | arguments | result (JSON text) |
//! |---|---|---|
//! | `list_fleet` | `selector?` (default: the job's) | `{"slices":[{slice_id, worker_id, board, cluster, cores, backend, state, session_id?}], "free": n, "workers": n}` |
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
//! task's `TaskRecord` into the `JobRecord` BEFORE calling the worker /
//! publishing, each with the identity of the tool call (the call key: the
//! model's call id and the loop step, see [`call_key`]). A leader that
//! resumes a job after a crash re-executes the interrupted calls: a known
//! spawn call returns its agent (re-issuing the idempotent `SpawnSession`
//! with `resume = true`), a known assign call returns its task without a
//! second publish. A task record's `assignment.assigned_at` is set only
//! once the publish was acknowledged, so an assignment recorded but never
//! confirmed is published again on resume (same task id and attempt, so
//! JetStream deduplicates it if it did go out). Task ids are derived from
//! (job id, call key) with UUID v5, a second line of defence.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use mtswarm_bus::results::canonical_slice_id;
use mtswarm_bus::{subjects, v1};
use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use serde_json::{Value, json};

use crate::fleet::{parse_selector, read_fleet, state_name};
use crate::results::JobResults;
use crate::shared::Shared;
use crate::validate::resolve_file;
use mtswarm_bus::BusError;

/// Largest file `read_file` returns in full; longer files are cut with a marker.
const READ_FILE_LIMIT: usize = 64 * 1024;
/// Agents and pending tasks `job_status` lists at most.
pub const STATUS_LIST_LIMIT: usize = 32;

/// One agent the job spawned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    pub agent_id: String,
    pub session_id: String,
    pub worker_id: String,
    pub slice_id: String,
    pub endpoint: String,
    pub role: String,
    pub instructions: String,
    pub cancelled: bool,
    /// Call key of the `spawn_agent` call that created the agent.
    pub spawn_call_id: String,
    /// Times the session was moved to another slice.
    pub moves: u32,
    /// A `SpawnSession` for this placement is in flight: the slice's lease
    /// does not name the session yet, so the reassigner leaves it alone.
    pub spawning: bool,
}

impl AgentEntry {
    /// The durable form stored in `JobRecord.agents`.
    pub fn to_placement(&self) -> v1::AgentPlacement {
        v1::AgentPlacement {
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            worker_id: self.worker_id.clone(),
            slice_id: self.slice_id.clone(),
            endpoint: self.endpoint.clone(),
            role: self.role.clone(),
            instructions: self.instructions.clone(),
            cancelled: self.cancelled,
            spawn_call_id: self.spawn_call_id.clone(),
            moves: self.moves,
        }
    }

    /// An agent read back from `JobRecord.agents`.
    pub fn from_placement(placement: &v1::AgentPlacement) -> Self {
        Self {
            agent_id: placement.agent_id.clone(),
            session_id: placement.session_id.clone(),
            worker_id: placement.worker_id.clone(),
            slice_id: placement.slice_id.clone(),
            endpoint: placement.endpoint.clone(),
            role: placement.role.clone(),
            instructions: placement.instructions.clone(),
            cancelled: placement.cancelled,
            spawn_call_id: placement.spawn_call_id.clone(),
            moves: placement.moves,
            spawning: false,
        }
    }
}

/// The identity of a leader tool call for idempotent re-execution: the
/// model's call id qualified by the loop step (`<call id>@<step>`), because
/// a model may reuse a call id in a later step for a different call, while
/// a call re-executed from a checkpoint keeps both.
pub fn call_key(ctx: &ToolContext) -> String {
    format!("{}@{}", ctx.call_id, ctx.step)
}

/// Task id of the task assigned by the call `call_key` of `job_id` (UUID v5
/// of both): a re-executed call maps to the same id, so even a second
/// publish would be deduplicated by the tasks stream.
pub fn task_id_for(job_id: &str, call_key: &str) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("mtswarm-task/{job_id}/{call_key}").as_bytes(),
    )
    .simple()
    .to_string()
}

/// Per-job state the tools work on.
pub(crate) struct JobContext {
    pub job_id: String,
    pub spec: v1::JobSpec,
    pub kernel_dir: PathBuf,
    pub shared: Arc<Shared>,
    pub results: Arc<JobResults>,
    pub agents: Mutex<BTreeMap<String, AgentEntry>>,
    /// The job's task records as last written to the job record, by task id.
    pub tasks: Mutex<BTreeMap<String, v1::TaskRecord>>,
    pub deadline: SystemTime,
}

impl JobContext {
    /// A fresh job's context (no agents, no tasks yet).
    pub fn new(
        job_id: String,
        spec: v1::JobSpec,
        kernel_dir: PathBuf,
        shared: Arc<Shared>,
        deadline: SystemTime,
    ) -> Self {
        let results = shared.results.job(&job_id);
        Self {
            job_id,
            spec,
            kernel_dir,
            shared,
            results,
            agents: Default::default(),
            tasks: Default::default(),
            deadline,
        }
    }

    pub(crate) fn agents(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AgentEntry>> {
        self.agents.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn tasks(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, v1::TaskRecord>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn agent_list(&self) -> Vec<AgentEntry> {
        self.agents().values().cloned().collect()
    }

    pub fn agent(&self, agent_id: &str) -> Option<AgentEntry> {
        self.agents().get(agent_id).cloned()
    }

    /// Tasks of `agent_id` without a result, as last recorded.
    pub fn pending_tasks_of(&self, agent_id: &str) -> Vec<v1::TaskRecord> {
        self.tasks()
            .values()
            .filter(|t| !t.done)
            .filter(|t| {
                t.assignment
                    .as_ref()
                    .is_some_and(|a| a.agent_id == agent_id && self.results.is_pending(&a.task_id))
            })
            .cloned()
            .collect()
    }

    /// Writes (inserts or replaces) the agent's placement into the job record.
    pub async fn store_placement(&self, entry: &AgentEntry) -> Result<(), BusError> {
        let placement = entry.to_placement();
        self.shared
            .jobs
            .modify(&self.job_id, |record| {
                match record
                    .agents
                    .iter_mut()
                    .find(|a| a.agent_id == placement.agent_id)
                {
                    Some(existing) => *existing = placement.clone(),
                    None => record.agents.push(placement.clone()),
                }
                if !record.agent_ids.contains(&placement.agent_id) {
                    record.agent_ids.push(placement.agent_id.clone());
                }
            })
            .await
            .map(|_| ())
    }

    /// Removes a placement whose spawn failed everywhere.
    async fn forget_placement(&self, agent_id: &str) {
        self.agents().remove(agent_id);
        if let Err(error) = self
            .shared
            .jobs
            .modify(&self.job_id, |record| {
                record.agents.retain(|a| a.agent_id != agent_id);
                record.agent_ids.retain(|a| a != agent_id);
            })
            .await
        {
            tracing::warn!(%error, job_id = %self.job_id, agent_id, "failed placement not removed from the job record");
        }
    }

    /// Writes (inserts or replaces) task records into the job record;
    /// `new_tasks` of them count towards `tasks_total`.
    pub async fn store_tasks(
        &self,
        records: &[v1::TaskRecord],
        new_tasks: u32,
    ) -> Result<(), BusError> {
        self.shared
            .jobs
            .modify(&self.job_id, |record| {
                for task in records {
                    let id = task
                        .assignment
                        .as_ref()
                        .map(|a| a.task_id.as_str())
                        .unwrap_or_default();
                    match record
                        .tasks
                        .iter_mut()
                        .find(|t| t.assignment.as_ref().is_some_and(|a| a.task_id == id))
                    {
                        // The result consumer may have marked it done meanwhile.
                        Some(existing) if existing.done => {}
                        Some(existing) => *existing = task.clone(),
                        None => record.tasks.push(task.clone()),
                    }
                }
                record.tasks_total = record.tasks_total.saturating_add(new_tasks);
            })
            .await
            .map(|_| ())
    }

    /// Marks tasks done with `status` in the job record (cancelled agents).
    async fn record_settled(&self, task_ids: &[String], status: v1::TaskStatus) {
        if task_ids.is_empty() {
            return;
        }
        let now = prost_types::Timestamp::from(SystemTime::now());
        for task_id in task_ids {
            if let Some(task) = self.tasks().get_mut(task_id) {
                task.done = true;
                task.status = status as i32;
            }
        }
        if let Err(error) = self
            .shared
            .jobs
            .modify(&self.job_id, |record| {
                for task in record.tasks.iter_mut().filter(|t| !t.done) {
                    if task
                        .assignment
                        .as_ref()
                        .is_some_and(|a| task_ids.contains(&a.task_id))
                    {
                        task.done = true;
                        task.status = status as i32;
                        task.finished_at = Some(now);
                    }
                }
            })
            .await
        {
            tracing::warn!(%error, job_id = %self.job_id, "settled tasks not recorded");
        }
    }

    /// Publishes an assignment whose record is already stored, then records
    /// the publish (`assigned_at`). `Err` = not published.
    pub async fn publish_recorded(&self, assignment: &v1::TaskAssignment) -> Result<(), BusError> {
        let mut task = assignment.clone();
        let now = prost_types::Timestamp::from(SystemTime::now());
        task.assigned_at = Some(now);
        // Runs inside the caller's span: the bus injects its context into
        // the task headers, so the worker's session continues the trace.
        self.shared.bus.publish_task(&task).await?;
        let (task_id, attempt) = (task.task_id.clone(), task.attempt);
        if let Some(record) = self.tasks().get_mut(&task_id)
            && let Some(stored) = record.assignment.as_mut()
            && stored.attempt == attempt
        {
            stored.assigned_at = Some(now);
        }
        if let Err(error) = self
            .shared
            .jobs
            .modify(&self.job_id, |record| {
                if let Some(stored) = record
                    .tasks
                    .iter_mut()
                    .filter_map(|t| t.assignment.as_mut())
                    .find(|a| a.task_id == task_id && a.attempt == attempt)
                {
                    stored.assigned_at = Some(now);
                }
            })
            .await
        {
            // Harmless: a resume publishes it again and the stream drops
            // the copy as a duplicate.
            tracing::warn!(%error, job_id = %self.job_id, task_id, "task publish not recorded");
        }
        Ok(())
    }

    /// Cancels every live agent's session (job cancelled or finished).
    pub async fn cancel_all_agents(&self, reason: &str) {
        for agent in self.agent_list() {
            if !agent.cancelled {
                let _ = cancel_agent(self, &agent.agent_id, reason).await;
            }
        }
    }
}

/// The registry of leader tools for one job.
pub(crate) fn registry(context: Arc<JobContext>) -> ToolRegistry {
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(ListFleet(context.clone())),
        Arc::new(SpawnAgent(context.clone())),
        Arc::new(AssignTask(context.clone())),
        Arc::new(CollectResult(context.clone())),
        Arc::new(ResultDetails(context.clone())),
        Arc::new(CancelAgent(context.clone())),
        Arc::new(ReadFile(context.clone())),
        Arc::new(JobStatus(context)),
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

fn text_arg(args: &Value, name: &str) -> Option<String> {
    args.get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn string_list(args: &Value, name: &str) -> Vec<String> {
    match args.get(name) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(Value::String(one)) if !one.is_empty() => vec![one.clone()],
        _ => Vec::new(),
    }
}

fn output(value: Value) -> ToolOutput {
    ToolOutput::text(value.to_string()).with_data(value)
}

macro_rules! tool_meta {
    ($name:expr, $description:expr, $risk:expr, $read_only:expr, $concurrent:expr) => {
        fn name(&self) -> &str {
            $name
        }
        fn description(&self) -> &str {
            $description
        }
        fn risk(&self) -> Risk {
            $risk
        }
        fn read_only(&self) -> bool {
            $read_only
        }
        fn concurrency_safe(&self) -> bool {
            $concurrent
        }
    };
}

// ---------------------------------------------------------------- list_fleet

struct ListFleet(Arc<JobContext>);

#[async_trait::async_trait]
impl Tool for ListFleet {
    tool_meta!(
        "list_fleet",
        "List the slices of the fleet that match a selector (default: the job's), with their state (free, leased, quarantined) and the worker that owns each.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "selector":{"type":"string","description":"slice selector, e.g. backend=emulator,cores>=8; empty = the job's selector"}
        },"additionalProperties":false})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
        let selector_text =
            text_arg(&args, "selector").unwrap_or_else(|| job.spec.slice_selector.clone());
        let selector = parse_selector(&selector_text).map_err(ToolError::InvalidArgs)?;
        let shared = &job.shared;
        let view = read_fleet(
            &shared.workers,
            &shared.leases,
            &shared.quarantine,
            selector.as_ref(),
            shared.config.worker_stale_after,
        )
        .await
        .map_err(|e| ToolError::Failed(format!("cannot read the fleet: {e}")))?;
        let draining: Vec<&str> = view
            .workers
            .iter()
            .filter(|w| w.draining)
            .map(|w| w.worker_id.as_str())
            .collect();
        let mut free = 0;
        let slices: Vec<Value> = view
            .slices
            .iter()
            .map(|s| {
                let d = s.slice.clone().unwrap_or_default();
                let mut state = state_name(s.state());
                if state == "free" && draining.contains(&s.worker_id.as_str()) {
                    state = "draining";
                }
                if state == "free" && shared.claimed_slices.contains_key(&d.slice_id) {
                    state = "leased";
                }
                if state == "free" {
                    free += 1;
                }
                let mut entry = json!({
                    "slice_id": d.slice_id, "worker_id": s.worker_id, "board": d.board,
                    "cluster": d.cluster, "cores": d.cores, "backend": d.backend, "state": state,
                });
                if let Some(lease) = &s.lease {
                    entry["session_id"] = json!(lease.session_id);
                }
                entry
            })
            .collect();
        Ok(output(json!({
            "selector": selector_text,
            "slices": slices,
            "free": free,
            "workers": view.workers.len(),
        })))
    }
}

// --------------------------------------------------------------- spawn_agent

struct SpawnAgent(Arc<JobContext>);

fn agent_name_ok(name: &str) -> Result<(), ToolError> {
    subjects::validate_id("agent name", name).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
    if name == crate::runner::LEADER_AGENT_ID {
        return Err(ToolError::InvalidArgs(format!(
            "agent name {name:?} is reserved for the leader"
        )));
    }
    Ok(())
}

#[async_trait::async_trait]
impl Tool for SpawnAgent {
    tool_meta!(
        "spawn_agent",
        "Start a worker agent on a free slice matching the selector (default: the job's). Returns the agent id (the optional name) used by assign_task, collect_result and cancel_agent.",
        Risk::Medium,
        false,
        false
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "selector":{"type":"string","description":"slice selector; empty = the job's selector"},
            "role":{"type":"string","description":"agent role, e.g. tuner"},
            "instructions":{"type":"string","description":"standing instructions for the agent"},
            "name":{"type":"string","description":"agent id to use ([A-Za-z0-9_-], unique in the job)"},
            "slice_id":{"type":"string","description":"run on exactly this slice"}
        },"additionalProperties":false})
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
        let shared = &job.shared;
        let key = call_key(ctx);
        let known = job
            .agents()
            .values()
            .find(|a| a.spawn_call_id == key)
            .cloned();
        if let Some(agent) = known {
            return Ok(output(respawned(job, &agent).await));
        }
        let agent_id = match text_arg(&args, "name") {
            Some(name) => name,
            None => format!("agent-{}", job.agents().len() + 1),
        };
        agent_name_ok(&agent_id)?;
        if job.agents().contains_key(&agent_id) {
            return Err(ToolError::InvalidArgs(format!(
                "an agent named {agent_id:?} already exists in this job"
            )));
        }
        let role = text_arg(&args, "role").unwrap_or_else(|| "tuner".to_string());
        let instructions = text_arg(&args, "instructions").unwrap_or_default();
        let selector_text =
            text_arg(&args, "selector").unwrap_or_else(|| job.spec.slice_selector.clone());
        let selector = parse_selector(&selector_text).map_err(ToolError::InvalidArgs)?;
        let wanted_slice = text_arg(&args, "slice_id");
        let view = read_fleet(
            &shared.workers,
            &shared.leases,
            &shared.quarantine,
            selector.as_ref(),
            shared.config.worker_stale_after,
        )
        .await
        .map_err(|e| ToolError::Failed(format!("cannot read the fleet: {e}")))?;
        let session_id = format!(
            "{}-{}",
            job.job_id.chars().take(36).collect::<String>(),
            agent_id
        )
        .chars()
        .take(subjects::MAX_ID_LEN)
        .collect::<String>();
        let mut refusals = Vec::new();
        for slice in &view.slices {
            let Some(descriptor) = &slice.slice else {
                continue;
            };
            if wanted_slice
                .as_deref()
                .is_some_and(|w| w != descriptor.slice_id)
            {
                continue;
            }
            if slice.state() != v1::SliceState::Free {
                continue;
            }
            let Some(worker) = view.workers.iter().find(|w| w.worker_id == slice.worker_id) else {
                continue;
            };
            if worker.draining {
                continue;
            }
            // Claim locally first: a concurrent spawn skips this slice.
            let claimed = match shared.claimed_slices.entry(descriptor.slice_id.clone()) {
                dashmap::Entry::Occupied(_) => false,
                dashmap::Entry::Vacant(entry) => {
                    entry.insert(session_id.clone());
                    true
                }
            };
            if !claimed {
                continue;
            }
            let mut entry = AgentEntry {
                agent_id: agent_id.clone(),
                session_id: session_id.clone(),
                worker_id: worker.worker_id.clone(),
                slice_id: descriptor.slice_id.clone(),
                endpoint: worker.endpoint.clone(),
                role: role.clone(),
                instructions: instructions.clone(),
                cancelled: false,
                spawn_call_id: key.clone(),
                moves: 0,
                spawning: true,
            };
            job.agents().insert(agent_id.clone(), entry.clone());
            // Recorded before the worker is called: a leader that crashes
            // in between finds the agent when it re-executes this call.
            if let Err(error) = job.store_placement(&entry).await {
                shared.claimed_slices.remove(&descriptor.slice_id);
                job.agents().remove(&agent_id);
                return Err(ToolError::Failed(format!(
                    "agent placement not stored in the job record: {error}"
                )));
            }
            let outcome = spawn_on(job, &entry, &descriptor.slice_id, false).await;
            // The claim lasts as long as the agent (released by cancel_agent,
            // which every job end calls), so this leader never places two
            // sessions on one slice whatever the lease shows meanwhile.
            match outcome {
                Ok(response) => {
                    if !response.slice_id.is_empty() {
                        entry.slice_id = response.slice_id.clone();
                    }
                    if !response.worker_id.is_empty() {
                        entry.worker_id = response.worker_id.clone();
                    }
                    entry.spawning = false;
                    job.agents().insert(agent_id.clone(), entry.clone());
                    if (entry.slice_id.as_str(), entry.worker_id.as_str())
                        != (descriptor.slice_id.as_str(), worker.worker_id.as_str())
                        && let Err(error) = job.store_placement(&entry).await
                    {
                        tracing::warn!(%error, job_id = %job.job_id, "agent placement not updated");
                    }
                    ctx.progress(
                        format!("agent {agent_id} runs on {}", entry.slice_id),
                        Some(1.0),
                    );
                    return Ok(output(json!({
                        "agent": agent_id, "session_id": session_id,
                        "worker_id": entry.worker_id, "slice_id": entry.slice_id, "role": role,
                    })));
                }
                Err(refusal) => {
                    shared.claimed_slices.remove(&descriptor.slice_id);
                    refusals.push(format!("{}: {refusal}", descriptor.slice_id));
                }
            }
        }
        if job.agents().contains_key(&agent_id) {
            job.forget_placement(&agent_id).await;
        }
        let detail = if refusals.is_empty() {
            String::new()
        } else {
            format!(" (refused: {})", refusals.join("; "))
        };
        Err(ToolError::Failed(format!(
            "no free slice matches selector {selector_text:?}{detail}"
        )))
    }
}

/// A re-executed `spawn_agent` call: the agent exists; make sure its session
/// runs (SpawnSession is idempotent by session id; `resume` picks up its
/// checkpoint if the session had to be started again) and answer as the
/// first execution did. A session that cannot be confirmed is left to the
/// reassigner, which moves an agent with pending tasks whose lease does not
/// name its session.
async fn respawned(job: &JobContext, agent: &AgentEntry) -> Value {
    let mut answer = json!({
        "agent": agent.agent_id, "session_id": agent.session_id,
        "worker_id": agent.worker_id, "slice_id": agent.slice_id, "role": agent.role,
    });
    if agent.cancelled {
        answer["cancelled"] = json!(true);
        return answer;
    }
    job.shared
        .claimed_slices
        .entry(agent.slice_id.clone())
        .or_insert_with(|| agent.session_id.clone());
    if let Err(error) = spawn_on(job, agent, &agent.slice_id, true).await {
        tracing::warn!(job_id = %job.job_id, agent_id = %agent.agent_id, %error, "session of a re-executed spawn not confirmed");
        answer["note"] = json!(format!("session not confirmed yet: {error}"));
    }
    answer
}

/// Calls `Worker.SpawnSession` for `agent` on `slice_id` of the agent's
/// worker (`agent.endpoint`).
pub(crate) async fn spawn_on(
    job: &JobContext,
    agent: &AgentEntry,
    slice_id: &str,
    resume: bool,
) -> Result<v1::SpawnSessionResponse, String> {
    let mut client = job.shared.worker_client(&agent.endpoint)?;
    let traceparent = mtswarm_telemetry::propagation::current_trace_headers()
        .and_then(|h| h.get(mtswarm_telemetry::propagation::TRACEPARENT).cloned())
        .unwrap_or_default();
    let request = v1::SpawnSessionRequest {
        job_id: job.job_id.clone(),
        agent_id: agent.agent_id.clone(),
        session_id: agent.session_id.clone(),
        slice_id: slice_id.to_string(),
        slice_selector: job.spec.slice_selector.clone(),
        role: agent.role.clone(),
        instructions: agent.instructions.clone(),
        kernel_dir: job.spec.kernel_dir.clone(),
        budgets: job.spec.budgets,
        model: job.spec.model.clone(),
        resume,
        auto_approve: job.spec.auto_approve,
        allow_shell: job.spec.allow_shell,
        traceparent,
    };
    client
        .spawn_session(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
}

// --------------------------------------------------------------- assign_task

struct AssignTask(Arc<JobContext>);

#[async_trait::async_trait]
impl Tool for AssignTask {
    tool_meta!(
        "assign_task",
        "Give a spawned agent a task: instructions plus a JSON object of parameters (e.g. {\"candidates\":[{...-D map...}]}). Returns the task id; results arrive through collect_result.",
        Risk::Low,
        false,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "agent":{"type":"string","description":"agent id from spawn_agent"},
            "instructions":{"type":"string","description":"what the agent must do"},
            "parameters":{"type":"object","description":"task parameters, e.g. {\"candidates\":[{\"MB\":64}]}"}
        },"required":["agent","instructions"],"additionalProperties":false})
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
        let key = call_key(ctx);
        let known = job
            .tasks()
            .values()
            .find(|t| t.assign_call_id == key)
            .cloned();
        if let Some(record) = known {
            let assignment = record.assignment.unwrap_or_default();
            return Ok(output(json!({
                "task_id": assignment.task_id, "agent": assignment.agent_id,
                "attempt": assignment.attempt,
            })));
        }
        let agent_id = text_arg(&args, "agent")
            .ok_or_else(|| ToolError::InvalidArgs("agent is required".into()))?;
        let instructions = text_arg(&args, "instructions")
            .ok_or_else(|| ToolError::InvalidArgs("instructions must not be empty".into()))?;
        let parameters = match args.get("parameters") {
            None | Some(Value::Null) => json!({}),
            Some(Value::Object(map)) => Value::Object(map.clone()),
            Some(other) => {
                return Err(ToolError::InvalidArgs(format!(
                    "parameters must be a JSON object, got {other}"
                )));
            }
        };
        let agent = job.agent(&agent_id).ok_or_else(|| {
            ToolError::InvalidArgs(format!(
                "no agent named {agent_id:?} in this job (spawn it first)"
            ))
        })?;
        if agent.cancelled {
            return Err(ToolError::InvalidArgs(format!(
                "agent {agent_id:?} was cancelled"
            )));
        }
        let task_id = task_id_for(&job.job_id, &key);
        let measure_baseline = first_on_its_slice_kind(job, &agent.slice_id).await;
        let task = v1::TaskAssignment {
            task_id: task_id.clone(),
            job_id: job.job_id.clone(),
            attempt: 1,
            agent_id: agent.agent_id.clone(),
            session_id: agent.session_id.clone(),
            worker_id: agent.worker_id.clone(),
            slice_id: agent.slice_id.clone(),
            instructions,
            kernel_dir: job.spec.kernel_dir.clone(),
            parameters_json: parameters.to_string(),
            budgets: job.spec.budgets,
            deadline: Some(prost_types::Timestamp::from(job.deadline)),
            // Set once the publish is acknowledged (see the module docs).
            assigned_at: None,
            resume_from_checkpoint: false,
            measure_baseline,
            result_token: job.shared.result_token(&job.job_id, &task_id, 1),
        };
        let record = v1::TaskRecord {
            assignment: Some(task.clone()),
            done: false,
            status: v1::TaskStatus::Unspecified as i32,
            assign_call_id: key,
            finished_at: None,
        };
        // Known before it is published, so even an instant result is accepted.
        job.results.register(&task_id, &agent.agent_id, 1);
        job.tasks().insert(task_id.clone(), record.clone());
        if let Err(error) = job.store_tasks(std::slice::from_ref(&record), 1).await {
            job.tasks().remove(&task_id);
            job.results.settle(
                &task_id,
                v1::TaskStatus::Failed,
                &format!("not recorded: {error}"),
            );
            return Err(ToolError::Failed(format!(
                "task not recorded in the job record: {error}"
            )));
        }
        if let Err(error) = job.publish_recorded(&task).await {
            job.results.settle(
                &task_id,
                v1::TaskStatus::Failed,
                &format!("not published: {error}"),
            );
            job.record_settled(std::slice::from_ref(&task_id), v1::TaskStatus::Failed)
                .await;
            return Err(ToolError::Failed(format!("task not published: {error}")));
        }
        Ok(output(
            json!({"task_id": task_id, "agent": agent.agent_id, "attempt": 1}),
        ))
    }
}

/// The kind of a slice, as far as baselines go: what its figures are
/// comparable with (`emulator/8`).
fn slice_kind(descriptor: &v1::SliceDescriptor) -> String {
    format!("{}/{}", descriptor.backend, descriptor.cores)
}

/// Whether a task for the agent on `slice_id` is the job's first on that
/// kind of slice, so its worker measures the tune.toml baseline first. Read
/// from the job's own task records (durable, so a leader restart does not
/// measure again) and the fleet's slice descriptors; a fleet that cannot be
/// read measures nothing (a missing speed-up, never a wrong one).
async fn first_on_its_slice_kind(job: &JobContext, slice_id: &str) -> bool {
    let workers = match job.shared.workers.list().await {
        Ok(workers) => workers,
        Err(error) => {
            tracing::warn!(%error, job_id = %job.job_id, "fleet not read; no baseline measured with this task");
            return false;
        }
    };
    let kinds: HashMap<String, String> = workers
        .iter()
        .flat_map(|w| w.value.slices.iter())
        .map(|d| (canonical_slice_id(&d.slice_id), slice_kind(d)))
        .collect();
    let Some(kind) = kinds.get(&canonical_slice_id(slice_id)) else {
        return false;
    };
    !job.tasks()
        .values()
        .filter_map(|t| t.assignment.as_ref())
        .any(|a| a.measure_baseline && kinds.get(&canonical_slice_id(&a.slice_id)) == Some(kind))
}

// ------------------------------------------------------------ collect_result

struct CollectResult(Arc<JobContext>);

#[async_trait::async_trait]
impl Tool for CollectResult {
    tool_meta!(
        "collect_result",
        "Wait for task results: of the given tasks, or of the given agents' tasks, or of every task. mode=all waits for all of them, mode=any for at least one not collected before; both return what is there when timeout_seconds passes.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "agents":{"type":"array","items":{"type":"string"}},
            "tasks":{"type":"array","items":{"type":"string"}},
            "mode":{"type":"string","enum":["any","all"]},
            "timeout_seconds":{"type":"number","minimum":0}
        },"additionalProperties":false})
    }
    fn normalize(&self, mut args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        // A single id where a list is expected, and numbers as strings.
        if let Some(map) = args.as_object_mut() {
            for key in ["agents", "tasks"] {
                if let Some(Value::String(one)) = map.get(key).cloned() {
                    map.insert(key.to_string(), json!([one]));
                }
            }
            if let Some(Value::String(text)) = map.get("timeout_seconds").cloned() {
                let seconds: f64 = text.trim().parse().map_err(|_| {
                    mtswarm_core::NormalizeError::invalid(format!(
                        "timeout_seconds {text:?} is not a number"
                    ))
                })?;
                map.insert("timeout_seconds".into(), json!(seconds));
            }
        }
        Ok(args)
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
        let config = &job.shared.config;
        let all = match args.get("mode").and_then(Value::as_str).unwrap_or("all") {
            "all" => true,
            "any" => false,
            other => {
                return Err(ToolError::InvalidArgs(format!(
                    "mode must be any or all, got {other:?}"
                )));
            }
        };
        let timeout = match args.get("timeout_seconds").and_then(Value::as_f64) {
            Some(s) if s.is_finite() && s >= 0.0 => {
                Duration::from_secs_f64(s).min(config.max_collect_timeout)
            }
            Some(s) => {
                return Err(ToolError::InvalidArgs(format!(
                    "timeout_seconds {s} is invalid"
                )));
            }
            None => config.default_collect_timeout,
        };
        let tasks = string_list(&args, "tasks");
        let agents = string_list(&args, "agents");
        let ids = if !tasks.is_empty() {
            if let Some(unknown) = tasks.iter().find(|t| !job.results.knows(t)) {
                return Err(ToolError::InvalidArgs(format!(
                    "no task {unknown:?} in this job"
                )));
            }
            tasks
        } else if !agents.is_empty() {
            let known = job.agents();
            if let Some(unknown) = agents.iter().find(|a| !known.contains_key(*a)) {
                return Err(ToolError::InvalidArgs(format!(
                    "no agent {unknown:?} in this job"
                )));
            }
            drop(known);
            job.results.task_ids(Some(&agents))
        } else {
            job.results.task_ids(None)
        };
        if ids.is_empty() {
            return Err(ToolError::InvalidArgs(
                "there are no tasks to collect (assign_task first)".into(),
            ));
        }
        let (views, timed_out) = job.results.collect(&ids, all, timeout).await;
        Ok(output(crate::digest::collect_summary(&views, timed_out)))
    }
}

// ------------------------------------------------------------ result_details

struct ResultDetails(Arc<JobContext>);

#[async_trait::async_trait]
impl Tool for ResultDetails {
    tool_meta!(
        "result_details",
        "Every candidate of the collected task results, one page at a time: params, status (benchmarked, screened, pruned, invalid, compile_failed, ...), figures and reason. Filter by task, agent or candidate status; page starts at 1.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "task":{"type":"string"},
            "agent":{"type":"string"},
            "status":{"type":"string"},
            "page":{"type":"integer","minimum":1},
            "page_size":{"type":"integer","minimum":1,"maximum":crate::digest::MAX_PAGE_SIZE}
        },"additionalProperties":false})
    }
    fn normalize(&self, mut args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        // Numbers as strings.
        if let Some(map) = args.as_object_mut() {
            for key in ["page", "page_size"] {
                if let Some(Value::String(text)) = map.get(key).cloned() {
                    let n: u64 = text.trim().parse().map_err(|_| {
                        mtswarm_core::NormalizeError::invalid(format!(
                            "{key} {text:?} is not a whole number"
                        ))
                    })?;
                    map.insert(key.to_string(), json!(n));
                }
            }
        }
        Ok(args)
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
        let task = text_arg(&args, "task");
        if let Some(task) = &task
            && !job.results.knows(task)
        {
            return Err(ToolError::InvalidArgs(format!(
                "no task {task:?} in this job"
            )));
        }
        let agent = text_arg(&args, "agent");
        if let Some(agent) = &agent
            && !job.agents().contains_key(agent)
        {
            return Err(ToolError::InvalidArgs(format!(
                "no agent {agent:?} in this job"
            )));
        }
        let status = text_arg(&args, "status");
        if let Some(status) = &status
            && mtswarm_bus::results::CandidateStatus::parse(status).is_none()
        {
            return Err(ToolError::InvalidArgs(format!(
                "unknown candidate status {status:?} (one of: {})",
                mtswarm_bus::results::CandidateStatus::ALL
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let number = |key: &str| {
            args.get(key)
                .and_then(Value::as_u64)
                .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
        };
        let query = crate::digest::DetailsQuery {
            task,
            agent,
            status,
            page: number("page"),
            page_size: number("page_size"),
        };
        Ok(output(crate::digest::details_page(
            &job.results.snapshot(),
            &query,
        )))
    }
}

// -------------------------------------------------------------- cancel_agent

struct CancelAgent(Arc<JobContext>);

async fn cancel_agent(job: &JobContext, agent_id: &str, reason: &str) -> Result<bool, ToolError> {
    let agent = job.agent(agent_id).ok_or_else(|| {
        ToolError::InvalidArgs(format!("no agent named {agent_id:?} in this job"))
    })?;
    let mut client = job
        .shared
        .worker_client(&agent.endpoint)
        .map_err(ToolError::Failed)?;
    let cancelled = client
        .cancel_session(v1::CancelSessionRequest {
            session_id: agent.session_id.clone(),
            reason: reason.to_string(),
        })
        .await
        .map(|r| r.into_inner().cancelled)
        .map_err(|status| {
            ToolError::Failed(format!("worker {}: {}", agent.worker_id, status.message()))
        });
    let updated = job.agents().get_mut(agent_id).map(|entry| {
        entry.cancelled = true;
        entry.clone()
    });
    if let Some(updated) = updated
        && let Err(error) = job.store_placement(&updated).await
    {
        tracing::warn!(%error, job_id = %job.job_id, agent_id, "cancellation not recorded");
    }
    job.shared
        .claimed_slices
        .remove_if(&agent.slice_id, |_, session| *session == agent.session_id);
    let mut settled = Vec::new();
    for task_id in job.results.task_ids(Some(&[agent_id.to_string()])) {
        if job.results.is_pending(&task_id) {
            settled.push(task_id.clone());
        }
        job.results.settle(
            &task_id,
            v1::TaskStatus::Cancelled,
            &format!("agent cancelled: {reason}"),
        );
    }
    job.record_settled(&settled, v1::TaskStatus::Cancelled)
        .await;
    cancelled
}

#[async_trait::async_trait]
impl Tool for CancelAgent {
    tool_meta!(
        "cancel_agent",
        "Stop an agent's session; its unfinished tasks count as cancelled.",
        Risk::Medium,
        false,
        false
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "agent":{"type":"string"},
            "reason":{"type":"string"}
        },"required":["agent"],"additionalProperties":false})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let agent = text_arg(&args, "agent")
            .ok_or_else(|| ToolError::InvalidArgs("agent is required".into()))?;
        let reason = text_arg(&args, "reason").unwrap_or_else(|| "cancelled by the leader".into());
        let cancelled = cancel_agent(&self.0, &agent, &reason).await?;
        Ok(output(json!({"agent": agent, "cancelled": cancelled})))
    }
}

// ----------------------------------------------------------------- read_file

struct ReadFile(Arc<JobContext>);

#[async_trait::async_trait]
impl Tool for ReadFile {
    tool_meta!(
        "read_file",
        "Read a text file of the job's kernel directory (path relative to it), e.g. tune.toml or kernel.c.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let relative = text_arg(&args, "path")
            .ok_or_else(|| ToolError::InvalidArgs("path is required".into()))?;
        let path = resolve_file(&self.0.kernel_dir, &relative).map_err(ToolError::InvalidArgs)?;
        let bytes = tokio::fs::read(&path)
            .await
            .map_err(|e| ToolError::Failed(format!("cannot read {relative}: {e}")))?;
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if text.len() > READ_FILE_LIMIT {
            let mut cut = READ_FILE_LIMIT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let total = text.len();
            text.truncate(cut);
            text.push_str(&format!("\n[... cut: {total} bytes in total]"));
        }
        Ok(ToolOutput::text(text))
    }
}

// ---------------------------------------------------------------- job_status

struct JobStatus(Arc<JobContext>);

#[async_trait::async_trait]
impl Tool for JobStatus {
    tool_meta!(
        "job_status",
        "The job's agents and the state of its tasks.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{},"additionalProperties":false})
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
        let agents: Vec<Value> = job
            .agent_list()
            .into_iter()
            .map(|a| {
                json!({"agent": a.agent_id, "slice_id": a.slice_id, "worker_id": a.worker_id,
                       "role": a.role, "cancelled": a.cancelled})
            })
            .collect();
        let (total, done) = job.results.counts();
        let pending = job.results.pending();
        let mut omitted = serde_json::Map::new();
        for (key, len) in [("agents", agents.len()), ("pending", pending.len())] {
            if len > STATUS_LIST_LIMIT {
                omitted.insert(key.to_string(), json!(len - STATUS_LIST_LIMIT));
            }
        }
        let agents: Vec<Value> = agents.into_iter().take(STATUS_LIST_LIMIT).collect();
        let pending: Vec<String> = pending.into_iter().take(STATUS_LIST_LIMIT).collect();
        Ok(output(json!({
            "job_id": job.job_id, "goal": crate::digest::short_goal(&job.spec.goal),
            "kernel_dir": job.spec.kernel_dir, "agents": agents, "tasks_total": total,
            "tasks_done": done, "pending": pending, "omitted": omitted,
        })))
    }
}
