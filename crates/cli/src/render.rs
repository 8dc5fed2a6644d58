//! How protobuf records look to people and scripts: short lower-case enum
//! names, RFC 3339 timestamps, embedded `*_json` fields parsed back into
//! JSON (so `--json` output nests documents instead of quoting them), and
//! one JSON object per record for `--json`.

use mtswarm_core::clock::format_rfc3339_millis;
use mtswarm_proto::prost_types::Timestamp;
use mtswarm_proto::v1;
use serde_json::{Value, json};

/// `JOB_STATE_RUNNING` -> `running`: the enum's proto name without the
/// type prefix, lower-case.
pub(crate) fn short_name(proto_name: &str, prefix: &str) -> String {
    proto_name
        .strip_prefix(prefix)
        .unwrap_or(proto_name)
        .to_ascii_lowercase()
}

/// A job state as `mtswarm` prints it: `queued`, `running`, `succeeded`, ...
pub(crate) fn job_state(state: v1::JobState) -> String {
    short_name(state.as_str_name(), "JOB_STATE_")
}

/// A slice state as `mtswarm fleet` prints it: `free`, `leased`, `quarantined`, `offline`.
pub(crate) fn slice_state(state: v1::SliceState) -> String {
    short_name(state.as_str_name(), "SLICE_STATE_")
}

/// An approval state as printed: `pending`, `approved` or `denied`.
pub(crate) fn approval_state(state: v1::ApprovalState) -> String {
    short_name(state.as_str_name(), "APPROVAL_STATE_")
}

/// An approval verdict as printed: `approve` or `deny`.
pub(crate) fn verdict(verdict: v1::ApprovalVerdict) -> String {
    short_name(verdict.as_str_name(), "APPROVAL_VERDICT_")
}

/// A tool's risk level as printed: `low`, `medium` or `high`.
pub(crate) fn risk(risk: v1::RiskLevel) -> String {
    short_name(risk.as_str_name(), "RISK_LEVEL_")
}

/// A task status as printed: `ok`, `failed` or `cancelled`.
pub(crate) fn task_status(status: v1::TaskStatus) -> String {
    short_name(status.as_str_name(), "TASK_STATUS_")
}

/// An agent event kind as printed (`tool_call`, `tool_result`, `error`, ...).
pub(crate) fn event_kind(kind: v1::AgentEventKind) -> String {
    short_name(kind.as_str_name(), "AGENT_EVENT_KIND_")
}

/// Parses a `running`/`RUNNING`/`JOB_STATE_RUNNING` spelling.
pub(crate) fn parse_job_state(text: &str) -> Option<v1::JobState> {
    let upper = text.trim().to_ascii_uppercase();
    let full = if upper.starts_with("JOB_STATE_") {
        upper
    } else {
        format!("JOB_STATE_{upper}")
    };
    v1::JobState::from_str_name(&full).filter(|s| *s != v1::JobState::Unspecified)
}

/// RFC 3339 UTC (`2026-01-02T03:04:05.678Z`), or `None` for an absent stamp.
pub(crate) fn timestamp(ts: Option<&Timestamp>) -> Option<String> {
    let ts = ts?;
    let millis = u32::try_from(ts.nanos.clamp(0, 999_999_999) / 1_000_000).unwrap_or(0);
    Some(format_rfc3339_millis(ts.seconds, millis))
}

/// An embedded JSON document field: parsed when valid, kept as a string when
/// not (never dropped), `null` when empty.
pub(crate) fn embedded_json(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// A job's budgets (0 = unlimited or the server default); `null` when unset.
pub(crate) fn budgets(b: Option<&v1::Budgets>) -> Value {
    match b {
        None => Value::Null,
        Some(b) => json!({
            "max_steps": b.max_steps,
            "max_tokens": b.max_tokens,
            "device_seconds": b.device_seconds,
            "wall_time_seconds": b.wall_time_seconds,
        }),
    }
}

/// Steps, tokens and seconds spent; `null` when the record carries none.
pub(crate) fn usage(u: Option<&v1::Usage>) -> Value {
    match u {
        None => Value::Null,
        Some(u) => json!({
            "steps": u.steps,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "device_seconds": u.device_seconds,
            "wall_seconds": u.wall_seconds,
        }),
    }
}

/// One job for `--json`: its spec flattened in, states and timestamps
/// readable, `result_json` parsed, the outcome with [`outcome`].
pub(crate) fn job(job: &v1::JobRecord) -> Value {
    let spec = job.spec.clone().unwrap_or_default();
    json!({
        "job_id": job.job_id,
        "state": job_state(job.state()),
        "goal": spec.goal,
        "kernel_dir": spec.kernel_dir,
        "slice_selector": spec.slice_selector,
        "num_agents": spec.num_agents,
        "auto_approve": spec.auto_approve,
        "budgets": budgets(spec.budgets.as_ref()),
        "model": spec.model.as_ref().map(|m| json!({"base_url": m.base_url, "model": m.model})),
        "submitted_by": job.submitted_by,
        "created_at": timestamp(job.created_at.as_ref()),
        "started_at": timestamp(job.started_at.as_ref()),
        "finished_at": timestamp(job.finished_at.as_ref()),
        "summary": job.summary,
        "outcome": outcome(job.outcome.as_ref()),
        "result": embedded_json(&job.result_json),
        "final_answer": job.final_answer,
        "error": job.error,
        "agent_ids": job.agent_ids,
        "agents_total": job.agents_total.max(job.agent_ids.len() as u32),
        "tasks_total": job.tasks_total,
        "tasks_done": job.tasks_done,
        "usage": usage(job.usage.as_ref()),
        "traceparent": job.traceparent,
        "trace_id": mtswarm_telemetry::propagation::trace_id_of(&job.traceparent),
    })
}

/// A job outcome with units in its field names; `null` while the job runs.
pub(crate) fn outcome(outcome: Option<&v1::JobOutcome>) -> Value {
    let Some(o) = outcome else {
        return Value::Null;
    };
    let statuses: std::collections::BTreeMap<&String, &u32> =
        o.candidates_by_status.iter().collect();
    json!({
        "best": o.best.as_ref().map(best_candidate),
        "candidates_by_status": statuses,
        "records": o.records,
        "valid_records": o.valid_records,
        "tasks": {
            "ok": o.tasks_ok, "failed": o.tasks_failed,
            "cancelled": o.tasks_cancelled, "pending": o.tasks_pending,
        },
        "failure_reason": o.failure_reason,
        "confirmations": o.confirmations.iter().map(confirmation).collect::<Vec<_>>(),
        "refused_records": o.refused_records,
        "costs": o.agent_costs.iter().map(token_cost).collect::<Vec<_>>(),
        "total_cost": o.total_cost.as_ref().map(token_cost),
    })
}

/// Model tokens and their estimated cost (one agent's, or a job's total).
pub(crate) fn token_cost(c: &v1::TokenCost) -> Value {
    json!({
        "agent_id": c.agent_id,
        "model": c.model,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "estimated_cost": c.estimated_cost,
        "currency": c.currency,
        "priced": c.priced,
    })
}

/// A job's tokens and cost in a few characters for tables: `0.0123 USD`,
/// `1.2k tok` without a price, `-` without an outcome.
pub(crate) fn cost_cell(outcome: Option<&v1::JobOutcome>) -> String {
    let Some(total) = outcome.and_then(|o| o.total_cost.as_ref()) else {
        return "-".to_string();
    };
    let tokens = total.prompt_tokens.saturating_add(total.completion_tokens);
    if total.estimated_cost > 0.0 {
        let approximate = if total.priced { "" } else { ">" };
        format!(
            "{approximate}{:.4} {}",
            total.estimated_cost, total.currency
        )
    } else if tokens >= 1000 {
        format!("{:.1}k tok", tokens as f64 / 1000.0)
    } else {
        format!("{tokens} tok")
    }
}

/// The outcome's line about tokens and cost, when the job used a model.
fn cost_line(o: &v1::JobOutcome) -> Option<String> {
    let total = o.total_cost.as_ref()?;
    if total.prompt_tokens == 0 && total.completion_tokens == 0 {
        return None;
    }
    let cost = if total.estimated_cost > 0.0 || total.priced {
        format!(
            ", estimated {}{:.4} {}",
            if total.priced { "" } else { "more than " },
            total.estimated_cost,
            total.currency
        )
    } else {
        " (no price for the model; see --prices)".to_string()
    };
    let agents: Vec<String> = o
        .agent_costs
        .iter()
        .filter(|c| c.prompt_tokens + c.completion_tokens > 0)
        .map(|c| format!("{} {}+{}", c.agent_id, c.prompt_tokens, c.completion_tokens))
        .collect();
    Some(format!(
        "tokens    {} prompt + {} completion{cost} ({})",
        total.prompt_tokens,
        total.completion_tokens,
        agents.join(", ")
    ))
}

/// The best configuration of a job: its parameters, figures (GFLOPS,
/// median seconds, % of peak), where it ran and the records behind it.
pub(crate) fn best_candidate(b: &v1::BestCandidate) -> Value {
    let params: std::collections::BTreeMap<&String, &String> = b.params.iter().collect();
    json!({
        "params": params,
        "gflops": b.gflops,
        "median_seconds": b.median_seconds,
        "peak_percent": b.peak_percent,
        "cores": b.cores,
        "slice_id": b.slice_id,
        "backend": b.backend,
        "kernel": b.kernel,
        "kernel_hash": b.kernel_hash,
        "harness_hash": b.harness_hash,
        "agent_id": b.agent_id,
        "task_id": b.task_id,
        "record_ids": b.record_ids,
        "speedup_over_baseline": b.speedup_over_baseline,
        "baseline_record_id": b.baseline_record_id,
        "source_edited": b.source_edited,
        "source_diff": b.source_diff,
        "reproduced": b.reproduced,
        "confirmation": b.confirmation.as_ref().map(confirmation),
    })
}

/// A confirmation of a figure on another worker, for `--json`.
pub(crate) fn confirmation(c: &v1::Confirmation) -> Value {
    json!({
        "state": short_name(c.state().as_str_name(), "CONFIRMATION_STATE_"),
        "reason": c.reason, "seconds": c.seconds, "tolerance": c.tolerance,
        "original": {"record_id": c.original_record_id, "worker_id": c.original_worker_id,
                     "slice_id": c.original_slice_id, "median_seconds": c.original_median_seconds},
        "confirming": {"record_id": c.record_id, "worker_id": c.worker_id,
                       "slice_id": c.slice_id, "median_seconds": c.median_seconds},
    })
}

/// Diff lines `jobs <id>` shows of an edited best before cutting.
const DIFF_LINES_SHOWN: usize = 40;

/// The lines naming an edited best's source: its hash, the stat and the
/// start of its diff.
fn source_lines(b: &v1::BestCandidate) -> Vec<String> {
    let mut lines = vec![format!(
        "source    edited by the agent (not the pristine kernel): {}, kernel hash {}",
        mtswarm_report::diff_stat(&b.source_diff),
        truncate(&b.kernel_hash, 16)
    )];
    let diff: Vec<&str> = b.source_diff.lines().collect();
    lines.extend(
        diff.iter()
            .take(DIFF_LINES_SHOWN)
            .map(|l| format!("          {l}")),
    );
    if diff.len() > DIFF_LINES_SHOWN {
        lines.push(format!(
            "          ... {} more diff lines (`--json` shows all)",
            diff.len() - DIFF_LINES_SHOWN
        ));
    }
    lines
}

/// Lines for people describing an outcome (empty when there is none).
pub(crate) fn outcome_lines(outcome: Option<&v1::JobOutcome>) -> Vec<String> {
    let Some(o) = outcome else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    match &o.best {
        Some(b) => {
            let mut params: Vec<String> =
                b.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
            params.sort();
            lines.push(format!("best      {}", params.join(" ")));
            lines.push(format!(
                "          {:.2} GFLOPS, median {}, {:.1}% of the peak of {} cores{}",
                b.gflops,
                seconds(b.median_seconds),
                b.peak_percent,
                b.cores,
                b.speedup_over_baseline
                    .map(|s| format!(", {s:.1}x over the tune.toml baseline"))
                    .unwrap_or_default()
            ));
            lines.push(format!(
                "          slice {} ({}), agent {}, kernel {} {}",
                b.slice_id,
                b.backend,
                b.agent_id,
                b.kernel,
                truncate(&b.kernel_hash, 16)
            ));
            if b.source_edited {
                lines.extend(source_lines(b));
            }
            if b.reproduced {
                lines.push("          exact modeled time, reproduced by a spot re-run".to_owned());
            }
            if let Some(c) = &b.confirmation {
                lines.push(format!(
                    "confirmed {}: {}",
                    short_name(c.state().as_str_name(), "CONFIRMATION_STATE_"),
                    c.reason
                ));
            }
            lines.push(format!("records   {}", b.record_ids.join(", ")));
        }
        None => lines.push(format!("no result {}", o.failure_reason)),
    }
    let disputed = o
        .confirmations
        .iter()
        .filter(|c| c.state() == v1::ConfirmationState::Disagreed);
    lines.extend(disputed.map(|c| format!("disputed  {}", c.reason)));
    if o.refused_records > 0 {
        lines.push(format!(
            "refused   {} record(s) not produced by the worker of their task",
            o.refused_records
        ));
    }
    let mut statuses: Vec<String> = o
        .candidates_by_status
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    statuses.sort();
    lines.push(format!(
        "records   {} candidate record(s), {} valid: {}",
        o.records,
        o.valid_records,
        if statuses.is_empty() {
            "none".to_string()
        } else {
            statuses.join(", ")
        }
    ));
    lines.push(format!(
        "tasks     {} ok, {} failed, {} cancelled, {} pending",
        o.tasks_ok, o.tasks_failed, o.tasks_cancelled, o.tasks_pending
    ));
    lines.extend(cost_line(o));
    lines
}

/// Seconds in a readable unit (`1.23 ms`, `4.5 s`, `2m 03s`).
pub(crate) fn seconds(s: f64) -> String {
    if !s.is_finite() || s <= 0.0 {
        return format!("{s} s");
    }
    if s < 1e-6 {
        format!("{:.1} ns", s * 1e9)
    } else if s < 1e-3 {
        format!("{:.2} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else if s < 120.0 {
        format!("{s:.2} s")
    } else {
        let whole = s.round() as u64;
        format!("{}m {:02}s", whole / 60, whole % 60)
    }
}

/// The exit code a job's end maps to: 0 succeeded with a result, 1 failed,
/// cancelled or succeeded without one.
pub(crate) fn job_exit_code(job: &v1::JobRecord) -> u8 {
    let has_result = job.outcome.as_ref().is_some_and(|o| o.best.is_some());
    if job.state() == v1::JobState::Succeeded && has_result {
        0
    } else {
        1
    }
}

/// A slice's identity; `cluster` is `null` when the slice is a whole board
/// (the proto's -1); the whole value is `null` when absent.
pub(crate) fn slice_descriptor(s: Option<&v1::SliceDescriptor>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "slice_id": s.slice_id,
            "board": s.board,
            "cluster": if s.cluster < 0 { Value::Null } else { json!(s.cluster) },
            "cores": s.cores,
            "backend": s.backend,
        }),
    }
}

/// One row of `mtswarm fleet --json`: the slice, its worker and state, its
/// lease or quarantine (`null` when none) and its lock utilization (0..1).
pub(crate) fn fleet_slice(s: &v1::FleetSlice) -> Value {
    let descriptor = s.slice.clone().unwrap_or_default();
    json!({
        "slice_id": descriptor.slice_id,
        "board": descriptor.board,
        "cluster": if descriptor.cluster < 0 { Value::Null } else { json!(descriptor.cluster) },
        "cores": descriptor.cores,
        "backend": descriptor.backend,
        "worker_id": s.worker_id,
        "state": slice_state(s.state()),
        "lease": s.lease.as_ref().map(|l| json!({
            "session_id": l.session_id,
            "job_id": l.job_id,
            "epoch": l.epoch,
            "ttl_seconds": l.ttl_seconds,
            "expires_at": timestamp(l.expires_at.as_ref()),
        })),
        "quarantine": s.quarantine.as_ref().map(|q| json!({
            "reason": q.reason,
            "consecutive_failures": q.consecutive_failures,
            "since": timestamp(q.since.as_ref()),
            "by": q.by,
        })),
        "lock_utilization": s.lock_utilization,
    })
}

/// One worker daemon as `mtswarm fleet --json` lists it: endpoint, slices,
/// load and heartbeat.
pub(crate) fn worker(w: &v1::WorkerRecord) -> Value {
    json!({
        "worker_id": w.worker_id,
        "endpoint": w.endpoint,
        "slices": w.slices.iter().map(|s| slice_descriptor(Some(s))).collect::<Vec<_>>(),
        "draining": w.draining,
        "active_sessions": w.active_sessions,
        "started_at": timestamp(w.started_at.as_ref()),
        "heartbeat_at": timestamp(w.heartbeat_at.as_ref()),
        "version": w.version,
    })
}

/// What an agent asked to run: the tool, its parsed arguments, the risk and
/// what happens when nobody decides in time.
pub(crate) fn approval_request(r: &v1::ApprovalRequest) -> Value {
    json!({
        "approval_id": r.approval_id,
        "job_id": r.job_id,
        "agent_id": r.agent_id,
        "session_id": r.session_id,
        "call_id": r.call_id,
        "tool": r.tool_name,
        "arguments": embedded_json(&r.arguments_json),
        "risk": risk(r.risk()),
        "reason": r.reason,
        "requested_at": timestamp(r.requested_at.as_ref()),
        "timeout_seconds": r.timeout_seconds,
        "default_verdict": verdict(r.default_verdict()),
        "summary": r.summary,
        "candidate": if r.candidate_json.is_empty() { Value::Null } else { embedded_json(&r.candidate_json) },
        "slice_id": r.slice_id,
        "estimated_device_seconds": (r.estimated_device_seconds > 0.0).then_some(r.estimated_device_seconds),
        "files": r.files,
    })
}

/// What an approval request's call will do, in one line: the worker's
/// summary (tool, candidate, slice, device time, files), else the tool
/// and its arguments (requests of older workers).
pub(crate) fn what_it_does(r: &v1::ApprovalRequest) -> String {
    if r.summary.trim().is_empty() {
        format!("{} {}", r.tool_name, r.arguments_json)
    } else {
        r.summary.clone()
    }
}

/// How far a decision reaches, as printed: `call`, `tool_for_job` or `tool_for_agent`.
pub(crate) fn approval_scope(scope: v1::ApprovalScope) -> String {
    match scope {
        v1::ApprovalScope::Unspecified => "call".to_string(),
        other => short_name(other.as_str_name(), "APPROVAL_SCOPE_"),
    }
}

/// Who decided an approval, how, when and why (`timed_out` when nobody did).
pub(crate) fn approval_decision(d: &v1::ApprovalDecision) -> Value {
    json!({
        "approval_id": d.approval_id,
        "job_id": d.job_id,
        "session_id": d.session_id,
        "verdict": verdict(d.verdict()),
        "reason": d.reason,
        "decided_by": d.decided_by,
        "decided_at": timestamp(d.decided_at.as_ref()),
        "timed_out": d.timed_out,
        "scope": approval_scope(d.scope()),
        "standing_approval_id": (!d.standing_approval_id.is_empty()).then_some(&d.standing_approval_id),
    })
}

/// One approval for `--json`: the request's fields plus `state` and the
/// `decision` (`null` while pending).
pub(crate) fn approval(record: &v1::ApprovalRecord) -> Value {
    let mut value = record
        .request
        .as_ref()
        .map(approval_request)
        .unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut value {
        // A record that failed the leader's verification is neither
        // pending nor decided: it says so, and why.
        let state = if record.verification_error.is_empty() {
            approval_state(record.state())
        } else {
            "unverified".to_string()
        };
        map.insert("state".into(), json!(state));
        map.insert(
            "verification_error".into(),
            if record.verification_error.is_empty() {
                Value::Null
            } else {
                json!(record.verification_error)
            },
        );
        map.insert(
            "decision".into(),
            record
                .decision
                .as_ref()
                .map(approval_decision)
                .unwrap_or(Value::Null),
        );
    }
    value
}

/// One task attempt's result for `--json` (`result_json` parsed): one line
/// of `mtswarm tasks --format jsonl`.
pub(crate) fn task_result(r: &v1::TaskResult) -> Value {
    json!({
        "task_id": r.task_id,
        "attempt": r.attempt,
        "job_id": r.job_id,
        "agent_id": r.agent_id,
        "session_id": r.session_id,
        "worker_id": r.worker_id,
        "slice_id": r.slice_id,
        "status": task_status(r.status()),
        "summary": r.summary,
        "result": embedded_json(&r.result_json),
        "error": r.error,
        "usage": usage(r.usage.as_ref()),
        "finished_at": timestamp(r.finished_at.as_ref()),
    })
}

/// One event of an agent's session (a tool call, its result, a state
/// transition ...) with its parsed payload.
pub(crate) fn agent_event(e: &v1::AgentEvent) -> Value {
    json!({
        "job_id": e.job_id,
        "agent_id": e.agent_id,
        "session_id": e.session_id,
        "sequence": e.sequence,
        "step": e.step,
        "kind": event_kind(e.kind()),
        "payload": embedded_json(&e.payload_json),
        "timestamp": timestamp(e.timestamp.as_ref()),
    })
}

/// One `WatchJob` event as a JSON line: `{"sequence":..,"type":..,..}`.
pub(crate) fn job_event(e: &v1::JobEvent) -> Value {
    use v1::job_event::Event;
    let (kind, body) = match &e.event {
        Some(Event::AgentEvent(a)) => ("agent_event", agent_event(a)),
        Some(Event::StateChange(c)) => (
            "state_change",
            json!({
                "previous": job_state(c.previous()),
                "current": job_state(c.current()),
                "reason": c.reason,
                "outcome": outcome(c.outcome.as_ref()),
            }),
        ),
        Some(Event::ApprovalRequested(r)) => ("approval_requested", approval_request(r)),
        Some(Event::ApprovalDecided(d)) => ("approval_decided", approval_decision(d)),
        Some(Event::TaskResult(r)) => ("task_result", task_result(r)),
        None => ("unknown", Value::Null),
    };
    json!({
        "job_id": e.job_id,
        "sequence": e.sequence,
        "timestamp": timestamp(e.timestamp.as_ref()),
        "type": kind,
        kind: body,
    })
}

/// A compact one-line rendering of a JSON value for tables and prompts,
/// cut to `max` characters.
pub(crate) fn compact(value: &Value, max: usize) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    truncate(&text, max)
}

/// `text` cut to at most `max` characters, with an ellipsis when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let single_line: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if single_line.chars().count() <= max {
        return single_line;
    }
    let kept: String = single_line.chars().take(max.saturating_sub(1)).collect();
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_render_as_rfc3339_utc() {
        let ts = Timestamp {
            seconds: 1_767_323_045,
            nanos: 678_000_000,
        };
        assert_eq!(
            timestamp(Some(&ts)).as_deref(),
            Some("2026-01-02T03:04:05.678Z")
        );
        let epoch = Timestamp {
            seconds: 0,
            nanos: 0,
        };
        assert_eq!(
            timestamp(Some(&epoch)).as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        let leap_day = Timestamp {
            seconds: 951_782_400,
            nanos: 0,
        };
        assert_eq!(
            timestamp(Some(&leap_day)).as_deref(),
            Some("2000-02-29T00:00:00.000Z")
        );
        assert_eq!(timestamp(None), None);
    }

    #[test]
    fn job_states_parse_in_every_spelling_and_render_short() {
        assert_eq!(parse_job_state("running"), Some(v1::JobState::Running));
        assert_eq!(parse_job_state("SUCCEEDED"), Some(v1::JobState::Succeeded));
        assert_eq!(
            parse_job_state("JOB_STATE_FAILED"),
            Some(v1::JobState::Failed)
        );
        assert_eq!(parse_job_state("unspecified"), None);
        assert_eq!(parse_job_state("bogus"), None);
        assert_eq!(job_state(v1::JobState::Cancelled), "cancelled");
    }

    #[test]
    fn embedded_json_keeps_invalid_text_and_maps_empty_to_null() {
        assert_eq!(embedded_json(""), Value::Null);
        assert_eq!(embedded_json("{\"a\":1}"), json!({"a": 1}));
        assert_eq!(embedded_json("not json"), json!("not json"));
    }

    #[test]
    fn truncate_cuts_on_characters_and_flattens_lines() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("a\nb", 10), "a b");
        assert_eq!(truncate("ééééééé", 4), "ééé…");
    }

    #[test]
    fn costs_show_in_the_outcome_and_the_jobs_table() {
        let cost = |agent: &str, prompt, completion, estimated, priced| v1::TokenCost {
            agent_id: agent.into(),
            model: "m".into(),
            prompt_tokens: prompt,
            completion_tokens: completion,
            estimated_cost: estimated,
            priced,
            currency: "USD".into(),
        };
        let mut outcome = v1::JobOutcome {
            agent_costs: vec![
                cost("leader", 700, 140, 0.00056, true),
                cost("a1", 400, 80, 0.00032, true),
            ],
            total_cost: Some(cost("", 1100, 220, 0.00088, true)),
            ..Default::default()
        };
        assert_eq!(cost_cell(Some(&outcome)), "0.0009 USD");
        let lines = outcome_lines(Some(&outcome)).join("\n");
        assert!(
            lines.contains("tokens    1100 prompt + 220 completion, estimated 0.0009 USD (leader 700+140, a1 400+80)"),
            "{lines}"
        );
        let value = super::outcome(Some(&outcome));
        assert_eq!(value["costs"][1]["agent_id"], "a1");
        assert_eq!(value["total_cost"]["prompt_tokens"], 1100);
        // Without a price: the tokens, and no invented cost.
        outcome.total_cost = Some(cost("", 1500, 0, 0.0, false));
        assert_eq!(cost_cell(Some(&outcome)), "1.5k tok");
        let lines = outcome_lines(Some(&outcome)).join("\n");
        assert!(lines.contains("no price for the model"), "{lines}");
        assert_eq!(cost_cell(None), "-");
    }

    #[test]
    fn an_edited_best_names_its_source_with_hash_stat_and_diff() {
        let diff: String = "--- a/kernel.c\n+++ b/kernel.c\n@@ -1,2 +1,2 @@\n-old\n+new\n ctx\n"
            .to_string()
            + &(0..50).map(|i| format!("+more {i}\n")).collect::<String>();
        let mut best = v1::BestCandidate {
            kernel: "vecadd".into(),
            kernel_hash: "0123456789abcdef0123".into(),
            source_edited: true,
            source_diff: diff,
            ..Default::default()
        };
        let outcome = v1::JobOutcome {
            best: Some(best.clone()),
            ..Default::default()
        };
        let lines = outcome_lines(Some(&outcome)).join("\n");
        assert!(
            lines.contains("source    edited by the agent (not the pristine kernel): kernel.c +51 -1, kernel hash 0123456789abcde"),
            "{lines}"
        );
        assert!(lines.contains("          -old\n          +new"), "{lines}");
        assert!(lines.contains("more diff lines"), "{lines}");
        assert_eq!(best_candidate(&best)["source_edited"], true);
        best.source_edited = false;
        best.source_diff.clear();
        let outcome = v1::JobOutcome {
            best: Some(best),
            ..Default::default()
        };
        assert!(!outcome_lines(Some(&outcome)).join("\n").contains("source "));
    }
}
