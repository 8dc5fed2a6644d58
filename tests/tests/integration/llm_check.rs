//! `mtswarm llm check` against real HTTP endpoints on loopback, each an
//! OpenAI-compatible server with some capabilities and not others: one
//! that does everything, one that ignores `tools` and answers in prose,
//! one that ignores `tools` but whose model writes its calls as JSON in its
//! reply (a small model behind a server without a parser for its format),
//! and one with tool calls but one call per turn, no usage and no models
//! list. The report names each capability correctly, the tool mode that
//! works and the setting for it, and the exit code says whether the
//! endpoint can drive mtswarm.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::process::Command;

use mtswarm_tests::node_bin;
use serde_json::{Value, json};

const MODEL: &str = "probe-model";

/// What a server can do.
#[derive(Debug, Clone, Copy)]
struct Abilities {
    tools: bool,
    /// Without `tools`: the model writes its calls as JSON in its text.
    json_calls: bool,
    parallel: bool,
    usage: bool,
    models: bool,
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
           "model": MODEL, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn last_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The SSE events of the answer to `body`.
fn answer(abilities: Abilities, body: &Value) -> Vec<Value> {
    let offered = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    // A tool result: a `tool` message, or in text tool mode a user message.
    let answers_tool = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m["role"] == "tool")
        || last_user(body).contains("[tool result]");
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if abilities.tools && offered && !answers_tool && body["tool_choice"] != "none" {
        let wanted: Vec<i64> = if last_user(body).contains("twice") && abilities.parallel {
            vec![1, 2]
        } else if last_user(body).contains("twice") {
            vec![1]
        } else {
            vec![7]
        };
        for (index, n) in wanted.iter().enumerate() {
            events.push(chunk(
                json!({"tool_calls": [{"index": index, "id": format!("call_{index}"), "type": "function",
                                       "function": {"name": "record_number", "arguments": ""}}]}),
                Value::Null,
            ));
            // Arguments cut across two chunks, as real servers stream them.
            for piece in ["{\"n\":", &format!(" {n}}}")] {
                events.push(chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    Value::Null,
                ));
            }
        }
        events.push(chunk(json!({}), json!("tool_calls")));
    } else {
        let text = if answers_tool {
            "The number is recorded.".to_string()
        } else if abilities.json_calls && last_user(body).contains("twice") {
            "<tool_call>\n{\"name\": \"record_number\", \"arguments\": {\"n\": 1}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"record_number\", \"arguments\": {\"n\": 2}}\n</tool_call>"
                .to_string()
        } else if abilities.json_calls {
            "```json\n{\"name\": \"record_number\", \"arguments\": {\"n\": 7}}\n```".to_string()
        } else {
            "I would call record_number with n = 7.".to_string()
        };
        events.push(chunk(json!({"content": text}), Value::Null));
        events.push(chunk(json!({}), json!("stop")));
    }
    if abilities.usage {
        events.push(json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": 1_700_000_000u64, "model": MODEL, "choices": [],
                           "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}}));
    }
    events
}

/// Serves `abilities` on a loopback port; the base URL.
async fn serve(abilities: Abilities) -> String {
    use axum::response::IntoResponse as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let completions = move |body: axum::body::Bytes| async move {
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let events: Vec<Result<axum::body::Bytes, std::convert::Infallible>> =
            answer(abilities, &parsed)
                .into_iter()
                .map(|e| format!("data: {e}\n\n"))
                .chain(std::iter::once("data: [DONE]\n\n".to_string()))
                .map(|line| Ok(axum::body::Bytes::from(line)))
                .collect();
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::from_stream(futures::stream::iter(events)),
        )
            .into_response()
    };
    let models = move || async move {
        if abilities.models {
            axum::Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
                .into_response()
        } else {
            axum::http::StatusCode::NOT_FOUND.into_response()
        }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(completions))
        .route("/v1/models", axum::routing::get(models));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

/// `mtswarm llm check URL --llm-model MODEL`, with `--json` when `json`.
async fn run_check(url: String, json: bool) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(node_bin!());
        command.args([
            "llm",
            "check",
            &url,
            "--llm-model",
            MODEL,
            "--timeout",
            "20",
        ]);
        if json {
            command.arg("--json");
        }
        command
            .env_remove("MTSWARM_LLM_API_KEY")
            .env_remove("MTSWARM_JSON")
            .output()
            .expect("run mtswarm llm check")
    })
    .await
    .expect("join")
}

/// `mtswarm llm check URL --llm-model MODEL --json`: exit code and report.
async fn check(url: String) -> (Option<i32>, Value) {
    let output = run_check(url, true).await;
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "llm check --json: {e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code(), report)
}

fn verdicts(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["capability"].as_str().unwrap_or_default().to_string(),
                c["verdict"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_check_reports_each_capability_of_each_endpoint() {
    let full = serve(Abilities {
        tools: true,
        json_calls: false,
        parallel: true,
        usage: true,
        models: true,
    })
    .await;
    let (code, report) = check(full).await;
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["can_drive_mtswarm"], true);
    assert_eq!(report["tool_mode"], "native", "{report:#}");
    assert_eq!(report["setting"]["flag"], "--llm-tool-mode native");
    assert_eq!(
        verdicts(&report),
        expect(&[
            ("models_list", "works"),
            ("tool_calls", "works"),
            ("tool_results", "works"),
            ("parallel_tool_calls", "works"),
            ("usage", "works"),
        ]),
        "{report:#}"
    );

    let text_only = serve(Abilities {
        tools: false,
        json_calls: false,
        parallel: false,
        usage: true,
        models: true,
    })
    .await;
    let (code, report) = check(text_only).await;
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(report["can_drive_mtswarm"], false);
    assert_eq!(report["tool_mode"], Value::Null);
    assert_eq!(report["setting"], Value::Null);
    assert_eq!(
        verdicts(&report),
        expect(&[
            ("models_list", "works"),
            ("tool_calls", "missing"),
            ("text_tool_calls", "missing"),
            ("tool_results", "failed"),
            ("parallel_tool_calls", "missing"),
            ("usage", "works"),
        ]),
        "{report:#}"
    );
    let tool_calls = &report["checks"][1]["detail"];
    assert!(
        tool_calls
            .as_str()
            .unwrap_or_default()
            .contains("answered in text"),
        "{tool_calls}"
    );

    let sequential = serve(Abilities {
        tools: true,
        json_calls: false,
        parallel: false,
        usage: false,
        models: false,
    })
    .await;
    let (code, report) = check(sequential).await;
    assert_eq!(
        code,
        Some(0),
        "one call per turn still drives jobs: {report:#}"
    );
    assert_eq!(
        verdicts(&report),
        expect(&[
            ("models_list", "failed"),
            ("tool_calls", "works"),
            ("tool_results", "works"),
            ("parallel_tool_calls", "missing"),
            ("usage", "missing"),
        ]),
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_check_names_text_tool_mode_for_a_model_that_writes_its_calls() {
    let json_writer = serve(Abilities {
        tools: false,
        json_calls: true,
        parallel: true,
        usage: true,
        models: true,
    })
    .await;
    let (code, report) = check(json_writer).await;
    assert_eq!(
        code,
        Some(0),
        "calls written as JSON drive jobs: {report:#}"
    );
    assert_eq!(report["tool_mode"], "text", "{report:#}");
    assert_eq!(report["setting"]["flag"], "--llm-tool-mode text");
    assert_eq!(report["setting"]["env"], "MTSWARM_LLM_TOOL_MODE=text");
    assert_eq!(
        verdicts(&report),
        expect(&[
            ("models_list", "works"),
            ("tool_calls", "missing"),
            ("text_tool_calls", "works"),
            ("tool_results", "works"),
            ("parallel_tool_calls", "works"),
            ("usage", "works"),
        ]),
        "{report:#}"
    );
    let native = report["checks"][1]["detail"].as_str().unwrap_or_default();
    assert!(native.contains("no tool_calls"), "{native}");
    let url = report["endpoint"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches("/chat/completions")
        .to_string();
    let printed = String::from_utf8_lossy(&run_check(url, false).await.stdout).into_owned();
    assert!(
        printed.contains("--llm-tool-mode text"),
        "the table names the setting: {printed}"
    );
}
