//! The leader's completion gate. It pushes back on an answer that gives up
//! early, and a final answer may only claim figures that an accepted task
//! result backs. Each refusal is feedback naming what to do next, and the
//! loop goes on; after [`MAX_ANSWER_REFUSALS`] refusals the engine stops
//! the loop and the job fails. The job's outcome never depends on the
//! answer (see [`crate::outcome`]), but the loop must not end before there
//! was a chance of one, and the answer kept beside it must not contradict it.
//!
//! Push-back (for models, not for the builtin leader policy, whose early
//! answers are failures it cannot act on), while the job's deadline has not
//! passed:
//! - an answer given before any task was assigned is refused: spawn an
//!   agent, assign it candidates, collect the results (with agents spawned
//!   already: assign them, naming them);
//! - an answer claiming no best (no `best` in its JSON and no GFLOPS
//!   figure) while no accepted result measured anything is refused: collect
//!   the tasks still running, or assign corrected candidates when every
//!   task finished without a measurement.
//!
//! Grounding: claims read from an answer are every `<number> GFLOP[S|/s]`
//! in the text and the `best.gflops` of its last ```` ```json ```` block.
//! Backing figures: every number under a `gflops` key anywhere in the
//! accepted results' `result_json` of the job. A claim is backed when it is
//! within rounding (half a percent, or 0.006 for two-decimal figures) of
//! one of them.

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use mtswarm_core::{CompletionGate, EvidenceLedger, GateVerdict, WorkingState};
use regex::Regex;
use serde_json::Value;

use crate::results::JobResults;

/// `<number> GFLOP...` in an answer's text. `None` only if the literal
/// pattern were invalid (the tests' claims show it compiles).
static GFLOPS_CLAIM: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)([0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?)\s*GFLOP").ok());

/// Figures listed in the feedback at most.
const FEEDBACK_FIGURES: usize = 8;
/// Task ids named in the feedback at most.
const FEEDBACK_TASKS: usize = 4;

/// Refusals of the leader's answers (pushed back or ungrounded) fed back
/// before the loop stops and the job fails: the engine's
/// `GateConfig::max_blocks` of the leader's loop.
pub(crate) const MAX_ANSWER_REFUSALS: u32 = 3;

/// Pushes back on answers that give up early and rejects answers whose
/// GFLOPS claims no accepted result backs (see the module docs).
pub(crate) struct GroundedAnswerGate {
    results: Arc<JobResults>,
    /// Until when answers that give up early are pushed back; `None`: never.
    push_back_until: Option<SystemTime>,
    /// The names of the job's agents so far: a push-back before any task
    /// names them, so that the next step is an assignment, not a spawn.
    agents: Option<AgentNames>,
}

/// Reads the names of the job's spawned agents.
pub(crate) type AgentNames = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

impl GroundedAnswerGate {
    /// A gate that only checks grounding.
    pub(crate) fn new(results: Arc<JobResults>) -> Self {
        Self {
            results,
            push_back_until: None,
            agents: None,
        }
    }

    /// The gate, naming the job's agents (read by `agents`) when it pushes
    /// back before any task.
    pub(crate) fn with_agents(mut self, agents: AgentNames) -> Self {
        self.agents = Some(agents);
        self
    }

    /// The gate, also pushing back on answers that give up early until
    /// `deadline` (the job's).
    pub(crate) fn with_push_back(mut self, deadline: SystemTime) -> Self {
        self.push_back_until = Some(deadline);
        self
    }

    /// Why an answer that gives up early is refused, with what to do next;
    /// `None` when it is not pushed back.
    fn push_back(&self, answer: &str, figures: &[f64]) -> Option<String> {
        let until = self.push_back_until?;
        if SystemTime::now() >= until {
            return None;
        }
        let tasks = self.results.snapshot();
        let agents = self
            .agents
            .as_ref()
            .map(|names| names())
            .unwrap_or_default();
        if tasks.is_empty() && !agents.is_empty() {
            // A small model told to spawn spawned the same agents again and
            // again: name the ones it has and the call that uses them.
            return Some(format!(
                "Your answer is not accepted: no task has been assigned yet, so nothing was measured \
and the job cannot succeed. Your agents {} are spawned and idle; do not spawn them again. Do this \
next: call assign_task with agent \"{}\" (and once for each other agent); candidates may be left \
out, each agent then gets its share of the kernel's tuning space. Then call collect_result, and \
answer with the best it reports.",
                agents.join(", "),
                agents[0]
            ));
        }
        if tasks.is_empty() {
            return Some(
                "Your answer is not accepted: no task has been assigned yet, so nothing was measured \
and the job cannot succeed. Do this next: call list_fleet to see the free slices, spawn_agent on \
one, assign_task to that agent with candidate configurations (parameter names and values from the \
kernel's tune.toml, which read_file reads), then collect_result, and answer with the best it reports."
                    .to_owned(),
            );
        }
        if claims_a_best(answer) || !figures.is_empty() {
            return None;
        }
        if let Some(running) = still_running(&tasks) {
            return Some(format!(
                "Your answer is not accepted: {running} and nothing has been measured yet. \
{COLLECT_NEXT}"
            ));
        }
        let first_error = crate::results::first_error_note(&tasks);
        Some(format!(
            "Your answer is not accepted: none of the {} finished task(s) measured a candidate{first_error}, \
and there is time left to fix that. Do this next: read what went wrong (result_details shows each \
candidate), assign_task corrected candidates (parameter names and values exactly as the kernel's \
tune.toml has them) to an agent (spawn_agent first if none is free), collect_result, then answer \
with the best it reports.",
            tasks.len()
        ))
    }

    fn backing_figures(&self) -> Vec<f64> {
        let mut figures = Vec::new();
        for view in self.results.snapshot() {
            let Some(result) = view.result else { continue };
            if let Ok(value) = serde_json::from_str::<Value>(&result.result_json) {
                collect_gflops(&value, &mut figures);
            }
        }
        figures.retain(|f| f.is_finite());
        figures.sort_by(|a, b| b.total_cmp(a));
        figures.dedup();
        figures
    }
}

/// What to do while tasks run: the step a model skips when it answers early.
const COLLECT_NEXT: &str = "Call collect_result with mode \"all\" to wait for their results, \
then answer with the best it reports.";

/// `N task(s) are still running (t1, t2 and 3 more)`, or `None` when every
/// task has its result.
fn still_running(tasks: &[crate::results::TaskView]) -> Option<String> {
    let pending: Vec<&str> = tasks
        .iter()
        .filter(|t| t.result.is_none())
        .map(|t| t.task_id.as_str())
        .collect();
    if pending.is_empty() {
        return None;
    }
    let shown = pending
        .iter()
        .take(FEEDBACK_TASKS)
        .copied()
        .collect::<Vec<_>>();
    let more = match pending.len() - shown.len() {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    Some(format!(
        "{} task(s) are still running ({}{more})",
        pending.len(),
        shown.join(", ")
    ))
}

fn collect_gflops(value: &Value, out: &mut Vec<f64>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                if key == "gflops"
                    && let Some(n) = item.as_f64()
                {
                    out.push(n);
                }
                collect_gflops(item, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_gflops(i, out)),
        _ => {}
    }
}

/// The GFLOPS figures an answer claims.
pub(crate) fn claimed_gflops(answer: &str) -> Vec<f64> {
    let mut claims: Vec<f64> = GFLOPS_CLAIM
        .iter()
        .flat_map(|re| re.captures_iter(answer))
        .filter_map(|c| c.get(1)?.as_str().parse().ok())
        .collect();
    if let Some(block) = mtswarm_core::answer::last_json(answer)
        && let Some(g) = block["best"]["gflops"].as_f64()
    {
        claims.push(g);
    }
    claims.retain(|c: &f64| c.is_finite() && *c > 0.0);
    claims
}

/// True when an answer claims a best: a GFLOPS figure, or a non-null
/// `best` in its JSON.
fn claims_a_best(answer: &str) -> bool {
    !claimed_gflops(answer).is_empty()
        || mtswarm_core::answer::last_json(answer)
            .is_some_and(|block| block.get("best").is_some_and(|best| !best.is_null()))
}

fn backed(claim: f64, figures: &[f64]) -> bool {
    figures
        .iter()
        .any(|f| (claim - f).abs() <= (f.abs() * 0.005).max(0.006))
}

impl CompletionGate for GroundedAnswerGate {
    fn evaluate(
        &self,
        answer: &str,
        _evidence: &EvidenceLedger,
        _working: &WorkingState,
    ) -> GateVerdict {
        let figures = self.backing_figures();
        if let Some(feedback) = self.push_back(answer, &figures) {
            return GateVerdict::Fail { feedback };
        }
        let claims = claimed_gflops(answer);
        if claims.is_empty() {
            return GateVerdict::Pass;
        }
        let unbacked: Vec<String> = claims
            .iter()
            .filter(|c| !backed(**c, &figures))
            .map(|c| format!("{c}"))
            .collect();
        if unbacked.is_empty() {
            return GateVerdict::Pass;
        }
        let known = if figures.is_empty() {
            // The usual cause: the answer came before the results did.
            match still_running(&self.results.snapshot()) {
                Some(running) => format!(
                    "no accepted task result reports a GFLOPS figure yet: {running}. {COLLECT_NEXT}"
                ),
                None => "no accepted task result reports a GFLOPS figure yet".to_string(),
            }
        } else {
            format!(
                "the accepted results report these GFLOPS figures (highest first): {}",
                figures
                    .iter()
                    .take(FEEDBACK_FIGURES)
                    .map(|f| format!("{f:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        GateVerdict::Fail {
            feedback: format!(
                "Your answer is not accepted: it claims {} GFLOPS, which no accepted task result backs; {known}. \
Answer again using only figures from collect_result or result_details.",
                unbacked.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_bus::v1;

    fn gate_with(result_json: &str) -> GroundedAnswerGate {
        let results = Arc::new(JobResults::default());
        results.register("t1", "a1", 1);
        let offered = v1::TaskResult {
            task_id: "t1".into(),
            attempt: 1,
            status: v1::TaskStatus::Ok as i32,
            result_json: result_json.into(),
            ..Default::default()
        };
        results.offer(&offered);
        results.publish_accepted("t1");
        GroundedAnswerGate::new(results)
    }

    use std::time::Duration;

    /// A job's results with `tasks` (task id, result: `None` pending, else
    /// its error and `result_json`).
    fn results_with(tasks: &[(&str, Option<(&str, &str)>)]) -> Arc<JobResults> {
        let results = Arc::new(JobResults::default());
        for (task, result) in tasks {
            results.register(task, "a1", 1);
            if let Some((error, result_json)) = result {
                let status = if error.is_empty() {
                    v1::TaskStatus::Ok
                } else {
                    v1::TaskStatus::Failed
                };
                results.offer(&v1::TaskResult {
                    task_id: (*task).into(),
                    attempt: 1,
                    status: status as i32,
                    error: (*error).into(),
                    result_json: (*result_json).into(),
                    ..Default::default()
                });
                results.publish_accepted(task);
            }
        }
        results
    }

    fn pushing(results: Arc<JobResults>) -> GroundedAnswerGate {
        GroundedAnswerGate::new(results)
            .with_push_back(SystemTime::now() + Duration::from_secs(3600))
    }

    fn verdict(gate: &GroundedAnswerGate, answer: &str) -> GateVerdict {
        gate.evaluate(answer, &EvidenceLedger::default(), &WorkingState::default())
    }

    fn refusal(gate: &GroundedAnswerGate, answer: &str) -> String {
        match verdict(gate, answer) {
            GateVerdict::Fail { feedback } => feedback,
            other => panic!("{answer}: {other:?}"),
        }
    }

    const GIVING_UP: &str = "{\n  \"best\": null,\n  \"error\": \"nothing worked\"\n}";

    #[test]
    fn an_answer_before_any_task_is_pushed_back_with_what_to_do_next() {
        let gate = pushing(results_with(&[]));
        for answer in [
            GIVING_UP,
            "Nothing to tune.\n```json\n{\"best\": {\"params\": {}}}\n```",
        ] {
            let feedback = refusal(&gate, answer);
            assert!(feedback.contains("no task has been assigned"), "{feedback}");
            for step in ["spawn_agent", "assign_task", "collect_result", "tune.toml"] {
                assert!(feedback.contains(step), "{step}: {feedback}");
            }
        }
        // Past the job's deadline, or for the builtin policy: no push-back.
        let late = GroundedAnswerGate::new(results_with(&[]))
            .with_push_back(SystemTime::now() - Duration::from_secs(1));
        assert_eq!(verdict(&late, GIVING_UP), GateVerdict::Pass);
        let builtin = GroundedAnswerGate::new(results_with(&[]));
        assert_eq!(verdict(&builtin, GIVING_UP), GateVerdict::Pass);
    }

    /// With agents spawned and no task, the push-back names them and the
    /// assignment, not another spawn (a small model followed "spawn_agent"
    /// and spawned its agents again until the job failed).
    #[test]
    fn an_answer_with_idle_agents_is_told_to_assign_them() {
        let gate = pushing(results_with(&[]))
            .with_agents(Arc::new(|| vec!["agent1".to_owned(), "agent2".to_owned()]));
        let feedback = refusal(&gate, GIVING_UP);
        assert!(feedback.contains("agent1, agent2"), "{feedback}");
        assert!(
            feedback.contains("assign_task with agent \"agent1\""),
            "{feedback}"
        );
        assert!(!feedback.contains("spawn_agent on"), "{feedback}");
        let none = pushing(results_with(&[])).with_agents(Arc::new(Vec::new));
        assert!(refusal(&none, GIVING_UP).contains("spawn_agent on"));
    }

    #[test]
    fn claiming_nothing_while_tasks_run_or_could_be_fixed_is_pushed_back() {
        let running = pushing(results_with(&[("t1", None), ("t2", Some(("boom", "{}")))]));
        let feedback = refusal(&running, GIVING_UP);
        assert!(
            feedback.contains("1 task(s) are still running (t1)")
                && feedback.contains("collect_result"),
            "{feedback}"
        );
        let failed = pushing(results_with(&[(
            "t1",
            Some(("candidate 1: MB is not a parameter of vecadd", "{}")),
        )]));
        let feedback = refusal(&failed, "I could not find anything.");
        assert!(
            feedback.contains("none of the 1 finished task(s) measured a candidate")
                && feedback.contains("MB is not a parameter")
                && feedback.contains("assign_task"),
            "{feedback}"
        );
        // A measured result, or an answer claiming a best: no push-back
        // (the outcome takes the best from the records).
        let measured = pushing(results_with(&[(
            "t1",
            Some(("", r#"{"best": {"gflops": 2.5}}"#)),
        )]));
        assert_eq!(verdict(&measured, GIVING_UP), GateVerdict::Pass);
        assert_eq!(verdict(&measured, "Best at 2.5 GFLOPS."), GateVerdict::Pass);
        assert!(matches!(
            verdict(&failed, "It reaches 9 GFLOPS."),
            GateVerdict::Fail { feedback } if feedback.contains("no accepted task result backs")
        ));
    }

    #[test]
    fn an_invented_figure_while_tasks_run_is_told_to_collect_their_results() {
        let running = pushing(results_with(&[("t1", None)]));
        let feedback = refusal(&running, "Best at 1.0 GFLOPS.");
        assert!(
            feedback.contains("no accepted task result backs")
                && feedback.contains("1 task(s) are still running (t1)")
                && feedback.contains("collect_result with mode \"all\""),
            "{feedback}"
        );
        // Without push-back (the builtin policy) the same claim is refused
        // with the same next step.
        let builtin = GroundedAnswerGate::new(results_with(&[("t1", None)]));
        assert!(refusal(&builtin, "1.0 GFLOPS").contains("collect_result"));
    }

    #[test]
    fn claims_backed_by_an_accepted_result_pass_and_others_get_feedback() {
        let gate = gate_with(r#"{"best": {"gflops": 12.3456}, "candidates": [{"gflops": 3.0}]}"#);
        let evidence = EvidenceLedger::default();
        let working = WorkingState::default();
        let fine = "Best at 12.35 GFLOP/s.\n```json\n{\"best\": {\"gflops\": 12.3456}}\n```";
        assert_eq!(gate.evaluate(fine, &evidence, &working), GateVerdict::Pass);
        assert_eq!(
            gate.evaluate("no figures at all", &evidence, &working),
            GateVerdict::Pass
        );
        let GateVerdict::Fail { feedback } =
            gate.evaluate("It reaches 99.5 GFLOPS.", &evidence, &working)
        else {
            panic!("an invented figure must be rejected")
        };
        assert!(
            feedback.contains("99.5") && feedback.contains("12.346"),
            "{feedback}"
        );
        let empty = gate_with("{}");
        assert!(matches!(
            empty.evaluate("3 GFLOPS", &evidence, &working),
            GateVerdict::Fail { .. }
        ));
    }
}
