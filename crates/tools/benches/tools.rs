//! Per-call overheads that scale with the number of sessions on a worker:
//! confining a path, the static kernel analysis, and an uncontended slice
//! lock round trip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::lock::HwLock;
use mtswarm_tools::Workspace;
use mtswarm_tools::analyze::analyze_source;

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("a/b")).expect("mkdir");
    std::fs::write(dir.path().join("a/b/kernel.c"), "x").expect("write");
    let ws = Workspace::new(dir.path()).expect("workspace");
    c.bench_function("workspace_resolve_existing", |b| {
        b.iter(|| ws.resolve("a/b/kernel.c").expect("resolves"))
    });
    c.bench_function("workspace_resolve_new_file", |b| {
        b.iter(|| ws.resolve("a/b/new/dir/file.c").expect("resolves"))
    });

    let kernel = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels/vecadd/kernel.c"),
    )
    .unwrap_or_default();
    let spec = ChipSpec::default();
    let defines = BTreeMap::from([("CHUNK".to_string(), "2048".to_string())]);
    c.bench_function("analyze_vecadd", |b| {
        b.iter(|| analyze_source(&kernel, &defines, &spec))
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let lock = HwLock::new();
    c.bench_function("hw_lock_acquire_release", |b| {
        b.iter(|| runtime.block_on(async { drop(lock.acquire("board0/c0").await) }))
    });
}

criterion_group!(tool_benches, benches);
criterion_main!(tool_benches);
