//! A child process under test: started in its own process group with its
//! output captured to files, ready once it has written its `--ready-file`,
//! and killed (the whole group, so grandchildren such as an `mtswarm up`
//! stack's nats-server go too) when the guard is dropped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt as _;

/// Pause between two looks at a file or a process while waiting on it.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What a daemon writes to its `--ready-file` once it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyInfo {
    /// `http://127.0.0.1:PORT` of its gRPC server.
    pub grpc: String,
    /// The worker id (worker daemons only).
    pub worker_id: Option<String>,
    /// The whole JSON document (e.g. `mtswarm up` adds the NATS URL).
    pub document: serde_json::Value,
}

/// A running child process; dropping it kills its process group.
#[derive(Debug)]
pub struct NodeProcess {
    name: String,
    child: Child,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    _logs: tempfile::TempDir,
}

impl NodeProcess {
    /// Spawns `command` in a new process group, stdin closed, stdout and
    /// stderr captured to files (read them with [`NodeProcess::stdout`] /
    /// [`NodeProcess::stderr`]). `name` labels failure messages.
    pub fn spawn(name: &str, mut command: Command) -> std::io::Result<Self> {
        let logs = tempfile::Builder::new()
            .prefix(&format!("mtswarm-test-{name}-"))
            .tempdir()?;
        let stdout_path = logs.path().join("stdout.log");
        let stderr_path = logs.path().join("stderr.log");
        command
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path)?)
            .stderr(File::create(&stderr_path)?)
            .process_group(0);
        let child = command.spawn()?;
        Ok(Self {
            name: name.to_string(),
            child,
            stdout_path,
            stderr_path,
            _logs: logs,
        })
    }

    /// The label given to [`NodeProcess::spawn`] (`leader #1`, `worker board0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// OS process id, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// Everything the process printed on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Exit status when the process has exited, without waiting.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits (bounded) until `path` holds a JSON document with a `grpc` field,
    /// failing early with the process's stderr when it exits first.
    pub fn wait_ready(&mut self, path: &Path, timeout: Duration) -> Result<ReadyInfo, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(info) = read_ready_file(path) {
                return Ok(info);
            }
            if let Some(status) = self.try_status() {
                return Err(format!(
                    "{} exited ({status}) before it was ready; stderr:\n{}",
                    self.name,
                    self.stderr()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} not ready within {timeout:?} (no {}); stderr:\n{}",
                    self.name,
                    path.display(),
                    self.stderr()
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Sends SIGINT (what Ctrl-C sends) to the process only.
    pub fn interrupt(&self) -> std::io::Result<()> {
        self.signal(libc::SIGINT)
    }

    /// Sends SIGTERM to the process only.
    pub fn terminate(&self) -> std::io::Result<()> {
        self.signal(libc::SIGTERM)
    }

    /// SIGKILL to the process and its group (its children, e.g. emulator
    /// runs, die with it): a crash without any chance to clean up.
    pub fn kill(&self) -> std::io::Result<()> {
        self.signal_group(libc::SIGKILL)
    }

    /// SIGSTOP to the process and its group: frozen as a hung machine is,
    /// its connections open but silent, until [`NodeProcess::resume`].
    pub fn pause(&self) -> std::io::Result<()> {
        self.signal_group(libc::SIGSTOP)
    }

    /// SIGCONT to the process and its group after [`NodeProcess::pause`].
    pub fn resume(&self) -> std::io::Result<()> {
        self.signal_group(libc::SIGCONT)
    }

    /// Sends `signal` to the whole process group this guard created.
    pub fn signal_group(&self, signal: libc::c_int) -> std::io::Result<()> {
        let pgid = libc::pid_t::try_from(self.child.id())
            .map_err(|_| std::io::Error::other("pid out of range"))?;
        // SAFETY: kill(2) on the process group this guard created
        // (process_group(0) makes the child's pid its group id).
        let rc = unsafe { libc::kill(-pgid, signal) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Sends `signal` to the process only.
    pub fn signal(&self, signal: libc::c_int) -> std::io::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id())
            .map_err(|_| std::io::Error::other("pid out of range"))?;
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        let rc = unsafe { libc::kill(pid, signal) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Waits (bounded) for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_status() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} still running after {timeout:?}; stderr:\n{}",
                    self.name,
                    self.stderr()
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn kill_group(&mut self) {
        if let Ok(pgid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on the process group this guard created
            // (process_group(0) makes the child's pid its group id).
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// Parses a ready file; `None` while it is absent or still being written.
pub fn read_ready_file(path: &Path) -> Option<ReadyInfo> {
    let text = std::fs::read_to_string(path).ok()?;
    let document: serde_json::Value = serde_json::from_str(&text).ok()?;
    let grpc = document.get("grpc")?.as_str()?.to_string();
    let worker_id = document
        .get("worker_id")
        .and_then(|id| id.as_str())
        .map(str::to_string);
    Some(ReadyInfo {
        grpc,
        worker_id,
        document,
    })
}

/// True while a process with this pid exists (and is not a zombie we own).
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // Zombies still answer kill(0); look at /proc for their state.
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()) {
            return !rest.starts_with('Z') && !rest.starts_with('X');
        }
        return true;
    }
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}
