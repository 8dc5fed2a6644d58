//! A task published on the bus for a session on an emulated slice runs
//! through the builtin policy to a TaskResult with a real benchmark figure;
//! its events arrive in order with gapless sequences and a checkpoint is
//! written after every step.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::results::{ResultQuery, ResultsStore};
use mtswarm_bus::{Checkpoints, KvChange, KvWatch, v1};
use mtswarm_worker::WorkerHandle;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_runs_to_a_result_with_a_real_benchmark_figure() {
    let env = Env::start().await;
    let handle = env.daemon(env.config("emu0")).await;
    let slice = handle.slice_ids()[0].clone();
    assert_eq!(slice, "emu0-c0");
    let mut grpc = client(&handle).await;

    let mut watch = env.watch("job1", "t1").await;
    let checkpoints = Checkpoints::open(&env.bus).await.expect("checkpoints");
    let mut checkpoint_watch = checkpoints.kv().watch().await.expect("watch");

    let session = Session::on(&handle, &slice, "job1", "agent1", "sess1");
    let spawned = grpc
        .spawn_session(session.auto_approved())
        .await
        .expect("spawn")
        .into_inner();
    assert_eq!(spawned.slice_id, slice);
    assert_eq!(spawned.worker_id, handle.worker_id());

    let params = json!({
        "candidates": [{"N": 16384, "CHUNK": 256}, {"N": 16384, "CHUNK": 2048}],
        "repeats": 3
    });
    env.publish(&session.task("task1", 1, params)).await;

    let result = next_result(&mut watch.results, "the task result").await;
    let body = assert_ok_with_a_real_figure(&result);
    let usage = result.usage.expect("usage");
    assert!(usage.device_seconds > 0.0 && usage.steps >= 7, "{usage:?}");
    assert_every_benchmark_recorded(&env, &handle, &body).await;

    // Events: in order, gapless from 1, all tool calls of the plan.
    let mut all = Vec::new();
    events_until(&mut watch.events, &mut all, |e| task_finished(e, 1)).await;
    assert_plan_events(&all);
    assert_a_checkpoint_per_step(&mut checkpoint_watch, &checkpoints, usage.steps).await;

    // Status lists the session as idle again, on its slice.
    let status = grpc
        .status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    let session = status
        .sessions
        .iter()
        .find(|s| s.session_id == "sess1")
        .expect("listed");
    assert_eq!(session.slice_id, slice);
    handle.shutdown().await.expect("shutdown");
}

/// task1's first attempt of sess1 ended OK with a measured best (16384
/// elements, a median and GFLOPS), the answer names the same best, and a
/// benchmark is among the evidence. Returns the result's JSON.
fn assert_ok_with_a_real_figure(result: &v1::TaskResult) -> serde_json::Value {
    assert_eq!(result.task_id, "task1");
    assert_eq!(result.attempt, 1);
    assert_eq!(result.session_id, "sess1");
    assert_eq!(result.status, v1::TaskStatus::Ok as i32, "{result:?}");
    let body: serde_json::Value = serde_json::from_str(&result.result_json).expect("result json");
    let best = &body["best"];
    let median = best["median_seconds"].as_f64().expect("a median figure");
    assert!(median > 0.0, "{body}");
    assert!(best["gflops"].as_f64().is_some_and(|g| g > 0.0), "{body}");
    assert_eq!(best["defines"]["N"], "16384", "{body}");
    // The policy's answer names the same best candidate as the tools.
    let answer_best = &body["answer_json"]["best"];
    assert_eq!(answer_best["defines"], best["defines"], "{body}");
    assert!(
        body["evidence"]
            .as_array()
            .is_some_and(|e| e.iter().any(|r| r["kind"] == "benchmark")),
        "{body}"
    );
    body
}

/// Every benchmark is in the results store with its provenance, and the
/// best of them is the figure the task reported (`body`).
async fn assert_every_benchmark_recorded(
    env: &Env,
    handle: &WorkerHandle,
    body: &serde_json::Value,
) {
    let store = ResultsStore::open(&env.bus).await.expect("results store");
    let records = store
        .query(&ResultQuery {
            job_id: Some("job1".into()),
            ..ResultQuery::default()
        })
        .await
        .expect("query results");
    assert!(!records.is_empty(), "no measurement was recorded");
    for record in &records {
        assert_eq!(
            (
                record.task_id.as_str(),
                record.attempt,
                record.session_id.as_str()
            ),
            ("task1", 1, "sess1")
        );
        assert_eq!(record.worker_id, handle.worker_id());
        assert_eq!(record.backend, "emulator");
        assert!(!record.kernel_hash.is_empty() && !record.samples.is_empty());
    }
    let best_recorded = records
        .iter()
        .filter_map(|r| r.gflops)
        .fold(f64::MIN, f64::max);
    assert!(
        (best_recorded - body["best"]["gflops"].as_f64().unwrap_or_default()).abs() < 1e-6,
        "recorded best {best_recorded} vs reported {body}"
    );
}

/// The session's events from its start: gapless, and the plan's tool
/// calls (compile, validate, benchmark per candidate), every one OK and
/// of task1.
fn assert_plan_events(all: &[v1::AgentEvent]) {
    assert_gapless(all, 1);
    assert!(is_kind(&all[0], v1::AgentEventKind::SessionStarted));
    let calls: Vec<String> = payloads_of(all, v1::AgentEventKind::ToolCall)
        .map(|p| p["name"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(calls, ["compile", "validate", "benchmark"].repeat(2));
    let tool_results: Vec<serde_json::Value> =
        payloads_of(all, v1::AgentEventKind::ToolResult).collect();
    assert!(
        tool_results.iter().all(|r| r["ok"] == true),
        "{tool_results:?}"
    );
    assert!(tool_results.iter().all(|r| r["task_id"] == "task1"));
}

/// Checkpoints of sess1: one at least per step up to `last_step`, steps
/// never go back, and the last one is the finished run.
async fn assert_a_checkpoint_per_step(
    checkpoint_watch: &mut KvWatch<v1::SessionCheckpoint>,
    checkpoints: &Checkpoints,
    last_step: u32,
) {
    let mut steps = Vec::new();
    while steps.last() != Some(&last_step) || steps.len() < 2 {
        match next(checkpoint_watch, "checkpoints").await.expect("change") {
            KvChange::Put { key, value } if key == "sess1" => {
                assert_eq!(value.value.task_id, "task1");
                steps.push(value.value.step);
            }
            _ => {}
        }
    }
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "{steps:?}");
    for step in 1..=last_step {
        assert!(
            steps.contains(&step),
            "no checkpoint at step {step}: {steps:?}"
        );
    }
    let state = mtswarm_worker::benching::resume_state(checkpoints, "sess1")
        .await
        .expect("read as a resume reads it")
        .expect("stored");
    assert_eq!(state.node(), mtswarm_core::Node::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_device_seconds_budget_stops_the_task() {
    let env = Env::start().await;
    let handle = env.daemon(env.config("emu0")).await;
    let slice = handle.slice_ids()[1].clone();
    let mut results = results(&env.bus, "jobB", "tb").await;
    let session = Session::on(&handle, &slice, "jobB", "agentB", "sessB");
    spawn(&handle, session.auto_approved()).await;
    let mut assignment = session.task(
        "taskB",
        1,
        json!({"candidates": [{"N": 16384, "CHUNK": 256}, {"N": 16384, "CHUNK": 1024}]}),
    );
    assignment.budgets = Some(v1::Budgets {
        device_seconds: 1e-9,
        ..Default::default()
    });
    env.publish(&assignment).await;
    let result = next_result(&mut results, "the result").await;
    assert_eq!(result.status, v1::TaskStatus::Failed as i32, "{result:?}");
    assert!(
        result.error.contains("device-seconds budget exhausted"),
        "{}",
        result.error
    );
    // Stopped after the first hardware call: one validate, no benchmark.
    let usage = result.usage.expect("usage");
    assert!(usage.device_seconds > 0.0);
    assert!(usage.steps <= 3, "{usage:?}");
    handle.shutdown().await.expect("shutdown");
}
