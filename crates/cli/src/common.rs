//! Flags and plumbing shared by the subcommands: telemetry setup (one
//! service name per process role), the connection to the leader's Control
//! service (with trace context injected into every call), and how errors
//! from the leader are worded for people.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use mtswarm_auth::{BearerInterceptor, ClientAuth, ClientConfig, ClientProfile};
use mtswarm_proto::v1;
use mtswarm_proto::v1::control_client::ControlClient;
use mtswarm_telemetry::grpc::TraceContextInterceptor;
use mtswarm_telemetry::{OtlpProtocol, TelemetryConfig, TelemetryGuard};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Default gRPC address of the leader (`mtswarm up` and `mtswarm leader`).
pub(crate) const DEFAULT_LEADER: &str = "http://127.0.0.1:7700";

/// Logging and tracing flags, on every subcommand.
#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// OTLP collector to export spans to (e.g. http://localhost:4317 for
    /// gRPC, http://localhost:4318 for HTTP). Without it the standard
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT
    /// variables are read; with none of them nothing is exported.
    #[arg(long, env = "MTSWARM_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc` or `http/protobuf`. Without it the standard
    /// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL
    /// variables are read, then gRPC.
    #[arg(long, env = "MTSWARM_OTLP_PROTOCOL", global = true, value_parser = OtlpProtocol::parse)]
    pub otlp_protocol: Option<OtlpProtocol>,
    /// Log filter (tracing env-filter syntax, e.g. `info,mtswarm_worker=debug`).
    #[arg(long = "log", env = "MTSWARM_LOG", global = true)]
    pub log_filter: Option<String>,
    /// Logs as JSON lines (for log shippers).
    #[arg(long, env = "MTSWARM_LOG_JSON", global = true)]
    pub log_json: bool,
    /// Record prompts, model answers and tool results on the GenAI spans
    /// (off by default: they may hold anything a user or a tool wrote).
    #[arg(
        long,
        env = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        global = true
    )]
    pub trace_message_content: bool,
}

impl TelemetryArgs {
    /// Installs logging/tracing for this process as `service_name`.
    pub fn init(&self, service_name: &str) -> anyhow::Result<TelemetryGuard> {
        let mut config = TelemetryConfig::new(service_name);
        config.otlp_endpoint = self.otlp_endpoint.clone().filter(|e| !e.trim().is_empty());
        config.otlp_protocol = self.otlp_protocol;
        config.log_filter = self.log_filter.clone().filter(|f| !f.trim().is_empty());
        config.json_logs = self.log_json;
        config.capture_message_content = Some(self.trace_message_content);
        mtswarm_telemetry::init(config).context("setting up logging and tracing")
    }

    /// Like [`TelemetryArgs::init`] for client commands, whose stderr is for
    /// people: only warnings unless a filter is given.
    pub fn init_client(&self) -> anyhow::Result<TelemetryGuard> {
        let mut args = self.clone();
        if args.log_filter.is_none() {
            args.log_filter = Some("warn".into());
        }
        args.init("mtswarm-cli")
    }
}

/// Where the leader is and how to authenticate to it, for client commands.
/// What the flags and environment leave open comes from the client
/// configuration file (`$MTSWARM_CONFIG`, else `~/.mtswarm/config.toml`,
/// written by `mtswarm up`), as kubectl reads a kubeconfig.
#[derive(Debug, Clone, Args)]
pub struct LeaderArgs {
    /// gRPC address of the leader (default: the client configuration's, else
    /// http://127.0.0.1:7700).
    #[arg(long = "leader", env = "MTSWARM_LEADER")]
    pub leader: Option<String>,
    /// Seconds to wait for the connection to the leader.
    #[arg(long, env = "MTSWARM_CONNECT_TIMEOUT", default_value_t = 5.0)]
    pub connect_timeout: f64,
    /// File holding the bearer token to present (default: the client
    /// configuration's token).
    #[arg(long, env = "MTSWARM_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the leader's certificate (default:
    /// the client configuration's).
    #[arg(long = "tls-ca", env = "MTSWARM_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Send the bearer token even to a plain `http://` leader address.
    /// Anyone who sees the traffic can then read the token and act as this
    /// identity; without this flag such a command is refused.
    #[arg(
        long = "insecure-plaintext-token",
        env = "MTSWARM_INSECURE_PLAINTEXT_TOKEN"
    )]
    pub insecure_plaintext_token: bool,
}

/// The Control client the commands use: every call carries the caller's
/// token and the current span's trace context.
pub(crate) type Control =
    ControlClient<InterceptedService<Channel, BearerInterceptor<TraceContextInterceptor>>>;

/// The profile `--profile` / `MTSWARM_PROFILE` named, set once by
/// [`crate::run`] before any command reads the client configuration.
static REQUESTED_PROFILE: OnceLock<Option<String>> = OnceLock::new();

/// Records the profile the command line asked for (first call wins).
pub(crate) fn request_profile(profile: Option<String>) {
    let _ = REQUESTED_PROFILE.set(profile.filter(|p| !p.trim().is_empty()));
}

fn requested_profile() -> Option<&'static str> {
    REQUESTED_PROFILE.get().and_then(|p| p.as_deref())
}

/// The deployment of the client configuration this command uses: the
/// profile asked for, else the file's default profile, else the local
/// stack's. An unknown profile is an error naming the known ones; no
/// file (or no `$HOME`) is `Ok(None)` when no profile was asked for.
pub(crate) fn selected_profile() -> anyhow::Result<Option<ClientProfile>> {
    let Some(path) = mtswarm_auth::default_client_config_path() else {
        if let Some(name) = requested_profile() {
            anyhow::bail!(
                "profile {name:?} asked for, but there is no client configuration (set MTSWARM_CONFIG)"
            );
        }
        return Ok(None);
    };
    match ClientConfig::load(&path)? {
        Some(config) => Ok(Some(config.select(requested_profile(), &path)?.clone())),
        None => match requested_profile() {
            Some(name) => anyhow::bail!(
                "profile {name:?} asked for, but the client configuration {} does not exist",
                path.display()
            ),
            None => Ok(None),
        },
    }
}

/// The selected deployment of the client configuration, if there is one.
/// An unusable file is reported and ignored (flags then say everything);
/// [`crate::run`] has already refused an unknown profile.
pub(crate) fn client_config() -> Option<ClientProfile> {
    match selected_profile() {
        Ok(profile) => profile,
        Err(error) => {
            eprintln!("mtswarm: ignoring the client configuration: {error:#}");
            None
        }
    }
}

/// The largest message the CLI accepts from the leader.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

impl LeaderArgs {
    /// Arguments naming `url`, credentials from the client configuration.
    pub fn for_url(url: impl Into<String>, connect_timeout: f64) -> Self {
        Self {
            leader: Some(url.into()),
            connect_timeout,
            token_file: None,
            tls_ca: None,
            insecure_plaintext_token: false,
        }
    }

    /// The leader address with a scheme (`host:port` becomes
    /// `https://host:port` when a token or a CA is configured, so a token
    /// never goes out in clear text by default; `http://host:port` only
    /// without either).
    pub fn url(&self) -> String {
        let config = client_config();
        let secured = self.token_file.is_some()
            || self.tls_ca.is_some()
            || config
                .as_ref()
                .is_some_and(|c| c.token.is_some() || c.ca_file.is_some());
        let configured = config.and_then(|c| c.leader);
        let Some(address) = self
            .leader
            .as_deref()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        else {
            return configured.unwrap_or_else(|| DEFAULT_LEADER.to_string());
        };
        if address.contains("://") {
            return address.to_string();
        }
        // `host:port` of the configured leader keeps its scheme.
        match configured {
            Some(url) if url.split_once("://").map(|(_, rest)| rest) == Some(address) => url,
            _ if secured => format!("https://{address}"),
            _ => with_scheme(address),
        }
    }

    /// The token and CA this client presents and trusts.
    pub fn client_auth(&self) -> anyhow::Result<ClientAuth> {
        let config = client_config().unwrap_or_default();
        let mut auth = ClientAuth::none();
        if let Some(path) = &self.token_file {
            auth = auth.with_token_file(path)?;
        } else if let Some(token) = &config.token {
            auth = auth.with_token(token)?;
        }
        if let Some(path) = self.tls_ca.as_ref().or(config.ca_file.as_ref()) {
            auth = auth.with_ca_file(path)?;
        }
        Ok(auth)
    }

    /// Connects to the leader, or explains how to start one.
    pub async fn connect(&self) -> anyhow::Result<Control> {
        let url = self.url();
        if !self.connect_timeout.is_finite() || self.connect_timeout <= 0.0 {
            anyhow::bail!("--connect-timeout must be a positive number of seconds");
        }
        let auth = self
            .client_auth()?
            .allow_plaintext_token(self.insecure_plaintext_token);
        let endpoint = auth
            .endpoint(&url, Duration::from_secs_f64(self.connect_timeout))
            .map_err(|error| match error {
                mtswarm_auth::AuthError::InsecureEndpoint { .. } => anyhow::anyhow!(
                    "{error} (pass --insecure-plaintext-token to send it anyway)"
                ),
                other => anyhow::anyhow!(
                    "cannot reach the leader at {url}: is `mtswarm up` running? ({other}; its client configuration or --tls-ca names the CA)"
                ),
            })?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| connect_error(&url, &error_chain(&error)))?;
        Ok(
            ControlClient::with_interceptor(channel, auth.interceptor(TraceContextInterceptor))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
    }
}

/// Why a connection to the leader failed, in words: a TLS failure names
/// the certificate problem (not "is it running?"), anything else asks
/// whether a leader runs there.
pub(crate) fn connect_error(url: &str, chain: &str) -> anyhow::Error {
    let lower = chain.to_ascii_lowercase();
    let tls = [
        "certificate",
        "tls",
        "handshake",
        "unknownissuer",
        "notvalidforname",
        "x509",
    ]
    .iter()
    .any(|word| lower.contains(word));
    if tls {
        anyhow::anyhow!(
            "TLS with the leader at {url} failed: {chain} (its certificate is not one the configured CA issued for this address; check --tls-ca and the address)"
        )
    } else {
        anyhow::anyhow!("cannot reach the leader at {url}: is `mtswarm up` running? ({chain})")
    }
}

/// `host:port` -> `http://host:port`; URLs with a scheme are kept.
pub(crate) fn with_scheme(address: &str) -> String {
    let trimmed = address.trim();
    if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("http://{trimmed}")
    }
}

/// An error and its sources on one line.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// The job states named by `names` (`queued`, `RUNNING`, `job_state_failed`
/// ...), as `ListJobsRequest.states` takes them; the first unknown name
/// is the error, with the states there are.
pub(crate) fn job_states(names: &[String]) -> Result<Vec<i32>, String> {
    names
        .iter()
        .map(|name| {
            crate::render::parse_job_state(name)
                .map(|state| state as i32)
                .ok_or_else(|| {
                    format!(
                        "unknown job state {name:?} (queued, running, succeeded, failed, cancelled)"
                    )
                })
        })
        .collect()
}

/// How many pages of jobs one listing reads at the most (a leader that
/// keeps answering with a next page cannot keep a client forever).
const MAX_JOB_PAGES: usize = 1000;

/// Every job in `states` (all jobs when empty), page by page.
pub(crate) async fn list_all_jobs(
    control: &mut Control,
    states: &[i32],
) -> Result<Vec<v1::JobRecord>, tonic::Status> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    for _ in 0..MAX_JOB_PAGES {
        let page = control
            .list_jobs(v1::ListJobsRequest {
                states: states.to_vec(),
                page_size: 0,
                page_token: page_token.clone(),
            })
            .await?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() || page.next_page_token == page_token {
            break;
        }
        page_token = page.next_page_token;
    }
    Ok(jobs)
}

/// A failed call to the leader as a readable error: the status code's
/// meaning and the leader's message.
pub(crate) fn rpc_error(what: &str, leader: &str, status: tonic::Status) -> anyhow::Error {
    let message = status.message();
    match status.code() {
        tonic::Code::Unavailable => anyhow::anyhow!(
            "{what}: cannot reach the leader at {leader}: is `mtswarm up` running? ({message})"
        ),
        tonic::Code::InvalidArgument => anyhow::anyhow!("{what}: invalid request: {message}"),
        tonic::Code::NotFound => anyhow::anyhow!("{what}: not found: {message}"),
        tonic::Code::FailedPrecondition => anyhow::anyhow!("{what}: {message}"),
        tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => {
            anyhow::anyhow!("{what}: not allowed: {message}")
        }
        tonic::Code::DeadlineExceeded => {
            anyhow::anyhow!("{what}: the leader did not answer in time ({message})")
        }
        code => anyhow::anyhow!("{what}: {code:?}: {message}"),
    }
}

/// Writes `contents` to `path` atomically (temporary file + rename), so a
/// reader polling for the file never sees half of it.
pub(crate) fn write_atomically(path: &Path, contents: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file next to {}", path.display()))?;
    std::io::Write::write_all(&mut temp, contents.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    temp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// `--reason`: why an operator acts. Cancelling, lifting a quarantine and
/// deciding an approval record it with who acted.
#[derive(Debug, Args)]
pub struct OperatorReason {
    /// Why: recorded with the action and who took it (a decision's reason
    /// is also shown to the agent).
    #[arg(
        long = "reason",
        short = 'r',
        env = "MTSWARM_REASON",
        default_value = ""
    )]
    pub text: String,
}

impl OperatorReason {
    /// The reason signed with [`local_identity`]: `"REASON (by user@host)"`,
    /// or `"{action} by user@host"` when none was given.
    pub(crate) fn signed(&self, action: &str) -> String {
        match self.text.trim() {
            "" => format!("{action} by {}", local_identity()),
            reason => format!("{reason} (by {})", local_identity()),
        }
    }
}

/// What every signed operator action on the leader (cancel, approve,
/// deny, lift) takes besides its target: why, how to print the answer,
/// and where the leader is.
#[derive(Debug, Args)]
pub struct OperatorAction {
    #[command(flatten)]
    pub reason: OperatorReason,
    /// JSON output: the record the leader answers with.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// Identity recorded as the decider of approvals: `$USER@host`, else `cli`.
pub(crate) fn local_identity() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    match (user.is_empty(), host.is_empty()) {
        (false, false) => format!("{user}@{host}"),
        (false, true) => user,
        _ => "cli".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_without_a_scheme_get_http() {
        assert_eq!(with_scheme("127.0.0.1:7700"), "http://127.0.0.1:7700");
        assert_eq!(with_scheme("https://leader:443"), "https://leader:443");
    }

    #[test]
    fn unavailable_mentions_mtswarm_up() {
        let error = rpc_error(
            "listing jobs",
            "http://127.0.0.1:1",
            tonic::Status::unavailable("connection refused"),
        );
        let text = error.to_string();
        assert!(text.contains("is `mtswarm up` running?"), "{text}");
        assert!(text.contains("http://127.0.0.1:1"), "{text}");
    }

    #[test]
    fn ready_files_are_written_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ready.json");
        write_atomically(&path, "{\"grpc\":\"http://x\"}").expect("write");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\"grpc\":\"http://x\"}"
        );
    }
}
