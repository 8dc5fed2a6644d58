//! Fault injection on the emulator: configured rates make real launches
//! hang (killed by the run timeout), crash (signal death) or give wrong
//! answers (the harness's check fails), deterministically per seed; the
//! `faults` tables of fleet.toml are validated with errors that name the
//! board and the key.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::emulator_support;

use std::path::Path;
use std::time::Duration;

use emulator_support::*;
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::{Artifact, Board, BuildRequest, ChipSpec, Fault, FaultConfig, Fleet, HwError};

/// What a launch looked like from the outside.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Clean,
    Timeout,
    Signal,
    Wrong,
    Other(String),
}

async fn launch(board: &EmulatorBoard, artifact: &Artifact, timeout: Duration) -> Seen {
    let request = mtswarm_hw::RunRequest::new(2, 2, timeout);
    match board.run(artifact, &request).await {
        Err(HwError::Timeout(_)) => Seen::Timeout,
        Err(other) => Seen::Other(other.to_string()),
        Ok(outcome) if outcome.valid => Seen::Clean,
        Ok(outcome) => {
            let error = outcome.error.unwrap_or_default();
            if error.contains("signal") {
                Seen::Signal
            } else if error.contains("exceeds tolerance") {
                Seen::Wrong
            } else {
                Seen::Other(error)
            }
        }
    }
}

fn faulty(faults: FaultConfig) -> EmulatorBoard {
    board(4).with_faults(faults)
}

async fn build(board: &EmulatorBoard, out: &Path) -> Artifact {
    board
        .build(&BuildRequest {
            kernel_dir: kernels_dir().join("vecadd"),
            defines: defines("vecadd", &[("N", "4096")]),
            out_dir: out.to_path_buf(),
        })
        .await
        .expect("vecadd builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_rates_hang_crash_and_corrupt_runs_deterministically() {
    let out = tempfile::tempdir().expect("tempdir");
    let clean = board(4);
    let artifact = build(&clean, out.path()).await;
    let short = Duration::from_secs(2);
    let long = Duration::from_secs(60);

    // No faults configured: clean runs.
    assert_eq!(launch(&clean, &artifact, long).await, Seen::Clean);
    let zero = faulty(FaultConfig::default());
    assert_eq!(zero.faults(), None, "all-zero rates turn injection off");
    assert_eq!(launch(&zero, &artifact, long).await, Seen::Clean);

    // Each fault at rate 1.0 is what it says.
    let hang = faulty(FaultConfig {
        hang: 1.0,
        ..FaultConfig::default()
    });
    let started = std::time::Instant::now();
    assert_eq!(launch(&hang, &artifact, short).await, Seen::Timeout);
    assert!(
        started.elapsed() < short + Duration::from_secs(5),
        "the hung harness was killed at the timeout"
    );
    let crash = faulty(FaultConfig {
        crash: 1.0,
        ..FaultConfig::default()
    });
    assert_eq!(launch(&crash, &artifact, long).await, Seen::Signal);
    let wrong = faulty(FaultConfig {
        wrong: 1.0,
        ..FaultConfig::default()
    });
    assert_eq!(launch(&wrong, &artifact, long).await, Seen::Wrong);
    // The faulty boards still run clean launches of other boards.
    assert_eq!(launch(&clean, &artifact, long).await, Seen::Clean);

    // Mixed rates: the same seed gives the same sequence of real outcomes,
    // and it matches the decisions the configuration predicts.
    let mixed = FaultConfig {
        hang: 0.2,
        crash: 0.3,
        wrong: 0.3,
        seed: 11,
    };
    let slice_id = slice(4).id();
    let predicted: Vec<Seen> = (0..8)
        .map(|n| match mixed.decide(&slice_id, n) {
            None => Seen::Clean,
            Some(Fault::Hang) => Seen::Timeout,
            Some(Fault::Crash) => Seen::Signal,
            Some(Fault::Wrong) => Seen::Wrong,
        })
        .collect();
    assert!(
        predicted.contains(&Seen::Clean) && predicted.iter().any(|s| *s != Seen::Clean),
        "seed 11 gives a mix: {predicted:?}"
    );
    for _ in 0..2 {
        let board = faulty(mixed);
        let mut seen = Vec::new();
        for _ in 0..predicted.len() {
            seen.push(launch(&board, &artifact, short).await);
        }
        assert_eq!(seen, predicted);
    }
    let other_seed: Vec<Option<Fault>> = (0..32)
        .map(|n| FaultConfig { seed: 12, ..mixed }.decide(&slice_id, n))
        .collect();
    let same_seed: Vec<Option<Fault>> = (0..32).map(|n| mixed.decide(&slice_id, n)).collect();
    assert_ne!(other_seed, same_seed, "another seed, another sequence");
}

/// The fleet file `text` is refused with a message naming every one of
/// `needles`.
fn assert_fleet_refused(text: &str, needles: &[&str]) {
    let error = fleet_error(text);
    for needle in needles {
        assert!(error.contains(needle), "{needle}: {error}");
    }
}

fn fleet_error(text: &str) -> String {
    Fleet::from_toml_str(text, Path::new("."))
        .expect_err("invalid fleet")
        .to_string()
}

#[test]
fn fleet_faults_are_parsed_per_board_and_slice() {
    let fleet = Fleet::from_toml_str(
        r#"
[[board]]
id = "flaky"
backend = "emulator"
faults = { hang = 0.2, crash = 0.1, wrong = 0.1, seed = 7 }
slices = [{ cluster = 0, cores = 4 }, { cluster = 1, cores = 4, faults = { crash = 1.0 } }, { cluster = 2, faults = { crash = 0 } }]

[[board]]
id = "steady"
backend = "emulator"
slicing = "per-cluster"
"#,
        Path::new("."),
    )
    .expect("valid fleet");
    let flaky = fleet.board("flaky").expect("flaky");
    assert_eq!(
        flaky.faults_of(&flaky.slices[0]),
        Some(FaultConfig {
            hang: 0.2,
            crash: 0.1,
            wrong: 0.1,
            seed: 7
        })
    );
    assert_eq!(
        flaky.faults_of(&flaky.slices[1]),
        Some(FaultConfig {
            crash: 1.0,
            ..FaultConfig::default()
        })
    );
    assert_eq!(
        flaky.faults_of(&flaky.slices[2]),
        None,
        "a slice can turn faults off"
    );
    let steady = fleet.board("steady").expect("steady");
    assert!(steady.faults.is_empty());
    let opened = fleet
        .open(&flaky.slices[1], &mtswarm_hw::SdkConfig::default())
        .expect("opens");
    assert_eq!(opened.slice(), &flaky.slices[1]);
    let _ = ChipSpec::default();
}

#[test]
fn fleet_fault_mistakes_name_the_board_and_key() {
    assert_fleet_refused(
        "[[board]]\nid = \"b0\"\nbackend = \"emulator\"\nfaults = { crash = 1.5 }\n",
        &["board `b0`", "faults.crash", "0..=1"],
    );

    assert_fleet_refused(
        "[[board]]\nid = \"b1\"\nbackend = \"emulator\"\nslices = [{ cluster = 1, faults = { hnag = 0.1 } }]\n",
        &["board `b1`", "cluster 1", "faults.hnag"],
    );

    assert_fleet_refused(
        "[[board]]\nid = \"b2\"\nbackend = \"emulator\"\nfaults = { seed = -1 }\n",
        &["board `b2`", "faults.seed"],
    );

    assert_fleet_refused(
        "[[board]]\nid = \"b3\"\nbackend = \"emulator\"\nfaults = { wrong = \"often\" }\n",
        &["board `b3`", "faults.wrong"],
    );

    assert_fleet_refused(
        "[[board]]\nid = \"n0\"\nbackend = \"sdk\"\nfaults = { crash = 0.5 }\n",
        &["board `n0`", "emulator"],
    );

    assert_fleet_refused(
        "[[board]]\nid = \"b4\"\nbackend = \"emulator\"\nfaults = 0.5\n",
        &["board `b4`", "table"],
    );
}
