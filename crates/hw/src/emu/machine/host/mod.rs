//! The hthreads host API as the harness imports it.
//!
//! The harness allocates its DDR buffers in its own memory (the C shim
//! `emu_host_shim.c` registers each with `mtswarm.ddr_register`); devices,
//! images, groups and barriers are bookkeeping here, checked as the
//! board's runtime checks them. `hthread_group_wait` runs the group
//! ([`group`]): the buffers are placed in device memory (read-only ones
//! first, so one bound protects them all), read-only and read-write
//! buffers copied in, write-only ones poisoned (all bits set: NaN as a
//! double), the kernel's pointer arguments translated, the cores run, and
//! writable buffers copied back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use wasmtime::{Caller, Extern, Linker, Module};
use wasmtime_wasi::p1::WasiP1Ctx;

use super::memory::DeviceMemory;
use super::sync::Abort;
use super::{DeviceOutput, EmuError};
use crate::emu::instrument::Device;
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

mod group;

use group::group_wait;

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
    define_devices(linker)?;
    define_groups(linker)?;
    define_barriers(linker)?;
    define_ddr(linker)
}

/// Opening devices and loading device images on the clusters.
fn define_devices(linker: &mut Linker<HarnessState>) -> wasmtime::Result<()> {
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
    Ok(())
}

/// Thread groups: created, started (by the C shim's `hthread_group_exec`), waited for (the run itself) and destroyed.
fn define_groups(linker: &mut Linker<HarnessState>) -> wasmtime::Result<()> {
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
    Ok(())
}

/// Barrier ids for kernels that synchronise.
fn define_barriers(linker: &mut Linker<HarnessState>) -> wasmtime::Result<()> {
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
    Ok(())
}

/// DDR buffers the harness allocated, as the C shim registers and releases them.
fn define_ddr(linker: &mut Linker<HarnessState>) -> wasmtime::Result<()> {
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
