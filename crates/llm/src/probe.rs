//! Can this endpoint drive mtswarm, and in which tool mode? [`probe`] asks
//! an OpenAI-compatible endpoint what the agents rely on, through the same
//! client the daemons use: the models list, a streamed tool call (native
//! `tool_calls` first, then, when the server returns none, the text tool
//! mode in which the model writes its calls in its reply), a tool result
//! sent back, several tool calls in one turn, and token usage in the
//! stream. The report names the tool mode that works ([`ProbeReport::tool_mode`]);
//! each check says whether it works and what mtswarm does about it when
//! it does not (`mtswarm llm check`).

use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_core::model::{
    ChatModel, ChatRequest, Message, ModelError, ModelEvent, ToolCall, ToolChoice, ToolDefinition,
};
use serde::Serialize;
use serde_json::json;

use crate::openai::{ConfigError, OpenAiClient, OpenAiConfig, TEXT_CALL_ID_PREFIX, ToolMode};

/// What is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// `GET /models` lists the model.
    ModelsList,
    /// A streamed turn calls an offered tool with valid JSON arguments in
    /// the server's `tool_calls` (native tool mode).
    ToolCalls,
    /// The model writes a call with valid JSON arguments in its reply when
    /// the tools are described in the system message (text tool mode);
    /// checked when native calls do not work.
    TextToolCalls,
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
            Self::ToolCalls => "native tool calls (tool_calls)",
            Self::TextToolCalls => "tool calls written in the reply (text tool mode)",
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
                "native tool mode cannot drive agents: use text tool mode when its row works, or enable tool calling on the server (vLLM: --enable-auto-tool-choice --tool-call-parser <parser>; llama.cpp: --jinja)"
            }
            Self::TextToolCalls => {
                "text tool mode cannot drive agents either: the model wrote no call that reads"
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

    /// Whether mtswarm can run jobs without it. Tool calls are needed in
    /// one mode or the other, which [`ProbeReport::tool_mode`] tells.
    pub fn required(self) -> bool {
        matches!(self, Self::ToolResults)
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
    /// The tool mode in which the model's calls arrive: native when the
    /// server returns `tool_calls`, else text when the model writes calls
    /// that read in text tool mode; `None` when neither works.
    pub tool_mode: Option<ToolMode>,
}

impl ProbeReport {
    /// True when tool calls work in some mode and every other capability
    /// mtswarm needs works.
    pub fn can_drive_mtswarm(&self) -> bool {
        self.tool_mode.is_some()
            && self
                .checks
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
/// made once each (no retries) with `timeout` per request. Tool calls are
/// asked for in native mode and, when the server returns none, in text
/// mode; the tool results and parallel calls are checked in the mode that
/// works (native when neither does).
pub async fn probe(
    mut config: OpenAiConfig,
    timeout: Duration,
) -> Result<ProbeReport, ConfigError> {
    config.max_retries = 0;
    config.request_timeout = timeout;
    let native = OpenAiClient::new(config.clone().with_tool_mode(ToolMode::Native))?;
    let text = OpenAiClient::new(config.with_tool_mode(ToolMode::Text))?;
    let model = native.config().model.clone();
    let mut prober = Prober {
        model: &model,
        usage_seen: false,
    };
    let mut checks = vec![prober.models_list(&native).await];
    let ask = vec![
        Message::system(SYSTEM),
        Message::user(format!("Call the tool `{PROBE_TOOL}` with n = 7.")),
    ];
    let (check, mut call, mut answered) = prober.tool_calls(&native, ToolMode::Native, &ask).await;
    let mut tool_mode = (check.verdict == Verdict::Works).then_some(ToolMode::Native);
    checks.push(check);
    if tool_mode.is_none() {
        let (check, text_call, text_answered) =
            prober.tool_calls(&text, ToolMode::Text, &ask).await;
        if check.verdict == Verdict::Works {
            tool_mode = Some(ToolMode::Text);
            call = text_call;
        }
        answered |= text_answered;
        checks.push(check);
    }
    let client = if tool_mode == Some(ToolMode::Text) {
        &text
    } else {
        &native
    };
    checks.push(prober.tool_results(client, ask, call).await);
    checks.push(prober.parallel_tool_calls(client).await);
    checks.push(prober.usage(answered));
    Ok(ProbeReport {
        endpoint: native.endpoint().to_owned(),
        model,
        checks,
        tool_mode,
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
    model: &'a str,
    usage_seen: bool,
}

impl Prober<'_> {
    /// A turn of the probe on `client`, its usage noted.
    async fn turn(
        &mut self,
        client: &OpenAiClient,
        request: ChatRequest,
    ) -> Result<Turn, ModelError> {
        let turn = turn(client, request).await?;
        self.usage_seen |= turn.usage;
        Ok(turn)
    }

    /// Whether `GET /models` lists the model.
    async fn models_list(&self, client: &OpenAiClient) -> Check {
        let model = self.model;
        match client.list_models().await {
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

    /// Whether a streamed turn asked by `ask` calls the probe tool in
    /// `mode` (`client` is of that mode); the check, the call (to answer
    /// next) and whether the turn was answered. In native mode a call the
    /// client read from the reply's text does not count: the server
    /// returned no `tool_calls`.
    async fn tool_calls(
        &mut self,
        client: &OpenAiClient,
        mode: ToolMode,
        ask: &[Message],
    ) -> (Check, Option<ToolCall>, bool) {
        let capability = match mode {
            ToolMode::Native => Capability::ToolCalls,
            ToolMode::Text => Capability::TextToolCalls,
        };
        let turn = match self
            .turn(client, request(ask.to_vec(), ToolChoice::Auto))
            .await
        {
            Ok(turn) => turn,
            Err(error) => {
                let check = Check::new(capability, Verdict::Failed, error.to_string());
                return (check, None, false);
            }
        };
        let valid = valid_calls(&turn);
        let from_text = |call: &&ToolCall| call.id.starts_with(TEXT_CALL_ID_PREFIX);
        let check = match valid.first() {
            Some(call) if mode == ToolMode::Native && from_text(call) => Check::new(
                capability,
                Verdict::Missing,
                format!(
                    "the server returned no tool_calls; the call was in the reply's text: {}({})",
                    call.name, call.arguments
                ),
            ),
            Some(call) => {
                let check = Check::new(
                    capability,
                    Verdict::Works,
                    format!("{}({})", call.name, call.arguments),
                );
                return (check, Some((*call).clone()), true);
            }
            None if turn.calls.is_empty() => Check::new(
                capability,
                Verdict::Missing,
                format!("answered in text instead: {:?}", excerpt(&turn.text)),
            ),
            None => Check::new(
                capability,
                Verdict::Missing,
                format!("calls without valid arguments: {:?}", turn.calls),
            ),
        };
        (check, None, true)
    }

    /// Whether the result of `call` (made in answer to `ask`) sent back is
    /// answered.
    async fn tool_results(
        &mut self,
        client: &OpenAiClient,
        ask: Vec<Message>,
        call: Option<ToolCall>,
    ) -> Check {
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
        match self.turn(client, request(messages, ToolChoice::None)).await {
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
    async fn parallel_tool_calls(&mut self, client: &OpenAiClient) -> Check {
        let parallel = vec![
            Message::system(SYSTEM),
            Message::user(format!(
                "In one reply, call the tool `{PROBE_TOOL}` twice: once with n = 1 and once with n = 2."
            )),
        ];
        match self.turn(client, request(parallel, ToolChoice::Auto)).await {
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
