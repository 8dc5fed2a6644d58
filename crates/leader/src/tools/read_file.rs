//! `read_file`: a text file of the job's kernel directory.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{ToolEnv, given, parse_args};
use crate::validate::resolve_file;

/// Largest file `read_file` returns in full; longer files are cut with a marker.
const READ_FILE_LIMIT: usize = 64 * 1024;

pub(super) struct ReadKernelFile(pub(super) Arc<ToolEnv>);

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct KernelFileArgs {
    /// path relative to the job's kernel directory
    path: String,
}

/// What `read_file` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "read_file",
    "Read a text file of the job's kernel directory (path relative to it), e.g. tune.toml or kernel.c.",
    schema_of::<KernelFileArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for ReadKernelFile {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: KernelFileArgs = parse_args(args)?;
        let relative = given(Some(args.path))
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
