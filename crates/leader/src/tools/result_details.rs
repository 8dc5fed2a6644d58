//! `result_details`: one page of the collected candidates.

use std::sync::Arc;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::{ToolEnv, output, text_arg};

pub(super) struct ResultDetails(pub(super) Arc<ToolEnv>);

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
        let job = &self.0.job;
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
