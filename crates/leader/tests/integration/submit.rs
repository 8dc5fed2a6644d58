//! SubmitJob over real gRPC: invalid requests are refused with
//! INVALID_ARGUMENT naming the problem and store nothing; a valid one is
//! stored once per idempotency key, its `@path` references reach the
//! leader's model; the server has health and reflection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_bus::{Jobs, v1};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use tokio_stream::StreamExt as _;

/// `spec("tune")` changed by `change`.
fn tune_with(change: impl FnOnce(&mut v1::JobSpec)) -> Option<v1::JobSpec> {
    let mut spec = spec("tune");
    change(&mut spec);
    Some(spec)
}

/// `spec("tune")` with the default budgets changed by `change`.
fn budgets_with(change: impl FnOnce(&mut v1::Budgets)) -> Option<v1::JobSpec> {
    tune_with(|spec| {
        let mut budgets = v1::Budgets::default();
        change(&mut budgets);
        spec.budgets = Some(budgets);
    })
}

#[tokio::test]
async fn invalid_submissions_name_the_problem_and_store_nothing() {
    let env = Env::start().await;
    let leader = env.leader(Arc::new(ScriptedModel::new([]))).await;
    let mut control = control(&leader).await;

    let cases: Vec<(&str, Option<v1::JobSpec>, &str)> = vec![
        ("missing spec", None, "spec is missing"),
        ("empty goal", Some(spec("   ")), "goal is empty"),
        (
            "oversize goal",
            Some(spec(&"x".repeat(70 * 1024))),
            "goal is too large",
        ),
        (
            "unknown kernel",
            tune_with(|s| s.kernel_dir = "no-such-kernel".into()),
            "unknown kernel directory",
        ),
        (
            "escaping kernel dir",
            tune_with(|s| s.kernel_dir = "../k1".into()),
            "must not contain `..`",
        ),
        (
            "bad selector",
            tune_with(|s| s.slice_selector = "colour=red".into()),
            "slice_selector",
        ),
        (
            "bad selector operator",
            tune_with(|s| s.slice_selector = "backend>=emulator".into()),
            "slice_selector",
        ),
        (
            "oversize attachment",
            Some(spec("look at @big.bin")),
            "attachment @big.bin is too large",
        ),
        (
            "missing attachment",
            Some(spec("look at @missing.c")),
            "attachment @missing.c",
        ),
        (
            "negative device seconds",
            budgets_with(|b| b.device_seconds = -1.0),
            "bad budgets: device_seconds",
        ),
        (
            "too many steps",
            budgets_with(|b| b.max_steps = 1_000_000),
            "bad budgets: max_steps",
        ),
        (
            "wall time",
            budgets_with(|b| b.wall_time_seconds = 365 * 24 * 3600),
            "bad budgets: wall_time_seconds",
        ),
    ];

    for (name, spec, expected) in cases {
        let status = control
            .submit_job(v1::SubmitJobRequest {
                spec,
                idempotency_key: String::new(),
            })
            .await
            .expect_err(name);
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{name}: {status:?}"
        );
        assert!(
            status.message().contains(expected),
            "{name}: message {:?} should contain {expected:?}",
            status.message()
        );
    }
    let jobs = Jobs::open(&env.bus).await.expect("jobs bucket");
    assert!(
        jobs.list().await.expect("list jobs").is_empty(),
        "nothing stored"
    );
    leader.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_valid_job_is_stored_once_per_key_and_sees_its_attachments() {
    let env = Env::start().await;
    // An answer before any task is refused until the refusals are spent
    // (three, then the fourth answer ends the loop).
    let model = Arc::new(ScriptedModel::new((0..4).map(|_| {
        ScriptedTurn::text("Nothing to tune.\n```json\n{\"best\": {\"params\": {}}}\n```")
    })));
    let leader = env.leader(model.clone()).await;
    let mut control = control(&leader).await;
    let request = v1::SubmitJobRequest {
        spec: Some(spec("Tune @kernel.c please.")),
        idempotency_key: "client-retry-1".into(),
    };
    let first = control
        .submit_job(request.clone())
        .await
        .expect("submit")
        .into_inner()
        .job_id;
    let second = control
        .submit_job(request)
        .await
        .expect("retried submit")
        .into_inner()
        .job_id;
    assert_eq!(first, second, "same idempotency key, same job");

    let events = watch_to_end(&mut control, &first, 0).await;
    // No task ran, so there is no measurement: the answer alone is no success.
    assert_eq!(final_state(&events), Some(v1::JobState::Failed));
    let jobs = Jobs::open(&env.bus).await.expect("jobs bucket");
    assert_eq!(jobs.list().await.expect("list").len(), 1, "one job stored");
    let job = get_job(&mut control, &first).await.expect("get_job");
    assert_eq!(job.state(), v1::JobState::Failed);
    assert!(
        job.error.contains("no task has been assigned"),
        "{}",
        job.error
    );
    assert!(
        job.summary
            .starts_with("The leader's loop ended without an accepted answer"),
        "{}",
        job.summary
    );
    assert!(job.final_answer.starts_with("Nothing to tune."));
    assert!(
        !job.leader_state_json.is_empty(),
        "leader loop checkpointed"
    );

    let requests = model.requests();
    let task = requests[0]
        .messages
        .iter()
        .find(|m| m.role == mtswarm_core::Role::User)
        .expect("task message");
    assert!(
        task.content.contains("MARKER-42"),
        "attachment in the task: {}",
        task.content
    );
    assert!(
        requests[0].messages[0].content.contains("spawn_agent"),
        "system prompt lists tools"
    );

    let listed = control
        .list_jobs(v1::ListJobsRequest {
            states: vec![v1::JobState::Failed as i32],
            ..Default::default()
        })
        .await
        .expect("list_jobs")
        .into_inner();
    assert_eq!(listed.jobs.len(), 1);
    let unknown = get_job(&mut control, "nope")
        .await
        .expect_err("unknown job");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    leader.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn reflection_lists_control_and_health_is_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let env = Env::start().await;
    let leader = env.leader(Arc::new(ScriptedModel::new([]))).await;
    let channel = tonic::transport::Endpoint::from_shared(leader.grpc_url())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(
            channel.clone(),
        );
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = within("reflection answer", responses.next())
        .await
        .expect("a response")
        .expect("ok response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a service list, got {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.iter().any(|n| n == "mtswarm.v1.Control"), "{names:?}");

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "mtswarm.v1.Control".into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::Serving);
    leader.shutdown().await.expect("shutdown");
}
