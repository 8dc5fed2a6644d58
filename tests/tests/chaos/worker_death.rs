//! Scenario 1: the worker daemon running a task is SIGKILLed after the
//! task's checkpoint reached step 2. The leader re-publishes the task
//! (attempt 2) on another slice within two lease TTLs of the kill, the new
//! session resumes from the checkpoint (not from step 0), the job completes,
//! and every task has exactly one accepted result.

use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{
    Started, first_assignment, leader_log_events, ms, one_at_a_time, outcome, start_job,
    vecadd_job, wait_attempt, wait_checkpoint, wait_task_started,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_worker_task_is_reassigned_and_resumes_from_its_checkpoint() {
    let _serial = one_at_a_time().await;
    let options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    let ttl = Duration::from_secs(options.lease_ttl_seconds);
    let spec = vecadd_job("Tune vecadd; one worker will die", 1, true);
    let Started {
        mut stack,
        mut control,
        job_id,
        submitted_at: started,
    } = start_job(options, 2, spec).await;

    let first = first_assignment(&stack, &job_id).await;
    assert_eq!(first.attempt, 1, "{first:#?}");
    let step_at_kill = wait_checkpoint(&stack, &first, 2).await;
    let killed_at = stack.kill_worker(&first.worker_id);

    let reassigned = wait_attempt(&stack, &job_id, &first.task_id, 2, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    let reassign_time = reassigned.0.duration_since(killed_at);
    let second = reassigned.1;
    let resumed =
        wait_task_started(&stack, &job_id, &first.task_id, 2, Duration::from_secs(60)).await;
    let resumed_from_step = resumed["resumed_from_step"].as_u64().unwrap_or(0);

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;
    let journaled = leader_log_events(&end.events, "task_reassigned");
    let detected_ms = journaled
        .first()
        .and_then(|p| p["detected_ms"].as_u64())
        .map_or_else(|| "none".to_string(), |d| d.to_string());
    end.report(
        "worker_death",
        &[
            ("reassign_ms", ms(reassign_time)),
            ("leader_detected_ms", detected_ms),
            ("lease_ttl_ms", ms(ttl)),
            ("step_at_kill", step_at_kill.to_string()),
            ("resumed_from_step", resumed_from_step.to_string()),
            ("job_ms", ms(end.finished_at.duration_since(started))),
        ],
    );

    assert!(
        reassign_time <= 2 * ttl,
        "task re-published {reassign_time:?} after the kill, more than 2 x the {ttl:?} lease TTL"
    );
    assert!(second.resume_from_checkpoint, "{second:#?}");
    assert!(
        journaled
            .iter()
            .any(|p| p["task_id"] == first.task_id.as_str() && p["attempt"] == 2),
        "the move is journaled as task_reassigned on the job's stream: {journaled:#?}"
    );
    assert_ne!(
        second.slice_id, first.slice_id,
        "moved to another slice: {second:#?}"
    );
    assert_eq!(
        second.session_id, first.session_id,
        "same session: {second:#?}"
    );
    assert!(
        resumed_from_step > 0,
        "the resumed task started from step 0 instead of its checkpoint: {resumed}"
    );
    end.assert_nothing_lost(&stack);
    let (job, accepted) = (&end.job, &end.accepted);
    let moved = accepted
        .iter()
        .find(|r| r.task_id == first.task_id)
        .expect("the moved task's result");
    assert_eq!(
        moved.attempt, 2,
        "the accepted result is attempt 2's: {moved:#?}"
    );
    assert_eq!(moved.slice_id, second.slice_id, "{moved:#?}");
    assert_eq!(moved.status(), v1::TaskStatus::Ok, "{moved:#?}");
    assert_eq!(job.tasks_done, job.tasks_total, "{job:#?}");
}
