//! Shared test helpers: a scripted board and tool-set construction.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput};
use mtswarm_hw::board::RunSample;
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::{
    Artifact, BackendKind, Board, BuildRequest, ChipSpec, Counters, HwError, RunOutcome,
    RunRequest, Slice,
};
use mtswarm_tools::ToolSet;
use serde_json::Value;

/// A board whose kernels are judged by markers in kernel.c: `WRONG` (every
/// execution wrong), `WRONG_LATER` (first execution right, the rest wrong),
/// `SYNTAX_ERROR` (does not compile). Runs take `run_time` and record their
/// intervals and the most launches ever in flight at once.
pub(crate) struct ScriptedBoard {
    pub slice: Slice,
    pub run_time: Duration,
    pub in_flight: AtomicU32,
    pub max_in_flight: AtomicU32,
    pub intervals: Mutex<Vec<(Instant, Instant)>>,
    pub build_intervals: Mutex<Vec<(Instant, Instant)>>,
    pub build_time: Duration,
    pub launches: AtomicU32,
}

impl ScriptedBoard {
    pub(crate) fn new(backend: BackendKind) -> Self {
        Self {
            slice: Slice {
                board: "fake0".into(),
                cluster: Some(1),
                cores: 8,
                backend,
            },
            run_time: Duration::from_millis(30),
            in_flight: AtomicU32::new(0),
            max_in_flight: AtomicU32::new(0),
            intervals: Mutex::new(Vec::new()),
            build_intervals: Mutex::new(Vec::new()),
            build_time: Duration::ZERO,
            launches: AtomicU32::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Board for ScriptedBoard {
    fn slice(&self) -> &Slice {
        &self.slice
    }

    async fn build(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        let start = Instant::now();
        tokio::time::sleep(self.build_time).await;
        let built = self.build_now(request);
        self.build_intervals
            .lock()
            .expect("build intervals")
            .push((start, Instant::now()));
        built
    }

    async fn run(&self, artifact: &Artifact, request: &RunRequest) -> Result<RunOutcome, HwError> {
        self.run_now(artifact, request).await
    }
}

impl ScriptedBoard {
    fn build_now(&self, request: &BuildRequest) -> Result<Artifact, HwError> {
        let source = std::fs::read_to_string(request.kernel_dir.join("kernel.c")).map_err(|e| {
            HwError::kernel_caused(format!("{}: {e}", request.kernel_dir.display()), e)
        })?;
        if source.contains("SYNTAX_ERROR") {
            return Err(HwError::compile("kernel.c:1: error: expected ';'"));
        }
        std::fs::create_dir_all(&request.out_dir)?;
        std::fs::write(request.out_dir.join("kernel.c"), &source)?;
        Ok(Artifact {
            backend: self.slice.backend,
            dir: request.out_dir.clone(),
            program: request.out_dir.join("host"),
            kernel_hash: mtswarm_hw::sdk::kernel_hash(&request.kernel_dir, &request.defines)?,
            toolchain: "scripted-cc".into(),
            log: String::new(),
            defines: request.defines.clone(),
            harness: Default::default(),
            model: None,
        })
    }

    async fn run_now(
        &self,
        artifact: &Artifact,
        request: &RunRequest,
    ) -> Result<RunOutcome, HwError> {
        let start = Instant::now();
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let launch = self.launches.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.run_time).await;
        let source = std::fs::read_to_string(artifact.dir.join("kernel.c")).unwrap_or_default();
        let samples: Vec<RunSample> = (0..request.runs)
            .map(|i| {
                let valid = if source.contains("WRONG_LATER") {
                    launch == 0 && i == 0
                } else {
                    !source.contains("WRONG")
                };
                RunSample {
                    valid,
                    error: (!valid).then(|| "max_abs_err 1.0e+00 exceeds tolerance".to_string()),
                    modeled_cycles: None,
                    seconds: 0.001,
                    max_abs_err: Some(if valid { 0.0 } else { 1.0 }),
                    counters: Counters {
                        flops: 1_000_000,
                        ..Counters::default()
                    },
                    seed: None,
                    useful_flops: 1_000_000,
                }
            })
            .collect();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.intervals
            .lock()
            .expect("intervals")
            .push((start, Instant::now()));
        let valid = samples.iter().all(|s| s.valid);
        Ok(RunOutcome {
            valid,
            error: samples.iter().find_map(|s| s.error.clone()),
            seconds: 0.001,
            gflops: 1.0,
            samples,
            ..RunOutcome::default()
        })
    }
}

pub(crate) const GOOD_KERNEL: &str = "#include <hthread_device.h>\n#ifndef N\n#define N 1024\n#endif\n__global__ void k(double *a) {\n  double *buf = vector_malloc(N * sizeof(double));\n  for (int i = 0; i < N; i++) {\n    a[i] = a[i] * 2.0;\n  }\n}\n";

/// A workspace holding kernel.c / host.c with `kernel` as device code.
pub(crate) fn workspace_with(kernel: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("kernel.c"), kernel).expect("kernel.c");
    std::fs::write(dir.path().join("host.c"), "int main(void) { return 0; }\n").expect("host.c");
    dir
}

pub(crate) fn toolset(workspace: &Path, board: Arc<dyn Board>) -> ToolSet {
    ToolSet::builder(workspace, board)
        .build()
        .expect("tool set")
}

/// The tool set over a fresh [`ScriptedBoard`] of `backend`.
pub(crate) fn scripted_tools(workspace: &Path, backend: BackendKind) -> ToolSet {
    toolset(workspace, Arc::new(ScriptedBoard::new(backend)))
}

pub(crate) fn ctx() -> ToolContext {
    ToolContext::new("session-test", "call-1", 1)
}

/// Normalize then call, as the engine does.
pub(crate) async fn call(
    tools: &ToolSet,
    name: &str,
    args: Value,
) -> Result<ToolOutput, ToolError> {
    let tool: Arc<dyn Tool> = tools.get(name).unwrap_or_else(|| panic!("no tool {name}"));
    let args = tool
        .normalize(args)
        .map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
    tool.call(args, &ctx()).await
}

/// [`call`] that must succeed: its output (the panic names the tool and
/// its error).
pub(crate) async fn call_ok(tools: &ToolSet, name: &str, args: Value) -> ToolOutput {
    call(tools, name, args)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The outcome of a `run` that must have been valid and emulated (modeled
/// cycles: the kernel ran under the emulator).
pub(crate) fn valid_modeled_outcome(out: &ToolOutput) -> &Value {
    let outcome = &out.data.as_ref().expect("data")["outcome"];
    assert_eq!(outcome["valid"], true, "{}", out.content);
    assert!(
        outcome["modeled_cycles"].as_u64().unwrap_or(0) > 0,
        "{}",
        out.content
    );
    outcome
}

pub(crate) fn invalid_args(result: Result<ToolOutput, ToolError>) -> String {
    match result {
        Err(ToolError::InvalidArgs(msg)) => msg,
        other => panic!("expected InvalidArgs, got {other:?}"),
    }
}

/// Calls each `(tool, args, needle)`: every call must be refused as invalid
/// arguments, with a message that contains `needle`.
pub(crate) async fn assert_refused(tools: &ToolSet, cases: &[(&str, Value, &str)]) {
    for (tool, args, needle) in cases {
        let msg = invalid_args(call(tools, tool, args.clone()).await);
        assert!(msg.contains(needle), "{tool} {args}: {msg}");
    }
}

pub(crate) fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
}

/// A workspace holding a copy of the vecadd example in `vecadd/`.
pub(crate) fn vecadd_workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().expect("workspace");
    copy_dir(&examples_dir().join("vecadd"), &ws.path().join("vecadd"));
    ws
}

/// The shipped emulator on a `cores`-core slice, with the runtime cache
/// every test of the crate shares.
pub(crate) fn emulator_board(cores: u32) -> EmulatorBoard {
    let slice = Slice {
        board: "emu0".into(),
        cluster: Some(0),
        cores,
        backend: BackendKind::Emulator,
    };
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("emu-cache");
    EmulatorBoard::new(slice, ChipSpec::default())
        .expect("emulator board")
        .with_cache_dir(cache)
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        if entry.file_type().expect("type").is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    }
}

pub(crate) fn defines(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
