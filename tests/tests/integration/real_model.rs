//! A job driven end to end by models reached over the network: a local
//! OpenAI-compatible endpoint (real HTTP on loopback, `stream: true`
//! answered with genuine `chat.completion.chunk` SSE events, tool-call
//! arguments cut across several chunks) plays both the leader's model
//! (configured through `LeaderConfig::llm`) and the worker's model (the
//! worker process's `--llm-url`/`--llm-model`). Nothing is injected into
//! either loop: every step a leader or worker takes comes out of an HTTP
//! response, so this is the path a deployment with vLLM or Ollama runs.
//!
//! The endpoint is stateless: it recognises the caller by the tools the
//! request offers (`spawn_agent`: the leader; `benchmark`: a worker) and
//! picks the next turn from how many tool results the conversation already
//! holds, so a retried request gets the same answer.
//!
//! Its chat template is as strict as those of several open models served
//! by vLLM or llama.cpp: it answers 400 to a system message that is not the
//! first message, and to two user or two assistant messages in a row. The
//! test also measures how much of each request is a byte-identical prefix
//! of the same loop's next request (what a server prefix cache reuses).
//!
//! The second test plays a server without tool calling: it ignores `tools`
//! and writes each call as a JSON object in its reply text. Both daemons
//! run with `--llm-tool-mode text`, and the job still ends with a grounded
//! result.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use mtswarm_llm::OpenAiConfig;
use mtswarm_proto::v1;
use mtswarm_tests::jobs::{get_job, job_spec, submit, watch_to_end};
use mtswarm_tests::scripted_model::{
    COMPLETION_TOKENS, Caller, ModelServer, PROMPT_TOKENS, ScriptedModel, Turn, artifact_of,
    caller_of, content, kernel_dir, messages, one_agent_opening, role, tool_results,
};
use mtswarm_tests::{StackOptions, TestStack, node_bin, small_fleet_toml};
use serde_json::{Value, json};

/// The model name both loops are configured with.
const MODEL_NAME: &str = "scripted-model";

/// The candidate the leader hands out and the worker builds.
fn candidate_defines() -> Value {
    json!({"CHUNK": "1024", "BUF": "2"})
}

/// True when some `tool` message answers a `tool_calls` entry of an earlier
/// assistant message (by id): the OpenAI shape of a completed tool round.
fn has_answered_tool_call(body: &Value) -> bool {
    let mut call_ids: Vec<String> = Vec::new();
    for message in messages(body) {
        match role(message) {
            "assistant" => {
                if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
                    for call in calls {
                        let well_formed = call.get("type").and_then(Value::as_str)
                            == Some("function")
                            && call.pointer("/function/name").is_some()
                            && call
                                .pointer("/function/arguments")
                                .and_then(Value::as_str)
                                .is_some();
                        if let (true, Some(id)) =
                            (well_formed, call.get("id").and_then(Value::as_str))
                        {
                            call_ids.push(id.to_string());
                        }
                    }
                }
            }
            "tool" => {
                if let Some(id) = message.get("tool_call_id").and_then(Value::as_str)
                    && call_ids.iter().any(|known| known == id)
                {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

fn leader_turn(body: &Value) -> Turn {
    let step = tool_results(body).len();
    let opening = one_agent_opening(
        step,
        "Compile, validate and benchmark the configuration you are given.",
        "Compile, validate and benchmark this configuration.",
        candidate_defines(),
        240,
    );
    if let Some(turn) = opening {
        return turn;
    }
    match step {
        4 => Turn::Call {
            name: "result_details",
            arguments: json!({"agent": "a1", "page": 1}),
        },
        // First an answer with an invented figure; after the completion
        // gate's feedback, the figure of the collect summary.
        _ if !gate_rejected(body) => Turn::Answer(format!(
            "Agent a1 reached {INVENTED_GFLOPS} GFLOPS.\n```json\n{}\n```",
            json!({"best": {"agent": "a1", "defines": candidate_defines(), "gflops": INVENTED_GFLOPS}})
        )),
        _ => {
            let summary: Value = tool_results(body)
                .get(3)
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or(Value::Null);
            let gflops = summary["best"]["gflops"].as_f64().unwrap_or_default();
            Turn::Answer(format!(
                "Agent a1 benchmarked the candidate at {gflops} GFLOPS.\n```json\n{}\n```",
                json!({"best": {"agent": "a1", "defines": candidate_defines(), "gflops": gflops}})
            ))
        }
    }
}

/// A figure no measurement produced.
const INVENTED_GFLOPS: f64 = 999.5;

/// The leader's completion gate rejected an answer (its feedback is a user
/// message of the conversation).
fn gate_rejected(body: &Value) -> bool {
    messages(body)
        .iter()
        .any(|m| role(m) == "user" && content(m).contains("no accepted task result backs"))
}

fn worker_turn(body: &Value) -> Turn {
    let results = tool_results(body);
    let artifact = results.first().and_then(|r| artifact_of(r));
    let with_artifact = |mut args: Value| {
        if let (Some(id), Some(map)) = (&artifact, args.as_object_mut()) {
            map.insert("artifact".into(), json!(id));
        }
        args
    };
    match results.len() {
        0 => Turn::Call {
            name: "compile",
            arguments: json!({"kernel_dir": kernel_dir(body), "defines": candidate_defines()}),
        },
        1 => Turn::Call {
            name: "validate",
            arguments: with_artifact(json!({"cores": 2})),
        },
        2 => Turn::Call {
            name: "benchmark",
            arguments: with_artifact(json!({"cores": 2, "warmup": 0, "repeats": 1})),
        },
        _ => {
            let measured = results.last().cloned().unwrap_or_default();
            Turn::Answer(format!(
                "The candidate CHUNK=1024,BUF=2 was compiled, validated and benchmarked: {}\n```json\n{}\n```",
                measured.lines().next().unwrap_or(""),
                json!({"best": {"defines": candidate_defines(), "artifact": artifact}})
            ))
        }
    }
}

/// The bytes of `earlier` that are a prefix of `later`, message by
/// message as each serializes, over all of `earlier`'s message bytes.
fn prefix_fraction(earlier: &Value, later: &Value) -> f64 {
    let sizes =
        |body: &Value| -> Vec<String> { messages(body).iter().map(Value::to_string).collect() };
    let (a, b) = (sizes(earlier), sizes(later));
    let total: usize = a.iter().map(String::len).sum();
    let mut common = 0;
    for (x, y) in a.iter().zip(&b) {
        if x == y {
            common += x.len();
            continue;
        }
        common += x.bytes().zip(y.bytes()).take_while(|(p, q)| p == q).count();
        break;
    }
    common as f64 / total.max(1) as f64
}

/// True when every message of `earlier` but its last is unchanged, at the
/// same position, in `later`: only the per-step tail moved.
fn only_the_tail_changed(earlier: &Value, later: &Value) -> bool {
    let (a, b) = (messages(earlier), messages(later));
    a.len() <= b.len() + 1 && a[..a.len().saturating_sub(1)] == b[..a.len().saturating_sub(1)]
}

/// The endpoint of both tests: this file's scripts, with or without tool
/// calling.
fn scripted(text_tools: bool) -> ScriptedModel {
    ScriptedModel {
        model: MODEL_NAME,
        leader: leader_turn,
        worker: worker_turn,
        text_tools,
    }
}

fn is_stream_request(body: &Value) -> bool {
    body.get("stream") == Some(&json!(true)) && body.get("model") == Some(&json!(MODEL_NAME))
}

/// Every offered tool has the OpenAI function shape.
fn tools_have_openai_shape(body: &Value) -> bool {
    body.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|tools| {
            !tools.is_empty()
                && tools.iter().all(|t| {
                    t.get("type").and_then(Value::as_str) == Some("function")
                        && t.pointer("/function/name")
                            .and_then(Value::as_str)
                            .is_some()
                        && t.pointer("/function/parameters")
                            .is_some_and(Value::is_object)
                })
        })
}

fn gflops_of(result: &Value) -> Option<f64> {
    let from_best = result.pointer("/best/gflops").and_then(Value::as_f64);
    from_best.or_else(|| {
        result
            .get("benchmarks")
            .and_then(Value::as_array)
            .and_then(|list| {
                list.iter()
                    .filter_map(|b| b.get("gflops").and_then(Value::as_f64))
                    .reduce(f64::max)
            })
    })
}

/// Prices of [`MODEL_NAME`] per million tokens, prompt and completion.
const PROMPT_PRICE: f64 = 0.5;
const COMPLETION_PRICE: f64 = 1.5;

fn price_table() -> mtswarm_leader::PriceTable {
    mtswarm_leader::PriceTable::parse(
        &format!(
            "[prices.\"{MODEL_NAME}\"]\nprompt_per_million = {PROMPT_PRICE}\ncompletion_per_million = {COMPLETION_PRICE}\n"
        ),
        std::path::Path::new("prices.toml"),
    )
    .expect("a valid price table")
}

/// Every answer of the endpoint reports `PROMPT_TOKENS` prompt and `COMPLETION_TOKENS` completion
/// tokens, so each loop's tokens are its request count times those; the
/// outcome prices them per agent (the leader's loop, the worker agent a1)
/// and in total.
fn assert_costs(job: &v1::JobRecord, leader_requests: usize, worker_requests: usize) {
    let outcome = job.outcome.as_ref().expect("an outcome");
    let cost_of = |requests: usize| {
        (requests as f64 * PROMPT_TOKENS as f64 * PROMPT_PRICE
            + requests as f64 * COMPLETION_TOKENS as f64 * COMPLETION_PRICE)
            / 1_000_000.0
    };
    for (agent, requests) in [("leader", leader_requests), ("a1", worker_requests)] {
        let entry = outcome
            .agent_costs
            .iter()
            .find(|c| c.agent_id == agent)
            .unwrap_or_else(|| panic!("a cost entry for {agent}: {outcome:#?}"));
        assert_eq!(entry.model, MODEL_NAME, "{entry:#?}");
        assert_eq!(
            entry.prompt_tokens,
            PROMPT_TOKENS * requests as u64,
            "{entry:#?}"
        );
        assert_eq!(
            entry.completion_tokens,
            COMPLETION_TOKENS * requests as u64,
            "{entry:#?}"
        );
        assert!(entry.priced && entry.currency == "USD", "{entry:#?}");
        assert!(
            (entry.estimated_cost - cost_of(requests)).abs() < 1e-12,
            "{entry:#?}"
        );
    }
    let total = outcome.total_cost.as_ref().expect("a total");
    let requests = leader_requests + worker_requests;
    assert_eq!(
        total.prompt_tokens,
        PROMPT_TOKENS * requests as u64,
        "{total:#?}"
    );
    assert_eq!(
        total.completion_tokens,
        COMPLETION_TOKENS * requests as u64,
        "{total:#?}"
    );
    assert!(total.priced && (total.estimated_cost - cost_of(requests)).abs() < 1e-12);
    println!(
        "tokens per job: {} prompt + {} completion ({leader_requests} leader and {worker_requests} worker model calls), estimated {:.6} {}",
        total.prompt_tokens, total.completion_tokens, total.estimated_cost, total.currency
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_model_drives_a_job_to_completion() {
    let server = ModelServer::start(scripted(false)).await;
    let llm = OpenAiConfig::new(&server.base_url, MODEL_NAME);
    let mut options = StackOptions::model_driven(node_bin!(), small_fleet_toml(1, 1, 2), llm);
    let configure_model = options.configure_leader;
    options.configure_leader = Box::new(move |config| {
        configure_model(config);
        config.prices = price_table();
    });
    let stack = TestStack::start(options).await;
    let (job, events) = vecadd_job_succeeds(&stack, &server).await;
    let requests = server.requests();

    assert_each_request_is_a_prefix_of_the_next(&requests);
    let leader_requests: Vec<&Value> = requests
        .iter()
        .filter(|r| caller_of(r) == Caller::Leader)
        .collect();
    assert_both_loops_streamed_with_tools(&job, &leader_requests, &requests);
    assert_the_leader_answer_is_grounded(&job, &leader_requests);
    assert_the_task_result_is_measured(&events, &stack);

    stack.shutdown().await;
    drop(server);
}

/// Prefix stability: each loop's request is, but for its per-step tail, a
/// byte-identical prefix of its next one.
fn assert_each_request_is_a_prefix_of_the_next(requests: &[Value]) {
    for (name, caller) in [("leader", Caller::Leader), ("worker", Caller::Worker)] {
        let own: Vec<&Value> = requests.iter().filter(|r| caller_of(r) == caller).collect();
        let fractions: Vec<f64> = own
            .windows(2)
            .filter(|pair| tool_results(pair[1]).len() > tool_results(pair[0]).len())
            .map(|pair| {
                assert!(
                    only_the_tail_changed(pair[0], pair[1]),
                    "{name}: more than the per-step tail changed between\n{}\nand\n{}",
                    pair[0],
                    pair[1]
                );
                prefix_fraction(pair[0], pair[1])
            })
            .collect();
        assert!(!fractions.is_empty(), "{name}: no consecutive steps");
        let mean = fractions.iter().sum::<f64>() / fractions.len() as f64;
        let min = fractions.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "prefix stability, {name}: {} step pairs, mean {:.1}% of a request is a prefix of the next, min {:.1}%",
            fractions.len(),
            mean * 100.0,
            min * 100.0
        );
    }
}

/// Both loops called the endpoint for every step, streaming, with OpenAI
/// tool shapes, and got their tool results back; the job's costs count
/// those requests.
fn assert_both_loops_streamed_with_tools(
    job: &v1::JobRecord,
    leader_requests: &[&Value],
    requests: &[Value],
) {
    let worker_requests: Vec<&Value> = requests
        .iter()
        .filter(|r| caller_of(r) == Caller::Worker)
        .collect();
    assert!(
        leader_requests.len() >= 7,
        "the leader asked its model for every step: {} requests",
        leader_requests.len()
    );
    assert!(
        worker_requests.len() >= 4,
        "the worker asked its model for every step: {} requests",
        worker_requests.len()
    );
    assert_costs(job, leader_requests.len(), worker_requests.len());
    for request in leader_requests.iter().chain(&worker_requests) {
        assert!(
            is_stream_request(request),
            "a streamed request for {MODEL_NAME}: {request}"
        );
        assert!(
            tools_have_openai_shape(request),
            "tools in the OpenAI function shape: {}",
            request.get("tools").cloned().unwrap_or(Value::Null)
        );
    }
    assert!(
        worker_requests.iter().any(|r| has_answered_tool_call(r)),
        "a worker request carries a tool message answering an assistant tool call"
    );
    assert!(
        leader_requests.iter().any(|r| has_answered_tool_call(r)),
        "a leader request carries a tool message answering an assistant tool call"
    );
    // The worker's benchmark call reached the tool: its result is in the
    // conversation the worker sent back.
    assert!(
        worker_requests
            .iter()
            .any(|r| tool_results(r).len() >= 3 && tool_results(r)[2].contains("GFLOPS")),
        "the benchmark tool's result went back to the model"
    );
}

/// The leader model read the compact collect summary (within its budget),
/// fetched one page of details, had its invented figure rejected by the
/// completion gate and answered with the measured one.
fn assert_the_leader_answer_is_grounded(job: &v1::JobRecord, leader_requests: &[&Value]) {
    let last_leader = leader_requests
        .iter()
        .max_by_key(|r| tool_results(r).len())
        .expect("a leader request");
    let leader_results = tool_results(last_leader);
    assert!(leader_results.len() >= 5, "{leader_results:#?}");
    let summary: Value = serde_json::from_str(&leader_results[3]).expect("summary JSON");
    assert!(
        leader_results[3].len() <= mtswarm_leader::COLLECT_BUDGET_BYTES,
        "{} bytes",
        leader_results[3].len()
    );
    assert_eq!(summary["task_status"]["ok"], 1, "{summary:#}");
    assert_eq!(summary["best"]["agent"], "a1", "{summary:#}");
    let measured = summary["best"]["gflops"].as_f64().expect("a best figure");
    let page: Value = serde_json::from_str(&leader_results[4]).expect("details JSON");
    assert_eq!(page["page"], 1, "{page:#}");
    assert_eq!(page["total"], 1, "one candidate in the details: {page:#}");
    assert_eq!(page["rows"][0]["status"], "benchmarked", "{page:#}");
    assert!(
        gate_rejected(last_leader),
        "the invented figure was rejected"
    );
    assert!(
        job.final_answer.contains(&format!("{measured} GFLOPS")),
        "the kept answer names the measurement: {}",
        job.final_answer
    );
    assert_grounded_best_of_a1(job);
}

/// The task result carries the emulator's measurement of the candidate the
/// leader assigned, and the worker model's answer.
fn assert_the_task_result_is_measured(events: &[v1::JobEvent], stack: &TestStack) {
    let results: Vec<v1::TaskResult> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::TaskResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "one task result: {results:#?}");
    let result = &results[0];
    assert_eq!(
        result.status(),
        v1::TaskStatus::Ok,
        "{result:#?}\nworkers:\n{}",
        stack.worker_logs()
    );
    assert_eq!(result.agent_id, "a1");
    let parsed: Value = serde_json::from_str(&result.result_json).expect("result_json is JSON");
    let gflops = gflops_of(&parsed);
    assert!(
        gflops.is_some_and(|g| g > 0.0),
        "a measured GFLOPS figure in the result: {parsed:#}"
    );
    assert_eq!(
        parsed.pointer("/best/defines"),
        Some(&json!({"BUF": "2", "CHUNK": "1024"})),
        "the benchmarked candidate is the one the leader assigned: {parsed:#}"
    );
    assert!(
        parsed
            .get("answer")
            .and_then(Value::as_str)
            .is_some_and(|a| a.contains("compiled, validated and benchmarked")),
        "the model's final answer is the task's answer: {parsed:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn text_tool_calls_drive_a_job_on_a_server_without_tool_calling() {
    let server = ModelServer::start(scripted(true)).await;
    let llm =
        OpenAiConfig::new(&server.base_url, MODEL_NAME).with_tool_mode(mtswarm_llm::ToolMode::Text);
    let options = StackOptions::model_driven(node_bin!(), small_fleet_toml(1, 1, 2), llm);
    let stack = TestStack::start(options).await;
    let (job, _) = vecadd_job_succeeds(&stack, &server).await;
    let requests = server.requests();
    // No request offered native tools; both loops listed theirs in text
    // and got their calls' results back as user messages.
    assert!(
        requests.iter().all(|r| r.get("tools").is_none()),
        "tools sent natively"
    );
    for caller in [Caller::Leader, Caller::Worker] {
        let own: Vec<&Value> = requests.iter().filter(|r| caller_of(r) == caller).collect();
        assert!(
            own.iter().any(|r| tool_results(r).len() >= 3),
            "{caller:?}: tool results went back in text"
        );
    }
    // The worker's benchmark ran and the leader's answer is grounded in it.
    assert_grounded_best_of_a1(&job);
    stack.shutdown().await;
}

/// The job's outcome has a measured best of agent `a1`, and its kept answer
/// does not carry the invented figure.
fn assert_grounded_best_of_a1(job: &v1::JobRecord) {
    let best = job
        .outcome
        .as_ref()
        .and_then(|o| o.best.as_ref())
        .expect("an outcome with a best");
    assert!(best.gflops > 0.0 && best.agent_id == "a1", "{best:#?}");
    assert!(
        !job.final_answer.contains(&INVENTED_GFLOPS.to_string()),
        "the kept answer is the grounded one: {}",
        job.final_answer
    );
}

/// Submits a one-candidate vecadd job to `stack` and waits for its end:
/// the job SUCCEEDED, and the strict template of `server` rendered every
/// request. The job and its events.
async fn vecadd_job_succeeds(
    stack: &TestStack,
    server: &ModelServer,
) -> (v1::JobRecord, Vec<v1::JobEvent>) {
    stack.wait_for_slices(1, Duration::from_secs(30)).await;
    let mut control = stack.control().await;
    let job_id = submit(
        &mut control,
        job_spec("Tune vecadd with one candidate", "vecadd", 0, true),
    )
    .await;
    let events = watch_to_end(&mut control, &job_id, Duration::from_secs(300), || {
        format!("workers:\n{}", stack.worker_logs())
    })
    .await;
    let job = get_job(&mut control, &job_id).await;
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "job {job:#?}\nrequests seen: {}\nworkers:\n{}",
        server.requests().len(),
        stack.worker_logs()
    );
    let refused = server.refusals();
    assert!(
        refused.is_empty(),
        "refused by the strict template: {refused:#?}"
    );
    (job, events)
}
