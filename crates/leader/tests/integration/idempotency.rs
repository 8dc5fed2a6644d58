//! Idempotent tool re-execution: a leader that resumes a job from a
//! checkpoint taken before its `spawn_agent` and `assign_task` calls ran
//! (a crash after the calls but before the next checkpoint) runs those
//! calls again; they find the agent and the task in the job record and
//! neither spawn a second agent nor publish the task again.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use futures::StreamExt as _;
use mtswarm_bus::{Jobs, KvChange, v1};
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::{LoopState, Node};

/// One task of agent `a1` on `fi1-c0`.
fn script() -> Vec<ScriptedTurn> {
    let assign = ScriptedTurn::tool_calls([assign_call("t1", "part 1", 1)]);
    spawn_assign_collect("fi1-c0", assign, 2.0)
}

/// True when the checkpoint is about to run a `spawn_agent` call.
fn before_spawn(state_json: &[u8]) -> bool {
    let Ok(state) = LoopState::from_json(&String::from_utf8_lossy(state_json)) else {
        return false;
    };
    matches!(state.node(), Node::ToolRouting | Node::ToolExecution)
        && state.calls().iter().any(|c| c.call.name == "spawn_agent")
}

#[tokio::test]
async fn reexecuted_assign_and_spawn_calls_do_not_repeat_work() {
    let env = Env::start().await;
    let mut worker = FakeWorker::start(&env.bus, "fi1", "fi1").await;
    let jobs = Jobs::open(&env.bus).await.expect("jobs");
    let mut changes = jobs.watch_loop_states().await.expect("loop states watch");
    let mut tasks = task_stream(&env.bus, "fi1").await;

    let model_a = Arc::new(ConversationScript::new(script(), Some(2)));
    let leader_a = env.leader(model_a).await;
    let mut control_a = control(&leader_a).await;
    let job_id = submit(&mut control_a, "Tune k1.").await;
    // The checkpoint taken before the spawn ran.
    let early_state = within("a checkpoint before the spawn", async {
        loop {
            let change = changes.next().await.expect("watch item").expect("change");
            if let KvChange::Put { value, .. } = change
                && value.value.job_id == job_id
                && before_spawn(&value.value.state_json)
            {
                return value.value;
            }
        }
    })
    .await;
    let delivery = next_task(&mut tasks, "the task").await;
    let task = delivery.message().clone();
    delivery.ack().await.expect("ack");
    record_when(
        &env.bus,
        &job_id,
        "leader A to record the task's publish",
        |record| {
            record
                .tasks
                .first()
                .and_then(|t| t.assignment.as_ref())
                .is_some_and(|a| a.assigned_at.is_some())
        },
    )
    .await;
    leader_a.abort().await;
    // The crash lost every checkpoint after the one before the spawn.
    jobs.put_loop_state(&early_state)
        .await
        .expect("rewind the leader checkpoint");

    let leader_b = env
        .leader(Arc::new(ConversationScript::new(script(), None)))
        .await;
    let mut control_b = control(&leader_b).await;
    assert_eq!(
        (task.job_id.as_str(), task.agent_id.as_str()),
        (job_id.as_str(), "a1")
    );
    publish_measured(&env.bus, &ok_result(&task, 1, 2.0))
        .await
        .expect("result");
    let events = watch_to_end(&mut control_b, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    // Both executions of the assign call answered with the same task.
    let assigned: Vec<String> = leader_tool_outputs(&events, "assign_task")
        .iter()
        .filter_map(|c| c["task_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(assigned, vec![task.task_id.clone(), task.task_id.clone()]);

    let spawns = worker.spawns_so_far();
    assert_eq!(
        spawns.len(),
        2,
        "the original spawn and its idempotent re-issue"
    );
    assert!(!spawns[0].resume);
    assert!(spawns[1].resume);
    assert_eq!(spawns[1].session_id, spawns[0].session_id);
    assert_eq!(spawns[1].slice_id, spawns[0].slice_id);

    let record = job_record(&env.bus, &job_id).await;
    assert_eq!(record.agents.len(), 1, "{:?}", record.agents);
    assert_eq!(record.agent_ids, vec!["a1".to_string()]);
    assert_eq!(record.tasks.len(), 1);
    assert_eq!((record.tasks_total, record.tasks_done), (1, 1));
    assert_eq!(record.tasks[0].assign_call_id, "t1@2");
    assert_eq!(
        tasks_published(&env.bus).await,
        1,
        "the task was published once"
    );
    leader_b.shutdown().await.expect("shutdown");
}
