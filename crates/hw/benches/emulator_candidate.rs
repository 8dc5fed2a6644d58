//! Host cost of evaluating one tuning candidate on the emulator: build the
//! cluster-scale dgemm_gsm kernel directory at its tune.toml defaults and
//! run it once on a whole 24-core cluster (what a worker pays per candidate
//! in the demo), the build alone and the run alone.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_hw::{BackendKind, Board, BuildRequest, ChipSpec, RunRequest, Slice};

fn candidate(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let kernel_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels/dgemm_gsm");
    let space = TuneSpace::load(&kernel_dir).expect("tune.toml");
    let defines = space.defines(&space.default_config());
    let cache = tempfile::tempdir().expect("cache dir");
    let out = tempfile::tempdir().expect("out dir");
    let slice = Slice {
        board: "bench".into(),
        cluster: Some(0),
        cores: 24,
        backend: BackendKind::Emulator,
    };
    let board = EmulatorBoard::new(slice, ChipSpec::default())
        .expect("board")
        .with_cache_dir(cache.path());
    let build = BuildRequest {
        kernel_dir,
        defines,
        out_dir: out.path().to_path_buf(),
    };
    let run = RunRequest {
        cores: 24,
        runs: 1,
        timeout: Duration::from_secs(120),
        args: Vec::new(),
        seed: None,
    };
    let artifact = runtime.block_on(board.build(&build)).expect("builds");

    let mut group = c.benchmark_group("dgemm_gsm_candidate");
    group.sample_size(10);
    group.bench_function("build_and_run", |b| {
        b.to_async(&runtime).iter(|| async {
            let artifact = board.build(&build).await.expect("builds");
            board.run(&artifact, &run).await.expect("runs")
        })
    });
    group.bench_function("build", |b| {
        b.to_async(&runtime)
            .iter(|| async { board.build(&build).await.expect("builds") })
    });
    group.bench_function("run", |b| {
        b.to_async(&runtime)
            .iter(|| async { board.run(&artifact, &run).await.expect("runs") })
    });
    group.finish();
}

criterion_group!(benches, candidate);
criterion_main!(benches);
