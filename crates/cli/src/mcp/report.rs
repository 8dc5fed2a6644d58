//! Tool `get_report`: the report of a job, as `mtswarm report` builds it
//! from the leader's record and the results store: a summary (counts by
//! status, best candidate, speed-up) and, on request, the HTML itself as
//! an embedded resource. Nothing is written on the server's disk.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::render;
use crate::report::job_report;

/// The job to report on.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct GetReport {
    /// The job's id.
    job_id: String,
    /// Also return the self-contained HTML report (an embedded
    /// `text/html` resource; it can be large).
    #[serde(default)]
    html: bool,
}

#[tool_router(router = report_router, vis = "pub(super)")]
impl FarmServer {
    /// The job's report summary, optionally with its HTML.
    #[tool(
        description = "Report on a job from its measured candidates: counts by status, the best configuration and its GFLOP/s, the baseline and speed-up, the job's outcome; with html=true also the full HTML report."
    )]
    async fn get_report(&self, Parameters(request): Parameters<GetReport>) -> CallToolResult {
        match self.report(&request).await {
            Ok((summary, html)) => {
                let mut result = reply(Ok(summary));
                if let Some(html) = html {
                    result.content.push(ContentBlock::resource(
                        ResourceContents::text(
                            html,
                            format!("mtswarm://jobs/{}/report.html", request.job_id),
                        )
                        .with_mime_type("text/html"),
                    ));
                }
                result
            }
            Err(error) => reply(Err(error)),
        }
    }
}

impl FarmServer {
    async fn report(
        &self,
        request: &GetReport,
    ) -> Result<(serde_json::Value, Option<String>), ToolError> {
        // The leader first: it decides whether this credential may read the job.
        let job = self.job_record(&request.job_id).await?;
        let records = crate::results::job_records(
            &job.job_id,
            &self.store.nats,
            self.store.nats_creds.clone(),
            &self.store.nats_security,
        )
        .await?;
        let report = job_report(&job, &records, None);
        let mut summary = serde_json::to_value(report.summary(None))
            .map_err(|error| ToolError::Other(error.into()))?;
        summary["state"] = json!(render::job_state(job.state()));
        summary["records"] = json!(records.len());
        summary["outcome"] = render::outcome(job.outcome.as_ref());
        let html = request.html.then(|| report.render_html());
        Ok((summary, html))
    }
}
