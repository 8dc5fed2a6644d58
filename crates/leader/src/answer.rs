//! Reading the leader's final answer: its last fenced ```` ```json ```` block
//! is the job's `result_json`, and the completion gate checks the figures it
//! claims. Apart from the runner so the gate (which the runner installs)
//! and the builtin policy's tests read it without depending on the runner.

use serde_json::Value;

/// Extracts the last fenced ```json block of `text`.
pub fn last_json_block(text: &str) -> Option<Value> {
    let mut found = None;
    let mut rest = text;
    while let Some(start) = rest.find("```json") {
        let body = &rest[start + 7..];
        let Some(end) = body.find("```") else { break };
        if let Ok(value) = serde_json::from_str::<Value>(body[..end].trim()) {
            found = Some(value);
        }
        rest = &body[end + 3..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_last_parsable_json_block_is_the_result() {
        let text =
            "Best: x\n```json\n{\"a\":1}\n```\nthen\n```json\n{\"best\":{\"gflops\":2}}\n```";
        assert_eq!(last_json_block(text), Some(json!({"best":{"gflops":2}})));
        assert_eq!(last_json_block("no block"), None);
    }
}
