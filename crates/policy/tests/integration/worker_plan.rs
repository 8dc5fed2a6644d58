//! The search plan's decisions, driven turn by turn through
//! `policy::decide` against a simulated slice whose tool results have the
//! real tools' text formats: background builds started and collected in the
//! same steps as the hardware calls, the evaluation budget, roofline pruning, recompiles after a resume,
//! and the choice between the sequential and the search plan.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::{BTreeMap, BTreeSet};

use mtswarm_core::answer::last_json;
use mtswarm_core::{Message, ToolCall};
use mtswarm_policy::worker::search::MAX_ADAPTIVE_DEPTH;
use mtswarm_policy::worker::{Decision, decide, render_task_message};
use serde_json::{Value, json};

/// A simulated slice: per candidate (by `X` define) a time and a bound.
struct World {
    times: BTreeMap<String, f64>,
    bounds: BTreeMap<String, f64>,
    builds: u32,
    /// artifact -> X value
    artifacts: BTreeMap<String, String>,
    /// Background builds not collected yet: artifact -> X value.
    building: BTreeMap<String, String>,
    /// wait_build reports that the slice sat idle for the build.
    late_builds: bool,
    /// Hardware calls per step, for the assertions.
    steps: Vec<Vec<ToolCall>>,
    lose_artifacts_once: bool,
    /// X values whose static footprint overflows AM.
    over_capacity: Vec<String>,
    /// The kernel's tune.toml has no [model].
    no_model: bool,
    /// The slice's timing is exact (the emulator).
    exact: bool,
}

impl World {
    fn new(times: &[(u32, f64, f64)]) -> Self {
        Self {
            times: times.iter().map(|(x, t, _)| (x.to_string(), *t)).collect(),
            bounds: times.iter().map(|(x, _, b)| (x.to_string(), *b)).collect(),
            builds: 0,
            artifacts: BTreeMap::new(),
            building: BTreeMap::new(),
            late_builds: false,
            steps: Vec::new(),
            lose_artifacts_once: false,
            over_capacity: Vec::new(),
            no_model: false,
            exact: false,
        }
    }

    fn answer(&mut self, call: &ToolCall) -> String {
        let args: Value = serde_json::from_str(&call.arguments).expect("json arguments");
        match call.name.as_str() {
            "board_info" if self.exact => "slice board0/c0 (emulator backend, 2 cores)\nmeasurement: exact timing (one validated execution is the figure; spot re-runs check it)".to_owned(),
            "board_info" => "slice board0/c0 (host backend, 2 cores)\nmeasurement: timed (warm-up, repeated timed executions, statistics)".to_owned(),
            "analyze_kernel" => {
                let x = args["defines"]["X"].as_str().expect("X").to_owned();
                let am = if self.over_capacity.contains(&x) {
                    "AM: 2 buffers, 900000 of 786432 bytes OVER CAPACITY"
                } else {
                    "AM: 2 buffers, 4096 of 786432 bytes"
                };
                format!("k/kernel.c: kernels [\"k\"]\nloops: 1 (max nesting 1)\n{am}")
            }
            "estimate" if self.no_model => {
                "error: invalid arguments: k/tune.toml has no [model] table: give flops and bytes"
                    .to_owned()
            }
            "estimate" => {
                let x = args["defines"]["X"].as_str().expect("X").to_owned();
                format!(
                    "compute-bound on 2 cores: bound {:.4e} s = 1.0 GFLOPS (peak 1 GFLOPS)",
                    self.bounds[&x]
                )
            }
            "compile" => {
                self.builds += 1;
                let id = format!("b{}", self.builds);
                let x = args["defines"]["X"].as_str().expect("X").to_owned();
                if args["background"] == json!(true) {
                    self.building.insert(id.clone(), x);
                    return format!(
                        "building k in the background as artifact {id}: call wait_build with artifact {id} before running it"
                    );
                }
                self.artifacts.insert(id.clone(), x);
                format!("compiled k as artifact {id} (kernel abc, gcc)")
            }
            "wait_build" => {
                let id = args["artifact"].as_str().expect("artifact").to_owned();
                match self.building.remove(&id) {
                    Some(x) => {
                        self.artifacts.insert(id.clone(), x);
                        let idle = if self.late_builds {
                            "\nthe slice was idle until this build finished: start builds earlier"
                        } else {
                            ""
                        };
                        format!("compiled k as artifact {id} (kernel abc, gcc){idle}")
                    }
                    None => format!(
                        "error: invalid arguments: unknown artifact `{id}`: no background build of that id (background builds: none)"
                    ),
                }
            }
            "validate" | "benchmark" => {
                let id = args["artifact"].as_str().expect("artifact").to_owned();
                if self.lose_artifacts_once {
                    self.lose_artifacts_once = false;
                    self.artifacts.clear();
                    self.building.clear();
                }
                let Some(x) = self.artifacts.get(&id) else {
                    return format!(
                        "error: invalid arguments: unknown artifact `{id}` (compiled so far: none)"
                    );
                };
                let t = self.times[x];
                if call.name == "validate" {
                    format!(
                        "validation PASSED for artifact {id} on 2 cores (2 executions): valid: {t:.4e} s, 1.00 GFLOPS (1.0% of peak)"
                    )
                } else {
                    format!(
                        "artifact {id} on 2 cores: median {t:.4e} s, trimmed mean {t:.4e} s over 2 runs (min {t:.4e}, max {t:.4e}), 1.00 GFLOPS (1.0% of peak)"
                    )
                }
            }
            other => panic!("unexpected tool {other}"),
        }
    }

    /// Run the policy to its answer.
    fn run(&mut self, params: Value) -> Value {
        let mut history = vec![
            Message::system("sys"),
            Message::user(render_task_message("t1", "k", "", &params)),
        ];
        for _ in 0..500 {
            let calls = match decide(&history) {
                Decision::Final(text) => return last_json(&text).expect("json block"),
                Decision::Call(call) => vec![call],
                Decision::Calls(calls) => calls,
            };
            history.push(Message::assistant("", calls.clone()));
            for call in &calls {
                let reply = self.answer(call);
                history.push(Message::tool(call.id.clone(), reply));
            }
            self.steps.push(calls);
        }
        panic!("the policy did not finish in 500 turns");
    }

    /// Every call of the run, in order.
    fn calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.steps.iter().flatten()
    }

    /// The calls of `tool`, in order.
    fn calls_of<'a>(&'a self, tool: &'a str) -> impl Iterator<Item = &'a ToolCall> {
        self.calls().filter(move |c| c.name == tool)
    }

    fn hardware_calls(&self) -> usize {
        self.calls()
            .filter(|c| c.name == "validate" || c.name == "benchmark")
            .count()
    }
}

/// Candidate `X = x` takes `1 + x` seconds (the list is in speed order),
/// with a bound of 0.5 s.
fn rising_landscape(n: u32) -> Vec<(u32, f64, f64)> {
    (0..n).map(|x| (x, 1.0 + f64::from(x), 0.5)).collect()
}

/// The answer names a best candidate with a median.
fn assert_has_best(answer: &Value) {
    assert!(
        answer["best"]["median_seconds"].as_f64().is_some(),
        "{answer}"
    );
}

/// How many of the answer's candidates were skipped for a reason that
/// satisfies `why`.
fn skipped(answer: &Value, why: impl Fn(&str) -> bool) -> usize {
    answer["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter(|c| c["skipped"].as_str().is_some_and(&why))
        .count()
}

fn candidates(n: u32) -> Vec<Value> {
    (0..n).map(|x| json!({"X": x, "N": 64})).collect()
}

#[test]
fn the_next_builds_run_in_the_background_of_the_hardware_calls() {
    let landscape = rising_landscape(6);
    let mut world = World::new(&landscape);
    let answer = world.run(json!({"candidates": candidates(6)}));
    assert_eq!(answer["strategy"], "search");
    // Step 1 analyzes all and estimates the first, step 2 estimates the
    // others, step 3 compiles the first and starts the next three in the
    // background, then every screening step validates one candidate,
    // collects the next one's build and starts another, so that three
    // builds stay ahead of the slice.
    let names =
        |step: usize| -> Vec<&str> { world.steps[step].iter().map(|c| c.name.as_str()).collect() };
    assert_eq!(
        names(0),
        [
            vec!["board_info"],
            vec!["analyze_kernel"; 6],
            vec!["estimate"]
        ]
        .concat()
    );
    assert_eq!(names(1), vec!["estimate"; 5]);
    assert_eq!(names(2), ["compile", "compile", "compile", "compile"]);
    let background = |call: &ToolCall| call.arguments.contains("\"background\":true");
    assert!(!background(&world.steps[2][0]) && background(&world.steps[2][1]));
    // Three builds are already going: this step only collects the next.
    assert_eq!(names(3), ["validate", "wait_build"]);
    // A new build starts before the launch, not after it.
    assert_eq!(names(4), ["compile", "validate", "wait_build"]);
    let overlapped = world
        .steps
        .iter()
        .filter(|s| {
            s.iter().any(|c| c.name == "validate") && s.iter().any(|c| c.name == "wait_build")
        })
        .count();
    assert!(overlapped >= 4, "{:?}", world.steps);
    // Every compile after the first runs in the background.
    assert!(
        world
            .steps
            .iter()
            .skip(3)
            .flatten()
            .filter(|c| c.name == "compile")
            .all(background),
        "{:?}",
        world.steps
    );
    // No step of the screening leaves the slice waiting for the compiler.
    let compile_only = world
        .steps
        .iter()
        .skip(3)
        .filter(|s| {
            s.iter()
                .all(|c| c.name == "compile" || c.name == "wait_build")
        })
        .count();
    assert_eq!(compile_only, 0, "{:?}", world.steps);
    // Every candidate compiled once: nothing wasted on guesses.
    assert_eq!(world.builds, 6);
    assert_eq!(answer["best"]["defines"]["X"], "0");
}

/// Candidates compiled in the background but not run yet after the
/// `step`-th step: the builds kept ahead of the slice (a candidate the
/// slice waits for while it compiles is not one of them).
fn builds_ahead(world: &World, step: usize) -> usize {
    let calls = || world.steps[..=step].iter().flatten();
    let candidate = |call: &ToolCall| call.id.split('-').next().unwrap_or_default().to_owned();
    let background: BTreeSet<String> = calls()
        .filter(|c| c.name == "compile" && c.arguments.contains("\"background\":true"))
        .map(candidate)
        .collect();
    let run: BTreeSet<String> = calls()
        .filter(|c| c.name == "validate")
        .map(candidate)
        .collect();
    background.difference(&run).count()
}

#[test]
fn builds_the_slice_waits_for_make_the_policy_build_further_ahead() {
    let landscape = rising_landscape(20);
    let mut prompt = World::new(&landscape);
    prompt.run(json!({"candidates": candidates(20)}));
    let mut late = World::new(&landscape);
    late.late_builds = true;
    let answer = late.run(json!({"candidates": candidates(20)}));
    assert_eq!(answer["best"]["defines"]["X"], "0");
    let most = |world: &World| {
        // From the first screening step on (the step before compiles the
        // first candidate itself).
        (3..world.steps.len())
            .map(|step| builds_ahead(world, step))
            .max()
            .unwrap_or(0)
    };
    // Prompt builds: three stay ahead; late ones: more, up to the cap.
    assert_eq!(most(&prompt), 3, "{:?}", prompt.steps);
    assert_eq!(most(&late), MAX_ADAPTIVE_DEPTH as usize, "{:?}", late.steps);
    // Nothing is built twice either way.
    assert_eq!(prompt.builds, 20);
    assert_eq!(late.builds, 20);
    // The finalists share a step: no turn between them on the slice.
    let per_step = |world: &World, tool: &str| -> Vec<usize> {
        world
            .steps
            .iter()
            .map(|s| s.iter().filter(|c| c.name == tool).count())
            .filter(|n| *n > 0)
            .collect()
    };
    assert_eq!(per_step(&late, "benchmark"), [2]);
    assert_eq!(per_step(&prompt, "benchmark"), [2]);
}

#[test]
fn the_budget_bounds_the_hardware_calls_and_the_answer_says_so() {
    let landscape: Vec<(u32, f64, f64)> =
        (0..20).map(|x| (x, 10.0 - f64::from(x % 7), 0.1)).collect();
    let mut world = World::new(&landscape);
    let answer = world.run(json!({"candidates": candidates(20), "max_hardware_calls": 5}));
    assert_eq!(world.hardware_calls(), 5);
    assert_eq!(answer["evaluations"], 5);
    assert_eq!(answer["max_hardware_calls"], 5);
    let benchmarks = world.calls_of("benchmark").count();
    assert_eq!(benchmarks, 2, "the default two finalists");
    assert_has_best(&answer);
    let skipped_for_budget = skipped(&answer, |s| s.contains("budget"));
    assert!(skipped_for_budget >= 15, "{answer}");

    // A budget of one: a single benchmark of the best-ranked candidate.
    let mut world = World::new(&landscape);
    let answer = world.run(json!({"candidates": candidates(20), "max_hardware_calls": 1}));
    assert_eq!(world.hardware_calls(), 1);
    assert_has_best(&answer);
}

#[test]
fn candidates_whose_bound_cannot_beat_the_best_are_never_run() {
    // X=0 is fast; X>=4 have bounds far above its time.
    let landscape: Vec<(u32, f64, f64)> = (0..8)
        .map(|x| {
            if x < 4 {
                (x, 1.0 + f64::from(x), 0.5)
            } else {
                (x, 50.0, 20.0)
            }
        })
        .collect();
    let mut world = World::new(&landscape);
    let answer = world.run(json!({"candidates": candidates(8)}));
    let ran: Vec<String> = world.calls_of("validate").map(|c| c.id.clone()).collect();
    assert_eq!(ran.len(), 4, "{ran:?}");
    let pruned = skipped(&answer, |s| s.starts_with("pruned"));
    assert_eq!(pruned, 4, "{answer}");
    assert_eq!(answer["best"]["defines"]["X"], "0");
}

#[test]
fn candidates_that_overflow_on_chip_memory_are_never_built() {
    let landscape: Vec<(u32, f64, f64)> = (0..5).map(|x| (x, 5.0 - f64::from(x), 0.5)).collect();
    let mut world = World::new(&landscape);
    // The fastest would be X=4, but its footprint does not fit.
    world.over_capacity = vec!["4".to_owned()];
    let answer = world.run(json!({"candidates": candidates(5)}));
    let built: Vec<String> = world.calls_of("compile").map(|c| c.id.clone()).collect();
    assert!(!built.contains(&"c4-compile".to_owned()), "{built:?}");
    assert_eq!(built.len(), 4, "{built:?}");
    assert!(
        answer["candidates"][4]["failure"]
            .as_str()
            .is_some_and(|f| f.contains("OVER CAPACITY")),
        "{answer}"
    );
    assert_eq!(answer["best"]["defines"]["X"], "3");
}

#[test]
fn a_kernel_without_a_model_is_estimated_once_and_keeps_the_list_order() {
    let landscape = rising_landscape(4);
    let mut world = World::new(&landscape);
    world.no_model = true;
    let answer = world.run(json!({"candidates": candidates(4), "max_hardware_calls": 3}));
    let estimates = world.calls_of("estimate").count();
    assert_eq!(estimates, 1);
    let first_validate = world.calls_of("validate").next().expect("a validate");
    assert_eq!(first_validate.id, "c0-validate");
    assert_has_best(&answer);
}

#[test]
fn a_lost_artifact_is_compiled_again_and_does_not_count() {
    let landscape = rising_landscape(4);
    let mut world = World::new(&landscape);
    world.lose_artifacts_once = true;
    let answer = world.run(json!({"candidates": candidates(4), "max_hardware_calls": 4}));
    let ids: Vec<&str> = world.calls().map(|c| c.id.as_str()).collect();
    assert!(ids.iter().any(|id| id.ends_with("-compile-r1")), "{ids:?}");
    assert!(ids.iter().any(|id| id.ends_with("-validate-r1")), "{ids:?}");
    assert_eq!(answer["evaluations"], 4, "{answer}");
    assert_has_best(&answer);
}

#[test]
fn short_lists_keep_the_sequential_plan_and_bad_settings_are_explained() {
    let landscape = rising_landscape(2);
    let mut world = World::new(&landscape);
    let answer = world.run(json!({"candidates": candidates(2)}));
    let tools: Vec<&str> = world.calls().map(|c| c.name.as_str()).collect();
    assert_eq!(tools, ["compile", "validate", "benchmark"].repeat(2));
    assert!(answer.get("strategy").is_none());
    for (params, needle) in [
        (
            json!({"candidates": candidates(3), "max_hardware_calls": 0}),
            "max_hardware_calls",
        ),
        (
            json!({"candidates": candidates(3), "strategy": "greedy"}),
            "strategy",
        ),
        (
            json!({"candidates": candidates(3), "compile_ahead": "yes"}),
            "compile_ahead",
        ),
    ] {
        let history = vec![Message::user(render_task_message("t", "k", "", &params))];
        let Decision::Final(text) = decide(&history) else {
            panic!("expected an error answer for {params}");
        };
        assert!(text.contains(needle), "{text}");
    }
}

#[test]
fn with_exact_timing_screening_is_a_benchmark_and_records_each_candidate_once() {
    let landscape = rising_landscape(8);
    let mut world = World::new(&landscape);
    world.exact = true;
    let answer = world.run(json!({"candidates": candidates(8)}));
    assert_has_best(&answer);
    assert_eq!(answer["best"]["defines"]["X"], "0");
    // No validate at all: each screening is a benchmark with its figure,
    // and no candidate is benchmarked twice (one record per candidate).
    assert_eq!(world.calls_of("validate").count(), 0);
    let benchmarks: Vec<&ToolCall> = world.calls_of("benchmark").collect();
    assert!(!benchmarks.is_empty());
    assert!(
        benchmarks.iter().all(|c| c.id.contains("-screen")),
        "{benchmarks:?}"
    );
    let mut ids: Vec<&str> = benchmarks.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), benchmarks.len(), "{benchmarks:?}");
    // Every screened candidate has its figure in the answer.
    let measured = answer["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter(|c| c["median_seconds"].as_f64().is_some())
        .count();
    assert_eq!(measured, benchmarks.len());
    // A budget of one is one screening benchmark.
    let mut world = World::new(&landscape);
    world.exact = true;
    let answer = world.run(json!({"candidates": candidates(8), "max_hardware_calls": 1}));
    assert_has_best(&answer);
    assert_eq!(world.hardware_calls(), 1);
}
