//! The cache format as Kernel Tuner writes it, round trips, failures in
//! both spellings, an open cache, and malformed files.

use super::*;

/// Kernel Tuner's own test cache (see `tests/fixtures/kernel_tuner/README.md`).
const VECTOR_ADD: &str =
    include_str!("../../tests/fixtures/kernel_tuner/vector_add_rtx_a4000.json");

fn int(i: i64) -> ParamValue {
    ParamValue::Int(i)
}

fn small() -> Landscape {
    let config = |x: i64, v: &str| -> Config {
        [
            ("X".to_owned(), int(x)),
            ("V".to_owned(), ParamValue::Str(v.into())),
        ]
        .into_iter()
        .collect()
    };
    Landscape {
        device_name: "MT-3000 emulator, 24 cores".into(),
        kernel_name: "k".into(),
        keys: vec!["X".into(), "V".into()],
        values: [
            ("X".to_owned(), vec![int(1), int(2)]),
            ("V".to_owned(), vec![ParamValue::Str("a".into())]),
        ]
        .into_iter()
        .collect(),
        objective: "time".into(),
        entries: vec![
            Entry {
                config: config(1, "a"),
                outcome: Outcome::Measured {
                    ms: 2.5,
                    runs_ms: vec![2.5, 2.6],
                },
            },
            Entry {
                config: config(2, "a"),
                outcome: Outcome::Failed {
                    error: "RuntimeFailedConfig".into(),
                },
            },
        ],
    }
}

#[test]
fn kernel_tuners_own_cache_file_reads_with_its_keys_and_times() {
    let landscape = Landscape::from_kernel_tuner_json(VECTOR_ADD).expect("reads");
    assert_eq!(landscape.kernel_name, "vector_add");
    assert_eq!(landscape.device_name, "NVIDIA RTX A4000");
    assert_eq!(landscape.keys, ["block_size_x"]);
    assert_eq!(landscape.values["block_size_x"].len(), 15);
    assert_eq!(landscape.entries.len(), 15);
    assert_eq!(landscape.measured(), 15);
    let first = landscape
        .entries
        .iter()
        .find(|e| e.config["block_size_x"] == int(128))
        .expect("block size 128");
    assert_eq!(first.outcome.seconds(), Some(0.04073600071881499 / 1000.0));
    assert_eq!(landscape.cache_key(&first.config), "128");
    let best = landscape.optimum().expect("an optimum");
    let fastest = landscape
        .entries
        .iter()
        .filter_map(|e| e.outcome.seconds())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(best.outcome.seconds(), Some(fastest));
}

#[test]
fn a_landscape_round_trips_through_the_cache_format() {
    let landscape = small();
    let text = landscape.to_kernel_tuner_json();
    assert!(
        text.ends_with("}\n}"),
        "closed as Kernel Tuner closes a cache"
    );
    let back = Landscape::from_kernel_tuner_json(&text).expect("reads back");
    assert_eq!(back, landscape);
    let value: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(value["cache"]["1,a"]["time"], 2.5);
    assert_eq!(value["cache"]["2,a"]["__error__"], "RuntimeFailedConfig");
}

#[test]
fn the_written_parameters_keep_the_keys_order() {
    // Kernel Tuner refuses a cache whose `tune_params` are in another order
    // than `tune_params_keys` ("the order is wrong").
    let text = small().to_kernel_tuner_json();
    let params = &text[text.find("\"tune_params\": {").expect("tune_params")..];
    let (x, v) = (
        params.find("\"X\"").expect("X"),
        params.find("\"V\"").expect("V"),
    );
    assert!(x < v, "{params}");
}

#[test]
fn failures_read_in_both_spellings_and_a_non_positive_time_is_a_failure() {
    let text = r#"{"tune_params_keys": ["X"], "tune_params": {"X": [1, 2, 3, 4]},
        "cache": {
          "1": {"X": 1, "time": "InvalidConfig"},
          "2": {"X": 2, "time": 1.0, "__error__": "CompilationFailedConfig"},
          "3": {"X": 3, "time": -1.0},
          "4": {"X": 4, "time": 3.0}
        }}"#;
    let landscape = Landscape::from_kernel_tuner_json(text).expect("reads");
    let outcome = |x: i64| {
        landscape
            .entries
            .iter()
            .find(|e| e.config["X"] == int(x))
            .map(|e| e.outcome.clone())
            .expect("entry")
    };
    assert_eq!(
        outcome(1),
        Outcome::Failed {
            error: "InvalidConfig".into()
        }
    );
    assert_eq!(
        outcome(2),
        Outcome::Failed {
            error: "CompilationFailedConfig".into()
        }
    );
    assert!(outcome(3).seconds().is_none());
    assert_eq!(outcome(4).seconds(), Some(0.003));
    assert_eq!(landscape.measured(), 1);
    assert_eq!(landscape.objective, DEFAULT_OBJECTIVE);
}

#[test]
fn a_cache_a_tuner_was_still_appending_to_reads() {
    let closed = small().to_kernel_tuner_json();
    // What Kernel Tuner leaves while it runs: the last three characters
    // cut (it reopens a closed cache so), entries appended with a comma.
    let open = format!("{},", &closed[..closed.len() - 3]);
    let landscape = Landscape::from_kernel_tuner_json(&open).expect("reads");
    assert_eq!(landscape.entries.len(), 2);
}

#[test]
fn another_objective_is_minimized_when_asked() {
    let text = r#"{"tune_params_keys": ["X"], "tune_params": {"X": [1, 2]},
        "cache": {"1": {"X": 1, "time": 1.0, "energy": 9.0},
                  "2": {"X": 2, "time": 2.0, "energy": 4.0}}}"#;
    let landscape = Landscape::from_kernel_tuner_json_with(text, Some("energy")).expect("reads");
    assert_eq!(landscape.optimum().expect("optimum").config["X"], int(2));
}

#[test]
fn malformed_files_are_refused_with_the_field_or_entry_named() {
    let cases = [
        ("[]", "top level"),
        (r#"{"tune_params": {}, "cache": {}}"#, "tune_params_keys"),
        (
            r#"{"tune_params_keys": ["X", "X"], "tune_params": {"X": [1]}, "cache": {}}"#,
            "twice",
        ),
        (
            r#"{"tune_params_keys": ["X"], "tune_params": {}, "cache": {}}"#,
            "tune_params.X",
        ),
        (
            r#"{"tune_params_keys": ["X"], "tune_params": {"X": [{}]}, "cache": {}}"#,
            "tune_params.X",
        ),
        (
            r#"{"tune_params_keys": ["X"], "tune_params": {"X": [1]}}"#,
            "cache",
        ),
        (
            r#"{"tune_params_keys": ["X"], "tune_params": {"X": [1]}, "cache": {"1": {"time": 1.0}}}"#,
            "no value for parameter `X`",
        ),
        (
            r#"{"tune_params_keys": ["X"], "tune_params": {"X": [1]}, "cache": {"1": {"X": 1}}}"#,
            "no `time` figure",
        ),
        (
            r#"{"tune_params_keys": ["X"], "tune_params": {"X": [1]}, "cache": {"1": {"X": 1, "time": 1}, "01": {"X": 1, "time": 2}}}"#,
            "same configuration",
        ),
        ("{\"tune_params_keys\": [", "not a Kernel Tuner cache file"),
    ];
    for (text, expected) in cases {
        let error = Landscape::from_kernel_tuner_json(text).expect_err(text);
        assert!(
            error.to_string().contains(expected),
            "{text}: {error} lacks {expected:?}"
        );
    }
    let many: Vec<String> = (0..=MAX_PARAMETERS).map(|i| format!("\"P{i}\"")).collect();
    let text = format!(
        "{{\"tune_params_keys\": [{}], \"tune_params\": {{}}, \"cache\": {{}}}}",
        many.join(",")
    );
    assert!(matches!(
        Landscape::from_kernel_tuner_json(&text),
        Err(LandscapeError::TooLarge {
            what: "parameters",
            ..
        })
    ));
}
