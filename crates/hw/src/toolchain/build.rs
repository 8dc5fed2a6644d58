//! Building a kernel directory into a native harness for the `host`
//! backend: check the defines and the files the kernel's translation unit
//! opens, compile the runtime once per cache, compile the kernel, the host
//! program and the spec, and link. (The emulator builds WebAssembly
//! instead, see `emulated`.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::compile::{compile_cached, compile_kernel_step, compile_step, compiler_version};
use super::{Flavor, OPT_FLAGS, TAIL_CHARS, Toolchain, check_defines};
use crate::board::{Artifact, BuildRequest};
use crate::device_check;
use crate::emu::runtime::{materialize_runtime, runtime_hash, spec_string};
use crate::error::HwError;
use crate::error::io_err;
use crate::plausibility::ModelFigures;
use crate::process::{kernel_hash, tail, verified};
use crate::spec::ChipSpec;

impl Toolchain {
    /// Compile the native runtime once per cache directory.
    async fn runtime_object(&self, runtime_dir: &Path) -> Result<PathBuf, HwError> {
        let object = runtime_dir.join("runtime-host.o");
        let object_hash = object.with_extension("o.sha256");
        if object.exists() && verified(&object, &object_hash) {
            return Ok(object);
        }
        let staging = runtime_dir.join(format!(".runtime-host.o.{}.tmp", uuid::Uuid::new_v4()));
        let mut argv = vec![self.compiler.clone()];
        argv.extend(OPT_FLAGS.iter().map(|s| (*s).to_owned()));
        argv.extend([
            "-pthread".into(),
            "-I".into(),
            runtime_dir.join("include").display().to_string(),
            "-c".into(),
            runtime_dir
                .join("runtime/host_runtime.c")
                .display()
                .to_string(),
            "-o".into(),
            staging.display().to_string(),
        ]);
        compile_step(argv, runtime_dir, "host runtime", &[]).await?;
        let bytes = std::fs::read(&staging).map_err(|e| io_err("reading", &staging, e))?;
        std::fs::write(&object_hash, hex::encode(Sha256::digest(&bytes)))
            .map_err(|e| io_err("writing", &object_hash, e))?;
        std::fs::rename(&staging, &object).map_err(|e| io_err("installing", &object, e))?;
        Ok(object)
    }

    /// Preprocess kernel.c once to see which files it opens: refuse it
    /// when it opened a file outside `allowed` (the error names the file,
    /// never its content). The preprocessed text is removed afterwards: it
    /// may hold an included file's content.
    async fn check_kernel_source(
        &self,
        out_dir: &Path,
        kernel_dir: &Path,
        allowed: &[PathBuf],
        defines: &[String],
    ) -> Result<(), HwError> {
        let runtime_include = allowed.get(2).cloned().unwrap_or_default();
        let preprocessed = out_dir.join("kernel.check.i");
        let deps = out_dir.join("kernel.check.d");
        let mut argv = vec![self.compiler.clone(), "-E".into()];
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
            device_check::check_includes(&device_check::parse_deps(&dep_text), out_dir, allowed)
        }
        .await;
        let _ = std::fs::remove_file(&preprocessed);
        let _ = std::fs::remove_file(&deps);
        result
    }

    pub(crate) async fn build_native(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        check_defines(&request.defines)?;
        let kernel_dir = &request.kernel_dir;
        for file in ["kernel.c", "host.c"] {
            if !kernel_dir.join(file).is_file() {
                return Err(HwError::kernel(format!(
                    "{}: missing {file}",
                    kernel_dir.display()
                )));
            }
        }
        let kernel_dir = kernel_dir
            .canonicalize()
            .map_err(|e| HwError::kernel_caused(format!("{}: {e}", kernel_dir.display()), e))?;
        let out_dir = &request.out_dir;
        std::fs::create_dir_all(out_dir).map_err(|e| io_err("creating", out_dir, e))?;
        let out_dir = out_dir
            .canonicalize()
            .map_err(|e| io_err("resolving", out_dir, e))?;
        let runtime_dir = materialize_runtime(&self.cache_dir)?;
        let runtime_object = self.runtime_object(&runtime_dir).await?;

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
        let compile = |source: PathBuf, object: &str| {
            let mut argv = vec![self.compiler.clone()];
            argv.extend(OPT_FLAGS.iter().map(|s| (*s).to_owned()));
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
        let kernel_argv = compile(kernel_dir.join("kernel.c"), "kernel.o");
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
        self.check_kernel_source(&out_dir, &kernel_dir, &allowed, &defines)
            .await?;
        // What every build step may read besides the toolchain.
        let reads = vec![kernel_dir.clone(), runtime_dir.clone()];
        let host_argv = compile(kernel_dir.join("host.c"), "host.o");
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
        Ok(Artifact {
            backend: Flavor::Native.backend(),
            dir: out_dir.clone(),
            program,
            kernel_hash: kernel_hash(&kernel_dir, &request.defines)?,
            toolchain: format!(
                "{} {version} -O2 (host runtime {})",
                self.compiler,
                &runtime_hash()[..12]
            ),
            log: tail(&log, TAIL_CHARS),
            defines: request.defines.clone(),
            harness: crate::harness::harness_hashes(&kernel_dir)?,
            model: model_figures(&kernel_dir, &request.defines, &self.spec),
        })
    }
}

/// The tune.toml `[model]` figures of a build, when the directory has them
/// (an expression that does not evaluate leaves the build unchecked against
/// the roofline, with a log line; the peak and bandwidth checks still hold).
pub(crate) fn model_figures(
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
