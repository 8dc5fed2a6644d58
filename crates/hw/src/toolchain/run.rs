//! Launching a built harness on a slice: its environment (cores, cluster,
//! spec, a fresh input seed, an injected fault), and the outcome read from
//! its output and exit status. The emulator launches in this process
//! ([`crate::emu::machine`]); the host backend launches a native harness
//! under its limits and sandbox.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use super::emulated::{HARNESS_WASM, KERNEL_WASM};
use super::{Flavor, MAX_OUTPUT_BYTES, TAIL_CHARS, Toolchain};
use crate::board::{Artifact, RunOutcome, RunRequest};
use crate::emu::machine::{self, LaunchRequest, LaunchStatus};
use crate::emu::protocol::parse_output;
use crate::emu::runtime::spec_string;
use crate::error::HwError;
use crate::error::io_err;
use crate::process::{ProcessLimits, ProcessOutput, run_confined, tail};

/// CPU priority (nice increment) of an emulated launch.
///
/// On a real farm a launch runs on the board and costs the build host
/// nothing, so the host compiles the next candidates while the slice runs.
/// The emulator runs each DSP core of a launch on a host thread (24 per
/// cluster), and at equal priority those threads would take the host CPU
/// from the compiles that feed every slice: slices would finish their
/// launch quickly and then wait for the compiler, which no real farm does.
/// Launches therefore yield the CPU to everything else (compiles, the
/// daemons, nats-server). Emulated times are modeled, not measured, so a
/// slower launch reports the same figures; the native (`host`) backend
/// measures wall time and keeps its priority.
pub const EMULATED_LAUNCH_NICENESS: i32 = 19;

impl Toolchain {
    pub(crate) async fn run(
        &self,
        artifact: &Artifact,
        request: &RunRequest,
        flavor: Flavor,
    ) -> Result<RunOutcome, HwError> {
        if artifact.backend != flavor.backend() {
            return Err(HwError::Config(format!(
                "artifact was built for the {} backend, this slice is {}",
                artifact.backend,
                flavor.backend()
            )));
        }
        if request.cores == 0 || request.cores > self.slice.cores {
            return Err(HwError::Config(format!(
                "{} cores requested, slice {} has {}",
                request.cores,
                self.slice.id(),
                self.slice.cores
            )));
        }
        if request.runs == 0 {
            return Err(HwError::Config("runs must be at least 1".into()));
        }
        // A fresh input seed per launch (see mtswarm_harness.h): inputs
        // differ in every execution, so a remembered answer fails. A spot
        // re-run asks for the seed of the launch it checks.
        let seed = request.seed.unwrap_or_else(launch_seed);
        let out = match flavor {
            Flavor::Emulated => self.launch_emulated(artifact, request, seed).await?,
            Flavor::Native => self.launch_native(artifact, request, seed).await?,
        };
        let mut outcome = parse_output(&out.stdout, &self.spec, flavor, artifact.model)?;
        outcome.harness = artifact.harness.clone();
        outcome.wall_seconds = out.wall.as_secs_f64();
        outcome.output_tail = tail(&format!("{}{}", out.stdout, out.stderr), TAIL_CHARS);
        if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&out.status) {
            // A signal death explains whatever output is missing.
            outcome.valid = false;
            outcome.error = Some(format!(
                "harness killed by signal {signal}{}: {}",
                signal_name(signal),
                tail(out.stderr.trim(), 500)
            ));
        } else if !out.status.success() && outcome.error.is_none() {
            outcome.valid = false;
            outcome.error = Some(format!(
                "harness failed ({}): {}",
                out.status,
                tail(out.stderr.trim(), 500)
            ));
        }
        if outcome.samples.len() != request.runs as usize && outcome.error.is_none() {
            outcome.valid = false;
            outcome.error = Some(format!(
                "harness reported {} of {} executions",
                outcome.samples.len(),
                request.runs
            ));
        }
        Ok(outcome)
    }

    /// The emulator: harness and kernel as WebAssembly in this process.
    async fn launch_emulated(
        &self,
        artifact: &Artifact,
        request: &RunRequest,
        seed: u64,
    ) -> Result<ProcessOutput, HwError> {
        let read = |name: &str| {
            let path = artifact.dir.join(name);
            std::fs::read(&path).map_err(|e| io_err("reading", &path, e))
        };
        let fault = self
            .faults
            .as_ref()
            .and_then(|f| f.next_launch(&self.slice.id()));
        if let Some(fault) = fault {
            tracing::info!(slice.id = %self.slice.id(), fault = fault.env_value(), "injecting a configured fault into this launch");
        }
        let mut args = vec!["--runs".to_owned(), request.runs.to_string()];
        args.extend(request.args.iter().cloned());
        let out = machine::launch(LaunchRequest {
            harness: read(HARNESS_WASM)?,
            kernel: read(KERNEL_WASM)?,
            args,
            cores: request.cores,
            cluster: self.slice.cluster.unwrap_or(0),
            seed,
            fault,
            spec: self.spec.clone(),
            timeout: request.timeout,
            niceness: Some(EMULATED_LAUNCH_NICENESS),
            max_output: MAX_OUTPUT_BYTES,
        })
        .await?;
        Ok(ProcessOutput {
            status: match out.status {
                LaunchStatus::Exited(code) => ExitStatus::from_raw((code & 0xff) << 8),
                LaunchStatus::Signaled(signal) => ExitStatus::from_raw(signal & 0x7f),
            },
            stdout: out.stdout,
            stderr: out.stderr,
            wall: out.wall,
        })
    }

    /// The host backend: a native harness as a confined process.
    async fn launch_native(
        &self,
        artifact: &Artifact,
        request: &RunRequest,
        seed: u64,
    ) -> Result<ProcessOutput, HwError> {
        let mut argv = vec![
            artifact.program.display().to_string(),
            "--runs".into(),
            request.runs.to_string(),
        ];
        argv.extend(request.args.iter().cloned());
        let mut env = BTreeMap::new();
        env.insert("MTSWARM_CORES".to_owned(), request.cores.to_string());
        env.insert(
            "MTSWARM_CLUSTER".to_owned(),
            self.slice.cluster.unwrap_or(0).to_string(),
        );
        env.insert("MTSWARM_SPEC".to_owned(), spec_string(&self.spec));
        env.insert("MTSWARM_SEED".to_owned(), seed.to_string());
        let host_threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let limits = ProcessLimits {
            cpu_seconds: Some(
                self.limits
                    .cpu_seconds
                    .unwrap_or(request.timeout.as_secs().saturating_add(1) * host_threads + 1),
            ),
            address_space_bytes: self.limits.address_space_bytes,
            // Reads and writes only its own directory, no network, no
            // processes (so nothing it starts can outlive it).
            sandbox: Some(crate::sandbox::launch_policy(&artifact.dir)),
            ..ProcessLimits::default()
        };
        run_confined(
            &argv,
            &artifact.dir,
            &env,
            request.timeout,
            &limits,
            MAX_OUTPUT_BYTES,
        )
        .await
    }
}

/// A seed no launch shares with another: random bits of a v4 uuid.
pub(crate) fn launch_seed() -> u64 {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ])
}

/// ` (SIGSEGV)` for the signals a crashing harness dies from.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGFPE => " (SIGFPE)",
        libc::SIGILL => " (SIGILL)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGXCPU => " (SIGXCPU)",
        _ => "",
    }
}
