//! One group execution from the harness's side: the DDR buffers placed in
//! device memory (read-only ones first), copied in or poisoned, the
//! kernel's pointer arguments translated, the cores run, an injected fault
//! applied, writable buffers copied back, and the execution's
//! `MTSWARM_EMU` line.

use std::sync::Arc;

use wasmtime::SharedMemory;

use super::super::cores::{self, CoreFigures};
use super::super::engine::engine;
use super::super::memory::DeviceMemory;
use super::super::places::{DdrBuffer, DdrMap};
use super::super::sync::Barriers;
use super::super::{EmuError, GroupShared};
use super::{
    Allocation, Ctx, HT_MEM_RO, HT_MEM_WO, HarnessState, LaunchShared, fail, harness_bytes,
    harness_memory,
};
use crate::emu::layout::{BUFFER_ALIGN, MAX_PAGES, PAGE, Span};
use crate::faults::Fault;
use crate::spec::ChipSpec;

/// The device memory of the launch, created (and the kernel image
/// written) on first use, grown to hold `ddr_len` bytes of buffers.
fn device_memory(state: &mut HarnessState, ddr_len: u64) -> Result<DeviceMemory, EmuError> {
    let layout = &state.launch.device.layout;
    let pages = layout
        .pages_for(ddr_len + BUFFER_ALIGN)
        .map_err(|e| match e {
            crate::error::HwError::Capacity(m) => EmuError::Capacity(m),
            other => EmuError::Launch(other.to_string()),
        })?;
    if let Some(memory) = &state.memory {
        memory.ensure_pages(pages)?;
        return Ok(memory.clone());
    }
    let ty = wasmtime::MemoryType::shared(pages as u32, MAX_PAGES as u32);
    let shared = SharedMemory::new(engine()?, ty)
        .map_err(|e| EmuError::Capacity(format!("cannot create device memory: {e}")))?;
    let memory = DeviceMemory::new(shared, MAX_PAGES * PAGE);
    for (at, bytes) in &state.launch.device.segments {
        memory.write(u64::from(*at), bytes)?;
    }
    let gsm = u64::from(layout.image.gsm.len);
    if gsm > state.launch.spec.gsm_bytes {
        return Err(EmuError::Capacity(format!(
            "hthread_dev_open: GSM capacity exceeded ({} bytes per cluster, {gsm} bytes of __gsm__ arrays)",
            state.launch.spec.gsm_bytes
        )));
    }
    state.memory = Some(memory.clone());
    Ok(memory)
}

/// Run group `id` (started by `hthread_group_exec`) to its end.
pub(super) fn group_wait(c: &mut Ctx<'_>, id: i32) -> wasmtime::Result<()> {
    let Some(group) = c.data().groups.get(&id) else {
        return Err(fail(EmuError::Usage(format!(
            "hthread_group_wait({id}): no such thread group"
        ))));
    };
    let Some(started) = group.started else {
        return Err(fail(EmuError::Usage(format!(
            "hthread_group_wait({id}): group is not running"
        ))));
    };
    let (cluster, threads, kernel) = (group.cluster, group.threads, group.kernel.clone());
    let (args, nscalar) = (group.args.clone(), group.nscalar);
    let launch = c.data().launch.clone();

    let allocations = c.data().allocations.clone();
    let placement = Placement::of(&allocations, launch.device.layout.ddr_lo);
    let memory = device_memory(c.data_mut(), placement.len).map_err(fail)?;
    let mut names = buffer_names(&allocations);
    let device_args = translate_pointers(&args, nscalar, &allocations, &placement, &mut names)?;
    let buffers = allocations
        .iter()
        .enumerate()
        .map(|(i, a)| DdrBuffer {
            span: Span::new(placement.at[i], a.bytes),
            read_only: a.flags == HT_MEM_RO,
            name: format!("{})", names[i]),
        })
        .collect();
    copy_in(c, &memory, &allocations, &placement)?;

    let shared = Arc::new(GroupShared {
        spec: launch.spec.clone(),
        device: launch.device.clone(),
        module: launch.module.clone(),
        memory: memory.clone(),
        threads,
        ddr: DdrMap {
            len: placement.len as u32,
            read_only_len: placement.read_only_len as u32,
            buffers,
        },
        barrier_ids: c.data().barriers.clone(),
        sync: Barriers::new(threads, launch.spec.model.barrier_cycles as f64),
        abort: launch.abort.clone(),
        output: launch.output.clone(),
        niceness: launch.niceness,
    });
    let figures = cores::run(&shared, &kernel, &device_args).map_err(fail)?;
    apply_fault(&launch, &memory, &allocations, &placement)?;
    copy_out(c, &memory, &allocations, &placement)?;

    let wall = started.elapsed().as_secs_f64();
    let line = emu_line(&kernel, cluster, &figures, &launch.spec, wall);
    let state = c.data_mut();
    let at = (state.stdout_len)();
    state.emu_lines.push((at, line));
    if let Some(g) = state.groups.get_mut(&id) {
        g.started = None;
    }
    Ok(())
}

/// Where the DDR buffers lie in device memory: read-only ones first (so
/// one bound protects them all), each 128-byte aligned.
struct Placement {
    /// The device address of each buffer, in allocation order.
    at: Vec<u32>,
    /// Bytes of all buffers, padding included.
    len: u64,
    /// Bytes of the read-only buffers at the start.
    read_only_len: u64,
}

impl Placement {
    fn of(allocations: &[Allocation], ddr_lo: u32) -> Self {
        let mut order: Vec<usize> = (0..allocations.len()).collect();
        order.sort_by_key(|&i| (allocations[i].flags != HT_MEM_RO, i));
        let mut at = vec![0u32; allocations.len()];
        let mut offset = 0u64;
        let mut read_only_len = 0u64;
        for &i in &order {
            at[i] = ddr_lo + offset as u32;
            offset += u64::from(allocations[i].bytes).div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
            if allocations[i].flags == HT_MEM_RO {
                read_only_len = offset;
            }
        }
        Self {
            at,
            len: offset,
            read_only_len,
        }
    }
}

/// How an error names each buffer (without the closing parenthesis: the
/// kernel arguments pointing into it are added).
fn buffer_names(allocations: &[Allocation]) -> Vec<String> {
    allocations
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let flags = match a.flags {
                HT_MEM_RO => "HT_MEM_RO",
                HT_MEM_WO => "HT_MEM_WO",
                _ => "HT_MEM_RW",
            };
            format!("DDR buffer {i} ({flags}, {} bytes", a.bytes)
        })
        .collect()
}

/// The kernel's arguments with each pointer (after the `nscalar` scalars)
/// translated from the harness's buffer into the device's.
fn translate_pointers(
    args: &[u64],
    nscalar: usize,
    allocations: &[Allocation],
    placement: &Placement,
    names: &mut [String],
) -> wasmtime::Result<Vec<u64>> {
    let mut device_args = args.to_vec();
    for (k, arg) in device_args.iter_mut().enumerate().skip(nscalar) {
        let host = *arg;
        if host == 0 {
            continue;
        }
        let Some(i) = allocations.iter().position(|a| {
            host >= u64::from(a.host) && host <= u64::from(a.host) + u64::from(a.bytes)
        }) else {
            return Err(fail(EmuError::Usage(format!(
                "hthread_group_create: argument {k} ({host:#x}) points into no hthread_malloc buffer"
            ))));
        };
        *arg = u64::from(placement.at[i]) + (host - u64::from(allocations[i].host));
        names[i].push_str(&format!(", kernel argument {k}"));
    }
    Ok(device_args)
}

/// Copy in: inputs as the harness wrote them, outputs poisoned.
fn copy_in(
    c: &mut Ctx<'_>,
    memory: &DeviceMemory,
    allocations: &[Allocation],
    placement: &Placement,
) -> wasmtime::Result<()> {
    for (i, a) in allocations.iter().enumerate() {
        let at = u64::from(placement.at[i]);
        if a.flags == HT_MEM_WO {
            memory.fill(at, u64::from(a.bytes), 0xff).map_err(fail)?;
        } else {
            let bytes = harness_bytes(c, a.host, a.bytes)?;
            memory.write(at, &bytes).map_err(fail)?;
        }
    }
    Ok(())
}

/// The launch's injected fault, if any, after the cores ran.
fn apply_fault(
    launch: &LaunchShared,
    memory: &DeviceMemory,
    allocations: &[Allocation],
    placement: &Placement,
) -> wasmtime::Result<()> {
    match launch.fault {
        Some(Fault::Hang) => {
            // Never returns by itself: the launch's timeout stops it.
            while !launch.abort.is_raised() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(fail(EmuError::Aborted))
        }
        Some(Fault::Crash) => Err(fail(EmuError::Crash(libc::SIGSEGV))),
        Some(Fault::Wrong) => corrupt_outputs(memory, allocations, &placement.at).map_err(fail),
        None => Ok(()),
    }
}

/// Copy out what the kernel may write.
fn copy_out(
    c: &mut Ctx<'_>,
    memory: &DeviceMemory,
    allocations: &[Allocation],
    placement: &Placement,
) -> wasmtime::Result<()> {
    let harness = harness_memory(c)?;
    for (i, a) in allocations.iter().enumerate() {
        if a.flags & HT_MEM_WO == 0 {
            continue;
        }
        let bytes = memory
            .read(u64::from(placement.at[i]), u64::from(a.bytes))
            .map_err(fail)?;
        harness
            .write(&mut *c, a.host as usize, &bytes)
            .map_err(|e| fail(EmuError::Usage(format!("copying DDR buffer {i} back: {e}"))))?;
    }
    Ok(())
}

/// Fault injection `wrong`: every 8-byte word of the writable buffers
/// becomes 2x + 1 (as a double), so the answer check fails.
fn corrupt_outputs(
    memory: &DeviceMemory,
    allocations: &[Allocation],
    placed: &[u32],
) -> Result<(), EmuError> {
    for (i, a) in allocations.iter().enumerate() {
        if a.flags & HT_MEM_WO == 0 {
            continue;
        }
        let mut bytes = memory.read(u64::from(placed[i]), u64::from(a.bytes))?;
        for w in bytes.chunks_exact_mut(8) {
            let v = f64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            let v = if v.is_finite() { v * 2.0 + 1.0 } else { 1.0 };
            w.copy_from_slice(&v.to_le_bytes());
        }
        memory.write(u64::from(placed[i]), &bytes)?;
    }
    Ok(())
}

fn emu_line(
    kernel: &str,
    cluster: i32,
    cores: &[CoreFigures],
    spec: &ChipSpec,
    wall: f64,
) -> String {
    let kernel_cycles = cores.iter().map(|c| c.cycles).fold(0.0, f64::max).ceil();
    let sum = |f: fn(&CoreFigures) -> f64| cores.iter().map(f).sum::<f64>();
    let line = serde_json::json!({
        "kernel": kernel,
        "cluster": cluster,
        "threads": cores.len(),
        "modeled": true,
        "cycles": cores.iter().map(|c| c.cycles.ceil()).collect::<Vec<_>>(),
        "kernel_cycles": kernel_cycles,
        "seconds": kernel_cycles / spec.clock_hz,
        "flops": sum(|c| c.flops),
        "dma_bytes": sum(|c| c.dma_bytes),
        "ddr_bytes": sum(|c| c.ddr_bytes),
        "stall_cycles": sum(|c| c.stall).ceil(),
        "wall_seconds": wall,
    });
    format!("MTSWARM_EMU {line}\n")
}
