//! A scripted OpenAI-compatible chat endpoint on a loopback port, for the
//! tests in which a "model" drives the leader's and a worker's loops over
//! real HTTP and real server-sent events.
//!
//! The test supplies the script: one function for the leader's requests
//! and one for the workers', each mapping a request body to the next
//! [`Turn`]. The endpoint tells the two apart by the tools offered (or, in
//! text tool mode, listed in the system message), refuses what a strict
//! chat template refuses (a system message after the first, two user or two
//! assistant messages in a row), and streams each turn the way servers do:
//! a role chunk, tool-call arguments or text in small pieces, the finish
//! reason, then a usage chunk. With `text_tools` it plays a server without
//! tool calling: calls arrive as a JSON block in the text.

use std::sync::{Arc, Mutex};

use axum::response::IntoResponse as _;
use serde_json::{Value, json};

/// Characters per streamed piece of tool-call arguments or call text: small,
/// so the client's reassembly is exercised.
const ARGUMENT_PIECE: usize = 7;
/// Prompt and completion tokens every turn reports in its usage chunk.
pub const PROMPT_TOKENS: u64 = 100;
/// See [`PROMPT_TOKENS`].
pub const COMPLETION_TOKENS: u64 = 20;

/// One scripted model turn.
#[derive(Debug, Clone)]
pub enum Turn {
    /// One tool call.
    Call {
        /// The tool.
        name: &'static str,
        /// Its arguments (streamed as JSON text in small pieces).
        arguments: Value,
    },
    /// A final text answer.
    Answer(String),
}

/// Which loop sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The leader's loop (offers `spawn_agent`).
    Leader,
    /// A worker agent's loop (offers `benchmark`).
    Worker,
    /// Neither: the endpoint answers 400.
    Unknown,
}

/// The script: the next turn for a request body.
pub type Script = fn(&Value) -> Turn;

// ------------------------------------------------------- request helpers

/// The request's messages.
pub fn messages(body: &Value) -> &[Value] {
    body.get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A message's role.
pub fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

/// A message's text (content parts joined).
pub fn content(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The names of the tools the request offers.
pub fn tool_names(body: &Value) -> Vec<String> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Which loop sent `body`: the leader offers `spawn_agent`, a worker
/// `benchmark` (in text tool mode the system message lists them).
pub fn caller_of(body: &Value) -> Caller {
    let names = tool_names(body);
    let system = messages(body)
        .first()
        .filter(|m| role(m) == "system")
        .map(content)
        .unwrap_or_default();
    let offers =
        |tool: &str| names.iter().any(|n| n == tool) || system.contains(&format!("\n- {tool}:"));
    if offers("spawn_agent") {
        Caller::Leader
    } else if offers("benchmark") {
        Caller::Worker
    } else {
        Caller::Unknown
    }
}

/// The tool results of the conversation, in order: `tool` messages, or in
/// text tool mode the `[tool result] call ID:` sections of user messages.
pub fn tool_results(body: &Value) -> Vec<String> {
    const MARK: &str = "[tool result] call ";
    let mut results = Vec::new();
    for message in messages(body) {
        match role(message) {
            "tool" => results.push(content(message)),
            "user" => {
                let text = content(message);
                for section in text.split(MARK).skip(1) {
                    let body = section.split_once('\n').map(|(_, b)| b).unwrap_or("");
                    let body = body.split("\n\n[session context]").next().unwrap_or(body);
                    results.push(body.trim_end().to_string());
                }
            }
            _ => {}
        }
    }
    results
}

/// The kernel directory the task message names (`.` when it names none).
pub fn kernel_dir(body: &Value) -> String {
    messages(body)
        .iter()
        .filter(|m| role(m) == "user")
        .map(content)
        .find_map(|text| {
            text.lines()
                .find_map(|line| line.trim().strip_prefix("Kernel directory:"))
                .map(|dir| dir.trim().to_string())
        })
        .unwrap_or_else(|| ".".to_string())
}

/// The artifact id of a compile result ("... as artifact b3 ...").
pub fn artifact_of(compile_result: &str) -> Option<String> {
    let rest = compile_result.split("as artifact ").nth(1)?;
    let id: String = rest
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    (!id.is_empty()).then_some(id)
}

/// The leader's first four turns of a one-agent job, by how many tool
/// results the request holds: list the fleet, spawn agent `a1` with
/// `spawn_instructions`, assign it `assign_instructions` with the candidate
/// `params` (2 cores, no warmup, one repeat), then collect its result
/// within `collect_seconds`. `None` from the fifth turn on: the test's own.
pub fn one_agent_opening(
    step: usize,
    spawn_instructions: &str,
    assign_instructions: &str,
    params: Value,
    collect_seconds: u64,
) -> Option<Turn> {
    let (name, arguments) = match step {
        0 => ("list_fleet", serde_json::json!({})),
        1 => (
            "spawn_agent",
            serde_json::json!({"name": "a1", "selector": "", "role": "tuner",
                               "instructions": spawn_instructions}),
        ),
        2 => (
            "assign_task",
            serde_json::json!({"agent": "a1", "instructions": assign_instructions,
                               "parameters": {"params": params, "cores": 2,
                                              "warmup": 0, "repeats": 1}}),
        ),
        3 => (
            "collect_result",
            serde_json::json!({"agents": ["a1"], "mode": "all",
                               "timeout_seconds": collect_seconds}),
        ),
        _ => return None,
    };
    Some(Turn::Call { name, arguments })
}

/// What a strict chat template says about `body`'s messages: `None` when
/// it renders them, else the error text such templates raise.
pub fn template_refusal(body: &Value) -> Option<String> {
    let messages = messages(body);
    if let Some(index) = messages.iter().skip(1).position(|m| role(m) == "system") {
        return Some(format!(
            "System message must be at the beginning (message {})",
            index + 1
        ));
    }
    for (index, pair) in messages.windows(2).enumerate() {
        let (a, b) = (role(&pair[0]), role(&pair[1]));
        if a == b && (a == "user" || a == "assistant") {
            return Some(format!(
                "Conversation roles must alternate user/assistant/user/assistant/... (messages {index} and {})",
                index + 1
            ));
        }
    }
    None
}

// ------------------------------------------------------------ the stream

/// The SSE events (without the `data: ` framing) of one streamed turn.
pub fn turn_chunks(turn: &Turn, request_index: usize, model: &str, text_tools: bool) -> Vec<Value> {
    let id = format!("chatcmpl-{request_index}");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000u64,
               "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    match turn {
        Turn::Call { name, arguments } if text_tools => {
            let text = format!(
                "I will call {name}.\n```json\n{}\n```",
                json!({"tool_calls": [{"name": name, "arguments": arguments}]})
            );
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(ARGUMENT_PIECE) {
                let piece: String = piece.iter().collect();
                chunks.push(chunk(json!({"content": piece}), Value::Null));
            }
            chunks.push(chunk(json!({}), json!("stop")));
        }
        Turn::Call { name, arguments } => {
            let call_id = format!("call_{request_index}_{name}");
            chunks.push(chunk(
                json!({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                       "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            ));
            let chars: Vec<char> = arguments.to_string().chars().collect();
            for piece in chars.chunks(ARGUMENT_PIECE) {
                let piece: String = piece.iter().collect();
                chunks.push(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    Value::Null,
                ));
            }
            chunks.push(chunk(json!({}), json!("tool_calls")));
        }
        Turn::Answer(text) => {
            let words: Vec<&str> = text.split_inclusive(' ').collect();
            for piece in words.chunks(4) {
                chunks.push(chunk(json!({"content": piece.concat()}), Value::Null));
            }
            chunks.push(chunk(json!({}), json!("stop")));
        }
    }
    chunks.push(json!({"id": id, "object": "chat.completion.chunk",
                       "created": 1_700_000_000u64, "model": model, "choices": [],
                       "usage": {"prompt_tokens": PROMPT_TOKENS,
                                 "completion_tokens": COMPLETION_TOKENS,
                                 "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS}}));
    chunks
}

// ---------------------------------------------------------- the endpoint

/// What the endpoint plays.
#[derive(Debug, Clone, Copy)]
pub struct ScriptedModel {
    /// The model name the turns carry.
    pub model: &'static str,
    /// The leader's script.
    pub leader: Script,
    /// The workers' script.
    pub worker: Script,
    /// Play a server without tool calling: `tools` ignored, calls as JSON
    /// text.
    pub text_tools: bool,
}

/// Every request body the endpoint answered, in arrival order, and what
/// its strict template refused.
struct Seen {
    script: ScriptedModel,
    requests: Mutex<Vec<Value>>,
    refused: Mutex<Vec<String>>,
}

/// The endpoint on a loopback port; stops when dropped.
pub struct ModelServer {
    /// The OpenAI base URL (`http://127.0.0.1:PORT/v1`).
    pub base_url: String,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl ModelServer {
    /// Serves `script` on a free loopback port.
    pub async fn start(script: ScriptedModel) -> ModelServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the model endpoint");
        let addr = listener.local_addr().expect("endpoint address");
        let seen = Arc::new(Seen {
            script,
            requests: Mutex::new(Vec::new()),
            refused: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                axum::routing::post(chat_completions),
            )
            .with_state(Arc::clone(&seen));
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                eprintln!("model endpoint: {error}");
            }
        });
        ModelServer {
            base_url: format!("http://{addr}/v1"),
            seen,
            task,
        }
    }

    /// Every request answered, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.seen
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The requests `caller` sent, in arrival order.
    pub fn requests_of(&self, caller: Caller) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| caller_of(r) == caller)
            .collect()
    }

    /// What the strict template refused.
    pub fn refusals(&self) -> Vec<String> {
        self.seen
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers one chat completion: the caller's next scripted turn as a real
/// SSE stream, one body chunk per event.
async fn chat_completions(
    axum::extract::State(seen): axum::extract::State<Arc<Seen>>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Some(refusal) = template_refusal(&parsed) {
        seen.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(refusal.clone());
        let message = json!({"error": {"message": refusal, "type": "BadRequestError"}});
        return (axum::http::StatusCode::BAD_REQUEST, axum::Json(message)).into_response();
    }
    let index = {
        let mut requests = seen.requests.lock().unwrap_or_else(|e| e.into_inner());
        requests.push(parsed.clone());
        requests.len()
    };
    let script = seen.script;
    let turn = match caller_of(&parsed) {
        Caller::Leader => (script.leader)(&parsed),
        Caller::Worker => (script.worker)(&parsed),
        Caller::Unknown => {
            let message = json!({"error": {"message": "unexpected request: no known tools offered",
                                           "type": "invalid_request_error"}});
            return (axum::http::StatusCode::BAD_REQUEST, axum::Json(message)).into_response();
        }
    };
    let events: Vec<Result<axum::body::Bytes, std::convert::Infallible>> =
        turn_chunks(&turn, index, script.model, script.text_tools)
            .into_iter()
            .map(|event| format!("data: {event}\n\n"))
            .chain(std::iter::once("data: [DONE]\n\n".to_string()))
            .map(|line| Ok(axum::body::Bytes::from(line)))
            .collect();
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/event-stream"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(futures::stream::iter(events)),
    )
        .into_response()
}
