//! Tool `list_results`: a job's task results (one per task attempt), as
//! `mtswarm tasks JOB --json` prints them: what each agent measured and
//! reported, with its token usage.

use std::time::Duration;

use mtswarm_proto::v1;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::render;

/// How long the replay of a running job's events may stay quiet before
/// the answer holds what arrived (a finished job's stream ends by itself).
const RESULTS_IDLE: Duration = Duration::from_millis(750);

/// The job whose results to list.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListResults {
    /// The job's id.
    job_id: String,
    /// Only results with this status: ok, failed, cancelled, ... (empty: all).
    #[serde(default)]
    status: String,
}

#[tool_router(router = results_router, vis = "pub(super)")]
impl FarmServer {
    /// The job's task results so far.
    #[tool(
        description = "List a job's task results so far (one per task attempt): agent, slice, status, summary, the measured result (configuration, GFLOP/s, validation) and token usage."
    )]
    async fn list_results(&self, Parameters(request): Parameters<ListResults>) -> CallToolResult {
        reply(self.results(request).await)
    }
}

impl FarmServer {
    async fn results(&self, request: ListResults) -> Result<Value, ToolError> {
        let job = self.job_record(&request.job_id).await?;
        let final_state = matches!(
            job.state(),
            v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
        );
        let mut stream = self
            .control()
            .await?
            .watch_job(v1::WatchJobRequest {
                job_id: request.job_id.clone(),
                from_sequence: 0,
            })
            .await
            .map_err(ToolError::leader("reading the job's events"))?
            .into_inner();
        let wanted = request.status.trim().to_ascii_lowercase();
        let mut tasks = Vec::new();
        loop {
            let next = if final_state {
                stream.next().await
            } else {
                match tokio::time::timeout(RESULTS_IDLE, stream.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            let Some(item) = next else { break };
            let event = item.map_err(ToolError::leader("reading the job's events"))?;
            if let Some(v1::job_event::Event::TaskResult(result)) = event.event
                && (wanted.is_empty() || render::task_status(result.status()) == wanted)
            {
                tasks.push(render::task_result(&result));
            }
        }
        Ok(json!({
            "job_id": request.job_id,
            "state": render::job_state(job.state()),
            "count": tasks.len(),
            "tasks": tasks,
        }))
    }
}
