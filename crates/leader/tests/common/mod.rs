//! Shared setup of the leader's integration tests: a real nats-server, a
//! kernel root in a temporary directory, a leader on 127.0.0.1:0, a gRPC
//! client, a fake worker daemon (a real Worker gRPC server registered in
//! the workers KV), and a model whose turns can be held back until the test
//! releases them.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig, TopologyConfig, Workers, v1};
use mtswarm_core::testing::ScriptedModel;
use mtswarm_core::{ChatModel, ChatRequest, ModelError, ModelStream};
use mtswarm_leader::{LeaderConfig, LeaderDaemon, LeaderHandle};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Upper bound of every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(20);

pub type Control = v1::control_client::ControlClient<tonic::transport::Channel>;

/// Awaits `future` at most [`WAIT`], naming what was awaited on timeout.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Re-checks `check` until it returns `Some`, at most [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
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

pub struct Env {
    pub nats: NatsServer,
    pub bus: Bus,
    pub kernel_root: tempfile::TempDir,
}

pub const TUNE_TOML: &str = r#"
kernel = "k1"
[[param]]
name = "A"
values = [1, 2, 3]
default = 1
"#;

impl Env {
    pub async fn start() -> Env {
        let nats = tokio::task::spawn_blocking(NatsServer::start)
            .await
            .expect("start task")
            .expect("nats-server starts");
        let bus = Bus::connect(BusConfig::new(nats.url()).with_name("leader-test"))
            .await
            .expect("connect");
        bus.wait_connected(WAIT).await.expect("connected");
        bus.ensure_topology(&TopologyConfig::default())
            .await
            .expect("topology");
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

    pub fn config(&self) -> LeaderConfig {
        LeaderConfig::new(self.nats.url(), self.kernel_root.path())
    }

    pub async fn leader(&self, model: Arc<dyn ChatModel>) -> LeaderHandle {
        let config = self
            .config()
            .with_model_factory(Arc::new(move |_spec: &v1::JobSpec| Ok(model.clone())));
        LeaderDaemon::start(config).await.expect("leader starts")
    }

    pub fn kernel_dir(&self) -> PathBuf {
        self.kernel_root.path().join("k1")
    }
}

pub async fn control(leader: &LeaderHandle) -> Control {
    let channel = tonic::transport::Endpoint::from_shared(leader.grpc_url())
        .expect("endpoint")
        .connect_timeout(WAIT)
        .connect()
        .await
        .expect("connect to the leader");
    v1::control_client::ControlClient::new(channel)
}

pub fn spec(goal: &str) -> v1::JobSpec {
    v1::JobSpec {
        goal: goal.to_string(),
        kernel_dir: "k1".to_string(),
        ..Default::default()
    }
}

/// Reads a job's events until its stream ends (final state).
pub async fn watch_to_end(control: &mut Control, job_id: &str, from: u64) -> Vec<v1::JobEvent> {
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_string(),
            from_sequence: from,
        })
        .await
        .expect("watch_job")
        .into_inner();
    let mut events = Vec::new();
    within("the end of the job's event stream", async {
        while let Some(event) = stream.message().await.expect("watch stream item") {
            events.push(event);
        }
    })
    .await;
    events
}

pub fn final_state(events: &[v1::JobEvent]) -> Option<v1::JobState> {
    events.iter().rev().find_map(|e| match &e.event {
        Some(v1::job_event::Event::StateChange(c)) => Some(c.current()),
        _ => None,
    })
}

/// A [`ChatModel`] that plays a script and holds turn `gate_turn` (0-based)
/// until [`GatedModel::open`] is called.
pub struct GatedModel {
    pub inner: ScriptedModel,
    gate_turn: usize,
    turns: std::sync::atomic::AtomicUsize,
    gate: Semaphore,
}

impl GatedModel {
    pub fn new(inner: ScriptedModel, gate_turn: usize) -> Self {
        Self {
            inner,
            gate_turn,
            turns: Default::default(),
            gate: Semaphore::new(0),
        }
    }
    pub fn open(&self) {
        self.gate.add_permits(1);
    }
}

#[async_trait::async_trait]
impl ChatModel for GatedModel {
    fn model_name(&self) -> &str {
        "gated-script"
    }
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let turn = self.turns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if turn == self.gate_turn {
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| ModelError::Other("gate closed".into()))?;
        }
        self.inner.stream(request).await
    }
}

/// What the fake worker saw.
#[derive(Debug)]
pub enum WorkerCall {
    Spawn(Box<v1::SpawnSessionRequest>),
    Cancel(v1::CancelSessionRequest),
}

struct FakeWorkerService {
    worker_id: String,
    slice_id: String,
    calls: mpsc::UnboundedSender<WorkerCall>,
}

#[tonic::async_trait]
impl v1::worker_server::Worker for FakeWorkerService {
    async fn spawn_session(
        &self,
        request: Request<v1::SpawnSessionRequest>,
    ) -> Result<Response<v1::SpawnSessionResponse>, Status> {
        let request = request.into_inner();
        let response = v1::SpawnSessionResponse {
            session_id: request.session_id.clone(),
            worker_id: self.worker_id.clone(),
            slice_id: self.slice_id.clone(),
            lease_epoch: 1,
            resumed_from_step: 0,
        };
        let _ = self.calls.send(WorkerCall::Spawn(Box::new(request)));
        Ok(Response::new(response))
    }
    async fn cancel_session(
        &self,
        request: Request<v1::CancelSessionRequest>,
    ) -> Result<Response<v1::CancelSessionResponse>, Status> {
        let _ = self.calls.send(WorkerCall::Cancel(request.into_inner()));
        Ok(Response::new(v1::CancelSessionResponse { cancelled: true }))
    }
    async fn drain(
        &self,
        _: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Ok(Response::new(v1::DrainResponse::default()))
    }
    async fn status(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        Ok(Response::new(v1::StatusResponse {
            worker_id: self.worker_id.clone(),
            ..Default::default()
        }))
    }
}

/// A Worker gRPC server on 127.0.0.1:0 with one slice, registered in the
/// workers KV. Calls arrive on `calls`.
pub struct FakeWorker {
    pub worker_id: String,
    pub slice_id: String,
    pub addr: SocketAddr,
    pub calls: mpsc::UnboundedReceiver<WorkerCall>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeWorker {
    pub async fn start(bus: &Bus, worker_id: &str, board: &str) -> FakeWorker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let slice_id = format!("{board}-c0");
        let (tx, calls) = mpsc::unbounded_channel();
        let service = FakeWorkerService {
            worker_id: worker_id.to_string(),
            slice_id: slice_id.clone(),
            calls: tx,
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(v1::worker_server::WorkerServer::new(service))
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        let record = v1::WorkerRecord {
            worker_id: worker_id.to_string(),
            endpoint: format!("http://{addr}"),
            slices: vec![v1::SliceDescriptor {
                slice_id: slice_id.clone(),
                board: board.to_string(),
                cluster: 0,
                cores: 8,
                backend: "emulator".to_string(),
            }],
            ..Default::default()
        };
        Workers::open(bus)
            .await
            .expect("workers bucket")
            .register(&record, Duration::from_secs(60))
            .await
            .expect("register worker");
        FakeWorker {
            worker_id: worker_id.to_string(),
            slice_id,
            addr,
            calls,
            server,
        }
    }
}

/// Answers every task of `worker_id` with an OK result whose best GFLOP/s is
/// `gflops_of(task)`, until the returned task is aborted. Each task's
/// headers are sent on the channel.
pub fn answer_tasks(
    bus: &Bus,
    worker_id: &str,
    gflops_of: fn(&v1::TaskAssignment) -> f64,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<(v1::TaskAssignment, async_nats::HeaderMap)>,
) {
    use futures::StreamExt as _;
    let bus = bus.clone();
    let worker_id = worker_id.to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let consumer = bus
            .task_consumer(&worker_id, mtswarm_bus::TaskConsumerConfig::default())
            .await
            .expect("task consumer");
        let mut tasks = consumer.messages().await.expect("task stream");
        while let Some(Ok(delivery)) = tasks.next().await {
            let task = delivery.message().clone();
            let parameters: serde_json::Value =
                serde_json::from_str(&task.parameters_json).unwrap_or_default();
            let best = parameters["candidates"][0].clone();
            let result = v1::TaskResult {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                job_id: task.job_id.clone(),
                agent_id: task.agent_id.clone(),
                session_id: task.session_id.clone(),
                worker_id: task.worker_id.clone(),
                slice_id: task.slice_id.clone(),
                status: v1::TaskStatus::Ok as i32,
                summary: "benchmarked".into(),
                result_json: serde_json::json!({
                    "best": {"defines": best, "gflops": gflops_of(&task), "peak_percent": 12.5},
                    "candidates": parameters["candidates"],
                })
                .to_string(),
                ..Default::default()
            };
            bus.publish_result(&result).await.expect("publish result");
            delivery.ack().await.expect("ack");
            let _ = tx.send((task, delivery.headers().clone()));
        }
    });
    (task, rx)
}
