//! Reading tool calls out of a reply's text: what a model writes when it
//! calls tools in prose instead of through the server's `tool_calls` (the
//! text tool mode, and native mode when the server returns text although
//! tools were offered). Real models write their calls in several shapes,
//! and each is read here:
//!
//! - one or several `{"name": ..., "arguments": {...}}` objects, bare or in
//!   ```` ``` ```` fences (with or without a language), prose around them;
//! - Hermes/Qwen tags, `<tool_call>{...}</tool_call>`, one or several;
//! - `{"tool_calls": [...]}`, each entry `{"name", "arguments"}` or the
//!   OpenAI `{"type": "function", "function": {"name", "arguments"}}`;
//! - `{"function": {"name", "arguments"}}`;
//! - Llama's `{"name": ..., "parameters": {...}}` (no other keys but
//!   `type` and `id`);
//!
//! with the arguments as an object or as a JSON-encoded string.
//!
//! Text that looks like an attempted call but reads as none (JSON that does
//! not parse around a `"tool_calls"` or `"arguments"` key, a `<tool_call>`
//! tag with no call in it, a call without a tool name) becomes one
//! [`ToolCall::unreadable`] naming the problem and the expected shape, which
//! the engine feeds back to the model as a protocol error. Anything else (a
//! final answer, with or without a JSON block of its own) is text: only
//! top-level objects with a call's keys are calls, so an answer's
//! `{"best": ...}` never is one. Tool names are not checked here: an
//! unknown one reaches the engine, which answers it as it answers any call
//! to an unknown tool.
//!
//! The text is untrusted: its size, the JSON values and failed parses
//! looked at and the calls read per reply are bounded, and nothing here
//! panics.

use std::ops::Range;

use mtswarm_core::model::ToolCall;
use serde_json::{Map, Value};

/// Longest reply read for calls; a longer one that looks like an attempted
/// call is a protocol error, any other is text.
pub(crate) const MAX_REPLY_BYTES: usize = 256 * 1024;
/// Calls read from one reply; more are reported back as a protocol error.
pub(crate) const MAX_CALLS: usize = 16;
/// JSON values looked at in one reply.
const MAX_VALUES: usize = 64;
/// `{` positions where no JSON value starts, tried before giving up: each
/// costs at most one pass over the rest of the text.
const MAX_PARSE_FAILURES: usize = 64;
/// Longest tool name accepted.
const MAX_NAME_CHARS: usize = 128;
/// Problems named in one protocol error.
const MAX_PROBLEMS: usize = 3;

/// The prefix of the ids of calls read from text (`text-call-1`, ...).
pub(crate) const TEXT_CALL_ID_PREFIX: &str = "text-call-";

/// What a model is told when its attempted call does not read.
pub(crate) const EXPECTED_SHAPE: &str = "Write each tool call as a JSON object \
{\"name\": \"TOOL\", \"arguments\": {...}} (several calls: \
{\"tool_calls\": [{\"name\": \"TOOL\", \"arguments\": {...}}, ...]}), the arguments one \
JSON object matching the tool's schema. To answer without calling a tool, write no such object.";

/// The Hermes/Qwen opening and closing tags (matched in ASCII lowercase).
const OPEN_TAG: &str = "<tool_call>";
const CLOSE_TAG: &str = "</tool_call>";
/// Keys whose presence outside any readable JSON marks an attempted call.
const CALL_KEYS: [&str; 2] = ["\"tool_calls\"", "\"arguments\""];

/// The tool calls `text` holds, in order, with ids `text-call-1`, ...;
/// empty when it attempts none. An attempt that does not read is the last
/// call, a [`ToolCall::unreadable`] naming the problem.
pub(crate) fn read_calls(text: &str) -> Vec<ToolCall> {
    let lower = text.to_ascii_lowercase();
    if text.len() > MAX_REPLY_BYTES {
        if !looks_like_a_call(&lower) {
            return Vec::new();
        }
        let problem = format!(
            "the reply is {} bytes; a reply with tool calls must stay under {MAX_REPLY_BYTES} bytes. {EXPECTED_SHAPE}",
            text.len()
        );
        return vec![ToolCall::unreadable(call_id(0), &problem)];
    }
    let scan = scan(text);
    let mut reading = Reading::default();
    let mut call_spans: Vec<Range<usize>> = Vec::new();
    for found in &scan.values {
        if let Some(entries) = call_entries(&found.value) {
            call_spans.push(found.span.clone());
            for entry in entries {
                reading.add(entry);
            }
        }
    }
    for tag in tag_bodies(&lower) {
        if !call_spans
            .iter()
            .any(|span| span.start >= tag.start && span.end <= tag.end)
        {
            reading.problem("a <tool_call> tag holds no JSON tool call object".to_owned());
        }
    }
    if let Some(at) = marker_outside(&lower, &scan.values) {
        let why = scan
            .failures
            .iter()
            .rev()
            .find(|(start, _)| *start <= at)
            .map(|(_, error)| format!(" ({error})"))
            .unwrap_or_default();
        reading.problem(format!("a tool call that is not valid JSON{why}"));
    }
    reading.into_calls()
}

/// True when `lower` (a reply in ASCII lowercase) has a call's tag or keys.
fn looks_like_a_call(lower: &str) -> bool {
    lower.contains(OPEN_TAG) || CALL_KEYS.iter().any(|key| lower.contains(key))
}

fn call_id(index: usize) -> String {
    format!("{TEXT_CALL_ID_PREFIX}{}", index + 1)
}

/// The calls and problems of one reply, bounded as it is read.
#[derive(Default)]
struct Reading {
    calls: Vec<(String, String)>,
    dropped: usize,
    problems: Vec<String>,
    more_problems: usize,
}

impl Reading {
    fn add(&mut self, entry: Result<(String, String), String>) {
        match entry {
            Ok(call) if self.calls.len() < MAX_CALLS => self.calls.push(call),
            Ok(_) => self.dropped += 1,
            Err(problem) => self.problem(problem),
        }
    }

    fn problem(&mut self, problem: String) {
        if self.problems.contains(&problem) {
            return;
        }
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(problem);
        } else {
            self.more_problems += 1;
        }
    }

    fn into_calls(mut self) -> Vec<ToolCall> {
        if self.dropped > 0 {
            let dropped = self.dropped;
            self.problem(format!(
                "{dropped} call(s) past the first {MAX_CALLS} of the reply were not run; make them in a later reply"
            ));
        }
        let mut calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(index, (name, arguments))| ToolCall {
                id: call_id(index),
                name,
                arguments,
            })
            .collect();
        if !self.problems.is_empty() {
            let mut problem = self.problems.join("; ");
            if self.more_problems > 0 {
                problem.push_str(&format!("; and {} more", self.more_problems));
            }
            let problem = format!("{problem}. {EXPECTED_SHAPE}");
            calls.push(ToolCall::unreadable(call_id(calls.len()), &problem));
        }
        calls
    }
}

/// A JSON value found in the text, with its byte span.
struct Found {
    span: Range<usize>,
    value: Value,
}

/// The top-level JSON objects of a text and where parses failed.
struct Scan {
    values: Vec<Found>,
    /// Byte offset of each `{` where no value started, with the reason.
    failures: Vec<(usize, String)>,
}

/// Every JSON object that starts at a `{` outside the objects found before
/// it, in order (bounded by [`MAX_VALUES`] and [`MAX_PARSE_FAILURES`]).
fn scan(text: &str) -> Scan {
    let mut values = Vec::new();
    let mut failures = Vec::new();
    let mut position = 0;
    while values.len() < MAX_VALUES && failures.len() < MAX_PARSE_FAILURES {
        let Some(offset) = text.get(position..).and_then(|rest| rest.find('{')) else {
            break;
        };
        let start = position + offset;
        let Some(rest) = text.get(start..) else { break };
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                let end = start + stream.byte_offset();
                values.push(Found {
                    span: start..end,
                    value,
                });
                position = end.max(start + 1);
            }
            Some(Err(error)) => {
                failures.push((start, error.to_string()));
                // `{` is one byte, so the next position is a char boundary.
                position = start + 1;
            }
            None => break,
        }
    }
    Scan { values, failures }
}

/// The byte ranges of the bodies of `<tool_call>` tags in `lower`: from
/// the tag to its closing tag, the next opening tag or the end.
fn tag_bodies(lower: &str) -> Vec<Range<usize>> {
    let mut bodies = Vec::new();
    let mut position = 0;
    while bodies.len() < MAX_VALUES {
        let Some(offset) = lower.get(position..).and_then(|rest| rest.find(OPEN_TAG)) else {
            break;
        };
        let start = position + offset + OPEN_TAG.len();
        let rest = lower.get(start..).unwrap_or("");
        let end = [rest.find(CLOSE_TAG), rest.find(OPEN_TAG)]
            .into_iter()
            .flatten()
            .min()
            .map_or(lower.len(), |e| start + e);
        bodies.push(start..end);
        position = end;
    }
    bodies
}

/// The offset of a call key (`"tool_calls"`, `"arguments"`, followed by a
/// colon) outside every JSON value found, if any.
fn marker_outside(lower: &str, values: &[Found]) -> Option<usize> {
    let mut gaps = Vec::with_capacity(values.len() + 1);
    let mut start = 0;
    for found in values {
        gaps.push(start..found.span.start);
        start = found.span.end;
    }
    gaps.push(start..lower.len());
    gaps.into_iter().find_map(|gap| {
        let text = lower.get(gap.clone())?;
        CALL_KEYS
            .iter()
            .filter_map(|key| {
                text.match_indices(key)
                    .find(|(at, _)| {
                        text.get(at + key.len()..)
                            .is_some_and(|rest| rest.trim_start().starts_with(':'))
                    })
                    .map(|(at, _)| gap.start + at)
            })
            .min()
    })
}

/// The calls (or the problems) a top-level JSON value holds; `None` when it
/// has no call's keys.
fn call_entries(value: &Value) -> Option<Vec<Result<(String, String), String>>> {
    let object = value.as_object()?;
    if let Some(list) = object.get("tool_calls") {
        return Some(match list {
            Value::Array(entries) if !entries.is_empty() => entries.iter().map(entry).collect(),
            Value::Object(_) => vec![entry(list)],
            other => vec![Err(format!(
                "`tool_calls` must be a non-empty list of calls, not {}",
                kind(other)
            ))],
        });
    }
    let function_call = match object.get("function") {
        Some(Value::Object(function)) => function.contains_key("name"),
        Some(Value::String(_)) => object.contains_key("arguments"),
        _ => false,
    };
    let named_call = object.contains_key("name") && object.contains_key("arguments");
    (function_call || named_call || is_llama_call(object)).then(|| vec![entry(value)])
}

/// `{"name": ..., "parameters": {...}}` with no keys but `type` and `id`
/// besides: how Llama models write a call.
fn is_llama_call(object: &Map<String, Value>) -> bool {
    object.contains_key("name")
        && object.contains_key("parameters")
        && object
            .keys()
            .all(|key| matches!(key.as_str(), "name" | "parameters" | "type" | "id"))
}

/// One call's tool name and arguments text, or what is wrong with it.
fn entry(value: &Value) -> Result<(String, String), String> {
    let Some(object) = value.as_object() else {
        return Err(format!("a call must be a JSON object, not {}", kind(value)));
    };
    let arguments_of = |map: &Map<String, Value>| -> Option<Value> {
        map.get("arguments")
            .or_else(|| map.get("parameters"))
            .cloned()
    };
    let (name, arguments) = match object.get("function") {
        Some(Value::Object(function)) => (
            function.get("name"),
            arguments_of(function).or_else(|| arguments_of(object)),
        ),
        Some(name @ Value::String(_)) => (Some(name), arguments_of(object)),
        _ => (object.get("name"), arguments_of(object)),
    };
    let name = match name {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim(),
        Some(Value::String(_)) | None => return Err("a call without a tool name".to_owned()),
        Some(other) => {
            return Err(format!(
                "a call's tool name must be a string, not {}",
                kind(other)
            ));
        }
    };
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(format!(
            "a tool name longer than {MAX_NAME_CHARS} characters"
        ));
    }
    Ok((name.to_owned(), arguments_text(arguments)))
}

/// The arguments as the engine takes them: an object as its JSON text, a
/// JSON-encoded string as what it encodes. A string that is not JSON and
/// any other value go as they are, and the engine names the problem (not
/// JSON, or not matching the tool's schema) to the model.
fn arguments_text(arguments: Option<Value>) -> String {
    match arguments {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(value) => value.to_string(),
            Err(_) => text,
        },
        Some(other) => other.to_string(),
    }
}

/// A JSON value's kind, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
