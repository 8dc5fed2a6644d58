//! The session's workspace: the one directory the file tools may touch.
//!
//! Model-written paths are untrusted. Every path goes through
//! [`Workspace::resolve`], which refuses absolute paths and `..` components,
//! then resolves symlinks in the deepest existing ancestor and checks that
//! the result is still inside the (canonical) workspace root, so a symlink
//! planted in the workspace cannot lead a read or a write outside it, even
//! for a file whose parent directories do not exist yet.

use std::path::{Component, Path, PathBuf};

/// The kernel directories (those with a host.c) at the workspace root and
/// one level below: where a session's kernels are copied, so where the
/// harness snapshots and the pristine sources are taken.
pub(crate) fn kernel_dirs(workspace: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![workspace.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(workspace) {
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    dirs.retain(|d| d.join("host.c").is_file());
    dirs
}

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path is absolute.
    #[error("`{0}` is an absolute path; give a path relative to the workspace")]
    Absolute(String),
    /// The path has a `..` component.
    #[error("`{0}` contains `..`; paths must stay inside the workspace")]
    ParentDir(String),
    /// The path leaves the workspace through a symlink.
    #[error("`{0}` resolves outside the workspace (through a symlink)")]
    Escape(String),
    /// The path is a symlink whose target does not exist.
    #[error("`{0}` is a symlink to a missing target")]
    Dangling(String),
    /// The path contains a NUL byte.
    #[error("`{0}` contains a NUL character")]
    Nul(String),
    /// The workspace root cannot be created or resolved.
    #[error("workspace {0}")]
    Root(String),
}

/// A refused path is the caller's mistake: the tools report it as invalid
/// arguments, with the path and the reason.
impl From<PathError> for mtswarm_core::ToolError {
    fn from(e: PathError) -> Self {
        Self::InvalidArgs(e.to_string())
    }
}

/// A directory that confines the file tools.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Use (and create) `root` as the workspace.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, PathError> {
        let root = root.as_ref();
        std::fs::create_dir_all(root)
            .map_err(|e| PathError::Root(format!("{}: {e}", root.display())))?;
        let root = std::fs::canonicalize(root)
            .map_err(|e| PathError::Root(format!("{}: {e}", root.display())))?;
        Ok(Self { root })
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Map a workspace-relative path to an absolute path inside the
    /// workspace. The path need not exist.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, PathError> {
        let text = relative.trim();
        if text.contains('\0') {
            return Err(PathError::Nul(text.replace('\0', "\\0")));
        }
        let path = Path::new(text);
        let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
        for component in path.components() {
            match component {
                Component::Normal(part) => parts.push(part),
                Component::CurDir => {}
                Component::ParentDir => return Err(PathError::ParentDir(text.to_owned())),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(PathError::Absolute(text.to_owned()));
                }
            }
        }
        // Deepest ancestor that exists (a dangling symlink counts as existing).
        let mut existing = parts.len();
        let joined = |n: usize| -> PathBuf {
            let mut p = self.root.clone();
            p.extend(&parts[..n]);
            p
        };
        while existing > 0 && std::fs::symlink_metadata(joined(existing)).is_err() {
            existing -= 1;
        }
        let anchor = joined(existing);
        let canonical = match std::fs::canonicalize(&anchor) {
            Ok(c) => c,
            Err(_) => return Err(PathError::Dangling(text.to_owned())),
        };
        if !canonical.starts_with(&self.root) {
            return Err(PathError::Escape(text.to_owned()));
        }
        let mut resolved = canonical;
        resolved.extend(&parts[existing..]);
        Ok(resolved)
    }

    /// The workspace-relative form of an absolute path inside it (for output).
    pub fn relative(&self, absolute: &Path) -> String {
        match absolute.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".into(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => absolute.display().to_string(),
        }
    }
}
