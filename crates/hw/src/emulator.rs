//! The `emulator` backend: MT-3000 kernels compiled with the host C compiler
//! against the emulator's hthreads headers and runtime (shipped inside this
//! crate), run as a confined process, and measured in modeled cycles.
//!
//! The C sources under `crates/hw/emu/` are embedded with `include_str!` and
//! written to a cache directory keyed by their hash on first use, so an
//! installed binary needs nothing from the source tree. The chip spec reaches
//! the C runtime as a `key=value;...` string: baked into each build and passed
//! again in `$MTSWARM_SPEC` at run time, so a TOML change changes the model.
//!
//! The harness protocol (stdout lines, see `examples/kernels/README.md`):
//! `MTSWARM_EMU {json}` per `hthread_group_wait` (from the runtime),
//! `MTSWARM_RESULT {json}` per kernel execution (from the harness) and
//! `MTSWARM_ERROR {json}` when the runtime stops the program (capacity
//! exceeded, API misuse).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::HwError;
use crate::board::{
    Artifact, BackendKind, Board, BuildRequest, Counters, RunOutcome, RunRequest, RunSample, Slice,
};
use crate::device_check;
use crate::faults::{FaultConfig, FaultInjector};
use crate::plausibility::{self, ModelFigures};
use crate::sdk::{ProcessLimits, kernel_hash, run_confined};
use crate::spec::ChipSpec;

/// The emulator's C sources, relative path -> content.
const RUNTIME_SOURCES: &[(&str, &str)] = &[
    (
        "include/hthread_host.h",
        include_str!("../emu/include/hthread_host.h"),
    ),
    (
        "include/hthread_device.h",
        include_str!("../emu/include/hthread_device.h"),
    ),
    (
        "include/compiler/m3000.h",
        include_str!("../emu/include/compiler/m3000.h"),
    ),
    (
        "include/mtswarm_harness.h",
        include_str!("../emu/include/mtswarm_harness.h"),
    ),
    (
        "runtime/emu_runtime.c",
        include_str!("../emu/runtime/emu_runtime.c"),
    ),
];

/// Flags shared by every compile. `-fno-ivopts` only shortens the host
/// compile of the 1024-bit vector code; it changes no modeled cost.
const OPT_FLAGS: &[&str] = &[
    "-O2",
    "-fno-ivopts",
    "-Wall",
    "-Wno-psabi",
    "-Wno-unused-parameter",
];
/// CPU priority (nice increment) of an emulated launch.
///
/// On a real farm a launch runs on the board and costs the build host
/// nothing, so the host compiles the next candidates while the slice runs.
/// The emulator runs each DSP core of a launch as a host thread (24 per
/// cluster), and at equal priority those threads would take the host CPU
/// from the compiles that feed every slice: slices would finish their
/// launch quickly and then wait for the compiler, which no real farm does.
/// Launches therefore yield the CPU to everything else (compiles, the
/// daemons, nats-server). Emulated times are modeled, not measured, so a
/// slower launch reports the same figures; the native (`host`) backend
/// measures wall time and keeps its priority.
pub const EMULATED_LAUNCH_NICENESS: i32 = 19;
/// Instrumentation of device code: a basic-block hook for the scalar part of
/// the cycle model, and gcc's thread-sanitizer hooks on every load and store
/// (defined by the emulator runtime, never libtsan) so each access is charged
/// by the memory it touches. Function entry/exit hooks are not needed.
const KERNEL_INSTRUMENTATION: &[&str] = &[
    "-fsanitize-coverage=trace-pc",
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
];
/// Most output kept from a compiler or a harness.
const MAX_OUTPUT_BYTES: usize = 4 << 20;
/// Characters of output kept in errors and `output_tail`.
const TAIL_CHARS: usize = 4000;

/// Which flavour of the shared build/run machinery to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// Instrumented kernel, cycle model, modeled time.
    Emulated,
    /// Plain native build, wall-clock time.
    Native,
}

impl Flavor {
    fn backend(self) -> BackendKind {
        match self {
            Self::Emulated => BackendKind::Emulator,
            Self::Native => BackendKind::Host,
        }
    }
    fn runtime_object(self) -> &'static str {
        match self {
            Self::Emulated => "runtime-emu.o",
            Self::Native => "runtime-host.o",
        }
    }
}

/// Limits of a launched harness. CPU seconds are derived from the run's
/// timeout when not set.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLimits {
    pub address_space_bytes: Option<u64>,
    pub cpu_seconds: Option<u64>,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            // Each core thread reserves a stack and a malloc arena.
            address_space_bytes: Some(16 << 30),
            cpu_seconds: None,
        }
    }
}

/// Shared state of the emulator and host backends.
#[derive(Debug, Clone)]
pub(crate) struct Toolchain {
    pub(crate) slice: Slice,
    pub(crate) spec: ChipSpec,
    pub(crate) cache_dir: PathBuf,
    pub(crate) compiler: String,
    pub(crate) limits: RunLimits,
    /// Fault injection (emulator only; `None` = off).
    pub(crate) faults: Option<std::sync::Arc<FaultInjector>>,
}

impl Toolchain {
    /// The build and run settings of a board on `slice`, with `gcc` and the
    /// default cache directory. Rejects slices the chip cannot have: the
    /// emulator and host backends share the same runtime and its limits.
    pub(crate) fn new(slice: Slice, spec: ChipSpec, backend: BackendKind) -> Result<Self, HwError> {
        spec.validate()?;
        if slice.cores == 0 || slice.cores > spec.cores_per_cluster {
            return Err(HwError::Config(format!(
                "slice {} has {} cores; a cluster has 1..={} (cores_per_cluster)",
                slice.id(),
                slice.cores,
                spec.cores_per_cluster
            )));
        }
        if let Some(c) = slice.cluster
            && c >= spec.clusters
        {
            return Err(HwError::Config(format!(
                "slice {}: cluster {c} does not exist (clusters 0..{})",
                slice.id(),
                spec.clusters
            )));
        }
        Ok(Self {
            slice: Slice { backend, ..slice },
            spec,
            cache_dir: default_cache_dir(),
            compiler: "gcc".to_owned(),
            limits: RunLimits::default(),
            faults: None,
        })
    }
}

/// The default cache directory: `$MTSWARM_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/mtswarm`, else `~/.cache/mtswarm`, else the temp dir.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MTSWARM_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("mtswarm");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".cache").join("mtswarm");
    }
    std::env::temp_dir().join("mtswarm-cache")
}

/// The chip spec in the runtime's `key=value;...` form.
pub fn spec_string(spec: &ChipSpec) -> String {
    let m = &spec.model;
    let pairs: [(&str, f64); 23] = [
        ("clusters", f64::from(spec.clusters)),
        ("cores_per_cluster", f64::from(spec.cores_per_cluster)),
        ("vector_lanes", f64::from(spec.vector_lanes)),
        ("fma_per_lane", f64::from(spec.fma_per_lane)),
        ("scalar_issue_slots", f64::from(spec.scalar_issue_slots)),
        ("vector_issue_slots", f64::from(spec.vector_issue_slots)),
        ("clock_hz", spec.clock_hz),
        ("sm_bytes", spec.sm_bytes as f64),
        ("sm_max_buffers", f64::from(spec.sm_max_buffers)),
        ("am_bytes", spec.am_bytes as f64),
        ("am_max_buffers", f64::from(spec.am_max_buffers)),
        ("gsm_bytes", spec.gsm_bytes as f64),
        ("ddr_bytes_per_cluster", spec.ddr_bytes_per_cluster as f64),
        ("ddr_bandwidth", spec.ddr_bandwidth),
        ("dma_startup_cycles", spec.dma_startup_cycles as f64),
        ("latency.get_clk", f64::from(spec.latency.get_clk)),
        ("latency.vlddw", f64::from(spec.latency.vlddw)),
        ("model.vector_mem_slots", f64::from(m.vector_mem_slots)),
        ("model.scalar_block_cycles", m.scalar_block_cycles),
        ("model.barrier_cycles", m.barrier_cycles as f64),
        ("model.gsm_bandwidth", m.gsm_bandwidth),
        ("model.ddr_latency_cycles", m.ddr_latency_cycles),
        ("model.gsm_latency_cycles", m.gsm_latency_cycles),
    ];
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v:e}"))
        .collect::<Vec<_>>()
        .join(";")
}

fn runtime_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let mut hasher = Sha256::new();
        for (path, content) in RUNTIME_SOURCES {
            hasher.update(path.as_bytes());
            hasher.update([0]);
            hasher.update((content.len() as u64).to_le_bytes());
            hasher.update(content.as_bytes());
        }
        hex::encode(hasher.finalize())
    })
}

fn tail(text: &str, max_chars: usize) -> String {
    let count = text.chars().count();
    if count <= max_chars {
        text.to_owned()
    } else {
        text.chars().skip(count - max_chars).collect()
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> HwError {
    HwError::Io(format!("{what} {}: {e}", path.display()))
}

/// Write the embedded sources into `<cache>/emu-<hash>/` unless already
/// there; returns that directory. Concurrent callers race safely: each
/// writes a private copy and renames it into place.
pub fn materialize_runtime(cache_dir: &Path) -> Result<PathBuf, HwError> {
    let dir = cache_dir.join(format!("emu-{}", &runtime_hash()[..16]));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache_dir).map_err(|e| io_err("creating", cache_dir, e))?;
    let staging = tempfile::Builder::new()
        .prefix(".emu-staging-")
        .tempdir_in(cache_dir)
        .map_err(|e| io_err("creating a staging dir in", cache_dir, e))?;
    for (rel, content) in RUNTIME_SOURCES {
        let path = staging.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_err("creating", parent, e))?;
        }
        std::fs::write(&path, content).map_err(|e| io_err("writing", &path, e))?;
    }
    std::fs::write(staging.path().join(".complete"), runtime_hash())
        .map_err(|e| io_err("writing", staging.path(), e))?;
    let staged = staging.keep();
    if std::fs::rename(&staged, &dir).is_err() {
        // Another process won the race; its copy is identical.
        let _ = std::fs::remove_dir_all(&staged);
        if !dir.join(".complete").exists() {
            return Err(HwError::Io(format!(
                "cannot install the emulator runtime into {}",
                dir.display()
            )));
        }
    }
    Ok(dir)
}

/// `gcc -dumpfullversion`, cached per compiler.
async fn compiler_version(compiler: &str) -> String {
    static VERSIONS: OnceLock<std::sync::Mutex<BTreeMap<String, String>>> = OnceLock::new();
    let cache = VERSIONS.get_or_init(Default::default);
    if let Some(v) = cache.lock().ok().and_then(|m| m.get(compiler).cloned()) {
        return v;
    }
    let version = match tokio::process::Command::new(compiler)
        .arg("-dumpfullversion")
        .output()
        .await
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => "unknown".to_owned(),
    };
    if let Ok(mut m) = cache.lock() {
        m.insert(compiler.to_owned(), version.clone());
    }
    version
}

fn check_defines(defines: &BTreeMap<String, String>) -> Result<(), HwError> {
    for (name, value) in defines {
        let mut chars = name.chars();
        let starts_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !starts_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(HwError::Config(format!(
                "define name `{name}` is not a C identifier"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(HwError::Config(format!(
                "define `{name}` has a control character in its value"
            )));
        }
    }
    Ok(())
}

/// Run one compiler command; its diagnostics become the error on failure.
///
/// The compiler is confined ([`crate::sandbox::build_policy`]): it reads
/// `reads` and the toolchain's own files (the system trees, or the install
/// tree of a compiler given by path), writes only `cwd`, has no network and
/// none of the daemon's environment, runs in its own PID namespace and may
/// not start more than [`crate::sandbox::BUILD_MAX_PROCESSES`] processes.
async fn compile_step(
    argv: Vec<String>,
    cwd: &Path,
    what: &str,
    reads: &[PathBuf],
) -> Result<String, HwError> {
    let mut reads = reads.to_vec();
    let path = std::env::var("PATH").ok();
    reads.extend(
        argv.first()
            .and_then(|p| crate::sandbox::toolchain_root(p, path.as_deref())),
    );
    let limits = ProcessLimits {
        sandbox: Some(crate::sandbox::build_policy(cwd, &reads)),
        ..ProcessLimits::default()
    };
    let out = run_confined(
        &argv,
        cwd,
        &BTreeMap::new(),
        Duration::from_secs(120),
        &limits,
        MAX_OUTPUT_BYTES,
    )
    .await
    .map_err(|e| match e {
        HwError::Timeout(t) => HwError::Compile(format!("{what}: compiler timed out after {t:?}")),
        other => other,
    })?;
    if out.status.success() {
        Ok(out.stderr)
    } else {
        let mut msg = tail(out.stderr.trim(), TAIL_CHARS);
        if msg.is_empty() {
            msg = format!("compiler exited with {}", out.status);
        }
        Err(HwError::Compile(format!("{what}: {msg}")))
    }
}

/// [`compile_step`] for a translation unit of the kernel directory: its
/// diagnostics are scrubbed of lines that point into, or quote, files
/// outside `allowed` (see [`device_check::scrub_diagnostics`]).
async fn compile_kernel_step(
    argv: Vec<String>,
    cwd: &Path,
    what: &str,
    allowed: &[PathBuf],
) -> Result<String, HwError> {
    match compile_step(argv, cwd, what, allowed).await {
        Ok(log) => Ok(device_check::scrub_diagnostics(&log, allowed)),
        Err(HwError::Compile(msg)) => Err(HwError::Compile(device_check::scrub_diagnostics(
            &msg, allowed,
        ))),
        Err(e) => Err(e),
    }
}

/// `nm` of an object: (undefined, defined) symbols.
async fn object_symbols(object: &Path) -> Result<(Vec<String>, Vec<String>), HwError> {
    let argv = vec!["nm".to_owned(), object.display().to_string()];
    let cwd = object.parent().unwrap_or(Path::new("/"));
    let limits = ProcessLimits {
        sandbox: Some(crate::sandbox::build_policy(cwd, &[])),
        ..ProcessLimits::default()
    };
    let out = run_confined(
        &argv,
        cwd,
        &BTreeMap::new(),
        Duration::from_secs(30),
        &limits,
        MAX_OUTPUT_BYTES,
    )
    .await?;
    if !out.status.success() {
        return Err(HwError::Compile(format!(
            "nm {}: {}",
            object.display(),
            tail(out.stderr.trim(), 500)
        )));
    }
    Ok(device_check::parse_nm(&out.stdout))
}

/// Compiles a translation unit that rarely changes between candidates
/// (`host.c`, the generated spec) through a content-addressed object cache
/// under `<runtime_dir>/objects/`, and places the object at `object`.
///
/// A tuning job builds the same kernel directory with a hundred different
/// defines, but the host program usually reads none of the tuned ones:
/// compiling it every time was about a third of each build's host CPU, CPU
/// that the emulated slices share with the builds. The key is what decides
/// the object: the translation unit after preprocessing, line markers
/// aside (so the defines and headers it really uses count, and those it
/// ignores do not), the
/// flags that are not preprocessor options, and the compiler version. The
/// compiler's warnings are kept with the object and replayed on a hit.
async fn compile_cached(
    argv: Vec<String>,
    object: &Path,
    runtime_dir: &Path,
    what: &str,
    reads: &[PathBuf],
) -> Result<String, HwError> {
    let cwd = object.parent().unwrap_or(runtime_dir).to_path_buf();
    let preprocessed = object.with_extension("i");
    let mut preprocess = Vec::with_capacity(argv.len());
    let mut flags = Vec::new();
    let mut args = argv.iter().peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-c" => preprocess.push("-E".to_owned()),
            "-o" => {
                args.next();
                preprocess.extend(["-o".to_owned(), preprocessed.display().to_string()]);
                continue;
            }
            "-I" => {
                preprocess.push(arg.clone());
                if let Some(dir) = args.next() {
                    preprocess.push(dir.clone());
                }
                continue;
            }
            _ => {
                preprocess.push(arg.clone());
                // Preprocessor options and the source path only shape the
                // preprocessed text, which is hashed itself.
                if !(arg.starts_with("-D") || arg.starts_with("-I") || !arg.starts_with('-')) {
                    flags.push(arg.clone());
                }
            }
        }
    }
    compile_step(preprocess, &cwd, what, reads).await?;
    let text = std::fs::read(&preprocessed).map_err(|e| io_err("reading", &preprocessed, e))?;
    let _ = std::fs::remove_file(&preprocessed);
    let compiler = argv.first().map(String::as_str).unwrap_or("cc");
    let mut hasher = Sha256::new();
    hasher.update(compiler.as_bytes());
    hasher.update(b"\0");
    hasher.update(compiler_version(compiler).await.as_bytes());
    hasher.update(b"\0");
    hasher.update(flags.join(" ").as_bytes());
    hasher.update(b"\0");
    // Line markers name the source's path (each build's own directory for
    // the generated spec); without -g they change nothing in the object.
    for line in text.split(|&b| b == b'\n') {
        if !line.starts_with(b"# ") {
            hasher.update(line);
            hasher.update(b"\n");
        }
    }
    let key = hex::encode(hasher.finalize());
    let cache = runtime_dir.join("objects");
    let cached = cache.join(format!("{}.o", &key[..32]));
    let cached_log = cache.join(format!("{}.log", &key[..32]));
    let cached_hash = cache.join(format!("{}.sha256", &key[..32]));
    // An object is reused only when its content still has the hash it was
    // stored with: a changed (poisoned or torn) entry is rebuilt.
    if cached.is_file() && verified(&cached, &cached_hash) {
        std::fs::copy(&cached, object).map_err(|e| io_err("copying", &cached, e))?;
        return Ok(std::fs::read_to_string(&cached_log).unwrap_or_default());
    }
    let log = compile_step(argv, &cwd, what, reads).await?;
    // Log first, object last: an object in the cache always has its log.
    std::fs::create_dir_all(&cache).map_err(|e| io_err("creating", &cache, e))?;
    let staging = cache.join(format!(".{}.{}.tmp", &key[..32], uuid::Uuid::new_v4()));
    let installed = std::fs::write(&cached_log, &log)
        .and_then(|()| std::fs::read(object))
        .and_then(|bytes| std::fs::write(&cached_hash, hex::encode(Sha256::digest(&bytes))))
        .and_then(|()| std::fs::copy(object, &staging))
        .and_then(|_| std::fs::rename(&staging, &cached));
    if let Err(e) = installed {
        // The cache is an optimisation: the build has its object anyway.
        let _ = std::fs::remove_file(&staging);
        tracing::debug!(error = %e, "could not cache {}", object.display());
    }
    Ok(log)
}

/// Whether `file`'s sha256 is the one recorded in `hash_file`.
fn verified(file: &Path, hash_file: &Path) -> bool {
    let (Ok(bytes), Ok(expected)) = (std::fs::read(file), std::fs::read_to_string(hash_file))
    else {
        return false;
    };
    let ok = hex::encode(Sha256::digest(&bytes)) == expected.trim();
    if !ok {
        tracing::warn!(file = %file.display(), "cached object does not match its recorded hash; rebuilding it");
    }
    ok
}

impl Toolchain {
    /// Compile the runtime for `flavor` once per cache directory.
    async fn runtime_object(&self, runtime_dir: &Path, flavor: Flavor) -> Result<PathBuf, HwError> {
        let object = runtime_dir.join(flavor.runtime_object());
        let object_hash = object.with_extension("o.sha256");
        if object.exists() && verified(&object, &object_hash) {
            return Ok(object);
        }
        let staging = runtime_dir.join(format!(
            ".{}.{}.tmp",
            flavor.runtime_object(),
            uuid::Uuid::new_v4()
        ));
        let mut argv = vec![self.compiler.clone()];
        argv.extend(OPT_FLAGS.iter().map(|s| (*s).to_owned()));
        if flavor == Flavor::Native {
            argv.push("-DMTSWARM_HOST_BACKEND".into());
        }
        argv.extend([
            "-pthread".into(),
            "-I".into(),
            runtime_dir.join("include").display().to_string(),
            "-c".into(),
            runtime_dir
                .join("runtime/emu_runtime.c")
                .display()
                .to_string(),
            "-o".into(),
            staging.display().to_string(),
        ]);
        compile_step(argv, runtime_dir, "emulator runtime", &[]).await?;
        let bytes = std::fs::read(&staging).map_err(|e| io_err("reading", &staging, e))?;
        std::fs::write(&object_hash, hex::encode(Sha256::digest(&bytes)))
            .map_err(|e| io_err("writing", &object_hash, e))?;
        std::fs::rename(&staging, &object).map_err(|e| io_err("installing", &object, e))?;
        Ok(object)
    }

    /// Preprocess kernel.c once to see what it is made of: refuse it when
    /// it opened a file outside `allowed` (the error names the file, never
    /// its content) or, for the emulator, when its own text switches the
    /// instrumentation off or dodges it ([`device_check`]). The preprocessed
    /// text is removed afterwards: it may hold an included file's content.
    async fn check_kernel_source(
        &self,
        kernel_dir: &Path,
        out_dir: &Path,
        allowed: &[PathBuf],
        defines: &[String],
        flavor: Flavor,
    ) -> Result<(), HwError> {
        let runtime_include = allowed.get(2).cloned().unwrap_or_default();
        let preprocessed = out_dir.join("kernel.check.i");
        let deps = out_dir.join("kernel.check.d");
        let mut argv = vec![self.compiler.clone(), "-E".into()];
        if flavor == Flavor::Native {
            argv.push("-DMTSWARM_HOST_BACKEND".into());
        }
        argv.extend([
            "-fno-diagnostics-show-caret".into(),
            "-I".into(),
            runtime_include.display().to_string(),
        ]);
        argv.extend(defines.iter().cloned());
        argv.extend([
            "-MD".into(),
            "-MF".into(),
            deps.display().to_string(),
            kernel_dir.join("kernel.c").display().to_string(),
            "-o".into(),
            preprocessed.display().to_string(),
        ]);
        let result = async {
            compile_kernel_step(argv, out_dir, "kernel.c", allowed).await?;
            let dep_text =
                std::fs::read_to_string(&deps).map_err(|e| io_err("reading", &deps, e))?;
            device_check::check_includes(&device_check::parse_deps(&dep_text), out_dir, allowed)?;
            if flavor == Flavor::Emulated {
                let text = std::fs::read_to_string(&preprocessed)
                    .map_err(|e| io_err("reading", &preprocessed, e))?;
                device_check::check_preprocessed(&text, kernel_dir)?;
            }
            Ok(())
        }
        .await;
        let _ = std::fs::remove_file(&preprocessed);
        let _ = std::fs::remove_file(&deps);
        result
    }

    pub(crate) async fn build(
        &self,
        request: &BuildRequest,
        flavor: Flavor,
    ) -> Result<Artifact, HwError> {
        check_defines(&request.defines)?;
        let kernel_dir = &request.kernel_dir;
        for file in ["kernel.c", "host.c"] {
            if !kernel_dir.join(file).is_file() {
                return Err(HwError::Kernel(format!(
                    "{}: missing {file}",
                    kernel_dir.display()
                )));
            }
        }
        let kernel_dir = kernel_dir
            .canonicalize()
            .map_err(|e| HwError::Kernel(format!("{}: {e}", kernel_dir.display())))?;
        let out_dir = &request.out_dir;
        std::fs::create_dir_all(out_dir).map_err(|e| io_err("creating", out_dir, e))?;
        let out_dir = out_dir
            .canonicalize()
            .map_err(|e| io_err("resolving", out_dir, e))?;
        let runtime_dir = materialize_runtime(&self.cache_dir)?;
        let runtime_object = self.runtime_object(&runtime_dir, flavor).await?;

        let spec_c = out_dir.join("mtswarm_spec.c");
        std::fs::write(
            &spec_c,
            format!(
                "/* generated by mtswarm: the chip spec this harness was built for */\nconst char mtswarm_spec_default[] = \"{}\";\n",
                spec_string(&self.spec)
            ),
        )
        .map_err(|e| io_err("writing", &spec_c, e))?;

        let include = runtime_dir.join("include").display().to_string();
        let defines: Vec<String> = request
            .defines
            .iter()
            .map(|(k, v)| format!("-D{k}={v}"))
            .collect();
        let compile = |source: PathBuf, object: &str, instrument: bool| {
            let mut argv = vec![self.compiler.clone()];
            argv.extend(OPT_FLAGS.iter().map(|s| (*s).to_owned()));
            if flavor == Flavor::Native {
                argv.push("-DMTSWARM_HOST_BACKEND".into());
            }
            if instrument {
                argv.extend(KERNEL_INSTRUMENTATION.iter().map(|s| (*s).to_owned()));
            }
            argv.extend(["-pthread".into(), "-I".into(), include.clone()]);
            argv.extend(defines.iter().cloned());
            argv.extend([
                "-c".into(),
                source.display().to_string(),
                "-o".into(),
                out_dir.join(object).display().to_string(),
            ]);
            argv
        };
        let instrument = flavor == Flavor::Emulated;
        // On x86-64 the kernel goes through assembly so that each basic block
        // can be charged by its instruction count (see `charge_basic_blocks`).
        let via_assembly = instrument && cfg!(target_arch = "x86_64");
        let mut kernel_argv = compile(
            kernel_dir.join("kernel.c"),
            if via_assembly { "kernel.s" } else { "kernel.o" },
            instrument,
        );
        if instrument {
            // Auto-vectorised scalar code would hide scalar work in packed
            // host instructions; MT-3000 vector work goes through intrinsics.
            kernel_argv.insert(1, "-fno-tree-vectorize".into());
            // Device stacks live in SM: frames are checked after compiling.
            kernel_argv.insert(1, "-fstack-usage".into());
        }
        if via_assembly && let Some(c) = kernel_argv.iter_mut().find(|a| a.as_str() == "-c") {
            *c = "-S".into();
        }
        // What the kernel's translation unit may read and quote: its own
        // directory, the emulator's headers and the toolchain's headers.
        let mut allowed = vec![kernel_dir.clone(), out_dir.clone()];
        allowed.push(
            runtime_dir
                .join("include")
                .canonicalize()
                .unwrap_or_else(|_| runtime_dir.join("include")),
        );
        allowed.extend(
            device_check::TOOLCHAIN_INCLUDE_ROOTS
                .iter()
                .map(PathBuf::from),
        );
        self.check_kernel_source(&kernel_dir, &out_dir, &allowed, &defines, flavor)
            .await?;
        // What every build step may read besides the toolchain.
        let reads = vec![kernel_dir.clone(), runtime_dir.clone()];
        let host_argv = compile(kernel_dir.join("host.c"), "host.o", false);
        let mut spec_argv = vec![self.compiler.clone(), "-c".into()];
        spec_argv.extend([
            spec_c.display().to_string(),
            "-o".into(),
            out_dir.join("mtswarm_spec.o").display().to_string(),
        ]);
        let host_object = out_dir.join("host.o");
        let spec_object = out_dir.join("mtswarm_spec.o");
        let (kernel_log, host_log, spec_log) = tokio::join!(
            compile_kernel_step(kernel_argv, &out_dir, "kernel.c", &allowed),
            compile_cached(host_argv, &host_object, &runtime_dir, "host.c", &reads),
            compile_cached(
                spec_argv,
                &spec_object,
                &runtime_dir,
                "mtswarm_spec.c",
                &reads
            ),
        );
        let mut log = kernel_log?;
        log.push_str(&host_log?);
        log.push_str(&spec_log?);
        if instrument {
            check_stack_frames(&out_dir.join("kernel.su"), &self.spec)?;
        }
        if via_assembly {
            let asm_path = out_dir.join("kernel.s");
            let asm =
                std::fs::read_to_string(&asm_path).map_err(|e| io_err("reading", &asm_path, e))?;
            let charged = charge_basic_blocks(&asm, &self.spec);
            let charged_path = out_dir.join("kernel.emu.s");
            std::fs::write(&charged_path, charged)
                .map_err(|e| io_err("writing", &charged_path, e))?;
            let argv = vec![
                self.compiler.clone(),
                "-c".into(),
                charged_path.display().to_string(),
                "-o".into(),
                out_dir.join("kernel.o").display().to_string(),
            ];
            log.push_str(&compile_step(argv, &out_dir, "kernel.emu.s", &reads).await?);
        }

        if instrument {
            // The object may call nothing outside the device contract and
            // define nothing the runtime, the C library or the harness use.
            let (undefined, defined) = object_symbols(&out_dir.join("kernel.o")).await?;
            let mut reserved: BTreeSet<String> = BTreeSet::new();
            for other in [runtime_object.clone(), host_object.clone()] {
                let (u, d) = object_symbols(&other).await?;
                reserved.extend(u);
                reserved.extend(d);
            }
            let source = std::fs::read_to_string(kernel_dir.join("kernel.c")).unwrap_or_default();
            device_check::check_symbols(&undefined, &defined, &reserved, &source)?;
        }

        let program = out_dir.join("harness");
        let mut link = vec![self.compiler.clone(), "-rdynamic".into(), "-pthread".into()];
        link.extend(
            ["kernel.o", "host.o", "mtswarm_spec.o"]
                .iter()
                .map(|o| out_dir.join(o).display().to_string()),
        );
        link.extend([
            runtime_object.display().to_string(),
            "-o".into(),
            program.display().to_string(),
            "-ldl".into(),
            "-lm".into(),
        ]);
        log.push_str(&compile_step(link, &out_dir, "link", &reads).await?);

        let version = compiler_version(&self.compiler).await;
        let flags = match flavor {
            Flavor::Emulated => format!(
                "-O2 -fno-tree-vectorize {}",
                KERNEL_INSTRUMENTATION.join(" ")
            ),
            Flavor::Native => "-O2".to_owned(),
        };
        Ok(Artifact {
            backend: flavor.backend(),
            dir: out_dir.clone(),
            program,
            kernel_hash: kernel_hash(&kernel_dir, &request.defines)?,
            toolchain: format!(
                "{} {version} {flags} ({} runtime {})",
                self.compiler,
                flavor.backend(),
                &runtime_hash()[..12]
            ),
            log: tail(&log, TAIL_CHARS),
            defines: request.defines.clone(),
            harness: crate::harness::harness_hashes(&kernel_dir)?,
            model: model_figures(&kernel_dir, &request.defines, &self.spec),
        })
    }

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
        // A fresh input seed per launch (see mtswarm_harness.h): inputs
        // differ in every execution, so a remembered answer fails.
        env.insert("MTSWARM_SEED".to_owned(), launch_seed().to_string());
        if flavor == Flavor::Emulated
            && let Some(fault) = self
                .faults
                .as_ref()
                .and_then(|f| f.next_launch(&self.slice.id()))
        {
            tracing::info!(slice.id = %self.slice.id(), fault = fault.env_value(), "injecting a configured fault into this launch");
            env.insert("MTSWARM_FAULT".to_owned(), fault.env_value().to_owned());
        }
        let host_threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let limits = ProcessLimits {
            cpu_seconds: Some(
                self.limits
                    .cpu_seconds
                    .unwrap_or(request.timeout.as_secs().saturating_add(1) * host_threads + 1),
            ),
            address_space_bytes: self.limits.address_space_bytes,
            nice: (flavor == Flavor::Emulated).then_some(EMULATED_LAUNCH_NICENESS),
            // Reads and writes only its own directory, no network, no
            // processes (so nothing it starts can outlive it).
            sandbox: Some(crate::sandbox::launch_policy(&artifact.dir)),
            ..ProcessLimits::default()
        };
        let out = run_confined(
            &argv,
            &artifact.dir,
            &env,
            request.timeout,
            &limits,
            MAX_OUTPUT_BYTES,
        )
        .await?;
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
}

/// The tune.toml `[model]` figures of a build, when the directory has them
/// (an expression that does not evaluate leaves the build unchecked against
/// the roofline, with a log line; the peak and bandwidth checks still hold).
fn model_figures(
    kernel_dir: &Path,
    defines: &BTreeMap<String, String>,
    spec: &ChipSpec,
) -> Option<ModelFigures> {
    if !kernel_dir.join("tune.toml").is_file() {
        return None;
    }
    let space = crate::tune::TuneSpace::load(kernel_dir)
        .map_err(|e| tracing::warn!(error = %e, "tune.toml: no roofline check for this build"))
        .ok()?;
    match space.model_figures(defines, spec) {
        Ok(figures) => figures.map(|(flops, bytes)| ModelFigures { flops, bytes }),
        Err(e) => {
            tracing::warn!(error = %e, "tune.toml [model]: no roofline check for this build");
            None
        }
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

/// The scalar-cost pass of the emulator build (x86-64 assembly of an
/// instrumented kernel): every `call __sanitizer_cov_trace_pc` that
/// `-fsanitize-coverage=trace-pc` put at the start of a basic block becomes
/// inline `addq`s of the block's cost, in thousandths of a cycle, to the
/// core's scalar counter (the larger of `model.scalar_block_cycles` and the
/// block's scalar instructions over `scalar_issue_slots`) and of its scalar
/// floating-point operations to the core's flop counter (an FMA counts two).
/// Not counted: packed SSE/AVX instructions (the host's rendering of the
/// 1024-bit vector unit, charged per intrinsic instead) and the intrinsics'
/// own bookkeeping (lines tagged `#mtswarm`). The call clobbered the flags
/// and caller-saved registers, so an `addq` in its place is safe.
///
/// Calls of `memcpy`, `memmove` and `memset` are renamed to the runtime's
/// charged versions (`mtswarm_dev_*`), so their bytes are memory traffic.
pub fn charge_basic_blocks(asm: &str, spec: &ChipSpec) -> String {
    let lines: Vec<&str> = asm.lines().collect();
    let slots = f64::from(spec.scalar_issue_slots.max(1));
    let bookkeeping = access_hook_bookkeeping(&lines);
    let mut out = String::with_capacity(asm.len() + asm.len() / 8);
    for (i, line) in lines.iter().enumerate() {
        if !is_trace_pc_call(line) {
            out.push_str(&rename_mem_calls(line));
            out.push('\n');
            continue;
        }
        let mut instructions = 0u32;
        let mut flops = 0u32;
        for (j, next) in lines.iter().enumerate().skip(i + 1) {
            let text = next.trim();
            if is_trace_pc_call(next) || is_label(next) {
                break;
            }
            if bookkeeping[j] {
                continue;
            }
            if let Some(mnemonic) = scalar_instruction(text) {
                instructions += 1;
                flops += scalar_flops(mnemonic);
                if mnemonic.starts_with('j') || mnemonic.starts_with("ret") {
                    break;
                }
            }
        }
        let cycles = (f64::from(instructions) / slots).max(spec.model.scalar_block_cycles);
        let milli = (cycles * 1000.0).round().max(0.0) as u64;
        out.push_str(&format!(
            "\taddq\t${milli}, %fs:mtswarm_issue@tpoff #mtswarm block of {instructions} instructions\n"
        ));
        if flops > 0 {
            out.push_str(&format!(
                "\taddq\t${flops}, %fs:mtswarm_issue@tpoff+{SCALAR_FLOPS_OFFSET} #mtswarm scalar flops\n"
            ));
        }
    }
    out
}

/// Lines that exist only because of the memory-access hooks, so they are
/// not the kernel's scalar work: each `call __tsan_*`, the argument set-up
/// right before it (writes of `%rdi`/`%rsi`) with the stack spills the call
/// forces, and the reloads right after it. Without this the hooks'
/// calling convention would make instrumented code look scalar-bound.
fn access_hook_bookkeeping(lines: &[&str]) -> Vec<bool> {
    let mut marked = vec![false; lines.len()];
    let is_hook = |line: &str| {
        let mut parts = line.split_whitespace();
        parts.next() == Some("call") && parts.next().is_some_and(|t| t.starts_with("__tsan_"))
    };
    let operands = |line: &str| -> Option<(String, String)> {
        let text = line.trim();
        let (mnemonic, rest) = text.split_once(char::is_whitespace)?;
        let rest = rest.trim();
        let (src, dst) = rest.rsplit_once(',')?;
        Some((format!("{mnemonic} {}", src.trim()), dst.trim().to_owned()))
    };
    const ARG_REGS: &[&str] = &["%rdi", "%edi", "%rsi", "%esi"];
    for (i, line) in lines.iter().enumerate() {
        if !is_hook(line) {
            continue;
        }
        marked[i] = true;
        // Backwards: argument set-up and spills, up to the block's start.
        let mut j = i;
        while j > 0 {
            j -= 1;
            let prev = lines[j];
            let text = prev.trim();
            if is_trace_pc_call(prev) || is_label(prev) || is_hook(prev) || marked[j] {
                break;
            }
            if text.is_empty() || text.starts_with('.') || text.starts_with('#') {
                continue;
            }
            match operands(prev) {
                Some((_, dst)) if ARG_REGS.contains(&dst.as_str()) || dst.ends_with("(%rsp)") => {
                    marked[j] = true;
                }
                _ => break,
            }
        }
        // Forwards: reloads of what the call clobbered.
        let mut k = i + 1;
        while k < lines.len() {
            let text = lines[k].trim();
            if text.is_empty() || text.starts_with('.') || text.starts_with('#') {
                k += 1;
                continue;
            }
            match operands(lines[k]) {
                Some((src, dst))
                    if src.starts_with("mov")
                        && src.ends_with("(%rsp)")
                        && dst.starts_with('%') =>
                {
                    marked[k] = true;
                    k += 1;
                }
                _ => break,
            }
        }
    }
    marked
}

/// Offset of `scalar_flops` in `struct mtswarm_issue_counters` (m3000.h).
const SCALAR_FLOPS_OFFSET: u32 = 8;

/// Library functions device code may call whose bytes the runtime charges:
/// the name in the kernel's assembly and the runtime's charged version.
const CHARGED_MEM_FUNCTIONS: &[(&str, &str)] = &[
    ("memcpy", "mtswarm_dev_memcpy"),
    ("memmove", "mtswarm_dev_memmove"),
    ("memset", "mtswarm_dev_memset"),
];

/// `call memcpy@PLT` (or a tail `jmp`) -> `call mtswarm_dev_memcpy@PLT`.
fn rename_mem_calls(line: &str) -> std::borrow::Cow<'_, str> {
    let mut parts = line.split_whitespace();
    let (Some(op), Some(target)) = (parts.next(), parts.next()) else {
        return line.into();
    };
    if !(op == "call" || op == "jmp") || parts.next().is_some() {
        return line.into();
    }
    let (name, plt) = target
        .strip_suffix("@PLT")
        .map_or((target, ""), |n| (n, "@PLT"));
    match CHARGED_MEM_FUNCTIONS.iter().find(|(from, _)| *from == name) {
        Some((_, to)) => format!("\t{op}\t{to}{plt}").into(),
        None => line.into(),
    }
}

/// Floating-point operations of one scalar instruction (SSE/AVX scalar
/// arithmetic and x87).
fn scalar_flops(mnemonic: &str) -> u32 {
    let m = mnemonic.strip_prefix('v').unwrap_or(mnemonic);
    if m.starts_with("fmadd")
        || m.starts_with("fmsub")
        || m.starts_with("fnmadd")
        || m.starts_with("fnmsub")
    {
        return if m.ends_with("sd") || m.ends_with("ss") {
            2
        } else {
            0
        };
    }
    const SSE: &[&str] = &["add", "sub", "mul", "div", "sqrt", "min", "max"];
    if let Some(op) = m.strip_suffix("sd").or_else(|| m.strip_suffix("ss"))
        && SSE.contains(&op)
    {
        return 1;
    }
    const X87: &[&str] = &[
        "fadd", "faddp", "fsub", "fsubp", "fsubr", "fsubrp", "fmul", "fmulp", "fdiv", "fdivp",
        "fdivr", "fdivrp", "fsqrt",
    ];
    u32::from(X87.contains(&mnemonic))
}

/// A device function's stack frame lives in the core's SM; one larger than
/// SM cannot run on the chip (`gcc -fstack-usage` output, one function per
/// line: `file:line:col:name<TAB>bytes<TAB>qualifiers`).
fn check_stack_frames(su_path: &Path, spec: &ChipSpec) -> Result<(), HwError> {
    let Ok(text) = std::fs::read_to_string(su_path) else {
        // No report (another compiler): nothing to check.
        return Ok(());
    };
    for line in text.lines() {
        let mut fields = line.split('\t');
        let (Some(location), Some(bytes)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(bytes) = bytes.trim().parse::<u64>() else {
            continue;
        };
        if bytes > spec.sm_bytes {
            let function = location.rsplit(':').next().unwrap_or(location);
            return Err(HwError::Capacity(format!(
                "kernel.c: {function} needs a {bytes}-byte stack frame; the stack lives in SM \
                 ({} bytes per core, SM capacity exceeded)",
                spec.sm_bytes
            )));
        }
    }
    Ok(())
}

fn is_trace_pc_call(line: &str) -> bool {
    let mut parts = line.split_whitespace();
    parts.next() == Some("call")
        && parts
            .next()
            .is_some_and(|t| t == "__sanitizer_cov_trace_pc" || t == "__sanitizer_cov_trace_pc@PLT")
}

fn is_label(line: &str) -> bool {
    let text = line.trim_end();
    !text.starts_with(char::is_whitespace) && text.ends_with(':')
}

/// The mnemonic of an instruction line that counts as scalar work, if any.
fn scalar_instruction(text: &str) -> Option<&str> {
    if text.is_empty() || text.starts_with('.') || text.starts_with('#') || text.ends_with(':') {
        return None;
    }
    if text.contains("#mtswarm") {
        return None;
    }
    let mnemonic = text.split_whitespace().next()?;
    let packed = mnemonic.ends_with("pd")
        || mnemonic.ends_with("ps")
        || mnemonic.contains("movdq")
        || mnemonic == "movddup"
        || mnemonic == "vmovddup"
        || ((mnemonic.starts_with('p')
            || mnemonic.starts_with("vp")
            || mnemonic.starts_with("vbroadcast"))
            && (text.contains("%xmm") || text.contains("%ymm") || text.contains("%zmm")));
    (!packed).then_some(mnemonic)
}

#[derive(Debug, Deserialize)]
struct EmuLine {
    threads: u32,
    #[serde(default)]
    kernel_cycles: f64,
    #[serde(default)]
    flops: f64,
    #[serde(default)]
    dma_bytes: f64,
    #[serde(default)]
    ddr_bytes: f64,
    #[serde(default)]
    stall_cycles: f64,
    #[serde(default)]
    wall_seconds: f64,
}

#[derive(Debug, Deserialize)]
struct ResultLine {
    valid: bool,
    #[serde(default)]
    max_abs_err: Option<f64>,
    #[serde(default)]
    flops: Option<f64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ErrorLine {
    kind: String,
    message: String,
}

/// One execution's figures before they become a [`RunSample`].
#[derive(Debug, Default)]
struct Pending {
    cycles: f64,
    wall: f64,
    threads: u32,
    counters: Counters,
}

fn to_u64(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.round() as u64
    } else {
        0
    }
}

/// Turn the harness's stdout into a [`RunOutcome`]. A runtime error of kind
/// `capacity` is an `Err(HwError::Capacity)` (the configuration cannot run on
/// the chip); `launch` is `HwError::Launch`; others make the outcome invalid.
pub(crate) fn parse_output(
    stdout: &str,
    spec: &ChipSpec,
    flavor: Flavor,
    model: Option<ModelFigures>,
) -> Result<RunOutcome, HwError> {
    let mut outcome = RunOutcome::default();
    let mut pending = Pending::default();
    let mut last_rate = (0.0, 0.0); // gflops, peak fraction of the last sample
    for line in stdout.lines() {
        let line = line.trim();
        if let Some(json) = line.strip_prefix("MTSWARM_EMU ") {
            let emu: EmuLine = serde_json::from_str(json)
                .map_err(|e| HwError::Launch(format!("bad MTSWARM_EMU line ({e}): {json}")))?;
            pending.cycles += emu.kernel_cycles;
            pending.wall += emu.wall_seconds;
            pending.threads = pending.threads.max(emu.threads);
            pending.counters.flops += to_u64(emu.flops);
            pending.counters.dma_bytes += to_u64(emu.dma_bytes);
            pending.counters.ddr_bytes += to_u64(emu.ddr_bytes);
            pending.counters.stall_cycles += to_u64(emu.stall_cycles);
        } else if let Some(json) = line.strip_prefix("MTSWARM_RESULT ") {
            let (valid, max_abs_err, flops, error, seed) =
                match serde_json::from_str::<ResultLine>(json) {
                    Ok(r) => (
                        r.valid,
                        r.max_abs_err,
                        r.flops.unwrap_or(0.0),
                        r.error,
                        r.seed,
                    ),
                    Err(e) => (
                        false,
                        None,
                        0.0,
                        Some(format!("unparseable MTSWARM_RESULT line ({e})")),
                        None,
                    ),
                };
            let done = std::mem::take(&mut pending);
            let (modeled_cycles, seconds) = match flavor {
                Flavor::Emulated => (Some(to_u64(done.cycles)), done.cycles / spec.clock_hz),
                Flavor::Native => (None, done.wall),
            };
            let valid = valid && error.is_none() && done.threads > 0;
            let error = if valid {
                None
            } else if done.threads == 0 {
                Some("the harness reported a result without running the kernel".to_owned())
            } else {
                Some(error.unwrap_or_else(|| "output differs from the reference".to_owned()))
            };
            last_rate = if seconds > 0.0 {
                let rate = flops / seconds;
                let peak = match flavor {
                    Flavor::Emulated => rate / spec.peak_flops(done.threads),
                    Flavor::Native => 0.0,
                };
                (rate / 1e9, peak)
            } else {
                (0.0, 0.0)
            };
            let mut sample = RunSample {
                valid,
                error,
                modeled_cycles,
                seconds,
                max_abs_err,
                counters: done.counters,
                seed,
            };
            // Wall-clock figures of the host CPU are not the chip's: only
            // emulated figures are held to the chip's bounds.
            if flavor == Flavor::Emulated {
                let bounds = plausibility::Bounds {
                    spec,
                    cores: done.threads,
                    model,
                    counted_flops: true,
                };
                let flags = plausibility::flags_of(&sample, flops, &bounds);
                plausibility::apply(&mut sample, &flags);
                plausibility::collect(&mut outcome, &[flags]);
            }
            outcome.samples.push(sample);
        } else if let Some(json) = line.strip_prefix("MTSWARM_ERROR ") {
            let err: ErrorLine = serde_json::from_str(json)
                .map_err(|e| HwError::Launch(format!("bad MTSWARM_ERROR line ({e}): {json}")))?;
            match err.kind.as_str() {
                "capacity" => return Err(HwError::Capacity(err.message)),
                "launch" => return Err(HwError::Launch(err.message)),
                "config" => return Err(HwError::Config(err.message)),
                _ => {
                    outcome.valid = false;
                    outcome.error = Some(err.message);
                }
            }
        }
    }
    if let Some(last) = outcome.samples.last() {
        outcome.modeled_cycles = last.modeled_cycles;
        outcome.seconds = last.seconds;
        outcome.counters = last.counters;
        outcome.max_abs_err = last.max_abs_err;
        outcome.gflops = last_rate.0;
        outcome.peak_fraction = last_rate.1;
    }
    if outcome.error.is_none() {
        outcome.valid = !outcome.samples.is_empty() && outcome.samples.iter().all(|s| s.valid);
        outcome.error = outcome
            .samples
            .iter()
            .find_map(|s| s.error.clone())
            .or_else(|| {
                outcome
                    .samples
                    .is_empty()
                    .then(|| "no MTSWARM_RESULT line".to_owned())
            });
    }
    Ok(outcome)
}

/// The MT-3000 emulator on one slice (backend `emulator`).
#[derive(Debug, Clone)]
pub struct EmulatorBoard {
    toolchain: Toolchain,
}

impl EmulatorBoard {
    /// A board for `slice` modeled with `spec`; uses `gcc` and
    /// [`default_cache_dir`]. Rejects slices the chip cannot have.
    pub fn new(slice: Slice, spec: ChipSpec) -> Result<Self, HwError> {
        Ok(Self {
            toolchain: Toolchain::new(slice, spec, BackendKind::Emulator)?,
        })
    }

    /// Where the runtime sources and objects are cached.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.toolchain.cache_dir = dir.into();
        self
    }

    /// The C compiler to use (default `gcc`).
    pub fn with_compiler(mut self, compiler: impl Into<String>) -> Self {
        self.toolchain.compiler = compiler.into();
        self
    }

    pub fn with_limits(mut self, limits: RunLimits) -> Self {
        self.toolchain.limits = limits;
        self
    }

    /// Inject faults into launches at these rates (see [`crate::faults`]);
    /// the launch counter starts at 0. Rates of 0 turn injection off.
    pub fn with_faults(mut self, faults: FaultConfig) -> Self {
        self.toolchain.faults =
            (!faults.is_off()).then(|| std::sync::Arc::new(FaultInjector::new(faults)));
        self
    }

    /// The fault rates in force, if any.
    pub fn faults(&self) -> Option<FaultConfig> {
        self.toolchain.faults.as_ref().map(|f| *f.config())
    }

    pub fn spec(&self) -> &ChipSpec {
        &self.toolchain.spec
    }
}

#[async_trait::async_trait]
impl Board for EmulatorBoard {
    fn slice(&self) -> &Slice {
        &self.toolchain.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        self.toolchain.build(request, Flavor::Emulated).await
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.toolchain
            .run(artifact, request, Flavor::Emulated)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_string_carries_every_number_the_runtime_needs() {
        let spec = ChipSpec {
            am_bytes: 12345,
            ..ChipSpec::default()
        };
        let s = spec_string(&spec);
        assert!(s.contains("am_bytes=1.2345e4"), "{s}");
        assert_eq!(s.split(';').count(), 23);
    }

    #[test]
    fn parse_pairs_runtime_lines_with_results() {
        let spec = ChipSpec::default();
        let out = "MTSWARM_EMU {\"kernel\":\"k\",\"threads\":2,\"kernel_cycles\":1200,\"flops\":192000,\"dma_bytes\":8,\"stall_cycles\":3,\"wall_seconds\":0.1}\n\
                   MTSWARM_RESULT {\"valid\":true,\"max_abs_err\":0.0,\"flops\":192000,\"error\":null}\n";
        let o = parse_output(out, &spec, Flavor::Emulated, None).expect("parses");
        assert!(o.valid);
        assert_eq!(o.modeled_cycles, Some(1200));
        assert!((o.seconds - 1e-6).abs() < 1e-15);
        // 192000 flops in 1 us = 192 GFLOPS; 2 cores peak 2 * 96 * 1.2e9.
        assert!((o.gflops - 192.0).abs() < 1e-9);
        assert!((o.peak_fraction - 192e9 / spec.peak_flops(2)).abs() < 1e-12);
        assert_eq!(o.counters.dma_bytes, 8);
    }

    #[test]
    fn blocks_are_charged_by_their_scalar_instructions() {
        let spec = ChipSpec::default();
        let asm = "f:\n\tcall\t__sanitizer_cov_trace_pc@PLT\n\tmovsd\t(%rax), %xmm0\n\tmulsd\t(%rdx), %xmm0\n\
                   \tmovupd\t(%rsi), %xmm1\n\tmulpd\t%xmm1, %xmm2\n\taddq $1, %fs:mtswarm_issue@tpoff+8 #mtswarm\n\
                   \taddq\t$8, %rax\n\tcmpq\t%rax, %rbx\n\tjne\t.L3\n\tmovq\t%rax, %rcx\n\
                   .L3:\n\tcall\t__sanitizer_cov_trace_pc@PLT\n\tret\n";
        let out = charge_basic_blocks(asm, &spec);
        assert!(!out.contains("__sanitizer_cov_trace_pc"), "{out}");
        // movsd, mulsd, addq, cmpq, jne = 5 scalar instructions = 1 cycle at 5 slots.
        assert!(
            out.contains("$1000, %fs:mtswarm_issue@tpoff #mtswarm block of 5 "),
            "{out}"
        );
        // A lone `ret` still costs the minimum block cost.
        assert!(out.contains("block of 1 instructions"), "{out}");
    }

    #[test]
    fn access_hook_calls_are_not_scalar_work() {
        let spec = ChipSpec::default();
        let asm = "f:\n\tcall\t__sanitizer_cov_trace_pc@PLT\n\tleaq\t8(%rbx), %rax\n\
                   \tmovq\t%rax, %rdi\n\tmovq\t%rax, 24(%rsp)\n\tcall\t__tsan_read8@PLT\n\
                   \tmovq\t24(%rsp), %rax\n\tmovsd\t(%rax), %xmm0\n\taddsd\t%xmm0, %xmm1\n\tret\n";
        let out = charge_basic_blocks(asm, &spec);
        // leaq, movsd, addsd, ret: the hook's call, set-up, spill and reload are not counted.
        assert!(out.contains("block of 4 instructions"), "{out}");
        assert!(
            out.contains("$1, %fs:mtswarm_issue@tpoff+8 #mtswarm scalar flops"),
            "{out}"
        );
    }

    #[test]
    fn capacity_error_line_becomes_capacity_error() {
        let out = "MTSWARM_ERROR {\"kind\":\"capacity\",\"message\":\"AM capacity exceeded\"}\n";
        let err = parse_output(out, &ChipSpec::default(), Flavor::Emulated, None).unwrap_err();
        assert_eq!(err, HwError::Capacity("AM capacity exceeded".into()));
    }
}
