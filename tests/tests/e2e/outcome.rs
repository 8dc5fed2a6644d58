//! The README flow as processes: a local stack with the builtin policies,
//! `mtswarm submit ... --auto-approve --watch` as a process, its exit code,
//! `mtswarm jobs ID --json`, `mtswarm report ID` and `mtswarm cancel ID`,
//! checked against the results store itself.
//!
//! - A dgemm job SUCCEEDS, exit 0, and its outcome's best is the best valid
//!   record of the job in the results store.
//! - A job whose kernel does not compile ends FAILED with its reason, exit 1.
//! - `mtswarm cancel` ends a running job CANCELLED and its agents stop (the
//!   slices are free again).
//!
//! The kernels are copies of the examples with a smaller tuning space, so a
//! job takes seconds of emulated work rather than minutes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mtswarm_bus::results::{CandidateStatus, ResultRecord};
use mtswarm_proto::v1;
use mtswarm_tests::jobs::job_records;
use mtswarm_tests::stack::wait_for_free_slices;
use mtswarm_tests::{NodeProcess, StackOptions, TestStack, node_bin, small_fleet_toml};
use serde_json::Value;

use crate::support::get_job;

/// Copies the example kernel `name` into `root`, applying `(from, to)`
/// replacements to its tune.toml and appending `kernel_tail` to kernel.c.
fn kernel_copy(root: &Path, name: &str, tune_edits: &[(&str, &str)], kernel_tail: &str) {
    let source = mtswarm_tests::kernel_root().join(name);
    let target = root.join(name);
    std::fs::create_dir_all(&target).expect("kernel copy dir");
    for entry in std::fs::read_dir(&source).expect("example kernel") {
        let entry = entry.expect("dir entry");
        let file = entry.file_name();
        let mut text = std::fs::read_to_string(entry.path()).expect("kernel file");
        if file == "tune.toml" {
            for (from, to) in tune_edits {
                assert!(text.contains(from), "tune.toml of {name} has {from:?}");
                text = text.replace(from, to);
            }
        }
        if file == "kernel.c" {
            text.push_str(kernel_tail);
        }
        std::fs::write(target.join(&file), text).expect("write kernel file");
    }
}

/// dgemm at 256^3 with 6 configurations (MB x KB x MR under the
/// constraints, the rest fixed): 3 per agent, more than the 2 finalists a
/// worker benchmarks, so the search plan runs (on the emulator, whose timing
/// is exact, every screened candidate is benchmarked).
const SMALL_DGEMM: &[(&str, &str)] = &[
    ("M = 512\nN = 512\nK = 512", "M = 256\nN = 256\nK = 256"),
    ("values = [256, 512]", "values = [256]"),
    ("values = [2, 4]", "values = [4]"),
    ("values = [1, 2]", "values = [2]"),
    ("values = [0, 1]", "values = [0]"),
];

struct Stack {
    stack: TestStack,
    _kernels: tempfile::TempDir,
}

async fn stack_with_kernels(prepare: impl FnOnce(&Path)) -> Stack {
    let kernels = tempfile::Builder::new()
        .prefix("mtswarm-e2e-kernels-")
        .tempdir()
        .expect("kernel root");
    prepare(kernels.path());
    let mut options = StackOptions::new(node_bin!(), small_fleet_toml(1, 2, 4));
    options.kernel_root = kernels.path().to_path_buf();
    let stack = TestStack::start(options).await;
    stack.wait_for_slices(2, Duration::from_secs(30)).await;
    Stack {
        stack,
        _kernels: kernels,
    }
}

fn cli(stack: &TestStack) -> Command {
    let mut command = Command::new(node_bin!());
    command
        .env("MTSWARM_LEADER", &stack.leader_url)
        .env("MTSWARM_NATS_URL", stack.nats.url())
        .env("MTSWARM_CACHE_DIR", mtswarm_tests::emulator_cache_dir())
        .env_remove("MTSWARM_LLM_MODEL")
        .env_remove("MTSWARM_LLM_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

/// `mtswarm submit GOAL --kernel KERNEL --auto-approve --watch --json` as
/// a process: its exit code, the job of its last line and every line.
async fn submit_and_watch(
    stack: &TestStack,
    kernel: &str,
    timeout: Duration,
) -> (i32, Value, Vec<Value>) {
    let mut command = cli(stack);
    command.args([
        "submit",
        "Tune the kernel for the highest GFLOPS",
        "--kernel",
        kernel,
        "--auto-approve",
        "--watch",
        "--json",
        "--no-prompt",
    ]);
    let mut process = NodeProcess::spawn("mtswarm submit", command).expect("spawn submit");
    let status = tokio::task::block_in_place(|| process.wait_exit(timeout))
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.worker_logs()));
    let stdout = process.stdout();
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let last = lines
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("no JSON line from submit: {stdout}\n{}", process.stderr()));
    assert_eq!(last["type"], "job", "the last line is the job: {last}");
    (status.code().unwrap_or(-1), last["job"].clone(), lines)
}

/// Candidate status counts the agents report in their task results (the
/// builtin worker's answer lists every candidate it was given).
fn agents_counts(lines: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "task_result") {
        let answer = &line["task_result"]["result"]["answer_json"];
        for candidate in answer["candidates"].as_array().into_iter().flatten() {
            let status = CandidateStatus::of_candidate_json(candidate);
            *counts.entry(status.as_str().to_string()).or_default() += 1;
        }
    }
    counts
}

fn run_json(mut command: Command) -> (i32, Value) {
    let output = command.output().expect("run the CLI");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readme_flow_succeeds_with_the_best_record_as_its_outcome() {
    let Stack { stack, _kernels } =
        stack_with_kernels(|root| kernel_copy(root, "dgemm", SMALL_DGEMM, "")).await;
    let (code, job, lines) = submit_and_watch(&stack, "dgemm", Duration::from_secs(600)).await;
    let job_id = job["job_id"].as_str().expect("job id").to_string();
    assert_eq!(
        job["state"],
        "succeeded",
        "{job:#}\n{}",
        stack.worker_logs()
    );
    assert_eq!(code, 0, "submit --watch exits 0 on success with a result");

    // One record per candidate the agents touched, with the statuses the
    // agents themselves report.
    let all_records = job_records(&stack, &job_id).await;
    // The tune.toml baseline is measured once for the job's one slice kind
    // (two single-cluster slices of 4 cores), before the agents' candidates.
    let (baselines, records): (Vec<ResultRecord>, Vec<ResultRecord>) =
        all_records.iter().cloned().partition(|r| r.baseline);
    assert_eq!(
        baselines.len(),
        1,
        "one baseline record per job and slice kind: {baselines:#?}"
    );
    let baseline = &baselines[0];
    assert!(baseline.trustworthy(), "{baseline:#?}");
    assert_eq!(
        baseline.params.get("VARIANT").map(String::as_str),
        Some("naive")
    );
    assert_one_record_per_candidate(&records, &lines, &job);
    assert_the_outcome_is_the_best_record(&stack, &job_id, &records, baseline);

    // `mtswarm report JOB` writes the HTML of a job run through submit.
    let html = stack.dir().join("report.html");
    let (code, summary) = run_json({
        let mut c = cli(&stack);
        c.args(["report", &job_id, "--json", "--out"]).arg(&html);
        c
    });
    assert_eq!(code, 0, "{summary:#}");
    let text = std::fs::read_to_string(&html).expect("the report file");
    assert!(
        text.contains(&job_id) && text.contains("<svg"),
        "an HTML report of the job"
    );
    assert_eq!(summary["records"].as_u64(), Some(all_records.len() as u64));
    stack.shutdown().await;
}

/// One record per candidate the agents touched (six), with the statuses
/// the agents themselves report, counted the same by the outcome.
fn assert_one_record_per_candidate(records: &[ResultRecord], lines: &[Value], job: &Value) {
    let distinct: BTreeSet<&BTreeMap<String, String>> = records.iter().map(|r| &r.params).collect();
    let assigned: usize = agents_counts(lines).values().sum();
    assert_eq!(
        records.len(),
        assigned,
        "one record per candidate: {:?}\nthe agents say {:?}\n{}",
        records
            .iter()
            .map(|r| (&r.params, r.status()))
            .collect::<Vec<_>>(),
        agents_counts(lines),
        lines
            .iter()
            .filter(|l| l["type"] == "task_result")
            .map(|l| l["task_result"]["result"]["answer_json"].to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(distinct.len(), records.len());
    assert_eq!(assigned, 6, "the space has six configurations");
    let mut stored: BTreeMap<String, usize> = BTreeMap::new();
    for record in records {
        *stored
            .entry(record.status().as_str().to_string())
            .or_default() += 1;
    }
    assert_eq!(stored, agents_counts(lines), "{records:#?}");
    assert!(
        stored.get("benchmarked").is_some_and(|n| *n > 0),
        "{stored:?}"
    );
    let by_status: BTreeMap<String, u64> =
        serde_json::from_value(job["outcome"]["candidates_by_status"].clone())
            .expect("status counts");
    assert_eq!(
        by_status,
        stored.iter().map(|(k, v)| (k.clone(), *v as u64)).collect(),
        "the outcome counts the same candidates"
    );
}

/// The outcome's best, as `jobs ID --json` shows it, is the best valid
/// record of the job in the store, its speed-up over the `baseline` record.
fn assert_the_outcome_is_the_best_record(
    stack: &TestStack,
    job_id: &str,
    records: &[ResultRecord],
    baseline: &ResultRecord,
) {
    // The outcome's best is the best valid record of the job in the store
    // (the emulator is deterministic: equal figures may tie).
    let top = records
        .iter()
        .filter(|r| r.trustworthy() && !r.baseline)
        .filter_map(|r| r.gflops)
        .reduce(f64::max)
        .unwrap_or_else(|| panic!("no valid record among {records:#?}"));
    let (code, shown) = run_json({
        let mut c = cli(stack);
        c.args(["jobs", job_id, "--json"]);
        c
    });
    assert_eq!(code, 0);
    let best = &shown["outcome"]["best"];
    assert!(best.is_object(), "jobs --json shows the outcome: {shown:#}");
    assert_eq!(best["gflops"].as_f64(), Some(top), "{best:#}");
    let backing = best["record_ids"][0].as_str().unwrap_or_default();
    let best_record = records
        .iter()
        .find(|r| r.record_id == backing)
        .unwrap_or_else(|| panic!("the outcome names a stored record: {best:#}"));
    assert!(best_record.trustworthy() && best_record.gflops == Some(top));
    let params: std::collections::BTreeMap<String, String> =
        serde_json::from_value(best["params"].clone()).expect("params map");
    assert_eq!(params, best_record.params);
    assert_eq!(best["slice_id"], best_record.slice_id.as_str());
    assert!(
        !best_record.slice_id.contains('/'),
        "one slice spelling: {}",
        best_record.slice_id
    );
    assert_eq!(best["kernel_hash"], best_record.kernel_hash.as_str());
    assert!(best["peak_percent"].as_f64().is_some_and(|p| p > 0.0));
    // The speed-up is over that baseline record, measured on the same kind
    // of slice: its median over the best's.
    assert_eq!(best["baseline_record_id"], baseline.record_id.as_str());
    let expected = baseline.stats.as_ref().expect("baseline stats").median
        / best_record.stats.as_ref().expect("best stats").median;
    let speedup = best["speedup_over_baseline"].as_f64().unwrap_or_default();
    assert!(
        (speedup - expected).abs() <= expected * 1e-9 && speedup > 1.0,
        "speed-up {speedup} over the naive baseline, expected {expected}: {best:#}"
    );
    assert!(
        shown["final_answer"]
            .as_str()
            .is_some_and(|a| a.contains("GFLOP")),
        "the model's answer is kept beside the outcome: {shown:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_whose_every_candidate_fails_ends_failed_with_its_reason() {
    let Stack { stack, _kernels } = stack_with_kernels(|root| {
        kernel_copy(
            root,
            "vecadd",
            &[(
                "values = [256, 1024, 2048, 8192, 16384]",
                "values = [1024, 2048]",
            )],
            "\n#error this kernel does not compile\n",
        )
    })
    .await;
    let (code, job, _) = submit_and_watch(&stack, "vecadd", Duration::from_secs(300)).await;
    assert_eq!(job["state"], "failed", "{job:#}");
    assert_eq!(code, 1, "submit --watch exits 1 when the job failed");
    let reason = job["error"].as_str().unwrap_or_default();
    assert!(
        job["outcome"]["best"].is_null() && !reason.is_empty(),
        "FAILED with a reason: {job:#}"
    );
    assert_eq!(job["outcome"]["failure_reason"].as_str(), Some(reason));
    // All four candidates are recorded, each as failed to compile with the
    // compiler's message.
    let job_id = job["job_id"].as_str().expect("job id");
    let records = job_records(&stack, job_id).await;
    assert_eq!(records.len(), 4, "{records:#?}");
    assert!(
        records
            .iter()
            .all(|r| r.status() == CandidateStatus::CompileFailed
                && r.reason.as_deref().is_some_and(|m| !m.is_empty())),
        "{records:#?}"
    );
    assert!(reason.contains("compile_failed"), "{reason}");
    stack.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_ends_a_running_job_cancelled_and_stops_its_agents() {
    let Stack { stack, _kernels } = stack_with_kernels(|root| {
        // The full space at full size: far longer than the test waits.
        kernel_copy(root, "dgemm", &[], "")
    })
    .await;
    let mut control = stack.control().await;
    let job_id = crate::support::submit(
        &mut control,
        crate::support::job_spec("Tune dgemm", "dgemm", true),
    )
    .await;
    // Running with agents on both slices.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let job = get_job(&mut control, &job_id).await;
        if job.state() == v1::JobState::Running && job.agents.len() == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never ran two agents: {job:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, answer) = run_json({
        let mut c = cli(&stack);
        c.args(["cancel", &job_id, "--json", "--reason", "test"]);
        c
    });
    assert_eq!(code, 0, "{answer}");
    assert_eq!(answer["state"], "cancelled");
    // The job is cancelled at once; its agents are stopped and marked as
    // the leader's runner unwinds them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let job = get_job(&mut control, &job_id).await;
        assert_eq!(job.state(), v1::JobState::Cancelled);
        if job.agents.iter().all(|a| a.cancelled) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "agents not marked cancelled: {:#?}",
            job.agents
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The agents' sessions ended: both slices are free again.
    wait_for_free_slices(&mut control, 2, Duration::from_secs(60), || {
        stack.worker_logs()
    })
    .await;
    stack.shutdown().await;
}
