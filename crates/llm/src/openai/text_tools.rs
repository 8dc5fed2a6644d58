//! Tool calls for servers without native tool calling (the opt-in
//! [`ToolMode::Text`](super::ToolMode::Text) of an endpoint). The tools
//! and a reply format are described in the system message; the model
//! answers a tool call as a JSON object in its text,
//! `{"tool_calls": [{"name": ..., "arguments": {...}}]}`; the client turns
//! that object back into [`ModelEvent::ToolCall`]s. The engine then checks
//! those calls exactly as native ones (schema, allowlist, protocol-error
//! retry): nothing here trusts the text more than a native call.
//!
//! The conversation is rewritten into plain roles the server understands:
//! an assistant's earlier calls become their JSON object, a tool result a
//! user message naming its call, and neighbours of the same role merge so
//! strict templates still see alternating turns.

use mtswarm_core::model::{
    ChatRequest, FinishReason, Message, ModelError, ModelEvent, ModelStream, Role, ToolCall,
    ToolChoice, push_merged,
};
use serde_json::{Value, json};

use futures::StreamExt as _;

/// The system-message part that describes the tools and the reply format.
fn tool_instructions(request: &ChatRequest) -> String {
    let mut text = String::from(
        "You can call tools. To call one or more, reply with nothing but a JSON object of this form \
         (a ```json fenced block is fine):\n\
         {\"tool_calls\": [{\"name\": \"TOOL\", \"arguments\": {...}}]}\n\
         The arguments must match the tool's JSON schema. Tool results come back in a user \
         message starting with [tool result]. To answer without calling a tool, reply in plain \
         text with no such object.\n\nTools:",
    );
    for tool in &request.tools {
        text.push_str(&format!(
            "\n- {}: {}\n  arguments schema: {}",
            tool.name, tool.description, tool.parameters
        ));
    }
    match &request.tool_choice {
        ToolChoice::Required => text.push_str("\nThis turn you must call a tool."),
        ToolChoice::Tool(name) => {
            text.push_str(&format!("\nThis turn you must call the tool `{name}`."))
        }
        ToolChoice::None => text.push_str("\nThis turn, answer in text: call no tool."),
        ToolChoice::Auto => {}
    }
    text
}

/// The JSON object an assistant's calls are written as.
fn calls_as_text(calls: &[ToolCall]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .map(|call| {
            let arguments: Value = serde_json::from_str(&call.arguments)
                .unwrap_or(Value::String(call.arguments.clone()));
            json!({"name": call.name, "arguments": arguments})
        })
        .collect();
    json!({ "tool_calls": calls }).to_string()
}

/// `request` in plain roles, with the tools described in the system
/// message instead of sent as `tools`.
pub(crate) fn text_request(request: &ChatRequest) -> ChatRequest {
    let mut messages: Vec<Message> = Vec::with_capacity(request.messages.len() + 1);
    let instructions = tool_instructions(request);
    for message in &request.messages {
        let plain = match message.role {
            Role::System => Message::system(message.content.clone()),
            Role::User => Message::user(message.content.clone()),
            Role::Assistant if message.tool_calls.is_empty() => {
                Message::assistant(message.content.clone(), Vec::new())
            }
            Role::Assistant => {
                let mut text = message.content.trim().to_owned();
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&calls_as_text(&message.tool_calls));
                Message::assistant(text, Vec::new())
            }
            Role::Tool => Message::user(format!(
                "[tool result] call {}:\n{}",
                message.tool_call_id.as_deref().unwrap_or("?"),
                message.content
            )),
        };
        push_merged(&mut messages, plain);
    }
    match messages.first_mut() {
        Some(first) if first.role == Role::System => {
            first.content.push_str("\n\n");
            first.content.push_str(&instructions);
        }
        _ => messages.insert(0, Message::system(instructions)),
    }
    ChatRequest {
        messages,
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        max_tokens: request.max_tokens,
        temperature: request.temperature,
    }
}

/// The candidates for the JSON object in `text`: the whole text, each
/// fenced block, and the span from the first `{` to the last `}`.
fn json_candidates(text: &str) -> Vec<&str> {
    let mut candidates = vec![text.trim()];
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let body_start = after.find('\n').map(|i| i + 1).unwrap_or(0);
        let Some(end) = after[body_start..].find("```") else {
            break;
        };
        candidates.push(after[body_start..body_start + end].trim());
        rest = &after[body_start + end + 3..];
    }
    if let (Some(open), Some(close)) = (text.find('{'), text.rfind('}'))
        && open < close
    {
        candidates.push(&text[open..=close]);
    }
    candidates
}

/// The tool calls a reply's text asks for, if it holds a `tool_calls`
/// object; ids are given in order (`text-call-1`, ...).
pub(crate) fn parse_tool_calls(text: &str) -> Option<Vec<ToolCall>> {
    for candidate in json_candidates(text) {
        let Ok(value) = serde_json::from_str::<Value>(candidate) else {
            continue;
        };
        let Some(calls) = value.get("tool_calls").and_then(Value::as_array) else {
            continue;
        };
        let parsed: Vec<ToolCall> = calls
            .iter()
            .enumerate()
            .map(|(index, call)| ToolCall {
                id: format!("text-call-{}", index + 1),
                name: call
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                // A missing or non-object `arguments` is passed on as is:
                // the engine's schema check names the problem to the model.
                arguments: call
                    .get("arguments")
                    .map(Value::to_string)
                    .unwrap_or_else(|| "{}".to_owned()),
            })
            .collect();
        if !parsed.is_empty() {
            return Some(parsed);
        }
    }
    None
}

/// The stream of a text-mode turn: text is held back until the turn ends,
/// then becomes tool calls (when it holds a `tool_calls` object) or one
/// text delta. Reasoning and usage pass straight through.
pub(crate) fn tool_calls_from_text(mut inner: ModelStream) -> ModelStream {
    Box::pin(async_stream::stream! {
        let mut text = String::new();
        let mut finish: Option<FinishReason> = None;
        while let Some(item) = inner.next().await {
            match item {
                Ok(ModelEvent::TextDelta { text: piece }) => text.push_str(&piece),
                Ok(ModelEvent::Finish { reason }) => finish = Some(reason),
                Ok(ModelEvent::ToolCall { call }) => {
                    // A server that does call tools natively after all.
                    yield Ok(ModelEvent::ToolCall { call });
                }
                Ok(other) => yield Ok(other),
                Err(error) => {
                    yield Err::<ModelEvent, ModelError>(error);
                    return;
                }
            }
        }
        match parse_tool_calls(&text) {
            Some(calls) => {
                for call in calls {
                    yield Ok(ModelEvent::ToolCall { call });
                }
                yield Ok(ModelEvent::Finish { reason: FinishReason::ToolCalls });
            }
            None => {
                if !text.is_empty() {
                    yield Ok(ModelEvent::TextDelta { text });
                }
                if let Some(reason) = finish {
                    yield Ok(ModelEvent::Finish { reason });
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use mtswarm_core::model::ToolDefinition;

    use super::*;

    #[test]
    fn calls_are_read_from_plain_fenced_and_embedded_json() {
        let plain =
            r#"{"tool_calls": [{"name": "compile", "arguments": {"defines": {"N": "8"}}}]}"#;
        let calls = parse_tool_calls(plain).expect("plain");
        assert_eq!(calls[0].name, "compile");
        assert_eq!(calls[0].arguments, r#"{"defines":{"N":"8"}}"#);
        let fenced = "I will validate.\n```json\n{\"tool_calls\": [{\"name\": \"validate\", \"arguments\": {}}, {\"name\": \"benchmark\", \"arguments\": {\"repeats\": 1}}]}\n```";
        let calls = parse_tool_calls(fenced).expect("fenced");
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["validate", "benchmark"]
        );
        assert_eq!(calls[1].id, "text-call-2");
        assert!(parse_tool_calls("The best is N=8 at 3.1 GFLOPS {not json}").is_none());
        assert!(parse_tool_calls(r#"{"answer": 1}"#).is_none());
    }

    #[test]
    fn requests_become_plain_alternating_roles_with_the_tools_described() {
        let request = ChatRequest {
            messages: vec![
                Message::system("You tune kernels."),
                Message::user("Tune vecadd."),
                Message::assistant(
                    "",
                    vec![ToolCall {
                        id: "c1".into(),
                        name: "compile".into(),
                        arguments: r#"{"kernel_dir":"vecadd"}"#.into(),
                    }],
                ),
                Message::tool("c1", "built as artifact b1"),
                Message::user("[session context] step 2"),
            ],
            tools: vec![ToolDefinition {
                name: "compile".into(),
                description: "Builds a kernel.".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Auto,
            max_tokens: None,
            temperature: None,
        };
        let plain = text_request(&request);
        assert!(plain.tools.is_empty());
        let roles: Vec<Role> = plain.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        assert!(
            plain.messages[0]
                .content
                .contains("- compile: Builds a kernel.")
        );
        assert_eq!(
            parse_tool_calls(&plain.messages[2].content).expect("calls")[0].name,
            "compile"
        );
        assert!(
            plain.messages[3]
                .content
                .starts_with("[tool result] call c1:\nbuilt")
        );
        assert!(
            plain.messages[3]
                .content
                .ends_with("[session context] step 2")
        );
    }
}
