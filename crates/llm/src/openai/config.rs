//! Settings for the OpenAI-compatible client, and reading them from the
//! environment.
//!
//! The API key lives in [`ApiKey`], whose `Debug` never shows the secret, so a
//! config can be logged or put in an error message without leaking it.

use std::fmt;
use std::time::Duration;

/// Variable naming the endpoint base URL (e.g. `http://127.0.0.1:8000/v1`).
pub const ENV_URL: &str = "MTSWARM_LLM_URL";
/// Variable naming the model to request.
pub const ENV_MODEL: &str = "MTSWARM_LLM_MODEL";
/// Variable holding the API key (optional: local servers need none).
pub const ENV_API_KEY: &str = "MTSWARM_LLM_API_KEY";
/// Fallback for [`ENV_URL`].
pub const ENV_OPENAI_BASE_URL: &str = "OPENAI_BASE_URL";
/// Fallback for [`ENV_API_KEY`].
pub const ENV_OPENAI_API_KEY: &str = "OPENAI_API_KEY";
/// Optional override of [`OpenAiConfig::request_timeout`], in seconds.
pub const ENV_TIMEOUT_SECS: &str = "MTSWARM_LLM_TIMEOUT_SECS";
/// Optional override of [`OpenAiConfig::max_retries`].
pub const ENV_MAX_RETRIES: &str = "MTSWARM_LLM_MAX_RETRIES";
/// Optional [`OpenAiConfig::tool_mode`]: `native` (default) or `text`.
pub const ENV_TOOL_MODE: &str = "MTSWARM_LLM_TOOL_MODE";
/// Optional [`OpenAiConfig::extra_body`]: one JSON object.
pub const ENV_EXTRA_BODY: &str = "MTSWARM_LLM_EXTRA_BODY";

/// Body fields mtswarm sets itself (or must keep as they are for the
/// stream to be read): an extra body may not name them.
pub const RESERVED_BODY_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "max_tokens",
    "temperature",
    "n",
];

/// How tools reach the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// The OpenAI `tools` field; the server returns `tool_calls`.
    #[default]
    Native,
    /// For servers without tool calling: the tools are described in the
    /// system message and the model writes its calls as JSON in its text
    /// (see `text_tools`).
    Text,
}

impl ToolMode {
    /// The mode as [`ToolMode::parse`] reads it (`native`, `text`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Text => "text",
        }
    }

    /// Parses `native` or `text`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "native" => Some(Self::Native),
            "text" => Some(Self::Text),
            _ => None,
        }
    }
}

/// A secret bearer token. `Debug` and `Display` print a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a secret token.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, for building the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Everything [`super::OpenAiClient`] needs to talk to an endpoint.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Base URL of the API, up to and including the version segment, e.g.
    /// `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`. The client
    /// posts to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when present.
    pub api_key: Option<ApiKey>,
    /// The `model` field of every request.
    pub model: String,
    /// Longest wait for the response headers, and for each further piece of
    /// the stream once it has started. A generation may take longer than this
    /// in total as long as the server keeps sending.
    pub request_timeout: Duration,
    /// Longest wait for the TCP (and TLS) connection to be established.
    pub connect_timeout: Duration,
    /// How many times a failed attempt (429, 5xx, connection error) is
    /// repeated before giving up; 0 means a single attempt.
    pub max_retries: u32,
    /// Delay before the first retry; doubled on each further retry.
    pub backoff_base: Duration,
    /// Upper bound of the exponential backoff delay.
    pub backoff_max: Duration,
    /// Upper bound on a server-requested `Retry-After` delay; a server asking
    /// for longer is waited on for this long only.
    pub max_retry_after: Duration,
    /// Additional headers sent with every request (e.g. an organisation or
    /// gateway header). Values are treated as secrets in `Debug` output.
    pub extra_headers: Vec<(String, String)>,
    /// How tools reach the model (default: natively).
    pub tool_mode: ToolMode,
    /// JSON fields added to every chat request body, for what a server
    /// takes beyond the OpenAI schema (`{"chat_template_kwargs":
    /// {"enable_thinking": false}}` for Qwen on vLLM, `top_k`, ...). Never
    /// one of [`RESERVED_BODY_FIELDS`] (see [`OpenAiConfig::with_extra_body`]).
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    /// The context window the server gives each request, in tokens, when
    /// it is smaller than the engine assumes (a local server's slot: 8192
    /// for `mtswarm llm serve`). The engine then compacts the conversation
    /// before it outgrows the window instead of the server refusing it.
    pub context_tokens: Option<u64>,
}

impl OpenAiConfig {
    /// A config with the default timeouts and retry policy.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            request_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_retries: 4,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(20),
            max_retry_after: Duration::from_secs(60),
            extra_headers: Vec::new(),
            tool_mode: ToolMode::Native,
            extra_body: serde_json::Map::new(),
            context_tokens: None,
        }
    }

    /// Sets [`OpenAiConfig::extra_body`]; an object naming a field mtswarm
    /// sets itself is refused with that field's name.
    pub fn with_extra_body(
        mut self,
        fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Self, ConfigError> {
        check_extra_body(&fields)?;
        self.extra_body = fields;
        Ok(self)
    }

    /// Sets [`OpenAiConfig::context_tokens`].
    pub fn with_context_tokens(mut self, tokens: Option<u64>) -> Self {
        self.context_tokens = tokens.filter(|t| *t > 0);
        self
    }

    /// Sets [`OpenAiConfig::tool_mode`].
    pub fn with_tool_mode(mut self, mode: ToolMode) -> Self {
        self.tool_mode = mode;
        self
    }

    /// Sends `key` as the bearer token.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    /// Sets [`OpenAiConfig::request_timeout`] (default 120 s).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`OpenAiConfig::connect_timeout`] (default 10 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`OpenAiConfig::max_retries`] (default 4).
    pub fn with_max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Sets the first retry delay and its upper bound (default 500 ms and 20 s).
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Adds a header sent with every request.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// Reads the process environment; see [`OpenAiConfig::from_lookup`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Builds a config from variables returned by `lookup`:
    /// `MTSWARM_LLM_URL` (fallback `OPENAI_BASE_URL`, required),
    /// `MTSWARM_LLM_MODEL` (required), `MTSWARM_LLM_API_KEY` (fallback
    /// `OPENAI_API_KEY`, optional), `MTSWARM_LLM_TIMEOUT_SECS` and
    /// `MTSWARM_LLM_MAX_RETRIES`, `MTSWARM_LLM_TOOL_MODE` and
    /// `MTSWARM_LLM_EXTRA_BODY` (optional). Empty values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };

        let base_url = get(ENV_URL)
            .or_else(|| get(ENV_OPENAI_BASE_URL))
            .ok_or(ConfigError::MissingUrl)?;
        validate_base_url(&base_url)?;
        let model = get(ENV_MODEL).ok_or(ConfigError::MissingModel)?;

        let mut config = Self::new(base_url, model);
        config.api_key = get(ENV_API_KEY)
            .or_else(|| get(ENV_OPENAI_API_KEY))
            .map(ApiKey::new);
        if let Some(raw) = get(ENV_TIMEOUT_SECS) {
            let secs: f64 = raw
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| ConfigError::InvalidValue {
                    variable: ENV_TIMEOUT_SECS,
                    value: raw.clone(),
                    expected: "a positive number of seconds",
                })?;
            config.request_timeout = Duration::from_secs_f64(secs);
        }
        if let Some(raw) = get(ENV_MAX_RETRIES) {
            config.max_retries = raw.parse().map_err(|_| ConfigError::InvalidValue {
                variable: ENV_MAX_RETRIES,
                value: raw.clone(),
                expected: "a non-negative integer",
            })?;
        }
        if let Some(raw) = get(ENV_EXTRA_BODY) {
            config.extra_body = parse_extra_body(&raw)?;
        }
        if let Some(raw) = get(ENV_TOOL_MODE) {
            config.tool_mode = ToolMode::parse(&raw).ok_or_else(|| ConfigError::InvalidValue {
                variable: ENV_TOOL_MODE,
                value: raw.clone(),
                expected: "native or text",
            })?;
        }
        Ok(config)
    }
}

/// Parses an extra body (`--llm-extra-body`, [`ENV_EXTRA_BODY`]): one JSON
/// object none of whose fields is reserved (see [`RESERVED_BODY_FIELDS`]).
pub fn parse_extra_body(
    text: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
    let fields = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(fields)) => fields,
        Ok(other) => {
            return Err(ConfigError::InvalidExtraBody {
                reason: format!("expected a JSON object, got {}", json_kind(&other)),
            });
        }
        Err(e) => {
            return Err(ConfigError::InvalidExtraBody {
                reason: e.to_string(),
            });
        }
    };
    check_extra_body(&fields)?;
    Ok(fields)
}

pub(crate) fn check_extra_body(
    fields: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), ConfigError> {
    match fields
        .keys()
        .find(|k| RESERVED_BODY_FIELDS.contains(&k.trim()))
    {
        Some(field) => Err(ConfigError::ReservedBodyField {
            field: field.clone(),
        }),
        None => Ok(()),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Checks that `url` is an absolute http(s) URL.
pub(crate) fn validate_base_url(url: &str) -> Result<(), ConfigError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| ConfigError::InvalidUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    if parsed.scheme() != "http" && parsed.scheme() != "https" {
        return Err(ConfigError::InvalidUrl {
            url: url.to_string(),
            reason: format!("scheme must be http or https, not {}", parsed.scheme()),
        });
    }
    Ok(())
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.extra_headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("model", &self.model)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("max_retry_after", &self.max_retry_after)
            .field("extra_headers", &header_names)
            .field("tool_mode", &self.tool_mode)
            .field("extra_body", &self.extra_body.keys().collect::<Vec<_>>())
            .field("context_tokens", &self.context_tokens)
            .finish()
    }
}

/// Why a config could not be built or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No base URL in the environment.
    #[error(
        "no model endpoint configured: set {ENV_URL} (or {ENV_OPENAI_BASE_URL}) to the API base URL, e.g. http://127.0.0.1:8000/v1"
    )]
    MissingUrl,
    /// No model name in the environment.
    #[error("no model name configured: set {ENV_MODEL} to the model to request, e.g. gpt-4o-mini")]
    MissingModel,
    /// The base URL does not parse or is not `http`/`https`.
    #[error("invalid model endpoint URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An environment variable holds a value of the wrong shape.
    #[error("invalid value {value:?} for {variable}: expected {expected}")]
    InvalidValue {
        /// The environment variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it should hold, e.g. `"a non-negative integer"`.
        expected: &'static str,
    },
    /// An extra header's name or value is not valid in HTTP.
    #[error("invalid extra header {name:?}: {reason}")]
    InvalidHeader {
        /// The header name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The extra body is not a JSON object.
    #[error("invalid extra body ({ENV_EXTRA_BODY} / --llm-extra-body): {reason}")]
    InvalidExtraBody {
        /// What is wrong with it.
        reason: String,
    },
    /// The extra body names a field mtswarm sets itself.
    #[error(
        "the extra body may not set `{field}`: mtswarm sets it itself (reserved: model, messages, stream, stream_options, tools, tool_choice, functions, function_call, max_tokens, temperature, n)"
    )]
    ReservedBodyField {
        /// The refused field.
        field: String,
    },
    /// The HTTP client could not be built (e.g. TLS setup failed).
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
}
