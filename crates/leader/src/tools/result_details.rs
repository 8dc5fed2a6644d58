//! `result_details`: one page of the collected candidates.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolEnv, given, output, parse_args};

pub(super) struct ResultDetails(pub(super) Arc<ToolEnv>);

/// Arguments of `result_details`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultDetailsArgs {
    /// only this task's candidates
    #[serde(default)]
    task: Option<String>,
    /// only this agent's candidates
    #[serde(default)]
    agent: Option<String>,
    /// only candidates of this status
    #[serde(default)]
    status: Option<String>,
    /// the page, from 1
    #[serde(default)]
    #[schemars(range(min = 1))]
    page: Option<u64>,
    /// candidates per page
    #[serde(default)]
    #[schemars(range(min = 1, max = crate::digest::MAX_PAGE_SIZE))]
    page_size: Option<u64>,
}

/// What `result_details` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "result_details",
    "Every candidate of the collected task results, one page at a time: params, status (benchmarked, screened, pruned, invalid, compile_failed, ...), figures and reason. Filter by task, agent or candidate status; page starts at 1.",
    schema_of::<ResultDetailsArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for ResultDetails {
    fn spec(&self) -> &ToolSpec {
        &SPEC
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
        let args: ResultDetailsArgs = parse_args(args)?;
        let job = &self.0.job;
        let task = given(args.task);
        if let Some(task) = &task
            && !job.results.knows(task)
        {
            return Err(ToolError::InvalidArgs(format!(
                "no task {task:?} in this job"
            )));
        }
        let agent = given(args.agent);
        if let Some(agent) = &agent
            && !job.agents().contains_key(agent)
        {
            return Err(ToolError::InvalidArgs(format!(
                "no agent {agent:?} in this job"
            )));
        }
        let status = given(args.status);
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
        let number = |n: Option<u64>| n.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let query = crate::digest::DetailsQuery {
            task,
            agent,
            status,
            page: number(args.page),
            page_size: number(args.page_size),
        };
        Ok(output(crate::digest::details_page(
            &job.results.snapshot(),
            &query,
        )))
    }
}
