//! `read_file`: a text file of the workspace, with line numbers, a page at a time.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{MAX_READ_CHARS, read_text};
use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

/// Arguments of read_file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path relative to the workspace.
    pub path: String,
    /// First line to show, 1-based (default 1).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Number of lines to show (default 400).
    #[serde(default)]
    pub limit: Option<u64>,
}

const READ_SHAPE: Shape = Shape {
    integers: &["offset", "limit"],
    aliases: &[
        ("file", "path"),
        ("filename", "path"),
        ("start_line", "offset"),
        ("max_lines", "limit"),
    ],
    ..Shape::NONE
};

/// Read a text file of the workspace, with line numbers.
pub struct ReadFile(pub(crate) Arc<ToolEnv>);

/// What `read_file` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "read_file",
    "Read a text file of the workspace with line numbers. `offset` is the first line (1-based), `limit` the number of lines.",
    schema_of::<ReadFileArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &READ_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ReadFileArgs = parse_args(args)?;
        let (path, shown) = self.0.resolve_file(&args.path)?;
        let text = read_text(&path, &shown).map_err(|e| self.0.with_kernel_dirs_hint(e))?;
        let lines: Vec<&str> = text.lines().collect();
        let start = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(400).max(1);
        let total = lines.len() as u64;
        if start > total.max(1) {
            return Err(ToolError::InvalidArgs(format!(
                "offset {start} is past the end of `{shown}` ({total} lines)"
            )));
        }
        let mut content = String::new();
        let mut end = start - 1;
        for (i, line) in lines
            .iter()
            .enumerate()
            .skip((start - 1) as usize)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
        {
            if content.len() + line.len() > MAX_READ_CHARS {
                break;
            }
            content.push_str(&format!("{:>6}\t{line}\n", i + 1));
            end = i as u64 + 1;
        }
        let truncated = end < total;
        if truncated {
            content.push_str(&format!(
                "... ({} more lines; continue with offset={})\n",
                total - end,
                end + 1
            ));
        }
        Ok(ToolOutput::text(content).with_data(json!({
            "path": shown, "start": start, "end": end, "total_lines": total, "truncated": truncated,
        })))
    }
}
