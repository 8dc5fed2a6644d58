//! Shared setup for the bus integration tests: a real nats-server per test.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, TopologyConfig, v1};

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
    bus.ensure_topology(&TopologyConfig::default())
        .await
        .expect("topology");
    (server, bus)
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
