//! The leader's completion gate pushes back on a model that gives up
//! early: an answer before any task was assigned is refused with what to
//! do next and the loop goes on to a measured result; a model that keeps
//! giving up fails the job after the refusals are spent, with a summary a
//! person can read. A model that repeats its assignment waits for the task
//! it already gave instead of giving another.

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_bus::v1;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use serde_json::json;

/// What a small model answered at its first step in the field: a
/// pretty-printed final answer claiming nothing, before doing anything.
const GIVING_UP: &str = "{\n  \"best\": null,\n  \"error\": \"nothing worked\"\n}";

/// Call `id` spawns agent `a1` on the fake worker's slice.
fn spawn_a1(id: &str) -> ScriptedTurn {
    let spawn = json!({"name": "a1", "slice_id": "fb0-c0", "instructions": "tune"});
    ScriptedTurn::call(id, "spawn_agent", &spawn.to_string())
}

/// Call `id` collects every result; then the answer naming the best.
fn collect_then_answer(id: &str) -> [ScriptedTurn; 2] {
    [
        ScriptedTurn::call(
            id,
            "collect_result",
            r#"{"mode":"all","timeout_seconds":60}"#,
        ),
        ScriptedTurn::text("Done: A=1 at 2.5 GFLOPS.\n```json\n{\"best\":{\"gflops\":2.5}}\n```"),
    ]
}

/// Answers refused before the loop stops: the leader's refusal budget
/// (three) plus the answer that finds it spent.
const ANSWERS_TO_FAIL: usize = 4;

#[tokio::test]
async fn an_answer_before_any_task_is_refused_and_the_loop_goes_on_to_a_result() {
    let env = Env::start().await;
    let _worker = FakeWorker::start(&env.bus, "fw1", "fb0").await;
    let (answer, _tasks) = answer_tasks(&env.bus, "fw1", |_| 2.5);
    let model = Arc::new(ScriptedModel::new(
        [
            ScriptedTurn::text(GIVING_UP),
            spawn_a1("c1"),
            ScriptedTurn::tool_calls([assign_call("c2", "try", 1)]),
        ]
        .into_iter()
        .chain(collect_then_answer("c3")),
    ));
    let leader = env.leader(model.clone()).await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let events = watch_to_end(&mut control, &job_id, 0).await;
    let job = get_job(&mut control, &job_id).await.expect("get_job");
    assert_eq!(
        final_state(&events),
        Some(v1::JobState::Succeeded),
        "{}: {}",
        job.error,
        job.summary
    );
    assert_eq!(model.remaining(), 0, "every scripted turn was asked for");
    // The refusal is the next user message, saying what to do.
    let refusal = model.last_user_message(1);
    assert!(
        refusal.contains("no task has been assigned")
            && refusal.contains("spawn_agent")
            && refusal.contains("assign_task")
            && refusal.contains("collect_result"),
        "{refusal}"
    );
    assert!(job.summary.contains("2.5"), "{}", job.summary);
    answer.abort();
    leader.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_model_that_keeps_giving_up_fails_the_job_with_a_readable_summary() {
    let env = Env::start().await;
    let model = Arc::new(ScriptedModel::new(
        (0..ANSWERS_TO_FAIL + 1).map(|_| ScriptedTurn::text(GIVING_UP)),
    ));
    let leader = env.leader(model.clone()).await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Failed));
    // Refused three times, each refusal fed back; the fourth answer ends it.
    assert_eq!(model.requests().len(), ANSWERS_TO_FAIL);
    assert_eq!(model.remaining(), 1);
    for index in 1..ANSWERS_TO_FAIL {
        let refusal = model.last_user_message(index);
        assert!(refusal.contains("no task has been assigned"), "{refusal}");
    }
    let job = get_job(&mut control, &job_id).await.expect("get_job");
    assert!(
        job.error.contains("CompletionGateFailed") && job.error.contains("rejected 4 times"),
        "{}",
        job.error
    );
    assert!(
        job.summary
            .starts_with("The leader's loop ended without an accepted answer")
            && job.summary.contains("no task has been assigned")
            && !job.summary.contains("list_fleet"),
        "a sentence, not a brace: {:?}",
        job.summary
    );
    assert_eq!(job.final_answer, GIVING_UP, "the last answer is kept");
    leader.shutdown().await.expect("shutdown");
}

/// A small model repeats its `assign_task` without candidates while the
/// task runs. The repeat names no candidate, so it would get other
/// defaulted candidates than the running task took; it is the same call
/// all the same: nothing new is published, and it answers with the running
/// task's result once that comes.
#[tokio::test]
async fn a_repeated_assign_without_candidates_waits_for_the_running_task() {
    let env = Env::start().await;
    let _worker = FakeWorker::start(&env.bus, "fw1", "fb0").await;
    let assign = json!({"agent": "a1"}).to_string();
    let model = Arc::new(ScriptedModel::new(
        [
            spawn_a1("c1"),
            ScriptedTurn::call("c2", "assign_task", &assign),
            ScriptedTurn::call("c3", "assign_task", &assign),
        ]
        .into_iter()
        .chain(collect_then_answer("c4")),
    ));
    let leader = env.leader(model.clone()).await;
    let mut control = control(&leader).await;
    // One evaluation: each defaulted plan is one candidate, and a second
    // one would get another value of `A` than the first.
    let one_evaluation = v1::JobSpec {
        budgets: Some(v1::Budgets {
            max_evaluations: 1,
            ..Default::default()
        }),
        ..spec("Tune k1.")
    };
    let job_id = try_submit(&mut control, one_evaluation)
        .await
        .expect("submit");
    // The repeat is asked for while the first task is unanswered.
    eventually("the repeated assign_task", || {
        let asked = model.requests().len();
        async move { (asked >= 3).then_some(()) }
    })
    .await;
    let (answer, mut tasks) = answer_tasks(&env.bus, "fw1", |_| 2.5);
    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));
    assert_eq!(model.remaining(), 0, "every scripted turn was asked for");
    let mut published = 0;
    while tasks.try_recv().is_ok() {
        published += 1;
    }
    assert_eq!(published, 1, "the repeat published a task of its own");
    let outputs = leader_tool_outputs(&events, "assign_task");
    assert!(
        outputs.iter().any(|o| o["note"]
            .as_str()
            .is_some_and(|n| n.contains("assigned already"))),
        "{outputs:?}"
    );
    answer.abort();
    leader.shutdown().await.expect("shutdown");
}
