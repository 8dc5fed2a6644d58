//! Shared pieces of the worker daemon tests: a real nats-server, a fleet
//! file with emulator boards, a daemon config with short timeouts, gRPC
//! clients, task publishing and bounded waits on bus streams.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use futures::{Stream, StreamExt};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, ResultConsumerConfig, v1};
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
        bus.ensure_topology(&mtswarm_bus::TopologyConfig::default())
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
}

pub(crate) async fn client(handle: &WorkerHandle) -> WorkerClient<Channel> {
    WorkerClient::connect(format!("http://{}", handle.grpc_addr()))
        .await
        .expect("gRPC connect")
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

/// Where a test task goes: its job, agent, session, worker and slice.
pub(crate) struct Place<'a> {
    pub job: &'a str,
    pub agent: &'a str,
    pub session: &'a str,
    pub worker: &'a str,
    pub slice: &'a str,
}

pub(crate) fn task(
    place: Place<'_>,
    task_id: &str,
    attempt: u32,
    parameters: Value,
) -> v1::TaskAssignment {
    let Place {
        job,
        agent,
        session,
        worker,
        slice,
    } = place;
    v1::TaskAssignment {
        task_id: task_id.into(),
        job_id: job.into(),
        attempt,
        agent_id: agent.into(),
        session_id: session.into(),
        worker_id: worker.into(),
        slice_id: slice.into(),
        instructions: "Find the fastest configuration.".into(),
        kernel_dir: "vecadd".into(),
        parameters_json: parameters.to_string(),
        ..Default::default()
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
