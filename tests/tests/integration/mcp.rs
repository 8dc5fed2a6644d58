//! `mtswarm mcp` as an outside agent uses it: an MCP client (rmcp's) starts
//! the binary against a real `mtswarm up` (nats-server, leader and worker
//! daemons as processes, TLS and bearer tokens as generated), lists the
//! tools and runs a vecadd job to its outcome over stdio, then reads its
//! results, report and the fleet. The credential decides what the tools
//! may do: the approver's token is refused a submit and the fleet, and the
//! refusal comes back as a tool error naming PERMISSION_DENIED; over
//! streamable HTTP (loopback) the submitter's token lists the tools and its
//! jobs but not the fleet.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mtswarm_auth::ClientConfig;
use mtswarm_tests::cli::spawn_up;
use mtswarm_tests::{NodeProcess, node_bin};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

type Client = RunningService<RoleClient, ()>;

/// `mtswarm-node` with the stack's client configuration and nothing of
/// the test's environment that would point it elsewhere.
fn node_command(client_config: &Path) -> std::process::Command {
    mtswarm_tests::cli::configured_node(&node_bin!(), client_config)
}

/// `mtswarm mcp` on stdio as a child of this test, optionally with another
/// identity's token; an MCP client connected to it.
async fn stdio_client(client_config: &Path, token: Option<&Path>) -> Client {
    let mut command = tokio::process::Command::from(node_command(client_config));
    command
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("MTSWARM_TOKEN_FILE", token);
    }
    let mut child = command.spawn().expect("spawn mtswarm mcp");
    let stdout = child.stdout.take().expect("stdout");
    let stdin = child.stdin.take().expect("stdin");
    // The child lives as long as the test's runtime; its stdin closing
    // (the client dropped) ends it.
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    ().serve((stdout, stdin))
        .await
        .expect("MCP handshake over stdio")
}

async fn tool_names(client: &Client) -> Vec<String> {
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect();
    names.sort();
    names
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else {
        panic!("arguments of {tool} are an object");
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("tools/call {tool}: {e}"))
}

/// The structured answer of a call that must have succeeded.
async fn answer(client: &Client, tool: &str, arguments: Value) -> Value {
    let result = call(client, tool, arguments).await;
    assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
    result.structured_content.expect("structured content")
}

/// The structured error of a call that must have been refused.
async fn refusal(client: &Client, tool: &str, arguments: Value) -> Value {
    let result = call(client, tool, arguments).await;
    assert_eq!(
        result.is_error,
        Some(true),
        "{tool} was not refused: {result:?}"
    );
    result.structured_content.expect("structured error")
}

/// The credentials directory `mtswarm up` wrote next to its CA.
fn credentials_dir(client_config: &Path) -> PathBuf {
    ClientConfig::load(client_config)
        .expect("client configuration readable")
        .expect("mtswarm up wrote the client configuration")
        .local
        .ca_file
        .as_deref()
        .and_then(Path::parent)
        .expect("credentials directory")
        .to_path_buf()
}

/// Waits (bounded) for `mtswarm mcp --http`'s ready file; its URL.
fn wait_for_http(process: &mut NodeProcess, ready: &Path) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(url) = std::fs::read_to_string(ready)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|doc| doc["url"].as_str().map(str::to_string))
        {
            return url;
        }
        if let Some(status) = process.try_status() {
            panic!("mtswarm mcp --http exited ({status}): {}", process.stderr());
        }
        assert!(
            Instant::now() < deadline,
            "mtswarm mcp --http not ready: {}",
            process.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_runs_a_vecadd_job_through_mtswarm_mcp() {
    let dir = tempfile::tempdir().expect("temp dir");
    let client_config = dir.path().join("config.toml");
    let (mut up, _ready) =
        tokio::task::block_in_place(|| spawn_up(node_command(&client_config), dir.path(), WAIT));
    let credentials = credentials_dir(&client_config);

    // The stack's own credential (admin): the whole round trip over stdio.
    let admin = stdio_client(&client_config, None).await;
    let info = admin.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("mtswarm")
    );
    assert_eq!(tool_names(&admin).await, mtswarm_cli::MCP_TOOL_NAMES);
    let job_id = run_a_vecadd_job(&admin).await;
    read_the_job(&admin, &job_id).await;
    admin.cancel().await.expect("close the stdio session");

    // The approver may decide approvals, nothing else: the MCP server adds
    // no right to the credential it presents.
    the_approver_may_not_submit(&client_config, &credentials).await;
    // Streamable HTTP on loopback, as the submitter.
    the_submitter_over_streamable_http(&client_config, &credentials, dir.path()).await;

    up.interrupt().expect("SIGINT");
    let status = tokio::task::block_in_place(|| up.wait_exit(WAIT)).expect("up exits");
    assert!(status.success(), "{status}; {}", up.stderr());
}

/// Submit a vecadd job and watch it to its outcome, a call at a time; its id.
async fn run_a_vecadd_job(admin: &Client) -> String {
    let submitted = answer(
        admin,
        "submit_job",
        json!({"goal": "Tune vecadd through MCP", "kernel": "vecadd",
               "agents": 1, "auto_approve": true}),
    )
    .await;
    let job_id = submitted["job_id"].as_str().expect("job_id").to_string();
    let mut watched = answer(
        admin,
        "watch_job",
        json!({"job_id": job_id, "timeout_seconds": 300}),
    )
    .await;
    // A job longer than one call goes on from where the last answer ended.
    while watched["finished"] != json!(true) {
        watched = answer(
            admin,
            "watch_job",
            json!({"job_id": job_id, "timeout_seconds": 300,
                   "from_sequence": watched["next_sequence"]}),
        )
        .await;
    }
    assert_eq!(watched["state"], "succeeded", "{watched:#}");
    let events = watched["events"].as_array().expect("events");
    assert!(
        events.iter().any(|e| e["type"] == "task_result"),
        "the watch saw a task result: {watched:#}"
    );
    let outcome = &watched["job"]["outcome"];
    let best_gflops = outcome["best"]["gflops"].as_f64().unwrap_or_default();
    assert!(
        best_gflops > 0.0,
        "an outcome with a measured best: {watched:#}"
    );

    job_id
}

/// The job, its results, its report, the fleet and the listing as the
/// tools return them; an unknown job and a bad state are refused.
async fn read_the_job(admin: &Client, job_id: &str) {
    let job = answer(admin, "get_job", json!({"job_id": job_id})).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["job_id"].as_str(), Some(job_id));
    let results = answer(admin, "list_results", json!({"job_id": job_id})).await;
    let tasks = results["tasks"].as_array().expect("tasks");
    assert!(
        tasks.iter().any(|t| t["status"] == "ok"),
        "an ok task result: {results:#}"
    );
    let ok_only = answer(
        admin,
        "list_results",
        json!({"job_id": job_id, "status": "failed"}),
    )
    .await;
    assert!(
        ok_only["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .all(|t| t["status"] == "failed"),
        "{ok_only:#}"
    );
    let report = call(admin, "get_report", json!({"job_id": job_id, "html": true})).await;
    assert_ne!(report.is_error, Some(true), "{report:?}");
    let summary = report.structured_content.clone().expect("summary");
    assert!(
        summary["records"].as_u64().unwrap_or_default() >= 1,
        "{summary:#}"
    );
    // The HTML follows the summary as an embedded text/html resource.
    assert_eq!(report.content.len(), 2, "{report:?}");
    let html = serde_json::to_value(&report.content[1]).expect("json");
    assert_eq!(html["resource"]["mimeType"], "text/html", "{html:.300}");
    let text = html["resource"]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("<html") && text.contains(job_id),
        "{text:.300}"
    );
    let fleet = answer(admin, "list_fleet", json!({})).await;
    assert!(
        !fleet["slices"].as_array().expect("slices").is_empty(),
        "{fleet:#}"
    );
    let listed = answer(admin, "list_jobs", json!({"states": ["succeeded"]})).await;
    assert!(
        listed["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .any(|j| j["job_id"].as_str() == Some(job_id)),
        "{listed:#}"
    );
    let unknown = refusal(admin, "get_job", json!({"job_id": "no-such-job"})).await;
    assert_eq!(unknown["code"], "NOT_FOUND", "{unknown:#}");
    let bad = refusal(admin, "list_jobs", json!({"states": ["sleeping"]})).await;
    assert_eq!(bad["code"], "INVALID_ARGUMENT", "{bad:#}");
}

/// The approver's token is refused a submit and the fleet.
async fn the_approver_may_not_submit(client_config: &Path, credentials: &Path) {
    let approver = stdio_client(
        client_config,
        Some(&credentials.join("tokens").join("approver.token")),
    )
    .await;
    let refused = refusal(
        &approver,
        "submit_job",
        json!({"goal": "Not mine to run", "kernel": "vecadd"}),
    )
    .await;
    assert_eq!(refused["code"], "PERMISSION_DENIED", "{refused:#}");
    let text = refused["error"].as_str().expect("error text");
    assert!(
        text.starts_with("submitting the job: not allowed"),
        "{text}"
    );
    let refused = refusal(&approver, "list_fleet", json!({})).await;
    assert_eq!(refused["code"], "PERMISSION_DENIED", "{refused:#}");
    approver.cancel().await.expect("close the stdio session");
}

/// The submitter's token over streamable HTTP lists the tools and its jobs,
/// not the fleet.
async fn the_submitter_over_streamable_http(client_config: &Path, credentials: &Path, dir: &Path) {
    let ready = dir.join("mcp.ready.json");
    let mut http = node_command(client_config);
    http.args(["mcp", "--http", "127.0.0.1:0", "--ready-file"])
        .arg(&ready)
        .env(
            "MTSWARM_TOKEN_FILE",
            credentials.join("tokens").join("submitter.token"),
        );
    let mut server = NodeProcess::spawn("mtswarm mcp --http", http).expect("spawn");
    let url = tokio::task::block_in_place(|| wait_for_http(&mut server, &ready));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let submitter =
        ().serve(StreamableHttpClientTransport::from_uri(url))
            .await
            .expect("MCP handshake over streamable HTTP");
    assert_eq!(tool_names(&submitter).await, mtswarm_cli::MCP_TOOL_NAMES);
    let jobs = answer(&submitter, "list_jobs", json!({})).await;
    assert!(jobs["count"].is_u64(), "{jobs:#}");
    let refused = refusal(&submitter, "list_fleet", json!({})).await;
    assert_eq!(refused["code"], "PERMISSION_DENIED", "{refused:#}");
    submitter.cancel().await.expect("close the HTTP session");
    server.interrupt().expect("SIGINT");
    let status = tokio::task::block_in_place(|| server.wait_exit(WAIT)).expect("mcp exits");
    assert!(status.success(), "{status}: {}", server.stderr());
}
