//! `read_file`: a text file of the job's kernel directory.

use std::sync::Arc;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::{ToolEnv, text_arg};
use crate::validate::resolve_file;

/// Largest file `read_file` returns in full; longer files are cut with a marker.
const READ_FILE_LIMIT: usize = 64 * 1024;

pub(super) struct ReadFile(pub(super) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for ReadFile {
    tool_meta!(
        "read_file",
        "Read a text file of the job's kernel directory (path relative to it), e.g. tune.toml or kernel.c.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let relative = text_arg(&args, "path")
            .ok_or_else(|| ToolError::InvalidArgs("path is required".into()))?;
        let path = resolve_file(&self.0.job.kernel_dir, &relative)
            .map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let bytes = tokio::fs::read(&path)
            .await
            .map_err(|e| ToolError::Failed(format!("cannot read {relative}: {e}")))?;
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if text.len() > READ_FILE_LIMIT {
            let mut cut = READ_FILE_LIMIT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let total = text.len();
            text.truncate(cut);
            text.push_str(&format!("\n[... cut: {total} bytes in total]"));
        }
        Ok(ToolOutput::text(text))
    }
}
