//! One execution of a thread group: an instance of the instrumented kernel
//! per core, each on its own host thread, all on the launch's shared device
//! memory, joined when every core returned.
//!
//! Each instance starts with its stack pointer at the top of its core's
//! stack and the window, DDR and read-only bounds its checks read. A trap
//! of any core stops the group (the others are interrupted through the
//! engine's epoch, or woken at their barrier) and becomes the launch's
//! error: a recorded memory fault names the address and what is nearest.

use std::sync::Arc;

use wasmtime::{Instance, Linker, Store, Trap, UpdateDeadline, Val, ValType};

use super::device::{self, CoreState};
use super::engine::engine;
use super::places;
use super::{EmuError, GroupShared};
use crate::emu::instrument::globals::{Fault, STACK_POINTER_EXPORT, State, decode_info};

/// What one core did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CoreFigures {
    pub(crate) cycles: f64,
    pub(crate) flops: f64,
    pub(crate) dma_bytes: f64,
    pub(crate) ddr_bytes: f64,
    pub(crate) stall: f64,
}

/// Run `kernel` with `args` (raw 64-bit values, converted to each
/// parameter's type) on every core of the group.
pub(crate) fn run(
    shared: &Arc<GroupShared>,
    kernel: &str,
    args: &[u64],
) -> Result<Vec<CoreFigures>, EmuError> {
    let params = shared.device.kernels.get(kernel).ok_or_else(|| {
        EmuError::Launch(format!(
            "hthread_group_create: kernel function '{kernel}' not found in the device image \
             (declare it __global__)"
        ))
    })?;
    if params.len() != args.len() {
        return Err(EmuError::Usage(format!(
            "hthread_group_create: kernel '{kernel}' takes {} parameters, the host passes {}",
            params.len(),
            args.len()
        )));
    }
    let mut values = Vec::with_capacity(args.len());
    for (i, (ty, arg)) in params.iter().zip(args).enumerate() {
        values.push(match ty {
            wasmparser::ValType::I32 => Val::I32(*arg as u32 as i32),
            wasmparser::ValType::I64 => Val::I64(*arg as i64),
            other => {
                return Err(EmuError::Usage(format!(
                    "kernel '{kernel}' parameter {i} is {other}; parameters must be 64-bit \
                     integers or pointers (floating point scalars arrive as raw bits)"
                )));
            }
        });
    }
    let threads: Vec<_> = (0..shared.threads)
        .map(|core| {
            let shared = shared.clone();
            let values = values.clone();
            let kernel = kernel.to_owned();
            std::thread::Builder::new()
                .name(format!("mt3000-core-{core}"))
                .spawn(move || {
                    super::lower_priority(shared.niceness);
                    let result = run_core(core, &shared, &kernel, &values);
                    if let Err(e) = &result
                        && *e != EmuError::Aborted
                    {
                        shared.abort.raise(e.clone());
                    }
                    shared.sync.leave(&shared.abort);
                    if shared.abort.is_raised() {
                        shared.sync.wake_all();
                    }
                    result
                })
                .map_err(|e| EmuError::Launch(format!("cannot start core thread {core}: {e}")))
        })
        .collect();
    let mut figures = Vec::new();
    let mut first_error = None;
    for thread in threads {
        match thread {
            Ok(handle) => match handle.join() {
                Ok(Ok(f)) => figures.push(f),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(EmuError::Launch("a core thread panicked".into()));
                }
            },
            Err(e) => {
                shared.abort.raise(e.clone());
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = shared.abort.error() {
        return Err(e);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(figures),
    }
}

fn run_core(
    core: u32,
    shared: &Arc<GroupShared>,
    kernel: &str,
    args: &[Val],
) -> Result<CoreFigures, EmuError> {
    let engine = engine()?;
    let mut store = Store::new(engine, CoreState::new(core, shared.clone()));
    let abort = shared.abort.clone();
    store.epoch_deadline_callback(move |_| {
        if abort.is_raised() {
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Continue(1))
        }
    });
    store.set_epoch_deadline(1);
    let launch = |e: wasmtime::Error| EmuError::Launch(format!("core {core}: {e}"));
    let mut linker = Linker::new(engine);
    linker
        .define(&mut store, "env", "memory", shared.memory.shared().clone())
        .map_err(launch)?;
    device::define(&mut linker, &shared.device.imports).map_err(launch)?;
    let instance = linker
        .instantiate(&mut store, &shared.module)
        .map_err(launch)?;
    let counters = device::counter_globals(&instance, &mut store)?;
    store.data_mut().counters = counters;
    let layout = &shared.device.layout;
    let stack_top = layout.stack(core).hi() as u32;
    set_i32(&instance, &mut store, STACK_POINTER_EXPORT, stack_top)?;
    set_i32(
        &instance,
        &mut store,
        State::WindowLo.export(),
        layout.window(core).lo,
    )?;
    set_i32(
        &instance,
        &mut store,
        State::DdrLen.export(),
        shared.ddr.len,
    )?;
    set_i32(
        &instance,
        &mut store,
        State::DdrReadOnlyLen.export(),
        shared.ddr.read_only_len,
    )?;
    let func = instance
        .get_func(&mut store, kernel)
        .ok_or_else(|| EmuError::Launch(format!("kernel function '{kernel}' is not exported")))?;
    if let Err(e) = func.call(&mut store, args, &mut []) {
        return Err(core_error(core, e, &instance, &mut store, shared));
    }
    // The kernel returned: fold what it issued last, then its DMA drains.
    let counters = store.data().counters.clone();
    let mut values = [0u64; 10];
    for (v, g) in values.iter_mut().zip(&counters) {
        if let Val::I64(x) = g.get(&mut store) {
            *v = x as u64;
        }
    }
    let state = store.data_mut();
    let spec = shared.spec.clone();
    state
        .clock
        .fold(&super::model::Issued::from_values(values), &spec);
    state.clock.finish();
    let c = &state.clock;
    Ok(CoreFigures {
        cycles: c.clk,
        flops: c.flops,
        dma_bytes: c.dma_bytes,
        ddr_bytes: c.ddr_bytes,
        stall: c.stall,
    })
}

fn set_i32(
    instance: &Instance,
    store: &mut Store<CoreState>,
    name: &str,
    value: u32,
) -> Result<(), EmuError> {
    let global = instance
        .get_global(&mut *store, name)
        .ok_or_else(|| EmuError::Launch(format!("instrumented module lacks `{name}`")))?;
    if !matches!(global.ty(&*store).content(), ValType::I32) {
        return Err(EmuError::Launch(format!("`{name}` is not an i32 global")));
    }
    global
        .set(&mut *store, Val::I32(value as i32))
        .map_err(|e| EmuError::Launch(format!("setting `{name}`: {e}")))
}

/// The error a failed kernel call stands for.
fn core_error(
    core: u32,
    e: wasmtime::Error,
    instance: &Instance,
    store: &mut Store<CoreState>,
    shared: &GroupShared,
) -> EmuError {
    if let Some(emu) = e.downcast_ref::<EmuError>() {
        return emu.clone();
    }
    let trap = e.downcast_ref::<Trap>().copied();
    if trap == Some(Trap::Interrupt) && shared.abort.is_raised() {
        return EmuError::Aborted;
    }
    let read = |store: &mut Store<CoreState>, name: &str| {
        instance
            .get_global(&mut *store, name)
            .map(|g| g.get(&mut *store))
            .and_then(|v| v.i32())
            .unwrap_or(0)
    };
    let info = read(store, State::FaultInfo.export());
    let (bytes, store_bit, fault) = decode_info(info);
    if trap == Some(Trap::UnreachableCodeReached)
        && let Some(fault) = fault
    {
        let addr = u64::from(read(store, State::FaultAddress.export()) as u32);
        let what = if store_bit { "store" } else { "load" };
        let place = places::describe(&shared.device.layout, &shared.ddr, core, addr);
        let why = match fault {
            Fault::Outside => "outside every memory the core may use",
            Fault::ReadOnlyBuffer => "into a buffer the host allocated read-only (HT_MEM_RO)",
            Fault::ReadOnlyImage => "into the kernel's read-only data",
        };
        return EmuError::Fault(format!(
            "core {core}: {what} of {bytes} bytes at {addr:#x} {why}: {place}"
        ));
    }
    if trap == Some(Trap::StackOverflow) {
        return EmuError::Fault(format!(
            "core {core}: the host stack overflowed (unbounded recursion in the kernel?)"
        ));
    }
    let text = format!("{e:?}");
    let short: Vec<&str> = text.lines().take(8).collect();
    EmuError::Fault(format!(
        "core {core}: the kernel trapped: {}",
        short.join(" | ")
    ))
}
