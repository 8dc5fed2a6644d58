//! Risk policy and human approval: pause, checkpoint, restore in a new
//! engine, resume with approve / deny / timeout; resume from any mid-run
//! checkpoint.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

// Tests tweak one knob of the defaults at a time.
#![allow(clippy::field_reassign_with_default)]

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::*;
use serde_json::json;

use TransitionReason as R;

fn counted_write(counter: Arc<Mutex<Vec<String>>>) -> FnTool {
    FnTool::new("write_file", move |args, _| {
        let counter = counter.clone();
        async move {
            let path = args["path"].as_str().unwrap_or("?").to_owned();
            counter.lock().expect("lock").push(path.clone());
            Ok(ToolOutput::text(format!("wrote {path}"))
                .with_effect(Effect::Mutation { target: path }))
        }
    })
    .risk(Risk::Medium)
}

fn script() -> Vec<ScriptedTurn> {
    vec![
        ScriptedTurn::tool_calls([
            call("r1", "read_file", r#"{"path":"a.c"}"#),
            call("w1", "write_file", r#"{"path":"a.c"}"#),
        ]),
        ScriptedTurn::call("w2", "write_file", r#"{"path":"b.c"}"#),
        ScriptedTurn::text("both files written"),
    ]
}

fn tools(writes: Arc<Mutex<Vec<String>>>) -> ToolRegistry {
    registry(vec![
        FnTool::echo("read_file", "int a;"),
        counted_write(writes),
    ])
}

fn paused(outcome: Outcome) -> (LoopState, Vec<ApprovalRequest>) {
    match outcome {
        Outcome::Paused {
            checkpoint,
            approvals,
        } => (checkpoint, approvals),
        other => panic!("expected a pause, got {other:?}"),
    }
}

fn approve(ids: &[&str]) -> HashMap<String, ApprovalDecision> {
    ids.iter()
        .map(|id| ((*id).to_owned(), ApprovalDecision::Approve))
        .collect()
}

#[tokio::test]
async fn medium_risk_call_pauses_and_approve_resumes() {
    let writes = Arc::default();
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("w1", "write_file", r#"{"path":"a.c"}"#, "done"),
        tools(Arc::clone(&writes)),
        RiskPolicy::default(),
    );
    let (events, outcome) = run_go(&engine).await;
    let (checkpoint, approvals) = paused(outcome);
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].call_id, "w1");
    assert_eq!(approvals[0].risk, Risk::Medium);
    assert_eq!(approvals[0].arguments, json!({"path": "a.c"}));
    assert_eq!(checkpoint.node(), Node::HumanApproval);
    assert_eq!(
        checkpoint.last_transition().map(|t| t.reason),
        Some(R::ApprovalRequired)
    );
    assert!(
        matches!(&events.last().expect("e").kind, EventKind::ApprovalRequired { approvals } if approvals.len() == 1)
    );
    assert!(
        writes.lock().expect("lock").is_empty(),
        "nothing ran before approval"
    );

    let (stream, _) = engine
        .resume_with_decisions(checkpoint, approve(&["w1"]))
        .expect("resumable");
    let (_, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "done");
    assert_eq!(*writes.lock().expect("lock"), vec!["a.c".to_owned()]);
    let reasons = outcome.state().reasons();
    assert!(
        reasons
            .windows(2)
            .any(|w| w == [R::ApprovalRequired, R::ApprovalDecided])
    );
}

#[tokio::test]
async fn denied_call_is_not_run_and_the_model_is_told_why() {
    let writes: Arc<Mutex<Vec<String>>> = Arc::default();
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("w1", "write_file", r#"{"path":"a.c"}"#, "ok, not writing"),
        tools(writes.clone()),
        RiskPolicy::default(),
    );
    let (checkpoint, _) = paused(run_go(&engine).await.1);
    let decisions = HashMap::from([(
        "w1".to_owned(),
        ApprovalDecision::Deny {
            reason: Some("do not touch a.c".to_owned()),
        },
    )]);
    let (stream, _) = engine
        .resume_with_decisions(checkpoint, decisions)
        .expect("resumable");
    let (events, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "ok, not writing");
    assert!(writes.lock().expect("lock").is_empty());
    let state = outcome.state();
    assert_eq!(state.risk().denied_approvals, 1);
    assert!(observation(state, "w1").contains("do not touch a.c"));
    assert!(
        tool_results(&events)
            .iter()
            .any(|(id, ok, _)| id == "w1" && !ok)
    );
}

#[tokio::test]
async fn approval_timeout_applies_the_configured_default() {
    for (default, runs) in [
        (ApprovalDecision::Deny { reason: None }, 0),
        (ApprovalDecision::Approve, 1),
    ] {
        let writes: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut config = EngineConfig::default();
        config.approval.on_timeout = default.clone();
        let (engine, _) = engine(
            config,
            call_then("w1", "write_file", r#"{"path":"a.c"}"#, "end"),
            tools(writes.clone()),
            RiskPolicy::default(),
        );
        let (checkpoint, _) = paused(run_go(&engine).await.1);
        let (stream, _) = engine
            .resume_with_timeout_default(checkpoint)
            .expect("resumable");
        let (_, outcome) = run(stream).await;
        assert_eq!(final_text(&outcome), "end");
        assert_eq!(writes.lock().expect("lock").len(), runs, "{default:?}");
        let state = outcome.state();
        assert!(state.reasons().contains(&R::ApprovalTimedOut));
        if runs == 0 {
            assert!(observation(state, "w1").contains("approval timed out"));
            assert_eq!(state.risk().denied_approvals, 1);
        }
    }
}

#[tokio::test]
async fn waiting_on_a_channel_resumes_on_decision_or_on_timeout() {
    let writes: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut config = EngineConfig::default();
    config.approval.timeout = Duration::from_millis(50);
    let turns = vec![
        ScriptedTurn::call("w1", "write_file", r#"{"path":"a.c"}"#),
        ScriptedTurn::call("w2", "write_file", r#"{"path":"b.c"}"#),
        ScriptedTurn::text("end"),
    ];
    let (engine, _) = engine(config, turns, tools(writes.clone()), RiskPolicy::default());
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let (checkpoint, _) = paused(run_go(&engine).await.1);
    tx.send(("w1".to_owned(), ApprovalDecision::Approve))
        .await
        .expect("send");
    let (stream, _) = engine
        .resume_when_decided(checkpoint, &mut rx)
        .await
        .expect("decided");
    let (checkpoint, approvals) = paused(run(stream).await.1);
    assert_eq!(approvals[0].call_id, "w2");
    // Nobody answers: the default (deny) applies after the timeout.
    let (stream, _) = engine
        .resume_when_decided(checkpoint, &mut rx)
        .await
        .expect("timed out");
    let (_, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "end");
    assert_eq!(*writes.lock().expect("lock"), vec!["a.c".to_owned()]);
    let reasons = outcome.state().reasons();
    assert!(reasons.contains(&R::ApprovalDecided) && reasons.contains(&R::ApprovalTimedOut));
}

#[tokio::test]
async fn resume_rejects_wrong_ids_and_states() {
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("w1", "write_file", r#"{"path":"a.c"}"#, "end"),
        tools(Arc::default()),
        RiskPolicy::default(),
    );
    let (checkpoint, _) = paused(run_go(&engine).await.1);
    assert!(matches!(
        engine.resume_with_decisions(checkpoint.clone(), approve(&["nope"])),
        Err(EngineError::UnknownCall(id)) if id == "nope"
    ));
    // No decision: resuming pauses again with the same request.
    let (stream, _) = engine.resume(checkpoint.clone()).expect("resumable");
    let (_, again) = paused(run(stream).await.1);
    assert_eq!(again[0].call_id, "w1");
    let (stream, _) = engine
        .resume_with_decisions(checkpoint, approve(&["w1"]))
        .expect("resumable");
    let (_, done) = run(stream).await;
    assert!(matches!(
        engine.resume(done.state().clone()),
        Err(EngineError::AlreadyFinished)
    ));
    assert!(matches!(
        engine.resume_with_timeout_default(done.state().clone()),
        Err(EngineError::NotPaused)
    ));
}

#[tokio::test]
async fn risk_overrides_and_auto_approve_modes() {
    let policy = RiskPolicy::default().with_override("read_file", Risk::High);
    assert_eq!(policy.risk_of("read_file", Risk::Low), Risk::High);
    // No table beside the tools: a tool's declared risk is its risk.
    assert_eq!(policy.risk_of("write_file", Risk::Medium), Risk::Medium);
    assert_eq!(policy.risk_of("write_file", Risk::Low), Risk::Low);
    assert_eq!(policy.risk_of("custom", Risk::High), Risk::High);
    assert!(!AutoApprove::Never.approves(Risk::Low));
    assert!(AutoApprove::LowOnly.approves(Risk::Low));
    assert!(!AutoApprove::LowOnly.approves(Risk::Medium));
    assert!(AutoApprove::UpToMedium.approves(Risk::Medium));
    assert!(!AutoApprove::UpToMedium.approves(Risk::High));
    assert!(AutoApprove::All.approves(Risk::High));

    // An override makes a low tool ask; UpToMedium lets writes through.
    let (engine, _) = engine(
        EngineConfig::default(),
        script(),
        tools(Arc::default()),
        policy.with_auto_approve(AutoApprove::UpToMedium),
    );
    let (_, approvals) = paused(run_go(&engine).await.1);
    let ids: Vec<&str> = approvals.iter().map(|a| a.call_id.as_str()).collect();
    assert_eq!(ids, vec!["r1"]);
}

/// Transitions (target, reason, step) with the approval detour removed: an
/// auto-approved run goes straight from routing to execution.
fn without_approvals(state: &LoopState) -> Vec<(Node, TransitionReason, u32)> {
    state
        .transitions()
        .iter()
        .filter(|t| {
            !matches!(
                t.reason,
                R::ApprovalRequired | R::ApprovalDecided | R::ApprovalTimedOut | R::ToolsRouted
            )
        })
        .map(|t| (t.to, t.reason, t.step))
        .collect()
}

#[tokio::test]
async fn paused_loop_survives_json_and_a_new_engine_and_matches_an_auto_run() {
    // Reference: everything auto-approved, one process.
    let auto_writes: Arc<Mutex<Vec<String>>> = Arc::default();
    let (auto_engine, _) = engine(
        EngineConfig::default(),
        script(),
        tools(auto_writes.clone()),
        auto_all(),
    );
    let (stream, _) = auto_engine.start("s", "sys", "write both");
    let (_, reference) = run(stream).await;
    assert_eq!(final_text(&reference), "both files written");

    // Paused run: each pause goes through JSON into a brand-new engine (a
    // new "process") whose model continues the script where it stopped.
    let writes: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut saved: Option<String> = None;
    let mut pauses = 0;
    let outcome = loop {
        let restored = saved
            .take()
            .map(|text| LoopState::from_json(&text).expect("checkpoint parses"));
        let turns_played = restored.as_ref().map_or(0, model_turns_played);
        let (engine, _) = engine(
            EngineConfig::default(),
            script().into_iter().skip(turns_played).collect(),
            tools(writes.clone()),
            RiskPolicy::default(),
        );
        let stream = match restored {
            None => engine.start("s", "sys", "write both").0,
            Some(restored) => {
                let decisions = restored
                    .awaiting_approval()
                    .map(|c| (c.call.id.clone(), ApprovalDecision::Approve))
                    .collect();
                engine
                    .resume_with_decisions(restored, decisions)
                    .expect("resumable")
                    .0
            }
        };
        let (_, outcome) = run(stream).await;
        drop(engine);
        match outcome {
            Outcome::Paused { checkpoint, .. } => {
                pauses += 1;
                saved = Some(checkpoint.to_json().expect("serializes"));
            }
            other => break other,
        }
    };
    assert_eq!(pauses, 2);
    assert_eq!(final_text(&outcome), final_text(&reference));
    assert_eq!(
        without_approvals(outcome.state()),
        without_approvals(reference.state())
    );
    assert_eq!(outcome.state().history(), reference.state().history());
    assert_eq!(
        *writes.lock().expect("lock"),
        *auto_writes.lock().expect("lock")
    );
    assert!(outcome.state().reasons().contains(&R::ApprovalDecided));
}

/// Keeps every checkpoint as JSON, the way the worker stores them in KV.
#[derive(Default)]
struct JsonSink(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl CheckpointSink for JsonSink {
    async fn save(
        &self,
        state: &LoopState,
        _durability: Durability,
    ) -> Result<(), CheckpointError> {
        let json = state
            .to_json()
            .map_err(|source| CheckpointError::Serialize {
                what: "loop state",
                source,
            })?;
        self.0
            .lock()
            .map_err(|e| CheckpointError::Store {
                reason: e.to_string(),
            })?
            .push(json);
        Ok(())
    }
}

#[tokio::test]
async fn any_mid_run_checkpoint_resumes_to_the_same_end() {
    let sink = Arc::new(JsonSink::default());
    let (full_engine, _) = engine(
        EngineConfig::default(),
        script(),
        tools(Arc::default()),
        auto_all(),
    );
    let full_engine = full_engine.with_checkpoint_sink(sink.clone());
    let (stream, _) = full_engine.start("s", "sys", "write both");
    let (_, reference) = run(stream).await;
    let checkpoints = sink.0.lock().expect("lock").clone();
    assert_eq!(checkpoints.len(), reference.state().transitions().len());

    for (index, json) in checkpoints.iter().enumerate() {
        let restored = LoopState::from_json(json).expect("checkpoint parses");
        if restored.node() == Node::Done {
            continue;
        }
        // The new process's model continues where the old one stopped:
        // one scripted turn per model call already recorded.
        let turns: Vec<ScriptedTurn> = script()
            .into_iter()
            .skip(model_turns_played(&restored))
            .collect();
        let (engine, _) = engine(
            EngineConfig::default(),
            turns,
            tools(Arc::default()),
            auto_all(),
        );
        let (stream, _) = engine.resume(restored.clone()).expect("resumable");
        let (events, outcome) = run(stream).await;
        assert_eq!(
            final_text(&outcome),
            final_text(&reference),
            "checkpoint {index}"
        );
        assert_eq!(
            outcome.state().reasons(),
            reference.state().reasons(),
            "checkpoint {index}"
        );
        assert_eq!(
            outcome.state().history(),
            reference.state().history(),
            "checkpoint {index}"
        );
        // Event numbering continues from the checkpoint.
        if let Some(first) = events.first() {
            assert_eq!(first.seq, restored_seq(json));
        }
    }
}

fn restored_seq(json: &str) -> u64 {
    let value: serde_json::Value = serde_json::from_str(json).expect("json");
    value["event_seq"].as_u64().expect("event_seq")
}

/// Model turns already played in a checkpoint's history (every turn of
/// this script leaves one assistant message).
fn model_turns_played(state: &LoopState) -> usize {
    state
        .history()
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count()
}
