//! The emulator's object cache: the host program is compiled once per
//! distinct preprocessed text, so tuned defines it never reads do not
//! recompile it, while a define it does read (or a changed source) does,
//! and a harness linked from a cached object runs and validates.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::path::Path;
use std::time::Duration;

use emulator_support::{defines, kernels_dir, slice};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::{Board, BuildRequest, ChipSpec, RunRequest};

/// Cached objects under a private cache directory.
fn cached_objects(cache: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for runtime in std::fs::read_dir(cache).expect("cache dir").flatten() {
        let objects = runtime.path().join("objects");
        if let Ok(entries) = std::fs::read_dir(&objects) {
            names.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".o")),
            );
        }
    }
    names.sort();
    names
}

#[tokio::test]
async fn host_objects_are_reused_across_tuned_defines_and_rebuilt_when_they_matter() {
    let cache = tempfile::tempdir().expect("cache dir");
    let board = EmulatorBoard::new(slice(2), ChipSpec::default())
        .expect("board")
        .with_cache_dir(cache.path());
    let kernel_dir = kernels_dir().join("dgemm");
    let out = tempfile::tempdir().expect("out dir");
    let build = |name: &str, defines| BuildRequest {
        kernel_dir: kernel_dir.clone(),
        defines,
        out_dir: out.path().join(name),
    };

    let first = board
        .build(&build("first", defines("dgemm", &[])))
        .await
        .expect("builds");
    // host.o and the spec object.
    let after_first = cached_objects(cache.path());
    assert_eq!(after_first.len(), 2, "{after_first:?}");

    // A different tile size: host.c does not read MB, nothing new is cached.
    let second = board
        .build(&build("second", defines("dgemm", &[("MB", "32")])))
        .await
        .expect("builds");
    assert_eq!(cached_objects(cache.path()), after_first);
    assert_ne!(first.kernel_hash, second.kernel_hash);

    // The harness linked from cached objects still checks its answer.
    let run = RunRequest::new(2, 1, Duration::from_secs(120));
    let outcome = board.run(&second, &run).await.expect("runs");
    assert!(outcome.valid, "{outcome:?}");

    // M is read by host.c (it sizes the matrices): a new host object.
    let resized = board
        .build(&build("resized", defines("dgemm", &[("M", "256")])))
        .await
        .expect("builds");
    let after_resize = cached_objects(cache.path());
    assert_eq!(after_resize.len(), 3, "{after_resize:?}");
    let outcome = board.run(&resized, &run).await.expect("runs");
    assert!(outcome.valid, "{outcome:?}");
}
