//! The harness of a kernel directory: the files that judge the kernel.
//!
//! host.c (the correctness check), tune.toml, the reference and whatever
//! tune.toml declares under `harness = [...]` decide whether a figure is
//! right; a model rewarded for speed must not be able to change them. This
//! module names those files, hashes them for each result's provenance and
//! keeps a pristine snapshot outside the agent's workspace that builds are
//! staged from ([`HarnessSnapshot::stage`]), so a harness changed on disk
//! behind the tools' back is never the one that runs.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::HwError;
use crate::tune::TuneSpace;

/// Files that are always harness when present.
const ALWAYS: &[&str] = &["host.c", "tune.toml"];

/// Whether `name` (a path relative to the kernel directory) is a reference
/// file by convention: `reference.*` or `ref_*`.
fn is_reference(name: &str) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name);
    file.starts_with("reference.") || file.starts_with("ref_")
}

/// The harness files of `kernel_dir`, relative paths, sorted.
pub fn harness_files(kernel_dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = ALWAYS
        .iter()
        .filter(|f| kernel_dir.join(f).is_file())
        .map(|f| (*f).to_owned())
        .collect();
    if let Ok(entries) = std::fs::read_dir(kernel_dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_reference(&name) && entry.path().is_file() {
                files.push(name);
            }
        }
    }
    if let Ok(space) = TuneSpace::load(kernel_dir) {
        for declared in space.harness {
            if is_plain_relative(&declared) && kernel_dir.join(&declared).is_file() {
                files.push(declared);
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

fn is_plain_relative(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Whether `relative` (inside a kernel directory) names a harness file of
/// `kernel_dir`.
pub fn is_harness_file(kernel_dir: &Path, relative: &str) -> bool {
    let relative = relative.trim_start_matches("./");
    ALWAYS.contains(&relative)
        || is_reference(relative)
        || harness_files(kernel_dir).iter().any(|f| f == relative)
}

/// sha256 of a file, hex.
pub fn file_hash(path: &Path) -> Result<String, HwError> {
    let bytes = std::fs::read(path)
        .map_err(|e| HwError::kernel_caused(format!("{}: {e}", path.display()), e))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// Relative path -> sha256 of every harness file of `kernel_dir`.
pub fn harness_hashes(kernel_dir: &Path) -> Result<BTreeMap<String, String>, HwError> {
    harness_files(kernel_dir)
        .into_iter()
        .map(|f| {
            let hash = file_hash(&kernel_dir.join(&f))?;
            Ok((f, hash))
        })
        .collect()
}

/// A pristine copy of a kernel directory's harness, taken from the kernel
/// root when a session starts, outside the agent's workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct HarnessSnapshot {
    dir: PathBuf,
    hashes: BTreeMap<String, String>,
}

impl HarnessSnapshot {
    /// Copy the harness files of `kernel_dir` into `into` (created).
    pub fn take(kernel_dir: &Path, into: &Path) -> Result<Self, HwError> {
        let io = |p: &Path, e: std::io::Error| HwError::io(p.display().to_string(), e);
        std::fs::create_dir_all(into).map_err(|e| io(into, e))?;
        let mut hashes = BTreeMap::new();
        for file in harness_files(kernel_dir) {
            let bytes = std::fs::read(kernel_dir.join(&file))
                .map_err(|e| io(&kernel_dir.join(&file), e))?;
            let target = into.join(&file);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::write(&target, &bytes).map_err(|e| io(&target, e))?;
            hashes.insert(file, hex::encode(Sha256::digest(&bytes)));
        }
        Ok(Self {
            dir: into.to_path_buf(),
            hashes,
        })
    }

    /// Relative path -> sha256 of each harness file of the snapshot.
    pub fn hashes(&self) -> &BTreeMap<String, String> {
        &self.hashes
    }

    /// A build directory for `workspace_dir`: its files (the agent's code)
    /// with the pristine harness over them, each harness file checked
    /// against the hash taken with the snapshot. Returns the staged dir
    /// (`into`, replaced).
    pub fn stage(&self, workspace_dir: &Path, into: &Path) -> Result<PathBuf, HwError> {
        let io = |p: &Path, e: std::io::Error| HwError::io(p.display().to_string(), e);
        let _ = std::fs::remove_dir_all(into);
        copy_sources(workspace_dir, into, 0)?;
        for (file, expected) in &self.hashes {
            let source = self.dir.join(file);
            let actual = file_hash(&source)?;
            if &actual != expected {
                return Err(HwError::kernel(format!(
                    "harness file {file} changed since the session started (sha256 {actual}, \
                     expected {expected})"
                )));
            }
            let target = into.join(file);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::copy(&source, &target).map_err(|e| io(&target, e))?;
        }
        Ok(into.to_path_buf())
    }
}

/// Regular files and directories of `from` (no symlinks, bounded depth).
fn copy_sources(from: &Path, to: &Path, depth: usize) -> Result<(), HwError> {
    let io = |p: &Path, e: std::io::Error| HwError::io(p.display().to_string(), e);
    if depth > 8 {
        return Ok(());
    }
    std::fs::create_dir_all(to).map_err(|e| io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io(from, e))?.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if kind.is_dir() {
            copy_sources(&entry.path(), &to.join(&name), depth + 1)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(&name)).map_err(|e| io(&entry.path(), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_harness_changed_on_disk_is_not_staged() {
        let root = tempfile::tempdir().expect("tempdir");
        let ws = root.path().join("ws");
        std::fs::create_dir_all(&ws).expect("mkdir");
        std::fs::write(ws.join("host.c"), "int main(void){return 0;}\n").expect("write");
        std::fs::write(ws.join("kernel.c"), "void k(void){}\n").expect("write");
        let snap = HarnessSnapshot::take(&ws, &root.path().join("snap")).expect("snapshot");
        assert_eq!(snap.hashes().keys().collect::<Vec<_>>(), vec!["host.c"]);
        // The agent's copy changes behind the tools' back: staging ignores it.
        std::fs::write(ws.join("host.c"), "int main(void){return 1;}\n").expect("write");
        let staged = snap.stage(&ws, &root.path().join("stage")).expect("stage");
        let host = std::fs::read_to_string(staged.join("host.c")).expect("read");
        assert!(host.contains("return 0"), "{host}");
        // The snapshot itself changes: refused, naming the file.
        std::fs::write(root.path().join("snap/host.c"), "x").expect("write");
        let err = snap.stage(&ws, &root.path().join("stage")).unwrap_err();
        assert!(err.to_string().contains("host.c changed"), "{err}");
    }
}
