//! Shared setup of the leader's integration tests: a real nats-server, a
//! kernel root in a temporary directory, a leader on 127.0.0.1:0, a gRPC
//! client and what tests ask of it, and readers of a job's events and
//! record. The fake worker daemon, the scripted models and the results a
//! worker publishes have a module each.

#![allow(dead_code)]

mod models;
mod results;
mod worker;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::testing::{NatsServer, ready_bus};
use mtswarm_bus::{Bus, BusConfig, Jobs, TopologyConfig, subjects, v1};
use mtswarm_core::ChatModel;
use mtswarm_leader::{LeaderConfig, LeaderDaemon, LeaderHandle};
use serde_json::Value;
use tonic::Status;

// Not every test binary uses every module.
#[allow(unused_imports)]
pub(crate) use models::*;
#[allow(unused_imports)]
pub(crate) use results::*;
#[allow(unused_imports)]
pub(crate) use worker::*;

/// Upper bound of every wait in these tests.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

pub(crate) type Control = v1::control_client::ControlClient<tonic::transport::Channel>;

/// Awaits `future` at most [`WAIT`], naming what was awaited on timeout.
pub(crate) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Re-checks `check` until it returns `Some`, at most [`WAIT`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(what, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    })
    .await
}

pub(crate) struct Env {
    pub nats: NatsServer,
    pub bus: Bus,
    pub kernel_root: tempfile::TempDir,
}

/// The tuning space of kernel `k1` (three values of `A`).
pub(crate) const TUNE_TOML: &str = include_str!("../fixtures/tune.toml");

impl Env {
    pub(crate) async fn start() -> Env {
        Self::start_with_sync(mtswarm_bus::local_server::SyncPolicy::default()).await
    }

    /// [`Env::start`] with a nats-server that fsyncs as `sync` says.
    pub(crate) async fn start_with_sync(sync: mtswarm_bus::local_server::SyncPolicy) -> Env {
        let options = mtswarm_bus::local_server::LocalServerOptions {
            sync,
            ..Default::default()
        };
        let nats = tokio::task::spawn_blocking(move || NatsServer::start_with(options))
            .await
            .expect("start task")
            .expect("nats-server starts");
        let bus = ready_bus(BusConfig::new(nats.url()).with_name("leader-test")).await;
        let kernel_root = tempfile::tempdir().expect("tempdir");
        let k1 = kernel_root.path().join("k1");
        std::fs::create_dir(&k1).expect("mkdir k1");
        std::fs::write(k1.join("tune.toml"), TUNE_TOML).expect("tune.toml");
        std::fs::write(
            k1.join("kernel.c"),
            "void kernel(void) { /* MARKER-42 */ }\n",
        )
        .expect("kernel.c");
        std::fs::write(k1.join("big.bin"), vec![b'x'; 300 * 1024]).expect("big.bin");
        Env {
            nats,
            bus,
            kernel_root,
        }
    }

    pub(crate) fn config(&self) -> LeaderConfig {
        let mut config = LeaderConfig::new(self.nats.url(), self.kernel_root.path());
        config.topology = TopologyConfig::small();
        config
    }

    /// [`Env::config`] with every job's leader loop on `model`.
    pub(crate) fn config_with_model(&self, model: Arc<dyn ChatModel>) -> LeaderConfig {
        self.config()
            .with_model_factory(Arc::new(move |_spec: &v1::JobSpec| Ok(model.clone())))
    }

    /// A leader whose every job runs on `model`.
    pub(crate) async fn leader(&self, model: Arc<dyn ChatModel>) -> LeaderHandle {
        start_leader(self.config_with_model(model)).await
    }

    pub(crate) fn kernel_dir(&self) -> PathBuf {
        self.kernel_root.path().join("k1")
    }
}

/// Starts a leader daemon on `config`.
pub(crate) async fn start_leader(config: LeaderConfig) -> LeaderHandle {
    LeaderDaemon::start(config).await.expect("leader starts")
}

pub(crate) async fn control(leader: &LeaderHandle) -> Control {
    let channel = tonic::transport::Endpoint::from_shared(leader.grpc_url())
        .expect("endpoint")
        .connect_timeout(WAIT)
        .connect()
        .await
        .expect("connect to the leader");
    v1::control_client::ControlClient::new(channel)
}

/// The task stream of `worker_id` (all its slices), as a worker reads it.
pub(crate) async fn task_stream(
    bus: &Bus,
    worker_id: &str,
) -> mtswarm_bus::DeliveryStream<v1::TaskAssignment> {
    bus.task_consumer(worker_id, mtswarm_bus::TaskConsumerConfig::default())
        .await
        .unwrap_or_else(|e| panic!("{worker_id} task consumer: {e}"))
        .messages()
        .await
        .unwrap_or_else(|e| panic!("{worker_id} tasks: {e}"))
}

/// The next task on `tasks` (it must come within [`WAIT`] and decode).
pub(crate) async fn next_task(
    tasks: &mut mtswarm_bus::DeliveryStream<v1::TaskAssignment>,
    what: &str,
) -> mtswarm_bus::Delivery<v1::TaskAssignment> {
    use futures::StreamExt as _;
    within(what, tasks.next())
        .await
        .expect("a task")
        .expect("a decodable task")
}

pub(crate) fn spec(goal: &str) -> v1::JobSpec {
    v1::JobSpec {
        goal: goal.to_string(),
        kernel_dir: "k1".to_string(),
        ..Default::default()
    }
}

/// What a Control client may be carried over: a plain channel, or one with
/// an interceptor (the tests with credentials).
pub(crate) use mtswarm_proto::GrpcTransport as Transport;

/// A Control client over any [`Transport`].
pub(crate) type Client<T> = v1::control_client::ControlClient<T>;

/// Submits `spec` without an idempotency key; the job id or the refusal.
pub(crate) async fn try_submit<T: Transport>(
    control: &mut Client<T>,
    spec: v1::JobSpec,
) -> Result<String, Status> {
    control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: String::new(),
        })
        .await
        .map(|response| response.into_inner().job_id)
}

/// Submits a job with [`spec`]`(goal)` and returns its id.
pub(crate) async fn submit<T: Transport>(control: &mut Client<T>, goal: &str) -> String {
    try_submit(control, spec(goal)).await.expect("submit")
}

/// The job's record as `GetJob` answers it, or the refusal.
pub(crate) async fn get_job<T: Transport>(
    control: &mut Client<T>,
    job_id: &str,
) -> Result<v1::JobRecord, Status> {
    control
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_string(),
        })
        .await
        .map(|response| {
            response
                .into_inner()
                .job
                .expect("GetJob answers with the job")
        })
}

/// Cancels the job; the state `CancelJob` answers with, or the refusal.
pub(crate) async fn cancel_job<T: Transport>(
    control: &mut Client<T>,
    job_id: &str,
    reason: &str,
) -> Result<v1::JobState, Status> {
    control
        .cancel_job(v1::CancelJobRequest {
            job_id: job_id.to_string(),
            reason: reason.to_string(),
        })
        .await
        .map(|response| response.into_inner().state())
}

/// Cancels the job (asserting it is CANCELLED) while `worker` holds a
/// SpawnSession at `gate`, then lets the spawn through; the spawns that
/// completed and the CancelSession that followed them.
pub(crate) async fn cancel_while_spawning(
    control: &mut Control,
    job_id: &str,
    gate: &tokio::sync::Semaphore,
    worker: &mut FakeWorker,
    what: &str,
) -> (Vec<v1::SpawnSessionRequest>, v1::CancelSessionRequest) {
    let cancelled = cancel_job(control, job_id, "test").await;
    assert_eq!(cancelled.expect("CancelJob"), v1::JobState::Cancelled);
    // The session starts only now, after the cancellation.
    gate.add_permits(1);
    worker.spawns_then_cancel(what).await
}

/// Decides `approval_id`; the decided record or the refusal.
pub(crate) async fn decide<T: Transport>(
    control: &mut Client<T>,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
    decided_by: &str,
) -> Result<v1::ApprovalRecord, Status> {
    control
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: approval_id.into(),
            verdict: verdict as i32,
            reason: reason.into(),
            decided_by: decided_by.into(),
            ..Default::default()
        })
        .await
        .map(|response| response.into_inner().approval.expect("the decided record"))
}

/// A job's event stream from sequence `from` (0 = from the start).
pub(crate) async fn watch(
    control: &mut Control,
    job_id: &str,
    from: u64,
) -> tonic::Streaming<v1::JobEvent> {
    control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_string(),
            from_sequence: from,
        })
        .await
        .expect("watch_job")
        .into_inner()
}

/// Reads a job's events until its stream ends (final state).
pub(crate) async fn watch_to_end(
    control: &mut Control,
    job_id: &str,
    from: u64,
) -> Vec<v1::JobEvent> {
    let mut stream = watch(control, job_id, from).await;
    let mut events = Vec::new();
    within("the end of the job's event stream", async {
        while let Some(event) = stream.message().await.expect("watch stream item") {
            events.push(event);
        }
    })
    .await;
    events
}

/// The job's state changes among `events`, in order.
pub(crate) fn states(events: &[v1::JobEvent]) -> Vec<v1::JobState> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::StateChange(c)) => Some(c.current()),
            _ => None,
        })
        .collect()
}

pub(crate) fn final_state(events: &[v1::JobEvent]) -> Option<v1::JobState> {
    states(events).last().copied()
}

/// The accepted task results among `events`, in order.
pub(crate) fn task_results(events: &[v1::JobEvent]) -> Vec<&v1::TaskResult> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::TaskResult(r)) => Some(r),
            _ => None,
        })
        .collect()
}

/// The agent events among `events`, in order.
pub(crate) fn agent_events(events: &[v1::JobEvent]) -> impl Iterator<Item = &v1::AgentEvent> {
    events.iter().filter_map(|e| match &e.event {
        Some(v1::job_event::Event::AgentEvent(a)) => Some(a),
        _ => None,
    })
}

/// The JSON payloads of the log events of type `kind` (e.g.
/// `task_reassigned`), in order.
pub(crate) fn logs_of_type(events: &[v1::JobEvent], kind: &str) -> Vec<Value> {
    agent_events(events)
        .filter(|a| a.kind() == v1::AgentEventKind::Log)
        .filter_map(|a| serde_json::from_str::<Value>(&a.payload_json).ok())
        .filter(|p| p["type"] == kind)
        .collect()
}

/// What the leader's `tool` calls answered (their JSON content), in order.
pub(crate) fn leader_tool_outputs(events: &[v1::JobEvent], tool: &str) -> Vec<Value> {
    agent_events(events)
        .filter(|a| a.agent_id == "leader")
        .filter_map(|a| {
            let payload: Value = serde_json::from_str(&a.payload_json).ok()?;
            (payload["type"] == "tool_result" && payload["name"] == tool)
                .then(|| serde_json::from_str::<Value>(payload["content"].as_str()?).ok())
                .flatten()
        })
        .collect()
}

/// The job's record as stored in the jobs KV, with its agents, tasks and
/// loop state read from their keys.
pub(crate) async fn job_record(bus: &Bus, job_id: &str) -> v1::JobRecord {
    Jobs::open(bus)
        .await
        .expect("jobs bucket")
        .assembled(job_id)
        .await
        .expect("read the job record")
        .expect("the job record exists")
}

/// The job's stored record (with its parts, as [`job_record`]) once
/// `ready` holds for it, at most [`WAIT`].
pub(crate) async fn record_when(
    bus: &Bus,
    job_id: &str,
    what: &str,
    ready: impl Fn(&v1::JobRecord) -> bool,
) -> v1::JobRecord {
    let jobs = Jobs::open(bus).await.expect("jobs bucket");
    let ready = &ready;
    eventually(what, || {
        let jobs = jobs.clone();
        async move {
            let record = jobs.assembled(job_id).await.ok()??;
            ready(&record).then_some(record)
        }
    })
    .await
}

/// How many tasks were ever stored in the tasks stream.
pub(crate) async fn tasks_published(bus: &Bus) -> u64 {
    let mut stream = bus
        .jetstream()
        .get_stream(subjects::TASKS_STREAM)
        .await
        .expect("tasks stream");
    stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence
}

/// A medium-risk `benchmark` approval request of agent `a1`'s session
/// `session_id`, denied by default after 600 s.
pub(crate) fn approval_request(
    job_id: &str,
    approval_id: &str,
    session_id: &str,
) -> v1::ApprovalRequest {
    v1::ApprovalRequest {
        approval_id: approval_id.into(),
        job_id: job_id.into(),
        agent_id: "a1".into(),
        session_id: session_id.into(),
        call_id: format!("call-{approval_id}"),
        tool_name: "benchmark".into(),
        arguments_json: r#"{"artifact":"b1"}"#.into(),
        risk: v1::RiskLevel::Medium as i32,
        reason: "medium risk".into(),
        timeout_seconds: 600,
        default_verdict: v1::ApprovalVerdict::Deny as i32,
        ..Default::default()
    }
}
