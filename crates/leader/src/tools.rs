//! The leader's tools: how the leader loop sees and drives the fleet.
//!
//! | tool | arguments | result (JSON text) |
//! |---|---|---|
//! | `list_fleet` | `selector?` (default: the job's) | `{"slices":[{slice_id, worker_id, board, cluster, cores, backend, state, session_id?}], "free": n, "workers": n}` |
//! | `spawn_agent` | `selector?`, `role?`, `instructions?`, `name?`, `slice_id?` | `{"agent", "session_id", "worker_id", "slice_id"}` |
//! | `assign_task` | `agent`, `instructions`, `parameters?` (object) | `{"task_id", "agent", "attempt"}` |
//! | `collect_result` | `agents?` or `tasks?` (default: every task), `mode?` any\|all, `timeout_seconds?` | `{"results":[{task_id, agent, attempt, status, summary, result, error, slice_id, worker_id}], "pending":[task ids], "timed_out"}` |
//! | `cancel_agent` | `agent`, `reason?` | `{"agent", "cancelled"}` |
//! | `read_file` | `path` (relative to the kernel dir) | the file's text |
//! | `job_status` | none | `{"job_id", "agents":[...], "tasks_total", "tasks_done", "pending":[...]}` |
//!
//! Task parameters are free-form JSON objects passed to the worker agent in
//! `TaskAssignment.parameters_json`; the builtin policies use
//! `{"candidates":[{"MB":64,"NB":256,...}, ...]}` (each candidate a `-D` map).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use mtswarm_bus::{subjects, v1};
use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use serde_json::{Value, json};

use crate::fleet::{parse_selector, read_fleet, state_name};
use crate::results::JobResults;
use crate::shared::Shared;
use crate::validate::resolve_file;

/// Largest file `read_file` returns in full; longer files are cut with a marker.
const READ_FILE_LIMIT: usize = 64 * 1024;

/// One agent the job spawned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    pub agent_id: String,
    pub session_id: String,
    pub worker_id: String,
    pub slice_id: String,
    pub endpoint: String,
    pub role: String,
    pub cancelled: bool,
}

/// Per-job state the tools work on.
pub(crate) struct JobContext {
    pub job_id: String,
    pub spec: v1::JobSpec,
    pub kernel_dir: PathBuf,
    pub shared: Arc<Shared>,
    pub results: Arc<JobResults>,
    pub agents: Mutex<BTreeMap<String, AgentEntry>>,
    pub deadline: SystemTime,
}

impl JobContext {
    fn agents(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AgentEntry>> {
        self.agents.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn agent_list(&self) -> Vec<AgentEntry> {
        self.agents().values().cloned().collect()
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
            let outcome = spawn_on(
                job,
                worker,
                descriptor,
                &agent_id,
                &session_id,
                &role,
                &instructions,
            )
            .await;
            // The claim lasts as long as the agent (released by cancel_agent,
            // which every job end calls), so this leader never places two
            // sessions on one slice whatever the lease shows meanwhile.
            if outcome.is_err() {
                shared.claimed_slices.remove(&descriptor.slice_id);
            }
            match outcome {
                Ok(response) => {
                    let slice_id = if response.slice_id.is_empty() {
                        descriptor.slice_id.clone()
                    } else {
                        response.slice_id.clone()
                    };
                    let worker_id = if response.worker_id.is_empty() {
                        worker.worker_id.clone()
                    } else {
                        response.worker_id.clone()
                    };
                    let entry = AgentEntry {
                        agent_id: agent_id.clone(),
                        session_id: session_id.clone(),
                        worker_id: worker_id.clone(),
                        slice_id: slice_id.clone(),
                        endpoint: worker.endpoint.clone(),
                        role: role.clone(),
                        cancelled: false,
                    };
                    job.agents().insert(agent_id.clone(), entry);
                    let recorded = agent_id.clone();
                    if let Err(error) = shared
                        .jobs
                        .modify(&job.job_id, |record| {
                            if !record.agent_ids.contains(&recorded) {
                                record.agent_ids.push(recorded.clone());
                            }
                        })
                        .await
                    {
                        tracing::warn!(%error, job_id = %job.job_id, "agent not recorded in the job record");
                    }
                    ctx.progress(format!("agent {agent_id} runs on {slice_id}"), Some(1.0));
                    return Ok(output(json!({
                        "agent": agent_id, "session_id": session_id,
                        "worker_id": worker_id, "slice_id": slice_id, "role": role,
                    })));
                }
                Err(refusal) => refusals.push(format!("{}: {refusal}", descriptor.slice_id)),
            }
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

async fn spawn_on(
    job: &JobContext,
    worker: &v1::WorkerRecord,
    descriptor: &v1::SliceDescriptor,
    agent_id: &str,
    session_id: &str,
    role: &str,
    instructions: &str,
) -> Result<v1::SpawnSessionResponse, String> {
    let mut client = job.shared.worker_client(&worker.endpoint)?;
    let traceparent = mtswarm_telemetry::propagation::current_trace_headers()
        .and_then(|h| h.get(mtswarm_telemetry::propagation::TRACEPARENT).cloned())
        .unwrap_or_default();
    let request = v1::SpawnSessionRequest {
        job_id: job.job_id.clone(),
        agent_id: agent_id.to_string(),
        session_id: session_id.to_string(),
        slice_id: descriptor.slice_id.clone(),
        slice_selector: job.spec.slice_selector.clone(),
        role: role.to_string(),
        instructions: instructions.to_string(),
        kernel_dir: job.spec.kernel_dir.clone(),
        budgets: job.spec.budgets,
        model: job.spec.model.clone(),
        resume: false,
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
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0;
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
        let agent = job.agents().get(&agent_id).cloned().ok_or_else(|| {
            ToolError::InvalidArgs(format!(
                "no agent named {agent_id:?} in this job (spawn it first)"
            ))
        })?;
        if agent.cancelled {
            return Err(ToolError::InvalidArgs(format!(
                "agent {agent_id:?} was cancelled"
            )));
        }
        let task_id = uuid::Uuid::now_v7().simple().to_string();
        let now = SystemTime::now();
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
            assigned_at: Some(prost_types::Timestamp::from(now)),
            resume_from_checkpoint: false,
        };
        // Known before it is published, so even an instant result is accepted.
        job.results.register(&task_id, &agent.agent_id, 1);
        // Runs inside the engine's tool span: the bus injects its context
        // into the task headers, so the worker's session continues the trace.
        if let Err(error) = job.shared.bus.publish_task(&task).await {
            job.results.settle(
                &task_id,
                v1::TaskStatus::Failed,
                &format!("not published: {error}"),
            );
            return Err(ToolError::Failed(format!("task not published: {error}")));
        }
        if let Err(error) = job
            .shared
            .jobs
            .modify(&job.job_id, |record| {
                record.tasks_total = record.tasks_total.saturating_add(1)
            })
            .await
        {
            tracing::warn!(%error, job_id = %job.job_id, "task count not updated");
        }
        Ok(output(
            json!({"task_id": task_id, "agent": agent.agent_id, "attempt": 1}),
        ))
    }
}

// ------------------------------------------------------------ collect_result

struct CollectResult(Arc<JobContext>);

fn status_name(status: v1::TaskStatus) -> &'static str {
    match status {
        v1::TaskStatus::Ok => "ok",
        v1::TaskStatus::Failed => "failed",
        v1::TaskStatus::Cancelled => "cancelled",
        v1::TaskStatus::Unspecified => "unknown",
    }
}

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
    fn normalize(&self, mut args: Value) -> Result<Value, String> {
        // A single id where a list is expected, and numbers as strings.
        if let Some(map) = args.as_object_mut() {
            for key in ["agents", "tasks"] {
                if let Some(Value::String(one)) = map.get(key).cloned() {
                    map.insert(key.to_string(), json!([one]));
                }
            }
            if let Some(Value::String(text)) = map.get("timeout_seconds").cloned() {
                let seconds: f64 = text
                    .trim()
                    .parse()
                    .map_err(|_| format!("timeout_seconds {text:?} is not a number"))?;
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
        let mut results = Vec::new();
        let mut pending = Vec::new();
        for view in views {
            match view.result {
                None => pending.push(json!(view.task_id)),
                Some(result) => {
                    let parsed: Value = if result.result_json.is_empty() {
                        Value::Null
                    } else {
                        serde_json::from_str(&result.result_json)
                            .unwrap_or_else(|_| json!(result.result_json))
                    };
                    results.push(json!({
                        "task_id": view.task_id, "agent": view.agent_id, "attempt": view.attempt,
                        "status": status_name(result.status()), "summary": result.summary,
                        "result": parsed, "error": result.error,
                        "slice_id": result.slice_id, "worker_id": result.worker_id,
                    }));
                }
            }
        }
        Ok(output(
            json!({"results": results, "pending": pending, "timed_out": timed_out}),
        ))
    }
}

// -------------------------------------------------------------- cancel_agent

struct CancelAgent(Arc<JobContext>);

async fn cancel_agent(job: &JobContext, agent_id: &str, reason: &str) -> Result<bool, ToolError> {
    let agent = job.agents().get(agent_id).cloned().ok_or_else(|| {
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
    if let Some(entry) = job.agents().get_mut(agent_id) {
        entry.cancelled = true;
    }
    job.shared
        .claimed_slices
        .remove_if(&agent.slice_id, |_, session| *session == agent.session_id);
    for task_id in job.results.task_ids(Some(&[agent_id.to_string()])) {
        job.results.settle(
            &task_id,
            v1::TaskStatus::Cancelled,
            &format!("agent cancelled: {reason}"),
        );
    }
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
        Ok(output(json!({
            "job_id": job.job_id, "goal": job.spec.goal, "kernel_dir": job.spec.kernel_dir,
            "agents": agents, "tasks_total": total, "tasks_done": done, "pending": pending,
        })))
    }
}
