//! A model that writes a task plan the worker could not read gets the field
//! named back from `assign_task`, and nothing is published: the plan is
//! checked on the leader's side before any task exists.

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_core::ToolCall;
use mtswarm_core::testing::ScriptedTurn;
use serde_json::{Value, json};

fn assign_with(parameters: Value) -> ScriptedTurn {
    let arguments = json!({"agent": "a1", "instructions": "try", "parameters": parameters});
    ScriptedTurn::tool_calls([ToolCall {
        id: "c2".into(),
        name: "assign_task".into(),
        arguments: arguments.to_string(),
    }])
}

/// The text the leader's `assign_task` call answered with.
fn assign_results(events: &[mtswarm_bus::v1::JobEvent]) -> Vec<String> {
    agent_events(events)
        .filter(|a| a.agent_id == "leader")
        .filter_map(|a| serde_json::from_str::<Value>(&a.payload_json).ok())
        .filter(|p| p["type"] == "tool_result" && p["name"] == "assign_task")
        .filter_map(|p| p["content"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_plan_that_does_not_read_is_refused_naming_the_field_and_nothing_is_published() {
    let env = Env::start().await;
    let _worker = FakeWorker::start(&env.bus, "fp1", "fp1").await;
    let bad = assign_with(json!({"candidates": [{"A": 1}], "strategy": "greedy"}));
    let script = spawn_assign_collect("fp1-c0", bad, 1.0);
    let leader = env
        .leader(Arc::new(ConversationScript::new(script, None)))
        .await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let events = watch_to_end(&mut control, &job_id, 0).await;
    let answers = assign_results(&events);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        answers[0].contains("`strategy`") && answers[0].contains("greedy"),
        "{answers:?}"
    );
    assert_eq!(tasks_published(&env.bus).await, 0, "no task was published");
    leader.shutdown().await.expect("shutdown");
}
