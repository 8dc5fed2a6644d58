//! Tests of the builtin leader policy: its turns on scripted histories.

use super::*;
use crate::plan::JOB_LINE_PREFIX;

/// The tuning space the integration tests' kernel has (three values of `A`).
const SPACE: &str = include_str!("../../tests/fixtures/tune.toml");

fn names(turn: &Turn) -> Vec<String> {
    match turn {
        Turn::Calls(calls) => calls.iter().map(|c| c.name.clone()).collect(),
        Turn::Final(text) => vec![format!("final: {text}")],
    }
}

/// Plays the opening on `fleet` (and [`SPACE`]) up to the assignment: the
/// policy's first turn, its spawn turn (answered with `tuner-1` and
/// `tuner-2` on `slices`) and its assign turn.
fn opening(
    policy: &BuiltinLeaderPolicy,
    messages: &mut Vec<Message>,
    fleet: &Value,
    slices: [&str; 2],
) -> [Turn; 3] {
    let first = policy.decide(messages);
    answer(messages, &first, &[&fleet.to_string(), SPACE]);
    let spawn = policy.decide(messages);
    let spawned = [("tuner-1", slices[0]), ("tuner-2", slices[1])]
        .map(|(agent, slice_id)| json!({"agent": agent, "slice_id": slice_id}).to_string());
    answer(messages, &spawn, &[&spawned[0], &spawned[1]]);
    let assign = policy.decide(messages);
    [first, spawn, assign]
}

/// The JSON block that ends the policy's answer to `messages` (which must
/// be its final turn).
fn final_block(policy: &BuiltinLeaderPolicy, messages: &[Message]) -> Value {
    let Turn::Final(text) = policy.decide(messages) else {
        panic!("expected the answer")
    };
    mtswarm_core::answer::last_json(&text).expect("json block")
}

fn answer(messages: &mut Vec<Message>, turn: &Turn, results: &[&str]) {
    let Turn::Calls(calls) = turn else {
        panic!("expected calls")
    };
    messages.push(Message::assistant("", calls.clone()));
    for (call, result) in calls.iter().zip(results) {
        messages.push(Message::tool(call.id.clone(), *result));
    }
}

#[test]
fn plans_fleet_spawn_split_assign_collect_and_reports_the_best() {
    let policy = BuiltinLeaderPolicy::new();
    let mut messages = vec![
        Message::system("leader"),
        Message::user(format!(
            "Tune it.\n\n{JOB_LINE_PREFIX}{}",
            json!({"num_agents": 0, "collect_timeout_seconds": 30})
        )),
    ];
    let fleet = json!({"selector": "", "slices": [
        {"slice_id": "b0-c0", "state": "free"}, {"slice_id": "b0-c1", "state": "leased"},
        {"slice_id": "b0-c2", "state": "free"}]});
    let [first, spawn, assign] = opening(&policy, &mut messages, &fleet, ["b0-c0", "b0-c2"]);
    assert_eq!(names(&first), vec!["list_fleet", "read_file"]);
    assert_eq!(names(&spawn), vec!["spawn_agent", "spawn_agent"]);
    let Turn::Calls(calls) = &assign else {
        panic!("expected assign calls")
    };
    let parts: Vec<Value> = calls
        .iter()
        .map(|c| {
            serde_json::from_str::<Value>(&c.arguments).expect("json")["parameters"]["candidates"]
                .clone()
        })
        .collect();
    // Two agents share the three configurations: 2 + 1, each exactly once.
    let sizes: Vec<usize> = parts
        .iter()
        .map(|p| p.as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes, vec![2, 1]);
    let mut all: Vec<i64> = parts
        .iter()
        .flat_map(|p| p.as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["A"].as_i64())
        .collect();
    all.sort_unstable();
    assert_eq!(all, vec![1, 2, 3]);
    let t1 = json!({"task_id": "t1"}).to_string();
    let t2 = json!({"task_id": "t2"}).to_string();
    answer(&mut messages, &assign, &[&t1, &t2]);
    let collect = policy.decide(&messages);
    let Turn::Calls(calls) = &collect else {
        panic!("expected collect")
    };
    let args: Value = serde_json::from_str(&calls[0].arguments).expect("json");
    assert_eq!(
        args,
        json!({"tasks": ["t1", "t2"], "mode": "all", "timeout_seconds": 30})
    );
    let collected = json!({"tasks": 2, "finished": 2, "timed_out": false,
        "task_status": {"ok": 2}, "candidate_status": {"benchmarked": 3},
        "best": {"params": {"A": "2"}, "gflops": 5.0, "peak_percent": 20.0,
                 "agent": "tuner-2", "slice_id": "b0-c2", "task_id": "t2"},
        "failed_tasks": [], "pending_tasks": [], "errors": [],
        "agents": [{"agent": "tuner-2", "task_id": "t2", "status": "ok", "gflops": 5.0},
                   {"agent": "tuner-1", "task_id": "t1", "status": "ok", "gflops": 3.0}],
        "omitted": {}});
    answer(&mut messages, &collect, &[&collected.to_string()]);
    let block = final_block(&policy, &messages);
    assert_eq!(block["best"]["agent"], "tuner-2");
    assert_eq!(block["best"]["params"], json!({"A": "2"}));
    assert_eq!(block["best"]["gflops"], json!(5.0));
    assert_eq!(block["best"]["peak_percent"], json!(20.0));
    assert_eq!(block["task_status"], json!({"ok": 2}));
}

#[test]
fn a_failed_partition_is_retried_once_on_an_agent_whose_task_succeeded() {
    let policy = BuiltinLeaderPolicy::new();
    let mut messages = vec![Message::user(format!(
        "Tune.\n\n{JOB_LINE_PREFIX}{}",
        json!({"num_agents": 0, "collect_timeout_seconds": 30})
    ))];
    let fleet = json!({"selector": "", "slices": [
        {"slice_id": "b0-c0", "state": "free"}, {"slice_id": "b0-c1", "state": "free"}]});
    let [_, _, assign] = opening(&policy, &mut messages, &fleet, ["b0-c0", "b0-c1"]);
    let Turn::Calls(assigned) = &assign else {
        panic!("expected assign calls")
    };
    let first_part = serde_json::from_str::<Value>(&assigned[0].arguments).expect("json")
        ["parameters"]["candidates"]
        .clone();
    let t1 = json!({"task_id": "t1"}).to_string();
    let t2 = json!({"task_id": "t2"}).to_string();
    answer(&mut messages, &assign, &[&t1, &t2]);
    let collect = policy.decide(&messages);
    let collected = json!({"tasks": 2, "finished": 2, "timed_out": false,
        "task_status": {"ok": 1, "failed": 1},
        "best": {"params": {"A": "2"}, "gflops": 5.0, "agent": "tuner-2",
                 "slice_id": "b0-c1", "task_id": "t2"},
        "failed_tasks": ["t1"], "pending_tasks": [],
        "errors": [{"agent": "tuner-1", "error": "crashed"}],
        "agents": [{"agent": "tuner-2", "task_id": "t2", "status": "ok", "gflops": 5.0},
                   {"agent": "tuner-1", "task_id": "t1", "status": "failed", "gflops": null}],
        "omitted": {}});
    answer(&mut messages, &collect, &[&collected.to_string()]);
    let again = policy.decide(&messages);
    assert_eq!(names(&again), vec!["list_fleet"]);
    // Both slices are busy now: the partition goes to tuner-2.
    let busy = json!({"selector": "", "slices": [
        {"slice_id": "b0-c0", "state": "leased"}, {"slice_id": "b0-c1", "state": "leased"}]});
    answer(&mut messages, &again, &[&busy.to_string()]);
    let retry = policy.decide(&messages);
    let Turn::Calls(calls) = &retry else {
        panic!("expected the retry assignment")
    };
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "assign_task");
    let args: Value = serde_json::from_str(&calls[0].arguments).expect("json");
    assert_eq!(args["agent"], "tuner-2");
    // tuner-1's partition (the failed one), unchanged.
    assert_eq!(args["parameters"]["candidates"], first_part);
    assert_eq!(first_part.as_array().map(Vec::len), Some(2));
    let t3 = json!({"task_id": "t3"}).to_string();
    answer(&mut messages, &retry, &[&t3]);
    let recollect = policy.decide(&messages);
    let Turn::Calls(calls) = &recollect else {
        panic!("expected the second collect")
    };
    let args: Value = serde_json::from_str(&calls[0].arguments).expect("json");
    assert_eq!(args["tasks"], json!(["t3"]));
    // The retry failed too: no third round, the best of all is reported.
    let collected = json!({"tasks": 1, "finished": 1, "timed_out": false,
        "task_status": {"failed": 1}, "best": null, "failed_tasks": ["t3"],
        "pending_tasks": [], "errors": [{"agent": "tuner-2", "error": "crashed again"}],
        "agents": [{"agent": "tuner-2", "task_id": "t3", "status": "failed"}],
        "omitted": {}});
    answer(&mut messages, &recollect, &[&collected.to_string()]);
    let block = final_block(&policy, &messages);
    assert_eq!(block["best"]["task_id"], "t2");
    assert_eq!(block["task_status"], json!({"ok": 1, "failed": 2}));
}

#[test]
fn no_free_slice_ends_with_an_error_answer() {
    let policy = BuiltinLeaderPolicy::new();
    let mut messages = vec![Message::user("Tune.")];
    let first = policy.decide(&messages);
    answer(
        &mut messages,
        &first,
        &[
            &json!({"selector": "cores>=99", "slices": []}).to_string(),
            SPACE,
        ],
    );
    let Turn::Final(text) = policy.decide(&messages) else {
        panic!("expected a final answer")
    };
    let block = mtswarm_core::answer::last_json(&text).expect("json block");
    assert!(block["best"].is_null());
    assert!(
        block["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no free slice"),
        "{text}"
    );
}

/// A space of 400 configurations (20 x 20, no constraints).
const LARGE_SPACE: &str = r#"
kernel = "k"
[[param]]
name = "A"
values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
default = 1
[[param]]
name = "B"
values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
default = 1
"#;

/// The first two turns on `space` with eight free slices: how many agents
/// the policy spawns.
fn spawned_on(space: &str, job_line: Value) -> (BuiltinLeaderPolicy, Vec<Message>, usize) {
    let policy = BuiltinLeaderPolicy::new();
    let mut messages = vec![
        Message::system("leader"),
        Message::user(format!("Tune it.\n\n{JOB_LINE_PREFIX}{job_line}")),
    ];
    let slices: Vec<Value> = (0..8)
        .map(|i| json!({"slice_id": format!("b0-c{i}"), "state": "free"}))
        .collect();
    let fleet = json!({"selector": "", "slices": slices});
    let first = policy.decide(&messages);
    answer(&mut messages, &first, &[&fleet.to_string(), space]);
    let spawn = policy.decide(&messages);
    let count = names(&spawn).iter().filter(|n| *n == "spawn_agent").count();
    (policy, messages, count)
}

#[test]
fn a_large_space_gets_a_tenth_of_it_as_budget_split_over_the_agents_it_feeds() {
    // Default budget: a tenth of 400 = 40 evaluations, enough for five
    // agents of eight: five of the eight free slices get one.
    let (policy, mut messages, count) = spawned_on(
        LARGE_SPACE,
        json!({"num_agents": 0, "collect_timeout_seconds": 30}),
    );
    assert_eq!(count, 5);
    let spawn = policy.decide(&messages);
    let spawned: Vec<String> = (1..=count)
        .map(|i| json!({"agent": format!("tuner-{i}"), "slice_id": format!("b0-c{i}")}).to_string())
        .collect();
    let refs: Vec<&str> = spawned.iter().map(String::as_str).collect();
    answer(&mut messages, &spawn, &refs);
    let Turn::Calls(calls) = policy.decide(&messages) else {
        panic!("expected assign calls")
    };
    let parameters: Vec<Value> = calls
        .iter()
        .map(|c| serde_json::from_str::<Value>(&c.arguments).expect("json")["parameters"].clone())
        .collect();
    let budgets: Vec<u64> = parameters
        .iter()
        .map(|p| p["search_budget"].as_u64().expect("a search budget"))
        .collect();
    assert_eq!(budgets, vec![8; 5]);
    let candidates: usize = parameters
        .iter()
        .map(|p| p["candidates"].as_array().expect("candidates").len())
        .sum();
    assert_eq!(
        candidates, 400,
        "every configuration is some agent's candidate"
    );

    // A job budget of its own: 400 evaluations feed every slice.
    let (_, _, count) = spawned_on(
        LARGE_SPACE,
        json!({"num_agents": 0, "collect_timeout_seconds": 30, "search_budget": 400}),
    );
    assert_eq!(count, 8);
    // An explicit agent count wins over the budget's.
    let (_, _, count) = spawned_on(
        LARGE_SPACE,
        json!({"num_agents": 7, "collect_timeout_seconds": 30}),
    );
    assert_eq!(count, 7);
    // A small space is evaluated whole, on every slice.
    let (_, _, count) = spawned_on(
        SPACE,
        json!({"num_agents": 0, "collect_timeout_seconds": 30}),
    );
    assert_eq!(count, 3, "one agent per configuration");
}
