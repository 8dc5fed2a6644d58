//! `assign_task`: give an agent a task, recorded before it is published; a
//! re-executed call returns the recorded task.

use std::collections::HashMap;
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
    /// agent id from spawn_agent
    agent: String,
    /// what the agent must do
    instructions: String,
    /// the task plan, e.g. {"candidates":[{"MB":64}], "search_budget": 8}
    #[serde(default)]
    parameters: Option<serde_json::Map<String, Value>>,
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
            return Ok(output(json!({
                "task_id": assignment.task_id, "agent": assignment.agent_id,
                "attempt": assignment.attempt,
            })));
        }
        let args: AssignTaskArgs = parse_args(args)?;
        let agent_id = given(Some(args.agent))
            .ok_or_else(|| ToolError::InvalidArgs("agent is required".into()))?;
        let instructions = given(Some(args.instructions))
            .ok_or_else(|| ToolError::InvalidArgs("instructions must not be empty".into()))?;
        let parameters = Value::Object(args.parameters.unwrap_or_default());
        // The worker reads the parameters as a task plan: one that does not
        // read is refused here, naming the field, before any task exists.
        TaskPlan::from_value(&parameters).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
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
    let kinds: HashMap<String, String> = view
        .workers
        .iter()
        .flat_map(|w| w.slices.iter())
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
