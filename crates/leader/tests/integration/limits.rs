//! Backpressure: with small limits, a burst of 1000 concurrent submissions
//! is split exactly into accepted jobs (running up to `max_active_jobs`,
//! the rest QUEUED up to `max_queued_jobs`) and RESOURCE_EXHAUSTED refusals
//! naming the limits; no other outcome. Every accepted job is listed
//! (running or visibly QUEUED) and, once the models answer, reaches a final
//! state. An oversize gRPC message is refused by the server's size cap.
//! (The queue's first-in-first-out order is a unit test of the scheduler.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use futures::StreamExt as _;
use mtswarm_bus::v1;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::{ChatModel, ChatRequest, ModelError, ModelStream};
use tokio::sync::watch;

/// Answers at once, but only after the test opens the gate.
struct HeldModel {
    open: watch::Receiver<bool>,
}

#[async_trait::async_trait]
impl ChatModel for HeldModel {
    fn model_name(&self) -> &str {
        "held"
    }
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let mut open = self.open.clone();
        open.wait_for(|o| *o)
            .await
            .map_err(|_| ModelError::Other("gate dropped".into()))?;
        ScriptedModel::new([ScriptedTurn::text(
            "Nothing to tune.\n```json\n{\"best\":{\"gflops\":1.0}}\n```",
        )])
        .stream(request)
        .await
    }
}

const MAX_ACTIVE: usize = 2;
const MAX_QUEUED: usize = 8;
const BURST: usize = 1000;

#[tokio::test]
async fn a_burst_of_1000_submits_is_each_accepted_or_refused() {
    let env = Env::start().await;
    let (open_tx, open_rx) = watch::channel(false);
    let mut config = env
        .config()
        .with_model_factory(Arc::new(move |_spec: &v1::JobSpec| {
            Ok(Arc::new(HeldModel {
                open: open_rx.clone(),
            }) as Arc<dyn ChatModel>)
        }));
    config.max_active_jobs = MAX_ACTIVE;
    config.max_queued_jobs = MAX_QUEUED;
    config.grpc_max_message_bytes = 64 * 1024;
    let leader = start_leader(config).await;
    let control = control(&leader).await;

    let outcomes: Vec<Result<String, tonic::Status>> = within(
        "the burst",
        futures::stream::iter(0..BURST)
            .map(|i| {
                let mut control = control.clone();
                async move { try_submit(&mut control, spec(&format!("burst job {i}"))).await }
            })
            .buffer_unordered(64)
            .collect(),
    )
    .await;
    let mut accepted = BTreeSet::new();
    let mut refused = 0;
    for outcome in &outcomes {
        match outcome {
            Ok(job_id) => {
                accepted.insert(job_id.clone());
            }
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    status.message().contains("max_active_jobs = 2")
                        && status.message().contains("max_queued_jobs = 8"),
                    "{}",
                    status.message()
                );
                refused += 1;
            }
            Err(status) => panic!("unexpected status {status:?}"),
        }
    }
    assert_eq!(accepted.len() + refused, BURST);
    // The models hold every running job, so exactly the limits were taken.
    assert_eq!(accepted.len(), MAX_ACTIVE + MAX_QUEUED);
    assert_eq!(leader.job_counts(), (MAX_ACTIVE, MAX_QUEUED));

    let mut lister = control.clone();
    let listed = lister
        .list_jobs(v1::ListJobsRequest {
            page_size: 500,
            ..Default::default()
        })
        .await
        .expect("list_jobs")
        .into_inner()
        .jobs;
    let listed_ids: BTreeSet<String> = listed.iter().map(|j| j.job_id.clone()).collect();
    assert_eq!(
        listed_ids, accepted,
        "every accepted job is listed, nothing else"
    );
    let states: Vec<v1::JobState> = listed.iter().map(|j| j.state()).collect();
    assert_eq!(
        states
            .iter()
            .filter(|s| **s == v1::JobState::Queued)
            .count(),
        MAX_QUEUED,
        "{states:?}"
    );

    // An oversize request is refused by the message size cap.
    let oversize = try_submit(&mut lister, spec(&"x".repeat(128 * 1024)))
        .await
        .expect_err("over the 64 KiB cap");
    assert_eq!(oversize.code(), tonic::Code::OutOfRange, "{oversize:?}");
    assert!(
        oversize.message().contains("message length too large"),
        "{oversize:?}"
    );

    open_tx.send_replace(true);
    let jobs = mtswarm_bus::Jobs::open(&env.bus).await.expect("jobs");
    eventually("every accepted job to finish", || async {
        let records = jobs.list().await.ok()?;
        records
            .iter()
            .all(|r| runner_is_final(r.value.state()))
            .then_some(())
    })
    .await;
    // A runner frees its slot just after it writes the final record.
    eventually("every runner to free its slot", || async {
        (leader.job_counts() == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(leader.job_counts(), (0, 0));
    leader.shutdown().await.expect("shutdown");
}

/// Jobs without tasks end FAILED (no measurement); either way they ended.
fn runner_is_final(state: v1::JobState) -> bool {
    matches!(state, v1::JobState::Succeeded | v1::JobState::Failed)
}
