//! The state machine's nodes and transition reasons on the happy path, the
//! budgets, and the model-error recovery paths.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

// Tests tweak one knob of the defaults at a time.
#![allow(clippy::field_reassign_with_default)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::*;
use serde_json::json;

use TransitionReason as R;

#[tokio::test]
async fn tool_step_walks_all_five_nodes_then_answers() {
    let (engine, model) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::call("c1", "read_file", r#"{"path":"a.c"}"#).with_thinking("look"),
            ScriptedTurn::text("the kernel is fine"),
        ],
        registry(vec![FnTool::echo("read_file", "int main;")]),
        RiskPolicy::default(),
    );
    let (stream, handle) = engine.start("s1", "system", "check a.c");
    let (events, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "the kernel is fine");
    let state = outcome.state();
    assert_eq!(
        state.reasons(),
        vec![
            R::UserInput,
            R::ModelReturnedToolCalls,
            R::ToolsRouted,
            R::ToolsExecuted,
            R::ObservationsRecorded,
            R::ModelReturnedFinal
        ]
    );
    let nodes: Vec<Node> = state.transitions().iter().map(|t| t.to).collect();
    assert_eq!(
        nodes,
        vec![
            Node::Reasoning,
            Node::ToolRouting,
            Node::ToolExecution,
            Node::Observation,
            Node::Reasoning,
            Node::Done
        ]
    );
    assert_eq!(state.step(), 2);
    assert_eq!(observation(state, "c1"), "int main;");
    // The second request saw the tool result after the assistant call.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let second = &requests[1].messages;
    let call_at = second
        .iter()
        .position(|m| m.tool_calls.iter().any(|c| c.id == "c1"))
        .expect("assistant call in view");
    assert_eq!(second[call_at + 1].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(requests[0].tools.len(), 1);

    // Events: ordered sequence numbers, session and kinds.
    assert!(events.iter().all(|e| &*e.session_id == "s1"));
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Thinking { text } if text == "look"))
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::ToolCall { call_id, .. } if call_id == "c1"))
    );
    assert!(matches!(
        &events.last().expect("events").kind,
        EventKind::Transition { to: Node::Done, .. }
    ));
    assert!(events.iter().any(
        |e| matches!(&e.kind, EventKind::ReplyEnd { text, verdict: Verdict::Pass } if text == "the kernel is fine")
    ));
    // The handle sees the same outcome.
    assert_eq!(handle.outcome().await.expect("outcome"), outcome);
}

#[tokio::test]
async fn events_and_state_serialize_and_round_trip() {
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("c1", "read_file", "{}", "ok"),
        registry(vec![FnTool::echo("read_file", "x")]),
        RiskPolicy::default(),
    );
    let (events, outcome) = run_go(&engine).await;
    for event in &events {
        let json = serde_json::to_string(event).expect("event serializes");
        let back: Event = serde_json::from_str(&json).expect("event deserializes");
        assert_eq!(&back, event);
    }
    let json = outcome.state().to_json().expect("state serializes");
    assert_eq!(
        &LoopState::from_json(&json).expect("restores"),
        outcome.state()
    );
}

#[tokio::test]
async fn unknown_tool_becomes_an_error_observation() {
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("c1", "rm_rf", "{}", "sorry"),
        registry(vec![FnTool::echo("read_file", "x")]),
        RiskPolicy::default(),
    );
    let (events, outcome) = run_go(&engine).await;
    let state = outcome.state();
    assert_eq!(state.risk().unknown_tool, 1);
    let text = observation(state, "c1");
    assert!(text.contains("unknown tool 'rm_rf'"), "{text}");
    assert!(
        text.contains("read_file"),
        "lists the available tools: {text}"
    );
    assert_eq!(
        tool_results(&events),
        vec![("c1".into(), false, text.to_owned())]
    );
    assert_eq!(final_text(&outcome), "sorry");
}

#[tokio::test]
async fn tool_off_the_allowlist_is_refused_and_not_advertised() {
    let mut reg = registry(vec![
        FnTool::echo("read_file", "x"),
        FnTool::echo("shell", "pwned"),
    ]);
    reg.set_allowlist(Some(["read_file"]));
    let (engine, model) = engine(
        EngineConfig::default(),
        call_then("c1", "shell", r#"{"cmd":"ls"}"#, "done"),
        reg,
        auto_all(),
    );
    let (events, outcome) = run_go(&engine).await;
    let state = outcome.state();
    assert_eq!(state.risk().tool_not_allowed, 1);
    assert!(observation(state, "c1").contains("not allowed"));
    assert!(
        !tool_results(&events)
            .iter()
            .any(|(_, ok, c)| *ok || c == "pwned")
    );
    let advertised: Vec<String> = model.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(advertised, vec!["read_file".to_owned()]);
}

#[tokio::test]
async fn tool_group_is_usable_only_after_activation() {
    let slot: Arc<std::sync::Mutex<Option<RunControl>>> = Arc::default();
    let tool_slot = slot.clone();
    let enable = FnTool::new("enable_hw", move |_, _| {
        if let Some(control) = tool_slot.lock().expect("lock").as_ref() {
            control.set_group_active("hw", true);
        }
        async { Ok(ToolOutput::text("hw tools enabled")) }
    });
    let mut reg = registry(vec![enable]);
    reg.register_in_group("hw", Arc::new(FnTool::echo("benchmark", "fast")))
        .expect("register");
    let (engine, model) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::call("c1", "benchmark", "{}"),
            ScriptedTurn::call("c2", "enable_hw", "{}"),
            ScriptedTurn::call("c3", "benchmark", "{}"),
            ScriptedTurn::text("done"),
        ],
        reg,
        auto_all(),
    );
    let (stream, handle) = engine.start("s", "", "go");
    *slot.lock().expect("lock") = Some(handle.control());
    let (_, outcome) = run(stream).await;
    let state = outcome.state();
    assert!(observation(state, "c1").contains("group 'hw'"));
    assert_eq!(observation(state, "c3"), "fast");
    assert_eq!(state.risk().tool_not_allowed, 1);
    assert_eq!(state.active_groups(), ["hw".to_owned()]);
    let advertised = |i: usize| -> Vec<String> {
        model.requests()[i]
            .tools
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(advertised(0), vec!["enable_hw".to_owned()]);
    assert_eq!(
        advertised(2),
        vec!["enable_hw".to_owned(), "benchmark".to_owned()]
    );
}

#[tokio::test]
async fn arguments_failing_the_schema_are_refused_before_execution() {
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = calls.clone();
    let tool = FnTool::new("write_file", move |_, _| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok(ToolOutput::text("written")) }
    })
    .schema(json!({
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]
    }));
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::call("c1", "write_file", r#"{"path": 7}"#),
            ScriptedTurn::call("c2", "write_file", r#"{"path":"a.c","content":"x"}"#),
            ScriptedTurn::text("done"),
        ],
        registry(vec![tool]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    let state = outcome.state();
    assert_eq!(state.risk().schema_errors, 1);
    let text = observation(state, "c1");
    assert!(text.contains("do not match its schema"), "{text}");
    assert!(text.contains("content"), "names the missing field: {text}");
    assert!(text.contains("/path"), "names the bad field: {text}");
    assert_eq!(observation(state, "c2"), "written");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A call refused only for an argument its tool does not take is refused
/// once; sent again, that argument is dropped, the call runs and its result
/// says so. Another unknown argument is refused in its turn.
#[tokio::test]
async fn an_unknown_argument_sent_again_is_dropped_and_the_call_runs() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let tool = FnTool::new("compile", move |args, _| {
        record.lock().unwrap().push(args);
        async { Ok(ToolOutput::text("built b1")) }
    })
    .schema(json!({
        "type": "object",
        "properties": {"kernel_dir": {"type": "string"}},
        "additionalProperties": false
    }));
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::call(
                "c1",
                "compile",
                r#"{"kernel_dir":"k","artifact_dir":"out"}"#,
            ),
            ScriptedTurn::call(
                "c2",
                "compile",
                r#"{"kernel_dir":"k","artifact_dir":"out"}"#,
            ),
            ScriptedTurn::call("c3", "compile", r#"{"kernel_dir":"k","output":"o"}"#),
            ScriptedTurn::text("done"),
        ],
        registry(vec![tool]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    let state = outcome.state();
    let first = observation(state, "c1");
    assert!(first.starts_with("error:"), "{first}");
    assert!(first.contains("artifact_dir"), "{first}");
    let second = observation(state, "c2");
    assert_eq!(
        second,
        "note: 'compile' does not take artifact_dir; ran without it.\nbuilt b1"
    );
    let third = observation(state, "c3");
    assert!(
        third.starts_with("error:") && third.contains("output"),
        "{third}"
    );
    assert_eq!(*seen.lock().unwrap(), vec![json!({"kernel_dir": "k"})]);
    assert_eq!(state.risk().schema_errors, 2);
    assert_eq!(state.risk().arguments_ignored, 1);
}

#[tokio::test]
async fn normalize_failure_is_counted_and_observed() {
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("c1", "estimate", r#"{"n":"many"}"#, "done"),
        registry(vec![
            FnTool::echo("estimate", "x").failing_normalize("'n' must be a number"),
        ]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    let state = outcome.state();
    assert_eq!(state.risk().normalize_errors, 1);
    assert!(observation(state, "c1").contains("'n' must be a number"));
}

#[tokio::test]
async fn failing_tool_is_an_observation_not_a_crash() {
    let tool = FnTool::new("compile", |_, _| async {
        Err(ToolError::Failed(
            "gemm.c:3: error: expected ';'".to_owned(),
        ))
    });
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("c1", "compile", "{}", "fix needed"),
        registry(vec![tool]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(outcome.state().risk().tool_errors, 1);
    assert!(observation(outcome.state(), "c1").contains("expected ';'"));
    assert_eq!(final_text(&outcome), "fix needed");
}

#[tokio::test]
async fn large_results_are_truncated_for_the_model_but_not_in_events() {
    let big = "x".repeat(10_000);
    let mut config = EngineConfig::default();
    config.context.max_tool_result_chars = 100;
    let (engine, model) = engine(
        config,
        call_then("c1", "read_file", "{}", "ok"),
        registry(vec![FnTool::echo("read_file", &big)]),
        auto_all(),
    );
    let (events, outcome) = run_go(&engine).await;
    assert_eq!(tool_results(&events)[0].2.len(), 10_000);
    assert_eq!(observation(outcome.state(), "c1").len(), 10_000);
    let seen = &model.requests()[1];
    let tool_msg = seen
        .messages
        .iter()
        .find(|m| m.role == Role::Tool)
        .expect("tool message in view");
    assert!(tool_msg.content.starts_with(&"x".repeat(100)));
    assert!(
        tool_msg
            .content
            .ends_with("... [truncated, original length 10000 chars]"),
        "{}",
        tool_msg.content
    );
}

#[tokio::test]
async fn max_steps_stops_the_loop() {
    let mut config = EngineConfig::default();
    config.max_steps = 2;
    let turns = (0..5)
        .map(|i| ScriptedTurn::call(&format!("c{i}"), "read_file", "{}"))
        .collect();
    let (engine, model) = engine(
        config,
        turns,
        registry(vec![FnTool::echo("read_file", "x")]),
        auto_all(),
    );
    let (events, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::MaxSteps);
    assert_eq!(
        outcome.state().last_transition().map(|t| t.reason),
        Some(R::MaxStepsExceeded)
    );
    assert_eq!(model.requests().len(), 2);
    assert!(events.iter().any(|e| matches!(
        e.kind,
        EventKind::Stopped {
            reason: StopReason::MaxSteps,
            ..
        }
    )));
}

#[tokio::test]
async fn token_budget_from_reported_usage_stops_the_loop() {
    let mut config = EngineConfig::default();
    config.token_budget = Some(1_000);
    let (engine, model) = engine(
        config,
        vec![
            ScriptedTurn::call("c1", "read_file", "{}").with_usage(600, 100),
            ScriptedTurn::call("c2", "read_file", "{}").with_usage(700, 100),
            ScriptedTurn::text("never reached"),
        ],
        registry(vec![FnTool::echo("read_file", "x")]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::TokenBudget);
    let state = outcome.state();
    assert_eq!(state.usage().total(), 1_500);
    assert_eq!(
        state.last_transition().map(|t| t.reason),
        Some(R::TokenBudgetExceeded)
    );
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn token_budget_uses_estimates_without_usage_reports() {
    let mut config = EngineConfig::default();
    config.token_budget = Some(50);
    let (engine, _) = engine(
        config,
        call_then("c1", "read_file", "{}", "x"),
        registry(vec![FnTool::echo("read_file", &"y".repeat(400))]),
        auto_all(),
    );
    let (stream, _) = engine.start("s", "s".repeat(200), "go");
    let (_, outcome) = run(stream).await;
    assert_eq!(stop_reason(&outcome), StopReason::TokenBudget);
    assert!(outcome.state().usage().total() >= 50);
}

#[tokio::test]
async fn wall_time_budget_follows_the_injected_clock() {
    let clock = ManualClock::new(0);
    let tool_clock = clock.clone();
    let slow = FnTool::new("benchmark", move |_, _| {
        tool_clock.advance_ms(6_000);
        async { Ok(ToolOutput::text("took 6 s")) }
    });
    let mut config = EngineConfig::default();
    config.wall_time = Some(Duration::from_secs(10));
    let (engine, _) = engine(
        config,
        (0..5)
            .map(|i| ScriptedTurn::call(&format!("c{i}"), "benchmark", "{}"))
            .collect(),
        registry(vec![slow]),
        auto_all(),
    );
    let engine = engine.with_clock(Arc::new(clock));
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::WallTime);
    let state = outcome.state();
    assert_eq!(
        state.last_transition().map(|t| t.reason),
        Some(R::WallTimeExceeded)
    );
    assert_eq!(state.active_ms(), 12_000);
    assert_eq!(state.step(), 2);
}

#[tokio::test]
async fn empty_reply_is_nudged_once() {
    let (engine, model) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::empty(), ScriptedTurn::text("answer")],
        ToolRegistry::new(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(final_text(&outcome), "answer");
    assert_eq!(
        outcome.state().reasons(),
        vec![R::UserInput, R::ModelRecoveryRetry, R::ModelReturnedFinal]
    );
    let nudge = &model.requests()[1].messages;
    assert!(
        nudge
            .iter()
            .any(|m| m.role == Role::User && m.content.contains("empty"))
    );
}

#[tokio::test]
async fn second_empty_reply_fails_the_run() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::empty(), ScriptedTurn::empty()],
        ToolRegistry::new(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::EmptyReply);
    assert_eq!(
        outcome.state().reasons(),
        vec![R::UserInput, R::ModelRecoveryRetry, R::ModelError]
    );
}

#[tokio::test]
async fn unparseable_tool_call_json_is_a_protocol_error_and_retried() {
    let (_, outcome, model) =
        refused_then_read(ScriptedTurn::call("c1", "read_file", r#"{"path": "a.c""#)).await;
    let state = outcome.state();
    assert_eq!(final_text(&outcome), "done");
    assert_eq!(state.risk().protocol_errors, 2);
    assert_eq!(
        state.reasons(),
        vec![
            R::UserInput,
            R::ModelRecoveryRetry,
            R::ModelRecoveryRetry,
            R::ModelReturnedToolCalls,
            R::ToolsRouted,
            R::ToolsExecuted,
            R::ObservationsRecorded,
            R::ModelReturnedFinal
        ]
    );
    // The second time in a row, the model was told, as the result of its call.
    let retry = &model.requests()[2].messages;
    let told = retry
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("c1"))
        .expect("protocol error observation");
    assert!(told.content.contains("protocol error"), "{}", told.content);
    assert_eq!(observation(state, "c2"), "contents");
}

#[tokio::test]
async fn protocol_error_retries_are_bounded() {
    let mut config = EngineConfig::default();
    config.recovery.max_protocol_retries = 2;
    let (engine, model) = engine(
        config,
        (0..5)
            .map(|i| ScriptedTurn::call(&format!("c{i}"), "read_file", "{nope"))
            .collect(),
        registry(vec![FnTool::echo("read_file", "x")]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::ProtocolErrors);
    assert_eq!(model.requests().len(), 3);
    assert_eq!(outcome.state().risk().protocol_errors, 3);
}

#[tokio::test]
async fn other_model_errors_end_the_run_with_an_error_event() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::error(ModelError::Auth("bad key".to_owned()))],
        ToolRegistry::new(),
        auto_all(),
    );
    let (events, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::ModelError);
    assert!(
        events.iter().any(
            |e| matches!(&e.kind, EventKind::Error { message } if message.contains("bad key"))
        )
    );
    assert_eq!(
        outcome.state().last_transition().map(|t| t.reason),
        Some(R::ModelError)
    );
}

#[tokio::test]
async fn mid_stream_error_ends_the_run() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::text("partial").then_fail(ModelError::Unavailable("reset".into()))],
        ToolRegistry::new(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::ModelError);
}

/// Scripts `n` tool steps whose results are `size` chars long.
fn long_session(n: usize, size: usize) -> (Vec<ScriptedTurn>, ToolRegistry) {
    let turns = (0..n)
        .map(|i| ScriptedTurn::call(&format!("c{i}"), "read_file", "{}"))
        .collect();
    (
        turns,
        registry(vec![FnTool::echo("read_file", &"r".repeat(size))]),
    )
}

#[tokio::test]
async fn prompt_too_long_compacts_and_retries() {
    let (mut turns, reg) = long_session(4, 400);
    turns.push(ScriptedTurn::error(ModelError::PromptTooLong(
        "context length exceeded".into(),
    )));
    turns.push(ScriptedTurn::text("SUMMARY: read a.c four times"));
    turns.push(ScriptedTurn::text("final"));
    let mut config = EngineConfig::default();
    config.context.keep_recent_turns = 2;
    let (engine, model) = engine(config, turns, reg, auto_all());
    let (stream, _) = engine.start("s", "sys", "the task");
    let (events, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "final");
    let state = outcome.state();
    assert_eq!(state.recovery().compactions, 1);
    let reasons = state.reasons();
    assert_eq!(
        &reasons[reasons.len() - 2..],
        &[R::ModelRecoveryRetry, R::ModelReturnedFinal]
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ContextCompacted { .. }))
    );

    let requests = model.requests();
    // The summarization request carries no tools and the older turns.
    let summarization = &requests[5];
    assert!(summarization.tools.is_empty());
    assert!(summarization.messages[1].content.contains("[tool]"));
    // The retried request: task kept, summary present, recent turns whole.
    let retried = &requests[6].messages;
    assert!(
        retried
            .iter()
            .any(|m| m.role == Role::User && m.content.starts_with("the task"))
    );
    assert!(
        retried
            .iter()
            .any(|m| m.content.contains("SUMMARY: read a.c four times"))
    );
    assert!(retried.len() < requests[4].messages.len());
    assert_view_pairs_intact(retried);
    // The full history still holds everything.
    assert_eq!(
        state
            .history()
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count(),
        4
    );
}

#[tokio::test]
async fn prompt_too_long_with_two_turns_in_view_summarizes_the_older() {
    // Four turns kept by default would keep both: the model's refusal
    // still has the older one summarized, and the retry goes through.
    let (mut turns, reg) = long_session(2, 400);
    turns.push(ScriptedTurn::error(ModelError::PromptTooLong(
        "the request exceeds the available context size".into(),
    )));
    turns.push(ScriptedTurn::text("SUMMARY: read a.c"));
    turns.push(ScriptedTurn::text("final"));
    let mut config = EngineConfig::default();
    config.context.keep_recent_turns = 4;
    let (engine, model) = engine(config, turns, reg, auto_all());
    let (stream, _) = engine.start("s", "sys", "the task");
    let (_, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "final");
    assert_eq!(outcome.state().recovery().compactions, 1);
    let requests = model.requests();
    let retried = &requests[requests.len() - 1].messages;
    assert!(
        retried
            .iter()
            .any(|m| m.content.contains("SUMMARY: read a.c"))
    );
    assert_view_pairs_intact(retried);
}

#[tokio::test]
async fn prompt_too_long_without_anything_to_compact_stops() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::error(ModelError::PromptTooLong(
            "too long".into(),
        ))],
        ToolRegistry::new(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::PromptTooLong);
}

/// Every assistant tool call in a view is followed by its results.
fn assert_view_pairs_intact(view: &[Message]) {
    for (i, message) in view.iter().enumerate() {
        if message.role == Role::Tool {
            let owner = view[..i]
                .iter()
                .rev()
                .find(|m| m.role != Role::Tool)
                .expect("a message before a tool result");
            assert_eq!(owner.role, Role::Assistant, "orphaned tool result at {i}");
            assert!(
                owner
                    .tool_calls
                    .iter()
                    .any(|c| Some(&c.id) == message.tool_call_id.as_ref())
            );
        }
        for call in &message.tool_calls {
            assert!(
                view.iter()
                    .any(|m| m.tool_call_id.as_deref() == Some(call.id.as_str())),
                "call {} has no result in view",
                call.id
            );
        }
    }
}

#[tokio::test]
async fn view_past_the_trigger_ratio_is_compacted_keeping_recent_turns() {
    let (mut turns, reg) = long_session(6, 800);
    let mut config = EngineConfig::default();
    config.context.window_tokens = 1_500;
    config.context.trigger_ratio = 0.5;
    config.context.keep_recent_turns = 2;
    // The step where the view first passes 750 tokens summarizes first.
    turns.insert(4, ScriptedTurn::text("SUMMARY"));
    turns.push(ScriptedTurn::text("SUMMARY 2"));
    turns.push(ScriptedTurn::text("final"));
    let (engine, model) = engine(config, turns, reg, auto_all());
    let (stream, _) = engine.start("s", "", "task");
    let (_, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "final");
    let state = outcome.state();
    assert!(state.recovery().compactions >= 1);
    let requests = model.requests();
    for request in requests.iter().filter(|r| !r.tools.is_empty()) {
        assert_view_pairs_intact(&request.messages);
    }
    let last = &requests.last().expect("requests").messages;
    // Two kept turns: the last assistant call with its result, and before it.
    let assistants = last.iter().filter(|m| m.role == Role::Assistant).count();
    assert_eq!(assistants, 2, "{last:#?}");
    // The summary follows the pinned task in the same user message: no
    // system message but the first, no two user messages in a row.
    assert!(
        last.iter()
            .any(|m| m.role == Role::User && m.content.contains("Summary of the earlier"))
    );
    assert!(last.iter().skip(1).all(|m| m.role != Role::System));
}

#[tokio::test]
async fn working_state_time_and_context_usage_are_injected() {
    let tool = FnTool::with_effects(
        "write_file",
        vec![
            Effect::State {
                key: "source_file".into(),
                value: json!("gemm.c"),
                append: false,
            },
            Effect::State {
                key: "compile_results".into(),
                value: json!({"ok": true}),
                append: true,
            },
            Effect::State {
                key: "tile".into(),
                value: json!(64),
                append: false,
            },
        ],
    );
    let (engine, model) = engine(
        EngineConfig::default(),
        call_then("c1", "write_file", "{}", "ok"),
        registry(vec![tool]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    let working = outcome.state().working_state();
    assert_eq!(working.source_file.as_deref(), Some("gemm.c"));
    assert_eq!(working.compile_results, vec![json!({"ok": true})]);
    assert_eq!(working.extra.get("tile"), Some(&json!(64)));
    let requests = model.requests();
    let injected = &requests[1].messages.last().expect("messages");
    // After a tool result, the session context is a user message of its own.
    assert_eq!(injected.role, Role::User);
    assert!(injected.content.starts_with("[session context]"));
    for part in [
        "current time: 2023-11-14T22:13:20Z",
        "\"source_file\":\"gemm.c\"",
        "tokens (",
        "step 2 of 40",
    ] {
        assert!(
            injected.content.contains(part),
            "{part}: {}",
            injected.content
        );
    }
    assert_one_injection_in_the_last_message(&requests);
    // Everything before the per-step tail is byte-identical in the next
    // request: the first request's task without its injection.
    let first = &requests[0].messages;
    let task = first[0]
        .content
        .split("\n\n[session context]")
        .next()
        .expect("task text");
    assert_eq!(requests[1].messages[0].content, task);
    assert_eq!(requests[1].messages[0].role, first[0].role);
    assert_eq!(
        requests[1].messages[0].role,
        Role::User,
        "no empty system prompt"
    );
    assert_eq!(
        requests[1].messages.len(),
        4,
        "task, call, result, injection"
    );
    // The first view had nothing to report.
    assert!(
        !requests[0]
            .messages
            .last()
            .expect("m")
            .content
            .contains("working state")
    );
    assert_injection_can_go_in_the_last_tool_result().await;
}

/// Every request carries the session context once, in its last message, in
/// a shape every chat template accepts.
fn assert_one_injection_in_the_last_message(requests: &[ChatRequest]) {
    // The view is extended in place between turns: one injection, in the
    // last message (on the first step, appended to the task itself).
    for request in requests {
        let injections = request
            .messages
            .iter()
            .filter(|m| m.content.contains("[session context]"))
            .count();
        assert_eq!(injections, 1);
        assert!(
            request
                .messages
                .last()
                .expect("m")
                .content
                .contains("[session context]")
        );
        // A shape every chat template accepts: no system message but the
        // first, no two user or two assistant messages in a row.
        assert!(
            request
                .messages
                .iter()
                .skip(1)
                .all(|m| m.role != Role::System)
        );
        for pair in request.messages.windows(2) {
            assert!(
                !(pair[0].role == pair[1].role
                    && matches!(pair[0].role, Role::User | Role::Assistant)),
                "{:#?}",
                request.messages
            );
        }
    }
}

/// The session context is placed in the last tool result instead, when so
/// configured.
async fn assert_injection_can_go_in_the_last_tool_result() {
    let tool = FnTool::with_effects("write_file", vec![]);
    let mut config = EngineConfig::default();
    config.injection.placement = mtswarm_core::InjectionPlacement::ToolResult;
    let (placed, model) = engine(
        config,
        call_then("c1", "write_file", "{}", "ok"),
        registry(vec![tool]),
        auto_all(),
    );
    run_go(&placed).await;
    let requests = model.requests();
    let last = requests[1].messages.last().expect("messages");
    assert_eq!(last.role, Role::Tool);
    assert!(last.content.contains("[session context]"), "{last:#?}");
    assert_eq!(requests[1].messages.len(), 3, "task, call, result");
}

#[tokio::test]
async fn cancel_stops_a_running_tool() {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let tool = FnTool::new("benchmark", move |_, _| {
        if let Some(tx) = started_tx.lock().expect("lock").take() {
            let _ = tx.send(());
        }
        futures::future::pending()
    });
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::call("c1", "benchmark", "{}")],
        registry(vec![tool]),
        auto_all(),
    );
    let outcome = cancel_once_started(&engine, started_rx).await;
    assert_eq!(stop_reason(&outcome), StopReason::Cancelled);
    assert_eq!(
        outcome.state().last_transition().map(|t| t.reason),
        Some(R::Cancelled)
    );
}

/// A model whose turn never ends; tells the test when it was called.
struct StuckModel(std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>);

#[async_trait::async_trait]
impl ChatModel for StuckModel {
    fn model_name(&self) -> &str {
        "stuck"
    }
    async fn stream(&self, _request: ChatRequest) -> Result<ModelStream, ModelError> {
        if let Some(tx) = self.0.lock().expect("lock").take() {
            let _ = tx.send(());
        }
        Ok(Box::pin(futures::stream::pending()))
    }
}

#[tokio::test]
async fn cancel_interrupts_a_model_call() {
    let (called_tx, called_rx) = tokio::sync::oneshot::channel();
    let engine = Engine::new(
        EngineConfig::default(),
        Arc::new(StuckModel(std::sync::Mutex::new(Some(called_tx)))),
        ToolRegistry::new(),
        auto_all(),
        Arc::new(LocalResourceLock::default()),
    );
    let outcome = cancel_once_started(&engine, called_rx).await;
    assert_eq!(stop_reason(&outcome), StopReason::Cancelled);
    assert_eq!(outcome.state().reasons(), vec![R::UserInput, R::Cancelled]);
}
