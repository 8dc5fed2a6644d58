//! Scenario 3: the leader process is SIGKILLed mid-job and a new leader
//! process starts on the same NATS. It resumes the job from its record; the
//! job completes, every task has exactly one accepted result, and no task
//! attempt was published twice (re-executed tool calls are idempotent).

use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::{ChaosOptions, ChaosStack, tasks_of};
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{
    accepted_per_task, accepted_results, job_events, ms, one_at_a_time, report, submit, tally,
    vecadd_job, wait_checkpoint, wait_final,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_survives_the_leader_being_killed_and_replaced() {
    let _serial = one_at_a_time().await;
    let mut stack =
        ChaosStack::start(ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2))).await;
    stack.wait_for_free_slices(2, Duration::from_secs(30)).await;
    let mut control = stack.control().await;
    let started = tokio::time::Instant::now();
    let job_id = submit(
        &mut control,
        vecadd_job("Tune vecadd; the leader will die", 2, true),
    )
    .await;

    // Both tasks are out and one of them is under way: mid-job.
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
