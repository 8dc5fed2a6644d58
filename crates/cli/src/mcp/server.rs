//! The MCP server: one [`FarmServer`] per MCP session, holding where the
//! leader and the results store are. Every tool call connects as the
//! configured credential, so what a session may do is what that credential
//! may do on the leader.

use std::path::PathBuf;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool_handler};

use super::reply::ToolError;
use crate::common::{Control, LeaderArgs};
use crate::credentials::NatsSecurityArgs;

/// Where the results store is and how to authenticate to it (the report
/// tool reads the job's candidate records there).
#[derive(Debug, Clone)]
pub(crate) struct ResultsStoreArgs {
    /// NATS server URL(s).
    pub nats: Vec<String>,
    /// NATS credentials file (.creds).
    pub nats_creds: Option<PathBuf>,
    /// nkey seed and TLS settings.
    pub nats_security: NatsSecurityArgs,
}

/// What the server tells a client about itself when it connects.
const INSTRUCTIONS: &str = "Tools of an mtswarm farm that tunes MT-3000 kernels. \
    submit_job starts a tuning job on a kernel directory (e.g. `vecadd`) and returns its id; \
    watch_job follows it until it ends (or a timeout) and returns its events and outcome; \
    get_job shows one job with its outcome (best configuration, GFLOP/s, tokens); \
    list_jobs lists jobs; list_results lists a job's task results; \
    get_report summarizes a job's measured candidates (optionally the HTML report); \
    list_fleet lists the boards' slices and workers. \
    What a call may do is what this server's credential may do on the leader.";

/// The farm's MCP tools over one leader.
#[derive(Debug, Clone)]
pub(crate) struct FarmServer {
    pub(super) leader: LeaderArgs,
    pub(super) store: ResultsStoreArgs,
    tool_router: ToolRouter<FarmServer>,
}

impl FarmServer {
    /// A server whose tools call the leader `leader` names (with its
    /// credential) and read reports from `store`.
    pub(crate) fn new(leader: LeaderArgs, store: ResultsStoreArgs) -> Self {
        Self {
            leader,
            store,
            tool_router: Self::submit_router()
                + Self::watch_router()
                + Self::job_router()
                + Self::jobs_router()
                + Self::results_router()
                + Self::report_router()
                + Self::fleet_router(),
        }
    }

    /// The names of every tool, sorted.
    #[cfg(test)]
    fn tool_names(&self) -> Vec<String> {
        self.tool_router
            .list_all()
            .into_iter()
            .map(|tool| tool.name.to_string())
            .collect()
    }

    /// A Control client for one call.
    pub(super) async fn control(&self) -> Result<Control, ToolError> {
        self.leader.connect().await.map_err(ToolError::Connect)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for FarmServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mtswarm", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader that cannot be reached is a tool error saying so, with
    /// `UNAVAILABLE`, not a failed protocol call.
    #[tokio::test]
    async fn an_unreachable_leader_is_a_tool_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let server = FarmServer::new(
            LeaderArgs::for_url(format!("http://{addr}"), 1.0),
            ResultsStoreArgs {
                nats: vec![],
                nats_creds: None,
                nats_security: NatsSecurityArgs::default(),
            },
        );
        let Err(error) = server.control().await else {
            panic!("a client of a leader that is not there");
        };
        let result = crate::mcp::reply::reply(Err(error));
        assert_eq!(result.is_error, Some(true));
        let value = result.structured_content.expect("structured");
        assert_eq!(value["code"], "UNAVAILABLE", "{value}");
        assert!(
            value["error"]
                .as_str()
                .unwrap_or_default()
                .contains(&addr.to_string()),
            "{value}"
        );
    }

    #[test]
    fn every_tool_is_routed_and_has_a_described_object_schema() {
        let server = FarmServer::new(
            LeaderArgs::for_url("http://127.0.0.1:1", 1.0),
            ResultsStoreArgs {
                nats: vec![],
                nats_creds: None,
                nats_security: NatsSecurityArgs::default(),
            },
        );
        assert_eq!(server.tool_names(), super::super::MCP_TOOL_NAMES);
        for tool in server.tool_router.list_all() {
            assert!(
                tool.description.as_deref().is_some_and(|d| d.len() > 20),
                "{}",
                tool.name
            );
            assert_eq!(
                tool.input_schema.get("type"),
                Some(&serde_json::json!("object"))
            );
        }
    }
}
