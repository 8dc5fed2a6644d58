//! Runtime materialization: the emulator's C headers (hthreads API, vector
//! intrinsics, harness helpers, the device's own C headers), the harness
//! shim and the `host` backend's native runtime, embedded with
//! `include_str!`, are written to a cache directory keyed by their hash on
//! first use, so an installed binary needs nothing from the source tree.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::error::HwError;
use crate::error::io_err;
use crate::spec::ChipSpec;

/// The emulator's C sources, relative path -> content.
const RUNTIME_SOURCES: &[(&str, &str)] = &[
    (
        "include/hthread_host.h",
        include_str!("../../emu/include/hthread_host.h"),
    ),
    (
        "include/hthread_device.h",
        include_str!("../../emu/include/hthread_device.h"),
    ),
    (
        "include/compiler/m3000.h",
        include_str!("../../emu/include/compiler/m3000.h"),
    ),
    (
        "include/mtswarm_harness.h",
        include_str!("../../emu/include/mtswarm_harness.h"),
    ),
    (
        "include/mtswarm_gemm.h",
        include_str!("../../emu/include/mtswarm_gemm.h"),
    ),
    ("device/float.h", include_str!("../../emu/device/float.h")),
    ("device/limits.h", include_str!("../../emu/device/limits.h")),
    ("device/math.h", include_str!("../../emu/device/math.h")),
    ("device/stdarg.h", include_str!("../../emu/device/stdarg.h")),
    (
        "device/stdbool.h",
        include_str!("../../emu/device/stdbool.h"),
    ),
    ("device/stddef.h", include_str!("../../emu/device/stddef.h")),
    ("device/stdint.h", include_str!("../../emu/device/stdint.h")),
    ("device/string.h", include_str!("../../emu/device/string.h")),
    (
        "runtime/emu_host_shim.c",
        include_str!("../../emu/runtime/emu_host_shim.c"),
    ),
    (
        "runtime/host_runtime.c",
        include_str!("../../emu/runtime/host_runtime.c"),
    ),
];

/// The default cache directory: `$MTSWARM_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/mtswarm`, else `~/.cache/mtswarm`, else the temp dir.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MTSWARM_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("mtswarm");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".cache").join("mtswarm");
    }
    std::env::temp_dir().join("mtswarm-cache")
}

/// The chip spec in the runtime's `key=value;...` form.
pub fn spec_string(spec: &ChipSpec) -> String {
    let m = &spec.model;
    let pairs: [(&str, f64); 23] = [
        ("clusters", f64::from(spec.clusters)),
        ("cores_per_cluster", f64::from(spec.cores_per_cluster)),
        ("vector_lanes", f64::from(spec.vector_lanes)),
        ("fma_per_lane", f64::from(spec.fma_per_lane)),
        ("scalar_issue_slots", f64::from(spec.scalar_issue_slots)),
        ("vector_issue_slots", f64::from(spec.vector_issue_slots)),
        ("clock_hz", spec.clock_hz),
        ("sm_bytes", spec.sm_bytes as f64),
        ("sm_max_buffers", f64::from(spec.sm_max_buffers)),
        ("am_bytes", spec.am_bytes as f64),
        ("am_max_buffers", f64::from(spec.am_max_buffers)),
        ("gsm_bytes", spec.gsm_bytes as f64),
        ("ddr_bytes_per_cluster", spec.ddr_bytes_per_cluster as f64),
        ("ddr_bandwidth", spec.ddr_bandwidth),
        ("dma_startup_cycles", spec.dma_startup_cycles as f64),
        ("latency.get_clk", f64::from(spec.latency.get_clk)),
        ("latency.vlddw", f64::from(spec.latency.vlddw)),
        ("model.vector_mem_slots", f64::from(m.vector_mem_slots)),
        ("model.scalar_block_cycles", m.scalar_block_cycles),
        ("model.barrier_cycles", m.barrier_cycles as f64),
        ("model.gsm_bandwidth", m.gsm_bandwidth),
        ("model.ddr_latency_cycles", m.ddr_latency_cycles),
        ("model.gsm_latency_cycles", m.gsm_latency_cycles),
    ];
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v:e}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// sha256 over the embedded sources: names the runtime in cache paths and
/// in each artifact's toolchain.
pub(crate) fn runtime_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let mut hasher = Sha256::new();
        for (path, content) in RUNTIME_SOURCES {
            hasher.update(path.as_bytes());
            hasher.update([0]);
            hasher.update((content.len() as u64).to_le_bytes());
            hasher.update(content.as_bytes());
        }
        hex::encode(hasher.finalize())
    })
}

/// Write the embedded sources into `<cache>/emu-<hash>/` unless already
/// there; returns that directory. Concurrent callers race safely: each
/// writes a private copy and renames it into place.
pub fn materialize_runtime(cache_dir: &Path) -> Result<PathBuf, HwError> {
    let dir = cache_dir.join(format!("emu-{}", &runtime_hash()[..16]));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache_dir).map_err(|e| io_err("creating", cache_dir, e))?;
    let staging = tempfile::Builder::new()
        .prefix(".emu-staging-")
        .tempdir_in(cache_dir)
        .map_err(|e| io_err("creating a staging dir in", cache_dir, e))?;
    for (rel, content) in RUNTIME_SOURCES {
        let path = staging.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_err("creating", parent, e))?;
        }
        std::fs::write(&path, content).map_err(|e| io_err("writing", &path, e))?;
    }
    std::fs::write(staging.path().join(".complete"), runtime_hash())
        .map_err(|e| io_err("writing", staging.path(), e))?;
    let staged = staging.keep();
    if let Err(e) = std::fs::rename(&staged, &dir) {
        // Another process won the race; its copy is identical.
        let _ = std::fs::remove_dir_all(&staged);
        if !dir.join(".complete").exists() {
            return Err(HwError::io(
                format!("cannot install the emulator runtime into {}", dir.display()),
                e,
            ));
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_string_carries_every_number_the_runtime_needs() {
        let spec = ChipSpec {
            am_bytes: 12345,
            ..ChipSpec::default()
        };
        let s = spec_string(&spec);
        assert!(s.contains("am_bytes=1.2345e4"), "{s}");
        assert_eq!(s.split(';').count(), 23);
    }

    #[test]
    fn a_cache_that_cannot_be_created_is_an_io_error_with_its_source() {
        let root = tempfile::tempdir().expect("tempdir");
        // A regular file where the cache directory should be.
        let blocker = root.path().join("not-a-dir");
        std::fs::write(&blocker, "x").expect("write");
        let cache = blocker.join("cache");
        let err = materialize_runtime(&cache).unwrap_err();
        let HwError::Io { context, source } = &err else {
            panic!("expected an io error, got {err:?}");
        };
        assert_eq!(context, &format!("creating {}", cache.display()));
        assert_eq!(source.kind(), std::io::ErrorKind::NotADirectory);
        let chained = std::error::Error::source(&err).expect("the io error is the source");
        assert_eq!(chained.to_string(), source.to_string());
        assert!(
            err.to_string().contains(&cache.display().to_string()),
            "{err}"
        );
    }
}
