//! Scenario 2: a worker frozen (SIGSTOP) mid-task past its lease loses the
//! task to another slice; thawed (SIGCONT), it publishes a late result for
//! attempt 1 marked fenced. The leader drops it (`result of a stale attempt
//! dropped` in its log) and the accepted result is, and stays, attempt 2's.

use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::{ChaosOptions, Seen};
use mtswarm_tests::{node_bin, small_fleet_toml};

use mtswarm_tests::jobs::get_job;

use crate::support::{
    Started, first_assignment, ms, one_at_a_time, outcome, start_job, vecadd_job, wait_attempt,
    wait_checkpoint, wait_leader_log,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn frozen_worker_late_result_is_fenced_off() {
    let _serial = one_at_a_time().await;
    let options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    let ttl = Duration::from_secs(options.lease_ttl_seconds);
    let spec = vecadd_job("Tune vecadd; one worker will freeze", 1, true);
    let Started {
        stack,
        mut control,
        job_id,
        ..
    } = start_job(options, 2, spec).await;

    let first = first_assignment(&stack, &job_id).await;
    wait_checkpoint(&stack, &first, 2).await;
    let frozen = stack.worker_by_id(&first.worker_id);
    let frozen_at = tokio::time::Instant::now();
    frozen.process.pause().expect("SIGSTOP the worker");
    let reassigned =
        wait_attempt(&stack, &job_id, &first.task_id, 2, Duration::from_secs(60)).await;
    // Thaw it whatever happened, so it does not stay frozen past the test.
    frozen.process.resume().expect("SIGCONT the worker");
    let thawed_at = tokio::time::Instant::now();
    let (reassigned_at, second) = reassigned.unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));

    let task_id = first.task_id.clone();
    let late = stack
        .observer
        .wait_for(
            "the thawed worker's late result for attempt 1",
            Duration::from_secs(30),
            |seen| {
                seen.iter().find_map(|o| match &o.seen {
                    Seen::Result(r) if r.task_id == task_id && r.attempt == 1 => {
                        Some((o.at, r.clone()))
                    }
                    _ => None,
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", stack.logs()));
    let logged_drop = wait_leader_log(
        &stack,
        "result of a stale attempt dropped",
        Duration::from_secs(15),
    )
    .await;

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;
    let record = get_job(&mut control, &job_id).await;
    end.report(
        "fencing",
        &[
            ("reassign_ms", ms(reassigned_at.duration_since(frozen_at))),
            ("lease_ttl_ms", ms(ttl)),
            (
                "late_result_ms_after_thaw",
                ms(late.0.duration_since(thawed_at)),
            ),
            ("stale_drop_logged", logged_drop.to_string()),
        ],
    );

    let late = late.1;
    assert!(late.fenced, "the late result is marked fenced: {late:#?}");
    assert_eq!(late.status(), v1::TaskStatus::Cancelled, "{late:#?}");
    assert!(late.error.starts_with("fenced off:"), "{late:#?}");
    assert!(
        logged_drop,
        "the leader did not log `result of a stale attempt dropped`:\n{}",
        stack.leader_logs()
    );
    end.assert_nothing_lost(&stack);
    let accepted = &end.accepted;
    let outcome: Vec<&v1::TaskResult> = accepted
        .iter()
        .filter(|r| r.task_id == first.task_id)
        .collect();
    assert_eq!(
        outcome.len(),
        1,
        "one accepted result for the task: {accepted:#?}"
    );
    assert_eq!(
        outcome[0].attempt, 2,
        "attempt 2's result is the outcome: {:#?}",
        outcome[0]
    );
    assert!(!outcome[0].fenced);
    assert_eq!(outcome[0].slice_id, second.slice_id);
    let tracked = record
        .tasks
        .iter()
        .find(|t| {
            t.assignment
                .as_ref()
                .is_some_and(|a| a.task_id == first.task_id)
        })
        .expect("the task in JobRecord.tasks");
    assert_eq!(
        tracked.assignment.as_ref().map(|a| a.attempt),
        Some(2),
        "{tracked:#?}"
    );
    assert!(
        tracked.done && tracked.status() == v1::TaskStatus::Ok,
        "{tracked:#?}"
    );
}
