//! What the tools of one session share: the workspace, the board of the
//! session's slice, the chip spec, the slice lock (for its statistics), the
//! session's memory of compiled artifacts and benchmarked candidates, and
//! the builds running in the background (so a slice never waits for the
//! host compiler between two hardware calls).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use mtswarm_core::ToolError;
use mtswarm_hw::lock::HwLock;
use mtswarm_hw::measure::{MeasureConfig, Measurement};
use mtswarm_hw::{Artifact, Board, ChipSpec};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::workspace::Workspace;

/// A compiled artifact the session can run.
#[derive(Debug, Clone, Serialize)]
pub struct BuiltArtifact {
    /// `b1`, `b2`, ...: what the model passes to run/validate/benchmark.
    pub id: String,
    /// Kernel directory it was built from, relative to the workspace.
    pub kernel_dir: String,
    /// The backend's build output (program, kernel hash, toolchain, log).
    pub artifact: Artifact,
    /// The source generation at build time (see [`SessionState::source_generation`]).
    pub generation: u64,
    /// How the built sources differ from the kernel's pristine ones.
    pub source: crate::source_diff::SourceDiff,
}

/// What a finished build reports: the text and summary `compile` returns.
#[derive(Debug, Clone)]
pub struct BuildReport {
    /// What the model reads: artifact id, kernel hash, toolchain, compiler output.
    pub text: String,
    /// The same as JSON (`artifact`, `kernel_hash`, ...), for the event log.
    pub summary: Value,
}

/// How a background build ended: its report, or why it failed.
pub type BuildResult = Result<BuildReport, mtswarm_core::ToolError>;

/// The state of a background build: `None` while it runs.
pub type BuildWatch = tokio::sync::watch::Receiver<Option<BuildResult>>;

/// One benchmarked candidate, as shown in the working state.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    /// Artifact id the measurement ran (`b1`, ...).
    pub artifact: String,
    /// Hash of the kernel source it was built from.
    pub kernel_hash: String,
    /// Its `-D` parameters.
    pub defines: BTreeMap<String, String>,
    /// DSP cores it ran on.
    pub cores: u32,
    /// Median time of the timed executions, seconds.
    pub median_seconds: f64,
    /// Billions of floating-point operations per second, when the flops are known.
    pub gflops: Option<f64>,
    /// Fraction (0..1) of the modeled peak of the cores used.
    pub peak_fraction: Option<f64>,
}

/// The session's memory between tool calls.
#[derive(Debug, Default)]
pub struct SessionState {
    next_build: u64,
    /// Every finished build of the session, by artifact id.
    pub artifacts: BTreeMap<String, BuiltArtifact>,
    /// Id of the latest finished build: what run/validate/benchmark use
    /// when the model names no artifact.
    pub latest: Option<String>,
    /// Bumped by every edit of a source file (`.c`, `.h`, `.toml`): an
    /// artifact built before the latest edit no longer is "the current code".
    pub source_generation: u64,
    /// Trustworthy measurements, fastest first.
    pub candidates: Vec<Candidate>,
    /// Median of the first valid benchmark: the session's baseline.
    pub baseline_seconds: Option<f64>,
    /// Builds started with `compile` in the background, by artifact id.
    pub background_builds: BTreeMap<String, BuildWatch>,
    /// The sources of the latest failed builds of edited kernels, oldest
    /// first, by build id (the failure's text names it, see
    /// [`crate::source_diff::failed_edit_build`]): what the failed
    /// candidate's record keeps.
    pub failed_edits: std::collections::VecDeque<(String, crate::source_diff::SourceDiff)>,
    /// The candidates (`-D` maps) of the task the session runs now, as its
    /// plan gives them; empty for a task without any.
    pub task_candidates: Vec<BTreeMap<String, String>>,
}

/// `b` and a number: the shape of [`SessionState::next_build_id`]'s ids.
fn is_build_id(id: &str) -> bool {
    id.strip_prefix('b')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl SessionState {
    pub(crate) fn next_build_id(&mut self) -> String {
        self.next_build += 1;
        format!("b{}", self.next_build)
    }

    /// The artifact named `id`, or the latest; refuses stale ones.
    ///
    /// A name that is not of the form this session hands out (`b` and a
    /// number) is a placeholder, such as the `compile_result` a model
    /// writes when it calls compile and validate in one reply: it means the
    /// latest build, as no name does. The answer names the artifact it
    /// took, and the record carries that artifact's own defines.
    pub(crate) fn artifact(&self, id: Option<&str>) -> Result<BuiltArtifact, ToolError> {
        let id = match id.map(str::trim).filter(|s| !s.is_empty()) {
            Some(id) if is_build_id(id) => id.to_owned(),
            _ => self.latest.clone().ok_or_else(|| {
                ToolError::InvalidArgs("nothing compiled yet: call compile first".into())
            })?,
        };
        if !self.artifacts.contains_key(&id)
            && let Some(build) = self.background_builds.get(&id)
        {
            return Err(ToolError::InvalidArgs(match &*build.borrow() {
                None => format!(
                    "artifact `{id}` is still being built in the background: call wait_build with it first"
                ),
                Some(Err(error)) => format!("artifact `{id}` did not build: {error}"),
                // Recorded in `artifacts` before the result is published.
                Some(Ok(_)) => format!("artifact `{id}` was built but not recorded"),
            }));
        }
        let built = self.artifacts.get(&id).cloned().ok_or_else(|| {
            let known: Vec<&str> = self.artifacts.keys().map(String::as_str).collect();
            ToolError::InvalidArgs(format!(
                "unknown artifact `{id}` (compiled so far: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))
        })?;
        if built.generation < self.source_generation {
            return Err(ToolError::InvalidArgs(format!(
                "artifact `{id}` was compiled before the latest source edit; compile again"
            )));
        }
        Ok(built)
    }

    /// The task's first candidate without a trustworthy measurement yet.
    pub(crate) fn next_task_candidate(&self) -> Option<&BTreeMap<String, String>> {
        let measured = |wanted: &BTreeMap<String, String>| {
            self.candidates.iter().any(|c| {
                wanted
                    .iter()
                    .all(|(name, value)| c.defines.get(name).is_some_and(|v| same_text(v, value)))
            })
        };
        self.task_candidates.iter().find(|c| !measured(c))
    }

    /// What to do after a candidate is measured or refused: compile the
    /// task's first candidate without a trustworthy measurement yet, or
    /// answer when every one has one (naming the best so far).
    pub(crate) fn next_candidate_hint(&self) -> String {
        match self.next_task_candidate() {
            Some(next) => format!(
                "next: compile the task's next candidate, defines {}",
                serde_json::to_string(next).unwrap_or_default()
            ),
            None if self.task_candidates.is_empty() => {
                "next: compile the next candidate, or answer when every candidate is measured"
                    .into()
            }
            None => match self.candidates.first() {
                Some(best) => format!(
                    "next: every candidate of the task is measured; answer now with the best, artifact {} ({} GFLOPS, defines {})",
                    best.artifact,
                    best.gflops.map(|g| format!("{g:.3}")).unwrap_or_else(|| "?".into()),
                    serde_json::to_string(&best.defines).unwrap_or_default()
                ),
                None => "next: every candidate of the task was tried and none measured valid; answer saying so".into(),
            },
        }
    }

    /// The fastest trustworthy time on `cores` so far; `None` before the
    /// first. A measurement at or below it would be the session's best.
    pub(crate) fn best_seconds(&self, cores: u32) -> Option<f64> {
        self.candidates
            .iter()
            .filter(|c| c.cores == cores)
            .map(|c| c.median_seconds)
            .reduce(f64::min)
    }

    /// Record a trustworthy measurement; returns the candidates, fastest first.
    pub(crate) fn add_candidate(&mut self, artifact: &str, m: &Measurement) -> Vec<Candidate> {
        if let Some(stats) = &m.stats {
            if self.baseline_seconds.is_none() {
                self.baseline_seconds = Some(stats.median);
            }
            self.candidates
                .retain(|c| !(c.kernel_hash == m.kernel_hash && c.cores == m.cores));
            self.candidates.push(Candidate {
                artifact: artifact.to_owned(),
                kernel_hash: m.kernel_hash.clone(),
                defines: m.defines.clone(),
                cores: m.cores,
                median_seconds: stats.median,
                gflops: m.gflops,
                peak_fraction: m.peak_fraction,
            });
            self.candidates
                .sort_by(|a, b| a.median_seconds.total_cmp(&b.median_seconds));
        }
        self.candidates.clone()
    }
}

/// Everything one session's tools share.
pub struct ToolEnv {
    /// The session's directory; every path a tool takes resolves inside it.
    pub workspace: Workspace,
    /// The hardware slice the session runs on.
    pub board: Arc<dyn Board>,
    /// Chip model for analysis, estimates and peak figures.
    pub spec: ChipSpec,
    /// The daemon-wide slice lock, held while a slice runs.
    pub lock: HwLock,
    /// Measurement settings benchmark starts from (the model may override some).
    pub measure_defaults: MeasureConfig,
    session: Mutex<SessionState>,
    /// Pristine harness files; builds are staged from them.
    pub(crate) harness: crate::harness::HarnessStore,
    /// Pristine kernel sources; each build is diffed against them.
    pub(crate) pristine: crate::source_diff::PristineSources,
    /// Compiles hold it shared; a benchmark with real host timing holds it
    /// exclusively, so nothing of this session compiles while it is timed.
    pub(crate) compile_gate: Arc<tokio::sync::RwLock<()>>,
    /// Background builds; dropping the set (with the session's tools)
    /// aborts the ones still running, which kills their compilers.
    background: Mutex<tokio::task::JoinSet<()>>,
}

impl ToolEnv {
    pub(crate) fn new(
        workspace: Workspace,
        board: Arc<dyn Board>,
        spec: ChipSpec,
        lock: HwLock,
        measure_defaults: MeasureConfig,
        harness: crate::harness::HarnessStore,
    ) -> Self {
        Self {
            pristine: crate::source_diff::PristineSources::new(workspace.root()),
            harness,
            workspace,
            board,
            spec,
            lock,
            measure_defaults,
            session: Mutex::new(SessionState::default()),
            compile_gate: Arc::new(tokio::sync::RwLock::new(())),
            background: Mutex::new(tokio::task::JoinSet::new()),
        }
    }

    /// Run `task` in the background for as long as the session's tools live.
    pub(crate) fn spawn_background(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let mut set = self.background.lock().unwrap_or_else(|e| e.into_inner());
        // Reap finished builds so the set only holds running ones.
        while set.try_join_next().is_some() {}
        set.spawn(task);
    }

    /// Locks the session's memory (a poisoned lock is recovered, not a panic).
    pub fn session(&self) -> MutexGuard<'_, SessionState> {
        self.session.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sources of failed build `build_id` of edited kernel sources
    /// (one of the latest few).
    pub fn failed_build_source(&self, build_id: &str) -> Option<crate::source_diff::SourceDiff> {
        self.session()
            .failed_edits
            .iter()
            .find(|(id, _)| id == build_id)
            .map(|(_, source)| source.clone())
    }

    /// Id of the session's slice.
    pub fn slice_id(&self) -> String {
        self.board.slice().id()
    }

    /// The kernel directories of the workspace (those with a host.c),
    /// relative to it: `vecadd`, or `.` for the root itself.
    pub(crate) fn kernel_dir_names(&self) -> Vec<String> {
        let mut names: Vec<String> = crate::workspace::kernel_dirs(self.workspace.root())
            .iter()
            .map(|dir| self.workspace.relative(dir))
            .collect();
        names.sort();
        names
    }

    /// The workspace's kernel directories, for an error's next step.
    pub(crate) fn kernel_dirs_hint(&self) -> String {
        match self.kernel_dir_names().as_slice() {
            [] => "the workspace holds no kernel directory (none has a host.c)".into(),
            names => format!("the workspace's kernel directories: {}", names.join(", ")),
        }
    }

    /// A refused file argument with the workspace's kernel directories
    /// appended, so the model knows where the task's files are.
    pub(crate) fn with_kernel_dirs_hint(&self, error: ToolError) -> ToolError {
        match error {
            ToolError::InvalidArgs(message) => ToolError::InvalidArgs(format!(
                "{message}; {} (list_files shows their files)",
                self.kernel_dirs_hint()
            )),
            other => other,
        }
    }

    /// The kernel directory of a call: the one given, else the
    /// workspace's only one; with several and none given, an error
    /// naming them.
    pub(crate) fn kernel_dir_or_only(&self, given: Option<&str>) -> Result<String, ToolError> {
        if let Some(dir) = given.map(str::trim).filter(|d| !d.is_empty()) {
            return Ok(dir.to_owned());
        }
        match self.kernel_dir_names().as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(ToolError::InvalidArgs(format!(
                "kernel_dir is required: {}",
                self.kernel_dirs_hint()
            ))),
        }
    }

    /// A file path of a call resolved in the workspace; a path that is not
    /// there but names a file of the workspace's only kernel directory
    /// (`kernel.c` for `vecadd/kernel.c`) means that file. Returns the
    /// path and its workspace-relative form.
    pub(crate) fn resolve_file(&self, shown: &str) -> Result<(PathBuf, String), ToolError> {
        let path = self.workspace.resolve(shown)?;
        if std::fs::symlink_metadata(&path).is_ok() {
            return Ok((path, shown.to_owned()));
        }
        if let [only] = self.kernel_dir_names().as_slice()
            && only != "."
        {
            let inside = format!("{only}/{}", shown.trim().trim_start_matches("./"));
            let candidate = self.workspace.resolve(&inside)?;
            if candidate.is_file() {
                return Ok((candidate, inside));
            }
        }
        Ok((path, shown.to_owned()))
    }
}

/// Deserialize arguments, naming the problem for the model.
pub(crate) fn parse_args<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::InvalidArgs(e.to_string()))
}

/// Two `-D` values as the same number or the same word (`2048` and `2048.0`).
fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    a == b || matches!((a.parse::<f64>(), b.parse::<f64>()), (Ok(x), Ok(y)) if x == y)
}

/// A source file whose edit invalidates earlier builds.
pub(crate) fn is_source(path: &str) -> bool {
    [".c", ".h", ".toml"].iter().any(|ext| path.ends_with(ext))
}
