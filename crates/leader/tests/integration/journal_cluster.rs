//! The job event journal on a real 3-node nats-server cluster at 3
//! replicas: events appended right after the journal stream's leader is
//! SIGKILLed (while the cluster elects a new one, when a publish is dropped
//! or never acknowledged) are all stored, each once, and a retried append
//! under the same message id is not stored twice.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_bus::testing::cluster::{LocalCluster, stream_leader, wait_meta_leader};
use mtswarm_bus::{Bus, BusConfig, TopologyConfig, v1};
use mtswarm_leader::JOB_EVENTS_STREAM;
use mtswarm_leader::Journal;

/// Bound of the cluster's own waits (elections take seconds).
const WAIT: Duration = Duration::from_secs(60);
/// Events appended after the kill.
const AFTER_KILL: usize = 20;

fn state_change(n: usize) -> v1::job_event::Event {
    v1::job_event::Event::StateChange(v1::JobStateChange {
        reason: format!("event {n}"),
        ..Default::default()
    })
}

fn message_of(event: &v1::JobEvent) -> String {
    match &event.event {
        Some(v1::job_event::Event::StateChange(change)) => change.reason.clone(),
        other => panic!("unexpected event {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_survive_a_journal_leader_killed_mid_stream() {
    let mut cluster = tokio::task::spawn_blocking(|| LocalCluster::start(3))
        .await
        .expect("start task")
        .expect("3 nats-servers start");
    let mut config = BusConfig::new(cluster.urls()[0].clone()).with_name("journal-cluster");
    config.servers = cluster.urls();
    config.request_timeout = Duration::from_secs(5);
    let bus = Bus::connect(config).await.expect("connect");
    bus.wait_connected(WAIT).await.expect("connected");
    wait_meta_leader(&bus, WAIT).await;
    let topology = TopologyConfig {
        replicas: 3,
        ..TopologyConfig::small()
    };
    let journal = Journal::ensure(&bus, &topology).await.expect("journal");
    let job = "job-cluster";
    journal
        .append_confirmed(job, state_change(0))
        .await
        .expect("first append");

    // A retry of a stored append (same message id) is dropped by the stream.
    let once = journal
        .append_with_id(job, state_change(1), "event-1".to_string())
        .await
        .expect("append with id");
    let again = journal
        .append_with_id(job, state_change(1), "event-1".to_string())
        .await
        .expect("append with id again");
    assert_eq!(once, again, "the retry names the stored original");

    let leader = stream_leader(&bus, JOB_EVENTS_STREAM, WAIT).await;
    let victim = cluster.index_of(&leader).expect("a node of the cluster");
    tokio::task::block_in_place(|| cluster.kill(victim)).expect("SIGKILL the leader");
    for n in 2..2 + AFTER_KILL {
        journal
            .append(job, state_change(n))
            .await
            .unwrap_or_else(|e| panic!("append {n} after the kill: {e}"));
    }
    let new_leader = stream_leader(&bus, JOB_EVENTS_STREAM, WAIT).await;
    assert_ne!(new_leader, leader, "the journal got a new leader");

    // The watch's consumer is created on the new leader, which may still be
    // settling in: a request that times out meanwhile is made again.
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut events = loop {
        match journal.watch(job, 0).await {
            Ok(events) => break events,
            Err(error) if tokio::time::Instant::now() < deadline => {
                eprintln!("watch not created yet: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("watch: {error}"),
        }
    };
    let mut seen = Vec::new();
    while seen.len() < 2 + AFTER_KILL {
        let event = tokio::time::timeout(WAIT, events.next())
            .await
            .unwrap_or_else(|_| panic!("only {} events stored: {seen:?}", seen.len()))
            .expect("stream open")
            .expect("event");
        seen.push(message_of(&event));
    }
    // Nothing more: no event stored twice.
    let extra = tokio::time::timeout(Duration::from_secs(2), events.next()).await;
    assert!(extra.is_err(), "an extra event: {extra:?}");
    let mut sorted = seen.clone();
    sorted.sort_by_key(|m| m[6..].parse::<usize>().expect("number"));
    let wanted: Vec<String> = (0..2 + AFTER_KILL).map(|n| format!("event {n}")).collect();
    assert_eq!(sorted, wanted, "every append stored once");
}
