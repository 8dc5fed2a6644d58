//! The engine's spans, named and attributed as the OpenTelemetry GenAI
//! semantic conventions v1.41.1 say (the GenAI spans document of
//! open-telemetry/semantic-conventions at that tag), so a trace backend's
//! GenAI views read the loop without a mapping of their own:
//!
//! - `chat {model}` (kind CLIENT) per model call: `gen_ai.operation.name`,
//!   `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.conversation.id`
//!   (the session id), usage, `gen_ai.response.finish_reasons` (the values
//!   of the conventions: `stop`, `tool_calls`, `length`, `content_filter`);
//! - `execute_tool {tool}` (INTERNAL) per tool call: `gen_ai.tool.name`,
//!   `gen_ai.tool.call.id`, `gen_ai.tool.type`;
//! - a failed call sets the span's status to ERROR with the error's text
//!   and `error.type` to a low-cardinality kind ([`model_error_type`],
//!   [`tool_error_type`]).
//!
//! `react.step` spans group one ReAct step; the conventions have no name for
//! it. Message content (prompts, answers, tool results) is recorded only when
//! the middleware is built with [`TracingMiddleware::with_message_content`]:
//! it may hold anything a user or a tool wrote. The agent span around a run
//! (`invoke_agent`) is opened by whoever runs the engine, which knows the
//! agent.

use tracing::Instrument;
use tracing::field::Empty;

use crate::middleware::{
    BoxFuture, Middleware, ModelCallInput, ModelTurn, Next, StepInfo, StepReport, ToolCallInfo,
    ToolCallOutcome,
};
use crate::model::{FinishReason, Message, ModelError, Role};
use crate::tool::{Risk, ToolError};

/// A GenAI span as the conventions shape every one of them, so each kind is
/// written once: span name and `gen_ai.operation.name` are `$operation`,
/// `otel.name` is `name:`, `otel.kind` is `kind:`, and the status and
/// `error.type` fields a failure records ([`TracingMiddleware`] for the
/// engine's calls; the daemons' own agent and workflow spans alike) start
/// empty; the operation's own fields follow. `parent:` as in
/// `tracing::info_span!`.
#[macro_export]
macro_rules! genai_span {
    (parent: $parent:expr, $operation:literal, kind: $kind:literal, name: $name:expr, $($fields:tt)*) => {
        ::tracing::info_span!(
            parent: $parent,
            $operation,
            otel.name = %$name,
            otel.kind = $kind,
            otel.status_code = ::tracing::field::Empty,
            otel.status_description = ::tracing::field::Empty,
            error.type = ::tracing::field::Empty,
            gen_ai.operation.name = $operation,
            $($fields)*
        )
    };
    // Without `parent:`, a child of the current span, as `info_span!` does.
    ($operation:literal, kind: $kind:literal, name: $name:expr, $($fields:tt)*) => {
        $crate::genai_span!(
            parent: &::tracing::Span::current(),
            $operation,
            kind: $kind,
            name: $name,
            $($fields)*
        )
    };
}

/// The version of the OpenTelemetry semantic conventions the spans follow.
pub const GENAI_SEMCONV_VERSION: &str = "1.41.1";

/// Opens `tracing` spans: `react.step` per step, `chat {model}` per model
/// call and `execute_tool {tool}` per tool call (see the module doc). Tool
/// and model spans are children of the step span; the run itself is inside
/// whatever span was current when it started. Bridging to OTLP is the
/// subscriber's job (`otel.name`, `otel.kind` and `otel.status_*` are the
/// fields tracing-opentelemetry reads).
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingMiddleware {
    capture_content: bool,
}

impl TracingMiddleware {
    /// Spans without message content (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Spans that also carry `gen_ai.input.messages`,
    /// `gen_ai.output.messages` and `gen_ai.tool.call.result` (the
    /// conventions' opt-in attributes) when `capture` is true.
    pub fn with_message_content(capture: bool) -> Self {
        Self {
            capture_content: capture,
        }
    }
}

fn risk_name(risk: Risk) -> &'static str {
    match risk {
        Risk::Low => "low",
        Risk::Medium => "medium",
        Risk::High => "high",
    }
}

/// `error.type` of a failed model call.
pub fn model_error_type(error: &ModelError) -> &'static str {
    match error {
        ModelError::PromptTooLong(_) => "prompt_too_long",
        ModelError::RateLimited(_) => "rate_limited",
        ModelError::Auth(_) => "auth",
        ModelError::BadRequest(_) => "bad_request",
        ModelError::Unavailable(_) => "unavailable",
        ModelError::Timeout(_) => "timeout",
        ModelError::Protocol(_) => "protocol",
        ModelError::Other(_) => "_OTHER",
    }
}

/// `error.type` of a failed tool call.
pub fn tool_error_type(error: &ToolError) -> &'static str {
    match error {
        ToolError::InvalidArgs(_) => "invalid_arguments",
        ToolError::Failed(_) => "tool_failed",
        ToolError::Timeout(_) => "timeout",
        ToolError::Cancelled => "cancelled",
    }
}

/// A finish reason as the conventions spell it.
pub fn finish_reason_name(finish: &FinishReason) -> &str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Other(other) => other,
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// The messages in the conventions' input-messages JSON shape (role and
/// parts: `text`, `tool_call`, `tool_call_response`).
fn input_messages_json(messages: &[Message]) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|message| {
            let mut parts = Vec::new();
            match (&message.role, &message.tool_call_id) {
                (Role::Tool, Some(id)) => parts.push(serde_json::json!({
                    "type": "tool_call_response", "id": id, "response": message.content,
                })),
                _ if !message.content.is_empty() => parts.push(serde_json::json!({
                    "type": "text", "content": message.content,
                })),
                _ => {}
            }
            for call in &message.tool_calls {
                parts.push(serde_json::json!({
                    "type": "tool_call", "id": call.id, "name": call.name,
                    "arguments": call.arguments,
                }));
            }
            serde_json::json!({"role": role_name(message.role), "parts": parts})
        })
        .collect();
    serde_json::Value::Array(messages).to_string()
}

/// The turn in the conventions' output-messages JSON shape.
fn output_messages_json(turn: &ModelTurn) -> String {
    let mut parts = Vec::new();
    if !turn.thinking.is_empty() {
        parts.push(serde_json::json!({"type": "reasoning", "content": turn.thinking}));
    }
    if !turn.text.is_empty() {
        parts.push(serde_json::json!({"type": "text", "content": turn.text}));
    }
    for call in &turn.tool_calls {
        parts.push(serde_json::json!({
            "type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments,
        }));
    }
    // The output-messages schema names the tool stop `tool_call`.
    let finish = match &turn.finish {
        Some(FinishReason::ToolCalls) => "tool_call",
        Some(other) => finish_reason_name(other),
        None => "stop",
    };
    serde_json::json!([{"role": "assistant", "parts": parts, "finish_reason": finish}]).to_string()
}

/// Marks `span` failed: ERROR status with `message`, and `error.type`.
fn record_error(span: &tracing::Span, kind: &str, message: &dyn std::fmt::Display) {
    span.record("error.type", kind);
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", tracing::field::display(message));
}

/// Runs the rest of the chain inside `span`, then lets `record` fill the
/// span's fields that only the output knows (usage, outcome, transition).
fn in_span<'a, I: Send + 'a, O: Send + 'a>(
    span: tracing::Span,
    input: I,
    next: Next<'a, I, O>,
    record: impl FnOnce(&tracing::Span, &O) + Send + 'a,
) -> BoxFuture<'a, O> {
    let inner = span.clone();
    Box::pin(
        async move {
            let output = next.run(input).await;
            record(&inner, &output);
            output
        }
        .instrument(span),
    )
}

impl Middleware for TracingMiddleware {
    fn on_step<'a>(
        &'a self,
        info: StepInfo,
        next: Next<'a, StepInfo, StepReport>,
    ) -> BoxFuture<'a, StepReport> {
        let span = tracing::info_span!(
            "react.step",
            session.id = %info.session_id,
            react.step = info.step,
            react.start_node = ?info.node,
            react.transition = Empty,
        );
        in_span(span, info, next, |span, report| {
            if let Some(reason) = report.reason {
                span.record("react.transition", tracing::field::debug(reason));
            }
        })
    }

    fn on_model_call<'a>(
        &'a self,
        input: ModelCallInput,
        next: Next<'a, ModelCallInput, Result<ModelTurn, ModelError>>,
    ) -> BoxFuture<'a, Result<ModelTurn, ModelError>> {
        let span = crate::genai_span!(
            "chat",
            kind: "client",
            name: format_args!("chat {}", input.model),
            gen_ai.provider.name = %input.provider,
            gen_ai.request.model = %input.model,
            gen_ai.conversation.id = %input.session_id,
            gen_ai.request.max_tokens = Empty,
            gen_ai.request.temperature = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.response.finish_reasons = Empty,
            gen_ai.input.messages = Empty,
            gen_ai.output.messages = Empty,
            react.step = input.step,
            react.summarization = input.summarization,
        );
        if let Some(max_tokens) = input.request.max_tokens {
            span.record("gen_ai.request.max_tokens", max_tokens);
        }
        if let Some(temperature) = input.request.temperature {
            span.record("gen_ai.request.temperature", f64::from(temperature));
        }
        if self.capture_content {
            span.record(
                "gen_ai.input.messages",
                input_messages_json(&input.request.messages),
            );
        }
        let capture = self.capture_content;
        in_span(span, input, next, move |span, result| match result {
            Ok(turn) => {
                if let Some(usage) = turn.usage {
                    span.record("gen_ai.usage.input_tokens", usage.input_tokens);
                    span.record("gen_ai.usage.output_tokens", usage.output_tokens);
                }
                if let Some(finish) = &turn.finish {
                    // One choice per turn: a one-element string[]; the
                    // telemetry crate's exporter turns the recorded string
                    // into the array the conventions type it as.
                    span.record("gen_ai.response.finish_reasons", finish_reason_name(finish));
                }
                if capture {
                    span.record("gen_ai.output.messages", output_messages_json(turn));
                }
            }
            Err(error) => record_error(span, model_error_type(error), error),
        })
    }

    fn on_tool_call<'a>(
        &'a self,
        info: ToolCallInfo,
        next: Next<'a, ToolCallInfo, ToolCallOutcome>,
    ) -> BoxFuture<'a, ToolCallOutcome> {
        let span = crate::genai_span!(
            "execute_tool",
            kind: "internal",
            name: format_args!("execute_tool {}", info.tool),
            gen_ai.tool.name = %info.tool,
            gen_ai.tool.call.id = %info.call_id,
            gen_ai.tool.type = "function",
            gen_ai.conversation.id = %info.session_id,
            gen_ai.tool.call.result = Empty,
            tool.risk = risk_name(info.risk),
            tool.lock_wait_ms = Empty,
            tool.ok = Empty,
            react.step = info.step,
        );
        let capture = self.capture_content;
        in_span(span, info, next, move |span, outcome| {
            if let Some(wait) = outcome.lock_wait {
                span.record(
                    "tool.lock_wait_ms",
                    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                );
            }
            span.record("tool.ok", outcome.result.is_ok());
            match &outcome.result {
                Ok(output) if capture => {
                    span.record("gen_ai.tool.call.result", output.content.as_str());
                }
                Ok(_) => {}
                Err(error) => record_error(span, tool_error_type(error), error),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    #[test]
    fn messages_take_the_conventions_shape() {
        let messages = vec![
            Message::system("be brief"),
            Message::assistant(
                "",
                vec![ToolCall {
                    id: "c1".into(),
                    name: "compile".into(),
                    arguments: "{}".into(),
                }],
            ),
            Message::tool("c1", "ok"),
        ];
        let json: serde_json::Value =
            serde_json::from_str(&input_messages_json(&messages)).unwrap_or_default();
        assert_eq!(json[0]["role"], "system");
        assert_eq!(json[0]["parts"][0]["content"], "be brief");
        assert_eq!(json[1]["parts"][0]["type"], "tool_call");
        assert_eq!(json[2]["parts"][0]["type"], "tool_call_response");
        assert_eq!(json[2]["parts"][0]["id"], "c1");
    }

    #[test]
    fn finish_reasons_use_the_conventions_spelling() {
        assert_eq!(finish_reason_name(&FinishReason::ToolCalls), "tool_calls");
        assert_eq!(
            finish_reason_name(&FinishReason::ContentFilter),
            "content_filter"
        );
    }
}
