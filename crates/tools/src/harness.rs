//! The harness stays out of the agent's reach.
//!
//! host.c, tune.toml, the reference and declared harness files judge the
//! kernel; the file tools refuse to change them, and every build is staged
//! from the agent's sources with a pristine copy of the harness taken when
//! the session's tools were made (before any tool ran), checked by hash.
//! A harness changed on disk behind the tools' back is therefore never
//! built, and the hashes of the one that was go into each artifact.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mtswarm_core::ToolError;
use mtswarm_hw::harness::{HarnessSnapshot, is_harness_file};

/// Pristine harness snapshots per kernel directory of the workspace.
pub struct HarnessStore {
    dir: tempfile::TempDir,
    snapshots: Mutex<BTreeMap<PathBuf, HarnessSnapshot>>,
}

impl HarnessStore {
    /// Snapshot every kernel directory (a directory with a host.c) at the
    /// workspace root and one level below.
    pub fn new(workspace: &Path) -> Result<Self, std::io::Error> {
        let store = Self {
            dir: tempfile::Builder::new()
                .prefix("mtswarm-harness-")
                .tempdir()?,
            snapshots: Mutex::new(BTreeMap::new()),
        };
        for dir in crate::workspace::kernel_dirs(workspace) {
            if let Err(e) = store.snapshot(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot snapshot the harness");
            }
        }
        Ok(store)
    }

    fn snapshot(&self, kernel_dir: &Path) -> Result<HarnessSnapshot, ToolError> {
        let mut snapshots = self.snapshots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = snapshots.get(kernel_dir) {
            return Ok(s.clone());
        }
        let into = self
            .dir
            .path()
            .join("snapshots")
            .join(snapshots.len().to_string());
        let snap = HarnessSnapshot::take(kernel_dir, &into)
            .map_err(|e| ToolError::Failed(format!("harness snapshot: {e}")))?;
        snapshots.insert(kernel_dir.to_path_buf(), snap.clone());
        Ok(snap)
    }

    /// The directory to build for `kernel_dir`: its sources with the
    /// pristine harness over them.
    pub fn stage(&self, kernel_dir: &Path, build_id: &str) -> Result<PathBuf, ToolError> {
        let snap = self.snapshot(kernel_dir)?;
        let into = self.dir.path().join("stage").join(build_id);
        snap.stage(kernel_dir, &into)
            .map_err(|e| ToolError::Failed(format!("staging the build: {e}")))
    }

    /// Refuse a write to a harness file (`path` is absolute, inside the
    /// workspace; `shown` is what the model gave).
    pub fn check_writable(&self, path: &Path, shown: &str) -> Result<(), ToolError> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Ok(());
        };
        let name = name.to_string_lossy();
        let known = self
            .snapshots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(dir)
            .is_some_and(|s| s.hashes().contains_key(name.as_ref()));
        if known || (dir.join("host.c").is_file() && is_harness_file(dir, &name)) {
            return Err(ToolError::InvalidArgs(format!(
                "`{shown}` is part of the kernel's harness (host.c, tune.toml, the reference and \
                 declared harness files judge the kernel) and is read-only; edit the kernel \
                 sources instead"
            )));
        }
        Ok(())
    }
}
