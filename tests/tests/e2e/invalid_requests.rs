//! Acceptance 4: invalid SubmitJob requests over a real socket are refused
//! with INVALID_ARGUMENT naming the problem, and nothing half-created is
//! left behind (ListJobs stays empty).

use std::time::Duration;

use mtswarm_proto::GrpcTransport;
use mtswarm_proto::v1;
use mtswarm_proto::v1::control_client::ControlClient;
use mtswarm_tests::{StackOptions, TestStack, node_bin};

use crate::support::job_spec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_submissions_are_refused_and_leave_nothing_behind() {
    let stack = TestStack::start(StackOptions::new(node_bin!(), String::new())).await;
    let mut control = stack.control().await;

    let oversize_goal = format!("Tune it. {}", "x".repeat(200 * 1024));
    let cases: Vec<(&str, v1::JobSpec, &[&str])> = vec![
        ("empty goal", job_spec("   ", "vecadd", true), &["goal"]),
        (
            "unknown kernel",
            job_spec("Tune it", "no-such-kernel", true),
            &["no-such-kernel"],
        ),
        (
            "kernel path escaping the root",
            job_spec("Tune it", "../../etc", true),
            &["kernel"],
        ),
        (
            "bad selector",
            v1::JobSpec {
                slice_selector: "cores>>eight".into(),
                ..job_spec("Tune it", "vecadd", true)
            },
            &["selector"],
        ),
        (
            "oversize goal",
            job_spec(&oversize_goal, "vecadd", true),
            &["goal"],
        ),
        (
            "missing @file",
            job_spec("Tune it, see @no-such-file.c", "vecadd", true),
            &["no-such-file.c"],
        ),
        (
            "negative device budget",
            v1::JobSpec {
                budgets: Some(v1::Budgets {
                    device_seconds: -1.0,
                    ..Default::default()
                }),
                ..job_spec("Tune it", "vecadd", true)
            },
            &["device"],
        ),
    ];
    for (name, spec, words) in cases {
        let request = v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: String::new(),
        };
        let status = refused(&mut control, request, name).await;
        let message = status.message().to_ascii_lowercase();
        for word in words {
            assert!(
                message.contains(&word.to_ascii_lowercase()),
                "{name}: the message should name {word:?}: {}",
                status.message()
            );
        }
    }
    // A request without a spec at all.
    refused(&mut control, v1::SubmitJobRequest::default(), "no spec").await;

    let jobs = control
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("ListJobs")
        .into_inner();
    assert!(jobs.jobs.is_empty(), "nothing stored: {:#?}", jobs.jobs);

    // The same leader still accepts a valid job afterwards (it fails later
    // for lack of workers, which is not a validation matter).
    let accepted = control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(job_spec("Tune vecadd", "vecadd", true)),
            idempotency_key: "valid-after-invalid".into(),
        })
        .await
        .expect("a valid job is accepted")
        .into_inner();
    let jobs = control
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("ListJobs")
        .into_inner();
    assert_eq!(jobs.jobs.len(), 1);
    assert_eq!(jobs.jobs[0].job_id, accepted.job_id);
    let _ = tokio::time::timeout(Duration::from_secs(10), stack.shutdown()).await;
}

/// The refusal of `request`, which must be INVALID_ARGUMENT (`name` names
/// the case when it is not).
async fn refused<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    request: v1::SubmitJobRequest,
    name: &str,
) -> tonic::Status {
    let status = control.submit_job(request).await.expect_err(name);
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{name}: {status:?}"
    );
    status
}
