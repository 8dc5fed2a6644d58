//! Tool `get_job`: one job in full, with its outcome.

use mtswarm_proto::v1;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::render;

/// The job to show.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct GetJob {
    /// The job's id (from submit_job or list_jobs).
    job_id: String,
}

#[tool_router(router = job_router, vis = "pub(super)")]
impl FarmServer {
    /// The job's record as `mtswarm jobs JOB --json` prints it.
    #[tool(
        description = "Get one job: its state, spec, agents, task counts, and once it ended its outcome (best configuration, figures, tokens) or error."
    )]
    async fn get_job(&self, Parameters(request): Parameters<GetJob>) -> CallToolResult {
        reply(
            self.job_record(&request.job_id)
                .await
                .map(|job| render::job(&job)),
        )
    }
}

impl FarmServer {
    /// The leader's record of `job_id`.
    pub(super) async fn job_record(&self, job_id: &str) -> Result<v1::JobRecord, ToolError> {
        self.control()
            .await?
            .get_job(v1::GetJobRequest {
                job_id: job_id.to_string(),
            })
            .await
            .map_err(ToolError::leader("getting the job"))?
            .into_inner()
            .job
            .ok_or_else(|| ToolError::Other(anyhow::anyhow!("the leader answered without a job")))
    }
}
