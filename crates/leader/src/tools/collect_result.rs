//! `collect_result`: wait for task results and answer with a compact summary.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::{ToolEnv, output, string_list};

pub(super) struct CollectResult(pub(super) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for CollectResult {
    tool_meta!(
        "collect_result",
        "Wait for task results: of the given tasks, or of the given agents' tasks, or of every task. mode=all waits for all of them, mode=any for at least one not collected before; both return what is there when timeout_seconds passes.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "agents":{"type":"array","items":{"type":"string"}},
            "tasks":{"type":"array","items":{"type":"string"}},
            "mode":{"type":"string","enum":["any","all"]},
            "timeout_seconds":{"type":"number","minimum":0}
        },"additionalProperties":false})
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
        let job = &self.0.job;
        let config = &self.0.shared.config;
        let all = match args.get("mode").and_then(Value::as_str).unwrap_or("all") {
            "all" => true,
            "any" => false,
            other => {
                return Err(ToolError::InvalidArgs(format!(
                    "mode must be any or all, got {other:?}"
                )));
            }
        };
        let timeout = match args.get("timeout_seconds").and_then(Value::as_f64) {
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
        let tasks = string_list(&args, "tasks");
        let agents = string_list(&args, "agents");
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
        Ok(output(crate::digest::collect_summary(&views, timed_out)))
    }
}
