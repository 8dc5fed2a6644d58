//! The emulator's build: `kernel.c` to a WebAssembly module that can call
//! nothing but the device contract, `host.c` to a WASI harness.
//!
//! The kernel is compiled by clang for `wasm32` against the emulator's own
//! device headers only (`-nostdinc`; no C library exists for it to link),
//! in a build step that sees nothing of the host but the compiler
//! ([`crate::sandbox::Policy::view`]), and linked with wasm-ld, which
//! refuses any symbol outside the contract. The linked module is then
//! checked and instrumented once ([`crate::emu::instrument::prepare`]) so a
//! module the emulator would refuse is a compile error here; every launch
//! instruments it again from `kernel.wasm`. The harness links with
//! wasi-libc and the emulator's host shim.

use std::path::{Path, PathBuf};

use super::compile::{compile_cached, compile_device_step, compile_step, compiler_version};
use super::{BuildDirs, TAIL_CHARS, Toolchain, model_figures};
use crate::board::{Artifact, BackendKind, BuildRequest};
use crate::device_check;
use crate::emu::contract;
use crate::emu::instrument;
use crate::emu::runtime::runtime_hash;
use crate::error::HwError;
use crate::error::io_err;
use crate::process::{kernel_hash, tail};

/// The kernel module a build leaves for the launch.
pub(crate) const KERNEL_WASM: &str = "kernel.wasm";
/// The harness module, the artifact's program.
pub(crate) const HARNESS_WASM: &str = "harness.wasm";

/// Flags of every device compile. Auto-vectorisation is off: scalar code
/// stays scalar and MT-3000 vector work is what the kernel writes with
/// vectors.
const DEVICE_FLAGS: &[&str] = &[
    "--target=wasm32",
    "-O2",
    "-msimd128",
    "-fno-vectorize",
    "-fno-slp-vectorize",
    "-nostdinc",
    "-Wall",
    "-Wno-unused-parameter",
    "-fno-caret-diagnostics",
];

/// Flags of the harness and the host shim.
const HARNESS_FLAGS: &[&str] = &[
    "--target=wasm32-wasi",
    "-O2",
    "-Wall",
    "-Wno-unused-parameter",
];

/// The host API functions the harness imports from the runtime.
const HOST_IMPORTS: &[&str] = &[
    "hthread_dev_open",
    "hthread_dev_close",
    "hthread_dat_load",
    "hthread_dat_unload",
    "hthread_get_avail_threads",
    "hthread_group_create",
    "hthread_group_wait",
    "hthread_group_destroy",
    "hthread_barrier_create",
    "hthread_barrier_destroy",
];

impl Toolchain {
    pub(crate) async fn build_emulated(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        let build = EmulatedBuild::prepare(self, request)?;
        let (imports_file, host_imports) = build.write_import_lists()?;
        let mut log = build.compile().await?;
        log.push_str(&build.link_kernel(&imports_file).await?);
        log.push_str(&build.link_harness(&host_imports).await?);

        let kernel_dir = &build.kernel_dir;
        let version = compiler_version(&self.clang).await;
        Ok(Artifact {
            backend: BackendKind::Emulator,
            dir: build.out_dir.clone(),
            program: build.out_dir.join(HARNESS_WASM),
            kernel_hash: kernel_hash(kernel_dir, &request.defines)?,
            toolchain: format!(
                "{} {version} {} (emulator runtime {})",
                self.clang,
                DEVICE_FLAGS[..5].join(" "),
                &runtime_hash()[..12]
            ),
            log: tail(&log, TAIL_CHARS),
            defines: request.defines.clone(),
            harness: crate::harness::harness_hashes(kernel_dir)?,
            model: model_figures(kernel_dir, &request.defines, &self.spec),
        })
    }
}

/// One emulated build: where its inputs, outputs and the emulator's runtime
/// are, and the defines every compile gets.
struct EmulatedBuild<'a> {
    toolchain: &'a Toolchain,
    kernel_dir: PathBuf,
    out_dir: PathBuf,
    /// The emulator's runtime tree: headers, device headers, host shim.
    runtime_dir: PathBuf,
    /// `-D NAME=VALUE` of each define.
    defines: Vec<String>,
    /// What the harness's compiles and the links may read.
    reads: Vec<PathBuf>,
}

impl<'a> EmulatedBuild<'a> {
    /// Check the request (defines, `kernel.c` and `host.c`, line markers),
    /// create the build directory and materialize the runtime.
    fn prepare(toolchain: &'a Toolchain, request: &BuildRequest) -> Result<Self, HwError> {
        let BuildDirs {
            kernel_dir,
            out_dir,
            runtime_dir,
            defines,
        } = toolchain.build_dirs(request)?;
        device_check::check_line_markers(&kernel_dir)?;
        let reads = vec![kernel_dir.clone(), runtime_dir.clone()];
        Ok(Self {
            toolchain,
            kernel_dir,
            out_dir,
            runtime_dir,
            defines,
            reads,
        })
    }

    /// The symbols each link may leave undefined: the device contract for
    /// the kernel, the host API for the harness. Their paths, in that order.
    fn write_import_lists(&self) -> Result<(PathBuf, PathBuf), HwError> {
        let imports_file = self.out_dir.join("device.imports");
        let listed: String = contract::IMPORTS
            .iter()
            .map(|i| format!("{}\n", i.name))
            .collect();
        std::fs::write(&imports_file, listed).map_err(|e| io_err("writing", &imports_file, e))?;
        let host_imports = self.out_dir.join("host.imports");
        std::fs::write(&host_imports, HOST_IMPORTS.join("\n") + "\n")
            .map_err(|e| io_err("writing", &host_imports, e))?;
        Ok((imports_file, host_imports))
    }

    /// Compile the kernel, the harness and the host shim, together; their
    /// logs.
    async fn compile(&self) -> Result<String, HwError> {
        let include = self.runtime_dir.join("include");
        let device_include = self.runtime_dir.join("device");
        // What the kernel's compile may read: its directory and the device
        // headers (and the compiler's own files, see `compile_step`).
        let allowed = vec![
            self.kernel_dir.clone(),
            self.out_dir.clone(),
            include.clone(),
            device_include.clone(),
        ];
        let mut kernel_argv = vec![self.toolchain.clang.clone()];
        kernel_argv.extend(DEVICE_FLAGS.iter().map(|s| (*s).to_owned()));
        kernel_argv.extend([
            "-isystem".into(),
            device_include.display().to_string(),
            "-isystem".into(),
            include.display().to_string(),
        ]);
        kernel_argv.extend(self.defines.iter().cloned());
        kernel_argv.extend([
            "-c".into(),
            self.kernel_dir.join("kernel.c").display().to_string(),
            "-o".into(),
            self.out_dir.join("kernel.o").display().to_string(),
        ]);
        let host_source = self.kernel_dir.join("host.c");
        let shim_source = self.runtime_dir.join("runtime/emu_host_shim.c");
        let (host_object, shim_object) = (self.out_dir.join("host.o"), self.out_dir.join("shim.o"));
        let (kernel_log, host_log, shim_log) = tokio::join!(
            compile_device_step(kernel_argv, &self.out_dir, "kernel.c", &allowed),
            compile_cached(
                self.harness_compile(&host_source, "host.o"),
                &host_object,
                &self.runtime_dir,
                "host.c",
                &self.reads
            ),
            compile_cached(
                self.harness_compile(&shim_source, "shim.o"),
                &shim_object,
                &self.runtime_dir,
                "the emulator's host shim",
                &self.reads
            ),
        );
        let mut log = kernel_log?;
        log.push_str(&host_log?);
        log.push_str(&shim_log?);
        Ok(log)
    }

    /// The compile of a harness source (`host.c`, the shim) into `object`.
    fn harness_compile(&self, source: &Path, object: &str) -> Vec<String> {
        let include = self.runtime_dir.join("include");
        let mut argv = vec![self.toolchain.clang.clone()];
        argv.extend(HARNESS_FLAGS.iter().map(|s| (*s).to_owned()));
        argv.extend(["-I".into(), include.display().to_string()]);
        argv.extend(self.defines.iter().cloned());
        argv.extend([
            "-c".into(),
            source.display().to_string(),
            "-o".into(),
            self.out_dir.join(object).display().to_string(),
        ]);
        argv
    }

    /// Link `kernel.wasm` against nothing but the device contract, then
    /// check and instrument it once: a module the emulator would refuse is
    /// a compile error here.
    async fn link_kernel(&self, imports_file: &Path) -> Result<String, HwError> {
        let kernel_wasm = self.out_dir.join(KERNEL_WASM);
        let link = vec![
            self.toolchain.clang.clone(),
            "--target=wasm32".into(),
            "-nostdlib".into(),
            "-Wl,--no-entry".into(),
            "-Wl,--export-dynamic".into(),
            "-Wl,--import-memory".into(),
            "-Wl,--export=__data_end".into(),
            "-Wl,-z,stack-size=0".into(),
            format!("-Wl,--allow-undefined-file={}", imports_file.display()),
            self.out_dir.join("kernel.o").display().to_string(),
            "-o".into(),
            kernel_wasm.display().to_string(),
        ];
        let log = link_kernel(link, &self.out_dir, &self.reads).await?;
        let wasm = std::fs::read(&kernel_wasm).map_err(|e| io_err("reading", &kernel_wasm, e))?;
        instrument::prepare(&wasm, &self.toolchain.spec)?;
        Ok(log)
    }

    /// Link the harness with wasi-libc and the host shim into
    /// `harness.wasm`, the artifact's program.
    async fn link_harness(&self, host_imports: &Path) -> Result<String, HwError> {
        let harness_link = vec![
            self.toolchain.clang.clone(),
            "--target=wasm32-wasi".into(),
            self.out_dir.join("host.o").display().to_string(),
            self.out_dir.join("shim.o").display().to_string(),
            "-o".into(),
            self.out_dir.join(HARNESS_WASM).display().to_string(),
            "-Wl,-z,stack-size=1048576".into(),
            format!("-Wl,--allow-undefined-file={}", host_imports.display()),
            "-lm".into(),
        ];
        compile_step(harness_link, &self.out_dir, "harness link", &self.reads).await
    }
}

/// Link the kernel; an undefined symbol is the kernel calling what the
/// device does not have, and says so with the reason.
async fn link_kernel(argv: Vec<String>, cwd: &Path, reads: &[PathBuf]) -> Result<String, HwError> {
    match compile_step(argv, cwd, "kernel link", reads).await {
        Ok(log) => Ok(log),
        Err(HwError::Compile(detail)) => {
            let message = detail.message().to_owned();
            let undefined: Vec<String> = message
                .lines()
                .filter_map(|l| l.split("undefined symbol: ").nth(1))
                .map(|s| s.trim().to_owned())
                .collect();
            if undefined.is_empty() {
                return Err(HwError::Compile(detail));
            }
            let reasons: Vec<String> = undefined
                .iter()
                .map(|name| match device_check::host_facility_reason(name) {
                    Some(why) => format!("`{name}` ({why})"),
                    None => format!("`{name}`"),
                })
                .collect();
            Err(HwError::compile(format!(
                "kernel.c: calls {}, which the device does not have: device code may call only \
                 the hthreads device API, memcpy/memmove/memset and the math subset of \
                 <math.h>",
                reasons.join(", ")
            )))
        }
        Err(e) => Err(e),
    }
}
