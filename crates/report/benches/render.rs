//! Rendering cost of large jobs: building a report from 10,000 records and
//! rendering its HTML (10,000 points, 10,000 busy bars) and terminal tables.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use mtswarm_bus::ResultRecord;
use mtswarm_report::JobReport;

fn records(n: usize) -> Vec<ResultRecord> {
    (0..n)
        .map(|i| {
            let mut params = BTreeMap::new();
            params.insert("TILE".to_string(), (8 << (i % 5)).to_string());
            params.insert("UNROLL".to_string(), (1 << (i % 4)).to_string());
            let valid = i % 7 != 0;
            ResultRecord {
                record_id: format!("r{i}"),
                job_id: "bench".into(),
                agent_id: format!("agent-{}", i % 8),
                slice_id: format!("board{}/c{}", i % 2, i % 4),
                kernel: "dgemm".into(),
                kernel_hash: "abcdef0123456789".into(),
                params,
                gflops: valid.then_some((i % 997) as f64 / 3.0 + 1.0),
                peak_fraction: valid.then_some((i % 997) as f64 / 3000.0),
                valid,
                wall_seconds: 0.5,
                timestamp_ms: 1_800_000_000_000 + i as u64 * 300,
                ..Default::default()
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let records = records(10_000);
    let report = JobReport::from_records("bench", "dgemm", &records, None, &[]);
    let mut group = c.benchmark_group("report_10k");
    group.sample_size(10);
    group.bench_function("from_records", |b| {
        b.iter(|| JobReport::from_records("bench", "dgemm", &records, None, &[]))
    });
    group.bench_function("render_html", |b| b.iter(|| report.render_html()));
    group.bench_function("render_terminal", |b| b.iter(|| report.render_terminal()));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
