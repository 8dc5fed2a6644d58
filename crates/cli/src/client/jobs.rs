//! `mtswarm jobs` (a list, or one job in detail) and `mtswarm cancel`.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use mtswarm_proto::v1;
use serde_json::{Value, json};

use super::output::{Listing, print_json};
use crate::common::{LeaderArgs, OperatorAction, job_states, list_all_jobs, rpc_error};
use crate::render;

/// Arguments of `mtswarm jobs`: a filtered list, or one job in detail.
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
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// Arguments of `mtswarm cancel`: the job to stop and why.
/// With `--json` it prints `{"job_id", "state"}`.
#[derive(Debug, Args)]
pub struct CancelCmd {
    /// The job to cancel (see `mtswarm jobs`).
    pub job_id: String,
    #[command(flatten)]
    pub action: OperatorAction,
}

/// `mtswarm cancel JOB`: stops the job's loop and its agents. Exit 0 when
/// the job is CANCELLED now (or was before), 1 when it had already ended
/// otherwise.
pub(crate) async fn cancel(cmd: CancelCmd) -> anyhow::Result<ExitCode> {
    let reason = cmd.action.reason.signed("cancelled");
    let mut control = cmd.action.leader.connect().await?;
    let response = control
        .cancel_job(v1::CancelJobRequest {
            job_id: cmd.job_id.clone(),
            reason,
        })
        .await
        .map_err(|status| rpc_error("cancelling the job", &cmd.action.leader.url(), status))?
        .into_inner();
    let state = response.state();
    if cmd.action.json {
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

/// `mtswarm jobs [JOB]`: with a job id, that job in full and its outcome;
/// without, every job (all pages) in the given states. Exit 0 on any answer.
pub(crate) async fn jobs(cmd: JobsCmd) -> anyhow::Result<ExitCode> {
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
    let states = job_states(&cmd.states).map_err(anyhow::Error::msg)?;
    let jobs = list_all_jobs(&mut control, &states)
        .await
        .map_err(|status| rpc_error("listing jobs", &cmd.leader.url(), status))?;
    let listing = Listing {
        items: &jobs,
        json_key: "jobs",
        entry: &render::job,
        empty: "no jobs",
        header: format!(
            "{:<38} {:<10} {:<12} {:>6} {:>7} {:>12}  {:<32}  GOAL",
            "JOB", "STATE", "KERNEL", "AGENTS", "TASKS", "COST", "TRACE"
        ),
        row: &|job| {
            let spec = job.spec.clone().unwrap_or_default();
            format!(
                "{:<38} {:<10} {:<12} {:>6} {:>3}/{:<3} {:>12}  {:<32}  {}",
                job.job_id,
                render::job_state(job.state()),
                render::truncate(&spec.kernel_dir, 12),
                // A listing carries the count; a record of an earlier
                // leader, the ids.
                job.agents_total.max(job.agent_ids.len() as u32),
                job.tasks_done,
                job.tasks_total,
                render::cost_cell(job.outcome.as_ref()),
                mtswarm_telemetry::propagation::trace_id_of(&job.traceparent).unwrap_or("-"),
                render::truncate(&spec.goal, 50)
            )
        },
        footer: None,
    };
    Ok(listing.print(cmd.json))
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
    if !field("trace_id").is_empty() {
        println!("trace     {}", field("trace_id"));
    }
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
