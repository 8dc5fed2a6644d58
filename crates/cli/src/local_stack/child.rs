//! A daemon of a local stack run as a child process of this binary: its own
//! process group (so a terminal's Ctrl-C reaches only the command that
//! started it, which then stops the stack in order), told by the kernel to
//! exit if that command dies (`PR_SET_PDEATHSIG`), its output in a log
//! file, ready once it wrote its `--ready-file`.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

/// How long a child may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a child gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two looks at a ready file.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// A running child process of a stack.
pub(crate) struct ChildProcess {
    name: String,
    child: Child,
}

impl ChildProcess {
    /// The part called `name`, running as `child` (spawned from a
    /// [`child_command`]).
    pub(crate) fn new(name: impl Into<String>, child: Child) -> Self {
        Self {
            name: name.into(),
            child,
        }
    }

    /// What the stack calls this part (`leader`, `worker board0`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its process id, while it has not been reaped.
    pub(crate) fn pid(&self) -> Option<i32> {
        self.child.id().and_then(|pid| i32::try_from(pid).ok())
    }

    /// How it exited, if it has.
    pub(crate) fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
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

    /// SIGTERM, then waits up to `STOP_TIMEOUT`, then SIGKILL; `who`
    /// prefixes the message about a child that had to be killed.
    pub(crate) async fn stop(&mut self, who: &str) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        self.signal(libc::SIGTERM);
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                eprintln!("{who}: {} did not stop in time; killing it", self.name);
                let _ = self.child.kill().await;
            }
        }
    }
}

/// Variables a daemon of the stack gets from this process's environment,
/// besides its own settings ([`PASSED_PREFIXES`]): finding programs and
/// files, locale, logging, and the model API key the daemons present to
/// their own model endpoint. Anything else (other programs' secrets) stays
/// out of the children.
const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TZ",
    "XDG_CACHE_HOME",
    "XDG_RUNTIME_DIR",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "CC",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
];

/// Prefixes of the variables that are a daemon's own settings.
const PASSED_PREFIXES: &[&str] = &["MTSWARM_", "OTEL_"];

/// Whether a daemon of the stack gets the variable `name`.
fn passed_to_children(name: &str) -> bool {
    PASSED.contains(&name) || PASSED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A command for `program` with its output in `log`, in its own process
/// group, stopped by the kernel when this process dies, with only the
/// environment a daemon needs ([`passed_to_children`]).
pub(crate) fn child_command(program: &Path, log: &Path) -> anyhow::Result<Command> {
    let mut command = Command::new(program);
    command.env_clear();
    for (name, value) in std::env::vars_os() {
        if name.to_str().is_some_and(passed_to_children) {
            command.env(name, value);
        }
    }
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
    // SIGTERM to the child when this process dies, so no child outlives it.
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

/// Waits for `part` to write a ready file, or fails with its log.
pub(crate) async fn wait_ready_file(
    part: &mut ChildProcess,
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
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
