//! The JSON shapes of the OpenAI chat-completions wire protocol: the request
//! body built from a [`ChatRequest`] and the streamed chunks the server sends.
//!
//! Chunk types are deliberately lenient (every field optional, unknown fields
//! ignored) because OpenAI-compatible servers differ in what they include.

use mtswarm_core::model::{ChatRequest, Message, ModelError, Role, ToolChoice};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Builds the `POST /chat/completions` body for a streamed turn, with the
/// endpoint's `extra` fields merged in: an extra field never replaces one
/// the request sets (the configuration refuses those names already).
pub(crate) fn request_body(
    model: &str,
    request: &ChatRequest,
    extra: &Map<String, Value>,
) -> Result<Value, ModelError> {
    let messages = request
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| message_json(index, message))
        .collect::<Result<Vec<Value>, ModelError>>()?;

    let mut body = Map::new();
    body.insert("model".into(), Value::String(model.to_string()));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), Value::Bool(true));
    body.insert("stream_options".into(), json!({ "include_usage": true }));

    // Servers reject `tool_choice` without `tools`, so both go together.
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        let choice = match &request.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Tool(name) => json!({ "type": "function", "function": { "name": name } }),
        };
        body.insert("tool_choice".into(), choice);
    }
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens".into(), json!(max_tokens));
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    for (field, value) in extra {
        body.entry(field.clone()).or_insert_with(|| value.clone());
    }
    Ok(Value::Object(body))
}

fn message_json(index: usize, message: &Message) -> Result<Value, ModelError> {
    Ok(match message.role {
        Role::System => json!({ "role": "system", "content": message.content }),
        Role::User => json!({ "role": "user", "content": message.content }),
        Role::Assistant => {
            let mut object = Map::new();
            object.insert("role".into(), json!("assistant"));
            // An assistant turn that only calls tools has `content: null` in
            // the OpenAI schema; some servers reject an empty string there.
            let content = if message.content.is_empty() && !message.tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(message.content.clone())
            };
            object.insert("content".into(), content);
            if !message.tool_calls.is_empty() {
                let calls: Vec<Value> = message
                    .tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": { "name": call.name, "arguments": call.arguments },
                        })
                    })
                    .collect();
                object.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(object)
        }
        Role::Tool => {
            let call_id = message.tool_call_id.as_deref().ok_or_else(|| {
                ModelError::BadRequest(format!(
                    "message {index} has role tool but no tool_call_id; the endpoint needs it to match the result to its call"
                ))
            })?;
            json!({ "role": "tool", "tool_call_id": call_id, "content": message.content })
        }
    })
}

/// One `data:` payload of the stream.
#[derive(Debug, Deserialize)]
pub(crate) struct Chunk {
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    /// Some servers report failures inside the stream instead of via status.
    #[serde(default)]
    pub error: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChunkChoice {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub delta: Option<Delta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    /// DeepSeek, Qwen and vLLM name the reasoning stream `reasoning_content`.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// OpenRouter and newer vLLM releases call it `reasoning`.
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ToolCallDelta {
    /// Position of the call in the turn; a few servers omit it.
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
}

/// The human-readable message of an OpenAI-style error body
/// (`{"error":{"message":..}}`, `{"error":"..."}`, `{"message":..}` or
/// `{"detail":..}`), or the trimmed body itself.
pub(crate) fn error_message(body: &str) -> String {
    let trimmed = body.trim();
    if let Ok(value) = serde_json::from_str::<Value>(trimmed)
        && let Some(message) = message_in(&value)
    {
        return message;
    }
    if trimmed.is_empty() {
        "(empty response body)".to_string()
    } else {
        truncate(trimmed, 2000)
    }
}

/// Finds the message inside an error value (either the whole body or the
/// `error` member of a chunk).
pub(crate) fn message_in(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Object(object) => {
            if let Some(inner) = object.get("error")
                && let Some(message) = message_in(inner)
            {
                return Some(message);
            }
            for key in ["message", "detail", "msg"] {
                if let Some(found) = object.get(key) {
                    return match found {
                        Value::String(text) => Some(text.clone()),
                        other => Some(other.to_string()),
                    };
                }
            }
            None
        }
        _ => None,
    }
}

/// Cuts `text` to at most `max_chars` characters, marking the cut.
pub(crate) fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// Whether a server message says the prompt did not fit the context window.
pub(crate) fn mentions_context_overflow(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    [
        "context length",
        "context_length",
        "maximum context",
        "context window",
        "too many tokens",
        "maximum model length",
        "prompt is too long",
        "exceeds the model",
        // llama.cpp's server: "request (8362 tokens) exceeds the available
        // context size (8192 tokens), try increasing it".
        "context size",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_core::model::{ToolCall, ToolDefinition};

    #[test]
    fn tool_message_without_call_id_is_rejected_with_its_position() {
        let mut orphan = Message::tool("x", "result");
        orphan.tool_call_id = None;
        let request = ChatRequest {
            messages: vec![Message::user("hi"), orphan],
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            max_tokens: None,
            temperature: None,
        };
        let err = request_body("m", &request, &Map::new()).unwrap_err();
        assert!(
            matches!(&err, ModelError::BadRequest(m) if m.contains("message 1")),
            "{err}"
        );
    }

    #[test]
    fn named_tool_choice_and_assistant_calls_use_openai_shapes() {
        let request = ChatRequest {
            messages: vec![Message::assistant(
                "",
                vec![ToolCall {
                    id: "c1".into(),
                    name: "f".into(),
                    arguments: "{}".into(),
                }],
            )],
            tools: vec![ToolDefinition {
                name: "f".into(),
                description: "d".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Tool("f".into()),
            max_tokens: Some(7),
            temperature: None,
        };
        let body = request_body("m", &request, &Map::new()).unwrap();
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(body["messages"][0]["content"], Value::Null);
        assert_eq!(
            body["messages"][0]["tool_calls"][0]["function"]["name"],
            "f"
        );
        assert_eq!(body["max_tokens"], 7);
        assert!(body.get("temperature").is_none());
    }

    #[test]
    fn extra_fields_are_merged_and_never_replace_what_the_request_sets() {
        let request = ChatRequest {
            messages: vec![Message::user("hi")],
            tools: vec![],
            tool_choice: ToolChoice::Auto,
            max_tokens: None,
            temperature: Some(0.25),
        };
        let extra = json!({
            "chat_template_kwargs": {"enable_thinking": false},
            "top_k": 20,
            // Refused by the configuration; were one to slip through, the
            // request's own value still wins.
            "model": "other",
            "stream": false,
            "temperature": 1.5,
        });
        let body = request_body("m", &request, extra.as_object().unwrap()).unwrap();
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(body["top_k"], 20);
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
        assert_eq!(body["messages"][0]["content"], "hi");
        assert_eq!(body["temperature"], 0.25);
    }

    #[test]
    fn error_messages_are_found_in_common_shapes() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad key"}}"#),
            "bad key"
        );
        assert_eq!(error_message(r#"{"object":"error","message":"m"}"#), "m");
        assert_eq!(error_message(r#"{"detail":"d"}"#), "d");
        assert_eq!(error_message("plain text"), "plain text");
        assert_eq!(error_message(""), "(empty response body)");
    }

    #[test]
    fn context_overflow_wording_is_recognised() {
        assert!(mentions_context_overflow(
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"
        ));
        assert!(mentions_context_overflow("Too many tokens in prompt"));
        assert!(mentions_context_overflow(
            "request (8362 tokens) exceeds the available context size (8192 tokens), try increasing it"
        ));
        assert!(!mentions_context_overflow("Invalid value for temperature"));
    }
}
