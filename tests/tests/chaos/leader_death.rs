//! Scenario 3: the leader process is SIGKILLed mid-job and a new leader
//! process starts on the same NATS. It resumes the job from its record; the
//! job completes, every task has exactly one accepted result, and no task
//! attempt was published twice (re-executed tool calls are idempotent).

use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{
    MidJob, accepted_per_task, accepted_results, job_events, ms, one_at_a_time, report,
    start_mid_job, tally, wait_final,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_survives_the_leader_being_killed_and_replaced() {
    let _serial = one_at_a_time().await;
    // Both tasks are out and one of them is under way: mid-job.
    let MidJob {
        mut stack,
        job_id,
        submitted_at: started,
        ..
    } = start_mid_job(
        ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2)),
        "Tune vecadd; the leader will die",
    )
    .await;
    stack.kill_leader();
    let killed_at = tokio::time::Instant::now();
    stack.start_leader();
    let restart_time = killed_at.elapsed();
    let mut control = stack.control().await;

    let job = wait_final(&stack, &job_id, Duration::from_secs(180)).await;
    let events = job_events(&mut control, &job_id).await;
    let accepted = accepted_results(&events);
    let counts = tally(&stack.observer.snapshot(), &job_id, &accepted);
    report(
        "leader_death",
        &[
            ("leader_restart_ms", ms(restart_time)),
            ("tasks", counts.tasks.to_string()),
            ("tasks_lost", counts.lost.to_string()),
            ("results_seen", counts.results_seen.to_string()),
            ("accepted", counts.accepted.to_string()),
            (
                "duplicates_accepted",
                counts.duplicates_accepted.to_string(),
            ),
            ("attempts_published_twice", counts.republished.to_string()),
            ("job_ms", ms(started.elapsed())),
        ],
    );

    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{job:#?}\n{}",
        stack.logs()
    );
    assert_eq!(counts.tasks, 2, "{:#?}", stack.observer.tasks(&job_id));
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
    assert_eq!(
        counts.republished,
        0,
        "a task attempt was published twice: {:#?}",
        stack.observer.tasks(&job_id)
    );
    assert_eq!(job.tasks_done, 2, "{job:#?}");
    assert_eq!(
        job.agents.len(),
        2,
        "no agent spawned twice: {:#?}",
        job.agents
    );
}
