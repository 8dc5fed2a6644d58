//! The builtin worker policy: the model that drives a worker session when no
//! LLM is configured. It is an ordinary [`ChatModel`]: every turn it reads
//! the conversation (the task in the first user message, its own earlier
//! tool calls and their results) and answers with the next tool call or the
//! final answer, so the engine, the approvals, the hardware lock and the
//! events are exercised exactly as with a real model.
//!
//! # Task parameters
//!
//! The first user message carries a line `Kernel directory: <dir>` and a
//! fenced ```` ```json ```` block after `Task parameters:` (see
//! [`render_task_message`]) holding one JSON object:
//!
//! - `{"noop": true}`: answer at once, no tools (latency benchmarks);
//! - `{"candidates": [{"CHUNK": 1024, "BUF": 2}, ...]}`: `-D` maps to try;
//! - `{"params": {"CHUNK": 1024}}`: a single candidate;
//! - every candidate is checked against the kernel's tune.toml before the
//!   task runs (an unknown name, a value outside the space or a broken
//!   constraint fails the task naming it); `"unchecked_defines": true`
//!   skips the check (fault knobs, experiments outside the space);
//! - optional `"cores"`, `"warmup"`, `"repeats"` (benchmark settings),
//!   `"validate_runs"` (executions checked per validate) and `"kernel_dir"`
//!   (overrides the line above);
//! - optional search settings (see [`search`]): `"max_evaluations"` (at most
//!   this many hardware calls, i.e. `validate` plus `benchmark` calls, in the
//!   whole task), `"finalists"` (screened candidates that get a full
//!   benchmark, default 2), `"compile_ahead"` (build the next candidates
//!   in the background while the slice runs, default true),
//!   `"compile_depth"` (candidates kept built or building ahead, default
//!   [`search::DEFAULT_COMPILE_DEPTH`]), `"estimate"`
//!   (rank by the roofline estimate, default true), `"analyze"` (drop
//!   candidates whose static footprint overflows on-chip memory, default
//!   true) and `"strategy"`
//!   (`"search"` or `"sequential"`; default: `search` when a budget is
//!   given or there are more candidates than finalists, else `sequential`).
//!
//! Two plans:
//!
//! - `sequential`: per candidate, in list order, `compile`, then `validate`
//!   on the artifact, then `benchmark`; a failed or denied step drops the
//!   candidate. Every candidate gets its full benchmark.
//! - `search` ([`search`]): rank by the estimate, screen candidates with one
//!   `validate` each (which already yields a time), walk from the best
//!   towards its neighbours, prune what the roofline says cannot win,
//!   build the next candidates in the background while the slice runs the
//!   current one, and spend full benchmarks on the finalists only.
//!
//! # Keeping the slice busy
//!
//! The search plan is built so that the slice's hardware lock is held as
//! much of the *tuning phase* as possible. The tuning phase of a slice runs
//! from the first time one of its hardware calls (`validate`, `benchmark`)
//! acquires the slice lock to the last time one releases it; its
//! utilization is the time the lock was held over that span
//! (`mtswarm_tools::TuningPhase`, and per slice in the `mtswarm demo`
//! output). Reading, analysing and the first compile come before it; the
//! answer comes after it. Inside it the slice waits only when a background
//! build is late (see [`search`]); validated artifacts are benchmarked as
//! they are, never rebuilt.
//!
//! The final answer names the fastest benchmarked candidate and ends with a
//! ```` ```json ```` block `{"best": {...} | null, "candidates": [...]}`
//! (the search plan adds `"strategy"`, `"evaluations"` and
//! `"max_evaluations"`).
//!
//! Call ids encode the plan (`c<index>-<tool>`), which is how the policy
//! finds its place again after a pause or a resume in another process. A
//! session resumed in another process has none of its earlier builds; a
//! validate or benchmark that reports its artifact unknown makes the policy
//! compile that candidate again (`c<index>-compile-r<n>`, at most twice).

pub mod search;

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use futures::stream;
use mtswarm_core::model::{FinishReason, ModelEvent};
use mtswarm_core::{ChatModel, ChatRequest, Message, ModelError, ModelStream, Role, ToolCall};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The line of the task message naming the kernel directory.
pub const KERNEL_DIR_LINE: &str = "Kernel directory:";
/// The line introducing the parameters block.
pub const PARAMETERS_LINE: &str = "Task parameters:";

/// Render the first user message of a task in the format the policy reads.
pub fn render_task_message(
    task_id: &str,
    kernel_dir: &str,
    instructions: &str,
    parameters: &Value,
) -> String {
    let params = serde_json::to_string_pretty(parameters).unwrap_or_else(|_| "{}".to_owned());
    let instructions = if instructions.trim().is_empty() {
        "Tune the kernel with the given parameters and report the fastest valid configuration."
    } else {
        instructions.trim()
    };
    format!(
        "Task {task_id}.\n{KERNEL_DIR_LINE} {kernel_dir}\nInstructions: {instructions}\n{PARAMETERS_LINE}\n```json\n{params}\n```\n"
    )
}

/// What the policy was asked to do.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskParameters {
    pub noop: bool,
    pub kernel_dir: String,
    /// `-D` maps, values as text.
    pub candidates: Vec<BTreeMap<String, String>>,
    pub cores: Option<u32>,
    pub warmup: Option<u32>,
    pub repeats: Option<u32>,
    /// Kernel executions checked by each validate (the tool's default: 2).
    pub validate_runs: Option<u32>,
    /// Hardware calls (validate + benchmark) allowed in the whole task.
    pub max_evaluations: Option<u32>,
    /// `None`: chosen from the list size and the budget.
    pub strategy: Option<Strategy>,
    /// Screened candidates that get a full benchmark (search plan).
    pub finalists: u32,
    /// Build the next candidates in the background while the slice runs
    /// the current one.
    pub compile_ahead: bool,
    /// Candidates kept built or building beyond the current one.
    pub compile_depth: u32,
    /// Rank candidates by the `estimate` tool's roofline bound.
    pub use_estimate: bool,
    /// Drop candidates whose static footprint (`analyze_kernel`) exceeds
    /// the chip's on-chip memories before building them.
    pub analyze: bool,
}

/// How the candidates are worked through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Compile, validate and benchmark every candidate in list order.
    Sequential,
    /// Estimate, screen, prune and benchmark the finalists.
    Search,
}

/// Finalists when the task does not say.
pub const DEFAULT_FINALISTS: u32 = 2;
/// Most builds a task may keep going ahead of the slice.
pub const MAX_COMPILE_DEPTH: u32 = 8;

impl TaskParameters {
    /// The plan this task runs.
    pub fn strategy(&self) -> Strategy {
        match self.strategy {
            Some(s) => s,
            None if self.max_evaluations.is_some()
                || self.candidates.len() > self.finalists as usize =>
            {
                Strategy::Search
            }
            None => Strategy::Sequential,
        }
    }
}

fn flag(map: &serde_json::Map<String, Value>, name: &str, default: bool) -> Result<bool, String> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("`{name}` must be true or false, got {other}")),
    }
}

fn define_value(name: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(if *b { "1" } else { "0" }.to_owned()),
        other => Err(format!(
            "parameter `{name}` must be a string, number or boolean, got {other}"
        )),
    }
}

fn define_map(value: &Value, what: &str) -> Result<BTreeMap<String, String>, String> {
    let Value::Object(map) = value else {
        return Err(format!(
            "{what} must be an object of -D parameters, got {value}"
        ));
    };
    map.iter()
        .map(|(k, v)| {
            if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("{what}: `{k}` is not a valid macro name"));
            }
            Ok((k.clone(), define_value(k, v)?))
        })
        .collect()
}

fn small_count(value: &Value, name: &str) -> Result<Option<u32>, String> {
    match value {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| format!("`{name}` must be a positive integer, got {n}")),
        other => Err(format!("`{name}` must be a positive integer, got {other}")),
    }
}

impl TaskParameters {
    /// Read the parameters object; `kernel_dir` is the task's directory.
    pub fn from_json(kernel_dir: &str, value: &Value) -> Result<Self, String> {
        let Value::Object(map) = value else {
            return Err(format!(
                "the task parameters must be a JSON object, got {value}"
            ));
        };
        let mut params = TaskParameters {
            kernel_dir: match map.get("kernel_dir") {
                Some(Value::String(dir)) if !dir.trim().is_empty() => dir.trim().to_owned(),
                Some(Value::String(_)) | None => kernel_dir.to_owned(),
                Some(other) => return Err(format!("`kernel_dir` must be a string, got {other}")),
            },
            finalists: DEFAULT_FINALISTS,
            compile_ahead: true,
            compile_depth: search::DEFAULT_COMPILE_DEPTH,
            use_estimate: true,
            analyze: true,
            ..Self::default()
        };
        params.max_evaluations = small_count(
            map.get("max_evaluations").unwrap_or(&Value::Null),
            "max_evaluations",
        )?;
        if let Some(n) = small_count(map.get("finalists").unwrap_or(&Value::Null), "finalists")? {
            params.finalists = n;
        }
        params.compile_ahead = flag(map, "compile_ahead", true)?;
        if let Some(n) = small_count(
            map.get("compile_depth").unwrap_or(&Value::Null),
            "compile_depth",
        )? {
            params.compile_depth = n.min(MAX_COMPILE_DEPTH);
        }
        params.use_estimate = flag(map, "estimate", true)?;
        params.analyze = flag(map, "analyze", true)?;
        params.strategy = match map.get("strategy") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "search" => Some(Strategy::Search),
            Some(Value::String(s)) if s == "sequential" => Some(Strategy::Sequential),
            Some(other) => {
                return Err(format!(
                    "`strategy` must be \"search\" or \"sequential\", got {other}"
                ));
            }
        };
        params.noop = matches!(map.get("noop"), Some(Value::Bool(true)));
        params.cores = small_count(map.get("cores").unwrap_or(&Value::Null), "cores")?;
        params.warmup = match map.get("warmup") {
            Some(Value::Number(n)) => Some(
                n.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| format!("`warmup` must be a non-negative integer, got {n}"))?,
            ),
            Some(Value::Null) | None => None,
            Some(other) => {
                return Err(format!(
                    "`warmup` must be a non-negative integer, got {other}"
                ));
            }
        };
        params.repeats = small_count(map.get("repeats").unwrap_or(&Value::Null), "repeats")?;
        params.validate_runs = small_count(
            map.get("validate_runs").unwrap_or(&Value::Null),
            "validate_runs",
        )?;
        if params.noop {
            return Ok(params);
        }
        match (map.get("candidates"), map.get("params")) {
            (Some(Value::Array(items)), _) => {
                for (i, item) in items.iter().enumerate() {
                    params
                        .candidates
                        .push(define_map(item, &format!("candidates[{i}]"))?);
                }
            }
            (Some(other), _) => {
                return Err(format!(
                    "`candidates` must be an array of objects, got {other}"
                ));
            }
            (None, Some(single)) => params.candidates.push(define_map(single, "params")?),
            (None, None) => {
                return Err(
                    "the task parameters name no `candidates` list, no `params` object and no `noop`"
                        .to_owned(),
                );
            }
        }
        if params.candidates.is_empty() {
            return Err("the `candidates` list is empty".to_owned());
        }
        if params.kernel_dir.is_empty() {
            return Err("the task names no kernel directory".to_owned());
        }
        Ok(params)
    }

    /// Find and read the task in a task message (see [`render_task_message`]).
    pub fn from_task_message(text: &str) -> Result<Self, String> {
        let kernel_dir = text
            .lines()
            .find_map(|line| line.trim().strip_prefix(KERNEL_DIR_LINE))
            .map(|rest| rest.trim().to_owned())
            .unwrap_or_default();
        let after = text
            .find(PARAMETERS_LINE)
            .map(|at| &text[at + PARAMETERS_LINE.len()..])
            .ok_or_else(|| format!("the task message has no `{PARAMETERS_LINE}` block"))?;
        let start = after
            .find("```json")
            .map(|at| at + "```json".len())
            .ok_or_else(|| "the task parameters are not in a ```json block".to_owned())?;
        let body = &after[start..];
        let end = body
            .find("```")
            .ok_or_else(|| "the ```json block of the task parameters is not closed".to_owned())?;
        let value: Value = serde_json::from_str(body[..end].trim())
            .map_err(|e| format!("the task parameters are not valid JSON: {e}"))?;
        Self::from_json(&kernel_dir, &value)
    }
}

/// One candidate's figures as the policy saw them in the benchmark result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateOutcome {
    pub index: usize,
    pub defines: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gflops: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_percent: Option<f64>,
    /// Why the candidate has no figure (compile error, invalid, denied, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Roofline bound from the estimate tool, seconds (search plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_seconds: Option<f64>,
    /// Time seen by the screening validation, seconds (search plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen_seconds: Option<f64>,
    /// Why the search did not run the candidate (pruned, out of budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl CandidateOutcome {
    fn new(index: usize, defines: BTreeMap<String, String>) -> Self {
        Self {
            index,
            defines,
            artifact: None,
            median_seconds: None,
            gflops: None,
            peak_percent: None,
            failure: None,
            estimate_seconds: None,
            screen_seconds: None,
            skipped: None,
        }
    }
}

static ARTIFACT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"as artifact (b[0-9]+)").expect("literal regex"));
static MEDIAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"median ([0-9.]+(?:[eE][-+]?[0-9]+)?) s").expect("literal regex"));
static GFLOPS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"([0-9.]+) GFLOPS").expect("literal regex"));
static PEAK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\(([0-9.]+)% of peak\)").expect("literal regex"));

fn capture_f64(re: &Regex, text: &str) -> Option<f64> {
    re.captures(text)
        .and_then(|c| c.get(1))
        .and_then(|m| m.as_str().parse().ok())
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    line.chars().take(300).collect()
}

/// What the policy does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Call(ToolCall),
    /// Several calls in one step (the engine runs concurrency-safe ones
    /// together, e.g. a compile while the slice benchmarks).
    Calls(Vec<ToolCall>),
    Final(String),
}

/// Candidate index encoded in a call id: `c<index>-<tool>[-r<n>]`.
fn parse_call_id(id: &str) -> Option<usize> {
    let rest = id.strip_prefix('c')?;
    let (index, _) = rest.split_once('-')?;
    index.parse().ok()
}

/// Recompiles of one candidate allowed when its artifact is unknown (a
/// session resumed in another process has none of its earlier builds).
const MAX_RECOMPILES: u32 = 2;

/// The result says the artifact is gone or stale: compile again.
fn artifact_missing(content: &str) -> bool {
    content.contains("unknown artifact") || content.contains("compile again")
}

/// Decide the next move from the conversation so far.
pub fn decide(messages: &[Message]) -> Decision {
    let Some(task) = messages.iter().find(|m| m.role == Role::User) else {
        return Decision::Final(final_error("no task message in the conversation"));
    };
    let params = match TaskParameters::from_task_message(&task.content) {
        Ok(p) => p,
        Err(e) => return Decision::Final(final_error(&e)),
    };
    if params.noop {
        return Decision::Final(
            "No-op task: nothing to run.\n```json\n{\"noop\":true,\"best\":null}\n```".to_owned(),
        );
    }
    if params.strategy() == Strategy::Search {
        return search::decide(&params, messages);
    }
    let mut outcomes: Vec<CandidateOutcome> = params
        .candidates
        .iter()
        .enumerate()
        .map(|(index, defines)| CandidateOutcome::new(index, defines.clone()))
        .collect();
    let results: HashMap<&str, &str> = messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| Some((m.tool_call_id.as_deref()?, m.content.as_str())))
        .collect();
    // Replay the plan: every call of ours with its result.
    let mut last: Option<(usize, String, bool, bool)> = None;
    let mut compiles = vec![0u32; outcomes.len()];
    for call in messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| m.tool_calls.iter())
    {
        let Some(index) = parse_call_id(&call.id) else {
            continue;
        };
        let Some(outcome) = outcomes.get_mut(index) else {
            continue;
        };
        let tool = call.name.as_str();
        let content = results.get(call.id.as_str()).copied().unwrap_or("");
        if tool == "compile" {
            compiles[index] += 1;
            outcome.failure = None;
        }
        let ok = match tool {
            "compile" => {
                let artifact = ARTIFACT
                    .captures(content)
                    .and_then(|c| c.get(1))
                    .map(|m| m.as_str().to_owned());
                match artifact {
                    Some(a) if content.starts_with("compiled") => {
                        outcome.artifact = Some(a);
                        true
                    }
                    _ => {
                        outcome.failure = Some(format!("compile: {}", first_line(content)));
                        false
                    }
                }
            }
            "validate" => {
                let ok = content.contains("validation PASSED");
                if !ok {
                    outcome.failure = Some(format!("validate: {}", first_line(content)));
                }
                ok
            }
            "benchmark" => {
                let median = capture_f64(&MEDIAN, content);
                let ok = median.is_some()
                    && !content.starts_with("error")
                    && !content.contains("benchmark FAILED");
                if ok {
                    outcome.median_seconds = median;
                    outcome.gflops = capture_f64(&GFLOPS, content);
                    outcome.peak_percent = capture_f64(&PEAK, content);
                } else {
                    outcome.failure = Some(format!("benchmark: {}", first_line(content)));
                }
                ok
            }
            _ => continue,
        };
        let missing = !ok && tool != "compile" && artifact_missing(content);
        last = Some((index, tool.to_owned(), ok, missing));
    }
    let next_candidate = |index: usize| -> Decision {
        if index < outcomes.len() {
            compile_call(&params, index)
        } else {
            Decision::Final(final_answer(&outcomes))
        }
    };
    match last {
        None => next_candidate(0),
        Some((index, _, false, true)) if compiles[index] <= MAX_RECOMPILES => {
            Decision::Call(recompile_call(&params, index, compiles[index]))
        }
        Some((index, tool, ok, _)) => match (tool.as_str(), ok) {
            ("compile", true) => Decision::Call(hardware_call(
                &params,
                index,
                "validate",
                outcomes[index].artifact.as_deref(),
            )),
            ("validate", true) => Decision::Call(hardware_call(
                &params,
                index,
                "benchmark",
                outcomes[index].artifact.as_deref(),
            )),
            _ => next_candidate(index + 1),
        },
    }
}

fn compile_call(params: &TaskParameters, index: usize) -> Decision {
    let args = json!({
        "kernel_dir": params.kernel_dir,
        "defines": params.candidates[index],
    });
    Decision::Call(ToolCall {
        id: format!("c{index}-compile"),
        name: "compile".to_owned(),
        arguments: args.to_string(),
    })
}

fn recompile_call(params: &TaskParameters, index: usize, round: u32) -> ToolCall {
    ToolCall {
        id: format!("c{index}-compile-r{round}"),
        name: "compile".to_owned(),
        arguments: json!({
            "kernel_dir": params.kernel_dir,
            "defines": params.candidates[index],
        })
        .to_string(),
    }
}

fn hardware_call(
    params: &TaskParameters,
    index: usize,
    tool: &str,
    artifact: Option<&str>,
) -> ToolCall {
    let mut args = serde_json::Map::new();
    if let Some(artifact) = artifact {
        args.insert("artifact".into(), json!(artifact));
    }
    if let Some(cores) = params.cores {
        args.insert("cores".into(), json!(cores));
    }
    if tool == "validate"
        && let Some(runs) = params.validate_runs
    {
        args.insert("runs".into(), json!(runs));
    }
    if tool == "benchmark" {
        if let Some(warmup) = params.warmup {
            args.insert("warmup".into(), json!(warmup));
        }
        if let Some(repeats) = params.repeats {
            args.insert("repeats".into(), json!(repeats));
        }
    }
    ToolCall {
        id: format!("c{index}-{tool}"),
        name: tool.to_owned(),
        arguments: Value::Object(args).to_string(),
    }
}

fn defines_text(defines: &BTreeMap<String, String>) -> String {
    if defines.is_empty() {
        return "(defaults)".to_owned();
    }
    defines
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn final_answer(outcomes: &[CandidateOutcome]) -> String {
    let measured: Vec<&CandidateOutcome> = outcomes
        .iter()
        .filter(|o| o.median_seconds.is_some())
        .collect();
    let best = measured
        .iter()
        .min_by(|a, b| {
            let a = a.median_seconds.unwrap_or(f64::INFINITY);
            let b = b.median_seconds.unwrap_or(f64::INFINITY);
            a.total_cmp(&b)
        })
        .copied();
    let headline = match best {
        Some(b) => format!(
            "Benchmarked {} of {} candidates. Best: {} with median {:.4e} s{}.",
            measured.len(),
            outcomes.len(),
            defines_text(&b.defines),
            b.median_seconds.unwrap_or_default(),
            b.gflops
                .map(|g| format!(", {g:.2} GFLOPS"))
                .unwrap_or_default()
        ),
        None => format!(
            "No candidate of {} produced a valid benchmark figure.",
            outcomes.len()
        ),
    };
    let body = json!({"best": best, "candidates": outcomes});
    format!(
        "{headline}\n```json\n{}\n```",
        serde_json::to_string_pretty(&body).unwrap_or_else(|_| "{}".to_owned())
    )
}

fn final_error(reason: &str) -> String {
    format!(
        "The task could not be run: {reason}\n```json\n{}\n```",
        json!({"error": reason, "best": null})
    )
}

/// Extract the last ```` ```json ```` block of an answer, if any.
pub fn answer_json(text: &str) -> Option<Value> {
    let start = text.rfind("```json")? + "```json".len();
    let body = &text[start..];
    let end = body.find("```")?;
    serde_json::from_str(body[..end].trim()).ok()
}

/// The builtin worker policy (see the module docs).
#[derive(Debug, Clone)]
pub struct BuiltinWorkerPolicy {
    name: String,
}

impl Default for BuiltinWorkerPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl BuiltinWorkerPolicy {
    pub fn new() -> Self {
        Self {
            name: "builtin-worker".to_owned(),
        }
    }
}

#[async_trait::async_trait]
impl ChatModel for BuiltinWorkerPolicy {
    fn model_name(&self) -> &str {
        &self.name
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        Ok(respond(&request))
    }

    async fn stream_shared(
        &self,
        request: std::sync::Arc<ChatRequest>,
    ) -> Result<ModelStream, ModelError> {
        Ok(respond(&request))
    }
}

fn respond(request: &ChatRequest) -> ModelStream {
    let calls = match decide(&request.messages) {
        Decision::Call(call) => vec![call],
        Decision::Calls(calls) => calls,
        Decision::Final(text) => {
            return Box::pin(stream::iter(vec![
                Ok(ModelEvent::TextDelta { text }),
                Ok(ModelEvent::Finish {
                    reason: FinishReason::Stop,
                }),
            ]));
        }
    };
    let summary = calls
        .iter()
        .map(|c| format!("{} ({})", c.name, c.id))
        .collect::<Vec<_>>()
        .join(", ");
    let mut items: Vec<Result<ModelEvent, ModelError>> = vec![Ok(ModelEvent::ThinkingDelta {
        text: format!("next: {summary}"),
    })];
    items.extend(
        calls
            .into_iter()
            .map(|call| Ok(ModelEvent::ToolCall { call })),
    );
    items.push(Ok(ModelEvent::Finish {
        reason: FinishReason::ToolCalls,
    }));
    Box::pin(stream::iter(items))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(params: Value) -> Vec<Message> {
        vec![
            Message::system("sys"),
            Message::user(render_task_message("t1", "vecadd", "", &params)),
        ]
    }

    fn call_of(d: Decision) -> ToolCall {
        match d {
            Decision::Call(c) => c,
            Decision::Calls(c) => panic!("expected one call, got {c:?}"),
            Decision::Final(t) => panic!("expected a call, got final {t}"),
        }
    }

    #[test]
    fn walks_compile_validate_benchmark_per_candidate_and_picks_the_fastest() {
        let mut history =
            task(json!({"candidates": [{"CHUNK": 512}, {"CHUNK": 1024, "BUF": "2"}]}));
        let replies = [
            (
                "compiled vecadd as artifact b1 (kernel abc, gcc)",
                "validate",
            ),
            ("validation PASSED for artifact b1", "benchmark"),
            (
                "artifact b1 on 4 cores: median 2.0000e-4 s, trimmed mean 2e-4 s over 3 runs (min 1, max 2), 5.00 GFLOPS (1.0% of peak)",
                "compile",
            ),
            (
                "compiled vecadd as artifact b2 (kernel def, gcc)",
                "validate",
            ),
            ("validation PASSED for artifact b2", "benchmark"),
        ];
        let first = call_of(decide(&history));
        assert_eq!(first.name, "compile");
        assert_eq!(first.id, "c0-compile");
        let mut current = first;
        for (reply, next_tool) in replies {
            history.push(Message::assistant("", vec![current.clone()]));
            history.push(Message::tool(current.id.clone(), reply));
            current = call_of(decide(&history));
            assert_eq!(current.name, next_tool, "after {reply}");
        }
        assert_eq!(current.id, "c1-benchmark");
        let args: Value = serde_json::from_str(&current.arguments).unwrap();
        assert_eq!(args["artifact"], "b2");
        history.push(Message::assistant("", vec![current.clone()]));
        history.push(Message::tool(
            current.id.clone(),
            "artifact b2 on 4 cores: median 1.0000e-4 s, trimmed mean 1e-4 s over 3 runs (min 1, max 2), 10.00 GFLOPS (2.0% of peak)",
        ));
        let Decision::Final(text) = decide(&history) else {
            panic!("expected the final answer");
        };
        let body = answer_json(&text).expect("json block");
        assert_eq!(
            body["best"]["defines"],
            json!({"BUF": "2", "CHUNK": "1024"})
        );
        assert_eq!(body["best"]["median_seconds"], json!(1.0e-4));
        assert_eq!(body["best"]["gflops"], json!(10.0));
    }

    #[test]
    fn a_denied_validation_drops_the_candidate() {
        let mut history = task(json!({"params": {"CHUNK": 512}}));
        let compile = call_of(decide(&history));
        history.push(Message::assistant("", vec![compile.clone()]));
        history.push(Message::tool(
            compile.id,
            "compiled vecadd as artifact b1 (k)",
        ));
        let validate = call_of(decide(&history));
        history.push(Message::assistant("", vec![validate.clone()]));
        history.push(Message::tool(
            validate.id,
            "error: the call to 'validate' was denied by the reviewer: no",
        ));
        let Decision::Final(text) = decide(&history) else {
            panic!("expected final");
        };
        let body = answer_json(&text).expect("json");
        assert!(body["best"].is_null());
        assert!(
            body["candidates"][0]["failure"]
                .as_str()
                .is_some_and(|f| f.contains("denied")),
            "{body}"
        );
    }

    #[test]
    fn an_unknown_artifact_after_a_resume_is_compiled_again() {
        let mut history = task(json!({"params": {"CHUNK": 512}}));
        let compile = call_of(decide(&history));
        history.push(Message::assistant("", vec![compile.clone()]));
        history.push(Message::tool(
            compile.id,
            "compiled vecadd as artifact b1 (k)",
        ));
        let validate = call_of(decide(&history));
        history.push(Message::assistant("", vec![validate.clone()]));
        history.push(Message::tool(
            validate.id,
            "error: invalid arguments: unknown artifact `b1` (compiled so far: none)",
        ));
        let again = call_of(decide(&history));
        assert_eq!(again.name, "compile");
        assert_eq!(again.id, "c0-compile-r1");
        history.push(Message::assistant("", vec![again.clone()]));
        history.push(Message::tool(
            again.id,
            "compiled vecadd as artifact b1 (k)",
        ));
        let validate = call_of(decide(&history));
        assert_eq!(validate.name, "validate");
    }

    #[test]
    fn noop_answers_at_once_and_bad_parameters_are_explained() {
        assert!(matches!(
            decide(&task(json!({"noop": true}))),
            Decision::Final(_)
        ));
        let Decision::Final(text) = decide(&task(json!({"candidates": "x"}))) else {
            panic!("expected final");
        };
        assert!(text.contains("`candidates` must be an array"), "{text}");
        let Decision::Final(text) = decide(&task(json!({"params": {"A B": 1}}))) else {
            panic!("expected final");
        };
        assert!(text.contains("not a valid macro name"), "{text}");
    }
}
