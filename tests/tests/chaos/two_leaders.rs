//! Scenario 9: two leader processes on one NATS. Each job is owned by one
//! of them through its ownership lease (`mtswarm_job_owners`), with a
//! fencing epoch:
//!
//! - the owner is SIGKILLed mid-job: the standby takes the job over within
//!   twice the ownership TTL and finishes it;
//! - the owner is SIGSTOPped past its lease: the standby takes over; when
//!   the stale owner is SIGCONTed its writes are refused (it logs the lost
//!   ownership and stops the job's loop), and the job ends once; the job's
//!   record carries the new owner's epoch, which the store checks every
//!   owner write against.
//!
//! Either way no task is lost or accepted twice, no attempt is published
//! twice, and "job finished" is logged once, by the new owner.

use std::time::Duration;

use mtswarm_bus::{JobOwner, JobOwners, Versioned};
use mtswarm_tests::chaos::{ChaosOptions, ChaosStack};
use mtswarm_tests::{node_bin, small_fleet_toml};
use tokio::time::Instant;

use crate::support::{Outcome, Started, ms, one_at_a_time, outcome, own_agents, start_mid_job};

/// Ownership TTL of both leaders, whole seconds.
const JOB_LEASE_TTL: u64 = 3;

fn options() -> ChaosOptions {
    let mut options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    options.leader_args = vec!["--job-lease-ttl".into(), JOB_LEASE_TTL.to_string()];
    options
}

/// The job's current owner record.
async fn owner_of(owners: &JobOwners, job_id: &str) -> Option<Versioned<JobOwner>> {
    owners.get(job_id).await.expect("read the job's owner")
}

/// Waits until the job is owned by a leader other than `previous`;
/// returns the new owner and when it was seen.
async fn wait_new_owner(
    stack: &ChaosStack,
    owners: &JobOwners,
    job_id: &str,
    previous: &JobOwner,
    timeout: Duration,
) -> (Versioned<JobOwner>, Instant) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(owner) = owner_of(owners, job_id).await
            && owner.value.leader_id != previous.leader_id
        {
            return (owner, Instant::now());
        }
        assert!(
            Instant::now() < deadline,
            "job {job_id} not taken over from {} within {timeout:?}\n{}",
            previous.leader_id,
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A fleet with the job under way on the leader that received it (its
/// owner) and a standby leader (`standby-1`) started next to it: the
/// fleet, the ownership bucket and the job's first owner record.
async fn two_leaders_mid_job(goal: &str) -> (Started, JobOwners, Versioned<JobOwner>) {
    let mut started = start_mid_job(options(), goal).await;
    let owners = JobOwners::open(started.stack.observer.bus())
        .await
        .expect("owners");
    let first = owner_of(&owners, &started.job_id)
        .await
        .expect("the receiving leader owns the job");
    started
        .stack
        .start_standby_leader(&["--leader-id", "standby-1"]);
    (started, owners, first)
}

/// What both halves promise at the end (see the module docs).
fn assert_finished_once(stack: &ChaosStack, end: &Outcome, job_id: &str) {
    end.assert_nothing_lost(stack);
    let (job, counts) = (&end.job, &end.counts);
    assert_eq!(counts.tasks, 2, "{:#?}", stack.observer.tasks(job_id));
    assert_eq!(
        counts.republished,
        0,
        "a task attempt was published twice: {:#?}",
        stack.observer.tasks(job_id)
    );
    assert_eq!(job.tasks_done, 2, "{job:#?}");
    assert_eq!(
        own_agents(job).len(),
        2,
        "no agent spawned twice: {:#?}",
        job.agents
    );
    let finished = stack
        .leader_logs()
        .lines()
        .filter(|l| l.contains("job finished") && l.contains(job_id))
        .count();
    assert_eq!(
        finished,
        1,
        "\"job finished\" logged {finished} times\n{}",
        stack.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_leader_takes_over_the_job_of_a_killed_owner() {
    let _serial = one_at_a_time().await;
    let (
        Started {
            mut stack,
            job_id,
            submitted_at,
            ..
        },
        owners,
        first,
    ) = two_leaders_mid_job("Tune vecadd; its owner will die").await;

    stack.kill_leader();
    let killed_at = Instant::now();
    stack.promote_standby();
    let ttl = Duration::from_secs(JOB_LEASE_TTL);
    let (second, taken_at) = wait_new_owner(&stack, &owners, &job_id, &first.value, ttl * 4).await;
    let takeover = taken_at.duration_since(killed_at);
    assert_eq!(second.value.leader_id, "standby-1");
    assert!(
        second.value.epoch > first.value.epoch,
        "the new owner's epoch fences the old one: {second:?} after {first:?}"
    );

    let mut control = stack.control().await;
    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;
    end.report(
        "two_leaders_kill",
        &[
            ("job_lease_ttl_ms", ms(ttl)),
            ("takeover_ms", ms(takeover)),
            ("job_ms", ms(end.finished_at.duration_since(submitted_at))),
        ],
    );
    assert!(
        takeover <= ttl * 2,
        "takeover took {takeover:?}, more than twice the TTL of {ttl:?}\n{}",
        stack.logs()
    );
    assert_finished_once(&stack, &end, &job_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_owner_is_fenced_after_a_standby_took_its_job() {
    let _serial = one_at_a_time().await;
    let (
        Started {
            stack,
            job_id,
            submitted_at,
            ..
        },
        owners,
        first,
    ) = two_leaders_mid_job("Tune vecadd; its owner will pause").await;

    stack.leader().pause().expect("SIGSTOP the owner");
    let paused_at = Instant::now();
    let ttl = Duration::from_secs(JOB_LEASE_TTL);
    let (second, taken_at) = wait_new_owner(&stack, &owners, &job_id, &first.value, ttl * 4).await;
    let takeover = taken_at.duration_since(paused_at);
    assert!(
        second.value.epoch > first.value.epoch,
        "{second:?} after {first:?}"
    );
    // Past the new owner's first renewal, then the stale owner wakes up.
    tokio::time::sleep(ttl / 2).await;
    stack.leader().resume().expect("SIGCONT the owner");
    let resumed_at = Instant::now();

    // The stale owner finds out and stops the job's loop without ending it.
    let fenced_log = "job ownership lost";
    let deadline = Instant::now() + ttl * 4;
    while !stack.leader().stderr().contains(fenced_log) {
        assert!(
            Instant::now() < deadline,
            "the resumed owner did not report its lost ownership\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fenced_after = resumed_at.elapsed();

    // The stale owner still answers for the job, from KV.
    let mut control = stack.control().await;
    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;
    let last = owner_of(&owners, &job_id).await;
    end.report(
        "two_leaders_pause",
        &[
            ("job_lease_ttl_ms", ms(ttl)),
            ("takeover_ms", ms(takeover)),
            ("stale_owner_fenced_ms", ms(fenced_after)),
            ("job_ms", ms(end.finished_at.duration_since(submitted_at))),
        ],
    );
    assert!(
        takeover <= ttl * 2 + ttl,
        "takeover took {takeover:?}\n{}",
        stack.logs()
    );
    assert!(
        last.as_ref()
            .is_none_or(|o| o.value.leader_id != first.value.leader_id),
        "the stale owner never took the job back: {last:?}"
    );
    let stale_logs = stack.leader().stderr();
    assert!(
        !stale_logs
            .lines()
            .any(|l| l.contains("job finished") && l.contains(&job_id)),
        "the stale owner logged the job's end\n{stale_logs}"
    );
    // The new owner stamped the record with its epoch before it acted:
    // the store itself refuses the stale owner's writes from then on.
    assert!(
        end.job.owner_epoch >= second.value.epoch,
        "record stamped at epoch {} after the takeover at {}",
        end.job.owner_epoch,
        second.value.epoch
    );
    assert_finished_once(&stack, &end, &job_id);
}
