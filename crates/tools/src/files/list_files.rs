//! `list_files`: the workspace's files and directories, without build outputs.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{io_error, walk};
use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

/// Arguments of list_files.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Directory relative to the workspace (default: the workspace root).
    #[serde(default)]
    pub path: Option<String>,
    /// Levels to descend (default 4; 1 = only the directory itself).
    #[serde(default)]
    pub max_depth: Option<u32>,
}

const LIST_SHAPE: Shape = Shape {
    integers: &["max_depth"],
    aliases: &[
        ("dir", "path"),
        ("directory", "path"),
        ("depth", "max_depth"),
    ],
    ..Shape::NONE
};

const MAX_LIST_ENTRIES: usize = 500;

/// List the files of a workspace directory.
pub struct ListFiles(pub(crate) Arc<ToolEnv>);

/// What `list_files` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "list_files",
    "List files and directories of the workspace (recursively, up to max_depth levels). Symlinks are shown, not followed.",
    schema_of::<ListFilesArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for ListFiles {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &LIST_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ListFilesArgs = parse_args(args)?;
        let shown = args.path.clone().unwrap_or_else(|| ".".into());
        let dir = self.0.workspace.resolve(&shown)?;
        let meta = std::fs::metadata(&dir).map_err(|e| io_error(&shown, e))?;
        if !meta.is_dir() {
            return Err(ToolError::InvalidArgs(format!(
                "`{shown}` is not a directory"
            )));
        }
        let depth = args.max_depth.unwrap_or(4).clamp(1, 32) as usize;
        let mut entries = Vec::new();
        walk(&dir, depth, MAX_LIST_ENTRIES, &mut entries);
        let mut content = String::new();
        let mut listed = Vec::new();
        for (path, kind, size) in &entries {
            let rel = self.0.workspace.relative(path);
            let (line, kind_name) = if kind.is_symlink() {
                (format!("{rel} (symlink)"), "symlink")
            } else if kind.is_dir() {
                (format!("{rel}/"), "dir")
            } else {
                (format!("{rel} ({size} bytes)"), "file")
            };
            content.push_str(&line);
            content.push('\n');
            listed.push(json!({"path": rel, "kind": kind_name, "bytes": size}));
        }
        if entries.is_empty() {
            content.push_str("(empty)\n");
        }
        let truncated = entries.len() >= MAX_LIST_ENTRIES;
        if truncated {
            content.push_str(&format!("... (stopped at {MAX_LIST_ENTRIES} entries)\n"));
        }
        Ok(ToolOutput::text(content).with_data(json!({"entries": listed, "truncated": truncated})))
    }
}
