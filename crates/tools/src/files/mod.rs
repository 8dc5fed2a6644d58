//! File tools over the session workspace, one file per tool: read_file,
//! list_files, grep (read-only, concurrent) and write_file, apply_patch
//! (edits, sequential, declared as mutations so earlier verification
//! evidence is voided). This module holds what they share. Every path goes
//! through [`crate::workspace::Workspace::resolve`]; directory walks never
//! follow symlinks.

use std::path::{Path, PathBuf};

use mtswarm_core::{Effect, ToolError};
use serde_json::Value;

use crate::env::{ToolEnv, is_source};

mod apply_patch;
mod grep;
mod list_files;
mod read_file;
mod write_file;

pub use apply_patch::{ApplyPatch, ApplyPatchArgs};
pub use grep::{Grep, GrepArgs};
pub use list_files::{ListFiles, ListFilesArgs};
pub use read_file::{ReadFile, ReadFileArgs};
pub use write_file::{WriteFile, WriteFileArgs};

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

/// The effects of an edit of `rel`: a mutation, and the source file the
/// working state tracks when it is C.
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

/// Writes `content` to the workspace path `shown`, confined to what the
/// harness lets a session write; returns the path relative to the
/// workspace.
fn write_confined(env: &ToolEnv, shown: &str, content: &str) -> Result<String, ToolError> {
    if content.len() as u64 > MAX_FILE_BYTES {
        return Err(ToolError::InvalidArgs(format!(
            "content is {} bytes, more than the {MAX_FILE_BYTES} allowed",
            content.len()
        )));
    }
    // `kernel.c` for the only kernel's `vecadd/kernel.c`: what a model
    // means when it names a file of the task's kernel without its directory.
    let (path, shown) = env.resolve_file(shown)?;
    let shown = shown.as_str();
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
