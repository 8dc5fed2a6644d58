//! The process's one WebAssembly engine, its compiled-module cache and the
//! epoch ticker that lets a launch stop running code.
//!
//! Compiling a module to machine code (Cranelift) is the dearest part of a
//! launch after the kernel itself, and a tuning job runs the same harness
//! hundreds of times and each candidate at least once more in a spot
//! re-run, so compiled modules are kept by the sha256 of their bytes (a
//! small bounded cache: the bytes decide the code). Every store polls the
//! engine's epoch, which a background thread advances every
//! [`EPOCH_TICK`]; a store whose launch was stopped (timeout, another
//! core's fault) then traps at its next loop header or call.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, Module, OptLevel};

use super::EmuError;

/// How often running code checks whether its launch was stopped.
const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Compiled modules kept.
const CACHED_MODULES: usize = 32;

/// The engine every launch of this process shares.
pub(crate) fn engine() -> Result<&'static Engine, EmuError> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let mut config = Config::new();
            config
                .wasm_threads(true)
                .shared_memory(true)
                .wasm_simd(true)
                .epoch_interruption(true)
                .cranelift_opt_level(OptLevel::Speed);
            let engine = Engine::new(&config).map_err(|e| e.to_string())?;
            let ticker = engine.weak();
            std::thread::Builder::new()
                .name("mt3000-epoch".into())
                .spawn(move || {
                    while let Some(engine) = ticker.upgrade() {
                        engine.increment_epoch();
                        drop(engine);
                        std::thread::sleep(EPOCH_TICK);
                    }
                })
                .map_err(|e| e.to_string())?;
            Ok(engine)
        })
        .as_ref()
        .map_err(|e| EmuError::Launch(format!("cannot start the WebAssembly engine: {e}")))
}

/// Compiled modules by the sha256 of their bytes, oldest first.
type ModuleCache = Mutex<VecDeque<([u8; 32], Module)>>;

/// `wasm` compiled for the engine, from the cache when these bytes were
/// compiled before.
pub(crate) fn compile(wasm: &[u8], what: &str) -> Result<Module, EmuError> {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    let key: [u8; 32] = Sha256::digest(wasm).into();
    let cache = CACHE.get_or_init(Default::default);
    if let Ok(cached) = cache.lock()
        && let Some((_, module)) = cached.iter().find(|(k, _)| *k == key)
    {
        return Ok(module.clone());
    }
    let module = Module::new(engine()?, wasm)
        .map_err(|e| EmuError::Launch(format!("cannot compile {what}: {e}")))?;
    if let Ok(mut cached) = cache.lock() {
        if cached.len() >= CACHED_MODULES {
            cached.pop_front();
        }
        cached.push_back((key, module.clone()));
    }
    Ok(module)
}
