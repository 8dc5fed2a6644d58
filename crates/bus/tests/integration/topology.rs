//! The deployment's shape of the streams and buckets: a later ensure with
//! other limits reshapes what exists, and replicas a server cannot place are
//! refused with an error that names the stream and the numbers; a record
//! over the size limit is refused before it is sent, naming it; limits a
//! small store cannot hold are refused with an error that says what to
//! change; test servers run with the sync policy and payload limit they
//! are given.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::time::Duration;

use common::{connect, setup, start_server, stream_info};
use mtswarm_bus::local_server::{LocalServerOptions, SyncPolicy, server_settings};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{BusError, Jobs, TopologyConfig, subjects, v1};

#[tokio::test]
async fn a_second_ensure_with_other_limits_reshapes_the_streams() {
    let (_server, bus) = setup().await;
    let first = TopologyConfig::small();
    let events = stream_info(&bus, subjects::EVENTS_STREAM).await;
    assert_eq!(events.config.max_bytes, first.event_max_bytes);
    let measurements = stream_info(&bus, subjects::MEASUREMENTS_STREAM).await;
    assert_eq!(measurements.config.max_bytes, first.measurements_max_bytes);

    let second = TopologyConfig {
        event_max_bytes: 32 << 20,
        measurements_max_bytes: 16 << 20,
        measurement_max_record_bytes: 256 << 10,
        duplicate_window: Duration::from_secs(120),
        record_history: 3,
        ..TopologyConfig::small()
    };
    bus.ensure_topology(&second).await.expect("second ensure");

    let events = stream_info(&bus, subjects::EVENTS_STREAM).await;
    assert_eq!(events.config.max_bytes, 32 << 20);
    let measurements = stream_info(&bus, subjects::MEASUREMENTS_STREAM).await;
    assert_eq!(measurements.config.max_bytes, 16 << 20);
    assert_eq!(measurements.config.max_message_size, 256 << 10);
    let tasks = stream_info(&bus, subjects::TASKS_STREAM).await;
    assert_eq!(tasks.config.duplicate_window, Duration::from_secs(120));
    let jobs = stream_info(&bus, &format!("KV_{}", subjects::JOBS_BUCKET)).await;
    assert_eq!(jobs.config.max_messages_per_subject, 3);
    assert_eq!(bus.topology_in_use(), second);
}

#[tokio::test]
async fn replicas_a_single_server_cannot_place_are_a_clear_error() {
    let (server, bus) = setup().await;
    let three = TopologyConfig {
        replicas: 3,
        ..TopologyConfig::small()
    };
    let error = bus
        .ensure_topology(&three)
        .await
        .expect_err("a single server keeps one replica");
    let BusError::Replicas {
        what,
        replicas,
        servers,
        ..
    } = &error
    else {
        panic!("not a replicas error: {error}");
    };
    assert_eq!(what, &format!("stream {}", subjects::TASKS_STREAM));
    assert_eq!((*replicas, *servers), (3, 1));
    let text = error.to_string();
    assert!(text.contains("3 replicas"), "{text}");
    assert!(text.contains("MTSWARM_NATS_REPLICAS"), "{text}");
    // Nothing was changed, and the shape in use is still the first one.
    let tasks = stream_info(&bus, subjects::TASKS_STREAM).await;
    assert_eq!(tasks.config.num_replicas, 1);
    assert_eq!(bus.topology_in_use(), TopologyConfig::small());

    let zero = TopologyConfig {
        replicas: 0,
        ..TopologyConfig::small()
    };
    let fresh = connect(&server, "fresh").await;
    let error = fresh.ensure_topology(&zero).await.expect_err("no replicas");
    assert!(matches!(error, BusError::InvalidConfig(_)), "{error}");
    assert!(error.to_string().contains("0 replicas"), "{error}");
}

#[tokio::test]
async fn the_record_limit_is_the_smaller_of_max_payload_and_the_configured_cap() {
    let server = start_server().await;
    let bus = connect(&server, "limits").await;
    // nats-server's default max_payload.
    assert_eq!(bus.max_record_bytes(), 1 << 20);
    bus.ensure_topology(&TopologyConfig {
        max_record_bytes: Some(4096),
        ..TopologyConfig::small()
    })
    .await
    .expect("topology");
    assert_eq!(bus.max_record_bytes(), 4096);
    bus.adopt_topology(&TopologyConfig {
        max_record_bytes: Some(64 << 20),
        ..TopologyConfig::small()
    });
    assert_eq!(bus.max_record_bytes(), 1 << 20, "capped by max_payload");
}

#[tokio::test]
async fn a_kv_record_over_the_limit_is_refused_with_its_name_and_sizes() {
    let (_server, bus) = setup().await;
    let jobs = Jobs::open(&bus).await.expect("jobs bucket");
    let mut job = v1::JobRecord {
        job_id: "job-123".into(),
        summary: "x".repeat(1_500_000),
        ..Default::default()
    };
    let error = jobs.create(&job).await.expect_err("over max_payload");
    let BusError::RecordTooLarge {
        what, bytes, limit, ..
    } = &error
    else {
        panic!("not a size error: {error}");
    };
    assert_eq!(what, "mtswarm.v1.JobRecord record mtswarm_jobs/job-123");
    assert!(*bytes > 1_500_000, "{bytes}");
    assert_eq!(*limit, 1 << 20);
    let text = error.to_string();
    assert!(
        text.contains("over the 1 MiB limit (the server's max_payload)"),
        "{text}"
    );
    assert!(
        jobs.get("job-123").await.expect("get").is_none(),
        "nothing stored"
    );

    // Under the limit it is stored; the connection still works.
    job.summary = "x".repeat(500_000);
    jobs.create(&job).await.expect("under the limit");
}

#[tokio::test]
async fn a_stream_record_over_the_configured_cap_is_refused_before_it_is_sent() {
    let (_server, bus) = setup().await;
    bus.ensure_topology(&TopologyConfig {
        max_record_bytes: Some(64 << 10),
        ..TopologyConfig::small()
    })
    .await
    .expect("topology");
    let mut task = common::task("big", 1, "w1", "s1");
    task.instructions = "y".repeat(100_000);
    let error = bus.publish_task(&task).await.expect_err("over the cap");
    let BusError::RecordTooLarge {
        what,
        limit,
        limit_from,
        ..
    } = &error
    else {
        panic!("not a size error: {error}");
    };
    assert_eq!(what, "mtswarm.v1.TaskAssignment on mtswarm.task.w1.s1");
    assert_eq!(*limit, 64 << 10);
    assert!(
        limit_from.contains("--nats-max-record-bytes"),
        "{limit_from}"
    );
    let tasks = stream_info(&bus, subjects::TASKS_STREAM).await;
    assert_eq!(tasks.state.messages, 0, "nothing stored");
    task.instructions = "y".repeat(1000);
    bus.publish_task(&task).await.expect("under the cap");
}

#[tokio::test]
async fn the_server_runs_with_the_sync_policy_and_payload_limit_it_was_given() {
    assert_eq!(
        server_settings(SyncPolicy::Always, Some(2 << 20)),
        "max_payload: 2097152\njetstream { sync_interval: always }\n"
    );
    assert_eq!(
        server_settings(SyncPolicy::Every(Duration::from_secs(2)), None),
        "jetstream { sync_interval: \"2000ms\" }\n"
    );
    assert_eq!(server_settings(SyncPolicy::ServerDefault, None), "");
    for sync in [
        SyncPolicy::Always,
        SyncPolicy::Every(Duration::from_secs(1)),
        SyncPolicy::ServerDefault,
    ] {
        let server = tokio::task::spawn_blocking(move || {
            NatsServer::start_with(LocalServerOptions {
                sync,
                max_payload: Some(2 << 20),
                ..LocalServerOptions::default()
            })
        })
        .await
        .expect("start task")
        .unwrap_or_else(|error| panic!("nats-server with {sync:?}: {error}"));
        let bus = connect(&server, "sync").await;
        assert_eq!(bus.max_record_bytes(), 2 << 20, "{sync:?}");
        bus.ensure_topology(&TopologyConfig::small())
            .await
            .expect("JetStream works");
    }
}

/// The store a server grants JetStream (here `max_file_store`; by default
/// three quarters of its disk's free space) bounds the stream size limits
/// it takes: the production limits on a small store are refused with an
/// error that says what to change, and the same topology fitted to that
/// store is created.
#[tokio::test]
async fn stream_limits_the_store_cannot_hold_are_a_clear_error_and_fit_once_fitted() {
    const GRANTED: u64 = 256 << 20;
    let server = tokio::task::spawn_blocking(|| {
        NatsServer::start_with(LocalServerOptions {
            // One `jetstream` block: the sync policy would add another.
            sync: SyncPolicy::ServerDefault,
            config: Some(format!("jetstream {{ max_file_store: {GRANTED} }}\n")),
            ..LocalServerOptions::default()
        })
    })
    .await
    .expect("start task")
    .expect("nats-server starts");
    let bus = connect(&server, "store").await;

    let production = TopologyConfig::default();
    let error = bus
        .ensure_topology(&production)
        .await
        .expect_err("6 GiB of limits cannot be reserved in 256 MiB");
    assert!(matches!(error, BusError::StoreFull { .. }), "{error:?}");
    let text = error.to_string();
    for part in [
        "6 GiB in all",
        "--nats-events-max-bytes",
        "--nats-measurements-max-bytes",
        "insufficient storage",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }

    // The free disk that makes JetStream grant `GRANTED`.
    let fitted = production.fitted_to_store(GRANTED / 3 * 4);
    assert!(fitted.reserved_bytes() <= i64::try_from(GRANTED / 2).unwrap());
    bus.ensure_topology(&fitted)
        .await
        .expect("the fitted limits fit");
    let measurements = stream_info(&bus, subjects::MEASUREMENTS_STREAM).await;
    assert_eq!(measurements.config.max_bytes, fitted.measurements_max_bytes);
}

/// What `sync_interval: always` costs: the p50 and p99 of an acknowledged
/// task publish, one in flight, with it and with nats-server's default
/// (printed; run with `--nocapture` to see the figures).
#[tokio::test]
async fn publish_latency_with_and_without_syncing_every_write() {
    const PUBLISHES: usize = 300;
    for sync in [SyncPolicy::Always, SyncPolicy::ServerDefault] {
        let server = tokio::task::spawn_blocking(move || {
            NatsServer::start_with(LocalServerOptions {
                sync,
                ..LocalServerOptions::default()
            })
        })
        .await
        .expect("start task")
        .expect("nats-server starts");
        let bus = connect(&server, "latency").await;
        bus.ensure_topology(&TopologyConfig::small())
            .await
            .expect("topology");
        let mut took = Vec::with_capacity(PUBLISHES);
        for i in 0..PUBLISHES {
            let task = common::task(&format!("t{i}"), 1, "w1", "s1");
            let started = std::time::Instant::now();
            let receipt = bus.publish_task(&task).await.expect("publish");
            took.push(started.elapsed());
            assert!(!receipt.duplicate);
        }
        took.sort();
        let tasks = stream_info(&bus, subjects::TASKS_STREAM).await;
        assert_eq!(tasks.state.messages, PUBLISHES as u64);
        println!(
            "JetStream publish with {sync:?}: p50 {:?}, p99 {:?} over {PUBLISHES}",
            took[PUBLISHES / 2],
            took[PUBLISHES * 99 / 100]
        );
    }
}
