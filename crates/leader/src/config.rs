//! How a leader daemon is configured: where NATS is, where to listen, where
//! kernels live, the limits SubmitJob enforces, and which model drives each
//! job's leader loop (a factory, so tests can inject a scripted model and
//! deployments an OpenAI-compatible endpoint).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_auth::{ClientAuth, ModelEndpoints, ServerSecurity};
use mtswarm_bus::{BusConfig, TopologyConfig, v1};
use mtswarm_core::{AutoApprove, ChatModel, InjectionPlacement};
use mtswarm_llm::{OpenAiClient, OpenAiConfig};

use crate::error::ModelFactoryError;
use mtswarm_policy::BuiltinLeaderPolicy;

/// Builds the model that drives one job's leader loop. Gets the job's spec;
/// an `Err` fails the job with that message.
pub type ModelFactory =
    Arc<dyn Fn(&v1::JobSpec) -> Result<Arc<dyn ChatModel>, ModelFactoryError> + Send + Sync>;

/// Bounds SubmitJob enforces (each violation is an INVALID_ARGUMENT naming it).
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitLimits {
    /// Longest goal text, in bytes.
    pub max_goal_bytes: usize,
    /// Largest single `@path` attachment, in bytes.
    pub max_attachment_bytes: u64,
    /// Largest sum of all attachments of one job, in bytes.
    pub max_total_attachment_bytes: u64,
    /// Most `@path` references in one goal.
    pub max_attachments: usize,
    /// Largest `Budgets.max_steps` a job may ask for.
    pub max_steps: u32,
    /// Largest `Budgets.wall_time_seconds` a job may ask for, in seconds.
    pub max_wall_time_seconds: u64,
    /// Largest `Budgets.device_seconds` a job may ask for, in seconds.
    pub max_device_seconds: f64,
    /// Largest `JobSpec.num_agents`.
    pub max_agents: u32,
}

impl Default for SubmitLimits {
    fn default() -> Self {
        Self {
            max_goal_bytes: 64 * 1024,
            max_attachment_bytes: 256 * 1024,
            max_total_attachment_bytes: 1024 * 1024,
            max_attachments: 16,
            max_steps: 10_000,
            max_wall_time_seconds: 7 * 24 * 3600,
            max_device_seconds: 7.0 * 24.0 * 3600.0,
            max_agents: 1024,
        }
    }
}

/// Everything [`crate::LeaderDaemon::start`] needs.
#[derive(Clone)]
pub struct LeaderConfig {
    /// NATS connection settings.
    pub bus: BusConfig,
    /// Streams and buckets created at start (idempotent).
    pub topology: TopologyConfig,
    /// gRPC listen address; port 0 picks a free port (see [`crate::LeaderHandle::grpc_addr`]).
    pub grpc_addr: SocketAddr,
    /// Largest gRPC message the `Control` server decodes or encodes, in
    /// bytes (default 16 MiB; at least 64 KiB). A larger request is refused
    /// by the server with OUT_OF_RANGE ("decoded message length too large")
    /// before any handler runs; SubmitJob's own limits (goal, attachments)
    /// are far below it.
    pub grpc_max_message_bytes: usize,
    /// Directory that `JobSpec.kernel_dir` is relative to.
    pub kernel_root: PathBuf,
    /// Prefix of the durable name of the leader's result consumer
    /// (`results-<name>-<leader_id>`, see [`LeaderConfig::result_consumer`]).
    pub result_consumer_name: String,
    /// This leader's id among the leaders on one NATS (`[A-Za-z0-9_-]`, at
    /// most 64 characters). Default: unique per process. A deployment that
    /// restarts a leader under a stable id (e.g. its pod name) lets it take
    /// its own jobs back at once and keep its durable result consumer.
    pub leader_id: String,
    /// TTL of a job's ownership lease (whole seconds, at least 1 s): a job
    /// whose owner died is taken over by another leader within 2x this.
    pub job_lease_ttl: Duration,
    /// Bounds every SubmitJob request is checked against.
    pub limits: SubmitLimits,
    /// Model of each job's leader loop; `None` = [`LeaderConfig::default_model_factory`]
    /// with [`LeaderConfig::llm`].
    pub model_factory: Option<ModelFactory>,
    /// OpenAI-compatible endpoint for the leader loop; `None` = builtin policy
    /// (unless the job names a model in `JobSpec.model`).
    pub llm: Option<OpenAiConfig>,
    /// Where each model request carries the per-step session context.
    pub context_placement: InjectionPlacement,
    /// Which risks the leader loop runs without asking (spawn_agent and
    /// cancel_agent are medium).
    pub auto_approve: AutoApprove,
    /// `collect_result` timeout when the model gives none.
    pub default_collect_timeout: Duration,
    /// Longest `collect_result` timeout a model may ask for (longer requests
    /// are cut to it).
    pub max_collect_timeout: Duration,
    /// Deadline given to tasks when the job sets no wall time.
    pub default_task_deadline: Duration,
    /// Timeout of each call to a worker daemon's gRPC service.
    pub worker_call_timeout: Duration,
    /// Leader loop step limit when the job sets none.
    pub default_max_steps: u32,
    /// Jobs whose leader loops run at once; further accepted jobs wait QUEUED.
    pub max_active_jobs: usize,
    /// QUEUED jobs waiting for a slot (started in submission order); SubmitJob
    /// beyond this fails with RESOURCE_EXHAUSTED naming the limit.
    pub max_queued_jobs: usize,
    /// Lease TTL the reassigner assumes until it has seen a lease record
    /// (afterwards the smallest `ttl_seconds` of the records is used). The
    /// periodic lease sweep runs every TTL / 2.
    pub default_lease_ttl: Duration,
    /// A worker record whose `heartbeat_at` is older than this is stale: its
    /// slices are OFFLINE (the KV TTL normally removes such records sooner).
    pub worker_stale_after: Duration,
    /// Who may call `Control` (identities file) and its TLS certificate;
    /// the default accepts anonymous plaintext calls (library tests only:
    /// `mtswarm leader` and `mtswarm up` configure both).
    pub security: ServerSecurity,
    /// The token (role `leader`) and CA the leader uses to call the worker
    /// daemons' `Worker` service.
    pub worker_auth: ClientAuth,
    /// Key of the result tokens ([`mtswarm_auth::ResultKey`]): with it a
    /// result counts only with its attempt's token (forgeries are dropped
    /// and counted); `None` = results are not checked (library tests).
    pub result_key: Option<mtswarm_auth::ResultKey>,
    /// Key the leader signs every approval decision with
    /// ([`mtswarm_auth::DecisionSigner`]); workers configured with its
    /// public key apply only signed decisions. `None` = decisions are
    /// unsigned (library tests).
    pub decision_key: Option<mtswarm_auth::DecisionSigner>,
    /// Model endpoints a job may name in `JobSpec.model.base_url` (the
    /// daemon's own endpoint, `llm` or `MTSWARM_LLM_URL`, is always
    /// allowed and the only one that gets the API key). Empty: a job may
    /// name none.
    pub model_endpoints: Vec<String>,
    /// What model tokens cost (`--prices`): the outcome's estimated cost
    /// per agent and job. Empty: tokens are reported without a cost.
    pub prices: crate::prices::PriceTable,
}

impl LeaderConfig {
    /// A configuration with defaults for everything but NATS and the kernel root.
    pub fn new(nats_url: impl Into<String>, kernel_root: impl Into<PathBuf>) -> Self {
        Self {
            bus: BusConfig::new(nats_url).with_name("mtswarm-leader"),
            topology: TopologyConfig::default(),
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc_max_message_bytes: 16 * 1024 * 1024,
            kernel_root: kernel_root.into(),
            result_consumer_name: "leader".to_string(),
            leader_id: format!(
                "leader-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            job_lease_ttl: Duration::from_secs(10),
            limits: SubmitLimits::default(),
            model_factory: None,
            llm: None,
            context_placement: InjectionPlacement::default(),
            auto_approve: AutoApprove::UpToMedium,
            default_collect_timeout: Duration::from_secs(600),
            max_collect_timeout: Duration::from_secs(6 * 3600),
            default_task_deadline: Duration::from_secs(3600),
            worker_call_timeout: Duration::from_secs(15),
            default_max_steps: 60,
            max_active_jobs: 16,
            max_queued_jobs: 256,
            default_lease_ttl: Duration::from_secs(10),
            worker_stale_after: Duration::from_secs(60),
            security: ServerSecurity::default(),
            worker_auth: ClientAuth::none(),
            result_key: None,
            decision_key: None,
            model_endpoints: Vec::new(),
            prices: crate::prices::PriceTable::default(),
        }
    }

    /// The name of this leader's durable result consumer:
    /// `<result_consumer_name>-<leader_id>`. One per leader, so every
    /// leader sees every result (a shared name would split them between
    /// the leaders) and each keeps the ones of the jobs it owns.
    pub fn result_consumer(&self) -> String {
        format!("{}-{}", self.result_consumer_name, self.leader_id)
    }

    /// Inject the model of every job's leader loop (tests: `ScriptedModel`).
    pub fn with_model_factory(mut self, factory: ModelFactory) -> Self {
        self.model_factory = Some(factory);
        self
    }

    /// The factory in effect: the injected one, or the default.
    pub fn effective_model_factory(&self) -> ModelFactory {
        match &self.model_factory {
            Some(factory) => factory.clone(),
            None => Self::default_model_factory(self.llm.clone(), self.endpoints()),
        }
    }

    /// The allowlist in effect: `model_endpoints` plus the daemon's own
    /// endpoint.
    pub fn endpoints(&self) -> ModelEndpoints {
        let own = match &self.llm {
            Some(llm) => Some(llm.base_url.clone()),
            None => std::env::var(mtswarm_llm::openai::ENV_URL).ok(),
        };
        ModelEndpoints::new(self.model_endpoints.clone(), own.as_deref())
    }

    /// `llm` when configured; else an OpenAI-compatible client when the job
    /// names a model (`JobSpec.model.model`, with its base URL or the
    /// `MTSWARM_LLM_URL` environment); else [`BuiltinLeaderPolicy`].
    /// A job's base URL must pass `endpoints`, and the API key goes only to
    /// the daemon's own endpoint.
    pub fn default_model_factory(
        llm: Option<OpenAiConfig>,
        endpoints: ModelEndpoints,
    ) -> ModelFactory {
        Arc::new(move |spec: &v1::JobSpec| {
            if let Some(config) = &llm {
                let client =
                    OpenAiClient::new(config.clone()).map_err(ModelFactoryError::Client)?;
                return Ok(Arc::new(client) as Arc<dyn ChatModel>);
            }
            if let Some(settings) = spec.model.as_ref().filter(|m| !m.model.is_empty()) {
                // The job's URL (from the allowlist) and model over the
                // daemon's environment, which supplies the API key only for
                // the daemon's own endpoint: a key never travels in a
                // JobSpec, nor to an endpoint a job chose.
                let job_url = settings.base_url.trim();
                if !job_url.is_empty() {
                    endpoints
                        .check(job_url)
                        .map_err(ModelFactoryError::Endpoint)?;
                }
                let url = if job_url.is_empty() {
                    std::env::var(mtswarm_llm::openai::ENV_URL)
                        .or_else(|_| std::env::var(mtswarm_llm::openai::ENV_OPENAI_BASE_URL))
                        .unwrap_or_default()
                } else {
                    job_url.to_string()
                };
                let key_allowed = endpoints.key_goes_to(&url);
                let config = OpenAiConfig::from_lookup(|name| match name {
                    mtswarm_llm::openai::ENV_MODEL => Some(settings.model.clone()),
                    mtswarm_llm::openai::ENV_URL => Some(url.clone()),
                    // Key and extra body fields belong to the daemon's
                    // own endpoint.
                    mtswarm_llm::openai::ENV_API_KEY
                    | mtswarm_llm::openai::ENV_OPENAI_API_KEY
                    | mtswarm_llm::openai::ENV_EXTRA_BODY
                        if !key_allowed =>
                    {
                        None
                    }
                    other => std::env::var(other).ok(),
                })
                .map_err(|source| ModelFactoryError::JobEndpoint {
                    model: settings.model.clone(),
                    source,
                })?;
                let client = OpenAiClient::new(config).map_err(ModelFactoryError::Client)?;
                return Ok(Arc::new(client) as Arc<dyn ChatModel>);
            }
            Ok(Arc::new(BuiltinLeaderPolicy::new()) as Arc<dyn ChatModel>)
        })
    }
}

impl std::fmt::Debug for LeaderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderConfig")
            .field("bus", &self.bus.servers)
            .field("grpc_addr", &self.grpc_addr)
            .field("kernel_root", &self.kernel_root)
            .field("model_factory", &self.model_factory.is_some())
            .field("llm", &self.llm.as_ref().map(|c| (&c.base_url, &c.model)))
            .finish_non_exhaustive()
    }
}
