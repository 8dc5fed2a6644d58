//! Task results as a worker produces them: the measurement records the
//! job's outcome is computed from, results published after them, and a
//! task loop that answers every task of a fake worker.

use mtswarm_bus::{Bus, v1};
use serde_json::json;
use tokio::sync::mpsc;

use super::task_stream;

/// A result of `task`'s `attempt` with the task's job, agent, session,
/// worker and slice; OK, and nothing else set.
pub(crate) fn result_of(task: &v1::TaskAssignment, attempt: u32) -> v1::TaskResult {
    v1::TaskResult {
        task_id: task.task_id.clone(),
        attempt,
        job_id: task.job_id.clone(),
        agent_id: task.agent_id.clone(),
        session_id: task.session_id.clone(),
        worker_id: task.worker_id.clone(),
        slice_id: task.slice_id.clone(),
        status: v1::TaskStatus::Ok as i32,
        ..Default::default()
    }
}

/// An OK result of `task`'s `attempt` (summary `attempt N`) whose best
/// configuration, `A=1`, made `gflops`.
pub(crate) fn ok_result(task: &v1::TaskAssignment, attempt: u32, gflops: f64) -> v1::TaskResult {
    v1::TaskResult {
        summary: format!("attempt {attempt}"),
        result_json: json!({"best": {"defines": {"A": "1"}, "gflops": gflops}}).to_string(),
        ..result_of(task, attempt)
    }
}

/// Publishes `result` once more under the message id `msg_id`, so the
/// results stream keeps the copy and only the leader's own deduplication
/// can drop it; the copy's stream sequence.
pub(crate) async fn publish_copy(bus: &Bus, result: &v1::TaskResult, msg_id: &str) -> u64 {
    use prost::Message as _;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "Content-Type",
        "application/x-protobuf; proto=mtswarm.v1.TaskResult",
    );
    headers.insert("Nats-Msg-Id", msg_id);
    bus.jetstream()
        .publish_with_headers(
            mtswarm_bus::subjects::result(&result.job_id).expect("subject"),
            headers,
            result.encode_to_vec().into(),
        )
        .await
        .expect("publish the copy")
        .await
        .expect("the copy is stored")
        .sequence
}

/// Stores the measurement record a worker writes for a benchmarked
/// candidate (the job's outcome is computed from these).
pub(crate) async fn record_measurement(
    bus: &Bus,
    task: &v1::TaskAssignment,
    defines: &serde_json::Value,
    gflops: f64,
) {
    use mtswarm_bus::results::{CandidateStatus, ResultRecord, ResultStats, ResultsStore};
    let params = defines
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let record = ResultRecord {
        record_id: format!("{}.{}.{}.bench", task.job_id, task.task_id, task.attempt),
        job_id: task.job_id.clone(),
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        agent_id: task.agent_id.clone(),
        session_id: task.session_id.clone(),
        worker_id: task.worker_id.clone(),
        slice_id: task.slice_id.clone(),
        backend: "emulator".into(),
        kernel: "k".into(),
        kernel_hash: "feedface".into(),
        params,
        cores: 8,
        samples: vec![0.01; 3],
        stats: Some(ResultStats {
            count: 3,
            median: 0.01,
            trimmed_mean: 0.01,
            min: 0.01,
            max: 0.01,
            stddev: 0.0,
        }),
        gflops: Some(gflops),
        peak_fraction: Some(0.125),
        valid: true,
        status: CandidateStatus::Benchmarked,
        ..ResultRecord::default()
    };
    let store = ResultsStore::open(bus).await.expect("results store");
    store.record(&record).await.expect("store the measurement");
}

/// Publishes a task result the way a worker does: an OK, unfenced result
/// is preceded by the measurement record of its best candidate (from its
/// `result_json`, 1 GFLOP/s when it names none).
pub(crate) async fn publish_measured(
    bus: &Bus,
    result: &v1::TaskResult,
) -> Result<(), mtswarm_bus::BusError> {
    if result.status() == v1::TaskStatus::Ok && !result.fenced {
        let body: serde_json::Value = serde_json::from_str(&result.result_json).unwrap_or_default();
        let task = v1::TaskAssignment {
            task_id: result.task_id.clone(),
            job_id: result.job_id.clone(),
            attempt: result.attempt,
            agent_id: result.agent_id.clone(),
            session_id: result.session_id.clone(),
            worker_id: result.worker_id.clone(),
            slice_id: result.slice_id.clone(),
            ..Default::default()
        };
        let gflops = body["best"]["gflops"].as_f64().unwrap_or(1.0);
        record_measurement(bus, &task, &body["best"]["defines"], gflops).await;
    }
    bus.publish_result(result).await.map(|_| ())
}

/// Answers every task of `worker_id` with an OK result whose best GFLOP/s is
/// `gflops_of(task)`, until the returned task is aborted. Each task's
/// headers are sent on the channel.
pub(crate) fn answer_tasks(
    bus: &Bus,
    worker_id: &str,
    gflops_of: fn(&v1::TaskAssignment) -> f64,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<(v1::TaskAssignment, async_nats::HeaderMap)>,
) {
    answer_tasks_with(bus, worker_id, gflops_of, |_| v1::TaskStatus::Ok)
}

/// [`answer_tasks`] with the result status chosen per task (a FAILED result
/// carries no best configuration).
pub(crate) fn answer_tasks_with(
    bus: &Bus,
    worker_id: &str,
    gflops_of: fn(&v1::TaskAssignment) -> f64,
    status_of: fn(&v1::TaskAssignment) -> v1::TaskStatus,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<(v1::TaskAssignment, async_nats::HeaderMap)>,
) {
    use futures::StreamExt as _;
    let bus = bus.clone();
    let worker_id = worker_id.to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut tasks = task_stream(&bus, &worker_id).await;
        while let Some(Ok(delivery)) = tasks.next().await {
            let task = delivery.message().clone();
            let parameters: serde_json::Value =
                serde_json::from_str(&task.parameters_json).unwrap_or_default();
            let best = parameters["candidates"][0].clone();
            let status = status_of(&task);
            let result_json = if status == v1::TaskStatus::Ok {
                json!({
                    "best": {"defines": best, "gflops": gflops_of(&task), "peak_percent": 12.5},
                    "candidates": parameters["candidates"],
                })
                .to_string()
            } else {
                String::new()
            };
            let result = v1::TaskResult {
                status: status as i32,
                summary: "benchmarked".into(),
                error: if status == v1::TaskStatus::Ok {
                    String::new()
                } else {
                    "every candidate crashed".into()
                },
                result_json,
                ..result_of(&task, task.attempt)
            };
            if status == v1::TaskStatus::Ok {
                record_measurement(&bus, &task, &best, gflops_of(&task)).await;
            }
            bus.publish_result(&result).await.expect("publish result");
            delivery.ack().await.expect("ack");
            let _ = tx.send((task, delivery.headers().clone()));
        }
    });
    (task, rx)
}
