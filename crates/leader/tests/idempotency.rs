//! Idempotent tool re-execution: a leader that resumes a job from a
//! checkpoint taken before its `spawn_agent` and `assign_task` calls ran
//! (a crash after the calls but before the next checkpoint) runs those
//! calls again; they find the agent and the task in the job record and
//! neither spawn a second agent nor publish the task again.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

use std::sync::Arc;

use common::*;
use futures::StreamExt as _;
use mtswarm_bus::{Jobs, KvChange, subjects, v1};
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::{LoopState, Node};
use mtswarm_leader::LeaderDaemon;
use serde_json::{Value, json};

fn script() -> Vec<ScriptedTurn> {
    vec![
        ScriptedTurn::call(
            "s1",
            "spawn_agent",
            r#"{"name":"a1","slice_id":"fi1-c0","instructions":"tune"}"#,
        ),
        ScriptedTurn::call(
            "t1",
            "assign_task",
            r#"{"agent":"a1","instructions":"part 1","parameters":{"candidates":[{"A":1}]}}"#,
        ),
        ScriptedTurn::call(
            "c1",
            "collect_result",
            r#"{"mode":"all","timeout_seconds":60}"#,
        ),
        ScriptedTurn::text("Done.\n```json\n{\"best\":{\"gflops\":2.0}}\n```"),
    ]
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
    let mut changes = jobs.watch().await.expect("jobs watch");
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
                && before_spawn(&value.value.leader_state_json)
            {
                return value.value.leader_state_json;
            }
        }
    })
    .await;
    let delivery = within("the task", tasks.next())
        .await
        .expect("a task")
        .expect("decodable");
    let task = delivery.message().clone();
    delivery.ack().await.expect("ack");
    eventually("leader A to record the task's publish", || async {
        let record = jobs.get(&job_id).await.ok()??.value;
        record
            .tasks
            .first()
            .and_then(|t| t.assignment.as_ref())
            .and_then(|a| a.assigned_at)
            .map(|_| ())
    })
    .await;
    leader_a.abort().await;
    // The crash lost every checkpoint after the one before the spawn.
    jobs.modify(&job_id, |record| {
        record.leader_state_json = early_state.clone();
    })
    .await
    .expect("rewind the leader checkpoint");

    let model_b = Arc::new(ConversationScript::new(script(), None));
    let config = env
        .config()
        .with_model_factory(Arc::new(move |_spec: &v1::JobSpec| Ok(model_b.clone())));
    let leader_b = LeaderDaemon::start(config).await.expect("leader B starts");
    let mut control_b = control(&leader_b).await;
    publish_measured(
        &env.bus,
        &v1::TaskResult {
            task_id: task.task_id.clone(),
            attempt: 1,
            job_id: job_id.clone(),
            agent_id: "a1".into(),
            session_id: task.session_id.clone(),
            worker_id: task.worker_id.clone(),
            slice_id: task.slice_id.clone(),
            status: v1::TaskStatus::Ok as i32,
            result_json: json!({"best": {"gflops": 2.0}}).to_string(),
            ..Default::default()
        },
    )
    .await
    .expect("result");
    let events = watch_to_end(&mut control_b, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    // Both executions of the assign call answered with the same task.
    let assigned: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::AgentEvent(a)) if a.agent_id == "leader" => {
                let payload: Value = serde_json::from_str(&a.payload_json).ok()?;
                (payload["type"] == "tool_result" && payload["name"] == "assign_task")
                    .then(|| serde_json::from_str::<Value>(payload["content"].as_str()?).ok())
                    .flatten()
                    .and_then(|c| c["task_id"].as_str().map(str::to_string))
            }
            _ => None,
        })
        .collect();
    assert_eq!(assigned, vec![task.task_id.clone(), task.task_id.clone()]);

    let mut spawns = Vec::new();
    while let Ok(call) = worker.calls.try_recv() {
        if let WorkerCall::Spawn(spawn) = call {
            spawns.push(spawn);
        }
    }
    assert_eq!(
        spawns.len(),
        2,
        "the original spawn and its idempotent re-issue"
    );
    assert!(!spawns[0].resume);
    assert!(spawns[1].resume);
    assert_eq!(spawns[1].session_id, spawns[0].session_id);
    assert_eq!(spawns[1].slice_id, spawns[0].slice_id);

    let record = jobs.get(&job_id).await.expect("read").expect("job").value;
    assert_eq!(record.agents.len(), 1, "{:?}", record.agents);
    assert_eq!(record.agent_ids, vec!["a1".to_string()]);
    assert_eq!(record.tasks.len(), 1);
    assert_eq!((record.tasks_total, record.tasks_done), (1, 1));
    assert_eq!(record.tasks[0].assign_call_id, "t1@2");
    let mut stream = env
        .bus
        .jetstream()
        .get_stream(subjects::TASKS_STREAM)
        .await
        .expect("tasks stream");
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.last_sequence, 1, "the task was published once");
    leader_b.shutdown().await.expect("shutdown");
}
