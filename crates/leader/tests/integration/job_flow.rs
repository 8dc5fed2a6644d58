//! A whole job against a fake worker daemon: a scripted leader model calls
//! list_fleet, spawn_agent, assign_task and collect_result; the fake worker
//! (a real Worker gRPC server in the workers KV plus a task consumer on the
//! bus) publishes agent events and results, including a result of an
//! attempt that is not current and a second copy of the accepted result.
//! WatchJob streams it all up to the final state.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use async_nats::jetstream::consumer::PullConsumer;
use common::*;
use mtswarm_bus::{subjects, v1};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use serde_json::{Value, json};

fn result_for(task: &v1::TaskAssignment, attempt: u32, gflops: f64) -> v1::TaskResult {
    v1::TaskResult {
        usage: Some(v1::Usage {
            steps: 3,
            ..Default::default()
        }),
        ..ok_result(task, attempt, gflops)
    }
}

fn agent_event(task: &v1::TaskAssignment, sequence: u64) -> v1::AgentEvent {
    v1::AgentEvent {
        job_id: task.job_id.clone(),
        agent_id: task.agent_id.clone(),
        session_id: task.session_id.clone(),
        sequence,
        step: 0,
        kind: v1::AgentEventKind::Log as i32,
        payload_json: json!({"n": sequence}).to_string(),
        timestamp: None,
    }
}

/// list_fleet, spawn_agent a1 on board fb0, assign it one candidate,
/// collect, answer.
fn job_script() -> ScriptedModel {
    ScriptedModel::new([
        ScriptedTurn::call("c1", "list_fleet", "{}"),
        ScriptedTurn::call(
            "c2",
            "spawn_agent",
            r#"{"name":"a1","selector":"board=fb0","role":"tuner","instructions":"tune"}"#,
        ),
        ScriptedTurn::call(
            "c3",
            "assign_task",
            r#"{"agent":"a1","instructions":"try these","parameters":{"candidates":[{"A":1}]}}"#,
        ),
        ScriptedTurn::call(
            "c4",
            "collect_result",
            r#"{"agents":["a1"],"mode":"all","timeout_seconds":30}"#,
        ),
        ScriptedTurn::text(
            "Best A=1.\n```json\n{\"best\":{\"params\":{\"A\":1},\"gflops\":1.5}}\n```",
        ),
    ])
}

/// The task the leader assigned after spawning a1 on fb0-c0: its first
/// attempt, on the spawned session, with the script's parameters.
fn assert_first_task(task: &v1::TaskAssignment, job_id: &str, spawn: &v1::SpawnSessionRequest) {
    assert_eq!(task.job_id, job_id);
    assert_eq!(task.agent_id, "a1");
    assert_eq!(task.session_id, spawn.session_id);
    assert_eq!(task.attempt, 1);
    assert_eq!(task.slice_id, "fb0-c0");
    assert_eq!(
        serde_json::from_str::<Value>(&task.parameters_json).expect("json"),
        json!({"candidates": [{"A": 1}]})
    );
}

/// What the fake worker sends for the task: two agent events, a result of
/// an attempt that is not current, the result, and a second copy of it
/// under another message id (so the stream keeps it and the leader's own
/// deduplication has to drop it). Returns the copy's stream sequence.
async fn answer_the_task(bus: &mtswarm_bus::Bus, task: &v1::TaskAssignment) -> u64 {
    bus.publish_event(&agent_event(task, 1))
        .await
        .expect("event 1");
    bus.publish_event(&agent_event(task, 2))
        .await
        .expect("event 2");
    // Not the current attempt: fenced off.
    publish_measured(bus, &result_for(task, 2, 99.0))
        .await
        .expect("attempt-2 result");
    publish_measured(bus, &result_for(task, 1, 1.5))
        .await
        .expect("result");
    publish_copy(bus, &result_for(task, 1, 7.0), "copy-of-the-result").await
}

/// Waits until the leader's own result consumer has acknowledged the
/// result stream up to `sequence`, and checks the server removes that
/// consumer once its leader stops pulling.
async fn await_results_handled(
    bus: &mtswarm_bus::Bus,
    leader: &mtswarm_leader::LeaderHandle,
    sequence: u64,
) {
    let stream = bus
        .jetstream()
        .get_stream(subjects::RESULTS_STREAM)
        .await
        .expect("results stream");
    // Each leader has a result consumer of its own, named by its id.
    let consumer_name =
        subjects::result_consumer_name(&format!("leader-{}", leader.leader_id())).expect("name");
    eventually("the leader to handle every result", || {
        let stream = stream.clone();
        let consumer_name = consumer_name.clone();
        async move {
            let mut consumer: PullConsumer = stream.get_consumer(&consumer_name).await.ok()?;
            let info = consumer.info().await.ok()?;
            (info.ack_floor.stream_sequence >= sequence).then_some(())
        }
    })
    .await;
    // A leader that is gone must not leave its consumer behind for good.
    let mut consumer: PullConsumer = stream
        .get_consumer(&consumer_name)
        .await
        .expect("the leader's consumer");
    let info = consumer.info().await.expect("consumer info");
    assert_eq!(
        info.config.inactive_threshold,
        std::time::Duration::from_secs(15 * 60),
        "the server removes the consumer of a leader that stopped pulling"
    );
}

/// The job's stream: its states in order, sequences increasing, one
/// accepted result (attempt 1), the worker's events in order, the leader's
/// four tool calls, and collect_result's summary of the accepted figure.
fn assert_job_events(events: &[v1::JobEvent]) {
    assert_eq!(final_state(events), Some(v1::JobState::Succeeded));
    assert_eq!(
        states(events),
        vec![
            v1::JobState::Queued,
            v1::JobState::Running,
            v1::JobState::Succeeded
        ]
    );
    let sequences: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{sequences:?}");
    let results = task_results(events);
    assert_eq!(results.len(), 1, "one accepted result: {results:?}");
    assert_eq!(results[0].attempt, 1);
    let worker_sequences: Vec<u64> = agent_events(events)
        .filter(|a| a.agent_id == "a1")
        .map(|a| a.sequence)
        .collect();
    assert_eq!(worker_sequences, vec![1, 2], "worker events in order");
    let leader_tools: Vec<String> = agent_events(events)
        .filter(|a| a.agent_id == "leader" && a.kind() == v1::AgentEventKind::ToolResult)
        .filter_map(|a| {
            let payload: Value = serde_json::from_str(&a.payload_json).ok()?;
            Some(payload["name"].as_str()?.to_string())
        })
        .collect();
    assert_eq!(
        leader_tools,
        vec!["list_fleet", "spawn_agent", "assign_task", "collect_result"]
    );
    let collected = leader_tool_outputs(events, "collect_result")
        .into_iter()
        .next()
        .expect("collect_result output");
    // The compact summary: the accepted attempt's figure, not the stale one.
    assert_eq!(collected["task_status"], json!({"ok": 1}));
    assert_eq!(collected["best"]["gflops"], json!(1.5));
    assert_eq!(collected["timed_out"], json!(false));
}

/// The job's record: SUCCEEDED with its one agent and task, and the
/// answer's best.
fn assert_job_record(job: &v1::JobRecord) {
    assert_eq!(job.state(), v1::JobState::Succeeded);
    assert_eq!(job.agent_ids, vec!["a1".to_string()]);
    assert_eq!((job.tasks_total, job.tasks_done), (1, 1));
    assert_eq!(
        serde_json::from_str::<Value>(&job.result_json).expect("result json")["best"]["gflops"],
        json!(1.5)
    );
}

#[tokio::test]
async fn scripted_leader_runs_a_job_on_a_fake_worker() {
    let env = Env::start().await;
    let mut worker = FakeWorker::start(&env.bus, "fw1", "fb0").await;
    // The answer waits until the test has seen the late duplicate handled.
    let model = Arc::new(GatedModel::new(job_script(), 4));
    let leader = env.leader(model.clone()).await;
    let mut control = control(&leader).await;
    let mut task_stream = task_stream(&env.bus, "fw1").await;

    let job_id = submit(&mut control, "Tune k1.").await;

    let spawn = worker.next_spawn("SpawnSession").await;
    assert_eq!(spawn.job_id, job_id);
    assert_eq!(spawn.agent_id, "a1");
    assert_eq!(spawn.slice_id, "fb0-c0");
    assert_eq!(spawn.kernel_dir, "k1");

    let delivery = next_task(&mut task_stream, "the task").await;
    let task = delivery.message().clone();
    assert_first_task(&task, &job_id, &spawn);
    let copy_sequence = answer_the_task(&env.bus, &task).await;
    delivery.ack().await.expect("task ack");
    await_results_handled(&env.bus, &leader, copy_sequence).await;
    model.open();

    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_job_events(&events);
    let job = get_job(&mut control, &job_id).await.expect("get_job");
    assert_job_record(&job);
    // The job's end releases its agents.
    let cancel = worker.next_cancel("CancelSession").await;
    assert_eq!(cancel.session_id, spawn.session_id);

    // Replay from the middle gives the tail, ending with the final state.
    let middle = events[events.len() / 2].sequence;
    let tail = watch_to_end(&mut control, &job_id, middle).await;
    assert_eq!(tail.first().map(|e| e.sequence), Some(middle));
    assert_eq!(final_state(&tail), Some(v1::JobState::Succeeded));
    leader.shutdown().await.expect("shutdown");
}

/// A job cancelled while a SpawnSession is in flight: the worker is told to
/// cancel before the session exists, so the leader must stop the session
/// once the spawn completes, and the agent stays cancelled.
#[tokio::test]
async fn a_job_cancelled_while_an_agent_spawns_stops_that_session() {
    let env = Env::start().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut worker = FakeWorker::start_with_gate(&env.bus, "fw1", "fb0", Some(gate.clone())).await;
    let model = Arc::new(ScriptedModel::new([
        ScriptedTurn::call("c1", "spawn_agent", r#"{"name":"a1","slice_id":"fb0-c0"}"#),
        ScriptedTurn::text("spawned"),
    ]));
    let leader = env.leader(model).await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1.").await;
    let session_id = worker.next_spawn_arrival("the SpawnSession").await;
    let (spawns, cancel) = cancel_while_spawning(
        &mut control,
        &job_id,
        &gate,
        &mut worker,
        "the session's cancellation",
    )
    .await;
    assert!(spawns.iter().all(|spawn| spawn.session_id == session_id));
    assert_eq!(cancel.session_id, session_id);
    let job = get_job(&mut control, &job_id).await.expect("GetJob");
    assert_eq!(job.state(), v1::JobState::Cancelled);
    assert!(
        job.agents.iter().all(|a| a.cancelled),
        "the agent stays cancelled: {:?}",
        job.agents
    );
    leader.shutdown().await.expect("shutdown");
}
