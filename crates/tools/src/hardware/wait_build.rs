//! wait_build: collects a background build and reports it as compile would.

use std::sync::Arc;

use mtswarm_core::{EffectKind, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

use super::compile::build_output;
use super::timeout_of;

/// What wait_build adds when the slice sat idle until the build finished.
pub const SLICE_IDLE_NOTE: &str =
    "the slice was idle until this build finished: start builds earlier";

/// Arguments of wait_build.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitBuildArgs {
    /// Artifact id returned by a background compile.
    pub artifact: String,
    /// Give up waiting after this many seconds (default 120; the build
    /// goes on).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

const WAIT_BUILD_SHAPE: Shape = Shape {
    numbers: &["timeout_seconds"],
    aliases: &[
        ("artifact_id", "artifact"),
        ("build", "artifact"),
        ("timeout", "timeout_seconds"),
    ],
    ..Shape::NONE
};

/// Wait for a background build and report it as compile would have.
pub struct WaitBuild(pub(crate) Arc<ToolEnv>);

/// What `wait_build` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "wait_build",
    "Wait for a build started with compile(background=true) and report it exactly as compile would (artifact id, or the compiler's errors). Runs on the host CPU; never takes the slice.",
    schema_of::<WaitBuildArgs>,
)
.concurrent()
.effects(&[EffectKind::State]);

#[async_trait::async_trait]
impl Tool for WaitBuild {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &WAIT_BUILD_SHAPE)
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: WaitBuildArgs = parse_args(args)?;
        let id = args.artifact.trim().to_owned();
        let timeout = timeout_of(args.timeout_seconds)?;
        let watch = {
            let session = self.0.session();
            match session.background_builds.get(&id) {
                Some(watch) => watch.clone(),
                None => {
                    let known: Vec<&str> = session
                        .background_builds
                        .keys()
                        .map(String::as_str)
                        .collect();
                    return Err(ToolError::InvalidArgs(format!(
                        "unknown artifact `{id}`: no background build of that id (background builds: {})",
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    )));
                }
            }
        };
        let mut watch = watch;
        let finished_already = watch.borrow().is_some();
        ctx.progress(format!("waiting for the build of {id}"), None);
        let finished = tokio::time::timeout(timeout, watch.wait_for(Option::is_some))
            .await
            .map_err(|_| ToolError::Timeout(timeout))?
            .map_err(|_| {
                ToolError::Failed(format!(
                    "the background build of `{id}` was abandoned (the session's tools were shut down)"
                ))
            })?
            .clone();
        // A build that finishes while nobody holds the slice kept the slice
        // waiting: say so, so the caller keeps more builds ahead.
        let slice_idle = !finished_already
            && self
                .0
                .lock
                .stats(&self.0.slice_id())
                .is_none_or(|stats| !stats.held);
        match finished {
            Some(Ok(mut report)) => {
                if slice_idle {
                    report.text.push_str(&format!("\n{SLICE_IDLE_NOTE}"));
                    report.summary["slice_idle"] = json!(true);
                }
                let source = self
                    .0
                    .session()
                    .artifacts
                    .get(&id)
                    .map(|built| built.source.clone());
                Ok(build_output(report, source.as_ref()))
            }
            Some(Err(error)) => Err(ToolError::Failed(error.to_string())),
            None => Err(ToolError::Failed(format!(
                "the background build of `{id}` reported nothing"
            ))),
        }
    }
}
