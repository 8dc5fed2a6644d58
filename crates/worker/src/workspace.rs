//! Session workspaces: one directory per session under the workspace root,
//! with the task's kernel directory copied in from the kernel root (by the
//! first task that needs it: a spawn only resolves the directory). Kernel
//! paths come from the network (SpawnSession, task messages), so they are
//! confined to the kernel root and the copy is bounded.

use std::path::{Component, Path, PathBuf};

/// Files one kernel copy may hold.
const MAX_FILES: usize = 2_000;
/// Bytes one kernel copy may hold.
const MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Why a kernel directory is refused or could not be copied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KernelDirError {
    /// The request names no kernel directory.
    #[error("no kernel directory given")]
    Missing,
    /// The path climbs out with `..`.
    #[error("kernel directory `{dir}` contains `..`")]
    ParentDir {
        /// The kernel directory as given.
        dir: String,
    },
    /// The path is absolute.
    #[error("kernel directory `{dir}` is absolute; give it relative to the kernel root")]
    Absolute {
        /// The kernel directory as given.
        dir: String,
    },
    /// The path has no normal component.
    #[error("kernel directory `{dir}` names no directory")]
    NoName {
        /// The kernel directory as given.
        dir: String,
    },
    /// The kernel root itself cannot be resolved.
    #[error("kernel root {}: {source}", root.display())]
    Root {
        /// The daemon's kernel root.
        root: PathBuf,
        /// Why it cannot be resolved.
        #[source]
        source: std::io::Error,
    },
    /// The directory does not exist under the kernel root.
    #[error("kernel directory `{dir}` not found under the kernel root: {source}")]
    NotFound {
        /// The kernel directory as given.
        dir: String,
        /// Why it cannot be resolved.
        #[source]
        source: std::io::Error,
    },
    /// The path resolves (through a link) outside the kernel root.
    #[error("kernel directory `{dir}` leads outside the kernel root")]
    Outside {
        /// The kernel directory as given.
        dir: String,
    },
    /// The path is a file, not a directory.
    #[error("kernel directory `{dir}` is not a directory")]
    NotADirectory {
        /// The kernel directory as given.
        dir: String,
    },
    /// The session's workspace cannot be created.
    #[error("workspace {}: {source}", workspace.display())]
    Workspace {
        /// The session's workspace.
        workspace: PathBuf,
        /// Why it cannot be created.
        #[source]
        source: std::io::Error,
    },
    /// Copying the directory into the workspace failed.
    #[error("copying kernel directory `{dir}`: {source}")]
    Copy {
        /// The kernel directory as given.
        dir: String,
        /// What went wrong in the copy.
        #[source]
        source: CopyError,
    },
}

/// Why copying a kernel directory's tree failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CopyError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Moving the finished copy into place failed.
    #[error(transparent)]
    Rename(std::io::Error),
    /// The tree is over the copy's bounds.
    #[error("the kernel directory exceeds {files} files or {mib} MiB")]
    TooLarge {
        /// Files one copy may hold.
        files: usize,
        /// MiB one copy may hold.
        mib: u64,
    },
}

impl CopyError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The workspace directory of a session.
pub(crate) fn session_workspace(root: &Path, session_id: &str) -> PathBuf {
    root.join(session_id)
}

/// Check a kernel directory named relative to the kernel root; returns the
/// source directory and the name of its copy in the workspace.
pub(crate) fn resolve_kernel_dir(
    kernel_root: &Path,
    kernel_dir: &str,
) -> Result<(PathBuf, String), KernelDirError> {
    let text = kernel_dir.trim();
    if text.is_empty() {
        return Err(KernelDirError::Missing);
    }
    let dir = || text.to_owned();
    let path = Path::new(text);
    let mut name = None;
    for component in path.components() {
        match component {
            Component::Normal(part) => name = Some(part.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(KernelDirError::ParentDir { dir: dir() });
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(KernelDirError::Absolute { dir: dir() });
            }
        }
    }
    let name = name.ok_or_else(|| KernelDirError::NoName { dir: dir() })?;
    let source = kernel_root.join(path);
    let canonical_root =
        std::fs::canonicalize(kernel_root).map_err(|source| KernelDirError::Root {
            root: kernel_root.to_path_buf(),
            source,
        })?;
    let canonical = std::fs::canonicalize(&source)
        .map_err(|source| KernelDirError::NotFound { dir: dir(), source })?;
    if !canonical.starts_with(&canonical_root) {
        return Err(KernelDirError::Outside { dir: dir() });
    }
    if !canonical.is_dir() {
        return Err(KernelDirError::NotADirectory { dir: dir() });
    }
    Ok((canonical, name))
}

/// Copy `kernel_dir` into the workspace unless a copy is already there (a
/// resumed or later task keeps the session's edits). Returns the name of
/// the copy inside the workspace.
pub(crate) fn ensure_kernel_copy(
    kernel_root: &Path,
    workspace: &Path,
    kernel_dir: &str,
) -> Result<String, KernelDirError> {
    let (source, name) = resolve_kernel_dir(kernel_root, kernel_dir)?;
    let target = workspace.join(&name);
    if target.is_dir() {
        return Ok(name);
    }
    std::fs::create_dir_all(workspace).map_err(|source| KernelDirError::Workspace {
        workspace: workspace.to_path_buf(),
        source,
    })?;
    let staging = workspace.join(format!(".{name}.copying"));
    let _ = std::fs::remove_dir_all(&staging);
    let mut budget = (MAX_FILES, MAX_BYTES);
    let copy_failed = |source| KernelDirError::Copy {
        dir: kernel_dir.to_owned(),
        source,
    };
    copy_tree(&source, &staging, &mut budget).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staging);
        copy_failed(e)
    })?;
    std::fs::rename(&staging, &target).map_err(|e| copy_failed(CopyError::Rename(e)))?;
    Ok(name)
}

/// Regular files and directories only (symlinks are skipped: they could
/// point anywhere).
fn copy_tree(from: &Path, to: &Path, budget: &mut (usize, u64)) -> Result<(), CopyError> {
    std::fs::create_dir_all(to).map_err(CopyError::io(to))?;
    let entries = std::fs::read_dir(from).map_err(CopyError::io(from))?;
    for entry in entries {
        let entry = entry.map_err(CopyError::io(from))?;
        let kind = entry.file_type().map_err(CopyError::io(&entry.path()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target, budget)?;
        } else if kind.is_file() {
            let size = entry
                .metadata()
                .map_err(CopyError::io(&entry.path()))?
                .len();
            if budget.0 == 0 || size > budget.1 {
                return Err(CopyError::TooLarge {
                    files: MAX_FILES,
                    mib: MAX_BYTES / (1024 * 1024),
                });
            }
            budget.0 -= 1;
            budget.1 -= size;
            std::fs::copy(entry.path(), &target).map_err(CopyError::io(&entry.path()))?;
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
