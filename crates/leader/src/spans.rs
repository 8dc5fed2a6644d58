//! The leader's spans by the OpenTelemetry GenAI semantic conventions
//! v1.41.1 (the engine's `chat` and `execute_tool` spans come from
//! `mtswarm_core::TracingMiddleware`): one `invoke_workflow mtswarm.job`
//! span per job (below `SubmitJob`), the leader's own loop as
//! `invoke_agent leader` inside it, and `create_agent {agent}` (kind
//! CLIENT) around each `Worker.SpawnSession` call, whose trace context the
//! worker's session continues. Kept in one place so the names and the
//! attributes the conventions require are spelled once.

use tracing::Span;
use tracing::field::Empty;

/// `gen_ai.workflow.name` of a job.
pub(crate) const WORKFLOW_NAME: &str = "mtswarm.job";

/// The job's workflow span, a child of `parent`; `resumed` when a leader
/// takes over or restarts a job (its parent is then set from the stored
/// traceparent).
pub(crate) fn workflow_span(parent: &Span, job_id: &str, resumed: bool) -> Span {
    mtswarm_core::genai_span!(
        parent: parent,
        "invoke_workflow",
        kind: "internal",
        name: format_args!("invoke_workflow {WORKFLOW_NAME}"),
        gen_ai.workflow.name = WORKFLOW_NAME,
        job.id = %job_id,
        resumed,
    )
}

/// The leader loop of `job_id` as an agent invocation: `provider` and
/// `model` are those of the leader's model, the conversation is the
/// leader's session.
pub(crate) fn leader_agent_span(
    job_id: &str,
    session_id: &str,
    provider: &str,
    model: &str,
) -> Span {
    mtswarm_core::genai_span!(
        "invoke_agent",
        kind: "internal",
        name: format_args!("invoke_agent {}", crate::ids::LEADER_AGENT_ID),
        gen_ai.provider.name = %provider,
        gen_ai.agent.id = crate::ids::LEADER_AGENT_ID,
        gen_ai.agent.name = crate::ids::LEADER_AGENT_ID,
        gen_ai.conversation.id = %session_id,
        gen_ai.request.model = %model,
        job.id = %job_id,
    )
}

/// `create_agent {agent}` around a SpawnSession call. The provider is the
/// leader's best knowledge of the worker's model: `openai` when the job
/// names a model, else the builtin policy (a worker daemon with an
/// endpoint of its own may use it instead).
pub(crate) fn create_agent_span(
    job_id: &str,
    agent_id: &str,
    session_id: &str,
    model: Option<&mtswarm_bus::v1::ModelSettings>,
) -> Span {
    let named = model.filter(|m| !m.model.trim().is_empty() || !m.base_url.trim().is_empty());
    let provider = match named {
        Some(_) => "openai",
        None => mtswarm_core::BUILTIN_PROVIDER,
    };
    let span = mtswarm_core::genai_span!(
        "create_agent",
        kind: "client",
        name: format_args!("create_agent {agent_id}"),
        gen_ai.provider.name = provider,
        gen_ai.agent.id = %agent_id,
        gen_ai.agent.name = %agent_id,
        gen_ai.conversation.id = %session_id,
        gen_ai.request.model = Empty,
        job.id = %job_id,
    );
    if let Some(model) = named.filter(|m| !m.model.trim().is_empty()) {
        span.record("gen_ai.request.model", model.model.as_str());
    }
    span
}

/// Marks `span` failed: ERROR status with `message` and `error.type` `kind`.
pub(crate) fn record_failure(span: &Span, kind: &str, message: &str) {
    span.record("error.type", kind);
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", message);
}
