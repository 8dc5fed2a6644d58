//! The model view: a projection of the append-only history that fits the
//! context window. Tool results are truncated for the model (the full text
//! stays in the history and the events); older turns are summarized once the
//! view passes the trigger ratio; the latest turns and the task are kept
//! verbatim, and an assistant tool-call message is never separated from the
//! results that answer it.

use serde::{Deserialize, Serialize};

use crate::model::{Message, Role};

/// Estimates how many tokens a message costs.
pub trait TokenEstimator: Send + Sync {
    /// Estimated tokens of `message`.
    fn estimate(&self, message: &Message) -> u64;
}

/// Four characters per token, plus a small per-message overhead. Crude but
/// monotone and cheap; swap in a tokenizer when accuracy matters.
#[derive(Debug, Default, Clone, Copy)]
pub struct CharsPerToken;

impl TokenEstimator for CharsPerToken {
    fn estimate(&self, message: &Message) -> u64 {
        let mut chars = message.content.len();
        for call in &message.tool_calls {
            chars += call.name.len() + call.arguments.len() + call.id.len();
        }
        (chars as u64).div_ceil(4) + 4
    }
}

/// Context window management settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextConfig {
    /// The model's context window, in tokens.
    pub window_tokens: u64,
    /// Compact when the view exceeds this fraction of the window.
    pub trigger_ratio: f64,
    /// Fraction of the window kept free for the reply; compaction aims below
    /// `1 - reserve_ratio` even when keeping fewer recent turns.
    pub reserve_ratio: f64,
    /// Turns kept verbatim by a compaction (a turn is a user message, or an
    /// assistant message with its tool results).
    pub keep_recent_turns: usize,
    /// Tool results longer than this (in chars) are truncated in the view.
    pub max_tool_result_chars: usize,
    /// Instruction of the summarization request.
    pub summary_instruction: String,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            window_tokens: 128_000,
            trigger_ratio: 0.8,
            reserve_ratio: 0.1,
            keep_recent_turns: 4,
            max_tool_result_chars: 4000,
            summary_instruction:
                "Summarize the conversation below for your own later use. Keep the \
                task, every decision made, file names, the code changes, every compile, validation \
                and benchmark result with its numbers, and what remains to be done. Be concise."
                    .to_owned(),
        }
    }
}

/// Cut `text` to `limit` chars, saying how long it was.
pub fn truncate_for_model(text: &str, limit: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= limit {
        // Byte length bounds char count, so this is the common fast path.
        return std::borrow::Cow::Borrowed(text);
    }
    let Some((cut, _)) = text.char_indices().nth(limit) else {
        return std::borrow::Cow::Borrowed(text);
    };
    let total = text.chars().count();
    std::borrow::Cow::Owned(format!(
        "{}\n... [truncated, original length {total} chars]",
        &text[..cut]
    ))
}

/// The message as the model sees it.
pub(crate) fn view_message(message: &Message, config: &ContextConfig) -> Message {
    if message.role == Role::Tool
        && let std::borrow::Cow::Owned(short) =
            truncate_for_model(&message.content, config.max_tool_result_chars)
    {
        return Message {
            role: Role::Tool,
            content: short,
            tool_calls: Vec::new(),
            tool_call_id: message.tool_call_id.clone(),
        };
    }
    message.clone()
}

/// Indexes in `history[from..]` where a turn starts: user and assistant
/// messages (tool and system messages belong to the turn before them).
pub(crate) fn turn_starts(history: &[Message], from: usize) -> Vec<usize> {
    history
        .iter()
        .enumerate()
        .skip(from)
        .filter(|(_, m)| matches!(m.role, Role::User | Role::Assistant))
        .map(|(i, _)| i)
        .collect()
}

/// Render messages as plain text for a summarization request.
pub(crate) fn render_transcript(
    previous_summary: Option<&str>,
    messages: &[Message],
    config: &ContextConfig,
) -> String {
    let mut out = String::new();
    if let Some(summary) = previous_summary {
        out.push_str("[earlier summary]\n");
        out.push_str(summary);
        out.push_str("\n\n");
    }
    for message in messages {
        let role = match message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        out.push_str(&format!("[{role}] "));
        out.push_str(&truncate_for_model(
            &message.content,
            config.max_tool_result_chars,
        ));
        for call in &message.tool_calls {
            out.push_str(&format!("\n  -> {}({})", call.name, call.arguments));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_counts_chars_and_respects_char_boundaries() {
        let text = "é".repeat(10);
        assert_eq!(truncate_for_model(&text, 10), text.as_str());
        let cut = truncate_for_model(&text, 3);
        assert_eq!(cut, "ééé\n... [truncated, original length 10 chars]");
        assert_eq!(truncate_for_model("short", 100), "short");
    }

    #[test]
    fn turns_start_at_user_and_assistant_messages() {
        let history = vec![
            Message::user("task"),
            Message::assistant("", vec![]),
            Message::tool("c1", "r"),
            Message::tool("c2", "r"),
            Message::user("feedback"),
            Message::assistant("done", vec![]),
        ];
        assert_eq!(turn_starts(&history, 0), vec![0, 1, 4, 5]);
        assert_eq!(turn_starts(&history, 2), vec![4, 5]);
    }
}
