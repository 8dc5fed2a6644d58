//! The sequential plan of the builtin worker policy: per candidate, in
//! list order, `compile`, then `validate` on the artifact, then
//! `benchmark`; a failed or denied step drops the candidate.

use std::collections::HashMap;

use mtswarm_core::{Message, Role, ToolCall};
use serde_json::json;

use super::outcome::{CandidateOutcome, artifact_id, first_line};
use super::params::TaskParameters;
use super::{Decision, MAX_RECOMPILES, artifact_missing, hardware_call, parse_call_id};

/// Decide the next move of the sequential plan: per candidate, in list
/// order, compile, validate, benchmark.
pub(super) fn decide(params: &TaskParameters, messages: &[Message]) -> Decision {
    let mut outcomes: Vec<CandidateOutcome> = params
        .candidates
        .iter()
        .enumerate()
        .map(|(index, defines)| CandidateOutcome::new(index, defines.clone()))
        .collect();
    let results: HashMap<&str, &str> = messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| Some((m.tool_call_id.as_deref()?, m.content.as_str())))
        .collect();
    // Replay the plan: every call of ours with its result.
    let mut last: Option<(usize, String, bool, bool)> = None;
    let mut compiles = vec![0u32; outcomes.len()];
    for call in messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| m.tool_calls.iter())
    {
        let Some(index) = parse_call_id(&call.id) else {
            continue;
        };
        let Some(outcome) = outcomes.get_mut(index) else {
            continue;
        };
        let tool = call.name.as_str();
        let content = results.get(call.id.as_str()).copied().unwrap_or("");
        if tool == "compile" {
            compiles[index] += 1;
            outcome.failure = None;
        }
        let ok = match tool {
            "compile" => match artifact_id(content) {
                Some(a) if content.starts_with("compiled") => {
                    outcome.artifact = Some(a);
                    true
                }
                _ => {
                    outcome.failure = Some(format!("compile: {}", first_line(content)));
                    false
                }
            },
            "validate" => {
                let ok = content.contains("validation PASSED");
                if !ok {
                    outcome.failure = Some(format!("validate: {}", first_line(content)));
                }
                ok
            }
            "benchmark" => outcome.read_benchmark(content),
            _ => continue,
        };
        let missing = !ok && tool != "compile" && artifact_missing(content);
        last = Some((index, tool.to_owned(), ok, missing));
    }
    let next_candidate = |index: usize| -> Decision {
        if index < outcomes.len() {
            compile_call(params, index)
        } else {
            Decision::Final(final_answer(&outcomes))
        }
    };
    match last {
        None => next_candidate(0),
        Some((index, _, false, true)) if compiles[index] <= MAX_RECOMPILES => {
            Decision::Call(recompile_call(params, index, compiles[index]))
        }
        Some((index, tool, ok, _)) => match (tool.as_str(), ok) {
            ("compile", true) => Decision::Call(hardware_call(
                params,
                index,
                "validate",
                outcomes[index].artifact.as_deref(),
            )),
            ("validate", true) => Decision::Call(hardware_call(
                params,
                index,
                "benchmark",
                outcomes[index].artifact.as_deref(),
            )),
            _ => next_candidate(index + 1),
        },
    }
}

fn compile_call(params: &TaskParameters, index: usize) -> Decision {
    let args = json!({
        "kernel_dir": params.kernel_dir,
        "defines": params.candidates[index],
    });
    Decision::Call(ToolCall {
        id: format!("c{index}-compile"),
        name: "compile".to_owned(),
        arguments: args.to_string(),
    })
}

fn recompile_call(params: &TaskParameters, index: usize, round: u32) -> ToolCall {
    ToolCall {
        id: format!("c{index}-compile-r{round}"),
        name: "compile".to_owned(),
        arguments: json!({
            "kernel_dir": params.kernel_dir,
            "defines": params.candidates[index],
        })
        .to_string(),
    }
}

fn final_answer(outcomes: &[CandidateOutcome]) -> String {
    let measured: Vec<&CandidateOutcome> = outcomes
        .iter()
        .filter(|o| o.median_seconds.is_some())
        .collect();
    let best = measured
        .iter()
        .min_by(|a, b| {
            let a = a.median_seconds.unwrap_or(f64::INFINITY);
            let b = b.median_seconds.unwrap_or(f64::INFINITY);
            a.total_cmp(&b)
        })
        .copied();
    let headline = match best {
        Some(b) => format!(
            "Benchmarked {} of {} candidates. Best: {}.",
            measured.len(),
            outcomes.len(),
            b.figures_text()
        ),
        None => format!(
            "No candidate of {} produced a valid benchmark figure.",
            outcomes.len()
        ),
    };
    let body = json!({"best": best, "candidates": outcomes});
    format!(
        "{headline}\n```json\n{}\n```",
        serde_json::to_string_pretty(&body).unwrap_or_else(|_| "{}".to_owned())
    )
}
