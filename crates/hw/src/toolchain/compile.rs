//! Compiler steps: one confined compiler command, its kernel variant whose
//! diagnostics are scrubbed, `nm` of an object, and the content-addressed
//! object cache for translation units that rarely change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{MAX_OUTPUT_BYTES, TAIL_CHARS};
use crate::HwError;
use crate::device_check;
use crate::error::io_err;
use crate::process::{ProcessLimits, ProcessOutput, run_confined, tail, verified};

/// `gcc -dumpfullversion`, cached per compiler.
pub(super) async fn compiler_version(compiler: &str) -> String {
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

/// Run a build tool in `cwd` under the build sandbox (reading `reads`),
/// with none of the daemon's environment.
async fn run_build_confined(
    argv: &[String],
    cwd: &Path,
    reads: &[PathBuf],
    timeout: Duration,
) -> Result<ProcessOutput, HwError> {
    let limits = ProcessLimits {
        sandbox: Some(crate::sandbox::build_policy(cwd, reads)),
        ..ProcessLimits::default()
    };
    run_confined(
        argv,
        cwd,
        &BTreeMap::new(),
        timeout,
        &limits,
        MAX_OUTPUT_BYTES,
    )
    .await
}

/// Run one compiler command; its diagnostics become the error on failure.
///
/// The compiler is confined ([`crate::sandbox::build_policy`]): it reads
/// `reads` and the toolchain's own files (the system trees, or the install
/// tree of a compiler given by path), writes only `cwd`, has no network and
/// none of the daemon's environment, runs in its own PID namespace and may
/// not start more than [`crate::sandbox::BUILD_MAX_PROCESSES`] processes.
pub(super) async fn compile_step(
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
    let out = run_build_confined(&argv, cwd, &reads, Duration::from_secs(120))
        .await
        .map_err(|e| match e {
            HwError::Timeout(t) => {
                HwError::compile_caused(format!("{what}: compiler timed out after {t:?}"), e)
            }
            other => other,
        })?;
    if out.status.success() {
        Ok(out.stderr)
    } else {
        let mut msg = tail(out.stderr.trim(), TAIL_CHARS);
        if msg.is_empty() {
            msg = format!("compiler exited with {}", out.status);
        }
        Err(HwError::compile(format!("{what}: {msg}")))
    }
}

/// [`compile_step`] for a translation unit of the kernel directory: its
/// diagnostics are scrubbed of lines that point into, or quote, files
/// outside `allowed` (see [`device_check::scrub_diagnostics`]).
pub(super) async fn compile_kernel_step(
    argv: Vec<String>,
    cwd: &Path,
    what: &str,
    allowed: &[PathBuf],
) -> Result<String, HwError> {
    match compile_step(argv, cwd, what, allowed).await {
        Ok(log) => Ok(device_check::scrub_diagnostics(&log, allowed)),
        Err(HwError::Compile(detail)) => {
            Err(HwError::Compile(detail.map_message(|msg| {
                device_check::scrub_diagnostics(msg, allowed)
            })))
        }
        Err(e) => Err(e),
    }
}

/// `nm` of an object: (undefined, defined) symbols.
pub(super) async fn object_symbols(object: &Path) -> Result<(Vec<String>, Vec<String>), HwError> {
    let argv = vec!["nm".to_owned(), object.display().to_string()];
    let cwd = object.parent().unwrap_or(Path::new("/"));
    let out = run_build_confined(&argv, cwd, &[], Duration::from_secs(30)).await?;
    if !out.status.success() {
        return Err(HwError::compile(format!(
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
pub(super) async fn compile_cached(
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
