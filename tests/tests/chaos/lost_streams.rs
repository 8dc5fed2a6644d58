//! Scenario 8: the results stream is deleted mid-job (an operator's mistake,
//! or a client with too wide permissions). The first process to notice
//! re-creates it (the worker whose publish finds no stream, or the
//! leader's result consumer), the task whose result was lost is delivered
//! again, and the job completes instead of hanging RUNNING.

use std::time::Duration;

use mtswarm_bus::subjects;
use mtswarm_proto::v1;
use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{
    MidJob, accepted_per_task, accepted_results, job_events, ms, one_at_a_time, report,
    start_mid_job, tally, wait_final,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_completes_after_its_results_stream_is_deleted() {
    let _serial = one_at_a_time().await;
    let options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    let MidJob {
        stack,
        mut control,
        job_id,
        ..
    } = start_mid_job(options, "Tune vecadd; its results stream will vanish").await;

    stack
        .observer
        .bus()
        .jetstream()
        .delete_stream(subjects::RESULTS_STREAM)
        .await
        .expect("delete the results stream");
    let deleted_at = tokio::time::Instant::now();

    let job = wait_final(&stack, &job_id, Duration::from_secs(120)).await;
    let completed_after = deleted_at.elapsed();
    let recreated = stack
        .observer
        .bus()
        .jetstream()
        .get_stream(subjects::RESULTS_STREAM)
        .await
        .is_ok();
    let events = job_events(&mut control, &job_id).await;
    let accepted = accepted_results(&events);
    let counts = tally(&stack.observer.snapshot(), &job_id, &accepted);
    report(
        "lost_streams",
        &[
            ("completed_ms_after_delete", ms(completed_after)),
            ("tasks", counts.tasks.to_string()),
            ("tasks_lost", counts.lost.to_string()),
            ("accepted", counts.accepted.to_string()),
            (
                "duplicates_accepted",
                counts.duplicates_accepted.to_string(),
            ),
        ],
    );

    assert!(recreated, "the results stream exists again");
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{job:#?}\n{}",
        stack.logs()
    );
    assert_eq!(
        counts.lost, 0,
        "tasks without an accepted result: {accepted:#?}"
    );
    assert_eq!(
        counts.duplicates_accepted,
        0,
        "{:?}",
        accepted_per_task(&accepted)
    );
}
