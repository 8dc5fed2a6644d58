//! The builtin leader policy: the model that drives a job's leader loop when
//! no LLM is configured. It is an ordinary [`ChatModel`]: each turn it reads
//! the conversation (the job in the first user message, its own earlier
//! tool calls and their results) and answers with the next tool calls or the
//! final answer, so the engine, the tools and the events are exercised
//! exactly as with a real model.
//!
//! Plan:
//! 1. `list_fleet` (compact: the free slice ids, at most `num_agents`) and
//!    `read_file("tune.toml")` together;
//! 2. `spawn_agent` once per free matching slice (at most `num_agents` when
//!    the job sets it, else at most as many as the search budget feeds:
//!    [`search_agents`]), named `tuner-1`, `tuner-2`, ... on explicit slices;
//! 3. split the tune.toml configurations (constraints applied with the
//!    MT-3000 spec) among the agents, each part a balanced sample of the
//!    space (every parameter value spread evenly, see
//!    [`balanced_partitions`]), and `assign_task` each its part as
//!    a [`TaskPlan`] `{"candidates": [{...-D map...}, ...], "search_budget":
//!    n}`: the job's evaluation budget (the job line's `search_budget`, else
//!    [`search_budget`] of the space) split evenly over the parts
//!    ([`split_budget`]), so the whole job evaluates a small share of a
//!    large space;
//! 4. `collect_result` of all tasks, mode `all`, with the job's timeout
//!    (its compact summary: `best`, `failed_tasks`, `agents` rows; see
//!    the leader's `digest`);
//! 5. when some collected tasks FAILED (not cancelled), retry each failed
//!    partition once on another agent: `list_fleet` again, `spawn_agent` a
//!    `tuner-retry-N` on a free slice per failed partition, or, when no slice
//!    is free, reuse an agent whose task succeeded; `assign_task` the failed
//!    partition's candidates to it and `collect_result` those tasks;
//! 6. answer with the best of the collect summaries' `best` figures: a
//!    summary line and a ```` ```json ```` block `{"best": {"params",
//!    "gflops", "peak_percent", "median_seconds", "agent", "slice_id",
//!    "task_id"}, "task_status", "candidate_status", "pending"}`, or
//!    `{"best": null, "error"}`. The job's outcome does not come from this
//!    answer (see the leader's `outcome`); the completion gate checks that its
//!    figures are backed (`grounding`).
//!
//! The retry round's calls have ids starting with `retry-`, which is how
//! the policy tells the rounds apart when it reads the conversation.
//!
//! The job parameters come from the `job_spec: {...}` line the job runner
//! puts at the end of the task message ([`JobLine`]).

use std::collections::HashMap;

use futures::stream;
use mtswarm_core::model::{FinishReason, ModelEvent};
use mtswarm_core::{ChatModel, ChatRequest, Message, ModelError, ModelStream, Role, ToolCall};
use mtswarm_hw::tune::{Config, ParamValue};

use crate::budget::{search_agents, search_budget, split_budget};
use crate::partition::balanced_partitions;
use crate::plan::{DefineValue, Defines, JobLine, TaskPlan};
use mtswarm_hw::{ChipSpec, TuneSpace};
use serde_json::{Value, json};

/// Name of the tuning-space file in a kernel directory.
const TUNE_FILE: &str = "tune.toml";

/// The job line of the conversation's task message; the defaults when it
/// has none or it does not read.
fn job_line(messages: &[Message]) -> JobLine {
    messages
        .iter()
        .find(|m| m.role == Role::User)
        .and_then(|m| JobLine::find(&m.content))
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// The builtin leader policy (see the module docs).
#[derive(Debug, Clone)]
pub struct BuiltinLeaderPolicy {
    spec: ChipSpec,
}

impl Default for BuiltinLeaderPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl BuiltinLeaderPolicy {
    /// The policy's [`ChatModel::model_name`].
    pub const MODEL_NAME: &'static str = "builtin-leader";

    /// With the default MT-3000 spec for tune.toml constraints.
    pub fn new() -> Self {
        Self {
            spec: ChipSpec::default(),
        }
    }

    /// With another chip spec for tune.toml constraints.
    pub fn with_spec(spec: ChipSpec) -> Self {
        Self { spec }
    }

    /// The next turn for this conversation.
    pub fn decide(&self, messages: &[Message]) -> Turn {
        let job = job_line(messages);
        let history = History::new(messages);
        let Some(last) = history.last_calls() else {
            return Turn::Calls(vec![
                call("fleet", "list_fleet", fleet_args(&job)),
                call("tune", "read_file", json!({"path": TUNE_FILE})),
            ]);
        };
        let names: Vec<&str> = last.iter().map(|c| c.name.as_str()).collect();
        let retry_round = last.iter().any(|c| c.id.starts_with(RETRY));
        if names.contains(&"collect_result") {
            if !retry_round && let Some(turn) = retry_start(&history) {
                return turn;
            }
            return Turn::Final(final_answer(&history));
        }
        if names.contains(&"assign_task") {
            return collect(&history, last, &job, retry_round);
        }
        if names.contains(&"spawn_agent") {
            if retry_round {
                return retry_assign(&history);
            }
            return self.assign(&history, last, &job);
        }
        if names.contains(&"list_fleet") {
            if retry_round {
                return retry_spawn_or_assign(&history);
            }
            return self.spawn(&history, last, &job);
        }
        Turn::Final(failure(&format!(
            "unexpected state: the last calls were {names:?}"
        )))
    }
}

/// What the policy does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// Tool calls to make this turn (streamed as one assistant message).
    Calls(Vec<ToolCall>),
    /// The final answer text, or a failure message when the plan cannot go on.
    Final(String),
}

fn call(id: &str, name: &str, args: Value) -> ToolCall {
    ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments: args.to_string(),
    }
}

/// The calls made so far and their results, by call id.
struct History<'a> {
    messages: &'a [Message],
    results: HashMap<&'a str, &'a str>,
}

impl<'a> History<'a> {
    fn new(messages: &'a [Message]) -> Self {
        let results = messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .filter_map(|m| m.tool_call_id.as_deref().map(|id| (id, m.content.as_str())))
            .collect();
        Self { messages, results }
    }

    fn last_calls(&self) -> Option<&'a [ToolCall]> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant && !m.tool_calls.is_empty())
            .map(|m| m.tool_calls.as_slice())
    }

    fn all_calls(&self) -> impl Iterator<Item = &'a ToolCall> {
        self.messages.iter().flat_map(|m| m.tool_calls.iter())
    }

    fn result(&self, call: &ToolCall) -> Option<&'a str> {
        self.results.get(call.id.as_str()).copied()
    }

    /// The JSON result of a call, or what it got instead.
    fn json_result(&self, call: &ToolCall) -> Result<Value, CallResultError> {
        let content = self.result(call).ok_or_else(|| CallResultError::Missing {
            tool: call.name.clone(),
        })?;
        serde_json::from_str(content).map_err(|_| CallResultError::NotJson {
            text: content.to_string(),
        })
    }
}

/// Why a tool call of the history has no JSON result.
#[derive(Debug, thiserror::Error)]
enum CallResultError {
    /// The call has no result message (yet).
    #[error("no result for {tool}")]
    Missing { tool: String },
    /// The tool answered with text, not JSON: an error message (kept as is).
    #[error("{text}")]
    NotJson { text: String },
}

fn failure(error: &str) -> String {
    format!(
        "The job could not be completed: {error}\n\n```json\n{}\n```",
        json!({"best": null, "error": error})
    )
}

impl BuiltinLeaderPolicy {
    /// The tune.toml configurations (constraints applied), from the
    /// `read_file` of the first turn.
    fn configurations(&self, history: &History<'_>) -> Result<Vec<Config>, String> {
        history
            .all_calls()
            .find(|c| c.name == "read_file")
            .and_then(|c| history.result(c))
            .ok_or_else(|| "tune.toml was not read".to_string())
            .and_then(|text| TuneSpace::from_toml_str(text).map_err(|e| e.to_string()))
            .and_then(|space| space.configurations(&self.spec).map_err(|e| e.to_string()))
    }

    fn spawn(&self, history: &History<'_>, last: &[ToolCall], job: &JobLine) -> Turn {
        let Some(fleet_call) = last.iter().find(|c| c.name == "list_fleet") else {
            return Turn::Final(failure("list_fleet was not called"));
        };
        let fleet = match history.json_result(fleet_call) {
            Ok(fleet) => fleet,
            Err(error) => return Turn::Final(failure(&format!("cannot read the fleet: {error}"))),
        };
        let free = free_slices(&fleet);
        if free.is_empty() {
            return Turn::Final(failure(&format!(
                "no free slice matches the selector {}",
                fleet["selector"]
            )));
        }
        let count = if job.num_agents > 0 {
            (job.num_agents as usize).min(free.len())
        } else {
            // As many as the search's budget feeds (a space that cannot be
            // read is reported by the assign step).
            match self.configurations(history) {
                Ok(configurations) => {
                    let budget = job
                        .search_budget()
                        .unwrap_or_else(|| search_budget(configurations.len()));
                    search_agents(budget, configurations.len(), free.len())
                }
                Err(_) => free.len(),
            }
        };
        Turn::Calls(
            free.iter()
                .take(count)
                .enumerate()
                .map(|(i, slice)| {
                    call(
                        &format!("spawn-{}", i + 1),
                        "spawn_agent",
                        json!({
                            "name": format!("tuner-{}", i + 1),
                            "slice_id": slice,
                            "role": "tuner",
                            "instructions": "Tune the kernel over the candidate configurations you are given.",
                        }),
                    )
                })
                .collect(),
        )
    }
}

impl BuiltinLeaderPolicy {
    fn assign(&self, history: &History<'_>, last: &[ToolCall], job: &JobLine) -> Turn {
        let mut agents = Vec::new();
        let mut refusals = Vec::new();
        for spawn in last.iter().filter(|c| c.name == "spawn_agent") {
            match history.json_result(spawn) {
                Ok(value) => match value["agent"].as_str() {
                    Some(agent) => agents.push(agent.to_string()),
                    None => refusals.push(value.to_string()),
                },
                Err(error) => refusals.push(error.to_string()),
            }
        }
        if agents.is_empty() {
            return Turn::Final(failure(&format!(
                "no agent could be spawned: {}",
                refusals.join("; ")
            )));
        }
        let configurations = match self.configurations(history) {
            Ok(configurations) if !configurations.is_empty() => configurations,
            Ok(_) => {
                return Turn::Final(failure(
                    "tune.toml allows no configuration under its constraints",
                ));
            }
            Err(error) => return Turn::Final(failure(&format!("no tuning space: {error}"))),
        };
        let total = job
            .search_budget()
            .unwrap_or_else(|| search_budget(configurations.len()));
        Turn::Calls(
            agents
                .iter()
                .zip(search_plans(&configurations, agents.len(), total))
                .enumerate()
                .map(|(i, (agent, plan))| {
                    call(
                        &format!("assign-{}", i + 1),
                        "assign_task",
                        json!({
                            "agent": agent,
                            "instructions": "Search the candidate configurations for the fastest one within the evaluation budget; answer with the best one.",
                            "parameters": plan.to_value(),
                        }),
                    )
                })
                .collect(),
        )
    }
}

/// The job's search as `agents` task plans: the space split so each part
/// sees every value ([`balanced_partitions`]) and the job's `total`
/// evaluations split over the parts ([`split_budget`]); parts left empty
/// (more agents than configurations) get no plan; with more than one,
/// every plan shares its search (`shared_search`). Never more plans than
/// `total`: each screens at least one candidate, so more would spend more
/// than the job's budget (the agents left over get no task). What the
/// builtin leader assigns, and what a replay of a recorded landscape runs.
pub fn search_plans(configurations: &[Config], agents: usize, total: usize) -> Vec<TaskPlan> {
    let agents = agents.min(total.max(1));
    let parts: Vec<Vec<Defines>> = balanced_partitions(configurations, agents)
        .into_iter()
        .map(|part| part.iter().map(defines_of).collect())
        .collect();
    let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
    let budgets = split_budget(total, &sizes);
    let mut plans: Vec<TaskPlan> = parts
        .into_iter()
        .zip(budgets)
        .filter(|(part, _)| !part.is_empty())
        .map(|(part, budget)| TaskPlan::search(part, u32::try_from(budget).unwrap_or(u32::MAX)))
        .collect();
    // Agents of one job search as one: each fits its model to every
    // agent's results (`crate::observations`).
    if plans.len() > 1 {
        for plan in &mut plans {
            plan.shared_search = Some(true);
        }
    }
    plans
}

fn collect(history: &History<'_>, last: &[ToolCall], job: &JobLine, retry_round: bool) -> Turn {
    let tasks: Vec<String> = last
        .iter()
        .filter(|c| c.name == "assign_task")
        .filter_map(|c| history.json_result(c).ok())
        .filter_map(|v| v["task_id"].as_str().map(str::to_string))
        .collect();
    if tasks.is_empty() {
        if retry_round {
            return Turn::Final(final_answer(history));
        }
        return Turn::Final(failure("no task could be assigned"));
    }
    Turn::Calls(vec![call(
        if retry_round {
            "retry-collect"
        } else {
            "collect"
        },
        "collect_result",
        json!({"tasks": tasks, "mode": "all", "timeout_seconds": job.collect_timeout_seconds}),
    )])
}

/// Prefix of the call ids of the retry round.
const RETRY: &str = "retry-";

/// A partition whose task FAILED in the first collect.
struct FailedPartition {
    agent: String,
    /// The task's plan (candidates and search budget).
    parameters: TaskPlan,
}

/// The failed partitions of the first collect (in its order) and the agents
/// whose tasks succeeded there (reusable for a retry). Read from the
/// collect summary's structured fields: `failed_tasks` and the `agents`
/// rows (a summary cut by its budget lists fewer of them; the retry then
/// covers the listed ones).
fn first_round(history: &History<'_>) -> (Vec<FailedPartition>, Vec<String>) {
    let Some(collected) = history
        .all_calls()
        .find(|c| c.name == "collect_result" && !c.id.starts_with(RETRY))
        .and_then(|c| history.json_result(c).ok())
    else {
        return (Vec::new(), Vec::new());
    };
    // Task id -> the agent and the candidates it was assigned.
    let assigned: HashMap<String, (String, TaskPlan)> = history
        .all_calls()
        .filter(|c| c.name == "assign_task" && !c.id.starts_with(RETRY))
        .filter_map(|c| {
            let task = history.json_result(c).ok()?["task_id"]
                .as_str()?
                .to_string();
            let args: Value = serde_json::from_str(&c.arguments).ok()?;
            let agent = args["agent"].as_str().unwrap_or_default().to_string();
            let plan = TaskPlan::from_value(&args["parameters"]).ok()?;
            Some((task, (agent, plan)))
        })
        .collect();
    let failed: Vec<FailedPartition> = collected["failed_tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|task| assigned.get(task))
        .filter(|(_, p)| p.candidates.as_ref().is_some_and(|a| !a.is_empty()))
        .map(|(agent, parameters)| FailedPartition {
            agent: agent.clone(),
            parameters: parameters.clone(),
        })
        .collect();
    let mut reusable: Vec<String> = Vec::new();
    for row in collected["agents"].as_array().into_iter().flatten() {
        if row["status"] == "ok"
            && let Some(agent) = row["agent"].as_str()
            && !reusable.iter().any(|a| a == agent)
        {
            reusable.push(agent.to_string());
        }
    }
    reusable.retain(|a| !failed.iter().any(|f| &f.agent == a));
    (failed, reusable)
}

/// After the first collect: look at the fleet again when a partition failed.
fn retry_start(history: &History<'_>) -> Option<Turn> {
    let (failed, _) = first_round(history);
    if failed.is_empty() {
        return None;
    }
    Some(Turn::Calls(vec![call(
        "retry-fleet",
        "list_fleet",
        json!({"compact": true, "limit": failed.len()}),
    )]))
}

/// Free slices of the retry round's `list_fleet`.
fn retry_free_slices(history: &History<'_>) -> Vec<String> {
    history
        .all_calls()
        .find(|c| c.name == "list_fleet" && c.id.starts_with(RETRY))
        .and_then(|c| history.json_result(c).ok())
        .map(|fleet| free_slices(&fleet))
        .unwrap_or_default()
}

/// `list_fleet` arguments: the compact listing (free slice ids only), at
/// most as many as the job wants agents, so a large fleet fits one tool
/// result as the model is shown it.
fn fleet_args(job: &JobLine) -> Value {
    let mut args = json!({"compact": true});
    if job.num_agents > 0 {
        args["limit"] = json!(job.num_agents);
    }
    args
}

/// The free slice ids of a `list_fleet` result: its compact `free_slices`,
/// or the free entries of its full `slices` listing.
fn free_slices(fleet: &Value) -> Vec<String> {
    if let Some(ids) = fleet["free_slices"].as_array() {
        return ids
            .iter()
            .filter_map(|id| id.as_str().map(str::to_string))
            .collect();
    }
    fleet["slices"]
        .as_array()
        .map(|slices| {
            slices
                .iter()
                .filter(|s| s["state"] == "free")
                .filter_map(|s| s["slice_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn retry_spawn_name(index: usize) -> String {
    format!("tuner-retry-{}", index + 1)
}

/// Spawns one agent per failed partition on a free slice; partitions
/// without a free slice go to reusable agents (assigned directly when no
/// spawn is needed at all).
fn retry_spawn_or_assign(history: &History<'_>) -> Turn {
    let (failed, _) = first_round(history);
    let free = retry_free_slices(history);
    let spawns: Vec<ToolCall> = failed
        .iter()
        .zip(&free)
        .enumerate()
        .map(|(i, (_, slice))| {
            call(
                &format!("retry-spawn-{}", i + 1),
                "spawn_agent",
                json!({
                    "name": retry_spawn_name(i),
                    "slice_id": slice,
                    "role": "tuner",
                    "instructions": "Tune the kernel over the candidate configurations you are given (a retry of a failed partition).",
                }),
            )
        })
        .collect();
    if spawns.is_empty() {
        return retry_assign(history);
    }
    Turn::Calls(spawns)
}

/// Assigns each failed partition to its retry agent: the one spawned for it
/// when that worked, else a reusable agent (round-robin).
fn retry_assign(history: &History<'_>) -> Turn {
    let (failed, reusable) = first_round(history);
    let spawned: HashMap<String, String> = history
        .all_calls()
        .filter(|c| c.name == "spawn_agent" && c.id.starts_with(RETRY))
        .filter_map(|c| {
            let agent = history.json_result(c).ok()?["agent"].as_str()?.to_string();
            Some((c.id.clone(), agent))
        })
        .collect();
    let mut reuse = reusable.iter().cycle();
    let mut calls = Vec::new();
    for (i, partition) in failed.iter().enumerate() {
        let agent = spawned
            .get(&format!("retry-spawn-{}", i + 1))
            .cloned()
            .or_else(|| reuse.next().cloned());
        let Some(agent) = agent else { continue };
        calls.push(call(
            &format!("retry-assign-{}", i + 1),
            "assign_task",
            json!({
                "agent": agent,
                "instructions": "Search the candidate configurations for the fastest one within the evaluation budget; answer with the best one.",
                "parameters": partition.parameters.to_value(),
            }),
        ));
    }
    if calls.is_empty() {
        return Turn::Final(final_answer(history));
    }
    Turn::Calls(calls)
}

fn add_counts(total: &mut serde_json::Map<String, Value>, counts: &Value) {
    for (key, n) in counts.as_object().into_iter().flatten() {
        let sum = total.get(key).and_then(Value::as_u64).unwrap_or(0) + n.as_u64().unwrap_or(0);
        total.insert(key.clone(), json!(sum));
    }
}

/// The answer from the collect summaries: the best of their `best` figures
/// (every round's), the task and candidate counts, what is still pending.
fn final_answer(history: &History<'_>) -> String {
    let collects: Vec<&ToolCall> = history
        .all_calls()
        .filter(|c| c.name == "collect_result")
        .collect();
    let Some(last_collect) = collects.last() else {
        return failure("collect_result was not called");
    };
    let collected = match history.json_result(last_collect) {
        Ok(value) => value,
        Err(error) => return failure(&format!("results could not be collected: {error}")),
    };
    let summaries: Vec<Value> = collects
        .iter()
        .filter_map(|c| history.json_result(c).ok())
        .collect();
    let mut best: Option<Value> = None;
    let mut tasks = serde_json::Map::new();
    let mut candidates = serde_json::Map::new();
    for summary in &summaries {
        add_counts(&mut tasks, &summary["task_status"]);
        add_counts(&mut candidates, &summary["candidate_status"]);
        let this = &summary["best"];
        let Some(gflops) = this["gflops"].as_f64() else {
            continue;
        };
        if best
            .as_ref()
            .is_none_or(|b| b["gflops"].as_f64().is_none_or(|g| gflops > g))
        {
            best = Some(this.clone());
        }
    }
    let pending = collected["pending_tasks"].as_array().map_or(0, Vec::len)
        + collected["omitted"]["pending_tasks"].as_u64().unwrap_or(0) as usize;
    let finished: u64 = tasks.values().filter_map(Value::as_u64).sum();
    match best {
        Some(best) => {
            let figure = match best["gflops"].as_f64() {
                Some(g) => format!("{g:.2} GFLOP/s"),
                None => "no GFLOP/s figure".to_string(),
            };
            let peak = best["peak_percent"]
                .as_f64()
                .map(|p| format!(" ({p:.1}% of peak)"))
                .unwrap_or_default();
            format!(
                "Best configuration {} at {figure}{peak} by agent {} on slice {} ({finished} task(s) finished, {pending} pending).\n\n```json\n{}\n```",
                best["params"],
                best["agent"].as_str().unwrap_or("?"),
                best["slice_id"].as_str().unwrap_or("?"),
                json!({"best": best, "task_status": tasks, "candidate_status": candidates, "pending": pending})
            )
        }
        None => {
            let error = if finished == 0 {
                format!("no task finished in time ({pending} pending)")
            } else {
                format!("no task produced a result ({finished} finished, {pending} pending)")
            };
            format!(
                "The job could not be completed: {error}\n\n```json\n{}\n```",
                json!({"best": null, "error": error, "task_status": tasks, "candidate_status": candidates})
            )
        }
    }
}

#[async_trait::async_trait]
impl ChatModel for BuiltinLeaderPolicy {
    fn model_name(&self) -> &str {
        Self::MODEL_NAME
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        Ok(turn_stream(self.decide(&request.messages)))
    }

    async fn stream_shared(
        &self,
        request: std::sync::Arc<ChatRequest>,
    ) -> Result<ModelStream, ModelError> {
        Ok(turn_stream(self.decide(&request.messages)))
    }
}

fn turn_stream(turn: Turn) -> ModelStream {
    let items: Vec<Result<ModelEvent, ModelError>> = match turn {
        Turn::Calls(calls) => calls
            .into_iter()
            .map(|call| Ok(ModelEvent::ToolCall { call }))
            .chain([Ok(ModelEvent::Finish {
                reason: FinishReason::ToolCalls,
            })])
            .collect(),
        Turn::Final(text) => vec![
            Ok(ModelEvent::TextDelta { text }),
            Ok(ModelEvent::Finish {
                reason: FinishReason::Stop,
            }),
        ],
    };
    Box::pin(stream::iter(items))
}

/// A configuration as a plan's candidate.
fn defines_of(config: &Config) -> Defines {
    config
        .iter()
        .map(|(name, value)| (name.clone(), define_value(value)))
        .collect()
}

/// A tuning value as a plan carries it.
pub(crate) fn define_value(value: &ParamValue) -> DefineValue {
    match value {
        ParamValue::Int(i) => DefineValue::Number((*i).into()),
        ParamValue::Float(f) => serde_json::Number::from_f64(*f)
            .map_or_else(|| DefineValue::Text(f.to_string()), DefineValue::Number),
        ParamValue::Str(s) => DefineValue::Text(s.clone()),
    }
}

#[cfg(test)]
mod tests;
