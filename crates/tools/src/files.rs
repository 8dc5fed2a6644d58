//! File tools over the session workspace: read_file, list_files, grep
//! (read-only, concurrent) and write_file, apply_patch (edits, sequential,
//! declared as mutations so earlier verification evidence is voided). Every
//! path goes through [`Workspace::resolve`]; directory walks never follow
//! symlinks.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtswarm_core::{Effect, Risk, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{ToolEnv, is_source, parse_args};
use crate::normalize::Shape;

/// Largest file the tools read or write.
const MAX_FILE_BYTES: u64 = 4 << 20;
/// Output budget of one read_file call.
const MAX_READ_CHARS: usize = 100_000;
/// Build outputs are not part of the model's view of the workspace.
const BUILD_DIR: &str = ".build";

fn io_error(path: &str, e: std::io::Error) -> ToolError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::InvalidArgs(format!("`{path}` does not exist")),
        _ => ToolError::Failed(format!("`{path}`: {e}")),
    }
}

fn read_text(path: &Path, shown: &str) -> Result<String, ToolError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(shown, e))?;
    if meta.is_dir() {
        return Err(ToolError::InvalidArgs(format!(
            "`{shown}` is a directory; use list_files"
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ToolError::InvalidArgs(format!(
            "`{shown}` is {} bytes, more than the {MAX_FILE_BYTES} bytes the tools read",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| io_error(shown, e))?;
    if bytes.contains(&0) {
        return Err(ToolError::InvalidArgs(format!(
            "`{shown}` is a binary file"
        )));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Regular files and directories under `dir` (not following symlinks),
/// depth-first in name order, up to `max_depth` levels and `max_entries`.
fn walk(
    dir: &Path,
    max_depth: usize,
    max_entries: usize,
    out: &mut Vec<(PathBuf, std::fs::FileType, u64)>,
) {
    fn inner(
        dir: &Path,
        depth: usize,
        max_depth: usize,
        max_entries: usize,
        out: &mut Vec<(PathBuf, std::fs::FileType, u64)>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            if out.len() >= max_entries {
                return;
            }
            if entry.file_name() == BUILD_DIR {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let path = entry.path();
            out.push((path.clone(), kind, size));
            if kind.is_dir() && depth + 1 < max_depth {
                inner(&path, depth + 1, max_depth, max_entries, out);
            }
        }
    }
    inner(dir, 0, max_depth, max_entries, out);
}

macro_rules! tool_basics {
    ($name:literal, $desc:literal, $args:ty, $risk:expr, $read_only:expr, $concurrent:expr, $shape:expr) => {
        fn name(&self) -> &str {
            $name
        }
        fn description(&self) -> &str {
            $desc
        }
        fn input_schema(&self) -> Value {
            $crate::env::schema_of::<$args>()
        }
        fn risk(&self) -> Risk {
            $risk
        }
        fn read_only(&self) -> bool {
            $read_only
        }
        fn concurrency_safe(&self) -> bool {
            $concurrent
        }
        fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
            $crate::normalize::normalize_args(args, &$shape)
        }
    };
}
pub(crate) use tool_basics;

// ---------------------------------------------------------------- read_file

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

#[async_trait::async_trait]
impl Tool for ReadFile {
    tool_basics!(
        "read_file",
        "Read a text file of the workspace with line numbers. `offset` is the first line (1-based), `limit` the number of lines.",
        ReadFileArgs,
        Risk::Low,
        true,
        true,
        READ_SHAPE
    );

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ReadFileArgs = parse_args(args)?;
        let path = self.0.workspace.resolve(&args.path)?;
        let text = read_text(&path, &args.path)?;
        let lines: Vec<&str> = text.lines().collect();
        let start = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(400).max(1);
        let total = lines.len() as u64;
        if start > total.max(1) {
            return Err(ToolError::InvalidArgs(format!(
                "offset {start} is past the end of `{}` ({total} lines)",
                args.path
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
            "path": args.path, "start": start, "end": end, "total_lines": total, "truncated": truncated,
        })))
    }
}

// --------------------------------------------------------------- list_files

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

#[async_trait::async_trait]
impl Tool for ListFiles {
    tool_basics!(
        "list_files",
        "List files and directories of the workspace (recursively, up to max_depth levels). Symlinks are shown, not followed.",
        ListFilesArgs,
        Risk::Low,
        true,
        true,
        LIST_SHAPE
    );

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

// --------------------------------------------------------------------- grep

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

#[async_trait::async_trait]
impl Tool for Grep {
    tool_basics!(
        "grep",
        "Search text files of the workspace for a regular expression; prints path:line: text for each match.",
        GrepArgs,
        Risk::Low,
        true,
        true,
        GREP_SHAPE
    );

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

// --------------------------------------------------------------- write_file

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

fn edit_effects(rel: &str) -> Vec<Effect> {
    let mut effects = vec![Effect::Mutation {
        target: rel.to_owned(),
    }];
    if rel.ends_with(".c") {
        effects.push(Effect::State {
            key: "source_file".into(),
            value: Value::String(rel.to_owned()),
            append: false,
        });
    }
    effects
}

fn write_confined(env: &ToolEnv, shown: &str, content: &str) -> Result<String, ToolError> {
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(ToolError::InvalidArgs(format!(
            "content is {} bytes, more than the {MAX_FILE_BYTES} allowed",
            content.len()
        )));
    }
    let path = env.workspace.resolve(shown)?;
    env.harness.check_writable(&path, shown)?;
    if path == env.workspace.root() {
        return Err(ToolError::InvalidArgs("a file path is required".into()));
    }
    if path.is_dir() {
        return Err(ToolError::InvalidArgs(format!("`{shown}` is a directory")));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_error(shown, e))?;
    }
    std::fs::write(&path, content).map_err(|e| io_error(shown, e))?;
    let rel = env.workspace.relative(&path);
    if is_source(&rel) {
        env.session().source_generation += 1;
    }
    Ok(rel)
}

/// Write a whole file in the workspace.
pub struct WriteFile(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for WriteFile {
    tool_basics!(
        "write_file",
        "Create or overwrite a file in the workspace with the given content.",
        WriteFileArgs,
        Risk::Medium,
        false,
        false,
        WRITE_SHAPE
    );

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

// -------------------------------------------------------------- apply_patch

/// Arguments of apply_patch.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyPatchArgs {
    /// A unified diff (`--- a/file`, `+++ b/file`, `@@ ... @@` hunks); may
    /// cover several files.
    pub patch: String,
    /// Apply a single-file diff to this path instead of the one in its header.
    #[serde(default)]
    pub path: Option<String>,
}

const PATCH_SHAPE: Shape = Shape {
    aliases: &[("diff", "patch"), ("file", "path")],
    ..Shape::NONE
};

/// Git metadata lines that may sit between file sections.
fn is_git_metadata(line: &str) -> bool {
    [
        "diff ",
        "index ",
        "new file mode",
        "deleted file mode",
        "similarity ",
        "rename ",
        "old mode",
        "new mode",
    ]
    .iter()
    .any(|p| line.starts_with(p))
}

/// Split a (possibly multi-file) diff into single-file sections.
fn split_sections(patch: &str) -> Vec<String> {
    let lines: Vec<&str> = patch.lines().collect();
    let mut sections: Vec<Vec<&str>> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let starts =
            lines[i].starts_with("--- ") && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ "));
        if starts {
            sections.push(vec![lines[i], lines[i + 1]]);
            i += 2;
            continue;
        }
        if let Some(current) = sections.last_mut()
            && !is_git_metadata(lines[i])
        {
            current.push(lines[i]);
        }
        i += 1;
    }
    sections
        .into_iter()
        .map(|s| {
            let mut text = s.join("\n");
            text.push('\n');
            text
        })
        .collect()
}

/// The path named in a `---`/`+++` header (`None` for /dev/null).
fn header_path(line: &str) -> Option<String> {
    let name = line.get(4..)?.split('\t').next()?.trim();
    if name == "/dev/null" || name.is_empty() {
        return None;
    }
    let name = name
        .strip_prefix("a/")
        .or_else(|| name.strip_prefix("b/"))
        .unwrap_or(name);
    Some(name.to_owned())
}

/// Apply a unified diff to workspace files.
pub struct ApplyPatch(pub(crate) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for ApplyPatch {
    tool_basics!(
        "apply_patch",
        "Apply a unified diff to files of the workspace. All files are patched or none: a hunk that does not apply is reported and nothing is written.",
        ApplyPatchArgs,
        Risk::Medium,
        false,
        false,
        PATCH_SHAPE
    );

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ApplyPatchArgs = parse_args(args)?;
        let sections = split_sections(&args.patch);
        if sections.is_empty() {
            return Err(ToolError::InvalidArgs(
                "no file header found: a unified diff starts with `--- a/FILE` and `+++ b/FILE` lines".into(),
            ));
        }
        if args.path.is_some() && sections.len() > 1 {
            return Err(ToolError::InvalidArgs(
                "`path` can only be given for a single-file diff".into(),
            ));
        }
        // Compute every new content first, so a failing hunk writes nothing.
        let mut planned: Vec<(String, Option<String>)> = Vec::new();
        for section in &sections {
            let mut header = section.lines();
            let old_name = header.next().and_then(header_path);
            let new_name = header.next().and_then(header_path);
            let target = args
                .path
                .clone()
                .or_else(|| new_name.clone())
                .or_else(|| old_name.clone())
                .ok_or_else(|| ToolError::InvalidArgs("a diff section names no file".into()))?;
            let resolved = self.0.workspace.resolve(&target)?;
            // Checked before anything is written: a refused file fails the whole patch.
            self.0.harness.check_writable(&resolved, &target)?;
            let original = if old_name.is_none() && args.path.is_none() {
                if resolved.exists() {
                    return Err(ToolError::InvalidArgs(format!(
                        "the diff creates `{target}`, which already exists"
                    )));
                }
                String::new()
            } else {
                read_text(&resolved, &target)?
            };
            let patch = diffy::Patch::from_str(section)
                .map_err(|e| ToolError::InvalidArgs(format!("`{target}`: malformed diff: {e}")))?;
            let patched = diffy::apply(&original, &patch).map_err(|e| {
                ToolError::InvalidArgs(format!(
                    "`{target}`: {e}: its context or removed lines do not match the file (read the file again and regenerate the diff)"
                ))
            })?;
            let deleted = new_name.is_none() && args.path.is_none();
            planned.push((target, (!deleted).then_some(patched)));
        }
        let mut out_lines = Vec::new();
        let mut effects = Vec::new();
        for (target, content) in planned {
            match content {
                Some(content) => {
                    let rel = write_confined(&self.0, &target, &content)?;
                    out_lines.push(format!("patched {rel}"));
                    effects.extend(edit_effects(&rel));
                }
                None => {
                    let path = self.0.workspace.resolve(&target)?;
                    std::fs::remove_file(&path).map_err(|e| io_error(&target, e))?;
                    let rel = self.0.workspace.relative(&path);
                    if is_source(&rel) {
                        self.0.session().source_generation += 1;
                    }
                    out_lines.push(format!("deleted {rel}"));
                    effects.push(Effect::Mutation { target: rel });
                }
            }
        }
        let files: Vec<Value> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Mutation { target } => Some(Value::String(target.clone())),
                _ => None,
            })
            .collect();
        let mut out = ToolOutput::text(out_lines.join("\n")).with_data(json!({"files": files}));
        for effect in effects {
            out = out.with_effect(effect);
        }
        Ok(out)
    }
}
