//! `mtswarm demo`: the whole system in one command, for a first look and for
//! measuring it end to end. It starts a private stack (a real `nats-server`
//! with JetStream in a temporary directory, the leader and one worker daemon
//! per emulated board, both in-process), submits a tuning job for a kernel
//! (the builtin policies tune it over its tune.toml space unless a model
//! endpoint is given), follows it live per agent, measures the naive
//! baseline, and ends with a summary table and an HTML report with plots.
//!
//! The builtin leader policy only submits configurations of the tuning
//! space, and the tune.toml `baseline` (the naive kernel) is outside it, so
//! the baseline is measured here directly on an emulator board with the
//! same measurement method the workers use; the output says so.
//!
//! Per-slice utilization is the share of the slice's *tuning phase* during
//! which its hardware lock was held. The tuning phase of a slice runs from
//! the first time one of its hardware calls acquired the slice lock to the
//! last time one released it; the set-up before it (stack start, task
//! assignment, reading and analysing the kernel, the first compile) and
//! the answer after it are not part of it, and each slice has its own. Each
//! hardware tool result in the job's events carries its duration and the
//! time it waited for the lock, so the lock was held for the difference,
//! ending when the result was emitted. The table, the JSON
//! `slice_utilization` (0..1 per slice) and `tuning_phase_seconds` report
//! it; the builtin worker policy builds the next candidates in the
//! background so the slice does not wait for the compiler, and emulated
//! launches yield the host CPU to those builds (on a real farm the board
//! does not share the build host's CPU; see
//! `mtswarm_hw::emulator::EMULATED_LAUNCH_NICENESS`).
//!
//! Everything started here is stopped on exit and on Ctrl-C / SIGTERM:
//! workers first (leases released), then the leader, then nats-server, and

mod baseline;
mod kernel;
mod progress;
mod stack;
mod utilization;

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressDrawTarget};
use mtswarm_bus::Bus;
use mtswarm_bus::local_server::NatsServer;
use mtswarm_bus::results::{ResultQuery, ResultsStore};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::fleet::Fleet;
use mtswarm_proto::v1;
use mtswarm_proto::v1::job_event::Event;
use mtswarm_report::BusyInterval;
use mtswarm_worker::bus_slice_id;
use serde_json::json;
use tokio_stream::StreamExt as _;

use crate::common::{LeaderArgs, TelemetryArgs, rpc_error};
use crate::daemons::stop_requested;
use crate::metrics::DaemonMetrics;
use baseline::measure_baseline;
use kernel::{TUNE_FILE, fleet_toml, prepare_kernel};
use mtswarm_auth::generate;
use progress::{JobObservation, View, observe, task_finished};
use stack::{Started, start_stack};
pub use utilization::UTILIZATION_DEFINITION;
use utilization::{phase_utilization, tuning_phases};

/// How long the results store may take to show the job's last records.
const RESULTS_SETTLE: Duration = Duration::from_secs(10);

/// Arguments of `mtswarm demo`: the kernel, the private stack's size and
/// where the report goes.
#[derive(Debug, Args)]
pub struct DemoCmd {
    /// Kernel directory to tune (kernel.c, host.c, tune.toml).
    #[arg(
        long,
        env = "MTSWARM_DEMO_KERNEL",
        default_value = "examples/kernels/dgemm_gsm"
    )]
    pub kernel: PathBuf,
    /// Emulated boards in the local fleet.
    #[arg(long, env = "MTSWARM_DEMO_BOARDS", default_value_t = 2)]
    pub boards: u32,
    /// Clusters (slices) per board.
    #[arg(long, env = "MTSWARM_DEMO_CLUSTERS", default_value_t = 4)]
    pub clusters: u32,
    /// `-D NAME=VALUE`: override a tune.toml size, or pin a parameter to one value.
    #[arg(
        short = 'D',
        long = "define",
        env = "MTSWARM_DEMO_DEFINES",
        value_delimiter = ','
    )]
    pub defines: Vec<String>,
    /// Shrink the tuning space to at most this many configurations by
    /// pinning parameters to their defaults (last parameter first).
    #[arg(long, env = "MTSWARM_DEMO_MAX_CANDIDATES")]
    pub max_candidates: Option<usize>,
    /// Where to write the HTML report (default: `mtswarm-demo-<job>.html` here).
    #[arg(long, env = "MTSWARM_DEMO_REPORT")]
    pub report: Option<PathBuf>,
    /// Candidate evaluations of the whole job, shared by its agents (0 = a
    /// twentieth of the tuning space, at least 32: half a job's default, so
    /// the demo stays within minutes on a 2-core machine).
    #[arg(long, env = "MTSWARM_DEMO_MAX_EVALUATIONS", default_value_t = 0)]
    pub max_evaluations: u32,
    /// Give up on the job after this many seconds.
    #[arg(long, env = "MTSWARM_DEMO_TIMEOUT", default_value_t = 900)]
    pub timeout: u64,
    /// OpenAI-compatible endpoint to drive the agents (absent = builtin policies).
    #[arg(long, env = "MTSWARM_LLM_URL")]
    pub llm_url: Option<String>,
    /// Model name at that endpoint (`--model` is the same flag).
    #[arg(long, visible_alias = "model", env = "MTSWARM_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// API key of the endpoint (prefer the environment variable: flags show in `ps`).
    #[arg(
        long,
        alias = "api-key",
        env = "MTSWARM_LLM_API_KEY",
        hide_env_values = true
    )]
    pub llm_api_key: Option<String>,
    /// Print one JSON object (progress goes to stderr).
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Serve the stack's Prometheus metrics (leader and workers, one
    /// process) on http://127.0.0.1:PORT/metrics while the demo runs
    /// (0 = a free port).
    #[arg(long, env = "MTSWARM_METRICS_PORT", default_value_t = crate::up::DEFAULT_METRICS_PORT)]
    pub metrics_port: u16,
    /// Measure with one validated execution on the emulator, whose modeled
    /// cycles are exact (spot re-runs check them); `false` measures it like
    /// a real board (warm-up, repeats), for comparisons.
    #[arg(long, env = "MTSWARM_DEMO_EXACT_TIMING", default_value_t = true, action = clap::ArgAction::Set)]
    pub exact_timing: bool,
}

/// Share of the tuning space the demo evaluates unless told: on the
/// emulator one `dgemm_gsm` candidate costs about 4.8 s of host CPU (its
/// build, one validated execution of about 2.1 s, and the spot re-runs of
/// every new best and of one other in four), and a 2-core machine runs the
/// eight agents' candidates two at a time.
pub const DEMO_SEARCH_SHARE: f64 = 0.05;

/// The job's evaluation budget: `asked`, else [`DEMO_SEARCH_SHARE`] of the
/// space's `configurations` (at least the job default's floor, at most all).
fn demo_budget(asked: u32, configurations: usize) -> u32 {
    if asked > 0 {
        return asked;
    }
    let share = (configurations as f64 * DEMO_SEARCH_SHARE).floor() as usize;
    let budget = share
        .max(mtswarm_policy::MIN_SEARCH_EVALUATIONS)
        .min(configurations);
    u32::try_from(budget).unwrap_or(u32::MAX)
}

/// `mtswarm demo`: runs the whole demo in a temporary directory and stops
/// the private stack however it ends (exit 130 on SIGINT/SIGTERM).
pub async fn demo(cmd: DemoCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let metrics = serve_metrics(&cmd, telemetry).await;
    let state = tempfile::Builder::new()
        .prefix("mtswarm-demo-")
        .tempdir()
        .context("creating the demo's temporary directory")?;
    let mut stack = Started::new();
    let outcome = tokio::select! {
        result = run(&cmd, state.path(), &mut stack, started) => result,
        signal = stop_requested() => {
            eprintln!("mtswarm demo: {signal}; stopping workers, leader and NATS");
            Ok(ExitCode::from(130))
        }
    };
    stack.stop().await;
    metrics.shutdown().await;
    drop(state);
    outcome
}

/// The demo's metrics endpoint, said where it is; a port in use costs the
/// endpoint (with a note), never the demo.
async fn serve_metrics(cmd: &DemoCmd, telemetry: &TelemetryArgs) -> DaemonMetrics {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], cmd.metrics_port));
    match DaemonMetrics::start(telemetry, "mtswarm-demo", Some(addr)).await {
        Ok(metrics) => {
            if let Some(url) = metrics.url() {
                let line = format!("mtswarm demo: Prometheus metrics on {url}");
                if cmd.json {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                }
            }
            metrics
        }
        Err(error) => {
            eprintln!(
                "mtswarm demo: no metrics endpoint ({error:#}); pass --metrics-port 0 for a free port"
            );
            DaemonMetrics::default()
        }
    }
}

async fn run(
    cmd: &DemoCmd,
    state: &Path,
    stack: &mut Started,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let spec = ChipSpec::default();
    let (kernel_root, kernel, space) = prepare_kernel(cmd, state)?;
    let fleet_path = state.join("fleet.toml");
    std::fs::write(&fleet_path, fleet_toml(cmd.boards, cmd.clusters, &spec)?)
        .context("writing the demo fleet")?;
    let fleet = Fleet::load(&fleet_path).context("loading the demo fleet")?;
    // One spelling everywhere: the bus form (`board0-c0`) that agents,
    // records and the fleet listing use.
    let slices: Vec<String> = fleet.slices().iter().map(bus_slice_id).collect();
    let candidates = space.configurations(&spec)?.len();
    if !cmd.json {
        println!(
            "mtswarm demo: tuning {kernel} ({candidates} configurations) on {} boards x {} clusters = {} slices",
            cmd.boards,
            cmd.clusters,
            slices.len()
        );
    }

    // The baseline overlaps with the stack's startup.
    stack.baseline = Some(tokio::spawn(measure_baseline(
        kernel_root.join(&kernel),
        space.clone(),
        state.join("baseline-build"),
    )));
    let (leader_url, deployment) =
        start_stack(cmd, state, &kernel_root, &fleet_path, &fleet, stack).await?;
    let nats_url = stack
        .stack
        .nats
        .as_ref()
        .map(NatsServer::url)
        .context("nats-server is not running")?;

    let mut leader = LeaderArgs::for_url(leader_url.clone(), 10.0);
    leader.token_file = deployment.grpc.token_file("admin").map(Path::to_path_buf);
    leader.tls_ca = Some(deployment.grpc.ca_file.clone());
    let mut control = leader.connect().await?;
    let job_spec = v1::JobSpec {
        goal: format!(
            "Tune the {kernel} kernel for the highest GFLOPS over its {TUNE_FILE} space."
        ),
        kernel_dir: kernel.clone(),
        slice_selector: String::new(),
        budgets: Some(v1::Budgets {
            max_steps: 0,
            max_tokens: 0,
            device_seconds: 0.0,
            wall_time_seconds: cmd.timeout,
            max_evaluations: demo_budget(cmd.max_evaluations, candidates),
        }),
        num_agents: 0,
        model: None,
        auto_approve: true,
        allow_shell: false,
        approval_rules: Vec::new(),
    };
    let job_id = control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(job_spec),
            idempotency_key: String::new(),
        })
        .await
        .map_err(|status| rpc_error("submitting the job", &leader_url, status))?
        .into_inner()
        .job_id;
    if !cmd.json {
        println!("submitted job {job_id}");
    }

    let bars = !cmd.json && std::io::stdout().is_terminal();
    let view = View {
        multi: MultiProgress::with_draw_target(if bars {
            ProgressDrawTarget::stdout()
        } else {
            ProgressDrawTarget::hidden()
        }),
        bars,
        plain_to_stderr: cmd.json,
    };
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.clone(),
            from_sequence: 0,
        })
        .await
        .map_err(|status| rpc_error("watching the job", &leader_url, status))?
        .into_inner();
    let mut seen = JobObservation::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(cmd.timeout);
    loop {
        let item = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(item)) => item,
            Ok(None) => break,
            Err(_) => bail!(
                "job {job_id} did not finish within {} s (--timeout)",
                cmd.timeout
            ),
        };
        let event = item.map_err(|status| rpc_error("watching the job", &leader_url, status))?;
        match &event.event {
            Some(Event::AgentEvent(agent_event)) => observe(agent_event, &mut seen, &view),
            Some(Event::TaskResult(result)) => task_finished(result, &mut seen, &view),
            _ => {}
        }
    }
    for progress in seen.agents.values() {
        if let Some(bar) = &progress.bar {
            bar.finish();
        }
    }
    let job = control
        .get_job(v1::GetJobRequest {
            job_id: job_id.clone(),
        })
        .await
        .map_err(|status| rpc_error("getting the job", &leader_url, status))?
        .into_inner()
        .job
        .unwrap_or_default();
    if job.state() != v1::JobState::Succeeded {
        bail!(
            "job {job_id} ended {}: {}",
            crate::render::job_state(job.state()),
            if job.error.is_empty() {
                &job.summary
            } else {
                &job.error
            }
        );
    }

    let baseline = stack
        .baseline
        .take()
        .context("the baseline measurement was not started")?
        .await
        .context("the baseline measurement stopped")??;

    // Every benchmark of the job, from the results store.
    let bus =
        Bus::connect(deployment.bus_config(&nats_url, generate::NATS_LEADER, "mtswarm-demo")?)
            .await
            .context("connecting to NATS for the results")?;
    let store = ResultsStore::open(&bus).await?;
    let query = ResultQuery {
        job_id: Some(job_id.clone()),
        limit: 100_000,
        ..ResultQuery::default()
    };
    let expected: u64 = seen.agents.values().map(|a| a.benchmarked).sum();
    let settle = Instant::now() + RESULTS_SETTLE;
    let records = loop {
        let records = store.query(&query).await?;
        if records.len() as u64 >= expected || Instant::now() >= settle {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if let Err(error) = bus.drain().await {
        tracing::debug!(%error, "closing the results connection");
    }
    // The same report `mtswarm report JOB` writes, with the demo's own
    // baseline and the slices' busy intervals from the job's events.
    let mut report = crate::report::job_report(&job, &records, Some(baseline.baseline.clone()));
    report.with_kernel_model(&space, &spec);
    for slice in &slices {
        report.slice_utilization.entry(slice.clone()).or_insert(0.0);
    }
    let mut phases: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    if !seen.busy.is_empty() {
        // The lock-holding intervals of every hardware tool (compile
        // included when it takes the lock).
        let first_busy = seen
            .busy
            .iter()
            .map(|b| b.start_ms)
            .min()
            .unwrap_or_default();
        let start = seen
            .first_assignment_ms
            .map_or(first_busy, |a| a.min(first_busy));
        let end = seen
            .last_result_ms
            .unwrap_or_else(|| seen.busy.iter().map(|b| b.end_ms).max().unwrap_or(start));
        report.busy = seen
            .busy
            .iter()
            .map(|interval| BusyInterval {
                slice: mtswarm_bus::results::canonical_slice_id(&interval.slice),
                ..interval.clone()
            })
            .collect();
        // The timeline spans the whole job; utilization is per slice, over
        // its own tuning phase.
        report.started_at_ms = start;
        report.finished_at_ms = end;
        phases = tuning_phases(&report.busy);
        let mut utilization = phase_utilization(&report.busy, &phases);
        for slice in &slices {
            utilization.entry(slice.clone()).or_insert(0.0);
        }
        report.slice_utilization = utilization;
    }
    let phase_seconds: BTreeMap<&str, f64> = phases
        .iter()
        .map(|(slice, (from, to))| (slice.as_str(), to.saturating_sub(*from) as f64 / 1000.0))
        .collect();
    let lowest = report
        .slice_utilization
        .iter()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(slice, share)| (slice.clone(), *share));
    let mean_utilization = if report.slice_utilization.is_empty() {
        0.0
    } else {
        report.slice_utilization.values().sum::<f64>() / report.slice_utilization.len() as f64
    };
    // Evaluated, benchmarked and valid come from the records (one per
    // candidate and status), as in `mtswarm report`.
    let assigned: u64 = seen.agents.values().map(|a| a.assigned).sum();
    let Some(best) = report.best.clone() else {
        bail!(
            "job {job_id} recorded {} candidate record(s) but none was a valid benchmark",
            records.len()
        );
    };

    let report_path = match &cmd.report {
        Some(path) => path.clone(),
        None => std::env::current_dir()
            .context("locating the current directory")?
            .join(format!("mtswarm-demo-{job_id}.html")),
    };
    let report_path = report.write_html(&report_path)?;
    let report_path = report_path.canonicalize().unwrap_or(report_path);
    let summary = report.summary(Some(&report_path));
    let elapsed = started.elapsed().as_secs_f64();
    let to_best = time_to_best(&records, Some(&best.params), started);
    let to_first = time_to_best(&records, None, started);

    if cmd.json {
        let mut value = serde_json::to_value(&summary)?;
        value["elapsed_seconds"] = json!(elapsed);
        value["time_to_best_seconds"] = json!(to_best);
        value["time_to_first_result_seconds"] = json!(to_first);
        // What the job cost in model terms (leader and agents together).
        value["usage"] = json!(job.usage.as_ref().map(|u| json!({
            "steps": u.steps,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
        })));
        value["baseline_source"] = json!(baseline.source);
        value["slices"] = json!(slices);
        value["candidates_assigned"] = json!(assigned);
        value["tuning_phase_seconds"] = json!(phase_seconds);
        value["utilization_definition"] = json!(UTILIZATION_DEFINITION);
        println!("{value}");
    } else {
        println!();
        println!("{}", report.render_terminal());
        println!(
            "best: {} -> {:.1} GFLOPS ({:.1} % of peak) on {}{}",
            mtswarm_report::params_label(&best.params),
            best.gflops,
            best.peak_fraction.unwrap_or_default() * 100.0,
            best.slice,
            if best.reproduced {
                ", reproduced by a spot re-run"
            } else {
                ""
            }
        );
        if let Some(speedup) = summary.speedup_over_naive {
            println!(
                "speedup over the naive kernel: {speedup:.1}x (baseline {:.2} GFLOPS; {})",
                baseline.baseline.gflops, baseline.source
            );
        }
        println!(
            "candidates: {assigned} assigned, {} (evaluated: any record; benchmarked: timed run; valid: right answer, unflagged)",
            report.counts_line()
        );
        if let Some((slice, share)) = &lowest {
            println!(
                "slice utilization ({UTILIZATION_DEFINITION}): lowest {:.1} % ({slice}), mean {:.1} %",
                share * 100.0,
                mean_utilization * 100.0
            );
        }
        if let Some(seconds) = to_best {
            println!(
                "best found {} after the demo started",
                mtswarm_report::units::wall_time(seconds)
            );
        }
        println!("HTML report: {}", report_path.display());
        println!(
            "demo finished in {}",
            mtswarm_report::units::wall_time(elapsed)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Seconds from `started` (the demo's start) to the first trustworthy
/// record of the best parameters: when the system had its answer, which a
/// side-by-side comparison with a sweep needs (the job itself goes on to
/// confirm it and to rule the rest out). With `best` `None`, to the first
/// trustworthy record of any candidate (what starting up cost).
fn time_to_best(
    records: &[mtswarm_bus::results::ResultRecord],
    best: Option<&BTreeMap<String, String>>,
    started: Instant,
) -> Option<f64> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    let start_ms = u64::try_from(now_ms.saturating_sub(started.elapsed().as_millis())).ok()?;
    records
        .iter()
        .filter(|r| !r.baseline && r.trustworthy() && best.is_none_or(|b| &r.params == b))
        .map(|r| r.timestamp_ms)
        .min()
        .map(|ms| ms.saturating_sub(start_ms) as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_evaluates_a_twentieth_of_a_large_space_unless_told() {
        assert_eq!(demo_budget(0, 2205), 110);
        assert_eq!(demo_budget(0, 112), 32);
        assert_eq!(demo_budget(0, 4), 4);
        assert_eq!(demo_budget(500, 2205), 500);
    }
}
