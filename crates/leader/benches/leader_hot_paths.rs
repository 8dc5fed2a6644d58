//! Hot paths of the leader that run per message or per model turn: offering
//! a result to its job's table (per result; must not grow with the number
//! of jobs) and one builtin-policy decision on a realistic conversation.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use mtswarm_bus::v1;
use mtswarm_core::Message;
use mtswarm_leader::ResultTable;
use mtswarm_policy::BuiltinLeaderPolicy;
use mtswarm_policy::plan::JOB_LINE_PREFIX;
use serde_json::json;

fn offer_results(c: &mut Criterion) {
    let mut group = c.benchmark_group("offer_result");
    for jobs in [10usize, 10_000] {
        let table = ResultTable::default();
        for j in 0..jobs {
            let job = table.job(&format!("job{j}"));
            for t in 0..8 {
                job.register(&format!("task{t}"), "a1", 1);
            }
        }
        let result = v1::TaskResult {
            task_id: "task3".into(),
            attempt: 1,
            job_id: format!("job{}", jobs / 2),
            ..Default::default()
        };
        group.bench_with_input(BenchmarkId::from_parameter(jobs), &jobs, |b, _| {
            b.iter(|| {
                let job = table.get(black_box(&result.job_id)).expect("job");
                black_box(job.offer(black_box(&result)))
            })
        });
    }
    group.finish();
}

fn policy_decision(c: &mut Criterion) {
    let policy = BuiltinLeaderPolicy::new();
    let space = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/kernels/dgemm/tune.toml"
    ))
    .expect("dgemm tune.toml");
    let slices: Vec<_> = (0..8)
        .map(|i| json!({"slice_id": format!("b{}-c{}", i / 4, i % 4), "state": "free"}))
        .collect();
    let first = policy.decide(&[Message::user(format!("Tune.\n{JOB_LINE_PREFIX}{{}}"))]);
    let mtswarm_policy::leader::Turn::Calls(calls) = first else {
        panic!("expected the first calls");
    };
    let spawns: Vec<_> = (0..8)
        .map(|i| mtswarm_core::ToolCall {
            id: format!("spawn-{i}"),
            name: "spawn_agent".into(),
            arguments: "{}".into(),
        })
        .collect();
    let mut messages = vec![
        Message::system("leader"),
        Message::user(format!("Tune.\n{JOB_LINE_PREFIX}{{}}")),
        Message::assistant("", calls.clone()),
        Message::tool(calls[0].id.clone(), json!({"slices": slices}).to_string()),
        Message::tool(calls[1].id.clone(), space),
        Message::assistant("", spawns.clone()),
    ];
    for (i, call) in spawns.iter().enumerate() {
        messages.push(Message::tool(
            call.id.clone(),
            json!({"agent": format!("tuner-{i}")}).to_string(),
        ));
    }
    c.bench_function("builtin_policy_split_dgemm_space_8_agents", |b| {
        b.iter(|| black_box(policy.decide(black_box(&messages))))
    });
}

criterion_group!(benches, offer_results, policy_decision);
criterion_main!(benches);
