//! Tool `list_jobs`: the jobs the leader knows, optionally by state.

use mtswarm_proto::v1;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::render;

/// Pages read at most (a runaway page token cannot loop forever).
const MAX_PAGES: usize = 1000;

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

impl FarmServer {
    async fn list(&self, request: ListJobs) -> Result<Value, ToolError> {
        let mut states = Vec::new();
        for name in &request.states {
            let state = render::parse_job_state(name).ok_or_else(|| {
                ToolError::Invalid(format!(
                    "unknown job state {name:?} (queued, running, succeeded, failed, cancelled)"
                ))
            })?;
            states.push(state as i32);
        }
        let mut control = self.control().await?;
        let mut jobs = Vec::new();
        let mut page_token = String::new();
        for _ in 0..MAX_PAGES {
            let page = control
                .list_jobs(v1::ListJobsRequest {
                    states: states.clone(),
                    page_size: 0,
                    page_token: page_token.clone(),
                })
                .await
                .map_err(ToolError::leader("listing jobs"))?
                .into_inner();
            jobs.extend(page.jobs.iter().map(render::job));
            if page.next_page_token.is_empty() || page.next_page_token == page_token {
                break;
            }
            page_token = page.next_page_token;
        }
        Ok(json!({ "count": jobs.len(), "jobs": jobs }))
    }
}
