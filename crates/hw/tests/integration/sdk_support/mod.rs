//! Shared helpers of the tests that drive the `sdk` backend against the fake
//! MT-3000 toolchain (tests/fixtures/sdk) and that run confined processes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mtswarm_hw::sdk::{ProcessLimits, ProcessOutput, SdkConfig, run_confined};
use mtswarm_hw::{BackendKind, BuildRequest, HwError, Slice};

/// The fake toolchain: `bin/` (compilers and launcher that record their
/// argv), `include/`, `lib/` and a `kernel/` to build.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdk")
}

/// A copy of the fixture kernel in `tmp/kernel`, built into `tmp/build`
/// with no defines.
pub(crate) fn fixture_kernel(tmp: &Path) -> BuildRequest {
    let kernel_dir = tmp.join("kernel");
    std::fs::create_dir_all(&kernel_dir).expect("kernel dir");
    for f in ["kernel.c", "host.c"] {
        std::fs::copy(fixtures().join("kernel").join(f), kernel_dir.join(f)).expect("copy kernel");
    }
    BuildRequest {
        kernel_dir,
        defines: BTreeMap::new(),
        out_dir: tmp.join("build"),
    }
}

/// An sdk configuration on the fake toolchain (found first on `PATH`),
/// whose tools record their argv to `log`.
pub(crate) fn fake_sdk_config(log: &Path) -> SdkConfig {
    let path = format!(
        "{}:{}",
        fixtures().join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    SdkConfig {
        sdk_root: Some(fixtures()),
        env: BTreeMap::from([
            ("PATH".to_string(), path),
            ("MTSWARM_FAKE_LOG".to_string(), log.display().to_string()),
        ]),
        build_timeout_seconds: 30,
        ..SdkConfig::default()
    }
}

/// A 24-core sdk slice of `board`'s `cluster`.
pub(crate) fn sdk_slice(board: &str, cluster: u32) -> Slice {
    Slice {
        board: board.into(),
        cluster: Some(cluster),
        cores: 24,
        backend: BackendKind::Sdk,
    }
}

/// Runs `argv` confined in `cwd` with an empty extra environment and 64 KiB
/// of kept output.
pub(crate) async fn confined(
    argv: &[&str],
    cwd: &Path,
    timeout: Duration,
    limits: &ProcessLimits,
) -> Result<ProcessOutput, HwError> {
    let argv: Vec<String> = argv.iter().map(|w| (*w).to_owned()).collect();
    run_confined(&argv, cwd, &BTreeMap::new(), timeout, limits, 1 << 16).await
}
