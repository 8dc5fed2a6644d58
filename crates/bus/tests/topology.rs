//! The deployment's shape of the streams and buckets: a later ensure with
//! other limits reshapes what exists, and replicas a server cannot place are
//! refused with an error that names the stream and the numbers.

mod common;

use std::time::Duration;

use common::{connect, setup, start_server, stream_info};
use mtswarm_bus::{BusError, TopologyConfig, subjects};

#[tokio::test]
async fn a_second_ensure_with_other_limits_reshapes_the_streams() {
    let (_server, bus) = setup().await;
    let first = TopologyConfig::for_tests();
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
        ..TopologyConfig::for_tests()
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
        ..TopologyConfig::for_tests()
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
    assert_eq!(bus.topology_in_use(), TopologyConfig::for_tests());

    let zero = TopologyConfig {
        replicas: 0,
        ..TopologyConfig::for_tests()
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
        ..TopologyConfig::for_tests()
    })
    .await
    .expect("topology");
    assert_eq!(bus.max_record_bytes(), 4096);
    bus.adopt_topology(&TopologyConfig {
        max_record_bytes: Some(64 << 20),
        ..TopologyConfig::for_tests()
    });
    assert_eq!(bus.max_record_bytes(), 1 << 20, "capped by max_payload");
}
