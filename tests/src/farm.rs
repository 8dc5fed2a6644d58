//! A board farm on one machine: a real nats-server, the leader as its own
//! `mtswarm-node leader` process (so its memory and CPU are its own, read
//! from `/proc`), and worker daemon processes that each own one `simulated`
//! board of single-core slices (a run costs a timer, not a CPU), with a
//! synthetic kernel whose tuning space has a known best configuration. The
//! farm bench (`benches/farm.rs`) and the farm tests drive the same stack.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mtswarm_cli::{LeaderProcessArgs, StreamBytes, WorkerProcessArgs};
use mtswarm_hw::board::ModelFigures;
use mtswarm_hw::simulated;
use mtswarm_hw::{ChipSpec, TuneSpace};
use mtswarm_proto::v1;

use crate::chaos::{clean_environment, connect_control};
use crate::process::NodeProcess;
use crate::stack::{Control, READY_TIMEOUT, start_nats_with_fleet};

/// The farm kernel's directory under the farm's kernel root.
pub const FARM_KERNEL: &str = "farm";
/// Problem size of the farm kernel (its `[model]` flops are `2 * N^3`).
const FARM_N: u64 = 256;

/// What to start.
#[derive(Debug, Clone)]
pub struct FarmOptions {
    /// The `mtswarm-node` binary (`node_bin!()`).
    pub node_bin: PathBuf,
    /// Worker daemon processes, one simulated board each.
    pub daemons: usize,
    /// Single-core slices per board.
    pub slices_per_daemon: u32,
    /// `run_ms` of every board: milliseconds per execution, low and high.
    pub run_ms: (u64, u64),
    /// `incorrect_fraction` of every board.
    pub incorrect_fraction: f64,
    /// `noise` of every board.
    pub noise: f64,
    /// Values of each tuning parameter of the farm kernel (`P0`, `P1`, ...):
    /// the space has their product of configurations.
    pub param_values: Vec<usize>,
    /// Extra environment of the leader (e.g. `MTSWARM_MAX_ACTIVE_JOBS`).
    pub leader_env: Vec<(String, String)>,
    /// `MTSWARM_LOG` of every process.
    pub log_level: String,
    /// Extra arguments of every worker (e.g. `--lease-ttl 30`).
    pub worker_args: Vec<String>,
}

/// The running farm; dropping it kills every process and the server.
pub struct FarmStack {
    /// The nats-server.
    pub nats: mtswarm_bus::local_server::NatsServer,
    /// The `mtswarm-node leader` process.
    pub leader: NodeProcess,
    /// gRPC URL of the leader.
    pub leader_url: String,
    /// One `mtswarm-node worker` process per board, in fleet order.
    pub workers: Vec<NodeProcess>,
    /// The farm kernel's directory (for its model's seed).
    pub kernel_dir: PathBuf,
    /// What the farm was started with.
    pub options: FarmOptions,
    dir: tempfile::TempDir,
}

/// fleet.toml of `options`: boards `sim0..`, each `slices_per_daemon`
/// single-core clusters.
pub fn farm_fleet_toml(options: &FarmOptions) -> String {
    let mut text = String::new();
    for index in 0..options.daemons {
        text.push_str(&format!(
            "[[board]]\nid = \"sim{index}\"\nbackend = \"simulated\"\nslicing = \"per-cluster\"\nspec = {{ clusters = {}, cores_per_cluster = 1 }}\nrun_ms = [{}, {}]\nincorrect_fraction = {}\nnoise = {}\n\n",
            options.slices_per_daemon,
            options.run_ms.0,
            options.run_ms.1,
            options.incorrect_fraction,
            options.noise,
        ));
    }
    text
}

/// Writes the farm kernel (trivial sources: nothing compiles them, they seed
/// the figure model) with a tune.toml of `param_values`.
pub fn write_farm_kernel(dir: &Path, param_values: &[usize]) {
    std::fs::create_dir_all(dir).expect("farm kernel dir");
    std::fs::write(
        dir.join("kernel.c"),
        "/* The farm kernel: simulated boards model its figures. */\nvoid farm_kernel(void) {}\n",
    )
    .expect("kernel.c");
    std::fs::write(dir.join("host.c"), "int main(void) { return 0; }\n").expect("host.c");
    let mut tune = format!(
        "kernel = \"farm\"\ntolerance = 0.0\n\n[model]\nflops = \"2 * N * N * N\"\nbytes = \"8 * N\"\n\n[sizes]\nN = {FARM_N}\n"
    );
    for (index, count) in param_values.iter().enumerate() {
        let values: Vec<String> = (1..=*count).map(|v| v.to_string()).collect();
        tune.push_str(&format!(
            "\n[[param]]\nname = \"P{index}\"\nvalues = [{}]\ndefault = 1\n",
            values.join(", ")
        ));
    }
    std::fs::write(dir.join("tune.toml"), tune).expect("tune.toml");
}

impl FarmStack {
    /// Starts nats-server, the leader and the workers (each bounded by
    /// [`READY_TIMEOUT`]). Panics with the failing part's log: test setup.
    pub async fn start(options: FarmOptions) -> FarmStack {
        let (nats, dir, fleet_path) =
            start_nats_with_fleet("mtswarm-farm-", &farm_fleet_toml(&options)).await;
        let kernel_root = dir.path().join("kernels");
        let kernel_dir = kernel_root.join(FARM_KERNEL);
        write_farm_kernel(&kernel_dir, &options.param_values);
        let decision_key =
            mtswarm_auth::generate::decision_key_files(dir.path()).expect("decision key");

        let ready = dir.path().join("leader.ready.json");
        let mut command = Command::new(&options.node_bin);
        command
            .args(
                LeaderProcessArgs {
                    nats_url: nats.url(),
                    listen: "127.0.0.1:0".into(),
                    kernel_root: kernel_root.clone(),
                    ready_file: ready.clone(),
                    stream_bytes: Some(StreamBytes::small()),
                }
                .to_args(),
            )
            .arg("--decision-key-file")
            .arg(&decision_key.seed_file)
            .envs(options.leader_env.iter().map(|(k, v)| (k, v)));
        clean_environment(&mut command);
        command.env("MTSWARM_LOG", &options.log_level);
        let mut leader = NodeProcess::spawn("leader", command).expect("spawn the leader");
        let info = tokio::task::block_in_place(|| leader.wait_ready(&ready, READY_TIMEOUT))
            .unwrap_or_else(|e| panic!("{e}"));

        let mut starting = Vec::new();
        for index in 0..options.daemons {
            let board = format!("sim{index}");
            let ready = dir.path().join(format!("{board}.ready.json"));
            let mut command = Command::new(&options.node_bin);
            command
                .args(
                    WorkerProcessArgs {
                        nats_url: nats.url(),
                        fleet: fleet_path.clone(),
                        board: board.clone(),
                        kernel_root: kernel_root.clone(),
                        workspace_root: dir.path().join("workspaces").join(&board),
                        ready_file: ready.clone(),
                        stream_bytes: Some(StreamBytes::small()),
                    }
                    .to_args(),
                )
                .arg("--leader-public-key-file")
                .arg(&decision_key.public_file)
                .args(&options.worker_args);
            clean_environment(&mut command);
            command.env("MTSWARM_LOG", &options.log_level);
            let process = NodeProcess::spawn(&format!("worker {board}"), command)
                .expect("spawn a worker process");
            starting.push((process, ready));
        }
        let mut workers = Vec::new();
        for (mut process, ready) in starting {
            tokio::task::block_in_place(|| process.wait_ready(&ready, READY_TIMEOUT))
                .unwrap_or_else(|e| panic!("{e}"));
            workers.push(process);
        }
        FarmStack {
            nats,
            leader,
            leader_url: info.grpc,
            workers,
            kernel_dir,
            options,
            dir,
        }
    }

    /// A directory living as long as the farm.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Slices of the whole farm.
    pub fn slices(&self) -> usize {
        self.options.daemons * self.options.slices_per_daemon as usize
    }

    /// A fresh Control client to the leader.
    pub async fn control(&self) -> Control {
        connect_control(&self.leader_url).await
    }

    /// Waits until every slice of the farm is free.
    pub async fn wait_for_all_slices(&self, timeout: Duration) -> v1::ListFleetResponse {
        crate::stack::wait_for_free_slices(
            &mut self.control().await,
            self.slices(),
            timeout,
            || self.logs(),
        )
        .await
    }

    /// The tail of every log, for assertion messages.
    pub fn logs(&self) -> String {
        let mut text = format!(
            "--- leader ---\n{}\n",
            crate::chaos::tail(&self.leader.stderr(), 80)
        );
        for worker in &self.workers {
            text.push_str(&format!(
                "--- {} ---\n{}\n",
                worker.name(),
                crate::chaos::tail(&worker.stderr(), 20)
            ));
        }
        text
    }

    /// The farm kernel's configurations and what the simulated boards'
    /// model says of each: GFLOP/s on one core, and whether it answers
    /// wrongly.
    pub fn model_truth(&self) -> Vec<(BTreeMap<String, String>, f64, bool)> {
        let spec = ChipSpec::default();
        let space = TuneSpace::load(&self.kernel_dir).expect("farm tune.toml");
        let seed = simulated::source_seed(&self.kernel_dir).expect("farm kernel seed");
        space
            .configurations(&spec)
            .expect("farm configurations")
            .into_iter()
            .map(|config| {
                let config: BTreeMap<String, String> = config
                    .iter()
                    .map(|(name, value)| (name.clone(), value.to_string()))
                    .collect();
                let figures = ModelFigures {
                    flops: 2.0 * (FARM_N as f64).powi(3),
                    bytes: 8.0 * FARM_N as f64,
                };
                let gflops = simulated::modeled_gflops(&spec, &seed, &config, Some(figures), 1);
                let wrong = simulated::is_incorrect(&config, self.options.incorrect_fraction);
                (config, gflops, wrong)
            })
            .collect()
    }
}

/// A job over the farm kernel with `num_agents` agents, auto-approved.
pub fn farm_job(num_agents: u32, wall_time_seconds: u64) -> v1::JobSpec {
    let mut spec = crate::jobs::job_spec(
        "Tune the farm kernel over its whole space.",
        FARM_KERNEL,
        num_agents,
        true,
    );
    if let Some(budgets) = spec.budgets.as_mut() {
        budgets.wall_time_seconds = wall_time_seconds;
        // The whole space: the farm checks that every configuration is
        // measured once and the model's best found.
        budgets.max_evaluations = u32::MAX;
    }
    spec
}

/// One process's figures from `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessFigures {
    /// Resident set now, bytes (`VmRSS`).
    pub rss_bytes: u64,
    /// Peak resident set, bytes (`VmHWM`).
    pub peak_rss_bytes: u64,
    /// User plus system CPU time so far, seconds.
    pub cpu_seconds: f64,
}

/// `pid`'s memory and CPU time (zeros where `/proc` does not say).
pub fn process_figures(pid: u32) -> ProcessFigures {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in parentheses:
    // utime and stime are the 14th and 15th fields of the line.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ProcessFigures {
        rss_bytes: kib("VmRSS:"),
        peak_rss_bytes: kib("VmHWM:"),
        cpu_seconds: (ticks(11) + ticks(12)) as f64 / hz,
    }
}

/// Polls ListJobs until `job_id` is final, at most `timeout`, printing its
/// tasks done every `progress` (when given); returns its record (GetJob).
pub async fn wait_for_job(
    control: &mut Control,
    job_id: &str,
    timeout: Duration,
    progress: Option<Duration>,
    context: impl Fn() -> String,
) -> v1::JobRecord {
    let started = tokio::time::Instant::now();
    let mut last_print = started;
    loop {
        let record = crate::jobs::list_all_jobs(control)
            .await
            .into_iter()
            .find(|j| j.job_id == job_id)
            .unwrap_or_else(|| panic!("job {job_id} is not listed"));
        if crate::jobs::is_final(record.state()) {
            return crate::jobs::get_job(control, job_id).await;
        }
        if let Some(every) = progress
            && last_print.elapsed() >= every
        {
            last_print = tokio::time::Instant::now();
            eprintln!(
                "farm: {:>6.1} s  {:?}  agents {}  tasks {}/{}",
                started.elapsed().as_secs_f64(),
                record.state(),
                record.agents_total,
                record.tasks_done,
                record.tasks_total
            );
        }
        assert!(
            started.elapsed() < timeout,
            "job {job_id} not final within {timeout:?} ({:?}, tasks {}/{})\n{}",
            record.state(),
            record.tasks_done,
            record.tasks_total,
            context()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
