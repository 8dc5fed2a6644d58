//! The emulated MT-3000 itself: a launch runs the harness and the
//! instrumented kernel as WebAssembly inside this process, and the host
//! computes every figure from accounting the kernel cannot reach.
//!
//! Two modules, two memories:
//!
//! - the *harness* (`host.c`, compiled for `wasm32-wasi`) is the ARM host
//!   side: it draws inputs, launches the kernel through the hthreads host
//!   API ([`host`]) and validates outputs, all in its own linear memory;
//! - the *kernel* (`kernel.c`, instrumented by [`crate::emu::instrument`])
//!   runs once per DSP core, every core an instance on its own thread over
//!   one shared device memory laid out by [`crate::emu::layout`].
//!
//! The harness's DDR buffers are copied into device memory when a group
//! runs and the writable ones copied back when it ends, so device code can
//! neither see what the harness keeps (check vectors, references, seeds)
//! nor change an input the harness validates against. The figures (the
//! `MTSWARM_EMU` line of each execution) are written by this module into
//! the harness's output stream; device code prints to a separate stream
//! ([`GroupShared::print`]).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use wasmtime::Module;

use crate::emu::instrument::Device;
use crate::spec::ChipSpec;

mod cores;
mod device;
mod engine;
mod host;
mod launch;
mod libm;
mod memory;
mod model;
mod places;
mod printf;
mod scratch;
mod sync;

pub(crate) use launch::{LaunchRequest, LaunchStatus, launch};

/// Most bytes of device output (`hthread_printf`) kept per launch.
const MAX_DEVICE_OUTPUT: usize = 64 * 1024;

/// Why a launch stopped before its harness ended by itself.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum EmuError {
    /// The configuration does not fit the chip (AM, SM, GSM, DDR, cores).
    #[error("{0}")]
    Capacity(String),
    /// Misuse of the hthreads API (bad ids, DMA past a buffer, ...).
    #[error("{0}")]
    Usage(String),
    /// The kernel cannot be launched (function not found, bad module).
    #[error("{0}")]
    Launch(String),
    /// Device code faulted: an access it may not make, or a trap.
    #[error("{0}")]
    Fault(String),
    /// Another core's error or the launch's timeout stopped this core.
    #[error("stopped with the rest of the launch")]
    Aborted,
    /// An injected crash (fleet `faults`): the harness dies from a signal.
    #[error("killed by signal {0}")]
    Crash(i32),
}

impl EmuError {
    /// The `kind` of its `MTSWARM_ERROR` line.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            EmuError::Capacity(_) => "capacity",
            EmuError::Launch(_) => "launch",
            EmuError::Usage(_) | EmuError::Fault(_) | EmuError::Aborted | EmuError::Crash(_) => {
                "usage"
            }
        }
    }
}

/// Everything the cores of one group execution share.
pub(crate) struct GroupShared {
    pub(crate) spec: ChipSpec,
    pub(crate) device: Arc<Device>,
    pub(crate) module: Module,
    pub(crate) memory: memory::DeviceMemory,
    pub(crate) threads: u32,
    pub(crate) ddr: places::DdrMap,
    pub(crate) barrier_ids: BTreeSet<i32>,
    pub(crate) sync: sync::Barriers,
    pub(crate) abort: Arc<sync::Abort>,
    pub(crate) output: Arc<Mutex<DeviceOutput>>,
    pub(crate) niceness: Option<i32>,
}

impl GroupShared {
    /// Append what core `core` printed to the device output.
    pub(crate) fn print(&self, core: u32, text: &str) {
        if let Ok(mut out) = self.output.lock() {
            out.push(core, text);
        }
    }
}

/// What device code printed, capped, one prefixed line per line printed.
#[derive(Debug, Default)]
pub(crate) struct DeviceOutput {
    text: String,
    /// Unfinished line of each core.
    partial: std::collections::BTreeMap<u32, String>,
    truncated: bool,
}

impl DeviceOutput {
    fn push(&mut self, core: u32, text: &str) {
        let line = self.partial.entry(core).or_default();
        line.push_str(text);
        while let Some(end) = line.find('\n') {
            let done: String = line.drain(..=end).collect();
            if self.text.len() + done.len() > MAX_DEVICE_OUTPUT {
                self.truncated = true;
                continue;
            }
            self.text.push_str(&format!("device core {core}: {done}"));
        }
        if line.len() > MAX_DEVICE_OUTPUT {
            line.clear();
            self.truncated = true;
        }
    }

    /// Everything printed, unfinished lines last.
    pub(crate) fn finish(mut self) -> String {
        for (core, line) in std::mem::take(&mut self.partial) {
            if !line.is_empty() && self.text.len() + line.len() <= MAX_DEVICE_OUTPUT {
                self.text.push_str(&format!("device core {core}: {line}\n"));
            }
        }
        if self.truncated {
            self.text
                .push_str("device output truncated (at most 64 KiB is kept)\n");
        }
        self.text
    }
}

/// Run the calling thread at `niceness` (Linux: per thread).
pub(crate) fn lower_priority(niceness: Option<i32>) {
    if let Some(n) = niceness {
        // SAFETY: plain system calls on the calling thread's own id.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_output_is_prefixed_per_core_line_and_capped() {
        let mut out = DeviceOutput::default();
        out.push(1, "MTSWARM_RESULT {");
        out.push(0, "hello\n");
        out.push(1, "\"valid\":true}\n");
        let text = out.finish();
        assert_eq!(
            text,
            "device core 0: hello\ndevice core 1: MTSWARM_RESULT {\"valid\":true}\n"
        );
        let mut big = DeviceOutput::default();
        for _ in 0..10_000 {
            big.push(0, "0123456789\n");
        }
        let text = big.finish();
        assert!(text.len() <= MAX_DEVICE_OUTPUT + 100);
        assert!(text.ends_with("truncated (at most 64 KiB is kept)\n"));
    }
}
