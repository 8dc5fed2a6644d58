//! A best is confirmed elsewhere (issue 31, acceptance 2 and the cost of
//! confirming), on a real `mtswarm up`: before a figure is a job's best
//! the leader has it measured again on another worker's slice of the same
//! kind. A worker whose slice reports ten times the truth does not get its
//! figure as the job's best, and the outcome says the confirmation failed;
//! an honest best is confirmed, and the outcome says where and how long
//! it took.

use mtswarm_bus::v1;
use mtswarm_hw::ChipSpec;
use mtswarm_tests::jobs::submit;

use crate::secure_up::{SecureUp, approve_until_finished, submit_vecadd};

/// Two simulated boards of the same kind (one 8-core slice each); the
/// liar's chip claims ten times the clock and the memory bandwidth, so its
/// slice reports every figure ten times faster than the truth.
fn lying_fleet() -> String {
    let spec = ChipSpec::default();
    let board = |id: &str, factor: f64| {
        format!(
            "[[board]]\nid = \"{id}\"\nbackend = \"simulated\"\nslicing = \"whole\"\nrun_ms = 2\nnoise = 0.0\nspec = {{ clusters = 1, cores_per_cluster = 8, clock_hz = {:e}, ddr_bandwidth = {:e} }}\n",
            spec.clock_hz * factor,
            spec.ddr_bandwidth * factor,
        )
    };
    format!("{}\n{}", board("honest", 1.0), board("liar", 10.0))
}

/// Acceptance 2: the liar's figure (10x the truth) is the fastest of the
/// job, the honest worker measures it again, the figures disagree; no
/// figure the honest worker cannot reproduce becomes the best, both are
/// flagged, nothing is quarantined, and the outcome says the confirmation
/// failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_lying_about_its_own_measurement_does_not_get_the_best() {
    let stack = SecureUp::start_with_fleet(&lying_fleet());
    let mut admin = stack.control(stack.token("admin")).await;
    let job_id = submit(
        &mut admin,
        v1::JobSpec {
            goal: "Tune the vecadd kernel.".into(),
            kernel_dir: "vecadd".into(),
            num_agents: 2,
            auto_approve: true,
            ..Default::default()
        },
    )
    .await;
    let record = approve_until_finished(&stack, &job_id).await;
    let outcome = record.outcome.clone().expect("an outcome");
    let first = outcome
        .confirmations
        .first()
        .cloned()
        .expect("the best was put to confirmation");
    assert_eq!(
        first.state(),
        v1::ConfirmationState::Disagreed,
        "{outcome:#?}"
    );
    assert_eq!(first.original_worker_id, "worker-liar", "{first:?}");
    assert_eq!(first.worker_id, "worker-honest", "{first:?}");
    let ratio = first.median_seconds / first.original_median_seconds;
    assert!(
        (5.0..20.0).contains(&ratio),
        "the honest slice should measure about 10x longer: {first:?}"
    );
    // No figure of the liar is the job's best.
    if let Some(best) = &outcome.best {
        assert_ne!(best.slice_id, first.original_slice_id, "{best:?}");
        assert!(best.gflops < first.original_gflops / 5.0, "{best:?}");
    } else {
        assert_eq!(record.state(), v1::JobState::Failed, "{record:?}");
        assert!(
            outcome.failure_reason.contains("confirmation failed"),
            "{}",
            outcome.failure_reason
        );
        assert!(record.error.contains("confirmation failed"), "{record:?}");
    }
    // Flagged and reported, never quarantined automatically.
    let log = stack.leader_log();
    assert!(
        log.contains("measurements disagree: both figures flagged"),
        "{log}"
    );
    let fleet = admin
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .expect("fleet")
        .into_inner();
    assert!(
        fleet
            .slices
            .iter()
            .all(|s| s.state() != v1::SliceState::Quarantined),
        "{fleet:?}"
    );
    stack.stop();
}

/// The cost of confirming: on the default stack (two emulated boards) a
/// vecadd job's best is measured again on the other board, agrees, and
/// the outcome names where; the seconds it took are printed (run with
/// `--nocapture` to read them).
#[tokio::test(flavor = "multi_thread")]
async fn an_honest_best_is_confirmed_on_another_worker_and_the_cost_is_reported() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let mut seconds = Vec::new();
    for _ in 0..2 {
        let job_id = submit_vecadd(&mut admin).await;
        let record = approve_until_finished(&stack, &job_id).await;
        assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
        let best = record
            .outcome
            .as_ref()
            .and_then(|o| o.best.clone())
            .expect("a best");
        let confirmation = best.confirmation.clone().expect("confirmed");
        assert_eq!(
            confirmation.state(),
            v1::ConfirmationState::Confirmed,
            "{confirmation:?}"
        );
        assert_ne!(confirmation.worker_id, confirmation.original_worker_id);
        assert_eq!(
            best.record_ids.first(),
            Some(&confirmation.original_record_id)
        );
        assert!(
            confirmation.reason.contains("reproduced on slice"),
            "{confirmation:?}"
        );
        let wall = record
            .finished_at
            .zip(record.started_at)
            .map(|(end, start)| (end.seconds - start.seconds) as f64)
            .unwrap_or_default();
        println!(
            "confirmation of job {job_id}: {:.2} s of a {wall:.0} s job ({} on {} against {} on {})",
            confirmation.seconds,
            confirmation.median_seconds,
            confirmation.slice_id,
            confirmation.original_median_seconds,
            confirmation.original_slice_id
        );
        seconds.push(confirmation.seconds);
    }
    let mean = seconds.iter().sum::<f64>() / seconds.len() as f64;
    println!(
        "confirmation cost: {mean:.2} s per job (mean of {})",
        seconds.len()
    );
    stack.stop();
}
