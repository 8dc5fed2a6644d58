//! Turns the `data:` payloads of a chat-completions stream into
//! [`ModelEvent`]s.
//!
//! The wire protocol sends tool calls in fragments keyed by `index` (id and
//! name first, then the JSON arguments in pieces), while the engine wants each
//! call whole. This module owns that stitching, kept free of I/O so it can be
//! tested chunk by chunk.

use std::collections::BTreeMap;

use mtswarm_core::model::{FinishReason, ModelError, ModelEvent, ToolCall, Usage};

use super::wire::{Chunk, ToolCallDelta, mentions_context_overflow, message_in, truncate};

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembly state for one streamed turn.
#[derive(Debug, Default)]
pub(crate) struct TurnAssembler {
    calls: BTreeMap<u32, PartialCall>,
    last_call_index: Option<u32>,
    finish: Option<FinishReason>,
    chunks_seen: u64,
    emitted_any_call: bool,
}

impl TurnAssembler {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Handles one `data:` payload other than `[DONE]`.
    pub(crate) fn on_data(&mut self, data: &str) -> Result<Vec<ModelEvent>, ModelError> {
        self.chunks_seen += 1;
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!(
                "stream chunk {} is not valid chat-completion JSON ({}): {}",
                self.chunks_seen,
                truncate(&e.to_string(), 300),
                truncate(data, 300)
            ))
        })?;

        if let Some(error) = &chunk.error {
            return Err(stream_error(error));
        }

        let mut events = Vec::new();
        // Only one choice is ever requested (no `n`), so others are ignored.
        for choice in chunk.choices.iter().filter(|c| c.index == 0) {
            if let Some(delta) = &choice.delta {
                for thinking in [&delta.reasoning_content, &delta.reasoning]
                    .into_iter()
                    .flatten()
                {
                    if !thinking.is_empty() {
                        events.push(ModelEvent::ThinkingDelta {
                            text: thinking.clone(),
                        });
                    }
                }
                if let Some(text) = &delta.content
                    && !text.is_empty()
                {
                    events.push(ModelEvent::TextDelta { text: text.clone() });
                }
                for call in delta.tool_calls.iter().flatten() {
                    self.absorb_call_delta(call);
                }
            }
            if let Some(reason) = &choice.finish_reason {
                self.finish = Some(parse_finish_reason(reason));
                self.flush_calls(&mut events)?;
            }
        }
        if let Some(usage) = &chunk.usage {
            events.push(ModelEvent::Usage {
                usage: Usage {
                    input_tokens: usage.prompt_tokens,
                    output_tokens: usage.completion_tokens,
                },
            });
        }
        Ok(events)
    }

    /// Handles the end of the stream: `saw_done` tells whether the server
    /// sent `data: [DONE]` (otherwise the body simply ended).
    pub(crate) fn on_end(&mut self, saw_done: bool) -> Result<Vec<ModelEvent>, ModelError> {
        if !saw_done && self.finish.is_none() {
            return Err(ModelError::Protocol(format!(
                "stream ended after {} chunk(s) without a finish_reason or [DONE]; the response was cut off mid-turn",
                self.chunks_seen
            )));
        }
        let mut events = Vec::new();
        self.flush_calls(&mut events)?;
        let reason = match self.finish.take() {
            Some(reason) => reason,
            None if self.emitted_any_call => FinishReason::ToolCalls,
            None => FinishReason::Stop,
        };
        events.push(ModelEvent::Finish { reason });
        Ok(events)
    }

    fn absorb_call_delta(&mut self, delta: &ToolCallDelta) {
        let index = match delta.index {
            Some(index) => index,
            // Without an index, a new id starts a new call and anything else
            // continues the latest one.
            None => match (self.last_call_index, &delta.id) {
                (Some(last), Some(id)) if self.calls.get(&last).is_some_and(|c| c.id != *id) => {
                    self.calls.keys().next_back().map_or(0, |k| k + 1)
                }
                (Some(last), _) => last,
                (None, _) => 0,
            },
        };
        self.last_call_index = Some(index);
        let partial = self.calls.entry(index).or_default();
        if let Some(id) = &delta.id
            && partial.id.is_empty()
        {
            partial.id = id.clone();
        }
        if let Some(function) = &delta.function {
            if let Some(name) = &function.name
                && *name != partial.name
            {
                partial.name.push_str(name);
            }
            if let Some(arguments) = &function.arguments {
                partial.arguments.push_str(arguments);
            }
        }
    }

    fn flush_calls(&mut self, events: &mut Vec<ModelEvent>) -> Result<(), ModelError> {
        for (index, partial) in std::mem::take(&mut self.calls) {
            if partial.name.is_empty() {
                return Err(ModelError::Protocol(format!(
                    "tool call at index {index} (id {:?}) ended without a function name",
                    truncate(&partial.id, 100)
                )));
            }
            let id = if partial.id.is_empty() {
                format!("call_{}", uuid::Uuid::new_v4().simple())
            } else {
                partial.id
            };
            events.push(ModelEvent::ToolCall {
                call: ToolCall {
                    id,
                    name: partial.name,
                    arguments: partial.arguments,
                },
            });
            self.emitted_any_call = true;
        }
        self.last_call_index = None;
        Ok(())
    }
}

fn parse_finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" | "eos" | "end_turn" => FinishReason::Stop,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" | "max_tokens" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_string()),
    }
}

/// Longest part of a server's error message quoted in a [`ModelError`].
const MAX_MESSAGE_CHARS: usize = 2000;

/// Classifies an error object the server put inside the stream.
pub(crate) fn stream_error(error: &serde_json::Value) -> ModelError {
    // The server's words, bounded: a message is quoted to the engine and
    // the logs, whatever the server put in it.
    let message = truncate(
        &message_in(error).unwrap_or_else(|| error.to_string()),
        MAX_MESSAGE_CHARS,
    );
    if mentions_context_overflow(&message) {
        ModelError::PromptTooLong(message)
    } else if message.to_ascii_lowercase().contains("rate limit") {
        ModelError::RateLimited(message)
    } else {
        ModelError::Other(format!(
            "the endpoint reported an error mid-stream: {message}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(assembler: &mut TurnAssembler, chunks: &[&str]) -> Vec<ModelEvent> {
        let mut events = Vec::new();
        for chunk in chunks {
            events.extend(assembler.on_data(chunk).unwrap());
        }
        events
    }

    #[test]
    fn tool_calls_without_index_are_split_by_id() {
        let mut assembler = TurnAssembler::new();
        let mut events = feed(
            &mut assembler,
            &[
                r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{\"x\""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g","arguments":"{}"}}]}}]}"#,
            ],
        );
        events.extend(assembler.on_end(true).unwrap());
        assert_eq!(
            events,
            vec![
                ModelEvent::ToolCall {
                    call: ToolCall {
                        id: "a".into(),
                        name: "f".into(),
                        arguments: "{\"x\":1}".into()
                    }
                },
                ModelEvent::ToolCall {
                    call: ToolCall {
                        id: "b".into(),
                        name: "g".into(),
                        arguments: "{}".into()
                    }
                },
                ModelEvent::Finish {
                    reason: FinishReason::ToolCalls
                },
            ]
        );
    }

    /// The error the assembler ends with after `chunks` (`saw_done`: the
    /// stream's `[DONE]` arrived).
    fn error_at_end(chunks: &[&str], saw_done: bool) -> ModelError {
        let mut assembler = TurnAssembler::new();
        feed(&mut assembler, chunks);
        assembler.on_end(saw_done).unwrap_err()
    }

    #[test]
    fn a_nameless_tool_call_is_a_protocol_error() {
        let err = error_at_end(
            &[r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a"}]}}]}"#],
            true,
        );
        assert!(
            matches!(&err, ModelError::Protocol(m) if m.contains("without a function name")),
            "{err}"
        );
    }

    #[test]
    fn a_stream_cut_before_finish_is_a_protocol_error() {
        let err = error_at_end(&[r#"{"choices":[{"delta":{"content":"hal"}}]}"#], false);
        assert!(
            matches!(&err, ModelError::Protocol(m) if m.contains("cut off")),
            "{err}"
        );
    }

    #[test]
    fn in_stream_context_error_is_prompt_too_long() {
        let mut assembler = TurnAssembler::new();
        let err = assembler
            .on_data(r#"{"error":{"message":"maximum context length is 8192 tokens"}}"#)
            .unwrap_err();
        assert!(matches!(err, ModelError::PromptTooLong(_)), "{err}");
    }

    #[test]
    fn a_huge_in_stream_error_is_quoted_in_part() {
        let mut assembler = TurnAssembler::new();
        let huge = "x".repeat(100_000);
        let err = assembler
            .on_data(&format!(r#"{{"error":{{"message":"{huge}"}}}}"#))
            .unwrap_err();
        let text = err.to_string();
        assert!(text.len() < 2_200, "{} bytes", text.len());
    }

    #[test]
    fn a_chunk_s_huge_id_or_mistyped_field_is_quoted_in_part() {
        let huge = "dat".repeat(20_000);
        let err = error_at_end(
            &[&format!(
                r#"{{"choices":[{{"delta":{{"tool_calls":[{{"index":1,"id":"{huge}"}}]}}}}]}}"#
            )],
            true,
        );
        assert!(
            err.to_string().len() < 1_000,
            "{} bytes",
            err.to_string().len()
        );
        let mut assembler = TurnAssembler::new();
        let err = assembler
            .on_data(&format!(r#"{{"choices":"{huge}"}}"#))
            .unwrap_err();
        assert!(
            err.to_string().len() < 1_000,
            "{} bytes",
            err.to_string().len()
        );
    }

    #[test]
    fn reasoning_fields_become_thinking() {
        let mut assembler = TurnAssembler::new();
        let events = feed(
            &mut assembler,
            &[
                r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
                r#"{"choices":[{"delta":{"reasoning":"so"}}]}"#,
            ],
        );
        assert_eq!(
            events,
            vec![
                ModelEvent::ThinkingDelta { text: "hmm".into() },
                ModelEvent::ThinkingDelta { text: "so".into() },
            ]
        );
    }
}
