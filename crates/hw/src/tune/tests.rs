//! Tests of reading a tuning space and checking configurations against it.

use super::*;

const SPACE: &str = r#"
kernel = "k"
tolerance = 1e-9
baseline = { VARIANT = "naive" }
constraints = ["A * B * 8 <= am_bytes", "VARIANT == \"fast\" || A == 1"]
[sizes]
N = 64
[[param]]
name = "A"
values = [1, 2, 4]
default = 2
[[param]]
name = "B"
range = { min = 1, max = 3 }
default = 1
[[param]]
name = "VARIANT"
values = ["fast"]
default = "fast"
"#;

#[test]
fn enumerates_only_configurations_inside_the_constraints() {
    let space = TuneSpace::from_toml_str(SPACE).expect("parses");
    let mut spec = ChipSpec::default();
    assert_eq!(space.cartesian_size(), 9);
    assert_eq!(space.configurations(&spec).expect("ok").len(), 9);
    spec.am_bytes = 8 * 4; // A * B <= 4
    let configs = space.configurations(&spec).expect("ok");
    assert_eq!(configs.len(), 6, "{configs:?}");
    let bad: Config = [
        ("A".to_owned(), ParamValue::Int(4)),
        ("B".into(), ParamValue::Int(3)),
    ]
    .into_iter()
    .collect();
    assert!(matches!(
        space.check(&bad, &spec),
        Err(TuneError::Violated { constraint }) if constraint.contains("am_bytes")
    ));
}

#[test]
fn defines_include_sizes_tolerance_and_baseline() {
    let space = TuneSpace::from_toml_str(SPACE).expect("parses");
    let d = space.defines(&space.baseline_config());
    assert_eq!(d.get("N").map(String::as_str), Some("64"));
    assert_eq!(d.get("VARIANT").map(String::as_str), Some("naive"));
    assert_eq!(d.get("A").map(String::as_str), Some("2"));
    assert!(d.contains_key("TOLERANCE"));
}

#[test]
fn the_model_table_gives_flops_and_bytes_per_build() {
    let text = format!("{SPACE}[model]\nflops = \"2 * N * A\"\nbytes = \"8 * N * (1 + B)\"\n");
    let space = TuneSpace::from_toml_str(&text).expect("parses");
    let spec = ChipSpec::default();
    let defines: BTreeMap<String, String> = [("A", "4"), ("B", "3"), ("N", "10")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let figures = space.model_figures(&defines, &spec).expect("evaluates");
    assert_eq!(figures, Some((80.0, 320.0)));
    // Without the table there is nothing to evaluate.
    let plain = TuneSpace::from_toml_str(SPACE).expect("parses");
    assert_eq!(plain.model_figures(&defines, &spec).expect("ok"), None);
    let broken = format!("{SPACE}[model]\nflops = \"(N\"\nbytes = \"1\"\n");
    assert!(TuneSpace::from_toml_str(&broken).is_err());
}

#[test]
fn bad_files_get_errors_that_name_the_problem() {
    let cases = [
        (
            "kernel = \"k\"\n[[param]]\nname = \"A\"\nvalues = [1]\ndefault = 2\n",
            "default 2",
        ),
        (
            "kernel = \"k\"\n[[param]]\nname = \"1A\"\nvalues = [1]\ndefault = 1\n",
            "C identifier",
        ),
        (
            "kernel = \"k\"\n[[param]]\nname = \"A\"\ndefault = 1\n",
            "exactly one",
        ),
        (
            "kernel = \"k\"\nconstraints = [\"(A <= 1\"]\n",
            "constraint",
        ),
        ("kernel = \"k\"\nbogus = 1\n", "bogus"),
    ];
    for (text, needle) in cases {
        let err = TuneSpace::from_toml_str(text).expect_err(text).to_string();
        assert!(err.contains(needle), "{err} should mention {needle}");
    }
}

#[test]
fn defines_are_checked_by_name_value_and_constraint() {
    let space = TuneSpace::from_toml_str(SPACE).expect("parses");
    let mut spec = ChipSpec::default();
    let defines = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ok = defines(&[("A", "4"), ("B", "3"), ("N", "128"), ("TOLERANCE", "1e-6")]);
    assert_eq!(space.check_defines(&ok, &spec), Ok(()));
    assert_eq!(
        space.check_defines(&defines(&[("VARIANT", "naive"), ("A", "1")]), &spec),
        Ok(()),
        "the baseline override is allowed"
    );
    let refusal = |pairs: &[(&str, &str)], spec: &ChipSpec, why: &str| {
        space
            .check_defines(&defines(pairs), spec)
            .expect_err(why)
            .to_string()
    };
    let typo = refusal(&[("AA", "4")], &spec, "unknown name");
    assert!(
        typo.contains("AA") && typo.contains("known: A, B, VARIANT, N, TOLERANCE"),
        "{typo}"
    );
    let value = refusal(&[("A", "3")], &spec, "not a value");
    assert!(
        value.contains("A=3") && value.contains("1, 2, 4"),
        "{value}"
    );
    spec.am_bytes = 8 * 4;
    let constraint = refusal(&[("A", "4"), ("B", "3")], &spec, "violates");
    assert!(constraint.contains("A * B * 8 <= am_bytes"), "{constraint}");
}

#[test]
fn an_expression_too_long_or_too_deep_is_refused_before_it_is_parsed() {
    let base = "kernel = \"k\"\n[[param]]\nname = \"A\"\nvalues = [1]\ndefault = 1\n";
    let deep = format!("{}A{} == 1", "(".repeat(40), ")".repeat(40));
    let long = format!("{} == 1", vec!["A"; 400].join(" + "));
    let crash = format!("A * {} A <= 1", "{ VARI ".repeat(1000));
    for (expression, needle) in [
        (deep, "nest deeper"),
        (long, "characters long"),
        (crash, "characters long"),
    ] {
        let text = format!("constraints = [\"{expression}\"]\n{base}");
        let err = TuneSpace::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
        assert!(err.len() < 300, "{err}");
    }
    // At the bounds, the evaluator's own recursion stays within a test
    // thread's stack.
    let nested = format!("{}A{} == 1", "(".repeat(16), ")".repeat(16));
    let chain = format!("{} == 1", vec!["A"; 120].join(" * "));
    for expression in [nested, chain] {
        let text = format!("constraints = [\"{expression}\"]\n{base}");
        let space = TuneSpace::from_toml_str(&text).expect("within the bounds");
        space
            .configurations(&ChipSpec::default())
            .expect("evaluates");
    }
}

#[test]
fn a_parse_error_quotes_a_huge_line_in_part() {
    let text = format!("kernel = \"k\"\ntolerance = 1{}\n", "g".repeat(20_000));
    let err = TuneSpace::from_toml_str(&text).unwrap_err().to_string();
    assert!(err.len() < 1_000, "{} bytes", err.len());
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn an_error_quotes_huge_names_and_values_in_part() {
    let space = TuneSpace::from_toml_str(SPACE).expect("space");
    let huge = "M(ju".repeat(3_000);
    let defines = BTreeMap::from([(huge.clone(), "2 ".repeat(5_000))]);
    let err = space
        .check_defines(&defines, &ChipSpec::default())
        .unwrap_err()
        .to_string();
    assert!(err.len() < 2_100, "{} bytes", err.len());
    assert!(err.contains("M(ju"), "{err}");
}
