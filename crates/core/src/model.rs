//! The boundary between the engine and whatever produces the next message:
//! a real model over HTTP, a builtin policy, or a script in a test.
//!
//! The engine only ever sees a [`ChatModel`]; it never knows whether a network
//! is involved. That is what keeps `mtswarm-core` pure and lets the builtin
//! policies exercise exactly the same loop as a real LLM.

use std::pin::Pin;

use futures::Stream;
use serde::{Deserialize, Serialize};

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions (the system prompt, injected context, summaries).
    System,
    /// The task and the engine's feedback.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// One tool call as the model produced it. `arguments` is the raw JSON text
/// the model wrote: it may be malformed, and the engine (not the model client)
/// decides what to do about that.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id (may be empty; the engine then gives it one).
    pub id: String,
    /// The tool.
    pub name: String,
    /// The raw JSON text of the arguments.
    pub arguments: String,
}

/// The tool name of a call a model client saw attempted but could not read
/// (text that looks like a tool call and does not parse as one). No tool
/// has this name: the engine answers such a call as a protocol error whose
/// text is the call's problem, on the path of arguments that are not JSON,
/// so the model learns what went wrong and tries again (within
/// `RecoveryConfig::max_protocol_retries` when nothing else was called).
pub const UNREADABLE_TOOL_CALL: &str = "unreadable_tool_call";

impl ToolCall {
    /// A call a client could not read, carrying `problem` (what was wrong
    /// and the shape expected) as its arguments `{"problem": ...}`, so the
    /// call stays valid JSON wherever the conversation is sent back.
    pub fn unreadable(id: impl Into<String>, problem: &str) -> Self {
        Self {
            id: id.into(),
            name: UNREADABLE_TOOL_CALL.to_owned(),
            arguments: serde_json::json!({ "problem": problem }).to_string(),
        }
    }

    /// The problem of a call made by [`ToolCall::unreadable`]; `None` for
    /// every other call.
    pub fn unreadable_problem(&self) -> Option<String> {
        if self.name != UNREADABLE_TOOL_CALL {
            return None;
        }
        let problem = serde_json::from_str::<serde_json::Value>(&self.arguments)
            .ok()
            .and_then(|v| v.get("problem").and_then(|p| p.as_str()).map(str::to_owned));
        Some(problem.unwrap_or_else(|| self.arguments.clone()))
    }
}

/// A chat message in the OpenAI-compatible shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// The text.
    #[serde(default)]
    pub content: String,
    /// Tool calls requested by an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// Appends `message` to `messages`, merged into the last one when both are
/// user messages or both assistant messages: chat templates that want
/// roles to alternate refuse such neighbours.
pub fn push_merged(messages: &mut Vec<Message>, message: Message) {
    if let Some(last) = messages.last_mut()
        && last.role == message.role
        && matches!(message.role, Role::User | Role::Assistant)
    {
        if !message.content.is_empty() {
            if !last.content.is_empty() {
                last.content.push_str("\n\n");
            }
            last.content.push_str(&message.content);
        }
        last.tool_calls.extend(message.tool_calls);
        return;
    }
    messages.push(message);
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::plain(Role::System, content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::plain(Role::User, content)
    }
    /// An assistant message, with the tool calls it requested.
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: content.into(),
            tool_calls,
            tool_call_id: None,
        }
    }
    /// The result of call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
        }
    }
    fn plain(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool as advertised to the model (OpenAI "function" tool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// How the model may use tools on this turn.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tools on this turn.
    None,
    /// Some tool must be called.
    Required,
    /// Force one named tool.
    Tool(String),
}

/// Everything a model needs for one turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    #[serde(default)]
    pub tools: Vec<ToolDefinition>,
    /// How it may use them.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// The output limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
}

/// Token usage reported by the model for one turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens sent to the model.
    pub input_tokens: u64,
    /// Tokens the model produced.
    pub output_tokens: u64,
}

/// Why the model stopped producing output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model finished its turn.
    Stop,
    /// The model stopped to have tools called.
    ToolCalls,
    /// The output limit was reached.
    Length,
    /// The provider filtered the output.
    ContentFilter,
    /// Any other reason, as the provider named it.
    Other(String),
}

/// One item of a streamed model turn. Tool calls arrive already assembled
/// (clients stitch together the per-chunk deltas of the wire protocol).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelEvent {
    /// Reasoning text ("thinking") that is not part of the answer.
    ThinkingDelta {
        /// The next piece of it.
        text: String,
    },
    /// A piece of the visible answer text.
    TextDelta {
        /// The next piece of it.
        text: String,
    },
    /// A complete tool call.
    ToolCall {
        /// The call.
        call: ToolCall,
    },
    /// Token usage (possibly several times per turn; they add up).
    Usage {
        /// The usage.
        usage: Usage,
    },
    /// The end of the turn.
    Finish {
        /// Why it ended.
        reason: FinishReason,
    },
}

/// Errors a model can report. The engine's recovery logic keys off the
/// variant, so clients must classify carefully (e.g. a 400 whose body says the
/// context length was exceeded is `PromptTooLong`, not `BadRequest`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ModelError {
    /// The prompt does not fit the context window (compaction may help).
    #[error("prompt too long for the model's context window: {0}")]
    PromptTooLong(String),
    /// The endpoint kept answering "rate limited".
    #[error("rate limited by the model endpoint (gave up after retries): {0}")]
    RateLimited(String),
    /// The endpoint rejected the credentials.
    #[error("model endpoint rejected the credentials: {0}")]
    Auth(String),
    /// The endpoint rejected the request.
    #[error("model endpoint rejected the request: {0}")]
    BadRequest(String),
    /// The endpoint could not be reached or failed.
    #[error("model endpoint unavailable: {0}")]
    Unavailable(String),
    /// No answer within the timeout (milliseconds).
    #[error("model call timed out after {0} ms")]
    Timeout(u64),
    /// The stream did not follow the protocol.
    #[error("malformed model stream: {0}")]
    Protocol(String),
    /// Anything else.
    #[error("model error: {0}")]
    Other(String),
}

/// A streamed model turn.
pub type ModelStream = Pin<Box<dyn Stream<Item = Result<ModelEvent, ModelError>> + Send>>;

/// The `gen_ai.provider.name` of models that run inside the process (the
/// builtin leader and worker policies, scripted and replayed models): no
/// provider of the conventions' list applies, so the value is this project's.
pub const BUILTIN_PROVIDER: &str = "mtswarm.builtin";

/// Anything that can take a turn in a conversation.
#[async_trait::async_trait]
pub trait ChatModel: Send + Sync {
    /// The model identifier reported in traces (`gen_ai.request.model`).
    fn model_name(&self) -> &str;

    /// Who serves the model, reported in traces as `gen_ai.provider.name`
    /// (OpenTelemetry GenAI conventions): `openai` for an OpenAI-compatible
    /// endpoint; the default, [`BUILTIN_PROVIDER`], for models that run in
    /// the process (the builtin policies, scripted and replayed models).
    fn provider_name(&self) -> &str {
        BUILTIN_PROVIDER
    }

    /// The context window the model is served with, in tokens, when it is
    /// known and may be smaller than the engine's configured window (a
    /// local server's slot). The engine keeps the conversation within the
    /// smaller of the two.
    fn context_window(&self) -> Option<u64> {
        None
    }

    /// Whether the model is a program that reads its whole conversation
    /// (the builtin worker policy): the engine then neither cuts tool results
    /// in the view it sends nor compacts the view. Such a program keeps
    /// its own account in the conversation (the candidates it built and
    /// measured, its budget spent); a summary or a cut result would lose
    /// it, and it would do the work again.
    fn reads_whole_conversation(&self) -> bool {
        false
    }

    /// Start one turn. Errors that happen before the first event are returned
    /// here; errors mid-stream arrive as `Err` items of the stream.
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError>;

    /// Start one turn from a request the caller keeps (the engine extends
    /// one request in place from turn to turn instead of rebuilding it).
    /// The default copies it into [`ChatModel::stream`]; clients that only
    /// read the request (to serialize it) should override this to skip the
    /// copy.
    async fn stream_shared(
        &self,
        request: std::sync::Arc<ChatRequest>,
    ) -> Result<ModelStream, ModelError> {
        self.stream(std::sync::Arc::unwrap_or_clone(request)).await
    }
}
