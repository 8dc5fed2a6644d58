//! The leader's error type: what can go wrong starting or running the
//! daemon, each variant naming the part involved.

use std::net::SocketAddr;

/// Errors of [`crate::LeaderDaemon`].
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The configuration cannot work (named in the message).
    #[error("invalid leader configuration: {0}")]
    InvalidConfig(String),
    /// Connecting to NATS or setting up its streams and buckets failed.
    #[error("NATS: {0}")]
    Bus(#[from] mtswarm_bus::BusError),
    /// The gRPC listener could not be bound.
    #[error("cannot bind the gRPC listener on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC reflection service could not be built.
    #[error("gRPC reflection service: {0}")]
    Reflection(String),
    /// The job event journal could not be set up.
    #[error("job event stream: {0}")]
    JobEvents(#[source] JournalError),
    /// The gRPC server stopped with an error.
    #[error("gRPC server failed: {0}")]
    Server(String),
}

/// A source error of a NATS client call, kept for its chain.
pub(crate) type NatsSource = Box<dyn std::error::Error + Send + Sync>;

/// Errors of the job event journal ([`crate::journal::Journal`]).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The job id cannot name a journal subject.
    #[error("{0}")]
    Subject(#[from] mtswarm_bus::BusError),
    /// The journal stream could not be created or updated (the source is
    /// the bus's explanation, which names the stream).
    #[error("{source}")]
    CreateStream {
        /// The JetStream stream involved.
        stream: &'static str,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// A publish to the job's subject failed.
    #[error("publish to {subject}: {source}")]
    Publish {
        /// The subject involved.
        subject: String,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// The stream did not acknowledge a confirmed append.
    #[error("publish to {subject} not acknowledged: {source}")]
    NotAcknowledged {
        /// The subject involved.
        subject: String,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// The journal stream could not be opened.
    #[error("open stream {stream}: {source}")]
    OpenStream {
        /// The JetStream stream involved.
        stream: &'static str,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// The ordered consumer of a watch could not be created.
    #[error("ordered consumer on {stream}: {source}")]
    Consumer {
        /// The JetStream stream involved.
        stream: &'static str,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// Reading the next entry failed.
    #[error("reading {stream}: {source}")]
    Read {
        /// The JetStream stream involved.
        stream: &'static str,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// An entry came without its stream metadata.
    #[error("journal message metadata: {0}")]
    Metadata(#[source] NatsSource),
    /// The job's worker events were not seen sourced into the journal in time.
    #[error(
        "job {job_id}: the journal did not catch up with its workers' events within {waited:?}"
    )]
    NotSettled {
        /// The job involved.
        job_id: String,
        /// How long the leader waited.
        waited: std::time::Duration,
    },
    /// An entry is not a `JobEvent`.
    #[error("journal entry {sequence} is not a JobEvent: {source}")]
    Decode {
        /// The entry's stream sequence.
        sequence: u64,
        /// The underlying error.
        #[source]
        source: prost::DecodeError,
    },
}

/// A slice selector that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SelectorError(#[from] pub mtswarm_hw::fleet::SelectorError);

/// Why a SubmitJob request (or a file of the kernel directory) is refused;
/// each variant names the field or path involved.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ValidateError {
    /// A path that must be relative is absolute.
    #[error("{what} {path:?} must be relative")]
    NotRelative {
        /// Which path the request named (`kernel_dir`, `path`).
        what: &'static str,
        /// The path as given.
        path: String,
    },
    /// A path climbs out with `..` (or names a root).
    #[error("{what} {path:?} must not contain `..`")]
    ParentDir {
        /// Which path the request named (`kernel_dir`, `path`).
        what: &'static str,
        /// The path as given.
        path: String,
    },
    /// No kernel directory given.
    #[error("kernel_dir is empty: name a kernel directory under the kernel root")]
    EmptyKernelDir,
    /// The kernel directory is not a directory under the kernel root.
    #[error("unknown kernel directory {kernel_dir:?}: no such directory under the kernel root {}", root.display())]
    UnknownKernelDir {
        /// The kernel directory as given.
        kernel_dir: String,
        /// The leader's kernel root.
        root: std::path::PathBuf,
    },
    /// The file does not exist.
    #[error("{path:?} does not exist in the kernel directory")]
    NoSuchFile {
        /// The path as given.
        path: String,
    },
    /// The file resolves (through a link) outside the kernel directory.
    #[error("{path:?} leaves the kernel directory")]
    OutsideKernelDir {
        /// The path as given.
        path: String,
    },
    /// The path names a directory or a special file.
    #[error("{path:?} is not a regular file")]
    NotAFile {
        /// The path as given.
        path: String,
    },
    /// A budget above the leader's limit.
    #[error("bad budgets: {name} {value} exceeds the limit {limit}")]
    BudgetOverLimit {
        /// The budget's field name.
        name: &'static str,
        /// The requested value.
        value: String,
        /// The leader's limit.
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
    GoalTooLarge {
        /// The goal's size in bytes.
        bytes: usize,
        /// The leader's limit.
        limit: usize,
    },
    /// The slice selector does not parse.
    #[error("bad slice_selector: {0}")]
    Selector(#[source] SelectorError),
    /// More agents requested than allowed.
    #[error("num_agents {requested} exceeds the limit {limit}")]
    TooManyAgents {
        /// The number of agents requested.
        requested: u32,
        /// The leader's limit.
        limit: u32,
    },
    /// An approval rule the workers could not apply.
    #[error("approval rule {index}: {reason}")]
    ApprovalRule {
        /// Position of the rule in `approval_rules` (from 0).
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An approval rule naming a tool no worker session has (a typo would
    /// otherwise leave the tool governed by the risk rules alone).
    #[error(
        "approval rule {index} names tool {tool:?}, which no worker session has (its tools: {known})"
    )]
    UnknownRuleTool {
        /// Position of the rule in `approval_rules` (from 0).
        index: usize,
        /// The name the rule gives.
        tool: String,
        /// The tools a session has, comma-separated.
        known: String,
    },
    /// More `@path` references than allowed.
    #[error("goal references {count} files with @path (limit {limit})")]
    TooManyAttachments {
        /// The number of `@path` references.
        count: usize,
        /// The leader's limit.
        limit: usize,
    },
    /// An `@path` reference does not name a usable file.
    #[error("attachment @{reference}: {source}")]
    Attachment {
        /// The `@path` reference.
        reference: String,
        /// The underlying error.
        #[source]
        source: Box<ValidateError>,
    },
    /// An attachment could not be read.
    #[error("attachment @{reference}: {source}")]
    AttachmentIo {
        /// The `@path` reference.
        reference: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// One attachment is above the size limit.
    #[error("attachment @{reference} is too large: {size} bytes (limit {limit})")]
    AttachmentTooLarge {
        /// The `@path` reference.
        reference: String,
        /// The attachment's size in bytes.
        size: u64,
        /// The leader's limit.
        limit: u64,
    },
    /// The attachments together are above the size limit.
    #[error("attachments are too large together: more than {total} bytes (limit {limit})")]
    AttachmentsTooLarge {
        /// The attachments' size so far, in bytes.
        total: u64,
        /// The leader's limit.
        limit: u64,
    },
    /// An attachment is not text.
    #[error("attachment @{reference} is not UTF-8 text")]
    AttachmentNotUtf8 {
        /// The `@path` reference.
        reference: String,
    },
}

/// Admission refused: both the run slots and the queue are full.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the leader is at its limits: max_active_jobs = {max_active} jobs running and max_queued_jobs = {max_queued} jobs queued; retry later"
)]
pub(crate) struct AdmissionError {
    /// The configured maximum of running jobs.
    pub max_active: usize,
    /// The configured maximum of queued jobs.
    pub max_queued: usize,
}

/// A Worker service client that could not be built.
#[derive(Debug, thiserror::Error)]
#[error("worker endpoint {endpoint:?}: {source}")]
pub(crate) struct WorkerClientError {
    /// The worker endpoint as recorded.
    pub endpoint: String,
    /// The underlying error.
    #[source]
    pub source: mtswarm_auth::AuthError,
}

/// Why a `SpawnSession` for a placement did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    /// No client for the worker's endpoint.
    #[error(transparent)]
    Client(#[from] WorkerClientError),
    /// The worker refused or could not be reached.
    #[error("{code:?}: {message}")]
    Refused {
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
}

/// Why a job's results could not be replayed into its table.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayError {
    /// The job id cannot name a results subject.
    #[error("{0}")]
    Subject(#[from] mtswarm_bus::BusError),
    /// The results stream could not be opened.
    #[error("open stream {stream}: {source}")]
    OpenStream {
        /// The JetStream stream involved.
        stream: &'static str,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// The job's last stored result could not be looked up.
    #[error("last result of job {job_id}: {source}")]
    LastResult {
        /// The job involved.
        job_id: String,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// The replay's ordered consumer could not be created.
    #[error("replay consumer on {subject}: {source}")]
    Consumer {
        /// The subject involved.
        subject: String,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
    /// No message arrived for too long.
    #[error("replay of {subject} stalled")]
    Stalled {
        /// The subject involved.
        subject: String,
    },
    /// The replay ended before the last stored result.
    #[error("replay of {subject} ended early")]
    EndedEarly {
        /// The subject involved.
        subject: String,
    },
    /// Reading the next result failed.
    #[error("replay of {subject}: {source}")]
    Read {
        /// The subject involved.
        subject: String,
        /// The underlying error.
        #[source]
        source: NatsSource,
    },
}

/// Why a job left behind by a previous leader could not be resumed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    /// The stored spec does not validate against this leader.
    #[error("the job's spec is no longer valid here: {0}")]
    InvalidSpec(#[source] ValidateError),
    /// The job's results could not be replayed.
    #[error("the job's results could not be replayed: {0}")]
    Replay(#[source] ReplayError),
    /// The job's agents, tasks or loop checkpoint could not be read.
    #[error("the job's agents, tasks or loop state could not be read: {0}")]
    Read(#[source] mtswarm_bus::BusError),
}

/// Why an agent's session could not be cancelled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CancelError {
    /// The job has no agent of that name.
    #[error("no agent named {agent_id:?} in this job")]
    UnknownAgent {
        /// The agent id asked for.
        agent_id: String,
    },
    /// No client for the worker's endpoint.
    #[error(transparent)]
    Client(#[from] WorkerClientError),
    /// The worker answered `CancelSession` with an error.
    #[error("worker {worker_id}: {message}")]
    Worker {
        /// The agent's worker.
        worker_id: String,
        /// The status message.
        message: String,
    },
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
        /// The model the job names.
        model: String,
        /// The underlying error.
        #[source]
        source: mtswarm_llm::ConfigError,
    },
    /// Any other reason, in words (factories outside this crate).
    #[error("{0}")]
    Other(String),
}

/// A write of a job's durable state (its record and parts, a task
/// publication) that did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobWriteError {
    /// The bus refused or failed it.
    #[error(transparent)]
    Bus(#[from] mtswarm_bus::BusError),
    /// This leader no longer owns the job: the write was fenced.
    #[error("fenced: {0}")]
    Fenced(#[from] mtswarm_bus::OwnershipError),
}
