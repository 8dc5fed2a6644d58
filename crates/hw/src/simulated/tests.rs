use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::*;
use crate::fleet::Fleet;

const TUNE: &str = "kernel = \"sim\"\n[model]\nflops = \"2 * N * N * N\"\nbytes = \"8 * N * N * B\"\n[sizes]\nN = 256\n[[param]]\nname = \"B\"\nvalues = [1, 2, 4, 8]\ndefault = 1\n";

fn kernel_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("kernel");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kernel.c"), "void kernel(void) {}\n").unwrap();
    std::fs::write(dir.join("host.c"), "int main(void) { return 0; }\n").unwrap();
    std::fs::write(dir.join("tune.toml"), TUNE).unwrap();
    dir
}

fn board(cores: u32, settings: SimulatedSettings) -> SimulatedBoard {
    let slice = Slice {
        board: "sim0".into(),
        cluster: Some(0),
        cores,
        backend: BackendKind::Simulated,
    };
    SimulatedBoard::new(slice, ChipSpec::default(), settings).unwrap()
}

fn defines(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn request(cores: u32, runs: u32) -> RunRequest {
    RunRequest {
        cores,
        runs,
        timeout: Duration::from_secs(60),
        args: Vec::new(),
        seed: None,
    }
}

async fn build(board: &SimulatedBoard, dir: &Path, defines: BTreeMap<String, String>) -> Artifact {
    board
        .build(&BuildRequest {
            kernel_dir: dir.to_path_buf(),
            defines,
            out_dir: dir.parent().unwrap().join("out"),
        })
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_same_configuration_measures_the_same_within_noise() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = kernel_dir(tmp.path());
    let settings = SimulatedSettings {
        run_ms: (1, 1),
        incorrect_fraction: 0.0,
        noise: 0.01,
    };
    let config = defines(&[("N", "256".into()), ("B", "4".into())]);
    let first = board(4, settings);
    let artifact = build(&first, &dir, config.clone()).await;
    assert_eq!(artifact.backend, BackendKind::Simulated);
    assert_eq!(
        artifact.kernel_hash,
        kernel_hash(&dir, &config).unwrap(),
        "the artifact is named like the other backends' builds"
    );
    assert!(artifact.model.is_some(), "tune.toml [model] is evaluated");
    let expected = modeled_gflops(
        &ChipSpec::default(),
        &source_seed(&dir).unwrap(),
        &config,
        artifact.model,
        4,
    );
    let second = board(4, settings);
    for board in [&first, &second] {
        for _ in 0..3 {
            let outcome = board.run(&artifact, &request(4, 5)).await.unwrap();
            assert!(outcome.valid, "{outcome:?}");
            assert_eq!(outcome.samples.len(), 5);
            let relative = (outcome.gflops - expected).abs() / expected;
            assert!(
                relative <= 0.011,
                "{} GFLOPS vs the model's {expected}",
                outcome.gflops
            );
        }
    }
    let other = defines(&[("N", "256".into()), ("B", "1".into())]);
    assert_ne!(
        efficiency("seed", &config, 4),
        efficiency("seed", &other, 4),
        "the defines move the figure"
    );
    assert_ne!(
        efficiency("seed", &config, 4),
        efficiency("another kernel", &config, 4),
        "the kernel's sources seed the model"
    );
    assert!(efficiency("seed", &config, 1) > efficiency("seed", &config, 16));
}

#[test]
fn the_incorrect_share_follows_the_setting() {
    for fraction in [0.0, 0.1, 0.5] {
        let total = 4000;
        let wrong = (0..total)
            .filter(|i| is_incorrect(&defines(&[("X", i.to_string())]), fraction))
            .count();
        let share = wrong as f64 / total as f64;
        assert!(
            (share - fraction).abs() <= 0.02,
            "{share} of the configurations wrong at incorrect_fraction = {fraction}"
        );
    }
    let config = defines(&[("X", "7".into())]);
    assert_eq!(is_incorrect(&config, 0.3), is_incorrect(&config, 0.3));
    assert!(is_incorrect(&config, 1.0));
}

#[tokio::test(start_paused = true)]
async fn wrong_answers_read_like_a_failed_reference_check() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = kernel_dir(tmp.path());
    let board = board(
        1,
        SimulatedSettings {
            incorrect_fraction: 1.0,
            ..SimulatedSettings::default()
        },
    );
    let artifact = build(&board, &dir, defines(&[("B", "2".into())])).await;
    let outcome = board.run(&artifact, &request(1, 2)).await.unwrap();
    assert!(!outcome.valid);
    let error = outcome.error.unwrap_or_default();
    assert!(error.contains("differs from the reference"), "{error}");
    assert!(outcome.samples.iter().all(|s| !s.valid));
}

#[tokio::test(start_paused = true)]
async fn no_figure_is_ever_flagged_implausible() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = kernel_dir(tmp.path());
    let spec = ChipSpec::default();
    let settings = SimulatedSettings {
        run_ms: (0, 0),
        incorrect_fraction: 0.0,
        noise: 0.1,
    };
    let board = board(spec.cores_per_cluster, settings);
    for n in [16, 256, 2048] {
        for b in 1..=16 {
            let config = defines(&[("N", n.to_string()), ("B", b.to_string())]);
            let artifact = build(&board, &dir, config).await;
            for cores in [1, 2, 8, spec.cores_per_cluster] {
                let outcome = board.run(&artifact, &request(cores, 4)).await.unwrap();
                assert!(
                    outcome.flags.is_empty() && outcome.valid,
                    "N={n} B={b} on {cores} cores: {outcome:?}"
                );
                assert!(outcome.peak_fraction > 0.0 && outcome.peak_fraction < 1.0);
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_takes_its_run_time_on_the_clock_and_none_of_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = kernel_dir(tmp.path());
    let fixed = board(
        1,
        SimulatedSettings {
            run_ms: (100, 100),
            ..SimulatedSettings::default()
        },
    );
    let artifact = build(&fixed, &dir, BTreeMap::new()).await;
    let start = tokio::time::Instant::now();
    let outcome = fixed.run(&artifact, &request(1, 3)).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert!((outcome.wall_seconds - 0.3).abs() < 1e-9);

    let ranged = board(
        1,
        SimulatedSettings {
            run_ms: (5, 20),
            ..SimulatedSettings::default()
        },
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..50 {
        let start = tokio::time::Instant::now();
        ranged.run(&artifact, &request(1, 1)).await.unwrap();
        let ms = start.elapsed().as_millis();
        assert!((5..=20).contains(&ms), "{ms} ms outside run_ms = [5, 20]");
        seen.insert(ms);
    }
    assert!(
        seen.len() > 5,
        "run times are drawn from the range: {seen:?}"
    );

    let mut short = request(1, 3);
    short.timeout = Duration::from_millis(250);
    let start = tokio::time::Instant::now();
    let error = fixed.run(&artifact, &short).await.unwrap_err();
    assert!(matches!(error, HwError::Timeout(_)), "{error}");
    assert_eq!(start.elapsed(), Duration::from_millis(250));
}

#[test]
fn fleet_settings_have_defaults_and_clear_errors() {
    let base = "[[board]]\nid = \"sim0\"\nbackend = \"simulated\"\nslicing = \"per-cluster\"\nspec = { clusters = 64, cores_per_cluster = 1 }\n";
    let fleet = Fleet::from_toml_str(base, Path::new(".")).unwrap();
    assert_eq!(fleet.slices().len(), 64);
    assert_eq!(
        fleet.boards[0].simulated,
        Some(SimulatedSettings::default())
    );
    let tuned = format!("{base}run_ms = 7\nincorrect_fraction = 0.25\nnoise = 0\n");
    let fleet = Fleet::from_toml_str(&tuned, Path::new(".")).unwrap();
    assert_eq!(
        fleet.boards[0].simulated,
        Some(SimulatedSettings {
            run_ms: (7, 7),
            incorrect_fraction: 0.25,
            noise: 0.0
        })
    );
    let slice = &fleet.slices()[3];
    let opened = fleet.open(slice, &crate::SdkConfig::default()).unwrap();
    assert_eq!(opened.backend(), BackendKind::Simulated);

    let refused = [
        (format!("{base}run_ms = [20, 5]\n"), "low end exceeds"),
        (format!("{base}run_ms = [1, 2, 3]\n"), "exactly two ends"),
        (format!("{base}run_ms = \"fast\"\n"), "run_ms"),
        (
            format!("{base}incorrect_fraction = 1.5\n"),
            "incorrect_fraction = 1.5",
        ),
        (format!("{base}noise = 0.5\n"), "noise = 0.5"),
        (
            "[[board]]\nid = \"emu0\"\nbackend = \"emulator\"\nrun_ms = 5\n".to_owned(),
            "only supported on simulated boards",
        ),
    ];
    for (text, expected) in refused {
        let error = Fleet::from_toml_str(&text, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{text}: {error}");
        assert!(
            error.contains("board `"),
            "the error names the board: {error}"
        );
    }
}
