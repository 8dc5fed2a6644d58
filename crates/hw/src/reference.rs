//! The reference kernel: a small, known-good vecadd (`emu/reference/`)
//! every backend builds and runs, which tells a slice's failure from a
//! candidate's.
//!
//! A candidate that is wrong, flagged, trapping or hanging is the
//! candidate's problem; a slice is failing only when a kernel known to be
//! right fails on it too. The worker's slice health runs this after every
//! failed run and counts the failure only if this fails as well.

use std::path::{Path, PathBuf};

use crate::error::HwError;
use crate::error::io_err;

const SOURCES: &[(&str, &str)] = &[
    ("kernel.c", include_str!("../emu/reference/kernel.c")),
    ("host.c", include_str!("../emu/reference/host.c")),
];

/// Write the reference kernel directory under `dir` (unless it is there
/// with the same content) and return it.
pub fn write_reference_kernel(dir: &Path) -> Result<PathBuf, HwError> {
    let kernel_dir = dir.join("reference-kernel");
    std::fs::create_dir_all(&kernel_dir).map_err(|e| io_err("creating", &kernel_dir, e))?;
    for (name, content) in SOURCES {
        let path = kernel_dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(*content) {
            std::fs::write(&path, content).map_err(|e| io_err("writing", &path, e))?;
        }
    }
    Ok(kernel_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_directory_is_written_once_and_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = write_reference_kernel(tmp.path()).expect("written");
        assert!(dir.join("kernel.c").is_file() && dir.join("host.c").is_file());
        let before = std::fs::metadata(dir.join("kernel.c"))
            .and_then(|m| m.modified())
            .expect("mtime");
        assert_eq!(write_reference_kernel(tmp.path()).expect("again"), dir);
        let after = std::fs::metadata(dir.join("kernel.c"))
            .and_then(|m| m.modified())
            .expect("mtime");
        assert_eq!(before, after);
    }
}
