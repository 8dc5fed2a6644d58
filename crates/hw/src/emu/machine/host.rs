//! The hthreads host API as the harness imports it, and the harness's
//! side of every group execution.
//!
//! The harness allocates its DDR buffers in its own memory (the C shim
//! `emu_host_shim.c` registers each with `mtswarm.ddr_register`). When a
//! group runs, the buffers are placed in device memory (read-only ones
//! first, so one bound protects them all), read-only and read-write
//! buffers copied in, write-only ones poisoned (all bits set: NaN as a
//! double), the kernel's pointer arguments translated, the cores run, and
//! writable buffers copied back. The figures of the execution become its
//! `MTSWARM_EMU` line.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::{Caller, Extern, Linker, Module, SharedMemory};
use wasmtime_wasi::p1::WasiP1Ctx;

use super::cores::{self, CoreFigures};
use super::engine::engine;
use super::memory::DeviceMemory;
use super::places::{DdrBuffer, DdrMap};
use super::sync::{Abort, Barriers};
use super::{DeviceOutput, EmuError, GroupShared};
use crate::emu::instrument::Device;
use crate::emu::layout::{BUFFER_ALIGN, MAX_PAGES, Span};
use crate::faults::Fault;
use crate::spec::ChipSpec;

const HT_MEM_RO: i32 = 0x1;
const HT_MEM_WO: i32 = 0x2;
const HT_MEM_RW: i32 = 0x3;
/// Most arguments of a kernel.
const MAX_ARGS: i32 = 16;
/// Most live groups and barriers, as the board's runtime.
const MAX_GROUPS: usize = 64;
const MAX_BARRIERS: i32 = 64;

/// What every group of a launch shares with the harness.
pub(crate) struct LaunchShared {
    pub(crate) spec: ChipSpec,
    pub(crate) device: Arc<Device>,
    pub(crate) module: Module,
    /// Cores the slice provides (`hthread_get_avail_threads`).
    pub(crate) cores: u32,
    pub(crate) fault: Option<Fault>,
    pub(crate) abort: Arc<Abort>,
    pub(crate) output: Arc<Mutex<DeviceOutput>>,
    pub(crate) niceness: Option<i32>,
}

#[derive(Debug, Clone, Copy)]
struct Allocation {
    host: u32,
    bytes: u32,
    cluster: i32,
    flags: i32,
}

#[derive(Debug)]
struct Group {
    cluster: i32,
    threads: u32,
    kernel: String,
    args: Vec<u64>,
    nscalar: usize,
    started: Option<Instant>,
}

/// The harness store's state.
pub(crate) struct HarnessState {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) launch: Arc<LaunchShared>,
    open: BTreeSet<i32>,
    loaded: BTreeSet<i32>,
    groups: BTreeMap<i32, Group>,
    barriers: BTreeSet<i32>,
    allocations: Vec<Allocation>,
    memory: Option<DeviceMemory>,
    /// `MTSWARM_EMU` lines and the stdout length they come after.
    pub(crate) emu_lines: Vec<(usize, String)>,
    /// How to read the harness's stdout length so far.
    pub(crate) stdout_len: Box<dyn Fn() -> usize + Send + Sync>,
}

impl HarnessState {
    pub(crate) fn new(
        wasi: WasiP1Ctx,
        launch: Arc<LaunchShared>,
        stdout_len: Box<dyn Fn() -> usize + Send + Sync>,
    ) -> Self {
        Self {
            wasi,
            launch,
            open: BTreeSet::new(),
            loaded: BTreeSet::new(),
            groups: BTreeMap::new(),
            barriers: BTreeSet::new(),
            allocations: Vec::new(),
            memory: None,
            emu_lines: Vec::new(),
            stdout_len,
        }
    }
}

type Ctx<'a> = Caller<'a, HarnessState>;

fn fail(e: EmuError) -> wasmtime::Error {
    wasmtime::Error::new(e)
}

fn cluster_ok(c: &Ctx<'_>, cluster: i32, who: &str) -> wasmtime::Result<()> {
    let clusters = c.data().launch.spec.clusters as i32;
    if cluster < 0 || cluster >= clusters {
        return Err(fail(EmuError::Usage(format!(
            "{who}: cluster {cluster} does not exist (clusters 0..{})",
            clusters - 1
        ))));
    }
    Ok(())
}

/// The harness's own linear memory.
fn harness_memory(c: &mut Ctx<'_>) -> wasmtime::Result<wasmtime::Memory> {
    match c.get_export("memory") {
        Some(Extern::Memory(m)) => Ok(m),
        _ => Err(fail(EmuError::Launch(
            "the harness exports no memory".into(),
        ))),
    }
}

fn harness_bytes(c: &mut Ctx<'_>, addr: u32, len: u32) -> wasmtime::Result<Vec<u8>> {
    let memory = harness_memory(c)?;
    let data = memory.data(&*c);
    let end = addr as usize + len as usize;
    data.get(addr as usize..end)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            fail(EmuError::Usage(format!(
                "harness memory {addr:#x}..{end:#x} is out of bounds"
            )))
        })
}

fn harness_string(c: &mut Ctx<'_>, addr: u32) -> wasmtime::Result<String> {
    let memory = harness_memory(c)?;
    let data = memory.data(&*c);
    let tail = data.get(addr as usize..).unwrap_or_default();
    let end = tail.iter().take(4096).position(|&b| b == 0).unwrap_or(0);
    Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
}

/// Define the host API on the harness's linker.
pub(crate) fn define(linker: &mut Linker<HarnessState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "hthread_dev_open", |mut c: Ctx<'_>, cluster: i32| {
        cluster_ok(&c, cluster, "hthread_dev_open")?;
        c.data_mut().open.insert(cluster);
        Ok(0i32)
    })?;
    linker.func_wrap(
        "env",
        "hthread_dev_close",
        |mut c: Ctx<'_>, cluster: i32| {
            cluster_ok(&c, cluster, "hthread_dev_close")?;
            let state = c.data_mut();
            state.open.remove(&cluster);
            state.loaded.remove(&cluster);
            Ok(0i32)
        },
    )?;
    linker.func_wrap(
        "env",
        "hthread_dat_load",
        |mut c: Ctx<'_>, cluster: i32, name: i32| {
            cluster_ok(&c, cluster, "hthread_dat_load")?;
            if !c.data().open.contains(&cluster) {
                return Err(fail(EmuError::Usage(format!(
                    "hthread_dat_load({cluster}): device not opened"
                ))));
            }
            let name = harness_string(&mut c, name as u32)?;
            if name.len() < 5 || !name.ends_with(".dat") {
                return Err(fail(EmuError::Usage(format!(
                    "hthread_dat_load({cluster}, \"{name}\"): expected a device image name ending in .dat"
                ))));
            }
            c.data_mut().loaded.insert(cluster);
            Ok(0i32)
        },
    )?;
    linker.func_wrap(
        "env",
        "hthread_dat_unload",
        |mut c: Ctx<'_>, cluster: i32| {
            cluster_ok(&c, cluster, "hthread_dat_unload")?;
            c.data_mut().loaded.remove(&cluster);
            Ok(0i32)
        },
    )?;
    linker.func_wrap(
        "env",
        "hthread_get_avail_threads",
        |c: Ctx<'_>, cluster: i32| {
            cluster_ok(&c, cluster, "hthread_get_avail_threads")?;
            Ok(c.data().launch.cores as i32)
        },
    )?;
    linker.func_wrap(
        "env",
        "hthread_group_create",
        |mut c: Ctx<'_>,
         cluster: i32,
         threads: i32,
         name: i32,
         nscalar: i32,
         nptr: i32,
         args: i32| { group_create(&mut c, cluster, threads, name, nscalar, nptr, args) },
    )?;
    linker.func_wrap("env", "hthread_group_wait", |mut c: Ctx<'_>, group: i32| {
        group_wait(&mut c, group).map(|()| 0i32)
    })?;
    linker.func_wrap(
        "env",
        "hthread_group_destroy",
        |mut c: Ctx<'_>, group: i32| match c.data().groups.get(&group) {
            None => Err(fail(EmuError::Usage(format!(
                "hthread_group_destroy({group}): no such thread group"
            )))),
            Some(g) if g.started.is_some() => Err(fail(EmuError::Usage(format!(
                "hthread_group_destroy({group}): group is still running"
            )))),
            Some(_) => {
                c.data_mut().groups.remove(&group);
                Ok(0i32)
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "hthread_barrier_create",
        |mut c: Ctx<'_>, cluster: i32| {
            cluster_ok(&c, cluster, "hthread_barrier_create")?;
            let barriers = &mut c.data_mut().barriers;
            match (0..MAX_BARRIERS).find(|id| !barriers.contains(id)) {
                Some(id) => {
                    barriers.insert(id);
                    Ok(id)
                }
                None => Ok(-1),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "hthread_barrier_destroy",
        |mut c: Ctx<'_>, id: i32| {
            c.data_mut().barriers.remove(&id);
            0i32
        },
    )?;
    linker.func_wrap(
        "mtswarm",
        "ddr_register",
        |mut c: Ctx<'_>, cluster: i32, ptr: i32, bytes: i32, flags: i32| {
            ddr_register(&mut c, cluster, ptr as u32, bytes as u32, flags)
        },
    )?;
    linker.func_wrap("mtswarm", "ddr_release", |mut c: Ctx<'_>, ptr: i32| {
        let allocations = &mut c.data_mut().allocations;
        match allocations.iter().position(|a| a.host == ptr as u32) {
            Some(i) => {
                allocations.remove(i);
                Ok(())
            }
            None => Err(fail(EmuError::Usage(format!(
                "hthread_free({ptr:#x}): not an hthread_malloc pointer"
            )))),
        }
    })?;
    linker.func_wrap("mtswarm", "group_exec", |mut c: Ctx<'_>, group: i32| {
        let state = c.data_mut();
        let busy = state.groups.values().any(|g| g.started.is_some());
        match state.groups.get_mut(&group) {
            None => Err(fail(EmuError::Usage(format!(
                "hthread_group_exec({group}): no such thread group"
            )))),
            Some(g) if busy => Err(fail(EmuError::Usage(format!(
                "hthread_group_exec({group}): cluster {} is already running a group",
                g.cluster
            )))),
            Some(g) => {
                g.started = Some(Instant::now());
                Ok(0i32)
            }
        }
    })?;
    Ok(())
}

fn ddr_register(
    c: &mut Ctx<'_>,
    cluster: i32,
    ptr: u32,
    bytes: u32,
    flags: i32,
) -> wasmtime::Result<i32> {
    cluster_ok(c, cluster, "hthread_malloc")?;
    if !(HT_MEM_RO..=HT_MEM_RW).contains(&flags) {
        return Err(fail(EmuError::Usage(
            "hthread_malloc: flags must be HT_MEM_RO, HT_MEM_WO or HT_MEM_RW".into(),
        )));
    }
    let state = c.data_mut();
    let in_use: u64 = state
        .allocations
        .iter()
        .filter(|a| a.cluster == cluster)
        .map(|a| u64::from(a.bytes))
        .sum();
    let capacity = state.launch.spec.ddr_bytes_per_cluster;
    if in_use + u64::from(bytes) > capacity {
        return Err(fail(EmuError::Capacity(format!(
            "hthread_malloc({cluster}, {bytes}): DDR capacity exceeded ({capacity} bytes per cluster, {in_use} in use)"
        ))));
    }
    state.allocations.push(Allocation {
        host: ptr,
        bytes,
        cluster,
        flags,
    });
    Ok(0)
}

fn group_create(
    c: &mut Ctx<'_>,
    cluster: i32,
    threads: i32,
    name: i32,
    nscalar: i32,
    nptr: i32,
    args: i32,
) -> wasmtime::Result<i32> {
    cluster_ok(c, cluster, "hthread_group_create")?;
    let (per_cluster, avail) = (
        c.data().launch.spec.cores_per_cluster as i32,
        c.data().launch.cores as i32,
    );
    if !c.data().open.contains(&cluster) || !c.data().loaded.contains(&cluster) {
        return Err(fail(EmuError::Usage(format!(
            "hthread_group_create({cluster}): open the device and load the kernel image first"
        ))));
    }
    if threads < 1 {
        return Err(fail(EmuError::Usage(format!(
            "hthread_group_create: {threads} threads requested"
        ))));
    }
    if threads > per_cluster {
        return Err(fail(EmuError::Capacity(format!(
            "hthread_group_create({cluster}, {threads}): a cluster has {per_cluster} cores (cores_per_cluster)"
        ))));
    }
    if threads > avail {
        return Err(fail(EmuError::Capacity(format!(
            "hthread_group_create({cluster}, {threads}): the slice provides {avail} cores"
        ))));
    }
    if nscalar < 0 || nptr < 0 || nscalar + nptr > MAX_ARGS {
        return Err(fail(EmuError::Usage(format!(
            "hthread_group_create: {nscalar} scalar + {nptr} pointer arguments (at most {MAX_ARGS})"
        ))));
    }
    let kernel = harness_string(c, name as u32)?;
    if kernel.is_empty() || kernel.len() >= 128 {
        return Err(fail(EmuError::Usage(
            "hthread_group_create: bad kernel function name".into(),
        )));
    }
    let count = (nscalar + nptr) as u32;
    let raw = harness_bytes(c, args as u32, count * 8)?;
    let args = raw
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]))
        .collect();
    let state = c.data_mut();
    if state.groups.len() >= MAX_GROUPS {
        return Ok(-1);
    }
    let id = (0..MAX_GROUPS as i32)
        .find(|id| !state.groups.contains_key(id))
        .unwrap_or(-1);
    state.groups.insert(
        id,
        Group {
            cluster,
            threads: threads as u32,
            kernel,
            args,
            nscalar: nscalar as usize,
            started: None,
        },
    );
    Ok(id)
}

/// The device memory of the launch, created (and the kernel image
/// written) on first use, grown to hold `ddr_len` bytes of buffers.
fn device_memory(state: &mut HarnessState, ddr_len: u64) -> Result<DeviceMemory, EmuError> {
    let layout = &state.launch.device.layout;
    let pages = layout
        .pages_for(ddr_len + BUFFER_ALIGN)
        .map_err(|e| match e {
            crate::HwError::Capacity(m) => EmuError::Capacity(m),
            other => EmuError::Launch(other.to_string()),
        })?;
    if let Some(memory) = &state.memory {
        memory.ensure_pages(pages)?;
        return Ok(memory.clone());
    }
    let ty = wasmtime::MemoryType::shared(pages as u32, MAX_PAGES as u32);
    let shared = SharedMemory::new(engine()?, ty)
        .map_err(|e| EmuError::Capacity(format!("cannot create device memory: {e}")))?;
    let memory = DeviceMemory::new(shared);
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
fn group_wait(c: &mut Ctx<'_>, id: i32) -> wasmtime::Result<()> {
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
    let layout = launch.device.layout.clone();

    // Place the buffers: read-only first, each 128-byte aligned.
    let allocations = c.data().allocations.clone();
    let mut order: Vec<usize> = (0..allocations.len()).collect();
    order.sort_by_key(|&i| (allocations[i].flags != HT_MEM_RO, i));
    let mut placed = vec![0u32; allocations.len()];
    let mut offset = 0u64;
    let mut read_only_len = 0u64;
    for &i in &order {
        placed[i] = layout.ddr_lo + offset as u32;
        offset += u64::from(allocations[i].bytes).div_ceil(BUFFER_ALIGN) * BUFFER_ALIGN;
        if allocations[i].flags == HT_MEM_RO {
            read_only_len = offset;
        }
    }
    let memory = device_memory(c.data_mut(), offset).map_err(fail)?;
    let mut names: Vec<String> = allocations
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
        .collect();

    // Translate pointer arguments into device addresses.
    let mut device_args = args.clone();
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
        *arg = u64::from(placed[i]) + (host - u64::from(allocations[i].host));
        names[i].push_str(&format!(", kernel argument {k}"));
    }
    let buffers = allocations
        .iter()
        .enumerate()
        .map(|(i, a)| DdrBuffer {
            span: Span::new(placed[i], a.bytes),
            read_only: a.flags == HT_MEM_RO,
            name: format!("{})", names[i]),
        })
        .collect();

    // Copy in: inputs as the harness wrote them, outputs poisoned.
    for (i, a) in allocations.iter().enumerate() {
        if a.flags == HT_MEM_WO {
            memory
                .fill(u64::from(placed[i]), u64::from(a.bytes), 0xff)
                .map_err(fail)?;
        } else {
            let bytes = harness_bytes(c, a.host, a.bytes)?;
            memory.write(u64::from(placed[i]), &bytes).map_err(fail)?;
        }
    }

    let shared = Arc::new(GroupShared {
        spec: launch.spec.clone(),
        device: launch.device.clone(),
        module: launch.module.clone(),
        memory: memory.clone(),
        threads,
        ddr: DdrMap {
            len: offset as u32,
            read_only_len: read_only_len as u32,
            buffers,
        },
        barrier_ids: c.data().barriers.clone(),
        sync: Barriers::new(threads, launch.spec.model.barrier_cycles as f64),
        abort: launch.abort.clone(),
        output: launch.output.clone(),
        niceness: launch.niceness,
    });
    let figures = cores::run(&shared, &kernel, &device_args).map_err(fail)?;

    match launch.fault {
        Some(Fault::Hang) => {
            // Never returns by itself: the launch's timeout stops it.
            while !launch.abort.is_raised() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            return Err(fail(EmuError::Aborted));
        }
        Some(Fault::Crash) => return Err(fail(EmuError::Crash(libc::SIGSEGV))),
        Some(Fault::Wrong) => corrupt_outputs(&memory, &allocations, &placed).map_err(fail)?,
        None => {}
    }

    // Copy out what the kernel may write.
    let harness = harness_memory(c)?;
    for (i, a) in allocations.iter().enumerate() {
        if a.flags & HT_MEM_WO == 0 {
            continue;
        }
        let bytes = memory
            .read(u64::from(placed[i]), u64::from(a.bytes))
            .map_err(fail)?;
        harness
            .write(&mut *c, a.host as usize, &bytes)
            .map_err(|e| fail(EmuError::Usage(format!("copying DDR buffer {i} back: {e}"))))?;
    }
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
