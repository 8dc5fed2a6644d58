//! Validation of a task before it runs: its attempt number, its size
//! against the worker's limits, its deadline, its parameters (JSON, and
//! their candidates against the kernel's tune.toml), its kernel copy in the
//! workspace, and the budgets it runs with (the task's, else the
//! session's). A task that fails any of these ends FAILED naming why.

use mtswarm_bus::v1;
use mtswarm_hw::tune::TuneError;
use mtswarm_policy::plan::{PlanError, TaskPlan, define_texts};
use serde_json::{Value, json};

use super::task_run::TaskRun;
use crate::workspace::KernelDirError;

/// Why a task is refused before it runs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InvalidTask {
    /// Attempts are numbered from 1.
    #[error("the task has attempt 0; attempts start at 1")]
    AttemptZero,
    /// A field of the task is over the worker's limit.
    #[error(
        "the task's {field} is {size} bytes, over the worker's limit of {limit} bytes ({name})"
    )]
    TooLarge {
        field: &'static str,
        size: usize,
        limit: usize,
        name: &'static str,
    },
    /// The task's deadline is not a valid time.
    #[error("the task deadline is invalid: {0}")]
    Deadline(#[source] prost_types::TimestampError),
    /// The task's deadline passed before it started.
    #[error("the task's deadline passed before it started")]
    DeadlinePassed,
    /// `parameters_json` does not parse.
    #[error("parameters_json is not valid JSON: {0}")]
    ParametersJson(#[source] serde_json::Error),
    /// `parameters_json` is JSON but not a task plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The task's kernel directory is refused or cannot be copied.
    #[error(transparent)]
    KernelDir(#[from] KernelDirError),
    /// A candidate of the parameters is outside the kernel's tune space.
    #[error("task parameters, candidate {index}: {source}")]
    Defines {
        index: usize,
        #[source]
        source: TuneError,
    },
}

/// What a valid task runs with.
pub(super) struct Prepared {
    /// When the task's deadline cancels the run.
    pub(super) deadline: Option<tokio::time::Instant>,
    /// The task-parameter object (`{}` when none was given).
    pub(super) parameters: Value,
    /// The kernel copy's name in the workspace (`.` for none).
    pub(super) kernel_name: String,
    /// The budgets of this task.
    pub(super) budgets: v1::Budgets,
}

impl TaskRun<'_> {
    /// Check the task against the worker's rules and limits and get its
    /// kernel copy ready.
    pub(super) fn validate(&self) -> Result<Prepared, InvalidTask> {
        let (shared, entry, runtime, task) = (self.shared, self.entry, self.runtime, &self.task);
        // The task came over the leader's own subject, so it runs; records
        // signed under a grant that does not place them here would be
        // refused by the leader, which is worth saying now.
        if let Some(problem) = crate::provenance::grant_problem(
            shared.config.leader_key.as_ref(),
            task,
            &shared.identity.worker_id,
            &shared.identity.record_key.public_key(),
        ) {
            tracing::warn!(task.id = %task.task_id, attempt = task.attempt, %problem, "the task's placement grant does not match this daemon; its records will be refused");
        }
        let CheckedTask {
            deadline_left,
            parameters,
            plan,
        } = check_task(
            task,
            shared.config.max_task_parameters_bytes,
            shared.config.max_task_instructions_bytes,
        )?;
        // A deadline past what the clock can hold is no deadline.
        let deadline = deadline_left.and_then(|left| tokio::time::Instant::now().checked_add(left));
        let kernel_dir = if task.kernel_dir.trim().is_empty() {
            runtime.kernel_dir.clone()
        } else {
            task.kernel_dir.clone()
        };
        let kernel_name = if kernel_dir.trim().is_empty() {
            String::from(".")
        } else {
            runtime.kernel_copy(&shared.config.kernel_root, &kernel_dir)?
        };
        check_task_defines(
            &runtime.workspace.join(&kernel_name),
            &plan,
            &shared.slices[entry.slice_index].spec,
        )?;
        // The tools name the next candidate of the task after each one.
        runtime
            .tools
            .set_task_candidates(plan.all_candidates().map(define_texts).collect());
        Ok(Prepared {
            deadline,
            parameters,
            kernel_name,
            budgets: merge_budgets(&runtime.budgets, task.budgets.as_ref()),
        })
    }
}

/// What the checks of a task that need only the task, the worker's limits
/// and the clock give.
#[derive(Debug)]
pub(crate) struct CheckedTask {
    /// Time left before the task's deadline (none: no deadline).
    pub(crate) deadline_left: Option<std::time::Duration>,
    /// The task-parameter object (`{}` when none was given).
    pub(crate) parameters: Value,
    /// The parameters read as a task plan.
    pub(crate) plan: TaskPlan,
}

/// The checks of a task before anything of the session is touched: its
/// attempt number, its sizes against the worker's limits
/// (`max_task_parameters_bytes`, `max_task_instructions_bytes`), its
/// deadline against the clock, and its parameters (JSON, then a task plan).
pub(crate) fn check_task(
    task: &v1::TaskAssignment,
    max_parameters_bytes: usize,
    max_instructions_bytes: usize,
) -> Result<CheckedTask, InvalidTask> {
    if task.attempt == 0 {
        return Err(InvalidTask::AttemptZero);
    }
    for (field, size, limit, name) in [
        (
            "parameters_json",
            task.parameters_json.len(),
            max_parameters_bytes,
            "max_task_parameters_bytes",
        ),
        (
            "instructions",
            task.instructions.len(),
            max_instructions_bytes,
            "max_task_instructions_bytes",
        ),
    ] {
        if size > limit {
            return Err(InvalidTask::TooLarge {
                field,
                size,
                limit,
                name,
            });
        }
    }
    let deadline_left = match &task.deadline {
        Some(ts) => {
            let at = std::time::SystemTime::try_from(*ts).map_err(InvalidTask::Deadline)?;
            match at.duration_since(std::time::SystemTime::now()) {
                Ok(left) => Some(left),
                Err(_) => return Err(InvalidTask::DeadlinePassed),
            }
        }
        None => None,
    };
    let parameters: Value = if task.parameters_json.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(&task.parameters_json).map_err(InvalidTask::ParametersJson)?
    };
    let plan = TaskPlan::from_value(&parameters)?;
    Ok(CheckedTask {
        deadline_left,
        parameters,
        plan,
    })
}

/// The candidates of task parameters (`candidates`, `params`) checked
/// against the kernel's tune.toml when it has one: a typo or a value
/// outside the space fails the task with an error naming it, instead of
/// tuning something else than asked.
pub(crate) fn check_task_defines(
    kernel_dir: &std::path::Path,
    plan: &TaskPlan,
    spec: &mtswarm_hw::ChipSpec,
) -> Result<(), InvalidTask> {
    // Nothing to check (a free-form or no-op task): tune.toml is not read.
    if plan.all_candidates().next().is_none() || plan.unchecked_defines == Some(true) {
        return Ok(());
    }
    let file = kernel_dir.join("tune.toml");
    if !file.is_file() {
        return Ok(());
    }
    let Ok(space) = mtswarm_hw::tune::TuneSpace::load(&file) else {
        // The tools report an unreadable tune.toml when they read it.
        return Ok(());
    };
    for (index, candidate) in plan.all_candidates().enumerate() {
        space
            .check_defines(&define_texts(candidate), spec)
            .map_err(|source| InvalidTask::Defines { index, source })?;
    }
    Ok(())
}

/// Each budget of the task where it sets one (above zero), else the session's.
fn merge_budgets(session: &v1::Budgets, task: Option<&v1::Budgets>) -> v1::Budgets {
    let task = task.copied().unwrap_or_default();
    v1::Budgets {
        max_steps: set_or(task.max_steps, session.max_steps),
        max_tokens: set_or(task.max_tokens, session.max_tokens),
        device_seconds: set_or(task.device_seconds, session.device_seconds),
        wall_time_seconds: set_or(task.wall_time_seconds, session.wall_time_seconds),
        // The job's evaluation budget reaches a task as its plan's
        // `search_budget`, never as a task budget.
        max_evaluations: 0,
    }
}

/// `value` when it is set (above zero, the proto's "unset" being zero),
/// else `fallback`.
pub(super) fn set_or<T: PartialOrd + Default>(value: T, fallback: T) -> T {
    if value > T::default() {
        value
    } else {
        fallback
    }
}
