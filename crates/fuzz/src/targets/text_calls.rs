//! Tool calls a model wrote as text (`crates/llm/src/openai/text_calls.rs`):
//! every shape the reader accepts (bare objects, fences, `<tool_call>`
//! tags, `tool_calls` lists, OpenAI and Llama shapes) and near misses. A
//! call read must have a name and JSON arguments; an attempt that does not
//! read must become one call naming the problem, in a bounded message.

use mtswarm_core::registry::parse_arguments;
use mtswarm_llm::fuzzing::text_calls;

use crate::{Checked, Outcome, Target, Violation};

pub(super) const TARGET: Target = Target {
    name: "text_calls",
    about: "tool calls written as text (crates/llm/src/openai/text_calls.rs)",
    check,
    dictionary: &[
        b"{\"name\": \"run\", \"arguments\": {\"defines\": {\"N\": 64}}}",
        b"{\"tool_calls\": [",
        b"{\"type\": \"function\", \"function\": {\"name\": \"compile\", \"arguments\": \"{}\"}}",
        b"{\"name\": \"grep\", \"parameters\": {\"pattern\": \"x\"}}",
        b"<tool_call>",
        b"</tool_call>",
        b"```json\n",
        b"```",
        b"\"arguments\"",
        b"\"tool_calls\"",
        b"\"name\"",
        b"\\\"",
        b"{",
        b"}",
        b"<TOOL_CALL>",
    ],
    seeds: crate::no_seeds,
    max_len: 300 * 1024,
};

/// Calls one reply may yield: the bound, and one naming what was dropped.
const MAX_CALLS: usize = 17;
/// Longest problem a call that does not read may name.
const MAX_PROBLEM_BYTES: usize = 4096;

fn check(input: &[u8]) -> Checked {
    let text = String::from_utf8_lossy(input);
    let calls = text_calls(&text);
    if calls.len() > MAX_CALLS {
        return Err(Violation(format!(
            "{} calls read from one reply",
            calls.len()
        )));
    }
    let mut unreadable = None;
    for (i, call) in calls.iter().enumerate() {
        if !call.id.starts_with("text-call-") {
            return Err(Violation(format!("call {i} has the id {:?}", call.id)));
        }
        if let Some(problem) = call.unreadable_problem() {
            if i + 1 != calls.len() {
                return Err(Violation(format!(
                    "the unreadable call is not the last ({i})"
                )));
            }
            if problem.trim().is_empty() || problem.len() > MAX_PROBLEM_BYTES {
                return Err(Violation(format!(
                    "a problem of {} bytes: {}",
                    problem.len(),
                    problem.chars().take(200).collect::<String>()
                )));
            }
            unreadable = Some(crate::error_kind(&problem));
            continue;
        }
        if call.name.trim().is_empty() {
            return Err(Violation(format!("call {i} has no name")));
        }
        // Arguments given as a string that is not JSON reach the engine,
        // which refuses them as a protocol error the model sees.
        if let Err(rejection) = parse_arguments(&call.arguments) {
            let seen = rejection.observation();
            if !seen.contains("not valid JSON") {
                return Err(Violation(format!("call {i}: the engine answers {seen}")));
            }
        }
    }
    let readable = calls.len() - usize::from(unreadable.is_some());
    Ok(match unreadable {
        Some(problem) => Outcome::refused(format!("{readable} calls, then: {problem}")),
        None => Outcome::accepted(format!("{readable} calls")),
    })
}
