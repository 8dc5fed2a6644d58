//! Shared pieces of the worker daemon tests: a real nats-server, a fleet
//! file with emulator boards, a daemon config with short timeouts, gRPC
//! clients, sessions and their tasks, approval decisions, stored records
//! and bounded waits on bus streams.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use futures::{Stream, StreamExt};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, BusMessage, ResultConsumerConfig, TypedKv, v1};
use mtswarm_hw::measure::MeasureConfig;
use mtswarm_worker::{WorkerConfig, WorkerDaemon, WorkerHandle};
use serde_json::Value;
use tonic::transport::Channel;
use v1::worker_client::WorkerClient;

/// Longest any single wait in these tests may take.
pub(crate) const WAIT: Duration = Duration::from_secs(120);

pub(crate) struct Env {
    pub nats: NatsServer,
    pub bus: Bus,
    pub dir: tempfile::TempDir,
    pub fleet: PathBuf,
}

pub(crate) fn kernel_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
}

/// A fleet of emulator boards `emu0`, `emu1`, each with two 4-core cluster slices.
const FLEET: &str = r#"
[[board]]
id = "emu0"
backend = "emulator"
slices = [{ cluster = 0, cores = 4 }, { cluster = 1, cores = 4 }]

[[board]]
id = "emu1"
backend = "emulator"
slices = [{ cluster = 0, cores = 4 }, { cluster = 1, cores = 4 }]
"#;

/// Logs to stderr when `MTSWARM_TEST_LOG` holds a filter (e.g. `info`).
pub(crate) fn init_logs() {
    if let Ok(filter) = std::env::var("MTSWARM_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}

impl Env {
    pub(crate) async fn start() -> Env {
        Self::start_with_fleet(FLEET).await
    }

    /// An environment whose fleet file is `fleet` (TOML).
    pub(crate) async fn start_with_fleet(fleet_toml: &str) -> Env {
        init_logs();
        let nats = NatsServer::start().expect("nats-server");
        let bus = Bus::connect(BusConfig::new(nats.url()).with_name("test"))
            .await
            .expect("connect");
        bus.wait_connected(WAIT).await.expect("connected");
        bus.ensure_topology(&mtswarm_bus::TopologyConfig::small())
            .await
            .expect("topology");
        let dir = tempfile::tempdir().expect("tempdir");
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(&fleet, fleet_toml).expect("fleet file");
        Env {
            nats,
            bus,
            dir,
            fleet,
        }
    }

    pub(crate) fn config(&self, board: &str) -> WorkerConfig {
        let mut config = WorkerConfig::new(&self.fleet, board);
        config.nats_urls = vec![self.nats.url()];
        config.topology = mtswarm_bus::TopologyConfig::small();
        config.kernel_root = kernel_root();
        config.workspace_root = self.dir.path().join(format!("ws-{board}"));
        config.emulator_cache_dir =
            Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("worker-emu-cache"));
        config.lease_ttl = Duration::from_secs(3);
        config.worker_ttl = Duration::from_secs(3);
        config.shutdown_timeout = Duration::from_secs(10);
        config.measure = MeasureConfig {
            warmup: 1,
            min_repeats: 3,
            min_repeats_deterministic: 3,
            runs_per_launch: 3,
            ..MeasureConfig::default()
        };
        config
    }

    pub(crate) async fn daemon(&self, config: WorkerConfig) -> WorkerHandle {
        WorkerDaemon::start(config).await.expect("daemon starts")
    }

    /// Publish `task` on the bus.
    pub(crate) async fn publish(&self, task: &v1::TaskAssignment) {
        self.bus
            .publish_task(task)
            .await
            .unwrap_or_else(|error| panic!("publish {}: {error}", task.task_id));
    }

    /// Subscribe to `job`'s approval requests and events (flushed, so they
    /// reached the server before anything is published) and open a durable
    /// result consumer `consumer` for its results.
    pub(crate) async fn watch(&self, job: &str, consumer: &str) -> JobWatch {
        let requests = self
            .bus
            .subscribe_approval_requests(Some(job))
            .await
            .expect("approval requests");
        let events = self.bus.subscribe_events(job).await.expect("events");
        self.bus.flush().await.expect("flush");
        JobWatch {
            requests,
            events,
            results: results(&self.bus, job, consumer).await,
        }
    }
}

/// What a test sees of one job: its approval requests, its agent events and
/// its task results.
pub(crate) struct JobWatch {
    pub requests: mtswarm_bus::ReceivedStream<v1::ApprovalRequest>,
    pub events: mtswarm_bus::ReceivedStream<v1::AgentEvent>,
    pub results: mtswarm_bus::DeliveryStream<v1::TaskResult>,
}

/// A plain-text gRPC channel to the daemon.
pub(crate) async fn channel(handle: &WorkerHandle) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", handle.grpc_addr()))
        .expect("endpoint")
        .connect()
        .await
        .expect("gRPC connect")
}

pub(crate) async fn client(handle: &WorkerHandle) -> WorkerClient<Channel> {
    WorkerClient::new(channel(handle).await)
}

pub(crate) fn spawn_request(
    job: &str,
    agent: &str,
    session: &str,
    slice: &str,
) -> v1::SpawnSessionRequest {
    v1::SpawnSessionRequest {
        job_id: job.into(),
        agent_id: agent.into(),
        session_id: session.into(),
        slice_id: slice.into(),
        role: "tuner".into(),
        kernel_dir: "vecadd".into(),
        ..Default::default()
    }
}

/// SpawnSession on `handle`'s daemon over a fresh client; the spawn must
/// succeed.
pub(crate) async fn spawn(
    handle: &WorkerHandle,
    request: v1::SpawnSessionRequest,
) -> v1::SpawnSessionResponse {
    let session = request.session_id.clone();
    client(handle)
        .await
        .spawn_session(request)
        .await
        .unwrap_or_else(|status| panic!("spawn {session}: {status}"))
        .into_inner()
}

/// SpawnSession on `grpc` that must be refused with `code` (`what` names
/// the case); returns the status.
pub(crate) async fn refused_spawn(
    grpc: &mut WorkerClient<Channel>,
    request: v1::SpawnSessionRequest,
    code: tonic::Code,
    what: &str,
) -> tonic::Status {
    let status = match grpc.spawn_session(request).await {
        Ok(response) => panic!("{what}: spawned {:?}", response.into_inner()),
        Err(status) => status,
    };
    assert_eq!(status.code(), code, "{what}: {status}");
    status
}

/// A test session: its job, agent and session ids, and the worker and
/// slice its tasks go to.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub job: String,
    pub agent: String,
    pub id: String,
    pub worker: String,
    pub slice: String,
}

impl Session {
    /// Session `id` of `job` (agent `agent`) on `slice` of `handle`'s daemon.
    pub(crate) fn on(handle: &WorkerHandle, slice: &str, job: &str, agent: &str, id: &str) -> Self {
        Self {
            job: job.into(),
            agent: agent.into(),
            id: id.into(),
            worker: handle.worker_id().into(),
            slice: slice.into(),
        }
    }

    /// The SpawnSession request for this session (no auto-approval).
    pub(crate) fn spawn_request(&self) -> v1::SpawnSessionRequest {
        spawn_request(&self.job, &self.agent, &self.id, &self.slice)
    }

    /// The same request with `auto_approve`.
    pub(crate) fn auto_approved(&self) -> v1::SpawnSessionRequest {
        v1::SpawnSessionRequest {
            auto_approve: true,
            ..self.spawn_request()
        }
    }

    /// Attempt `attempt` of task `task_id` for this session.
    pub(crate) fn task(
        &self,
        task_id: &str,
        attempt: u32,
        parameters: Value,
    ) -> v1::TaskAssignment {
        v1::TaskAssignment {
            task_id: task_id.into(),
            job_id: self.job.clone(),
            attempt,
            agent_id: self.agent.clone(),
            session_id: self.id.clone(),
            worker_id: self.worker.clone(),
            slice_id: self.slice.clone(),
            instructions: "Find the fastest configuration.".into(),
            kernel_dir: "vecadd".into(),
            parameters_json: parameters.to_string(),
            ..Default::default()
        }
    }
}

/// Next item of a stream, failing the test after [`WAIT`].
pub(crate) async fn next<S, T>(stream: &mut S, what: &str) -> T
where
    S: Stream<Item = T> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap_or_else(|| panic!("stream of {what} ended"))
}

/// The next result of `job` from a fresh durable result consumer.
pub(crate) async fn results(
    bus: &Bus,
    job: &str,
    name: &str,
) -> mtswarm_bus::DeliveryStream<v1::TaskResult> {
    let mut config = ResultConsumerConfig::new(name);
    config.job_id = Some(job.into());
    bus.result_consumer(config)
        .await
        .expect("result consumer")
        .messages()
        .await
        .expect("results")
}

/// The next task result of a result stream (each wait bounded by [`WAIT`]).
pub(crate) async fn next_result(
    results: &mut mtswarm_bus::DeliveryStream<v1::TaskResult>,
    what: &str,
) -> v1::TaskResult {
    next(results, what)
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .message()
        .clone()
}

/// The next message of a core NATS subscription (bounded by [`WAIT`]).
pub(crate) async fn next_message<T>(stream: &mut mtswarm_bus::ReceivedStream<T>, what: &str) -> T {
    next(stream, what)
        .await
        .unwrap_or_else(|error| panic!("{what}: {error}"))
        .message
}

/// A FENCED, CANCELLED result of attempt 1 whose error says `fenced off: `.
pub(crate) async fn fenced_result(
    results: &mut mtswarm_bus::DeliveryStream<v1::TaskResult>,
) -> v1::TaskResult {
    let result = next_result(results, "the fenced result").await;
    assert!(result.fenced, "{result:?}");
    assert_eq!(result.attempt, 1, "{result:?}");
    assert_eq!(
        result.status,
        v1::TaskStatus::Cancelled as i32,
        "{result:?}"
    );
    assert!(result.error.starts_with("fenced off: "), "{}", result.error);
    result
}

/// A decision on `request` by "reviewer".
pub(crate) fn decision(
    request: &v1::ApprovalRequest,
    verdict: v1::ApprovalVerdict,
    reason: &str,
) -> v1::ApprovalDecision {
    // A decision names the call it decides, as the leader's does.
    v1::ApprovalDecision {
        reason: reason.into(),
        decided_by: "reviewer".into(),
        ..mtswarm_auth::ApprovedCall::of(request).decision(verdict)
    }
}

/// An APPROVE of `request` with no reason.
pub(crate) fn approve(request: &v1::ApprovalRequest) -> v1::ApprovalDecision {
    decision(request, v1::ApprovalVerdict::Approve, "")
}

/// The value stored under `key` in a bucket (it must be there): an
/// approval record, a checkpoint, a lease, a worker or quarantine record.
pub(crate) async fn stored<T: BusMessage>(kv: &TypedKv<T>, key: &str) -> T {
    kv.get(key)
        .await
        .unwrap_or_else(|error| panic!("get {key}: {error}"))
        .unwrap_or_else(|| panic!("nothing stored under {key}"))
        .value
}

pub(crate) fn payload(event: &v1::AgentEvent) -> Value {
    serde_json::from_str(&event.payload_json).expect("event payload is JSON")
}

/// Collect a job's events until `done` says so.
pub(crate) async fn events_until(
    stream: &mut mtswarm_bus::ReceivedStream<v1::AgentEvent>,
    all: &mut Vec<v1::AgentEvent>,
    mut done: impl FnMut(&v1::AgentEvent) -> bool,
) -> v1::AgentEvent {
    loop {
        let event = next(stream, "agent events")
            .await
            .expect("decodable event")
            .message;
        all.push(event.clone());
        if done(&event) {
            return event;
        }
    }
}

pub(crate) fn is_kind(event: &v1::AgentEvent, kind: v1::AgentEventKind) -> bool {
    event.kind == kind as i32
}

/// The payloads of the events of `kind`, in order.
pub(crate) fn payloads_of(
    events: &[v1::AgentEvent],
    kind: v1::AgentEventKind,
) -> impl Iterator<Item = Value> + '_ {
    events.iter().filter(move |e| is_kind(e, kind)).map(payload)
}

/// The payload of the `task_started` event of `attempt`.
pub(crate) fn task_started(events: &[v1::AgentEvent], attempt: u32) -> Value {
    events
        .iter()
        .map(payload)
        .find(|p| p["type"] == "task_started" && p["attempt"] == attempt)
        .unwrap_or_else(|| panic!("task_started of attempt {attempt}"))
}

/// The LOG event that ends a task attempt.
pub(crate) fn task_finished(event: &v1::AgentEvent, attempt: u32) -> bool {
    is_kind(event, v1::AgentEventKind::Log) && {
        let p = payload(event);
        p["type"] == "task_finished" && p["attempt"] == attempt
    }
}

pub(crate) fn assert_gapless(events: &[v1::AgentEvent], from: u64) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event.sequence,
            from + i as u64,
            "event {i} out of sequence: {:?}",
            events.iter().map(|e| e.sequence).collect::<Vec<_>>()
        );
    }
}

/// The payload of `session`'s `session_finished` event (each wait bounded by
/// [`WAIT`]).
pub(crate) async fn session_finished(
    stream: &mut mtswarm_bus::ReceivedStream<v1::AgentEvent>,
    session: &str,
) -> Value {
    let mut seen = Vec::new();
    let event = events_until(stream, &mut seen, |e| {
        e.session_id == session && is_kind(e, v1::AgentEventKind::SessionFinished)
    })
    .await;
    payload(&event)
}

/// Wait for `session`'s `session_finished` event and check that the
/// session ended on a fence.
pub(crate) async fn fenced_session_end(
    stream: &mut mtswarm_bus::ReceivedStream<v1::AgentEvent>,
    session: &str,
) {
    let finished = session_finished(stream, session).await;
    assert!(
        finished["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("fenced off:")),
        "{finished}"
    );
}
