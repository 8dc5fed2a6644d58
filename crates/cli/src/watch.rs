//! `mtswarm watch` (and `submit --watch`): follows a job's WatchJob stream.
//!
//! - On a terminal: one indicatif line for the job and one per agent (its
//!   step, what it is doing, its tasks), redrawn as events arrive.
//! - Otherwise: one plain line per state change, task result and approval
//!   (`--events` adds every agent event), for logs; `--json`: one JSON
//!   object per event, all of them, for scripts, after one naming the
//!   job's trace (`{"type": "trace", "trace_id": ...}`).
//! - When stdin and stdout are both terminals, each approval request is
//!   shown as it arrives (tool, arguments, risk, why) and the user approves
//!   or denies it, one at a time; requests that someone else decided in the
//!   meantime are skipped.
//!
//! The exit code tells how the job ended: 0 succeeded with a result (an
//! outcome with a best configuration), 1 failed or cancelled, 2 the leader
//! could not be reached or the request was refused.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use mtswarm_proto::v1;
use mtswarm_proto::v1::job_event::Event;
use serde_json::Value;
use tokio_stream::StreamExt as _;

use crate::approval_prompt::ask_about;
use crate::common::{Control, LeaderArgs, rpc_error};
use crate::render;

/// Arguments of `mtswarm watch`: the job, where to resume and how to show it.
#[derive(Debug, Args)]
pub struct WatchCmd {
    /// The job to follow (see `mtswarm jobs`).
    pub job_id: String,
    /// Resume from this event sequence (0 = from the start).
    #[arg(long, env = "MTSWARM_FROM_SEQUENCE", default_value_t = 0)]
    pub from: u64,
    /// One JSON object per event on stdout (every event).
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Off a terminal, print every agent event too (default: state
    /// changes, task results and approvals only).
    #[arg(long, env = "MTSWARM_WATCH_EVENTS")]
    pub events: bool,
    /// Never ask about approvals (leave them to `mtswarm approve`/`deny`).
    #[arg(long, env = "MTSWARM_NO_PROMPT")]
    pub no_prompt: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// How to watch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchOptions {
    /// First event sequence to replay (0 = from the job's first event).
    pub from_sequence: u64,
    /// One JSON object per event on stdout instead of the live view.
    pub json: bool,
    /// Plain output off a terminal includes every agent event.
    pub events: bool,
    /// Ask about approvals when stdin and stdout are terminals.
    pub prompt: bool,
}

/// `mtswarm watch JOB`: follows the job's events until it ends; exits as
/// [`render::job_exit_code`] maps the end (see `--help`).
pub(crate) async fn watch(cmd: WatchCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    print_trace_id(&mut control, &cmd.job_id, cmd.json).await;
    watch_job(
        &mut control,
        &cmd.leader.url(),
        &cmd.job_id,
        WatchOptions {
            from_sequence: cmd.from,
            json: cmd.json,
            events: cmd.events,
            prompt: !cmd.no_prompt,
        },
    )
    .await
}

/// Prints the job's trace id first, so the watched job can be found in a
/// trace backend: a line for people, or with `json` an object of its own
/// (`{"type": "trace", "job_id", "trace_id"}`) before the events. A job
/// that cannot be read is left to the watch to report.
async fn print_trace_id(control: &mut Control, job_id: &str, json: bool) {
    let request = v1::GetJobRequest {
        job_id: job_id.to_string(),
    };
    let Ok(response) = control.get_job(request).await else {
        return;
    };
    let traceparent = response
        .into_inner()
        .job
        .map(|job| job.traceparent)
        .unwrap_or_default();
    let Some(trace_id) = mtswarm_telemetry::propagation::trace_id_of(&traceparent) else {
        return;
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"type": "trace", "job_id": job_id, "trace_id": trace_id})
        );
    } else {
        println!("job {job_id}: trace {trace_id}");
    }
}

/// What the view knows about one agent.
#[derive(Debug, Default)]
struct AgentView {
    step: u32,
    last_sequence: u64,
    doing: String,
    tasks_done: u32,
    tasks_failed: u32,
    bar: Option<ProgressBar>,
}

impl AgentView {
    fn line(&self, agent: &str) -> String {
        let tasks = if self.tasks_failed > 0 {
            format!("{} done, {} failed", self.tasks_done, self.tasks_failed)
        } else {
            format!("{} done", self.tasks_done)
        };
        format!(
            "{agent:<14} step {:>3}  [{tasks}]  {}",
            self.step,
            render::truncate(&self.doing, 90)
        )
    }
}

/// What one agent event says it is doing, in a few words.
fn describe(event: &v1::AgentEvent) -> String {
    let payload = render::embedded_json(&event.payload_json);
    let field = |name: &str| -> String {
        match payload.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    };
    let tool = field("name");
    match event.kind() {
        v1::AgentEventKind::ToolCall => {
            let args = payload
                .get("arguments")
                .map(|a| render::compact(a, 60))
                .unwrap_or_default();
            format!("-> {tool} {args}")
        }
        v1::AgentEventKind::ToolResult => match payload.get("ok").and_then(Value::as_bool) {
            Some(true) => format!("<- {tool} ok"),
            Some(false) => format!(
                "<- {tool} failed: {}",
                render::truncate(&field("content"), 80)
            ),
            None => format!("<- {tool}"),
        },
        v1::AgentEventKind::Thinking | v1::AgentEventKind::TextDelta => {
            let text = field("text");
            format!("{} {}", render::event_kind(event.kind()), text)
        }
        v1::AgentEventKind::ApprovalRequested => {
            let tools: Vec<&str> = payload
                .get("approvals")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .filter_map(|c| c.get("tool").and_then(Value::as_str))
                        .collect()
                })
                .unwrap_or_default();
            format!("waiting for approval of {}", tools.join(", "))
        }
        v1::AgentEventKind::ApprovalDecided => format!("approval decided {}", field("verdict")),
        v1::AgentEventKind::StateTransition => {
            format!("{} -> {} ({})", field("from"), field("to"), field("reason"))
        }
        v1::AgentEventKind::Error => format!("error: {}", field("message")),
        kind => {
            let detail = render::compact(&payload, 60);
            format!("{} {detail}", render::event_kind(kind))
        }
    }
}

/// Follows `job_id` until it is final. Returns 0 when it succeeded.
pub(crate) async fn watch_job(
    control: &mut Control,
    leader: &str,
    job_id: &str,
    options: WatchOptions,
) -> anyhow::Result<ExitCode> {
    let interactive_view = !options.json && std::io::stdout().is_terminal();
    let can_prompt =
        options.prompt && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let mut view = LiveView::new(job_id, interactive_view);
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_string(),
            from_sequence: options.from_sequence,
        })
        .await
        .map_err(|status| rpc_error("watching the job", leader, status))?
        .into_inner();
    while let Some(item) = stream.next().await {
        let event = item.map_err(|status| rpc_error("watching the job", leader, status))?;
        if options.json {
            println!("{}", render::job_event(&event));
        } else if !interactive_view
            && (options.events || !matches!(event.event, Some(Event::AgentEvent(_))))
        {
            println!("{}", plain_line(&event));
        }
        match &event.event {
            Some(Event::AgentEvent(agent_event)) => view.agent_event(agent_event),
            Some(Event::StateChange(change)) => view.state_change(change.current()),
            Some(Event::TaskResult(result)) => view.task_result(result),
            Some(Event::ApprovalRequested(request)) => {
                if can_prompt {
                    ask_about(control, leader, request, &view.multi).await?;
                }
            }
            Some(Event::ApprovalDecided(_)) | None => {}
        }
    }
    view.finish();
    // The stream ended: the job is final. Show how it ended.
    let job = control
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_string(),
        })
        .await
        .map_err(|status| rpc_error("getting the job", leader, status))?
        .into_inner()
        .job
        .unwrap_or_default();
    print_end(&job, job_id, options.json);
    Ok(ExitCode::from(render::job_exit_code(&job)))
}

/// The live view of a watched job: a line for the job, one per agent (drawn
/// on a terminal only).
struct LiveView {
    job_id: String,
    multi: MultiProgress,
    style: ProgressStyle,
    job_bar: ProgressBar,
    agents: BTreeMap<String, AgentView>,
    state: v1::JobState,
    tasks_done: u32,
}

impl LiveView {
    fn new(job_id: &str, interactive_view: bool) -> Self {
        let multi = MultiProgress::with_draw_target(if interactive_view {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        });
        let style = ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        let job_bar = multi.add(ProgressBar::new_spinner().with_style(style.clone()));
        job_bar.set_message(format!("job {job_id}: connecting"));
        Self {
            job_id: job_id.to_owned(),
            multi,
            style,
            job_bar,
            agents: BTreeMap::new(),
            state: v1::JobState::Unspecified,
            tasks_done: 0,
        }
    }

    /// An agent's step: what it is doing now, on its own line.
    fn agent_event(&mut self, agent_event: &v1::AgentEvent) {
        let view = self.agents.entry(agent_event.agent_id.clone()).or_default();
        view.step = view.step.max(agent_event.step);
        view.last_sequence = agent_event.sequence;
        view.doing = describe(agent_event);
        if view.bar.is_none() {
            view.bar = Some(
                self.multi
                    .add(ProgressBar::new_spinner().with_style(self.style.clone())),
            );
        }
        if let Some(bar) = &view.bar {
            bar.set_message(view.line(&agent_event.agent_id));
            bar.tick();
        }
    }

    fn state_change(&mut self, state: v1::JobState) {
        self.state = state;
        self.show_job();
    }

    /// A task's end, counted for the job and its agent.
    fn task_result(&mut self, result: &v1::TaskResult) {
        self.tasks_done += 1;
        let view = self.agents.entry(result.agent_id.clone()).or_default();
        if result.status() == v1::TaskStatus::Ok {
            view.tasks_done += 1;
        } else {
            view.tasks_failed += 1;
        }
        view.doing = format!(
            "task {} {}: {}",
            result.task_id,
            render::task_status(result.status()),
            if result.error.is_empty() {
                &result.summary
            } else {
                &result.error
            }
        );
        if let Some(bar) = &view.bar {
            bar.set_message(view.line(&result.agent_id));
        }
        self.show_job();
    }

    fn show_job(&self) {
        self.job_bar.set_message(format!(
            "job {}: {}  tasks done {}",
            self.job_id,
            render::job_state(self.state),
            self.tasks_done
        ));
    }

    fn finish(&self) {
        self.job_bar.finish_and_clear();
        for view in self.agents.values() {
            if let Some(bar) = &view.bar {
                bar.finish();
            }
        }
    }
}

/// How the job ended: its state, summary, error and outcome, or with `json`
/// one object (`{"type": "job", "job"}`).
fn print_end(job: &v1::JobRecord, job_id: &str, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({ "type": "job", "job": render::job(job) })
        );
        return;
    }
    println!(
        "job {job_id} {}{}",
        render::job_state(job.state()),
        if job.summary.is_empty() {
            String::new()
        } else {
            format!(": {}", job.summary)
        }
    );
    if !job.error.is_empty() {
        println!("error: {}", job.error);
    }
    for line in render::outcome_lines(job.outcome.as_ref()) {
        println!("{line}");
    }
}

/// One event as a line of text (non-terminal output).
fn plain_line(event: &v1::JobEvent) -> String {
    match &event.event {
        Some(Event::AgentEvent(a)) => format!(
            "[{}] {} #{} step {}: {}",
            event.sequence,
            a.agent_id,
            a.sequence,
            a.step,
            describe(a)
        ),
        Some(Event::StateChange(c)) => format!(
            "[{}] job {} -> {}{}",
            event.sequence,
            render::job_state(c.previous()),
            render::job_state(c.current()),
            if c.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", c.reason)
            }
        ),
        Some(Event::ApprovalRequested(r)) => format!(
            "[{}] approval {} requested by {}: {} (risk {}) - decide with `mtswarm approve {} [--scope job]` or `mtswarm deny {}`",
            event.sequence,
            r.approval_id,
            r.agent_id,
            render::truncate(&render::what_it_does(r), 160),
            render::risk(r.risk()),
            r.approval_id,
            r.approval_id
        ),
        Some(Event::ApprovalDecided(d)) => format!(
            "[{}] approval {} {} by {}{}{}",
            event.sequence,
            d.approval_id,
            render::verdict(d.verdict()),
            d.decided_by,
            match d.scope() {
                v1::ApprovalScope::ToolForJob =>
                    format!(" for every `{}` call of the job", d.tool_name),
                v1::ApprovalScope::ToolForAgent => {
                    format!(" for every `{}` call of {}", d.tool_name, d.agent_id)
                }
                _ => String::new(),
            },
            if d.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", d.reason)
            }
        ),
        Some(Event::TaskResult(r)) => format!(
            "[{}] result of task {} (attempt {}) from {}: {} {}",
            event.sequence,
            r.task_id,
            r.attempt,
            r.agent_id,
            render::task_status(r.status()),
            render::truncate(
                if r.error.is_empty() {
                    &r.summary
                } else {
                    &r.error
                },
                120
            )
        ),
        None => format!("[{}] (unknown event)", event.sequence),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: v1::AgentEventKind, payload: serde_json::Value) -> v1::AgentEvent {
        v1::AgentEvent {
            kind: kind as i32,
            payload_json: payload.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn events_are_described_by_what_the_agent_does() {
        let call = event(
            v1::AgentEventKind::ToolCall,
            serde_json::json!({"type": "tool_call", "name": "compile", "arguments": {"defines": {"CHUNK": 1024}}}),
        );
        assert!(
            describe(&call).starts_with("-> compile {"),
            "{}",
            describe(&call)
        );
        let denied = event(
            v1::AgentEventKind::ToolResult,
            serde_json::json!({"type": "tool_result", "name": "benchmark", "ok": false, "content": "error: denied"}),
        );
        assert_eq!(describe(&denied), "<- benchmark failed: error: denied");
        let approval = event(
            v1::AgentEventKind::ApprovalRequested,
            serde_json::json!({"type": "approval_required", "approvals": [{"tool": "validate", "call_id": "c0"}]}),
        );
        assert_eq!(describe(&approval), "waiting for approval of validate");
        let transition = event(
            v1::AgentEventKind::StateTransition,
            serde_json::json!({"from": "reasoning", "to": "tool_routing", "reason": "MODEL_RETURNED_TOOL_CALLS"}),
        );
        assert_eq!(
            describe(&transition),
            "reasoning -> tool_routing (MODEL_RETURNED_TOOL_CALLS)"
        );
    }
}
