//! A streaming client for OpenAI-compatible chat-completion endpoints
//! (OpenAI, vLLM, llama.cpp server, Ollama, DeepSeek, Qwen/DashScope, gateways).
//!
//! It sends one `POST {base_url}/chat/completions` with `stream: true` per
//! turn, retries 429/5xx/connection failures with capped exponential backoff
//! and jitter (honouring `Retry-After`), classifies failures into the
//! [`ModelError`] variants the engine's recovery logic keys on, and turns the
//! SSE stream into [`ModelEvent`](crate::ModelEvent)s with tool calls assembled.
//!
//! Why not `async-openai`: its typed stream delta
//! (`ChatCompletionStreamResponseDelta`) has no `reasoning_content` /
//! `reasoning` field, so the reasoning stream of DeepSeek, Qwen and vLLM would
//! be silently dropped and `ThinkingDelta` could not be produced; working
//! around that needs its `byot` feature with our own chunk types, which leaves
//! it doing only the HTTP POST. Its errors also do not keep what the
//! classification here needs in one place (status, `Retry-After`, body), and
//! its retry policy lives behind a separate `middleware` feature. So the client
//! uses `reqwest` directly with `eventsource-stream` (the SSE parser that
//! `async-openai` itself uses) for the event framing.

mod assemble;
mod config;
pub(crate) mod framing;
pub(crate) mod text_calls;
pub(crate) mod text_tools;
mod wire;

use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use mtswarm_core::model::{ChatModel, ChatRequest, ModelError, ModelStream, ToolChoice};
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};

pub(crate) use text_calls::TEXT_CALL_ID_PREFIX;

pub use config::{
    ApiKey, ConfigError, ENV_API_KEY, ENV_EXTRA_BODY, ENV_MAX_RETRIES, ENV_MODEL,
    ENV_OPENAI_API_KEY, ENV_OPENAI_BASE_URL, ENV_TIMEOUT_SECS, ENV_TOOL_MODE, ENV_URL,
    OpenAiConfig, RESERVED_BODY_FIELDS, ToolMode, parse_extra_body,
};

use assemble::{TurnAssembler, stream_error};
pub(crate) use wire::truncate;
use wire::{error_message, mentions_context_overflow, request_body};

/// Largest error body read from a failed response; the message is all that
/// is needed and a misbehaving server must not make the client buffer much.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// A [`ChatModel`] backed by an OpenAI-compatible HTTP endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    config: OpenAiConfig,
    endpoint: reqwest::Url,
    http: reqwest::Client,
}

/// What one HTTP attempt ended with, when it did not produce a stream.
enum AttemptFailure {
    /// Worth trying again after a delay.
    Retryable {
        error: ModelError,
        retry_after: Option<Duration>,
    },
    /// Retrying would give the same answer.
    Final(ModelError),
}

impl OpenAiClient {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: OpenAiConfig) -> Result<Self, ConfigError> {
        config::validate_base_url(&config.base_url)?;
        // A config built field by field gets the check `with_extra_body` does.
        config::check_extra_body(&config.extra_body)?;
        let trimmed = config.base_url.trim_end_matches('/');
        let endpoint_text = if trimmed.ends_with("/chat/completions") {
            trimmed.to_string()
        } else {
            format!("{trimmed}/chat/completions")
        };
        let endpoint =
            reqwest::Url::parse(&endpoint_text).map_err(|e| ConfigError::InvalidUrl {
                url: endpoint_text.clone(),
                reason: e.to_string(),
            })?;

        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        if let Some(key) = &config.api_key {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                    ConfigError::InvalidHeader {
                        name: "Authorization".into(),
                        reason: "the API key contains characters not allowed in an HTTP header"
                            .into(),
                    }
                })?;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        for (name, value) in &config.extra_headers {
            let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| {
                ConfigError::InvalidHeader {
                    name: name.clone(),
                    reason: e.to_string(),
                }
            })?;
            let mut header_value =
                HeaderValue::from_str(value).map_err(|_| ConfigError::InvalidHeader {
                    name: name.clone(),
                    reason: "the value contains characters not allowed in an HTTP header".into(),
                })?;
            header_value.set_sensitive(true);
            headers.insert(header_name, header_value);
        }

        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| ConfigError::HttpClient(e.without_url().to_string()))?;
        Ok(Self {
            config,
            endpoint,
            http,
        })
    }

    /// [`OpenAiConfig::from_env`] followed by [`OpenAiClient::new`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::new(OpenAiConfig::from_env()?)
    }

    /// The configuration the client was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The full URL requests are posted to.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// The model ids `GET {base_url}/models` lists (one attempt, no retries:
    /// a probe, not a job's request).
    pub async fn list_models(&self) -> Result<Vec<String>, ModelError> {
        let base = self.endpoint.as_str().trim_end_matches("/chat/completions");
        let url = format!("{base}/models");
        let timeout = self.config.request_timeout;
        let send = self
            .http
            .get(&url)
            .header(header::ACCEPT, "application/json")
            .send();
        let response = match tokio::time::timeout(timeout, send).await {
            Err(_) => return Err(ModelError::Timeout(millis(timeout))),
            Ok(Err(error)) => {
                return Err(ModelError::Unavailable(format!(
                    "cannot reach {url}: {}",
                    self.redact(&describe_reqwest_error(&error))
                )));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let body = read_error_body(response, timeout).await;
        if !status.is_success() {
            let message = self.redact(&error_message(&body));
            return Err(ModelError::BadRequest(format!(
                "HTTP {}: {message}",
                status.as_u16()
            )));
        }
        let parsed: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| ModelError::Other(format!("{url} answered with no JSON: {e}")))?;
        Ok(parsed
            .get("data")
            .and_then(serde_json::Value::as_array)
            .map(|models| {
                models
                    .iter()
                    .filter_map(|m| m.get("id").and_then(serde_json::Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Sends the request, retrying what is worth retrying, until a successful
    /// response arrives or the retry budget is spent.
    async fn send_with_retries(&self, body: Vec<u8>) -> Result<reqwest::Response, ModelError> {
        let mut retries_done: u32 = 0;
        loop {
            let (error, retry_after) = match self.attempt(body.clone()).await {
                Ok(response) => return Ok(response),
                Err(AttemptFailure::Final(error)) => return Err(error),
                Err(AttemptFailure::Retryable { error, retry_after }) => (error, retry_after),
            };
            if retries_done >= self.config.max_retries {
                return Err(with_attempt_count(error, retries_done + 1));
            }
            let delay = match retry_after {
                Some(requested) => requested.min(self.config.max_retry_after),
                None => backoff_delay(
                    self.config.backoff_base,
                    self.config.backoff_max,
                    retries_done,
                ),
            };
            tracing::warn!(
                model = %self.config.model,
                retry = retries_done + 1,
                max_retries = self.config.max_retries,
                delay_ms = delay.as_millis() as u64,
                error = %error,
                "model request failed, retrying"
            );
            tokio::time::sleep(delay).await;
            retries_done += 1;
        }
    }

    async fn attempt(&self, body: Vec<u8>) -> Result<reqwest::Response, AttemptFailure> {
        let timeout = self.config.request_timeout;
        let send = self
            .http
            .post(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send();
        let response = match tokio::time::timeout(timeout, send).await {
            Err(_) => return Err(AttemptFailure::Final(ModelError::Timeout(millis(timeout)))),
            Ok(Err(error)) => return Err(self.transport_failure(error)),
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = retry_after(response.headers());
        let raw_body = read_error_body(response, timeout).await;
        let message = self.redact(&error_message(&raw_body));
        let described = format!("HTTP {}: {message}", status.as_u16());
        Err(match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                AttemptFailure::Final(ModelError::Auth(described))
            }
            StatusCode::TOO_MANY_REQUESTS => {
                // An exhausted quota does not recover by waiting.
                if message.to_ascii_lowercase().contains("quota") {
                    AttemptFailure::Final(ModelError::RateLimited(described))
                } else {
                    AttemptFailure::Retryable {
                        error: ModelError::RateLimited(described),
                        retry_after,
                    }
                }
            }
            StatusCode::REQUEST_TIMEOUT => AttemptFailure::Retryable {
                error: ModelError::Unavailable(described),
                retry_after,
            },
            status if status.is_server_error() => AttemptFailure::Retryable {
                error: ModelError::Unavailable(described),
                retry_after,
            },
            StatusCode::PAYLOAD_TOO_LARGE => {
                AttemptFailure::Final(ModelError::PromptTooLong(described))
            }
            _ if mentions_context_overflow(&raw_body) => {
                AttemptFailure::Final(ModelError::PromptTooLong(described))
            }
            _ => AttemptFailure::Final(ModelError::BadRequest(described)),
        })
    }

    fn transport_failure(&self, error: reqwest::Error) -> AttemptFailure {
        let text = self.redact(&describe_reqwest_error(&error));
        if error.is_timeout() {
            // Only the connect timeout is enforced by reqwest itself.
            AttemptFailure::Retryable {
                error: ModelError::Timeout(millis(self.config.connect_timeout)),
                retry_after: None,
            }
        } else if error.is_connect() || error.is_request() {
            AttemptFailure::Retryable {
                error: ModelError::Unavailable(format!("cannot reach {}: {text}", self.endpoint)),
                retry_after: None,
            }
        } else {
            AttemptFailure::Final(ModelError::Other(text))
        }
    }

    /// Removes the API key from text that came from the server or the
    /// network stack (some servers echo the key they rejected).
    fn redact(&self, text: &str) -> String {
        redact_key(text, self.config.api_key.as_ref())
    }
}

fn redact_key(text: &str, key: Option<&ApiKey>) -> String {
    match key {
        Some(key) if !key.expose().is_empty() => text.replace(key.expose(), "[redacted]"),
        _ => text.to_string(),
    }
}

#[async_trait]
impl ChatModel for OpenAiClient {
    fn model_name(&self) -> &str {
        &self.config.model
    }

    /// Every endpoint this client speaks to talks the OpenAI API, whoever
    /// hosts it (`gen_ai.request.model` tells the model).
    fn provider_name(&self) -> &str {
        "openai"
    }

    fn context_window(&self) -> Option<u64> {
        self.config.context_tokens
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        self.start_turn(&request).await
    }

    /// The request is only serialized, so the engine's shared request is
    /// borrowed rather than copied.
    async fn stream_shared(
        &self,
        request: std::sync::Arc<ChatRequest>,
    ) -> Result<ModelStream, ModelError> {
        self.start_turn(&request).await
    }
}

impl OpenAiClient {
    async fn start_turn(&self, request: &ChatRequest) -> Result<ModelStream, ModelError> {
        // Calls are read from text only on turns that may call tools.
        let may_call = !request.tools.is_empty() && request.tool_choice != ToolChoice::None;
        if self.config.tool_mode == ToolMode::Text && !request.tools.is_empty() {
            let plain = text_tools::text_request(request);
            let stream = self.stream_turn(&plain).await?;
            return Ok(text_tools::tool_calls_from_text(stream, may_call));
        }
        let stream = self.stream_turn(request).await?;
        Ok(if may_call {
            text_tools::tool_calls_in_native_text(stream)
        } else {
            stream
        })
    }

    async fn stream_turn(&self, request: &ChatRequest) -> Result<ModelStream, ModelError> {
        let body = request_body(&self.config.model, request, &self.config.extra_body)?;
        let bytes = serde_json::to_vec(&body)
            .map_err(|e| ModelError::Other(format!("cannot encode the request body: {e}")))?;
        tracing::debug!(
            model = %self.config.model,
            endpoint = %self.endpoint,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "starting chat completion stream"
        );
        let response = self.send_with_retries(bytes).await?;
        let idle_timeout = self.config.request_timeout;

        let is_json = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if is_json {
            // The server ignored `stream: true` or reported an error with a
            // 200 status; either way there is no event stream to read.
            let raw = read_error_body(response, idle_timeout).await;
            let parsed: Option<serde_json::Value> = serde_json::from_str(&raw).ok();
            return Err(match parsed.as_ref().and_then(|v| v.get("error")) {
                Some(error) => match stream_error(error) {
                    ModelError::Other(m) => ModelError::Other(self.redact(&m)),
                    other => other,
                },
                None => ModelError::Protocol(format!(
                    "the endpoint answered with a JSON document instead of an event stream (does it support stream=true?): {}",
                    self.redact(&truncate(&raw, 300))
                )),
            });
        }

        let key = self.config.api_key.clone();
        let events = framing::lines(response.bytes_stream())
            .eventsource()
            .map(move |item| item.map_err(|e| sse_error(e, key.as_ref())));
        Ok(turn_events(events, idle_timeout))
    }
}

/// The model events of one turn's SSE events: the `data:` payloads through
/// a [`TurnAssembler`] up to `[DONE]` or the end of the body; an `error`
/// event or an undecodable stream ends the turn with its error, and so does
/// a silence of `idle_timeout`.
pub(crate) fn turn_events<S>(mut events: S, idle_timeout: Duration) -> ModelStream
where
    S: futures::Stream<Item = Result<eventsource_stream::Event, ModelError>>
        + Send
        + Unpin
        + 'static,
{
    let stream = async_stream::stream! {
        let mut assembler = TurnAssembler::new();
        let mut saw_done = false;
        loop {
            let next = match tokio::time::timeout(idle_timeout, events.next()).await {
                Ok(next) => next,
                Err(_) => {
                    yield Err(ModelError::Timeout(millis(idle_timeout)));
                    return;
                }
            };
            let event = match next {
                None => break,
                Some(Ok(event)) => event,
                Some(Err(error)) => {
                    yield Err(error);
                    return;
                }
            };
            let data = event.data.trim();
            if event.event == "error" {
                let value = serde_json::from_str(data)
                    .unwrap_or_else(|_| serde_json::Value::String(data.to_string()));
                yield Err(stream_error(&value));
                return;
            }
            if data.is_empty() {
                continue;
            }
            if data == "[DONE]" {
                saw_done = true;
                break;
            }
            match assembler.on_data(data) {
                Ok(produced) => {
                    for item in produced {
                        yield Ok(item);
                    }
                }
                Err(error) => {
                    yield Err(error);
                    return;
                }
            }
        }
        match assembler.on_end(saw_done) {
            Ok(produced) => {
                for item in produced {
                    yield Ok(item);
                }
            }
            Err(error) => yield Err(error),
        }
    };
    Box::pin(stream)
}

fn sse_error(
    error: EventStreamError<framing::FramingError<reqwest::Error>>,
    key: Option<&ApiKey>,
) -> ModelError {
    framing_error(error, |e| {
        ModelError::Unavailable(format!(
            "connection lost mid-stream: {}",
            redact_key(&describe_reqwest_error(&e), key)
        ))
    })
}

/// An event stream that does not decode (bad UTF-8, bad SSE, an event
/// over the size bound) is a protocol error; `transport` words a failure
/// of the connection under it.
pub(crate) fn framing_error<E>(
    error: EventStreamError<framing::FramingError<E>>,
    transport: impl FnOnce(E) -> ModelError,
) -> ModelError {
    match error {
        EventStreamError::Utf8(e) => {
            ModelError::Protocol(format!("the event stream is not valid UTF-8: {e}"))
        }
        EventStreamError::Parser(e) => {
            ModelError::Protocol(format!("the event stream is not valid SSE: {e}"))
        }
        EventStreamError::Transport(framing::FramingError::Transport(e)) => transport(e),
        EventStreamError::Transport(framing::FramingError::EventTooLong) => {
            ModelError::Protocol(format!(
                "the event stream is not valid SSE: an event is longer than {} bytes",
                framing::MAX_EVENT_BYTES
            ))
        }
    }
}

/// The error and its causes, without the URL (which may carry credentials
/// in its query for some gateways).
fn describe_reqwest_error(error: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut current: Option<&dyn std::error::Error> = Some(error);
    while let Some(err) = current {
        let piece = err.to_string();
        if !text.contains(&piece) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&piece);
        }
        current = err.source();
    }
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "<endpoint>");
    }
    text
}

async fn read_error_body(mut response: reqwest::Response, timeout: Duration) -> String {
    let read = async {
        let mut collected: Vec<u8> = Vec::new();
        while let Ok(Some(piece)) = response.chunk().await {
            collected.extend_from_slice(&piece);
            if collected.len() >= MAX_ERROR_BODY_BYTES {
                collected.truncate(MAX_ERROR_BODY_BYTES);
                break;
            }
        }
        collected
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(_) => "(timed out reading the error body)".to_string(),
    }
}

/// `retry-after-ms` (OpenAI, Azure) or `Retry-After` in seconds. The
/// HTTP-date form is not used by model endpoints and falls back to backoff.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let read = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let valid = |v: &f64| v.is_finite() && *v >= 0.0;
    if let Some(ms) = read("retry-after-ms").filter(valid) {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    read("retry-after")
        .filter(valid)
        .map(Duration::from_secs_f64)
}

/// `base * 2^retry`, capped at `max`, scaled by a random factor in [0.5, 1)
/// so that many clients rejected together do not retry in lockstep.
fn backoff_delay(base: Duration, max: Duration, retry: u32) -> Duration {
    let exponential = base.saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX));
    let capped = exponential.min(max);
    let jitter = 0.5 + rand::random::<f64>() * 0.5;
    capped.mul_f64(jitter)
}

fn with_attempt_count(error: ModelError, attempts: u32) -> ModelError {
    let note = |m: String| format!("{m} (after {attempts} attempt(s))");
    match error {
        ModelError::RateLimited(m) => ModelError::RateLimited(note(m)),
        ModelError::Unavailable(m) => ModelError::Unavailable(note(m)),
        other => other,
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        for retry in 0..40 {
            let delay = backoff_delay(base, max, retry);
            let ceiling = base.saturating_mul(1u32 << retry.min(20)).min(max);
            assert!(delay <= ceiling, "retry {retry}: {delay:?} > {ceiling:?}");
            assert!(
                delay >= ceiling / 2,
                "retry {retry}: {delay:?} < half of {ceiling:?}"
            );
        }
    }

    #[test]
    fn retry_after_headers_are_read() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
        let mut dated = HeaderMap::new();
        dated.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&dated), None);
    }

    #[test]
    fn base_url_gets_the_chat_completions_path() {
        let client = OpenAiClient::new(OpenAiConfig::new("http://127.0.0.1:9/v1/", "m")).unwrap();
        assert_eq!(client.endpoint(), "http://127.0.0.1:9/v1/chat/completions");
        let full =
            OpenAiClient::new(OpenAiConfig::new("http://h/v1/chat/completions", "m")).unwrap();
        assert_eq!(full.endpoint(), "http://h/v1/chat/completions");
        assert!(matches!(
            OpenAiClient::new(OpenAiConfig::new("ftp://h", "m")),
            Err(ConfigError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn debug_output_hides_the_key_and_header_values() {
        let config = OpenAiConfig::new("http://h/v1", "m")
            .with_api_key("sk-very-secret")
            .with_header("x-gateway-token", "gw-secret");
        let client = OpenAiClient::new(config.clone()).unwrap();
        for text in [format!("{config:?}"), format!("{client:?}")] {
            assert!(!text.contains("sk-very-secret"), "{text}");
            assert!(!text.contains("gw-secret"), "{text}");
        }
    }

    #[test]
    fn env_lookup_uses_fallbacks_and_names_missing_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let config = OpenAiConfig::from_lookup(vars(&[
            ("OPENAI_BASE_URL", "https://api.example.com/v1"),
            ("OPENAI_API_KEY", "sk-x"),
            ("MTSWARM_LLM_MODEL", "m1"),
            ("MTSWARM_LLM_MAX_RETRIES", "2"),
        ]))
        .unwrap();
        assert_eq!(config.base_url, "https://api.example.com/v1");
        assert_eq!(config.api_key.as_ref().map(ApiKey::expose), Some("sk-x"));
        assert_eq!(config.max_retries, 2);

        let preferred = OpenAiConfig::from_lookup(vars(&[
            ("MTSWARM_LLM_URL", "http://127.0.0.1:8000/v1"),
            ("OPENAI_BASE_URL", "https://api.example.com/v1"),
            ("MTSWARM_LLM_MODEL", "m1"),
        ]))
        .unwrap();
        assert_eq!(preferred.base_url, "http://127.0.0.1:8000/v1");
        assert!(preferred.api_key.is_none());

        let missing_url =
            OpenAiConfig::from_lookup(vars(&[("MTSWARM_LLM_MODEL", "m")])).unwrap_err();
        assert_eq!(missing_url, ConfigError::MissingUrl);
        assert!(missing_url.to_string().contains("MTSWARM_LLM_URL"));
        let missing_model =
            OpenAiConfig::from_lookup(vars(&[("MTSWARM_LLM_URL", "http://h/v1")])).unwrap_err();
        assert!(missing_model.to_string().contains("MTSWARM_LLM_MODEL"));
        let bad_timeout = OpenAiConfig::from_lookup(vars(&[
            ("MTSWARM_LLM_URL", "http://h/v1"),
            ("MTSWARM_LLM_MODEL", "m"),
            ("MTSWARM_LLM_TIMEOUT_SECS", "soon"),
        ]))
        .unwrap_err();
        assert!(bad_timeout.to_string().contains("MTSWARM_LLM_TIMEOUT_SECS"));
    }

    #[test]
    fn extra_body_is_read_from_the_environment_and_reserved_fields_are_named() {
        use serde_json::json;
        let lookup = |body: &'static str| {
            move |name: &str| match name {
                "MTSWARM_LLM_URL" => Some("http://h/v1".to_string()),
                "MTSWARM_LLM_MODEL" => Some("m".to_string()),
                "MTSWARM_LLM_EXTRA_BODY" => Some(body.to_string()),
                _ => None,
            }
        };
        let config = OpenAiConfig::from_lookup(lookup(
            r#"{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}"#,
        ))
        .unwrap();
        assert_eq!(
            config.extra_body["chat_template_kwargs"]["enable_thinking"],
            false
        );
        assert_eq!(config.extra_body["top_k"], 20);
        assert!(format!("{config:?}").contains("top_k"));
        for field in [
            "model",
            "messages",
            "tools",
            "stream",
            "tool_choice",
            "temperature",
        ] {
            let error = parse_extra_body(&format!(r#"{{"top_k": 1, "{field}": 1}}"#)).unwrap_err();
            assert_eq!(
                error,
                ConfigError::ReservedBodyField {
                    field: field.to_string()
                }
            );
            assert!(error.to_string().contains(&format!("`{field}`")), "{error}");
        }
        for (text, says) in [
            ("[1]", "an array"),
            ("{nope", "key must be a string"),
            ("3", "a number"),
        ] {
            let error = parse_extra_body(text).unwrap_err();
            assert!(
                error.to_string().contains(says)
                    && error.to_string().contains("MTSWARM_LLM_EXTRA_BODY"),
                "{error}"
            );
        }
        let refused = OpenAiConfig::from_lookup(lookup(r#"{"messages": []}"#)).unwrap_err();
        assert!(refused.to_string().contains("`messages`"), "{refused}");
        let built = OpenAiConfig::new("http://h/v1", "m")
            .with_extra_body(json!({"tools": []}).as_object().unwrap().clone());
        assert!(built.is_err());
    }
}
