//! What a worker daemon is told at start: which board of which fleet it owns,
//! where NATS is, where to listen, where kernels and workspaces live, and
//! how its sessions choose a model. Every field is public with a default so
//! the CLI can fill it from flags; [`WorkerConfig::validate`] names the first
//! problem it finds.
//!
//! | flag (suggested) | field | default |
//! |---|---|---|
//! | `--nats URL` (repeatable) | `nats_urls` | `nats://127.0.0.1:4222` |
//! | `--nats-creds FILE` | `nats_credentials` | none |
//! | `--nats-replicas N`, `--nats-storage`, `--nats-*-max-bytes` | `topology` | 1 replica, file, 1 GiB events, 4 GiB measurements |
//! | `--fleet FILE` | `fleet_file` | (required) |
//! | `--board ID` | `board` | (required) |
//! | `--worker-id ID` | `worker_id` | `worker-<board>` |
//! | `--listen ADDR` | `listen` | `127.0.0.1:0` |
//! | `--advertise URL` | `advertise_endpoint` | `http://<bound address>` |
//! | `--kernel-root DIR` | `kernel_root` | `.` |
//! | `--workspace-root DIR` | `workspace_root` | `$TMPDIR/mtswarm-workspaces` |
//! | `--workspace-retention DURATION` | `workspace_retention` | 24 h |
//! | `--disk-quota SIZE` | `disk_quota_bytes` | none |
//! | `--lease-ttl SECS` | `lease_ttl` | 10 s |
//! | `--max-sessions N` | `max_sessions` | 64 |
//! | `--quarantine-after N` | `quarantine_after` | 3 (0 = never) |
//! | `--max-task-parameters-bytes N` | `max_task_parameters_bytes` | 262144 |
//! | `--max-task-instructions-bytes N` | `max_task_instructions_bytes` | 65536 |
//! | `--approval-timeout SECS` | `approval_timeout` | 600 s |
//! | `--approval-default approve\|deny` | `approval_default` | deny |
//! | `--leader-public-key KEY` | `leader_key` | none (decisions unverified) |
//! | `--llm-url URL --model NAME` | `model = WorkerModel::OpenAi` | builtin policy |
//! | `--llm-replay FILE` | `model = WorkerModel::Replay` | builtin policy |
//! | `--ready-file FILE` | `ready_file` | none |
//!
//! Limits: `max_sessions` caps the sessions of one daemon (one per slice at
//! most, so it matters only for boards with many slices); SpawnSession
//! beyond it fails with RESOURCE_EXHAUSTED. A task whose `parameters_json`
//! or `instructions` is larger than its limit ends at once with a FAILED
//! result whose error names the limit (`max_task_parameters_bytes`,
//! `max_task_instructions_bytes`). `quarantine_after` consecutive failed
//! hardware runs on a slice (crash, timeout, wrong answer) quarantine it.
//! Finished sessions' workspaces are removed `workspace_retention` after
//! their last change; with `disk_quota_bytes`, SpawnSession fails with
//! RESOURCE_EXHAUSTED while the workspace root uses the whole quota (see
//! `crate::janitor`).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::{ChatModel, InjectionPlacement};
use mtswarm_hw::measure::MeasureConfig;

use crate::error::WorkerError;

/// Builds the model of one session (tests inject scripted models this way).
pub type ModelFactory = Arc<dyn Fn(&SessionModelContext) -> Arc<dyn ChatModel> + Send + Sync>;

/// What a [`ModelFactory`] knows about the session it builds a model for.
#[derive(Debug, Clone)]
pub struct SessionModelContext {
    /// Session id the leader chose in `SpawnSessionRequest.session_id`.
    pub session_id: String,
    /// Job the session works for.
    pub job_id: String,
    /// Agent the session runs, unique within the job.
    pub agent_id: String,
    /// Agent role from the request (e.g. `tuner`, `analyst`); may be empty.
    pub role: String,
}

/// How sessions get their model when SpawnSession names none.
#[derive(Clone, Default)]
pub enum WorkerModel {
    /// [`mtswarm_policy::BuiltinWorkerPolicy`] (the default).
    #[default]
    Builtin,
    /// An OpenAI-compatible endpoint for every session without its own
    /// `ModelSettings` (API key from [`WorkerConfig::llm_api_key_env`]).
    OpenAi {
        /// Endpoint root (`--llm-url`); requests go to
        /// `{base_url}/chat/completions`. The only endpoint that receives
        /// the API key.
        base_url: String,
        /// Model name sent in each request (`--model`).
        model: String,
    },
    /// Replay a recorded cassette (`--llm-replay FILE`), one fresh replay per
    /// session, requests not compared. Overrides `ModelSettings`.
    Replay(PathBuf),
    /// A caller-supplied factory. Overrides `ModelSettings`.
    Factory(ModelFactory),
}

impl fmt::Debug for WorkerModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Builtin => f.write_str("Builtin"),
            Self::OpenAi { base_url, model } => f
                .debug_struct("OpenAi")
                .field("base_url", base_url)
                .field("model", model)
                .finish(),
            Self::Replay(path) => f.debug_tuple("Replay").field(path).finish(),
            Self::Factory(_) => f.write_str("Factory(..)"),
        }
    }
}

/// Verdict applied to an approval nobody decided within the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DefaultVerdict {
    /// The call is denied with the reason "approval timed out" (the default).
    #[default]
    Deny,
    /// The call runs as if approved.
    Approve,
}

/// Everything a worker daemon needs. Start from [`WorkerConfig::new`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// NATS server URLs (`--nats`).
    pub nats_urls: Vec<String>,
    /// NATS credentials file (`--nats-creds`).
    pub nats_credentials: Option<PathBuf>,
    /// File holding this daemon's NATS nkey seed (`--nats-nkey-file`). With
    /// it the daemon is a confined identity: its replies use the inbox
    /// prefix its permissions allow and it does not create streams or
    /// buckets (the leader does).
    pub nats_nkey_file: Option<PathBuf>,
    /// TLS settings of the NATS connection (`--nats-tls-ca`, ...).
    pub nats_tls: mtswarm_bus::config::TlsConfig,
    /// Shape of the streams and buckets (`--nats-replicas`, `--nats-storage`,
    /// size limits): created at start unless the daemon is a confined
    /// identity, whose record limits it still applies.
    pub topology: mtswarm_bus::TopologyConfig,
    /// The fleet file (`--fleet`).
    pub fleet_file: PathBuf,
    /// The board of the fleet this daemon owns (`--board`).
    pub board: String,
    /// Worker id; default `worker-<board>`. `[A-Za-z0-9_-]{1,128}`.
    pub worker_id: Option<String>,
    /// gRPC bind address (`--listen`), port 0 allowed.
    pub listen: SocketAddr,
    /// Endpoint advertised in the WorkerRecord; default `http://<bound address>`
    /// (with 127.0.0.1 when bound to an unspecified address).
    pub advertise_endpoint: Option<String>,
    /// Root of the kernel directories tasks name (`--kernel-root`).
    pub kernel_root: PathBuf,
    /// Root under which each session gets its workspace (`--workspace-root`).
    pub workspace_root: PathBuf,
    /// How long the workspace of a finished session is kept after its last
    /// change (`--workspace-retention`), at least 1 s. The janitor runs
    /// every quarter of it, between 500 ms and a minute.
    pub workspace_retention: Duration,
    /// Bytes the workspace root may hold (`--disk-quota`); at or over it
    /// SpawnSession fails with RESOURCE_EXHAUSTED. `None` = no quota. The
    /// figure is measured by the janitor, so it lags by at most one pass.
    pub disk_quota_bytes: Option<u64>,
    /// Where the emulator caches its runtime; default: the emulator's own default.
    pub emulator_cache_dir: Option<PathBuf>,
    /// Slice lease TTL (`--lease-ttl`), whole seconds, >= 1 s. Renewed every third.
    pub lease_ttl: Duration,
    /// TTL of the WorkerRecord; renewed every third.
    pub worker_ttl: Duration,
    /// Sessions at once (RESOURCE_EXHAUSTED beyond).
    pub max_sessions: usize,
    /// Consecutive failed hardware runs (crash, timeout, wrong answer) that
    /// quarantine a slice; 0 = never (`--quarantine-after`).
    pub quarantine_after: u32,
    /// Largest `TaskAssignment.parameters_json` accepted, in bytes.
    pub max_task_parameters_bytes: usize,
    /// Largest `TaskAssignment.instructions` accepted, in bytes.
    pub max_task_instructions_bytes: usize,
    /// A session that gets no task for this long ends and frees its slice.
    pub session_idle_timeout: Duration,
    /// Ack wait of the task consumers (progress is reported every third).
    pub task_ack_wait: Duration,
    /// Deliveries of a task before JetStream gives up on it.
    pub task_max_deliver: i64,
    /// How long a paused call waits for a decision.
    pub approval_timeout: Duration,
    /// Where each model request carries the per-step session context.
    pub context_placement: InjectionPlacement,
    /// How tools reach the daemon's own endpoint (`--llm-tool-mode`).
    pub llm_tool_mode: mtswarm_llm::ToolMode,
    /// Fields merged into every request to the daemon's own endpoint
    /// (`--llm-extra-body`; checked by `mtswarm_llm::openai::parse_extra_body`).
    pub llm_extra_body: serde_json::Map<String, serde_json::Value>,
    /// Wait for the daemon's own endpoint's response headers and between
    /// stream pieces (`--llm-timeout-secs`); `None`: the client's default.
    pub llm_request_timeout: Option<Duration>,
    /// Tokens of context the daemon's own endpoint gives each request
    /// (`--llm-context-tokens`); `None`: as large as the engine assumes.
    pub llm_context_tokens: Option<u64>,
    /// What an undecided call gets after the timeout.
    pub approval_default: DefaultVerdict,
    /// The leader's public decision key: with it only decisions the leader
    /// signed are applied (a forged record or message is dropped and
    /// logged); `None` = decisions are applied unverified (a warning at
    /// start-up; library tests and standalone development).
    pub leader_key: Option<mtswarm_auth::DecisionVerifier>,
    /// Default grace of Drain (when the request gives 0).
    pub drain_grace: Duration,
    /// Longest `shutdown()` waits for sessions to stop.
    pub shutdown_timeout: Duration,
    /// Model steps per task when the task's budget sets none.
    pub default_max_steps: u32,
    /// Evidence kinds an answer needs to count as verified (flagged, not
    /// refused, when missing).
    pub require_evidence: Vec<String>,
    /// The sessions' model when SpawnSession names none (`--llm-replay`, ...).
    pub model: WorkerModel,
    /// Environment variable holding the API key for OpenAI-compatible models.
    pub llm_api_key_env: String,
    /// Measurement defaults of the benchmark tool.
    pub measure: MeasureConfig,
    /// Write `{"grpc":..., "worker_id":...}` here once serving (`--ready-file`).
    pub ready_file: Option<PathBuf>,
    /// The process's Prometheus scrape URL (`--metrics-addr`), announced
    /// in the ready file as `metrics`.
    pub metrics_url: Option<String>,
    /// Who may call the `Worker` service (only identities with the
    /// `leader` role) and its TLS certificate; the default accepts
    /// anonymous plaintext calls (library tests only).
    pub security: mtswarm_auth::ServerSecurity,
    /// Model endpoints a SpawnSession may name (`--model-endpoint`); the
    /// daemon's own (`WorkerModel::OpenAi`) is always allowed and the only
    /// one that gets the API key.
    pub model_endpoints: Vec<String>,
    /// File with the API key (instead of the `llm_api_key_env` variable).
    pub llm_api_key_file: Option<PathBuf>,
}

impl WorkerConfig {
    /// Defaults for one board of a fleet file, NATS on localhost.
    pub fn new(fleet_file: impl Into<PathBuf>, board: impl Into<String>) -> Self {
        let tmp = std::env::temp_dir();
        Self {
            nats_urls: vec!["nats://127.0.0.1:4222".to_owned()],
            nats_credentials: None,
            nats_nkey_file: None,
            nats_tls: mtswarm_bus::config::TlsConfig::default(),
            topology: mtswarm_bus::TopologyConfig::default(),
            fleet_file: fleet_file.into(),
            board: board.into(),
            worker_id: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_endpoint: None,
            kernel_root: PathBuf::from("."),
            workspace_root: tmp.join("mtswarm-workspaces"),
            workspace_retention: Duration::from_secs(24 * 3600),
            disk_quota_bytes: None,
            emulator_cache_dir: None,
            lease_ttl: Duration::from_secs(10),
            worker_ttl: Duration::from_secs(10),
            max_sessions: 64,
            quarantine_after: 3,
            max_task_parameters_bytes: 256 * 1024,
            max_task_instructions_bytes: 64 * 1024,
            session_idle_timeout: Duration::from_secs(30 * 60),
            task_ack_wait: Duration::from_secs(30),
            task_max_deliver: 5,
            approval_timeout: Duration::from_secs(600),
            context_placement: InjectionPlacement::default(),
            llm_tool_mode: mtswarm_llm::ToolMode::Native,
            llm_extra_body: serde_json::Map::new(),
            llm_request_timeout: None,
            llm_context_tokens: None,
            approval_default: DefaultVerdict::Deny,
            leader_key: None,
            drain_grace: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(15),
            default_max_steps: 100,
            require_evidence: vec!["validate".to_owned(), "benchmark".to_owned()],
            model: WorkerModel::Builtin,
            llm_api_key_env: "MTSWARM_LLM_API_KEY".to_owned(),
            measure: MeasureConfig::default(),
            ready_file: None,
            metrics_url: None,
            security: mtswarm_auth::ServerSecurity::default(),
            model_endpoints: Vec::new(),
            llm_api_key_file: None,
        }
    }

    /// The worker id in use (configured or derived from the board).
    pub fn effective_worker_id(&self) -> String {
        match &self.worker_id {
            Some(id) => id.clone(),
            None => format!("worker-{}", sanitize_id(&self.board)),
        }
    }

    /// Checks the configuration; the error names the field and the problem.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let bad = |field: &'static str, reason: String| WorkerError::Config { field, reason };
        if self.nats_urls.is_empty() || self.nats_urls.iter().any(|u| u.trim().is_empty()) {
            return Err(bad(
                "nats_urls",
                "at least one non-empty NATS URL is needed".into(),
            ));
        }
        if self.board.trim().is_empty() {
            return Err(bad("board", "the board id is empty".into()));
        }
        if !self.fleet_file.is_file() {
            return Err(bad(
                "fleet_file",
                format!("{} is not a file", self.fleet_file.display()),
            ));
        }
        mtswarm_bus::subjects::validate_id("worker id", &self.effective_worker_id())
            .map_err(|e| bad("worker_id", e.to_string()))?;
        if !self.kernel_root.is_dir() {
            return Err(bad(
                "kernel_root",
                format!("{} is not a directory", self.kernel_root.display()),
            ));
        }
        if self.workspace_root.parent().is_none() {
            return Err(bad(
                "workspace_root",
                format!(
                    "{} is not a directory the daemon may clean up; give it a directory of its own",
                    self.workspace_root.display()
                ),
            ));
        }
        if self.workspace_retention < Duration::from_secs(1) {
            return Err(bad("workspace_retention", "must be at least 1 s".into()));
        }
        if self.disk_quota_bytes == Some(0) {
            return Err(bad(
                "disk_quota_bytes",
                "a quota of 0 bytes would refuse every session (leave it unset for no quota)"
                    .into(),
            ));
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(bad("lease_ttl", "must be at least 1 s".into()));
        }
        if self.worker_ttl < Duration::from_secs(1) {
            return Err(bad("worker_ttl", "must be at least 1 s".into()));
        }
        if self.max_sessions == 0 {
            return Err(bad("max_sessions", "must be at least 1".into()));
        }
        if self.max_task_parameters_bytes == 0 {
            return Err(bad(
                "max_task_parameters_bytes",
                "must be at least 1".into(),
            ));
        }
        if self.max_task_instructions_bytes == 0 {
            return Err(bad(
                "max_task_instructions_bytes",
                "must be at least 1".into(),
            ));
        }
        if self.task_ack_wait < Duration::from_secs(1) {
            return Err(bad("task_ack_wait", "must be at least 1 s".into()));
        }
        if self.task_max_deliver == 0 {
            return Err(bad(
                "task_max_deliver",
                "0 deliveries would never run a task (-1 = unlimited)".into(),
            ));
        }
        if self.approval_timeout.is_zero() {
            return Err(bad("approval_timeout", "must be positive".into()));
        }
        if self.session_idle_timeout.is_zero() {
            return Err(bad("session_idle_timeout", "must be positive".into()));
        }
        if self.default_max_steps == 0 {
            return Err(bad("default_max_steps", "must be at least 1".into()));
        }
        if let WorkerModel::Replay(path) = &self.model
            && !path.is_file()
        {
            return Err(bad(
                "model",
                format!("replay cassette {} is not a file", path.display()),
            ));
        }
        if let WorkerModel::OpenAi { base_url, model } = &self.model
            && (base_url.trim().is_empty() || model.trim().is_empty())
        {
            return Err(bad(
                "model",
                "an OpenAI-compatible model needs a base URL and a model name".into(),
            ));
        }
        Ok(())
    }
}

/// Map any text onto `[A-Za-z0-9_-]` (other characters become `-`).
pub(crate) fn sanitize_id(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}
