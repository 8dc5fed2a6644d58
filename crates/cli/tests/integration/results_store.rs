//! `mtswarm results` against a real nats-server: records stored through
//! `ResultsStore` (as worker daemons store them) come back through the
//! binary filtered by job, kernel, slice, backend, validity and time, as a
//! table, JSON lines, CSV, one JSON object, a Kernel Tuner cache, or into
//! a file.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mtswarm_bus::results::{ResultRecord, ResultStats, ResultsStore, read_jsonl};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{Bus, BusConfig};

fn record(
    id: &str,
    job: &str,
    kernel: &str,
    slice: &str,
    valid: bool,
    age: Duration,
) -> ResultRecord {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    ResultRecord {
        record_id: id.to_string(),
        job_id: job.to_string(),
        task_id: "t1".to_string(),
        attempt: 1,
        agent_id: "tuner-1".to_string(),
        session_id: "s1".to_string(),
        worker_id: "worker-board0".to_string(),
        slice_id: slice.to_string(),
        backend: "emulator".to_string(),
        toolchain: "gcc".to_string(),
        kernel: kernel.to_string(),
        kernel_hash: "0123456789abcdef0123".to_string(),
        params: BTreeMap::from([("CHUNK".to_string(), id.len().to_string())]),
        cores: 2,
        samples: vec![0.5],
        stats: valid.then_some(ResultStats {
            count: 1,
            median: 0.5,
            trimmed_mean: 0.5,
            min: 0.5,
            max: 0.5,
            stddev: 0.0,
        }),
        flops: Some(1000),
        gflops: valid.then_some(2.5),
        peak_fraction: valid.then_some(0.25),
        speedup_over_baseline: None,
        valid,
        error: (!valid).then(|| "wrong answer at index 3".to_string()),
        flags: Vec::new(),
        model: "builtin".to_string(),
        wall_seconds: 1.0,
        timestamp_ms: u64::try_from((now - age).as_millis()).expect("millis"),
        ..ResultRecord::default()
    }
}

fn mtswarm(nats: &str, args: &[&str]) -> Output {
    common::mtswarm_command()
        .arg("results")
        .args(args)
        .env("MTSWARM_NATS_URL", nats)
        .output()
        .expect("run mtswarm")
}

fn stdout_of(output: &Output) -> String {
    common::stdout_of(output, "mtswarm results")
}

fn ids(jsonl: &str) -> Vec<String> {
    read_jsonl(jsonl.as_bytes())
        .expect("JSON lines of result records")
        .into_iter()
        .map(|r| r.record_id)
        .collect()
}

/// A fresh nats-server whose results store holds `records` (stored as
/// worker daemons store them).
async fn store_holding(records: &[ResultRecord]) -> NatsServer {
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("task")
        .expect("nats-server starts (see deploy/setup.sh)");
    let bus = Bus::connect(BusConfig::new(nats.url()))
        .await
        .expect("connect");
    // A test's stream limits: the production ones are reserved up front.
    bus.adopt_topology(&mtswarm_bus::TopologyConfig::small());
    let store = ResultsStore::open(&bus).await.expect("open the store");
    for r in records {
        store.record(r).await.expect("store a record");
    }
    nats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_filtered_and_exported_from_the_store() {
    let hour = Duration::from_secs(3600);
    let nats = store_holding(&[
        record("r1", "job1", "vecadd", "board0/c0", true, 3 * hour),
        record("r2", "job1", "vecadd", "board0/c1", false, Duration::ZERO),
        record("r3", "job1", "dgemm", "board0/c0", true, Duration::ZERO),
        record("r4", "job2", "vecadd", "board1/c0", true, Duration::ZERO),
    ])
    .await;
    let url = nats.url();

    let (
        all,
        job1,
        valid_vecadd,
        slice,
        recent,
        backend,
        table,
        csv,
        json,
        file,
        bad_since,
        unreachable,
    ) = tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("export.csv");
        let file_run = mtswarm(
            &url,
            &[
                "--job",
                "job1",
                "--format",
                "csv",
                "--output",
                path.to_str().expect("utf-8"),
            ],
        );
        assert!(file_run.status.success(), "{file_run:?}");
        let file = std::fs::read_to_string(&path).expect("the export file");
        (
            stdout_of(&mtswarm(&url, &["--format", "jsonl"])),
            stdout_of(&mtswarm(&url, &["job1", "--format", "jsonl"])),
            stdout_of(&mtswarm(
                &url,
                &["--kernel", "vecadd", "--valid-only", "--format", "jsonl"],
            )),
            stdout_of(&mtswarm(
                &url,
                &["--slice", "board0/c0", "--format", "jsonl"],
            )),
            stdout_of(&mtswarm(
                &url,
                &["--since", "1h", "--kernel", "vecadd", "--format", "jsonl"],
            )),
            stdout_of(&mtswarm(&url, &["--backend", "sdk", "--format", "jsonl"])),
            stdout_of(&mtswarm(&url, &["--job", "job1"])),
            stdout_of(&mtswarm(&url, &["--job", "job2", "--format", "csv"])),
            stdout_of(&mtswarm(&url, &["--job", "job2", "--json"])),
            file,
            mtswarm(&url, &["--since", "last tuesday"]),
            mtswarm("nats://127.0.0.1:1", &["--format", "jsonl"]),
        )
    })
    .await
    .expect("cli runs");

    assert_eq!(ids(&all), ["r1", "r2", "r3", "r4"]);
    assert_eq!(ids(&job1), ["r1", "r2", "r3"]);
    assert_eq!(ids(&valid_vecadd), ["r1", "r4"]);
    assert_eq!(ids(&slice), ["r1", "r3"]);
    assert_eq!(ids(&recent), ["r2", "r4"], "r1 is three hours old");
    assert!(ids(&backend).is_empty(), "no sdk records: {backend}");

    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("TIME") && rows[0].contains("GFLOPS"),
        "{table}"
    );
    assert_eq!(rows.len(), 5, "header, three records, count: {table}");
    assert!(
        rows.iter()
            .any(|r| r.contains("board0/c1") && r.contains(" invalid ")),
        "{table}"
    );
    assert_eq!(rows[4], "3 records");

    let mut csv_rows = csv.lines();
    let header = csv_rows.next().expect("header");
    assert!(
        header.starts_with("record_id,job_id,task_id,attempt"),
        "{header}"
    );
    assert!(header.ends_with("param.CHUNK"), "{header}");
    let row = csv_rows.next().expect("one row");
    assert!(
        row.starts_with("r4,job2,t1,1,") && row.contains("board1/c0"),
        "{row}"
    );
    assert!(csv_rows.next().is_none());

    let json: serde_json::Value = serde_json::from_str(&json).expect("--json is one JSON object");
    assert_eq!(json["count"], 1);
    assert_eq!(json["records"][0]["record_id"], "r4");
    assert_eq!(json["records"][0]["gflops"], 2.5);

    assert_eq!(
        file.lines().count(),
        4,
        "header and job1's three records: {file}"
    );

    assert!(!bad_since.status.success());
    let error = String::from_utf8_lossy(&bad_since.stderr);
    assert!(error.contains("RFC 3339"), "{error}");
    assert!(!unreachable.status.success());
    let error = String::from_utf8_lossy(&unreachable.stderr);
    assert!(error.contains("cannot reach NATS"), "{error}");
}

/// `--format kernel-tuner`: one kernel's candidates as a Kernel Tuner
/// cache (a valid figure beats an invalid record of the same candidate);
/// records of two kernels are refused with the way out named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_kernels_results_export_as_a_kernel_tuner_cache() {
    let nats = store_holding(&[
        record("r1", "job1", "vecadd", "board0/c0", true, Duration::ZERO),
        record("r22", "job1", "vecadd", "board0/c1", false, Duration::ZERO),
        record("r333", "job1", "vecadd", "board0/c1", true, Duration::ZERO),
        record("r4", "job1", "dgemm", "board0/c0", true, Duration::ZERO),
    ])
    .await;
    let url = nats.url();
    let (cache, mixed) = tokio::task::spawn_blocking(move || {
        (
            stdout_of(&mtswarm(
                &url,
                &["job1", "--kernel", "vecadd", "--format", "kernel-tuner"],
            )),
            mtswarm(&url, &["job1", "--format", "kernel-tuner"]),
        )
    })
    .await
    .expect("cli runs");
    let landscape = mtswarm_hw::landscape::Landscape::from_kernel_tuner_json(&cache)
        .expect("a Kernel Tuner cache");
    assert_eq!(landscape.kernel_name, "vecadd");
    assert_eq!(landscape.keys, ["CHUNK"]);
    // CHUNK is the record id's length: r1 -> 2, r22 -> 3 (invalid), r333 -> 4.
    let outcome = |chunk: i64| {
        landscape
            .entries
            .iter()
            .find(|e| e.config["CHUNK"] == mtswarm_hw::tune::ParamValue::Int(chunk))
            .map(|e| e.outcome.clone())
            .expect("an entry")
    };
    assert_eq!(outcome(2).seconds(), Some(0.5));
    assert!(outcome(3).seconds().is_none(), "the invalid one failed");
    assert_eq!(outcome(4).seconds(), Some(0.5));
    assert_eq!(mixed.status.code(), Some(2));
    let error = String::from_utf8_lossy(&mixed.stderr);
    assert!(error.contains("several kernels (dgemm, vecadd)"), "{error}");
}
