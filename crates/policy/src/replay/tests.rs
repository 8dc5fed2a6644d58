//! A replay runs the leader's plan and the worker's search on a recorded
//! landscape: budgets hold, failures are evaluations that find nothing,
//! seeds are reproducible and differ, and the run's figures add up.

use super::*;
use mtswarm_hw::landscape::Entry;

/// A smooth landscape over `X` (1..=16) and `Y` (1..=8), fastest at
/// (11, 3); the configurations `failing` lists failed.
fn landscape(failing: &[(i64, i64)]) -> Landscape {
    let mut entries = Vec::new();
    for x in 1..=16 {
        for y in 1..=8 {
            let config: Config = [
                ("X".to_owned(), ParamValue::Int(x)),
                ("Y".to_owned(), ParamValue::Int(y)),
            ]
            .into_iter()
            .collect();
            let outcome = if failing.contains(&(x, y)) {
                Outcome::Failed {
                    error: "RuntimeFailedConfig".into(),
                }
            } else {
                let ms =
                    1.0 + ((x - 11) * (x - 11)) as f64 * 0.1 + ((y - 3) * (y - 3)) as f64 * 0.3;
                Outcome::Measured {
                    ms,
                    runs_ms: vec![ms],
                }
            };
            entries.push(Entry { config, outcome });
        }
    }
    Landscape {
        device_name: "test".into(),
        kernel_name: "k".into(),
        keys: vec!["X".into(), "Y".into()],
        values: [
            ("X".to_owned(), (1..=16).map(ParamValue::Int).collect()),
            ("Y".to_owned(), (1..=8).map(ParamValue::Int).collect()),
        ]
        .into_iter()
        .collect(),
        objective: "time".into(),
        entries,
    }
}

fn config(slices: usize, budget: usize, seed: Option<u64>) -> ReplayConfig {
    ReplayConfig {
        slices,
        agents: None,
        budget: Some(budget),
        seed,
        cores: 24,
        shared: true,
    }
}

#[test]
fn the_search_finds_the_optimum_of_a_smooth_landscape_within_its_budget() {
    let landscape = landscape(&[]);
    let optimum = landscape
        .optimum()
        .and_then(|e| e.outcome.seconds())
        .expect("optimum");
    let run = replay(&landscape, &config(2, 40, None), None).expect("replays");
    assert_eq!(run.agents.len(), search_agents(40, 128, 2));
    assert!(run.evaluations() <= 40, "{} evaluations", run.evaluations());
    // Every evaluation ran a build; builds ahead may go unmeasured.
    assert!(
        run.builds >= run.evaluations(),
        "{} builds for {} evaluations",
        run.builds,
        run.evaluations()
    );
    assert_eq!(run.best(), Some(optimum));
    let round = run.rounds_to(optimum, 1.0).expect("reached");
    assert!(round <= run.rounds());
    assert_eq!(run.best_by_round(round), Some(optimum));
    assert!(run.best_by_round(round - 1).is_none_or(|t| t > optimum));
    // No configuration is evaluated twice.
    let mut seen: Vec<usize> = run.agents.iter().flatten().map(|e| e.entry).collect();
    seen.sort_unstable();
    let before = seen.len();
    seen.dedup();
    assert_eq!(seen.len(), before);
}

#[test]
fn a_failed_configuration_costs_an_evaluation_and_finds_nothing() {
    // The leader's order puts some configuration first; fail a band around
    // the optimum too, so the search must go around it.
    let failing: Vec<(i64, i64)> = (1..=16).map(|x| (x, 3)).collect();
    let landscape = landscape(&failing);
    let run = replay(&landscape, &config(1, 64, None), None).expect("replays");
    let failed = run
        .agents
        .iter()
        .flatten()
        .filter(|e| e.seconds.is_none())
        .count();
    let best = run.best().expect("a measured best");
    let optimum = landscape
        .optimum()
        .and_then(|e| e.outcome.seconds())
        .expect("optimum");
    assert_eq!(
        best, optimum,
        "the best measured configuration outside the band"
    );
    for e in run.agents.iter().flatten().filter(|e| e.seconds.is_none()) {
        assert!(matches!(
            landscape.entries[e.entry].outcome,
            Outcome::Failed { .. }
        ));
    }
    assert!(run.evaluations() <= 64);
    // Whether it tried any failing one depends on the search; the count is
    // what the landscape says of the configurations it tried.
    assert_eq!(
        failed,
        run.agents
            .iter()
            .flatten()
            .filter(|e| failing.iter().any(|(x, y)| {
                landscape.entries[e.entry].config["X"] == ParamValue::Int(*x)
                    && landscape.entries[e.entry].config["Y"] == ParamValue::Int(*y)
            }))
            .count()
    );
}

#[test]
fn a_seed_is_reproducible_and_different_seeds_differ() {
    let landscape = landscape(&[]);
    let a = replay(&landscape, &config(1, 20, Some(1)), None).expect("seed 1");
    let again = replay(&landscape, &config(1, 20, Some(1)), None).expect("seed 1 again");
    assert_eq!(a, again);
    let firsts: std::collections::BTreeSet<usize> = (1..=8)
        .map(|seed| {
            replay(&landscape, &config(1, 20, Some(seed)), None)
                .expect("replays")
                .agents[0][0]
                .entry
        })
        .collect();
    assert!(
        firsts.len() > 1,
        "eight seeds, one first candidate: {firsts:?}"
    );
}

#[test]
fn a_roofline_bound_ranks_the_first_candidate() {
    let landscape = landscape(&[]);
    // A bound that is exact: the first screened candidate is the optimum.
    let exact = |defines: &BTreeMap<String, String>| -> Option<f64> {
        let x: f64 = defines.get("X")?.parse().ok()?;
        let y: f64 = defines.get("Y")?.parse().ok()?;
        Some((1.0 + (x - 11.0).powi(2) * 0.1 + (y - 3.0).powi(2) * 0.3) / 1000.0)
    };
    let run = replay(&landscape, &config(1, 10, None), Some(&exact)).expect("replays");
    let optimum = landscape.optimum().and_then(|e| e.outcome.seconds());
    assert_eq!(run.agents[0][0].seconds, optimum);
}

#[test]
fn the_runs_figures_add_up_round_by_round() {
    let e = |entry: usize, seconds: Option<f64>| Evaluation { entry, seconds };
    let run = ReplayRun {
        agents: vec![
            vec![e(0, Some(4.0)), e(1, Some(2.0)), e(2, None)],
            vec![e(3, None), e(4, Some(1.0))],
        ],
        builds: 5,
    };
    assert_eq!(run.evaluations(), 5);
    assert_eq!(run.rounds(), 3);
    assert_eq!(run.evaluations_by_round(1), 2);
    assert_eq!(run.evaluations_by_round(3), 5);
    assert_eq!(run.best_by_round(1), Some(4.0));
    assert_eq!(run.best_by_round(2), Some(1.0));
    assert_eq!(run.rounds_to(1.0, 1.0), Some(2));
    assert_eq!(run.rounds_to(1.0, 0.5), Some(2));
    assert_eq!(run.rounds_to(1.0, 0.25), Some(1));
    assert_eq!(run.rounds_to(0.5, 1.0), None);
    assert_eq!(run.best_after(1), Some(4.0));
    assert_eq!(run.best_after(3), Some(2.0));
    assert_eq!(run.best_after(4), Some(1.0));
}

#[test]
fn a_job_that_asks_for_agents_gets_them_up_to_the_free_slices() {
    let landscape = landscape(&[]);
    let asked = |agents, slices| ReplayConfig {
        agents: Some(agents),
        ..config(slices, 16, None)
    };
    let eight = replay(&landscape, &asked(8, 8), None).expect("replays");
    assert_eq!(eight.agents.len(), 8, "asked for, although 16 feeds fewer");
    assert!(eight.evaluations() <= 16);
    let capped = replay(&landscape, &asked(8, 3), None).expect("replays");
    assert_eq!(capped.agents.len(), 3);
    // A budget smaller than the agents asked for is not overspent: the
    // extra agents get no task.
    let small = ReplayConfig {
        agents: Some(8),
        ..config(8, 3, None)
    };
    let small = replay(&landscape, &small, None).expect("replays");
    assert_eq!(small.evaluations(), 3);
    assert_eq!(small.agents.len(), 3);
}

#[test]
fn an_empty_landscape_is_an_error() {
    let mut empty = landscape(&[]);
    empty.entries.clear();
    assert!(matches!(
        replay(&empty, &config(1, 10, None), None),
        Err(ReplayError::Empty)
    ));
}

#[test]
fn the_median_to_a_figure_counts_the_seeds_that_never_reached_it() {
    // Four of five reached it: the lower median of all five.
    assert_eq!(
        median_evaluations_to(&[Some(40), None, Some(10), Some(30), Some(20)]),
        Some(30)
    );
    // Half of them is not enough.
    assert_eq!(median_evaluations_to(&[Some(5), None]), None);
    assert_eq!(median_evaluations_to(&[Some(5), Some(9), None, None]), None);
    assert_eq!(
        median_evaluations_to(&[Some(5), Some(9), Some(7), None]),
        Some(7)
    );
    assert_eq!(median_evaluations_to(&[]), None);
}
