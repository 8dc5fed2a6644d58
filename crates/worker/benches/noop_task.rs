//! Latency of one task through a worker daemon with the no-op task mode
//! (`{"noop": true}`: the builtin policy answers at once): `publish_task`
//! (JetStream) -> the session's durable consumer -> one engine run (its
//! checkpoint writes, a handful of events) -> `TaskResult` (JetStream) -> the
//! caller's result consumer. This is the fixed cost the worker adds to
//! every task; a real task adds its model turns and tool calls.
//!
//! `cargo bench -p mtswarm-worker --bench noop_task`

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt as _;
use mtswarm_bus::testing::{NatsServer, ready_bus};
use mtswarm_bus::{BusConfig, ResultConsumerConfig, v1};
use mtswarm_worker::{WorkerConfig, WorkerDaemon};

const FLEET: &str = r#"
[[board]]
id = "bench0"
backend = "emulator"
slices = [{ cluster = 0, cores = 4 }]
"#;

fn noop_task(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("dir");
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(&fleet, FLEET).expect("fleet");
    let (bus, handle, mut results) = runtime.block_on(async {
        let bus = ready_bus(BusConfig::new(nats.url())).await;
        let mut config = WorkerConfig::new(&fleet, "bench0");
        config.nats_urls = vec![nats.url()];
        config.topology = mtswarm_bus::TopologyConfig::small();
        config.kernel_root =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels");
        config.workspace_root = dir.path().join("ws");
        let handle = WorkerDaemon::start(config).await.expect("daemon");
        let mut grpc =
            v1::worker_client::WorkerClient::connect(format!("http://{}", handle.grpc_addr()))
                .await
                .expect("grpc");
        grpc.spawn_session(v1::SpawnSessionRequest {
            job_id: "bench".into(),
            agent_id: "agent".into(),
            session_id: "session".into(),
            ..Default::default()
        })
        .await
        .expect("spawn");
        let mut consumer = ResultConsumerConfig::new("bench");
        consumer.job_id = Some("bench".into());
        let results = bus
            .result_consumer(consumer)
            .await
            .expect("consumer")
            .messages()
            .await
            .expect("results");
        (bus, handle, results)
    });
    let slice = handle.slice_ids()[0].clone();
    let worker = handle.worker_id().to_owned();
    let mut counter = 0u64;
    c.bench_function("noop task publish -> result", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iterations {
                    counter += 1;
                    let task = v1::TaskAssignment {
                        task_id: format!("t{counter}"),
                        job_id: "bench".into(),
                        attempt: 1,
                        agent_id: "agent".into(),
                        session_id: "session".into(),
                        worker_id: worker.clone(),
                        slice_id: slice.clone(),
                        parameters_json: r#"{"noop":true}"#.into(),
                        ..Default::default()
                    };
                    bus.publish_task(&task).await.expect("publish");
                    let delivery = tokio::time::timeout(Duration::from_secs(30), results.next())
                        .await
                        .expect("result in time")
                        .expect("stream open")
                        .expect("result");
                    delivery.ack().await.expect("ack");
                }
                start.elapsed()
            })
        })
    });
    runtime.block_on(async { handle.shutdown().await.expect("shutdown") });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(10));
    targets = noop_task
}
criterion_main!(benches);
