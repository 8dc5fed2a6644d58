//! Scenario 5: one slice of the fleet crashes on every hardware run, the
//! others are clean. Its worker quarantines it after `--quarantine-after`
//! failures in a row, the leader moves its task to a clean slice and the
//! job completes; `mtswarm fleet` (the CLI, spawned) shows the slice
//! quarantined with its reason, and `mtswarm quarantine lift` returns it to
//! service (`mtswarm fleet` shows it free again).

use std::process::Output;
use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::chaos::{ChaosOptions, ChaosStack};
use mtswarm_tests::cli::{client_command, stdout_of};
use mtswarm_tests::node_bin;
use serde_json::Value;

use crate::support::{Started, ms, one_at_a_time, outcome, start_job, vecadd_job};

const FLAKY: &str = "board0-c0";

/// board0: c0 crashes on every launch, c1 is clean; board1: c0 is clean.
const FLEET: &str = r#"
[[board]]
id = "board0"
backend = "emulator"
slices = [{ cluster = 0, cores = 2, faults = { crash = 1.0, seed = 7 } }, { cluster = 1, cores = 2 }]

[[board]]
id = "board1"
backend = "emulator"
slices = [{ cluster = 0, cores = 2 }]
"#;

async fn mtswarm(leader: &str, args: &[&str]) -> Output {
    let mut command = client_command(&node_bin!(), leader, args);
    tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("cli task")
        .expect("run mtswarm")
}

fn slice_of<'a>(fleet: &'a Value, slice_id: &str) -> &'a Value {
    fleet["slices"]
        .as_array()
        .and_then(|slices| slices.iter().find(|s| s["slice_id"] == slice_id))
        .unwrap_or_else(|| panic!("{slice_id} not in {fleet}"))
}

async fn slice_state(stack: &ChaosStack, slice_id: &str) -> v1::SliceState {
    let mut control = stack.control().await;
    let fleet = control
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .expect("ListFleet")
        .into_inner();
    fleet
        .slices
        .iter()
        .find(|s| s.slice.as_ref().is_some_and(|d| d.slice_id == slice_id))
        .map(v1::FleetSlice::state)
        .unwrap_or(v1::SliceState::Unspecified)
}

async fn wait_state(stack: &ChaosStack, slice_id: &str, state: v1::SliceState, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let now = slice_state(stack, slice_id).await;
        if now == state {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{slice_id} is {now:?}, not {state:?}, after {timeout:?}\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashing_slice_is_quarantined_and_lifted() {
    let _serial = one_at_a_time().await;
    let mut options = ChaosOptions::new(node_bin!(), FLEET.to_string());
    options
        .worker_env
        .push(("MTSWARM_QUARANTINE_AFTER".into(), "2".into()));
    // Two agents: on board0-c0 (flaky) and board0-c1, the first free slices
    // in id order; board1-c0 stays free for the move.
    let spec = vecadd_job("Tune vecadd on a fleet with a bad slice", 2, true);
    let Started {
        stack,
        mut control,
        job_id,
        submitted_at: started,
    } = start_job(options, 3, spec).await;

    wait_state(
        &stack,
        FLAKY,
        v1::SliceState::Quarantined,
        Duration::from_secs(120),
    )
    .await;
    let quarantined_after = started.elapsed();
    let leader = stack.leader_url.clone();
    let fleet_json: Value = serde_json::from_str(&stdout_of(
        &mtswarm(&leader, &["fleet", "--json"]).await,
        "fleet --json",
    ))
    .expect("fleet --json is JSON");
    let flaky = slice_of(&fleet_json, FLAKY);
    assert_eq!(flaky["state"], "quarantined", "{flaky}");
    let reason = flaky["quarantine"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!reason.is_empty(), "a quarantine names its reason: {flaky}");
    assert!(
        flaky["quarantine"]["consecutive_failures"].as_u64() >= Some(2),
        "{flaky}"
    );
    let table = stdout_of(&mtswarm(&leader, &["fleet"]).await, "fleet");
    let row = table
        .lines()
        .find(|l| l.starts_with(FLAKY))
        .unwrap_or_else(|| panic!("no row for {FLAKY}:\n{table}"));
    assert!(row.contains("quarantined"), "{row}");

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;

    let listed: Value = serde_json::from_str(&stdout_of(
        &mtswarm(&leader, &["quarantine", "list", "--json"]).await,
        "quarantine list --json",
    ))
    .expect("quarantine list --json is JSON");
    let lifted: Value = serde_json::from_str(&stdout_of(
        &mtswarm(
            &leader,
            &[
                "quarantine",
                "lift",
                FLAKY,
                "--reason",
                "board reseated",
                "--json",
            ],
        )
        .await,
        "quarantine lift",
    ))
    .expect("quarantine lift --json is JSON");
    let lifted_at = tokio::time::Instant::now();
    wait_state(&stack, FLAKY, v1::SliceState::Free, Duration::from_secs(30)).await;
    let back_in_service = lifted_at.elapsed();
    let fleet_after: Value = serde_json::from_str(&stdout_of(
        &mtswarm(&leader, &["fleet", "--json"]).await,
        "fleet --json",
    ))
    .expect("fleet --json is JSON");
    let again: Value = serde_json::from_str(&stdout_of(
        &mtswarm(&leader, &["quarantine", "lift", FLAKY, "--json"]).await,
        "second quarantine lift",
    ))
    .expect("JSON");
    end.report(
        "flaky_slices",
        &[
            ("quarantined_ms", ms(quarantined_after)),
            ("back_in_service_ms", ms(back_in_service)),
        ],
    );

    end.assert_nothing_lost(&stack);
    let (accepted, counts) = (&end.accepted, &end.counts);
    assert!(
        accepted.iter().all(|r| r.slice_id != FLAKY),
        "no accepted result comes from the quarantined slice: {accepted:#?}"
    );
    assert!(counts.highest_attempt >= 2, "the flaky slice's task moved");
    let entries = listed["quarantined"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        entries
            .iter()
            .any(|q| q["slice_id"] == FLAKY && q["reason"] == reason.as_str()),
        "quarantine list shows {FLAKY}: {listed}"
    );
    assert_eq!(lifted["lifted"], true, "{lifted}");
    assert_eq!(lifted["previous"]["slice_id"], FLAKY, "{lifted}");
    assert_eq!(
        slice_of(&fleet_after, FLAKY)["state"],
        "free",
        "{fleet_after}"
    );
    assert_eq!(again["lifted"], false, "nothing left to lift: {again}");
}
