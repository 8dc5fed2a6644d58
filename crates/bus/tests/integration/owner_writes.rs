//! The store fences a job's earlier owner: once an owner at a larger epoch
//! claimed the job's record, every write of an owner at a smaller epoch to
//! the record, an agent, a task or the loop checkpoint is refused with
//! `BusError::Fenced` naming the key and both epochs, and changes nothing;
//! the later owner's writes and a non-owner's write (a cancellation)
//! still land, and a non-owner keeps the stored epoch. Real nats-server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::setup;
use mtswarm_bus::jobs::{agent_key, loop_key, task_key};
use mtswarm_bus::{BusError, Jobs, v1};

const STALE: u64 = 7;
const NEW: u64 = 12;

fn task(task_id: &str, attempt: u32) -> v1::TaskRecord {
    v1::TaskRecord {
        assignment: Some(v1::TaskAssignment {
            task_id: task_id.into(),
            attempt,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn assert_fenced(error: BusError, key: &str) {
    match error {
        BusError::Fenced {
            key: refused,
            epoch,
            stored_epoch,
            ..
        } => {
            assert_eq!(refused, key);
            assert_eq!((epoch, stored_epoch), (STALE, NEW));
        }
        other => panic!("expected Fenced for {key}, got {other:?}"),
    }
}

#[tokio::test]
async fn writes_of_an_earlier_owner_are_refused_once_a_later_one_wrote() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    jobs.create(&v1::JobRecord {
        job_id: "job1".into(),
        state: v1::JobState::Running as i32,
        ..Default::default()
    })
    .await
    .expect("create");
    let stale = jobs.as_owner(STALE);
    let new = jobs.as_owner(NEW);

    // The first owner works on the job.
    stale
        .modify("job1", |r| r.tasks_total = 1)
        .await
        .expect("stale owner writes while it owns the job");
    stale
        .modify_task("job1", "t1", |_| Some(task("t1", 1)))
        .await
        .expect("task");
    assert!(
        stale
            .put_agent("job1", "a1", || v1::AgentPlacement {
                agent_id: "a1".into(),
                ..Default::default()
            })
            .await
            .expect("agent")
    );
    stale
        .put_loop_state(&v1::LeaderCheckpoint {
            job_id: "job1".into(),
            state_json: b"{\"step\":1}".to_vec(),
            ..Default::default()
        })
        .await
        .expect("loop state");
    let record = jobs.get("job1").await.expect("get").expect("record");
    assert_eq!(record.value.owner_epoch, STALE);

    // A later owner claims the record, then takes over the loop state only
    // (the task and the agent keep the stale owner's stamp).
    let claimed = new.claim("job1").await.expect("claim");
    assert_eq!(claimed.value.owner_epoch, NEW);
    assert_eq!(claimed.value.tasks_total, 1, "a claim changes nothing else");
    new.put_loop_state(&v1::LeaderCheckpoint {
        job_id: "job1".into(),
        state_json: b"{\"step\":2}".to_vec(),
        ..Default::default()
    })
    .await
    .expect("new owner's loop state");
    new.modify_task("job1", "t1", |stored| {
        let mut task = stored?.clone();
        task.assignment.as_mut()?.attempt = 2;
        Some(task)
    })
    .await
    .expect("new owner's task write");

    // Every write of the stale owner to what the new one wrote is refused.
    assert_fenced(
        stale
            .modify("job1", |r| r.state = v1::JobState::Succeeded as i32)
            .await
            .unwrap_err(),
        "job1",
    );
    assert_fenced(
        stale
            .modify_task("job1", "t1", |_| Some(task("t1", 3)))
            .await
            .unwrap_err(),
        &task_key("job1", "t1"),
    );
    assert_fenced(
        stale
            .put_loop_state(&v1::LeaderCheckpoint {
                job_id: "job1".into(),
                state_json: b"{\"step\":99}".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        &loop_key("job1"),
    );
    assert_fenced(stale.claim("job1").await.unwrap_err(), "job1");

    // Nothing the stale owner tried landed.
    let record = jobs.get("job1").await.expect("get").expect("record");
    assert_eq!(record.value.state(), v1::JobState::Running);
    assert_eq!(record.value.owner_epoch, NEW);
    let tasks = jobs.tasks("job1").await.expect("tasks");
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].assignment.as_ref().unwrap().attempt, 2);
    assert_eq!(tasks[0].owner_epoch, NEW);
    let state = jobs.loop_state("job1").await.expect("loop").expect("some");
    assert_eq!(state.value.state_json, b"{\"step\":2}");

    // The agent the new owner has not written yet: the stale owner's write
    // still lands there (the record claim is what fences a whole job; the
    // new owner reads the parts after it claimed), and once the new owner
    // wrote it, the stale owner is refused there too.
    new.put_agent("job1", "a1", || v1::AgentPlacement {
        agent_id: "a1".into(),
        moves: 1,
        ..Default::default()
    })
    .await
    .expect("new owner's agent write");
    assert_fenced(
        stale.remove_agent("job1", "a1").await.unwrap_err(),
        &agent_key("job1", "a1"),
    );
    assert_fenced(
        stale
            .put_agent("job1", "a1", || v1::AgentPlacement {
                agent_id: "a1".into(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        &agent_key("job1", "a1"),
    );
    assert_eq!(jobs.agents("job1").await.expect("agents")[0].moves, 1);

    // A non-owner (a cancellation from another leader) still writes, and
    // keeps the owner's epoch in the record.
    let cancelled = jobs
        .modify("job1", |r| r.state = v1::JobState::Cancelled as i32)
        .await
        .expect("non-owner write");
    assert_eq!(cancelled.value.owner_epoch, NEW);
    // And the new owner's writes keep landing.
    new.modify("job1", |r| r.tasks_done = 1)
        .await
        .expect("new owner writes");
}
