//! How good the builtin search is, against the exhaustive landscape of the
//! demo's dgemm space (`fixtures/dgemm_sweep.json`: every configuration's
//! modeled time on the emulator, written once by
//! `deploy/sweep_vs_demo.py --sweep-only --save-sweep`; modeled cycles are
//! exact, so the figures are the emulator's, not a model of them).
//!
//! The space is split among agents as the leader splits it
//! (`balanced_partitions`); each agent's search plan is driven turn by turn
//! through `policy::decide` against a slice that answers with the real
//! tools' text formats, the fixture's times and the real roofline bounds.
//! Agents run side by side at the same pace, so the whole system's progress
//! when an agent has made `i` evaluations is about `i` evaluations per
//! agent: the *evaluations to the best* is the agent count times the
//! evaluations its agent took to reach the global best.
//!
//! Compared, at equal evaluations, with random search (five fixed seeds):
//! the best found after the same number of evaluations drawn at random.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;
use std::path::PathBuf;

use mtswarm_core::{Message, ToolCall};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::{TuneSpace, balanced_partitions};
use mtswarm_tools::estimate::roofline;
use mtswarm_worker::policy::{Decision, decide, render_task_message};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};

type Defines = BTreeMap<String, String>;

const CORES: u32 = 24;
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture: configuration -> modeled seconds (valid ones).
fn landscape() -> BTreeMap<Defines, f64> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dgemm_sweep.json");
    let text = std::fs::read_to_string(&path).expect("fixture");
    let value: Value = serde_json::from_str(&text).expect("fixture json");
    value["configurations"]
        .as_array()
        .expect("configurations")
        .iter()
        .filter(|c| c["valid"] == true)
        .map(|c| {
            let defines: Defines = serde_json::from_value(c["defines"].clone()).expect("defines");
            (defines, c["seconds"].as_f64().expect("seconds"))
        })
        .collect()
}

/// The space's configurations as `-D` maps (tuning parameters only), split
/// into `parts` as the leader splits them.
fn partitions(space: &TuneSpace, parts: usize) -> Vec<Vec<Defines>> {
    let spec = ChipSpec::default();
    let configs = space.configurations(&spec).expect("configurations");
    balanced_partitions(&configs, parts)
        .into_iter()
        .map(|part| {
            part.iter()
                .map(|config| {
                    space
                        .defines(config)
                        .into_iter()
                        .filter(|(name, _)| config.contains_key(name))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// One agent's search over `candidates`: the modeled seconds of each
/// evaluation, in order.
fn search(space: &TuneSpace, times: &BTreeMap<Defines, f64>, candidates: &[Defines]) -> Vec<f64> {
    let spec = ChipSpec::default();
    let list: Vec<Value> = candidates.iter().map(|d| json!(d)).collect();
    let mut history = vec![
        Message::system("sys"),
        Message::user(render_task_message(
            "t1",
            "dgemm",
            "",
            &json!({"candidates": list}),
        )),
    ];
    let mut artifacts: BTreeMap<String, Defines> = BTreeMap::new();
    let mut evaluations = Vec::new();
    for _ in 0..1000 {
        let calls: Vec<ToolCall> = match decide(&history) {
            Decision::Final(_) => return evaluations,
            Decision::Call(call) => vec![call],
            Decision::Calls(calls) => calls,
        };
        history.push(Message::assistant("", calls.clone()));
        for call in &calls {
            let args: Value = serde_json::from_str(&call.arguments).expect("json");
            let defines = |a: &Value| -> Defines {
                serde_json::from_value(a["defines"].clone()).expect("defines")
            };
            let reply = match call.name.as_str() {
                "board_info" => "slice board0/c0 (emulator backend, 24 cores)\nmeasurement: exact timing (one validated launch is the figure; spot re-runs check it)".to_owned(),
                "analyze_kernel" => "dgemm/kernel.c: kernels [\"dgemm_kernel\"]".to_owned(),
                "estimate" => {
                    let (flops, bytes) = space
                        .model_figures(&defines(&args), &spec)
                        .expect("model")
                        .expect("a [model]");
                    let bound = roofline(&spec, flops, bytes, CORES, None);
                    format!(
                        "{} on {CORES} cores: bound {:.4e} s = {:.1} GFLOPS",
                        bound.bound_by, bound.bound_seconds, bound.bound_gflops
                    )
                }
                "compile" => {
                    let id = format!("b{}", artifacts.len() + 1);
                    artifacts.insert(id.clone(), defines(&args));
                    if args["background"] == json!(true) {
                        format!("building dgemm in the background as artifact {id}: call wait_build with artifact {id} before running it")
                    } else {
                        format!("compiled dgemm as artifact {id} (kernel abc, gcc)")
                    }
                }
                "wait_build" => {
                    let id = args["artifact"].as_str().expect("artifact");
                    format!("compiled dgemm as artifact {id} (kernel abc, gcc)")
                }
                "validate" | "benchmark" => {
                    let id = args["artifact"].as_str().expect("artifact");
                    let t = times[&artifacts[id]];
                    evaluations.push(t);
                    let g = 2.0 * 512f64.powi(3) / t / 1e9;
                    if call.name == "validate" {
                        format!("validation PASSED for artifact {id} on {CORES} cores (2 executions): valid: {t:.4e} s, {g:.2} GFLOPS (1.0% of peak)")
                    } else {
                        format!("artifact {id} on {CORES} cores: median {t:.4e} s, trimmed mean {t:.4e} s over 2 runs (min {t:.4e}, max {t:.4e}), {g:.2} GFLOPS (1.0% of peak)")
                    }
                }
                other => panic!("unexpected tool {other}"),
            };
            history.push(Message::tool(call.id.clone(), reply));
        }
    }
    panic!("the search did not finish");
}

/// The best time after each count of evaluations of `order`.
fn best_after(order: &[f64], count: usize) -> f64 {
    order
        .iter()
        .take(count)
        .copied()
        .fold(f64::INFINITY, f64::min)
}

struct SystemRun {
    agents: usize,
    /// Evaluations of the whole system, all agents.
    evaluations: usize,
    /// System evaluations when the global best was found (agents times its
    /// agent's evaluations); `None` when it was never found.
    evaluations_to_best: Option<usize>,
    best_seconds: f64,
}

fn system_run(space: &TuneSpace, times: &BTreeMap<Defines, f64>, agents: usize) -> SystemRun {
    let global_best = times.values().copied().fold(f64::INFINITY, f64::min);
    let runs: Vec<Vec<f64>> = partitions(space, agents)
        .iter()
        .map(|part| search(space, times, part))
        .collect();
    let evaluations_to_best = runs.iter().find_map(|r| {
        r.iter()
            .position(|t| *t <= global_best)
            .map(|i| (i + 1) * agents)
    });
    SystemRun {
        agents,
        evaluations: runs.iter().map(Vec::len).sum(),
        evaluations_to_best,
        best_seconds: runs.iter().flatten().copied().fold(f64::INFINITY, f64::min),
    }
}

#[test]
fn the_search_finds_the_exhaustive_best_with_part_of_the_space_and_beats_random_search() {
    let space = TuneSpace::load(&repo().join("examples/kernels/dgemm")).expect("tune.toml");
    let times = landscape();
    let all: Vec<f64> = times.values().copied().collect();
    let global_best = all.iter().copied().fold(f64::INFINITY, f64::min);
    for agents in [1, 2, 4, 8] {
        let run = system_run(&space, &times, agents);
        // Random search with the same evaluations, on five fixed seeds.
        let random: Vec<f64> = SEEDS
            .iter()
            .map(|seed| {
                let mut order = all.clone();
                order.shuffle(&mut StdRng::seed_from_u64(*seed));
                best_after(&order, run.evaluations)
            })
            .collect();
        let random_to_best: Vec<usize> = SEEDS
            .iter()
            .map(|seed| {
                let mut order = all.clone();
                order.shuffle(&mut StdRng::seed_from_u64(*seed));
                order
                    .iter()
                    .position(|t| *t <= global_best)
                    .map_or(0, |i| i + 1)
            })
            .collect();
        eprintln!(
            "SEARCH-QUALITY agents {}: {} of {} evaluated, best {:.1}% of the exhaustive best, found after {:?} system evaluations; random search at {} evaluations: best {:?}% of it, reaches it after {:?}",
            run.agents,
            run.evaluations,
            all.len(),
            global_best / run.best_seconds * 100.0,
            run.evaluations_to_best,
            run.evaluations,
            random
                .iter()
                .map(|r| (global_best / r * 1000.0).round() / 10.0)
                .collect::<Vec<_>>(),
            random_to_best
        );
        assert!(
            run.best_seconds <= global_best / 0.95,
            "{agents} agents: best {} vs exhaustive {global_best}",
            run.best_seconds
        );
        assert!(run.evaluations < all.len(), "{agents} agents evaluated all");
        // At equal evaluations, at least as good as random search on every
        // seed, and strictly better than its mean.
        let mean = random.iter().sum::<f64>() / random.len() as f64;
        assert!(
            random.iter().all(|r| run.best_seconds <= *r) && run.best_seconds < mean,
            "{agents} agents: {} vs random {random:?}",
            run.best_seconds
        );
    }
}
