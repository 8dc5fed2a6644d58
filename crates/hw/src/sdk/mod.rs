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

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::board::{Artifact, BackendKind, Board, BuildRequest, RunOutcome, RunRequest, Slice};
use crate::error::HwError;
use crate::error::io_err;
use crate::process::{describe_status, tail};
use crate::spec::ChipSpec;
use crate::toolchain::check_defines;

mod config;
mod expand;
mod output;

pub use config::SdkConfig;
use expand::Expansion;
pub use output::parse_harness_output;
// The process layer's API, where callers have always found it.
pub use crate::process::{ENV_ALLOWLIST, ProcessLimits, ProcessOutput, kernel_hash, run_confined};

/// A slice of a real board, driven through the SDK's command templates.
pub struct SdkBoard {
    slice: Slice,
    spec: ChipSpec,
    config: SdkConfig,
}

impl SdkBoard {
    /// A board for `slice`, which must have backend `sdk`; rejects an invalid
    /// config or spec.
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

    /// The templates and settings this board runs with.
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
            HwError::Timeout(t) => {
                HwError::compile_caused(format!("{name} timed out after {t:?}"), e)
            }
            HwError::Launch(ref launch) => {
                HwError::compile_caused(format!("{name}: {}", launch.message()), e)
            }
            other => other,
        })?;
        if !output.status.success() {
            return Err(HwError::compile(format!(
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
        let kernel_dir = std::fs::canonicalize(&request.kernel_dir).map_err(|e| {
            HwError::kernel_caused(format!("{}: {e}", request.kernel_dir.display()), e)
        })?;
        for required in ["kernel.c", "host.c"] {
            if !kernel_dir.join(required).is_file() {
                return Err(HwError::kernel(format!(
                    "{} has no {required}",
                    kernel_dir.display()
                )));
            }
        }
        std::fs::create_dir_all(&request.out_dir)
            .map_err(|e| io_err("creating", &request.out_dir, e))?;
        let out_dir = std::fs::canonicalize(&request.out_dir)
            .map_err(|e| io_err("resolving", &request.out_dir, e))?;
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
                return Err(HwError::compile(format!(
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
        request.check(artifact, &self.slice)?;
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
