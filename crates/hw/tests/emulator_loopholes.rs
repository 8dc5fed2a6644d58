//! One test per way a kernel could game the emulator's figures: each is
//! refused at build (naming the construct or symbol and why) or runs and is
//! refused (invalid or flagged); none gets a figure that counts. And the
//! physics: no valid figure moves DDR bytes faster than the cluster's share
//! or exceeds the peak, and a scalar loop straight from DDR models slower
//! than the tuned DMA vecadd.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod emulator_support;

use emulator_support::*;
use mtswarm_hw::plausibility::Flag;
use mtswarm_hw::{ChipSpec, HwError, RunOutcome};

const SMALL: &[(&str, &str)] = &[("N", "65536")];

async fn build_error(kernel_c: &str) -> String {
    let dir = fixture(kernel_c);
    let d = defines("vecadd", SMALL);
    match build_and_run(&board(4), dir.path(), d, 4, 1).await {
        Err(HwError::Compile(detail)) => detail.message().to_owned(),
        other => panic!("expected a refused build, got {other:?}"),
    }
}

async fn run(kernel_c: &str, cores: u32, runs: u32, overrides: &[(&str, &str)]) -> RunOutcome {
    let dir = fixture(kernel_c);
    let d = defines("vecadd", overrides);
    build_and_run(&board(cores), dir.path(), d, cores, runs)
        .await
        .expect("builds and runs")
}

/// A correct vecadd whose loop does nothing the cost model would charge
/// were the instrumentation off.
fn scalar_vecadd(prelude: &str, attrs: &str) -> String {
    kernel_with_body(
        &format!(
            "{prelude}\n{attrs} static void add(uint64_t lo, uint64_t hi, double *a, double *b, double *c) {{\n\
             for (uint64_t i = lo; i < hi; i++) c[i] = a[i] + b[i];\n}}"
        ),
        "int t = get_thread_id(), g = get_group_size();\n\
         uint64_t per = (n + g - 1) / g, lo = per * t, hi = lo + per < n ? lo + per : n;\n\
         if (lo < hi) add(lo, hi, a, b, c);",
    )
}

#[tokio::test]
async fn instrumentation_off_attributes_and_pragmas_are_refused_by_name_and_line() {
    for (prelude, attrs, construct) in [
        (
            "",
            "__attribute__((no_sanitize_coverage))",
            "no_sanitize_coverage",
        ),
        (
            "",
            "__attribute__((no_sanitize(\"thread\")))",
            "no_sanitize",
        ),
        (
            "",
            "__attribute__((no_instrument_function))",
            "no_instrument_function",
        ),
        ("", "__attribute__((optimize(\"O0\")))", "optimize"),
        (
            "#define QUIET __attribute__((__no_sanitize_thread__))",
            "QUIET",
            "no_sanitize_thread",
        ),
        ("#pragma GCC optimize (\"O3\")", "", "#pragma GCC optimize"),
        (
            "_Pragma(\"GCC optimize(\\\"O1\\\")\")",
            "",
            "#pragma GCC optimize",
        ),
    ] {
        let dir = fixture(&scalar_vecadd(prelude, attrs));
        let msg = match build_and_run(&board(4), dir.path(), defines("vecadd", SMALL), 4, 1).await {
            Err(HwError::Compile(detail)) => detail.message().to_owned(),
            other => panic!("{construct}: expected a refused build, got {other:?}"),
        };
        assert!(msg.contains("refused"), "{construct}: {msg}");
        assert!(msg.contains(construct), "{construct}: {msg}");
        // The line of the construct: the prelude is line 4 of the fixture.
        assert!(
            msg.contains("kernel.c:4") || msg.contains("kernel.c:5"),
            "{construct}: {msg}"
        );
    }
}

#[tokio::test]
async fn inline_asm_and_replaced_runtime_functions_are_refused() {
    let asm = kernel_with_body("", "__asm__ volatile(\"nop\");");
    let msg = build_error(&asm).await;
    assert!(
        msg.contains("kernel.c:7") && msg.contains("__asm__"),
        "{msg}"
    );
    // A local definition of a hook would capture the instrumentation's calls.
    let hook = kernel_with_body("void __tsan_read8(void *p) { (void)p; }", "");
    let msg = build_error(&hook).await;
    assert!(msg.contains("__tsan_read8"), "{msg}");
    let weak = kernel_with_body("__attribute__((weak)) int dma_wait_fast;", "");
    let msg = build_error(&weak).await;
    assert!(msg.contains("weak"), "{msg}");
    let section = kernel_with_body("__attribute__((section(\".text.hot\"))) int x;", "");
    let msg = build_error(&section).await;
    assert!(msg.contains("section"), "{msg}");
    // Defining a function the runtime or the C library provides.
    let libc = kernel_with_body(
        "void *memcpy(void *d, const void *s, unsigned long n) { (void)s; (void)n; return d; }",
        "",
    );
    let msg = build_error(&libc).await;
    assert!(msg.contains("memcpy"), "{msg}");
}

#[tokio::test]
async fn host_facilities_are_refused_with_the_reason() {
    for (prelude, body, symbol, reason) in [
        (
            "#include <pthread.h>\nstatic void *w(void *p) { return p; }",
            "pthread_t th; pthread_create(&th, 0, w, 0); pthread_join(th, 0);",
            "pthread_create",
            "host threads",
        ),
        (
            "#include <stdio.h>",
            "(void)fopen(\"/tmp/answer\", \"r\");",
            "fopen",
            "no file system",
        ),
        (
            "#include <stdlib.h>",
            "(void)getenv(\"KEY\");",
            "getenv",
            "no environment",
        ),
        ("#include <unistd.h>", "(void)fork();", "fork", "processes"),
        (
            "#include <time.h>",
            "struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);",
            "clock_gettime",
            "get_clk",
        ),
        (
            "#include <sys/socket.h>",
            "(void)socket(2, 1, 0);",
            "socket",
            "no network",
        ),
        (
            "#include <signal.h>",
            "signal(2, SIG_IGN);",
            "signal",
            "no signals",
        ),
        (
            "#include <dlfcn.h>",
            "(void)dlopen(\"x\", 1);",
            "dlopen",
            "dynamic loading",
        ),
    ] {
        let msg = build_error(&kernel_with_body(prelude, body)).await;
        assert!(
            msg.contains(&format!("`{symbol}`")) && msg.contains(reason),
            "{symbol}: {msg}"
        );
    }
}

#[tokio::test]
async fn an_included_host_file_is_refused_without_its_content() {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let first = passwd.lines().next().unwrap_or("root:x:0:0");
    for include in [
        "#include \"/etc/passwd\"",
        "#include </etc/passwd>",
        "#include \"../../../../../../etc/passwd\"",
    ] {
        let msg = build_error(&kernel_with_body(include, "")).await;
        assert!(
            msg.contains("refused") || msg.contains("Permission denied"),
            "{msg}"
        );
        assert!(!msg.contains(first), "content echoed: {msg}");
        assert!(!msg.contains("root:"), "content echoed: {msg}");
    }
    // A symlink in the kernel directory to a host file is the same file.
    let dir = fixture(&kernel_with_body("#include \"secret.h\"", ""));
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("secret.h")).expect("symlink");
    let err = build_and_run(&board(2), dir.path(), defines("vecadd", SMALL), 2, 1)
        .await
        .expect_err("refused");
    let msg = err.to_string();
    assert!(!msg.contains(first) && !msg.contains("root:"), "{msg}");
}

#[tokio::test]
async fn a_replayed_answer_fails_because_inputs_change_every_execution() {
    // Computes once, then replays the remembered output (what a file cache
    // across runs would do; files are refused, so it keeps it in memory).
    let replay = kernel_with_body(
        "static double saved[1 << 16]; static int have;",
        "int t = get_thread_id(), g = get_group_size();\n\
         for (uint64_t i = t; i < n; i += g) c[i] = have ? saved[i] : a[i] + b[i];\n\
         if (!have && t == 0) { for (uint64_t i = 0; i < n; i++) saved[i] = c[i]; have = 1; }",
    );
    let outcome = run(&replay, 1, 3, SMALL).await;
    assert!(outcome.samples[0].valid, "{:?}", outcome.samples[0].error);
    assert!(!outcome.samples[1].valid && !outcome.samples[2].valid);
    assert!(!outcome.valid);
    let seeds: Vec<_> = outcome.samples.iter().map(|s| s.seed).collect();
    assert!(seeds.iter().all(Option::is_some), "{seeds:?}");
    assert_ne!(seeds[0], seeds[1]);
}

#[tokio::test]
async fn uncharged_vector_arithmetic_is_flagged_not_counted() {
    // Plain C operators on 1024-bit vectors are not the intrinsics the cost
    // model charges: the harness's flops were not executed where it saw.
    let sneaky = kernel_with_body(
        "",
        "int t = get_thread_id(), g = get_group_size();\n\
         for (uint64_t i = 16 * t; i + 16 <= n; i += 16 * g) {\n\
           mtswarm_vdouble x, y; __builtin_memcpy(&x, a + i, 128); __builtin_memcpy(&y, b + i, 128);\n\
           x = x + y; __builtin_memcpy(c + i, &x, 128); }",
    );
    let outcome = run(&sneaky, 4, 1, SMALL).await;
    assert!(!outcome.valid, "{outcome:?}");
    assert!(
        outcome.flags.contains(&Flag::ClaimsUnexecutedFlops),
        "{:?}",
        outcome.flags
    );
}

#[tokio::test]
async fn physics_holds_and_direct_ddr_is_slower_than_dma() {
    let spec = ChipSpec::default();
    let direct = scalar_vecadd("", "");
    let direct_outcome = run(&direct, 24, 2, &[]).await;
    let dma = run_example("vecadd", &[], 24, 2).await.expect("runs");
    assert!(
        direct_outcome.valid && dma.valid,
        "{direct_outcome:?} {dma:?}"
    );
    assert!(
        direct_outcome.gflops < dma.gflops,
        "direct DDR {} GFLOPS must model slower than DMA {} GFLOPS",
        direct_outcome.gflops,
        dma.gflops
    );
    let mut checked = vec![("direct vecadd", direct_outcome), ("dma vecadd", dma)];
    for (kernel, overrides) in [
        ("dgemm", vec![]),
        (
            "dgemm",
            vec![
                ("VARIANT", "naive"),
                ("M", "128"),
                ("N", "128"),
                ("K", "128"),
            ],
        ),
        ("dgemm", vec![("B_GSM", "1")]),
        ("spmv", vec![]),
        ("stencil2d", vec![]),
        ("vecadd", vec![("BUF", "1"), ("CHUNK", "256")]),
    ] {
        let outcome = run_example(kernel, &overrides, 24, 1).await.expect("runs");
        assert!(outcome.valid, "{kernel} {overrides:?}: {:?}", outcome.error);
        checked.push((kernel, outcome));
    }
    for (name, o) in &checked {
        assert!(o.flags.is_empty(), "{name}: {:?}", o.flags);
        for s in o.samples.iter().filter(|s| s.valid) {
            let ddr_rate = s.counters.ddr_bytes as f64 / s.seconds;
            assert!(
                ddr_rate <= spec.cluster_bandwidth() * 1.001,
                "{name}: {ddr_rate:e} B/s over DDR"
            );
            assert!(
                o.peak_fraction <= 1.0,
                "{name}: {} of peak",
                o.peak_fraction
            );
            assert!(s.counters.flops > 0, "{name}: no executed flops counted");
        }
    }
}
