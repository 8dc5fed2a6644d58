//! What the demo shows while the job runs: one progress line per agent,
//! built from the job's events (assignments, hardware tool results and
//! their lock-holding intervals, task results).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use mtswarm_leader::LEADER_AGENT_ID;
use mtswarm_proto::v1;
use mtswarm_report::BusyInterval;
use serde_json::Value;

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

pub(super) fn timestamp_ms(ts: Option<&mtswarm_proto::prost_types::Timestamp>) -> Option<u64> {
    let ts = ts?;
    let ms = i128::from(ts.seconds) * 1000 + i128::from(ts.nanos) / 1_000_000;
    u64::try_from(ms).ok()
}

/// Live view of one worker agent.
#[derive(Default)]
pub(super) struct AgentProgress {
    pub(super) slice: String,
    pub(super) assigned: u64,
    /// Candidates the agent may evaluate: its tasks' `search_budget`s
    /// (at most their candidates), else all it was assigned.
    pub(super) budget: u64,
    /// Candidates (by their `-D` map) that ran on the slice: screened by a
    /// `validate` or fully benchmarked. The builtin worker policy screens
    /// at most its budget, by expected improvement, and skips what the
    /// roofline says cannot win, so this can end below `budget`.
    pub(super) evaluated: BTreeSet<String>,
    pub(super) benchmarked: u64,
    pub(super) best_gflops: Option<f64>,
    pub(super) finished: bool,
    pub(super) bar: Option<ProgressBar>,
}

impl AgentProgress {
    pub(super) fn message(&self) -> String {
        let best = match self.best_gflops {
            Some(g) => format!("best {g:.1} GFLOPS"),
            None => "no benchmarked candidate yet".into(),
        };
        if self.finished {
            let skipped = self.assigned.saturating_sub(self.evaluated.len() as u64);
            format!(
                "done: {best}, {} ran on the slice ({} benchmarked), {skipped} skipped by the search",
                self.evaluated.len(),
                self.benchmarked
            )
        } else {
            format!("{best}, {} benchmarked", self.benchmarked)
        }
    }
}

/// What the job's event stream tells about the run.
#[derive(Default)]
pub(super) struct JobObservation {
    pub(super) agents: BTreeMap<String, AgentProgress>,
    pub(super) busy: Vec<BusyInterval>,
    pub(super) first_assignment_ms: Option<u64>,
    pub(super) last_result_ms: Option<u64>,
}

/// The JSON of a tool result or call: its `data`, else its text content.
pub(super) fn tool_output(payload: &Value) -> Value {
    match payload.get("data") {
        Some(data) if !data.is_null() => data.clone(),
        _ => payload["content"]
            .as_str()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null),
    }
}

pub(super) struct View {
    pub(super) multi: MultiProgress,
    pub(super) bars: bool,
    pub(super) plain_to_stderr: bool,
}

impl View {
    pub(super) fn line(&self, text: &str) {
        if self.bars {
            return;
        }
        if self.plain_to_stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }
}

pub(super) fn observe(event: &v1::AgentEvent, seen: &mut JobObservation, view: &View) {
    let payload: Value = serde_json::from_str(&event.payload_json).unwrap_or(Value::Null);
    let at = timestamp_ms(event.timestamp.as_ref()).unwrap_or_else(now_ms);
    let kind = payload["type"].as_str().unwrap_or("");
    let name = payload["name"].as_str().unwrap_or("");
    if event.agent_id == LEADER_AGENT_ID {
        match (kind, name) {
            ("tool_result", "spawn_agent") => {
                let output = tool_output(&payload);
                if let (Some(agent), Some(slice)) =
                    (output["agent"].as_str(), output["slice_id"].as_str())
                {
                    seen.agents.entry(agent.to_string()).or_default().slice = slice.to_string();
                }
            }
            ("tool_call", "assign_task") => {
                let arguments = match &payload["arguments"] {
                    Value::String(text) => serde_json::from_str(text).unwrap_or(Value::Null),
                    other => other.clone(),
                };
                let Some(agent) = arguments["agent"].as_str() else {
                    return;
                };
                seen.first_assignment_ms.get_or_insert(at);
                let candidates = arguments["parameters"]["candidates"]
                    .as_array()
                    .map_or(1, |c| c.len() as u64);
                let budget = arguments["parameters"]["search_budget"]
                    .as_u64()
                    .map_or(candidates, |b| b.min(candidates));
                let progress = seen.agents.entry(agent.to_string()).or_default();
                progress.assigned += candidates;
                progress.budget += budget;
                if view.bars {
                    let style = ProgressStyle::with_template(
                        "{prefix:>10} [{bar:30.cyan/blue}] {pos}/{len} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                    let message = progress.message();
                    let budget = progress.budget;
                    let bar = progress.bar.get_or_insert_with(|| {
                        view.multi.add(
                            ProgressBar::new(0)
                                .with_style(style)
                                .with_prefix(agent.to_string()),
                        )
                    });
                    bar.set_length(budget);
                    bar.set_message(message);
                }
                view.line(&format!(
                    "{agent} ({}): {} candidates assigned, {} to evaluate",
                    progress.slice, progress.assigned, progress.budget
                ));
            }
            _ => {}
        }
        return;
    }
    if kind != "tool_result" {
        return;
    }
    let progress = seen.agents.entry(event.agent_id.clone()).or_default();
    if let (Some(duration), Some(wait)) = (
        payload["duration_ms"].as_u64(),
        payload["lock_wait_ms"].as_u64(),
    ) {
        let held = duration.saturating_sub(wait);
        seen.busy.push(BusyInterval {
            slice: progress.slice.clone(),
            start_ms: at.saturating_sub(held),
            end_ms: at,
            agent: event.agent_id.clone(),
            label: name.to_string(),
        });
        seen.last_result_ms = Some(seen.last_result_ms.unwrap_or(at).max(at));
    }
    let output = tool_output(&payload);
    let defines = match name {
        "validate" => &output["defines"],
        "benchmark" => &output["measurement"]["defines"],
        _ => return,
    };
    if defines.is_object() {
        progress.evaluated.insert(defines.to_string());
    }
    let measurement = &output["measurement"];
    if name == "benchmark" {
        progress.benchmarked += 1;
    }
    if measurement["valid"].as_bool() == Some(true)
        && measurement["flags"].as_array().is_none_or(Vec::is_empty)
        && let Some(gflops) = measurement["gflops"].as_f64()
    {
        progress.best_gflops = Some(progress.best_gflops.map_or(gflops, |b| b.max(gflops)));
    }
    if let Some(bar) = &progress.bar {
        bar.set_position(progress.evaluated.len() as u64);
        bar.set_message(progress.message());
    }
    view.line(&format!(
        "{} ({}): {}/{} evaluations on the slice, {}",
        event.agent_id,
        progress.slice,
        progress.evaluated.len(),
        progress.budget,
        progress.message()
    ));
}

/// The agent answered its task: its assignment is settled.
pub(super) fn task_finished(result: &v1::TaskResult, seen: &mut JobObservation, view: &View) {
    let progress = seen.agents.entry(result.agent_id.clone()).or_default();
    progress.finished = true;
    if let Some(bar) = &progress.bar {
        bar.set_position(progress.assigned);
        bar.set_message(progress.message());
    }
    view.line(&format!(
        "{} ({}): task {} {}: {}",
        result.agent_id,
        progress.slice,
        result.task_id,
        crate::render::task_status(result.status()),
        progress.message()
    ));
}
