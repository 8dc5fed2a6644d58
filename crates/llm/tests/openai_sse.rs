//! The OpenAI-compatible client against a real HTTP server on loopback that
//! serves genuine SSE bodies, including bodies cut into many small writes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use mtswarm_llm::{
    ChatModel, ChatRequest, FinishReason, Message, ModelError, ModelEvent, ModelStream,
    OpenAiClient, OpenAiConfig, ToolCall, ToolChoice, ToolDefinition, Usage,
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789";

/// What the server answers to one request.
#[derive(Clone)]
enum Reply {
    /// A 200 event stream whose body is written as these separate pieces.
    Sse(Vec<Vec<u8>>),
    /// An error status with a JSON body.
    Status {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        body: String,
    },
    /// Headers only after this long.
    Delay(Duration),
    /// A 200 event stream that sends these pieces and then goes silent.
    SseThenSilence(Vec<Vec<u8>>),
}

impl Reply {
    /// The error status `status` with the JSON body `body` and no headers.
    fn status(status: u16, body: Value) -> Self {
        Reply::Status {
            status,
            headers: vec![],
            body: body.to_string(),
        }
    }
}

#[derive(Clone)]
struct Captured {
    body: Value,
    authorization: Option<String>,
}

#[derive(Default)]
struct ServerState {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Captured>>,
}

struct TestServer {
    base_url: String,
    state: Arc<ServerState>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    async fn start(replies: Vec<Reply>) -> Self {
        let state = Arc::new(ServerState {
            replies: Mutex::new(replies.into()),
            requests: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base_url: format!("http://{addr}/v1"),
            state,
            task,
        }
    }

    fn request_count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }

    fn request(&self, index: usize) -> Captured {
        self.state.requests.lock().unwrap()[index].clone()
    }

    fn client(&self) -> OpenAiClient {
        self.client_with(|c| c)
    }

    fn client_with(&self, adjust: impl FnOnce(OpenAiConfig) -> OpenAiConfig) -> OpenAiClient {
        let config = OpenAiConfig::new(&self.base_url, "test-model")
            .with_api_key(KEY)
            .with_max_retries(3)
            .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
            .with_request_timeout(Duration::from_secs(5));
        OpenAiClient::new(adjust(config)).unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let parsed: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    state.requests.lock().unwrap().push(Captured {
        body: parsed,
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    });
    let reply = state.replies.lock().unwrap().pop_front();
    match reply {
        Some(Reply::Sse(pieces)) => sse_response(pieces, false),
        Some(Reply::SseThenSilence(pieces)) => sse_response(pieces, true),
        Some(Reply::Status {
            status,
            headers,
            body,
        }) => {
            let mut builder = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            builder.body(Body::from(body)).unwrap()
        }
        Some(Reply::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            sse_response(vec!["data: [DONE]\n\n".into()], false)
        }
        None => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Body::from("test server has no reply scripted"))
            .unwrap(),
    }
}

/// Streams `pieces` as separate body frames. The short pause between them
/// makes each piece its own TCP write, so the client sees lines and JSON
/// documents cut at arbitrary points.
fn sse_response(pieces: Vec<Vec<u8>>, then_silence: bool) -> Response {
    let body = async_stream::stream! {
        for piece in pieces {
            yield Ok::<Vec<u8>, std::io::Error>(piece);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if then_silence {
            futures::future::pending::<()>().await;
        }
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(body))
        .unwrap()
}

/// An SSE body made of one `data:` event per chunk, then `[DONE]`.
fn sse_text(chunks: &[Value]) -> String {
    let mut text = String::new();
    for chunk in chunks {
        text.push_str("data: ");
        text.push_str(&chunk.to_string());
        text.push_str("\n\n");
    }
    text.push_str("data: [DONE]\n\n");
    text
}

/// Cuts `text` into pieces of `size` bytes, ignoring character boundaries.
fn split_every(text: &str, size: usize) -> Vec<Vec<u8>> {
    text.as_bytes().chunks(size).map(<[u8]>::to_vec).collect()
}

/// The whole body as a single piece.
fn whole(text: String) -> Vec<Vec<u8>> {
    vec![text.into_bytes()]
}

fn delta(delta: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "test-model",
           "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn finish(reason: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "test-model",
           "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "test-model", "choices": [],
           "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
}

fn simple_request() -> ChatRequest {
    ChatRequest {
        messages: vec![Message::system("be brief"), Message::user("hello")],
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: None,
        temperature: None,
    }
}

/// Drains a stream: all events up to the first error, and that error.
async fn drain(stream: ModelStream) -> (Vec<ModelEvent>, Option<ModelError>) {
    let drained = async {
        let mut stream = stream;
        let mut events = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => events.push(event),
                Err(error) => {
                    assert!(
                        stream.next().await.is_none(),
                        "stream continued after an error"
                    );
                    return (events, Some(error));
                }
            }
        }
        (events, None)
    };
    tokio::time::timeout(Duration::from_secs(20), drained)
        .await
        .expect("stream did not end within 20 s")
}

/// The error a default client gets from a server whose one answer is
/// `reply`; the client must not have retried.
async fn error_from_one_reply(reply: Reply) -> ModelError {
    let server = TestServer::start(vec![reply]).await;
    let error = run(&server.client(), simple_request()).await.unwrap_err();
    assert_eq!(server.request_count(), 1);
    error
}

async fn run(
    client: &OpenAiClient,
    request: ChatRequest,
) -> Result<(Vec<ModelEvent>, Option<ModelError>), ModelError> {
    let stream = tokio::time::timeout(Duration::from_secs(20), client.stream(request))
        .await
        .expect("stream() did not return within 20 s")?;
    Ok(drain(stream).await)
}

fn text(t: &str) -> ModelEvent {
    ModelEvent::TextDelta { text: t.into() }
}

#[tokio::test]
async fn text_and_reasoning_deltas_arrive_in_order_from_split_body() {
    let mut body = String::from(": keep-alive comment\n\n");
    body.push_str(&sse_text(&[
        delta(json!({"role": "assistant", "content": ""})),
        delta(json!({"reasoning_content": "The user greets."})),
        delta(json!({"content": "Hel"})),
        delta(json!({"content": "lo"})),
        delta(json!({"content": " wörld"})),
        finish("stop"),
        usage(12, 3),
    ]));
    // Pieces of a few bytes cut SSE lines and JSON documents; the size is
    // chosen so that one cut also falls inside the two-byte 'ö'.
    let pieces = (5..16)
        .map(|size| split_every(&body, size))
        .find(|pieces| pieces.iter().any(|p| std::str::from_utf8(p).is_err()))
        .expect("some small piece size cuts the 'ö' in two");
    let server = TestServer::start(vec![Reply::Sse(pieces)]).await;
    let client = server.client();

    let (events, error) = run(&client, simple_request()).await.unwrap();

    assert_eq!(error, None);
    assert_eq!(
        events,
        vec![
            ModelEvent::ThinkingDelta {
                text: "The user greets.".into()
            },
            text("Hel"),
            text("lo"),
            text(" wörld"),
            ModelEvent::Usage {
                usage: Usage {
                    input_tokens: 12,
                    output_tokens: 3
                }
            },
            ModelEvent::Finish {
                reason: FinishReason::Stop
            },
        ]
    );
    assert_eq!(server.request_count(), 1);
    let captured = server.request(0);
    assert_eq!(
        captured.authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(captured.body["model"], "test-model");
    assert_eq!(captured.body["stream"], true);
    assert_eq!(
        captured.body["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(
        captured.body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    );
    assert!(
        captured.body.get("tools").is_none(),
        "no tools were offered: {}",
        captured.body
    );
}

#[tokio::test]
async fn tool_call_arguments_split_across_chunks_are_assembled() {
    let body = sse_text(&[
        delta(json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_abc", "type": "function", "function": {"name": "run_kernel", "arguments": ""}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"kernel\": "}}]})),
        delta(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"gemm\", \"tile\""}}]}),
        ),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": ": 64}"}}]})),
        finish("tool_calls"),
        usage(40, 17),
    ]);
    let server = TestServer::start(vec![Reply::Sse(split_every(&body, 11))]).await;

    let (events, error) = run(&server.client(), simple_request()).await.unwrap();

    assert_eq!(error, None);
    assert_eq!(
        events,
        vec![
            ModelEvent::ToolCall {
                call: ToolCall {
                    id: "call_abc".into(),
                    name: "run_kernel".into(),
                    arguments: "{\"kernel\": \"gemm\", \"tile\": 64}".into(),
                }
            },
            ModelEvent::Usage {
                usage: Usage {
                    input_tokens: 40,
                    output_tokens: 17
                }
            },
            ModelEvent::Finish {
                reason: FinishReason::ToolCalls
            },
        ]
    );
}

#[tokio::test]
async fn several_tool_calls_in_one_turn_are_emitted_in_index_order() {
    // The deltas of the two calls interleave, and call 1 starts first.
    let body = sse_text(&[
        delta(json!({"content": "Checking both."})),
        delta(
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\""}}]}),
        ),
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "list_boards", "arguments": ""}}]}),
        ),
        delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": ": \"a.c\"}"}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})),
        delta(
            json!({"tool_calls": [{"index": 2, "id": "call_c", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"b.c\"}"}}]}),
        ),
    ]);
    // No finish_reason: the calls must still be flushed at [DONE].
    let server = TestServer::start(vec![Reply::Sse(split_every(&body, 16))]).await;

    let (events, error) = run(&server.client(), simple_request()).await.unwrap();

    assert_eq!(error, None);
    let call = |id: &str, name: &str, arguments: &str| ModelEvent::ToolCall {
        call: ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        },
    };
    assert_eq!(
        events,
        vec![
            text("Checking both."),
            call("call_a", "list_boards", "{}"),
            call("call_b", "read_file", "{\"path\": \"a.c\"}"),
            call("call_c", "read_file", "{\"path\": \"b.c\"}"),
            ModelEvent::Finish {
                reason: FinishReason::ToolCalls
            },
        ]
    );
}

#[tokio::test]
async fn malformed_chunk_ends_the_stream_with_a_protocol_error() {
    let body = format!(
        "data: {}\n\ndata: {{\"choices\": [{{\"index\": 0, \"delta\": {{\"content\": \"oops\"\n\ndata: [DONE]\n\n",
        delta(json!({"content": "fine"}))
    );
    let server = TestServer::start(vec![Reply::Sse(split_every(&body, 9))]).await;

    let (events, error) = run(&server.client(), simple_request()).await.unwrap();

    assert_eq!(events, vec![text("fine")]);
    match error {
        Some(ModelError::Protocol(message)) => {
            assert!(message.contains("chunk 2"), "{message}");
            assert!(
                message.contains("not valid chat-completion JSON"),
                "{message}"
            );
            assert!(
                message.contains("oops"),
                "the offending data should be quoted: {message}"
            );
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[tokio::test]
async fn rate_limit_is_retried_after_retry_after_and_then_succeeds() {
    let server = TestServer::start(vec![
        Reply::Status {
            status: 429,
            headers: vec![("retry-after", "0")],
            body: json!({"error": {"message": "Rate limit reached", "type": "requests"}})
                .to_string(),
        },
        Reply::Sse(whole(sse_text(&[
            delta(json!({"content": "ok"})),
            finish("stop"),
        ]))),
    ])
    .await;
    // A backoff of 60-120 s would blow the test's own timeout: passing shows
    // Retry-After (0 s) was used instead of the backoff.
    let client =
        server.client_with(|c| c.with_backoff(Duration::from_secs(120), Duration::from_secs(120)));

    let (events, error) = run(&client, simple_request()).await.unwrap();

    assert_eq!(error, None);
    assert_eq!(
        events,
        vec![
            text("ok"),
            ModelEvent::Finish {
                reason: FinishReason::Stop
            }
        ]
    );
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn persistent_rate_limit_gives_up_after_max_retries() {
    let limited = Reply::status(429, json!({"error": {"message": "slow down"}}));
    let server = TestServer::start(vec![limited.clone(), limited.clone(), limited]).await;
    let client = server.client_with(|c| c.with_max_retries(2));

    let error = run(&client, simple_request()).await.unwrap_err();

    assert!(
        matches!(&error, ModelError::RateLimited(m) if m.contains("slow down") && m.contains("3 attempt")),
        "{error:?}"
    );
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn server_errors_are_retried_then_reported_unavailable() {
    let overloaded = Reply::status(503, json!({"error": {"message": "overloaded"}}));
    let server = TestServer::start(vec![overloaded.clone(), overloaded]).await;
    let client = server.client_with(|c| c.with_max_retries(1));

    let error = run(&client, simple_request()).await.unwrap_err();

    assert!(
        matches!(&error, ModelError::Unavailable(m) if m.contains("503") && m.contains("overloaded")),
        "{error:?}"
    );
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn unauthorized_fails_at_once_and_never_shows_the_key() {
    // Like OpenAI, the server echoes the rejected key.
    let server = TestServer::start(vec![Reply::status(401, json!({"error": {"message": format!("Incorrect API key provided: {KEY}."), "code": "invalid_api_key"}}))])
    .await;
    let client = server.client();

    let error = run(&client, simple_request()).await.unwrap_err();

    assert!(
        matches!(&error, ModelError::Auth(m) if m.contains("Incorrect API key")),
        "{error:?}"
    );
    assert!(
        !error.to_string().contains(KEY),
        "key leaked into the error: {error}"
    );
    assert!(!format!("{error:?}").contains(KEY));
    assert!(
        !format!("{client:?}").contains(KEY),
        "key leaked into Debug: {client:?}"
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn context_length_400_is_prompt_too_long() {
    let error = error_from_one_reply(Reply::status(400, json!({"object": "error", "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.", "type": "BadRequestError", "code": 400}))).await;

    assert!(
        matches!(&error, ModelError::PromptTooLong(m) if m.contains("8192")),
        "{error:?}"
    );
}

/// llama.cpp's server words it its own way; the engine must still see a
/// prompt that did not fit (and compact), not a failed request.
#[tokio::test]
async fn llama_cpp_context_size_400_is_prompt_too_long() {
    let error = error_from_one_reply(Reply::status(400, json!({"error": {"code": 400, "message": "request (8362 tokens) exceeds the available context size (8192 tokens), try increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 8362, "n_ctx": 8192}}))).await;

    assert!(
        matches!(&error, ModelError::PromptTooLong(m) if m.contains("8192")),
        "{error:?}"
    );
}

#[tokio::test]
async fn other_400_is_bad_request_with_the_server_message() {
    let error = error_from_one_reply(Reply::status(400, json!({"error": {"message": "Invalid value for 'temperature': must be <= 2", "type": "invalid_request_error"}}))).await;

    assert!(
        matches!(&error, ModelError::BadRequest(m) if m.contains("'temperature'") && m.contains("400")),
        "{error:?}"
    );
}

#[tokio::test]
async fn slow_response_headers_time_out() {
    let server = TestServer::start(vec![Reply::Delay(Duration::from_secs(30))]).await;
    let client = server.client_with(|c| c.with_request_timeout(Duration::from_millis(300)));

    let error = run(&client, simple_request()).await.unwrap_err();

    assert_eq!(error, ModelError::Timeout(300));
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn stream_that_goes_silent_times_out_mid_turn() {
    let first = format!("data: {}\n\n", delta(json!({"content": "partial"})));
    let server = TestServer::start(vec![Reply::SseThenSilence(whole(first))]).await;
    let client = server.client_with(|c| c.with_request_timeout(Duration::from_millis(300)));

    let (events, error) = run(&client, simple_request()).await.unwrap();

    assert_eq!(events, vec![text("partial")]);
    assert_eq!(error, Some(ModelError::Timeout(300)));
}

#[tokio::test]
async fn unreachable_endpoint_is_unavailable_after_retries() {
    // A port that was just free: nothing listens there any more.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let config = OpenAiConfig::new(format!("http://{addr}/v1"), "m")
        .with_max_retries(1)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(2));
    let client = OpenAiClient::new(config).unwrap();

    let error = run(&client, simple_request()).await.unwrap_err();

    assert!(
        matches!(&error, ModelError::Unavailable(m) if m.contains("cannot reach") && m.contains("2 attempt")),
        "{error:?}"
    );
}

#[tokio::test]
async fn request_body_uses_openai_tool_and_message_shapes() {
    let server = TestServer::start(vec![Reply::Sse(whole(sse_text(&[finish("stop")])))]).await;
    let request = ChatRequest {
        messages: vec![
            Message::system("tune kernels"),
            Message::user("make gemm faster"),
            Message::assistant(
                "",
                vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "compile".into(),
                        arguments: "{\"src\":\"k.c\"}".into(),
                    },
                    ToolCall {
                        id: "call_2".into(),
                        name: "bench".into(),
                        arguments: "{}".into(),
                    },
                ],
            ),
            Message::tool("call_1", "compiled ok"),
            Message::tool("call_2", "3.2 GFLOP/s"),
            Message::assistant("Compiled and measured.", vec![]),
        ],
        tools: vec![ToolDefinition {
            name: "compile".into(),
            description: "Compile a kernel".into(),
            parameters: json!({"type": "object", "properties": {"src": {"type": "string"}}, "required": ["src"]}),
        }],
        tool_choice: ToolChoice::Required,
        max_tokens: Some(512),
        temperature: Some(0.25),
    };

    let (events, error) = run(&server.client(), request).await.unwrap();
    assert_eq!(error, None);
    assert_eq!(
        events,
        vec![ModelEvent::Finish {
            reason: FinishReason::Stop
        }]
    );

    let body = server.request(0).body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["tools"],
        json!([{"type": "function", "function": {
            "name": "compile",
            "description": "Compile a kernel",
            "parameters": {"type": "object", "properties": {"src": {"type": "string"}}, "required": ["src"]},
        }}])
    );
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(body["max_tokens"], 512);
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "compile", "arguments": "{\"src\":\"k.c\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "bench", "arguments": "{}"}},
        ]})
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "compiled ok"})
    );
    assert_eq!(
        body["messages"][4],
        json!({"role": "tool", "tool_call_id": "call_2", "content": "3.2 GFLOP/s"})
    );
    assert_eq!(
        body["messages"][5],
        json!({"role": "assistant", "content": "Compiled and measured."})
    );
}

#[tokio::test]
async fn crlf_line_endings_and_event_without_space_are_accepted() {
    let body = format!(
        "data:{}\r\n\r\ndata: {}\r\n\r\ndata: [DONE]\r\n\r\n",
        delta(json!({"content": "a"})),
        finish("length")
    );
    let server = TestServer::start(vec![Reply::Sse(split_every(&body, 5))]).await;

    let (events, error) = run(&server.client(), simple_request()).await.unwrap();

    assert_eq!(error, None);
    assert_eq!(
        events,
        vec![
            text("a"),
            ModelEvent::Finish {
                reason: FinishReason::Length
            }
        ]
    );
}

#[tokio::test]
async fn extra_body_fields_arrive_in_every_request_beside_the_clients_own() {
    let reply = || {
        Reply::Sse(whole(sse_text(&[
            delta(json!({"role": "assistant", "content": "ok"})),
            finish("stop"),
        ])))
    };
    let server = TestServer::start(vec![reply(), reply()]).await;
    let extra = mtswarm_llm::openai::parse_extra_body(
        r#"{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}"#,
    )
    .unwrap();
    let client = server.client_with(|c| c.with_extra_body(extra).unwrap());
    for _ in 0..2 {
        let (events, error) = run(&client, simple_request()).await.unwrap();
        assert!(error.is_none(), "{error:?}");
        assert!(events.contains(&text("ok")), "{events:?}");
    }
    assert_eq!(server.request_count(), 2);
    for index in 0..2 {
        let body = server.request(index).body;
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false}),
            "{body}"
        );
        assert_eq!(body["top_k"], 20, "{body}");
        // What the client sets is untouched.
        assert_eq!(body["model"], "test-model");
        assert_eq!(body["stream"], true);
        assert_eq!(body["messages"][1]["content"], "hello");
    }

    // A field the client sets itself is refused when the client is made,
    // naming it, and nothing is sent.
    let mut config = OpenAiConfig::new(&server.base_url, "test-model");
    config.extra_body = json!({"stream": false}).as_object().unwrap().clone();
    let Err(error) = OpenAiClient::new(config) else {
        panic!("a reserved field is refused");
    };
    assert!(error.to_string().contains("`stream`"), "{error}");
    assert_eq!(server.request_count(), 2);
}
