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
use mtswarm_bus::{Bus, BusConfig, LeaseRequest, Leases, TopologyConfig, Versioned, Workers, v1};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::{ChatModel, ChatRequest, ModelError, ModelStream};
use mtswarm_leader::{LeaderConfig, LeaderDaemon, LeaderHandle};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

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

pub(crate) const TUNE_TOML: &str = r#"
kernel = "k1"
[[param]]
name = "A"
values = [1, 2, 3]
default = 1
"#;

impl Env {
    pub(crate) async fn start() -> Env {
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

    pub(crate) fn config(&self) -> LeaderConfig {
        LeaderConfig::new(self.nats.url(), self.kernel_root.path())
    }

    pub(crate) async fn leader(&self, model: Arc<dyn ChatModel>) -> LeaderHandle {
        let config = self
            .config()
            .with_model_factory(Arc::new(move |_spec: &v1::JobSpec| Ok(model.clone())));
        LeaderDaemon::start(config).await.expect("leader starts")
    }

    pub(crate) fn kernel_dir(&self) -> PathBuf {
        self.kernel_root.path().join("k1")
    }
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

pub(crate) fn spec(goal: &str) -> v1::JobSpec {
    v1::JobSpec {
        goal: goal.to_string(),
        kernel_dir: "k1".to_string(),
        ..Default::default()
    }
}

/// Reads a job's events until its stream ends (final state).
/// Submits a job with [`spec`]`(goal)` and returns its id.
pub(crate) async fn submit(control: &mut Control, goal: &str) -> String {
    control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec(goal)),
            idempotency_key: String::new(),
        })
        .await
        .expect("submit")
        .into_inner()
        .job_id
}

pub(crate) async fn watch_to_end(
    control: &mut Control,
    job_id: &str,
    from: u64,
) -> Vec<v1::JobEvent> {
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

pub(crate) fn final_state(events: &[v1::JobEvent]) -> Option<v1::JobState> {
    events.iter().rev().find_map(|e| match &e.event {
        Some(v1::job_event::Event::StateChange(c)) => Some(c.current()),
        _ => None,
    })
}

/// A [`ChatModel`] that plays a script and holds turn `gate_turn` (0-based)
/// until [`GatedModel::open`] is called.
pub(crate) struct GatedModel {
    pub inner: ScriptedModel,
    gate_turn: usize,
    turns: std::sync::atomic::AtomicUsize,
    gate: Semaphore,
}

impl GatedModel {
    pub(crate) fn new(inner: ScriptedModel, gate_turn: usize) -> Self {
        Self {
            inner,
            gate_turn,
            turns: Default::default(),
            gate: Semaphore::new(0),
        }
    }
    pub(crate) fn open(&self) {
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
pub(crate) enum WorkerCall {
    /// A SpawnSession reached a gated worker and waits for its gate.
    SpawnArrived(String),
    Spawn(Box<v1::SpawnSessionRequest>),
    Cancel(v1::CancelSessionRequest),
}

struct FakeWorkerService {
    worker_id: String,
    slice_id: String,
    calls: mpsc::UnboundedSender<WorkerCall>,
    lease: Arc<FakeLease>,
    /// When set, every SpawnSession waits for a permit before it starts
    /// the session.
    spawn_gate: Option<Arc<Semaphore>>,
}

/// The fake worker's lease on its slice, renewed like a real worker's (the
/// session it names is set by SpawnSession).
pub(crate) struct FakeLease {
    leases: Leases,
    held: tokio::sync::Mutex<Option<Versioned<v1::SliceLease>>>,
}

impl FakeLease {
    /// Renews the lease, naming `session` when given.
    async fn renew(&self, session: Option<(&str, &str)>) {
        let mut held = self.held.lock().await;
        let Some(current) = held.as_ref() else { return };
        let renewed = self
            .leases
            .renew_with(current, |lease| {
                if let Some((session_id, job_id)) = session {
                    lease.session_id = session_id.to_string();
                    lease.job_id = job_id.to_string();
                }
            })
            .await;
        match renewed {
            Ok(renewed) => *held = Some(renewed),
            Err(error) => {
                eprintln!("fake worker lease not renewed: {error}");
            }
        }
    }
}

#[tonic::async_trait]
impl v1::worker_server::Worker for FakeWorkerService {
    async fn spawn_session(
        &self,
        request: Request<v1::SpawnSessionRequest>,
    ) -> Result<Response<v1::SpawnSessionResponse>, Status> {
        let request = request.into_inner();
        if let Some(gate) = &self.spawn_gate {
            let _ = self
                .calls
                .send(WorkerCall::SpawnArrived(request.session_id.clone()));
            let permit = gate
                .acquire()
                .await
                .map_err(|_| Status::unavailable("spawn gate closed"))?;
            permit.forget();
        }
        if !request.slice_id.is_empty() && request.slice_id != self.slice_id {
            return Err(Status::not_found(format!(
                "slice {} is not on worker {}",
                request.slice_id, self.worker_id
            )));
        }
        self.lease
            .renew(Some((&request.session_id, &request.job_id)))
            .await;
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

/// Lease TTL of the fake workers (the smallest the KV allows, so a killed
/// fake worker's lease lapses fast).
pub(crate) const FAKE_LEASE_TTL: Duration = Duration::from_secs(1);

/// A Worker gRPC server on 127.0.0.1:0 with one slice, registered in the
/// workers KV and holding the slice's lease (renewed every third of
/// [`FAKE_LEASE_TTL`]). Calls arrive on `calls`.
pub(crate) struct FakeWorker {
    pub worker_id: String,
    pub slice_id: String,
    pub addr: SocketAddr,
    pub calls: mpsc::UnboundedReceiver<WorkerCall>,
    server: tokio::task::JoinHandle<()>,
    renewal: tokio::task::JoinHandle<()>,
    bus: Bus,
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.server.abort();
        self.renewal.abort();
    }
}

impl FakeWorker {
    pub(crate) async fn start(bus: &Bus, worker_id: &str, board: &str) -> FakeWorker {
        Self::start_with_gate(bus, worker_id, board, None).await
    }

    /// A fake worker whose SpawnSession calls each wait for a permit of
    /// `gate` (announced as [`WorkerCall::SpawnArrived`]).
    pub(crate) async fn start_with_gate(
        bus: &Bus,
        worker_id: &str,
        board: &str,
        spawn_gate: Option<Arc<Semaphore>>,
    ) -> FakeWorker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let slice_id = format!("{board}-c0");
        let (tx, calls) = mpsc::unbounded_channel();
        let leases = Leases::open(bus).await.expect("leases bucket");
        let held = leases
            .acquire(&LeaseRequest {
                slice_id: slice_id.clone(),
                worker_id: worker_id.to_string(),
                session_id: String::new(),
                job_id: String::new(),
                ttl: FAKE_LEASE_TTL,
            })
            .await
            .expect("slice lease");
        let lease = Arc::new(FakeLease {
            leases,
            held: tokio::sync::Mutex::new(Some(held)),
        });
        let renewal = {
            let lease = lease.clone();
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(FAKE_LEASE_TTL / 3);
                loop {
                    ticker.tick().await;
                    lease.renew(None).await;
                }
            })
        };
        let service = FakeWorkerService {
            worker_id: worker_id.to_string(),
            slice_id: slice_id.clone(),
            calls: tx,
            lease,
            spawn_gate,
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
            renewal,
            bus: bus.clone(),
        }
    }

    /// What a crash looks like to the rest of the system: the gRPC server
    /// stops, the lease is no longer renewed (it lapses after its TTL) and
    /// the worker record is gone.
    pub(crate) async fn kill(&self) {
        self.server.abort();
        self.renewal.abort();
        Workers::open(&self.bus)
            .await
            .expect("workers bucket")
            .deregister(&self.worker_id)
            .await
            .expect("deregister the killed worker");
    }
}

/// The leader conversation most tests need: spawn agent `a1` on
/// `slice_id`, give it one task with one candidate, collect it, and answer
/// with a best result of `gflops`.
pub(crate) fn one_task_script(slice_id: &str, gflops: f64) -> Arc<ConversationScript> {
    let spawn = serde_json::json!({"name": "a1", "slice_id": slice_id, "instructions": "tune"});
    Arc::new(ConversationScript::new(
        vec![
            ScriptedTurn::call("c1", "spawn_agent", &spawn.to_string()),
            ScriptedTurn::call(
                "c2",
                "assign_task",
                r#"{"agent":"a1","instructions":"try","parameters":{"candidates":[{"A":1}]}}"#,
            ),
            ScriptedTurn::call(
                "c3",
                "collect_result",
                r#"{"mode":"all","timeout_seconds":60}"#,
            ),
            ScriptedTurn::text(format!(
                "Done.\n```json\n{{\"best\":{{\"gflops\":{gflops:?}}}}}\n```"
            )),
        ],
        None,
    ))
}

/// A model that plays `turns` by position in the conversation (turn i =
/// the answer after i assistant messages), so a leader that resumes a job
/// from its checkpoint gets the turn the conversation is at. Turn
/// `hold_at` waits until [`ConversationScript::release`].
pub(crate) struct ConversationScript {
    turns: Vec<ScriptedTurn>,
    hold_at: Option<usize>,
    gate: Semaphore,
}

impl ConversationScript {
    pub(crate) fn new(turns: Vec<ScriptedTurn>, hold_at: Option<usize>) -> Self {
        Self {
            turns,
            hold_at,
            gate: Semaphore::new(0),
        }
    }
    pub(crate) fn release(&self) {
        self.gate.add_permits(1_000);
    }
}

#[async_trait::async_trait]
impl ChatModel for ConversationScript {
    fn model_name(&self) -> &str {
        "conversation-script"
    }
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let index = request
            .messages
            .iter()
            .filter(|m| m.role == mtswarm_core::Role::Assistant)
            .count();
        if self.hold_at == Some(index) {
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| ModelError::Other("gate closed".into()))?;
        }
        let turn = self
            .turns
            .get(index)
            .cloned()
            .ok_or_else(|| ModelError::Other(format!("no scripted turn {index}")))?;
        ScriptedModel::new([turn]).stream(request).await
    }
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
                serde_json::json!({
                    "best": {"defines": best, "gflops": gflops_of(&task), "peak_percent": 12.5},
                    "candidates": parameters["candidates"],
                })
                .to_string()
            } else {
                String::new()
            };
            let result = v1::TaskResult {
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                job_id: task.job_id.clone(),
                agent_id: task.agent_id.clone(),
                session_id: task.session_id.clone(),
                worker_id: task.worker_id.clone(),
                slice_id: task.slice_id.clone(),
                status: status as i32,
                summary: "benchmarked".into(),
                error: if status == v1::TaskStatus::Ok {
                    String::new()
                } else {
                    "every candidate crashed".into()
                },
                result_json,
                ..Default::default()
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
