//! Acceptance: the Grafana dashboard shows data for a real job. A real
//! Prometheus (Debian's `prometheus` package) scrapes a local stack's
//! daemons (the in-process leader's `/metrics` endpoint, served as
//! `mtswarm leader --metrics-addr` serves it, and a worker process started
//! with `--metrics-addr`) every second while a job runs whose worker asks
//! for approvals and whose leader's model reports token usage; afterwards
//! `promtool query instant` answers every Prometheus query of every panel
//! of the dashboard JSON with data.
//!
//! This binary installs the global meter provider, so it holds this one
//! test only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

// Shared with the e2e binary; this test uses only part of it.
#[allow(dead_code, unused_imports)]
#[path = "e2e/support.rs"]
mod support;

use std::time::{Duration, Instant};

use mtswarm_proto::v1;
use mtswarm_telemetry::metrics::endpoint::MetricsEndpoint;
use mtswarm_telemetry::metrics::provider::{MetricsConfig, init_metrics};
use mtswarm_tests::jobs::{approvals, decide_approval_for, get_job, is_final};
use mtswarm_tests::observability::{
    PanelQuery, Prometheus, dashboard_path, dashboard_queries, instant_expr,
};
use mtswarm_tests::stack::Control;
use mtswarm_tests::{StackOptions, TestStack, small_fleet_toml};

use support::{
    fan_out_script, job_spec, quick_vecadd_parameters, script_leader, start_stack, submit,
};

/// The window of `$__rate_interval`: many 1 s scrapes.
const RATE_WINDOW: &str = "1m";

/// `host:port` of a `http://host:port/metrics` URL.
fn target_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string()
}

/// Decides every approval the job asks for (for the tool in the whole job,
/// so each tool asks once) until the job is final; the final record and
/// how many requests were decided.
async fn approve_until_final(
    stack: &TestStack,
    control: &mut Control,
    job_id: &str,
    timeout: Duration,
) -> (v1::JobRecord, usize) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut decided = 0;
    loop {
        let job = get_job(control, job_id).await;
        if is_final(job.state()) {
            return (job, decided);
        }
        for record in approvals(control, job_id, &[v1::ApprovalState::Pending]).await {
            let request = record.request.expect("the approval's request");
            // Another request of the same tool may have been decided by
            // the standing decision in between: that is fine.
            if decide_approval_for(
                control,
                &request.approval_id,
                v1::ApprovalVerdict::Approve,
                "metrics test",
                "metrics-test",
                v1::ApprovalScope::ToolForJob,
            )
            .await
            .is_ok()
            {
                decided += 1;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {job_id} not final within {timeout:?}: {job:#?}\n{}",
            stack.worker_logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_answers_every_dashboard_query_after_a_job() {
    let queries = dashboard_queries(&dashboard_path());
    assert!(
        queries.len() >= 15,
        "only {} Prometheus queries in the dashboard",
        queries.len()
    );

    // The in-process leader records into this process's meter provider;
    // its /metrics is what `mtswarm leader --metrics-addr` serves.
    let metrics = init_metrics(&MetricsConfig::new("mtswarm-leader")).expect("meter provider");
    let leader_endpoint = MetricsEndpoint::serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics.registry().expect("a registry").clone(),
    )
    .await
    .expect("the leader's metrics endpoint");

    let (stack, mut control) = start_stack(scripted_stack_options(), 1).await;
    let worker_targets: Vec<String> = stack
        .worker_ready
        .iter()
        .map(|ready| {
            target_of(
                ready.document["metrics"]
                    .as_str()
                    .expect("the worker announces its metrics URL in its ready file"),
            )
        })
        .collect();
    let leader_target = target_of(&leader_endpoint.url());

    let config = scrape_config(&leader_target, &worker_targets);
    let prometheus =
        tokio::task::block_in_place(|| Prometheus::start(&config, Duration::from_secs(60)));
    wait_until_every_target_is_up(&prometheus, 1 + worker_targets.len()).await;

    let job_id = submit(&mut control, job_spec("Metrics", "vecadd", false)).await;
    let (job, decided) =
        approve_until_final(&stack, &mut control, &job_id, Duration::from_secs(300)).await;
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{job:#?}\n{}",
        stack.worker_logs()
    );
    assert!(decided >= 1, "the job asked for no approval");

    // Every query of every panel answers with data once Prometheus has
    // scraped what the job left (waited for, not slept on).
    let empty = queries_without_data(&prometheus, &queries).await;
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}\nPrometheus:\n{}",
        empty.join("\n"),
        prometheus.log()
    );
    assert_the_figures_are_the_jobs(&prometheus);

    drop(prometheus);
    stack.shutdown().await;
    leader_endpoint.shutdown().await;
}

/// One worker process serving its metrics; the leader's model scripted,
/// reporting its token usage as a real one does, at a price.
fn scripted_stack_options() -> StackOptions {
    let turns = fan_out_script(&[("a1", "")], &quick_vecadd_parameters())
        .into_iter()
        .map(|turn| turn.with_usage(1200, 60))
        .collect::<Vec<_>>();
    let mut options = StackOptions::new(mtswarm_tests::node_bin!(), small_fleet_toml(1, 1, 2));
    // Its tokens have a price, so the cost panel has data too.
    let prices = mtswarm_leader::PriceTable::parse(
        "[prices.scripted]\nprompt_per_million = 0.5\ncompletion_per_million = 1.5\n",
        std::path::Path::new("prices.toml"),
    )
    .expect("a valid price table");
    options.configure_leader = Box::new(move |config| {
        config.prices = prices;
        script_leader(config, turns)
    });
    options.worker_args = vec!["--metrics-addr".into(), "127.0.0.1:0".into()];
    options
}

/// Scrape every second the leader (`leader_target`) and the workers.
fn scrape_config(leader_target: &str, worker_targets: &[String]) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n  - job_name: mtswarm-leader\n    static_configs:\n      - targets: [\"{leader_target}\"]\n\
         \x20 - job_name: mtswarm-worker\n    static_configs:\n      - targets: [{}]\n",
        worker_targets
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Wait (at most a minute) until Prometheus scrapes all of its `targets`.
async fn wait_until_every_target_is_up(prometheus: &Prometheus, targets: usize) {
    let up_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = prometheus.query("count(up == 1)").unwrap_or_default();
        let count = up
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if count == targets {
            break;
        }
        assert!(
            Instant::now() < up_deadline,
            "Prometheus scrapes {count} of {targets} targets: {:?}\n{}",
            prometheus.query("up"),
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The queries that answer no data once Prometheus has scraped what the
/// job left (tried again for at most 90 s); empty when all do.
async fn queries_without_data(prometheus: &Prometheus, queries: &[PanelQuery]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut empty = Vec::new();
        for query in queries {
            let expr = instant_expr(&query.expr, RATE_WINDOW);
            match prometheus.query(&expr) {
                Ok(samples) if !samples.is_empty() => {}
                Ok(_) => empty.push(format!(
                    "{} ({}): {expr}: no data",
                    query.panel, query.ref_id
                )),
                Err(error) => empty.push(format!("{} ({}): {error}", query.panel, query.ref_id)),
            }
        }
        if empty.is_empty() || Instant::now() >= deadline {
            return empty;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The figures are the job's, not placeholders.
fn assert_the_figures_are_the_jobs(prometheus: &Prometheus) {
    let value = |expr: &str| -> f64 {
        prometheus
            .query(expr)
            .expect("query")
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{expr}: no value"))
    };
    assert_eq!(value("sum(mtswarm_tasks_assigned_total)"), 1.0);
    assert_eq!(
        value("sum(mtswarm_jobs_finished_total{state=\"succeeded\"})"),
        1.0
    );
    assert!(value("sum(mtswarm_kernel_runs_total{outcome=\"valid\"})") >= 1.0);
    assert!(value("sum(mtswarm_approval_wait_duration_seconds_count)") >= 1.0);
    assert_eq!(value("sum(mtswarm_approvals_pending)"), 0.0);
    assert!(value("sum(gen_ai_client_token_usage_sum{gen_ai_token_type=\"input\"})") >= 1200.0);
    assert!(value("sum(mtswarm_slice_lock_busy_time_seconds_total)") > 0.0);
}
