//! The `mtswarm` command line as the tests run it, a child process: a
//! client command against a leader, its checked stdout, and `mtswarm up`
//! started on free ports until it is ready. The end-to-end and chaos tests
//! drive the binary the same way through these.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::process::{NodeProcess, ReadyInfo};

/// `node_bin ARGS` as a client of the leader at `leader` (`MTSWARM_LEADER`),
/// with human output and no tracing whatever the test's environment says.
pub fn client_command(node_bin: &Path, leader: &str, args: &[&str]) -> Command {
    let mut command = Command::new(node_bin);
    command
        .args(args)
        .env("MTSWARM_LEADER", leader)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("MTSWARM_JSON");
    command
}

/// `node_bin` with the client configuration `client_config` and nothing
/// of the test's environment that would point it elsewhere (leader, NATS,
/// fleet, token, CA, OTLP endpoint); kernels build in the shared emulator
/// cache.
pub fn configured_node(node_bin: &Path, client_config: &Path) -> Command {
    let mut command = Command::new(node_bin);
    command
        .env("MTSWARM_CACHE_DIR", crate::emulator_cache_dir())
        .env("MTSWARM_CONFIG", client_config)
        .env_remove("MTSWARM_LEADER")
        .env_remove("MTSWARM_NATS_URL")
        .env_remove("MTSWARM_FLEET")
        .env_remove("MTSWARM_TOKEN_FILE")
        .env_remove("MTSWARM_TLS_CA")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

/// The stdout of a command that must have succeeded (`what` names it in
/// the panic, with its stderr, when it did not).
pub fn stdout_of(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `command` with its stdout a pipe whose reading end is closed
/// already (what `| head -1` leaves once it has its line): every write
/// fails with `EPIPE`. Its exit status and stderr.
pub fn output_into_closed_pipe(mut command: Command) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    command
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run the command")
}

/// The name of the ready file [`spawn_up`] gives `mtswarm up` in its directory.
pub const UP_READY_FILE: &str = "up.ready.json";

/// Starts `command` (the `mtswarm-node` binary with the test's environment)
/// as `mtswarm up` on free ports over the example kernels, its ready file
/// [`UP_READY_FILE`] and its logs (`logs/`) in `dir`, and waits at most
/// `timeout` until it is ready; panics with its log otherwise.
pub fn spawn_up(mut command: Command, dir: &Path, timeout: Duration) -> (NodeProcess, ReadyInfo) {
    let ready_path = dir.join(UP_READY_FILE);
    command
        .arg("up")
        .args(["--nats-port", "0", "--leader-listen", "127.0.0.1:0"])
        .args(["--metrics-port", "0"])
        .arg("--kernel-root")
        .arg(crate::kernel_root())
        .arg("--ready-file")
        .arg(&ready_path)
        // Kept after the stack stops: in the test's directory, not ~/.mtswarm.
        .arg("--log-dir")
        .arg(dir.join("logs"));
    let mut up = NodeProcess::spawn("mtswarm up", command).expect("spawn mtswarm up");
    let ready = up
        .wait_ready(&ready_path, timeout)
        .unwrap_or_else(|e| panic!("{e}"));
    (up, ready)
}
