//! Scenario 4: the NATS server is stopped mid-job and started again on the
//! same port with the same store. The leader, the workers and their
//! sessions reconnect by themselves and the job completes: with leases long
//! enough to outlive the outage (nothing moves), and with 2 s leases that
//! lapse during it (every agent of the job loses its slice at once and must
//! be placed again).

use std::time::Duration;

use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{Started, assert_workers_alive, ms, one_at_a_time, outcome, start_mid_job};

/// How long the server stays down (the fault being injected).
const OUTAGE: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_completes_across_a_nats_restart() {
    restart_mid_job("nats_restart", 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_completes_when_every_lease_lapses_during_a_nats_restart() {
    restart_mid_job("nats_restart_lapsed", 2).await;
}

async fn restart_mid_job(scenario: &str, lease_ttl_seconds: u64) {
    let _serial = one_at_a_time().await;
    let mut options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    options.lease_ttl_seconds = lease_ttl_seconds;
    let Started {
        mut stack,
        mut control,
        job_id,
        ..
    } = start_mid_job(options, "Tune vecadd; NATS will restart").await;

    let nats = &mut stack.nats;
    tokio::task::block_in_place(|| nats.stop()).expect("stop nats-server");
    tokio::time::sleep(OUTAGE).await;
    let nats = &mut stack.nats;
    tokio::task::block_in_place(|| nats.restart()).expect("start nats-server again");
    let back_at = tokio::time::Instant::now();

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(120)).await;
    let completed_after = end.finished_at.duration_since(back_at);
    // Every worker is registered again (its heartbeat reconnected).
    let fleet = stack.wait_for_free_slices(2, Duration::from_secs(30)).await;
    end.report(
        scenario,
        &[
            ("lease_ttl_ms", ms(Duration::from_secs(lease_ttl_seconds))),
            ("outage_ms", ms(OUTAGE)),
            ("completed_ms_after_restart", ms(completed_after)),
        ],
    );

    end.assert_nothing_lost(&stack);
    assert_eq!(
        fleet.workers.len(),
        2,
        "both workers re-registered: {fleet:#?}"
    );
    assert_workers_alive(&mut stack);
}
