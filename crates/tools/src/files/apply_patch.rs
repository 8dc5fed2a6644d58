//! `apply_patch`: apply a unified diff to the workspace's files (an edit:
//! it voids earlier verification evidence).

use std::sync::Arc;

use mtswarm_core::{
    Effect, EffectKind, Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{edit_effects, io_error, read_text, write_confined};
use crate::env::{ToolEnv, is_source, parse_args};
use crate::normalize::Shape;

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

/// What `apply_patch` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "apply_patch",
    "Apply a unified diff to files of the workspace. All files are patched or none: a hunk that does not apply is reported and nothing is written.",
    schema_of::<ApplyPatchArgs>,
)
.risk(Risk::Medium)
.writes()
.effects(&[EffectKind::Mutation, EffectKind::State]);

#[async_trait::async_trait]
impl Tool for ApplyPatch {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &PATCH_SHAPE)
    }

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
            let (resolved, target) = self.0.resolve_file(&target)?;
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
                read_text(&resolved, &target).map_err(|e| self.0.with_kernel_dirs_hint(e))?
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
