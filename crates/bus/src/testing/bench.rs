//! Pieces shared by the round-trip benchmarks (`crates/bus/benches` and
//! `tests/benches`): a bare task consumer that answers every task at once
//! (the transport floor), a result router that wakes the waiter of each
//! task, and a sampler that keeps N operations in flight for a while and
//! reports latencies and CPU per operation. They live here, next to the
//! test server, so every bench measures the floor the same way.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio::sync::oneshot;

use crate::connection::Bus;

use crate::messaging::PendingPublish;

use crate::messaging::ResultConsumerConfig;

use crate::messaging::TaskConsumerConfig;

use mtswarm_proto::v1;

/// Result waiters of a bench's leader side, keyed by task id.
pub type ResultWaiters = Arc<Mutex<HashMap<String, oneshot::Sender<v1::TaskStatus>>>>;

/// User + system CPU time of a process (`"self"` or a pid), from /proc
/// (Linux); zero elsewhere.
pub fn cpu_time(pid: &str) -> Duration {
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

/// The `fraction` percentile of sorted latencies (zero when empty).
pub fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The next delivery of `stream`, reporting and skipping the errors it
/// yields (`what` names the stream); `None` when the stream ends.
async fn next_logged<T, E: std::fmt::Display>(
    stream: &mut (impl futures::Stream<Item = Result<T, E>> + Unpin),
    what: &str,
) -> Option<T> {
    loop {
        match stream.next().await? {
            Ok(delivery) => return Some(delivery),
            Err(error) => eprintln!("{what}: {error}"),
        }
    }
}

/// A bare worker: consumes the tasks of `worker_id`/`slice_id`, acks each
/// and publishes an OK result for it. Result stream acks are awaited off the
/// hot loop, in order, through a bounded queue. Runs until the stream ends.
pub async fn run_noop_worker(worker: Bus, worker_id: &str, slice_id: &str) {
    let consumer = worker
        .task_consumer(
            worker_id,
            TaskConsumerConfig {
                slice_id: Some(slice_id.into()),
                max_ack_pending: 20_000,
                batch: 512,
                ..Default::default()
            },
        )
        .await
        .expect("task consumer");
    let mut tasks = consumer.messages().await.expect("task stream");
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::channel::<PendingPublish>(20_000);
    tokio::spawn(async move {
        while let Some(pending) = ack_rx.recv().await {
            if let Err(error) = pending.wait().await {
                eprintln!("result publish not acknowledged: {error}");
            }
        }
    });
    while let Some(delivery) = next_logged(&mut tasks, "task consumer").await {
        if let Err(error) = delivery.ack().await {
            eprintln!("task ack: {error}");
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

/// The leader side: consumes results with `config` and hands each result's
/// status to the waiter of its task. Runs until the stream ends.
pub async fn route_results(leader: Bus, config: ResultConsumerConfig, waiters: ResultWaiters) {
    let consumer = leader
        .result_consumer(ResultConsumerConfig {
            max_ack_pending: 20_000,
            batch: 512,
            ..config
        })
        .await
        .expect("result consumer");
    let mut results = consumer.messages().await.expect("result stream");
    while let Some(delivery) = next_logged(&mut results, "result consumer").await {
        let result = delivery.message();
        let waiter = waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&result.task_id);
        if let Some(waiter) = waiter {
            if result.status() != v1::TaskStatus::Ok {
                eprintln!("task {} failed: {}", result.task_id, result.error);
            }
            let _ = waiter.send(result.status());
        }
        if let Err(error) = delivery.ack().await {
            eprintln!("result ack: {error}");
        }
    }
}

/// Answers core NATS requests on `subject` from `responder`'s connection
/// with their own payload (the raw request/reply floor), and returns once a
/// request from `requester`'s connection gets through.
pub async fn start_echo_responder(responder: &Bus, requester: &Bus, subject: &str) {
    let mut echo = responder
        .client()
        .subscribe(subject.to_string())
        .await
        .expect("subscribe the echo subject");
    let client = responder.client().clone();
    tokio::spawn(async move {
        while let Some(message) = echo.next().await {
            if let Some(reply) = message.reply {
                let _ = client.publish(reply, message.payload).await;
            }
        }
    });
    responder.flush().await.expect("flush");
    // The subscription is registered once a request from the other
    // connection finds a responder.
    let ready_by = Instant::now() + Duration::from_secs(10);
    while requester
        .client()
        .request(subject.to_string(), bytes::Bytes::from_static(b"ready?"))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < ready_by,
            "echo responder never became reachable"
        );
        tokio::task::yield_now().await;
    }
}

/// One core NATS request/reply on `subject` (answered by
/// [`start_echo_responder`]): the raw round trip every bench compares with.
pub async fn echo_request(requester: &Bus, subject: &str) {
    requester
        .client()
        .request(subject.to_string(), bytes::Bytes::from_static(b"ping"))
        .await
        .expect("request/reply");
}

/// One row of a bench table: what [`sample`] measured for `mode` with
/// `in_flight` operations at a time. The figures read through to the
/// measurement (`cell.p50`).
#[derive(Debug, Clone)]
pub struct Cell<M> {
    /// What was measured (the bench's own mode type).
    pub mode: M,
    /// Operations kept running at a time.
    pub in_flight: usize,
    /// The figures.
    pub sampled: Sampled,
}

impl<M> Cell<M> {
    /// The row of `mode` at `in_flight` from its measurement.
    pub fn new(mode: M, in_flight: usize, sampled: Sampled) -> Self {
        Self {
            mode,
            in_flight,
            sampled,
        }
    }
}

impl<M> std::ops::Deref for Cell<M> {
    type Target = Sampled;

    fn deref(&self) -> &Sampled {
        &self.sampled
    }
}

/// What [`sample`] measured.
#[derive(Debug, Clone)]
pub struct Sampled {
    /// Operations completed in the measured window (warm-up excluded).
    pub operations: usize,
    /// Median latency of one operation.
    pub p50: Duration,
    /// 99th-percentile latency of one operation.
    pub p99: Duration,
    /// Completed operations per second of wall time.
    pub per_second: f64,
    /// nats-server CPU time (user + system) per operation.
    pub server_cpu_per_op: Duration,
    /// This process's CPU time (user + system) per operation.
    pub client_cpu_per_op: Duration,
}

/// Keeps `in_flight` copies of `operation` running back to back: first for
/// `warm_up` (connections, consumers and allocations settle), then for
/// `duration`, measuring each operation's latency and the CPU time of the
/// server process `server_pid` and of this process per operation.
pub async fn sample<F, Fut>(
    in_flight: usize,
    warm_up: Duration,
    duration: Duration,
    server_pid: &str,
    operation: F,
) -> Sampled
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let warm_until = Instant::now() + warm_up;
    let mut warmers = Vec::new();
    for _ in 0..in_flight {
        let operation = operation.clone();
        warmers.push(tokio::spawn(async move {
            while Instant::now() < warm_until {
                operation().await;
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
    let mut runners = Vec::new();
    for _ in 0..in_flight {
        let operation = operation.clone();
        runners.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(4096);
            while Instant::now() < stop_at {
                let t0 = Instant::now();
                operation().await;
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for runner in runners {
        latencies.extend(runner.await.expect("measuring task"));
    }
    let elapsed = start.elapsed();
    let operations = u32::try_from(latencies.len().max(1)).unwrap_or(u32::MAX);
    let server_cpu_per_op = cpu_time(server_pid).saturating_sub(server_cpu_before) / operations;
    let client_cpu_per_op = cpu_time("self").saturating_sub(client_cpu_before) / operations;
    latencies.sort_unstable();
    Sampled {
        operations: latencies.len(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        server_cpu_per_op,
        client_cpu_per_op,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&sorted, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
