//! `mtswarm leader` and `mtswarm worker`: thin wrappers that turn flags (and
//! their environment variables) into a `LeaderConfig` / `WorkerConfig`,
//! start the daemon, announce where it listens (a `listening on` log line and
//! the optional `--ready-file`), and shut it down gracefully on Ctrl-C or
//! SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use mtswarm_leader::{LeaderConfig, LeaderDaemon};
use mtswarm_llm::OpenAiConfig;
use mtswarm_worker::{WorkerConfig, WorkerDaemon, WorkerModel};
use serde_json::json;

use crate::common::{TelemetryArgs, write_atomically};
use crate::credentials::NatsSecurityArgs;
use crate::metrics::DaemonMetrics;

/// Default NATS URL of every process.
pub(crate) const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";

/// The model endpoint a daemon's agents use by default, its API key and the
/// other endpoints jobs may name.
#[derive(Debug, Clone, Args)]
pub struct LlmArgs {
    /// OpenAI-compatible endpoint (vLLM, Ollama, ...); absent = builtin policy.
    #[arg(long, env = "MTSWARM_LLM_URL")]
    pub llm_url: Option<String>,
    /// Model name at that endpoint.
    #[arg(long, env = "MTSWARM_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// API key of --llm-url: only from the environment (a flag would show
    /// in `ps`; given as a flag it is refused).
    #[arg(long, env = "MTSWARM_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,
    /// File holding the API key of --llm-url (instead of the variable).
    #[arg(long, env = "MTSWARM_LLM_API_KEY_FILE")]
    pub llm_api_key_file: Option<PathBuf>,
    /// Model endpoints a job may name besides --llm-url (repeatable or
    /// comma-separated); they never get the API key.
    #[arg(
        long = "model-endpoint",
        env = "MTSWARM_MODEL_ENDPOINTS",
        value_delimiter = ','
    )]
    pub model_endpoints: Vec<String>,
    /// Where each model request carries the per-step session context (time,
    /// context use, step, working state): `user-message` (appended to the
    /// last user message, or a user message of its own) or `tool-result`
    /// (appended to the last tool result). Never a trailing system message,
    /// which many chat templates refuse.
    #[arg(long, env = "MTSWARM_LLM_CONTEXT_IN", value_enum, default_value_t = ContextIn::UserMessage)]
    pub llm_context_in: ContextIn,
    /// How tools reach --llm-url: `native` (the OpenAI `tools` field) or
    /// `text` (for servers without tool calling: the tools are described in
    /// the system message and calls are read from JSON in the reply).
    #[arg(long, env = "MTSWARM_LLM_TOOL_MODE", value_enum, default_value_t = ToolModeArg::Native)]
    pub llm_tool_mode: ToolModeArg,
    /// JSON object merged into every request to --llm-url, for fields the
    /// server takes beyond the OpenAI schema, e.g.
    /// `{"chat_template_kwargs": {"enable_thinking": false}}` (Qwen on
    /// vLLM) or `{"top_k": 20}`. Fields mtswarm sets itself (model,
    /// messages, tools, stream, ...) are refused at start-up.
    #[arg(long, env = "MTSWARM_LLM_EXTRA_BODY")]
    pub llm_extra_body: Option<String>,
    /// Seconds to wait for --llm-url's response headers and between stream
    /// pieces (default 120). A model on a CPU reads a long prompt for
    /// minutes before its first token.
    #[arg(long, env = "MTSWARM_LLM_TIMEOUT_SECS")]
    pub llm_timeout_secs: Option<f64>,
    /// Tokens of context --llm-url gives each request, when smaller than a
    /// hosted model's (a local server's slot: `mtswarm llm serve` prints
    /// its own). Conversations are then compacted before they outgrow it.
    /// At least 1024: a prompt alone takes more.
    #[arg(long, env = "MTSWARM_LLM_CONTEXT_TOKENS", value_parser = clap::value_parser!(u64).range(1024..))]
    pub llm_context_tokens: Option<u64>,
}

/// `--llm-tool-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolModeArg {
    /// The OpenAI `tools` field.
    Native,
    /// Tool calls as JSON in the reply text.
    Text,
}

impl ToolModeArg {
    /// The client's mode.
    pub fn mode(self) -> mtswarm_llm::ToolMode {
        match self {
            Self::Native => mtswarm_llm::ToolMode::Native,
            Self::Text => mtswarm_llm::ToolMode::Text,
        }
    }
}

/// `--llm-context-in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ContextIn {
    /// The last user message, or a trailing user message.
    UserMessage,
    /// The last tool result, when the request ends with one.
    ToolResult,
}

impl ContextIn {
    /// The engine's placement.
    pub fn placement(self) -> mtswarm_core::InjectionPlacement {
        match self {
            Self::UserMessage => mtswarm_core::InjectionPlacement::UserMessage,
            Self::ToolResult => mtswarm_core::InjectionPlacement::ToolResult,
        }
    }
}

impl LlmArgs {
    /// `--llm-timeout-secs` as a duration; `None` for the client's default.
    pub fn timeout(&self) -> anyhow::Result<Option<std::time::Duration>> {
        match self.llm_timeout_secs {
            None => Ok(None),
            Some(secs) if secs.is_finite() && secs > 0.0 => {
                Ok(Some(std::time::Duration::from_secs_f64(secs)))
            }
            Some(secs) => anyhow::bail!("--llm-timeout-secs must be a positive number, got {secs}"),
        }
    }

    /// The API key: from its file, else from the environment; a key given
    /// on the command line is refused.
    fn api_key(&self, daemon: &str) -> anyhow::Result<Option<String>> {
        if let Some(key) = self.llm_api_key.as_ref().filter(|k| !k.is_empty())
            && std::env::var("MTSWARM_LLM_API_KEY").ok().as_ref() != Some(key)
        {
            anyhow::bail!(
                "the {daemon} reads its LLM API key from the MTSWARM_LLM_API_KEY environment variable or --llm-api-key-file only; a key on the command line shows in `ps`"
            );
        }
        if let Some(path) = &self.llm_api_key_file {
            let key = std::fs::read_to_string(path)
                .with_context(|| format!("reading the API key file {}", path.display()))?;
            return Ok(Some(key.trim().to_string()).filter(|k| !k.is_empty()));
        }
        Ok(self.llm_api_key.clone().filter(|k| !k.is_empty()))
    }

    /// The parsed `--llm-extra-body` (empty without one); a malformed
    /// object or a reserved field is an error naming it.
    pub(crate) fn extra_body(&self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        match self
            .llm_extra_body
            .as_deref()
            .filter(|b| !b.trim().is_empty())
        {
            Some(text) => Ok(mtswarm_llm::openai::parse_extra_body(text)?),
            None => Ok(serde_json::Map::new()),
        }
    }

    /// The endpoint settings when both URL and model are given; an error
    /// when only one of them is.
    fn endpoint(&self) -> anyhow::Result<Option<(String, String)>> {
        let url = self.llm_url.clone().filter(|u| !u.trim().is_empty());
        let model = self.llm_model.clone().filter(|m| !m.trim().is_empty());
        match (url, model) {
            (Some(url), Some(model)) => Ok(Some((url, model))),
            (None, None) => Ok(None),
            (Some(_), None) => {
                anyhow::bail!("--llm-url is set but --llm-model (MTSWARM_LLM_MODEL) is not")
            }
            (None, Some(_)) => {
                anyhow::bail!("--llm-model is set but --llm-url (MTSWARM_LLM_URL) is not")
            }
        }
    }
}

/// The NATS servers a process connects to and how it authenticates: the
/// same flags for `mtswarm leader`, `mtswarm worker` and `mtswarm results`.
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated.
    #[arg(long = "nats", env = "MTSWARM_NATS_URL", default_value = DEFAULT_NATS, value_delimiter = ',')]
    pub nats: Vec<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "MTSWARM_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// The nkey seed and the NATS TLS settings.
    #[command(flatten)]
    pub nats_security: NatsSecurityArgs,
}

/// How the leader and worker daemons shape the JetStream streams and KV
/// buckets they create: replicas, storage and size limits.
#[derive(Debug, Clone, Args)]
pub struct TopologyArgs {
    /// Replicas of every stream and bucket: 1 for a single nats-server, 3
    /// for a cluster (at most the cluster's JetStream servers).
    #[arg(long, env = "MTSWARM_NATS_REPLICAS", default_value_t = 1)]
    pub nats_replicas: usize,
    /// Storage of every stream and bucket: `file` (survives a server
    /// restart) or `memory`.
    #[arg(long, env = "MTSWARM_NATS_STORAGE", value_enum, default_value_t = NatsStorage::File)]
    pub nats_storage: NatsStorage,
    /// Size limit of the agent events stream, bytes (reserved on each
    /// replica's disk; the oldest events go first).
    #[arg(long, env = "MTSWARM_NATS_EVENTS_MAX_BYTES", default_value_t = 1 << 30)]
    pub nats_events_max_bytes: i64,
    /// Size limit of the measurements stream, bytes (reserved on each
    /// replica's disk; the oldest records go first).
    #[arg(long, env = "MTSWARM_NATS_MEASUREMENTS_MAX_BYTES", default_value_t = 4 << 30)]
    pub nats_measurements_max_bytes: i64,
    /// Largest record stored in any stream or bucket, bytes (default: the
    /// server's max_payload; a larger value than max_payload changes nothing).
    #[arg(long, env = "MTSWARM_NATS_MAX_RECORD_BYTES")]
    pub nats_max_record_bytes: Option<usize>,
}

/// `--nats-storage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NatsStorage {
    /// On disk.
    File,
    /// In memory (lost when the server stops).
    Memory,
}

impl TopologyArgs {
    /// The topology these flags describe (other settings at their defaults).
    pub fn topology(&self) -> mtswarm_bus::TopologyConfig {
        mtswarm_bus::TopologyConfig {
            replicas: self.nats_replicas,
            storage: match self.nats_storage {
                NatsStorage::File => mtswarm_bus::StorageType::File,
                NatsStorage::Memory => mtswarm_bus::StorageType::Memory,
            },
            event_max_bytes: self.nats_events_max_bytes,
            measurements_max_bytes: self.nats_measurements_max_bytes,
            max_record_bytes: self.nats_max_record_bytes,
            ..mtswarm_bus::TopologyConfig::default()
        }
    }
}

/// Who may call a daemon's gRPC server and the certificate it serves with.
#[derive(Debug, Clone, Args)]
pub struct GrpcServerArgs {
    /// Identities file (names, roles, token digests) whose tokens this
    /// server accepts (`mtswarm credentials` writes one). Without it every
    /// call is anonymous.
    #[arg(long, env = "MTSWARM_IDENTITIES")]
    pub identities: Option<PathBuf>,
    /// TLS certificate (PEM) to serve with.
    #[arg(long, env = "MTSWARM_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, env = "MTSWARM_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl GrpcServerArgs {
    fn security(&self) -> anyhow::Result<mtswarm_auth::ServerSecurity> {
        let tls = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        mtswarm_auth::ServerSecurity::load(self.identities.as_deref(), tls)
            .context("loading the gRPC identities and certificate")
    }
}

/// Arguments of `mtswarm leader`: the bus, the Control server, the job
/// limits, the keys and the model.
#[derive(Debug, Args)]
pub struct LeaderCmd {
    /// The NATS servers and how to authenticate to them.
    #[command(flatten)]
    pub bus: NatsArgs,
    /// Replicas, storage and size limits of the streams and buckets.
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, env = "MTSWARM_LEADER_LISTEN", default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Directory that job kernel paths are relative to.
    #[arg(long, env = "MTSWARM_KERNEL_ROOT", default_value = ".")]
    pub kernel_root: PathBuf,
    /// Write `{"grpc": URL}` here once serving.
    #[arg(long, env = "MTSWARM_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR/metrics (port 0 picks a
    /// free port); without it metrics go only where the OTLP variables say.
    #[arg(long, env = "MTSWARM_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Jobs whose leader loops run at once; more accepted jobs wait QUEUED.
    #[arg(long, env = "MTSWARM_MAX_ACTIVE_JOBS", default_value_t = 16)]
    pub max_active_jobs: usize,
    /// QUEUED jobs allowed to wait; SubmitJob beyond it is RESOURCE_EXHAUSTED.
    #[arg(long, env = "MTSWARM_MAX_QUEUED_JOBS", default_value_t = 256)]
    pub max_queued_jobs: usize,
    /// Largest gRPC message the Control server accepts or sends, in bytes.
    #[arg(long, env = "MTSWARM_GRPC_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub grpc_max_message_bytes: usize,
    /// Who may call the Control server and its TLS certificate.
    #[command(flatten)]
    pub grpc: GrpcServerArgs,
    /// File holding the token (role `leader`) presented to worker daemons.
    #[arg(long, env = "MTSWARM_WORKER_TOKEN_FILE")]
    pub worker_token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the worker daemons' certificates.
    #[arg(long = "tls-ca", env = "MTSWARM_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Key of the result tokens (64 hex digits; `mtswarm credentials`
    /// writes one): a task result counts only with its attempt's token.
    #[arg(long, env = "MTSWARM_RESULT_KEY_FILE")]
    pub result_key_file: Option<PathBuf>,
    /// Key (nkey seed; `mtswarm credentials` writes `decision.nk`) the
    /// leader signs approval decisions with; workers verify them with its
    /// public key.
    #[arg(long, env = "MTSWARM_DECISION_KEY_FILE")]
    pub decision_key_file: Option<PathBuf>,
    /// This leader's id among the leaders sharing one NATS (default:
    /// unique per process). Give a restarted leader the same id (e.g. its
    /// pod name) to have it take its own jobs back at once.
    #[arg(long, env = "MTSWARM_LEADER_ID")]
    pub leader_id: Option<String>,
    /// Price table of model tokens (TOML: `[prices."MODEL"]` with
    /// `prompt_per_million` and `completion_per_million`, optional
    /// `currency`): job outcomes then carry each agent's estimated cost.
    #[arg(long, env = "MTSWARM_PRICES")]
    pub prices: Option<PathBuf>,
    /// TTL of a job's ownership lease, whole seconds: another leader takes
    /// over the jobs of a dead one within twice this.
    #[arg(long, env = "MTSWARM_JOB_LEASE_TTL", default_value_t = 10)]
    pub job_lease_ttl: u64,
    /// The model of the leader agents.
    #[command(flatten)]
    pub llm: LlmArgs,
}

/// Arguments of `mtswarm worker`: the bus, the board it serves, its gRPC
/// server, the session limits and the model.
#[derive(Debug, Args)]
pub struct WorkerCmd {
    /// The NATS servers and how to authenticate to them.
    #[command(flatten)]
    pub bus: NatsArgs,
    /// Replicas, storage and size limits of the streams and buckets.
    #[command(flatten)]
    pub topology: TopologyArgs,
    /// Fleet inventory (fleet.toml).
    #[arg(long, env = "MTSWARM_FLEET")]
    pub fleet: PathBuf,
    /// The board of the fleet this daemon serves.
    #[arg(long, env = "MTSWARM_BOARD")]
    pub board: String,
    /// Worker id (default `worker-<board>`).
    #[arg(long, env = "MTSWARM_WORKER_ID")]
    pub worker_id: Option<String>,
    /// gRPC listen address (port 0 picks a free port).
    #[arg(long, env = "MTSWARM_WORKER_LISTEN", default_value = "127.0.0.1:7701")]
    pub listen: SocketAddr,
    /// Endpoint the leader uses to reach this daemon (default: the bound address).
    #[arg(long, env = "MTSWARM_ADVERTISE")]
    pub advertise: Option<String>,
    /// Directory that task kernel paths are relative to.
    #[arg(long, env = "MTSWARM_KERNEL_ROOT", default_value = ".")]
    pub kernel_root: PathBuf,
    /// Where sessions get their workspaces (default: a directory under the system temp dir).
    #[arg(long, env = "MTSWARM_WORKSPACE_ROOT")]
    pub workspace_root: Option<PathBuf>,
    /// How long a finished session's workspace (kernel copies, builds) is
    /// kept after its last change, e.g. `30m`, `24h`, `7days` (default 24h).
    #[arg(long, env = "MTSWARM_WORKSPACE_RETENTION", value_parser = mtswarm_worker::parse_retention)]
    pub workspace_retention: Option<Duration>,
    /// Bytes the workspace root may hold, e.g. `10GiB`, `500MB` or plain
    /// bytes; at or over it new sessions are refused (default: no quota).
    #[arg(long, env = "MTSWARM_DISK_QUOTA", value_parser = mtswarm_worker::parse_disk_quota)]
    pub disk_quota: Option<u64>,
    /// Slice lease TTL in seconds.
    #[arg(long, env = "MTSWARM_LEASE_TTL", default_value_t = 10)]
    pub lease_ttl: u64,
    /// Sessions this daemon runs at once.
    #[arg(long, env = "MTSWARM_MAX_SESSIONS")]
    pub max_sessions: Option<usize>,
    /// Failed hardware runs in a row (crash, timeout, wrong answer) that
    /// quarantine a slice; 0 = never.
    #[arg(long, env = "MTSWARM_QUARANTINE_AFTER", default_value_t = 3)]
    pub quarantine_after: u32,
    /// Largest task `parameters_json` accepted, in bytes (default 262144).
    #[arg(long, env = "MTSWARM_MAX_TASK_PARAMETERS_BYTES")]
    pub max_task_parameters_bytes: Option<usize>,
    /// Largest task `instructions` accepted, in bytes (default 65536).
    #[arg(long, env = "MTSWARM_MAX_TASK_INSTRUCTIONS_BYTES")]
    pub max_task_instructions_bytes: Option<usize>,
    /// Seconds a paused tool call waits for a decision before it is denied.
    #[arg(long, env = "MTSWARM_APPROVAL_TIMEOUT")]
    pub approval_timeout: Option<u64>,
    /// The leader's public decision key (`N...`, `decision.pub` of
    /// `mtswarm credentials`): only decisions it signed are applied.
    #[arg(
        long,
        env = "MTSWARM_LEADER_PUBLIC_KEY",
        conflicts_with = "leader_public_key_file"
    )]
    pub leader_public_key: Option<String>,
    /// File holding the leader's public decision key (`decision.pub`).
    #[arg(long, env = "MTSWARM_LEADER_PUBLIC_KEY_FILE")]
    pub leader_public_key_file: Option<PathBuf>,
    /// Drive every session from this recorded model cassette (tests, demos).
    #[arg(long, env = "MTSWARM_LLM_REPLAY")]
    pub llm_replay: Option<PathBuf>,
    /// Write `{"grpc": URL, "worker_id": ID}` here once serving.
    #[arg(long, env = "MTSWARM_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR/metrics (port 0 picks a
    /// free port); without it metrics go only where the OTLP variables say.
    #[arg(long, env = "MTSWARM_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Who may call the Worker server (the leader) and its TLS certificate.
    #[command(flatten)]
    pub grpc: GrpcServerArgs,
    /// The model of the worker agents.
    #[command(flatten)]
    pub llm: LlmArgs,
}

/// Resolves when the process is asked to stop (Ctrl-C / SIGINT or SIGTERM).
pub(crate) async fn stop_requested() -> &'static str {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The bus settings of `--nats` (comma-separated URLs, blanks dropped) and
/// `--nats-creds` for a connection named `name`; an error when no URL is left.
pub(crate) fn bus_config(
    nats: &[String],
    creds: &Option<PathBuf>,
    name: &str,
) -> anyhow::Result<mtswarm_bus::BusConfig> {
    let servers: Vec<String> = nats
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let Some(first) = servers.first() else {
        anyhow::bail!("--nats (MTSWARM_NATS_URL) is empty");
    };
    let mut config = mtswarm_bus::BusConfig::new(first.clone()).with_name(name);
    config.servers = servers;
    config.credentials_file = creds.clone();
    Ok(config)
}

/// `mtswarm leader`: runs the leader daemon until SIGINT/SIGTERM, then shuts
/// it down and flushes traces. Exit 0 after a requested stop.
pub(crate) async fn leader(cmd: LeaderCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
    let mut guard = telemetry.init("mtswarm-leader")?;
    let metrics = DaemonMetrics::start(telemetry, "mtswarm-leader", cmd.metrics_addr).await?;
    if !cmd.kernel_root.is_dir() {
        anyhow::bail!(
            "--kernel-root {} is not a directory",
            cmd.kernel_root.display()
        );
    }
    let kernel_root = cmd
        .kernel_root
        .canonicalize()
        .with_context(|| format!("resolving {}", cmd.kernel_root.display()))?;
    let mut config = LeaderConfig::new(DEFAULT_NATS, kernel_root);
    config.bus = bus_config(&cmd.bus.nats, &cmd.bus.nats_creds, "mtswarm-leader")?;
    cmd.bus.nats_security.apply(&mut config.bus)?;
    config.topology = cmd.topology.topology();
    config.grpc_addr = cmd.listen;
    config.max_active_jobs = cmd.max_active_jobs;
    config.max_queued_jobs = cmd.max_queued_jobs;
    config.grpc_max_message_bytes = cmd.grpc_max_message_bytes;
    if let Some(leader_id) = &cmd.leader_id {
        config.leader_id = leader_id.clone();
    }
    config.job_lease_ttl = Duration::from_secs(cmd.job_lease_ttl);
    config.security = cmd.grpc.security()?;
    let mut worker_auth = mtswarm_auth::ClientAuth::none();
    if let Some(path) = &cmd.worker_token_file {
        worker_auth = worker_auth.with_token_file(path)?;
    }
    if let Some(path) = &cmd.tls_ca {
        worker_auth = worker_auth.with_ca_file(path)?;
    }
    config.worker_auth = worker_auth;
    config.result_key = cmd
        .result_key_file
        .as_deref()
        .map(mtswarm_auth::ResultKey::load)
        .transpose()?;
    config.decision_key = cmd
        .decision_key_file
        .as_deref()
        .map(mtswarm_auth::DecisionSigner::load)
        .transpose()?;
    if config.decision_key.is_none() {
        tracing::warn!(
            "no --decision-key-file: approval decisions are unsigned and workers that verify them drop them"
        );
    }
    let api_key = cmd.llm.api_key("leader")?;
    if let Some((url, model)) = cmd.llm.endpoint()? {
        let mut llm = OpenAiConfig::new(url, model)
            .with_tool_mode(cmd.llm.llm_tool_mode.mode())
            .with_context_tokens(cmd.llm.llm_context_tokens)
            .with_extra_body(cmd.llm.extra_body()?)?;
        if let Some(timeout) = cmd.llm.timeout()? {
            llm = llm.with_request_timeout(timeout);
        }
        if let Some(key) = api_key {
            llm = llm.with_api_key(key);
        }
        config.llm = Some(llm);
    }
    config.model_endpoints = cmd.llm.model_endpoints.clone();
    config.context_placement = cmd.llm.llm_context_in.placement();
    if let Some(path) = &cmd.prices {
        config.prices = mtswarm_leader::PriceTable::load(path)?;
    }
    let handle = LeaderDaemon::start(config)
        .await
        .context("starting the leader")?;
    let url = handle.grpc_url();
    tracing::info!("listening on {}", handle.grpc_addr());
    if let Some(path) = &cmd.ready_file {
        let mut ready = json!({ "grpc": url });
        if let Some(metrics_url) = metrics.url() {
            ready["metrics"] = json!(metrics_url);
        }
        write_atomically(path, &ready.to_string())?;
    }
    let signal = stop_requested().await;
    tracing::info!(signal, "shutting down the leader");
    if let Err(error) = handle.shutdown().await {
        tracing::warn!(%error, "leader shutdown was not clean");
    }
    metrics.shutdown().await;
    if let Err(error) = guard.shutdown() {
        eprintln!("mtswarm: flushing traces: {error}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `mtswarm worker`: runs one board's worker daemon until SIGINT/SIGTERM.
/// Exit 0 after a requested stop.
pub(crate) async fn worker(cmd: WorkerCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
    let mut guard = telemetry.init("mtswarm-worker")?;
    let metrics = DaemonMetrics::start(telemetry, "mtswarm-worker", cmd.metrics_addr).await?;
    // Sessions read the key from the environment or its file; a key on the
    // command line is refused.
    cmd.llm.api_key("worker")?;
    let mut config = WorkerConfig::new(cmd.fleet.clone(), cmd.board.clone());
    let bus = bus_config(&cmd.bus.nats, &cmd.bus.nats_creds, "mtswarm-worker")?;
    config.nats_urls = bus.servers;
    config.nats_credentials = cmd.bus.nats_creds.clone();
    config.nats_nkey_file = cmd.bus.nats_security.nats_nkey_file.clone();
    config.nats_tls = cmd.bus.nats_security.tls();
    config.topology = cmd.topology.topology();
    config.worker_id = cmd.worker_id.clone();
    config.listen = cmd.listen;
    config.advertise_endpoint = cmd.advertise.clone().filter(|a| !a.trim().is_empty());
    config.kernel_root = cmd.kernel_root.clone();
    if let Some(root) = &cmd.workspace_root {
        config.workspace_root = root.clone();
    }
    if let Some(retention) = cmd.workspace_retention {
        config.workspace_retention = retention;
    }
    config.disk_quota_bytes = cmd.disk_quota;
    config.lease_ttl = Duration::from_secs(cmd.lease_ttl);
    if let Some(max) = cmd.max_sessions {
        config.max_sessions = max;
    }
    config.quarantine_after = cmd.quarantine_after;
    if let Some(max) = cmd.max_task_parameters_bytes {
        config.max_task_parameters_bytes = max;
    }
    if let Some(max) = cmd.max_task_instructions_bytes {
        config.max_task_instructions_bytes = max;
    }
    if let Some(seconds) = cmd.approval_timeout {
        config.approval_timeout = Duration::from_secs(seconds);
    }
    config.leader_key = match (&cmd.leader_public_key, &cmd.leader_public_key_file) {
        (Some(key), _) => Some(mtswarm_auth::DecisionVerifier::from_public_key(key)?),
        (None, Some(path)) => Some(mtswarm_auth::DecisionVerifier::load(path)?),
        (None, None) => None,
    };
    config.ready_file = cmd.ready_file.clone();
    config.metrics_url = metrics.url();
    config.security = cmd.grpc.security()?;
    config.model_endpoints = cmd.llm.model_endpoints.clone();
    config.context_placement = cmd.llm.llm_context_in.placement();
    config.llm_tool_mode = cmd.llm.llm_tool_mode.mode();
    config.llm_extra_body = cmd.llm.extra_body()?;
    config.llm_request_timeout = cmd.llm.timeout()?;
    config.llm_context_tokens = cmd.llm.llm_context_tokens.filter(|t| *t > 0);
    config.llm_api_key_file = cmd.llm.llm_api_key_file.clone();
    config.model = match (&cmd.llm_replay, cmd.llm.endpoint()?) {
        (Some(path), _) => WorkerModel::Replay(path.clone()),
        (None, Some((base_url, model))) => WorkerModel::OpenAi { base_url, model },
        (None, None) => WorkerModel::Builtin,
    };
    let handle = WorkerDaemon::start(config)
        .await
        .context("starting the worker daemon")?;
    tracing::info!(worker_id = %handle.worker_id(), "listening on {}", handle.grpc_addr());
    let signal = stop_requested().await;
    tracing::info!(signal, "shutting down the worker daemon");
    if let Err(error) = handle.shutdown().await {
        tracing::warn!(%error, "worker shutdown was not clean");
    }
    metrics.shutdown().await;
    if let Err(error) = guard.shutdown() {
        eprintln!("mtswarm: flushing traces: {error}");
    }
    Ok(ExitCode::SUCCESS)
}
