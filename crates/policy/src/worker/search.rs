//! The search plan of the builtin worker policy: spend the slice's time on
//! the candidates that can win, and never leave the slice idle while the
//! host CPU compiles.
//!
//! 1. **Analyze and rank.** One step asks `board_info` (how the slice
//!    measures: exact timing or not, see step 2) and `analyze_kernel` (the on-chip
//!    footprint of `<kernel_dir>/kernel.c` with the candidate's defines: a
//!    candidate over an AM/SM/GSM capacity or buffer limit is dropped
//!    without being built) and the `estimate` tool (`kernel_dir` +
//!    `defines`: the kernel's `tune.toml` `[model]` gives flops and DDR
//!    bytes, the tool the roofline bound on this slice) for the first
//!    candidate, then, if that gave a bound, for all the others. A kernel
//!    without a model keeps the list order.
//! 2. **Screen.** Candidates are screened with one `validate` each, which
//!    checks the output and already reports a time. On a slice whose timing
//!    is exact (the emulator's modeled cycles) a `benchmark` is as cheap as
//!    that (one validated execution is its figure), so candidates are
//!    screened with a `benchmark` each (call ids `c<index>-screen`): every
//!    screened candidate has its recorded figure at once, and the best is
//!    known the moment it is screened. The first is the best-ranked one;
//!    after that, the one with the highest expected improvement under a
//!    Gaussian process fitted to the screened log-times over the
//!    parameter values (Bayesian optimization; see `surrogate`: each
//!    parameter's length scale is the one the figures make likeliest), its
//!    prediction never below its roofline bound; ties go to the estimate
//!    rank. In the last half of its screenings an agent weighs the
//!    prediction's spread at three tenths: it looks for the best
//!    configuration of the best region found rather than for a better
//!    region. The search screens at most `search_budget` candidates (the
//!    leader splits the job's budget over its tasks); a task without one
//!    screens the default share of its list ([`search_budget`]): the point
//!    is the best of the space from a small part of it.
//! 3. **Prune.** A candidate whose roofline bound exceeds the best screened
//!    time by more than [`PRUNE_MARGIN`] cannot win and is never run.
//! 4. **Finalists.** The fastest screened candidates (`finalists`, default
//!    2) get a full `benchmark`; the answer is the fastest benchmark. With
//!    exact timing there are none: every screening was a benchmark already
//!    (and a benchmark again would make a second record of the candidate).
//! 5. **Compile ahead, in the background.** The host compiler must never
//!    hold the slice up. The step that validates or benchmarks a candidate
//!    also starts background builds (`compile` with `background: true`) of
//!    the next choices given what is known without the current result, so
//!    that `compile_depth` candidates (default [`DEFAULT_COMPILE_DEPTH`])
//!    are built or building beyond the current one (those calls come
//!    first in the step: the engine runs a hardware call alone, so a build
//!    listed after it would start only when it ends), and collects with
//!    `wait_build` the next one in line, the one the next step runs. The
//!    builds span steps: a candidate has had about `compile_depth` hardware
//!    calls' time to build when its turn comes, so a compile slower than one
//!    launch does not leave the slice idle. When `wait_build` reports that
//!    the slice sat idle until a build finished, one more build is kept
//!    going, up to [`MAX_ADAPTIVE_DEPTH`]. The builds ahead are chosen as
//!    a batch: each as if the ones in flight had returned what the model
//!    predicts for them, so they are different guesses rather than
//!    neighbours of one. A candidate built (or building) ahead is taken
//!    first unless the model, refitted to the results since, expects
//!    clearly more of one not built (`FRESH_PICK_SHARE`): then the slice
//!    waits one compile for the fresh choice and the builds stay for
//!    later. Validated artifacts are benchmarked as they are, never
//!    rebuilt.
//! 6. **No turn between launches.** Up to two built candidates (when
//!    another build stays in reserve) and all the finalists run in one
//!    step: the engine hands the slice lock from one call to the next
//!    without a model turn in between.
//!
//! 7. **One search per job** (`shared_search`). Every screening step also
//!    asks `job_observations` for what the job's other agents measured and
//!    are measuring ([`crate::observations`]): the process of step 2 is
//!    fitted to their figures too, their running configurations count at
//!    their predicted time, the job's best is the improvement's reference
//!    and the pruning's, and a configuration another agent took is not
//!    screened again.
//!
//! One evaluation is one hardware call on a candidate (`validate` or
//! `benchmark`); `max_hardware_calls` bounds their total, finalists included.
//! Calls refused because the artifact is gone (after a resume in another
//! process) do not count and the candidate is compiled again.
//!
//! Like the sequential plan, everything is recomputed from the conversation
//! each turn (call ids `c<index>-<tool>[-r<n>]`), so a resumed session
//! continues where it stopped.

mod posterior;
mod replay;
mod surrogate;

use std::collections::BTreeSet;

use crate::budget::search_budget;
use crate::observations::OBSERVATIONS_TOOL;
use mtswarm_core::{Message, ToolCall};
use serde_json::{Value, json};

pub use super::params::DEFAULT_COMPILE_DEPTH;

use super::params::TaskParameters;
use super::{Decision, MAX_RECOMPILES};
use replay::{Known, Phase, State, replay};

/// A candidate is pruned when its roofline bound is above the best screened
/// time times this factor (the bound is a model, not a guarantee).
pub const PRUNE_MARGIN: f64 = 1.1;
/// The depth grows by one, up to this, each time `wait_build` reports that
/// the slice sat idle until the build finished (compiles slower than the
/// launches, e.g. a host CPU shared by many slices).
pub const MAX_ADAPTIVE_DEPTH: u32 = 5;
/// Screening launches per step at most (when their builds are ready and
/// another stays in reserve): consecutive hardware calls of one step follow
/// each other on the slice without a model turn in between.
const HARDWARE_CALLS_PER_STEP: usize = 2;
/// What `wait_build` says when the slice waited for the build.
const SLICE_IDLE: &str = "slice was idle until this build finished";
/// What `board_info` says on a slice with exact timing.
const EXACT_TIMING: &str = "measurement: exact timing";
/// The screening call with exact timing: a `benchmark` with this id tag.
const SCREEN: &str = "screen";
/// Id of the `board_info` call of step 1.
const BOARD_INFO_ID: &str = "board-info";

/// Decide the next move of the search plan: the analysis calls until
/// they are done, then the step around the current hardware action, else
/// the final answer.
pub fn decide(params: &TaskParameters, messages: &[Message]) -> Decision {
    let state = replay(params, messages);
    let calls = analysis_calls(params, &state);
    if !calls.is_empty() {
        return Decision::Calls(calls);
    }
    let limits = Limits::of(params, &state);
    let times = state.screened_by_time();
    let depth = build_depth(params, &state);
    let screening = screening_action(&state, &limits, &times, depth);
    let ask_others = params.shared_search && screening.is_some();
    let action = screening.or_else(|| finalist_action(&state, &limits, &times, depth));
    let Some(mut action) = action else {
        return Decision::Final(final_answer(params, &state));
    };
    let runs_now = state.outcomes[action.current].artifact.is_some();
    let mut calls = current_calls(params, &state, &limits, &mut action);
    if params.compile_ahead {
        calls = with_builds_ahead(params, &state, action, calls, runs_now, depth);
    }
    if ask_others {
        // What the others know by the time this step's results are in:
        // the next choice is made from it (one step behind, as any
        // asynchronous search is).
        calls.insert(0, observations_call(&state));
    }
    Decision::Calls(calls)
}

/// Ask for the job's other agents' results and pending points (see
/// [`crate::observations`]).
fn observations_call(state: &State) -> ToolCall {
    ToolCall {
        id: format!("obs-{}", state.observation_calls),
        name: OBSERVATIONS_TOOL.to_owned(),
        arguments: "{}".to_owned(),
    }
}

/// Step 1 (and 2, with a model): `board_info`, the analysis of every
/// candidate, the estimate of the first and then of the others; empty once
/// all are answered.
fn analysis_calls(params: &TaskParameters, state: &State) -> Vec<ToolCall> {
    let estimate_call = |i: usize| ToolCall {
        id: format!("c{i}-estimate"),
        name: "estimate".to_owned(),
        arguments: json!({
            "kernel_dir": params.kernel_dir,
            "defines": params.candidates[i],
            "cores": params.cores,
        })
        .to_string(),
    };
    let mut calls = Vec::new();
    if !state.board_known {
        calls.push(ToolCall {
            id: BOARD_INFO_ID.to_owned(),
            name: "board_info".to_owned(),
            arguments: "{}".to_owned(),
        });
    }
    if params.analyze && !state.analyzed {
        calls.extend(params.candidates.iter().enumerate().map(|(i, defines)| {
            ToolCall {
                id: format!("c{i}-analyze"),
                name: "analyze_kernel".to_owned(),
                arguments: json!({
                    "path": format!("{}/kernel.c", params.kernel_dir),
                    "defines": defines,
                })
                .to_string(),
            }
        }));
    }
    if params.use_estimate {
        if state.estimates == 0 {
            calls.push(estimate_call(0));
        } else if state.estimates == 1 && state.probe_ok {
            calls.extend((1..params.candidates.len()).map(estimate_call));
        }
    }
    calls
}

/// How many hardware calls the task may make, and how they split between
/// screening and finalists.
struct Limits {
    /// Hardware calls at most: the screenings plus the finalists'
    /// benchmarks.
    budget: u32,
    /// Benchmarks of the fastest screened (none with exact timing).
    finalists: u32,
    /// The screening call: `validate`, or [`SCREEN`] with exact timing.
    screen_tool: &'static str,
    /// Screenings at most.
    screen_slots: u32,
}

impl Limits {
    fn of(params: &TaskParameters, state: &State) -> Self {
        // Candidates screened at most: the task's search budget, else the
        // default share of the list (unless only a hardware-call limit is set).
        let screen_cap = params.search_budget.or_else(|| {
            params
                .max_hardware_calls
                .is_none()
                .then(|| u32::try_from(search_budget(params.candidates.len())).unwrap_or(u32::MAX))
        });
        let budget = params.max_hardware_calls.unwrap_or_else(|| {
            screen_cap
                .unwrap_or(u32::MAX)
                .saturating_add(if state.exact { 0 } else { params.finalists })
        });
        // With exact timing every screened candidate is benchmarked already.
        let finalists = if state.exact {
            0
        } else {
            params.finalists.min(budget).max(1)
        };
        Self {
            budget,
            finalists,
            screen_tool: if state.exact { SCREEN } else { "validate" },
            screen_slots: budget
                .saturating_sub(finalists)
                .min(screen_cap.unwrap_or(u32::MAX)),
        }
    }
}

/// Builds kept going beyond the current candidate: the configured depth,
/// one more per build the slice sat idle for, up to [`MAX_ADAPTIVE_DEPTH`].
fn build_depth(params: &TaskParameters, state: &State) -> usize {
    (params.compile_depth + state.late_builds).min(params.compile_depth.max(MAX_ADAPTIVE_DEPTH))
        as usize
}

/// The current hardware action and the candidates likely to follow it.
struct Action {
    current: usize,
    /// `validate`, [`SCREEN`] or `benchmark`.
    tool: &'static str,
    ahead: Vec<usize>,
}

/// Step 2: the next candidate to screen while screenings are left.
fn screening_action(
    state: &State,
    limits: &Limits,
    times: &[(usize, f64)],
    depth: usize,
) -> Option<Action> {
    let screens_done = state.evaluations - state.benchmarks;
    if screens_done >= limits.screen_slots {
        return None;
    }
    let phase = Phase::of(limits.screen_slots - screens_done, limits.screen_slots);
    let order = state.screening_order(times, phase);
    let (&next, rest) = order.split_first()?;
    // The likeliest next ones: the current candidates do not change the
    // picture (the usual case once a good candidate is known). One more
    // than the depth: a built one may run in this step too.
    let later = (limits.screen_slots - screens_done - 1) as usize;
    Some(Action {
        current: next,
        tool: limits.screen_tool,
        ahead: rest.iter().take((depth + 1).min(later)).copied().collect(),
    })
}

/// Step 4: the next finalist to benchmark: the fastest screened; without
/// any, the best-ranked.
fn finalist_action(
    state: &State,
    limits: &Limits,
    times: &[(usize, f64)],
    depth: usize,
) -> Option<Action> {
    if state.benchmarks >= limits.finalists || state.evaluations >= limits.budget {
        return None;
    }
    let screens_done = state.evaluations - state.benchmarks;
    let mut pool: Vec<usize> = times.iter().map(|t| t.0).collect();
    if pool.is_empty() && screens_done == 0 {
        pool = state
            .ranked()
            .into_iter()
            .filter(|&i| state.usable(i))
            .collect();
    }
    let open = limits.finalists - state.benchmarks;
    let mut open_pool = pool
        .into_iter()
        .take(limits.finalists as usize)
        .filter(|&i| !state.known[i].benchmarked)
        .take(open as usize);
    let next = open_pool.next()?;
    Some(Action {
        current: next,
        tool: "benchmark",
        ahead: open_pool.take(depth).collect(),
    })
}

/// Whether candidate `i` has to be built before it can run.
fn needs_compile(state: &State, i: usize) -> bool {
    state.outcomes[i].artifact.is_none()
        && state.known[i].building.is_none()
        && state.usable(i)
        && state.known[i].lost <= MAX_RECOMPILES
}

/// The calls the current candidate needs now: its launch (with the built
/// ones next in line), the wait for its late build, or its compile.
fn current_calls(
    params: &TaskParameters,
    state: &State,
    limits: &Limits,
    action: &mut Action,
) -> Vec<ToolCall> {
    let current = action.current;
    if state.outcomes[current].artifact.is_some() {
        let mut calls = vec![hardware_call(params, state, current, action.tool)];
        if params.compile_ahead {
            launch_built_ahead(params, state, limits, action, &mut calls);
        }
        calls
    } else if state.known[current].building.is_some() {
        // Its background build is late: the slice waits for it.
        vec![wait_call(state, current)]
    } else if needs_compile(state, current) {
        vec![compile_call(params, state, current, false)]
    } else {
        // Nothing to build it from: the call reports why.
        vec![hardware_call(params, state, current, action.tool)]
    }
}

/// Step 6: built candidates next in line run in the same step as the
/// current one (taken off `action.ahead`): the engine hands the slice lock
/// from one call to the next, without the turn in between.
fn launch_built_ahead(
    params: &TaskParameters,
    state: &State,
    limits: &Limits,
    action: &mut Action,
    calls: &mut Vec<ToolCall>,
) {
    let tool = action.tool;
    let most = if tool == limits.screen_tool {
        HARDWARE_CALLS_PER_STEP
    } else {
        limits.finalists as usize
    };
    let mut planned = 1u32;
    // A screening launch joins only when a build stays in reserve for the
    // next step.
    let reserve = |ahead: &[usize]| {
        tool == "benchmark"
            || ahead
                .iter()
                .skip(1)
                .any(|&i| state.outcomes[i].artifact.is_some() || state.known[i].building.is_some())
    };
    while calls.len() < most
        && state.evaluations + planned < limits.budget
        && let Some(&next) = action.ahead.first()
        && state.outcomes[next].artifact.is_some()
        && reserve(&action.ahead)
    {
        calls.push(hardware_call(params, state, next, tool));
        action.ahead.remove(0);
        planned += 1;
    }
}

/// Step 5: collect the builds next in line while the slice runs (they are
/// the next step's candidates), and keep `depth` builds going; the
/// background builds go first when the step launches.
fn with_builds_ahead(
    params: &TaskParameters,
    state: &State,
    action: Action,
    mut calls: Vec<ToolCall>,
    runs_now: bool,
    depth: usize,
) -> Vec<ToolCall> {
    let Action {
        current,
        tool,
        mut ahead,
    } = action;
    ahead.truncate(depth);
    // As many as this step consumes: a wait the slice does not need yet
    // would only hold the step up.
    let mut waits = if runs_now {
        calls.iter().filter(|c| c.name == tool_name(tool)).count()
    } else {
        0
    };
    let mut seen: BTreeSet<usize> = [current].into();
    // Background builds go first in the step: they return at once, and the
    // engine runs a hardware call alone, so a build listed after a launch
    // would only start when the launch ends.
    let mut builds = Vec::new();
    for i in ahead {
        if !seen.insert(i) {
            continue;
        }
        if state.known[i].building.is_some() {
            if waits > 0 {
                calls.push(wait_call(state, i));
                waits -= 1;
            }
        } else if needs_compile(state, i) {
            builds.push(compile_call(params, state, i, true));
        }
    }
    if runs_now {
        builds.append(&mut calls);
        builds
    } else {
        calls.append(&mut builds);
        calls
    }
}

fn round_suffix(known: &Known) -> String {
    if known.lost > 0 {
        format!("-r{}", known.lost)
    } else {
        String::new()
    }
}

fn compile_call(
    params: &TaskParameters,
    state: &State,
    index: usize,
    background: bool,
) -> ToolCall {
    let compiles = state.known[index].compiles;
    let mut arguments = json!({
        "kernel_dir": params.kernel_dir,
        "defines": params.candidates[index],
    });
    if background {
        arguments["background"] = json!(true);
    }
    ToolCall {
        id: if compiles == 0 {
            format!("c{index}-compile")
        } else {
            format!("c{index}-compile-r{compiles}")
        },
        name: "compile".to_owned(),
        arguments: arguments.to_string(),
    }
}

fn wait_call(state: &State, index: usize) -> ToolCall {
    let artifact = state.known[index].building.clone().unwrap_or_default();
    ToolCall {
        id: format!("c{index}-wait{}", round_suffix(&state.known[index])),
        name: "wait_build".to_owned(),
        arguments: json!({ "artifact": artifact }).to_string(),
    }
}

/// The tool a plan step calls (`screen` is a `benchmark`).
fn tool_name(tool: &str) -> &str {
    if tool == SCREEN { "benchmark" } else { tool }
}

fn hardware_call(params: &TaskParameters, state: &State, index: usize, tool: &str) -> ToolCall {
    let mut call = super::hardware_call(
        params,
        index,
        tool_name(tool),
        state.outcomes[index].artifact.as_deref(),
    );
    if tool == SCREEN {
        call.id = format!("c{index}-{SCREEN}");
    }
    call.id.push_str(&round_suffix(&state.known[index]));
    call
}

fn final_answer(params: &TaskParameters, state: &State) -> String {
    let budget = params.max_hardware_calls;
    let best_screen = state.screened_by_time().first().map(|t| t.1);
    let mut outcomes = state.outcomes.clone();
    for (i, o) in outcomes.iter_mut().enumerate() {
        let k = &state.known[i];
        if o.failure.is_none() && !k.screened && !k.benchmarked {
            o.skipped = Some(if state.pruned(i, best_screen) {
                format!(
                    "pruned: roofline bound {:.4e} s cannot beat the best screened {:.4e} s",
                    o.estimate_seconds.unwrap_or_default(),
                    best_screen.unwrap_or_default()
                )
            } else {
                "not run: evaluation budget spent".to_owned()
            });
        } else if o.failure.is_none() && k.screened && !k.benchmarked {
            o.skipped = Some("screened only: not among the finalists".to_owned());
        }
    }
    let best = outcomes
        .iter()
        .filter(|o| o.median_seconds.is_some())
        .min_by(|a, b| {
            let a = a.median_seconds.unwrap_or(f64::INFINITY);
            let b = b.median_seconds.unwrap_or(f64::INFINITY);
            a.total_cmp(&b)
        })
        .cloned();
    let screened = state.known.iter().filter(|k| k.screened).count();
    let pruned = outcomes
        .iter()
        .filter(|o| {
            o.skipped
                .as_deref()
                .is_some_and(|s| s.starts_with("pruned"))
        })
        .count();
    let budget_text = budget.map(|b| format!(" of {b}")).unwrap_or_default();
    let headline = match &best {
        Some(b) => format!(
            "Searched {} candidates with {} evaluations{budget_text}: screened {screened}, pruned {pruned}, benchmarked {}. Best: {}.",
            outcomes.len(),
            state.evaluations,
            state.benchmarks,
            b.figures_text()
        ),
        None => format!(
            "No candidate of {} produced a valid benchmark figure ({} evaluations{budget_text}).",
            outcomes.len(),
            state.evaluations
        ),
    };
    let body = json!({
        "best": best,
        "candidates": outcomes,
        "strategy": "search",
        "evaluations": state.evaluations,
        "max_hardware_calls": budget.map(Value::from).unwrap_or(Value::Null),
    });
    format!(
        "{headline}\n```json\n{}\n```",
        serde_json::to_string_pretty(&body).unwrap_or_else(|_| "{}".to_owned())
    )
}
