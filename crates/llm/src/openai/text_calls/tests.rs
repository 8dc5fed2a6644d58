//! Every shape of a call written in text, answers that are no calls, and
//! attempts that do not read.

use std::time::{Duration, Instant};

use mtswarm_core::model::UNREADABLE_TOOL_CALL;
use serde_json::json;

use super::*;

/// The (name, arguments) of the readable calls of `text`.
fn read(text: &str) -> Vec<(String, Value)> {
    read_calls(text)
        .into_iter()
        .map(|call| {
            assert_ne!(call.name, UNREADABLE_TOOL_CALL, "{text}: {call:?}");
            let arguments = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
            (call.name, arguments)
        })
        .collect()
}

fn one(name: &str, arguments: Value) -> Vec<(String, Value)> {
    vec![(name.to_owned(), arguments)]
}

/// The problem of the unreadable call `text` ends with (after `readable`
/// readable calls).
fn problem(text: &str, readable: usize) -> String {
    let calls = read_calls(text);
    assert_eq!(calls.len(), readable + 1, "{text}: {calls:?}");
    let last = calls
        .last()
        .cloned()
        .unwrap_or_else(|| ToolCall::unreadable("", ""));
    let problem = last.unreadable_problem().unwrap_or_default();
    assert!(problem.contains(EXPECTED_SHAPE), "{problem}");
    problem
}

#[test]
fn a_bare_name_and_arguments_object_is_a_call() {
    let args = json!({"kernel_dir": "vecadd", "defines": {"N": 8}});
    let text = json!({"name": "compile", "arguments": args}).to_string();
    assert_eq!(read(&text), one("compile", args.clone()));
    let calls = read_calls(&text);
    assert_eq!(calls[0].id, "text-call-1");
    // Pretty-printed over several lines.
    let pretty = serde_json::to_string_pretty(&json!({"name": "compile", "arguments": args}))
        .unwrap_or_default();
    assert_eq!(read(&pretty), one("compile", args));
}

#[test]
fn several_bare_objects_with_prose_around_are_several_calls_in_order() {
    let text = "First I list the fleet, then read the space.\n\
                {\"name\": \"list_fleet\", \"arguments\": {}}\n\
                and then\n\
                {\"name\": \"read_file\", \"arguments\": {\"path\": \"tune.toml\"}}\nDone.";
    assert_eq!(
        read(text),
        [
            ("list_fleet".to_owned(), json!({})),
            ("read_file".to_owned(), json!({"path": "tune.toml"})),
        ]
    );
    let ids: Vec<String> = read_calls(text).into_iter().map(|c| c.id).collect();
    assert_eq!(ids, ["text-call-1", "text-call-2"]);
}

#[test]
fn fenced_objects_are_calls_with_or_without_a_language() {
    let json_fence = "I will compile.\n```json\n{\"name\": \"compile\", \"arguments\": {\"N\": 8}}\n```\nThen validate.";
    assert_eq!(read(json_fence), one("compile", json!({"N": 8})));
    let plain_fence = "```\n{\"name\": \"validate\", \"arguments\": {\"cores\": 2}}\n```";
    assert_eq!(read(plain_fence), one("validate", json!({"cores": 2})));
    let two_fences = "```json\n{\"name\": \"a\", \"arguments\": {}}\n```\ntext\n```JSON\n{\"name\": \"b\", \"arguments\": {}}\n```";
    assert_eq!(
        read(two_fences),
        [("a".to_owned(), json!({})), ("b".to_owned(), json!({}))]
    );
    // A list of calls in one fence.
    let list = "```json\n[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]\n```";
    assert_eq!(
        read(list),
        [
            ("a".to_owned(), json!({"x": 1})),
            ("b".to_owned(), json!({}))
        ]
    );
}

#[test]
fn hermes_tool_call_tags_are_calls() {
    let one_tag =
        "<tool_call>\n{\"name\": \"spawn_agent\", \"arguments\": {\"name\": \"a1\"}}\n</tool_call>";
    assert_eq!(read(one_tag), one("spawn_agent", json!({"name": "a1"})));
    let several = "Let me start.\n<tool_call>\n{\"name\": \"list_fleet\", \"arguments\": {}}\n</tool_call>\n\
                   <tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"tune.toml\"}}\n</tool_call>";
    assert_eq!(
        read(several),
        [
            ("list_fleet".to_owned(), json!({})),
            ("read_file".to_owned(), json!({"path": "tune.toml"})),
        ]
    );
    // A last tag left open (the output limit, or a template's stop word).
    let open = "<tool_call>{\"name\": \"collect_result\", \"arguments\": {\"mode\": \"all\"}}";
    assert_eq!(read(open), one("collect_result", json!({"mode": "all"})));
    // Upper-case tags too.
    let upper = "<TOOL_CALL>{\"name\": \"a\", \"arguments\": {}}</TOOL_CALL>";
    assert_eq!(read(upper), one("a", json!({})));
}

#[test]
fn tool_calls_lists_take_plain_and_openai_entries() {
    let plain = json!({"tool_calls": [
        {"name": "validate", "arguments": {}},
        {"name": "benchmark", "arguments": {"repeats": 1}},
    ]})
    .to_string();
    assert_eq!(
        read(&plain),
        [
            ("validate".to_owned(), json!({})),
            ("benchmark".to_owned(), json!({"repeats": 1})),
        ]
    );
    let openai = json!({"tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "compile", "arguments": "{\"N\": 8}"}},
        {"type": "function", "function": {"name": "validate", "arguments": {"cores": 2}}},
    ]})
    .to_string();
    assert_eq!(
        read(&openai),
        [
            ("compile".to_owned(), json!({"N": 8})),
            ("validate".to_owned(), json!({"cores": 2})),
        ]
    );
    // A message-shaped object, and one entry without the list.
    let message = json!({"role": "assistant", "content": null,
                         "tool_calls": {"name": "list_fleet", "arguments": {}}})
    .to_string();
    assert_eq!(read(&message), one("list_fleet", json!({})));
}

#[test]
fn function_objects_are_calls() {
    let nested = json!({"function": {"name": "compile", "arguments": {"N": 8}}}).to_string();
    assert_eq!(read(&nested), one("compile", json!({"N": 8})));
    let typed =
        json!({"type": "function", "function": {"name": "compile", "arguments": "{\"N\": 4}"}})
            .to_string();
    assert_eq!(read(&typed), one("compile", json!({"N": 4})));
    let named = json!({"function": "validate", "arguments": {"cores": 1}}).to_string();
    assert_eq!(read(&named), one("validate", json!({"cores": 1})));
    let llama =
        json!({"type": "function", "name": "benchmark", "parameters": {"repeats": 3}}).to_string();
    assert_eq!(read(&llama), one("benchmark", json!({"repeats": 3})));
}

#[test]
fn arguments_may_be_an_object_or_a_json_encoded_string() {
    let object = r#"{"name": "compile", "arguments": {"defines": {"N": "8"}}}"#;
    let string = r#"{"name": "compile", "arguments": "{\"defines\": {\"N\": \"8\"}}"}"#;
    assert_eq!(read(object), read(string));
    assert_eq!(read(object), one("compile", json!({"defines": {"N": "8"}})));
    // No arguments, or null: an empty object.
    assert_eq!(
        read(r#"{"tool_calls": [{"name": "list_fleet"}]}"#),
        one("list_fleet", json!({}))
    );
    assert_eq!(
        read(r#"{"name": "list_fleet", "arguments": null}"#),
        one("list_fleet", json!({}))
    );
    // A string that is not JSON goes as written: the engine answers it
    // with its protocol error about arguments that are not JSON.
    let calls = read_calls(r#"{"name": "compile", "arguments": "N=8"}"#);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, "N=8");
}

#[test]
fn unknown_tool_names_are_left_to_the_engine() {
    assert_eq!(
        read(r#"{"name": "no_such_tool", "arguments": {"x": 1}}"#),
        one("no_such_tool", json!({"x": 1}))
    );
}

#[test]
fn final_answers_are_not_calls() {
    let answers = [
        // The leader's answers, bare, pretty-printed, fenced.
        r#"{"best": null, "error": "nothing worked"}"#.to_owned(),
        serde_json::to_string_pretty(&json!({"best": null, "error": "nothing worked"}))
            .unwrap_or_default(),
        "Best configuration {\"CHUNK\": 512} at 3.5 GFLOP/s.\n\n```json\n{\"best\": {\"params\": {\"CHUNK\": 512}, \"gflops\": 3.5, \"agent\": \"tuner-1\"}}\n```".to_owned(),
        // A worker's answer with call-like keys nested inside.
        "Done.\n```json\n{\"best\": {\"name\": \"c1\", \"arguments\": {\"N\": 8}}, \"candidates\": [{\"name\": \"x\", \"parameters\": {}}]}\n```".to_owned(),
        // Prose with braces and code.
        "The kernel loops `for (i = 0; i < n; i++) { c[i] = a[i] + b[i]; }` and the arguments were fine.".to_owned(),
        "It is done {not json} at 3.1 GFLOPS".to_owned(),
        // A name without arguments, parameters beside other keys.
        r#"{"name": "vecadd", "gflops": 3.2}"#.to_owned(),
        r#"{"name": "vecadd", "parameters": {"N": 8}, "gflops": 3.2}"#.to_owned(),
        "Ergebnis: größer ✓ {\"best\": null}".to_owned(),
        String::new(),
    ];
    for answer in answers {
        assert!(read_calls(&answer).is_empty(), "{answer}");
    }
}

#[test]
fn attempted_calls_that_do_not_read_are_a_protocol_error_with_the_expected_shape() {
    // Truncated JSON.
    let truncated = "```json\n{\"name\": \"compile\", \"arguments\": {\"N\": 8}\n```";
    assert!(problem(truncated, 0).contains("not valid JSON"));
    let single_quotes = "{'tool_calls': [{'name': 'compile', \"arguments\": {}}]}";
    assert!(problem(single_quotes, 0).contains("not valid JSON"));
    // A tag with no call in it.
    assert!(problem("<tool_call>compile(N=8)</tool_call>", 0).contains("<tool_call>"));
    // Shapes that are not calls.
    assert!(problem(r#"{"tool_calls": "compile"}"#, 0).contains("`tool_calls` must be"));
    assert!(problem(r#"{"tool_calls": []}"#, 0).contains("`tool_calls` must be"));
    assert!(problem(r#"{"tool_calls": [{"arguments": {}}]}"#, 0).contains("without a tool name"));
    assert!(problem(r#"{"tool_calls": [7]}"#, 0).contains("a number"));
    assert!(problem(r#"{"name": 3, "arguments": {}}"#, 0).contains("must be a string"));
    let long = json!({"name": "x".repeat(200), "arguments": {}}).to_string();
    assert!(problem(&long, 0).contains("longer than"));
    // A good call beside a broken one: the good one runs.
    let mixed = json!({"tool_calls": [{"name": "validate", "arguments": {}}, {"arguments": {}}]})
        .to_string();
    let calls = read_calls(&mixed);
    assert_eq!(calls[0].name, "validate");
    assert_eq!(calls[1].name, UNREADABLE_TOOL_CALL);
    assert_eq!(calls[1].id, "text-call-2");
    assert!(problem(&mixed, 1).contains("without a tool name"));
}

#[test]
fn calls_past_the_limit_are_reported_not_run() {
    let entries: Vec<Value> = (0..40)
        .map(|i| json!({"name": "record", "arguments": {"n": i}}))
        .collect();
    let text = json!({"tool_calls": entries}).to_string();
    let problem = problem(&text, MAX_CALLS);
    assert!(
        problem.contains("24 call(s) past the first 16"),
        "{problem}"
    );
}

#[test]
fn oversized_replies_are_text_or_a_protocol_error() {
    let prose = "word ".repeat(MAX_REPLY_BYTES / 4);
    assert!(read_calls(&prose).is_empty());
    let call = format!(
        "{{\"name\": \"write_file\", \"arguments\": {{\"content\": \"{}\"}}}}",
        "x".repeat(MAX_REPLY_BYTES)
    );
    assert!(problem(&call, 0).contains("bytes"));
}

#[test]
fn hostile_text_is_read_quickly_without_panicking() {
    let started = Instant::now();
    let cases = [
        "{".repeat(MAX_REPLY_BYTES - 1),
        "{\"a\":\"".repeat(MAX_REPLY_BYTES / 7),
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        format!("{{\"arguments\": {}", "{\"a\":".repeat(40_000)),
        "<tool_call>".repeat(20_000),
        "{\"name\": \"a\", \"arguments\": {}}".repeat(5_000),
        "é{ü\"arguments\": ✓".repeat(10_000),
    ];
    for text in &cases {
        let calls = read_calls(text);
        assert!(calls.len() <= MAX_CALLS + 1, "{} calls", calls.len());
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}
