//! Scenario 3: the leader process is SIGKILLed mid-job and a new leader
//! process starts on the same NATS. It resumes the job from its record; the
//! job completes, every task has exactly one accepted result, and no task
//! attempt was published twice (re-executed tool calls are idempotent).

use std::time::Duration;

use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{Started, ms, one_at_a_time, outcome, own_agents, start_mid_job};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_survives_the_leader_being_killed_and_replaced() {
    let _serial = one_at_a_time().await;
    // Both tasks are out and one of them is under way: mid-job.
    let Started {
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

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;
    end.report(
        "leader_death",
        &[
            ("leader_restart_ms", ms(restart_time)),
            ("job_ms", ms(end.finished_at.duration_since(started))),
        ],
    );

    end.assert_nothing_lost(&stack);
    let (job, counts) = (&end.job, &end.counts);
    assert_eq!(counts.tasks, 2, "{:#?}", stack.observer.tasks(&job_id));
    assert_eq!(
        counts.republished,
        0,
        "a task attempt was published twice: {:#?}",
        stack.observer.tasks(&job_id)
    );
    assert_eq!(job.tasks_done, 2, "{job:#?}");
    assert_eq!(
        own_agents(job).len(),
        2,
        "no agent spawned twice: {:#?}",
        job.agents
    );
}
