//! The device API as host functions: what a core's instance imports.
//!
//! Each function runs on the calling core's thread with that core's state
//! ([`CoreState`]). Whatever touches time first folds the counters the
//! instrumented code accumulated into the core's clock
//! ([`super::model::CoreClock::fold`]) and zeroes them; the counters are
//! globals of the core's own instance, which device code cannot address.

use std::sync::Arc;

use wasmtime::{Caller, Global, Linker, Val};

use super::model::{CoreClock, Issued, Level};
use super::places::{self, Place, Region};
use super::scratch::Scratchpad;
use super::{EmuError, GroupShared, printf};
use crate::emu::contract::{DeviceFn, IMPORT_MODULE, Import};
use crate::emu::instrument::globals::Counter;
use crate::emu::layout::BUFFER_ALIGN;

/// One core of a running group.
pub(crate) struct CoreState {
    pub(crate) id: u32,
    pub(crate) shared: Arc<GroupShared>,
    pub(crate) clock: CoreClock,
    /// The instance's counter globals, in `Counter::ALL` order.
    pub(crate) counters: Vec<Global>,
    regions: Vec<Region>,
    am: Scratchpad,
    sm: Scratchpad,
}

impl CoreState {
    pub(crate) fn new(id: u32, shared: Arc<GroupShared>) -> Self {
        let layout = &shared.device.layout;
        let spec = &shared.spec;
        let regions = places::regions(layout, &shared.ddr, id);
        Self {
            id,
            clock: CoreClock::new(shared.threads),
            counters: Vec::new(),
            regions,
            am: Scratchpad::new(
                layout.am(id),
                "AM",
                "vector_malloc",
                "vector_free",
                spec.am_max_buffers,
            ),
            sm: Scratchpad::new(
                layout.sm(id),
                "SM",
                "scalar_malloc",
                "scalar_free",
                spec.sm_max_buffers,
            ),
            shared,
        }
    }
}

pub(super) type Ctx<'a> = Caller<'a, CoreState>;

fn err(e: EmuError) -> wasmtime::Error {
    wasmtime::Error::new(e)
}

/// Fold the instance's counters into the core's clock.
pub(crate) fn fold(caller: &mut Ctx<'_>) -> wasmtime::Result<()> {
    let mut values = [0u64; 10];
    let counters = caller.data().counters.clone();
    for (value, global) in values.iter_mut().zip(&counters) {
        if let Val::I64(v) = global.get(&mut *caller) {
            *value = v as u64;
        }
        global.set(&mut *caller, Val::I64(0))?;
    }
    let issued = Issued::from_values(values);
    let state = caller.data_mut();
    let spec = state.shared.spec.clone();
    state.clock.fold(&issued, &spec);
    Ok(())
}

fn barrier(caller: &mut Ctx<'_>, id: i32, ncores: i32, who: &str) -> wasmtime::Result<()> {
    let (core, threads) = (caller.data().id, caller.data().shared.threads);
    if !caller.data().shared.barrier_ids.contains(&id) {
        return Err(err(EmuError::Usage(format!(
            "{who}({id}) on core {core}: no such barrier (use hthread_barrier_create)"
        ))));
    }
    if ncores < 1 || ncores as u32 > threads {
        return Err(err(EmuError::Usage(format!(
            "{who}({id}, {ncores}) on core {core}: the group has {threads} cores"
        ))));
    }
    fold(caller)?;
    let shared = caller.data().shared.clone();
    let clk = caller.data().clock.clk;
    let release = shared
        .sync
        .arrive(core, id, ncores as u32, clk, &shared.abort)
        .map_err(err)?;
    caller.data_mut().clock.stall_until(release);
    Ok(())
}

/// The place of `[addr, addr + len)` for a transfer by this core, or the
/// error naming it.
fn endpoint(
    state: &CoreState,
    who: &str,
    end: &str,
    addr: u64,
    len: u64,
    write: bool,
) -> Result<Level, EmuError> {
    let Some(region) = places::region_of(&state.regions, addr, len) else {
        return Err(EmuError::Usage(format!(
            "{who} on core {}: {end} {addr:#x}..{:#x} is not one memory the core may use: {}",
            state.id,
            addr + len,
            places::describe(
                &state.shared.device.layout,
                &state.shared.ddr,
                state.id,
                addr
            )
        )));
    };
    if write && region.read_only {
        return Err(EmuError::Usage(format!(
            "{who} on core {}: {end} {addr:#x} is read-only ({})",
            state.id,
            places::describe(
                &state.shared.device.layout,
                &state.shared.ddr,
                state.id,
                addr
            )
        )));
    }
    Ok(match region.place {
        Place::Ddr => Level::Ddr,
        Place::Gsm => Level::Gsm,
        Place::Stack | Place::Sm | Place::Am => Level::Local,
    })
}

#[allow(clippy::too_many_arguments)]
fn dma_p2p(
    caller: &mut Ctx<'_>,
    src: u32,
    src_rows: u32,
    src_row_bytes: u32,
    src_gap: i32,
    dst: u32,
    dst_rows: u32,
    dst_row_bytes: u32,
    dst_gap: i32,
) -> wasmtime::Result<u32> {
    let core = caller.data().id;
    if src == 0
        || dst == 0
        || src_rows == 0
        || dst_rows == 0
        || src_row_bytes == 0
        || dst_row_bytes == 0
        || src_gap < 0
        || dst_gap < 0
    {
        return Err(err(EmuError::Usage(format!(
            "dma_p2p on core {core}: null pointer, empty rows or negative row gap (src {src:#x} \
             {src_rows}x{src_row_bytes} gap {src_gap}, dst {dst:#x} {dst_rows}x{dst_row_bytes} gap {dst_gap})"
        ))));
    }
    let total = u64::from(src_rows) * u64::from(src_row_bytes);
    if total != u64::from(dst_rows) * u64::from(dst_row_bytes) {
        return Err(err(EmuError::Usage(format!(
            "dma_p2p on core {core}: source has {total} bytes, destination {}",
            u64::from(dst_rows) * u64::from(dst_row_bytes)
        ))));
    }
    let extent = |rows: u32, row: u32, gap: i32| {
        u64::from(rows - 1) * (u64::from(row) + gap as u64) + u64::from(row)
    };
    let (src, dst) = (u64::from(src), u64::from(dst));
    let src_len = extent(src_rows, src_row_bytes, src_gap);
    let dst_len = extent(dst_rows, dst_row_bytes, dst_gap);
    let state = caller.data();
    let src_level = endpoint(state, "dma_p2p", "source", src, src_len, false).map_err(err)?;
    let dst_level = endpoint(state, "dma_p2p", "destination", dst, dst_len, true).map_err(err)?;
    // Move the data now; the model decides when it is visible as done.
    let memory = &state.shared.memory;
    let (mut s, mut d) = (src, dst);
    let (mut s_left, mut d_left, mut remaining) =
        (u64::from(src_row_bytes), u64::from(dst_row_bytes), total);
    while remaining > 0 {
        let n = s_left.min(d_left);
        memory.copy_within(s, d, n).map_err(err)?;
        s += n;
        d += n;
        s_left -= n;
        d_left -= n;
        remaining -= n;
        if s_left == 0 {
            s += src_gap as u64;
            s_left = u64::from(src_row_bytes);
        }
        if d_left == 0 {
            d += dst_gap as u64;
            d_left = u64::from(dst_row_bytes);
        }
    }
    fold(caller)?;
    let state = caller.data_mut();
    let spec = state.shared.spec.clone();
    Ok(state.clock.dma(total, src_level, dst_level, &spec))
}

fn dma_channel(caller: &Ctx<'_>, channel: u32, who: &str) -> wasmtime::Result<()> {
    if caller.data().clock.issued(channel) {
        Ok(())
    } else {
        Err(err(EmuError::Usage(format!(
            "{who}({channel}) on core {}: no such transfer",
            caller.data().id
        ))))
    }
}

/// `memcpy`, `memmove` (`src` some) and `memset` (`src` none): each piece
/// of each range is charged by the memory it is in, as direct accesses of
/// up to 128 bytes.
fn memory_fn(
    caller: &mut Ctx<'_>,
    who: &str,
    dst: u32,
    src: Option<u32>,
    value: u8,
    len: u32,
) -> wasmtime::Result<u32> {
    if len == 0 {
        return Ok(dst);
    }
    let mut issued = Issued::default();
    {
        let state = caller.data();
        let mut ranges = vec![(u64::from(dst), true)];
        ranges.extend(src.map(|s| (u64::from(s), false)));
        for (start, write) in ranges {
            let end = start + u64::from(len);
            let mut at = start;
            while at < end {
                let Some(region) = places::region_of(&state.regions, at, 1) else {
                    let end_name = if write { "destination" } else { "source" };
                    endpoint(state, who, end_name, at, end - at, write).map_err(err)?;
                    break;
                };
                if write && region.read_only {
                    endpoint(state, who, "destination", at, 1, true).map_err(err)?;
                }
                let piece = end.min(region.span.hi()) - at;
                let requests = piece.div_ceil(BUFFER_ALIGN);
                let bytes = piece.div_ceil(8) * 8;
                match region.place {
                    Place::Am => issued.am_bulk_bytes += piece,
                    Place::Sm | Place::Stack => issued.sm_bulk_bytes += bytes,
                    Place::Gsm => {
                        issued.gsm_requests += requests;
                        issued.gsm_bytes += bytes;
                    }
                    Place::Ddr => {
                        issued.ddr_requests += requests;
                        issued.ddr_bytes += bytes;
                    }
                }
                at += piece;
            }
        }
        let memory = &state.shared.memory;
        match src {
            Some(s) => memory.copy_within(u64::from(s), u64::from(dst), u64::from(len)),
            None => memory.fill(u64::from(dst), u64::from(len), value),
        }
        .map_err(err)?;
    }
    fold(caller)?;
    let state = caller.data_mut();
    let spec = state.shared.spec.clone();
    state.clock.fold(&issued, &spec);
    Ok(dst)
}

/// Define every import of the contract the module uses.
pub(crate) fn define(linker: &mut Linker<CoreState>, imports: &[&Import]) -> wasmtime::Result<()> {
    for import in imports {
        let name = import.name;
        let defined = match import.kind {
            DeviceFn::Api => {
                define_core_api(linker, name)?
                    || define_allocation(linker, name)?
                    || define_dma(linker, name)?
            }
            DeviceFn::Memory => define_memory(linker, name)?,
            DeviceFn::Libm => {
                super::libm::define(linker, name)?;
                true
            }
        };
        if !defined {
            return Err(wasmtime::Error::msg(format!(
                "device import `{name}` has no implementation"
            )));
        }
    }
    Ok(())
}

/// The core's identity, barriers, output and clock; whether `name` is one.
fn define_core_api(linker: &mut Linker<CoreState>, name: &'static str) -> wasmtime::Result<bool> {
    let m = IMPORT_MODULE;
    match name {
        "get_thread_id" | "get_core_id" => {
            linker.func_wrap(m, name, |c: Ctx<'_>| c.data().id as i32)?;
        }
        "get_group_size" => {
            linker.func_wrap(m, name, |c: Ctx<'_>| c.data().shared.threads as i32)?;
        }
        "group_barrier" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, id: i32| {
                let n = c.data().shared.threads as i32;
                barrier(&mut c, id, n, "group_barrier")
            })?;
        }
        "core_barrier" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, id: i32, n: i32| {
                barrier(&mut c, id, n, "core_barrier")
            })?;
        }
        "hthread_printf" => {
            linker.func_wrap(m, name, |c: Ctx<'_>, fmt: i32, va: i32| {
                let shared = &c.data().shared;
                let text = printf::format(&shared.memory, fmt as u32, va as u32);
                shared.print(c.data().id, &text);
                text.len() as i32
            })?;
        }
        "get_clk" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>| -> wasmtime::Result<i32> {
                fold(&mut c)?;
                let cycles = f64::from(c.data().shared.spec.latency.get_clk);
                let clock = &mut c.data_mut().clock;
                clock.spend(cycles);
                Ok(clock.clk as u64 as u32 as i32)
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The scratchpads' allocators; whether `name` is one.
fn define_allocation(linker: &mut Linker<CoreState>, name: &'static str) -> wasmtime::Result<bool> {
    let m = IMPORT_MODULE;
    match name {
        "scalar_malloc" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, bytes: i32| {
                let id = c.data().id;
                c.data_mut()
                    .sm
                    .alloc(bytes as u32, id)
                    .map(|a| a as i32)
                    .map_err(err)
            })?;
        }
        "vector_malloc" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, bytes: i32| {
                let id = c.data().id;
                c.data_mut()
                    .am
                    .alloc(bytes as u32, id)
                    .map(|a| a as i32)
                    .map_err(err)
            })?;
        }
        "scalar_free" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, addr: i32| {
                let id = c.data().id;
                c.data_mut().sm.free(addr as u32, id).map_err(err)
            })?;
        }
        "vector_free" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, addr: i32| {
                let id = c.data().id;
                c.data_mut().am.free(addr as u32, id).map_err(err)
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The DMA engine: transfers and their channels; whether `name` is one.
fn define_dma(linker: &mut Linker<CoreState>, name: &'static str) -> wasmtime::Result<bool> {
    let m = IMPORT_MODULE;
    match name {
        "dma_p2p" => {
            linker.func_wrap(
                m,
                name,
                |mut c: Ctx<'_>,
                 src: i32,
                 src_rows: i32,
                 src_row_bytes: i32,
                 src_gap: i32,
                 dst: i32,
                 dst_rows: i32,
                 dst_row_bytes: i32,
                 dst_gap: i32,
                 _row_syn: i32,
                 _synmask: i32| {
                    dma_p2p(
                        &mut c,
                        src as u32,
                        src_rows as u32,
                        src_row_bytes as u32,
                        src_gap,
                        dst as u32,
                        dst_rows as u32,
                        dst_row_bytes as u32,
                        dst_gap,
                    )
                    .map(|ch| ch as i32)
                },
            )?;
        }
        "dma_wait" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, ch: i32| {
                dma_channel(&c, ch as u32, "dma_wait")?;
                fold(&mut c)?;
                let clock = &mut c.data_mut().clock;
                let done = clock.done_at(ch as u32);
                clock.stall_until(done);
                Ok(())
            })?;
        }
        "dma_query" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, ch: i32| {
                dma_channel(&c, ch as u32, "dma_query")?;
                fold(&mut c)?;
                let clock = &c.data().clock;
                Ok(i32::from(clock.done_at(ch as u32) <= clock.clk))
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// `memcpy`, `memmove`, `memset`; whether `name` is one.
fn define_memory(linker: &mut Linker<CoreState>, name: &'static str) -> wasmtime::Result<bool> {
    let m = IMPORT_MODULE;
    match name {
        "memcpy" | "memmove" => {
            linker.func_wrap(m, name, move |mut c: Ctx<'_>, d: i32, s: i32, n: i32| {
                memory_fn(&mut c, name, d as u32, Some(s as u32), 0, n as u32).map(|r| r as i32)
            })?;
        }
        "memset" => {
            linker.func_wrap(m, name, |mut c: Ctx<'_>, d: i32, v: i32, n: i32| {
                memory_fn(&mut c, "memset", d as u32, None, v as u8, n as u32).map(|r| r as i32)
            })?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The counter globals of an instance, in `Counter::ALL` order.
pub(crate) fn counter_globals(
    instance: &wasmtime::Instance,
    store: &mut wasmtime::Store<CoreState>,
) -> Result<Vec<Global>, EmuError> {
    Counter::ALL
        .iter()
        .map(|c| {
            instance.get_global(&mut *store, c.export()).ok_or_else(|| {
                EmuError::Launch(format!("instrumented module lacks `{}`", c.export()))
            })
        })
        .collect()
}
