//! A call the model client saw attempted in text but could not read
//! (`ToolCall::unreadable`): the engine answers it as a protocol error
//! carrying the client's problem text, on the path of arguments that are
//! not JSON, and the run goes on; beside a good call, the good call runs.

use crate::common;

use common::*;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::*;

use TransitionReason as R;

const PROBLEM: &str = "a tool call that is not valid JSON. Write each tool call as {\"name\": ...}";

#[tokio::test]
async fn an_unreadable_call_is_a_protocol_error_naming_its_problem_then_the_run_goes_on() {
    let (events, outcome, model) =
        refused_then_read(ScriptedTurn::tool_calls([ToolCall::unreadable(
            "u1", PROBLEM,
        )]))
        .await;
    let state = outcome.state();
    assert_eq!(final_text(&outcome), "done");
    assert_eq!(state.risk().protocol_errors, 2);
    assert_eq!(state.risk().unknown_tool, 0, "not an unknown tool");
    assert_eq!(state.reasons()[1..3], [R::ModelRecoveryRetry; 2]);
    let requests = model.requests();
    assert_eq!(
        requests[1].messages[..requests[0].messages.len() - 1],
        requests[0].messages[..requests[0].messages.len() - 1],
        "the first unreadable reply is asked again as it was (only the session context differs)"
    );
    assert_eq!(requests[1].messages.len(), requests[0].messages.len());
    let told = requests[2]
        .messages
        .iter()
        .find(|m| m.tool_call_id.as_deref() == Some("u1"))
        .map(|m| m.content.clone())
        .expect("the protocol error, as the call's result");
    assert_eq!(told, format!("error: protocol error: {PROBLEM}"));
    assert!(
        tool_results(&events)
            .iter()
            .any(|(id, ok, content)| id == "u1" && !ok && content.contains("not valid JSON")),
        "{:?}",
        tool_results(&events)
    );
}

#[tokio::test]
async fn beside_a_good_call_the_good_call_runs_and_the_unreadable_one_is_answered() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![
            ScriptedTurn::tool_calls([
                call("c1", "read_file", r#"{"path": "a.c"}"#),
                ToolCall::unreadable("u2", PROBLEM),
            ]),
            ScriptedTurn::text("done"),
        ],
        registry(vec![FnTool::echo("read_file", "contents")]),
        auto_all(),
    );
    let (_, outcome) = run_go(&engine).await;
    let state = outcome.state();
    assert_eq!(final_text(&outcome), "done");
    assert_eq!(observation(state, "c1"), "contents");
    assert_eq!(
        observation(state, "u2"),
        format!("error: protocol error: {PROBLEM}")
    );
    assert_eq!(state.risk().protocol_errors, 1);
    assert_eq!(state.risk().unknown_tool, 0, "never routed as a tool");
}
