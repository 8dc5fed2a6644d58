//! Session workspaces: one directory per session under the workspace root,
//! with the task's kernel directory copied in from the kernel root. Kernel
//! paths come from the network (SpawnSession, task messages), so they are
//! confined to the kernel root and the copy is bounded.

use std::path::{Component, Path, PathBuf};

/// Files one kernel copy may hold.
const MAX_FILES: usize = 2_000;
/// Bytes one kernel copy may hold.
const MAX_BYTES: u64 = 256 * 1024 * 1024;

/// The workspace directory of a session.
pub fn session_workspace(root: &Path, session_id: &str) -> PathBuf {
    root.join(session_id)
}

/// Check a kernel directory named relative to the kernel root; returns the
/// source directory and the name of its copy in the workspace.
pub fn resolve_kernel_dir(
    kernel_root: &Path,
    kernel_dir: &str,
) -> Result<(PathBuf, String), String> {
    let text = kernel_dir.trim();
    if text.is_empty() {
        return Err("no kernel directory given".to_owned());
    }
    let path = Path::new(text);
    let mut name = None;
    for component in path.components() {
        match component {
            Component::Normal(part) => name = Some(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!("kernel directory `{text}` contains `..`"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "kernel directory `{text}` is absolute; give it relative to the kernel root"
                ));
            }
        }
    }
    let name = name.ok_or_else(|| format!("kernel directory `{text}` names no directory"))?;
    let source = kernel_root.join(path);
    let canonical_root = std::fs::canonicalize(kernel_root)
        .map_err(|e| format!("kernel root {}: {e}", kernel_root.display()))?;
    let canonical = std::fs::canonicalize(&source)
        .map_err(|e| format!("kernel directory `{text}` not found under the kernel root: {e}"))?;
    if !canonical.starts_with(&canonical_root) {
        return Err(format!(
            "kernel directory `{text}` leads outside the kernel root"
        ));
    }
    if !canonical.is_dir() {
        return Err(format!("kernel directory `{text}` is not a directory"));
    }
    Ok((canonical, name))
}

/// Copy `kernel_dir` into the workspace unless a copy is already there (a
/// resumed or later task keeps the session's edits). Returns the name of
/// the copy inside the workspace.
pub fn ensure_kernel_copy(
    kernel_root: &Path,
    workspace: &Path,
    kernel_dir: &str,
) -> Result<String, String> {
    let (source, name) = resolve_kernel_dir(kernel_root, kernel_dir)?;
    let target = workspace.join(&name);
    if target.is_dir() {
        return Ok(name);
    }
    std::fs::create_dir_all(workspace)
        .map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
    let staging = workspace.join(format!(".{name}.copying"));
    let _ = std::fs::remove_dir_all(&staging);
    let mut budget = (MAX_FILES, MAX_BYTES);
    copy_tree(&source, &staging, &mut budget).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staging);
        format!("copying kernel directory `{kernel_dir}`: {e}")
    })?;
    std::fs::rename(&staging, &target)
        .map_err(|e| format!("copying kernel directory `{kernel_dir}`: {e}"))?;
    Ok(name)
}

/// Regular files and directories only (symlinks are skipped: they could
/// point anywhere).
fn copy_tree(from: &Path, to: &Path, budget: &mut (usize, u64)) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", from.display()))?;
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target, budget)?;
        } else if kind.is_file() {
            let size = entry
                .metadata()
                .map_err(|e| format!("{}: {e}", entry.path().display()))?
                .len();
            if budget.0 == 0 || size > budget.1 {
                return Err(format!(
                    "the kernel directory exceeds {MAX_FILES} files or {} MiB",
                    MAX_BYTES / (1024 * 1024)
                ));
            }
            budget.0 -= 1;
            budget.1 -= size;
            std::fs::copy(entry.path(), &target)
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_paths_are_confined_to_the_kernel_root() {
        let root = tempfile::tempdir().expect("root");
        std::fs::create_dir_all(root.path().join("k/sub")).expect("mkdir");
        std::fs::write(root.path().join("k/kernel.c"), "int x;").expect("write");
        std::fs::write(root.path().join("k/sub/a.h"), "").expect("write");
        for bad in ["", "../k", "/etc", "missing"] {
            assert!(resolve_kernel_dir(root.path(), bad).is_err(), "{bad}");
        }
        let ws = tempfile::tempdir().expect("ws");
        let name = ensure_kernel_copy(root.path(), ws.path(), "./k").expect("copy");
        assert_eq!(name, "k");
        assert!(ws.path().join("k/sub/a.h").is_file());
        // A later task keeps the session's edits.
        std::fs::write(ws.path().join("k/kernel.c"), "edited").expect("edit");
        ensure_kernel_copy(root.path(), ws.path(), "k").expect("again");
        assert_eq!(
            std::fs::read_to_string(ws.path().join("k/kernel.c")).expect("read"),
            "edited"
        );
    }
}
