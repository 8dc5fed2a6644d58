//! A job's parts (agents, tasks, loop checkpoint) live under keys of their
//! own next to its record in `mtswarm_jobs`: listings and watches of the
//! records never see them, even parts whose bytes would decode as a
//! `JobRecord`; each part is written at its key's revision; a record of
//! the layout before the split is assembled as it is and split on request.
//! Real nats-server, one per test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::{setup, within};
use futures::StreamExt as _;
use mtswarm_bus::jobs::{agent_key, loop_key, task_key};
use mtswarm_bus::{BusError, Jobs, KvChange, v1};
use prost::Message as _;

fn placement(agent_id: &str) -> v1::AgentPlacement {
    v1::AgentPlacement {
        agent_id: agent_id.into(),
        ..Default::default()
    }
}

fn task(task_id: &str) -> v1::TaskRecord {
    v1::TaskRecord {
        assignment: Some(v1::TaskAssignment {
            task_id: task_id.into(),
            attempt: 1,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn record_listings_and_watches_skip_the_parts_by_their_keys() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    // An agent with only its id set is also a valid JobRecord (field 1):
    // only the key tells them apart.
    let agent = placement("a1");
    assert!(v1::JobRecord::decode(agent.encode_to_vec().as_slice()).is_ok());
    let mut records = jobs.watch().await.expect("watch");
    let mut current = jobs.kv().watch_with_current().await.expect("watch");
    jobs.create(&v1::JobRecord {
        job_id: "job1".into(),
        ..Default::default()
    })
    .await
    .expect("create");
    assert!(
        jobs.as_owner(1)
            .put_agent("job1", "a1", || agent.clone())
            .await
            .expect("agent")
    );
    jobs.as_owner(1)
        .modify_task("job1", "t1", |_| Some(task("t1")))
        .await
        .expect("task");
    jobs.put_loop_state(&v1::LeaderCheckpoint {
        job_id: "job1".into(),
        state_json: b"{}".to_vec(),
        ..Default::default()
    })
    .await
    .expect("loop");
    jobs.create(&v1::JobRecord {
        job_id: "job2".into(),
        ..Default::default()
    })
    .await
    .expect("create");

    let listed: Vec<String> = jobs
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|v| v.value.job_id)
        .collect();
    assert_eq!(listed, ["job1", "job2"]);
    for (what, watch) in [("live", &mut records), ("current", &mut current)] {
        let mut keys = Vec::new();
        while keys.len() < 2 {
            let change = within(what, watch.next()).await.expect("open").expect("ok");
            keys.push(change.key().to_string());
        }
        assert_eq!(keys, ["job1", "job2"], "{what}");
    }
    let mut loops = jobs.watch_loop_states().await.expect("loop watch");
    jobs.put_loop_state(&v1::LeaderCheckpoint {
        job_id: "job2".into(),
        state_json: b"{}".to_vec(),
        ..Default::default()
    })
    .await
    .expect("loop");
    match within("a loop change", loops.next()).await {
        Some(Ok(KvChange::Put { key, value })) => {
            assert_eq!(key, loop_key("job2"));
            assert!(value.value.updated_at.is_some(), "stamped when written");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn parts_are_written_at_their_revision_and_assembled_with_the_record() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    jobs.create(&v1::JobRecord {
        job_id: "job1".into(),
        agents_total: 2,
        ..Default::default()
    })
    .await
    .expect("create");
    assert!(
        jobs.as_owner(1)
            .put_agent("job1", "a2", || placement("a2"))
            .await
            .expect("new")
    );
    assert!(
        jobs.as_owner(1)
            .put_agent("job1", "a1", || placement("a1"))
            .await
            .expect("new")
    );
    // An owner's write stamps its epoch on what it writes.
    let moved = v1::AgentPlacement {
        moves: 1,
        owner_epoch: 1,
        ..placement("a1")
    };
    assert!(
        !jobs
            .as_owner(1)
            .put_agent("job1", "a1", || moved.clone())
            .await
            .expect("replaced")
    );

    // A task marked done stays done: the second writer sees it and leaves it.
    let done = v1::TaskRecord {
        done: true,
        ..task("t1")
    };
    let (writer_a, writer_b) = (jobs.as_owner(1), jobs.as_owner(1));
    let (first, second) = tokio::join!(
        writer_a.modify_task("job1", "t1", |_| Some(done.clone())),
        writer_b.modify_task("job1", "t1", |stored| match stored {
            Some(existing) if existing.done => None,
            _ => Some(task("t1")),
        }),
    );
    first.expect("first");
    second.expect("second");
    jobs.as_owner(1)
        .modify_task("job1", "t0", |_| Some(task("t0")))
        .await
        .expect("t0");
    let tasks = jobs.tasks("job1").await.expect("tasks");
    assert_eq!(tasks.len(), 2);
    assert!(
        tasks
            .iter()
            .any(|t| t.done && t.assignment.as_ref().unwrap().task_id == "t1"),
        "{tasks:?}"
    );

    let whole = jobs.assembled("job1").await.expect("read").expect("job");
    assert_eq!(whole.agent_ids, ["a1", "a2"]);
    assert_eq!(whole.agents[0], moved);
    assert_eq!(whole.tasks.len(), 2);
    assert!(whole.leader_state_json.is_empty(), "no loop state yet");
    let stored = jobs.get("job1").await.expect("read").expect("job").value;
    assert!(stored.agents.is_empty() && stored.tasks.is_empty());

    assert!(jobs.remove_agent("job1", "a2").await.expect("removed"));
    assert!(!jobs.remove_agent("job1", "a2").await.expect("gone"));
    assert_eq!(jobs.agents("job1").await.expect("agents"), [moved]);
    assert!(jobs.assembled("nope").await.expect("read").is_none());
    let refused = jobs.agents("not.a.job").await.expect_err("bad id");
    assert!(matches!(refused, BusError::InvalidId { .. }), "{refused}");
}

#[tokio::test]
async fn a_record_of_the_previous_layout_is_assembled_as_it_is_and_split_on_request() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    let previous = v1::JobRecord {
        job_id: "old".into(),
        agent_ids: vec!["a1".into(), "a2".into()],
        agents: vec![placement("a1"), placement("a2")],
        tasks: vec![task("t1")],
        leader_state_json: b"{\"step\":3}".to_vec(),
        ..Default::default()
    };
    jobs.create(&previous).await.expect("create");
    // A part written after the old leader stopped wins over the embedded one.
    let later = v1::AgentPlacement {
        cancelled: true,
        owner_epoch: 1,
        ..placement("a2")
    };
    jobs.as_owner(1)
        .put_agent("old", "a2", || later.clone())
        .await
        .expect("a2");

    let read = jobs.assembled("old").await.expect("read").expect("job");
    assert_eq!(read.agents, [placement("a1"), later.clone()]);
    assert_eq!(read.agent_ids, previous.agent_ids);
    assert_eq!(read.tasks, previous.tasks);
    assert_eq!(read.leader_state_json, previous.leader_state_json);

    let split = jobs
        .split_embedded("old")
        .await
        .expect("split")
        .expect("job");
    assert!(split.agents.is_empty() && split.agent_ids.is_empty());
    assert!(split.tasks.is_empty() && split.leader_state_json.is_empty());
    assert_eq!(split.agents_total, 2);
    assert_eq!(
        jobs.agents("old").await.expect("agents"),
        [placement("a1"), later]
    );
    assert_eq!(jobs.tasks("old").await.expect("tasks"), previous.tasks);
    let checkpoint = jobs.loop_state("old").await.expect("loop").expect("moved");
    assert_eq!(checkpoint.value.state_json, previous.leader_state_json);
    assert_eq!(
        jobs.assembled("old").await.expect("read").expect("job"),
        v1::JobRecord {
            updated_at: split.updated_at,
            agents_total: 2,
            ..read
        },
        "the same job, read from its parts"
    );
    // Nothing left to move: the record stays as it is.
    let again = jobs
        .split_embedded("old")
        .await
        .expect("split")
        .expect("job");
    assert_eq!(again, split);
    assert_eq!(agent_key("old", "a1"), "old.agent.a1");
    assert_eq!(task_key("old", "t1"), "old.task.t1");
    assert_eq!(loop_key("old"), "old.loop");
}
