//! Can this endpoint drive mtswarm? [`probe`] asks an OpenAI-compatible
//! endpoint what the agents rely on, through the same client the daemons
//! use: the models list, a streamed tool call, a tool result sent back,
//! several tool calls in one turn, and token usage in the stream. Each
//! check says whether it works and what mtswarm does about it when it does
//! not (`mtswarm llm check`).

use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_core::model::{
    ChatModel, ChatRequest, Message, ModelError, ModelEvent, ToolCall, ToolChoice, ToolDefinition,
};
use serde::Serialize;
use serde_json::json;

use crate::openai::{ConfigError, OpenAiClient, OpenAiConfig};

/// What is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// `GET /models` lists the model.
    ModelsList,
    /// A streamed turn calls an offered tool with valid JSON arguments.
    ToolCalls,
    /// A tool result sent back is answered.
    ToolResults,
    /// Several tool calls in one turn.
    ParallelToolCalls,
    /// Prompt and completion tokens reported in the stream.
    Usage,
}

impl Capability {
    /// What the capability is, for people.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ModelsList => "models list (GET /models)",
            Self::ToolCalls => "streamed tool calls",
            Self::ToolResults => "tool results sent back",
            Self::ParallelToolCalls => "parallel tool calls",
            Self::Usage => "token usage in the stream",
        }
    }

    /// What mtswarm does when the endpoint lacks it.
    pub fn without_it(self) -> &'static str {
        match self {
            Self::ModelsList => "nothing needed: the model name is sent as given",
            Self::ToolCalls => {
                "agents cannot act: enable tool calling on the server (vLLM: --enable-auto-tool-choice --tool-call-parser <parser>; llama.cpp: --jinja)"
            }
            Self::ToolResults => {
                "jobs stop after their first tool call: the server cannot take tool messages"
            }
            Self::ParallelToolCalls => "works: agents make one call per turn (more turns per job)",
            Self::Usage => {
                "works: tokens are estimated from text length, so token budgets are approximate"
            }
        }
    }

    /// Whether mtswarm can run jobs without it.
    pub fn required(self) -> bool {
        matches!(self, Self::ToolCalls | Self::ToolResults)
    }
}

/// How one check went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The endpoint does it.
    Works,
    /// The endpoint answered, without it.
    Missing,
    /// The request failed; the check could not tell.
    Failed,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub capability: Capability,
    /// How it went.
    pub verdict: Verdict,
    /// What was seen (the model ids, the calls, the error).
    pub detail: String,
}

/// Every check of one endpoint and model.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// The endpoint's chat-completions URL.
    pub endpoint: String,
    /// The model asked for.
    pub model: String,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl ProbeReport {
    /// True when every capability mtswarm needs works.
    pub fn can_drive_mtswarm(&self) -> bool {
        self.checks
            .iter()
            .all(|c| !c.capability.required() || c.verdict == Verdict::Works)
    }

    /// The check of `capability`, if it ran.
    pub fn check(&self, capability: Capability) -> Option<&Check> {
        self.checks.iter().find(|c| c.capability == capability)
    }
}

/// What one probing turn produced.
#[derive(Default)]
struct Turn {
    calls: Vec<ToolCall>,
    text: String,
    usage: bool,
}

const PROBE_TOOL: &str = "record_number";

fn probe_tool() -> ToolDefinition {
    ToolDefinition {
        name: PROBE_TOOL.to_owned(),
        description: "Records one integer.".to_owned(),
        parameters: json!({
            "type": "object",
            "properties": {"n": {"type": "integer", "description": "The number to record."}},
            "required": ["n"],
            "additionalProperties": false
        }),
    }
}

fn request(messages: Vec<Message>, tool_choice: ToolChoice) -> ChatRequest {
    ChatRequest {
        messages,
        tools: vec![probe_tool()],
        tool_choice,
        max_tokens: Some(256),
        temperature: Some(0.0),
    }
}

const SYSTEM: &str =
    "You check an API. Follow the user's instruction exactly, using the tools offered.";

async fn turn(client: &OpenAiClient, request: ChatRequest) -> Result<Turn, ModelError> {
    let mut stream = client.stream(request).await?;
    let mut turn = Turn::default();
    while let Some(event) = stream.next().await {
        match event? {
            ModelEvent::ToolCall { call } => turn.calls.push(call),
            ModelEvent::TextDelta { text } => turn.text.push_str(&text),
            ModelEvent::Usage { .. } => turn.usage = true,
            ModelEvent::ThinkingDelta { .. } | ModelEvent::Finish { .. } => {}
        }
    }
    Ok(turn)
}

/// The calls of `turn` to the probe tool whose arguments are a JSON object
/// with an integer `n`.
fn valid_calls(turn: &Turn) -> Vec<&ToolCall> {
    turn.calls
        .iter()
        .filter(|call| {
            call.name == PROBE_TOOL
                && serde_json::from_str::<serde_json::Value>(&call.arguments)
                    .ok()
                    .and_then(|args| args.get("n").and_then(serde_json::Value::as_i64))
                    .is_some()
        })
        .collect()
}

fn excerpt(text: &str) -> String {
    let trimmed = text.trim();
    match trimmed.char_indices().nth(120) {
        Some((cut, _)) => format!("{}...", &trimmed[..cut]),
        None => trimmed.to_owned(),
    }
}

/// Runs every check against `config`'s endpoint and model. Requests are
/// made once each (no retries) with `timeout` per request.
pub async fn probe(
    mut config: OpenAiConfig,
    timeout: Duration,
) -> Result<ProbeReport, ConfigError> {
    config.max_retries = 0;
    config.request_timeout = timeout;
    let client = OpenAiClient::new(config)?;
    let model = client.config().model.clone();
    let mut prober = Prober {
        client: &client,
        model: &model,
        usage_seen: false,
    };
    let models_list = prober.models_list().await;
    let ask = vec![
        Message::system(SYSTEM),
        Message::user(format!("Call the tool `{PROBE_TOOL}` with n = 7.")),
    ];
    let (tool_calls, call, answered) = prober.tool_calls(&ask).await;
    let tool_results = prober.tool_results(ask, call).await;
    let parallel_tool_calls = prober.parallel_tool_calls().await;
    let usage = prober.usage(answered);
    Ok(ProbeReport {
        endpoint: client.endpoint().to_owned(),
        model,
        checks: vec![
            models_list,
            tool_calls,
            tool_results,
            parallel_tool_calls,
            usage,
        ],
    })
}

impl Check {
    fn new(capability: Capability, verdict: Verdict, detail: impl Into<String>) -> Self {
        Self {
            capability,
            verdict,
            detail: detail.into(),
        }
    }
}

/// The checks of one endpoint and model, run in order; whether any turn
/// reported usage so far.
struct Prober<'a> {
    client: &'a OpenAiClient,
    model: &'a str,
    usage_seen: bool,
}

impl Prober<'_> {
    /// A turn of the probe, its usage noted.
    async fn turn(&mut self, request: ChatRequest) -> Result<Turn, ModelError> {
        let turn = turn(self.client, request).await?;
        self.usage_seen |= turn.usage;
        Ok(turn)
    }

    /// Whether `GET /models` lists the model.
    async fn models_list(&self) -> Check {
        let model = self.model;
        match self.client.list_models().await {
            Ok(models) if models.iter().any(|m| m == model) => Check::new(
                Capability::ModelsList,
                Verdict::Works,
                format!("{} models, {model} among them", models.len()),
            ),
            Ok(models) => Check::new(
                Capability::ModelsList,
                Verdict::Missing,
                format!(
                    "{model} not listed (listed: {})",
                    if models.is_empty() {
                        "none".to_owned()
                    } else {
                        excerpt(&models.join(", "))
                    }
                ),
            ),
            Err(error) => Check::new(Capability::ModelsList, Verdict::Failed, error.to_string()),
        }
    }

    /// Whether a streamed turn asked by `ask` calls the probe tool; the
    /// check, the call (to answer next) and whether the turn was answered.
    async fn tool_calls(&mut self, ask: &[Message]) -> (Check, Option<ToolCall>, bool) {
        let turn = match self.turn(request(ask.to_vec(), ToolChoice::Auto)).await {
            Ok(turn) => turn,
            Err(error) => {
                let check = Check::new(Capability::ToolCalls, Verdict::Failed, error.to_string());
                return (check, None, false);
            }
        };
        match valid_calls(&turn).first() {
            Some(call) => {
                let check = Check::new(
                    Capability::ToolCalls,
                    Verdict::Works,
                    format!("{}({})", call.name, call.arguments),
                );
                (check, Some((*call).clone()), true)
            }
            None => {
                let detail = if turn.calls.is_empty() {
                    format!("answered in text instead: {:?}", excerpt(&turn.text))
                } else {
                    format!("calls without valid arguments: {:?}", turn.calls)
                };
                let check = Check::new(Capability::ToolCalls, Verdict::Missing, detail);
                (check, None, true)
            }
        }
    }

    /// Whether the result of `call` (made in answer to `ask`) sent back is
    /// answered.
    async fn tool_results(&mut self, ask: Vec<Message>, call: Option<ToolCall>) -> Check {
        let Some(call) = call else {
            return Check::new(
                Capability::ToolResults,
                Verdict::Failed,
                "not checked: no tool call to answer",
            );
        };
        let id = if call.id.is_empty() {
            "call_probe".to_owned()
        } else {
            call.id.clone()
        };
        let mut messages = ask;
        messages.push(Message::assistant(
            "",
            vec![ToolCall {
                id: id.clone(),
                ..call
            }],
        ));
        messages.push(Message::tool(id, "recorded"));
        match self.turn(request(messages, ToolChoice::None)).await {
            Ok(reply) if reply.text.trim().is_empty() && reply.calls.is_empty() => Check::new(
                Capability::ToolResults,
                Verdict::Missing,
                "an empty reply to the tool result",
            ),
            Ok(reply) => Check::new(
                Capability::ToolResults,
                Verdict::Works,
                format!("replied {:?}", excerpt(&reply.text)),
            ),
            Err(error) => Check::new(Capability::ToolResults, Verdict::Failed, error.to_string()),
        }
    }

    /// Whether one turn makes several tool calls when asked to.
    async fn parallel_tool_calls(&mut self) -> Check {
        let parallel = vec![
            Message::system(SYSTEM),
            Message::user(format!(
                "In one reply, call the tool `{PROBE_TOOL}` twice: once with n = 1 and once with n = 2."
            )),
        ];
        match self.turn(request(parallel, ToolChoice::Auto)).await {
            Ok(turn) => {
                let valid = valid_calls(&turn).len();
                if valid >= 2 {
                    Check::new(
                        Capability::ParallelToolCalls,
                        Verdict::Works,
                        format!("{valid} calls in one turn"),
                    )
                } else {
                    Check::new(
                        Capability::ParallelToolCalls,
                        Verdict::Missing,
                        format!("{valid} call(s) in the turn"),
                    )
                }
            }
            Err(error) => Check::new(
                Capability::ParallelToolCalls,
                Verdict::Failed,
                error.to_string(),
            ),
        }
    }

    /// Whether any turn reported token usage; `answered`: whether the first
    /// turn was answered at all.
    fn usage(&self, answered: bool) -> Check {
        if self.usage_seen {
            Check::new(
                Capability::Usage,
                Verdict::Works,
                "usage chunks in the stream",
            )
        } else if answered {
            Check::new(
                Capability::Usage,
                Verdict::Missing,
                "no usage in any streamed turn",
            )
        } else {
            Check::new(
                Capability::Usage,
                Verdict::Failed,
                "not checked: no turn was answered",
            )
        }
    }
}
