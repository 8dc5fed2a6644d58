//! One launch: the harness's `main` on a thread of its own, its output
//! captured, its kernel runs figured by [`super::host`], stopped at the
//! timeout.
//!
//! The harness sees a WASI world with its arguments, three environment
//! variables (`MTSWARM_SEED`, `MTSWARM_CORES`, `MTSWARM_CLUSTER`), a clock,
//! randomness and two output streams: no file, no directory, no network.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::{Linker, Store, UpdateDeadline};
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

use super::engine::{compile, engine};
use super::host::{HarnessState, LaunchShared};
use super::sync::Abort;
use super::{DeviceOutput, EmuError, lower_priority};
use crate::emu::instrument;
use crate::error::HwError;
use crate::faults::Fault;
use crate::spec::ChipSpec;

/// Everything one launch needs.
#[derive(Debug, Clone)]
pub(crate) struct LaunchRequest {
    /// The harness module (`harness.wasm`).
    pub(crate) harness: Vec<u8>,
    /// The linked, not yet instrumented kernel module (`kernel.wasm`).
    pub(crate) kernel: Vec<u8>,
    /// Arguments after the program name.
    pub(crate) args: Vec<String>,
    pub(crate) cores: u32,
    pub(crate) cluster: u32,
    pub(crate) seed: u64,
    pub(crate) fault: Option<Fault>,
    pub(crate) spec: ChipSpec,
    pub(crate) timeout: Duration,
    /// Nice value of the launch's threads.
    pub(crate) niceness: Option<i32>,
    /// Most bytes of harness output kept.
    pub(crate) max_output: usize,
}

/// How the harness ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaunchStatus {
    /// `main` returned or called `exit`.
    Exited(i32),
    /// An injected crash.
    Signaled(i32),
}

/// What a launch printed and how it ended.
#[derive(Debug, Clone)]
pub(crate) struct LaunchOutput {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) status: LaunchStatus,
    pub(crate) wall: Duration,
}

/// Run a launch to its end or its timeout.
pub(crate) async fn launch(request: LaunchRequest) -> Result<LaunchOutput, HwError> {
    let abort = Arc::new(Abort::default());
    let timeout = request.timeout;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread_abort = abort.clone();
    std::thread::Builder::new()
        .name("mt3000-harness".into())
        .spawn(move || {
            lower_priority(request.niceness);
            let _ = tx.send(run(request, thread_abort));
        })
        .map_err(|e| HwError::launch(format!("cannot start the emulator thread: {e}")))?;
    let started = Instant::now();
    tokio::pin!(rx);
    let result = tokio::select! {
        result = &mut rx => result,
        () = tokio::time::sleep(timeout) => {
            abort.raise(EmuError::Aborted);
            // The harness thread stops at its next epoch check.
            let _ = rx.await;
            return Err(HwError::Timeout(timeout));
        }
    };
    let output =
        result.map_err(|_| HwError::launch("the emulator thread ended without a result"))??;
    tracing::debug!(wall = ?started.elapsed(), "emulated launch finished");
    Ok(output)
}

fn run(request: LaunchRequest, abort: Arc<Abort>) -> Result<LaunchOutput, HwError> {
    let started = Instant::now();
    let emu = |e: EmuError| HwError::launch(e.to_string());
    let device = instrument::prepare(&request.kernel, &request.spec)?;
    let kernel_module = compile(&device.wasm, "the instrumented kernel").map_err(emu)?;
    let harness_module = compile(&request.harness, "the harness").map_err(emu)?;
    let engine = engine().map_err(emu)?;

    let stdout = MemoryOutputPipe::new(request.max_output);
    let stderr = MemoryOutputPipe::new(request.max_output);
    let mut args = vec!["harness".to_owned()];
    args.extend(request.args.iter().cloned());
    let wasi = WasiCtxBuilder::new()
        .args(&args)
        .env("MTSWARM_SEED", request.seed.to_string())
        .env("MTSWARM_CORES", request.cores.to_string())
        .env("MTSWARM_CLUSTER", request.cluster.to_string())
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .build_p1();
    let output = Arc::new(Mutex::new(DeviceOutput::default()));
    let shared = Arc::new(LaunchShared {
        spec: request.spec.clone(),
        device: Arc::new(device),
        module: kernel_module,
        cores: request.cores,
        fault: request.fault,
        abort: abort.clone(),
        output: output.clone(),
        niceness: request.niceness,
    });
    let length_of = stdout.clone();
    let state = HarnessState::new(wasi, shared, Box::new(move || length_of.contents().len()));
    let mut store = Store::new(engine, state);
    let poll = abort.clone();
    store.epoch_deadline_callback(move |_| {
        if poll.is_raised() {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Continue(1))
        }
    });
    store.set_epoch_deadline(1);
    let mut linker: Linker<HarnessState> = Linker::new(engine);
    let setup = |e: wasmtime::Error| HwError::launch(format!("cannot link the harness: {e}"));
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut HarnessState| &mut s.wasi)
        .map_err(setup)?;
    super::host::define(&mut linker).map_err(setup)?;
    let instance = linker
        .instantiate(&mut store, &harness_module)
        .map_err(setup)?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(setup)?;
    let setup = started.elapsed();
    let result = start.call(&mut store, ());
    tracing::debug!(?setup, run = ?started.elapsed() - setup, "emulated launch");

    let (status, error) = match result {
        Ok(()) => (LaunchStatus::Exited(0), None),
        Err(e) => {
            if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
                (LaunchStatus::Exited(exit.0), None)
            } else if let Some(err) = e.downcast_ref::<EmuError>() {
                match err {
                    EmuError::Crash(signal) => (LaunchStatus::Signaled(*signal), None),
                    other => (LaunchStatus::Exited(3), Some(other.clone())),
                }
            } else if abort.is_raised() {
                (LaunchStatus::Exited(3), abort.error())
            } else {
                let text = format!("{e:?}");
                let short: Vec<&str> = text.lines().take(8).collect();
                (
                    LaunchStatus::Exited(3),
                    Some(EmuError::Launch(format!(
                        "the harness trapped: {}",
                        short.join(" | ")
                    ))),
                )
            }
        }
    };
    if abort.is_raised() && matches!(abort.error(), Some(EmuError::Aborted) | None) {
        // Stopped by the timeout: the caller reports it.
        return Err(HwError::Timeout(request.timeout));
    }
    let mut stdout_text = merge(&stdout.contents(), &store.data().emu_lines);
    if let Some(err) = &error {
        let err = if *err == EmuError::Aborted {
            abort.error().unwrap_or(EmuError::Aborted)
        } else {
            err.clone()
        };
        let line = serde_json::json!({"kind": err.kind(), "message": err.to_string()});
        stdout_text.push_str(&format!("MTSWARM_ERROR {line}\n"));
    }
    let mut stderr_text = String::from_utf8_lossy(&stderr.contents()).into_owned();
    if let Some(err) = &error {
        stderr_text.push_str(&format!("mt3000-emu: {err}\n"));
    }
    drop(store);
    let device_text = Arc::try_unwrap(output)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .map(DeviceOutput::finish)
        .unwrap_or_default();
    stderr_text.push_str(&device_text);
    Ok(LaunchOutput {
        stdout: stdout_text,
        stderr: stderr_text,
        status,
        wall: started.elapsed(),
    })
}

/// The harness's stdout with each `MTSWARM_EMU` line inserted where its
/// group ended.
fn merge(stdout: &[u8], lines: &[(usize, String)]) -> String {
    let mut out = String::with_capacity(stdout.len() + lines.len() * 200);
    let mut at = 0;
    for (pos, line) in lines {
        let pos = (*pos).min(stdout.len()).max(at);
        out.push_str(&String::from_utf8_lossy(&stdout[at..pos]));
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(line);
        at = pos;
    }
    out.push_str(&String::from_utf8_lossy(&stdout[at..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_lines_go_where_their_group_ended() {
        let out = merge(
            b"a\nMTSWARM_RESULT 1\nb\n",
            &[(2, "EMU0\n".into()), (19, "EMU1\n".into())],
        );
        assert_eq!(out, "a\nEMU0\nMTSWARM_RESULT 1\nEMU1\nb\n");
        // A partial line before a runtime line is ended, not glued to it.
        assert_eq!(merge(b"abc", &[(1, "EMU\n".into())]), "a\nEMU\nbc");
    }
}
