//! The builtin search replayed against a recorded landscape: what the
//! search would have found on hardware whose every figure is already known.
//!
//! A replay runs the job as the builtin leader plans it ([`search_plans`]:
//! the leader's agent count, its split of the space and of the budget) and
//! each agent's task exactly as a worker runs it: the task message the
//! worker receives, and [`crate::worker::decide`] turn by turn. Only the
//! slice is recorded: each tool call is answered in the real tools' text
//! formats from the [`Landscape`] (a failed configuration fails its
//! screening as on hardware). With a roofline `bound` the `estimate` tool
//! answers as the real one does for a kernel with a `[model]`; without one
//! the plan says `estimate: false`, as for a kernel without a model.
//!
//! The agents run side by side at one evaluation per round each, as slices
//! of equal speed would: [`ReplayRun`] keeps each agent's evaluations in
//! order, so the figures a comparison needs (best after a budget, the
//! evaluations and the parallel rounds to the optimum) are read off it.
//!
//! A seed shuffles the order each agent's candidates are listed in, which
//! decides the search's first candidate where no roofline ranks them: a
//! seeded replay is reproducible, and different seeds differ.

use std::collections::BTreeMap;

use mtswarm_core::{Message, ToolCall};
use mtswarm_hw::landscape::{Landscape, Outcome};
use mtswarm_hw::tune::{Config, ParamValue};
use serde_json::{Value, json};

use crate::leader::{define_value, search_plans};
use crate::observations::{OBSERVATIONS_TOOL, Observations};
use crate::plan::{DefineValue, TaskPlan};
use crate::worker::{Decision, decide, render_task_message};
use crate::{search_agents, search_budget};

/// Turns one agent's task may take before the replay gives up on it (the
/// plan ends long before: a turn per evaluation, plus a few).
const MAX_TURNS: usize = 100_000;

/// A roofline bound in seconds for a candidate's `-D` values, when the
/// kernel's model gives one.
pub type Bound<'a> = &'a dyn Fn(&BTreeMap<String, String>) -> Option<f64>;

/// How to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    /// Free slices: the leader spawns as many agents as the budget feeds,
    /// at most this many ([`search_agents`]).
    pub slices: usize,
    /// Agents the job asks for (its `num_agents`, at most `slices`);
    /// `None`: as many as the budget feeds.
    pub agents: Option<usize>,
    /// The job's evaluations; `None`: the default share of the space.
    pub budget: Option<usize>,
    /// Shuffles each agent's candidate order; `None`: the leader's order.
    pub seed: Option<u64>,
    /// Cores the tool replies name (what a figure was measured on).
    pub cores: u32,
    /// One search per job: every agent's model sees the other agents'
    /// results and pending points ([`crate::observations`]); `false`:
    /// each agent searches alone.
    pub shared: bool,
}

/// A replay that could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Nothing to search.
    #[error("the landscape has no configuration")]
    Empty,
    /// The search asked for a tool a replay cannot answer.
    #[error("agent {agent}: the search called `{tool}`, which a replay does not answer")]
    UnexpectedTool {
        /// The agent (from 1).
        agent: usize,
        /// The tool.
        tool: String,
    },
    /// A call named an artifact or candidate the replay never made.
    #[error("agent {agent}: call `{call}` names no candidate the replay built: {arguments}")]
    UnknownCandidate {
        /// The agent (from 1).
        agent: usize,
        /// The call's id.
        call: String,
        /// Its arguments (cut to 200 characters).
        arguments: String,
    },
    /// The search went on past [`MAX_TURNS`].
    #[error("agent {agent}: the search did not finish within {MAX_TURNS} turns")]
    DidNotFinish {
        /// The agent (from 1).
        agent: usize,
    },
}

/// One hardware evaluation of a replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// The configuration: an index into the landscape's entries.
    pub entry: usize,
    /// Its recorded time; `None` for a failed configuration.
    pub seconds: Option<f64>,
}

/// What each agent evaluated, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayRun {
    /// Per agent, its evaluations in the order it made them.
    pub agents: Vec<Vec<Evaluation>>,
    /// Builds all agents asked for (host time; a build ahead the model no
    /// longer picks is never measured).
    pub builds: usize,
}

impl ReplayRun {
    /// Evaluations of all agents.
    pub fn evaluations(&self) -> usize {
        self.agents.iter().map(Vec::len).sum()
    }

    /// Parallel rounds: the longest agent's evaluations.
    pub fn rounds(&self) -> usize {
        self.agents.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Evaluations made by the end of `round` (every agent's first
    /// `round`, or all it made).
    pub fn evaluations_by_round(&self, round: usize) -> usize {
        self.agents.iter().map(|a| a.len().min(round)).sum()
    }

    /// The best time found by the end of `round`.
    pub fn best_by_round(&self, round: usize) -> Option<f64> {
        self.agents
            .iter()
            .flat_map(|a| a.iter().take(round))
            .filter_map(|e| e.seconds)
            .min_by(f64::total_cmp)
    }

    /// The best time found.
    pub fn best(&self) -> Option<f64> {
        self.best_by_round(self.rounds())
    }

    /// The round (from 1) by whose end a time within `share` of `optimum`
    /// (`optimum / time >= share`) was found; `None` if never.
    pub fn rounds_to(&self, optimum: f64, share: f64) -> Option<usize> {
        self.agents
            .iter()
            .filter_map(|a| {
                a.iter()
                    .position(|e| e.seconds.is_some_and(|t| optimum / t >= share))
            })
            .min()
            .map(|i| i + 1)
    }

    /// The best time after `evaluations` in all, counted round by round
    /// (a partial last round takes agents in order).
    pub fn best_after(&self, evaluations: usize) -> Option<f64> {
        let mut taken = 0;
        let mut best: Option<f64> = None;
        for round in 0..self.rounds() {
            for agent in &self.agents {
                if taken == evaluations {
                    return best;
                }
                if let Some(e) = agent.get(round) {
                    taken += 1;
                    if let Some(t) = e.seconds {
                        best = Some(best.map_or(t, |b| b.min(t)));
                    }
                }
            }
        }
        best
    }
}

/// The median over seeds of the evaluations each took to reach a figure,
/// `None` for a seed that never did, counted as more than any: `None`
/// unless more than half the seeds reached it (then the lower median, as
/// `deploy/search_vs_peers.py` counts the peers'). A median over the seeds
/// that reached it alone would flatter a search that often does not.
pub fn median_evaluations_to(seeds: &[Option<usize>]) -> Option<usize> {
    let mut reached: Vec<usize> = seeds.iter().flatten().copied().collect();
    if reached.len() * 2 <= seeds.len() {
        return None;
    }
    reached.sort_unstable();
    reached.get((seeds.len() - 1) / 2).copied()
}

/// Replays the builtin search on `landscape` (see the module docs).
pub fn replay(
    landscape: &Landscape,
    config: &ReplayConfig,
    bound: Option<Bound<'_>>,
) -> Result<ReplayRun, ReplayError> {
    if landscape.entries.is_empty() {
        return Err(ReplayError::Empty);
    }
    let configurations: Vec<Config> = landscape.entries.iter().map(|e| e.config.clone()).collect();
    let index: BTreeMap<String, usize> = landscape
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (landscape.cache_key(&e.config), i))
        .collect();
    let total = config
        .budget
        .unwrap_or_else(|| search_budget(configurations.len()))
        .clamp(1, configurations.len());
    let slices = config.slices.max(1);
    let agents = match config.agents {
        Some(asked) => asked.clamp(1, slices),
        None => search_agents(total, configurations.len(), slices),
    };
    let plans = search_plans(&configurations, agents, total);
    let mut runs = Vec::with_capacity(plans.len());
    for (i, mut plan) in plans.into_iter().enumerate() {
        if let (Some(seed), Some(candidates)) = (config.seed, plan.candidates.as_mut()) {
            shuffle(
                candidates,
                seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
        }
        plan.estimate = Some(bound.is_some());
        plan.shared_search = Some(config.shared);
        let slice = RecordedSlice {
            agent: i + 1,
            landscape,
            index: &index,
            bound,
            cores: config.cores,
        };
        runs.push(AgentRun::new(slice, &plan));
    }
    // Round by round: each agent makes its next evaluation, seeing what
    // the others had measured by the end of the previous round.
    let mut store = SharedStore::default();
    loop {
        let mut moved = false;
        for run in &mut runs {
            moved |= run.next_evaluation(&mut store)?;
        }
        if !moved {
            break;
        }
    }
    Ok(ReplayRun {
        builds: runs.iter().map(|r| r.artifacts.len()).sum(),
        agents: runs.into_iter().map(|r| r.evaluations).collect(),
    })
}

/// What the agents of a replayed job know of each other: every evaluation
/// with its round, and the configurations each is measuring.
#[derive(Default)]
struct SharedStore {
    /// (agent, round from 1, landscape entry) of every evaluation.
    measured: Vec<(usize, usize, usize)>,
    /// Per agent, the entries it has built or is building and not
    /// measured yet.
    running: BTreeMap<usize, Vec<usize>>,
}

impl SharedStore {
    /// The `job_observations` reply for `agent` before its evaluation of
    /// `round`: the others' evaluations of the rounds before.
    fn observations_for(&self, agent: usize, round: usize, landscape: &Landscape) -> Observations {
        let defines_of = |entry: usize| -> BTreeMap<String, String> {
            landscape.entries[entry]
                .config
                .iter()
                .map(|(k, v)| (k.clone(), define_text(v)))
                .collect()
        };
        let mut observations = Observations::default();
        for &(owner, at, entry) in &self.measured {
            if owner == agent || at >= round {
                continue;
            }
            match landscape.entries[entry].outcome.seconds() {
                Some(seconds) => observations.measured.push((defines_of(entry), seconds)),
                None => observations.failed.push(defines_of(entry)),
            }
        }
        for (&owner, entries) in &self.running {
            if owner != agent {
                observations
                    .running
                    .extend(entries.iter().map(|&e| defines_of(e)));
            }
        }
        observations
    }
}

/// One agent's task in progress.
struct AgentRun<'a> {
    slice: RecordedSlice<'a>,
    history: Vec<Message>,
    /// Artifact id -> landscape entry.
    artifacts: BTreeMap<String, usize>,
    evaluations: Vec<Evaluation>,
    done: bool,
}

impl<'a> AgentRun<'a> {
    fn new(slice: RecordedSlice<'a>, plan: &TaskPlan) -> Self {
        let history = vec![
            Message::system("You tune kernels."),
            Message::user(render_task_message(
                &format!("t{}", slice.agent),
                &slice.landscape.kernel_name,
                "",
                &plan.to_value(),
            )),
        ];
        Self {
            slice,
            history,
            artifacts: BTreeMap::new(),
            evaluations: Vec::new(),
            done: false,
        }
    }

    /// Runs turns until the task has made one more evaluation (`true`) or
    /// answered (`false`).
    fn next_evaluation(&mut self, store: &mut SharedStore) -> Result<bool, ReplayError> {
        let made = self.evaluations.len();
        for _ in 0..MAX_TURNS {
            if self.done {
                return Ok(false);
            }
            let calls = match decide(&self.history) {
                Decision::Final(_) => {
                    self.done = true;
                    store.running.remove(&self.slice.agent);
                    return Ok(false);
                }
                Decision::Call(call) => vec![call],
                Decision::Calls(calls) => calls,
            };
            self.history.push(Message::assistant("", calls.clone()));
            for call in &calls {
                let reply = if call.name == OBSERVATIONS_TOOL {
                    let round = self.evaluations.len() + 1;
                    store
                        .observations_for(self.slice.agent, round, self.slice.landscape)
                        .render()
                } else {
                    self.slice
                        .answer(call, &mut self.artifacts, &mut self.evaluations)?
                };
                self.history.push(Message::tool(call.id.clone(), reply));
            }
            for (round, evaluation) in self.evaluations.iter().enumerate().skip(made) {
                store
                    .measured
                    .push((self.slice.agent, round + 1, evaluation.entry));
            }
            let measured: Vec<usize> = self.evaluations.iter().map(|e| e.entry).collect();
            let running: Vec<usize> = self
                .artifacts
                .values()
                .copied()
                .filter(|e| !measured.contains(e))
                .collect();
            store.running.insert(self.slice.agent, running);
            if self.evaluations.len() > made {
                return Ok(true);
            }
        }
        Err(ReplayError::DidNotFinish {
            agent: self.slice.agent,
        })
    }
}

/// One agent's slice, answering from the landscape.
struct RecordedSlice<'a> {
    agent: usize,
    landscape: &'a Landscape,
    index: &'a BTreeMap<String, usize>,
    bound: Option<Bound<'a>>,
    cores: u32,
}

impl RecordedSlice<'_> {
    /// The tool's reply in the real tool's words.
    fn answer(
        &self,
        call: &ToolCall,
        artifacts: &mut BTreeMap<String, usize>,
        evaluations: &mut Vec<Evaluation>,
    ) -> Result<String, ReplayError> {
        let args: Value = serde_json::from_str(&call.arguments).unwrap_or(Value::Null);
        let kernel = &self.landscape.kernel_name;
        let cores = self.cores;
        Ok(match call.name.as_str() {
            "board_info" => format!(
                "slice replay/c0 (recorded landscape, {cores} cores)\nmeasurement: exact timing (one validated execution is the figure; spot re-runs check it)"
            ),
            "analyze_kernel" => {
                format!("{kernel}/kernel.c: recorded landscape, no static analysis")
            }
            "estimate" => match self.bound.and_then(|b| b(&defines(&args))) {
                Some(seconds) => format!("roofline on {cores} cores: bound {seconds:.4e} s"),
                None => "error: the kernel has no [model] to estimate from".to_owned(),
            },
            "compile" => {
                let entry = self.entry_of(call, &args)?;
                let id = format!("b{}", artifacts.len() + 1);
                artifacts.insert(id.clone(), entry);
                if args["background"] == json!(true) {
                    format!(
                        "building {kernel} in the background as artifact {id}: call wait_build with artifact {id} before running it"
                    )
                } else {
                    format!("compiled {kernel} as artifact {id} (kernel recorded, replay)")
                }
            }
            "wait_build" => {
                let id = args["artifact"].as_str().unwrap_or_default();
                format!("compiled {kernel} as artifact {id} (kernel recorded, replay)")
            }
            "validate" | "benchmark" => {
                let id = args["artifact"].as_str().unwrap_or_default();
                let entry = *artifacts.get(id).ok_or_else(|| self.unknown(call))?;
                let outcome = &self.landscape.entries[entry].outcome;
                evaluations.push(Evaluation {
                    entry,
                    seconds: outcome.seconds(),
                });
                evaluation_reply(&call.name, id, cores, outcome)
            }
            other => {
                return Err(ReplayError::UnexpectedTool {
                    agent: self.agent,
                    tool: other.to_owned(),
                });
            }
        })
    }

    /// The landscape entry a call's `defines` name.
    fn entry_of(&self, call: &ToolCall, args: &Value) -> Result<usize, ReplayError> {
        let wanted = defines(args);
        let config: Config =
            self.landscape
                .keys
                .iter()
                .filter_map(|k| {
                    let text = wanted.get(k)?;
                    let value = self.landscape.values.get(k).and_then(|values| {
                        values.iter().find(|v| define_text(v) == *text).cloned()
                    })?;
                    Some((k.clone(), value))
                })
                .collect();
        if config.len() != self.landscape.keys.len() {
            return Err(self.unknown(call));
        }
        self.index
            .get(&self.landscape.cache_key(&config))
            .copied()
            .ok_or_else(|| self.unknown(call))
    }

    fn unknown(&self, call: &ToolCall) -> ReplayError {
        ReplayError::UnknownCandidate {
            agent: self.agent,
            call: call.id.clone(),
            arguments: call.arguments.chars().take(200).collect(),
        }
    }
}

/// A `validate` or `benchmark` reply for a recorded outcome.
fn evaluation_reply(tool: &str, id: &str, cores: u32, outcome: &Outcome) -> String {
    match (outcome, tool) {
        (Outcome::Measured { ms, .. }, "validate") => {
            let t = ms / 1000.0;
            format!(
                "validation PASSED for artifact {id} on {cores} cores (1 executions): valid: {t:.4e} s"
            )
        }
        (Outcome::Measured { ms, .. }, _) => {
            let t = ms / 1000.0;
            format!(
                "artifact {id} on {cores} cores: median {t:.4e} s, trimmed mean {t:.4e} s over 1 runs (min {t:.4e}, max {t:.4e})"
            )
        }
        (Outcome::Failed { error }, "validate") => {
            format!("validation FAILED for artifact {id}: {error} (recorded)")
        }
        (Outcome::Failed { error }, _) => {
            format!("benchmark FAILED for artifact {id}: {error} (recorded)")
        }
    }
}

/// The `-D` values of a call's `defines` argument, as text.
fn defines(args: &Value) -> BTreeMap<String, String> {
    let Some(map) = args["defines"].as_object() else {
        return BTreeMap::new();
    };
    map.iter()
        .filter_map(|(k, v)| {
            let value: DefineValue = serde_json::from_value(v.clone()).ok()?;
            Some((k.clone(), value.as_define()))
        })
        .collect()
}

/// A landscape value as a plan's `-D` text carries it.
fn define_text(value: &ParamValue) -> String {
    define_value(value).as_define()
}

/// Fisher-Yates with splitmix64: the same order for the same seed on
/// every machine.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests;
