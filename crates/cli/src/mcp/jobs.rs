//! Tool `list_jobs`: the jobs the leader knows, optionally by state.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::common::{job_states, list_all_jobs};
use crate::render;

/// Which jobs to list.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListJobs {
    /// Only jobs in these states: queued, running, succeeded, failed,
    /// cancelled (empty: all).
    #[serde(default)]
    states: Vec<String>,
}

#[tool_router(router = jobs_router, vis = "pub(super)")]
impl FarmServer {
    /// Every job in the given states.
    #[tool(
        description = "List jobs (newest state first as the leader orders them), optionally only those in some states (queued, running, succeeded, failed, cancelled)."
    )]
    async fn list_jobs(&self, Parameters(request): Parameters<ListJobs>) -> CallToolResult {
        reply(self.list(request).await)
    }
}

impl ListJobs {
    /// The job states asked for, checked before the leader is asked.
    pub(super) fn states(&self) -> Result<Vec<i32>, ToolError> {
        job_states(&self.states).map_err(ToolError::Invalid)
    }
}

impl FarmServer {
    async fn list(&self, request: ListJobs) -> Result<Value, ToolError> {
        let states = request.states()?;
        let mut control = self.control().await?;
        let jobs: Vec<Value> = list_all_jobs(&mut control, &states)
            .await
            .map_err(ToolError::leader("listing jobs"))?
            .iter()
            .map(render::job)
            .collect();
        Ok(json!({ "count": jobs.len(), "jobs": jobs }))
    }
}
