//! mtswarm-tools: the worker agent's tools, over one hardware slice and one
//! per-session workspace directory.
//!
//! One file per tool, each declaring its one [`mtswarm_core::ToolSpec`]
//! (`static SPEC`): name, description, the schema of its argument type,
//! risk, whether it writes, runs beside other calls or takes the slice, and
//! the effects it reports. The file tools are in [`files`], the hardware
//! tools (compile, wait_build, board_info, run, validate, benchmark) in
//! [`hardware`], then [`analyze`], [`estimate`] and [`results`].
//!
//! The hardware tools name the slice id as their [`Tool::resource`], so the
//! engine serializes them per slice with the lock from [`HwResourceLock`]
//! while the read-only tools of the same step run alongside. [`ToolSet`]
//! builds the whole set for one session.

pub mod analyze;
pub mod baseline;
pub mod env;
pub mod estimate;
pub mod files;
pub mod hardware;
pub mod harness;
pub mod lock;
mod normalize;
pub mod preview;
pub mod results;
pub mod source_diff;
pub mod workspace;

use std::path::PathBuf;
use std::sync::Arc;

use mtswarm_core::{RegistryError, Tool, ToolRegistry};
use mtswarm_hw::lock::HwLock;
use mtswarm_hw::measure::MeasureConfig;
use mtswarm_hw::{Board, ChipSpec};

pub use env::{BuildReport, BuildResult, BuiltArtifact, Candidate, SessionState, ToolEnv};
pub use lock::{HwResourceLock, TuningPhase};
pub use preview::CallPreview;
pub use results::{InMemoryResults, PastResult, QueryResultsTool, ResultsQuery, ResultsSource};
pub use workspace::{PathError, Workspace};

/// The name of every tool a worker session has (the builder's tools and
/// `query_results`): what a job's approval rules may name. A test keeps it
/// equal to what [`ToolSetBuilder::build`] and [`ToolSet::with_results`]
/// register.
pub const SESSION_TOOL_NAMES: [&str; 14] = [
    "read_file",
    "list_files",
    "grep",
    "write_file",
    "apply_patch",
    "analyze_kernel",
    "estimate",
    "compile",
    "wait_build",
    "run",
    "validate",
    "benchmark",
    "board_info",
    "query_results",
];

/// Why a tool set could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    /// The workspace directory cannot be used.
    #[error(transparent)]
    Workspace(#[from] PathError),
    /// The chip spec is invalid, or the harness store could not be set up.
    #[error("chip spec: {0}")]
    Spec(String),
}

/// Every worker tool of one session.
pub struct ToolSet {
    env: Arc<ToolEnv>,
    tools: Vec<Arc<dyn Tool>>,
    /// One engine lock per session, so its tuning-phase figures cover
    /// every hardware call of the session.
    resource_lock: HwResourceLock,
}

/// Configures a [`ToolSet`].
pub struct ToolSetBuilder {
    workspace: PathBuf,
    board: Arc<dyn Board>,
    spec: Option<ChipSpec>,
    lock: Option<HwLock>,
    measure: Option<MeasureConfig>,
}

impl ToolSetBuilder {
    /// The chip model (default: the built-in MT-3000 spec).
    pub fn spec(mut self, spec: ChipSpec) -> Self {
        self.spec = Some(spec);
        self
    }

    /// The daemon-wide slice lock (its statistics show in board_info; give
    /// the engine [`ToolSet::resource_lock`] so both use the same locks).
    pub fn lock(mut self, lock: HwLock) -> Self {
        self.lock = Some(lock);
        self
    }

    /// Defaults for benchmark (warm-up, repeats, time-outs, plausibility).
    pub fn measure_defaults(mut self, config: MeasureConfig) -> Self {
        self.measure = Some(config);
        self
    }

    /// Validates the spec, sets up the harness store in the workspace and
    /// creates every tool over one shared [`ToolEnv`].
    pub fn build(self) -> Result<ToolSet, ToolsError> {
        let workspace = Workspace::new(&self.workspace)?;
        let spec = self.spec.unwrap_or_default();
        spec.validate()
            .map_err(|e| ToolsError::Spec(e.to_string()))?;
        let lock = self.lock.unwrap_or_default();
        let resource_lock = HwResourceLock::new(lock.clone());
        let harness = harness::HarnessStore::new(workspace.root())
            .map_err(|e| ToolsError::Spec(format!("harness store: {e}")))?;
        let env = Arc::new(ToolEnv::new(
            workspace,
            self.board,
            spec,
            lock,
            self.measure.unwrap_or_default(),
            harness,
        ));
        let tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(files::ReadFile(env.clone())),
            Arc::new(files::ListFiles(env.clone())),
            Arc::new(files::Grep(env.clone())),
            Arc::new(files::WriteFile(env.clone())),
            Arc::new(files::ApplyPatch(env.clone())),
            Arc::new(analyze::AnalyzeKernel(env.clone())),
            Arc::new(estimate::Estimate(env.clone())),
            Arc::new(hardware::Compile(env.clone())),
            Arc::new(hardware::WaitBuild(env.clone())),
            Arc::new(hardware::Launch::run(env.clone())),
            Arc::new(hardware::Launch::validate(env.clone())),
            Arc::new(hardware::Benchmark(env.clone())),
            Arc::new(hardware::BoardInfo(env.clone())),
        ];
        Ok(ToolSet {
            env,
            tools,
            resource_lock,
        })
    }
}

impl ToolSet {
    /// Start building the tools of a session working in `workspace` (created
    /// if missing) on `board`'s slice.
    pub fn builder(workspace: impl Into<PathBuf>, board: Arc<dyn Board>) -> ToolSetBuilder {
        ToolSetBuilder {
            workspace: workspace.into(),
            board,
            spec: None,
            lock: None,
            measure: None,
        }
    }

    /// All tools, ready to register with the engine.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.clone()
    }

    /// Register every tool with an engine registry.
    pub fn register_all(&self, registry: &mut ToolRegistry) -> Result<(), RegistryError> {
        for tool in &self.tools {
            registry.register(tool.clone())?;
        }
        Ok(())
    }

    /// Builds and measures `kernel_dir`'s tune.toml baseline on the slice
    /// (see [`baseline`]); the session's candidates are not touched.
    pub async fn measure_baseline(
        &self,
        kernel_dir: &str,
    ) -> Result<baseline::BaselineMeasurement, baseline::BaselineError> {
        baseline::measure_baseline(&self.env, kernel_dir).await
    }

    /// The candidates (`-D` maps) of the task the session runs now: after
    /// each measurement the tools name the next one not measured yet, or
    /// say that every one is (see [`SessionState::task_candidates`]).
    pub fn set_task_candidates(&self, candidates: Vec<std::collections::BTreeMap<String, String>>) {
        self.env.session().task_candidates = candidates;
    }

    /// The pristine sources of the workspace's kernel directory
    /// `kernel_dir` are those of `origin` (the kernel root's copy the
    /// workspace's was made from): every build's diff is taken against
    /// them, so a resumed session's earlier edits still show as edits.
    pub fn register_pristine(
        &self,
        kernel_dir: &str,
        origin: &std::path::Path,
    ) -> Result<(), PathError> {
        let dir = self.env.workspace.resolve(kernel_dir)?;
        self.env.pristine.register(&dir, origin);
        Ok(())
    }

    /// One tool by name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.spec().name == name).cloned()
    }

    /// Names of every tool in the set, in the order they were registered.
    pub fn names(&self) -> Vec<String> {
        self.tools
            .iter()
            .map(|t| t.spec().name.to_string())
            .collect()
    }

    /// The lock to hand the engine for this session's hardware calls
    /// (clones share the tuning-phase figures, see [`HwResourceLock::tuning_phase`]).
    pub fn resource_lock(&self) -> HwResourceLock {
        self.resource_lock.clone()
    }

    /// State shared by the tools (workspace, board, spec, session memory).
    pub fn env(&self) -> &Arc<ToolEnv> {
        &self.env
    }
}
