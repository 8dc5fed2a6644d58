//! `write_file`: create or overwrite a file of the workspace (an edit: it
//! voids earlier verification evidence).

use std::sync::Arc;

use mtswarm_core::{
    EffectKind, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{edit_effects, write_confined};
use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

/// Arguments of write_file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Path relative to the workspace; parent directories are created.
    pub path: String,
    /// The complete new content of the file.
    pub content: String,
}

const WRITE_SHAPE: Shape = Shape {
    aliases: &[
        ("file", "path"),
        ("filename", "path"),
        ("text", "content"),
        ("contents", "content"),
    ],
    ..Shape::NONE
};

/// Write a whole file in the workspace.
pub struct WriteFile(pub(crate) Arc<ToolEnv>);

/// What `write_file` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "write_file",
    "Create or overwrite a file in the workspace with the given content.",
    schema_of::<WriteFileArgs>,
)
.risk(Risk::Medium)
.writes()
.effects(&[EffectKind::Mutation, EffectKind::State]);

#[async_trait::async_trait]
impl Tool for WriteFile {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &WRITE_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: WriteFileArgs = parse_args(args)?;
        let rel = write_confined(&self.0, &args.path, &args.content)?;
        let lines = args.content.lines().count();
        let mut out = ToolOutput::text(format!(
            "wrote {rel} ({lines} lines, {} bytes)",
            args.content.len()
        ))
        .with_data(json!({"path": rel, "bytes": args.content.len(), "lines": lines}));
        for effect in edit_effects(&rel) {
            out = out.with_effect(effect);
        }
        Ok(out)
    }
}
