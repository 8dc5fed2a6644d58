//! A leader starts and serves whatever junk is in its buckets: a value that
//! decodes as nothing in every KV bucket, and a job record that decodes but
//! cannot be resumed. Listings answer with the good records, the junk is
//! skipped with a warning, and the unresumable job ends FAILED with its
//! reason instead of stopping the leader (a crash loop under Kubernetes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;

use common::*;
use mtswarm_bus::{Jobs, subjects, v1};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};

/// Not a protobuf message of any type (a tag with the reserved wire type 7).
const JUNK: &[u8] = b"\x0f\xff\xff\xff\xff\xff";

#[tokio::test]
async fn a_leader_starts_and_serves_with_junk_in_every_bucket() {
    let env = Env::start().await;
    for bucket in [
        subjects::JOBS_BUCKET,
        subjects::CHECKPOINTS_BUCKET,
        subjects::APPROVALS_BUCKET,
        subjects::QUARANTINE_BUCKET,
        subjects::WORKERS_BUCKET,
        subjects::LEASES_BUCKET,
    ] {
        env.bus
            .jetstream()
            .get_key_value(bucket)
            .await
            .unwrap_or_else(|e| panic!("bucket {bucket}: {e}"))
            .put("junk", JUNK.into())
            .await
            .unwrap_or_else(|e| panic!("junk into {bucket}: {e}"));
    }
    // Decodes, claims to be running, and has nothing to run.
    let jobs = Jobs::open(&env.bus).await.expect("jobs");
    jobs.create(&v1::JobRecord {
        job_id: "hollow".into(),
        state: v1::JobState::Running as i32,
        ..Default::default()
    })
    .await
    .expect("hollow job");

    let model = Arc::new(ScriptedModel::new([ScriptedTurn::text("nothing to do")]));
    let leader = env.leader(model).await;
    let mut control = control(&leader).await;

    let listed = control
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("ListJobs answers")
        .into_inner()
        .jobs;
    let ids: Vec<&str> = listed.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(
        ids,
        ["hollow"],
        "the junk value is skipped, the rest listed"
    );

    let hollow = eventually("the hollow job to fail", || {
        let mut control = control.clone();
        async move {
            let job = get_job(&mut control, "hollow").await.ok()?;
            (job.state() == v1::JobState::Failed).then_some(job)
        }
    })
    .await;
    assert!(
        hollow.error.contains("not resumable"),
        "the reason is kept: {}",
        hollow.error
    );

    let fleet = control
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .expect("ListFleet answers")
        .into_inner();
    assert!(fleet.slices.is_empty(), "{fleet:?}");
    control
        .list_approvals(v1::ListApprovalsRequest::default())
        .await
        .expect("ListApprovals answers");
    leader.shutdown().await.expect("clean shutdown");
}
