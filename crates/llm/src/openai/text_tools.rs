//! Tool calls written in a reply's text. In the opt-in
//! [`ToolMode::Text`](super::ToolMode::Text) of an endpoint (servers
//! without native tool calling) the tools and a reply format are described
//! in the system message and the model writes its calls as JSON in its
//! text; in native mode a server may still return text where its tool
//! parser did not recognise the model's format. Either way the client reads
//! the calls out of the text (every shape real models write, see
//! `text_calls`) and hands them on as [`ModelEvent::ToolCall`]s; an
//! attempted call that does not read becomes an unreadable call the engine
//! answers as a protocol error. The engine then checks those calls exactly
//! as native ones (schema, allowlist, protocol-error retry): nothing here
//! trusts the text more than a native call.
//!
//! In text mode the conversation is rewritten into plain roles the server
//! understands: an assistant's earlier calls become their JSON object, a
//! tool result a user message naming its call, and neighbours of the same
//! role merge so strict templates still see alternating turns.

use mtswarm_core::model::{
    ChatRequest, FinishReason, Message, ModelError, ModelEvent, ModelStream, Role, ToolCall,
    ToolChoice, push_merged,
};
use serde_json::{Value, json};

use futures::StreamExt as _;

use super::text_calls::read_calls;

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
    text
}

/// What this turn must be, when the request says (`tool_choice`). It goes
/// at the end of the conversation, not in the system message: the system
/// message stays the same from turn to turn, so the server's prompt cache
/// keeps it, and the last words are the ones a small model heeds.
fn turn_instruction(choice: &ToolChoice) -> Option<String> {
    match choice {
        ToolChoice::Required => Some(
            "This turn you must call a tool: reply with only the JSON object of the call.".into(),
        ),
        ToolChoice::Tool(name) => Some(format!(
            "This turn you must call the tool `{name}`: reply with only the JSON object of the call."
        )),
        ToolChoice::None => Some("This turn, answer in text: call no tool.".into()),
        ToolChoice::Auto => None,
    }
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
                // A reply with an attempt that did not read keeps its text,
                // which is all the model wrote, its readable calls included.
                if !message
                    .tool_calls
                    .iter()
                    .any(|call| call.unreadable_problem().is_some())
                {
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(&calls_as_text(&message.tool_calls));
                }
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
    if let Some(turn) = turn_instruction(&request.tool_choice) {
        push_merged(&mut messages, Message::user(turn));
    }
    ChatRequest {
        messages,
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        max_tokens: request.max_tokens,
        temperature: request.temperature,
    }
}

/// The stream of a text-mode turn: text is held back until the turn ends,
/// then becomes tool calls (when `read_calls` and the text holds any, see
/// [`read_calls`]) or one text delta. A call attempt that does not read
/// keeps its text, so the conversation shows what the model wrote beside
/// the protocol error. Reasoning and usage pass straight through.
pub(crate) fn tool_calls_from_text(mut inner: ModelStream, read: bool) -> ModelStream {
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
        let calls = if read { read_calls(&text) } else { Vec::new() };
        if calls.is_empty() {
            if !text.is_empty() {
                yield Ok(ModelEvent::TextDelta { text });
            }
            if let Some(reason) = finish {
                yield Ok(ModelEvent::Finish { reason });
            }
            return;
        }
        if calls.iter().any(|call| call.unreadable_problem().is_some()) {
            yield Ok(ModelEvent::TextDelta { text });
        }
        for call in calls {
            yield Ok(ModelEvent::ToolCall { call });
        }
        yield Ok(ModelEvent::Finish { reason: FinishReason::ToolCalls });
    })
}

/// The stream of a native-mode turn that offered tools: everything passes
/// through as it comes, and when the server sent no `tool_calls` but the
/// text holds calls (a server whose tool parser does not know the model's
/// format), those calls follow the text, read as in text mode, and the
/// turn finishes for tool calls.
pub(crate) fn tool_calls_in_native_text(mut inner: ModelStream) -> ModelStream {
    Box::pin(async_stream::stream! {
        let mut text = String::new();
        let mut native_calls = false;
        let mut finish: Option<FinishReason> = None;
        while let Some(item) = inner.next().await {
            match item {
                Ok(ModelEvent::TextDelta { text: piece }) => {
                    text.push_str(&piece);
                    yield Ok(ModelEvent::TextDelta { text: piece });
                }
                Ok(ModelEvent::ToolCall { call }) => {
                    native_calls = true;
                    yield Ok(ModelEvent::ToolCall { call });
                }
                Ok(ModelEvent::Finish { reason }) => finish = Some(reason),
                Ok(other) => yield Ok(other),
                Err(error) => {
                    yield Err::<ModelEvent, ModelError>(error);
                    return;
                }
            }
        }
        let calls = if native_calls { Vec::new() } else { read_calls(&text) };
        if calls.is_empty() {
            if let Some(reason) = finish {
                yield Ok(ModelEvent::Finish { reason });
            }
            return;
        }
        for call in calls {
            yield Ok(ModelEvent::ToolCall { call });
        }
        yield Ok(ModelEvent::Finish { reason: FinishReason::ToolCalls });
    })
}

#[cfg(test)]
mod tests {
    use mtswarm_core::model::ToolDefinition;

    use super::*;

    /// The events `stream` yields, errors as text.
    fn drain(stream: ModelStream) -> Vec<Result<ModelEvent, String>> {
        futures::executor::block_on(
            stream
                .map(|item| item.map_err(|e| e.to_string()))
                .collect::<Vec<_>>(),
        )
    }

    fn turn(events: Vec<ModelEvent>) -> ModelStream {
        Box::pin(futures::stream::iter(events.into_iter().map(Ok)))
    }

    fn text(piece: &str) -> ModelEvent {
        ModelEvent::TextDelta {
            text: piece.to_owned(),
        }
    }

    fn finish(reason: FinishReason) -> ModelEvent {
        ModelEvent::Finish { reason }
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_text_mode_turn_becomes_calls_or_stays_text() {
        // A call cut across deltas, in a fence with prose before it.
        let pieces = [
            "I will validate.\n```json\n{\"name\": \"vali",
            "date\", \"arguments\": {}}\n```",
        ];
        let events = drain(tool_calls_from_text(
            turn(vec![
                text(pieces[0]),
                text(pieces[1]),
                finish(FinishReason::Stop),
            ]),
            true,
        ));
        assert_eq!(
            events,
            [
                Ok(ModelEvent::ToolCall {
                    call: call("text-call-1", "validate", "{}")
                }),
                Ok(finish(FinishReason::ToolCalls)),
            ]
        );
        // An answer passes as one delta; so does a call when reading is off
        // (a turn that must not call tools).
        let answer = "Best N=8.\n```json\n{\"best\": null, \"error\": \"none\"}\n```";
        for (body, read) in [
            (answer, true),
            ("{\"name\": \"a\", \"arguments\": {}}", false),
        ] {
            let events = drain(tool_calls_from_text(
                turn(vec![text(body), finish(FinishReason::Stop)]),
                read,
            ));
            assert_eq!(events, [Ok(text(body)), Ok(finish(FinishReason::Stop))]);
        }
        // An attempt that does not read keeps its text beside the call.
        let broken = "{\"name\": \"compile\", \"arguments\": {\"N\": 8}";
        let events = drain(tool_calls_from_text(
            turn(vec![text(broken), finish(FinishReason::Stop)]),
            true,
        ));
        assert_eq!(events[0], Ok(text(broken)));
        let Some(Ok(ModelEvent::ToolCall { call })) = events.get(1) else {
            panic!("{events:?}")
        };
        assert!(
            call.unreadable_problem()
                .is_some_and(|p| p.contains("not valid JSON"))
        );
    }

    #[test]
    fn a_native_turn_without_tool_calls_has_the_calls_of_its_text() {
        let hermes = "<tool_call>\n{\"name\": \"list_fleet\", \"arguments\": {}}\n</tool_call>";
        let usage = ModelEvent::Usage {
            usage: mtswarm_core::model::Usage {
                input_tokens: 3,
                output_tokens: 2,
            },
        };
        let events = drain(tool_calls_in_native_text(turn(vec![
            text(hermes),
            finish(FinishReason::Stop),
            usage.clone(),
        ])));
        assert_eq!(
            events,
            [
                Ok(text(hermes)),
                Ok(usage.clone()),
                Ok(ModelEvent::ToolCall {
                    call: call("text-call-1", "list_fleet", "{}")
                }),
                Ok(finish(FinishReason::ToolCalls)),
            ]
        );
        // Native calls are the turn's calls; the text is only text.
        let native = call("call_9", "read_file", r#"{"path":"tune.toml"}"#);
        let events = drain(tool_calls_in_native_text(turn(vec![
            text(hermes),
            ModelEvent::ToolCall {
                call: native.clone(),
            },
            finish(FinishReason::ToolCalls),
        ])));
        assert_eq!(
            events,
            [
                Ok(text(hermes)),
                Ok(ModelEvent::ToolCall { call: native }),
                Ok(finish(FinishReason::ToolCalls)),
            ]
        );
        // A final answer is left alone.
        let answer = "```json\n{\"best\": {\"gflops\": 2.5}}\n```";
        let events = drain(tool_calls_in_native_text(turn(vec![
            text(answer),
            finish(FinishReason::Stop),
        ])));
        assert_eq!(events, [Ok(text(answer)), Ok(finish(FinishReason::Stop))]);
    }

    /// A request offering `compile`, with `messages`.
    fn compile_request(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            messages,
            tools: vec![ToolDefinition {
                name: "compile".into(),
                description: "Builds a kernel.".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: ToolChoice::Auto,
            max_tokens: None,
            temperature: None,
        }
    }

    #[test]
    fn an_unreadable_attempt_is_shown_as_written_in_the_next_request() {
        let written = "{\"name\": \"compile\", \"arguments\": {";
        let request = compile_request(vec![
            Message::system("s"),
            Message::user("u"),
            Message::assistant(
                written,
                vec![ToolCall::unreadable(
                    "text-call-1",
                    "a tool call that is not valid JSON",
                )],
            ),
            Message::tool(
                "text-call-1",
                "error: protocol error: a tool call that is not valid JSON",
            ),
        ]);
        let plain = text_request(&request);
        assert_eq!(plain.messages[2].content, written);
        assert!(plain.messages[3].content.contains("protocol error"));
    }

    #[test]
    fn a_required_call_is_asked_for_at_the_end_and_the_system_message_stays_the_same() {
        let messages = vec![
            Message::system("You tune kernels."),
            Message::user("Tune vecadd."),
            Message::assistant("done", Vec::new()),
            Message::user("refused: assign a task first"),
        ];
        let free = text_request(&compile_request(messages.clone()));
        let required = text_request(&ChatRequest {
            tool_choice: ToolChoice::Required,
            ..compile_request(messages)
        });
        assert_eq!(required.messages[0], free.messages[0]);
        assert_eq!(required.messages.len(), free.messages.len());
        let last = &required.messages.last().expect("messages").content;
        assert!(
            last.starts_with("refused: assign a task first")
                && last.ends_with("reply with only the JSON object of the call."),
            "{last}"
        );
        assert_eq!(required.tool_choice, ToolChoice::Auto, "no native field");
    }

    #[test]
    fn requests_become_plain_alternating_roles_with_the_tools_described() {
        let request = compile_request(vec![
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
        ]);
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
        assert_eq!(read_calls(&plain.messages[2].content)[0].name, "compile");
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
