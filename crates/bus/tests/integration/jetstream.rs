//! Streams, consumers and KV stores against a real nats-server (one per test).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::time::Duration;

use common::{
    WAIT, bare_result, connect, ensure_topology, leader_and_worker, next_ok, setup, start_server,
    stream_info, task, w1_tasks, within,
};
use futures::StreamExt as _;
use mtswarm_bus::subjects;
use mtswarm_bus::{
    Approvals, Bus, BusError, Checkpoints, ConnectionState, Jobs, LeaseEvent, LeaseRequest,
    LeaseWatch, Leases, ResultConsumerConfig, TaskConsumerConfig, TopologyConfig, v1,
};

async fn stream_message_count(bus: &Bus, stream: &str) -> u64 {
    stream_info(bus, stream).await.state.messages
}

/// The server's info on the task consumer `name`.
async fn task_consumer_info(bus: &Bus, name: &str) -> async_nats::jetstream::consumer::Info {
    bus.jetstream()
        .get_stream(subjects::TASKS_STREAM)
        .await
        .expect("tasks stream")
        .consumer_info(name)
        .await
        .expect("consumer info")
}

/// The slice of the first lease event `pick` accepts within [`WAIT`];
/// `pick` skips an event with `None` and may fail the test on one.
async fn lease_event(
    what: &str,
    watch: &mut LeaseWatch,
    pick: impl Fn(LeaseEvent) -> Option<String>,
) -> String {
    within(what, async {
        loop {
            let event = watch.next().await.expect("watch open").expect("watch item");
            if let Some(slice_id) = pick(event) {
                break slice_id;
            }
        }
    })
    .await
}

fn lapsed(event: LeaseEvent) -> Option<String> {
    match event {
        LeaseEvent::Lapsed { slice_id, .. } => Some(slice_id),
        _ => None,
    }
}

/// The next delivery of `stream`, past the transient errors (missed
/// heartbeats) it may report while the server is away.
async fn next_past_transient_errors<S, T, E>(stream: &mut S) -> T
where
    S: futures::Stream<Item = Result<T, E>> + Unpin,
    E: std::fmt::Display,
{
    loop {
        match stream.next().await.expect("stream stays open") {
            Ok(delivery) => return delivery,
            Err(error) => eprintln!("transient consumer error: {error}"),
        }
    }
}

#[tokio::test]
async fn topology_creation_is_idempotent() {
    let (server, bus) = setup().await;
    let other = connect(&server, "other").await;
    let config = TopologyConfig::small();
    // Again from this client and concurrently from another one.
    let (first, second) =
        tokio::join!(bus.ensure_topology(&config), other.ensure_topology(&config));
    assert!(
        first.expect("second ensure").per_key_ttl,
        "nats-server 2.15 supports per-key TTL"
    );
    second.expect("concurrent ensure");

    let tasks = stream_info(&bus, subjects::TASKS_STREAM).await;
    assert_eq!(tasks.config.subjects, vec![subjects::ALL_TASKS.to_string()]);
    assert_eq!(tasks.config.duplicate_window, config.duplicate_window);
    for bucket in [
        subjects::LEASES_BUCKET,
        subjects::WORKERS_BUCKET,
        subjects::JOBS_BUCKET,
        subjects::CHECKPOINTS_BUCKET,
        subjects::APPROVALS_BUCKET,
        subjects::QUARANTINE_BUCKET,
    ] {
        bus.jetstream()
            .get_key_value(bucket)
            .await
            .unwrap_or_else(|e| panic!("bucket {bucket}: {e}"));
    }
    // Existing data is untouched by a later ensure.
    bus.publish_task(&task("keep", 1, "w1", "s1"))
        .await
        .expect("publish");
    bus.ensure_topology(&config).await.expect("third ensure");
    assert_eq!(stream_message_count(&bus, subjects::TASKS_STREAM).await, 1);
}

#[tokio::test]
async fn duplicate_task_publish_is_dropped_but_next_attempt_is_not() {
    let (_server, bus) = setup().await;
    let first = bus
        .publish_task(&task("t1", 1, "w1", "s1"))
        .await
        .expect("first");
    assert!(!first.duplicate);
    let again = bus
        .publish_task(&task("t1", 1, "w1", "s1"))
        .await
        .expect("again");
    assert!(again.duplicate, "same task id and attempt is a duplicate");
    assert_eq!(again.sequence, first.sequence);
    let retry = bus
        .publish_task(&task("t1", 2, "w1", "s1"))
        .await
        .expect("attempt 2");
    assert!(!retry.duplicate, "a new attempt is a new message");
    assert!(retry.sequence > first.sequence);
    assert_eq!(stream_message_count(&bus, subjects::TASKS_STREAM).await, 2);

    // Results are deduplicated the same way.
    let result = bare_result("t1");
    assert!(!bus.publish_result(&result).await.expect("result").duplicate);
    assert!(
        bus.publish_result(&result)
            .await
            .expect("result again")
            .duplicate
    );
}

#[tokio::test]
async fn task_flows_to_worker_and_result_back_to_leader() {
    let (_server, bus) = setup().await;
    let worker = bus
        .task_consumer("w1", TaskConsumerConfig::default())
        .await
        .expect("task consumer");
    let leader = bus
        .result_consumer(ResultConsumerConfig::new("leader"))
        .await
        .expect("result consumer");
    let mut tasks = worker.messages().await.expect("task stream");
    let mut results = leader.messages().await.expect("result stream");

    let sent = task("t7", 1, "w1", "b0-c1");
    bus.publish_task(&sent).await.expect("publish task");
    // A task for another worker must not reach w1.
    bus.publish_task(&task("t8", 1, "w2", "b9"))
        .await
        .expect("other worker");

    let delivery = next_ok("task delivery", &mut tasks).await;
    assert_eq!(delivery.message(), &sent);
    assert_eq!(delivery.subject(), "mtswarm.task.w1.b0-c1");
    assert_eq!(delivery.info().delivered, 1);
    delivery.ack_confirmed().await.expect("ack");

    let result = v1::TaskResult {
        task_id: sent.task_id.clone(),
        attempt: sent.attempt,
        job_id: sent.job_id.clone(),
        agent_id: sent.agent_id.clone(),
        slice_id: sent.slice_id.clone(),
        status: v1::TaskStatus::Ok as i32,
        summary: "2.1x".into(),
        result_json: r#"{"speedup":2.1}"#.into(),
        ..Default::default()
    };
    bus.publish_result(&result).await.expect("publish result");
    let received = next_ok("result delivery", &mut results).await;
    assert_eq!(received.message(), &result);
    received.ack().await.expect("ack result");

    // Work queue: the acked task is gone, the other worker's task remains.
    assert_eq!(stream_message_count(&bus, subjects::TASKS_STREAM).await, 1);
}

#[tokio::test]
async fn unacked_task_is_redelivered_after_ack_wait() {
    let (_server, bus) = setup().await;
    let worker = bus
        .task_consumer(
            "w1",
            TaskConsumerConfig {
                slice_id: Some("s1".into()),
                ack_wait: Duration::from_secs(1),
                max_deliver: 3,
                ..Default::default()
            },
        )
        .await
        .expect("consumer");
    let mut tasks = worker.messages().await.expect("stream");
    bus.publish_task(&task("t1", 1, "w1", "s1"))
        .await
        .expect("publish");

    let first = next_ok("first delivery", &mut tasks).await;
    assert_eq!(first.info().delivered, 1);
    // Not acknowledged: the server must deliver it again after ack_wait.
    let second = next_ok("redelivery", &mut tasks).await;
    assert_eq!(second.message().task_id, "t1");
    assert_eq!(second.info().delivered, 2);
    assert_eq!(second.info().stream_sequence, first.info().stream_sequence);
    second.ack_confirmed().await.expect("ack");
}

#[tokio::test]
async fn undecodable_task_is_reported_and_does_not_block_the_next() {
    let (_server, bus) = setup().await;
    let mut tasks = w1_tasks(&bus).await;
    let mut headers = mtswarm_bus::HeaderMap::new();
    mtswarm_bus::codec::set_content_type::<v1::TaskAssignment>(&mut headers);
    bus.jetstream()
        .publish_with_headers(
            "mtswarm.task.w1.s1",
            headers,
            bytes::Bytes::from_static(&[
                0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ]),
        )
        .await
        .expect("send garbage")
        .await
        .expect("garbage stored");
    bus.publish_task(&task("good", 1, "w1", "s1"))
        .await
        .expect("publish");

    let bad = within("bad delivery", tasks.next()).await.expect("open");
    assert!(
        matches!(
            bad,
            Err(BusError::Decode {
                type_name: "mtswarm.v1.TaskAssignment",
                ..
            })
        ),
        "{bad:?}"
    );
    let good = next_ok("good delivery", &mut tasks).await;
    assert_eq!(good.message().task_id, "good");
    good.ack_confirmed().await.expect("ack");
}

/// `error` rejects the id of kind `kind`.
fn assert_invalid_id(error: &BusError, kind: &str) {
    assert!(
        matches!(error, BusError::InvalidId { kind: rejected, .. } if *rejected == kind),
        "{error}"
    );
}

#[tokio::test]
async fn invalid_ids_are_rejected_before_publishing() {
    let (_server, bus) = setup().await;
    let error = bus
        .publish_task(&task("t1", 1, "w1", "slice.with.dots"))
        .await
        .expect_err("dots would change the subject");
    assert_invalid_id(&error, "slice id");
    let error = bus
        .publish_task(&task("t1", 0, "w1", "s1"))
        .await
        .expect_err("attempt 0");
    assert_invalid_id(&error, "attempt");
    assert_eq!(stream_message_count(&bus, subjects::TASKS_STREAM).await, 0);
}

#[tokio::test]
async fn events_are_live_and_replayable_from_a_sequence() {
    let (_server, bus) = setup().await;
    let mut live = bus.subscribe_events("job1").await.expect("subscribe");
    bus.flush().await.expect("flush subscription");
    for sequence in 1..=3u64 {
        let event = v1::AgentEvent {
            job_id: "job1".into(),
            agent_id: "agent1".into(),
            session_id: "s1".into(),
            sequence,
            kind: v1::AgentEventKind::ToolCall as i32,
            payload_json: format!(r#"{{"n":{sequence}}}"#),
            ..Default::default()
        };
        bus.publish_event(&event).await.expect("publish event");
    }
    // Another job's events are not part of job1's stream.
    bus.publish_event(&v1::AgentEvent {
        job_id: "job2".into(),
        agent_id: "agent1".into(),
        ..Default::default()
    })
    .await
    .expect("other job");
    for expected in 1..=3u64 {
        let event = next_ok("live event", &mut live).await;
        assert_eq!(event.message.sequence, expected);
        assert_eq!(event.subject, "mtswarm.event.job1.agent1");
    }

    let mut replay = bus.replay_events("job1", 0).await.expect("replay");
    let mut stream_sequences = Vec::new();
    for expected in 1..=3u64 {
        let replayed = next_ok("replayed event", &mut replay).await;
        assert_eq!(replayed.event.sequence, expected);
        stream_sequences.push(replayed.stream_sequence);
    }
    // Resume after the first event: starts at the second.
    let mut resumed = bus
        .replay_events("job1", stream_sequences[0] + 1)
        .await
        .expect("resume");
    let next = next_ok("resumed event", &mut resumed).await;
    assert_eq!(next.event.sequence, 2);
    assert_eq!(next.stream_sequence, stream_sequences[1]);
}

#[tokio::test]
async fn a_batch_of_events_is_one_stored_message_read_as_its_events_in_order() {
    let (_server, bus) = setup().await;
    let mut live = bus.subscribe_events("job1").await.expect("subscribe");
    bus.flush().await.expect("flush subscription");
    let event = |sequence: u64| v1::AgentEvent {
        job_id: "job1".into(),
        agent_id: "agent1".into(),
        session_id: "s1".into(),
        sequence,
        kind: v1::AgentEventKind::Log as i32,
        payload_json: format!(r#"{{"n":{sequence}}}"#),
        ..Default::default()
    };
    bus.publish_event(&event(1)).await.expect("single event");
    bus.publish_events(&[event(2), event(3), event(4)])
        .await
        .expect("batch");
    bus.publish_events(&[event(5)]).await.expect("batch of one");
    bus.publish_events(&[]).await.expect("nothing to publish");
    let mixed = bus
        .publish_events(&[
            event(6),
            v1::AgentEvent {
                job_id: "job2".into(),
                ..event(7)
            },
        ])
        .await
        .expect_err("a batch names one agent's subject");
    assert!(
        matches!(mixed, mtswarm_bus::BusError::MixedEventBatch { .. }),
        "{mixed}"
    );
    for expected in 1..=5u64 {
        let received = next_ok("live event", &mut live).await;
        assert_eq!(received.message.sequence, expected);
    }

    let mut replay = bus.replay_events("job1", 0).await.expect("replay");
    let mut seen = Vec::new();
    for _ in 1..=5u64 {
        let replayed = next_ok("replayed event", &mut replay).await;
        seen.push((
            replayed.event.sequence,
            replayed.stream_sequence,
            replayed.last_of_message,
        ));
    }
    let batch_sequence = seen[1].1;
    assert_eq!(
        seen,
        vec![
            (1, seen[0].1, true),
            (2, batch_sequence, false),
            (3, batch_sequence, false),
            (4, batch_sequence, true),
            (5, batch_sequence + 1, true),
        ]
    );
    assert_eq!(
        stream_message_count(&bus, subjects::EVENTS_STREAM).await,
        3,
        "one stored message per publish, batch included"
    );
    // Resuming after the batch starts with the event after it.
    let mut resumed = bus
        .replay_events("job1", batch_sequence + 1)
        .await
        .expect("resume");
    assert_eq!(next_ok("resumed", &mut resumed).await.event.sequence, 5);
}

/// A server with the topology, and the lease store on it.
async fn lease_store() -> (mtswarm_bus::testing::NatsServer, Leases) {
    let (server, bus) = setup().await;
    let leases = Leases::open(&bus).await.expect("leases");
    (server, leases)
}

/// The lease `request` asks for, which must be granted (`what` says why).
async fn acquire(
    leases: &Leases,
    request: LeaseRequest,
    what: &str,
) -> mtswarm_bus::Versioned<v1::SliceLease> {
    leases.acquire(&request).await.expect(what)
}

fn lease_request(slice_id: &str, worker_id: &str, ttl_secs: u64) -> LeaseRequest {
    LeaseRequest {
        slice_id: slice_id.into(),
        worker_id: worker_id.into(),
        session_id: format!("{worker_id}-session"),
        job_id: "job1".into(),
        ttl: Duration::from_secs(ttl_secs),
    }
}

#[tokio::test]
async fn lease_acquire_renew_conflict_and_lapse() {
    let (_server, leases) = lease_store().await;
    let mut watch = leases.watch().await.expect("watch");

    let held = acquire(&leases, lease_request("b0-c0", "w1", 1), "acquire").await;
    assert_eq!(held.value.worker_id, "w1");
    let conflict = leases
        .acquire(&lease_request("b0-c0", "w2", 1))
        .await
        .expect_err("slice is held");
    match conflict {
        BusError::LeaseHeld {
            holder_worker_id, ..
        } => assert_eq!(holder_worker_id, "w1"),
        other => panic!("expected LeaseHeld, got {other}"),
    }

    let renewed = leases
        .renew_with(&held, |lease| lease.session_id = "w1-session-2".into())
        .await
        .expect("renew");
    assert!(renewed.revision > held.revision);
    assert_eq!(
        renewed.value.epoch, held.value.epoch,
        "renewal keeps the epoch"
    );
    assert_eq!(renewed.value.session_id, "w1-session-2");
    let stale = leases.renew(&held).await.expect_err("stale revision");
    assert!(matches!(stale, BusError::LeaseLost { .. }), "{stale}");
    assert_eq!(leases.list().await.expect("list").len(), 1);

    // Stop renewing: the TTL lapses and watchers are told.
    let lapsed = lease_event("lease lapse", &mut watch, |event| match event {
        LeaseEvent::Lapsed { slice_id, .. } => Some(slice_id),
        LeaseEvent::Held(_) => None,
        LeaseEvent::Released { slice_id } => panic!("unexpected release of {slice_id}"),
    })
    .await;
    assert_eq!(lapsed, "b0-c0");
    assert!(leases.get("b0-c0").await.expect("get").is_none());
    let after = leases
        .renew(&renewed)
        .await
        .expect_err("lapsed lease cannot be renewed");
    assert!(matches!(after, BusError::LeaseLost { .. }), "{after}");

    let taken = acquire(&leases, lease_request("b0-c0", "w2", 5), "free again").await;
    assert!(
        taken.value.epoch > held.value.epoch,
        "epochs grow across holders"
    );
}

#[tokio::test]
async fn lease_release_and_reclaim() {
    let (_server, leases) = lease_store().await;
    let mut watch = leases.watch().await.expect("watch");
    let held = acquire(&leases, lease_request("s1", "w1", 30), "acquire").await;
    leases.release(&held).await.expect("release");
    let released = lease_event("release event", &mut watch, |event| match event {
        LeaseEvent::Released { slice_id } => Some(slice_id),
        _ => None,
    })
    .await;
    assert_eq!(released, "s1");
    let twice = leases.release(&held).await.expect_err("already released");
    assert!(matches!(twice, BusError::LeaseLost { .. }), "{twice}");

    // A restarted daemon reclaims its own live lease; another worker cannot.
    let held = acquire(&leases, lease_request("s1", "w1", 30), "acquire again").await;
    let reclaimed = leases
        .reclaim(&lease_request("s1", "w1", 30))
        .await
        .expect("reclaim own");
    assert!(reclaimed.value.epoch > held.value.epoch);
    let foreign = leases
        .reclaim(&lease_request("s1", "w2", 30))
        .await
        .expect_err("not w2's");
    assert!(matches!(foreign, BusError::LeaseHeld { .. }), "{foreign}");
}

#[tokio::test]
async fn checkpoints_round_trip_and_fence_stale_attempts() {
    let (_server, bus) = setup().await;
    let checkpoints = Checkpoints::open(&bus).await.expect("checkpoints");
    assert!(checkpoints.get("sess1").await.expect("get").is_none());
    let mut checkpoint = v1::SessionCheckpoint {
        session_id: "sess1".into(),
        job_id: "job1".into(),
        task_id: "t1".into(),
        attempt: 1,
        step: 1,
        state_json: br#"{"history":[]}"#.to_vec(),
        format_version: 1,
        ..Default::default()
    };
    checkpoints.put(&checkpoint).await.expect("step 1");
    checkpoint.step = 2;
    checkpoint.state_json = br#"{"history":["edit"]}"#.to_vec();
    checkpoints.put(&checkpoint).await.expect("step 2");
    let latest = checkpoints
        .get("sess1")
        .await
        .expect("get")
        .expect("present");
    assert!(latest.value.updated_at.is_some(), "put stamps updated_at");
    assert_eq!(
        v1::SessionCheckpoint {
            updated_at: None,
            ..latest.value
        },
        checkpoint
    );

    // Attempt 2 takes over; attempt 1 may no longer write.
    let mut second = checkpoint.clone();
    second.attempt = 2;
    second.step = 3;
    checkpoints.put(&second).await.expect("attempt 2");
    let mut zombie = checkpoint.clone();
    zombie.step = 9;
    let stale = checkpoints.put(&zombie).await.expect_err("stale attempt");
    assert!(
        matches!(
            stale,
            BusError::StaleAttempt {
                stored_attempt: 2,
                attempt: 1,
                ..
            }
        ),
        "{stale}"
    );
    let stored = checkpoints
        .get("sess1")
        .await
        .expect("get")
        .expect("present");
    assert_eq!((stored.value.attempt, stored.value.step), (2, 3));

    // The session's next task starts again at attempt 1: attempts of
    // different tasks are not comparable, so it replaces the checkpoint.
    let mut next_task = second.clone();
    next_task.task_id = "t2".into();
    next_task.attempt = 1;
    next_task.step = 1;
    checkpoints.put(&next_task).await.expect("next task");
    let stored = checkpoints
        .get("sess1")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(
        (stored.value.task_id.as_str(), stored.value.attempt),
        ("t2", 1)
    );
    // Records kept under a session's key go with its checkpoint; another
    // session's stay.
    let parts = checkpoints.kv().nested_view::<v1::SessionCheckpoint>();
    for key in ["sess1.m.n1.0", "sess1.m.n1.1", "sess10.m.n1.0"] {
        parts.put(key, &next_task).await.expect("part");
    }
    checkpoints.delete("sess1").await.expect("delete");
    assert!(checkpoints.get("sess1").await.expect("get").is_none());
    for (key, kept) in [
        ("sess1.m.n1.0", false),
        ("sess1.m.n1.1", false),
        ("sess10.m.n1.0", true),
    ] {
        assert_eq!(parts.get(key).await.expect("get").is_some(), kept, "{key}");
    }
}

#[tokio::test]
async fn approvals_round_trip_and_decision_conflict_is_reported() {
    let (_server, bus) = setup().await;
    let approvals = Approvals::open(&bus).await.expect("approvals");
    let request = v1::ApprovalRequest {
        approval_id: "ap1".into(),
        job_id: "job1".into(),
        session_id: "sess1".into(),
        call_id: "call-9".into(),
        tool_name: "shell".into(),
        arguments_json: r#"{"cmd":"ls"}"#.into(),
        risk: v1::RiskLevel::High as i32,
        timeout_seconds: 300,
        default_verdict: v1::ApprovalVerdict::Deny as i32,
        ..Default::default()
    };
    let mut requests = bus
        .subscribe_approval_requests(None)
        .await
        .expect("subscribe requests");
    let mut decisions = bus
        .subscribe_approval_decisions("sess1")
        .await
        .expect("subscribe decisions");
    bus.flush().await.expect("flush");

    let created = approvals.create(&request).await.expect("create");
    bus.publish_approval_request(&request)
        .await
        .expect("announce");
    let announced = next_ok("request notification", &mut requests).await;
    assert_eq!(announced.message, request);
    let duplicate = approvals.create(&request).await.expect_err("same id twice");
    assert!(
        matches!(duplicate, BusError::AlreadyExists { .. }),
        "{duplicate}"
    );

    let pending = approvals
        .list(Some("job1"), &[v1::ApprovalState::Pending])
        .await
        .expect("list");
    assert_eq!(pending.len(), 1);
    assert!(
        approvals
            .list(Some("job2"), &[])
            .await
            .expect("list")
            .is_empty()
    );

    let approve = v1::ApprovalDecision {
        approval_id: "ap1".into(),
        job_id: "job1".into(),
        session_id: "sess1".into(),
        call_id: "call-9".into(),
        verdict: v1::ApprovalVerdict::Approve as i32,
        reason: "looks safe".into(),
        decided_by: "alice".into(),
        ..Default::default()
    };
    let deny = v1::ApprovalDecision {
        verdict: v1::ApprovalVerdict::Deny as i32,
        decided_by: "bob".into(),
        ..approve.clone()
    };
    // Both deciders read the pending record; the second write must lose.
    let decided = approvals
        .decide_at(&approve, &created)
        .await
        .expect("first decision");
    assert_eq!(decided.value.state(), v1::ApprovalState::Approved);
    let conflict = approvals
        .decide_at(&deny, &created)
        .await
        .expect_err("stale read");
    assert!(
        matches!(conflict, BusError::CasConflict { .. }),
        "{conflict}"
    );
    let late = approvals.decide(&deny).await.expect_err("already decided");
    assert!(matches!(late, BusError::AlreadyDecided { .. }), "{late}");
    let unspecified = v1::ApprovalDecision {
        verdict: v1::ApprovalVerdict::Unspecified as i32,
        ..approve.clone()
    };
    assert!(matches!(
        approvals.decide(&unspecified).await,
        Err(BusError::InvalidDecision { .. })
    ));

    let stored = approvals.get("ap1").await.expect("get").expect("present");
    assert_eq!(stored.value.state(), v1::ApprovalState::Approved);
    assert_eq!(
        stored
            .value
            .decision
            .as_ref()
            .map(|d| d.decided_by.as_str()),
        Some("alice")
    );
    assert!(
        stored
            .value
            .decision
            .as_ref()
            .and_then(|d| d.decided_at)
            .is_some()
    );

    bus.publish_approval_decision(&approve)
        .await
        .expect("notify session");
    let notified = next_ok("decision notification", &mut decisions).await;
    assert_eq!(notified.message.verdict(), v1::ApprovalVerdict::Approve);
}

#[tokio::test]
async fn jobs_are_created_once_and_modified_with_cas() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    let job = v1::JobRecord {
        job_id: "job1".into(),
        state: v1::JobState::Queued as i32,
        spec: Some(v1::JobSpec {
            goal: "tune @gemm.c".into(),
            num_agents: 4,
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = jobs.create(&job).await.expect("create");
    assert!(matches!(
        jobs.create(&job).await,
        Err(BusError::AlreadyExists { .. })
    ));

    // Two concurrent modifications both land (CAS retry).
    let (a, b) = tokio::join!(
        jobs.modify("job1", |j| j.tasks_total += 1),
        jobs.modify("job1", |j| j.tasks_total += 1)
    );
    a.expect("modify a");
    b.expect("modify b");
    let latest = jobs.get("job1").await.expect("get").expect("present");
    assert_eq!(latest.value.tasks_total, 2);
    let stale = jobs
        .update(&job, created.revision)
        .await
        .expect_err("stale revision");
    assert!(stale.is_conflict(), "{stale}");
    assert!(matches!(
        jobs.modify("missing", |_| {}).await,
        Err(BusError::NotFound { .. })
    ));
    assert_eq!(jobs.list().await.expect("list").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_jetstream_data_and_client_reconnects() {
    let mut server = start_server().await;
    let bus = connect(&server, "survivor").await;
    ensure_topology(&bus).await;
    let jobs = Jobs::open(&bus).await.expect("jobs");
    jobs.create(&v1::JobRecord {
        job_id: "persisted".into(),
        ..Default::default()
    })
    .await
    .expect("job");
    bus.publish_task(&task("before", 1, "w1", "s1"))
        .await
        .expect("publish before");

    let mut state = bus.connection_state();
    tokio::task::block_in_place(|| server.stop()).expect("stop");
    within(
        "disconnect",
        state.wait_for(|s| *s == ConnectionState::Disconnected),
    )
    .await
    .expect("state channel open");
    tokio::task::block_in_place(|| server.restart()).expect("restart");
    bus.wait_connected(WAIT)
        .await
        .expect("client reconnects by itself");

    // The same client keeps publishing, and data from before the restart is there.
    bus.publish_task(&task("after", 1, "w1", "s1"))
        .await
        .expect("publish after");
    let mut tasks = w1_tasks(&bus).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let delivery = next_ok("task", &mut tasks).await;
        seen.push(delivery.message().task_id.clone());
        delivery.ack().await.expect("ack");
    }
    assert_eq!(seen, vec!["before".to_string(), "after".to_string()]);
    assert!(
        jobs.get("persisted").await.expect("get").is_some(),
        "KV survived the restart"
    );
}

#[tokio::test]
async fn lease_keeper_holds_the_slice_past_its_ttl_and_abandon_lets_it_lapse() {
    let (_server, leases) = lease_store().await;
    // A 2 s TTL renewed every 300 ms: a renewal may stall for over a
    // second on a loaded machine (each is a synced write) and still land.
    let held = acquire(&leases, lease_request("kept", "w1", 2), "acquire").await;
    let keeper = leases.keep(held.clone(), Duration::from_millis(300));
    let mut states = keeper.subscribe();
    // Several renewals: the lease outlives its 2 s TTL twice over.
    let mut renewals = 0;
    within("renewals", async {
        while renewals < 14 {
            states.changed().await.expect("keeper alive");
            match &*states.borrow() {
                mtswarm_bus::KeptLease::Held(renewed) => {
                    assert!(renewed.revision > held.revision);
                    renewals += 1;
                }
                other => panic!("lease not kept: {other:?}"),
            }
        }
    })
    .await;
    let conflict = leases
        .acquire(&lease_request("kept", "w2", 1))
        .await
        .expect_err("still held");
    assert!(matches!(conflict, BusError::LeaseHeld { .. }), "{conflict}");

    let mut watch = leases.watch().await.expect("watch");
    keeper.abandon().await;
    assert_eq!(
        lease_event("lapse after abandon", &mut watch, lapsed).await,
        "kept"
    );
    acquire(&leases, lease_request("kept", "w2", 1), "free after lapse").await;
}

#[tokio::test]
async fn lease_keeper_reports_a_lost_lease_and_release_works() {
    let (_server, leases) = lease_store().await;
    let held = acquire(&leases, lease_request("s9", "w1", 30), "acquire").await;
    let keeper = leases.keep(held.clone(), Duration::from_millis(100));
    // Someone else removes the lease (e.g. an operator): the keeper finds out.
    leases.kv().delete("s9", None).await.expect("delete");
    let lost = within("loss reported", keeper.lost()).await;
    assert!(
        matches!(lost, mtswarm_bus::KeptLease::Lost { .. }),
        "{lost:?}"
    );
    assert!(matches!(
        keeper.release().await,
        Err(BusError::LeaseLost { .. })
    ));

    let held = acquire(&leases, lease_request("s9", "w1", 30), "acquire again").await;
    let keeper = leases.keep(held, Duration::from_millis(100));
    keeper.release().await.expect("release");
    assert!(leases.get("s9").await.expect("get").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_task_stream_keeps_delivering_across_a_server_restart() {
    let (mut server, leader, worker_bus) = leader_and_worker().await;
    let mut tasks = w1_tasks(&worker_bus).await;
    leader
        .publish_task(&task("before", 1, "w1", "s1"))
        .await
        .expect("publish");
    let first = next_ok("task before restart", &mut tasks).await;
    first.ack_confirmed().await.expect("ack");

    tokio::task::block_in_place(|| server.restart()).expect("restart");
    leader
        .wait_connected(WAIT)
        .await
        .expect("leader reconnects");
    worker_bus
        .wait_connected(WAIT)
        .await
        .expect("worker reconnects");
    leader
        .publish_task(&task("after", 1, "w1", "s1"))
        .await
        .expect("publish after");

    // The stream may report transient errors (missed heartbeats) while the
    // server is away; it must then resume with the next task.
    let after = within("task after restart", next_past_transient_errors(&mut tasks)).await;
    assert_eq!(after.message().task_id, "after");
    after.ack_confirmed().await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_state_task_consumer_is_recreated_after_a_restart_and_redelivers_unacked_tasks() {
    let (mut server, leader, worker_bus) = leader_and_worker().await;
    let config = TaskConsumerConfig {
        slice_id: Some("s1".into()),
        max_ack_pending: 1,
        batch: 1,
        memory_state: true,
        ..Default::default()
    };
    let worker = worker_bus
        .task_consumer("w1", config)
        .await
        .expect("consumer");
    let info = task_consumer_info(&leader, worker.name()).await;
    assert!(info.config.memory_storage, "consumer state kept in memory");

    let mut tasks = worker.messages().await.expect("stream");
    for id in ["done", "open"] {
        leader
            .publish_task(&task(id, 1, "w1", "s1"))
            .await
            .expect("publish");
    }
    let done = next_ok("first task", &mut tasks).await;
    assert_eq!(done.message().task_id, "done");
    done.ack_confirmed().await.expect("ack");
    let open = next_ok("second task", &mut tasks).await;
    assert_eq!(open.message().task_id, "open");
    drop(tasks);

    tokio::task::block_in_place(|| server.restart()).expect("restart");
    worker_bus
        .wait_connected(WAIT)
        .await
        .expect("worker reconnects");
    // The acknowledged task is gone for good; the open one comes back (as a
    // first delivery: the delivery count was part of the lost state).
    let mut tasks = within("re-opened stream", worker.messages())
        .await
        .expect("consumer created again");
    let again = within("task after restart", next_past_transient_errors(&mut tasks)).await;
    assert_eq!(again.message().task_id, "open");
    again.ack_confirmed().await.expect("ack");
    assert_eq!(
        stream_message_count(&leader, subjects::TASKS_STREAM).await,
        0
    );
}

#[tokio::test]
async fn a_file_state_task_consumer_stays_as_it_is_when_memory_state_is_asked_for() {
    let (_server, bus) = setup().await;
    let file_state = TaskConsumerConfig {
        slice_id: Some("s1".into()),
        ..Default::default()
    };
    bus.task_consumer("w1", file_state.clone())
        .await
        .expect("file-state consumer");
    let reopened = bus
        .task_consumer(
            "w1",
            TaskConsumerConfig {
                memory_state: true,
                ..file_state
            },
        )
        .await
        .expect("the existing consumer is opened");
    let info = task_consumer_info(&bus, reopened.name()).await;
    assert!(!info.config.memory_storage);
    let mut tasks = reopened.messages().await.expect("stream");
    bus.publish_task(&task("t1", 1, "w1", "s1"))
        .await
        .expect("publish");
    let delivery = next_ok("task", &mut tasks).await;
    assert_eq!(delivery.message().task_id, "t1");
    delivery.ack_confirmed().await.expect("ack");
}
