//! Scenario 8: the results stream is deleted mid-job (an operator's mistake,
//! or a client with too wide permissions). The first process to notice
//! re-creates it (the worker whose publish finds no stream, or the
//! leader's result consumer), the task whose result was lost is delivered
//! again, and the job completes instead of hanging RUNNING.

use std::time::Duration;

use mtswarm_bus::subjects;
use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{Started, ms, one_at_a_time, outcome, start_mid_job};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_completes_after_its_results_stream_is_deleted() {
    let _serial = one_at_a_time().await;
    let options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    let Started {
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

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(120)).await;
    let completed_after = end.finished_at.duration_since(deleted_at);
    let recreated = stack
        .observer
        .bus()
        .jetstream()
        .get_stream(subjects::RESULTS_STREAM)
        .await
        .is_ok();
    end.report(
        "lost_streams",
        &[("completed_ms_after_delete", ms(completed_after))],
    );

    assert!(recreated, "the results stream exists again");
    end.assert_nothing_lost(&stack);
}
