//! The task the builtin policy reads: the first user message of a task
//! ([`render_task_message`]) and its task-parameter object
//! ([`TaskParameters`], see the [policy docs](super) for the fields).

use std::collections::BTreeMap;

use mtswarm_core::limits::MAX_SOURCE_DIFF_BYTES;
use serde_json::Value;

pub use crate::plan::Strategy;
use crate::plan::{Defines, PlanError, TaskPlan, define_texts};

/// Why a task's parameters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TaskParametersError {
    /// The object does not read as a [`TaskPlan`] (names the field).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A candidate names a macro that is not an identifier.
    #[error("{what}: `{name}` is not a valid macro name")]
    BadMacroName {
        /// Which candidate (`candidates[2]`, `params`).
        what: String,
        /// The macro name as given.
        name: String,
    },
    /// A count is not a positive integer.
    #[error("`{name}` must be a positive integer, got 0")]
    NotPositive {
        /// The setting.
        name: &'static str,
    },
    /// `source_diff` is longer than a record may carry.
    #[error("`source_diff` is {bytes} bytes, more than the {max} a record carries")]
    SourceDiffTooLong {
        /// Its length.
        bytes: usize,
        /// [`MAX_SOURCE_DIFF_BYTES`].
        max: usize,
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
    pub max_hardware_calls: Option<u32>,
    /// Candidates the search plan screens at most (the finalists'
    /// benchmarks come on top); `None`: the default share of the list
    /// ([`crate::budget::search_budget`]) unless `max_hardware_calls` is set.
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
    /// Fit the search's model to the job's other agents' results and
    /// pending points too (`job_observations`).
    pub shared_search: bool,
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
            None if self.max_hardware_calls.is_some()
                || self.search_budget.is_some()
                || self.candidates.len() > self.finalists as usize =>
            {
                Strategy::Search
            }
            None => Strategy::Sequential,
        }
    }
}

/// `Some(n)` for a positive count, an error naming the setting for 0.
fn positive(value: Option<u32>, name: &'static str) -> Result<Option<u32>, TaskParametersError> {
    match value {
        Some(0) => Err(TaskParametersError::NotPositive { name }),
        other => Ok(other),
    }
}

/// A candidate's values as text, its macro names checked.
fn define_map(
    defines: &Defines,
    what: &str,
) -> Result<BTreeMap<String, String>, TaskParametersError> {
    if let Some(name) = defines
        .keys()
        .find(|k| k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(TaskParametersError::BadMacroName {
            what: what.to_owned(),
            name: name.clone(),
        });
    }
    Ok(define_texts(defines))
}

impl TaskParameters {
    /// Read the parameters object; `kernel_dir` is the task's directory.
    pub fn from_json(kernel_dir: &str, value: &Value) -> Result<Self, TaskParametersError> {
        Self::from_plan(kernel_dir, TaskPlan::from_value(value)?)
    }

    /// The plan with its defaults applied and its values checked.
    pub fn from_plan(kernel_dir: &str, plan: TaskPlan) -> Result<Self, TaskParametersError> {
        let mut params = TaskParameters {
            noop: plan.noop.unwrap_or(false),
            kernel_dir: match plan.kernel_dir.as_deref().map(str::trim) {
                Some(dir) if !dir.is_empty() => dir.to_owned(),
                _ => kernel_dir.to_owned(),
            },
            source_diff: source_diff(plan.source_diff)?,
            cores: positive(plan.cores, "cores")?,
            warmup: plan.warmup,
            repeats: positive(plan.repeats, "repeats")?,
            validate_runs: positive(plan.validate_runs, "validate_runs")?,
            max_hardware_calls: positive(plan.max_hardware_calls, "max_hardware_calls")?,
            search_budget: positive(plan.search_budget, "search_budget")?,
            strategy: plan.strategy,
            finalists: positive(plan.finalists, "finalists")?.unwrap_or(DEFAULT_FINALISTS),
            compile_ahead: plan.compile_ahead.unwrap_or(true),
            compile_depth: positive(plan.compile_depth, "compile_depth")?
                .map_or(DEFAULT_COMPILE_DEPTH, |n| n.min(MAX_COMPILE_DEPTH)),
            use_estimate: plan.estimate.unwrap_or(true),
            analyze: plan.analyze.unwrap_or(true),
            shared_search: plan.shared_search.unwrap_or(false),
            candidates: Vec::new(),
        };
        if params.noop {
            return Ok(params);
        }
        match (&plan.candidates, &plan.params) {
            (Some(items), _) => {
                for (i, item) in items.iter().enumerate() {
                    params
                        .candidates
                        .push(define_map(item, &format!("candidates[{i}]"))?);
                }
            }
            (None, Some(single)) => params.candidates.push(define_map(single, "params")?),
            (None, None) => return Err(TaskParametersError::NoCandidates),
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

/// The diff to apply: `None` for none or an empty one; refused when longer
/// than a record may carry.
fn source_diff(diff: Option<String>) -> Result<Option<String>, TaskParametersError> {
    match diff {
        Some(d) if d.len() > MAX_SOURCE_DIFF_BYTES => Err(TaskParametersError::SourceDiffTooLong {
            bytes: d.len(),
            max: MAX_SOURCE_DIFF_BYTES,
        }),
        Some(d) if d.trim().is_empty() => Ok(None),
        other => Ok(other),
    }
}
