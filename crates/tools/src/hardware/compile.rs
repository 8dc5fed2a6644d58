//! compile: builds a kernel directory on the host CPU, now or in the
//! background, checking its defines against the kernel's tune.toml. A call
//! without defines in a task with candidates builds the task's next
//! unmeasured candidate (the one the last measurement's answer named).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use mtswarm_core::{
    Effect, EffectKind, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of,
};
use mtswarm_hw::{Artifact, Board, BuildRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{BuildReport, BuiltArtifact, ToolEnv, parse_args};
use crate::normalize::Shape;
use crate::source_diff::{MAX_FAILED_EDITS, SourceDiff, failed_edit_note};

use super::hw_error;

/// Arguments of compile.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompileArgs {
    /// Kernel directory relative to the workspace, holding kernel.c and
    /// host.c (default: the workspace's only kernel directory).
    #[serde(default)]
    pub kernel_dir: Option<String>,
    /// `-D` parameters: tuning knobs and problem sizes, NAME -> VALUE.
    #[serde(default)]
    pub defines: Option<BTreeMap<String, String>>,
    /// Start the build and return at once with its artifact id; call
    /// wait_build with the id before running it (default false). Lets the
    /// host compile the next candidates while the slice runs this one.
    #[serde(default)]
    pub background: Option<bool>,
    /// Skip the check of the defines against tune.toml (names, values,
    /// constraints); for knobs outside the tuning space such as fault
    /// injection (default false).
    #[serde(default)]
    pub unchecked: Option<bool>,
}

const COMPILE_SHAPE: Shape = Shape {
    bools: &["background", "unchecked"],
    maps: &["defines"],
    aliases: &[
        ("dir", "kernel_dir"),
        ("path", "kernel_dir"),
        ("params", "defines"),
        ("knobs", "defines"),
        ("async", "background"),
    ],
    // What run, validate and benchmark take, copied from their calls.
    ignored: &[
        "artifact",
        "cores",
        "runs",
        "repeats",
        "warmup",
        "timeout_seconds",
        "baseline_seconds",
        "min_seconds",
        "args",
    ],
    ..Shape::NONE
};

/// One build: what to compile and where its artifact goes.
pub(crate) struct BuildJob {
    pub(crate) id: String,
    pub(crate) generation: u64,
    pub(crate) kernel_dir_rel: String,
    pub(crate) defines: BTreeMap<String, String>,
    pub(crate) out_dir: PathBuf,
    /// What is built: the kernel's sources with the pristine harness.
    pub(crate) staged_dir: PathBuf,
    /// How those sources differ from the kernel's pristine ones.
    pub(crate) source: SourceDiff,
}

/// Compile on the host CPU (shared gate: a host-timed benchmark of this
/// session excludes compiles).
pub(crate) async fn run_build(
    board: Arc<dyn Board>,
    gate: Arc<tokio::sync::RwLock<()>>,
    job: &BuildJob,
) -> Result<Artifact, ToolError> {
    let _compiling = gate.read().await;
    let built = board
        .build(&BuildRequest {
            kernel_dir: job.staged_dir.clone(),
            defines: job.defines.clone(),
            out_dir: job.out_dir.clone(),
        })
        .await;
    let _ = std::fs::remove_dir_all(&job.staged_dir);
    // A compile error reads `compile failed: <diagnostics>`.
    built.map_err(hw_error)
}

/// A failed build of edited sources: its error names the build and the
/// change, and the session keeps its diff for the candidate's record.
pub(super) fn note_failed_edit(env: &ToolEnv, job: &BuildJob, error: ToolError) -> ToolError {
    if !job.source.edited {
        return error;
    }
    {
        let mut session = env.session();
        session
            .failed_edits
            .push_back((job.id.clone(), job.source.clone()));
        while session.failed_edits.len() > MAX_FAILED_EDITS {
            session.failed_edits.pop_front();
        }
    }
    let note = failed_edit_note(&job.id, &job.source);
    match error {
        ToolError::InvalidArgs(message) => ToolError::InvalidArgs(message + &note),
        ToolError::Failed(message) => ToolError::Failed(message + &note),
        other => other,
    }
}

/// Record a finished build in the session and describe it.
pub(super) fn record_build(env: &ToolEnv, job: BuildJob, artifact: Artifact) -> BuildReport {
    let mut summary = json!({
        "artifact": job.id,
        "ok": true,
        "kernel_dir": job.kernel_dir_rel,
        "defines": job.defines,
        "kernel_hash": artifact.kernel_hash,
        "toolchain": artifact.toolchain,
    });
    let mut text = format!(
        "compiled {} as artifact {} (kernel {}, {})",
        job.kernel_dir_rel,
        job.id,
        artifact.kernel_hash.chars().take(12).collect::<String>(),
        artifact.toolchain
    );
    if job.source.edited {
        // The working state keeps the stat; the diff itself rides in the
        // result's data (see `build_output`), for the candidate's record.
        summary["source_edited"] = json!(true);
        summary["source_changes"] = json!(job.source.stat());
        text.push_str(&format!(
            "\nbuilt from edited sources ({}), not the pristine kernel",
            job.source.stat()
        ));
    }
    if !artifact.log.trim().is_empty() {
        let log: String = artifact.log.chars().take(3000).collect();
        text.push_str(&format!("\ncompiler output:\n{log}"));
    }
    let mut session = env.session();
    session.artifacts.insert(
        job.id.clone(),
        BuiltArtifact {
            id: job.id.clone(),
            kernel_dir: job.kernel_dir_rel,
            artifact,
            generation: job.generation,
            source: job.source,
        },
    );
    session.latest = Some(job.id);
    BuildReport { text, summary }
}

/// Defines are checked against the kernel's tune.toml, when it has a
/// readable one: an unknown name, a value outside the space or a broken
/// constraint is an error naming it (instead of a build of the defaults).
pub(super) fn check_defines(
    kernel_dir: &std::path::Path,
    defines: &BTreeMap<String, String>,
    spec: &mtswarm_hw::ChipSpec,
) -> Result<(), ToolError> {
    let file = kernel_dir.join("tune.toml");
    if !file.is_file() {
        return Ok(());
    }
    match mtswarm_hw::tune::TuneSpace::load(&file) {
        Ok(space) => space
            .check_defines(defines, spec)
            .map_err(|e| ToolError::InvalidArgs(e.to_string())),
        // An unreadable tune.toml is the kernel's problem, reported by the
        // tools that read it; the build itself does not need it.
        Err(_) => Ok(()),
    }
}

pub(super) fn build_output(report: BuildReport, source: Option<&SourceDiff>) -> ToolOutput {
    let mut data = report.summary.clone();
    if let Some(source) = source.filter(|s| s.edited) {
        data["source_diff"] = json!(source.diff);
    }
    // The step after a build, for a model that would compile again.
    let next = report.summary["artifact"]
        .as_str()
        .map(|id| format!("\nnext: validate artifact {id}, then benchmark it"))
        .unwrap_or_default();
    ToolOutput::text(report.text + &next)
        .with_data(data)
        .with_effect(Effect::State {
            key: "compile_results".into(),
            value: report.summary,
            append: true,
        })
}

/// Build a kernel directory for the session's backend.
pub struct Compile(pub(crate) Arc<ToolEnv>);

/// What `compile` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "compile",
    "Compile the kernel directory (kernel.c + host.c) with the given -D defines for this slice's backend. Returns an artifact id for run/validate/benchmark. Runs on the host CPU; with background=true it returns at once and wait_build collects the result.",
    schema_of::<CompileArgs>,
)
.concurrent()
.effects(&[EffectKind::State]);

#[async_trait::async_trait]
impl Tool for Compile {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &COMPILE_SHAPE)
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: CompileArgs = parse_args(args)?;
        let shown = self.0.kernel_dir_or_only(args.kernel_dir.as_deref())?;
        let kernel_dir = self.0.workspace.resolve(&shown)?;
        if !kernel_dir.is_dir() || !kernel_dir.join("kernel.c").is_file() {
            let what = if kernel_dir.is_dir() {
                "holds no kernel.c"
            } else {
                "is not a directory"
            };
            return Err(ToolError::InvalidArgs(format!(
                "kernel_dir `{shown}` {what}: give one of {} (or omit kernel_dir when there is one)",
                self.0.kernel_dirs_hint()
            )));
        }
        // No defines at all: the task's next candidate, as the answer of
        // the last measurement named it (a small model that calls compile
        // with no arguments would otherwise build the default again and
        // again); none left, or no task plan: the kernel's defaults.
        let defines = match args.defines {
            Some(defines) => defines,
            None => self
                .0
                .session()
                .next_task_candidate()
                .cloned()
                .unwrap_or_default(),
        };
        if !args.unchecked.unwrap_or(false) {
            check_defines(&kernel_dir, &defines, &self.0.spec)?;
        }
        let (id, generation) = {
            let mut session = self.0.session();
            (session.next_build_id(), session.source_generation)
        };
        let staged_dir = self.0.harness.stage(&kernel_dir, &id)?;
        let source = self.0.pristine.diff(&kernel_dir, &staged_dir);
        let job = BuildJob {
            staged_dir,
            source,
            out_dir: self.0.workspace.root().join(".build").join(&id),
            kernel_dir_rel: self.0.workspace.relative(&kernel_dir),
            id,
            generation,
            defines,
        };
        let board = self.0.board.clone();
        let gate = self.0.compile_gate.clone();
        if !args.background.unwrap_or(false) {
            ctx.progress(format!("compiling {shown} as {}", job.id), None);
            let artifact = run_build(board, gate, &job)
                .await
                .map_err(|e| note_failed_edit(&self.0, &job, e))?;
            let source = job.source.clone();
            return Ok(build_output(
                record_build(&self.0, job, artifact),
                Some(&source),
            ));
        }
        let id = job.id.clone();
        let (publish, watch) = tokio::sync::watch::channel(None);
        self.0.session().background_builds.insert(id.clone(), watch);
        // The build must not keep the session's tools alive.
        let env = Arc::downgrade(&self.0);
        self.0.spawn_background(async move {
            let result = match run_build(board, gate, &job).await {
                Ok(artifact) => match env.upgrade() {
                    Some(env) => Ok(record_build(&env, job, artifact)),
                    None => return,
                },
                Err(e) => match env.upgrade() {
                    Some(env) => Err(note_failed_edit(&env, &job, e)),
                    None => return,
                },
            };
            publish.send_replace(Some(result));
        });
        let summary = json!({
            "artifact": id,
            "background": true,
            "kernel_dir": shown,
        });
        Ok(ToolOutput::text(format!(
            "building {shown} in the background as artifact {id}: call wait_build with artifact {id} before running it"
        ))
        .with_data(summary))
    }
}
