//! Shared setup for the bus integration tests: a real nats-server per test.

#![allow(dead_code)]

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::stream;
use futures::{Stream, StreamExt as _};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, DeliveryStream, TaskConsumerConfig, TopologyConfig, v1};

/// Upper bound for any single wait in these tests.
pub(crate) const WAIT: Duration = Duration::from_secs(15);

pub(crate) async fn start_server() -> NatsServer {
    tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start task")
        .expect("nats-server starts")
}

pub(crate) async fn connect(server: &NatsServer, name: &str) -> Bus {
    let bus = Bus::connect(BusConfig::new(server.url()).with_name(name))
        .await
        .expect("connect");
    bus.wait_connected(WAIT).await.expect("connected");
    bus
}

/// A server, a connected bus and the topology.
pub(crate) async fn setup() -> (NatsServer, Bus) {
    let server = start_server().await;
    let bus = connect(&server, "test").await;
    ensure_topology(&bus).await;
    (server, bus)
}

/// The default topology, created (or checked) through `bus`.
pub(crate) async fn ensure_topology(bus: &Bus) {
    bus.ensure_topology(&TopologyConfig::small())
        .await
        .expect("topology");
}

/// A server with two clients of their own, a leader's and a worker's, and
/// the topology: for tests in which each side reconnects by itself.
pub(crate) async fn leader_and_worker() -> (NatsServer, Bus, Bus) {
    let server = start_server().await;
    let leader = connect(&server, "leader").await;
    let worker = connect(&server, "worker").await;
    ensure_topology(&leader).await;
    (server, leader, worker)
}

/// The next item of `stream` within [`WAIT`]; the stream must still be open
/// and the item must not be an error (`what` names it when it is).
pub(crate) async fn next_ok<T, E: Debug>(
    what: &str,
    stream: &mut (impl Stream<Item = Result<T, E>> + Unpin),
) -> T {
    within(what, stream.next())
        .await
        .expect("stream open")
        .unwrap_or_else(|error| panic!("{what}: {error:?}"))
}

/// The server's info on the stream `name`, which must exist.
pub(crate) async fn stream_info(bus: &Bus, name: &str) -> stream::Info {
    bus.jetstream()
        .get_stream(name)
        .await
        .expect("stream exists")
        .get_info()
        .await
        .expect("stream info")
}

/// The tasks of worker w1, through its worker-wide consumer with the
/// default settings, as they arrive.
pub(crate) async fn w1_tasks(bus: &Bus) -> DeliveryStream<v1::TaskAssignment> {
    bus.task_consumer("w1", TaskConsumerConfig::default())
        .await
        .expect("task consumer")
        .messages()
        .await
        .expect("task stream")
}

/// A result that names only its task, attempt 1 of job1.
pub(crate) fn bare_result(task_id: &str) -> v1::TaskResult {
    v1::TaskResult {
        task_id: task_id.into(),
        attempt: 1,
        job_id: "job1".into(),
        ..Default::default()
    }
}

/// Awaits `future` at most [`WAIT`], naming what was awaited on timeout.
pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub(crate) fn task(
    task_id: &str,
    attempt: u32,
    worker_id: &str,
    slice_id: &str,
) -> v1::TaskAssignment {
    v1::TaskAssignment {
        task_id: task_id.into(),
        job_id: "job1".into(),
        attempt,
        agent_id: "agent1".into(),
        session_id: "session1".into(),
        worker_id: worker_id.into(),
        slice_id: slice_id.into(),
        instructions: "tune @gemm.c".into(),
        kernel_dir: "examples/gemm".into(),
        parameters_json: r#"{"tile":[32,64]}"#.into(),
        ..Default::default()
    }
}
