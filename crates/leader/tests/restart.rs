//! Leader restart: leader A runs a job until its tasks are out and one
//! result is in, then dies (aborted, as a crash would leave it: the job
//! stays RUNNING). A result published while no leader runs is not lost:
//! leader B on the same NATS resumes the job from its record, replays the
//! job's results, accepts each task's result once and finishes the job;
//! no task is published twice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod common;

use std::sync::Arc;

use common::*;
use mtswarm_bus::v1;
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

#[tokio::test]
async fn a_restarted_leader_resumes_the_job_and_accepts_each_result_once() {
    // The split of the counters below between restored and duplicate
    // results depends on how leader B's replay and its live consumer
    // interleave; with the server fsyncing every write the live consumer
    // can deliver results the replay offers too, so this test keeps the
    // server's own sync timing that the counts were written against.
    let env = Env::start_with_sync(mtswarm_bus::local_server::SyncPolicy::ServerDefault).await;
    let _worker = FakeWorker::start(&env.bus, "fr1", "fr1").await;
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

    let leader_b = env
        .leader(Arc::new(ConversationScript::new(script(), None)))
        .await;
    let mut control_b = control(&leader_b).await;
    let events = watch_to_end(&mut control_b, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    let results = task_results(&events);
    let mut ids: Vec<&str> = results.iter().map(|r| r.task_id.as_str()).collect();
    ids.sort_unstable();
    let mut expected: Vec<&str> = received.iter().map(|t| t.task_id.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected, "one accepted result per task");
    assert!(results.iter().all(|r| r.summary != "copy"));

    let record = job_record(&env.bus, &job_id).await;
    assert_eq!((record.tasks_total, record.tasks_done), (2, 2));
    assert!(record.tasks.iter().all(|t| t.done));
    assert_eq!(record.usage.map(|u| u.steps >= 2), Some(true));
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
    leader_b.shutdown().await.expect("shutdown");
}
