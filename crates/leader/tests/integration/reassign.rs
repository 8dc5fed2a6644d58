//! Reassignment: a worker that dies (its slice lease lapses) has its agent
//! moved to a free slice with the same session id and `resume = true`, and
//! its unfinished task re-published there as the next attempt, resuming
//! from the checkpoint. The dead attempt's late result is dropped; the new
//! attempt's result is the task's outcome.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_bus::{DeliveryStream, v1};
use mtswarm_leader::LeaderHandle;
use serde_json::json;
use tokio::sync::Semaphore;

/// An agent's slice and a free one to move it to: fake workers `fw1`
/// (slice `fb1-c0`) and `fw2` (`fb2-c0`, its spawns held at `second_gate`
/// when given), a leader on [`one_task_script`] for `fb1-c0`, a client and
/// fw1's task stream.
struct Move {
    first_tasks: DeliveryStream<v1::TaskAssignment>,
    control: Control,
    leader: LeaderHandle,
    second: FakeWorker,
    first: FakeWorker,
    env: Env,
}

impl Move {
    /// Submits the job; its id and the task's first attempt on fw1.
    async fn first_attempt(&mut self) -> (String, mtswarm_bus::Delivery<v1::TaskAssignment>) {
        let job_id = submit(&mut self.control, "Tune k1.").await;
        let delivery = next_task(&mut self.first_tasks, "attempt 1").await;
        (job_id, delivery)
    }

    async fn start(second_gate: Option<Arc<Semaphore>>) -> Move {
        let env = Env::start().await;
        let first = FakeWorker::start(&env.bus, "fw1", "fb1").await;
        let second = FakeWorker::start_with_gate(&env.bus, "fw2", "fb2", second_gate).await;
        let leader = env.leader(one_task_script("fb1-c0", 2.0)).await;
        let control = control(&leader).await;
        let first_tasks = task_stream(&env.bus, "fw1").await;
        Move {
            first_tasks,
            control,
            leader,
            second,
            first,
            env,
        }
    }
}

#[tokio::test]
async fn lapsed_lease_moves_the_task_with_the_next_attempt() {
    let mut setup = Move::start(None).await;
    let mut second_tasks = task_stream(&setup.env.bus, "fw2").await;

    let job_id = submit(&mut setup.control, "Tune k1.").await;
    let spawn = setup.first.next_spawn("the first spawn").await;
    assert!(!spawn.resume);
    let delivery = next_task(&mut setup.first_tasks, "attempt 1").await;
    let task = delivery.message().clone();
    assert_eq!((task.attempt, task.slice_id.as_str()), (1, "fb1-c0"));
    assert!(!task.resume_from_checkpoint);
    // fw1 dies holding the task: its lease lapses one TTL later.
    let killed = std::time::Instant::now();
    setup.first.kill().await;

    let moved = setup.second.next_spawn("the move to fw2").await;
    assert_eq!(
        moved.session_id, spawn.session_id,
        "the session keeps its id"
    );
    assert_eq!(moved.agent_id, "a1");
    assert_eq!(moved.slice_id, "fb2-c0");
    assert!(
        moved.resume,
        "the moved session resumes from its checkpoint"
    );
    let again = next_task(&mut second_tasks, "attempt 2").await;
    let retried = again.message().clone();
    println!(
        "kill to re-published attempt: {} ms (lease TTL {} ms)",
        killed.elapsed().as_millis(),
        FAKE_LEASE_TTL.as_millis()
    );
    assert_eq!(retried.task_id, task.task_id, "the task id never changes");
    assert_eq!(retried.attempt, 2);
    assert!(retried.resume_from_checkpoint);
    assert_eq!(
        (retried.worker_id.as_str(), retried.slice_id.as_str()),
        ("fw2", "fb2-c0")
    );
    assert_eq!(retried.session_id, spawn.session_id);

    // The dead attempt's late result is fenced off; the live one counts.
    publish_measured(&setup.env.bus, &ok_result(&task, 1, 99.0))
        .await
        .expect("late result");
    eventually("the stale result to be counted", || async {
        (setup.leader.counters().stale == 1).then_some(())
    })
    .await;
    publish_measured(&setup.env.bus, &ok_result(&retried, 2, 2.0))
        .await
        .expect("result of attempt 2");
    again.ack().await.expect("ack");

    let events = watch_to_end(&mut setup.control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));
    let accepted = task_results(&events);
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].attempt, 2);
    let moves = logs_of_type(&events, "task_reassigned");
    assert_eq!(moves.len(), 1, "{moves:?}");
    let reassigned = &moves[0];
    assert_eq!(reassigned["task_id"], json!(task.task_id));
    assert_eq!(reassigned["attempt"], json!(2));
    assert_eq!(reassigned["agent"], json!("a1"));
    assert_eq!(reassigned["from_slice"], json!("fb1-c0"));
    assert_eq!(reassigned["to_slice"], json!("fb2-c0"));
    let detected_ms = reassigned["detected_ms"].as_u64().expect("detected_ms");
    println!(
        "reassignment: {detected_ms} ms from the lease's expiry to the re-publish ({})",
        reassigned["reason"]
    );
    // Within 2 x TTL of the kill: the lapse itself takes one TTL.
    assert!(
        detected_ms < 2 * FAKE_LEASE_TTL.as_millis() as u64 + 1000,
        "{detected_ms}"
    );

    let record = job_record(&setup.env.bus, &job_id).await;
    assert_eq!(record.agents.len(), 1);
    assert_eq!(record.agents[0].moves, 1);
    assert_eq!(record.agents[0].slice_id, "fb2-c0");
    assert_eq!(record.agents[0].spawn_call_id, "c1@1");
    assert_eq!(record.tasks.len(), 1);
    let stored = record.tasks[0].assignment.clone().expect("assignment");
    assert_eq!((stored.attempt, stored.slice_id.as_str()), (2, "fb2-c0"));
    assert!(record.tasks[0].done);
    assert_eq!(record.tasks[0].status(), v1::TaskStatus::Ok);
    assert_eq!((record.tasks_total, record.tasks_done), (1, 1));
    let counters = setup.leader.counters();
    assert_eq!(
        (counters.accepted, counters.stale, counters.reassigned),
        (1, 1, 1)
    );
    setup.leader.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_fenced_result_of_the_current_attempt_moves_the_task_at_once() {
    let mut setup = Move::start(None).await;
    let (answer, mut answered) = answer_tasks(&setup.env.bus, "fw2", |_| 2.0);
    let (job_id, delivery) = setup.first_attempt().await;
    let task = delivery.message().clone();
    // fw1 stays alive (its lease still names the session) but fences its run.
    let mut fenced = ok_result(&task, 1, 0.0);
    fenced.fenced = true;
    fenced.status = v1::TaskStatus::Cancelled as i32;
    fenced.result_json.clear();
    fenced.error = "fenced off: checkpoint refused as a stale attempt".into();
    setup
        .env
        .bus
        .publish_result(&fenced)
        .await
        .expect("fenced result");
    delivery.ack().await.expect("ack");

    let (moved, _) = within("attempt 2 on fw2", answered.recv())
        .await
        .expect("a task");
    assert_eq!(
        (moved.task_id.as_str(), moved.attempt),
        (task.task_id.as_str(), 2)
    );
    assert!(moved.resume_from_checkpoint);
    let events = watch_to_end(&mut setup.control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));
    let accepted: Vec<u32> = task_results(&events).iter().map(|r| r.attempt).collect();
    assert_eq!(accepted, vec![2], "the fenced result is never the outcome");
    let counters = setup.leader.counters();
    assert_eq!(
        (counters.fenced, counters.accepted, counters.reassigned),
        (1, 1, 1)
    );
    let spawned_on_second = setup.second.spawns_so_far();
    assert_eq!(spawned_on_second.len(), 1);
    assert!(spawned_on_second[0].resume);
    assert!(matches!(
        setup.first.calls.try_recv(),
        Ok(WorkerCall::Spawn(_))
    ));
    answer.abort();
    setup.leader.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_quarantined_slice_moves_its_agent_and_the_old_session_is_cancelled() {
    let mut setup = Move::start(None).await;
    let (answer, mut answered) = answer_tasks(&setup.env.bus, "fw2", |_| 2.0);
    let (job_id, delivery) = setup.first_attempt().await;
    delivery.ack().await.expect("ack");
    mtswarm_bus::Quarantine::open(&setup.env.bus)
        .await
        .expect("quarantine")
        .put(&v1::SliceQuarantine {
            slice_id: "fb1-c0".into(),
            worker_id: "fw1".into(),
            reason: "3 crashes in a row".into(),
            consecutive_failures: 3,
            since: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
            by: "fw1".into(),
        })
        .await
        .expect("quarantine the slice");
    let (moved, _) = within("attempt 2 on fw2", answered.recv())
        .await
        .expect("a task");
    assert_eq!(moved.attempt, 2);
    let events = watch_to_end(&mut setup.control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));
    let reasons: Vec<String> = logs_of_type(&events, "task_reassigned")
        .iter()
        .filter_map(|p| p["reason"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        reasons,
        vec!["slice quarantined: 3 crashes in a row".to_string()]
    );
    // fw1 saw the spawn, then the cancel of its copy of the moved session.
    let spawn = setup.first.next_spawn("fw1's spawn").await;
    let cancel = setup.first.next_cancel("fw1's cancel").await;
    assert_eq!(cancel.session_id, spawn.session_id);
    answer.abort();
    setup.leader.shutdown().await.expect("shutdown");
}

/// A job cancelled while its agent is being moved: the new worker is told
/// to cancel before the moved session exists, so the leader stops it once
/// the spawn completes, and the agent stays cancelled (the move does not
/// overwrite the cancellation).
#[tokio::test]
async fn a_job_cancelled_during_a_move_stops_the_moved_session() {
    let gate = Arc::new(Semaphore::new(0));
    let mut setup = Move::start(Some(gate.clone())).await;
    let job_id = submit(&mut setup.control, "Tune k1.").await;
    let spawn = setup.first.next_spawn("the first spawn").await;
    next_task(&mut setup.first_tasks, "attempt 1").await;
    setup.first.kill().await;
    let moving = setup.second.next_spawn_arrival("the move to fw2").await;
    assert_eq!(moving, spawn.session_id);
    let (moved, cancel) = cancel_while_spawning(
        &mut setup.control,
        &job_id,
        &gate,
        &mut setup.second,
        "the moved session's cancellation",
    )
    .await;
    assert!(moved.iter().all(|moved| moved.resume));
    assert_eq!(cancel.session_id, spawn.session_id);
    let record = record_when(
        &setup.env.bus,
        &job_id,
        "the cancelled agent in the job record",
        |record| record.agents.iter().all(|a| a.cancelled),
    )
    .await;
    assert_eq!(record.state(), v1::JobState::Cancelled);
    setup.leader.shutdown().await.expect("shutdown");
}
