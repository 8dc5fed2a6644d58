//! Round-trip latency and throughput of the bus against one real nats-server
//! started by the benchmark (file-backed JetStream, as deployed):
//!
//! - `raw`: core NATS request/reply (the floor any NATS design pays);
//! - `bus`: the typed path of a leader's `assign_task` -> worker ->
//!   `collect_result`: `publish_task` (JetStream, waits for the stream ack),
//!   the worker's durable consumer receives and acks it and publishes a
//!   `TaskResult` (JetStream), the leader's result consumer receives it;
//! - `bus-pipelined`: the same, but the leader does not wait for the task's
//!   stream ack before waiting for the result (both are awaited together).
//!
//! Each is measured with 1, 16 and 256 operations in flight; p50/p99 latency
//! and throughput are printed side by side. Run:
//! `cargo bench -p mtswarm-bus --bench roundtrip` (`BENCH_SECONDS` sets the
//! measuring time per cell, default 3; `BENCH_STORAGE=memory` uses memory
//! instead of file storage for the streams).
//!
//! Besides latency and throughput, the CPU time of the nats-server process
//! and of the benchmark process (clients: leader and worker) per operation is
//! printed, which shows where the time of the bus path goes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::testing::bench::{
    ResultWaiters, echo_request, route_results, run_noop_worker, sample, start_echo_responder,
};
use mtswarm_bus::{Bus, BusConfig, ResultConsumerConfig, TopologyConfig, v1};
use tokio::sync::oneshot;

const IN_FLIGHT: [usize; 3] = [1, 16, 256];
const WORKER_ID: &str = "bench-worker";
const SLICE_ID: &str = "bench-slice";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Raw,
    Bus,
    BusPipelined,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Raw => "raw request/reply",
            Mode::Bus => "bus task->result",
            Mode::BusPipelined => "bus pipelined",
        }
    }
}

type Cell = mtswarm_bus::testing::bench::Cell<Mode>;

struct Harness {
    leader: Bus,
    waiters: ResultWaiters,
    next_task: std::sync::atomic::AtomicU64,
}

fn bench_task(task_id: String) -> v1::TaskAssignment {
    v1::TaskAssignment {
        task_id,
        job_id: "bench-job".into(),
        attempt: 1,
        agent_id: "bench-agent".into(),
        session_id: "bench-session".into(),
        worker_id: WORKER_ID.into(),
        slice_id: SLICE_ID.into(),
        instructions: "no-op".into(),
        parameters_json: "{}".into(),
        ..Default::default()
    }
}

async fn one_operation(harness: &Harness, mode: Mode) {
    match mode {
        Mode::Raw => echo_request(&harness.leader, "bench.echo").await,
        Mode::Bus | Mode::BusPipelined => {
            let n = harness
                .next_task
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let task_id = format!("t{n}");
            let (tx, rx) = oneshot::channel();
            harness
                .waiters
                .lock()
                .expect("waiters lock")
                .insert(task_id.clone(), tx);
            let task = bench_task(task_id);
            if mode == Mode::Bus {
                harness
                    .leader
                    .publish_task(&task)
                    .await
                    .expect("publish task");
                rx.await.expect("result arrives");
            } else {
                let pending = harness
                    .leader
                    .publish_task_pipelined(&task)
                    .await
                    .expect("send task");
                let (ack, result) = tokio::join!(pending.wait(), rx);
                ack.expect("task stored");
                result.expect("result arrives");
            }
        }
    }
}

async fn measure(
    harness: Arc<Harness>,
    mode: Mode,
    in_flight: usize,
    duration: Duration,
    server_pid: &str,
) -> Cell {
    let sampled = sample(
        in_flight,
        Duration::from_millis(300),
        duration,
        server_pid,
        move || {
            let harness = harness.clone();
            async move { one_operation(&harness, mode).await }
        },
    )
    .await;
    Cell::new(mode, in_flight, sampled)
}

fn main() {
    let seconds: f64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let duration = Duration::from_secs_f64(seconds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let storage = match std::env::var("BENCH_STORAGE").as_deref() {
        Ok("memory") => async_nats::jetstream::stream::StorageType::Memory,
        _ => async_nats::jetstream::stream::StorageType::File,
    };
    let server = NatsServer::start().expect("nats-server from PATH");
    let server_pid = server.pid().map(|pid| pid.to_string()).unwrap_or_default();
    let cells = runtime.block_on(async {
        let leader = Bus::connect(BusConfig::new(server.url()).with_name("bench-leader"))
            .await
            .expect("leader connects");
        let worker = Bus::connect(BusConfig::new(server.url()).with_name("bench-worker"))
            .await
            .expect("worker connects");
        leader.wait_connected(Duration::from_secs(10)).await.expect("leader up");
        worker.wait_connected(Duration::from_secs(10)).await.expect("worker up");
        leader
            .ensure_topology(&TopologyConfig {
                storage,
                ..TopologyConfig::default()
            })
            .await
            .expect("topology");

        start_echo_responder(&worker, &leader, "bench.echo").await;

        let waiters: ResultWaiters = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(async move { run_noop_worker(worker, WORKER_ID, SLICE_ID).await });
        tokio::spawn(route_results(
            leader.clone(),
            ResultConsumerConfig::new("bench-leader"),
            waiters.clone(),
        ));
        let harness = Arc::new(Harness {
            leader,
            waiters,
            next_task: std::sync::atomic::AtomicU64::new(0),
        });

        let mut cells = Vec::new();
        for in_flight in IN_FLIGHT {
            for mode in [Mode::Raw, Mode::Bus, Mode::BusPipelined] {
                let cell = measure(harness.clone(), mode, in_flight, duration, &server_pid).await;
                eprintln!(
                    "{:<20} in-flight {:>3}: p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} ops/s  cpu/op server {:>5.1} us client {:>5.1} us",
                    cell.mode.label(),
                    cell.in_flight,
                    cell.p50.as_secs_f64() * 1e6,
                    cell.p99.as_secs_f64() * 1e6,
                    cell.per_second,
                    cell.server_cpu_per_op.as_secs_f64() * 1e6,
                    cell.client_cpu_per_op.as_secs_f64() * 1e6,
                );
                cells.push(cell);
            }
        }
        cells
    });

    println!();
    println!(
        "| in flight | raw p50 (us) | raw p99 (us) | raw ops/s | bus p50 (us) | bus p99 (us) | bus tasks/s | pipelined p50 (us) | pipelined p99 (us) | pipelined tasks/s | bus p50 / raw p50 | server CPU/op raw (us) | server CPU/op bus (us) | client CPU/op raw (us) | client CPU/op bus (us) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for in_flight in IN_FLIGHT {
        let find = |mode| {
            cells
                .iter()
                .find(|c| c.mode == mode && c.in_flight == in_flight)
                .expect("cell measured")
        };
        let (raw, bus, piped) = (find(Mode::Raw), find(Mode::Bus), find(Mode::BusPipelined));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "| {in_flight} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
            us(raw.p50),
            us(raw.p99),
            raw.per_second,
            us(bus.p50),
            us(bus.p99),
            bus.per_second,
            us(piped.p50),
            us(piped.p99),
            piped.per_second,
            us(bus.p50) / us(raw.p50).max(f64::EPSILON),
            us(raw.server_cpu_per_op),
            us(bus.server_cpu_per_op),
            us(raw.client_cpu_per_op),
            us(bus.client_cpu_per_op),
        );
    }
    let total: usize = cells.iter().map(|c| c.operations).sum();
    println!(
        "\n{total} operations measured, {seconds} s per cell, {storage:?} storage, {} CPUs.",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    drop(server);
}
