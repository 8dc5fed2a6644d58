//! The adversarial corpus (`tests/adversarial/`): one kernel per way device
//! code could game its own figure, each written to win. Every one is
//! refused at build with an error naming what it did, or stopped at run
//! time with such an error, or runs to a figure no better than the honest
//! kernel doing the same work (`honest.c`). None counts above it.
//!
//! The device code of each is the corpus file; the harness is vecadd's
//! (`predict_check.c` runs with dgemm_gsm's), on 4 cores and 65,536
//! elements.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::path::{Path, PathBuf};

use emulator_support::*;
use mtswarm_hw::{HwError, RunOutcome};

const CORES: u32 = 4;
const SIZE: &[(&str, &str)] = &[("N", "65536")];

/// What a corpus kernel must come to.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The build fails; the error names all of these.
    Refused(&'static [&'static str]),
    /// It runs and is stopped: no figure; the error names all of these.
    Stopped(&'static [&'static str]),
    /// It runs, valid, to exactly the honest figure.
    Honest,
    /// It runs, valid, to a figure no better than the honest one.
    NoBetter,
    /// It runs, valid, to under half the honest figure.
    Slower,
}

/// Every kernel of the corpus with what it must come to (the file's
/// header says why).
const CORPUS: &[(&str, Expect)] = &[
    ("forged_protocol", Expect::NoBetter),
    (
        "scan_everything",
        Expect::Stopped(&["outside every memory the core may use"]),
    ),
    ("scan_reachable", Expect::NoBetter),
    ("write_readonly", Expect::Stopped(&["HT_MEM_RO", "store"])),
    (
        "dma_into_readonly",
        Expect::Stopped(&["dma_p2p", "read-only"]),
    ),
    (
        "memcpy_into_readonly",
        Expect::Stopped(&["memset", "read-only"]),
    ),
    ("range_first_byte", Expect::Slower),
    (
        "range_straddle",
        Expect::Stopped(&["memcpy", "not one memory the core may use"]),
    ),
    ("hidden_constructs", Expect::NoBetter),
    ("line_marker", Expect::Refused(&["line marker"])),
    ("useless_flops", Expect::NoBetter),
    ("host_oracle", Expect::Honest),
    ("host_include", Expect::Refused(&["passwd"])),
    (
        "host_threads",
        Expect::Refused(&["pthread_create", "host threads"]),
    ),
    ("direct_ddr", Expect::Slower),
    ("own_global", Expect::Refused(&["globals"])),
    ("grow_memory", Expect::Refused(&["fixed size"])),
    ("other_core", Expect::Stopped(&["core 1", "core 0's"])),
    ("stack_overflow", Expect::Stopped(&["stack overflow"])),
];

/// Kernels with tests of their own below.
const SPECIAL: &[&str] = &["honest", "cached_answer", "predict_check"];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/adversarial")
}

fn corpus_file(name: &str) -> String {
    std::fs::read_to_string(corpus_dir().join(format!("{name}.c"))).expect("corpus file")
}

/// A kernel directory: `harness` (a kernel directory's host.c, with the
/// `sizes.h` beside it if there is one) with the corpus kernel `name` as its
/// device code and the honest helper beside it (with the example vecadd it
/// includes).
fn corpus_fixture(name: &str, harness: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(harness, dir.path().join("host.c")).expect("copy host.c");
    let sizes = harness.with_file_name("sizes.h");
    if sizes.is_file() {
        std::fs::copy(sizes, dir.path().join("sizes.h")).expect("copy sizes.h");
    }
    std::fs::write(dir.path().join("kernel.c"), corpus_file(name)).expect("kernel.c");
    std::fs::copy(corpus_dir().join("honest.h"), dir.path().join("honest.h")).expect("honest.h");
    std::fs::copy(
        kernels_dir().join("vecadd/kernel.c"),
        dir.path().join("vecadd.c"),
    )
    .expect("vecadd.c");
    dir
}

async fn run_corpus(name: &str, runs: u32, cores: u32) -> Result<RunOutcome, HwError> {
    let dir = corpus_fixture(name, &kernels_dir().join("vecadd/host.c"));
    build_and_run(
        &board(cores),
        dir.path(),
        defines("vecadd", SIZE),
        cores,
        runs,
    )
    .await
}

#[test]
fn every_corpus_kernel_has_an_expectation() {
    let mut files: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("corpus dir")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter_map(|n| n.strip_suffix(".c").map(str::to_owned))
        .filter(|n| n != "predictable_check_host")
        .collect();
    files.sort();
    let mut known: Vec<String> = CORPUS
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .chain(SPECIAL.iter().map(|n| (*n).to_owned()))
        .collect();
    known.sort();
    assert_eq!(files, known);
}

#[tokio::test(flavor = "multi_thread")]
async fn no_corpus_kernel_counts_above_the_honest_one() {
    let honest = run_corpus("honest", 1, CORES).await.expect("honest runs");
    assert!(honest.valid, "{:?}", honest.error);
    let honest_cycles = honest.modeled_cycles.expect("modeled");
    let mut report = Vec::new();
    for (name, expect) in CORPUS {
        let result = run_corpus(name, 1, CORES).await;
        report.push(format!("{name}: {}", summary(&result)));
        match (expect, result) {
            (Expect::Refused(needles), Err(e)) => {
                let msg = e.to_string();
                assert!(
                    matches!(e, HwError::Compile(_) | HwError::Capacity(_)),
                    "{name}: {e:?}"
                );
                for needle in *needles {
                    assert!(msg.contains(needle), "{name}: `{needle}` not in: {msg}");
                }
            }
            (Expect::Stopped(needles), Ok(outcome)) => {
                assert!(!outcome.valid, "{name} got a figure: {outcome:?}");
                assert!(outcome.samples.iter().all(|s| !s.valid), "{name}");
                let msg = outcome.error.unwrap_or_default();
                for needle in *needles {
                    assert!(msg.contains(needle), "{name}: `{needle}` not in: {msg}");
                }
            }
            (Expect::Honest, Ok(outcome)) => {
                assert!(outcome.valid, "{name}: {:?}", outcome.error);
                assert_eq!(outcome.modeled_cycles, Some(honest_cycles), "{name}");
                assert_eq!(outcome.gflops, honest.gflops, "{name}");
            }
            (Expect::NoBetter, Ok(outcome)) => {
                assert!(outcome.valid, "{name}: {:?}", outcome.error);
                assert!(
                    outcome.gflops <= honest.gflops,
                    "{name}: {} GFLOPS above the honest {}",
                    outcome.gflops,
                    honest.gflops
                );
            }
            (Expect::Slower, Ok(outcome)) => {
                assert!(outcome.valid, "{name}: {:?}", outcome.error);
                assert!(
                    outcome.gflops < honest.gflops / 2.0,
                    "{name}: {} GFLOPS against the honest {}",
                    outcome.gflops,
                    honest.gflops
                );
            }
            (expect, other) => panic!("{name}: expected {expect:?}, got {other:?}"),
        }
    }
    eprintln!(
        "honest: {} cycles, {:.2} GFLOPS\n{}",
        honest_cycles,
        honest.gflops,
        report.join("\n")
    );
}

fn summary(result: &Result<RunOutcome, HwError>) -> String {
    match result {
        Err(e) => format!("refused: {e}"),
        Ok(o) if o.valid => format!(
            "valid, {:?} cycles, {:.2} GFLOPS",
            o.modeled_cycles, o.gflops
        ),
        Ok(o) => format!("stopped: {}", o.error.clone().unwrap_or_default()),
    }
}

#[tokio::test]
async fn forged_lines_are_device_output_never_figures() {
    let outcome = run_corpus("forged_protocol", 1, CORES).await.expect("runs");
    assert!(outcome.valid, "{:?}", outcome.error);
    assert!(
        outcome
            .output_tail
            .contains("device core 0: MTSWARM_EMU {\"kernel\":\"vecadd_kernel\",\"threads\":1,\"kernel_cycles\":1"),
        "{}",
        outcome.output_tail
    );
    assert_eq!(outcome.samples.len(), 1);
    assert!(outcome.modeled_cycles.expect("modeled") > 1000);
}

#[tokio::test]
async fn an_included_host_file_is_not_echoed() {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let first = passwd.lines().next().unwrap_or("root:x:0:0");
    let err = run_corpus("host_include", 1, CORES)
        .await
        .expect_err("refused");
    let msg = err.to_string();
    assert!(!msg.contains(first) && !msg.contains("root:"), "{msg}");
}

#[tokio::test]
async fn a_replayed_answer_fails_because_inputs_change_every_execution() {
    let outcome = run_corpus("cached_answer", 3, 1).await.expect("runs");
    assert!(outcome.samples[0].valid, "{:?}", outcome.samples[0].error);
    assert!(!outcome.samples[1].valid && !outcome.samples[2].valid);
    assert!(!outcome.valid);
    let seeds: Vec<_> = outcome.samples.iter().map(|s| s.seed).collect();
    assert!(seeds.iter().all(Option::is_some), "{seeds:?}");
    assert_ne!(seeds[0], seeds[1]);
}

#[tokio::test]
async fn a_predicted_check_vector_passes_only_a_harness_that_draws_it_with_the_inputs() {
    let size = [("M", "64"), ("N", "64"), ("K", "64")];
    let run_with = |harness: PathBuf| async move {
        let dir = corpus_fixture("predict_check", &harness);
        let mut d = std::collections::BTreeMap::new();
        for (k, v) in size {
            d.insert(k.to_owned(), v.to_owned());
        }
        build_and_run(&board(2), dir.path(), d, 2, 1)
            .await
            .expect("builds and runs")
    };
    // Against the old harness the attack works: the check passes (the
    // figure still does not count, as the executed flops fall short of
    // the product's, but that is a second line of defence).
    let fooled = run_with(corpus_dir().join("predictable_check_host.c")).await;
    assert!(
        fooled.max_abs_err.is_some_and(|e| e < 1e-9)
            && fooled.output_tail.contains("\"valid\":true"),
        "the attack should fool the old harness's check: {fooled:?}"
    );
    // The real harness draws x after the kernel ran.
    let caught = run_with(kernels_dir().join("dgemm_gsm/host.c")).await;
    assert!(!caught.valid, "{caught:?}");
    assert!(
        caught
            .error
            .as_deref()
            .is_some_and(|e| e.contains("exceeds tolerance")),
        "{:?}",
        caught.error
    );
}
