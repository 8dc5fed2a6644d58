//! Leader restart: leader A runs a job until its tasks are out and one
//! result is in, then dies (aborted, as a crash would leave it: the job
//! stays RUNNING). A result published while no leader runs is not lost:
//! leader B on the same NATS resumes the job from its record, replays the
//! job's results, accepts each task's result once and finishes the job;
//! no task is published twice. The same holds for a job stored by a leader
//! before records were split into parts (one record embedding its agents,
//! tasks and loop state).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_bus::jobs::{agent_key, loop_key, task_key};
use mtswarm_bus::{Jobs, subjects, v1};
use mtswarm_core::testing::ScriptedTurn;

/// Two tasks of agent `a1` on `fr1-c0`, assigned in one turn.
fn script() -> Vec<ScriptedTurn> {
    let assign = ScriptedTurn::tool_calls([
        assign_call("t1", "part 1", 1),
        assign_call("t2", "part 2", 2),
    ]);
    spawn_assign_collect("fr1-c0", assign, 2.0)
}

fn result_for(task: &v1::TaskAssignment, gflops: f64) -> v1::TaskResult {
    v1::TaskResult {
        summary: "benchmarked".into(),
        usage: Some(v1::Usage {
            steps: 1,
            ..Default::default()
        }),
        ..ok_result(task, task.attempt, gflops)
    }
}

/// The environment of these tests. The split of the counters they check
/// between restored and duplicate results depends on how leader B's replay
/// and its live consumer interleave; with the server fsyncing every write
/// the live consumer can deliver results the replay offers too, so these
/// tests keep the server's own sync timing that the counts were written
/// against.
async fn start_env() -> Env {
    Env::start_with_sync(mtswarm_bus::local_server::SyncPolicy::ServerDefault).await
}

/// Leader A runs the job until both tasks are out and the first result is
/// recorded, then dies; the second result (and a copy of the first) comes
/// while no leader runs. The job's id and the two tasks, by instructions.
async fn leader_a_dies_mid_job(env: &Env) -> (String, Vec<v1::TaskAssignment>) {
    let mut tasks = task_stream(&env.bus, "fr1").await;
    // Leader A never gets past the collect turn's answer.
    let model_a = Arc::new(ConversationScript::new(script(), Some(3)));
    let leader_a = env.leader(model_a).await;
    let mut control_a = control(&leader_a).await;
    let job_id = submit(&mut control_a, "Tune k1.").await;
    let mut received = Vec::new();
    for _ in 0..2 {
        let delivery = next_task(&mut tasks, "a task").await;
        delivery.ack().await.expect("ack");
        received.push(delivery.message().clone());
    }
    received.sort_by_key(|t| t.instructions.clone());
    publish_measured(&env.bus, &result_for(&received[0], 1.0))
        .await
        .expect("first result");
    record_when(
        &env.bus,
        &job_id,
        "leader A to record the first result",
        |record| record.tasks_done == 1,
    )
    .await;
    leader_a.abort().await;

    // While no leader runs: the second result, and a copy of the first.
    publish_measured(&env.bus, &result_for(&received[1], 2.0))
        .await
        .expect("second result");
    let mut copy = result_for(&received[0], 7.0);
    copy.summary = "copy".into();
    publish_copy(&env.bus, &copy, "a-copy-of-the-first-result").await;
    let running = job_record(&env.bus, &job_id).await;
    assert_eq!(running.state(), v1::JobState::Running, "A left it running");
    (job_id, received)
}

/// Leader B resumes the job and finishes it: each task's result accepted
/// once, the one A had accepted restored, the copy a duplicate, nothing
/// published twice. The job's record (with its parts) at the end.
async fn leader_b_finishes(
    env: &Env,
    job_id: &str,
    received: &[v1::TaskAssignment],
) -> v1::JobRecord {
    let leader_b = env
        .leader(Arc::new(ConversationScript::new(script(), None)))
        .await;
    let mut control_b = control(&leader_b).await;
    let events = watch_to_end(&mut control_b, job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    let results = task_results(&events);
    let mut ids: Vec<&str> = results.iter().map(|r| r.task_id.as_str()).collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = received.iter().map(|t| t.task_id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "one accepted result per task");
    assert!(results.iter().all(|r| r.summary != "copy"));

    let record = job_record(&env.bus, job_id).await;
    assert_eq!((record.tasks_total, record.tasks_done), (2, 2));
    assert!(record.tasks.iter().all(|t| t.done));
    assert_eq!(record.usage.as_ref().map(|u| u.steps >= 2), Some(true));
    let counters = leader_b.counters();
    assert_eq!(counters.accepted, 1, "B accepted the result A never saw");
    assert_eq!(counters.restored, 1, "B restored the result A accepted");
    assert_eq!(counters.duplicate, 1, "the copy is a duplicate");

    // Every task was stored in the tasks stream once.
    assert_eq!(
        tasks_published(&env.bus).await,
        2,
        "no task published twice"
    );
    let answered = get_job(&mut control_b, job_id).await.expect("get_job");
    assert_eq!(answered, record, "GetJob answers with the assembled record");
    leader_b.shutdown().await.expect("shutdown");
    record
}

#[tokio::test]
async fn a_restarted_leader_resumes_the_job_and_accepts_each_result_once() {
    let env = start_env().await;
    let _worker = FakeWorker::start(&env.bus, "fr1", "fr1").await;
    let (job_id, received) = leader_a_dies_mid_job(&env).await;
    leader_b_finishes(&env, &job_id, &received).await;
}

/// Rewrites the job's stored state the way a leader before the split
/// stored it: one record embedding its agents, tasks and loop state, and
/// no keys of their own.
async fn store_in_the_previous_layout(env: &Env, job_id: &str) -> v1::JobRecord {
    let jobs = Jobs::open(&env.bus).await.expect("jobs");
    let whole = job_record(&env.bus, job_id).await;
    let stored = jobs.get(job_id).await.expect("read").expect("record");
    let previous = v1::JobRecord {
        agents_total: 0,
        ..whole.clone()
    };
    jobs.update(&previous, stored.revision)
        .await
        .expect("the record in the previous layout");
    let raw = env
        .bus
        .jetstream()
        .get_key_value(subjects::JOBS_BUCKET)
        .await
        .expect("jobs bucket");
    let mut keys = vec![loop_key(job_id)];
    keys.extend(whole.agent_ids.iter().map(|a| agent_key(job_id, a)));
    keys.extend(
        whole
            .tasks
            .iter()
            .filter_map(|t| t.assignment.as_ref())
            .map(|a| task_key(job_id, &a.task_id)),
    );
    for key in keys {
        raw.delete(&key).await.expect("delete a part's key");
    }
    assert!(jobs.agents(job_id).await.expect("agents").is_empty());
    assert!(jobs.tasks(job_id).await.expect("tasks").is_empty());
    assert!(jobs.loop_state(job_id).await.expect("loop").is_none());
    previous
}

#[tokio::test]
async fn a_job_record_of_the_previous_layout_is_read_and_resumed() {
    let env = start_env().await;
    let _worker = FakeWorker::start(&env.bus, "fr1", "fr1").await;
    let (job_id, received) = leader_a_dies_mid_job(&env).await;
    let previous = store_in_the_previous_layout(&env, &job_id).await;
    assert_eq!((previous.agents.len(), previous.tasks.len()), (1, 2));
    assert!(!previous.leader_state_json.is_empty());
    // Read as it is: the embedded parts are the job's parts.
    let read = job_record(&env.bus, &job_id).await;
    assert_eq!(read.agents, previous.agents);
    assert_eq!(read.tasks, previous.tasks);
    assert_eq!(read.leader_state_json, previous.leader_state_json);
    assert_eq!(read.agents_total, 1);

    let record = leader_b_finishes(&env, &job_id, &received).await;
    assert_eq!(record.agent_ids, vec!["a1".to_string()]);
    // Resuming moved the parts to their keys.
    let jobs = Jobs::open(&env.bus).await.expect("jobs");
    let stored = jobs
        .get(&job_id)
        .await
        .expect("read")
        .expect("record")
        .value;
    assert!(stored.agents.is_empty() && stored.tasks.is_empty());
    assert!(stored.agent_ids.is_empty() && stored.leader_state_json.is_empty());
    assert_eq!(stored.agents_total, 1);
    assert_eq!(jobs.agents(&job_id).await.expect("agents").len(), 1);
    let tasks = jobs.tasks(&job_id).await.expect("tasks");
    assert_eq!(tasks.len(), 2);
    assert!(tasks.iter().all(|t| t.done));
    assert!(jobs.loop_state(&job_id).await.expect("loop").is_some());
}
