//! `mtswarm tasks`: the task results of a job, as a table, JSON lines or CSV.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use mtswarm_proto::v1;
use tokio_stream::StreamExt as _;

use crate::common::{LeaderArgs, rpc_error};
use crate::render;

/// How `mtswarm tasks` prints the results (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResultsFormat {
    /// Aligned columns for people.
    Table,
    /// One JSON object per result, one per line.
    Jsonl,
    /// A header row, then one row per result.
    Csv,
}

/// The task status `mtswarm tasks --status` keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    /// The agent finished its task.
    Ok,
    /// The task failed; the result's error says why.
    Failed,
    /// The task was cancelled before it finished.
    Cancelled,
}

/// Arguments of `mtswarm tasks`: whose results, which ones and in what form.
#[derive(Debug, Args)]
pub struct TasksCmd {
    /// The job whose task results to print.
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
    /// One JSON object `{"count": N, "tasks": [...]}` (instead of --format).
    #[arg(long, env = "MTSWARM_JSON", conflicts_with = "format")]
    pub json: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// How long `tasks` (without `--follow`) waits for more replayed events
/// of a running job before it prints what it has.
const RESULTS_IDLE: Duration = Duration::from_millis(750);

/// `mtswarm tasks JOB`: replays the job's task results (until it goes
/// quiet, or with `--follow` until the job ends), filters and prints them.
pub(crate) async fn tasks(cmd: TasksCmd) -> anyhow::Result<ExitCode> {
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
    if cmd.json {
        let tasks: Vec<serde_json::Value> = results.iter().map(render::task_result).collect();
        println!(
            "{}",
            serde_json::json!({ "count": tasks.len(), "tasks": tasks })
        );
        return Ok(ExitCode::SUCCESS);
    }
    match cmd.format {
        ResultsFormat::Jsonl => {
            for result in &results {
                println!("{}", render::task_result(result));
            }
        }
        ResultsFormat::Csv => write_csv(&results, std::io::stdout().lock())
            .map_err(|e| anyhow::anyhow!("writing CSV: {e}"))?,
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

/// One row of `mtswarm tasks --format csv`, in column order.
#[derive(serde::Serialize)]
struct CsvRow<'a> {
    task_id: &'a str,
    attempt: u32,
    agent_id: &'a str,
    session_id: &'a str,
    worker_id: &'a str,
    slice_id: &'a str,
    status: String,
    summary: &'a str,
    error: &'a str,
    steps: u32,
    device_seconds: f64,
    wall_seconds: f64,
    finished_at: String,
    result_json: &'a str,
}

impl<'a> CsvRow<'a> {
    fn of(result: &'a v1::TaskResult) -> Self {
        let usage = result.usage.clone().unwrap_or_default();
        Self {
            task_id: &result.task_id,
            attempt: result.attempt,
            agent_id: &result.agent_id,
            session_id: &result.session_id,
            worker_id: &result.worker_id,
            slice_id: &result.slice_id,
            status: render::task_status(result.status()),
            summary: &result.summary,
            error: &result.error,
            steps: usage.steps,
            device_seconds: usage.device_seconds,
            wall_seconds: usage.wall_seconds,
            finished_at: render::timestamp(result.finished_at.as_ref()).unwrap_or_default(),
            result_json: &result.result_json,
        }
    }
}

/// The results as CSV (a header, then a row each) on `out`. With no
/// results, the header alone: `serialize` writes it with the first row, so
/// it is taken from a blank row's output.
fn write_csv(results: &[v1::TaskResult], mut out: impl std::io::Write) -> csv::Result<()> {
    if results.is_empty() {
        let blank = v1::TaskResult::default();
        let mut header = csv::Writer::from_writer(Vec::new());
        header.serialize(CsvRow::of(&blank))?;
        let text = header.into_inner().map_err(|e| e.into_error())?;
        let end = text
            .iter()
            .position(|b| *b == b'\n')
            .map_or(text.len(), |i| i + 1);
        out.write_all(&text[..end])?;
        return Ok(());
    }
    let mut writer = csv::Writer::from_writer(out);
    for result in results {
        writer.serialize(CsvRow::of(result))?;
    }
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_fields_that_need_it_and_keeps_the_header_without_rows() {
        let mut tricky = result("t1", 1, "a,1", v1::TaskStatus::Ok);
        tricky.summary = "say \"hi\"\ntwice".into();
        let mut out = Vec::new();
        write_csv(&[tricky], &mut out).expect("csv");
        let text = String::from_utf8(out).expect("utf-8");
        let header = "task_id,attempt,agent_id,session_id,worker_id,slice_id,status,summary,\
                      error,steps,device_seconds,wall_seconds,finished_at,result_json";
        assert_eq!(text.lines().next(), Some(header));
        assert!(
            text.contains("t1,1,\"a,1\",") && text.contains("\"say \"\"hi\"\"\ntwice\""),
            "{text}"
        );
        let mut out = Vec::new();
        write_csv(&[], &mut out).expect("csv");
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            format!("{header}\n")
        );
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
            json: false,
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
