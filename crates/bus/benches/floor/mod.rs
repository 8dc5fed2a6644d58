//! The transport floor every round-trip bench compares with, in one place:
//! a leader-side connection that publishes tasks and routes their results
//! back to the waiting operation, and a second connection that answers raw
//! core NATS requests (the request/reply floor) and tasks for
//! [`FLOOR_WORKER`] / [`FLOOR_SLICE`] (a bare durable JetStream consumer
//! that acks each task and publishes its result at once: the least any
//! JetStream task design pays). Also the sampling and table helpers both
//! benches print with.
//!
//! This bench (`roundtrip.rs`) is its home; `tests/benches/assign_roundtrip.rs`
//! includes this file, so its `raw` and `floor` figures are measured exactly
//! as these are.

use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mtswarm_bus::testing::bench::{
    ResultWaiters, echo_request, route_results, run_noop_worker, sample, start_echo_responder,
};
use mtswarm_bus::{Bus, BusConfig, ResultConsumerConfig, TopologyConfig, v1};
use tokio::sync::oneshot;

/// Operations kept in flight, one table row each.
pub(crate) const IN_FLIGHT: [usize; 3] = [1, 16, 256];
/// The job of every bench task (the leader side consumes only its results).
pub(crate) const JOB_ID: &str = "bench-job";
/// The worker id and slice the bare task consumer answers for.
pub(crate) const FLOOR_WORKER: &str = "bench-floor";
/// See [`FLOOR_WORKER`].
pub(crate) const FLOOR_SLICE: &str = "floor";
/// The subject of the raw request/reply round trip.
const ECHO_SUBJECT: &str = "bench.echo";

/// One row of a bench table (see `mtswarm_bus::testing::bench::Cell`).
pub(crate) type Cell<M> = mtswarm_bus::testing::bench::Cell<M>;

/// The number in the environment variable `name`, or `default` when it is
/// unset or not a number (e.g. `BENCH_SECONDS`).
pub(crate) fn env_number<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The multi-threaded runtime a bench runs on.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A leader side: its connection, the waiters of its tasks' results (fed
/// by a durable result consumer on [`JOB_ID`]'s results) and a task counter.
pub(crate) struct Leader {
    /// The leader's connection.
    bus: Bus,
    waiters: ResultWaiters,
    next_task: AtomicU64,
}

impl Leader {
    /// The leader side on `bus`, its results consumed by the durable
    /// consumer `durable`.
    pub(crate) fn new(bus: Bus, durable: &str) -> Leader {
        let waiters: ResultWaiters = Arc::new(Mutex::new(Default::default()));
        tokio::spawn(route_results(
            bus.clone(),
            ResultConsumerConfig {
                job_id: Some(JOB_ID.into()),
                ..ResultConsumerConfig::new(durable)
            },
            waiters.clone(),
        ));
        Leader {
            bus,
            waiters,
            next_task: AtomicU64::new(0),
        }
    }

    /// The leader side's connection.
    #[allow(dead_code)] // used by the assign bench, not by the bus's own
    pub(crate) fn bus(&self) -> &Bus {
        &self.bus
    }

    /// A number no other task of this leader side has had.
    pub(crate) fn next_task(&self) -> u64 {
        self.next_task.fetch_add(1, Ordering::Relaxed)
    }

    /// One raw core NATS request/reply (the floor of any NATS design).
    pub(crate) async fn raw(&self) {
        echo_request(&self.bus, ECHO_SUBJECT).await;
    }

    /// One task round trip: publishes `task` (waiting for its stream ack
    /// before waiting for the result, or, `pipelined`, for both at once)
    /// and returns the status of its result.
    pub(crate) async fn round_trip(
        &self,
        task: &v1::TaskAssignment,
        pipelined: bool,
    ) -> v1::TaskStatus {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .expect("waiters lock")
            .insert(task.task_id.clone(), tx);
        if pipelined {
            let pending = self
                .bus
                .publish_task_pipelined(task)
                .await
                .expect("send task");
            let (ack, result) = tokio::join!(pending.wait(), rx);
            ack.expect("task stored");
            result.expect("result arrives")
        } else {
            self.bus.publish_task(task).await.expect("publish task");
            rx.await.expect("result arrives")
        }
    }
}

/// Connects the leader side and the floor's responder to the nats-server
/// at `url`, ensures `topology`, starts the echo responder and the bare
/// task consumer, and returns the leader side (results consumed by the
/// durable consumer `durable`).
pub(crate) async fn start_floor(url: &str, topology: &TopologyConfig, durable: &str) -> Leader {
    let leader = Bus::connect(BusConfig::new(url).with_name("bench-leader"))
        .await
        .expect("leader connects");
    let responder = Bus::connect(BusConfig::new(url).with_name("bench-floor"))
        .await
        .expect("floor responder connects");
    for bus in [&leader, &responder] {
        bus.wait_connected(Duration::from_secs(10))
            .await
            .expect("connected");
    }
    leader.ensure_topology(topology).await.expect("topology");
    // Raw responder on its own connection, like a worker would be.
    start_echo_responder(&responder, &leader, ECHO_SUBJECT).await;
    tokio::spawn(async move { run_noop_worker(responder, FLOOR_WORKER, FLOOR_SLICE).await });
    Leader::new(leader, durable)
}

/// Measures `operation` for `mode` with `in_flight` copies at a time (after
/// `warm_up`) for `duration`, with the CPU time of the server `server_pid`.
pub(crate) async fn measure<M, F, Fut>(
    mode: M,
    in_flight: usize,
    warm_up: Duration,
    duration: Duration,
    server_pid: &str,
    operation: F,
) -> Cell<M>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let sampled = sample(in_flight, warm_up, duration, server_pid, operation).await;
    Cell::new(mode, in_flight, sampled)
}

/// The cell of `mode` at `in_flight`, when it was measured.
pub(crate) fn find<M: PartialEq>(cells: &[Cell<M>], mode: M, in_flight: usize) -> Option<&Cell<M>> {
    cells
        .iter()
        .find(|c| c.mode == mode && c.in_flight == in_flight)
}

/// Microseconds of `d`, for tables.
pub(crate) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
