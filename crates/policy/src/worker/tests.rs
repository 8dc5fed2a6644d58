//! The sequential plan, walked through conversations.

use super::*;
use mtswarm_core::answer::last_json;

fn task(params: Value) -> Vec<Message> {
    vec![
        Message::system("sys"),
        Message::user(render_task_message("t1", "vecadd", "", &params)),
    ]
}

fn call_of(d: Decision) -> ToolCall {
    match d {
        Decision::Call(c) => c,
        Decision::Calls(c) => panic!("expected one call, got {c:?}"),
        Decision::Final(t) => panic!("expected a call, got final {t}"),
    }
}

/// Append `call` and the tool's `result` for it to the conversation.
fn push_result(history: &mut Vec<Message>, call: &ToolCall, result: &str) {
    history.push(Message::assistant("", vec![call.clone()]));
    history.push(Message::tool(call.id.clone(), result));
}

/// Let the policy make its next call and answer it with `result`; returns
/// the call.
fn answer_next(history: &mut Vec<Message>, result: &str) -> ToolCall {
    let call = call_of(decide(history));
    push_result(history, &call, result);
    call
}

#[test]
fn walks_compile_validate_benchmark_per_candidate_and_picks_the_fastest() {
    let mut history = task(json!({"candidates": [{"CHUNK": 512}, {"CHUNK": 1024, "BUF": "2"}]}));
    let replies = [
        (
            "compiled vecadd as artifact b1 (kernel abc, gcc)",
            "validate",
        ),
        ("validation PASSED for artifact b1", "benchmark"),
        (
            "artifact b1 on 4 cores: median 2.0000e-4 s, trimmed mean 2e-4 s over 3 runs (min 1, max 2), 5.00 GFLOPS (1.0% of peak)",
            "compile",
        ),
        (
            "compiled vecadd as artifact b2 (kernel def, gcc)",
            "validate",
        ),
        ("validation PASSED for artifact b2", "benchmark"),
    ];
    let first = call_of(decide(&history));
    assert_eq!(first.name, "compile");
    assert_eq!(first.id, "c0-compile");
    let mut current = first;
    for (reply, next_tool) in replies {
        push_result(&mut history, &current, reply);
        current = call_of(decide(&history));
        assert_eq!(current.name, next_tool, "after {reply}");
    }
    assert_eq!(current.id, "c1-benchmark");
    let args: Value = serde_json::from_str(&current.arguments).unwrap();
    assert_eq!(args["artifact"], "b2");
    push_result(
        &mut history,
        &current,
        "artifact b2 on 4 cores: median 1.0000e-4 s, trimmed mean 1e-4 s over 3 runs (min 1, max 2), 10.00 GFLOPS (2.0% of peak)",
    );
    let Decision::Final(text) = decide(&history) else {
        panic!("expected the final answer");
    };
    let body = last_json(&text).expect("json block");
    assert_eq!(
        body["best"]["defines"],
        json!({"BUF": "2", "CHUNK": "1024"})
    );
    assert_eq!(body["best"]["median_seconds"], json!(1.0e-4));
    assert_eq!(body["best"]["gflops"], json!(10.0));
}

/// A one-candidate task whose compile succeeded and whose validation of
/// artifact `b1` answered `result`.
fn validated(result: &str) -> Vec<Message> {
    let mut history = task(json!({"params": {"CHUNK": 512}}));
    answer_next(&mut history, "compiled vecadd as artifact b1 (k)");
    let validate = answer_next(&mut history, result);
    assert_eq!(validate.name, "validate");
    history
}

#[test]
fn a_denied_validation_drops_the_candidate() {
    let history = validated("error: the call to 'validate' was denied by the reviewer: no");
    let Decision::Final(text) = decide(&history) else {
        panic!("expected final");
    };
    let body = last_json(&text).expect("json");
    assert!(body["best"].is_null());
    assert!(
        body["candidates"][0]["failure"]
            .as_str()
            .is_some_and(|f| f.contains("denied")),
        "{body}"
    );
}

#[test]
fn an_unknown_artifact_after_a_resume_is_compiled_again() {
    let mut history =
        validated("error: invalid arguments: unknown artifact `b1` (compiled so far: none)");
    let again = answer_next(&mut history, "compiled vecadd as artifact b1 (k)");
    assert_eq!(again.name, "compile");
    assert_eq!(again.id, "c0-compile-r1");
    let validate = call_of(decide(&history));
    assert_eq!(validate.name, "validate");
}

#[test]
fn noop_answers_at_once_and_bad_parameters_are_explained() {
    assert!(matches!(
        decide(&task(json!({"noop": true}))),
        Decision::Final(_)
    ));
    let Decision::Final(text) = decide(&task(json!({"candidates": "x"}))) else {
        panic!("expected final");
    };
    assert!(text.contains("`candidates`: invalid type"), "{text}");
    let Decision::Final(text) = decide(&task(json!({"params": {"A B": 1}}))) else {
        panic!("expected final");
    };
    assert!(text.contains("not a valid macro name"), "{text}");
}

#[test]
fn an_edited_source_is_patched_in_before_anything_is_built() {
    let diff = "--- a/kernel.c\n+++ b/kernel.c\n@@ -1 +1 @@\n-int a;\n+int b;\n";
    for strategy in ["sequential", "search"] {
        let start =
            task(json!({"params": {"CHUNK": 512}, "strategy": strategy, "source_diff": diff}));

        let mut history = start.clone();
        let patch = answer_next(&mut history, "patched vecadd/kernel.c");
        assert_eq!(patch.name, "apply_patch", "{strategy}");
        let args: Value = serde_json::from_str(&patch.arguments).unwrap();
        assert_eq!(
            args["patch"],
            "--- a/vecadd/kernel.c\n+++ b/vecadd/kernel.c\n@@ -1 +1 @@\n-int a;\n+int b;\n",
            "{strategy}: the diff is rebased onto the kernel directory"
        );
        // Applied: the plan goes on as without a diff, never patching twice.
        let next = match decide(&history) {
            Decision::Call(call) => vec![call],
            Decision::Calls(calls) => calls,
            Decision::Final(text) => panic!("{strategy}: the plan goes on, got {text}"),
        };
        assert!(
            next.iter().all(|c| c.name != "apply_patch"),
            "{strategy}: {next:?}"
        );

        // Not applied: the task ends saying why, with nothing built.
        let mut history = start;
        answer_next(
            &mut history,
            "error: `vecadd/kernel.c`: hunk 1 does not match",
        );
        let Decision::Final(text) = decide(&history) else {
            panic!("{strategy}: a failed patch ends the task");
        };
        assert!(text.contains("source_diff does not apply"), "{text}");
        assert!(text.contains("hunk 1 does not match"), "{text}");
    }

    let long = format!("--- a/kernel.c\n+++ b/kernel.c\n{}", "+x\n".repeat(9000));
    let Decision::Final(text) = decide(&task(json!({"params": {}, "source_diff": long}))) else {
        panic!("an overlong diff is refused");
    };
    assert!(text.contains("more than the 16384"), "{text}");
    let Decision::Final(text) = decide(&task(json!({"params": {}, "source_diff": 3}))) else {
        panic!("a diff that is not text is refused");
    };
    assert!(text.contains("`source_diff`: invalid type"), "{text}");
}
