//! `mtswarm mcp`: the farm as Model Context Protocol tools, so outside
//! agents and IDE assistants can submit a job, follow it, read its task
//! results and report, and see the fleet. The server is one more client of
//! the leader's `Control` service, like every other command: it presents
//! the credential of the client configuration (or `--token-file` /
//! `--tls-ca`), so the leader decides what each call may do; the server
//! never adds a right, and a refusal comes back as a tool error that names
//! it. Two transports: stdio (an assistant starts `mtswarm mcp` itself) and
//! streamable HTTP (`--http ADDR`, loopback by default, `Host` checked
//! against loopback names unless `--allowed-host` widens it).
//!
//! [`server`] holds the tool set and its wiring; each tool lives in its
//! own file; [`reply`] turns a tool's answer or failure into an MCP result;
//! [`arguments`] reads a call's arguments as the tools do, without a network.

mod arguments;
mod fleet;
mod job;
mod jobs;
mod reply;
mod report;
mod results;
mod server;
mod submit;
mod watch;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use rmcp::ServiceExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::common::LeaderArgs;
use crate::credentials::NatsSecurityArgs;
use crate::daemons::DEFAULT_NATS;

pub(crate) use arguments::{ArgumentsError, check_arguments};
pub(crate) use server::{FarmServer, ResultsStoreArgs};

/// Where `--http` alone listens: loopback only.
pub(crate) const DEFAULT_HTTP: &str = "127.0.0.1:7790";

/// The path the streamable HTTP transport serves.
pub(crate) const HTTP_PATH: &str = "/mcp";

/// Every tool `mtswarm mcp` serves, sorted by name: what an MCP client
/// lists, whatever role its credential has (each call then checks the
/// role it needs).
pub const MCP_TOOL_NAMES: [&str; 7] = [
    "get_job",
    "get_report",
    "list_fleet",
    "list_jobs",
    "list_results",
    "submit_job",
    "watch_job",
];

/// Arguments of `mtswarm mcp`: the transport, and where the leader (and the
/// results store, for reports) are and how to authenticate.
#[derive(Debug, Args)]
pub struct McpCmd {
    /// Serve streamable HTTP instead of stdio, on this address (`--http`
    /// alone: 127.0.0.1:7790, loopback). Port 0 picks a free port (see
    /// --ready-file).
    #[arg(
        long = "http",
        env = "MTSWARM_MCP_HTTP",
        num_args = 0..=1,
        default_missing_value = DEFAULT_HTTP
    )]
    pub http: Option<SocketAddr>,
    /// Extra `Host` names the HTTP transport accepts (it accepts loopback
    /// names only by default, against DNS rebinding).
    #[arg(
        long = "allowed-host",
        env = "MTSWARM_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// With --http: write `{"url": ...}` here once the server listens.
    #[arg(long, env = "MTSWARM_MCP_READY_FILE")]
    pub ready_file: Option<std::path::PathBuf>,
    /// NATS server URL(s), comma-separated (the results store the report
    /// tool reads).
    #[arg(long = "nats", env = "MTSWARM_NATS_URL", default_value = DEFAULT_NATS, value_delimiter = ',')]
    pub nats: Vec<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "MTSWARM_NATS_CREDS")]
    pub nats_creds: Option<std::path::PathBuf>,
    /// The nkey seed and NATS TLS settings for reading the results store.
    #[command(flatten)]
    pub nats_security: NatsSecurityArgs,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// `mtswarm mcp`: serves the tools over stdio until the client closes it,
/// or over streamable HTTP until interrupted.
pub(crate) async fn mcp(cmd: McpCmd) -> anyhow::Result<ExitCode> {
    if cmd.http.is_some_and(|addr| !addr.ip().is_loopback()) && cmd.allowed_hosts.is_empty() {
        tracing::warn!(
            "the MCP server listens beyond loopback; clients must name a loopback Host unless --allowed-host says otherwise"
        );
    }
    let server = FarmServer::new(
        cmd.leader.clone(),
        ResultsStoreArgs {
            nats: cmd.nats.clone(),
            nats_creds: cmd.nats_creds.clone(),
            nats_security: cmd.nats_security.clone(),
        },
    );
    match cmd.http {
        None => serve_stdio(server).await,
        Some(addr) => serve_http(server, addr, &cmd).await,
    }
}

async fn serve_stdio(server: FarmServer) -> anyhow::Result<ExitCode> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP server on stdio")?;
    running.waiting().await.context("serving MCP on stdio")?;
    Ok(ExitCode::SUCCESS)
}

async fn serve_http(
    server: FarmServer,
    addr: SocketAddr,
    cmd: &McpCmd,
) -> anyhow::Result<ExitCode> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the MCP server to {addr}"))?;
    let local = listener
        .local_addr()
        .context("reading the MCP server's address")?;
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(cmd.allowed_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(hosts);
    // Stops every HTTP session when the server stops.
    let cancel = config.cancellation_token.clone();
    let server = Arc::new(server);
    let service: StreamableHttpService<FarmServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.as_ref().clone()), Arc::default(), config);
    let router = axum::Router::new().nest_service(HTTP_PATH, service);
    let url = format!("http://{local}{HTTP_PATH}");
    if let Some(path) = &cmd.ready_file {
        crate::common::write_atomically(path, &serde_json::json!({ "url": url }).to_string())?;
    }
    eprintln!("mtswarm mcp: serving streamable HTTP on {url}");
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            cancel.cancel();
        })
        .await
        .context("serving MCP over HTTP")?;
    Ok(ExitCode::SUCCESS)
}
