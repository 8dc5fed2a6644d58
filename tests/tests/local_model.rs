//! A job driven end to end by a real open-weights model: the
//! Qwen2.5-Coder-1.5B-Instruct GGUF `deploy/setup.sh` installs, served on
//! loopback by `mtswarm llm serve`'s server ([`LocalModel`]), drives the
//! leader and one worker through a vecadd job, which must end SUCCEEDED
//! with a measured best. The model made the calls: the job's outcome counts
//! the tokens of every loop from the server's usage reports, and the
//! server's own counters (`/metrics`) saw at least as many.
//!
//! Its own test binary, so it runs after the CPU-heavy suites and alone
//! (two cores serve the model, the emulator and the daemons); on two cores
//! the job takes about three minutes of its nine.
//!
//! It needs the model: `deploy/setup.sh` installs it (a run with
//! `MTSWARM_SETUP_MODEL=0` fails here, saying so). Run it by itself:
//! `cargo test -p mtswarm-tests --test local_model -- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::{Duration, Instant};

use mtswarm_cli::{LocalModel, LocalModelOptions, default_model_path};
use mtswarm_llm::{OpenAiConfig, ToolMode};
use mtswarm_proto::v1;
use mtswarm_tests::jobs::{get_job, job_spec, submit, watch_to_end};
use mtswarm_tests::{StackOptions, TestStack, node_bin, small_fleet_toml};

/// How long the job may take on two cores.
const JOB_TIMEOUT: Duration = Duration::from_secs(540);

/// How long a model call may wait for its first byte: a CPU reads a
/// 4k-token prompt for a minute or more.
const MODEL_TIMEOUT: Duration = Duration::from_secs(300);

/// `name value` of a Prometheus text exposition.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

async fn server_metrics(server: &LocalModel) -> String {
    reqwest::get(format!("{}/metrics", server.server_url()))
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("the server's /metrics")
        .text()
        .await
        .expect("the server's /metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_local_model_drives_a_vecadd_job_to_a_measured_best() {
    let model = default_model_path()
        .filter(|path| path.is_file())
        .expect("the model deploy/setup.sh installs (bash deploy/local_model.sh)");
    let options = LocalModelOptions::new(model);
    let server = LocalModel::start(&options)
        .await
        .expect("the model server starts");
    let started = Instant::now();

    let llm = OpenAiConfig::new(server.base_url(), server.model())
        .with_tool_mode(ToolMode::Text)
        .with_context_tokens(Some(u64::from(options.ctx_per_slot)))
        .with_request_timeout(MODEL_TIMEOUT);
    let options = StackOptions::model_driven(node_bin!(), small_fleet_toml(1, 1, 8), llm);
    let stack = TestStack::start(options).await;
    stack.wait_for_slices(1, Duration::from_secs(60)).await;
    let mut control = stack.control().await;

    let mut spec = job_spec("Tune vecadd for speed", "vecadd", 1, true);
    spec.budgets = Some(v1::Budgets {
        wall_time_seconds: JOB_TIMEOUT.as_secs(),
        max_evaluations: 1,
        ..Default::default()
    });
    let job_id = submit(&mut control, spec).await;
    watch_to_end(&mut control, &job_id, JOB_TIMEOUT, || {
        format!(
            "workers:\n{}\nmodel server:\n{}",
            stack.worker_logs(),
            server.log_lines().join("\n")
        )
    })
    .await;
    let job = get_job(&mut control, &job_id).await;
    let outcome = job.outcome.clone().unwrap_or_default();
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "job {job:#?}\nworkers:\n{}",
        stack.worker_logs()
    );
    let best = outcome.best.as_ref().expect("a measured best");
    assert!(best.gflops > 0.0 && best.median_seconds > 0.0, "{best:#?}");

    // The model, not a builtin policy, made the calls of both loops.
    let total = outcome.total_cost.clone().unwrap_or_default();
    let completion_of = |leader: bool| -> u64 {
        outcome
            .agent_costs
            .iter()
            .filter(|c| (c.agent_id == "leader") == leader)
            .map(|c| c.completion_tokens)
            .sum()
    };
    assert!(
        completion_of(true) > 0,
        "the leader made no model call: {outcome:#?}"
    );
    assert!(
        completion_of(false) > 0,
        "no worker made a model call: {outcome:#?}"
    );
    let metrics = server_metrics(&server).await;
    let served = counter(&metrics, "llamacpp:tokens_predicted_total");
    assert!(
        served >= total.completion_tokens as f64,
        "the server generated {served} tokens, the job counts {}",
        total.completion_tokens
    );
    println!(
        "local model job: {:?} wall, {} prompt + {} completion tokens, best {:.3} GFLOPS ({:?})",
        started.elapsed(),
        total.prompt_tokens,
        total.completion_tokens,
        best.gflops,
        best.params
    );
    drop(control);
    stack.shutdown().await;
    server.stop().await.expect("the model server stops");
}
