//! The leader's error type: what can go wrong starting or running the
//! daemon, each variant naming the part involved.

use std::net::SocketAddr;

/// Errors of [`crate::LeaderDaemon`].
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader configuration: {0}")]
    InvalidConfig(String),
    #[error("NATS: {0}")]
    Bus(#[from] mtswarm_bus::BusError),
    #[error("cannot bind the gRPC listener on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC reflection service: {0}")]
    Reflection(String),
    #[error("job event stream: {0}")]
    JobEvents(#[source] JournalError),
    #[error("gRPC server failed: {0}")]
    Server(String),
}

/// A source error of a NATS client call, kept for its chain.
pub type NatsSource = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the job event journal ([`crate::journal::Journal`]).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The job id cannot name a journal subject.
    #[error("{0}")]
    Subject(#[from] mtswarm_bus::BusError),
    /// The journal stream could not be created or updated.
    #[error("cannot create stream {stream}: {source}")]
    CreateStream {
        stream: &'static str,
        #[source]
        source: NatsSource,
    },
    /// A publish to the job's subject failed.
    #[error("publish to {subject}: {source}")]
    Publish {
        subject: String,
        #[source]
        source: NatsSource,
    },
    /// The stream did not acknowledge a confirmed append.
    #[error("publish to {subject} not acknowledged: {source}")]
    NotAcknowledged {
        subject: String,
        #[source]
        source: NatsSource,
    },
    /// The journal stream could not be opened.
    #[error("open stream {stream}: {source}")]
    OpenStream {
        stream: &'static str,
        #[source]
        source: NatsSource,
    },
    /// The ordered consumer of a watch could not be created.
    #[error("ordered consumer on {stream}: {source}")]
    Consumer {
        stream: &'static str,
        #[source]
        source: NatsSource,
    },
    /// Reading the next entry failed.
    #[error("reading {stream}: {source}")]
    Read {
        stream: &'static str,
        #[source]
        source: NatsSource,
    },
    /// An entry came without its stream metadata.
    #[error("journal message metadata: {0}")]
    Metadata(#[source] NatsSource),
    /// An entry is not a `JobEvent`.
    #[error("journal entry {sequence} is not a JobEvent: {source}")]
    Decode {
        sequence: u64,
        #[source]
        source: prost::DecodeError,
    },
}

/// A slice selector that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(#[from] pub mtswarm_hw::fleet::SelectorError);

/// Why a SubmitJob request (or a file of the kernel directory) is refused;
/// each variant names the field or path involved.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// A path that must be relative is absolute.
    #[error("{what} {path:?} must be relative")]
    NotRelative { what: &'static str, path: String },
    /// A path climbs out with `..` (or names a root).
    #[error("{what} {path:?} must not contain `..`")]
    ParentDir { what: &'static str, path: String },
    /// No kernel directory given.
    #[error("kernel_dir is empty: name a kernel directory under the kernel root")]
    EmptyKernelDir,
    /// The kernel directory is not a directory under the kernel root.
    #[error("unknown kernel directory {kernel_dir:?}: no such directory under the kernel root {}", root.display())]
    UnknownKernelDir {
        kernel_dir: String,
        root: std::path::PathBuf,
    },
    /// The file does not exist.
    #[error("{path:?} does not exist in the kernel directory")]
    NoSuchFile { path: String },
    /// The file resolves (through a link) outside the kernel directory.
    #[error("{path:?} leaves the kernel directory")]
    OutsideKernelDir { path: String },
    /// The path names a directory or a special file.
    #[error("{path:?} is not a regular file")]
    NotAFile { path: String },
    /// A budget above the leader's limit.
    #[error("bad budgets: {name} {value} exceeds the limit {limit}")]
    BudgetOverLimit {
        name: &'static str,
        value: String,
        limit: String,
    },
    /// `device_seconds` is negative or not finite.
    #[error("bad budgets: device_seconds must be a finite number >= 0, got {0}")]
    DeviceSecondsInvalid(f64),
    /// `max_tokens` too small to run a leader loop.
    #[error(
        "bad budgets: max_tokens {0} is too small for a leader loop (at least 1000, or 0 for no limit)"
    )]
    MaxTokensTooSmall(u64),
    /// The model URL is not HTTP(S).
    #[error("model.base_url {0:?} must start with http:// or https://")]
    ModelBaseUrl(String),
    /// The temperature is out of range.
    #[error("model.temperature {0} must be within 0..=2")]
    ModelTemperature(f64),
    /// The request carries no spec.
    #[error("spec is missing")]
    MissingSpec,
    /// The goal is empty.
    #[error("goal is empty: describe what to tune")]
    EmptyGoal,
    /// The goal is above the size limit.
    #[error("goal is too large: {bytes} bytes (limit {limit})")]
    GoalTooLarge { bytes: usize, limit: usize },
    /// The slice selector does not parse.
    #[error("bad slice_selector: {0}")]
    Selector(#[source] SelectorError),
    /// More agents requested than allowed.
    #[error("num_agents {requested} exceeds the limit {limit}")]
    TooManyAgents { requested: u32, limit: u32 },
    /// More `@path` references than allowed.
    #[error("goal references {count} files with @path (limit {limit})")]
    TooManyAttachments { count: usize, limit: usize },
    /// An `@path` reference does not name a usable file.
    #[error("attachment @{reference}: {source}")]
    Attachment {
        reference: String,
        #[source]
        source: Box<ValidateError>,
    },
    /// An attachment could not be read.
    #[error("attachment @{reference}: {source}")]
    AttachmentIo {
        reference: String,
        #[source]
        source: std::io::Error,
    },
    /// One attachment is above the size limit.
    #[error("attachment @{reference} is too large: {size} bytes (limit {limit})")]
    AttachmentTooLarge {
        reference: String,
        size: u64,
        limit: u64,
    },
    /// The attachments together are above the size limit.
    #[error("attachments are too large together: more than {total} bytes (limit {limit})")]
    AttachmentsTooLarge { total: u64, limit: u64 },
    /// An attachment is not text.
    #[error("attachment @{reference} is not UTF-8 text")]
    AttachmentNotUtf8 { reference: String },
}

/// Admission refused: both the run slots and the queue are full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the leader is at its limits: max_active_jobs = {max_active} jobs running and max_queued_jobs = {max_queued} jobs queued; retry later"
)]
pub struct AdmissionError {
    pub max_active: usize,
    pub max_queued: usize,
}

/// A Worker service client that could not be built.
#[derive(Debug, thiserror::Error)]
#[error("worker endpoint {endpoint:?}: {source}")]
pub struct WorkerClientError {
    pub endpoint: String,
    #[source]
    pub source: mtswarm_auth::AuthError,
}

/// Why a `SpawnSession` for a placement did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No client for the worker's endpoint.
    #[error(transparent)]
    Client(#[from] WorkerClientError),
    /// The worker refused or could not be reached.
    #[error("{code:?}: {message}")]
    Refused { code: tonic::Code, message: String },
}

/// Why a job's results could not be replayed into its table.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The job id cannot name a results subject.
    #[error("{0}")]
    Subject(#[from] mtswarm_bus::BusError),
    /// The results stream could not be opened.
    #[error("open stream {stream}: {source}")]
    OpenStream {
        stream: &'static str,
        #[source]
        source: NatsSource,
    },
    /// The job's last stored result could not be looked up.
    #[error("last result of job {job_id}: {source}")]
    LastResult {
        job_id: String,
        #[source]
        source: NatsSource,
    },
    /// The replay's ordered consumer could not be created.
    #[error("replay consumer on {subject}: {source}")]
    Consumer {
        subject: String,
        #[source]
        source: NatsSource,
    },
    /// No message arrived for too long.
    #[error("replay of {subject} stalled")]
    Stalled { subject: String },
    /// The replay ended before the last stored result.
    #[error("replay of {subject} ended early")]
    EndedEarly { subject: String },
    /// Reading the next result failed.
    #[error("replay of {subject}: {source}")]
    Read {
        subject: String,
        #[source]
        source: NatsSource,
    },
}

/// Why a job left behind by a previous leader could not be resumed.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The stored spec does not validate against this leader.
    #[error("the job's spec is no longer valid here: {0}")]
    InvalidSpec(#[source] ValidateError),
    /// The job's results could not be replayed.
    #[error("the job's results could not be replayed: {0}")]
    Replay(#[source] ReplayError),
}

/// Why an agent's session could not be cancelled.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// The job has no agent of that name.
    #[error("no agent named {agent_id:?} in this job")]
    UnknownAgent { agent_id: String },
    /// No client for the worker's endpoint.
    #[error(transparent)]
    Client(#[from] WorkerClientError),
    /// The worker answered `CancelSession` with an error.
    #[error("worker {worker_id}: {message}")]
    Worker { worker_id: String, message: String },
}

/// Why a [`crate::ModelFactory`] built no model for a job (the job fails
/// with this message).
#[derive(Debug, thiserror::Error)]
pub enum ModelFactoryError {
    /// The OpenAI-compatible client could not be configured.
    #[error("leader model configuration: {0}")]
    Client(#[source] mtswarm_llm::ConfigError),
    /// The job's model endpoint is not on the allowlist.
    #[error("{0}")]
    Endpoint(#[source] mtswarm_auth::AuthError),
    /// The job names a model whose endpoint configuration is unusable.
    #[error(
        "job names model {model:?} but its endpoint is not usable (set JobSpec.model.base_url or MTSWARM_LLM_URL): {source}"
    )]
    JobEndpoint {
        model: String,
        #[source]
        source: mtswarm_llm::ConfigError,
    },
    /// Any other reason, in words (factories outside this crate).
    #[error("{0}")]
    Other(String),
}
