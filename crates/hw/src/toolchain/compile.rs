//! Compiler steps: one confined compiler command, its kernel variant whose
//! diagnostics are scrubbed, `nm` of an object, and the content-addressed
//! object cache for translation units that rarely change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{MAX_OUTPUT_BYTES, TAIL_CHARS};
use crate::device_check;
use crate::error::HwError;
use crate::error::io_err;
use crate::process::{ProcessLimits, ProcessOutput, run_confined, tail, verified};

/// The compiler's version, cached per compiler.
pub(super) async fn compiler_version(compiler: &str) -> String {
    static VERSIONS: OnceLock<std::sync::Mutex<BTreeMap<String, String>>> = OnceLock::new();
    let cache = VERSIONS.get_or_init(Default::default);
    if let Some(v) = cache.lock().ok().and_then(|m| m.get(compiler).cloned()) {
        return v;
    }
    // gcc answers -dumpfullversion (12.2.0; -dumpversion says 12), clang
    // only -dumpversion (14.0.6).
    let mut version = "unknown".to_owned();
    for flag in ["-dumpfullversion", "-dumpversion"] {
        if let Ok(out) = tokio::process::Command::new(compiler)
            .arg(flag)
            .output()
            .await
            && out.status.success()
        {
            version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            break;
        }
    }
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

/// Compile device code: the compiler runs in a file system of its own
/// ([`crate::sandbox::view`]) holding only itself, its libraries, the
/// directories of `allowed` (read-only) and `cwd` (its output), so the
/// kernel's text can neither include nor test for any other host path.
/// Diagnostics are scrubbed as in [`compile_kernel_step`].
pub(super) async fn compile_device_step(
    mut argv: Vec<String>,
    cwd: &Path,
    what: &str,
    allowed: &[PathBuf],
) -> Result<String, HwError> {
    let path = std::env::var("PATH").ok();
    let program = argv
        .first()
        .and_then(|p| crate::sandbox::find_program(p, path.as_deref()))
        .ok_or_else(|| {
            HwError::compile(format!(
                "{what}: `{}` not found on PATH (deploy/setup.sh installs clang)",
                argv.first().map(String::as_str).unwrap_or_default()
            ))
        })?;
    let binary = std::fs::canonicalize(&program).map_err(|e| io_err("resolving", &program, e))?;
    let files = crate::sandbox::view::program_files(&binary)?;
    let mut paths: Vec<(PathBuf, bool)> = files.iter().map(|f| (f.clone(), false)).collect();
    paths.push((program.clone(), false));
    paths.extend(
        allowed
            .iter()
            .filter(|p| *p != cwd)
            .map(|p| (p.clone(), false)),
    );
    paths.push((cwd.to_path_buf(), true));
    paths.push((PathBuf::from("/dev/null"), true));
    let mut library_dirs: Vec<String> = files
        .iter()
        .filter_map(|f| f.parent().map(|d| d.display().to_string()))
        .collect();
    library_dirs.dedup();
    let mut policy = crate::sandbox::build_policy(cwd, allowed);
    policy.read.push(binary.clone());
    policy.view = Some(crate::sandbox::view::View { paths });
    let limits = ProcessLimits {
        sandbox: Some(policy),
        ..ProcessLimits::default()
    };
    argv[0] = binary.display().to_string();
    let mut env = BTreeMap::new();
    env.insert("LD_LIBRARY_PATH".to_owned(), library_dirs.join(":"));
    let out = run_confined(
        &argv,
        cwd,
        &env,
        Duration::from_secs(120),
        &limits,
        MAX_OUTPUT_BYTES,
    )
    .await;
    compiler_result(what, out, |text| {
        device_check::scrub_diagnostics(text, allowed)
    })
}

/// What a compiler command (`what`) gave: its diagnostics, through
/// `scrub`, when it succeeded; else a compile error with their tail (or the
/// exit status when it printed none), or naming the time-out that ended it.
fn compiler_result(
    what: &str,
    out: Result<ProcessOutput, HwError>,
    scrub: impl Fn(&str) -> String,
) -> Result<String, HwError> {
    let out = out.map_err(|e| match e {
        HwError::Timeout(t) => {
            HwError::compile_caused(format!("{what}: compiler timed out after {t:?}"), e)
        }
        other => other,
    })?;
    if out.status.success() {
        Ok(scrub(&out.stderr))
    } else {
        let mut msg = tail(scrub(out.stderr.trim()).trim(), TAIL_CHARS);
        if msg.is_empty() {
            msg = format!("compiler exited with {}", out.status);
        }
        Err(HwError::compile(format!("{what}: {msg}")))
    }
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
    let out = run_build_confined(&argv, cwd, &reads, Duration::from_secs(120)).await;
    compiler_result(what, out, str::to_owned)
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
