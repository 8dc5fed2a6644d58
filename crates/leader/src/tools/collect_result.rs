//! `collect_result`: wait for task results and answer with a compact summary.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolEnv, output, parse_args};

pub(super) struct CollectResult(pub(super) Arc<ToolEnv>);

/// Arguments of `collect_result`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CollectResultArgs {
    /// the agents whose tasks to wait for
    #[serde(default)]
    agents: Option<Vec<String>>,
    /// the tasks to wait for
    #[serde(default)]
    tasks: Option<Vec<String>>,
    /// all: every task; any: at least one not collected before
    #[serde(default)]
    mode: Option<CollectMode>,
    /// how long to wait
    #[serde(default)]
    #[schemars(range(min = 0.0))]
    timeout_seconds: Option<f64>,
}

/// How many results `collect_result` waits for.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CollectMode {
    /// At least one not collected before.
    Any,
    /// Every one.
    All,
}

/// What `collect_result` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "collect_result",
    "Wait for task results: of the given tasks, or of the given agents' tasks, or of every task. mode=all waits for all of them, mode=any for at least one not collected before; both return what is there when timeout_seconds passes.",
    schema_of::<CollectResultArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for CollectResult {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, mut args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        // A single id where a list is expected, and numbers as strings.
        if let Some(map) = args.as_object_mut() {
            for key in ["agents", "tasks"] {
                if let Some(Value::String(one)) = map.get(key).cloned() {
                    map.insert(key.to_string(), json!([one]));
                }
            }
            if let Some(Value::String(text)) = map.get("timeout_seconds").cloned() {
                let seconds: f64 = text.trim().parse().map_err(|_| {
                    mtswarm_core::NormalizeError::invalid(format!(
                        "timeout_seconds {text:?} is not a number"
                    ))
                })?;
                map.insert("timeout_seconds".into(), json!(seconds));
            }
        }
        Ok(args)
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: CollectResultArgs = parse_args(args)?;
        let job = &self.0.job;
        let config = &self.0.handles;
        let all = !matches!(args.mode, Some(CollectMode::Any));
        let timeout = match args.timeout_seconds {
            Some(s) if s.is_finite() && s >= 0.0 => {
                Duration::from_secs_f64(s).min(config.max_collect_timeout)
            }
            Some(s) => {
                return Err(ToolError::InvalidArgs(format!(
                    "timeout_seconds {s} is invalid"
                )));
            }
            None => config.default_collect_timeout,
        };
        let tasks = args.tasks.unwrap_or_default();
        let agents = args.agents.unwrap_or_default();
        let ids = if !tasks.is_empty() {
            if let Some(unknown) = tasks.iter().find(|t| !job.results.knows(t)) {
                return Err(ToolError::InvalidArgs(format!(
                    "no task {unknown:?} in this job"
                )));
            }
            tasks
        } else if !agents.is_empty() {
            let known = job.agents();
            if let Some(unknown) = agents.iter().find(|a| !known.contains_key(*a)) {
                return Err(ToolError::InvalidArgs(format!(
                    "no agent {unknown:?} in this job"
                )));
            }
            drop(known);
            job.results.task_ids(Some(&agents))
        } else {
            job.results.task_ids(None)
        };
        if ids.is_empty() {
            return Err(ToolError::InvalidArgs(
                "there are no tasks to collect (assign_task first)".into(),
            ));
        }
        let (views, timed_out) = job.results.collect(&ids, all, timeout).await;
        let mut summary = crate::digest::collect_summary(&views, timed_out);
        summary["next"] = json!(next_step(&summary));
        Ok(output(summary))
    }
}

/// What the loop does after this collect, for a model that would not
/// know: wait on, retry or answer.
pub(super) fn next_step(summary: &Value) -> &'static str {
    let pending = summary["pending_tasks"]
        .as_array()
        .is_some_and(|p| !p.is_empty());
    if pending {
        "collect_result again: some tasks have not reported yet"
    } else if summary["best"].is_object() {
        "answer now: a one-line summary, then a ```json block with the best's params and gflops as given above"
    } else {
        "no valid measurement: assign_task again with other candidates (the errors say why these failed), or answer with best null"
    }
}
