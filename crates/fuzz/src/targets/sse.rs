//! The OpenAI-compatible SSE stream of one turn, as the client reads a
//! response body: the event framing (`eventsource-stream`), the chunk
//! assembly of tool calls (interleaved indices, pieces of names and
//! arguments), the stream's end, and the tool calls read from a reply's
//! text in both tool modes. The input is the body; it is fed whole, in
//! pieces of pseudo-random sizes and, when short, a byte at a time: how a
//! transport splits a body must not change what the turn is.

use std::cell::RefCell;
use std::hash::{DefaultHasher, Hash, Hasher};

use mtswarm_core::model::{ModelError, ModelEvent};
use mtswarm_llm::fuzzing::{TurnMode, sse_turn};

use crate::{Checked, Outcome, Target, Violation};

pub(super) const TARGET: Target = Target {
    name: "sse",
    about: "OpenAI-compatible SSE stream and tool-call assembly (crates/llm/src/openai)",
    check,
    dictionary: &[
        b"data: ",
        b"data: [DONE]\n\n",
        b"\n\n",
        b"event: error\n",
        b": keep-alive\n",
        b"\"choices\":[{\"index\":0,\"delta\":{",
        b"\"tool_calls\":[{\"index\":1,",
        b"\"tool_calls\":[{\"id\":\"c9\",\"function\":{\"name\":\"run\"}}]",
        b"\"function\":{\"arguments\":\"{\\\"x\\\":\"}",
        b"\"finish_reason\":\"tool_calls\"",
        b"\"finish_reason\":\"stop\"",
        b"\"content\":\"<tool_call>{\\\"name\\\":\\\"run\\\",\\\"arguments\\\":{}}</tool_call>\"",
        b"\"reasoning_content\":\"",
        b"\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}",
        b"\"error\":{\"message\":\"rate limit\"}",
        b"\xc3\xa9",
        b"\xe2\x82",
        b"\r\n",
    ],
    seeds: crate::no_seeds,
    // Generated bodies stay at 32 KiB: reading costs a few microseconds a
    // line, and the test suite's debug build holds each input to 3 s. The
    // corpus has larger ones (a 200 KB line).
    max_len: 32 * 1024,
};

/// Longest error message a turn may end with.
const MAX_ERROR_BYTES: usize = 4096;

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn turn(
    chunks: Vec<Vec<u8>>,
    mode: TurnMode,
) -> Result<Vec<Result<ModelEvent, ModelError>>, Violation> {
    RUNTIME.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Violation(format!("cannot start a runtime: {e}")))?;
            *slot = Some(runtime);
        }
        match slot.as_ref() {
            Some(runtime) => Ok(runtime.block_on(sse_turn(chunks, mode))),
            None => Err(Violation("no runtime".into())),
        }
    })
}

/// `body` in pieces whose sizes come from a generator seeded by the body.
fn split(body: &[u8], max_piece: usize) -> Vec<Vec<u8>> {
    let mut hasher = DefaultHasher::new();
    body.hash(&mut hasher);
    let mut state = hasher.finish() | 1;
    let mut pieces = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let size = (state as usize % max_piece + 1).min(rest.len());
        pieces.push(rest[..size].to_vec());
        rest = &rest[size..];
    }
    pieces
}

/// What a turn came to, comparable across splits: its events (generated
/// call ids blanked), and its error's variant when it ended in one.
#[derive(Debug, PartialEq)]
struct Turn {
    events: Vec<ModelEvent>,
    error: Option<String>,
}

fn summarize(items: Vec<Result<ModelEvent, ModelError>>) -> Result<Turn, Violation> {
    let mut events = Vec::new();
    let mut error = None;
    for item in items {
        if let Some(e) = &error {
            return Err(Violation(format!("an item followed the turn's error {e}")));
        }
        match item {
            Ok(ModelEvent::ToolCall { mut call }) => {
                if call.id.starts_with("call_") {
                    call.id = "call_".into();
                }
                events.push(ModelEvent::ToolCall { call });
            }
            Ok(event) => events.push(event),
            Err(e) => {
                let message = e.to_string();
                if message.len() > MAX_ERROR_BYTES {
                    return Err(Violation(format!(
                        "the turn ended with an error of {} bytes: {}...",
                        message.len(),
                        message.chars().take(200).collect::<String>()
                    )));
                }
                error = Some(variant(&e));
            }
        }
    }
    Ok(Turn { events, error })
}

fn variant(error: &ModelError) -> String {
    let debug = format!("{error:?}");
    debug.split('(').next().unwrap_or_default().to_string()
}

fn signature(turn: &Turn, mode: TurnMode) -> String {
    let mut kinds: Vec<&str> = Vec::new();
    for event in &turn.events {
        let kind = match event {
            ModelEvent::TextDelta { .. } => "text",
            ModelEvent::ThinkingDelta { .. } => "thinking",
            ModelEvent::ToolCall { call } if call.unreadable_problem().is_some() => "unreadable",
            ModelEvent::ToolCall { .. } => "call",
            ModelEvent::Usage { .. } => "usage",
            ModelEvent::Finish { .. } => "finish",
        };
        if kinds.last() != Some(&kind) {
            kinds.push(kind);
        }
    }
    let end = turn.error.as_deref().unwrap_or("ok");
    format!("{mode:?}:{}:{end}", kinds.join(","))
}

fn check(body: &[u8]) -> Checked {
    let mut signatures = Vec::new();
    let mut accepted = true;
    for mode in [TurnMode::Native, TurnMode::Text] {
        let whole = summarize(turn(vec![body.to_vec()], mode)?)?;
        let mut splits = vec![split(body, 64)];
        if body.len() <= 2048 {
            splits.push(body.iter().map(|b| vec![*b]).collect());
        }
        for pieces in splits {
            let count = pieces.len();
            let split_turn = summarize(turn(pieces, mode)?)?;
            let same = match (&whole.error, &split_turn.error) {
                (None, None) => whole.events == split_turn.events,
                (Some(a), Some(b)) => a == b,
                _ => false,
            };
            if !same {
                return Err(Violation(format!(
                    "{mode:?}: the body read whole gave {whole:?}, in {count} pieces {split_turn:?}"
                )));
            }
        }
        accepted &= whole.error.is_none();
        signatures.push(signature(&whole, mode));
    }
    let signature = signatures.join(" ");
    Ok(if accepted {
        Outcome::accepted(signature)
    } else {
        Outcome::refused(signature)
    })
}
