//! Task results sized for a model. A worker's `result_json` carries every
//! candidate it touched; handing all of them to the leader model (137 KB
//! for 8 agents in one collect) overflows its context and gets truncated in
//! its view, so the model (builtin or real) misreads the results.
//!
//! - [`collect_summary`] is what `collect_result` returns: counts by task
//!   status and by candidate status, the best figure over the collected
//!   tasks, the ids of failed and pending tasks and one short row per agent,
//!   within [`COLLECT_BUDGET_BYTES`] whatever the number of agents and
//!   candidates (lists that do not fit are cut and their rest counted under
//!   `omitted`).
//! - [`details_page`] is what `result_details` returns: one row per
//!   candidate of the selected tasks, a page at a time, each page within
//!   [`DETAILS_BUDGET_BYTES`].
//!
//! Both read the structured fields of the worker's result (`best`,
//! `answer_json.candidates`, else `candidates` / `benchmarks`), never its
//! prose.

use std::collections::BTreeMap;

use mtswarm_bus::results::CandidateStatus;
use mtswarm_bus::v1;
use serde_json::{Map, Value, json};

use crate::results::TaskView;

/// Largest `collect_result` output, bytes of JSON.
pub const COLLECT_BUDGET_BYTES: usize = 6 * 1024;
/// Largest `result_details` page, bytes of JSON.
pub(crate) const DETAILS_BUDGET_BYTES: usize = 12 * 1024;
/// Rows of a details page unless asked otherwise.
pub(crate) const DEFAULT_PAGE_SIZE: usize = 20;
/// Most rows of a details page (a larger `page_size` is cut to it).
pub(crate) const MAX_PAGE_SIZE: usize = 40;
/// Characters of an error or reason kept in a summary or a row.
const SHORT_TEXT: usize = 100;

/// A task status as the tools name it.
pub(crate) fn status_name(status: v1::TaskStatus) -> &'static str {
    match status {
        v1::TaskStatus::Ok => "ok",
        v1::TaskStatus::Failed => "failed",
        v1::TaskStatus::Cancelled => "cancelled",
        v1::TaskStatus::Unspecified => "unknown",
    }
}

fn short(text: &str, limit: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(limit.saturating_sub(3)).collect();
    cut.push_str("...");
    cut
}

/// The job's goal as `job_status` shows it (the model has the full text in
/// its task message already).
pub(crate) fn short_goal(goal: &str) -> String {
    short(goal, 300)
}

/// Rounds a figure for a model's eyes (4 significant digits are plenty, and
/// long float tails cost tokens).
fn round4(x: f64) -> Value {
    if !x.is_finite() || x == 0.0 {
        return json!(x);
    }
    let digits = 3 - x.abs().log10().floor() as i32;
    let scale = 10f64.powi(digits.clamp(-300, 300));
    json!((x * scale).round() / scale)
}

fn parsed(result: &v1::TaskResult) -> Value {
    if result.result_json.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(&result.result_json).unwrap_or(Value::Null)
}

/// A `-D` map from a candidate-shaped JSON object.
fn params_of(value: &Value) -> Value {
    ["defines", "params", "config", "parameters"]
        .iter()
        .map(|k| &value[*k])
        .find(|v| v.is_object())
        .cloned()
        .unwrap_or(Value::Null)
}

fn peak_percent_of(value: &Value) -> Option<f64> {
    value["peak_percent"]
        .as_f64()
        .or_else(|| value["peak_fraction"].as_f64().map(|f| f * 100.0))
}

/// What happened to one candidate, from the worker's structured fields
/// (the names of [`CandidateStatus`]).
pub(crate) fn candidate_status(candidate: &Value) -> &'static str {
    CandidateStatus::of_candidate_json(candidate).as_str()
}

/// The candidates of a worker result: the answer's list (every candidate
/// the builtin policy touched), else the session's candidates, else its
/// benchmark summaries.
fn candidates(result: &Value) -> Vec<Value> {
    for list in [
        &result["answer_json"]["candidates"],
        &result["candidates"],
        &result["benchmarks"],
    ] {
        if let Some(items) = list.as_array()
            && !items.is_empty()
        {
            return items.clone();
        }
    }
    Vec::new()
}

/// The best figure of one worker result.
fn best_of(result: &Value) -> Option<Map<String, Value>> {
    let best = [&result["best"], &result["answer_json"]["best"]]
        .into_iter()
        .find(|b| b.is_object())?;
    let gflops = best["gflops"].as_f64();
    let median = best["median_seconds"].as_f64();
    if gflops.is_none() && median.is_none() {
        return None;
    }
    let mut out = Map::new();
    out.insert("params".into(), params_of(best));
    out.insert("gflops".into(), gflops.map(round4).unwrap_or(Value::Null));
    out.insert(
        "peak_percent".into(),
        peak_percent_of(best).map(round4).unwrap_or(Value::Null),
    );
    out.insert(
        "median_seconds".into(),
        median.map(round4).unwrap_or(Value::Null),
    );
    Some(out)
}

fn gflops_of(best: &Option<Map<String, Value>>) -> f64 {
    best.as_ref()
        .and_then(|b| b.get("gflops"))
        .and_then(Value::as_f64)
        .unwrap_or(f64::NEG_INFINITY)
}

fn size(value: &Value) -> usize {
    value.to_string().len()
}

/// The `collect_result` output for these task views (see the module docs).
pub(crate) fn collect_summary(views: &[TaskView], timed_out: bool) -> Value {
    let mut by_task: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut by_candidate: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut best: Option<(f64, Value)> = None;
    let mut failed = Vec::new();
    let mut pending = Vec::new();
    let mut rows: Vec<(f64, Value)> = Vec::new();
    let mut errors = Vec::new();
    for view in views {
        let Some(result) = &view.result else {
            pending.push(json!(view.task_id));
            continue;
        };
        let status = status_name(result.status());
        *by_task.entry(status).or_default() += 1;
        let body = parsed(result);
        let mut counts: BTreeMap<&'static str, u32> = BTreeMap::new();
        for candidate in candidates(&body) {
            *counts.entry(candidate_status(&candidate)).or_default() += 1;
        }
        for (k, n) in &counts {
            *by_candidate.entry(k).or_default() += n;
        }
        let task_best = if status == "ok" { best_of(&body) } else { None };
        let key = gflops_of(&task_best);
        if let Some(b) = &task_best
            && best.as_ref().is_none_or(|(k, _)| key > *k)
        {
            let mut b = b.clone();
            b.insert("task_id".into(), json!(view.task_id));
            b.insert("agent".into(), json!(view.agent_id));
            b.insert("slice_id".into(), json!(result.slice_id));
            best = Some((key, Value::Object(b)));
        }
        if status == "failed" {
            failed.push(json!(view.task_id));
            if !result.error.trim().is_empty() {
                errors.push(
                    json!({"agent": view.agent_id, "error": short(&result.error, SHORT_TEXT)}),
                );
            }
        }
        let mut row = json!({
            "agent": view.agent_id, "task_id": view.task_id, "status": status,
            "gflops": task_best.as_ref().and_then(|b| b.get("gflops")).cloned().unwrap_or(Value::Null),
            "candidates": counts,
        });
        if status != "ok" && !result.error.trim().is_empty() {
            row["error"] = json!(short(&result.error, 60));
        }
        rows.push((key, row));
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out = json!({
        "tasks": views.len(),
        "finished": views.len() - pending.len(),
        "timed_out": timed_out,
        "task_status": by_task,
        "candidate_status": by_candidate,
        "best": best.map(|(_, b)| b).unwrap_or(Value::Null),
        "failed_tasks": [],
        "pending_tasks": [],
        "errors": [],
        "agents": [],
        "omitted": {},
        "details": "result_details(task?, agent?, status?, page?) lists every candidate with its status and figures",
    });
    // Lists in the order the next step needs them: failed tasks (to retry),
    // pending ones (to wait for), a few errors, then the agents' rows.
    let lists: [(&str, Vec<Value>); 4] = [
        ("failed_tasks", failed),
        ("pending_tasks", pending),
        ("errors", errors.into_iter().take(3).collect()),
        ("agents", rows.into_iter().map(|(_, r)| r).collect()),
    ];
    // Room for the `omitted` counts that may be added at the end.
    let reserve = 120;
    let mut used = size(&out);
    let mut omitted = Map::new();
    for (key, items) in lists {
        let total = items.len();
        let mut kept = Vec::new();
        for item in items {
            let cost = size(&item) + 1;
            if used + cost + reserve > COLLECT_BUDGET_BYTES {
                break;
            }
            used += cost;
            kept.push(item);
        }
        if kept.len() < total {
            omitted.insert(key.to_string(), json!(total - kept.len()));
        }
        out[key] = Value::Array(kept);
    }
    out["omitted"] = Value::Object(omitted);
    out
}

/// Filters of [`details_page`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct DetailsQuery {
    /// Only this task's candidates; `None` = every task.
    pub task: Option<String>,
    /// Only this agent's tasks; `None` = every agent.
    pub agent: Option<String>,
    /// A candidate status name (benchmarked, invalid, ...).
    pub status: Option<String>,
    /// 1-based; 0 reads as 1.
    pub page: usize,
    /// Rows per page; 0 = [`DEFAULT_PAGE_SIZE`], at most [`MAX_PAGE_SIZE`].
    pub page_size: usize,
}

/// One page of candidate rows of the selected tasks (see the module docs).
pub(crate) fn details_page(views: &[TaskView], query: &DetailsQuery) -> Value {
    let mut rows = Vec::new();
    for view in views {
        if query.task.as_ref().is_some_and(|t| t != &view.task_id)
            || query.agent.as_ref().is_some_and(|a| a != &view.agent_id)
        {
            continue;
        }
        let Some(result) = &view.result else { continue };
        for (index, candidate) in candidates(&parsed(result)).iter().enumerate() {
            let status = candidate_status(candidate);
            if query.status.as_ref().is_some_and(|s| s != status) {
                continue;
            }
            let reason = ["failure", "skipped", "error"]
                .iter()
                .filter_map(|k| candidate[*k].as_str())
                .find(|r| !r.trim().is_empty())
                .map(|r| short(r, SHORT_TEXT));
            let mut row = json!({
                "task_id": view.task_id, "agent": view.agent_id,
                "index": candidate["index"].as_u64().unwrap_or(index as u64),
                "params": params_of(candidate), "status": status,
            });
            for (key, value) in [
                ("gflops", candidate["gflops"].as_f64()),
                ("median_seconds", candidate["median_seconds"].as_f64()),
                ("peak_percent", peak_percent_of(candidate)),
                ("screen_seconds", candidate["screen_seconds"].as_f64()),
            ] {
                if let Some(v) = value {
                    row[key] = round4(v);
                }
            }
            if let Some(reason) = reason {
                row["reason"] = json!(reason);
            }
            rows.push(row);
        }
    }
    let page_size = match query.page_size {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    let total = rows.len();
    let pages = total.div_ceil(page_size).max(1);
    let page = query.page.max(1);
    let mut kept: Vec<Value> = rows
        .into_iter()
        .skip((page - 1).saturating_mul(page_size))
        .take(page_size)
        .collect();
    let mut out = json!({
        "page": page, "pages": pages, "page_size": page_size, "total": total, "rows": [],
    });
    // Rows are bounded (short reasons), but parameter maps are not: cut the
    // page rather than exceed the budget, and say so.
    let mut used = size(&out) + 40;
    let mut cut = 0;
    let mut fitting = Vec::new();
    for row in kept.drain(..) {
        let cost = size(&row) + 1;
        if used + cost > DETAILS_BUDGET_BYTES {
            cut += 1;
            continue;
        }
        used += cost;
        fitting.push(row);
    }
    out["rows"] = Value::Array(fitting);
    if cut > 0 {
        out["rows_cut"] = json!(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker result as the builtin worker policy writes it, with
    /// `candidates` candidates of every kind.
    fn worker_result(task: &str, agent: &str, gflops: f64, candidates: usize) -> TaskView {
        let list: Vec<Value> = (0..candidates)
            .map(|i| match i % 4 {
                0 => json!({"index": i, "defines": {"MB": "64", "NB": "256", "KB": "64", "MR": "8"},
                            "median_seconds": 0.01, "gflops": gflops, "peak_percent": 4.2}),
                1 => json!({"index": i, "defines": {"MB": "32"}, "failure": "compile: error: 'x' undeclared ".repeat(20)}),
                2 => json!({"index": i, "defines": {"MB": "128"}, "skipped": "pruned: roofline bound"}),
                _ => json!({"index": i, "defines": {"MB": "32"}, "screen_seconds": 0.5,
                            "skipped": "screened only: not among the finalists"}),
            })
            .collect();
        let body = json!({
            "best": {"defines": {"MB": "64"}, "median_seconds": 0.01, "gflops": gflops, "peak_fraction": 0.042},
            "answer_json": {"best": null, "candidates": list},
            "benchmarks": [{"big": "x".repeat(2000)}],
        });
        TaskView {
            task_id: task.into(),
            agent_id: agent.into(),
            attempt: 1,
            result: Some(v1::TaskResult {
                task_id: task.into(),
                attempt: 1,
                agent_id: agent.into(),
                slice_id: format!("board0-c{agent}"),
                status: v1::TaskStatus::Ok as i32,
                result_json: body.to_string(),
                ..Default::default()
            }),
            delivered: false,
        }
    }

    #[test]
    fn the_summary_stays_within_budget_for_64_agents_and_names_the_best() {
        let mut views: Vec<TaskView> = (0..64)
            .map(|i| {
                worker_result(
                    &format!("{:032x}", i),
                    &format!("tuner-{i}"),
                    1.0 + i as f64,
                    100,
                )
            })
            .collect();
        views[3].result.as_mut().expect("result").status = v1::TaskStatus::Failed as i32;
        views[3].result.as_mut().expect("result").error = "e".repeat(5000);
        views[5].result = None;
        let summary = collect_summary(&views, true);
        let text = summary.to_string();
        assert!(text.len() <= COLLECT_BUDGET_BYTES, "{} bytes", text.len());
        assert_eq!(summary["best"]["agent"], "tuner-63");
        assert_eq!(summary["best"]["gflops"], json!(64.0));
        assert_eq!(summary["failed_tasks"], json!([format!("{:032x}", 3)]));
        assert_eq!(summary["pending_tasks"], json!([format!("{:032x}", 5)]));
        assert_eq!(summary["task_status"]["ok"], 62);
        // 62 finished ok + 1 failed tasks with 25 of each kind.
        assert_eq!(summary["candidate_status"]["benchmarked"], 63 * 25);
        assert_eq!(summary["candidate_status"]["compile_failed"], 63 * 25);
        assert_eq!(summary["candidate_status"]["pruned"], 63 * 25);
        assert_eq!(summary["candidate_status"]["screened"], 63 * 25);
        let rows = summary["agents"].as_array().map_or(0, Vec::len);
        assert!(rows > 0);
        assert_eq!(summary["omitted"]["agents"], json!(63 - rows));
    }

    #[test]
    fn details_pages_cover_every_candidate_once_within_budget() {
        let views: Vec<TaskView> = (0..3)
            .map(|i| worker_result(&format!("t{i}"), &format!("a{i}"), 2.0, 30))
            .collect();
        let mut seen = 0;
        let mut page = 1;
        loop {
            let out = details_page(
                &views,
                &DetailsQuery {
                    page,
                    page_size: 40,
                    ..Default::default()
                },
            );
            assert!(out.to_string().len() <= DETAILS_BUDGET_BYTES);
            assert!(out.get("rows_cut").is_none());
            seen += out["rows"].as_array().map_or(0, Vec::len);
            if page >= out["pages"].as_u64().unwrap_or(0) as usize {
                break;
            }
            page += 1;
        }
        assert_eq!(seen, 90);
        let pruned = details_page(
            &views,
            &DetailsQuery {
                agent: Some("a1".into()),
                status: Some("pruned".into()),
                page: 1,
                ..Default::default()
            },
        );
        assert_eq!(pruned["total"], 7);
        assert!(pruned["rows"].as_array().is_some_and(|r| {
            r.iter()
                .all(|r| r["status"] == "pruned" && r["agent"] == "a1")
        }));
    }
}
