//! Scenario 7: 1,000 SubmitJob calls in one burst against a leader with
//! small limits (2 running, 16 queued). Every call is either accepted or
//! refused with RESOURCE_EXHAUSTED naming the limit; every accepted job is
//! listed and reaches a final state; none is lost.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_proto::v1;
use mtswarm_tests::chaos::{ChaosOptions, ChaosStack};
use mtswarm_tests::node_bin;

use crate::support::{is_final, ms, one_at_a_time, report, vecadd_job};

const SUBMISSIONS: usize = 1_000;
const MAX_ACTIVE: usize = 2;
const MAX_QUEUED: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submit_burst_is_accepted_or_refused_and_nothing_is_lost() {
    let _serial = one_at_a_time().await;
    // No workers: accepted jobs fail fast (no slice), which frees slots.
    let mut options = ChaosOptions::new(node_bin!(), String::new());
    options.leader_env = vec![
        ("MTSWARM_MAX_ACTIVE_JOBS".into(), MAX_ACTIVE.to_string()),
        ("MTSWARM_MAX_QUEUED_JOBS".into(), MAX_QUEUED.to_string()),
    ];
    let stack = ChaosStack::start(options).await;
    let control = stack.control().await;

    let started = tokio::time::Instant::now();
    let outcomes: Vec<Result<String, tonic::Status>> = futures::stream::iter(0..SUBMISSIONS)
        .map(|index| {
            let mut control = control.clone();
            async move {
                control
                    .submit_job(v1::SubmitJobRequest {
                        spec: Some(vecadd_job(&format!("burst job {index}"), 1, true)),
                        idempotency_key: String::new(),
                    })
                    .await
                    .map(|r| r.into_inner().job_id)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let burst_time = started.elapsed();

    let mut accepted = BTreeSet::new();
    let mut refused = Vec::new();
    let mut unexpected = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(job_id) => {
                assert!(
                    accepted.insert(job_id.clone()),
                    "job id {job_id} returned twice"
                );
            }
            Err(status) if status.code() == tonic::Code::ResourceExhausted => refused.push(status),
            Err(status) => unexpected.push(status),
        }
    }
    assert!(
        unexpected.is_empty(),
        "calls failed otherwise: {unexpected:#?}"
    );
    assert!(
        !refused.is_empty(),
        "{} submissions all accepted: the leader enforced no limit",
        accepted.len()
    );
    for status in &refused {
        let message = status.message();
        assert!(
            message.contains("max_queued_jobs") || message.contains("max_active_jobs"),
            "the refusal names the limit: {message}"
        );
    }

    // Every accepted job is listed and reaches a final state.
    let drain_started = tokio::time::Instant::now();
    let deadline = drain_started + Duration::from_secs(120);
    let mut control = stack.control().await;
    let (listed, unfinished) = loop {
        let jobs = mtswarm_tests::jobs::list_all_jobs(&mut control).await;
        let listed: BTreeSet<String> = jobs.iter().map(|j| j.job_id.clone()).collect();
        let unfinished = jobs.iter().filter(|j| !is_final(j.state())).count();
        if unfinished == 0 || tokio::time::Instant::now() >= deadline {
            break (listed, unfinished);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let missing: Vec<&String> = accepted.difference(&listed).collect();
    report(
        "burst",
        &[
            ("submissions", SUBMISSIONS.to_string()),
            ("accepted", accepted.len().to_string()),
            ("refused", refused.len().to_string()),
            ("burst_ms", ms(burst_time)),
            ("drain_ms", ms(drain_started.elapsed())),
            ("jobs_lost", missing.len().to_string()),
            ("unfinished", unfinished.to_string()),
        ],
    );
    if !missing.is_empty() {
        // Say whether the job exists (a listing gap) or is gone (lost).
        let mut found = Vec::new();
        for job_id in &missing {
            let record = control
                .get_job(v1::GetJobRequest {
                    job_id: (*job_id).clone(),
                })
                .await
                .map(|r| r.into_inner().job.map(|j| j.state()));
            found.push(format!("{job_id}: GetJob -> {record:?}"));
        }
        panic!(
            "accepted jobs missing from ListJobs ({} listed, {} accepted):\n{}\n{}",
            listed.len(),
            accepted.len(),
            found.join("\n"),
            stack.logs()
        );
    }
    assert_eq!(
        listed.len(),
        accepted.len(),
        "the listing holds exactly the accepted jobs"
    );
    assert_eq!(
        unfinished,
        0,
        "accepted jobs still not final after the drain\n{}",
        stack.logs()
    );
    assert!(
        accepted.len() >= MAX_ACTIVE + MAX_QUEUED,
        "at least the running and queued slots were filled: {}",
        accepted.len()
    );
}
