//! The daemon's one task consumer: however many sessions run, the tasks
//! stream has one consumer for the daemon; tasks queued behind a long one
//! stay delivered once (the daemon keeps them alive past their ack wait);
//! tasks nobody here will run are terminated; idle sessions end without a
//! timer of their own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use mtswarm_bus::{Bus, subjects, v1};
use serde_json::json;

/// One emulated board cut into `clusters` single-core cluster slices.
fn fleet(clusters: u32) -> String {
    format!(
        "[[board]]\nid = \"farm\"\nbackend = \"emulator\"\nspec = {{ clusters = {clusters} }}\nslicing = \"per-cluster\"\ncores = 1\n"
    )
}

async fn tasks_stream(bus: &Bus) -> async_nats::jetstream::stream::Stream {
    bus.jetstream()
        .get_stream(subjects::TASKS_STREAM)
        .await
        .expect("tasks stream")
}

/// Waits until the consumer `name` has nothing unacknowledged; returns its info.
async fn settled_consumer(bus: &Bus, name: &str) -> async_nats::jetstream::consumer::Info {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let info = tasks_stream(bus)
            .await
            .consumer_info(name)
            .await
            .expect("consumer info");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            return info;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "consumer {name} never settled: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_consumer_serves_every_session_and_a_backlog_is_delivered_once() {
    const SESSIONS: u32 = 12;
    let env = Env::start_with_fleet(&fleet(SESSIONS)).await;
    let mut config = env.config("farm");
    config.max_sessions = SESSIONS as usize;
    // Short enough that the backlog below outlives it many times over.
    config.task_ack_wait = Duration::from_secs(1);
    config.lease_ttl = Duration::from_secs(15);
    config.worker_ttl = Duration::from_secs(15);
    let handle = env.daemon(config).await;
    let slices = handle.slice_ids();
    assert_eq!(slices.len(), SESSIONS as usize);
    let sessions: Vec<Session> = slices
        .iter()
        .enumerate()
        .map(|(i, slice)| Session::on(&handle, slice, "jobQ", &format!("a{i}"), &format!("s{i}")))
        .collect();
    for session in &sessions {
        spawn(&handle, session.auto_approved()).await;
    }

    let mut stream = tasks_stream(&env.bus).await;
    let info = stream.info().await.expect("stream info");
    assert_eq!(
        info.state.consumer_count, 1,
        "one task consumer for the daemon, not one per session"
    );
    let consumer = subjects::task_consumer_name(handle.worker_id(), None).unwrap();
    tasks_stream(&env.bus)
        .await
        .consumer_info(&consumer)
        .await
        .expect("the daemon's consumer is the worker-wide one");

    // s0 first runs a real candidate (compile and emulate: seconds, many
    // ack waits); five no-op tasks queue behind it. Every other session
    // gets one no-op task.
    let mut results = results(&env.bus, "jobQ", "dispatch").await;
    let busy = &sessions[0];
    env.publish(&busy.task(
        "long",
        1,
        json!({"candidates": [{"N": 16384, "CHUNK": 256}]}),
    ))
    .await;
    let mut expected = vec!["long".to_owned()];
    for n in 0..5 {
        let task_id = format!("queued{n}");
        env.publish(&busy.task(&task_id, 1, json!({"noop": true})))
            .await;
        expected.push(task_id);
    }
    for (i, session) in sessions.iter().enumerate().skip(1) {
        let task_id = format!("other{i}");
        env.publish(&session.task(&task_id, 1, json!({"noop": true})))
            .await;
        expected.push(task_id);
    }

    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let mut order_on_busy = Vec::new();
    while seen.len() < expected.len() {
        let result = next_result(&mut results, "the tasks' results").await;
        assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
        if result.session_id == busy.id {
            order_on_busy.push(result.task_id.clone());
        }
        *seen.entry(result.task_id).or_default() += 1;
    }
    expected.sort();
    assert_eq!(seen.keys().cloned().collect::<Vec<_>>(), expected);
    assert!(seen.values().all(|n| *n == 1), "a task ran twice: {seen:?}");
    assert_eq!(
        order_on_busy,
        [
            "long", "queued0", "queued1", "queued2", "queued3", "queued4"
        ],
        "a session takes its tasks in the order they were published"
    );
    let info = settled_consumer(&env.bus, &consumer).await;
    // The consumer's delivery sequence counts redeliveries too.
    assert_eq!(
        info.delivered.consumer_sequence,
        expected.len() as u64,
        "tasks queued behind a long one are kept alive, not redelivered"
    );
    stream.info().await.expect("stream info");
    assert_eq!(
        stream.cached_info().state.messages,
        0,
        "every task left the work queue"
    );
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_no_session_here_will_run_are_terminated_and_idle_sessions_end() {
    let env = Env::start_with_fleet(&fleet(2)).await;
    let mut config = env.config("farm");
    config.max_sessions = 2;
    config.task_max_deliver = 3;
    config.session_idle_timeout = Duration::from_secs(2);
    config.lease_ttl = Duration::from_secs(15);
    config.worker_ttl = Duration::from_secs(15);
    let handle = env.daemon(config).await;
    let slices = handle.slice_ids();
    let consumer = subjects::task_consumer_name(handle.worker_id(), None).unwrap();
    let mut events = env.bus.subscribe_events("jobI").await.expect("events");
    env.bus.flush().await.expect("flush");

    // A task for a session that never starts on a free slice: offered a
    // few times, then terminated, without a result.
    let nobody = Session::on(&handle, &slices[1], "jobI", "ghost", "ghost-session");
    env.publish(&nobody.task("orphan", 1, json!({"noop": true})))
        .await;
    let info = settled_consumer(&env.bus, &consumer).await;
    assert_eq!(info.delivered.stream_sequence, 1, "{info:?}");
    assert_eq!(
        info.delivered.consumer_sequence, 3,
        "the orphan was offered up to its delivery limit, then terminated: {info:?}"
    );
    let mut stream = tasks_stream(&env.bus).await;
    assert_eq!(
        stream.info().await.expect("stream info").state.messages,
        0,
        "the orphan left the work queue"
    );

    // An idle session ends after its timeout and frees its slice, and the
    // session after it on the slice runs its task.
    let idle = Session::on(&handle, &slices[0], "jobI", "a0", "idle0");
    let started = tokio::time::Instant::now();
    spawn(&handle, idle.auto_approved()).await;
    let mut seen = Vec::new();
    let finished = events_until(&mut events, &mut seen, |e| {
        e.session_id == "idle0" && is_kind(e, v1::AgentEventKind::SessionFinished)
    })
    .await;
    let body: serde_json::Value = serde_json::from_str(&finished.payload_json).expect("json");
    assert_eq!(body["reason"], "idle for 2s", "{body}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ended before its idle timeout"
    );
    let next = Session::on(&handle, &slices[0], "jobI", "a1", "after-idle");
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut grpc = client(&handle).await;
    // The slice is free once the ended session left the table.
    while let Err(status) = grpc.spawn_session(next.auto_approved()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the idle session's slice was never freed: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut results = results(&env.bus, "jobI", "idle").await;
    env.publish(&next.task("after", 1, json!({"noop": true})))
        .await;
    let result = next_result(&mut results, "the next session's result").await;
    assert_eq!(result.task_id, "after");
    handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_slice_consumer_of_an_earlier_version_is_replaced_by_the_daemons_one() {
    let env = Env::start_with_fleet(&fleet(2)).await;
    // What an earlier version left: a task consumer for one slice, whose
    // filter overlaps the worker-wide one on the work queue.
    env.bus
        .task_consumer(
            "worker-farm",
            mtswarm_bus::TaskConsumerConfig {
                slice_id: Some("farm-c0".into()),
                ..Default::default()
            },
        )
        .await
        .expect("per-slice consumer");
    let config = env.config("farm");
    let handle = env.daemon(config).await;
    assert_eq!(handle.worker_id(), "worker-farm");
    let mut stream = tasks_stream(&env.bus).await;
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.consumer_count, 1, "the old consumer is gone");
    let consumer = subjects::task_consumer_name(handle.worker_id(), None).unwrap();
    stream
        .consumer_info(&consumer)
        .await
        .expect("the daemon's worker-wide consumer exists");
    handle.shutdown().await.expect("shutdown");
}
