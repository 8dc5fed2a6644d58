//! The machine-readable part of a final answer. Agents end their answers
//! with a fenced JSON block (the worker's result, the leader's job result);
//! the leader and the worker both read it back, so the rules live here once.
//! Pure text processing: no I/O, linear in the length of the text.
//!
//! # Rules of [`last_json`]
//!
//! 1. A block opens with ```` ```json ```` anywhere in the text (the tag in
//!    any letter case, e.g. ```` ```JSON ````); a longer tag such as
//!    ```` ```jsonc ```` or ```` ```json5 ```` is not a JSON block.
//! 2. The block's content runs to the next ```` ``` ```` (its closing fence),
//!    or to the end of the text when it was never closed. Fences do not
//!    nest: the first ```` ``` ```` after the opening closes the block, so a
//!    block whose JSON contains ```` ``` ```` in a string is cut short, does
//!    not parse, and is skipped.
//! 3. The content, trimmed, must be exactly one JSON value (any JSON value);
//!    a block that does not parse is skipped.
//! 4. Of the blocks that parse, the last one wins (an answer restating its
//!    result at the end replaces the draft above it; a broken last block
//!    does not erase an earlier good one).
//! 5. Without any parsable block, an answer that is nothing but a JSON
//!    object or array (surrounding whitespace aside) is that value; JSON
//!    embedded in prose without a fence is not looked for.
//!
//! Nesting deeper than `serde_json`'s recursion limit (128) does not parse,
//! so hostile input cannot exhaust the stack.

use serde_json::Value;

/// The opening and closing fence of a Markdown code block.
const FENCE: &str = "```";
/// The info string of a JSON block (matched ASCII case-insensitively).
const TAG: &str = "json";

/// The JSON value an answer ends with, by the rules in the module docs;
/// `None` when the answer carries none.
pub fn last_json(text: &str) -> Option<Value> {
    let mut found = None;
    let mut rest = text;
    while let Some(start) = rest.find(FENCE) {
        let after = &rest[start + FENCE.len()..];
        let Some(content) = json_tagged(after) else {
            rest = after;
            continue;
        };
        let (body, next) = match content.find(FENCE) {
            Some(end) => (&content[..end], &content[end + FENCE.len()..]),
            None => (content, ""),
        };
        if let Ok(value) = serde_json::from_str::<Value>(body.trim()) {
            found = Some(value);
        }
        rest = next;
    }
    found.or_else(|| bare(text))
}

/// What follows the tag when `after_fence` starts with the JSON tag and
/// nothing that would make it a longer tag.
fn json_tagged(after_fence: &str) -> Option<&str> {
    let tag = after_fence.get(..TAG.len())?;
    if !tag.eq_ignore_ascii_case(TAG) {
        return None;
    }
    let content = &after_fence[TAG.len()..];
    match content.bytes().next() {
        Some(b) if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' => None,
        _ => Some(content),
    }
}

/// The whole text as a JSON object or array.
fn bare(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return None;
    }
    serde_json::from_str::<Value>(trimmed)
        .ok()
        .filter(|v| v.is_object() || v.is_array())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::*;

    #[test]
    fn a_fenced_block_is_the_answer() {
        let text = "Best: 4.2 GFLOPS\n```json\n{\"best\": {\"gflops\": 4.2}}\n```\n";
        assert_eq!(last_json(text), Some(json!({"best": {"gflops": 4.2}})));
    }

    #[test]
    fn the_last_parsable_block_wins() {
        let text = "draft\n```json\n{\"a\":1}\n```\nthen\n```json\n{\"best\":{\"gflops\":2}}\n```";
        assert_eq!(last_json(text), Some(json!({"best": {"gflops": 2}})));
        // A broken last block does not erase the earlier good one.
        let text = "```json\n{\"a\":1}\n```\nfinally\n```json\n{\"a\": 2,\n```";
        assert_eq!(last_json(text), Some(json!({"a": 1})));
    }

    #[test]
    fn no_block_and_no_bare_json_is_none() {
        assert_eq!(last_json("no block"), None);
        assert_eq!(last_json(""), None);
        assert_eq!(
            last_json("```\n{\"a\": 1}\n```\nthat was a plain block"),
            None
        );
        assert_eq!(last_json("The answer is {\"a\": 1} as shown."), None);
    }

    #[test]
    fn the_tag_is_case_insensitive_but_exact() {
        assert_eq!(last_json("```JSON\n{\"a\": 1}\n```"), Some(json!({"a": 1})));
        assert_eq!(last_json("```jsonc\n{\"a\": 1}\n```"), None);
        assert_eq!(last_json("```json5\n{\"a\": 1}\n```"), None);
        assert_eq!(
            last_json("```jsonl\n{\"a\": 1}\n```\n```json\n{\"b\": 2}\n```"),
            Some(json!({"b": 2}))
        );
        // Inline blocks count too.
        assert_eq!(
            last_json("result: ```json {\"a\": 1}```"),
            Some(json!({"a": 1}))
        );
    }

    #[test]
    fn any_json_value_counts_in_a_block() {
        assert_eq!(last_json("```json\n[1, 2]\n```"), Some(json!([1, 2])));
        assert_eq!(last_json("```json\n42\n```"), Some(json!(42)));
        assert_eq!(last_json("```json\nnull\n```"), Some(Value::Null));
    }

    #[test]
    fn an_unclosed_last_block_runs_to_the_end() {
        assert_eq!(
            last_json("done\n```json\n{\"best\": null}\n"),
            Some(json!({"best": null}))
        );
        // Truncated output does not parse and is skipped.
        assert_eq!(
            last_json("```json\n{\"a\": 1}\n```\n```json\n{\"a\": 2, \"b\": [1,"),
            Some(json!({"a": 1}))
        );
    }

    #[test]
    fn a_bare_object_or_array_is_the_answer_without_blocks() {
        assert_eq!(last_json("  {\"a\": 1}\n"), Some(json!({"a": 1})));
        assert_eq!(last_json("[{\"a\": 1}]"), Some(json!([{"a": 1}])));
        assert_eq!(last_json("42"), None);
        assert_eq!(last_json("\"text\""), None);
        // A block takes precedence over JSON outside it.
        assert_eq!(
            last_json("{\"bare\": 1}\n```json\n{\"block\": true}\n```"),
            Some(json!({"block": true}))
        );
    }

    #[test]
    fn fences_do_not_nest() {
        // A ```json block inside a ```markdown block is still found.
        let text = "```markdown\nExample:\n```json\n{\"a\": 1}\n```\n```";
        assert_eq!(last_json(text), Some(json!({"a": 1})));
        // Backticks inside a JSON string close the block early: skipped.
        let text = "```json\n{\"a\": 1}\n```\n```json\n{\"code\": \"```c\\nint x;\\n```\"}\n```";
        assert_eq!(last_json(text), Some(json!({"a": 1})));
        // Text between blocks that mentions the tag opens nothing parsable.
        let text = "```json\n{\"a\": 1}\n```\nuse ```json fences for results";
        assert_eq!(last_json(text), Some(json!({"a": 1})));
    }

    #[test]
    fn unbalanced_braces_are_skipped() {
        assert_eq!(last_json("```json\n{\"a\": {\"b\": 1}\n```"), None);
        assert_eq!(last_json("```json\n}{\n```"), None);
        assert_eq!(last_json("{\"a\": 1"), None);
        assert_eq!(last_json("{\"a\": 1}}"), None);
        assert_eq!(last_json("```json\n{\"a\": 1}}\n```\n{\"b\": 2}"), None);
    }

    #[test]
    fn non_ascii_text_around_blocks_is_handled() {
        let text = "Ergebnis: größer ✓\n```json\n{\"note\": \"größer ✓\"}\n```\n終わり```";
        assert_eq!(last_json(text), Some(json!({"note": "größer ✓"})));
        assert_eq!(last_json("```ä"), None);
        assert_eq!(last_json("```"), None);
        assert_eq!(last_json("```js"), None);
    }

    #[test]
    fn deep_nesting_does_not_overflow_the_stack() {
        let deep = format!(
            "```json\n{}{}\n```",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(last_json(&deep), None);
        let bare_deep = "{\"a\":".repeat(100_000);
        assert_eq!(last_json(&bare_deep), None);
    }

    #[test]
    fn huge_input_is_read_in_linear_time() {
        // Hundreds of thousands of openers; a parser that rescans from each
        // one would take minutes here.
        let mut text = "```json \"".repeat(300_000);
        text.push_str("\n```json\n{\"last\": true}\n```");
        let started = Instant::now();
        assert_eq!(last_json(&text), Some(json!({"last": true})));
        let mut braces = "{".repeat(2_000_000);
        braces.insert_str(0, "```json\n");
        assert_eq!(last_json(&braces), None);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn the_workers_own_answers_parse() {
        // The shape the builtin worker policy writes (a headline, then a
        // pretty-printed block) and its error answer.
        let body = json!({"best": {"params": {"CHUNK": 512}, "gflops": 3.5}, "candidates": []});
        let text = format!(
            "Best: CHUNK=512 at 3.5 GFLOPS\n```json\n{}\n```",
            serde_json::to_string_pretty(&body).unwrap_or_default()
        );
        assert_eq!(last_json(&text), Some(body));
        let text = format!(
            "The task could not be run: no slice\n```json\n{}\n```",
            json!({"error": "no slice", "best": null})
        );
        assert_eq!(
            last_json(&text),
            Some(json!({"error": "no slice", "best": null}))
        );
    }
}
