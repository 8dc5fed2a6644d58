//! The task the builtin policy reads: the first user message of a task
//! ([`render_task_message`]) and its task-parameter object
//! ([`TaskParameters`], see the [policy docs](super) for the fields).

use std::collections::BTreeMap;

use mtswarm_tools::source_diff::MAX_SOURCE_DIFF_BYTES;
use serde_json::Value;

/// Why a task's parameters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TaskParametersError {
    /// A flag is not a boolean.
    #[error("`{name}` must be true or false, got {got}")]
    NotABool {
        /// The flag.
        name: &'static str,
        /// What was given.
        got: Value,
    },
    /// A `-D` value is not a string, number or boolean.
    #[error("parameter `{name}` must be a string, number or boolean, got {got}")]
    BadDefineValue {
        /// The macro.
        name: String,
        /// What was given.
        got: Value,
    },
    /// A candidate is not an object of `-D` parameters.
    #[error("{what} must be an object of -D parameters, got {got}")]
    NotADefineMap {
        /// Which candidate (`candidates[2]`, `params`).
        what: String,
        /// What was given.
        got: Value,
    },
    /// A candidate names a macro that is not an identifier.
    #[error("{what}: `{name}` is not a valid macro name")]
    BadMacroName {
        /// Which candidate (`candidates[2]`, `params`).
        what: String,
        /// The macro name as given.
        name: String,
    },
    /// A count is not a positive integer.
    #[error("`{name}` must be a positive integer, got {got}")]
    NotPositive {
        /// The setting.
        name: &'static str,
        /// What was given.
        got: Value,
    },
    /// The parameters are not a JSON object.
    #[error("the task parameters must be a JSON object, got {got}")]
    NotAnObject {
        /// What was given.
        got: Value,
    },
    /// `source_diff` is not a string.
    #[error("`source_diff` must be a unified diff as a string, got {got}")]
    SourceDiffNotAString {
        /// What was given.
        got: Value,
    },
    /// `source_diff` is longer than a record may carry.
    #[error("`source_diff` is {bytes} bytes, more than the {max} a record carries")]
    SourceDiffTooLong {
        /// Its length.
        bytes: usize,
        /// [`mtswarm_tools::source_diff::MAX_SOURCE_DIFF_BYTES`].
        max: usize,
    },
    /// `kernel_dir` is not a string.
    #[error("`kernel_dir` must be a string, got {got}")]
    KernelDirNotAString {
        /// What was given.
        got: Value,
    },
    /// `strategy` names no plan.
    #[error("`strategy` must be \"search\" or \"sequential\", got {got}")]
    BadStrategy {
        /// What was given.
        got: Value,
    },
    /// `warmup` is not a non-negative integer.
    #[error("`warmup` must be a non-negative integer, got {got}")]
    BadWarmup {
        /// What was given.
        got: Value,
    },
    /// `candidates` is not an array.
    #[error("`candidates` must be an array of objects, got {got}")]
    CandidatesNotAnArray {
        /// What was given.
        got: Value,
    },
    /// Nothing to run.
    #[error("the task parameters name no `candidates` list, no `params` object and no `noop`")]
    NoCandidates,
    /// `candidates` is empty.
    #[error("the `candidates` list is empty")]
    EmptyCandidates,
    /// No kernel directory in the message or the parameters.
    #[error("the task names no kernel directory")]
    NoKernelDir,
    /// The message has no parameters block.
    #[error("the task message has no `{}` block", PARAMETERS_LINE)]
    NoParametersBlock,
    /// The parameters block has no ```` ```json ```` fence.
    #[error("the task parameters are not in a ```json block")]
    NotInJsonBlock,
    /// The ```` ```json ```` fence is not closed.
    #[error("the ```json block of the task parameters is not closed")]
    UnclosedJsonBlock,
    /// The parameters block is not JSON.
    #[error("the task parameters are not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
}

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
    /// `"noop": true`: answer at once without tools (no candidates needed).
    pub noop: bool,
    /// Kernel directory relative to the kernel root: the object's
    /// `kernel_dir`, else the task message's `Kernel directory:` line.
    pub kernel_dir: String,
    /// `-D` maps, values as text.
    pub candidates: Vec<BTreeMap<String, String>>,
    /// Unified diff of edited kernel sources (paths relative to the kernel
    /// directory) to apply before anything is built; `None`: the pristine
    /// sources.
    pub source_diff: Option<String>,
    /// DSP cores of every validate and benchmark; `None`: all cores of the slice.
    pub cores: Option<u32>,
    /// Untimed executions before a benchmark times (0 allowed); `None`:
    /// the benchmark tool's default.
    pub warmup: Option<u32>,
    /// Minimum timed executions per benchmark; `None`: the benchmark
    /// tool's default.
    pub repeats: Option<u32>,
    /// Kernel executions checked by each validate (the tool's default: 2).
    pub validate_runs: Option<u32>,
    /// Hardware calls (validate + benchmark) allowed in the whole task;
    /// `None`: no limit beyond `search_budget`.
    pub max_evaluations: Option<u32>,
    /// Candidates the search plan screens at most (the finalists'
    /// benchmarks come on top); `None`: the default share of the list
    /// (`mtswarm_hw::tune::search_budget`) unless `max_evaluations` is set.
    pub search_budget: Option<u32>,
    /// The plan the task asked for; `None`: chosen from the list size and
    /// the budget (see [`TaskParameters::strategy()`]).
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
/// Candidates kept built or building beyond the current one when the task
/// does not say (`compile_depth`): enough to cover a compile that takes
/// about three times as long as a screening launch (a host CPU shared with
/// the emulator's runs), few enough that the guesses stay close to what the
/// results say.
pub const DEFAULT_COMPILE_DEPTH: u32 = 3;

impl TaskParameters {
    /// The plan this task runs.
    pub fn strategy(&self) -> Strategy {
        match self.strategy {
            Some(s) => s,
            None if self.max_evaluations.is_some()
                || self.search_budget.is_some()
                || self.candidates.len() > self.finalists as usize =>
            {
                Strategy::Search
            }
            None => Strategy::Sequential,
        }
    }
}

fn flag(
    map: &serde_json::Map<String, Value>,
    name: &'static str,
    default: bool,
) -> Result<bool, TaskParametersError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(TaskParametersError::NotABool {
            name,
            got: other.clone(),
        }),
    }
}

fn define_value(name: &str, value: &Value) -> Result<String, TaskParametersError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(if *b { "1" } else { "0" }.to_owned()),
        other => Err(TaskParametersError::BadDefineValue {
            name: name.to_owned(),
            got: other.clone(),
        }),
    }
}

fn define_map(value: &Value, what: &str) -> Result<BTreeMap<String, String>, TaskParametersError> {
    let Value::Object(map) = value else {
        return Err(TaskParametersError::NotADefineMap {
            what: what.to_owned(),
            got: value.clone(),
        });
    };
    map.iter()
        .map(|(k, v)| {
            if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(TaskParametersError::BadMacroName {
                    what: what.to_owned(),
                    name: k.clone(),
                });
            }
            Ok((k.clone(), define_value(k, v)?))
        })
        .collect()
}

fn small_count(value: &Value, name: &'static str) -> Result<Option<u32>, TaskParametersError> {
    match value {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| TaskParametersError::NotPositive {
                name,
                got: value.clone(),
            }),
        other => Err(TaskParametersError::NotPositive {
            name,
            got: other.clone(),
        }),
    }
}

impl TaskParameters {
    /// Read the parameters object; `kernel_dir` is the task's directory.
    pub fn from_json(kernel_dir: &str, value: &Value) -> Result<Self, TaskParametersError> {
        let Value::Object(map) = value else {
            return Err(TaskParametersError::NotAnObject { got: value.clone() });
        };
        let mut params = TaskParameters {
            kernel_dir: match map.get("kernel_dir") {
                Some(Value::String(dir)) if !dir.trim().is_empty() => dir.trim().to_owned(),
                Some(Value::String(_)) | None => kernel_dir.to_owned(),
                Some(other) => {
                    return Err(TaskParametersError::KernelDirNotAString { got: other.clone() });
                }
            },
            finalists: DEFAULT_FINALISTS,
            compile_ahead: true,
            compile_depth: DEFAULT_COMPILE_DEPTH,
            use_estimate: true,
            analyze: true,
            ..Self::default()
        };
        params.max_evaluations = small_count(
            map.get("max_evaluations").unwrap_or(&Value::Null),
            "max_evaluations",
        )?;
        params.search_budget = small_count(
            map.get("search_budget").unwrap_or(&Value::Null),
            "search_budget",
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
                return Err(TaskParametersError::BadStrategy { got: other.clone() });
            }
        };
        params.noop = matches!(map.get("noop"), Some(Value::Bool(true)));
        params.source_diff = match map.get("source_diff") {
            None | Some(Value::Null) => None,
            Some(Value::String(d)) if d.trim().is_empty() => None,
            Some(Value::String(d)) if d.len() > MAX_SOURCE_DIFF_BYTES => {
                return Err(TaskParametersError::SourceDiffTooLong {
                    bytes: d.len(),
                    max: MAX_SOURCE_DIFF_BYTES,
                });
            }
            Some(Value::String(d)) => Some(d.clone()),
            Some(other) => {
                return Err(TaskParametersError::SourceDiffNotAString { got: other.clone() });
            }
        };
        params.cores = small_count(map.get("cores").unwrap_or(&Value::Null), "cores")?;
        params.warmup = match map.get("warmup") {
            Some(Value::Number(n)) => Some(
                n.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| TaskParametersError::BadWarmup {
                        got: Value::Number(n.clone()),
                    })?,
            ),
            Some(Value::Null) | None => None,
            Some(other) => {
                return Err(TaskParametersError::BadWarmup { got: other.clone() });
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
                return Err(TaskParametersError::CandidatesNotAnArray { got: other.clone() });
            }
            (None, Some(single)) => params.candidates.push(define_map(single, "params")?),
            (None, None) => {
                return Err(TaskParametersError::NoCandidates);
            }
        }
        if params.candidates.is_empty() {
            return Err(TaskParametersError::EmptyCandidates);
        }
        if params.kernel_dir.is_empty() {
            return Err(TaskParametersError::NoKernelDir);
        }
        Ok(params)
    }

    /// Find and read the task in a task message (see [`render_task_message`]).
    pub fn from_task_message(text: &str) -> Result<Self, TaskParametersError> {
        let kernel_dir = text
            .lines()
            .find_map(|line| line.trim().strip_prefix(KERNEL_DIR_LINE))
            .map(|rest| rest.trim().to_owned())
            .unwrap_or_default();
        let after = text
            .find(PARAMETERS_LINE)
            .map(|at| &text[at + PARAMETERS_LINE.len()..])
            .ok_or(TaskParametersError::NoParametersBlock)?;
        let start = after
            .find("```json")
            .map(|at| at + "```json".len())
            .ok_or(TaskParametersError::NotInJsonBlock)?;
        let body = &after[start..];
        let end = body
            .find("```")
            .ok_or(TaskParametersError::UnclosedJsonBlock)?;
        let value: Value =
            serde_json::from_str(body[..end].trim()).map_err(TaskParametersError::InvalidJson)?;
        Self::from_json(&kernel_dir, &value)
    }
}
