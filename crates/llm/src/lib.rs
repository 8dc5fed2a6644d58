//! Chat models for mtswarm: an OpenAI-compatible streaming client and a
//! record/replay pair, all behind the engine's [`ChatModel`] trait, and
//! [`probe`], which tells whether an endpoint can drive mtswarm.
//!
//! The model types themselves (requests, events, errors) belong to
//! `mtswarm-core` and are re-exported here so users of this crate need only
//! one import path.
//!
//! ```no_run
//! use futures::StreamExt;
//! use mtswarm_llm::{ChatModel, ChatRequest, Message, ModelEvent, OpenAiClient, ToolChoice};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // MTSWARM_LLM_URL, MTSWARM_LLM_MODEL and (optionally) MTSWARM_LLM_API_KEY.
//! let model = OpenAiClient::from_env()?;
//! let request = ChatRequest {
//!     messages: vec![Message::user("Which tile size suits a 512x512 GEMM?")],
//!     tools: vec![],
//!     tool_choice: ToolChoice::Auto,
//!     max_tokens: Some(256),
//!     temperature: None,
//! };
//! let mut turn = model.stream(request).await?;
//! while let Some(event) = turn.next().await {
//!     if let ModelEvent::TextDelta { text } = event? {
//!         print!("{text}");
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod cassette;
pub mod fuzzing;
pub mod metrics;
pub mod openai;
pub mod probe;

pub use mtswarm_core::model::*;
/// A scripted [`ChatModel`] for tests, benchmarks and examples.
pub use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};

pub use cassette::{CassetteError, Exchange, Outcome, RecordingModel, ReplayModel, RequestCheck};
pub use metrics::MetricsMiddleware;
pub use openai::{ApiKey, ConfigError, OpenAiClient, OpenAiConfig, ToolMode};
