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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, ResultConsumerConfig, TaskConsumerConfig, TopologyConfig, v1};
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

struct Cell {
    mode: Mode,
    in_flight: usize,
    operations: usize,
    p50: Duration,
    p99: Duration,
    per_second: f64,
    server_cpu_per_op: Duration,
    client_cpu_per_op: Duration,
}

/// User + system CPU time of a process, from /proc (Linux); zero elsewhere.
fn cpu_time(pid: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let Some(after_name) = stat.rsplit(')').next() else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Result waiters of the leader side, keyed by task id.
type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

struct Harness {
    leader: Bus,
    waiters: Waiters,
    next_task: std::sync::atomic::AtomicU64,
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
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

/// Worker side: consume tasks, ack them, publish a result per task.
async fn run_worker(worker: Bus) {
    let consumer = worker
        .task_consumer(
            WORKER_ID,
            TaskConsumerConfig {
                slice_id: Some(SLICE_ID.into()),
                max_ack_pending: 20_000,
                batch: 512,
                ..Default::default()
            },
        )
        .await
        .expect("task consumer");
    let mut tasks = consumer.messages().await.expect("task stream");
    // Result acks are awaited off the hot loop, in order, with a bounded queue.
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::channel::<mtswarm_bus::PendingPublish>(20_000);
    tokio::spawn(async move {
        while let Some(pending) = ack_rx.recv().await {
            if let Err(error) = pending.wait().await {
                eprintln!("result publish not acknowledged: {error}");
            }
        }
    });
    while let Some(delivery) = tasks.next().await {
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(error) => {
                eprintln!("worker consumer: {error}");
                continue;
            }
        };
        if let Err(error) = delivery.ack().await {
            eprintln!("ack failed: {error}");
        }
        let task = delivery.message();
        let result = v1::TaskResult {
            task_id: task.task_id.clone(),
            attempt: task.attempt,
            job_id: task.job_id.clone(),
            agent_id: task.agent_id.clone(),
            slice_id: task.slice_id.clone(),
            status: v1::TaskStatus::Ok as i32,
            summary: "ok".into(),
            ..Default::default()
        };
        match worker.publish_result_pipelined(&result).await {
            Ok(pending) => {
                if ack_tx.send(pending).await.is_err() {
                    return;
                }
            }
            Err(error) => eprintln!("publish result: {error}"),
        }
    }
}

/// Leader side: route each result to the waiter of its task.
async fn run_result_router(leader: Bus, waiters: Waiters) {
    let consumer = leader
        .result_consumer(ResultConsumerConfig {
            max_ack_pending: 20_000,
            batch: 512,
            ..ResultConsumerConfig::new("bench-leader")
        })
        .await
        .expect("result consumer");
    let mut results = consumer.messages().await.expect("result stream");
    while let Some(delivery) = results.next().await {
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(error) => {
                eprintln!("result consumer: {error}");
                continue;
            }
        };
        let waiter = waiters
            .lock()
            .expect("waiters lock")
            .remove(&delivery.message().task_id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(());
        }
        if let Err(error) = delivery.ack().await {
            eprintln!("result ack: {error}");
        }
    }
}

async fn one_operation(harness: &Harness, mode: Mode) {
    match mode {
        Mode::Raw => {
            harness
                .leader
                .client()
                .request("bench.echo", Bytes::from_static(b"ping"))
                .await
                .expect("request/reply");
        }
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
    // Warm-up: connections, consumers and allocations settle.
    let warm_until = Instant::now() + Duration::from_millis(300);
    let mut warmers = Vec::new();
    for _ in 0..in_flight {
        let harness = harness.clone();
        warmers.push(tokio::spawn(async move {
            while Instant::now() < warm_until {
                one_operation(&harness, mode).await;
            }
        }));
    }
    for warmer in warmers {
        warmer.await.expect("warm-up");
    }

    let server_cpu_before = cpu_time(server_pid);
    let client_cpu_before = cpu_time("self");
    let start = Instant::now();
    let stop_at = start + duration;
    let mut workers = Vec::new();
    for _ in 0..in_flight {
        let harness = harness.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(4096);
            while Instant::now() < stop_at {
                let t0 = Instant::now();
                one_operation(&harness, mode).await;
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.expect("measuring task"));
    }
    let elapsed = start.elapsed();
    let operations = latencies.len().max(1) as u32;
    let server_cpu_per_op = cpu_time(server_pid).saturating_sub(server_cpu_before) / operations;
    let client_cpu_per_op = cpu_time("self").saturating_sub(client_cpu_before) / operations;
    latencies.sort_unstable();
    Cell {
        server_cpu_per_op,
        client_cpu_per_op,
        mode,
        in_flight,
        operations: latencies.len(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
    }
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

        // Raw responder.
        let mut echo = worker.client().subscribe("bench.echo").await.expect("subscribe");
        let responder = worker.client().clone();
        tokio::spawn(async move {
            while let Some(message) = echo.next().await {
                if let Some(reply) = message.reply {
                    let _ = responder.publish(reply, message.payload).await;
                }
            }
        });
        worker.flush().await.expect("flush");
        // The subscription is registered once a request from the other
        // connection finds a responder.
        let ready_by = Instant::now() + Duration::from_secs(10);
        while leader
            .client()
            .request("bench.echo", Bytes::from_static(b"ready?"))
            .await
            .is_err()
        {
            assert!(Instant::now() < ready_by, "echo responder never became reachable");
            tokio::task::yield_now().await;
        }

        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(run_worker(worker.clone()));
        tokio::spawn(run_result_router(leader.clone(), waiters.clone()));
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
