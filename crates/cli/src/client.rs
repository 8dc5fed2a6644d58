//! The client commands that talk to the leader's Control service: `submit`,
//! `jobs`, `fleet`, `quarantine list` / `quarantine lift`, `approvals`,
//! `approve` / `deny` and `tasks`. Each prints a table for people by default
//! and JSON with `--json` (one object; `tasks` also speaks JSON lines and
//! CSV).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use mtswarm_proto::v1;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use crate::common::{LeaderArgs, local_identity, rpc_error};
use crate::render;
use crate::watch::{WatchOptions, watch_job};

#[derive(Debug, Args)]
pub struct SubmitCmd {
    /// What to achieve; `@path` names a file of the kernel directory to attach.
    pub goal: String,
    /// Kernel directory, relative to the leader's kernel root.
    #[arg(long = "kernel", short = 'k', env = "MTSWARM_KERNEL")]
    pub kernel: PathBuf,
    /// Slices the job may use, e.g. "backend=emulator,cores>=8" (empty = any).
    #[arg(long, short = 's', env = "MTSWARM_SELECTOR", default_value = "")]
    pub selector: String,
    /// Number of worker agents (0 = the leader decides).
    #[arg(
        long = "agents",
        short = 'n',
        env = "MTSWARM_AGENTS",
        default_value_t = 0
    )]
    pub agents: u32,
    /// Maximum ReAct steps per loop (0 = server default).
    #[arg(long, env = "MTSWARM_MAX_STEPS", default_value_t = 0)]
    pub max_steps: u32,
    /// Maximum model tokens (0 = unlimited).
    #[arg(long, env = "MTSWARM_MAX_TOKENS", default_value_t = 0)]
    pub max_tokens: u64,
    /// Maximum board time in seconds (0 = unlimited).
    #[arg(long, env = "MTSWARM_DEVICE_SECONDS", default_value_t = 0.0)]
    pub device_seconds: f64,
    /// Maximum wall time of the job in seconds (0 = server default).
    #[arg(long, env = "MTSWARM_WALL_TIME", default_value_t = 0)]
    pub wall_time: u64,
    /// OpenAI-compatible model for the agents (absent = builtin policies).
    #[arg(long, env = "MTSWARM_JOB_MODEL")]
    pub model: Option<String>,
    /// Base URL of that model's endpoint (empty = the daemons' MTSWARM_LLM_URL).
    #[arg(long, env = "MTSWARM_JOB_MODEL_URL")]
    pub model_url: Option<String>,
    /// Run medium-risk tools (benchmarks, edits) without asking for approval.
    #[arg(long, env = "MTSWARM_AUTO_APPROVE")]
    pub auto_approve: bool,
    /// Enable the `shell` tool (every call still needs approval).
    #[arg(long, env = "MTSWARM_ALLOW_SHELL")]
    pub allow_shell: bool,
    /// A retried submit with the same key returns the same job.
    #[arg(long, env = "MTSWARM_IDEMPOTENCY_KEY", default_value = "")]
    pub idempotency_key: String,
    /// Follow the job's progress after submitting (like `mtswarm watch`).
    #[arg(long, short = 'w', env = "MTSWARM_WATCH")]
    pub watch: bool,
    /// Never ask about approvals while watching.
    #[arg(long, env = "MTSWARM_NO_PROMPT")]
    pub no_prompt: bool,
    /// JSON output (with --watch: one JSON object per event).
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Args)]
pub struct JobsCmd {
    /// Only jobs in these states (queued, running, succeeded, failed, cancelled).
    #[arg(long = "state", env = "MTSWARM_JOB_STATES", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Show one job in full.
    pub job_id: Option<String>,
    /// JSON output.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Args)]
pub struct FleetCmd {
    /// Only slices matching this selector.
    #[arg(long, short = 's', env = "MTSWARM_SELECTOR", default_value = "")]
    pub selector: String,
    /// JSON output: `{"slices": [...], "workers": [...]}`.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Args)]
pub struct ApprovalsCmd {
    /// Only approvals of this job.
    #[arg(long, env = "MTSWARM_JOB")]
    pub job: Option<String>,
    /// Decided approvals too (default: pending only).
    #[arg(long, env = "MTSWARM_ALL_APPROVALS")]
    pub all: bool,
    /// JSON output.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Args)]
pub struct DecideCmd {
    /// The approval id (see `mtswarm approvals`).
    pub approval_id: String,
    /// Why (recorded with the decision and shown to the agent).
    #[arg(long, short = 'r', env = "MTSWARM_REASON", default_value = "")]
    pub reason: String,
    /// JSON output: the decided approval record.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResultsFormat {
    Table,
    Jsonl,
    Csv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    Ok,
    Failed,
    Cancelled,
}

#[derive(Debug, Args)]
pub struct TasksCmd {
    pub job_id: String,
    /// Only results of this agent.
    #[arg(long, env = "MTSWARM_AGENT")]
    pub agent: Option<String>,
    /// Only results with this status.
    #[arg(long, value_enum, env = "MTSWARM_RESULT_STATUS")]
    pub status: Option<StatusFilter>,
    /// Only the latest attempt of each task (default: every attempt).
    #[arg(long, env = "MTSWARM_LATEST")]
    pub latest: bool,
    /// Wait for the job to finish instead of printing what exists now.
    #[arg(long, env = "MTSWARM_FOLLOW")]
    pub follow: bool,
    /// table for people, jsonl (one JSON object per result) or csv.
    #[arg(long, value_enum, env = "MTSWARM_RESULTS_FORMAT", default_value_t = ResultsFormat::Table)]
    pub format: ResultsFormat,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

pub async fn submit(cmd: SubmitCmd) -> anyhow::Result<ExitCode> {
    if !cmd.device_seconds.is_finite() || cmd.device_seconds < 0.0 {
        bail!("--device-seconds must be a non-negative number");
    }
    let kernel_dir = cmd
        .kernel
        .to_str()
        .context("--kernel must be valid UTF-8")?
        .to_string();
    let model = match (&cmd.model, &cmd.model_url) {
        (None, None) => None,
        (None, Some(_)) => bail!("--model-url needs --model"),
        (Some(model), url) => Some(v1::ModelSettings {
            base_url: url.clone().unwrap_or_default(),
            model: model.clone(),
            temperature: None,
            max_output_tokens: 0,
        }),
    };
    let spec = v1::JobSpec {
        goal: cmd.goal.clone(),
        kernel_dir,
        slice_selector: cmd.selector.clone(),
        budgets: Some(v1::Budgets {
            max_steps: cmd.max_steps,
            max_tokens: cmd.max_tokens,
            device_seconds: cmd.device_seconds,
            wall_time_seconds: cmd.wall_time,
        }),
        num_agents: cmd.agents,
        model,
        auto_approve: cmd.auto_approve,
        allow_shell: cmd.allow_shell,
    };
    let span = tracing::info_span!("mtswarm.submit", kernel = %cmd.kernel.display());
    let _entered = span.enter();
    let mut control = cmd.leader.connect().await?;
    let response = control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: cmd.idempotency_key.clone(),
        })
        .await
        .map_err(|status| rpc_error("submitting the job", &cmd.leader.url(), status))?
        .into_inner();
    if cmd.json && !cmd.watch {
        print_json(&json!({ "job_id": response.job_id }));
    } else if !cmd.json {
        println!("submitted job {}", response.job_id);
    }
    if !cmd.watch {
        return Ok(ExitCode::SUCCESS);
    }
    watch_job(
        &mut control,
        &cmd.leader.url(),
        &response.job_id,
        WatchOptions {
            from_sequence: 0,
            json: cmd.json,
            prompt: !cmd.no_prompt,
        },
    )
    .await
}

pub async fn jobs(cmd: JobsCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    if let Some(job_id) = &cmd.job_id {
        let job = control
            .get_job(v1::GetJobRequest {
                job_id: job_id.clone(),
            })
            .await
            .map_err(|status| rpc_error("getting the job", &cmd.leader.url(), status))?
            .into_inner()
            .job
            .context("the leader answered without a job")?;
        let value = render::job(&job);
        if cmd.json {
            print_json(&value);
        } else {
            print_job_detail(&value);
            for line in render::outcome_lines(job.outcome.as_ref()) {
                println!("{line}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut states = Vec::new();
    for name in &cmd.states {
        let state = render::parse_job_state(name).with_context(|| {
            format!("unknown job state {name:?} (queued, running, succeeded, failed, cancelled)")
        })?;
        states.push(state as i32);
    }
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = control
            .list_jobs(v1::ListJobsRequest {
                states: states.clone(),
                page_size: 0,
                page_token: page_token.clone(),
            })
            .await
            .map_err(|status| rpc_error("listing jobs", &cmd.leader.url(), status))?
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() || page.next_page_token == page_token {
            break;
        }
        page_token = page.next_page_token;
    }
    if cmd.json {
        print_json(&json!({ "jobs": jobs.iter().map(render::job).collect::<Vec<_>>() }));
        return Ok(ExitCode::SUCCESS);
    }
    if jobs.is_empty() {
        println!("no jobs");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<38} {:<10} {:<12} {:>6} {:>7}  GOAL",
        "JOB", "STATE", "KERNEL", "AGENTS", "TASKS"
    );
    for job in &jobs {
        let spec = job.spec.clone().unwrap_or_default();
        println!(
            "{:<38} {:<10} {:<12} {:>6} {:>3}/{:<3}  {}",
            job.job_id,
            render::job_state(job.state()),
            render::truncate(&spec.kernel_dir, 12),
            job.agent_ids.len(),
            job.tasks_done,
            job.tasks_total,
            render::truncate(&spec.goal, 50)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_job_detail(job: &Value) {
    let field = |name: &str| render::compact(&job[name], 200);
    println!("job       {}", field("job_id"));
    println!("state     {}", field("state"));
    println!("goal      {}", field("goal"));
    println!("kernel    {}", field("kernel_dir"));
    if !field("slice_selector").is_empty() {
        println!("selector  {}", field("slice_selector"));
    }
    println!("agents    {}", field("agent_ids"));
    println!("tasks     {}/{}", field("tasks_done"), field("tasks_total"));
    for (label, name) in [
        ("created", "created_at"),
        ("started", "started_at"),
        ("finished", "finished_at"),
    ] {
        if !job[name].is_null() {
            println!("{label:<9} {}", field(name));
        }
    }
    if !field("summary").is_empty() {
        println!("summary   {}", field("summary"));
    }
    if !field("error").is_empty() {
        println!("error     {}", field("error"));
    }
}

pub async fn fleet(cmd: FleetCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let fleet = control
        .list_fleet(v1::ListFleetRequest {
            slice_selector: cmd.selector.clone(),
        })
        .await
        .map_err(|status| rpc_error("listing the fleet", &cmd.leader.url(), status))?
        .into_inner();
    if cmd.json {
        print_json(&json!({
            "slices": fleet.slices.iter().map(render::fleet_slice).collect::<Vec<_>>(),
            "workers": fleet.workers.iter().map(render::worker).collect::<Vec<_>>(),
        }));
        return Ok(ExitCode::SUCCESS);
    }
    if fleet.slices.is_empty() {
        println!("no slices (is a worker daemon running? `mtswarm up` starts some)");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<14} {:<10} {:>5} {:<9} {:<18} {:<12} {:>5}  SESSION",
        "SLICE", "BOARD", "CORES", "BACKEND", "WORKER", "STATE", "LOCK"
    );
    for slice in &fleet.slices {
        let descriptor = slice.slice.clone().unwrap_or_default();
        let session = fleet_detail(slice);
        println!(
            "{:<14} {:<10} {:>5} {:<9} {:<18} {:<12} {:>4.0}%  {}",
            descriptor.slice_id,
            descriptor.board,
            descriptor.cores,
            descriptor.backend,
            slice.worker_id,
            render::slice_state(slice.state()),
            slice.lock_utilization * 100.0,
            render::truncate(&session, 100)
        );
    }
    let count = |state: v1::SliceState| fleet.slices.iter().filter(|s| s.state() == state).count();
    let mut summary = format!(
        "{} slices on {} workers",
        fleet.slices.len(),
        fleet.workers.len()
    );
    for state in [v1::SliceState::Quarantined, v1::SliceState::Offline] {
        let n = count(state);
        if n > 0 {
            summary.push_str(&format!(", {n} {}", render::slice_state(state)));
        }
    }
    println!("{summary}");
    if count(v1::SliceState::Quarantined) > 0 {
        println!("return a quarantined slice to service with: mtswarm quarantine lift SLICE");
    }
    Ok(ExitCode::SUCCESS)
}

/// The last column of `mtswarm fleet`: who runs on a leased slice, why a
/// quarantined one is out of service.
fn fleet_detail(slice: &v1::FleetSlice) -> String {
    if let Some(q) = &slice.quarantine {
        return format!(
            "{} ({} failures in a row, by {})",
            q.reason, q.consecutive_failures, q.by
        );
    }
    if slice.state() == v1::SliceState::Offline {
        return "worker not heartbeating".to_string();
    }
    slice
        .lease
        .as_ref()
        .map(|l| format!("{} ({})", l.session_id, l.job_id))
        .unwrap_or_default()
}

#[derive(Debug, Args)]
pub struct QuarantineListCmd {
    /// JSON output: `{"quarantined": [...]}`.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Args)]
pub struct QuarantineLiftCmd {
    /// The slice, as `mtswarm fleet` shows it (board0-c1; board0/c1 is read the same).
    pub slice_id: String,
    /// Why it may run again (recorded in the leader's log).
    #[arg(long, short = 'r', env = "MTSWARM_REASON", default_value = "")]
    pub reason: String,
    /// JSON output: `{"slice_id", "lifted", "previous"}`.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

#[derive(Debug, Args)]
pub struct CancelCmd {
    pub job_id: String,
    /// Why (recorded as the job's error).
    #[arg(long, short = 'r', env = "MTSWARM_REASON", default_value = "")]
    pub reason: String,
    /// JSON output: `{"job_id", "state"}`.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// `mtswarm cancel JOB`: stops the job's loop and its agents. Exit 0 when
/// the job is CANCELLED now (or was before), 1 when it had already ended
/// otherwise.
pub async fn cancel(cmd: CancelCmd) -> anyhow::Result<ExitCode> {
    let reason = if cmd.reason.trim().is_empty() {
        format!("cancelled by {}", local_identity())
    } else {
        format!("{} (by {})", cmd.reason.trim(), local_identity())
    };
    let mut control = cmd.leader.connect().await?;
    let response = control
        .cancel_job(v1::CancelJobRequest {
            job_id: cmd.job_id.clone(),
            reason,
        })
        .await
        .map_err(|status| rpc_error("cancelling the job", &cmd.leader.url(), status))?
        .into_inner();
    let state = response.state();
    if cmd.json {
        print_json(&json!({"job_id": cmd.job_id, "state": render::job_state(state)}));
    } else if state == v1::JobState::Cancelled {
        println!("job {} cancelled", cmd.job_id);
    } else {
        println!(
            "job {} is {}: not cancelled",
            cmd.job_id,
            render::job_state(state)
        );
    }
    Ok(if state == v1::JobState::Cancelled {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One quarantined slice as `quarantine list --json` prints it.
fn quarantine_entry(slice: &v1::FleetSlice, q: &v1::SliceQuarantine) -> Value {
    let descriptor = slice.slice.clone().unwrap_or_default();
    json!({
        "slice_id": q.slice_id,
        "board": descriptor.board,
        "worker_id": if q.worker_id.is_empty() { slice.worker_id.clone() } else { q.worker_id.clone() },
        "reason": q.reason,
        "consecutive_failures": q.consecutive_failures,
        "since": render::timestamp(q.since.as_ref()),
        "by": q.by,
    })
}

pub async fn quarantine_list(cmd: QuarantineListCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let fleet = control
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .map_err(|status| rpc_error("listing the fleet", &cmd.leader.url(), status))?
        .into_inner();
    let quarantined: Vec<(&v1::FleetSlice, &v1::SliceQuarantine)> = fleet
        .slices
        .iter()
        .filter_map(|s| s.quarantine.as_ref().map(|q| (s, q)))
        .collect();
    if cmd.json {
        print_json(&json!({
            "quarantined": quarantined.iter().map(|(s, q)| quarantine_entry(s, q)).collect::<Vec<_>>(),
        }));
        return Ok(ExitCode::SUCCESS);
    }
    if quarantined.is_empty() {
        println!("no quarantined slices");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<14} {:<18} {:>8} {:<24} {:<18} REASON",
        "SLICE", "WORKER", "FAILURES", "SINCE", "BY"
    );
    for (slice, q) in &quarantined {
        let entry = quarantine_entry(slice, q);
        println!(
            "{:<14} {:<18} {:>8} {:<24} {:<18} {}",
            q.slice_id,
            render::compact(&entry["worker_id"], 18),
            q.consecutive_failures,
            render::compact(&entry["since"], 24),
            render::truncate(&q.by, 18),
            render::truncate(&q.reason, 70)
        );
    }
    println!("return one to service with: mtswarm quarantine lift SLICE --reason \"...\"");
    Ok(ExitCode::SUCCESS)
}

pub async fn quarantine_lift(cmd: QuarantineLiftCmd) -> anyhow::Result<ExitCode> {
    // `board0/c1` and `board0-c1` name the same slice; anything else that
    // is not an id is left for the leader to refuse.
    let slice_id = cmd.slice_id.trim().replace('/', "-");
    if slice_id.is_empty() {
        bail!("name the slice to return to service (see `mtswarm quarantine list`)");
    }
    let reason = if cmd.reason.trim().is_empty() {
        format!("lifted by {}", local_identity())
    } else {
        format!("{} (by {})", cmd.reason.trim(), local_identity())
    };
    let mut control = cmd.leader.connect().await?;
    let response = control
        .lift_quarantine(v1::LiftQuarantineRequest {
            slice_id: slice_id.clone(),
            reason,
        })
        .await
        .map_err(|status| {
            rpc_error(
                &format!("lifting the quarantine of {slice_id}"),
                &cmd.leader.url(),
                status,
            )
        })?
        .into_inner();
    if cmd.json {
        print_json(&json!({
            "slice_id": slice_id,
            "lifted": response.lifted,
            "previous": response.previous.as_ref().map(|q| json!({
                "slice_id": q.slice_id,
                "worker_id": q.worker_id,
                "reason": q.reason,
                "consecutive_failures": q.consecutive_failures,
                "since": render::timestamp(q.since.as_ref()),
                "by": q.by,
            })),
        }));
    } else if let Some(previous) = &response.previous {
        println!(
            "{slice_id} is back in service (was quarantined: {}, {} failures in a row)",
            previous.reason, previous.consecutive_failures
        );
    } else {
        println!("{slice_id} was not quarantined; nothing to do");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn approvals(cmd: ApprovalsCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let states = if cmd.all {
        Vec::new()
    } else {
        vec![v1::ApprovalState::Pending as i32]
    };
    let list = control
        .list_approvals(v1::ListApprovalsRequest {
            job_id: cmd.job.clone().unwrap_or_default(),
            states,
        })
        .await
        .map_err(|status| rpc_error("listing approvals", &cmd.leader.url(), status))?
        .into_inner();
    if cmd.json {
        print_json(&json!({
            "approvals": list.approvals.iter().map(render::approval).collect::<Vec<_>>(),
        }));
        return Ok(ExitCode::SUCCESS);
    }
    if list.approvals.is_empty() {
        println!("no {}approvals", if cmd.all { "" } else { "pending " });
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<38} {:<9} {:<7} {:<14} {:<16} ARGUMENTS",
        "APPROVAL", "STATE", "RISK", "AGENT", "TOOL"
    );
    for record in &list.approvals {
        let value = render::approval(record);
        println!(
            "{:<38} {:<9} {:<7} {:<14} {:<16} {}",
            render::compact(&value["approval_id"], 38),
            render::compact(&value["state"], 9),
            render::compact(&value["risk"], 7),
            render::compact(&value["agent_id"], 14),
            render::compact(&value["tool"], 16),
            render::compact(&value["arguments"], 60)
        );
    }
    println!("decide with: mtswarm approve ID | mtswarm deny ID --reason \"...\"");
    Ok(ExitCode::SUCCESS)
}

pub async fn decide(cmd: DecideCmd, verdict: v1::ApprovalVerdict) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let record = decide_approval(
        &mut control,
        &cmd.leader.url(),
        &cmd.approval_id,
        verdict,
        &cmd.reason,
    )
    .await?;
    if cmd.json {
        print_json(&render::approval(&record));
    } else {
        let request = record.request.clone().unwrap_or_default();
        println!(
            "{} {} ({} of agent {})",
            match verdict {
                v1::ApprovalVerdict::Approve => "approved",
                _ => "denied",
            },
            cmd.approval_id,
            request.tool_name,
            request.agent_id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// DecideApproval with the local identity as the decider.
pub async fn decide_approval(
    control: &mut crate::common::Control,
    leader: &str,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
) -> anyhow::Result<v1::ApprovalRecord> {
    let what = match verdict {
        v1::ApprovalVerdict::Approve => format!("approving {approval_id}"),
        _ => format!("denying {approval_id}"),
    };
    control
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: approval_id.to_string(),
            verdict: verdict as i32,
            reason: reason.to_string(),
            decided_by: local_identity(),
        })
        .await
        .map_err(|status| rpc_error(&what, leader, status))?
        .into_inner()
        .approval
        .context("the leader answered without the approval record")
}

/// How long `tasks` (without `--follow`) waits for more replayed events
/// of a running job before it prints what it has.
const RESULTS_IDLE: Duration = Duration::from_millis(750);

pub async fn tasks(cmd: TasksCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let leader = cmd.leader.url();
    let job = control
        .get_job(v1::GetJobRequest {
            job_id: cmd.job_id.clone(),
        })
        .await
        .map_err(|status| rpc_error("getting the job", &leader, status))?
        .into_inner()
        .job
        .context("the leader answered without a job")?;
    let final_state = matches!(
        job.state(),
        v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
    );
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: cmd.job_id.clone(),
            from_sequence: 0,
        })
        .await
        .map_err(|status| rpc_error("reading the job's events", &leader, status))?
        .into_inner();
    let mut results: Vec<v1::TaskResult> = Vec::new();
    loop {
        // A finished job's stream ends by itself; a running job's stream is
        // read until it goes quiet, unless --follow waits for the end.
        let next = if final_state || cmd.follow {
            stream.next().await
        } else {
            match tokio::time::timeout(RESULTS_IDLE, stream.next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        };
        match next {
            None => break,
            Some(Err(status)) => {
                return Err(rpc_error("reading the job's events", &leader, status));
            }
            Some(Ok(event)) => {
                if let Some(v1::job_event::Event::TaskResult(result)) = event.event {
                    results.push(result);
                }
            }
        }
    }
    let results = filter_results(results, &cmd);
    match cmd.format {
        ResultsFormat::Jsonl => {
            for result in &results {
                println!("{}", render::task_result(result));
            }
        }
        ResultsFormat::Csv => print_csv(&results),
        ResultsFormat::Table => {
            if results.is_empty() {
                println!("no results yet (job is {})", render::job_state(job.state()));
            } else {
                println!(
                    "{:<38} {:>3} {:<14} {:<16} {:<9} SUMMARY",
                    "TASK", "TRY", "AGENT", "SLICE", "STATUS"
                );
                for r in &results {
                    let text = if r.error.is_empty() {
                        &r.summary
                    } else {
                        &r.error
                    };
                    println!(
                        "{:<38} {:>3} {:<14} {:<16} {:<9} {}",
                        r.task_id,
                        r.attempt,
                        render::truncate(&r.agent_id, 14),
                        render::truncate(&r.slice_id, 16),
                        render::task_status(r.status()),
                        render::truncate(text, 70)
                    );
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn filter_results(results: Vec<v1::TaskResult>, cmd: &TasksCmd) -> Vec<v1::TaskResult> {
    let wanted_status = cmd.status.map(|s| match s {
        StatusFilter::Ok => v1::TaskStatus::Ok,
        StatusFilter::Failed => v1::TaskStatus::Failed,
        StatusFilter::Cancelled => v1::TaskStatus::Cancelled,
    });
    let mut kept: Vec<v1::TaskResult> = results
        .into_iter()
        .filter(|r| cmd.agent.as_ref().is_none_or(|a| &r.agent_id == a))
        .filter(|r| wanted_status.is_none_or(|s| r.status() == s))
        .collect();
    if cmd.latest {
        let mut latest: Vec<v1::TaskResult> = Vec::new();
        for result in kept {
            match latest.iter_mut().find(|r| r.task_id == result.task_id) {
                Some(existing) if existing.attempt < result.attempt => *existing = result,
                Some(_) => {}
                None => latest.push(result),
            }
        }
        kept = latest;
    }
    kept
}

/// One CSV field, quoted when it contains a separator, quote or newline.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn print_csv(results: &[v1::TaskResult]) {
    println!(
        "task_id,attempt,agent_id,session_id,worker_id,slice_id,status,summary,error,steps,device_seconds,wall_seconds,finished_at,result_json"
    );
    for r in results {
        let usage = r.usage.unwrap_or_default();
        let fields = [
            r.task_id.clone(),
            r.attempt.to_string(),
            r.agent_id.clone(),
            r.session_id.clone(),
            r.worker_id.clone(),
            r.slice_id.clone(),
            render::task_status(r.status()),
            r.summary.clone(),
            r.error.clone(),
            usage.steps.to_string(),
            usage.device_seconds.to_string(),
            usage.wall_seconds.to_string(),
            render::timestamp(r.finished_at.as_ref()).unwrap_or_default(),
            r.result_json.clone(),
        ];
        let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        println!("{}", line.join(","));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("two\nlines"), "\"two\nlines\"");
    }

    fn result(task: &str, attempt: u32, agent: &str, status: v1::TaskStatus) -> v1::TaskResult {
        v1::TaskResult {
            task_id: task.into(),
            attempt,
            agent_id: agent.into(),
            status: status as i32,
            ..Default::default()
        }
    }

    #[test]
    fn results_filter_by_agent_status_and_latest_attempt() {
        let all = vec![
            result("t1", 1, "a", v1::TaskStatus::Failed),
            result("t1", 2, "a", v1::TaskStatus::Ok),
            result("t2", 1, "b", v1::TaskStatus::Ok),
        ];
        let cmd = |agent: Option<&str>, status: Option<StatusFilter>, latest: bool| TasksCmd {
            job_id: "j".into(),
            agent: agent.map(str::to_string),
            status,
            latest,
            follow: false,
            format: ResultsFormat::Table,
            leader: LeaderArgs::for_url("", 1.0),
        };
        assert_eq!(
            filter_results(all.clone(), &cmd(Some("a"), None, false)).len(),
            2
        );
        assert_eq!(
            filter_results(all.clone(), &cmd(None, Some(StatusFilter::Ok), false)).len(),
            2
        );
        let latest = filter_results(all, &cmd(None, None, true));
        assert_eq!(latest.len(), 2);
        assert_eq!(latest[0].attempt, 2);
    }
}
