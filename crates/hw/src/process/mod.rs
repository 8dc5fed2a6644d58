//! Running a build step or a harness as a confined child process, and the
//! content hashes that name what was built.
//!
//! Every backend spawns its compilers, linkers and harnesses through
//! [`run_confined`]: a cleared environment with an allowlist, resource
//! limits ([`ProcessLimits`]), its own process group killed as a group on
//! time-out, bounded output capture, a fresh PID namespace where the host
//! allows one ([`crate::sandbox::pidns`]) and, with a
//! [`crate::sandbox::Policy`], Landlock, seccomp, a network namespace and a
//! pids cgroup. One home for this keeps the confinement the same whichever
//! backend builds or launches.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::HwError;

mod hash;

pub use hash::kernel_hash;
pub(crate) use hash::verified;

/// Resource limits for spawned steps (`None` = leave the inherited limit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessLimits {
    /// `RLIMIT_CPU`: CPU seconds before the step is killed by SIGXCPU.
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_AS`: largest virtual address space, bytes.
    pub address_space_bytes: Option<u64>,
    /// `RLIMIT_FSIZE`: largest file the step may write, bytes (default 1 GiB).
    pub file_size_bytes: Option<u64>,
    /// `RLIMIT_NOFILE`: most open file descriptors (default 1024).
    pub open_files: Option<u64>,
    /// Allow core dumps (off by default: they fill disks).
    pub core_dumps: bool,
    /// Lower the process's CPU priority by this nice increment (best
    /// effort: a failure leaves the inherited priority).
    pub nice: Option<i32>,
    /// Files, network and process confinement (see [`crate::sandbox`]).
    #[serde(skip)]
    pub sandbox: Option<crate::sandbox::Policy>,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        Self {
            cpu_seconds: None,
            address_space_bytes: None,
            file_size_bytes: Some(1 << 30),
            open_files: Some(1024),
            core_dumps: false,
            nice: None,
            sandbox: None,
        }
    }
}

/// What a finished process left behind.
#[derive(Debug, Clone)]
pub struct ProcessOutput {
    /// How the process ended: exit code or signal.
    pub status: ExitStatus,
    /// Standard output, decoded lossily as UTF-8, at most `max_output_bytes` of it.
    pub stdout: String,
    /// Standard error, decoded lossily as UTF-8, at most `max_output_bytes` of it.
    pub stderr: String,
    /// Wall time from spawn to exit.
    pub wall: Duration,
}

/// `exit status N` or `killed by signal N`, for error messages.
pub(crate) fn describe_status(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown exit status".into(),
    }
}

/// Read a stream to its end, keeping at most `cap` bytes.
async fn drain(mut stream: impl AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    kept
}

/// Lower a limit to `value` (never above the inherited hard limit, which an
/// unprivileged process may not raise).
fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit is async-signal-safe and writes only `current`.
    if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let value = (value as libc::rlim_t).min(current.rlim_max);
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit is async-signal-safe and only reads `limit`.
    if unsafe { libc::setrlimit(resource, &limit) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// SIGKILLs a process group when dropped.
struct GroupKill(Option<i32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // SAFETY: plain syscall on the group of a child we spawned;
            // ESRCH when it is already gone is fine.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// Variables of the daemon's environment a spawned program keeps (none of
/// them carries a secret); `HOME` and `TMPDIR` become its directory.
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ"];

/// How long output may keep arriving after the process exited.
const OUTPUT_GRACE: Duration = Duration::from_secs(5);

/// Run `argv` in `cwd` in a new process group, killing the whole group when
/// `timeout` (from process start) expires.
pub async fn run_confined(
    argv: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
    timeout: Duration,
    limits: &ProcessLimits,
    max_output_bytes: usize,
) -> Result<ProcessOutput, HwError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(HwError::Config("empty command".into()));
    };
    let mut command = command(program, args, cwd, env);
    // Removes its cgroup when dropped, after the child has been waited for.
    let process_cap = confine(&mut command, limits, cwd)?;
    let mut child = command
        .spawn()
        .map_err(|e| HwError::launch_caused(format!("cannot start `{program}`: {e}"), e))?;
    let started = Instant::now();
    // Kills the whole group when dropped: on time-out, on normal exit (a
    // harness may leave background processes behind) and when the caller
    // abandons the run (the tool call was cancelled).
    let group = GroupKill(child.id().and_then(|p| i32::try_from(p).ok()));
    let stdout = child
        .stdout
        .take()
        .map(|s| tokio::spawn(drain(s, max_output_bytes)));
    let stderr = child
        .stderr
        .take()
        .map(|s| tokio::spawn(drain(s, max_output_bytes)));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => status
            .map_err(|e| HwError::launch_caused(format!("waiting for `{program}`: {e}"), e))?,
        Err(_) => {
            drop(group);
            let _ = child.kill().await;
            for task in [stdout, stderr].into_iter().flatten() {
                task.abort();
            }
            return Err(HwError::Timeout(timeout));
        }
    };
    let wall = started.elapsed();
    drop(group);
    let stdout = collect(stdout).await;
    let stderr = collect(stderr).await;
    drop(command);
    drop(process_cap);
    Ok(ProcessOutput {
        status,
        stdout,
        stderr,
        wall,
    })
}

/// `program` with `args` in `cwd`, in a process group of its own, its
/// output piped.
fn command(
    program: &str,
    args: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    // A cleared environment: the daemon's (API keys, NATS credentials) is
    // not the program's. Only these pass through, then the caller's own.
    command.env_clear();
    for key in ENV_ALLOWLIST {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    command
        .env("HOME", cwd)
        .env("TMPDIR", cwd)
        .args(args)
        .current_dir(cwd)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command
}

/// Apply `limits` to the child of `command` between fork and exec: priority,
/// resource limits, the process cap, a PID namespace and the sandbox.
/// Returns the process cap, which must outlive the child.
fn confine(
    command: &mut tokio::process::Command,
    limits: &ProcessLimits,
    cwd: &Path,
) -> Result<std::sync::Arc<Option<crate::sandbox::pids::ProcessCap>>, HwError> {
    let limits = limits.clone();
    let pid_namespace = crate::sandbox::pidns::available();
    let process_cap = std::sync::Arc::new(
        limits
            .sandbox
            .as_ref()
            .and_then(|p| p.max_processes)
            .map(crate::sandbox::pids::ProcessCap::new),
    );
    let child_cap = std::sync::Arc::clone(&process_cap);
    let sandbox = match &limits.sandbox {
        Some(policy) => Some((
            policy.prepare(cwd)?,
            crate::sandbox::network_namespaces_available(),
        )),
        None => None,
    };
    // SAFETY: the closure only calls setrlimit, nice and the sandbox's
    // system calls (open/write of a prepared cgroup path, unshare, fork,
    // waitpid, prctl), which are async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if let Some(increment) = limits.nice {
                // -1 is both a valid result and the error value; either way
                // the process runs, at worst at the inherited priority.
                let _ = libc::nice(increment);
            }
            if !limits.core_dumps {
                set_limit(libc::RLIMIT_CORE, 0)?;
            }
            if let Some(v) = limits.cpu_seconds {
                set_limit(libc::RLIMIT_CPU, v)?;
            }
            if let Some(v) = limits.address_space_bytes {
                set_limit(libc::RLIMIT_AS, v)?;
            }
            if let Some(v) = limits.file_size_bytes {
                set_limit(libc::RLIMIT_FSIZE, v)?;
            }
            if let Some(v) = limits.open_files {
                set_limit(libc::RLIMIT_NOFILE, v)?;
            }
            // Joined before anything forks, so every descendant counts.
            if let Some(cap) = child_cap.as_ref() {
                cap.apply_in_child()?;
            }
            if pid_namespace {
                // Returns in the program's own process only (see pidns).
                crate::sandbox::pidns::enter_in_child()?;
            }
            if let Some((prepared, netns)) = &sandbox {
                prepared.apply_in_child(*netns)?;
            }
            // Nothing the daemon holds open reaches the program: every
            // descriptor past stdio closes on exec (std's exec-error pipe
            // already does).
            close_inherited_on_exec();
            Ok(())
        });
    }
    Ok(process_cap)
}

/// The output a drain task kept. A process that left the group (setsid)
/// could hold the pipes open forever: output that has not arrived shortly
/// after exit is dropped.
async fn collect(task: Option<tokio::task::JoinHandle<Vec<u8>>>) -> String {
    let Some(mut task) = task else {
        return String::new();
    };
    match tokio::time::timeout(OUTPUT_GRACE, &mut task).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned(),
        Err(_) => {
            task.abort();
            String::new()
        }
    }
}

/// Mark every descriptor above stderr close-on-exec (async-signal-safe).
fn close_inherited_on_exec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: plain system calls on this (forked) process's descriptors.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) == 0 {
            return;
        }
        // Kernels before 5.11 lack the flag: one descriptor at a time.
        let max = crate::sandbox::descriptor_limit();
        for fd in 3..max {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// `text` as an error quotes untrusted text (a file's line, a name, a
/// value, a selector): every word (a run without spaces) cut to 100
/// characters and the whole to 2000, so the error names what is wrong
/// without repeating a huge input.
pub(crate) fn excerpt(text: &str) -> String {
    let mut out = String::new();
    let mut word = 0usize;
    for c in text.chars() {
        if out.len() >= 2000 {
            out.push_str("...");
            break;
        }
        word = if c.is_whitespace() { 0 } else { word + 1 };
        match word {
            101 => out.push_str("..."),
            0..=100 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The last `max_chars` characters of `text` (output kept in errors).
pub(crate) fn tail(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        text.to_owned()
    } else {
        text.chars().skip(count - max_chars).collect()
    }
}
