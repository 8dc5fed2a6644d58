//! Content hashes: the identity of the code that was measured, and the
//! check that a cached file is still what was stored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::HwError;
use crate::error::io_err;

/// sha256 over the kernel directory's sources (`*.c`, `*.h`, sorted by name)
/// and the defines.
pub fn kernel_hash(
    kernel_dir: &Path,
    defines: &BTreeMap<String, String>,
) -> Result<String, HwError> {
    let entries = std::fs::read_dir(kernel_dir)
        .map_err(|e| HwError::kernel_caused(format!("{}: {e}", kernel_dir.display()), e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|x| x.to_str()), Some("c" | "h"))
        })
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let content = std::fs::read(&file).map_err(|e| io_err("reading", &file, e))?;
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(&content);
    }
    for (k, v) in defines {
        hasher.update(format!("-D{k}={v}\n").as_bytes());
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Whether `file`'s sha256 is the one recorded in `hash_file`.
pub(crate) fn verified(file: &Path, hash_file: &Path) -> bool {
    let (Ok(bytes), Ok(expected)) = (std::fs::read(file), std::fs::read_to_string(hash_file))
    else {
        return false;
    };
    let ok = hex::encode(Sha256::digest(&bytes)) == expected.trim();
    if !ok {
        tracing::warn!(file = %file.display(), "cached object does not match its recorded hash; rebuilding it");
    }
    ok
}
