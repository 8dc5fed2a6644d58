//! `assign_task`: give an agent a task, recorded before it is published; a
//! re-executed call returns the recorded task.

use std::sync::Arc;

use mtswarm_bus::results::canonical_slice_id;
use mtswarm_bus::v1;
use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use mtswarm_policy::plan::TaskPlan;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolEnv, given, output, parse_args};
use crate::fleet::parse_selector;
use crate::ids::{call_key, task_id_for};

pub(super) struct AssignTask(pub(super) Arc<ToolEnv>);

/// Arguments of `assign_task`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AssignTaskArgs {
    /// agent id from spawn_agent (default: the job's one agent, when it has one)
    #[serde(default)]
    agent: Option<String>,
    /// what the agent must do (default: compile, validate and benchmark the candidates)
    #[serde(default)]
    instructions: Option<String>,
    /// the task plan, e.g. {"candidates":[{"MB":64}], "search_budget": 8}
    #[serde(default)]
    parameters: Option<serde_json::Map<String, Value>>,
}

/// The call's parameters as the task's plan: a bare candidate lifted into
/// `params`, the space's example candidates when it names none (`true`
/// then), refused (naming the field) when it does not read as a plan or
/// its candidates name what the kernel's tuning space does not have.
fn checked_plan(
    job: &crate::job::JobContext,
    agent_id: &str,
    mut parameters: serde_json::Map<String, Value>,
) -> Result<(Value, bool), ToolError> {
    let space = job.space();
    let mut defaulted = false;
    if let Some(space) = space.as_deref() {
        crate::space::lift_bare_candidate(space, &mut parameters);
        // The seat and the candidates taken read every agent and task of
        // the job: only a plan without candidates needs them.
        if !crate::space::names_candidates(&parameters) {
            defaulted = crate::space::default_candidates(
                space,
                budget_share(job),
                seat_of(job, agent_id),
                &assigned_candidates(job),
                &mut parameters,
            );
        }
    }
    let parameters = Value::Object(parameters);
    let plan = TaskPlan::from_value(&parameters).map_err(|e| {
        ToolError::InvalidArgs(format!(
            "{e}. Nothing was assigned: call assign_task again with parameters {{\"candidates\": [{{...}}, ...], \"search_budget\": n}}"
        ))
    })?;
    if let Some(space) = space.as_deref() {
        crate::space::check_plan(space, &plan).map_err(ToolError::InvalidArgs)?;
    }
    Ok((parameters, defaulted))
}

/// An agent's share of the job's evaluation budget (none: unbounded).
fn budget_share(job: &crate::job::JobContext) -> Option<usize> {
    let total = job
        .spec
        .budgets
        .map(|b| b.max_evaluations)
        .filter(|n| *n > 0)?;
    let agents = job.spec.num_agents.max(1);
    usize::try_from(total.div_ceil(agents)).ok()
}

/// Where `agent_id` sits among the job's agents (sorted by id), out of as
/// many as the job asked for or has.
fn seat_of(job: &crate::job::JobContext, agent_id: &str) -> crate::space::Seat {
    let mut ids: Vec<String> = job.agent_list().into_iter().map(|a| a.agent_id).collect();
    ids.sort();
    let index = ids.iter().position(|id| id == agent_id).unwrap_or(0);
    let asked = usize::try_from(job.spec.num_agents).unwrap_or(1);
    crate::space::Seat {
        index,
        of: asked.max(ids.len()).max(index + 1),
    }
}

/// The candidates the job's tasks have been given so far (so a defaulted
/// plan gives another agent other ones).
fn assigned_candidates(job: &crate::job::JobContext) -> Vec<Value> {
    job.tasks()
        .values()
        .filter_map(|record| record.assignment.as_ref())
        .filter_map(|a| serde_json::from_str::<Value>(&a.parameters_json).ok())
        .filter_map(|plan| match plan.get("candidates") {
            Some(Value::Array(candidates)) => Some(candidates.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// What `assign_task` answers (a re-executed call the same): the task,
/// and the step that waits for its result.
fn assigned(task_id: &str, agent_id: &str, attempt: u32) -> ToolOutput {
    output(json!({
        "task_id": task_id, "agent": agent_id, "attempt": attempt,
        "next": format!("collect_result with agents [{agent_id:?}] and mode \"all\" waits for its result"),
    }))
}

/// The agent's unfinished task with these instructions and parameters
/// (any parameters, when the call named no candidate and had them
/// defaulted: a repeated call gets other defaults than the running task
/// took, and is the same call all the same).
fn running_twin(
    job: &crate::job::JobContext,
    agent_id: &str,
    parameters: &Value,
    defaulted: bool,
    instructions: &str,
) -> Option<v1::TaskAssignment> {
    job.tasks()
        .values()
        .filter(|record| !record.done)
        .filter_map(|record| record.assignment.as_ref())
        .find(|a| {
            a.agent_id == agent_id
                && a.instructions == instructions
                && (defaulted
                    || serde_json::from_str::<Value>(&a.parameters_json)
                        .ok()
                        .as_ref()
                        == Some(parameters))
        })
        .cloned()
}

/// A task's instructions when the call gives none.
const DEFAULT_INSTRUCTIONS: &str = "Compile, validate and benchmark the candidates of the task plan; report the fastest valid one.";

/// The job's agents that can take a task, for an error's next step.
fn live_agents(job: &crate::job::JobContext) -> Vec<String> {
    job.agent_list()
        .into_iter()
        .filter(|a| !a.cancelled)
        .map(|a| a.agent_id)
        .collect()
}

/// What to do instead of assigning to a missing or cancelled agent.
fn assign_instead(job: &crate::job::JobContext) -> String {
    let live = live_agents(job);
    if live.is_empty() {
        "the job has no agent yet: call spawn_agent first".into()
    } else {
        format!(
            "spawn_agent first, or assign to one of the job's agents: {}",
            live.join(", ")
        )
    }
}

/// The agent of a call that names none: the job's only live agent.
fn only_live_agent(job: &crate::job::JobContext) -> Result<String, ToolError> {
    match live_agents(job).as_slice() {
        [only] => Ok(only.clone()),
        _ => Err(ToolError::InvalidArgs(format!(
            "agent is required: {}",
            assign_instead(job)
        ))),
    }
}

/// What `assign_task` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "assign_task",
    "Give a spawned agent a task: instructions plus a JSON object of parameters (e.g. {\"candidates\":[{...-D map...}]}). Returns the task id; results arrive through collect_result.",
    schema_of::<AssignTaskArgs>,
)
.writes()
.concurrent();

#[async_trait::async_trait]
impl Tool for AssignTask {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, mut args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        if let Some(map) = args.as_object_mut() {
            let space = self.0.job.space();
            crate::space::shape_assign_args(space.as_deref(), map);
        }
        Ok(args)
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0.job;
        let key = call_key(ctx);
        let known = job
            .tasks()
            .values()
            .find(|t| t.assign_call_id == key)
            .cloned();
        if let Some(record) = known {
            let assignment = record.assignment.unwrap_or_default();
            return Ok(assigned(
                &assignment.task_id,
                &assignment.agent_id,
                assignment.attempt,
            ));
        }
        let args: AssignTaskArgs = parse_args(args)?;
        let agent_id = match given(args.agent) {
            Some(agent) => agent,
            None => only_live_agent(job)?,
        };
        let instructions = given(args.instructions).unwrap_or_else(|| DEFAULT_INSTRUCTIONS.into());
        let (parameters, defaulted) =
            checked_plan(job, &agent_id, args.parameters.unwrap_or_default())?;
        let agent = job.agent(&agent_id).ok_or_else(|| {
            ToolError::InvalidArgs(format!(
                "no agent named {agent_id:?} in this job: {}",
                assign_instead(job)
            ))
        })?;
        if agent.cancelled {
            return Err(ToolError::InvalidArgs(format!(
                "agent {agent_id:?} was cancelled: {}",
                assign_instead(job)
            )));
        }
        // The same task again while it runs (a small model repeats its
        // last call): nothing is published; the call waits for the running
        // task's result, as collect_result would, and answers with it.
        if let Some(twin) =
            running_twin(job, &agent.agent_id, &parameters, defaulted, &instructions)
        {
            let ids = [twin.task_id.clone()];
            let (views, timed_out) = job
                .results
                .collect(&ids, true, self.0.handles.default_collect_timeout)
                .await;
            let mut summary = crate::digest::collect_summary(&views, timed_out);
            summary["next"] = json!(super::collect_result::next_step(&summary));
            summary["note"] = json!(format!(
                "task {} was assigned already; nothing new was assigned: this is its result as collect_result gives it",
                twin.task_id
            ));
            return Ok(output(summary));
        }
        let task_id = task_id_for(&job.job_id, &key);
        let measure_baseline = first_on_its_slice_kind(&self.0, &agent.slice_id).await;
        let mut task = v1::TaskAssignment {
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
            // The job's evaluation budget reaches the task as its plan's
            // `search_budget` (split over the tasks), never as a budget.
            budgets: job.spec.budgets.map(|b| v1::Budgets {
                max_evaluations: 0,
                ..b
            }),
            deadline: Some(prost_types::Timestamp::from(job.deadline)),
            // Set once the publish is acknowledged (see the module docs).
            assigned_at: None,
            resume_from_checkpoint: false,
            measure_baseline,
            result_token: self.0.handles.keys.result_token(&job.job_id, &task_id, 1),
            grant: None,
        };
        task.grant = self.0.handles.keys.grant(&task, &agent.worker_key);
        let record = v1::TaskRecord {
            assignment: Some(task.clone()),
            done: false,
            status: v1::TaskStatus::Unspecified as i32,
            assign_call_id: key,
            finished_at: None,
            // Stamped by the owner's write (`OwnerWrites`).
            owner_epoch: 0,
        };
        // Known before it is published, so even an instant result is accepted.
        job.results.register(&task_id, &agent.agent_id, 1);
        job.tasks().insert(task_id.clone(), record.clone());
        if let Err(error) = job.store_tasks(std::slice::from_ref(&record), 0).await {
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
        // A confirming task is the leader's, not one of the job's.
        if !crate::ids::is_confirmation(&record) {
            self.0.spawning.count_tasks(job, 1).await;
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
        mtswarm_telemetry::metrics::metrics().task_assigned(&task.worker_id);
        let mut answer = assigned(&task_id, &agent.agent_id, 1);
        if defaulted && let Some(data) = answer.data.as_mut() {
            // What the agent was given, since the call named no candidate.
            data["candidates"] = parameters["candidates"].clone();
            answer.content = data.to_string();
        }
        Ok(answer)
    }
}

/// The kind of a slice, as far as baselines go: what its figures are
/// comparable with (`emulator/8`).
fn slice_kind(descriptor: &v1::SliceDescriptor) -> String {
    format!("{}/{}", descriptor.backend, descriptor.cores)
}

/// Whether a task for the agent on `slice_id` is the job's first on that
/// kind of slice, so its worker measures the tune.toml baseline. Read
/// from the job's own task records (durable, so a leader restart does not
/// measure again) and the fleet's slice descriptors; a fleet that cannot be
/// read measures nothing (a missing speed-up, never a wrong one). The
/// worker records come from the job's shared fleet view (one read serves a
/// turn of concurrent assignments).
async fn first_on_its_slice_kind(env: &ToolEnv, slice_id: &str) -> bool {
    let job = &env.job;
    let selector_text = job.spec.slice_selector.clone();
    let view = match parse_selector(&selector_text) {
        Ok(selector) => {
            env.spawning
                .view(env.placement(), &selector_text, selector.as_ref(), false)
                .await
        }
        Err(error) => {
            tracing::warn!(%error, job_id = %job.job_id, "job selector not readable; no baseline measured with this task");
            return false;
        }
    };
    let view = match view {
        Ok((view, _)) => view,
        Err(error) => {
            tracing::warn!(%error, job_id = %job.job_id, "fleet not read; no baseline measured with this task");
            return false;
        }
    };
    // The few tasks that measured a baseline are looked up in the fleet,
    // not every slice of it: a thousand assignments in one turn would
    // otherwise each index the whole fleet.
    let slices = || view.workers.iter().flat_map(|w| w.slices.iter());
    let kind_of = |slice: &str| {
        slices()
            .find(|d| d.slice_id == slice)
            .or_else(|| {
                let wanted = canonical_slice_id(slice);
                slices().find(|d| canonical_slice_id(&d.slice_id) == wanted)
            })
            .map(slice_kind)
    };
    let Some(kind) = kind_of(slice_id) else {
        return false;
    };
    let measured: Vec<String> = job
        .tasks()
        .values()
        .filter_map(|t| t.assignment.as_ref())
        .filter(|a| a.measure_baseline)
        .map(|a| a.slice_id.clone())
        .collect();
    !measured
        .iter()
        .any(|slice| kind_of(slice).as_ref() == Some(&kind))
}
