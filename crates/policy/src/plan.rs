//! The leader-to-worker contract, one type at each end.
//!
//! A job reaches the leader's loop as text (the goal) ending with a
//! [`JobLine`]; the leader's side hands each agent a [`TaskPlan`] as the
//! `parameters` of `assign_task`, which travels as JSON on the bus and
//! reaches the worker's loop inside its task message. Text stays the
//! transport because a model reads and writes both, but the leader's side
//! writes these types and the worker's side reads them with serde, so a
//! field cannot change name or meaning on the way.
//!
//! Two budgets, two names: a plan's `search_budget` is how many candidates
//! a search screens (a job's total is split over its tasks), and
//! `max_hardware_calls` caps the hardware calls (`validate` plus
//! `benchmark`) of one task, finalists included.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Prefix of the job line, the last line of the leader's task message.
pub const JOB_LINE_PREFIX: &str = "job_spec: ";

/// How long a collect waits when the job line does not say.
pub const DEFAULT_COLLECT_TIMEOUT_SECONDS: u64 = 600;

/// The job's parameters, machine-readable, as the leader's loop sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobLine {
    /// The job.
    pub job_id: String,
    /// Kernel directory under the workers' kernel root.
    pub kernel_dir: String,
    /// Which slices the job may use (`backend=emulator`, ...).
    pub slice_selector: String,
    /// Agents the job asked for; 0: the leader decides.
    pub num_agents: u32,
    /// How long collecting the tasks' results may take, seconds.
    pub collect_timeout_seconds: u64,
    /// Evaluations of the whole job (split over its tasks' search
    /// budgets); 0: the default share of the space
    /// ([`crate::budget::search_budget`]).
    pub search_budget: u32,
}

impl Default for JobLine {
    fn default() -> Self {
        Self {
            job_id: String::new(),
            kernel_dir: String::new(),
            slice_selector: String::new(),
            num_agents: 0,
            collect_timeout_seconds: DEFAULT_COLLECT_TIMEOUT_SECONDS,
            search_budget: 0,
        }
    }
}

impl JobLine {
    /// The line as the task message ends with it.
    pub fn render(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned());
        format!("{JOB_LINE_PREFIX}{json}")
    }

    /// The last job line of `text`; `None` when there is none, an error
    /// when it is not a job line's JSON.
    pub fn find(text: &str) -> Option<Result<Self, serde_json::Error>> {
        let json = text
            .lines()
            .rev()
            .find_map(|line| line.trim().strip_prefix(JOB_LINE_PREFIX.trim_end()))?;
        Some(serde_json::from_str(json.trim()))
    }

    /// The job's evaluation budget, `None` for the default.
    pub fn search_budget(&self) -> Option<usize> {
        (self.search_budget > 0).then_some(self.search_budget as usize)
    }
}

/// One `-D` value as a plan carries it: text, a number or a flag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DefineValue {
    /// Passed as written.
    Text(String),
    /// Passed as its JSON text (`64`, `1.5`).
    Number(serde_json::Number),
    /// Passed as `1` or `0`.
    Flag(bool),
}

impl DefineValue {
    /// The value as the compiler's `-D NAME=value` gets it.
    pub fn as_define(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Number(number) => number.to_string(),
            Self::Flag(flag) => if *flag { "1" } else { "0" }.to_owned(),
        }
    }
}

impl From<&str> for DefineValue {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

/// A candidate: macro name to value.
pub type Defines = BTreeMap<String, DefineValue>;

/// How a task works through its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Compile, validate and benchmark every candidate in list order.
    Sequential,
    /// Estimate, screen, prune and benchmark the finalists.
    Search,
}

/// What one task is asked to do: the `parameters` of `assign_task`.
///
/// Every field is optional so a model may write only what it means; what
/// the builtin worker policy assumes for an absent field is in
/// `crate::worker`'s docs. Fields the plan does not know are ignored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskPlan {
    /// Answer at once without tools (latency benchmarks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noop: Option<bool>,
    /// Overrides the task message's kernel directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_dir: Option<String>,
    /// Candidates to try.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates: Option<Vec<Defines>>,
    /// A single candidate (when `candidates` is absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<Defines>,
    /// Skip checking the candidates against the kernel's tune.toml (fault
    /// knobs, experiments outside the space).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unchecked_defines: Option<bool>,
    /// Unified diff of edited kernel sources to apply before building.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_diff: Option<String>,
    /// DSP cores of every validate and benchmark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Untimed executions before a benchmark times (0 allowed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup: Option<u32>,
    /// Minimum timed executions per benchmark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeats: Option<u32>,
    /// Kernel executions checked by each validate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validate_runs: Option<u32>,
    /// Candidates a search screens at most (this task's share of the job's
    /// evaluation budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search_budget: Option<u32>,
    /// Hardware calls (`validate` plus `benchmark`) of the whole task at
    /// most, finalists included. Read under its earlier name
    /// `max_evaluations` too.
    #[serde(alias = "max_evaluations", skip_serializing_if = "Option::is_none")]
    pub max_hardware_calls: Option<u32>,
    /// The plan to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// Screened candidates that get a full benchmark.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finalists: Option<u32>,
    /// Build the next candidates while the slice runs the current one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_ahead: Option<bool>,
    /// Candidates kept built or building ahead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile_depth: Option<u32>,
    /// Rank candidates by the roofline estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<bool>,
    /// Drop candidates whose static footprint overflows on-chip memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analyze: Option<bool>,
    /// Fit the search's model to the job's other agents' results and
    /// pending points too (`job_observations`): one search per job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_search: Option<bool>,
}

/// A plan that does not read as a [`TaskPlan`]; names the field.
#[derive(Debug, thiserror::Error)]
#[error("task parameters: `{path}`: {source}")]
pub struct PlanError {
    /// Where in the object (`candidates[2].MB`, `strategy`; `.` for the
    /// object itself).
    pub path: String,
    /// What serde found there.
    #[source]
    pub source: serde_json::Error,
}

impl TaskPlan {
    /// A search over `candidates` screening at most `search_budget` of them.
    pub fn search(candidates: Vec<Defines>, search_budget: u32) -> Self {
        Self {
            candidates: Some(candidates),
            search_budget: Some(search_budget),
            ..Self::default()
        }
    }

    /// Reads a plan from its JSON (an object; `null` is the empty plan).
    pub fn from_value(value: &serde_json::Value) -> Result<Self, PlanError> {
        if value.is_null() {
            return Ok(Self::default());
        }
        serde_path_to_error::deserialize(value).map_err(|e| PlanError {
            path: e.path().to_string(),
            source: e.into_inner(),
        })
    }

    /// The plan as JSON, as `assign_task` carries it.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Every candidate: `params` first, then `candidates`.
    pub fn all_candidates(&self) -> impl Iterator<Item = &Defines> {
        self.params.iter().chain(self.candidates.iter().flatten())
    }
}

/// A candidate's `-D` values as text.
pub fn define_texts(defines: &Defines) -> BTreeMap<String, String> {
    defines
        .iter()
        .map(|(name, value)| (name.clone(), value.as_define()))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_job_line_reads_back_what_was_rendered_and_defaults_what_is_missing() {
        let line = JobLine {
            job_id: "j1".into(),
            num_agents: 3,
            search_budget: 40,
            ..JobLine::default()
        };
        let text = format!("Tune it.\n\n{}", line.render());
        assert_eq!(JobLine::find(&text).unwrap().unwrap(), line);
        let partial = JobLine::find("job_spec: {\"num_agents\": 2}")
            .unwrap()
            .unwrap();
        assert_eq!(partial.num_agents, 2);
        assert_eq!(
            partial.collect_timeout_seconds,
            DEFAULT_COLLECT_TIMEOUT_SECONDS
        );
        assert_eq!(partial.search_budget(), None);
        assert!(JobLine::find("no line here").is_none());
        assert!(
            JobLine::find("job_spec: {\"num_agents\": \"two\"}")
                .unwrap()
                .is_err()
        );
    }

    #[test]
    fn a_plan_round_trips_and_reads_the_earlier_name_of_the_hardware_call_cap() {
        let plan = TaskPlan::search(vec![Defines::from([("MB".into(), "64".into())])], 12);
        let value = plan.to_value();
        assert_eq!(
            value,
            json!({"candidates": [{"MB": "64"}], "search_budget": 12})
        );
        assert_eq!(TaskPlan::from_value(&value).unwrap(), plan);
        let old = TaskPlan::from_value(&json!({"max_evaluations": 5})).unwrap();
        assert_eq!(old.max_hardware_calls, Some(5));
        assert_eq!(
            TaskPlan::from_value(&json!(null)).unwrap(),
            TaskPlan::default()
        );
    }

    #[test]
    fn a_bad_field_is_named_with_its_path() {
        let err = TaskPlan::from_value(&json!({"strategy": "greedy"})).unwrap_err();
        assert_eq!(err.path, "strategy");
        let err = TaskPlan::from_value(&json!({"candidates": [{"MB": [1]}]})).unwrap_err();
        assert_eq!(err.path, "candidates[0].MB");
        assert!(err.to_string().contains("candidates[0].MB"), "{err}");
        let err = TaskPlan::from_value(&json!("all of them")).unwrap_err();
        assert_eq!(err.path, ".");
    }

    #[test]
    fn define_values_become_compiler_text() {
        let defines: Defines =
            serde_json::from_value(json!({"A": "x", "B": 64, "C": 1.5, "D": true, "E": false}))
                .unwrap();
        let texts = define_texts(&defines);
        let got: Vec<&str> = texts.values().map(String::as_str).collect();
        assert_eq!(got, ["x", "64", "1.5", "1", "0"]);
    }
}
