//! The completion gate: PASS, FAIL with feedback (and a tool call asked
//! for) then PASS, exhaustion, UNVERIFIED for best-effort jobs, and evidence voided by a later edit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_core::model::ToolChoice;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::*;
use serde_json::json;

use TransitionReason as R;

fn gated(kinds: &[&str], best_effort: bool, max_blocks: u32) -> EngineConfig {
    EngineConfig {
        gate: GateConfig {
            require_evidence: Some(kinds.iter().map(|k| (*k).to_owned()).collect()),
            best_effort,
            max_blocks,
        },
        ..EngineConfig::default()
    }
}

fn evidence(kind: &str, passed: bool) -> Effect {
    Effect::Evidence {
        kind: kind.to_owned(),
        passed,
        summary: json!({"cycles": 1200}),
    }
}

/// The run ended with `text`, verified.
fn assert_passed_with(outcome: &Outcome, text: &str) {
    assert!(
        matches!(outcome, Outcome::Final { text: t, verdict: Verdict::Pass, .. } if t == text),
        "{outcome:?}"
    );
}

fn tools() -> ToolRegistry {
    registry(vec![
        FnTool::with_effects("validate", vec![evidence("validate", true)]),
        FnTool::with_effects("benchmark", vec![evidence("benchmark", true)]),
        FnTool::with_effects("failing_validate", vec![evidence("validate", false)]),
        FnTool::with_effects(
            "write_file",
            vec![Effect::Mutation {
                target: "gemm.c".to_owned(),
            }],
        ),
    ])
}

#[tokio::test]
async fn job_without_requirements_passes() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::text("2x faster")],
        tools(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert!(matches!(
        outcome,
        Outcome::Final {
            verdict: Verdict::Pass,
            ..
        }
    ));
}

#[tokio::test]
async fn gate_fail_injects_feedback_then_passes_with_evidence() {
    let (engine, model) = engine(
        gated(&["validate"], false, 2),
        vec![
            ScriptedTurn::text("it is 2x faster"),
            ScriptedTurn::call("v1", "validate", "{}"),
            ScriptedTurn::text("validated: 2x faster"),
        ],
        tools(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_passed_with(&outcome, "validated: 2x faster");
    let state = outcome.state();
    assert_eq!(
        state.reasons(),
        vec![
            R::UserInput,
            R::StopHookBlocking,
            R::ModelReturnedToolCalls,
            R::ToolsRouted,
            R::ToolsExecuted,
            R::ObservationsRecorded,
            R::ModelReturnedFinal
        ]
    );
    assert_eq!(state.recovery().completion_blocks, 1);
    let feedback = model.last_user_message(1);
    assert!(feedback.contains("validate"), "{feedback}");
    // The turn after a refusal asks for a call; the one after that is free.
    let choices: Vec<ToolChoice> = model
        .requests()
        .iter()
        .map(|r| r.tool_choice.clone())
        .collect();
    assert_eq!(
        choices,
        [ToolChoice::Auto, ToolChoice::Required, ToolChoice::Auto]
    );
}

#[tokio::test]
async fn failed_evidence_does_not_count() {
    let (engine, _) = engine(
        gated(&["validate"], false, 0),
        call_then("v1", "failing_validate", "{}", "done"),
        tools(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::CompletionGateFailed);
}

#[tokio::test]
async fn gate_rejections_are_bounded() {
    let (engine, model) = engine(
        gated(&["benchmark"], false, 2),
        vec![
            ScriptedTurn::text("fast"),
            ScriptedTurn::text("really fast"),
            ScriptedTurn::text("trust me"),
            ScriptedTurn::text("unused"),
        ],
        tools(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_eq!(stop_reason(&outcome), StopReason::CompletionGateFailed);
    assert_eq!(
        outcome.state().reasons(),
        vec![
            R::UserInput,
            R::StopHookBlocking,
            R::StopHookBlocking,
            R::CompletionGateExhausted
        ]
    );
    assert_eq!(model.remaining(), 1);
}

#[tokio::test]
async fn evidence_before_the_latest_edit_is_void() {
    let (engine, model) = engine(
        gated(&["validate", "benchmark"], false, 1),
        vec![
            ScriptedTurn::call("v1", "validate", "{}"),
            ScriptedTurn::call("b1", "benchmark", "{}"),
            ScriptedTurn::call("w1", "write_file", "{}"),
            ScriptedTurn::text("done, 3x"),
            ScriptedTurn::tool_calls([call("v2", "validate", "{}"), call("b2", "benchmark", "{}")]),
            ScriptedTurn::text("re-verified, 3x"),
        ],
        tools(),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    assert_passed_with(&outcome, "re-verified, 3x");
    let state = outcome.state();
    assert_eq!(state.recovery().completion_blocks, 1);
    let text = model.last_user_message(4);
    assert!(text.contains("'gemm.c' changed"), "{text}");
    assert!(text.contains("validate, benchmark"), "{text}");
    assert!(state.evidence().has_valid("validate"));
}

#[tokio::test]
async fn best_effort_job_ends_unverified_when_evidence_is_missing() {
    let (engine, _) = engine(
        gated(&["validate", "benchmark"], true, 2),
        call_then("v1", "validate", "{}", "probably faster"),
        tools(),
        auto_all(),
    );
    let (events, outcome) = run_go(&engine).await;
    let expected = Verdict::Unverified {
        missing: vec!["benchmark".to_owned()],
    };
    assert!(matches!(&outcome, Outcome::Final { verdict, .. } if *verdict == expected));
    assert!(
        events.iter().any(
            |e| matches!(&e.kind, EventKind::ReplyEnd { verdict, .. } if *verdict == expected)
        )
    );
}

#[tokio::test]
async fn evidence_a_tool_does_not_declare_does_not_pass_the_gate() {
    // A tool that declares only state effects claims a passed validate:
    // the engine drops the claim, so the gate still finds no evidence.
    let liar = FnTool::with_effects("read_file", vec![evidence("validate", true)])
        .declaring(&[EffectKind::State]);
    let (engine, _) = engine(
        gated(&["validate"], false, 1),
        vec![
            ScriptedTurn::call("r1", "read_file", "{}"),
            ScriptedTurn::text("validated: 2x faster"),
            ScriptedTurn::text("validated, really"),
        ],
        registry(vec![liar]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    let state = outcome.state();
    assert!(
        state.evidence().records.is_empty(),
        "{:?}",
        state.evidence()
    );
    assert!(
        !matches!(
            outcome,
            Outcome::Final {
                verdict: Verdict::Pass,
                ..
            }
        ),
        "{outcome:?}"
    );
    // Declared, the same claim counts.
    let honest = FnTool::with_effects("validate", vec![evidence("validate", true)]);
    let (engine, _) = engine_with(honest);
    let (_, outcome) = run_go(&engine).await;
    assert_passed_with(&outcome, "validated: 2x faster");
}

fn engine_with(tool: FnTool) -> (Engine, std::sync::Arc<ScriptedModel>) {
    engine(
        gated(&["validate"], false, 1),
        vec![
            ScriptedTurn::call("v1", "validate", "{}"),
            ScriptedTurn::text("validated: 2x faster"),
        ],
        registry(vec![tool]),
        auto_all(),
    )
}
