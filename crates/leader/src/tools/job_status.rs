//! `job_status`: the job's agents and the state of its tasks.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolEnv, output, parse_args};

/// Agents and pending tasks `job_status` lists at most.
pub(crate) const STATUS_LIST_LIMIT: usize = 32;

pub(super) struct JobStatus(pub(super) Arc<ToolEnv>);

/// `job_status` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobStatusArgs {}

/// What `job_status` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "job_status",
    "The job's agents and the state of its tasks.",
    schema_of::<JobStatusArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for JobStatus {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let JobStatusArgs {} = parse_args(args)?;
        let job = &self.0.job;
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
