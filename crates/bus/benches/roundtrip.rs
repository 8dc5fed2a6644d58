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
//! instead of file storage for the streams; `BENCH_NATS_SYNC=default` runs
//! the server with nats-server's own 2-minute fsync instead of
//! `sync_interval: always`, to show what syncing every write costs).
//!
//! Besides latency and throughput, the CPU time of the nats-server process
//! and of the benchmark process (clients: leader and worker) per operation is
//! printed, which shows where the time of the bus path goes.
//!
//! The raw responder, the bare task consumer and the leader side live in
//! `floor/`, which `tests/benches/assign_roundtrip.rs` shares.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod floor;

use std::sync::Arc;
use std::time::Duration;

use floor::{FLOOR_SLICE, FLOOR_WORKER, IN_FLIGHT, JOB_ID, Leader, env_number, find, measure, us};
use mtswarm_bus::local_server::{LocalServerOptions, SyncPolicy};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{TopologyConfig, v1};

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

fn bench_task(task_id: String) -> v1::TaskAssignment {
    v1::TaskAssignment {
        task_id,
        job_id: JOB_ID.into(),
        attempt: 1,
        agent_id: "bench-agent".into(),
        session_id: "bench-session".into(),
        worker_id: FLOOR_WORKER.into(),
        slice_id: FLOOR_SLICE.into(),
        instructions: "no-op".into(),
        parameters_json: "{}".into(),
        ..Default::default()
    }
}

async fn one_operation(leader: &Leader, mode: Mode) {
    match mode {
        Mode::Raw => leader.raw().await,
        Mode::Bus | Mode::BusPipelined => {
            let task = bench_task(format!("t{}", leader.next_task()));
            let status = leader.round_trip(&task, mode == Mode::BusPipelined).await;
            assert_eq!(status, v1::TaskStatus::Ok, "no-op task failed");
        }
    }
}

fn main() {
    let seconds: f64 = env_number("BENCH_SECONDS", 3.0);
    let duration = Duration::from_secs_f64(seconds);
    let runtime = floor::runtime();
    let storage = match std::env::var("BENCH_STORAGE").as_deref() {
        Ok("memory") => async_nats::jetstream::stream::StorageType::Memory,
        _ => async_nats::jetstream::stream::StorageType::File,
    };
    let sync = match std::env::var("BENCH_NATS_SYNC").as_deref() {
        Ok("default") => SyncPolicy::ServerDefault,
        _ => SyncPolicy::Always,
    };
    println!("nats-server sync: {sync:?}");
    let server = NatsServer::start_with(LocalServerOptions {
        sync,
        ..LocalServerOptions::default()
    })
    .expect("nats-server from PATH");
    let server_pid = server.pid().map(|pid| pid.to_string()).unwrap_or_default();
    let cells = runtime.block_on(async {
        let topology = TopologyConfig {
            storage,
            ..TopologyConfig::small()
        };
        let leader = Arc::new(floor::start_floor(&server.url(), &topology, "bench-leader").await);

        let mut cells = Vec::new();
        for in_flight in IN_FLIGHT {
            for mode in [Mode::Raw, Mode::Bus, Mode::BusPipelined] {
                let leader = leader.clone();
                let operation = move || {
                    let leader = leader.clone();
                    async move { one_operation(&leader, mode).await }
                };
                let warm_up = Duration::from_millis(300);
                let cell = measure(mode, in_flight, warm_up, duration, &server_pid, operation).await;
                eprintln!(
                    "{:<20} in-flight {:>3}: p50 {:>8.1} us  p99 {:>8.1} us  {:>9.0} ops/s  cpu/op server {:>5.1} us client {:>5.1} us",
                    cell.mode.label(),
                    cell.in_flight,
                    us(cell.p50),
                    us(cell.p99),
                    cell.per_second,
                    us(cell.server_cpu_per_op),
                    us(cell.client_cpu_per_op),
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
        let cell = |mode| find(&cells, mode, in_flight).expect("cell measured");
        let (raw, bus, piped) = (cell(Mode::Raw), cell(Mode::Bus), cell(Mode::BusPipelined));
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
