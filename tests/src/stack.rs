//! A test stack: a real nats-server, the leader in the test process
//! (`LeaderDaemon::start`, so a test can inject the leader's model), and
//! worker daemons as separate `mtswarm-node worker` processes, each owning
//! one board of a generated fleet file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mtswarm_bus::local_server::NatsServer;
use mtswarm_cli::{StreamBytes, WorkerProcessArgs};
use mtswarm_leader::{LeaderConfig, LeaderDaemon, LeaderHandle};
use mtswarm_llm::{OpenAiConfig, ToolMode};
pub use mtswarm_proto::GrpcTransport;
use mtswarm_proto::v1;
use mtswarm_proto::v1::control_client::ControlClient;
use mtswarm_telemetry::grpc::TraceContextInterceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::process::{NodeProcess, ReadyInfo};

/// How long a daemon may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The path of the tests crate's `mtswarm-node` binary. A macro so that
/// `env!` is expanded in the integration test that uses it (Cargo sets
/// `CARGO_BIN_EXE_*` only there).
#[macro_export]
macro_rules! node_bin {
    () => {
        ::std::path::PathBuf::from(env!("CARGO_BIN_EXE_mtswarm-node"))
    };
}

/// What to start.
pub struct StackOptions {
    /// The `mtswarm-node` binary ([`node_bin!`]).
    pub node_bin: PathBuf,
    /// fleet.toml text; one worker process per board (empty: no workers).
    pub fleet_toml: String,
    /// Adjusts the leader's configuration (e.g. to inject a model factory).
    pub configure_leader: Box<dyn FnOnce(&mut LeaderConfig) + Send>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` of the worker processes.
    pub otlp_endpoint: Option<String>,
    /// Extra arguments of every `mtswarm-node worker`.
    pub worker_args: Vec<String>,
    /// Kernel root of the leader and the workers (default: [`crate::kernel_root`]).
    pub kernel_root: PathBuf,
}

impl StackOptions {
    /// Options for `fleet_toml` run by `node_bin`: the leader's default
    /// configuration, no tracing, no extra worker arguments.
    pub fn new(node_bin: PathBuf, fleet_toml: String) -> Self {
        Self {
            node_bin,
            fleet_toml,
            configure_leader: Box::new(|_| {}),
            otlp_endpoint: None,
            worker_args: Vec::new(),
            kernel_root: crate::kernel_root(),
        }
    }

    /// Options whose leader and workers are all driven by the model `llm`
    /// describes: the leader's configuration gets it, every worker the
    /// `--llm-*` arguments that name the same endpoint, model, tool mode,
    /// request timeout and context window.
    pub fn model_driven(node_bin: PathBuf, fleet_toml: String, llm: OpenAiConfig) -> Self {
        let mut worker_args = vec![
            "--llm-url".to_string(),
            llm.base_url.clone(),
            "--llm-model".to_string(),
            llm.model.clone(),
            "--llm-timeout-secs".to_string(),
            llm.request_timeout.as_secs().max(1).to_string(),
        ];
        if llm.tool_mode == ToolMode::Text {
            worker_args.extend(["--llm-tool-mode".to_string(), "text".to_string()]);
        }
        if let Some(tokens) = llm.context_tokens {
            worker_args.extend(["--llm-context-tokens".to_string(), tokens.to_string()]);
        }
        Self {
            configure_leader: Box::new(move |config| config.llm = Some(llm)),
            worker_args,
            ..Self::new(node_bin, fleet_toml)
        }
    }
}

/// Control client with trace context injection, as the CLI uses.
pub type Control = ControlClient<InterceptedService<Channel, TraceContextInterceptor>>;

/// A running stack; everything stops when it drops (worker processes are
/// killed, the leader's tasks end with the runtime, nats-server is killed).
pub struct TestStack {
    /// The nats-server every part uses.
    pub nats: NatsServer,
    /// The in-process leader; `None` once [`TestStack::shutdown`] took it.
    pub leader: Option<LeaderHandle>,
    /// `http://ADDR` of the in-process leader's Control service.
    pub leader_url: String,
    /// One `mtswarm-node worker` process per board, in fleet order.
    pub workers: Vec<NodeProcess>,
    /// Ready-file contents of `workers`, same order.
    pub worker_ready: Vec<ReadyInfo>,
    /// The fleet.toml written for the workers (in the stack's directory).
    pub fleet_path: PathBuf,
    dir: tempfile::TempDir,
}

impl TestStack {
    /// Starts NATS, the leader, then the workers (in parallel), each bounded
    /// by [`READY_TIMEOUT`]. Panics with the failing part's log: this is test
    /// setup.
    pub async fn start(mut options: StackOptions) -> TestStack {
        let (nats, dir, fleet_path) =
            start_nats_with_fleet("mtswarm-e2e-", &options.fleet_toml).await;

        let mut config = LeaderConfig::new(nats.url(), options.kernel_root.clone());
        config.topology = mtswarm_bus::TopologyConfig::small();
        let configure = std::mem::replace(&mut options.configure_leader, Box::new(|_| {}));
        configure(&mut config);
        let leader = LeaderDaemon::start(config)
            .await
            .expect("the leader starts");
        let leader_url = format!("http://{}", leader.grpc_addr());

        // An empty fleet text means a leader without workers.
        let boards: Vec<String> = if options.fleet_toml.trim().is_empty() {
            Vec::new()
        } else {
            mtswarm_hw::fleet::Fleet::load(&fleet_path)
                .expect("valid test fleet")
                .boards
                .into_iter()
                .map(|board| board.id)
                .collect()
        };
        let mut workers = Vec::new();
        let mut ready_files = Vec::new();
        for board in &boards {
            let ready = dir.path().join(format!("{board}.ready.json"));
            let command = worker_command(
                &options,
                &nats.url(),
                &fleet_path,
                board,
                &ready,
                dir.path(),
            );
            let process = NodeProcess::spawn(&format!("worker {board}"), command)
                .expect("spawn a worker process");
            workers.push(process);
            ready_files.push(ready);
        }
        let mut worker_ready = Vec::new();
        for (process, ready) in workers.iter_mut().zip(&ready_files) {
            let info = tokio::task::block_in_place(|| process.wait_ready(ready, READY_TIMEOUT))
                .unwrap_or_else(|e| panic!("{e}"));
            worker_ready.push(info);
        }
        TestStack {
            nats,
            leader: Some(leader),
            leader_url,
            workers,
            worker_ready,
            fleet_path,
            dir,
        }
    }

    /// A temporary directory living as long as the stack.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh Control client connected to the in-process leader.
    pub async fn control(&self) -> Control {
        let channel = tonic::transport::Endpoint::from_shared(self.leader_url.clone())
            .expect("leader url")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to the leader");
        ControlClient::with_interceptor(channel, TraceContextInterceptor)
    }

    /// Waits until ListFleet shows `count` slices (workers register
    /// asynchronously after they report ready).
    pub async fn wait_for_slices(&self, count: usize, timeout: Duration) -> v1::ListFleetResponse {
        wait_for_free_slices(&mut self.control().await, count, timeout, String::new).await
    }

    /// Stops the leader gracefully (the workers are killed on drop).
    pub async fn shutdown(mut self) {
        if let Some(leader) = self.leader.take()
            && let Err(error) = leader.shutdown().await
        {
            eprintln!("leader shutdown: {error}");
        }
    }

    /// Every worker process's stderr, for assertion messages.
    pub fn worker_logs(&self) -> String {
        self.workers
            .iter()
            .map(|w| format!("--- {} ---\n{}", w.name(), w.stderr()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// What every test stack starts with: a nats-server on a free port, and a
/// temporary directory (its name starting with `prefix`) holding the
/// stack's `fleet.toml` with `fleet_toml`, whose path comes last.
pub(crate) async fn start_nats_with_fleet(
    prefix: &str,
    fleet_toml: &str,
) -> (NatsServer, tempfile::TempDir, PathBuf) {
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("nats start task")
        .expect("nats-server starts (is it on PATH? see deploy/setup.sh)");
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("stack temp dir");
    let fleet_path = dir.path().join("fleet.toml");
    std::fs::write(&fleet_path, fleet_toml).expect("write fleet.toml");
    (nats, dir, fleet_path)
}

fn worker_command(
    options: &StackOptions,
    nats_url: &str,
    fleet: &Path,
    board: &str,
    ready: &Path,
    dir: &Path,
) -> Command {
    let mut command = Command::new(&options.node_bin);
    command
        .args(
            WorkerProcessArgs {
                nats_url: nats_url.to_string(),
                fleet: fleet.to_path_buf(),
                board: board.to_string(),
                kernel_root: options.kernel_root.clone(),
                workspace_root: dir.join("workspaces").join(board),
                ready_file: ready.to_path_buf(),
                stream_bytes: Some(StreamBytes::small()),
            }
            .to_args(),
        )
        .args(&options.worker_args)
        // The emulator runtime is built once per cache; share it between runs.
        .env("MTSWARM_CACHE_DIR", crate::emulator_cache_dir())
        .env("MTSWARM_LOG", "info")
        .env_remove("MTSWARM_LLM_URL")
        .env_remove("MTSWARM_LLM_MODEL")
        .env_remove("MTSWARM_LEADER")
        .env_remove("MTSWARM_NATS_URL");
    match &options.otlp_endpoint {
        Some(endpoint) => {
            command.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
        }
        None => {
            command.env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        }
    }
    command
}

/// Polls `ListFleet` until at least `count` slices are free (workers
/// register their leases asynchronously after they report ready); panics
/// after `timeout` with the fleet seen and `context()` (e.g. process logs).
pub async fn wait_for_free_slices(
    control: &mut Control,
    count: usize,
    timeout: Duration,
    context: impl Fn() -> String,
) -> v1::ListFleetResponse {
    let free = |fleet: &v1::ListFleetResponse| {
        fleet
            .slices
            .iter()
            .filter(|s| s.state() == v1::SliceState::Free)
            .count()
    };
    wait_for_fleet(
        control,
        timeout,
        |fleet| free(fleet) >= count,
        |fleet| {
            format!(
                "only {} of {count} slices free: {fleet:?}\n{}",
                free(fleet),
                context()
            )
        },
    )
    .await
}

/// Polls `ListFleet` until the fleet is `wanted`, and returns it; panics
/// after `timeout` with `waiting_for` of the last fleet seen.
pub async fn wait_for_fleet<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    timeout: Duration,
    wanted: impl Fn(&v1::ListFleetResponse) -> bool,
    waiting_for: impl Fn(&v1::ListFleetResponse) -> String,
) -> v1::ListFleetResponse {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let fleet = control
            .list_fleet(v1::ListFleetRequest::default())
            .await
            .expect("ListFleet")
            .into_inner();
        if wanted(&fleet) {
            return fleet;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} (after {timeout:?})",
            waiting_for(&fleet)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
