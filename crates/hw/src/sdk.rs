//! The `sdk` backend: the real MT-3000 toolchain and boards, driven through
//! command templates so each site can match its installation and scheduler
//! (MT-3000-gcc, then `yhrun`/`srun` or `ssh` to the board host).
//!
//! # Templates
//!
//! Every step is an argument vector (no shell is involved, so defines and
//! paths cannot inject commands). A token may contain placeholders:
//!
//! | placeholder | value |
//! |---|---|
//! | `{bin}` | `<sdk_root>/bin/`, or empty (tools found on `PATH`) |
//! | `{lib}` | `<sdk_root>/lib/`, or empty (files found in the working directory) |
//! | `{sdk}` | `<sdk_root>` |
//! | `{kernel_dir}` | the kernel directory (holds `kernel.c`, `host.c`) |
//! | `{out_dir}` | the build directory (every step runs with it as working directory) |
//! | `{program}` | the built harness, `<out_dir>/host` |
//! | `{cores}` `{runs}` | from the run request |
//! | `{cluster}` | the slice's cluster (0 for a whole board) |
//! | `{board}` `{host}` | the slice's board id, the fleet's host for it |
//!
//! and these whole tokens expand to zero or more arguments: `{defines}`
//! (`-DNAME=VALUE` each), `{includes}` (`-I<dir>` each, plus
//! `<sdk_root>/include`), `{libdirs}` (`-L<sdk_root>/lib`), `{launch_prefix}`
//! (e.g. `yhrun -p PART -w NODE` or `ssh HOST`) and `{args}` (extra harness
//! arguments). The defaults are the commands of the MT-3000 documentation:
//!
//! ```text
//! {bin}MT-3000-gcc -c -O2 -fenable-m3000 -ffunction-sections -flax-vector-conversions {includes} {defines} {kernel_dir}/kernel.c -o {out_dir}/kernel.o
//! {bin}MT-3000-ld --gc-sections -T {lib}dsp.lds {out_dir}/kernel.o {lib}libhthread_device.a {lib}vlib3000.a {lib}slib3000.a -o {out_dir}/kernel.out
//! {bin}MT-3000-makedat -J {out_dir}/kernel.out              (-> {out_dir}/kernel.dat)
//! gcc -O2 {includes} {defines} {kernel_dir}/host.c -o {out_dir}/host {libdirs} -lhthread_host -lpthread
//! {launch_prefix} env MTSWARM_CLUSTER={cluster} MTSWARM_CORES={cores} {program} --runs {runs} {args}
//! ```
//!
//! The harness takes `--runs N` and reads its cluster and core count from
//! `MTSWARM_CLUSTER` / `MTSWARM_CORES` (see `mtswarm_harness.h`); `env` puts
//! them on the far side of `ssh` or `yhrun` too.
//!
//! With `ssh` as the launch prefix the build directory must be on a file
//! system the board host shares, and since ssh joins its arguments into one
//! remote shell command, paths and defines must not contain spaces or shell
//! metacharacters.
//!
//! # Harness output
//!
//! The harness prints one `MTSWARM_RESULT {"valid":..,"max_abs_err":..,
//! "flops":..,"error":..}` line per kernel execution. A real board prints
//! no emulator lines, so kernel time comes from the harness's own timing
//! line, `MTSWARM_TIME {"seconds": <f64>}`: the n-th `MTSWARM_TIME` line is
//! the time of the n-th execution (a `"seconds"` field inside the result line
//! works too). Without either, an execution is charged the launch's wall
//! clock divided by the number of executions, which includes process start-up
//! and is therefore an upper bound.
//!
//! # Confinement
//!
//! Every step runs in its own process group, killed as a group when its
//! time-out (counted from process start) expires, with resource limits
//! ([`ProcessLimits`]) applied to the spawned process, and in its own PID
//! namespace where the host allows one ([`crate::sandbox::pidns`]), so
//! nothing it starts outlives it. Builds, and launches that run on this
//! host (no launch prefix), are confined by [`crate::sandbox`] too: they
//! read the SDK's install tree, write only their build directory and have
//! no network; builds get a process-count limit, and local launches may
//! start no processes.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::HwError;
use crate::board::{
    Artifact, BackendKind, Board, BuildRequest, Counters, RunOutcome, RunRequest, RunSample, Slice,
};
use crate::spec::ChipSpec;

/// Resource limits for spawned steps (`None` = leave the inherited limit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProcessLimits {
    pub cpu_seconds: Option<u64>,
    pub address_space_bytes: Option<u64>,
    pub file_size_bytes: Option<u64>,
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

fn tokens(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The command templates and environment of the real toolchain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SdkConfig {
    /// Root of the toolchain installation (`bin/`, `lib/`, `include/`).
    pub sdk_root: Option<PathBuf>,
    pub include_dirs: Vec<PathBuf>,
    pub device_compile: Vec<String>,
    pub device_link: Vec<String>,
    pub makedat: Vec<String>,
    pub host_compile: Vec<String>,
    pub launch: Vec<String>,
    /// `yhrun -p PART -w NODE`, `ssh HOST`, or empty (run on this host).
    pub launch_prefix: Vec<String>,
    /// The board host (fills `{host}`).
    pub host: Option<String>,
    /// Extra environment for every step (e.g. `PATH`, `LD_LIBRARY_PATH`).
    pub env: BTreeMap<String, String>,
    pub build_timeout_seconds: u64,
    pub limits: ProcessLimits,
    /// Reported as the artifact's toolchain; default: the device compile
    /// command's program and flags.
    pub toolchain_label: Option<String>,
    /// Output kept per stream; the rest is drained and dropped.
    pub max_output_bytes: usize,
    /// Further trees the confined builds and local launches may read
    /// (besides the kernel directory, `sdk_root`, `include_dirs` and the
    /// system trees), e.g. a licence file.
    pub sandbox_read: Vec<PathBuf>,
    /// Paths a local launch may also write, e.g. the board's device nodes.
    pub sandbox_write: Vec<PathBuf>,
}

impl Default for SdkConfig {
    fn default() -> Self {
        Self {
            sdk_root: None,
            include_dirs: Vec::new(),
            device_compile: tokens(&[
                "{bin}MT-3000-gcc",
                "-c",
                "-O2",
                "-fenable-m3000",
                "-ffunction-sections",
                "-flax-vector-conversions",
                "{includes}",
                "{defines}",
                "{kernel_dir}/kernel.c",
                "-o",
                "{out_dir}/kernel.o",
            ]),
            device_link: tokens(&[
                "{bin}MT-3000-ld",
                "--gc-sections",
                "-T",
                "{lib}dsp.lds",
                "{out_dir}/kernel.o",
                "{lib}libhthread_device.a",
                "{lib}vlib3000.a",
                "{lib}slib3000.a",
                "-o",
                "{out_dir}/kernel.out",
            ]),
            makedat: tokens(&["{bin}MT-3000-makedat", "-J", "{out_dir}/kernel.out"]),
            host_compile: tokens(&[
                "gcc",
                "-O2",
                "{includes}",
                "{defines}",
                "{kernel_dir}/host.c",
                "-o",
                "{out_dir}/host",
                "{libdirs}",
                "-lhthread_host",
                "-lpthread",
            ]),
            launch: tokens(&[
                "{launch_prefix}",
                "env",
                "MTSWARM_CLUSTER={cluster}",
                "MTSWARM_CORES={cores}",
                "{program}",
                "--runs",
                "{runs}",
                "{args}",
            ]),
            launch_prefix: Vec::new(),
            host: None,
            env: BTreeMap::new(),
            build_timeout_seconds: 300,
            limits: ProcessLimits::default(),
            toolchain_label: None,
            max_output_bytes: 4 << 20,
            sandbox_read: Vec::new(),
            sandbox_write: Vec::new(),
        }
    }
}

const INLINE_PLACEHOLDERS: &[&str] = &[
    "bin",
    "lib",
    "sdk",
    "kernel_dir",
    "out_dir",
    "program",
    "cores",
    "runs",
    "cluster",
    "board",
    "host",
];
const LIST_PLACEHOLDERS: &[&str] = &["defines", "includes", "libdirs", "launch_prefix", "args"];

impl SdkConfig {
    /// Parse from TOML (unknown keys are errors).
    pub fn from_toml_str(text: &str) -> Result<Self, HwError> {
        let config: Self =
            toml::from_str(text).map_err(|e| HwError::Config(format!("sdk config: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Check templates: non-empty, only known placeholders.
    pub fn validate(&self) -> Result<(), HwError> {
        let steps = [
            ("device_compile", &self.device_compile),
            ("device_link", &self.device_link),
            ("makedat", &self.makedat),
            ("host_compile", &self.host_compile),
            ("launch", &self.launch),
        ];
        for (name, template) in steps {
            if template.is_empty() {
                return Err(HwError::Config(format!(
                    "sdk config: template `{name}` is empty"
                )));
            }
            for token in template {
                if LIST_PLACEHOLDERS
                    .iter()
                    .any(|p| token == &format!("{{{p}}}"))
                {
                    continue;
                }
                let mut rest = token.as_str();
                while let Some(open) = rest.find('{') {
                    let after = &rest[open + 1..];
                    let Some(close) = after.find('}') else {
                        return Err(HwError::Config(format!(
                            "sdk config: template `{name}`: unclosed `{{` in `{token}`"
                        )));
                    };
                    let key = &after[..close];
                    if !INLINE_PLACEHOLDERS.contains(&key) {
                        let hint = if LIST_PLACEHOLDERS.contains(&key) {
                            " (list placeholders must be a whole argument)"
                        } else {
                            ""
                        };
                        return Err(HwError::Config(format!(
                            "sdk config: template `{name}`: unknown placeholder `{{{key}}}` in `{token}`{hint}"
                        )));
                    }
                    rest = &after[close + 1..];
                }
            }
        }
        if self.max_output_bytes == 0 {
            return Err(HwError::Config(
                "sdk config: max_output_bytes must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Values the placeholders expand to for one command.
struct Expansion<'a> {
    config: &'a SdkConfig,
    slice: &'a Slice,
    kernel_dir: &'a Path,
    out_dir: &'a Path,
    defines: &'a BTreeMap<String, String>,
    cores: u32,
    runs: u32,
    args: &'a [String],
}

impl Expansion<'_> {
    fn root_dir(&self, sub: &str) -> String {
        match &self.config.sdk_root {
            Some(root) => format!("{}/", root.join(sub).display()),
            None => String::new(),
        }
    }

    fn inline(&self, key: &str) -> String {
        match key {
            "bin" => self.root_dir("bin"),
            "lib" => self.root_dir("lib"),
            "sdk" => self
                .config
                .sdk_root
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            "kernel_dir" => self.kernel_dir.display().to_string(),
            "out_dir" => self.out_dir.display().to_string(),
            "program" => self.out_dir.join("host").display().to_string(),
            "cores" => self.cores.to_string(),
            "runs" => self.runs.to_string(),
            "cluster" => self.slice.cluster.unwrap_or(0).to_string(),
            "board" => self.slice.board.clone(),
            "host" => self.config.host.clone().unwrap_or_default(),
            _ => String::new(),
        }
    }

    fn list(&self, key: &str) -> Option<Vec<String>> {
        Some(match key {
            "defines" => self
                .defines
                .iter()
                .map(|(k, v)| {
                    if v.is_empty() {
                        format!("-D{k}")
                    } else {
                        format!("-D{k}={v}")
                    }
                })
                .collect(),
            "includes" => {
                let mut out: Vec<String> = self
                    .config
                    .include_dirs
                    .iter()
                    .map(|d| format!("-I{}", d.display()))
                    .collect();
                if let Some(root) = &self.config.sdk_root {
                    out.push(format!("-I{}", root.join("include").display()));
                }
                out
            }
            "libdirs" => self
                .config
                .sdk_root
                .iter()
                .map(|root| format!("-L{}", root.join("lib").display()))
                .collect(),
            "launch_prefix" => self.config.launch_prefix.clone(),
            "args" => self.args.to_vec(),
            _ => return None,
        })
    }

    fn expand(&self, template: &[String]) -> Vec<String> {
        let mut argv = Vec::with_capacity(template.len() + 8);
        for token in template {
            if let Some(key) = token.strip_prefix('{').and_then(|t| t.strip_suffix('}'))
                && let Some(values) = self.list(key)
            {
                argv.extend(values);
                continue;
            }
            let mut out = String::with_capacity(token.len());
            let mut rest = token.as_str();
            while let Some(open) = rest.find('{') {
                out.push_str(&rest[..open]);
                let after = &rest[open + 1..];
                match after.find('}') {
                    Some(close) => {
                        out.push_str(&self.inline(&after[..close]));
                        rest = &after[close + 1..];
                    }
                    None => {
                        out.push_str(&rest[open..]);
                        rest = "";
                    }
                }
            }
            out.push_str(rest);
            argv.push(out);
        }
        argv
    }
}

/// What a finished process left behind.
#[derive(Debug, Clone)]
pub struct ProcessOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
}

fn describe_status(status: &ExitStatus) -> String {
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
    let limits = limits.clone();
    let pid_namespace = crate::sandbox::pidns::available();
    // Removes its cgroup when dropped, after the child has been waited for.
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
            policy.prepare()?,
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
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| HwError::Launch(format!("cannot start `{program}`: {e}")))?;
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
        Ok(status) => {
            status.map_err(|e| HwError::Launch(format!("waiting for `{program}`: {e}")))?
        }
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
    // A process that left the group (setsid) could hold the pipes open
    // forever: output that has not arrived shortly after exit is dropped.
    let collect = |task: Option<tokio::task::JoinHandle<Vec<u8>>>| async move {
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
    };
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

/// sha256 over the kernel directory's sources (`*.c`, `*.h`, sorted by name)
/// and the defines.
pub fn kernel_hash(
    kernel_dir: &Path,
    defines: &BTreeMap<String, String>,
) -> Result<String, HwError> {
    let entries = std::fs::read_dir(kernel_dir)
        .map_err(|e| HwError::Kernel(format!("{}: {e}", kernel_dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|x| x.to_str()), Some("c" | "h"))
        })
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let content = std::fs::read(&file)?;
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(&content);
    }
    for (k, v) in defines {
        hasher.update(format!("-D{k}={v}\n").as_bytes());
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Define names are C identifiers; values have no control characters.
fn check_defines(defines: &BTreeMap<String, String>) -> Result<(), HwError> {
    for (name, value) in defines {
        let mut chars = name.chars();
        let ok_start = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !ok_start || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(HwError::Config(format!(
                "define name `{name}` is not a C identifier"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(HwError::Config(format!(
                "define `{name}` has a control character in its value"
            )));
        }
    }
    Ok(())
}

fn tail(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        text.to_owned()
    } else {
        text.chars().skip(count - max_chars).collect()
    }
}

#[derive(Debug, Deserialize)]
struct HarnessResult {
    #[serde(default)]
    valid: bool,
    #[serde(default)]
    max_abs_err: Option<f64>,
    #[serde(default)]
    flops: Option<f64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    seconds: Option<f64>,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct HarnessTime {
    seconds: f64,
}

/// Parse the harness's `MTSWARM_RESULT` / `MTSWARM_TIME` lines into samples.
/// `wall` is charged to executions that report no time.
pub fn parse_harness_output(stdout: &str, wall: Duration) -> Vec<RunSample> {
    let mut results: Vec<(HarnessResult, Option<String>)> = Vec::new();
    let mut times: Vec<f64> = Vec::new();
    for line in stdout.lines() {
        let line = line.trim();
        if let Some(json) = line.strip_prefix("MTSWARM_RESULT") {
            match serde_json::from_str::<HarnessResult>(json.trim()) {
                Ok(r) => results.push((r, None)),
                Err(e) => results.push((
                    HarnessResult {
                        valid: false,
                        max_abs_err: None,
                        flops: None,
                        error: None,
                        seconds: None,
                        seed: None,
                    },
                    Some(format!(
                        "unparseable MTSWARM_RESULT line ({e}): {}",
                        tail(json, 200)
                    )),
                )),
            }
        } else if let Some(json) = line.strip_prefix("MTSWARM_TIME")
            && let Ok(t) = serde_json::from_str::<HarnessTime>(json.trim())
        {
            times.push(t.seconds);
        }
    }
    let fallback = if results.is_empty() {
        0.0
    } else {
        wall.as_secs_f64() / results.len() as f64
    };
    results
        .into_iter()
        .enumerate()
        .map(|(i, (r, parse_error))| {
            let seconds = times.get(i).copied().or(r.seconds).unwrap_or(fallback);
            let error = parse_error.or(r.error).filter(|e| !e.is_empty());
            let valid = r.valid && error.is_none();
            RunSample {
                valid,
                error: if valid {
                    None
                } else {
                    error.or(Some("output differs from the reference".into()))
                },
                modeled_cycles: None,
                seconds,
                max_abs_err: r.max_abs_err,
                counters: Counters {
                    flops: r
                        .flops
                        .filter(|f| f.is_finite() && *f > 0.0)
                        .map(|f| f as u64)
                        .unwrap_or(0),
                    ..Counters::default()
                },
                seed: r.seed,
            }
        })
        .collect()
}

/// A slice of a real board, driven through the SDK's command templates.
pub struct SdkBoard {
    slice: Slice,
    spec: ChipSpec,
    config: SdkConfig,
}

impl SdkBoard {
    pub fn new(slice: Slice, spec: ChipSpec, config: SdkConfig) -> Result<Self, HwError> {
        if slice.backend != BackendKind::Sdk {
            return Err(HwError::Config(format!(
                "slice {} has backend {}, not sdk",
                slice.id(),
                slice.backend
            )));
        }
        config.validate()?;
        spec.validate()?;
        Ok(Self {
            slice,
            spec,
            config,
        })
    }

    /// Fill the site's host, launch prefix and SDK root from the fleet file
    /// where the configuration leaves them unset.
    pub fn for_fleet_slice(
        board: &crate::fleet::FleetBoard,
        slice: Slice,
        mut config: SdkConfig,
    ) -> Result<Self, HwError> {
        if config.launch_prefix.is_empty() {
            config.launch_prefix = board.launch_prefix.clone();
        }
        if config.host.is_none() {
            config.host = board.host.clone();
        }
        if config.sdk_root.is_none() {
            config.sdk_root = board.sdk_root.clone();
        }
        Self::new(slice, board.spec.clone(), config)
    }

    pub fn config(&self) -> &SdkConfig {
        &self.config
    }

    fn toolchain(&self) -> String {
        if let Some(label) = &self.config.toolchain_label {
            return label.clone();
        }
        let words: Vec<String> = self
            .config
            .device_compile
            .iter()
            .filter(|t| !t.contains('{') || t.starts_with("{bin}"))
            .map(|t| t.replace("{bin}", ""))
            .filter(|t| t != "-c" && t != "-o")
            .collect();
        format!("{} (sdk)", words.join(" "))
    }

    /// The SDK's own trees every confined step may read.
    fn sdk_reads(&self) -> Vec<PathBuf> {
        let mut reads: Vec<PathBuf> = self.config.sdk_root.iter().cloned().collect();
        reads.extend(self.config.include_dirs.iter().cloned());
        reads.extend(self.config.sandbox_read.iter().cloned());
        reads
    }

    /// The install tree of a step's program, found on the step's `PATH`.
    fn program_root(&self, argv: &[String]) -> Option<PathBuf> {
        let path = match self.config.env.get("PATH") {
            Some(p) => Some(p.clone()),
            None => std::env::var("PATH").ok(),
        };
        crate::sandbox::toolchain_root(argv.first()?, path.as_deref())
    }

    /// A build step: confined to the kernel directory, the SDK's trees and
    /// the tool's own install tree, writing only the build directory, with
    /// a process-count limit.
    async fn step(
        &self,
        name: &str,
        argv: &[String],
        cwd: &Path,
        kernel_dir: &Path,
    ) -> Result<ProcessOutput, HwError> {
        let timeout = Duration::from_secs(self.config.build_timeout_seconds.max(1));
        let mut reads = self.sdk_reads();
        reads.push(kernel_dir.to_path_buf());
        reads.extend(self.program_root(argv));
        let mut limits = self.config.limits.clone();
        limits.sandbox = Some(crate::sandbox::build_policy(cwd, &reads));
        let output = run_confined(
            argv,
            cwd,
            &self.config.env,
            timeout,
            &limits,
            self.config.max_output_bytes,
        )
        .await
        .map_err(|e| match e {
            HwError::Timeout(t) => HwError::Compile(format!("{name} timed out after {t:?}")),
            HwError::Launch(msg) => HwError::Compile(format!("{name}: {msg}")),
            other => other,
        })?;
        if !output.status.success() {
            return Err(HwError::Compile(format!(
                "{name} failed ({}): {}",
                describe_status(&output.status),
                tail(format!("{}{}", output.stderr, output.stdout).trim(), 2000)
            )));
        }
        Ok(output)
    }
}

#[async_trait::async_trait]
impl Board for SdkBoard {
    fn slice(&self) -> &Slice {
        &self.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        check_defines(&request.defines)?;
        let kernel_dir = std::fs::canonicalize(&request.kernel_dir)
            .map_err(|e| HwError::Kernel(format!("{}: {e}", request.kernel_dir.display())))?;
        for required in ["kernel.c", "host.c"] {
            if !kernel_dir.join(required).is_file() {
                return Err(HwError::Kernel(format!(
                    "{} has no {required}",
                    kernel_dir.display()
                )));
            }
        }
        std::fs::create_dir_all(&request.out_dir)?;
        let out_dir = std::fs::canonicalize(&request.out_dir)?;
        let expansion = Expansion {
            config: &self.config,
            slice: &self.slice,
            kernel_dir: &kernel_dir,
            out_dir: &out_dir,
            defines: &request.defines,
            cores: self.slice.cores,
            runs: 1,
            args: &[],
        };
        let mut log = String::new();
        let steps = [
            ("MT-3000-gcc (device compile)", &self.config.device_compile),
            ("MT-3000-ld (device link)", &self.config.device_link),
            ("MT-3000-makedat", &self.config.makedat),
            ("host compile", &self.config.host_compile),
        ];
        for (name, template) in steps {
            let argv = expansion.expand(template);
            let output = self.step(name, &argv, &out_dir, &kernel_dir).await?;
            let text = format!("{}{}", output.stdout, output.stderr);
            if !text.trim().is_empty() {
                log.push_str(&format!("[{name}]\n{}\n", text.trim_end()));
            }
        }
        for produced in ["kernel.dat", "host"] {
            if !out_dir.join(produced).is_file() {
                return Err(HwError::Compile(format!(
                    "the build finished but {} was not produced",
                    out_dir.join(produced).display()
                )));
            }
        }
        Ok(Artifact {
            backend: BackendKind::Sdk,
            dir: out_dir.clone(),
            program: out_dir.join("host"),
            kernel_hash: kernel_hash(&kernel_dir, &request.defines)?,
            toolchain: self.toolchain(),
            log,
            defines: request.defines.clone(),
            harness: crate::harness::harness_hashes(&kernel_dir)?,
            model: None,
        })
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        if artifact.backend != BackendKind::Sdk {
            return Err(HwError::Config(format!(
                "artifact was built for the {} backend, not sdk",
                artifact.backend
            )));
        }
        if request.cores == 0 || request.cores > self.slice.cores {
            return Err(HwError::Config(format!(
                "cores = {} is out of range 1..={} for slice {}",
                request.cores,
                self.slice.cores,
                self.slice.id()
            )));
        }
        if request.runs == 0 {
            return Err(HwError::Config("runs must be at least 1".into()));
        }
        let expansion = Expansion {
            config: &self.config,
            slice: &self.slice,
            kernel_dir: &artifact.dir,
            out_dir: &artifact.dir,
            defines: &artifact.defines,
            cores: request.cores,
            runs: request.runs,
            args: &request.args,
        };
        let argv = expansion.expand(&self.config.launch);
        let mut limits = self.config.limits.clone();
        if limits.cpu_seconds.is_none() {
            // A local harness cannot burn more CPU than its wall budget.
            limits.cpu_seconds = Some(request.timeout.as_secs().saturating_add(5));
        }
        if self.config.launch_prefix.is_empty() {
            // The harness runs on this host: the emulator's launch policy
            // (its own directory, no network, no processes), plus the SDK's
            // trees and what the site names (device nodes).
            let mut policy = crate::sandbox::launch_policy(&artifact.dir);
            policy.read.extend(self.sdk_reads());
            policy.read.extend(self.program_root(&argv));
            policy
                .write
                .extend(self.config.sandbox_write.iter().cloned());
            limits.sandbox = Some(policy);
        }
        let output = run_confined(
            &argv,
            &artifact.dir,
            &self.config.env,
            request.timeout,
            &limits,
            self.config.max_output_bytes,
        )
        .await?;
        let samples = parse_harness_output(&output.stdout, output.wall);
        let mut error = None;
        if let Some((i, s)) = samples.iter().enumerate().find(|(_, s)| !s.valid) {
            error = Some(format!(
                "execution {}: {}",
                i + 1,
                s.error.clone().unwrap_or_default()
            ));
        } else if !output.status.success() {
            error = Some(format!(
                "harness ended with {}: {}",
                describe_status(&output.status),
                tail(output.stderr.trim(), 500)
            ));
        } else if samples.is_empty() {
            error = Some("the harness printed no MTSWARM_RESULT line".into());
        } else if samples.len() < request.runs as usize {
            error = Some(format!(
                "the harness printed {} MTSWARM_RESULT lines for {} runs",
                samples.len(),
                request.runs
            ));
        }
        let last = samples.last().cloned().unwrap_or_default();
        let gflops = if last.seconds > 0.0 {
            last.counters.flops as f64 / last.seconds / 1e9
        } else {
            0.0
        };
        let peak = self.spec.peak_flops(request.cores);
        Ok(RunOutcome {
            valid: error.is_none(),
            error,
            modeled_cycles: None,
            seconds: last.seconds,
            gflops,
            peak_fraction: if peak > 0.0 { gflops * 1e9 / peak } else { 0.0 },
            counters: last.counters,
            max_abs_err: last.max_abs_err,
            wall_seconds: output.wall.as_secs_f64(),
            output_tail: tail(&format!("{}{}", output.stdout, output.stderr), 2000),
            samples,
            flags: Vec::new(),
            harness: artifact.harness.clone(),
        })
    }
}
