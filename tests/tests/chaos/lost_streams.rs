//! Scenario 8: the results stream is deleted mid-job (an operator's mistake,
//! or a client with too wide permissions). The first process to notice
//! re-creates it (the worker whose publish finds no stream, or the
//! leader's result consumer), the task whose result was lost is delivered
//! again, and the job completes instead of hanging RUNNING.

use std::time::Duration;

use mtswarm_bus::subjects;
use mtswarm_proto::v1;
use mtswarm_tests::chaos::{ChaosOptions, ChaosStack, tasks_of};
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{
    accepted_per_task, accepted_results, job_events, ms, one_at_a_time, report, submit, tally,
    vecadd_job, wait_checkpoint, wait_final,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_completes_after_its_results_stream_is_deleted() {
    let _serial = one_at_a_time().await;
    let options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    let stack = ChaosStack::start(options).await;
    stack.wait_for_free_slices(2, Duration::from_secs(30)).await;
    let mut control = stack.control().await;
    let job_id = submit(
        &mut control,
        vecadd_job("Tune vecadd; its results stream will vanish", 2, true),
    )
    .await;
    let job = job_id.clone();
    let assigned = stack
        .observer
        .wait_for("both task assignments", Duration::from_secs(60), |seen| {
            let tasks = tasks_of(seen, &job);
            (tasks.len() >= 2).then(|| tasks.into_iter().map(|(_, t)| t).collect::<Vec<_>>())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    wait_checkpoint(&stack, &assigned[0], 2).await;

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
