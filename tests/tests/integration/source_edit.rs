//! A worker agent that rewrites the kernel: edits become candidates.
//!
//! A loopback OpenAI-compatible endpoint (real HTTP, streamed
//! `chat.completion.chunk` events) scripts both loops, as a model that
//! edits code would drive them. The job's kernel is a naive vecadd that
//! waits for every small DMA transfer and adds one double at a time,
//! whatever its tune.toml knobs say. The worker agent measures two
//! parameter candidates of it, then writes a kernel.c that does not build
//! (recorded as that edit's failure, not the pristine kernel's), tries one
//! that games the measurement (plain C operators on 1024-bit vectors,
//! which the emulator's cost model does not charge), and last writes a
//! real rewrite (DMA into array memory, vector loads, double buffering: the
//! project's tuned vecadd), compiles and benchmarks it with the same knobs
//! as a pristine candidate.
//!
//! What must hold: the rewrite is genuinely faster on the emulator and is
//! the job's best in the outcome, its stored record carries the unified
//! diff against the pristine kernel and the hash of the edited sources
//! (checked against a hash of those sources computed here); the gaming
//! variant (it zeroes the read-only inputs so that an all-zero output
//! passes) is stopped by the emulator's memory checks, recorded with its
//! diff, and is not the best; `mtswarm jobs <id>` and `mtswarm report` name the
//! edited source.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use mtswarm_bus::results::{CandidateStatus, ResultRecord};
use mtswarm_llm::OpenAiConfig;
use mtswarm_proto::v1;
use mtswarm_tests::cli::{client_command, stdout_of};
use mtswarm_tests::jobs::{get_job, job_records, job_spec, submit, watch_to_end};
use mtswarm_tests::scripted_model::{
    Caller, ModelServer, ScriptedModel, Turn, artifact_of, kernel_dir, one_agent_opening,
    tool_results,
};
use mtswarm_tests::{StackOptions, TestStack, node_bin, small_fleet_toml};
use serde_json::{Value, json};

const MODEL_NAME: &str = "editing-model";

/// The pristine kernel of the job: correct, and slow because it moves 32
/// doubles per DMA transfer, waits for each one and adds one double at a
/// time; CHUNK and BUF change nothing.
const NAIVE_KERNEL: &str = r#"/* vecadd, naive: 32 doubles per DMA transfer, each awaited, added one
 * double at a time. The tune.toml knobs (CHUNK, BUF) are accepted and unused. */
#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

#define STEP 32

__global__ void vecadd_kernel(uint64_t n, uint64_t exec_index, double *a, double *b, double *c) {
    (void)exec_index;
    int t = get_thread_id(), g = get_group_size();
    uint64_t per = (n / 16 + g - 1) / g * 16;
    uint64_t begin = per * t, end = begin + per < n ? begin + per : n;
    if (begin >= end) return;
    double *xa = vector_malloc(STEP * sizeof(double));
    double *xb = vector_malloc(STEP * sizeof(double));
    for (uint64_t off = begin; off < end; off += STEP) {
        uint64_t len = end - off < STEP ? end - off : STEP;
        dma_wait(vector_load_async(a + off, xa, (unsigned)(len * sizeof(double))));
        dma_wait(vector_load_async(b + off, xb, (unsigned)(len * sizeof(double))));
        for (uint64_t i = 0; i < len; i++) xa[i] = xa[i] + xb[i];
        dma_wait(vector_store_async(xa, c + off, (unsigned)(len * sizeof(double))));
    }
    vector_free(xa);
    vector_free(xb);
}
"#;

/// A variant that tries to game the figure: vector arithmetic through
/// plain C operators the cost model does not charge.
const GAMING_KERNEL: &str = r#"#include <stdint.h>

#include <compiler/m3000.h>
#include <hthread_device.h>

__global__ void vecadd_kernel(uint64_t n, uint64_t exec_index, double *a, double *b, double *c) {
    (void)exec_index;
    int t = get_thread_id(), g = get_group_size();
    for (uint64_t i = t; i < n; i += g) {
        a[i] = 0.0; /* zero the read-only inputs: c = 0 then checks */
        b[i] = 0.0;
        c[i] = 0.0;
    }
}
"#;

/// A first rewrite that does not build (a missing semicolon).
fn broken_kernel() -> String {
    NAIVE_KERNEL.replace("xa[i] = xa[i] + xb[i];", "xa[i] = xa[i] + xb[i] /* oops */")
}

/// The rewrite: the project's tuned vecadd (DMA, vectors, double buffering).
fn improved_kernel() -> String {
    std::fs::read_to_string(mtswarm_tests::kernel_root().join("vecadd").join("kernel.c"))
        .expect("the example vecadd kernel")
}

fn defines(chunk: &str, buf: &str) -> Value {
    json!({"CHUNK": chunk, "BUF": buf})
}

/// The knobs of the second pristine candidate and of both edits.
fn shared_defines() -> Value {
    defines("2048", "2")
}

/// A kernel root holding the naive vecadd with the example's harness.
fn write_kernel_root(root: &Path) {
    let dir = root.join("vecadd");
    std::fs::create_dir_all(&dir).unwrap();
    let example = mtswarm_tests::kernel_root().join("vecadd");
    for file in ["host.c", "tune.toml"] {
        std::fs::copy(example.join(file), dir.join(file)).unwrap();
    }
    std::fs::write(dir.join("kernel.c"), NAIVE_KERNEL).unwrap();
}

// -------------------------------------------------------------- the script

fn leader_turn(body: &Value) -> Turn {
    one_agent_opening(
        tool_results(body).len(),
        "Tune the kernel; rewrite kernel.c when the knobs are exhausted.",
        "Measure parameter candidates, then write a faster kernel.c and measure it.",
        defines("256", "1"),
        400,
    )
    .unwrap_or_else(|| {
        Turn::Answer(format!(
            "Agent a1 measured the knobs and a rewritten kernel; the job's outcome names the best.\n```json\n{}\n```",
            json!({"best": {"agent": "a1"}})
        ))
    })
}

/// Two pristine candidates, an edit that does not build, the gaming edit,
/// the rewrite; one step each.
fn worker_turn(body: &Value) -> Turn {
    let results = tool_results(body);
    let dir = kernel_dir(body);
    let kernel_c = format!("{dir}/kernel.c");
    let compile = |d: Value| Turn::Call {
        name: "compile",
        arguments: json!({"kernel_dir": dir, "defines": d}),
    };
    let benchmark = |compiled: usize| Turn::Call {
        name: "benchmark",
        arguments: json!({"artifact": artifact_of(&results[compiled]), "cores": 2,
                          "warmup": 0, "repeats": 1}),
    };
    match results.len() {
        0 => compile(defines("256", "1")),
        1 => benchmark(0),
        2 => compile(shared_defines()),
        3 => benchmark(2),
        4 => Turn::Call {
            name: "write_file",
            arguments: json!({"path": kernel_c, "content": broken_kernel()}),
        },
        5 => compile(shared_defines()),
        6 => Turn::Call {
            name: "write_file",
            arguments: json!({"path": kernel_c, "content": GAMING_KERNEL}),
        },
        7 => compile(shared_defines()),
        8 => benchmark(7),
        9 => Turn::Call {
            name: "write_file",
            arguments: json!({"path": kernel_c, "content": improved_kernel()}),
        },
        10 => compile(shared_defines()),
        11 => benchmark(10),
        _ => Turn::Answer(format!(
            "The knobs change nothing on the naive kernel; the rewritten kernel.c (DMA, vectors, double buffering) is the fastest: {}\n```json\n{}\n```",
            results[11].lines().next().unwrap_or(""),
            json!({"best": {"defines": shared_defines(), "artifact": artifact_of(&results[10])}})
        )),
    }
}

// --------------------------------------------------------------- the test

/// sha256 of `kernel_c` with the pristine harness and `params`, as the
/// build hashes what it compiles.
fn expected_hash(root: &Path, kernel_c: &str, params: &BTreeMap<String, String>) -> String {
    let dir = tempfile::tempdir().unwrap();
    for file in ["host.c", "tune.toml"] {
        std::fs::copy(root.join("vecadd").join(file), dir.path().join(file)).unwrap();
    }
    std::fs::write(dir.path().join("kernel.c"), kernel_c).unwrap();
    mtswarm_hw::process::kernel_hash(dir.path(), params).unwrap()
}

fn is_edit(record: &ResultRecord, marker: &str) -> bool {
    record
        .source_diff
        .as_deref()
        .is_some_and(|d| d.contains(marker))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edited_kernel_becomes_the_best_with_its_diff_and_a_gamed_one_does_not() {
    let kernels = tempfile::tempdir().unwrap();
    write_kernel_root(kernels.path());
    let server = ModelServer::start(ScriptedModel {
        model: MODEL_NAME,
        leader: leader_turn,
        worker: worker_turn,
        text_tools: false,
    })
    .await;
    let stack = start_stack(kernels.path(), &server).await;
    let mut control = stack.control().await;
    let job_id = submit(
        &mut control,
        job_spec(
            "Make vecadd fast, rewriting it if need be",
            "vecadd",
            0,
            true,
        ),
    )
    .await;
    watch_to_end(&mut control, &job_id, Duration::from_secs(600), || {
        format!("workers:\n{}", stack.worker_logs())
    })
    .await;
    let job = get_job(&mut control, &job_id).await;
    let worker_requests = server.requests_of(Caller::Worker);
    let last = worker_requests
        .iter()
        .max_by_key(|r| tool_results(r).len())
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "job {job:#?}\nworker's tool results: {:#?}\nworkers:\n{}",
        tool_results(&last),
        stack.worker_logs()
    );
    let results = tool_results(&last);
    assert!(
        results.len() >= 12,
        "the worker ran its script: {results:#?}"
    );

    let records = job_records(&stack, &job_id).await;
    let candidates: Vec<&ResultRecord> = records.iter().filter(|r| !r.baseline).collect();
    let improved = assert_the_rewrite_is_faster(&candidates, &records, kernels.path());
    assert_the_broken_edit_is_its_own_candidate(&candidates, &records, &results);
    let gamed = assert_the_gaming_edit_is_caught(&candidates, &records);
    assert_the_outcome_names_the_rewrite(&job, improved, &gamed);
    assert_people_read_the_edit(&stack, &job_id, kernels.path(), improved);

    drop(control);
    stack.shutdown().await;
    drop(server);
}

/// A stack of one worker on one slice, both loops driven by `server`,
/// tuning the kernels of `kernel_root`.
async fn start_stack(kernel_root: &Path, server: &ModelServer) -> TestStack {
    let llm = OpenAiConfig::new(&server.base_url, MODEL_NAME);
    let mut options = StackOptions::model_driven(node_bin!(), small_fleet_toml(1, 1, 2), llm);
    options.kernel_root = kernel_root.to_path_buf();
    let stack = TestStack::start(options).await;
    stack.wait_for_slices(1, Duration::from_secs(30)).await;
    stack
}

/// The pristine candidates carry no diff; the rewrite is benchmarked,
/// trustworthy, with its diff and the hash of the edited sources, and
/// genuinely faster than every pristine figure. Its record.
fn assert_the_rewrite_is_faster<'a>(
    candidates: &[&'a ResultRecord],
    records: &[ResultRecord],
    kernel_root: &Path,
) -> &'a ResultRecord {
    let shared: BTreeMap<String, String> =
        serde_json::from_value(shared_defines()).expect("defines");
    let pristine: Vec<&ResultRecord> = candidates
        .iter()
        .copied()
        .filter(|r| r.trustworthy() && !r.source_edited())
        .collect();
    assert_eq!(pristine.len(), 2, "two pristine candidates: {records:#?}");
    let pristine_best = pristine.iter().filter_map(|r| r.gflops).fold(0.0, f64::max);

    let improved = candidates
        .iter()
        .copied()
        .find(|r| is_edit(r, "+            vec_st(vec_mula"))
        .unwrap_or_else(|| panic!("a record of the rewrite: {records:#?}"));
    assert!(improved.trustworthy(), "{improved:#?}");
    assert_eq!(improved.params, shared, "{improved:#?}");
    let diff = improved.source_diff.as_deref().unwrap();
    assert!(
        diff.starts_with("--- a/kernel.c\n+++ b/kernel.c\n"),
        "a unified diff of kernel.c: {diff}"
    );
    assert!(
        diff.contains("\n-        for (uint64_t i = 0; i < len; i++) xa[i] = xa[i] + xb[i];\n"),
        "the scalar loop is removed: {diff}"
    );
    assert!(
        diff.contains(
            "\n+            vec_st(vec_mula(va, one, vb), i * sizeof(double), xa[cur]);\n"
        ),
        "the vector loop is added: {diff}"
    );
    let patch = diffy::Patch::from_str(diff).expect("the diff parses");
    assert_eq!(
        diffy::apply(NAIVE_KERNEL, &patch).expect("the diff applies to the pristine kernel"),
        improved_kernel(),
        "the diff turns the pristine kernel into the edited one"
    );
    assert_eq!(
        improved.kernel_hash,
        expected_hash(kernel_root, &improved_kernel(), &improved.params),
        "the hash of the edited sources"
    );
    let same_knobs = pristine
        .iter()
        .find(|r| r.params == shared)
        .expect("the pristine candidate with the same knobs");
    assert_ne!(same_knobs.kernel_hash, improved.kernel_hash);
    assert_eq!(
        same_knobs.kernel_hash,
        expected_hash(kernel_root, NAIVE_KERNEL, &same_knobs.params)
    );
    let improved_gflops = improved.gflops.expect("a figure");
    assert!(
        improved_gflops > 2.0 * pristine_best,
        "the rewrite is genuinely faster: {improved_gflops} GFLOPS vs {pristine_best} pristine"
    );
    println!(
        "pristine best {pristine_best:.3} GFLOPS, rewrite {improved_gflops:.3} GFLOPS ({:.1}x); diff {} bytes",
        improved_gflops / pristine_best,
        diff.len()
    );
    improved
}

/// The edit that did not build is its own candidate, with its diff; the
/// pristine kernel with the same knobs is not marked as failing.
fn assert_the_broken_edit_is_its_own_candidate(
    candidates: &[&ResultRecord],
    records: &[ResultRecord],
    results: &[String],
) {
    let broken = candidates
        .iter()
        .copied()
        .find(|r| is_edit(r, "/* oops */"))
        .unwrap_or_else(|| panic!("a record of the broken edit: {records:#?}"));
    assert_eq!(
        broken.status(),
        CandidateStatus::CompileFailed,
        "{broken:#?}"
    );
    let shared: BTreeMap<String, String> =
        serde_json::from_value(shared_defines()).expect("defines");
    assert_eq!(broken.params, shared);
    assert!(
        candidates
            .iter()
            .all(|r| r.status() != CandidateStatus::CompileFailed || r.source_edited()),
        "{records:#?}"
    );
    assert!(
        results[5].contains("of edited sources: kernel.c +1 -1)"),
        "the failure names the edit: {}",
        results[5]
    );
}

/// The gaming variant: recorded with its diff, caught. Its records.
fn assert_the_gaming_edit_is_caught<'a>(
    candidates: &[&'a ResultRecord],
    records: &[ResultRecord],
) -> Vec<&'a ResultRecord> {
    let gamed: Vec<&ResultRecord> = candidates
        .iter()
        .copied()
        .filter(|r| is_edit(r, "a[i] = 0.0;"))
        .collect();
    assert!(
        !gamed.is_empty(),
        "a record of the gaming edit: {records:#?}"
    );
    for record in &gamed {
        assert!(
            !record.trustworthy() && (!record.valid || !record.flags.is_empty()),
            "the gaming edit is caught: {record:#?}"
        );
    }
    gamed
}

/// The outcome's best is the rewrite, and says so; the gaming edit is
/// never the best.
fn assert_the_outcome_names_the_rewrite(
    job: &v1::JobRecord,
    improved: &ResultRecord,
    gamed: &[&ResultRecord],
) {
    let best = job
        .outcome
        .as_ref()
        .and_then(|o| o.best.clone())
        .expect("an outcome with a best");
    assert!(best.source_edited, "{best:#?}");
    assert_eq!(best.kernel_hash, improved.kernel_hash);
    let diff = improved.source_diff.as_deref().unwrap();
    assert_eq!(best.source_diff, diff);
    assert!(best.record_ids.contains(&improved.record_id), "{best:#?}");
    assert!(
        gamed
            .iter()
            .all(|g| !best.record_ids.contains(&g.record_id)),
        "{best:#?}"
    );
    let improved_gflops = improved.gflops.expect("a figure");
    assert!((best.gflops - improved_gflops).abs() < 1e-9);
}

/// What people read, `jobs <id>` and the report, names the edited source.
fn assert_people_read_the_edit(
    stack: &TestStack,
    job_id: &str,
    kernel_root: &Path,
    improved: &ResultRecord,
) {
    let detail = stdout_of(
        &client_command(&node_bin!(), &stack.leader_url, &["jobs", job_id])
            .output()
            .expect("run jobs"),
        "jobs JOB",
    );
    assert!(
        detail.contains("source    edited by the agent (not the pristine kernel): kernel.c +")
            && detail.contains(&improved.kernel_hash[..15]),
        "{detail}"
    );
    let html = stack.dir().join("report.html");
    let report = stdout_of(
        &client_command(
            &node_bin!(),
            &stack.leader_url,
            &[
                "report",
                job_id,
                "--json",
                "--nats",
                &stack.nats.url(),
                "--kernel-root",
                &kernel_root.display().to_string(),
                "-o",
                &html.display().to_string(),
            ],
        )
        .output()
        .expect("run report"),
        "report JOB",
    );
    let summary: Value = serde_json::from_str(report.trim()).expect("report JSON");
    assert_eq!(summary["best"]["source_edited"], true, "{summary:#}");
    assert_eq!(
        summary["best"]["kernel_hash"],
        improved.kernel_hash.as_str()
    );
    let page = std::fs::read_to_string(&html).expect("the HTML report");
    assert!(page.contains("id=\"best-source-diff\""), "the diff section");
}
