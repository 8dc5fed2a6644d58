//! The default leader (no model configured: the builtin policy) against two
//! fake worker daemons: it spawns one agent per free slice, splits the
//! tune.toml space between them, collects both results and answers with
//! the faster one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeSet;

use common::*;
use mtswarm_bus::v1;
use serde_json::{Value, json};

fn by_worker(task: &v1::TaskAssignment) -> f64 {
    if task.worker_id == "fw2" { 20.0 } else { 10.0 }
}

#[tokio::test]
async fn builtin_policy_splits_the_space_and_reports_the_best() {
    let env = Env::start().await;
    let mut first = FakeWorker::start(&env.bus, "fw1", "fb1").await;
    let mut second = FakeWorker::start(&env.bus, "fw2", "fb2").await;
    let (answer1, mut tasks1) = answer_tasks(&env.bus, "fw1", by_worker);
    let (answer2, mut tasks2) = answer_tasks(&env.bus, "fw2", by_worker);
    let leader = start_leader(env.config()).await;
    let mut control = control(&leader).await;
    let mut job = spec("Tune k1 on the emulator.");
    job.slice_selector = "backend=emulator".into();
    let job_id = try_submit(&mut control, job).await.expect("submit");
    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    let (task1, _) = within("fw1's task", tasks1.recv()).await.expect("task");
    let (task2, _) = within("fw2's task", tasks2.recv()).await.expect("task");
    let candidates = |task: &v1::TaskAssignment| -> Vec<Value> {
        let parameters: Value = serde_json::from_str(&task.parameters_json).expect("json");
        parameters["candidates"]
            .as_array()
            .cloned()
            .expect("candidates list")
    };
    let mut all: Vec<Value> = candidates(&task1);
    all.extend(candidates(&task2));
    let all: BTreeSet<String> = all.iter().map(Value::to_string).collect();
    let expected: BTreeSet<String> = [json!({"A": 1}), json!({"A": 2}), json!({"A": 3})]
        .iter()
        .map(Value::to_string)
        .collect();
    assert_eq!(all, expected, "the space is split without loss or overlap");
    assert!(!candidates(&task1).is_empty() && !candidates(&task2).is_empty());

    let record = get_job(&mut control, &job_id).await.expect("get_job");
    let result: Value = serde_json::from_str(&record.result_json).expect("result json");
    assert_eq!(result["best"]["gflops"], json!(20.0));
    assert_eq!(result["best"]["slice_id"], json!("fb2-c0"));
    assert_eq!(result["best"]["peak_percent"], json!(12.5));
    assert_eq!(result["best"]["params"], candidates(&task2)[0]);
    // The typed outcome, from the stored measurement records.
    let best = record
        .outcome
        .as_ref()
        .and_then(|o| o.best.clone())
        .expect("an outcome with a best");
    assert_eq!((best.gflops, best.slice_id.as_str()), (20.0, "fb2-c0"));
    assert_eq!(record.agent_ids.len(), 2);
    assert_eq!((record.tasks_total, record.tasks_done), (2, 2));
    for worker in [&mut first, &mut second] {
        let spawn = worker.next_spawn("a spawn").await;
        assert_eq!(spawn.role, "tuner");
    }
    answer1.abort();
    answer2.abort();
    leader.shutdown().await.expect("shutdown");
}

fn by_board(task: &v1::TaskAssignment) -> f64 {
    match task.worker_id.as_str() {
        "fw3" => 30.0,
        "fw2" => 20.0,
        _ => 10.0,
    }
}

fn fw1_fails(task: &v1::TaskAssignment) -> v1::TaskStatus {
    if task.worker_id == "fw1" {
        v1::TaskStatus::Failed
    } else {
        v1::TaskStatus::Ok
    }
}

#[tokio::test]
async fn builtin_policy_retries_a_failed_partition_on_another_agent() {
    let env = Env::start().await;
    let mut workers = Vec::new();
    let mut answers = Vec::new();
    let mut tasks = Vec::new();
    for n in 1..=3 {
        let worker_id = format!("fw{n}");
        workers.push(FakeWorker::start(&env.bus, &worker_id, &format!("fb{n}")).await);
        let (answer, received) = answer_tasks_with(&env.bus, &worker_id, by_board, fw1_fails);
        answers.push(answer);
        tasks.push(received);
    }
    let leader = start_leader(env.config()).await;
    let mut control = control(&leader).await;
    let mut job = spec("Tune k1 on two agents.");
    job.num_agents = 2;
    let job_id = try_submit(&mut control, job).await.expect("submit");
    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    let candidates = |task: &v1::TaskAssignment| -> Value {
        serde_json::from_str::<Value>(&task.parameters_json).expect("json")["candidates"].clone()
    };
    let (failed, _) = within("fw1's task", tasks[0].recv()).await.expect("task");
    let (retried, _) = within("fw3's retry task", tasks[2].recv())
        .await
        .expect("task");
    assert_eq!(
        candidates(&retried),
        candidates(&failed),
        "the failed partition is retried as it was"
    );
    assert_ne!(retried.task_id, failed.task_id);
    assert_eq!(retried.agent_id, "tuner-retry-1");
    assert!(tasks[2].try_recv().is_err(), "retried once");

    let record = get_job(&mut control, &job_id).await.expect("get_job");
    let result: Value = serde_json::from_str(&record.result_json).expect("result json");
    assert_eq!(result["best"]["gflops"], json!(30.0));
    assert_eq!(result["best"]["agent"], json!("tuner-retry-1"));
    assert_eq!(result["best"]["slice_id"], json!("fb3-c0"));
    assert_eq!(result["task_status"], json!({"failed": 1, "ok": 2}));
    let outcome = record.outcome.clone().expect("an outcome");
    assert_eq!((outcome.tasks_ok, outcome.tasks_failed), (2, 1));
    assert_eq!(outcome.best.map(|b| b.gflops), Some(30.0));
    assert_eq!(record.agent_ids.len(), 3);
    assert_eq!((record.tasks_total, record.tasks_done), (3, 3));
    for answer in answers {
        answer.abort();
    }
    drop(workers);
    leader.shutdown().await.expect("shutdown");
}
