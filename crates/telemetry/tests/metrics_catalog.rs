//! Every instrument of the catalog reaches the Prometheus endpoint under
//! the name, type and labels the catalog gives it: the daemons' metrics are
//! recorded through the real meter provider, scraped over HTTP from
//! `/metrics`, and parsed.
//!
//! This binary installs the global meter provider, so it holds this one
//! test only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mtswarm_telemetry::metrics::catalog::{self, InstrumentKind};
use mtswarm_telemetry::metrics::endpoint::MetricsEndpoint;
use mtswarm_telemetry::metrics::observe::{self, JobCounts, SliceLockReading};
use mtswarm_telemetry::metrics::provider::{MetricsConfig, init_metrics};
use mtswarm_telemetry::metrics::{ApprovalDecisionKind, FencedAttempt, ModelCall, metrics};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `GET /metrics` over a plain TCP connection: status line and body.
async fn scrape(endpoint: &MetricsEndpoint) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(endpoint.local_addr())
        .await
        .expect("connect to the metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("a header block");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// `# TYPE name type` lines, and the label names of each family's samples.
fn families(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, BTreeSet<String>>) {
    let mut types = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let name = parts.next().unwrap().to_string();
            types.insert(name, parts.next().unwrap().to_string());
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let (series, label_text) = match line.split_once('{') {
                Some((name, rest)) => (name, rest.split_once('}').unwrap().0),
                None => (line.split_whitespace().next().unwrap(), ""),
            };
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    series
                        .strip_suffix(suffix)
                        .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(series);
            let entry = labels.entry(family.to_string()).or_default();
            for pair in label_text.split("\",").filter(|p| !p.is_empty()) {
                entry.insert(pair.split_once('=').unwrap().0.trim().to_string());
            }
        }
    }
    (types, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_catalog_instrument_is_scraped_as_defined() {
    let guard = init_metrics(&MetricsConfig::new("mtswarm-test")).expect("meter provider");
    let registry = guard.registry().expect("a prometheus registry").clone();
    let endpoint = MetricsEndpoint::serve("127.0.0.1:0".parse().unwrap(), registry)
        .await
        .expect("serve /metrics");

    let m = metrics();
    m.init_leader_series();
    m.init_worker_series("worker-b0", ["b0-c0"]);
    m.job_finished("succeeded");
    m.task_assigned("worker-b0");
    m.task_completed("ok", Some(Duration::from_millis(1500)));
    m.task_reassigned();
    m.task_fenced(FencedAttempt::Stale);
    m.kernel_run("worker-b0", "b0-c0", "valid");
    m.slice_quarantined("worker-b0", "b0-c0");
    m.approvals_waiting("worker-b0", 1);
    m.approval_decided(ApprovalDecisionKind::Approved, Duration::from_secs(3));
    m.model_call(ModelCall {
        provider: "openai",
        model: "qwen3",
        duration: Duration::from_millis(800),
        tokens: Some((1200, 80)),
        error_type: None,
    });
    m.model_cost("qwen3", 0.0125);
    let _leader = observe::observe_jobs(|| {
        Some(JobCounts {
            running: 2,
            queued: 1,
        })
    });
    let _worker = observe::observe_worker(
        "worker-b0",
        || Some(3),
        || {
            Some(vec![SliceLockReading {
                slice: "b0-c0".into(),
                busy_seconds: 1.5,
                wait_seconds: 0.25,
                acquisitions: 4,
            }])
        },
    );

    let (status, body) = scrape(&endpoint).await;
    assert!(status.contains("200"), "{status}\n{body}");
    let (types, labels) = families(&body);
    for def in catalog::ALL {
        let want = match def.kind {
            InstrumentKind::Counter | InstrumentKind::ObservableCounter => "counter",
            InstrumentKind::UpDownCounter | InstrumentKind::ObservableGauge => "gauge",
            InstrumentKind::Histogram => "histogram",
        };
        assert_eq!(
            types.get(def.prometheus).map(String::as_str),
            Some(want),
            "{} should be scraped as the {want} {}:\n{body}",
            def.name,
            def.prometheus
        );
        let family_labels = labels.get(def.prometheus).cloned().unwrap_or_default();
        for attribute in def.attributes {
            let label = attribute.replace('.', "_");
            // error.type is recorded on failed calls only.
            if *attribute == catalog::ATTR_ERROR_TYPE {
                continue;
            }
            assert!(
                family_labels.contains(&label),
                "{} has no {label} label: {family_labels:?}",
                def.prometheus
            );
        }
        for label in &family_labels {
            assert!(
                !label.contains("job_id")
                    && !label.contains("task_id")
                    && !label.contains("session"),
                "{} is labelled by an unbounded id {label}",
                def.prometheus
            );
        }
    }
    let sample = |family: &str, label: &str| {
        body.lines()
            .find(|line| line.starts_with(&format!("{family}{{")) && line.contains(label))
            .and_then(|line| line.rsplit(' ').next())
            .map(str::to_string)
    };
    assert_eq!(
        sample("mtswarm_jobs", "state=\"running\"").as_deref(),
        Some("2")
    );
    assert_eq!(
        sample(
            "mtswarm_slice_lock_busy_time_seconds_total",
            "slice_id=\"b0-c0\""
        )
        .as_deref(),
        Some("1.5")
    );
    assert!(
        body.contains("gen_ai_client_token_usage_sum{")
            && body.contains("gen_ai_token_type=\"input\""),
        "{body}"
    );
    endpoint.shutdown().await;
}
