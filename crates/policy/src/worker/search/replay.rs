//! The search plan's view of the conversation: every call of ours paired
//! with its result and replayed into what is known of each candidate
//! ([`State`]), and the choice of the next candidate to screen.

use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};
use std::sync::LazyLock;

use mtswarm_core::{Message, Role, ToolCall};

use super::posterior::Posterior;
use super::surrogate::{Encoding, Surrogate, expected_improvement};
use super::{BOARD_INFO_ID, EXACT_TIMING, PRUNE_MARGIN, SCREEN, SLICE_IDLE};
use crate::observations::{Defines, OBSERVATIONS_TOOL, Observations};
use crate::worker::outcome::{CandidateOutcome, Pattern, artifact_id, capture_f64, first_line};
use crate::worker::params::TaskParameters;
use crate::worker::{MAX_RECOMPILES, artifact_missing};

static BOUND: LazyLock<Pattern> =
    LazyLock::new(|| Pattern::new(r"bound ([0-9.]+(?:[eE][-+]?[0-9]+)?) s"));
static SCREEN_TIME: LazyLock<Pattern> =
    LazyLock::new(|| Pattern::new(r": valid: ([0-9.]+(?:[eE][-+]?[0-9]+)?) s"));

/// Candidates not built yet that are picked as a batch, each given the
/// ones before it (see [`State::screening_order`]): one more than the
/// deepest build pipeline, so every build ahead is a batch pick.
const BATCH_PICKS: usize = super::MAX_ADAPTIVE_DEPTH as usize + 1;

/// A candidate built (or building) ahead is screened before the best one
/// not built yet unless its expected improvement under the freshest fit
/// is below this share of that one's: then the model has learned enough
/// since the build was started that waiting one compile for its current
/// choice is worth more than the build.
pub(super) const FRESH_PICK_SHARE: f64 = 0.7;

/// When an agent has at most this share of its screenings left, the search
/// turns from finding the best region to finding the best configuration in
/// it ([`Phase::Exploit`]): late in a budget, a screening far from what is
/// known rarely pays back before the budget ends, and the fastest
/// configurations of a region are often within a percent of each other
/// (measured over 30 seeds with 8 agents: P(optimum) on pnpoly rose from
/// 0.53 to 0.60 at 2.5 % and from 0.87 to 0.97 at 5 %).
pub(super) const EXPLOIT_SHARE: f64 = 0.5;
/// The share of its predicted spread a candidate's expected improvement
/// counts while exploiting: mostly the mean decides. (A tenth did as well
/// on the smaller budgets and worse at 5 % of pnpoly: 0.93.)
const EXPLOIT_SPREAD: f64 = 0.3;

/// What the expected improvement weighs (see [`EXPLOIT_SHARE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// The predicted spread counts fully: uncertain regions are worth a look.
    Explore,
    /// The predicted mean decides.
    Exploit,
}

impl Phase {
    /// The phase of an agent with `left` of its `screenings` left.
    pub(super) fn of(left: u32, screenings: u32) -> Self {
        if f64::from(left) <= EXPLOIT_SHARE * f64::from(screenings) {
            Self::Exploit
        } else {
            Self::Explore
        }
    }

    fn spread_weight(self) -> f64 {
        match self {
            Self::Explore => 1.0,
            Self::Exploit => EXPLOIT_SPREAD,
        }
    }
}

/// What the conversation says about one candidate.
#[derive(Debug, Clone, Default)]
pub(super) struct Known {
    pub(super) compiles: u32,
    /// Artifact id of a background build not collected yet.
    pub(super) building: Option<String>,
    /// Hardware calls (or waits) that found the artifact gone.
    pub(super) lost: u32,
    pub(super) compile_failed: bool,
    pub(super) screened: bool,
    pub(super) benchmarked: bool,
}

/// The replayed state of the search.
pub(super) struct State {
    pub(super) outcomes: Vec<CandidateOutcome>,
    pub(super) known: Vec<Known>,
    pub(super) analyzed: bool,
    /// Estimate results seen, and whether the first one (the probe) gave a
    /// bound: a kernel without a model is not asked once per candidate.
    pub(super) estimates: usize,
    pub(super) probe_ok: bool,
    pub(super) evaluations: u32,
    pub(super) benchmarks: u32,
    /// Builds the slice sat idle for.
    pub(super) late_builds: u32,
    /// `board_info` answered (whatever it said).
    pub(super) board_known: bool,
    /// The slice's timing is exact: screening is a `benchmark`.
    pub(super) exact: bool,
    /// The latest `job_observations` answer that read (empty without
    /// one: the search is the agent's own).
    pub(super) shared: Observations,
    /// `job_observations` calls made so far.
    pub(super) observation_calls: usize,
    /// Every candidate's parameter values as a point of the surrogate,
    /// then the shared measured points, then the shared running ones.
    pub(super) encoding: Encoding,
}

/// Candidate index and round in a call id: `c<index>-<tool>[-r<n>]`.
fn parse_id(id: &str) -> Option<usize> {
    crate::worker::parse_call_id(id)
}

/// Pair every call of ours with the tool message that answers it (ids may
/// repeat in a long history; the answer is the first one after the call).
pub(super) fn replay(params: &TaskParameters, messages: &[Message]) -> State {
    let mut state = State {
        outcomes: params
            .candidates
            .iter()
            .enumerate()
            .map(|(i, d)| CandidateOutcome::new(i, d.clone()))
            .collect(),
        known: vec![Known::default(); params.candidates.len()],
        analyzed: false,
        estimates: 0,
        probe_ok: false,
        evaluations: 0,
        benchmarks: 0,
        late_builds: 0,
        board_known: false,
        exact: false,
        shared: Observations::default(),
        observation_calls: 0,
        encoding: Encoding::new(&[]),
    };
    let mut pending: HashMap<String, VecDeque<ToolCall>> = HashMap::new();
    // Artifact id -> candidate: ids restart in a new process, so an id seen
    // twice means every earlier build is gone.
    let mut owners: HashMap<String, usize> = HashMap::new();
    for message in messages {
        match message.role {
            Role::Assistant => {
                for call in &message.tool_calls {
                    pending
                        .entry(call.id.clone())
                        .or_default()
                        .push_back(call.clone());
                }
            }
            Role::Tool => {
                let Some(id) = message.tool_call_id.as_deref() else {
                    continue;
                };
                let Some(call) = pending.get_mut(id).and_then(VecDeque::pop_front) else {
                    continue;
                };
                apply(&mut state, &mut owners, &call, &message.content);
            }
            _ => {}
        }
    }
    let points: Vec<&Defines> = params
        .candidates
        .iter()
        .chain(state.shared.measured.iter().map(|(d, _)| d))
        .chain(&state.shared.running)
        .collect();
    state.encoding = Encoding::new(&points);
    state
}

/// Replays one answered call into the state: each tool's answer is read
/// by its own step.
fn apply(state: &mut State, owners: &mut HashMap<String, usize>, call: &ToolCall, content: &str) {
    if call.id == BOARD_INFO_ID {
        state.board_known = true;
        state.exact = content.contains(EXACT_TIMING);
        return;
    }
    if call.name == OBSERVATIONS_TOOL {
        state.observation_calls += 1;
        if let Some(shared) = Observations::parse(content) {
            state.shared = shared;
        }
        return;
    }
    let Some(index) = parse_id(&call.id) else {
        return;
    };
    if index >= state.outcomes.len() {
        return;
    }
    match call.name.as_str() {
        "analyze_kernel" => read_analysis(state, index, content),
        "estimate" => read_estimate(state, index, content),
        "compile" => read_compile(state, owners, index, content),
        "wait_build" => read_wait(state, index, content),
        tool @ ("validate" | "benchmark") => read_evaluation(state, index, call, tool, content),
        _ => {}
    }
}

/// `analyze_kernel`: the static footprint may already show that the build
/// cannot run.
fn read_analysis(state: &mut State, index: usize, content: &str) {
    state.analyzed = true;
    if !content.starts_with("error")
        && let Some(line) = content
            .lines()
            .find(|l| l.contains("OVER CAPACITY") || l.contains("TOO MANY BUFFERS"))
    {
        state.outcomes[index].failure = Some(format!("analysis: {}", line.trim()));
    }
}

/// `estimate`: the candidate's roofline bound; the first one tells whether
/// the kernel has a model at all.
fn read_estimate(state: &mut State, index: usize, content: &str) {
    let outcome = &mut state.outcomes[index];
    outcome.estimate_seconds = if content.starts_with("error") {
        None
    } else {
        capture_f64(&BOUND, content).filter(|s| *s > 0.0)
    };
    if state.estimates == 0 {
        state.probe_ok = outcome.estimate_seconds.is_some();
    }
    state.estimates += 1;
}

/// `compile`: an artifact (built, or building in the background) or a
/// failure. An artifact id seen before means the ids restarted in a new
/// process: every earlier build is gone.
fn read_compile(
    state: &mut State,
    owners: &mut HashMap<String, usize>,
    index: usize,
    content: &str,
) {
    state.known[index].compiles += 1;
    let artifact = artifact_id(content);
    let background = content.starts_with("building") && content.contains("background");
    match artifact {
        Some(a) if content.starts_with("compiled") || background => {
            if owners.contains_key(&a) {
                // Ids restarted: every earlier build is gone.
                owners.clear();
                for o in &mut state.outcomes {
                    o.artifact = None;
                }
                for k in &mut state.known {
                    k.building = None;
                }
            }
            owners.insert(a.clone(), index);
            let outcome = &mut state.outcomes[index];
            outcome.failure = None;
            state.known[index].compile_failed = false;
            if background {
                state.known[index].building = Some(a);
            } else {
                outcome.artifact = Some(a);
            }
        }
        _ => {
            state.outcomes[index].failure = Some(format!("compile: {}", first_line(content)));
            state.known[index].compile_failed = true;
        }
    }
}

/// `wait_build`: the background build's artifact, its loss, or its
/// failure; and whether the slice sat idle for it.
fn read_wait(state: &mut State, index: usize, content: &str) {
    let outcome = &mut state.outcomes[index];
    let known = &mut state.known[index];
    known.building = None;
    if content.contains(SLICE_IDLE) {
        state.late_builds += 1;
    }
    let artifact = artifact_id(content);
    match artifact {
        Some(a) if content.starts_with("compiled") => {
            outcome.artifact = Some(a);
            outcome.failure = None;
        }
        // Gone with the process that built it: compile again.
        _ if artifact_missing(content) => known.lost += 1,
        _ => {
            outcome.failure = Some(format!("compile: {}", first_line(content)));
            known.compile_failed = true;
        }
    }
}

/// `validate` or `benchmark`: one evaluation (a screening or a finalist's
/// benchmark), unless the artifact was gone.
fn read_evaluation(state: &mut State, index: usize, call: &ToolCall, tool: &str, content: &str) {
    let outcome = &mut state.outcomes[index];
    let known = &mut state.known[index];
    if artifact_missing(content) {
        known.lost += 1;
        known.building = None;
        outcome.artifact = None;
        if known.lost > MAX_RECOMPILES {
            outcome.failure = Some(format!(
                "{tool}: artifact lost again: {}",
                first_line(content)
            ));
        }
        return;
    }
    state.evaluations += 1;
    let screen = tool == "benchmark" && call.id.contains(&format!("-{SCREEN}"));
    if screen {
        // Exact timing: the benchmark is the screening, and its figure the
        // candidate's.
        known.screened = true;
        if outcome.read_benchmark(content) {
            outcome.screen_seconds = outcome.median_seconds;
        }
    } else if tool == "validate" {
        known.screened = true;
        if content.contains("validation PASSED") {
            // A passed validation without a parsable time still counts as
            // valid; it ranks last.
            outcome.screen_seconds =
                Some(capture_f64(&SCREEN_TIME, content).unwrap_or(f64::INFINITY));
        } else {
            outcome.failure = Some(format!("validate: {}", first_line(content)));
        }
    } else {
        state.benchmarks += 1;
        known.benchmarked = true;
        outcome.read_benchmark(content);
    }
}

impl State {
    pub(super) fn usable(&self, i: usize) -> bool {
        self.outcomes[i].failure.is_none() && !self.known[i].compile_failed
    }

    /// Candidate indices, best estimate first (no estimate: list order,
    /// after the estimated ones).
    pub(super) fn ranked(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.outcomes.len()).collect();
        order.sort_by(|&a, &b| {
            let ea = self.outcomes[a].estimate_seconds.unwrap_or(f64::INFINITY);
            let eb = self.outcomes[b].estimate_seconds.unwrap_or(f64::INFINITY);
            ea.total_cmp(&eb).then(a.cmp(&b))
        });
        order
    }

    /// Screened valid candidates, fastest first.
    pub(super) fn screened_by_time(&self) -> Vec<(usize, f64)> {
        let mut out: Vec<(usize, f64)> = self
            .outcomes
            .iter()
            .enumerate()
            .filter(|(i, _)| self.known[*i].screened && self.usable(*i))
            .filter_map(|(i, o)| o.screen_seconds.map(|s| (i, s)))
            .collect();
        out.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        out
    }

    pub(super) fn pruned(&self, i: usize, best: Option<f64>) -> bool {
        match (self.outcomes[i].estimate_seconds, best) {
            (Some(bound), Some(best)) => bound > best * PRUNE_MARGIN,
            _ => false,
        }
    }

    /// The candidates to screen next, in order, given the screened times
    /// `times` (fastest first): the first is the next one, the others the
    /// likeliest to follow when its result changes nothing.
    ///
    /// Before anything is screened: the best-ranked (lowest roofline
    /// bound, else list order). After that, by expected improvement over
    /// the best log-time under a Gaussian process ([`Surrogate`]) fitted to
    /// the screened times and the job's other agents' measured ones (the
    /// predicted spread weighed by `phase`), the
    /// configurations they are measuring counted at the time the process
    /// predicts for them (so this agent's pick is not theirs again), its
    /// mean never below the candidate's roofline bound; ties go to the
    /// estimate rank. Candidates built ahead come first, then those still
    /// building: each was the choice a few results ago, its build is paid
    /// for and the slice need not wait for a compile; unless none of them
    /// is worth [`FRESH_PICK_SHARE`] of the best one not built, which then
    /// comes first. The others not built follow as a batch: each picked
    /// as if the ones before it had returned their predicted time.
    ///
    /// Another agent's word never takes a candidate away: pruning compares
    /// with this agent's own best, and a figure or a pending point reported
    /// for one of this agent's own candidates is not used (its own
    /// measurement will be).
    /// A job's agents hold disjoint parts of the space, so no configuration
    /// is screened twice either way.
    pub(super) fn screening_order(&self, times: &[(usize, f64)], phase: Phase) -> Vec<usize> {
        let best = times.iter().map(|t| t.1).find(|t| t.is_finite());
        // The candidates still to screen, in rank order: a candidate's
        // position here is its rank among them and its slot in the posterior.
        let open: Vec<usize> = self
            .ranked()
            .into_iter()
            .filter(|&i| {
                !self.known[i].screened
                    && !self.known[i].benchmarked
                    && self.usable(i)
                    && !self.pruned(i, best)
            })
            .collect();
        let posterior = self.posterior(times, &open);
        let best_log = self.job_best(times).map_or(f64::INFINITY, f64::ln);
        let mut keyed: Vec<Keyed> = open
            .iter()
            .enumerate()
            .map(|(slot, &i)| {
                let readiness = if self.outcomes[i].artifact.is_some() {
                    0
                } else if self.known[i].building.is_some() {
                    1
                } else {
                    2
                };
                let improvement = posterior
                    .as_ref()
                    .map_or(0.0, |p| self.improvement(p, best_log, slot, i, phase));
                (readiness, -improvement, slot, i)
            })
            .collect();
        promote_fresh_pick(&mut keyed);
        keyed.sort_by(by_priority);
        let split = keyed.partition_point(|k| k.0 < 2);
        let mut order: Vec<usize> = keyed[..split].iter().map(|k| k.3).collect();
        let not_built = keyed[split..].to_vec();
        match posterior {
            Some(posterior) => {
                order.extend(self.batch_picks(&order, not_built, posterior, best_log, phase));
            }
            None => order.extend(not_built.into_iter().map(|k| k.3)),
        }
        order
    }

    /// Expected improvement of candidate `i` (tracked in `slot` of
    /// `posterior`) over `best_log`, its predicted log-time never below its
    /// roofline bound, its spread weighed by `phase`.
    fn improvement(
        &self,
        posterior: &Posterior<'_>,
        best_log: f64,
        slot: usize,
        i: usize,
        phase: Phase,
    ) -> f64 {
        let (mut mean, sd) = posterior.predict(slot);
        let sd = sd * phase.spread_weight();
        if let Some(bound) = self.outcomes[i].estimate_seconds.filter(|b| *b > 0.0) {
            mean = mean.max(bound.ln());
        }
        expected_improvement(best_log, mean, sd)
    }

    /// The candidates not built yet (`not_built`), in the order they are to
    /// be built: the ones `in_flight` will be measured first, so each of
    /// the first [`BATCH_PICKS`] is picked as if they and the picks before
    /// it had returned what the process predicts for them ("kriging
    /// believer"). A pick is then a different guess from the ones in
    /// flight, not their neighbour. The rest follow by the last update.
    fn batch_picks<'a>(
        &'a self,
        in_flight: &[usize],
        mut not_built: Vec<Keyed>,
        mut posterior: Posterior<'a>,
        best_log: f64,
        phase: Phase,
    ) -> Vec<usize> {
        let mut picks = Vec::new();
        let mut pending: Vec<usize> = in_flight.to_vec();
        for _ in 0..BATCH_PICKS {
            if !pending.is_empty() {
                let points: Vec<&[f64]> =
                    pending.drain(..).map(|i| self.encoding.point(i)).collect();
                if !posterior.add_pending(&points) {
                    break;
                }
                for k in &mut not_built {
                    k.1 = -self.improvement(&posterior, best_log, k.2, k.3, phase);
                }
            }
            let Some(pick) =
                (0..not_built.len()).min_by(|&a, &b| by_improvement(&not_built[a], &not_built[b]))
            else {
                break;
            };
            let chosen = not_built.remove(pick).3;
            picks.push(chosen);
            pending.push(chosen);
        }
        picks.extend(not_built.into_iter().map(|k| k.3));
        picks
    }

    /// The best time known to the job: this agent's screened `times` and
    /// the other agents' measured ones.
    fn job_best(&self, times: &[(usize, f64)]) -> Option<f64> {
        times
            .iter()
            .map(|t| t.1)
            .chain(self.shared_measured().map(|(_, m)| m.1))
            .filter(|t| t.is_finite() && *t > 0.0)
            .min_by(f64::total_cmp)
    }

    /// The other agents' measured configurations that are not one of this
    /// agent's candidates, with their index among the shared points.
    fn shared_measured(&self) -> impl Iterator<Item = (usize, &(Defines, f64))> {
        let own: std::collections::HashSet<&Defines> =
            self.outcomes.iter().map(|o| &o.defines).collect();
        self.shared
            .measured
            .iter()
            .enumerate()
            .filter(move |(_, m)| !own.contains(&m.0))
    }

    /// The process over this agent's screened `times` and the other
    /// agents' measured times, predicting the `open` candidates, with the
    /// other agents' running configurations added at its own prediction
    /// (the "kriging believer" of batch Bayesian optimization: a pending
    /// point lowers the uncertainty around it without claiming a result).
    /// `None` before anything is measured.
    fn posterior(&self, times: &[(usize, f64)], open: &[usize]) -> Option<Posterior<'_>> {
        let own = self.outcomes.len();
        let measured = self.shared.measured.len();
        let samples: Vec<(&[f64], f64)> = times
            .iter()
            .filter(|t| t.1.is_finite() && t.1 > 0.0)
            .map(|t| (self.encoding.point(t.0), t.1.ln()))
            .chain(
                self.shared_measured()
                    .map(|(j, m)| (self.encoding.point(own + j), m.1.ln())),
            )
            .collect();
        let surrogate = Surrogate::fit(samples)?;
        let points = open.iter().map(|&i| self.encoding.point(i)).collect();
        let mut posterior = Posterior::new(surrogate, points);
        // As with measured figures, another agent's word about one of this
        // agent's own candidates is not used: it could only hold it back.
        let own_candidates: std::collections::HashSet<&Defines> =
            self.outcomes.iter().map(|o| &o.defines).collect();
        let running: Vec<&[f64]> = self
            .shared
            .running
            .iter()
            .enumerate()
            .filter(|(_, defines)| !own_candidates.contains(defines))
            .map(|(k, _)| self.encoding.point(own + measured + k))
            .collect();
        // Should the extended matrix not factor, the measured fit stands.
        posterior.add_pending(&running);
        Some(posterior)
    }
}

/// One candidate to screen: (readiness: built 0, building 1, else 2;
/// minus its expected improvement; its rank among the candidates to
/// screen, which is also its slot in the [`Posterior`]; its index).
type Keyed = (u8, f64, usize, usize);

/// The larger expected improvement first, ties to the estimate rank.
fn by_improvement(a: &Keyed, b: &Keyed) -> Ordering {
    a.1.total_cmp(&b.1).then(a.2.cmp(&b.2))
}

/// The screening order: built, then building, then the rest, each by
/// [`by_improvement`].
fn by_priority(a: &Keyed, b: &Keyed) -> Ordering {
    a.0.cmp(&b.0).then_with(|| by_improvement(a, b))
}

/// Moves the best candidate not built yet ahead of the ones built or
/// building when none of those is worth [`FRESH_PICK_SHARE`] of it (see
/// [`State::screening_order`]).
fn promote_fresh_pick(keyed: &mut [Keyed]) {
    let in_flight = keyed
        .iter()
        .filter(|k| k.0 < 2)
        .map(|k| -k.1)
        .fold(f64::NEG_INFINITY, f64::max);
    if !in_flight.is_finite() {
        // Nothing built ahead: the best one is first anyway.
        return;
    }
    let fresh = keyed
        .iter()
        .enumerate()
        .filter(|(_, k)| k.0 == 2)
        .min_by(|a, b| by_improvement(a.1, b.1));
    if let Some((j, k)) = fresh
        && in_flight < FRESH_PICK_SHARE * -k.1
    {
        keyed[j].0 = 0;
        keyed[j].1 = f64::NEG_INFINITY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (readiness, expected improvement) of candidates 0, 1, ... as
    /// `screening_order` keys them, in rank order.
    fn keyed(candidates: &[(u8, f64)]) -> Vec<Keyed> {
        candidates
            .iter()
            .enumerate()
            .map(|(i, &(readiness, improvement))| (readiness, -improvement, i, i))
            .collect()
    }

    fn first_after_promotion(candidates: &[(u8, f64)]) -> usize {
        let mut keyed = keyed(candidates);
        promote_fresh_pick(&mut keyed);
        keyed.sort_by(by_priority);
        keyed[0].3
    }

    #[test]
    fn the_search_exploits_in_the_last_share_of_its_screenings() {
        assert_eq!(Phase::of(10, 10), Phase::Explore);
        assert_eq!(Phase::of(6, 10), Phase::Explore);
        assert_eq!(Phase::of(5, 10), Phase::Exploit);
        assert_eq!(Phase::of(1, 10), Phase::Exploit);
        assert!(Phase::Exploit.spread_weight() < Phase::Explore.spread_weight());
    }

    #[test]
    fn a_build_ahead_gives_way_only_to_a_fresh_choice_clearly_better() {
        // Built (0) and building (1) candidates worth at least the share of
        // the best one not built keep their turn.
        assert_eq!(first_after_promotion(&[(1, 0.75), (2, 1.0), (0, 0.2)]), 2);
        assert_eq!(first_after_promotion(&[(0, 0.71), (2, 1.0)]), 0);
        // Below it, the fresh choice goes first.
        assert_eq!(first_after_promotion(&[(0, 0.69), (1, 0.5), (2, 1.0)]), 2);
        assert_eq!(first_after_promotion(&[(0, 0.0), (2, 0.3), (2, 0.4)]), 2);
        // With nothing built ahead, or no improvement expected anywhere,
        // the order stands.
        assert_eq!(first_after_promotion(&[(2, 0.5), (2, 1.0)]), 1);
        assert_eq!(first_after_promotion(&[(0, 0.0), (2, 0.0)]), 0);
    }

    #[test]
    fn estimate_and_screen_patterns_read_their_figures() {
        let estimate = "mm on 4 cores: bound 2.000e-4 s = 10.0 GFLOPS (peak 50.0 GFLOPS)";
        assert_eq!(capture_f64(&BOUND, estimate), Some(2.0e-4));
        let screen = "validation PASSED for artifact b1 on 4 cores (1 executions): valid: 1.5e-3 s";
        assert_eq!(capture_f64(&SCREEN_TIME, screen), Some(1.5e-3));
    }
}
