//! The GenAI client metrics of the OpenTelemetry semantic conventions
//! (`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`) for
//! every model call an engine makes, whichever [`ChatModel`] serves it:
//! the OpenAI-compatible client, a replayed cassette or a builtin policy.
//! It sits in the engine's middleware chain, so the engine itself stays
//! free of any meter; without a meter provider the recording is a no-op.
//!
//! [`ChatModel`]: mtswarm_core::ChatModel

use std::time::Instant;

use mtswarm_core::genai_spans::model_error_type;
use mtswarm_core::middleware::{BoxFuture, Middleware, ModelCallInput, ModelTurn, Next};
use mtswarm_core::model::ModelError;
use mtswarm_telemetry::metrics::{ModelCall, metrics};

/// Records the duration and token usage of each model call (including
/// the summarization requests of a compaction).
#[derive(Debug, Default, Clone, Copy)]
pub struct MetricsMiddleware;

impl MetricsMiddleware {
    /// The middleware.
    pub fn new() -> Self {
        Self
    }
}

impl Middleware for MetricsMiddleware {
    fn on_model_call<'a>(
        &'a self,
        input: ModelCallInput,
        next: Next<'a, ModelCallInput, Result<ModelTurn, ModelError>>,
    ) -> BoxFuture<'a, Result<ModelTurn, ModelError>> {
        Box::pin(async move {
            let provider = input.provider.clone();
            let model = input.model.clone();
            let started = Instant::now();
            let result = next.run(input).await;
            let (tokens, error_type) = match &result {
                Ok(turn) => (turn.usage.map(|u| (u.input_tokens, u.output_tokens)), None),
                Err(error) => (None, Some(model_error_type(error))),
            };
            metrics().model_call(ModelCall {
                provider: &provider,
                model: &model,
                duration: started.elapsed(),
                tokens,
                error_type,
            });
            result
        })
    }
}
