//! `mtswarm up`: a whole local stack in one command, for trying mtswarm on a
//! laptop and for end-to-end tests. It starts `nats-server` from PATH with
//! JetStream on a temporary store (unless `--nats URL` names a running
//! one; its stream size limits fitted to that store's disk), the leader, and one worker daemon per board of the fleet file
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

use crate::common::{TelemetryArgs, write_atomically};
use crate::daemons::stop_requested;
use crate::local_stack::LocalStack;
use mtswarm_auth::{ClientConfig, ClientProfile};

mod start;
mod stream_limits;

use start::start_stack;

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
pub(crate) fn metrics_addr(base: u16, index: usize) -> String {
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
    /// Size limit of the agent events stream and of the job journal,
    /// bytes (default: the daemons' 1 GiB, shrunk to fit the disk of a
    /// nats-server started here).
    #[arg(long, env = "MTSWARM_NATS_EVENTS_MAX_BYTES")]
    pub nats_events_max_bytes: Option<i64>,
    /// Size limit of the measurements stream, bytes (default: the
    /// daemons' 4 GiB, shrunk to fit the disk of a nats-server started
    /// here).
    #[arg(long, env = "MTSWARM_NATS_MEASUREMENTS_MAX_BYTES")]
    pub nats_measurements_max_bytes: Option<i64>,
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
pub(crate) async fn up(cmd: UpCmd, telemetry: &TelemetryArgs) -> anyhow::Result<ExitCode> {
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
    let limits = &endpoints["stream_limits"];
    if limits["fitted_to_disk"].as_bool() == Some(true) {
        println!(
            "  streams:        events {} MiB, measurements {} MiB (shrunk to fit the free disk of the NATS store)",
            limits["events_max_bytes"].as_i64().unwrap_or(0) >> 20,
            limits["measurements_max_bytes"].as_i64().unwrap_or(0) >> 20
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_hw::fleet::Fleet;

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
