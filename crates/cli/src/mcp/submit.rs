//! Tool `submit_job`: starts a tuning job, as `mtswarm submit` does.

use mtswarm_proto::v1;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::reply::{ToolError, reply};
use super::server::FarmServer;

/// The job to submit.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SubmitJob {
    /// What to achieve, e.g. "Make vecadd as fast as possible"; `@path`
    /// names a file of the kernel directory to attach.
    goal: String,
    /// Kernel directory, relative to the leader's kernel root (e.g. `vecadd`).
    kernel: String,
    /// Slices the job may use, e.g. "backend=emulator,cores>=8" (empty: any).
    #[serde(default)]
    selector: String,
    /// Number of worker agents (0: the leader decides).
    #[serde(default)]
    agents: u32,
    /// Maximum ReAct steps per loop (0: the leader's default).
    #[serde(default)]
    max_steps: u32,
    /// Maximum model tokens (0: unlimited).
    #[serde(default)]
    max_tokens: u64,
    /// Maximum board time in seconds (0: unlimited).
    #[serde(default)]
    device_seconds: f64,
    /// Maximum wall time of the job in seconds (0: the leader's default).
    #[serde(default)]
    wall_time_seconds: u64,
    /// Maximum candidate evaluations on hardware over the whole job (0: a
    /// tenth of the tuning space, at least 32).
    #[serde(default)]
    max_evaluations: u32,
    /// OpenAI-compatible model for the agents (absent: the daemons' model).
    #[serde(default)]
    model: Option<String>,
    /// Run medium-risk tools (benchmarks, edits) without asking for approval.
    #[serde(default)]
    auto_approve: bool,
    /// A retried submit with the same key returns the same job.
    #[serde(default)]
    idempotency_key: String,
}

#[tool_router(router = submit_router, vis = "pub(super)")]
impl FarmServer {
    /// Starts a job and returns its id and trace id.
    #[tool(
        description = "Submit a kernel tuning job to the farm. Returns {job_id, trace_id}; follow it with watch_job or get_job."
    )]
    async fn submit_job(&self, Parameters(job): Parameters<SubmitJob>) -> CallToolResult {
        reply(self.submit(job).await)
    }
}

impl SubmitJob {
    /// The request these arguments make, checked before the leader is asked.
    pub(super) fn request(self) -> Result<v1::SubmitJobRequest, ToolError> {
        let job = self;
        if job.goal.trim().is_empty() || job.kernel.trim().is_empty() {
            return Err(ToolError::Invalid("goal and kernel are required".into()));
        }
        if !job.device_seconds.is_finite() || job.device_seconds < 0.0 {
            return Err(ToolError::Invalid(
                "device_seconds must be a non-negative number".into(),
            ));
        }
        let spec = v1::JobSpec {
            goal: job.goal,
            kernel_dir: job.kernel,
            slice_selector: job.selector,
            budgets: Some(v1::Budgets {
                max_steps: job.max_steps,
                max_tokens: job.max_tokens,
                device_seconds: job.device_seconds,
                wall_time_seconds: job.wall_time_seconds,
                max_evaluations: job.max_evaluations,
            }),
            num_agents: job.agents,
            model: job.model.map(|model| v1::ModelSettings {
                model,
                ..Default::default()
            }),
            auto_approve: job.auto_approve,
            // The shell tool stays off: an outside agent asks for it through
            // the CLI, where a person sees the flag.
            allow_shell: false,
            approval_rules: Vec::new(),
        };
        Ok(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: job.idempotency_key,
        })
    }
}

impl FarmServer {
    async fn submit(&self, job: SubmitJob) -> Result<Value, ToolError> {
        let request = job.request()?;
        let response = self
            .control()
            .await?
            .submit_job(request)
            .await
            .map_err(ToolError::leader("submitting the job"))?
            .into_inner();
        Ok(json!({ "job_id": response.job_id, "trace_id": response.trace_id }))
    }
}
