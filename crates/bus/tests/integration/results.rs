//! The results store against a real nats-server: round trips with every
//! filter, deduplication by record id, best-per-kernel, and the JSONL / CSV
//! exports read back.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use common::{setup, stream_info, within};
use mtswarm_bus::results::{
    CSV_COLUMNS, ExportError, ResultStats, measurement_subject, read_jsonl, to_csv, to_jsonl,
};
use mtswarm_bus::{BusError, ResultQuery, ResultRecord, ResultsStore, subjects};

/// Base of the test timestamps (2023-11-14T22:13:20Z).
const T0: u64 = 1_700_000_000_000;

struct Spec<'a> {
    id: &'a str,
    job: &'a str,
    kernel: &'a str,
    hash: &'a str,
    slice: &'a str,
    tile: &'a str,
    gflops: Option<f64>,
    valid: bool,
    at: u64,
}

fn record(spec: Spec<'_>) -> ResultRecord {
    let mut params = BTreeMap::new();
    params.insert("TILE".to_string(), spec.tile.to_string());
    if spec.kernel == "spmv" {
        params.insert("ROWS_PER_CORE".to_string(), "8".to_string());
    }
    ResultRecord {
        record_id: spec.id.to_string(),
        job_id: spec.job.to_string(),
        task_id: "t1".into(),
        attempt: 1,
        agent_id: "agent1".into(),
        session_id: "session1".into(),
        worker_id: "w1".into(),
        slice_id: spec.slice.to_string(),
        backend: "emulator".into(),
        toolchain: "gcc (emulator)".into(),
        kernel: spec.kernel.to_string(),
        kernel_hash: spec.hash.to_string(),
        params,
        cores: 24,
        samples: if spec.valid {
            vec![0.5, 0.25, 0.75]
        } else {
            vec![]
        },
        stats: spec.valid.then_some(ResultStats {
            count: 3,
            median: 0.5,
            trimmed_mean: 0.5,
            min: 0.25,
            max: 0.75,
            stddev: 0.2,
        }),
        flops: spec.valid.then_some(1_000_000),
        gflops: spec.gflops,
        peak_fraction: spec.gflops.map(|g| g / 100.0),
        speedup_over_baseline: None,
        valid: spec.valid,
        error: (!spec.valid).then(|| "validation failed: output differs".to_string()),
        flags: vec![],
        model: "builtin".into(),
        wall_seconds: 1.25,
        timestamp_ms: T0 + spec.at,
        ..ResultRecord::default()
    }
}

const HASH_A: &str = "aaaaaaaaaaaaaaaa1111";
const HASH_B: &str = "bbbbbbbbbbbbbbbb2222";

/// Six records over two jobs, two kernels, two hashes and two slices.
fn sample_records() -> Vec<ResultRecord> {
    let spec = |id, job, kernel, hash, slice, tile, gflops: Option<f64>, at| Spec {
        id,
        job,
        kernel,
        hash,
        slice,
        tile,
        gflops,
        valid: gflops.is_some(),
        at,
    };
    vec![
        record(spec(
            "r1",
            "job1",
            "dgemm",
            HASH_A,
            "board0/c0",
            "16",
            Some(10.0),
            0,
        )),
        record(spec(
            "r2",
            "job1",
            "dgemm",
            HASH_A,
            "board0/c1",
            "32",
            Some(30.0),
            1_000,
        )),
        record(spec(
            "r3",
            "job1",
            "dgemm",
            HASH_A,
            "board0/c1",
            "512",
            None,
            2_000,
        )),
        record(spec(
            "r4",
            "job1",
            "spmv",
            HASH_B,
            "board0/c0",
            "8",
            Some(5.0),
            3_000,
        )),
        record(spec(
            "r5",
            "job2",
            "dgemm",
            HASH_B,
            "board1/c0",
            "64",
            Some(50.0),
            4_000,
        )),
        record(spec(
            "r6",
            "job2",
            "dgemm",
            HASH_B,
            "board1/c0",
            "128",
            Some(20.0),
            5_000,
        )),
    ]
}

async fn store_with_samples() -> (
    mtswarm_bus::testing::NatsServer,
    mtswarm_bus::Bus,
    ResultsStore,
) {
    let (server, bus) = setup().await;
    let store = within("open store", ResultsStore::open(&bus))
        .await
        .expect("open");
    for r in sample_records() {
        within("record", store.record(&r)).await.expect("record");
    }
    (server, bus, store)
}

fn ids(records: &[ResultRecord]) -> Vec<&str> {
    records.iter().map(|r| r.record_id.as_str()).collect()
}

async fn query(store: &ResultsStore, q: ResultQuery) -> Vec<ResultRecord> {
    within("query", store.query(&q)).await.expect("query")
}

#[tokio::test]
async fn records_round_trip_with_every_filter() {
    let (_server, _bus, store) = store_with_samples().await;

    let all = query(&store, ResultQuery::default()).await;
    assert_eq!(ids(&all), ["r1", "r2", "r3", "r4", "r5", "r6"]);
    assert_eq!(all, sample_records(), "records come back unchanged");

    let job1 = ResultQuery {
        job_id: Some("job1".into()),
        ..Default::default()
    };
    assert_eq!(ids(&query(&store, job1).await), ["r1", "r2", "r3", "r4"]);

    let dgemm = ResultQuery {
        kernel: Some("dgemm".into()),
        ..Default::default()
    };
    assert_eq!(
        ids(&query(&store, dgemm.clone()).await),
        ["r1", "r2", "r3", "r5", "r6"]
    );

    let by_hash_prefix = ResultQuery {
        kernel_hash: Some("bbbb".into()),
        ..Default::default()
    };
    assert_eq!(
        ids(&query(&store, by_hash_prefix).await),
        ["r4", "r5", "r6"]
    );
    let by_full_hash = ResultQuery {
        kernel: Some("dgemm".into()),
        kernel_hash: Some(HASH_A.into()),
        ..Default::default()
    };
    assert_eq!(ids(&query(&store, by_full_hash).await), ["r1", "r2", "r3"]);

    // Slice ids with '/' are stored under a sanitized token but compared exactly.
    let slice = ResultQuery {
        slice: Some("board0/c1".into()),
        ..Default::default()
    };
    assert_eq!(ids(&query(&store, slice).await), ["r2", "r3"]);

    let valid_dgemm_job1 = ResultQuery {
        job_id: Some("job1".into()),
        kernel: Some("dgemm".into()),
        valid_only: true,
        ..Default::default()
    };
    assert_eq!(ids(&query(&store, valid_dgemm_job1).await), ["r1", "r2"]);

    let since = ResultQuery {
        since: Some(UNIX_EPOCH + Duration::from_millis(T0 + 3_000)),
        ..Default::default()
    };
    assert_eq!(ids(&query(&store, since).await), ["r4", "r5", "r6"]);

    let limited = ResultQuery { limit: 2, ..dgemm };
    assert_eq!(
        ids(&query(&store, limited).await),
        ["r5", "r6"],
        "the most recent matches are kept"
    );

    let other_backend = ResultQuery {
        backend: Some("host".into()),
        ..Default::default()
    };
    assert!(query(&store, other_backend).await.is_empty());
    let unknown_job = ResultQuery {
        job_id: Some("nojob".into()),
        ..Default::default()
    };
    assert!(query(&store, unknown_job).await.is_empty());
}

#[tokio::test]
async fn duplicate_record_id_is_stored_once() {
    let (_server, bus) = setup().await;
    let store = ResultsStore::open(&bus).await.expect("open");
    let first = sample_records().remove(0);
    let receipt = within("first", store.record_with_receipt(&first))
        .await
        .expect("first");
    assert!(!receipt.duplicate);
    let mut again = first.clone();
    again.gflops = Some(999.0);
    let second = within("again", store.record_with_receipt(&again))
        .await
        .expect("again");
    assert!(second.duplicate, "same record id is a duplicate");
    assert_eq!(second.sequence, receipt.sequence);
    assert_eq!(
        within("seq", store.record(&again)).await.expect("third"),
        receipt.sequence
    );

    let stored = query(&store, ResultQuery::default()).await;
    assert_eq!(stored, vec![first], "only the first copy is kept");
    let info = stream_info(&bus, subjects::MEASUREMENTS_STREAM).await;
    assert_eq!(info.state.messages, 1);
}

#[tokio::test]
async fn best_for_kernel_ranks_trustworthy_records_across_jobs() {
    let (_server, _bus, store) = store_with_samples().await;
    let mut flagged = sample_records().remove(0);
    flagged.record_id = "flagged".into();
    flagged.gflops = Some(1_000.0);
    flagged.flags = vec!["exceeds the modeled peak".into()];
    store.record(&flagged).await.expect("record flagged");

    let best = within("best", store.best_for_kernel("dgemm", 3))
        .await
        .expect("best");
    assert_eq!(ids(&best), ["r5", "r2", "r6"]);
    let none = store.best_for_kernel("stencil2d", 3).await.expect("empty");
    assert!(none.is_empty());
}

#[tokio::test]
async fn bad_queries_and_records_are_clear_errors() {
    let (_server, bus) = setup().await;
    let store = ResultsStore::open(&bus).await.expect("open");
    let error = store
        .query(&ResultQuery {
            limit: 0,
            ..Default::default()
        })
        .await
        .expect_err("limit 0");
    assert!(error.to_string().contains("limit"), "{error}");
    let error = store
        .query(&ResultQuery {
            job_id: Some("a.b".into()),
            ..Default::default()
        })
        .await
        .expect_err("bad job id");
    assert!(matches!(error, BusError::InvalidId { .. }), "{error}");

    let mut bad = sample_records().remove(0);
    bad.samples.push(f64::INFINITY);
    let error = store.record(&bad).await.expect_err("infinite sample");
    assert!(error.to_string().contains("finite"), "{error}");
    bad.samples.pop();
    bad.record_id = String::new();
    let error = store.record(&bad).await.expect_err("empty id");
    assert!(error.to_string().contains("record id"), "{error}");
}

#[tokio::test]
async fn undecodable_payloads_are_skipped_not_fatal() {
    let (_server, bus, store) = store_with_samples().await;
    let subject = measurement_subject("job1", "dgemm", HASH_A, "board0/c0").expect("subject");
    bus.jetstream()
        .publish(subject, "not json".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let all = query(&store, ResultQuery::default()).await;
    assert_eq!(ids(&all), ["r1", "r2", "r3", "r4", "r5", "r6"]);
}

#[tokio::test]
async fn jsonl_and_csv_exports_parse_back() {
    let mut records = sample_records();
    // A candidate built from edited sources: the diff travels in JSONL, the
    // CSV says it was edited.
    let edited = records[1]
        .clone()
        .with_source_diff(Some("--- a/k.c\n+++ b/k.c\n@@ -1 +1 @@\n-a\n+b\n".into()));
    records[1] = edited;
    let mut jsonl = Vec::new();
    to_jsonl(&records, &mut jsonl).expect("jsonl");
    let text = String::from_utf8(jsonl.clone()).expect("utf8");
    assert_eq!(text.lines().count(), records.len());
    assert_eq!(read_jsonl(jsonl.as_slice()).expect("read back"), records);
    let error = read_jsonl("{\"record_id\": \"x\"}\nnot json\n".as_bytes()).expect_err("bad");
    assert!(error.to_string().contains("line 2"), "{error}");

    let mut csv_bytes = Vec::new();
    to_csv(&records, &mut csv_bytes).expect("csv");
    let mut reader = csv::Reader::from_reader(csv_bytes.as_slice());
    let header: Vec<String> = reader
        .headers()
        .expect("header")
        .iter()
        .map(str::to_string)
        .collect();
    assert_eq!(&header[..CSV_COLUMNS.len()], CSV_COLUMNS);
    assert_eq!(
        &header[CSV_COLUMNS.len()..],
        ["param.ROWS_PER_CORE", "param.TILE"]
    );
    let column = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("column {name}"))
    };
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.expect("row")).collect();
    assert_eq!(rows.len(), records.len());
    for (row, record) in rows.iter().zip(&records) {
        assert_eq!(&row[column("record_id")], record.record_id);
        assert_eq!(&row[column("slice_id")], record.slice_id);
        assert_eq!(&row[column("param.TILE")], record.params["TILE"]);
        assert_eq!(
            row[column("valid")].parse::<bool>().expect("bool"),
            record.valid
        );
        let gflops = &row[column("gflops")];
        assert_eq!(
            (!gflops.is_empty()).then(|| gflops.parse::<f64>().expect("number")),
            record.gflops
        );
    }
    assert_eq!(&rows[1][column("source_edited")], "true");
    assert_eq!(&rows[0][column("source_edited")], "false");
    assert_eq!(&rows[3][column("param.ROWS_PER_CORE")], "8");
    assert_eq!(&rows[0][column("param.ROWS_PER_CORE")], "");
    assert_eq!(&rows[0][column("samples_s")], "0.5 0.25 0.75");
    assert_eq!(&rows[2][column("median_s")], "", "invalid: no statistics");
}

#[tokio::test]
async fn records_survive_a_server_restart() {
    let (mut server, bus, store) = store_with_samples().await;
    let server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .expect("restart task");
    bus.wait_connected(common::WAIT).await.expect("reconnected");
    let stored = query(&store, ResultQuery::default()).await;
    assert_eq!(stored, sample_records());
    drop(server);
}

/// A writer whose reader went away (`| head`): every write fails.
struct ClosedPipe;

impl std::io::Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Err(std::io::ErrorKind::BrokenPipe.into())
    }
}

#[test]
fn a_closed_output_is_an_io_error_of_both_exports_not_an_encoding_one() {
    let records = sample_records();
    for error in [
        to_jsonl(&records, ClosedPipe).expect_err("jsonl into a closed pipe"),
        to_csv(&records, ClosedPipe).expect_err("csv into a closed pipe"),
    ] {
        match error {
            ExportError::Io(io) => assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe),
            other => panic!("not an I/O error: {other:?}"),
        }
    }
}
