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
mod summary;
mod utilization;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressDrawTarget};
use mtswarm_bus::Bus;
use mtswarm_bus::local_server::NatsServer;
use mtswarm_bus::results::{ResultQuery, ResultRecord, ResultsStore};
use mtswarm_hw::fleet::Fleet;
use mtswarm_hw::{ChipSpec, TuneSpace};
use mtswarm_proto::v1;
use mtswarm_proto::v1::job_event::Event;
use mtswarm_worker::bus_slice_id;
use tokio_stream::StreamExt as _;

use crate::common::{Control, LeaderArgs, TelemetryArgs, rpc_error};
use crate::credentials::Deployment;
use crate::daemons::stop_requested;
use crate::metrics::DaemonMetrics;
use baseline::measure_baseline;
use kernel::{TUNE_FILE, fleet_toml, prepare_kernel};
use mtswarm_auth::generate;
use progress::{JobObservation, View, observe, task_finished};
use stack::{Started, start_stack};
use summary::Finished;

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
pub(crate) const DEMO_SEARCH_SHARE: f64 = 0.05;

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
pub(crate) async fn demo(cmd: DemoCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
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

/// The demo's stages, in order: the kernel and fleet, the stack (with the
/// baseline measured meanwhile), the job submitted and followed to its end,
/// its records, then the report and the summary.
async fn run(
    cmd: &DemoCmd,
    state: &Path,
    stack: &mut Started,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let spec = ChipSpec::default();
    let plan = DemoPlan::prepare(cmd, state, &spec)?;
    // The baseline overlaps with the stack's startup.
    stack.baseline = Some(tokio::spawn(measure_baseline(
        plan.kernel_root.join(&plan.kernel),
        plan.space.clone(),
        state.join("baseline-build"),
    )));
    let (leader_url, deployment) = start_stack(
        cmd,
        state,
        &plan.kernel_root,
        &plan.fleet_path,
        &plan.fleet,
        stack,
    )
    .await?;
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
    let job_id = submit_job(&mut control, &leader_url, cmd, &plan).await?;
    let seen = follow_job(&mut control, &leader_url, cmd, &job_id).await?;
    let job = succeeded_job(&mut control, &leader_url, &job_id).await?;

    let baseline = stack
        .baseline
        .take()
        .context("the baseline measurement was not started")?
        .await
        .context("the baseline measurement stopped")??;
    let expected: u64 = seen.agents.values().map(|a| a.benchmarked).sum();
    let records = job_records(&deployment, &nats_url, &job_id, expected).await?;
    let finished = Finished {
        job_id,
        job,
        records,
        seen,
        baseline,
    };
    summary::report(cmd, &plan, &spec, &finished, started)
}

/// What the demo tunes and where: the kernel (copied, its space reduced as
/// asked) and the emulated fleet.
struct DemoPlan {
    kernel_root: PathBuf,
    kernel: String,
    space: TuneSpace,
    fleet_path: PathBuf,
    fleet: Fleet,
    /// The fleet's slices in the bus form (`board0-c0`) that agents,
    /// records and the fleet listing use.
    slices: Vec<String>,
    /// Configurations of the space.
    candidates: usize,
}

impl DemoPlan {
    /// Prepare the kernel and write the fleet under `state`; say what the
    /// demo tunes.
    fn prepare(cmd: &DemoCmd, state: &Path, spec: &ChipSpec) -> anyhow::Result<Self> {
        let (kernel_root, kernel, space) = prepare_kernel(cmd, state)?;
        let fleet_path = state.join("fleet.toml");
        std::fs::write(&fleet_path, fleet_toml(cmd.boards, cmd.clusters, spec)?)
            .context("writing the demo fleet")?;
        let fleet = Fleet::load(&fleet_path).context("loading the demo fleet")?;
        // One spelling everywhere: the bus form (`board0-c0`) that agents,
        // records and the fleet listing use.
        let slices: Vec<String> = fleet.slices().iter().map(bus_slice_id).collect();
        let candidates = space.configurations(spec)?.len();
        if !cmd.json {
            println!(
                "mtswarm demo: tuning {kernel} ({candidates} configurations) on {} boards x {} clusters = {} slices",
                cmd.boards,
                cmd.clusters,
                slices.len()
            );
        }
        Ok(Self {
            kernel_root,
            kernel,
            space,
            fleet_path,
            fleet,
            slices,
            candidates,
        })
    }
}

/// Submit the tuning job (auto-approved, within the demo's budgets); its id.
async fn submit_job(
    control: &mut Control,
    leader_url: &str,
    cmd: &DemoCmd,
    plan: &DemoPlan,
) -> anyhow::Result<String> {
    let kernel = &plan.kernel;
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
            max_evaluations: demo_budget(cmd.max_evaluations, plan.candidates),
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
        .map_err(|status| rpc_error("submitting the job", leader_url, status))?
        .into_inner()
        .job_id;
    if !cmd.json {
        println!("submitted job {job_id}");
    }
    Ok(job_id)
}

/// Follow the job's events live, per agent, until its stream ends (or
/// `--timeout`); what they showed.
async fn follow_job(
    control: &mut Control,
    leader_url: &str,
    cmd: &DemoCmd,
    job_id: &str,
) -> anyhow::Result<JobObservation> {
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
            job_id: job_id.to_owned(),
            from_sequence: 0,
        })
        .await
        .map_err(|status| rpc_error("watching the job", leader_url, status))?
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
        let event = item.map_err(|status| rpc_error("watching the job", leader_url, status))?;
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
    Ok(seen)
}

/// The job's final record, or why it did not succeed.
async fn succeeded_job(
    control: &mut Control,
    leader_url: &str,
    job_id: &str,
) -> anyhow::Result<v1::JobRecord> {
    let job = control
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_owned(),
        })
        .await
        .map_err(|status| rpc_error("getting the job", leader_url, status))?
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
    Ok(job)
}

/// Every benchmark of the job, from the results store: waits (at most
/// [`RESULTS_SETTLE`]) for the `expected` records the agents reported.
async fn job_records(
    deployment: &Deployment,
    nats_url: &str,
    job_id: &str,
    expected: u64,
) -> anyhow::Result<Vec<ResultRecord>> {
    let bus =
        Bus::connect(deployment.bus_config(nats_url, generate::NATS_LEADER, "mtswarm-demo")?)
            .await
            .context("connecting to NATS for the results")?;
    let store = ResultsStore::open(&bus).await?;
    let query = ResultQuery {
        job_id: Some(job_id.to_owned()),
        limit: 100_000,
        ..ResultQuery::default()
    };
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
    Ok(records)
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
