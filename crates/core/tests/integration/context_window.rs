//! A model served with a small context window (a local server's slot)
//! shrinks the engine's window: the conversation is compacted before it
//! outgrows the model's window, and no tool result fills it alone. A model
//! that is a program reading its whole conversation (the builtin worker policy)
//! is sent all of it.

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::*;

/// Six calls whose results are 3,000 characters each, a summary turn where
/// the compaction asks for one, and a final answer.
fn session() -> (Vec<ScriptedTurn>, ToolRegistry) {
    let mut turns: Vec<ScriptedTurn> = (0..6)
        .map(|i| ScriptedTurn::call(&format!("c{i}"), "read_file", "{}"))
        .collect();
    turns.push(ScriptedTurn::text("SUMMARY"));
    turns.push(ScriptedTurn::text("SUMMARY 2"));
    turns.push(ScriptedTurn::text("final"));
    let tools = registry(vec![FnTool::echo("read_file", &"r".repeat(3_000))]);
    (turns, tools)
}

async fn run_with(model: ScriptedModel, tools: ToolRegistry) -> (Outcome, Arc<ScriptedModel>) {
    let model = Arc::new(model);
    let engine = Engine::new(
        EngineConfig::default(),
        model.clone(),
        tools,
        auto_all(),
        Arc::new(LocalResourceLock::default()),
    );
    let (stream, _) = engine.start("s", "", "task");
    let (_, outcome) = run(stream).await;
    (outcome, model)
}

#[tokio::test]
async fn a_model_with_a_small_window_gets_compacted_views_and_cut_tool_results() {
    let (turns, tools) = session();
    let (outcome, model) =
        run_with(ScriptedModel::new(turns).with_context_window(2_000), tools).await;
    assert!(
        outcome.state().recovery().compactions >= 1,
        "a 2,000-token window is compacted"
    );
    for request in model.requests() {
        for message in request.messages.iter().filter(|m| m.role == Role::Tool) {
            assert!(
                message.content.chars().count() < 2_100,
                "a tool result of {} characters reached a 2,000-token window",
                message.content.chars().count()
            );
        }
    }
}

#[tokio::test]
async fn a_model_without_a_window_keeps_the_engines() {
    let (turns, tools) = session();
    let (outcome, model) = run_with(ScriptedModel::new(turns), tools).await;
    assert_eq!(outcome.state().recovery().compactions, 0);
    let longest = model
        .requests()
        .iter()
        .flat_map(|r| r.messages.iter())
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.chars().count())
        .max();
    assert_eq!(longest, Some(3_000), "the default cut is 4,000 characters");
}

#[tokio::test]
async fn a_model_that_reads_its_whole_conversation_is_never_compacted_or_cut() {
    // A window smaller than one tool result: any other model is compacted
    // and has every result cut.
    let (turns, tools) = session();
    let (outcome, model) = run_with(
        ScriptedModel::new(turns)
            .with_context_window(500)
            .reading_whole_conversation(),
        tools,
    )
    .await;
    assert_eq!(outcome.state().recovery().compactions, 0);
    let requests = model.requests();
    let last = requests.last().expect("requests");
    let results: Vec<usize> = last
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.chars().count())
        .collect();
    assert_eq!(results, vec![3_000; 6], "every result, whole");
}
