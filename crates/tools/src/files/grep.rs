//! `grep`: lines matching a pattern in the workspace's text files.

use std::path::PathBuf;
use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{MAX_FILE_BYTES, io_error, walk};
use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

/// Arguments of grep.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// Regular expression (Rust `regex` syntax).
    pub pattern: String,
    /// File or directory relative to the workspace (default: everything).
    #[serde(default)]
    pub path: Option<String>,
    /// Match regardless of letter case (default: false).
    #[serde(default)]
    pub case_insensitive: Option<bool>,
    /// Only files whose names end with one of these (e.g. [".c", ".h"]).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Stop after this many matching lines (default 200).
    #[serde(default)]
    pub max_matches: Option<u64>,
}

const GREP_SHAPE: Shape = Shape {
    integers: &["max_matches"],
    bools: &["case_insensitive"],
    lists: &["include"],
    aliases: &[
        ("regex", "pattern"),
        ("query", "pattern"),
        ("ignore_case", "case_insensitive"),
        ("glob", "include"),
    ],
    ..Shape::NONE
};

/// Search workspace files for a regular expression.
pub struct Grep(pub(crate) Arc<ToolEnv>);

/// What `grep` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "grep",
    "Search text files of the workspace for a regular expression; prints path:line: text for each match.",
    schema_of::<GrepArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for Grep {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &GREP_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: GrepArgs = parse_args(args)?;
        let regex = regex::RegexBuilder::new(&args.pattern)
            .case_insensitive(args.case_insensitive.unwrap_or(false))
            .size_limit(1 << 20)
            .build()
            .map_err(|e| ToolError::InvalidArgs(format!("bad regular expression: {e}")))?;
        let shown = args.path.clone().unwrap_or_else(|| ".".into());
        let root = self.0.workspace.resolve(&shown)?;
        let meta = std::fs::metadata(&root).map_err(|e| io_error(&shown, e))?;
        let files: Vec<PathBuf> = if meta.is_dir() {
            let mut entries = Vec::new();
            walk(&root, 32, 20_000, &mut entries);
            entries
                .into_iter()
                .filter(|(_, kind, size)| kind.is_file() && *size <= MAX_FILE_BYTES)
                .map(|(p, _, _)| p)
                .collect()
        } else {
            vec![root]
        };
        let include = args.include.unwrap_or_default();
        let max = args.max_matches.unwrap_or(200).clamp(1, 10_000) as usize;
        let mut content = String::new();
        let mut matches = Vec::new();
        let mut files_searched = 0usize;
        'files: for file in files {
            let rel = self.0.workspace.relative(&file);
            if !include.is_empty()
                && !include
                    .iter()
                    .any(|suffix| rel.ends_with(suffix.trim_start_matches('*')))
            {
                continue;
            }
            let Ok(bytes) = std::fs::read(&file) else {
                continue;
            };
            if bytes.contains(&0) {
                continue;
            }
            files_searched += 1;
            let text = String::from_utf8_lossy(&bytes);
            for (i, line) in text.lines().enumerate() {
                if regex.is_match(line) {
                    if matches.len() >= max {
                        content.push_str(&format!("... (stopped at {max} matches)\n"));
                        break 'files;
                    }
                    let shown_line: String = line.chars().take(300).collect();
                    content.push_str(&format!("{rel}:{}: {shown_line}\n", i + 1));
                    matches.push(json!({"path": rel, "line": i + 1, "text": shown_line}));
                }
            }
        }
        if matches.is_empty() {
            content.push_str(&format!("no matches in {files_searched} files\n"));
        }
        Ok(ToolOutput::text(content)
            .with_data(json!({"matches": matches, "files_searched": files_searched})))
    }
}
